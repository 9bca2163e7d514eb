//! Free ports and loopback addresses. The one place that picks a port: the tests, the fleet
//! harness and `cargo xtask bench` all come here.

use std::net::{IpAddr, Ipv4Addr, TcpListener};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    free_port_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A port that was free a moment ago on `ip` (e.g. `::1`).
pub fn free_port_on(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("binding an ephemeral port on {ip}: {e}"))
}

/// A port that was free a moment ago on every one of `ips` at once (bind test on each).
pub fn free_port_on_all(ips: &[IpAddr]) -> u16 {
    for _ in 0..100 {
        let Some(first) = ips.first() else {
            panic!("free_port_on_all: no addresses");
        };
        let Ok(l) = TcpListener::bind((*first, 0)) else {
            continue;
        };
        let Ok(port) = l.local_addr().map(|a| a.port()) else {
            continue;
        };
        // All bound at the same time, then all released.
        let others: Vec<_> = ips[1..]
            .iter()
            .map(|ip| TcpListener::bind((*ip, port)))
            .collect();
        if others.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no port free on all of {ips:?} after 100 tries");
}

/// `127.0.0.<last>`.
pub fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}
