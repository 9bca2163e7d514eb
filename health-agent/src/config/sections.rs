//! The configuration's sections, one serde struct each with its defaults. Every field is
//! defaulted (an empty file is valid) and unknown keys are refused; `default.toml` documents
//! the same defaults, and a test keeps the two equal.

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    dur,
    web_modes::{AcceptTracing, KernelTier, ProbeScheme, SocketTracing},
};

/// The peers this instance compares its faults with (fleet-aware verdicts). Empty: judge
/// alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// The fleet's name in its shared incidents' keys (`alerts::fleet::name`): the same on
    /// every agent of the fleet.
    pub name: String,
    /// Peer agents, `host:port` (their health port).
    pub peers: Vec<String>,
    /// A DNS name whose A/AAAA records are the peers, `name` or `name:port` (the port defaults
    /// to this agent's own); resolved again every round.
    pub peers_dns: String,
    /// The Consul agent's HTTP address and the service whose catalog entries are the peers.
    pub consul_addr: String,
    pub consul_service: String,
    /// `asg`: also the members of this instance's auto-scaling group (its InService instances'
    /// private addresses, at this agent's own port), listed through the AWS API every
    /// `peers_refresh`.
    pub peers_from: PeersFrom,
    #[serde(with = "dur")]
    pub peers_refresh: Duration,
    /// "" = `AWS_ENDPOINT_URL_AUTO_SCALING` / `_EC2`, `AWS_ENDPOINT_URL`, else each service's
    /// regional endpoint; else one URL for both the Auto Scaling and the EC2 calls (a test
    /// server such as moto).
    pub aws_endpoint: String,
    /// A file holding the fleet key(s), one per line: the first signs, every one listed is
    /// accepted (a rotation holds two). Owned by root (or the agent's user), no group or other
    /// permission bits. "" = the variable `key_env` names.
    pub key_file: String,
    /// The variable holding the fleet key(s), separated by commas or whitespace, when
    /// `key_file` is "". The key authenticates both directions of the peer exchange; without
    /// one no peer is counted and the peer view is closed. (`token_env`, its former name, is
    /// read as it.)
    #[serde(alias = "token_env")]
    pub key_env: String,
    /// The variable holding a Consul ACL token, sent as `X-Consul-Token`; "" = none.
    pub consul_token_env: String,
    /// Or a file holding it (its first line); "" = none.
    pub consul_token_file: String,
    /// Peers asked per round; a larger fleet is sampled at random.
    pub sample: usize,
    #[serde(with = "dur")]
    pub interval: Duration,
    /// Per peer request: a slower peer is not waited for.
    #[serde(with = "dur")]
    pub timeout: Duration,
    /// How long a fault waits for fresh word from peers whose latest evidence predates it (no
    /// 503 meanwhile); after that they are left out of the count. "0s" = derived from the
    /// check cadences: 2 × checks.interval + web.probe_timeout + fleet.timeout, at least 5 s.
    #[serde(with = "dur")]
    pub confirm_within: Duration,
    /// The instance type latency is compared by (`web.slow_vs_peers`: like with like in a
    /// mixed-instances group); "" = the EC2 type the firmware names, else the processors.
    pub instance_type: String,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            peers: Vec::new(),
            peers_dns: String::new(),
            consul_addr: String::new(),
            consul_service: String::new(),
            peers_from: PeersFrom::Nothing,
            peers_refresh: Duration::from_secs(60),
            aws_endpoint: String::new(),
            key_file: String::new(),
            key_env: "HEALTH_AGENT_FLEET_KEY".into(),
            consul_token_env: String::new(),
            consul_token_file: String::new(),
            sample: 5,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            confirm_within: Duration::ZERO,
            instance_type: String::new(),
        }
    }
}

impl FleetConfig {
    pub fn enabled(&self) -> bool {
        !self.peers.is_empty()
            || !self.peers_dns.is_empty()
            || !self.consul_addr.is_empty()
            || self.peers_from != PeersFrom::Nothing
    }

    /// Whether the auto-scaling group's members are peers (`peers_from = "asg"`).
    pub fn from_asg(&self) -> bool {
        self.peers_from == PeersFrom::Asg
    }
}

/// A source of peers beyond the static list, DNS and Consul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PeersFrom {
    /// None: `peers_from = ""`.
    #[default]
    #[serde(rename = "")]
    Nothing,
    /// The instance's own auto-scaling group: `peers_from = "asg"`.
    #[serde(rename = "asg")]
    Asg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Details {
    Always,
    Loopback,
    Token,
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
    /// The probe's Host header (and, over TLS, the name the certificate is checked against):
    /// a host the app serves, for apps that check it (Rails' host authorization). Empty: the
    /// address probed (`127.0.0.1:9000`).
    pub probe_host: String,
    /// What the port serves: `http`, or `https` for a backend that serves only TLS.
    pub probe_scheme: ProbeScheme,
    /// Over TLS, check the backend's certificate (the system's CAs, the name `probe_host` or
    /// the address probed). false: any certificate, e.g. a self-signed one on loopback.
    pub probe_tls_verify: bool,
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
    /// `auto`, or a tier forced lower (`sock_diag`, `no_ebpf`; `full` fails to load where the
    /// kernel lacks it, and the agent says so).
    pub kernel_tier: KernelTier,
    pub accept_tracing: AcceptTracing,
    pub socket_tracing: SocketTracing,
    pub max_connections_tracked: u32,
    pub container: String,
    /// The backend's network namespace, for runtimes other than Docker: `/var/run/netns/NAME`
    /// or `/proc/PID/ns/net`. Empty: the agent's own (or `container`'s).
    pub netns: String,
    pub restart_command: String,
    /// The backend's concurrency (Puma: workers × max threads): the capacity the saturation
    /// number's web part is measured against. 0 = learn it.
    pub workers: u32,
    /// The window over which the 5xx share of real answers is taken.
    #[serde(with = "dur")]
    pub errors_window: Duration,
    /// A 5xx share of real answers at or above this (with `error_min_answers`) is `erroring`.
    pub error_share: f64,
    /// Fewer real answers than this in the window judge nothing: the share is only shown.
    pub error_min_answers: u32,
    /// With `[fleet]`: slow against its peers at this ratio of medians (`fleet::latency`).
    pub slow_vs_peers: f64,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            port: 0,
            probe_path: "/up".into(),
            probe_timeout: Duration::from_secs(2),
            probe_host: String::new(),
            probe_scheme: ProbeScheme::Http,
            probe_tls_verify: true,
            hung_after: Duration::from_secs(2),
            unanswered_after: Duration::from_secs(10),
            slow_after: Duration::from_secs(1),
            latency_window: Duration::from_secs(60),
            eval_interval: Duration::from_millis(250),
            kernel: true,
            kernel_tier: KernelTier::Auto,
            accept_tracing: AcceptTracing::OnStall,
            socket_tracing: SocketTracing::OnSuspicion,
            max_connections_tracked: health_common::DEFAULT_MAX_CONNS,
            container: String::new(),
            netns: String::new(),
            restart_command: String::new(),
            workers: 0,
            errors_window: Duration::from_secs(10),
            error_share: 0.5,
            error_min_answers: 10,
            slow_vs_peers: 3.0,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainersConfig {
    pub names: Vec<String>,
    pub labels: Vec<String>,
    /// The Engine API's address (Docker's or Podman's); "" finds an engine (`engine::address`).
    pub docker_host: String,
    /// containerd's socket, to use its API instead of the Engine API; "" finds an engine.
    pub containerd_socket: String,
    /// containerd namespaces looked in, in order; empty: `k8s.io`, then `default`.
    pub containerd_namespaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// One database URL ("" = none); `urls` adds more. All of them are checked.
    pub url: String,
    /// A variable holding the database URL when `url` is not written ("" = none).
    pub url_env: String,
    /// The variable `url` was taken from, when it was (set by config/env.rs, never read from a
    /// file): messages about the URL name it instead of `database.url`.
    #[serde(skip)]
    pub url_from: Option<String>,
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

    /// How messages name `url`: `database.url`, or the variable it was taken from.
    pub fn url_shown_as(&self) -> String {
        match &self.url_from {
            Some(var) => format!("{var} (database.url_env)"),
            None => "database.url".into(),
        }
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            url_env: String::new(),
            url_from: None,
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
    /// Saturation at or above this: `scale_up`.
    pub up_at: f64,
    /// Saturation at or below this, with nothing degraded: `scale_down`.
    pub down_at: f64,
    pub cloudwatch: CloudWatchConfig,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            cpu_high_percent: 85.0,
            memory_high_percent: 90.0,
            cpu_low_percent: 10.0,
            memory_low_percent: 30.0,
            up_at: 0.8,
            down_at: 0.3,
            cloudwatch: CloudWatchConfig::default(),
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
    /// Replace one stuck worker of a pre-fork server (SIGTERM, SIGKILL after a grace) when its
    /// parent, the master, holds the listener too and can run: the master starts a new one.
    /// Never the master, never a process without such a parent; counted in the restart budget.
    pub replace_workers: bool,
}

impl Default for HealConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_restarts: 3,
            window: Duration::from_secs(600),
            timeout: Duration::from_secs(30),
            replace_workers: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// Each secret here, when not written, comes from the variable its `_env` key names
    /// (config/env.rs).
    pub slack_webhook_url: String,
    pub slack_webhook_url_env: String,
    pub pagerduty_routing_key: String,
    pub pagerduty_routing_key_env: String,
    pub pagerduty_url: String,
    pub github_repo: String,
    pub github_token_env: String,
    pub github_api_url: String,
    pub webhook_url: String,
    pub webhook_url_env: String,
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
            slack_webhook_url_env: "SLACK_WEBHOOK_URL".into(),
            pagerduty_routing_key: String::new(),
            pagerduty_routing_key_env: "PAGERDUTY_ROUTING_KEY".into(),
            pagerduty_url: "https://events.pagerduty.com/v2/enqueue".into(),
            github_repo: String::new(),
            github_token_env: "GITHUB_TOKEN".into(),
            github_api_url: "https://api.github.com".into(),
            webhook_url: String::new(),
            webhook_url_env: "HEALTH_AGENT_WEBHOOK_URL".into(),
            resolve_after: Duration::from_secs(60),
            max_retries: 5,
            timeout: Duration::from_secs(10),
            queue_size: 256,
        }
    }
}

/// `[scaling.cloudwatch]`: the saturation published as a CloudWatch metric, for target
/// tracking. Checked by cloudwatch.rs (CloudWatch's own rules for names and values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudWatchConfig {
    pub enabled: bool,
    pub namespace: String,
    pub metric: String,
    /// The `AutoScalingGroupName` dimension; "" = the instance's own group, from its metadata.
    pub auto_scaling_group: String,
    /// "" = `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's, else the instance metadata.
    pub region: String,
    /// "" = `AWS_ENDPOINT_URL_CLOUDWATCH`, `AWS_ENDPOINT_URL`, else
    /// `https://monitoring.<region>.amazonaws.com` (aws::endpoint).
    pub endpoint: String,
    #[serde(with = "dur")]
    pub interval: Duration,
    pub high_resolution: bool,
    /// Per HTTP request (metadata and PutMetricData).
    #[serde(with = "dur")]
    pub timeout: Duration,
    /// Per batch, on connection errors, timeouts, throttling and 5xx.
    pub max_retries: u32,
}

impl Default for CloudWatchConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            namespace: "HealthAgent".into(),
            metric: "Saturation".into(),
            auto_scaling_group: String::new(),
            region: String::new(),
            endpoint: String::new(),
            interval: Duration::from_secs(60),
            high_resolution: false,
            timeout: Duration::from_secs(5),
            max_retries: 3,
        }
    }
}

/// `[drain]`: `health-agent drain` / `undrain` through a local control socket, the state kept
/// across agent restarts, and the auto-scaling group's termination hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// The Unix socket `drain` and `undrain` talk to (mode 0600: root only).
    pub control_socket: std::path::PathBuf,
    /// Where a drain is kept until undrain, so it survives an agent restart.
    pub state_file: std::path::PathBuf,
    /// The group's lifecycle hook for `autoscaling:EC2_INSTANCE_TERMINATING`; "" = off.
    pub lifecycle_hook: String,
    /// How often IMDSv2's `autoscaling/target-lifecycle-state` is read.
    #[serde(with = "dur")]
    pub lifecycle_poll: Duration,
    /// The drain the hook starts: quiet for this long ...
    #[serde(with = "dur")]
    pub lifecycle_quiet: Duration,
    /// ... at most this long, then CONTINUE anyway.
    #[serde(with = "dur")]
    pub lifecycle_timeout: Duration,
    /// The group's name; "" = the instance's own, from its metadata.
    pub auto_scaling_group: String,
    /// "" = `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's, else the instance metadata.
    pub region: String,
    /// "" = `AWS_ENDPOINT_URL_AUTO_SCALING`, `AWS_ENDPOINT_URL`, else
    /// `https://autoscaling.<region>.amazonaws.com`; else a test server such as moto.
    pub aws_endpoint: String,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            control_socket: "/run/health-agent/control.sock".into(),
            state_file: "/var/lib/health-agent/drain.json".into(),
            lifecycle_hook: String::new(),
            lifecycle_poll: Duration::from_secs(5),
            lifecycle_quiet: Duration::from_secs(2),
            lifecycle_timeout: Duration::from_secs(120),
            auto_scaling_group: String::new(),
            region: String::new(),
            aws_endpoint: String::new(),
        }
    }
}
