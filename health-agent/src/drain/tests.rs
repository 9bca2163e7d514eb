use std::net::IpAddr;

use super::*;
use crate::status::Recommendation;

fn decision(status: Status, http: u16) -> Decision {
    Decision {
        status,
        http,
        recommendation: Recommendation::Stable,
        reasons: vec!["web backend down: nothing listens".into()],
        faults: Vec::new(),
        shared_dependency: false,
        erroring_alone: false,
    }
}

fn progress(reads: u64, in_flight: u32, last_new: Option<Instant>, read_at: Instant) -> Progress {
    Progress {
        reads,
        read_at: Some(read_at),
        in_flight,
        in_flight_at_start: Some(3),
        last_new,
        ..Progress::default()
    }
}

const QUIET: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn drained_only_after_quiet_with_nothing_in_flight() {
    let t0 = Instant::now();
    let now = t0 + Duration::from_secs(5);
    // A request 1 s ago: not quiet for 2 s yet.
    let p = progress(40, 0, Some(now - Duration::from_secs(1)), now);
    assert_eq!(
        judge(&p, t0, t0, now, QUIET, TIMEOUT, true),
        Judgement::Draining
    );
    // Quiet for 3 s but one request in flight (a 5 s request): not drained.
    let p = progress(40, 1, Some(now - Duration::from_secs(3)), now);
    assert_eq!(
        judge(&p, t0, t0, now, QUIET, TIMEOUT, true),
        Judgement::Draining
    );
    // Quiet and nothing in flight: drained, and the line says how it went.
    let p = progress(40, 0, Some(now - Duration::from_secs(3)), now);
    match judge(&p, t0, t0, now, QUIET, TIMEOUT, true) {
        Judgement::Drained(m) => assert_eq!(
            m,
            "drained in 5.0 s (last new request 3.0 s ago; 3 were in flight at the start)"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn quiet_counts_from_the_drains_start_and_needs_fresh_reads() {
    let t0 = Instant::now();
    // Nothing arrived for a minute before the drain: the balancer may not have seen the 503
    // yet, so the quiet spell starts with the drain.
    let now = t0 + Duration::from_secs(1);
    let p = progress(10, 0, Some(t0 - Duration::from_secs(60)), now);
    assert_eq!(
        judge(&p, t0, t0, now, QUIET, TIMEOUT, true),
        Judgement::Draining
    );
    // A second command asks later: it needs a read made after it asked.
    let asked = t0 + Duration::from_secs(30);
    let p = progress(300, 0, None, asked - Duration::from_millis(50));
    assert_eq!(
        judge(&p, t0, asked, asked, QUIET, TIMEOUT, true),
        Judgement::Draining
    );
}

#[test]
fn a_timeout_names_the_senders() {
    let t0 = Instant::now();
    let now = t0 + TIMEOUT;
    let mut p = progress(100, 1, Some(now), now);
    let a: IpAddr = "127.0.0.2".parse().unwrap();
    let b: IpAddr = "127.0.0.3".parse().unwrap();
    for i in (0..30).rev() {
        p.add(now - Duration::from_millis(100 * i), Some(a), 1);
    }
    p.add(now, Some(b), 1);
    p.add(now, None, 1);
    match judge(&p, t0, t0, now, QUIET, TIMEOUT, true) {
        Judgement::TimedOut(m) => assert_eq!(
            m,
            "not drained after 10.0 s: 32 new requests in the last 10 s from 127.0.0.2 (30), \
             127.0.0.3 (1), unseen (1); 1 in flight (unseen = new requests the kernel counted \
             on connections that opened and closed between two of the agent's looks at the \
             port (every 100 ms), so their sender is not known)"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_command_times_out_on_the_drains_clock() {
    // Drained 24 s ago; a second `drain --timeout 5s` while a sender keeps coming.
    let t0 = Instant::now();
    let asked = t0 + Duration::from_secs(24);
    let now = asked + Duration::from_secs(5);
    let a: IpAddr = "127.0.0.2".parse().unwrap();
    let mut p = progress(290, 0, Some(now), now);
    p.add(now, Some(a), 3);
    let (line, _) = judge::progress_line(&p, t0, now - Duration::from_millis(900), false);
    assert!(line.starts_with("draining 28.1s: "), "{line}");
    let timeout = Duration::from_secs(5);
    match judge(&p, t0, asked, now, QUIET, timeout, true) {
        Judgement::TimedOut(m) => assert_eq!(
            m,
            "not drained after 29.0 s (timed out 5.0 s after this command asked): 3 new \
             requests in the last 10 s from 127.0.0.2 (3); 0 in flight"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_first_progress_line_naming_unseen_senders_says_what_they_are() {
    let t0 = Instant::now();
    let a: IpAddr = "127.0.0.2".parse().unwrap();
    let mut lines = ProgressLines::default();
    let mut p = progress(10, 0, None, t0);
    let at = |s| t0 + Duration::from_secs(s);
    // Named senders only: nothing to explain.
    p.add(at(1), Some(a), 2);
    let first = lines.next(&p, t0, at(1));
    assert_eq!(
        first,
        "draining 1.0s: 0 in flight, 2 new in the last second from 127.0.0.2 (2), last new \
         request 0.0s ago"
    );
    // The first unseen: explained in the line itself.
    p.add(at(3), None, 4);
    let second = lines.next(&p, t0, at(3));
    assert!(
        second.starts_with("draining 3.0s: 0 in flight, 4 new in the last second from unseen (4)")
            && second.ends_with(&format!("({})", judge::unseen_means())),
        "{second}"
    );
    // Then named only.
    p.add(at(5), None, 1);
    let third = lines.next(&p, t0, at(5));
    assert!(
        third.contains("unseen (1)") && !third.contains("not known"),
        "{third}"
    );
}

#[test]
fn details_say_drained_with_the_result_once_judged() {
    let drain = Drain::new(None, true, Duration::ZERO);
    drain.start(By::Command).unwrap();
    let report = drain.report(Instant::now()).unwrap();
    assert_eq!((report.state, report.result.as_deref()), ("draining", None));
    let started = drain.progress().unwrap().1;
    // The watcher has read the port, and nothing came: the command judges it drained.
    {
        let mut g = drain.lock();
        g.progress = progress(5, 0, None, Instant::now());
    }
    let since = started;
    let j = drain.judge(Duration::ZERO, TIMEOUT, since).unwrap();
    let Judgement::Drained(printed) = j else {
        panic!("{j:?}")
    };
    let report = drain.report(Instant::now()).unwrap();
    assert_eq!(report.state, "drained");
    assert_eq!(report.result.as_deref(), Some(printed.as_str()));
    // A second command watches again: draining, no result, until it judges.
    drain.start(By::Command).unwrap();
    let again = drain.report(Instant::now()).unwrap();
    assert_eq!((again.state, again.result.as_deref()), ("draining", None));
    assert!(again.judged > 0);
}

#[tokio::test]
async fn a_command_waits_until_the_result_is_published() {
    let drain = Drain::new(None, false, Duration::ZERO);
    drain.start(By::Command).unwrap();
    let since = Instant::now() - QUIET;
    assert!(matches!(
        drain.judge(QUIET, TIMEOUT, since),
        Some(Judgement::Drained(_))
    ));
    let judged = drain.report(Instant::now()).unwrap().judged;
    // Not published yet: the wait runs to its limit.
    let t = Instant::now();
    drain.until_shown(Duration::from_millis(200)).await;
    assert!(t.elapsed() >= Duration::from_millis(200));
    // Published (by another task, as the runner does): the wait ends at once.
    let publisher = drain.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        publisher.published(judged);
    });
    let t = Instant::now();
    drain.until_shown(Duration::from_secs(10)).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn without_a_watched_backend_the_drain_only_waits_and_says_so() {
    let t0 = Instant::now();
    let p = Progress::default();
    assert_eq!(
        judge(
            &p,
            t0,
            t0,
            t0 + Duration::from_secs(1),
            QUIET,
            TIMEOUT,
            false
        ),
        Judgement::Draining
    );
    match judge(&p, t0, t0, t0 + QUIET, QUIET, TIMEOUT, false) {
        Judgement::Drained(m) => assert!(m.contains("web.port is 0"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn draining_is_a_503_that_keeps_real_faults_and_needs_no_restart_for_a_stopped_backend() {
    let drain = Drain::new(None, true, Duration::from_secs(30));
    let now = Instant::now();
    let healthy = decision(Status::Healthy, 200);
    assert_eq!(
        drain.apply(healthy.clone(), WebVerdict::Up, None, now),
        healthy
    );
    drain.start(By::Command).unwrap();
    let d = drain.apply(healthy, WebVerdict::Up, None, now);
    assert_eq!((d.status, d.http), (Status::Draining, 503));
    assert!(
        d.reasons[0].starts_with("draining: started by the drain command"),
        "{d:?}"
    );
    // A hung backend while draining stays unhealthy: self-healing and its alert go on.
    let hung = decision(Status::Unhealthy, 503);
    assert_eq!(drain.apply(hung.clone(), WebVerdict::Hung, None, now), hung);
    assert!(drain.heal_allowed(WebVerdict::Hung, now));
    // A backend stopped while drained is the deploy's doing: draining, no restart.
    let down = drain.apply(
        decision(Status::Unhealthy, 503),
        WebVerdict::Down,
        None,
        now,
    );
    assert_eq!((down.status, down.http), (Status::Draining, 503));
    assert!(!drain.heal_allowed(WebVerdict::Down, now));
}

#[test]
fn undrain_waits_for_the_backend_to_answer_again() {
    let drain = Drain::new(None, true, Duration::from_secs(30));
    let t0 = Instant::now();
    drain.start(By::Command).unwrap();
    assert!(drain.undrain().unwrap());
    assert!(!drain.undrain().unwrap(), "a second undrain finds none");
    let healthy = decision(Status::Healthy, 200);
    // Its last answer came before the undrain (the app restarting): booting, 503.
    let d = drain.apply(healthy.clone(), WebVerdict::Up, Some(t0), Instant::now());
    assert_eq!((d.status, d.http), (Status::Booting, 503));
    assert_eq!(drain.report(Instant::now()).unwrap().state, "returning");
    // Not listening yet within the boot grace: no restart.
    assert!(!drain.heal_allowed(WebVerdict::Down, Instant::now()));
    // It answered since: in rotation, and the drain is over.
    let later = Instant::now() + Duration::from_millis(10);
    assert_eq!(
        drain.apply(healthy.clone(), WebVerdict::Up, Some(later), later),
        healthy
    );
    assert!(drain.report(later).is_none());
    assert!(drain.heal_allowed(WebVerdict::Down, later));
}

#[test]
fn the_kernels_count_leaves_the_agents_probes_out() {
    let drain = Drain::new(None, true, Duration::from_secs(30));
    let t0 = Instant::now();
    drain.start(By::Command).unwrap();
    drain.note_kernel(Some(100), 7, t0);
    // One probe begun, its connection counted: nothing from others.
    drain.note_kernel(Some(100), 8, t0);
    drain.note_kernel(Some(101), 8, t0 + Duration::from_millis(250));
    assert_eq!(drain.lock().progress.kernel_total, 0);
    // Three more arrivals and no probe: three from others.
    drain.note_kernel(Some(104), 8, t0 + Duration::from_millis(500));
    assert_eq!(drain.lock().progress.kernel_total, 3);
    // The programs attached again (the count restarts): nothing is made up.
    drain.note_kernel(Some(2), 8, t0 + Duration::from_millis(750));
    drain.note_kernel(None, 8, t0 + Duration::from_secs(1));
    drain.note_kernel(Some(5), 8, t0 + Duration::from_millis(1250));
    assert_eq!(drain.lock().progress.kernel_total, 3);
}

#[test]
fn a_drain_is_kept_on_disk_until_undrain() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state/drain.json");
    let drain = Drain::new(Some(file.clone()), true, Duration::from_secs(30));
    drain.start(By::LifecycleHook).unwrap();
    let report = drain.report(Instant::now()).unwrap();
    assert_eq!(report.persisted, Some(true));
    // The agent restarts: still draining, by the same starter, and it says it was kept.
    let again = Drain::new(Some(file.clone()), true, Duration::from_secs(30));
    assert!(again.draining());
    let d = again.apply(
        decision(Status::Healthy, 200),
        WebVerdict::Up,
        None,
        Instant::now(),
    );
    assert_eq!(d.status, Status::Draining);
    assert!(
        d.reasons[0].contains("lifecycle hook")
            && d.reasons[0].contains("kept across an agent restart"),
        "{d:?}"
    );
    assert!(again.undrain().unwrap());
    assert!(!file.exists());
    assert!(!Drain::new(Some(file), true, Duration::from_secs(30)).draining());
}

#[test]
fn a_state_file_that_cannot_be_written_is_said_and_the_drain_holds() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the directory should be.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, "").unwrap();
    let drain = Drain::new(
        Some(blocker.join("drain.json")),
        true,
        Duration::from_secs(30),
    );
    let e = drain.start(By::Command).unwrap_err();
    assert!(e.to_string().contains("blocker/drain.json"), "{e}");
    assert!(drain.draining());
    assert_eq!(drain.report(Instant::now()).unwrap().persisted, Some(false));
}

#[test]
fn a_restart_through_a_drain_never_publishes_unhealthy() {
    // The composer's order: the drain, then the flap guard (fail_after 3 s, recover_after 4 s).
    let drain = Drain::new(None, true, Duration::from_secs(30));
    let mut guard = crate::policy::FlapGuard::new(Duration::from_secs(3), Duration::from_secs(4));
    let t0 = Instant::now();
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    let mut publish = |d: Decision, v: WebVerdict, answered: Option<Instant>, t: Instant| {
        guard.apply(drain.apply(d, v, answered, t), t)
    };
    let up = decision(Status::Healthy, 200);
    let down = decision(Status::Unhealthy, 503);
    assert_eq!(publish(up.clone(), WebVerdict::Up, Some(t0), t0).http, 200);
    drain.start(By::Command).unwrap();
    // Out at once, whatever fail_after says.
    let d = publish(up.clone(), WebVerdict::Up, Some(t0), at(0.25));
    assert_eq!((d.status, d.http), (Status::Draining, 503));
    // The deploy stops the app for 5 s: draining all along.
    for i in 1..=20 {
        let d = publish(
            down.clone(),
            WebVerdict::Down,
            Some(t0),
            at(0.25 * f64::from(i) + 0.5),
        );
        assert_eq!(d.status, Status::Draining, "{d:?}");
    }
    drain.undrain().unwrap();
    // Not answering since the undrain: booting.
    let d = publish(up.clone(), WebVerdict::Up, Some(t0), at(6.0));
    assert_eq!((d.status, d.http), (Status::Booting, 503));
    // It answers: 200 at once, no recovery held, no "recovering from".
    let answered = Instant::now() + Duration::from_secs(1);
    let d = publish(up.clone(), WebVerdict::Up, Some(answered), at(8.0));
    assert_eq!(d, up);
}

#[test]
fn a_state_file_that_is_no_drain_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("drain.json");
    // Garbage: said in the log, not draining.
    std::fs::write(&file, "{not json").unwrap();
    assert!(!Drain::new(Some(file.clone()), true, Duration::ZERO).draining());
    // A time that is no time: draining (the file says so), from now.
    for t in ["-1.0", "1e300"] {
        std::fs::write(
            &file,
            format!(r#"{{"started_unix":{t},"by":"drain command"}}"#),
        )
        .unwrap();
        let d = Drain::new(Some(file.clone()), true, Duration::ZERO);
        assert!(d.draining(), "{t}");
        assert!(d.report(Instant::now()).unwrap().started.is_some());
    }
}
