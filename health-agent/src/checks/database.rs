//! The database check: one real protocol round trip per configured database, on its own cadence
//! (`database.interval`), damped and cached — never once per `/health` request.
//!
//! - `postgres://` / `postgresql://`: connect, authenticate, `SELECT 1` (tokio-postgres). No TLS
//!   yet: `sslmode` may be `disable` or `prefer` (which then runs in the clear), anything
//!   stronger is refused at config load rather than silently downgraded.
//! - `redis://[user:password@]host[:port][/db]`: `AUTH` when a password is known, `SELECT` when a
//!   database index is given, then `PING`, expecting `+PONG`.
//! - `mysql://host[:port]`: reads the server's initial handshake packet (protocol v10) and
//!   reports the server version. It does **not** log in, so it proves the server accepts
//!   connections, not that credentials work. The server logs an "Aborted connection …
//!   without authentication" warning per round, and MySQL may count such handshakes against
//!   `max_connect_errors` for non-loopback clients: raise it on a remote server checked this way.
//!
//! A database's password comes from its URL, else (Postgres only, as libpq does) `PGPASSWORD`,
//! else the first line of `database.password_file`. Passwords are kept out of everything this
//! module shows: names are `redact_url`ed and every error string passes through `sanitize`.
//!
//! Damping (`Damper`): a database turns `unreachable` only after `fail_after` consecutive failed
//! round trips and comes back after `recover_after` consecutive good ones; a good round trip
//! slower than `slow_after` is `slow`.

use std::{
    fmt,
    path::PathBuf,
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use percent_encoding::percent_decode_str;
use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use crate::{checks::DatabaseReport, config::DatabaseConfig, policy::DbState};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DbKind {
    Postgres,
    Redis,
    Mysql,
}

impl DbKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::Mysql => "mysql",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Postgres => 5432,
            Self::Redis => 6379,
            Self::Mysql => 3306,
        }
    }
}

/// One database in the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DatabaseEntry {
    /// The URL without its password.
    pub name: String,
    pub kind: DbKind,
    /// The damped state.
    pub state: DbState,
    /// The last good round trip's duration (connect included); null after a failed one.
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

// ---------------------------------------------------------------------------------------------
// URLs and secrets

/// `url` fit to show: the password (in the userinfo or a `password=` query parameter) removed,
/// everything else kept. Anything that is not `scheme://…` is shown as a placeholder, since
/// there is no telling where a secret might sit in it.
pub fn redact_url(url: &str) -> String {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    // The last '@' ends the userinfo: a password with an unencoded '/', '?' or '#' must not
    // leak through a too-early authority end. (`parse` refuses URLs with a second '@'.)
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let mut out = format!("{scheme}://");
    if let Some(user) = userinfo.map(|u| u.split_once(':').map_or(u, |(user, _)| user)) {
        if !user.is_empty() {
            out.push_str(user);
            out.push('@');
        }
    }
    let (before_query, query) = match after.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (after, None),
    };
    out.push_str(before_query);
    if let Some(q) = query {
        let kept: Vec<&str> = q
            .split('&')
            .filter(|kv| {
                let key = kv.split_once('=').map_or(*kv, |(k, _)| k);
                !percent_decode_str(key)
                    .decode_utf8_lossy()
                    .eq_ignore_ascii_case("password")
            })
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
    }
    out
}

/// `text` with every `scheme://…` token in it passed through `redact_url`: for messages that
/// quote configuration lines, such as TOML parse errors.
pub fn redact_urls_in(text: &str) -> String {
    let in_scheme = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
    // Only whitespace and quotes end a URL here: a password may hold ',' or ']'.
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .char_indices()
            .rev()
            .take_while(|(_, c)| in_scheme(*c))
            .last()
            .map_or(i, |(j, _)| j);
        let end = rest[i..].find(ends).map_or(rest.len(), |j| i + j);
        out.push_str(&rest[..start]);
        if start == i {
            // No scheme before "://": not a URL, keep it.
            out.push_str(&rest[start..end]);
        } else {
            out.push_str(&redact_url(&rest[start..end]));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Replaces every known secret in `text` with `***`: the last line of defence for error strings
/// built from servers' and libraries' messages.
fn sanitize(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}

/// A parsed database URL. Holds the URL's password, so it has no derived `Debug`.
#[derive(Clone)]
struct Target {
    kind: DbKind,
    /// Redacted: fit to show.
    name: String,
    /// The full URL, password included (tokio-postgres parses it itself).
    url: String,
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    /// The raw (undecoded) forms too, for `sanitize`.
    url_secrets: Vec<String>,
    redis_db: Option<u32>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Checks that `url` is one the database check can use. The message shows the URL redacted.
pub fn validate_url(url: &str) -> Result<(), String> {
    Target::parse(url).map(|_| ())
}

/// The secrets `url` carries (its password, raw and decoded), for redacting text that may quote
/// it; none if it does not parse.
pub fn url_secrets(url: &str) -> Vec<String> {
    Target::parse(url)
        .map(|t| t.url_secrets)
        .unwrap_or_default()
}

fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

impl Target {
    fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let shown = redact_url(url);
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!(
                "{shown}: expected a URL such as postgres://user@host:5432/db, redis://host:6379 \
                 or mysql://host:3306"
            ));
        };
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => DbKind::Postgres,
            "redis" => DbKind::Redis,
            "mysql" => DbKind::Mysql,
            "rediss" => {
                return Err(format!(
                    "{shown}: TLS (rediss://) is not supported yet; use redis://"
                ))
            }
            other => {
                return Err(format!(
                    "{shown}: unsupported scheme {other:?}; use postgres://, postgresql://, \
                     redis:// or mysql://"
                ))
            }
        };
        if rest.matches('@').count() > 1 {
            return Err(format!(
                "{shown}: more than one '@'; percent-encode an '@' in the user or password as %40"
            ));
        }
        let (userinfo, after) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (user, raw_password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((user, pw)) => (Some(user), Some(pw)),
                None => (Some(u), None),
            },
        };
        let user = user.filter(|u| !u.is_empty()).map(decode);
        let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
        let (authority, tail) = after.split_at(authority_end);
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        let params: Vec<(String, String)> = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (decode(k), decode(v)),
                None => (decode(kv), String::new()),
            })
            .collect();
        let query_password = params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("password"))
            .map(|(_, v)| v.clone());
        let mut url_secrets = Vec::new();
        for raw in raw_password.into_iter().chain(
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| decode(k).eq_ignore_ascii_case("password"))
                .map(|(_, v)| v),
        ) {
            url_secrets.push(raw.to_string());
            url_secrets.push(decode(raw));
        }
        let password = raw_password
            .map(decode)
            .or(query_password)
            .filter(|p| !p.is_empty());

        let (host, port) =
            split_host_port(authority, kind.default_port()).map_err(|m| format!("{shown}: {m}"))?;
        let mut redis_db = None;
        match kind {
            DbKind::Postgres => {
                if let Some((_, mode)) = params.iter().find(|(k, _)| k == "sslmode") {
                    if !matches!(mode.as_str(), "disable" | "prefer") {
                        return Err(format!(
                            "{shown}: sslmode={mode} needs TLS, which the database check does \
                             not support yet; use sslmode=disable or sslmode=prefer"
                        ));
                    }
                }
                let pg = tokio_postgres::Config::from_str(url).map_err(|e| {
                    format!(
                        "{shown}: not a valid Postgres URL: {}",
                        sanitize(&error_chain(&e), &url_secrets)
                    )
                })?;
                if pg.get_hosts().is_empty() {
                    return Err(format!("{shown}: names no host"));
                }
                if pg.get_user().is_none_or(str::is_empty) {
                    return Err(format!(
                        "{shown}: names no user, e.g. postgres://user@host:5432/db"
                    ));
                }
            }
            DbKind::Redis | DbKind::Mysql => {
                if host.is_empty() {
                    return Err(format!("{shown}: names no host"));
                }
                if authority.contains(',') {
                    return Err(format!("{shown}: only one host per URL"));
                }
            }
        }
        if kind == DbKind::Redis {
            let db = path.trim_start_matches('/');
            if !db.is_empty() {
                redis_db = Some(db.parse::<u32>().map_err(|_| {
                    format!("{shown}: the path must be a database number, e.g. redis://host:6379/0")
                })?);
            }
        }
        Ok(Self {
            kind,
            name: shown,
            url: url.to_string(),
            host,
            port,
            user,
            password,
            url_secrets,
            redis_db,
        })
    }
}

/// `host[:port]` or `[v6][:port]`; the host may be empty (Postgres takes `?host=`).
fn split_host_port(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("invalid port {p:?}"))
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6
            .split_once(']')
            .ok_or_else(|| "unclosed '[' in the host".to_string())?;
        let port = match rest.strip_prefix(':') {
            Some(p) => parse_port(p)?,
            None if rest.is_empty() => default_port,
            None => return Err("junk after the IPv6 address".into()),
        };
        return Ok((host.to_string(), port));
    }
    // Postgres allows `h1:5432,h2:5433`; tokio-postgres handles those, the first is enough here.
    let first = authority.split(',').next().unwrap_or_default();
    match first.rsplit_once(':') {
        Some((host, p)) => Ok((decode(host), parse_port(p)?)),
        None => Ok((decode(first), default_port)),
    }
}

/// `e` and its sources, joined: tokio-postgres's `Display` alone says only "db error".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out.replace('\n', " ")
}

// ---------------------------------------------------------------------------------------------
// Damping (pure)

/// How one round trip went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundTrip {
    Fast,
    Slow,
    Failed,
    /// The database answered and refused us (see `Failure::Refused`).
    Refused,
}

/// The damped state of one database: `Unknown` until the first decisive evidence, `unreachable`
/// after `fail_after` consecutive failures, back after `recover_after` consecutive successes.
/// A failure that has not reached `fail_after` leaves the state as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damper {
    fail_after: u32,
    recover_after: u32,
    state: DbState,
    consecutive_failures: u32,
    consecutive_successes: u32,
}

impl Damper {
    pub fn new(fail_after: u32, recover_after: u32) -> Self {
        Self {
            fail_after: fail_after.max(1),
            recover_after: recover_after.max(1),
            state: DbState::Unknown,
            consecutive_failures: 0,
            consecutive_successes: 0,
        }
    }

    pub fn state(&self) -> DbState {
        self.state
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    pub fn observe(&mut self, r: RoundTrip) -> DbState {
        match r {
            // An answer, not an outage: nothing to damp.
            RoundTrip::Refused => {
                self.consecutive_failures = 0;
                self.consecutive_successes = 0;
                self.state = DbState::Misconfigured;
            }
            RoundTrip::Failed => {
                self.consecutive_successes = 0;
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.consecutive_failures >= self.fail_after {
                    self.state = DbState::Unreachable;
                }
            }
            RoundTrip::Fast | RoundTrip::Slow => {
                self.consecutive_failures = 0;
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                let recovered = self.state != DbState::Unreachable
                    || self.consecutive_successes >= self.recover_after;
                if recovered {
                    self.state = if r == RoundTrip::Slow {
                        DbState::Slow
                    } else {
                        DbState::Connected
                    };
                }
            }
        }
        self.state
    }
}

// ---------------------------------------------------------------------------------------------
// The monitor

/// What one round trip produced, before damping.
#[derive(Debug, Clone)]
struct Outcome {
    result: Result<Good, Failure>,
    at: SystemTime,
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
}

impl From<String> for Failure {
    fn from(m: String) -> Self {
        Self::Outage(m)
    }
}

#[derive(Debug, Clone)]
struct Good {
    latency: Duration,
    detail: Option<String>,
}

#[derive(Debug, Clone)]
struct Track {
    damper: Damper,
    last: Option<Outcome>,
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
    pub fn new(cfg: &DatabaseConfig) -> Result<Option<Self>, String> {
        let targets = cfg
            .all_urls()
            .into_iter()
            .map(|(key, url)| Target::parse(url).map_err(|m| format!("{key}: {m}")))
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Ok(None);
        }
        let tracks = targets
            .iter()
            .map(|_| Track {
                damper: Damper::new(cfg.fail_after, cfg.recover_after),
                last: None,
            })
            .collect();
        Ok(Some(Self {
            targets: targets.into(),
            tracks: Arc::new(Mutex::new(tracks)),
            timeout: cfg.timeout,
            slow_after: cfg.slow_after,
            fail_after: cfg.fail_after.max(1),
            password_file: (!cfg.password_file.trim().is_empty())
                .then(|| PathBuf::from(cfg.password_file.trim())),
        }))
    }

    /// One round trip per database (concurrently), fed through the damping.
    pub async fn check(&mut self) -> DatabaseReport {
        let file = self.read_password_file();
        let env = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty());
        let mut secrets: Vec<String> = self
            .targets
            .iter()
            .flat_map(|t| t.url_secrets.iter().cloned())
            .collect();
        secrets.extend(env.iter().cloned());
        if let Ok(Some(p)) = &file {
            secrets.push(p.clone());
        }
        let rounds = self.targets.iter().map(|t| {
            let password = match (&t.password, t.kind, &env, &file) {
                // The MySQL check does not log in.
                (_, DbKind::Mysql, _, _) => Ok(None),
                (Some(p), _, _, _) => Ok(Some(p.clone())),
                (None, DbKind::Postgres, Some(p), _) => Ok(Some(p.clone())),
                (None, _, _, Ok(p)) => Ok(p.clone()),
                (None, _, _, Err(e)) => Err(e.clone()),
            };
            let (timeout, secrets) = (self.timeout, &secrets);
            async move {
                let result = match password {
                    Ok(p) => round_trip(t, p.as_deref(), timeout).await,
                    // An unreadable password file is ours to fix, not the database's outage.
                    Err(e) => Err(Failure::Refused(e)),
                };
                Outcome {
                    result: result.map_err(|e| e.map(|m| sanitize(m, secrets))),
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
                        at: now,
                    })
                    .collect(),
            )
        }
    }

    fn record(&self, outcomes: Vec<Outcome>) -> DatabaseReport {
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        for (track, outcome) in tracks.iter_mut().zip(outcomes) {
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
                    name: t.name.clone(),
                    kind: t.kind,
                    state: tr.damper.state(),
                    latency_ms: good.map(|g| round1(g.latency.as_secs_f64() * 1000.0)),
                    error: last
                        .and_then(|o| o.result.as_ref().err())
                        .map(|f| f.message().to_string()),
                    detail: good.and_then(|g| g.detail.clone()),
                    consecutive_failures: tr.damper.consecutive_failures(),
                    last_checked: last.map(|o| crate::snapshot::rfc3339(o.at)),
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
            DbState::Misconfigured => Some(format!(
                "{} refused the check (fix the configuration): {error}",
                d.name
            )),
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

    /// The first line of `database.password_file`, trimmed; `None` when unset or blank.
    fn read_password_file(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read database.password_file {}: {e}", path.display()))?;
        Ok(text
            .lines()
            .next()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string))
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

async fn round_trip(
    t: &Target,
    password: Option<&str>,
    timeout: Duration,
) -> Result<Good, Failure> {
    match t.kind {
        DbKind::Postgres => postgres(t, password, timeout).await,
        DbKind::Redis => redis(t, password, timeout).await,
        DbKind::Mysql => Ok(mysql(t, timeout).await?),
    }
}

fn no_answer(what: &str, timeout: Duration) -> String {
    format!(
        "{what}: no answer within {}",
        humantime::format_duration(timeout)
    )
}

async fn postgres(t: &Target, password: Option<&str>, timeout: Duration) -> Result<Good, Failure> {
    let mut cfg = tokio_postgres::Config::from_str(&t.url)
        .map_err(|e| format!("invalid URL: {}", error_chain(&e)))?;
    if cfg.get_password().is_none() {
        if let Some(p) = password {
            cfg.password(p);
        }
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("health-agent");
    }
    cfg.connect_timeout(timeout);
    let start = Instant::now();
    let (client, connection) = tokio::time::timeout(timeout, cfg.connect(tokio_postgres::NoTls))
        .await
        .map_err(|_| no_answer("connect", timeout))?
        .map_err(|e| {
            let message = format!("connect: {}", error_chain(&e));
            if refused_by_postgres(&e) {
                Failure::Refused(message)
            } else {
                Failure::Outage(message)
            }
        })?;
    let connected = start.elapsed();
    let mut driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let query = tokio::time::timeout(timeout, client.simple_query("SELECT 1")).await;
    let latency = start.elapsed();
    drop(client);
    // Give the connection a moment to send Terminate, so the server logs no unexpected EOF.
    if tokio::time::timeout(Duration::from_millis(500), &mut driver)
        .await
        .is_err()
    {
        driver.abort();
    }
    let messages = query
        .map_err(|_| no_answer("SELECT 1", timeout))?
        .map_err(|e| format!("SELECT 1: {}", error_chain(&e)))?;
    let one = messages.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("1"),
        _ => false,
    });
    if !one {
        return Err(Failure::Outage("SELECT 1 did not return 1".into()));
    }
    Ok(Good {
        latency,
        detail: Some(format!(
            "connect {}, SELECT 1 {}",
            ms(connected),
            ms(latency.saturating_sub(connected))
        )),
    })
}

/// The server answered and refused us: wrong credentials, unknown role or database.
fn refused_by_postgres(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(c)
    })
}

async fn connect_tcp(t: &Target, timeout: Duration) -> Result<TcpStream, String> {
    tokio::time::timeout(timeout, TcpStream::connect((t.host.as_str(), t.port)))
        .await
        .map_err(|_| no_answer("connect", timeout))?
        .map_err(|e| format!("connect: {e}"))
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

/// Sends one command and reads its one-line reply.
async fn resp_call(
    conn: &mut BufReader<TcpStream>,
    args: &[&str],
    shown: &str,
) -> Result<String, String> {
    conn.get_mut()
        .write_all(&resp_command(args))
        .await
        .map_err(|e| format!("{shown}: {e}"))?;
    let mut line = Vec::new();
    (&mut *conn)
        .take(RESP_LINE_MAX)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("{shown}: {e}"))?;
    parse_resp_line(&line).map_err(|e| format!("{shown}: {e}"))
}

/// A reply line longer than this is not one of the few we expect.
pub(crate) const RESP_LINE_MAX: u64 = 512;

/// One reply line as read (up to and including its `\n`, at most [`RESP_LINE_MAX`] bytes): the
/// text without the line end (`+OK`, `-NOAUTH ...`), or why there is none.
pub(crate) fn parse_resp_line(line: &[u8]) -> Result<String, String> {
    if line.is_empty() {
        return Err("connection closed by the server".into());
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

async fn redis(t: &Target, password: Option<&str>, timeout: Duration) -> Result<Good, Failure> {
    let start = Instant::now();
    let stream = connect_tcp(t, timeout).await?;
    let mut conn = BufReader::new(stream);
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
        .map_err(|_| no_answer("PING", timeout))??;
    Ok(Good {
        latency: start.elapsed(),
        detail: None,
    })
}

async fn mysql(t: &Target, timeout: Duration) -> Result<Good, String> {
    let start = Instant::now();
    let mut stream = connect_tcp(t, timeout).await?;
    let read = async {
        let mut header = [0u8; 4];
        stream
            .read_exact(&mut header)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let len = mysql_packet_len(header)?;
        let mut payload = vec![0u8; len];
        stream
            .read_exact(&mut payload)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        Ok::<_, String>(payload)
    };
    let payload = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| no_answer("handshake", timeout))??;
    let latency = start.elapsed();
    let version = parse_mysql_greeting(&payload)?;
    Ok(Good {
        latency,
        detail: Some(format!(
            "server version {version} (handshake only, not authenticated)"
        )),
    })
}

/// The payload length a packet header announces, if it is one a greeting can have.
fn mysql_packet_len(header: [u8; 4]) -> Result<usize, String> {
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    if !(1..=64 * 1024).contains(&len) {
        return Err(format!("handshake: implausible packet length {len}"));
    }
    Ok(len)
}

/// [`mysql`]'s reading of the first packet, on bytes in memory: header, payload, greeting.
/// For the fuzz targets; bytes past the packet are left alone, as the check leaves them unread.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn parse_mysql_packet(bytes: &[u8]) -> Result<String, String> {
    let header = bytes
        .first_chunk::<4>()
        .ok_or("handshake: packet header cut short")?;
    let len = mysql_packet_len(*header)?;
    let payload = bytes.get(4..4 + len).ok_or("handshake: packet cut short")?;
    parse_mysql_greeting(payload)
}

/// The server version from an initial handshake packet's payload, or the server's error.
fn parse_mysql_greeting(payload: &[u8]) -> Result<String, String> {
    match payload.first() {
        Some(10) => {
            let rest = &payload[1..];
            let end = rest
                .iter()
                .position(|b| *b == 0)
                .ok_or("handshake: server version is not terminated")?;
            Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
        }
        Some(0xff) if payload.len() >= 3 => {
            let code = u16::from_le_bytes([payload[1], payload[2]]);
            let mut msg = &payload[3..];
            // 4.1 error packets carry '#' and a five-character SQL state before the message.
            if msg.first() == Some(&b'#') && msg.len() >= 6 {
                msg = &msg[6..];
            }
            Err(format!(
                "server refused the connection: error {code}: {}",
                String::from_utf8_lossy(msg)
            ))
        }
        Some(v) => Err(format!(
            "handshake: protocol version {v}, expected 10 (not a MySQL/MariaDB server?)"
        )),
        None => Err("handshake: empty packet".into()),
    }
}

/// In-test servers shared by this module's tests and the runner's.
#[cfg(test)]
pub(crate) mod test_support {
    use std::{
        net::SocketAddr,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use tokio::{
        io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
        net::{TcpListener, TcpStream},
    };

    pub(crate) type Commands = Arc<Mutex<Vec<Vec<String>>>>;

    pub(crate) async fn read_command(r: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            line.clear();
            r.read_line(&mut line).await.ok()?;
            let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
            let mut buf = vec![0; len + 2];
            r.read_exact(&mut buf).await.ok()?;
            buf.truncate(len);
            args.push(String::from_utf8(buf).ok()?);
        }
        Some(args)
    }

    /// A RESP server on loopback: answers each command with `reply(args)` after `delay`, and
    /// records what it was sent.
    pub(crate) async fn fake_redis(
        reply: impl Fn(&[String]) -> String + Send + Sync + 'static,
        delay: Duration,
    ) -> (SocketAddr, Commands) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("local addr");
        let seen: Commands = Arc::default();
        let (reply, log) = (Arc::new(reply), seen.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (reply, log) = (reply.clone(), log.clone());
                tokio::spawn(async move {
                    let mut r = BufReader::new(s);
                    while let Some(cmd) = read_command(&mut r).await {
                        let answer = reply(&cmd);
                        log.lock().unwrap().push(cmd);
                        tokio::time::sleep(delay).await;
                        if r.get_mut().write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    pub(crate) fn redis_ok(cmd: &[String]) -> String {
        match cmd.first().map(String::as_str) {
            Some("PING") => "+PONG\r\n".into(),
            Some("AUTH" | "SELECT") => "+OK\r\n".into(),
            _ => "-ERR unknown command\r\n".into(),
        }
    }

    /// A port nothing listens on (bound, then released).
    pub(crate) fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("local addr").port()
    }
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, sync::OnceLock};

    use tokio::net::TcpListener;

    use super::{test_support::*, *};

    #[test]
    fn a_refusal_is_reported_at_once_and_an_outage_is_damped() {
        let mut d = Damper::new(3, 1);
        assert_eq!(d.observe(RoundTrip::Fast), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Refused), DbState::Misconfigured);
        assert_eq!(d.observe(RoundTrip::Fast), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Unreachable);
    }

    fn cfg(urls: &[&str]) -> DatabaseConfig {
        DatabaseConfig {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            fail_after: 1,
            recover_after: 1,
            // Only the slow test wants "slow"; a busy CI machine must not make the others so.
            slow_after: Duration::from_secs(30),
            ..DatabaseConfig::default()
        }
    }

    fn monitor(c: &DatabaseConfig) -> DatabaseMonitor {
        DatabaseMonitor::new(c)
            .expect("valid database config")
            .expect("a database is configured")
    }

    /// Fails if any secret shows in the report (names, errors, reasons: all of its JSON).
    fn assert_no_secret(r: &DatabaseReport, secrets: &[&str]) {
        let json = serde_json::to_string(r).expect("report serialises");
        for s in secrets {
            assert!(!json.contains(s), "secret {s:?} leaked into {json}");
        }
    }

    // --- redaction and parsing --------------------------------------------------------------

    #[test]
    fn redact_url_removes_every_password_form() {
        let cases = [
            (
                "postgres://user:pw@127.0.0.1:5432/db",
                "postgres://user@127.0.0.1:5432/db",
            ),
            ("redis://:pw@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis://default:pw@127.0.0.1:6379",
                "redis://default@127.0.0.1:6379",
            ),
            ("postgres://user:p%40ss@host/db", "postgres://user@host/db"),
            // Unencoded delimiters in a password must not end the userinfo early.
            (
                "postgres://user:pa/ss?x#y@host/db",
                "postgres://user@host/db",
            ),
            (
                "postgres://host/db?sslmode=disable&password=pw&user=u",
                "postgres://host/db?sslmode=disable&user=u",
            ),
            ("postgres://host/db?PASSWORD=pw", "postgres://host/db"),
            ("postgres://u:@host/db", "postgres://u@host/db"),
            ("mysql://127.0.0.1:3306", "mysql://127.0.0.1:3306"),
            ("postgres://user@host", "postgres://user@host"),
            ("host=db password=pw", "<not a URL>"),
            ("", "<not a URL>"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "redact_url({url:?})");
        }
    }

    #[test]
    fn redact_urls_in_text() {
        assert_eq!(
            redact_urls_in(
                "3 | urll = \"postgres://u:p,w]@h/db\", 'redis://:x@c:1/2' (mysql://m:3306) :// end"
            ),
            "3 | urll = \"postgres://u@h/db\", 'redis://c:1/2' (mysql://m:3306) :// end"
        );
        assert_eq!(redact_urls_in("no urls"), "no urls");
    }

    #[test]
    fn sanitize_replaces_raw_and_nested_secrets() {
        let s = sanitize(
            "auth failed for abc123 (abc) and abc123x",
            &["abc".into(), "abc123".into(), String::new()],
        );
        assert_eq!(s, "auth failed for *** (***) and ***x");
    }

    #[test]
    fn urls_parse_into_kind_host_port_and_secrets() {
        let t = Target::parse("postgresql://hc:p%40ss@127.0.0.1/app").unwrap();
        assert_eq!(
            (t.kind, t.host.as_str(), t.port),
            (DbKind::Postgres, "127.0.0.1", 5432)
        );
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.name, "postgresql://hc@127.0.0.1/app");
        assert!(t.url_secrets.contains(&"p%40ss".to_string()));
        let t = Target::parse("redis://:pw@[::1]:6380/2").unwrap();
        assert_eq!(
            (t.kind, t.host.as_str(), t.port, t.redis_db),
            (DbKind::Redis, "::1", 6380, Some(2))
        );
        assert_eq!(
            (t.user.as_deref(), t.password.as_deref()),
            (None, Some("pw"))
        );
        let t = Target::parse("redis://acl-user:pw@cache").unwrap();
        assert_eq!((t.port, t.user.as_deref()), (6379, Some("acl-user")));
        let t = Target::parse("MYSQL://db.internal").unwrap();
        assert_eq!((t.kind, t.port), (DbKind::Mysql, 3306));
        let t = Target::parse("postgres://u@127.0.0.1:6432/db?sslmode=prefer&password=qp").unwrap();
        assert_eq!((t.port, t.password.as_deref()), (6432, Some("qp")));
        assert_eq!(t.name, "postgres://u@127.0.0.1:6432/db?sslmode=prefer");
        assert!(format!("{t:?}").contains("postgres://u@127.0.0.1:6432/db"));
        assert!(!format!("{t:?}").contains("qp"));
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_the_password() {
        let cases = [
            ("http://u:Sekr1t@host", "unsupported scheme"),
            ("rediss://:Sekr1t@host", "TLS"),
            (
                "postgres://u:Sekr1t@host/db?sslmode=require",
                "sslmode=require",
            ),
            ("postgres://u:Sekr1t@host/db?sslmode=verify-full", "TLS"),
            ("redis://:Sekr1t@host:notaport", "invalid port"),
            ("postgres://u:Sekr1t@host:99999/db", "invalid port"),
            ("redis://:Sekr1t@host/abc", "database number"),
            ("redis://:Sekr1t@/0", "names no host"),
            ("mysql://u:Sekr1t@", "names no host"),
            ("postgres://a@b:Sekr1t@host/db", "more than one '@'"),
            (
                "postgres://u:Sekr1t@host/db?bogus_option=1",
                "not a valid Postgres URL",
            ),
            ("u:Sekr1t@host", "expected a URL"),
            ("postgres://:Sekr1t@host/db", "names no user"),
        ];
        for (url, want) in cases {
            let err = validate_url(url).expect_err(url);
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("Sekr1t"), "{url}: password leaked: {err}");
        }
    }

    #[test]
    fn monitor_new_names_the_key_and_skips_blank_urls() {
        assert!(DatabaseMonitor::new(&DatabaseConfig::default())
            .unwrap()
            .is_none());
        let c = DatabaseConfig {
            url: "redis://127.0.0.1:6379".into(),
            urls: vec![
                "redis://127.0.0.1:6379".into(),
                "mysql://:Sekr1t@h:x".into(),
            ],
            ..DatabaseConfig::default()
        };
        let err = DatabaseMonitor::new(&c).unwrap_err();
        assert!(err.starts_with("database.urls[1]: "), "{err}");
        assert!(!err.contains("Sekr1t"), "{err}");
        let c = DatabaseConfig {
            url: "  ".into(),
            urls: vec!["redis://h".into(), "redis://h".into()],
            ..DatabaseConfig::default()
        };
        let m = monitor(&c);
        let r = m.report();
        assert_eq!(r.databases.len(), 1, "duplicates are checked once");
        assert_eq!(r.state, DbState::Unknown, "nothing checked yet");
        assert_eq!(r.databases[0].last_checked, None);
    }

    // --- damping ----------------------------------------------------------------------------

    #[test]
    fn damping_table() {
        use DbState::{Connected as C, Slow as S, Unknown as U, Unreachable as X};
        use RoundTrip::{Failed as F, Fast as G, Slow as Sl};
        /// (what, fail_after, recover_after, round trips, damped state after each)
        type Row = (
            &'static str,
            u32,
            u32,
            &'static [RoundTrip],
            &'static [DbState],
        );
        #[rustfmt::skip]
        let table: &[Row] = &[
            ("one failure is not decisive", 2, 1, &[F], &[U]),
            ("fail_after failures are", 2, 1, &[F, F], &[U, X]),
            ("a success resets the count", 2, 1, &[G, F, G, F, F], &[C, C, C, C, X]),
            ("recover at once by default", 2, 1, &[F, F, G], &[U, X, C]),
            ("recover_after successes", 1, 3, &[F, G, G, G], &[X, X, X, C]),
            ("a failure restarts recovery", 1, 2, &[F, G, F, G, G], &[X, X, X, X, C]),
            ("slow is reported", 2, 1, &[Sl, G, Sl], &[S, C, S]),
            ("slow counts toward recovery", 1, 2, &[F, Sl, Sl, G], &[X, X, S, C]),
            ("slow then failures", 3, 1, &[Sl, F, F, F], &[S, S, S, X]),
            ("fail_after 1 is immediate", 1, 1, &[G, F, G], &[C, X, C]),
        ];
        for (name, fail_after, recover_after, rounds, want) in table {
            let mut d = Damper::new(*fail_after, *recover_after);
            assert_eq!(d.state(), U, "{name}: starts unknown");
            let got: Vec<DbState> = rounds.iter().map(|r| d.observe(*r)).collect();
            assert_eq!(&got, want, "{name}");
        }
        let mut d = Damper::new(3, 1);
        let counts: Vec<u32> = [F, F, G, F]
            .iter()
            .map(|r| {
                d.observe(*r);
                d.consecutive_failures()
            })
            .collect();
        assert_eq!(counts, [1, 2, 0, 1]);
    }

    #[test]
    fn worst_database_decides_and_reason_names_it() {
        let m = monitor(&DatabaseConfig {
            slow_after: Duration::from_secs(1),
            ..cfg(&["redis://:Sekr1t@127.0.0.1:1", "mysql://127.0.0.1:2"])
        });
        let good = |ms| Outcome {
            result: Ok(Good {
                latency: Duration::from_millis(ms),
                detail: None,
            }),
            at: SystemTime::now(),
        };
        let r = m.record(vec![good(3), good(2)]);
        assert_eq!((r.state, r.reason.as_deref()), (DbState::Connected, None));
        assert_eq!(r.databases[0].latency_ms, Some(3.0));
        let r = m.record(vec![good(3), good(1500)]);
        assert_eq!(r.state, DbState::Slow);
        assert!(r
            .reason
            .as_deref()
            .unwrap()
            .starts_with("mysql://127.0.0.1:2 slow"));
        let failed = Outcome {
            result: Err(Failure::Outage("connect: refused".into())),
            at: SystemTime::now(),
        };
        let r = m.record(vec![failed, good(1500)]);
        assert_eq!(r.state, DbState::Unreachable);
        assert_eq!(r.databases[0].state, DbState::Unreachable);
        assert_eq!(r.databases[0].latency_ms, None);
        assert_eq!(r.databases[0].consecutive_failures, 1);
        assert!(r.databases[0].last_checked.is_some());
        let reason = r.reason.clone().unwrap();
        assert!(
            reason.contains("redis://127.0.0.1:1 unreachable: connect: refused"),
            "{reason}"
        );
        assert_no_secret(&r, &["Sekr1t"]);
        assert_eq!(r.summary(), "unreachable");
    }

    #[test]
    fn runner_timeout_goes_through_the_same_damping() {
        let m = monitor(&DatabaseConfig {
            fail_after: 2,
            ..cfg(&["redis://127.0.0.1:1"])
        });
        let overrun = m.on_timeout();
        let r = overrun();
        assert_eq!(r.state, DbState::Unknown);
        assert_eq!(r.databases[0].consecutive_failures, 1);
        assert!(r.databases[0].error.as_deref().unwrap().contains("overran"));
        assert_eq!(overrun().state, DbState::Unreachable);
        assert_eq!(m.report().state, DbState::Unreachable, "state is shared");
    }

    // --- Postgres, against the real server ---------------------------------------------------

    const PG: &str = "127.0.0.1:5432";
    const PG_ROLE: &str = "healthcheck";
    const PG_PASSWORD: &str = "hc-secret";

    /// Panics unless PostgreSQL answers on 127.0.0.1:5432, and (as root, through `runuser`)
    /// makes sure the test role exists with its password. Returns a note for assertion messages.
    fn postgres_ready() -> &'static str {
        static NOTE: OnceLock<String> = OnceLock::new();
        NOTE.get_or_init(|| {
            let addr: SocketAddr = PG.parse().expect("literal address");
            if let Err(e) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                panic!(
                    "PostgreSQL is not reachable on {PG} ({e}). These tests need the real server: \
                     start it with `cargo xtask services` or `pg_ctlcluster 15 main start`."
                );
            }
            let sql = format!(
                "DO $$ BEGIN \
                   IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_ROLE}') THEN \
                     CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}'; \
                   ELSE ALTER ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}'; \
                   END IF; END $$;"
            );
            let out = std::process::Command::new("runuser")
                .args([
                    "-u",
                    "postgres",
                    "--",
                    "psql",
                    "-qX",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-c",
                ])
                .arg(&sql)
                .current_dir("/")
                .output();
            match out {
                Ok(o) if o.status.success() => String::new(),
                Ok(o) => format!(
                    "(could not provision role {PG_ROLE}: {}; as the postgres superuser run: \
                     CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}')",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => format!(
                    "(could not run runuser to provision role {PG_ROLE}: {e}; as the postgres \
                     superuser run: CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}')"
                ),
            }
        })
    }

    /// `PGPASSWORD` is process-global: tests that read or set it hold this lock.
    static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Sets (or removes) an environment variable and puts the old value back on drop.
    struct EnvVar(&'static str, Option<String>);

    impl EnvVar {
        fn set(key: &'static str, value: Option<&str>) -> Self {
            let old = std::env::var(key).ok();
            match value {
                Some(v) => std::env::set_var(key, v),
                None => std::env::remove_var(key),
            }
            Self(key, old)
        }
    }

    impl Drop for EnvVar {
        fn drop(&mut self) {
            match &self.1 {
                Some(v) => std::env::set_var(self.0, v),
                None => std::env::remove_var(self.0),
            }
        }
    }

    fn pg_url(password: Option<&str>) -> String {
        match password {
            Some(p) => format!("postgres://{PG_ROLE}:{p}@{PG}/postgres"),
            None => format!("postgres://{PG_ROLE}@{PG}/postgres"),
        }
    }

    #[tokio::test]
    async fn postgres_connected_with_password_in_url() {
        let note = postgres_ready();
        let mut m = monitor(&cfg(&[&pg_url(Some(PG_PASSWORD))]));
        let r = m.check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?} {note}");
        let db = &r.databases[0];
        assert_eq!(db.name, format!("postgres://{PG_ROLE}@{PG}/postgres"));
        assert_eq!(db.kind, DbKind::Postgres);
        assert!(db.latency_ms.is_some_and(|l| l > 0.0), "{db:?}");
        assert!(db.detail.as_deref().unwrap().contains("SELECT 1"), "{db:?}");
        assert!(db.last_checked.as_deref().unwrap().contains('T'), "{db:?}");
        assert_no_secret(&r, &[PG_PASSWORD]);
        assert!(!format!("{m:?}").contains(PG_PASSWORD));
    }

    #[tokio::test]
    async fn postgres_wrong_password_is_a_configuration_error_with_a_sanitized_error() {
        let note = postgres_ready();
        let wrong = "wrong-Secret-42";
        let mut m = monitor(&cfg(&[&pg_url(Some(wrong))]));
        // The server answered and refused: a configuration error, not an outage.
        let r = m.check().await;
        assert_eq!(r.state, DbState::Misconfigured, "{r:?} {note}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("password authentication failed"), "{err}");
        assert_no_secret(&r, &[wrong, PG_PASSWORD]);
    }

    #[tokio::test]
    async fn postgres_password_from_pgpassword() {
        let note = postgres_ready();
        let _env = ENV_LOCK.lock().await;
        let mut m = monitor(&cfg(&[&pg_url(None)]));
        {
            let _pw = EnvVar::set("PGPASSWORD", Some(PG_PASSWORD));
            let r = m.check().await;
            assert_eq!(r.state, DbState::Connected, "{r:?} {note}");
            assert_no_secret(&r, &[PG_PASSWORD]);
        }
        let wrong = "wrong-env-Secret";
        let _pw = EnvVar::set("PGPASSWORD", Some(wrong));
        let r = m.check().await;
        assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
        assert!(r
            .reason
            .as_deref()
            .unwrap()
            .contains("password authentication failed"));
        assert_no_secret(&r, &[wrong]);
        // A password in the URL wins over the environment.
        let r = monitor(&cfg(&[&pg_url(Some(PG_PASSWORD))])).check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
    }

    #[tokio::test]
    async fn postgres_password_from_file() {
        let note = postgres_ready();
        let _env = ENV_LOCK.lock().await;
        let _pw = EnvVar::set("PGPASSWORD", None);
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("db-password");
        std::fs::write(&file, format!("  {PG_PASSWORD}  \nnot-this-line\n")).unwrap();
        let c = DatabaseConfig {
            password_file: file.display().to_string(),
            ..cfg(&[&pg_url(None)])
        };
        let mut m = monitor(&c);
        let r = m.check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?} {note}");
        assert_no_secret(&r, &[PG_PASSWORD]);
        // Read on every round: a rotated (here wrong) password shows at once, redacted.
        let wrong = "wrong-file-Secret";
        std::fs::write(&file, format!("{wrong}\n")).unwrap();
        let r = m.check().await;
        assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
        assert_no_secret(&r, &[wrong]);
        std::fs::remove_file(&file).unwrap();
        let r = m.check().await;
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("cannot read database.password_file"), "{err}");
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_after_fail_after_rounds_not_before() {
        let port = free_port();
        let mut m = monitor(&DatabaseConfig {
            fail_after: 3,
            ..cfg(&[&format!("postgres://{PG_ROLE}@127.0.0.1:{port}/postgres")])
        });
        for round in 1..=2 {
            let r = m.check().await;
            assert_eq!(r.state, DbState::Unknown, "round {round}: {r:?}");
            assert_eq!(r.databases[0].consecutive_failures, round);
            let reason = r.reason.unwrap();
            assert!(
                reason.contains(&format!("{round} of 3 failed round trips")),
                "{reason}"
            );
        }
        let r = m.check().await;
        assert_eq!(r.state, DbState::Unreachable, "{r:?}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("connect"), "{err}");
    }

    /// Accepts connections and never says a word.
    async fn silent_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("local addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        addr
    }

    #[tokio::test]
    async fn silent_server_fails_within_the_timeout() {
        let addr = silent_server().await;
        let timeout = Duration::from_millis(400);
        for url in [
            format!("postgres://{PG_ROLE}:x@{addr}/postgres"),
            format!("redis://{addr}"),
            format!("mysql://{addr}"),
        ] {
            let mut m = monitor(&DatabaseConfig {
                timeout,
                ..cfg(&[&url])
            });
            let start = Instant::now();
            let r = m.check().await;
            let took = start.elapsed();
            assert_eq!(r.state, DbState::Unreachable, "{url}: {r:?}");
            let err = r.databases[0].error.clone().unwrap();
            assert!(err.contains("no answer within 400ms"), "{url}: {err}");
            assert!(
                took >= timeout && took < timeout + Duration::from_secs(1),
                "{url}: took {took:?}"
            );
        }
    }

    // --- Redis, against an in-test RESP server -----------------------------------------------

    #[tokio::test]
    async fn redis_ping_gets_pong() {
        let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
        let r = monitor(&cfg(&[&format!("redis://{addr}")])).check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
        assert_eq!(r.databases[0].kind, DbKind::Redis);
        assert_eq!(*seen.lock().unwrap(), vec![vec!["PING".to_string()]]);
    }

    #[tokio::test]
    async fn redis_auth_and_select_come_before_ping() {
        let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
        let r = monitor(&cfg(&[&format!("redis://:s3cr%3At@{addr}/2")]))
            .check()
            .await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
        assert_eq!(r.databases[0].name, format!("redis://{addr}/2"));
        let want: Vec<Vec<String>> = [&["AUTH", "s3cr:t"][..], &["SELECT", "2"], &["PING"]]
            .iter()
            .map(|c| c.iter().map(|s| s.to_string()).collect())
            .collect();
        assert_eq!(*seen.lock().unwrap(), want);
        assert_no_secret(&r, &["s3cr:t", "s3cr%3At"]);
    }

    #[tokio::test]
    async fn redis_password_file_and_acl_user() {
        let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let r = monitor(&DatabaseConfig {
            password_file: file.display().to_string(),
            ..cfg(&[&format!("redis://app@{addr}")])
        })
        .check()
        .await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
        assert_eq!(seen.lock().unwrap()[0], ["AUTH", "app", "from-file"]);
    }

    #[tokio::test]
    async fn redis_noauth_is_a_configuration_error() {
        let (addr, _) = fake_redis(
            |_| "-NOAUTH Authentication required.\r\n".into(),
            Duration::ZERO,
        )
        .await;
        let r = monitor(&cfg(&[&format!("redis://{addr}")])).check().await;
        assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("-NOAUTH Authentication required."), "{err}");
    }

    #[tokio::test]
    async fn a_password_echoed_by_the_server_is_sanitized() {
        let (addr, _) = fake_redis(
            |cmd| format!("-WRONGPASS invalid password {:?}\r\n", cmd.last().unwrap()),
            Duration::ZERO,
        )
        .await;
        let r = monitor(&cfg(&[&format!("redis://:Echo%2FMe@{addr}")]))
            .check()
            .await;
        assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.starts_with("AUTH refused: -WRONGPASS"), "{err}");
        assert!(err.contains("***"), "{err}");
        assert_no_secret(&r, &["Echo/Me", "Echo%2FMe"]);
    }

    #[tokio::test]
    async fn slow_pong_is_slow_and_flapping_is_damped() {
        let (addr, _) = fake_redis(redis_ok, Duration::from_millis(150)).await;
        let r = monitor(&DatabaseConfig {
            slow_after: Duration::from_millis(100),
            ..cfg(&[&format!("redis://{addr}")])
        })
        .check()
        .await;
        assert_eq!(r.state, DbState::Slow, "{r:?}");
        assert!(r.databases[0].latency_ms.unwrap() >= 150.0, "{r:?}");

        // A server that fails while `failing` is set.
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = failing.clone();
        let (addr, _) = fake_redis(
            move |_| {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    "-LOADING Redis is loading the dataset in memory\r\n".into()
                } else {
                    "+PONG\r\n".into()
                }
            },
            Duration::ZERO,
        )
        .await;
        let mut m = monitor(&DatabaseConfig {
            fail_after: 2,
            recover_after: 2,
            ..cfg(&[&format!("redis://{addr}")])
        });
        let mut states = Vec::new();
        for fail in [false, true, false, true, true, false, false] {
            failing.store(fail, std::sync::atomic::Ordering::SeqCst);
            states.push(m.check().await.state);
        }
        use DbState::{Connected as C, Unreachable as X};
        assert_eq!(states, [C, C, C, C, X, X, C]);
    }

    // --- MySQL, against an in-test greeting -------------------------------------------------

    fn v10_greeting(version: &str) -> Vec<u8> {
        let mut p = vec![10u8];
        p.extend_from_slice(version.as_bytes());
        p.push(0);
        p.extend_from_slice(&7u32.to_le_bytes()); // connection id
        p.extend_from_slice(b"abcdefgh"); // auth-plugin-data part 1
        p.push(0); // filler
        p.extend_from_slice(&0xf7ffu16.to_le_bytes()); // capability flags (lower)
        p.push(0xff); // character set
        p.extend_from_slice(&2u16.to_le_bytes()); // status flags
        p.extend_from_slice(&0x81ffu16.to_le_bytes()); // capability flags (upper)
        p.push(21); // auth-plugin-data length
        p.extend_from_slice(&[0; 10]); // reserved
        p.extend_from_slice(b"ijklmnopqrst\0"); // auth-plugin-data part 2
        p.extend_from_slice(b"caching_sha2_password\0");
        packet(&p)
    }

    fn packet(payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_le_bytes()[..3].to_vec();
        out.push(0); // sequence id
        out.extend_from_slice(payload);
        out
    }

    /// Sends `bytes` to every connection, then holds it open until the client hangs up.
    async fn fake_mysql(bytes: Vec<u8>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("local addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let bytes = bytes.clone();
                tokio::spawn(async move {
                    if s.write_all(&bytes).await.is_ok() {
                        let mut sink = [0u8; 64];
                        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn mysql_greeting_reports_the_server_version() {
        let addr = fake_mysql(v10_greeting("8.0.36-fake")).await;
        let r = monitor(&cfg(&[&format!("mysql://monitor:Sekr1t@{addr}")]))
            .check()
            .await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
        let detail = r.databases[0].detail.clone().unwrap();
        assert!(detail.contains("server version 8.0.36-fake"), "{detail}");
        assert!(detail.contains("not authenticated"), "{detail}");
        assert_no_secret(&r, &["Sekr1t"]);
    }

    #[tokio::test]
    async fn mysql_error_packet_and_garbage_are_failures() {
        let mut err = vec![0xffu8];
        err.extend_from_slice(&1040u16.to_le_bytes());
        err.extend_from_slice(b"#08004Too many connections");
        let addr = fake_mysql(packet(&err)).await;
        let r = monitor(&cfg(&[&format!("mysql://{addr}")])).check().await;
        assert_eq!(r.state, DbState::Unreachable, "{r:?}");
        let e = r.databases[0].error.clone().unwrap();
        assert!(e.contains("error 1040: Too many connections"), "{e}");

        let addr = fake_mysql(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()).await;
        let r = monitor(&cfg(&[&format!("mysql://{addr}")])).check().await;
        assert_eq!(r.state, DbState::Unreachable, "{r:?}");
        let e = r.databases[0].error.clone().unwrap();
        assert!(e.contains("implausible packet length"), "{e}");

        assert!(parse_mysql_greeting(&[9, b'x', 0])
            .unwrap_err()
            .contains("protocol version 9"));
        assert!(parse_mysql_greeting(&[10, b'x'])
            .unwrap_err()
            .contains("not terminated"));
    }

    #[tokio::test]
    async fn several_databases_are_all_checked_and_the_worst_wins() {
        let note = postgres_ready();
        let (redis, _) = fake_redis(redis_ok, Duration::ZERO).await;
        let mysql = fake_mysql(v10_greeting("10.11.6-MariaDB")).await;
        let c = DatabaseConfig {
            url: pg_url(Some(PG_PASSWORD)),
            ..cfg(&[&format!("redis://{redis}"), &format!("mysql://{mysql}")])
        };
        let r = monitor(&c).check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?} {note}");
        let kinds: Vec<DbKind> = r.databases.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, [DbKind::Postgres, DbKind::Redis, DbKind::Mysql]);

        let down = free_port();
        let c = DatabaseConfig {
            urls: vec![
                format!("redis://{redis}"),
                format!("redis://127.0.0.1:{down}"),
            ],
            ..c
        };
        let r = monitor(&c).check().await;
        assert_eq!(r.state, DbState::Unreachable, "{r:?}");
        let states: Vec<DbState> = r.databases.iter().map(|d| d.state).collect();
        assert_eq!(
            states,
            [DbState::Connected, DbState::Connected, DbState::Unreachable]
        );
        assert_no_secret(&r, &[PG_PASSWORD]);
    }
}
