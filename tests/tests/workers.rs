//! One stuck worker of a pre-fork server, against Debian's Puma in cluster mode (`-w 2 -t
//! 2:2`) under four looping clients: a worker stopped with SIGSTOP, or deadlocked (every
//! request it takes blocks forever), is named (`partial_hang`, its pid), replaced (the agent
//! stops it, Puma's master forks a new one) and the instance is `healthy` again — 200 on every
//! answer meanwhile. With `heal.replace_workers = false` it is named and left alone; a Puma
//! in single mode (no master) keeps the hang rules.
//!
//! Every test records every `/health` answer of the run ([`HealthPoller`]) and asserts over
//! all of them.

use std::time::{Duration, Instant};

use health_agent_tests::{
    merge_toml,
    puma::{context, wait},
    require_root, timeline, Agent, HealthPoller, HealthSample, Load, LoadStats, Puma, PumaOptions,
};
use serde_json::Value;

/// Agent start to a first verdict.
const WAIT: Duration = Duration::from_secs(30);

/// The web check on Puma's port, probing `/up`, the CPU/memory scaling thresholds out of the
/// way (parallel tests load the machine), `extra` merged in.
fn config(port: u16, extra: &str) -> String {
    let base = format!(
        "[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n\
         [web]\nport = {port}\nprobe_path = \"/up\"\nprobe_timeout = \"2s\"\n\
         [scaling]\ncpu_high_percent = 100.0\nmemory_high_percent = 100.0\n\
         cpu_low_percent = 0.0\nmemory_low_percent = 0.0\nup_at = 10.0\ndown_at = 0.0\n"
    );
    merge_toml(&base, extra)
}

/// `-w 2 -t 2:2`, `GET /slow` taking 0.1 s: under four clients each worker holds requests
/// most of the time, as an application server's do (a worker stopped while idle holds nothing:
/// its sibling takes every connection, nobody waits, and nothing is stuck to name).
fn cluster(block_file: Option<std::path::PathBuf>) -> Puma {
    let puma = Puma::start(PumaOptions {
        threads: 2,
        workers: 2,
        slow_seconds: 0.1,
        block_file,
        ..Default::default()
    });
    puma.wait_for_workers(2, Duration::from_secs(30));
    puma
}

/// Four clients looping `GET /slow`, each request on a new connection, 5 s timeout.
fn four_clients(port: u16) -> Load {
    Load::new_connections(
        port,
        "/slow",
        4,
        Duration::from_millis(20),
        Duration::from_secs(5),
    )
}

/// The worker a `partial_hang` answer names.
fn named(s: &HealthSample) -> Option<u64> {
    (s.webserver == "partial_hang")
        .then(|| s.web()["stuck_worker"]["pid"].as_u64())
        .flatten()
}

/// Whether this answer shows the verdict named `pid`: it says `partial_hang` naming it, or a
/// worker replacement already logged the verdict naming it (a replacement can be over between
/// two polls, 200 ms apart).
fn shows_named(s: &HealthSample, pid: u32) -> bool {
    named(s) == Some(u64::from(pid))
        || replacements(s).iter().any(|a| {
            a["reason"].as_str().is_some_and(|r| {
                r.contains("partially hung") && r.contains(&format!("process {pid} ("))
            })
        })
}

/// The heal attempts that replace a worker.
fn replacements(s: &HealthSample) -> Vec<Value> {
    s.body["details"]["heal"]["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|a| {
                    a["action"]
                        .as_str()
                        .is_some_and(|x| x.starts_with("replace worker"))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A worker stuck one way or another: named within `name_within` of `stuck_at`, replaced
/// within 5 s of being named, a new worker under the same master, `healthy` again; 200 on
/// every answer, `stable` whenever it is `partial_hang`, and the clients lose at most the
/// requests the stuck worker held.
fn named_replaced_healthy(
    puma: &Puma,
    agent: &Agent,
    poller: &HealthPoller,
    load: Load,
    stuck: u32,
    stuck_at: Duration,
    name_within: Duration,
) {
    let master = puma.pid();
    let before = puma.worker_pids();
    let seen = wait(
        poller,
        agent,
        puma,
        name_within + Duration::from_secs(2),
        "partial_hang naming the stuck worker",
        |s| shows_named(s, stuck),
    );
    let named_in = seen.at.saturating_sub(stuck_at);
    let reason = match named(&seen) {
        Some(_) => seen.web()["detail"].clone(),
        None => replacements(&seen)
            .last()
            .map(|a| a["reason"].clone())
            .unwrap_or_default(),
    };
    println!(
        "stuck → partial_hang naming {stuck} in {:.1}s: {reason}",
        secs(named_in)
    );

    let replaced = wait(
        poller,
        agent,
        puma,
        Duration::from_secs(10),
        "the worker replaced",
        |s| {
            replacements(s).iter().any(|a| {
                matches!(a["outcome"].as_str(), Some("waiting" | "recovered"))
                    && a["output"]
                        .as_str()
                        .is_some_and(|o| o.contains(&format!("worker {stuck} ")))
            })
        },
    );
    let replaced_in = replaced.at.saturating_sub(seen.at);
    let attempt = replacements(&replaced)
        .into_iter()
        .last()
        .unwrap_or_default();
    println!(
        "named → replaced in {:.1}s: {} ({})",
        secs(replaced_in),
        attempt["output"],
        attempt["action"]
    );
    let after = puma.worker_pids();
    let healthy = wait(
        poller,
        agent,
        puma,
        Duration::from_secs(15),
        "healthy again",
        |s| s.code == 200 && s.status == "healthy" && s.webserver == "up",
    );
    println!(
        "replaced → healthy in {:.1}s; workers {before:?} → {after:?}",
        secs(healthy.at.saturating_sub(replaced.at))
    );
    let stats: LoadStats = load.stop();
    let samples: Vec<HealthSample> = poller
        .samples()
        .into_iter()
        .filter(|s| s.at >= stuck_at)
        .collect();
    let ctx = context(agent, puma, &samples, &stats.to_string());
    println!("load: {stats}\n{}", timeline(&samples));

    assert!(named_in <= name_within, "named after {named_in:?}{ctx}");
    assert!(
        replaced_in <= Duration::from_secs(5),
        "replaced after {replaced_in:?}{ctx}"
    );
    for s in &samples {
        assert_eq!(s.code, 200, "every answer 200: {s}{ctx}");
        if s.webserver == "partial_hang" {
            assert_eq!(
                (s.status.as_str(), s.recommendation.as_str()),
                ("degraded", "stable"),
                "{s}{ctx}"
            );
            let detail = s.web()["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains(&format!("process {stuck} (")) && detail.contains("unanswered"),
                "the reason names the process and what it holds: {detail}{ctx}"
            );
        }
    }
    let output = attempt["output"].as_str().unwrap_or_default();
    assert!(
        output.contains(&format!("master {master} started worker")),
        "{output}{ctx}"
    );
    assert!(
        !after.contains(&stuck),
        "the stuck worker is gone: {after:?}{ctx}"
    );
    assert_eq!(
        after.len(),
        2,
        "Puma's master has two workers again: {after:?}{ctx}"
    );
    assert!(
        after.iter().any(|p| !before.contains(p)),
        "a new worker: {before:?} → {after:?}{ctx}"
    );
    // What the stuck worker held: the most it was seen holding, plus the requests it took
    // between two looks of the agent (one tick each way).
    let held_in_reason =
        |r: &str| -> Option<u64> { r.split("holds ").nth(1)?.split(' ').next()?.parse().ok() };
    let held = samples
        .iter()
        .filter_map(|s| s.web()["stuck_worker"]["unanswered"].as_u64())
        .chain(
            replacements(&healthy)
                .iter()
                .filter_map(|a| held_in_reason(a["reason"].as_str()?)),
        )
        .max()
        .unwrap_or(0);
    let failures = stats.timeouts + stats.errors;
    println!("client failures {failures}, requests the stuck worker was seen holding {held}");
    assert!(
        failures <= held,
        "client failures {failures} > the {held} requests the stuck worker held{ctx}"
    );
    assert!(stats.count(200) >= 20, "the load got too few answers{ctx}");
    let attempts = healthy.body["details"]["heal"]["total_attempts"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(attempts, 1, "one replacement, no restart{ctx}");
}

#[test]
fn stopped_puma_worker_is_named_and_replaced_never_503() {
    require_root();
    let puma = cluster(None);
    let agent = Agent::start(&config(puma.port, ""));
    let poller = HealthPoller::start(agent.port);
    let load = four_clients(puma.port);
    wait(&poller, &agent, &puma, WAIT, "healthy under traffic", |s| {
        s.code == 200 && s.status == "healthy" && s.webserver == "up"
    });
    // Let the load settle on both workers.
    std::thread::sleep(Duration::from_secs(1));
    let stuck = puma.worker_pids()[0];
    // SAFETY: signalling a child of our own child.
    unsafe { libc::kill(stuck as i32, libc::SIGSTOP) };
    let stuck_at = poller.elapsed();
    named_replaced_healthy(
        &puma,
        &agent,
        &poller,
        load,
        stuck,
        stuck_at,
        Duration::from_secs(3),
    );
}

/// Not stopped: every request the worker takes blocks in the app forever, with no CPU. That
/// takes `web.unanswered_after` to tell from slow requests (here 2 s).
#[test]
fn deadlocked_puma_worker_is_named_and_replaced_never_503() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let block = dir.path().join("block");
    let puma = cluster(Some(block.clone()));
    let agent = Agent::start(&config(puma.port, "[web]\nunanswered_after = \"2s\"\n"));
    let poller = HealthPoller::start(agent.port);
    let load = four_clients(puma.port);
    wait(&poller, &agent, &puma, WAIT, "healthy under traffic", |s| {
        s.code == 200 && s.status == "healthy" && s.webserver == "up"
    });
    std::thread::sleep(Duration::from_secs(1));
    let stuck = puma.worker_pids()[0];
    std::fs::write(&block, format!("{stuck}\n")).expect("writing the block file");
    let stuck_at = poller.elapsed();
    named_replaced_healthy(
        &puma,
        &agent,
        &poller,
        load,
        stuck,
        stuck_at,
        // unanswered_after, a second of CPU samples, and a tick or two.
        Duration::from_millis(3500),
    );
}

/// `heal.replace_workers = false`: the stuck worker is named, 200 `degraded` `stable`, and
/// left alone — no replacement, no restart, never a 503.
#[test]
fn with_replace_workers_off_a_stopped_worker_is_named_and_left_alone() {
    require_root();
    let puma = cluster(None);
    let agent = Agent::start(&config(puma.port, "[heal]\nreplace_workers = false\n"));
    let poller = HealthPoller::start(agent.port);
    let load = four_clients(puma.port);
    wait(&poller, &agent, &puma, WAIT, "healthy under traffic", |s| {
        s.code == 200 && s.status == "healthy" && s.webserver == "up"
    });
    let stuck = puma.worker_pids()[0];
    // SAFETY: signalling a child of our own child.
    unsafe { libc::kill(stuck as i32, libc::SIGSTOP) };
    let stuck_at = poller.elapsed();
    let seen = wait(
        &poller,
        &agent,
        &puma,
        Duration::from_secs(5),
        "partial_hang naming the stopped worker",
        |s| named(s) == Some(u64::from(stuck)),
    );
    println!(
        "SIGSTOP → partial_hang in {:.1}s",
        secs(seen.at.saturating_sub(stuck_at))
    );
    std::thread::sleep(Duration::from_secs(6));
    let workers = puma.worker_pids();
    // SAFETY: as above.
    unsafe { libc::kill(stuck as i32, libc::SIGCONT) };
    let stats = load.stop();
    let samples: Vec<HealthSample> = poller
        .stop()
        .into_iter()
        .filter(|s| s.at >= stuck_at)
        .collect();
    let ctx = context(&agent, &puma, &samples, &stats.to_string());
    println!("load: {stats}\n{}", timeline(&samples));
    assert!(workers.contains(&stuck), "left alone: {workers:?}{ctx}");
    for s in &samples {
        assert_eq!(s.code, 200, "{s}{ctx}");
        assert_eq!(
            s.body["details"]["heal"]["total_attempts"].as_u64(),
            Some(0),
            "no replacement, no restart: {s}{ctx}"
        );
    }
    let last = samples.last().expect("answers");
    assert_eq!(
        (
            last.webserver.as_str(),
            last.status.as_str(),
            last.recommendation.as_str()
        ),
        ("partial_hang", "degraded", "stable"),
        "still named after 6 s{ctx}"
    );
}

/// Single mode: one process, no master. Stopped under traffic it is `hung`, the restart
/// command runs, and once that did not help it is 503, as before; nothing is "replaced".
/// (`heal.timeout` 2 s: the restart command only counts, it restarts nothing.)
#[test]
fn stopped_single_mode_puma_keeps_the_hang_rules() {
    require_root();
    let puma = Puma::start(PumaOptions {
        threads: 2,
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let restarts = dir.path().join("restarts");
    let agent = Agent::start(&config(
        puma.port,
        &format!(
            "[web]\nrestart_command = {:?}\n[heal]\ntimeout = \"2s\"\n",
            format!("echo restart >> '{}'", restarts.display())
        ),
    ));
    let poller = HealthPoller::start(agent.port);
    let load = four_clients(puma.port);
    wait(&poller, &agent, &puma, WAIT, "healthy under traffic", |s| {
        s.code == 200 && s.status == "healthy" && s.webserver == "up"
    });
    puma.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let hung = wait(
        &poller,
        &agent,
        &puma,
        Duration::from_secs(10),
        "hung, then 503 once the restart did not help",
        |s| s.code == 503 && s.webserver == "hung",
    );
    println!("SIGSTOP → 503 hung in {:.1}s", secs(stopped.elapsed()));
    puma.signal(libc::SIGCONT);
    let stats = load.stop();
    let samples = poller.stop();
    let ctx = context(&agent, &puma, &samples, &stats.to_string());
    assert!(
        samples.iter().all(|s| s.webserver != "partial_hang"),
        "one process is never a partial hang{ctx}"
    );
    assert!(
        samples.iter().all(|s| replacements(s).is_empty()),
        "no worker replacement without a master{ctx}"
    );
    let ran = std::fs::read_to_string(&restarts).unwrap_or_default();
    assert!(ran.lines().count() >= 1, "the restart command ran{ctx}");
    assert!(
        hung.body["details"]["heal"]["attempts"][0]["action"]
            .as_str()
            .is_some_and(|a| a.starts_with("restart_command")),
        "{hung}{ctx}"
    );
}
