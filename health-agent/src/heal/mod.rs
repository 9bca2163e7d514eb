//! Self-healing: detect → restart → re-check, before any 503. One state machine per incident:
//! a healable fault starts a restart (container via the Docker Engine API, or
//! `web.restart_command`), `/health` says `recovering` until the fault clears or `heal.timeout`
//! passes; a failed first attempt turns the answer to 503 while later attempts (within the
//! `heal.max_restarts` per `heal.window` budget) go on in the background. Never two restarts at
//! once; never during boot grace or for a shared-dependency fault (the policy gives no
//! healable fault then). Every attempt is kept in a bounded log.
//!
//! The composer evaluates the policy once per round; `Healer::step` takes that decision and
//! returns the phase, and `applied` turns decision and phase into the answer — a pure step.
//! `command` runs `web.restart_command`; `worker` replaces one stuck worker of a pre-fork
//! server (`partial_hang`), within the same budget and log.

mod command;
mod worker;

use std::{
    collections::VecDeque,
    future::Future as _,
    time::{Duration, Instant, SystemTime},
};

use serde::Serialize;
use tokio::task::JoinHandle;

pub use self::command::{run_command, CommandError};
pub use self::worker::WorkerError;
use crate::{
    config::{HealConfig, WebConfig},
    docker::Docker,
    policy::{Decision, Fault, HealPhase, Status},
    snapshot::rfc3339,
};

const LOG_LEN: usize = 20;

/// Why a restart attempt failed. The messages are what the heal log and `/health` show.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    #[error("Docker is not configured")]
    NoDocker,
    #[error(transparent)]
    Docker(#[from] crate::docker::DockerError),
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
}

/// How an attempt went; serialized as `running`, `waiting`, `recovered`, `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealOutcome {
    /// The restart action is running.
    Running,
    /// The action finished; waiting for the fault to clear.
    Waiting,
    Recovered,
    Failed,
}

/// The round's decision with self-healing applied: what `policy::evaluate` answers with
/// `PolicyInput::heal = phase` for the same input outside boot grace (the healer does not act
/// within it). A fault self-healing covers answers 200 `recovering` while a restart runs; any
/// other fault stays 503 and says where healing stands. Without a fault the phase changes
/// nothing.
pub fn applied(mut decision: Decision, phase: HealPhase) -> Decision {
    if decision.faults.is_empty() {
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
    RestartContainer(String),
    Command(String),
    /// One stuck worker of a pre-fork server, which its master replaces (`worker.rs`).
    ReplaceWorker(worker::Target),
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Self::RestartContainer(n) => format!("docker restart {n}"),
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

enum State {
    Idle,
    /// The restart action is running.
    Running {
        started: Instant,
        task: JoinHandle<Result<String, HealError>>,
    },
    /// The action finished; waiting for the fault to clear until `heal.timeout`.
    Waiting {
        started: Instant,
    },
    /// This incident's attempt failed; the next one may start once the budget allows.
    Failed,
}

pub struct Healer {
    cfg: HealConfig,
    web: WebConfig,
    docker: Option<Docker>,
    state: State,
    restarts: VecDeque<Instant>,
    /// The current incident already had a failed attempt: answer 503 from now on.
    incident_failed: bool,
    log: HealLog,
    worker: worker::WorkerHeal,
}

impl Healer {
    pub fn new(cfg: HealConfig, web: WebConfig, docker: Option<Docker>) -> Self {
        let log = HealLog {
            enabled: cfg.enabled,
            max_restarts: cfg.max_restarts,
            ..HealLog::default()
        };
        Self {
            cfg,
            web,
            docker,
            state: State::Idle,
            restarts: VecDeque::new(),
            incident_failed: false,
            log,
            worker: worker::WorkerHeal::default(),
        }
    }

    /// A restart is running or being waited on, or the current incident already failed.
    pub fn busy(&self) -> bool {
        !matches!(self.state, State::Idle) || self.incident_failed
    }

    pub fn log(&self) -> HealLog {
        self.log.clone()
    }

    /// What a restart would do for `fault`, if anything can.
    fn action_for(&self, fault: Fault, faulty_containers: &[String]) -> Option<Action> {
        match fault {
            Fault::Web(_) if !self.web.container.is_empty() && self.docker.is_some() => {
                Some(Action::RestartContainer(self.web.container.clone()))
            }
            Fault::Web(_) if !self.web.restart_command.is_empty() => {
                Some(Action::Command(self.web.restart_command.clone()))
            }
            Fault::Containers if self.docker.is_some() => faulty_containers
                .first()
                .map(|n| Action::RestartContainer(n.clone())),
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
        let phase = self.advance(decision, faulty_containers, now);
        self.log.phase = Some(phase);
        phase
    }

    fn advance(
        &mut self,
        decision: &Decision,
        faulty_containers: &[String],
        now: Instant,
    ) -> HealPhase {
        let fault = decision.healable_fault();
        // Finish a running action first, whatever the fault does meanwhile.
        if let State::Running { started, task } = &mut self.state {
            if task.is_finished() {
                let started = *started;
                let result = match futures_now(task) {
                    Some(r) => r,
                    None => Err(HealError::TaskEnded),
                };
                match result {
                    Ok(output) => {
                        self.update_last(|a| {
                            a.outcome = HealOutcome::Waiting;
                            a.output = (!output.is_empty()).then_some(output);
                        });
                        self.state = State::Waiting { started };
                    }
                    Err(e) => self.fail(e, started, now),
                }
            } else if now.saturating_duration_since(*started) > self.cfg.timeout {
                task.abort();
                let started = *started;
                self.fail(HealError::Overran(self.cfg.timeout), started, now);
            } else {
                return self.phase();
            }
        }

        let Some(fault) = fault else {
            if let State::Waiting { started } = self.state {
                self.finish_last(HealOutcome::Recovered, None, started, now);
                self.log.total_recovered += 1;
                tracing::info!("self-heal worked: the fault cleared");
            }
            self.state = State::Idle;
            self.incident_failed = false;
            return HealPhase::Idle;
        };

        match self.state {
            State::Waiting { started } => {
                if now.saturating_duration_since(started) <= self.cfg.timeout {
                    return self.phase();
                }
                let e = HealError::StillFaulty {
                    reasons: decision.reasons.join("; "),
                    timeout: self.cfg.timeout,
                };
                self.fail(e, started, now);
                self.try_start(fault, decision, faulty_containers, now)
            }
            State::Idle | State::Failed => self.try_start(fault, decision, faulty_containers, now),
            State::Running { .. } => self.phase(),
        }
    }

    fn phase(&self) -> HealPhase {
        if self.incident_failed {
            HealPhase::Exhausted
        } else {
            HealPhase::Recovering
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
            return if self.incident_failed {
                HealPhase::Exhausted
            } else {
                HealPhase::Idle
            };
        };
        if self.restarts.len() as u32 >= self.cfg.max_restarts {
            if !self.log.budget_spent || !self.incident_failed {
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
        self.restarts.push_back(now);
        self.log.restarts_in_window = self.restarts.len() as u32;
        self.log.total_attempts += 1;
        self.log.attempts.push_back(HealAttempt {
            started_at: rfc3339(SystemTime::now()),
            reason,
            action: action.describe(),
            outcome: HealOutcome::Running,
            error: None,
            output: None,
            duration_ms: 0,
        });
        while self.log.attempts.len() > LOG_LEN {
            self.log.attempts.pop_front();
        }
        let docker = self.docker.clone();
        let timeout = self.cfg.timeout;
        let task = tokio::spawn(async move { run(action, docker, timeout).await });
        self.state = State::Running { started: now, task };
        self.phase()
    }

    /// The current attempt failed: log it, and answer 503 for the rest of this incident.
    fn fail(&mut self, error: HealError, started: Instant, now: Instant) {
        self.finish_last(HealOutcome::Failed, Some(error.to_string()), started, now);
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
        error: Option<String>,
        started: Instant,
        now: Instant,
    ) {
        if let Some(e) = &error {
            tracing::warn!("self-heal attempt failed: {e}");
        }
        self.update_last(|a| {
            a.outcome = outcome;
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
    docker: Option<Docker>,
    timeout: Duration,
) -> Result<String, HealError> {
    match action {
        Action::RestartContainer(name) => {
            let docker = docker.ok_or(HealError::NoDocker)?;
            docker
                .restart(&name, timeout)
                .await
                .map(|()| String::new())
                .map_err(HealError::Docker)
        }
        Action::Command(cmd) => Ok(run_command(&cmd, timeout).await?),
        Action::ReplaceWorker(t) => Ok(worker::replace(t, timeout).await?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{evaluate, PolicyInput, WebVerdict};

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

    /// `applied` after one evaluation answers what evaluating again with the phase answered
    /// (the composer's flow before healing became a pure step).
    #[test]
    fn applied_matches_evaluating_with_the_phase() {
        use crate::policy::{ContainersState, DbState, DiskLevel};
        let inputs = [
            PolicyInput::default(),
            PolicyInput {
                web: WebVerdict::Hung,
                web_detail: "no answer for 9s".into(),
                ..PolicyInput::default()
            },
            PolicyInput {
                web: WebVerdict::Down,
                ..PolicyInput::default()
            },
            PolicyInput {
                containers: ContainersState::Faulty,
                ..PolicyInput::default()
            },
            PolicyInput {
                web: WebVerdict::Hung,
                disk: DiskLevel::Fail,
                ..PolicyInput::default()
            },
            PolicyInput {
                web: WebVerdict::Hung,
                database: DbState::Unreachable,
                ..PolicyInput::default()
            },
            PolicyInput {
                web: WebVerdict::Unresponsive,
                web_served: false,
                ..PolicyInput::default()
            },
            PolicyInput {
                web: WebVerdict::Slow,
                disk: DiskLevel::Warn,
                ..PolicyInput::default()
            },
        ];
        for input in inputs {
            let raw = evaluate(&input);
            for phase in [HealPhase::Idle, HealPhase::Recovering, HealPhase::Exhausted] {
                let with_phase = PolicyInput {
                    heal: phase,
                    ..input.clone()
                };
                assert_eq!(
                    applied(raw.clone(), phase),
                    evaluate(&with_phase),
                    "{input:?} {phase:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn the_answer_is_recovering_while_a_restart_runs_then_503_once_it_fails() {
        let mut h = healer("sleep 0.3; exit 1", 3);
        let raw = hung();
        let phase = h.step(&raw, &[], Instant::now());
        let d = applied(raw.clone(), phase);
        assert_eq!((d.status, d.http), (Status::Recovering, 200), "{d:?}");
        assert_eq!(d.reasons.last().unwrap(), "self-heal in progress");
        let phase = settle(&mut h, &raw).await;
        let d = applied(raw.clone(), phase);
        assert_eq!((d.status, d.http), (Status::Unhealthy, 503), "{d:?}");
        assert_eq!(
            d.reasons.last().unwrap(),
            "self-heal failed or its budget is spent"
        );
        // Once the fault clears, healing changes nothing.
        let phase = h.step(&fine(), &[], Instant::now());
        assert_eq!(applied(fine(), phase), fine());
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
        // First failure: 503 from now on, a second attempt runs in the background.
        assert_eq!(settle(&mut h, &hung()).await, HealPhase::Exhausted);
        settle(&mut h, &hung()).await;
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
            database: crate::policy::DbState::Unreachable,
            ..PolicyInput::default()
        });
        assert_eq!(h.step(&guarded, &[], Instant::now()), HealPhase::Idle);
        assert_eq!(h.log().total_attempts, 0);
    }
}
