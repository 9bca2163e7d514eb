//! Section 3: backend throughput with the agent's eBPF programs attached vs not: nginx serving
//! a static file (the worst case) and Puma running a Rack app; then what the hooks cost per
//! socket call and per connection (`socket_costs.rs`).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use health_agent_tests::{free_port, Nginx, NginxOptions};

use super::{agent_config, socket_costs, start_nginx, wrk::wrk};
use crate::live::{get, health, start_agent, Proc};

/// What section 4 goes on with: this section's nginx, and the agent's config watching it.
pub(super) struct Backend {
    pub nginx: Nginx,
    pub cfg: PathBuf,
    pub aport: u16,
}

pub(super) fn run(
    agent_bin: &Path,
    baseline: Option<&Path>,
    dir: &Path,
    quick: bool,
) -> Result<(String, Backend)> {
    let nginx = start_nginx(NginxOptions::bench(1).file("index.html", vec![b'x'; 1024]))?;
    let nport = nginx.port;
    let pport = free_port();
    let puma = start_puma(&dir.join("puma"), pport)?;
    let aport3 = free_port();
    let agent_cfg = |name: &str, port: u16, extra: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        fs::write(&path, agent_config(aport3, port, true) + extra)?;
        Ok(path)
    };
    let cfg3 = agent_cfg("agent3.toml", nport, "")?;
    let cfg3_always = agent_cfg("agent3-always.toml", nport, "accept_tracing = \"always\"\n")?;
    let cfg3_puma = agent_cfg("agent3-puma.toml", pport, "")?;
    let tsecs = if quick { 3 } else { 5 };
    let pairs = if quick { 2 } else { 6 };
    let mut table3 = String::new();
    let close = || vec!["-H", "Connection: close"];
    let nginx_url = format!("http://127.0.0.1:{nport}/index.html");
    let puma_url = format!("http://127.0.0.1:{pport}/");
    for (backend, label, url, extra, cfg, always) in [
        ("nginx", "keep-alive", &nginx_url, vec![], &cfg3, false),
        (
            "nginx",
            "new connection per request",
            &nginx_url,
            close(),
            &cfg3,
            false,
        ),
        (
            "nginx",
            "keep-alive, `accept_tracing = \"always\"`",
            &nginx_url,
            vec![],
            &cfg3_always,
            true,
        ),
        (
            "nginx",
            "new connection per request, `accept_tracing = \"always\"`",
            &nginx_url,
            close(),
            &cfg3_always,
            true,
        ),
        ("Puma", "keep-alive", &puma_url, vec![], &cfg3_puma, false),
        (
            "Puma",
            "new connection per request",
            &puma_url,
            close(),
            &cfg3_puma,
            false,
        ),
    ] {
        let load = || wrk(url, 50, tsecs, &extra, None).map(|w| w.rps);
        let with_agent = || -> Result<(f64, bool)> {
            let agent = start_agent(agent_bin, cfg, &dir.join("agent3.log"), aport3)?;
            // Past the agent's start-up work: the steady state is what a backend lives with.
            thread::sleep(Duration::from_secs(2));
            let rps = load()?;
            let (_, b) = health(aport3)?;
            if b["details"]["web"]["kernel"]["state"] != "active" {
                bail!("the kernel view was not active during the 'with agent' run");
            }
            // Attached now, or at any time in the last 30 s (it stays on that long).
            let traced = b["details"]["web"]["counters"]["accepts_traced"] == true;
            drop(agent);
            Ok((rps, traced))
        };
        let (mut without, mut with, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut traced = false;
        for i in 0..pairs {
            // Alternate the order (AB, BA, ...) so a drifting machine favours neither side.
            let (w0, (w1, t)) = if i % 2 == 0 {
                (load()?, with_agent()?)
            } else {
                let w = with_agent()?;
                (load()?, w)
            };
            traced |= t;
            without.push(w0);
            with.push(w1);
            ratios.push(w1 / w0);
        }
        // "always" must have been attached. With "on_stall" it may come on: a server that leaves
        // connections in its accept queue for 200 ms (Puma takes one only when a thread is
        // free) gets accept() traced, and pays for it; the table says so.
        if always && !traced {
            bail!("accept() tracing was off during the {backend} '{label}' runs");
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (w0, w1) = (mean(&without), mean(&with));
        let spread = format!(
            "{:.3}–{:.3}",
            ratios.iter().cloned().fold(f64::MAX, f64::min),
            ratios.iter().cloned().fold(0.0, f64::max)
        );
        println!(
            "bench: {backend} {label}: without agent {w0:.0} req/s, with {w1:.0} req/s, {:.3}x (pairs {spread})",
            w1 / w0
        );
        let _ = writeln!(
            table3,
            "| {backend} | {label} | {w0:.0} | {w1:.0} | **{:.3}×** | {spread} | {} |",
            w1 / w0,
            match (traced, always) {
                (false, _) => "not attached",
                (true, true) => "attached",
                (true, false) => "came on: connections waited > 200 ms",
            }
        );
    }
    drop(puma);
    let mut md =
        String::from("## 3. Backend throughput with the agent's kernel programs attached\n\n");
    let _ = writeln!(md, "`wrk -t2 -c50 -d{tsecs}s` against each backend, {pairs} pairs of runs without / with the agent (started 2 s before its run), the order alternating from pair to pair; req/s are means, the ratio is of the means, the spread is the lowest and highest ratio within a pair. Target ≥ 0.97×.\n");
    let _ = writeln!(md, "- **nginx**, 1 worker, 1 KiB static file: the worst case. Nearly all of its time is kernel socket work, which is exactly what the hooks add to; wrk and nginx share the 2 cores, and every hook also fires for wrk's own client sockets.\n- **Puma** 5.6 (Debian's `puma`), single mode, 8 threads, a Rack app answering 1 KiB: the kind of backend this agent is for.\n");
    md.push_str("| backend | traffic | without agent req/s | with agent req/s | ratio | spread of pairs | accept() tracepoints |\n|---|---|---|---|---|---|---|\n");
    md.push_str(&table3);
    // Per-operation cost, free of scheduling noise: one thread, blocking sockets, loopback.
    md.push_str(&socket_costs::run(agent_bin, baseline, dir, quick)?);
    Ok((
        md,
        Backend {
            nginx,
            cfg: cfg3,
            aport: aport3,
        },
    ))
}

/// Puma from Debian's `puma` package: single mode, 8 threads, on a one-line Rack app. (Cluster
/// mode spreads wrk's keep-alive connections over its workers by luck at connect time, which
/// moves its throughput by up to 30 % from run to run, agent or not.)
pub(super) fn start_puma(dir: &Path, port: u16) -> Result<Proc> {
    fs::create_dir_all(dir)?;
    let app = dir.join("config.ru");
    fs::write(
        &app,
        "body = (\"x\" * 1024).freeze\nrun ->(env) { [200, { \"content-type\" => \"text/plain\" }, [body]] }\n",
    )?;
    let child = Command::new("puma")
        .current_dir(dir)
        .args([
            "-b",
            &format!("tcp://127.0.0.1:{port}"),
            "-t",
            "8:8",
            "-w",
            "0",
            "--quiet",
        ])
        .arg(&app)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting puma (apt-get install puma; cargo xtask setup does)")?;
    answering(Proc(child), "puma", port, "/", Duration::from_secs(20))
}

/// `server` once `path` on 127.0.0.1:`port` answers 200, or an error naming `what` after
/// `within`.
fn answering(server: Proc, what: &str, port: u16, path: &str, within: Duration) -> Result<Proc> {
    let deadline = Instant::now() + within;
    while get(port, path).ok().map(|(c, _)| c) != Some(200) {
        if Instant::now() > deadline {
            bail!("{what} did not answer on 127.0.0.1:{port}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
}
