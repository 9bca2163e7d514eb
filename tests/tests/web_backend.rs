//! The kernel view of the web backend against real servers: exact counters through nginx, each
//! hang shape of the fixture backend, a `kill -STOP`ped server (the production failure), and
//! the degraded mode without eBPF.

use std::time::Duration;

use health_agent_tests::{
    background_requests, counters, requests, require_root, watched_fixture, Agent, Fixture, Nginx,
};

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn nginx_requests_are_counted_exactly() {
    require_root();
    let nginx = Nginx::start(&[b'x'; 512]);
    // Everything counted all along, and accept() traced all the time, so `accepted` is exact
    // too.
    let agent = Agent::on_port(
        nginx.port,
        "[web]\nprobe_path = \"\"\naccept_tracing = \"always\"\nsocket_tracing = \"always\"\n",
    );
    const N: usize = 100;
    assert_eq!(requests(nginx.port, N, "/index.html"), N);
    let (_, body) = agent.wait_health(WAIT, "N answered", |_, b| {
        counters(b)["answered"] == N as u64
    });
    let c = counters(&body);
    for k in ["established", "accepted", "claimed", "requests", "answered"] {
        assert_eq!(c[k], N as u64, "{k}: {c}");
    }
    assert_eq!(c["closed_unanswered"], 0, "{c}");
    assert_eq!(body["checks"]["webserver"], "up");
    let pids: Vec<u64> = body["details"]["web"]["pids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.as_u64())
        .collect();
    assert!(
        pids.contains(&(nginx.pids()[0] as u64)),
        "nginx master owns the listener: {pids:?}"
    );
}

#[test]
fn stopped_server_is_hung_503_then_200_after_cont() {
    require_root();
    let nginx = Nginx::start(b"hello");
    // The counters' view of the hang is asserted: counted all along (the default's is in
    // tests/tests/socket_tracing.rs).
    let agent = Agent::start(&format!(
        "[checks]\nrecover_after = \"1s\"\n[web]\nport = {}\nhung_after = \"2s\"\n\
         socket_tracing = \"always\"\n",
        nginx.port
    ));
    agent.wait_up(WAIT, "healthy first");

    nginx.signal_all(libc::SIGSTOP);
    let clients = background_requests(nginx.port, 5, Duration::from_secs(15));
    let (code, body) = agent.wait_health(WAIT, "503 hung", |c, _| c == 503);
    assert_eq!(code, 503);
    assert_eq!(body["checks"]["webserver"], "hung", "{body}");
    let web = &body["details"]["web"];
    assert!(web["accept_queue"].as_u64().unwrap() >= 5, "{web}");
    // Every nginx process is stopped: hung once the oldest connection has waited 0.5 s, not
    // hung_after, and the detail says why. accept() tracing came on once connections waited
    // 200 ms, and saw nothing.
    let c = counters(&body);
    assert!(c["oldest_waiting_ms"].as_u64().unwrap() >= 500, "{web}");
    assert!(c["ms_since_last_claim"].as_u64().unwrap() >= 500, "{web}");
    assert_eq!(c["accepts_traced"], true, "{web}");
    assert_eq!(c["accepted"], 0, "{web}");
    let detail = web["detail"].as_str().unwrap();
    assert!(detail.contains("stopped"), "{web}");
    assert!(detail.contains("accept queue"), "{web}");
    assert!(
        web["processes"]["frozen"]
            .as_str()
            .is_some_and(|f| f.contains(&nginx.pids()[0].to_string())),
        "{web}"
    );

    nginx.signal_all(libc::SIGCONT);
    let (_, body) = agent.wait_health(WAIT, "200 after SIGCONT", |c, _| c == 200);
    assert_eq!(body["checks"]["webserver"], "up", "{body}");
    for c in clients {
        let _ = c.join();
    }
}

#[test]
fn fixture_shapes_get_their_verdicts() {
    require_root();
    let (backend, agent) = watched_fixture(
        "[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n\
         [web]\nhung_after = \"2s\"\nunanswered_after = \"3s\"\nprobe_timeout = \"6s\"\n\
         slow_after = \"700ms\"\nlatency_window = \"3s\"\n",
    );
    let up = agent.wait_up(WAIT, "up");
    assert_eq!(up.1["status"], "healthy");

    // slow: answering, but over slow_after → 200 degraded, scale_up.
    backend.set_mode("slow?delay_ms=1200");
    let _load = background_requests(backend.port, 8, Duration::from_secs(10));
    let (code, body) = agent.wait_health(WAIT, "slow", |_, b| b["checks"]["webserver"] == "slow");
    assert_eq!(code, 200);
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["recommendation"], "scale_up");

    backend.set_mode("normal");
    agent.wait_up(WAIT, "up again");

    // accepts and reads, never answers → unresponsive, 503.
    backend.set_mode("no-respond");
    let at = std::time::Instant::now();
    let _waiting = background_requests(backend.port, 3, Duration::from_secs(8));
    let (code, body) = agent.wait_health(WAIT, "unresponsive", |_, b| {
        b["checks"]["webserver"] == "unresponsive"
    });
    println!(
        "no-respond → {code} unresponsive in {:.1}s (unanswered_after 3s), tier {}",
        at.elapsed().as_secs_f64(),
        body["details"]["web"]["kernel"]["tier"]
    );
    assert_eq!(code, 503, "{body}");
    // The programs' counters exist in the full tier; below it sock_diag saw the same requests
    // (HEALTH_AGENT_TESTS_KERNEL_TIER runs this test per tier).
    if body["details"]["web"]["kernel"]["tier"] == "full" {
        let c = counters(&body);
        assert!(
            c["pending"].as_u64().unwrap() >= 1,
            "kernel saw read-but-unanswered requests: {c}"
        );
    }

    backend.set_mode("normal");
    agent.wait_up(WAIT, "up again");

    // keeps the listen socket, never accepts → hung, 503.
    backend.set_mode("stop-accepting");
    let at = std::time::Instant::now();
    let _queued = background_requests(backend.port, 4, Duration::from_secs(8));
    let (code, body) = agent.wait_health(WAIT, "hung", |_, b| b["checks"]["webserver"] == "hung");
    println!(
        "stop-accepting → {code} hung in {:.1}s (hung_after 2s)",
        at.elapsed().as_secs_f64()
    );
    assert_eq!(code, 503, "{body}");

    backend.set_mode("normal");
    agent.wait_up(WAIT, "up again");

    // process exits → nothing listens → down, 503.
    backend.set_mode("exit");
    let (code, body) = agent.wait_health(WAIT, "down", |_, b| b["checks"]["webserver"] == "down");
    assert_eq!(code, 503, "{body}");
}

#[test]
fn without_ebpf_a_stopped_server_is_still_caught() {
    require_root();
    let (backend, agent) = watched_fixture(
        "[checks]\ninterval = \"500ms\"\n\
         [web]\nkernel = false\nhung_after = \"2s\"\nprobe_timeout = \"1s\"\n",
    );
    let (_, body) = agent.wait_up(WAIT, "up");
    let kernel = &body["details"]["web"]["kernel"];
    assert_eq!(kernel["state"], "disabled");
    // The no_ebpf tier, and the response says what it lacks.
    assert_eq!(kernel["tier"], "no_ebpf", "{kernel}");
    assert!(
        kernel["missing"].to_string().contains("web.kernel = false"),
        "{kernel}"
    );
    assert!(body["details"]["web"].get("counters").is_none());

    backend.signal(libc::SIGSTOP);
    let stopped = std::time::Instant::now();
    let _clients = background_requests(backend.port, 3, Duration::from_secs(10));
    let (code, body) = agent.wait_health(
        WAIT,
        "503 hung from sock_diag, /proc and the probe",
        |c, _| c == 503,
    );
    assert_eq!(body["checks"]["webserver"], "hung", "{body}");
    assert_eq!(code, 503);
    println!(
        "no eBPF: SIGSTOP → 503 hung in {:.1}s: {}",
        stopped.elapsed().as_secs_f64(),
        body["details"]["web"]["detail"]
    );
    backend.signal(libc::SIGCONT);
    agent.wait_health(WAIT, "200 after SIGCONT", |c, _| c == 200);
}

#[test]
fn saturated_but_working_server_is_never_hung() {
    saturated_but_working("always");
}

/// The same with the connection programs attached only on suspicion: they attach once
/// connections wait, and never saw the ones queued before; sock_diag covers those.
#[test]
fn saturated_but_working_server_is_never_hung_with_programs_attached_on_suspicion() {
    saturated_but_working("on_suspicion");
}

fn saturated_but_working(socket_tracing: &str) {
    require_root();
    // One worker at 50 ms a request and 60 clients at once: the accept queue backs up for
    // seconds (far past hung_after), yet accepts keep coming. That is slow, never hung.
    let backend = Fixture::start_with(
        "slow",
        &["--workers", "1", "--delay-ms", "50", "--backlog", "256"],
    );
    let agent = Agent::start(&format!(
        "[web]\nport = {}\nhung_after = \"1s\"\nslow_after = \"10s\"\nprobe_path = \"\"\n\
         socket_tracing = \"{socket_tracing}\"\n",
        backend.port
    ));
    let clients = background_requests(backend.port, 60, Duration::from_secs(20));
    let mut deepest_wait = 0;
    for _ in 0..25 {
        let (_, body) = agent.health();
        let v = body["checks"]["webserver"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            v != "hung" && v != "unresponsive",
            "a working server was called {v}: {body}"
        );
        // The programs' view, or sock_diag's for connections they never saw.
        let seen = &body["details"]["web"]["kernel"]["following"]["connections"];
        deepest_wait = deepest_wait
            .max(counters(&body)["oldest_waiting_ms"].as_u64().unwrap_or(0))
            .max(seen["oldest_unaccepted_ms"].as_u64().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        deepest_wait >= 1000,
        "the test must really saturate the server: oldest waiting connection was {deepest_wait} ms"
    );
    for c in clients {
        let _ = c.join();
    }
    // The exact counts come from the programs that follow connections: the full tier only.
    let tier = agent.health().1["details"]["web"]["kernel"]["tier"].clone();
    if socket_tracing != "always" || tier != "full" {
        return;
    }
    let (_, body) = agent.wait_health(WAIT, "all served", |_, b| counters(b)["answered"] == 60);
    let c = counters(&body);
    assert_eq!(c["claimed"], 60, "{c}");
    // Connections waited past 200 ms: accept() tracing came on and saw the server accept.
    assert_eq!(c["accepts_traced"], true, "{c}");
    assert!(c["accepted"].as_u64().unwrap() > 0, "{c}");
}

#[test]
fn connection_flood_evicts_instead_of_failing() {
    require_root();
    // A table of 64 connections and 300 held open at once: the LRU table must evict, the
    // agent keep answering, and nothing fail or grow.
    let (backend, agent) =
        watched_fixture("[web]\nmax_connections_tracked = 64\nsocket_tracing = \"always\"\n");
    let held: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", backend.port)).ok())
        .collect();
    assert_eq!(held.len(), 300);
    assert_eq!(requests(backend.port, 20, "/"), 20);
    let (code, body) = agent.wait_health(WAIT, "the flood counted", |_, b| {
        counters(b)["established"].as_u64().unwrap_or(0) >= 320
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["checks"]["webserver"], "up");
    assert_eq!(body["details"]["web"]["kernel"]["state"], "active");
    drop(held);
    assert!(
        !agent.logs().contains("insert failed"),
        "an LRU table never refuses an insert: {}",
        agent.logs()
    );
}
