//! The Docker Engine API client (bollard; Podman serves the same API): connecting, where a container's network lives,
//! restarts for self-healing, and the calls the containers check (`checks::containers`) is made
//! of — list, inspect and one-shot stats with the CPU % bookkeeping between two of them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bollard::{
    models::{ContainerInspectResponse, ContainerSummary},
    query_parameters::{
        InspectContainerOptions, ListContainersOptionsBuilder, RestartContainerOptionsBuilder,
        StatsOptionsBuilder,
    },
};
use futures_util::StreamExt as _;

use super::types::{ContainerNet, EngineError, Usage};

fn call_error(call: &'static str, name: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Call {
        engine: "docker",
        call,
        name: name.to_string(),
        reason: e.to_string(),
    }
}

/// The engine behind a /version answer: Podman lists a "Podman Engine" component, Docker an
/// "Engine" one.
fn engine_name(v: bollard::models::SystemVersion) -> String {
    let podman = v
        .components
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name.contains("Podman"));
    match podman {
        Some(c) => format!("Podman {}", c.version),
        None => format!("Docker {}", v.version.unwrap_or_default()),
    }
}

/// Seconds between SIGTERM and SIGKILL when self-healing restarts a container.
const RESTART_GRACE_SECS: i32 = 2;

#[derive(Clone)]
pub struct Docker {
    client: bollard::Docker,
    /// "Podman" when the address is Podman's socket, else "Docker": who is said to have no
    /// container of a name.
    label: &'static str,
    /// Previous (container cpu, system cpu) per container, for CPU % between two checks.
    cpu: Arc<Mutex<HashMap<String, (u64, u64)>>>,
}

impl Docker {
    /// `unix:///path` or `http://127.0.0.1:2375`. Connecting is lazy: this never fails because
    /// the daemon is down, only when the address is malformed.
    pub fn connect(host: &str, timeout: Duration) -> Result<Self, EngineError> {
        let secs = timeout.as_secs().max(1);
        let client = if host.starts_with("unix://") || host.starts_with('/') {
            bollard::Docker::connect_with_unix(host, secs, bollard::API_DEFAULT_VERSION)
        } else if host.starts_with("http://") || host.starts_with("tcp://") {
            bollard::Docker::connect_with_http(host, secs, bollard::API_DEFAULT_VERSION)
        } else {
            return Err(EngineError::Address {
                key: "containers.docker_host",
                address: host.to_string(),
                reason: "use unix:///var/run/docker.sock or http://HOST:PORT".into(),
            });
        }
        .map_err(|e| EngineError::Address {
            key: "containers.docker_host",
            address: host.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            client,
            label: if host.contains("podman") {
                "Podman"
            } else {
                "Docker"
            },
            cpu: Arc::default(),
        })
    }

    /// Which engine answers on the socket, from the API's /version: "Podman 4.3.1" when a
    /// component is Podman's (it serves the Docker-compatible endpoints), else "Docker 20.10.24".
    /// None when it does not answer.
    pub async fn engine(&self) -> Option<String> {
        self.client.version().await.ok().map(engine_name)
    }

    /// Restarts `name` within `timeout` (the whole call, including Docker's stop grace).
    pub async fn restart(&self, name: &str, timeout: Duration) -> Result<(), EngineError> {
        let client = self.client.clone().with_timeout(timeout);
        // A frozen process cannot act on SIGTERM: thaw it first, or the stop waits out the grace.
        let paused = client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state?.paused)
            .unwrap_or(false);
        if paused {
            if let Err(e) = client.unpause_container(name).await {
                tracing::warn!("docker unpause {name} before restart: {e}");
            }
        }
        // The backend is being restarted because it stopped serving: there is little in flight
        // to drain, so a short grace keeps the instance out of rotation for less time.
        let opts = RestartContainerOptionsBuilder::new()
            .t(RESTART_GRACE_SECS)
            .build();
        client
            .restart_container(name, Some(opts))
            .await
            .map_err(|e| call_error("restart", name, e))
    }

    /// Where `name`'s network lives (Engine API inspect): re-read every round, since a restarted
    /// container has a new process and a new namespace.
    pub async fn network_of(&self, name: &str) -> Result<ContainerNet, EngineError> {
        let info = self
            .client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => EngineError::NoSuchContainer {
                    engine: self.label.to_string(),
                    name: name.to_string(),
                },
                e => call_error("inspect", name, e),
            })?;
        let state = info.state.unwrap_or_default();
        let pid = state
            .pid
            .filter(|&p| p > 0 && state.running == Some(true))
            .and_then(|p| u32::try_from(p).ok());
        let host_network = info
            .host_config
            .and_then(|h| h.network_mode)
            .is_some_and(|m| m == "host");
        let mut published: Vec<(u16, u16)> = info
            .network_settings
            .and_then(|n| n.ports)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(spec, bindings)| {
                let inside: u16 = spec.strip_suffix("/tcp")?.parse().ok()?;
                Some(
                    bindings
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(move |b| Some((inside, b.host_port?.parse().ok()?))),
                )
            })
            .flatten()
            .collect();
        published.sort_unstable();
        published.dedup();
        Ok(ContainerNet {
            pid,
            host_network,
            published,
        })
    }

    /// Every container, running or not.
    pub async fn list_all(&self) -> Result<Vec<ContainerSummary>, bollard::errors::Error> {
        self.client
            .list_containers(Some(ListContainersOptionsBuilder::new().all(true).build()))
            .await
    }

    pub async fn inspect(
        &self,
        name: &str,
    ) -> Result<ContainerInspectResponse, bollard::errors::Error> {
        self.client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
    }

    /// One-shot stats of a running container; CPU % comes from the change since this
    /// container's previous call, so the first call has none. Nothing when Docker gives none.
    pub async fn usage(&self, name: &str) -> Usage {
        let mut usage = Usage::default();
        let opts = StatsOptionsBuilder::new()
            .stream(false)
            .one_shot(true)
            .build();
        let Some(Ok(stats)) = self.client.stats(name, Some(opts)).next().await else {
            return usage;
        };
        if let Some(mem) = &stats.memory_stats {
            usage.memory_bytes = mem.usage;
            if let (Some(u), Some(l)) = (mem.usage, mem.limit) {
                if l > 0 {
                    usage.memory_percent = Some((u as f64 * 1000.0 / l as f64).round() / 10.0);
                }
            }
        }
        let Some(cpu) = &stats.cpu_stats else {
            return usage;
        };
        let (Some(total), Some(system)) = (
            cpu.cpu_usage.as_ref().and_then(|u| u.total_usage),
            cpu.system_cpu_usage,
        ) else {
            return usage;
        };
        let online = cpu.online_cpus.unwrap_or(1).max(1) as f64;
        let prev = self
            .cpu
            .lock()
            .ok()
            .and_then(|mut m| m.insert(name.to_string(), (total, system)));
        if let Some((pt, ps)) = prev {
            let dt = total.saturating_sub(pt) as f64;
            let ds = system.saturating_sub(ps) as f64;
            if ds > 0.0 {
                usage.cpu_percent = Some((dt / ds * online * 1000.0).round() / 10.0);
            }
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_is_named_from_its_version_answer() {
        // Trimmed from Debian 12's docker.io and podman answering GET /v1.41/version.
        let docker = r#"{"Platform":{"Name":""},"Components":[{"Name":"Engine","Version":"20.10.24+dfsg1"},{"Name":"containerd","Version":"1.6.20~ds1"}],"Version":"20.10.24+dfsg1","ApiVersion":"1.41"}"#;
        let podman = r#"{"Platform":{"Name":"linux/amd64/debian-12"},"Components":[{"Name":"Podman Engine","Version":"4.3.1"},{"Name":"Conmon","Version":"conmon version 2.1.6"}],"Version":"4.3.1","ApiVersion":"1.41"}"#;
        let name = |json: &str| engine_name(serde_json::from_str(json).unwrap());
        assert_eq!(name(docker), "Docker 20.10.24+dfsg1");
        assert_eq!(name(podman), "Podman 4.3.1");
    }
}
