//! The background checks: each slow or fallible check runs in its own task on its own cadence
//! with its own timeout and publishes its latest result in a slot the composer reads. A check
//! that hangs shows up as a stale result; it never blocks the others or the HTTP server.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use super::checks::{check_disk, containers_wanted, probe_wanted, Checks, Database};
use crate::{
    checks::{
        disk::DiskReport,
        probe::{self, ProbeResult, ProbeSpec},
        ContainersReport, DatabaseReport,
    },
    config::Config,
    engine::{ContainerNet, EngineError},
    fleet::{exchange::Exchange, Round},
};

/// A check result and when it was taken.
#[derive(Debug, Clone)]
pub struct Timed<T> {
    pub at: Instant,
    pub value: T,
}

pub(super) type Slot<T> = watch::Receiver<Option<Timed<T>>>;

/// Every background check's slot (None: that check is not configured).
pub(super) struct Slots {
    pub disk: Slot<DiskReport>,
    pub probe: Option<Slot<Option<ProbeResult>>>,
    /// Where the backend's container lives, asked again every round: a restart moves it.
    pub web_container: Option<Slot<Result<ContainerNet, EngineError>>>,
    pub containers: Option<Slot<ContainersReport>>,
    pub database: Option<Slot<DatabaseReport>>,
    /// The peers' views, asked off the request path on the fleet's own cadence.
    pub fleet: Option<Slot<Round>>,
    /// Wakes the fleet exchange for a round now: a new fault is asked about at once.
    pub ask_fleet: Arc<Notify>,
    /// The exchange itself, told what to ask the peers for.
    pub exchange: Option<Arc<Exchange>>,
}

/// What the composer needs besides the slots to read the database check.
pub(super) struct DatabaseWiring {
    /// What the database slot shows before its first round trip: every database `unknown`.
    pub pending: DatabaseReport,
    /// Wakes the database check for a round now, off its own cadence.
    pub recheck: Arc<Notify>,
}

impl Slots {
    /// Starts a task per configured check (the web monitor stays with the composer: the probe
    /// goes wherever the monitor sees the backend listen).
    pub fn spawn(
        cfg: &Config,
        checks: &Checks,
        shutdown: &CancellationToken,
    ) -> (Self, DatabaseWiring) {
        let interval = cfg.checks.interval;
        let timeout = cfg.checks.timeout;
        let engine_late = move || EngineError::Timeout(timeout.as_secs());

        let disk_cfg = cfg.disk.clone();
        let disk = spawn_periodic(
            interval,
            timeout,
            shutdown.clone(),
            move || check_disk(disk_cfg.clone()),
            DiskReport::unknown,
        );

        let probe = probe_wanted(cfg).then(|| spawn_probe(cfg, checks, shutdown));

        let web_container = checks
            .engine
            .clone()
            .filter(|_| !cfg.web.container.is_empty())
            .map(|d| {
                let name = cfg.web.container.clone();
                spawn_periodic(
                    interval,
                    timeout,
                    shutdown.clone(),
                    move || {
                        let (d, name) = (d.clone(), name.clone());
                        async move { d.network_of(&name).await }
                    },
                    move || Err(engine_late()),
                )
            });

        let containers = checks
            .engine
            .clone()
            .filter(|_| containers_wanted(cfg))
            .map(|d| {
                let ccfg = cfg.containers.clone();
                spawn_periodic(
                    interval,
                    timeout,
                    shutdown.clone(),
                    move || {
                        let (d, c) = (d.clone(), ccfg.clone());
                        async move { crate::checks::containers::check(&d, &c).await }
                    },
                    move || ContainersReport::unknown(engine_late().to_string()),
                )
            });

        // The database has its own, slower cadence; each round trip bounds its connect and
        // its query by `database.timeout`, so the slot's deadline is a backstop whose overrun
        // still counts as a failed round trip in the monitor's damping.
        let recheck = Arc::new(Notify::new());
        let (database, pending) = match &checks.database {
            Database::On(monitor) => {
                let pending = monitor.report();
                let on_timeout = monitor.on_timeout();
                let monitor = monitor.clone();
                let slot = spawn_periodic_or_woken(
                    cfg.database.interval,
                    cfg.database
                        .timeout
                        .saturating_mul(2)
                        .saturating_add(Duration::from_secs(2)),
                    shutdown.clone(),
                    move || {
                        let mut m = monitor.clone();
                        async move { m.check().await }
                    },
                    on_timeout,
                    Some(recheck.clone()),
                );
                (Some(slot), pending)
            }
            Database::NotConfigured | Database::Broken(_) => {
                (None, DatabaseReport::not_configured())
            }
        };

        let ask_fleet = Arc::new(Notify::new());
        let fleet = checks.fleet.clone().map(|exchange| {
            spawn_periodic_or_woken(
                cfg.fleet.interval,
                cfg.fleet
                    .timeout
                    .saturating_mul(3)
                    .saturating_add(Duration::from_secs(1)),
                shutdown.clone(),
                move || {
                    let e = exchange.clone();
                    async move { e.round().await }
                },
                Round::default,
                Some(ask_fleet.clone()),
            )
        });

        let slots = Self {
            disk,
            probe,
            web_container,
            containers,
            database,
            fleet,
            ask_fleet,
            exchange: checks.fleet.clone(),
        };
        (slots, DatabaseWiring { pending, recheck })
    }

    /// Whether a check reported since the composer last took the results (no side effects).
    pub fn changed(&self) -> bool {
        fn changed<T>(slot: Option<&Slot<T>>) -> bool {
            slot.is_some_and(|s| s.has_changed().unwrap_or(false))
        }
        changed(Some(&self.disk))
            || changed(self.probe.as_ref())
            || changed(self.web_container.as_ref())
            || changed(self.containers.as_ref())
            || changed(self.database.as_ref())
            || changed(self.fleet.as_ref())
    }
}

/// The probe's slot: every `checks.interval`, wherever the monitor last saw the backend listen.
fn spawn_probe(
    cfg: &Config,
    checks: &Checks,
    shutdown: &CancellationToken,
) -> Slot<Option<ProbeResult>> {
    let interval = cfg.checks.interval;
    let (target, spec) = (
        checks.web.0.probe_target(),
        Arc::new(ProbeSpec::of(&cfg.web)),
    );
    let ledger = checks.probes.clone();
    let t = spec.timeout;
    spawn_periodic(
        interval,
        // The probe's timeout, and a second for telling a TLS-only port from a silent one.
        t.saturating_add(Duration::from_secs(2)),
        shutdown.clone(),
        move || {
            let (target, spec, ledger) = (target.clone(), spec.clone(), ledger.clone());
            async move {
                // At start the monitor has not looked yet: give it a moment.
                for _ in 0..20 {
                    if let Some(r) = probe::probe_shared(&target, &spec, &ledger).await {
                        return Some(r);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None
            }
        },
        move || {
            Some(ProbeResult {
                ok: false,
                status: None,
                latency_ms: t.as_secs_f64() * 1000.0,
                error: Some("probe task overran its timeout".into()),
                timed_out: true,
                refused: false,
                ..ProbeResult::default()
            })
        },
    )
}

/// Runs `check` every `every` until shutdown, each run bounded by `timeout`; a run that does not
/// finish publishes `on_timeout()` instead.
fn spawn_periodic<T, F, Fut>(
    every: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
    check: F,
    on_timeout: impl Fn() -> T + Send + 'static,
) -> Slot<T>
where
    T: Send + Sync + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    spawn_periodic_or_woken(every, timeout, shutdown, check, on_timeout, None)
}

/// `spawn_periodic`, plus a round right away whenever `wake` is notified (a notification
/// during a round starts the next one as soon as it ends).
fn spawn_periodic_or_woken<T, F, Fut>(
    every: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
    mut check: F,
    on_timeout: impl Fn() -> T + Send + 'static,
    wake: Option<Arc<Notify>>,
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
                _ = woken(wake.as_deref()) => tick.reset(),
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

async fn woken(wake: Option<&Notify>) {
    match wake {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Waits for `slot`'s first result, if there is a slot.
pub(super) async fn first_result<T>(slot: Option<&Slot<T>>) {
    if let Some(s) = slot {
        let _ = s.clone().wait_for(Option::is_some).await;
    }
}
