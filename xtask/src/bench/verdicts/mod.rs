//! Section 6 of the bench: verdicts under load that must never 503, against real Ruby (Debian's
//! Puma) and a real PostgreSQL, with the integration tests' harness (`health-agent-tests`).
//!
//! a. A busy pool: Puma with 2 threads, every request sleeping 3 s, 8 clients. Answers still go
//!    out, so the backend is `slow`: 200, never a 503, never a restart.
//! b. A database outage: the path from the app to its database freezes (a proxy stopped with
//!    SIGSTOP: connections complete, nothing comes back). The app's threads all wait on it:
//!    `waiting`, 200 `infrastructure_issue`, never a 503, never a restart.
//!
//! Missed targets are reported (✓/✗ in the tables) and their timelines printed; only a harness
//! failure (a server that does not start, a load that never got through) fails the bench.
//!
//! `report.rs` turns the `/health` answers and load counts into the tables' cells; one file per
//! run (`busy_pool.rs`, `database_outage.rs`).

mod busy_pool;
mod database_outage;
mod report;

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use health_agent_tests::{HealthPoller, HealthSample};

use super::harness;
use crate::live::{agent_command, spawn_agent, Proc};

/// A [`health_agent_tests::Load`] stops by itself after `health_agent_tests::load::MAX_RUN`
/// (180 s): longer runs are made of segments this long, a fresh load each.
const LOAD_SEGMENT: Duration = Duration::from_secs(150);

/// The agent with `env` added to its environment, logging at info (the log is kept in the
/// bench's directory and quoted when something goes wrong).
fn start_agent(
    bin: &Path,
    config: &Path,
    log: &Path,
    port: u16,
    env: &[(&str, &str)],
) -> Result<Proc> {
    let mut cmd = agent_command(bin, config, log, "info")?;
    cmd.envs(env.iter().copied());
    spawn_agent(&mut cmd, log, port, Duration::from_secs(20))
}

/// Every `/health` answer of the agent on 127.0.0.1:`port`, polled every 200 ms for as long as
/// the run goes (the busy-pool soak runs 300 s, past the harness's usual limit).
fn poller(port: u16) -> HealthPoller {
    HealthPoller::unbounded(([127, 0, 0, 1], port).into())
}

/// Waits until an answer from now on satisfies `pred`; the error carries the timeline.
fn wait_for(
    poller: &HealthPoller,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&HealthSample) -> bool,
) -> Result<HealthSample> {
    harness(what, || poller.wait_for(timeout, what, pred))
}

/// Counts the agent's restarts: `web.restart_command` appends a line to a file and exits 0.
struct Restarts(PathBuf);

impl Restarts {
    fn command(&self) -> String {
        format!("echo restart >> '{}'", self.0.display())
    }

    fn count(&self) -> usize {
        fs::read_to_string(&self.0).map_or(0, |t| t.lines().count())
    }
}

/// Agent defaults but for: no boot grace, the web check on `web_port` probing `/up`, a
/// restart command that only counts, and `extra` TOML appended (tables other than these).
fn agent_config(port: u16, web_port: u16, restarts: &Restarts, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
         [web]\nport = {web_port}\nprobe_path = \"/up\"\nrestart_command = {:?}\n\n{extra}",
        restarts.command()
    )
}

/// Runs 6a and 6b; returns the section's Markdown.
pub fn run(agent_bin: &Path, proxy_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let mut md = String::from("\n## 6. Verdicts under load that must never 503\n\n");
    md.push_str("Real Ruby: Debian's Puma 5.6 in single mode running a small Rack app (the integration tests' `health-agent-tests` harness), a private PostgreSQL 15. The agent runs its defaults but for `checks.boot_grace = 0s`, `web.probe_path = \"/up\"` and a `web.restart_command` that only appends a line to a file: restarts are counted from that file and from `details.heal.total_attempts`. `/health` is polled every 200 ms for the whole run; every answer counts.\n");
    md.push_str(&busy_pool::run(agent_bin, dir, quick)?);
    md.push_str(&database_outage::run(agent_bin, proxy_bin, dir, quick)?);
    Ok(md)
}
