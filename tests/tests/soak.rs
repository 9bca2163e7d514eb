//! The soak: a month of an instance's churn replayed compressed against real parts, with the
//! agent's figures sampled throughout and every `/health` answer judged against the fault
//! injected at that moment. `HEALTH_AGENT_SOAK_MINUTES` sets the length (3 by default, what CI
//! runs); `cargo xtask soak --minutes N` runs it longer. The verdict fails on a figure that
//! grows after warm-up, on a wrong 503, on an alert lost or doubled, on a drain stuck on.
//!
//! One agent (A, on 127.0.0.2) watches a fixture backend under traffic, a private PostgreSQL,
//! a container on the host's Docker daemon (`[containers]`, restarted by A when killed),
//! a small tmpfs as its disk, its state file on another tmpfs, and sends alerts to Slack,
//! PagerDuty and webhook stand-ins. Its `[fleet]` peers are two real agents (B and C) and two
//! stand-in peers, one answering garbage and one too slow (after 180 s both stop accepting:
//! peers that do not answer at all).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use health_agent_tests::{
    docker, drain,
    fleet::{free_port_on_all, gauge, loopback, StubServer},
    require_root,
    soak::{self, Backend, Fault, Sampled, Series},
    undrain, web_config, Agent, Container, DrainInBackground, Fixture, HealthPoller, Load,
    LoadStats, Postgres, Receiver, Tmpfs,
};

/// The database role's password, which the soak changes and restores.
const DB_PASSWORD: &str = "app-secret-pw";

const MODE_OK: u8 = 0;
const MODE_FAIL: u8 = 1;
const MODE_STALL: u8 = 2;

/// An alert destination stand-in whose answers the soak switches: 2xx, 503, or 2xx after 1 s
/// (under the agent's 3 s timeout). It keeps the bodies it accepted.
struct Destination {
    name: &'static str,
    receiver: Receiver,
    accepted: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Destination {
    fn start(name: &'static str, ok: u16, mode: Arc<AtomicU8>) -> Self {
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let acc = accepted.clone();
        let receiver = Receiver::start(move |req, _| match mode.load(Ordering::SeqCst) {
            MODE_FAIL => (503, "{}".into()),
            m => {
                if m == MODE_STALL {
                    std::thread::sleep(Duration::from_secs(1));
                }
                if let Ok(mut a) = acc.lock() {
                    a.push(req.raw.clone());
                }
                (ok, "{\"status\":\"success\"}".into())
            }
        });
        Self {
            name,
            receiver,
            accepted,
        }
    }

    /// (accepted, distinct bodies).
    fn counts(&self) -> (usize, usize) {
        let a = self.accepted.lock().map(|a| a.clone()).unwrap_or_default();
        let mut distinct = a.clone();
        distinct.sort();
        distinct.dedup();
        (a.len(), distinct.len())
    }
}

struct Soak {
    backend: Backend,
    pg: Postgres,
    disk: Tmpfs,
    state: Tmpfs,
    a: Agent,
    b: Agent,
    b_extra: String,
    b_backend: Fixture,
    _c: (Agent, Fixture),
    poller: HealthPoller,
    mode: Arc<AtomicU8>,
    faults: Vec<Fault>,
    counts: BTreeMap<&'static str, u64>,
    hangs: (u64, u64),
    /// Peers killed, and those whose programs all left the kernel.
    peer_kills: (u64, u64),
    /// Peers restarted as systemd does, and those that exited 0 within 10 s of SIGTERM with
    /// every program released; what the others did.
    peer_stops: (u64, u64),
    unclean_stops: Vec<String>,
    /// A container A expects running (`[containers]`, through the Docker daemon).
    side: Container,
    /// Times it was killed, and those A started again within 20 s.
    side_kills: (u64, u64),
    drain_kills: Vec<String>,
}

fn minutes() -> f64 {
    std::env::var("HEALTH_AGENT_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(3.0)
}

fn sleep(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs));
}

impl Soak {
    fn now(&self) -> Duration {
        self.poller.elapsed()
    }

    fn record(&mut self, name: &'static str, from: Duration, may_503: bool) {
        let to = self.now();
        self.faults.push(Fault {
            name,
            from,
            to,
            may_503,
        });
        *self.counts.entry(name).or_insert(0) += 1;
    }

    fn backend_restart(&mut self) {
        let t = self.now();
        self.backend.restart();
        self.record("backend restarted (SIGKILL, new process)", t, true);
    }

    fn hang(&mut self) {
        let t = self.now();
        self.backend.signal(libc::SIGSTOP);
        sleep(6.0);
        self.backend.signal(libc::SIGCONT);
        self.record("backend hung (SIGSTOP 6 s)", t, true);
        // Seen: a 503 while it was stopped (0.5 s under traffic, README).
        sleep(1.0);
        let to = self.now();
        let seen = self
            .poller
            .samples()
            .iter()
            .any(|s| s.at >= t && s.at <= to && s.code == 503);
        self.hangs.0 += 1;
        self.hangs.1 += u64::from(seen);
    }

    fn backend_mode(&mut self, name: &'static str, mode: &str, secs: f64) {
        let t = self.now();
        self.backend.set_mode(mode);
        sleep(secs);
        self.backend.set_mode("normal");
        self.record(name, t, true);
    }

    fn database_down(&mut self) {
        let t = self.now();
        self.mode.store(MODE_FAIL, Ordering::SeqCst);
        self.pg.stop();
        sleep(5.0);
        self.pg.resume();
        sleep(2.0);
        self.mode.store(MODE_OK, Ordering::SeqCst);
        self.record("database stopped, receivers failing (503)", t, false);
    }

    fn password_changed(&mut self) {
        let t = self.now();
        self.mode.store(MODE_STALL, Ordering::SeqCst);
        self.pg
            .psql("ALTER ROLE app PASSWORD 'changed-by-the-soak'");
        self.pg
            .psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'");
        sleep(5.0);
        self.pg
            .psql(&format!("ALTER ROLE app PASSWORD '{DB_PASSWORD}'"));
        sleep(1.0);
        self.mode.store(MODE_OK, Ordering::SeqCst);
        self.record("database password changed, receivers stalling", t, false);
    }

    fn peer_restart(&mut self) {
        let t = self.now();
        self.kill_b();
        sleep(3.0);
        self.restart_b();
        self.record("peer agent killed (SIGKILL) and restarted", t, false);
    }

    /// SIGKILL to B; its BPF programs must leave the kernel with it.
    fn kill_b(&mut self) {
        let (progs, _) = soak::bpf_objects(self.b.pid());
        self.b.signal(libc::SIGKILL);
        self.peer_kills.0 += 1;
        self.peer_kills.1 += u64::from(!progs.is_empty() && soak::released(&progs));
    }

    /// B restarted as `systemctl restart` does: SIGTERM, a clean exit (status 0) within 10 s,
    /// its BPF programs gone from the kernel, then started again on the same config.
    fn peer_systemd_restart(&mut self) {
        let t = self.now();
        let (progs, _) = soak::bpf_objects(self.b.pid());
        let status = self.b.terminate(Duration::from_secs(10));
        if status.is_none() {
            self.b.signal(libc::SIGKILL);
        }
        let released = !progs.is_empty() && soak::released(&progs);
        let clean = status.is_some_and(|s| s.success()) && released;
        self.peer_stops.0 += 1;
        self.peer_stops.1 += u64::from(clean);
        if !clean {
            self.unclean_stops.push(format!(
                "exit {status:?}, {} programs, released: {released}",
                progs.len()
            ));
        }
        self.restart_b();
        self.record("peer agent restarted as systemd does (SIGTERM)", t, false);
    }

    /// The container A expects, killed: A restarts it through the Docker Engine API, 200
    /// `recovering` meanwhile, never 503.
    fn container_killed(&mut self) {
        let t = self.now();
        let name = self.side.name.clone();
        // One `docker inspect` a second: the CLI is a process of its own, and more of them
        // would load the host the agent's latency is measured on.
        let state = |n: &str| {
            docker(&[
                "inspect",
                "-f",
                "{{.State.Running}} {{.State.StartedAt}}",
                n,
            ])
        };
        let before = state(&name);
        docker(&["kill", &name]);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut back = false;
        while !back && Instant::now() < deadline {
            sleep(1.0);
            let now = state(&name);
            back = now.starts_with("true ") && now != before;
        }
        self.side_kills.0 += 1;
        self.side_kills.1 += u64::from(back);
        sleep(1.0);
        self.record("container killed (docker kill), restarted by A", t, false);
    }

    fn restart_b(&mut self) {
        let addr = self.b.addr;
        let extra = web_config(self.b_backend.port, &self.b_extra);
        self.b = Agent::start_at(addr, &extra, &[("PGPASSWORD", DB_PASSWORD)]);
    }

    fn drain_a(&mut self) {
        let t = self.now();
        let run = drain(&self.a, Duration::from_secs(1), Duration::from_secs(3));
        assert!(
            matches!(run.code, Some(0 | 1)),
            "drain: {}",
            run.last_line()
        );
        sleep(1.0);
        let run = undrain(&self.a);
        assert_eq!(run.code, Some(0), "undrain: {}", run.last_line());
        self.record("drained and undrained", t, true);
    }

    /// B is drained, killed mid-drain, started again: it must come back drained (the drain
    /// persisted), and be 200 after `undrain`, not stuck draining.
    fn drain_kill(&mut self) {
        let t = self.now();
        let bg =
            DrainInBackground::start(&self.b, Duration::from_secs(30), Duration::from_secs(60));
        sleep(1.5);
        self.kill_b();
        let _ = bg.stop();
        self.restart_b();
        let came_back = self.b.health();
        let run = undrain(&self.b);
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut after = self.b.health();
        while after.0 != 200 && Instant::now() < deadline {
            sleep(0.2);
            after = self.b.health();
        }
        let ok = came_back.1["status"] == "draining" && run.code == Some(0) && after.0 == 200;
        if !ok {
            self.drain_kills.push(format!(
                "came back {} {}, undrain {:?} {}, then {} {}",
                came_back.0,
                came_back.1["status"],
                run.code,
                run.last_line(),
                after.0,
                after.1["status"]
            ));
        }
        self.record("peer killed mid-drain, restarted, undrained", t, false);
    }

    fn fill_disk(&self, percent: f64) {
        let file = self.disk.path.join("fill");
        let _ = std::fs::remove_file(&file);
        let (total, used) = statvfs(&self.disk.path);
        let want = (total as f64 * percent / 100.0) as u64;
        let size = want.saturating_sub(used) as usize;
        std::fs::write(&file, vec![0u8; size]).expect("filling the soak's disk");
    }

    fn disk(&mut self) {
        let t = self.now();
        self.fill_disk(85.0);
        sleep(4.0);
        self.record("disk at 85 % (warn)", t, false);
        let t = self.now();
        self.fill_disk(95.0);
        sleep(4.0);
        let _ = std::fs::remove_file(self.disk.path.join("fill"));
        self.record("disk at 95 % (fail)", t, true);
    }

    fn state_read_only(&mut self) {
        let t = self.now();
        remount(&self.state.path, "ro");
        sleep(6.0);
        remount(&self.state.path, "rw");
        self.record("state directory read-only", t, false);
    }

    fn cycle(&mut self) {
        self.backend_restart();
        sleep(2.0);
        self.hang();
        sleep(2.0);
        self.backend_mode("backend answering 5xx", "error", 5.0);
        sleep(2.0);
        self.backend_mode("backend slow (1.5 s)", "slow?delay_ms=1500", 5.0);
        sleep(2.0);
        self.database_down();
        sleep(2.0);
        self.password_changed();
        sleep(2.0);
        self.peer_restart();
        sleep(2.0);
        self.peer_systemd_restart();
        sleep(2.0);
        self.container_killed();
        sleep(2.0);
        self.drain_a();
        sleep(2.0);
        self.drain_kill();
        sleep(2.0);
        self.disk();
        sleep(2.0);
        self.state_read_only();
        sleep(2.0);
    }
}

fn statvfs(path: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a zeroed statvfs filled by the call on a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    let f = s.f_frsize;
    (s.f_blocks * f, (s.f_blocks - s.f_bfree) * f)
}

fn remount(path: &std::path::Path, how: &str) {
    let ok = std::process::Command::new("mount")
        .args(["-o", &format!("remount,{how}")])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "remount {how} {}", path.display());
}

/// About 20 requests a second to the backend, each on a new connection.
fn traffic(port: u16) -> Load {
    Load::new_connections(
        port,
        "/",
        2,
        Duration::from_millis(100),
        Duration::from_secs(5),
    )
}

/// Cycles of every fault under traffic until `run_for` has passed, at least one: the end of
/// the first (the warm-up: every path has made what it keeps), and the traffic's last figures.
fn churn(s: &mut Soak, run_for: Duration, port: u16) -> (Duration, Option<LoadStats>) {
    // The load generator stops itself after a while: a new one every 150 s.
    let mut load = traffic(port);
    let mut load_since = Instant::now();
    let mut warm_up = None;
    while warm_up.is_none() || s.now() < run_for {
        if load_since.elapsed() > Duration::from_secs(150) {
            load.stop();
            load = traffic(port);
            load_since = Instant::now();
        }
        s.cycle();
        warm_up.get_or_insert(s.now());
    }
    (warm_up.unwrap_or_default(), Some(load.stop()))
}

/// Every few seconds: the agent's /proc figures, its hash maps' entries and the bounded
/// lists and snapshot age `/metrics` shows.
fn sampler(
    pid: u32,
    addr: SocketAddr,
    clock: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sampled>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let at = clock.elapsed();
            let Some(proc) = soak::proc_figures(pid) else {
                break;
            };
            let (_, maps) = soak::bpf_objects(pid);
            let maps = soak::hash_map_entries(&maps);
            let mut lists = BTreeMap::new();
            if let Ok((200, text)) = health_agent_tests::get_at(addr, "/metrics") {
                for name in [
                    "health_agent_web_pending",
                    "health_agent_web_waiting",
                    "health_agent_alerts_queued",
                    "health_agent_fleet_peers_asked",
                ] {
                    if let Some(v) = gauge(&text, name) {
                        lists.insert(name.to_string(), v);
                    }
                }
                if let Some(ts) = gauge(&text, "health_agent_snapshot_timestamp_seconds") {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    lists.insert("snapshot age (s)".into(), now - ts);
                }
            }
            out.push(Sampled {
                at,
                proc,
                maps,
                lists,
            });
            std::thread::sleep(Duration::from_secs(2));
        }
        out
    })
}

/// The first wrong 503 of each spell, its reasons, and the faults just before it.
fn explain(wrong: &[&health_agent_tests::HealthSample], faults: &[Fault]) -> String {
    let mut out = String::new();
    let mut last = Duration::ZERO;
    for w in wrong {
        if w.at > last + Duration::from_secs(1) || last.is_zero() {
            let before: Vec<String> = faults
                .iter()
                .filter(|f| f.from <= w.at && f.from + Duration::from_secs(30) >= w.at)
                .map(|f| {
                    format!(
                        "{} {:.1}-{:.1}s",
                        f.name,
                        f.from.as_secs_f64(),
                        f.to.as_secs_f64()
                    )
                })
                .collect();
            out.push_str(&format!(
                "{w}\n    reasons: {}\n    faults in the 30 s before: {before:?}\n",
                w.body["reasons"]
            ));
        }
        last = w.at;
    }
    out
}

/// The alert log lines of an agent's JSON log: (events queued, sent per destination, lines
/// saying something was not delivered or dropped).
fn alert_log(log: &str) -> (u64, BTreeMap<String, u64>, Vec<String>) {
    let (mut queued, mut sent, mut lost) = (0, BTreeMap::new(), Vec::new());
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let field = |k: &str| {
            v.get(k)
                .or_else(|| v.get("fields").and_then(|f| f.get(k)))
                .and_then(|x| x.as_str())
                .map(str::to_string)
        };
        let message = field("message").unwrap_or_default();
        let (incident, destination) = (field("incident"), field("destination"));
        // `webhook 127.0.0.1:PORT`: the destination's kind is its first word.
        let destination =
            destination.map(|d| d.split_whitespace().next().unwrap_or("").to_string());
        // A fleet incident's `open` and `close` are bookkeeping; only triggers and resolves
        // are sent.
        let sendable = incident
            .as_deref()
            .is_some_and(|i| i.starts_with("trigger ") || i.starts_with("resolve "));
        if message == "alert sent" {
            *sent.entry(destination.unwrap_or_default()).or_insert(0) += 1;
        } else if message.starts_with("alert not delivered")
            || message.starts_with("alert queue full")
        {
            lost.push(line.to_string());
        } else if sendable && destination.is_none() {
            queued += 1;
        }
    }
    (queued, sent, lost)
}

#[test]
fn soak_under_churn_nothing_grows_nothing_wrong_nothing_lost() {
    require_root();
    let run_for = Duration::from_secs_f64(minutes() * 60.0);
    let ips = [loopback(2), loopback(3), loopback(4)];
    let port = free_port_on_all(&ips);
    let at: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
    let garbage = StubServer::start(loopback(5), Duration::ZERO, |_| {
        (200, "{\"view\": [garb".into())
    });
    let slow = StubServer::start(loopback(6), Duration::from_secs(3), |_| (200, "{}".into()));
    let fleet = |peers: Vec<String>| {
        format!("[fleet]\npeers = {peers:?}\ninterval = \"1s\"\ntimeout = \"1s\"\n")
    };

    let pg = Postgres::start();
    pg.psql(&format!("CREATE ROLE app LOGIN PASSWORD '{DB_PASSWORD}'"));
    let mode = Arc::new(AtomicU8::new(MODE_OK));
    let dests = [
        Destination::start("slack", 200, mode.clone()),
        Destination::start("pagerduty", 202, mode.clone()),
        Destination::start("webhook", 200, mode.clone()),
    ];
    let disk = Tmpfs::mount("16M");
    let state = Tmpfs::mount("1M");
    let backend = Backend::start();
    let load_port = backend.port;
    // The peers use the same database, as a fleet's instances do: a database fault is the
    // fleet's, never one instance's own (which would be a 503 for it).
    let database = format!(
        "[database]\nurl = \"postgres://app@127.0.0.1:{}/postgres\"\ninterval = \"1s\"\ntimeout = \"1s\"\nfail_after = 2\n",
        pg.port
    );
    // A container A expects running, on the host's Docker daemon. Its kills come every cycle,
    // a month's compressed into minutes: the budget is raised to match (3 per 10 minutes
    // would be spent in the fourth cycle, and a spent budget is a 503 by design).
    let side = Container::serving("soak-side", &[]);
    let a_extra = format!(
        "[containers]\nnames = [\"{}\"]\n[heal]\nmax_restarts = 30\n\
         [disk]\npaths = [\"{}\"]\nwarn_percent = 80.0\nfail_percent = 90.0\n\
         [drain]\nstate_file = \"{}\"\n\
         [alerts]\nslack_webhook_url = \"{}\"\npagerduty_routing_key = \"R0UT1NGKEY0123456789abcdefABCDEF\"\n\
         pagerduty_url = \"{}\"\nwebhook_url = \"{}\"\nresolve_after = \"3s\"\ntimeout = \"3s\"\n{database}{}",
        side.name,
        disk.path.display(),
        state.path.join("drain.json").display(),
        dests[0].receiver.url("/services/T000/B000/XXXX"),
        dests[1].receiver.url("/v2/enqueue"),
        dests[2].receiver.url("/hook"),
        fleet(vec![
            at[1].to_string(),
            at[2].to_string(),
            garbage.addr.to_string(),
            slow.addr.to_string()
        ]),
    );
    let a = Agent::start_at(
        at[0],
        &web_config(backend.port, &a_extra),
        &[
            ("PGPASSWORD", DB_PASSWORD),
            ("HEALTH_AGENT_LOG_FORMAT", "json"),
        ],
    );
    let b_state = tempfile::tempdir().expect("tempdir");
    let b_extra = format!(
        "[drain]\nstate_file = \"{}\"\n{database}{}",
        b_state.path().join("drain.json").display(),
        fleet(vec![at[0].to_string(), at[2].to_string()])
    );
    let b_backend = Fixture::start("normal");
    let b = Agent::start_at(
        at[1],
        &web_config(b_backend.port, &b_extra),
        &[("PGPASSWORD", DB_PASSWORD)],
    );
    let c_backend = Fixture::start("normal");
    let c = Agent::start_at(
        at[2],
        &web_config(
            c_backend.port,
            &format!(
                "{database}{}",
                fleet(vec![at[0].to_string(), at[1].to_string()])
            ),
        ),
        &[("PGPASSWORD", DB_PASSWORD)],
    );

    a.wait_health(Duration::from_secs(30), "A healthy at the start", |c, b| {
        c == 200 && b["checks"]["database"] == "connected"
    });
    let a_pid = a.pid();
    let progs_before = soak::prog_count();
    let poller = HealthPoller::unbounded(a.addr);
    let control_poller = HealthPoller::unbounded(soak::control_server());
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = sampler(a_pid, a.addr, Instant::now(), stop.clone());
    let mut s = Soak {
        backend,
        pg,
        disk,
        state,
        a,
        b,
        b_extra,
        b_backend,
        _c: (c, c_backend),
        poller,
        mode,
        faults: Vec::new(),
        counts: BTreeMap::new(),
        hangs: (0, 0),
        peer_kills: (0, 0),
        peer_stops: (0, 0),
        unclean_stops: Vec::new(),
        side,
        side_kills: (0, 0),
        drain_kills: Vec::new(),
    };
    let (warm_up, load_stats) = churn(&mut s, run_for, load_port);
    // Quiet at the end: every incident resolves and its alerts go out.
    let settle = Instant::now();
    let (queued, _, _) = alert_log(&s.a.logs());
    while settle.elapsed() < Duration::from_secs(30)
        && dests.iter().any(|d| (d.counts().0 as u64) < queued)
    {
        sleep(0.5);
    }
    sleep(5.0);
    stop.store(true, Ordering::SeqCst);
    let samples = sampling.join().expect("sampler");
    let timed = s.poller.timed();
    let control_timed = control_poller.stop_timed();
    let progs_after = soak::prog_count();
    let control = soak::latency_ms(&control_timed);
    let run = Run {
        samples,
        timed,
        control,
        warm_up,
        progs: (progs_before, progs_after),
        load: load_stats,
    };
    verdict(&s, &run, &dests);
}

/// The figures sampled, each against its bound after warm-up: the table and what failed.
fn figures(samples: &[Sampled], warm_up: Duration) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let series = |f: &dyn Fn(&Sampled) -> Option<f64>| -> Vec<(Duration, f64)> {
        samples
            .iter()
            .filter_map(|x| f(x).map(|v| (x.at, v)))
            .collect()
    };
    let mut rows = Vec::new();
    let mut figure = |name: String,
                      values: Vec<(Duration, f64)>,
                      bound: &dyn Fn(&Series, f64) -> (String, bool)| {
        if let Some(series) = Series::of(&name, &values, warm_up) {
            let end = Series::end_level(&values, warm_up);
            let (text, held) = bound(&series, end);
            if !held {
                failures.push(format!(
                    "{name}: {text} not held (warm {:.0}, end {end:.0}, max {:.0})",
                    series.warm, series.max_after_warm
                ));
            }
            rows.push((series, end, text, held));
        }
    };
    figure(
        "RSS (KB)".into(),
        series(&|x| Some(x.proc.rss_kb as f64)),
        &|s, end| ("end within 2048 KB of warm".into(), end <= s.warm + 2048.0),
    );
    figure(
        "open fds".into(),
        series(&|x| Some(x.proc.fds as f64)),
        &|s, end| ("end ≤ warm + 4".into(), end <= s.warm + 4.0),
    );
    figure(
        "threads".into(),
        series(&|x| Some(x.proc.threads as f64)),
        &|s, end| ("end ≤ warm + 4".into(), end <= s.warm + 4.0),
    );
    let map_names: std::collections::BTreeSet<String> = samples
        .iter()
        .flat_map(|x| x.maps.keys().cloned())
        .collect();
    for m in map_names {
        let warm_max = samples
            .iter()
            .filter(|x| x.at < warm_up)
            .filter_map(|x| x.maps.get(&m))
            .map(|v| v.0)
            .max()
            .unwrap_or(0) as f64;
        let capacity = samples
            .iter()
            .filter_map(|x| x.maps.get(&m))
            .map(|v| v.1)
            .max()
            .unwrap_or(0) as f64;
        // LRU and preallocated, so their memory is fixed and their fill is bounded by their
        // capacity: the accept maps, keyed by any process on the host that accepts while
        // accept() is traced (tests beside the soak included), and ANSWER_STARTS, one entry
        // per connection of the watched port that sent an answer, left to the LRU (no program
        // sees a connection's end by its cookie). The others are the agent's own connections
        // and ports: back to their warm level.
        let lru = if m.starts_with("ACCEPT") {
            Some("LRU, host-wide")
        } else if m == "ANSWER_STARTS" {
            Some("LRU, one entry per answering connection")
        } else {
            None
        };
        figure(
            format!("BPF map {m} (entries)"),
            series(&|x| x.maps.get(&m).map(|v| v.0 as f64)),
            &move |s, end| {
                if let Some(kind) = lru {
                    (
                        format!("≤ capacity {capacity:.0} ({kind})"),
                        s.max_after_warm <= capacity,
                    )
                } else {
                    (
                        format!("end ≤ warm-up max ({warm_max:.0}) + 16"),
                        end <= warm_max + 16.0,
                    )
                }
            },
        );
    }
    let list_names: std::collections::BTreeSet<String> = samples
        .iter()
        .flat_map(|x| x.lists.keys().cloned())
        .collect();
    for l in list_names {
        if l == "snapshot age (s)" {
            figure(l.clone(), series(&|x| x.lists.get(&l).copied()), &|s, _| {
                (
                    "max ≤ 10 s (checks.stale_after)".into(),
                    s.max_after_warm <= 10.0,
                )
            });
            continue;
        }
        let warm_max = samples
            .iter()
            .filter(|x| x.at < warm_up)
            .filter_map(|x| x.lists.get(&l))
            .copied()
            .fold(0.0, f64::max);
        figure(
            l.clone(),
            series(&|x| x.lists.get(&l).copied()),
            &move |_, end| {
                (
                    format!("end ≤ warm-up max ({warm_max:.0}) + 4"),
                    end <= warm_max + 4.0,
                )
            },
        );
    }
    (soak::figures_table(&rows), failures)
}

/// What the run recorded, for the verdict.
struct Run {
    samples: Vec<Sampled>,
    timed: Vec<health_agent_tests::Timed>,
    /// `/health`'s client's latency to a trivial server: (p50, p99, max) ms.
    control: (f64, f64, f64),
    warm_up: Duration,
    /// `bpftool prog show` counts before and after.
    progs: (usize, usize),
    load: Option<LoadStats>,
}

/// Judges the run and prints its table (to `HEALTH_AGENT_SOAK_REPORT` too, when set).
fn verdict(s: &Soak, run: &Run, dests: &[Destination]) {
    let (samples, timed, control, warm_up, progs, load) = (
        &run.samples[..],
        &run.timed[..],
        run.control,
        run.warm_up,
        run.progs,
        &run.load,
    );
    let mut out = String::new();
    let end = timed.last().map_or(Duration::ZERO, |t| t.sample.at);
    out.push_str(&format!(
        "soak: {:.1} min, warm-up {:.0} s (one cycle of every fault), {} samples of the agent, {} /health answers\n\n",
        end.as_secs_f64() / 60.0,
        warm_up.as_secs_f64(),
        samples.len(),
        timed.len()
    ));
    let (table, mut failures) = figures(samples, warm_up);
    out.push_str(&table);

    // The answers against the truth.
    let answers: Vec<health_agent_tests::HealthSample> =
        timed.iter().map(|t| t.sample.clone()).collect();
    let wrong = soak::wrong_503s(&answers, &s.faults);
    let unanswered = answers.iter().filter(|x| x.code == 0).count();
    let (p50, p99, max) = soak::latency_ms(timed);
    let by_code = |c: u16| answers.iter().filter(|x| x.code == c).count();
    out.push_str("\n| answers | count |\n|---|---:|\n");
    out.push_str(&format!("| 200 | {} |\n| 503 (a fault that may make one was under way or ended ≤ {} s before) | {} |\n", by_code(200), soak::RECOVERY.as_secs(), by_code(503) - wrong.len()));
    out.push_str(&format!(
        "| **wrong 503** | {} |\n| no answer | {unanswered} |\n",
        wrong.len()
    ));
    out.push_str(&format!(
        "| hangs seen as 503 | {} of {} |\n",
        s.hangs.1, s.hangs.0
    ));
    out.push_str(&format!(
        "| /health from a separate client, ms | p50 {p50:.2}, p99 {p99:.2}, max {max:.2} |\n"
    ));
    out.push_str(&format!(
        "| the same client to a trivial HTTP server in the test (the host's own delay), ms | p50 {:.2}, p99 {:.2}, max {:.2} |\n",
        control.0, control.1, control.2
    ));
    if !wrong.is_empty() {
        failures.push(format!(
            "{} wrong 503, the first: {}",
            wrong.len(),
            wrong[0]
        ));
    }
    if unanswered > 0 {
        failures.push(format!("{unanswered} /health requests unanswered"));
    }
    if s.hangs.1 < s.hangs.0 {
        failures.push(format!(
            "only {} of {} hangs seen as 503",
            s.hangs.1, s.hangs.0
        ));
    }
    // The bound is the agent's: on a host so loaded that a trivial server's p99 passes it
    // too, the excess over that server is what the agent adds.
    if p99 >= 10.0 && p99 - control.1 >= 10.0 {
        failures.push(format!(
            "/health p99 {p99:.2} ms ≥ 10 ms (a trivial server's: {:.2} ms)",
            control.1
        ));
    }

    // The faults injected.
    out.push_str("\n| fault injected | times |\n|---|---:|\n");
    for (name, n) in &s.counts {
        out.push_str(&format!("| {name} | {n} |\n"));
    }
    out.push_str("| standing: a peer answering garbage, one answering in 3 s (timeout 1 s); after 180 s both stop accepting | all along |\n");
    if let Some(l) = load {
        out.push_str(&format!(
            "| traffic on the backend (the last segment) | {} answers, {} timeouts, {} errors |\n",
            l.answers(),
            l.timeouts,
            l.errors
        ));
    }
    if !s.drain_kills.is_empty() {
        failures.push(format!(
            "killed mid-drain, not consistent after: {:?}",
            s.drain_kills
        ));
    }
    all_of(
        (&mut out, &mut failures),
        "peers killed whose BPF programs all left the kernel",
        s.peer_kills,
        "a killed peer's BPF programs stayed, released".into(),
    );
    all_of(
        (&mut out, &mut failures),
        "containers killed that A restarted (Docker Engine API) within 20 s",
        s.side_kills,
        "A did not restart its container, kills healed".into(),
    );
    all_of(
        (&mut out, &mut failures),
        "peers restarted by SIGTERM that exited 0 with every program released",
        s.peer_stops,
        format!(
            "a peer stopped by SIGTERM did not stop cleanly ({:?}), clean",
            s.unclean_stops
        ),
    );
    out.push_str(&format!(
        "| killed mid-drain and found inconsistent after | {} |\n",
        s.drain_kills.len()
    ));

    // The alerts: everything queued delivered once to each destination.
    let (queued, sent, lost_lines) = alert_log(&s.a.logs());
    out.push_str("\n| alerts | queued | delivered (2xx) | distinct bodies | lost | doubled |\n|---|---:|---:|---:|---:|---:|\n");
    for d in dests {
        // Bodies may repeat legitimately (a PagerDuty resolve is its dedup key alone): the
        // count is what must match, the agent's queue against the receiver's 2xx.
        let (got, distinct) = d.counts();
        let got = got as u64;
        let (lost, doubled) = (queued.saturating_sub(got), got.saturating_sub(queued));
        out.push_str(&format!(
            "| {} | {queued} | {got} | {distinct} | {lost} | {doubled} |\n",
            d.name
        ));
        let said = sent.get(d.name).copied().unwrap_or(0);
        if lost > 0 || doubled > 0 || said != got {
            failures.push(format!(
                "{}: queued {queued}, agent says sent {said}, receiver got {got}",
                d.name
            ));
        }
    }
    if queued == 0 {
        failures.push("no alert was queued: the database faults should have raised some".into());
    }
    if !lost_lines.is_empty() {
        failures.push(format!(
            "the agent said alerts were not delivered: {:?}",
            &lost_lines[..lost_lines.len().min(3)]
        ));
    }
    out.push_str(&format!("\nBPF programs loaded on the host, A, B and C running: {} before, {} after (other processes' included: tests running beside the soak load theirs)\n", progs.0, progs.1));
    println!("{out}");
    if let Ok(path) = std::env::var("HEALTH_AGENT_SOAK_REPORT") {
        let _ = std::fs::write(PathBuf::from(&path), &out);
        let _ = std::fs::write(format!("{path}.agent-a.log"), s.a.logs());
    }
    assert!(
        failures.is_empty(),
        "the soak failed:\n{}\n\n{out}\nwrong 503s:\n{}",
        failures.join("\n"),
        explain(&wrong, &s.faults)
    );
}

/// A row "`done` of `of`" of the table, and `failure` ("…: done of of") when not all were.
fn all_of(
    (out, failures): (&mut String, &mut Vec<String>),
    row: &str,
    (of, done): (u64, u64),
    failure: String,
) {
    out.push_str(&format!("| {row} | {done} of {of} |\n"));
    if done < of {
        failures.push(format!("{failure}: {done} of {of}"));
    }
}
