//! Fleet-aware verdicts: this instance compares each of its faults with what its peers report,
//! to tell its own fault (a restart or a new instance fixes it: 503) from the fleet's (a shared
//! dependency, a bad deploy: a new instance fixes nothing, 200 `infrastructure_issue`).
//!
//! - `PeerView` is what an agent tells its peers about itself (`GET /fleet/v1/view`): its raw
//!   check states, never its fleet-adjusted answer, so no agent echoes another.
//! - `exchange` asks a sample of the peers every `fleet.interval`, off the request path.
//! - `Judge` decides per fault class, local or shared, from the latest round. A peer's "no such
//!   fault" counts only with evidence newer than this instance's fault (its backend answered,
//!   its database round trip passed, after the onset here); until most peers have said so,
//!   or have the fault too, the fault is `asking`: never a 503, never a restart.

pub mod addr;
pub mod asg;
pub mod consul;
pub mod exchange;
pub mod key;
pub mod kind;
pub mod latency;
pub mod proof;
pub mod view;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
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
/// The view's query asking the peer to check its dependencies now: an agent with a dependency
/// fault needs the peers' word on theirs from after its onset, sooner than their own cadence.
pub const FRESH_DEPENDENCY: &str = "fresh=dependency";
/// … and to sample its answers now (an errors fault waits on the peers' word).
pub const FRESH_ANSWERS: &str = "fresh=answers";

/// What this agent shows its peers beyond the snapshot, live: its evidence against each kind
/// of fault (the composer writes it every tick, so a peer asking just after this instance's
/// backend answered hears so), and what a peer's `?fresh=dependency` wakes — the database
/// check, at most once per RECHECK_AT_MOST (a peer asks every quarter second while it waits;
/// a flood of asks must not become a flood of round trips to the database).
#[derive(Debug, Clone, Default)]
pub struct Witness {
    evidence: Arc<Mutex<Evidence>>,
    database: Option<Arc<tokio::sync::Notify>>,
    last_recheck: Arc<Mutex<Option<Instant>>>,
    /// A peer asked for fresh answers (`?fresh=answers`) and the monitor has not taken it up.
    answers_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// The fleet-wide incidents this agent holds open, as the alerts last wrote them.
    alerts: Arc<Mutex<Vec<HeldClaim>>>,
}

const RECHECK_AT_MOST: Duration = Duration::from_secs(1);

impl Witness {
    pub fn new(database: Option<Arc<tokio::sync::Notify>>) -> Self {
        Self {
            database,
            ..Self::default()
        }
    }

    pub fn evidence(&self) -> Evidence {
        self.evidence.lock().map(|e| *e).unwrap_or_default()
    }

    pub fn update(&self, f: impl FnOnce(&mut Evidence)) {
        if let Ok(mut e) = self.evidence.lock() {
            f(&mut e);
        }
    }

    /// A peer wants this instance's answers sampled now.
    pub fn want_answers(&self) {
        self.answers_wanted
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a peer asked for fresh answers since the last call.
    pub fn take_answers_wanted(&self) -> bool {
        self.answers_wanted
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// What the alerts tell the peers from now on (`alerts::fleet`).
    pub fn set_alerts(&self, claims: Vec<HeldClaim>) {
        if let Ok(mut a) = self.alerts.lock() {
            *a = claims;
        }
    }

    /// The fleet-wide incidents held open here, as the view shows them at `now`.
    pub fn alerts(&self, now: Instant) -> Vec<AlertClaim> {
        self.alerts
            .lock()
            .map(|a| a.iter().map(|c| c.at(now)).collect())
            .unwrap_or_default()
    }

    /// Wakes the database check now unless it was woken within RECHECK_AT_MOST; whether it was.
    pub fn recheck(&self, now: Instant) -> bool {
        let Some(n) = &self.database else {
            return false;
        };
        let Ok(mut last) = self.last_recheck.lock() else {
            return false;
        };
        if last.is_some_and(|t| now.saturating_duration_since(t) < RECHECK_AT_MOST) {
            return false;
        }
        *last = Some(now);
        n.notify_one();
        true
    }
}

/// A random id for this agent process: a peer list that includes this agent itself (DNS,
/// Consul) is recognised by it.
pub fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("{:016x}", fastrand::u64(..)))
}

/// Where the trigger of a fleet-wide incident is, as an agent holding it knows.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TriggerState {
    /// Not sent yet, as far as it knows.
    #[default]
    None,
    /// This agent queued it and its destinations are still being tried.
    Pending,
    /// It went out (delivered, or given up on after the retries), from whichever agent.
    Sent,
}

/// A fleet-wide incident as an agent that holds it open shows it (`PeerView::alerts`): the
/// agent it takes for the incident's reporter and how fresh that word is, and whether the
/// trigger went out. `alerts::fleet` decides with these who sends.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct AlertClaim {
    /// The condition's key (`infrastructure_issue`).
    pub condition: String,
    /// The instance id it takes for the reporter.
    pub reporter: String,
    /// How old its latest word is that the reporter holds the incident open (0: itself).
    pub reporter_ms: u64,
    pub trigger: TriggerState,
}

/// An [`AlertClaim`] as the alerts keep it: when the reporter was last heard, not how long ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldClaim {
    pub condition: &'static str,
    pub reporter: String,
    pub reporter_heard: Instant,
    pub trigger: TriggerState,
}

impl HeldClaim {
    fn at(&self, now: Instant) -> AlertClaim {
        AlertClaim {
            condition: self.condition.to_string(),
            reporter: self.reporter.clone(),
            reporter_ms: now
                .saturating_duration_since(self.reporter_heard)
                .as_millis() as u64,
            trigger: self.trigger,
        }
    }
}

/// What one peer that answered in a round said of the fleet-wide incidents: every one it holds
/// open (none: it holds none).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerAlerts {
    pub instance: String,
    /// When the round that heard it began.
    pub heard: Instant,
    pub alerts: Vec<AlertClaim>,
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
    /// How old, as the view was served, this agent's latest evidence is that each kind of
    /// fault is absent here. `None` from agents that predate it: their "fine" counts only
    /// after a settling time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fine_ms: Option<FineAges>,
    /// What its web backend answers over its `web.errors_window`: the 5xx share the peers
    /// compare an errors fault with. None from agents that predate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<PeerAnswers>,
    /// The fleet-wide incidents it holds open.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<AlertClaim>,
    /// Its answer latency over its `web.latency_window`, and whether it is out for slowness
    /// against its peers (`latency`). None from agents that predate it, or without figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<latency::PeerLatency>,
}

/// A peer's real answers over its window, as its view carries them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PeerAnswers {
    /// Whether their status can be read (plaintext HTTP/1.x).
    pub visible: bool,
    pub answers: u64,
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub share_5xx: Option<f64>,
}

impl PeerAnswers {
    fn describe(&self) -> String {
        match self.share_5xx {
            Some(s) => format!("{:.0}% of {}", s * 100.0, self.answers),
            None => "no real answers".into(),
        }
    }
}

/// Ages in milliseconds of an agent's latest evidence, per fault class, that the class is
/// absent: its web backend answered (a response byte on its port, or its probe passed), its
/// database round trip passed, its containers were seen running. `None`: no such evidence
/// (never, or not checked).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct FineAges {
    pub web: Option<u64>,
    pub dependency: Option<u64>,
    pub containers: Option<u64>,
    /// Its real answers, enough of them to judge, were mostly not 5xx.
    pub errors: Option<u64>,
}

impl FineAges {
    fn of(self, class: FaultClass) -> Option<u64> {
        match class {
            FaultClass::Web => self.web,
            FaultClass::Dependency => self.dependency,
            FaultClass::Containers => self.containers,
            FaultClass::Errors => self.errors,
        }
    }
}

/// When this agent last had evidence that each kind of fault is absent (see [`FineAges`]):
/// kept by the runner beside the report, shown to peers as ages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The web backend answered: a response byte on its port, or the probe passed.
    pub web_answered: Option<Instant>,
    /// Every configured database round-tripped.
    pub database_ok: Option<Instant>,
    /// A database check is configured: only its round trips speak against a dependency fault.
    pub database_configured: bool,
    /// Every expected container was seen running.
    pub containers_ok: Option<Instant>,
    /// The web backend's real answers, enough to judge, were mostly not 5xx.
    pub answers_fine: Option<Instant>,
}

impl Evidence {
    /// As ages at `now`. Without a database check, the web backend answering (not waiting on
    /// anything) is the evidence against a dependency fault.
    pub fn ages(&self, now: Instant) -> FineAges {
        let age =
            |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t).as_millis() as u64);
        FineAges {
            web: age(self.web_answered),
            dependency: age(if self.database_configured {
                self.database_ok
            } else {
                self.web_answered
            }),
            containers: age(self.containers_ok),
            errors: age(self.answers_fine),
        }
    }
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
            fine_ms: None,
            answers: None,
            alerts: Vec::new(),
            latency: None,
        }
    }
}

impl PeerView {
    /// The view served at `now`, with `evidence`'s ages as of then (the fleet-wide incidents
    /// are the witness's to add).
    pub fn of(report: &Report, evidence: &Evidence, host: &str, now: Instant) -> Self {
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
            fine_ms: Some(evidence.ages(now)),
            answers: report.web.answers.as_ref().map(|a| PeerAnswers {
                visible: a.status_visible,
                answers: a.answers,
                share_5xx: a.share_5xx,
            }),
            alerts: Vec::new(),
            latency: None,
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
    if web == WebVerdict::Erroring {
        out.push(FaultClass::Errors);
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
    /// Peers' failures since the agent started, by reason (`exchange::FAILURE_REASONS`).
    pub failures: [u64; exchange::FAILURE_REASONS.len()],
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
    #[serde(serialize_with = "crate::text::shown::ms_opt")]
    pub round_ms: Option<f64>,
    /// Only the classes this instance has now.
    pub judgements: Vec<Judgement>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers_failed: Vec<String>,
    /// Why listing the peers failed (DNS, Consul, the auto-scaling group), whether or not
    /// some were asked all the same (a group listed earlier, another source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery: Option<String>,
    /// Faults of this instance still waiting for the peers' fresh word: no 503 for them yet.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub asking: Vec<FaultClass>,
    /// Slow against the peers' figures, which were counted before it looked slow: waiting for
    /// figures counting only answers after it, no restart and no 503 meanwhile.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub asking_latency: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// This instance's answer latency as its peers see it (`PeerView::latency`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<latency::PeerLatency>,
    /// The answering peers' latency figures, by address.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub peers_latency: std::collections::BTreeMap<String, latency::PeerLatency>,
    /// The comparison of this instance's latency with the peers': slow against them (its
    /// latency, theirs, the ratio), alike, or why not compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_comparison: Option<String>,
    /// What each peer that answered the latest round said of the fleet-wide incidents, for the
    /// alerts (not shown).
    #[serde(skip)]
    pub peer_alerts: Vec<PeerAlerts>,
    /// Peers' failures since the agent started, by reason, for `/metrics`.
    #[serde(skip)]
    pub failures: [u64; exchange::FAILURE_REASONS.len()],
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

mod judge;
pub use judge::Judge;

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
        let mut j = Judge::new(S, S, 8 * S);
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

    /// A peer without a database check has its backend answering, which speaks against the
    /// backend waiting on a dependency, not against this instance's database being down: the
    /// fault stays the fleet's (200), not this instance's own (503).
    #[test]
    fn a_peer_that_checks_no_database_says_nothing_of_ours() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Dependency];
        let no_db = PeerView {
            database: DbState::NotConfigured,
            ..fine(WebVerdict::Up, 100)
        };
        j.judge_own(&own, true, None, t0);
        let at = t0 + 6 * S;
        let peers = round(at, &[no_db.clone(), no_db.clone()]);
        let r = j.judge_own(&own, true, Some(&peers), at);
        assert!(
            r.judgements.iter().all(|j| j.scope != Scope::Local),
            "{r:?}"
        );
        // The backend waiting on a dependency: their answers speak, the fault is its own.
        let mut j = Judge::new(S, S, 8 * S);
        j.judge(&own, None, t0);
        let r = j.judge(&own, Some(&peers), at);
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
    }

    /// A peer's view with evidence of each class `ms` old.
    fn fine(web: WebVerdict, ms: u64) -> PeerView {
        PeerView {
            fine_ms: Some(FineAges {
                web: Some(ms),
                dependency: Some(ms),
                containers: None,
                errors: None,
            }),
            ..view(web, DbState::Connected)
        }
    }

    #[test]
    fn the_end_of_a_shared_fault_seen_first_by_the_peers_is_not_this_instances_own() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Dependency];
        let down = view(WebVerdict::NotConfigured, DbState::Unreachable);
        j.judge(&own, None, t0);
        let at = t0 + 2 * S;
        let r = j.judge(&own, Some(&round(at, &[down.clone(), down])), at);
        assert_eq!(r.judgements[0].scope, Scope::Shared, "{r:?}");
        // The database is back: the peers' checks saw it first (100 ms ago), this one's not yet.
        let back = fine(WebVerdict::NotConfigured, 100);
        let at = t0 + 3 * S;
        let r = j.judge(&own, Some(&round(at, &[back.clone(), back.clone()])), at);
        assert!(r.judgements.is_empty(), "{r:?}");
        assert_eq!(r.asking, vec![FaultClass::Dependency], "{r:?}");
        assert!(
            r.note.as_deref().is_some_and(|n| n.contains("see it end")),
            "{r:?}"
        );
        // Still failing here past the bound while the peers stay fine: this instance's own.
        let at = t0 + 11 * S;
        let r = j.judge(&own, Some(&round(at, &[back.clone(), back])), at);
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
    }

    #[test]
    fn a_peer_that_answered_after_the_fault_began_makes_it_local_at_once() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        j.judge(&own, None, t0);
        // Asked 300 ms after the onset; its backend answered 100 ms before it was asked.
        let at = t0 + Duration::from_millis(300);
        let r = j.judge(&own, Some(&round(at, &[fine(WebVerdict::Up, 100)])), at);
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
        assert!(r.asking.is_empty(), "{r:?}");
    }

    #[test]
    fn a_peer_whose_evidence_predates_the_fault_is_asked_again_never_called_fine() {
        // Two idle instances whose backends stop at once: the peer's last answer predates
        // this instance's fault, it has not seen its own yet.
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        j.judge(&own, None, t0);
        for ms in [100u64, 1_500, 3_000] {
            let at = t0 + Duration::from_millis(ms);
            // Its backend last answered 2 s before the onset here.
            let r = j.judge(
                &own,
                Some(&round(at, &[fine(WebVerdict::Up, ms + 2_000)])),
                at,
            );
            assert!(r.judgements.is_empty(), "{ms} ms: {r:?}");
            assert_eq!(r.asking, [FaultClass::Web], "{ms} ms: {r:?}");
            assert!(
                r.note.as_deref().unwrap_or("").contains("asking again"),
                "{r:?}"
            );
        }
        // It has seen the same now: shared, never a 503.
        let at = t0 + 4 * S;
        let r = j.judge(&own, Some(&round(at, &[fine(WebVerdict::Hung, 2_500)])), at);
        assert_eq!(r.judgements[0].scope, Scope::Shared, "{r:?}");
        assert!(r.asking.is_empty());
    }

    #[test]
    fn a_local_verdict_is_revisited_when_the_peers_get_the_same_fault() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        j.judge(&own, None, t0);
        let at = t0 + S;
        let r = j.judge(&own, Some(&round(at, &[fine(WebVerdict::Up, 10)])), at);
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
        // Later the peer hangs too: the fleet's fault now, the 503 goes.
        let at = t0 + 20 * S;
        let r = j.judge(&own, Some(&round(at, &[fine(WebVerdict::Hung, 3_000)])), at);
        assert_eq!(r.judgements[0].scope, Scope::Shared, "{r:?}");
    }

    #[test]
    fn a_round_from_before_the_fault_confirms_nothing() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let before = round(t0, &[fine(WebVerdict::Up, 0), fine(WebVerdict::Up, 0)]);
        let r = j.judge(
            &[FaultClass::Web],
            Some(&before),
            t0 + Duration::from_millis(10),
        );
        assert_eq!(r.asking, [FaultClass::Web], "{r:?}");
    }

    #[test]
    fn stale_peers_are_left_out_after_the_bound() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        j.judge(&own, None, t0);
        let stale = fine(WebVerdict::Up, 60_000);
        let at = t0 + 9 * S;
        let r = j.judge(&own, Some(&round(at, std::slice::from_ref(&stale))), at);
        assert!(r.judgements.is_empty() && r.asking.is_empty(), "{r:?}");
        assert!(r.note.unwrap().contains("single-instance"));
        // With a fresh peer beside it, the fresh one decides.
        let r = j.judge(
            &own,
            Some(&round(at, &[stale, fine(WebVerdict::Up, 10)])),
            at,
        );
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
        assert_eq!(r.judgements[0].peers_answered, 1, "{r:?}");
    }

    #[test]
    fn no_first_round_waits_within_the_bound_only() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        assert_eq!(j.judge(&own, None, t0).asking, own);
        assert!(j.judge(&own, None, t0 + 9 * S).asking.is_empty());
    }

    #[test]
    fn a_peer_without_a_web_backend_says_nothing_of_a_web_fault() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let own = [FaultClass::Web];
        j.judge(&own, None, t0);
        let at = t0 + S;
        let none = fine(WebVerdict::NotConfigured, 0);
        let r = j.judge(
            &own,
            Some(&round(at, &[none.clone(), fine(WebVerdict::Up, 5)])),
            at,
        );
        assert_eq!(r.judgements[0].scope, Scope::Local, "{r:?}");
        assert_eq!(r.judgements[0].peers_answered, 1, "{r:?}");
        let r = j.judge(&own, Some(&round(at, &[none])), at);
        assert!(r.judgements.is_empty() && r.asking.is_empty(), "{r:?}");
    }

    #[test]
    fn evidence_ages_follow_the_database_check_when_there_is_one() {
        let t0 = Instant::now();
        let e = Evidence {
            web_answered: Some(t0),
            database_ok: None,
            database_configured: true,
            containers_ok: Some(t0 + S),
            answers_fine: None,
        };
        let a = e.ages(t0 + 2 * S);
        assert_eq!(
            (a.web, a.dependency, a.containers),
            (Some(2000), None, Some(1000))
        );
        let a = Evidence {
            database_configured: false,
            ..e
        }
        .ages(t0 + 2 * S);
        assert_eq!(a.dependency, Some(2000));
    }

    #[test]
    fn a_peers_fresh_ask_wakes_the_database_check_at_most_once_a_second() {
        let n = Arc::new(tokio::sync::Notify::new());
        let w = Witness::new(Some(n.clone()));
        let t0 = Instant::now();
        assert!(w.recheck(t0));
        assert!(
            !w.clone().recheck(t0 + Duration::from_millis(250)),
            "a second ask within 1 s, through a clone (the server's)"
        );
        assert!(w.recheck(t0 + S));
        assert!(
            !Witness::default().recheck(t0),
            "no database check: nothing to wake"
        );
        // The evidence written through one clone is what another reads.
        w.update(|e| e.web_answered = Some(t0));
        assert_eq!(w.clone().evidence().web_answered, Some(t0));
        // The wake-up is stored for the check's task even if it is mid-round.
        let woken = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { tokio::time::timeout(S, n.notified()).await.is_ok() });
        assert!(woken);
    }

    #[test]
    fn a_fault_most_peers_share_is_shared_at_once() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
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
    fn a_listing_that_failed_is_said_even_when_peers_were_asked() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
        let mut r = round(t0, &[fine(WebVerdict::Up, 10)]);
        r.discovery_error = Some(exchange::DiscoveryError::Asg(
            "listing failed, asking the 1 peer(s) listed 70 s ago: throttled".into(),
        ));
        let out = j.judge(&[], Some(&r), t0);
        assert_eq!(out.peers_answered.len(), 1);
        assert!(out.discovery.unwrap().contains("throttled"));
        assert!(j.judge(&[], Some(&round(t0, &[])), t0).discovery.is_none());
    }

    #[test]
    fn split_peers_or_none_leave_the_fault_to_the_single_instance_rule() {
        let t0 = Instant::now();
        let mut j = Judge::new(S, S, 8 * S);
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
        let mut j = Judge::new(S, S, 8 * S);
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
