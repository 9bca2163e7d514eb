//! Backends the agent sees in another network namespace: a container on Docker's bridge
//! network (watched by its container port, or by the port it is published on; a server on `::`
//! in a container without IPv6), a process in a namespace of its own reached over a veth pair,
//! a backend on `::1` only, and the same port in two namespaces, each with its own agent.
//!
//! Each test serves real traffic (~10 new connections a second) for longer than
//! `unanswered_after`, with every `/health` answer 200 `up`; then freezes the backend under
//! that traffic (503 `hung` within 4 s, self-heal off); then thaws it (200 again). One test
//! turns self-heal on instead: the paused container is restarted, never a 503. Every answer
//! of the run is recorded ([`HealthPoller`]) and asserted over.
//!
//! Test traffic goes to 127.0.0.0/8, `::1` and addresses inside namespaces the tests create
//! (10.213.0.0/16); containers are published on 127.0.0.1 only. The `harness_*` tests check
//! those pieces without an agent.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::Value;

use health_agent_tests::{
    assert_answered, get_at, get_at_within, merge_toml, netns_inode, pretty, require_root, since,
    tail, timeline, wait_until, web_config, AddrFixture, Agent, BridgeContainer, Engine,
    HealthPoller, HealthSample, Load, LoadStats, NetNs, Watch,
};

/// Agent start to its first 200.
const READY: Duration = Duration::from_secs(30);
/// How long the backend serves, watched, before the freeze: longer than `unanswered_after`.
const SERVE: Duration = Duration::from_millis(5500);
/// Freeze to 503 `hung`, at most.
const HUNG_WITHIN: Duration = Duration::from_secs(4);
/// Thaw to 200, at most.
const BACK_WITHIN: Duration = Duration::from_secs(15);
/// The web port inside a [`NetNs`] (the namespace is the test's own: always free).
const NS_PORT: u16 = 8080;

/// Agent config: the web check on `port`, probing `/up`, requests unanswered for 3 s count,
/// a 500 ms cadence, a 1 s recovery, no self-heal (a freeze is a 503, not a restart), and the
/// CPU/memory scaling thresholds out of the way. `web_extra` goes into `[web]`.
fn config(port: u16, web_extra: &str) -> String {
    let ours = format!("[web]\nunanswered_after = \"3s\"\n{web_extra}[heal]\nenabled = false\n");
    web_config(port, &ours)
}

/// ~10 requests a second, each on a new connection; a request waits up to 10 s for its answer
/// (so a frozen backend holds them past `unanswered_after`).
fn traffic(addr: SocketAddr) -> Load {
    Load::new_connections_to(
        addr,
        "/",
        5,
        Duration::from_millis(500),
        Duration::from_secs(10),
    )
}

/// What a failed assertion prints: every answer, the load, the backend's and agent's logs.
fn context(samples: &[HealthSample], load: &Load, backend_log: &str, agent: &Agent) -> String {
    format!(
        "\n/health answers:\n{}load: {}\nbackend log (tail):\n{}\nagent log (tail):\n{}\nlast body: {}",
        timeline(samples),
        load.stats(),
        tail(backend_log, 20),
        tail(&agent.logs(), 40),
        samples.last().map(|s| pretty(&s.body)).unwrap_or_default()
    )
}

/// One agent watching one backend under traffic, every `/health` answer recorded.
struct Run<'a> {
    poller: HealthPoller,
    agent: Agent,
    load: Load,
    backend_log: &'a dyn Fn() -> String,
}

impl Watch for Run<'_> {
    fn poller(&self) -> &HealthPoller {
        &self.poller
    }

    fn explain(&self) -> String {
        self.context(&self.poller.samples())
    }
}

impl<'a> Run<'a> {
    /// `agent`'s answers recorded from now on, the backend at `target` under [`traffic`].
    fn start(agent: Agent, target: SocketAddr, backend_log: &'a dyn Fn() -> String) -> Self {
        Self {
            poller: HealthPoller::start(agent.port),
            agent,
            load: traffic(target),
            backend_log,
        }
    }

    fn context(&self, samples: &[HealthSample]) -> String {
        context(samples, &self.load, &(self.backend_log)(), &self.agent)
    }

    /// Waits for the agent's first 200, lets the backend serve for [`SERVE`], and asserts every
    /// answer from that first 200 on was 200 with `checks.webserver == "up"` and
    /// `details.web.listening`. Returns (the first 200, the last answer of the serving period).
    fn serve(&self) -> (HealthSample, HealthSample) {
        let ready = self.wait(READY, "the first 200", |s| s.code == 200);
        while self.poller.elapsed() < ready.at + SERVE {
            std::thread::sleep(Duration::from_millis(100));
        }
        let samples = since(&self.poller.samples(), ready.at);
        let ctx = self.context(&samples);
        assert!(
            samples.len() >= 20,
            "only {} answers in {SERVE:?} of serving (the poller asks every 200 ms){ctx}",
            samples.len()
        );
        if let Some(s) = samples
            .iter()
            .find(|s| s.code != 200 || s.webserver != "up" || s.web()["listening"] != true)
        {
            panic!(
                "while the backend served, an answer was not 200 `up` with details.web.listening: {s}\nits body: {}{ctx}",
                pretty(&s.body)
            );
        }
        let stats = self.load.stats();
        assert!(
            stats.count(200) >= 30 && stats.timeouts == 0 && stats.errors == 0,
            "the traffic did not flow while the backend served (harness problem?): {stats}{ctx}"
        );
        let last = samples.last().expect("checked above").clone();
        println!(
            "serving: {last}\n  details.web.namespace = {}\n  details.web.probe.target = {}",
            last.web()["namespace"],
            last.web()["probe"]["target"]
        );
        (ready, last)
    }

    /// Freezes the backend under traffic: 503 `hung` within [`HUNG_WITHIN`] (the measured time
    /// is printed); thaws it: 200 within [`BACK_WITHIN`]. Returns (freeze time, the 503, the 200).
    fn freeze_and_thaw(
        &self,
        what: &str,
        freeze: impl FnOnce(),
        thaw: impl FnOnce(),
    ) -> (Duration, HealthSample, HealthSample) {
        let answered_before = self.load.stats().count(200);
        freeze();
        let frozen = self.poller.elapsed();
        // Waits past the bound, so a late verdict is reported with its time, not as a timeout.
        let hung = self.wait(
            HUNG_WITHIN + Duration::from_secs(4),
            &format!("503 with webserver `hung` after {what}"),
            |s| s.code == 503 && s.webserver == "hung",
        );
        let took = hung.after(frozen);
        println!("{what} → 503 hung in {took:.1}s ({hung})");
        let answered_frozen = self.load.stats().count(200);
        let ctx = self.context(&self.poller.samples());
        assert!(
            took <= HUNG_WITHIN.as_secs_f64(),
            "503 `hung` only {took:.1}s after {what} (≤ {HUNG_WITHIN:?} expected){ctx}"
        );
        assert_eq!(
            hung.status,
            "unhealthy",
            "{hung}\nits body: {}{ctx}",
            pretty(&hung.body)
        );
        // Requests in flight at the freeze may still have been answered; more than a handful
        // means the freeze did not freeze (harness problem).
        assert!(
            answered_frozen <= answered_before + 5,
            "{} answers while frozen (harness problem: {what} did not freeze the backend){ctx}",
            answered_frozen - answered_before
        );

        thaw();
        let thawed = self.poller.elapsed();
        let back = self.wait(
            BACK_WITHIN,
            &format!("200 after the thaw that followed {what}"),
            |s| s.code == 200,
        );
        println!("thaw → 200 in {:.1}s ({back})", back.after(thawed));
        (frozen, hung, back)
    }

    /// Stops the load and the poller, prints the run as `label`, asserts the agent answered
    /// every time from `from` on, and returns those answers with the load's figures.
    fn finish(self, label: &str, from: Duration) -> (Vec<HealthSample>, LoadStats) {
        let stats = self.load.stop();
        let samples = since(&self.poller.stop(), from);
        println!("{label}: {stats}\n{}", timeline(&samples));
        let ctx = format!(
            "\n{}agent log:\n{}",
            timeline(&samples),
            tail(&self.agent.logs(), 40)
        );
        assert_answered(&samples, &ctx);
        (samples, stats)
    }
}

/// `details.web.namespace`, with the sample in the message when a field is off.
fn namespace(s: &HealthSample) -> &Value {
    &s.web()["namespace"]
}

fn assert_field(s: &HealthSample, field: &str, got: &Value, want: Value) {
    assert_eq!(
        *got,
        want,
        "{field} is {got}, expected {want}; the answer: {s}\nits body: {}",
        pretty(&s.body)
    );
}

/// The `namespace.path` the agent reports for `ns`: the configured path, or where it leads.
fn same_path(got: &Value, ns: &NetNs) -> bool {
    let p = ns.path();
    let canonical = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
    got.as_str()
        .is_some_and(|g| Path::new(g) == p || Path::new(g) == canonical)
}

// ---------------------------------------------------------------------------------------
// Docker's bridge network
// ---------------------------------------------------------------------------------------

#[test]
fn bridge_container_by_container_port() {
    bridge_container(Engine::Docker, false);
}

#[test]
fn bridge_container_by_published_port() {
    bridge_container(Engine::Docker, true);
}

#[test]
fn podman_bridge_container_by_published_port() {
    bridge_container(Engine::Podman, true);
}

/// The fixture in a container on the default bridge, published on 127.0.0.1 only; traffic
/// through the published port. The agent is told the container and either the port inside
/// it or the host port it is published on — in both cases it watches the container's own
/// namespace on the container port, found through `engine`'s Engine API (its Pid). Freeze:
/// `docker pause` (`podman pause`).
fn bridge_container(engine: Engine, by_published_port: bool) {
    require_root();
    let label = if by_published_port { "pub" } else { "cport" };
    let web = BridgeContainer::run_on(engine, label, "0.0.0.0", &[]);
    let port = if by_published_port {
        web.host_port
    } else {
        web.container_port
    };
    let agent = Agent::start(&format!(
        "{}[containers]\ndocker_host = {:?}\n",
        config(port, &format!("container = {:?}\n", web.name)),
        engine.host()
    ));
    let logs = || web.logs();
    let run = Run::start(agent, web.host_addr(), &logs);

    let (ready, serving) = run.serve();
    let ns = namespace(&serving);
    assert_field(
        &serving,
        "namespace.source",
        &ns["source"],
        "container".into(),
    );
    assert_field(
        &serving,
        "namespace.container",
        &ns["container"],
        web.name.as_str().into(),
    );
    assert_field(
        &serving,
        "namespace.port (the port inside the container)",
        &ns["port"],
        web.container_port.into(),
    );
    assert_field(
        &serving,
        "namespace.published_port",
        &ns["published_port"],
        if by_published_port {
            web.host_port.into()
        } else {
            Value::Null
        },
    );
    assert_field(
        &serving,
        "namespace.inode (the container's network namespace)",
        &ns["inode"],
        web.netns_inode().into(),
    );
    assert!(
        ns["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/proc/") && p.ends_with("/ns/net")),
        "namespace.path is not /proc/PID/ns/net: {}\nbody: {}",
        ns["path"],
        pretty(&serving.body)
    );

    let pause = format!("{} pause", engine.cli());
    run.freeze_and_thaw(&pause, || web.pause(), || web.unpause());
    let by = if by_published_port {
        "published"
    } else {
        "container"
    };
    run.finish(
        &format!("{engine:?} bridge container by {by} port"),
        ready.at,
    );
}

/// Issue 18 §1 on Docker's bridge: a container frozen with `docker pause` under traffic is
/// `hung`, self-heal restarts it (`docker restart`, thawed first) and it comes back in a new
/// network namespace: `recovering` meanwhile, `healthy` after, never a 503, one attempt judged
/// recovered. On Podman's bridge the same, through its Docker-compatible API.
#[test]
fn bridge_container_paused_and_restarted_is_healthy_again_without_a_503() {
    paused_and_restarted_is_healthy_again_without_a_503(Engine::Docker);
}

#[test]
fn podman_bridge_container_paused_and_restarted_is_healthy_again_without_a_503() {
    paused_and_restarted_is_healthy_again_without_a_503(Engine::Podman);
}

fn paused_and_restarted_is_healthy_again_without_a_503(engine: Engine) {
    require_root();
    let web = BridgeContainer::run_on(engine, "heal", "0.0.0.0", &[]);
    let agent = Agent::start(&merge_toml(
        &config(web.container_port, &format!("container = {:?}\n", web.name)),
        &format!(
            "[heal]\nenabled = true\n[containers]\ndocker_host = {:?}\n",
            engine.host()
        ),
    ));
    let logs = || web.logs();
    let run = Run::start(agent, web.host_addr(), &logs);
    let (ready, serving) = run.serve();
    let inode_before = namespace(&serving)["inode"].clone();
    assert_eq!(inode_before, Value::from(web.netns_inode()));

    web.pause();
    let paused = run.poller.elapsed();
    let healed = run.wait(
        Duration::from_secs(40),
        "healthy after docker restart",
        |s| {
            s.code == 200
                && s.status == "healthy"
                && s.webserver == "up"
                && s.body["details"]["heal"]["total_recovered"] == 1
        },
    );
    println!(
        "{engine:?}: pause → healthy again in {:.1}s ({healed})",
        healed.after(paused)
    );
    let ctx = run.context(&since(&run.poller.samples(), ready.at));
    let (samples, _) = run.finish(&format!("{engine:?} paused and restarted"), ready.at);
    if let Some(s) = samples.iter().find(|s| s.code != 200) {
        panic!(
            "a {} while self-heal restarted the container: {s}{ctx}",
            s.code
        );
    }
    // `docker restart` thaws the container first: its server drains the queue and answers
    // (`up`, honestly) until it is stopped, so `recovering` may last less than one poll.
    let heal = &healed.body["details"]["heal"];
    assert_eq!(heal["total_attempts"], 1, "{heal}{ctx}");
    let a = &heal["attempts"][0];
    assert!(
        a["reason"]
            .as_str()
            .is_some_and(|r| r.contains("hung") && r.contains("frozen")),
        "the restart was for the frozen server: {a}{ctx}"
    );
    assert_eq!(a["action"], format!("docker restart {}", web.name), "{a}");
    assert_eq!(a["outcome"], "recovered", "{a}{ctx}");
    assert!(
        a["why"]
            .as_str()
            .is_some_and(|w| w.contains("webserver up")),
        "the attempt says why it was judged recovered: {a}{ctx}"
    );
    let inode_after = namespace(&healed)["inode"].clone();
    assert_ne!(
        inode_after, inode_before,
        "the restarted container's new namespace is watched{ctx}"
    );
    assert_eq!(inode_after, Value::from(web.netns_inode()), "{ctx}");
}

/// Issue 18 §2: a server listening on `::` (dual-stack) in a bridge container with Docker's
/// default IPv6 setting (off inside the container). `::1` cannot even be tried there, so the
/// probe goes to 127.0.0.1, which the dual-stack listener answers: 200 `up` while it serves —
/// without traffic, past the boot grace and for longer than `unanswered_after`, then with
/// traffic — and `docker pause` is 503 `hung` within 4 s.
#[test]
fn bridge_container_dual_stack_listener_without_ipv6() {
    require_root();
    let web = BridgeContainer::run_listening_on("dual", "[::]", &[]);
    assert!(
        web.ipv6_addresses().is_empty(),
        "the container has IPv6 addresses (harness: Docker's default turns IPv6 off): {:?}",
        web.ipv6_addresses()
    );
    let agent = Agent::start(&merge_toml(
        &config(web.container_port, &format!("container = {:?}\n", web.name)),
        "[checks]\nboot_grace = \"2s\"\n",
    ));
    let poller = HealthPoller::start(agent.port);
    let logs = || web.logs();
    let quiet = poller.wait_for_explained(
        READY,
        "the first 200 without traffic",
        |s| s.code == 200,
        || {
            format!(
                "\n/health answers:\n{}agent log (tail):\n{}",
                timeline(&poller.samples()),
                tail(&agent.logs(), 40)
            )
        },
    );
    // No traffic at all: past the 2 s boot grace and past unanswered_after (3 s).
    while poller.elapsed() < quiet.at + SERVE {
        std::thread::sleep(Duration::from_millis(100));
    }
    let idle = since(&poller.samples(), quiet.at);
    let idle_ctx = format!(
        "\n/health answers:\n{}backend log (tail):\n{}\nagent log (tail):\n{}",
        timeline(&idle),
        tail(&logs(), 20),
        tail(&agent.logs(), 40)
    );
    if let Some(s) = idle.iter().find(|s| s.code != 200 || s.webserver != "up") {
        panic!(
            "without traffic, an answer was not 200 `up`: {s}\nits body: {}{idle_ctx}",
            pretty(&s.body)
        );
    }
    let last = idle.last().expect("answers while idle");
    assert!(
        idle.iter().any(|s| s.status == "healthy"),
        "never `healthy` after the boot grace{idle_ctx}"
    );
    assert_field(
        last,
        "probe.target (127.0.0.1: the namespace has no ::1)",
        &last.web()["probe"]["target"],
        format!("127.0.0.1:{}", web.container_port).into(),
    );
    println!(
        "idle: {last}\n  details.web.probe = {}",
        last.web()["probe"]
    );

    let run = Run {
        poller,
        agent,
        load: traffic(web.host_addr()),
        backend_log: &logs,
    };
    let (_, serving) = run.serve();
    assert_field(
        &serving,
        "namespace.inode (the container's network namespace)",
        &namespace(&serving)["inode"],
        web.netns_inode().into(),
    );
    run.freeze_and_thaw("docker pause", || web.pause(), || web.unpause());
    run.finish("dual-stack listener, no IPv6", quiet.at);
}

// ---------------------------------------------------------------------------------------
// A namespace of its own
// ---------------------------------------------------------------------------------------

/// The fixture inside a namespace on the namespace's own address (not 0.0.0.0), traffic from
/// the host over the veth pair; the agent is given the namespace's path. Freeze: SIGSTOP.
#[test]
fn netns_backend_on_its_own_address() {
    require_root();
    let ns = NetNs::create("own");
    let backend = AddrFixture::in_netns(&ns, NS_PORT, "normal");
    let agent = Agent::start(&config(
        NS_PORT,
        &format!("netns = {:?}\n", ns.path().display().to_string()),
    ));
    let logs = || backend.logs();
    let run = Run::start(agent, backend.listen, &logs);

    let (ready, serving) = run.serve();
    let nsj = namespace(&serving);
    assert_field(&serving, "namespace.source", &nsj["source"], "netns".into());
    assert!(
        same_path(&nsj["path"], &ns),
        "namespace.path is {}, expected {}; body: {}",
        nsj["path"],
        ns.path().display(),
        pretty(&serving.body)
    );
    assert_field(
        &serving,
        "namespace.inode",
        &nsj["inode"],
        ns.inode().into(),
    );
    assert_field(&serving, "namespace.port", &nsj["port"], NS_PORT.into());
    assert_field(
        &serving,
        "details.web.probe.target",
        &serving.web()["probe"]["target"],
        format!("{}:{NS_PORT}", ns.inside_ip()).into(),
    );

    run.freeze_and_thaw("SIGSTOP", || backend.sigstop(), || backend.sigcont());
    run.finish(&format!("backend in {}", ns.name), ready.at);
}

/// The fixture on `[::1]:PORT` only, in the agent's own namespace. Freeze: SIGSTOP.
#[test]
fn ipv6_loopback_only_backend() {
    require_root();
    let backend = AddrFixture::on_ip(IpAddr::V6(Ipv6Addr::LOCALHOST), "normal");
    let port = backend.listen.port();
    let agent = Agent::start(&config(port, ""));
    let logs = || backend.logs();
    let run = Run::start(agent, backend.listen, &logs);

    let (ready, serving) = run.serve();
    assert_field(
        &serving,
        "details.web.probe.target",
        &serving.web()["probe"]["target"],
        format!("[::1]:{port}").into(),
    );
    let nsj = namespace(&serving);
    assert_field(&serving, "namespace.source", &nsj["source"], "own".into());
    assert_field(&serving, "namespace.port", &nsj["port"], port.into());
    assert_field(
        &serving,
        "namespace.inode (the agent's own)",
        &nsj["inode"],
        netns_inode("/proc/self/ns/net").into(),
    );

    run.freeze_and_thaw("SIGSTOP", || backend.sigstop(), || backend.sigcont());
    run.finish(&format!("backend on [::1]:{port}"), ready.at);
}

/// Two namespaces, the same port in each, an agent for each. Only A's backend is frozen: A
/// says 503 `hung`; B says 200 `up` all along.
#[test]
fn same_port_in_two_namespaces_only_the_frozen_one_reacts() {
    require_root();
    let ns_a = NetNs::create("a");
    let ns_b = NetNs::create("b");
    let backend_a = AddrFixture::in_netns(&ns_a, NS_PORT, "normal");
    let backend_b = AddrFixture::in_netns(&ns_b, NS_PORT, "normal");
    let netns = |ns: &NetNs| format!("netns = {:?}\n", ns.path().display().to_string());
    let agent_a = Agent::start(&config(NS_PORT, &netns(&ns_a)));
    let agent_b = Agent::start(&config(NS_PORT, &netns(&ns_b)));
    let (logs_a, logs_b) = (|| backend_a.logs(), || backend_b.logs());
    let run_a = Run::start(agent_a, backend_a.listen, &logs_a);
    let run_b = Run::start(agent_b, backend_b.listen, &logs_b);

    let ready_b = run_b.wait(READY, "agent B's first 200", |s| s.code == 200);
    let (ready_a, serving_a) = run_a.serve();
    let serving_b = run_b.poller.samples().last().cloned().expect("B answered");
    for (s, ns) in [(&serving_a, &ns_a), (&serving_b, &ns_b)] {
        let nsj = namespace(s);
        assert_field(s, "namespace.source", &nsj["source"], "netns".into());
        assert_field(s, "namespace.inode", &nsj["inode"], ns.inode().into());
        assert_field(s, "namespace.port", &nsj["port"], NS_PORT.into());
        assert_field(
            s,
            "details.web.probe.target",
            &s.web()["probe"]["target"],
            format!("{}:{NS_PORT}", ns.inside_ip()).into(),
        );
    }
    assert_ne!(
        namespace(&serving_a)["inode"],
        namespace(&serving_b)["inode"],
        "the two agents report the same namespace inode"
    );

    run_a.freeze_and_thaw(
        "SIGSTOP of A's backend",
        || backend_a.sigstop(),
        || backend_a.sigcont(),
    );
    let (samples_a, _) = run_a.finish(&format!("A ({})", ns_a.name), ready_a.at);
    let (samples_b, stats_b) = run_b.finish(&format!("B ({})", ns_b.name), ready_b.at);
    let ctx = format!(
        "\nA's answers:\n{}B's answers:\n{}B's load: {stats_b}",
        timeline(&samples_a),
        timeline(&samples_b),
    );
    if let Some(s) = samples_b
        .iter()
        .find(|s| s.code != 200 || s.webserver != "up")
    {
        panic!(
            "agent B reacted to A's freeze (or something else): {s}\nits body: {}{ctx}",
            pretty(&s.body)
        );
    }
    assert!(
        stats_b.count(200) >= 50 && stats_b.timeouts == 0 && stats_b.errors == 0,
        "B's backend did not serve all along (harness problem?){ctx}"
    );
}

// ---------------------------------------------------------------------------------------
// The harness alone (no agent)
// ---------------------------------------------------------------------------------------

/// 1.5 s of about 20 requests a second to `target`, each on a new connection: all answered.
fn assert_load_flows(target: SocketAddr, what: &str) {
    let load = Load::new_connections_to(
        target,
        "/",
        2,
        Duration::from_millis(100),
        Duration::from_secs(2),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let stats = load.stop();
    assert!(
        stats.count(200) >= 10 && stats.errors == 0 && stats.timeouts == 0,
        "{what}: {stats}"
    );
}

/// `GET path` with a short timeout: the status, or what kind of failure (no answer).
fn quick_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<u16, std::io::ErrorKind> {
    get_at_within(addr, path, timeout)
        .map(|(c, _, _)| c)
        .map_err(|e| e.kind())
}

/// A namespace reached over its veth pair: the fixture inside answers from the host on its own
/// address only, is the direct child (no `ip` wrapper), freezes on SIGSTOP without touching the
/// same port in another namespace, and everything is gone after drop — after a panic too.
#[test]
fn harness_namespaces_reach_freeze_and_clean_up() {
    require_root();
    let a = NetNs::create("ha");
    let b = NetNs::create("hb");
    println!(
        "{}: {} ↔ {} ({} / {}); {}: {} ↔ {}",
        a.name,
        a.host_ip(),
        a.inside_ip(),
        a.host_veth,
        a.inside_veth,
        b.name,
        b.host_ip(),
        b.inside_ip()
    );
    assert!(a.path().exists() && b.path().exists());
    assert_ne!(a.inode(), b.inode());
    assert_ne!(a.inode(), netns_inode("/proc/self/ns/net"));
    assert_ne!(a.inside_ip(), b.inside_ip());
    let addrs = a
        .exec("ip")
        .args(["-br", "addr"])
        .output()
        .expect("ip addr");
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    assert!(
        addrs.contains(&format!("{}/30", a.inside_ip())) && addrs.contains("lo "),
        "inside {}: {addrs}",
        a.name
    );

    let fa = AddrFixture::in_netns(&a, NS_PORT, "normal");
    let fb = AddrFixture::in_netns(&b, NS_PORT, "normal");
    // `ip netns exec` execs: the child is the fixture itself, in the namespace.
    assert_eq!(
        fa.exe().file_name().and_then(|n| n.to_str()),
        Some("fixture-backend"),
        "pid {} is {}",
        fa.pid(),
        fa.exe().display()
    );
    assert_eq!(fa.netns_inode(), a.inode());
    assert_eq!(fb.netns_inode(), b.inode());
    assert!(a.pids().contains(&(fa.pid() as i32)), "{:?}", a.pids());
    let status = std::fs::read_to_string(format!("/proc/{}/status", fa.pid())).unwrap();
    let ppid = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .map(str::trim);
    assert_eq!(ppid, Some(std::process::id().to_string().as_str()));
    // Listening on the inside address, not on every address.
    let ss = a.exec("ss").arg("-Hltn").output().expect("ss");
    let ss = String::from_utf8_lossy(&ss.stdout).to_string();
    assert!(
        ss.contains(&format!("{}:{NS_PORT}", a.inside_ip()))
            && !ss.contains(&format!("0.0.0.0:{NS_PORT}"))
            && !ss.contains(&format!("*:{NS_PORT}")),
        "listeners in {}:\n{ss}",
        a.name
    );
    println!("listeners in {}:\n{ss}", a.name);

    assert_load_flows(fa.listen, &format!("load into {}", a.name));

    fa.sigstop();
    let frozen = quick_get(fa.listen, "/up", Duration::from_secs(1));
    assert!(frozen.is_err(), "a stopped fixture answered: {frozen:?}");
    assert_eq!(quick_get(fb.listen, "/up", Duration::from_secs(2)), Ok(200));
    fa.sigcont();
    assert_eq!(quick_get(fa.listen, "/up", Duration::from_secs(5)), Ok(200));
    println!("stopped fixture: {}", frozen.unwrap_err());

    let (name_a, veth_a) = (a.name.clone(), a.host_veth.clone());
    drop(fa);
    drop(a);
    assert!(!NetNs::exists(&name_a), "{name_a} is still there");
    assert!(!Path::new(&format!("/sys/class/net/{veth_a}")).exists());

    // A panicking test leaves nothing behind either, not even a stopped process.
    let (tx, rx) = std::sync::mpsc::channel();
    let panicked = std::thread::spawn(move || {
        let ns = NetNs::create("panic");
        let f = AddrFixture::in_netns(&ns, NS_PORT, "normal");
        f.sigstop();
        tx.send((ns.name.clone(), ns.host_veth.clone(), f.pid()))
            .unwrap();
        panic!("on purpose, with a stopped fixture inside {}", ns.name);
    })
    .join();
    assert!(panicked.is_err());
    let (name, veth, pid) = rx.recv().unwrap();
    assert!(!NetNs::exists(&name), "{name} survived a panic");
    assert!(!Path::new(&format!("/sys/class/net/{veth}")).exists());
    assert!(
        !Path::new(&format!("/proc/{pid}/ns")).exists(),
        "the fixture {pid} survived a panic"
    );
}

/// `--listen [::1]:PORT`: answers on ::1, not on 127.0.0.1; freezes on SIGSTOP.
#[test]
fn harness_ipv6_loopback_fixture() {
    require_root();
    let f = AddrFixture::on_ip(IpAddr::V6(Ipv6Addr::LOCALHOST), "normal");
    let port = f.listen.port();
    assert_eq!(f.listen.to_string(), format!("[::1]:{port}"));
    assert_eq!(get_at(f.listen, "/up").map(|(c, _)| c).ok(), Some(200));
    let v4 = quick_get(([127, 0, 0, 1], port).into(), "/up", Duration::from_secs(1));
    assert!(v4.is_err(), "127.0.0.1:{port} answered: {v4:?}");
    let ss = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss");
    let ss = String::from_utf8_lossy(&ss.stdout).to_string();
    assert!(ss.contains(&format!("[::1]:{port}")), "{ss}");
    println!("listener: {ss}");

    assert_load_flows(f.listen, &format!("load to {}", f.listen));
    f.sigstop();
    let frozen = quick_get(f.listen, "/up", Duration::from_secs(1));
    assert!(frozen.is_err(), "a stopped fixture answered: {frozen:?}");
    f.sigcont();
    assert_eq!(quick_get(f.listen, "/up", Duration::from_secs(5)), Ok(200));
}

/// A bridge container published on 127.0.0.1 answers there, `docker pause` really blocks that
/// traffic and `docker unpause` lets it through again; the container is gone after drop.
#[test]
fn harness_bridge_container_published_on_loopback() {
    require_root();
    let c = BridgeContainer::run("harness", &[]);
    assert_ne!(c.host_port, c.container_port);
    assert_ne!(c.netns_inode(), netns_inode("/proc/self/ns/net"));
    println!(
        "{}: 127.0.0.1:{} → container port {}; host listener: {}",
        c.name,
        c.host_port,
        c.container_port,
        c.host_listener()
    );
    assert_eq!(
        quick_get(c.host_addr(), "/up", Duration::from_secs(2)),
        Ok(200)
    );
    c.set_mode("normal");

    assert_load_flows(
        c.host_addr(),
        &format!("load through 127.0.0.1:{}", c.host_port),
    );

    c.pause();
    let started = Instant::now();
    let paused = quick_get(c.host_addr(), "/up", Duration::from_secs(2));
    println!(
        "paused: {paused:?} after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(paused.is_err(), "a paused container answered: {paused:?}");
    c.unpause();
    wait_until(Duration::from_secs(5), "an answer after unpause", || {
        quick_get(c.host_addr(), "/up", Duration::from_secs(2))
            .ok()
            .filter(|&code| code == 200)
    });

    let name = c.name.clone();
    c.pause();
    drop(c);
    let gone = std::process::Command::new("docker")
        .args(["inspect", &name])
        .output()
        .expect("docker inspect");
    assert!(!gone.status.success(), "{name} survived its drop (paused)");
}
