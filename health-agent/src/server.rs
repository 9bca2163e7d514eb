//! The HTTP side: `GET|HEAD /health` from the cached snapshot (nothing is computed per
//! request), `/metrics`, `/livez`. A hand-rolled hyper accept loop gives what the load
//! balancer's probes need from a port anyone may reach: a connection cap, a cap per client
//! address, a deadline on reading a request's head (which also ends idle keep-alive
//! connections), a deadline on a stalled write (a client that pipelines requests and never
//! reads the answers), a small header buffer, and graceful shutdown. Like nginx's workers, each HTTP thread runs its own
//! single-threaded runtime on its own SO_REUSEPORT listener: no cross-thread wakeups per request,
//! and the background checks (on the main runtime) never share a queue with the probes.

use std::{
    collections::HashMap,
    future::Future as _,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::Semaphore,
    time::Sleep,
};
use tokio_util::sync::CancellationToken;
use tower::Service as _;

use crate::{
    config::Details,
    metrics,
    snapshot::{Rendering, SharedSnapshot},
};

pub const HEALTH_JSON: &str = "application/health+json";

/// What the handlers share.
pub struct App {
    pub snapshot: SharedSnapshot,
    pub details: Details,
    /// The bearer token for `details = "token"`, read once at start.
    pub token: Option<String>,
    pub stale_after: Duration,
    /// Who may read the peer view.
    pub fleet_token: FleetToken,
    /// This host's name, in the peer view.
    pub host: String,
}

/// The peer endpoint's access rule (`fleet.token_env`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetToken {
    /// No token configured: anyone who reaches the health port may read it.
    Open,
    /// `Authorization: Bearer <token>` required.
    Required(String),
    /// A token is configured but its variable is empty: nobody may read it.
    Unset(String),
}

#[derive(Clone, Copy)]
struct Peer(SocketAddr);

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics_handler))
        .route(crate::fleet::VIEW_PATH, get(fleet_view))
        .with_state(app)
}

fn wants_details(app: &App, peer: Option<Peer>, headers: &HeaderMap) -> bool {
    match app.details {
        Details::Always => true,
        Details::Loopback => peer.is_some_and(|Peer(a)| is_loopback(a.ip())),
        Details::Token => {
            let Some(expected) = app.token.as_deref() else {
                return false;
            };
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()))
        }
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// Takes the request itself: an extracted HeaderMap would be a copy of every header, per probe.
async fn health(State(app): State<Arc<App>>, req: Request) -> Response {
    let headers = req.headers();
    let peer = req.extensions().get::<Peer>().copied();
    let snap = app.snapshot.load();
    let age = Instant::now().saturating_duration_since(snap.created);
    let ietf = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(HEALTH_JSON));
    if age > app.stale_after {
        return stale(age, ietf);
    }
    let details = wants_details(&app, peer, headers);
    let body = snap
        .body(match (ietf, details) {
            (false, true) => Rendering::Full,
            (false, false) => Rendering::Brief,
            (true, true) => Rendering::IetfFull,
            (true, false) => Rendering::IetfBrief,
        })
        .clone();
    let code = StatusCode::from_u16(snap.decision.http).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    respond(code, body, ietf, age)
}

/// The agent process itself: fine while its check loop keeps publishing snapshots. A loop
/// that is stuck or gone fails it, so a supervisor (systemd, Kubernetes) restarts the agent.
async fn livez(State(app): State<Arc<App>>) -> Response {
    let age = Instant::now().saturating_duration_since(app.snapshot.load().created);
    if age > app.stale_after {
        let msg = format!(
            "the check loop has not published a snapshot for {:.1}s\n",
            age.as_secs_f64()
        );
        return (StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    }
    "ok\n".into_response()
}

/// The compact peer view: this instance's raw check states, for its peers' judgement.
async fn fleet_view(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match &app.fleet_token {
        FleetToken::Open => {}
        FleetToken::Required(t)
            if given.is_some_and(|g| constant_time_eq(g.as_bytes(), t.as_bytes())) => {}
        FleetToken::Required(_) => {
            return (
                StatusCode::UNAUTHORIZED,
                "a valid fleet bearer token is required\n",
            )
                .into_response()
        }
        FleetToken::Unset(var) => {
            return (
                StatusCode::FORBIDDEN,
                format!("fleet.token_env names {var}, which is empty: the peer view is closed\n"),
            )
                .into_response()
        }
    }
    let snap = app.snapshot.load();
    let view = crate::fleet::PeerView::of(&snap.report, &app.host);
    let mut r = axum::Json(view).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn respond(code: StatusCode, body: Bytes, ietf: bool, age: Duration) -> Response {
    let mut r = (code, Body::from(body)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if ietf {
            HEALTH_JSON
        } else {
            "application/json"
        }),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        HeaderName::from_static("x-snapshot-age-ms"),
        HeaderValue::from(age.as_millis() as u64),
    );
    r
}

/// The check loop stopped: the agent can no longer vouch for the box.
fn stale(age: Duration, ietf: bool) -> Response {
    let reason = format!(
        "health snapshot is {:.1}s old: the agent's check loop has stopped",
        age.as_secs_f64()
    );
    let body = if ietf {
        serde_json::json!({"status": "fail", "notes": [reason]})
    } else {
        serde_json::json!({"status": "unhealthy", "recommendation": "stable", "reasons": [reason]})
    };
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from(body.to_string()),
        ietf,
        age,
    )
}

async fn metrics_handler(State(app): State<Arc<App>>, req: Request) -> Response {
    let peer = req.extensions().get::<Peer>().copied();
    let detailed = wants_details(&app, peer, req.headers());
    let snap = app.snapshot.load();
    let mut r = metrics::render(&snap, detailed).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// Binds `addr` `n` times with SO_REUSEPORT, so the kernel spreads connections over the
/// HTTP threads. Binding happens before anything starts, so a taken port fails early.
pub fn bind(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    // SO_REUSEPORT would let a second agent share the port without an error and quietly take
    // half the probes: a plain bind first fails if anything holds it.
    drop(std::net::TcpListener::bind(addr)?);
    (0..n.max(1))
        .map(|_| {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            s.set_reuse_port(true)?;
            s.set_nonblocking(true)?;
            s.bind(&addr.into())?;
            s.listen(1024)?;
            Ok(s.into())
        })
        .collect()
}

/// Settings every HTTP thread shares.
#[derive(Clone)]
pub struct Limits {
    /// Connection cap across all threads.
    pub slots: Arc<Semaphore>,
    /// Connection cap per client address, across all threads.
    pub clients: Arc<Clients>,
    /// Reading a request's head, from the moment the connection waits for one (so an idle
    /// keep-alive connection is closed after it too), and a write that makes no progress.
    pub header_timeout: Duration,
}

/// Open connections per client address, shared by every HTTP thread, so that one address (a
/// runaway script, a flood) cannot hold the slots the load balancer's probes need. A
/// connection over the cap is closed as soon as it is accepted.
pub struct Clients {
    max: u32,
    open: Mutex<HashMap<IpAddr, u32>>,
    refused: AtomicU64,
    last_warned: Mutex<Option<Instant>>,
}

impl Clients {
    pub fn new(max: u32) -> Self {
        Self {
            max,
            open: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
            last_warned: Mutex::new(None),
        }
    }

    /// A slot for one more connection from `ip`, None over the cap.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            drop(open);
            self.refused(ip);
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }

    fn refused(&self, ip: IpAddr) {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_warned.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(10)) {
            *last = Some(now);
            tracing::warn!(
                "{ip} holds server.max_connections_per_client ({}) connections: closing its \
                 new ones ({total} refused since start)",
                self.max
            );
        }
    }

    /// Connections closed at once because their address was over the cap, since start.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Open connections from `ip`.
    pub fn open_from(&self, ip: IpAddr) -> u32 {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

/// One admitted connection; gives its place back when dropped.
struct ClientSlot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A connection whose writes may stall at most `stall`: hyper has a deadline for reading a
/// request but none for writing the answer, so a client that pipelines requests and never
/// reads would hold its connection (and a slot) for as long as it likes. The timer exists only
/// while a write is stuck; a healthy connection never allocates one.
struct WriteDeadline<T> {
    io: T,
    stall: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    fn new(io: T, stall: Duration) -> Self {
        Self {
            io,
            stall,
            timer: None,
        }
    }

    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let stall = self.stall;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {}s", stall.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

/// Raises the soft limit on open files to the hard limit (systemd's default soft limit is
/// 1024, which a flood of connections to the health port would exhaust, starving the checks'
/// own sockets). Returns the soft limit in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        } else {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// File descriptors kept free for the checks (probe, sock_diag, /proc, Docker, databases,
/// alerts) however many HTTP connections are open.
pub const RESERVED_FDS: u64 = 256;

/// `server.max_connections`, lowered to what the open-files limit allows.
pub fn connection_cap(configured: usize, open_files: u64) -> usize {
    let room = open_files.saturating_sub(RESERVED_FDS).max(16);
    configured.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Runs one HTTP thread per listener, each with its own single-threaded runtime, until
/// `shutdown`. Returns when every thread has finished.
pub fn run_threads(
    listeners: Vec<std::net::TcpListener>,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let (router, limits, shutdown) = (router.clone(), limits.clone(), shutdown.clone());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("http-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(l) => serve(l, router, limits, shutdown).await,
                            Err(e) => {
                                tracing::error!("HTTP thread {i} cannot use its listener: {e}")
                            }
                        }
                    })
                })
        })
        .collect()
}

/// Serves `router` on `listener` until `shutdown`, then lets in-flight requests finish
/// (at most 5 s).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let Limits {
        slots,
        clients,
        header_timeout,
    } = limits;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(16 * 1024)
        .keep_alive(true);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept on the health port failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(client) = clients.admit(peer.ip()) else {
            // Over its address's cap: closed now, before it costs a task or a buffer.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(Peer(peer));
            let mut router = router.clone();
            async move { router.call(req.map(Body::new)).await }
        });
        let io = TokioIo::new(WriteDeadline::new(stream, header_timeout));
        let conn = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            let _ = conn.await;
            drop((permit, client));
        });
    }
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some health connections did not close within 5s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        checks::{ContainersReport, DatabaseReport, Report},
        heal::HealLog,
        policy::{evaluate, DiskLevel},
        snapshot::Snapshot,
    };
    use arc_swap::ArcSwap;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    fn report(disk: DiskLevel) -> Report {
        Report {
            web: crate::checks::web::WebReport::not_configured(),
            disk: crate::checks::disk::DiskReport {
                level: disk,
                mounts: Vec::new(),
            },
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        }
    }

    fn app(disk: DiskLevel, details: Details) -> Arc<App> {
        let r = report(disk);
        let d = evaluate(&r.policy_input(false));
        Arc::new(App {
            snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(
                d,
                r,
                HealLog::default(),
                100,
                5,
            ))),
            details,
            token: Some("s3cret".into()),
            stale_after: Duration::from_secs(10),
            fleet_token: FleetToken::Required("fl33t".into()),
            host: "web-1".into(),
        })
    }

    /// The real accept loop on 127.0.0.1, with `per_client` connections per address and
    /// `timeout` for request heads and stalled writes.
    async fn served(
        per_client: u32,
        timeout: Duration,
    ) -> (SocketAddr, Arc<Clients>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let clients = Arc::new(Clients::new(per_client));
        let limits = Limits {
            slots: Arc::new(Semaphore::new(64)),
            clients: clients.clone(),
            header_timeout: timeout,
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            router(app(DiskLevel::Ok, Details::Always)),
            limits,
            shutdown.clone(),
        ));
        (addr, clients, shutdown)
    }

    /// A blocking client socket bound to `from` (another loopback address is another client).
    fn connect_from(from: [u8; 4], to: SocketAddr) -> std::net::TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
        s.connect(&to.into()).unwrap();
        let s: std::net::TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// One request on `s`; the status code, or None when the server closed it.
    fn ask(s: &mut std::net::TcpStream, path: &str) -> Option<u16> {
        use std::io::{Read as _, Write as _};
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .ok()?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).ok()?;
        std::str::from_utf8(buf.get(9..12.min(n))?)
            .ok()?
            .parse()
            .ok()
    }

    async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        tokio::task::spawn_blocking(f).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_address_cannot_take_every_connection() {
        let (addr, clients, shutdown) = served(3, Duration::from_secs(30)).await;
        let (held, extra, other) = blocking(move || {
            let mut held: Vec<_> = (0..3).map(|_| connect_from([127, 0, 0, 1], addr)).collect();
            let answered: Vec<_> = held.iter_mut().map(|s| ask(s, "/livez")).collect();
            let extra = ask(&mut connect_from([127, 0, 0, 1], addr), "/livez");
            let other = ask(&mut connect_from([127, 0, 0, 2], addr), "/livez");
            (answered, extra, other)
        })
        .await;
        assert_eq!(held, [Some(200); 3], "the first three are served");
        assert_eq!(extra, None, "the fourth from the same address is closed");
        assert_eq!(other, Some(200), "another address is served meanwhile");
        assert_eq!(clients.refused_total(), 1);
        shutdown.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_never_reads_is_cut_off() {
        let (addr, clients, shutdown) = served(8, Duration::from_millis(500)).await;
        // Pipelines /metrics requests and never reads an answer: the server's writes fill both
        // socket buffers and stall.
        let flood = std::thread::spawn(move || {
            use std::io::Write as _;
            let mut s = connect_from([127, 0, 0, 1], addr);
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
            let mut sent = 0;
            while s.write_all(&req).is_ok() {
                sent += 1000;
            }
            (sent, s)
        });
        let deadline = Instant::now() + Duration::from_secs(3);
        while clients.open_from([127, 0, 0, 1].into()) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            clients.open_from([127, 0, 0, 1].into()),
            1,
            "the flood connected"
        );
        let cut = loop {
            if clients.open_from([127, 0, 0, 1].into()) == 0 {
                break Instant::now();
            }
            assert!(
                Instant::now() < deadline + Duration::from_secs(10),
                "never cut off"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (sent, _s) = blocking(move || flood.join().unwrap()).await;
        assert!(sent >= 1000, "it pipelined {sent} requests");
        // Another client is served the whole time, and after.
        let other = blocking(move || ask(&mut connect_from([127, 0, 0, 2], addr), "/health")).await;
        assert_eq!(other, Some(200));
        assert!(cut.elapsed() < Duration::from_secs(20));
        shutdown.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_keep_alive_connection_is_closed() {
        let (addr, clients, shutdown) = served(8, Duration::from_millis(300)).await;
        let (first, idle_for) = blocking(move || {
            use std::io::Read as _;
            let mut s = connect_from([127, 0, 0, 1], addr);
            let first = ask(&mut s, "/livez");
            let t = Instant::now();
            let mut buf = [0u8; 16];
            // EOF (Ok(0)) once the server gives up on the next request.
            let n = s.read(&mut buf).unwrap_or(0);
            (first.filter(|_| n == 0), t.elapsed())
        })
        .await;
        assert_eq!(
            first,
            Some(200),
            "answered, then closed with nothing more sent"
        );
        assert!(
            idle_for >= Duration::from_millis(250) && idle_for < Duration::from_secs(3),
            "closed after {idle_for:?} idle"
        );
        // Its place is given back once the connection's task ends (just after the close).
        let deadline = Instant::now() + Duration::from_secs(2);
        while clients.open_from([127, 0, 0, 1].into()) != 0 {
            assert!(Instant::now() < deadline, "the slot was never given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
    }

    #[test]
    fn the_connection_cap_fits_the_open_files_limit() {
        assert_eq!(connection_cap(1024, 1_048_576), 1024);
        assert_eq!(connection_cap(1024, 1024), 1024 - RESERVED_FDS as usize);
        assert_eq!(connection_cap(1024, 100), 16, "never below a handful");
    }

    #[tokio::test]
    async fn the_peer_view_needs_the_fleet_token() {
        let a = app(DiskLevel::Ok, Details::Always);
        let view = |auth: Option<&str>| {
            let mut r = req(crate::fleet::VIEW_PATH);
            if let Some(a) = auth {
                r = r.header(header::AUTHORIZATION, a);
            }
            r.body(Body::empty()).unwrap()
        };
        let resp = router(a.clone()).oneshot(view(None)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let resp = router(a.clone())
            .oneshot(view(Some("Bearer s3cret")))
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::UNAUTHORIZED,
            "the details token is not it"
        );
        let (code, _, body) = get(a, view(Some("Bearer fl33t"))).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body["version"], 1);
        assert_eq!(body["host"], "web-1");
        assert_eq!(body["web"], "not_configured");
        assert!(!body.to_string().contains("fl33t"));
    }

    async fn get(app: Arc<App>, req: Request<Body>) -> (StatusCode, HeaderMap, serde_json::Value) {
        let resp = router(app).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (parts.status, parts.headers, json)
    }

    fn req(uri: &str) -> axum::http::request::Builder {
        Request::builder().uri(uri)
    }

    #[tokio::test]
    async fn healthy_body_has_the_seed_fields() {
        let (code, headers, body) = get(
            app(DiskLevel::Ok, Details::Always),
            req("/health").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        assert_eq!(body["status"], "healthy");
        assert_eq!(body["uptime"], 100);
        assert_eq!(body["recommendation"], "stable");
        for k in [
            "webserver",
            "database",
            "disk",
            "containers",
            "cpu",
            "memory",
        ] {
            assert!(
                body["checks"].get(k).is_some(),
                "checks.{k} missing: {body}"
            );
        }
        assert!(body["details"]["heal"].is_object(), "{body}");
    }

    #[tokio::test]
    async fn full_disk_is_503_with_reason() {
        let (code, _, body) = get(
            app(DiskLevel::Fail, Details::Always),
            req("/health").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["status"], "unhealthy");
        assert!(
            body["reasons"][0].as_str().unwrap().contains("disk"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn head_has_no_body_and_same_code() {
        let resp = router(app(DiskLevel::Fail, Details::Always))
            .oneshot(req("/health").method("HEAD").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(bytes.is_empty());
    }

    #[tokio::test]
    async fn ietf_format_on_accept() {
        let (code, headers, body) = get(
            app(DiskLevel::Warn, Details::Always),
            req("/health")
                .header(header::ACCEPT, HEALTH_JSON)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], HEALTH_JSON);
        assert_eq!(body["status"], "warn");
        assert!(body["checks"]["disk:utilization"].is_array(), "{body}");
    }

    #[tokio::test]
    async fn details_only_for_loopback_or_token() {
        // No peer (not loopback): brief body.
        let (_, _, body) = get(
            app(DiskLevel::Ok, Details::Loopback),
            req("/health").body(Body::empty()).unwrap(),
        )
        .await;
        assert!(body.get("details").is_none(), "{body}");
        assert_eq!(body["status"], "healthy");
        let mut r = req("/health").body(Body::empty()).unwrap();
        r.extensions_mut()
            .insert(Peer("127.0.0.1:5000".parse().unwrap()));
        let (_, _, body) = get(app(DiskLevel::Ok, Details::Loopback), r).await;
        assert!(body.get("details").is_some());
        let mut r = req("/health").body(Body::empty()).unwrap();
        r.extensions_mut()
            .insert(Peer("10.1.2.3:5000".parse().unwrap()));
        let (_, _, body) = get(app(DiskLevel::Ok, Details::Loopback), r).await;
        assert!(body.get("details").is_none());

        let (_, _, body) = get(
            app(DiskLevel::Ok, Details::Token),
            req("/health")
                .header(header::AUTHORIZATION, "Bearer wrong")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert!(body.get("details").is_none());
        let (_, _, body) = get(
            app(DiskLevel::Ok, Details::Token),
            req("/health")
                .header(header::AUTHORIZATION, "Bearer s3cret")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert!(body.get("details").is_some());
    }

    #[tokio::test]
    async fn stale_snapshot_is_503() {
        let a = app(DiskLevel::Ok, Details::Always);
        let a = Arc::new(App {
            snapshot: a.snapshot.clone(),
            details: Details::Always,
            token: None,
            stale_after: Duration::ZERO,
            fleet_token: FleetToken::Open,
            host: "web-1".into(),
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (code, _, body) = get(a, req("/health").body(Body::empty()).unwrap()).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body["reasons"][0].as_str().unwrap().contains("check loop"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn metrics_and_livez_and_404() {
        let resp = router(app(DiskLevel::Ok, Details::Always))
            .oneshot(req("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let text = String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap();
        assert!(text.contains("health_agent_http_status 200"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        // server.details = "loopback": the mounts' names only for a loopback client.
        let metrics = |peer: &str| {
            let mut r = req("/metrics").body(Body::empty()).unwrap();
            r.extensions_mut().insert(Peer(peer.parse().unwrap()));
            r
        };
        let text = |resp: Response| async {
            let b = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(b.to_vec()).unwrap()
        };
        let mut a = app(DiskLevel::Ok, Details::Loopback);
        Arc::get_mut(&mut a).unwrap().snapshot = {
            let mut r = report(DiskLevel::Ok);
            r.disk.mounts.push(crate::checks::disk::MountUsage {
                path: "/srv/secret-project".into(),
                used_percent: 42.0,
                total_bytes: 1,
                available_bytes: 1,
                level: DiskLevel::Ok,
                error: None,
            });
            let d = evaluate(&r.policy_input(false));
            Arc::new(ArcSwap::from_pointee(Snapshot::new(
                d,
                r,
                HealLog::default(),
                1,
                1,
            )))
        };
        let local = text(
            router(a.clone())
                .oneshot(metrics("127.0.0.1:5000"))
                .await
                .unwrap(),
        )
        .await;
        assert!(local.contains("/srv/secret-project"), "{local}");
        let remote = text(router(a).oneshot(metrics("10.1.2.3:5000")).await.unwrap()).await;
        assert!(!remote.contains("/srv/secret-project"), "{remote}");
        assert!(
            remote.contains("health_agent_disk_used_ratio_max 0.42"),
            "{remote}"
        );
        let resp = router(app(DiskLevel::Ok, Details::Always))
            .oneshot(req("/livez").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = router(app(DiskLevel::Ok, Details::Always))
            .oneshot(req("/nope").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}
