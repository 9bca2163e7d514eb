//! Secrets from the environment, one convention for every secret of the configuration: a
//! secret key `K` has a key `K_env` naming an environment variable (under systemd, a line of
//! /etc/health-agent/environment). A value written in the configuration wins; else the
//! variable's, when it is set and not blank. A value taken from the environment is checked as
//! the key's own is, and messages name the variable, never the value.
//!
//! The tokens with no key of their own (`alerts.github_token_env`, `server.token_env`,
//! `fleet.token_env`) are read where they are used; [`Source`] lists them too, so that
//! `config --effective` and `check` say where every secret comes from.

use super::{loopback::secret_url, Config, ConfigError, Details};

/// A secret key that may come from the environment.
#[derive(Clone, Copy)]
enum Keyed {
    Slack,
    Webhook,
    PagerDuty,
    Database,
}

const KEYED: [Keyed; 4] = [
    Keyed::Slack,
    Keyed::Webhook,
    Keyed::PagerDuty,
    Keyed::Database,
];

impl Keyed {
    fn key(self) -> &'static str {
        match self {
            Self::Slack => "alerts.slack_webhook_url",
            Self::Webhook => "alerts.webhook_url",
            Self::PagerDuty => "alerts.pagerduty_routing_key",
            Self::Database => "database.url",
        }
    }

    fn env_key(self) -> &'static str {
        match self {
            Self::Slack => "alerts.slack_webhook_url_env",
            Self::Webhook => "alerts.webhook_url_env",
            Self::PagerDuty => "alerts.pagerduty_routing_key_env",
            Self::Database => "database.url_env",
        }
    }

    /// The value written in `cfg`.
    fn value(self, cfg: &Config) -> &String {
        match self {
            Self::Slack => &cfg.alerts.slack_webhook_url,
            Self::Webhook => &cfg.alerts.webhook_url,
            Self::PagerDuty => &cfg.alerts.pagerduty_routing_key,
            Self::Database => &cfg.database.url,
        }
    }

    fn value_mut(self, cfg: &mut Config) -> &mut String {
        match self {
            Self::Slack => &mut cfg.alerts.slack_webhook_url,
            Self::Webhook => &mut cfg.alerts.webhook_url,
            Self::PagerDuty => &mut cfg.alerts.pagerduty_routing_key,
            Self::Database => &mut cfg.database.url,
        }
    }

    /// The variable `cfg` names for it ("" = none).
    fn var(self, cfg: &Config) -> &str {
        match self {
            Self::Slack => &cfg.alerts.slack_webhook_url_env,
            Self::Webhook => &cfg.alerts.webhook_url_env,
            Self::PagerDuty => &cfg.alerts.pagerduty_routing_key_env,
            Self::Database => &cfg.database.url_env,
        }
    }

    /// The value from the environment checked as the key's own would be; the message never
    /// shows it.
    fn check(self, value: &str) -> Result<(), String> {
        match self {
            Self::Slack | Self::Webhook => secret_url(value).map_err(String::from),
            // The problem alone: the URL as shown would name user and host.
            Self::Database => crate::dburl::validate_url(value).map_err(|e| e.problem.to_string()),
            Self::PagerDuty => Ok(()),
        }
    }
}

/// Every key that names a variable holding a secret, and the name it holds in `cfg`.
fn env_keys(cfg: &Config) -> [(&'static str, &str); 8] {
    [
        (Keyed::Slack.env_key(), Keyed::Slack.var(cfg)),
        (Keyed::Webhook.env_key(), Keyed::Webhook.var(cfg)),
        (Keyed::PagerDuty.env_key(), Keyed::PagerDuty.var(cfg)),
        (Keyed::Database.env_key(), Keyed::Database.var(cfg)),
        ("alerts.github_token_env", &cfg.alerts.github_token_env),
        ("server.token_env", &cfg.server.token_env),
        ("fleet.key_env", &cfg.fleet.key_env),
        ("fleet.consul_token_env", &cfg.fleet.consul_token_env),
    ]
}

/// Where one secret comes from. Never holds the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// A key ("alerts.slack_webhook_url"), or what a token with no key of its own is for.
    pub secret: &'static str,
    /// The key naming the variable ("alerts.slack_webhook_url_env").
    pub env_key: &'static str,
    /// The variable it names ("" = none).
    pub var: String,
    pub origin: Origin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Written in the configuration; `shadowing` when the variable is set too, and unused.
    Written { shadowing: bool },
    /// Taken from the variable.
    Env,
    /// Neither written nor in the environment.
    Unset,
}

impl Source {
    /// One line for people: where the secret comes from, never what it is.
    pub fn describe(&self) -> String {
        let Self {
            secret,
            env_key,
            var,
            ..
        } = self;
        match self.origin {
            Origin::Written { shadowing: false } => {
                format!("{secret}: written in the configuration")
            }
            Origin::Written { shadowing: true } => format!(
                "{secret}: written in the configuration (the variable {var} is set too, and unused)"
            ),
            Origin::Env => format!("{secret}: from the environment variable {var} ({env_key})"),
            Origin::Unset if var.is_empty() => format!("{secret}: not set ({env_key} = \"\")"),
            Origin::Unset => format!("{secret}: not set ({var} is unset or blank)"),
        }
    }

    /// Whether this secret is a key of the configuration (not a token read where it is used).
    pub fn is_key(&self) -> bool {
        KEYED.iter().any(|k| k.key() == self.secret)
    }
}

/// What the environment gave a configuration: where each secret comes from, and the notes
/// worth telling (a variable named but unset, one set but unread).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FromEnv {
    pub secrets: Vec<Source>,
    pub notes: Vec<String>,
}

/// The cross-checks of the keys that name variables, on the configuration as written: each
/// is a variable's name (a secret pasted there by mistake is refused without being shown), and
/// a variable named on purpose (not the default) is not also contradicted by a written value.
pub(super) fn check_names(cfg: &Config) -> Result<(), (&'static str, String)> {
    for (env_key, var) in env_keys(cfg) {
        if !var.is_empty() && !is_variable_name(var) {
            return Err((
                env_key,
                "must name an environment variable (letters, digits and '_', not starting with \
                 a digit) or be \"\" for none (value not shown: it may be the secret itself)"
                    .into(),
            ));
        }
    }
    let defaults = Config::default();
    for k in KEYED {
        let var = k.var(cfg);
        if !var.is_empty() && var != k.var(&defaults) && !k.value(cfg).trim().is_empty() {
            return Err((
                k.env_key(),
                format!(
                    "names {var}, and {} is written in the configuration too: keep one (the \
                     written value would win and {var} be ignored)",
                    k.key()
                ),
            ));
        }
    }
    Ok(())
}

fn is_variable_name(var: &str) -> bool {
    var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && var.chars().next().is_some_and(|c| !c.is_ascii_digit())
}

/// Fills every secret key that is not written from the variable its `_env` key names (through
/// `env`, the process environment outside tests), checked as the key's own value is. The error
/// names the variable, never its value.
pub(super) fn resolve(
    cfg: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<FromEnv, ConfigError> {
    let read = |var: &str| {
        (!var.is_empty())
            .then(|| env(var))
            .flatten()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let defaults = Config::default();
    let mut out = FromEnv::default();
    for k in KEYED {
        let var = k.var(cfg).to_string();
        let from_env = read(&var);
        let origin = if !k.value(cfg).trim().is_empty() {
            Origin::Written {
                shadowing: from_env.is_some(),
            }
        } else if let Some(value) = from_env {
            k.check(&value).map_err(|message| ConfigError::Env {
                var: var.clone(),
                env_key: k.env_key(),
                key: k.key(),
                message,
            })?;
            *k.value_mut(cfg) = value;
            if let Keyed::Database = k {
                cfg.database.url_from = Some(var.clone());
            }
            Origin::Env
        } else {
            if !var.is_empty() && var != k.var(&defaults) {
                out.notes.push(format!(
                    "{} names {var}, which is unset or blank: {} is not set",
                    k.env_key(),
                    k.key()
                ));
            }
            Origin::Unset
        };
        out.secrets.push(Source {
            secret: k.key(),
            env_key: k.env_key(),
            var,
            origin,
        });
    }
    let tokens = [
        (
            "the GitHub token",
            "alerts.github_token_env",
            &cfg.alerts.github_token_env,
            !cfg.alerts.github_repo.is_empty(),
        ),
        (
            "the /health details token",
            "server.token_env",
            &cfg.server.token_env,
            cfg.server.details == Details::Token,
        ),
        (
            "the fleet key",
            "fleet.key_env",
            &cfg.fleet.key_env,
            cfg.fleet.enabled() && cfg.fleet.key_file.is_empty() && !cfg.fleet.key_env.is_empty(),
        ),
        (
            "the Consul token",
            "fleet.consul_token_env",
            &cfg.fleet.consul_token_env,
            !cfg.fleet.consul_addr.is_empty() && !cfg.fleet.consul_token_env.is_empty(),
        ),
    ];
    for (secret, env_key, var, used) in tokens {
        if used {
            out.secrets.push(Source {
                secret,
                env_key,
                var: var.clone(),
                origin: match read(var) {
                    Some(_) => Origin::Env,
                    None => Origin::Unset,
                },
            });
        }
    }
    // Rails and Heroku-style hosts put the application's database there; it is checked only
    // when asked for (it may carry the application's own credentials).
    if cfg.database.all_urls().is_empty() && read(DATABASE_URL).is_some() {
        out.notes.push(format!(
            "{DATABASE_URL} is set in this environment, but no database is configured: set \
             database.url_env = \"{DATABASE_URL}\" to check the database it names"
        ));
    }
    Ok(out)
}

/// The variable Rails and Heroku-style hosts hold the application's database URL in.
const DATABASE_URL: &str = "DATABASE_URL";

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// `toml` parsed and resolved against `vars` alone.
    fn resolved(toml: &str, vars: &[(&str, &str)]) -> Result<(Config, FromEnv), String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut cfg = Config::parse(toml, "x.toml").map_err(|e| e.to_string())?;
        let from = resolve(&mut cfg, &|var| vars.get(var).cloned()).map_err(|e| e.to_string())?;
        Ok((cfg, from))
    }

    fn origin(from: &FromEnv, secret: &str) -> Origin {
        from.secrets
            .iter()
            .find(|s| s.secret == secret)
            .unwrap_or_else(|| panic!("no {secret} in {from:?}"))
            .origin
    }

    const SLACK: &str = "https://hooks.slack.com/services/T0/B0/EnvS3cr3t";

    #[test]
    fn each_secret_key_comes_from_its_default_variable_when_not_written() {
        let (cfg, from) = resolved(
            "",
            &[
                ("SLACK_WEBHOOK_URL", SLACK),
                ("HEALTH_AGENT_WEBHOOK_URL", " http://127.0.0.1:9/hook\n"),
                ("PAGERDUTY_ROUTING_KEY", "R0ut1ngK3y"),
                // Off by default: the application's database is checked only when asked for.
                ("DATABASE_URL", "postgres://app:pw@127.0.0.1/app"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.alerts.slack_webhook_url, SLACK);
        assert_eq!(cfg.alerts.webhook_url, "http://127.0.0.1:9/hook", "trimmed");
        assert_eq!(cfg.alerts.pagerduty_routing_key, "R0ut1ngK3y");
        assert_eq!(cfg.database.url, "");
        for key in [
            "alerts.slack_webhook_url",
            "alerts.webhook_url",
            "alerts.pagerduty_routing_key",
        ] {
            assert_eq!(origin(&from, key), Origin::Env, "{key}");
        }
        assert_eq!(origin(&from, "database.url"), Origin::Unset);
        let hint = from.notes.join("\n");
        assert!(
            hint.contains("DATABASE_URL is set") && hint.contains("database.url_env"),
            "{hint}"
        );
        assert!(
            !hint.contains("app:pw") && !hint.contains("127.0.0.1"),
            "{hint}"
        );
    }

    #[test]
    fn a_written_value_wins_and_a_blank_variable_is_unset() {
        let (cfg, from) = resolved(
            "[alerts]\nslack_webhook_url = \"https://hooks.slack.com/services/T1/B1/file\"\n",
            &[
                ("SLACK_WEBHOOK_URL", SLACK),
                ("PAGERDUTY_ROUTING_KEY", "  \n"),
            ],
        )
        .unwrap();
        assert!(cfg.alerts.slack_webhook_url.ends_with("/file"));
        assert_eq!(
            origin(&from, "alerts.slack_webhook_url"),
            Origin::Written { shadowing: true }
        );
        assert_eq!(cfg.alerts.pagerduty_routing_key, "");
        assert_eq!(origin(&from, "alerts.pagerduty_routing_key"), Origin::Unset);
        // `_env = ""` reads nothing.
        let (cfg, from) = resolved(
            "[alerts]\nslack_webhook_url_env = \"\"\n",
            &[("SLACK_WEBHOOK_URL", SLACK)],
        )
        .unwrap();
        assert_eq!(cfg.alerts.slack_webhook_url, "");
        assert_eq!(origin(&from, "alerts.slack_webhook_url"), Origin::Unset);
        assert!(from.notes.is_empty(), "{:?}", from.notes);
    }

    #[test]
    fn a_variable_of_your_own_is_read_and_warned_of_when_unset() {
        let (cfg, _) = resolved(
            "[alerts]\nslack_webhook_url_env = \"OPS_SLACK\"\n",
            &[
                ("OPS_SLACK", SLACK),
                ("SLACK_WEBHOOK_URL", "https://other.example/x"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.alerts.slack_webhook_url, SLACK);
        let (_, from) = resolved("[database]\nurl_env = \"DATABASE_URL\"\n", &[]).unwrap();
        assert_eq!(
            from.notes,
            ["database.url_env names DATABASE_URL, which is unset or blank: database.url is not set"]
        );
    }

    #[test]
    fn database_url_env_is_the_database_url_and_named_in_messages() {
        let (cfg, from) = resolved(
            "[database]\nurl_env = \"DATABASE_URL\"\nurls = [\"redis://127.0.0.1:6379\"]\n",
            &[("DATABASE_URL", "postgres://app:pw@127.0.0.1:5432/app")],
        )
        .unwrap();
        assert_eq!(cfg.database.url, "postgres://app:pw@127.0.0.1:5432/app");
        assert_eq!(cfg.database.all_urls().len(), 2, "urls adds more");
        assert_eq!(
            cfg.database.url_shown_as(),
            "DATABASE_URL (database.url_env)"
        );
        assert_eq!(origin(&from, "database.url"), Origin::Env);
        assert!(from.notes.is_empty(), "{:?}", from.notes);
        let line = from
            .secrets
            .iter()
            .find(|s| s.secret == "database.url")
            .unwrap();
        assert_eq!(
            line.describe(),
            "database.url: from the environment variable DATABASE_URL (database.url_env)"
        );
    }

    #[test]
    fn values_from_the_environment_are_checked_as_the_keys_and_never_shown() {
        for (toml, var, value, says) in [
            (
                "",
                "SLACK_WEBHOOK_URL",
                "http://hooks.example.com/services/T1/B2/s3cr3t",
                "https://",
            ),
            (
                "",
                "HEALTH_AGENT_WEBHOOK_URL",
                "hooks.example.com/s3cr3t",
                "https://",
            ),
            (
                "[database]\nurl_env = \"DATABASE_URL\"\n",
                "DATABASE_URL",
                "mysql2://app:s3cr3t@db/app",
                "unsupported scheme",
            ),
        ] {
            let e = resolved(toml, &[(var, value)]).unwrap_err();
            assert!(e.contains(var) && e.contains(says), "{e}");
            assert!(
                e.contains("_env = \"\""),
                "says how to leave it unread: {e}"
            );
            assert!(!e.contains("s3cr3t") && !e.contains("example.com"), "{e}");
        }
        // Loopback http:// is fine, as for the key.
        resolved("", &[("SLACK_WEBHOOK_URL", "http://127.0.0.1:9/x")]).unwrap();
    }

    #[test]
    fn keys_naming_variables_are_names_and_a_contradiction_is_refused() {
        for key in [
            "alerts.slack_webhook_url_env",
            "alerts.webhook_url_env",
            "alerts.pagerduty_routing_key_env",
            "alerts.github_token_env",
            "database.url_env",
            "server.token_env",
            "fleet.key_env",
        ] {
            let (section, field) = key.split_once('.').unwrap();
            let e = resolved(
                &format!("[{section}]\n{field} = \"https://hooks.slack.com/x/S3cr3t\"\n"),
                &[],
            )
            .unwrap_err();
            assert!(
                e.contains(&format!("`{key}`")) && e.contains("line 2"),
                "{e}"
            );
            assert!(!e.contains("S3cr3t"), "{e}");
            resolved(&format!("[{section}]\n{field} = \"\"\n"), &[]).unwrap();
        }
        let e = resolved(
            "[database]\nurl = \"postgres://app@127.0.0.1/app\"\nurl_env = \"DATABASE_URL\"\n",
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains("`database.url_env`") && e.contains("keep one"),
            "{e}"
        );
        // The default variable beside a written value is no contradiction: the value wins.
        resolved(
            "[alerts]\nslack_webhook_url = \"https://hooks.slack.com/x\"\n\
             slack_webhook_url_env = \"SLACK_WEBHOOK_URL\"\n",
            &[],
        )
        .unwrap();
    }

    #[test]
    fn tokens_are_listed_where_they_are_used() {
        let (_, from) = resolved(
            "[alerts]\ngithub_repo = \"acme/shop\"\n[server]\ndetails = \"token\"\n",
            &[("GITHUB_TOKEN", "ghp_S3cr3t")],
        )
        .unwrap();
        assert_eq!(origin(&from, "the GitHub token"), Origin::Env);
        assert_eq!(origin(&from, "the /health details token"), Origin::Unset);
        assert!(!from.secrets.iter().any(|s| s.secret == "the fleet token"));
        let all: Vec<String> = from.secrets.iter().map(Source::describe).collect();
        assert!(!all.join("\n").contains("S3cr3t"), "{all:?}");
    }
}
