//! Section 9: publishing the saturation to CloudWatch never slows `/health`. One agent per
//! case, each measured with wrk while its PutMetricData is in progress: no CloudWatch, moto
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
    harness,
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

struct Case {
    name: &'static str,
    w: Wrk,
    status: Value,
}

/// Starts an agent publishing to `endpoint` (none: CloudWatch off), waits until its first
/// PutMetricData is under way, and measures `/health` for `secs` while it goes on.
fn measure(
    agent_bin: &Path,
    dir: &Path,
    name: &'static str,
    endpoint: Option<&str>,
    secs: u32,
) -> Result<Case> {
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
    let path = dir.join(format!("cloudwatch-{name}.toml"));
    fs::write(&path, cfg)?;
    let log = dir.join(format!("cloudwatch-{name}.log"));
    let mut cmd = agent_command(agent_bin, &path, &log, "warn")?;
    cmd.env("AWS_ACCESS_KEY_ID", "AKIDBENCH")
        .env("AWS_SECRET_ACCESS_KEY", "bench-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let agent: Proc = spawn_agent(&mut cmd, &log, port, Duration::from_secs(20))?;
    let cw =
        || -> Result<Value> { Ok(health(port)?.1["details"]["scaling"]["cloudwatch"].clone()) };
    if endpoint.is_some() {
        let deadline = Instant::now() + Duration::from_secs(30);
        while cw()?["requests"].as_u64().unwrap_or(0) == 0 {
            if Instant::now() > deadline {
                bail!("{name}: no PutMetricData within 30 s: {}", cw()?);
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    let w = wrk(
        &format!("http://127.0.0.1:{port}/health"),
        10,
        secs,
        &[],
        None,
    )?;
    let status = cw()?;
    drop(agent);
    Ok(Case { name, w, status })
}

pub(super) fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    fs::create_dir_all(dir)?;
    let secs = if quick { 5 } else { 12 };
    let moto = harness("starting moto (cargo xtask setup installs it)", Moto::start)?;
    let (stall, throttle) = (stalling()?, throttling()?);
    let cases = [
        measure(agent_bin, dir, "off", None, secs)?,
        measure(
            agent_bin,
            dir,
            "healthy (moto)",
            Some(&moto.endpoint()),
            secs,
        )?,
        measure(
            agent_bin,
            dir,
            "down (refused)",
            Some(&format!("http://127.0.0.1:{}", free_port())),
            secs,
        )?,
        measure(
            agent_bin,
            dir,
            "stalling",
            Some(&format!("http://127.0.0.1:{stall}")),
            secs,
        )?,
        measure(
            agent_bin,
            dir,
            "throttling",
            Some(&format!("http://127.0.0.1:{throttle}")),
            secs,
        )?,
    ];
    let mut md = String::from("\n## 9. Publishing to CloudWatch does not slow `/health`\n\n");
    let _ = writeln!(
        md,
        "`cargo xtask bench --only-cloudwatch`. One agent per row, `[scaling.cloudwatch]` every 10 s (high resolution), `timeout = \"1s\"`, `max_retries = {MAX_RETRIES}`; `/health` under `wrk -t2 -c10` for {secs} s, started once the first PutMetricData is under way, so its retries (backoff with jitter) run during the measurement. CloudWatch is moto (`moto[server]`, the real API), a closed port, a server that never answers, and one that answers every request 400 `Throttling`.\n"
    );
    md.push_str("| CloudWatch | req/s | p50 ms | p99 ms | PutMetricData requests (retries) | published | last error |\n|---|---|---|---|---|---|---|\n");
    for c in &cases {
        let s = &c.status;
        let err = s["last_error"].as_str().unwrap_or("—");
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.3} | {:.3} | {} | {} | {} |",
            c.name,
            c.w.rps,
            c.w.p50_ms,
            c.w.p99_ms,
            if s["enabled"] == true {
                format!("{} ({})", s["requests"], s["retries"])
            } else {
                "—".into()
            },
            if s["enabled"] == true {
                s["published_data"].to_string()
            } else {
                "—".into()
            },
            err.replace('|', "/"),
        );
        println!(
            "bench: cloudwatch {}: /health p99 {:.3} ms, {:.0} req/s; {}",
            c.name, c.w.p99_ms, c.w.rps, c.status
        );
    }
    let healthy = &cases[1].status;
    if healthy["published_data"].as_u64().unwrap_or(0) == 0 {
        bail!("moto received nothing: {healthy}");
    }
    for c in &cases[2..] {
        let (req, retries) = (
            c.status["requests"].as_u64().unwrap_or(0),
            c.status["retries"].as_u64().unwrap_or(0),
        );
        if retries > (req - retries) * u64::from(MAX_RETRIES) {
            bail!("{}: retries not bounded: {}", c.name, c.status);
        }
    }
    Ok(md)
}

/// Puts `section` (starting with its `## N. ` heading) into the existing report in place of
/// the section with the same heading, or at the end.
pub(super) fn splice(report: &str, section: &str) -> String {
    let heading = section.trim_start().lines().next().unwrap_or("");
    let Some(start) = report.find(heading) else {
        return format!("{}\n{}", report.trim_end(), section);
    };
    let rest = &report[start + heading.len()..];
    let end = rest
        .find("\n## ")
        .map_or(report.len(), |i| start + heading.len() + i + 1);
    format!(
        "{}{}\n\n{}",
        &report[..start],
        section.trim(),
        &report[end..]
    )
    .trim_end()
    .to_string()
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::splice;

    #[test]
    fn splice_replaces_only_its_section() {
        let report = "# B\n\n## 8. Flood\n\nx\n\n## 9. Publishing\n\nold\n\n## 10. Other\n\ny\n";
        let out = splice(report, "\n## 9. Publishing\n\nnew\n");
        assert_eq!(
            out,
            "# B\n\n## 8. Flood\n\nx\n\n## 9. Publishing\n\nnew\n\n## 10. Other\n\ny\n"
        );
        let out = splice("# B\n\n## 8. Flood\n\nx\n", "\n## 9. Publishing\n\nnew\n");
        assert_eq!(out, "# B\n\n## 8. Flood\n\nx\n\n## 9. Publishing\n\nnew\n");
    }
}
