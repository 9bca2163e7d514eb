//! Loading and parsing as a whole: defaults, the documented default file, error messages.

use std::{net::SocketAddr, time::Duration};

use super::*;

#[test]
fn empty_file_is_the_default() {
    assert_eq!(Config::parse("", "t").unwrap(), Config::default());
}

#[test]
fn the_configuration_reference_shows_the_default_config() {
    let page = include_str!("../../../docs/configuration.md");
    assert!(
        page.contains(&format!("```toml\n{}\n```", DEFAULT_TOML.trim_end())),
        "docs/configuration.md's last ```toml block differs from DEFAULT_TOML: paste `health-agent config --dump` there"
    );
}

#[test]
fn documented_default_matches_code() {
    assert_eq!(
        Config::parse(DEFAULT_TOML, "dump").unwrap(),
        Config::default()
    );
}

#[test]
fn agent_check_listen_is_off_or_an_address_with_its_own_port() {
    let off = Config::parse("", "x.toml").unwrap();
    assert_eq!(off.server.agent_check_addr(), None);
    let on = Config::parse(
        "[server]\nagent_check_listen = \"127.0.0.1:8081\"\n",
        "x.toml",
    )
    .unwrap();
    assert_eq!(
        on.server.agent_check_addr(),
        Some(SocketAddr::from(([127, 0, 0, 1], 8081)))
    );
    for (value, says) in [
        ("localhost:8081", "ADDR:PORT"),
        ("8081", "ADDR:PORT"),
        ("127.0.0.1:0", "port other than 0"),
        ("0.0.0.0:8080", "its own port"),
    ] {
        let err = Config::parse(
            &format!("[server]\nagent_check_listen = \"{value}\"\n"),
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("server.agent_check_listen"), "{err}");
        assert!(err.contains(says), "{value}: {err}");
    }
}

#[test]
fn unknown_key_names_key_and_line() {
    let err = Config::parse("[web]\nport = 9000\nhung_aftr = \"2s\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("hung_aftr"), "{err}");
    assert!(err.contains("hung_after"), "lists what is allowed: {err}");
}

#[test]
fn bad_duration_says_how() {
    let err = Config::parse("[checks]\ninterval = \"soon\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2") && err.contains("\"2s\""), "{err}");
}

#[test]
fn thresholds_are_range_checked() {
    let err = Config::parse("[disk]\nwarn_percent = 95.0\n", "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("disk.warn_percent"), "{err}");
    let err = Config::parse("[disk]\nfail_percent = 120.0\n", "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("between 0 and 100"), "{err}");
    let err = Config::parse("[web]\nprobe_path = \"up\"\n", "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("web.probe_path"), "{err}");
}

#[test]
fn database_urls_are_validated_without_echoing_passwords() {
    let err = Config::parse("[database]\nurl = \"http://u:Sekr1t@db/x\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`database.url`"), "{err}");
    assert!(
        err.contains("http://u@db/x"),
        "shows the URL redacted: {err}"
    );
    assert!(!err.contains("Sekr1t"), "{err}");
    let err = Config::parse(
        "[database]\nurls = [\"redis://h\", \"postgres://u:Sekr1t@h/db?sslmode=allow\"]\n",
        "x.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`database.urls`") && err.contains("sslmode"),
        "{err}"
    );
    assert!(!err.contains("Sekr1t"), "{err}");
    for bad in [
        "fail_after = 0",
        "recover_after = 0",
        "urls = [\"\"]",
        "timeout = \"0s\"",
    ] {
        let err = Config::parse(&format!("[database]\n{bad}\n"), "x").unwrap_err();
        assert!(err.to_string().contains("database."), "{bad}: {err}");
    }
    let cfg = Config::parse(
        "[database]\nurl = \"postgres://u@127.0.0.1/db\"\nurls = [\"redis://127.0.0.1:6379/1\", \"mysql://127.0.0.1\", \"postgres://u@127.0.0.1/db\"]\n",
        "x",
    )
    .unwrap();
    let err = Config::parse(
        "[database]\nurll = \"postgres://u:Sekr1t@h/db\"\n",
        "x.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("urll") && err.contains("line 2"), "{err}");
    assert!(
        !err.contains("Sekr1t"),
        "a parse error quoting the line: {err}"
    );
    let keys: Vec<String> = cfg
        .database
        .all_urls()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        ["database.url", "database.urls[0]", "database.urls[1]"]
    );
}

#[test]
fn alert_urls_are_checked_without_echoing_them() {
    let err = Config::parse(
        "[alerts]\nslack_webhook_url = \"hooks.slack.com/services/T1/B1/sekrit\"\n",
        "x",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("alerts.slack_webhook_url"), "{err}");
    assert!(!err.contains("sekrit"), "{err}");
    let err = Config::parse("[alerts]\npagerduty_url = \"\"\n", "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("alerts.pagerduty_url"), "{err}");
    let err = Config::parse("[alerts]\ngithub_repo = \"owner/\"\n", "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("alerts.github_repo"), "{err}");
    let cfg = Config::parse(
        "[alerts]\nwebhook_url = \"http://127.0.0.1:9/x\"\nresolve_after = \"200ms\"\n",
        "x",
    )
    .unwrap();
    assert_eq!(cfg.alerts.resolve_after, Duration::from_millis(200));
}

#[test]
fn durations_round_trip() {
    let cfg = Config::parse("[web]\neval_interval = \"100ms\"\n", "x").unwrap();
    assert_eq!(cfg.web.eval_interval, Duration::from_millis(100));
    let again = Config::parse(&toml::to_string(&cfg).unwrap(), "x").unwrap();
    assert_eq!(again, cfg);
}

/// Type mistakes answered in the reference's words: the range, the form, no quotes.
#[test]
fn type_errors_say_the_range_and_the_form() {
    let err = |toml: &str| Config::parse(toml, "x.toml").unwrap_err().to_string();
    for (toml, says) in [
        (
            "[web]\nport = 70000\n",
            "key `web.port`: must be the backend's listen port, 1 to 65535 (0 watches no \
             backend) (got integer `70000`)",
        ),
        (
            "[web]\nport = -1\n",
            "must be the backend's listen port, 1 to 65535 (0 watches no backend) (got integer \
             `-1`)",
        ),
        (
            "[web]\nport = \"3000\"\n",
            "must be the backend's listen port, 1 to 65535 (0 watches no backend), without \
             quotes (got string \"3000\")",
        ),
        (
            "[checks]\nboot_grace = 120\n",
            "key `checks.boot_grace`: must be a duration in quotes: \"120s\", \"500ms\", \
             \"10m\" (got integer `120`)",
        ),
        (
            "[scaling.cloudwatch]\ninterval = 60\n",
            "must be a duration in quotes",
        ),
        (
            "[disk]\nwarn_percent = \"80\"\n",
            "key `disk.warn_percent`: must be a number, without quotes (got string \"80\")",
        ),
        (
            "[heal]\nenabled = \"yes\"\n",
            "key `heal.enabled`: must be true or false, without quotes (got string \"yes\")",
        ),
        (
            "[containers]\ndocker_host = \"unix:///var/run/docker.sock\"\n\
             containerd_socket = \"/run/containerd/containerd.sock\"\n",
            "set docker_host (the Engine API: Docker, Podman) or containerd_socket, not both",
        ),
        (
            "[containers]\ncontainerd_socket = \"run/containerd.sock\"\n",
            "must be an absolute path such as /run/containerd/containerd.sock",
        ),
    ] {
        let e = err(toml);
        assert!(e.contains(says), "{toml:?}:\n  {e}\nwants\n  {says}");
    }
}

/// The agent watching its own port: refused, unless the backend is in another namespace.
#[test]
fn web_port_equal_to_the_agents_own_port_is_refused_in_one_namespace() {
    let e = Config::parse(
        "[server]\nlisten = \"127.0.0.1:8080\"\n[web]\nport = 8080\n",
        "x.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`web.port` is 8080, the agent's own port (server.listen = \"127.0.0.1:8080\")"),
        "{e}"
    );
    Config::parse("[web]\nport = 8080\ncontainer = \"web\"\n", "x.toml")
        .expect("a container's 8080 is not the agent's");
    Config::parse("[web]\nport = 8081\n", "x.toml").expect("another port");
}
