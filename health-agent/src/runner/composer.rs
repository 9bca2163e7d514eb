//! The composer: every `web.eval_interval` (or when the web monitor asks for an earlier look)
//! it reads the kernel view, and when a round is due merges the checks' latest results into
//! one report, evaluates the policy once, applies self-healing and the flap guard to that
//! decision, and makes the snapshot `/health` serves.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use super::answer_log::{log_answer_change, Answer};
use super::periodic::{first_result, DatabaseWiring, Slot, Slots, Timed};
use crate::{
    checks::{
        disk,
        system::SystemMonitor,
        web::{Asks, PortWatch, WebMonitor},
        ContainersReport, DatabaseReport, Report,
    },
    config::Config,
    fleet::{classes_of, latency, Judge, Witness},
    heal::{self, Healer},
    policy::{evaluate, FlapGuard, PolicyInput, RoundFacts},
    saturation::{assess, Context, HostLoad, Meter, SaturationReport},
    snapshot::Snapshot,
    status::{DiskLevel, HealPhase},
};

pub(super) struct Composer {
    cfg: Arc<Config>,
    started: Instant,
    /// The judge of the web backend.
    pub web: WebMonitor,
    /// The watching of its port: every read of the port, for the judge and the others.
    pub port: PortWatch,
    system: SystemMonitor,
    healer: Healer,
    guard: FlapGuard,
    slots: Slots,
    /// What the database slot shows before its first round trip: every database `unknown`.
    database_pending: DatabaseReport,
    last_system: Option<(Instant, Option<crate::checks::system::SystemReport>)>,
    /// When the last full round ran.
    last_full: Instant,
    judge: Judge,
    /// Slow against its peers, judged between rounds.
    slow: latency::SlowTracker,
    /// Wakes the database check for a round now, off its own cadence.
    recheck_database: Arc<Notify>,
    last_recheck: Option<Instant>,
    /// The last answer logged: (HTTP code, status, web verdict).
    last_answer: Option<Answer>,
    /// The saturation estimator, fed every tick.
    meter: Meter,
    /// The last round's decision held a fault most peers share: this round's S is withheld
    /// (S is read before the policy decides, so the round's own decision comes too late for it).
    last_shared_dependency: bool,
    /// When this instance last had evidence against each kind of fault: the peer view's
    /// live cell, written every tick.
    witness: Witness,
    /// A fault waits for the peers' fresh word: a round every tick, each asking them again.
    asking: bool,
    /// When the fleet exchange was last woken for a round.
    last_ask: Option<Instant>,
    /// `health-agent drain`'s state.
    drain: crate::drain::Drain,
}

impl Composer {
    pub fn new(
        cfg: Arc<Config>,
        started: Instant,
        (web, port): (WebMonitor, PortWatch),
        system: SystemMonitor,
        healer: Healer,
        (slots, database): (Slots, DatabaseWiring),
    ) -> Self {
        let meter = Meter::new(
            cfg.scaling.window,
            cfg.web.workers,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        );
        Self {
            guard: FlapGuard::new(cfg.checks.fail_after, cfg.checks.recover_after),
            judge: Judge::of_config(&cfg),
            slow: latency::SlowTracker::new(
                cfg.web.slow_vs_peers,
                crate::fleet::kind::detect(&cfg.fleet.instance_type).map(|t| t.name),
            ),
            cfg,
            started,
            web,
            port,
            system,
            healer,
            slots,
            database_pending: database.pending,
            last_system: None,
            last_full: started,
            recheck_database: database.recheck,
            last_recheck: None,
            last_answer: None,
            meter,
            last_shared_dependency: false,
            witness: Witness::default(),
            asking: false,
            last_ask: None,
            drain: crate::drain::Drain::new(None, false, Duration::ZERO),
        }
    }

    /// The drain the control socket and the lifecycle hook steer.
    pub fn with_drain(self, drain: crate::drain::Drain) -> Self {
        Self { drain, ..self }
    }

    /// The cell the peer view reads this instance's evidence from.
    pub fn with_witness(self, witness: Witness) -> Self {
        Self { witness, ..self }
    }

    /// Every tick: the kernel view (one map read) and the saturation meter.
    pub fn observe(&mut self, now: Instant) {
        let draining = self.drain.draining();
        let asks = Asks {
            port_reads: draining,
            hold: draining
                .then_some("a drain counts every new connection and request")
                .or_else(|| self.slow.measuring(now)),
            answers_soon: self.witness.take_answers_wanted(),
        };
        let tick = self.port.tick(now, self.web.sight(), asks);
        if draining {
            self.drain
                .note_kernel(tick.kernel_arrivals, tick.probes_started, now);
            if let Some(read) = tick.port {
                self.drain.note_port(read, now);
            }
        }
        self.witness.update(|e| e.web_answered = tick.answered_at);
        if let Some(s) = tick.load {
            self.meter.tick(now, s);
        }
    }

    /// S from the meter, the host's CPU and memory, and whether a dependency fault holds.
    fn saturation(&mut self, report: &Report, now: Instant) -> SaturationReport {
        let withheld = withheld(report)
            .or_else(|| {
                self.last_shared_dependency
                    .then(|| SHARED_FAULT.to_string())
            })
            // Out of the balancer on purpose: its idle load is not the fleet's, and published
            // it would pull a target-tracking average down in the middle of a deploy.
            .or_else(|| {
                self.drain
                    .draining()
                    .then(|| "the instance is draining (health-agent drain)".to_string())
            });
        // The work was already blocked while the fault was being recognised, for at most the
        // longest a web verdict waits.
        self.meter
            .hold(now, withheld.is_some(), self.cfg.web.unanswered_after);
        let scaling = &self.cfg.scaling;
        let cx = Context {
            host: report.system.as_ref().map(|s| HostLoad {
                cpu_percent: s.cpu_avg_percent,
                memory_percent: s.memory_avg_percent,
            }),
            memory_low_percent: scaling.memory_low_percent,
            memory_high_percent: scaling.memory_high_percent,
            withheld,
            no_kernel: (self.cfg.web.port != 0)
                .then(|| report.web.kernel.unloaded_why())
                .flatten(),
            window: scaling.window,
        };
        assess(
            self.meter.estimate(now, None).as_ref(),
            self.meter
                .estimate(now, Some(SaturationReport::instant_window()))
                .as_ref(),
            self.meter.capacity(),
            &cx,
        )
    }

    /// The interval between ticks.
    pub fn tick(&self) -> Duration {
        self.cfg.web.eval_interval
    }

    /// Waits for every check's first result. The probe goes where the web monitor has seen
    /// the backend listen, so the monitor takes one look first (in a container's namespace
    /// once Docker has said where that is).
    pub async fn first_results(&mut self) {
        let slots = &self.slots;
        first_result(slots.web_container.as_ref()).await;
        if let Some(t) = slots
            .web_container
            .as_ref()
            .and_then(|c| c.borrow().clone())
        {
            self.web.set_container(t.value);
        }
        self.web.evaluate(&mut self.port, Instant::now());
        tokio::join!(
            first_result(Some(&slots.disk)),
            first_result(slots.probe.as_ref()),
            first_result(slots.containers.as_ref()),
            first_result(slots.database.as_ref()),
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
                r.state = crate::status::DbState::Unknown;
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
    /// Only reads: the round itself (`compose`) takes the new results.
    pub fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_full) >= self.cfg.checks.interval
            || self.web.hot()
            || self.port.hot()
            || self.healer.busy()
            || self.healer.replacing_worker()
            || self.guard.pending()
            || self.asking
            || self.drain.busy()
            || self.slots.changed()
    }

    /// Takes the results the checks reported since the last round: the probe and the web
    /// container's namespace go into the web monitor, the others are read from their slots
    /// as the round needs them.
    fn take_new_results(&mut self) {
        let slots = &mut self.slots;
        slots.disk.mark_unchanged();
        for s in slots.containers.iter_mut() {
            s.mark_unchanged();
        }
        for s in slots.database.iter_mut() {
            s.mark_unchanged();
        }
        for s in slots.fleet.iter_mut() {
            s.mark_unchanged();
        }
        if let Some(p) = &mut slots.probe {
            if p.has_changed().unwrap_or(false) {
                if let Some(Timed { at, value: Some(r) }) = p.borrow_and_update().clone() {
                    self.web.record_probe(r, at);
                }
            }
        }
        if let Some(c) = &mut slots.web_container {
            if c.has_changed().unwrap_or(false) {
                if let Some(t) = c.borrow_and_update().clone() {
                    self.web.set_container(t.value);
                }
            }
        }
    }

    /// One full round: the checks' latest results, one policy evaluation, self-healing
    /// applied to its decision, the flap guard, and the snapshot that serves.
    pub fn compose(&mut self, now: Instant) -> Snapshot {
        self.last_full = now;
        self.take_new_results();
        let system_due = self
            .last_system
            .as_ref()
            .is_none_or(|(t, _)| now.saturating_duration_since(*t) >= self.cfg.checks.interval);
        if system_due {
            self.last_system = Some((now, self.system.sample(now)));
        }
        let disk = self.fresh(&self.slots.disk, now).unwrap_or_else(|| {
            // Not run yet, or hung past stale_after (a dead NFS mount, say).
            let mut d = disk::DiskReport::unknown();
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
        let containers = match &self.slots.containers {
            None => ContainersReport::not_configured(),
            Some(slot) => self.fresh(slot, now).unwrap_or_else(|| {
                ContainersReport::unknown("container check has not answered yet".into())
            }),
        };
        let database = match &self.slots.database {
            None => DatabaseReport::not_configured(),
            Some(slot) => self.database_report(slot, now),
        };
        let report = Report {
            web: self.web.evaluate(&mut self.port, now),
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
        self.note_evidence(&report);
        let mut slow_vs_peers = None;
        let fleet = self.slots.fleet.as_ref().map(|slot| {
            let own = classes_of(
                report.web.verdict,
                report.database.state,
                report.containers.state,
            );
            let round = slot.borrow();
            let round = round.as_ref().map(|t| &t.value);
            let database_down = matches!(
                report.database.state,
                crate::status::DbState::Unreachable | crate::status::DbState::Slow
            );
            let mut f = self.judge.judge_own(&own, database_down, round, now);
            let answered = round.filter(|r| self.judge.fresh(r, now));
            let since = self.healer.last_return();
            let own = latency::OwnAnswers::of(&self.port, since, now);
            let (slow, asks) = self.slow.round_of(own, since, answered, &mut f, now);
            slow_vs_peers = slow;
            if asks.count_now {
                self.port.sample_answers_soon(now);
            }
            if let Some(t) = asks.cut_after {
                self.port.cut_span_after(t);
            }
            f
        });
        self.ask_fleet_again(fleet.as_ref(), now);
        let saturation = self.saturation(&report, now);
        let raw = evaluate(&PolicyInput::of_round(
            &report,
            RoundFacts {
                in_boot_grace: in_grace,
                web_served: served,
                warming_up,
                boot_status: self.cfg.checks.boot_status,
                fleet: fleet
                    .as_ref()
                    .map(|f| f.judgements.clone())
                    .unwrap_or_default(),
                fleet_asking: fleet.as_ref().map(|f| f.asking.clone()).unwrap_or_default(),
                slow_vs_peers,
                saturation: saturation.ratio,
                up_at: self.cfg.scaling.up_at,
                down_at: self.cfg.scaling.down_at,
            },
        ));
        // A fault the fleet shares withholds S from this round's snapshot, and from the next
        // round's reading.
        let saturation = if raw.shared_dependency {
            saturation.withheld_for(SHARED_FAULT)
        } else {
            saturation
        };
        self.last_shared_dependency = raw.shared_dependency;
        // No restarts within boot grace: an app may take its time to come up.
        // A backend stopped while drained (a deploy restarting it) is no fault to heal.
        let phase = if in_grace || !self.drain.heal_allowed(report.web.verdict, now) {
            HealPhase::Idle
        } else {
            // Fresh evidence judges a restart that returned (did it take?).
            self.healer
                .see(heal::WebSigns::of(&report.web).with_slow(self.slow.judged_since().flatten()));
            let phase = self.healer.step(&raw, &report.containers.faulty, now);
            self.healer.replace_worker(&report.web, now);
            phase
        };
        // The drain before the flap guard: what the guard holds back is then what the balancer
        // saw (`draining`), never the backend the deploy stopped behind it.
        let decision = self.drain.apply(
            heal::applied(raw, phase),
            report.web.verdict,
            report.web.signs.answered_at,
            now,
        );
        let decision = self.guard.apply(decision, now);
        let answer = (decision.http, decision.status, report.web.verdict);
        if self.last_answer != Some(answer) {
            log_answer_change(self.last_answer, answer, &decision.reasons);
            self.last_answer = Some(answer);
        }
        Snapshot::new(
            decision,
            report,
            self.healer.log(),
            crate::snapshot::host_uptime(),
            now.saturating_duration_since(self.started).as_secs(),
        )
        .with_fleet(fleet.unwrap_or_else(crate::fleet::FleetReport::not_configured))
        .with_drain(self.drain.report(now))
        .with_saturation(saturation)
    }

    /// Keeps what this round shows against each kind of fault, for the peer view: the web
    /// backend's last answer (a probe that passed is taken in by the round, not the tick), the
    /// database's and the containers' last good round.
    fn note_evidence(&mut self, report: &Report) {
        use crate::status::{ContainersState, DbState};
        let database = (report.database.state == DbState::Connected)
            .then(|| latest_at(self.slots.database.as_ref()))
            .flatten();
        let containers = (report.containers.state == ContainersState::AllRunning)
            .then(|| latest_at(self.slots.containers.as_ref()))
            .flatten();
        let configured = self.slots.database.is_some();
        let signs = report.web.signs;
        self.witness.update(|e| {
            e.web_answered = signs.answered_at;
            e.answers_fine = signs.fine_at;
            e.database_configured = configured;
            e.database_ok = database.or(e.database_ok);
            e.containers_ok = containers.or(e.containers_ok);
        });
    }

    /// While a fault waits for the peers' fresh word, asks them again every ASK_AGAIN (a new
    /// fault at once): their answer, not the fleet's cadence, decides when a 503 may come.
    fn ask_fleet_again(&mut self, fleet: Option<&crate::fleet::FleetReport>, now: Instant) {
        self.asking = fleet.is_some_and(|f| !f.asking.is_empty() || f.asking_latency);
        if let Some(e) = &self.slots.exchange {
            // Their database check runs on its own slow cadence: ask them to run it now.
            e.want_fresh_dependency(
                fleet.is_some_and(|f| f.asking.contains(&crate::status::FaultClass::Dependency)),
            );
            // Theirs are counted only in windows with `socket_tracing = "on_suspicion"`: ask
            // them to sample now.
            e.want_fresh_answers(fleet.is_some_and(|f| {
                f.asking.contains(&crate::status::FaultClass::Errors) || f.asking_latency
            }));
        }
        if self.asking
            && self
                .last_ask
                .is_none_or(|t| now.saturating_duration_since(t) >= ASK_AGAIN)
        {
            self.last_ask = Some(now);
            self.slots.ask_fleet.notify_one();
        }
    }

    /// When the web backend looks stuck, the database check runs now rather than on its
    /// slower cadence, so a database outage is named within seconds, not after
    /// `database.interval × fail_after`; while the database is unreachable or slow it is asked
    /// again every RECHECK_DOWN_EVERY, so its recovery shows as soon as it happens. A round still
    /// running takes the wake-up as soon as it ends.
    fn recheck_database_when_stuck(&mut self, report: &Report, now: Instant) {
        if self.slots.database.is_none() {
            return;
        }
        let every = if matches!(
            report.web.verdict,
            crate::status::WebVerdict::Waiting
                | crate::status::WebVerdict::Hung
                | crate::status::WebVerdict::Unresponsive
        ) {
            RECHECK_STUCK_EVERY
        } else if matches!(
            report.database.state,
            crate::status::DbState::Unreachable | crate::status::DbState::Slow
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
        let slots = &self.slots;
        let probe = slots.probe.as_ref().is_some_and(|p| p.borrow().is_none());
        let web_container = slots
            .web_container
            .as_ref()
            .is_some_and(|c| c.borrow().is_none());
        let containers = slots
            .containers
            .as_ref()
            .is_some_and(|c| c.borrow().is_none());
        let database = slots
            .database
            .as_ref()
            .is_some_and(|d| d.borrow().is_none())
            || report
                .database
                .databases
                .iter()
                .any(|d| d.last_checked.is_none());
        probe || web_container || containers || database
    }
}

/// Why S must not be published: work blocked on a dependency is not load.
fn withheld(report: &Report) -> Option<String> {
    use crate::status::{DbState, WebVerdict};
    if report.web.verdict == WebVerdict::Waiting {
        let on: Vec<&str> = report
            .web
            .dependencies
            .iter()
            .map(|d| d.endpoint.as_str())
            .collect();
        return Some(if on.is_empty() {
            "the web backend waits on a dependency".into()
        } else {
            format!("the web backend waits on a dependency ({})", on.join(", "))
        });
    }
    match report.database.state {
        DbState::Unreachable => Some("the database is unreachable".into()),
        DbState::Slow => Some("the database is slow".into()),
        _ => None,
    }
}

/// When the slot's latest result was taken.
fn latest_at<T>(slot: Option<&Slot<T>>) -> Option<Instant> {
    slot?.borrow().as_ref().map(|t| t.at)
}

/// Why S is withheld while a fault most peers share holds.
const SHARED_FAULT: &str = "a fault most peers share (a dependency)";
/// How often the peers are asked again while a fault waits for their word.
const ASK_AGAIN: Duration = Duration::from_millis(250);
const RECHECK_STUCK_EVERY: Duration = Duration::from_secs(1);
const RECHECK_DOWN_EVERY: Duration = Duration::from_secs(5);
