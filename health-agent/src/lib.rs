//! health-agent: a node agent that tells the load balancer, per instance, "send traffic or
//! not" — and the scaling group why. Kernel tracepoints watch the web backend's listen socket
//! and connections; user space merges that with disk, container, database, CPU and memory
//! checks into one cached snapshot served as `GET /health`.
//!
//! Module map, from the leaves up (outside tests, a module imports only from those above it):
//! - `status`: every state enum, the shared vocabulary (a leaf);
//! - `text`: truncation, rounding and RFC 3339 timestamps for display (a leaf);
//! - `capped`: an HTTP answer from outside read up to a cap while it streams (a leaf);
//! - `dburl`: database URLs, parsing and redaction (a leaf shared by `config` and the database
//!   check);
//! - `redact`: secrets out of log lines and messages (a leaf used by `config` and `alerts`);
//! - `aws`: AWS without an SDK (`sigv4`, `imds`, `credentials`, `query`, `xml`), for
//!   `cloudwatch` and `fleet`;
//! - `engine`: the container engines' clients (`docker`: the Engine API, Docker's and Podman's;
//!   `containerd`: its gRPC API);
//! - `netns`: network namespaces, where the web backend's sockets live;
//! - `sd_notify`: systemd readiness and watchdog;
//! - `logging`: the log lines (text or JSON; the journal's priority prefixes);
//! - `config`: the TOML file (`sections`, `bounds`, `validate`, `secrets`, `default.toml`);
//! - `ebpf`: the kernel programs' loader and map reads (`load`, `attach`, `read`; `btf`: the BTF
//!   reader; `tracefs`);
//! - `net`: listen sockets and connections without eBPF (sock_diag, /proc);
//! - `suspicious`: miner and /tmp-executable detection for incident reports;
//! - `checks`: one module per check (`web`, `database`, `containers`, `disk`, `system`,
//!   `probe`); the web check's `monitor` loads the kernel view (`load`: the tier), samples
//!   (`steer`: which programs run and when sock_diag reads; `look`: the processes; `evidence`:
//!   the kernel's counts) then judges (`evaluate`, through `verdict`, whose `describe` words
//!   the detail);
//! - `saturation`: the scaling signal S, how full this instance is (the estimator; `report`:
//!   its parts and what is shown);
//! - `policy`: the status table, pure (`rules`: its steps; `flap`: holding a change of HTTP code
//!   back);
//! - `fuzzing`: the parser fuzz targets (tests and the `fuzzing` feature only);
//! - `fleet`: fleet-aware verdicts, each fault compared with the peers' (`exchange`; `asg`: the
//!   auto-scaling group's members as peers);
//! - `heal`: self-healing (`command`, `judge`, `worker`);
//! - `drain`: `health-agent drain` / `undrain` (`watch`: the backend port read while draining;
//!   `judge`: when it is done; `control`: the root-only socket; `lifecycle`: the group's
//!   termination hook);
//! - `snapshot`: what /health serves;
//! - `cloudwatch`: publishing S to CloudWatch (`client`, `publisher`); it reads the snapshot
//!   through the runner, so it imports none;
//! - `alerts`: incidents to Slack, PagerDuty, a webhook and GitHub;
//! - `metrics`: OpenMetrics;
//! - `agent_check`: HAProxy's agent protocol;
//! - `server`: HTTP (`conn`: connection limits and the accept loop);
//! - `runner`: `Checks::build`, the one wiring of every check; background checks, the composer,
//!   the supervisor;
//! - `oneshot`: `health-agent check`.
//!
//! `sys` (a leaf) holds every system call outside the eBPF loader: the only module, with
//! `ebpf::load`, where `unsafe` is allowed.
#![deny(unsafe_code)]

pub mod agent_check;
pub mod alerts;
pub mod aws;
pub(crate) mod capped;
pub mod checks;
pub mod cloudwatch;
pub mod config;
pub(crate) mod dburl;
pub mod drain;
pub(crate) mod ebpf;
pub(crate) mod engine;
pub(crate) mod fleet;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub(crate) mod heal;
pub mod logging;
pub(crate) mod metrics;
pub(crate) mod net;
pub(crate) mod netns;
pub mod oneshot;
pub(crate) mod policy;
pub(crate) mod redact;
pub mod runner;
pub(crate) mod saturation;
pub mod sd_notify;
pub mod server;
pub(crate) mod snapshot;
pub mod status;
pub(crate) mod suspicious;
pub mod sys;
pub(crate) mod text;
