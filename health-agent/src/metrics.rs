//! `/metrics`: every check's values by Prometheus' conventions (prometheus-client), so a
//! Prometheus or CloudWatch pipeline can act on the same snapshot the balancer sees —
//! including the scaling recommendation. The text format 0.0.4 or OpenMetrics, as the client
//! asks (`format`); the agent's own `process_*` series beside (`process`). docs/monitoring.md
//! lists every series.

mod agent;
mod format;
mod latency;
mod process;
mod responses;

use std::{
    sync::atomic::AtomicU64,
    time::{SystemTime, UNIX_EPOCH},
};

use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

pub use self::format::Format;
use crate::{
    config::SocketTracing,
    snapshot::Snapshot,
    status::{DbState, WebVerdict},
};

type Labels = Vec<(&'static str, String)>;
type FGauge = Gauge<f64, AtomicU64>;
type FCounter = Counter<f64, AtomicU64>;

/// What a scrape asked for, and what the agent runs with.
#[derive(Debug, Clone, Copy)]
pub struct Scrape {
    /// The client may see the series that name things (`server.details`).
    pub detailed: bool,
    pub format: Format,
    pub socket_tracing: SocketTracing,
}

struct Out {
    reg: Registry,
}

/// A gauge's value as it is written out, rounded by the unit its name ends with (the
/// OpenMetrics convention): seconds to 10 µs (`0.036934805` s of probe latency is
/// `0.03693`), anything else (ratios, rates, counts) to 4 decimals, so a percentage over 100
/// keeps its 0.1 point and `0.16399999999999999` is `0.164`. Still a number for Prometheus.
fn shown(name: &str, v: f64) -> f64 {
    if name.ends_with("_seconds") {
        crate::text::round_to(v, 5)
    } else {
        crate::text::round_to(v, 4)
    }
}

impl Out {
    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        let g = FGauge::default();
        g.set(shown(name, v));
        self.reg.register(name, help, g);
    }

    fn float_counter(&mut self, name: &str, help: &str, v: f64) {
        let c = FCounter::default();
        c.inc_by(crate::text::round_to(v, 3));
        self.reg.register(name, help, c);
    }

    fn counter(&mut self, name: &str, help: &str, v: u64) {
        let c: Counter = Counter::default();
        c.inc_by(v);
        self.reg.register(name, help, c);
    }

    fn labeled_counter(&mut self, name: &str, help: &str, values: Vec<(Labels, u64)>) {
        let f = Family::<Labels, Counter>::default();
        for (labels, v) in values {
            f.get_or_create(&labels).inc_by(v);
        }
        self.reg.register(name, help, f);
    }

    /// A counter family whose values may be fractional (scaled estimates).
    fn labeled_float_counter(&mut self, name: &str, help: &str, values: Vec<(Labels, f64)>) {
        let f = Family::<Labels, FCounter>::default();
        for (labels, v) in values {
            f.get_or_create(&labels).inc_by(crate::text::round_to(v, 3));
        }
        self.reg.register(name, help, f);
    }

    fn labeled(&mut self, name: &str, help: &str, values: Vec<(Labels, f64)>) {
        let f = Family::<Labels, FGauge>::default();
        for (labels, v) in values {
            f.get_or_create(&labels).set(shown(name, v));
        }
        self.reg.register(name, help, f);
    }

    /// One series per possible value, 1 for the current one (a state set).
    fn state(&mut self, name: &str, help: &str, label: &'static str, all: &[&str], current: &str) {
        let values = all
            .iter()
            .map(|s| {
                (
                    vec![(label, s.to_string())],
                    f64::from(u8::from(*s == current)),
                )
            })
            .collect();
        self.labeled(name, help, values);
    }
}

/// The whole snapshot, in the format the scrape asked for. Without `detailed` (a client
/// `server.details` does not let see diagnostics) the series that name things — mounts,
/// containers, databases — are left out, and only their aggregates are given.
pub fn render(s: &Snapshot, scrape: &Scrape) -> String {
    let detailed = scrape.detailed;
    let mut o = Out {
        reg: Registry::with_prefix("health_agent"),
    };
    agent::build_info(&mut o, s, scrape.socket_tracing);
    overview(&mut o, s);
    web_now(&mut o, &s.report.web);
    web_figures(&mut o, &s.report.web);
    host(&mut o, &s.report, detailed);
    containers_and_databases(&mut o, &s.report, detailed);
    heal_and_fleet(&mut o, s);
    let mut own = Out {
        reg: Registry::default(),
    };
    agent::process_metrics(&mut own);

    let mut text = String::new();
    let encoded = encode_registry(&mut text, &o.reg)
        .and_then(|()| encode_registry(&mut text, &own.reg))
        .and_then(|()| encode_eof(&mut text));
    if encoded.is_err() {
        text = "# metrics encoding failed\n# EOF\n".into();
    }
    match scrape.format {
        Format::OpenMetrics => text,
        Format::Text => format::to_text(&text),
    }
}

/// Unix time `ago` before now.
fn timestamp(ago: std::time::Duration) -> f64 {
    SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The answer the balancer gets, the recommendation, S and its parts, and the clocks.
fn overview(o: &mut Out, s: &Snapshot) {
    let d = &s.decision;
    o.gauge(
        "http_status",
        "HTTP code /health answers",
        f64::from(d.http),
    );
    o.state(
        "status",
        "Instance status",
        "status",
        &[
            "healthy",
            "degraded",
            "unhealthy",
            "booting",
            "recovering",
            "draining",
        ],
        d.status.as_str(),
    );
    o.state(
        "recommendation",
        "Scaling recommendation",
        "recommendation",
        &["stable", "scale_up", "scale_down", "infrastructure_issue"],
        d.recommendation.as_str(),
    );
    // Withheld (a dependency fault holds): no series at all, so an autoscaler reading them
    // holds capacity instead of acting on blocked work.
    if let Some(ratio) = s.saturation() {
        o.gauge(
            "saturation_ratio",
            "Saturation averaged over scaling.window: 0 idle, 1 at capacity, above 1 overloaded",
            ratio,
        );
        for (part, v) in s.saturation.parts.iter() {
            if let Some(v) = v {
                o.gauge(
                    &format!("saturation_{part}_ratio"),
                    &format!("Saturation's {part} part (1 = that resource at capacity)"),
                    v,
                );
            }
        }
    }
    // Host uptime and the agent's own are node_exporter's `node_boot_time_seconds` and
    // `process_start_time_seconds`: timestamps, not ages.
    o.gauge(
        "snapshot_timestamp_seconds",
        "Unix time the snapshot being served was made (time() minus it is its age)",
        timestamp(s.created.elapsed()),
    );
}

/// The web backend now: the verdict, the listener, and the programs' counts.
fn web_now(o: &mut Out, w: &crate::checks::web::WebReport) {
    o.state(
        "web_verdict",
        "Web backend verdict",
        "verdict",
        &WebVerdict::ALL.map(WebVerdict::as_str),
        w.verdict.as_str(),
    );
    o.gauge(
        "web_kernel_view_active",
        "1 when the eBPF programs are attached",
        f64::from(u8::from(
            w.kernel.state == crate::checks::web::KernelState::Active,
        )),
    );
    o.gauge(
        "web_accept_queue",
        "Connections waiting in the accept queue",
        f64::from(w.accept_queue),
    );
    o.gauge(
        "web_accept_queue_max",
        "Accept queue maximum",
        f64::from(w.accept_queue_max),
    );
    o.counter(
        "web_listen_overflows",
        "TcpExt ListenOverflows since agent start",
        w.listen_overflows,
    );
    o.counter(
        "web_listen_drops",
        "TcpExt ListenDrops since agent start",
        w.listen_drops,
    );
    // Counters only where the programs count all along: with `socket_tracing =
    // "on_suspicion"` they start from zero at each attach, which Prometheus would read as
    // resets. The rates below stand for them in both modes.
    let counted = w.figures.as_ref().is_some_and(|f| f.basis == "counted");
    if let Some(c) = w.counters.as_ref().filter(|_| counted) {
        o.counter(
            "web_connections_established",
            "Handshakes completed into the accept queue",
            c.established,
        );
        o.counter(
            "web_connections_accepted",
            "Connections returned by accept()",
            c.accepted,
        );
        o.counter(
            "web_connections_claimed",
            "Connections first touched by a process",
            c.claimed,
        );
        o.counter(
            "web_requests",
            "Connections whose first request byte was read",
            c.requests,
        );
        o.counter(
            "web_connections_answered",
            "Connections whose first response byte was sent",
            c.answered,
        );
        o.counter(
            "web_closed_unanswered",
            "Connections closed without a response byte",
            c.closed_unanswered,
        );
        o.counter(
            "web_closed_unaccepted",
            "Connections closed while waiting in the queue",
            c.closed_unaccepted,
        );
    }
    // Gauges of now, while the programs are attached (in both modes).
    if let Some(c) = &w.counters {
        o.gauge(
            "web_waiting",
            "Connections waiting untouched now",
            f64::from(c.waiting),
        );
        o.gauge(
            "web_oldest_waiting_seconds",
            "Age of the oldest waiting connection",
            c.oldest_waiting_ms.unwrap_or(0) as f64 / 1000.0,
        );
        o.gauge(
            "web_pending",
            "Requests read and unanswered now",
            f64::from(c.pending),
        );
        o.gauge(
            "web_oldest_pending_seconds",
            "Age of the oldest unanswered request",
            c.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0,
        );
        o.labeled_counter(
            "kernel_map_errors",
            "Map updates the kernel programs could not make (observations lost), by kind",
            c.map_errors
                .iter()
                .map(|(kind, n)| (vec![("kind", kind.as_str().to_string())], n))
                .collect(),
        );
    }
}

/// The web backend's figures (rates, answers by class, latency) and the probe.
fn web_figures(o: &mut Out, w: &crate::checks::web::WebReport) {
    if let Some(f) = &w.figures {
        o.labeled(
            "web_figures_windows",
            "Spans the rates and latency come from, by basis (counted: socket_tracing = \
             always; windows: estimated from the counting windows)",
            vec![(vec![("basis", f.basis.to_string())], f.windows as f64)],
        );
        o.gauge(
            "web_figures_counted_seconds",
            "Seconds the programs counted within web.latency_window",
            f.counted_seconds,
        );
        if let Some(age) = f.age_seconds {
            o.gauge(
                "web_figures_timestamp_seconds",
                "Unix time the newest span the rates and latency come from ended",
                timestamp(std::time::Duration::from_secs_f64(age.max(0.0))),
            );
        }
        if let Some(r) = f.requests_per_second {
            o.gauge(
                "web_requests_per_second",
                "Requests arriving per second over web.latency_window (the agent's probes left out)",
                r,
            );
        }
        if let Some(by) = &f.answers_per_second {
            o.labeled(
                "web_responses_per_second",
                "Real answers per second by status class over web.latency_window (the probe \
                 path's left out)",
                by.iter()
                    .map(|(class, r)| (vec![("class", class.to_string())], *r))
                    .collect(),
            );
        }
        latency::histogram(o, &f.latency_total);
    }
    responses::responses_total(o, w);
    if let Some(a) = w.answers.as_ref().filter(|a| a.status_visible) {
        if let Some(share) = a.share_5xx {
            o.gauge(
                "web_error_share",
                "5xx share of the real answers over web.errors_window",
                share,
            );
        }
    }
    if let Some(p) = &w.probe {
        o.gauge(
            "web_probe_success",
            "1 when the last probe got a 2xx/3xx",
            f64::from(u8::from(p.ok)),
        );
        o.gauge(
            "web_probe_latency_seconds",
            "Latency of the last probe",
            p.latency_ms / 1000.0,
        );
    }
}

/// Disks, CPU and memory.
fn host(o: &mut Out, r: &crate::checks::Report, detailed: bool) {
    o.gauge(
        "disk_used_ratio_max",
        "Used fraction of the fullest configured mount",
        r.disk
            .mounts
            .iter()
            .map(|m| m.used_percent)
            .fold(0.0, f64::max)
            / 100.0,
    );
    if detailed {
        o.labeled(
            "disk_used_ratio",
            "Used fraction of each configured mount",
            r.disk
                .mounts
                .iter()
                .map(|m| (vec![("path", m.path.clone())], m.used_percent / 100.0))
                .collect(),
        );
    }
    if let Some(sys) = &r.system {
        o.gauge(
            "cpu_ratio",
            "CPU use averaged over the scaling window",
            sys.cpu_avg_percent / 100.0,
        );
        o.gauge(
            "memory_ratio",
            "Memory use averaged over the scaling window",
            sys.memory_avg_percent / 100.0,
        );
    }
}

/// The expected containers and the databases (per name only when `detailed`).
fn containers_and_databases(o: &mut Out, r: &crate::checks::Report, detailed: bool) {
    let running =
        |c: &&crate::checks::ContainerInfo| c.state == "running" && c.health != "unhealthy";
    o.gauge(
        "containers_expected",
        "Expected containers found",
        r.containers.containers.len() as f64,
    );
    o.gauge(
        "containers_up",
        "Expected containers running and not unhealthy",
        r.containers.containers.iter().filter(running).count() as f64,
    );
    o.state(
        "database",
        "Database state",
        "state",
        &DbState::ALL.map(DbState::as_str),
        r.database.summary(),
    );
    if detailed {
        o.labeled(
            "container_up",
            "1 when an expected container is running and not unhealthy",
            r.containers
                .containers
                .iter()
                .map(|c| {
                    let up = c.state == "running" && c.health != "unhealthy";
                    (vec![("name", c.name.clone())], f64::from(u8::from(up)))
                })
                .collect(),
        );
        o.labeled(
            "container_restarts",
            "Docker's restart count of each expected container",
            r.containers
                .containers
                .iter()
                .map(|c| (vec![("name", c.name.clone())], c.restart_count as f64))
                .collect(),
        );
        // Per database: the name label is the URL without its password.
        let dbs = &r.database.databases;
        let db_labels = |d: &crate::checks::database::DatabaseEntry| -> Labels {
            vec![
                ("database", d.name.clone()),
                ("kind", d.kind.as_str().to_string()),
            ]
        };
        o.labeled(
            "database_state",
            "State of each configured database, 1 for the current one (damped)",
            dbs.iter()
                .flat_map(|d| {
                    DbState::ALL[1..]
                        .iter()
                        .map(|&st| st.as_str())
                        .map(move |st| {
                            let mut labels = db_labels(d);
                            labels.push(("state", st.to_string()));
                            let current = st == d.state.as_str();
                            (labels, f64::from(u8::from(current)))
                        })
                })
                .collect(),
        );
        o.labeled(
            "database_latency_seconds",
            "Duration of the last good round trip to each database, connect included",
            dbs.iter()
                .filter_map(|d| d.latency_ms.map(|ms| (db_labels(d), ms / 1000.0)))
                .collect(),
        );
        o.labeled(
            "database_consecutive_failures",
            "Failed round trips in a row to each database",
            dbs.iter()
                .map(|d| (db_labels(d), f64::from(d.consecutive_failures)))
                .collect(),
        );
    }
}

/// Self-heal, the alert queues and the fleet's view.
fn heal_and_fleet(o: &mut Out, s: &Snapshot) {
    let h = &s.heal;
    o.counter(
        "heal_attempts",
        "Self-heal restarts issued",
        h.total_attempts,
    );
    o.counter(
        "heal_recovered",
        "Self-heal restarts that brought the instance back",
        h.total_recovered,
    );
    o.counter(
        "heal_failed",
        "Self-heal restarts that did not",
        h.total_failed,
    );
    o.gauge(
        "heal_restarts_in_window",
        "Restarts counted against the budget",
        f64::from(h.restarts_in_window),
    );
    if let Some(n) = s.alerts_queued {
        o.gauge(
            "alerts_queued",
            "Alert messages waiting for delivery, all destinations (each queue bounded by alerts.queue_size)",
            n as f64,
        );
    }
    let f = &s.fleet;
    if f.configured {
        o.gauge(
            "fleet_peers_asked",
            "Peers asked in the latest round",
            f.peers_asked.len() as f64,
        );
        o.gauge(
            "fleet_peers_answered",
            "Peers that answered the latest round with a valid view",
            f.peers_answered.len() as f64,
        );
        o.labeled_counter(
            "fleet_peer_failures",
            "Peer answers not counted since start, by reason: unproven (not signed with the fleet key for this ask), refused (the peer refused our proof), out_of_range, too_large, not_a_view, version, transport, status",
            crate::fleet::exchange::FAILURE_REASONS
                .iter()
                .zip(f.failures)
                .map(|(r, n)| (vec![("reason", (*r).to_string())], n))
                .collect(),
        );
        o.labeled(
            "fleet_judgement",
            "This instance's faults as the peers judge them: 1 for the current scope",
            f.judgements
                .iter()
                .map(|j| {
                    (
                        vec![
                            ("class", j.class.as_str().to_string()),
                            ("scope", j.scope.as_str().to_string()),
                        ],
                        1.0,
                    )
                })
                .collect(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        checks::{
            database::{DatabaseEntry, DbKind},
            ContainersReport, DatabaseReport, Report,
        },
        heal::HealLog,
        policy::evaluate,
        status::DbState,
    };

    /// The OpenMetrics rendering, as Prometheus asks for it.
    fn om(s: &Snapshot, detailed: bool) -> String {
        render(
            s,
            &Scrape {
                detailed,
                format: Format::OpenMetrics,
                socket_tracing: SocketTracing::OnSuspicion,
            },
        )
    }

    /// The alert queues' length is a gauge with `[alerts]`, absent without: the soak reads it
    /// to show the queues stay bounded.
    #[test]
    fn alert_queue_length_is_a_gauge_only_with_alerts() {
        let report = Report {
            web: crate::checks::web::WebReport::not_configured(),
            disk: crate::checks::disk::DiskReport {
                level: crate::status::DiskLevel::Ok,
                mounts: Vec::new(),
            },
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        };
        let decision = evaluate(&crate::policy::PolicyInput::of(&report, false));
        let snap = Snapshot::new(decision, report, HealLog::default(), 1, 1);
        assert!(!om(&snap, true).contains("alerts_queued"));
        let text = om(&snap.with_alerts_queued(Some(3)), false);
        assert!(
            text.contains("health_agent_alerts_queued 3.0\n"),
            "no queue gauge in:\n{text}"
        );
    }

    #[test]
    fn figures_are_written_out_rounded_and_numeric() {
        let mut report = Report {
            web: crate::checks::web::WebReport::not_configured(),
            disk: crate::checks::disk::DiskReport {
                level: crate::status::DiskLevel::Ok,
                mounts: vec![crate::checks::disk::MountUsage {
                    path: "/".into(),
                    used_percent: 16.4,
                    total_bytes: 100,
                    available_bytes: 84,
                    level: crate::status::DiskLevel::Ok,
                    error: None,
                }],
            },
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        };
        report.web.probe = Some(crate::checks::probe::ProbeResult {
            ok: true,
            status: Some(200),
            latency_ms: 5.3812809999999995,
            error: None,
            timed_out: false,
            refused: false,
            agent_error: false,
            target: "127.0.0.1:9000".into(),
            ..Default::default()
        });
        let decision = evaluate(&crate::policy::PolicyInput::of(&report, false));
        let snap = Snapshot::new(decision, report, HealLog::default(), 1, 1);
        let text = om(&snap, true);
        for line in [
            "health_agent_disk_used_ratio_max 0.164\n",
            "health_agent_disk_used_ratio{path=\"/\"} 0.164\n",
            "health_agent_web_probe_latency_seconds 0.00538\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        let noisy = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next())
            .filter(|v| v.split_once('.').is_some_and(|(_, d)| d.len() > 5))
            .collect::<Vec<_>>();
        assert!(noisy.is_empty(), "long decimals {noisy:?} in:\n{text}");
    }

    #[test]
    fn latency_is_a_prometheus_histogram_from_1_ms_to_60_s() {
        use health_common::latency_bucket;
        let mut h = health_common::LatencyHist::default();
        h.buckets[latency_bucket(800)] += 90; // 0.8 ms
        h.buckets[latency_bucket(40_000)] += 9; // 40 ms
        h.buckets[latency_bucket(90_000_000)] += 1; // 90 s
        let mut o = Out {
            reg: Registry::with_prefix("health_agent"),
        };
        latency::histogram(&mut o, &h);
        let mut text = String::new();
        encode_registry(&mut text, &o.reg).unwrap();
        for line in [
            "# TYPE health_agent_web_latency_seconds histogram\n",
            "health_agent_web_latency_seconds_count 100\n",
            "health_agent_web_latency_seconds_bucket{le=\"0.001\"} 90\n",
            "health_agent_web_latency_seconds_bucket{le=\"0.02\"} 90\n",
            "health_agent_web_latency_seconds_bucket{le=\"0.05\"} 99\n",
            "health_agent_web_latency_seconds_bucket{le=\"60.0\"} 99\n",
            "health_agent_web_latency_seconds_bucket{le=\"+Inf\"} 100\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("health_agent_web_latency_seconds_sum "))
            .and_then(|v| v.parse().ok())
            .expect("a sum");
        // The buckets' midpoints: within a sixth of the real 90 × 0.8 ms + 9 × 40 ms + 90 s.
        let real = 90.0 * 0.0008 + 9.0 * 0.04 + 90.0;
        assert!((sum - real).abs() / real < 0.17, "{sum} vs {real}");
    }

    #[test]
    fn every_database_gets_latency_and_state_series() {
        let entry = |name: &str, kind, state, latency_ms| DatabaseEntry {
            name: name.into(),
            key: "database.urls[0]".into(),
            kind,
            state,
            latency_ms,
            error: None,
            detail: None,
            consecutive_failures: u32::from(state == DbState::Unreachable) * 2,
            last_checked: None,
        };
        let report = Report {
            web: crate::checks::web::WebReport::not_configured(),
            disk: crate::checks::disk::DiskReport::unknown(),
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport {
                state: DbState::Unreachable,
                reason: None,
                databases: vec![
                    entry(
                        "postgres://hc@127.0.0.1:5432/app",
                        DbKind::Postgres,
                        DbState::Connected,
                        Some(12.5),
                    ),
                    entry(
                        "redis://127.0.0.1:6379",
                        DbKind::Redis,
                        DbState::Unreachable,
                        None,
                    ),
                ],
            },
        };
        let decision = evaluate(&crate::policy::PolicyInput::of(&report, false));
        let snap = Snapshot::new(decision, report, HealLog::default(), 1, 1);
        let text = om(&snap, true);
        for line in [
            r#"health_agent_database{state="unreachable"} 1.0"#,
            r#"health_agent_database_state{database="postgres://hc@127.0.0.1:5432/app",kind="postgres",state="connected"} 1.0"#,
            r#"health_agent_database_state{database="redis://127.0.0.1:6379",kind="redis",state="connected"} 0.0"#,
            r#"health_agent_database_state{database="redis://127.0.0.1:6379",kind="redis",state="unreachable"} 1.0"#,
            r#"health_agent_database_latency_seconds{database="postgres://hc@127.0.0.1:5432/app",kind="postgres"} 0.0125"#,
            r#"health_agent_database_consecutive_failures{database="redis://127.0.0.1:6379",kind="redis"} 2.0"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert!(
            !text.contains(r#"health_agent_database_latency_seconds{database="redis"#),
            "no latency series without a good round trip:\n{text}"
        );
        // A client without diagnostics gets the aggregate, and no name.
        let brief = om(&snap, false);
        assert!(brief.contains(r#"health_agent_database{state="unreachable"} 1.0"#));
        assert!(!brief.contains("127.0.0.1"), "{brief}");
        assert!(!brief.contains("database_state"), "{brief}");
    }

    #[test]
    fn kernel_map_errors_are_counters_by_kind_zeros_included() {
        use health_common::MapErrorKind;
        let mut web = crate::checks::web::WebReport::not_configured();
        web.counters = Some(crate::checks::web::KernelCounters {
            map_errors: crate::ebpf::MapErrors::sum([(MapErrorKind::ConnInsert, &[2, 1][..])]),
            ..Default::default()
        });
        let report = Report {
            web,
            disk: crate::checks::disk::DiskReport::unknown(),
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        };
        let decision = evaluate(&crate::policy::PolicyInput::of(&report, false));
        let text = om(
            &Snapshot::new(decision, report, HealLog::default(), 1, 1),
            false,
        );
        for line in [
            "# TYPE health_agent_kernel_map_errors counter",
            r#"health_agent_kernel_map_errors_total{kind="conn_insert"} 3"#,
            r#"health_agent_kernel_map_errors_total{kind="port_counters"} 0"#,
            r#"health_agent_kernel_map_errors_total{kind="other"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }

    #[test]
    fn saturation_gauges_are_absent_while_withheld() {
        use crate::saturation::{report::Parts, SaturationReport};
        let report = Report {
            web: crate::checks::web::WebReport::not_configured(),
            disk: crate::checks::disk::DiskReport::unknown(),
            system: None,
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        };
        let decision = evaluate(&crate::policy::PolicyInput::of(&report, false));
        let mut sat = SaturationReport::unknown(std::time::Duration::from_secs(60));
        sat.parts = Parts {
            web: Some(0.42),
            cpu: Some(0.1),
            ..Parts::default()
        };
        sat.ratio = Some(0.42);
        let snap = |sat: SaturationReport| {
            Snapshot::new(decision.clone(), report.clone(), HealLog::default(), 1, 1)
                .with_saturation(sat)
        };
        let text = om(&snap(sat.clone()), false);
        for line in [
            "health_agent_saturation_ratio 0.42",
            "health_agent_saturation_web_ratio 0.42",
            "health_agent_saturation_cpu_ratio 0.1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert!(
            !text.contains("saturation_memory_ratio"),
            "unknown parts are left out"
        );
        sat.withheld = Some("the database is unreachable".into());
        let text = om(&snap(sat), false);
        assert!(
            !text.contains("health_agent_saturation"),
            "withheld:\n{text}"
        );
    }
}
