//! Section 4: a saturation run of a healthy backend: no false `hung`/`unresponsive`.

use std::{
    fmt::Write as _,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{throughput::Backend, wait_code, wrk::wrk};
use crate::live::{health, start_agent};

pub(super) fn run(agent_bin: &Path, backend: Backend, dir: &Path, quick: bool) -> Result<String> {
    let agent = start_agent(
        agent_bin,
        &backend.cfg,
        &dir.join("agent4.log"),
        backend.aport,
    )?;
    // Past its start: until its first look at the backend it answers 503 `booting`, which is
    // not what this run is about.
    wait_code(backend.aport, 200, Duration::from_secs(20))?;
    let sat_secs: u64 = if quick { 30 } else { 300 };
    let wrk_url = format!("http://127.0.0.1:{}/index.html", backend.nginx.port);
    let wrk_thread = thread::spawn(move || wrk(&wrk_url, 512, sat_secs as u32, &[], None));
    let t0 = Instant::now();
    let (mut polls, mut bad, mut non200, mut max_queue, mut max_wait) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut verdicts = std::collections::BTreeMap::<String, u64>::new();
    while t0.elapsed() < Duration::from_secs(sat_secs) {
        if let Ok((code, b)) = health(backend.aport) {
            polls += 1;
            let v = b["checks"]["webserver"].as_str().unwrap_or("?").to_string();
            if v == "hung" || v == "unresponsive" {
                bad += 1;
            }
            if code != 200 {
                non200 += 1;
            }
            max_queue = max_queue.max(b["details"]["web"]["accept_queue"].as_u64().unwrap_or(0));
            max_wait = max_wait.max(
                b["details"]["web"]["counters"]["oldest_waiting_ms"]
                    .as_u64()
                    .unwrap_or(0),
            );
            *verdicts.entry(v).or_default() += 1;
        }
        thread::sleep(Duration::from_millis(250));
    }
    let sat = wrk_thread
        .join()
        .map_err(|_| anyhow::anyhow!("wrk thread panicked"))??;
    drop(agent);
    drop(backend);
    println!("bench: saturation {sat_secs} s at {:.0} req/s: {polls} polls, verdicts {verdicts:?}, false hung/unresponsive {bad}, non-200 {non200}", sat.rps);
    let mut md = String::from("\n## 4. Saturation run of a healthy backend\n\n");
    let _ = writeln!(md, "nginx (1 worker) under `wrk -t2 -c512 -d{sat_secs}s` ({:.0} req/s, p99 {:.2} ms) while `/health` is polled every 250 ms.\n", sat.rps, sat.p99_ms);
    md.push_str("| polls | verdicts seen | false hung / unresponsive | non-200 answers | deepest accept queue | oldest waiting connection |\n|---|---|---|---|---|---|\n");
    let _ = writeln!(
        md,
        "| {polls} | {} | **{bad}** | {non200} | {max_queue} | {max_wait} ms |",
        verdicts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    Ok(md)
}
