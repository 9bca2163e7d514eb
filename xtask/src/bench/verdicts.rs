//! Section 6 of the bench: verdicts under load that must never 503, against real Ruby (Debian's
//! Puma) and a real PostgreSQL, with the integration tests' harness (`health-agent-tests`).
//!
//! a. A busy pool: Puma with 2 threads, every request sleeping 3 s, 8 clients. Answers still go
//!    out, so the backend is `slow`: 200, never a 503, never a restart.
//! b. A database outage: the path from the app to its database freezes (a proxy stopped with
//!    SIGSTOP: connections complete, nothing comes back). The app's threads all wait on it:
//!    `waiting`, 200 `infrastructure_issue`, never a 503, never a restart.
//!
//! Missed targets are reported (✓/✗ in the tables) and their timelines printed; only a harness
//! failure (a server that does not start, a load that never got through) fails the bench.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use health_agent_tests::{
    free_port, get, load::poll_once, timeline, HealthSample, Load, LoadStats, Postgres, Puma,
    PumaOptions,
};

use crate::live::Proc;

/// `/health` is polled this often, as the verdict tests do.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// A [`Load`] stops by itself after `health_agent_tests::load::MAX_RUN` (180 s): longer runs
/// are made of segments this long, a fresh load each.
const LOAD_SEGMENT: Duration = Duration::from_secs(150);

/// The harness reports failures by panicking (it was written for tests): turn a panic into
/// an error that names what was being done. The guards it holds are dropped on the way out.
fn harness<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into());
        anyhow!("{what}: {msg}")
    })
}

/// `tests/src/bin/tcp-proxy.rs` from a free loopback port to `127.0.0.1:to`, frozen with
/// SIGSTOP: connections still complete and bytes are still ACKed by the kernel, but nothing
/// gets through. (`health_agent_tests::TcpProxy` finds its binary next to a test executable,
/// which this is not; the bench builds it into target/release.)
struct FreezableProxy {
    child: Proc,
    port: u16,
}

impl FreezableProxy {
    fn start(bin: &Path, to: u16) -> Result<Self> {
        for _ in 0..5 {
            let port = free_port();
            let mut child = Proc(
                Command::new(bin)
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .args(["--to", &format!("127.0.0.1:{to}")])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("starting {}", bin.display()))?,
            );
            // One line once bound, or EOF when it could not bind (the port was taken).
            let mut line = String::new();
            if let Some(out) = child.0.stdout.take() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            if line.starts_with("listening on") {
                return Ok(Self { child, port });
            }
        }
        bail!("tcp-proxy did not start on 5 tries")
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling a process this bench started.
        unsafe { libc::kill(self.child.0.id() as i32, sig) };
    }
}

/// The agent with `env` added to its environment, logging at info (the log is kept in the
/// bench's directory and quoted when something goes wrong).
fn start_agent(
    bin: &Path,
    config: &Path,
    log: &Path,
    port: u16,
    env: &[(&str, &str)],
) -> Result<Proc> {
    let child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("serve")
        .envs(env.iter().copied())
        .env("HEALTH_AGENT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut agent = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !get(port, "/livez").is_ok_and(|(c, _)| c == 200) {
        if let Ok(Some(status)) = agent.0.try_wait() {
            bail!(
                "the agent exited ({status}): {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("the agent did not answer /livez on 127.0.0.1:{port}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(agent)
}

/// Counts the agent's restarts: `web.restart_command` appends a line to a file and exits 0.
struct Restarts(PathBuf);

impl Restarts {
    fn command(&self) -> String {
        format!("echo restart >> '{}'", self.0.display())
    }

    fn count(&self) -> usize {
        fs::read_to_string(&self.0).map_or(0, |t| t.lines().count())
    }
}

/// Agent defaults but for: no boot grace, the web check on `web_port` probing `/up`, a
/// restart command that only counts, and `extra` TOML appended (tables other than these).
fn agent_config(port: u16, web_port: u16, restarts: &Restarts, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
         [web]\nport = {web_port}\nprobe_path = \"/up\"\nrestart_command = {:?}\n\n{extra}",
        restarts.command()
    )
}

/// Every `/health` answer, polled every 200 ms on its own thread for as long as it runs
/// (`health_agent_tests::HealthPoller` stops by itself after 180 s; the soak runs 300 s).
struct Poller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<HealthSample>>>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
}

impl Poller {
    fn start(port: u16) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (st, sa) = (stop.clone(), samples.clone());
        let thread = thread::spawn(move || {
            let mut next = started;
            while !st.load(Ordering::SeqCst) {
                let sample = poll_once(port, started);
                if let Ok(mut v) = sa.lock() {
                    v.push(sample);
                }
                next += POLL_EVERY;
                let now = Instant::now();
                if next > now {
                    thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        });
        Self {
            stop,
            samples,
            thread: Some(thread),
            started,
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn samples(&self) -> Vec<HealthSample> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits until an answer from now on satisfies `pred`; the error carries the timeline.
    fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
    ) -> Result<HealthSample> {
        let from = self.elapsed();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.samples().into_iter().find(|s| s.at >= from && pred(s)) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what}; /health answers:\n{}",
                    timeline(&self.samples())
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) -> Vec<HealthSample> {
        self.halt();
        self.samples()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.halt();
    }
}

fn heal_attempts(samples: &[HealthSample]) -> u64 {
    samples
        .iter()
        .filter_map(|s| s.body["details"]["heal"]["total_attempts"].as_u64())
        .max()
        .unwrap_or(0)
}

/// "200 slow: 1480, 200 up: 12" — answers by (code, webserver verdict), most frequent first.
fn by_verdict<'a>(samples: impl IntoIterator<Item = &'a HealthSample>) -> String {
    let mut counts = BTreeMap::<(u16, String), u64>::new();
    for s in samples {
        let key = if s.error.is_some() {
            (0, "no answer".to_string())
        } else {
            (s.code, s.webserver.clone())
        };
        *counts.entry(key).or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|((code, verdict), n)| {
            if *code == 0 {
                format!("{verdict}: {n}")
            } else {
                format!("{code} {verdict}: {n}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What must not happen once the agent has said `healthy` for the first time (at `from`): 503
/// answers, and polls it did not answer. The 503s before it are the agent's start (`booting`
/// until its first probe of the backend came back), counted apart.
struct Failures {
    n503: usize,
    no_answer: usize,
    booting: usize,
}

impl Failures {
    fn of(samples: &[HealthSample], from: Duration) -> Self {
        let after = || samples.iter().filter(move |s| s.at >= from);
        Self {
            n503: after().filter(|s| s.code == 503).count(),
            no_answer: after().filter(|s| s.error.is_some()).count(),
            booting: samples
                .iter()
                .filter(|s| s.at < from && s.code == 503)
                .count(),
        }
    }

    /// The table row.
    fn row(&self) -> String {
        let mut notes = Vec::new();
        if self.no_answer > 0 {
            notes.push(format!("plus {} polls without an answer", self.no_answer));
        }
        if self.booting > 0 {
            notes.push(format!(
                "not counted: {} × 503 `booting` while the agent's first probe was in flight",
                self.booting
            ));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        format!(
            "| 503 answers from the first `healthy` on{notes} | **{}** | 0 {} |",
            self.n503,
            check(self.n503 == 0 && self.no_answer == 0)
        )
    }
}

/// The 503 answers after `from`, each with its verdict and `details.web.detail`, for the
/// printed report.
fn describe_503s(samples: &[HealthSample], from: Duration) -> String {
    let mut out = String::new();
    for s in samples.iter().filter(|s| s.at >= from && s.code == 503) {
        let _ = writeln!(
            out,
            "  {s}\n    web.detail: {}\n    reasons: {}",
            s.web()["detail"].as_str().unwrap_or("-"),
            s.body["reasons"]
        );
    }
    out
}

/// The run as stretches of one verdict, each with the `details.web.detail` and the reasons of
/// its first answer: why the agent said what it said.
fn stretches(samples: &[HealthSample]) -> String {
    let key = |s: &HealthSample| {
        (
            s.code,
            s.status.clone(),
            s.webserver.clone(),
            s.database.clone(),
            s.recommendation.clone(),
        )
    };
    let mut out = String::new();
    let mut last = None;
    for s in samples {
        if last.as_ref() != Some(&key(s)) {
            let _ = writeln!(
                out,
                "  t={:6.1}s  {} {} webserver={}: {}\n             reasons: {}",
                s.at.as_secs_f64(),
                s.code,
                s.status,
                s.webserver,
                s.web()["detail"].as_str().unwrap_or("-"),
                s.body["reasons"]
            );
            last = Some(key(s));
        }
    }
    out
}

fn healthy(s: &HealthSample) -> bool {
    s.code == 200 && s.status == "healthy"
}

/// When the answers after `from` turned `healthy` for the rest of the run: the first of the
/// unbroken healthy ones at its end. None when the last answer is not healthy.
fn settled(samples: &[HealthSample], from: Duration) -> Option<Duration> {
    let after: Vec<&HealthSample> = samples.iter().filter(|s| s.at >= from).collect();
    let unhealthy_tail = after.iter().rposition(|s| !healthy(s));
    let first = unhealthy_tail.map_or(0, |i| i + 1);
    after.get(first).map(|s| s.at)
}

fn merge(total: &mut LoadStats, s: LoadStats) {
    for (code, n) in s.by_status {
        *total.by_status.entry(code).or_default() += n;
    }
    total.timeouts += s.timeouts;
    total.errors += s.errors;
    total.connections += s.connections;
    total.reconnects += s.reconnects;
    total.server_closes += s.server_closes;
    total.max_latency = total.max_latency.max(s.max_latency);
    total.elapsed += s.elapsed;
    if s.last_error.is_some() {
        total.last_error = s.last_error;
    }
}

/// "120×200, 0 timeouts, 0 errors, slowest 11.9 s" — what the clients got.
fn answers(s: &LoadStats) -> String {
    let slowest = if s.max_latency < Duration::from_secs(1) {
        format!("{} ms", s.max_latency.as_millis())
    } else {
        format!("{:.1} s", s.max_latency.as_secs_f64())
    };
    format!("{}, slowest {slowest}", counts(s))
}

/// "120×200, 0 timeouts, 0 errors".
fn counts(s: &LoadStats) -> String {
    let mut out = String::new();
    for (code, n) in &s.by_status {
        let _ = write!(out, "{n}×{code}, ");
    }
    if s.by_status.is_empty() {
        out.push_str("no answers, ");
    }
    let _ = write!(out, "{} timeouts, {} errors", s.timeouts, s.errors);
    out
}

/// The difference of two snapshots of one load: what it got between them (counts only: the
/// slowest answer is not known per stretch).
fn between(earlier: &LoadStats, later: &LoadStats) -> LoadStats {
    let mut d = later.clone();
    for (code, n) in &earlier.by_status {
        if let Some(m) = d.by_status.get_mut(code) {
            *m = m.saturating_sub(*n);
        }
    }
    d.by_status.retain(|_, n| *n > 0);
    d.timeouts = d.timeouts.saturating_sub(earlier.timeouts);
    d.errors = d.errors.saturating_sub(earlier.errors);
    d.connections = d.connections.saturating_sub(earlier.connections);
    d
}

fn check(ok: bool) -> &'static str {
    if ok {
        "✓"
    } else {
        "✗"
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs 6a and 6b; returns the section's Markdown.
pub fn run(agent_bin: &Path, proxy_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let mut md = String::from("\n## 6. Verdicts under load that must never 503\n\n");
    md.push_str("Real Ruby: Debian's Puma 5.6 in single mode running a small Rack app (the integration tests' `health-agent-tests` harness), a private PostgreSQL 15. The agent runs its defaults but for `checks.boot_grace = 0s`, `web.probe_path = \"/up\"` and a `web.restart_command` that only appends a line to a file: restarts are counted from that file and from `details.heal.total_attempts`. `/health` is polled every 200 ms for the whole run; every answer counts.\n");
    md.push_str(&busy_pool(agent_bin, dir, quick)?);
    md.push_str(&database_outage(agent_bin, proxy_bin, dir, quick)?);
    Ok(md)
}

/// 6a: a Puma whose every thread sleeps 3 s per request, with more clients than threads.
fn busy_pool(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let soak = Duration::from_secs(if quick { 30 } else { 300 });
    let puma = harness("starting Puma (2 threads)", || {
        Puma::start(PumaOptions {
            threads: 2,
            slow_seconds: 3.0,
            ..Default::default()
        })
    })?;
    let restarts = Restarts(dir.join("restarts-busy"));
    let aport = free_port();
    let cfg = dir.join("agent-busy.toml");
    fs::write(&cfg, agent_config(aport, puma.port, &restarts, ""))?;
    let log = dir.join("agent-busy.log");
    let agent = start_agent(agent_bin, &cfg, &log, aport, &[])?;
    let poller = Poller::start(aport);
    let first_healthy = poller
        .wait_for(
            Duration::from_secs(30),
            "a healthy backend before the load",
            |s| s.code == 200 && s.status == "healthy",
        )?
        .at;

    // Each request waits for one of 2 threads behind up to 7 others and the probes, ~12 s on
    // average; new connections longest (Puma serves keep-alive ones first), up to a minute.
    let timeout = Duration::from_secs(60);
    let load_from = poller.elapsed();
    let started = Instant::now();
    let (mut fresh, mut kept) = (LoadStats::default(), LoadStats::default());
    let mut max_queue = 0;
    while started.elapsed() < soak {
        let segment_end = Instant::now() + LOAD_SEGMENT.min(soak.saturating_sub(started.elapsed()));
        let new_conns = Load::new_connections(puma.port, "/slow", 4, Duration::ZERO, timeout);
        let keep_alive = Load::keep_alive(puma.port, "/slow", 4, timeout);
        while Instant::now() < segment_end {
            max_queue = max_queue.max(puma.accept_queue().unwrap_or(0));
            thread::sleep(Duration::from_millis(250));
        }
        merge(&mut fresh, new_conns.stop());
        merge(&mut kept, keep_alive.stop());
    }
    let load_to = poller.elapsed();
    let samples = poller.stop();
    let attempts = heal_attempts(&samples);
    let restarted = restarts.count();
    drop(agent);
    drop(puma);

    let during: Vec<&HealthSample> = samples
        .iter()
        .filter(|s| s.at >= load_from && s.at <= load_to)
        .collect();
    let failures = Failures::of(&samples, first_healthy);
    let n503 = failures.n503;
    println!(
        "bench: busy pool {} s: /health {}; 503s {n503}; restarts {restarted} (heal attempts {attempts}); new-connection clients: {}; keep-alive clients: {}; accept queue up to {max_queue}",
        soak.as_secs(),
        by_verdict(during.iter().copied()),
        answers(&fresh),
        answers(&kept)
    );
    print!("{}{}", timeline(&samples), stretches(&samples));
    if n503 > 0 {
        println!(
            "bench: busy pool: 503 answers:\n{}agent log (tail):\n{}",
            describe_503s(&samples, first_healthy),
            tail(&log, 30)
        );
    }
    if fresh.count(200) + kept.count(200) == 0 {
        bail!(
            "the busy-pool load got no answers at all (a harness or Puma problem): new connections: {fresh}; keep-alive: {kept}"
        );
    }

    let mut md = String::from("\n### 6a. A busy pool is `slow`, not hung\n\n");
    let _ = writeln!(
        md,
        "Puma with 2 threads; `GET /slow` sleeps 3 s. 4 clients open a new connection per request and 4 keep one keep-alive connection each, all looping on `/slow` back to back (60 s client timeout) for {} s. Every thread is always busy, Puma stops accepting, connections (the agent's probe among them) wait seconds in the accept queue — and answers keep going out. A new instance would be just as busy. (Puma serves up to 10 requests of a keep-alive connection in a row before it lets a waiting new connection in, so the new-connection clients get few answers and may time out.)\n",
        soak.as_secs()
    );
    md.push_str("| measure | value | target |\n|---|---|---|\n");
    let _ = writeln!(
        md,
        "| `/health` answers during the load, by code and `checks.webserver` | {} | — |",
        by_verdict(during.iter().copied())
    );
    let _ = writeln!(md, "{}", failures.row());
    let _ = writeln!(
        md,
        "| restarts: `restart_command` runs / `details.heal.total_attempts` | **{restarted} / {attempts}** | 0 {} |",
        check(restarted == 0 && attempts == 0)
    );
    let _ = writeln!(
        md,
        "| load: new-connection clients | {} | — |",
        answers(&fresh)
    );
    let _ = writeln!(
        md,
        "| load: keep-alive clients | {} ({} closed by Puma to let a queued connection in) | — |",
        answers(&kept),
        kept.server_closes
    );
    let _ = writeln!(
        md,
        "| deepest accept queue (`/proc/net/tcp`, every 250 ms) | {max_queue} | — |"
    );
    Ok(md)
}

/// 6b: the path from the app to its database freezes for a while, then thaws.
fn database_outage(agent_bin: &Path, proxy_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let healthy_for = Duration::from_secs(20);
    let frozen_for = Duration::from_secs(if quick { 20 } else { 60 });
    let after_thaw = Duration::from_secs(20);
    // The run goes on past `after_thaw` until every answer has been `healthy` for
    // `settled_for`, at most `thaw_limit` after the thaw.
    let settled_for = Duration::from_secs(5);
    let thaw_limit = Duration::from_secs(60);

    let pg = harness("starting a private PostgreSQL", Postgres::start)?;
    let proxy = FreezableProxy::start(proxy_bin, pg.port)?;
    let endpoint = format!("127.0.0.1:{}", proxy.port);
    let puma = harness(
        "starting Puma (2 threads, /db and /up through the proxy)",
        || {
            Puma::start(PumaOptions {
                threads: 2,
                db_url: Some(format!(
                    "postgres://postgres:{}@{endpoint}/postgres",
                    pg.password
                )),
                up_uses_db: true,
                ..Default::default()
            })
        },
    )?;
    let restarts = Restarts(dir.join("restarts-db"));
    let aport = free_port();
    let cfg = dir.join("agent-db.toml");
    fs::write(
        &cfg,
        agent_config(
            aport,
            puma.port,
            &restarts,
            &format!("[database]\nurl = \"postgres://postgres@{endpoint}/postgres\"\n"),
        ),
    )?;
    let log = dir.join("agent-db.log");
    let agent = start_agent(
        agent_bin,
        &cfg,
        &log,
        aport,
        &[("PGPASSWORD", pg.password.as_str())],
    )?;
    let poller = Poller::start(aport);
    let first_healthy = poller
        .wait_for(
            Duration::from_secs(30),
            "healthy with the database connected",
            |s| s.code == 200 && s.status == "healthy" && s.database == "connected",
        )?
        .at;
    // About 16 requests a second, each on a new connection, each a fresh database connection.
    let load = Load::new_connections(
        puma.port,
        "/db",
        4,
        Duration::from_millis(250),
        Duration::from_secs(10),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while load.stats().count(200) < 10 {
        if Instant::now() > deadline {
            bail!(
                "/db never answered through the proxy (a harness problem): {}\npuma log:\n{}",
                load.stats(),
                puma.logs()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let load_from = poller.elapsed();
    let stats_start = load.stats();
    thread::sleep(healthy_for);

    proxy.signal(libc::SIGSTOP);
    let frozen = poller.elapsed();
    let stats_frozen = load.stats();
    thread::sleep(frozen_for);
    proxy.signal(libc::SIGCONT);
    let thawed = poller.elapsed();
    let stats_thawed = load.stats();
    thread::sleep(after_thaw);
    // Not settled by then is a result (reported below), not a harness error.
    while poller.elapsed() < thawed + thaw_limit {
        let samples = poller.samples();
        if settled(&samples, thawed).is_some_and(|at| poller.elapsed() >= at + settled_for) {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let stats_end = load.stop();
    let samples = poller.stop();
    let attempts = heal_attempts(&samples);
    let restarted = restarts.count();
    drop(agent);
    drop(puma);
    drop(proxy);
    drop(pg);

    let phase = |from: Duration, to: Option<Duration>| {
        samples
            .iter()
            .filter(move |s| s.at >= from && to.is_none_or(|t| s.at < t))
    };
    let failures = Failures::of(&samples, first_healthy);
    let n503 = failures.n503;
    let secs_after = |s: &HealthSample, from: Duration| s.at.saturating_sub(from).as_secs_f64();
    let infra = phase(frozen, Some(thawed))
        .find(|s| s.recommendation == "infrastructure_issue")
        .map(|s| secs_after(s, frozen));
    let waiting = phase(frozen, Some(thawed)).find(|s| s.webserver == "waiting");
    let mut endpoints = Vec::<String>::new();
    for s in phase(frozen, Some(thawed)) {
        for d in s.web()["dependencies"].as_array().into_iter().flatten() {
            if let Some(e) = d["endpoint"].as_str() {
                if !endpoints.iter().any(|x| x == e) {
                    endpoints.push(e.to_string());
                }
            }
        }
    }
    let healthy_again = phase(thawed, None)
        .find(|s| healthy(s))
        .map(|s| secs_after(s, thawed));
    let settled_at = settled(&samples, thawed).map(|at| at.saturating_sub(thawed).as_secs_f64());
    let changes = phase(thawed, None)
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| {
            (w[0].code, &w[0].status, &w[0].webserver) != (w[1].code, &w[1].status, &w[1].webserver)
        })
        .count();

    println!(
        "bench: database outage: before {}; frozen {}; after the thaw {}; 503s {n503}; restarts {restarted} (heal attempts {attempts}); freeze → infrastructure_issue {infra:?} s; dependencies named {endpoints:?} (proxy {endpoint}); thaw → healthy {healthy_again:?} s, for good {settled_at:?} s ({changes} changes of verdict after the thaw)",
        by_verdict(phase(load_from, Some(frozen))),
        by_verdict(phase(frozen, Some(thawed))),
        by_verdict(phase(thawed, None)),
    );
    println!(
        "bench: database outage: froze at t={:.1}s, thawed at t={:.1}s",
        frozen.as_secs_f64(),
        thawed.as_secs_f64()
    );
    if let Some(w) = waiting {
        println!(
            "bench: first `waiting` ({:.1} s after the freeze): {}",
            secs_after(w, frozen),
            w.web()["detail"].as_str().unwrap_or("-")
        );
    }
    print!("{}{}", timeline(&samples), stretches(&samples));
    if n503 > 0 {
        println!(
            "bench: database outage: 503 answers:\n{}agent log (tail):\n{}",
            describe_503s(&samples, first_healthy),
            tail(&log, 30)
        );
    }

    let fmt_secs = |v: Option<f64>| v.map_or("never".to_string(), |s| format!("{s:.1} s"));
    let mut md = String::from(
        "\n### 6b. A frozen path to the database is `infrastructure_issue`, not a 503\n\n",
    );
    let _ = writeln!(
        md,
        "A private PostgreSQL behind `tcp-proxy`; Puma with 2 threads whose `/db` and `/up` open a fresh connection through the proxy and run `SELECT 1`; the agent's `[database] url` goes through the proxy too (password from `PGPASSWORD`; the check at its defaults, `interval = 30s`, `timeout = 5s`, `fail_after = 2`, which the agent asks again sooner while the backend looks stuck or the database is down). 4 clients request `/db` on a new connection every 250 ms each (10 s client timeout). Healthy for {} s, then the proxy is frozen (SIGSTOP: connections complete, nothing comes back, as on a path that drops packets) for {} s, then thawed; the run goes on for {} s and until every answer has been `healthy` for {} s, at most {} s after the thaw. Every instance shares that database: a restart or a new instance fixes nothing.\n",
        healthy_for.as_secs(),
        frozen_for.as_secs(),
        after_thaw.as_secs(),
        settled_for.as_secs(),
        thaw_limit.as_secs()
    );
    md.push_str("| measure | value | target |\n|---|---|---|\n");
    for (label, from, to, (before, after)) in [
        (
            format!("before the freeze ({} s)", healthy_for.as_secs()),
            load_from,
            Some(frozen),
            (&stats_start, &stats_frozen),
        ),
        (
            format!("while frozen ({} s)", frozen_for.as_secs()),
            frozen,
            Some(thawed),
            (&stats_frozen, &stats_thawed),
        ),
        (
            "after the thaw".to_string(),
            thawed,
            None,
            (&stats_thawed, &stats_end),
        ),
    ] {
        let _ = writeln!(
            md,
            "| {label}: `/health` answers by code and `checks.webserver`; `/db` answers | {}; `/db`: {} | — |",
            by_verdict(phase(from, to)),
            counts(&between(before, after))
        );
    }
    let _ = writeln!(md, "{}", failures.row());
    let _ = writeln!(
        md,
        "| restarts: `restart_command` runs / `details.heal.total_attempts` | **{restarted} / {attempts}** | 0 {} |",
        check(restarted == 0 && attempts == 0)
    );
    let _ = writeln!(
        md,
        "| freeze → first `infrastructure_issue` | **{}** | ≤ 15 s {} |",
        fmt_secs(infra),
        check(infra.is_some_and(|s| s <= 15.0))
    );
    let named = if endpoints.is_empty() {
        "none".to_string()
    } else {
        endpoints
            .iter()
            .map(|e| {
                if *e == endpoint {
                    format!("`{e}` (the proxy)")
                } else {
                    format!("`{e}`")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "| endpoint named in `details.web.dependencies` while frozen | {named} | the proxy {} |",
        check(endpoints.contains(&endpoint))
    );
    let _ = writeln!(
        md,
        "| thaw → first `healthy` | {} | — |",
        fmt_secs(healthy_again)
    );
    let _ = writeln!(
        md,
        "| thaw → `healthy` for good (every later answer of the run), and the changes of `status`/`checks.webserver` after the thaw | {}, {changes} changes | — |",
        fmt_secs(settled_at)
    );
    Ok(md)
}
