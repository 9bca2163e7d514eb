//! The mode the backend is in and the counters, shared by every thread.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// Exit code for the `exit` mode; distinct from 1 (panic/failure) and 2
/// (usage) so tests can tell a deliberate crash from a broken fixture.
pub(crate) const EXIT_MODE_CODE: i32 = 3;

/// How often parked code paths look at the mode again. Tests expect a mode
/// switch to take effect within ~50 ms.
pub(crate) const MODE_POLL: Duration = Duration::from_millis(20);

/// Bound on request head size so a misbehaving client cannot make a
/// connection thread buffer without limit.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum Mode {
    Normal = 0,
    Slow = 1,
    StopAccepting = 2,
    NoRespond = 3,
    Exit = 4,
    Error = 5,
}

impl Mode {
    pub(crate) fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "normal" => Mode::Normal,
            "slow" => Mode::Slow,
            "stop-accepting" | "stop_accepting" => Mode::StopAccepting,
            "no-respond" | "no_respond" => Mode::NoRespond,
            "exit" => Mode::Exit,
            "error" => Mode::Error,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Slow => "slow",
            Mode::StopAccepting => "stop-accepting",
            Mode::NoRespond => "no-respond",
            Mode::Exit => "exit",
            Mode::Error => "error",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Slow,
            2 => Mode::StopAccepting,
            3 => Mode::NoRespond,
            4 => Mode::Exit,
            5 => Mode::Error,
            _ => Mode::Normal,
        }
    }
}

/// Everything shared between the accept loop, connection threads and the
/// control server. Atomics rather than a lock so that a connection stuck in
/// any mode can never block the control port.
pub(crate) struct Shared {
    pub(crate) mode: AtomicU8,
    pub(crate) delay_ms: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) responses: AtomicU64,
    /// Connections being served now, and the cap (`--workers`, 0 = none).
    pub(crate) active: AtomicU64,
    pub(crate) max_workers: u64,
}

impl Shared {
    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}
