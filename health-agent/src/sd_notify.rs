//! systemd's service notifications (sd_notify(3)) as the raw datagram: `READY=1` once the
//! first snapshot exists, `WATCHDOG=1` from the check loop. Without `$NOTIFY_SOCKET` (not run
//! by systemd with `Type=notify`) every call is a no-op.

use std::{
    io,
    os::{
        linux::net::SocketAddrExt,
        unix::net::{SocketAddr, UnixDatagram},
    },
    time::{Duration, Instant},
};

/// The address in `$NOTIFY_SOCKET`: a path, or `@name` for an abstract socket.
fn address(socket: &str) -> io::Result<SocketAddr> {
    match socket.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None if socket.starts_with('/') => SocketAddr::from_pathname(socket),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET={socket:?} is neither an absolute path nor @abstract"),
        )),
    }
}

/// Sends `state` (newline-separated `KEY=VALUE`s) to `socket`.
pub fn notify_to(socket: &str, state: &str) -> io::Result<()> {
    let addr = address(socket)?;
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// Sends `state` to `$NOTIFY_SOCKET`. Ok(false): not run under systemd's notify protocol.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var("NOTIFY_SOCKET") {
        Ok(socket) if !socket.is_empty() => notify_to(&socket, state).map(|()| true),
        _ => Ok(false),
    }
}

/// How often to ping: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3) advises. None when
/// there is no watchdog, or it is meant for another process (`WATCHDOG_PID`).
pub fn watchdog_every(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if pid.is_some_and(|p| p.trim().parse::<u32>().ok() != Some(own_pid)) {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec) / 2)
}

/// `WATCHDOG=1` pings, at most one per half watchdog period. The check loop calls `kick` once
/// per completed round, so a loop that is stuck stops pinging and systemd restarts the agent.
pub struct Watchdog {
    socket: String,
    every: Duration,
    last: Option<Instant>,
}

impl Watchdog {
    /// From systemd's environment; None when the unit has no `WatchdogSec=`.
    pub fn from_env() -> Option<Self> {
        let socket = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|s| !s.is_empty())?;
        let every = watchdog_every(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )?;
        tracing::info!(every_ms = every.as_millis() as u64, "systemd watchdog on");
        Some(Self::new(socket, every))
    }

    pub fn new(socket: String, every: Duration) -> Self {
        Self {
            socket,
            every,
            last: None,
        }
    }

    /// A round of the check loop completed at `now`: ping if one is due.
    pub fn kick(&mut self, now: Instant) {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            return;
        }
        self.last = Some(now);
        if let Err(e) = notify_to(&self.socket, "WATCHDOG=1") {
            tracing::warn!("systemd watchdog ping failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(socket: &UnixDatagram) -> Vec<String> {
        socket.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    #[test]
    fn ready_reaches_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        notify_to(path.to_str().unwrap(), "READY=1\nSTATUS=serving").unwrap();
        assert_eq!(received(&socket), ["READY=1\nSTATUS=serving"]);
    }

    #[test]
    fn ready_reaches_an_abstract_socket() {
        let name = format!("health-agent-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(&format!("@{name}"), "READY=1").unwrap();
        assert_eq!(received(&socket), ["READY=1"]);
    }

    #[test]
    fn a_relative_socket_is_refused() {
        assert!(notify_to("notify", "READY=1").is_err());
    }

    #[test]
    fn watchdog_pings_at_half_the_period_and_only_for_this_process() {
        assert_eq!(
            watchdog_every(Some("10000000"), None, 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            watchdog_every(Some("10000000"), Some("7"), 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(watchdog_every(Some("10000000"), Some("8"), 7), None);
        assert_eq!(watchdog_every(None, None, 7), None);
        assert_eq!(watchdog_every(Some("0"), None, 7), None);
        assert_eq!(watchdog_every(Some("soon"), None, 7), None);
    }

    #[test]
    fn kick_pings_once_per_half_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        let mut dog = Watchdog::new(path.to_str().unwrap().into(), Duration::from_secs(5));
        let t0 = Instant::now();
        dog.kick(t0);
        dog.kick(t0 + Duration::from_secs(1));
        dog.kick(t0 + Duration::from_secs(4));
        dog.kick(t0 + Duration::from_secs(5));
        dog.kick(t0 + Duration::from_secs(6));
        assert_eq!(received(&socket), ["WATCHDOG=1", "WATCHDOG=1"]);
    }
}
