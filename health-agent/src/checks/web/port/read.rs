//! What a tick hands to the others that read the port (`TickSample`), and the port read for
//! them: while the drain watches the backend's port, the monitor reads the port's connections
//! and those the server closed lately from its own sock_diag socket, every tick (`observe`) and
//! between ticks when the drain asks (`read_port`). A tick's read serves the monitor's own view
//! of the connections too when both look at the same listeners, so the port is dumped once.

use super::*;
use crate::checks::web::sockets::PortRead;

/// What one tick saw of the port, for the others that read it: the drain (the read, the
/// kernel's count of arrivals, the probes), the saturation meter (the load), the peers' view of
/// this instance (the last answer).
#[derive(Debug)]
pub struct TickSample {
    /// The port's connections, read this tick while others want them (`want_port_reads`).
    pub port: Option<std::io::Result<PortRead>>,
    /// Arrivals the kernel counted (every connection and keep-alive request, the agent's probes
    /// included) while the connection programs are attached; None while they are not. The
    /// count restarts at each attach.
    pub kernel_arrivals: Option<u64>,
    /// The agent's probes begun so far (the probe's ledger).
    pub probes_started: u64,
    /// When the backend last answered (`WebMonitor::answered_at`).
    pub answered_at: Option<Instant>,
    /// What the saturation meter takes from this tick; None without the kernel view, before
    /// the backend is found, or on a tick between two reads of the port while detached.
    pub load: Option<crate::saturation::LoadSample>,
}

impl WebMonitor {
    /// Whether each tick's `observe` reads the port for others (`TickSample::port`).
    pub fn want_port_reads(&mut self, want: bool) {
        self.reader.want_reads(want);
    }

    /// The port now: its connections and the peers of those the server closed lately, while a
    /// listener holds it; nothing before the backend is found or while nothing listens (then
    /// nothing can reach it).
    pub fn read_port(&mut self) -> std::io::Result<PortRead> {
        self.reader
            .read_for_others(self.target.as_ref(), self.probes.own_sources())
    }

    /// At the start of a tick, while others want the port: the read for them, kept for
    /// `observe` to hand over; and its connections when they are also what the monitor's own read
    /// would find (the same listeners), for `read_sockets`.
    pub(super) fn read_port_for_tick(&mut self) -> Option<Vec<net::TcpConn>> {
        let probes = &self.probes;
        self.reader
            .read_for_tick(self.target.as_ref(), || probes.own_sources())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::probe::ProbeLedger;
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
    };

    fn monitor(port: u16, probes: ProbeLedger) -> WebMonitor {
        let cfg = WebConfig {
            port,
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        WebMonitor::new(cfg, kernel, status, probes)
    }

    #[test]
    fn the_port_read_for_the_drain_holds_open_closed_and_own_connections() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let probes = ProbeLedger::default();
        let mut m = monitor(port, probes.clone());
        // Before the backend is found: nothing to read, and no error.
        assert_eq!(m.read_port().unwrap(), PortRead::default());
        m.evaluate(Instant::now());

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
        // the first look: the monitor reads the port itself at both ticks.)
        let t = Instant::now() + crate::checks::web::reader::QUIET_READ_EVERY;
        assert!(m.observe(t).port.is_none());
        m.want_port_reads(true);
        probes.begin();
        let tick = m.observe(t);
        assert_eq!(tick.probes_started, 1);
        let read = tick.port.expect("a read this tick").unwrap();
        assert!(m.reader.take_for_others().is_none(), "handed over once");
        let remotes: Vec<_> = read.connections.iter().map(|c| c.remote).collect();
        assert_eq!(remotes, vec![peer], "{read:?}");
        assert!(read.connections[0].request_unanswered(), "{read:?}");
        assert!(read.closed.contains(&gone_peer), "{read:?}");
        assert_eq!(read.own, vec![client.local_addr().unwrap()]);
        // The monitor's own view of the tick, from the same dump: the request in service.
        let v = m
            .reader
            .view()
            .cloned()
            .expect("the monitor read the port too");
        assert_eq!((v.connections, v.pending), (1, 1), "{v:?}");

        // Nothing listens: nothing can reach it, whatever connections remain.
        drop(l);
        assert_eq!(m.read_port().unwrap(), PortRead::default());
        drop(server);
    }
}
