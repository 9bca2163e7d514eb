//! `GET /fleet/v1/view`: this instance's raw view for its peers, served only to an asker that
//! proves it holds the fleet key, and signed for that ask (`fleet::proof`). A `?fresh=` ask
//! (check the database now, sample the answers now) costs this agent work, so it is honoured
//! only for a proven asker, at most once per `fleet.interval` per asker address.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

use super::{age_header, App, Peer};
use crate::fleet::{
    key::{FleetKey, Keyring},
    proof::{self, PROOF_HEADER},
    PeerView, FRESH_ANSWERS, FRESH_DEPENDENCY,
};

/// Who may read the peer view.
#[derive(Debug, Clone)]
pub enum FleetAccess {
    /// No `[fleet]` peers configured: there is no peer view (404), so nothing about this
    /// instance is served to whoever asks.
    NotConfigured,
    /// `[fleet]` without a usable key: the view is closed (403), saying why.
    Closed(String),
    /// Served to an asker proven with the key.
    Keyed(Arc<Keyring>),
}

impl FleetAccess {
    /// From the key read at start; None: no `[fleet]`.
    pub fn of(key: Option<&FleetKey>) -> Self {
        match key {
            None => Self::NotConfigured,
            Some(FleetKey::Held(k)) => Self::Keyed(k.clone()),
            Some(FleetKey::Missing(e)) => Self::Closed(e.to_string()),
        }
    }
}

/// Askers whose `?fresh=` was honoured, and when: each at most once per `every`. Bounded: past
/// `MAX_ASKERS` addresses the oldest are forgotten.
#[derive(Debug, Default)]
pub struct FreshGate {
    every: Duration,
    last: Mutex<HashMap<IpAddr, Instant>>,
}

const MAX_ASKERS: usize = 4096;

impl FreshGate {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::default(),
        }
    }

    /// Whether `asker`'s fresh ask at `now` is honoured (and, if so, noted).
    pub fn admit(&self, asker: IpAddr, now: Instant) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        if last
            .get(&asker)
            .is_some_and(|t| now.saturating_duration_since(*t) < self.every)
        {
            return false;
        }
        if last.len() >= MAX_ASKERS {
            let every = self.every;
            last.retain(|_, t| now.saturating_duration_since(*t) < every);
            if last.len() >= MAX_ASKERS {
                last.clear();
            }
        }
        last.insert(asker, now);
        true
    }
}

fn refuse(code: StatusCode, why: String) -> Response {
    (code, format!("{why}\n")).into_response()
}

pub(super) async fn fleet_view(State(app): State<Arc<App>>, req: Request) -> Response {
    let key = match &app.fleet_access {
        FleetAccess::NotConfigured => {
            return refuse(
                StatusCode::NOT_FOUND,
                "no [fleet] configured: this agent serves no peer view".into(),
            )
        }
        FleetAccess::Closed(why) => {
            return refuse(
                StatusCode::FORBIDDEN,
                format!("the peer view is closed: {why}"),
            )
        }
        FleetAccess::Keyed(k) => k,
    };
    let uri = req.uri();
    let path_and_query = uri.path_and_query().map_or("", |p| p.as_str());
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let ask_key = match key.check_ask(given, path_and_query, proof::unix_now()) {
        Ok(id) => id.to_string(),
        Err(e) => return refuse(StatusCode::UNAUTHORIZED, format!("fleet proof: {e}")),
    };
    let Some(nonce) = proof::nonce_of(uri.query()).map(str::to_owned) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("fleet proof: {}", proof::ProofError::Nonce),
        );
    };
    let now = Instant::now();
    let wants = |q: &str| {
        uri.query()
            .is_some_and(|all| all.split('&').any(|p| p == q))
    };
    let (fresh_dependency, fresh_answers) = (wants(FRESH_DEPENDENCY), wants(FRESH_ANSWERS));
    let asker = req.extensions().get::<Peer>().map(|Peer(a)| a.ip());
    if (fresh_dependency || fresh_answers)
        && asker.is_some_and(|ip| app.fresh_gate.admit(ip.to_canonical(), now))
    {
        if fresh_dependency {
            // The asker's dependency fault is newer than our last round trip: check now, so
            // its next ask gets our word from after its onset.
            app.witness.recheck(now);
        }
        if fresh_answers {
            // The asker's answers fail: sample ours now (a counting window), so its next ask
            // gets our word from after its onset.
            app.witness.want_answers();
        }
    }
    let snap = app.snapshot.load();
    let age = now.saturating_duration_since(snap.created);
    let mut view = PeerView::of(&snap.report, &app.witness.evidence(), &app.host, now);
    view.alerts = app.witness.alerts(now);
    view.latency = snap.fleet.latency.clone();
    let body = match serde_json::to_vec(&view) {
        Ok(b) => b,
        Err(e) => {
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("rendering the view: {e}"),
            )
        }
    };
    let signed = key.prove_view(Some(&ask_key), &nonce, &body);
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&signed) {
        h.insert(PROOF_HEADER, v);
    }
    age_header(&mut r, age);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_ask_is_honoured_once_per_interval_per_asker() {
        let g = FreshGate::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "::1".parse().unwrap());
        assert!(g.admit(a, t0));
        assert!(!g.admit(a, t0 + Duration::from_millis(250)));
        assert!(g.admit(b, t0 + Duration::from_millis(250)), "another asker");
        assert!(g.admit(a, t0 + Duration::from_secs(2)));
        // A flood of addresses stays bounded.
        for i in 0..(MAX_ASKERS as u32 + 10) {
            g.admit(IpAddr::from(i.to_be_bytes()), t0 + Duration::from_secs(3));
        }
        assert!(g.last.lock().unwrap().len() <= MAX_ASKERS);
    }
}
