//! `evaluate`, one step per concern: boot, the web fault, the database, the containers, the
//! disk; then either the fault (503) or the degraded reasons, the capacity reasons and the
//! recommendation. Each step adds to one `Findings`, in the order the reasons are read.

use super::{Decision, Fault, Judgement, PolicyInput, NOTHING_WATCHED, NO_WEB_PORT};
use crate::status::{
    ContainersState, DbState, DiskLevel, FaultClass, Pressure, Recommendation, Scope, Status,
    WebVerdict,
};

pub fn evaluate(i: &PolicyInput) -> Decision {
    let mut f = Findings::new(i);
    if f.never_served && i.in_boot_grace {
        return f.booting_unserved();
    }
    f.web_fault();
    let dependency_shared = f.dependency();
    f.containers();
    f.disk_full();
    if !f.faults.is_empty() {
        return f.unhealthy();
    }
    f.degraded_reasons(dependency_shared);
    f.capacity_reasons();
    f.settled()
}

/// How the peers place one kind of fault of this instance (`PolicyInput::scope`).
#[derive(Clone, Copy)]
enum Peers<'a> {
    /// Most peers that answered have it too: the fleet's.
    Shared(&'a Judgement),
    /// Most peers that answered do not: this instance's own.
    Local(&'a Judgement),
    /// Their word predates the fault: they are still being asked.
    Asking,
    /// No word from any peer: judged alone.
    Alone,
}

impl PolicyInput {
    fn scope(&self, class: FaultClass) -> Peers<'_> {
        match self.fleet.iter().find(|j| j.class == class) {
            Some(j) if j.scope == Scope::Shared => Peers::Shared(j),
            Some(j) => Peers::Local(j),
            None if self.fleet_asking.contains(&class) => Peers::Asking,
            None => Peers::Alone,
        }
    }

    /// A reason about the web backend, with the verdict's evidence.
    fn web_reason(&self, what: &str) -> String {
        if self.web_detail.is_empty() {
            format!("web backend {what}")
        } else {
            format!("web backend {what}: {}", self.web_detail)
        }
    }

    fn dependency_down(&self) -> bool {
        matches!(self.database, DbState::Unreachable | DbState::Slow)
    }
}

/// One evaluation as it goes: what the steps found so far.
struct Findings<'a> {
    i: &'a PolicyInput,
    /// The agent cannot look (its own error): whether the backend serves is not known, and
    /// the agent's trouble is no evidence against it — never a 503 for that, booting or not.
    agent_blind: bool,
    /// Not ready until the backend has served once: a 200 would put it into rotation. A web
    /// config error means the agent cannot tell (it cannot find the backend): never a 503.
    never_served: bool,
    reasons: Vec<String>,
    faults: Vec<Fault>,
    /// A fault was seen but is the fleet's (`Decision::shared_dependency`).
    shared_dependency: bool,
    /// A fault held while the peers are asked: degraded, never a 503 or a restart yet.
    held: bool,
    /// Erroring with no peers to compare: a restart is worth one try, no more.
    erroring_alone: bool,
    degraded: bool,
    infrastructure: bool,
    scale_up: bool,
}

impl<'a> Findings<'a> {
    fn new(i: &'a PolicyInput) -> Self {
        let agent_blind = i.web == WebVerdict::Unknown && i.web_agent_error;
        let never_served = i.web != WebVerdict::NotConfigured
            && !i.web_served
            && !agent_blind
            && i.web_config_error.is_none();
        Self {
            i,
            agent_blind,
            never_served,
            reasons: Vec::new(),
            faults: Vec::new(),
            shared_dependency: false,
            held: false,
            erroring_alone: false,
            degraded: false,
            infrastructure: false,
            scale_up: false,
        }
    }

    fn decision(self, status: Status, http: u16, recommendation: Recommendation) -> Decision {
        Decision {
            status,
            http,
            recommendation,
            reasons: self.reasons,
            faults: self.faults,
            shared_dependency: self.shared_dependency,
            erroring_alone: false,
        }
    }

    /// Within boot grace, not seen serving yet: `checks.boot_status`, nothing else said.
    fn booting_unserved(mut self) -> Decision {
        let i = self.i;
        self.reasons.push(format!(
            "booting: the web backend has not been seen serving yet ({})",
            i.web_reason(i.web.as_str())
        ));
        self.decision(Status::Booting, i.boot_status, Recommendation::Stable)
    }

    fn web_fault(&mut self) {
        let i = self.i;
        if self.never_served {
            // It never was in rotation, so taking it out cannot take the fleet out, whatever
            // the database says: no shared-dependency guard, and no `recovering` 200 while a
            // restart runs.
            self.faults.push(Fault::NeverServed);
            self.reasons.push(format!(
                "boot grace is over and the web backend was never seen serving ({})",
                i.web_reason(i.web.as_str())
            ));
            if i.web.is_fault() || i.web == WebVerdict::Waiting {
                self.faults.push(Fault::Web(i.web));
            }
        } else if i.web == WebVerdict::Waiting {
            self.waiting();
        } else if i.web == WebVerdict::Erroring {
            self.erroring();
        } else if i.web.is_fault() {
            self.web_down();
        } else if let Some(s) = &i.slow_vs_peers {
            self.slow_vs_peers(s);
        }
    }

    /// Several times slower than its peers: this instance's own fault (a noisy neighbour, CPU
    /// credits spent, a degraded volume), a restart first, then out of rotation — unless a
    /// third of the fleet is out for it already. Never capacity: more instances leave this
    /// one as slow.
    fn slow_vs_peers(&mut self, s: &super::SlowVsPeers) {
        match &s.capped {
            None => {
                self.faults.push(Fault::SlowVsPeers);
                self.reasons.push(format!("web backend {}", s.reason));
            }
            Some(why) => {
                self.held = true;
                self.reasons
                    .push(format!("web backend {}; {why}", s.reason));
            }
        }
    }

    fn waiting(&mut self) {
        let i = self.i;
        match i.scope(FaultClass::Dependency) {
            Peers::Local(j) => {
                // Only this instance cannot reach it: a restart, or a new instance, may.
                self.faults.push(Fault::Web(i.web));
                self.reasons.push(format!(
                    "{}; {}",
                    i.web_reason("waiting on a dependency"),
                    j.reason
                ));
            }
            peers => {
                self.shared_dependency = true;
                self.reasons
                    .push(i.web_reason("waiting on a dependency, not replacing the instance"));
                if let Peers::Shared(j) = peers {
                    self.reasons.push(j.reason.clone());
                }
            }
        }
    }

    fn erroring(&mut self) {
        let i = self.i;
        match i.scope(FaultClass::Errors) {
            Peers::Shared(j) => {
                // A bad deploy or a shared dependency: a rollback is a person's call, and a
                // fleet-wide 503 would take every instance out.
                self.shared_dependency = true;
                self.reasons.push(format!(
                    "{}; {}: a bad deploy or a shared dependency, not replacing the instance",
                    i.web_reason("erroring"),
                    j.reason
                ));
            }
            Peers::Local(j) => {
                self.faults.push(Fault::Web(i.web));
                self.reasons
                    .push(format!("{}; {}", i.web_reason("erroring"), j.reason));
            }
            Peers::Asking => {
                self.held = true;
                self.reasons.push(format!(
                    "{}; asking the peers whether they err too: no 503 before they answer",
                    i.web_reason("erroring")
                ));
            }
            Peers::Alone => {
                self.erroring_alone = true;
                self.faults.push(Fault::Web(i.web));
                self.reasons.push(format!(
                    "{}; no peers to compare: one restart, and if the errors stay, 200 \
                     degraded (alone it cannot know a new instance would do better)",
                    i.web_reason("erroring")
                ));
            }
        }
    }

    /// Down, hung, unresponsive, stopped: every web fault but waiting and erroring.
    fn web_down(&mut self) {
        let i = self.i;
        let what = i.web_reason(i.web.as_str());
        // The peers settle it: most of them hung too (a bad deploy) is the fleet's fault,
        // replacing instances fixes nothing; most of them fine makes it ours, database or not.
        match i.scope(FaultClass::Web) {
            Peers::Shared(j) => {
                self.shared_dependency = true;
                self.reasons
                    .push(format!("{what}; {}: not replacing the instance", j.reason));
            }
            Peers::Local(j) => {
                self.faults.push(Fault::Web(i.web));
                self.reasons.push(format!("{what}; {}", j.reason));
            }
            Peers::Asking => {
                // The peers' word predates this fault: they may have the same one and not
                // have seen it yet. A 503 now could take the whole fleet out.
                self.held = true;
                self.reasons.push(format!(
                    "{what}; asking the peers whether they have it too: no 503 before they answer"
                ));
            }
            Peers::Alone if i.dependency_down() && !i.web_stopped => {
                // Fleet-safety guard: every instance shares this database, so every instance
                // would look the same and replacing them fixes nothing. A stopped or frozen
                // server is not explained by any database: that stays a local fault.
                self.shared_dependency = true;
                self.reasons.push(format!(
                    "{what} while the database is {}: shared dependency, not replacing the \
                     instance",
                    db_word(i.database)
                ));
            }
            Peers::Alone => {
                self.faults.push(Fault::Web(i.web));
                self.reasons.push(what);
            }
        }
    }

    /// A database down that only this instance cannot reach is its fault; returns whether
    /// it is down for the fleet (or for all the agent knows).
    fn dependency(&mut self) -> bool {
        let i = self.i;
        if i.dependency_down() && !self.never_served {
            if let Peers::Local(j) = i.scope(FaultClass::Dependency) {
                // Most peers reach their database: this instance alone cannot.
                self.faults.push(Fault::Dependency);
                self.reasons
                    .push(format!("database {}; {}", db_word(i.database), j.reason));
                return false;
            }
        }
        i.dependency_down()
    }

    fn containers(&mut self) {
        if self.i.containers != ContainersState::Faulty {
            return;
        }
        match self.i.scope(FaultClass::Containers) {
            Peers::Shared(j) => {
                self.shared_dependency = true;
                self.reasons.push(format!(
                    "expected container not running; {}: not replacing the instance",
                    j.reason
                ));
            }
            Peers::Asking => {
                self.held = true;
                self.reasons.push(
                    "expected container not running; asking the peers whether they have it too: \
                     no 503 before they answer"
                        .into(),
                );
            }
            Peers::Local(_) | Peers::Alone => {
                self.faults.push(Fault::Containers);
                self.reasons.push("expected container not running".into());
            }
        }
    }

    fn disk_full(&mut self) {
        if self.i.disk == DiskLevel::Fail {
            self.faults.push(Fault::DiskFull);
            self.reasons
                .push("disk usage at or above the fail threshold".into());
        }
    }

    /// A fault a restart or a new instance would fix: 503.
    fn unhealthy(mut self) -> Decision {
        if self.i.in_boot_grace {
            self.reasons
                .push("within the boot grace period: no restart".into());
        }
        let erroring_alone = self.erroring_alone && self.faults.len() == 1;
        Decision {
            erroring_alone,
            ..self.decision(Status::Unhealthy, 503, Recommendation::Stable)
        }
    }

    /// What keeps a 200 from being `healthy`: a fault that is not this instance's, what the
    /// agent could not check or is told wrong, the disk and Docker.
    fn degraded_reasons(&mut self, dependency_shared: bool) {
        let i = self.i;
        self.degraded = self.shared_dependency || self.held;
        self.infrastructure = self.shared_dependency;
        if dependency_shared {
            self.degraded = true;
            self.infrastructure = true;
            self.reasons
                .push(format!("database {}", db_word(i.database)));
            if let Peers::Shared(j) = i.scope(FaultClass::Dependency) {
                self.reasons.push(j.reason.clone());
            }
        }
        if self.agent_blind {
            self.degraded = true;
            self.reasons
                .push(i.web_reason("not checked: the agent's own error, not the backend's"));
        }
        if i.database == DbState::Misconfigured {
            self.degraded = true;
            self.reasons.push(match &i.database_reason {
                Some(why) => format!("database check misconfigured: {why}"),
                None => "database check misconfigured (credentials, database name or TLS)".into(),
            });
        }
        if let Some(e) = &i.web_config_error {
            self.degraded = true;
            self.reasons.push(format!("web check misconfigured: {e}"));
        }
        if i.web == WebVerdict::NotConfigured {
            if i.containers == ContainersState::NotConfigured {
                // Nothing this instance serves is watched (the packaged config as installed):
                // a "healthy" would vouch for what nobody looked at, and the balancer reads
                // only that word. Degraded, never 503: nothing is known to be wrong either.
                self.degraded = true;
                self.reasons.push(NOTHING_WATCHED.into());
            } else {
                // Not degraded (a host may serve only through its containers), but never a
                // silent "healthy".
                self.reasons.push(NO_WEB_PORT.into());
            }
        }
        match i.disk {
            DiskLevel::Warn => {
                self.degraded = true;
                self.reasons
                    .push("disk usage at or above the warn threshold".into());
            }
            DiskLevel::Unknown => {
                self.degraded = true;
                self.reasons.push("disk usage could not be read".into());
            }
            DiskLevel::Ok | DiskLevel::Fail => {}
        }
        if i.containers == ContainersState::Unknown {
            self.degraded = true;
            self.reasons
                .push("container state unknown: the container engine did not answer".into());
        }
    }

    /// Slow, under pressure, saturated: more capacity would help; a partial hang: it would not.
    fn capacity_reasons(&mut self) {
        let i = self.i;
        if i.web == WebVerdict::Slow {
            self.degraded = true;
            self.scale_up = true;
            self.reasons.push(i.web_reason("slow"));
        }
        if i.pressure == Pressure::High {
            self.degraded = true;
            self.scale_up = true;
            self.reasons.push(format!("sustained high {}", i.high));
        }
        // Busy is not unwell: a high saturation asks for capacity without degrading the status.
        if let Some(s) = i.saturation.filter(|&s| s >= i.up_at) {
            self.scale_up = true;
            self.reasons.push(format!(
                "saturation {:.0}% at or above scaling.up_at ({:.0}%)",
                s * 100.0,
                i.up_at * 100.0
            ));
        }
        if i.slow_vs_peers.is_some() {
            // Slow against its peers is this instance's own (its saturation too: its answers
            // take longer): more instances would leave it as slow.
            self.scale_up = false;
        }
        if i.web == WebVerdict::PartialHang {
            // Half capacity that replacing one worker restores: neither a new instance nor
            // more instances, whatever the CPU of the workers left says meanwhile.
            self.degraded = true;
            self.scale_up = false;
            self.reasons
                .push(i.web_reason("partially hung (one process stuck, the others answer)"));
        }
    }

    fn recommendation(&self) -> Recommendation {
        let i = self.i;
        let quiet = match i.saturation {
            Some(s) => s <= i.down_at,
            None => i.pressure == Pressure::Low,
        };
        if self.infrastructure {
            Recommendation::InfrastructureIssue
        } else if self.scale_up {
            Recommendation::ScaleUp
        } else if !self.degraded && quiet {
            Recommendation::ScaleDown
        } else {
            Recommendation::Stable
        }
    }

    /// No fault: 200, booting within the grace, else healthy or degraded.
    fn settled(mut self) -> Decision {
        let i = self.i;
        if i.in_boot_grace {
            // Ready (it serves), still in its grace: no restarts, and whatever is degraded
            // now may be warming up.
            self.reasons.insert(
                0,
                if self.agent_blind && !i.web_served {
                    "booting: whether the web backend serves is unknown (the agent cannot \
                     check it)"
                } else if i.warming_up {
                    "booting: the web backend serves, other checks are warming up"
                } else {
                    "booting: the web backend serves, within checks.boot_grace"
                }
                .into(),
            );
            return self.decision(Status::Booting, 200, Recommendation::Stable);
        }
        let recommendation = self.recommendation();
        let status = if self.degraded {
            Status::Degraded
        } else {
            Status::Healthy
        };
        self.decision(status, 200, recommendation)
    }
}

fn db_word(d: DbState) -> &'static str {
    match d {
        DbState::Slow => "slow",
        _ => "unreachable",
    }
}
