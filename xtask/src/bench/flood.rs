//! Bench section 8: the health port under a flood. The agent runs with an open-files limit of
//! 1024, soft and hard, while one loopback address holds 1500 idle connections, re-opened
//! every 4 s, and 100 connections that pipeline `/metrics` requests and never read an answer.
//! The load balancer's view: `/health` asked from another loopback address (127.0.0.2) every
//! 50 ms, with a 2 s timeout. With `--baseline-agent`, the earlier build goes through the same
//! flood first, for comparison. `FLOOD_DEBUG=1` prints every answer slower than 50 ms.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt as _,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use health_agent_tests::{free_port, NginxOptions};

use super::start_nginx;
use crate::live::{agent_command, spawn_agent, Proc};

const IDLE: usize = 1500;
const IDLE_EVERY: Duration = Duration::from_secs(4);
const PIPELINERS: usize = 100;
/// The open-files limit the agent starts with (systemd's default soft limit).
const NOFILE: u64 = 1024;
const LB_EVERY: Duration = Duration::from_millis(50);
const LB_TIMEOUT: Duration = Duration::from_secs(2);

/// What the load balancer saw during one flood.
struct Seen {
    latencies_ms: Vec<f64>,
    failures: u64,
    codes_503: u64,
    verdicts: Vec<(String, u64)>,
    restarts: usize,
    idle_opened: u64,
    pipelined_bytes: u64,
}

pub fn run(agent_bin: &Path, baseline: Option<&Path>, dir: &Path, quick: bool) -> Result<String> {
    let dir = dir.join("flood");
    fs::create_dir_all(&dir)?;
    raise_own_nofile();
    let secs = if quick { 10 } else { 30 };
    let mut builds = Vec::new();
    if let Some(b) = baseline {
        builds.push(("baseline", b));
    }
    builds.push(("this build", agent_bin));
    let mut rows = String::new();
    let mut this = None;
    for (label, bin) in builds {
        println!("bench: flood against {label} for {secs} s");
        let seen = flood(bin, &dir.join(label.replace(' ', "-")), secs)?;
        let mut lat = seen.latencies_ms.clone();
        lat.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| {
            lat.get(((lat.len() as f64 * p).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or(f64::NAN)
        };
        let asked = lat.len() as u64 + seen.failures;
        let verdicts: Vec<String> = seen
            .verdicts
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        let _ = writeln!(
            rows,
            "| {label} | {asked} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} / {:.1} MB |",
            seen.failures,
            seen.codes_503,
            pct(0.5),
            pct(0.99),
            lat.last().copied().unwrap_or(f64::NAN),
            verdicts.join(", "),
            seen.restarts,
            seen.idle_opened,
            seen.pipelined_bytes as f64 / 1e6,
        );
        if label == "this build" {
            this = Some((pct(0.99), seen));
        }
    }
    let Some((p99, seen)) = this else {
        bail!("the flood did not run against this build");
    };
    let only_up = seen.verdicts.iter().all(|(v, _)| v == "up");
    let ok = p99 < 100.0 && seen.failures == 0 && only_up && seen.restarts == 0;
    let mut md = String::from("\n## 8. The health port under a flood\n\n");
    let _ = writeln!(
        md,
        "The agent starts with an open-files limit of {NOFILE}, soft and hard (`ulimit -n {NOFILE}`; \
         systemd's default soft limit), and \
         `web.restart_command` set (it only counts). From 127.0.0.1: {IDLE} idle connections, \
         re-opened every {}s, and {PIPELINERS} connections that pipeline `GET /metrics` and never \
         read. From 127.0.0.2, the load balancer: `GET /health` every {} ms with a {} s timeout, \
         for {secs} s. Backend: nginx on loopback, probed at `/up`.\n",
        IDLE_EVERY.as_secs(),
        LB_EVERY.as_millis(),
        LB_TIMEOUT.as_secs()
    );
    md.push_str("| build | asked | failed | 503 | p50 ms | p99 ms | max ms | web verdicts | restarts | idle opened / pipelined |\n|---|---|---|---|---|---|---|---|---|---|\n");
    md.push_str(&rows);
    let _ = writeln!(
        md,
        "\nTarget: p99 < 100 ms, 0 failures, the verdict stays `up`, no restart: {}\n",
        if ok { "✓" } else { "✗" }
    );
    Ok(md)
}

/// The bench holds ~1600 sockets of its own.
#[allow(unsafe_code)]
pub(super) fn raise_own_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn flood(bin: &Path, dir: &Path, secs: u64) -> Result<Seen> {
    fs::create_dir_all(dir)?;
    let backend = start_nginx(NginxOptions::bench(1))?;
    let web_port = backend.port;
    let port = free_port();
    let restarts = dir.join("restarts");
    let _ = fs::remove_file(&restarts);
    let cfg = dir.join("agent.toml");
    fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
             [web]\nport = {web_port}\nprobe_path = \"/up\"\nrestart_command = \"echo restart >> '{}'\"\n",
            restarts.display()
        ),
    )?;
    let _agent = start_limited(bin, &cfg, &dir.join("agent.log"), port)?;
    thread::sleep(Duration::from_secs(3));

    let stop = Arc::new(AtomicBool::new(false));
    let idle_opened = Arc::new(AtomicU64::new(0));
    let pipelined = Arc::new(AtomicU64::new(0));
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    let idle = {
        let (stop, opened) = (stop.clone(), idle_opened.clone());
        thread::spawn(move || hold_idle(to, &stop, &opened))
    };
    let pipe = {
        let (stop, bytes) = (stop.clone(), pipelined.clone());
        thread::spawn(move || pipeline(to, &stop, &bytes))
    };
    // Let the flood build up before the load balancer's view is recorded.
    thread::sleep(Duration::from_secs(2));
    let mut seen = Seen {
        latencies_ms: Vec::new(),
        failures: 0,
        codes_503: 0,
        verdicts: Vec::new(),
        restarts: 0,
        idle_opened: 0,
        pipelined_bytes: 0,
    };
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let t = Instant::now();
        match ask_from([127, 0, 0, 2], to) {
            Ok((code, body)) => {
                seen.latencies_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                if code == 503 {
                    seen.codes_503 += 1;
                }
                let verdict = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["checks"]["webserver"].as_str().map(String::from))
                    .unwrap_or_else(|| format!("HTTP {code}"));
                match seen.verdicts.iter_mut().find(|(v, _)| *v == verdict) {
                    Some((_, n)) => *n += 1,
                    None => seen.verdicts.push((verdict, 1)),
                }
            }
            Err(_) => seen.failures += 1,
        }
        thread::sleep(LB_EVERY.saturating_sub(t.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = idle.join();
    let _ = pipe.join();
    seen.restarts = fs::read_to_string(&restarts).map_or(0, |t| t.lines().count());
    seen.idle_opened = idle_opened.load(Ordering::Relaxed);
    seen.pipelined_bytes = pipelined.load(Ordering::Relaxed);
    Ok(seen)
}

/// The agent with an open-files limit of NOFILE, soft and hard.
#[allow(unsafe_code)]
fn start_limited(bin: &Path, cfg: &Path, log: &Path, port: u16) -> Result<Proc> {
    let mut cmd = agent_command(bin, cfg, log, "warn")?;
    // SAFETY: only async-signal-safe calls (getrlimit, setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Hard limit too (what `ulimit -n 1024` does in a shell): raising the soft limit
            // cannot help, so the connection caps must.
            lim.rlim_cur = NOFILE.min(lim.rlim_max);
            lim.rlim_max = lim.rlim_cur;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    spawn_agent(&mut cmd, log, port, Duration::from_secs(20))
}

/// IDLE connections that send nothing, dropped and re-opened every IDLE_EVERY.
fn hold_idle(to: SocketAddr, stop: &AtomicBool, opened: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        let round = Instant::now();
        let mut held = Vec::with_capacity(IDLE);
        for _ in 0..IDLE {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if let Ok(s) = TcpStream::connect_timeout(&to, Duration::from_millis(200)) {
                held.push(s);
                opened.fetch_add(1, Ordering::Relaxed);
            }
        }
        while round.elapsed() < IDLE_EVERY && !stop.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// PIPELINERS connections that keep writing `GET /metrics` requests and never read.
fn pipeline(to: SocketAddr, stop: &AtomicBool, bytes: &AtomicU64) {
    let batch = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(256);
    let mut conns: Vec<Option<TcpStream>> = (0..PIPELINERS).map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        for slot in conns.iter_mut() {
            if slot.is_none() {
                *slot = TcpStream::connect_timeout(&to, Duration::from_millis(200))
                    .ok()
                    .filter(|s| s.set_nonblocking(true).is_ok());
            }
            let Some(s) = slot.as_mut() else { continue };
            match s.write(&batch) {
                Ok(n) => {
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Closed by the server: open a new one next round.
                Err(_) => *slot = None,
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// GET /health on `to` from the local address `from`, with LB_TIMEOUT for the whole exchange.
fn ask_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<(u16, String)> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::from((from, 0)).into())?;
    let t0 = Instant::now();
    sock.connect_timeout(&to.into(), LB_TIMEOUT)?;
    let connect_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let mut s: TcpStream = sock.into();
    let deadline = Instant::now() + LB_TIMEOUT;
    s.set_write_timeout(Some(LB_TIMEOUT))?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf)? {
            0 => break,
            n => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out);
    let code = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    let total = t0.elapsed().as_secs_f64() * 1000.0;
    if total > 50.0 && std::env::var_os("FLOOD_DEBUG").is_some() {
        eprintln!("slow /health: connect {connect_ms:.1} ms, answer {total:.1} ms");
    }
    Ok((code, body))
}
