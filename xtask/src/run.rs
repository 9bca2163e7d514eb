//! `cargo xtask build` and `cargo xtask run`: the agent binary, with the eBPF programs that
//! health-agent/build.rs builds on nightly and embeds.

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{cmd, setup};

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Build with the release profile.
    #[arg(long)]
    pub release: bool,
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    build: BuildArgs,
    /// Arguments for the agent, after `--` (default: serve).
    #[arg(last = true, value_name = "AGENT_ARGS")]
    args: Vec<String>,
}

/// Builds the agent and returns the path of its binary.
pub fn build(args: &BuildArgs) -> Result<PathBuf> {
    setup::ensure_toolchain()?;
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(cmd::root())
        .args(["build", "--package", "health-agent"]);
    if args.release {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo).context("building the agent failed — see cargo's errors above")?;

    let profile = if args.release { "release" } else { "debug" };
    Ok(cmd::target_dir().join(profile).join("health-agent"))
}

/// Builds, then becomes the agent (as root: loading eBPF programs needs it).
pub fn run(args: RunArgs) -> Result<()> {
    let bin = build(&args.build)?;
    let agent_args = if args.args.is_empty() {
        vec!["serve".to_owned()]
    } else {
        args.args
    };
    let mut agent = if cmd::is_root() {
        Command::new(&bin)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("-E").arg(&bin);
        sudo
    };
    agent.args(&agent_args);
    eprintln!("+ {}", cmd::display(&agent));
    // exec, not spawn: Ctrl-C and SIGTERM reach the agent directly and its exit code is ours.
    let err = agent.exec();
    Err(err).with_context(|| format!("cannot start `{}`", cmd::display(&agent)))
}
