//! `cargo xtask test`: the project's full check, the one CI runs. Stages run in order and stop at
//! the first failure, naming it.

use std::{process::Command, time::Instant};

use anyhow::{Context, Result};

use crate::{cmd, deploy, dist, image, lanes, package, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Skip both clippy stages.
    #[arg(long)]
    no_clippy: bool,
    /// Only lib and bin unit tests; skips the integration tests, which need root.
    #[arg(long)]
    unit: bool,
    /// Run the test stage's binaries in N lanes side by side (xtask/src/lanes.rs); 1: one
    /// after another.
    #[arg(long, value_name = "N", default_value_t = 4)]
    lanes: usize,
    /// Run only the stages of these names (setup, fmt, clippy, clippy-ebpf, deploy, build,
    /// dist, package, image, dist-check, test), in their usual order: `--only deploy`.
    #[arg(long, value_name = "STAGE", value_delimiter = ',')]
    only: Vec<String>,
    /// Passed to the test binaries after `--`: a test name filter, --nocapture, ...
    #[arg(last = true, value_name = "TEST_ARGS")]
    test_args: Vec<String>,
}

enum Stage {
    Setup,
    /// The deploy/ files, each checked by its own tool, offline (xtask/src/deploy.rs).
    Deploy,
    /// The .deb the service tests install (target/debian/).
    Package,
    /// The DaemonSet's image tests/tests/image.rs runs (`cargo xtask image`).
    Image,
    /// The release artifacts for both architectures (`cargo xtask dist`)…
    Dist,
    /// … proven (`cargo xtask dist --check-only`).
    DistCheck,
    /// The test binaries in lanes (`--lanes N`), with the library's later runs folded in, and
    /// what runs beside the quiet group.
    Lanes(
        Vec<&'static str>,
        usize,
        Vec<lanes::LibRun>,
        Option<lanes::Beside>,
    ),
    Run(Command),
}

pub fn run(args: &Args) -> Result<()> {
    let cargo = |words: &[&str]| {
        let mut cargo = cmd::cargo();
        cargo.current_dir(cmd::root()).args(words);
        Stage::Run(cargo)
    };
    let ebpf_cargo = |words: &[&str]| {
        let mut cargo = cmd::ebpf_cargo();
        cargo.args(words);
        Stage::Run(cargo)
    };

    let mut stages = vec![
        ("setup", Stage::Setup),
        // `--all` covers the eBPF crate too: it is a workspace member, just not a default one.
        ("fmt", cargo(&["fmt", "--all", "--", "--check"])),
    ];
    if !args.no_clippy {
        stages.push((
            "clippy",
            // Default members: the eBPF crate only builds for its own target (next stage).
            cargo(&["clippy", "--all-targets", "--", "-D", "warnings"]),
        ));
        stages.push((
            "clippy-ebpf",
            ebpf_cargo(&["clippy", "--release", "--", "-D", "warnings"]),
        ));
    }
    stages.push(("deploy", Stage::Deploy));
    // The integration tests run the agent and fixture binaries: build them first.
    stages.push(("build", cargo(&["build", "--bins"])));
    // The release artifacts: tests/tests/service.rs installs the .deb, systemd.rs boots systemd
    // with it, image.rs runs the image as the DaemonSet would, old_kernel.rs and arm64_kernel.rs
    // boot the static agents, aws_user_data.rs and install.rs serve dist/'s tarball and .rpm.
    // dist first: it builds both architectures at once, and package and image reuse x86_64's.
    const ARTIFACTS: [&str; 3] = ["dist", "package", "image"];
    // A whole run in lanes makes them beside the quiet group instead, at idle priority (the
    // quiet group keeps much of the machine idle), and their proof a lane job; the lanes'
    // binaries that use them wait for them.
    let beside_quiet = !args.unit && args.lanes > 1 && args.only.is_empty();
    let mut beside = None;
    if beside_quiet {
        beside = Some(artifacts_beside(&ARTIFACTS)?);
    } else if !args.unit {
        stages.push(("dist", Stage::Dist));
        stages.push(("package", Stage::Package));
        stages.push(("image", Stage::Image));
        stages.push((lanes::PROOF, Stage::DistCheck));
    }
    let targets: &[&str] = if args.unit {
        &["--lib", "--bins"]
    } else {
        &["--all-targets"]
    };
    let mut test = cmd::cargo();
    test.current_dir(cmd::root()).arg("test").args(targets);
    if !args.test_args.is_empty() {
        test.arg("--").args(&args.test_args);
    }
    // Library tests marked #[ignore] need root and the real kernel (they load the eBPF
    // programs): `cargo test -p health-agent --lib` stays runnable without either.
    let kernel = lanes::LibRun {
        name: "test-kernel",
        args: vec!["--ignored".into()],
        env: Vec::new(),
        secs: 5,
    };
    let mut lib_runs = vec![fuzz_smoke()];
    if !args.unit {
        lib_runs.insert(0, kernel);
    }
    let name = if args.unit { "test-unit" } else { "test" };
    if args.lanes > 1 {
        // Each a lane's job: the stage is as long as its longest lane, not the sum.
        stages.push((
            name,
            Stage::Lanes(targets.to_vec(), args.lanes, lib_runs, beside),
        ));
    } else {
        stages.push((name, Stage::Run(test)));
        for run in lib_runs {
            let mut lib = cmd::cargo();
            lib.current_dir(cmd::root())
                .args(["test", "-p", "health-agent", "--lib", "--"])
                .args(&run.args)
                .envs(run.env);
            stages.push((run.name, Stage::Run(lib)));
        }
    }

    if let Some(unknown) = args
        .only
        .iter()
        .find(|o| !stages.iter().any(|(name, _)| name == o))
    {
        anyhow::bail!("--only {unknown}: no such stage");
    }
    stages.retain(|(name, _)| args.only.is_empty() || args.only.iter().any(|o| o == name));

    let start = Instant::now();
    let mut timings = Vec::new();
    for (name, stage) in stages {
        println!("test: === {name} ===");
        let stage_start = Instant::now();
        let result = match stage {
            Stage::Setup => setup::run(&setup::Args::default()),
            Stage::Deploy => deploy::run(),
            Stage::Package => package::run().map(|_| ()),
            Stage::Image => image::run().map(|_| ()),
            Stage::Dist => dist::run(&dist::Args::default()),
            Stage::DistCheck => dist::run(&dist::Args {
                check_only: true,
                ..dist::Args::default()
            }),
            Stage::Lanes(targets, lanes, lib_runs, beside) => {
                lanes::run(&targets, lanes, &args.test_args, &lib_runs, beside)
            }
            Stage::Run(mut command) => cmd::run(&mut command),
        };
        timings.push(format!("{name} {} s", cmd::secs(stage_start)));
        if let Err(e) = result {
            println!(
                "test: FAILED at stage `{name}` after {} s ({})",
                cmd::secs(start),
                timings.join(", ")
            );
            return Err(e.context(format!("test: stage `{name}` failed")));
        }
    }
    println!(
        "test: ok in {} s ({})",
        cmd::secs(start),
        timings.join(", ")
    );
    Ok(())
}

/// This xtask's own `test --only <stages>`, under SCHED_IDLE (`chrt --idle 0`) when the
/// kernel lets it: its compilations then take only the CPU time no test wants.
fn artifacts_beside(stages: &[&str]) -> Result<lanes::Beside> {
    let xtask = std::env::current_exe().context("where this xtask is")?;
    let idle = cmd::succeeds(Command::new("chrt").args(["--idle", "0", "true"]));
    let mut command = if idle {
        let mut chrt = Command::new("chrt");
        chrt.args(["--idle", "0"]).arg(&xtask);
        chrt
    } else {
        println!("test: `chrt --idle 0` is refused here: the artifacts build at normal priority");
        Command::new(&xtask)
    };
    command
        .current_dir(cmd::root())
        .args(["test", "--only", &stages.join(",")])
        .stdin(std::process::Stdio::null());
    let proof = lanes::LibRun {
        name: lanes::PROOF,
        args: ["dist", "--check-only"].map(String::from).to_vec(),
        env: Vec::new(),
        secs: 70,
    };
    Ok(lanes::Beside {
        name: stages.join(", "),
        command,
        proof: Some((xtask, proof)),
    })
}

/// The parsers' fuzz targets (`health_agent::fuzzing`) on stable, 10 s each from a fresh seed:
/// the bounded fuzzing CI runs. `cargo xtask fuzz` runs them longer, coverage guided.
fn fuzz_smoke() -> lanes::LibRun {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    lanes::LibRun {
        name: "fuzz-smoke",
        // One target at a time: one core, beside the lanes.
        args: [
            "fuzzing::tests::fuzz_smoke",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![
            ("HEALTH_AGENT_FUZZ_SECONDS", "10".into()),
            ("HEALTH_AGENT_FUZZ_SEED", seed.to_string()),
        ],
        secs: 60,
    }
}
