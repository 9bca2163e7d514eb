//! `cargo xtask demo`: the product's main job on a built-in default. A bundled backend (the
//! fixture server, standing in for Puma), the agent watching it from the kernel, steady traffic,
//! and a narrated story: healthy → hung (kill -STOP keeps the port, accepts nothing) → 503 →
//! resumed → healthy; then the same hang with self-healing on: recovering → restarted → healthy,
//! without a single 503; then a deploy: `health-agent drain` with traffic that follows `/health`
//! as a balancer does, the restart, `undrain`, and not a request lost.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{
    cmd,
    live::{get, health, start_agent, start_backend},
    setup,
};

#[derive(clap::Args)]
pub struct Args {
    /// Port the agent serves /health on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Port of the bundled backend.
    #[arg(long, default_value_t = 9000)]
    backend_port: u16,
}

/// One line per /health answer: the balancer's view and the kernel's — the counters while the
/// programs are attached, sock_diag's view of the connections while they are not.
fn line(t0: Instant, code: u16, b: &Value) -> String {
    let w = &b["details"]["web"];
    let c = &w["counters"];
    let v = &w["kernel"]["following"]["connections"];
    let n = |v: &Value| v.as_u64().map_or("-".into(), |n| n.to_string());
    let attached = c.is_object();
    let (waiting, pending, oldest) = if attached {
        (
            n(&c["waiting"]),
            n(&c["pending"]),
            n(&c["oldest_waiting_ms"]),
        )
    } else {
        let waiting = v["unaccepted"].as_u64().zip(v["unread"].as_u64());
        (
            waiting.map_or("-".into(), |(a, b)| (a + b).to_string()),
            n(&v["pending"]),
            n(&v["oldest_unaccepted_ms"]),
        )
    };
    format!(
        "  t={:5.1}s  /health {code} {:<10} webserver={:<12} queue={:<3} programs={:<8} requests/s={:<6} waiting={:<3} pending={:<3} oldest_waiting_ms={}",
        t0.elapsed().as_secs_f64(),
        b["status"].as_str().unwrap_or("?"),
        b["checks"]["webserver"].as_str().unwrap_or("?"),
        n(&w["accept_queue"]),
        if attached { "attached" } else { "detached" },
        w["figures"]["requests_per_second"]
            .as_f64()
            .map_or("-".into(), |r| format!("{r:.1}")),
        waiting,
        pending,
        oldest,
    )
}

/// Polls /health every 50 ms (a restart's `recovering` lasts a few hundred), printing every
/// answer that differs, until `done` says so or `timeout`.
fn watch(
    port: u16,
    t0: Instant,
    timeout: Duration,
    mut done: impl FnMut(u16, &Value) -> bool,
) -> Result<(u16, Value)> {
    let deadline = Instant::now() + timeout;
    let mut last_key = String::new();
    let mut last_print = Instant::now() - Duration::from_secs(10);
    loop {
        let (code, body) = health(port)?;
        let key = format!("{code}{}{}", body["status"], body["checks"]["webserver"]);
        if key != last_key || last_print.elapsed() >= Duration::from_secs(1) {
            println!("{}", line(t0, code, &body));
            last_key = key;
            last_print = Instant::now();
        }
        if done(code, &body) {
            return Ok((code, body));
        }
        if Instant::now() > deadline {
            bail!("the demo did not reach the expected state within {timeout:?}; last /health: {code} {body}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// ~10 requests a second to the backend, like real users would send.
fn traffic(port: u16, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            thread::spawn(move || {
                let _ = get(port, "/");
            });
            thread::sleep(Duration::from_millis(100));
        }
    })
}

/// ~10 requests a second, sent only while the agent's last `/health` (asked every 500 ms, as a
/// balancer's active check) was 200: a balancer in miniature. Counts the requests and those
/// that failed.
fn balanced_traffic(
    port: u16,
    backend: u16,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<(u64, u64)> {
    thread::spawn(move || {
        let (mut sent, mut failed) = (0, 0);
        let mut in_rotation = true;
        let mut checked = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if checked.elapsed() >= Duration::from_millis(500) {
                in_rotation = health(port).is_ok_and(|(code, _)| code == 200);
                checked = Instant::now();
            }
            if in_rotation {
                sent += 1;
                if !get(backend, "/").is_ok_and(|(code, _)| code == 200) {
                    failed += 1;
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        (sent, failed)
    })
}

#[allow(unsafe_code)]
fn signal_backend(pid_file: &Path, sig: i32) -> Result<()> {
    let pid: i32 = fs::read_to_string(pid_file)?.trim().parse()?;
    // SAFETY: signalling the backend this demo started.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!(
            "signalling the backend failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn config(dir: &Path, port: u16, backend_port: u16, restart_command: &str) -> String {
    format!(
        "# written by cargo xtask demo\n[server]\nlisten = \"127.0.0.1:{port}\"\ndetails = \"always\"\n\n\
         [checks]\ninterval = \"1s\"\nboot_grace = \"0s\"\nrecover_after = \"2s\"\n\n\
         [web]\nport = {backend_port}\nprobe_path = \"/up\"\nprobe_timeout = \"1s\"\nhung_after = \"2s\"\nrestart_command = {restart_command:?}\n\n\
         [heal]\nmax_restarts = 3\ntimeout = \"10s\"\n\n\
         [drain]\ncontrol_socket = \"{socket}\"\nstate_file = \"{state}\"\n",
        socket = dir.join("control.sock").display(),
        state = dir.join("drain.json").display(),
    )
}

/// The agent and the bundled backend, built (debug): their paths.
fn build() -> Result<(PathBuf, PathBuf)> {
    cmd::run(cmd::cargo().current_dir(cmd::root()).args([
        "build",
        "--package",
        "health-agent",
        "--package",
        "health-agent-tests",
        "--bin",
        "health-agent",
        "--bin",
        "fixture-backend",
    ]))
    .context("building the agent and the bundled backend failed")?;
    let target = cmd::target_dir();
    let agent_bin = target.join("debug/health-agent");
    let backend_bin = target.join("debug/fixture-backend");
    Ok((agent_bin, backend_bin))
}

/// Act 1's figures: the kernel view's mode, the rates and latency, and what they cost.
fn show_healthy(web: &serde_json::Value) {
    println!(
        "  kernel view: {}, socket_tracing = {}: {}",
        web["kernel"]["state"],
        web["kernel"]["following"]["mode"],
        web["kernel"]["following"]["why"].as_str().unwrap_or("")
    );
    println!(
        "  figures ({}, {} window(s)): {} requests/s, server latency p50 {} ms",
        web["figures"]["basis"],
        web["figures"]["windows"],
        web["figures"]["requests_per_second"],
        web["figures"]["latency"]["p50_ms"]
    );
    println!(
        "  cost while healthy: the programs run only in a half-second counting window every 15 s \
         (about 19 ns per socket call of the host under nginx keep-alive, bench section 11 in \
         docs/BENCHMARKS.md); socket_tracing = \"always\" keeps them on for exact counts \
         (about 430 ns)"
    );
}

/// Act 5: `health-agent drain` until the kernel shows nothing new and nothing in flight, the
/// restart script, `health-agent undrain`, and /health until it is 200 again.
fn deploy(agent_bin: &Path, cfg: &Path, restart: &Path, port: u16, t0: Instant) -> Result<()> {
    let run = |args: &[&str]| -> Result<()> {
        let out = Command::new(agent_bin)
            .arg("--config")
            .arg(cfg)
            .args(args)
            .output()
            .with_context(|| format!("running health-agent {}", args[0]))?;
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            println!("  | {l}");
        }
        if !out.status.success() {
            bail!(
                "health-agent {} failed: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    println!("  $ health-agent drain --quiet 2s   (/health answers 503 draining at once)");
    run(&["drain", "--quiet", "2s", "--timeout", "30s"])?;
    println!("  $ {}   (the deploy's restart)", restart.display());
    let out = Command::new(restart)
        .output()
        .context("the restart script")?;
    if !out.status.success() {
        bail!("the restart script failed");
    }
    println!("  $ health-agent undrain   (503 booting until the new backend answers, then 200)");
    run(&["undrain"])?;
    watch(port, t0, Duration::from_secs(20), |c, b| {
        c == 200 && b["status"] == "healthy"
    })?;
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    if !cmd::is_root() {
        bail!("the demo loads eBPF programs: run it as root (sudo -E cargo xtask demo)");
    }
    // Only what the demo uses: no Debian package, no service (cargo xtask setup has the rest).
    setup::for_demo()?;
    let (agent_bin, backend_bin) = build()?;
    let dir = std::env::temp_dir().join(format!("health-agent-demo-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let pid_file = dir.join("backend.pid");
    let (port, bport) = (args.port, args.backend_port);

    println!("\nhealth-agent demo");
    println!("  backend  fixture-backend on 127.0.0.1:{bport}, standing in for a Puma web server");
    println!("  agent    health-agent on 127.0.0.1:{port}, watching port {bport} from the kernel (eBPF tracepoints)");
    println!("  traffic  10 requests/s to the backend\n");

    let mut backend = Some(start_backend(&backend_bin, bport, &pid_file)?);
    let cfg_path = dir.join("act1.toml");
    fs::write(&cfg_path, config(&dir, port, bport, ""))?;
    let agent = start_agent(&agent_bin, &cfg_path, &dir.join("agent1.log"), port)?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(bport, stop.clone());
    let t0 = Instant::now();

    println!("== 1. healthy: requests are accepted and answered ==");
    // The first counting window opens as the agent starts: the figures have a rate once it
    // closes.
    let (_, b) = watch(port, t0, Duration::from_secs(20), |c, b| {
        c == 200
            && b["checks"]["webserver"] == "up"
            && b["details"]["web"]["figures"]["requests_per_second"].as_f64() > Some(0.0)
    })?;
    show_healthy(&b["details"]["web"]);

    println!(
        "\n== 2. the backend hangs: kill -STOP keeps its listen port, nobody calls accept() =="
    );
    println!(
        "  (a port check still passes: the kernel completes every handshake into the accept queue)"
    );
    signal_backend(&pid_file, libc::SIGSTOP)?;
    let hung_at = Instant::now();
    let (_, b) = watch(port, t0, Duration::from_secs(30), |c, _| c == 503)?;
    println!(
        "  -> 503 after {:.1}s: {}",
        hung_at.elapsed().as_secs_f64(),
        b["details"]["web"]["detail"].as_str().unwrap_or("")
    );

    println!("\n== 3. the backend resumes (kill -CONT): the queue drains ==");
    println!("  (200 comes back once the backend has been fine for checks.recover_after = 2s: no flapping)");
    signal_backend(&pid_file, libc::SIGCONT)?;
    let resumed = Instant::now();
    watch(port, t0, Duration::from_secs(30), |c, b| {
        c == 200 && b["status"] == "healthy"
    })?;
    println!(
        "  -> healthy again after {:.1}s",
        resumed.elapsed().as_secs_f64()
    );
    drop(agent);

    println!("\n== 4. self-healing: the same hang, now with web.restart_command set ==");
    // The restart command replaces the hung process with a fresh one, like `systemctl restart`.
    let script = dir.join("restart-backend.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nkill -KILL $(cat {pid}) 2>/dev/null\nsleep 0.2\nsetsid {bin} --listen 127.0.0.1:{bport} --control 127.0.0.1:{c} >/dev/null 2>&1 &\necho $! > {pid}\necho restarted backend as pid $!\n",
            pid = pid_file.display(),
            bin = backend_bin.display(),
            c = bport + 1
        ),
    )?;
    // Set in-process: a `chmod` through cmd::run would print its trace line into the story.
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let cfg_path = dir.join("act2.toml");
    fs::write(
        &cfg_path,
        config(&dir, port, bport, &script.display().to_string()),
    )?;
    let agent = start_agent(&agent_bin, &cfg_path, &dir.join("agent2.log"), port)?;
    watch(port, t0, Duration::from_secs(20), |c, b| {
        c == 200 && b["checks"]["webserver"] == "up"
    })?;
    signal_backend(&pid_file, libc::SIGSTOP)?;
    // From here the restart script owns the backend process.
    if let Some(b) = backend.take() {
        std::mem::forget(b);
    }
    let mut saw_503 = false;
    let mut saw_recovering = false;
    let (_, b) = watch(port, t0, Duration::from_secs(40), |c, b| {
        saw_503 |= c == 503;
        saw_recovering |= b["status"] == "recovering";
        let healed = b["details"]["heal"]["total_recovered"].as_u64() >= Some(1);
        healed && c == 200 && b["status"] == "healthy"
    })?;
    let attempt = &b["details"]["heal"]["attempts"][0];
    println!(
        "  -> healed: {} ({}, {} ms); answered `recovering` meanwhile: {}; 503 meanwhile: {}",
        attempt["action"].as_str().unwrap_or("?"),
        attempt["outcome"].as_str().unwrap_or("?"),
        attempt["duration_ms"],
        if saw_recovering { "yes" } else { "no" },
        if saw_503 { "yes" } else { "no" }
    );

    stop.store(true, Ordering::Relaxed);
    let _ = load.join();

    println!("\n== 5. a deploy: drain, restart, undrain; the traffic follows /health as a balancer does ==");
    let stop = Arc::new(AtomicBool::new(false));
    let load = balanced_traffic(port, bport, stop.clone());
    thread::sleep(Duration::from_secs(2));
    deploy(&agent_bin, &cfg_path, &script, port, t0)?;
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (sent, failed) = load.join().unwrap_or_default();
    println!("  -> {sent} requests sent through the deploy, {failed} failed");
    drop(agent);
    let _ = signal_backend(&pid_file, libc::SIGKILL);
    let _ = fs::remove_dir_all(&dir);
    println!("\ndemo: done. The agent's config for your own backend: health-agent config --dump");
    Ok(())
}
