//! Secrets where the README says they go: in the agent's environment, under the variables
//! docs/configuration.md lists, with no secret in the config file. Alerts reach local
//! receivers standing in for Slack, PagerDuty and a webhook (on 127.0.0.1); `DATABASE_URL`
//! names a private real PostgreSQL. No value of a variable shows in an output or a log line.

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use health_agent_tests::{
    agent_binary, require_root, Agent, Fixture, Postgres, Receiver, SECRET_VARS,
};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(40);
const SLACK_PATH: &str = "/services/T000/B000/XXXXSECRET";
const WEBHOOK_PATH: &str = "/hook?token=H00KSECRET";
const ROUTING_KEY: &str = "R0UT1NGKEY0123456789abcdefABCDEF";

/// `health-agent --config FILE ARGS` with exactly the secret variables `vars` (the ones of
/// the shell running the test removed), holding `toml` in FILE.
fn agent_with(dir: &Path, toml: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let file = dir.join("health-agent.toml");
    std::fs::write(&file, toml).expect("writing the config");
    let mut command = Command::new(agent_binary());
    for var in SECRET_VARS {
        command.env_remove(var);
    }
    command
        .arg("--config")
        .arg(&file)
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("running health-agent")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// PagerDuty's answer to an accepted event.
fn pagerduty() -> Receiver {
    Receiver::start(|_, _| {
        (
            202,
            json!({"status": "success", "message": "Event processed"}).to_string(),
        )
    })
}

#[test]
fn alerts_reach_slack_and_the_webhook_from_the_environment_with_no_alert_key_in_the_config() {
    require_root();
    let slack = Receiver::ok();
    let webhook = Receiver::ok();
    let backend = Fixture::start("normal");
    // A database nobody serves: unreachable from the first round, an infrastructure_issue.
    let dead_db = health_agent_tests::free_port();
    let config = format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\n[database]\n\
         url = \"postgres://app@127.0.0.1:{dead_db}/app\"\ninterval = \"500ms\"\n\
         timeout = \"500ms\"\nfail_after = 1\n",
        backend.port
    );
    assert!(!config.contains("[alerts]"));
    let agent = Agent::start_with_env(
        &config,
        &[
            ("SLACK_WEBHOOK_URL", &slack.url(SLACK_PATH)),
            ("HEALTH_AGENT_WEBHOOK_URL", &webhook.url(WEBHOOK_PATH)),
        ],
    );
    let (code, body) = agent.wait_health(WAIT, "the database unreachable", |_, b| {
        b["recommendation"] == "infrastructure_issue"
    });
    assert_eq!(code, 200, "{body}");

    let posted = |rx: &Receiver, what: &str| {
        health_agent_tests::wait_until(WAIT, what, || rx.posts().first().cloned())
    };
    let message = posted(&slack, "the Slack message");
    assert_eq!(message.path, SLACK_PATH);
    let words = message.body["text"].as_str().unwrap_or_default();
    assert!(words.contains("infrastructure_issue"), "{}", message.body);
    let hook = posted(&webhook, "the webhook");
    assert_eq!(hook.path, WEBHOOK_PATH);
    assert_eq!(hook.body["event"], "incident.triggered", "{}", hook.body);
    for k in ["timestamp", "hostname", "payload"] {
        assert!(
            hook.body.get(k).is_some(),
            "webhook field {k}: {}",
            hook.body
        );
    }

    // The log says where the secrets came from, by name, and never shows them.
    let logs = agent.logs();
    for line in [
        "alerts.slack_webhook_url: from the environment variable SLACK_WEBHOOK_URL",
        "alerts.webhook_url: from the environment variable HEALTH_AGENT_WEBHOOK_URL",
    ] {
        assert!(logs.contains(line), "{line:?} not in the log:\n{logs}");
    }
    agent.assert_shows_none(&["XXXXSECRET", "H00KSECRET"]);
}

#[test]
fn alert_test_reaches_a_destination_set_only_by_its_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slack = Receiver::ok();
    let url = slack.url(SLACK_PATH);
    let out = agent_with(
        dir.path(),
        "",
        &["alert", "test"],
        &[("SLACK_WEBHOOK_URL", &url)],
    );
    let shown = text(&out.stdout) + &text(&out.stderr);
    println!("alert test with only SLACK_WEBHOOK_URL set:\n{shown}");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert_eq!(
        text(&out.stdout),
        "alerts.slack_webhook_url: from the environment variable SLACK_WEBHOOK_URL \
         (alerts.slack_webhook_url_env)\nslack: ok\n"
    );
    let posts = slack.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0].path, SLACK_PATH);
    assert!(!shown.contains("XXXXSECRET"), "{shown}");

    // PagerDuty's key from its variable; the endpoint is no secret, so the config names it.
    let pd = pagerduty();
    let out = agent_with(
        dir.path(),
        &format!("[alerts]\npagerduty_url = \"{}\"\n", pd.url("/v2/enqueue")),
        &["alert", "test"],
        &[("PAGERDUTY_ROUTING_KEY", ROUTING_KEY)],
    );
    let shown = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.ends_with("pagerduty: ok\n"), "{shown}");
    assert!(!shown.contains("R0UT1NGKEY"), "{shown}");
    assert_eq!(pd.posts()[0].body["routing_key"], ROUTING_KEY);

    // A variable of your own, named by the `_env` key.
    let out = agent_with(
        dir.path(),
        "[alerts]\nslack_webhook_url_env = \"OPS_SLACK\"\n",
        &["alert", "test"],
        &[("OPS_SLACK", &url)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("from the environment variable OPS_SLACK"));
    assert_eq!(slack.posts().len(), 2);
}

#[test]
fn a_bad_value_in_a_variable_is_refused_naming_the_variable_not_the_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = agent_with(
        dir.path(),
        "",
        &["alert", "test"],
        &[(
            "SLACK_WEBHOOK_URL",
            "http://hooks.example.com/services/T1/B2/s3cr3t",
        )],
    );
    let shown = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains("SLACK_WEBHOOK_URL") && shown.contains("https://"),
        "{shown}"
    );
    assert!(
        shown.contains("alerts.slack_webhook_url_env = \"\""),
        "{shown}"
    );
    assert!(
        !shown.contains("s3cr3t") && !shown.contains("example.com"),
        "{shown}"
    );
    // `config --validate` refuses it the same way.
    let out = agent_with(
        dir.path(),
        "",
        &["config", "--validate"],
        &[(
            "SLACK_WEBHOOK_URL",
            "http://hooks.example.com/services/T1/B2/s3cr3t",
        )],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!text(&out.stderr).contains("s3cr3t"));

    // With no variable and no key: what to set.
    let out = agent_with(dir.path(), "", &["alert", "test"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    assert!(
        said.contains("set SLACK_WEBHOOK_URL, PAGERDUTY_ROUTING_KEY or HEALTH_AGENT_WEBHOOK_URL"),
        "{said}"
    );
}

/// `DATABASE_URL` as a Rails application has it: the password in the URL.
fn database_url(pg: &Postgres, password: &str) -> String {
    format!(
        "postgres://postgres:{password}@127.0.0.1:{}/postgres",
        pg.port
    )
}

#[test]
fn database_url_env_checks_the_database_database_url_names() {
    require_root();
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = database_url(&pg, &pg.password);
    let config = "[database]\nurl_env = \"DATABASE_URL\"\n";

    let out = agent_with(
        dir.path(),
        config,
        &["check", "--json"],
        &[("DATABASE_URL", &url)],
    );
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(json["checks"]["database"], "connected", "{json}");

    let out = agent_with(dir.path(), config, &["check"], &[("DATABASE_URL", &url)]);
    let table = text(&out.stdout);
    println!("check with database.url_env:\n{table}");
    assert!(
        table.contains(
            "secret          database.url: from the environment variable DATABASE_URL \
             (database.url_env)"
        ),
        "{table}"
    );
    assert!(!table.contains(&pg.password), "{table}");

    // The agent itself, and a refused password named by the variable it came from.
    let agent = Agent::start_with_env(
        &format!("{config}interval = \"1s\"\n"),
        &[("DATABASE_URL", &url)],
    );
    agent.wait_health(WAIT, "the database connected", |_, b| {
        b["checks"]["database"] == "connected"
    });
    agent.assert_shows_none(&[&pg.password]);
    drop(agent);
    let wrong = database_url(&pg, "Wr0ngPassw0rd");
    let out = agent_with(dir.path(), config, &["check"], &[("DATABASE_URL", &wrong)]);
    let table = text(&out.stdout);
    assert!(
        table.contains("misconfigured") && table.contains("DATABASE_URL (database.url_env)"),
        "{table}"
    );
    assert!(!table.contains("Wr0ngPassw0rd"), "{table}");
}

#[test]
fn check_hints_when_database_url_is_set_but_no_database_is_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = "postgres://app:HintS3cr3t@10.0.0.5:5432/app";
    let out = agent_with(dir.path(), "", &["check"], &[("DATABASE_URL", url)]);
    let table = text(&out.stdout);
    let hint = table
        .lines()
        .find(|l| l.starts_with("hint "))
        .unwrap_or_else(|| panic!("no hint row:\n{table}"));
    println!("{hint}");
    assert_eq!(
        hint,
        "hint            DATABASE_URL is set in this environment, but no database is configured: \
         set database.url_env = \"DATABASE_URL\" to check the database it names"
    );
    let all = table + &text(&out.stderr);
    assert!(
        !all.contains("HintS3cr3t") && !all.contains("10.0.0.5"),
        "{all}"
    );
    // `--json` keeps its output the /health body; the hint goes to stderr.
    let out = agent_with(
        dir.path(),
        "",
        &["check", "--json"],
        &[("DATABASE_URL", url)],
    );
    let said = text(&out.stderr);
    assert!(said.contains("hint: DATABASE_URL is set"), "{said}");
    // A database configured: nothing to hint.
    let out = agent_with(
        dir.path(),
        "[database]\nurl = \"postgres://app@127.0.0.1:1/app\"\ntimeout = \"1s\"\n",
        &["check"],
        &[("DATABASE_URL", url)],
    );
    assert!(
        !text(&out.stdout).contains("hint "),
        "{}",
        text(&out.stdout)
    );
}
