//! `health-agent config --validate` on hostile files, through the real binary: values that once
//! meant unlimited restarts, instant kills or an overflow exit 2 naming the key; no error shows
//! a secret; a world-readable file with secrets is warned about. Drop-ins (`conf.d/*.toml`),
//! `config --effective` and `--config` before or after the command. No network but loopback;
//! only the `serve` test needs root.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use health_agent_tests::{agent_binary, free_port, get, require_root, wait_until, Proc};

/// Exit code and stderr of `config --validate` on `toml`, written to `dir/name` with `mode`.
fn validate_as(dir: &Path, name: &str, toml: &str, mode: u32) -> (Option<i32>, String) {
    let file = dir.join(name);
    std::fs::write(&file, toml).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    let out = Command::new(agent_binary())
        .args(["config", "--validate"])
        .arg(&file)
        .env("HEALTH_AGENT_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), err)
}

/// [`validate_as`] a file only its owner reads.
fn validate(dir: &Path, name: &str, toml: &str) -> (Option<i32>, String) {
    validate_as(dir, name, toml, 0o600)
}

/// `toml` is refused: exit 2, no panic; its stderr.
fn refused(dir: &Path, name: &str, toml: &str) -> String {
    let (code, err) = validate(dir, name, toml);
    assert_eq!(code, Some(2), "{name}: {err}");
    assert!(!err.contains("panicked"), "{name}: {err}");
    err
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
        let err = refused(dir.path(), name, toml);
        assert!(
            err.contains(key) && err.contains("allowed"),
            "{name}: {err}"
        );
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
        let err = refused(dir.path(), name, toml);
        assert!(err.contains(key) && !err.contains(secret), "{name}: {err}");
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
    let toml = "[alerts]\npagerduty_routing_key = \"R0ut1ngK3yS3cr3t0123456789abcdef\"\n";
    let (code, err) = validate_as(dir.path(), "open.toml", toml, 0o644);
    assert_eq!(code, Some(0), "{err}");
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
        let err = refused(dir.path(), name, toml);
        assert!(err.contains(key) && err.contains(line), "{name}: {err}");
        assert!(err.contains(shown), "{name}: the value is no secret: {err}");
        assert!(!err.contains("[redacted]"), "{name}: {err}");
    }
    // A secret key of the wrong type stays hidden.
    let toml = "[alerts]\npagerduty_routing_key = 918273645546372819\n";
    let err = refused(dir.path(), "secret.toml", toml);
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

/// A config file and its `conf.d/` in a temporary directory, every file mode 0600.
fn with_dropins(main: &str, dropins: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("health-agent.toml");
    std::fs::write(&file, main).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    for (name, text) in dropins {
        let p = dir.path().join("conf.d").join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    (dir, file)
}

fn agent(args: &[&str]) -> Output {
    Command::new(agent_binary())
        .args(args)
        .env("HEALTH_AGENT_LOG", "warn")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn config_flag_before_or_after_the_command_reads_the_same_file_and_its_dropins() {
    const HOOK: &str = "https://hooks.slack.com/services/T01/B02/DropInH00kS3cr3t";
    let (_dir, file) = with_dropins(
        &format!("[web]\nport = 9000\nworkers = 4\n\n[alerts]\nslack_webhook_url = \"{HOOK}\"\n"),
        &[
            (
                "50-aws.toml",
                "[web]\nport = 8088\n\n[scaling.cloudwatch]\nenabled = true\nregion = \"us-east-1\"\n",
            ),
            // What dpkg leaves behind on an upgrade: not a drop-in.
            ("50-aws.toml.dpkg-old", "[web\nthis is not TOML"),
        ],
    );
    let f = file.to_str().unwrap();
    let before = agent(&["--config", f, "config", "--effective"]);
    let after = agent(&["config", "--effective", "--config", f]);
    assert!(before.status.success(), "{}", text(&before.stderr));
    assert_eq!(text(&before.stdout), text(&after.stdout));
    let effective = text(&before.stdout);
    // The drop-in wins key by key; the rest of the main file stays.
    assert!(effective.contains("port = 8088"), "{effective}");
    assert!(effective.contains("workers = 4"), "{effective}");
    assert!(
        effective.contains("50-aws.toml"),
        "names its files: {effective}"
    );
    let cw = effective
        .split("[scaling.cloudwatch]")
        .nth(1)
        .expect("a [scaling.cloudwatch] table");
    assert!(
        cw.contains("enabled = true") && cw.contains("us-east-1"),
        "{effective}"
    );
    assert!(!effective.contains("DropInH00kS3cr3t"), "{effective}");
    assert!(effective.contains("hooks.slack.com"), "{effective}");
    // What it prints is a config the agent takes.
    let elsewhere = tempfile::tempdir().unwrap();
    let printed = elsewhere.path().join("effective.toml");
    std::fs::write(&printed, &effective).unwrap();
    let out = agent(&["config", "--validate", printed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // --validate FILE, --validate with --config, and two different files refused.
    for args in [
        vec!["config", "--validate", f],
        vec!["--config", f, "config", "--validate"],
        vec!["config", "--validate", "--config", f],
    ] {
        let out = agent(&args);
        let said = text(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(
            said.contains("50-aws.toml") && said.contains("valid"),
            "{args:?}: {said}"
        );
    }
    let out = agent(&["--config", "/x.toml", "config", "--validate", f]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("two files"),
        "{}",
        text(&out.stderr)
    );
    // --dump prints the built-in defaults: a --config beside it would be ignored, so it is
    // refused.
    let out = agent(&["config", "--dump", "--config", f]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--effective"),
        "{}",
        text(&out.stderr)
    );
    assert!(agent(&["config", "--dump"]).status.success());
}

#[test]
fn a_broken_dropin_is_named_by_every_command_whichever_side_config_is_on() {
    let (_dir, file) = with_dropins(
        "[web]\nport = 9000\n",
        &[("70-typo.toml", "[web]\n\nhung_aftr = \"2s\"\n")],
    );
    let f = file.to_str().unwrap();
    for args in [
        vec!["--config", f, "serve"],
        vec!["serve", "--config", f],
        vec!["--config", f, "check"],
        vec!["check", "--json", "--config", f],
        vec!["--config", f, "alert", "test"],
        vec!["alert", "test", "--config", f],
        vec!["config", "--effective", "--config", f],
    ] {
        let out = agent(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("conf.d/70-typo.toml")
                && err.contains("line 3")
                && err.contains("hung_aftr"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_world_readable_dropin_with_a_secret_is_warned_about_by_name() {
    let (dir, file) = with_dropins(
        "[web]\nport = 9000\n",
        &[(
            "20-alerts.toml",
            "[alerts]\npagerduty_routing_key = \"Dr0pInR0ut1ngK3y0123456789abcdef\"\n",
        )],
    );
    let dropin = dir.path().join("conf.d/20-alerts.toml");
    std::fs::set_permissions(&dropin, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = agent(&["config", "--validate", file.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("20-alerts.toml")
            && err.contains("0644")
            && err.contains("alerts.pagerduty_routing_key"),
        "{err}"
    );
    assert!(!err.contains("Dr0pInR0ut1ngK3y"), "{err}");
    assert!(
        !err.contains("health-agent.toml is readable"),
        "the main file is 0600: {err}"
    );
}

/// The packaged config as installed (`web.port = 0`, no containers): the agent watches
/// nothing the instance serves, so it never says `healthy`: 200 `degraded`, `stable`, the
/// reason naming the key, and a warning at start. `serve --config F` and `--config F serve`
/// alike, the drop-in they merged named in the start-up log.
#[test]
fn watching_nothing_answers_200_degraded_never_healthy() {
    require_root();
    for order in ["--config F serve", "serve --config F"] {
        let port = free_port();
        let (dir, file) = with_dropins(
            // As `Agent::start` does: the test machine's disk and load stay out of the answer.
            "[web]\nport = 0\n\n[checks]\nboot_grace = \"0s\"\ninterval = \"500ms\"\n\n\
             [disk]\nwarn_percent = 99.0\nfail_percent = 99.9\n\n[scaling]\n\
             cpu_high_percent = 100.0\nmemory_high_percent = 100.0\nup_at = 10.0\n",
            &[(
                "10-listen.toml",
                &format!("[server]\nlisten = \"127.0.0.1:{port}\"\ndetails = \"always\"\n"),
            )],
        );
        let log = dir.path().join("agent.log");
        let args: Vec<&str> = order
            .split(' ')
            .map(|a| if a == "F" { file.to_str().unwrap() } else { a })
            .collect();
        let child = Proc(
            Command::new(agent_binary())
                .args(&args)
                .env("HEALTH_AGENT_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let logs = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_until(Duration::from_secs(20), "the agent serving /livez", || {
            get(port, "/livez").ok().filter(|(c, _)| *c == 200)
        });
        // Every answer of a few rounds, not one lucky read.
        for _ in 0..5 {
            let (code, body) = get(port, "/health").unwrap();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(code, 200, "{order}: {body}");
            assert_eq!(v["status"], "degraded", "{order}: {body}");
            assert_eq!(v["recommendation"], "stable", "{order}: {body}");
            let reasons = v["reasons"].to_string();
            assert!(
                reasons.contains("set web.port") && reasons.contains("no containers"),
                "{order}: {body}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        let logs = logs();
        assert!(
            logs.lines().any(|l| l.contains("WARN")
                && l.contains("web.port is 0")
                && l.contains("degraded")),
            "{order}: {logs}"
        );
        assert!(
            logs.lines().any(|l| l.contains("INFO")
                && l.contains("configuration:")
                && l.contains("conf.d/10-listen.toml")),
            "{order}: {logs}"
        );
        drop(child);
    }
}
