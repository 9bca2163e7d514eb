//! health-agent: a node agent that tells the load balancer, per instance, "send traffic or
//! not" — and the scaling group why. Kernel tracepoints watch the web backend's listen socket
//! and connections; user space merges that with disk, container, database, CPU and memory
//! checks into one cached snapshot served as `GET /health`.
//!
//! Module map: `config` (TOML), `status` (every state enum: the shared vocabulary, a leaf),
//! `dburl` (database URLs: parsing and redaction; a leaf shared by `config` and the database
//! check), `text` (truncation and rounding for display, a leaf), `ebpf` (loader and map reads),
//! `net` (listen sockets without eBPF), `checks` (one module per check), `policy` (the status
//! table, pure), `heal` (self-healing), `docker` (the Engine API client), `runner`
//! (`Checks::build`, the one wiring of every check; background checks, the composer, the
//! supervisor), `snapshot` (what /health serves), `server` (HTTP), `metrics` (OpenMetrics),
//! `oneshot` (`health-agent check`), `alerts` (incidents to Slack, PagerDuty, a webhook and
//! GitHub), `suspicious` (miner and /tmp-executable detection for incident reports),
//! `saturation` (the scaling signal: the estimator and its report), `agent_check` (HAProxy's agent protocol), `sd_notify` (systemd readiness and watchdog).

pub mod agent_check;
pub mod alerts;
pub mod checks;
pub mod cloudwatch;
pub mod config;
pub(crate) mod dburl;
pub(crate) mod docker;
pub(crate) mod ebpf;
pub(crate) mod fleet;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub(crate) mod heal;
pub(crate) mod metrics;
pub(crate) mod net;
pub(crate) mod netns;
pub mod oneshot;
pub(crate) mod policy;
pub mod runner;
pub(crate) mod saturation;
pub mod sd_notify;
pub mod server;
pub(crate) mod snapshot;
pub mod status;
pub(crate) mod suspicious;
pub(crate) mod text;
