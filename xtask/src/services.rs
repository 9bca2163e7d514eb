//! `cargo xtask services`: the daemons the integration tests and the bench talk to, dockerd,
//! Podman's API service (rootful, and rootless as user `ha-rootless`), containerd and
//! PostgreSQL 15. These machines have no systemd, so all are started
//! directly.

use std::{
    fs::{self, OpenOptions},
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::net::UnixStream,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::{self, step, Outcome};

const DOCKERD_LOG: &str = "/var/log/dockerd.log";
const PODMAN_LOG: &str = "/var/log/podman-service.log";
const ROOTLESS_LOG: &str = "/var/log/podman-rootless-service.log";
/// The user whose rootless Podman the container tests drive (tests/src/docker.rs).
const ROOTLESS_USER: &str = "ha-rootless";
/// Its subordinate IDs: 65536 of them, above the usual range of other users'.
const ROOTLESS_SUBIDS: &str = "200000-265535";
const CONTAINERD_LOG: &str = "/var/log/containerd.log";
/// containerd's own socket, as on a Kubernetes node (not dockerd's, under /run/docker).
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// Rootful Podman's Docker-compatible API socket, where the agent looks after Docker's.
const PODMAN_SOCKET: &str = "/run/podman/podman.sock";
const CONTAINERS_CONF: &str = "/etc/containers/containers.conf";
/// runc here cannot set rlimits, and Podman asks it to unless its default ulimits are empty.
const NO_ULIMITS: &str = "default_ulimits = []";
const POSTGRES: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5432);

/// Starts what is not running; `verb` prefixes the printed lines.
pub fn run(verb: &str) -> Result<()> {
    step(verb, "dockerd", docker)?;
    step(verb, "podman API service", podman)?;
    step(verb, "rootless podman API service", podman_rootless)?;
    step(verb, "containerd", containerd)?;
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
    // dockerd takes any file at containerd's socket for a running system containerd and
    // dials it instead of starting its own; one left by a containerd that was killed would
    // stop dockerd from starting at all.
    clear_stale_socket(CONTAINERD_SOCKET)?;
    start_daemon(
        "dockerd",
        &["dockerd".into()],
        DOCKERD_LOG,
        "install docker.io (cargo xtask setup)",
        docker_up,
    )
}

/// Whether Podman's API answers `GET /_ping` with `OK` on its socket.
fn podman_up() -> bool {
    pings(PODMAN_SOCKET)
}

/// Whether the Engine API on `socket` answers `GET /_ping` with `OK`.
fn pings(socket: &str) -> bool {
    let ping = || -> std::io::Result<bool> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok(answer.starts_with("HTTP/1.") && answer.ends_with("OK"))
    };
    ping().unwrap_or(false)
}

/// `default_ulimits = []` in the `[containers]` section of containers.conf; true when written.
fn podman_conf() -> Result<bool> {
    let conf = fs::read_to_string(CONTAINERS_CONF).unwrap_or_default();
    if conf
        .lines()
        .any(|l| l.trim_start().starts_with("default_ulimits"))
    {
        return Ok(false);
    }
    let new = match conf.find("[containers]") {
        Some(at) => {
            let end = at + "[containers]".len();
            format!("{}\n{NO_ULIMITS}{}", &conf[..end], &conf[end..])
        }
        None => format!("{conf}\n[containers]\n{NO_ULIMITS}\n"),
    };
    fs::create_dir_all("/etc/containers")?;
    fs::write(CONTAINERS_CONF, new).with_context(|| format!("cannot write {CONTAINERS_CONF}"))?;
    Ok(true)
}

/// Podman's Docker-compatible API on [`PODMAN_SOCKET`], with no idle timeout, and the
/// containers.conf it needs here.
fn podman() -> Result<Outcome> {
    let wrote_conf = podman_conf()?;
    if podman_up() {
        return Ok(Outcome::Ok(if wrote_conf {
            "already running (restart it to apply containers.conf)"
        } else {
            "already running"
        }));
    }
    fs::create_dir_all("/run/podman")?;
    let url = format!("unix://{PODMAN_SOCKET}");
    let argv = ["podman", "system", "service", "--time=0", &url].map(String::from);
    start_daemon(
        "podman system service",
        &argv,
        PODMAN_LOG,
        "install podman (cargo xtask setup)",
        podman_up,
    )
}

/// Whether containerd answers `ctr version` on [`CONTAINERD_SOCKET`].
fn containerd_up() -> bool {
    cmd::succeeds(Command::new("ctr").args(["--address", CONTAINERD_SOCKET, "version"]))
}

/// containerd on [`CONTAINERD_SOCKET`], with the Debian package's config.
fn containerd() -> Result<Outcome> {
    if containerd_up() {
        return Ok(Outcome::Ok("already running"));
    }
    start_daemon(
        "containerd",
        &["containerd".into()],
        CONTAINERD_LOG,
        "install containerd (cargo xtask setup)",
        containerd_up,
    )
}

/// [`ROOTLESS_USER`] (made with its subordinate IDs and runtime directory when missing) and
/// its rootless Podman's API on /run/user/UID/podman/podman.sock, where the agent looks for it.
fn podman_rootless() -> Result<Outcome> {
    let uid = || cmd::stdout(Command::new("id").args(["-u", ROOTLESS_USER]));
    let uid = match uid() {
        Ok(u) => u,
        Err(_) => {
            cmd::run(Command::new("useradd").args(["--create-home", ROOTLESS_USER]))?;
            uid()?
        }
    };
    let uid = uid.trim().to_string();
    let has_subids = |file: &str| {
        fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&format!("{ROOTLESS_USER}:")))
    };
    if !has_subids("/etc/subuid") || !has_subids("/etc/subgid") {
        cmd::run(Command::new("usermod").args([
            "--add-subuids",
            ROOTLESS_SUBIDS,
            "--add-subgids",
            ROOTLESS_SUBIDS,
            ROOTLESS_USER,
        ]))?;
    }
    let runtime = format!("/run/user/{uid}");
    let socket = format!("{runtime}/podman/podman.sock");
    if pings(&socket) {
        return Ok(Outcome::Ok("already running"));
    }
    fs::create_dir_all(format!("{runtime}/podman"))?;
    cmd::run(Command::new("chown").args(["-R", ROOTLESS_USER, &runtime]))?;
    cmd::run(Command::new("chmod").args(["700", &runtime]))?;
    let argv = [
        "runuser",
        "-u",
        ROOTLESS_USER,
        "--",
        "env",
        &format!("XDG_RUNTIME_DIR={runtime}"),
        &format!("HOME=/home/{ROOTLESS_USER}"),
        "podman",
        "system",
        "service",
        "--time=0",
        &format!("unix://{socket}"),
    ]
    .map(String::from);
    start_daemon(
        "rootless podman system service",
        &argv,
        ROOTLESS_LOG,
        "install podman (cargo xtask setup)",
        || pings(&socket),
    )
}

/// Removes `path` if it is a socket nothing listens on (connecting is refused), as a daemon
/// that was killed leaves it; a live socket, or none, is left alone.
fn clear_stale_socket(path: &str) -> Result<()> {
    match UnixStream::connect(path) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            eprintln!("+ rm {path}  (stale: nothing listens on it)");
            fs::remove_file(path).with_context(|| format!("cannot remove stale socket {path}"))
        }
        _ => Ok(()),
    }
}

/// Starts `argv` in a session of its own (it outlives this process and the terminal that
/// started it), its output appended to `log`, and waits up to 30 s for `up`.
fn start_daemon(
    name: &str,
    argv: &[String],
    log: &str,
    install: &str,
    up: impl Fn() -> bool,
) -> Result<Outcome> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {log} — run as root"))?;
    eprintln!("+ setsid {} >>{log} 2>&1 &", argv.join(" "));
    let mut child = Command::new("setsid")
        .args(argv)
        // Not the caller's directory, which a daemon run as another user may not enter.
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {name} — {install}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if up() {
            return Ok(Outcome::Done("started"));
        }
        // setsid exits 0 at once when it has to fork; only a failure means the daemon died.
        if let Some(status) = child.try_wait()?.filter(|status| !status.success()) {
            bail!("{name} exited ({status}); the end of {log}:\n{}", tail(log));
        }
        sleep(Duration::from_millis(500));
    }
    bail!(
        "{name} did not answer within 30 s; the end of {log}:\n{}",
        tail(log)
    )
}

fn tail(path: &str) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
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
