//! Section 10: publishing the saturation to CloudWatch never slows `/health`. One agent per
//! case, all running at once and measured in turn with wrk while they publish: no CloudWatch, moto
//! answering (healthy), nothing listening (down), a server that accepts and never answers
//! (stalling), and one that answers every request 400 `Throttling` (as AWS does).

use std::{
    fmt::Write as _,
    fs,
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use health_agent_tests::{free_port, Moto};
use serde_json::Value;

use super::{
    harness, median,
    wrk::{wrk, Wrk},
};
use crate::live::{agent_command, health, spawn_agent, Proc};

const MAX_RETRIES: u32 = 2;

/// A server that accepts connections and never answers; they are held until the bench ends.
fn stalling() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    Ok(port)
}

/// A server that answers every request the way a throttling CloudWatch does.
fn throttling() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = vec![0u8; 1 << 16];
                let mut got = Vec::new();
                // Head, then Content-Length bytes of body.
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let len = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if got.len() < end + 4 + len {
                        continue;
                    }
                    got.drain(..end + 4 + len);
                    let body = "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
                                <Message>Rate exceeded</Message></Error></ErrorResponse>";
                    let _ = write!(
                        s,
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                }
            });
        }
    });
    Ok(port)
}

/// One agent and its measurements.
struct Case {
    name: &'static str,
    port: u16,
    agent: Proc,
    runs: Vec<Wrk>,
    status: Value,
}

fn cloudwatch_status(port: u16) -> Result<Value> {
    Ok(health(port)?.1["details"]["scaling"]["cloudwatch"].clone())
}

/// Starts an agent publishing to `endpoint` (none: CloudWatch off).
fn start(agent_bin: &Path, dir: &Path, name: &'static str, endpoint: Option<&str>) -> Result<Case> {
    let port = free_port();
    let mut cfg =
        format!("[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n");
    if let Some(endpoint) = endpoint {
        let _ = write!(
            cfg,
            "\n[scaling.cloudwatch]\nenabled = true\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n\
             auto_scaling_group = \"bench\"\ninterval = \"10s\"\nhigh_resolution = true\n\
             timeout = \"1s\"\nmax_retries = {MAX_RETRIES}\n"
        );
    }
    let file = name.split_whitespace().next().unwrap_or(name);
    let path = dir.join(format!("cloudwatch-{file}.toml"));
    fs::write(&path, cfg)?;
    let log = dir.join(format!("cloudwatch-{file}.log"));
    let mut cmd = agent_command(agent_bin, &path, &log, "warn")?;
    cmd.env("AWS_ACCESS_KEY_ID", "AKIDBENCH")
        .env("AWS_SECRET_ACCESS_KEY", "bench-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let agent = spawn_agent(&mut cmd, &log, port, Duration::from_secs(20))?;
    Ok(Case {
        name,
        port,
        agent,
        runs: Vec::new(),
        status: Value::Null,
    })
}

pub(super) fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    fs::create_dir_all(dir)?;
    let (rounds, secs) = if quick { (2, 3) } else { (3, 6) };
    let moto = harness("starting moto (cargo xtask setup installs it)", Moto::start)?;
    let (stall, throttle) = (stalling()?, throttling()?);
    let refused = format!("http://127.0.0.1:{}", free_port());
    // All five run at once and are measured in turn, round after round: the machine's own
    // noise (other processes, frequency) falls on every case alike.
    let mut cases = vec![
        start(agent_bin, dir, "off", None)?,
        start(agent_bin, dir, "healthy (moto)", Some(&moto.endpoint()))?,
        start(agent_bin, dir, "down (refused)", Some(&refused))?,
        start(
            agent_bin,
            dir,
            "stalling",
            Some(&format!("http://127.0.0.1:{stall}")),
        )?,
        start(
            agent_bin,
            dir,
            "throttling",
            Some(&format!("http://127.0.0.1:{throttle}")),
        )?,
    ];
    let deadline = Instant::now() + Duration::from_secs(40);
    for c in cases.iter().skip(1) {
        while cloudwatch_status(c.port)?["requests"].as_u64().unwrap_or(0) == 0 {
            if Instant::now() > deadline {
                bail!(
                    "{}: no PutMetricData within 40 s: {}",
                    c.name,
                    cloudwatch_status(c.port)?
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    for _ in 0..rounds {
        for c in cases.iter_mut() {
            let w = wrk(
                &format!("http://127.0.0.1:{}/health", c.port),
                10,
                secs,
                &[],
                None,
            )?;
            c.runs.push(w);
        }
    }
    for c in cases.iter_mut() {
        c.status = cloudwatch_status(c.port)?;
    }
    let mut md = String::from("\n## 10. Publishing to CloudWatch does not slow `/health`\n\n");
    let _ = writeln!(
        md,
        "`cargo xtask bench --only cloudwatch`. Five agents at once, one per row, `[scaling.cloudwatch]` every 10 s (high resolution), `timeout = \"1s\"`, `max_retries = {MAX_RETRIES}`. Once each has started publishing, `/health` of each in turn under `wrk -t2 -c10` for {secs} s, {rounds} rounds (median of the rounds; every round's p99 in brackets), while the failing ones keep retrying with backoff and jitter every interval. CloudWatch is moto (`moto[server]`, the real API), a closed port, a server that never answers, and one that answers every request 400 `Throttling`.\n"
    );
    md.push_str("| CloudWatch | req/s | p50 ms | p99 ms (each round) | batches / PutMetricData requests (retries) | published | last error |\n|---|---|---|---|---|---|---|\n");
    for c in &cases {
        let s = &c.status;
        let enabled = s["enabled"] == true;
        let rounds_p99: Vec<String> = c.runs.iter().map(|w| format!("{:.2}", w.p99_ms)).collect();
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.3} | {:.3} ({}) | {} | {} | {} |",
            c.name,
            median(&mut c.runs.iter().map(|w| w.rps).collect::<Vec<_>>()),
            median(&mut c.runs.iter().map(|w| w.p50_ms).collect::<Vec<_>>()),
            median(&mut c.runs.iter().map(|w| w.p99_ms).collect::<Vec<_>>()),
            rounds_p99.join(", "),
            if enabled {
                format!("{} / {} ({})", s["batches"], s["requests"], s["retries"])
            } else {
                "—".into()
            },
            if enabled {
                s["published_data"].to_string()
            } else {
                "—".into()
            },
            s["last_error"].as_str().unwrap_or("—").replace('|', "/"),
        );
        println!("bench: cloudwatch {}: {}", c.name, c.status);
    }
    let healthy = &cases[1].status;
    if healthy["published_data"].as_u64().unwrap_or(0) == 0 {
        bail!("moto received nothing: {healthy}");
    }
    for c in &cases[1..] {
        let n = |k: &str| c.status[k].as_u64().unwrap_or(0);
        if n("requests") > n("batches") * (1 + u64::from(MAX_RETRIES)) {
            bail!("{}: retries not bounded: {}", c.name, c.status);
        }
    }
    drop(cases.into_iter().map(|c| c.agent).collect::<Vec<_>>());
    Ok(md)
}
