//! The status policy (the table in docs/verdicts.md) as one pure function: check results in,
//! (`status`, HTTP code, `recommendation`, reasons) out. 503 only
//! for what a new instance or a restart would fix; a shared dependency (the database) never
//! takes the fleet out. `evaluate` (rules.rs) takes one step per concern; `FlapGuard` (flap.rs)
//! holds a change of HTTP code back until the new condition has lasted its configured time.
//!
//! The states it reads and answers with live in `crate::status`, a leaf; import them from there.

use serde::Serialize;

use crate::checks::Report;

mod flap;
mod rules;
#[cfg(test)]
mod tests;

use crate::status::{
    ContainersState, DbState, DiskLevel, FaultClass, Pressure, Recommendation, Scope, Status,
    WebVerdict,
};
pub use flap::FlapGuard;
pub use rules::evaluate;

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
    /// Its answers several times slower than its peers' (`fleet::latency`).
    SlowVsPeers,
}

impl Fault {
    /// Whether self-healing (a restart) can address it. A backend that never served is not
    /// restarted into `recovering` (a 200 would put an instance that never worked into
    /// rotation).
    pub fn healable(self) -> bool {
        matches!(self, Self::Web(_) | Self::Containers | Self::SlowVsPeers)
    }

    /// Whether a restart of the web backend is what self-healing does for it.
    pub fn restarts_web(self) -> bool {
        matches!(self, Self::Web(_) | Self::SlowVsPeers)
    }

    /// Whether one restart per incident is all it gets: errors or slowness a restart did not
    /// fix are not a restart's to fix.
    pub fn one_restart(self) -> bool {
        matches!(self, Self::Web(WebVerdict::Erroring) | Self::SlowVsPeers)
    }
}

/// This instance's answers several times slower than its peers' (`fleet::latency`): its own
/// fault, never capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowVsPeers {
    /// Its latency, the peers', the ratio.
    pub reason: String,
    /// Why it may not go out now (at most a third of the fleet at once): 200 `degraded`.
    pub capped: Option<String>,
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
    /// Slow against its peers (None: not, or no peers to compare).
    pub slow_vs_peers: Option<SlowVsPeers>,
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
            slow_vs_peers: None,
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

/// What the runner knows of a round beyond the checks' report: boot, the peers' word, the
/// saturation and its thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundFacts {
    pub in_boot_grace: bool,
    pub web_served: bool,
    pub warming_up: bool,
    pub boot_status: u16,
    pub fleet: Vec<Judgement>,
    pub fleet_asking: Vec<FaultClass>,
    pub slow_vs_peers: Option<SlowVsPeers>,
    pub saturation: Option<f64>,
    pub up_at: f64,
    pub down_at: f64,
}

impl PolicyInput {
    /// The policy's input for one round of the runner: the checks' report and what the runner
    /// knows of the round.
    pub fn of_round(report: &Report, round: RoundFacts) -> Self {
        let RoundFacts {
            in_boot_grace,
            web_served,
            warming_up,
            boot_status,
            fleet,
            fleet_asking,
            slow_vs_peers,
            saturation,
            up_at,
            down_at,
        } = round;
        Self {
            web_served,
            warming_up,
            boot_status,
            fleet,
            fleet_asking,
            slow_vs_peers,
            saturation,
            up_at,
            down_at,
            ..Self::of(report, in_boot_grace)
        }
    }

    /// The policy's input from the checks' report alone (a one-shot check: no boot to track,
    /// no peers, no saturation).
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

/// The reason when `web.port` is 0 and containers are watched.
pub const NO_WEB_PORT: &str =
    "web.port is 0: no web backend is watched; set web.port to the backend's listen port";

/// The reason when `web.port` is 0 and no container is configured either: degraded.
pub const NOTHING_WATCHED: &str =
    "web.port is 0 and no containers are configured: nothing this instance serves is watched; \
     set web.port to the backend's listen port";
