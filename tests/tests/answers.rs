//! What the backend answers, against real servers: Debian's Puma with a Rack app that raises
//! (Puma answers 500) and nginx `return 500`, over keep-alive and a new connection per request,
//! while their health path still answers 200. Alone (no `[fleet]`), an erroring backend is
//! restarted once and then kept in rotation, degraded, with an alert; a 404 flood or a 2 % 5xx
//! share is healthy; a TLS backend's status is not visible, and it stays healthy.
//!
//! Every test records every `/health` answer of its run ([`HealthPoller`]) and asserts over all
//! of them.

use std::time::Duration;

use health_agent_tests::{
    merge_toml,
    puma::{context, wait},
    require_root, timeline, Agent, HealthPoller, Load, Puma, PumaOptions,
};

/// Agent start to a first verdict.
const WAIT: Duration = Duration::from_secs(30);

/// Agent config: the web check on `port` probing `/up`, a 500 ms check cadence, the scaling
/// thresholds out of the way (an idle machine would say `scale_down`), `extra` merged in.
fn config(port: u16, extra: &str) -> String {
    merge_toml(
        &format!(
            "[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n\
             [web]\nport = {port}\nprobe_path = \"/up\"\nprobe_timeout = \"2s\"\n\
             [scaling]\ncpu_high_percent = 100.0\nmemory_high_percent = 100.0\n\
             cpu_low_percent = 0.0\nmemory_low_percent = 0.0\nup_at = 10.0\ndown_at = 0.0\n"
        ),
        extra,
    )
}

/// Puma's real pages raise while `/up` answers 200; alone, the agent restarts it once (a
/// restart that really replaces Puma, whose new process raises too), then keeps it at 200
/// `degraded` with the share named, and never answers 503.
#[test]
fn puma_that_raises_alone_is_restarted_once_then_degraded_never_503() {
    require_root();
    for mode in ["always", "on_suspicion"] {
        let dir = tempfile::tempdir().unwrap();
        let error_file = dir.path().join("broken");
        let puma = Puma::start(PumaOptions {
            threads: 4,
            error_file: Some(error_file.clone()),
            ..Default::default()
        });
        let script = puma.restart_script();
        let agent = Agent::start(&config(
            puma.port,
            &format!(
                "[web]\nrestart_command = \"{}\"\nsocket_tracing = \"{mode}\"\n",
                script.display()
            ),
        ));
        let poller = HealthPoller::start(agent.port);
        let load = Load::keep_alive(puma.port, "/orders", 2, Duration::from_secs(5));
        wait(&poller, &agent, &puma, WAIT, "healthy under traffic", |s| {
            s.code == 200 && s.status == "healthy" && s.webserver == "up"
        });
        let first = puma.pid();
        std::fs::write(&error_file, "").unwrap();
        let broke = poller.elapsed();
        let degraded = wait(
            &poller,
            &agent,
            &puma,
            Duration::from_secs(40),
            "degraded, erroring, after one restart",
            |s| {
                s.code == 200
                    && s.status == "degraded"
                    && s.webserver == "erroring"
                    && s.body["details"]["heal"]["total_attempts"] == 1
                    && s.body["details"]["heal"]["phase"] == "exhausted"
            },
        );
        println!(
            "{mode}: errors began → degraded after one restart in {:.1}s ({degraded})",
            degraded.at.saturating_sub(broke).as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(3));
        let (code, body) = agent.health();
        let stats = load.stop();
        let samples = poller.stop();
        let ctx = context(&agent, &puma, &samples, &stats.to_string());
        assert_ne!(
            puma.current_pid(),
            first,
            "the restart did not replace Puma{ctx}"
        );
        assert_eq!(code, 200, "{body:#}{ctx}");
        let answers = &body["details"]["web"]["answers"];
        assert_eq!(answers["status_visible"], true, "{answers:#}{ctx}");
        assert!(
            answers["share_5xx"].as_f64().is_some_and(|s| s > 0.9),
            "{answers:#}{ctx}"
        );
        assert!(
            answers["probe_answers"].as_u64().is_some_and(|n| n > 0),
            "the probe's answers are counted apart: {answers:#}{ctx}"
        );
        let heal = &body["details"]["heal"];
        assert_eq!(
            heal["total_attempts"], 1,
            "one restart, no more: {heal:#}{ctx}"
        );
        if let Some(s) = samples.iter().find(|s| s.code == 503) {
            panic!("a 503 for an erroring backend with no peers: {s}{ctx}");
        }
        let metrics = agent.metrics();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("health_agent_web_responses_total{class=\"5xx\"}")),
            "{metrics}"
        );
        println!("{}", timeline(&samples));
        std::fs::remove_file(&error_file).unwrap();
    }
}
