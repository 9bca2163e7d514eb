//! MySQL/MariaDB: reads the server's initial handshake packet (protocol v10) and reports the
//! server version. It does **not** log in (see the module doc of `checks::database`).

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::{connect_tcp, no_answer, target::Target, Failure, Good};

/// Why the first packet is not a greeting. Every one is an outage: the server did not let us
/// reach the point where credentials would matter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MysqlError {
    #[error("handshake: implausible packet length {0}")]
    PacketLength(usize),
    // These two only the in-memory reading meets (`read_exact` reports a short read itself).
    #[cfg_attr(not(any(test, feature = "fuzzing")), allow(dead_code))]
    #[error("handshake: packet header cut short")]
    HeaderCutShort,
    #[cfg_attr(not(any(test, feature = "fuzzing")), allow(dead_code))]
    #[error("handshake: packet cut short")]
    PacketCutShort,
    #[error("handshake: empty packet")]
    Empty,
    #[error("handshake: protocol version {0}, expected 10 (not a MySQL/MariaDB server?)")]
    Protocol(u8),
    #[error("handshake: server version is not terminated")]
    VersionNotTerminated,
    #[error("server refused the connection: error {code}: {message}")]
    Refused { code: u16, message: String },
}

pub(super) async fn round_trip(t: &Target, timeout: Duration) -> Result<Good, Failure> {
    let start = Instant::now();
    let mut stream = connect_tcp(t, timeout).await?;
    let io = |e: std::io::Error| Failure::Outage(format!("handshake: {e}"));
    let read = async {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header).await.map_err(io)?;
        let len = mysql_packet_len(header).map_err(Failure::outage)?;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.map_err(io)?;
        Ok::<_, Failure>(payload)
    };
    let payload = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| no_answer("handshake", timeout))??;
    let latency = start.elapsed();
    let version = parse_mysql_greeting(&payload).map_err(Failure::outage)?;
    Ok(Good {
        latency,
        detail: Some(format!(
            "server version {version} (handshake only, not authenticated)"
        )),
    })
}

/// The payload length a packet header announces, if it is one a greeting can have.
fn mysql_packet_len(header: [u8; 4]) -> Result<usize, MysqlError> {
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    if !(1..=64 * 1024).contains(&len) {
        return Err(MysqlError::PacketLength(len));
    }
    Ok(len)
}

/// [`round_trip`]'s reading of the first packet, on bytes in memory: header, payload, greeting.
/// For the fuzz targets; bytes past the packet are left alone, as the check leaves them unread.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn parse_mysql_packet(bytes: &[u8]) -> Result<String, MysqlError> {
    let header = bytes.first_chunk::<4>().ok_or(MysqlError::HeaderCutShort)?;
    let len = mysql_packet_len(*header)?;
    let payload = bytes.get(4..4 + len).ok_or(MysqlError::PacketCutShort)?;
    parse_mysql_greeting(payload)
}

/// The server version from an initial handshake packet's payload, or the server's error.
fn parse_mysql_greeting(payload: &[u8]) -> Result<String, MysqlError> {
    match payload.first() {
        Some(10) => {
            let rest = &payload[1..];
            let end = rest
                .iter()
                .position(|b| *b == 0)
                .ok_or(MysqlError::VersionNotTerminated)?;
            Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
        }
        Some(0xff) if payload.len() >= 3 => {
            let code = u16::from_le_bytes([payload[1], payload[2]]);
            let mut msg = &payload[3..];
            // 4.1 error packets carry '#' and a five-character SQL state before the message.
            if msg.first() == Some(&b'#') && msg.len() >= 6 {
                msg = &msg[6..];
            }
            Err(MysqlError::Refused {
                code,
                message: String::from_utf8_lossy(msg).into_owned(),
            })
        }
        Some(v) => Err(MysqlError::Protocol(*v)),
        None => Err(MysqlError::Empty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_errors_and_garbage_are_told_apart() {
        assert_eq!(
            parse_mysql_greeting(&[10, b'8', b'.', b'0', 0]).as_deref(),
            Ok("8.0")
        );
        assert_eq!(
            parse_mysql_greeting(&[9, b'x', 0]),
            Err(MysqlError::Protocol(9))
        );
        assert_eq!(
            parse_mysql_greeting(&[10, b'x']),
            Err(MysqlError::VersionNotTerminated)
        );
        assert_eq!(parse_mysql_greeting(&[]), Err(MysqlError::Empty));
        let err = parse_mysql_greeting(b"\xff\x10\x04#08004Too many connections").unwrap_err();
        assert_eq!(
            err.to_string(),
            "server refused the connection: error 1040: Too many connections"
        );
        assert_eq!(
            parse_mysql_packet(&[0, 0, 0, 0]),
            Err(MysqlError::PacketLength(0))
        );
        assert_eq!(
            parse_mysql_packet(&[5, 0, 0]),
            Err(MysqlError::HeaderCutShort)
        );
        assert_eq!(
            parse_mysql_packet(&[5, 0, 0, 0, 10]),
            Err(MysqlError::PacketCutShort)
        );
    }
}
