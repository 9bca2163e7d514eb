//! The agent binary end to end: disk thresholds on a real tmpfs, a real listener going away,
//! the kernel counting handshakes, the CLI's exit codes and errors, graceful shutdown.

use std::{net::TcpListener, process::Command, time::Duration};

use health_agent_tests::{
    agent_binary, check_json, counters, free_port, requests, require_root, watched_fixture, Agent,
    Fixture, Tmpfs,
};

const WAIT: Duration = Duration::from_secs(15);

#[test]
fn full_disk_turns_503_with_reason_then_200_after_cleanup() {
    require_root();
    let fs = Tmpfs::mount("4m");
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"200ms\"\nrecover_after = \"1s\"\n[disk]\npaths = [{:?}]\n",
        fs.path.display().to_string()
    ));
    let (code, body) = agent.wait_health(WAIT, "the disk checked", |_, b| {
        b["checks"]["disk"] != "unknown"
    });
    assert_eq!(body["checks"]["disk"], "ok", "{body}");
    assert_eq!(code, 200, "{body}");

    // 3.7 MiB of 4 MiB: past the 90 % fail threshold. Wait for the disk verdict, then check
    // that it is what turns the answer into a 503.
    let big = fs.path.join("fill");
    std::fs::write(&big, vec![0u8; 3_800_000]).expect("filling tmpfs");
    let (code, body) = agent.wait_health(WAIT, "the disk critical", |_, b| {
        b["checks"]["disk"] == "critical"
    });
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "unhealthy");
    let reasons = body["reasons"].to_string();
    assert!(reasons.contains("disk"), "the 503 says why: {reasons}");
    let used = body["details"]["disk"]["mounts"][0]["used_percent"]
        .as_f64()
        .unwrap();
    assert!(used >= 90.0, "used {used}");

    std::fs::remove_file(&big).expect("removing the file");
    let (code, body) = agent.wait_health(WAIT, "200 after the file is removed", |c, b| {
        c == 200 && b["checks"]["disk"] == "ok"
    });
    assert_eq!(code, 200, "{body}");
    // No web port and no containers: nothing else is watched, so `degraded` for that alone,
    // never `healthy`.
    assert_eq!(body["status"], "degraded", "{body}");
    let reasons = body["reasons"].as_array().expect("reasons");
    assert!(
        reasons.len() == 1 && reasons[0].as_str().unwrap_or("").contains("web.port is 0"),
        "only the nothing-watched reason is left: {body}"
    );
}

#[test]
fn disk_between_warn_and_fail_is_200_degraded() {
    require_root();
    let fs = Tmpfs::mount("4m");
    std::fs::write(fs.path.join("fill"), vec![0u8; 3_500_000]).unwrap(); // ~83 %
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"200ms\"\n[disk]\npaths = [{:?}]\n",
        fs.path.display().to_string()
    ));
    let (code, body) = agent.wait_health(WAIT, "degraded", |_, b| b["checks"]["disk"] == "warning");
    assert_eq!(body["status"], "degraded");
    assert_eq!(code, 200);
    assert_eq!(body["checks"]["disk"], "warning");
    assert_eq!(body["recommendation"], "stable");
}

#[test]
fn closed_listener_turns_503_webserver_down() {
    require_root();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let agent = Agent::start(&format!("[web]\nport = {port}\nprobe_path = \"\"\n"));
    let (code, body) = agent.wait_health(WAIT, "a listener seen", |_, b| {
        b["details"]["web"]["listening"] == true
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["details"]["web"]["pids"][0],
        std::process::id(),
        "owner pid found"
    );

    drop(listener);
    let (code, body) =
        agent.wait_health(WAIT, "the web server down once nothing listens", |_, b| {
            b["checks"]["webserver"] == "down"
        });
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "unhealthy");
    assert!(
        body["reasons"].to_string().contains("web backend down"),
        "{body}"
    );
}

#[test]
fn kernel_counts_every_handshake_on_the_web_port() {
    require_root();
    // No probe: the only connections are the test's. Exact counts: counted all along.
    let (backend, agent) =
        watched_fixture("[web]\nprobe_path = \"\"\nsocket_tracing = \"always\"\n");
    let (_, body) = agent.health();
    assert_eq!(
        body["details"]["web"]["kernel"]["state"], "active",
        "{body}"
    );

    const N: usize = 37;
    assert_eq!(requests(backend.port, N, "/"), N);
    // Traffic to another port must not count.
    let other = Fixture::start("normal");
    assert_eq!(requests(other.port, 5, "/"), 5);

    let (_, body) = agent.wait_health(WAIT, "N answered", |_, b| {
        counters(b)["answered"] == N as u64
    });
    let c = counters(&body);
    assert_eq!(c["established"], N as u64, "{c}");
    assert_eq!(c["claimed"], N as u64, "{c}");
    // A healthy server claims its connections at once: accept() is not traced (that would
    // slow every syscall on the host), so the count stays 0 by design.
    assert_eq!(c["accepts_traced"], false, "{c}");
    assert_eq!(c["accepted"], 0, "{c}");
    assert_eq!(c["requests"], N as u64, "{c}");
    assert_eq!(c["answered"], N as u64, "{c}");
    assert!(c["latency"]["samples"].as_u64().unwrap() >= N as u64, "{c}");
    assert_eq!(body["checks"]["webserver"], "up");
}

#[test]
fn sigterm_stops_the_agent_cleanly() {
    require_root();
    let (_backend, agent) = watched_fixture("");
    let status = agent.stop();
    assert!(status.success(), "exit status {status}");
}

#[test]
fn config_validate_names_key_and_line_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[web]\nport = 9000\nhung_aftr = \"2s\"\n").unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--validate"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("hung_aftr") && err.contains("hung_after"),
        "{err}"
    );

    let good = dir.path().join("good.toml");
    let dump = Command::new(agent_binary())
        .args(["config", "--dump"])
        .output()
        .unwrap();
    assert!(dump.status.success());
    std::fs::write(&good, &dump.stdout).unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--validate"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the dumped default validates: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(agent_binary())
        .args(["--config", "/nonexistent/health-agent.toml", "check"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing non-default config is an error"
    );
}

#[test]
fn check_exit_codes_follow_the_verdict() {
    let port = free_port();
    // Nothing listens on `port`: unhealthy, exit 1.
    let (code, v) = check_json(&format!("[web]\nport = {port}\nprobe_path = \"\"\n"));
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["status"], "unhealthy");
    assert_eq!(v["details"]["web"]["verdict"], "down");

    let backend = Fixture::start("normal");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("[web]\nport = {}\n", backend.port)).unwrap();
    let out = Command::new(agent_binary())
        .arg("--config")
        .arg(&cfg)
        .arg("check")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(table.contains("webserver       up"), "{table}");
}
