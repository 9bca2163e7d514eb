//! Section 5: a failing alert receiver does not slow `/health`.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use health_agent_tests::free_port;

use super::wrk::{wrk, Wrk};
use crate::live::{health, start_agent, Proc};

pub(super) fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let secs = if quick { 3 } else { 5 };
    let (md, ok) = alerts_under_stall(agent_bin, dir, secs)?;
    if !ok {
        bail!("the alert was not delivered exactly once after 429 → 500 → 200");
    }
    Ok(md)
}

/// A receiver that answers its first request 429 (Retry-After: 1), its second 500, the rest
/// 200 — each after a 1 s stall. Returns its port and the statuses it answered, in order.
fn stubborn_receiver() -> Result<(u16, Arc<std::sync::Mutex<Vec<u16>>>)> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = log.clone();
    thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 65536];
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.read(&mut buf);
            thread::sleep(Duration::from_secs(1));
            let code = match seen.lock() {
                Ok(mut v) => {
                    let code = [429, 500].get(v.len()).copied().unwrap_or(200);
                    v.push(code);
                    code
                }
                Err(_) => return,
            };
            let extra = if code == 429 {
                "Retry-After: 1\r\n"
            } else {
                ""
            };
            let _ = write!(
                s,
                "HTTP/1.1 {code} X\r\n{extra}Content-Length: 2\r\nConnection: close\r\n\r\nok"
            );
        }
    });
    Ok((port, log))
}

fn wait_infrastructure_issue(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while health(port)?.1["recommendation"] != "infrastructure_issue" {
        if Instant::now() > deadline {
            bail!("the database outage was not seen");
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// /health p99 with a database outage (200 degraded, an incident) and no alert destination,
/// then the same with a webhook that answers 429 → 500 → 200, stalling 1 s each time.
fn alerts_under_stall(agent_bin: &Path, dir: &Path, secs: u32) -> Result<(String, bool)> {
    let dead_db = free_port();
    let base = |port: u16| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n[database]\nurl = \"postgres://app@127.0.0.1:{dead_db}/app\"\ninterval = \"1s\"\ntimeout = \"500ms\"\nfail_after = 1\n"
        )
    };
    // One agent per configuration, measured once its incident is open; the agent stays up
    // (returned) so a delivery still in flight can finish.
    let measure = |name: &str, extra: &str| -> Result<(Proc, Wrk)> {
        let port = free_port();
        let cfg = dir.join(format!("{name}.toml"));
        fs::write(&cfg, base(port) + extra)?;
        let agent = start_agent(agent_bin, &cfg, &dir.join(format!("{name}.log")), port)?;
        wait_infrastructure_issue(port)?;
        let w = wrk(
            &format!("http://127.0.0.1:{port}/health"),
            10,
            secs,
            &[],
            None,
        )?;
        Ok((agent, w))
    };
    let (agent, quiet) = measure("alerts-off", "")?;
    drop(agent);
    let (rport, statuses) = stubborn_receiver()?;
    // The delivery (1 s stall, 429, Retry-After 1 s, 1 s stall, 500, backoff, 1 s stall, 200)
    // runs during this measurement.
    let (agent, busy) = measure(
        "alerts-on",
        &format!("\n[alerts]\nwebhook_url = \"http://127.0.0.1:{rport}/hook\"\n"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let answered = loop {
        let v = statuses.lock().map(|v| v.clone()).unwrap_or_default();
        if v.len() >= 3 || Instant::now() > deadline {
            break v;
        }
        thread::sleep(Duration::from_millis(100));
    };
    thread::sleep(Duration::from_secs(3));
    let total = statuses.lock().map(|v| v.len()).unwrap_or(0);
    drop(agent);
    let ok = answered == [429, 500, 200] && total == 3;
    println!("bench: /health p99 {:.3} ms without alerts, {:.3} ms while the webhook answered {answered:?} ({total} requests)", quiet.p99_ms, busy.p99_ms);
    let mut md = String::from("\n## 5. A failing alert receiver does not slow `/health`\n\n");
    md.push_str("A database outage (200 degraded, `infrastructure_issue`, an incident). `/health` under `wrk -t2 -c10` with no alert destination, then with a webhook that stalls 1 s and answers 429 (`Retry-After: 1`), then 500, then 200 — the delivery runs during the measurement.\n\n");
    md.push_str("| alerts | req/s | p50 ms | p99 ms | webhook answered |\n|---|---|---|---|---|\n");
    let _ = writeln!(
        md,
        "| none configured | {:.0} | {:.3} | {:.3} | — |",
        quiet.rps, quiet.p50_ms, quiet.p99_ms
    );
    let _ = writeln!(md, "| webhook stalling and failing | {:.0} | {:.3} | {:.3} | {answered:?}, {total} requests in all (delivered once) |", busy.rps, busy.p50_ms, busy.p99_ms);
    Ok((md, ok))
}
