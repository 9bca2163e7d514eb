//! The expected-containers check ("N/M running", state, own HEALTHCHECK, restart count, CPU
//! and memory — the old `docker:status`), through the engine clients in `crate::engine`: the
//! Engine API (Docker, Podman) or containerd. A daemon that does not answer is `unknown` with
//! the reason: a warning, never a 503 storm.

use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum, HealthStatusEnum};
use serde::Serialize;

use crate::{
    config::ContainersConfig,
    engine::{
        containerd::{self, Containerd},
        docker::Docker,
        Engine, EngineError,
    },
    status::ContainersState,
};

/// Containers slot: filled by the containers check when `[containers]` names any.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ContainersReport {
    pub state: ContainersState,
    /// The seed's `checks.containers`, e.g. `"2/2 running"`.
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Which engine answered the Engine API, e.g. "Docker 20.10.24" or "Podman 4.3.1".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Expected containers that are missing, not running or unhealthy.
    pub faulty: Vec<String>,
    pub containers: Vec<ContainerInfo>,
}

impl ContainersReport {
    pub fn not_configured() -> Self {
        Self {
            state: ContainersState::NotConfigured,
            summary: "not_configured".into(),
            reason: None,
            engine: None,
            faulty: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// Docker could not be asked (it did not answer, or its address is wrong): a warning.
    pub fn unknown(reason: String) -> Self {
        Self {
            state: ContainersState::Unknown,
            summary: "unknown".into(),
            reason: Some(reason),
            engine: None,
            faulty: Vec::new(),
            containers: Vec::new(),
        }
    }
}

/// One expected container as the check found it.
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
    #[serde(serialize_with = "crate::text::shown::percent_opt")]
    pub cpu_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::shown::percent_opt")]
    pub memory_percent: Option<f64>,
    /// A one-shot job that finished: found by label (not named), exited 0, and not meant to
    /// be restarted (restart policy other than `always` / `unless-stopped`). Not a fault,
    /// never restarted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub completed: bool,
}

impl ContainerInfo {
    fn missing(name: String) -> Self {
        Self {
            name,
            state: "missing".into(),
            health: "none".into(),
            restart_count: 0,
            exit_code: None,
            cpu_percent: None,
            memory_bytes: None,
            memory_percent: None,
            completed: false,
        }
    }

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

/// Checks the expected containers. Never fails: an unreachable daemon is `unknown`.
pub async fn check(engine: &Engine, cfg: &ContainersConfig) -> ContainersReport {
    let found = match engine {
        Engine::Api(d) => inspect_expected(d, cfg).await.map_err(|e| e.to_string()),
        Engine::Containerd(c) => containerd_expected(c, cfg).await.map_err(|e| e.to_string()),
    };
    let name = engine.engine().await;
    match found {
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
            ContainersReport {
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
                engine: name,
                faulty: faulty.iter().map(|c| c.name.clone()).collect(),
                containers: infos,
            }
        }
        Err(e) => ContainersReport::unknown(format!(
            "{} did not answer: {e}",
            name.as_deref().unwrap_or(match engine {
                Engine::Api(_) => "Docker",
                Engine::Containerd(_) => "containerd",
            })
        )),
    }
}

async fn inspect_expected(
    docker: &Docker,
    cfg: &ContainersConfig,
) -> Result<Vec<ContainerInfo>, bollard::errors::Error> {
    let all = docker.list_all().await?;
    let mut expected: Vec<String> = cfg.names.clone();
    for c in &all {
        let labels = c.labels.clone().unwrap_or_default();
        if labels_match(&cfg.labels, &labels) {
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
        match docker.inspect(&name).await {
            Ok(inspect) => out.push(describe(docker, &name, inspect, by_label_only).await),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => out.push(ContainerInfo::missing(name)),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The expected containers in containerd: named ones, then those whose labels match.
async fn containerd_expected(
    client: &Containerd,
    cfg: &ContainersConfig,
) -> Result<Vec<ContainerInfo>, EngineError> {
    let all = client.list().await?;
    let mut expected: Vec<String> = cfg.names.clone();
    for f in &all {
        if labels_match(&cfg.labels, &f.labels) {
            let name = f.name();
            if !expected.contains(&name) {
                expected.push(name);
            }
        }
    }
    Ok(expected
        .into_iter()
        .map(|name| {
            let by_label_only = !cfg.names.contains(&name);
            match client.choose(&all, &name) {
                Some(f) => describe_containerd(client, &name, f, by_label_only),
                None => ContainerInfo::missing(name),
            }
        })
        .collect())
}

fn describe_containerd(
    client: &Containerd,
    name: &str,
    found: &containerd::Found,
    by_label_only: bool,
) -> ContainerInfo {
    use containerd::State;
    let (status, exit_code) = match found.state() {
        State::Running => (ContainerStateStatusEnum::RUNNING, None),
        State::Paused => (ContainerStateStatusEnum::PAUSED, None),
        State::Created => (ContainerStateStatusEnum::CREATED, None),
        State::Exited(code) => (ContainerStateStatusEnum::EXITED, code.map(i64::from)),
    };
    let usage = client.usage(found);
    ContainerInfo {
        name: name.to_string(),
        state: status.to_string(),
        // containerd runs no HEALTHCHECK; a pod's probes are the kubelet's.
        health: "none".into(),
        restart_count: 0,
        exit_code,
        cpu_percent: usage.cpu_percent,
        memory_bytes: usage.memory_bytes,
        memory_percent: usage.memory_percent,
        // containerd keeps no restart policy: a job found by label that exited 0 is done.
        completed: completed_job(by_label_only, status, exit_code, None),
    }
}

/// Whether `labels` carry any of `wanted` ("key" or "key=value").
fn labels_match(wanted: &[String], labels: &std::collections::HashMap<String, String>) -> bool {
    wanted.iter().any(|want| match want.split_once('=') {
        Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
        None => labels.contains_key(want),
    })
}

async fn describe(
    docker: &Docker,
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
        let usage = docker.usage(name).await;
        info.cpu_percent = usage.cpu_percent;
        info.memory_bytes = usage.memory_bytes;
        info.memory_percent = usage.memory_percent;
    }
    info
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
}
