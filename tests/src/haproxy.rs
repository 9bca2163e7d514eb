//! Real HAProxy (Debian's package) as a child process on a config written for the test, with
//! its stats socket: what each server's state and weight are, as HAProxy sees them.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use crate::{succeed, wait_until, Logged};

/// HAProxy on a temporary config, killed on drop. Its output goes to `haproxy.log` in its temp
/// dir ([`Haproxy::logs`]).
pub struct Haproxy {
    process: Logged,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

/// One server's line of `show stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerState {
    pub backend: String,
    pub server: String,
    /// `UP`, `DOWN`, `DRAIN`, `MAINT`, or a transition such as `UP 1/2`.
    pub status: String,
    /// The effective weight: the configured one scaled by the agent check's percentage.
    pub weight: u32,
}

impl ServerState {
    /// Taking new requests: up, with a weight (an agent's `drain` sets 0, shown as `DRAIN`).
    pub fn in_rotation(&self) -> bool {
        self.status == "UP" && self.weight > 0
    }
}

impl Haproxy {
    /// Checks `config` (`haproxy -c`), to which a `global` section with an admin stats socket
    /// is prepended, starts HAProxy in the foreground and waits until its socket answers.
    pub fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("stats.sock");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n    stats socket {} mode 600 level admin\n{config}",
                socket.display()
            ),
        )
        .expect("writing haproxy.cfg");
        succeed(Command::new("haproxy").arg("-c").arg("-f").arg(&cfg));
        let process = Logged::spawn(
            Command::new("haproxy").arg("-db").arg("-f").arg(&cfg),
            dir.path().join("haproxy.log"),
            "haproxy",
        );
        let h = Self {
            process,
            socket,
            _dir: dir,
        };
        wait_until(Duration::from_secs(10), "haproxy's stats socket", || {
            h.states().ok().filter(|s| !s.is_empty())
        });
        h
    }

    /// Every server of every backend, from `show stat` (the FRONTEND and BACKEND lines left
    /// out).
    pub fn states(&self) -> std::io::Result<Vec<ServerState>> {
        let mut s = UnixStream::connect(&self.socket)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"show stat\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let mut lines = out.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (Some(px), Some(sv), Some(st), Some(w)) =
            (col("pxname"), col("svname"), col("status"), col("weight"))
        else {
            return Ok(Vec::new());
        };
        Ok(lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > st.max(w) && f[sv] != "FRONTEND" && f[sv] != "BACKEND")
            .map(|f| ServerState {
                backend: f[px].to_owned(),
                server: f[sv].to_owned(),
                status: f[st].to_owned(),
                weight: f[w].parse().unwrap_or(0),
            })
            .collect())
    }

    /// `server` of `backend`; panics when HAProxy does not list it.
    pub fn state(&self, backend: &str, server: &str) -> ServerState {
        self.states()
            .expect("haproxy stats")
            .into_iter()
            .find(|s| s.backend == backend && s.server == server)
            .unwrap_or_else(|| panic!("no server {server} in {backend}"))
    }

    /// Everything HAProxy printed so far (its alerts: a server going down and why).
    pub fn logs(&self) -> String {
        self.process.logs()
    }
}
