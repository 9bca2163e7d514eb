//! The Docker Engine API (bollard): the expected-containers check ("N/M running", state, own
//! HEALTHCHECK, restart count, CPU and memory — the old `docker:status`) and container restarts
//! for self-healing. A daemon that does not answer is `unknown` with the reason: a warning,
//! never a 503 storm.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bollard::{
    models::{ContainerInspectResponse, ContainerStateStatusEnum, HealthStatusEnum},
    query_parameters::{
        InspectContainerOptions, ListContainersOptionsBuilder, RestartContainerOptionsBuilder,
        StatsOptionsBuilder,
    },
};
use futures_util::StreamExt as _;
use serde::Serialize;

use crate::{checks::ContainersReport, config::ContainersConfig, policy::ContainersState};

/// Seconds between SIGTERM and SIGKILL when self-healing restarts a container.
const RESTART_GRACE_SECS: i32 = 2;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ContainerInfo {
    pub name: String,
    /// created, running, paused, restarting, removing, exited, dead, or missing.
    pub state: String,
    /// The container's own HEALTHCHECK: healthy, unhealthy, starting, or none.
    pub health: String,
    pub restart_count: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_percent: Option<f64>,
    /// A one-shot job that finished: found by label (not named), exited 0, and not meant to
    /// be restarted (restart policy other than `always` / `unless-stopped`). Not a fault,
    /// never restarted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub completed: bool,
}

impl ContainerInfo {
    fn faulty(&self) -> bool {
        !self.completed && (self.state != "running" || self.health == "unhealthy")
    }
}

/// Whether a container found by label is a job that has done its work: it exited 0 and
/// Docker is not told to keep it running. A named container is expected to run, exit 0 or not.
fn completed_job(
    by_label_only: bool,
    status: ContainerStateStatusEnum,
    exit_code: Option<i64>,
    restart_policy: Option<&str>,
) -> bool {
    by_label_only
        && status == ContainerStateStatusEnum::EXITED
        && exit_code == Some(0)
        && !matches!(restart_policy, Some("always" | "unless-stopped"))
}

/// Where a container's network lives: its main process (whose network namespace is the
/// container's) and the ports it publishes on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerNet {
    /// Its main process on the host; None while it is not running.
    pub pid: Option<u32>,
    /// `--network host`: it shares the host's namespace.
    pub host_network: bool,
    /// (container port, host port) for every TCP port published on the host.
    pub published: Vec<(u16, u16)>,
}

impl ContainerNet {
    /// The port inside the container for `port`: a published host port maps to its container
    /// port (and is returned as the second value), any other port is taken as the container's.
    pub fn inside_port(&self, port: u16) -> (u16, Option<u16>) {
        match self.published.iter().find(|&&(_, host)| host == port) {
            Some(&(inside, host)) if !self.host_network => (inside, Some(host)),
            _ => (port, None),
        }
    }
}

#[derive(Clone)]
pub struct Docker {
    client: bollard::Docker,
    /// Previous (container cpu, system cpu) per container, for CPU % between two checks.
    cpu: Arc<Mutex<HashMap<String, (u64, u64)>>>,
}

impl Docker {
    /// `unix:///path` or `http://127.0.0.1:2375`. Connecting is lazy: this never fails because
    /// the daemon is down, only when the address is malformed.
    pub fn connect(host: &str, timeout: Duration) -> Result<Self, String> {
        let secs = timeout.as_secs().max(1);
        let client = if host.starts_with("unix://") || host.starts_with('/') {
            bollard::Docker::connect_with_unix(host, secs, bollard::API_DEFAULT_VERSION)
        } else if host.starts_with("http://") || host.starts_with("tcp://") {
            bollard::Docker::connect_with_http(host, secs, bollard::API_DEFAULT_VERSION)
        } else {
            return Err(format!(
                "containers.docker_host {host:?}: use unix:///var/run/docker.sock or http://HOST:PORT"
            ));
        }
        .map_err(|e| format!("containers.docker_host {host:?}: {e}"))?;
        Ok(Self {
            client,
            cpu: Arc::default(),
        })
    }

    /// Restarts `name` within `timeout` (the whole call, including Docker's stop grace).
    pub async fn restart(&self, name: &str, timeout: Duration) -> Result<(), String> {
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
            .map_err(|e| format!("docker restart {name}: {e}"))
    }

    /// Where `name`'s network lives (Engine API inspect): re-read every round, since a restarted
    /// container has a new process and a new namespace.
    pub async fn network_of(&self, name: &str) -> Result<ContainerNet, String> {
        let info = self
            .client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .map_err(|e| format!("docker inspect {name}: {e}"))?;
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

    /// Checks the expected containers. Never fails: an unreachable daemon is `unknown`.
    pub async fn check(&self, cfg: &ContainersConfig) -> (ContainersReport, Vec<ContainerInfo>) {
        match self.inspect_expected(cfg).await {
            Ok(infos) => {
                let completed = infos.iter().filter(|c| c.completed).count();
                let expected = infos.len() - completed;
                let running = infos.iter().filter(|c| !c.completed && !c.faulty()).count();
                let faulty: Vec<&ContainerInfo> = infos.iter().filter(|c| c.faulty()).collect();
                let reason = (!faulty.is_empty()).then(|| {
                    faulty
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {}",
                                c.name,
                                if c.state == "running" {
                                    &c.health
                                } else {
                                    &c.state
                                }
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                });
                let report = ContainersReport {
                    state: if faulty.is_empty() {
                        ContainersState::AllRunning
                    } else {
                        ContainersState::Faulty
                    },
                    summary: if completed == 0 {
                        format!("{running}/{expected} running")
                    } else {
                        format!("{running}/{expected} running, {completed} completed")
                    },
                    reason,
                    faulty: faulty.iter().map(|c| c.name.clone()).collect(),
                    containers: infos.clone(),
                };
                (report, infos)
            }
            Err(e) => (
                ContainersReport {
                    state: ContainersState::Unknown,
                    summary: "unknown".into(),
                    reason: Some(format!("Docker did not answer: {e}")),
                    faulty: Vec::new(),
                    containers: Vec::new(),
                },
                Vec::new(),
            ),
        }
    }

    async fn inspect_expected(
        &self,
        cfg: &ContainersConfig,
    ) -> Result<Vec<ContainerInfo>, bollard::errors::Error> {
        let all = self
            .client
            .list_containers(Some(ListContainersOptionsBuilder::new().all(true).build()))
            .await?;
        let mut expected: Vec<String> = cfg.names.clone();
        for c in &all {
            let labels = c.labels.clone().unwrap_or_default();
            let matches = cfg.labels.iter().any(|want| match want.split_once('=') {
                Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
                None => labels.contains_key(want),
            });
            if matches {
                if let Some(name) = c.names.as_ref().and_then(|n| n.first()) {
                    let name = name.trim_start_matches('/').to_string();
                    if !expected.contains(&name) {
                        expected.push(name);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(expected.len());
        for name in expected {
            let by_label_only = !cfg.names.contains(&name);
            match self
                .client
                .inspect_container(&name, None::<InspectContainerOptions>)
                .await
            {
                Ok(inspect) => out.push(self.describe(&name, inspect, by_label_only).await),
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => out.push(ContainerInfo {
                    name,
                    state: "missing".into(),
                    health: "none".into(),
                    restart_count: 0,
                    exit_code: None,
                    cpu_percent: None,
                    memory_bytes: None,
                    memory_percent: None,
                    completed: false,
                }),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn describe(
        &self,
        name: &str,
        inspect: ContainerInspectResponse,
        by_label_only: bool,
    ) -> ContainerInfo {
        let state = inspect.state.clone().unwrap_or_default();
        let restart_policy = inspect
            .host_config
            .as_ref()
            .and_then(|h| h.restart_policy.as_ref())
            .and_then(|p| p.name)
            .map(|n| n.to_string());
        let status = state.status.unwrap_or(ContainerStateStatusEnum::EMPTY);
        let health = state
            .health
            .and_then(|h| h.status)
            .filter(|s| *s != HealthStatusEnum::EMPTY)
            .map_or("none".to_string(), |s| s.to_string());
        let mut info = ContainerInfo {
            name: name.to_string(),
            state: status.to_string(),
            health,
            restart_count: inspect.restart_count.unwrap_or(0),
            exit_code: (status != ContainerStateStatusEnum::RUNNING)
                .then_some(state.exit_code)
                .flatten(),
            cpu_percent: None,
            memory_bytes: None,
            memory_percent: None,
            completed: completed_job(
                by_label_only,
                status,
                state.exit_code,
                restart_policy.as_deref(),
            ),
        };
        if status == ContainerStateStatusEnum::RUNNING {
            self.add_stats(&mut info).await;
        }
        info
    }

    /// One-shot stats; CPU % comes from the change since this container's previous check.
    async fn add_stats(&self, info: &mut ContainerInfo) {
        let opts = StatsOptionsBuilder::new()
            .stream(false)
            .one_shot(true)
            .build();
        let Some(Ok(stats)) = self.client.stats(&info.name, Some(opts)).next().await else {
            return;
        };
        if let Some(mem) = &stats.memory_stats {
            info.memory_bytes = mem.usage;
            if let (Some(u), Some(l)) = (mem.usage, mem.limit) {
                if l > 0 {
                    info.memory_percent = Some((u as f64 * 1000.0 / l as f64).round() / 10.0);
                }
            }
        }
        let Some(cpu) = &stats.cpu_stats else { return };
        let (Some(total), Some(system)) = (
            cpu.cpu_usage.as_ref().and_then(|u| u.total_usage),
            cpu.system_cpu_usage,
        ) else {
            return;
        };
        let online = cpu.online_cpus.unwrap_or(1).max(1) as f64;
        let prev = self
            .cpu
            .lock()
            .ok()
            .and_then(|mut m| m.insert(info.name.clone(), (total, system)));
        if let Some((pt, ps)) = prev {
            let dt = total.saturating_sub(pt) as f64;
            let ds = system.saturating_sub(ps) as f64;
            if ds > 0.0 {
                info.cpu_percent = Some((dt / ds * online * 1000.0).round() / 10.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_labelled_job_that_exited_0_and_stays_down_is_completed() {
        use bollard::models::RestartPolicyNameEnum as P;
        use ContainerStateStatusEnum::{EXITED, RUNNING};
        let policy = |p: P| Some(p.to_string());
        assert!(completed_job(
            true,
            EXITED,
            Some(0),
            policy(P::NO).as_deref()
        ));
        assert!(completed_job(
            true,
            EXITED,
            Some(0),
            policy(P::ON_FAILURE).as_deref()
        ));
        assert!(completed_job(true, EXITED, Some(0), None));
        // Docker is told to keep it running: exiting is not its job.
        assert!(!completed_job(
            true,
            EXITED,
            Some(0),
            policy(P::ALWAYS).as_deref()
        ));
        assert!(!completed_job(
            true,
            EXITED,
            Some(0),
            policy(P::UNLESS_STOPPED).as_deref()
        ));
        // Failed, still running, or expected by name.
        assert!(!completed_job(true, EXITED, Some(3), None));
        assert!(!completed_job(true, RUNNING, None, None));
        assert!(!completed_job(false, EXITED, Some(0), None));
    }

    #[test]
    fn a_published_host_port_maps_to_the_container_port() {
        let net = ContainerNet {
            pid: Some(42),
            host_network: false,
            published: vec![(80, 8081), (9000, 19000)],
        };
        assert_eq!(net.inside_port(19000), (9000, Some(19000)));
        assert_eq!(
            net.inside_port(9000),
            (9000, None),
            "the container's own port"
        );
        let host = ContainerNet {
            host_network: true,
            ..net
        };
        assert_eq!(
            host.inside_port(19000),
            (19000, None),
            "host network: no mapping"
        );
    }
}
