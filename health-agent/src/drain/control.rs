//! The local control channel of `health-agent drain` and `undrain`: a Unix socket (mode 0600,
//! owned by the agent's user, root) that also checks its peer's credentials, so only root on
//! the box can drain; the public port has no such route. One JSON request line per connection;
//! the agent answers with JSON lines — progress once a second, then one final line — and
//! closes.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader},
    net::{UnixListener, UnixStream},
};
use tokio_util::sync::CancellationToken;

use super::{By, Drain, Judgement, ProgressLines};

/// A request line longer than this is refused.
const MAX_REQUEST: usize = 1024;
/// A client that sends no request within this is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting command's drain is judged.
const JUDGE_EVERY: Duration = Duration::from_millis(100);
/// The longest a final line waits for `/health` to serve it (a snapshot comes every
/// `web.eval_interval` while draining).
const SHOWN_WITHIN: Duration = Duration::from_secs(2);

/// What a command asks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    Drain { quiet_ms: u64, timeout_ms: u64 },
    Undrain,
}

/// One line of the agent's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    pub kind: ReplyKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReplyKind {
    Progress,
    Warning,
    Drained,
    TimedOut,
    Undrained,
    NotDraining,
    Error,
}

impl ReplyKind {
    /// Whether the line ends the answer.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Progress | Self::Warning)
    }
}

/// Binds the control socket: its directory made if missing, a stale socket of a stopped agent
/// replaced, a live one refused (another agent runs), mode 0600.
pub fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another agent answers on it",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Created 0600 from the start: no window in which another user could connect.
    let listener = crate::sys::with_umask(0o177, || std::os::unix::net::UnixListener::bind(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves the control socket until `shutdown`, then removes it.
pub fn spawn(
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    drain: Drain,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = UnixListener::from_std(listener)?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let drain = drain.clone();
                        let shutdown = shutdown.clone();
                        tokio::spawn(async move { answer(stream, drain, shutdown).await });
                    }
                    Err(e) => {
                        tracing::warn!("control socket: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = shutdown.cancelled() => break,
            }
        }
        let _ = std::fs::remove_file(&path);
    }))
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, kind: ReplyKind, message: String) -> bool {
    let mut line = serde_json::to_string(&Reply { kind, message }).unwrap_or_default();
    line.push('\n');
    w.write_all(line.as_bytes()).await.is_ok()
}

async fn answer(stream: UnixStream, drain: Drain, shutdown: CancellationToken) {
    let cred = stream.peer_cred();
    let (r, mut w) = stream.into_split();
    // The socket's mode already keeps others out; this holds if someone loosens it.
    let me = crate::sys::effective_uid();
    match cred {
        Ok(c) if c.uid() == 0 || c.uid() == me => {}
        Ok(c) => {
            tracing::warn!(
                "control socket: uid {} refused (only root may drain)",
                c.uid()
            );
            send(
                &mut w,
                ReplyKind::Error,
                format!(
                    "permission denied: only root may drain or undrain (you are uid {})",
                    c.uid()
                ),
            )
            .await;
            return;
        }
        Err(e) => {
            send(
                &mut w,
                ReplyKind::Error,
                format!("cannot tell who you are: {e}"),
            )
            .await;
            return;
        }
    }
    let mut line = String::new();
    let mut reader = AsyncBufReader::new(r).take(MAX_REQUEST as u64);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    let request = match read {
        Ok(Ok(_)) => serde_json::from_str::<Request>(line.trim()),
        _ => {
            send(&mut w, ReplyKind::Error, "no request line".into()).await;
            return;
        }
    };
    match request {
        Ok(Request::Undrain) => {
            let (kind, message) = match drain.undrain() {
                Ok(true) => (
                    ReplyKind::Undrained,
                    "undrained: /health answers 200 once the web backend answers".to_string(),
                ),
                Ok(false) => (ReplyKind::NotDraining, "not draining".into()),
                Err(e) => (ReplyKind::Error, e.to_string()),
            };
            send(&mut w, kind, message).await;
        }
        Ok(Request::Drain {
            quiet_ms,
            timeout_ms,
        }) => {
            let quiet = Duration::from_millis(quiet_ms);
            let timeout = Duration::from_millis(timeout_ms);
            if let Err(e) = drain.start(By::Command) {
                let message = format!("{e}: draining anyway, but an agent restart will end it");
                if !send(&mut w, ReplyKind::Warning, message).await {
                    return;
                }
            }
            wait(&mut w, &drain, quiet, timeout, shutdown).await;
        }
        Err(e) => {
            send(&mut w, ReplyKind::Error, format!("bad request: {e}")).await;
        }
    }
}

/// Judges the drain every JUDGE_EVERY for the waiting command, with a progress line every
/// second, until it is drained or timed out (or undrained by someone else, or the agent stops).
async fn wait(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    drain: &Drain,
    quiet: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let since = Instant::now();
    let mut next_progress = since + Duration::from_secs(1);
    let mut lines = ProgressLines::default();
    loop {
        let (kind, message) = match drain.judge(quiet, timeout, since) {
            // Not drained: a script must not go on to stop the app as if it were.
            None => (
                ReplyKind::Error,
                "undrain ended the drain before it was drained".to_string(),
            ),
            Some(Judgement::Drained(m)) => (ReplyKind::Drained, m),
            Some(Judgement::TimedOut(m)) => (ReplyKind::TimedOut, m),
            Some(Judgement::Draining) => {
                let now = Instant::now();
                if now >= next_progress {
                    next_progress += Duration::from_secs(1);
                    if let Some((p, started)) = drain.progress() {
                        if !send(w, ReplyKind::Progress, lines.next(&p, started, now)).await {
                            return;
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(JUDGE_EVERY) => continue,
                    _ = shutdown.cancelled() => (
                        ReplyKind::Error,
                        "the agent is stopping; the drain is kept and resumes when it starts".into(),
                    ),
                }
            }
        };
        if kind != ReplyKind::Error {
            // What the command prints last, `details.drain` says at the same moment.
            drain.until_shown(SHOWN_WITHIN).await;
        }
        send(w, kind, message).await;
        return;
    }
}

/// The client's errors: each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("permission denied on {path}: only root can drain or undrain (try sudo)")]
    Permission { path: String },
    #[error(
        "cannot reach the agent at {path} ({error}): is `health-agent serve` running, with this \
         [drain] control_socket?"
    )]
    Unreachable { path: String, error: std::io::Error },
    #[error("talking to the agent at {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("the agent closed the control socket without a final answer")]
    Cut,
}

/// Sends `request` to the agent at `socket` and hands every answer line to `each`; returns the
/// final one.
pub fn request(
    socket: &Path,
    request: &Request,
    mut each: impl FnMut(&Reply),
) -> Result<Reply, ClientError> {
    let path = socket.display().to_string();
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|error| match error.kind() {
            std::io::ErrorKind::PermissionDenied => ClientError::Permission { path: path.clone() },
            _ => ClientError::Unreachable {
                path: path.clone(),
                error,
            },
        })?;
    let io = |error| ClientError::Io {
        path: path.clone(),
        error,
    };
    let mut line = serde_json::to_string(request).map_err(|e| io(std::io::Error::other(e)))?;
    line.push('\n');
    match stream.write_all(line.as_bytes()) {
        // The agent may refuse (who is asking) and close before the request is written: its
        // answer is still there to read.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) => {}
        other => other.map_err(io)?,
    }
    for line in BufReader::new(stream).lines() {
        let line = line.map_err(io)?;
        let Ok(reply) = serde_json::from_str::<Reply>(&line) else {
            continue;
        };
        if reply.kind.is_final() {
            return Ok(reply);
        }
        each(&reply);
    }
    Err(ClientError::Cut)
}
