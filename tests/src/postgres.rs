//! A private PostgreSQL 15 server of the test's own, in the clear or TLS-only.

use std::{path::Path, process::Command};

use crate::{certs::Issued, free_port, stdout_of};

/// A private PostgreSQL 15 server (Debian's binaries) on its own port and data directory, with
/// password authentication, so a test may stop and start it without touching anyone else's.
pub struct Postgres {
    pub port: u16,
    pub password: String,
    dir: tempfile::TempDir,
    /// `ssl = on` with the certificate and key copied into `dir`.
    tls: bool,
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
        let pg = Self::init();
        pg.resume();
        pg
    }

    /// `ssl = on` with `server`'s certificate, and a `pg_hba.conf` that lets TCP clients in only
    /// over TLS (`hostssl`): a client with `sslmode=disable` is refused by the server itself.
    pub fn start_tls(server: &Issued) -> Self {
        Self::start_tls_with(server, None)
    }

    /// [`Postgres::start_tls`], and `cert_user` (a role created here) logs in over TCP only
    /// with a client certificate `client_ca` signed, whose CN is its name (`cert`
    /// authentication); everyone else with a password, as before.
    pub fn start_tls_client_cert(server: &Issued, client_ca: &Path, cert_user: &str) -> Self {
        Self::start_tls_with(server, Some((client_ca, cert_user)))
    }

    fn start_tls_with(server: &Issued, client_cert: Option<(&Path, &str)>) -> Self {
        let mut pg = Self::init();
        let (cert, key) = (
            pg.dir.path().join("server.crt"),
            pg.dir.path().join("server.key"),
        );
        std::fs::copy(&server.cert, &cert).expect("copying the server certificate");
        std::fs::copy(&server.key, &key).expect("copying the server key");
        // PostgreSQL refuses a key that others may read.
        let (uid, gid) = pg_ids();
        for (path, mode) in [(&cert, 0o644), (&key, 0o600)] {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown");
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .expect("chmod");
        }
        let mut hba = String::from("local all all scram-sha-256\n");
        if let Some((ca, user)) = client_cert {
            let copy = pg.dir.path().join("client-ca.crt");
            std::fs::copy(ca, &copy).expect("copying the client CA");
            std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .expect("chmod");
            hba.push_str(&format!(
                "hostssl all {user} 127.0.0.1/32 cert\nhostssl all {user} ::1/128 cert\n"
            ));
        }
        hba.push_str(
            "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl all all ::1/128 scram-sha-256\n",
        );
        std::fs::write(pg.dir.path().join("data/pg_hba.conf"), hba).expect("writing pg_hba.conf");
        pg.tls = true;
        pg.resume();
        if let Some((_, user)) = client_cert {
            pg.psql(&format!("CREATE ROLE \"{user}\" LOGIN"));
        }
        pg
    }

    /// Runs one SQL statement as the superuser, over the Unix socket.
    pub fn psql(&self, sql: &str) {
        let out = as_postgres(&[
            "env",
            &format!("PGPASSWORD={}", self.password),
            &format!("{PG_BIN}/psql"),
            "-h",
            &self.dir.path().display().to_string(),
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ]);
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn init() -> Self {
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
        Self {
            port: free_port(),
            password,
            dir,
            tls: false,
        }
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts (again) on the same port and waits until it accepts connections.
    pub fn resume(&self) {
        let mut opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.path().display()
        );
        if self.tls {
            let d = self.dir.path().display();
            opts.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={d}/server.crt -c ssl_key_file={d}/server.key"
            ));
            if self.dir.path().join("client-ca.crt").exists() {
                opts.push_str(&format!(" -c ssl_ca_file={d}/client-ca.crt"));
            }
        }
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

/// The `postgres` user's ids, for the files its server must own.
fn pg_ids() -> (u32, u32) {
    let id = |flag| {
        stdout_of(Command::new("id").args([flag, "postgres"]))
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
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
