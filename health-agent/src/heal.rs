//! Self-healing: detect → restart → re-check, before any 503. One state machine per incident:
//! a healable fault starts a restart (container via the Docker Engine API, or
//! `web.restart_command`), `/health` says `recovering` until the fault clears or `heal.timeout`
//! passes; a failed first attempt turns the answer to 503 while later attempts (within the
//! `heal.max_restarts` per `heal.window` budget) go on in the background. Never two restarts at
//! once; never during boot grace or for a shared-dependency fault (the policy gives no
//! healable fault then). Every attempt is kept in a bounded log.

use std::{
    collections::VecDeque,
    process::Stdio,
    time::{Duration, Instant, SystemTime},
};

use serde::Serialize;
use tokio::{io::AsyncReadExt, task::JoinHandle};

use crate::{
    config::{HealConfig, WebConfig},
    docker::Docker,
    policy::{Decision, Fault, HealPhase},
    snapshot::rfc3339,
};

const LOG_LEN: usize = 20;
const OUTPUT_LIMIT: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    RestartContainer(String),
    Command(String),
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Self::RestartContainer(n) => format!("docker restart {n}"),
            Self::Command(c) => format!("restart_command `{c}`"),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HealAttempt {
    pub started_at: String,
    pub reason: String,
    pub action: String,
    /// `running`, `waiting`, `recovered`, `failed`.
    pub outcome: &'static str,
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
        task: JoinHandle<Result<String, String>>,
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
                    None => Err("restart task ended abnormally".into()),
                };
                match result {
                    Ok(output) => {
                        self.update_last(|a| {
                            a.outcome = "waiting";
                            a.output = (!output.is_empty()).then_some(output);
                        });
                        self.state = State::Waiting { started };
                    }
                    Err(e) => self.fail(e, started, now),
                }
            } else if now.saturating_duration_since(*started) > self.cfg.timeout {
                task.abort();
                let started = *started;
                let e = format!(
                    "restart did not finish within {}s",
                    self.cfg.timeout.as_secs()
                );
                self.fail(e, started, now);
            } else {
                return self.phase();
            }
        }

        let Some(fault) = fault else {
            if let State::Waiting { started } = self.state {
                self.finish_last("recovered", None, started, now);
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
                let e = format!(
                    "still faulty ({}) {}s after the restart",
                    decision.reasons.join("; "),
                    self.cfg.timeout.as_secs()
                );
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
            outcome: "running",
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
    fn fail(&mut self, error: String, started: Instant, now: Instant) {
        self.finish_last("failed", Some(error), started, now);
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
        outcome: &'static str,
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

use std::future::Future as _;

async fn run(action: Action, docker: Option<Docker>, timeout: Duration) -> Result<String, String> {
    match action {
        Action::RestartContainer(name) => {
            let docker = docker.ok_or("Docker is not configured")?;
            docker.restart(&name, timeout).await.map(|()| String::new())
        }
        Action::Command(cmd) => run_command(&cmd, timeout).await,
    }
}

/// What a restart command may see of the agent's environment: the variables a shell and the
/// usual restart tools (`systemctl`, `docker`, `service`) need, nothing else. An allowlist, not
/// a denylist: the agent's secrets (`server.token_env`, `fleet.token_env`,
/// `alerts.github_token_env`, `PGPASSWORD`, and whatever the unit file adds) have names only the
/// operator knows, and a command that needs more can set it itself.
const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
];

fn passed_to_command(name: &str) -> bool {
    ENV_ALLOWLIST.contains(&name) || name.starts_with("LC_")
}

/// Output kept per stream; the rest is read and counted, so a chatty command never stalls on a
/// full pipe.
const CAPTURE_LIMIT: usize = 64 * 1024;

/// Once the shell has exited, how long its output may take to reach end of file. A background
/// child that kept the pipes open is not waited for: reading stops, and its next write fails.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: u64,
}

async fn capture<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>, into: &mut Captured) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let take = n.min(CAPTURE_LIMIT.saturating_sub(into.kept.len()));
                into.kept.extend_from_slice(&buf[..take]);
                into.dropped = into.dropped.saturating_add((n - take) as u64);
            }
        }
    }
}

/// SIGKILLs the command's whole process group when dropped armed: on timeout, and when the
/// future running the command is dropped (the healer gave up on it), so nothing it started
/// in the foreground or background outlives it.
struct GroupKiller(Option<libc::pid_t>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|p| *p > 1) {
            // SAFETY: kill(2) on our child's own process group; no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// Runs `sh -c cmd` in a process group of its own with a scrubbed environment, capturing
/// (truncated) stdout and stderr read concurrently; non-zero exit is a failure. On timeout, or
/// if this future is dropped, the whole group is killed.
pub async fn run_command(cmd: &str, timeout: Duration) -> Result<String, String> {
    let env: Vec<_> = std::env::vars_os().collect();
    run_command_with_env(cmd, timeout, env).await
}

async fn run_command_with_env(
    cmd: &str,
    timeout: Duration,
    agent_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<String, String> {
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .env_clear()
        .envs(
            agent_env
                .into_iter()
                .filter(|(k, _)| k.to_str().is_some_and(passed_to_command)),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run restart_command: {e}"))?;
    let mut group = GroupKiller(child.id().and_then(|p| libc::pid_t::try_from(p).ok()));
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let finished = {
        let reading = async {
            tokio::join!(capture(stdout, &mut out), capture(stderr, &mut err));
        };
        tokio::pin!(reading);
        let work = async {
            let mut read_all = false;
            let status = tokio::select! {
                s = child.wait() => s,
                () = &mut reading => {
                    read_all = true;
                    child.wait().await
                }
            };
            if !read_all {
                let _ = tokio::time::timeout(OUTPUT_GRACE, &mut reading).await;
            }
            status
        };
        tokio::time::timeout(timeout, work).await
    };
    let mut text = String::from_utf8_lossy(&out.kept).trim().to_string();
    let err_text = String::from_utf8_lossy(&err.kept);
    if !err_text.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(err_text.trim());
    }
    let mut text = crate::text::truncate(&text, OUTPUT_LIMIT);
    let dropped = out.dropped.saturating_add(err.dropped);
    if dropped > 0 {
        text.push_str(&format!(" [{dropped} more bytes not kept]"));
    }
    let status = match finished {
        Ok(status) => status,
        Err(_) => {
            // `group` kills the process group as it goes out of scope.
            return Err(format!(
                "restart_command did not finish within {}s; its process group was killed: {text}",
                timeout.as_secs()
            ));
        }
    };
    // The shell exited: leave alone what it started in the background (a server it restarted).
    group.0 = None;
    match status {
        Ok(s) if s.success() => Ok(text),
        Ok(s) => Err(format!("restart_command exited with {s}: {text}")),
        Err(e) => Err(format!("restart_command: {e}")),
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

    #[tokio::test]
    async fn restart_then_recovered() {
        let mut h = healer("echo restarted", 3);
        assert_eq!(h.step(&hung(), &[], Instant::now()), HealPhase::Recovering);
        assert_eq!(settle(&mut h, &hung()).await, HealPhase::Recovering);
        assert_eq!(h.step(&fine(), &[], Instant::now()), HealPhase::Idle);
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_recovered), (1, 1));
        assert_eq!(log.attempts[0].outcome, "recovered");
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

    /// Some process of group `pgid` is alive (zombies waiting for a reaper do not count).
    fn group_alive(pgid: i32) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() != Some(&"Z") && f.get(2).and_then(|p| p.parse().ok()) == Some(pgid)
        })
    }

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    }

    async fn read_pid(path: &std::path::Path) -> i32 {
        for _ in 0..200 {
            if let Some(pid) = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never written", path.display());
    }

    async fn gone_within(d: Duration, what: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            if !what() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !what()
    }

    #[tokio::test]
    async fn restart_command_sees_none_of_the_agents_secrets() {
        let agent_env = [
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            ("LC_ALL", "C"),
            ("HEALTH_AGENT_TOKEN", "tok-s3cr3t-1"),
            ("GITHUB_TOKEN", "ghp_s3cr3t2"),
            ("PGPASSWORD", "pg-s3cr3t-3"),
            ("PEER_TOKEN", "fleet-s3cr3t-4"),
            ("AWS_SECRET_ACCESS_KEY", "aws-s3cr3t-5"),
        ]
        .map(|(k, v)| (k.into(), v.into()))
        .to_vec();
        let out = run_command_with_env("env", Duration::from_secs(10), agent_env)
            .await
            .unwrap();
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(
            out.contains("PATH=/usr/sbin") && out.contains("LC_ALL=C"),
            "{out}"
        );
        // The real path, with this process's own environment: only allowlisted names pass
        // (and what the shell itself sets).
        let out = run_command("env", Duration::from_secs(10)).await.unwrap();
        for line in out.lines() {
            let name = line.split_once('=').map_or(line, |(n, _)| n);
            assert!(
                passed_to_command(name) || matches!(name, "PWD" | "SHLVL" | "_"),
                "{name} reached the restart command"
            );
        }
    }

    #[tokio::test]
    async fn a_megabyte_on_stderr_finishes_normally() {
        let started = Instant::now();
        let out = run_command(
            "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo done",
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            out.starts_with("done\nxxxx"),
            "{}",
            &out[..20.min(out.len())]
        );
        assert!(out.len() < OUTPUT_LIMIT + 100, "kept small: {}", out.len());
        assert!(
            out.ends_with(&format!(
                "[{} more bytes not kept]",
                1_000_000 - CAPTURE_LIMIT
            )),
            "{}",
            &out[out.len() - 60..]
        );
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let (bg, sh) = (dir.path().join("bg"), dir.path().join("sh"));
        let cmd = format!(
            "sleep 300 & echo $! > {}; echo $$ > {}; sleep 300",
            bg.display(),
            sh.display()
        );
        let started = Instant::now();
        let err = run_command(&cmd, Duration::from_secs(1)).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(err.contains("did not finish within 1s"), "{err}");
        let (bg, pgid) = (read_pid(&bg).await, read_pid(&sh).await);
        assert!(
            gone_within(Duration::from_secs(3), || alive(bg)).await,
            "background sleep {bg} survived"
        );
        assert!(
            gone_within(Duration::from_secs(3), || group_alive(pgid)).await,
            "process group {pgid} survived"
        );
    }

    #[tokio::test]
    async fn a_dropped_restart_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let sh = dir.path().join("sh");
        let cmd = format!("echo $$ > {}; sleep 300 & sleep 300", sh.display());
        let task = tokio::spawn(async move { run_command(&cmd, Duration::from_secs(600)).await });
        let pgid = read_pid(&sh).await;
        assert!(group_alive(pgid));
        // What the healer does when heal.timeout passes first.
        task.abort();
        assert!(
            gone_within(Duration::from_secs(3), || group_alive(pgid)).await,
            "process group {pgid} survived"
        );
    }

    #[tokio::test]
    async fn a_background_child_holding_stdout_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let bg = dir.path().join("bg");
        let cmd = format!("sleep 300 & echo $! > {}; echo started", bg.display());
        let started = Instant::now();
        let out = run_command(&cmd, Duration::from_secs(20)).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(out, "started");
        // Left running: it may be the server the command just started.
        let bg = read_pid(&bg).await;
        assert!(alive(bg));
        // SAFETY: cleaning up the sleep this test started.
        unsafe { libc::kill(bg, libc::SIGKILL) };
    }
}
