//! Section 2: time from hang onset (kill -STOP) to 503, under 10 req/s and idle, next to what
//! Caddy's active check needs (measured) and ALB's defaults (computed).

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use health_agent_tests::free_port;

use super::{agent_config, fastrand_ms, kill, median, wait_code};
use crate::live::{get, start_agent, start_backend, Proc};

pub(super) fn run(agent_bin: &Path, backend_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let bport = free_port();
    let pid_file = dir.join("backend.pid");
    let backend = start_backend(backend_bin, bport, &pid_file)?;
    let bpid = backend.0.id();
    let trials = if quick { 2 } else { 5 };
    // Both ways of following connections: every program attached all the time, and attached
    // only on suspicion (the healthy state reads sock_diag; the hang itself attaches them).
    let mut modes = Vec::new();
    for mode in ["always", "on_suspicion"] {
        let aport = free_port();
        let cfg = dir.join(format!("agent2-{mode}.toml"));
        fs::write(
            &cfg,
            format!(
                "{}socket_tracing = \"{mode}\"\n",
                agent_config(aport, bport, true)
            ),
        )?;
        let agent = start_agent(
            agent_bin,
            &cfg,
            &dir.join(format!("agent2-{mode}.log")),
            aport,
        )?;
        wait_code(aport, 200, Duration::from_secs(20))?;
        let busy = stop_trials(aport, bpid, bport, trials, true)?;
        let idle = stop_trials(aport, bpid, bport, trials, false)?;
        drop(agent);
        println!("bench: socket_tracing = {mode}: hang → 503 under 10 req/s: {busy:?} s; idle: {idle:?} s");
        modes.push((mode, busy, idle));
    }

    // Caddy's active health check (10 s interval, 5 s timeout), measured on the same backend.
    let caddy_port = free_port();
    let caddyfile = dir.join("Caddyfile");
    fs::write(
        &caddyfile,
        format!(
            "{{\n  admin off\n  auto_https off\n}}\nhttp://127.0.0.1:{caddy_port} {{\n  reverse_proxy 127.0.0.1:{bport} {{\n    health_uri /up\n    health_interval 10s\n    health_timeout 5s\n  }}\n}}\n"
        ),
    )?;
    let caddy = Proc(
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&caddyfile)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting caddy (apt-get install caddy; cargo xtask setup does)")?,
    );
    let through_caddy = || -> Option<u16> {
        crate::live::get_with_timeout(caddy_port, "/", Duration::from_millis(300))
            .ok()
            .map(|(c, _)| c)
    };
    let mut caddy_times = Vec::new();
    for _ in 0..(if quick { 1 } else { 3 }) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while through_caddy() != Some(200) {
            if Instant::now() > deadline {
                bail!("Caddy never routed to the backend");
            }
            thread::sleep(Duration::from_millis(100));
        }
        thread::sleep(Duration::from_millis(fastrand_ms() * 3));
        kill(bpid, libc::SIGSTOP);
        let t0 = Instant::now();
        while through_caddy() != Some(503) {
            if t0.elapsed() > Duration::from_secs(40) {
                bail!("Caddy did not mark the stopped backend down within 40 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
        caddy_times.push(t0.elapsed().as_secs_f64());
        kill(bpid, libc::SIGCONT);
    }
    drop(caddy);
    drop(backend);
    println!("bench: Caddy active check (10 s / 5 s) marked it down after {caddy_times:?} s");

    let fmt = |v: &mut Vec<f64>| {
        let med = median(v);
        format!(
            "{:.2} / {:.2} / {:.2}",
            v.iter().cloned().fold(f64::MAX, f64::min),
            med,
            v.iter().cloned().fold(0.0, f64::max)
        )
    };
    let mut md = String::from("## 2. Time from hang onset to a failing health check\n\n");
    let _ = writeln!(
        md,
        "Produced by `cargo xtask bench --only hang{}` (or as part of `cargo xtask bench`), {}.\n",
        if quick { " --quick" } else { "" },
        super::time_now()
    );
    md.push_str("The backend (the bundled fixture server) is stopped with `kill -STOP`: it keeps its listen port, the kernel keeps queueing handshakes, nobody accepts. The rule: when every process holding the listener is stopped (or in a frozen cgroup), the server is `hung` once the oldest stuck work — a connection in the accept queue, a request read and unanswered, or the probe timing out — has waited 0.5 s (never more than `web.hung_after`); weaker evidence (connections queue and nothing is taken or answered while its processes run, with no CPU and no outbound request in flight) waits `web.hung_after = 2s`, stretched to twice the server's own longest quiet spell. The agent looks at the server's processes once work has been stuck 200 ms, and evaluates every `web.eval_interval = 250ms` plus at the instant a threshold can be crossed. Under traffic the next request is the stuck work; idle, only the agent's own probe (every `checks.interval = 2s`) is, so up to one probe interval passes before the 0.5 s start (each trial stops the backend at a random point of the probe cycle). Agent defaults otherwise, heal off (no restart target), measured with each `web.socket_tracing` mode (with `on_suspicion` the per-connection programs are detached while the backend is healthy; the stop itself attaches them). `/health` polled every 5 ms.\n\n");
    md.push_str("| who | trials | min / median / max seconds | target |\n|---|---|---|---|\n");
    for (mode, mut busy, mut idle) in modes {
        let busy_median = median(&mut busy);
        let idle_max = idle.iter().cloned().fold(0.0, f64::max);
        // Timers (the probe's cadence, evaluation ticks, the 5 ms poll) add a little: one
        // evaluation tick of slack on top of probe interval + 0.5 s.
        let _ = writeln!(
            md,
            "| health-agent (`socket_tracing = \"{mode}\"`), 10 req/s of traffic | {} | {} | median ≤ 1 s {} |",
            busy.len(),
            fmt(&mut busy),
            if busy_median <= 1.0 { "✓" } else { "✗" }
        );
        let _ = writeln!(
            md,
            "| health-agent (`socket_tracing = \"{mode}\"`), idle (only its own probe) | {} | {} | ≤ probe interval + 0.5 s + one eval tick = 2.75 s {} |",
            idle.len(),
            fmt(&mut idle),
            if idle_max <= 2.75 { "✓" } else { "✗" }
        );
    }
    let _ = writeln!(md, "| Caddy active check, `health_interval 10s`, `health_timeout 5s` (measured: first 503 through Caddy) | {} | {} | — |", caddy_times.len(), fmt(&mut caddy_times));
    md.push_str("| AWS ALB defaults, 30 s interval × 2 failures, 6 s timeout (computed, not run here) | — | 36 / 51 / 66 | — |\n\n");

    Ok(md)
}

/// Stops the backend `trials` times (with 10 req/s of traffic, or idle) and returns how long
/// each took to turn `/health` 503.
fn stop_trials(
    aport: u16,
    bpid: u32,
    bport: u16,
    trials: usize,
    traffic: bool,
) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for _ in 0..trials {
        let stop = Arc::new(AtomicBool::new(false));
        let load = traffic.then(|| trickle(bport, 10, stop.clone()));
        // Let the probe and the traffic settle into a random phase. The previous trial ended
        // on a probe (recovery is seen there): 0–2 s spans a whole probe interval.
        thread::sleep(Duration::from_millis(3000 + 2 * fastrand_ms()));
        wait_code(aport, 200, Duration::from_secs(30))?;
        kill(bpid, libc::SIGSTOP);
        let took = wait_code(aport, 503, Duration::from_secs(30));
        kill(bpid, libc::SIGCONT);
        stop.store(true, Ordering::Relaxed);
        if let Some(l) = load {
            let _ = l.join();
        }
        let took = took?;
        wait_code(aport, 200, Duration::from_secs(30))?;
        out.push(took.as_secs_f64());
    }
    Ok(out)
}

/// Background traffic at ~`per_sec` requests/s, each with a short timeout.
fn trickle(port: u16, per_sec: u64, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            thread::spawn(move || {
                let _ = get(port, "/");
            });
            thread::sleep(Duration::from_millis(1000 / per_sec));
        }
    })
}
