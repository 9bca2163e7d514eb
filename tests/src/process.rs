//! Child processes behind guards, and the root check.

use std::{
    process::Child,
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
