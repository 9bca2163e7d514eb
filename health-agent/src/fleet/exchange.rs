//! One round of asking the peers: list them (a static list, a DNS name's A/AAAA records, the
//! Consul catalog, or the auto-scaling group's members as `asg` last listed them), take a random
//! sample, ask each for its view with a timeout, all at once.
//! A dead, slow or garbled peer costs at most `fleet.timeout` of a background task and is
//! left out; nothing here is on the request path.

use std::{net::SocketAddr, time::Instant};

use serde::Deserialize;

use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    asg::AsgPeers, instance_id, PeerView, Round, FRESH_ANSWERS, FRESH_DEPENDENCY, VIEW_PATH,
    VIEW_VERSION,
};
use crate::config::FleetConfig;

/// Why a peer gave no usable view. Shown in `details.fleet.peers_failed`, never a reason to
/// change this instance's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// Connecting, sending or reading failed (reqwest's own short reason).
    #[error("{0}")]
    Transport(String),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("not a peer view: {0}")]
    NotAView(String),
    #[error("peer view version {0}")]
    Version(u32),
}

/// Why the peers could not be listed, or the exchange not set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("fleet HTTP client: {0}")]
    Client(String),
    #[error("resolving fleet.peers_dns {host}: {reason}")]
    Dns { host: String, reason: String },
    #[error("Consul catalog {service}: {reason}")]
    Consul { service: String, reason: String },
    /// The auto-scaling group's members: none listed yet, or the list is stale (`asg`).
    #[error("fleet.peers_from = \"asg\": {0}")]
    Asg(String),
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
    token: Option<String>,
    http: reqwest::Client,
    /// `fleet.peers_from = "asg"`.
    asg: Option<AsgPeers>,
    /// This instance has a dependency fault: peers are asked to check theirs afresh
    /// (`?fresh=dependency`), so their word on it is newer than the fault.
    fresh_dependency: AtomicBool,
    /// This instance's answers fail: peers are asked to sample theirs afresh
    /// (`?fresh=answers`: with `socket_tracing = "on_suspicion"` they are counted only in
    /// windows), so their word on them is newer than the fault.
    fresh_answers: AtomicBool,
}

impl Exchange {
    pub fn new(
        cfg: &FleetConfig,
        own_addr: SocketAddr,
        token: Option<String>,
    ) -> Result<Self, DiscoveryError> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            // Peers are asked by address: no proxy from the environment in between.
            .no_proxy()
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
            token,
            http,
            asg,
            fresh_dependency: AtomicBool::new(false),
            fresh_answers: AtomicBool::new(false),
        })
    }

    pub async fn round(&self) -> Round {
        let started = Instant::now();
        let (mut peers, discovery_error) = self.peers().await;
        peers.retain(|p| *p != self.own_addr.to_string());
        peers.sort();
        peers.dedup();
        fastrand::shuffle(&mut peers);
        peers.truncate(self.cfg.sample);
        let asks = peers.iter().map(|p| async move { (p, self.ask(p).await) });
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
                Ok(v) => round.answered.push((peer.clone(), v)),
                Err(e) => round.failed.push((peer.clone(), e)),
            }
        }
        round.asked.sort();
        round.answered.sort_by(|a, b| a.0.cmp(&b.0));
        round.took = started.elapsed();
        round
    }

    /// Whether the next rounds ask the peers to check their dependencies afresh.
    pub fn want_fresh_dependency(&self, yes: bool) {
        self.fresh_dependency.store(yes, Ordering::Relaxed);
    }

    /// Whether the next rounds ask the peers to sample their answers afresh.
    pub fn want_fresh_answers(&self, yes: bool) {
        self.fresh_answers.store(yes, Ordering::Relaxed);
    }

    async fn ask(&self, peer: &str) -> Result<PeerView, PeerError> {
        let fresh: Vec<&str> = [
            (
                self.fresh_dependency.load(Ordering::Relaxed),
                FRESH_DEPENDENCY,
            ),
            (self.fresh_answers.load(Ordering::Relaxed), FRESH_ANSWERS),
        ]
        .into_iter()
        .filter_map(|(want, q)| want.then_some(q))
        .collect();
        let url = if fresh.is_empty() {
            format!("http://{peer}{VIEW_PATH}")
        } else {
            format!("http://{peer}{VIEW_PATH}?{}", fresh.join("&"))
        };
        let mut req = self.http.get(&url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| PeerError::Transport(short(&e)))?;
        if !resp.status().is_success() {
            return Err(PeerError::Status(resp.status().as_u16()));
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| PeerError::Transport(short(&e)))?;
        let view: PeerView =
            serde_json::from_slice(&body).map_err(|e| PeerError::NotAView(e.to_string()))?;
        if view.version != VIEW_VERSION {
            return Err(PeerError::Version(view.version));
        }
        Ok(view)
    }

    /// `host:port` of every peer the configuration names, re-read every round (the group's
    /// members as last listed), and what went wrong with any source: a source that failed
    /// while others gave peers still says so.
    async fn peers(&self) -> (Vec<String>, Option<DiscoveryError>) {
        let mut out = self.cfg.peers.clone();
        let mut errors = Vec::new();
        if !self.cfg.peers_dns.is_empty() {
            match self.dns().await {
                Ok(p) => out.extend(p),
                Err(e) => errors.push(e),
            }
        }
        if !self.cfg.consul_addr.is_empty() {
            match self.consul().await {
                Ok(p) => out.extend(p),
                Err(e) => errors.push(e),
            }
        }
        if let Some(asg) = &self.asg {
            match asg.peers() {
                Ok((p, stale)) => {
                    out.extend(p);
                    errors.extend(stale.map(|e| DiscoveryError::Asg(e.to_string())));
                }
                Err(e) => errors.push(DiscoveryError::Asg(e.to_string())),
            }
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

    async fn consul(&self) -> Result<Vec<String>, DiscoveryError> {
        let base = self.cfg.consul_addr.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        let url = format!("{base}/v1/catalog/service/{}", self.cfg.consul_service);
        let entries: Vec<CatalogEntry> = self
            .http
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| self.consul_error(&e))?
            .json()
            .await
            .map_err(|e| self.consul_error(&e))?;
        Ok(entries.iter().filter_map(CatalogEntry::peer).collect())
    }

    fn consul_error(&self, e: &reqwest::Error) -> DiscoveryError {
        DiscoveryError::Consul {
            service: self.cfg.consul_service.clone(),
            reason: short(e),
        }
    }
}

/// One entry of Consul's `GET /v1/catalog/service/:service` (only the fields used).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CatalogEntry {
    #[serde(default)]
    address: String,
    #[serde(default)]
    service_address: String,
    #[serde(default)]
    service_port: u16,
}

impl CatalogEntry {
    /// The service's own address when registered with one, else its node's.
    fn peer(&self) -> Option<String> {
        let host = if self.service_address.is_empty() {
            &self.address
        } else {
            &self.service_address
        };
        if host.is_empty() || self.service_port == 0 {
            return None;
        }
        Some(match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{}", self.service_port),
            _ => format!("{host}:{}", self.service_port),
        })
    }
}

/// A reqwest error without its URL (a peer URL holds nothing secret, but keep lines short).
fn short(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer within fleet.timeout".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consul_entries_prefer_the_service_address() {
        let entries: Vec<CatalogEntry> = serde_json::from_str(
            r#"[{"Node":"a","Address":"10.0.0.1","ServiceAddress":"","ServicePort":8080},
                {"Node":"b","Address":"10.0.0.2","ServiceAddress":"10.1.0.2","ServicePort":8080},
                {"Node":"c","Address":"fd00::3","ServiceAddress":"","ServicePort":8080},
                {"Node":"d","Address":"10.0.0.4","ServicePort":0}]"#,
        )
        .unwrap();
        let peers: Vec<String> = entries.iter().filter_map(CatalogEntry::peer).collect();
        assert_eq!(peers, ["10.0.0.1:8080", "10.1.0.2:8080", "[fd00::3]:8080"]);
    }
}
