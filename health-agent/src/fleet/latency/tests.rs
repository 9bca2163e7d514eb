use super::*;

fn lat(p50: f64, answers: u64) -> PeerLatency {
    PeerLatency {
        p50_ms: p50,
        p90_ms: p50 * 2.0,
        answers,
        window_seconds: 60.0,
        basis: "counted".into(),
        ..PeerLatency::default()
    }
}

fn peers(list: &[(f64, u64)]) -> Vec<(String, PeerLatency)> {
    list.iter()
        .enumerate()
        .map(|(i, (p50, n))| (format!("10.0.0.{i}:8080"), lat(*p50, *n)))
        .collect()
}

#[test]
fn the_comparison_rule() {
    // (case, own (median, answers), peers' (median, answers), outcome)
    type Case<'a> = (&'a str, (f64, u64), &'a [(f64, u64)], &'a str);
    let cases: &[Case] = &[
        (
            "one box 10x its peers",
            (50.0, 200),
            &[(5.0, 200), (5.0, 150)],
            "slow",
        ),
        (
            "exactly 3x, gap 10 ms",
            (15.0, 200),
            &[(5.0, 200), (5.0, 200)],
            "slow",
        ),
        (
            "mild 1.5x is nothing",
            (7.5, 200),
            &[(5.0, 200), (5.0, 200)],
            "alike",
        ),
        (
            "2.9x is nothing",
            (29.0, 200),
            &[(10.0, 200), (10.0, 200)],
            "alike",
        ),
        (
            "3x of sub-millisecond answers is noise",
            (3.0, 200),
            &[(1.0, 200), (1.0, 200)],
            "alike",
        ),
        (
            "the whole fleet slow alike",
            (500.0, 200),
            &[(450.0, 200), (520.0, 200)],
            "alike",
        ),
        (
            "too few answers here",
            (50.0, 9),
            &[(5.0, 200), (5.0, 200)],
            "few here",
        ),
        ("one peer answering", (50.0, 200), &[(5.0, 200)], "no peers"),
        (
            "a peer with too few answers does not count",
            (50.0, 200),
            &[(5.0, 200), (5.0, 3)],
            "no peers",
        ),
        (
            "the peers' median, not their mean: one slow peer",
            (60.0, 200),
            &[(5.0, 200), (6.0, 200), (400.0, 200)],
            "slow",
        ),
        (
            "a low-volume box (sticky sessions) compares per answer",
            (40.0, 12),
            &[(5.0, 5000), (5.0, 4000)],
            "slow",
        ),
    ];
    for (what, own, list, want) in cases {
        let got = compare(&lat(own.0, own.1), &peers(list), 3.0);
        let got = match &got {
            Comparison::Slow(_) => "slow",
            Comparison::Alike(_) => "alike",
            Comparison::TooFewHere(_) => "few here",
            Comparison::NoPeers(_) => "no peers",
        };
        assert_eq!(got, *want, "{what}");
    }
}

#[test]
fn the_reason_names_both_latencies_and_the_ratio() {
    let Comparison::Slow(c) = compare(&lat(48.0, 300), &peers(&[(4.0, 200), (6.0, 200)]), 3.0)
    else {
        panic!("not slow")
    };
    assert_eq!(c.peers_p50_ms, 5.0);
    assert!((c.ratio - 9.6).abs() < 1e-9, "{c:?}");
    let r = c.describe();
    for part in [
        "48.0 ms",
        "300 answers",
        "9.6×",
        "5.0 ms",
        "10.0.0.1:8080 median 6.0 ms",
    ] {
        assert!(r.contains(part), "{part} in {r}");
    }
}

fn flags(slow: bool, out: bool) -> Option<PeerLatency> {
    Some(PeerLatency {
        slow_vs_peers: slow,
        out_slow: out,
        ..PeerLatency::default()
    })
}

#[test]
fn the_cap_is_a_third_of_the_fleet_rounded_down_at_least_one() {
    let want = [(1, 1), (2, 1), (3, 1), (5, 1), (6, 2), (9, 3), (10, 3)];
    for (fleet, n) in want {
        assert_eq!(cap(fleet), n, "fleet of {fleet}");
    }
}

#[test]
fn at_most_the_cap_goes_out_and_the_lowest_id_wins_a_tie() {
    let p = |list: &[(&str, Option<PeerLatency>)]| -> Vec<(String, Option<PeerLatency>)> {
        list.iter()
            .map(|(i, l)| (i.to_string(), l.clone()))
            .collect()
    };
    // Three instances, one slow: it goes out.
    assert!(may_go_out("b", false, &p(&[("a", flags(false, false)), ("c", None)])).is_ok());
    // Two slow at once in three: the lower id goes, the other waits.
    let two = p(&[("a", flags(true, false)), ("c", flags(false, false))]);
    assert!(may_go_out("b", false, &two).is_err());
    let two = p(&[("b", flags(true, false)), ("c", flags(false, false))]);
    assert!(may_go_out("a", false, &two).is_ok());
    // One is out already: a lower id that finds itself slow later waits.
    let held = p(&[("z", flags(true, true)), ("c", flags(false, false))]);
    let why = may_go_out("a", false, &held).unwrap_err();
    assert!(why.contains("at most 1 of the 3"), "{why}");
    // … and the one out stays out.
    let stays = p(&[("a", flags(true, false)), ("c", flags(false, false))]);
    assert!(may_go_out("z", true, &stays).is_ok());
    // Six instances: two may be out.
    let six = p(&[
        ("a", flags(true, true)),
        ("b", flags(false, false)),
        ("c", flags(false, false)),
        ("d", flags(false, false)),
        ("e", flags(false, false)),
    ]);
    assert!(may_go_out("f", false, &six).is_ok());
    let six_full = p(&[
        ("a", flags(true, true)),
        ("b", flags(true, true)),
        ("c", flags(false, false)),
        ("d", flags(false, false)),
        ("e", flags(false, false)),
    ]);
    assert!(may_go_out("f", false, &six_full).is_err());
    // More out than the cap (two went out in the same round): the lowest id stays.
    let raced = p(&[("a", flags(true, true)), ("c", flags(false, false))]);
    assert!(may_go_out("b", true, &raced).is_err());
}

#[test]
fn the_judgement_holds_until_answers_after_a_restart_make_one() {
    let t0 = Instant::now();
    let slow = compare(&lat(50.0, 200), &peers(&[(5.0, 200), (5.0, 200)]), 3.0);
    let few = compare(&lat(50.0, 3), &peers(&[(5.0, 200), (5.0, 200)]), 3.0);
    let fine = compare(&lat(5.0, 200), &peers(&[(5.0, 200), (5.0, 200)]), 3.0);
    let mut t = SlowTracker::default();
    assert!(t.observe(&slow, None, t0).is_some());
    assert_eq!(t.judged_since(), Some(None));
    // A restart returned at t0: three answers since, too few: held, not judged afresh.
    assert!(t.observe(&few, Some(t0), t0).is_some());
    assert_eq!(t.judged_since(), None);
    // Enough answers since it, still slow: judged on them.
    assert!(t.observe(&slow, Some(t0), t0).is_some());
    assert_eq!(t.judged_since(), Some(Some(t0)));
    // Fine: gone.
    assert!(t.observe(&fine, Some(t0), t0).is_none());
    assert_eq!(t.judged_since(), None);
    // No peers to compare: judged alone, as without [fleet].
    assert!(t.observe(&slow, None, t0).is_some());
    let alone = compare(&lat(50.0, 200), &peers(&[(5.0, 200)]), 3.0);
    assert!(t.observe(&alone, None, t0).is_none());
}

/// The answers after a restart compare alike at first and slow two seconds later (a
/// restarted server's CPU quota unspent): the restart is judged on the slow ones, not
/// recovered on the quick ones; alike for RECOVER_FOR, it recovered.
#[test]
fn a_restart_recovers_only_after_its_answers_stay_alike() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let slow = compare(&lat(50.0, 200), &peers(&[(5.0, 200), (5.0, 200)]), 3.0);
    let fine = compare(&lat(5.0, 20), &peers(&[(5.0, 200), (5.0, 200)]), 3.0);
    let mut t = SlowTracker::default();
    assert!(t.observe(&slow, None, t0).is_some());
    // The restart returned at t0 + 1 s; its first answers are quick: held, not judged.
    let back = Some(t0 + s);
    assert!(t.observe(&fine, back, t0 + 2 * s).is_some());
    assert_eq!(t.judged_since(), None);
    assert!(t.observe(&fine, back, t0 + 3 * s).is_some());
    // Slow again: judged on the answers after the return (the restart failed).
    assert!(t.observe(&slow, back, t0 + 4 * s).is_some());
    assert_eq!(t.judged_since(), Some(back));

    // Another incident, another restart whose answers stay alike: recovered after
    // RECOVER_FOR of them, not before.
    let mut t = SlowTracker::default();
    assert!(t.observe(&slow, None, t0).is_some());
    assert!(t.observe(&fine, back, t0 + 2 * s).is_some());
    assert!(t
        .observe(&fine, back, t0 + 2 * s + RECOVER_FOR - s)
        .is_some());
    assert!(t.observe(&fine, back, t0 + 2 * s + RECOVER_FOR).is_none());
    // Once recovered, alike answers clear a new judgement at once (no restart being judged).
    assert!(t.observe(&slow, back, t0 + 20 * s).is_some());
    assert!(t.observe(&fine, back, t0 + 21 * s).is_none());
}

#[test]
fn a_slowdown_seen_here_first_waits_for_the_peers_figures_counted_after_it() {
    // (Peers whose figures all predate it never confirm it: see the asks below.)
    let t0 = Instant::now();
    let view = |i: u8| {
        (
            format!("10.0.0.{i}:8080"),
            crate::fleet::PeerView {
                instance: format!("i-{i}"),
                // Their figures count answers that began a second before they were asked.
                latency: Some(PeerLatency {
                    began_seconds_ago: Some(1.0),
                    ..lat(5.0, 200)
                }),
                ..crate::fleet::PeerView::default()
            },
        )
    };
    let answered = vec![view(1), view(2)];
    let input = |started: Instant, now: Instant| RoundInput {
        own: Some(lat(50.0, 200)),
        since: None,
        answered: Some(&answered),
        threshold: 3.0,
        round_started: Some(started),
        now,
    };
    let mut t = SlowTracker::new(3.0, None);
    let mut report = crate::fleet::FleetReport::default();
    // The peers' views were asked for before it looked slow: it asks them, it is not out.
    assert!(t.round(input(t0, t0), &mut report).is_none());
    assert!(report.asking_latency);
    // Asked for after, but their figures still count answers from before: still asking.
    let soon = t0 + Duration::from_millis(500);
    assert!(t.round(input(soon, soon), &mut report).is_none());
    assert!(report.asking_latency);
    // Asked for once every answer they count began after it looked slow: they confirm it.
    let later = t0 + Duration::from_secs(1);
    assert!(t.round(input(later, later), &mut report).is_some());
    assert!(!report.asking_latency);
    // Alike again: the next slowdown waits for its own confirmation.
    let fine = RoundInput {
        own: Some(lat(5.0, 200)),
        ..input(later, later)
    };
    assert!(t.round(fine, &mut report).is_none());
    let again = later + Duration::from_secs(10);
    assert!(t.round(input(later, again), &mut report).is_none());
    assert!(report.asking_latency);
}

#[test]
fn a_mixed_instances_group_compares_like_with_like() {
    let typed = |p50: f64, t: Option<&str>| PeerLatency {
        instance_type: t.map(String::from),
        ..lat(p50, 200)
    };
    let list = |v: &[(f64, Option<&str>)]| -> Vec<(String, PeerLatency)> {
        v.iter()
            .enumerate()
            .map(|(i, (p50, t))| (format!("10.0.0.{i}:8080"), typed(*p50, *t)))
            .collect()
    };
    // A t3.small among c5.2xlarge peers, 4× their median: not compared, and said why.
    let own = typed(40.0, Some("t3.small"));
    let bigger = list(&[(10.0, Some("c5.2xlarge")), (10.0, Some("c5.2xlarge"))]);
    match compare(&own, &bigger, 3.0) {
        Comparison::NoPeers(why) => {
            assert!(why.contains("of this instance's type (t3.small)"), "{why}");
            assert!(why.contains("10.0.0.0:8080 is c5.2xlarge"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // Two peers of its own type among others: compared with those two only.
    let mixed = list(&[
        (10.0, Some("t3.small")),
        (40.0, Some("c5.2xlarge")),
        (11.0, Some("t3.small")),
    ]);
    match compare(&own, &mixed, 3.0) {
        Comparison::Slow(c) => {
            assert_eq!(c.peers.len(), 2, "{c:?}");
            assert!((c.peers_p50_ms - 10.5).abs() < 0.01, "{c:?}");
        }
        other => panic!("{other:?}"),
    }
    // Peers that do not say their type (older agents) are compared with, as before.
    let untyped = list(&[(10.0, None), (10.0, None)]);
    assert!(matches!(compare(&own, &untyped, 3.0), Comparison::Slow(_)));
}

/// The fleet's round reads this instance's figures as a value and answers what the web
/// monitor's counting should do: nothing while all is alike; count every answer now when its
/// newest window was starved or it looks slow; cut the span once, at a restart's return.
#[test]
fn the_round_asks_the_counting_what_its_figures_call_for() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let view = |i: u8, p50: f64| {
        (
            format!("10.0.0.{i}:8080"),
            crate::fleet::PeerView {
                instance: format!("i-{i}"),
                latency: Some(lat(p50, 200)),
                ..crate::fleet::PeerView::default()
            },
        )
    };
    let round = crate::fleet::Round {
        started: Some(t0),
        answered: vec![view(1, 5.0), view(2, 5.0)],
        ..crate::fleet::Round::default()
    };
    let mut t = SlowTracker::new(3.0, None);
    let mut report = crate::fleet::FleetReport::default();
    let alike = OwnAnswers {
        judged: Some(lat(5.0, 200)),
        newest: Some(lat(5.0, 20)),
        starved: false,
    };
    let (slow, asks) = t.round_of(alike.clone(), None, Some(&round), &mut report, t0);
    assert!(slow.is_none());
    assert_eq!(asks, CountingAsks::default(), "alike: nothing asked");

    // Its newest counting window mostly unanswered: count every answer from now on.
    let starved = OwnAnswers {
        starved: true,
        ..alike.clone()
    };
    let (slow, asks) = t.round_of(starved, None, Some(&round), &mut report, t0 + s);
    assert!(slow.is_none());
    assert!(asks.count_now && asks.cut_after.is_none(), "{asks:?}");
    assert!(t.measuring(t0 + s).is_some());

    // Three answers, slow against the peers: too few to judge, enough to count them all.
    let few_slow = OwnAnswers {
        judged: None,
        newest: Some(lat(50.0, 3)),
        starved: false,
    };
    let (slow, asks) = t.round_of(few_slow, None, Some(&round), &mut report, t0 + 2 * s);
    assert!(slow.is_none());
    assert!(asks.count_now, "{asks:?}");

    // A restart returned at t0 + 3 s: the span is cut after it, once.
    let back = Some(t0 + 3 * s);
    let (_, asks) = t.round_of(alike.clone(), back, Some(&round), &mut report, t0 + 4 * s);
    assert_eq!(asks.cut_after, back);
    let (_, asks) = t.round_of(alike, back, Some(&round), &mut report, t0 + 5 * s);
    assert_eq!(asks.cut_after, None, "the same return is cut once");
}
