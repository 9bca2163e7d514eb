//! Containers and self-healing on a real containerd (Debian's, on its own socket as on a
//! Kubernetes node), through its gRPC API: a killed container restarted before any 503, one
//! that dies on every start 503 once the restart budget is spent, a pod's container in
//! `k8s.io` found by its Kubernetes names with its sandbox left out, and a container in a
//! network namespace of its own watched there and followed into its new one after a restart.

use std::time::{Duration, Instant};

use health_agent_tests::{
    check_json, containerd::SOCKET, get, netns_inode, require_root, timeline, wait_until, Agent,
    CtrContainer, HealthPoller,
};

const WAIT: Duration = Duration::from_secs(40);

/// Panics, with the timeline, if `poller` recorded any 503.
fn assert_no_503(poller: &HealthPoller, why: &str) {
    let samples = poller.samples();
    assert!(
        samples.iter().all(|s| s.code != 503),
        "{why}:\n{}",
        timeline(&samples)
    );
}

/// `[containers]` naming containerd's socket: this host has Docker's too, which the agent
/// would find first.
fn containerd_config(web: &CtrContainer, name: &str, heal: &str) -> String {
    format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"{name}\"\nhung_after = \"2s\"\n\
         probe_timeout = \"1s\"\n[containers]\nnames = [\"{name}\"]\ncontainerd_socket = \"{SOCKET}\"\n\
         [heal]\n{heal}",
        web.port
    )
}

#[test]
fn killed_containerd_container_is_restarted_without_a_503() {
    require_root();
    let name = format!("web-{}", std::process::id());
    let web = CtrContainer::serving("default", "killed", &[("nerdctl/name", &name)], &[]);
    let agent = Agent::start(&containerd_config(&web, &name, "timeout = \"20s\"\n"));
    let (_, body) = agent.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    assert_eq!(body["checks"]["containers"], "1/1 running", "{body}");
    let engine = body["details"]["containers"]["engine"]
        .as_str()
        .unwrap_or("");
    assert!(engine.starts_with("containerd "), "{engine:?}");
    let before = web.pid().expect("a running task");

    let poller = HealthPoller::start(agent.port);
    let killed = Instant::now();
    web.kill();
    let (_, body) = agent.wait_health(WAIT, "healed", |c, b| {
        c == 200 && b["status"] == "healthy" && b["details"]["heal"]["total_recovered"] == 1
    });
    let healed = killed.elapsed();
    eprintln!(
        "{engine}: kill -9 to healthy again {:.2} s",
        healed.as_secs_f64()
    );
    assert_no_503(&poller, "self-heal must come before any 503");
    let heal = &body["details"]["heal"];
    assert_eq!(heal["total_attempts"], 1, "{heal}");
    assert_eq!(
        heal["attempts"][0]["action"],
        format!("containerd restart {name}")
    );
    assert_eq!(heal["attempts"][0]["outcome"], "recovered");
    assert_eq!(web.status(), "RUNNING");
    let after = web.pid().expect("a running task again");
    assert_ne!(before, after, "a new task, not the old one");
    assert_eq!(get(web.port, "/up").map(|(c, _)| c).ok(), Some(200));
}

#[test]
fn crash_looping_containerd_container_turns_503_within_the_budget() {
    require_root();
    let name = format!("crashloop-{}", std::process::id());
    // The fixture in `exit` mode dies at once, on every start.
    let web = CtrContainer::run(
        "default",
        "crashloop",
        &[("nerdctl/name", &name)],
        &["--mode", "exit"],
    );
    wait_until(Duration::from_secs(10), "the task to stop", || {
        (web.status() == "STOPPED").then_some(())
    });
    let started = Instant::now();
    let agent = Agent::start(&containerd_config(
        &web,
        &name,
        "max_restarts = 2\nwindow = \"10m\"\ntimeout = \"3s\"\n",
    ));
    // The task of the last restart may still run for a moment on a busy machine: wait for it
    // to settle as the check sees it.
    let (code, body) = agent.wait_health(WAIT, "503 once heals failed", |c, b| {
        c == 503
            && b["details"]["heal"]["budget_spent"] == true
            && b["details"]["heal"]["phase"] == "exhausted"
            && b["checks"]["containers"] == "0/1 running"
    });
    eprintln!(
        "containerd: agent start to 503 after 2 failed restarts {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(code, 503);
    assert_eq!(body["checks"]["containers"], "0/1 running");
    let reason = body["details"]["containers"]["reason"]
        .as_str()
        .unwrap_or("");
    assert!(reason.contains(&format!("{name} exited")), "{body}");
    // Give it time to (wrongly) try again: the budget holds.
    std::thread::sleep(Duration::from_secs(6));
    let (code, body) = agent.health();
    assert_eq!(code, 503);
    let heal = &body["details"]["heal"];
    assert_eq!(
        heal["total_attempts"], 2,
        "no more than max_restarts: {heal}"
    );
    for a in heal["attempts"].as_array().unwrap() {
        assert_eq!(a["outcome"], "failed", "{a}");
        assert_eq!(a["action"], format!("containerd restart {name}"));
    }
}

#[test]
fn a_pods_container_in_k8s_io_is_found_by_its_kubernetes_names_and_left_to_the_kubelet() {
    require_root();
    let pid = std::process::id();
    let (pod, namespace, uid) = (
        format!("shop-{pid}"),
        format!("ha-test-{pid}"),
        format!("0000-{pid}"),
    );
    let pod_labels = [
        ("io.kubernetes.pod.name", pod.as_str()),
        ("io.kubernetes.pod.namespace", namespace.as_str()),
        ("io.kubernetes.pod.uid", uid.as_str()),
    ];
    // The pod's sandbox, as the CRI plugin labels it: never a watched container.
    let mut sandbox_labels = pod_labels.to_vec();
    sandbox_labels.push(("io.cri-containerd.kind", "sandbox"));
    let _sandbox = CtrContainer::serving("k8s.io", "sandbox", &sandbox_labels, &[]);
    let mut labels = pod_labels.to_vec();
    labels.extend([
        ("io.cri-containerd.kind", "container"),
        ("io.kubernetes.container.name", "puma"),
    ]);
    let puma = CtrContainer::serving("k8s.io", "puma", &labels, &[]);
    // Found by label (its pod's namespace), and the web check follows it by container name.
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"puma\"\n\
         [containers]\nlabels = [\"io.kubernetes.pod.namespace={namespace}\"]\n\
         containerd_socket = \"{SOCKET}\"\n[heal]\ntimeout = \"30s\"\n",
        puma.port
    ));
    let (_, body) = agent.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    let containers = &body["details"]["containers"];
    assert_eq!(body["checks"]["containers"], "1/1 running", "{containers}");
    assert_eq!(containers["containers"][0]["name"], format!("{pod}/puma"));
    assert_eq!(body["checks"]["webserver"], "up", "{body}");
    let m = containers["containers"][0]["memory_bytes"]
        .as_u64()
        .unwrap_or(0);
    assert!(m > 0, "memory from the task's cgroup: {containers}");

    let poller = HealthPoller::start(agent.port);
    puma.kill();
    let (_, body) = agent.wait_health(WAIT, "a restart attempt", |_, b| {
        b["details"]["heal"]["total_attempts"] == 1
    });
    let attempt = &body["details"]["heal"]["attempts"][0];
    assert_eq!(attempt["action"], "containerd restart puma", "{attempt}");
    // The kubelet starts a pod's containers: the agent only stopped it, and started nothing.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        puma.status(),
        "STOPPED",
        "the agent must not start the kubelet's container"
    );
    let (_, body) = agent.health();
    let c = &body["details"]["containers"]["containers"][0];
    assert_eq!(
        (&c["state"], &c["exit_code"]),
        (&"exited".into(), &137.into()),
        "{c}"
    );

    // The kubelet's replacement: a new container of the same names, the exited one kept.
    let _replacement = CtrContainer::run_on_port("k8s.io", "puma2", &labels, puma.port, &[]);
    let (_, body) = agent.wait_health(WAIT, "healed by the replacement", |c, b| {
        c == 200 && b["status"] == "healthy" && b["details"]["heal"]["total_recovered"] == 1
    });
    assert_eq!(
        body["checks"]["containers"], "1/1 running",
        "the running one of the two"
    );
    assert_no_503(
        &poller,
        "recovering, never 503, while the kubelet replaces it",
    );
}

#[test]
fn a_container_in_its_own_network_namespace_is_watched_there_and_followed_across_a_restart() {
    require_root();
    let name = format!("isolated-{}", std::process::id());
    let web = CtrContainer::run_isolated("default", "isolated", &[("nerdctl/name", &name)]);
    let agent = Agent::start(&containerd_config(&web, &name, "timeout = \"20s\"\n"));
    // The probe reaches the backend only from inside its namespace: `up` is the agent there.
    let (_, body) = agent.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    let ns = &body["details"]["web"]["namespace"];
    let pid = web.pid().expect("a running task");
    assert_eq!(ns["source"], "container", "{ns}");
    assert_eq!(ns["path"], format!("/proc/{pid}/ns/net"), "{ns}");
    let inode = netns_inode(format!("/proc/{pid}/ns/net"));
    assert_eq!(ns["inode"], inode, "{ns}");
    assert_ne!(
        inode,
        netns_inode("/proc/self/ns/net"),
        "a namespace of its own"
    );

    let poller = HealthPoller::start(agent.port);
    web.kill();
    let (_, body) = agent.wait_health(WAIT, "healed in a new namespace", |c, b| {
        c == 200
            && b["status"] == "healthy"
            && b["details"]["heal"]["total_recovered"] == 1
            && b["details"]["web"]["namespace"]["inode"] != inode
    });
    assert_no_503(&poller, "self-heal must come before any 503");
    let after = web.pid().expect("a running task again");
    let ns = &body["details"]["web"]["namespace"];
    assert_eq!(
        ns["path"],
        format!("/proc/{after}/ns/net"),
        "followed: {ns}"
    );
    eprintln!(
        "containerd, own namespace: inode {inode} before the kill, {} after the restart",
        ns["inode"]
    );
}

/// No containerd where the config says: the containers check cannot know, and says why; a
/// warning, never a 503 (`health-agent check` exits 0).
#[test]
fn an_absent_containerd_is_unknown_never_503() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("containerd.sock");
    let (code, body) = check_json(&format!(
        "[containers]\nnames = [\"web\"]\ncontainerd_socket = {:?}\n",
        socket.display().to_string()
    ));
    assert_eq!(code, Some(0), "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["checks"]["containers"], "unknown");
    let reason = body["details"]["containers"]["reason"]
        .as_str()
        .unwrap_or("");
    assert!(
        reason.starts_with("containerd did not answer")
            && reason.contains(&socket.display().to_string()),
        "{reason}"
    );
    assert!(
        body["reasons"]
            .to_string()
            .contains("container state unknown: the container engine did not answer"),
        "{body}"
    );
}
