//! 6a: a busy pool is `slow`, not hung.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use health_agent_tests::{free_port, timeline, HealthSample, Load, LoadStats, Puma, PumaOptions};

use super::{
    agent_config, poller,
    report::{
        answers, by_verdict, describe_503s, heal_attempts, merge, restarts_row, stretches, tail,
        Failures,
    },
    start_agent, wait_for, Restarts, LOAD_SEGMENT,
};
use crate::bench::harness;

/// 6a: a Puma whose every thread sleeps 3 s per request, with more clients than threads.
pub(super) fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let soak = Duration::from_secs(if quick { 30 } else { 300 });
    let puma = harness("starting Puma (2 threads)", || {
        Puma::start(PumaOptions {
            threads: 2,
            slow_seconds: 3.0,
            ..Default::default()
        })
    })?;
    let restarts = Restarts(dir.join("restarts-busy"));
    let aport = free_port();
    let cfg = dir.join("agent-busy.toml");
    fs::write(&cfg, agent_config(aport, puma.port, &restarts, ""))?;
    let log = dir.join("agent-busy.log");
    let agent = start_agent(agent_bin, &cfg, &log, aport, &[])?;
    let poller = poller(aport);
    let first_healthy = wait_for(
        &poller,
        Duration::from_secs(30),
        "a healthy backend before the load",
        |s| s.code == 200 && s.status == "healthy",
    )?
    .at;

    // Each request waits for one of 2 threads behind up to 7 others and the probes, ~12 s on
    // average; new connections longest (Puma serves keep-alive ones first), up to a minute.
    let timeout = Duration::from_secs(60);
    let load_from = poller.elapsed();
    let started = Instant::now();
    let (mut fresh, mut kept) = (LoadStats::default(), LoadStats::default());
    let mut max_queue = 0;
    while started.elapsed() < soak {
        let segment_end = Instant::now() + LOAD_SEGMENT.min(soak.saturating_sub(started.elapsed()));
        let new_conns = Load::new_connections(puma.port, "/slow", 4, Duration::ZERO, timeout);
        let keep_alive = Load::keep_alive(puma.port, "/slow", 4, timeout);
        while Instant::now() < segment_end {
            max_queue = max_queue.max(puma.accept_queue().unwrap_or(0));
            thread::sleep(Duration::from_millis(250));
        }
        merge(&mut fresh, new_conns.stop());
        merge(&mut kept, keep_alive.stop());
    }
    let load_to = poller.elapsed();
    let samples = poller.stop();
    let attempts = heal_attempts(&samples);
    let restarted = restarts.count();
    drop(agent);
    drop(puma);

    let during: Vec<&HealthSample> = samples
        .iter()
        .filter(|s| s.at >= load_from && s.at <= load_to)
        .collect();
    let failures = Failures::of(&samples, first_healthy);
    let n503 = failures.n503;
    println!(
        "bench: busy pool {} s: /health {}; 503s {n503}; restarts {restarted} (heal attempts {attempts}); new-connection clients: {}; keep-alive clients: {}; accept queue up to {max_queue}",
        soak.as_secs(),
        by_verdict(during.iter().copied()),
        answers(&fresh),
        answers(&kept)
    );
    print!("{}{}", timeline(&samples), stretches(&samples));
    if n503 > 0 {
        println!(
            "bench: busy pool: 503 answers:\n{}agent log (tail):\n{}",
            describe_503s(&samples, first_healthy),
            tail(&log, 30)
        );
    }
    if fresh.count(200) + kept.count(200) == 0 {
        bail!(
            "the busy-pool load got no answers at all (a harness or Puma problem): new connections: {fresh}; keep-alive: {kept}"
        );
    }

    let mut md = String::from("\n### 6a. A busy pool is `slow`, not hung\n\n");
    let _ = writeln!(
        md,
        "Puma with 2 threads; `GET /slow` sleeps 3 s. 4 clients open a new connection per request and 4 keep one keep-alive connection each, all looping on `/slow` back to back (60 s client timeout) for {} s. Every thread is always busy, Puma stops accepting, connections (the agent's probe among them) wait seconds in the accept queue — and answers keep going out. A new instance would be just as busy. (Puma serves up to 10 requests of a keep-alive connection in a row before it lets a waiting new connection in, so the new-connection clients get few answers and may time out.)\n",
        soak.as_secs()
    );
    md.push_str("| measure | value | target |\n|---|---|---|\n");
    let _ = writeln!(
        md,
        "| `/health` answers during the load, by code and `checks.webserver` | {} | — |",
        by_verdict(during.iter().copied())
    );
    let _ = writeln!(md, "{}", failures.row());
    let _ = writeln!(md, "{}", restarts_row(restarted, attempts));
    let _ = writeln!(
        md,
        "| load: new-connection clients | {} | — |",
        answers(&fresh)
    );
    let _ = writeln!(
        md,
        "| load: keep-alive clients | {} ({} closed by Puma to let a queued connection in) | — |",
        answers(&kept),
        kept.server_closes
    );
    let _ = writeln!(
        md,
        "| deepest accept queue (`/proc/net/tcp`, every 250 ms) | {max_queue} | — |"
    );
    Ok(md)
}
