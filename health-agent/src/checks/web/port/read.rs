//! The port read for the others that read it: while the drain watches the backend's port,
//! the watching reads the port's connections and those the server closed lately from its own
//! sock_diag socket, every tick (`tick`) and between ticks when the drain asks (`read_port`). A
//! tick's read serves the watching's own view of the connections too when both look at the
//! same listeners, so the port is dumped once.

use super::*;
use crate::{checks::web::sockets::PortRead, net};

impl PortWatch {
    /// The port now: its connections and the peers of those the server closed lately, while a
    /// listener holds it; nothing before the backend is found or while nothing listens (then
    /// nothing can reach it).
    pub fn read_port(&mut self) -> std::io::Result<PortRead> {
        self.reader
            .read_for_others(self.socket.as_ref(), self.probes.own_sources())
    }

    /// At the start of a tick, while others want the port: the read for them, kept for
    /// `tick` to hand over; and its connections when they are also what the watching's own read
    /// would find (the same listeners), for `read_sockets`.
    pub(super) fn read_port_for_tick(&mut self) -> Option<Vec<net::TcpConn>> {
        let probes = &self.probes;
        self.reader
            .read_for_tick(self.socket.as_ref(), || probes.own_sources())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::{probe::ProbeLedger, web::WebMonitor};
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
    };

    fn watched(port: u16, probes: ProbeLedger) -> (WebMonitor, PortWatch) {
        let cfg = WebConfig {
            port,
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        (
            WebMonitor::new(cfg.clone()),
            PortWatch::new(cfg, kernel, status, probes),
        )
    }

    #[test]
    fn the_port_read_for_the_drain_holds_open_closed_and_own_connections() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let probes = ProbeLedger::default();
        let (mut web, mut m) = watched(port, probes.clone());
        // Before the backend is found: nothing to read, and no error.
        assert_eq!(m.read_port().unwrap(), PortRead::default());
        web.evaluate(&mut m, Instant::now());

        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, peer) = l.accept().unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        server.read_exact(&mut [0u8; 18]).unwrap();
        // One the server answered and closed first: TIME_WAIT on its side.
        let mut gone = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut gone_server, gone_peer) = l.accept().unwrap();
        gone_server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        drop(gone_server);
        gone.read_exact(&mut [0u8; 19]).unwrap();
        drop(gone);
        probes.note_own(client.local_addr().unwrap(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));

        // Read only when asked: a tick without the drain makes none. (A quiet second after
        // the first look: the watching reads the port itself at both ticks.)
        let t = Instant::now() + crate::checks::web::reader::QUIET_READ_EVERY;
        assert!(m.tick(t, web.sight(), Asks::default()).port.is_none());
        probes.begin();
        let drain = Asks {
            port_reads: true,
            ..Asks::default()
        };
        let tick = m.tick(t, web.sight(), drain);
        assert_eq!(tick.probes_started, 1);
        let read = tick.port.expect("a read this tick").unwrap();
        assert!(m.reader.take_for_others().is_none(), "handed over once");
        let remotes: Vec<_> = read.connections.iter().map(|c| c.remote).collect();
        assert_eq!(remotes, vec![peer], "{read:?}");
        assert!(read.connections[0].request_unanswered(), "{read:?}");
        assert!(read.closed.contains(&gone_peer), "{read:?}");
        assert_eq!(read.own, vec![client.local_addr().unwrap()]);
        // The watching's own view of the tick, from the same dump: the request in service.
        let v = m
            .reader
            .view()
            .cloned()
            .expect("the watching read the port too");
        assert_eq!((v.connections, v.pending), (1, 1), "{v:?}");

        // Nothing listens: nothing can reach it, whatever connections remain.
        drop(l);
        assert_eq!(m.read_port().unwrap(), PortRead::default());
        drop(server);
    }
}
