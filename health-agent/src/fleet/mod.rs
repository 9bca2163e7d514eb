//! Fleet-aware verdicts: this instance compares each of its faults with what its peers report,
//! to tell its own fault (a restart or a new instance fixes it: 503) from the fleet's (a shared
//! dependency, a bad deploy: a new instance fixes nothing, 200 `infrastructure_issue`).
//!
//! - `PeerView` is what an agent tells its peers about itself (`GET /fleet/v1/view`): its raw
//!   check states, never its fleet-adjusted answer, so no agent echoes another.
//! - `exchange` asks a sample of the peers every `fleet.interval`, off the request path.
//! - `Judge` decides per fault class, local or shared, from the latest round — only from a
//!   round that began after the peers had time to see the fault too.

pub mod asg;
pub mod exchange;

use std::{
    collections::HashMap,
    sync::OnceLock,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::{
    checks::Report,
    policy::Judgement,
    status::{ContainersState, DbState, FaultClass, Scope, WebVerdict},
};

/// The peer endpoint's path; the version is in the path, so agents of different versions
/// during a rollout keep talking v1 as long as they both serve it.
pub const VIEW_PATH: &str = "/fleet/v1/view";
pub const VIEW_VERSION: u32 = 1;

/// A random id for this agent process: a peer list that includes this agent itself (DNS,
/// Consul) is recognised by it.
pub fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("{:016x}", fastrand::u64(..)))
}

/// What an agent tells its peers about itself. No secrets: states and `host:port` endpoints.
/// Unknown fields are ignored and missing ones default, so a newer peer's view still reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PeerView {
    pub version: u32,
    pub instance: String,
    pub host: String,
    pub web: WebVerdict,
    pub database: DbState,
    pub containers: ContainersState,
    /// Endpoints its web backend waits on.
    pub dependencies: Vec<String>,
    /// Databases its own check cannot reach, as `host:port`.
    pub unreachable: Vec<String>,
}

impl Default for PeerView {
    fn default() -> Self {
        Self {
            version: VIEW_VERSION,
            instance: String::new(),
            host: String::new(),
            web: WebVerdict::Unknown,
            database: DbState::Unknown,
            containers: ContainersState::NotConfigured,
            dependencies: Vec::new(),
            unreachable: Vec::new(),
        }
    }
}

impl PeerView {
    pub fn of(report: &Report, host: &str) -> Self {
        Self {
            version: VIEW_VERSION,
            instance: instance_id().to_string(),
            host: host.to_string(),
            web: report.web.verdict,
            database: report.database.state,
            containers: report.containers.state,
            dependencies: report
                .web
                .dependencies
                .iter()
                .map(|d| d.endpoint.clone())
                .collect(),
            unreachable: report
                .database
                .databases
                .iter()
                .filter(|d| d.state == DbState::Unreachable)
                .map(|d| endpoint_of(&d.name))
                .collect(),
        }
    }

    pub fn classes(&self) -> Vec<FaultClass> {
        classes_of(self.web, self.database, self.containers)
    }
}

/// `host:port` of a (password-free) database URL, for the peer view.
fn endpoint_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_string()
}

pub fn classes_of(web: WebVerdict, db: DbState, containers: ContainersState) -> Vec<FaultClass> {
    let mut out = Vec::new();
    if web == WebVerdict::Waiting || matches!(db, DbState::Unreachable | DbState::Slow) {
        out.push(FaultClass::Dependency);
    }
    if matches!(
        web,
        WebVerdict::Hung | WebVerdict::Unresponsive | WebVerdict::Down
    ) {
        out.push(FaultClass::Web);
    }
    if containers == ContainersState::Faulty {
        out.push(FaultClass::Containers);
    }
    out
}

/// One round of asking the peers.
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub started: Option<Instant>,
    /// How long the round took: listing the peers and asking them, all at once.
    pub took: Duration,
    pub asked: Vec<String>,
    /// The peers that answered with a valid view (this agent itself left out).
    pub answered: Vec<(String, PeerView)>,
    /// Peers that did not answer usefully, and why (unreachable, slow, garbage, refused).
    pub failed: Vec<(String, exchange::PeerError)>,
    /// Why no peers could be listed (DNS, Consul), if so.
    pub discovery_error: Option<exchange::DiscoveryError>,
}

/// `details.fleet`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FleetReport {
    pub configured: bool,
    pub peers_asked: Vec<String>,
    pub peers_answered: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_age_ms: Option<u64>,
    /// How long the latest round took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_ms: Option<f64>,
    /// Only the classes this instance has now.
    pub judgements: Vec<Judgement>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers_failed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl FleetReport {
    /// Without `[fleet]`: every fault is judged by the single-instance rules, and the note
    /// says so (as it does when no peer answered).
    pub fn not_configured() -> Self {
        Self {
            note: Some(
                "no [fleet] configured: judged alone (the single-instance rules); set \
                 fleet.peers, fleet.peers_dns or fleet.consul_addr to compare with peers"
                    .into(),
            ),
            ..Self::default()
        }
    }
}

/// Decides, per fault class, whether this instance's fault is its own or the fleet's.
#[derive(Debug)]
pub struct Judge {
    /// When each current fault class was first seen here.
    onset: HashMap<FaultClass, Instant>,
    /// How long peers get to see a fault before a round can call it ours alone.
    settle: Duration,
    /// A round older than this is no evidence.
    max_age: Duration,
}

/// However short `fleet.interval`, peers get this long to notice a fault of their own (their
/// probe and check cadences) before this instance calls the fault its own.
const MIN_SETTLE: Duration = Duration::from_secs(5);

impl Judge {
    pub fn new(interval: Duration, timeout: Duration) -> Self {
        Self {
            onset: HashMap::new(),
            settle: MIN_SETTLE.max(interval.saturating_mul(2)),
            max_age: interval.saturating_add(timeout).saturating_mul(3),
        }
    }

    pub fn judge(
        &mut self,
        own: &[FaultClass],
        round: Option<&Round>,
        now: Instant,
    ) -> FleetReport {
        self.onset.retain(|c, _| own.contains(c));
        for &c in own {
            self.onset.entry(c).or_insert(now);
        }
        let mut report = FleetReport {
            configured: true,
            ..FleetReport::default()
        };
        let Some(round) = round else {
            report.note = Some("no round of asking yet: judged alone".into());
            return report;
        };
        let started = round.started.unwrap_or(now);
        report.peers_asked = round.asked.clone();
        report.peers_answered = round.answered.iter().map(|(a, _)| a.clone()).collect();
        report.peers_failed = round
            .failed
            .iter()
            .map(|(a, why)| format!("{a}: {why}"))
            .collect();
        report.round_age_ms = Some(now.saturating_duration_since(started).as_millis() as u64);
        report.round_ms = Some((round.took.as_secs_f64() * 10_000.0).round() / 10.0);
        if now.saturating_duration_since(started) > self.max_age {
            report.note = Some("the latest round is too old: judged alone".into());
            return report;
        }
        let answered = round.answered.len();
        if answered == 0 {
            report.note = Some(match &round.discovery_error {
                Some(e) => format!("no peers to ask ({e}): single-instance rule"),
                None => "no peer answered: single-instance rule".into(),
            });
            return report;
        }
        for &class in own {
            let with = round
                .answered
                .iter()
                .filter(|(_, v)| v.classes().contains(&class))
                .count();
            let noun = class.as_str();
            let judgement = if with * 2 > answered {
                Some((
                    Scope::Shared,
                    format!(
                        "{with}/{answered} peers answering have a {noun} fault too: the fleet's, not this instance's"
                    ),
                ))
            } else if (answered - with) * 2 > answered {
                // Ours alone — but only once the peers have had time to see the same.
                let since = self.onset.get(&class).copied().unwrap_or(now);
                (started >= since + self.settle).then(|| {
                    (
                        Scope::Local,
                        format!(
                            "{}/{answered} peers answering ({}) have no {noun} fault: this instance's own",
                            answered - with,
                            round
                                .answered
                                .iter()
                                .filter(|(_, v)| !v.classes().contains(&class))
                                .map(|(a, _)| a.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })
            } else {
                None
            };
            if let Some((scope, reason)) = judgement {
                report.judgements.push(Judgement {
                    class,
                    scope,
                    peers_with: with,
                    peers_answered: answered,
                    reason,
                });
            }
        }
        if report.judgements.len() < own.len() {
            report.note = Some(
                "some faults are not judged yet (peers split, or too new for the peers to have seen): judged alone"
                    .into(),
            );
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(web: WebVerdict, db: DbState) -> PeerView {
        PeerView {
            web,
            database: db,
            ..PeerView::default()
        }
    }

    fn round(at: Instant, views: &[PeerView]) -> Round {
        Round {
            started: Some(at),
            asked: (0..views.len())
                .map(|i| format!("10.0.0.{i}:8080"))
                .collect(),
            answered: views
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("10.0.0.{i}:8080"), v.clone()))
                .collect(),
            ..Round::default()
        }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_fault_the_peers_do_not_have_is_local_once_they_had_time_to_see_it() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S);
        let ok = view(WebVerdict::Up, DbState::Connected);
        let own = [FaultClass::Dependency];
        // The round began before the peers could have noticed: not judged.
        let r = j.judge(
            &own,
            Some(&round(t0 + S, &[ok.clone(), ok.clone()])),
            t0 + S,
        );
        assert!(r.judgements.is_empty(), "{r:?}");
        // Five seconds after it began here, they still reach it: ours.
        let r = j.judge(
            &own,
            Some(&round(t0 + 6 * S, &[ok.clone(), ok])),
            t0 + 6 * S,
        );
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
        assert!(r.judgements[0].reason.contains("2/2 peers"), "{r:?}");
    }

    #[test]
    fn a_fault_most_peers_share_is_shared_at_once() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S);
        let waiting = view(WebVerdict::Waiting, DbState::Connected);
        let down = view(WebVerdict::Up, DbState::Unreachable);
        let r = j.judge(
            &[FaultClass::Dependency],
            Some(&round(t0, &[waiting, down])),
            t0,
        );
        assert_eq!(r.judgements[0].scope, Scope::Shared, "{r:?}");
    }

    #[test]
    fn split_peers_or_none_leave_the_fault_to_the_single_instance_rule() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S);
        let own = [FaultClass::Web];
        let hung = view(WebVerdict::Hung, DbState::Connected);
        let up = view(WebVerdict::Up, DbState::Connected);
        let r = j.judge(&own, Some(&round(t0 + 9 * S, &[hung, up])), t0 + 9 * S);
        assert!(r.judgements.is_empty(), "1 of 2 is no majority: {r:?}");
        let r = j.judge(&own, Some(&round(t0 + 9 * S, &[])), t0 + 9 * S);
        assert!(r.note.unwrap().contains("single-instance"));
        let r = j.judge(&own, None, t0);
        assert!(r.judgements.is_empty());
    }

    #[test]
    fn an_old_round_is_no_evidence() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S);
        let ok = view(WebVerdict::Up, DbState::Connected);
        let r = j.judge(&[FaultClass::Web], Some(&round(t0, &[ok])), t0 + 60 * S);
        assert!(r.judgements.is_empty() && r.note.unwrap().contains("too old"));
    }

    #[test]
    fn classes_and_views() {
        use FaultClass::*;
        assert_eq!(
            classes_of(
                WebVerdict::Waiting,
                DbState::Connected,
                ContainersState::AllRunning
            ),
            [Dependency]
        );
        assert_eq!(
            classes_of(WebVerdict::Hung, DbState::Slow, ContainersState::Faulty),
            [Dependency, Web, Containers]
        );
        assert!(classes_of(
            WebVerdict::Slow,
            DbState::Misconfigured,
            ContainersState::Unknown
        )
        .is_empty());
        assert_eq!(
            endpoint_of("postgres://app@10.0.3.7:5432/db?x=1"),
            "10.0.3.7:5432"
        );
        assert_eq!(endpoint_of("redis://127.0.0.1:6379"), "127.0.0.1:6379");
        // A newer peer's extra fields are ignored, missing ones default.
        let v: PeerView =
            serde_json::from_str(r#"{"version":1,"web":"hung","future":{"x":1}}"#).unwrap();
        assert_eq!((v.web, v.database), (WebVerdict::Hung, DbState::Unknown));
    }
}
