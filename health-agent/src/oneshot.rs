//! `health-agent check`: every check once, without the daemon. The kernel view needs history,
//! so the web check here is the probe plus the accept queue read before and after it.

use std::time::{Duration, Instant};

use crate::{
    checks::{
        database::DatabaseMonitor, disk, probe, system::SystemMonitor, web::WebMonitor,
        ContainersReport, DatabaseReport, Report,
    },
    config::{Config, DatabaseConfig, WebConfig},
    docker::Docker,
    policy::{evaluate, Decision},
};

pub async fn run(cfg: &Config) -> (Decision, Report) {
    let web_cfg = WebConfig {
        kernel: false,
        ..cfg.web.clone()
    };
    let mut web = WebMonitor::new(web_cfg);
    if !cfg.web.container.is_empty() {
        let net = match Docker::connect(&cfg.containers.docker_host, cfg.checks.timeout) {
            Ok(d) => d.network_of(&cfg.web.container).await,
            Err(e) => Err(e),
        };
        web.set_container(net);
    }
    let mut system = SystemMonitor::new(cfg.scaling.clone());
    let start = Instant::now();
    system.sample(start);
    // The first look finds the listener, and with it the address to probe.
    web.evaluate(start);
    let probed = if cfg.web.port != 0 && !cfg.web.probe_path.is_empty() {
        probe::probe_shared(
            &web.probe_target(),
            &cfg.web.probe_path,
            cfg.web.probe_timeout,
        )
        .await
    } else {
        None
    };
    if let Some(p) = probed {
        web.record_probe(p, Instant::now());
    } else {
        // sysinfo needs two samples some time apart for CPU use.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let disk_cfg = cfg.disk.clone();
    let disk = tokio::time::timeout(
        cfg.checks.timeout,
        tokio::task::spawn_blocking(move || disk::check(&disk_cfg)),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_else(Report::disk_unknown);
    let containers = if cfg.containers.names.is_empty() && cfg.containers.labels.is_empty() {
        ContainersReport::not_configured()
    } else {
        match Docker::connect(&cfg.containers.docker_host, cfg.checks.timeout) {
            Ok(d) => crate::checks::containers::check(&d, &cfg.containers).await,
            Err(e) => ContainersReport {
                state: crate::policy::ContainersState::Unknown,
                summary: "unknown".into(),
                reason: Some(e),
                faulty: Vec::new(),
                containers: Vec::new(),
            },
        }
    };
    // One round trip per database decides: there is no history to damp here.
    let one_round = DatabaseConfig {
        fail_after: 1,
        recover_after: 1,
        ..cfg.database.clone()
    };
    let database = match DatabaseMonitor::new(&one_round) {
        Ok(None) => DatabaseReport::not_configured(),
        Ok(Some(mut m)) => m.check().await,
        Err(e) => DatabaseReport {
            state: crate::policy::DbState::Unknown,
            reason: Some(e.to_string()),
            databases: Vec::new(),
        },
    };
    let now = Instant::now();
    let report = Report {
        web: web.evaluate(now),
        disk,
        system: system.sample(now),
        containers,
        database,
    };
    (evaluate(&report.policy_input(false)), report)
}

/// The readable table `check` prints without `--json`.
pub fn table(d: &Decision, r: &Report) -> String {
    let mut out = format!(
        "status          {} (HTTP {})\nrecommendation  {}\n",
        d.status.as_str(),
        d.http,
        d.recommendation.as_str()
    );
    let mut row = |k: &str, v: String| out.push_str(&format!("{k:<15} {v}\n"));
    row(
        "webserver",
        format!("{} — {}", r.web.verdict.as_str(), r.web.detail),
    );
    for m in &r.disk.mounts {
        let v = match &m.error {
            Some(e) => format!("unknown — {e}"),
            None => format!("{:.1}% used ({:?})", m.used_percent, m.level).to_lowercase(),
        };
        row(&format!("disk {}", m.path), v);
    }
    if let Some(s) = &r.system {
        row("cpu", format!("{:.0}%", s.cpu_percent));
        row("memory", format!("{:.0}%", s.memory_percent));
        row("load", format!("{:.2} {:.2}", s.load1, s.load5));
    }
    row(
        "containers",
        format!(
            "{}{}",
            r.containers.summary,
            r.containers
                .reason
                .as_ref()
                .map_or(String::new(), |x| format!(" — {x}"))
        ),
    );
    row(
        "database",
        format!(
            "{}{}",
            r.database.summary(),
            r.database
                .reason
                .as_ref()
                .filter(|_| r.database.databases.is_empty())
                .map_or(String::new(), |x| format!(" — {x}"))
        ),
    );
    for db in &r.database.databases {
        let state = db.state.as_str();
        let how = match (&db.error, db.latency_ms) {
            (Some(e), _) => e.clone(),
            (None, Some(ms)) => format!(
                "{ms:.1} ms{}",
                db.detail
                    .as_ref()
                    .map_or(String::new(), |d| format!(" ({d})"))
            ),
            (None, None) => "not checked".into(),
        };
        row(&format!("  {}", db.name), format!("{state} — {how}"));
    }
    for reason in &d.reasons {
        row("reason", reason.clone());
    }
    out
}
