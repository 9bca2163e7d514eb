//! `health-agent config --effective`: the merged configuration as the agent runs it, printed
//! as TOML that parses back to the same configuration, with every secret hidden. The secrets
//! are the ones secrets.rs knows (the same list the warnings and error scrubbing use); each is
//! replaced by a value that still validates, so the output is a config file too.

use super::{dropin::Loaded, secrets, Config, ConfigError};

/// How a hidden secret is shown.
const HIDDEN: &str = "[redacted]";

impl Config {
    /// This config with every secret replaced: database and other URLs lose their password,
    /// webhook URLs (the whole URL is the secret) are cut to their host, keys read
    /// `[redacted]`. Every other value is kept as is.
    pub fn redacted(&self) -> Result<Config, ConfigError> {
        let render =
            |what: &str, e: &dyn std::fmt::Display| ConfigError::Render(format!("{what}: {e}"));
        let mut value = toml::Value::try_from(self).map_err(|e| render("serialising", &e))?;
        for (key, secret) in secrets::secret_fields(self) {
            let shown = hidden(&key, secret);
            // A key the redaction cannot find must not be shown at all: refuse, never leak.
            let slot = slot(&mut value, &key)
                .ok_or_else(|| ConfigError::Render(format!("cannot hide `{key}`")))?;
            *slot = toml::Value::String(shown);
        }
        value
            .try_into()
            .map_err(|e: toml::de::Error| render("reading back", &e))
    }
}

impl Loaded {
    /// The TOML `config --effective` prints: which files made it, where each secret comes
    /// from, then every key as the files set it (a secret taken from the environment stays
    /// out: the file did not hold it, and its value is never shown).
    pub fn effective_toml(&self) -> Result<String, ConfigError> {
        let body = toml::to_string(&self.written.redacted()?)
            .map_err(|e| ConfigError::Render(format!("writing TOML: {e}")))?;
        let order = if self.dropins.is_empty() {
            ""
        } else {
            " (later files win, key by key)"
        };
        let mut sources = String::new();
        for s in &self.from_env.secrets {
            sources.push_str(&format!("#   {}\n", s.describe()));
        }
        for note in &self.from_env.notes {
            sources.push_str(&format!("# Note: {note}\n"));
        }
        Ok(format!(
            "# The configuration health-agent runs with: {}{order}.\n\
             # Secrets hidden: passwords taken out of URLs, webhook URLs cut to their host, keys\n\
             # shown as \"{HIDDEN}\". Where each secret comes from (a value written here wins over\n\
             # the variable its _env key names):\n{sources}\n{body}",
            self.describe()
        ))
    }
}

/// What a secret is shown as: still a valid value of its key.
fn hidden(key: &str, value: &str) -> String {
    match key {
        // The whole URL is the credential (Slack's path, a token in a webhook's query).
        "alerts.slack_webhook_url" | "alerts.webhook_url" => crate::redact::text(value),
        "alerts.pagerduty_routing_key" => HIDDEN.into(),
        // Database URLs and endpoints with a password in them: the password goes, the rest
        // (user, host, database, TLS settings) says what is configured.
        _ => crate::dburl::redact_url(value),
    }
}

/// The value at `key` ("section.field", "section.sub.field", "database.urls[2]").
fn slot<'a>(root: &'a mut toml::Value, key: &str) -> Option<&'a mut toml::Value> {
    key.split('.')
        .try_fold(root, |at, part| match part.split_once('[') {
            Some((name, index)) => {
                let i: usize = index.strip_suffix(']')?.parse().ok()?;
                at.get_mut(name)?.get_mut(i)
            }
            None => at.get_mut(part),
        })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn loaded(text: &str) -> Loaded {
        let config = Config::parse(text, "t.toml").unwrap();
        Loaded {
            written: config.clone(),
            config,
            from_env: Default::default(),
            main: PathBuf::from("/etc/health-agent/health-agent.toml"),
            main_found: true,
            dropins: vec![PathBuf::from("/etc/health-agent/conf.d/50-aws.toml")],
        }
    }

    #[test]
    fn effective_config_parses_back_to_the_same_config() {
        for text in [
            "",
            "[web]\nport = 9000\nworkers = 16\nhung_after = \"1500ms\"\n\n[scaling.cloudwatch]\n\
             enabled = true\nregion = \"eu-west-1\"\n\n[fleet]\npeers = [\"10.0.0.2:8080\"]\n\
             \n[database]\nurl = \"postgres://app@db:5432/app?sslmode=require\"\n\
             password_file = \"/etc/health-agent/db.pw\"\n\n[heal]\nwindow = \"90m\"\n",
        ] {
            let l = loaded(text);
            let out = l.effective_toml().unwrap();
            assert!(out.contains("conf.d/50-aws.toml"), "{out}");
            let back = Config::parse(&out, "effective").unwrap();
            assert_eq!(back, l.config, "{out}");
        }
    }

    #[test]
    fn effective_config_hides_every_secret_and_still_parses() {
        let secrets = [
            (
                "alerts",
                "slack_webhook_url",
                "https://hooks.slack.com/services/T0/B0/SlackS3cr3t",
            ),
            (
                "alerts",
                "webhook_url",
                "https://hooks.example.com/h?token=W3bh00kS3cr3t",
            ),
            ("alerts", "pagerduty_routing_key", "R0ut1ngK3yS3cr3t"),
            (
                "alerts",
                "pagerduty_url",
                "https://pd:PdPassS3cr3t@events.example.com/v2/enqueue",
            ),
            (
                "alerts",
                "github_api_url",
                "https://gh:GhPassS3cr3t@api.example.com",
            ),
            (
                "fleet",
                "consul_addr",
                "http://c:ConsulS3cr3t@127.0.0.1:8500",
            ),
            (
                "database",
                "url",
                "postgres://app:DbPassS3cr3t@db/app?sslmode=require",
            ),
        ];
        let mut text = String::new();
        for section in ["alerts", "fleet", "database"] {
            text.push_str(&format!("[{section}]\n"));
            for (_, k, v) in secrets.iter().filter(|(s, _, _)| *s == section) {
                text.push_str(&format!("{k} = \"{v}\"\n"));
            }
            if section == "fleet" {
                text.push_str("consul_service = \"web\"\n");
            }
            if section == "database" {
                text.push_str(
                    "urls = [\"redis://:RedisS3cr3t@127.0.0.1:6379/0\", \"mysql://127.0.0.1\"]\n",
                );
            }
        }
        let l = loaded(&text);
        let out = l.effective_toml().unwrap();
        assert!(!out.contains("S3cr3t"), "{out}");
        let back = Config::parse(&out, "effective").unwrap();
        assert_eq!(back, l.config.redacted().unwrap());
        // What is configured still shows: where alerts go, which database, as whom.
        assert_eq!(back.alerts.slack_webhook_url, "https://hooks.slack.com/…");
        assert_eq!(back.alerts.pagerduty_routing_key, HIDDEN);
        assert_eq!(
            back.alerts.pagerduty_url,
            "https://pd@events.example.com/v2/enqueue"
        );
        assert_eq!(back.database.url, "postgres://app@db/app?sslmode=require");
        assert_eq!(back.database.urls[0], "redis://127.0.0.1:6379/0");
        assert_eq!(back.database.urls[1], "mysql://127.0.0.1");
        assert_eq!(back.fleet.consul_addr, "http://c@127.0.0.1:8500");
        // Nothing else changed.
        let mut expected = l.config.clone();
        expected.alerts = back.alerts.clone();
        expected.database.url = back.database.url.clone();
        expected.database.urls = back.database.urls.clone();
        expected.fleet.consul_addr = back.fleet.consul_addr.clone();
        assert_eq!(back, expected);
    }

    #[test]
    fn effective_config_says_where_secrets_come_from_never_their_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health-agent.toml");
        std::fs::write(&path, "[database]\nurl_env = \"DATABASE_URL\"\n").unwrap();
        let env = |var: &str| match var {
            "SLACK_WEBHOOK_URL" => {
                Some("https://hooks.slack.com/services/T0/B0/SlackS3cr3t".into())
            }
            "DATABASE_URL" => Some("postgres://app:DbS3cr3t@127.0.0.1:5432/app".into()),
            _ => None,
        };
        let loaded = Config::load_all_with(&path, &env).unwrap();
        assert!(loaded
            .config
            .alerts
            .slack_webhook_url
            .ends_with("SlackS3cr3t"));
        assert!(loaded.config.database.url.contains("DbS3cr3t"));
        let out = loaded.effective_toml().unwrap();
        assert!(
            !out.contains("S3cr3t") && !out.contains("127.0.0.1"),
            "{out}"
        );
        for line in [
            "alerts.slack_webhook_url: from the environment variable SLACK_WEBHOOK_URL",
            "database.url: from the environment variable DATABASE_URL (database.url_env)",
            "alerts.webhook_url: not set (HEALTH_AGENT_WEBHOOK_URL is unset or blank)",
        ] {
            assert!(out.contains(line), "{line}:\n{out}");
        }
        // The body is the files as written: it parses back to them, with no secret in it.
        assert_eq!(Config::parse(&out, "effective").unwrap(), loaded.written);
    }
}
