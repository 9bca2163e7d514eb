//! The status policy of SPEC.md as one pure function: check results in, (`status`, HTTP code,
//! `recommendation`, reasons) out. 503 only for what a new instance or a restart would fix;
//! a shared dependency (the database) never takes the fleet out. `FlapGuard` holds a change of
//! HTTP code back until the new condition has lasted its configured time.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebVerdict {
    /// `web.port` is 0: nothing to check.
    NotConfigured,
    /// Listening, but no evidence yet either way.
    Unknown,
    Up,
    Slow,
    /// Its own outbound requests (database, cache, API) go unanswered: a dependency's fault.
    Waiting,
    Hung,
    Unresponsive,
    Down,
}

impl WebVerdict {
    pub const ALL: [WebVerdict; 8] = [
        Self::NotConfigured,
        Self::Unknown,
        Self::Up,
        Self::Slow,
        Self::Waiting,
        Self::Hung,
        Self::Unresponsive,
        Self::Down,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotConfigured => "not_configured",
            Self::Unknown => "unknown",
            Self::Up => "up",
            Self::Slow => "slow",
            Self::Waiting => "waiting",
            Self::Hung => "hung",
            Self::Unresponsive => "unresponsive",
            Self::Down => "down",
        }
    }

    fn is_fault(self) -> bool {
        matches!(self, Self::Hung | Self::Unresponsive | Self::Down)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskLevel {
    Ok,
    Warn,
    Fail,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DbState {
    NotConfigured,
    Connected,
    Slow,
    Unreachable,
    /// The database answered and refused us (authentication failed, unknown database, TLS
    /// refused): a configuration error to fix, not an outage. Alerted, never a 503, and it
    /// never hides a web fault.
    Misconfigured,
    /// Not checked yet.
    Unknown,
}

impl DbState {
    pub const ALL: [DbState; 6] = [
        Self::NotConfigured,
        Self::Connected,
        Self::Slow,
        Self::Unreachable,
        Self::Misconfigured,
        Self::Unknown,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainersState {
    NotConfigured,
    AllRunning,
    /// An expected container is missing, exited or unhealthy.
    Faulty,
    /// The Docker daemon did not answer: a warning, not a fault.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pressure {
    High,
    Normal,
    Low,
}

/// The kinds of fault compared with the peers, each decided on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultClass {
    /// A dependency: the database unreachable or slow, or the web backend waiting on its own
    /// outbound requests. Compared by kind, not endpoint: every instance may reach the same
    /// database through a different path.
    Dependency,
    /// The web backend hung, unresponsive or down.
    Web,
    /// An expected container not running.
    Containers,
}

impl FaultClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dependency => "dependency",
            Self::Web => "web",
            Self::Containers => "containers",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Most peers that answered do not have it: this instance's own.
    Local,
    /// Most peers that answered have it too: the fleet's.
    Shared,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Shared => "shared",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    pub class: FaultClass,
    pub scope: Scope,
    pub peers_with: usize,
    pub peers_answered: usize,
    pub reason: String,
}

/// Where self-healing stands for the current fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealPhase {
    /// Nothing is being healed (no target, disabled, or no fault).
    Idle,
    /// A restart was issued and is within `heal.timeout`.
    Recovering,
    /// Restarts were tried and failed, or the budget is spent.
    Exhausted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Healthy,
    Degraded,
    Unhealthy,
    Booting,
    Recovering,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unhealthy => "unhealthy",
            Self::Booting => "booting",
            Self::Recovering => "recovering",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recommendation {
    Stable,
    ScaleUp,
    ScaleDown,
    InfrastructureIssue,
}

impl Recommendation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::ScaleUp => "scale_up",
            Self::ScaleDown => "scale_down",
            Self::InfrastructureIssue => "infrastructure_issue",
        }
    }
}

/// A condition a restart or a new instance would fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Web(WebVerdict),
    DiskFull,
    Containers,
    /// Boot grace is over and the web backend was never seen serving.
    NeverServed,
    /// A dependency (the database) that only this instance cannot reach, while most peers
    /// do. A restart of the web backend does not change the path to it.
    Dependency,
}

impl Fault {
    /// Whether self-healing (a restart) can address it. A backend that never served is not
    /// restarted into `recovering` (a 200 would put an instance that never worked into
    /// rotation).
    pub fn healable(self) -> bool {
        matches!(self, Self::Web(_) | Self::Containers)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInput {
    pub web: WebVerdict,
    /// The web verdict's evidence, carried into the reasons.
    pub web_detail: String,
    /// Every process holding the web listener is stopped or frozen: nothing shared explains
    /// that, so the shared-dependency guard does not cover it.
    pub web_stopped: bool,
    /// The web backend has been seen serving since the agent started (true when there is no
    /// web check).
    pub web_served: bool,
    pub disk: DiskLevel,
    pub database: DbState,
    pub containers: ContainersState,
    pub pressure: Pressure,
    pub in_boot_grace: bool,
    /// Some check has not reported its first result yet (named in the booting reason).
    pub warming_up: bool,
    /// The code while booting and the backend has not served yet: 503 (not ready: the
    /// balancer sends nothing, the scaling group's grace period keeps the instance) or 200
    /// for scaling groups without a grace period (`checks.boot_status`).
    pub boot_status: u16,
    pub heal: HealPhase,
    /// The peers' judgement of this instance's faults (empty: judged alone).
    pub fleet: Vec<Judgement>,
}

impl Default for PolicyInput {
    fn default() -> Self {
        Self {
            web: WebVerdict::NotConfigured,
            web_detail: String::new(),
            web_stopped: false,
            web_served: true,
            disk: DiskLevel::Ok,
            database: DbState::NotConfigured,
            containers: ContainersState::NotConfigured,
            pressure: Pressure::Normal,
            in_boot_grace: false,
            warming_up: false,
            boot_status: 503,
            heal: HealPhase::Idle,
            fleet: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub status: Status,
    pub http: u16,
    pub recommendation: Recommendation,
    pub reasons: Vec<String>,
    /// Faults a restart or a new instance would fix (empty when guarded or none).
    pub faults: Vec<Fault>,
    /// A fault was seen but attributed to a shared dependency (fleet-safety guard).
    pub shared_dependency: bool,
}

impl Decision {
    /// The fault self-healing should act on, if any.
    pub fn healable_fault(&self) -> Option<Fault> {
        self.faults.iter().copied().find(|f| f.healable())
    }
}

pub fn evaluate(i: &PolicyInput) -> Decision {
    let mut reasons = Vec::new();
    let mut faults = Vec::new();
    let dependency_down = matches!(i.database, DbState::Unreachable | DbState::Slow);
    let mut shared_dependency = false;
    let fleet = |class: FaultClass| i.fleet.iter().find(|j| j.class == class);
    let web = |what: &str| {
        if i.web_detail.is_empty() {
            format!("web backend {what}")
        } else {
            format!("web backend {what}: {}", i.web_detail)
        }
    };

    let decided = |status, http, recommendation, reasons, faults, shared_dependency| Decision {
        status,
        http,
        recommendation,
        reasons,
        faults,
        shared_dependency,
    };

    // Not ready until the backend has served once: a 200 would put it into rotation.
    let never_served = i.web != WebVerdict::NotConfigured && !i.web_served;
    if never_served && i.in_boot_grace {
        return decided(
            Status::Booting,
            i.boot_status,
            Recommendation::Stable,
            vec![format!(
                "booting: the web backend has not been seen serving yet ({})",
                web(i.web.as_str())
            )],
            Vec::new(),
            false,
        );
    }
    if never_served {
        // It never was in rotation, so taking it out cannot take the fleet out, whatever the
        // database says: no shared-dependency guard, and no `recovering` 200 while a restart
        // runs.
        faults.push(Fault::NeverServed);
        reasons.push(format!(
            "boot grace is over and the web backend was never seen serving ({})",
            web(i.web.as_str())
        ));
        if i.web.is_fault() || i.web == WebVerdict::Waiting {
            faults.push(Fault::Web(i.web));
        }
    } else if i.web == WebVerdict::Waiting {
        match fleet(FaultClass::Dependency) {
            Some(j) if j.scope == Scope::Local => {
                // Only this instance cannot reach it: a restart, or a new instance, may.
                faults.push(Fault::Web(i.web));
                reasons.push(format!("{}; {}", web("waiting on a dependency"), j.reason));
            }
            j => {
                shared_dependency = true;
                reasons.push(web("waiting on a dependency, not replacing the instance"));
                reasons.extend(j.map(|j| j.reason.clone()));
            }
        }
    } else if i.web.is_fault() {
        if let Some(j) = fleet(FaultClass::Web) {
            // The peers settle it: most of them hung too (a bad deploy) is the fleet's fault,
            // replacing instances fixes nothing; most of them fine makes it ours, database or not.
            if j.scope == Scope::Shared {
                shared_dependency = true;
                reasons.push(format!(
                    "{}; {}: not replacing the instance",
                    web(i.web.as_str()),
                    j.reason
                ));
            } else {
                faults.push(Fault::Web(i.web));
                reasons.push(format!("{}; {}", web(i.web.as_str()), j.reason));
            }
        } else if dependency_down && !i.web_stopped {
            // Fleet-safety guard: every instance shares this database, so every instance
            // would look the same and replacing them fixes nothing. A stopped or frozen
            // server is not explained by any database: that stays a local fault.
            shared_dependency = true;
            reasons.push(format!(
                "{} while the database is {}: shared dependency, not replacing the instance",
                web(i.web.as_str()),
                db_word(i.database)
            ));
        } else {
            faults.push(Fault::Web(i.web));
            reasons.push(web(i.web.as_str()));
        }
    }
    let mut dependency_shared = dependency_down;
    if dependency_down && !never_served {
        if let Some(j) = fleet(FaultClass::Dependency).filter(|j| j.scope == Scope::Local) {
            // Most peers reach their database: this instance alone cannot.
            dependency_shared = false;
            faults.push(Fault::Dependency);
            reasons.push(format!("database {}; {}", db_word(i.database), j.reason));
        }
    }
    if i.containers == ContainersState::Faulty {
        match fleet(FaultClass::Containers) {
            Some(j) if j.scope == Scope::Shared => {
                shared_dependency = true;
                reasons.push(format!(
                    "expected container not running; {}: not replacing the instance",
                    j.reason
                ));
            }
            _ => {
                faults.push(Fault::Containers);
                reasons.push("expected container not running".into());
            }
        }
    }
    if i.disk == DiskLevel::Fail {
        faults.push(Fault::DiskFull);
        reasons.push("disk usage at or above the fail threshold".into());
    }

    if !faults.is_empty() {
        let only_healable = faults.iter().all(|f| f.healable());
        if i.heal == HealPhase::Recovering && only_healable {
            reasons.push("self-heal in progress".into());
            return decided(
                Status::Recovering,
                200,
                Recommendation::Stable,
                reasons,
                faults,
                shared_dependency,
            );
        }
        match i.heal {
            HealPhase::Recovering => reasons.push("self-heal in progress".into()),
            HealPhase::Exhausted => reasons.push("self-heal failed or its budget is spent".into()),
            HealPhase::Idle => {}
        }
        if i.in_boot_grace {
            reasons.push("within the boot grace period: no restart".into());
        }
        return decided(
            Status::Unhealthy,
            503,
            Recommendation::Stable,
            reasons,
            faults,
            shared_dependency,
        );
    }

    let mut degraded = shared_dependency;
    let mut infrastructure = shared_dependency;
    let mut scale_up = false;
    if dependency_shared {
        degraded = true;
        infrastructure = true;
        reasons.push(format!("database {}", db_word(i.database)));
        reasons.extend(
            fleet(FaultClass::Dependency)
                .filter(|j| j.scope == Scope::Shared)
                .map(|j| j.reason.clone()),
        );
    }
    if i.database == DbState::Misconfigured {
        degraded = true;
        reasons.push("database check misconfigured (credentials, database name or TLS)".into());
    }
    match i.disk {
        DiskLevel::Warn => {
            degraded = true;
            reasons.push("disk usage at or above the warn threshold".into());
        }
        DiskLevel::Unknown => {
            degraded = true;
            reasons.push("disk usage could not be read".into());
        }
        DiskLevel::Ok | DiskLevel::Fail => {}
    }
    if i.containers == ContainersState::Unknown {
        degraded = true;
        reasons.push("container state unknown: Docker did not answer".into());
    }
    if i.web == WebVerdict::Slow {
        degraded = true;
        scale_up = true;
        reasons.push(web("slow"));
    }
    if i.pressure == Pressure::High {
        degraded = true;
        scale_up = true;
        reasons.push("sustained high CPU or memory".into());
    }

    let recommendation = if infrastructure {
        Recommendation::InfrastructureIssue
    } else if scale_up {
        Recommendation::ScaleUp
    } else if !degraded && i.pressure == Pressure::Low {
        Recommendation::ScaleDown
    } else {
        Recommendation::Stable
    };
    if i.in_boot_grace {
        // Ready (it serves), still in its grace: no restarts, and whatever is degraded now
        // may be warming up.
        reasons.insert(
            0,
            if i.warming_up {
                "booting: the web backend serves, other checks are warming up"
            } else {
                "booting: the web backend serves, within checks.boot_grace"
            }
            .into(),
        );
        return decided(
            Status::Booting,
            200,
            Recommendation::Stable,
            reasons,
            Vec::new(),
            shared_dependency,
        );
    }
    let status = if degraded {
        Status::Degraded
    } else {
        Status::Healthy
    };
    decided(
        status,
        200,
        recommendation,
        reasons,
        Vec::new(),
        shared_dependency,
    )
}

fn db_word(d: DbState) -> &'static str {
    match d {
        DbState::Slow => "slow",
        _ => "unreachable",
    }
}

/// Holds back a change of HTTP code until the new code has held for its time:
/// `fail_after` to go to 503, `recover_after` to come back to 200. Changes within the same
/// code (healthy ↔ degraded) pass straight through.
#[derive(Debug)]
pub struct FlapGuard {
    fail_after: Duration,
    recover_after: Duration,
    published: Option<Decision>,
    /// The HTTP code the raw decisions moved to, and since when.
    pending: Option<(u16, Instant)>,
}

impl FlapGuard {
    pub fn new(fail_after: Duration, recover_after: Duration) -> Self {
        Self {
            fail_after,
            recover_after,
            published: None,
            pending: None,
        }
    }

    /// A change of code is waiting out its time.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    pub fn apply(&mut self, raw: Decision, now: Instant) -> Decision {
        let Some(published) = &self.published else {
            self.published = Some(raw.clone());
            return raw;
        };
        // Leaving boot is not a recovery: an instance becomes ready the moment it is.
        if raw.http == published.http || published.status == Status::Booting {
            self.pending = None;
            self.published = Some(raw.clone());
            return raw;
        }
        let since = match self.pending {
            Some((code, since)) if code == raw.http => since,
            _ => {
                self.pending = Some((raw.http, now));
                now
            }
        };
        let needed = if raw.http >= 500 {
            self.fail_after
        } else {
            self.recover_after
        };
        let held = now.saturating_duration_since(since);
        if held >= needed {
            self.pending = None;
            self.published = Some(raw.clone());
            return raw;
        }
        let mut kept = published.clone();
        kept.reasons.push(format!(
            "turning {} ({}) once it has held {:.1}s of {}s",
            raw.status.as_str(),
            raw.http,
            held.as_secs_f64(),
            needed.as_secs_f64()
        ));
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> PolicyInput {
        PolicyInput {
            web: WebVerdict::Up,
            database: DbState::Connected,
            containers: ContainersState::AllRunning,
            ..PolicyInput::default()
        }
    }

    /// One row per line of the SPEC.md status table (and the edges around it).
    #[test]
    fn status_table() {
        use Recommendation::*;
        use Status::*;
        type Case = (
            &'static str,
            fn(&mut PolicyInput),
            Status,
            u16,
            Recommendation,
        );
        let cases: &[Case] = &[
            ("all fine", |_| {}, Healthy, 200, Stable),
            (
                "all fine, sustained low use",
                |i| i.pressure = Pressure::Low,
                Healthy,
                200,
                ScaleDown,
            ),
            (
                "web down, no heal possible",
                |i| i.web = WebVerdict::Down,
                Unhealthy,
                503,
                Stable,
            ),
            (
                "web down, heal failed",
                |i| {
                    i.web = WebVerdict::Down;
                    i.heal = HealPhase::Exhausted;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "container not running",
                |i| i.containers = ContainersState::Faulty,
                Unhealthy,
                503,
                Stable,
            ),
            (
                "web hung after heal failed",
                |i| {
                    i.web = WebVerdict::Hung;
                    i.heal = HealPhase::Exhausted;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "web unresponsive after heal failed",
                |i| {
                    i.web = WebVerdict::Unresponsive;
                    i.heal = HealPhase::Exhausted;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "disk at fail threshold",
                |i| i.disk = DiskLevel::Fail,
                Unhealthy,
                503,
                Stable,
            ),
            (
                "disk full while healing web: still 503",
                |i| {
                    i.disk = DiskLevel::Fail;
                    i.web = WebVerdict::Hung;
                    i.heal = HealPhase::Recovering;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "disk at warn threshold",
                |i| i.disk = DiskLevel::Warn,
                Degraded,
                200,
                Stable,
            ),
            (
                "disk unreadable",
                |i| i.disk = DiskLevel::Unknown,
                Degraded,
                200,
                Stable,
            ),
            (
                "database unreachable",
                |i| i.database = DbState::Unreachable,
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "database slow",
                |i| i.database = DbState::Slow,
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "web hung while database unreachable",
                |i| {
                    i.web = WebVerdict::Hung;
                    i.database = DbState::Unreachable;
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "web unresponsive while database slow",
                |i| {
                    i.web = WebVerdict::Unresponsive;
                    i.database = DbState::Slow;
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "web down while database unreachable",
                |i| {
                    i.web = WebVerdict::Down;
                    i.database = DbState::Unreachable;
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "high cpu/memory",
                |i| i.pressure = Pressure::High,
                Degraded,
                200,
                ScaleUp,
            ),
            (
                "web slow",
                |i| i.web = WebVerdict::Slow,
                Degraded,
                200,
                ScaleUp,
            ),
            (
                "infrastructure beats scale_up",
                |i| {
                    i.pressure = Pressure::High;
                    i.database = DbState::Unreachable;
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "low use but degraded: no scale_down",
                |i| {
                    i.pressure = Pressure::Low;
                    i.disk = DiskLevel::Warn;
                },
                Degraded,
                200,
                Stable,
            ),
            (
                "booting, the backend not yet seen serving: not ready",
                |i| {
                    i.in_boot_grace = true;
                    i.web_served = false;
                    i.web = WebVerdict::Down;
                },
                Booting,
                503,
                Stable,
            ),
            (
                "booting, not yet serving, boot_status = 200 (no ASG grace period)",
                |i| {
                    i.in_boot_grace = true;
                    i.web_served = false;
                    i.web = WebVerdict::Unknown;
                    i.boot_status = 200;
                },
                Booting,
                200,
                Stable,
            ),
            (
                "booting, serving, other checks warming up",
                |i| {
                    i.in_boot_grace = true;
                    i.warming_up = true;
                    i.database = DbState::Unknown;
                },
                Booting,
                200,
                Stable,
            ),
            (
                "booting, serving, every check in: still booting until the grace ends",
                |i| i.in_boot_grace = true,
                Booting,
                200,
                Stable,
            ),
            (
                "booting, serving, disk full: a fault is a fault",
                |i| {
                    i.in_boot_grace = true;
                    i.disk = DiskLevel::Fail;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "boot grace over, never served, database unreachable: still 503",
                |i| {
                    i.web_served = false;
                    i.web = WebVerdict::Waiting;
                    i.database = DbState::Unreachable;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "waiting on a dependency",
                |i| i.web = WebVerdict::Waiting,
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "stopped server while the database is unreachable: local, 503",
                |i| {
                    i.web = WebVerdict::Hung;
                    i.web_stopped = true;
                    i.database = DbState::Unreachable;
                    i.heal = HealPhase::Exhausted;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "database misconfigured",
                |i| i.database = DbState::Misconfigured,
                Degraded,
                200,
                Stable,
            ),
            (
                "database misconfigured never hides a web fault",
                |i| {
                    i.database = DbState::Misconfigured;
                    i.web = WebVerdict::Hung;
                    i.heal = HealPhase::Exhausted;
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "self-heal in progress",
                |i| {
                    i.web = WebVerdict::Hung;
                    i.heal = HealPhase::Recovering;
                },
                Recovering,
                200,
                Stable,
            ),
            (
                "docker unreachable is a warning",
                |i| i.containers = ContainersState::Unknown,
                Degraded,
                200,
                Stable,
            ),
            (
                "database not configured",
                |i| i.database = DbState::NotConfigured,
                Healthy,
                200,
                Stable,
            ),
            (
                "database not checked yet",
                |i| i.database = DbState::Unknown,
                Healthy,
                200,
                Stable,
            ),
            (
                "web not configured",
                |i| i.web = WebVerdict::NotConfigured,
                Healthy,
                200,
                Stable,
            ),
            (
                "web without evidence yet",
                |i| i.web = WebVerdict::Unknown,
                Healthy,
                200,
                Stable,
            ),
        ];
        for (name, set, status, http, rec) in cases {
            let mut i = input();
            set(&mut i);
            let d = evaluate(&i);
            assert_eq!(
                (d.status, d.http, d.recommendation),
                (*status, *http, *rec),
                "{name}: {d:?}"
            );
            if d.http == 503 {
                assert!(!d.reasons.is_empty(), "{name}: a 503 must say why");
            }
        }
    }

    #[test]
    fn the_peers_decide_local_or_shared() {
        use Recommendation::*;
        use Status::*;
        let judged = |class, scope| Judgement {
            class,
            scope,
            peers_with: if scope == Scope::Shared { 2 } else { 0 },
            peers_answered: 2,
            reason: format!("{scope:?} by 2 peers"),
        };
        let cases: &[(&str, PolicyInput, Status, u16, Recommendation)] = &[
            (
                "waiting on a dependency only this instance cannot reach: 503 after heal",
                PolicyInput {
                    web: WebVerdict::Waiting,
                    heal: HealPhase::Exhausted,
                    fleet: vec![judged(FaultClass::Dependency, Scope::Local)],
                    ..input()
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "waiting on a dependency the peers wait on too: 200",
                PolicyInput {
                    web: WebVerdict::Waiting,
                    fleet: vec![judged(FaultClass::Dependency, Scope::Shared)],
                    ..input()
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "database unreachable from here only: 503, no restart can help",
                PolicyInput {
                    database: DbState::Unreachable,
                    fleet: vec![judged(FaultClass::Dependency, Scope::Local)],
                    ..input()
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "database unreachable for most peers too: 200",
                PolicyInput {
                    database: DbState::Unreachable,
                    fleet: vec![judged(FaultClass::Dependency, Scope::Shared)],
                    ..input()
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "every instance hung after a bad deploy: 200, no restart loop",
                PolicyInput {
                    web: WebVerdict::Hung,
                    fleet: vec![judged(FaultClass::Web, Scope::Shared)],
                    ..input()
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
            (
                "hung here alone while the database is down everywhere: ours",
                PolicyInput {
                    web: WebVerdict::Hung,
                    database: DbState::Unreachable,
                    heal: HealPhase::Exhausted,
                    fleet: vec![
                        judged(FaultClass::Web, Scope::Local),
                        judged(FaultClass::Dependency, Scope::Shared),
                    ],
                    ..input()
                },
                Unhealthy,
                503,
                Stable,
            ),
            (
                "an expected container down on most peers: 200",
                PolicyInput {
                    containers: ContainersState::Faulty,
                    fleet: vec![judged(FaultClass::Containers, Scope::Shared)],
                    ..input()
                },
                Degraded,
                200,
                InfrastructureIssue,
            ),
        ];
        for (name, i, status, http, rec) in cases {
            let d = evaluate(i);
            assert_eq!(
                (d.status, d.http, d.recommendation),
                (*status, *http, *rec),
                "{name}: {d:?}"
            );
            assert!(
                d.reasons.iter().any(|r| r.contains("by 2 peers")),
                "{name}: the reasons name the peers' evidence: {:?}",
                d.reasons
            );
        }
        // A dependency only we cannot reach is not healed by restarting the web backend.
        let d = evaluate(&cases[2].1);
        assert_eq!(d.healable_fault(), None);
    }

    #[test]
    fn reasons_carry_the_web_evidence() {
        let d = evaluate(&PolicyInput {
            web: WebVerdict::Waiting,
            web_detail: "waiting on 10.0.3.7:5432 for 4.2s (12 connections)".into(),
            ..input()
        });
        assert!(d.shared_dependency);
        assert_eq!(d.healable_fault(), None, "no restart for a dependency");
        assert!(
            d.reasons.iter().any(|r| r.contains("10.0.3.7:5432")),
            "{:?}",
            d.reasons
        );
        let d = evaluate(&PolicyInput {
            web_served: false,
            web: WebVerdict::Hung,
            heal: HealPhase::Recovering,
            ..input()
        });
        assert_eq!(d.faults, [Fault::NeverServed, Fault::Web(WebVerdict::Hung)]);
        assert_eq!(d.healable_fault(), Some(Fault::Web(WebVerdict::Hung)));
        assert_eq!(
            (d.status, d.http),
            (Status::Unhealthy, 503),
            "a restart of a backend that never served is no reason to take traffic"
        );
    }

    #[test]
    fn guarded_fault_is_not_healable() {
        let d = evaluate(&PolicyInput {
            web: WebVerdict::Hung,
            database: DbState::Unreachable,
            ..input()
        });
        assert!(d.shared_dependency);
        assert_eq!(d.healable_fault(), None);
        let d = evaluate(&PolicyInput {
            web: WebVerdict::Hung,
            ..input()
        });
        assert_eq!(d.healable_fault(), Some(Fault::Web(WebVerdict::Hung)));
        let d = evaluate(&PolicyInput {
            disk: DiskLevel::Fail,
            ..input()
        });
        assert_eq!(d.healable_fault(), None, "a restart does not empty a disk");
    }

    #[test]
    fn flap_guard_holds_each_direction_for_its_time() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let ok = evaluate(&input());
        let bad = evaluate(&PolicyInput {
            web: WebVerdict::Down,
            ..input()
        });
        let mut g = FlapGuard::new(2 * s, 4 * s);
        assert_eq!(g.apply(ok.clone(), t0).http, 200);
        // 503 only once it has held 2 s.
        assert_eq!(g.apply(bad.clone(), t0 + s).http, 200);
        assert_eq!(g.apply(bad.clone(), t0 + 2 * s).http, 200);
        assert_eq!(g.apply(bad.clone(), t0 + 3 * s).http, 503);
        // A single good evaluation does not bring it back…
        assert_eq!(g.apply(ok.clone(), t0 + 4 * s).http, 503);
        // …and a relapse restarts the clock.
        assert_eq!(g.apply(bad.clone(), t0 + 5 * s).http, 503);
        assert_eq!(g.apply(ok.clone(), t0 + 6 * s).http, 503);
        assert_eq!(g.apply(ok.clone(), t0 + 9 * s).http, 503);
        assert_eq!(g.apply(ok.clone(), t0 + 10 * s).http, 200);
    }

    #[test]
    fn flap_guard_zero_fail_after_is_immediate() {
        let t0 = Instant::now();
        let mut g = FlapGuard::new(Duration::ZERO, Duration::from_secs(4));
        g.apply(evaluate(&input()), t0);
        let bad = evaluate(&PolicyInput {
            disk: DiskLevel::Fail,
            ..input()
        });
        let held = g.apply(bad, t0);
        assert_eq!(held.http, 503);
        assert!(held.reasons.iter().any(|r| r.contains("disk")));
    }

    #[test]
    fn flap_guard_lets_an_instance_out_of_boot_at_once() {
        let t0 = Instant::now();
        let mut g = FlapGuard::new(Duration::ZERO, Duration::from_secs(4));
        let booting = evaluate(&PolicyInput {
            in_boot_grace: true,
            web_served: false,
            ..input()
        });
        assert_eq!(g.apply(booting, t0).http, 503);
        assert_eq!(g.apply(evaluate(&input()), t0).status, Status::Healthy);
    }

    #[test]
    fn flap_guard_passes_changes_within_a_code() {
        let t0 = Instant::now();
        let mut g = FlapGuard::new(Duration::from_secs(2), Duration::from_secs(4));
        g.apply(evaluate(&input()), t0);
        let warn = evaluate(&PolicyInput {
            disk: DiskLevel::Warn,
            ..input()
        });
        assert_eq!(g.apply(warn, t0).status, Status::Degraded);
    }
}
