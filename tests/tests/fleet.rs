//! Fleet-aware verdicts: each agent asks its peers (`GET /fleet/v1/view` on their health
//! ports) whether they have the same fault. A fault most answering peers do not have is this
//! instance's own (503 after self-heal); one most of them have is shared (200,
//! `infrastructure_issue`, no restart); with no peer answering the single-instance rule holds.
//!
//! The agents listen on their own loopback addresses (127.0.0.2, 127.0.0.3, …) like a fleet's
//! hosts, so two of them can share a port (`peers_dns`, the Consul catalog). Every verdict test
//! records every `/health` answer of every agent ([`HealthPoller`]) and asserts over all of them
//! from the agent's first 200 on. All traffic stays on 127.0.0.0/8.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use health_agent_tests::{
    assert_answered,
    fleet::{free_port_on_all, gauge, loopback, request_at, HostsLines, StubServer, Timed},
    free_port_on, merge_toml, pretty, require_root, since, tail, timeline, web_config, Agent,
    Fixture, HealthPoller, HealthSample, Load, Postgres, Puma, PumaOptions, TcpProxy,
};
use serde_json::{json, Value};

/// Agent start to a first verdict (and to its peers answering).
const WAIT: Duration = Duration::from_secs(30);

/// `[fleet]` with static peers, asked every second, 1 s per peer.
fn fleet_peers(peers: &[String]) -> String {
    format!("[fleet]\npeers = {peers:?}\ninterval = \"1s\"\ntimeout = \"1s\"\n")
}

/// Two agents at `at`, watching `web`'s ports, each told the other's address.
fn peers_of_each_other(at: [SocketAddr; 2], web: [&Fixture; 2]) -> [Agent; 2] {
    [0, 1].map(|i| {
        let peers = fleet_peers(&[at[1 - i].to_string()]);
        Agent::start_at(at[i], &web_config(web[i].port, &peers), &[])
    })
}

/// `GET path` at `addr`: (code, head, body).
fn get_at(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String, String)> {
    request_at(addr, "GET", path, &[], timeout)
}

/// Every address of `all` but `me`, as `fleet.peers` takes them.
fn others(all: &[SocketAddr], me: &SocketAddr) -> Vec<String> {
    all.iter()
        .filter(|a| *a != me)
        .map(ToString::to_string)
        .collect()
}

fn addr(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// `details.fleet` of a full /health body.
fn fleet(s: &HealthSample) -> &Value {
    &s.body["details"]["fleet"]
}

fn strings(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn asked(s: &HealthSample) -> Vec<String> {
    strings(&fleet(s)["peers_asked"])
}

fn answered(s: &HealthSample) -> Vec<String> {
    answered_in(&s.body)
}

/// `details.fleet.peers_answered` of a full /health body, sorted.
fn answered_in(body: &Value) -> Vec<String> {
    strings(&body["details"]["fleet"]["peers_answered"])
}

/// Whether every one of `want` is in `have`.
fn lists_all(have: &[String], want: &[String]) -> bool {
    want.iter().all(|w| have.contains(w))
}

fn judgements(s: &HealthSample) -> Vec<Value> {
    fleet(s)["judgements"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The first judgement with this scope.
fn judged(s: &HealthSample, scope: &str) -> Option<Value> {
    judgements(s).into_iter().find(|j| j["scope"] == scope)
}

fn reasons(s: &HealthSample) -> Vec<String> {
    s.body["reasons"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses of every agent but the `i`-th, sorted: what its `peers_answered` lists.
fn others_than<'a>(i: usize, agents: impl Iterator<Item = &'a Agent>) -> Vec<String> {
    sorted(
        agents
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, a)| a.addr.to_string()),
    )
}

fn sorted(v: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = v.into_iter().collect();
    v.sort();
    v
}

/// When the first 200 came (the instance is ready), on the poller's clock.
fn first_200(samples: &[HealthSample]) -> Option<Duration> {
    samples.iter().find(|s| s.code == 200).map(|s| s.at)
}

/// One instance of the three: its own path to the shared database, a Puma whose `/up` and
/// `/db` use it, an agent on its own loopback address, a recorder of its `/health`, light load.
/// Field order is drop order.
struct Instance {
    poller: HealthPoller,
    load: Load,
    agent: Agent,
    puma: Puma,
    proxy: TcpProxy,
}

/// Three instances of one app sharing one PostgreSQL, each agent peering with the other two.
struct Trio {
    /// Dropped before the database.
    instances: Vec<Instance>,
    pg: Postgres,
}

impl Trio {
    fn start() -> Self {
        let pg = Postgres::start();
        // The paths and backends first, then the agents on ports no listener holds on any
        // address (see `Fleet::start`).
        let backends: Vec<(TcpProxy, Puma)> = (0..3)
            .map(|_| {
                let proxy = TcpProxy::start(pg.port);
                let puma = Puma::start(PumaOptions::on_database(format!(
                    "postgres://postgres:{}@127.0.0.1:{}/postgres",
                    pg.password, proxy.port
                )));
                (proxy, puma)
            })
            .collect();
        let addrs: Vec<SocketAddr> = (0..3u8)
            .map(|i| addr(loopback(2 + i), free_port_on(Ipv4Addr::UNSPECIFIED.into())))
            .collect();
        let mut instances = Vec::new();
        for ((i, me), (proxy, puma)) in addrs.iter().enumerate().zip(backends) {
            let peers = others(&addrs, me);
            // A 20 s latency window (60 s by default): the requests that waited out a freeze
            // keep the p99 `slow` for about half the window after the thaw, which would eat
            // most of the 45 s the tests give the instances to be `healthy` again.
            let extra = format!(
                "[web]\nlatency_window = \"20s\"\n\
                 [database]\nurl = \"postgres://postgres@127.0.0.1:{}/postgres\"\n\
                 interval = \"30s\"\ntimeout = \"3s\"\n{}",
                proxy.port,
                fleet_peers(&peers)
            );
            let agent = Agent::start_at(
                *me,
                &web_config(puma.port, &extra),
                &[("PGPASSWORD", pg.password.as_str())],
            );
            let poller = HealthPoller::start_at(*me);
            // ~4 requests a second, each on a new connection, each a fresh SELECT 1.
            let load = Load::new_connections(
                puma.port,
                "/db",
                2,
                Duration::from_millis(500),
                Duration::from_secs(10),
            );
            println!(
                "instance {i}: agent {me}, puma 127.0.0.1:{}, proxy 127.0.0.1:{} → postgres 127.0.0.1:{}",
                puma.port, proxy.port, pg.port
            );
            instances.push(Instance {
                poller,
                load,
                agent,
                puma,
                proxy,
            });
        }
        Self { instances, pg }
    }

    fn peers_of(&self, i: usize) -> Vec<String> {
        others_than(i, self.instances.iter().map(|x| &x.agent))
    }

    /// Every agent's log tail and the Postgres port: what a failed wait prints.
    fn explain(&self) -> String {
        let mut out = format!("\npostgres on 127.0.0.1:{}", self.pg.port);
        for (i, x) in self.instances.iter().enumerate() {
            out.push_str(&format!(
                "\n--- instance {i}: agent {} (log tail):\n{}\n--- puma log (tail):\n{}",
                x.agent.addr,
                tail(&x.agent.logs(), 30),
                tail(&x.puma.logs(), 10)
            ));
        }
        out
    }

    /// What a failed assertion about instance `i` prints: its answers, its load, the logs.
    fn context(&self, i: usize, samples: &[HealthSample]) -> String {
        let x = &self.instances[i];
        format!(
            "\ninstance {i} (agent {}) /health answers:\n{}load on /db: {}\nlast body: {}{}",
            x.agent.addr,
            timeline(samples),
            x.load.stats(),
            samples.last().map(|s| pretty(&s.body)).unwrap_or_default(),
            self.explain()
        )
    }

    /// Waits until every agent is 200 `healthy` with the database connected and both peers
    /// answering, and every app has served `/db`; returns each agent's readiness (first 200).
    fn wait_ready(&self) -> Vec<Duration> {
        let deadline = Instant::now() + WAIT;
        for (i, x) in self.instances.iter().enumerate() {
            let peers = self.peers_of(i);
            x.poller.wait_for_from(
                Duration::ZERO,
                deadline.saturating_duration_since(Instant::now()),
                &format!("instance {i}: 200 healthy, database connected, both peers answering"),
                |s| {
                    s.code == 200
                        && s.status == "healthy"
                        && s.database == "connected"
                        && answered(s) == peers
                },
                || self.explain(),
            );
        }
        for (i, x) in self.instances.iter().enumerate() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let t = Instant::now();
            while x.load.stats().count(200) < 5 {
                assert!(
                    t.elapsed() < remaining.max(Duration::from_secs(5)),
                    "instance {i}: the app's /db through its proxy never answered 200 five times ({}){}",
                    x.load.stats(),
                    self.explain()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.instances
            .iter()
            .map(|x| first_200(&x.poller.samples()).expect("a 200 was seen above"))
            .collect()
    }

    /// Waits until every agent is 200 `healthy` again (one deadline for all).
    fn wait_all_healthy(&self, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        for (i, x) in self.instances.iter().enumerate() {
            let from = x.poller.elapsed();
            let back = x.poller.wait_for_from(
                from,
                deadline.saturating_duration_since(Instant::now()),
                &format!("instance {i}: 200 healthy {what}"),
                |s| s.code == 200 && s.status == "healthy",
                || self.explain(),
            );
            println!("instance {i} healthy again: {back}");
        }
    }
}

/// One instance's path to the shared database freezes; the others' paths work. Its peers do
/// not have its dependency fault, so it is this instance's own: 503 (nothing to heal with —
/// no restart command), the reasons citing the peers. The other two never leave 200.
#[test]
fn one_cut_path_is_local_503_the_others_stay_200() {
    require_root();
    let trio = Trio::start();
    let ready = trio.wait_ready();
    let cut = &trio.instances[0];
    let peers0 = trio.peers_of(0);
    let served_before: Vec<u64> = trio
        .instances
        .iter()
        .map(|x| x.load.stats().count(200))
        .collect();

    cut.proxy.freeze();
    let frozen = cut.poller.elapsed();
    let down = cut.poller.wait_for_from(
        frozen,
        Duration::from_secs(30),
        "503 on the instance whose database path is frozen",
        |s| s.code == 503,
        || trio.explain(),
    );
    println!("freeze → 503 in {:.1}s ({down})", down.after(frozen));
    // A peer may miss one round (1 s timeout); within a few rounds both answer.
    let evidence = cut.poller.wait_for_from(
        down.at,
        Duration::from_secs(10),
        "a 503 whose details.fleet lists both peers answering and a `local` judgement",
        |s| s.code == 503 && lists_all(&answered(s), &peers0) && judged(s, "local").is_some(),
        || trio.explain(),
    );
    println!(
        "503 with the peers' evidence: reasons {:?}\ndetails.fleet: {}",
        reasons(&evidence),
        pretty(fleet(&evidence))
    );
    // Still frozen: the gauges say what details.fleet says.
    std::thread::sleep(Duration::from_secs(3));
    let metrics = cut.agent.metrics();
    let fleet_lines: String = metrics
        .lines()
        .filter(|l| l.contains("fleet"))
        .map(|l| format!("{l}\n"))
        .collect();
    let cut_samples = cut.poller.samples();
    let ctx0 = trio.context(0, &since(&cut_samples, ready[0]));

    assert_eq!(
        fleet(&evidence)["configured"],
        true,
        "details.fleet.configured{ctx0}"
    );
    assert!(
        lists_all(&asked(&evidence), &peers0),
        "details.fleet.peers_asked {:?} does not list both peers {peers0:?}{ctx0}",
        asked(&evidence)
    );
    let local = judged(&evidence, "local").expect("waited for above");
    assert!(
        ["dependency", "web"].contains(&local["class"].as_str().unwrap_or("")),
        "a frozen database path is a dependency (or web) fault, judged: {local}{ctx0}"
    );
    assert_eq!(
        (
            local["peers_with"].as_u64(),
            local["peers_answered"].as_u64()
        ),
        (Some(0), Some(2)),
        "the local judgement counts 0 of 2 answering peers with the fault: {local}{ctx0}"
    );
    assert!(
        reasons(&evidence).iter().any(|r| r.contains("peer")),
        "the 503's reasons do not mention the peers' evidence: {:?}{ctx0}",
        reasons(&evidence)
    );
    // Every 503 rests on the peers' evidence: none without a local judgement.
    if let Some(s) = cut_samples
        .iter()
        .find(|s| s.code == 503 && s.at >= frozen && judged(s, "local").is_none())
    {
        panic!(
            "a 503 without a `local` judgement: {s}\ndetails.fleet: {}{ctx0}",
            pretty(fleet(s))
        );
    }
    assert_eq!(
        (
            gauge(&metrics, "health_agent_fleet_peers_asked"),
            gauge(&metrics, "health_agent_fleet_peers_answered")
        ),
        (Some(2.0), Some(2.0)),
        "/metrics fleet gauges (asked, answered); its fleet lines:\n{fleet_lines}{ctx0}"
    );
    for (i, x) in trio.instances.iter().enumerate().skip(1) {
        let served = x.load.stats().count(200);
        assert!(
            served > served_before[i],
            "instance {i}'s app stopped serving /db while only instance 0's path was frozen ({}){}",
            x.load.stats(),
            trio.context(i, &x.poller.samples())
        );
    }

    cut.proxy.thaw();
    trio.wait_all_healthy(Duration::from_secs(45), "within 45 s of the thaw");

    let mut all = Vec::new();
    for (i, x) in trio.instances.iter().enumerate() {
        let samples = since(&x.poller.samples(), ready[i]);
        println!("instance {i}:\n{}", timeline(&samples));
        all.push(samples);
    }
    for (i, samples) in all.iter().enumerate() {
        let ctx = trio.context(i, samples);
        assert_answered(samples, &ctx);
        if i == 0 {
            if let Some(s) = samples.iter().find(|s| s.at < frozen && s.code != 200) {
                panic!("instance 0 was not 200 before the freeze: {s}{ctx}");
            }
        } else if let Some(s) = samples.iter().find(|s| s.code != 200) {
            panic!(
                "instance {i} (its path intact) left 200: {s}\ndetails.fleet: {}{ctx}",
                pretty(fleet(s))
            );
        }
    }
}

/// Every instance's path to the database freezes at once: each has the dependency fault, and
/// so do its peers. Shared: 200 `infrastructure_issue` everywhere, never a 503 — taking the
/// whole fleet out would not bring the database back.
#[test]
fn every_path_cut_is_shared_never_503() {
    require_root();
    let trio = Trio::start();
    let ready = trio.wait_ready();

    for x in &trio.instances {
        x.proxy.freeze();
    }
    let frozen: Vec<Duration> = trio.instances.iter().map(|x| x.poller.elapsed()).collect();
    std::thread::sleep(Duration::from_secs(3));
    let served_early: Vec<u64> = trio
        .instances
        .iter()
        .map(|x| x.load.stats().count(200))
        .collect();
    std::thread::sleep(Duration::from_secs(27));
    let during: Vec<Vec<HealthSample>> = trio
        .instances
        .iter()
        .enumerate()
        .map(|(i, x)| since(&x.poller.samples(), ready[i]))
        .collect();
    for (i, x) in trio.instances.iter().enumerate() {
        println!(
            "instance {i} while every path is frozen:\n{}",
            timeline(&during[i])
        );
        let ctx = trio.context(i, &during[i]);
        assert_eq!(
            x.load.stats().count(200),
            served_early[i],
            "instance {i}'s /db answered 200 through a frozen proxy (harness problem){ctx}"
        );
        if let Some(s) = during[i].iter().find(|s| s.code == 503) {
            panic!(
                "instance {i}: 503 while every instance's database path is frozen: {s}\nreasons: {:?}\ndetails.fleet: {}{ctx}",
                reasons(s),
                pretty(fleet(s))
            );
        }
        let infra = during[i]
            .iter()
            .find(|s| s.at >= frozen[i] && s.recommendation == "infrastructure_issue")
            .unwrap_or_else(|| {
                panic!("instance {i}: never infrastructure_issue while frozen{ctx}")
            });
        println!(
            "instance {i}: freeze → infrastructure_issue in {:.1}s ({infra})",
            infra.after(frozen[i])
        );
        assert!(
            infra.after(frozen[i]) <= 20.0,
            "instance {i}: infrastructure_issue only {:.1}s after the freeze (≤ 20 s expected){ctx}",
            infra.after(frozen[i])
        );
    }
    let shared = during
        .iter()
        .enumerate()
        .find_map(|(i, samples)| {
            samples
                .iter()
                .find_map(|s| judged(s, "shared").map(|j| (i, s.clone(), j)))
        })
        .unwrap_or_else(|| {
            panic!(
                "no agent ever judged its fault `shared` while every path was frozen{}",
                trio.context(0, &during[0])
            )
        });
    println!(
        "instance {} judged shared: {}\ndetails.fleet: {}",
        shared.0,
        shared.1,
        pretty(fleet(&shared.1))
    );
    assert!(
        shared.2["peers_with"].as_u64().is_some_and(|n| n >= 1),
        "a `shared` judgement counts no peer with the fault: {}{}",
        shared.2,
        trio.context(shared.0, &during[shared.0])
    );

    for x in &trio.instances {
        x.proxy.thaw();
    }
    trio.wait_all_healthy(Duration::from_secs(45), "within 45 s of the thaw");
    for (i, x) in trio.instances.iter().enumerate() {
        let samples = since(&x.poller.samples(), ready[i]);
        println!("instance {i}, the whole run:\n{}", timeline(&samples));
        let ctx = trio.context(i, &samples);
        assert_answered(&samples, &ctx);
        if let Some(s) = samples.iter().find(|s| s.code != 200) {
            panic!(
                "instance {i}: {} at some point after it was ready: {s}{ctx}",
                s.code
            );
        }
    }
}

/// Peers that cannot help: a closed port, one that answers only after 10 s, one that answers
/// 200 with garbage. None of them counts as answering, the single-instance rule holds, and
/// `/health` neither waits for them nor changes: 200 `healthy`, every answer fast.
#[test]
fn bad_peers_are_ignored_and_health_is_unaffected() {
    require_root();
    let puma = Puma::start(PumaOptions::threads(2));
    let closed = addr(loopback(5), free_port_on(loopback(5)));
    let slow = StubServer::start(loopback(6), Duration::from_secs(10), |_| {
        (
            200,
            json!({"version": 1, "instance": "slow-peer", "web": "up", "database": "connected",
                   "containers": "ok", "dependencies": [], "unreachable": []})
            .to_string(),
        )
    });
    let n = AtomicUsize::new(0);
    let garbage = StubServer::start(loopback(7), Duration::ZERO, move |_| {
        // Not JSON at all, or cut off in the middle, by turns.
        if n.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            (200, "<html><body>It works!</body></html>".into())
        } else {
            (200, "{\"version\":1,\"instance\":\"x\",\"web\":".into())
        }
    });
    let peers = vec![
        closed.to_string(),
        slow.addr.to_string(),
        garbage.addr.to_string(),
    ];
    let me = addr(loopback(2), free_port_on(loopback(2)));
    let agent = Agent::start_at(me, &web_config(puma.port, &fleet_peers(&peers)), &[]);
    let poller = HealthPoller::start_at(me);
    let explain = || {
        format!(
            "\nslow peer got {} requests, garbage peer {}\nagent log (tail):\n{}",
            slow.requests().len(),
            garbage.requests().len(),
            tail(&agent.logs(), 40)
        )
    };
    poller.wait_for_from(
        Duration::ZERO,
        WAIT,
        "200 healthy",
        |s| s.code == 200 && s.status == "healthy",
        explain,
    );
    let t = Instant::now();
    while slow.requests().is_empty() || garbage.requests().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the agent did not ask the slow and the garbage peer within 10 s{}",
            explain()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Past the first round's 1 s timeout.
    std::thread::sleep(Duration::from_secs(2));
    let from = poller.elapsed();
    std::thread::sleep(Duration::from_secs(10));
    let timed: Vec<Timed> = poller
        .stop_timed()
        .into_iter()
        .filter(|t| t.sample.at >= from)
        .collect();
    let samples: Vec<HealthSample> = timed.iter().map(|t| t.sample.clone()).collect();
    let slowest = timed.iter().map(|t| t.took).max().unwrap_or_default();
    println!(
        "bad peers: {} answers over 10 s, slowest {} ms; slow peer asked {}×, garbage peer {}×\n{}",
        samples.len(),
        slowest.as_millis(),
        slow.requests().len(),
        garbage.requests().len(),
        timeline(&samples)
    );
    let ctx = format!(
        "\nanswers:\n{}last body: {}{}",
        timeline(&samples),
        samples.last().map(|s| pretty(&s.body)).unwrap_or_default(),
        explain()
    );
    assert!(samples.len() >= 40, "too few /health answers in 10 s{ctx}");
    assert_answered(&samples, &ctx);
    for t in &timed {
        let s = &t.sample;
        assert!(
            s.code == 200 && s.status == "healthy",
            "not 200 healthy next to bad peers: {s}{ctx}"
        );
        assert!(
            t.took < Duration::from_millis(100),
            "/health took {} ms (a peer's slowness leaked into the request path): {s}{ctx}",
            t.took.as_millis()
        );
        let f = fleet(s);
        assert_eq!(f["configured"], true, "details.fleet.configured: {f}{ctx}");
        assert!(
            answered(s).is_empty(),
            "a peer that refuses, stalls or talks garbage counted as answering: {f}{ctx}"
        );
        assert!(
            lists_all(&asked(s), &peers),
            "details.fleet.peers_asked does not list all three peers {peers:?}: {f}{ctx}"
        );
        let note = f["note"].as_str().unwrap_or("").to_lowercase();
        assert!(
            note.contains("single-instance") || note.contains("single instance"),
            "details.fleet.note does not say the single-instance rule applies: {f}{ctx}"
        );
        assert!(
            judgements(s).is_empty(),
            "judgements for a healthy instance: {f}{ctx}"
        );
    }
}

/// The fleet key: the peer endpoint answers only an ask proven with it, and signs its answer for
/// that ask; two agents holding the same key (here from a variable named by `token_env`, the
/// key's former name, which old configs keep) see each other; the key shows up nowhere: not in
/// /health, /metrics, the view, or the log.
#[test]
fn the_peer_view_needs_the_fleet_key() {
    require_root();
    let token = format!(
        "s3cret-{:08}-fleet-key-0123456789abcdef",
        std::process::id()
    );
    let env = [("HA_FLEET_TOKEN", token.as_str())];
    let (fa, fb) = (Fixture::start("normal"), Fixture::start("normal"));
    let (a_addr, b_addr) = (
        addr(loopback(2), free_port_on(loopback(2))),
        addr(loopback(3), free_port_on(loopback(3))),
    );
    let with_token = |peer: SocketAddr| {
        format!(
            "{}token_env = \"HA_FLEET_TOKEN\"\n",
            fleet_peers(&[peer.to_string()])
        )
    };
    let a = Agent::start_at(a_addr, &web_config(fa.port, &with_token(b_addr)), &env);
    let b = Agent::start_at(b_addr, &web_config(fb.port, &with_token(a_addr)), &env);
    let explain = || {
        format!(
            "\nagent A log (tail):\n{}\nagent B log (tail):\n{}",
            tail(&a.logs(), 30),
            tail(&b.logs(), 30)
        )
    };

    let no_auth = a.view(None).expect("GET /fleet/v1/view");
    let wrong = a
        .view(Some(&format!("Bearer {token}")))
        .expect("GET /fleet/v1/view");
    let other_key =
        health_agent_tests::trust::ask_view(a_addr, health_agent_tests::trust::FLEET_KEY)
            .expect("GET /fleet/v1/view");
    let right = health_agent_tests::trust::ask_view(a_addr, &token)
        .unwrap_or_else(|e| panic!("the proven view: {e}{}", explain()));
    assert_eq!(no_auth.0, 401, "no Authorization: {no_auth:?}{}", explain());
    assert_eq!(
        wrong.0,
        401,
        "the key as a bearer token: {wrong:?}{}",
        explain()
    );
    assert_eq!(
        other_key.0,
        401,
        "another fleet's key: {other_key:?}{}",
        explain()
    );
    assert_eq!(right.0, 200, "the right key: {right:?}{}", explain());
    let view: Value = serde_json::from_str(&right.1)
        .unwrap_or_else(|e| panic!("the view is not JSON ({e}): {}", right.1));
    assert_eq!(view["version"], 1, "view: {view}");
    assert!(
        view["instance"].as_str().is_some_and(|s| !s.is_empty()),
        "view.instance: {view}"
    );

    // Each proves its ask with the key, or the other would answer 401.
    let poll = HealthPoller::start_at(a_addr);
    let seen = poll.wait_for_from(
        Duration::ZERO,
        WAIT,
        "agent A's details.fleet.peers_answered to list agent B (the ask proven)",
        |s| answered(s) == [b_addr.to_string()],
        explain,
    );
    println!("A sees B: {}", pretty(fleet(&seen)));
    let samples = poll.stop();
    let (_, b_health) = b.health();
    let b_saw_a = answered_in(&b_health);

    let mut texts = vec![
        ("A's view", right.1.clone()),
        ("the 401 to no Authorization", no_auth.1),
        ("the 401 to a bearer token", wrong.1),
        ("B's /health", b_health.to_string()),
        ("A's /metrics", a.metrics()),
        ("B's /metrics", b.metrics()),
        ("A's log", a.logs()),
        ("B's log", b.logs()),
    ];
    texts.extend(samples.iter().map(|s| {
        (
            "A's /health",
            serde_json::to_string(&s.body).unwrap_or_default(),
        )
    }));
    for (what, text) in &texts {
        assert!(
            !text.contains(&token),
            "the fleet key appears in {what}:\n{text}"
        );
    }
    assert_eq!(
        b_saw_a,
        [a_addr.to_string()],
        "agent B's details.fleet.peers_answered does not list agent A: {}{}",
        pretty(&b_health["details"]["fleet"]),
        explain()
    );
}

/// `fleet.peers_dns`: a name with two A records (two /etc/hosts lines) is two peers, asked at
/// the port given — or, without one, at the agent's own listen port.
#[test]
fn peers_dns_works_like_peers() {
    require_root();
    let name = format!("ha-fleet-{}.test", std::process::id());
    let (ip3, ip4, ip5) = (loopback(3), loopback(4), loopback(5));
    let port = free_port_on_all(&[ip3, ip4, ip5]);
    let _hosts = HostsLines::add(&[(ip3, name.as_str()), (ip4, name.as_str())]);
    let resolved = resolve(&name);
    assert_eq!(
        resolved,
        [ip3, ip4],
        "harness: {name} does not resolve to both /etc/hosts lines"
    );
    let (p3, p4) = (addr(ip3, port), addr(ip4, port));
    let want = sorted([p3.to_string(), p4.to_string()]);

    let fixtures: Vec<Fixture> = (0..4).map(|_| Fixture::start("normal")).collect();
    // The two peers know each other by address.
    let _peers = peers_of_each_other([p3, p4], [&fixtures[0], &fixtures[1]]);
    let dns = |peers_dns: &str| {
        format!("[fleet]\npeers_dns = {peers_dns:?}\ninterval = \"1s\"\ntimeout = \"1s\"\n")
    };
    // A: the port in the name; C: on the peers' port, the port left out.
    let a_addr = addr(loopback(2), free_port_on(loopback(2)));
    let a = Agent::start_at(
        a_addr,
        &web_config(fixtures[2].port, &dns(&format!("{name}:{port}"))),
        &[],
    );
    let c_addr = addr(ip5, port);
    let c = Agent::start_at(c_addr, &web_config(fixtures[3].port, &dns(&name)), &[]);

    for (label, agent) in [
        ("A (peers_dns = name:port)", &a),
        ("C (peers_dns = name, its own port)", &c),
    ] {
        let poller = HealthPoller::start_at(agent.addr);
        let seen = poller.wait_for_from(
            Duration::ZERO,
            WAIT,
            &format!("{label}: peers_asked and peers_answered to list {want:?}"),
            |s| lists_all(&asked(s), &want) && lists_all(&answered(s), &want),
            || format!("\nagent log (tail):\n{}", tail(&agent.logs(), 40)),
        );
        println!("{label}: {}", pretty(fleet(&seen)));
        assert_eq!(fleet(&seen)["configured"], true, "{label}: {seen}");
        assert_eq!(
            seen.code,
            200,
            "{label}: healthy peers, yet {seen}: {}",
            pretty(&seen.body)
        );
    }
}

/// The body Consul's catalog answers `GET /v1/catalog/service/web` with ("list nodes for
/// service", developer.hashicorp.com/consul/api-docs/catalog): one object per instance. The
/// peer is `ServiceAddress:ServicePort`, or `Address:ServicePort` when `ServiceAddress` is
/// empty. n2's node address 127.9.9.9 (on loopback, where nothing listens) must never be used:
/// its ServiceAddress wins.
fn catalog_body(port: u16) -> String {
    // (ID, Node, Address, ServiceAddress, n): one instance of service `web` each.
    let entry = |id: &str, node: &str, address: &str, service_address: &str, n: u64| {
        json!({
            "ID": id,
            "Node": node,
            "Address": address,
            "Datacenter": "dc1",
            "TaggedAddresses": {"lan": address, "wan": address},
            "NodeMeta": {},
            "CreateIndex": 9 + n,
            "ModifyIndex": 11 + n,
            "ServiceAddress": service_address,
            "ServiceEnableTagOverride": false,
            "ServiceID": format!("web-{n}"),
            "ServiceName": "web",
            "ServicePort": port,
            "ServiceMeta": {},
            "ServiceTags": ["fleet"],
            "Namespace": "default"
        })
    };
    let (n1, n2) = (
        "40e4a748-2192-161a-0510-9bf59fe950b5",
        "b3a1c2d4-0000-4d3e-9f00-2c1d4e5f6a7b",
    );
    json!([
        entry(n1, "n1", "127.0.0.3", "", 1),
        entry(n2, "n2", "127.9.9.9", "127.0.0.4", 2),
    ])
    .to_string()
}

/// The stand-in for Consul's HTTP API on 127.0.0.1: the documented response shape of the
/// catalog endpoint, not a real Consul agent (Consul cannot be installed here).
fn fake_consul(port: u16) -> StubServer {
    let body = catalog_body(port);
    StubServer::start(loopback(1), Duration::ZERO, move |r| {
        if r.method == "GET" && r.route() == "/v1/catalog/service/web" {
            (200, body.clone())
        } else {
            (404, "[]".into())
        }
    })
}

/// `fleet.consul_addr` + `consul_service`: the catalog's instances are the peers.
#[test]
fn consul_catalog_peers() {
    require_root();
    let (ip3, ip4) = (loopback(3), loopback(4));
    let port = free_port_on_all(&[ip3, ip4]);
    let (p3, p4) = (addr(ip3, port), addr(ip4, port));
    let want = sorted([p3.to_string(), p4.to_string()]);
    let consul = fake_consul(port);

    let fixtures: Vec<Fixture> = (0..3).map(|_| Fixture::start("normal")).collect();
    let _peers = peers_of_each_other([p3, p4], [&fixtures[0], &fixtures[1]]);
    let a_addr = addr(loopback(2), free_port_on(loopback(2)));
    let a = Agent::start_at(
        a_addr,
        &web_config(
            fixtures[2].port,
            &format!(
                "[fleet]\nconsul_addr = {:?}\nconsul_service = \"web\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
                consul.url()
            ),
        ),
        &[],
    );
    let poller = HealthPoller::start_at(a_addr);
    let explain = || {
        format!(
            "\ncatalog requests: {:?}\nagent log (tail):\n{}",
            consul
                .requests()
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect::<Vec<_>>(),
            tail(&a.logs(), 40)
        )
    };
    let seen = poller.wait_for_from(
        Duration::ZERO,
        WAIT,
        &format!("peers_asked and peers_answered to list the catalog's {want:?}"),
        |s| lists_all(&asked(s), &want) && lists_all(&answered(s), &want),
        explain,
    );
    println!("from the catalog: {}", pretty(fleet(&seen)));
    // A few more rounds.
    std::thread::sleep(Duration::from_secs(3));
    let samples = poller.stop();
    let ctx = format!("\nanswers:\n{}{}", timeline(&samples), explain());
    assert_eq!(fleet(&seen)["configured"], true, "{seen}{ctx}");
    if let Some(s) = samples
        .iter()
        .find(|s| asked(s).iter().any(|p| p.starts_with("127.9.9.9")))
    {
        panic!(
            "the node address was asked although ServiceAddress is set: {}{ctx}",
            pretty(fleet(s))
        );
    }
    let catalog_gets = consul
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.route() == "/v1/catalog/service/web")
        .count();
    assert!(
        catalog_gets >= 1,
        "the agent never asked GET /v1/catalog/service/web{ctx}"
    );
}

/// The addresses of `name` through the system resolver (what `fleet.peers_dns` uses), sorted.
fn resolve(name: &str) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = (name, 80)
        .to_socket_addrs()
        .map(|it| it.map(|a| a.ip()).collect())
        .unwrap_or_default();
    ips.sort();
    ips.dedup();
    ips
}

/// The harness without the agent: one port bindable on 127.0.0.2–4 at once, /etc/hosts lines
/// that resolve and go away (the file byte for byte as before, after a panic too), the fake
/// Consul catalog's shape, and stub peers that stall or talk garbage. When a fleet test fails,
/// this one passing says the agent, not the setup, is at fault.
#[test]
fn harness_loopback_addresses_hosts_lines_and_stub_servers() {
    require_root();
    let ips = [loopback(2), loopback(3), loopback(4)];
    let port = free_port_on_all(&ips);
    let listeners: Vec<TcpListener> = ips
        .iter()
        .map(|ip| {
            TcpListener::bind((*ip, port)).unwrap_or_else(|e| panic!("binding {ip}:{port}: {e}"))
        })
        .collect();
    for l in &listeners {
        let a = l.local_addr().expect("local addr");
        TcpStream::connect_timeout(&a, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connecting to {a}: {e}"));
        l.accept()
            .unwrap_or_else(|e| panic!("accepting on {a}: {e}"));
    }
    drop(listeners);

    let before = std::fs::read("/etc/hosts").expect("reading /etc/hosts");
    let name = format!("ha-fleet-harness-{}.test", std::process::id());
    {
        let hosts = HostsLines::add(&[(loopback(3), name.as_str()), (loopback(4), name.as_str())]);
        assert_eq!(hosts.original(), before.as_slice());
        assert_eq!(
            resolve(&name),
            [loopback(3), loopback(4)],
            "{name} through the system resolver; /etc/hosts:\n{}",
            std::fs::read_to_string("/etc/hosts").unwrap_or_default()
        );
    }
    assert_eq!(
        std::fs::read("/etc/hosts").expect("reading /etc/hosts"),
        before,
        "/etc/hosts not restored byte for byte"
    );
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _hosts = HostsLines::add(&[(loopback(3), name.as_str())]);
        panic!("a test failing while its /etc/hosts lines are in (on purpose)");
    }));
    assert!(panicked.is_err());
    assert_eq!(
        std::fs::read("/etc/hosts").expect("reading /etc/hosts"),
        before,
        "/etc/hosts not restored after a panic"
    );

    let consul = fake_consul(port);
    let (code, head, body) = get_at(
        consul.addr,
        "/v1/catalog/service/web",
        Duration::from_secs(5),
    )
    .expect("GET the catalog");
    assert_eq!(code, 200, "{head}\n{body}");
    let entries: Vec<Value> = serde_json::from_str(&body).expect("the catalog answers JSON");
    let peers: Vec<String> = entries
        .iter()
        .map(|e| {
            let service = e["ServiceAddress"].as_str().unwrap_or("");
            let host = if service.is_empty() {
                e["Address"].as_str().unwrap_or("")
            } else {
                service
            };
            format!("{host}:{}", e["ServicePort"])
        })
        .collect();
    assert_eq!(
        peers,
        [format!("127.0.0.3:{port}"), format!("127.0.0.4:{port}")]
    );
    let (code, _, _) = get_at(
        consul.addr,
        "/v1/catalog/service/other",
        Duration::from_secs(5),
    )
    .expect("GET another service");
    assert_eq!(code, 404);
    assert_eq!(consul.requests().len(), 2);

    let slow = StubServer::start(loopback(6), Duration::from_secs(2), |_| (200, "{}".into()));
    let cut_short = get_at(slow.addr, "/fleet/v1/view", Duration::from_millis(500));
    assert!(
        cut_short.as_ref().is_err_and(|e| matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
        "the slow stub answered within 500 ms: {cut_short:?}"
    );
    let t = Instant::now();
    let waited = get_at(slow.addr, "/fleet/v1/view", Duration::from_secs(5));
    assert!(
        waited.as_ref().is_ok_and(|(c, _, _)| *c == 200) && t.elapsed() >= Duration::from_secs(2),
        "the slow stub: {waited:?} after {:?}",
        t.elapsed()
    );
    assert_eq!(
        slow.requests()[0].header("Host"),
        Some(slow.addr.to_string().as_str())
    );
}

/// One instance of a fleet with no database: a Puma, an agent on its own loopback address
/// peering with the others, a poller of its `/health` every 100 ms, light load or none.
/// Field order is drop order.
struct Member {
    poller: HealthPoller,
    /// Held for its traffic, stopped on drop.
    _load: Option<Load>,
    agent: Agent,
    puma: Puma,
    /// While this file exists, the Puma's pages (all but `/up`) raise: it answers 500.
    error_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Member {
    /// Its real pages start answering 500 (its `/up` still 200).
    fn break_pages(&self) {
        std::fs::write(&self.error_file, "").expect("writing the error file");
    }

    fn mend_pages(&self) {
        std::fs::remove_file(&self.error_file).expect("removing the error file");
    }
}

/// How a [`Fleet`]'s instances are set up beyond the defaults.
#[derive(Default)]
struct Setup {
    /// Light traffic on each backend: about 4 requests a second on new connections.
    traffic: bool,
    /// Heavier traffic on each backend's real pages: about 20 requests a second, enough for
    /// a 5xx share to be judged within a second or two.
    pages: bool,
    /// Each agent restarts its Puma for real (`Puma::restart_script`).
    restart: bool,
    /// Each agent's restart command is `true`: it returns at once and changes nothing.
    futile_restart: bool,
    /// `web.socket_tracing`, when not the default.
    socket_tracing: Option<&'static str>,
}

/// `n` instances of one app, each agent peering with the others.
struct Fleet {
    members: Vec<Member>,
}

impl Fleet {
    fn start(n: u8, traffic: bool) -> Self {
        Self::start_with(
            n,
            Setup {
                traffic,
                ..Setup::default()
            },
        )
    }

    fn start_with(n: u8, setup: Setup) -> Self {
        // The backends first, then the agents on ports no listener holds on any address: an
        // agent's port equal to another instance's backend port would be watched as that
        // backend (one host here, not a fleet's many), and answer its probe with 404.
        let dirs: Vec<tempfile::TempDir> = (0..n)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let pumas: Vec<Puma> = dirs
            .iter()
            .map(|d| {
                Puma::start(PumaOptions {
                    threads: 2,
                    error_file: Some(d.path().join("broken")),
                    ..Default::default()
                })
            })
            .collect();
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| addr(loopback(20 + i), free_port_on(Ipv4Addr::UNSPECIFIED.into())))
            .collect();
        let members = addrs
            .iter()
            .zip(pumas.into_iter().zip(dirs))
            .map(|(me, (puma, dir))| {
                let peers = others(&addrs, me);
                // A short latency window: the probes that waited out a stop keep the p99
                // `slow` for about half of it after the thaw.
                let mut extra = format!("[web]\nlatency_window = \"5s\"\n{}", fleet_peers(&peers));
                if setup.restart {
                    extra = merge_toml(
                        &extra,
                        &format!(
                            "[web]\nrestart_command = \"{}\"\n",
                            puma.restart_script().display()
                        ),
                    );
                }
                if setup.futile_restart {
                    extra = merge_toml(&extra, "[web]\nrestart_command = \"true\"\n");
                }
                if let Some(mode) = setup.socket_tracing {
                    extra = merge_toml(&extra, &format!("[web]\nsocket_tracing = \"{mode}\"\n"));
                }
                let agent = Agent::start_at(*me, &web_config(puma.port, &extra), &[]);
                let poller = HealthPoller::every(*me, Duration::from_millis(100));
                // ~4 requests a second, each on a new connection; or ~20 on the real pages.
                let load = if setup.pages {
                    Some(Load::new_connections(
                        puma.port,
                        "/orders",
                        2,
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                    ))
                } else {
                    setup.traffic.then(|| {
                        Load::new_connections(
                            puma.port,
                            "/",
                            1,
                            Duration::from_millis(250),
                            Duration::from_secs(10),
                        )
                    })
                };
                Member {
                    poller,
                    _load: load,
                    agent,
                    puma,
                    error_file: dir.path().join("broken"),
                    _dir: dir,
                }
            })
            .collect();
        Self { members }
    }

    fn explain(&self) -> String {
        let mut out = String::new();
        for (i, m) in self.members.iter().enumerate() {
            out.push_str(&format!(
                "\n--- instance {i}: agent {} (log tail):\n{}",
                m.agent.addr,
                tail(&m.agent.logs(), 25)
            ));
        }
        out
    }

    fn peers_of(&self, i: usize) -> Vec<String> {
        others_than(i, self.members.iter().map(|m| &m.agent))
    }

    /// [`Fleet::wait_member`] for every member, each from its `from`; returns the slowest, in
    /// seconds from its `from`, and fails if that is over `within` (the members are waited for
    /// one after another, so a later one's wait starts late).
    fn wait_all(
        &self,
        from: &[Duration],
        within: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
    ) -> f64 {
        let times: Vec<f64> = (0..self.members.len())
            .map(|i| {
                let what = format!("instance {i}: {what}");
                self.wait_member(i, from[i], within, &what, &pred)
                    .after(from[i])
            })
            .collect();
        let slowest = times.iter().copied().fold(0.0, f64::max);
        assert!(
            slowest <= within.as_secs_f64(),
            "{what}: {times:.1?} s from each one's fault, over {within:?}"
        );
        slowest
    }

    /// Member `i`'s first answer at or after `from` (its poller's clock) that satisfies `pred`.
    fn wait_member(
        &self,
        i: usize,
        from: Duration,
        within: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
    ) -> HealthSample {
        let poller = &self.members[i].poller;
        poller.wait_for_from(from, within, what, pred, || self.explain())
    }

    /// Waits until every agent answers 200 with its web backend up and every peer answering.
    fn wait_serving(&self, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        for (i, m) in self.members.iter().enumerate() {
            let peers = self.peers_of(i);
            m.poller.wait_for_from(
                m.poller.elapsed(),
                deadline.saturating_duration_since(Instant::now()),
                &format!("instance {i}: 200, webserver up, every peer answering {what}"),
                |s| s.code == 200 && s.webserver == "up" && answered(s) == peers,
                || self.explain(),
            );
        }
    }

    /// SIGSTOPs the Pumas of `which`, one right after the other; returns each poller's clock
    /// at the stop.
    fn stop(&self, which: &[usize]) -> Vec<Duration> {
        let at = self.members.iter().map(|m| m.poller.elapsed()).collect();
        for &i in which {
            self.members[i].puma.signal(libc::SIGSTOP);
        }
        at
    }

    fn resume(&self, which: &[usize]) {
        for &i in which {
            self.members[i].puma.signal(libc::SIGCONT);
        }
    }
}

fn shape(n: u8, traffic: bool) -> String {
    format!(
        "{n} instances, {}",
        if traffic { "under traffic" } else { "idle" }
    )
}

/// How many times each shape stops the whole fleet (HEALTH_AGENT_TESTS_FLEET_REPS; the
/// issue's figure is 10 per shape, CI runs fewer).
fn reps() -> usize {
    std::env::var("HEALTH_AGENT_TESTS_FLEET_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// Every backend of the fleet stops at once, `reps()` times: no agent ever answers 503 (polled
/// every 100 ms, as the split-brain of two idle peers was seen), and every one turns
/// `infrastructure_issue`. Returns each rep's time to the last agent's `infrastructure_issue`.
fn whole_fleet_stopped_is_never_503(n: u8, traffic: bool) -> Vec<f64> {
    require_root();
    let group = Fleet::start(n, traffic);
    let all: Vec<usize> = (0..n as usize).collect();
    let what = shape(n, traffic);
    group.wait_serving(WAIT, "at start");
    let mut times = Vec::new();
    for rep in 0..reps() {
        let stopped = group.stop(&all);
        let slowest = group.wait_all(
            &stopped,
            Duration::from_secs(20),
            &format!("{what}, rep {rep}: infrastructure_issue"),
            |s| s.recommendation == "infrastructure_issue",
        );
        // Held a little longer: a late 503 counts too.
        std::thread::sleep(Duration::from_secs(3));
        for (i, m) in group.members.iter().enumerate() {
            let samples = m.poller.samples();
            let ctx = format!(
                "\n{what}, rep {rep}, instance {i}:\n{}{}",
                timeline(&since(&samples, stopped[i])),
                group.explain()
            );
            assert_answered(&since(&samples, stopped[i]), &ctx);
            if let Some(s) = samples.iter().find(|s| s.at >= stopped[i] && s.code == 503) {
                panic!(
                    "a 503 while every backend of the fleet was stopped: {s}\ndetails.fleet: {}{ctx}",
                    pretty(fleet(s))
                );
            }
        }
        println!("{what}, rep {rep}: 0 × 503, infrastructure_issue on all within {slowest:.2}s");
        times.push(slowest);
        group.resume(&all);
        group.wait_serving(Duration::from_secs(45), &format!("after rep {rep}'s thaw"));
    }
    times
}

/// One test per fleet size and traffic: `name: (instances, under traffic)`.
macro_rules! whole_fleet_stopped {
    ($($name:ident: $n:literal, $traffic:literal;)*) => {$(
        #[test]
        fn $name() {
            whole_fleet_stopped_is_never_503($n, $traffic);
        }
    )*};
}

whole_fleet_stopped! {
    whole_fleet_stopped_two_idle: 2, false;
    whole_fleet_stopped_two_under_traffic: 2, true;
    whole_fleet_stopped_three_idle: 3, false;
    whole_fleet_stopped_three_under_traffic: 3, true;
}

/// One backend of two stops, idle and under traffic: still this instance's own fault, 503 as
/// before (nothing to restart it with), its peer 200 throughout; prints the time to 503, which
/// now waits for the peer's evidence newer than the fault.
#[test]
fn one_stopped_of_two_is_503_and_its_peer_stays_200() {
    require_root();
    for traffic in [false, true] {
        let what = shape(2, traffic);
        let group = Fleet::start(2, traffic);
        group.wait_serving(WAIT, "at start");
        let stopped = group.stop(&[0]);
        let (one, other) = (&group.members[0], &group.members[1]);
        let down = group.wait_member(
            0,
            stopped[0],
            Duration::from_secs(20),
            &format!("{what}: 503 on the stopped instance"),
            |s| s.code == 503,
        );
        let local = judged(&down, "local");
        assert!(
            local.is_some(),
            "{what}: the 503 rests on no `local` judgement: {down}\ndetails.fleet: {}{}",
            pretty(fleet(&down)),
            group.explain()
        );
        // What asking the peer adds: from the first answer naming the fault to the 503.
        let seen = one
            .poller
            .samples()
            .into_iter()
            .find(|s| s.at >= stopped[0] && s.webserver == "hung")
            .map_or(f64::NAN, |s| s.after(stopped[0]));
        println!(
            "{what}: stop → hung seen in {seen:.2}s, → 503 in {:.2}s ({down}); judgement {}",
            down.after(stopped[0]),
            local.unwrap_or_default()
        );
        std::thread::sleep(Duration::from_secs(2));
        let samples = other.poller.samples();
        if let Some(s) = samples.iter().find(|s| s.at >= stopped[1] && s.code != 200) {
            panic!(
                "{what}: the instance whose backend serves left 200: {s}\n{}{}",
                timeline(&since(&samples, stopped[1])),
                group.explain()
            );
        }
        group.resume(&[0]);
    }
}

/// Three instances serving their real pages (about 20 requests a second each), each agent
/// able to restart its Puma for real, after a whole window (`web.errors_window`, 10 s) of good
/// answers, as in a fleet that has served for a while: a 5xx share then crosses the threshold
/// only some seconds after the errors begin. Returns each poller's clock at that point.
fn serving_pages() -> (Fleet, Vec<Duration>) {
    serving_pages_with(Setup {
        pages: true,
        restart: true,
        ..Setup::default()
    })
}

/// [`serving_pages`] with another setup (a restart that changes nothing, a tracing mode).
fn serving_pages_with(setup: Setup) -> (Fleet, Vec<Duration>) {
    require_root();
    let group = Fleet::start_with(3, setup);
    group.wait_serving(WAIT, "at start");
    std::thread::sleep(Duration::from_secs(10));
    let at = group.members.iter().map(|m| m.poller.elapsed()).collect();
    (group, at)
}

/// One instance of three answers 500 to its real pages while its `/up` says 200 and its peers
/// serve: its own fault. Its agent restarts Puma once (for real: the new process raises too),
/// then answers 503 naming its 5xx share and the peers', at most 15 s after the errors began;
/// the peers stay 200 throughout. Mended, it is healthy again.
#[test]
fn one_erroring_of_three_is_503_after_its_restart_and_its_peers_stay_200() {
    let (group, at) = serving_pages();
    let one = &group.members[0];
    let first = one.puma.pid();
    one.break_pages();
    let down = group.wait_member(
        0,
        at[0],
        Duration::from_secs(30),
        "503 on the erroring instance",
        |s| s.code == 503,
    );
    let took = down.after(at[0]);
    let samples = since(&one.poller.samples(), at[0]);
    let ctx = format!("\n{}{}", timeline(&samples), group.explain());
    let local = judged(&down, "local");
    println!(
        "errors began → 503 in {took:.2}s ({down}); judgement {}\n{}",
        local.clone().unwrap_or_default(),
        timeline(&samples)
    );
    assert!(
        took <= 15.0,
        "503 came {took:.2}s after the errors began (at most 15 s){ctx}"
    );
    assert_eq!(down.webserver, "erroring", "{down}{ctx}");
    let reason = reasons(&down).join("; ");
    assert!(
        reason.contains("real answers 5xx") && reason.contains("the peers' 5xx shares"),
        "the reason names its share and the peers': {reason}{ctx}"
    );
    assert!(
        local.is_some(),
        "the 503 rests on no `local` judgement{ctx}"
    );
    assert_ne!(
        one.puma.current_pid(),
        first,
        "the restart did not replace Puma{ctx}"
    );
    assert_eq!(
        down.body["details"]["heal"]["total_attempts"], 1,
        "one restart{ctx}"
    );
    assert!(
        samples.iter().any(|s| s.status == "recovering"),
        "no self-heal before the 503{ctx}"
    );
    // The peers served 200 throughout.
    for (i, m) in group.members.iter().enumerate().skip(1) {
        let samples = since(&m.poller.samples(), at[i]);
        if let Some(s) = samples.iter().find(|s| s.code != 200) {
            panic!(
                "instance {i}, whose backend serves, left 200: {s}\n{}{}",
                timeline(&samples),
                group.explain()
            );
        }
    }
    // Mended: healthy again.
    let mended = one.poller.elapsed();
    one.mend_pages();
    let healthy = group.wait_member(
        0,
        mended,
        Duration::from_secs(30),
        "healthy again once mended",
        |s| s.code == 200 && s.status == "healthy" && s.webserver == "up",
    );
    println!(
        "mended → healthy in {:.2}s ({healthy})",
        healthy.after(mended)
    );
}

/// Issue 53 item 6: one instance of three answers 500 to its real pages, and its restart
/// command (`true`) returns at once and changes nothing: the answers after it are still 5xx.
/// The restart is judged on those fresh answers, not at `heal.timeout` (30 s): that instance
/// is 503 at most 15 s after the errors began, its peers 200 throughout. In `socket_tracing`
/// mode `mode` (None: the default).
fn futile_restart_of_an_erroring_instance(mode: Option<&'static str>) {
    let (group, at) = serving_pages_with(Setup {
        pages: true,
        futile_restart: true,
        socket_tracing: mode,
        ..Setup::default()
    });
    let one = &group.members[0];
    let first = one.puma.pid();
    one.break_pages();
    let down = group.wait_member(
        0,
        at[0],
        Duration::from_secs(40),
        "503 on the erroring instance",
        |s| s.code == 503,
    );
    let took = down.after(at[0]);
    let samples = since(&one.poller.samples(), at[0]);
    let ctx = format!("\n{}{}", timeline(&samples), group.explain());
    println!(
        "socket_tracing {}: errors began → 503 in {took:.2}s ({down})\n{}",
        mode.unwrap_or("(default)"),
        timeline(&samples)
    );
    assert!(
        took <= 15.0,
        "503 came {took:.2}s after the errors began (at most 15 s){ctx}"
    );
    assert_eq!(down.webserver, "erroring", "{down}{ctx}");
    assert_eq!(
        one.puma.current_pid(),
        first,
        "`true` replaced nothing{ctx}"
    );
    let heal = &down.body["details"]["heal"];
    assert_eq!(heal["total_attempts"], 1, "one restart{ctx}");
    let why = heal["attempts"][0]["why"].as_str().unwrap_or_default();
    assert!(
        why.contains("changed nothing") && why.contains("real answers since were 5xx"),
        "the attempt is judged on the answers after it: {why}{ctx}"
    );
    for (i, m) in group.members.iter().enumerate().skip(1) {
        let samples = since(&m.poller.samples(), at[i]);
        if let Some(s) = samples.iter().find(|s| s.code != 200) {
            panic!(
                "instance {i}, whose backend serves, left 200: {s}\n{}{}",
                timeline(&samples),
                group.explain()
            );
        }
    }
}

#[test]
fn a_futile_restart_of_an_erroring_instance_is_judged_on_fresh_answers() {
    futile_restart_of_an_erroring_instance(None);
}

#[test]
fn a_futile_restart_of_an_erroring_instance_is_judged_on_fresh_answers_always() {
    futile_restart_of_an_erroring_instance(Some("always"));
}

/// Every instance answers 500 to its real pages (a bad deploy): no agent ever answers 503, none
/// restarts, and all three say `infrastructure_issue` within 20 s. Mended, all are healthy.
#[test]
fn all_three_erroring_is_never_503_and_infrastructure_issue_on_all() {
    let (group, at) = serving_pages();
    for m in &group.members {
        m.break_pages();
    }
    let slowest = group.wait_all(&at, Duration::from_secs(20), "infrastructure_issue", |s| {
        s.recommendation == "infrastructure_issue" && s.webserver == "erroring"
    });
    // Held a little longer: a late 503 or restart counts too.
    std::thread::sleep(Duration::from_secs(3));
    for (i, m) in group.members.iter().enumerate() {
        let samples = since(&m.poller.samples(), at[i]);
        let ctx = format!("\ninstance {i}:\n{}{}", timeline(&samples), group.explain());
        assert_answered(&samples, &ctx);
        if let Some(s) = samples.iter().find(|s| s.code == 503) {
            panic!(
                "a 503 while the whole fleet errs: {s}\ndetails.fleet: {}{ctx}",
                pretty(fleet(s))
            );
        }
        let last = samples.last().expect("samples");
        assert_eq!(
            last.body["details"]["heal"]["total_attempts"], 0,
            "a restart for a fault the whole fleet shares{ctx}"
        );
        assert_eq!(last.status, "degraded", "{last}{ctx}");
    }
    println!(
        "all three erroring: 0 × 503, no restart, infrastructure_issue on all within {slowest:.2}s"
    );
    let mended: Vec<Duration> = group.members.iter().map(|m| m.poller.elapsed()).collect();
    for m in &group.members {
        m.mend_pages();
    }
    group.wait_all(
        &mended,
        Duration::from_secs(30),
        "healthy once mended",
        |s| s.code == 200 && s.status == "healthy",
    );
}
