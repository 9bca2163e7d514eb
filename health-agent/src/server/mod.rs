//! The HTTP side: `GET|HEAD /health` from the cached snapshot (nothing is computed per
//! request), `/metrics`, `/livez`, the fleet's peer view — the routes and handlers here, the
//! accept loop and its limits in `conn`. A hand-rolled hyper accept loop gives what the load
//! balancer's probes need from a port anyone may reach: a connection cap, a cap per client
//! address, a deadline on reading a request's head (which also ends idle keep-alive
//! connections), a deadline on a stalled write (a client that pipelines requests and never
//! reads the answers), a small header buffer, and graceful shutdown. Like nginx's workers, each HTTP thread runs its own
//! single-threaded runtime on its own SO_REUSEPORT listener: no cross-thread wakeups per request,
//! and the background checks (on the main runtime) never share a queue with the probes.

mod conn;
#[cfg(test)]
mod tests;
mod view;

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

pub use self::conn::{bind, connection_cap, run_threads, serve, Clients, Limits, RESERVED_FDS};
pub use self::view::{FleetAccess, FreshGate};
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
    pub fleet_access: FleetAccess,
    /// Whose `?fresh=` asks are honoured now.
    pub fresh_gate: FreshGate,
    /// This host's name, in the peer view.
    pub host: String,
    /// The live evidence the peer view shows, and what a peer's `?fresh=dependency` wakes.
    pub witness: Witness,
    /// `web.socket_tracing`, for `/metrics`' build info.
    pub socket_tracing: crate::config::SocketTracing,
}

pub use crate::fleet::Witness;

#[derive(Clone, Copy)]
pub(crate) struct Peer(pub(crate) SocketAddr);

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics_handler))
        .route(crate::fleet::VIEW_PATH, get(view::fleet_view))
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
    let mut r = if age > app.stale_after {
        let msg = format!(
            "the check loop has not published a snapshot for {:.1}s\n",
            age.as_secs_f64()
        );
        (StatusCode::SERVICE_UNAVAILABLE, msg).into_response()
    } else {
        "ok\n".into_response()
    };
    age_header(&mut r, age);
    r
}

/// `x-snapshot-age-ms`, on every answer that comes from the snapshot.
fn age_header(r: &mut Response, age: Duration) {
    r.headers_mut().insert(
        HeaderName::from_static("x-snapshot-age-ms"),
        HeaderValue::from(age.as_millis() as u64),
    );
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
    age_header(&mut r, age);
    r
}

/// The check loop stopped: the agent can no longer vouch for the box.
fn stale(age: Duration, ietf: bool) -> Response {
    let reason = format!(
        "health snapshot is {:.1}s old: the agent's check loop has stopped",
        age.as_secs_f64()
    );
    // Built as text, not a JSON map, to keep the documented order (status first).
    let reason = serde_json::Value::from(reason);
    let body = if ietf {
        format!(r#"{{"status":"fail","notes":[{reason}]}}"#)
    } else {
        format!(r#"{{"status":"unhealthy","recommendation":"stable","reasons":[{reason}]}}"#)
    };
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from(body),
        ietf,
        age,
    )
}

async fn metrics_handler(State(app): State<Arc<App>>, req: Request) -> Response {
    let peer = req.extensions().get::<Peer>().copied();
    let detailed = wants_details(&app, peer, req.headers());
    let snap = app.snapshot.load();
    let age = Instant::now().saturating_duration_since(snap.created);
    let format = metrics::Format::negotiate(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let scrape = metrics::Scrape {
        detailed,
        format,
        socket_tracing: app.socket_tracing,
    };
    let mut r = metrics::render(&snap, &scrape).into_response();
    age_header(&mut r, age);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}
