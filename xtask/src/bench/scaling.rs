//! Section 9: the scaling signal against CPU. A real Puma (4 threads) in two variants —
//! I/O-bound (`/io`: sleep 50 ms, then `SELECT 1` on its thread's own database connection)
//! and CPU-bound (`/cpu`: 20 ms of computation) — under open-loop Poisson load at fractions of
//! its measured capacity; the agent's saturation S beside the true utilisation (offered /
//! capacity) and the host's CPU. Then the I/O variant's database path freezes at 0.5× (S must
//! hold, nothing be published, the recommendation be `infrastructure_issue`), and last a
//! replay of target tracking (target 60 %) on S and on CPU.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use health_agent_tests::{free_port, Load, OpenLoop, Postgres, Puma, PumaOptions, TcpProxy};
use serde_json::Value;

use super::harness;
use crate::live::{agent_command, health, spawn_agent, Proc};

const LEVELS: [f64; 6] = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0];
const THREADS: usize = 4;
/// Target tracking's target (percent of S, or CPU percent).
const TARGET: f64 = 0.6;
/// The replayed fleet: this many instances, each at the phase's load.
const FLEET: f64 = 4.0;

/// One load level's row.
struct Row {
    level: String,
    /// The load asked, in multiples of the capacity.
    multiple: f64,
    /// Offered / capacity, from the requests actually sent.
    true_util: f64,
    s: Option<f64>,
    web: Option<f64>,
    backend_cpu: Option<f64>,
    largest: String,
    host_cpu: f64,
    puma_cpu: f64,
    recommendation: String,
    withheld: Option<String>,
}

/// Busy and total jiffies of the whole host, from /proc/stat.
fn host_jiffies() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// CPU seconds of one process (utime + stime).
fn proc_cpu(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// Host CPU % and Puma's CPU as % of the host, over a span.
struct CpuSpan {
    host: (u64, u64),
    puma: f64,
    at: Instant,
}

impl CpuSpan {
    fn start(puma: u32) -> Self {
        Self {
            host: host_jiffies(),
            puma: proc_cpu(puma),
            at: Instant::now(),
        }
    }

    fn end(&self, puma: u32) -> (f64, f64) {
        let (b, t) = host_jiffies();
        let host = (b - self.host.0) as f64 * 100.0 / (t - self.host.1).max(1) as f64;
        let cores = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let puma = (proc_cpu(puma) - self.puma) / secs / cores * 100.0;
        (host, puma)
    }
}

fn sat(port: u16) -> (Option<f64>, Value, String) {
    match health(port) {
        Ok((_, b)) => (
            b["details"]["saturation"]["ratio"].as_f64(),
            b["details"]["saturation"].clone(),
            b["recommendation"].as_str().unwrap_or("?").to_string(),
        ),
        Err(_) => (None, Value::Null, "?".into()),
    }
}

struct Variant {
    name: &'static str,
    path: &'static str,
    workers: u32,
}

/// Closed-loop clients back to back: the most this Puma answers per second.
fn capacity(puma: &Puma, path: &str, secs: u64) -> Result<f64> {
    let load = Load::new_connections(puma.port, path, 16, Duration::ZERO, Duration::from_secs(30));
    thread::sleep(Duration::from_secs(3));
    let a = load.stats();
    thread::sleep(Duration::from_secs(secs));
    let b = load.stop();
    let rate = (b.answers() - a.answers()) as f64 / (b.elapsed - a.elapsed).as_secs_f64();
    if rate < 5.0 {
        bail!("Puma answered only {rate:.1}/s flat out ({b}): a harness problem");
    }
    Ok(rate)
}

/// One level: open-loop load at `rate` for the window and a margin; the figures over the
/// window's span at the end.
fn level(agent: u16, puma: &Puma, path: &str, rate: f64, cap: f64, window: u64, seed: u64) -> Row {
    let load = OpenLoop::start(puma.port, path, rate, seed, Duration::from_secs(60));
    thread::sleep(Duration::from_secs(5));
    let from = load.stats();
    let cpu = CpuSpan::start(puma.pid());
    thread::sleep(Duration::from_secs(window));
    let (host, puma_cpu) = cpu.end(puma.pid());
    let (s, d, recommendation) = sat(agent);
    let to = load.stop();
    let sent = (to.sent - from.sent) as f64 / (to.elapsed - from.elapsed).as_secs_f64();
    Row {
        level: String::new(),
        multiple: rate / cap,
        true_util: sent / cap,
        s,
        web: d["parts"]["web"].as_f64(),
        backend_cpu: d["parts"]["backend_cpu"].as_f64(),
        largest: d["largest"].as_str().unwrap_or("-").to_string(),
        host_cpu: host,
        puma_cpu,
        recommendation,
        withheld: d["withheld"].as_str().map(String::from),
    }
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("withheld".into(), |v| format!("{v:.2}"))
}

/// Instances target tracking asks for, from `FLEET` at a per-instance metric.
fn asks(metric: Option<f64>) -> String {
    match metric {
        None => format!("{FLEET:.0} (no data: holds)"),
        Some(m) => format!("{:.0}", (FLEET * m / TARGET).ceil().max(1.0)),
    }
}

struct Outage {
    before: Option<f64>,
    max_during: Option<f64>,
    polls: usize,
    withheld: usize,
    /// Answers from the first `infrastructure_issue` on, and how many of them said it.
    after_named: usize,
    infra: usize,
    first_infra_s: Option<f64>,
    host_cpu: f64,
    puma_cpu: f64,
    first_withheld_s: Option<f64>,
    reason: Option<String>,
}

#[allow(clippy::too_many_arguments)]
fn outage(
    agent: u16,
    puma: &Puma,
    proxy: &TcpProxy,
    path: &str,
    rate: f64,
    window: u64,
    frozen_for: u64,
) -> Outage {
    let load = OpenLoop::start(puma.port, path, rate, 77, Duration::from_secs(120));
    thread::sleep(Duration::from_secs(window + 5));
    let (before, _, _) = sat(agent);
    let cpu = CpuSpan::start(puma.pid());
    proxy.freeze();
    let t0 = Instant::now();
    let mut o = Outage {
        before,
        max_during: None,
        polls: 0,
        withheld: 0,
        after_named: 0,
        infra: 0,
        first_infra_s: None,
        host_cpu: 0.0,
        puma_cpu: 0.0,
        first_withheld_s: None,
        reason: None,
    };
    while t0.elapsed() < Duration::from_secs(frozen_for) {
        let (s, d, rec) = sat(agent);
        o.polls += 1;
        match s {
            Some(v) => o.max_during = Some(o.max_during.map_or(v, |m: f64| m.max(v))),
            None => {
                o.withheld += 1;
                o.first_withheld_s.get_or_insert(t0.elapsed().as_secs_f64());
                if o.reason.is_none() {
                    o.reason = d["withheld"].as_str().map(String::from);
                }
            }
        }
        if rec == "infrastructure_issue" {
            o.first_infra_s.get_or_insert(t0.elapsed().as_secs_f64());
        }
        if o.first_infra_s.is_some() {
            o.after_named += 1;
            if rec == "infrastructure_issue" {
                o.infra += 1;
            }
        }
        thread::sleep(Duration::from_millis(500));
    }
    (o.host_cpu, o.puma_cpu) = cpu.end(puma.pid());
    proxy.thaw();
    drop(load);
    o
}

pub(super) fn run(agent_bin: &Path, proxy_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    fs::create_dir_all(dir)?;
    let window: u64 = if quick { 10 } else { 20 };
    let frozen_for: u64 = if quick { 20 } else { 40 };
    let pg = harness("starting a private PostgreSQL", Postgres::start)?;
    let proxy = harness("starting tcp-proxy", || {
        TcpProxy::start_with(proxy_bin, pg.port)
    })?;
    let db = format!("127.0.0.1:{}", proxy.port);
    let variants = [
        Variant {
            name: "I/O-bound (sleep 50 ms + SELECT 1)",
            path: "/io",
            workers: 0,
        },
        Variant {
            name: "CPU-bound (20 ms of computation)",
            path: "/cpu",
            workers: THREADS as u32,
        },
    ];
    let mut md = String::from("\n## 9. The scaling signal against CPU\n\n");
    let _ = writeln!(
        md,
        "Debian's Puma 5.6, single mode, {THREADS} threads, listen backlog 4096, under open-loop Poisson load (new connection per request, arrivals on their own clock whatever Puma does) at fractions of its capacity, measured first flat out (16 closed-loop clients). Each level runs {} s; S is the agent's `details.saturation.ratio` at its end (`scaling.window = \"{window}s\"`), host and Puma CPU are over the last {window} s. True utilisation = requests sent per second / capacity. The I/O variant leaves `web.workers = 0` (the agent learns 4 from the accept queue while the capacity is measured); the CPU variant sets `web.workers = 4`. **This machine's 2 cores are shared with other builds while the bench runs**: host CPU (and the host-CPU part of S) includes them; the `web` part and Puma's own CPU do not. The lead's full run is the reference.\n",
        window + 5
    );
    let mut outage_seen: Option<Outage> = None;
    let mut outage_md = String::new();
    for (vi, v) in variants.iter().enumerate() {
        let puma = harness("starting Puma", || {
            Puma::start(PumaOptions {
                threads: THREADS,
                backlog: Some(4096),
                db_url: (v.path == "/io")
                    .then(|| format!("postgres://postgres:{}@{db}/postgres", pg.password)),
                ..Default::default()
            })
        })?;
        let aport = free_port();
        let cfg = dir.join(format!("agent-scaling-{vi}.toml"));
        let database = if v.path == "/io" {
            format!("[database]\nurl = \"postgres://postgres@{db}/postgres\"\ninterval = \"5s\"\n")
        } else {
            String::new()
        };
        fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:{aport}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
                 [web]\nport = {}\nworkers = {}\n\n[scaling]\nwindow = \"{window}s\"\n\n{database}",
                puma.port, v.workers
            ),
        )?;
        let log = dir.join(format!("agent-scaling-{vi}.log"));
        let mut cmd = agent_command(agent_bin, &cfg, &log, "info")?;
        cmd.env("PGPASSWORD", &pg.password);
        let agent: Proc = spawn_agent(&mut cmd, &log, aport, Duration::from_secs(20))?;
        let cap = capacity(&puma, v.path, if quick { 6 } else { 12 })?;
        println!("bench: scaling {}: capacity {cap:.1}/s", v.name);
        let mut rows = Vec::new();
        for (i, m) in LEVELS.iter().enumerate() {
            if v.path == "/io" && *m == 1.5 {
                // The outage at 0.5× goes before the overloads, whose backlog takes a while
                // to drain.
                let o = outage(aport, &puma, &proxy, v.path, 0.5 * cap, window, frozen_for);
                outage_md = outage_table(&o, frozen_for);
                outage_seen = Some(o);
            }
            let mut r = level(aport, &puma, v.path, m * cap, cap, window, 1 + i as u64);
            r.level = format!("{m}×");
            r.multiple = *m;
            println!(
                "bench: scaling {} at {m}×: true {:.2}, S {:?} (web {:?}, largest {}), host CPU {:.0} %, Puma CPU {:.0} %",
                v.name, r.true_util, r.s, r.web, r.largest, r.host_cpu, r.puma_cpu
            );
            rows.push(r);
        }
        let (_, d, _) = sat(aport);
        drop(agent);
        drop(puma);
        md.push_str(&variant_table(v, cap, &rows, &d));
        let outage = outage_seen.as_ref().filter(|_| v.path == "/io");
        md.push_str(&replay_table(v, &rows, outage));
    }
    md.push_str(&outage_md);
    md.push_str(
        "Command: `cargo xtask bench --only scaling` (`--quick`: a 10-second window, a 20-second outage).\n",
    );
    drop(proxy);
    drop(pg);
    Ok(md)
}

fn variant_table(v: &Variant, cap: f64, rows: &[Row], last: &Value) -> String {
    let mut md = String::new();
    let io = v.path == "/io";
    let tol = if io { 0.15 } else { 0.2 };
    let _ = writeln!(
        md,
        "### {} — capacity {cap:.1} requests/s; capacity as the agent saw it: {}\n",
        v.name, last["capacity"]
    );
    md.push_str("| load | true utilisation | S | web part | backend CPU part | largest part | host CPU | Puma CPU | recommendation | S vs true | the app's parts (web, backend CPU) vs true |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    // The same judgement on S and on the larger of the two parts this Puma alone moves: on a
    // machine shared with other work the host-CPU part (and so S) carries that work too.
    let judge = |s: Option<f64>, r: &Row| match s {
        Some(s) if r.multiple <= 1.0 => {
            if (s - r.true_util).abs() <= tol {
                format!("✓ within ±{tol}")
            } else {
                format!("✗ off by {:+.2}", s - r.true_util)
            }
        }
        Some(s) if io && r.multiple == 1.5 => {
            if s >= 1.3 {
                "✓ ≥ 1.3".into()
            } else {
                "✗ below 1.3".into()
            }
        }
        Some(_) => "—".into(),
        None => format!("withheld: {}", r.withheld.as_deref().unwrap_or("?")),
    };
    let (mut prev, mut prev_app): (Option<f64>, Option<f64>) = (None, None);
    for r in rows {
        let app = match (r.web, r.backend_cpu) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let rising = |p: Option<f64>, s: Option<f64>| match (p, s) {
            (Some(p), Some(s)) if s <= p => " ✗ not above the step before",
            _ => "",
        };
        let _ = writeln!(
            md,
            "| {} | {:.2} | {} | {} | {} | {} | {:.0} % | {:.0} % | {} | {}{} | {}{} |",
            r.level,
            r.true_util,
            fmt_opt(r.s),
            r.web.map_or("-".into(), |w| format!("{w:.2}")),
            r.backend_cpu.map_or("-".into(), |w| format!("{w:.2}")),
            r.largest,
            r.host_cpu,
            r.puma_cpu,
            r.recommendation,
            judge(r.s, r),
            rising(prev, r.s),
            judge(app, r),
            rising(prev_app, app),
        );
        (prev, prev_app) = (r.s, app);
    }
    md.push('\n');
    md
}

fn replay_table(v: &Variant, rows: &[Row], outage: Option<&Outage>) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Target tracking replayed (target {:.0} %, a fleet of {FLEET:.0} instances each at the phase's load; desired = ceil({FLEET:.0} × metric / target)). \"CPU\" is Puma's own share of the host's cores — what `CPUUtilization` would read on an instance that runs only this app; \"needed\" brings true utilisation to the target.\n",
        TARGET * 100.0
    );
    md.push_str("| phase | needed | on S | on CPU |\n|---|---|---|---|\n");
    for r in rows {
        if r.level == "1.5×" {
            if let Some(o) = outage {
                let _ = writeln!(
                    md,
                    "| database outage at 0.5× | {} (a new instance fixes nothing) | {} | {} |",
                    FLEET,
                    if o.withheld > 0 && o.max_during.is_none() {
                        asks(None)
                    } else {
                        asks(o.max_during)
                    },
                    asks(Some(o.puma_cpu / 100.0))
                );
            }
        }
        let _ = writeln!(
            md,
            "| {} {} | {} | {} | {} |",
            v.path,
            r.level,
            asks(Some(r.true_util)),
            asks(r.s),
            asks(Some(r.puma_cpu / 100.0))
        );
    }
    md.push('\n');
    md
}

fn outage_table(o: &Outage, frozen_for: u64) -> String {
    let mut md = String::from(
        "### Dependency outage at 0.5× (I/O-bound; the app's database path frozen)\n\n",
    );
    let _ = writeln!(
        md,
        "The proxy between Puma and PostgreSQL is stopped (SIGSTOP) for {frozen_for} s while the open-loop load goes on: every thread waits in `SELECT 1`, connections pile up in the accept queue. `/health` polled every 0.5 s.\n"
    );
    md.push_str("| S before | highest S published during | answers withheld | first withheld after | `infrastructure_issue` from (then held in) | host CPU | Puma CPU | withheld because |\n|---|---|---|---|---|---|---|---|\n");
    let held_ok = match (o.before, o.max_during) {
        (Some(b), Some(m)) => {
            if m <= b + 0.1 {
                "✓".to_string()
            } else {
                format!("✗ {m:.2} > {b:.2} + 0.1")
            }
        }
        (_, None) => "✓ none published".into(),
        (None, Some(_)) => "?".into(),
    };
    let _ = writeln!(
        md,
        "| {} | {} {held_ok} | {}/{} | {} | {} ({}/{} {}) | {:.0} % | {:.0} % | {} |\n",
        fmt_opt(o.before),
        o.max_during.map_or("—".into(), |m| format!("{m:.2}")),
        o.withheld,
        o.polls,
        o.first_withheld_s
            .map_or("never ✗".into(), |s| format!("{s:.1} s")),
        o.first_infra_s
            .map_or("never ✗".into(), |s| format!("{s:.1} s")),
        o.infra,
        o.after_named,
        if o.after_named > 0 && o.infra == o.after_named {
            "✓"
        } else {
            "✗"
        },
        o.host_cpu,
        o.puma_cpu,
        o.reason.as_deref().unwrap_or("-")
    );
    md
}
