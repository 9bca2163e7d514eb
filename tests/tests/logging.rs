//! The agent's log lines as a log shipper and the journal read them: with
//! `HEALTH_AGENT_LOG_FORMAT=json` every line is one JSON object (timestamp, level, target,
//! message, fields) and no secret is in any; with `$JOURNAL_STREAM` naming its stderr, as
//! systemd sets it, every line starts with its syslog priority (`<4>` a warning). The journal
//! itself reading them is tests/tests/systemd.rs.

use std::time::Duration;

use health_agent_tests::{free_port, require_root, wait_until, Agent, Receiver};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(40);
const SLACK_PATH: &str = "/services/T000/B000/XXXXSECRET";
const ROUTING_KEY: &str = "R0UT1NGKEY0123456789abcdefABCDEF";
const PASSWORD: &str = "Pw-in-the-URL-4711";

/// Every line of `log` as JSON; panics on the first that is not one object.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {l}\n{log}"));
            assert!(v.is_object(), "not an object: {l}");
            v
        })
        .collect()
}

#[test]
fn json_lines_carry_timestamp_level_target_message_and_fields_and_no_secret() {
    require_root();
    // Slack refuses every message: the agent's error names the destination in a field.
    let slack = Receiver::start(|_, _| (500, "{}".into()));
    let pagerduty = Receiver::start(|_, _| (202, r#"{"status":"success"}"#.into()));
    let dead = free_port();
    let agent = Agent::start_with_env(
        &format!(
            "[checks]\ninterval = \"500ms\"\n\
             [database]\nurl = \"postgres://app:{PASSWORD}@127.0.0.1:{dead}/app\"\ninterval = \"1s\"\n\
             timeout = \"1s\"\nfail_after = 1\n\
             [alerts]\nslack_webhook_url = \"{}\"\npagerduty_routing_key = \"{ROUTING_KEY}\"\n\
             pagerduty_url = \"{}\"\nmax_retries = 0\n",
            slack.url(SLACK_PATH),
            pagerduty.url("/v2/enqueue"),
        ),
        &[("HEALTH_AGENT_LOG_FORMAT", "json")],
    );
    agent.wait_health(WAIT, "the database unreachable", |_, b| {
        b["checks"]["database"] == "unreachable"
    });
    let lines = wait_until(WAIT, "Slack's refusal in the log", || {
        let lines = json_lines(&agent.logs());
        lines
            .iter()
            .any(|l| l["level"] == "ERROR" && l["fields"]["destination"] == "slack")
            .then_some(lines)
    });
    for l in &lines {
        let ts = l["timestamp"].as_str().unwrap_or_default();
        assert!(
            ts.len() >= 20 && ts.as_bytes()[10] == b'T' && ts.ends_with('Z'),
            "timestamp: {l}"
        );
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
                .contains(&l["level"].as_str().unwrap_or("")),
            "level: {l}"
        );
        assert!(
            l["target"].as_str().is_some_and(|t| !t.is_empty()),
            "target: {l}"
        );
        assert!(l["message"].is_string() && l["fields"].is_object(), "{l}");
    }
    let find = |what: &str, pred: &dyn Fn(&Value) -> bool| {
        lines
            .iter()
            .find(|l| pred(l))
            .unwrap_or_else(|| panic!("no {what} line in:\n{}", agent.logs()))
            .clone()
    };
    let warn = find("web.port warning", &|l| {
        l["level"] == "WARN"
            && l["message"]
                .as_str()
                .unwrap_or("")
                .contains("web.port is 0")
    });
    assert_eq!(warn["target"], "health_agent", "{warn}");
    let trigger = find("trigger", &|l| {
        l["level"] == "INFO"
            && l["fields"]["incident"]
                .as_str()
                .is_some_and(|i| i.starts_with("trigger infrastructure_issue"))
    });
    assert_eq!(trigger["target"], "health_agent::alerts", "{trigger}");
    let refused = find("refusal", &|l| {
        l["level"] == "ERROR" && l["fields"]["destination"] == "slack"
    });
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("alert not delivered"),
        "{refused}"
    );
    println!("a warning: {warn}\nan incident: {trigger}\nan error: {refused}");
    let log = agent.logs();
    for secret in [PASSWORD, "XXXXSECRET", ROUTING_KEY] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

#[test]
fn under_the_journal_each_line_starts_with_its_priority() {
    require_root();
    // No web port: a warning at start, beside the info lines.
    let agent = Agent::start_journaled("", &[]);
    let log = wait_until(WAIT, "the start-up lines", || {
        let log = agent.logs();
        log.contains("serving /health").then_some(log)
    });
    for line in log.lines() {
        let b = line.as_bytes();
        assert!(
            b.len() > 3 && b[0] == b'<' && b[1].is_ascii_digit() && b[2] == b'>',
            "a line without its priority: {line:?}\n{log}"
        );
    }
    let with = |needle: &str| {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{log}"))
    };
    let warn = with("web.port is 0");
    let info = with("serving /health");
    println!("{warn}\n{info}");
    assert!(warn.starts_with("<4>") && warn.contains("WARN"), "{warn}");
    assert!(info.starts_with("<6>") && info.contains("INFO"), "{info}");

    // A stream other than stderr (a shell started from a unit, its stderr sent elsewhere):
    // no prefix.
    let other = Agent::start_with_env("", &[("JOURNAL_STREAM", "1:2")]);
    let log = wait_until(WAIT, "the start-up lines", || {
        let log = other.logs();
        log.contains("serving /health").then_some(log)
    });
    assert!(
        log.lines().all(|l| !l.starts_with('<')),
        "a prefix while stderr is not the journal:\n{log}"
    );
}
