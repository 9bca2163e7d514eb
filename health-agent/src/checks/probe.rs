//! The active probe: `GET <probe_path>` at the listener's own address (127.0.0.1, ::1 or the
//! specific address it is bound to), inside its network namespace, with a timeout. It gives
//! evidence when there is no real traffic, and the kernel view sees it like any other request.
//! A probe the agent cannot even make (no namespace entry, no socket, no such local address,
//! no permission) is the agent's own error, never evidence against the backend; for a `::`
//! listener in a namespace without IPv6 it tries 127.0.0.1 instead of `::1`.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::netns::Namespace;

/// Where the probe goes: the web monitor sets it from the listeners it sees.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    pub addr: SocketAddr,
    /// Tried when `addr` cannot even be tried (`cannot_be_tried`): 127.0.0.1 for a dual-stack
    /// `::` listener in a namespace without IPv6.
    pub fallback: Option<SocketAddr>,
    pub ns: Arc<Namespace>,
}

/// The monitor writes it, the probe task reads it; None until the backend's namespace is known.
pub type SharedProbeTarget = Arc<Mutex<Option<ProbeTarget>>>;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeResult {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(serialize_with = "crate::text::shown::ms")]
    pub latency_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The backend did not answer within the timeout (as opposed to refusing or erroring).
    pub timed_out: bool,
    /// The connection was refused: nothing listens at the probe's address. With a listener in
    /// view that is the probe's problem (a wrong address), not the backend's.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The agent could not make the probe at all: out of file descriptors, local ports or
    /// memory. That says nothing about the backend, so it is never evidence against it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub agent_error: bool,
    /// Where it went, e.g. `127.0.0.1:9000`, `[::1]:9000`.
    pub target: String,
}

pub async fn probe(target: &ProbeTarget, path: &str, timeout: Duration) -> ProbeResult {
    let start = Instant::now();
    // Where the request went: the fallback once the first address could not be tried.
    let tried = Arc::new(Mutex::new(target.addr));
    let outcome = tokio::time::timeout(timeout, request(target, path, timeout, &tried)).await;
    let latency_ms = start.elapsed().as_secs_f64() * 1000.0;
    let target_text = tried.lock().unwrap_or_else(|e| e.into_inner()).to_string();
    let failed = |error: String, timed_out: bool, refused: bool, agent_error: bool| ProbeResult {
        ok: false,
        status: None,
        latency_ms,
        error: Some(error),
        timed_out,
        refused,
        agent_error,
        target: target_text.clone(),
    };
    match outcome {
        Err(_) => failed(
            format!("no answer within {}ms", timeout.as_millis()),
            true,
            false,
            false,
        ),
        Ok(Err(e)) => failed(
            e.to_string(),
            false,
            e.kind() == std::io::ErrorKind::ConnectionRefused,
            is_agent_error(&e),
        ),
        Ok(Ok(status)) => ProbeResult {
            ok: (200..400).contains(&status),
            status: Some(status),
            latency_ms,
            error: None,
            timed_out: false,
            refused: false,
            agent_error: false,
            target: target_text,
        },
    }
}

/// Errors that are the agent's own: the backend was never asked. It ran out of something
/// (descriptors, buffers, memory), could not enter the namespace or make the socket there, had
/// no permission, or the address cannot be used from here (no such local address, no such
/// family, no route). Only the backend's own behaviour — a refusal, a reset, a timeout, an
/// error status — is evidence against it.
fn is_agent_error(e: &std::io::Error) -> bool {
    cannot_be_tried(e)
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EMFILE
                    | libc::ENFILE
                    | libc::ENOBUFS
                    | libc::ENOMEM
                    | libc::EPERM
                    | libc::EACCES
                    | libc::EINVAL
            )
        )
}

/// The address cannot even be tried from this namespace: `::1` where IPv6 is off, an address
/// family the kernel lacks. Another address of the same listener may still work.
fn cannot_be_tried(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT | libc::ENETUNREACH)
    )
}

/// How long a probe connection's local address is remembered: longer than the backend may keep
/// its side of the connection after the probe closed its own.
const OWN_KEEP: Duration = Duration::from_secs(30);

/// The local addresses of this process's recent probe connections, newest last.
static OWN: Mutex<std::collections::VecDeque<(Instant, SocketAddr)>> =
    Mutex::new(std::collections::VecDeque::new());

/// The local addresses of the agent's own probe connections of the last OWN_KEEP: the drain
/// leaves them out of what still reaches the backend.
pub fn own_sources() -> Vec<SocketAddr> {
    let own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    own.iter().map(|(_, a)| *a).collect()
}

/// Probes begun since the agent started, counted before they connect: the kernel's count of
/// arrivals less these is what others sent.
static PROBES_STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn probes_started() -> u64 {
    PROBES_STARTED.load(std::sync::atomic::Ordering::Relaxed)
}

fn note_own(local: SocketAddr) {
    let now = Instant::now();
    let mut own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    while own
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > OWN_KEEP)
    {
        own.pop_front();
    }
    own.push_back((now, local));
}

/// Probes wherever the web monitor last saw the backend listen; None before it has.
pub async fn probe_shared(
    target: &SharedProbeTarget,
    path: &str,
    timeout: Duration,
) -> Option<ProbeResult> {
    let current = target.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
    Some(probe(&current, path, timeout).await)
}

/// Connects to `addr`, else — when that cannot even be tried — to `fallback`, noting in
/// `tried` where it went.
fn connect_blocking(
    addr: SocketAddr,
    fallback: Option<SocketAddr>,
    timeout: Duration,
    tried: &Mutex<SocketAddr>,
) -> std::io::Result<std::net::TcpStream> {
    match std::net::TcpStream::connect_timeout(&addr, timeout) {
        Err(e) if cannot_be_tried(&e) => {
            let Some(other) = fallback else {
                return Err(e);
            };
            *tried.lock().unwrap_or_else(|p| p.into_inner()) = other;
            std::net::TcpStream::connect_timeout(&other, timeout)
        }
        r => r,
    }
}

async fn connect(
    target: &ProbeTarget,
    timeout: Duration,
    tried: &Arc<Mutex<SocketAddr>>,
) -> std::io::Result<TcpStream> {
    let (ns, addr, fallback, tried) = (
        target.ns.clone(),
        target.addr,
        target.fallback,
        tried.clone(),
    );
    if ns.is_own() && fallback.is_none() {
        return TcpStream::connect(addr).await;
    }
    // The socket must be made inside the backend's namespace: connect on a thread that entered
    // it, then hand the connected socket to tokio.
    let stream = tokio::task::spawn_blocking(move || {
        ns.run(|| {
            let s = connect_blocking(addr, fallback, timeout, &tried)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    })
    .await
    .map_err(std::io::Error::other)??;
    TcpStream::from_std(stream)
}

async fn request(
    target: &ProbeTarget,
    path: &str,
    timeout: Duration,
    tried: &Arc<Mutex<SocketAddr>>,
) -> std::io::Result<u16> {
    PROBES_STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut s = connect(target, timeout, tried).await?;
    if let Ok(local) = s.local_addr() {
        note_own(local);
    }
    let host = *tried.lock().unwrap_or_else(|e| e.into_inner());
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: health-agent\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    // The status line is all we need.
    while n < 12 {
        let r = s.read(&mut buf[n..]).await?;
        if r == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a status line",
            ));
        }
        n += r;
    }
    parse_status(&buf[..n]).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP status line")
    })
}

fn parse_status(b: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(b.get(..12)?).ok()?;
    if !s.starts_with("HTTP/1.") {
        return None;
    }
    s.get(9..12)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn running_out_of_descriptors_is_the_agents_own_error() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_agent_error(&emfile));
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(!is_agent_error(&refused));
        let reset = std::io::Error::from_raw_os_error(libc::ECONNRESET);
        assert!(!is_agent_error(&reset));
    }

    #[test]
    fn status_line() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH"), None);
    }

    #[tokio::test]
    async fn answers_refuses_and_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 256];
            let _ = s.read(&mut b).await;
            s.write_all(b"HTTP/1.1 503 Unavailable\r\n\r\n")
                .await
                .unwrap();
            // Second connection: read and never answer.
            let (mut s2, _) = l.accept().await.unwrap();
            let _ = s2.read(&mut b).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let ns = Arc::new(Namespace::own().unwrap());
        let at = |port| ProbeTarget {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            fallback: None,
            ns: ns.clone(),
        };
        let r = probe(&at(port), "/up", Duration::from_secs(2)).await;
        assert_eq!((r.ok, r.status), (false, Some(503)));
        assert_eq!(r.target, format!("127.0.0.1:{port}"));
        let r = probe(&at(port), "/up", Duration::from_millis(200)).await;
        assert!(r.timed_out && !r.ok, "{r:?}");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cport = closed.local_addr().unwrap().port();
        drop(closed);
        let r = probe(&at(cport), "/up", Duration::from_secs(1)).await;
        assert!(
            !r.ok && !r.timed_out && r.refused && r.error.is_some(),
            "{r:?}"
        );
    }
}
