//! The background half of the agent. `checks` wires every check once (shared with
//! `health-agent check`); `periodic` runs each slow or fallible check in its own task on its
//! own cadence and keeps its latest result in a slot; `composer` merges the latest results
//! every `web.eval_interval`, applies the policy, self-healing and the flap guard, and
//! publishes one immutable snapshot — to the cell `/health` reads and to the alerts, which
//! subscribe; `supervise` watches the loop from outside. A check that hangs shows up as a
//! stale result; it never blocks the others or the HTTP server.

mod answer_log;
pub mod checks;
mod composer;
mod periodic;
mod supervise;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Instant};

use arc_swap::ArcSwap;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub use self::periodic::Timed;
use self::{
    checks::{Checks, Database, Mode},
    composer::Composer,
    periodic::Slots,
    supervise::supervise,
};
use crate::{
    alerts::{self, Alerts},
    cloudwatch,
    config::Config,
    heal::Healer,
    snapshot::{SharedSnapshot, Snapshot},
};

/// Snapshots the alerts may fall behind by before they skip some (they only track incidents
/// and queue messages, so they keep up unless the runtime is starved).
const ALERT_BACKLOG: usize = 64;

/// The running background half.
pub struct Agent {
    pub snapshot: SharedSnapshot,
    /// Ends after shutdown, once the kernel programs are detached and queued alerts sent.
    pub composer: tokio::task::JoinHandle<()>,
    /// Stops the check loop itself (what a bug would do): for tests of the supervisor.
    pub check_loop: tokio::task::AbortHandle,
    /// What the peer view shows beyond the snapshot (the live evidence), and what a peer's
    /// `?fresh=dependency` wakes.
    pub witness: crate::fleet::Witness,
    /// `health-agent drain`'s state, for the control socket and the lifecycle hook.
    pub drain: crate::drain::Drain,
    /// The fleet key as read at start: the peer view's access (`[fleet]` configured).
    pub fleet_key: Option<crate::fleet::key::FleetKey>,
}

/// Where every snapshot goes: the cell `/health` reads, and the alerts' subscription.
#[derive(Clone)]
struct Publisher {
    shared: SharedSnapshot,
    alerts: Option<broadcast::Sender<Arc<Snapshot>>>,
    /// The CloudWatch publisher, whose state each snapshot carries.
    cloudwatch: Option<cloudwatch::Handle>,
    /// The alert queues, whose length each snapshot carries (for `/metrics`).
    alerts_queued: Option<alerts::Queued>,
}

impl Publisher {
    fn publish(&self, snap: Snapshot) {
        let snap = match &self.cloudwatch {
            Some(cw) => snap.with_cloudwatch(Some(cw.status())),
            None => snap,
        };
        let snap = snap.with_alerts_queued(self.alerts_queued.as_ref().map(alerts::Queued::total));
        let snap = Arc::new(snap);
        self.shared.store(snap.clone());
        if let Some(tx) = &self.alerts {
            let _ = tx.send(snap);
        }
    }

    /// To the alerts only (the supervisor's view of a stopped loop).
    fn alert(&self, snap: Snapshot) {
        if let Some(tx) = &self.alerts {
            let _ = tx.send(Arc::new(snap));
        }
    }

    fn latest(&self) -> Arc<Snapshot> {
        self.shared.load_full()
    }
}

/// Starts every check and the composer. The first snapshot exists before this returns.
pub async fn start(cfg: Arc<Config>, shutdown: CancellationToken) -> Agent {
    let started = Instant::now();
    // Loads the kernel programs; the probe goes wherever the web monitor sees the backend.
    let checks = Checks::build(&cfg, Mode::Serve);
    if let Some(e) = &checks.engine_error {
        tracing::error!("{e}; container checks and container restarts are off");
    }
    if let Some(e) = &checks.fleet_error {
        tracing::error!("{e}; judging alone");
    }
    let fleet_key = checks.fleet_key.clone();
    match &fleet_key {
        Some(k @ crate::fleet::key::FleetKey::Missing(_)) => tracing::warn!("{}", k.describe()),
        Some(k) => tracing::info!("{}", k.describe()),
        None => {}
    }
    if let Database::Broken(e) = &checks.database {
        // Config validation refuses such URLs; this only guards a hand-built Config.
        tracing::error!("{e}; the database check is off");
    }
    let slots = Slots::spawn(&cfg, &checks, &shutdown);
    let witness =
        crate::fleet::Witness::new(slots.0.database.is_some().then(|| slots.1.recheck.clone()));
    let Checks {
        web,
        system,
        engine,
        ..
    } = checks;
    let healer = Healer::new(cfg.heal.clone(), cfg.web.clone(), engine);
    // A drain kept on disk holds from the first snapshot on.
    let drain = crate::drain::Drain::new(
        Some(cfg.drain.state_file.clone()),
        cfg.web.port != 0,
        cfg.checks.boot_grace,
    );
    let mut composer = Composer::new(cfg.clone(), started, web, system, healer, slots)
        .with_witness(witness.clone())
        .with_drain(drain.clone());

    // The alerts follow the snapshots on their own task.
    let (alerts_tx, alerts_task, alerts_queued) =
        match Alerts::start(&cfg.alerts, alerts::hostname(), shutdown.clone()) {
            Some(a) => {
                // The fleet's incidents go out once, from one agent: the peers agree which.
                let a = if cfg.fleet.enabled() {
                    let id = crate::fleet::instance_id();
                    a.with_fleet(alerts::fleet::Fleet::new(&cfg.fleet, id, witness.clone()))
                } else {
                    a
                };
                let (tx, rx) = broadcast::channel(ALERT_BACKLOG);
                let queued = a.queued();
                (Some(tx), Some(tokio::spawn(a.follow(rx))), Some(queued))
            }
            None => (None, None, None),
        };

    // The first snapshot should not say "unknown" only because a check has not had its first
    // turn yet: every check gets up to `checks.timeout`, all of them together.
    let _ = tokio::time::timeout(cfg.checks.timeout, composer.first_results()).await;
    let first = Arc::new(composer.compose(Instant::now()));
    if let Some(tx) = &alerts_tx {
        let _ = tx.send(first.clone());
    }
    release_startup_memory();
    let shared: SharedSnapshot = Arc::new(ArcSwap::new(first));
    // The saturation goes to CloudWatch from the published snapshots, on tasks of its own.
    let latest = shared.clone();
    let cloudwatch = cloudwatch::start(
        &cfg.scaling.cloudwatch,
        Arc::new(move || latest.load().saturation()),
        cloudwatch::Tuning::for_interval(cfg.scaling.cloudwatch.interval),
        shutdown.clone(),
    );
    let publisher = Publisher {
        shared,
        alerts: alerts_tx,
        cloudwatch,
        alerts_queued,
    };
    let out = publisher.shared.clone();
    let loop_publisher = publisher.clone();
    let loop_shutdown = shutdown.clone();
    let loop_drain = drain.clone();
    let drain_started = drain.woken();
    let composer = tokio::spawn(async move {
        let publisher = loop_publisher;
        // Pinged once per completed round below: a loop stuck in a round stops the pings.
        let mut watchdog = crate::sd_notify::Watchdog::from_env();
        let mut tick = tokio::time::interval(composer.tick());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let look = composer.web.next_look(Instant::now());
            let port_read = loop_drain.next_read();
            let between = tokio::select! {
                _ = loop_shutdown.cancelled() => break,
                _ = tick.tick() => false,
                _ = sleep_until(look) => false,
                _ = sleep_until(port_read) => true,
                _ = drain_started.notified() => true,
            };
            let now = Instant::now();
            if between {
                // A drain reads the port more often than a tick may come: the port's watching reads
                // it for the drain, and the round keeps its tick.
                if loop_drain.next_read().is_some_and(|t| t <= now) {
                    loop_drain.note_port(composer.port.read_port(), now);
                }
                continue;
            }
            if let Some(w) = watchdog.as_mut() {
                w.kick(now);
            }
            composer.observe(now);
            if composer.due(now) {
                let snap = composer.compose(now);
                let judged = snap.drain.as_ref().map(|d| d.judged);
                publisher.publish(snap);
                // A waiting `drain` prints its result once /health serves it.
                if let Some(judged) = judged {
                    loop_drain.published(judged);
                }
            }
        }
        // Dropping the composer detaches the kernel programs.
        drop(composer);
    });
    let check_loop = composer.abort_handle();
    let supervisor = tokio::spawn(supervise(composer, publisher, alerts_task, cfg, shutdown));
    Agent {
        snapshot: out,
        composer: supervisor,
        check_loop,
        witness,
        drain,
        fleet_key,
    }
}

/// Loading the kernel programs parsed the running kernel's BTF twice (aya's loader and
/// `ebpf::btf`), several megabytes each, all freed since. glibc keeps freed heap pages mapped;
/// hand them back so the resident set is the agent's steady state, not its start-up peak.
fn release_startup_memory() {
    crate::sys::trim_heap();
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
