//! `health-agent check`: every check once, without the daemon. The kernel view needs history,
//! so the web check here is the probe plus the accept queue read before and after it.

use std::time::{Duration, Instant};

use crate::{
    checks::{disk::DiskReport, probe, ContainersReport, DatabaseReport, Report},
    config::{Config, FromEnv, Origin},
    engine::EngineError,
    heal::HealLog,
    policy::{evaluate, Decision},
    runner::checks::{check_disk, containers_wanted, probe_wanted, Checks, Database, Mode},
    snapshot::Snapshot,
    text::clean,
};

/// Every check once, as the snapshot `/health` would serve (no heal, no fleet, no history).
pub async fn run(cfg: &Config) -> Snapshot {
    let (decision, mut report) = decide(cfg).await;
    if cfg.web.port != 0 && cfg.web.kernel {
        // Checks::build turned it off for this run: say why, not "web.kernel = false".
        report.web.kernel.reason = Some(KERNEL_NOT_LOADED.into());
    }
    // What `serve` would run on this kernel, told at once.
    if let Some((tier, missing)) = crate::ebpf::tier::offered(&cfg.web) {
        if cfg.web.kernel {
            // Not "web.kernel = false" (the one-shot run's own setting): why serve would not
            // see the answers' status, or that only serve reads it.
            if let Some(answers) = report.web.answers.as_mut() {
                answers.not_visible = Some(answers_not_visible(tier, &missing));
            }
        }
        report.web.kernel.tier = Some(tier);
        report.web.kernel.missing = missing;
    }
    // A drain kept on disk answers for `serve`'s /health too: say the same.
    let drain = crate::drain::Drain::new(
        Some(cfg.drain.state_file.clone()),
        cfg.web.port != 0,
        cfg.checks.boot_grace,
    );
    let now = std::time::Instant::now();
    let decision = drain.apply(decision, report.web.verdict, None, now);
    let uptime = crate::snapshot::host_uptime();
    Snapshot::new(decision, report, HealLog::default(), uptime, 0).with_drain(drain.report(now))
}

/// The tier of the kernel view `serve` will run on this kernel, and what it lacks: the
/// agent's first log line carries it.
pub fn tier_line(web: &crate::config::WebConfig) -> String {
    match crate::ebpf::tier::offered(web) {
        None => "kernel tier: none (no web port)".into(),
        Some((tier, missing)) if missing.is_empty() => format!("kernel tier {}", tier.as_str()),
        Some((tier, missing)) => {
            format!(
                "kernel tier {} (without {})",
                tier.as_str(),
                missing.join("; ")
            )
        }
    }
}

/// `check --json`: the body `/health` serves with details, so one jq works on both.
pub fn json(snap: &Snapshot) -> String {
    String::from_utf8_lossy(snap.body(crate::snapshot::Rendering::Full)).into_owned()
}

/// What `check` says of the answers' status: what `serve` would lack on this kernel, or that
/// only `serve` counts them.
fn answers_not_visible(tier: crate::config::KernelTier, missing: &[String]) -> String {
    let prefix = crate::ebpf::tier::ANSWERS_MISSING;
    let lacking = missing.iter().find_map(|m| m.strip_prefix(prefix));
    match (tier, lacking, missing.first()) {
        (_, Some(why), _) => why.trim_start_matches(": ").to_string(),
        (crate::config::KernelTier::NoEbpf, _, Some(why)) => why.clone(),
        _ => ANSWERS_NOT_READ.into(),
    }
}

/// Why `check` has no answers' status classes where `serve` would.
pub const ANSWERS_NOT_READ: &str = "not counted by the one-shot check: health-agent serve \
    counts the answers' status classes";

/// Why `check` has no kernel view although `web.kernel = true`.
pub const KERNEL_NOT_LOADED: &str = "not loaded by the one-shot check: the kernel view judges \
    from seconds of connection history that a single look cannot have (health-agent serve loads \
    it); this answer comes from the probe and the accept queue";

async fn decide(cfg: &Config) -> (Decision, Report) {
    let Checks {
        web: (mut web, mut port),
        probes,
        mut system,
        engine,
        engine_error,
        database,
        ..
    } = Checks::build(cfg, Mode::Once);
    if !cfg.web.container.is_empty() {
        let net = match (&engine, &engine_error) {
            (Some(d), _) => d.network_of(&cfg.web.container).await,
            (None, e) => Err(e.clone().unwrap_or_else(|| EngineError::Address {
                key: "containers",
                address: crate::runner::checks::engine_address(cfg).to_string(),
                reason: "no container engine client".into(),
            })),
        };
        web.set_container(net);
    }
    let start = Instant::now();
    system.sample(start);
    // The first look finds the listener, and with it the address to probe.
    web.evaluate(&mut port, start);
    let probed = if probe_wanted(cfg) {
        let spec = probe::ProbeSpec::of(&cfg.web);
        probe::probe_shared(&web.probe_target(), &spec, &probes).await
    } else {
        None
    };
    if let Some(p) = probed {
        web.record_probe(p, Instant::now());
    } else {
        // sysinfo needs two samples some time apart for CPU use.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let disk = tokio::time::timeout(cfg.checks.timeout, check_disk(cfg.disk.clone()))
        .await
        .unwrap_or_else(|_| DiskReport::unknown());
    let containers = if !containers_wanted(cfg) {
        ContainersReport::not_configured()
    } else {
        match (&engine, engine_error) {
            (Some(d), _) => crate::checks::containers::check(d, &cfg.containers).await,
            // Always an error here: the container check is configured, so a client was wanted.
            (None, e) => ContainersReport::unknown(e.map(|e| e.to_string()).unwrap_or_default()),
        }
    };
    let database = match database {
        Database::NotConfigured => DatabaseReport::not_configured(),
        Database::On(mut m) => m.check().await,
        Database::Broken(e) => DatabaseReport {
            state: crate::status::DbState::Unknown,
            reason: Some(e.to_string()),
            databases: Vec::new(),
        },
    };
    let now = Instant::now();
    let report = Report {
        web: web.evaluate(&mut port, now),
        disk,
        system: system.sample(now),
        containers,
        database,
    };
    (
        evaluate(&crate::policy::PolicyInput::of(&report, false)),
        report,
    )
}

/// The readable table `check` prints without `--json`. Each row is one line without control
/// characters: names and errors come from outside (a database server's message, a container's
/// name, the engine's error), and a terminal obeys an escape sequence in them.
pub fn table(d: &Decision, r: &Report) -> String {
    let mut out = format!(
        "status          {} (HTTP {})\nrecommendation  {}\n",
        d.status.as_str(),
        d.http,
        d.recommendation.as_str()
    );
    let mut row = |k: &str, v: String| out.push_str(&format!("{:<15} {}\n", clean(k), clean(&v)));
    row(
        "webserver",
        format!("{} — {}", r.web.verdict.as_str(), r.web.detail),
    );
    if let Some(tier) = r.web.kernel.tier {
        row(
            "kernel tier",
            format!(
                "{} (what serve runs on this kernel){}",
                tier.as_str(),
                if r.web.kernel.missing.is_empty() {
                    String::new()
                } else {
                    format!(" — without {}", r.web.kernel.missing.join("; "))
                }
            ),
        );
    }
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
            "{}{}{}",
            r.containers.summary,
            r.containers
                .engine
                .as_ref()
                .map_or(String::new(), |e| format!(" ({e})")),
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
            // The key to change comes with the cause.
            (Some(e), _) if db.state == crate::status::DbState::Misconfigured => {
                format!("{}: {e}", db.key)
            }
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

/// With `[fleet]`: the fleet key as `serve` would read it, so whether its peers are counted.
/// `check` prints it as a row, `config --validate` and `serve`'s first log line say it.
pub fn fleet_key(cfg: &Config) -> Option<crate::fleet::key::FleetKey> {
    cfg.fleet
        .enabled()
        .then(|| crate::fleet::key::FleetKey::load(&cfg.fleet))
}

/// The rows `check` prints after the table: where each secret in use comes from, and the
/// hints on the environment (a variable named but unset, `DATABASE_URL` set but unread).
/// Never a value.
pub fn environment_rows(from_env: &FromEnv) -> String {
    let mut out = String::new();
    for s in &from_env.secrets {
        // A key neither written nor in the environment is a destination not configured.
        if !(s.is_key() && s.origin == Origin::Unset) {
            out.push_str(&format!("{:<15} {}\n", "secret", clean(&s.describe())));
        }
    }
    for note in &from_env.notes {
        out.push_str(&format!("{:<15} {}\n", "hint", clean(note)));
    }
    out
}

/// The rows `check` prints on AWS when the config calls it (`scaling.cloudwatch`, peers from
/// the auto-scaling group, the lifecycle hook): where the keys come from, whether they can be
/// had now, and the region. Never a key, secret or token.
pub async fn aws_rows(cfg: &Config) -> String {
    use crate::aws::{credentials::Provider, imds::Imds};
    let used = cfg.scaling.cloudwatch.enabled
        || cfg.fleet.from_asg()
        || !cfg.drain.lifecycle_hook.is_empty();
    if !used {
        return String::new();
    }
    let region = [&cfg.scaling.cloudwatch.region, &cfg.drain.region]
        .into_iter()
        .find(|r| !r.is_empty())
        .map_or("", |r| r.as_str());
    let imds = std::sync::Arc::new(Imds::from_env(AWS_CHECK_TIMEOUT));
    let mut provider = Provider::from_env(imds.clone(), region);
    let credentials = match provider.get().await {
        Ok(_) => match provider.expires() {
            Some(at) => {
                let left = at
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                format!(
                    "{} — ok (temporary: they expire in {} min, renewed {} min before)",
                    provider.source(),
                    left.as_secs() / 60,
                    crate::aws::credentials::RENEW_BEFORE.as_secs() / 60
                )
            }
            None => format!("{} — ok", provider.source()),
        },
        Err(e) => e.to_string(),
    };
    let region = match crate::aws::region_from(region, &imds).await {
        Ok((r, from)) => format!("{r} (from {from})"),
        Err(e) => format!("unknown — {e}"),
    };
    format!(
        "{:<15} {}\n{:<15} {}\n",
        "aws credentials",
        clean(&credentials),
        "aws region",
        clean(&region)
    )
}

/// Per request of `check` to the credential sources and the metadata service.
const AWS_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use crate::status::DbState;

    #[test]
    fn the_table_prints_what_came_from_outside_without_escapes_on_one_line_each() {
        let snap = crate::alerts::tests::unhealthy_snapshot();
        let (mut decision, mut report) = (snap.decision.clone(), snap.report.clone());
        report.database = crate::checks::DatabaseReport {
            state: DbState::Unreachable,
            reason: Some("FATAL: \x1b[2J\x1b[31mall good\nstatus          healthy".into()),
            databases: Vec::new(),
        };
        report.containers.reason = Some("engine said \u{9b}2J".into());
        decision
            .reasons
            .push("peer \x1b]0;owned\x07web-1:8080 slow".into());
        let plain = super::table(&snap.decision, &snap.report);
        let t = super::table(&decision, &report);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        // The server's line break forges no row of its own.
        assert_eq!(t.lines().count(), plain.lines().count() + 1, "{t}");
        assert!(
            t.contains("— FATAL: [2J[31mall good status          healthy\n"),
            "{t}"
        );
        assert!(t.contains("peer ]0;ownedweb-1:8080 slow\n"), "{t}");
    }
}
