//! The TOML configuration: every field defaulted (an empty file is valid), unknown keys
//! rejected, durations as human strings ("2s", "10m"). `DEFAULT_TOML` (default.toml) is the
//! commented file `health-agent config --dump` prints; a test keeps it equal to
//! `Config::default()`.
//!
//! sections.rs holds the serde structs, bounds.rs the range of every number, validate.rs the
//! cross-checks, secrets.rs what keeps secrets out of errors and warnings.

use std::path::Path;

use serde::{Deserialize, Serialize};

mod bounds;
mod cloudwatch;
mod loopback;
mod secrets;
mod sections;
#[cfg(test)]
mod tests;
mod validate;

pub use secrets::world_readable_warning;
pub use sections::{
    AcceptTracing, AlertsConfig, ChecksConfig, CloudWatchConfig, ContainersConfig, DatabaseConfig,
    Details, DiskConfig, FleetConfig, HealConfig, ScalingConfig, ServerConfig, SocketTracing,
    WebConfig,
};

// Database URLs are checked and redacted by a leaf module shared with the database check.
use crate::dburl::{redact_urls_in, url_secrets, validate_url};

pub const DEFAULT_PATH: &str = "/etc/health-agent/health-agent.toml";

/// The documented default configuration, printed by `health-agent config --dump`.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // `error`, not `source`: as a source, anyhow's `{:#}` would print the OS error twice.
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {}`{key}` {message}", secrets::line_prefix(*.line))]
    Invalid {
        path: String,
        /// Where the key is set in the file, when it is (a default can be out of range only
        /// through another key).
        line: Option<usize>,
        key: &'static str,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub checks: ChecksConfig,
    pub web: WebConfig,
    pub disk: DiskConfig,
    pub containers: ContainersConfig,
    pub database: DatabaseConfig,
    pub scaling: ScalingConfig,
    pub heal: HealConfig,
    pub alerts: AlertsConfig,
    pub fleet: FleetConfig,
}

impl Config {
    /// Loads and validates a file. A missing file at the default path is an empty config.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound && path == Path::new(DEFAULT_PATH) =>
            {
                String::new()
            }
            Err(error) => return Err(ConfigError::Read { path: shown, error }),
        };
        let cfg = Self::parse(&text, &shown)?;
        if let Some(warning) = world_readable_warning(path, &cfg) {
            tracing::warn!("{warning}");
        }
        Ok(cfg)
    }

    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            // toml's own rendering quotes the offending line, which may hold a secret.
            message: secrets::parse_error(text, &e),
        })?;
        cfg.validate(path).map_err(|e| match e {
            ConfigError::Invalid {
                path, key, message, ..
            } => ConfigError::Invalid {
                path,
                line: secrets::line_of(text, key),
                key,
                message: secrets::secrets(&cfg).replace(&message),
            },
            other => other,
        })?;
        Ok(cfg)
    }
}

/// serde for `Duration` as a human string ("250ms", "2s", "10m").
mod dur {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {s:?} ({e}); use a number with a unit, e.g. \"250ms\", \"2s\", \"10m\""
            ))
        })
    }
}
