//! `health-agent config --validate` on hostile files, through the real binary: values that once
//! meant unlimited restarts, instant kills or an overflow exit 2 naming the key; no error shows
//! a secret; a world-readable file with secrets is warned about. No root, no network.

use std::{os::unix::fs::PermissionsExt as _, path::Path, process::Command};

use health_agent_tests::agent_binary;

/// Exit code and stderr of `config --validate` on `toml`.
fn validate(dir: &Path, name: &str, toml: &str) -> (Option<i32>, String) {
    let file = dir.join(name);
    std::fs::write(&file, toml).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--validate"])
        .arg(&file)
        .env("HEALTH_AGENT_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn out_of_range_durations_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (name, toml, key) in [
        ("window.toml", "[heal]\nwindow = \"0s\"\n", "`heal.window`"),
        (
            "timeout.toml",
            "[heal]\ntimeout = \"0s\"\n",
            "`heal.timeout`",
        ),
        (
            "hung.toml",
            "[web]\nhung_after = \"9000000000000000000s\"\n",
            "`web.hung_after`",
        ),
        (
            "interval.toml",
            "[checks]\ninterval = \"18446744073709551615s\"\n",
            "`checks.interval`",
        ),
    ] {
        let (code, err) = validate(dir.path(), name, toml);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(
            err.contains(key) && err.contains("allowed"),
            "{name}: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
}

#[test]
fn config_errors_never_show_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    for (name, toml, secret, key) in [
        (
            "slack.toml",
            "[alerts]\nslack_webhok_url = \"https://hooks.slack.com/services/T01/B02/W3bH00kS3cr3t\"\n",
            "W3bH00kS3cr3t",
            "slack_webhok_url",
        ),
        (
            "db.toml",
            "[database]\nurll = \"postgres://app:Pa55w0rdS3cr3t@127.0.0.1/app\"\n",
            "Pa55w0rdS3cr3t",
            "urll",
        ),
        (
            "token.toml",
            "[alerts]\ngithub_tokn = \"ghp_T0k3nS3cr3tT0k3nS3cr3tT0k3nS3cr3t00\"\n",
            "T0k3nS3cr3t",
            "github_tokn",
        ),
        (
            "plain_http.toml",
            "[alerts]\nwebhook_url = \"http://hooks.example.com/hook/H00kS3cr3t\"\n",
            "H00kS3cr3t",
            "alerts.webhook_url",
        ),
    ] {
        let (code, err) = validate(dir.path(), name, toml);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(key), "{name}: {err}");
        assert!(!err.contains(secret), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    // Loopback receivers over http:// stay valid (the alert tests use them).
    let (code, err) = validate(
        dir.path(),
        "loopback.toml",
        "[alerts]\nwebhook_url = \"http://127.0.0.1:9/hook/x\"\n",
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn world_readable_secrets_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("open.toml");
    std::fs::write(
        &file,
        "[alerts]\npagerduty_routing_key = \"R0ut1ngK3yS3cr3t0123456789abcdef\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--validate"])
        .arg(&file)
        .env("HEALTH_AGENT_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("open.toml") && err.contains("0644") && err.contains("pagerduty_routing_key"),
        "{err}"
    );
    assert!(!err.contains("R0ut1ngK3y"), "{err}");
}

#[test]
fn errors_show_values_that_are_not_secrets_and_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    for (name, toml, shown, key, line) in [
        // A value serde refuses: the value is a port, not a secret.
        (
            "port.toml",
            "# mine\n[web]\nport = 70000\n",
            "70000",
            "web.port",
            "line 3",
        ),
        (
            "recover.toml",
            "[checks]\nrecover_after = \"2\"\n",
            "\"2\"",
            "checks.recover_after",
            "line 2",
        ),
        // Out of the bounds table's range: the line too, as for parse errors.
        (
            "window.toml",
            "[server]\nlisten = \"127.0.0.1:8080\"\n\n[heal]\nenabled = true\nwindow = \"0s\"\n",
            "\"0s\"",
            "heal.window",
            "line 6",
        ),
        (
            "percent.toml",
            "[disk]\nwarn_percent = 150.0\n",
            "150",
            "disk.warn_percent",
            "line 2",
        ),
    ] {
        let (code, err) = validate(dir.path(), name, toml);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(key) && err.contains(line), "{name}: {err}");
        assert!(err.contains(shown), "{name}: the value is no secret: {err}");
        assert!(!err.contains("[redacted]"), "{name}: {err}");
    }
    // A secret key of the wrong type stays hidden.
    let (code, err) = validate(
        dir.path(),
        "secret.toml",
        "[alerts]\npagerduty_routing_key = 918273645546372819\n",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("918273645546372819"), "{err}");
}

#[test]
fn a_missing_file_is_reported_once() {
    let out = Command::new(agent_binary())
        .args(["config", "--validate", "/nonexistent/first-day.toml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/first-day.toml"), "{err}");
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "the OS error once: {err}"
    );
}
