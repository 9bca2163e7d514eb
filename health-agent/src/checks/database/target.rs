//! What the check connects to: each configured URL parsed (by the leaf `crate::dburl`) into a
//! `Target` that remembers its config key, and where each target's password comes from — its
//! URL, else (Postgres only, as libpq does) `PGPASSWORD`, else the first line of
//! `database.password_file`, read every round so a rotated password shows at once. A [`Login`]
//! knows that source, so a refusal can say which key or file to change.

use std::{ops::Deref, path::PathBuf};

use super::{DatabaseError, Failure};
use crate::{
    config::DatabaseConfig,
    dburl::{DbKind, DbUrl},
};

/// Where the packaged systemd unit reads the agent's environment (`PGPASSWORD=...`) from.
pub(super) const ENVIRONMENT_FILE: &str = "/etc/health-agent/environment";

/// One database to check. Holds its password: `DbUrl`'s `Debug` shows only kind and name.
#[derive(Clone, Debug)]
pub(super) struct Target {
    url: DbUrl,
    /// The config key the URL came from: `database.url` (or the variable `database.url_env`
    /// names, when it came from there) or `database.urls[i]`.
    pub(super) key: String,
}

impl Deref for Target {
    type Target = DbUrl;

    fn deref(&self) -> &DbUrl {
        &self.url
    }
}

/// Every configured URL (blank ones and duplicates skipped by `all_urls`), parsed; the error
/// names the offending key.
pub(super) fn targets(cfg: &DatabaseConfig) -> Result<Vec<Target>, DatabaseError> {
    cfg.all_urls()
        .into_iter()
        .map(|(key, url)| {
            (
                if key == "database.url" {
                    cfg.url_shown_as()
                } else {
                    key
                },
                url,
            )
        })
        .map(|(key, url)| match DbUrl::parse(url) {
            Ok(url) => Ok(Target { url, key }),
            Err(error) => Err(DatabaseError::Url { key, error }),
        })
        .collect()
}

/// Where a login's password came from, for the words of a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// The URL itself (its userinfo or `password=`).
    Url,
    /// `PGPASSWORD` in the agent's environment.
    Env,
    /// `database.password_file`.
    File(PathBuf),
    /// None was given; `Some` when `database.password_file` is set but its first line is blank.
    Nowhere { blank_file: Option<PathBuf> },
}

/// The password to log in to one target with, and where it came from. No `Debug`: it holds
/// the password.
pub(super) struct Login {
    pub(super) password: Option<String>,
    pub(super) source: Source,
}

impl Login {
    /// What to change when the server asks for a password and this login has none.
    pub(super) fn missing(&self, t: &Target) -> String {
        let key = &t.key;
        let file = match &self.source {
            Source::Nowhere {
                blank_file: Some(p),
            } => format!(
                "database.password_file {} has no password on its first line",
                p.display()
            ),
            _ => "set database.password_file".into(),
        };
        match t.kind {
            DbKind::Postgres => format!(
                "the server asks for a password and none is set: put PGPASSWORD=... in the \
                 agent's environment file ({ENVIRONMENT_FILE}), or {file}, or put it in {key}"
            ),
            DbKind::Redis | DbKind::Mysql => format!(
                "the server asks for a password and none is set: put it in {key} \
                 ({}://:PASSWORD@host:port, or USER:PASSWORD@ for an ACL user), or {file}",
                if t.tls.mode == crate::dburl::SslMode::Disable {
                    "redis"
                } else {
                    "rediss"
                }
            ),
        }
    }

    /// What to change when the server refused the password (or the user) this login gave.
    pub(super) fn refused(&self, t: &Target) -> String {
        let key = &t.key;
        match &self.source {
            Source::Url => format!("fix the user or the password in {key}"),
            Source::Env => format!(
                "the password came from PGPASSWORD (the agent's environment file, \
                 {ENVIRONMENT_FILE}): fix it, or the user in {key}"
            ),
            Source::File(p) => format!(
                "the password came from database.password_file {}: fix its first line, or the \
                 user in {key}",
                p.display()
            ),
            Source::Nowhere { .. } => format!("fix the user in {key}"),
        }
    }
}

/// The passwords known besides the URLs', read once per round.
pub(super) struct Passwords {
    /// `PGPASSWORD`, when set and not blank.
    env: Option<String>,
    /// `database.password_file`, when set.
    path: Option<PathBuf>,
    /// The password file's first line, or why it cannot be read (that names no secret).
    file: Result<Option<String>, DatabaseError>,
}

impl Passwords {
    pub(super) fn read(password_file: Option<&PathBuf>) -> Self {
        Self {
            env: std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
            path: password_file.cloned(),
            file: read_password_file(password_file),
        }
    }

    /// The login for `t`: its password, if any, and where it came from.
    pub(super) fn for_target(&self, t: &Target) -> Result<Login, Failure> {
        let login = |password: &String, source| Login {
            password: Some(password.clone()),
            source,
        };
        let none = || Login {
            password: None,
            source: Source::Nowhere {
                blank_file: self.path.clone(),
            },
        };
        match (&t.password, t.kind, &self.env, &self.file) {
            // The MySQL check does not log in.
            (_, DbKind::Mysql, _, _) => Ok(none()),
            (Some(p), _, _, _) => Ok(login(p, Source::Url)),
            (None, DbKind::Postgres, Some(p), _) => Ok(login(p, Source::Env)),
            (None, _, _, Ok(Some(p))) => Ok(login(
                p,
                Source::File(self.path.clone().unwrap_or_default()),
            )),
            (None, _, _, Ok(None)) => Ok(none()),
            // An unreadable password file is ours to fix, not the database's outage.
            (None, _, _, Err(e)) => Err(Failure::Refused(format!(
                "{e}: create it with the password on its first line, readable by the agent's \
                 user, or fix database.password_file"
            ))),
        }
    }
}

/// The first line of `database.password_file`, trimmed; `None` when unset or blank.
fn read_password_file(path: Option<&PathBuf>) -> Result<Option<String>, DatabaseError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|source| DatabaseError::PasswordFile {
        path: path.clone(),
        source,
    })?;
    Ok(text
        .lines()
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string))
}

/// What can be seen wrong with `t` before connecting, in words naming the key: a file its URL
/// or `database.password_file` names that cannot be read, or a Postgres login over TCP with no
/// password from anywhere (fine only for a server that trusts this client or takes a client
/// certificate, so a warning, not a verdict). For the log at start.
pub(super) fn start_warnings(t: &Target, password_file: Option<&PathBuf>) -> Vec<String> {
    use crate::dburl::{RootCerts, SslMode};
    let mut out = Vec::new();
    let unreadable = |what: &str, path: &PathBuf| {
        std::fs::File::open(path).err().map(|e| {
            format!(
                "{} {}: cannot read {what} {}: {e}",
                t.key,
                t.shown,
                path.display()
            )
        })
    };
    if let (SslMode::VerifyCa | SslMode::VerifyFull, RootCerts::File(p)) =
        (t.tls.mode, &t.tls.roots)
    {
        out.extend(unreadable("sslrootcert", p));
    }
    if t.tls.mode != SslMode::Disable {
        if let Some((cert, key)) = &t.tls.client {
            out.extend(unreadable("sslcert", cert));
            out.extend(unreadable("sslkey", key));
        }
    }
    if t.kind == DbKind::Mysql {
        return out;
    }
    if let Some(p) = password_file {
        if let Err(e) = std::fs::read_to_string(p) {
            out.push(format!(
                "cannot read database.password_file {}: {e}",
                p.display()
            ));
        }
    }
    let tcp = !t.host.starts_with('/');
    let no_password = t.password.is_none()
        && password_file.is_none()
        && std::env::var("PGPASSWORD").map_or(true, |p| p.is_empty());
    if t.kind == DbKind::Postgres && tcp && t.tls.client.is_none() && no_password {
        out.push(format!(
            "{} {}: no password is set (none in the URL, no PGPASSWORD, no \
             database.password_file); unless the server lets this user in without one, the \
             database check will be misconfigured: put PGPASSWORD=... in the agent's \
             environment file ({ENVIRONMENT_FILE}) or set database.password_file",
            t.key, t.shown
        ));
    }
    out
}
