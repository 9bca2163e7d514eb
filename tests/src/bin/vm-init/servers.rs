//! The fixture backend under a supervisor thread, and the agent (from the binary or the .deb).

use std::{
    fs, io,
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use super::*;

/// The fixture backend under a supervisor that starts it again whenever it exits, until the
/// scenario ends.
pub(crate) struct Backend {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicU64>,
    supervisor: Option<thread::JoinHandle<()>>,
}

impl Backend {
    pub(crate) fn start(args: &[&str]) -> io::Result<Backend> {
        let _ = fs::remove_file(RESTARTS);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU64::new(0));
        let spawn = {
            let args = args.clone();
            move || -> io::Result<Child> {
                let child = Command::new("/bin/fixture-backend")
                    .args(["--listen", &format!("127.0.0.1:{WEB}")])
                    .args(["--control", &format!("127.0.0.1:{CONTROL}")])
                    .args(&args)
                    .stdout(Stdio::null())
                    .spawn()?;
                fs::write(BACKEND_PID, child.id().to_string())?;
                Ok(child)
            }
        };
        let mut first = spawn()?;
        pid.store(u64::from(first.id()), Ordering::SeqCst);
        let supervisor = {
            let (stop, pid) = (stop.clone(), pid.clone());
            thread::spawn(move || loop {
                // Polled, so that a stop is seen while the child runs.
                while matches!(first.try_wait(), Ok(None)) {
                    if stop.load(Ordering::SeqCst) {
                        let _ = first.kill();
                        let _ = first.wait();
                        return;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
                match spawn() {
                    Ok(c) => {
                        pid.store(u64::from(c.id()), Ordering::SeqCst);
                        first = c;
                    }
                    Err(e) => {
                        say(&format!("vm-error respawning the backend: {e}"));
                        return;
                    }
                }
            })
        };
        wait_until(Duration::from_secs(20), || {
            TcpStream::connect(("127.0.0.1", CONTROL)).is_ok()
        })?;
        Ok(Backend {
            stop,
            pid,
            supervisor: Some(supervisor),
        })
    }

    pub(crate) fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid.load(Ordering::SeqCst) as i32, sig);
        }
    }

    pub(crate) fn pid(&self) -> u64 {
        self.pid.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self.supervisor.take() {
            let _ = s.join();
        }
    }
}

pub(crate) fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> io::Result<()> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if ready() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("not ready within {limit:?}"),
    ))
}

/// The agent, its log in [`AGENT_LOG`].
pub(crate) struct Agent(Child);

impl Agent {
    pub(crate) fn start(config: &str) -> io::Result<Agent> {
        write_config(config)?;
        let log = fs::File::create(AGENT_LOG)?;
        let child = Command::new("/bin/health-agent")
            .args(["--config", CONFIG, "serve"])
            .env("RUST_LOG", "info")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Agent(child))
    }
}

/// The static agent's configuration file, [`CONFIG`].
pub(crate) fn write_config(config: &str) -> io::Result<()> {
    fs::create_dir_all("/etc/health-agent")?;
    fs::write(CONFIG, config)
}

/// A drop-in for this backend beside the .deb's shipped configuration.
pub(crate) fn deb_drop_in() -> io::Result<()> {
    fs::create_dir_all("/etc/health-agent/conf.d")?;
    fs::write(
        "/etc/health-agent/conf.d/vm.toml",
        format!(
            "[server]\ndetails = \"always\"\n[checks]\nboot_grace = \"0s\"\n[web]\nport = {WEB}\n"
        ),
    )
}

/// The .deb's agent (glibc, `/usr/bin/health-agent`) as its unit starts it: the shipped
/// configuration and its drop-ins.
pub(crate) fn start_deb_agent() -> io::Result<Agent> {
    let log = fs::File::create(AGENT_LOG)?;
    let child = Command::new("/usr/bin/health-agent")
        .arg("serve")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok(Agent(child))
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}
