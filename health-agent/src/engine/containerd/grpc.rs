//! Unary gRPC calls over containerd's Unix socket: HTTP/2 with prior knowledge (hyper's client),
//! each message behind gRPC's 5-byte prefix, the status read from the trailers (or from the
//! headers of a trailers-only answer). One connection serves every call of one operation.

use std::{path::Path, time::Duration};

use bytes::{BufMut as _, Bytes, BytesMut};
use http_body_util::{BodyExt as _, Full};
use hyper::{client::conn::http2, header, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// gRPC's status codes the client acts on (the rest are shown by number).
pub const NOT_FOUND: u32 = 5;

/// Why a call failed: the socket, HTTP/2, or containerd's own status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("cannot connect to {path}: {reason}")]
    Connect { path: String, reason: String },
    #[error("HTTP/2: {0}")]
    Transport(String),
    /// containerd answered with a gRPC status other than OK.
    #[error("{message} (gRPC status {code})")]
    Status { code: u32, message: String },
    #[error("undecodable answer: {0}")]
    Decode(String),
}

impl CallError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { code, .. } if *code == NOT_FOUND)
    }
}

/// An HTTP/2 connection to containerd, tied to one namespace (the `containerd-namespace`
/// metadata every namespaced call carries).
pub struct Channel {
    send: http2::SendRequest<Full<Bytes>>,
    namespace: String,
    /// Bounds the connect, and each call.
    timeout: Duration,
}

impl Channel {
    pub async fn connect(
        path: &Path,
        namespace: &str,
        timeout: Duration,
    ) -> Result<Self, CallError> {
        let connect_error = |e: &dyn std::fmt::Display| CallError::Connect {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let connect = async {
            let stream = tokio::net::UnixStream::connect(path).await?;
            http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)
        };
        let (send, conn) = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| connect_error(&format!("no answer within {}s", timeout.as_secs())))?
            .map_err(|e| connect_error(&e))?;
        // Ends when `send` (and every clone) is dropped, or containerd closes the socket.
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("containerd connection: {e}");
            }
        });
        Ok(Self {
            send,
            namespace: namespace.to_string(),
            timeout,
        })
    }

    /// Calls `method` ("/containerd.services.tasks.v1.Tasks/Get") with `request`, within the
    /// channel's timeout.
    pub async fn call<Req, Resp>(&mut self, method: &str, request: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.exchange(method, request))
            .await
            .unwrap_or_else(|_| {
                Err(CallError::Transport(format!(
                    "{method}: no answer within {}s",
                    timeout.as_secs()
                )))
            })
    }

    async fn exchange<Req, Resp>(&mut self, method: &str, request: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let req = Request::post(format!("http://containerd{method}"))
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers")
            .header("containerd-namespace", &self.namespace)
            .body(Full::new(frame(request)))
            .map_err(|e| CallError::Transport(e.to_string()))?;
        self.send
            .ready()
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let (parts, body) = resp.into_parts();
        if !parts.status.is_success() {
            return Err(CallError::Transport(format!("HTTP {}", parts.status)));
        }
        let collected = body
            .collect()
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        // A trailers-only answer (every error containerd sends) carries the status in its headers.
        let trailers = collected.trailers().cloned();
        let status = trailers
            .as_ref()
            .and_then(status_of)
            .or_else(|| status_of(&parts.headers));
        match status {
            Some((0, _)) => {}
            Some((code, message)) => return Err(CallError::Status { code, message }),
            None => return Err(CallError::Transport("no grpc-status in the answer".into())),
        }
        unframe(collected.to_bytes())
    }
}

/// `message` behind gRPC's prefix: not compressed (0), then its length, big-endian.
fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message
        .encode(&mut buf)
        .expect("BytesMut grows to fit the message");
    buf.freeze()
}

/// The one message of a unary answer.
fn unframe<M: prost::Message + Default>(body: Bytes) -> Result<M, CallError> {
    if body.len() < 5 {
        return Err(CallError::Decode(format!(
            "{} bytes, no message",
            body.len()
        )));
    }
    if body[0] != 0 {
        return Err(CallError::Decode(
            "a compressed message (none was asked for)".into(),
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let message = body.get(5..5 + len).ok_or_else(|| {
        CallError::Decode(format!("{len} bytes announced, {} sent", body.len() - 5))
    })?;
    M::decode(message).map_err(|e| CallError::Decode(e.to_string()))
}

/// `grpc-status` and its percent-encoded `grpc-message`, when present.
fn status_of(headers: &hyper::HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| {
            percent_encoding::percent_decode_str(m)
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some((code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Named {
        #[prost(string, tag = "1")]
        name: String,
    }

    #[test]
    fn a_framed_message_reads_back() {
        let m = Named { name: "web".into() };
        let framed = frame(&m);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 5]);
        assert_eq!(unframe::<Named>(framed).unwrap(), m);
    }

    #[test]
    fn short_or_compressed_answers_are_errors_not_panics() {
        assert!(unframe::<Named>(Bytes::from_static(&[0, 0])).is_err());
        assert!(unframe::<Named>(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err());
        assert!(unframe::<Named>(Bytes::from_static(&[0, 0, 0, 0, 9, 1])).is_err());
    }

    #[test]
    fn the_status_message_is_percent_decoded() {
        let mut h = hyper::HeaderMap::new();
        h.insert("grpc-status", "5".parse().unwrap());
        h.insert(
            "grpc-message",
            "container%20%22web%22%20in%20namespace%20%22default%22:%20not%20found"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            status_of(&h),
            Some((
                5,
                "container \"web\" in namespace \"default\": not found".into()
            ))
        );
    }
}
