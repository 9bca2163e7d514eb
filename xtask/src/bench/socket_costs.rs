//! Section 3, continued: what the hooks cost per socket call and per connection, measured on
//! one thread without scheduling noise. Also run alone by `--only socket-costs`.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Result;
use health_agent_tests::free_port;

use super::{agent_config, median};
use crate::live::start_agent;

/// Nanoseconds per ping-pong round (four socket calls: send, recv, send, recv of 64 bytes) and
/// per connection (connect, accept, one byte each way, close both ends), one thread.
fn socket_ops(port: u16, rounds: u32, connections: u32) -> Result<(f64, f64)> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port))?;
    let (mut server, _) = listener.accept()?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let mut buf = [0u8; 64];
    let t0 = Instant::now();
    for _ in 0..rounds {
        client.write_all(&buf)?;
        server.read_exact(&mut buf)?;
        server.write_all(&buf)?;
        client.read_exact(&mut buf)?;
    }
    let pingpong = t0.elapsed().as_nanos() as f64 / rounds as f64;
    drop((client, server));
    let t0 = Instant::now();
    for _ in 0..connections {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
        let (mut s, _) = listener.accept()?;
        c.write_all(&buf[..1])?;
        s.read_exact(&mut buf[..1])?;
        s.write_all(&buf[..1])?;
        c.read_exact(&mut buf[..1])?;
    }
    let churn = t0.elapsed().as_nanos() as f64 / connections as f64;
    Ok((pingpong, churn))
}

/// What the hooks cost per socket call and per connection: `socket_ops` without the agent, with
/// the agent watching another port (every hook fires and turns the socket away), and with the
/// agent watching the port (the server side is followed), alternated and medians taken.
pub(super) fn run(
    agent_bin: &Path,
    baseline: Option<&Path>,
    dir: &Path,
    quick: bool,
) -> Result<String> {
    let port = free_port();
    let other = free_port();
    let aport = free_port();
    let watch = |p: u16| -> Result<PathBuf> {
        let cfg = dir.join(format!("agent-ops-{p}.toml"));
        // No probe: only the measured connections touch the port.
        fs::write(&cfg, agent_config(aport, p, true) + "probe_path = \"\"\n")?;
        Ok(cfg)
    };
    let (cfg_other, cfg_port) = (watch(other)?, watch(port)?);
    let (rounds, conns, trials) = if quick {
        (50_000, 5_000, 1)
    } else {
        (200_000, 20_000, 5)
    };
    // (label, binary, config); the baseline build, when given, alternates with this one.
    let mut variants: Vec<(String, Option<(&Path, &PathBuf)>)> = vec![
        ("none".into(), None),
        (
            "watching another port".into(),
            Some((agent_bin, &cfg_other)),
        ),
        ("watching this port".into(), Some((agent_bin, &cfg_port))),
    ];
    if let Some(b) = baseline {
        variants.push((
            "baseline build, watching another port".into(),
            Some((b, &cfg_other)),
        ));
        variants.push((
            "baseline build, watching this port".into(),
            Some((b, &cfg_port)),
        ));
    }
    let mut res: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); variants.len()];
    for _ in 0..trials {
        for (i, (_, run)) in variants.iter().enumerate() {
            let agent = match run {
                Some((bin, c)) => Some(start_agent(bin, c, &dir.join("agent-ops.log"), aport)?),
                None => None,
            };
            let (p, c) = socket_ops(port, rounds, conns)?;
            drop(agent);
            res[i].0.push(p);
            res[i].1.push(c);
        }
    }
    let med: Vec<(f64, f64)> = res
        .iter_mut()
        .map(|(p, c)| (median(p), median(c)))
        .collect();
    let mut md = String::new();
    md.push_str("\n### Cost per socket call and per connection\n\n");
    let _ = writeln!(md, "One thread on loopback, blocking sockets: {rounds} ping-pong rounds of 64 bytes (4 socket calls each), then {conns} connections (connect, accept, one byte each way, close). Medians of {trials} alternated trials; the extra cost over no agent is what the hooks take.\n");
    md.push_str("| agent | ns per round | extra ns per socket call | ns per connection | extra ns per connection |\n|---|---|---|---|---|\n");
    for ((label, _), &(p, c)) in variants.iter().zip(&med) {
        let _ = writeln!(
            md,
            "| {label} | {p:.0} | {:.0} | {c:.0} | {:.0} |",
            (p - med[0].0) / 4.0,
            c - med[0].1
        );
    }
    println!("bench: socket ops (round ns, connection ns): {med:?}");
    Ok(md)
}
