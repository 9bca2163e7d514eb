//! Redis: `AUTH` when a password is known, `SELECT` when a database index is given, then `PING`,
//! expecting `+PONG`. RESP by hand: the check needs four commands and one-line replies.
//! `rediss://` runs the same exchange inside TLS (`super::tls`).

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::{connect_tcp, ms, no_answer, target::Target, tls, Failure, Good};
use crate::dburl::SslMode;

/// A reply line longer than this is not one of the few we expect.
pub(crate) const RESP_LINE_MAX: u64 = 512;

/// Why a reply line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RespError {
    #[error("connection closed by the server")]
    Closed,
}

/// One reply line as read (up to and including its `\n`, at most [`RESP_LINE_MAX`] bytes): the
/// text without the line end (`+OK`, `-NOAUTH ...`), or why there is none.
pub(crate) fn parse_resp_line(line: &[u8]) -> Result<String, RespError> {
    if line.is_empty() {
        return Err(RespError::Closed);
    }
    Ok(String::from_utf8_lossy(line).trim_end().to_string())
}

/// What the answer to `PING` says about the server.
pub(crate) fn ping_verdict(reply: &str) -> Result<(), Failure> {
    if reply == "+PONG" {
        Ok(())
    } else if reply.starts_with("-NOAUTH") {
        // It wants a password we were not given.
        Err(Failure::Refused(format!("PING refused: {reply}")))
    } else {
        Err(Failure::Outage(format!(
            "PING answered {reply:?}, expected +PONG"
        )))
    }
}

fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command and reads its one-line reply; a failure is an outage named by `shown`.
async fn resp_call<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    args: &[&str],
    shown: &str,
) -> Result<String, Failure> {
    let outage = |e: &dyn std::fmt::Display| Failure::Outage(format!("{shown}: {e}"));
    conn.get_mut()
        .write_all(&resp_command(args))
        .await
        .map_err(|e| outage(&e))?;
    let mut line = Vec::new();
    (&mut *conn)
        .take(RESP_LINE_MAX)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| outage(&e))?;
    parse_resp_line(&line).map_err(|e| outage(&e))
}

pub(super) async fn round_trip(
    t: &Target,
    password: Option<&str>,
    timeout: Duration,
) -> Result<Good, Failure> {
    let start = Instant::now();
    let stream = connect_tcp(t, timeout).await?;
    if t.tls.mode == SslMode::Disable {
        exchange(t, password, BufReader::new(stream), timeout).await?;
        return Ok(Good {
            latency: start.elapsed(),
            detail: None,
        });
    }
    let config = tls::client_config(&t.tls, None)?;
    let name = tls::server_name(&t.host)?;
    // Bounded on its own, as the connect is: a path that takes the SYN and then nothing more
    // stalls here.
    let stream = tls::handshake(config, name, stream, timeout).await?;
    let version = stream.get_ref().1.protocol_version();
    let handshake = start.elapsed();
    exchange(t, password, BufReader::new(stream), timeout).await?;
    let latency = start.elapsed();
    Ok(Good {
        latency,
        detail: Some(format!(
            "connect {} over {} ({}), PING {}",
            ms(handshake),
            version.map_or_else(|| "TLS".into(), |v| format!("{v:?}")),
            t.tls.mode.as_str(),
            ms(latency.saturating_sub(handshake))
        )),
    })
}

/// `AUTH`, `SELECT`, `PING` over `conn`, bounded by `timeout`.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    t: &Target,
    password: Option<&str>,
    mut conn: BufReader<S>,
    timeout: Duration,
) -> Result<(), Failure> {
    let exchange = async {
        if let Some(p) = password {
            let reply = match &t.user {
                Some(u) => resp_call(&mut conn, &["AUTH", u, p], "AUTH").await?,
                None => resp_call(&mut conn, &["AUTH", p], "AUTH").await?,
            };
            if reply != "+OK" {
                return Err(Failure::Refused(format!("AUTH refused: {reply}")));
            }
        }
        if let Some(db) = t.redis_db {
            let reply = resp_call(&mut conn, &["SELECT", &db.to_string()], "SELECT").await?;
            if reply != "+OK" {
                return Err(Failure::Refused(format!("SELECT {db} refused: {reply}")));
            }
        }
        let reply = resp_call(&mut conn, &["PING"], "PING").await?;
        ping_verdict(&reply)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| no_answer("PING", timeout))?
}
