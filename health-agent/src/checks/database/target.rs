//! What the check connects to: each configured URL parsed (by the leaf `crate::dburl`) into a
//! `Target`, and where each target's password comes from — its URL, else (Postgres only, as
//! libpq does) `PGPASSWORD`, else the first line of `database.password_file`, read every round
//! so a rotated password shows at once.

use std::{ops::Deref, path::PathBuf};

use super::{DatabaseError, Failure};
use crate::{
    config::DatabaseConfig,
    dburl::{DbKind, DbUrl},
};

/// One database to check. Holds its password: `DbUrl`'s `Debug` shows only kind and name.
#[derive(Clone, Debug)]
pub(super) struct Target(DbUrl);

impl Deref for Target {
    type Target = DbUrl;

    fn deref(&self) -> &DbUrl {
        &self.0
    }
}

/// Every configured URL (blank ones and duplicates skipped by `all_urls`), parsed; the error
/// names the offending key.
pub(super) fn targets(cfg: &DatabaseConfig) -> Result<Vec<Target>, DatabaseError> {
    cfg.all_urls()
        .into_iter()
        .map(|(key, url)| {
            DbUrl::parse(url)
                .map(Target)
                .map_err(|error| DatabaseError::Url { key, error })
        })
        .collect()
}

/// The passwords known besides the URLs', read once per round.
pub(super) struct Passwords {
    /// `PGPASSWORD`, when set and not blank.
    env: Option<String>,
    /// The password file's first line, or why it cannot be read (that names no secret).
    file: Result<Option<String>, DatabaseError>,
}

impl Passwords {
    pub(super) fn read(password_file: Option<&PathBuf>) -> Self {
        Self {
            env: std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
            file: read_password_file(password_file),
        }
    }

    /// The secrets to keep out of what this round shows.
    pub(super) fn secrets(&self) -> impl Iterator<Item = &String> {
        self.env
            .iter()
            .chain(self.file.as_ref().ok().into_iter().flatten())
    }

    /// The password to log in to `t` with, if any.
    pub(super) fn for_target(&self, t: &Target) -> Result<Option<String>, Failure> {
        match (&t.password, t.kind, &self.env, &self.file) {
            // The MySQL check does not log in.
            (_, DbKind::Mysql, _, _) => Ok(None),
            (Some(p), _, _, _) => Ok(Some(p.clone())),
            (None, DbKind::Postgres, Some(p), _) => Ok(Some(p.clone())),
            (None, _, _, Ok(p)) => Ok(p.clone()),
            // An unreadable password file is ours to fix, not the database's outage.
            (None, _, _, Err(e)) => Err(Failure::Refused(e.to_string())),
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
