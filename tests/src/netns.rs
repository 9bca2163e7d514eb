//! Network namespaces of the test's own, reached over a veth pair ([`NetNs`]), behind RAII
//! guards. The servers put into them and into other namespaces live beside the other servers:
//! [`crate::AddrFixture`] (the fixture backend on a chosen address — inside such a namespace or
//! on `::1`) and [`crate::BridgeContainer`] (the fixture image on Docker's default bridge
//! network, published on 127.0.0.1 only).
//!
//! Test traffic stays on 127.0.0.0/8, `::1` and the 10.213.0.0/16 addresses these guards put
//! on their own veth pairs. Guards clean up on drop, after a panic too; namespaces and
//! containers left behind by a killed test process are removed by the next one.

use std::{
    ffi::OsStr,
    io,
    net::Ipv4Addr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use crate::wait_until;

/// Prefix of every namespace [`NetNs`] creates: `hat-<pid>-<n>-<label>`.
const NS_PREFIX: &str = "hat-";
/// /30 subnets in 10.213.0.0/16.
const SUBNETS: u32 = 1 << 14;

/// `ip` by path: /usr/sbin is not on every PATH.
fn ip_bin() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// Runs `ip args`: stdout, or ip's own message as the error (`AlreadyExists` for its "File
/// exists", which callers match).
fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new(ip_bin()).args(args).output()?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).to_string());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let kind = if message.contains("File exists") {
        io::ErrorKind::AlreadyExists
    } else {
        io::ErrorKind::Other
    };
    Err(io::Error::new(kind, message))
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
pub(crate) fn left_by_dead_process(name: &str, prefix: &str) -> bool {
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
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
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
