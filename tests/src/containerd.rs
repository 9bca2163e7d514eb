//! The fixture backend as a containerd container, driven by `ctr` on containerd's own socket
//! (`cargo xtask services` starts containerd there, as on a Kubernetes node): the image saved
//! from Docker and imported into each namespace once per test process, containers on the host
//! network listening on 127.0.0.1 only, removed on drop.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use crate::{fixture_image, free_port, get, netns::left_by_dead_process, stdout_of};

/// containerd's own socket (dockerd's containerd, under /run/docker, is another one).
pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// The fixture image as containerd names an image imported from `docker save`.
const IMAGE: &str = "docker.io/library/health-agent-fixture:test";

const PREFIX: &str = "ha-test-ctr-";

/// Runs `ctr` in `namespace` with `args` and returns stdout; panics with stderr on failure.
pub fn ctr(namespace: &str, args: &[&str]) -> String {
    stdout_of(
        Command::new("ctr")
            .args(["--address", SOCKET, "--namespace", namespace])
            .args(args),
    )
}

/// The fixture image in `namespace`, imported once per test process (images are per namespace).
fn image_in(namespace: &str) -> &'static str {
    static IMPORTED: OnceLock<Mutex<HashMap<String, ()>>> = OnceLock::new();
    let mut done = IMPORTED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !done.contains_key(namespace) {
        let dir = tempfile::tempdir().expect("tempdir");
        let tar = dir.path().join("fixture.tar");
        stdout_of(
            Command::new("docker")
                .args(["save", "-o"])
                .arg(&tar)
                .arg(fixture_image()),
        );
        ctr(namespace, &["images", "import", tar.to_str().unwrap()]);
        sweep(namespace);
        done.insert(namespace.to_string(), ());
    }
    IMAGE
}

/// Containers of test processes that died without removing theirs.
fn sweep(namespace: &str) {
    for id in ctr(namespace, &["containers", "list", "--quiet"]).lines() {
        if left_by_dead_process(id, PREFIX) {
            remove(namespace, id);
        }
    }
}

fn remove(namespace: &str, id: &str) {
    for args in [
        &["tasks", "delete", "--force", id][..],
        &["containers", "delete", id][..],
    ] {
        let _ = Command::new("ctr")
            .args(["--address", SOCKET, "--namespace", namespace])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A fixture container in containerd, removed (task and container) on drop.
pub struct CtrContainer {
    pub namespace: String,
    /// containerd's ID for it (`ha-test-ctr-<pid>-<n>-<label>`).
    pub id: String,
    pub port: u16,
}

impl CtrContainer {
    /// Runs the fixture with `fixture_args` after `--listen 127.0.0.1:<port>`, with `labels`.
    pub fn run(
        namespace: &str,
        label: &str,
        labels: &[(&str, &str)],
        fixture_args: &[&str],
    ) -> Self {
        Self::run_on_port(namespace, label, labels, free_port(), fixture_args)
    }

    /// [`CtrContainer::run`] on `port`: a replacement for a container that served there.
    pub fn run_on_port(
        namespace: &str,
        label: &str,
        labels: &[(&str, &str)],
        port: u16,
        fixture_args: &[&str],
    ) -> Self {
        Self::start(namespace, label, labels, port, fixture_args, true)
    }

    /// [`CtrContainer::run`] in a network namespace of its own, as a pod's container has one:
    /// nothing but its loopback, so only what enters the namespace reaches it.
    pub fn run_isolated(namespace: &str, label: &str, labels: &[(&str, &str)]) -> Self {
        Self::start(namespace, label, labels, free_port(), &[], false)
    }

    fn start(
        namespace: &str,
        label: &str,
        labels: &[(&str, &str)],
        port: u16,
        fixture_args: &[&str],
        host_network: bool,
    ) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = format!("{PREFIX}{}-{n}-{label}", std::process::id());
        let image = image_in(namespace);
        let listen = format!("127.0.0.1:{port}");
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut args = vec!["run", "--detach"];
        if host_network {
            args.push("--net-host");
        }
        for l in &labels {
            args.extend(["--label", l.as_str()]);
        }
        args.extend([image, id.as_str(), "/fixture-backend", "--listen", &listen]);
        args.extend_from_slice(fixture_args);
        ctr(namespace, &args);
        Self {
            namespace: namespace.to_string(),
            id,
            port,
        }
    }

    /// [`CtrContainer::run`], then waits until `GET /up` answers 200; a container whose port
    /// was taken in between is removed and run again on a new one (5 tries).
    pub fn serving(
        namespace: &str,
        label: &str,
        labels: &[(&str, &str)],
        fixture_args: &[&str],
    ) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let c = Self::run(namespace, label, labels, fixture_args);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if get(c.port, "/up").is_ok_and(|(code, _)| code == 200) {
                    return c;
                }
                let status = c.status();
                if status != "RUNNING" && status != "CREATED" {
                    last = format!("{} {status} before serving", c.id);
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} on 127.0.0.1:{} ({status}) did not serve in 30 s",
                    c.id,
                    c.port
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("the fixture container never served after 5 tries; last: {last}");
    }

    /// Its task's status as `ctr tasks list` prints it (RUNNING, STOPPED, PAUSED…); "" when it
    /// has no task.
    pub fn status(&self) -> String {
        ctr(&self.namespace, &["tasks", "list"])
            .lines()
            .find_map(|l| {
                let mut cols = l.split_whitespace();
                (cols.next() == Some(self.id.as_str()))
                    .then(|| cols.nth(1).unwrap_or("").to_string())
            })
            .unwrap_or_default()
    }

    /// Its task's main process on the host; None without a running task.
    pub fn pid(&self) -> Option<u32> {
        ctr(&self.namespace, &["tasks", "list"])
            .lines()
            .find_map(|l| {
                let mut cols = l.split_whitespace();
                (cols.next() == Some(self.id.as_str())).then(|| cols.next()?.parse().ok())?
            })
            .filter(|&p| p > 0)
    }

    /// SIGKILL to every process of its task.
    pub fn kill(&self) {
        ctr(
            &self.namespace,
            &["tasks", "kill", "--all", "--signal", "SIGKILL", &self.id],
        );
    }
}

impl Drop for CtrContainer {
    fn drop(&mut self) {
        remove(&self.namespace, &self.id);
    }
}
