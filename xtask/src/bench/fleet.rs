//! Bench section 7: what asking the peers costs. `/health` throughput of one agent with its peer
//! exchange on and off, side by side in alternating pairs, and the cost of one exchange round:
//! its wall time (`details.fleet.round_ms`) and the agent's CPU time per round.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use health_agent_tests::free_port;

use super::{cpu_seconds, median, wrk::wrk};
use crate::live::{health, start_agent};

/// The peer exchange's cadence in this section: shorter than the default 2 s, to make its cost
/// visible.
const INTERVAL_MS: u64 = 1000;

/// The fleet key the section's agents share (`fleet.key_file`, mode 0600 as the agent requires).
fn key_file(dir: &Path) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("fleet.key");
    fs::write(&path, "bEnCh-fLeEt-KeY-0123456789abcdefghijklmnopqrstu\n")?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

fn config(port: u16, peers: &[u16], key: &Path) -> String {
    let mut c = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n[web]\nport = 0\n"
    );
    if !peers.is_empty() {
        let list: Vec<String> = peers.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
        let _ = write!(
            c,
            "\n[fleet]\npeers = [{}]\ninterval = \"{INTERVAL_MS}ms\"\ntimeout = \"1s\"\nkey_file = {:?}\n",
            list.join(", "),
            key.display().to_string()
        );
    }
    c
}

pub fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let dir = dir.join("fleet");
    fs::create_dir_all(&dir)?;
    let key = key_file(&dir)?;
    // Two peers that stay up for the whole section.
    let (pb, pc) = (free_port(), free_port());
    let mut peers = Vec::new();
    for (name, port, other) in [("b", pb, pc), ("c", pc, pb)] {
        let cfg = dir.join(format!("peer-{name}.toml"));
        fs::write(&cfg, config(port, &[other], &key))?;
        peers.push(start_agent(
            agent_bin,
            &cfg,
            &dir.join(format!("peer-{name}.log")),
            port,
        )?);
    }
    let pa = free_port();
    let (on, off) = (dir.join("a-on.toml"), dir.join("a-off.toml"));
    fs::write(&on, config(pa, &[pb, pc], &key))?;
    fs::write(&off, config(pa, &[], &key))?;

    let pairs = if quick { 2 } else { 5 };
    let secs = if quick { 3 } else { 5 };
    let idle_secs = if quick { 5 } else { 20 };
    let url = format!("http://127.0.0.1:{pa}/health");
    let mut rps = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    let mut round_ms = Vec::new();
    for i in 0..pairs {
        // Alternate the order so a drifting machine favours neither side.
        let order = if i % 2 == 0 { [1, 0] } else { [0, 1] };
        for fleet_on in order {
            let cfg = if fleet_on == 1 { &on } else { &off };
            let agent = start_agent(agent_bin, cfg, &dir.join("a.log"), pa)?;
            thread::sleep(Duration::from_millis(2 * INTERVAL_MS + 500));
            if fleet_on == 1 {
                let (_, b) = health(pa)?;
                let answered = b["details"]["fleet"]["peers_answered"]
                    .as_array()
                    .map_or(0, Vec::len);
                if answered != 2 {
                    bail!(
                        "the peers did not answer agent A: {}",
                        b["details"]["fleet"]
                    );
                }
            }
            // Idle CPU over whole rounds: the exchange is the only difference.
            let pid = agent.0.id();
            let c0 = cpu_seconds(pid).unwrap_or(0.0);
            let t0 = Instant::now();
            thread::sleep(Duration::from_secs(idle_secs));
            let c1 = cpu_seconds(pid).unwrap_or(0.0);
            cpu[fleet_on].push((c1 - c0) / t0.elapsed().as_secs_f64());
            if fleet_on == 1 {
                let (_, b) = health(pa)?;
                if let Some(ms) = b["details"]["fleet"]["round_ms"].as_f64() {
                    round_ms.push(ms);
                }
            }
            rps[fleet_on].push(wrk(&url, 10, secs, &[], None)?.rps);
            drop(agent);
        }
    }
    drop(peers);

    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (off_rps, on_rps) = (mean(&rps[0]), mean(&rps[1]));
    let (off_cpu, on_cpu) = (mean(&cpu[0]), mean(&cpu[1]));
    let rounds_per_sec = 1000.0 / INTERVAL_MS as f64;
    let cpu_per_round_ms = (on_cpu - off_cpu).max(0.0) / rounds_per_sec * 1000.0;
    let round = median(&mut round_ms);
    println!(
        "bench: fleet: /health {off_rps:.0} req/s without the exchange, {on_rps:.0} with ({:.3}x); round {round:.1} ms, {cpu_per_round_ms:.2} ms CPU per round",
        on_rps / off_rps
    );
    let mut md = String::from("\n## 7. What asking the peers costs\n\n");
    let _ = writeln!(
        md,
        "Agent A asks two peer agents (B, C, on loopback) every {INTERVAL_MS} ms (the default is 2 s), each with a 1 s timeout; the same agent without `[fleet]` is the baseline. {pairs} alternating pairs; `/health` by `wrk -t2 -c10 -d{secs}s`; idle CPU of A over {idle_secs} s per run (schedstat of all its threads).\n"
    );
    md.push_str(
        "| | without `[fleet]` | with `[fleet]` | ratio / difference |\n|---|---|---|---|\n",
    );
    let _ = writeln!(
        md,
        "| `/health` req/s (mean) | {off_rps:.0} | {on_rps:.0} | **{:.3}×** |",
        on_rps / off_rps
    );
    let _ = writeln!(
        md,
        "| agent CPU, % of one core, idle | {:.2} | {:.2} | +{:.2} |",
        off_cpu * 100.0,
        on_cpu * 100.0,
        (on_cpu - off_cpu) * 100.0
    );
    let _ = writeln!(
        md,
        "| one exchange round: wall time (median of `details.fleet.round_ms`) | — | {round:.1} ms | — |"
    );
    let _ = writeln!(
        md,
        "| one exchange round: CPU | — | {cpu_per_round_ms:.2} ms | — |"
    );
    let (plain, proven, bytes) = proof_cost()?;
    let _ = writeln!(
        md,
        "| one ask, CPU of both sides: the view rendered and parsed ({bytes} B) | {plain:.1} µs | {proven:.1} µs with the proofs (ask signed and checked, view signed and checked, range-checked) | +{:.1} µs |",
        proven - plain
    );
    Ok(md)
}

/// The proofs' price per ask beside the work an ask did without them, in-process on a release
/// build (`fleet::proof`'s `cost_per_ask`): (without, with, the view's bytes).
fn proof_cost() -> Result<(f64, f64, u64)> {
    let out = crate::cmd::cargo()
        .current_dir(crate::cmd::root())
        .args([
            "test",
            "--release",
            "-p",
            "health-agent",
            "--lib",
            "fleet::proof::tests::cost_per_ask",
            "--",
            "--ignored",
            "--nocapture",
            "--exact",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("proof-cost: "))
        .ok_or_else(|| anyhow::anyhow!("cost_per_ask printed no figures:\n{text}"))?;
    let field = |name: &str| -> Result<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in {line:?}"))
    };
    Ok((
        field("plain_us")?,
        field("proven_us")?,
        field("body_bytes")? as u64,
    ))
}
