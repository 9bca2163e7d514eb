//! The active probe: `GET <probe_path>` on 127.0.0.1:<port> with a timeout. It gives evidence
//! when there is no real traffic, and the kernel view sees it like any other request.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeResult {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub latency_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The backend did not answer within the timeout (as opposed to refusing or erroring).
    pub timed_out: bool,
}

pub async fn probe(port: u16, path: &str, timeout: Duration) -> ProbeResult {
    let start = Instant::now();
    let outcome = tokio::time::timeout(timeout, request(port, path)).await;
    let latency_ms = start.elapsed().as_secs_f64() * 1000.0;
    match outcome {
        Err(_) => ProbeResult {
            ok: false,
            status: None,
            latency_ms,
            error: Some(format!("no answer within {}ms", timeout.as_millis())),
            timed_out: true,
        },
        Ok(Err(e)) => ProbeResult {
            ok: false,
            status: None,
            latency_ms,
            error: Some(e.to_string()),
            timed_out: false,
        },
        Ok(Ok(status)) => ProbeResult {
            ok: (200..400).contains(&status),
            status: Some(status),
            latency_ms,
            error: None,
            timed_out: false,
        },
    }
}

async fn request(port: u16, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: health-agent\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    // The status line is all we need.
    while n < 12 {
        let r = s.read(&mut buf[n..]).await?;
        if r == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a status line",
            ));
        }
        n += r;
    }
    parse_status(&buf[..n]).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP status line")
    })
}

fn parse_status(b: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(b.get(..12)?).ok()?;
    if !s.starts_with("HTTP/1.") {
        return None;
    }
    s.get(9..12)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn status_line() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH"), None);
    }

    #[tokio::test]
    async fn answers_refuses_and_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 256];
            let _ = s.read(&mut b).await;
            s.write_all(b"HTTP/1.1 503 Unavailable\r\n\r\n")
                .await
                .unwrap();
            // Second connection: read and never answer.
            let (mut s2, _) = l.accept().await.unwrap();
            let _ = s2.read(&mut b).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let r = probe(port, "/up", Duration::from_secs(2)).await;
        assert_eq!((r.ok, r.status), (false, Some(503)));
        let r = probe(port, "/up", Duration::from_millis(200)).await;
        assert!(r.timed_out && !r.ok, "{r:?}");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cport = closed.local_addr().unwrap().port();
        drop(closed);
        let r = probe(cport, "/up", Duration::from_secs(1)).await;
        assert!(!r.ok && !r.timed_out && r.error.is_some(), "{r:?}");
    }
}
