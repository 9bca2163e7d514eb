//! Helpers for the integration tests: real processes behind RAII guards (the agent binary, the
//! fixture backend, nginx, PostgreSQL, Puma, Docker containers, a tmpfs mount), a tiny HTTP
//! client, and polling with a deadline. Guards clean up on drop, so a failing test still tears
//! its servers down. `cargo xtask bench` uses the same pieces.
//!
//! | module | owns |
//! |---|---|
//! | `build` | where the binaries are; the guard against testing a stale agent binary |
//! | `net` | free ports (the only place that picks one), loopback addresses |
//! | `http` | the HTTP client, to 127.0.0.1 or any address |
//! | `wait` | `wait_until` |
//! | `process` | `Proc` (a child stopped on drop), the root check |
//! | `agent` | `Agent`: start on any address, `/health`, stop |
//! | `bpf_stats` | the kernel's run counts of the agent's BPF programs (`BPF_ENABLE_STATS`) |
//! | `poller` | `HealthPoller`: every `/health` answer of a run; `timeline` |
//! | `load` | `Load`: background HTTP clients (closed loop), and the HTTP reading they share |
//! | `open_loop` | `OpenLoop`: requests on Poisson arrival times, on new or keep-alive connections |
//! | `markdown` | fenced blocks of the README and docs/ pages, for the tests that run them |
//! | `fixture`, `nginx`, `postgres`, `redis`, `puma`, `docker`, `receiver`, `tmpfs`, `moto` | one server each |
//! | `certs` | a CA and the certificates it signs, made with the openssl CLI |
//! | `netns` | network namespaces reached over a veth pair |
//! | `nspawn` | a Debian system booted with `systemd-nspawn -b` (the shipped unit under real systemd) |
//! | `qemu` | Debian's Linux 6.1 booted under qemu, running scenarios inside (`bin/vm-init/`) |
//! | `fleet` | stub servers, `/etc/hosts` lines, `/metrics` gauges for the fleet tests |

pub mod agent;
pub mod bpf_stats;
pub mod build;
pub mod certs;
pub mod docker;
pub mod fixture;
pub mod fleet;
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
pub mod puma;
pub mod qemu;
pub mod receiver;
pub mod redis;
pub mod tmpfs;
pub mod wait;

pub use agent::{merge_toml, Agent};
pub use build::{agent_binary, binary, newest, target_dir};
pub use certs::{Ca, Issued};
pub use docker::{docker, fixture_image, BridgeContainer, Container};
pub use fixture::{AddrFixture, Fixture};
pub use http::{background_requests, counters, get, get_at, http, http_at, request_at, requests};
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
pub use process::{is_root, require_root, Proc};
pub use puma::{Puma, PumaOptions, TcpProxy};
pub use receiver::{Receiver, Recorded};
pub use redis::Redis;
pub use tmpfs::Tmpfs;
pub use wait::wait_until;
