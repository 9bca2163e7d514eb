//! kill -9 of the agent at random moments: mid-restart (its restart command running),
//! mid-drain, mid-alert (a delivery in flight). Each time its BPF programs must leave the
//! kernel with it, nothing may stay pinned, and the next agent on the same config and state
//! file must find consistent state. Run by CI and by `cargo xtask soak` after the soak.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use health_agent_tests::{
    require_root, soak, undrain, web_config, Agent, DrainInBackground, Fixture, Receiver,
};

fn pinned() -> Vec<String> {
    std::fs::read_dir("/sys/fs/bpf")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// kill -9 of the agent mid-restart (its restart command running), mid-drain and mid-alert (a
/// delivery in flight to a stalled receiver), twice each in an order and at moments picked at
/// random: every time its programs leave the kernel with it, nothing new is pinned, and the next
/// agent on the same config finds consistent state (a drain persisted and ended by `undrain`,
/// the alert's incident kept under the same fingerprint, the backend judged afresh).
#[test]
fn kill_9_at_random_moments_leaves_no_program_and_consistent_state() {
    require_root();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() as u64 | 1);
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let backend = Fixture::start("normal");
    let stalled = Arc::new(AtomicBool::new(false));
    let arrived = Arc::new(AtomicUsize::new(0));
    let (st, ar) = (stalled.clone(), arrived.clone());
    let hook = Receiver::start(move |_, _| {
        ar.fetch_add(1, Ordering::SeqCst);
        if st.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_secs(10));
        }
        (200, "{}".into())
    });
    let dead_db = health_agent_tests::free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!(
        "[web]\nrestart_command = \"sleep 4\"\n[heal]\nmax_restarts = 100\n\
         [drain]\nstate_file = \"{}\"\n\
         [database]\nurl = \"postgres://app@127.0.0.1:{dead_db}/app\"\ninterval = \"500ms\"\ntimeout = \"500ms\"\nfail_after = 1\n\
         [alerts]\nwebhook_url = \"{}\"\nresolve_after = \"2s\"\ntimeout = \"30s\"\n",
        dir.path().join("drain.json").display(),
        hook.url("/hook")
    );
    let config = web_config(backend.port, &extra);
    let progs_at_start = soak::prog_count();
    let pinned_at_start = pinned();
    let mut kinds = vec!["restart", "drain", "alert", "restart", "drain", "alert"];
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, next(i as u64 + 1) as usize);
    }
    let mut table = String::from("| kill -9 | at | programs held | released | state found by the next start |\n|---|---|---:|---|---|\n");
    let mut failures = Vec::new();
    for kind in kinds {
        // Stalled from the start: the new agent's first trigger is the delivery in flight.
        stalled.store(kind == "alert", Ordering::SeqCst);
        let n = arrived.load(Ordering::SeqCst);
        let agent = Agent::start_with_env(&config, &[("PGPASSWORD", "x")]);
        agent.wait_health(Duration::from_secs(20), "200 from the backend", |c, b| {
            c == 200 && b["checks"]["webserver"] == "up"
        });
        let fingerprints_before = fingerprints(&hook);
        let delay = Duration::from_millis(100 + next(1500));
        let mut drained = None;
        match kind {
            "restart" => {
                backend.signal(libc::SIGSTOP);
                let _load = health_agent_tests::steady_load(backend.port);
                agent.wait_health(Duration::from_secs(20), "a restart under way", |_, b| {
                    b["status"] == "recovering"
                });
            }
            "drain" => {
                drained = Some(DrainInBackground::start(
                    &agent,
                    Duration::from_secs(30),
                    Duration::from_secs(60),
                ));
                agent.wait_health(Duration::from_secs(10), "draining", |_, b| {
                    b["status"] == "draining"
                });
            }
            _ => {
                health_agent_tests::wait_until(
                    Duration::from_secs(20),
                    "an alert in flight",
                    || (arrived.load(Ordering::SeqCst) > n).then_some(()),
                );
            }
        }
        std::thread::sleep(delay);
        let (progs, _) = soak::bpf_objects(agent.pid());
        agent.signal(libc::SIGKILL);
        if let Some(bg) = drained {
            let _ = bg.stop();
        }
        drop(agent);
        backend.signal(libc::SIGCONT);
        let gone = soak::released(&progs);
        stalled.store(false, Ordering::SeqCst);
        // The next start on the same config and state file.
        let next_agent = Agent::start_with_env(&config, &[("PGPASSWORD", "x")]);
        let found = state_found(
            kind,
            &next_agent,
            &dir.path().join("drain.json"),
            &hook,
            fingerprints_before.len(),
        );
        if !gone || !found.0 {
            failures.push(format!("{kind}: programs released {gone}, {}", found.1));
        }
        table.push_str(&format!(
            "| mid-{kind} | {} ms into it | {} | {} | {} |\n",
            delay.as_millis(),
            progs.len(),
            if gone { "all" } else { "**NO**" },
            found.1
        ));
        drop(next_agent);
    }
    let pinned_at_end = pinned();
    let progs_at_end = soak::prog_count();
    table.push_str(&format!("\nseed {seed}; `bpftool prog show`: {progs_at_start} programs before, {progs_at_end} after (the host's, other processes included); /sys/fs/bpf: {} entries before, {} after\n", pinned_at_start.len(), pinned_at_end.len()));
    println!("{table}");
    if let Ok(path) = std::env::var("HEALTH_AGENT_SOAK_REPORT") {
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push('\n');
        text.push_str(&table);
        let _ = std::fs::write(path, text);
    }
    assert_eq!(
        pinned_at_start, pinned_at_end,
        "a pinned BPF object was left behind"
    );
    assert!(failures.is_empty(), "after kill -9: {failures:?}\n{table}");
}

/// The fingerprints of the incident triggers a webhook stand-in received, in order.
fn fingerprints(hook: &Receiver) -> Vec<String> {
    hook.posts()
        .iter()
        .filter(|r| r.body["event"] == "incident.triggered")
        .filter_map(|r| {
            r.body["payload"]["incident"]["fingerprint"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// What the agent started after the kill finds, by the kind of moment: (consistent, said).
fn state_found(
    kind: &str,
    next_agent: &Agent,
    state_file: &std::path::Path,
    hook: &Receiver,
    before: usize,
) -> (bool, String) {
    match kind {
        "drain" => {
            let (code, body) =
                next_agent.wait_health(Duration::from_secs(10), "an answer", |c, _| c != 0);
            let persisted = code == 503 && body["status"] == "draining";
            let run = undrain(next_agent);
            let (after, _) =
                next_agent.wait_health(Duration::from_secs(15), "200 after undrain", |c, _| {
                    c == 200
                });
            let ok = persisted && run.code == Some(0) && after == 200 && !state_file.exists();
            (ok, format!("came back `draining` (persisted): {persisted}; after undrain {after}, state file removed"))
        }
        "alert" => {
            let seen = health_agent_tests::wait_until(
                Duration::from_secs(20),
                "the incident delivered by the next agent",
                || {
                    let now = fingerprints(hook);
                    (now.len() > before).then_some(now)
                },
            );
            let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
            let ok = distinct.len() == 1;
            (ok, format!("triggers received {}, under {} fingerprint(s): the receiver keeps one incident", seen.len(), distinct.len()))
        }
        _ => {
            let (code, body) = next_agent.wait_health(
                Duration::from_secs(20),
                "the backend judged afresh",
                |c, b| c == 200 && b["checks"]["webserver"] == "up",
            );
            (
                code == 200,
                format!("{code} {}, webserver up", body["status"]),
            )
        }
    }
}
