//! Every read of the backend's port through sock_diag, in one place: its socket in the
//! backend's namespace (`PortSocket`), the watching's own reads of the port's connections (on a
//! cadence that follows the traffic), and the drain's (each tick while it wants them). When both
//! look at the same listeners, one dump serves both. What a read saw is kept here as a value
//! (`SocketView`, and the `Moves` since the read before); the judge weighs it, the drain gets the
//! `PortRead`.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::{
    process,
    progress::Moves,
    sockets::{PortRead, SocketMoves, SocketView},
    target::Target,
};
use crate::net::{self, Diag, ListenAddrs, Listener};

/// The sock_diag socket the watching reads the backend's port with, made in its namespace.
pub struct PortSocket {
    diag: Diag,
    port: u16,
}

impl PortSocket {
    /// A socket in `target`'s namespace, for its port.
    pub fn open(target: &Target) -> std::io::Result<Self> {
        Ok(Self {
            diag: Diag::new(&target.ns)?,
            port: target.port,
        })
    }

    /// The port's listeners.
    pub fn listeners(&self) -> std::io::Result<Vec<Listener>> {
        self.diag.listeners_on(self.port)
    }

    /// Every TCP connection of the namespace.
    pub fn connections(&self) -> std::io::Result<Vec<net::TcpConn>> {
        self.diag.connections()
    }
}

/// How often the port's connections are read while nothing goes on.
pub(super) const QUIET_READ_EVERY: Duration = Duration::from_secs(1);
/// … unless a read takes more than this share of the agent's thread: then the quiet reads
/// space out so that they stay within it (1 %). A read costs about 2 µs per connection of the
/// port (10,000 idle ones: 15–20 ms), so past about 5,000 connections a request arriving on an
/// idle one is seen a little later than QUIET_READ_EVERY; the probe and the listener's queue,
/// read every tick, are not.
const QUIET_BUDGET: u32 = 100;
/// … but never further apart than this, whatever one read cost.
const QUIET_READ_MAX: Duration = Duration::from_secs(5);
/// … and every tick for this long after a read that saw traffic: short requests on their own
/// connections (50 ms, a dozen a second) mostly live between two reads, so a read that finds
/// the port empty says little; read once a second, their answers would show seconds apart and
/// read as the server going quiet.
const TRAFFIC_HOLD: Duration = Duration::from_secs(2);

/// The port's connections as sock_diag showed them, and when to read them again.
#[derive(Debug)]
pub struct PortReader {
    /// Where the port's listeners are bound: the reads ask for their families and keep their
    /// sockets only.
    listen_addrs: ListenAddrs,
    /// What moved on the port's connections between two reads.
    moves: SocketMoves,
    /// The latest read's view; None before the first, or when it failed.
    view: Option<SocketView>,
    /// When `view` was read.
    at: Option<Instant>,
    /// Why the latest read failed.
    error: Option<String>,
    /// What moved between the two latest reads.
    last_moves: Moves,
    /// The latest read that saw traffic: something moved, or work was there.
    traffic_at: Option<Instant>,
    /// How often the port's connections are read while nothing goes on: QUIET_READ_EVERY, or
    /// longer when a read costs more than QUIET_BUDGET allows.
    quiet_every: Duration,
    /// Others (the drain) want each tick's read of the port…
    wanted: bool,
    /// … and this tick's, until it is handed over (`take_for_others`).
    for_others: Option<std::io::Result<PortRead>>,
}

impl Default for PortReader {
    fn default() -> Self {
        Self {
            listen_addrs: ListenAddrs::default(),
            moves: SocketMoves::default(),
            view: None,
            at: None,
            error: None,
            last_moves: Moves::default(),
            traffic_at: None,
            quiet_every: QUIET_READ_EVERY,
            wanted: false,
            for_others: None,
        }
    }
}

impl PortReader {
    /// Notes where the port's listeners are bound, as the latest look at them found.
    pub fn note_listeners(&mut self, listeners: &[net::Listener]) {
        self.listen_addrs = ListenAddrs::of(listeners);
    }

    /// Whether each tick reads the port for others (`take_for_others`).
    pub fn want_reads(&mut self, want: bool) {
        self.wanted = want;
        if !want {
            self.for_others = None;
        }
    }

    /// The port now, for others: its connections and the peers of those the server closed
    /// lately, while a listener holds it; nothing before the backend is found (`target`
    /// None) or while nothing listens (then nothing can reach it). `own`: the local addresses
    /// of the agent's probe connections.
    pub fn read_for_others(
        &self,
        target: Option<&PortSocket>,
        own: Vec<SocketAddr>,
    ) -> std::io::Result<PortRead> {
        Self::read_with(target, own).map(|(read, _)| read)
    }

    /// At the start of a tick, while others want the port: the read for them, kept until
    /// `take_for_others`; and its connections when they are also what the monitor's own read
    /// would find (the same listeners), for `read`.
    pub fn read_for_tick(
        &mut self,
        target: Option<&PortSocket>,
        own: impl FnOnce() -> Vec<SocketAddr>,
    ) -> Option<Vec<net::TcpConn>> {
        if !self.wanted {
            return None;
        }
        let (read, shared) = match Self::read_with(target, own()) {
            Ok((read, on)) => {
                let shared =
                    (on.as_ref() == Some(&self.listen_addrs)).then(|| read.connections.clone());
                (Ok(read), shared)
            }
            Err(e) => (Err(e), None),
        };
        self.for_others = Some(read);
        shared
    }

    /// This tick's read for others, handed over once.
    pub fn take_for_others(&mut self) -> Option<std::io::Result<PortRead>> {
        self.for_others.take()
    }

    /// The read, and the listeners' addresses its connections were filtered by (None: nothing
    /// was dumped).
    fn read_with(
        target: Option<&PortSocket>,
        own: Vec<SocketAddr>,
    ) -> std::io::Result<(PortRead, Option<ListenAddrs>)> {
        let Some(t) = target else {
            return Ok((PortRead::default(), None));
        };
        let listeners = t.listeners()?;
        if listeners.is_empty() {
            return Ok((PortRead::default(), None));
        }
        let on = ListenAddrs::of(&listeners);
        let connections = t.diag.server_connections(t.port, &on)?;
        let closed = t.diag.server_time_wait(t.port, &on)?;
        Ok((
            PortRead {
                connections,
                closed,
                own,
            },
            Some(on),
        ))
    }

    /// Reads the port's connections into the view (None when there is no target yet or
    /// sock_diag failed; the failure is kept, see `error`) and returns what moved on them
    /// since the previous read. `shared`: this tick's connections, already read for others
    /// (`read_for_tick`): not read again, and not what a read costs. `own`: the local
    /// addresses of the agent's probe connections (asked after the dump), whose closing is
    /// never the server moving.
    pub fn read(
        &mut self,
        target: Option<&PortSocket>,
        own: impl FnOnce() -> Vec<SocketAddr>,
        shared: Option<Vec<net::TcpConn>>,
        now: Instant,
    ) -> Option<Moves> {
        self.view = None;
        self.error = None;
        let t = target?;
        let cpu_before = process::thread_cpu_time().filter(|_| shared.is_none());
        let read = match shared {
            Some(conns) => Ok(conns),
            None => t.diag.server_connections(t.port, &self.listen_addrs),
        };
        match read {
            Ok(conns) => {
                let v = SocketView::of(&conns);
                let moves = self.moves.update(&conns, &v, &own());
                if let (Some(a), Some(b)) = (cpu_before, process::thread_cpu_time()) {
                    self.quiet_every = (b.saturating_sub(a) * QUIET_BUDGET)
                        .clamp(QUIET_READ_EVERY, QUIET_READ_MAX);
                }
                if moves.read
                    || moves.answered
                    || moves.taken
                    || moves.gone
                    || v.unaccepted + v.unread + v.pending > 0
                {
                    self.traffic_at = Some(now);
                }
                self.last_moves = moves;
                self.view = Some(v);
                self.at = Some(now);
                Some(moves)
            }
            Err(e) => {
                self.error = Some(e.to_string());
                None
            }
        }
    }

    /// Whether a read is due now. A dump walks every TCP socket of the namespace (the kernel
    /// filters by port only after that), so while nothing goes on it is made once every
    /// QUIET_READ_EVERY (or less often, see QUIET_BUDGET); work or traffic seen at the last
    /// read or a listener with connections in its queue (one read of the listening table)
    /// make it every tick. The programs being attached do not: they see every new connection
    /// and socket call, and the read covers the connections opened before them, which show
    /// here as soon as they hold work (10,000 idle keep-alive connections read every tick cost
    /// 6 % of a core).
    pub fn due(&self, target: Option<&PortSocket>, now: Instant) -> bool {
        let Some(at) = self.at else {
            return true;
        };
        let m = &self.last_moves;
        if now.saturating_duration_since(at) >= self.quiet_every
            || self.error.is_some()
            || self
                .traffic_at
                .is_some_and(|t| now.saturating_duration_since(t) < TRAFFIC_HOLD)
            // Traffic moved at the last read: requests come, so every tick's read counts
            // them in service (the saturation's samples), not one a second.
            || m.read
            || m.answered
            || m.taken
            || m.gone
            || self
                .view
                .as_ref()
                .is_none_or(|v| v.unaccepted + v.unread + v.pending > 0)
        {
            return true;
        }
        target.is_some_and(|t| t.listeners().is_ok_and(|l| l.iter().any(|l| l.queue > 0)))
    }

    /// Whether the latest read is recent enough to stand for `now`: younger than `fresh_for`,
    /// or with no read due yet.
    pub fn fresh(&self, target: Option<&PortSocket>, fresh_for: Duration, now: Instant) -> bool {
        self.at.is_some_and(|t| {
            now.saturating_duration_since(t) < fresh_for
                || (self.view.is_some() && !self.due(target, now))
        })
    }

    /// The latest read's view of the connections; None before the first or when it failed.
    pub fn view(&self) -> Option<&SocketView> {
        self.view.as_ref()
    }

    /// Why the latest read failed.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// What moved between the two latest reads.
    pub fn last_moves(&self) -> Moves {
        self.last_moves
    }

    /// How often the port is read while nothing goes on.
    pub fn quiet_every(&self) -> Duration {
        self.quiet_every
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader whose latest read, at `at`, saw `v` and `moves`.
    fn read_at(at: Instant, v: SocketView, moves: Moves) -> PortReader {
        let traffic = moves.read
            || moves.answered
            || moves.taken
            || moves.gone
            || v.unaccepted + v.unread + v.pending > 0;
        PortReader {
            view: Some(v),
            at: Some(at),
            last_moves: moves,
            traffic_at: traffic.then_some(at),
            ..PortReader::default()
        }
    }

    #[test]
    fn a_quiet_port_is_read_once_a_second_and_one_with_traffic_every_tick_for_a_while() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(PortReader::default().due(None, t0), "never read: due");

        let quiet = read_at(t0, SocketView::default(), Moves::default());
        assert!(
            !quiet.due(None, t0 + ms(250)),
            "nothing went on: not before a second"
        );
        assert!(quiet.due(None, t0 + QUIET_READ_EVERY));
        assert!(
            quiet.fresh(None, ms(125), t0 + ms(250)),
            "no read due: it still stands"
        );

        let answered = Moves {
            answered: true,
            ..Moves::default()
        };
        let busy = read_at(t0, SocketView::default(), answered);
        assert!(
            busy.due(None, t0 + ms(250)),
            "an answer went out: read every tick"
        );
        assert!(!busy.fresh(None, ms(125), t0 + ms(250)));

        // Traffic seen, then a read that found the port empty: still every tick until
        // TRAFFIC_HOLD has passed since the traffic.
        let mut after = read_at(t0 + ms(1500), SocketView::default(), Moves::default());
        after.traffic_at = Some(t0);
        assert!(after.due(None, t0 + ms(1750)));
        assert!(!after.due(None, t0 + TRAFFIC_HOLD + ms(250)));

        let waiting = SocketView {
            connections: 1,
            pending: 1,
            ..SocketView::default()
        };
        assert!(read_at(t0, waiting, Moves::default()).due(None, t0 + ms(250)));
    }

    #[test]
    fn a_failed_read_is_due_again_at_once_and_says_why() {
        let t0 = Instant::now();
        let failed = PortReader {
            at: Some(t0),
            error: Some("Operation not permitted".into()),
            ..PortReader::default()
        };
        assert!(failed.due(None, t0 + Duration::from_millis(250)));
        assert_eq!(failed.error(), Some("Operation not permitted"));
        assert!(failed.view().is_none());
    }

    #[test]
    fn without_a_target_nothing_is_read_for_others_and_nothing_fails() {
        let mut r = PortReader::default();
        assert_eq!(
            r.read_for_others(None, Vec::new()).unwrap(),
            PortRead::default()
        );
        assert!(r.read_for_tick(None, Vec::new).is_none(), "not wanted");
        r.want_reads(true);
        assert!(r.read_for_tick(None, Vec::new).is_none(), "nothing dumped");
        let read = r.take_for_others().expect("a read for this tick");
        assert_eq!(read.unwrap(), PortRead::default());
        assert!(r.take_for_others().is_none(), "handed over once");
        assert!(r.read(None, Vec::new, None, Instant::now()).is_none());
    }
}
