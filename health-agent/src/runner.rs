//! The background half of the agent. Each slow or fallible check runs in its own task on its
//! own cadence with its own timeout and publishes its latest result; the composer merges the
//! latest results every `web.eval_interval` (the kernel view is cheap to read), applies the
//! policy, self-healing and the flap guard, and publishes one immutable snapshot. A check that
//! hangs shows up as a stale result; it never blocks the others or the HTTP server.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    alerts::{self, Alerts},
    checks::{
        disk::{self, DiskReport},
        probe::{self, ProbeResult},
        system::SystemMonitor,
        web::WebMonitor,
        ContainersReport, DatabaseReport, Report,
    },
    config::Config,
    docker::Docker,
    heal::Healer,
    policy::{evaluate, DiskLevel, FlapGuard},
    snapshot::{SharedSnapshot, Snapshot},
};

/// A check result and when it was taken.
#[derive(Debug, Clone)]
pub struct Timed<T> {
    pub at: Instant,
    pub value: T,
}

type Slot<T> = watch::Receiver<Option<Timed<T>>>;

/// Runs `check` every `every` until shutdown, each run bounded by `timeout`; a run that does not
/// finish publishes `on_timeout()` instead.
fn spawn_periodic<T, F, Fut>(
    every: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
    mut check: F,
    on_timeout: impl Fn() -> T + Send + 'static,
) -> Slot<T>
where
    T: Send + Sync + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let value = match tokio::time::timeout(timeout, check()).await {
                Ok(v) => v,
                Err(_) => on_timeout(),
            };
            if tx
                .send(Some(Timed {
                    at: Instant::now(),
                    value,
                }))
                .is_err()
            {
                return;
            }
        }
    });
    rx
}

/// The running background half.
pub struct Agent {
    pub snapshot: SharedSnapshot,
    /// Ends after shutdown, once the kernel programs are detached.
    pub composer: tokio::task::JoinHandle<()>,
}

/// Starts every check and the composer. The first snapshot exists before this returns.
pub async fn start(cfg: Arc<Config>, shutdown: CancellationToken) -> Agent {
    let started = Instant::now();
    let interval = cfg.checks.interval;
    let timeout = cfg.checks.timeout;

    let disk_cfg = cfg.disk.clone();
    let disk_slot = spawn_periodic(
        interval,
        timeout,
        shutdown.clone(),
        move || {
            let c = disk_cfg.clone();
            async move {
                tokio::task::spawn_blocking(move || disk::check(&c))
                    .await
                    .unwrap_or_else(|_| Report::disk_unknown())
            }
        },
        || DiskReport {
            level: DiskLevel::Unknown,
            mounts: Vec::new(),
        },
    );

    let probe_slot = (cfg.web.port != 0 && !cfg.web.probe_path.is_empty()).then(|| {
        let (port, path, t) = (
            cfg.web.port,
            cfg.web.probe_path.clone(),
            cfg.web.probe_timeout,
        );
        spawn_periodic(
            interval,
            t + Duration::from_secs(1),
            shutdown.clone(),
            move || {
                let path = path.clone();
                async move { probe::probe(port, &path, t).await }
            },
            move || ProbeResult {
                ok: false,
                status: None,
                latency_ms: t.as_secs_f64() * 1000.0,
                error: Some("probe task overran its timeout".into()),
                timed_out: true,
            },
        )
    });

    let wants_docker = !cfg.containers.names.is_empty()
        || !cfg.containers.labels.is_empty()
        || !cfg.web.container.is_empty();
    let docker = if wants_docker {
        match Docker::connect(&cfg.containers.docker_host, timeout) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::error!("{e}; container checks and container restarts are off");
                None
            }
        }
    } else {
        None
    };
    let containers_slot = docker
        .clone()
        .filter(|_| !cfg.containers.names.is_empty() || !cfg.containers.labels.is_empty())
        .map(|d| {
            let ccfg = cfg.containers.clone();
            spawn_periodic(
                interval,
                timeout,
                shutdown.clone(),
                move || {
                    let (d, c) = (d.clone(), ccfg.clone());
                    async move { d.check(&c).await.0 }
                },
                move || ContainersReport {
                    state: crate::policy::ContainersState::Unknown,
                    summary: "unknown".into(),
                    reason: Some(format!(
                        "Docker did not answer within {}s",
                        timeout.as_secs()
                    )),
                    faulty: Vec::new(),
                    containers: Vec::new(),
                },
            )
        });

    let mut composer = Composer {
        web: WebMonitor::new(cfg.web.clone()),
        system: SystemMonitor::new(cfg.scaling.clone()),
        healer: Healer::new(cfg.heal.clone(), cfg.web.clone(), docker),
        guard: FlapGuard::new(cfg.checks.fail_after, cfg.checks.recover_after),
        cfg: cfg.clone(),
        started,
        disk: disk_slot,
        probe: probe_slot,
        containers: containers_slot,
        last_system: None,
        alerts: Alerts::start(&cfg.alerts, alerts::hostname(), shutdown.clone()),
    };
    let now = Instant::now();
    let first = composer.compose(now);
    if let Some(a) = composer.alerts.as_mut() {
        a.observe(&first, now);
    }
    let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(first));
    let out = shared.clone();
    let composer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(composer.cfg.web.eval_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let snap = composer.compose(now);
            if let Some(a) = composer.alerts.as_mut() {
                a.observe(&snap, now);
            }
            shared.store(Arc::new(snap));
        }
        let alerts = composer.alerts.take();
        // Dropping the composer detaches the kernel programs.
        drop(composer);
        // Then give queued alerts their few seconds to go out.
        if let Some(a) = alerts {
            a.closed().await;
        }
    });
    Agent {
        snapshot: out,
        composer,
    }
}

struct Composer {
    cfg: Arc<Config>,
    started: Instant,
    web: WebMonitor,
    system: SystemMonitor,
    healer: Healer,
    guard: FlapGuard,
    disk: Slot<DiskReport>,
    probe: Option<Slot<ProbeResult>>,
    containers: Option<Slot<ContainersReport>>,
    last_system: Option<(Instant, Option<crate::checks::system::SystemReport>)>,
    alerts: Option<Alerts>,
}

impl Composer {
    fn fresh<T: Clone>(&self, slot: &Slot<T>, now: Instant) -> Option<T> {
        let v = slot.borrow();
        let t = v.as_ref()?;
        (now.saturating_duration_since(t.at) <= self.cfg.checks.stale_after)
            .then(|| t.value.clone())
    }

    fn compose(&mut self, now: Instant) -> Snapshot {
        if let Some(p) = &mut self.probe {
            if p.has_changed().unwrap_or(false) {
                if let Some(t) = p.borrow_and_update().clone() {
                    self.web.record_probe(t.value, t.at);
                }
            }
        }
        let system_due = self
            .last_system
            .as_ref()
            .is_none_or(|(t, _)| now.saturating_duration_since(*t) >= self.cfg.checks.interval);
        if system_due {
            self.last_system = Some((now, self.system.sample(now)));
        }
        let disk = self.fresh(&self.disk, now).unwrap_or_else(|| {
            // Not run yet, or hung past stale_after (a dead NFS mount, say).
            let mut d = Report::disk_unknown();
            if now.saturating_duration_since(self.started) > self.cfg.checks.stale_after {
                d.mounts = self
                    .cfg
                    .disk
                    .paths
                    .iter()
                    .map(|p| disk::MountUsage {
                        path: p.clone(),
                        used_percent: 0.0,
                        total_bytes: 0,
                        available_bytes: 0,
                        level: DiskLevel::Unknown,
                        error: Some("disk check did not finish".into()),
                    })
                    .collect();
            }
            d
        });
        let containers = match &self.containers {
            None => ContainersReport::not_configured(),
            Some(slot) => self.fresh(slot, now).unwrap_or_else(|| ContainersReport {
                state: crate::policy::ContainersState::Unknown,
                summary: "unknown".into(),
                reason: Some("container check has not answered yet".into()),
                faulty: Vec::new(),
                containers: Vec::new(),
            }),
        };
        let report = Report {
            web: self.web.evaluate(now),
            disk,
            system: self.last_system.as_ref().and_then(|(_, s)| s.clone()),
            containers,
            database: DatabaseReport::not_configured(),
        };
        let in_grace = now.saturating_duration_since(self.started) < self.cfg.checks.boot_grace;
        let mut input = report.policy_input(in_grace);
        let raw = evaluate(&input);
        input.heal = self.healer.step(&raw, &report.containers.faulty, now);
        let decision = self.guard.apply(evaluate(&input), now);
        Snapshot::new(
            decision,
            report,
            self.healer.log(),
            host_uptime(),
            now.saturating_duration_since(self.started).as_secs(),
        )
    }
}

fn host_uptime() -> u64 {
    sysinfo::System::uptime().unwrap_or(0)
}
