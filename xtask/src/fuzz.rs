//! `cargo xtask fuzz`: coverage-guided fuzzing of the agent's parsers with cargo-fuzz (nightly,
//! libFuzzer), each target for a bounded time. The targets' bodies live in
//! `health_agent::fuzzing`; `cargo xtask test` runs the same bodies as a stable smoke stage.

use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::{cmd, setup};

/// The cargo-fuzz targets in fuzz/Cargo.toml, one per parser.
pub const TARGETS: &[&str] = &["config", "redis", "mysql", "btf", "sock_diag", "peer_view"];

#[derive(clap::Args)]
pub struct Args {
    /// How long each target runs.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    seconds: u64,
    /// Only this target (default: all of them, one after the other).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    target: Option<String>,
    /// Run this one input through the target instead of fuzzing (a crash to reproduce, such as
    /// one the fuzz-smoke stage saved).
    #[arg(long, requires = "target", value_name = "FILE")]
    input: Option<std::path::PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    cmd::step("fuzz", "cargo-fuzz", setup::cargo_fuzz)?;
    let fuzz_dir = cmd::root().join("fuzz");
    let cargo_fuzz = |target: &str| {
        let mut c = cmd::cargo();
        c.current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target]);
        c
    };
    if let (Some(target), Some(input)) = (&args.target, &args.input) {
        // cargo-fuzz runs in fuzz/: a relative path must not change meaning on the way.
        let input =
            std::fs::canonicalize(input).with_context(|| format!("--input {}", input.display()))?;
        return cmd::run(cargo_fuzz(target).arg(input));
    }
    let targets: Vec<&str> = match &args.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    let start = Instant::now();
    let mut failed = Vec::new();
    for target in &targets {
        // New finds go to corpus-work/ (ignored by git); the committed seeds are only read.
        let work = fuzz_dir.join("corpus-work").join(target);
        std::fs::create_dir_all(&work)?;
        let mut c = cargo_fuzz(target);
        c.arg(&work)
            .arg(fuzz_dir.join("corpus").join(target))
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds));
        println!("fuzz: === {target} ({} s) ===", args.seconds);
        if let Err(e) = cmd::run(&mut c) {
            println!(
                "fuzz: {target} FAILED: {e:#} (the crashing input is in fuzz/artifacts/{target}/)"
            );
            failed.push(*target);
        }
    }
    if !failed.is_empty() {
        bail!("fuzz: {} failed: {}", failed.len(), failed.join(", "));
    }
    println!(
        "fuzz: {} targets ok in {} s",
        targets.len(),
        cmd::secs(start)
    );
    Ok(())
}
