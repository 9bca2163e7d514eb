//! Helpers for the integration tests: real processes behind RAII guards (the agent binary, the
//! fixture backend, nginx, PostgreSQL, Puma, HAProxy, Caddy, Docker containers, a tmpfs mount),
//! a tiny HTTP client, and polling with a deadline. Guards clean up on drop, so a failing test still tears
//! its servers down. `cargo xtask bench` uses the same pieces.
//!
//! | module | owns |
//! |---|---|
//! | `build` | where the binaries are; the guard against testing a stale agent binary |
//! | `net` | free ports (the only place that picks one), loopback addresses |
//! | `http` | the HTTP client, to 127.0.0.1 or any address |
//! | `wait` | `wait_until`; `wait_health_at`, for an agent the harness did not start |
//! | `process` | `Proc` (a child stopped on drop), `Logged` (a server logging to a file, killed on drop), `succeed` (a tool that must work), the root check |
//! | `agent` | `Agent`: start on any address, `/health`, stop |
//! | `drain` | `health-agent drain` / `undrain` against an `Agent`: exit code, last line, time taken |
//! | `bpf_stats` | the kernel's run counts of the agent's BPF programs (`BPF_ENABLE_STATS`) |
//! | `poller` | `HealthPoller`: every `/health` answer of a run; `timeline` |
//! | `load` | `Load`: background HTTP clients (closed loop), and the HTTP reading they share |
//! | `open_loop` | `OpenLoop`: requests on Poisson arrival times, on new or keep-alive connections |
//! | `story` | what the verdict tests share: `web_config`, `since`, `assert_answered`, `Restarts`; `Watch`, the one way to wait for a verdict; `Watched`, a Puma watched by an agent (and the "under load, then hang" start) |
//! | `markdown` | fenced blocks of the README and docs/ pages, for the tests that run them |
//! | `fixture`, `nginx`, `postgres`, `redis`, `puma`, `docker`, `containerd`, `receiver`, `tmpfs`, `moto` | one server each |
//! | `rack` | a Rack app under Puma that is strict about its Host and scheme, over HTTP, TLS or both |
//! | `haproxy`, `caddy` | a real load balancer each, on a config the test writes (HAProxy's `show stat`) |
//! | `certs` | a CA and the certificates it signs, made with the openssl CLI |
//! | `netns` | network namespaces reached over a veth pair |
//! | `nspawn` | a Debian system booted with `systemd-nspawn -b` (the shipped unit under real systemd) |
//! | `stack` | the CloudFormation template deployed in moto; the AWS CLI stand-in its UserData runs against on a booted root |
//! | `release` | the release artifacts that UserData installs: `cargo xtask dist`'s, or stand-ins built from the static agent |
//! | `qemu` | Debian's Linux 6.1, x86_64 or arm64, booted under qemu, running scenarios inside (`bin/vm-init/`); what the VM tests assert on them (`qemu::verdicts`) |
//! | `prometheus` | a real Prometheus scraping the test's agents and evaluating rule files; its HTTP API; `promtool check metrics` |
//! | `soak` | the soak's backend restarted on its ports, the agent's /proc and BPF figures, the faults and the verdict over them |
//! | `fleet` | stub servers, `/etc/hosts` lines, `/metrics` gauges for the fleet tests |
//! | `trust` | the fleet key the harness's agents hold, the proofs written from the protocol, peer stand-ins that lie, replay or flood |

pub mod agent;
pub mod bpf_stats;
pub mod build;
pub mod caddy;
pub mod certs;
pub mod containerd;
pub mod docker;
pub mod drain;
pub mod fixture;
pub mod fleet;
pub mod haproxy;
pub mod http;
pub mod load;
pub mod markdown;
pub mod moto;
pub mod net;
pub mod netns;
pub mod nginx;
pub mod nspawn;
pub mod open_loop;
pub mod poller;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod puma;
pub mod qemu;
pub mod rack;
pub mod receiver;
pub mod redis;
pub mod release;
pub mod soak;
pub mod stack;
pub mod story;
pub mod tmpfs;
pub mod trust;
pub mod wait;

pub use agent::{check_json, merge_toml, Agent, SECRET_VARS};
pub use build::{agent_binary, binary, newest, target_dir, workspace};
pub use caddy::Caddy;
pub use certs::{Ca, Issued};
pub use containerd::CtrContainer;
pub use docker::{docker, fixture_image, BridgeContainer, Container, Engine};
pub use drain::{drain, undrain, CommandRun, DrainInBackground};
pub use fixture::{AddrFixture, Fixture};
pub use haproxy::{Haproxy, ServerState};
pub use http::{
    background_requests, counters, get, get_at, get_at_within, get_within, request_at, requests,
};
pub use load::{Load, LoadStats};
pub use moto::Moto;
pub use net::{free_port, free_port_on, free_port_on_all, loopback};
pub use netns::{netns_inode, NetNs};
pub use nginx::{Nginx, NginxOptions};
pub use nspawn::Machine;
pub use open_loop::{OpenLoop, OpenLoopStats};
pub use poller::{timeline, HealthPoller, HealthSample, Timed};
pub use postgres::Postgres;
pub(crate) use process::kill_and_wait;
pub use process::{is_root, require_root, stdout_of, succeed, Logged, Proc};
pub use puma::{Puma, PumaOptions, TcpProxy};
pub use receiver::{AlertReceivers, Receiver, Recorded};
pub use redis::Redis;
pub use story::{
    assert_200_before, assert_answered, assert_contract, database_behind_proxy, heal_attempts,
    pretty, since, steady_load, tail, unanswered_reason, watched_fixture, web_config, Restarts,
    Watch, Watched,
};
pub use tmpfs::Tmpfs;
pub use wait::{health_at, wait_health_at, wait_hung_at, wait_until};
