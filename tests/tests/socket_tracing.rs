//! `web.socket_tracing = "on_suspicion"` (the default): while real traffic is served well, the
//! programs run only in their counting windows — under half a second every 15 s, the first as
//! the agent starts, the answer programs with every other one for 1 s —, not one run between
//! them; a frozen server still leaves rotation, the attach shown and logged; and the figures
//! users read come from those windows and agree with a known load.

use std::time::{Duration, Instant};

use serde_json::Value;

use health_agent_tests::{
    background_requests,
    bpf_stats::{runs_of_type, total_runs, BpfStats, CGROUP_SKB},
    require_root, Agent, Load, Nginx, OpenLoop, Puma, PumaOptions,
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
    agent.wait_up(WAIT, "healthy first");

    // The first counting window (and the answer programs' first 1 s sampling window) opens as
    // the agent starts; the next is 15 s later.
    std::thread::sleep(Duration::from_millis(1500));

    // A new connection per request, for a few seconds between two windows: nothing runs at
    // all, neither the programs that follow connections nor the answer programs.
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

    // Keep-alive clients sending back to back, across the next counting window (15 s after
    // the first): the programs attach for that half second, not for the whole load.
    let before = total_runs(agent.pid());
    let keep_alive = Load::keep_alive(nginx.port, "/index.html", 3, timeout);
    std::thread::sleep(Duration::from_secs(15));
    let keep_alive = keep_alive.stop();
    let runs = total_runs(agent.pid()) - before;
    drop(stats);
    let answers = keep_alive.answers();
    println!("keep-alive: {runs} runs of the agent's programs for {answers} requests");
    assert!(answers > 100, "the load ran: {keep_alive:?}");
    assert!(
        runs > 0 && runs < answers,
        "{runs} runs for {answers} keep-alive requests: attached all along they run on every \
         socket call, 2 or more per request; one counting window in 15 s is a fifteenth of that"
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
    let why = following["why"].as_str().unwrap_or_default();
    assert!(why.contains("accept queue"), "{following}");
    assert!(
        agent.logs().contains("following every connection of port"),
        "the attach is logged"
    );
    assert_eq!(code, 503);
    assert!(took < Duration::from_secs(5), "503 {took:?} after the stop");

    nginx.signal_all(libc::SIGCONT);
    agent.wait_up(WAIT, "200 again after SIGCONT");
}

/// At the default (`socket_tracing` unset: `on_suspicion`) the figures users read — request
/// rate, latency p50/p99, the saturation's web part — come from the counting windows, are
/// marked so, and agree with a known load within 15 %: Puma under open-loop load, on a new
/// connection per request and on a load balancer's keep-alive pool (one connection per thread:
/// Puma takes no more connections than it has free threads, so a bigger pool waits in the
/// accept queue, which attaches the programs), in `details` and `/metrics`.
#[test]
fn the_figures_from_the_counting_windows_agree_with_a_known_load() {
    require_root();
    const THREADS: usize = 8;
    const RATE: f64 = 200.0;
    let puma = Puma::start(PumaOptions {
        threads: THREADS,
        io_seconds: 0.02,
        backlog: Some(4096),
        ..Default::default()
    });
    let agent = Agent::start(&format!(
        "[web]\nport = {}\nworkers = {THREADS}\n",
        puma.port
    ));
    // The exact counts to compare the estimates with: a second agent on the same port that
    // counts all along.
    let counting = Agent::start(&format!(
        "[web]\nport = {}\nworkers = {THREADS}\nsocket_tracing = \"always\"\n",
        puma.port
    ));
    for a in [&agent, &counting] {
        a.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    }
    let gauge = |metrics: &str, name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let mut failures = Vec::new();
    for (i, name) in ["new connections", "keep-alive"].into_iter().enumerate() {
        let timeout = Duration::from_secs(10);
        let load = if i == 0 {
            OpenLoop::start(puma.port, "/io", RATE, 5, timeout)
        } else {
            OpenLoop::keep_alive(puma.port, "/io", RATE, 6, THREADS, timeout)
        };
        // web.latency_window and scaling.window (60 s by default) fill with this load only.
        std::thread::sleep(Duration::from_secs(64));
        let ((_, body), metrics) = (agent.health(), agent.metrics());
        let (_, exact) = counting.health();
        let stats = load.stop();
        let f = &body["details"]["web"]["figures"];
        let s = &body["details"]["saturation"];
        let x = &exact["details"]["web"]["figures"];
        println!(
            "{name}: {} sent, {} answered, lag ≤ {:?}\n  estimated: {f}\n  saturation {s}\n  \
             counted: {x}",
            stats.sent,
            stats.answers(),
            stats.max_lag
        );
        println!(
            "  the programs: {}",
            body["details"]["web"]["kernel"]["following"]
        );
        assert_eq!(f["basis"], "windows", "{f}");
        assert_eq!(x["basis"], "counted", "{x}");
        if f["windows"].as_u64().is_none_or(|n| n < 2)
            || f["age_seconds"].as_f64().is_none_or(|a| a >= 20.0)
        {
            failures.push(format!(
                "{name}: figures from fewer than 2 windows, or stale: {f}"
            ));
        }
        assert!(
            metrics.contains("# TYPE health_agent_web_requests_per_second gauge")
                && metrics.contains("health_agent_web_figures_windows{basis=\"windows\"}"),
            "{metrics}"
        );
        // The histogram counts every answer the windows counted since the start: at least
        // those of the latest window.
        let counted = gauge(&metrics, "health_agent_web_latency_seconds_count");
        let in_window = f["latency"]["samples"].as_f64();
        assert!(
            metrics.contains("# TYPE health_agent_web_latency_seconds histogram")
                && counted
                    .zip(in_window)
                    .is_some_and(|(c, w)| c >= w && w > 0.0),
            "histogram count {counted:?} against {in_window:?} in the window: {metrics}"
        );
        assert!(
            !metrics.contains("health_agent_web_connections_established_total"),
            "counters that restart at each attach are not exported: {metrics}"
        );
        assert_eq!(
            stats.answers(),
            stats.by_status.get(&200).copied().unwrap_or(0)
        );
        // The load is known: the rate sent, and the workers' busy share (rate × time taken,
        // over the threads). The latency is what the counting agent counted.
        let rate = stats.offered_rate();
        let busy = rate * stats.mean_latency().expect("answers").as_secs_f64() / THREADS as f64;
        let p99 = |v: &Value| v["latency"]["p99_ms"].as_f64();
        let p50 = |v: &Value| v["latency"]["p50_ms"].as_f64();
        let checks = [
            ("requests/s", rate, f["requests_per_second"].as_f64()),
            (
                "requests/s in /metrics",
                rate,
                gauge(&metrics, "health_agent_web_requests_per_second "),
            ),
            ("latency p50 ms", p50(x).unwrap_or(f64::NAN), p50(f)),
            ("latency p99 ms", p99(x).unwrap_or(f64::NAN), p99(f)),
            ("web part", busy, s["parts"]["web"].as_f64()),
            (
                "web part in /metrics",
                busy,
                gauge(&metrics, "health_agent_saturation_web_ratio "),
            ),
        ];
        for (what, want, got) in checks {
            let off = got.map_or(f64::NAN, |g| (g - want).abs() / want);
            println!(
                "  {what}: {got:?} against {want:.3} ({:.1} % off)",
                off * 100.0
            );
            // A latency percentile is read off the kernel's histogram, two buckets per power of
            // two: a p99 near a bucket's edge reads as one bucket or the next (20.48 or 28.67
            // ms), up to 1.5× apart, from one window to another. Its resolution is one bucket.
            let latency = what.starts_with("latency");
            let one_bucket = got.is_some_and(|g| g.max(want) / g.min(want) <= 1.5);
            if off.is_nan() || (off > 0.15 && !(latency && one_bucket)) {
                failures.push(format!("{name}: {what} {got:?} against {want:.3}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{failures:#?}\nagent log:\n{}",
        agent.logs()
    );
}
