//! While a drain runs: the backend port's connections, read through sock_diag every READ_EVERY
//! (on every kernel tier, whatever the programs do). Between two reads, a connection not seen
//! before is a new arrival, and new bytes received on one already seen are a new request (several
//! keep-alive requests within one read count once); both are kept with the peer's address. In
//! flight: connections in the accept queue, with a request unread, or read and unanswered. The
//! agent's own probe connections are left out (the probe's ledger): a new connection is
//! counted one read late, once the probe has had time to say it is its own.
//!
//! A connection that opens and closes between two reads is not seen: a sender that keeps
//! sending is seen within a few reads, but a single short request may pass unseen.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use super::{Drain, RECENT};
use crate::{
    checks::probe::{ProbeLedger, SharedProbeTarget},
    net::{Diag, ListenAddrs, TcpConn, TCP_CLOSE_WAIT},
    netns::Namespace,
};

/// How often the connections are read while draining.
pub const READ_EVERY: Duration = Duration::from_millis(100);

/// What the watcher has seen since the drain started.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Reads made, and when the latest was.
    pub reads: u64,
    pub read_at: Option<Instant>,
    /// Requests in flight at the latest read.
    pub in_flight: u32,
    /// … and at the first.
    pub in_flight_at_start: Option<u32>,
    /// The latest new connection or request.
    pub last_new: Option<Instant>,
    /// New connections and requests of the last RECENT: when, from which peer (None: counted
    /// by the kernel, missed by the reads), how many. Oldest first.
    pub arrivals: VecDeque<(Instant, Option<IpAddr>, u32)>,
    /// Arrivals the kernel counted, the agent's probes left out (while the connection
    /// programs are attached), and those the reads counted: the kernel's surplus is added as
    /// arrivals from unseen peers.
    pub kernel_total: u64,
    pub read_total: u64,
    pub unseen_total: u64,
    /// The latest read failed.
    pub error: Option<String>,
}

impl Progress {
    /// `n` arrivals from `peer` at `at` (no earlier than the last noted).
    pub fn add(&mut self, at: Instant, peer: Option<IpAddr>, n: u32) {
        if n == 0 {
            return;
        }
        self.last_new = Some(self.last_new.map_or(at, |l| l.max(at)));
        match self.arrivals.back_mut() {
            Some((t, p, count)) if *t == at && *p == peer => *count += n,
            _ => self.arrivals.push_back((at, peer, n)),
        }
    }

    /// Arrivals within `span` before `now`, by peer, most first.
    pub fn peers_within(&self, now: Instant, span: Duration) -> Vec<(Option<IpAddr>, u32)> {
        let mut by: HashMap<Option<IpAddr>, u32> = HashMap::new();
        for (t, ip, n) in &self.arrivals {
            if now.saturating_duration_since(*t) <= span {
                *by.entry(*ip).or_default() += n;
            }
        }
        let mut v: Vec<_> = by.into_iter().collect();
        // Most first; the unseen after the named at the same count.
        v.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then((a.0.is_none(), a.0).cmp(&(b.0.is_none(), b.0)))
        });
        v
    }
}

/// A connection's request state at the previous read.
#[derive(Debug, Clone, Copy)]
struct Seen {
    bytes_received: u64,
    /// Its first request already counted (with the connection).
    counted: bool,
}

/// The connections between reads.
#[derive(Debug, Default)]
struct Reader {
    diag: Option<(Arc<Namespace>, Diag)>,
    prev: HashMap<SocketAddr, Seen>,
    /// Connections first seen at the previous read, counted at this one unless the probe
    /// claimed them meanwhile.
    fresh: Vec<(SocketAddr, Instant, u64)>,
    /// The TIME_WAIT peers of the previous read.
    closed: HashSet<SocketAddr>,
    first: bool,
}

/// What one read found.
struct Read {
    in_flight: u32,
    arrivals: Vec<(Instant, Option<IpAddr>)>,
}

fn key(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Work the server holds on `c`: queued, a request unread, or read and unanswered.
fn holds_work(c: &TcpConn) -> bool {
    // A peer's FIN takes one sequence number: one byte unread on a connection closed by its
    // peer is no request.
    let unread = if c.state == TCP_CLOSE_WAIT {
        c.unread.saturating_sub(1)
    } else {
        c.unread
    };
    c.inode == 0 || unread > 0 || c.request_unanswered()
}

impl Reader {
    fn new() -> Self {
        Self {
            first: true,
            ..Self::default()
        }
    }

    /// The port's open connections, and the peers of those the server closed lately.
    fn connections(
        &mut self,
        target: &SharedProbeTarget,
        port: u16,
    ) -> std::io::Result<(Vec<TcpConn>, Vec<SocketAddr>)> {
        let Some(t) = target.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            // The backend has not been seen listening: nothing can reach it.
            return Ok(Default::default());
        };
        if !self
            .diag
            .as_ref()
            .is_some_and(|(ns, _)| Arc::ptr_eq(ns, &t.ns))
        {
            self.diag = Some((t.ns.clone(), Diag::new(&t.ns)?));
        }
        let Some((_, diag)) = &self.diag else {
            return Ok(Default::default());
        };
        let listeners = diag.listeners_on(port)?;
        if listeners.is_empty() {
            // Stopped: nothing can reach it.
            return Ok(Default::default());
        }
        let on = ListenAddrs::of(&listeners);
        Ok((
            diag.server_connections(port, &on)?,
            diag.server_time_wait(port, &on)?,
        ))
    }

    fn read(
        &mut self,
        target: &SharedProbeTarget,
        probes: &ProbeLedger,
        port: u16,
        now: Instant,
    ) -> std::io::Result<Read> {
        let (conns, closed) = self.connections(target, port)?;
        let own: HashSet<SocketAddr> = probes.own_sources().into_iter().map(key).collect();
        let mut out = Read {
            in_flight: 0,
            arrivals: Vec::new(),
        };
        for (remote, seen_at, _) in std::mem::take(&mut self.fresh) {
            if !own.contains(&remote) {
                out.arrivals.push((seen_at, Some(remote.ip())));
            }
        }
        let mut next = HashMap::with_capacity(conns.len());
        for c in &conns {
            let remote = key(c.remote);
            if own.contains(&remote) {
                continue;
            }
            if holds_work(c) {
                out.in_flight += 1;
            }
            let seen = match self.prev.get(&remote) {
                Some(s) => {
                    let more = c.bytes_received > s.bytes_received;
                    if more && s.counted {
                        out.arrivals.push((now, Some(remote.ip())));
                    }
                    Seen {
                        bytes_received: c.bytes_received,
                        counted: s.counted || more,
                    }
                }
                None => {
                    if !self.first {
                        self.fresh.push((remote, now, c.bytes_received));
                    }
                    Seen {
                        bytes_received: c.bytes_received,
                        // Connections there before the drain count only for what comes next.
                        counted: self.first || c.bytes_received > 0,
                    }
                }
            };
            next.insert(remote, seen);
        }
        // Closed by the server since the previous read without being seen open: it came and
        // went between two reads. Kept by the kernel for a minute; each counts once.
        let fresh: HashSet<SocketAddr> = self.fresh.iter().map(|(r, _, _)| *r).collect();
        let mut closed_now = HashSet::with_capacity(closed.len());
        for remote in closed.into_iter().map(key) {
            let known = self.prev.contains_key(&remote)
                || next.contains_key(&remote)
                || self.closed.contains(&remote)
                || fresh.contains(&remote);
            if !known && !self.first && !own.contains(&remote) {
                out.arrivals.push((now, Some(remote.ip())));
            }
            closed_now.insert(remote);
        }
        self.closed = closed_now;
        self.prev = next;
        self.first = false;
        Ok(out)
    }
}

/// Reads the backend's connections while a drain runs (leaving out what `probes` says is the
/// agent's own); sleeps until one starts otherwise.
pub fn spawn_watch(
    drain: Drain,
    target: Option<SharedProbeTarget>,
    probes: ProbeLedger,
    port: u16,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let wake = drain.woken();
        loop {
            if drain.progress_mut().is_none() {
                tokio::select! {
                    _ = wake.notified() => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
            let mut reader = Reader::new();
            loop {
                let now = Instant::now();
                let read = match &target {
                    Some(t) if port != 0 => reader.read(t, &probes, port, now),
                    _ => Ok(Read {
                        in_flight: 0,
                        arrivals: Vec::new(),
                    }),
                };
                {
                    let Some(mut g) = drain.progress_mut() else {
                        break;
                    };
                    let p = &mut g.progress;
                    match read {
                        Ok(r) => {
                            p.error = None;
                            p.in_flight = r.in_flight;
                            p.in_flight_at_start.get_or_insert(r.in_flight);
                            p.read_total += r.arrivals.len() as u64;
                            // What the kernel counted beyond what the reads saw: from peers
                            // the reads missed.
                            let unseen =
                                p.kernel_total.saturating_sub(p.read_total + p.unseen_total);
                            p.unseen_total += unseen;
                            for (t, ip) in r.arrivals {
                                p.add(t, ip, 1);
                            }
                            p.add(now, None, u32::try_from(unseen).unwrap_or(u32::MAX));
                            p.reads += 1;
                        }
                        Err(e) => p.error = Some(e.to_string()),
                    }
                    p.read_at = Some(now);
                    while p
                        .arrivals
                        .front()
                        .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > RECENT)
                    {
                        p.arrivals.pop_front();
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(READ_EVERY) => {}
                    _ = wake.notified() => break,
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    })
}
