//! Helpers for the integration tests: real processes behind RAII guards (the agent binary, the
//! fixture backend, nginx, a tmpfs mount), a tiny HTTP client, and polling with a deadline.
//! Everything talks to 127.0.0.1 only. Guards clean up on drop, so a failing test still tears
//! its servers down.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod fleet;
pub mod load;
pub mod netns;
pub mod puma;

pub use load::{timeline, HealthPoller, HealthSample, Load, LoadStats};
pub use netns::{free_port_on, get_at, http_at, netns_inode, AddrFixture, BridgeContainer, NetNs};
pub use puma::{Puma, PumaOptions, TcpProxy};

/// The workspace's target directory for this build profile (where cargo put this test).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Path of a workspace binary, built on demand if `cargo test` was run on this crate alone.
pub fn binary(name: &str, package: &str) -> PathBuf {
    let path = target_dir().join(name);
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build -p {package} failed");
    }
    path
}

pub fn agent_binary() -> PathBuf {
    let bin = binary("health-agent", "health-agent");
    assert_fresh(
        &bin,
        &["health-agent", "health-common", "health-agent-ebpf"],
    );
    bin
}

/// Newest modification time of the files under `dir`.
fn newest(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                newest = newest.max(m);
            }
        }
    }
    newest
}

/// `cargo test -p health-agent-tests` does not rebuild the agent: refuse to test old code.
fn assert_fresh(bin: &Path, crates: &[&str]) {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .expect("binary mtime");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for c in crates {
        let src = root.join(c).join("src");
        assert!(
            newest(&src) <= built,
            "{} is older than {}: run `cargo build --bins` (cargo xtask test does) before these tests",
            bin.display(),
            src.display()
        );
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Integration tests need root (eBPF, mounts); say so plainly instead of failing obscurely.
pub fn require_root() {
    assert!(
        is_root(),
        "this integration test needs root (eBPF programs, tmpfs mounts); run `cargo xtask test` as root"
    );
}

/// One HTTP/1.1 request; returns (status, headers, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad response: {head:?}"),
            )
        })?;
    Ok((status, head.to_string(), body.to_string()))
}

pub fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http(port, "GET", path, &[], Duration::from_secs(5)).map(|(c, _, b)| (c, b))
}

/// Polls `f` every 100 ms until it returns Some, or panics after `timeout` with `what`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn kill_and_wait(child: &mut Child, signal: i32) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, signal) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The agent binary running `serve` with a config written for the test.
pub struct Agent {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Agent {
    /// Starts `health-agent serve` with `extra` TOML appended to a base config that listens on
    /// a free loopback port, shows full details, and has no boot grace.
    pub fn start(extra: &str) -> Self {
        Self::start_with_env(extra, &[])
    }

    pub fn start_with_env(extra: &str, env: &[(&str, &str)]) -> Self {
        Self::start_under(&[], extra, env)
    }

    /// Like `start_with_env`, with the agent run by `wrapper` (e.g. `setpriv --bounding-set
    /// ... --`), which must exec it: `pid` is the wrapper's.
    pub fn start_under(wrapper: &[&str], extra: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("health-agent.toml");
        let base = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\ndetails = \"always\"\n\n[checks]\nboot_grace = \"0s\"\n"
        );
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
        let child = command
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .envs(env.iter().copied())
            .env("HEALTH_AGENT_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("starting health-agent");
        let mut agent = Self {
            child,
            port,
            dir,
            log,
        };
        wait_until(Duration::from_secs(20), "the agent to serve /livez", || {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!("health-agent exited with {status}:\n{}", agent.logs());
            }
            get(port, "/livez").ok().filter(|(c, _)| *c == 200)
        });
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// (HTTP code, JSON body) of `GET /health`.
    pub fn health(&self) -> (u16, Value) {
        let (code, body) = get(self.port, "/health").expect("GET /health");
        let json = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/health body is not JSON ({e}): {body}"));
        (code, json)
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

    /// Sends SIGTERM and returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not stop within 10s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        kill_and_wait(&mut self.child, libc::SIGTERM);
    }
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

/// The fixture backend (tests/src/bin/fixture-backend.rs), switched through its control port.
pub struct Fixture {
    child: Child,
    pub port: u16,
    pub control: u16,
}

impl Fixture {
    pub fn start(mode: &str) -> Self {
        Self::start_with(mode, &[])
    }

    /// With extra arguments, e.g. `["--workers", "1"]`. A port taken between `free_port` and
    /// the bind (tests run in parallel) makes the fixture exit: then it retries on new ports.
    pub fn start_with(mode: &str, extra: &[&str]) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let control = free_port();
            let mut child = Command::new(binary("fixture-backend", "health-agent-tests"))
                .args([
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--control",
                    &format!("127.0.0.1:{control}"),
                    "--mode",
                    mode,
                ])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting fixture-backend");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if get(control, "/mode").is_ok() {
                    return Self {
                        child,
                        port,
                        control,
                    };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("fixture-backend did not start on 5 tries");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) = get(self.control, &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A stopped process must be continued before it can act on SIGTERM.
        self.signal(libc::SIGCONT);
        kill_and_wait(&mut self.child, libc::SIGTERM);
    }
}

/// nginx (Debian package) serving a static body on a loopback port, in the foreground.
pub struct Nginx {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Nginx {
    pub fn start(body: &[u8]) -> Self {
        Self::start_with(body, "")
    }

    /// `extra` goes into the `http` block.
    pub fn start_with(body: &[u8], extra: &str) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("www");
        std::fs::create_dir_all(&root).expect("www dir");
        std::fs::write(root.join("index.html"), body).expect("body");
        std::fs::write(root.join("up"), b"ok\n").expect("up");
        let d = dir.path().display();
        let conf = format!(
            "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n  fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n  scgi_temp_path {d}/tmp;\n  keepalive_requests 100000;\n  {extra}\n\
             server {{\n    listen 127.0.0.1:{port} backlog=512;\n    root {root};\n    location / {{ default_type text/plain; }}\n  }}\n}}\n",
            root = root.display()
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nginx — install Debian's nginx-light (cargo xtask setup does)");
        wait_until(Duration::from_secs(10), "nginx to answer", || {
            get(port, "/up").ok().filter(|(c, _)| *c == 200)
        });
        Self { child, port, dir }
    }

    /// Pids of the master and its workers.
    pub fn pids(&self) -> Vec<u32> {
        let master = self.child.id();
        let mut pids = vec![master];
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        pids
    }

    pub fn signal_all(&self, sig: i32) {
        for p in self.pids() {
            // SAFETY: signalling nginx processes we started.
            unsafe { libc::kill(p as i32, sig) };
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.signal_all(libc::SIGCONT);
        kill_and_wait(&mut self.child, libc::SIGQUIT);
    }
}

/// A small tmpfs mounted on a temp dir, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs failed (needs root)");
        Self {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Opens `n` connections, sends one request on each and reads the full answer.
pub fn requests(port: u16, n: usize, path: &str) -> usize {
    (0..n)
        .filter(|_| get(port, path).is_ok_and(|(c, _)| c == 200))
        .count()
}

/// Starts `n` connections in the background that send a request and wait (up to `hold`) for an
/// answer; returns their threads.
pub fn background_requests(
    port: u16,
    n: usize,
    hold: Duration,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let _ = http(port, "GET", "/", &[], hold);
            })
        })
        .collect()
}

/// The web counters from a full /health body.
pub fn counters(body: &Value) -> &Value {
    &body["details"]["web"]["counters"]
}

/// The `FROM scratch` image holding a statically linked fixture backend, built once per test
/// process. Images cannot be pulled here, so it is imported from a tarball of the one binary.
pub fn fixture_image() -> &'static str {
    static IMAGE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    const TAG: &str = "health-agent-fixture:test";
    IMAGE.get_or_init(|| {
        // A separate target dir: the outer `cargo test` may hold the main one's lock.
        let static_dir = target_dir().join("..").join("static");
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "-p",
                "health-agent-tests",
                "--bin",
                "fixture-backend",
                "--target",
                "x86_64-unknown-linux-gnu",
            ])
            .env("CARGO_TARGET_DIR", &static_dir)
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build for the static fixture");
        assert!(
            status.success(),
            "building the static fixture-backend failed"
        );
        let bin = static_dir.join("x86_64-unknown-linux-gnu/release/fixture-backend");
        let ctx = tempfile::tempdir().expect("tempdir");
        std::fs::copy(&bin, ctx.path().join("fixture-backend")).expect("copying fixture");
        let tar = ctx.path().join("rootfs.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(ctx.path())
            .arg("-cf")
            .arg(&tar)
            .arg("fixture-backend")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "tar failed");
        let out = Command::new("docker")
            .args(["import", "--change", "ENTRYPOINT [\"/fixture-backend\"]"])
            .arg(&tar)
            .arg(TAG)
            .output()
            .expect("running docker import (is dockerd running? cargo xtask services starts it)");
        assert!(
            out.status.success(),
            "docker import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    TAG
}

/// Runs `docker` with `args` and returns stdout; panics with stderr on failure.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("running docker");
    assert!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A container of the fixture image on the host network (it listens on 127.0.0.1 only),
/// removed on drop.
pub struct Container {
    pub name: String,
    pub port: u16,
}

impl Container {
    /// `fixture_args` go to the fixture backend after `--listen 127.0.0.1:<port>`.
    pub fn run(label: &str, fixture_args: &[&str]) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("ha-test-{label}-{}-{n}", std::process::id());
        let port = free_port();
        let image = fixture_image();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "host",
            image,
            "--listen",
            &listen,
        ];
        args.extend_from_slice(fixture_args);
        docker(&args);
        Self { name, port }
    }

    pub fn wait_serving(&self) {
        wait_until(Duration::from_secs(15), "the container to serve", || {
            get(self.port, "/up").ok().filter(|(c, _)| *c == 200)
        });
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Responder = dyn Fn(&Recorded, &[Recorded]) -> (u16, String) + Send + Sync;

/// A local HTTP server standing in for Slack, PagerDuty, GitHub or a webhook (this network
/// reaches none of them): records every request and answers through `respond`, which also
/// sees everything recorded before (so it can keep state, like GitHub's issue list).
pub struct Receiver {
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Recorded>>>,
}

impl Receiver {
    pub fn start(
        respond: impl Fn(&Recorded, &[Recorded]) -> (u16, String) + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a receiver");
        let port = listener.local_addr().expect("addr").port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let respond: std::sync::Arc<Responder> = std::sync::Arc::new(respond);
        let s = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, respond) = (s.clone(), respond.clone());
                std::thread::spawn(move || serve_receiver(stream, &s, &*respond));
            }
        });
        Self { port, seen }
    }

    /// Answers 200 `{}` to everything.
    pub fn ok() -> Self {
        Self::start(|_, _| (200, "{}".into()))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Requests other than GETs (what was delivered).
    pub fn posts(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }
}

fn serve_receiver(
    mut stream: TcpStream,
    seen: &std::sync::Mutex<Vec<Recorded>>,
    respond: &Responder,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let mut lines = head.lines();
        let mut first = lines.next().unwrap_or("").split_whitespace();
        let method = first.next().unwrap_or("").to_string();
        let path = first.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + len {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or(Value::Null);
        buf.drain(..end + 4 + len);
        let rec = Recorded {
            method,
            path,
            headers,
            body,
        };
        let (code, reply) = {
            let mut all = match seen.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
            let answer = respond(&rec, &all);
            all.push(rec);
            answer
        };
        let resp = format!(
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if stream.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// A private PostgreSQL 15 server (Debian's binaries) on its own port and data directory, with
/// password authentication, so a test may stop and start it without touching anyone else's.
pub struct Postgres {
    pub port: u16,
    pub password: String,
    dir: tempfile::TempDir,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn as_postgres(args: &[&str]) -> std::process::Output {
    // By path: /usr/sbin is not on every PATH.
    let runuser = ["/usr/sbin/runuser", "/sbin/runuser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("runuser");
    Command::new(runuser)
        .args(["-u", "postgres", "--"])
        .args(args)
        .output()
        .expect("running runuser (PostgreSQL is installed by cargo xtask setup)")
}

impl Postgres {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pw");
        let password = format!("pw-{}", std::process::id());
        std::fs::write(&pwfile, &password).expect("pwfile");
        let chown = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(chown.success());
        let out = as_postgres(&[
            &format!("{PG_BIN}/initdb"),
            "-D",
            data.to_str().expect("utf-8 path"),
            "-U",
            "postgres",
            "--auth=scram-sha-256",
            "--pwfile",
            pwfile.to_str().expect("utf-8 path"),
        ]);
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = Self {
            port: free_port(),
            password,
            dir,
        };
        pg.resume();
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts (again) on the same port and waits until it accepts connections.
    pub fn resume(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("pg.log");
        let out = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            &self.data(),
            "-o",
            &opts,
            "-l",
            log.to_str().expect("utf-8 path"),
            "-w",
            "start",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    pub fn stop(&self) {
        let out = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            &self.data(),
            "-m",
            "fast",
            "-w",
            "stop",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            &self.data(),
            "-m",
            "immediate",
            "stop",
        ]);
    }
}
