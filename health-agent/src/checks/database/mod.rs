//! The database check: one real protocol round trip per configured database, on its own cadence
//! (`database.interval`), damped and cached — never once per `/health` request.
//!
//! - `postgres://` / `postgresql://`: connect, authenticate, `SELECT 1` (tokio-postgres), over
//!   TLS as libpq's `sslmode` says (`prefer` by default: TLS when the server offers it).
//! - `redis://[user:password@]host[:port][/db]`: `AUTH` when a password is known, `SELECT` when a
//!   database index is given, then `PING`, expecting `+PONG`. `rediss://` does the same over TLS
//!   (`verify-full` unless its `sslmode` says otherwise).
//! - `mysql://host[:port]`: reads the server's initial handshake packet (protocol v10) and
//!   reports the server version. It does **not** log in, so it proves the server accepts
//!   connections, not that credentials work. The server logs an "Aborted connection …
//!   without authentication" warning per round, and MySQL may count such handshakes against
//!   `max_connect_errors` for non-loopback clients: raise it on a remote server checked this way.
//!
//! A TLS or certificate failure (not trusted, wrong host name, expired, TLS wanted by one side
//! and refused by the other) is a `Refused` failure, `misconfigured`, never an outage; a TLS
//! handshake that stalls is an outage like a connect that does. `database.timeout` bounds the
//! handshake as it bounds the connect.
//!
//! A database's password comes from its URL, else (Postgres only, as libpq does) `PGPASSWORD`,
//! else the first line of `database.password_file`. Passwords are kept out of everything this
//! module shows where they can sit, never searched for by value (`crate::redact`): names are
//! `redact_url`ed, a server's errors are its own words (no server quotes a password back but in
//! answer to the command that carried it), and that answer is shown by its error code only.
//!
//! Mistakes of the agent's own configuration are `misconfigured` from the first round, never an
//! outage: a server that asks for a password none is set for, a password file or a certificate
//! file that cannot be read, a host name that has not resolved once since the agent started
//! (one that resolved and then fails is an outage). Each says what to change, naming the key
//! (`database.url`, `database.urls[i]`, `database.password_file`) or where the password came
//! from; what can be seen before connecting is also logged at start.
//!
//! Here: the monitor, its report and the round of checks. `target` (what to connect to, with
//! which password; URLs are parsed by the leaf `crate::dburl`), `damper` (fail_after /
//! recover_after), `tls` (the rustls client, its certificate checks and the words for its
//! failures), one module per wire protocol (`postgres`, `redis`, `mysql`), whose pure parsers
//! the fuzz targets in `crate::fuzzing` call.

mod damper;
mod mysql;
mod postgres;
mod redis;
mod target;
pub(crate) mod tls;

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tokio::net::TcpStream;

pub use self::damper::{Damper, RoundTrip};
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use self::mysql::parse_mysql_packet;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use self::redis::{parse_resp_line, ping_verdict, RESP_LINE_MAX};
use self::target::{Login, Passwords, Target};
pub use crate::dburl::DbKind;
use crate::{checks::DatabaseReport, config::DatabaseConfig, dburl::DbUrlError, status::DbState};

/// Why the database check cannot run as configured. Names the key, never a password.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    /// `database.url` or `database.urls[i]` is not a URL the check can use.
    #[error("{key}: {error}")]
    Url { key: String, error: DbUrlError },
    #[error("cannot read database.password_file {}: {source}", path.display())]
    PasswordFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One database in the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DatabaseEntry {
    /// The URL without its password.
    pub name: String,
    /// The config key it came from: `database.url` or `database.urls[i]`.
    pub key: String,
    pub kind: DbKind,
    /// The damped state.
    pub state: DbState,
    /// The last good round trip's duration (connect included); null after a failed one.
    #[serde(serialize_with = "crate::text::shown::ms_opt")]
    pub latency_ms: Option<f64>,
    /// Why the last round trip failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the last good round trip learnt (timings, server version).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub consecutive_failures: u32,
    /// RFC 3339 time of the last round trip; null before the first.
    pub last_checked: Option<String>,
}

/// What one round trip produced, before damping.
#[derive(Debug, Clone)]
struct Outcome {
    result: Result<Good, Failure>,
    /// What the lookup of the host said; a failed one is judged with what earlier rounds saw.
    lookup: Lookup,
    at: SystemTime,
}

/// The lookup of a target's host this round.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lookup {
    /// The round stopped before it (a password file that cannot be read, the deadline).
    NotAsked,
    /// An address, a socket path, or a name that gave addresses.
    Known,
    /// A name that gave none.
    Failed(NoAddress),
}

/// Why a host name gave no address: the resolver said it has none, or the resolver could not
/// be asked (which says nothing about the name).
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoAddress {
    /// No such name (a typo, a deleted record): the resolver's words.
    Unknown(String),
    /// The resolver did not answer (unreachable, timed out, failing): its words.
    NoResolver(String),
}

impl NoAddress {
    /// From the error of a lookup. The standard library words a resolver's failure as
    /// "failed to lookup address information: " and the C library's `gai_strerror`, which glibc
    /// and musl word alike for the two codes that mean "ask again later" (EAI_AGAIN) and "the
    /// resolver failed" (EAI_FAIL); a system error (EAI_SYSTEM: resolv.conf unreadable, no
    /// socket) comes as the OS error itself.
    fn of(e: &std::io::Error) -> Self {
        const NO_RESOLVER: [&str; 2] = [
            "Temporary failure in name resolution",
            "Non-recoverable failure in name resolution",
        ];
        let text = e.to_string();
        if e.raw_os_error().is_some() || NO_RESOLVER.iter().any(|w| text.ends_with(w)) {
            Self::NoResolver(text)
        } else {
            Self::Unknown(text)
        }
    }

    fn text(&self) -> &str {
        match self {
            Self::Unknown(t) | Self::NoResolver(t) => t,
        }
    }
}

/// Why a round trip failed: the database did not answer (an outage, damped), or it answered
/// and refused us (a configuration error: credentials, database name — reported at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    Outage(String),
    Refused(String),
}

impl Failure {
    fn message(&self) -> &str {
        match self {
            Self::Outage(m) | Self::Refused(m) => m,
        }
    }

    fn map(self, f: impl FnOnce(&str) -> String) -> Self {
        match self {
            Self::Outage(m) => Self::Outage(f(&m)),
            Self::Refused(m) => Self::Refused(f(&m)),
        }
    }

    /// An outage described by `e`.
    fn outage(e: impl fmt::Display) -> Self {
        Self::Outage(e.to_string())
    }
}

#[derive(Debug, Clone)]
pub(super) struct Good {
    pub(super) latency: Duration,
    pub(super) detail: Option<String>,
}

#[derive(Debug, Clone)]
struct Track {
    damper: Damper,
    last: Option<Outcome>,
    /// The host has resolved in some round since the agent started: a lookup failing now is
    /// an outage (DNS, a deleted record). Until then a name that does not resolve is a
    /// mistake in the URL (a typo in an RDS endpoint), which no restart or outage alert fixes.
    resolved_once: bool,
}

/// Checks every configured database, one round trip each per `check()`, and keeps their damped
/// state. Clones share that state (the runner's timeout path feeds the same damping).
#[derive(Clone)]
pub struct DatabaseMonitor {
    targets: Arc<[Target]>,
    tracks: Arc<Mutex<Vec<Track>>>,
    timeout: Duration,
    slow_after: Duration,
    fail_after: u32,
    password_file: Option<PathBuf>,
}

impl fmt::Debug for DatabaseMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseMonitor")
            .field("targets", &self.targets)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl DatabaseMonitor {
    /// `None` when no database is configured; `Err` names the offending key, never a password.
    pub fn new(cfg: &DatabaseConfig) -> Result<Option<Self>, DatabaseError> {
        let targets = target::targets(cfg)?;
        if targets.is_empty() {
            return Ok(None);
        }
        let password_file =
            (!cfg.password_file.trim().is_empty()).then(|| PathBuf::from(cfg.password_file.trim()));
        // Said once at start; the first round reports the same as `misconfigured`.
        let mut warned = Vec::new();
        for t in &targets {
            for w in target::start_warnings(t, password_file.as_ref()) {
                if !warned.contains(&w) {
                    tracing::warn!("database check: {w}");
                    warned.push(w);
                }
            }
        }
        let tracks = targets
            .iter()
            .map(|_| Track {
                damper: Damper::new(cfg.fail_after, cfg.recover_after),
                last: None,
                resolved_once: false,
            })
            .collect();
        Ok(Some(Self {
            targets: targets.into(),
            tracks: Arc::new(Mutex::new(tracks)),
            timeout: cfg.timeout,
            slow_after: cfg.slow_after,
            fail_after: cfg.fail_after.max(1),
            password_file,
        }))
    }

    /// One round trip per database (concurrently), fed through the damping.
    pub async fn check(&mut self) -> DatabaseReport {
        let passwords = Passwords::read(self.password_file.as_ref());
        let rounds = self.targets.iter().map(|t| {
            let login = passwords.for_target(t);
            let timeout = self.timeout;
            async move {
                let (result, lookup) = match login {
                    Ok(login) => match look_up(t, timeout).await {
                        Ok(()) => (round_trip(t, &login, timeout).await, Lookup::Known),
                        // Judged in `record`, which knows whether the name ever resolved.
                        Err(e) => (Err(Failure::Outage(e.text().to_owned())), Lookup::Failed(e)),
                    },
                    Err(f) => (Err(f), Lookup::NotAsked),
                };
                Outcome {
                    result,
                    lookup,
                    at: SystemTime::now(),
                }
            }
        });
        let outcomes = futures_util::future::join_all(rounds).await;
        self.record(outcomes)
    }

    /// The current damped report without a new round trip (all `unknown` before the first).
    pub fn report(&self) -> DatabaseReport {
        let tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        self.build(&tracks)
    }

    /// For the runner's deadline: counts a failed round trip for every database (through the
    /// same damping) and returns the report.
    pub fn on_timeout(&self) -> impl Fn() -> DatabaseReport + Send + Sync + 'static {
        let me = self.clone();
        move || {
            let error = format!(
                "the database check overran its deadline ({} per connect and query)",
                humantime::format_duration(me.timeout)
            );
            let now = SystemTime::now();
            me.record(
                me.targets
                    .iter()
                    .map(|_| Outcome {
                        result: Err(Failure::Outage(error.clone())),
                        lookup: Lookup::NotAsked,
                        at: now,
                    })
                    .collect(),
            )
        }
    }

    fn record(&self, outcomes: Vec<Outcome>) -> DatabaseReport {
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        for ((track, mut outcome), t) in tracks.iter_mut().zip(outcomes).zip(self.targets.iter()) {
            track.resolved_once |= outcome.lookup == Lookup::Known;
            if let Lookup::Failed(e) = &outcome.lookup {
                outcome.result = Err(unresolved(t, e, track.resolved_once));
            }
            let r = match &outcome.result {
                Err(Failure::Outage(_)) => RoundTrip::Failed,
                Err(Failure::Refused(_)) => RoundTrip::Refused,
                Ok(g) if g.latency > self.slow_after => RoundTrip::Slow,
                Ok(_) => RoundTrip::Fast,
            };
            track.damper.observe(r);
            track.last = Some(outcome);
        }
        self.build(&tracks)
    }

    fn build(&self, tracks: &[Track]) -> DatabaseReport {
        let databases: Vec<DatabaseEntry> = self
            .targets
            .iter()
            .zip(tracks)
            .map(|(t, tr)| {
                let last = tr.last.as_ref();
                let good = last.and_then(|o| o.result.as_ref().ok());
                DatabaseEntry {
                    name: t.shown.clone(),
                    key: t.key.clone(),
                    kind: t.kind,
                    state: tr.damper.state(),
                    latency_ms: good.map(|g| round1(g.latency.as_secs_f64() * 1000.0)),
                    error: last
                        .and_then(|o| o.result.as_ref().err())
                        .map(|f| f.message().to_string()),
                    detail: good.and_then(|g| g.detail.clone()),
                    consecutive_failures: tr.damper.consecutive_failures(),
                    last_checked: last.map(|o| crate::text::rfc3339(o.at)),
                }
            })
            .collect();
        let state = databases
            .iter()
            .map(|d| d.state)
            .max_by_key(|s| severity(*s))
            .unwrap_or(DbState::NotConfigured);
        let reasons: Vec<String> = databases.iter().filter_map(|d| self.reason(d)).collect();
        DatabaseReport {
            state,
            reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
            databases,
        }
    }

    fn reason(&self, d: &DatabaseEntry) -> Option<String> {
        let error = d.error.as_deref().unwrap_or("no answer");
        match d.state {
            DbState::Unreachable => Some(format!("{} unreachable: {error}", d.name)),
            DbState::Misconfigured => Some(misconfigured(d)),
            DbState::Slow => Some(format!(
                "{} slow: round trip {:.0} ms (slow_after {})",
                d.name,
                d.latency_ms.unwrap_or_default(),
                humantime::format_duration(self.slow_after)
            )),
            _ if d.consecutive_failures > 0 => Some(format!(
                "{}: {} of {} failed round trips before unreachable: {error}",
                d.name, d.consecutive_failures, self.fail_after
            )),
            DbState::Unknown => Some(format!("{} not checked yet", d.name)),
            _ => None,
        }
    }
}

/// A host name that gave no address: a mistake in `t`'s URL when the resolver says the name
/// does not exist and it never has since the agent started; an outage once it did, or when the
/// resolver itself did not answer.
fn unresolved(t: &Target, why: &NoAddress, resolved_once: bool) -> Failure {
    let host = &t.host;
    match why {
        NoAddress::NoResolver(error) => Failure::Outage(format!(
            "the resolver did not answer for the host {host} ({error}): DNS is unreachable or \
             failing from this instance"
        )),
        NoAddress::Unknown(error) if resolved_once => Failure::Outage(format!(
            "the host {host} no longer resolves ({error}); it did earlier"
        )),
        NoAddress::Unknown(error) => Failure::Refused(format!(
            "the host {host} does not resolve ({error}) and has not since the agent started: \
             fix the host name in {}",
            t.key
        )),
    }
}

/// A misconfigured database in words: the key, the URL (redacted) and the cause, which says
/// what to change.
fn misconfigured(d: &DatabaseEntry) -> String {
    let error = d.error.as_deref().unwrap_or("refused");
    format!("{} {}: {error}", d.key, d.name)
}

impl DatabaseReport {
    /// Why the database check is misconfigured, one cause per misconfigured database, for the
    /// policy's reason; `None` when none is.
    pub fn misconfigured_reason(&self) -> Option<String> {
        let causes: Vec<String> = self
            .databases
            .iter()
            .filter(|d| d.state == DbState::Misconfigured)
            .map(misconfigured)
            .collect();
        (!causes.is_empty()).then(|| causes.join("; "))
    }
}

/// Worst first: unreachable > slow > misconfigured > unknown > connected.
fn severity(s: DbState) -> u8 {
    match s {
        DbState::NotConfigured => 0,
        DbState::Connected => 1,
        DbState::Unknown => 2,
        DbState::Misconfigured => 3,
        DbState::Slow => 4,
        DbState::Unreachable => 5,
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------------------------------------
// The round trips. Each bounds its connect and its exchange by `timeout`; errors may carry
// secrets echoed by a server or library and are sanitised by the caller.

async fn round_trip(t: &Target, login: &Login, timeout: Duration) -> Result<Good, Failure> {
    match t.kind {
        DbKind::Postgres => postgres::round_trip(t, login, timeout).await,
        DbKind::Redis => redis::round_trip(t, login, timeout).await,
        DbKind::Mysql => mysql::round_trip(t, timeout).await,
    }
}

fn no_answer(what: &str, timeout: Duration) -> Failure {
    Failure::Outage(format!(
        "{what}: no answer within {}",
        humantime::format_duration(timeout)
    ))
}

/// Looks up `t`'s host name, bounded by `timeout`: Err says why it gave no address. An address
/// literal or a socket directory needs no lookup, nor does a Postgres URL with `hostaddr` or
/// several hosts (tokio-postgres tries each, and one that does not resolve may be a standby's).
async fn look_up(t: &Target, timeout: Duration) -> Result<(), NoAddress> {
    let host = t.host.trim_start_matches('[').trim_end_matches(']');
    let several = t
        .postgres
        .as_ref()
        .is_some_and(|c| c.get_hosts().len() > 1 || !c.get_hostaddrs().is_empty());
    if host.starts_with('/') || host.parse::<std::net::IpAddr>().is_ok() || several {
        return Ok(());
    }
    match tokio::time::timeout(timeout, tokio::net::lookup_host((host, t.port))).await {
        Err(_) => Err(NoAddress::NoResolver(format!(
            "no answer from the resolver within {}",
            humantime::format_duration(timeout)
        ))),
        Ok(Err(e)) => Err(NoAddress::of(&e)),
        Ok(Ok(mut addrs)) => match addrs.next() {
            Some(_) => Ok(()),
            None => Err(NoAddress::Unknown("no address".into())),
        },
    }
}

/// The TCP connection Redis and MySQL talk over (tokio-postgres makes its own).
async fn connect_tcp(t: &Target, timeout: Duration) -> Result<TcpStream, Failure> {
    tokio::time::timeout(timeout, TcpStream::connect((t.host.as_str(), t.port)))
        .await
        .map_err(|_| no_answer("connect", timeout))?
        .map_err(|e| Failure::Outage(format!("connect: {e}")))
}

#[cfg(test)]
mod test_helpers;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
