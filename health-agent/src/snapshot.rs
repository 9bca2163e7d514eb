//! The immutable snapshot `/health` answers from: one round of checks, the policy's decision,
//! and its response bodies. A body is rendered at most once per snapshot, by the first request
//! that wants it (snapshots are replaced every 250 ms; most are never asked for), so every other
//! request only picks the rendered bytes and sends them.

use std::{
    sync::{Arc, OnceLock},
    time::{Instant, SystemTime},
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use crate::{
    checks::{DatabaseReport, Report},
    heal::HealLog,
    policy::Decision,
    saturation::SaturationReport,
    status::{DbState, DiskLevel, Status},
    text::rfc3339,
};

pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

#[derive(Debug)]
pub struct Snapshot {
    pub created: Instant,
    pub decision: Decision,
    pub report: Report,
    pub heal: HealLog,
    /// Host uptime in seconds.
    pub uptime: u64,
    pub agent_uptime: u64,
    pub generated_at: String,
    /// What the peers said of this instance's faults (`configured: false` without `[fleet]`).
    pub fleet: crate::fleet::FleetReport,
    /// The scaling signal (`details.saturation`).
    pub saturation: SaturationReport,
    /// The CloudWatch publisher's state (`details.scaling.cloudwatch`); `None` when it is off.
    pub cloudwatch: Option<crate::cloudwatch::Status>,
    /// A drain holding the instance out (`details.drain`); None while serving.
    pub drain: Option<crate::drain::DrainReport>,
    /// Alert messages waiting in the destinations' queues when this was published; None
    /// without alerts.
    pub alerts_queued: Option<usize>,
    /// Rendered bodies, indexed by [`Rendering`].
    bodies: [OnceLock<Bytes>; 4],
}

/// The four renderings of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// The seed body plus full diagnostics.
    Full = 0,
    /// The seed body only (status, uptime, checks, recommendation, reasons).
    Brief = 1,
    /// `application/health+json` with every check.
    IetfFull = 2,
    /// `application/health+json`, status and notes only.
    IetfBrief = 3,
}

/// The body's fields in the documented order (docs/verdicts.md): the seed fields, then
/// `generated_at`, then (for those allowed to see them) `details`. A struct, not a JSON map: a
/// map would sort them.
#[derive(Serialize)]
struct Seed<'a> {
    status: &'static str,
    uptime: u64,
    checks: SeedChecks,
    recommendation: &'static str,
    reasons: &'a [String],
    generated_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Value>,
}

#[derive(Serialize)]
struct SeedChecks {
    webserver: &'static str,
    database: &'static str,
    disk: &'static str,
    containers: String,
    cpu: String,
    memory: String,
    saturation: String,
}

fn seed<'a>(
    decision: &'a Decision,
    report: &Report,
    saturation: &SaturationReport,
    uptime: u64,
    generated_at: &'a str,
) -> Seed<'a> {
    let pct = |v: Option<f64>| v.map_or("unknown".to_string(), |v| format!("{:.0}%", v));
    Seed {
        status: decision.status.as_str(),
        uptime,
        checks: SeedChecks {
            webserver: report.web.verdict.as_str(),
            database: report.database.summary(),
            disk: report.disk.summary(),
            containers: report.containers.summary.clone(),
            cpu: pct(report.system.as_ref().map(|s| s.cpu_avg_percent)),
            memory: pct(report.system.as_ref().map(|s| s.memory_avg_percent)),
            saturation: saturation.summary(),
        },
        recommendation: decision.recommendation.as_str(),
        reasons: &decision.reasons,
        generated_at,
        details: None,
    }
}

impl Snapshot {
    pub fn new(
        decision: Decision,
        report: Report,
        heal: HealLog,
        uptime: u64,
        agent_uptime: u64,
    ) -> Self {
        Self {
            created: Instant::now(),
            generated_at: rfc3339(SystemTime::now()),
            decision,
            report,
            heal,
            uptime,
            agent_uptime,
            fleet: crate::fleet::FleetReport::not_configured(),
            saturation: SaturationReport::unknown(std::time::Duration::ZERO),
            cloudwatch: None,
            drain: None,
            alerts_queued: None,
            bodies: Default::default(),
        }
    }

    /// Saturation S averaged over `scaling.window`: 0 idle, 1.0 at capacity, above 1
    /// overloaded (not capped). None while withheld (a dependency fault holds: blocked work is
    /// not load, and nothing must be published) or not known yet.
    pub fn saturation(&self) -> Option<f64> {
        self.saturation
            .ratio
            .filter(|_| self.saturation.withheld.is_none())
    }

    pub fn with_alerts_queued(self, alerts_queued: Option<usize>) -> Self {
        Self {
            alerts_queued,
            ..self
        }
    }

    pub fn with_saturation(self, saturation: SaturationReport) -> Self {
        Self { saturation, ..self }
    }

    /// What the agent's supervisor reports once the check loop has stopped: the last report,
    /// with the answer `/health` gives for a stale snapshot (503, the loop named as the
    /// reason). For the alerts only; never served.
    pub fn as_stopped(&self, why: &str) -> Self {
        let decision = Decision {
            status: crate::status::Status::Unhealthy,
            http: 503,
            recommendation: crate::status::Recommendation::Stable,
            reasons: vec![format!(
                "{why}: the agent can no longer vouch for this instance"
            )],
            faults: Vec::new(),
            shared_dependency: false,
            erroring_alone: false,
        };
        Self {
            created: self.created,
            generated_at: rfc3339(SystemTime::now()),
            decision,
            report: self.report.clone(),
            heal: self.heal.clone(),
            uptime: self.uptime,
            agent_uptime: self.agent_uptime,
            fleet: self.fleet.clone(),
            saturation: self.saturation.clone(),
            cloudwatch: self.cloudwatch.clone(),
            drain: self.drain.clone(),
            alerts_queued: self.alerts_queued,
            bodies: Default::default(),
        }
    }

    pub fn with_fleet(self, fleet: crate::fleet::FleetReport) -> Self {
        Self { fleet, ..self }
    }

    pub fn with_drain(self, drain: Option<crate::drain::DrainReport>) -> Self {
        Self { drain, ..self }
    }

    pub fn with_cloudwatch(self, cloudwatch: Option<crate::cloudwatch::Status>) -> Self {
        Self { cloudwatch, ..self }
    }

    /// The rendered body, rendering it on first use.
    pub fn body(&self, which: Rendering) -> &Bytes {
        self.bodies[which as usize].get_or_init(|| Bytes::from(self.render(which)))
    }

    fn render(&self, which: Rendering) -> Vec<u8> {
        let (decision, report) = (&self.decision, &self.report);
        let mut seed = seed(
            decision,
            report,
            &self.saturation,
            self.uptime,
            &self.generated_at,
        );
        let value = match which {
            Rendering::Brief => return serde_json::to_vec(&seed).unwrap_or_default(),
            Rendering::IetfFull => {
                let mut body = ietf(decision, report, &self.generated_at, true);
                // Withheld: no observation, as in /metrics.
                if let (Some(ratio), Some(Value::Object(checks))) =
                    (self.saturation(), body.get_mut("checks"))
                {
                    checks.insert(
                        "saturation:utilization".into(),
                        json!([{
                            "componentType": "system",
                            "observedValue": crate::text::ratio(ratio),
                            "observedUnit": "ratio",
                            "status": "pass",
                            "time": self.generated_at,
                            "output": self.saturation.largest.unwrap_or_default(),
                        }]),
                    );
                }
                body
            }
            Rendering::IetfBrief => ietf(decision, report, &self.generated_at, false),
            Rendering::Full => {
                seed.details = Some(json!({
                            "web": report.web,
                            "disk": report.disk,
                            "system": report.system,
                            "containers": report.containers,
                            "database": report.database,
                            "heal": self.heal,
                            "fleet": self.fleet,
                            "saturation": self.saturation,
                            "scaling": {
                                "cloudwatch": self.cloudwatch.clone()
                                    .unwrap_or_else(crate::cloudwatch::Status::disabled),
                            },
                            "agent": {
                                "version": env!("CARGO_PKG_VERSION"),
                                "uptime": self.agent_uptime,
                                "kernel_view": report.web.kernel.state,
                            },
                }));
                if let (Some(drain), Some(Value::Object(details))) =
                    (&self.drain, seed.details.as_mut())
                {
                    details.insert("drain".into(), json!(drain));
                }
                return serde_json::to_vec(&seed).unwrap_or_default();
            }
        };
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

/// Seconds since the host booted (CLOCK_BOOTTIME: no file read on every tick): the body's
/// top-level `uptime`.
pub fn host_uptime() -> u64 {
    crate::sys::boottime().as_secs()
}

/// The draft ties `warn` to 2xx–3xx and `fail` to 4xx–5xx: the HTTP code decides first, so a
/// 503 while booting is `fail`, a 200 while booting `warn`.
fn ietf_status(s: Status, http: u16) -> &'static str {
    if http >= 400 {
        return "fail";
    }
    match s {
        Status::Healthy => "pass",
        Status::Unhealthy
        | Status::Degraded
        | Status::Booting
        | Status::Recovering
        | Status::Draining => "warn",
    }
}

/// An IETF check's status: "fail", else "warn", else "pass".
fn level(fail: bool, warn: bool) -> &'static str {
    if fail {
        "fail"
    } else if warn {
        "warn"
    } else {
        "pass"
    }
}

/// `database:connection` (and `database:responseTime` per database) for `ietf`.
fn ietf_database(checks: &mut serde_json::Map<String, Value>, db: &DatabaseReport, time: &str) {
    // A database is a shared dependency: at worst "warn", never "fail" (SPEC status table).
    let db_warn = |s| matches!(s, DbState::Unreachable | DbState::Slow);
    if db.state != DbState::NotConfigured && db.databases.is_empty() {
        checks.insert(
            "database:connection".into(),
            json!([{
                "componentType": "datastore",
                "observedValue": db.summary(),
                "status": level(false, db_warn(db.state)),
                "time": time,
                "output": db.reason.clone().unwrap_or_default(),
            }]),
        );
    } else if !db.databases.is_empty() {
        let connection: Vec<Value> = db
            .databases
            .iter()
            .map(|d| {
                json!({
                    "componentId": d.name,
                    "componentType": "datastore",
                    "observedValue": d.state.as_str(),
                    "status": level(false, db_warn(d.state)),
                    "time": d.last_checked.as_deref().unwrap_or(time),
                    "output": d.error.clone().unwrap_or_default(),
                })
            })
            .collect();
        checks.insert("database:connection".into(), Value::Array(connection));
        let response: Vec<Value> = db
            .databases
            .iter()
            .filter_map(|d| {
                d.latency_ms.map(|ms| {
                    json!({
                        "componentId": d.name,
                        "componentType": "datastore",
                        "observedValue": crate::text::ms(ms),
                        "observedUnit": "ms",
                        "status": level(false, d.state == DbState::Slow),
                        "time": d.last_checked.as_deref().unwrap_or(time),
                    })
                })
            })
            .collect();
        if !response.is_empty() {
            checks.insert("database:responseTime".into(), Value::Array(response));
        }
    }
}

/// The IETF health check response format (draft-inadarei-api-health-check):
/// `checks` keys are `component:measurement`, each an array of observations.
fn ietf(decision: &Decision, report: &Report, time: &str, details: bool) -> Value {
    let mut body = json!({
        "status": ietf_status(decision.status, decision.http),
        "version": "1",
        "releaseId": env!("CARGO_PKG_VERSION"),
        "serviceId": "health-agent",
        "description": format!("instance health: {}, recommendation {}", decision.status.as_str(), decision.recommendation.as_str()),
        "notes": decision.reasons,
    });
    if !details {
        return body;
    }
    let web = &report.web;
    let web_fault = matches!(
        web.verdict,
        crate::status::WebVerdict::Hung
            | crate::status::WebVerdict::Unresponsive
            | crate::status::WebVerdict::Down
    );
    let mut checks = serde_json::Map::new();
    checks.insert(
        "webserver:status".into(),
        json!([{
            "componentId": format!("port {}", web.port),
            "componentType": "component",
            "observedValue": web.verdict.as_str(),
            "status": level(
                web_fault,
                matches!(
                    web.verdict,
                    crate::status::WebVerdict::Slow
                        | crate::status::WebVerdict::PartialHang
                        | crate::status::WebVerdict::Erroring
                )
            ),
            "time": time,
            "output": web.detail,
        }]),
    );
    if let Some(p99) = web.counters.as_ref().map(|c| c.latency.p99_ms) {
        checks.insert(
            "webserver:responseTime".into(),
            json!([{
                "componentId": format!("port {}", web.port),
                "componentType": "component",
                "observedValue": crate::text::ms(p99),
                "observedUnit": "ms",
                "status": level(false, web.verdict == crate::status::WebVerdict::Slow),
                "time": time,
            }]),
        );
    }
    let disks: Vec<Value> = report
        .disk
        .mounts
        .iter()
        .map(|m| {
            json!({
                "componentId": m.path,
                "componentType": "system",
                "observedValue": crate::text::percent(m.used_percent),
                "observedUnit": "percent",
                "status": level(m.level == DiskLevel::Fail, m.level != DiskLevel::Ok),
                "time": time,
                "output": m.error.clone().unwrap_or_default(),
            })
        })
        .collect();
    checks.insert("disk:utilization".into(), Value::Array(disks));
    if let Some(s) = &report.system {
        // Each by its own threshold: a busy CPU is no warning about memory.
        checks.insert(
            "cpu:utilization".into(),
            json!([{"componentType": "system", "observedValue": crate::text::percent(s.cpu_avg_percent), "observedUnit": "percent", "status": level(false, s.cpu_high), "time": time}]),
        );
        checks.insert(
            "memory:utilization".into(),
            json!([{"componentType": "system", "observedValue": crate::text::percent(s.memory_avg_percent), "observedUnit": "percent", "status": level(false, s.memory_high), "time": time}]),
        );
    }
    ietf_database(&mut checks, &report.database, time);
    let c = &report.containers;
    if c.state != crate::status::ContainersState::NotConfigured {
        checks.insert(
            "containers:running".into(),
            json!([{
                "componentType": "component",
                "observedValue": c.summary,
                "status": level(c.state == crate::status::ContainersState::Faulty, c.state == crate::status::ContainersState::Unknown),
                "time": time,
                "output": c.reason.clone().unwrap_or_default(),
            }]),
        );
    }
    if let Value::Object(m) = &mut body {
        m.insert("checks".into(), Value::Object(checks));
    }
    body
}
