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
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::{
    alerts::{self, Alerts},
    checks::{
        database::DatabaseMonitor,
        disk::{self, DiskReport},
        probe::{self, ProbeResult},
        system::SystemMonitor,
        web::WebMonitor,
        ContainersReport, DatabaseReport, Report,
    },
    config::Config,
    docker::{ContainerNet, Docker},
    fleet::{classes_of, exchange::Exchange, Judge, Round},
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

/// The running background half.
pub struct Agent {
    pub snapshot: SharedSnapshot,
    /// Ends after shutdown, once the kernel programs are detached and queued alerts sent.
    pub composer: tokio::task::JoinHandle<()>,
    /// Stops the check loop itself (what a bug would do): for tests of the supervisor.
    pub check_loop: tokio::task::AbortHandle,
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

    // Loads the kernel programs; the probe goes wherever it sees the backend listen.
    let web = WebMonitor::new(cfg.web.clone());
    let probe_slot = (cfg.web.port != 0 && !cfg.web.probe_path.is_empty()).then(|| {
        let (target, path, t) = (
            web.probe_target(),
            cfg.web.probe_path.clone(),
            cfg.web.probe_timeout,
        );
        spawn_periodic(
            interval,
            t.saturating_add(Duration::from_secs(2)),
            shutdown.clone(),
            move || {
                let (target, path) = (target.clone(), path.clone());
                async move {
                    // At start the monitor has not looked yet: give it a moment.
                    for _ in 0..20 {
                        if let Some(r) = probe::probe_shared(&target, &path, t).await {
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
                    agent_error: false,
                    target: String::new(),
                })
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
    // Where the backend's container lives, asked again every round: a restart moves it.
    let web_container_slot = docker
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
                move || {
                    Err(format!(
                        "Docker did not answer within {}s",
                        timeout.as_secs()
                    ))
                },
            )
        });
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
                    async move { crate::checks::containers::check(&d, &c).await }
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

    // The database has its own, slower cadence; each round trip bounds its connect and its
    // query by `database.timeout`, so the slot's deadline is a backstop whose overrun still
    // counts as a failed round trip in the monitor's damping.
    let recheck_database = Arc::new(Notify::new());
    let (database_slot, database_pending) = match DatabaseMonitor::new(&cfg.database) {
        Ok(Some(monitor)) => {
            let pending = monitor.report();
            let on_timeout = monitor.on_timeout();
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
                Some(recheck_database.clone()),
            );
            (Some(slot), pending)
        }
        Ok(None) => (None, DatabaseReport::not_configured()),
        Err(e) => {
            // Config validation refuses such URLs; this only guards a hand-built Config.
            tracing::error!("{e}; the database check is off");
            (None, DatabaseReport::not_configured())
        }
    };

    // The peers' views, asked off the request path on the fleet's own cadence.
    let fleet_slot = cfg.fleet.enabled().then(|| {
        let token = (!cfg.fleet.token_env.is_empty())
            .then(|| std::env::var(&cfg.fleet.token_env).ok())
            .flatten()
            .filter(|t| !t.is_empty());
        match Exchange::new(&cfg.fleet, cfg.server.listen, token) {
            Ok(exchange) => {
                let exchange = Arc::new(exchange);
                Some(spawn_periodic(
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
                ))
            }
            Err(e) => {
                tracing::error!("{e}; judging alone");
                None
            }
        }
    });

    let mut composer = Composer {
        web,
        system: SystemMonitor::new(cfg.scaling.clone()),
        healer: Healer::new(cfg.heal.clone(), cfg.web.clone(), docker),
        guard: FlapGuard::new(cfg.checks.fail_after, cfg.checks.recover_after),
        cfg: cfg.clone(),
        started,
        disk: disk_slot,
        probe: probe_slot,
        web_container: web_container_slot,
        containers: containers_slot,
        database: database_slot,
        database_pending,
        last_system: None,
        last_full: started,
        recheck_database,
        last_recheck: None,
        fleet: fleet_slot.flatten(),
        judge: Judge::new(cfg.fleet.interval, cfg.fleet.timeout),
        alerts: Alerts::start(&cfg.alerts, alerts::hostname(), shutdown.clone()),
    };
    // The first snapshot should not say "unknown" only because a check has not had its first
    // turn yet: every check gets up to `checks.timeout`, all of them together.
    let _ = tokio::time::timeout(timeout, composer.first_results()).await;
    let now = Instant::now();
    let first = composer.compose(now);
    if let Some(a) = composer.alerts.as_mut() {
        a.observe(&first, now);
    }
    release_startup_memory();
    let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(first));
    let out = shared.clone();
    let supervisor_shutdown = shutdown.clone();
    let composer = tokio::spawn(async move {
        // Pinged once per completed round below: a loop stuck in a round stops the pings.
        let mut watchdog = crate::sd_notify::Watchdog::from_env();
        let mut tick = tokio::time::interval(composer.cfg.web.eval_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let look = composer.web.next_look(Instant::now());
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                _ = sleep_until(look) => {}
            }
            let now = Instant::now();
            if let Some(w) = watchdog.as_mut() {
                w.kick(now);
            }
            composer.web.observe(now);
            if !composer.due(now) {
                continue;
            }
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
    let check_loop = composer.abort_handle();
    let supervisor = tokio::spawn(supervise(composer, out.clone(), cfg, supervisor_shutdown));
    Agent {
        snapshot: out,
        composer: supervisor,
        check_loop,
    }
}

/// How often the supervisor looks at the check loop.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Watches the check loop from outside it. Once its snapshot is older than
/// `checks.stale_after` (the loop is stuck) or its task has ended before shutdown (a panic),
/// `/health` and `/livez` already answer 503 from the snapshot's age; this says why in the log
/// and raises an `unhealthy` alert of its own, since the loop's alerting stopped with the loop.
/// It resolves once a fresh snapshot shows the loop back.
async fn supervise(
    mut composer: tokio::task::JoinHandle<()>,
    shared: SharedSnapshot,
    cfg: Arc<Config>,
    shutdown: CancellationToken,
) {
    let mut ended: Option<String> = None;
    let mut alerts: Option<Option<Alerts>> = None;
    let mut down_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(SUPERVISE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = &mut composer, if ended.is_none() => {
                if shutdown.is_cancelled() {
                    return;
                }
                let why = match r {
                    Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
                    Err(_) => "was stopped".to_string(),
                    Ok(()) => "returned".to_string(),
                };
                tracing::error!("the check loop {why}: /health and /livez answer 503 from now on");
                ended = Some(why);
            }
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let snap = shared.load_full();
        let age = now.saturating_duration_since(snap.created);
        let stopped = match &ended {
            Some(why) => Some(format!("the agent's check loop {why}")),
            None if age > cfg.checks.stale_after => Some(format!(
                "the agent's check loop has not finished a round for {:.0}s",
                age.as_secs_f64()
            )),
            None => None,
        };
        match (&stopped, down_since) {
            (Some(why), None) => {
                tracing::error!("{why}: the agent can no longer vouch for this instance");
                down_since = Some(now);
            }
            (None, Some(_)) => {
                tracing::info!("the check loop is running again");
                down_since = None;
            }
            _ => {}
        }
        // Alerting starts only once needed; afterwards it sees every look, so the incident
        // resolves when the loop is back.
        if stopped.is_none() && alerts.is_none() {
            continue;
        }
        let sink = alerts.get_or_insert_with(|| {
            Alerts::start(&cfg.alerts, alerts::hostname(), shutdown.clone())
        });
        if let Some(a) = sink.as_mut() {
            match &stopped {
                Some(why) => a.observe(&snap.as_stopped(why), now),
                None => a.observe(&snap, now),
            }
        }
    }
    if ended.is_none() {
        let _ = composer.await;
    }
    if let Some(Some(a)) = alerts {
        a.closed().await;
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

struct Composer {
    cfg: Arc<Config>,
    started: Instant,
    web: WebMonitor,
    system: SystemMonitor,
    healer: Healer,
    guard: FlapGuard,
    disk: Slot<DiskReport>,
    probe: Option<Slot<Option<ProbeResult>>>,
    web_container: Option<Slot<Result<ContainerNet, String>>>,
    containers: Option<Slot<ContainersReport>>,
    database: Option<Slot<DatabaseReport>>,
    /// What the database slot shows before its first round trip: every database `unknown`.
    database_pending: DatabaseReport,
    last_system: Option<(Instant, Option<crate::checks::system::SystemReport>)>,
    /// When the last full round ran.
    last_full: Instant,
    fleet: Option<Slot<Round>>,
    judge: Judge,
    /// Wakes the database check for a round now, off its own cadence.
    recheck_database: Arc<Notify>,
    last_recheck: Option<Instant>,
    alerts: Option<Alerts>,
}

/// Waits for `slot`'s first result, if there is a slot.
async fn first_result<T>(slot: Option<&Slot<T>>) {
    if let Some(s) = slot {
        let _ = s.clone().wait_for(Option::is_some).await;
    }
}

impl Composer {
    /// Waits for every check's first result. The probe goes where the web monitor has seen
    /// the backend listen, so the monitor takes one look first (in a container's namespace
    /// once Docker has said where that is).
    async fn first_results(&mut self) {
        first_result(self.web_container.as_ref()).await;
        if let Some(t) = self.web_container.as_ref().and_then(|c| c.borrow().clone()) {
            self.web.set_container(t.value);
        }
        self.web.evaluate(Instant::now());
        tokio::join!(
            first_result(Some(&self.disk)),
            first_result(self.probe.as_ref()),
            first_result(self.containers.as_ref()),
            first_result(self.database.as_ref()),
        );
    }

    fn fresh<T: Clone>(&self, slot: &Slot<T>, now: Instant) -> Option<T> {
        let v = slot.borrow();
        let t = v.as_ref()?;
        (now.saturating_duration_since(t.at) <= self.cfg.checks.stale_after)
            .then(|| t.value.clone())
    }

    /// The database slot's latest (cached) report. It is refreshed every `database.interval`,
    /// far less often than `stale_after`, so it goes stale only when its task stops reporting.
    fn database_report(&self, slot: &Slot<DatabaseReport>, now: Instant) -> DatabaseReport {
        let db = &self.cfg.database;
        let stale_after = db
            .interval
            .saturating_add(db.timeout.saturating_mul(2))
            .saturating_add(self.cfg.checks.stale_after);
        let v = slot.borrow();
        match v.as_ref() {
            None => self.database_pending.clone(),
            Some(t) if now.saturating_duration_since(t.at) <= stale_after => t.value.clone(),
            Some(t) => {
                let mut r = t.value.clone();
                r.state = crate::policy::DbState::Unknown;
                r.reason = Some(format!(
                    "the database check has not reported for {}s",
                    now.saturating_duration_since(t.at).as_secs()
                ));
                r
            }
        }
    }

    /// Whether this tick needs a full round. The kernel view is read every tick (one map read);
    /// the full round — listeners, report, policy, snapshot — runs every tick only while
    /// something is in flight or wrong, else on `checks.interval` or when a check reports.
    fn due(&self, now: Instant) -> bool {
        fn changed<T>(slot: Option<&Slot<T>>) -> bool {
            slot.is_some_and(|s| s.has_changed().unwrap_or(false))
        }
        now.saturating_duration_since(self.last_full) >= self.cfg.checks.interval
            || self.web.hot()
            || self.healer.busy()
            || self.guard.pending()
            || changed(Some(&self.disk))
            || changed(self.probe.as_ref())
            || changed(self.web_container.as_ref())
            || changed(self.containers.as_ref())
            || changed(self.database.as_ref())
            || changed(self.fleet.as_ref())
    }

    fn compose(&mut self, now: Instant) -> Snapshot {
        self.last_full = now;
        self.disk.mark_unchanged();
        if let Some(s) = &mut self.containers {
            s.mark_unchanged();
        }
        if let Some(s) = &mut self.database {
            s.mark_unchanged();
        }
        if let Some(s) = &mut self.fleet {
            s.mark_unchanged();
        }
        if let Some(p) = &mut self.probe {
            if p.has_changed().unwrap_or(false) {
                if let Some(Timed { at, value: Some(r) }) = p.borrow_and_update().clone() {
                    self.web.record_probe(r, at);
                }
            }
        }
        if let Some(c) = &mut self.web_container {
            if c.has_changed().unwrap_or(false) {
                if let Some(t) = c.borrow_and_update().clone() {
                    self.web.set_container(t.value);
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
        let database = match &self.database {
            None => DatabaseReport::not_configured(),
            Some(slot) => self.database_report(slot, now),
        };
        let report = Report {
            web: self.web.evaluate(now),
            disk,
            system: self.last_system.as_ref().and_then(|(_, s)| s.clone()),
            containers,
            database,
        };
        self.recheck_database_when_stuck(&report, now);
        let served = report.web.served || self.cfg.web.port == 0;
        let warming_up = self.warming_up(&report);
        // Until the first evidence is in, every instance is still booting, grace or not.
        let in_grace = now.saturating_duration_since(self.started) < self.cfg.checks.boot_grace
            || (!served && warming_up);
        let mut input = report.policy_input(in_grace);
        input.web_served = served;
        input.warming_up = warming_up;
        input.boot_status = self.cfg.checks.boot_status;
        let fleet = self.fleet.as_ref().map(|slot| {
            let own = classes_of(
                report.web.verdict,
                report.database.state,
                report.containers.state,
            );
            let round = slot.borrow();
            self.judge
                .judge(&own, round.as_ref().map(|t| &t.value), now)
        });
        input.fleet = fleet
            .as_ref()
            .map(|f| f.judgements.clone())
            .unwrap_or_default();
        let raw = evaluate(&input);
        // No restarts within boot grace: an app may take its time to come up.
        if !in_grace {
            input.heal = self.healer.step(&raw, &report.containers.faulty, now);
        }
        let decision = self.guard.apply(evaluate(&input), now);
        Snapshot::new(
            decision,
            report,
            self.healer.log(),
            host_uptime(),
            now.saturating_duration_since(self.started).as_secs(),
        )
        .with_fleet(fleet.unwrap_or_default())
    }
}

impl Composer {
    /// When the web backend looks stuck, the database check runs now rather than on its
    /// slower cadence, so a database outage is named within seconds, not after
    /// `database.interval × fail_after`; while the database is unreachable or slow it is asked
    /// again every RECHECK_DOWN_EVERY, so its recovery shows as soon as it happens. A round still
    /// running takes the wake-up as soon as it ends.
    fn recheck_database_when_stuck(&mut self, report: &Report, now: Instant) {
        if self.database.is_none() {
            return;
        }
        let every = if matches!(
            report.web.verdict,
            crate::policy::WebVerdict::Waiting
                | crate::policy::WebVerdict::Hung
                | crate::policy::WebVerdict::Unresponsive
        ) {
            RECHECK_STUCK_EVERY
        } else if matches!(
            report.database.state,
            crate::policy::DbState::Unreachable | crate::policy::DbState::Slow
        ) {
            RECHECK_DOWN_EVERY
        } else {
            return;
        };
        if self
            .last_recheck
            .is_none_or(|t| now.saturating_duration_since(t) >= every)
        {
            self.last_recheck = Some(now);
            self.recheck_database.notify_one();
        }
    }

    /// Whether a configured check has not reported its first result yet.
    fn warming_up(&self, report: &Report) -> bool {
        // A probe round that found no listener to probe has reported too: nothing to wait for.
        let probe = self.probe.as_ref().is_some_and(|p| p.borrow().is_none());
        let web_container = self
            .web_container
            .as_ref()
            .is_some_and(|c| c.borrow().is_none());
        let containers = self
            .containers
            .as_ref()
            .is_some_and(|c| c.borrow().is_none());
        let database = self.database.as_ref().is_some_and(|d| d.borrow().is_none())
            || report
                .database
                .databases
                .iter()
                .any(|d| d.last_checked.is_none());
        probe || web_container || containers || database
    }
}

const RECHECK_STUCK_EVERY: Duration = Duration::from_secs(1);
const RECHECK_DOWN_EVERY: Duration = Duration::from_secs(5);

/// Loading the kernel programs parsed the running kernel's BTF twice (aya's loader and
/// `ebpf::btf`), several megabytes each, all freed since. glibc keeps freed heap pages mapped;
/// hand them back so the resident set is the agent's steady state, not its start-up peak.
fn release_startup_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages to the kernel; nothing in use moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Seconds since the host booted (CLOCK_BOOTTIME: no file read on every tick).
fn host_uptime() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        checks::database::test_support::{fake_redis, free_port, redis_ok},
        policy::{DbState, Recommendation, Status},
    };

    #[tokio::test]
    async fn database_check_runs_on_its_own_cadence_and_feeds_the_policy() {
        let (redis, seen) = fake_redis(redis_ok, Duration::ZERO).await;
        let down = free_port();
        let mut cfg = Config::default();
        cfg.checks.boot_grace = Duration::ZERO;
        cfg.web.eval_interval = Duration::from_millis(50);
        cfg.disk.warn_percent = 100.0;
        cfg.disk.fail_percent = 100.0;
        cfg.database.url = format!("redis://:Sekr1t@{redis}");
        cfg.database.urls = vec![format!("redis://127.0.0.1:{down}")];
        cfg.database.interval = Duration::from_millis(400);
        cfg.database.timeout = Duration::from_secs(1);
        cfg.database.slow_after = Duration::from_secs(10);
        cfg.database.fail_after = 2;
        let shutdown = CancellationToken::new();
        let agent = start(Arc::new(cfg), shutdown.clone()).await;

        let first = agent.snapshot.load_full();
        assert_eq!(
            first.report.database.databases.len(),
            2,
            "listed before the first round"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen_states = Vec::new();
        let snap = loop {
            let snap = agent.snapshot.load_full();
            let state = snap.report.database.state;
            if seen_states.last() != Some(&state) {
                seen_states.push(state);
            }
            if state == DbState::Unreachable {
                break snap;
            }
            assert!(
                Instant::now() < deadline,
                "never unreachable: {seen_states:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            seen_states,
            [DbState::Unknown, DbState::Unreachable],
            "one failed round trip is not enough with fail_after = 2"
        );
        // A shared dependency: 200 degraded, never 503.
        assert_eq!(snap.decision.http, 200);
        assert_eq!(snap.decision.status, Status::Degraded);
        assert_eq!(
            snap.decision.recommendation,
            Recommendation::InfrastructureIssue
        );
        let dbs = &snap.report.database.databases;
        assert_eq!(dbs[0].state, DbState::Connected, "{dbs:?}");
        assert_eq!(dbs[1].name, format!("redis://127.0.0.1:{down}"));
        let full =
            String::from_utf8_lossy(snap.body(crate::snapshot::Rendering::Full)).into_owned();
        assert!(full.contains(&format!("redis://{redis}")), "{full}");
        assert!(!full.contains("Sekr1t"), "{full}");

        // Its own cadence: about one round every 400 ms while the composer runs every 50 ms.
        let before = seen.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let pings = seen.lock().unwrap().len() - before;
        // Each round is AUTH + PING on the good database.
        assert!((2..=8).contains(&pings), "{pings} commands in 1s");

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), agent.composer)
            .await
            .expect("composer stops on shutdown")
            .expect("composer task");
    }

    /// A local webhook receiver: every JSON body POSTed to it.
    async fn webhook() -> (String, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let store = seen.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
                let store = store.clone();
                async move {
                    store.lock().unwrap().push(v);
                    "ok"
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (url, seen)
    }

    async fn get(app: Arc<crate::server::App>, path: &str) -> (u16, String) {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        let req = axum::http::Request::builder()
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = crate::server::router(app).oneshot(req).await.unwrap();
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_check_loop_fails_livez_and_raises_an_alert() {
        let (url, hooks) = webhook().await;
        let mut cfg = Config::default();
        cfg.checks.boot_grace = Duration::ZERO;
        cfg.checks.interval = Duration::from_millis(200);
        cfg.checks.stale_after = Duration::from_secs(1);
        cfg.disk.warn_percent = 100.0;
        cfg.disk.fail_percent = 100.0;
        cfg.alerts.webhook_url = url;
        let cfg = Arc::new(cfg);
        let shutdown = CancellationToken::new();
        let agent = start(cfg.clone(), shutdown.clone()).await;
        let app = Arc::new(crate::server::App {
            snapshot: agent.snapshot.clone(),
            details: crate::config::Details::Always,
            token: None,
            stale_after: cfg.checks.stale_after,
            fleet_token: crate::server::FleetToken::Open,
            host: "web-1".into(),
        });
        assert_eq!(get(app.clone(), "/livez").await, (200, "ok\n".into()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(hooks.lock().unwrap().is_empty(), "nothing to alert yet");

        agent.check_loop.abort();
        let deadline = Instant::now() + Duration::from_secs(6);
        let alert = loop {
            if let Some(a) = hooks.lock().unwrap().first().cloned() {
                break a;
            }
            assert!(Instant::now() < deadline, "no alert after the loop died");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(alert["event"], "incident.triggered", "{alert}");
        assert_eq!(
            alert["payload"]["incident"]["condition"], "unhealthy",
            "{alert}"
        );
        assert!(
            alert["payload"]["reasons"][0]
                .as_str()
                .is_some_and(|r| r.contains("check loop was stopped")),
            "{alert}"
        );
        // Both fail once the last snapshot is older than stale_after.
        let (code, body) = loop {
            let (code, body) = get(app.clone(), "/livez").await;
            if code != 200 || Instant::now() > deadline {
                break (code, body);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("check loop"), "{body}");
        assert_eq!(get(app, "/health").await.0, 503);

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), agent.composer)
            .await
            .expect("the supervisor stops on shutdown")
            .expect("supervisor task");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_snapshot_carries_every_checks_first_result() {
        // A database that answers after 300 ms, a web backend whose probe path answers.
        let (redis, _) = fake_redis(redis_ok, Duration::from_millis(300)).await;
        let web = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = web.local_addr().unwrap().port();
        let app = axum::Router::new().route("/up", axum::routing::get(|| async { "up" }));
        tokio::spawn(async move { axum::serve(web, app).await });

        let mut cfg = Config::default();
        cfg.disk.warn_percent = 100.0;
        cfg.disk.fail_percent = 100.0;
        cfg.database.url = format!("redis://{redis}");
        cfg.web.port = port;
        cfg.web.kernel = false;
        let shutdown = CancellationToken::new();
        let agent = start(Arc::new(cfg), shutdown.clone()).await;
        let first = agent.snapshot.load_full();
        assert_eq!(first.report.database.state, DbState::Connected);
        let probe = first.report.web.probe.as_ref().expect("a probe result");
        assert_eq!(probe.status, Some(200), "{probe:?}");
        assert_eq!(first.report.web.verdict, crate::policy::WebVerdict::Up);
        assert_eq!(first.decision.http, 200, "{:?}", first.decision);
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), agent.composer).await;
    }
}
