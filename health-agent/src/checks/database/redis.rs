//! Redis: `AUTH` when a password is known, `SELECT` when a database index is given, then `PING`,
//! expecting `+PONG`. RESP by hand: the check needs four commands and one-line replies.
//! `rediss://` runs the same exchange inside TLS (`super::tls`).

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::{
    connect_tcp, ms, no_answer,
    target::{Login, Target},
    tls, Failure, Good,
};
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

/// How an exchange failed: the server hung up without a word (which a TLS-only port does to a
/// client that speaks in the clear), or anything else.
enum ExchangeError {
    HungUp(Failure),
    Other(Failure),
}

impl From<Failure> for ExchangeError {
    fn from(f: Failure) -> Self {
        Self::Other(f)
    }
}

impl ExchangeError {
    fn into_failure(self) -> Failure {
        match self {
            Self::HungUp(f) | Self::Other(f) => f,
        }
    }
}

/// Sends one command and reads its one-line reply; a failure is an outage named by `shown`.
async fn resp_call<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    args: &[&str],
    shown: &str,
) -> Result<String, ExchangeError> {
    let outage = |e: &dyn std::fmt::Display| Failure::Outage(format!("{shown}: {e}"));
    let hung_up = |e: &std::io::Error| {
        let f = outage(e);
        match e.kind() {
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
                ExchangeError::HungUp(f)
            }
            _ => ExchangeError::Other(f),
        }
    };
    conn.get_mut()
        .write_all(&resp_command(args))
        .await
        .map_err(|e| hung_up(&e))?;
    let mut line = Vec::new();
    (&mut *conn)
        .take(RESP_LINE_MAX)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| hung_up(&e))?;
    parse_resp_line(&line).map_err(|e| match e {
        RespError::Closed => ExchangeError::HungUp(outage(&e)),
    })
}

pub(super) async fn round_trip(
    t: &Target,
    login: &Login,
    timeout: Duration,
) -> Result<Good, Failure> {
    let start = Instant::now();
    // Before connecting: a CA or key file that cannot be read is ours to fix, whether or not
    // the server answers.
    let tls_setup = match t.tls.mode {
        SslMode::Disable => None,
        _ => Some((
            tls::client_config(&t.tls, None)
                .map_err(|f| f.map(|m| format!("{m} (set in {})", t.key)))?,
            tls::server_name(&t.host)?,
        )),
    };
    let stream = connect_tcp(t, timeout).await?;
    let Some((config, name)) = tls_setup else {
        return match exchange(t, login, BufReader::new(stream), timeout).await {
            Ok(()) => Ok(Good {
                latency: start.elapsed(),
                detail: None,
            }),
            // Within what the round may take anyway: its connect and its exchange.
            Err(ExchangeError::HungUp(f)) if speaks_tls(t, start + timeout * 2, timeout).await => {
                Err(Failure::Refused(format!(
                    "{}: the server wants TLS on this port: use rediss://",
                    f.message()
                )))
            }
            Err(e) => Err(e.into_failure()),
        };
    };
    // The connect and the handshake share one `timeout`: a path that takes the SYN and then
    // nothing more stalls here.
    let deadline = start + timeout;
    let handshake = tls::handshake(config, name, stream, deadline, timeout);
    tokio::pin!(handshake);
    // A Redis without TLS on this port sits silent at a TLS hello (it waits for a line end),
    // which would read as an outage: once the handshake has been silent half the time, ask in
    // the clear, within the same deadline. A frozen path answers neither.
    let probe = async {
        tokio::time::sleep_until((start + timeout / 2).into()).await;
        answers_in_the_clear(t, deadline).await
    };
    let stream = tokio::select! {
        r = &mut handshake => match r {
            Ok(s) => s,
            // Hung up on the hello (a plain Redis that answered it with an error was no TLS,
            // and says so already).
            Err(f @ Failure::Outage(_)) => {
                return Err(if answers_in_the_clear(t, deadline).await {
                    no_tls_here()
                } else {
                    f
                })
            }
            Err(f) => {
                return Err(f.map(|m| format!("{m}; the TLS settings are in {}", t.key)))
            }
        },
        true = probe => return Err(no_tls_here()),
    };
    let version = stream.get_ref().1.protocol_version();
    let handshake = start.elapsed();
    exchange(t, login, BufReader::new(stream), timeout)
        .await
        .map_err(ExchangeError::into_failure)?;
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

/// What a `rediss://` URL to a Redis that speaks only in the clear gets.
fn no_tls_here() -> Failure {
    Failure::Refused(
        "TLS handshake: the server does not speak TLS on this port (it answers PING in the \
         clear): use redis://"
            .into(),
    )
}

/// Whether `t` answers a plain `PING` with a RESP reply (`+PONG`, `-NOAUTH …`) by `deadline`.
async fn answers_in_the_clear(t: &Target, deadline: Instant) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
            .await
            .ok()?;
        s.write_all(&resp_command(&["PING"])).await.ok()?;
        let mut first = [0u8; 1];
        s.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    matches!(
        tokio::time::timeout_at(deadline.into(), probe).await,
        Ok(Some(true))
    )
}

/// Whether `t` answers a TLS handshake (any certificate): asked only after a server hung up on
/// a plain `redis://` exchange, so the one mistake with a sure answer is named as such.
async fn speaks_tls(t: &Target, deadline: Instant, timeout: Duration) -> bool {
    let insecure = crate::dburl::TlsOptions {
        mode: SslMode::Require,
        roots: crate::dburl::RootCerts::System,
        client: None,
    };
    let probe = async {
        let (Ok(stream), Ok(config), Ok(name)) = (
            connect_tcp(t, timeout).await,
            tls::client_config(&insecure, None),
            tls::server_name(&t.host),
        ) else {
            return false;
        };
        match tls::handshake(config, name, stream, deadline, timeout).await {
            Ok(_) => true,
            // It sent a TLS alert (wants a client certificate): TLS all the same. The words
            // are `tls::describe`'s for `AlertReceived`.
            Err(Failure::Refused(m)) => m.contains("refused the handshake"),
            Err(Failure::Outage(_)) => false,
        }
    };
    tokio::time::timeout_at(deadline.into(), probe)
        .await
        .unwrap_or(false)
}

/// `AUTH`, `SELECT`, `PING` over `conn`, bounded by `timeout`.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    t: &Target,
    login: &Login,
    mut conn: BufReader<S>,
    timeout: Duration,
) -> Result<(), ExchangeError> {
    let exchange = async {
        if let Some(p) = &login.password {
            let reply = match &t.user {
                Some(u) => resp_call(&mut conn, &["AUTH", u, p], "AUTH").await?,
                None => resp_call(&mut conn, &["AUTH", p], "AUTH").await?,
            };
            if reply != "+OK" {
                let fix = if reply.contains("without any password configured") {
                    "the server has no password: leave it out".to_string()
                } else {
                    login.refused(t)
                };
                // By its error code alone: the reply answers the command that carried the
                // password, and a server may quote it.
                let code = reply.split_whitespace().next().unwrap_or("-ERR");
                return Err(Failure::Refused(format!("AUTH refused: {code}: {fix}")).into());
            }
        }
        if let Some(db) = t.redis_db {
            let reply = resp_call(&mut conn, &["SELECT", &db.to_string()], "SELECT").await?;
            if reply != "+OK" {
                return Err(Failure::Refused(format!("SELECT {db} refused: {reply}")).into());
            }
        }
        let reply = resp_call(&mut conn, &["PING"], "PING").await?;
        Ok(ping_verdict(&reply).map_err(|f| match f {
            // It wants a password we were not given: say where one goes.
            Failure::Refused(m) if reply.starts_with("-NOAUTH") => {
                Failure::Refused(format!("{m}: {}", login.missing(t)))
            }
            f => f,
        })?)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| no_answer("PING", timeout))?
}
