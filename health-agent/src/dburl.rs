//! Database URLs: parsing them into their parts, checking them, and keeping their passwords out
//! of everything shown. A leaf: `config` validates and redacts through it, the database check
//! connects through it, and it imports neither.
//!
//! Accepted forms: `postgres://` / `postgresql://` (anything `tokio_postgres::Config` takes,
//! several hosts and `?host=` included), `redis://[user:password@]host[:port][/db]`, its TLS
//! twin `rediss://`, and `mysql://[user:password@]host[:port]`. Postgres URLs are read by
//! `tokio_postgres::Config`, which is what later connects; the authority of the others (and of a
//! single-host Postgres URL, for the same port and host errors) by the `url` crate. The userinfo
//! is split by hand, as tokio-postgres does: at the one '@', then at the first ':', so a password
//! may hold an unencoded '/', '?' or '#'.
//!
//! TLS options, with libpq's names and meaning, are read here into [`TlsOptions`]: `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`. tokio-postgres knows only some of them, so they are taken
//! out of the URL it reads; the check does the TLS itself (`checks::database::tls`).

use std::{fmt, path::PathBuf, str::FromStr};

use percent_encoding::percent_decode_str;
use serde::Serialize;

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

/// libpq's `sslmode`, the words `rediss://` takes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// In the clear.
    Disable,
    /// TLS when the server offers it, without a certificate check; else in the clear.
    Prefer,
    /// TLS or nothing; no certificate check (libpq: a chain check once `sslrootcert` is given).
    Require,
    /// TLS, the certificate chained to a trusted CA; any host name.
    VerifyCa,
    /// TLS, the chain and the host name.
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The system's store (`/etc/ssl/certs/…`): no `sslrootcert`, or `sslrootcert=system`.
    System,
    /// A PEM bundle (`sslrootcert=/path`), e.g. the provider's CA.
    File(PathBuf),
}

impl fmt::Display for RootCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::System => f.write_str("the system's CA store"),
            Self::File(p) => write!(f, "sslrootcert {}", p.display()),
        }
    }
}

/// A database's TLS settings, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: SslMode,
    pub roots: RootCerts,
    /// `sslcert` and `sslkey`: a client certificate and its key (PEM), for servers that ask.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    fn plain() -> Self {
        Self {
            mode: SslMode::Disable,
            roots: RootCerts::System,
            client: None,
        }
    }
}

/// The query keys [`TlsOptions`] is read from; kept from tokio-postgres, which refuses most.
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// A database URL the check cannot use. Shows the URL redacted, never its password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown}: {problem}")]
pub struct DbUrlError {
    /// The URL as `redact_url` shows it.
    pub shown: String,
    pub problem: UrlProblem,
}

/// What is wrong with a database URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error(
        "expected a URL such as postgres://user@host:5432/db, redis://host:6379 or mysql://host:3306"
    )]
    NotAUrl,
    #[error("{0} is a TLS option: use rediss:// for Redis over TLS")]
    RedisPlainTls(String),
    #[error(
        "unsupported scheme {0:?}; use postgres://, postgresql://, redis://, rediss:// or mysql://"
    )]
    UnsupportedScheme(String),
    #[error("more than one '@'; percent-encode an '@' in the user or password as %40")]
    SeveralAts,
    #[error("invalid port {0:?}")]
    InvalidPort(String),
    /// The `url` crate's reason, for a host it cannot read (an unclosed '[', a bad IPv6 address).
    #[error("invalid host: {0}")]
    InvalidHost(String),
    #[error("invalid sslmode {0:?}; use disable, prefer, require, verify-ca or verify-full")]
    SslMode(String),
    #[error(
        "rediss:// always uses TLS: sslmode={0} is not one of require, verify-ca, verify-full"
    )]
    RedissMode(String),
    #[error(
        "sslrootcert=system checks the host name: it needs sslmode=verify-full (as libpq), not \
         {0}"
    )]
    SystemRootsNeedVerifyFull(String),
    #[error("sslcert and sslkey go together: give both or neither")]
    ClientCertHalf,
    #[error(
        "channel_binding=require is not supported (the check's TLS offers no channel binding); \
         use prefer or disable"
    )]
    ChannelBinding,
    /// tokio-postgres's reason, any URL in it without its password.
    #[error("not a valid Postgres URL: {0}")]
    InvalidPostgres(String),
    #[error("names no host")]
    NoHost,
    #[error("names no user, e.g. postgres://user@host:5432/db")]
    NoUser,
    #[error("only one host per URL")]
    SeveralHosts,
    #[error("the path must be a database number, e.g. redis://host:6379/0")]
    RedisDb,
}

/// A parsed database URL. Holds the URL's password, so it has no derived `Debug`.
#[derive(Clone)]
pub struct DbUrl {
    pub kind: DbKind,
    /// Redacted: fit to show.
    pub shown: String,
    /// The first host (a Unix socket directory for a Postgres `?host=/path`) and its port.
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Redis: the database index in the path.
    pub redis_db: Option<u32>,
    /// Postgres: the connection settings, password included, as the URL gives them (its
    /// `sslmode` reduced to what tokio-postgres knows: `verify-*` are `require` there).
    pub postgres: Option<tokio_postgres::Config>,
    pub tls: TlsOptions,
}

impl fmt::Debug for DbUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbUrl")
            .field("kind", &self.kind)
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

/// Checks that `url` is one the database check can use.
pub fn validate_url(url: &str) -> Result<(), DbUrlError> {
    DbUrl::parse(url).map(|_| ())
}

/// Whether `url` carries a password (in its userinfo or a `password=` parameter); false if it
/// does not parse.
pub fn has_password(url: &str) -> bool {
    DbUrl::parse(url).is_ok_and(|u| u.password.is_some())
}

fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// `key=value` pairs of a query, percent-decoded (a '+' stays a '+', as libpq reads it).
fn query_params(query: &str) -> impl Iterator<Item = (String, &str)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), v),
            None => (decode(kv), ""),
        })
}

/// A Postgres URL's own reading (tokio-postgres's, which knows its several hosts, its options
/// and its defaults) into `out`: host, port, TLS mode and user.
fn with_postgres(out: &mut DbUrl, url: &str, after: &str) -> Result<(), UrlProblem> {
    // tokio-postgres refuses the TLS keys it does not know; the check reads them.
    let without_tls = format!(
        "{}{}",
        &url[..url.len() - after.len()],
        without_query_keys(after, &TLS_KEYS)
    );
    let mut pg = tokio_postgres::Config::from_str(&without_tls)
        .map_err(|e| UrlProblem::InvalidPostgres(redact_urls_in(&error_chain(&e))))?;
    if pg.get_channel_binding() == tokio_postgres::config::ChannelBinding::Require {
        return Err(UrlProblem::ChannelBinding);
    }
    pg.ssl_mode(match out.tls.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        // The certificate checks are the TLS connector's.
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    match pg.get_hosts().first() {
        None => return Err(UrlProblem::NoHost),
        Some(tokio_postgres::config::Host::Tcp(h)) => out.host = h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => out.host = p.display().to_string(),
    }
    if let Some(p) = pg.get_ports().first() {
        out.port = *p;
    }
    if pg.get_user().is_none_or(str::is_empty) {
        return Err(UrlProblem::NoUser);
    }
    out.postgres = Some(pg);
    Ok(())
}

impl DbUrl {
    pub fn parse(url: &str) -> Result<Self, DbUrlError> {
        let url = url.trim();
        let shown = redact_url(url);
        let fail = |problem| DbUrlError {
            shown: shown.clone(),
            problem,
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(fail(UrlProblem::NotAUrl));
        };
        let lower_scheme = scheme.to_ascii_lowercase();
        let kind = match lower_scheme.as_str() {
            "postgres" | "postgresql" => DbKind::Postgres,
            "redis" | "rediss" => DbKind::Redis,
            "mysql" => DbKind::Mysql,
            other => return Err(fail(UrlProblem::UnsupportedScheme(other.into()))),
        };
        if rest.matches('@').count() > 1 {
            return Err(fail(UrlProblem::SeveralAts));
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
        let authority = after.split(['/', '?', '#']).next().unwrap_or_default();
        let query = after.split_once('?').map_or("", |(_, q)| q);
        let query_password = query_params(query)
            .find(|(k, _)| k.eq_ignore_ascii_case("password"))
            .map(|(_, v)| v);

        // The URL without its userinfo: what the `url` crate reads the host, port and path from.
        let several_hosts = authority.contains(',');
        let bare = if kind == DbKind::Postgres && several_hosts {
            // `h1:5432,h2:5433` is no URL authority; tokio-postgres reads it below.
            None
        } else {
            Some(
                url::Url::parse(&format!("{scheme}://{after}")).map_err(|e| {
                    fail(match e {
                        url::ParseError::InvalidPort => UrlProblem::InvalidPort(
                            authority
                                .rsplit_once(':')
                                .map_or(authority, |(_, p)| p)
                                .into(),
                        ),
                        url::ParseError::EmptyHost => UrlProblem::NoHost,
                        other => UrlProblem::InvalidHost(other.to_string()),
                    })
                })?,
            )
        };
        let (mut host, mut port) = (String::new(), kind.default_port());
        if let Some(u) = &bare {
            host = match u.host() {
                Some(url::Host::Ipv6(a)) => a.to_string(),
                Some(url::Host::Ipv4(a)) => a.to_string(),
                Some(url::Host::Domain(d)) => decode(d),
                None => String::new(),
            };
            match u.port() {
                Some(0) => return Err(fail(UrlProblem::InvalidPort("0".into()))),
                Some(p) => port = p,
                None => {}
            }
        }

        let mut out = Self {
            kind,
            shown: shown.clone(),
            host,
            port,
            user: user.filter(|u| !u.is_empty()).map(decode),
            password: raw_password
                .map(decode)
                .or(query_password.map(decode))
                .filter(|p| !p.is_empty()),
            redis_db: None,
            postgres: None,
            tls: TlsOptions::plain(),
        };
        out.tls = tls_options(kind, lower_scheme == "rediss", query).map_err(fail)?;
        match kind {
            DbKind::Postgres => with_postgres(&mut out, url, after).map_err(fail)?,
            DbKind::Redis | DbKind::Mysql => {
                if out.host.is_empty() {
                    return Err(fail(UrlProblem::NoHost));
                }
                if several_hosts {
                    return Err(fail(UrlProblem::SeveralHosts));
                }
            }
        }
        if let (DbKind::Redis, Some(u)) = (kind, &bare) {
            let db = u.path().trim_start_matches('/');
            if !db.is_empty() {
                out.redis_db = Some(db.parse::<u32>().map_err(|_| fail(UrlProblem::RedisDb))?);
            }
        }
        Ok(out)
    }
}

/// The TLS settings of a URL of `kind` (`rediss` for the `rediss://` scheme), from its query.
fn tls_options(kind: DbKind, rediss: bool, query: &str) -> Result<TlsOptions, UrlProblem> {
    let param = |key: &str| {
        query_params(query)
            .find(|(k, _)| k == key)
            .map(|(_, v)| decode(v))
    };
    let mode = param("sslmode");
    let root = param("sslrootcert").filter(|r| !r.is_empty());
    let (cert, key) = (
        param("sslcert").filter(|c| !c.is_empty()),
        param("sslkey").filter(|k| !k.is_empty()),
    );
    match kind {
        // The MySQL check reads only the greeting, which comes before any TLS.
        DbKind::Mysql => return Ok(TlsOptions::plain()),
        DbKind::Redis if !rediss => {
            return match TLS_KEYS.iter().find(|k| param(k).is_some()) {
                Some(k) => Err(UrlProblem::RedisPlainTls((*k).into())),
                None => Ok(TlsOptions::plain()),
            };
        }
        DbKind::Redis | DbKind::Postgres => {}
    }
    let explicit = match &mode {
        Some(m) => Some(SslMode::parse(m).ok_or_else(|| UrlProblem::SslMode(m.clone()))?),
        None => None,
    };
    let system = root.as_deref() == Some("system");
    let mut mode = match (kind, explicit) {
        (DbKind::Redis, None) => SslMode::VerifyFull,
        (DbKind::Redis, Some(m)) if m < SslMode::Require => {
            return Err(UrlProblem::RedissMode(m.as_str().into()))
        }
        // libpq: `sslrootcert=system` alone means verify-full.
        (_, None) if system => SslMode::VerifyFull,
        // libpq's default.
        (_, None) => SslMode::Prefer,
        (_, Some(m)) => m,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(UrlProblem::SystemRootsNeedVerifyFull(mode.as_str().into()));
    }
    // libpq: with a root certificate given, `require` checks the chain, as verify-ca does.
    if mode == SslMode::Require && root.is_some() {
        mode = SslMode::VerifyCa;
    }
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (None, None) => None,
        _ => return Err(UrlProblem::ClientCertHalf),
    };
    Ok(TlsOptions {
        mode,
        roots: match root {
            Some(r) if !system => RootCerts::File(PathBuf::from(r)),
            _ => RootCerts::System,
        },
        client,
    })
}

/// `after` (a URL past its userinfo) with the query parameters named in `keys` left out.
fn without_query_keys(after: &str, keys: &[&str]) -> String {
    let Some((before, query)) = after.split_once('?') else {
        return after.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let key = kv.split_once('=').map_or(*kv, |(k, _)| k);
            !keys.contains(&decode(key).as_str())
        })
        .collect();
    if kept.is_empty() {
        before.to_string()
    } else {
        format!("{before}?{}", kept.join("&"))
    }
}

/// `url` fit to show: the password (in the userinfo or a `password=` query parameter) removed,
/// everything else kept. Anything that is not `scheme://…` is shown as a placeholder, since
/// there is no telling where a secret might sit in it. By hand rather than through the `url`
/// crate: it must also redact what does not parse.
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

/// `e` and its sources, joined: tokio-postgres's `Display` alone says only "db error".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn urls_parse_into_kind_host_port_and_secrets() {
        let t = DbUrl::parse("postgresql://hc:p%40ss@127.0.0.1/app").unwrap();
        assert_eq!(
            (t.kind, t.host.as_str(), t.port),
            (DbKind::Postgres, "127.0.0.1", 5432)
        );
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.shown, "postgresql://hc@127.0.0.1/app");
        let t = DbUrl::parse("redis://:pw@[::1]:6380/2").unwrap();
        assert_eq!(
            (t.kind, t.host.as_str(), t.port, t.redis_db),
            (DbKind::Redis, "::1", 6380, Some(2))
        );
        assert_eq!(
            (t.user.as_deref(), t.password.as_deref()),
            (None, Some("pw"))
        );
        let t = DbUrl::parse("redis://acl-user:pw@cache").unwrap();
        assert_eq!((t.port, t.user.as_deref()), (6379, Some("acl-user")));
        let t = DbUrl::parse("MYSQL://db.internal").unwrap();
        assert_eq!((t.kind, t.port), (DbKind::Mysql, 3306));
        let t = DbUrl::parse("postgres://u@127.0.0.1:6432/db?sslmode=prefer&password=qp").unwrap();
        assert_eq!((t.port, t.password.as_deref()), (6432, Some("qp")));
        assert_eq!(t.shown, "postgres://u@127.0.0.1:6432/db?sslmode=prefer");
        assert!(format!("{t:?}").contains("postgres://u@127.0.0.1:6432/db"));
        assert!(!format!("{t:?}").contains("qp"));
    }

    #[test]
    fn postgres_forms_tokio_postgres_takes_are_accepted() {
        // Several hosts: the first is the one shown as host and port.
        let t = DbUrl::parse("postgres://u:pw@h1:5433,h2:5434/db").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("h1", 5433));
        // The host as a parameter (here a Unix socket directory), and a '/' in the password.
        let t = DbUrl::parse("postgres://u:p/w@/db?host=/run/postgresql").unwrap();
        assert_eq!(t.host, "/run/postgresql");
        assert_eq!(t.password.as_deref(), Some("p/w"));
        assert_eq!(t.shown, "postgres://u@/db?host=/run/postgresql");
        // A '+' in a password is a '+', as libpq reads it.
        let t = DbUrl::parse("redis://h?password=a+b").unwrap();
        assert_eq!(t.password.as_deref(), Some("a+b"));
    }

    #[test]
    fn sslmode_and_certificate_options_follow_libpq() {
        let tls = |url: &str| {
            DbUrl::parse(url)
                .unwrap_or_else(|e| panic!("{url}: {e}"))
                .tls
        };
        let pg_mode = |url: &str| DbUrl::parse(url).unwrap().postgres.unwrap().get_ssl_mode();
        use tokio_postgres::config::SslMode as Pg;
        use RootCerts::{File, System};
        use SslMode::*;
        let path = |p: &str| File(PathBuf::from(p));
        // (URL, mode, roots, what tokio-postgres is told)
        let cases = [
            ("postgres://u@h/db", Prefer, System, Pg::Prefer),
            (
                "postgres://u@h/db?sslmode=disable",
                Disable,
                System,
                Pg::Disable,
            ),
            (
                "postgres://u@h/db?sslmode=prefer",
                Prefer,
                System,
                Pg::Prefer,
            ),
            (
                "postgres://u@h/db?sslmode=require",
                Require,
                System,
                Pg::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-ca",
                VerifyCa,
                System,
                Pg::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-full",
                VerifyFull,
                System,
                Pg::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-full&sslrootcert=/etc/ssl/rds.pem",
                VerifyFull,
                path("/etc/ssl/rds.pem"),
                Pg::Require,
            ),
            // libpq: a root certificate turns require into a chain check.
            (
                "postgres://u@h/db?sslrootcert=%2Fca%20dir%2Fca.crt&sslmode=require",
                VerifyCa,
                path("/ca dir/ca.crt"),
                Pg::Require,
            ),
            // libpq 16: sslrootcert=system alone means verify-full.
            (
                "postgres://u@h/db?sslrootcert=system",
                VerifyFull,
                System,
                Pg::Require,
            ),
        ];
        for (url, mode, roots, pg) in cases {
            let t = tls(url);
            assert_eq!((t.mode, &t.roots), (mode, &roots), "{url}");
            assert_eq!(format!("{:?}", pg_mode(url)), format!("{pg:?}"), "{url}");
            assert_eq!(t.client, None, "{url}");
        }
        // Redis: redis:// is plain, rediss:// is verify-full unless it says otherwise.
        assert_eq!(tls("redis://h:6379").mode, Disable);
        assert_eq!(tls("rediss://h:6380").mode, VerifyFull);
        let t = tls("rediss://:pw@h:6380/1?sslmode=verify-ca&sslrootcert=/ca.pem");
        assert_eq!((t.mode, t.roots), (VerifyCa, path("/ca.pem")));
        assert_eq!(tls("rediss://h?sslmode=require").mode, Require);
        let r = DbUrl::parse("rediss://:pw@h:6380/1?sslrootcert=/ca.pem").unwrap();
        assert_eq!((r.kind, r.port, r.redis_db), (DbKind::Redis, 6380, Some(1)));
        assert_eq!(r.shown, "rediss://h:6380/1?sslrootcert=/ca.pem");
        // Client certificates, both halves.
        let t = tls("postgres://u@h/db?sslmode=verify-full&sslcert=/c.pem&sslkey=/k.pem");
        assert_eq!(
            t.client,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        // MySQL reads only the greeting, which comes before any TLS.
        assert_eq!(tls("mysql://h?ssl-mode=REQUIRED").mode, Disable);
    }

    #[test]
    fn tls_keys_are_kept_from_tokio_postgres_and_the_rest_reaches_it() {
        // A password with a '?' and a TLS key in the query: only the TLS keys are taken out.
        let t = DbUrl::parse(
            "postgres://u:p?w@h:6432/db?sslmode=verify-full&application_name=hc&sslrootcert=/ca.pem",
        )
        .unwrap();
        let pg = t.postgres.unwrap();
        assert_eq!(pg.get_password(), Some(&b"p?w"[..]));
        assert_eq!(pg.get_application_name(), Some("hc"));
        assert_eq!(pg.get_ports(), [6432]);
        assert_eq!(
            without_query_keys("h/db?sslmode=x&a=1&sslkey=k", &TLS_KEYS),
            "h/db?a=1"
        );
        assert_eq!(without_query_keys("h/db?sslmode=x", &TLS_KEYS), "h/db");
        assert_eq!(without_query_keys("h/db", &TLS_KEYS), "h/db");
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_the_password() {
        let cases = [
            ("http://u:Sekr1t@host", "unsupported scheme"),
            ("redis://:Sekr1t@host?sslmode=require", "use rediss://"),
            ("redis://:Sekr1t@host?sslrootcert=/ca.pem", "use rediss://"),
            ("rediss://:Sekr1t@host?sslmode=disable", "always uses TLS"),
            ("rediss://:Sekr1t@host?sslmode=prefer", "always uses TLS"),
            (
                "postgres://u:Sekr1t@host/db?sslmode=allow",
                "invalid sslmode",
            ),
            (
                "postgres://u:Sekr1t@host/db?sslmode=VERIFY-FULL",
                "invalid sslmode",
            ),
            (
                "postgres://u:Sekr1t@host/db?sslmode=require&sslrootcert=system",
                "needs sslmode=verify-full",
            ),
            (
                "postgres://u:Sekr1t@host/db?sslmode=verify-ca&sslrootcert=system",
                "needs sslmode=verify-full",
            ),
            ("postgres://u:Sekr1t@host/db?sslcert=/c.pem", "give both"),
            ("rediss://:Sekr1t@host?sslkey=/k.pem", "give both"),
            (
                "postgres://u:Sekr1t@host/db?sslmode=verify-full&channel_binding=require",
                "channel_binding=require",
            ),
            ("redis://:Sekr1t@host:notaport", "invalid port"),
            ("postgres://u:Sekr1t@host:99999/db", "invalid port"),
            ("mysql://u:Sekr1t@host:0", "invalid port"),
            ("redis://:Sekr1t@host/abc", "database number"),
            ("redis://:Sekr1t@/0", "names no host"),
            ("mysql://u:Sekr1t@", "names no host"),
            ("redis://:Sekr1t@h1,h2", "only one host"),
            ("redis://:Sekr1t@[::1", "invalid host"),
            ("postgres://a@b:Sekr1t@host/db", "more than one '@'"),
            (
                "postgres://u:Sekr1t@host/db?bogus_option=1",
                "not a valid Postgres URL",
            ),
            ("u:Sekr1t@host", "expected a URL"),
            ("postgres://:Sekr1t@host/db", "names no user"),
        ];
        for (url, want) in cases {
            let err = validate_url(url).expect_err(url).to_string();
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("Sekr1t"), "{url}: password leaked: {err}");
        }
    }
}
