//! nginx (Debian package) serving static files on a loopback port, in the foreground: for the
//! tests (a body of their choosing) and for `cargo xtask bench` (tuned for throughput).

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{free_port, get, kill_and_wait, wait_until};

/// What goes into nginx.conf, and the files it serves.
#[derive(Debug, Clone)]
pub struct NginxOptions {
    pub workers: u32,
    pub worker_connections: u32,
    pub keepalive_requests: u64,
    /// Of the listen socket.
    pub backlog: u32,
    pub default_type: &'static str,
    /// Goes into the `http` block.
    pub http_extra: String,
    /// (name, body) under its root, besides `up` ("ok\n"), which it is asked for until it
    /// answers.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Default for NginxOptions {
    /// The tests': 2 workers, a modest backlog.
    fn default() -> Self {
        Self {
            workers: 2,
            worker_connections: 4096,
            keepalive_requests: 100_000,
            backlog: 512,
            default_type: "text/plain",
            http_extra: String::new(),
            files: Vec::new(),
        }
    }
}

impl NginxOptions {
    /// The bench's: `workers` workers, room for wrk's connections, keep-alive that never runs
    /// out within a run, JSON bodies.
    pub fn bench(workers: u32) -> Self {
        Self {
            workers,
            worker_connections: 8192,
            keepalive_requests: 1_000_000,
            backlog: 4096,
            default_type: "application/json",
            ..Self::default()
        }
    }

    /// Serves `body` as `/name`.
    pub fn file(mut self, name: &str, body: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.to_string(), body.into()));
        self
    }
}

/// nginx in the foreground. Dropping it continues (if stopped) and stops master and workers.
pub struct Nginx {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Nginx {
    /// Serves `body` as `/` (`index.html`).
    pub fn start(body: &[u8]) -> Self {
        Self::start_with(body, "")
    }

    /// `extra` goes into the `http` block.
    pub fn start_with(body: &[u8], extra: &str) -> Self {
        Self::launch(
            NginxOptions {
                http_extra: extra.to_string(),
                ..NginxOptions::default()
            }
            .file("index.html", body),
        )
    }

    /// Writes the files and nginx.conf to a temp dir, starts nginx on a free loopback port and
    /// waits until it answers `/up`.
    pub fn launch(options: NginxOptions) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("www");
        std::fs::create_dir_all(&root).expect("www dir");
        for (name, body) in &options.files {
            std::fs::write(root.join(name), body).expect("body");
        }
        std::fs::write(root.join("up"), b"ok\n").expect("up");
        let d = dir.path().display();
        let NginxOptions {
            workers,
            worker_connections,
            keepalive_requests,
            backlog,
            default_type,
            http_extra: extra,
            ..
        } = &options;
        let conf = format!(
            "worker_processes {workers};\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections {worker_connections}; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n  fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n  scgi_temp_path {d}/tmp;\n  keepalive_requests {keepalive_requests};\n  {extra}\n\
             server {{\n    listen 127.0.0.1:{port} backlog={backlog};\n    root {root};\n    location / {{ default_type {default_type}; }}\n  }}\n}}\n",
            root = root.display()
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nginx — install Debian's nginx-light (cargo xtask setup does)");
        // Stopped on drop if the wait below panics.
        let nginx = Self { child, port, dir };
        wait_until(Duration::from_secs(10), "nginx to answer", || {
            get(port, "/up").ok().filter(|(c, _)| *c == 200)
        });
        nginx
    }

    /// Pids of the master and its workers.
    pub fn pids(&self) -> Vec<u32> {
        let master = self.child.id();
        let mut pids = vec![master];
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        pids
    }

    pub fn signal_all(&self, sig: i32) {
        for p in self.pids() {
            // SAFETY: signalling nginx processes we started.
            unsafe { libc::kill(p as i32, sig) };
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.signal_all(libc::SIGCONT);
        kill_and_wait(&mut self.child, libc::SIGQUIT);
    }
}
