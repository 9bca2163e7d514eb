//! Developer verbs for the health-agent workspace: `cargo xtask <verb>`.
//!
//! Product logic lives in the other crates; this one only drives toolchains, packages, services
//! and cargo. Each verb is one module:
//! - `cmd`: child processes, and the one-line steps setup and services print;
//! - `setup`: what a fresh Debian 12 machine needs (`for_demo`: the demo's part only);
//! - `services`: dockerd, Podman's API service, containerd and PostgreSQL 15;
//! - `run`: `build` and `run`;
//! - `dist/`: the release artifacts for x86_64 and aarch64, and their checks; `package`: the
//!   host's .deb and `image`: the DaemonSet's FROM-scratch image, both built by `dist`'s code;
//! - `test`: the full check CI runs; `deploy`: its deploy stage, the validators offline;
//! - `demo`: the narrated demo; `live`: the agent and the bundled backend for `demo` and `bench`;
//! - `bench/`: one file per section, `report` writing docs/BENCHMARKS.md; servers and guards
//!   from the `tests` harness;
//! - `fuzz`: cargo-fuzz over the parsers;
//! - `soak`: the soak test binary for N minutes, its table for docs/BENCHMARKS.md.
// Unsafe only in the few libc calls marked `#[allow(unsafe_code)]`.
#![deny(unsafe_code)]

mod bench;
mod cmd;
mod demo;
mod deploy;
mod dist;
mod fuzz;
mod image;
mod lanes;
mod live;
mod manifests;
mod package;
mod run;
mod services;
mod setup;
mod soak;
mod test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Developer tasks for health-agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make this machine ready for everything, tests included (run as root; a second run
    /// changes nothing): nightly rust-src, bpf-linker on the nightly's LLVM, Debian packages,
    /// the musl target, tracefs, the deploy-file validators and moto, dockerd, Podman's API
    /// service, containerd and PostgreSQL.
    /// `demo` installs only its own part (rust-src, bpf-linker, tracefs).
    Setup(setup::Args),
    /// Start dockerd, Podman's API service, containerd and PostgreSQL 15 if they are not running.
    Services,
    /// Build the agent; its build.rs builds and embeds the eBPF programs.
    Build(run::BuildArgs),
    /// Build, then run the agent as root (default arguments: serve).
    Run(run::RunArgs),
    /// The product's main job on a built-in default: a bundled backend, the agent, and a
    /// narrated healthy → hung → 503 → healthy story, then the same hang healed by a restart.
    /// Installs only what it uses (rust-src, bpf-linker, tracefs).
    Demo(demo::Args),
    /// Speed and memory targets, measured side by side, written to docs/BENCHMARKS.md.
    Bench(bench::Args),
    /// The Debian package: target/debian/health-agent_<version>-<rev>_<arch>.deb (the static
    /// release binary, systemd unit, default config as a conffile).
    Package,
    /// Everything a release publishes, for x86_64 and aarch64, into dist/: the static binaries,
    /// a tarball, a .deb, an .rpm and an OCI image per architecture, SHA256SUMS. `--check`
    /// proves them (lint, scratch installs and an upgrade, a root without libc, docker load).
    Dist(dist::Args),
    /// The DaemonSet's OCI image in the local Docker daemon: health-agent:<version> and :latest,
    /// a static (musl) agent alone, imported without any registry pull.
    Image,
    /// The full check CI runs: setup, fmt, clippy, tests — stops at the first failing stage.
    Test(test::Args),
    /// Coverage-guided fuzzing of the parsers (cargo-fuzz, nightly), each target for --seconds.
    Fuzz(fuzz::Args),
    /// The soak (tests/tests/soak.rs) for --minutes: churn and faults against real parts, the
    /// agent's memory, descriptors, threads, BPF maps and lists sampled, every answer judged;
    /// fails on a figure that grows, a wrong 503, an alert lost or doubled. Needs root.
    Soak(soak::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Setup(args) => setup::run(&args),
        Command::Services => services::run("services"),
        Command::Build(args) => run::build(&args).map(|_| ()),
        Command::Run(args) => run::run(args),
        Command::Package => package::run().map(|_| ()),
        Command::Image => image::run().map(|_| ()),
        Command::Dist(args) => dist::run(&args),
        Command::Test(args) => test::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Soak(args) => soak::run(&args),
    };
    // The cause chain says what failed and how to fix it; with RUST_BACKTRACE set, anyhow's
    // default report would bury that under a backtrace of this small program.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
