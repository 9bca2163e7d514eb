//! Incidents: which snapshot conditions alert, and the per-condition state machine that turns a
//! stream of snapshots into one trigger and one resolve per incident. An incident opens on the
//! first snapshot with its condition and resolves only once the condition has been absent
//! continuously for `alerts.resolve_after`, so a flapping condition is one incident, not many.
//! Each incident is this host's or, for a fault the peers judged shared, the fleet's (`Scope`,
//! fixed when it opens); who sends a fleet's incident is `fleet`'s to decide.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use serde_json::Value;

use super::evidence::Pending;
use crate::{
    policy::Fault,
    snapshot::Snapshot,
    status::{DbState, HealPhase, Recommendation, Status, WebVerdict},
};

/// `dedup_key` (PagerDuty) and fingerprint (GitHub) length limit.
const KEY_LIMIT: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Condition {
    /// The policy blames a shared dependency (database unreachable/slow, or a web fault while
    /// it is): every instance sees it, nobody should replace this one.
    InfrastructureIssue,
    /// `/health` answers 503: the scaling group is about to replace the instance, so the
    /// evidence has to leave the box now.
    Unhealthy,
    /// Self-healing tried and failed, or its budget is spent.
    HealFailed,
    /// A check is misconfigured: the database refused the agent's credentials or database
    /// name, or its TLS handshake or certificate check failed; the web probe path answers 4xx,
    /// or `web.container` / `web.netns` names nothing. Nothing is replaced for it, but a person
    /// has to fix it.
    ConfigError,
    /// The web backend's real answers are mostly 5xx while it stays in rotation (no peers to
    /// compare, and a restart did not help or cannot be made): nothing replaces it, a person
    /// has to look. Erroring the peers share is an `InfrastructureIssue`; one that takes the
    /// instance out is `Unhealthy`.
    Erroring,
}

impl Condition {
    pub const ALL: [Condition; 5] = [
        Self::InfrastructureIssue,
        Self::Unhealthy,
        Self::HealFailed,
        Self::ConfigError,
        Self::Erroring,
    ];

    /// The machine name, used in keys, labels and payloads.
    pub fn key(self) -> &'static str {
        match self {
            Self::InfrastructureIssue => "infrastructure_issue",
            Self::Unhealthy => "unhealthy",
            Self::HealFailed => "heal_failed",
            Self::ConfigError => "config_error",
            Self::Erroring => "erroring",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::InfrastructureIssue => "infrastructure issue",
            Self::Unhealthy => "unhealthy (503)",
            Self::HealFailed => "self-heal failed",
            Self::ConfigError => "check misconfigured",
            Self::Erroring => "web backend answering mostly 5xx",
        }
    }

    pub fn holds(self, snap: &Snapshot) -> bool {
        match self {
            Self::InfrastructureIssue => {
                snap.decision.recommendation == Recommendation::InfrastructureIssue
            }
            // A drain is no incident: taken out on purpose, and back after undrain.
            Self::Unhealthy => {
                snap.decision.http == 503
                    && snap.decision.status != Status::Draining
                    && !(snap.decision.status == Status::Booting && snap.drain.is_some())
            }
            Self::HealFailed => snap.heal.phase == Some(HealPhase::Exhausted),
            Self::ConfigError => {
                snap.report.database.state == DbState::Misconfigured
                    || snap.report.web.config_error.is_some()
            }
            // Kept in rotation for good: not while a restart runs (`recovering`) or the peers
            // are still being asked (a moment, before a 503 or an infrastructure issue).
            Self::Erroring => {
                snap.report.web.verdict == WebVerdict::Erroring
                    && snap.decision.status == Status::Degraded
                    && snap.decision.recommendation == Recommendation::Stable
                    && !snap
                        .fleet
                        .asking
                        .contains(&crate::status::FaultClass::Errors)
            }
        }
    }

    /// Whether the condition holds in `snap`, and for whom. Only an infrastructure issue can be
    /// the fleet's: with fleet alerting on (`fleet`), it is when the peers judged a fault of
    /// this instance shared, undecided while they are still being asked, and this host's when
    /// it was judged alone (no peer answered, none configured).
    pub fn scope_in(self, snap: &Snapshot, fleet: bool) -> Holds {
        if !self.holds(snap) {
            return Holds::No;
        }
        if self != Self::InfrastructureIssue || !fleet || !snap.fleet.configured {
            return Holds::Yes(Scope::Host);
        }
        let shared = snap
            .fleet
            .judgements
            .iter()
            .any(|j| j.scope == crate::status::Scope::Shared);
        if shared {
            Holds::Yes(Scope::Fleet)
        } else if !snap.fleet.asking.is_empty() {
            Holds::Undecided
        } else {
            Holds::Yes(Scope::Host)
        }
    }

    /// PagerDuty `payload.severity`: the instance itself is broken → critical; a shared
    /// dependency (handled elsewhere, fleet-wide) → warning.
    pub fn pd_severity(self) -> &'static str {
        match self {
            Self::Unhealthy | Self::HealFailed => "critical",
            Self::InfrastructureIssue | Self::ConfigError => "warning",
            Self::Erroring => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Whose an incident is: this host's, or the fleet's that shares the fault (one incident for
/// all its instances).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Host,
    Fleet,
}

/// What one snapshot says of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    No,
    Yes(Scope),
    /// It holds, but whether the fleet shares it is still being asked: nothing opens yet (an
    /// open incident stays open).
    Undecided,
}

/// Stable per host and condition: PagerDuty's `dedup_key`, GitHub's issue fingerprint.
pub fn fingerprint(host: &str, condition: Condition) -> String {
    let k = format!("health-agent/{host}/{}", condition.key());
    crate::text::cut(&k, KEY_LIMIT).to_string()
}

/// The same for the incident a whole fleet shares: every agent of the fleet makes the same.
pub fn fleet_fingerprint(fleet: &str, condition: Condition) -> String {
    let k = format!("health-agent/fleet/{fleet}/{}", condition.key());
    crate::text::cut(&k, KEY_LIMIT).to_string()
}

/// GitHub priority label. P1: the instance is unhealthy and a suspicious process (a miner, an
/// executable in /tmp) runs on it, or self-healing failed; P2: unhealthy; P3: infrastructure
/// issue (a shared dependency: real, but not this box's fault). P4 is for anything else — no
/// condition maps there today.
pub fn priority(condition: Condition, suspicious: bool) -> &'static str {
    match condition {
        Condition::HealFailed => "p1",
        Condition::Unhealthy if suspicious => "p1",
        Condition::Unhealthy => "p2",
        Condition::Erroring => "p2",
        Condition::InfrastructureIssue | Condition::ConfigError => "p3",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Trigger,
    Resolve,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub kind: Kind,
    pub condition: Condition,
    pub scope: Scope,
    /// Unique per incident (per `Alerts`), pairs a resolve with its trigger.
    pub incident: u64,
    pub opened_at: SystemTime,
}

#[derive(Debug)]
struct Open {
    incident: u64,
    scope: Scope,
    opened_at: SystemTime,
    /// The first snapshot without the condition since it was last seen.
    absent_since: Option<Instant>,
}

/// One state machine per condition. Pure apart from reading the wall clock for `opened_at`.
#[derive(Debug)]
pub struct Tracker {
    resolve_after: Duration,
    open: [Option<Open>; Condition::ALL.len()],
    next_incident: u64,
}

impl Tracker {
    pub fn new(resolve_after: Duration) -> Self {
        Self {
            resolve_after,
            open: [const { None }; Condition::ALL.len()],
            next_incident: 1,
        }
    }

    /// Advances every condition with one snapshot's facts. An incident takes the scope the
    /// condition had when it opened, and keeps it until it resolves.
    pub fn step(&mut self, holds: impl Fn(Condition) -> Holds, now: Instant) -> Vec<Transition> {
        let mut out = Vec::new();
        for condition in Condition::ALL {
            let slot = &mut self.open[condition.index()];
            match (slot.as_mut(), holds(condition)) {
                (None, Holds::Yes(scope)) => {
                    let open = Open {
                        incident: self.next_incident,
                        scope,
                        opened_at: SystemTime::now(),
                        absent_since: None,
                    };
                    self.next_incident += 1;
                    out.push(Transition {
                        kind: Kind::Trigger,
                        condition,
                        scope,
                        incident: open.incident,
                        opened_at: open.opened_at,
                    });
                    *slot = Some(open);
                }
                (Some(open), Holds::Yes(_) | Holds::Undecided) => open.absent_since = None,
                (Some(open), Holds::No) => {
                    let since = *open.absent_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= self.resolve_after {
                        out.push(Transition {
                            kind: Kind::Resolve,
                            condition,
                            scope: open.scope,
                            incident: open.incident,
                            opened_at: open.opened_at,
                        });
                        *slot = None;
                    }
                }
                (None, Holds::No | Holds::Undecided) => {}
            }
        }
        out
    }

    pub fn is_open(&self, condition: Condition) -> bool {
        self.open[condition.index()].is_some()
    }
}

/// One message for every destination: a transition plus the snapshot it happened in. Built
/// on the composer's thread, so it only copies cheap things (the rendered bodies are `Bytes`).
pub struct Event {
    pub kind: Kind,
    pub condition: Condition,
    pub incident: u64,
    pub host: Arc<str>,
    /// When it happened (the trigger: when the incident opened).
    pub at: SystemTime,
    pub opened_at: SystemTime,
    pub status: Status,
    pub http: u16,
    pub recommendation: Recommendation,
    pub reasons: Vec<String>,
    pub faults: Vec<Fault>,
    /// The web backend was erroring (its real answers mostly 5xx): what an infrastructure
    /// issue is about, rather than the database.
    pub erroring: bool,
    /// The snapshot's seed body and full diagnostics (the `/health` renderings).
    pub brief: Bytes,
    pub full: Bytes,
    /// Process evidence, collected in the background at trigger time (GitHub only).
    pub evidence: Option<Pending>,
    /// The fleet's incident, sent by this agent as its reporter; None: this host's.
    pub fleet: Option<FleetTag>,
}

/// A fleet's incident: the fleet's name and how many of its instances this agent knows have it
/// (itself included; at a resolve, the most it knew at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetTag {
    pub name: Arc<str>,
    pub instances: usize,
}

impl Event {
    pub fn new(t: &Transition, snap: &Snapshot, host: Arc<str>, evidence: Option<Pending>) -> Self {
        Self {
            kind: t.kind,
            condition: t.condition,
            incident: t.incident,
            host,
            at: match t.kind {
                Kind::Trigger => t.opened_at,
                Kind::Resolve => SystemTime::now(),
            },
            opened_at: t.opened_at,
            status: snap.decision.status,
            http: snap.decision.http,
            recommendation: snap.decision.recommendation,
            // Every destination shows them on one line, and some of their words come from
            // outside (a peer, a database server): no control characters from here on.
            reasons: (snap.decision.reasons.iter())
                .map(|r| crate::text::clean(r).into_owned())
                .collect(),
            faults: snap.decision.faults.clone(),
            erroring: snap.report.web.verdict == WebVerdict::Erroring,
            brief: snap.body(crate::snapshot::Rendering::Brief).clone(),
            full: snap.body(crate::snapshot::Rendering::Full).clone(),
            evidence,
            fleet: None,
        }
    }

    /// As the fleet's incident, sent by this agent for all of it.
    pub fn for_fleet(mut self, tag: FleetTag) -> Self {
        self.fleet = Some(tag);
        self
    }

    pub fn fingerprint(&self) -> String {
        match &self.fleet {
            Some(f) => fleet_fingerprint(&f.name, self.condition),
            None => fingerprint(&self.host, self.condition),
        }
    }

    /// Whose incident it is, for titles: `web-1`, or `fleet shop (3 instances)`.
    pub fn place(&self) -> String {
        match &self.fleet {
            Some(f) => format!("fleet {} ({})", f.name, instances(f.instances)),
            None => self.host.to_string(),
        }
    }

    /// For log lines: `trigger unhealthy #3`, `trigger infrastructure_issue #4 for fleet shop`.
    pub fn describe(&self) -> String {
        let verb = match self.kind {
            Kind::Trigger => "trigger",
            Kind::Resolve => "resolve",
        };
        let fleet = self
            .fleet
            .as_ref()
            .map(|f| format!(" for fleet {}", f.name))
            .unwrap_or_default();
        format!("{verb} {} #{}{fleet}", self.condition.key(), self.incident)
    }

    /// The seed's `checks` object (webserver, database, disk, containers, cpu, memory).
    pub fn checks(&self) -> Value {
        serde_json::from_slice::<Value>(&self.brief)
            .ok()
            .and_then(|mut v| v.get_mut("checks").map(Value::take))
            .unwrap_or(Value::Null)
    }

    /// The full `/health` diagnostics body.
    pub fn snapshot(&self) -> Value {
        serde_json::from_slice(&self.full).unwrap_or(Value::Null)
    }

    /// How long the incident lasted (resolve) or has lasted so far.
    pub fn duration(&self) -> Duration {
        self.at.duration_since(self.opened_at).unwrap_or_default()
    }

    /// What is broken, for PagerDuty's `component`: the faults, or the condition's area.
    pub fn component(&self) -> String {
        if self.condition == Condition::InfrastructureIssue {
            return if self.erroring { "web" } else { "database" }.into();
        }
        let mut parts: Vec<&str> = self
            .faults
            .iter()
            .map(|f| match f {
                Fault::Web(_) | Fault::NeverServed | Fault::SlowVsPeers => "web",
                Fault::Dependency => "database",
                Fault::DiskFull => "disk",
                Fault::Containers => "containers",
            })
            .collect();
        parts.dedup();
        if parts.is_empty() {
            "instance".into()
        } else {
            parts.join(",")
        }
    }

    /// One line: `web-1: unhealthy (503) — disk usage at or above the fail threshold`, or
    /// `fleet shop (3 instances): infrastructure issue — database unreachable`.
    pub fn summary(&self) -> String {
        let mut s = format!("{}: {}", self.place(), self.condition.title());
        if !self.reasons.is_empty() {
            s.push_str(" — ");
            s.push_str(&self.reasons.join("; "));
        }
        s
    }
}

/// `5m 3s` style, whole seconds.
pub fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// `1 instance`, `3 instances`.
pub fn instances(n: usize) -> String {
    format!("{n} instance{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn only(c: Condition) -> impl Fn(Condition) -> Holds {
        move |x| {
            if x == c {
                Holds::Yes(Scope::Host)
            } else {
                Holds::No
            }
        }
    }

    fn none(_: Condition) -> Holds {
        Holds::No
    }

    #[test]
    fn opens_once_and_resolves_after_continuous_absence() {
        let t0 = Instant::now();
        let mut t = Tracker::new(200 * MS);
        let open = t.step(only(Condition::Unhealthy), t0);
        assert_eq!(open.len(), 1);
        assert_eq!(
            (open[0].kind, open[0].condition),
            (Kind::Trigger, Condition::Unhealthy)
        );
        assert!(t.step(only(Condition::Unhealthy), t0 + 50 * MS).is_empty());
        assert!(t.step(none, t0 + 100 * MS).is_empty());
        assert!(t.step(none, t0 + 250 * MS).is_empty(), "absent 150 ms only");
        let done = t.step(none, t0 + 300 * MS);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].kind, Kind::Resolve);
        assert_eq!(done[0].incident, open[0].incident);
        assert!(!t.is_open(Condition::Unhealthy));
        // The next occurrence is a new incident.
        let again = t.step(only(Condition::Unhealthy), t0 + 400 * MS);
        assert_eq!(again[0].kind, Kind::Trigger);
        assert_ne!(again[0].incident, open[0].incident);
    }

    #[test]
    fn flaps_within_resolve_after_are_one_incident() {
        let t0 = Instant::now();
        let mut t = Tracker::new(200 * MS);
        let mut all = Vec::new();
        for i in 0..10 {
            all.extend(t.step(only(Condition::InfrastructureIssue), t0 + i * 100 * MS));
            all.extend(t.step(none, t0 + (i * 100 + 50) * MS));
        }
        assert_eq!(all.len(), 1, "{all:?}");
        all.extend(t.step(none, t0 + 1200 * MS));
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].kind, Kind::Resolve);
    }

    #[test]
    fn conditions_are_independent() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS);
        let both = |c| {
            if matches!(c, Condition::Unhealthy | Condition::HealFailed) {
                Holds::Yes(Scope::Host)
            } else {
                Holds::No
            }
        };
        assert_eq!(t.step(both, t0).len(), 2);
        assert!(t.step(only(Condition::Unhealthy), t0 + 50 * MS).is_empty());
        let r = t.step(only(Condition::Unhealthy), t0 + 200 * MS);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].kind, r[0].condition),
            (Kind::Resolve, Condition::HealFailed)
        );
    }

    #[test]
    fn the_scope_is_fixed_at_opening_and_undecided_opens_nothing() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS);
        let infra = |h: Holds| {
            move |c| {
                if c == Condition::InfrastructureIssue {
                    h
                } else {
                    Holds::No
                }
            }
        };
        assert!(t.step(infra(Holds::Undecided), t0).is_empty());
        let open = t.step(infra(Holds::Yes(Scope::Fleet)), t0 + 10 * MS);
        assert_eq!((open[0].kind, open[0].scope), (Kind::Trigger, Scope::Fleet));
        // Judged alone for a while (no peer answered): the same incident, still the fleet's.
        assert!(t
            .step(infra(Holds::Yes(Scope::Host)), t0 + 20 * MS)
            .is_empty());
        assert!(t.step(infra(Holds::Undecided), t0 + 150 * MS).is_empty());
        let done = t.step(none, t0 + 300 * MS);
        assert!(done.is_empty());
        let done = t.step(none, t0 + 400 * MS);
        assert_eq!((done[0].kind, done[0].scope), (Kind::Resolve, Scope::Fleet));
    }

    #[test]
    fn keys_and_priorities() {
        assert_eq!(
            fingerprint("web-1", Condition::Unhealthy),
            "health-agent/web-1/unhealthy"
        );
        assert!(fingerprint(&"h".repeat(400), Condition::HealFailed).len() <= 255);
        assert_eq!(
            fleet_fingerprint("shop", Condition::InfrastructureIssue),
            "health-agent/fleet/shop/infrastructure_issue"
        );
        assert_eq!(priority(Condition::Unhealthy, true), "p1");
        assert_eq!(priority(Condition::HealFailed, false), "p1");
        assert_eq!(priority(Condition::Unhealthy, false), "p2");
        assert_eq!(priority(Condition::InfrastructureIssue, true), "p3");
    }
}
