//! The agent binary running `serve` with a config written for the test, on 127.0.0.1 or on any
//! address of the test's choosing (the fleet tests put agents on 127.0.0.2, 127.0.0.3, … so
//! that two of them can share a port, the way a fleet's hosts do).

use std::{
    io,
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{agent_binary, free_port, request_at, wait_until, Proc};

/// The variables the agent takes secrets from by default, or that `check` reads
/// (docs/configuration.md, "Secrets from the environment"). No agent of a test inherits them
/// from the shell running the suite: a developer's own `SLACK_WEBHOOK_URL` would get the
/// test's alerts, and tests reach only 127.0.0.0/8. A test that wants one passes it.
pub const SECRET_VARS: [&str; 4] = [
    "SLACK_WEBHOOK_URL",
    "PAGERDUTY_ROUTING_KEY",
    "HEALTH_AGENT_WEBHOOK_URL",
    "DATABASE_URL",
];

/// The agent binary running `serve`. Dropping it stops it (SIGTERM).
pub struct Agent {
    child: Proc,
    /// The port of `addr`.
    pub port: u16,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    /// When the process was spawned: what the boot grace counts from, and so the clock of a
    /// test that times the boot ([`crate::HealthPoller::start_from`]).
    pub started: Instant,
}

impl Agent {
    /// Starts `health-agent serve` with `extra` TOML appended to a base config that listens on
    /// a free loopback port, shows full details, and has no boot grace.
    pub fn start(extra: &str) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// [`Agent::start`] watching the web backend on `port`, with `extra` merged in.
    pub fn on_port(port: u16, extra: &str) -> Self {
        Self::start(&merge_toml(&format!("[web]\nport = {port}\n"), extra))
    }

    pub fn start_with_env(extra: &str, env: &[(&str, &str)]) -> Self {
        Self::start_under(&[], extra, env)
    }

    /// Like `start_with_env`, with the agent run by `wrapper` (e.g. `setpriv --bounding-set
    /// ... --`), which must exec it: `pid` is the wrapper's.
    pub fn start_under(wrapper: &[&str], extra: &str, env: &[(&str, &str)]) -> Self {
        let addr = ([127, 0, 0, 1], free_port()).into();
        Self::launch(wrapper, addr, extra, env)
    }

    /// On a chosen address (`127.0.0.2:PORT`, say). The port is not retried: other agents'
    /// configs name it (pick it with [`crate::free_port_on_all`] right before).
    pub fn start_at(addr: SocketAddr, extra: &str, env: &[(&str, &str)]) -> Self {
        Self::launch(&[], addr, extra, env)
    }

    /// [`Agent::start_at`] in a UTS namespace of its own whose host name is `hostname`: one
    /// host of a fleet, as its alerts name it (`unshare --uts`, then `hostname`).
    pub fn start_named(
        addr: SocketAddr,
        hostname: &str,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let wrapper = [
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            "hostname \"$0\" && exec \"$@\"",
            hostname,
        ];
        Self::launch(&wrapper, addr, extra, env)
    }

    /// Like [`Agent::start_with_env`], with `$JOURNAL_STREAM` naming the agent's stderr (its
    /// log file) as systemd names the journal stream it connects: `"<dev>:<ino>"`.
    pub fn start_journaled(extra: &str, env: &[(&str, &str)]) -> Self {
        let addr = ([127, 0, 0, 1], free_port()).into();
        Self::launch_logged(&[], addr, extra, env, true)
    }

    /// Writes the config, starts the agent and waits until it serves `/livez` on `addr`.
    fn launch(wrapper: &[&str], addr: SocketAddr, extra: &str, env: &[(&str, &str)]) -> Self {
        Self::launch_logged(wrapper, addr, extra, env, false)
    }

    fn launch_logged(
        wrapper: &[&str],
        addr: SocketAddr,
        extra: &str,
        env: &[(&str, &str)],
        journaled: bool,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("health-agent.toml");
        let mut base = format!(
            "[server]\nlisten = \"{addr}\"\ndetails = \"always\"\n\n[checks]\nboot_grace = \"0s\"\n"
        );
        // A test about something else must not turn `degraded` because the machine running it
        // has a fullish disk or busy cores (other suites' load generators, a build): unless
        // the test sets them, the host's disk and CPU/memory thresholds are out of reach, and so
        // is `scaling.up_at`: saturation's host-CPU part would ask for `scale_up`.
        if !extra.contains("[disk]") {
            base.push_str("\n[disk]\nwarn_percent = 99.0\nfail_percent = 99.9\n");
        }
        // The drain's control socket and state file in the agent's own directory, never the
        // defaults under /run and /var/lib: agents of tests running side by side would fight
        // over one socket, and a drain kept on disk would outlive the test.
        base.push_str(&format!(
            "\n[drain]\ncontrol_socket = \"{}\"\nstate_file = \"{}\"\n",
            dir.path().join("control.sock").display(),
            dir.path().join("drain.json").display()
        ));
        if !extra.contains("[scaling]") {
            base.push_str(
                "\n[scaling]\ncpu_high_percent = 100.0\nmemory_high_percent = 100.0\nup_at = 10.0\n",
            );
        }
        // The whole suite can run with the connection programs attached only on suspicion
        // (`HEALTH_AGENT_TESTS_SOCKET_TRACING=on_suspicion`), and in a kernel-view tier forced
        // lower than this kernel offers (`HEALTH_AGENT_TESTS_KERNEL_TIER=sock_diag`, the
        // judgement on Linux 5.10–6.2, or `no_ebpf`), each wherever a test does not set it.
        let mut web = String::new();
        for (var, key) in [
            ("HEALTH_AGENT_TESTS_SOCKET_TRACING", "socket_tracing"),
            ("HEALTH_AGENT_TESTS_KERNEL_TIER", "kernel_tier"),
        ] {
            if let Ok(value) = std::env::var(var) {
                if !extra.contains(key) {
                    web.push_str(&format!("{key} = \"{value}\"\n"));
                }
            }
        }
        if !web.is_empty() {
            base.push_str(&format!("\n[web]\n{web}"));
        }
        std::fs::write(&config, merge_toml(&base, extra)).expect("writing config");
        let log = dir.path().join("agent.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut command = match wrapper.split_first() {
            None => Command::new(agent_binary()),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(agent_binary());
                c
            }
        };
        for var in SECRET_VARS {
            command.env_remove(var);
        }
        // Run under systemd, the suite's own shell may carry one: no agent inherits it.
        command.env_remove("JOURNAL_STREAM");
        if journaled {
            use std::os::unix::fs::MetadataExt;
            let meta = log_file.metadata().expect("the log file's inode");
            command.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        }
        // Nor the AWS credential chain of the machine running the suite: no AWS_* variable, no
        // ~/.aws files (a test that wants them passes them).
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("AWS_") {
                command.env_remove(var);
            }
        }
        let no_file = dir.path().join("no-aws-file");
        command
            .env("AWS_CONFIG_FILE", &no_file)
            .env("AWS_SHARED_CREDENTIALS_FILE", &no_file);
        // Every agent of a test holds the fleet key, as a fleet's members do; a test that wants
        // another key, or none, passes the variable itself.
        command.env(crate::trust::KEY_VAR, crate::trust::FLEET_KEY);
        let started = Instant::now();
        let child = command
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .envs(env.iter().copied())
            // HEALTH_AGENT_TEST_LOG=debug: the agents' logs in a failing test's output say more.
            .env(
                "HEALTH_AGENT_LOG",
                std::env::var("HEALTH_AGENT_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("starting health-agent");
        // Dropped (stopped) if the wait below panics.
        let mut agent = Self {
            child: Proc(child),
            port: addr.port(),
            addr,
            dir,
            log,
            started,
        };
        wait_until(
            Duration::from_secs(20),
            &format!("the agent to serve /livez on {addr}"),
            || {
                if let Ok(Some(status)) = agent.child.0.try_wait() {
                    panic!(
                        "health-agent on {addr} exited with {status}:\n{}\nconfig:\n{}",
                        agent.logs(),
                        agent.config()
                    );
                }
                agent.get("/livez").ok().filter(|(c, _)| *c == 200)
            },
        );
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Sends `sig` (SIGKILL: the agent dies with no clean-up of its own).
    pub fn signal(&self, sig: i32) {
        self.child.signal(sig);
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The config file it was started with, for commands that talk to it (`drain`).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("health-agent.toml")
    }

    /// The config file's text.
    pub fn config(&self) -> String {
        std::fs::read_to_string(self.config_path()).unwrap_or_default()
    }

    /// `GET path` with a 5 s timeout: (status, body).
    pub fn get(&self, path: &str) -> io::Result<(u16, String)> {
        request_at(self.addr, "GET", path, &[], Duration::from_secs(5)).map(|(c, _, b)| (c, b))
    }

    /// (HTTP code, JSON body) of `GET /health`.
    pub fn health(&self) -> (u16, Value) {
        let (code, body) = self
            .get("/health")
            .unwrap_or_else(|e| panic!("GET /health on {}: {e}", self.addr));
        let json = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/health body is not JSON ({e}): {body}"));
        (code, json)
    }

    /// `GET /fleet/v1/view`, with `Authorization: <authorization>` when given: (status, body).
    pub fn view(&self, authorization: Option<&str>) -> io::Result<(u16, String)> {
        let headers: Vec<(&str, &str)> = authorization
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        request_at(
            self.addr,
            "GET",
            "/fleet/v1/view",
            &headers,
            Duration::from_secs(5),
        )
        .map(|(c, _, b)| (c, b))
    }

    /// `GET /fleet/v1/view` asked as a peer holding the harness's fleet key does: the status,
    /// and the body when its proof answers this ask (else the status and an error).
    pub fn view_proven(&self) -> io::Result<(u16, String)> {
        crate::trust::ask_view(self.addr, crate::trust::FLEET_KEY)
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        match self.get("/metrics") {
            Ok((200, text)) => text,
            other => panic!("GET /metrics on {}: {other:?}", self.addr),
        }
    }

    /// Polls /health until `pred` holds; panics with the last answer and the agent log.
    pub fn wait_health(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(u16, &Value) -> bool,
    ) -> (u16, Value) {
        let deadline = Instant::now() + timeout;
        let mut last = (0, Value::Null);
        while Instant::now() < deadline {
            last = self.health();
            if pred(last.0, &last.1) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out after {timeout:?} waiting for {what}; last /health: {} {}\nagent log:\n{}",
            last.0,
            serde_json::to_string_pretty(&last.1).unwrap_or_default(),
            self.logs()
        );
    }

    /// None of `secrets` shows in `/health`, `/metrics` or the log.
    pub fn assert_shows_none(&self, secrets: &[&str]) {
        let (_, body) = self.get("/health").expect("GET /health");
        let metrics = self.metrics();
        let logs = self.logs();
        for s in secrets {
            assert!(!body.contains(s), "/health shows a credential: {body}");
            assert!(!metrics.contains(s), "/metrics shows a credential");
            assert!(!logs.contains(s), "the log shows a credential:\n{logs}");
        }
    }

    /// [`Agent::wait_health`] for 200 with the web server `up`.
    pub fn wait_up(&self, timeout: Duration, what: &str) -> (u16, Value) {
        self.wait_health(timeout, what, |c, b| {
            c == 200 && b["checks"]["webserver"] == "up"
        })
    }

    /// SIGKILL: the agent dies on the spot, as in a crash or a lost host (nothing flushed).
    pub fn kill(&self) {
        self.child.signal(libc::SIGKILL);
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate(Duration::from_secs(10))
            .expect("agent did not stop within 10s of SIGTERM")
    }

    /// SIGTERM, as `systemctl stop` (and `restart`) sends it: the exit status, or None if the
    /// agent still runs after `within`.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.child.signal(libc::SIGTERM);
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.0.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `health-agent check --json` on a config of `toml` (written to a temporary file): its exit
/// code and the JSON it printed.
pub fn check_json(toml: &str) -> (Option<i32>, Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("check.toml");
    std::fs::write(&cfg, toml).expect("writing the config");
    let mut command = std::process::Command::new(agent_binary());
    for var in SECRET_VARS {
        command.env_remove(var);
    }
    let out = command
        .arg("--config")
        .arg(&cfg)
        .args(["check", "--json"])
        .output()
        .expect("running health-agent check");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code(), v)
}

/// Appends `extra` to `base`, merging tables that appear in both (TOML forbids repeating a
/// table header).
pub fn merge_toml(base: &str, extra: &str) -> String {
    let mut doc: toml_edit::DocumentMut = base.parse().expect("base config");
    let extra: toml_edit::DocumentMut = extra.parse().expect("extra config is valid TOML");
    for (k, v) in extra.iter() {
        match (doc.get_mut(k), v) {
            (Some(toml_edit::Item::Table(t)), toml_edit::Item::Table(e)) => {
                for (ek, ev) in e.iter() {
                    t.insert(ek, ev.clone());
                }
            }
            _ => {
                doc.insert(k, v.clone());
            }
        }
    }
    doc.to_string()
}
