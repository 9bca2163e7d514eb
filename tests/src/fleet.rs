//! The fleet harness: agents on their own loopback addresses (127.0.0.2, 127.0.0.3, …, so two
//! of them can share a port the way a fleet's hosts do), a `/health` recorder for an agent at
//! any address, stub HTTP servers (peers that misbehave, a stand-in for Consul's catalog), and
//! temporary `/etc/hosts` lines for `fleet.peers_dns`.
//!
//! [`crate::Agent`] cannot be used for these: it listens on 127.0.0.1 and both its readiness
//! wait and [`crate::HealthPoller`] talk to `127.0.0.1:<port>`. Everything here stays on
//! 127.0.0.0/8, and every guard cleans up on drop, after a panic too.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    agent_binary, kill_and_wait, load::MAX_RUN, merge_toml, timeline, wait_until, HealthSample,
};

/// `127.0.0.<last>`.
pub fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A port that was free a moment ago on every one of `ips` at once (bind test on each).
pub fn free_port_on_all(ips: &[IpAddr]) -> u16 {
    for _ in 0..100 {
        let Some(first) = ips.first() else {
            panic!("free_port_on_all: no addresses");
        };
        let Ok(l) = TcpListener::bind((*first, 0)) else {
            continue;
        };
        let Ok(port) = l.local_addr().map(|a| a.port()) else {
            continue;
        };
        // All bound at the same time, then all released.
        let others: Vec<_> = ips[1..]
            .iter()
            .map(|ip| TcpListener::bind((*ip, port)))
            .collect();
        if others.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no port free on all of {ips:?} after 100 tries");
}

/// One HTTP/1.1 request to `addr` with extra headers; returns (status, head, body).
pub fn request_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad response: {head:?}"),
            )
        })?;
    Ok((status, head.to_string(), body.to_string()))
}

/// The agent binary running `serve` on a chosen address (`127.0.0.2:PORT`, say), with `extra`
/// TOML merged into a base config that shows full details and has no boot grace. Dropping it
/// stops it.
pub struct AddrAgent {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl AddrAgent {
    /// Starts the agent and waits until it serves `/livez` on `addr`. The port is not retried:
    /// other agents' configs name it (pick it with [`free_port_on_all`] right before).
    pub fn start(addr: SocketAddr, extra: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("health-agent.toml");
        let base = format!(
            "[server]\nlisten = \"{addr}\"\ndetails = \"always\"\n\n[checks]\nboot_grace = \"0s\"\n"
        );
        std::fs::write(&config, merge_toml(&base, extra)).expect("writing config");
        let log = dir.path().join("agent.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(agent_binary())
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .envs(env.iter().copied())
            .env("HEALTH_AGENT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("starting health-agent");
        // Dropped (stopped) if the wait below panics.
        let mut agent = Self {
            child,
            addr,
            dir,
            log,
        };
        wait_until(
            Duration::from_secs(20),
            &format!("the agent to serve /livez on {addr}"),
            || {
                if let Ok(Some(status)) = agent.child.try_wait() {
                    panic!(
                        "health-agent on {addr} exited with {status}:\n{}\nconfig:\n{}",
                        agent.logs(),
                        agent.config()
                    );
                }
                agent.get("/livez").ok().filter(|(c, _)| *c == 200)
            },
        );
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The config file it was started with.
    pub fn config(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("health-agent.toml")).unwrap_or_default()
    }

    /// `GET path` with a 5 s timeout: (status, body).
    pub fn get(&self, path: &str) -> io::Result<(u16, String)> {
        request_at(self.addr, "GET", path, &[], Duration::from_secs(5)).map(|(c, _, b)| (c, b))
    }

    /// (HTTP code, JSON body) of `GET /health`.
    pub fn health(&self) -> (u16, Value) {
        let (code, body) = self
            .get("/health")
            .unwrap_or_else(|e| panic!("GET /health on {}: {e}", self.addr));
        let json = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/health body is not JSON ({e}): {body}"));
        (code, json)
    }

    /// `GET /fleet/v1/view`, with `Authorization: <authorization>` when given: (status, body).
    pub fn view(&self, authorization: Option<&str>) -> io::Result<(u16, String)> {
        let headers: Vec<(&str, &str)> = authorization
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        request_at(
            self.addr,
            "GET",
            "/fleet/v1/view",
            &headers,
            Duration::from_secs(5),
        )
        .map(|(c, _, b)| (c, b))
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        match self.get("/metrics") {
            Ok((200, text)) => text,
            other => panic!("GET /metrics on {}: {other:?}", self.addr),
        }
    }
}

impl Drop for AddrAgent {
    fn drop(&mut self) {
        kill_and_wait(&mut self.child, libc::SIGTERM);
    }
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
pub fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A `/health` answer as an [`AddrPoller`] saw it.
#[derive(Debug, Clone)]
pub struct Timed {
    pub sample: HealthSample,
    /// From connect to the end of the answer.
    pub took: Duration,
}

/// Polls an agent's `/health` at any address every 200 ms on its own thread and keeps every
/// answer with its latency ([`crate::HealthPoller`] for agents not on 127.0.0.1).
pub struct AddrPoller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Timed>>>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
    pub addr: SocketAddr,
}

impl AddrPoller {
    pub fn start(addr: SocketAddr) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (st, sa) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let deadline = started + MAX_RUN;
            let mut next = started;
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                let sample = poll_once_at(addr, started);
                if let Ok(mut v) = sa.lock() {
                    v.push(sample);
                }
                next += crate::load::POLL_EVERY;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
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
            addr,
        }
    }

    /// Time since the poller started (the clock of [`HealthSample::at`]).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every answer so far, with latencies.
    pub fn timed(&self) -> Vec<Timed> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Every answer so far.
    pub fn samples(&self) -> Vec<HealthSample> {
        self.timed().into_iter().map(|t| t.sample).collect()
    }

    /// Waits until an answer recorded at or after `from` (poller clock) satisfies `pred`, and
    /// returns the first such; panics after `timeout` with the timeline, the last body and
    /// `explain()`.
    pub fn wait_for(
        &self,
        from: Duration,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
        explain: impl FnOnce() -> String,
    ) -> HealthSample {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = self.samples.lock() {
                if let Some(t) = v.iter().find(|t| t.sample.at >= from && pred(&t.sample)) {
                    return t.sample.clone();
                }
            }
            if Instant::now() >= deadline {
                let all = self.samples();
                panic!(
                    "timed out after {timeout:?} waiting for {what} on the agent at {} (from t={:.1}s); answers:\n{}last body: {}{}",
                    self.addr,
                    from.as_secs_f64(),
                    timeline(&all),
                    all.last()
                        .map(|s| serde_json::to_string_pretty(&s.body).unwrap_or_default())
                        .unwrap_or_default(),
                    explain()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops polling and returns every answer.
    pub fn stop(self) -> Vec<HealthSample> {
        self.stop_timed().into_iter().map(|t| t.sample).collect()
    }

    /// Stops polling and returns every answer with its latency.
    pub fn stop_timed(mut self) -> Vec<Timed> {
        self.halt();
        self.timed()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AddrPoller {
    fn drop(&mut self) {
        self.halt();
    }
}

fn poll_once_at(addr: SocketAddr, started: Instant) -> Timed {
    let at = started.elapsed();
    let t0 = Instant::now();
    let result = request_at(addr, "GET", "/health", &[], Duration::from_secs(5));
    let took = t0.elapsed();
    Timed {
        sample: HealthSample::from_answer(at, result.map(|(code, _, text)| (code, text))),
        took,
    }
}

/// One request a [`StubServer`] got.
#[derive(Debug, Clone)]
pub struct StubRequest {
    pub method: String,
    /// With the query string.
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// When it arrived.
    pub at: Instant,
}

impl StubRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query string.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }
}

type StubResponder = dyn Fn(&StubRequest) -> (u16, String) + Send + Sync;

/// A small HTTP server on `ip` (any loopback address): one request per connection, answered
/// through `respond` after `delay` (`Connection: close`), every request recorded. Stands in
/// for a peer that is slow or talks garbage, or for Consul's catalog API. Dropping it stops
/// accepting and cuts short answers still waiting out their delay.
pub struct StubServer {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<StubRequest>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StubServer {
    pub fn start(
        ip: IpAddr,
        delay: Duration,
        respond: impl Fn(&StubRequest) -> (u16, String) + Send + Sync + 'static,
    ) -> Self {
        let listener =
            TcpListener::bind((ip, 0)).unwrap_or_else(|e| panic!("binding a stub on {ip}: {e}"));
        let addr = listener.local_addr().expect("stub address");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let respond: Arc<StubResponder> = Arc::new(respond);
        let (se, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + MAX_RUN;
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (se, st, respond) = (se.clone(), st.clone(), respond.clone());
                        std::thread::spawn(move || serve_stub(stream, delay, &se, &st, &*respond));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://ADDR` (for `fleet.consul_addr`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<StubRequest> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for StubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_stub(
    mut stream: TcpStream,
    delay: Duration,
    seen: &Mutex<Vec<StubRequest>>,
    stop: &AtomicBool,
    respond: &StubResponder,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let req = StubRequest {
        method: first.next().unwrap_or("").to_string(),
        path: first.next().unwrap_or("").to_string(),
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
        at: Instant::now(),
    };
    if let Ok(mut v) = seen.lock() {
        v.push(req.clone());
    }
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, body) = respond(&req);
    let resp = format!(
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
}

const HOSTS: &str = "/etc/hosts";
/// Marks the lines a [`HostsLines`] added: `... # health-agent-tests pid <pid>`.
const HOSTS_MARK: &str = "# health-agent-tests pid ";

/// Temporary `/etc/hosts` lines (`fleet.peers_dns` resolves through the system resolver).
/// Dropping it writes back the file exactly as it was before (also after a panic). The file
/// is rewritten in place, not replaced, since a container's `/etc/hosts` is often a bind
/// mount. Guards are serialized within the test process; lines left by a test process that
/// was killed are removed by the next guard before it takes its snapshot.
pub struct HostsLines {
    original: Vec<u8>,
    _lock: MutexGuard<'static, ()>,
}

impl HostsLines {
    pub fn add(entries: &[(IpAddr, &str)]) -> Self {
        static LOCK: Mutex<()> = Mutex::new(());
        let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        sweep_stale_hosts_lines();
        let original = std::fs::read(HOSTS).expect("reading /etc/hosts");
        // From here on, Drop restores the snapshot.
        let guard = Self {
            original,
            _lock: lock,
        };
        let mut text = guard.original.clone();
        if !text.is_empty() && !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        for (ip, name) in entries {
            text.extend_from_slice(
                format!("{ip} {name} {HOSTS_MARK}{}\n", std::process::id()).as_bytes(),
            );
        }
        write_in_place(&text).expect("writing /etc/hosts");
        guard
    }

    /// The file as it was before the lines were added.
    pub fn original(&self) -> &[u8] {
        &self.original
    }
}

impl Drop for HostsLines {
    fn drop(&mut self) {
        if let Err(e) = write_in_place(&self.original) {
            eprintln!("restoring /etc/hosts failed: {e}");
        }
    }
}

fn write_in_place(bytes: &[u8]) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(HOSTS)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Drops lines marked by a test process that no longer exists.
fn sweep_stale_hosts_lines() {
    let Ok(text) = std::fs::read_to_string(HOSTS) else {
        return;
    };
    let stale = |line: &str| {
        line.split_once(HOSTS_MARK)
            .and_then(|(_, pid)| pid.trim().parse::<u32>().ok())
            .is_some_and(|pid| {
                pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            })
    };
    if text.lines().any(stale) {
        let kept: String = text.split_inclusive('\n').filter(|l| !stale(l)).collect();
        let _ = write_in_place(kept.as_bytes());
    }
}
