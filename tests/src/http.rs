//! A tiny HTTP/1.1 client: one request per connection (`Connection: close`), to a loopback
//! port or any address, and a few request patterns the tests share.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use serde_json::Value;

/// One HTTP/1.1 request to `addr` with extra headers; returns (status, head, body).
pub fn request_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad response: {head:?}"),
            )
        })?;
    Ok((status, head.to_string(), body.to_string()))
}

/// The value of header `name` (any case) among `headers`.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let found = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name));
    found.map(|(_, v)| v.as_str())
}

/// `GET path` on 127.0.0.1:`port` within `timeout`: (status, head, body).
pub fn get_within(port: u16, path: &str, timeout: Duration) -> io::Result<(u16, String, String)> {
    get_at_within(([127, 0, 0, 1], port).into(), path, timeout)
}

/// `GET path` on `addr` (any address: `[::1]:PORT`, a namespace's inside address) within
/// `timeout`: (status, head, body).
pub fn get_at_within(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    request_at(addr, "GET", path, &[], timeout)
}

/// `GET path` on 127.0.0.1:`port` with a 5 s timeout: (status, body).
pub fn get(port: u16, path: &str) -> io::Result<(u16, String)> {
    get_within(port, path, Duration::from_secs(5)).map(|(c, _, b)| (c, b))
}

/// `GET path` on `addr` with a 5 s timeout: (status, body).
pub fn get_at(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    get_at_within(addr, path, Duration::from_secs(5)).map(|(c, _, b)| (c, b))
}

/// Opens `n` connections, sends one request on each and reads the full answer.
pub fn requests(port: u16, n: usize, path: &str) -> usize {
    (0..n)
        .filter(|_| get(port, path).is_ok_and(|(c, _)| c == 200))
        .count()
}

/// Starts `n` connections in the background that send a request and wait (up to `hold`) for an
/// answer; returns their threads.
pub fn background_requests(
    port: u16,
    n: usize,
    hold: Duration,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let _ = get_within(port, "/", hold);
            })
        })
        .collect()
}

/// The web counters from a full /health body.
pub fn counters(body: &Value) -> &Value {
    &body["details"]["web"]["counters"]
}
