//! The HTTP side: `GET|HEAD /health` from the cached snapshot (nothing is computed per
//! request), `/metrics`, `/livez`. A hand-rolled hyper accept loop gives what the load
//! balancer's probes need from a shared port: a connection cap, a header-read deadline, a small
//! header buffer, and graceful shutdown. Like nginx's workers, each HTTP thread runs its own
//! single-threaded runtime on its own SO_REUSEPORT listener: no cross-thread wakeups per request,
//! and the background checks (on the main runtime) never share a queue with the probes.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
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
use tokio::{net::TcpListener, sync::Semaphore};
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
        .route("/livez", get(|| async { "ok\n" }))
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

async fn metrics_handler(State(app): State<Arc<App>>) -> Response {
    let snap = app.snapshot.load();
    let mut r = metrics::render(&snap).into_response();
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
    pub header_timeout: Duration,
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
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(Peer(peer));
            let mut router = router.clone();
            async move { router.call(req.map(Body::new)).await }
        });
        let conn = http.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
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
