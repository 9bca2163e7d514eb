//! One round of asking the peers: list them (a static list, a DNS name's A/AAAA records, the
//! Consul catalog, or the auto-scaling group's members as `asg` last listed them), take a random
//! sample, ask each for its view with a timeout, all at once.
//! A dead, slow or garbled peer costs at most `fleet.timeout` of a background task and is
//! left out; nothing here is on the request path.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Mutex,
    },
    time::Instant,
};

use super::{
    asg::AsgPeers,
    instance_id,
    key::{FleetKey, KeyError, Keyring},
    proof::{self, ProofError},
    view::{ViewError, MAX_VIEW_BYTES},
    PeerView, Round, FRESH_ANSWERS, FRESH_DEPENDENCY, VIEW_PATH,
};
use crate::{capped::CappedError, config::FleetConfig};

/// Why a peer gave no usable view. Shown in `details.fleet.peers_failed`, counted by reason in
/// `/metrics`, never a reason to change this instance's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// Connecting, sending or reading failed (reqwest's own short reason).
    #[error("{0}")]
    Transport(String),
    #[error("HTTP {0}")]
    Status(u16),
    /// The peer refused this agent's ask (401, 403), saying why.
    #[error("refused our ask (HTTP {status}): {why}")]
    Refused { status: u16, why: String },
    /// The answer grew past `view::MAX_VIEW_BYTES`: cut off there, not read on.
    #[error("an answer over {} KiB: cut off", MAX_VIEW_BYTES / 1024)]
    TooLarge,
    /// The answer is not proven to come from a holder of the fleet key for this ask.
    #[error("unproven: {0}")]
    Unproven(#[from] ProofError),
    #[error("{0}")]
    View(#[from] ViewError),
}

impl PeerError {
    /// The reason's label in `/metrics` (`health_agent_fleet_peer_failures_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Transport(_) => "transport",
            Self::Status(_) => "status",
            Self::Refused { .. } => "refused",
            Self::TooLarge => "too_large",
            Self::Unproven(_) => "unproven",
            Self::View(ViewError::NotJson(_)) => "not_a_view",
            Self::View(ViewError::Version(_)) => "version",
            Self::View(ViewError::Field { .. }) => "out_of_range",
        }
    }

    /// Whether a peer that answers so is worth a log line (once): it answered, but not as a
    /// member of the fleet. A peer that is down or slow is not news for the log.
    fn untrusted(&self) -> bool {
        !matches!(self, Self::Transport(_) | Self::Status(_))
    }
}

/// Every `PeerError::reason`, in the order `/metrics` lists them.
pub const FAILURE_REASONS: [&str; 8] = [
    "transport",
    "status",
    "refused",
    "too_large",
    "unproven",
    "not_a_view",
    "version",
    "out_of_range",
];

/// Why the peers could not be listed, or the exchange not set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("fleet HTTP client: {0}")]
    Client(String),
    /// No fleet key: no peer is asked or counted.
    #[error("{0}: no peer is asked or counted (judged alone)")]
    NoKey(KeyError),
    #[error("resolving fleet.peers_dns {host}: {reason}")]
    Dns { host: String, reason: String },
    #[error("Consul catalog {service}: {reason}")]
    Consul { service: String, reason: String },
    /// The auto-scaling group's members: none listed yet, or the list is stale (`asg`).
    #[error("fleet.peers_from = \"asg\": {0}")]
    Asg(String),
    /// Addresses a source gave that are no peer's `host:port` (`addr::check`): dropped.
    #[error("{0}")]
    Dropped(super::addr::Dropped),
    /// More than one source failed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    All(Vec<DiscoveryError>),
}

pub struct Exchange {
    cfg: FleetConfig,
    /// The port peers found through DNS listen on when the name carries none: ours.
    own_port: u16,
    /// Our own address, never asked.
    own_addr: SocketAddr,
    /// The fleet key that proves our asks and their answers; without one no peer is asked.
    key: FleetKey,
    http: reqwest::Client,
    /// `fleet.peers_from = "asg"`.
    asg: Option<AsgPeers>,
    consul: Option<super::consul::Consul>,
    /// This instance has a dependency fault: peers are asked to check theirs afresh
    /// (`?fresh=dependency`), so their word on it is newer than the fault.
    fresh_dependency: AtomicBool,
    /// This instance's answers fail: peers are asked to sample theirs afresh
    /// (`?fresh=answers`: with `socket_tracing = "on_suspicion"` they are counted only in
    /// windows), so their word on them is newer than the fault.
    fresh_answers: AtomicBool,
    /// Peers' failures since start, by `PeerError::reason`.
    failures: [AtomicU64; FAILURE_REASONS.len()],
    /// The reason last logged for each peer that answered but was not counted: logged once
    /// per peer and reason, not every round.
    logged: Mutex<HashMap<String, &'static str>>,
}

/// A refusal's body is one line of text; more is not read.
const REFUSAL_BYTES: usize = 512;

/// Peers remembered in `Exchange::logged`; past this the memory starts over (a flood of
/// addresses from DNS or Consul must not grow the agent).
const MAX_LOGGED: usize = 1024;

impl Exchange {
    pub fn new(
        cfg: &FleetConfig,
        own_addr: SocketAddr,
        key: FleetKey,
    ) -> Result<Self, DiscoveryError> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            // Peers are asked by address: no proxy from the environment in between.
            .no_proxy()
            // A peer's redirect is not followed: it answers itself or not at all.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| DiscoveryError::Client(e.to_string()))?;
        let asg = cfg
            .from_asg()
            .then(|| AsgPeers::new(cfg, own_addr.port()))
            .transpose()
            .map_err(|e| DiscoveryError::Client(e.to_string()))?;
        Ok(Self {
            cfg: cfg.clone(),
            own_port: own_addr.port(),
            own_addr,
            key,
            consul: super::consul::Consul::from_config(cfg, &http)?,
            http,
            asg,
            fresh_dependency: AtomicBool::new(false),
            fresh_answers: AtomicBool::new(false),
            failures: Default::default(),
            logged: Mutex::new(HashMap::new()),
        })
    }

    pub async fn round(&self) -> Round {
        let started = Instant::now();
        let key = match &self.key {
            FleetKey::Held(k) => k.clone(),
            FleetKey::Missing(e) => {
                return Round {
                    started: Some(started),
                    discovery_error: Some(DiscoveryError::NoKey(e.clone())),
                    ..Round::default()
                }
            }
        };
        let (mut peers, discovery_error) = self.peers().await;
        peers.retain(|p| *p != self.own_addr.to_string());
        peers.sort();
        peers.dedup();
        fastrand::shuffle(&mut peers);
        peers.truncate(self.cfg.sample);
        let asks = peers.iter().map(|p| {
            let key = &key;
            async move { (p, self.ask(key, p).await) }
        });
        let results = futures_util::future::join_all(asks).await;
        let mut round = Round {
            started: Some(started),
            asked: peers.clone(),
            discovery_error,
            ..Round::default()
        };
        for (peer, result) in results {
            match result {
                // A peer list may hold this agent itself (DNS, Consul): it is no witness.
                Ok(v) if v.instance == instance_id() => {}
                Ok(v) => {
                    self.forget(peer);
                    round.answered.push((peer.clone(), v));
                }
                Err(e) => {
                    self.note_failure(peer, &e);
                    round.failed.push((peer.clone(), e));
                }
            }
        }
        round.asked.sort();
        round.answered.sort_by(|a, b| a.0.cmp(&b.0));
        round.failures = self.failures();
        round.took = started.elapsed();
        round
    }

    /// Peers' failures since start, by reason (`FAILURE_REASONS`' order).
    pub fn failures(&self) -> [u64; FAILURE_REASONS.len()] {
        std::array::from_fn(|i| self.failures[i].load(Ordering::Relaxed))
    }

    /// Counts a failure, and logs a peer that answered but is not counted, once per reason.
    fn note_failure(&self, peer: &str, e: &PeerError) {
        if let Some(i) = FAILURE_REASONS.iter().position(|r| *r == e.reason()) {
            self.failures[i].fetch_add(1, Ordering::Relaxed);
        }
        if !e.untrusted() {
            return;
        }
        let Ok(mut logged) = self.logged.lock() else {
            return;
        };
        if logged.get(peer) == Some(&e.reason()) {
            return;
        }
        if logged.len() >= MAX_LOGGED {
            logged.clear();
        }
        logged.insert(peer.to_string(), e.reason());
        let why = e.to_string();
        tracing::warn!(
            "fleet: peer {peer} answered but is not counted: {}",
            crate::text::clean(&why)
        );
    }

    /// A peer counted again is logged again should it fail later.
    fn forget(&self, peer: &str) {
        if let Ok(mut logged) = self.logged.lock() {
            logged.remove(peer);
        }
    }

    /// Whether the next rounds ask the peers to check their dependencies afresh.
    pub fn want_fresh_dependency(&self, yes: bool) {
        self.fresh_dependency.store(yes, Ordering::Relaxed);
    }

    /// Whether the next rounds ask the peers to sample their answers afresh.
    pub fn want_fresh_answers(&self, yes: bool) {
        self.fresh_answers.store(yes, Ordering::Relaxed);
    }

    /// One peer's view: asked with a fresh nonce and our proof, read up to the cap, counted only
    /// when its proof answers this nonce and every field is in range.
    async fn ask(&self, key: &Keyring, peer: &str) -> Result<PeerView, PeerError> {
        let nonce = proof::nonce();
        let mut path = format!("{VIEW_PATH}?nonce={nonce}");
        for (want, q) in [
            (&self.fresh_dependency, FRESH_DEPENDENCY),
            (&self.fresh_answers, FRESH_ANSWERS),
        ] {
            if want.load(Ordering::Relaxed) {
                path.push('&');
                path.push_str(q);
            }
        }
        let resp = self
            .http
            .get(format!("http://{peer}{path}"))
            .header(
                reqwest::header::AUTHORIZATION,
                key.ask(&path, proof::unix_now()),
            )
            .send()
            .await
            .map_err(|e| PeerError::Transport(short(&e)))?;
        let status = resp.status().as_u16();
        if matches!(status, 401 | 403) {
            // The peer refused our proof: its one line says why (another key, our clock off by
            // minutes, no key there), which is what an operator needs to fix it.
            let why = crate::capped::body(resp, REFUSAL_BYTES)
                .await
                .ok()
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .unwrap_or_default();
            return Err(PeerError::Refused {
                status,
                why: crate::text::clean(&why).chars().take(200).collect(),
            });
        }
        if !resp.status().is_success() {
            return Err(PeerError::Status(status));
        }
        let proof = resp
            .headers()
            .get(proof::PROOF_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = crate::capped::body(resp, MAX_VIEW_BYTES)
            .await
            .map_err(|e| match e {
                CappedError::TooLarge { .. } => PeerError::TooLarge,
                CappedError::Transport(e) => PeerError::Transport(short(&e)),
            })?;
        key.check_view(proof.as_deref(), &nonce, &body)?;
        Ok(PeerView::parse(&body)?)
    }

    /// `host:port` of every peer the configuration names, re-read every round (the group's
    /// members as last listed), and what went wrong with any source: a source that failed
    /// while others gave peers still says so. An address that is no `host:port`
    /// (`addr::check`) is dropped, and said.
    async fn peers(&self) -> (Vec<String>, Option<DiscoveryError>) {
        use super::addr::{admit, Source};
        let mut listed = vec![(Source::Static, self.cfg.peers.clone())];
        let mut errors = Vec::new();
        if !self.cfg.peers_dns.is_empty() {
            match self.dns().await {
                Ok(p) => listed.push((Source::Dns, p)),
                Err(e) => errors.push(e),
            }
        }
        if let Some(consul) = &self.consul {
            match consul.peers().await {
                Ok(p) => listed.push((Source::Consul, p)),
                Err(e) => errors.push(e),
            }
        }
        if let Some(asg) = &self.asg {
            match asg.peers() {
                Ok((p, stale)) => {
                    listed.push((Source::Asg, p));
                    errors.extend(stale.map(|e| DiscoveryError::Asg(e.to_string())));
                }
                Err(e) => errors.push(DiscoveryError::Asg(e.to_string())),
            }
        }
        let mut out = Vec::new();
        for (source, addrs) in listed {
            let (ok, dropped) = admit(source, addrs);
            out.extend(ok);
            errors.extend(dropped.map(DiscoveryError::Dropped));
        }
        let error = match errors.len() {
            0 | 1 => errors.pop(),
            _ => Some(DiscoveryError::All(errors)),
        };
        (out, error)
    }

    async fn dns(&self) -> Result<Vec<String>, DiscoveryError> {
        let name = &self.cfg.peers_dns;
        let (host, port) = match name.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => (h.to_string(), p.parse().unwrap_or(0)),
            _ => (name.clone(), self.own_port),
        };
        let addrs = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| DiscoveryError::Dns {
                host: host.clone(),
                reason: e.to_string(),
            })?;
        Ok(addrs.map(|a| a.to_string()).collect())
    }
}

/// A reqwest error without its URL (a peer URL holds nothing secret, but keep lines short).
pub(super) fn short(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer within fleet.timeout".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        e.to_string()
    }
}
