//! Just enough HTTP/1.1 for both ports: one request head at a time (pipelining kept), and
//! answers with a Content-Length.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::mode::MAX_HEAD;

pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) keep_alive: bool,
}

pub(crate) enum ReadOutcome {
    Request(Request),
    /// Peer closed cleanly between requests.
    Closed,
    /// Unparseable or oversized head; answer 400 and close.
    Malformed,
}

pub(crate) fn find_head_end(buf: &[u8]) -> Option<usize> {
    // Tolerate bare-LF clients (hand-written nc/printf tests) as well as CRLF.
    for i in 0..buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
    }
    None
}

/// Reads one request (head plus a Content-Length body, which is discarded)
/// from `stream`. `buf` carries bytes already read past the previous request
/// so pipelined requests are not lost.
pub(crate) fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<ReadOutcome> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        // Blank lines between requests are allowed (RFC 9112 §2.2).
        let leading = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        buf.drain(..leading);
        if let Some(end) = find_head_end(buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            return Ok(ReadOutcome::Malformed);
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return if buf.is_empty() {
                Ok(ReadOutcome::Closed)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };

    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);

    let mut lines = head.lines().map(|l| l.trim_end_matches('\r'));
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split_ascii_whitespace();
    let (method, target, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/1.") => (m, t, v),
        _ => return Ok(ReadOutcome::Malformed),
    };

    let mut content_length: u64 = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse() {
                Ok(n) => content_length = n,
                Err(_) => return Ok(ReadOutcome::Malformed),
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',') {
                let token = token.trim();
                conn_close |= token.eq_ignore_ascii_case("close");
                conn_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
    }

    // Discard the body without buffering all of it.
    let mut remaining = content_length;
    let from_buf = remaining.min(buf.len() as u64) as usize;
    buf.drain(..from_buf);
    remaining -= from_buf as u64;
    while remaining > 0 {
        let want = remaining.min(chunk.len() as u64) as usize;
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => remaining -= n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }

    let keep_alive = if version == "HTTP/1.0" {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    Ok(ReadOutcome::Request(Request {
        method: method.to_string(),
        target: target.to_string(),
        // Bodies are only framed by Content-Length here; after a chunked body
        // we cannot find the next request, so the connection must end.
        keep_alive: keep_alive && !chunked,
    }))
}

/// `400 Bad Request` for a request that could not be parsed, then the connection closes.
pub(crate) fn write_bad_request(stream: &mut TcpStream) -> io::Result<()> {
    write_response(
        stream,
        "400 Bad Request",
        "bad request\n",
        "text/plain",
        false,
        false,
    )
}

pub(crate) fn write_response(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    content_type: &str,
    keep_alive: bool,
    head_only: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    if !head_only {
        out.push_str(body);
    }
    // One write so the response leaves in a single segment where possible.
    stream.write_all(out.as_bytes())?;
    stream.flush()
}
