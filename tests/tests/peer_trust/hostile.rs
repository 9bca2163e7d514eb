//! Hostile peers on loopback against real agents at the defaults plus `[fleet]`: stand-ins
//! without the key (forged, wrong-key and replayed views), a stand-in with the key whose view is
//! out of every range, and a stand-in that streams gigabytes. None may keep a dead box in
//! rotation, take a healthy fleet out, crash an agent or grow it.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port_on, loopback, merge_toml, pretty, require_root, tail, timeline,
    trust::{self, PeerStandIn, Reply, FLEET_KEY},
    web_config, Agent, Fixture, HealthPoller, HealthSample, Load, Postgres,
};
use serde_json::{json, Value};

/// Agent start to a first verdict.
const WAIT: Duration = Duration::from_secs(30);

/// Another fleet's key: a stand-in that holds it is no member of this fleet.
const OTHER_KEY: &str = "aNoThEr-FlEeT-kEy-0123456789abcdefghijklmnopqrs";

fn addr(ip: std::net::IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

fn fleet_config(peers: &[String], more: &str) -> String {
    format!("[fleet]\npeers = {peers:?}\ninterval = \"1s\"\ntimeout = \"1s\"\n{more}")
}

/// A view that says `web` with evidence `fine_ms` old for every class: what a peer that
/// wants to be believed answers.
fn view_body(web: &str, db: &str, fine_ms: u64) -> String {
    json!({
        "version": 1, "instance": format!("{:016x}", fine_ms ^ 0x5eed), "host": "stand-in",
        "web": web, "database": db, "containers": "not_configured",
        "dependencies": [], "unreachable": [],
        "fine_ms": {"web": fine_ms, "dependency": fine_ms, "containers": null, "errors": null},
    })
    .to_string()
}

fn peers_failed(body: &Value) -> Vec<String> {
    body["details"]["fleet"]["peers_failed"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn failed_in(samples: &[HealthSample], peer: &SocketAddr) -> Option<String> {
    samples.iter().rev().find_map(|s| {
        peers_failed(&s.body)
            .into_iter()
            .find(|f| f.starts_with(&format!("{peer}: ")))
    })
}

/// Stand-ins without the key answer `hung` (unsigned, or signed with another fleet's key), and
/// one replays a genuine view an agent of this fleet signed for another ask. The backend is
/// killed: the agent restarts it (its command changes nothing) and leaves rotation, and names
/// each stand-in as unproven. Believed, the three would have made the fault the fleet's: 200.
#[test]
fn peers_without_the_key_cannot_keep_a_dead_box_in_rotation() {
    require_root();
    // A genuine view to replay: an agent of this fleet whose backend is down, asked once.
    let dead_port = free_port_on(loopback(4));
    let witness_addr = addr(loopback(4), free_port_on(loopback(4)));
    let witness = Agent::start_at(
        witness_addr,
        &web_config(dead_port, &fleet_config(&["127.0.0.9:9".into()], "")),
        &[],
    );
    let recorded = health_agent_tests::wait_until(WAIT, "the witness's view to say `down`", || {
        let r = trust::ask_view_raw(witness_addr, FLEET_KEY).ok()?;
        let v: Value = serde_json::from_str(&r.body).ok()?;
        (r.code == 200 && v["web"] == "down").then_some(r)
    });
    drop(witness);

    let unsigned = PeerStandIn::start(loopback(5), 0, |_| Reply::View {
        body: view_body("hung", "connected", 50),
        proof: None,
    });
    let wrong_key = PeerStandIn::start(loopback(6), 0, |path| {
        Reply::signed(OTHER_KEY, path, view_body("hung", "connected", 50))
    });
    let replayed = {
        let r = recorded.clone();
        PeerStandIn::start(loopback(7), 0, move |_| Reply::View {
            body: r.body.clone(),
            proof: Some(r.proof.clone()),
        })
    };
    let stand_ins = [&unsigned, &wrong_key, &replayed];
    let peers: Vec<String> = stand_ins.iter().map(|s| s.addr.to_string()).collect();

    let fixture = Fixture::start("normal");
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("restarted");
    // The restart is tried and fails (the command says so): nothing brings the backend back.
    let restart = format!("touch {} && false", marker.display());
    let me = addr(loopback(2), free_port_on(loopback(2)));
    let agent = Agent::start_at(
        me,
        &web_config(
            fixture.port,
            &fleet_config(&peers, &format!("[web]\nrestart_command = {restart:?}\n")),
        ),
        &[],
    );
    let poller = HealthPoller::start_at(me);
    let explain = || format!("\nagent log (tail):\n{}", tail(&agent.logs(), 40));
    poller.wait_for_from(
        Duration::ZERO,
        WAIT,
        "200 healthy",
        |s| s.code == 200,
        explain,
    );

    let killed_at = poller.elapsed();
    fixture.signal(libc::SIGKILL);
    let out = poller.wait_for_from(
        killed_at,
        Duration::from_secs(60),
        "503 after the backend was killed, whatever the stand-ins say",
        |s| s.code == 503,
        explain,
    );
    let samples = poller.stop();
    println!(
        "killed → 503 in {:.1}s: {out}\n{}",
        out.after(killed_at),
        timeline(&samples)
    );
    assert!(
        marker.exists(),
        "no restart was attempted before the 503{}",
        explain()
    );
    assert!(
        samples
            .iter()
            .all(|s| s.recommendation != "infrastructure_issue"),
        "a stand-in was believed: the fault was called the fleet's{}",
        explain()
    );
    for (s, what) in stand_ins
        .iter()
        .zip(["unsigned", "another fleet's key", "a replay"])
    {
        let f = failed_in(&samples, &s.addr).unwrap_or_else(|| {
            panic!(
                "the {what} stand-in {} is not named in details.fleet.peers_failed{}",
                s.addr,
                explain()
            )
        });
        println!("{what}: {f}");
        assert!(f.contains("unproven"), "the {what} stand-in: {f}");
        assert!(s.asks() > 0, "the {what} stand-in was never asked");
    }
    let logs = agent.logs();
    for s in stand_ins {
        let lines = logs
            .lines()
            .filter(|l| l.contains(&format!("peer {} answered but is not counted", s.addr)))
            .count();
        assert_eq!(
            lines,
            1,
            "logged once per peer, not per round ({} asks): {}",
            s.asks(),
            tail(&logs, 40)
        );
    }
    let metrics = agent.metrics();
    assert!(
        metrics.lines().any(|l| l
            .starts_with("health_agent_fleet_peer_failures_total{reason=\"unproven\"}")
            && !l.ends_with(" 0")),
        "no unproven failures counted in /metrics:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("fleet_peer"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Three real agents share a PostgreSQL that stops for everyone; beside each other they also
/// have two stand-ins without the key that answer `up` with evidence a few milliseconds old.
/// Believed, they would make the outage each agent's own: a fleet-wide 503. Not one 503.
#[test]
fn peers_without_the_key_cannot_turn_a_shared_outage_into_503s() {
    require_root();
    let pg = Postgres::start();
    let liars: Vec<PeerStandIn> = (0..2u8)
        .map(|i| {
            PeerStandIn::start(loopback(8 + i), 0, |_| Reply::View {
                body: view_body("up", "connected", 5),
                proof: None,
            })
        })
        .collect();
    let fixtures: Vec<Fixture> = (0..3).map(|_| Fixture::start("normal")).collect();
    let addrs: Vec<SocketAddr> = (0..3u8)
        .map(|i| addr(loopback(2 + i), free_port_on(loopback(2 + i))))
        .collect();
    let agents: Vec<(Agent, HealthPoller)> = addrs
        .iter()
        .zip(&fixtures)
        .map(|(me, fx)| {
            let mut peers: Vec<String> = addrs
                .iter()
                .filter(|a| *a != me)
                .map(ToString::to_string)
                .collect();
            peers.extend(liars.iter().map(|l| l.addr.to_string()));
            let extra = merge_toml(
                &fleet_config(&peers, ""),
                &format!(
                    "[database]\nurl = \"postgres://postgres@127.0.0.1:{}/postgres\"\n\
                     interval = \"2s\"\ntimeout = \"1s\"\n",
                    pg.port
                ),
            );
            let agent = Agent::start_at(
                *me,
                &web_config(fx.port, &extra),
                &[("PGPASSWORD", pg.password.as_str())],
            );
            (agent, HealthPoller::start_at(*me))
        })
        .collect();
    let explain = || {
        agents
            .iter()
            .map(|(a, _)| format!("\n--- agent {}:\n{}", a.addr, tail(&a.logs(), 25)))
            .collect::<String>()
    };
    for (a, p) in &agents {
        p.wait_for_from(
            Duration::ZERO,
            WAIT,
            &format!("{}: 200 healthy with the database connected", a.addr),
            |s| s.code == 200 && s.status == "healthy" && s.database == "connected",
            explain,
        );
    }
    let stopped: Vec<Duration> = agents.iter().map(|(_, p)| p.elapsed()).collect();
    pg.stop();
    std::thread::sleep(Duration::from_secs(20));
    pg.resume();
    for (i, (a, p)) in agents.iter().enumerate() {
        let samples: Vec<HealthSample> = p
            .samples()
            .into_iter()
            .filter(|s| s.at >= stopped[i])
            .collect();
        println!(
            "agent {} from the outage on:\n{}",
            a.addr,
            timeline(&samples)
        );
        if let Some(s) = samples.iter().find(|s| s.code == 503) {
            panic!(
                "agent {}: 503 during an outage every instance shares: {s}\ndetails.fleet: {}{}",
                a.addr,
                pretty(&s.body["details"]["fleet"]),
                explain()
            );
        }
        assert!(
            samples
                .iter()
                .any(|s| s.recommendation == "infrastructure_issue"),
            "agent {}: never infrastructure_issue during the outage{}",
            a.addr,
            explain()
        );
        for l in &liars {
            let f = failed_in(&samples, &l.addr).unwrap_or_default();
            assert!(
                f.contains("unproven"),
                "agent {}: stand-in {} not named unproven: {f:?}",
                a.addr,
                l.addr
            );
        }
    }
}

/// One hostile view each, all signed with the fleet's own key (a compromised member).
fn hostile_views() -> Vec<(&'static str, String, &'static str)> {
    let latency = |extra: &str| {
        format!(
            r#"{{"version":1,"instance":"c0ffee","web":"up","latency":{{"p50_ms":1.0,"p90_ms":2.0,"answers":500,"window_seconds":10.0,"basis":"counted","slow_vs_peers":false,"out_slow":false,{extra}}}}}"#
        )
    };
    vec![
        (
            "began_seconds_ago 1e300",
            latency(r#""began_seconds_ago":1e300"#),
            "field latency.began_seconds_ago is out of range",
        ),
        (
            "p50_ms -1e9",
            latency(r#""began_seconds_ago":1.0"#).replace(r#""p50_ms":1.0"#, r#""p50_ms":-1e9"#),
            "field latency.p50_ms is negative",
        ),
        (
            "NaN as a huge exponent",
            latency(r#""began_seconds_ago":1e999"#),
            "not a peer view",
        ),
        (
            "a 1 MB string",
            format!(r#"{{"version":1,"host":"{}"}}"#, "x".repeat(1 << 20)),
            "over 64 KiB",
        ),
        (
            "arrays 10,000 deep",
            // In a field the view does not know: skipped, but still parsed, depth and all.
            format!(
                r#"{{"version":1,"future":{}{}}}"#,
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
            "nested deeper than 16 levels",
        ),
    ]
}

/// A stand-in that holds the key answers views out of every range. The agent, under real
/// traffic (so the latency comparison runs), never panics: `/livez` stays 200 throughout, and
/// each view is rejected naming its field.
#[test]
fn a_peer_with_the_key_cannot_crash_the_agent_with_a_number() {
    require_root();
    let stand_ins: Vec<(&str, PeerStandIn, &str)> = hostile_views()
        .into_iter()
        .enumerate()
        .map(|(i, (what, body, says))| {
            let s = PeerStandIn::start(loopback(10 + i as u8), 0, move |path| {
                Reply::signed(FLEET_KEY, path, body.clone())
            });
            (what, s, says)
        })
        .collect();
    let peers: Vec<String> = stand_ins
        .iter()
        .map(|(_, s, _)| s.addr.to_string())
        .collect();
    let fixture = Fixture::start("normal");
    let _load = Load::new_connections(
        fixture.port,
        "/",
        2,
        Duration::from_millis(100),
        Duration::from_secs(30),
    );
    let me = addr(loopback(2), free_port_on(loopback(2)));
    let agent = Agent::start_at(
        me,
        &web_config(fixture.port, &fleet_config(&peers, "")),
        &[],
    );
    let explain = || format!("\nagent log (tail):\n{}", tail(&agent.logs(), 40));
    agent.wait_up(WAIT, "the agent to answer /health");
    let t = Instant::now();
    let mut livez = 0;
    while t.elapsed() < Duration::from_secs(12) {
        let (code, body) = agent
            .get("/livez")
            .unwrap_or_else(|e| panic!("/livez did not answer: {e}{}", explain()));
        assert_eq!(code, 200, "/livez {code} {body}{}", explain());
        livez += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, health) = agent.health();
    let failed = peers_failed(&health);
    println!("{livez} × /livez 200 over 12 s; details.fleet.peers_failed:");
    for (what, s, says) in &stand_ins {
        let f = failed
            .iter()
            .find(|f| f.starts_with(&format!("{}: ", s.addr)))
            .unwrap_or_else(|| {
                panic!(
                    "{what}: stand-in {} not named: {failed:?}{}",
                    s.addr,
                    explain()
                )
            });
        println!("  {what}: {f}");
        assert!(f.contains(says), "{what}: {f:?} does not say {says:?}");
        assert!(s.asks() >= 5, "{what}: asked only {} times", s.asks());
    }
    assert!(
        !agent.logs().contains("panicked"),
        "the agent panicked:{}",
        explain()
    );
    assert!(
        health["details"]["fleet"]["peers_answered"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "a hostile view was counted: {}",
        pretty(&health["details"]["fleet"])
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Two stand-ins stream an 8 GB answer, one declaring its length and one not, to an agent with
/// `fleet.timeout = "20s"`. The agent reads at most the cap of each, drops both peers, and its
/// memory does not grow by 16 MB.
#[test]
fn a_peer_streaming_gigabytes_costs_the_agent_at_most_the_cap() {
    require_root();
    let flooding = Arc::new(AtomicBool::new(false));
    let stand_in = |i: u8, declared: bool| {
        let on = flooding.clone();
        PeerStandIn::start(loopback(20 + i), 0, move |_| {
            if on.load(Ordering::SeqCst) {
                Reply::Flood {
                    bytes: 8 << 30,
                    declared,
                }
            } else {
                Reply::View {
                    body: view_body("up", "connected", 5),
                    proof: None,
                }
            }
        })
    };
    let (declared, undeclared) = (stand_in(0, true), stand_in(1, false));
    let peers = vec![declared.addr.to_string(), undeclared.addr.to_string()];
    let fixture = Fixture::start("normal");
    let me = addr(loopback(2), free_port_on(loopback(2)));
    let agent = Agent::start_at(
        me,
        &web_config(
            fixture.port,
            &fleet_config(&peers, "").replace("timeout = \"1s\"", "timeout = \"20s\""),
        ),
        &[],
    );
    let explain = || format!("\nagent log (tail):\n{}", tail(&agent.logs(), 40));
    agent.wait_up(WAIT, "the agent to answer /health");
    // Settled: a few rounds of small answers.
    std::thread::sleep(Duration::from_secs(4));
    let before = rss_kib(agent.pid());
    flooding.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let mut peak = before;
    while t.elapsed() < Duration::from_secs(16) {
        peak = peak.max(rss_kib(agent.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, health) = agent.health();
    let failed = peers_failed(&health);
    println!(
        "RSS before the flood {before} KiB, peak over 16 s {peak} KiB (+{} KiB); streamed to the agent: {} B (declared), {} B (undeclared); /health {code}; peers_failed: {failed:?}",
        peak.saturating_sub(before),
        declared.streamed(),
        undeclared.streamed()
    );
    assert!(
        peak.saturating_sub(before) < 16 * 1024,
        "RSS grew by {} KiB under the flood{}",
        peak - before,
        explain()
    );
    for s in [&declared, &undeclared] {
        let f = failed
            .iter()
            .find(|f| f.starts_with(&format!("{}: ", s.addr)))
            .unwrap_or_else(|| panic!("stand-in {} not named: {failed:?}{}", s.addr, explain()));
        assert!(f.contains("over 64 KiB"), "{f}");
        assert!(s.asks() >= 5, "asked only {} times in the flood", s.asks());
    }
    // Dropped at the cap: what the kernel's socket buffers hold beside it, not gigabytes.
    assert!(
        undeclared.streamed() / undeclared.asks().max(1) < 32 << 20,
        "{} B streamed over {} asks",
        undeclared.streamed(),
        undeclared.asks()
    );
}

/// `[fleet]` with peers and no key: the agent starts, asks and counts no peer, closes its view,
/// and says why in its first log line, `details.fleet` and `check`.
#[test]
fn without_the_key_no_peer_is_counted_and_every_place_says_why() {
    require_root();
    let fixture = Fixture::start("normal");
    let peer_addr = addr(loopback(3), free_port_on(loopback(3)));
    let me = addr(loopback(2), free_port_on(loopback(2)));
    let peer = Agent::start_at(
        peer_addr,
        &web_config(fixture.port, &fleet_config(&[me.to_string()], "")),
        &[],
    );
    let config = web_config(fixture.port, &fleet_config(&[peer_addr.to_string()], ""));
    let keyless = Agent::start_at(me, &config, &[(trust::KEY_VAR, "")]);
    let explain = || format!("\nagent log (tail):\n{}", tail(&keyless.logs(), 30));
    let (_, health) = keyless.wait_health(WAIT, "a round of the fleet", |_, b| {
        b["details"]["fleet"]["discovery"].is_string()
    });
    let fleet = &health["details"]["fleet"];
    println!("details.fleet: {}", pretty(fleet));
    assert!(
        fleet["discovery"]
            .as_str()
            .is_some_and(|d| d.contains("no fleet key") && d.contains(trust::KEY_VAR)),
        "details.fleet.discovery: {fleet}{}",
        explain()
    );
    assert!(
        fleet["peers_answered"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "{fleet}"
    );
    let first = keyless
        .logs()
        .lines()
        .find(|l| l.contains("configuration:"))
        .unwrap_or_default()
        .to_string();
    assert!(
        first.contains("no fleet key"),
        "the first log line: {first}{}",
        explain()
    );
    // Its view is closed, even to a holder of the key.
    let (code, body) = keyless.view_proven().expect("GET /fleet/v1/view");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("no fleet key"), "{body}");
    // `check` says the same.
    let out = std::process::Command::new(health_agent_tests::agent_binary())
        .arg("--config")
        .arg(keyless.config_path())
        .arg("check")
        .env(trust::KEY_VAR, "")
        .output()
        .expect("health-agent check");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("fleet "))
        .unwrap_or_default();
    println!("check: {row}");
    assert!(row.contains("no fleet key"), "check printed:\n{text}");
    // The peer that holds the key gets no view from an agent without one.
    let (_, peer_health) = peer.wait_health(WAIT, "the keyed peer to be refused a view", |_, b| {
        peers_failed(b).iter().any(|f| {
            f.starts_with(&format!("{me}: refused our ask (HTTP 403)"))
                && f.contains("no fleet key")
        })
    });
    assert!(
        peer_health["details"]["fleet"]["peers_answered"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "{}",
        pretty(&peer_health["details"]["fleet"])
    );
}
