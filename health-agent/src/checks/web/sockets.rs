//! The backend's connections as sock_diag shows them, without any eBPF program: what waits in
//! the accept queue, what arrived and was not read, what was read and not answered, and when
//! the server last sent. With `web.socket_tracing = "on_suspicion"` this view is read while
//! the per-connection and per-call programs are detached (every tick while it shows work, once
//! a second otherwise), and it is what attaches them (`suspicion`); while they are attached it
//! keeps covering what happened on connections opened before they were.
//!
//! Every age here is a lower bound: `tcp_info`'s timers say when a segment last came or went,
//! in jiffies (4 ms at HZ=250), so a request is never older than it reads. A connection still
//! in the accept queue has no file yet (inode 0); the final ACK of its handshake is the last
//! one it received, so `tcpi_last_ack_recv` is its time in the queue.

use std::{collections::HashMap, net::SocketAddr, time::Duration};

use serde::{Serialize, Serializer};

use super::progress::Moves;
use crate::net::{TcpConn, TCP_CLOSE_WAIT};

/// A connection waiting this long unclaimed, or a request unread this long, attaches the
/// programs. A healthy server, even saturated, claims within milliseconds.
pub const WAIT_SUSPECT: Duration = Duration::from_millis(200);

/// Serialized with ages in whole milliseconds (`oldest_unaccepted_ms`, …).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SocketView {
    /// Server-side connections of the port (established, or closed by the peer).
    pub connections: u32,
    /// In the accept queue: no process holds them yet.
    pub unaccepted: u32,
    pub oldest_unaccepted: Option<Duration>,
    /// Accepted, with bytes received that no process has read.
    pub unread: u32,
    pub oldest_unread: Option<Duration>,
    /// A request read and no byte sent since it came.
    pub pending: u32,
    pub oldest_pending: Option<Duration>,
    /// Since the server last sent data on any connection still open.
    pub since_sent: Option<Duration>,
}

impl Serialize for SocketView {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Ms {
            connections: u32,
            unaccepted: u32,
            oldest_unaccepted_ms: Option<u64>,
            unread: u32,
            oldest_unread_ms: Option<u64>,
            pending: u32,
            oldest_pending_ms: Option<u64>,
            since_sent_ms: Option<u64>,
        }
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        Ms {
            connections: self.connections,
            unaccepted: self.unaccepted,
            oldest_unaccepted_ms: ms(self.oldest_unaccepted),
            unread: self.unread,
            oldest_unread_ms: ms(self.oldest_unread),
            pending: self.pending,
            oldest_pending_ms: ms(self.oldest_pending),
            since_sent_ms: ms(self.since_sent),
        }
        .serialize(s)
    }
}

fn ms(v: u32) -> Duration {
    Duration::from_millis(u64::from(v))
}

fn older(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.max(b)))
}

impl SocketView {
    /// The view of `conns`, the server side of the listen port's connections
    /// (`Diag::server_connections`).
    pub fn of(conns: &[TcpConn]) -> Self {
        let mut v = Self {
            connections: conns.len() as u32,
            ..Self::default()
        };
        for c in conns {
            if c.sent_data() {
                let since = ms(c.last_data_sent_ms);
                v.since_sent = Some(v.since_sent.map_or(since, |s| s.min(since)));
            }
            // A peer's FIN takes one sequence number, so a connection closed by its peer shows
            // one byte unread until the server reads the end of it: no request.
            let unread = if c.state == TCP_CLOSE_WAIT {
                c.unread.saturating_sub(1)
            } else {
                c.unread
            };
            if c.inode == 0 {
                v.unaccepted += 1;
                let age = ms(c.last_ack_recv_ms.max(c.last_data_recv_ms));
                v.oldest_unaccepted = older(v.oldest_unaccepted, age);
            } else if unread > 0 {
                v.unread += 1;
                v.oldest_unread = older(v.oldest_unread, ms(c.last_data_recv_ms));
            } else if c.request_unanswered() {
                v.pending += 1;
                v.oldest_pending = older(v.oldest_pending, ms(c.last_data_recv_ms));
            }
        }
        v
    }

    /// The oldest connection no process has taken up: in the accept queue, or accepted with
    /// its request unread (what the programs call unclaimed).
    pub fn oldest_waiting(&self) -> Option<Duration> {
        [self.oldest_unaccepted, self.oldest_unread]
            .into_iter()
            .flatten()
            .max()
    }

    /// What looks wrong enough to follow every connection and socket call, in words; None
    /// while the server takes and answers its work promptly. `pending_after`: how long a
    /// request may stay unanswered before it counts (slow requests attach the programs, so
    /// the latency they measure can say `slow`).
    pub fn suspicion(&self, pending_after: Duration) -> Option<String> {
        if let Some(d) = self.oldest_unaccepted.filter(|d| *d >= WAIT_SUSPECT) {
            return Some(format!(
                "{} connection(s) wait in the accept queue (oldest {} ms)",
                self.unaccepted,
                d.as_millis()
            ));
        }
        if let Some(d) = self.oldest_unread.filter(|d| *d >= WAIT_SUSPECT) {
            return Some(format!(
                "{} accepted connection(s) hold unread requests (oldest {} ms)",
                self.unread,
                d.as_millis()
            ));
        }
        if let Some(d) = self.oldest_pending.filter(|d| *d >= pending_after) {
            return Some(format!(
                "{} request(s) read and unanswered (oldest {} ms)",
                self.pending,
                d.as_millis()
            ));
        }
        None
    }
}

/// One read of the backend port, made by the port's watching (`PortWatch`) and handed to whoever else watches
/// it (the drain), so that nothing else opens a sock_diag socket for the port.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortRead {
    /// The server side of the port's connections (`Diag::server_connections`): none while
    /// nothing listens, or before the backend has been found.
    pub connections: Vec<TcpConn>,
    /// The peers of the connections the server closed lately (TIME_WAIT, which the kernel
    /// keeps for a minute).
    pub closed: Vec<SocketAddr>,
    /// The local addresses of the agent's own probe connections, as the probe's ledger said
    /// at the read.
    pub own: Vec<SocketAddr>,
}

/// What moved on the port's connections between two reads: bytes acknowledged (an answer went
/// out) or received (a request came in), a queued connection taken up. Connections are told
/// apart by their peer's address; one that closed in between shows nothing.
#[derive(Debug, Default)]
pub struct SocketMoves {
    /// Peer address → (bytes received, bytes acknowledged, accepted) at the previous read.
    prev: HashMap<SocketAddr, (u64, u64, bool)>,
}

impl SocketMoves {
    /// What moved since the previous call, given this read's connections and their view.
    /// `own`: the agent's own probe connections (their local addresses): one of them gone is
    /// the probe closing its end, after its answer (which the probe reports itself) or at its
    /// timeout, never the server moving.
    pub fn update(&mut self, conns: &[TcpConn], v: &SocketView, own: &[SocketAddr]) -> Moves {
        let mut m = Moves {
            waiting: v.unaccepted + v.unread > 0,
            pending: v.pending > 0,
            ..Moves::default()
        };
        let mut next = HashMap::with_capacity(conns.len());
        for c in conns {
            let accepted = c.inode != 0;
            let (read, answered, exchanged) = match self.prev.get(&c.remote) {
                Some(&(rx, acked, was_accepted)) => {
                    m.taken |= accepted && !was_accepted;
                    (c.bytes_received > rx, c.bytes_acked > acked, rx > 0)
                }
                None => (c.bytes_received > 0, c.bytes_acked > 1, false),
            };
            m.read |= read;
            m.answered |= answered;
            // Only a connection that had a request at the previous read carries keep-alive
            // exchanges: a new one (or one seen before its first request) whose request and
            // answer tie was, most likely, answered (one request per connection).
            m.unsure |= exchanged
                && read
                && answered
                && c.unread == 0
                && c.last_data_recv_ms == c.last_data_sent_ms;
            next.insert(c.remote, (c.bytes_received, c.bytes_acked, accepted));
        }
        let own: Vec<SocketAddr> = own.iter().map(|a| canonical(*a)).collect();
        m.gone = self.prev.iter().any(|(remote, &(_, _, accepted))| {
            accepted && !next.contains_key(remote) && !own.contains(&canonical(*remote))
        });
        self.prev = next;
        m
    }
}

/// An IPv4 peer of a dual-stack listener shows as `::ffff:a.b.c.d`.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        net::{Diag, ListenAddrs},
        netns::Namespace,
    };
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
        thread::sleep,
    };

    /// The port's connections as the monitor reads them: its listeners' sockets only.
    fn conns(diag: &Diag, port: u16) -> Vec<crate::net::TcpConn> {
        let on = ListenAddrs::of(&diag.listeners_on(port).unwrap());
        diag.server_connections(port, &on).unwrap()
    }

    fn view(diag: &Diag, port: u16) -> SocketView {
        SocketView::of(&conns(diag, port))
    }

    #[test]
    fn a_client_socket_with_the_listeners_port_on_another_address_is_not_the_servers() {
        // The backend listens on 127.0.0.1:P; an outgoing connection from 127.0.0.X:P (free:
        // the listener holds P on 127.0.0.1 only) has sent a request and had its answer, which
        // by the server side's rules reads as a request received after the last send.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        // The first loopback address whose port P nothing else holds.
        let sock = (2..=250u8)
            .find_map(|last| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                let from = std::net::SocketAddr::from(([127, 0, 0, last], port));
                s.bind(&from.into()).is_ok().then_some(s)
            })
            .expect("a loopback address with port P free");
        sock.connect(&upstream.local_addr().unwrap().into())
            .unwrap();
        let mut out = TcpStream::from(sock);
        let (mut up, _) = upstream.accept().unwrap();
        out.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        up.read_exact(&mut [0u8; 18]).unwrap();
        sleep(Duration::from_millis(10));
        up.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        out.read_exact(&mut [0u8; 38]).unwrap();
        sleep(Duration::from_millis(20));
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();

        // Every socket with local port P, as the reads were before: a request unanswered.
        let all = diag
            .server_connections(port, &ListenAddrs::default())
            .unwrap();
        // (Others on the host may share P too, on other addresses: only ours is asserted.)
        let ours: Vec<_> = all
            .into_iter()
            .filter(|c| c.local == out.local_addr().unwrap())
            .collect();
        let v = SocketView::of(&ours);
        assert_eq!((v.connections, v.pending), (1, 1), "{v:?}");
        // The listener's own: none.
        let v = view(&diag, port);
        assert_eq!((v.connections, v.pending), (0, 0), "{v:?}");
        assert_eq!(v.suspicion(Duration::ZERO), None);

        // A connection the listener accepted is still read.
        let _client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _server = l.accept().unwrap();
        sleep(Duration::from_millis(20));
        assert_eq!(view(&diag, port).connections, 1);
    }

    #[test]
    fn real_connections_read_as_queued_unread_pending_and_answered() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Another listener's connection on the host: the kernel's port filter drops it.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let _elsewhere = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();
        let tick = || sleep(Duration::from_millis(250));

        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        tick();
        let v = view(&diag, port);
        assert_eq!((v.connections, v.unaccepted), (1, 1), "{v:?}");
        assert!(v.oldest_unaccepted.unwrap() >= WAIT_SUSPECT, "{v:?}");
        assert!(v
            .suspicion(Duration::from_secs(1))
            .unwrap()
            .contains("accept queue"));

        let (mut server, _) = l.accept().unwrap();
        tick();
        let v = view(&diag, port);
        assert_eq!((v.unaccepted, v.unread), (0, 1), "{v:?}");
        assert!(v
            .suspicion(Duration::from_secs(1))
            .unwrap()
            .contains("unread"));

        let mut buf = [0u8; 18];
        server.read_exact(&mut buf).unwrap();
        tick();
        let v = view(&diag, port);
        assert_eq!((v.unread, v.pending), (0, 1), "{v:?}");
        assert_eq!(v.since_sent, None, "nothing sent yet: {v:?}");
        assert_eq!(
            v.suspicion(Duration::from_secs(1)),
            None,
            "not old enough yet"
        );
        assert!(v.suspicion(Duration::from_millis(200)).is_some());

        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        client.read_exact(&mut [0u8; 19]).unwrap();
        tick();
        let v = view(&diag, port);
        assert_eq!((v.unaccepted, v.unread, v.pending), (0, 0, 0), "{v:?}");
        assert!(v.since_sent.unwrap() >= Duration::from_millis(200), "{v:?}");
        assert_eq!(v.suspicion(Duration::ZERO), None);

        // The next request on the same connection, read and not answered.
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        server.read_exact(&mut buf).unwrap();
        tick();
        let v = view(&diag, port);
        assert_eq!(v.pending, 1, "a keep-alive request is pending too: {v:?}");

        // Answered, then the client closes: until the server reads the end, the FIN shows as
        // one byte unread, which is no request.
        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        client.read_exact(&mut [0u8; 19]).unwrap();
        drop(client);
        tick();
        let v = view(&diag, port);
        assert_eq!((v.connections, v.unread, v.pending), (1, 0, 0), "{v:?}");
        assert_eq!(v.suspicion(Duration::ZERO), None, "{v:?}");

        // A request sent and the connection closed (a client that gave up): still unread.
        let mut gave_up = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server2, _) = l.accept().unwrap();
        gave_up.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        drop(gave_up);
        tick();
        let v = view(&diag, port);
        assert_eq!((v.connections, v.unread), (2, 1), "{v:?}");
        assert!(v.suspicion(Duration::ZERO).unwrap().contains("unread"));
        drop(server);
    }

    #[test]
    fn a_request_sent_the_moment_its_answer_came_is_unsure_one_sent_later_is_pending() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let mut moves = SocketMoves::default();
        let read = |moves: &mut SocketMoves| {
            let conns = conns(&diag, port);
            let v = SocketView::of(&conns);
            (moves.update(&conns, &v, &[]), v)
        };
        // An answer, then the next request `pause` later, read and not answered yet.
        fn exchange(client: &mut TcpStream, server: &mut TcpStream, pause: Duration) {
            client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            server.read_exact(&mut [0u8; 18]).unwrap();
            answer(client, server);
            sleep(pause);
            client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            server.read_exact(&mut [0u8; 18]).unwrap();
            sleep(Duration::from_millis(20));
        }
        fn answer(client: &mut TcpStream, server: &mut TcpStream) {
            server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
            client.read_exact(&mut [0u8; 19]).unwrap();
        }
        read(&mut moves);
        // Back to back: the answer and the next request fall in one jiffy (4 ms) unless a
        // tick happens to part them, which a few tries get past.
        let unsure = (0..5).any(|_| {
            exchange(&mut client, &mut server, Duration::ZERO);
            let (m, v) = read(&mut moves);
            answer(&mut client, &mut server);
            read(&mut moves);
            // The request in service is what sock_diag misses here.
            m.unsure && v.pending == 0
        });
        assert!(unsure, "five back-to-back requests never read as unsure");
        // 20 ms apart: the timers tell the request came after the answer.
        exchange(&mut client, &mut server, Duration::from_millis(20));
        let (m, v) = read(&mut moves);
        assert!(!m.unsure, "{m:?}");
        assert_eq!(v.pending, 1, "{v:?}");
    }

    #[test]
    fn the_agents_own_probe_closing_is_not_the_server_moving() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();
        let mut moves = SocketMoves::default();
        // Two requests read and never answered: a client's, and the probe's.
        let open = || {
            let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (mut server, _) = l.accept().unwrap();
            client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            server.read_exact(&mut [0u8; 18]).unwrap();
            (client, server)
        };
        let (client, client_side) = open();
        let (probe, probe_side) = open();
        let own = [probe.local_addr().unwrap()];
        sleep(Duration::from_millis(20));
        let c = conns(&diag, port);
        let v = SocketView::of(&c);
        assert_eq!(v.pending, 2, "{v:?}");
        moves.update(&c, &v, &own);

        // The probe gives up and the server closes its end: nothing answered.
        drop(probe);
        drop(probe_side);
        sleep(Duration::from_millis(20));
        let c = conns(&diag, port);
        let m = moves.update(&c, &SocketView::of(&c), &own);
        assert!(!m.gone && !m.answered, "{m:?}");

        // Another client's connection the server took is gone: it moved (answered and closed
        // between two reads, as far as sock_diag can tell).
        drop(client);
        drop(client_side);
        sleep(Duration::from_millis(20));
        let c = conns(&diag, port);
        assert!(moves.update(&c, &SocketView::of(&c), &own).gone);
    }
}
