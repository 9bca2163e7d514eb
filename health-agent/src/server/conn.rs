//! The accept loop's protection: SO_REUSEPORT listeners, one single-threaded runtime per HTTP
//! thread, the connection cap across threads and per client address (`Clients`), a deadline
//! on reading a request's head, a deadline on a stalled write (`WriteDeadline`), and the
//! open-files limit the caps must fit in.

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

use axum::{body::Body, extract::Request, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::Semaphore,
    time::Sleep,
};
use tokio_util::sync::CancellationToken;
use tower::Service as _;

use super::Peer;

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
