//! The database check and alerting end to end: a private real PostgreSQL stopped and started
//! under the agent, local receivers standing in for Slack, PagerDuty, GitHub and a webhook
//! (payloads in those services' documented formats), the fleet-safety guard, flap damping.

use std::time::Duration;

use health_agent_tests::{require_root, Agent, AlertReceivers, Fixture, Postgres, Tmpfs};

const WAIT: Duration = Duration::from_secs(40);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    health_agent_tests::wait_until(WAIT, what, f)
}

#[test]
fn database_down_is_200_degraded_with_one_alert_each_then_resolved() {
    require_root();
    let pg = Postgres::start();
    let rx = AlertReceivers::start();
    // A watched backend: with nothing watched (no web port, no containers) the agent never
    // says `healthy`.
    let backend = Fixture::start("normal");
    let agent = Agent::start_with_env(
        &format!(
            "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\n[database]\nurl = \"{}\"\ninterval = \"1s\"\ntimeout = \"1s\"\nfail_after = 2\n{}",
            backend.port,
            pg.url(),
            rx.config("resolve_after = \"3s\"\n")
        ),
        &[("PGPASSWORD", pg.password.as_str()), ("GITHUB_TOKEN", "ghp_testtoken123")],
    );
    let (_, body) = agent.wait_health(WAIT, "database connected", |c, b| {
        c == 200 && b["checks"]["database"] == "connected"
    });
    assert_eq!(body["status"], "healthy");

    pg.stop();
    let (code, body) = agent.wait_health(WAIT, "database unreachable", |_, b| {
        b["checks"]["database"] == "unreachable"
    });
    assert_eq!(code, 200, "a shared dependency never makes a 503: {body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["recommendation"], "infrastructure_issue");
    let text = body.to_string() + &agent.logs();
    assert!(
        !text.contains(&pg.password),
        "the database password leaked into /health or the log"
    );
    assert!(
        !text.contains("XXXXSECRET") && !text.contains("R0UT1NGKEY"),
        "an alert secret leaked"
    );

    // One payload each, in the documented formats.
    let pd = wait_for("the PagerDuty trigger", || {
        rx.pagerduty.posts().first().cloned()
    });
    assert_eq!(pd.path, "/v2/enqueue");
    assert_eq!(pd.body["routing_key"], "R0UT1NGKEY0123456789abcdefABCDEF");
    assert_eq!(pd.body["event_action"], "trigger");
    let dedup = pd.body["dedup_key"]
        .as_str()
        .expect("dedup_key")
        .to_string();
    assert!(dedup.contains("infrastructure_issue"), "{dedup}");
    assert!(pd.body["payload"]["summary"].as_str().unwrap().len() <= 1024);
    assert!(pd.body["payload"]["source"].is_string());
    assert_eq!(pd.body["payload"]["severity"], "warning");

    let slack = wait_for("the Slack message", || rx.slack.posts().first().cloned());
    assert_eq!(slack.path, "/services/T000/B000/XXXXSECRET");
    assert!(slack
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json"));
    assert!(
        slack.body["text"]
            .as_str()
            .unwrap()
            .contains("infrastructure_issue"),
        "{}",
        slack.body
    );

    let hook = wait_for("the webhook", || rx.webhook.posts().first().cloned());
    for k in ["event", "timestamp", "hostname", "payload"] {
        assert!(
            hook.body.get(k).is_some(),
            "webhook field {k}: {}",
            hook.body
        );
    }

    let issue = wait_for("the GitHub issue", || {
        rx.github
            .posts()
            .into_iter()
            .find(|r| r.path == "/repos/acme/shop/issues")
    });
    assert_eq!(
        issue.header("authorization"),
        Some("Bearer ghp_testtoken123")
    );
    assert_eq!(issue.header("accept"), Some("application/vnd.github+json"));
    assert!(issue.body["title"].is_string());
    let labels = issue.body["labels"].to_string();
    assert!(
        labels.contains("incident") && labels.contains("p3"),
        "{labels}"
    );
    let report = issue.body["body"].as_str().unwrap();
    assert!(
        report.contains("fingerprint") && report.contains("database"),
        "{report}"
    );
    assert!(
        !report.contains(&pg.password),
        "the incident report carries no password"
    );

    // Exactly one of each so far.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(rx.pagerduty.posts().len(), 1);
    assert_eq!(rx.slack.posts().len(), 1);
    assert_eq!(rx.webhook.posts().len(), 1);

    pg.resume();
    agent.wait_health(WAIT, "database connected again", |c, b| {
        c == 200 && b["checks"]["database"] == "connected"
    });
    let resolve = wait_for("the PagerDuty resolve", || {
        rx.pagerduty.posts().get(1).cloned()
    });
    assert_eq!(resolve.body["event_action"], "resolve");
    assert_eq!(
        resolve.body["dedup_key"],
        dedup.as_str(),
        "the same dedup_key closes the alert"
    );
    let resolved = wait_for("the Slack resolved message", || {
        rx.slack.posts().get(1).cloned()
    });
    assert!(
        resolved.body["text"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("resolved"),
        "{}",
        resolved.body
    );
    let comment = wait_for("the GitHub comment", || {
        rx.github
            .posts()
            .into_iter()
            .find(|r| r.path.ends_with("/comments"))
    });
    assert_eq!(
        comment.path, "/repos/acme/shop/issues/1/comments",
        "a comment on the incident's issue"
    );
    assert_eq!(
        rx.github
            .posts()
            .iter()
            .filter(|r| r.path == "/repos/acme/shop/issues")
            .count(),
        1,
        "no second issue"
    );
}

#[test]
fn hung_backend_while_database_down_is_200_infrastructure_issue_without_restart() {
    require_root();
    let backend = Fixture::start("normal");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("restarted");
    // A database nobody serves: unreachable from the start.
    let dead_db = health_agent_tests::free_port();
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\nhung_after = \"2s\"\nrestart_command = \"touch {}\"\n\
         [database]\nurl = \"postgres://app@127.0.0.1:{dead_db}/app\"\ninterval = \"500ms\"\ntimeout = \"500ms\"\nfail_after = 1\n",
        backend.port,
        marker.display()
    ));
    // Seen serving first: a backend that never served is out of rotation whatever the
    // database says.
    agent.wait_health(
        WAIT,
        "database unreachable, the backend seen serving",
        |_, b| b["checks"]["database"] == "unreachable" && b["details"]["web"]["served"] == true,
    );
    backend.set_mode("stop-accepting");
    let _clients = health_agent_tests::background_requests(backend.port, 4, Duration::from_secs(8));
    let (code, body) = agent.wait_health(WAIT, "guarded hang", |_, b| {
        b["reasons"].to_string().contains("shared dependency")
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["recommendation"], "infrastructure_issue");
    // Hold it for a while: still no restart, still no 503.
    for _ in 0..20 {
        let (code, body) = agent.health();
        assert_eq!(code, 200, "{body}");
        std::thread::sleep(Duration::from_millis(150));
    }
    let (_, body) = agent.health();
    assert_eq!(body["details"]["heal"]["total_attempts"], 0);
    assert!(
        !marker.exists(),
        "no restart attempted for a shared-dependency hang"
    );
}

#[test]
fn ten_flaps_in_a_minute_are_one_incident() {
    require_root();
    let fs = Tmpfs::mount("4m");
    let rx = AlertReceivers::start();
    let agent = Agent::start_with_env(
        &format!(
            "[checks]\ninterval = \"100ms\"\nrecover_after = \"0s\"\n[disk]\npaths = [{:?}]\n{}",
            fs.path.display().to_string(),
            rx.config("resolve_after = \"5s\"\n")
        ),
        &[("GITHUB_TOKEN", "ghp_testtoken123")],
    );
    agent.wait_health(WAIT, "healthy", |c, _| c == 200);
    let fill = fs.path.join("fill");
    for _ in 0..10 {
        std::fs::write(&fill, vec![0u8; 3_800_000]).unwrap();
        agent.wait_health(WAIT, "503", |c, _| c == 503);
        std::fs::remove_file(&fill).unwrap();
        agent.wait_health(WAIT, "200", |c, _| c == 200);
    }
    let resolve = wait_for("the single resolve", || {
        rx.pagerduty
            .posts()
            .into_iter()
            .find(|r| r.body["event_action"] == "resolve")
    });
    std::thread::sleep(Duration::from_secs(1));
    let pd = rx.pagerduty.posts();
    let triggers = pd
        .iter()
        .filter(|r| r.body["event_action"] == "trigger")
        .count();
    assert_eq!(triggers, 1, "ten flaps, one incident: {pd:?}");
    assert_eq!(pd.len(), 2, "one trigger and one resolve");
    assert_eq!(resolve.body["dedup_key"], pd[0].body["dedup_key"]);
    assert_eq!(rx.slack.posts().len(), 2);
    let issues = rx
        .github
        .posts()
        .iter()
        .filter(|r| r.path == "/repos/acme/shop/issues")
        .count();
    assert_eq!(issues, 1);
    let issue = &rx.github.posts()[0].body;
    let labels = issue["labels"].to_string();
    // P2 for an unhealthy instance, P1 when the report also lists a suspicious process — as
    // it does when this checkout (and so every binary of the test) lives under /tmp.
    let report = issue["body"].as_str().unwrap_or("");
    let suspicious = report
        .split("### Suspicious processes")
        .nth(1)
        .is_some_and(|section| section.trim_start().starts_with("| pid |"));
    let expected = if suspicious { "p1" } else { "p2" };
    assert!(labels.contains(expected), "expected {expected}: {labels}");
}
