//! `cargo xtask bench`: the speed and memory targets, measured side by side in one run and
//! written to docs/BENCHMARKS.md. Loopback only; every load is bounded in time.
//!
//! 1. `/health` throughput and latency against nginx serving a static body of the same size
//!    (the practical ceiling on this machine), at several concurrency levels and at half of the
//!    agent's peak rate; agent RSS and idle CPU. The static release build (what `cargo xtask
//!    dist` ships) side by side with this glibc one, throughput and memory; with
//!    `--baseline-agent`, that build too.
//! 2. Time from hang onset (kill -STOP) to 503, under 10 req/s and idle, next to what Caddy's
//!    active check needs (measured) and ALB's defaults (computed).
//! 3. Backend throughput with the agent's eBPF programs attached vs not: nginx serving a static
//!    file (the worst case) and Puma running a Rack app; then what the hooks cost per socket
//!    call and per connection, measured on one thread without scheduling noise.
//! 4. A saturation run of a healthy backend: no false `hung`/`unresponsive`.
//! 5. A failing alert receiver does not slow `/health`.
//! 6. Verdicts under load that must never 503 (`bench/verdicts/`): a busy Puma pool is
//!    `slow`, an app waiting on a frozen path to its database is `infrastructure_issue`;
//!    neither is restarted.
//! 7. What asking the peers costs (`bench/fleet.rs`).
//! 8. The health port under a flood (`bench/flood.rs`).
//! 9. The scaling signal against CPU: saturation S of a real Puma under open-loop load, a
//!    dependency outage, target tracking replayed (`bench/scaling.rs`).
//! 10. Publishing to CloudWatch (healthy, down, stalling, throttling) does not slow `/health`
//!     (`bench/cloudwatch.rs`).
//! 11. What the agent's eBPF programs cost per socket call by the kernel's own account
//!     (`BPF_ENABLE_STATS`), and its CPU while 10,000 idle connections are held open
//!     (`bench/bpf_stats.rs`).
//! 12. The same cost in wall clock, by alternation: one `on_suspicion` agent running and
//!     stopped by turns for one-second runs (`bench/alternate.rs`).
//!
//! One file per section; `run` lists them in order. Every write of the report goes through
//! `report::splice`, which keeps the notes added by hand between `<!-- notes -->` and
//! `<!-- /notes -->`. Servers, process guards, free ports and the
//! `/health` poller come from the integration tests' harness (`health-agent-tests`).

mod alerts;
mod alternate;
mod bpf_stats;
mod cloudwatch;
mod fleet;
mod flood;
mod hang;
pub(crate) mod report;
mod saturation;
mod scaling;
mod socket_costs;
mod stats;
mod throughput;
mod verdicts;
mod vs_nginx;
mod wrk;

use std::{
    fs,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Result};
use health_agent_tests::{Nginx, NginxOptions};

use crate::{cmd, dist, live::health, run, setup};
use stats::median;

#[derive(clap::Args)]
pub struct Args {
    /// Shorter runs (saturation and busy-pool soak 30 s instead of 300 s, database freeze 20 s
    /// instead of 60 s, fewer trials): for trying the bench out, not for the record.
    #[arg(long)]
    quick: bool,
    /// Where to write the results (a section run alone replaces only its own section; notes
    /// between `<!-- notes -->` and `<!-- /notes -->` lines are kept either way).
    #[arg(long, default_value = "docs/BENCHMARKS.md")]
    out: PathBuf,
    /// Another build of the agent (e.g. the last release), measured side by side with this one
    /// in the /health, per-socket-call, flood and kernel-statistics sections: the change in one
    /// run, on one machine. Repeatable: section 1 measures every one given (named by its file
    /// name), the other sections the first.
    #[arg(long, value_name = "BINARY")]
    baseline_agent: Vec<PathBuf>,
    /// Run one section alone and put it in place of its section in `--out` (the others stay).
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Option<Section>,
}

/// The sections that run alone (`--only SECTION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    /// Section 1: /health against nginx, the static build beside this one (with
    /// `--baseline-agent`: that build too).
    Health,
    /// Section 2: hang to 503, in both `web.socket_tracing` modes.
    Hang,
    /// Section 3's cost per socket call and per connection (with `--baseline-agent`: the
    /// comparison).
    SocketCosts,
    /// Section 7: what asking the peers costs, the fleet key's proofs included.
    Fleet,
    /// Section 8: the health port under a flood (with `--baseline-agent`: the earlier build
    /// first).
    Flood,
    /// Section 9: the scaling signal against CPU.
    Scaling,
    /// Section 10: publishing to CloudWatch.
    Cloudwatch,
    /// Section 11: what the programs cost by the kernel's statistics (with `--baseline-agent`:
    /// the earlier build side by side).
    BpfStats,
    /// Section 12: `on_suspicion`'s wall-clock cost, by alternation.
    Alternation,
}

/// The release binaries the bench runs.
struct Bins {
    agent: PathBuf,
    backend: PathBuf,
    proxy: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    if !cmd::is_root() {
        bail!("the bench loads eBPF programs: run it as root");
    }
    setup::ensure_toolchain()?;
    let bins = build()?;
    let dir = std::env::temp_dir().join(format!("health-agent-bench-{}", std::process::id()));
    let baseline = args.baseline_agent.first().map(PathBuf::as_path);
    fs::create_dir_all(&dir)?;
    // Section 1's other builds: the static one a release ships, and the baseline.
    let static_bin = match args.only {
        None | Some(Section::Health) => Some(dist::static_binary(dist::host().target)?),
        Some(_) => None,
    };
    let others: Vec<vs_nginx::Other> = static_bin
        .iter()
        .map(|bin| vs_nginx::Other {
            label: format!("static (musl, {})", dist::STATIC_ALLOCATOR),
            bin,
        })
        .chain(args.baseline_agent.iter().map(|bin| vs_nginx::Other {
            label: format!(
                "baseline {}",
                bin.file_name().map_or_else(
                    || bin.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                )
            ),
            bin,
        }))
        .collect();
    if let Some(section) = args.only {
        let (agent, quick) = (&bins.agent, args.quick);
        let md = match section {
            Section::Health => vs_nginx::run(agent, &others, &dir, quick)?,
            Section::Hang => hang::run(agent, &bins.backend, &dir, quick)?,
            Section::SocketCosts => socket_costs::run(agent, baseline, &dir, quick)?,
            Section::Fleet => fleet::run(agent, &dir, quick)?,
            Section::Flood => flood::run(agent, baseline, &dir, quick)?,
            Section::Scaling => scaling::run(agent, &bins.proxy, &dir, quick)?,
            Section::Cloudwatch => cloudwatch::run(agent, &dir, quick)?,
            Section::BpfStats => bpf_stats::run(agent, baseline, &dir, quick)?,
            Section::Alternation => alternate::run(agent, &dir, quick)?,
        };
        return write_section(args, &dir, &md);
    }
    let started = Instant::now();
    let quick = args.quick;
    let mut md = vs_nginx::run(&bins.agent, &others, &dir, quick)?;
    md += &hang::run(&bins.agent, &bins.backend, &dir, quick)?;
    let (throughput, nginx) = throughput::run(&bins.agent, baseline, &dir, quick)?;
    md += &throughput;
    md += &saturation::run(&bins.agent, nginx, &dir, quick)?;
    md += &alerts::run(&bins.agent, &dir, quick)?;
    md += &verdicts::run(&bins.agent, &bins.proxy, &dir, quick)?;
    md += &fleet::run(&bins.agent, &dir, quick)?;
    md += &flood::run(&bins.agent, baseline, &dir, quick)?;
    md += &scaling::run(&bins.agent, &bins.proxy, &dir, quick)?;
    md += &cloudwatch::run(&bins.agent, &dir, quick)?;
    md += &bpf_stats::run(&bins.agent, baseline, &dir, quick)?;
    md += &alternate::run(&bins.agent, &dir, quick)?;
    write_report(args, started, &md)?;
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

fn build() -> Result<Bins> {
    let agent = run::build(&run::BuildArgs { release: true })?;
    cmd::run(cmd::cargo().current_dir(cmd::root()).args([
        "build",
        "--release",
        "-p",
        "health-agent-tests",
        "--bin",
        "fixture-backend",
        "--bin",
        "tcp-proxy",
    ]))?;
    let target = cmd::target_dir().join("release");
    Ok(Bins {
        agent,
        backend: target.join("fixture-backend"),
        proxy: target.join("tcp-proxy"),
    })
}

/// One section run alone: put in place of its earlier version in `--out` (the others stay, and
/// so do the hand-written notes of this one).
fn write_section(args: &Args, dir: &std::path::Path, md: &str) -> Result<()> {
    let out = write_out(args, md)?;
    println!("{md}\nbench: wrote its section into {}", out.display());
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

/// Every write of `--out` goes through here: `md` (the whole report or one section) spliced
/// into what the file holds, keeping its notes (`report`). Returns the file's path.
fn write_out(args: &Args, md: &str) -> Result<PathBuf> {
    let out = cmd::root().join(&args.out);
    if let Some(p) = out.parent() {
        fs::create_dir_all(p)?;
    }
    let before = match fs::read_to_string(&out) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(anyhow!("cannot read {}: {e}", out.display())),
    };
    fs::write(&out, report::splice(&before, md))
        .map_err(|e| anyhow!("cannot write {}: {e}", out.display()))?;
    Ok(out)
}

/// docs/BENCHMARKS.md: a header naming the machine, then the sections.
fn write_report(args: &Args, started: Instant, md: &str) -> Result<()> {
    let machine = format!(
        "{} cores, {}, kernel {}",
        thread::available_parallelism().map_or(0, |n| n.get()),
        fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default(),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let header = format!(
        "# Benchmarks\n\nProduced by `cargo xtask bench{}` (release build) on {} — {machine}. Total bench time {:.0} s. Everything runs on this one machine over loopback, so the load generator competes with what it measures; ratios are measured side by side in the same run.\n\n",
        if args.quick { " --quick" } else { "" },
        time_now(),
        started.elapsed().as_secs_f64()
    );
    let out = write_out(args, &(header + md))?;
    println!("bench: wrote {}", out.display());
    Ok(())
}

/// The harness reports failures by panicking (it was written for tests): turn a panic into
/// an error that names what was being done. The guards it holds are dropped on the way out.
fn harness<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into());
        anyhow!("{what}: {msg}")
    })
}

/// The harness's nginx, with the bench's settings in `options`.
fn start_nginx(options: NginxOptions) -> Result<Nginx> {
    harness(
        "starting nginx (apt-get install nginx-light; cargo xtask setup does)",
        || Nginx::launch(options),
    )
}

fn proc_status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Percent of one core `pid` used over the next `secs` seconds.
fn idle_cpu(pid: u32, secs: u64) -> f64 {
    let c0 = cpu_seconds(pid).unwrap_or(0.0);
    thread::sleep(Duration::from_secs(secs));
    (cpu_seconds(pid).unwrap_or(0.0) - c0) / secs as f64 * 100.0
}

/// Time on CPU of every thread of a process, in seconds, from the scheduler's own nanosecond
/// account (/proc/<pid>/task/*/schedstat), not the 100 Hz tick sampling of utime/stime.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let mut ns = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let s = fs::read_to_string(task.path().join("schedstat")).ok()?;
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

fn agent_config(port: u16, web_port: u16, kernel: bool) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n[web]\nport = {web_port}\nkernel = {kernel}\n"
    )
}

fn wait_code(port: u16, want: u16, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if health(port).map(|(c, _)| c).ok() == Some(want) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("/health did not answer {want} within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[allow(unsafe_code)]
fn kill(pid: u32, sig: i32) {
    // SAFETY: signalling processes this bench started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A pseudo-random 0..1000 ms, so trials do not line up with the agent's timers.
fn fastrand_ms() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos % 1000)
}

fn time_now() -> String {
    cmd::stdout(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
