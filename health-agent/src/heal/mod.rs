//! Self-healing: detect → restart → re-check, before any 503. One state machine per incident:
//! a healable fault starts a restart (container via its engine's API, or
//! `web.restart_command`); `/health` says `recovering` while that restart is really under way —
//! its action runs, or, once it returned, the listener is gone, new processes are coming up or
//! the old ones run again (`judge`) — never past `heal.timeout`. A restart that returned and
//! left the same strong evidence of a hang behind has failed at once; the next attempt starts
//! (`recovering` again) while the `heal.max_restarts` per `heal.window` budget allows, and once
//! it is spent the answer is 503. One incident is `recovering` for at most `heal.timeout` all
//! told; attempts after that run under a 503. Never two restarts at once; never during boot grace or for a
//! shared-dependency fault (the policy gives no healable fault then). Every attempt is kept in
//! a bounded log, with why it was judged failed or recovered.
//!
//! The composer evaluates the policy once per round; `Healer::step` takes that decision and
//! returns the phase, and `applied` turns decision and phase into the answer — a pure step.
//! `command` runs `web.restart_command`; `judge` decides whether a returned restart took;
//! `worker` replaces one stuck worker of a pre-fork server (`partial_hang`), within the same
//! budget and log.

mod command;
mod judge;
mod worker;

use std::{
    collections::VecDeque,
    future::Future as _,
    time::{Duration, Instant, SystemTime},
};

use serde::Serialize;
use tokio::task::JoinHandle;

pub use self::{
    command::{run_command, CommandError},
    judge::WebSigns,
    worker::WorkerError,
};
use crate::{
    config::{HealConfig, WebConfig},
    engine::Engine,
    policy::{Decision, Fault},
    status::WebVerdict,
    status::{HealPhase, Status},
    text::rfc3339,
};

const LOG_LEN: usize = 20;

/// Why a restart attempt failed. The messages are what the heal log and `/health` show.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    #[error("no container engine is configured")]
    NoEngine,
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("restart task ended abnormally")]
    TaskEnded,
    #[error("restart did not finish within {}s", .0.as_secs())]
    Overran(Duration),
    #[error("still faulty ({reasons}) {}s after the restart", .timeout.as_secs())]
    StillFaulty { reasons: String, timeout: Duration },
    /// The action returned and the fresh evidence says it changed nothing (`judge`).
    #[error("{0}")]
    DidNotTake(String),
}

impl HealError {
    /// Whether the action itself failed (as opposed to being judged by its effect).
    fn of_the_action(&self) -> bool {
        !matches!(self, Self::StillFaulty { .. } | Self::DidNotTake(_))
    }
}

/// How an attempt went; serialized as `running`, `waiting`, `recovered`, `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealOutcome {
    /// The restart action is running.
    Running,
    /// The action returned; the fresh evidence is being judged (a restart under way).
    Waiting,
    Recovered,
    Failed,
}

/// The round's decision with self-healing applied: the one place the heal phase changes an
/// answer (`policy::evaluate` knows nothing of it; the healer does not act within boot grace).
/// A fault self-healing covers answers 200 `recovering` while a restart is under way; any other
/// fault stays 503 and says where healing stands. Without a fault the phase changes nothing.
pub fn applied(mut decision: Decision, phase: HealPhase) -> Decision {
    if decision.faults.is_empty() {
        return decision;
    }
    if decision.erroring_alone && phase != HealPhase::Recovering {
        // Erroring with no peers to compare, and the one restart did not help or none can be
        // made: 200 degraded, the alert says why.
        decision.faults.clear();
        decision.status = Status::Degraded;
        decision.http = 200;
        decision.recommendation = crate::status::Recommendation::Stable;
        decision.reasons.push(match phase {
            HealPhase::Exhausted => "a restart did not help: not taking the instance out".into(),
            _ => "no restart to try (web.container or web.restart_command, heal.enabled): not \
                  taking the instance out"
                .into(),
        });
        return decision;
    }
    match phase {
        HealPhase::Idle => {}
        HealPhase::Recovering => {
            decision.reasons.push("self-heal in progress".into());
            if decision.faults.iter().all(|f| f.healable()) {
                decision.status = Status::Recovering;
                decision.http = 200;
            }
        }
        HealPhase::Exhausted => decision
            .reasons
            .push("self-heal failed or its budget is spent".into()),
    }
    decision
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A container by name, through an engine client ("docker", "containerd").
    RestartContainer(String, &'static str),
    Command(String),
    /// One stuck worker of a pre-fork server, which its master replaces (`worker.rs`).
    ReplaceWorker(worker::Target),
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Self::RestartContainer(name, via) => format!("{via} restart {name}"),
            Self::Command(c) => format!("restart_command `{c}`"),
            Self::ReplaceWorker(t) => format!(
                "replace worker {} of master {} (SIGTERM, SIGKILL after a grace)",
                t.pid, t.master
            ),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HealAttempt {
    pub started_at: String,
    pub reason: String,
    pub action: String,
    pub outcome: HealOutcome,
    /// Why it was judged failed or recovered; while `waiting`, why the restart counts as
    /// under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The action's own failure (the command's exit, the engine's error, the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    pub duration_ms: u64,
}

/// What `/health` shows of self-healing.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct HealLog {
    pub enabled: bool,
    pub phase: Option<HealPhase>,
    pub restarts_in_window: u32,
    pub max_restarts: u32,
    pub budget_spent: bool,
    pub attempts: VecDeque<HealAttempt>,
    pub total_attempts: u64,
    pub total_recovered: u64,
    pub total_failed: u64,
}

/// One attempt in flight: when it began and what the web check showed then.
struct Attempt {
    started: Instant,
    /// The attempt restarts the web backend (its evidence judges it), not another container.
    web: bool,
    before: WebSigns,
}

enum State {
    Idle,
    /// The restart action is running.
    Running {
        attempt: Attempt,
        task: JoinHandle<Result<String, HealError>>,
    },
    /// The action returned at `returned`; judging whether it took, until `heal.timeout`.
    Judging {
        attempt: Attempt,
        returned: Instant,
        /// The progress counter at the first look after the return.
        at_return: Option<u64>,
        /// The real answers by class at the first look after the return.
        answered_at_return: Option<[u64; 6]>,
    },
    /// This incident's attempt failed and no other could start (budget spent, no action).
    Failed,
}

pub struct Healer {
    cfg: HealConfig,
    web: WebConfig,
    engine: Option<Engine>,
    state: State,
    restarts: VecDeque<Instant>,
    /// The current incident already had a failed attempt.
    incident_failed: bool,
    /// When the current incident's first attempt started: `recovering` lasts at most
    /// `heal.timeout` from then, whatever the number of attempts.
    incident_started: Option<Instant>,
    /// This round's evidence from the web check (`see`).
    signs: WebSigns,
    log: HealLog,
    worker: worker::WorkerHeal,
    /// When the latest restart action returned: the peers' comparison judges answers after it.
    last_return: Option<Instant>,
}

impl Healer {
    pub fn new(cfg: HealConfig, web: WebConfig, engine: Option<Engine>) -> Self {
        let log = HealLog {
            enabled: cfg.enabled,
            max_restarts: cfg.max_restarts,
            ..HealLog::default()
        };
        Self {
            cfg,
            web,
            engine,
            state: State::Idle,
            restarts: VecDeque::new(),
            incident_failed: false,
            incident_started: None,
            signs: WebSigns::default(),
            log,
            worker: worker::WorkerHeal::default(),
            last_return: None,
        }
    }

    /// When the latest restart action returned (see `last_return`).
    pub fn last_return(&self) -> Option<Instant> {
        self.last_return
    }

    /// A restart is running or being judged, or the current incident already failed.
    pub fn busy(&self) -> bool {
        !matches!(self.state, State::Idle) || self.incident_failed
    }

    pub fn log(&self) -> HealLog {
        self.log.clone()
    }

    /// This round's web evidence, before `step`: what judges a restart that returned.
    pub fn see(&mut self, signs: WebSigns) {
        self.signs = signs;
    }

    /// What a restart would do for `fault`, if anything can.
    fn action_for(&self, fault: Fault, faulty_containers: &[String]) -> Option<Action> {
        let restart = |name: &String| {
            let via = self.engine.as_ref()?.kind();
            Some(Action::RestartContainer(name.clone(), via))
        };
        match fault {
            f if f.restarts_web() && !self.web.container.is_empty() && self.engine.is_some() => {
                restart(&self.web.container)
            }
            f if f.restarts_web() && !self.web.restart_command.is_empty() => {
                Some(Action::Command(self.web.restart_command.clone()))
            }
            Fault::Containers => faulty_containers.first().and_then(restart),
            _ => None,
        }
    }

    /// Advances the state machine with this round's raw decision (made with `HealPhase::Idle`)
    /// and returns the phase the policy should see.
    pub fn step(
        &mut self,
        decision: &Decision,
        faulty_containers: &[String],
        now: Instant,
    ) -> HealPhase {
        while self
            .restarts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > self.cfg.window)
        {
            self.restarts.pop_front();
        }
        self.log.restarts_in_window = self.restarts.len() as u32;
        self.log.budget_spent = self.restarts.len() as u32 >= self.cfg.max_restarts;
        let mut phase = self.advance(decision, faulty_containers, now);
        // Attempts after a failed one may go on, but one incident answers `recovering` for at
        // most `heal.timeout`: a backend that nothing brings back (a restart that returns at
        // once while nothing listens looks the same as one coming up) must not stay in
        // rotation for `max_restarts` × `timeout`.
        if phase == HealPhase::Recovering
            && self.incident_failed
            && self
                .incident_started
                .is_some_and(|t| now.saturating_duration_since(t) > self.cfg.timeout)
        {
            phase = HealPhase::Exhausted;
        }
        self.log.phase = Some(phase);
        phase
    }

    fn advance(
        &mut self,
        decision: &Decision,
        faulty_containers: &[String],
        now: Instant,
    ) -> HealPhase {
        // Finish a running action first, whatever the fault does meanwhile.
        if let State::Running { attempt, task } = &mut self.state {
            let ran_for = now.saturating_duration_since(attempt.started);
            if !task.is_finished() && ran_for <= self.cfg.timeout {
                return HealPhase::Recovering;
            }
            let State::Running { attempt, mut task } =
                std::mem::replace(&mut self.state, State::Idle)
            else {
                unreachable!("matched above")
            };
            let result = if task.is_finished() {
                futures_now(&mut task).unwrap_or(Err(HealError::TaskEnded))
            } else {
                task.abort();
                Err(HealError::Overran(self.cfg.timeout))
            };
            match result {
                Ok(output) => {
                    self.update_last(|a| {
                        a.outcome = HealOutcome::Waiting;
                        a.output = (!output.is_empty()).then_some(output);
                    });
                    self.last_return = Some(now);
                    self.state = State::Judging {
                        at_return: self.signs.progress,
                        answered_at_return: self.signs.answered,
                        attempt,
                        returned: now,
                    };
                }
                Err(e) => self.fail(e, attempt.started, now),
            }
        }

        let Some(fault) = decision.healable_fault() else {
            return self.fault_cleared(now);
        };

        let State::Judging {
            attempt,
            returned,
            at_return,
            answered_at_return,
        } = &self.state
        else {
            // Idle or failed (a running action was finished above): the next attempt, if any.
            return self.try_start(fault, decision, faulty_containers, now);
        };
        let started = attempt.started;
        if now.saturating_duration_since(started) > self.cfg.timeout {
            let e = HealError::StillFaulty {
                reasons: decision.reasons.join("; "),
                timeout: self.cfg.timeout,
            };
            self.fail(e, started, now);
            return self.try_start(fault, decision, faulty_containers, now);
        }
        let since_return = now.saturating_duration_since(*returned);
        if since_return < judge::SETTLE || !attempt.web {
            return HealPhase::Recovering;
        }
        let reason = decision.reasons.first().map_or("", String::as_str);
        // Erroring and slow against the peers are judged by the answers after the restart, and
        // only by them; a hang by the signs of the processes (`judge`).
        let judged = match fault {
            Fault::SlowVsPeers => {
                judge::slow_after_return(&self.signs, *returned, since_return, reason)
            }
            Fault::Web(WebVerdict::Erroring) => judge::errors_after_return(
                *answered_at_return,
                &self.signs,
                started,
                since_return,
                (self.web.error_min_answers, self.web.error_share),
                reason,
            ),
            Fault::Web(_) => judge::judge(
                &attempt.before,
                &self.signs,
                *at_return,
                since_return,
                self.web.hung_after,
            ),
            _ => return HealPhase::Recovering,
        };
        match judged {
            judge::Judgement::UnderWay(why) => {
                self.update_last(|a| a.why = Some(why));
                HealPhase::Recovering
            }
            judge::Judgement::Failed(why) => {
                self.fail(HealError::DidNotTake(why), started, now);
                self.try_start(fault, decision, faulty_containers, now)
            }
        }
    }

    /// No healable fault this round: an attempt being judged has recovered (once the web
    /// check can confirm it), and the incident is over.
    fn fault_cleared(&mut self, now: Instant) -> HealPhase {
        if let State::Judging { attempt, .. } = &self.state {
            let started = attempt.started;
            let why = if attempt.web {
                judge::recovered(&self.signs)
            } else {
                Some("the fault cleared".into())
            };
            let why = match why {
                Some(w) => w,
                // The web check sees nothing yet (a restarted container's new namespace not
                // found): wait for it, within the timeout.
                None if now.saturating_duration_since(started) <= self.cfg.timeout => {
                    return HealPhase::Recovering
                }
                None => format!(
                    "no fault to heal any more; the web check could not confirm a recovery \
                     (webserver {})",
                    self.signs.verdict.map_or("unknown", WebVerdict::as_str)
                ),
            };
            let after = now.saturating_duration_since(started);
            tracing::info!("self-heal worked after {:.1}s: {why}", after.as_secs_f64());
            self.finish_last(HealOutcome::Recovered, Some(why), None, started, now);
            self.log.total_recovered += 1;
        }
        self.state = State::Idle;
        self.incident_failed = false;
        self.incident_started = None;
        HealPhase::Idle
    }

    fn phase(&self) -> HealPhase {
        match self.state {
            State::Running { .. } | State::Judging { .. } => HealPhase::Recovering,
            State::Idle | State::Failed if self.incident_failed => HealPhase::Exhausted,
            State::Idle | State::Failed => HealPhase::Idle,
        }
    }

    fn try_start(
        &mut self,
        fault: Fault,
        decision: &Decision,
        faulty_containers: &[String],
        now: Instant,
    ) -> HealPhase {
        if !self.cfg.enabled {
            return HealPhase::Idle;
        }
        let Some(action) = self.action_for(fault, faulty_containers) else {
            return self.phase();
        };
        if fault.one_restart() && self.incident_failed {
            // One restart per incident: errors or slowness a restart did not fix are the code's,
            // a dependency's or the box's, and more restarts only drop the requests in flight.
            self.state = State::Failed;
            return HealPhase::Exhausted;
        }
        if self.restarts.len() as u32 >= self.cfg.max_restarts {
            // Said once, when the answer turns to 503 for it.
            if self.log.phase != Some(HealPhase::Exhausted) {
                tracing::warn!(
                    "self-heal budget spent ({} restarts in {}s): not restarting",
                    self.cfg.max_restarts,
                    self.cfg.window.as_secs()
                );
            }
            self.log.budget_spent = true;
            self.incident_failed = true;
            self.state = State::Failed;
            return HealPhase::Exhausted;
        }
        let reason = decision.reasons.join("; ");
        tracing::warn!(action = %action.describe(), %reason, "self-heal: restarting");
        self.begin_attempt(&action, reason, now);
        let engine = self.engine.clone();
        let timeout = self.cfg.timeout;
        let attempt = Attempt {
            started: now,
            web: fault.restarts_web(),
            before: self.signs.clone(),
        };
        self.incident_started.get_or_insert(now);
        let task = tokio::spawn(async move { run(action, engine, timeout).await });
        self.state = State::Running { attempt, task };
        HealPhase::Recovering
    }

    /// Counts an attempt (a restart or a worker replacement) against the budget and opens its
    /// entry in the bounded log.
    fn begin_attempt(&mut self, action: &Action, reason: String, now: Instant) {
        self.restarts.push_back(now);
        self.log.restarts_in_window = self.restarts.len() as u32;
        self.log.budget_spent = self.restarts.len() as u32 >= self.cfg.max_restarts;
        self.log.total_attempts += 1;
        self.log.attempts.push_back(HealAttempt {
            started_at: rfc3339(SystemTime::now()),
            reason,
            action: action.describe(),
            outcome: HealOutcome::Running,
            why: None,
            error: None,
            output: None,
            duration_ms: 0,
        });
        while self.log.attempts.len() > LOG_LEN {
            self.log.attempts.pop_front();
        }
    }

    /// The current attempt failed: log it; the caller starts the next one if it can.
    fn fail(&mut self, error: HealError, started: Instant, now: Instant) {
        let text = error.to_string();
        tracing::warn!("self-heal attempt failed: {text}");
        let action_error = error.of_the_action().then(|| text.clone());
        self.finish_last(HealOutcome::Failed, Some(text), action_error, started, now);
        self.log.total_failed += 1;
        self.incident_failed = true;
        self.state = State::Failed;
    }

    fn update_last(&mut self, f: impl FnOnce(&mut HealAttempt)) {
        if let Some(a) = self.log.attempts.back_mut() {
            f(a);
        }
    }

    fn finish_last(
        &mut self,
        outcome: HealOutcome,
        why: Option<String>,
        error: Option<String>,
        started: Instant,
        now: Instant,
    ) {
        self.update_last(|a| {
            a.outcome = outcome;
            a.why = why;
            a.error = error;
            a.duration_ms = u64::try_from(now.saturating_duration_since(started).as_millis())
                .unwrap_or(u64::MAX);
        });
    }
}

/// The result of a finished task without awaiting (the caller checked `is_finished`).
fn futures_now<T>(task: &mut JoinHandle<T>) -> Option<T> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(task).poll(&mut cx) {
        std::task::Poll::Ready(Ok(v)) => Some(v),
        _ => None,
    }
}

async fn run(
    action: Action,
    engine: Option<Engine>,
    timeout: Duration,
) -> Result<String, HealError> {
    match action {
        Action::RestartContainer(name, _) => {
            let engine = engine.ok_or(HealError::NoEngine)?;
            engine.restart(&name, timeout).await?;
            Ok(String::new())
        }
        Action::Command(cmd) => Ok(run_command(&cmd, timeout).await?),
        Action::ReplaceWorker(t) => Ok(worker::replace(t, timeout).await?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{evaluate, PolicyInput};
    use crate::status::WebVerdict;

    fn hung() -> Decision {
        evaluate(&PolicyInput {
            web: WebVerdict::Hung,
            ..PolicyInput::default()
        })
    }

    fn fine() -> Decision {
        evaluate(&PolicyInput::default())
    }

    fn healer(cmd: &str, max: u32) -> Healer {
        Healer::new(
            HealConfig {
                enabled: true,
                max_restarts: max,
                window: Duration::from_secs(600),
                timeout: Duration::from_secs(2),
                replace_workers: true,
            },
            WebConfig {
                port: 9000,
                restart_command: cmd.into(),
                ..WebConfig::default()
            },
            None,
        )
    }

    async fn settle(h: &mut Healer, d: &Decision) -> HealPhase {
        // Let the spawned command finish, then step again.
        for _ in 0..100 {
            if !matches!(h.state, State::Running { .. }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            h.step(d, &[], Instant::now());
        }
        h.step(d, &[], Instant::now())
    }

    /// Steps every 20 ms with `signs` until `done` says so or `limit` passes; returns the
    /// phases seen, in order, without repeats.
    async fn drive(
        h: &mut Healer,
        d: &Decision,
        signs: &WebSigns,
        limit: Duration,
        done: impl Fn(&Healer, HealPhase) -> bool,
    ) -> Vec<HealPhase> {
        let end = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            h.see(signs.clone());
            let p = h.step(d, &[], Instant::now());
            if seen.last() != Some(&p) {
                seen.push(p);
            }
            if done(h, p) || Instant::now() > end {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stopped(pids: &[u32], progress: u64) -> WebSigns {
        WebSigns {
            verdict: Some(WebVerdict::Hung),
            listening: true,
            pids: pids.to_vec(),
            frozen: Some(format!("server processes {pids:?} stopped")),
            progress: Some(progress),
            erroring_since: None,
            answered: None,
            slow_judged_after: None,
        }
    }

    /// Issue 23 item 6: a second attempt that runs is `recovering` (200), like the first; 503
    /// comes once the budget is spent, and then says so.
    #[tokio::test]
    async fn every_running_attempt_is_recovering_and_503_only_once_the_budget_is_spent() {
        let mut h = healer("sleep 0.2; exit 1", 3);
        let raw = hung();
        let phase = h.step(&raw, &[], Instant::now());
        let d = applied(raw.clone(), phase);
        assert_eq!((d.status, d.http), (Status::Recovering, 200), "{d:?}");
        assert_eq!(d.reasons.last().unwrap(), "self-heal in progress");
        let phases = drive(
            &mut h,
            &raw,
            &WebSigns::default(),
            Duration::from_secs(5),
            |_, p| p == HealPhase::Exhausted,
        )
        .await;
        assert_eq!(
            phases,
            [HealPhase::Recovering, HealPhase::Exhausted],
            "recovering through all three attempts, then exhausted"
        );
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (3, 3), "{log:?}");
        assert!(log.budget_spent);
        for a in &log.attempts {
            assert!(
                a.error.as_deref().is_some_and(|e| e.contains("exited")),
                "{a:?}"
            );
        }
        let d = applied(raw.clone(), HealPhase::Exhausted);
        assert_eq!((d.status, d.http), (Status::Unhealthy, 503), "{d:?}");
        assert_eq!(
            d.reasons.last().unwrap(),
            "self-heal failed or its budget is spent"
        );
        // Once the fault clears, healing changes nothing.
        let phase = h.step(&fine(), &[], Instant::now());
        assert_eq!(applied(fine(), phase), fine());
    }

    /// Issue 18: a restart command that exits 0 and changes nothing. The same stopped
    /// processes hold the listener and nothing moves: each attempt fails at its first fresh
    /// look, not at `heal.timeout`, and the budget (3) is spent within about a second each.
    #[tokio::test]
    async fn a_restart_that_did_not_take_fails_at_once_and_the_budget_counts_three() {
        let mut h = healer("true", 3);
        h.cfg.timeout = Duration::from_secs(30);
        let signs = stopped(&[4242], 17);
        h.see(signs.clone());
        let t0 = Instant::now();
        let phases = drive(&mut h, &hung(), &signs, Duration::from_secs(10), |_, p| {
            p == HealPhase::Exhausted
        })
        .await;
        let took = t0.elapsed();
        assert_eq!(phases, [HealPhase::Recovering, HealPhase::Exhausted]);
        assert!(took < Duration::from_secs(3), "{took:?} for three attempts");
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (3, 3), "{log:?}");
        assert_eq!((log.restarts_in_window, log.max_restarts), (3, 3));
        for a in &log.attempts {
            assert_eq!(a.outcome, HealOutcome::Failed);
            let why = a.why.as_deref().unwrap_or_default();
            assert!(
                why.contains("changed nothing") && why.contains("4242"),
                "{why}"
            );
            assert_eq!(a.error, None, "the command itself worked: {a:?}");
            assert!(a.duration_ms < 1500, "{a:?}");
        }
        // Spent: the next round (and the next incident) is 503 at once, no fourth attempt.
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Exhausted);
        assert_eq!(h.step(&fine(), &[], Instant::now()), HealPhase::Idle);
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Exhausted);
        assert_eq!(h.log().total_attempts, 3);
    }

    fn slow_vs_peers() -> Decision {
        evaluate(&PolicyInput {
            web: WebVerdict::Up,
            slow_vs_peers: Some(crate::policy::SlowVsPeers {
                reason: "slow against its peers: 9.6×".into(),
                capped: None,
            }),
            ..PolicyInput::default()
        })
    }

    /// Slow against its peers: one restart, judged on the latency of the answers that began
    /// after it returned — failed as soon as the comparison on them says slow again, not at
    /// `heal.timeout`; while too few have come, `recovering`. Then 503, no second restart.
    #[tokio::test]
    async fn a_futile_restart_of_a_box_slow_against_its_peers_fails_on_fresh_latency() {
        let mut h = healer("true", 3);
        h.cfg.timeout = Duration::from_secs(30);
        let d = slow_vs_peers();
        let signs = WebSigns {
            verdict: Some(WebVerdict::Up),
            listening: true,
            pids: vec![4242],
            ..WebSigns::default()
        };
        // The judgement that started the restart rests on answers from before it.
        h.see(signs.clone().with_slow(None));
        assert_eq!(h.step(&d, &[], Instant::now()), HealPhase::Recovering);
        assert_eq!(settle(&mut h, &d).await, HealPhase::Recovering);
        let returned = h.last_return().expect("the restart returned");
        // Too few answers since: held, recovering, whatever the time.
        tokio::time::sleep(judge::SETTLE).await;
        h.see(signs.clone().with_slow(None));
        assert_eq!(h.step(&d, &[], Instant::now()), HealPhase::Recovering);
        // Answers after the return judge it slow again: failed at once, then 503.
        h.see(signs.clone().with_slow(Some(returned)));
        assert_eq!(h.step(&d, &[], Instant::now()), HealPhase::Exhausted);
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (1, 1), "{log:?}");
        let why = log.attempts[0].why.clone().unwrap_or_default();
        assert!(why.contains("answers since are still"), "{why}");
        h.see(signs.with_slow(Some(returned)));
        assert_eq!(h.step(&d, &[], Instant::now()), HealPhase::Exhausted);
        assert_eq!(h.log().total_attempts, 1);
    }

    fn erroring() -> Decision {
        evaluate(&PolicyInput {
            web: WebVerdict::Erroring,
            ..PolicyInput::default()
        })
    }

    /// Steps an erroring incident every 20 ms while the same running processes answer
    /// `per_step` more real answers by class each step; returns the phase and when it became
    /// `Exhausted` (None: it did not within `limit`).
    async fn drive_answers(
        h: &mut Healer,
        per_step: [u64; 6],
        limit: Duration,
    ) -> (HealPhase, Option<Duration>) {
        let t0 = Instant::now();
        let mut answered = [0u64; 6];
        let mut phase = HealPhase::Idle;
        while t0.elapsed() < limit {
            for (a, n) in answered.iter_mut().zip(per_step) {
                *a += n;
            }
            h.see(WebSigns {
                verdict: Some(WebVerdict::Erroring),
                listening: true,
                pids: vec![4242],
                progress: Some(answered.iter().sum()),
                answered: Some(answered),
                ..WebSigns::default()
            });
            phase = h.step(&erroring(), &[], Instant::now());
            if phase == HealPhase::Exhausted {
                return (phase, Some(t0.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (phase, None)
    }

    /// Issue 53 item 6: a restart that changes nothing (`true`: the same processes, the same
    /// 5xx) is judged on the real answers counted since it returned, in well under a second at
    /// this rate — not at `heal.timeout` (30 s here), which a window kept by the same
    /// processes never started over for. One restart per erroring incident, then 503.
    #[tokio::test]
    async fn a_futile_restart_of_an_erroring_server_fails_on_the_answers_since_it_returned() {
        let mut h = healer("true", 3);
        h.cfg.timeout = Duration::from_secs(30);
        let (phase, after) =
            drive_answers(&mut h, [0, 0, 1, 0, 0, 4], Duration::from_secs(5)).await;
        let after = after.unwrap_or_else(|| panic!("still {phase:?} after 5 s: {:?}", h.log()));
        assert!(after < Duration::from_secs(2), "{after:?}");
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (1, 1), "{log:?}");
        let why = log.attempts[0].why.clone().unwrap_or_default();
        assert!(
            why.contains("changed nothing") && why.contains("were 5xx (80 %)"),
            "{why}"
        );
        let d = applied(erroring(), phase);
        assert_eq!(d.http, 200, "no peers: erroring alone is not 503: {d:?}");

        // Answers since the return that are mostly fine: the restart worked, the window only
        // still holds the errors from before it; recovering, never failed for it.
        let mut h = healer("true", 3);
        h.cfg.timeout = Duration::from_secs(30);
        let (phase, after) =
            drive_answers(&mut h, [0, 0, 9, 0, 0, 1], Duration::from_millis(1500)).await;
        assert_eq!(
            (phase, after),
            (HealPhase::Recovering, None),
            "{:?}",
            h.log()
        );
        assert_eq!(h.log().total_failed, 0);
    }

    /// A restart under way: the listener goes away, new processes bind it and serve. No
    /// failure meanwhile, and the attempt says why it was judged recovered.
    #[tokio::test]
    async fn a_restart_under_way_is_recovering_until_the_new_server_serves() {
        let mut h = healer("true", 3);
        h.see(stopped(&[4242], 17));
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Recovering);
        let gone = WebSigns {
            verdict: Some(WebVerdict::Down),
            ..WebSigns::default()
        };
        let down = evaluate(&PolicyInput {
            web: WebVerdict::Down,
            ..PolicyInput::default()
        });
        let phases = drive(&mut h, &down, &gone, Duration::from_secs(1), |_, _| false).await;
        assert_eq!(phases, [HealPhase::Recovering]);
        let last = h.log().attempts[0].clone();
        assert_eq!(last.outcome, HealOutcome::Waiting);
        assert!(last.why.unwrap().contains("listener is gone"));
        // New processes bound it and do not answer yet: still under way.
        let coming = WebSigns {
            verdict: Some(WebVerdict::Hung),
            listening: true,
            pids: vec![5151],
            frozen: None,
            progress: Some(17),
            erroring_since: None,
            answered: None,
            slow_judged_after: None,
        };
        let phases = drive(
            &mut h,
            &hung(),
            &coming,
            Duration::from_millis(500),
            |_, _| false,
        )
        .await;
        assert_eq!(phases, [HealPhase::Recovering]);
        let serving = WebSigns {
            verdict: Some(WebVerdict::Up),
            progress: Some(30),
            ..coming
        };
        h.see(serving);
        assert_eq!(h.step(&fine(), &[], Instant::now()), HealPhase::Idle);
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_recovered), (1, 1), "{log:?}");
        let a = &log.attempts[0];
        assert_eq!(a.outcome, HealOutcome::Recovered);
        assert!(
            a.why
                .as_deref()
                .is_some_and(|w| w.contains("up") && w.contains("5151")),
            "{a:?}"
        );
    }

    /// A listener that never comes back is bounded by `heal.timeout`, then the next attempt.
    #[tokio::test]
    async fn under_way_lasts_no_longer_than_the_timeout() {
        let mut h = healer("true", 1);
        h.cfg.timeout = Duration::from_millis(600);
        let gone = WebSigns::default();
        let down = evaluate(&PolicyInput {
            web: WebVerdict::Down,
            ..PolicyInput::default()
        });
        let t0 = Instant::now();
        let phases = drive(&mut h, &down, &gone, Duration::from_secs(5), |_, p| {
            p == HealPhase::Exhausted
        })
        .await;
        assert_eq!(phases, [HealPhase::Recovering, HealPhase::Exhausted]);
        assert!(t0.elapsed() >= Duration::from_millis(600));
        let a = &h.log().attempts[0];
        assert!(
            a.why.as_deref().is_some_and(|w| w.contains("still faulty")),
            "{a:?}"
        );
    }

    /// A backend that is down and a restart that returns at once while nothing listens: each
    /// attempt looks like a server coming up, so each waits for its timeout. One incident is
    /// `recovering` for at most `heal.timeout` all told: once an attempt has failed and that
    /// long has passed, later attempts still run, under a 503.
    #[tokio::test]
    async fn one_incident_is_recovering_for_at_most_the_timeout() {
        let mut h = healer("true", 3);
        h.cfg.timeout = Duration::from_millis(500);
        let down = evaluate(&PolicyInput {
            web: WebVerdict::Down,
            ..PolicyInput::default()
        });
        let t0 = Instant::now();
        let mut first_503: Option<(Duration, u64)> = None;
        while t0.elapsed() < Duration::from_secs(5) && h.log().total_failed < 3 {
            h.see(WebSigns::default());
            let phase = h.step(&down, &[], Instant::now());
            if phase == HealPhase::Exhausted && first_503.is_none() {
                first_503 = Some((t0.elapsed(), h.log().total_attempts));
            }
            if first_503.is_some() {
                assert_eq!(phase, HealPhase::Exhausted, "never back to recovering");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (at, attempts) = first_503.expect("503 within the incident");
        assert!(
            at < Duration::from_millis(1500),
            "recovering for {at:?}, not one timeout (0.5 s) plus a round"
        );
        assert_eq!(attempts, 2, "the 503 came while the second attempt ran");
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (3, 3), "{log:?}");
    }

    /// A restarted container's namespace is not found yet (`unknown`): not recovered until
    /// the web check sees it serve.
    #[tokio::test]
    async fn recovered_needs_the_web_check_to_see_it() {
        let mut h = healer("true", 3);
        h.see(stopped(&[4242], 17));
        h.step(&hung(), &[], Instant::now());
        let unknown = WebSigns {
            verdict: Some(WebVerdict::Unknown),
            ..WebSigns::default()
        };
        let phases = drive(
            &mut h,
            &fine(),
            &unknown,
            Duration::from_millis(500),
            |_, _| false,
        )
        .await;
        assert_eq!(phases, [HealPhase::Recovering]);
        assert_eq!(h.log().total_recovered, 0);
        h.see(WebSigns {
            verdict: Some(WebVerdict::Up),
            listening: true,
            pids: vec![9],
            ..WebSigns::default()
        });
        assert_eq!(h.step(&fine(), &[], Instant::now()), HealPhase::Idle);
        assert_eq!(h.log().total_recovered, 1);
    }

    #[tokio::test]
    async fn restart_then_recovered() {
        let mut h = healer("echo restarted", 3);
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Recovering);
        assert_eq!(settle(&mut h, &hung()).await, HealPhase::Recovering);
        assert_eq!(h.step(&fine(), &[], Instant::now()), HealPhase::Idle);
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_recovered), (1, 1));
        assert_eq!(log.attempts[0].outcome, HealOutcome::Recovered);
        assert_eq!(
            serde_json::to_value(&log.attempts[0]).unwrap()["outcome"],
            "recovered"
        );
        assert_eq!(log.attempts[0].output.as_deref(), Some("restarted"));
    }

    #[tokio::test]
    async fn failing_command_exhausts_and_budget_holds() {
        let mut h = healer("echo nope >&2; exit 4", 2);
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Recovering);
        // The first failure starts the second attempt (recovering); its failure spends the
        // budget of 2.
        assert_eq!(settle(&mut h, &hung()).await, HealPhase::Exhausted);
        for _ in 0..5 {
            assert_eq!(settle(&mut h, &hung()).await, HealPhase::Exhausted);
        }
        let log = h.log();
        assert_eq!(log.total_attempts, 2, "budget of 2 respected: {log:?}");
        assert!(log.budget_spent);
        assert!(log.attempts[0].error.as_deref().unwrap().contains("nope"));
    }

    #[tokio::test]
    async fn no_action_means_no_heal() {
        let mut h = healer("", 3);
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Idle);
        assert_eq!(h.log().total_attempts, 0);
    }

    #[tokio::test]
    async fn guarded_fault_is_never_healed() {
        let mut h = healer("echo hi", 3);
        let guarded = evaluate(&PolicyInput {
            web: WebVerdict::Hung,
            database: crate::status::DbState::Unreachable,
            ..PolicyInput::default()
        });
        assert_eq!(h.step(&guarded, &[], Instant::now()), HealPhase::Idle);
        assert_eq!(h.log().total_attempts, 0);
    }
}
