//! `web.socket_tracing = "on_suspicion"`: while real traffic is served well, the programs that
//! follow connections stay detached — the kernel counts not one run of them under a new
//! connection per request, and under back-to-back keep-alive requests only a short counting
//! window's; the answer programs run only in their 1 s sampling windows — and a frozen server
//! still leaves rotation, the attach shown and logged.

use std::time::{Duration, Instant};

use health_agent_tests::{
    background_requests,
    bpf_stats::{runs_of_type, total_runs, BpfStats, CGROUP_SKB},
    require_root, Agent, Load, Nginx,
};

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn healthy_traffic_runs_no_program_and_a_frozen_server_still_leaves_rotation() {
    require_root();
    let nginx = Nginx::start(&[b'x'; 512]);
    let agent = Agent::start(&format!(
        "[checks]\nrecover_after = \"1s\"\n[web]\nport = {}\nprobe_path = \"/index.html\"\n\
         socket_tracing = \"on_suspicion\"\n",
        nginx.port
    ));
    agent.wait_health(WAIT, "healthy first", |c, b| {
        c == 200 && b["checks"]["webserver"] == "up"
    });

    // The answer programs' first 1 s sampling window opens as the agent starts; the next is
    // 30 s later.
    std::thread::sleep(Duration::from_millis(1500));

    // A new connection per request, for a few seconds: nothing runs at all, neither the
    // programs that follow connections nor, between their sampling windows, the answer
    // programs.
    let timeout = Duration::from_secs(2);
    let stats = BpfStats::enable();
    let pid = agent.pid();
    let before = (
        runs_of_type(pid, CGROUP_SKB, false),
        runs_of_type(pid, CGROUP_SKB, true),
    );
    let fresh = Load::new_connections(nginx.port, "/index.html", 2, Duration::ZERO, timeout);
    std::thread::sleep(Duration::from_secs(3));
    let fresh = fresh.stop();
    let runs = (
        runs_of_type(pid, CGROUP_SKB, false) - before.0,
        runs_of_type(pid, CGROUP_SKB, true) - before.1,
    );
    assert!(fresh.answers() > 100, "the load ran: {fresh:?}");
    assert_eq!(
        runs,
        (0, 0),
        "the agent's programs (connection, answer) ran {runs:?} times for {} requests served \
         well",
        fresh.answers()
    );

    // Keep-alive clients sending back to back: sock_diag cannot tell their requests in service
    // from those answered, so the programs attach for one half-second counting window (the next is
    // 15 s later), not for the whole load.
    let before = total_runs(agent.pid());
    let keep_alive = Load::keep_alive(nginx.port, "/index.html", 3, timeout);
    std::thread::sleep(Duration::from_secs(6));
    let keep_alive = keep_alive.stop();
    let runs = total_runs(agent.pid()) - before;
    drop(stats);
    let answers = keep_alive.answers();
    println!("keep-alive: {runs} runs of the agent's programs for {answers} requests");
    assert!(answers > 100, "the load ran: {keep_alive:?}");
    assert!(
        runs > 0 && runs < answers,
        "{runs} runs for {answers} keep-alive requests: attached all along they run on every \
         socket call, 2 or more per request; one counting window in 6 s is a sixth of that"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = agent.health();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["checks"]["webserver"], "up", "{body}");
    let following = &body["details"]["web"]["kernel"]["following"];
    assert_eq!(following["mode"], "on_suspicion", "{following}");
    assert_eq!(following["attached"], false, "{following}");
    assert!(
        !agent.logs().contains("following every connection of port"),
        "a counting window is no suspicion: {}",
        agent.logs()
    );

    // The production failure: every nginx process stopped with its listener open.
    nginx.signal_all(libc::SIGSTOP);
    let stopped = Instant::now();
    let _clients = background_requests(nginx.port, 5, Duration::from_secs(15));
    let (code, body) = agent.wait_health(WAIT, "503 hung", |c, _| c == 503);
    let took = stopped.elapsed();
    println!("on_suspicion: 503 hung {took:?} after SIGSTOP");
    assert_eq!(body["checks"]["webserver"], "hung", "{body}");
    let following = &body["details"]["web"]["kernel"]["following"];
    assert_eq!(following["attached"], true, "{following}");
    assert!(
        following["why"]
            .as_str()
            .is_some_and(|w| w.contains("accept queue")),
        "{following}"
    );
    assert!(
        agent.logs().contains("following every connection of port"),
        "the attach is logged"
    );
    assert_eq!(code, 503);
    assert!(took < Duration::from_secs(5), "503 {took:?} after the stop");

    nginx.signal_all(libc::SIGCONT);
    agent.wait_health(WAIT, "200 again after SIGCONT", |c, b| {
        c == 200 && b["checks"]["webserver"] == "up"
    });
}
