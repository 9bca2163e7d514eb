//! While a drain runs: the backend port's connections as the port's watching reads them for the
//! drain (`PortRead`: every tick, and between ticks once READ_EVERY has passed; on every
//! kernel tier, whatever the programs do). Between two reads, a connection not seen before is a new arrival, and new bytes
//! received on one already seen are a new request (several keep-alive requests within one
//! read count once); both are kept with the peer's address. In flight: connections in the
//! accept queue, with a request unread, or read and unanswered. The agent's own probe
//! connections are left out (the probe's ledger, as each read carries it): a new connection
//! is counted one read late, once the probe has had time to say it is its own.
//!
//! A connection that opens and closes between two reads is not seen: a sender that keeps
//! sending is seen within a few reads, but a single short request may pass unseen.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use super::{Drain, Phase, RECENT};
use crate::{
    checks::web::PortRead,
    net::{TcpConn, TCP_CLOSE_WAIT},
};

/// How far apart two reads of the connections may be while draining.
pub const READ_EVERY: Duration = Duration::from_millis(100);

/// What the reads of the port have shown since the drain started.
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
#[derive(Debug)]
pub(super) struct Reader {
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

impl Default for Reader {
    fn default() -> Self {
        Self {
            prev: HashMap::new(),
            fresh: Vec::new(),
            closed: HashSet::new(),
            first: true,
        }
    }
}

impl Reader {
    /// What `port`, read at `now`, shows since the previous read.
    fn read(&mut self, port: &PortRead, now: Instant) -> Read {
        let (conns, closed) = (&port.connections, &port.closed);
        let own: HashSet<SocketAddr> = port.own.iter().copied().map(key).collect();
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
        for c in conns {
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
        for remote in closed.iter().copied().map(key) {
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
        out
    }
}

impl Drain {
    /// When the drain wants the port read next: while draining, READ_EVERY after the latest
    /// read, or now before the first; None otherwise.
    pub fn next_read(&self) -> Option<Instant> {
        let g = self.lock();
        matches!(g.phase, Phase::Draining(_)).then(|| {
            g.progress
                .read_at
                .map_or_else(Instant::now, |t| t + READ_EVERY)
        })
    }

    /// Takes in a read of the port made at `now` (the port's watching's), while a drain runs.
    pub fn note_port(&self, read: std::io::Result<PortRead>, now: Instant) {
        let Some(mut g) = self.progress_mut() else {
            return;
        };
        let super::Inner {
            progress: p,
            reader,
            ..
        } = &mut *g;
        match read {
            Ok(port) => {
                let r = reader.read(&port, now);
                p.error = None;
                p.in_flight = r.in_flight;
                p.in_flight_at_start.get_or_insert(r.in_flight);
                p.read_total += r.arrivals.len() as u64;
                // What the kernel counted beyond what the reads saw: from peers the reads
                // missed.
                let unseen = p.kernel_total.saturating_sub(p.read_total + p.unseen_total);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::TCP_ESTABLISHED;

    const PORT: u16 = 8080;

    fn peer(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], port))
    }

    /// A connection from `from` whose `rx` bytes received were all answered.
    fn answered(from: SocketAddr, rx: u64) -> TcpConn {
        TcpConn {
            state: TCP_ESTABLISHED,
            local: SocketAddr::from(([127, 0, 0, 1], PORT)),
            remote: from,
            inode: 7,
            last_data_sent_ms: 10,
            last_data_recv_ms: 20,
            last_ack_recv_ms: 10,
            unacked: 0,
            bytes_acked: 1 + 100 * rx,
            bytes_received: rx,
            unread: 0,
        }
    }

    /// … whose latest request was read and not answered.
    fn serving(from: SocketAddr, rx: u64) -> TcpConn {
        TcpConn {
            last_data_recv_ms: 5,
            ..answered(from, rx)
        }
    }

    fn read(conns: Vec<TcpConn>, closed: Vec<SocketAddr>, own: Vec<SocketAddr>) -> PortRead {
        PortRead {
            connections: conns,
            closed,
            own,
        }
    }

    fn ips(r: &Read) -> Vec<Option<IpAddr>> {
        r.arrivals.iter().map(|(_, ip)| *ip).collect()
    }

    #[test]
    fn connections_there_before_count_only_for_what_comes_next() {
        let (a, b) = (peer(1, 40_000), peer(2, 40_000));
        let mut reader = Reader::default();
        let t0 = Instant::now();
        let first = reader.read(
            &read(vec![answered(a, 1), serving(b, 1)], vec![], vec![]),
            t0,
        );
        assert_eq!((first.in_flight, ips(&first)), (1, vec![]));
        // A keep-alive request more on `a`; `b` answered and silent.
        let t1 = t0 + READ_EVERY;
        let next = reader.read(
            &read(vec![serving(a, 2), answered(b, 1)], vec![], vec![]),
            t1,
        );
        assert_eq!((next.in_flight, ips(&next)), (1, vec![Some(a.ip())]));
        assert_eq!(next.arrivals[0].0, t1);
        // Several requests within one read count once.
        let next = reader.read(&read(vec![answered(a, 9)], vec![], vec![]), t1 + READ_EVERY);
        assert_eq!((next.in_flight, ips(&next)), (0, vec![Some(a.ip())]));
    }

    #[test]
    fn a_new_connection_counts_one_read_late_unless_the_probe_claims_it() {
        let (client, probe) = (peer(3, 41_000), peer(4, 41_001));
        let mut reader = Reader::default();
        let t0 = Instant::now();
        reader.read(&read(vec![], vec![], vec![]), t0);
        let t1 = t0 + READ_EVERY;
        let both = vec![serving(client, 1), serving(probe, 1)];
        // Both new: in flight at once, counted at the next read, when the probe has said which
        // is its own.
        let r = reader.read(&read(both.clone(), vec![], vec![]), t1);
        assert_eq!((r.in_flight, ips(&r)), (2, vec![]));
        let r = reader.read(&read(both, vec![], vec![probe]), t1 + READ_EVERY);
        // Counted when it was first seen, and the probe's own never, nor in flight.
        assert_eq!(r.arrivals, vec![(t1, Some(client.ip()))]);
        assert_eq!(r.in_flight, 1);
    }

    #[test]
    fn a_connection_that_came_and_went_between_reads_counts_once_from_time_wait() {
        let (quick, own) = (peer(5, 42_000), peer(6, 42_001));
        let mut reader = Reader::default();
        let t0 = Instant::now();
        // Closed before the drain began: no arrival of the drain's.
        reader.read(&read(vec![], vec![peer(7, 42_002)], vec![]), t0);
        let t1 = t0 + READ_EVERY;
        let r = reader.read(
            &read(vec![], vec![quick, own, peer(7, 42_002)], vec![own]),
            t1,
        );
        assert_eq!((r.in_flight, ips(&r)), (0, vec![Some(quick.ip())]));
        // The kernel keeps it for a minute: seen again, it is no new arrival.
        let r = reader.read(&read(vec![], vec![quick], vec![]), t1 + READ_EVERY);
        assert!(r.arrivals.is_empty(), "{:?}", r.arrivals);
    }

    #[test]
    fn in_flight_is_queued_unread_or_unanswered_and_a_peers_close_is_no_request() {
        let mut reader = Reader::default();
        let queued = TcpConn {
            inode: 0,
            ..answered(peer(8, 43_000), 0)
        };
        let unread = TcpConn {
            unread: 20,
            ..answered(peer(9, 43_000), 20)
        };
        let closed_by_peer = TcpConn {
            state: TCP_CLOSE_WAIT,
            unread: 1,
            ..answered(peer(10, 43_000), 21)
        };
        let conns = vec![
            queued,
            unread,
            closed_by_peer,
            answered(peer(11, 43_000), 3),
        ];
        let r = reader.read(&read(conns, vec![], vec![]), Instant::now());
        assert_eq!(r.in_flight, 2);
    }

    #[test]
    fn the_drain_takes_the_monitors_reads_and_says_when_it_wants_the_next() {
        let drain = Drain::new(None, true, Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(drain.next_read(), None, "no drain: no reads");
        drain.note_port(Ok(read(vec![serving(peer(1, 1), 1)], vec![], vec![])), t0);
        assert!(drain.progress().is_none());

        drain.start(super::super::By::Command).unwrap();
        assert!(
            drain.next_read().is_some_and(|t| t <= Instant::now()),
            "at once"
        );
        drain.note_port(Ok(read(vec![serving(peer(1, 1), 1)], vec![], vec![])), t0);
        assert_eq!(drain.next_read(), Some(t0 + READ_EVERY));
        let err = std::io::Error::other("sock_diag: no buffer space");
        drain.note_port(Err(err), t0 + READ_EVERY);
        let (p, _) = drain.progress().unwrap();
        assert_eq!((p.reads, p.in_flight), (1, 1));
        assert!(p.error.as_deref().is_some_and(|e| e.contains("no buffer")));
        // Arrivals the kernel counted and no read saw come from unseen peers.
        drain.note_kernel(Some(10), 0, t0);
        drain.note_kernel(Some(12), 0, t0 + READ_EVERY);
        let t2 = t0 + READ_EVERY * 2;
        drain.note_port(Ok(read(vec![], vec![], vec![])), t2);
        let (p, _) = drain.progress().unwrap();
        assert_eq!((p.reads, p.in_flight, p.error.clone()), (2, 0, None));
        assert_eq!(p.peers_within(t2, READ_EVERY), vec![(None, 2)]);
        assert_eq!(p.last_new, Some(t2));
    }
}
