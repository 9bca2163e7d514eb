//! `cargo xtask soak --minutes N`: the soak test binary (tests/tests/soak.rs) run for N minutes
//! instead of CI's 3, then the kill -9 runs (tests/tests/soak_kill.rs), its table also written to `<target>/soak-report.md` for
//! docs/BENCHMARKS.md. Needs root, like the integration tests it is one of.

use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd;

#[derive(clap::Args)]
pub struct Args {
    /// How long the churn runs, after which the verdict is taken (the first cycle of faults is
    /// the warm-up).
    #[arg(long, default_value_t = 3.0)]
    minutes: f64,
}

pub fn run(args: &Args) -> Result<()> {
    anyhow::ensure!(
        cmd::is_root(),
        "the soak needs root (it loads eBPF programs, mounts tmpfs, runs PostgreSQL)"
    );
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be above 0");
    // The test binaries run the agent and the fixture backend: build them first.
    cmd::run(
        Command::new("cargo")
            .current_dir(cmd::root())
            .args(["build", "--bins"]),
    )
    .context("building the binaries the soak runs")?;
    let report = cmd::target_dir().join("soak-report.md");
    let mut test = Command::new("cargo");
    test.current_dir(cmd::root())
        .args([
            "test",
            "-p",
            "health-agent-tests",
            "--test",
            "soak",
            "--test",
            "soak_kill",
        ])
        .arg("--")
        .args(["--nocapture", "--test-threads=1"])
        .env("HEALTH_AGENT_SOAK_MINUTES", args.minutes.to_string())
        .env("HEALTH_AGENT_SOAK_REPORT", &report);
    cmd::run(&mut test).context("the soak failed: its table and the reasons are above")?;
    println!("soak: the table is in {}", report.display());
    Ok(())
}
