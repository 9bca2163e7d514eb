//! Child processes behind guards, and the root check.

use std::{
    path::PathBuf,
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::{Duration, Instant},
};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Integration tests need root (eBPF, mounts); say so plainly instead of failing obscurely.
pub fn require_root() {
    assert!(
        is_root(),
        "this integration test needs root (eBPF programs, tmpfs mounts); run `cargo xtask test` as root"
    );
}

/// Runs `cmd` to its end and returns what it printed; panics, naming the command with its status,
/// stdout and stderr, when it cannot start or does not succeed. The one way the harness runs a
/// tool that must work (`cargo xtask setup` installs them, `cargo xtask services` starts dockerd).
pub fn succeed(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (cargo xtask setup installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// [`succeed`]'s stdout, trimmed.
pub fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&succeed(cmd).stdout)
        .trim()
        .to_string()
}

/// Sends `signal`, waits up to 5 s for the child to exit, then kills it.
pub(crate) fn kill_and_wait(child: &mut Child, signal: i32) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, signal) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A child process, continued (if stopped) and terminated on drop: SIGCONT, SIGTERM, and
/// SIGKILL when it has not exited 5 s later. The guard of every server this crate starts that
/// needs nothing more, and of `cargo xtask`'s (demo, bench).
pub struct Proc(pub Child);

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stopped process must be continued before it can act on SIGTERM.
        self.signal(libc::SIGCONT);
        kill_and_wait(&mut self.0, libc::SIGTERM);
    }
}

/// A server whose output goes to a log file, killed (SIGKILL) on drop: for one that keeps
/// nothing worth a graceful stop (a load balancer, whose graceful stop waits for its
/// connections).
pub struct Logged {
    child: Child,
    log: PathBuf,
}

impl Logged {
    /// Starts `cmd` with no stdin and its stdout and stderr in a new file `log`; panics with
    /// `what` when it cannot start.
    pub fn spawn(cmd: &mut Command, log: PathBuf, what: &str) -> Self {
        let file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e} (cargo xtask setup installs it)"));
        Self { child, log }
    }

    /// Everything it printed so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
