//! The fixture backend (tests/src/bin/fixture-backend/), switched through its control port:
//! on 127.0.0.1 ([`Fixture`]), or on one chosen address — inside a [`NetNs`] or on `::1` —
//! ([`AddrFixture`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{binary, free_port, free_port_on, get, get_at, netns_inode, NetNs, Proc};

/// The fixture backend on 127.0.0.1. Dropping it continues (if stopped) and stops it.
pub struct Fixture {
    child: Proc,
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
                        child: Proc(child),
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
        self.child.pid()
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) = get(self.control, &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    pub fn signal(&self, sig: i32) {
        self.child.signal(sig);
    }
}

/// The fixture backend listening on one chosen address — inside a [`NetNs`] on its inside
/// address, or in the test's own namespace on e.g. `::1` only — with its control port on the
/// same address. Dropping it continues (if stopped) and stops it.
pub struct AddrFixture {
    child: Proc,
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
                Err(e) => last = e.to_string(),
            }
        }
        panic!("fixture-backend on {ip} did not start on 5 tries; last: {last}");
    }

    /// The error is only ever a line of a panic message (the caller retries or panics).
    fn spawn(
        ns: Option<&NetNs>,
        listen: SocketAddr,
        control: SocketAddr,
        mode: &str,
        extra: &[&str],
    ) -> io::Result<Self> {
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
            .map_err(|e| io::Error::other(format!("spawning {}: {e}", bin.display())))?;
        // Dropped (killed) on every early return below.
        let mut f = Self {
            child: Proc(child),
            listen,
            control,
            netns: ns.map(|n| n.name.clone()),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = f.child.0.try_wait() {
                return Err(io::Error::other(format!(
                    "exited with {status}: {}",
                    f.logs()
                )));
            }
            let control_ok = get_at(control, "/mode").is_ok();
            if control_ok && get_at(listen, "/up").is_ok_and(|(c, _)| c == 200) {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("did not answer on {listen} within 10 s; log: {}", f.logs()),
        ))
    }

    /// The fixture process itself (`ip netns exec` execs it: no wrapper in between).
    pub fn pid(&self) -> u32 {
        self.child.pid()
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
        self.child.signal(sig);
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
