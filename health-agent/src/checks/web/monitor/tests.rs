//! The judge: on hand-made samples, and on a real listener through the watching.

use super::*;
use crate::checks::web::{
    answers::Stats, load_kernel, verdict::KernelEvidence, AnswerSigns, KernelState, KernelStatus,
    NamespaceView,
};
use crate::config::KernelTier;

/// A judge and the watching of its port on `cfg`.
fn watched(cfg: WebConfig) -> (WebMonitor, PortWatch) {
    let (kernel, status) = load_kernel(&cfg);
    let probes = crate::checks::probe::ProbeLedger::default();
    (
        WebMonitor::new(cfg.clone()),
        PortWatch::new(cfg, kernel, status, probes),
    )
}

fn failed(agent_error: bool) -> ProbeResult {
    ProbeResult {
        ok: false,
        status: None,
        latency_ms: 0.1,
        error: Some(if agent_error {
            "Too many open files (os error 24)".into()
        } else {
            "connection reset by peer".into()
        }),
        timed_out: false,
        refused: false,
        agent_error,
        target: "127.0.0.1:1".into(),
        ..ProbeResult::default()
    }
}

#[test]
fn the_agents_own_probe_errors_are_never_a_verdict_on_the_backend() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = WebConfig {
        port: listener.local_addr().unwrap().port(),
        kernel: false,
        ..WebConfig::default()
    };
    let (mut m, mut port) = watched(cfg);
    assert_eq!(port.at_rest().status.state, KernelState::Disabled);
    let t0 = Instant::now();
    // A real failure starts the clock; then the agent runs out of descriptors for a minute.
    m.record_probe(failed(false), t0);
    for s in 1..=60 {
        m.record_probe(failed(true), t0 + Duration::from_secs(s));
    }
    let r = m.evaluate(&mut port, t0 + Duration::from_secs(60));
    assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
    assert!(r.detail.contains("its own error"), "{}", r.detail);
    assert!(r.agent_error, "the report says the agent could not look");
    assert!(!r.served);
    // Never served, yet no 503 for it: not while booting, not after the grace.
    for in_boot_grace in [true, false] {
        let d = crate::policy::evaluate(&crate::policy::PolicyInput {
            web: r.verdict,
            web_detail: r.detail.clone(),
            web_agent_error: r.agent_error,
            web_served: r.served,
            in_boot_grace,
            ..crate::policy::PolicyInput::default()
        });
        assert_eq!(d.http, 200, "boot grace {in_boot_grace}: {d:?}");
    }
    assert!(r.probe.is_some_and(|p| p.agent_error));
    // The backend's own failures still count once the agent can probe again.
    let t1 = t0 + Duration::from_secs(61);
    m.record_probe(failed(false), t1);
    let r = m.evaluate(&mut port, t1 + Duration::from_secs(11));
    assert_eq!(r.verdict, WebVerdict::Unresponsive, "{}", r.detail);
}

#[test]
fn a_container_never_found_is_a_config_error_one_found_before_is_being_recreated() {
    let cfg = WebConfig {
        port: 9000,
        container: "wbe".into(),
        kernel: false,
        ..WebConfig::default()
    };
    let (mut m, mut port) = watched(cfg);
    let t0 = Instant::now();
    let missing = || {
        Err(crate::engine::EngineError::NoSuchContainer {
            engine: "Docker".into(),
            name: "wbe".into(),
        })
    };
    m.set_container(missing());
    let r = m.evaluate(&mut port, t0);
    assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
    let e = r.config_error.expect("never found: a config error");
    assert!(e.contains("web.container") && e.contains("wbe"), "{e}");

    // Found once (a host-network container: the agent's own namespace), then gone.
    m.set_container(Ok(ContainerNet {
        pid: Some(std::process::id()),
        host_network: true,
        published: Vec::new(),
    }));
    assert_eq!(m.evaluate(&mut port, t0).config_error, None);
    m.set_container(missing());
    let r = m.evaluate(&mut port, t0 + Duration::from_secs(1));
    assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
    assert_eq!(r.config_error, None, "being recreated: {}", r.detail);
    assert!(r.detail.contains("found before"), "{}", r.detail);
    let r = m.evaluate(&mut port, t0 + Duration::from_secs(1) + GONE_FOR_GOOD);
    assert!(r.config_error.is_some(), "gone for good: {}", r.detail);
}

/// Where a hand-made round looked: the agent's own namespace, something listening on 9000.
fn found(listening: bool, queue: u32) -> Found {
    Found {
        namespace: NamespaceView {
            source: "own",
            path: "/proc/self/ns/net".into(),
            inode: 1,
            port: 9000,
            container: None,
            published_port: None,
        },
        listening,
        queue,
        queue_max: 128,
    }
}

/// A round's sample as the full tier makes it, with `kernel` as its evidence.
fn sample(kernel: KernelEvidence) -> PortSample {
    PortSample {
        kernel_loaded: true,
        counters: None,
        kernel: Some(kernel),
        answers_basis: Stats::default(),
        erroring: false,
        answers: None,
        figures: None,
        responses_total: None,
        status: KernelStatus {
            state: KernelState::Active,
            reason: None,
            following: None,
            tier: Some(KernelTier::Full),
            missing: Vec::new(),
        },
        listen_drops: (0, 0),
        signs: AnswerSigns::default(),
    }
}

fn judge() -> WebMonitor {
    WebMonitor::new(WebConfig {
        port: 9000,
        ..WebConfig::default()
    })
}

#[test]
fn a_sample_whose_connection_waits_unclaimed_past_hung_after_is_hung_and_keeps_the_round_hot() {
    let mut m = judge();
    let t0 = Instant::now();
    let stuck = sample(KernelEvidence {
        oldest_waiting: Some(Duration::from_secs(3)),
        ..KernelEvidence::default()
    });
    let r = m.judge(&found(true, 1), &stuck, t0, &mut || None);
    assert_eq!(r.verdict, WebVerdict::Hung, "{}", r.detail);
    assert_eq!((r.accept_queue, r.accept_queue_max), (1, 128));
    assert_eq!(r.kernel.tier, Some(KernelTier::Full), "the sample's status");
    assert!(m.hot(), "a hung backend is looked at every tick");
    assert_eq!(m.sight().verdict, WebVerdict::Hung, "the watching is told");

    // The same connection half a second younger than hung_after: not hung yet, and the judge
    // says to look again when it can be (just past the edge).
    let young = sample(KernelEvidence {
        oldest_waiting: Some(Duration::from_millis(1500)),
        ..KernelEvidence::default()
    });
    let r = m.judge(&found(true, 1), &young, t0, &mut || None);
    assert_ne!(r.verdict, WebVerdict::Hung, "{}", r.detail);
    let next = m.next_look(t0).map(|t| t.duration_since(t0));
    assert!(
        next.is_some_and(|d| d >= Duration::from_millis(500) && d < Duration::from_millis(600)),
        "{next:?}"
    );

    // Claimed and answered since: up, and no longer hot.
    let moving = sample(KernelEvidence {
        since_claim: Some(Duration::from_millis(20)),
        since_answer: Some(Duration::from_millis(10)),
        answered: 40,
        ..KernelEvidence::default()
    });
    let r = m.judge(&found(true, 0), &moving, t0, &mut || None);
    assert_eq!(r.verdict, WebVerdict::Up, "{}", r.detail);
    assert!(!m.hot());

    // Nothing listens: down, whatever the kernel saw before.
    let r = m.judge(&found(false, 0), &moving, t0, &mut || None);
    assert_eq!(r.verdict, WebVerdict::Down, "{}", r.detail);
}

#[test]
fn erroring_answers_in_a_sample_are_erroring_only_while_the_probe_passes() {
    let mut m = judge();
    let t0 = Instant::now();
    let mut errors = sample(KernelEvidence {
        since_answer: Some(Duration::from_millis(10)),
        answered: 100,
        ..KernelEvidence::default()
    });
    errors.erroring = true;
    errors.answers_basis = Stats {
        by_class: [0, 0, 10, 0, 0, 90],
        answers: 100,
        errors: 90,
        span: Duration::from_secs(30),
        ..Stats::default()
    };
    errors.signs.answered_at = Some(t0);
    // No probe result yet (a probe path is set): no word that the server itself is fine.
    let r = m.judge(&found(true, 0), &errors, t0, &mut || None);
    assert_ne!(r.verdict, WebVerdict::Erroring, "{}", r.detail);

    let later = t0 + Duration::from_secs(1);
    m.record_probe(
        ProbeResult {
            ok: true,
            status: Some(200),
            latency_ms: 2.0,
            ..ProbeResult::default()
        },
        later,
    );
    let r = m.judge(&found(true, 0), &errors, later, &mut || None);
    assert_eq!(r.verdict, WebVerdict::Erroring, "{}", r.detail);
    assert!(
        r.detail.contains("90% of 100 real answers 5xx"),
        "{}",
        r.detail
    );
    assert_eq!(
        r.signs.answered_at,
        Some(later),
        "the probe's pass is later than the port's last answer"
    );
    assert!(m.hot());
}

#[test]
fn without_a_kernel_sample_the_queue_alone_keeps_the_round_hot() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = WebConfig {
        port: listener.local_addr().unwrap().port(),
        kernel: false,
        probe_path: String::new(),
        ..WebConfig::default()
    };
    let (mut m, mut port) = watched(cfg);
    let t0 = Instant::now();
    let r = m.evaluate(&mut port, t0);
    assert_eq!(r.accept_queue, 0, "{r:?}");
    assert!(!m.hot(), "{}", r.detail);
    // A connection nobody accepts: the queue holds it.
    let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let r = m.evaluate(&mut port, t0 + Duration::from_millis(250));
    assert_eq!(r.accept_queue, 1, "{r:?}");
    assert!(m.hot(), "no kernel view: the queue is the work in flight");
}
