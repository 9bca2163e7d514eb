//! Background traffic: HTTP clients hammering one path, on new connections or keep-alive ones,
//! counting what they got.
//!
//! Everything here runs on threads that stop on [`Load::stop`], on drop (a failing test), and
//! by themselves after [`MAX_RUN`] at the latest. Stopping shuts the clients' sockets down, so
//! it does not wait for a request that hangs.

use std::{
    collections::BTreeMap,
    fmt,
    io::{self, Read, Write},
    net::{Shutdown, SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// No load generator or poller runs longer than this, even when nobody stops it.
pub const MAX_RUN: Duration = Duration::from_secs(180);

/// What a [`Load`] got.
#[derive(Debug, Clone, Default)]
pub struct LoadStats {
    /// Answers by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests that got no answer within the timeout (connect, write or read).
    pub timeouts: u64,
    /// Other failures: refused, reset, closed without (a whole) answer, unparsable answer.
    pub errors: u64,
    /// Connections opened.
    pub connections: u64,
    /// Keep-alive clients: connections opened again after an error.
    pub reconnects: u64,
    /// Keep-alive clients: answers that carried `Connection: close` (the client reconnects).
    pub server_closes: u64,
    /// The slowest answer.
    pub max_latency: Duration,
    pub last_error: Option<String>,
    /// From start to stop.
    pub elapsed: Duration,
}

impl LoadStats {
    pub fn count(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// Answers of any status.
    pub fn answers(&self) -> u64 {
        self.by_status.values().sum()
    }

    fn answer(&mut self, status: u16, latency: Duration) {
        *self.by_status.entry(status).or_default() += 1;
        self.max_latency = self.max_latency.max(latency);
    }

    fn failure(&mut self, e: &io::Error) {
        if is_timeout(e) {
            self.timeouts += 1;
        } else {
            self.errors += 1;
        }
        self.last_error = Some(e.to_string());
    }
}

impl fmt::Display for LoadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "answers")?;
        if self.by_status.is_empty() {
            write!(f, " none")?;
        }
        for (code, n) in &self.by_status {
            write!(f, " {n}×{code}")?;
        }
        write!(
            f,
            ", {} timeouts, {} errors, {} connections ({} reconnects, {} server closes), slowest {} ms, over {:.1}s",
            self.timeouts,
            self.errors,
            self.connections,
            self.reconnects,
            self.server_closes,
            self.max_latency.as_millis(),
            self.elapsed.as_secs_f64()
        )?;
        if let Some(e) = &self.last_error {
            write!(f, "; last error: {e}")?;
        }
        Ok(())
    }
}

pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// State shared by the client threads of one [`Load`].
struct Shared {
    stop: AtomicBool,
    deadline: Instant,
    stats: Mutex<LoadStats>,
    /// Each client's current connection, so stopping can shut it down under a blocked read.
    sockets: Vec<Mutex<Option<TcpStream>>>,
}

impl Shared {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst) && Instant::now() < self.deadline
    }

    fn record(&self, f: impl FnOnce(&mut LoadStats)) {
        // Results of requests cut short by `stop` are not results.
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// Registers client `i`'s new connection; false when stopping (the caller gives up).
    fn register(&self, i: usize, s: &TcpStream) -> bool {
        if let (Ok(mut slot), Ok(clone)) = (self.sockets[i].lock(), s.try_clone()) {
            *slot = Some(clone);
        }
        self.running()
    }
}

/// HTTP clients hammering one path in the background.
pub struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// `clients` threads, each looping: open a new connection, `GET path` with
    /// `Connection: close`, read the whole answer, record it, then wait out the rest of
    /// `per_client_interval` (zero: back to back). `timeout` bounds connect, write and each read.
    pub fn new_connections(
        port: u16,
        path: &str,
        clients: usize,
        per_client_interval: Duration,
        timeout: Duration,
    ) -> Self {
        Self::new_connections_to(
            ([127, 0, 0, 1], port).into(),
            path,
            clients,
            per_client_interval,
            timeout,
        )
    }

    /// [`Load::new_connections`] to any address: `[::1]:PORT`, or an address inside a network
    /// namespace the test created.
    pub fn new_connections_to(
        addr: SocketAddr,
        path: &str,
        clients: usize,
        per_client_interval: Duration,
        timeout: Duration,
    ) -> Self {
        let path = path.to_string();
        Self::spawn(clients, move |shared, i| {
            new_connection_client(&shared, i, addr, &path, per_client_interval, timeout)
        })
    }

    /// `clients` threads, each keeping one HTTP/1.1 keep-alive connection and sending
    /// `GET path` on it back to back, reading each answer fully (Content-Length or chunked).
    /// A client opens a new connection only after an error (counted in `reconnects`) or when
    /// the server answered `Connection: close` (counted in `server_closes`).
    pub fn keep_alive(port: u16, path: &str, clients: usize, timeout: Duration) -> Self {
        let path = path.to_string();
        Self::spawn(clients, move |shared, i| {
            keep_alive_client(&shared, i, port, &path, timeout)
        })
    }

    fn spawn(clients: usize, client: impl Fn(Arc<Shared>, usize) + Send + Clone + 'static) -> Self {
        let started = Instant::now();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            deadline: started + MAX_RUN,
            stats: Mutex::new(LoadStats::default()),
            sockets: (0..clients).map(|_| Mutex::new(None)).collect(),
        });
        let threads = (0..clients)
            .map(|i| {
                let (shared, client) = (shared.clone(), client.clone());
                std::thread::spawn(move || client(shared, i))
            })
            .collect();
        Self {
            shared,
            threads,
            started,
        }
    }

    /// What was recorded so far (the load keeps running).
    pub fn stats(&self) -> LoadStats {
        let mut s = self
            .shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        s.elapsed = self.started.elapsed();
        s
    }

    /// Stops every client (cutting off requests in flight) and returns the totals.
    pub fn stop(mut self) -> LoadStats {
        let stats = self.stats();
        self.halt();
        stats
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for slot in &self.shared.sockets {
            if let Ok(Some(s)) = slot.lock().as_deref() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Sleeps until `until` or until the load stops, whichever is first.
fn pause(shared: &Shared, until: Instant) {
    while shared.running() {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

fn new_connection_client(
    shared: &Shared,
    i: usize,
    addr: SocketAddr,
    path: &str,
    interval: Duration,
    timeout: Duration,
) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    while shared.running() {
        let start = Instant::now();
        let result = (|| {
            let mut s = connect(addr, timeout)?;
            shared.record(|st| st.connections += 1);
            if !shared.register(i, &s) {
                return Ok(None);
            }
            s.write_all(request.as_bytes())?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw)?;
            parse_status(&raw).map(Some)
        })();
        match result {
            Ok(Some(code)) => shared.record(|st| st.answer(code, start.elapsed())),
            Ok(None) => {}
            Err(e) => shared.record(|st| st.failure(&e)),
        }
        // At least a little pause, so a refusing port does not make this spin.
        pause(shared, start + interval.max(Duration::from_millis(5)));
    }
}

type KeepAliveConn = Option<(TcpStream, Vec<u8>)>;

fn keep_alive_client(shared: &Shared, i: usize, port: u16, path: &str, timeout: Duration) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut conn: KeepAliveConn = None;
    let mut after_error = false;
    while shared.running() {
        let start = Instant::now();
        match keep_alive_request(shared, i, port, &request, timeout, &mut conn, after_error) {
            Ok(Some((code, close))) => {
                after_error = false;
                shared.record(|st| {
                    st.answer(code, start.elapsed());
                    if close {
                        st.server_closes += 1;
                    }
                });
                if close {
                    conn = None;
                }
            }
            Ok(None) => {}
            Err(e) => {
                shared.record(|st| st.failure(&e));
                conn = None;
                after_error = true;
                pause(shared, start + Duration::from_millis(5));
            }
        }
    }
}

/// One request on the client's connection, opening it first when there is none.
fn keep_alive_request(
    shared: &Shared,
    i: usize,
    port: u16,
    request: &str,
    timeout: Duration,
    conn: &mut KeepAliveConn,
    after_error: bool,
) -> io::Result<Option<(u16, bool)>> {
    if conn.is_none() {
        let s = connect(([127, 0, 0, 1], port).into(), timeout)?;
        shared.record(|st| {
            st.connections += 1;
            if after_error {
                st.reconnects += 1;
            }
        });
        if !shared.register(i, &s) {
            return Ok(None);
        }
        *conn = Some((s, Vec::new()));
    }
    let (s, buf) = conn.as_mut().expect("connected above");
    s.write_all(request.as_bytes())?;
    read_response(s, buf).map(Some)
}

pub(crate) fn parse_status(raw: &[u8]) -> io::Result<u16> {
    let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(raw.len());
    let line = String::from_utf8_lossy(&raw[..line_end]);
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next().and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => Ok(code),
        _ if raw.is_empty() => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed without an answer",
        )),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad status line {line:?}"),
        )),
    }
}

/// Reads more into `buf`; EOF is an error (the answer is incomplete).
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    let n = s.read(&mut chunk)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of an answer",
        ));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// One whole answer from a keep-alive connection: (status, the server will close). Bytes
/// after it stay in `buf`.
pub(crate) fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<(u16, bool)> {
    let head_end = loop {
        if let Some(p) = find(buf, b"\r\n\r\n", 0) {
            break p;
        }
        fill(s, buf)?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let code = parse_status(head.as_bytes())?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_ascii_lowercase())
        })
    };
    let close =
        head.starts_with("HTTP/1.0") || header("connection").is_some_and(|v| v.contains("close"));
    let body_start = head_end + 4;
    let end = if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad Content-Length {len:?}"),
            )
        })?;
        while buf.len() < body_start + len {
            fill(s, buf)?;
        }
        body_start + len
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut pos = body_start;
        loop {
            let line_end = loop {
                if let Some(p) = find(buf, b"\r\n", pos) {
                    break p;
                }
                fill(s, buf)?;
            };
            let size_text = String::from_utf8_lossy(&buf[pos..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad chunk {size_text:?}"),
                    )
                })?;
            if size == 0 {
                // No trailers expected: the empty line ends the answer.
                while buf.len() < line_end + 4 {
                    fill(s, buf)?;
                }
                break line_end + 4;
            }
            pos = line_end + 2 + size + 2;
            while buf.len() < pos {
                fill(s, buf)?;
            }
        }
    } else if close {
        // Delimited by the close.
        loop {
            match fill(s, buf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break buf.len(),
                Err(e) => return Err(e),
            }
        }
    } else {
        // 1xx/204/304 carry no body; anything else without a length is unusable here.
        if !(code < 200 || code == 204 || code == 304) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "keep-alive answer without Content-Length or chunked encoding",
            ));
        }
        body_start
    };
    buf.drain(..end);
    Ok((code, close))
}
