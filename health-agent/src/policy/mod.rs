//! The status policy (the table in docs/verdicts.md) as one pure function: check results in,
//! (`status`, HTTP code, `recommendation`, reasons) out. 503 only
//! for what a new instance or a restart would fix; a shared dependency (the database) never
//! takes the fleet out. `FlapGuard` (flap.rs) holds a change of HTTP code back until the new
//! condition has lasted its configured time.
//!
//! The states it reads and answers with live in `crate::status`, a leaf; import them from there.

use serde::Serialize;

use crate::checks::Report;

mod flap;
#[cfg(test)]
mod tests;

use crate::status::{
    ContainersState, DbState, DiskLevel, FaultClass, Pressure, Recommendation, Scope, Status,
    WebVerdict,
};
pub use flap::FlapGuard;

/// The peers' judgement of one kind of fault of this instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    pub class: FaultClass,
    pub scope: Scope,
    pub peers_with: usize,
    pub peers_answered: usize,
    pub reason: String,
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
    /// The web verdict is `unknown` by the agent's own error (no namespace, no probe socket,
    /// no permission): never evidence against the backend, so never a 503 for "never served".
    pub web_agent_error: bool,
    pub disk: DiskLevel,
    pub database: DbState,
    pub containers: ContainersState,
    pub pressure: Pressure,
    /// Which resource makes the pressure high, as the reason names it ("CPU", "memory", "CPU
    /// and memory").
    pub high: &'static str,
    pub in_boot_grace: bool,
    /// Some check has not reported its first result yet (named in the booting reason).
    pub warming_up: bool,
    /// The code while booting and the backend has not served yet: 503 (not ready: the
    /// balancer sends nothing, the scaling group's grace period keeps the instance) or 200
    /// for scaling groups without a grace period (`checks.boot_status`).
    pub boot_status: u16,
    /// The peers' judgement of this instance's faults (empty: judged alone).
    pub fleet: Vec<Judgement>,
    /// Faults the peers are still being asked about (their word predates the fault): held at
    /// 200 `degraded`, no restart, until they answer — a fault they share is never a 503.
    pub fleet_asking: Vec<FaultClass>,
    /// A `[web]` setting that cannot be right (a probe path that answers 4xx, a container or
    /// namespace that does not exist), naming the key: degraded, like a misconfigured
    /// database, and never a 503.
    pub web_config_error: Option<String>,
    /// Saturation averaged over `scaling.window` (None: withheld or unknown; then the CPU and
    /// memory pressure alone decide `scale_down`).
    pub saturation: Option<f64>,
    /// `scaling.up_at`, `scaling.down_at`.
    pub up_at: f64,
    pub down_at: f64,
    /// Why the database check is misconfigured, with the key to change (redacted: the
    /// database report's words); `None` when it is not, or when nothing says why.
    pub database_reason: Option<String>,
}

impl Default for PolicyInput {
    fn default() -> Self {
        Self {
            web: WebVerdict::NotConfigured,
            web_detail: String::new(),
            web_stopped: false,
            web_served: true,
            web_agent_error: false,
            disk: DiskLevel::Ok,
            database: DbState::NotConfigured,
            containers: ContainersState::NotConfigured,
            pressure: Pressure::Normal,
            high: "CPU or memory",
            in_boot_grace: false,
            warming_up: false,
            boot_status: 503,
            fleet: Vec::new(),
            fleet_asking: Vec::new(),
            web_config_error: None,
            saturation: None,
            up_at: 0.8,
            down_at: 0.3,
            database_reason: None,
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
    /// The only fault is the web backend erroring, with no peers to compare: one restart may
    /// help, but once it did not (or none can be made) it is 200 `degraded`, never a 503 —
    /// alone, the agent cannot know that a new instance would do better (`heal::applied`).
    pub erroring_alone: bool,
}

impl Decision {
    /// The fault self-healing should act on, if any.
    pub fn healable_fault(&self) -> Option<Fault> {
        self.faults.iter().copied().find(|f| f.healable())
    }
}

impl PolicyInput {
    /// The policy's input from one round of the checks. Boot tracking (`web_served`, `warming_up`) is the
    /// runner's to fill in: a one-shot check has no boot.
    pub fn of(report: &Report, in_boot_grace: bool) -> Self {
        Self {
            web: report.web.verdict,
            web_detail: report.web.detail.clone(),
            web_stopped: report
                .web
                .processes
                .as_ref()
                .is_some_and(|p| p.frozen.is_some()),
            web_agent_error: report.web.agent_error,
            disk: report.disk.level,
            database: report.database.state,
            containers: report.containers.state,
            pressure: report
                .system
                .as_ref()
                .map_or(Pressure::Normal, |s| s.pressure),
            high: match report.system.as_ref().map(|s| (s.cpu_high, s.memory_high)) {
                Some((true, true)) => "CPU and memory",
                Some((true, false)) => "CPU",
                Some((false, true)) => "memory",
                _ => "CPU or memory",
            },
            in_boot_grace,
            web_config_error: report.web.config_error.clone(),
            database_reason: report.database.misconfigured_reason(),
            ..PolicyInput::default()
        }
    }
}

pub fn evaluate(i: &PolicyInput) -> Decision {
    let mut reasons = Vec::new();
    let mut faults = Vec::new();
    let dependency_down = matches!(i.database, DbState::Unreachable | DbState::Slow);
    let mut shared_dependency = false;
    let fleet = |class: FaultClass| i.fleet.iter().find(|j| j.class == class);
    let asking = |class: FaultClass| i.fleet_asking.contains(&class);
    // A fault held while the peers are asked: degraded, never a 503 or a restart yet.
    let mut held = false;
    let web = |what: &str| {
        if i.web_detail.is_empty() {
            format!("web backend {what}")
        } else {
            format!("web backend {what}: {}", i.web_detail)
        }
    };

    // Erroring with no peers to compare: a restart is worth one try, no more.
    let mut erroring_alone = false;
    let decided = |status, http, recommendation, reasons, faults, shared_dependency| Decision {
        status,
        http,
        recommendation,
        reasons,
        faults,
        shared_dependency,
        erroring_alone: false,
    };

    // The agent cannot look (its own error): whether the backend serves is not known, and
    // the agent's trouble is no evidence against it — never a 503 for that, booting or not.
    let agent_blind = i.web == WebVerdict::Unknown && i.web_agent_error;
    // Not ready until the backend has served once: a 200 would put it into rotation. A web
    // config error means the agent cannot tell (it cannot find the backend): never a 503.
    let never_served = i.web != WebVerdict::NotConfigured
        && !i.web_served
        && !agent_blind
        && i.web_config_error.is_none();
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
    } else if i.web == WebVerdict::Erroring {
        match fleet(FaultClass::Errors) {
            Some(j) if j.scope == Scope::Shared => {
                // A bad deploy or a shared dependency: a rollback is a person's call, and a
                // fleet-wide 503 would take every instance out.
                shared_dependency = true;
                reasons.push(format!(
                    "{}; {}: a bad deploy or a shared dependency, not replacing the instance",
                    web("erroring"),
                    j.reason
                ));
            }
            Some(j) => {
                faults.push(Fault::Web(i.web));
                reasons.push(format!("{}; {}", web("erroring"), j.reason));
            }
            None if asking(FaultClass::Errors) => {
                held = true;
                reasons.push(format!(
                    "{}; asking the peers whether they err too: no 503 before they answer",
                    web("erroring")
                ));
            }
            None => {
                erroring_alone = true;
                faults.push(Fault::Web(i.web));
                reasons.push(format!(
                    "{}; no peers to compare: one restart, and if the errors stay, 200 \
                     degraded (alone it cannot know a new instance would do better)",
                    web("erroring")
                ));
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
        } else if asking(FaultClass::Web) {
            // The peers' word predates this fault: they may have the same one and not have
            // seen it yet. A 503 now could take the whole fleet out.
            held = true;
            reasons.push(format!(
                "{}; asking the peers whether they have it too: no 503 before they answer",
                web(i.web.as_str())
            ));
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
            None if asking(FaultClass::Containers) => {
                held = true;
                reasons.push(
                    "expected container not running; asking the peers whether they have it too: \
                     no 503 before they answer"
                        .into(),
                );
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
        if i.in_boot_grace {
            reasons.push("within the boot grace period: no restart".into());
        }
        let mut d = decided(
            Status::Unhealthy,
            503,
            Recommendation::Stable,
            reasons,
            faults,
            shared_dependency,
        );
        d.erroring_alone = erroring_alone && d.faults.len() == 1;
        return d;
    }

    let mut degraded = shared_dependency || held || erroring_alone;
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
    if agent_blind {
        degraded = true;
        reasons.push(web("not checked: the agent's own error, not the backend's"));
    }
    if i.database == DbState::Misconfigured {
        degraded = true;
        reasons.push(match &i.database_reason {
            Some(why) => format!("database check misconfigured: {why}"),
            None => "database check misconfigured (credentials, database name or TLS)".into(),
        });
    }
    if let Some(e) = &i.web_config_error {
        degraded = true;
        reasons.push(format!("web check misconfigured: {e}"));
    }
    if i.web == WebVerdict::NotConfigured {
        if i.containers == ContainersState::NotConfigured {
            // Nothing this instance serves is watched (the packaged config as installed): a
            // "healthy" would vouch for what nobody looked at, and the balancer reads only
            // that word. Degraded, never 503: nothing is known to be wrong either.
            degraded = true;
            reasons.push(NOTHING_WATCHED.into());
        } else {
            // Not degraded (a host may serve only through its containers), but never a
            // silent "healthy".
            reasons.push(NO_WEB_PORT.into());
        }
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
        reasons.push(format!("sustained high {}", i.high));
    }
    // Busy is not unwell: a high saturation asks for capacity without degrading the status.
    if let Some(s) = i.saturation.filter(|&s| s >= i.up_at) {
        scale_up = true;
        reasons.push(format!(
            "saturation {:.0}% at or above scaling.up_at ({:.0}%)",
            s * 100.0,
            i.up_at * 100.0
        ));
    }
    if i.web == WebVerdict::PartialHang {
        // Half capacity that replacing one worker restores: neither a new instance nor more
        // instances, whatever the CPU of the workers left says meanwhile.
        degraded = true;
        scale_up = false;
        reasons.push(web("partially hung (one process stuck, the others answer)"));
    }
    let quiet = match i.saturation {
        Some(s) => s <= i.down_at,
        None => i.pressure == Pressure::Low,
    };

    let recommendation = if infrastructure {
        Recommendation::InfrastructureIssue
    } else if scale_up {
        Recommendation::ScaleUp
    } else if !degraded && quiet {
        Recommendation::ScaleDown
    } else {
        Recommendation::Stable
    };
    if i.in_boot_grace {
        // Ready (it serves), still in its grace: no restarts, and whatever is degraded now
        // may be warming up.
        reasons.insert(
            0,
            if agent_blind && !i.web_served {
                "booting: whether the web backend serves is unknown (the agent cannot check it)"
            } else if i.warming_up {
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

/// The reason when `web.port` is 0 and containers are watched.
pub const NO_WEB_PORT: &str =
    "web.port is 0: no web backend is watched; set web.port to the backend's listen port";

/// The reason when `web.port` is 0 and no container is configured either: degraded.
pub const NOTHING_WATCHED: &str =
    "web.port is 0 and no containers are configured: nothing this instance serves is watched; \
     set web.port to the backend's listen port";

fn db_word(d: DbState) -> &'static str {
    match d {
        DbState::Slow => "slow",
        _ => "unreachable",
    }
}
