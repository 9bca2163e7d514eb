//! The fleet harness: stub HTTP servers (peers that misbehave, a stand-in for Consul's
//! catalog), temporary `/etc/hosts` lines for `fleet.peers_dns`, and reading `/metrics`.
//! Agents on their own loopback addresses (127.0.0.2, 127.0.0.3, …, so two of them can share a
//! port the way a fleet's hosts do) are [`crate::Agent::start_at`], polled by
//! [`crate::HealthPoller::start_at`]. Everything here stays on 127.0.0.0/8, and every guard
//! cleans up on drop, after a panic too.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::load::MAX_RUN;
pub use crate::{
    http::request_at,
    net::{free_port_on_all, loopback},
    poller::Timed,
};

/// The value of an unlabelled gauge in a Prometheus text exposition.
pub fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
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
        crate::http::header(&self.headers, name)
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
