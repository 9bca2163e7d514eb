//! `cargo xtask services`: the daemons the integration tests and the bench talk to, dockerd and
//! PostgreSQL 15. These machines have no systemd, so both are started directly.

use std::{
    fs::{self, OpenOptions},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::{self, step, Outcome};

const DOCKERD_LOG: &str = "/var/log/dockerd.log";
const POSTGRES: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5432);

/// Starts what is not running; `verb` prefixes the printed lines.
pub fn run(verb: &str) -> Result<()> {
    step(verb, "dockerd", docker)?;
    step(verb, "postgresql 15", postgres)
}

/// Starts dockerd if it is not running.
pub fn dockerd(verb: &str) -> Result<()> {
    step(verb, "dockerd", docker)
}

fn docker_up() -> bool {
    cmd::succeeds(Command::new("docker").arg("info"))
}

fn docker() -> Result<Outcome> {
    if docker_up() {
        return Ok(Outcome::Ok("already running"));
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(DOCKERD_LOG)
        .with_context(|| format!("cannot open {DOCKERD_LOG} — run as root"))?;
    eprintln!("+ setsid dockerd >>{DOCKERD_LOG} 2>&1 &");
    // Its own session: dockerd outlives this process and the terminal that started it.
    let mut child = Command::new("setsid")
        .arg("dockerd")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start dockerd — install docker.io (cargo xtask setup)")?;

    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if docker_up() {
            return Ok(Outcome::Done("started"));
        }
        // setsid exits 0 at once when it has to fork; only a failure means dockerd died.
        if let Some(status) = child.try_wait()?.filter(|status| !status.success()) {
            bail!(
                "dockerd exited ({status}); the end of {DOCKERD_LOG}:\n{}",
                log_tail()
            );
        }
        sleep(Duration::from_millis(500));
    }
    bail!(
        "dockerd did not answer `docker info` within 30 s; the end of {DOCKERD_LOG}:\n{}",
        log_tail()
    )
}

fn log_tail() -> String {
    let log = fs::read_to_string(DOCKERD_LOG).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

fn postgres_up() -> bool {
    TcpStream::connect_timeout(&POSTGRES, Duration::from_secs(1)).is_ok()
}

fn postgres() -> Result<Outcome> {
    if postgres_up() {
        return Ok(Outcome::Ok("already running"));
    }
    let clusters = cmd::stdout(Command::new("pg_lsclusters").arg("--no-header"))
        .context("pg_lsclusters failed — install postgresql (cargo xtask setup)")?;
    let exists = clusters
        .lines()
        .any(|line| line.split_whitespace().take(2).eq(["15", "main"]));
    let done = if exists {
        cmd::run(Command::new("pg_ctlcluster").args(["15", "main", "start"]))?;
        "started cluster 15/main"
    } else {
        cmd::run(Command::new("pg_createcluster").args(["15", "main", "--start"]))?;
        "created and started cluster 15/main"
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !postgres_up() {
        if Instant::now() > deadline {
            bail!(
                "cluster 15/main is up but nothing answers on {POSTGRES} — check `port` in \
                 /etc/postgresql/15/main/postgresql.conf and \
                 /var/log/postgresql/postgresql-15-main.log"
            );
        }
        sleep(Duration::from_millis(250));
    }
    Ok(Outcome::Done(done))
}
