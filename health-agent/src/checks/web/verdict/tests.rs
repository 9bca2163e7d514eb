//! The verdict rules, case by case.

use super::*;

fn cfg() -> WebConfig {
    WebConfig {
        port: 9000,
        ..WebConfig::default()
    }
}

fn probe_ok(ms: f64) -> ProbeResult {
    ProbeResult {
        ok: true,
        status: Some(200),
        latency_ms: ms,
        error: None,
        timed_out: false,
        refused: false,
        agent_error: false,
        target: "127.0.0.1:9000".into(),
        ..ProbeResult::default()
    }
}

fn probe_timeout() -> ProbeResult {
    ProbeResult {
        ok: false,
        status: None,
        latency_ms: 2000.0,
        error: Some("no answer within 2000ms".into()),
        timed_out: true,
        ..probe_ok(2000.0)
    }
}

fn listening() -> Evidence {
    Evidence {
        listening: true,
        ..Evidence::default()
    }
}

const S: Duration = Duration::from_secs(1);
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A queue whose oldest connection waited `oldest`, with the last claim and answer long
/// ago (or never) unless set.
fn waiting(oldest: Duration, since_progress: Option<Duration>) -> Evidence {
    Evidence {
        queue: 1,
        kernel: Some(KernelEvidence {
            oldest_waiting: Some(oldest),
            since_claim: since_progress,
            ..Default::default()
        }),
        ..listening()
    }
}

fn kernel(e: &mut Evidence) -> &mut KernelEvidence {
    e.kernel.as_mut().unwrap()
}

fn dep(endpoint: &str, waiting_ms: u64) -> DependencyWait {
    DependencyWait {
        endpoint: endpoint.into(),
        waiting_ms,
        connections: 4,
        connecting: 0,
    }
}

#[test]
fn no_listener_is_down() {
    assert_eq!(decide(&Evidence::default(), &cfg()).0, WebVerdict::Down);
}

/// One row per situation the verdict must tell apart: the evidence, and what it must say.
#[test]
fn verdict_table() {
    type Case = (&'static str, fn() -> Evidence, WebVerdict, &'static str);
    let cases: &[Case] = &[
        (
            "stopped server, work stuck 0.5 s: hung at once",
            || {
                let mut e = waiting(ms(500), Some(ms(600)));
                e.frozen = Some("server processes 42 stopped".into());
                e
            },
            WebVerdict::Hung,
            "42 stopped",
        ),
        (
            "stopped server, the first connection just came: not yet",
            || {
                let mut e = waiting(ms(200), Some(ms(600)));
                e.frozen = Some("server processes 42 stopped".into());
                e
            },
            WebVerdict::Unknown,
            "",
        ),
        (
            "never took or answered anything, queue 2 s, no CPU: hung (weak evidence)",
            || waiting(2 * S, None),
            WebVerdict::Hung,
            "nothing taken or answered for ever",
        ),
        (
            "queue 3 s, nothing taken, but answers go out on keep-alive connections: slow",
            || {
                let mut e = waiting(3 * S, Some(5 * S));
                kernel(&mut e).since_answer = Some(ms(300));
                e
            },
            WebVerdict::Slow,
            "the last answer went out 0.3s ago",
        ),
        (
            "queue and nothing answered for 2.5 s, but this server went quiet 3 s before: slow",
            || {
                let mut e = waiting(3 * S, Some(5 * S));
                let k = kernel(&mut e);
                k.since_answer = Some(ms(2500));
                k.longest_quiet = 3 * S;
                e
            },
            WebVerdict::Slow,
            "the last answer went out 2.5s ago",
        ),
        (
            "requests in progress, queue behind them: not hung before unanswered_after, slow",
            || {
                let mut e = waiting(4 * S, Some(4 * S));
                let k = kernel(&mut e);
                k.pending = 2;
                k.oldest_pending = Some(4 * S);
                e
            },
            WebVerdict::Slow,
            "2 requests unanswered (oldest 4.0s); nothing answered since the agent started: \
             unresponsive (503) once a request has waited web.unanswered_after (10.0s) or the \
             probe has failed that long",
        ),
        (
            "requests read, nothing answered for 3 s, answers counted before: slow, not up",
            || {
                let mut e = listening();
                e.kernel = Some(KernelEvidence {
                    pending: 3,
                    oldest_pending: Some(ms(2500)),
                    since_answer: Some(3 * S),
                    answered: 500,
                    ..Default::default()
                });
                e.probe = Some(probe_timeout());
                e.probe_failing_for = Some(ms(500));
                e.cpu_percent = Some(0.0);
                e
            },
            WebVerdict::Slow,
            "3 requests unanswered (oldest 2.5s), the probe failing for 0.5s (no answer within \
             2000ms); nothing answered for 3.0s, 0% CPU: unresponsive (503)",
        ),
        (
            "a request read half a second ago: no evidence yet, up on what was answered",
            || {
                let mut e = listening();
                e.kernel = Some(KernelEvidence {
                    pending: 1,
                    oldest_pending: Some(ms(500)),
                    since_answer: Some(ms(600)),
                    answered: 500,
                    ..Default::default()
                });
                e
            },
            WebVerdict::Up,
            "500 connections answered",
        ),
        (
            "queued 1.5 s, nothing taken or answered, nothing in progress: slow until hung_after",
            || waiting(ms(1500), None),
            WebVerdict::Slow,
            "1 connections wait in the accept queue (oldest 1.5s); nothing answered since the \
             agent started: hung (503) once nothing is taken or answered for 2.0s",
        ),
        (
            "burning CPU with the queue stuck: slow, not hung",
            || {
                let mut e = waiting(3 * S, Some(3 * S));
                e.cpu_percent = Some(95.0);
                e
            },
            WebVerdict::Slow,
            "95% CPU",
        ),
        (
            "burning CPU and nothing taken or answered for unanswered_after: unresponsive",
            || {
                let mut e = waiting(10 * S, Some(10 * S));
                e.cpu_percent = Some(95.0);
                e
            },
            WebVerdict::Unresponsive,
            "95% CPU",
        ),
        (
            "requests read, nothing answered anywhere for unanswered_after: unresponsive",
            || {
                let mut e = listening();
                e.kernel = Some(KernelEvidence {
                    pending: 1,
                    oldest_pending: Some(10 * S),
                    since_answer: Some(11 * S),
                    answered: 5,
                    ..Default::default()
                });
                e
            },
            WebVerdict::Unresponsive,
            "1 requests unanswered",
        ),
        (
            "a request unanswered 10 s while others are answered: not unresponsive",
            || {
                let mut e = listening();
                e.kernel = Some(KernelEvidence {
                    pending: 1,
                    oldest_pending: Some(10 * S),
                    since_answer: Some(S),
                    answered: 5,
                    ..Default::default()
                });
                e
            },
            WebVerdict::Slow,
            "",
        ),
        (
            "outbound requests unanswered, nothing comes back out: waiting, names the endpoint",
            || {
                let mut e = waiting(3 * S, Some(3 * S));
                let k = kernel(&mut e);
                k.pending = 2;
                k.oldest_pending = Some(3 * S);
                e.dependencies = vec![dep("10.0.3.7:5432", 3200)];
                e
            },
            WebVerdict::Waiting,
            "waiting on 10.0.3.7:5432 for 3.2s (4 connections)",
        ),
        (
            "outbound waiting for 12 s, requests pending past unanswered_after: still waiting",
            || {
                let mut e = waiting(12 * S, Some(12 * S));
                let k = kernel(&mut e);
                k.pending = 2;
                k.oldest_pending = Some(12 * S);
                e.dependencies = vec![dep("10.0.3.7:5432", 12_000)];
                e
            },
            WebVerdict::Waiting,
            "10.0.3.7:5432",
        ),
        (
            "a slow dependency while answers still go out: slow, not waiting",
            || {
                let mut e = waiting(3 * S, Some(3 * S));
                kernel(&mut e).since_answer = Some(ms(200));
                e.dependencies = vec![dep("10.0.3.7:5432", 900)];
                e
            },
            WebVerdict::Slow,
            "",
        ),
        (
            "probe times out for unanswered_after while the kernel sees answers: slow",
            || {
                let mut e = listening();
                e.kernel = Some(KernelEvidence {
                    since_answer: Some(ms(800)),
                    answered: 50,
                    ..Default::default()
                });
                e.probe = Some(probe_timeout());
                e.probe_failing_for = Some(10 * S);
                e
            },
            WebVerdict::Slow,
            "answers still go out",
        ),
    ];
    for (name, evidence, verdict, says) in cases {
        let (v, detail) = decide(&evidence(), &cfg());
        assert_eq!(v, *verdict, "{name}: {detail}");
        assert!(detail.contains(says), "{name}: {detail:?} lacks {says:?}");
    }
}

#[test]
fn saturated_but_accepting_is_never_hung() {
    let e = Evidence {
        queue: 100,
        kernel: Some(KernelEvidence {
            oldest_waiting: Some(5 * S),
            since_claim: Some(ms(20)),
            since_answer: Some(ms(20)),
            answered: 1000,
            latency: LatencySummary {
                samples: 1000,
                p50_ms: 1500.0,
                p90_ms: 1900.0,
                p95_ms: 2000.0,
                p99_ms: 2500.0,
            },
            ..Default::default()
        }),
        ..listening()
    };
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Slow);
}

#[test]
fn without_any_progress_seen_the_queue_must_wait_hung_after() {
    assert_ne!(decide(&waiting(ms(1999), None), &cfg()).0, WebVerdict::Hung);
    assert_eq!(decide(&waiting(2 * S, None), &cfg()).0, WebVerdict::Hung);
}

#[test]
fn the_stall_clock_runs_from_the_last_progress() {
    // Stopped 2.05 s after its last claim; the first connection after that arrived 0.1 s
    // later and has waited 1.95 s: hung now, not 0.1 s from now.
    let (v, detail) = decide(&waiting(ms(1950), Some(ms(2100))), &cfg());
    assert_eq!(v, WebVerdict::Hung, "{detail}");
    assert!(
        detail.contains("nothing taken or answered for 2.1s"),
        "{detail}"
    );
    assert_ne!(
        decide(&waiting(ms(1950), Some(ms(1900))), &cfg()).0,
        WebVerdict::Hung
    );
    // An answer counts as progress as much as a claim.
    let mut e = waiting(ms(1950), Some(ms(2100)));
    kernel(&mut e).since_answer = Some(ms(100));
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
}

#[test]
fn an_idle_servers_next_connection_is_not_hung_at_once() {
    let e = waiting(ms(900), Some(600 * S));
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
    let e = waiting(S, Some(600 * S));
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
}

#[test]
fn a_servers_own_quiet_spells_stretch_the_limit_up_to_unanswered_after() {
    let mut e = waiting(5 * S, Some(5 * S));
    kernel(&mut e).longest_quiet = 3 * S;
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung, "6 s limit");
    let mut e = waiting(6 * S, Some(6 * S));
    kernel(&mut e).longest_quiet = 3 * S;
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
    // However slow it used to be: unanswered_after bounds it.
    let mut e = waiting(10 * S, Some(10 * S));
    kernel(&mut e).longest_quiet = 60 * S;
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
}

#[test]
fn a_waiting_connection_without_a_queue_is_not_hung() {
    // Taken by accept() but never read: the kernel's accept queue is empty.
    let mut e = waiting(10 * S, Some(10 * S));
    e.queue = 0;
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
}

#[test]
fn limits_past_the_end_of_time_never_panic() {
    // Config validation bounds these; a hand-built config must not panic the composer
    // (a panic there leaves a stale snapshot: 503 for ever).
    let huge = WebConfig {
        hung_after: Duration::from_secs(9_000_000_000_000_000_000),
        unanswered_after: Duration::MAX,
        slow_after: Duration::MAX,
        ..cfg()
    };
    let mut e = waiting(ms(700), Some(ms(1500)));
    if let Some(k) = e.kernel.as_mut() {
        k.longest_quiet = Duration::MAX;
        k.latency.p99_ms = f64::INFINITY;
    }
    assert_eq!(next_look(&e, &huge, Instant::now()), None);
    let _ = decide(&e, &huge);
}

#[test]
fn the_next_look_lands_where_the_verdict_can_change() {
    let now = Instant::now();
    // Oldest 0.7 s: slow_after (1 s) is reached in 0.3 s.
    let at = next_look(&waiting(ms(700), Some(ms(1500))), &cfg(), now).unwrap();
    assert_eq!(at - now, ms(302));
    // Stall clock at 1.5 s, oldest 1.2 s (slow already): hung_after is reached in 0.5 s.
    let at = next_look(&waiting(ms(1200), Some(ms(1500))), &cfg(), now).unwrap();
    assert_eq!(at - now, ms(502));
    // Oldest 0.2 s, stall clock far past: half of hung_after is reached in 0.8 s.
    let at = next_look(&waiting(ms(200), Some(60 * S)), &cfg(), now).unwrap();
    assert_eq!(at - now, ms(802));
    // Stopped: the freeze is confirmed once the oldest has waited 0.5 s.
    let mut e = waiting(ms(200), Some(ms(300)));
    e.frozen = Some("stopped".into());
    assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(302));
    // A pending request: unanswered_after (10 s) minus its age.
    let e = Evidence {
        kernel: Some(KernelEvidence {
            oldest_pending: Some(4 * S),
            ..Default::default()
        }),
        ..listening()
    };
    assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(6002));
    // Nothing waits: the regular tick will do.
    assert_eq!(next_look(&listening(), &cfg(), now), None);
}

#[test]
fn degraded_mode_uses_queue_probe_and_process_state() {
    let e = Evidence {
        queue: 2,
        queue_busy_for: Some(3 * S),
        probe: Some(probe_timeout()),
        probe_failing_for: Some(3 * S),
        ..listening()
    };
    let (v, d) = decide(&e, &cfg());
    assert_eq!(v, WebVerdict::Hung);
    assert!(d.contains("kernel view unavailable"), "{d}");
    // A queue that just formed is not enough…
    let young = Evidence {
        queue_busy_for: Some(S),
        probe_failing_for: Some(S),
        ..e.clone()
    };
    assert_ne!(decide(&young, &cfg()).0, WebVerdict::Hung);
    // …unless the server is stopped.
    let stopped = Evidence {
        frozen: Some("server processes 7 stopped".into()),
        ..young
    };
    assert_eq!(decide(&stopped, &cfg()).0, WebVerdict::Hung);
    // A CPU-bound server is not hung.
    let busy = Evidence {
        cpu_percent: Some(80.0),
        ..e
    };
    assert_ne!(decide(&busy, &cfg()).0, WebVerdict::Hung);
}

#[test]
fn probe_failures_need_to_last() {
    let mut e = Evidence {
        probe: Some(probe_timeout()),
        probe_failing_for: Some(2 * S),
        ..listening()
    };
    // Before `unanswered_after` the probe's request waits unanswered: slow, never unknown.
    let (v, d) = decide(&e, &cfg());
    assert_eq!(v, WebVerdict::Slow, "{d}");
    assert!(
        d.contains("the probe failing for 2.0s") && d.contains("web.unanswered_after (10.0s)"),
        "{d}"
    );
    // Failing without a timeout (reset, refused): nothing waits, not long enough yet.
    e.probe.as_mut().unwrap().timed_out = false;
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unknown);
    e.probe.as_mut().unwrap().timed_out = true;
    e.probe_failing_for = Some(10 * S);
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unresponsive);
    // A 404, a redirect, a refused Host: a probe set up wrong. The server answers (up), never
    // a restart, however long it lasts.
    for status in [404, 301, 403, 421] {
        e.probe = Some(ProbeResult {
            ok: false,
            status: Some(status),
            misconfigured: Some(format!("answered {status}: set web.probe_host")),
            ..probe_ok(1.0)
        });
        e.probe_failing_for = Some(60 * S);
        let (v, d) = decide(&e, &cfg());
        assert_eq!(v, WebVerdict::Up, "{status}: {d}");
        assert!(
            d.contains("web.probe_path") && d.contains("misconfigured"),
            "{d}"
        );
    }
    // A TLS-only port asked in plain HTTP: no status, but no fault either.
    e.probe = Some(ProbeResult {
        misconfigured: Some("speaks TLS: set web.probe_scheme".into()),
        error: Some("connection closed before a status line".into()),
        timed_out: false,
        ..probe_timeout()
    });
    let (v, d) = decide(&e, &cfg());
    assert_eq!(v, WebVerdict::Up, "{d}");
}

#[test]
fn a_refused_probe_with_a_listener_in_view_is_the_probes_problem() {
    let e = Evidence {
        probe: Some(ProbeResult {
            ok: false,
            error: Some("Connection refused".into()),
            refused: true,
            target: "127.0.0.1:9000".into(),
            ..probe_timeout()
        }),
        probe_failing_for: Some(60 * S),
        ..listening()
    };
    let mut e = e;
    e.probe.as_mut().unwrap().timed_out = false;
    let (v, d) = decide(&e, &cfg());
    assert_eq!(v, WebVerdict::Unknown, "{d}");
    assert!(d.contains("probe problem"), "{d}");
    // Refused with nothing listening is simply down.
    e.listening = false;
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Down);
}

#[test]
fn slow_probe_and_fast_probe() {
    let e = Evidence {
        probe: Some(probe_ok(1500.0)),
        ..listening()
    };
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Slow);
    let e = Evidence {
        probe: Some(probe_ok(3.0)),
        ..listening()
    };
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Up);
}

#[test]
fn disagreement_is_reported() {
    let e = Evidence {
        queue: 0,
        kernel: Some(KernelEvidence {
            answered: 10,
            ..Default::default()
        }),
        probe: Some(probe_timeout()),
        ..listening()
    };
    assert!(disagreement(WebVerdict::Unknown, &e).is_some());
}

/// A worker of a two-worker pre-fork server, holding `unanswered` requests the oldest `oldest`
/// old, its parent the master holding the listener.
fn worker(oldest: Duration, frozen: bool) -> WorkerView {
    WorkerView {
        pid: 4242,
        command: "puma: cluster worker 1: 4200 [app]".into(),
        parent: 4200,
        parent_holds_listener: true,
        parent_unable: None,
        is_master: false,
        frozen: frozen.then(|| "stopped".into()),
        frozen_ms: 0,
        workers: 2,
        unanswered: 2,
        oldest_unanswered_ms: oldest.as_millis() as u64,
        last_sent_ms: None,
        cpu_percent: (!frozen).then_some(0.0),
        outbound_waiting: 0,
        start: 1,
        listener: 7,
    }
}

/// The others answer: a response went out `since_answer` ago, requests of the stuck worker
/// pending in the kernel's view too.
fn others_answering(since_answer: Duration, w: WorkerView) -> Evidence {
    Evidence {
        kernel: Some(KernelEvidence {
            since_answer: Some(since_answer),
            since_claim: Some(since_answer),
            pending: w.unanswered,
            oldest_pending: Some(ms(w.oldest_unanswered_ms)),
            answered: 100,
            ..Default::default()
        }),
        probe: Some(probe_ok(2.0)),
        workers: vec![w],
        ..listening()
    }
}

#[test]
fn one_stopped_worker_while_the_others_answer_is_a_partial_hang_naming_it() {
    let (v, why) = decide(&others_answering(ms(10), worker(ms(600), true)), &cfg());
    assert_eq!(v, WebVerdict::PartialHang, "{why}");
    for part in [
        "4242",
        "puma: cluster worker 1",
        "stopped",
        "2 requests",
        "0.6s",
        "4200",
    ] {
        assert!(why.contains(part), "{part} in {why}");
    }
    // Under the freeze confirmation, not yet; the next look lands on it.
    let e = others_answering(ms(10), worker(ms(300), true));
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::PartialHang);
    let now = Instant::now();
    assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(202));
}

/// A worker stopped while it held nothing (its sibling takes every connection, nothing
/// waits): stuck all the same once stopped for the freeze confirmation, its share of the
/// capacity named; before that, not yet, and the next look lands on it.
#[test]
fn a_worker_stopped_holding_nothing_is_a_partial_hang_naming_its_share() {
    let idle = |frozen_ms: u64| WorkerView {
        unanswered: 0,
        oldest_unanswered_ms: 0,
        frozen_ms,
        ..worker(ms(0), true)
    };
    let (v, why) = decide(&others_answering(ms(10), idle(700)), &cfg());
    assert_eq!(v, WebVerdict::PartialHang, "{why}");
    for part in [
        "process 4242 (puma: cluster worker 1",
        "stopped for 0.7s, holding no request",
        "1 of 2 workers: 50% of the capacity gone",
    ] {
        assert!(why.contains(part), "{part:?} in {why}");
    }
    let e = others_answering(ms(10), idle(300));
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Up);
    let now = Instant::now();
    assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(202));
    // The kernel's last answer is older than the stop (its programs detached while all was
    // well), the probe answered: the others answer. The probe unanswered too: not this rule's.
    let mut stale = others_answering(ms(5000), idle(700));
    if let Some(k) = stale.kernel.as_mut() {
        k.oldest_pending = None;
    }
    assert_eq!(decide(&stale, &cfg()).0, WebVerdict::PartialHang);
    // Connections wait that nobody answers (every worker stopped, the probe's last answer
    // from before): the hang rules', never a partial hang on a stale probe.
    let mut queued = stale.clone();
    queued.queue = 3;
    assert_ne!(decide(&queued, &cfg()).0, WebVerdict::PartialHang);
    stale.probe = Some(probe_timeout());
    assert_ne!(decide(&stale, &cfg()).0, WebVerdict::PartialHang);
}

#[test]
fn a_deadlocked_worker_needs_unanswered_after_no_cpu_and_no_outbound_request() {
    let c = cfg();
    let e = |w: WorkerView| others_answering(ms(10), w);
    let stuck = worker(c.unanswered_after, false);
    let (v, why) = decide(&e(stuck.clone()), &c);
    assert_eq!(v, WebVerdict::PartialHang, "{why}");
    assert!(why.contains("sent nothing for 10.0s"), "{why}");
    // Younger than unanswered_after: the other rules (here: slow, requests wait while
    // answers go out).
    let young = worker(c.unanswered_after - ms(500), false);
    assert_eq!(decide(&e(young), &c).0, WebVerdict::Slow);
    // It sent something on another connection recently: it moves.
    let moving = WorkerView {
        last_sent_ms: Some(200),
        ..stuck.clone()
    };
    assert_ne!(decide(&e(moving), &c).0, WebVerdict::PartialHang);
    // It burns CPU (a long computation), or its CPU is not known yet.
    for cpu in [Some(60.0), None] {
        let busy = WorkerView {
            cpu_percent: cpu,
            ..stuck.clone()
        };
        assert_ne!(decide(&e(busy), &c).0, WebVerdict::PartialHang, "{cpu:?}");
    }
    // It waits on its own outbound request: a slow query is not a stuck worker.
    let querying = WorkerView {
        outbound_waiting: 1,
        ..stuck
    };
    assert_ne!(decide(&e(querying), &c).0, WebVerdict::PartialHang);
}

#[test]
fn nobody_else_answering_is_not_a_partial_hang() {
    // No answer went out since the stuck worker's oldest request came in: the whole server
    // is stuck, and the hang rules decide.
    let e = others_answering(ms(5000), worker(ms(3000), true));
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::PartialHang);
    // Every process stopped: hung, as before.
    let mut e = others_answering(ms(5000), worker(ms(3000), true));
    e.frozen = Some("server processes 4200 stopped, 4242 stopped".into());
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
    // Without the kernel view, an answered probe is the others answering.
    let mut e = others_answering(ms(10), worker(ms(600), true));
    e.kernel = None;
    assert_eq!(decide(&e, &cfg()).0, WebVerdict::PartialHang);
    e.probe = Some(probe_timeout());
    assert_ne!(decide(&e, &cfg()).0, WebVerdict::PartialHang);
}

#[test]
fn a_partial_hang_is_named_whatever_its_parent_but_says_who_can_replace_it() {
    let orphan = WorkerView {
        parent_holds_listener: false,
        ..worker(ms(800), true)
    };
    let (v, why) = decide(&others_answering(ms(10), orphan), &cfg());
    assert_eq!(v, WebVerdict::PartialHang);
    assert!(why.contains("does not hold the listener"), "{why}");
    let master_stopped = WorkerView {
        parent_unable: Some("stopped".into()),
        ..worker(ms(800), true)
    };
    let (_, why) = decide(&others_answering(ms(10), master_stopped), &cfg());
    assert!(why.contains("(the master) is stopped"), "{why}");
}
