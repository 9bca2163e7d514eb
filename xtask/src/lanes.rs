//! `cargo xtask test --lanes N` (4 by default, what CI runs; 1: one after another): the test
//! stage's binaries run in N lanes side by side. The integration tests time verdicts to the
//! second, so a binary that fails beside others runs again alone: a failure that holds alone
//! fails the stage, one that does not is printed as the contention's doing.
//!
//! Why it can pay: most tests wait for verdicts, not for CPU, so the machine is mostly idle
//! during a sequential test stage (the figures are in docs/architecture.md). The lanes take
//! the binaries from one queue, longest first by their measured time, but never more than a few
//! of the heavy ones at once, nor two qemu boots ([`Queue`]). The ones that measure figures against a known load (socket tracing,
//! saturation, Prometheus' `rate()`: within 15 %; the soak's /health latency) run first, as the
//! quiet group: side by side with each other only, since beside the busy lanes their latency
//! percentiles move. Together they leave much of the machine idle, which the release artifacts
//! take ([`Beside`]: built at idle priority, so that they get only the CPU time no quiet test
//! wants). The lanes start when the quiet group is done; the binaries that use the artifacts,
//! once those are made. The library's
//! kernel tests and fuzz smoke (`test-kernel`, `fuzz-smoke` on one thread) and the artifacts'
//! proof are lane jobs too ([`LibRun`]).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cmd;

/// Test binaries that boot a VM under qemu (TCG), each loading a core for minutes: one at a
/// time.
const VMS: &[&str] = &["old_kernel", "arm64_kernel"];
/// Test binaries that keep much of the machine busy: the VMs, and several agents with their
/// backends under generated load (fleets, rolling restarts behind a balancer, the verdict
/// scenarios). At most HEAVY_AT_ONCE of them run at a time, whatever the number of lanes: three
/// (a VM and two fleets) passed in every 3-lane run; four at once (a VM, `fleet`, `slow_peers`,
/// `verdicts`) starved a fleet's peers of CPU until their database checks timed out and the
/// fleet's judgement split.
const HEAVY: &[&str] = &[
    "old_kernel",
    "arm64_kernel",
    "fleet",
    "slow_peers",
    "verdicts",
    "fleet_alerts",
    "drain_rolling",
];
const HEAVY_AT_ONCE: usize = 3;
/// Test binaries that use the release artifacts [`Beside`] makes (the static agents, the .deb,
/// the image, `dist/`): they start once it is done; the others start when the quiet group is.
const NEEDS_ARTIFACTS: &[&str] = &[
    "old_kernel",
    "arm64_kernel",
    "service",
    "systemd",
    "image",
    "aws_user_data",
    "install",
];
/// Test binaries that measure against a known load: before the lanes, side by side with each
/// other only (the quiet group). The soak bounds /health's p99 against a trivial server's:
/// beside the qemu boots it failed that bound in every run, then passed alone, so it paid its
/// whole length twice.
const QUIET: &[&str] = &["socket_tracing", "saturation", "prometheus", "soak"];

/// Seconds each binary took in its lane in a clean clone's CI run with 3 lanes: the lane
/// plan's weights (only their order and proportions matter); a binary not listed weighs
/// DEFAULT_SECS.
const MEASURED: &[(&str, u64)] = &[
    ("soak", 278),
    ("old_kernel", 131),
    ("socket_tracing", 130),
    ("fleet", 124),
    ("saturation", 124),
    ("slow_peers", 123),
    ("verdicts", 117),
    ("prometheus", 104),
    ("arm64_kernel", 85),
    ("cloudwatch", 81),
    ("namespaces", 80),
    ("aws_credentials", 73),
    ("secrets", 57),
    ("fleet_alerts", 54),
    ("unanswered", 52),
    ("drain_rolling", 49),
    ("containers", 48),
    ("answers", 45),
    ("aws", 34),
    ("drain", 32),
    ("soak_kill", 30),
    ("aws_user_data", 27),
    ("probe_speaks", 24),
    ("systemd", 24),
    ("workers", 20),
    ("database", 19),
    ("web_backend", 19),
    ("health_agent", 19),
    ("database_alerts", 18),
    ("database_config", 18),
    ("service", 15),
    ("containerd", 14),
    ("first_day", 13),
];
const DEFAULT_SECS: u64 = 10;

/// One test executable cargo built, and how to run it.
#[derive(Debug, Clone)]
struct Binary {
    name: String,
    path: PathBuf,
    /// Where cargo would run it: its package's directory.
    dir: PathBuf,
    /// Its arguments and environment when it is a [`LibRun`], else the stage's test arguments.
    run: Option<LibRun>,
}

/// A later stage's run of the agent library's test binary (`test-kernel`: its `#[ignore]`d
/// tests, which load the eBPF programs; `fuzz-smoke`), folded into the lanes: it needs nothing
/// the other binaries hold, and mostly the lanes wait.
#[derive(Debug, Clone)]
pub struct LibRun {
    pub name: &'static str,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// Seconds it took alone, its weight in the lane plan.
    pub secs: u64,
}

/// A command run beside the quiet group (the release artifacts, at idle priority), which the
/// lanes wait for: their tests use what it makes.
pub struct Beside {
    /// What it makes, as the log says it.
    pub name: String,
    pub command: Command,
    /// What proves it, run as a lane job: `program` with `run.args`, from the workspace root.
    pub proof: Option<(PathBuf, LibRun)>,
}

/// The agent library's test binary, as cargo names it.
const LIB: &str = "lib health_agent";

/// Builds every test target and lists their executables.
fn build(targets: &[&str]) -> Result<Vec<Binary>> {
    let out = cmd::cargo()
        .current_dir(cmd::root())
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(targets)
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed");
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(exe), Some(manifest)) = (v["executable"].as_str(), v["manifest_path"].as_str())
        else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let kind = v["target"]["kind"][0].as_str().unwrap_or_default();
        let name = v["target"]["name"].as_str().unwrap_or_default();
        binaries.push(Binary {
            name: format!("{kind} {name}"),
            path: exe.into(),
            dir: PathBuf::from(manifest)
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| cmd::root().to_path_buf()),
            run: None,
        });
    }
    Ok(binaries)
}

/// The binary's target name (`test verdicts` → `verdicts`).
fn short(b: &Binary) -> &str {
    b.name.rsplit(' ').next().unwrap_or_default()
}

fn weight(b: &Binary) -> u64 {
    if let Some(run) = &b.run {
        return run.secs;
    }
    let short = short(b);
    MEASURED
        .iter()
        .find(|(n, _)| *n == short)
        .map_or(DEFAULT_SECS, |(_, s)| *s)
}

/// The binaries the lanes take, longest first: each lane takes the first one that may start
/// (a heavy one while fewer than HEAVY_AT_ONCE run, a VM while none does).
struct Queue {
    pending: Vec<Binary>,
    heavy: usize,
    vm: bool,
    /// The release artifacts are made (NEEDS_ARTIFACTS may start).
    artifacts: bool,
}

impl Queue {
    fn new(mut binaries: Vec<Binary>, artifacts: bool) -> Self {
        binaries.sort_by_key(|b| std::cmp::Reverse(weight(b)));
        Self {
            pending: binaries,
            heavy: 0,
            vm: false,
            artifacts,
        }
    }

    /// The next binary that may start now, counted as started.
    fn take(&mut self) -> Option<Binary> {
        let i = self.pending.iter().position(|b| {
            let name = short(b);
            (!HEAVY.contains(&name) || self.heavy < HEAVY_AT_ONCE)
                && (!VMS.contains(&name) || !self.vm)
                && (self.artifacts || !needs_artifacts(b))
        })?;
        let b = self.pending.remove(i);
        self.heavy += usize::from(HEAVY.contains(&short(&b)));
        self.vm |= VMS.contains(&short(&b));
        Some(b)
    }

    fn done(&mut self, b: &Binary) {
        if HEAVY.contains(&short(b)) {
            self.heavy -= 1;
        }
        if VMS.contains(&short(b)) {
            self.vm = false;
        }
    }
}

/// Whether `b` uses the release artifacts (its proof, a lane job, does too).
fn needs_artifacts(b: &Binary) -> bool {
    NEEDS_ARTIFACTS.contains(&short(b)) || b.run.as_ref().is_some_and(|r| r.name == PROOF)
}

/// The name of the artifacts' proof as a lane job ([`Beside::proof`]).
pub const PROOF: &str = "dist-check";

/// One lane: takes binaries from `queue` until none is left, waiting while those left may not
/// start yet; sends each result as it ends. Returns how long it ran.
fn lane(
    i: usize,
    queue: &(std::sync::Mutex<Queue>, std::sync::Condvar),
    test_args: &[String],
    tx: &std::sync::mpsc::Sender<(usize, Ran)>,
) -> Duration {
    let start = Instant::now();
    let (lock, turn) = queue;
    loop {
        let next = {
            let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.pending.is_empty() {
                    break None;
                }
                if let Some(b) = q.take() {
                    break Some(b);
                }
                q = turn.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Some(b) = next else {
            return start.elapsed();
        };
        let ran = run_one(&b, test_args);
        lock.lock().unwrap_or_else(|e| e.into_inner()).done(&b);
        turn.notify_all();
        let _ = tx.send((i, ran));
    }
}

/// What one binary did.
struct Ran {
    name: String,
    took: Duration,
    ok: bool,
    output: String,
}

impl Ran {
    /// Prints its line (`at`: its lane, `quiet`, `again alone`) and, when it failed, its output; adds
    /// its counts to `total` when it passed. Whether it passed.
    fn report(&self, at: &str, total: &mut (u64, u64, u64)) -> bool {
        let (p, f, i) = self.counts();
        let status = if self.ok { "ok" } else { "FAILED" };
        println!(
            "lanes: {at}: {} {status} in {:.1} s ({p} passed, {f} failed, {i} ignored)",
            self.name,
            self.took.as_secs_f64()
        );
        if self.ok {
            *total = (total.0 + p, total.1 + f, total.2 + i);
        } else {
            println!("{}", self.output);
        }
        self.ok
    }

    /// (passed, failed, ignored) from its `test result:` lines.
    fn counts(&self) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for l in self
            .output
            .lines()
            .filter(|l| l.starts_with("test result:"))
        {
            let word = |after: &str| {
                l.split(after)
                    .next()
                    .and_then(|s| s.rsplit(' ').next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            c.0 += word(" passed");
            c.1 += word(" failed");
            c.2 += word(" ignored");
        }
        c
    }
}

fn run_one(b: &Binary, test_args: &[String]) -> Ran {
    let start = Instant::now();
    let mut command = Command::new(&b.path);
    command.current_dir(&b.dir).stdin(Stdio::null());
    match &b.run {
        Some(run) => command.args(&run.args).envs(run.env.iter().cloned()),
        None => command.args(test_args),
    };
    let out = command.output();
    let (ok, output) = match out {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, format!("cannot run {}: {e}", b.path.display())),
    };
    Ran {
        name: b.name.clone(),
        took: start.elapsed(),
        ok,
        output,
    }
}

/// Runs each of the `failed` binaries again alone: a failure that holds alone is a failure; one
/// that does not was the contention, and is said as such. The names of those that failed again.
fn again_alone(
    failed: &[String],
    all: &[Binary],
    test_args: &[String],
    total: &mut (u64, u64, u64),
) -> Vec<String> {
    let mut still = Vec::new();
    for name in failed {
        let Some(b) = all.iter().find(|b| &b.name == name) else {
            continue;
        };
        println!("lanes: {name} failed beside others: running it again alone");
        if run_one(b, test_args).report("again alone", total) {
            println!("lanes: {name} passed alone: it failed only beside the others");
        } else {
            println!("lanes: {name} FAILED alone too");
            still.push(name.clone());
        }
    }
    still
}

/// Runs `beside` to its end with its output going to the terminal, as a [`Ran`] whose output
/// says how it ended.
fn run_beside(mut b: Beside) -> Ran {
    let start = Instant::now();
    println!(
        "lanes: beside the quiet group: {}",
        cmd::display(&b.command)
    );
    let status = b.command.status();
    let (ok, output) = match status {
        Ok(s) => (
            s.success(),
            format!("{} ended: {s} (its output is above)", b.name),
        ),
        Err(e) => (
            false,
            format!("cannot run {}: {e}", cmd::display(&b.command)),
        ),
    };
    Ran {
        name: b.name,
        took: start.elapsed(),
        ok,
        output,
    }
}

/// Builds the tests, runs the quiet group with `beside`, then them and `lib_runs` in `lanes` lanes, prints each binary's result as it
/// ends (its output when it failed) and the lanes' times; fails when any binary failed.
pub fn run(
    targets: &[&str],
    lanes: usize,
    test_args: &[String],
    lib_runs: &[LibRun],
    beside: Option<Beside>,
) -> Result<()> {
    let mut all = build(targets)?;
    if !lib_runs.is_empty() {
        let lib = all
            .iter()
            .find(|b| b.name == LIB)
            .cloned()
            .with_context(|| format!("cargo built no `{LIB}` test binary"))?;
        for run in lib_runs {
            all.push(Binary {
                name: format!("{LIB} ({})", run.name),
                run: Some(run.clone()),
                ..lib.clone()
            });
        }
    }
    if let Some((program, run)) = beside.as_ref().and_then(|b| b.proof.clone()) {
        all.push(Binary {
            name: format!(
                "{} {}",
                program.file_name().unwrap_or_default().to_string_lossy(),
                run.args.join(" ")
            ),
            path: program,
            dir: cmd::root().to_path_buf(),
            run: Some(run),
        });
    }
    let (quiet, laned): (Vec<_>, Vec<_>) =
        all.iter().cloned().partition(|b| QUIET.contains(&short(b)));
    let queue = Queue::new(laned, beside.is_none());
    let names: Vec<&str> = queue.pending.iter().map(|b| b.name.as_str()).collect();
    println!(
        "lanes: {} lanes take, longest first, at most {HEAVY_AT_ONCE} heavy ({}) at once and one \
         VM at a time, those that use the release artifacts ({}) once they are made: {}",
        lanes.max(1),
        HEAVY.join(", "),
        NEEDS_ARTIFACTS.join(", "),
        names.join(", ")
    );
    let queue = (std::sync::Mutex::new(queue), std::sync::Condvar::new());
    let mut failed = Vec::new();
    let mut total = (0, 0, 0);
    let started = Instant::now();
    let (beside, times) = std::thread::scope(|scope| {
        // The release artifacts, at idle priority, from the start of the quiet group until
        // they are made; then the binaries that use them may start.
        let beside = beside.map(|b| {
            let queue = &queue;
            scope.spawn(move || {
                let r = run_beside(b);
                let status = if r.ok { "ok" } else { "FAILED" };
                println!(
                    "lanes: beside the quiet group: {} {status} in {:.0} s",
                    r.name,
                    r.took.as_secs_f64()
                );
                let mut q = queue.0.lock().unwrap_or_else(|e| e.into_inner());
                if r.ok {
                    q.artifacts = true;
                } else {
                    // Nothing to test them with: the stage fails on this, not on each.
                    q.pending.retain(|b| !needs_artifacts(b));
                }
                queue.1.notify_all();
                r
            })
        });
        // The figures-against-a-known-load binaries, side by side with each other only: each
        // keeps under a fifth of a core busy (sampled every 5 s: 3–20 %), while the lanes keep
        // both cores 40–99 % busy, which is what moved their percentiles.
        let runs: Vec<_> = quiet
            .iter()
            .map(|b| (b, scope.spawn(|| run_one(b, test_args))))
            .collect();
        for (b, run) in runs {
            // A runner that panicked ran nothing to its end: a failure, never a pass.
            let r = run.join().unwrap_or_else(|_| Ran {
                name: b.name.clone(),
                took: Duration::ZERO,
                ok: false,
                output: format!("the thread running {} panicked", b.name),
            });
            if !r.report("quiet", &mut total) {
                failed.push(r.name);
            }
        }
        println!(
            "lanes: the quiet group {:.0} s",
            started.elapsed().as_secs_f64()
        );
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Ran)>();
        let handles: Vec<_> = (0..lanes.max(1))
            .map(|i| {
                let (queue, tx) = (&queue, tx.clone());
                scope.spawn(move || lane(i, queue, test_args, &tx))
            })
            .collect();
        drop(tx);
        for (lane, r) in rx {
            if !r.report(&format!("lane {lane}"), &mut total) {
                failed.push(r.name);
            }
        }
        let times: BTreeMap<usize, f64> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| (i, h.join().map_or(0.0, |d| d.as_secs_f64())))
            .collect();
        let beside = beside.map(|run| {
            run.join().unwrap_or_else(|_| Ran {
                name: "beside the quiet group".into(),
                took: Duration::ZERO,
                ok: false,
                output: "its thread panicked".into(),
            })
        });
        (beside, times)
    });
    if let Some(r) = beside.filter(|r| !r.ok) {
        // Its output went to the log as it ran.
        bail!("{}: the lanes' tests need what it makes", r.output);
    }
    let said: Vec<String> = times
        .iter()
        .map(|(i, t)| format!("lane {i} {t:.0} s"))
        .collect();
    println!("lanes: {}", said.join(", "));
    let still = again_alone(&failed, &all, test_args, &mut total);
    println!(
        "lanes: {} passed, {} failed, {} ignored",
        total.0, total.1, total.2
    );
    if !still.is_empty() {
        bail!("failed: {}", still.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(name: &str) -> Binary {
        Binary {
            name: format!("test {name}"),
            path: PathBuf::from(name),
            dir: PathBuf::new(),
            run: None,
        }
    }

    #[test]
    fn the_queue_goes_longest_first_but_holds_back_a_fourth_heavy_and_a_second_vm() {
        let mut q = Queue::new(
            [
                "docs",
                "old_kernel",
                "fleet",
                "slow_peers",
                "verdicts",
                "arm64_kernel",
                "aws",
            ]
            .map(binary)
            .to_vec(),
            true,
        );
        let took = |q: &mut Queue| q.take().map(|b| short(&b).to_owned());
        assert_eq!(took(&mut q).as_deref(), Some("old_kernel"));
        assert_eq!(took(&mut q).as_deref(), Some("fleet"));
        assert_eq!(took(&mut q).as_deref(), Some("slow_peers"));
        // Three heavy ones run: the next heavy ones wait, the light ones go past them.
        assert_eq!(took(&mut q).as_deref(), Some("aws"));
        assert_eq!(took(&mut q).as_deref(), Some("docs"));
        assert_eq!(took(&mut q), None);
        // A fleet ends: verdicts may start, not the second VM while the first runs.
        q.done(&binary("fleet"));
        assert_eq!(took(&mut q).as_deref(), Some("verdicts"));
        q.done(&binary("slow_peers"));
        assert_eq!(took(&mut q), None);
        q.done(&binary("old_kernel"));
        assert_eq!(took(&mut q).as_deref(), Some("arm64_kernel"));
        assert!(q.pending.is_empty());
    }

    #[test]
    fn those_that_use_the_artifacts_wait_for_them_and_the_others_go_past() {
        let mut q = Queue::new(
            ["service", "old_kernel", "docs"].map(binary).to_vec(),
            false,
        );
        assert_eq!(q.take().map(|b| b.name).as_deref(), Some("test docs"));
        assert!(q.take().is_none(), "the artifacts are not made yet");
        q.artifacts = true;
        assert_eq!(q.take().map(|b| b.name).as_deref(), Some("test old_kernel"));
        assert_eq!(q.take().map(|b| b.name).as_deref(), Some("test service"));
    }
}
