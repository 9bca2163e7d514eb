//! The probe speaks to apps as they are served (issue 51): a Host the app checks
//! (`web.probe_host`), a redirect to HTTPS, and a backend that serves only TLS
//! (`web.probe_scheme = "https"`, `web.probe_tls_verify`). Asked the wrong way, each is
//! `misconfigured`, naming the status, the Location and the key to set: 200 `degraded`, never
//! 503. Asked the right way, healthy; and a TLS backend that hangs is 503 `hung` as a plain one.
//! Real Puma (tests/src/rack.rs) with a certificate made by openssl at test time.

use std::time::{Duration, Instant};

use health_agent_tests::{
    agent::Agent,
    certs::Ca,
    process::require_root,
    rack::{Strict, StrictApp},
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// Short enough that a probe mistaken for a fault would turn 503 within `never_503`'s window.
const FAST: &str = "[checks]\ninterval = \"500ms\"\n[web]\nhung_after = \"2s\"\n\
                    unanswered_after = \"3s\"\n";

fn reasons(body: &Value) -> String {
    body["reasons"].to_string()
}

/// Polls `/health` for `for_how_long` and panics on any 503.
fn never_503(agent: &Agent, for_how_long: Duration) {
    let deadline = Instant::now() + for_how_long;
    while Instant::now() < deadline {
        let (code, body) = agent.health();
        assert_ne!(code, 503, "a probe set up wrong turned 503: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agent on `port` with `extra`: 200 `degraded`, the web server `up`, a reason saying
/// `misconfigured` and containing every one of `named`; never 503 for longer than
/// `unanswered_after`. Returns the reason.
fn misconfigured(port: u16, extra: &str, named: &[&str]) -> String {
    let agent = Agent::on_port(port, &format!("{FAST}{extra}"));
    let (code, body) = agent.wait_health(WAIT, "a reason saying misconfigured", |_, b| {
        reasons(b).contains("misconfigured")
    });
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("degraded")),
        "{body}"
    );
    assert_eq!(body["checks"]["webserver"], "up", "the app answers: {body}");
    let why = reasons(&body);
    for n in named {
        assert!(why.contains(n), "{n:?} not in {why}");
    }
    never_503(&agent, Duration::from_secs(6));
    println!("{extra:?} → {code} {}: {why}", body["status"]);
    why
}

/// The agent on `port` with `extra`: 200, `up`, nothing misconfigured.
fn healthy(port: u16, extra: &str) -> Agent {
    let agent = Agent::on_port(port, &format!("{FAST}{extra}"));
    let (code, body) = agent.wait_health(WAIT, "200 up, nothing misconfigured", |c, b| {
        c == 200 && b["checks"]["webserver"] == "up" && b["details"]["web"]["probe"]["ok"] == true
    });
    assert!(!reasons(&body).contains("misconfigured"), "{body}");
    println!(
        "{extra:?} → {code} {}, probe {}",
        body["status"], body["details"]["web"]["probe"]
    );
    agent
}

#[test]
fn an_app_that_checks_its_host_is_misconfigured_until_probe_host_names_it() {
    require_root();
    let app = StrictApp::start(&Strict {
        hosts: &["shop.example"],
        http: true,
        ..Strict::default()
    });
    let port = app.http_port;
    misconfigured(
        port,
        "",
        &[
            "answered 403",
            &format!("Host: 127.0.0.1:{port}"),
            "web.probe_host",
        ],
    );
    misconfigured(
        port,
        "probe_host = \"admin.example\"\n",
        &[
            "answered 403",
            "Host: admin.example",
            "not a host it serves",
        ],
    );
    healthy(port, "probe_host = \"shop.example\"\n");
}

#[test]
fn a_redirect_to_https_names_the_location_and_probe_scheme() {
    require_root();
    let ca = Ca::new("probe test CA");
    let cert = ca.server("127.0.0.1", &["IP:127.0.0.1", "DNS:shop.example"]);
    let app = StrictApp::start(&Strict {
        http: true,
        tls: Some(&cert),
        force_ssl: true,
        ..Strict::default()
    });
    let tls = app.tls_port;
    misconfigured(
        app.http_port,
        "",
        &[
            "answered 301",
            &format!("Location: https://127.0.0.1:{tls}/up"),
            "web.probe_scheme = \\\"https\\\"",
            &format!("web.port = {tls}"),
        ],
    );
    healthy(tls, "probe_scheme = \"https\"\nprobe_tls_verify = false\n");
}

#[test]
fn a_tls_only_backend_is_probed_in_tls_and_a_hang_is_still_503_hung() {
    require_root();
    let ca = Ca::new("probe test CA");
    let cert = ca.server("shop.example", &["DNS:shop.example", "IP:127.0.0.1"]);
    let app = StrictApp::start(&Strict {
        tls: Some(&cert),
        ..Strict::default()
    });
    let port = app.tls_port;
    // Asked in plain HTTP, Puma's TLS port takes the request and answers nothing.
    misconfigured(
        port,
        "",
        &["speaks TLS", "web.probe_scheme = \\\"https\\\""],
    );
    // Verified against the system's CAs, the test's own CA is unknown.
    misconfigured(
        port,
        "probe_scheme = \"https\"\n",
        &[
            "certificate the probe refused",
            "web.probe_tls_verify = false",
        ],
    );
    healthy(port, "probe_scheme = \"https\"\nprobe_tls_verify = false\n");
    let agent = healthy(
        port,
        "probe_scheme = \"https\"\nprobe_tls_verify = false\nprobe_host = \"shop.example\"\n",
    );

    app.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let (code, body) = agent.wait_health(WAIT, "503 hung", |c, _| c == 503);
    assert_eq!(body["checks"]["webserver"], "hung", "{body}");
    assert!(!reasons(&body).contains("misconfigured"), "{body}");
    println!(
        "TLS backend stopped → {code} {} in {:.1}s: {}",
        body["checks"]["webserver"],
        stopped.elapsed().as_secs_f64(),
        body["details"]["web"]["detail"]
    );
    app.signal(libc::SIGCONT);
    agent.wait_up(WAIT, "200 after SIGCONT");
}
