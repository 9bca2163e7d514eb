//! The containerd client: the containers of the watched namespaces (`k8s.io`, where the
//! kubelet's CRI plugin puts a node's pods, then `default`, where `ctr` and nerdctl put theirs),
//! their tasks, restarts for self-healing, and each container's use of CPU and memory read from
//! its cgroup (`cgroup`; containerd's metrics are cgroup protobufs this client does not carry).
//!
//! A container is named by its ID, its nerdctl name (`nerdctl/name`), its Kubernetes container
//! name (`io.kubernetes.container.name`) or `pod/container`. A Kubernetes pod's sandbox is never
//! one of them. Several containers of one name (the kubelet keeps an exited one beside its
//! replacement): the one whose task runs, else the newest.

mod api;
mod cgroup;
mod grpc;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::status;
use grpc::{CallError, Channel};

use super::types::{ContainerNet, EngineError, Usage};

/// containerd's socket on a node (the kubelet's, and the one `ctr` uses).
pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// The namespaces looked in, in order, when `containers.containerd_namespaces` is empty.
pub const NAMESPACES: [&str; 2] = ["k8s.io", "default"];

const NERDCTL_NAME: &str = "nerdctl/name";
const NERDCTL_PORTS: &str = "nerdctl/ports";
const K8S_CONTAINER: &str = "io.kubernetes.container.name";
const K8S_POD: &str = "io.kubernetes.pod.name";
const K8S_POD_UID: &str = "io.kubernetes.pod.uid";
const CRI_KIND: &str = "io.cri-containerd.kind";
const STOP_SIGNAL: &str = "io.containerd.image.config.stop-signal";

/// Seconds between the stop signal and SIGKILL when self-healing restarts a container.
const RESTART_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Containerd {
    socket: PathBuf,
    namespaces: Vec<String>,
    /// Bounds each connect and each call (`checks.timeout`).
    timeout: Duration,
    /// Previous (cgroup CPU µs, when) per container ID, for CPU % between two checks.
    cpu: Arc<Mutex<HashMap<String, (u64, Instant)>>>,
}

/// One container as found: its namespace, its record, and its task when it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub namespace: String,
    pub id: String,
    pub labels: HashMap<String, String>,
    created: Option<api::Timestamp>,
    snapshotter: String,
    snapshot_key: String,
    task: Option<api::Process>,
}

/// A task's state in the Engine API's words, so both engines' containers read alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Paused,
    Created,
    /// Stopped with its exit status, or without a task (exit status unknown).
    Exited(Option<u32>),
}

impl Found {
    /// How the report names it: its nerdctl name, `pod/container`, else its ID.
    pub fn name(&self) -> String {
        if let Some(n) = self.labels.get(NERDCTL_NAME) {
            return n.clone();
        }
        match (self.labels.get(K8S_POD), self.labels.get(K8S_CONTAINER)) {
            (Some(pod), Some(c)) => format!("{pod}/{c}"),
            (None, Some(c)) => c.clone(),
            _ => self.id.clone(),
        }
    }

    fn answers_to(&self, name: &str) -> bool {
        let label = |k: &str| self.labels.get(k).map(String::as_str);
        self.id == name
            || label(NERDCTL_NAME) == Some(name)
            || label(K8S_CONTAINER) == Some(name)
            || self.name() == name
    }

    /// A Kubernetes pod's sandbox (its `pause` container): infrastructure, never watched.
    fn is_sandbox(&self) -> bool {
        self.labels.get(CRI_KIND).is_some_and(|k| k == "sandbox")
    }

    /// The kubelet owns it: it replaces the container when its task stops.
    fn kubelet_managed(&self) -> bool {
        self.labels.contains_key(K8S_POD_UID)
    }

    pub fn state(&self) -> State {
        match self.task.as_ref().map(|t| (t.status, t.exit_status)) {
            Some((status::RUNNING, _)) => State::Running,
            Some((status::PAUSED | status::PAUSING, _)) => State::Paused,
            Some((status::CREATED, _)) => State::Created,
            Some((status::STOPPED, code)) => State::Exited(Some(code)),
            _ => State::Exited(None),
        }
    }

    fn running_pid(&self) -> Option<u32> {
        (self.state() == State::Running)
            .then(|| self.task.as_ref().map(|t| t.pid))
            .flatten()
            .filter(|&p| p > 0)
    }

    /// (container port, host port) from nerdctl's label, TCP only.
    fn published(&self) -> Vec<(u16, u16)> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Port {
            host_port: u16,
            container_port: u16,
            #[serde(default)]
            protocol: String,
        }
        let Some(json) = self.labels.get(NERDCTL_PORTS) else {
            return Vec::new();
        };
        let ports: Vec<Port> = serde_json::from_str(json).unwrap_or_default();
        let mut out: Vec<(u16, u16)> = ports
            .into_iter()
            .filter(|p| p.protocol.is_empty() || p.protocol.eq_ignore_ascii_case("tcp"))
            .map(|p| (p.container_port, p.host_port))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The signal that stops it: its image's STOPSIGNAL when containerd recorded one.
    fn stop_signal(&self) -> u32 {
        let named = self.labels.get(STOP_SIGNAL).map(String::as_str);
        match named.map(|s| s.trim_start_matches("SIG")) {
            Some("INT") => 2,
            Some("QUIT") => 3,
            Some("HUP") => 1,
            Some("USR1") => 10,
            Some("USR2") => 12,
            Some("WINCH") => 28,
            _ => 15,
        }
    }
}

/// The one container `name` means among `found` (sandboxes left out): the running one, else
/// the newest.
fn pick<'a>(found: impl IntoIterator<Item = &'a Found>, name: &str) -> Option<&'a Found> {
    found
        .into_iter()
        .filter(|f| !f.is_sandbox() && f.answers_to(name))
        .max_by_key(|f| (f.state() == State::Running, f.created))
}

impl Containerd {
    /// `socket` "" is [`SOCKET`]; `namespaces` empty is [`NAMESPACES`].
    pub fn new(socket: &str, namespaces: &[String], timeout: Duration) -> Self {
        let socket = socket.strip_prefix("unix://").unwrap_or(socket);
        Self {
            socket: PathBuf::from(if socket.is_empty() { SOCKET } else { socket }),
            namespaces: if namespaces.is_empty() {
                NAMESPACES.iter().map(|n| n.to_string()).collect()
            } else {
                namespaces.to_vec()
            },
            timeout,
            cpu: Arc::default(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn channel(&self, namespace: &str) -> Result<Channel, CallError> {
        Channel::connect(&self.socket, namespace, self.timeout).await
    }

    /// "containerd 1.6.20~ds1"; None when it does not answer.
    pub async fn engine(&self) -> Option<String> {
        let mut ch = self.channel("default").await.ok()?;
        let v: api::VersionResponse = ch.call(api::VERSION, &api::Empty {}).await.ok()?;
        Some(format!("containerd {}", v.version))
    }

    /// Every container of the watched namespaces with its task, sandboxes left out.
    pub async fn list(&self) -> Result<Vec<Found>, EngineError> {
        let mut out = Vec::new();
        for ns in &self.namespaces {
            let err = |e: CallError| call_error("list", ns, e);
            let mut ch = self.channel(ns).await.map_err(err)?;
            let containers: api::ListContainersResponse = ch
                .call(api::CONTAINERS_LIST, &api::ListContainersRequest::default())
                .await
                .map_err(err)?;
            let tasks: api::ListTasksResponse = ch
                .call(api::TASKS_LIST, &api::ListTasksRequest::default())
                .await
                .map_err(err)?;
            let mut tasks: HashMap<String, api::Process> = tasks
                .tasks
                .into_iter()
                .map(|t| (t.container().to_string(), t))
                .collect();
            out.extend(containers.containers.into_iter().map(|c| Found {
                namespace: ns.clone(),
                task: tasks.remove(&c.id),
                id: c.id,
                labels: c.labels,
                created: c.created_at,
                snapshotter: c.snapshotter,
                snapshot_key: c.snapshot_key,
            }));
        }
        out.retain(|f| !f.is_sandbox());
        Ok(out)
    }

    /// The container `name` means among `all` (from [`Containerd::list`]), in the first
    /// namespace that has one.
    pub fn choose<'a>(&self, all: &'a [Found], name: &str) -> Option<&'a Found> {
        self.namespaces.iter().find_map(|ns| {
            let here = all.iter().filter(|f| &f.namespace == ns);
            pick(here, name)
        })
    }

    /// The container `name` means, in the first namespace that has one.
    pub async fn find(&self, name: &str) -> Result<Found, EngineError> {
        let all = self.list().await?;
        if let Some(f) = self.choose(&all, name) {
            return Ok(f.clone());
        }
        Err(EngineError::NoSuchContainer {
            engine: format!("containerd (namespaces {})", self.namespaces.join(", ")),
            name: name.to_string(),
        })
    }

    /// Where `name`'s network lives: its task's process and, from nerdctl's label, its
    /// published ports. Host network when the process shares the agent's namespace.
    pub async fn network_of(&self, name: &str) -> Result<ContainerNet, EngineError> {
        let found = self.find(name).await?;
        let pid = found.running_pid();
        let host_network = pid.is_some_and(|p| same_netns(Path::new(&format!("/proc/{p}"))));
        Ok(ContainerNet {
            pid,
            host_network,
            published: found.published(),
        })
    }

    /// Restarts `name` within `timeout`: its stop signal, SIGKILL after [`RESTART_GRACE`], then
    /// a new task from the same container. A container the kubelet manages is only stopped: the
    /// kubelet starts its replacement (a task started behind its back would be killed).
    pub async fn restart(&self, name: &str, timeout: Duration) -> Result<(), EngineError> {
        let work = async {
            let found = self.find(name).await?;
            let restarted = self.restart_found(&found).await;
            restarted.map_err(|e| call_error("restart", name, e))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(call_error(
                "restart",
                name,
                format!("not done within {}s", timeout.as_secs()),
            )),
        }
    }

    async fn restart_found(&self, found: &Found) -> Result<(), CallError> {
        let mut ch = self.channel(&found.namespace).await?;
        let task = api::TaskRequest {
            container_id: found.id.clone(),
        };
        if found.task.is_some() {
            // A frozen process cannot act on its stop signal: thaw it first.
            if found.state() == State::Paused {
                let _: api::Empty = ch.call(api::TASKS_RESUME, &task).await?;
            }
            if !matches!(found.state(), State::Exited(_)) {
                stop(&mut ch, &found.id, found.stop_signal()).await?;
            }
            if found.kubelet_managed() {
                return Ok(());
            }
            match ch.call::<_, api::Empty>(api::TASKS_DELETE, &task).await {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        } else if found.kubelet_managed() {
            return Ok(());
        }
        let rootfs = if found.snapshot_key.is_empty() {
            Vec::new()
        } else {
            let mounts: api::MountsResponse = ch
                .call(
                    api::SNAPSHOTS_MOUNTS,
                    &api::MountsRequest {
                        snapshotter: found.snapshotter.clone(),
                        key: found.snapshot_key.clone(),
                    },
                )
                .await?;
            mounts.mounts
        };
        let create = api::CreateTaskRequest {
            container_id: found.id.clone(),
            rootfs,
        };
        let _: api::Empty = ch.call(api::TASKS_CREATE, &create).await?;
        let _: api::Empty = ch.call(api::TASKS_START, &task).await?;
        Ok(())
    }

    /// CPU and memory from the cgroup of `found`'s running task; CPU % from the change since
    /// this container's previous look, so the first look has none.
    pub fn usage(&self, found: &Found) -> Usage {
        let Some(pid) = found.running_pid() else {
            return Usage::default();
        };
        let now = cgroup::of_pid(pid);
        let mut usage = Usage {
            memory_bytes: now.memory_bytes,
            memory_percent: now
                .memory_bytes
                .zip(now.memory_limit)
                .filter(|&(_, l)| l > 0)
                .map(|(m, l)| (m as f64 * 1000.0 / l as f64).round() / 10.0),
            cpu_percent: None,
        };
        if let Some(now_usec) = now.cpu_usec {
            let at = Instant::now();
            let prev = self
                .cpu
                .lock()
                .ok()
                .and_then(|mut m| m.insert(found.id.clone(), (now_usec, at)));
            if let Some((then_usec, then)) = prev {
                let wall = at.duration_since(then).as_micros() as f64;
                if wall > 0.0 {
                    let used = now_usec.saturating_sub(then_usec) as f64;
                    usage.cpu_percent = Some((used / wall * 1000.0).round() / 10.0);
                }
            }
        }
        usage
    }
}

/// Sends `signal` to every process of the task, then SIGKILL after [`RESTART_GRACE`]; returns
/// once containerd reports the task stopped.
async fn stop(ch: &mut Channel, id: &str, signal: u32) -> Result<(), CallError> {
    let kill = |signal| api::KillRequest {
        container_id: id.to_string(),
        signal,
        all: true,
    };
    let _: api::Empty = ch.call(api::TASKS_KILL, &kill(signal)).await?;
    if wait_stopped(ch, id, RESTART_GRACE).await? {
        return Ok(());
    }
    let _: api::Empty = ch.call(api::TASKS_KILL, &kill(9)).await?;
    // The caller's timeout bounds this wait.
    while !wait_stopped(ch, id, Duration::from_secs(1)).await? {}
    Ok(())
}

/// Whether the task stopped (or went away) within `within`.
async fn wait_stopped(ch: &mut Channel, id: &str, within: Duration) -> Result<bool, CallError> {
    let deadline = Instant::now() + within;
    let req = api::TaskRequest {
        container_id: id.to_string(),
    };
    loop {
        match ch.call::<_, api::GetResponse>(api::TASKS_GET, &req).await {
            Ok(r)
                if r.process
                    .as_ref()
                    .is_some_and(|p| p.status != status::STOPPED) => {}
            Ok(_) => return Ok(true),
            Err(e) if e.is_not_found() => return Ok(true),
            Err(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn call_error(call: &'static str, name: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Call {
        engine: "containerd",
        call,
        name: name.to_string(),
        reason: e.to_string(),
    }
}

/// Whether the process at `proc_dir` shares the agent's network namespace.
fn same_netns(proc_dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let ino = |p: &Path| std::fs::metadata(p).map(|m| m.ino()).ok();
    let theirs = ino(&proc_dir.join("ns/net"));
    theirs.is_some() && theirs == ino(Path::new("/proc/self/ns/net"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(id: &str, labels: &[(&str, &str)], status: Option<i32>, created: i64) -> Found {
        Found {
            namespace: "k8s.io".into(),
            id: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created: Some(api::Timestamp {
                seconds: created,
                nanos: 0,
            }),
            snapshotter: "overlayfs".into(),
            snapshot_key: id.into(),
            task: status.map(|s| api::Process {
                container_id: String::new(),
                id: id.into(),
                pid: 4242,
                status: s,
                exit_status: 137,
            }),
        }
    }

    #[test]
    fn a_container_answers_to_its_id_nerdctl_name_and_kubernetes_names() {
        let nerdctl = found("3f2a", &[(NERDCTL_NAME, "web")], None, 1);
        assert!(nerdctl.answers_to("web") && nerdctl.answers_to("3f2a"));
        assert_eq!(nerdctl.name(), "web");
        let pod = found(
            "9c1e",
            &[(K8S_POD, "shop-7d9f"), (K8S_CONTAINER, "puma")],
            None,
            1,
        );
        assert!(pod.answers_to("puma") && pod.answers_to("shop-7d9f/puma"));
        assert!(!pod.answers_to("shop-7d9f"));
        assert_eq!(pod.name(), "shop-7d9f/puma");
    }

    #[test]
    fn the_running_container_of_a_name_wins_then_the_newest_and_never_a_sandbox() {
        let web = [(K8S_CONTAINER, "web")];
        let exited_newer = found("b", &web, Some(status::STOPPED), 20);
        let running_older = found("a", &web, Some(status::RUNNING), 10);
        let sandbox = found(
            "s",
            &[(K8S_CONTAINER, "web"), (CRI_KIND, "sandbox")],
            Some(status::RUNNING),
            30,
        );
        let all = [exited_newer.clone(), running_older, sandbox];
        assert_eq!(pick(&all, "web").unwrap().id, "a");
        let none_running = [exited_newer, found("c", &web, None, 5)];
        assert_eq!(pick(&none_running, "web").unwrap().id, "b");
        assert!(pick(&all, "db").is_none());
    }

    #[test]
    fn task_states_read_as_the_engine_api_names_them() {
        let state = |s| found("x", &[], s, 1).state();
        assert_eq!(state(Some(status::RUNNING)), State::Running);
        assert_eq!(state(Some(status::PAUSED)), State::Paused);
        assert_eq!(state(Some(status::STOPPED)), State::Exited(Some(137)));
        assert_eq!(state(None), State::Exited(None), "no task: not running");
        assert_eq!(
            found("x", &[], Some(status::STOPPED), 1).running_pid(),
            None
        );
        assert_eq!(
            found("x", &[], Some(status::RUNNING), 1).running_pid(),
            Some(4242)
        );
    }

    #[test]
    fn nerdctl_published_tcp_ports_are_read_and_bad_labels_give_none() {
        let ports = r#"[{"HostPort":8081,"ContainerPort":80,"Protocol":"tcp","HostIP":"127.0.0.1"},{"HostPort":5353,"ContainerPort":53,"Protocol":"udp","HostIP":"0.0.0.0"}]"#;
        assert_eq!(
            found("x", &[(NERDCTL_PORTS, ports)], None, 1).published(),
            vec![(80, 8081)]
        );
        assert!(found("x", &[(NERDCTL_PORTS, "{not json")], None, 1)
            .published()
            .is_empty());
    }

    #[test]
    fn the_image_stop_signal_is_used() {
        assert_eq!(
            found("x", &[(STOP_SIGNAL, "SIGQUIT")], None, 1).stop_signal(),
            3
        );
        assert_eq!(found("x", &[], None, 1).stop_signal(), 15);
    }

    #[test]
    fn socket_and_namespaces_default_when_unset() {
        let c = Containerd::new("", &[], Duration::from_secs(1));
        assert_eq!(c.socket(), Path::new(SOCKET));
        assert_eq!(c.namespaces, ["k8s.io", "default"]);
        let c = Containerd::new(
            "unix:///host/run/containerd/containerd.sock",
            &["apps".into()],
            Duration::from_secs(1),
        );
        assert_eq!(
            c.socket(),
            Path::new("/host/run/containerd/containerd.sock")
        );
        assert_eq!(c.namespaces, ["apps"]);
    }
}
