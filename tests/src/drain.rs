//! `health-agent drain` and `undrain` against a test's [`Agent`], run the way an operator or a
//! deploy script runs them: the binary, the agent's own config file (its `[drain]
//! control_socket`), the exit code and the last line it printed.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{agent_binary, Agent, Proc};

/// A finished `drain` or `undrain`.
#[derive(Debug, Clone)]
pub struct CommandRun {
    /// None: killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// From start to exit.
    pub took: Duration,
}

impl CommandRun {
    /// The verdict line: the last line on stdout (`drained in 4.2 s (...)`, `undrained: ...`),
    /// else on stderr (`health-agent: cannot reach the agent ...`).
    pub fn last_line(&self) -> &str {
        last_line(&self.stdout)
            .or_else(|| last_line(&self.stderr))
            .unwrap_or_default()
    }
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

impl std::fmt::Display for CommandRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} after {:.1} s\nstdout:\n{}stderr:\n{}",
            self.code,
            self.took.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// `health-agent --config <the agent's> <args>`.
fn command(agent: &Agent, args: &[String]) -> Command {
    let mut c = Command::new(agent_binary());
    c.arg("--config")
        .arg(agent.config_path())
        .args(args)
        .stdin(Stdio::null());
    c
}

/// `drain --quiet Q --timeout T`, the durations as the flags take them (`2000ms`).
fn drain_args(quiet: Duration, timeout: Duration) -> Vec<String> {
    vec![
        "drain".into(),
        "--quiet".into(),
        format!("{}ms", quiet.as_millis()),
        "--timeout".into(),
        format!("{}ms", timeout.as_millis()),
    ]
}

fn run(agent: &Agent, args: &[String]) -> CommandRun {
    let started = Instant::now();
    let out = command(agent, args)
        .output()
        .unwrap_or_else(|e| panic!("running health-agent {args:?}: {e}"));
    CommandRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// `drain --quiet Q --timeout T`, to its end: exit 0 drained, 1 timed out, 2 error.
pub fn drain(agent: &Agent, quiet: Duration, timeout: Duration) -> CommandRun {
    run(agent, &drain_args(quiet, timeout))
}

/// `undrain`: exit 0 (`undrained: ...` or `not draining`).
pub fn undrain(agent: &Agent) -> CommandRun {
    run(agent, &["undrain".into()])
}

/// `drain` left running in the background, as a script that starts it and moves on after a
/// fixed sleep does; terminated on drop (the agent keeps draining until undrain).
pub struct DrainInBackground(Proc);

impl DrainInBackground {
    pub fn start(agent: &Agent, quiet: Duration, timeout: Duration) -> Self {
        let child = command(agent, &drain_args(quiet, timeout))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting health-agent drain");
        Self(Proc(child))
    }

    /// Terminates it, if it still runs: its exit code when it had already ended by itself
    /// (0 drained, 1 timed out), else None.
    pub fn stop(mut self) -> Option<i32> {
        let ended = self.0 .0.try_wait().ok().flatten();
        drop(self);
        ended.and_then(|s| s.code())
    }
}
