//! One stuck worker of a pre-fork server, against Debian's Puma in cluster mode (`-w 2 -t
//! 2:2`) under four looping clients: a worker stopped with SIGSTOP, or deadlocked (every
//! request it takes blocks forever), is named (`partial_hang`, its pid), replaced (the agent
//! stops it, Puma's master forks a new one) and the instance is `healthy` again — 200 on every
//! answer meanwhile. So is a worker stopped while it holds nothing, under light traffic its
//! sibling takes alone: its half of the capacity is gone all the same. With `heal.replace_workers = false` it is named and left alone; a Puma
//! in single mode (no master) keeps the hang rules.
//!
//! Every test records every `/health` answer of the run ([`health_agent_tests::Watched`]) and asserts over
//! all of them.

use std::time::Duration;

use health_agent_tests::{
    require_root, web_config, HealthSample, Load, Puma, PumaOptions, Restarts, Watch, Watched,
};
use serde_json::Value;

/// `-w 2 -t 2:2`, `GET /slow` taking 0.1 s: under four clients each worker holds requests
/// most of the time, as an application server's do.
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

/// `puma` watched by an agent of [`web_config`] with `extra`, healthy under [`four_clients`].
fn watched_under_load(puma: Puma, extra: &str) -> (Watched, Load) {
    let w = Watched::new(puma, |puma| web_config(puma.port, extra));
    let load = four_clients(w.puma.port);
    w.wait_healthy();
    (w, load)
}

/// Four clients looping `GET /slow`, each request on a new connection, 5 s timeout.
fn four_clients(port: u16) -> Load {
    let (pause, timeout) = (Duration::from_millis(20), Duration::from_secs(5));
    Load::new_connections(port, "/slow", 4, pause, timeout)
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
    w: &Watched,
    load: Load,
    stuck: u32,
    stuck_at: Duration,
    name_within: Duration,
) {
    let master = w.puma.pid();
    let before = w.puma.worker_pids();
    let seen = w.wait(
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

    let replaced = w.wait(Duration::from_secs(10), "the worker replaced", |s| {
        replacements(s).iter().any(|a| {
            matches!(a["outcome"].as_str(), Some("waiting" | "recovered"))
                && a["output"]
                    .as_str()
                    .is_some_and(|o| o.contains(&format!("worker {stuck} ")))
        })
    });
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
    let after = w.puma.worker_pids();
    let healthy = w.wait(Duration::from_secs(15), "healthy again", |s| {
        s.code == 200 && s.status == "healthy" && s.webserver == "up"
    });
    println!(
        "replaced → healthy in {:.1}s; workers {before:?} → {after:?}",
        secs(healthy.at.saturating_sub(replaced.at))
    );
    let (samples, stats, ctx) = w.finish(load, stuck_at);

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
                detail.contains(&format!("process {stuck} ("))
                    && (detail.contains("unanswered") || detail.contains("holding no request")),
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
    let (w, load) = watched_under_load(cluster(None), "");
    // Let the load settle on both workers.
    std::thread::sleep(Duration::from_secs(1));
    let stuck = w.puma.worker_pids()[0];
    // SAFETY: signalling a child of our own child.
    unsafe { libc::kill(stuck as i32, libc::SIGSTOP) };
    let stuck_at = w.poller.elapsed();
    named_replaced_healthy(&w, load, stuck, stuck_at, Duration::from_secs(3));
}

/// A worker stopped while it holds nothing: light traffic (one client, a fast page every
/// 200 ms) that its sibling takes alone, so nothing waits. Half the capacity is gone all the
/// same: named with its share, replaced, healthy again, 200 throughout, in both
/// `socket_tracing` modes.
#[test]
fn worker_stopped_while_idle_is_named_with_its_share_and_replaced() {
    require_root();
    for mode in ["on_suspicion", "always"] {
        let puma = cluster(None);
        let w = Watched::new(puma, |puma| {
            web_config(puma.port, &format!("[web]\nsocket_tracing = \"{mode}\"\n"))
        });
        let load = Load::new_connections(
            w.puma.port,
            "/",
            1,
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        w.wait_healthy();
        // Time for the load to get answers, through the counting windows' first round.
        std::thread::sleep(Duration::from_secs(4));
        let stuck = w.puma.worker_pids()[0];
        // SAFETY: signalling a child of our own child.
        unsafe { libc::kill(stuck as i32, libc::SIGSTOP) };
        let stuck_at = w.poller.elapsed();
        println!("socket_tracing = {mode}: worker {stuck} stopped");
        named_replaced_healthy(&w, load, stuck, stuck_at, Duration::from_secs(5));
        let reasons: Vec<String> = w
            .answers_since(stuck_at)
            .iter()
            .flat_map(|s| {
                let mut r: Vec<String> = replacements(s)
                    .iter()
                    .filter_map(|a| a["reason"].as_str().map(str::to_string))
                    .collect();
                r.extend(named(s).and(s.web()["detail"].as_str().map(str::to_string)));
                r
            })
            .collect();
        assert!(
            reasons.iter().any(|r| r.contains("holding no request")
                && r.contains("1 of 2 workers: 50% of the capacity gone")),
            "{mode}: the reason says the capacity it takes away: {reasons:?}"
        );
    }
}

/// Not stopped: every request the worker takes blocks in the app forever, with no CPU. That
/// takes `web.unanswered_after` to tell from slow requests (here 2 s).
#[test]
fn deadlocked_puma_worker_is_named_and_replaced_never_503() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let block = dir.path().join("block");
    let (w, load) = watched_under_load(
        cluster(Some(block.clone())),
        "[web]\nunanswered_after = \"2s\"\n",
    );
    std::thread::sleep(Duration::from_secs(1));
    let stuck = w.puma.worker_pids()[0];
    std::fs::write(&block, format!("{stuck}\n")).expect("writing the block file");
    let stuck_at = w.poller.elapsed();
    // unanswered_after, a second of CPU samples, and a tick or two.
    named_replaced_healthy(&w, load, stuck, stuck_at, Duration::from_millis(3500));
}

/// `heal.replace_workers = false`: the stuck worker is named, 200 `degraded` `stable`, and
/// left alone — no replacement, no restart, never a 503.
#[test]
fn with_replace_workers_off_a_stopped_worker_is_named_and_left_alone() {
    require_root();
    let (w, load) = watched_under_load(cluster(None), "[heal]\nreplace_workers = false\n");
    let stuck = w.puma.worker_pids()[0];
    // SAFETY: signalling a child of our own child.
    unsafe { libc::kill(stuck as i32, libc::SIGSTOP) };
    let stuck_at = w.poller.elapsed();
    let seen = w.wait(
        Duration::from_secs(5),
        "partial_hang naming the worker",
        |s| named(s) == Some(u64::from(stuck)),
    );
    println!(
        "SIGSTOP → partial_hang in {:.1}s",
        secs(seen.at.saturating_sub(stuck_at))
    );
    std::thread::sleep(Duration::from_secs(6));
    let workers = w.puma.worker_pids();
    // SAFETY: as above.
    unsafe { libc::kill(stuck as i32, libc::SIGCONT) };
    let (samples, _, ctx) = w.finish(load, stuck_at);
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
    let puma = Puma::start(PumaOptions::threads(2));
    let restarts = Restarts::new();
    let extra = format!(
        "[web]\nrestart_command = {:?}\n[heal]\ntimeout = \"2s\"\n",
        restarts.command()
    );
    let (w, load) = watched_under_load(puma, &extra);
    let stopped = w.freeze();
    let hung = w.wait(Duration::from_secs(10), "hung, then 503", |s| {
        s.code == 503 && s.webserver == "hung"
    });
    println!("SIGSTOP → 503 hung in {:.1}s", hung.after(stopped));
    w.thaw();
    let (samples, _, ctx) = w.finish(load, Duration::ZERO);
    assert!(
        samples.iter().all(|s| s.webserver != "partial_hang"),
        "one process is never a partial hang{ctx}"
    );
    assert!(
        samples.iter().all(|s| replacements(s).is_empty()),
        "no worker replacement without a master{ctx}"
    );
    assert!(restarts.count() >= 1, "the restart command ran{ctx}");
    assert!(
        hung.body["details"]["heal"]["attempts"][0]["action"]
            .as_str()
            .is_some_and(|a| a.starts_with("restart_command")),
        "{hung}{ctx}"
    );
}
