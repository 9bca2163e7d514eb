//! The TOML configuration: every field defaulted (an empty file is valid), unknown keys
//! rejected, durations as human strings ("2s", "10m"). `DEFAULT_TOML` (default.toml) is the
//! commented file `health-agent config --dump` prints; a test keeps it equal to
//! `Config::default()`.
//!
//! sections.rs holds the serde structs, bounds.rs the range of every number, validate.rs the
//! cross-checks, secrets.rs what keeps secrets out of errors and warnings, env.rs the secrets
//! taken from the environment, dropin.rs the `conf.d/*.toml` files merged over the main file,
//! effective.rs `config --effective`, web_modes.rs the `[web]` section's modes.

use std::path::Path;

use serde::{Deserialize, Serialize};

mod bounds;
mod cloudwatch;
mod dropin;
mod effective;
mod env;
mod loopback;
mod secrets;
mod sections;
#[cfg(test)]
mod tests;
mod trust;
mod validate;
mod web_modes;

pub use dropin::{dropin_dir, Loaded};
pub use env::{FromEnv, Origin, Source};
pub(crate) use loopback::loopback_host;
pub use secrets::world_readable_warning;
pub use sections::{
    AlertsConfig, ChecksConfig, CloudWatchConfig, ContainersConfig, DatabaseConfig, Details,
    DiskConfig, DrainConfig, FleetConfig, HealConfig, ScalingConfig, ServerConfig, WebConfig,
};
pub(crate) use trust::foreign_owner;
pub use web_modes::{AcceptTracing, KernelTier, ProbeScheme, SocketTracing};

// Database URLs are checked and redacted by a leaf module shared with the database check.
use crate::dburl::{has_password, validate_url};

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
    /// A secret taken from the environment is not what its key accepts. Names the variable,
    /// never its value.
    #[error(
        "the environment variable {var} ({env_key}, for {key}) {message}; fix it, or set \
         {env_key} = \"\" to leave it unread"
    )]
    Env {
        var: String,
        env_key: &'static str,
        key: &'static str,
        message: String,
    },
    /// `config --effective` could not show the configuration (its secrets stay hidden).
    #[error("cannot show the configuration: {0}")]
    Render(String),
    /// A config file or `conf.d/` that a user other than root, or the agent's own, could
    /// change (trust.rs): never read, since a config sets commands the agent runs as root.
    #[error("{}", trust::describe(path, *mode, *uid, *euid))]
    Untrusted {
        path: String,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// Its owner.
        uid: u32,
        /// The user the agent runs as.
        euid: u32,
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
    pub drain: DrainConfig,
}

impl Config {
    /// Loads and validates a file and the drop-ins of `conf.d/` beside it, then fills the
    /// secrets not written from the environment (env.rs). A missing file at the default path
    /// is an empty config; a missing `conf.d/` is no drop-ins.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Ok(Self::load_all(path)?.config)
    }

    /// Like `load`, with the files the configuration was made of and where its secrets came
    /// from.
    pub fn load_all(path: &Path) -> Result<Loaded, ConfigError> {
        Self::load_all_with(path, &|var| std::env::var(var).ok())
    }

    /// Like `load_all`, the variables read through `env`.
    pub fn load_all_with(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Loaded, ConfigError> {
        let mut loaded = dropin::load(path)?;
        loaded.from_env = env::resolve(&mut loaded.config, env)?;
        Ok(loaded)
    }

    /// Parses and validates one file's text; errors name `path`.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let file = dropin::Source {
            shown: path.to_string(),
            text: text.to_string(),
        };
        dropin::merge(&[file], path)
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
