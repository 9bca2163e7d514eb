//! Real Caddy (Debian's 2.6 package) as a child process on a Caddyfile written for the test: one
//! plain-HTTP site on a free 127.0.0.1 port, no admin endpoint, nothing written outside its
//! temp dir.

use std::{
    net::{SocketAddr, TcpStream},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use crate::{free_port, succeed, Logged};

/// Caddy serving one site, killed on drop (a graceful stop waits for its connections). Its log
/// (JSON lines: active health checks that failed, upstreams it could not reach) goes to
/// `caddy.log` in its temp dir ([`Caddy::logs`]).
pub struct Caddy {
    process: Logged,
    /// The site's port on 127.0.0.1.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Caddy {
    /// Serves `http://127.0.0.1:PORT` with the directives `site` (a `reverse_proxy` block, say)
    /// once `caddy validate` accepts the Caddyfile, and waits until the port accepts. The
    /// global options turn the admin endpoint and automatic HTTPS off; Caddy's data and config
    /// directories are its temp dir.
    pub fn start(site: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let caddyfile = dir.path().join("Caddyfile");
        std::fs::write(
            &caddyfile,
            format!(
                "{{\n\tadmin off\n\tauto_https off\n}}\n\
                 http://127.0.0.1:{port} {{\n\tbind 127.0.0.1\n{site}\n}}\n"
            ),
        )
        .expect("writing the Caddyfile");
        succeed(&mut command("validate", dir.path(), &caddyfile));
        let process = Logged::spawn(
            &mut command("run", dir.path(), &caddyfile),
            dir.path().join("caddy.log"),
            "caddy",
        );
        let mut c = Self {
            process,
            port,
            _dir: dir,
        };
        c.wait_listening(Duration::from_secs(10));
        c
    }

    /// Until the site's port accepts; panics with the log when Caddy exits or takes too long.
    fn wait_listening(&mut self, timeout: Duration) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + timeout;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = self.process.exited() {
                panic!("caddy exited with {status}:\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "caddy did not listen on {addr} within {timeout:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything Caddy logged so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

/// `caddy <verb>` on `caddyfile`, with Caddy's data and config directories in `dir`.
fn command(verb: &str, dir: &Path, caddyfile: &Path) -> Command {
    let mut c = Command::new("caddy");
    c.arg(verb)
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .args(["--adapter", "caddyfile", "--config"])
        .arg(caddyfile);
    c
}
