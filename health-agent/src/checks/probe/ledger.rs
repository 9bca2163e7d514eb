//! The probe's ledger: what the agent's own probes put on the backend's port. The kernel view
//! and sock_diag see a probe like any other request, so whoever reads the port leaves the
//! probe's connections out (`own_sources`) and takes its requests off the kernel's count of
//! arrivals (`started`). One ledger per agent, made where the checks are wired and handed to
//! the probe task (which writes it) and to the readers of the port.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// How long a probe connection's local address is remembered: longer than the backend may keep
/// its side of the connection after the probe closed its own.
const OWN_KEEP: Duration = Duration::from_secs(30);

/// Cheap to clone: every clone is the same ledger.
#[derive(Debug, Clone, Default)]
pub struct ProbeLedger {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The local addresses of recent probe connections, newest last.
    own: Mutex<VecDeque<(Instant, SocketAddr)>>,
    /// Probes begun since the agent started, counted before they connect.
    started: AtomicU64,
}

impl ProbeLedger {
    /// A probe begins: counted before it connects, so a reader never sees its arrival first.
    pub fn begin(&self) {
        self.inner.started.fetch_add(1, Ordering::Relaxed);
    }

    /// Probes begun so far: the kernel's count of arrivals less these is what others sent.
    pub fn started(&self) -> u64 {
        self.inner.started.load(Ordering::Relaxed)
    }

    /// A connection of the agent's own, from `local`, made at `now`.
    pub fn note_own(&self, local: SocketAddr, now: Instant) {
        let mut own = self.inner.own.lock().unwrap_or_else(|e| e.into_inner());
        while own
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > OWN_KEEP)
        {
            own.pop_front();
        }
        own.push_back((now, local));
    }

    /// The local addresses of the agent's own probe connections of the last OWN_KEEP (as of
    /// the latest one noted): whoever reads the port leaves them out.
    pub fn own_sources(&self) -> Vec<SocketAddr> {
        let own = self.inner.own.lock().unwrap_or_else(|e| e.into_inner());
        own.iter().map(|(_, a)| *a).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn every_clone_reads_what_any_clone_wrote() {
        let ledger = ProbeLedger::default();
        let (probe_task, drain) = (ledger.clone(), ledger.clone());
        assert_eq!(drain.started(), 0);
        assert!(drain.own_sources().is_empty());
        probe_task.begin();
        probe_task.begin();
        probe_task.note_own(addr(40_001), Instant::now());
        assert_eq!(drain.started(), 2);
        assert_eq!(ledger.own_sources(), vec![addr(40_001)]);
    }

    #[test]
    fn two_ledgers_share_nothing() {
        let (a, b) = (ProbeLedger::default(), ProbeLedger::default());
        a.begin();
        a.note_own(addr(40_002), Instant::now());
        assert_eq!((b.started(), b.own_sources()), (0, Vec::new()));
    }

    #[test]
    fn own_connections_are_forgotten_after_they_can_no_longer_show() {
        let ledger = ProbeLedger::default();
        let t0 = Instant::now();
        ledger.note_own(addr(40_003), t0);
        ledger.note_own(addr(40_004), t0 + Duration::from_secs(10));
        // Still within OWN_KEEP of the first: both kept, oldest first.
        ledger.note_own(addr(40_005), t0 + OWN_KEEP);
        assert_eq!(
            ledger.own_sources(),
            vec![addr(40_003), addr(40_004), addr(40_005)]
        );
        // Past it: the first goes, the others stay.
        ledger.note_own(addr(40_006), t0 + OWN_KEEP + Duration::from_secs(1));
        assert_eq!(
            ledger.own_sources(),
            vec![addr(40_004), addr(40_005), addr(40_006)]
        );
    }
}
