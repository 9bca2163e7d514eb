//! A private PostgreSQL 15 server of the test's own.

use std::{path::Path, process::Command};

use crate::free_port;

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
