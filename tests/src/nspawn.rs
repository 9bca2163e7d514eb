//! A Debian 12 system with systemd as PID 1, booted with `systemd-nspawn -b` on a root file
//! system that `mmdebstrap` makes from Debian's packages ([`rootfs`]), and the guard that powers
//! it off ([`Machine`]). Commands run inside through `nsenter` into the container's PID 1, so
//! the host needs neither systemd nor systemd-machined (this VM's PID 1 is not systemd).
//!
//! The root file system is cached in `/var/cache/health-agent/rootfs-<hash of the package
//! list>`: the first run costs about 15 s of mmdebstrap, later ones nothing. Each boot mounts it
//! under a tmpfs overlay (`--volatile=overlay`), so what a test installs never reaches the cache.
//!
//! The nspawn options, each for a reason (docs/deploy.md lists them too):
//!
//! | option | why |
//! |---|---|
//! | `--boot` | systemd as PID 1: the unit runs under real systemd, with its sandbox and watchdog |
//! | `--volatile=overlay` | writes land in a tmpfs; the cached root file system stays as mmdebstrap made it |
//! | `--register=no --keep-unit` | no machined or D-Bus on the host: nspawn neither registers the machine nor asks the host's systemd for a scope |
//! | `--capability=CAP_BPF,CAP_PERFMON` | nspawn's default set lacks both (it keeps `CAP_SYS_ADMIN` and `CAP_SYS_PTRACE`). Without them the agent still loads, on `CAP_SYS_ADMIN` alone, so the unit's own set would go untested; with them its `CapEff` is exactly the unit's |
//! | `--system-call-filter=bpf perf_event_open` | nspawn's seccomp allow-list blocks both: without `bpf(2)` "failed to create map MAP_ERRORS", without `perf_event_open(2)` the accept tracepoints cannot attach ("perf_event_open_trace_point failed") |
//! | `--bind=/sys/kernel/tracing` | nspawn mounts a fresh sysfs without tracefs on it, where a real host has one (without it the agent mounts its own, which works too) |
//! | host network (no `--private-network`) | the test reaches `/health` and the backend on 127.0.0.1, on ports it picked free |
//! | `--bind-ro=<dir>:/mnt/deb`, `--bind-ro=<fixture>:/usr/local/bin/fixture-backend` | the .deb to install and the backend, without copying them into the cache |
//!
//! `/sys/kernel/btf` needs nothing: it is part of sysfs. A host without `CAP_SYS_RESOURCE` in its
//! own bounding set (this VM) makes nspawn warn that it cannot pass it on; nothing here needs it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::{stdout_of, succeed};

/// Debian's packages inside the root file system, beyond `--variant=minbase`: systemd as init,
/// and D-Bus, which logind and `systemctl` on a booted system expect.
pub const PACKAGES: &[&str] = &["systemd", "systemd-sysv", "dbus"];
/// Beyond [`PACKAGES`], for a root that installs an .rpm as Amazon Linux does: dnf, and rpm
/// under it (Debian packages both). Its rpm database starts empty.
pub const DNF_PACKAGES: &[&str] = &["dnf", "rpm"];
const SUITE: &str = "bookworm";
/// The unit the .deb ships, in the workspace.
pub const UNIT: &str = "deploy/systemd/health-agent.service";
const CACHE: &str = "/var/cache/health-agent";
/// The host's Debian sources (deb822), so the root file system comes from the same mirror the
/// host's apt uses.
const SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";

/// FNV-1a, so the cache name is the same for every build of this crate (std's hasher is not
/// stable across Rust releases).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`PACKAGES`] and `extra`: what mmdebstrap includes.
fn packages<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    PACKAGES.iter().chain(extra).copied().collect()
}

/// The host's apt sources for mmdebstrap, and where the root file system they make with
/// [`PACKAGES`] and `extra` is cached.
fn rootfs_dir(extra: &[&str]) -> (String, PathBuf) {
    let sources = if Path::new(SOURCES).exists() {
        SOURCES.to_owned()
    } else {
        "http://deb.debian.org/debian".to_owned()
    };
    let key = format!(
        "{SUITE} minbase {} {}",
        packages(extra).join(","),
        fs::read_to_string(&sources).unwrap_or_else(|_| sources.clone())
    );
    let dir = PathBuf::from(CACHE).join(format!("rootfs-{:016x}", fnv1a(&key)));
    (sources, dir)
}

/// Whether [`rootfs`] and [`dnf_rootfs`] have their root file systems already (they then
/// download nothing).
pub fn rootfs_cached() -> bool {
    [&[][..], DNF_PACKAGES]
        .iter()
        .all(|extra| rootfs_dir(extra).1.join("usr/lib/os-release").exists())
}

/// The cached root file system for [`PACKAGES`], made by mmdebstrap from the host's Debian
/// mirror when it is missing (`cargo xtask setup` makes it, so the test stage reaches no
/// mirror).
pub fn rootfs() -> PathBuf {
    rootfs_with(&[])
}

/// The cached root file system for [`PACKAGES`] and [`DNF_PACKAGES`], as [`rootfs`].
pub fn dnf_rootfs() -> PathBuf {
    rootfs_with(DNF_PACKAGES)
}

/// The cached root file system for [`PACKAGES`] and `extra`, made when it is missing.
/// Concurrent callers each build into their own directory; the first rename wins.
fn rootfs_with(extra: &[&str]) -> PathBuf {
    let (sources, dir) = rootfs_dir(extra);
    // A run killed mid-mmdebstrap leaves its half tree behind: drop those of dead processes.
    for e in fs::read_dir(CACHE).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .rsplit_once(".tmp-")
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    if dir.join("usr/lib/os-release").exists() {
        return dir;
    }
    fs::create_dir_all(CACHE).unwrap_or_else(|e| panic!("cannot create {CACHE}: {e}"));
    let tmp = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let start = Instant::now();
    succeed(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--mode=root", "--quiet"])
            .arg(format!("--include={}", packages(extra).join(",")))
            .arg(SUITE)
            .arg(&tmp)
            .arg(&sources),
    );
    if fs::rename(&tmp, &dir).is_err() {
        // Another test process got there first; its tree is as good as ours.
        let _ = fs::remove_dir_all(&tmp);
    }
    println!(
        "nspawn: root file system {} made in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    dir
}

/// The newest .deb in target/debian (`cargo xtask package`), refused when it is older than the
/// agent's sources or the unit it ships: a test must not boot yesterday's agent.
pub fn built_deb() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let debian = crate::target_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("debian");
    let deb = fs::read_dir(&debian)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!(
                "no .deb in {}: run `cargo xtask package` (cargo xtask test does)",
                debian.display()
            )
        });
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).expect("mtime");
    let sources = ["health-agent", "health-common", "health-agent-ebpf"]
        .iter()
        .map(|c| crate::newest(&workspace.join(c).join("src")))
        .chain([mtime(&workspace.join(UNIT))])
        .max()
        .expect("sources");
    assert!(
        mtime(&deb) >= sources,
        "{} is older than {UNIT} or the agent's sources: run `cargo xtask package`",
        deb.display()
    );
    deb
}

/// A booted container, powered off on drop (then killed if it does not stop in 15 s). Its
/// mounts live in nspawn's own mount namespace, so they go when nspawn exits.
pub struct Machine {
    child: Child,
    leader: u32,
    pub name: String,
    console: PathBuf,
    _dir: tempfile::TempDir,
}

impl Machine {
    /// Boots `rootfs` with `binds` (host path, container path) mounted read-only and waits until
    /// systemd says the system is up.
    /// Debian booted with `cargo xtask package`'s .deb installed (`dpkg -i`) and the fixture
    /// backend at `/usr/local/bin/fixture-backend`, as an instance built from the package. The
    /// package enables the unit, as Debian's convention wants; a policy-rc.d that denies every
    /// start (what image builders install) keeps its postinst from starting it, so each test
    /// starts the agent itself, with its own config and ports.
    pub fn with_package() -> Self {
        let deb = built_deb();
        let fixture = crate::binary("fixture-backend", "health-agent-tests");
        let machine = Self::boot(
            &rootfs(),
            &[
                (deb.parent().expect("target/debian"), "/mnt/deb"),
                (&fixture, "/usr/local/bin/fixture-backend"),
            ],
        );
        let deb_name = deb.file_name().and_then(|n| n.to_str()).expect("deb name");
        machine.write("/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n");
        machine.run(&["chmod", "755", "/usr/sbin/policy-rc.d"]);
        machine.run(&["dpkg", "-i", &format!("/mnt/deb/{deb_name}")]);
        machine.run(&["rm", "/usr/sbin/policy-rc.d"]);
        machine
    }

    pub fn boot(rootfs: &Path, binds: &[(&Path, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let console = dir.path().join("console.log");
        let log = fs::File::create(&console).expect("console log");
        let name = format!("ha-test-{}", std::process::id());
        let mut cmd = Command::new("systemd-nspawn");
        cmd.arg(format!("--directory={}", rootfs.display()))
            .arg(format!("--machine={name}"))
            .args([
                "--boot",
                "--volatile=overlay",
                "--register=no",
                "--keep-unit",
                "--console=read-only",
                "--capability=CAP_BPF,CAP_PERFMON",
                "--system-call-filter=bpf perf_event_open",
                "--bind=/sys/kernel/tracing",
            ]);
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("console log"))
            .stderr(log)
            .spawn()
            .expect("starting systemd-nspawn (cargo xtask setup installs systemd-container)");
        let mut machine = Self {
            child,
            leader: 0,
            name,
            console,
            _dir: dir,
        };
        let start = Instant::now();
        while machine.leader == 0 {
            if let Ok(Some(status)) = machine.child.try_wait() {
                panic!("systemd-nspawn exited ({status}):\n{}", machine.console());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no systemd inside the container after 30 s:\n{}",
                machine.console()
            );
            machine.leader = init_below(machine.child.id()).unwrap_or(0);
            std::thread::sleep(Duration::from_millis(50));
        }
        // `is-system-running --wait` returns once boot is over: running, or degraded when some
        // unit the minimal system does not need failed (the state is printed, not asserted).
        let state = loop {
            let out = machine.exec(&["systemctl", "is-system-running", "--wait"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            // Before systemd listens, systemctl fails at once with nothing on stdout.
            if state == "running" || state == "degraded" {
                break state;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the container did not finish booting in 60 s (state {state:?}):\n{}",
                machine.console()
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        println!(
            "nspawn: {} booted in {:.1} s ({state})",
            machine.name,
            start.elapsed().as_secs_f64(),
        );
        machine
    }

    /// The container's PID 1 as the host sees it.
    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// What the container printed on its console (systemd's boot messages), for failures.
    pub fn console(&self) -> String {
        fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// A command inside the container (all of PID 1's namespaces), whatever its exit status.
    pub fn exec(&self, args: &[&str]) -> Output {
        self.nsenter(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run nsenter {args:?}: {e}"))
    }

    /// The fixture backend as the transient unit `unit` (`systemd-run`), on 127.0.0.1:`web`
    /// with its control port on `control`, in mode `normal`, with `more` arguments; returns once
    /// its control port answers. The container shares the host's network, so the ports are
    /// the host's too.
    pub fn start_fixture(&self, unit: &str, web: u16, control: u16, more: &[&str]) {
        let (unit, listen, control_at) = (
            format!("--unit={unit}"),
            format!("127.0.0.1:{web}"),
            format!("127.0.0.1:{control}"),
        );
        let mut args = vec!["systemd-run", &unit, "/usr/local/bin/fixture-backend"];
        args.extend([
            "--listen",
            &listen,
            "--control",
            &control_at,
            "--mode",
            "normal",
        ]);
        args.extend_from_slice(more);
        self.run(&args);
        crate::wait_until(
            Duration::from_secs(30),
            "the fixture in the container",
            || crate::get(control, "/mode").ok(),
        );
    }

    /// A command inside the container that must succeed; its stdout, trimmed.
    pub fn run(&self, args: &[&str]) -> String {
        stdout_of(&mut self.nsenter(args))
    }

    fn nsenter(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.leader.to_string())
            .args([
                "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--root", "--wd",
            ])
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// One property of a unit, as `systemctl show -p NAME --value` prints it.
    pub fn unit_property(&self, unit: &str, name: &str) -> String {
        self.run(&["systemctl", "show", "-p", name, "--value", unit])
    }

    /// A file inside the container, written from the host through PID 1's root.
    pub fn write(&self, path: &str, text: &str) {
        let host = format!("/proc/{}/root{path}", self.leader);
        fs::write(&host, text)
            .unwrap_or_else(|e| panic!("cannot write {path} in the container: {e}"));
    }

    /// The host PID of a process the container knows as `pid` (its `NSpid:` line).
    pub fn host_pid(&self, pid: u32) -> Option<u32> {
        fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let host: u32 = e.file_name().to_str()?.parse().ok()?;
            let status = fs::read_to_string(e.path().join("status")).ok()?;
            let ids: Vec<u32> = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))?
                .split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect();
            (ids.len() > 1 && ids.last() == Some(&pid) && is_below(host, self.leader))
                .then_some(host)
        })
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // SIGTERM makes nspawn ask the container's systemd to power off (SIGRTMIN+3).
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The parent PID of `pid`, from /proc/PID/stat (after the command name's closing paren).
fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` descends from `ancestor`.
fn is_below(mut pid: u32, ancestor: u32) -> bool {
    while pid > 1 {
        if pid == ancestor {
            return true;
        }
        match parent(pid) {
            Some(p) => pid = p,
            None => return false,
        }
    }
    false
}

/// The container's init: a process named `systemd` below nspawn (nspawn forks once more for the
/// new PID namespace, so it is a grandchild).
fn init_below(nspawn: u32) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "systemd" && pid != nspawn && is_below(pid, nspawn)).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_is_stable_across_builds() {
        // FNV-1a's published test vector: the cache name must not change with the toolchain.
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
