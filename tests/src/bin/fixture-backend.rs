//! A stand-in for a web backend (think Puma behind a load balancer) that can be
//! made to hang, at run time, in each of the shapes we see in production.
//!
//! The health agent decides "this backend is hung" from kernel-side signals
//! (accept queue depth, requests read but never answered, crash loops), so the
//! integration tests need a backend that reproduces those shapes on demand
//! without depending on a real Ruby stack. This binary is that backend. It is
//! deliberately dependency-light (std + libc) so it links statically and can be
//! copied into a `FROM scratch` image: no DNS, no NSS, no TLS.
//!
//! ```text
//! fixture-backend --listen 127.0.0.1:9000 [--control 127.0.0.1:9001]
//!                 [--mode MODE] [--delay-ms N] [--backlog N]
//! ```
//!
//! Modes (switchable through the control port, which never hangs):
//!
//! * `normal`         – every request gets `200 OK`, body `ok\n`; keep-alive.
//! * `slow`           – like `normal`, but waits `delay_ms` before answering.
//! * `stop-accepting` – the listening socket stays open but `accept()` is no
//!   longer called, so the kernel keeps completing handshakes into the accept
//!   queue (Recv-Q grows) – the "all workers busy / deadlocked acceptor" shape.
//!   Connections that were already accepted keep being served.
//! * `no-respond`     – requests are read completely and then never answered;
//!   the connection is held open until the peer gives up or the mode changes
//!   (then the pending request is answered according to the new mode).
//! * `exit`           – the process exits with code 3 (at start-up, too), to
//!   emulate a crash-looping container.
//! * `error`          – every request gets `500 Internal Server Error`.
//!
//! Control port (plain HTTP, one request per connection):
//!
//! * `GET /mode`                            → current mode name
//! * `GET|POST /mode/<name>[?delay_ms=N]`   → switch mode, `ok\n`
//! * `GET /stats` → `{"accepted":N,"requests":N,"responses":N,"mode":"..."}`
//!   (web port counters since start)

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const USAGE: &str = "usage: fixture-backend --listen IP:PORT [--control IP:PORT] \
[--mode normal|slow|stop-accepting|no-respond|exit|error] [--delay-ms N] [--backlog N] [--workers N]";

/// Exit code for the `exit` mode; distinct from 1 (panic/failure) and 2
/// (usage) so tests can tell a deliberate crash from a broken fixture.
const EXIT_MODE_CODE: i32 = 3;

/// How often parked code paths look at the mode again. Tests expect a mode
/// switch to take effect within ~50 ms.
const MODE_POLL: Duration = Duration::from_millis(20);

/// Bound on request head size so a misbehaving client cannot make a
/// connection thread buffer without limit.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Mode {
    Normal = 0,
    Slow = 1,
    StopAccepting = 2,
    NoRespond = 3,
    Exit = 4,
    Error = 5,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "normal" => Mode::Normal,
            "slow" => Mode::Slow,
            "stop-accepting" | "stop_accepting" => Mode::StopAccepting,
            "no-respond" | "no_respond" => Mode::NoRespond,
            "exit" => Mode::Exit,
            "error" => Mode::Error,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Slow => "slow",
            Mode::StopAccepting => "stop-accepting",
            Mode::NoRespond => "no-respond",
            Mode::Exit => "exit",
            Mode::Error => "error",
        }
    }

    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Slow,
            2 => Mode::StopAccepting,
            3 => Mode::NoRespond,
            4 => Mode::Exit,
            5 => Mode::Error,
            _ => Mode::Normal,
        }
    }
}

/// Everything shared between the accept loop, connection threads and the
/// control server. Atomics rather than a lock so that a connection stuck in
/// any mode can never block the control port.
struct Shared {
    mode: AtomicU8,
    delay_ms: AtomicU64,
    accepted: AtomicU64,
    requests: AtomicU64,
    responses: AtomicU64,
    /// Connections being served now, and the cap (`--workers`, 0 = none).
    active: AtomicU64,
    max_workers: u64,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

struct Config {
    listen: SocketAddr,
    control: Option<SocketAddr>,
    mode: Mode,
    delay_ms: u64,
    backlog: i32,
    workers: u64,
}

fn usage_error(msg: &str) -> ! {
    eprintln!("fixture-backend: {msg}\n{USAGE}");
    process::exit(2);
}

fn parse_addr(flag: &str, value: &str) -> SocketAddr {
    // Only literal addresses: resolving names would pull in NSS, which does
    // not work in a static binary inside a scratch image.
    value.parse().unwrap_or_else(|_| {
        usage_error(&format!(
            "{flag}: expected a literal IP:PORT (e.g. 127.0.0.1:9000), got {value:?}"
        ))
    })
}

fn parse_args() -> Config {
    let mut listen = None;
    let mut control = None;
    let mut mode = Mode::Normal;
    let mut delay_ms = 500u64;
    let mut backlog = 128i32;
    let mut workers = 0u64;

    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            process::exit(0);
        }
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let known = [
            "--listen",
            "--control",
            "--mode",
            "--delay-ms",
            "--backlog",
            "--workers",
        ];
        if !known.contains(&flag.as_str()) {
            usage_error(&format!("unknown argument {arg:?}"));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => usage_error(&format!("{flag} needs a value")),
        };
        match flag.as_str() {
            "--listen" => listen = Some(parse_addr(&flag, &value)),
            "--control" => control = Some(parse_addr(&flag, &value)),
            "--mode" => {
                mode = Mode::parse(&value)
                    .unwrap_or_else(|| usage_error(&format!("unknown mode {value:?}")))
            }
            "--delay-ms" => {
                delay_ms = value.parse().unwrap_or_else(|_| {
                    usage_error(&format!("--delay-ms: not a number: {value:?}"))
                })
            }
            "--backlog" => {
                backlog = match value.parse::<i32>() {
                    Ok(n) if n > 0 => n,
                    _ => usage_error(&format!(
                        "--backlog: expected a positive integer, got {value:?}"
                    )),
                }
            }
            "--workers" => {
                workers = value
                    .parse()
                    .unwrap_or_else(|_| usage_error(&format!("--workers: not a number: {value:?}")))
            }
            _ => unreachable!("flag checked against the known list above"),
        }
    }

    let listen = listen.unwrap_or_else(|| usage_error("--listen is required"));
    Config {
        listen,
        control,
        mode,
        delay_ms,
        backlog,
        workers,
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// std's `TcpListener::bind` hard-codes a backlog of 128, and the accept queue
/// length is exactly what the stop-accepting tests observe, so the socket is
/// built by hand.
fn bind_listener(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; the returned fd is immediately owned below.
    let raw = cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a fresh, valid fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };

    // Tests restart the fixture on the same port quickly; without this the
    // bind would fail while old connections sit in TIME_WAIT.
    let one: libc::c_int = 1;
    // SAFETY: pointer/len describe `one`, which outlives the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;

    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned
            // for any sockaddr type.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &storage as *const _ as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    })?;
    // SAFETY: plain syscall on an fd we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(TcpListener::from(fd))
}

/// Wait up to `timeout_ms` for any of `events` on `fd`. Returns the revents
/// (0 on timeout or EINTR).
fn poll_fd(
    fd: libc::c_int,
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(if rc == 0 { 0 } else { pfd.revents })
}

/// The web port's accept loop.
///
/// Rather than sitting in a blocking `accept()` (which could not notice a
/// switch to `stop-accepting` until the next client arrived, and would then
/// accept that one client), the loop polls the listener for readiness with a
/// short timeout and re-reads the mode right before each `accept()`. A mode
/// switch therefore takes effect within ~20 ms; the only leak is the
/// microsecond window between that final mode check and `accept()`, in which
/// at most one more connection may be accepted.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let lfd = listener.as_raw_fd();
    loop {
        // Like Puma's thread pool: with every worker busy, the server does not accept, and
        // the kernel queues the handshakes. Progress continues as workers free up.
        let max = shared.max_workers;
        if max > 0 && shared.active.load(Ordering::SeqCst) >= max {
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        if shared.mode() == Mode::StopAccepting {
            // Not calling accept() is the whole point: the kernel keeps
            // queueing completed handshakes, which is what the agent sees.
            thread::sleep(MODE_POLL);
            continue;
        }
        match poll_fd(lfd, libc::POLLIN, MODE_POLL.as_millis() as libc::c_int) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => {
                eprintln!("fixture-backend: poll on listener failed: {e}");
                thread::sleep(MODE_POLL);
                continue;
            }
        }
        if shared.mode() == Mode::StopAccepting {
            continue;
        }
        match listener.accept() {
            Ok((stream, _peer)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.active.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        serve_web_connection(stream, &shared);
                        shared.active.fetch_sub(1, Ordering::SeqCst);
                    });
                if let Err(e) = spawned {
                    // The stream was moved into the closure and is dropped
                    // (closed) with it; nothing else to clean up.
                    eprintln!("fixture-backend: cannot spawn connection thread: {e}");
                }
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning, the
                // pending connection stays queued for the next attempt.
                eprintln!("fixture-backend: accept failed: {e}");
                thread::sleep(MODE_POLL);
            }
        }
    }
}

struct Request {
    method: String,
    target: String,
    keep_alive: bool,
}

enum ReadOutcome {
    Request(Request),
    /// Peer closed cleanly between requests.
    Closed,
    /// Unparseable or oversized head; answer 400 and close.
    Malformed,
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    // Tolerate bare-LF clients (hand-written nc/printf tests) as well as CRLF.
    for i in 0..buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
    }
    None
}

/// Reads one request (head plus a Content-Length body, which is discarded)
/// from `stream`. `buf` carries bytes already read past the previous request
/// so pipelined requests are not lost.
fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<ReadOutcome> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        // Blank lines between requests are allowed (RFC 9112 §2.2).
        let leading = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        buf.drain(..leading);
        if let Some(end) = find_head_end(buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            return Ok(ReadOutcome::Malformed);
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return if buf.is_empty() {
                Ok(ReadOutcome::Closed)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };

    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);

    let mut lines = head.lines().map(|l| l.trim_end_matches('\r'));
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split_ascii_whitespace();
    let (method, target, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/1.") => (m, t, v),
        _ => return Ok(ReadOutcome::Malformed),
    };

    let mut content_length: u64 = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse() {
                Ok(n) => content_length = n,
                Err(_) => return Ok(ReadOutcome::Malformed),
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',') {
                let token = token.trim();
                conn_close |= token.eq_ignore_ascii_case("close");
                conn_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
    }

    // Discard the body without buffering all of it.
    let mut remaining = content_length;
    let from_buf = remaining.min(buf.len() as u64) as usize;
    buf.drain(..from_buf);
    remaining -= from_buf as u64;
    while remaining > 0 {
        let want = remaining.min(chunk.len() as u64) as usize;
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => remaining -= n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }

    let keep_alive = if version == "HTTP/1.0" {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    Ok(ReadOutcome::Request(Request {
        method: method.to_string(),
        target: target.to_string(),
        // Bodies are only framed by Content-Length here; after a chunked body
        // we cannot find the next request, so the connection must end.
        keep_alive: keep_alive && !chunked,
    }))
}

fn write_response(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    content_type: &str,
    keep_alive: bool,
    head_only: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    if !head_only {
        out.push_str(body);
    }
    // One write so the response leaves in a single segment where possible.
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

enum Parked {
    PeerGone,
    ModeChanged,
}

/// Holds a connection whose request was read but will not be answered, the
/// way a wedged worker does. Only the peer going away or a mode change ends
/// the wait; we never close first, because the agent must see the request
/// outstanding on an open socket.
fn park_no_respond(stream: &TcpStream, shared: &Shared) -> Parked {
    loop {
        if shared.mode() != Mode::NoRespond {
            return Parked::ModeChanged;
        }
        // POLLRDHUP rather than POLLIN: a pipelined follow-up request would
        // make POLLIN fire continuously, while we only care about the FIN.
        match poll_fd(
            stream.as_raw_fd(),
            libc::POLLRDHUP,
            MODE_POLL.as_millis() as libc::c_int,
        ) {
            Ok(0) => {}
            Ok(_) | Err(_) => return Parked::PeerGone,
        }
    }
}

fn serve_web_connection(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let req = match read_request(&mut stream, &mut buf) {
            Ok(ReadOutcome::Request(r)) => r,
            Ok(ReadOutcome::Closed) | Err(_) => return,
            Ok(ReadOutcome::Malformed) => {
                if write_response(
                    &mut stream,
                    "400 Bad Request",
                    "bad request\n",
                    "text/plain",
                    false,
                    false,
                )
                .is_ok()
                {
                    shared.responses.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
        };
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let head_only = req.method.eq_ignore_ascii_case("HEAD");

        // The mode is sampled after the request is read, so a keep-alive
        // connection follows mode switches request by request.
        let (status, body) = loop {
            match shared.mode() {
                Mode::Normal | Mode::StopAccepting => break ("200 OK", "ok\n"),
                Mode::Slow => {
                    thread::sleep(Duration::from_millis(
                        shared.delay_ms.load(Ordering::SeqCst),
                    ));
                    break ("200 OK", "ok\n");
                }
                Mode::Error => break ("500 Internal Server Error", "error\n"),
                Mode::NoRespond => match park_no_respond(&stream, shared) {
                    Parked::PeerGone => return,
                    // Answer the held request per the new mode, like a
                    // worker that finally gets unstuck.
                    Parked::ModeChanged => continue,
                },
                Mode::Exit => process::exit(EXIT_MODE_CODE),
            }
        };
        if write_response(
            &mut stream,
            status,
            body,
            "text/plain",
            req.keep_alive,
            head_only,
        )
        .is_err()
        {
            return;
        }
        shared.responses.fetch_add(1, Ordering::SeqCst);
        if !req.keep_alive {
            return;
        }
    }
}

fn control_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fixture-backend: control accept failed: {e}");
                thread::sleep(MODE_POLL);
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("control".into())
            .stack_size(256 * 1024)
            .spawn(move || serve_control_connection(stream, &shared));
        if let Err(e) = spawned {
            eprintln!("fixture-backend: cannot spawn control thread: {e}");
        }
    }
}

fn serve_control_connection(mut stream: TcpStream, shared: &Shared) {
    // A stuck test client must not pin a control thread forever.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let req = match read_request(&mut stream, &mut buf) {
        Ok(ReadOutcome::Request(r)) => r,
        Ok(ReadOutcome::Closed) | Err(_) => return,
        Ok(ReadOutcome::Malformed) => {
            let _ = write_response(
                &mut stream,
                "400 Bad Request",
                "bad request\n",
                "text/plain",
                false,
                false,
            );
            return;
        }
    };
    let head_only = req.method.eq_ignore_ascii_case("HEAD");
    let (path, query) = match req.target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (req.target.as_str(), ""),
    };
    let is_get = req.method.eq_ignore_ascii_case("GET") || head_only;
    let is_post = req.method.eq_ignore_ascii_case("POST");

    let mut exit_after_reply = false;
    let (status, body, ctype): (&str, String, &str) = if path == "/mode" && is_get {
        ("200 OK", shared.mode().name().to_string(), "text/plain")
    } else if path == "/stats" && is_get {
        let json = format!(
            "{{\"accepted\":{},\"requests\":{},\"responses\":{},\"mode\":\"{}\"}}",
            shared.accepted.load(Ordering::SeqCst),
            shared.requests.load(Ordering::SeqCst),
            shared.responses.load(Ordering::SeqCst),
            shared.mode().name(),
        );
        ("200 OK", json, "application/json")
    } else if let Some(name) = path.strip_prefix("/mode/").filter(|_| is_get || is_post) {
        match (Mode::parse(name), parse_delay(query)) {
            (None, _) => (
                "400 Bad Request",
                format!("unknown mode {name:?}\n"),
                "text/plain",
            ),
            (_, Err(msg)) => ("400 Bad Request", msg, "text/plain"),
            (Some(mode), Ok(delay)) => {
                if let Some(d) = delay {
                    shared.delay_ms.store(d, Ordering::SeqCst);
                }
                eprintln!(
                    "fixture-backend: mode -> {} (delay_ms {})",
                    mode.name(),
                    shared.delay_ms.load(Ordering::SeqCst)
                );
                if mode == Mode::Exit {
                    // Reply first so the test's control call does not itself
                    // look like a failure, then die.
                    exit_after_reply = true;
                }
                shared.set_mode(mode);
                ("200 OK", "ok\n".to_string(), "text/plain")
            }
        }
    } else {
        ("404 Not Found", "not found\n".to_string(), "text/plain")
    };
    let _ = write_response(&mut stream, status, &body, ctype, false, head_only);
    if exit_after_reply {
        eprintln!("fixture-backend: exiting with code {EXIT_MODE_CODE} (mode exit)");
        process::exit(EXIT_MODE_CODE);
    }
}

fn parse_delay(query: &str) -> Result<Option<u64>, String> {
    for pair in query.split('&') {
        if let Some(v) = pair.strip_prefix("delay_ms=") {
            return v
                .parse()
                .map(Some)
                .map_err(|_| format!("delay_ms: not a number: {v:?}\n"));
        }
    }
    Ok(None)
}

fn main() {
    let cfg = parse_args();

    if cfg.mode == Mode::Exit {
        // The crash-loop shape: die before ever listening, every start.
        eprintln!("fixture-backend: mode exit, exiting with code {EXIT_MODE_CODE}");
        process::exit(EXIT_MODE_CODE);
    }

    let shared = Arc::new(Shared {
        mode: AtomicU8::new(cfg.mode as u8),
        delay_ms: AtomicU64::new(cfg.delay_ms),
        accepted: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        responses: AtomicU64::new(0),
        active: AtomicU64::new(0),
        max_workers: cfg.workers,
    });

    let listener = bind_listener(cfg.listen, cfg.backlog).unwrap_or_else(|e| {
        eprintln!("fixture-backend: cannot listen on {}: {e}", cfg.listen);
        process::exit(1);
    });
    // Report the real address so `--listen 127.0.0.1:0` is usable.
    let listen_addr = listener.local_addr().map_or(cfg.listen, |a| a);

    let control_desc = match cfg.control {
        Some(addr) => {
            let control = bind_listener(addr, 128).unwrap_or_else(|e| {
                eprintln!("fixture-backend: cannot listen on control {addr}: {e}");
                process::exit(1);
            });
            let control_addr = control.local_addr().map_or(addr, |a| a);
            let shared = Arc::clone(&shared);
            if let Err(e) = thread::Builder::new()
                .name("control-accept".into())
                .spawn(move || control_loop(control, shared))
            {
                eprintln!("fixture-backend: cannot start control server: {e}");
                process::exit(1);
            }
            control_addr.to_string()
        }
        None => "none".to_string(),
    };

    eprintln!(
        "fixture-backend listening on {listen_addr} (mode {}), control on {control_desc}",
        cfg.mode.name()
    );
    accept_loop(listener, shared);
}
