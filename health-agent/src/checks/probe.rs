//! The active probe: `GET <probe_path>` at the listener's own address (127.0.0.1, ::1 or the
//! specific address it is bound to), inside its network namespace, with a timeout. It gives
//! evidence when there is no real traffic, and the kernel view sees it like any other request.
//! A probe the agent cannot even make (no namespace entry, no socket, no such local address,
//! no permission) is the agent's own error, never evidence against the backend; for a `::`
//! listener in a namespace without IPv6 it tries 127.0.0.1 instead of `::1`.
//!
//! It speaks as the app is served: `web.probe_host` as the Host header, TLS with
//! `web.probe_scheme = "https"` (tls.rs). An answer that proves the server answers but says the
//! probe is set up wrong (a redirect, a refused Host, a missing path, a TLS port asked in plain
//! HTTP or the reverse) is `misconfigured`, with the key to set (answer.rs): never evidence
//! against the backend.

mod answer;
mod ledger;
mod tls;

pub use self::ledger::ProbeLedger;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rustls::ClientConfig;
use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

use crate::{
    config::{ProbeScheme, WebConfig},
    netns::Namespace,
};

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

/// How the probe asks: `web.probe_*`, with the TLS client built once.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub path: String,
    /// The Host header; empty: the address probed.
    pub host: String,
    pub scheme: ProbeScheme,
    /// With `https`: the client, or why there is none (no CA to verify against).
    tls: Option<Result<Arc<ClientConfig>, String>>,
    pub timeout: Duration,
    /// The port has answered a plain HTTP request since the agent started: it is no TLS-only
    /// port, and a probe that gets nothing back there is a backend that does not answer — the
    /// probe's result is not held back by a TLS handshake to find out.
    answered_plain: Arc<std::sync::atomic::AtomicBool>,
}

impl ProbeSpec {
    pub fn of(cfg: &WebConfig) -> Self {
        Self {
            path: cfg.probe_path.clone(),
            host: cfg.probe_host.clone(),
            scheme: cfg.probe_scheme,
            tls: (cfg.probe_scheme == ProbeScheme::Https)
                .then(|| tls::client_config(cfg.probe_tls_verify)),
            timeout: cfg.probe_timeout,
            answered_plain: Arc::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
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
    /// A redirect's `Location`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The backend answered, and its answer says the probe is set up wrong: what, and the key
    /// to set. Never evidence against the backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misconfigured: Option<String>,
}

/// Probes `target` as `spec` says, noting in `ledger` what the probe puts on the port.
pub async fn probe(target: &ProbeTarget, spec: &ProbeSpec, ledger: &ProbeLedger) -> ProbeResult {
    if let Some(Err(why)) = &spec.tls {
        // No client to make: the configuration's mistake, not the backend's.
        return ProbeResult {
            error: Some(why.clone()),
            misconfigured: Some(why.clone()),
            target: target.addr.to_string(),
            ..ProbeResult::default()
        };
    }
    let start = Instant::now();
    // Where the request went: the fallback once the first address could not be tried.
    let tried = Arc::new(Mutex::new(target.addr));
    let outcome = tokio::time::timeout(spec.timeout, request(target, spec, &tried, ledger)).await;
    let latency_ms = start.elapsed().as_secs_f64() * 1000.0;
    let addr = *tried.lock().unwrap_or_else(|e| e.into_inner());
    let target_text = addr.to_string();
    let failed = |error: String| ProbeResult {
        latency_ms,
        error: Some(error),
        target: target_text.clone(),
        ..ProbeResult::default()
    };
    let mut r = match outcome {
        Err(_) => ProbeResult {
            timed_out: true,
            ..failed(format!("no answer within {}ms", spec.timeout.as_millis()))
        },
        Ok(Err(e)) => {
            if let Some(tls) = tls::rustls_error(&e) {
                return ProbeResult {
                    misconfigured: Some(tls::mistake(tls, &target_text, addr.port())),
                    ..failed(format!("TLS: {tls}"))
                };
            }
            ProbeResult {
                refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                agent_error: is_agent_error(&e),
                ..failed(e.to_string())
            }
        }
        Ok(Ok((status, location))) => {
            let sent = answer::Sent {
                path: &spec.path,
                host: &host_header(spec, addr),
                host_configured: !spec.host.is_empty(),
                scheme: spec.scheme,
                target: &target_text,
            };
            let misconfigured = answer::mistake(status, location.as_deref(), &sent);
            if spec.scheme == ProbeScheme::Http {
                spec.answered_plain
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            ProbeResult {
                ok: (200..300).contains(&status),
                status: Some(status),
                latency_ms,
                target: target_text.clone(),
                location,
                misconfigured,
                ..ProbeResult::default()
            }
        }
    };
    // Plain HTTP got nothing back: a port that serves only TLS takes the request and closes or
    // sits on it. Ask it once in TLS to tell that mistake from a backend that does not answer.
    let nothing = r.status.is_none() && !r.refused && !r.agent_error;
    let answered_plain = spec
        .answered_plain
        .load(std::sync::atomic::Ordering::Relaxed);
    if spec.scheme == ProbeScheme::Http
        && nothing
        && !answered_plain
        && speaks_tls(target, spec.timeout, ledger).await
    {
        r.timed_out = false;
        r.misconfigured = Some(format!(
            "port {} at {target_text} speaks TLS and the probe asked in plain HTTP ({}): set \
             web.probe_scheme = \"https\" (and web.probe_tls_verify = false for a self-signed \
             certificate)",
            addr.port(),
            r.error.as_deref().unwrap_or("no answer")
        ));
    }
    r
}

/// The Host header: `web.probe_host`, else the address probed.
fn host_header(spec: &ProbeSpec, addr: SocketAddr) -> String {
    if spec.host.is_empty() {
        addr.to_string()
    } else {
        spec.host.clone()
    }
}

/// Whether the port answers a TLS handshake (any certificate, within `timeout`, at most 1 s).
async fn speaks_tls(target: &ProbeTarget, timeout: Duration, ledger: &ProbeLedger) -> bool {
    let Ok(config) = tls::client_config(false) else {
        return false;
    };
    let tried = Arc::new(Mutex::new(target.addr));
    let handshake = async {
        let s = connect(target, timeout, &tried).await?;
        // The agent's own connection, as the probe's: its close is no answer of the backend.
        if let Ok(local) = s.local_addr() {
            ledger.note_own(local, Instant::now());
        }
        let name = tls::server_name("", target.addr);
        tokio_rustls::TlsConnector::from(config)
            .connect(name, s)
            .await
    };
    match tokio::time::timeout(timeout.min(Duration::from_secs(1)), handshake).await {
        Ok(Ok(_)) => true,
        // The server sent TLS and refused something in it (a version, an alert): TLS all
        // the same. Garbage or a plain HTTP answer is not.
        Ok(Err(e)) => tls::rustls_error(&e).is_some_and(|t| {
            !matches!(
                t,
                rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }
            )
        }),
        Err(_) => false,
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

/// Probes wherever the web monitor last saw the backend listen; None before it has.
pub async fn probe_shared(
    target: &SharedProbeTarget,
    spec: &ProbeSpec,
    ledger: &ProbeLedger,
) -> Option<ProbeResult> {
    let current = target.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
    Some(probe(&current, spec, ledger).await)
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

/// The request, in plain HTTP or TLS: the answer's status and `Location`.
async fn request(
    target: &ProbeTarget,
    spec: &ProbeSpec,
    tried: &Arc<Mutex<SocketAddr>>,
    ledger: &ProbeLedger,
) -> std::io::Result<(u16, Option<String>)> {
    ledger.begin();
    let s = connect(target, spec.timeout, tried).await?;
    if let Ok(local) = s.local_addr() {
        ledger.note_own(local, Instant::now());
    }
    let addr = *tried.lock().unwrap_or_else(|e| e.into_inner());
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: health-agent\r\nConnection: close\r\n\r\n",
        spec.path,
        host_header(spec, addr)
    );
    match &spec.tls {
        None => exchange(s, &req).await,
        // Answered by `probe` before any connection.
        Some(Err(why)) => Err(std::io::Error::other(why.clone())),
        Some(Ok(config)) => {
            let name = tls::server_name(&spec.host, addr);
            let s = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, s)
                .await?;
            exchange(s, &req).await
        }
    }
}

/// Sends `req` and reads the answer's head (up to HEAD_MAX; the status line is enough when the
/// server closes after it).
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
) -> std::io::Result<(u16, Option<String>)> {
    s.write_all(req.as_bytes()).await?;
    let mut buf = vec![0u8; answer::HEAD_MAX];
    let mut n = 0;
    while n < buf.len() && !answer::head_complete(&buf[..n]) {
        let r = s.read(&mut buf[n..]).await?;
        if r == 0 {
            break;
        }
        n += r;
    }
    if n < 12 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before a status line",
        ));
    }
    answer::parse_head(&buf[..n]).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP status line")
    })
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

    fn spec(timeout: Duration) -> ProbeSpec {
        ProbeSpec::of(&WebConfig {
            probe_timeout: timeout,
            ..WebConfig::default()
        })
    }

    #[tokio::test]
    async fn https_to_a_plain_http_port_is_misconfigured_naming_the_scheme() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 512];
            let _ = s.read(&mut b).await;
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let target = ProbeTarget {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            fallback: None,
            ns: Arc::new(Namespace::own().unwrap()),
        };
        let spec = ProbeSpec::of(&WebConfig {
            probe_scheme: ProbeScheme::Https,
            probe_tls_verify: false,
            ..WebConfig::default()
        });
        let r = probe(&target, &spec, &ProbeLedger::default()).await;
        let why = r.misconfigured.clone().unwrap_or_default();
        assert!(why.contains("web.probe_scheme = \"http\""), "{r:?}");
        assert!(!r.ok && !r.timed_out, "{r:?}");
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
        let ledger = ProbeLedger::default();
        let r = probe(&at(port), &spec(Duration::from_secs(2)), &ledger).await;
        assert_eq!((r.ok, r.status), (false, Some(503)));
        assert_eq!(r.target, format!("127.0.0.1:{port}"));
        let r = probe(&at(port), &spec(Duration::from_millis(200)), &ledger).await;
        assert!(r.timed_out && !r.ok, "{r:?}");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cport = closed.local_addr().unwrap().port();
        drop(closed);
        let r = probe(&at(cport), &spec(Duration::from_secs(1)), &ledger).await;
        assert!(
            !r.ok && !r.timed_out && r.refused && r.error.is_some(),
            "{r:?}"
        );
        // Each probe was counted before it connected. The agent's own connections: the two
        // probes that connected, and the TLS check after the one that got nothing back (a
        // fresh spec: the port had not answered plain HTTP to it); the refused one made none.
        assert_eq!(ledger.started(), 3);
        let own = ledger.own_sources();
        assert_eq!(own.len(), 3, "{own:?}");
        assert!(own.iter().all(|a| a.ip().is_loopback() && a.port() != port));
    }
}
