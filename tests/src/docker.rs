//! The fixture backend as a Docker container: the image (built once per test process), on the
//! host network ([`Container`]) or on Docker's default bridge network published on 127.0.0.1
//! only ([`BridgeContainer`]).

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use crate::{
    free_port, get, get_at, netns::left_by_dead_process, netns_inode, stdout_of, succeed,
    target_dir,
};

/// A container engine the tests drive through its CLI, and the agent through its
/// Docker-compatible Engine API socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Docker,
    /// Rootful Podman: `podman system service` on /run/podman/podman.sock (`cargo xtask services`).
    Podman,
    /// Rootless Podman: user [`ROOTLESS_USER`]'s `podman system service` on
    /// /run/user/UID/podman/podman.sock (`cargo xtask services` makes the user and starts it).
    PodmanRootless,
}

/// The user whose rootless Podman the tests drive.
pub const ROOTLESS_USER: &str = "ha-rootless";

/// [`ROOTLESS_USER`]'s UID.
fn rootless_uid() -> u32 {
    static UID: OnceLock<u32> = OnceLock::new();
    *UID.get_or_init(|| {
        stdout_of(Command::new("id").args(["-u", ROOTLESS_USER]))
            .parse()
            .expect("a numeric uid (cargo xtask services makes the user)")
    })
}

impl Engine {
    pub fn cli(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman | Self::PodmanRootless => "podman",
        }
    }

    /// The engine as `details.containers.engine` names it ("Docker 20.10.24").
    pub fn product(self) -> &'static str {
        match self {
            Self::Docker => "Docker",
            Self::Podman | Self::PodmanRootless => "Podman",
        }
    }

    /// The CLI, run as the engine's user: [`ROOTLESS_USER`] with its runtime directory for
    /// rootless Podman.
    pub fn command(self) -> Command {
        match self {
            Self::PodmanRootless => {
                let uid = rootless_uid();
                let mut c = Command::new("runuser");
                c.args(["-u", ROOTLESS_USER, "--", "env"])
                    .arg(format!("XDG_RUNTIME_DIR=/run/user/{uid}"))
                    .arg(format!("HOME=/home/{ROOTLESS_USER}"))
                    .arg("podman")
                    // Not the test's directory, which the user may not enter.
                    .current_dir("/");
                c
            }
            _ => Command::new(self.cli()),
        }
    }

    /// `containers.docker_host` for an agent watching this engine's containers.
    pub fn host(self) -> String {
        match self {
            Self::Docker => "unix:///var/run/docker.sock".into(),
            Self::Podman => "unix:///run/podman/podman.sock".into(),
            Self::PodmanRootless => {
                format!("unix:///run/user/{}/podman/podman.sock", rootless_uid())
            }
        }
    }

    /// Runs the engine's CLI with `args` and returns stdout; panics with stderr on failure.
    pub fn run(self, args: &[&str]) -> String {
        stdout_of(self.command().args(args))
    }

    /// The fixture image in this engine, imported once per test process (from stdin: the
    /// tarball's directory is root's).
    pub fn fixture_image(self) -> &'static str {
        static IMPORTED: [OnceLock<()>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        IMPORTED[self as usize].get_or_init(|| {
            let tar = std::fs::File::open(fixture_tar()).expect("the fixture tarball");
            succeed(
                self.command()
                    .args([
                        "import",
                        "--change",
                        "ENTRYPOINT [\"/fixture-backend\"]",
                        "-",
                    ])
                    .arg(FIXTURE_TAG)
                    .stdin(tar),
            );
        });
        FIXTURE_TAG
    }
}

const FIXTURE_TAG: &str = "health-agent-fixture:test";

/// The `FROM scratch` image holding a statically linked fixture backend, in Docker.
pub fn fixture_image() -> &'static str {
    Engine::Docker.fixture_image()
}

/// A tarball of the one statically linked fixture binary, built once per test process: images
/// cannot be pulled here, so each engine imports it.
fn fixture_tar() -> &'static std::path::Path {
    static TAR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let ctx = TAR.get_or_init(|| {
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
        let ok = Command::new("tar")
            .arg("-C")
            .arg(ctx.path())
            .arg("-cf")
            .arg(ctx.path().join("rootfs.tar"))
            .arg("fixture-backend")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "tar failed");
        ctx
    });
    // Leaked with the process: the OnceLock is never dropped, so neither is the directory.
    Box::leak(ctx.path().join("rootfs.tar").into_boxed_path())
}

/// Runs `docker` with `args` and returns stdout; panics with stderr on failure.
pub fn docker(args: &[&str]) -> String {
    Engine::Docker.run(args)
}

/// A container of the fixture image on the host network (it listens on 127.0.0.1 only),
/// removed on drop.
pub struct Container {
    pub name: String,
    pub port: u16,
    pub engine: Engine,
}

impl Container {
    /// `fixture_args` go to the fixture backend after `--listen 127.0.0.1:<port>`.
    pub fn run(label: &str, fixture_args: &[&str]) -> Self {
        Self::run_with(label, &[], fixture_args)
    }

    /// [`Container::run`] with `docker_args` (e.g. `--label k=v`) given to `docker run`.
    pub fn run_with(label: &str, docker_args: &[&str], fixture_args: &[&str]) -> Self {
        Self::run_on(Engine::Docker, label, docker_args, fixture_args)
    }

    /// [`Container::run_with`] in `engine`.
    pub fn run_on(
        engine: Engine,
        label: &str,
        docker_args: &[&str],
        fixture_args: &[&str],
    ) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("ha-test-{label}-{}-{n}", std::process::id());
        let port = free_port();
        let image = engine.fixture_image();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["run", "-d", "--name", &name, "--network", "host"];
        args.extend_from_slice(docker_args);
        args.extend_from_slice(&[image, "--listen", &listen]);
        args.extend_from_slice(fixture_args);
        engine.run(&args);
        Self { name, port, engine }
    }

    /// [`Container::run`], then waits until `GET /up` answers 200. A container that exits before
    /// it serves (its port was handed out in between, e.g. as another socket's source port) is
    /// removed and run again on a new port; after 5 tries, or a container that runs but never
    /// serves, the panic carries its state and logs.
    pub fn serving(label: &str, fixture_args: &[&str]) -> Self {
        Self::serving_with(label, &[], fixture_args)
    }

    /// [`Container::serving`] with `docker_args` given to `docker run`.
    pub fn serving_with(label: &str, docker_args: &[&str], fixture_args: &[&str]) -> Self {
        Self::serving_on(Engine::Docker, label, docker_args, fixture_args)
    }

    /// [`Container::serving_with`] in `engine`.
    pub fn serving_on(
        engine: Engine,
        label: &str,
        docker_args: &[&str],
        fixture_args: &[&str],
    ) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let c = Self::run_on(engine, label, docker_args, fixture_args);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if get(c.port, "/up").is_ok_and(|(code, _)| code == 200) {
                    return c;
                }
                let state = engine.run(&["inspect", "-f", "{{.State.Status}}", &c.name]);
                if state != "running" && state != "created" {
                    last = format!("{} {state} before serving: {}", c.name, c.logs());
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "container {} on 127.0.0.1:{} ({state}) did not serve in 30 s: {}",
                    c.name,
                    c.port,
                    c.logs()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("the fixture container never served after 5 tries; last: {last}");
    }

    /// `docker logs` (the fixture writes to stderr).
    pub fn logs(&self) -> String {
        container_logs(self.engine, &self.name)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .engine
            .command()
            .args(["rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `docker logs NAME`, stdout and stderr together; empty when the engine cannot say.
fn container_logs(engine: Engine, name: &str) -> String {
    engine
        .command()
        .args(["logs", name])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
}

/// Prefix of every container [`BridgeContainer`] runs: `ha-test-bridge-<pid>-<n>-<label>`.
const CONTAINER_PREFIX: &str = "ha-test-bridge-";

/// Once per test process: bridge containers of test processes that died without cleaning up.
fn sweep_stale_containers() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let names = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                &format!("name={CONTAINER_PREFIX}"),
                "--format",
                "{{.Names}}",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        for name in names.lines() {
            if left_by_dead_process(name, CONTAINER_PREFIX) {
                remove_container(Engine::Docker, name);
            }
        }
    });
}

fn remove_container(engine: Engine, name: &str) {
    // A paused container is unpaused first, so nothing of it stays frozen if removal fails.
    for args in [&["unpause", name][..], &["rm", "-f", name][..]] {
        let _ = engine
            .command()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The fixture image on Docker's default bridge network, listening on `0.0.0.0` inside the
/// container and published on the host's loopback only: `-p 127.0.0.1:<host_port>:<container_port>`
/// (and the control port likewise). Traffic goes to `127.0.0.1:<host_port>`; Docker carries it
/// into the container (with the default userland proxy, `docker-proxy` owns the host listener).
/// Dropping it unpauses and removes the container.
pub struct BridgeContainer {
    pub name: String,
    /// On 127.0.0.1, published to `container_port`.
    pub host_port: u16,
    /// The fixture's web port inside the container.
    pub container_port: u16,
    /// On 127.0.0.1, published to `container_control_port`.
    pub control_host_port: u16,
    pub container_control_port: u16,
    pub engine: Engine,
}

impl BridgeContainer {
    /// The fixture's ports inside the container (its namespace is its own: always free).
    pub const CONTAINER_PORT: u16 = 8080;
    pub const CONTAINER_CONTROL_PORT: u16 = 8081;

    /// Runs the fixture (`fixture_args` after `--listen`/`--control`) and waits until
    /// `GET http://127.0.0.1:<host_port>/up` answers 200. Tries again on new host ports when
    /// Docker could not publish one (taken in between).
    pub fn run(label: &str, fixture_args: &[&str]) -> Self {
        Self::run_listening_on(label, "0.0.0.0", fixture_args)
    }

    /// [`BridgeContainer::run`] with the fixture listening on `ip` inside the container:
    /// `"[::]"` is a dual-stack listener (IPv4 reaches it too), which a container keeps even
    /// where Docker turned IPv6 off (its default on the bridge network).
    pub fn run_listening_on(label: &str, ip: &str, fixture_args: &[&str]) -> Self {
        Self::run_on(Engine::Docker, label, ip, fixture_args)
    }

    /// [`BridgeContainer::run_listening_on`] in `engine` (Podman's default network is its
    /// `podman` bridge, which `--network bridge` names too).
    pub fn run_on(engine: Engine, label: &str, ip: &str, fixture_args: &[&str]) -> Self {
        sweep_stale_containers();
        static N: AtomicU32 = AtomicU32::new(0);
        let image = engine.fixture_image();
        let mut last = String::new();
        for _ in 0..5 {
            let n = N.fetch_add(1, Ordering::SeqCst);
            let name = format!("{CONTAINER_PREFIX}{}-{n}-{label}", std::process::id());
            let (host_port, control_host_port) = (free_port(), free_port());
            if host_port == control_host_port {
                continue;
            }
            let c = Self {
                name,
                host_port,
                container_port: Self::CONTAINER_PORT,
                control_host_port,
                container_control_port: Self::CONTAINER_CONTROL_PORT,
                engine,
            };
            let web = format!("127.0.0.1:{host_port}:{}", c.container_port);
            let control = format!("127.0.0.1:{control_host_port}:{}", c.container_control_port);
            let listen = format!("{ip}:{}", c.container_port);
            let control_listen = format!("0.0.0.0:{}", c.container_control_port);
            let out = engine
                .command()
                .args(["run", "-d", "--name", &c.name, "--network", "bridge"])
                .args(["-p", &web, "-p", &control, image])
                .args(["--listen", &listen, "--control", &control_listen])
                .args(fixture_args)
                .output()
                .expect("running `run` (is the engine installed?)");
            if !out.status.success() {
                // A container that could not publish its port is created but not started:
                // dropping `c` removes it.
                last = String::from_utf8_lossy(&out.stderr).trim().to_string();
                continue;
            }
            // Inside its own namespace the port is always free, so a container that does not
            // answer is slow (a loaded machine), not misconfigured: its logs say which.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !get_at(c.host_addr(), "/up").is_ok_and(|(code, _)| code == 200) {
                assert!(
                    Instant::now() < deadline,
                    "the bridge container {} did not answer on 127.0.0.1:{host_port} in 30 s: {}",
                    c.name,
                    c.logs()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            return c;
        }
        panic!(
            "{} run on the bridge network failed 5 times; last: {last}",
            engine.cli()
        );
    }

    /// `127.0.0.1:<host_port>`: where test traffic goes.
    pub fn host_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.host_port).into()
    }

    /// `127.0.0.1:<control_host_port>`.
    pub fn control_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.control_host_port).into()
    }

    /// `docker pause`: every process of the container frozen (cgroup freezer).
    pub fn pause(&self) {
        self.engine.run(&["pause", &self.name]);
    }

    pub fn unpause(&self) {
        self.engine.run(&["unpause", &self.name]);
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) =
            get_at(self.control_addr(), &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    /// The container's init process (the fixture) as the host sees it.
    pub fn pid(&self) -> u32 {
        let pid = self
            .engine
            .run(&["inspect", "-f", "{{.State.Pid}}", &self.name]);
        pid.parse()
            .unwrap_or_else(|_| panic!("inspect gave pid {pid:?}"))
    }

    /// The container's IPv6 addresses as its namespace lists them (`/proc/PID/net/if_inet6`):
    /// none where IPv6 is off.
    pub fn ipv6_addresses(&self) -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{}/net/if_inet6", self.pid()))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The nsfs inode of the container's network namespace.
    pub fn netns_inode(&self) -> u64 {
        netns_inode(format!("/proc/{}/ns/net", self.pid()))
    }

    /// `docker logs` (the fixture writes to stderr).
    pub fn logs(&self) -> String {
        container_logs(self.engine, &self.name)
    }

    /// `ss -ltnp` for the host port: which process owns the listener on the host (with the
    /// userland proxy: `docker-proxy`), or nothing when only iptables DNAT carries the port.
    pub fn host_listener(&self) -> String {
        Command::new("ss")
            .args(["-Hltnp", &format!("sport = :{}", self.host_port)])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }
}

impl Drop for BridgeContainer {
    fn drop(&mut self) {
        remove_container(self.engine, &self.name);
    }
}
