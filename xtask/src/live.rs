//! Live processes and HTTP for the verbs that run the product (demo, bench): starters for the
//! agent and the bundled backend. The process guard ([`Proc`]), the HTTP client and free ports
//! are the integration tests' harness (`health-agent-tests`); what is here returns errors
//! instead of panicking, and runs binaries from target/release rather than next to a test.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
pub use health_agent_tests::Proc;
use serde_json::Value;

pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    get_with_timeout(port, path, Duration::from_secs(3))
}

/// GET on 127.0.0.1 with one deadline for connect, write and read.
pub fn get_with_timeout(port: u16, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let (code, _, body) = health_agent_tests::get_within(port, path, timeout)?;
    Ok((code, body))
}

pub fn health(port: u16) -> Result<(u16, Value)> {
    let (code, body) = get(port, "/health")?;
    Ok((code, serde_json::from_str(&body)?))
}

pub fn start_backend(bin: &Path, port: u16, pid_file: &Path) -> Result<Proc> {
    let child = Command::new(bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--control",
            &format!("127.0.0.1:{}", port + 1),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    fs::write(pid_file, child.id().to_string())?;
    let backend = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(port, "/up").is_err() {
        if Instant::now() > deadline {
            bail!("the bundled backend did not start on 127.0.0.1:{port} — is the port in use? try --backend-port");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(backend)
}

/// The variables the agent takes alert destinations and a database from when its config does
/// not write them (docs/configuration.md, "Secrets from the environment"). The demo's and the
/// bench's agents never inherit them from the developer's shell: a real `SLACK_WEBHOOK_URL`
/// would get the demo's staged hang, and they reach only loopback.
const SECRET_VARS: [&str; 4] = [
    "SLACK_WEBHOOK_URL",
    "PAGERDUTY_ROUTING_KEY",
    "HEALTH_AGENT_WEBHOOK_URL",
    "DATABASE_URL",
];

/// `bin --config config serve`, logging at `level` (`HEALTH_AGENT_LOG`) into `log`: add to it
/// (environment, limits) and hand it to [`spawn_agent`].
pub fn agent_command(bin: &Path, config: &Path, log: &Path, level: &str) -> Result<Command> {
    let mut cmd = Command::new(bin);
    for var in SECRET_VARS {
        cmd.env_remove(var);
    }
    cmd.arg("--config")
        .arg(config)
        .arg("serve")
        .env("HEALTH_AGENT_LOG", level)
        .stdout(Stdio::null())
        .stderr(fs::File::create(log)?);
    Ok(cmd)
}

/// Spawns the agent `cmd` and waits until it answers `/livez` on 127.0.0.1:`port` with 200;
/// an error quoting `log` when it exits first or does not answer within `within`.
pub fn spawn_agent(cmd: &mut Command, log: &Path, port: u16, within: Duration) -> Result<Proc> {
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let mut agent = Proc(child);
    let deadline = Instant::now() + within;
    while !get(port, "/livez").is_ok_and(|(c, _)| c == 200) {
        if let Ok(Some(status)) = agent.0.try_wait() {
            bail!(
                "the agent exited ({status}): {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the agent did not answer /livez on 127.0.0.1:{port} within {within:?} — is the port in use?\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(agent)
}

/// The agent logging warnings only, up within 20 s.
pub fn start_agent(bin: &Path, config: &Path, log: &Path, port: u16) -> Result<Proc> {
    spawn_agent(
        &mut agent_command(bin, config, log, "warn")?,
        log,
        port,
        Duration::from_secs(20),
    )
}
