//! Section 1: `/health` throughput and latency against nginx serving a static body of the same
//! size (the practical ceiling on this machine), at several concurrency levels and at half of
//! the agent's peak rate; agent RSS and idle CPU. With a baseline build, its /health throughput
//! in the same alternation, so the two builds meet the same moments of the machine.

use std::{fmt::Write as _, fs, path::Path, thread, time::Duration};

use anyhow::{bail, Result};
use health_agent_tests::{free_port, NginxOptions};

use super::{agent_config, idle_cpu, proc_status_kb, start_nginx, wrk::wrk};
use crate::live::{get, start_agent};

pub(super) fn run(
    agent_bin: &Path,
    baseline_bin: Option<&Path>,
    dir: &Path,
    quick: bool,
) -> Result<String> {
    let mut md = String::new();
    let backend = start_nginx(NginxOptions::bench(1))?;
    let web_port = backend.port;
    let agent_port = free_port();
    let cfg = dir.join("agent.toml");
    // wrk's 200 connections all come from 127.0.0.1: lift the per-client cap.
    let config = |port| {
        agent_config(port, web_port, true).replace(
            "[server]\n",
            "[server]\nmax_connections_per_client = 1024\n",
        )
    };
    fs::write(&cfg, config(agent_port))?;
    let agent = start_agent(agent_bin, &cfg, &dir.join("agent.log"), agent_port)?;
    let agent_pid = agent.0.id();
    let baseline = match baseline_bin {
        Some(bin) => {
            let port = free_port();
            let cfg = dir.join("baseline.toml");
            fs::write(&cfg, config(port))?;
            Some((
                start_agent(bin, &cfg, &dir.join("baseline.log"), port)?,
                port,
            ))
        }
        None => None,
    };
    thread::sleep(Duration::from_secs(3));
    let idle_secs = if quick { 10 } else { 30 };
    let idle_fresh = idle_cpu(agent_pid, idle_secs);
    let (_, body) = get(agent_port, "/health")?;
    let ceiling = start_nginx(NginxOptions::bench(2).file("health", body.as_bytes()))?;
    let ceiling_port = ceiling.port;
    println!(
        "bench: /health body is {} bytes; nginx serves the same size",
        body.len()
    );

    let secs = if quick { 3 } else { 5 };
    let mut rows = String::new();
    let mut baseline_rows = String::new();
    let mut peak = 0.0f64;
    let mut worst_ratio = f64::MAX;
    for conns in [1u32, 10, 50, 200] {
        // Alternate agent and nginx three times and keep each one's best run: on a shared
        // 2-core VM a single run can lose 15 % to a neighbour.
        let health_url = format!("http://127.0.0.1:{agent_port}/health");
        let ceiling_url = format!("http://127.0.0.1:{ceiling_port}/health");
        let baseline_url = baseline
            .as_ref()
            .map(|(_, port)| format!("http://127.0.0.1:{port}/health"));
        let mut a = wrk(&health_url, conns, secs, &[], None)?;
        let mut n = wrk(&ceiling_url, conns, secs, &[], None)?;
        let mut b = match &baseline_url {
            Some(url) => Some(wrk(url, conns, secs, &[], None)?),
            None => None,
        };
        for _ in 0..2 {
            let a2 = wrk(&health_url, conns, secs, &[], None)?;
            let n2 = wrk(&ceiling_url, conns, secs, &[], None)?;
            if a2.rps > a.rps {
                a = a2;
            }
            if n2.rps > n.rps {
                n = n2;
            }
            if let (Some(url), Some(best)) = (&baseline_url, b.as_mut()) {
                let b2 = wrk(url, conns, secs, &[], None)?;
                if b2.rps > best.rps {
                    *best = b2;
                }
            }
        }
        if let Some(b) = &b {
            let ratio = a.rps / b.rps;
            println!(
                "bench: c={conns:<3} this build {:>8.0} req/s p99 {:.3} ms | baseline {:>8.0} req/s p99 {:.3} ms | {ratio:.2}x",
                a.rps, a.p99_ms, b.rps, b.p99_ms
            );
            let _ = writeln!(
                baseline_rows,
                "| {conns} | {:.0} | {:.3} | {:.0} | {:.3} | **{ratio:.2}×** |",
                a.rps, a.p99_ms, b.rps, b.p99_ms
            );
        }
        if a.non_2xx + a.errors > 0 {
            bail!(
                "/health answered {} non-2xx and {} socket errors under load",
                a.non_2xx,
                a.errors
            );
        }
        peak = peak.max(a.rps);
        let ratio = a.rps / n.rps;
        worst_ratio = worst_ratio.min(ratio);
        println!("bench: c={conns:<3} agent {:>8.0} req/s p50 {:.3} ms p99 {:.3} ms | nginx {:>8.0} req/s p50 {:.3} ms p99 {:.3} ms | {ratio:.2}x",
            a.rps, a.p50_ms, a.p99_ms, n.rps, n.p50_ms, n.p99_ms);
        let _ = writeln!(
            rows,
            "| {conns} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | **{ratio:.2}×** |",
            a.rps, a.p50_ms, a.p99_ms, n.rps, n.p50_ms, n.p99_ms
        );
    }
    // Half of peak: wrk throttled per connection with a Lua delay (whole milliseconds).
    let target_rate = peak / 2.0;
    let conns = ((target_rate * 5.0 / 1000.0).ceil() as u32).clamp(2, 1000);
    let delay_ms = (f64::from(conns) * 1000.0 / target_rate).round().max(1.0) as u32;
    let script = dir.join("throttle.lua");
    fs::write(
        &script,
        format!("function delay()\n  return {delay_ms}\nend\n"),
    )?;
    let half_a = wrk(
        &format!("http://127.0.0.1:{agent_port}/health"),
        conns,
        secs * 2,
        &[],
        Some(&script),
    )?;
    let half_n = wrk(
        &format!("http://127.0.0.1:{ceiling_port}/health"),
        conns,
        secs * 2,
        &[],
        Some(&script),
    )?;
    println!("bench: half of peak ({target_rate:.0} req/s target): agent {:.0} req/s p99 {:.3} ms, nginx {:.0} req/s p99 {:.3} ms",
        half_a.rps, half_a.p99_ms, half_n.rps, half_n.p99_ms);
    let rss_kb = proc_status_kb(agent_pid, "VmRSS:").unwrap_or(0);
    let hwm_kb = proc_status_kb(agent_pid, "VmHWM:").unwrap_or(0);
    thread::sleep(Duration::from_secs(2));
    let idle_pct = idle_cpu(agent_pid, idle_secs);
    println!(
        "bench: agent RSS {rss_kb} KiB (peak {hwm_kb} KiB), idle CPU {idle_fresh:.2} % of a core before the load runs, {idle_pct:.2} % after"
    );
    drop(agent);
    drop(baseline);
    drop(ceiling);
    drop(backend);

    let _ = writeln!(
        md,
        "## 1. `/health` against nginx serving the same {}-byte body\n",
        body.len()
    );
    md.push_str("Both on loopback, with the same wrk settings (`wrk -t2 -cC -d5s --latency`; wrk shares the 2 cores), alternating agent, nginx three times and keeping each one's best run. nginx: 2 workers, static file.\n\n");
    md.push_str("| connections | agent req/s | agent p50 ms | agent p99 ms | nginx req/s | nginx p50 ms | nginx p99 ms | agent/nginx |\n|---|---|---|---|---|---|---|---|\n");
    md.push_str(&rows);
    if let Some(bin) = baseline_bin {
        let _ = writeln!(
            md,
            "\nThe baseline build (`{}`), in the same alternation, best of three each:\n\n| connections | this build req/s | p99 ms | baseline req/s | p99 ms | this/baseline |\n|---|---|---|---|---|---|",
            bin.display()
        );
        md.push_str(&baseline_rows);
    }
    let _ = writeln!(
        md,
        "\n| at half of the agent's peak ({:.0} req/s offered, {conns} connections) | req/s | p99 ms |\n|---|---|---|\n| agent | {:.0} | **{:.3}** |\n| nginx | {:.0} | {:.3} |\n",
        target_rate, half_a.rps, half_a.p99_ms, half_n.rps, half_n.p99_ms
    );
    let _ = writeln!(
        md,
        "| agent resources | value | target |\n|---|---|---|\n| RSS after the load runs | {:.1} MB (peak {:.1} MB) | < 30 MB |\n| idle CPU over {idle_secs} s (schedstat; probe every 2 s, kernel counters every 250 ms), before / after the load runs | {idle_fresh:.2} % / {idle_pct:.2} % of a core | < 1 % |\n| worst agent/nginx ratio | {worst_ratio:.2}× | ≥ 0.8× |\n",
        rss_kb as f64 / 1024.0,
        hwm_kb as f64 / 1024.0,
    );
    Ok(md)
}
