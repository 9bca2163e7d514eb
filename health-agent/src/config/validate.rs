//! Validation beyond the types serde checks: the bounds table first (bounds.rs), then the
//! cross-checks — keys that go together or exclude each other, addresses, paths, database URLs,
//! and alert URLs that carry secrets. Errors name the key and never echo a secret value.

use std::{net::SocketAddr, time::Duration};

use super::{bounds, loopback::secret_url, validate_url, Config, ConfigError};

/// The key at fault and what is wrong with it.
type Bad = (&'static str, String);

impl Config {
    /// Every key against its bounds, then what no one key can check alone: keys that go
    /// together or exclude each other, addresses, paths and URLs. The first error wins.
    pub(super) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |(key, message): Bad| ConfigError::Invalid {
            path: path.to_string(),
            // Config::parse, which has the text, finds it.
            line: None,
            key,
            message,
        };
        // First: the cross-checks below may multiply these values.
        bounds::check(self).map_err(bad)?;
        self.web_and_fleet().map_err(bad)?;
        self.database_and_probe().map_err(bad)?;
        self.listeners_and_lists().map_err(bad)?;
        super::env::check_names(self).map_err(bad)?;
        self.alerts_and_cloudwatch().map_err(bad)
    }

    /// The boot status, where the backend is looked for, and how peers are found.
    fn web_and_fleet(&self) -> Result<(), Bad> {
        if !matches!(self.checks.boot_status, 200 | 503) {
            return Err((
                "checks.boot_status",
                format!("must be 503 or 200, got {}", self.checks.boot_status),
            ));
        }
        if !self.web.container.is_empty() && !self.web.netns.is_empty() {
            return Err((
            "web.netns",
            "set web.container or web.netns, not both (a container's namespace is found through Docker)".into(),
        ));
        }
        // In the agent's own namespace, its own port is not the backend's: it would watch
        // itself, see its own checks as the traffic, and 503 when it is busy.
        if self.web.port != 0
            && self.web.port == self.server.listen.port()
            && self.web.container.is_empty()
            && self.web.netns.is_empty()
        {
            return Err((
                "web.port",
                format!(
                    "is {}, the agent's own port (server.listen = \"{}\"): set web.port to your \
                     app's listen port, or move server.listen",
                    self.web.port, self.server.listen
                ),
            ));
        }
        if !self.web.netns.is_empty() && !self.web.netns.starts_with('/') {
            return Err((
                "web.netns",
                format!(
                    "{:?} must be an absolute path such as /var/run/netns/NAME or /proc/PID/ns/net",
                    self.web.netns
                ),
            ));
        }
        let name = &self.fleet.name;
        if name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err((
                "fleet.name",
                format!(
                    "{name:?} must be at most 64 letters, digits, '.', '_' or '-': it is part of \
                     the fleet's incident keys"
                ),
            ));
        }
        if self.fleet.consul_addr.is_empty() != self.fleet.consul_service.is_empty() {
            return Err((
                "fleet.consul_service",
                "fleet.consul_addr and fleet.consul_service go together".into(),
            ));
        }
        let refresh = self.fleet.peers_refresh;
        if !(PEERS_REFRESH_MIN..=PEERS_REFRESH_MAX).contains(&refresh) {
            return Err((
                "fleet.peers_refresh",
                format!(
                    "= \"{}\" must be between 5s and 1h: every instance lists its group this \
                 often, and AWS throttles the Describe calls of a large group listed faster",
                    humantime::format_duration(refresh)
                ),
            ));
        }
        if !self.drain.aws_endpoint.is_empty() {
            super::cloudwatch::endpoint(&self.drain.aws_endpoint)
                .map_err(|m| ("drain.aws_endpoint", m.to_string()))?;
        }
        for (key, path) in [
            ("drain.control_socket", &self.drain.control_socket),
            ("drain.state_file", &self.drain.state_file),
        ] {
            if !path.is_absolute() {
                return Err((key, format!("{} must be an absolute path", path.display())));
            }
        }
        if !self.fleet.aws_endpoint.is_empty() {
            super::cloudwatch::endpoint(&self.fleet.aws_endpoint)
                .map_err(|m| ("fleet.aws_endpoint", m.to_string()))?;
        }
        for peer in &self.fleet.peers {
            if let Err(why) = crate::fleet::addr::check(peer) {
                return Err((
                    "fleet.peers",
                    format!(
                        "{:?} {why}: each entry is host:port (the peer agent's health port), \
                         the host an IPv4 address, [IPv6] or a DNS name",
                        crate::fleet::addr::shown(peer)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Database URLs, the staleness bound, the probe's path.
    fn database_and_probe(&self) -> Result<(), Bad> {
        if self.database.urls.iter().any(|u| u.trim().is_empty()) {
            return Err(("database.urls", "entries must not be empty".into()));
        }
        for (key, url) in self.database.all_urls() {
            if let Err(message) = validate_url(url) {
                let key = if key == "database.url" {
                    "database.url"
                } else {
                    "database.urls"
                };
                return Err((key, message.to_string()));
            }
        }
        if self.checks.stale_after < self.checks.interval.saturating_mul(2) {
            return Err((
                "checks.stale_after",
                "must be at least twice checks.interval".into(),
            ));
        }
        if !self.web.probe_path.is_empty() && !self.web.probe_path.starts_with('/') {
            return Err((
                "web.probe_path",
                format!(
                    "must start with '/' (or be \"\" to disable), got {:?}",
                    self.web.probe_path
                ),
            ));
        }
        let host = &self.web.probe_host;
        if host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
        {
            return Err((
                "web.probe_host",
                format!("must be a host name, optionally with :port, got {host:?}"),
            ));
        }
        Ok(())
    }

    /// The agent-check listener, disk paths, container labels.
    fn listeners_and_lists(&self) -> Result<(), Bad> {
        let agent_check = self.server.agent_check_listen.trim();
        if !agent_check.is_empty() {
            match agent_check.parse::<SocketAddr>() {
                Ok(a) if a.port() == 0 => {
                    return Err((
                        "server.agent_check_listen",
                        format!("{agent_check:?} needs a port other than 0"),
                    ))
                }
                Ok(a) if a == self.server.listen => {
                    return Err((
                        "server.agent_check_listen",
                        format!(
                            "{agent_check:?} is server.listen: the agent check needs its own port"
                        ),
                    ))
                }
                Ok(_) => {}
                Err(_) => {
                    return Err((
                        "server.agent_check_listen",
                        format!(
                        "{agent_check:?} must be ADDR:PORT, e.g. \"0.0.0.0:8081\" or \"[::]:8081\" \
                         (an IP address, not a host name), or \"\" for off"
                    ),
                    ))
                }
            }
        }
        if self.disk.paths.iter().any(|p| !p.starts_with('/')) {
            return Err(("disk.paths", "entries must be absolute paths".into()));
        }
        for l in &self.containers.labels {
            if l.trim().is_empty() || l.starts_with('=') {
                return Err((
                    "containers.labels",
                    format!("{l:?} is not key or key=value"),
                ));
            }
        }
        let c = &self.containers;
        if !c.docker_host.is_empty() && !c.containerd_socket.is_empty() {
            return Err((
                "containers.containerd_socket",
                "set docker_host (the Engine API: Docker, Podman) or containerd_socket, not both"
                    .into(),
            ));
        }
        if !c.containerd_socket.is_empty()
            && !c
                .containerd_socket
                .trim_start_matches("unix://")
                .starts_with('/')
        {
            return Err((
                "containers.containerd_socket",
                format!(
                    "{:?} must be an absolute path such as /run/containerd/containerd.sock",
                    c.containerd_socket
                ),
            ));
        }
        if c.containerd_namespaces.iter().any(|n| n.trim().is_empty()) {
            return Err((
                "containers.containerd_namespaces",
                "entries must be namespace names such as \"k8s.io\"".into(),
            ));
        }
        Ok(())
    }

    /// Alert destinations (secrets: errors name the key, never the value) and CloudWatch.
    fn alerts_and_cloudwatch(&self) -> Result<(), Bad> {
        let repo = &self.alerts.github_repo;
        let valid_repo = repo.split_once('/').is_some_and(|(o, n)| {
            let ok = |p: &str| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            };
            ok(o) && ok(n)
        });
        if !repo.is_empty() && !valid_repo {
            return Err((
                "alerts.github_repo",
                format!("must be owner/name, got {repo:?}"),
            ));
        }
        // Webhook URLs and keys are secrets: errors name the key, never echo the value. Over
        // plain http:// they would cross the network in clear; loopback stays on the host.
        for (key, v, optional) in [
            (
                "alerts.slack_webhook_url",
                &self.alerts.slack_webhook_url,
                true,
            ),
            ("alerts.webhook_url", &self.alerts.webhook_url, true),
            ("alerts.pagerduty_url", &self.alerts.pagerduty_url, false),
            ("alerts.github_api_url", &self.alerts.github_api_url, false),
        ] {
            if !(optional && v.is_empty()) {
                secret_url(v).map_err(|m| (key, m.into()))?;
            }
        }
        super::cloudwatch::validate(&self.scaling.cloudwatch)
            .map_err(|(k, m)| (k, m.to_string()))?;
        Ok(())
    }
}

/// How often the auto-scaling group is listed (`fleet.peers_refresh`).
const PEERS_REFRESH_MIN: Duration = Duration::from_secs(5);
const PEERS_REFRESH_MAX: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    fn err(toml: &str) -> String {
        Config::parse(toml, "x.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_fleets_name_is_a_key_part() {
        let c = Config::parse("[fleet]\nname = \"shop-eu.1_a\"\n", "x").unwrap();
        assert_eq!(c.fleet.name, "shop-eu.1_a");
        for bad in ["shop/eu", "shop eu", "ß"] {
            let e = err(&format!("[fleet]\nname = \"{bad}\"\n"));
            assert!(e.contains("`fleet.name`"), "{e}");
        }
    }

    #[test]
    fn a_static_peer_is_host_colon_port_and_nothing_more() {
        let c = Config::parse(
            "[fleet]\npeers = [\"10.0.0.3:8080\", \"[::1]:8080\", \"web-1.internal:8080\"]\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.fleet.peers.len(), 3);
        for (bad, why) in [
            ("http://x:1/y", "scheme"),
            ("a b:1", "whitespace"),
            ("x:0", "port"),
            ("x:99999", "port"),
            ("\\u001b[31mx:1", "control character"),
        ] {
            let e = err(&format!("[fleet]\npeers = [\"{bad}\"]\n"));
            assert!(e.contains("`fleet.peers`") && e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\x1b'), "{e:?}");
        }
    }

    #[test]
    fn fleet_peers_from_asg_is_a_source_with_its_refresh_and_endpoint_checked() {
        let c = Config::parse("[fleet]\npeers_from = \"asg\"\n", "x").unwrap();
        assert!(c.fleet.enabled() && c.fleet.from_asg());
        let c = Config::parse("[fleet]\npeers_from = \"\"\n", "x").unwrap();
        assert!(!c.fleet.enabled());
        let e = err("[fleet]\npeers_from = \"ec2\"\n");
        assert!(e.contains("peers_from") && e.contains("asg"), "{e}");
        let e = err("[fleet]\npeers_from = \"asg\"\npeers_refresh = \"1s\"\n");
        assert!(
            e.contains("`fleet.peers_refresh`") && e.contains("5s"),
            "{e}"
        );
        let e = err("[fleet]\naws_endpoint = \"http://autoscaling.example.com\"\n");
        assert!(
            e.contains("`fleet.aws_endpoint`") && e.contains("https://"),
            "{e}"
        );
        Config::parse(
            "[fleet]\npeers_from = \"asg\"\npeers_refresh = \"5s\"\n\
             aws_endpoint = \"http://127.0.0.1:5000\"\n",
            "x",
        )
        .unwrap();
    }

    #[test]
    fn secret_urls_need_https_unless_loopback() {
        for key in [
            "slack_webhook_url",
            "webhook_url",
            "pagerduty_url",
            "github_api_url",
        ] {
            let e = err(&format!(
                "[alerts]\n{key} = \"http://hooks.example.com/services/T1/B2/s3cr3t?token=t0k\"\n"
            ));
            assert!(e.contains(&format!("`alerts.{key}`")), "{e}");
            assert!(e.contains("https://"), "{e}");
            assert!(!e.contains("s3cr3t") && !e.contains("t0k"), "{e}");
            for ok in [
                "https://hooks.example.com/x",
                "http://127.0.0.1:9/x",
                "http://127.8.9.10/x",
                "http://[::1]:8080/x",
                "http://localhost:8080/x",
                "http://LOCALHOST/x",
            ] {
                Config::parse(&format!("[alerts]\n{key} = \"{ok}\"\n"), "x")
                    .unwrap_or_else(|e| panic!("{key} = {ok}: {e}"));
            }
            for bad in [
                "http://127.0.0.1.evil.com/x",
                "http://[::2]/x",
                "ftp://127.0.0.1/x",
            ] {
                let e = err(&format!("[alerts]\n{key} = \"{bad}\"\n"));
                assert!(e.contains(&format!("`alerts.{key}`")), "{bad}: {e}");
            }
        }
    }
}
