//! The TOML configuration: every field defaulted (an empty file is valid), unknown keys
//! rejected, durations as human strings ("2s", "10m"). `DEFAULT_TOML` is the commented file
//! `health-agent config --dump` prints; a test keeps it equal to `Config::default()`.

use std::{net::SocketAddr, path::Path, time::Duration};

use serde::{Deserialize, Serialize};

mod validate;
pub use validate::world_readable_warning;

pub const DEFAULT_PATH: &str = "/etc/health-agent/health-agent.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: `{key}` {message}")]
    Invalid {
        path: String,
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

/// The peers this instance compares its faults with (fleet-aware verdicts). Empty: judge
/// alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// Peer agents, `host:port` (their health port).
    pub peers: Vec<String>,
    /// A DNS name whose A/AAAA records are the peers, `name` or `name:port` (the port defaults
    /// to this agent's own); resolved again every round.
    pub peers_dns: String,
    /// The Consul agent's HTTP address and the service whose catalog entries are the peers.
    pub consul_addr: String,
    pub consul_service: String,
    /// Env var holding the shared bearer token of the peer endpoint; empty: no token.
    pub token_env: String,
    /// Peers asked per round; a larger fleet is sampled at random.
    pub sample: usize,
    #[serde(with = "dur")]
    pub interval: Duration,
    /// Per peer request: a slower peer is not waited for.
    #[serde(with = "dur")]
    pub timeout: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            peers: Vec::new(),
            peers_dns: String::new(),
            consul_addr: String::new(),
            consul_service: String::new(),
            token_env: String::new(),
            sample: 5,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
        }
    }
}

impl FleetConfig {
    pub fn enabled(&self) -> bool {
        !self.peers.is_empty() || !self.peers_dns.is_empty() || !self.consul_addr.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Details {
    Always,
    Loopback,
    Token,
}

/// When the accept()/accept4() syscall tracepoints are attached. Any syscall tracepoint sends
/// every syscall of every process on the host through the kernel's tracing slow path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptTracing {
    /// Only while a connection has waited unclaimed in the accept queue (a suspected hang)
    /// and for a while after; otherwise claims seen by the send/receive hooks show progress.
    OnStall,
    /// All the time: exact accept counts, at a cost to every syscall on the host.
    Always,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub details: Details,
    pub token_env: String,
    #[serde(with = "dur")]
    pub request_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_client: u32,
    pub threads: usize,
    /// HAProxy agent-check listener, "ADDR:PORT"; empty: off. Parsed by `agent_check_addr`.
    pub agent_check_listen: String,
}

impl ServerConfig {
    /// The agent-check listen address, or None when it is off. Validation has already refused
    /// anything that does not parse.
    pub fn agent_check_addr(&self) -> Option<SocketAddr> {
        self.agent_check_listen.trim().parse().ok()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            details: Details::Loopback,
            token_env: "HEALTH_AGENT_TOKEN".into(),
            request_timeout: Duration::from_secs(5),
            max_connections: 1024,
            max_connections_per_client: 64,
            threads: 0,
            agent_check_listen: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChecksConfig {
    #[serde(with = "dur")]
    pub interval: Duration,
    #[serde(with = "dur")]
    pub timeout: Duration,
    #[serde(with = "dur")]
    pub boot_grace: Duration,
    /// The HTTP code while booting and the web backend has not served yet: 503 (not ready;
    /// the scaling group's grace period keeps the instance) or 200 (groups without one).
    pub boot_status: u16,
    #[serde(with = "dur")]
    pub stale_after: Duration,
    #[serde(with = "dur")]
    pub fail_after: Duration,
    #[serde(with = "dur")]
    pub recover_after: Duration,
}

impl Default for ChecksConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            boot_grace: Duration::from_secs(120),
            boot_status: 503,
            stale_after: Duration::from_secs(10),
            fail_after: Duration::ZERO,
            recover_after: Duration::from_secs(4),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    pub port: u16,
    pub probe_path: String,
    #[serde(with = "dur")]
    pub probe_timeout: Duration,
    #[serde(with = "dur")]
    pub hung_after: Duration,
    #[serde(with = "dur")]
    pub unanswered_after: Duration,
    #[serde(with = "dur")]
    pub slow_after: Duration,
    #[serde(with = "dur")]
    pub latency_window: Duration,
    #[serde(with = "dur")]
    pub eval_interval: Duration,
    pub kernel: bool,
    pub accept_tracing: AcceptTracing,
    pub max_connections_tracked: u32,
    pub container: String,
    /// The backend's network namespace, for runtimes other than Docker: `/var/run/netns/NAME`
    /// or `/proc/PID/ns/net`. Empty: the agent's own (or `container`'s).
    pub netns: String,
    pub restart_command: String,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            port: 0,
            probe_path: "/up".into(),
            probe_timeout: Duration::from_secs(2),
            hung_after: Duration::from_secs(2),
            unanswered_after: Duration::from_secs(10),
            slow_after: Duration::from_secs(1),
            latency_window: Duration::from_secs(60),
            eval_interval: Duration::from_millis(250),
            kernel: true,
            accept_tracing: AcceptTracing::OnStall,
            max_connections_tracked: health_common::DEFAULT_MAX_CONNS,
            container: String::new(),
            netns: String::new(),
            restart_command: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskConfig {
    pub paths: Vec<String>,
    pub warn_percent: f64,
    pub fail_percent: f64,
}

impl Default for DiskConfig {
    fn default() -> Self {
        Self {
            paths: vec!["/".into()],
            warn_percent: 80.0,
            fail_percent: 90.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainersConfig {
    pub names: Vec<String>,
    pub labels: Vec<String>,
    pub docker_host: String,
}

impl Default for ContainersConfig {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            labels: Vec::new(),
            docker_host: "unix:///var/run/docker.sock".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// One database URL ("" = none); `urls` adds more. All of them are checked.
    pub url: String,
    pub urls: Vec<String>,
    #[serde(with = "dur")]
    pub interval: Duration,
    /// Bounds the connect and, separately, the query of each round trip.
    #[serde(with = "dur")]
    pub timeout: Duration,
    #[serde(with = "dur")]
    pub slow_after: Duration,
    /// Consecutive failed round trips before a database is `unreachable`.
    pub fail_after: u32,
    /// Consecutive good round trips before an unreachable database is back.
    pub recover_after: u32,
    pub password_file: String,
}

impl DatabaseConfig {
    /// Every configured URL with the key it came from, `url` first, blanks and repeats dropped.
    pub fn all_urls(&self) -> Vec<(String, &str)> {
        let mut out: Vec<(String, &str)> = Vec::new();
        let listed = std::iter::once(("database.url".to_string(), self.url.as_str())).chain(
            self.urls
                .iter()
                .enumerate()
                .map(|(i, u)| (format!("database.urls[{i}]"), u.as_str())),
        );
        for (key, url) in listed {
            let url = url.trim();
            if !url.is_empty() && !out.iter().any(|(_, seen)| *seen == url) {
                out.push((key, url));
            }
        }
        out
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            urls: Vec::new(),
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            slow_after: Duration::from_secs(1),
            fail_after: 2,
            recover_after: 1,
            password_file: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScalingConfig {
    #[serde(with = "dur")]
    pub window: Duration,
    pub cpu_high_percent: f64,
    pub memory_high_percent: f64,
    pub cpu_low_percent: f64,
    pub memory_low_percent: f64,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            cpu_high_percent: 85.0,
            memory_high_percent: 90.0,
            cpu_low_percent: 10.0,
            memory_low_percent: 30.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealConfig {
    pub enabled: bool,
    pub max_restarts: u32,
    #[serde(with = "dur")]
    pub window: Duration,
    #[serde(with = "dur")]
    pub timeout: Duration,
}

impl Default for HealConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_restarts: 3,
            window: Duration::from_secs(600),
            timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    pub slack_webhook_url: String,
    pub pagerduty_routing_key: String,
    pub pagerduty_url: String,
    pub github_repo: String,
    pub github_token_env: String,
    pub github_api_url: String,
    pub webhook_url: String,
    /// An incident resolves once its condition has been absent this long without a break.
    #[serde(with = "dur")]
    pub resolve_after: Duration,
    /// Retries per message on connect errors, timeouts, 429 and 5xx (backoff 1 s, 2 s, 4 s…).
    pub max_retries: u32,
    /// Per HTTP request.
    #[serde(with = "dur")]
    pub timeout: Duration,
    /// Messages waiting per destination; when full the oldest unsent trigger goes first.
    pub queue_size: usize,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            slack_webhook_url: String::new(),
            pagerduty_routing_key: String::new(),
            pagerduty_url: "https://events.pagerduty.com/v2/enqueue".into(),
            github_repo: String::new(),
            github_token_env: "GITHUB_TOKEN".into(),
            github_api_url: "https://api.github.com".into(),
            webhook_url: String::new(),
            resolve_after: Duration::from_secs(60),
            max_retries: 5,
            timeout: Duration::from_secs(10),
            queue_size: 256,
        }
    }
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
            Err(source) => {
                return Err(ConfigError::Read {
                    path: shown,
                    source,
                })
            }
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
            message: validate::parse_error(text, &e),
        })?;
        cfg.validate(path).map_err(|e| match e {
            ConfigError::Invalid { path, key, message } => ConfigError::Invalid {
                path,
                key,
                message: validate::secrets(&cfg).replace(&message),
            },
            other => other,
        })?;
        Ok(cfg)
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |key, message: String| ConfigError::Invalid {
            path: path.to_string(),
            key,
            message,
        };
        // First: the cross-checks below may multiply these values.
        validate::bounds(self).map_err(|(key, message)| bad(key, message))?;
        if !matches!(self.checks.boot_status, 200 | 503) {
            return Err(bad(
                "checks.boot_status",
                format!("must be 503 or 200, got {}", self.checks.boot_status),
            ));
        }
        if !self.web.container.is_empty() && !self.web.netns.is_empty() {
            return Err(bad(
                "web.netns",
                "set web.container or web.netns, not both (a container's namespace is found through Docker)".into(),
            ));
        }
        if !self.web.netns.is_empty() && !self.web.netns.starts_with('/') {
            return Err(bad(
                "web.netns",
                format!(
                    "{:?} must be an absolute path such as /var/run/netns/NAME or /proc/PID/ns/net",
                    self.web.netns
                ),
            ));
        }
        if self.fleet.consul_addr.is_empty() != self.fleet.consul_service.is_empty() {
            return Err(bad(
                "fleet.consul_service",
                "fleet.consul_addr and fleet.consul_service go together".into(),
            ));
        }
        for peer in &self.fleet.peers {
            let ok = peer.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(bad(
                    "fleet.peers",
                    format!("{peer:?} must be host:port (the peer agent's health port)"),
                ));
            }
        }
        if self.database.urls.iter().any(|u| u.trim().is_empty()) {
            return Err(bad("database.urls", "entries must not be empty".into()));
        }
        for (key, url) in self.database.all_urls() {
            if let Err(message) = crate::dburl::validate_url(url) {
                let key = if key == "database.url" {
                    "database.url"
                } else {
                    "database.urls"
                };
                return Err(bad(key, message.to_string()));
            }
        }
        if self.checks.stale_after < self.checks.interval.saturating_mul(2) {
            return Err(bad(
                "checks.stale_after",
                "must be at least twice checks.interval".into(),
            ));
        }
        if !self.web.probe_path.is_empty() && !self.web.probe_path.starts_with('/') {
            return Err(bad(
                "web.probe_path",
                format!(
                    "must start with '/' (or be \"\" to disable), got {:?}",
                    self.web.probe_path
                ),
            ));
        }
        let agent_check = self.server.agent_check_listen.trim();
        if !agent_check.is_empty() {
            match agent_check.parse::<SocketAddr>() {
                Ok(a) if a.port() == 0 => {
                    return Err(bad(
                        "server.agent_check_listen",
                        format!("{agent_check:?} needs a port other than 0"),
                    ))
                }
                Ok(a) if a == self.server.listen => {
                    return Err(bad(
                        "server.agent_check_listen",
                        format!(
                            "{agent_check:?} is server.listen: the agent check needs its own port"
                        ),
                    ))
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(bad(
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
            return Err(bad("disk.paths", "entries must be absolute paths".into()));
        }
        for l in &self.containers.labels {
            if l.trim().is_empty() || l.starts_with('=') {
                return Err(bad(
                    "containers.labels",
                    format!("{l:?} is not key or key=value"),
                ));
            }
        }
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
            return Err(bad(
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
                validate::secret_url(v).map_err(|m| bad(key, m.into()))?;
            }
        }
        Ok(())
    }
}

/// The documented default configuration, printed by `health-agent config --dump`.
pub const DEFAULT_TOML: &str = r#"# health-agent configuration. Every key is optional; these are the defaults.

[server]
listen = "0.0.0.0:8080"          # the load balancer's HealthCheckPort
details = "loopback"             # who sees full diagnostics: "always" | "loopback" | "token"
token_env = "HEALTH_AGENT_TOKEN" # with details = "token": env var holding the bearer token
request_timeout = "5s"           # reading a request, an idle keep-alive connection, a write the
                                 # client does not read: longer than this and it is closed
max_connections = 1024           # concurrent HTTP connections; beyond it new ones wait (lowered
                                 # to fit the open-files limit, which is raised to its maximum)
max_connections_per_client = 64  # per client address; beyond it new ones are closed at once, so
                                 # one address cannot starve the load balancer's probes
threads = 0                      # HTTP threads, each with its own listener; 0 = one per core
agent_check_listen = ""          # HAProxy agent-check, "ADDR:PORT" (e.g. "0.0.0.0:8081"); "" = off:
                                 # one line per connection, "up ready 80%" / "drain" / "down #why"

[checks]
interval = "2s"                  # snapshot refresh cadence (disk, cpu, memory, probe)
timeout = "5s"                   # each check's own deadline; a hung check is reported, not waited for
boot_grace = "120s"              # after the agent starts: "booting", no restarts; keep the ASG's
                                 # HealthCheckGracePeriod at least this long
boot_status = 503                # while booting and the web backend has not served yet: 503 (not
                                 # ready, the balancer sends nothing); 200 for groups without a
                                 # grace period. Never served once boot_grace is over: 503
stale_after = "10s"              # snapshot older than this: 503, the agent can no longer vouch
fail_after = "0s"                # a 503 condition must hold this long before 503 (web verdicts
                                 # already wait hung_after / unanswered_after)
recover_after = "4s"             # a 503 must be gone this long before 200 again

[web]
port = 0                         # the backend's listen port; 0 = no web check
probe_path = "/up"               # active probe at the listener's own address (127.0.0.1, ::1, a
                                 # specific address; inside its namespace); "" disables it
probe_timeout = "2s"
hung_after = "2s"                # weak evidence of a hang: connections queue and nothing is taken
                                 # or answered for this long (stretched to twice the server's own
                                 # quiet spells); a stopped or frozen server is hung after 0.5 s
unanswered_after = "10s"         # a read request with no response byte anywhere for this long
slow_after = "1s"                # p99 request → first response byte above this: slow
latency_window = "60s"           # sliding window of the latency percentiles
eval_interval = "250ms"          # how often the kernel view is evaluated
kernel = true                    # load the eBPF programs (false: probe + accept queue only)
accept_tracing = "on_stall"      # accept() syscall tracepoints: "on_stall" attaches them only while
                                 # a connection waits unclaimed (they slow every syscall on the
                                 # host); "always" keeps them on for exact accept counts
max_connections_tracked = 16384  # size of the kernel's per-connection LRU table
container = ""                   # optional: the backend's container: its network namespace is
                                 # watched (port = the container's port or a published host
                                 # port), and healing restarts it
netns = ""                       # optional: the backend's network namespace for other runtimes
                                 # (/var/run/netns/NAME, /proc/PID/ns/net)
restart_command = ""             # optional: heal by running this (non-container backends), with
                                 # sh -c in its own process group and only PATH, HOME, LANG, LC_*,
                                 # TZ... of the agent's environment (never its secrets); killed
                                 # with its group after heal.timeout. A server it starts in the
                                 # background must detach: setsid cmd >/dev/null 2>&1 &

[disk]
paths = ["/"]
warn_percent = 80.0
fail_percent = 90.0

[containers]
names = []                       # expected containers by name
labels = []                      # and/or by label, "key=value"
docker_host = "unix:///var/run/docker.sock"

[database]
# postgres:// (or postgresql://) gets a real SELECT 1, redis:// an AUTH (with a password) and
# PING, mysql:// reads the server's handshake without logging in. Postgres runs without TLS:
# sslmode may be "disable" or "prefer" only. Passwords never show in responses or logs.
url = ""                         # e.g. postgres://user@127.0.0.1:5432/db
urls = []                        # more databases, same forms; every one is checked, the worst wins
interval = "30s"                 # its own cadence, cached: never once per /health request
timeout = "5s"                   # bounds the connect and, separately, the query
slow_after = "1s"                # a round trip slower than this: slow (degraded, never 503)
fail_after = 2                   # consecutive failed round trips before "unreachable"
recover_after = 1                # consecutive good round trips before "connected" again
password_file = ""               # used when the URL has no password (and, for Postgres, no
                                 # PGPASSWORD in the environment): its first line

[scaling]
window = "60s"                   # CPU and memory are averaged over this window
cpu_high_percent = 85.0          # sustained above: degraded, scale_up
memory_high_percent = 90.0
cpu_low_percent = 10.0           # sustained below both: scale_down
memory_low_percent = 30.0

[heal]
enabled = true
max_restarts = 3                 # restart budget per window; spent = 503 straight away
window = "10m"
timeout = "30s"                  # how long a restart may take to bring the backend back

[alerts]
# Incidents: infrastructure_issue (recommendation), unhealthy (503), heal_failed. Each sends a
# trigger when it opens and a resolve when it ends; `health-agent alert test` tries them all.
slack_webhook_url = ""           # Slack incoming webhook (a secret)
pagerduty_routing_key = ""       # PagerDuty Events v2 integration key (a secret)
pagerduty_url = "https://events.pagerduty.com/v2/enqueue"
github_repo = ""                 # owner/name: incident issues, deduplicated by fingerprint
github_token_env = "GITHUB_TOKEN" # env var holding the GitHub token (issues: write)
github_api_url = "https://api.github.com"
webhook_url = ""                 # generic JSON webhook: {event, timestamp, hostname, payload}
resolve_after = "60s"            # an incident resolves once its condition has been gone this long
max_retries = 5                  # per message, on connect errors, timeouts, 429 and 5xx
timeout = "10s"                  # per HTTP request
queue_size = 256                 # messages waiting per destination (oldest unsent trigger dropped first)

[fleet]
# Fleet-aware verdicts: each fault is compared with the peers'. Most answering peers fine: this
# instance's own fault, 503 after self-heal. Most have it too: shared (a dependency, a bad
# deploy), 200 infrastructure_issue, no restart. No peers or none answering: judged alone.
peers = []                       # peer agents "host:port" (their health port)
peers_dns = ""                   # or a DNS name (A/AAAA records = peers), "name[:port]"
consul_addr = ""                 # or the Consul catalog: agent address, e.g. http://127.0.0.1:8500
consul_service = ""              # ... and the service name
token_env = ""                   # env var holding the shared bearer token of /fleet/v1/view
sample = 5                       # peers asked per round (a larger fleet is sampled at random)
interval = "2s"                  # a round of asking, off the request path
timeout = "1s"                   # per peer: a slower one is not waited for
"#;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(Config::parse("", "t").unwrap(), Config::default());
    }

    #[test]
    fn readme_shows_the_default_config() {
        let readme = include_str!("../../README.md");
        assert!(
            readme.contains(DEFAULT_TOML.trim_end()),
            "README.md's configuration section differs from DEFAULT_TOML: paste `health-agent config --dump` there"
        );
    }

    #[test]
    fn documented_default_matches_code() {
        assert_eq!(
            Config::parse(DEFAULT_TOML, "dump").unwrap(),
            Config::default()
        );
    }

    #[test]
    fn agent_check_listen_is_off_or_an_address_with_its_own_port() {
        let off = Config::parse("", "x.toml").unwrap();
        assert_eq!(off.server.agent_check_addr(), None);
        let on = Config::parse(
            "[server]\nagent_check_listen = \"127.0.0.1:8081\"\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(
            on.server.agent_check_addr(),
            Some(SocketAddr::from(([127, 0, 0, 1], 8081)))
        );
        for (value, says) in [
            ("localhost:8081", "ADDR:PORT"),
            ("8081", "ADDR:PORT"),
            ("127.0.0.1:0", "port other than 0"),
            ("0.0.0.0:8080", "its own port"),
        ] {
            let err = Config::parse(
                &format!("[server]\nagent_check_listen = \"{value}\"\n"),
                "x.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("server.agent_check_listen"), "{err}");
            assert!(err.contains(says), "{value}: {err}");
        }
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = Config::parse("[web]\nport = 9000\nhung_aftr = \"2s\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("hung_aftr"), "{err}");
        assert!(err.contains("hung_after"), "lists what is allowed: {err}");
    }

    #[test]
    fn bad_duration_says_how() {
        let err = Config::parse("[checks]\ninterval = \"soon\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("\"2s\""), "{err}");
    }

    #[test]
    fn thresholds_are_range_checked() {
        let err = Config::parse("[disk]\nwarn_percent = 95.0\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("disk.warn_percent"), "{err}");
        let err = Config::parse("[disk]\nfail_percent = 120.0\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("between 0 and 100"), "{err}");
        let err = Config::parse("[web]\nprobe_path = \"up\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("web.probe_path"), "{err}");
    }

    #[test]
    fn database_urls_are_validated_without_echoing_passwords() {
        let err = Config::parse("[database]\nurl = \"http://u:Sekr1t@db/x\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`database.url`"), "{err}");
        assert!(
            err.contains("http://u@db/x"),
            "shows the URL redacted: {err}"
        );
        assert!(!err.contains("Sekr1t"), "{err}");
        let err = Config::parse(
            "[database]\nurls = [\"redis://h\", \"postgres://u:Sekr1t@h/db?sslmode=require\"]\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`database.urls`") && err.contains("sslmode"),
            "{err}"
        );
        assert!(!err.contains("Sekr1t"), "{err}");
        for bad in [
            "fail_after = 0",
            "recover_after = 0",
            "urls = [\"\"]",
            "timeout = \"0s\"",
        ] {
            let err = Config::parse(&format!("[database]\n{bad}\n"), "x").unwrap_err();
            assert!(err.to_string().contains("database."), "{bad}: {err}");
        }
        let cfg = Config::parse(
            "[database]\nurl = \"postgres://u@127.0.0.1/db\"\nurls = [\"redis://127.0.0.1:6379/1\", \"mysql://127.0.0.1\", \"postgres://u@127.0.0.1/db\"]\n",
            "x",
        )
        .unwrap();
        let err = Config::parse(
            "[database]\nurll = \"postgres://u:Sekr1t@h/db\"\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("urll") && err.contains("line 2"), "{err}");
        assert!(
            !err.contains("Sekr1t"),
            "a parse error quoting the line: {err}"
        );
        let keys: Vec<String> = cfg
            .database
            .all_urls()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            ["database.url", "database.urls[0]", "database.urls[1]"]
        );
    }

    #[test]
    fn alert_urls_are_checked_without_echoing_them() {
        let err = Config::parse(
            "[alerts]\nslack_webhook_url = \"hooks.slack.com/services/T1/B1/sekrit\"\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("alerts.slack_webhook_url"), "{err}");
        assert!(!err.contains("sekrit"), "{err}");
        let err = Config::parse("[alerts]\npagerduty_url = \"\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("alerts.pagerduty_url"), "{err}");
        let err = Config::parse("[alerts]\ngithub_repo = \"owner/\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("alerts.github_repo"), "{err}");
        let cfg = Config::parse(
            "[alerts]\nwebhook_url = \"http://127.0.0.1:9/x\"\nresolve_after = \"200ms\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(cfg.alerts.resolve_after, Duration::from_millis(200));
    }

    #[test]
    fn durations_round_trip() {
        let cfg = Config::parse("[web]\neval_interval = \"100ms\"\n", "x").unwrap();
        assert_eq!(cfg.web.eval_interval, Duration::from_millis(100));
        let again = Config::parse(&toml::to_string(&cfg).unwrap(), "x").unwrap();
        assert_eq!(again, cfg);
    }
}
