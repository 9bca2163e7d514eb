//! Backends in other network namespaces, behind RAII guards: a namespace of the test's own
//! reached over a veth pair ([`NetNs`]), the fixture backend on a chosen address — inside such
//! a namespace or on `::1` — ([`AddrFixture`]), and the fixture image on Docker's default
//! bridge network, published on 127.0.0.1 only ([`BridgeContainer`]).
//!
//! Test traffic stays on 127.0.0.0/8, `::1` and the 10.213.0.0/16 addresses these guards put
//! on their own veth pairs. Guards clean up on drop, after a panic too; namespaces and
//! containers left behind by a killed test process are removed by the next one.

use std::{
    ffi::OsStr,
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use crate::{binary, docker, fixture_image, free_port, kill_and_wait, wait_until};

/// Prefix of every namespace [`NetNs`] creates: `hat-<pid>-<n>-<label>`.
const NS_PREFIX: &str = "hat-";
/// Prefix of every container [`BridgeContainer`] runs: `ha-test-bridge-<pid>-<n>-<label>`.
const CONTAINER_PREFIX: &str = "ha-test-bridge-";
/// /30 subnets in 10.213.0.0/16.
const SUBNETS: u32 = 1 << 14;

/// `ip` by path: /usr/sbin is not on every PATH.
fn ip_bin() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// Runs `ip args`: stdout, or stderr as the error.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new(ip_bin())
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn ip_ok(args: &[&str]) -> String {
    ip(args).unwrap_or_else(|e| panic!("ip {} failed: {e}", args.join(" ")))
}

/// The nsfs inode of a namespace file (`/var/run/netns/NAME`, `/proc/PID/ns/net`): what
/// `ip netns identify` and `lsns` compare.
pub fn netns_inode(path: impl AsRef<Path>) -> u64 {
    let path = path.as_ref();
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .ino()
}

/// Whether a process created a namespace or container named `<prefix><pid>-…` and is gone.
fn left_by_dead_process(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        })
}

/// Pids of the processes inside namespace `name`.
fn pids_inside(name: &str) -> Vec<i32> {
    ip(&["netns", "pids", name])
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// SIGKILLs everything inside namespace `name` (stopped processes too) and waits for it.
fn kill_inside(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = pids_inside(name);
        if pids.is_empty() || Instant::now() >= deadline {
            return;
        }
        for p in pids {
            // SAFETY: killing processes inside a namespace this harness created.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Once per test process: namespaces of test processes that died without cleaning up.
fn sweep_stale_namespaces() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        for line in ip(&["netns", "list"]).unwrap_or_default().lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if left_by_dead_process(name, NS_PREFIX) {
                kill_inside(name);
                // The inside end goes with the namespace, and the host end with it.
                let _ = ip(&["netns", "del", name]);
            }
        }
    });
}

/// A network namespace of the test's own (`ip netns add`), reachable from the host over a
/// veth pair: host end `10.213.X.Y+1/30`, inside end `10.213.X.Y+2/30`, a /30 no other guard
/// has. `lo` is up inside. Dropping it kills whatever still runs inside, deletes the veth pair
/// and the namespace.
pub struct NetNs {
    /// `hat-<pid>-<n>-<label>`.
    pub name: String,
    /// Host end, `hat<i>h` (veth names are at most 15 characters).
    pub host_veth: String,
    /// Inside end, `hat<i>n`.
    pub inside_veth: String,
    subnet: u32,
}

impl NetNs {
    pub fn create(label: &str) -> Self {
        sweep_stale_namespaces();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let name = format!("{NS_PREFIX}{}-{n}-{label}", std::process::id());
        ip_ok(&["netns", "add", &name]);
        // From here on, Drop cleans up whatever exists (a panic below included).
        let mut ns = Self {
            name,
            host_veth: String::new(),
            inside_veth: String::new(),
            subnet: 0,
        };
        ip_ok(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns.add_veth();
        let (host, inside) = (
            format!("{}/30", ns.host_ip()),
            format!("{}/30", ns.inside_ip()),
        );
        ip_ok(&["addr", "add", &host, "dev", &ns.host_veth]);
        ip_ok(&["link", "set", &ns.host_veth, "up"]);
        ip_ok(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &inside,
            "dev",
            &ns.inside_veth,
        ]);
        ip_ok(&["-n", &ns.name, "link", "set", &ns.inside_veth, "up"]);
        let operstate = format!("/sys/class/net/{}/operstate", ns.host_veth);
        wait_until(Duration::from_secs(5), "the veth pair to come up", || {
            std::fs::read_to_string(&operstate)
                .ok()
                .filter(|s| s.trim() == "up")
        });
        ns
    }

    /// Creates the pair with the inside end in the namespace. The host-side name is the lock
    /// on the subnet: `ip link add` fails with "File exists" when another guard (in this or
    /// another test process) has it.
    fn add_veth(&mut self) {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let start = std::process::id().wrapping_mul(97) % SUBNETS;
        for _ in 0..256 {
            let subnet = (start + NEXT.fetch_add(1, Ordering::SeqCst)) % SUBNETS;
            let (host, inside) = (format!("hat{subnet}h"), format!("hat{subnet}n"));
            let args = [
                "link", "add", &host, "type", "veth", "peer", "name", &inside, "netns", &self.name,
            ];
            match ip(&args) {
                Ok(_) => {
                    (self.host_veth, self.inside_veth, self.subnet) = (host, inside, subnet);
                    return;
                }
                Err(e) if e.contains("File exists") => continue,
                Err(e) => panic!("ip {} failed: {e}", args.join(" ")),
            }
        }
        panic!("no free veth name / 10.213.0.0/16 subnet after 256 tries");
    }

    fn base(&self) -> [u8; 4] {
        let b = self.subnet * 4;
        [10, 213, (b >> 8) as u8, (b & 0xff) as u8]
    }

    /// The host end's address.
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c, d] = self.base();
        Ipv4Addr::new(a, b, c, d + 1)
    }

    /// The address inside the namespace (reachable from the host).
    pub fn inside_ip(&self) -> Ipv4Addr {
        let [a, b, c, d] = self.base();
        Ipv4Addr::new(a, b, c, d + 2)
    }

    /// `/var/run/netns/NAME`: what `[web] netns` takes.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    /// The namespace's nsfs inode.
    pub fn inode(&self) -> u64 {
        netns_inode(self.path())
    }

    /// `ip netns exec NAME program`: add arguments and spawn. `ip netns exec` execs the
    /// program, so the child's pid is the program's.
    pub fn exec(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(ip_bin());
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Pids of the processes inside.
    pub fn pids(&self) -> Vec<i32> {
        pids_inside(&self.name)
    }

    /// Whether the namespace still exists (`ip netns list`).
    pub fn exists(name: &str) -> bool {
        ip(&["netns", "list"])
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        kill_inside(&self.name);
        if !self.host_veth.is_empty() {
            let _ = ip(&["link", "del", &self.host_veth]);
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// One HTTP/1.1 request to `addr` (any address: `[::1]:PORT`, a namespace's inside address);
/// returns (status, headers, body). Like [`crate::http`], which only takes a loopback port.
pub fn http_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad response: {head:?}"),
            )
        })?;
    Ok((status, head.to_string(), body.to_string()))
}

/// `GET path` on `addr` with a 5 s timeout: (status, body).
pub fn get_at(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    http_at(addr, "GET", path, Duration::from_secs(5)).map(|(c, _, b)| (c, b))
}

/// A port that was free a moment ago on `ip` (e.g. `::1`).
pub fn free_port_on(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("binding an ephemeral port on {ip}: {e}"))
}

/// The fixture backend listening on one chosen address — inside a [`NetNs`] on its inside
/// address, or in the test's own namespace on e.g. `::1` only — with its control port on the
/// same address. Dropping it continues (if stopped) and kills it.
pub struct AddrFixture {
    child: Child,
    pub listen: SocketAddr,
    pub control: SocketAddr,
    /// The namespace it runs in, `None` for the test's own.
    pub netns: Option<String>,
    log: tempfile::NamedTempFile,
}

impl AddrFixture {
    /// Inside `ns`, on `<inside_ip>:port`, control on `<inside_ip>:port+1` (the namespace is
    /// the test's own, so the ports are free). Several namespaces may use the same port.
    pub fn in_netns(ns: &NetNs, port: u16, mode: &str) -> Self {
        let ip = IpAddr::V4(ns.inside_ip());
        Self::spawn(
            Some(ns),
            (ip, port).into(),
            (ip, port + 1).into(),
            mode,
            &[],
        )
        .unwrap_or_else(|e| panic!("fixture-backend in {}: {e}", ns.name))
    }

    /// In the test's own namespace, on `ip` only (`::1`, say), on free ports; tries again on
    /// new ports when one was taken in between (tests run in parallel).
    pub fn on_ip(ip: IpAddr, mode: &str) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let (port, control) = (free_port_on(ip), free_port_on(ip));
            if port == control {
                continue;
            }
            match Self::spawn(None, (ip, port).into(), (ip, control).into(), mode, &[]) {
                Ok(f) => return f,
                Err(e) => last = e,
            }
        }
        panic!("fixture-backend on {ip} did not start on 5 tries; last: {last}");
    }

    fn spawn(
        ns: Option<&NetNs>,
        listen: SocketAddr,
        control: SocketAddr,
        mode: &str,
        extra: &[&str],
    ) -> Result<Self, String> {
        let bin = binary("fixture-backend", "health-agent-tests");
        let log = tempfile::NamedTempFile::new().expect("log file");
        let stderr = log.reopen().expect("reopening the log file");
        let mut cmd = match ns {
            Some(ns) => ns.exec(&bin),
            None => Command::new(&bin),
        };
        let child = cmd
            .args(["--listen", &listen.to_string()])
            .args(["--control", &control.to_string()])
            .args(["--mode", mode])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
        // Dropped (killed) on every early return below.
        let mut f = Self {
            child,
            listen,
            control,
            netns: ns.map(|n| n.name.clone()),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = f.child.try_wait() {
                return Err(format!("exited with {status}: {}", f.logs()));
            }
            let control_ok = get_at(control, "/mode").is_ok();
            if control_ok && get_at(listen, "/up").is_ok_and(|(c, _)| c == 200) {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "did not answer on {listen} within 10 s; log: {}",
            f.logs()
        ))
    }

    /// The fixture process itself (`ip netns exec` execs it: no wrapper in between).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What `/proc/PID/exe` points at.
    pub fn exe(&self) -> PathBuf {
        std::fs::read_link(format!("/proc/{}/exe", self.pid())).unwrap_or_default()
    }

    /// The nsfs inode of the network namespace the process is in.
    pub fn netns_inode(&self) -> u64 {
        netns_inode(format!("/proc/{}/ns/net", self.pid()))
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Freezes it: the kernel keeps completing handshakes, nothing is accepted or answered.
    pub fn sigstop(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn sigcont(&self) {
        self.signal(libc::SIGCONT);
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) = get_at(self.control, &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    /// Its stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for AddrFixture {
    fn drop(&mut self) {
        // A stopped process must be continued before it can act on SIGTERM.
        self.sigcont();
        kill_and_wait(&mut self.child, libc::SIGTERM);
    }
}

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
                remove_container(name);
            }
        }
    });
}

fn remove_container(name: &str) {
    // A paused container is unpaused first, so nothing of it stays frozen if removal fails.
    for args in [&["unpause", name][..], &["rm", "-f", name][..]] {
        let _ = Command::new("docker")
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
}

impl BridgeContainer {
    /// The fixture's ports inside the container (its namespace is its own: always free).
    pub const CONTAINER_PORT: u16 = 8080;
    pub const CONTAINER_CONTROL_PORT: u16 = 8081;

    /// Runs the fixture (`fixture_args` after `--listen`/`--control`) and waits until
    /// `GET http://127.0.0.1:<host_port>/up` answers 200. Tries again on new host ports when
    /// Docker could not publish one (taken in between).
    pub fn run(label: &str, fixture_args: &[&str]) -> Self {
        sweep_stale_containers();
        static N: AtomicU32 = AtomicU32::new(0);
        let image = fixture_image();
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
            };
            let web = format!("127.0.0.1:{host_port}:{}", c.container_port);
            let control = format!("127.0.0.1:{control_host_port}:{}", c.container_control_port);
            let listen = format!("0.0.0.0:{}", c.container_port);
            let control_listen = format!("0.0.0.0:{}", c.container_control_port);
            let out = Command::new("docker")
                .args(["run", "-d", "--name", &c.name, "--network", "bridge"])
                .args(["-p", &web, "-p", &control, image])
                .args(["--listen", &listen, "--control", &control_listen])
                .args(fixture_args)
                .output()
                .expect("running docker run (is dockerd running?)");
            if !out.status.success() {
                // A container that could not publish its port is created but not started:
                // dropping `c` removes it.
                last = String::from_utf8_lossy(&out.stderr).trim().to_string();
                continue;
            }
            wait_until(
                Duration::from_secs(15),
                &format!(
                    "the bridge container {} to answer on 127.0.0.1:{host_port}",
                    c.name
                ),
                || {
                    get_at(c.host_addr(), "/up")
                        .ok()
                        .filter(|(code, _)| *code == 200)
                },
            );
            return c;
        }
        panic!("docker run on the bridge network failed 5 times; last: {last}");
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
        docker(&["pause", &self.name]);
    }

    pub fn unpause(&self) {
        docker(&["unpause", &self.name]);
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) =
            get_at(self.control_addr(), &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    /// The container's init process (the fixture) as the host sees it.
    pub fn pid(&self) -> u32 {
        let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &self.name]);
        pid.parse()
            .unwrap_or_else(|_| panic!("docker inspect gave pid {pid:?}"))
    }

    /// The nsfs inode of the container's network namespace.
    pub fn netns_inode(&self) -> u64 {
        netns_inode(format!("/proc/{}/ns/net", self.pid()))
    }

    /// `docker logs` (the fixture writes to stderr).
    pub fn logs(&self) -> String {
        Command::new("docker")
            .args(["logs", &self.name])
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
        remove_container(&self.name);
    }
}
