//! A private Redis (Debian's `redis-server`) of the test's own, speaking TLS only or in the
//! clear only.

use std::{
    ffi::OsString,
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{certs::Issued, free_port, Proc};

/// `redis-server` on a free loopback port, with no persistence and a password: TLS only
/// (`tls-port`, the plain port closed, client certificates not asked for) or in the clear
/// only. Stopped on drop.
pub struct Redis {
    pub port: u16,
    pub password: String,
    _proc: Proc,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Serves TLS with `server`'s certificate; `ca` is only what Redis wants configured for
    /// client certificates, which it does not ask for here.
    pub fn start_tls(server: &Issued, ca: &std::path::Path) -> Self {
        Self::start(|port| {
            let mut args: Vec<OsString> = ["--port", "0", "--tls-port", &port.to_string()]
                .iter()
                .map(OsString::from)
                .collect();
            for (key, path) in [
                ("--tls-cert-file", &server.cert),
                ("--tls-key-file", &server.key),
                ("--tls-ca-cert-file", &ca.to_path_buf()),
            ] {
                args.push(key.into());
                args.push(path.into());
            }
            args.extend(["--tls-auth-clients", "no"].map(OsString::from));
            args
        })
    }

    /// In the clear only, on `port`.
    pub fn start_plain() -> Self {
        Self::start(|port| vec!["--port".into(), port.to_string().into()])
    }

    /// Starts `redis-server` with `listen(port)`'s arguments, retrying on another port when
    /// the chosen one was taken meanwhile.
    fn start(listen: impl Fn(u16) -> Vec<OsString>) -> Self {
        let password = format!("redis-pw-{}", std::process::id());
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let log = dir.path().join("redis.log");
            let child = Command::new("redis-server")
                .args(listen(port))
                .args(["--bind", "127.0.0.1"])
                .args(["--requirepass", &password])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting redis-server (installed by cargo xtask setup)");
            let mut proc = Proc(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = proc.0.try_wait() {
                    // Exited: most likely the port was taken meanwhile; try another.
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Self {
                        port,
                        password,
                        _proc: proc,
                        dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!("redis-server did not come up on {port}: {log}");
            let _ = proc.0.kill();
        }
        panic!("redis-server did not start on 5 tries");
    }

    /// Its log so far, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}
