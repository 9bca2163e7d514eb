//! The estimator against simulated servers whose offered load is known exactly: Poisson
//! arrivals, exponential service, c workers, read at 250 ms ticks as the agent reads the kernel.

use super::*;

const TICK: Duration = Duration::from_millis(250);
const WINDOW: Duration = Duration::from_secs(60);

/// A small deterministic generator (xorshift), so the tests are repeatable.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.uniform().ln()
    }
}

/// One request: when it arrived, when a worker took it, when it was answered (seconds).
struct Job {
    arrive: f64,
    start: f64,
    end: f64,
}

/// FIFO with `c` workers; `reads_early`: the server reads every request on arrival and
/// queues it inside (Puma's reactor), so the kernel sees it pending, not waiting.
fn simulate(rho: f64, c: usize, service: f64, secs: f64, seed: u64) -> Vec<Job> {
    let mut rng = Rng(seed);
    let lambda = rho * c as f64 / service;
    let mut free = vec![0.0f64; c];
    let mut jobs = Vec::new();
    let mut t = 0.0;
    loop {
        t += rng.exp(1.0 / lambda);
        if t > secs {
            return jobs;
        }
        let (i, &at) = free
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .unwrap();
        let start = at.max(t);
        let end = start + rng.exp(service);
        free[i] = end;
        jobs.push(Job {
            arrive: t,
            start,
            end,
        });
    }
}

/// What the kernel counters read at `t`.
fn read(jobs: &[Job], t: f64, reads_early: bool) -> LoadSample {
    let mut s = LoadSample::default();
    for j in jobs {
        if j.arrive <= t {
            s.established += 1;
        }
        if j.end <= t {
            s.answered += 1;
        }
        let taken = if reads_early { j.arrive } else { j.start };
        if taken <= t && t < j.end {
            s.pending += 1;
        } else if j.arrive <= t && t < taken {
            s.waiting += 1;
        }
    }
    s
}

/// Feeds `secs` of ticks to a meter; returns it and the instant of the last tick.
fn run(meter: &mut Meter, jobs: &[Job], secs: f64, reads_early: bool) -> Instant {
    let t0 = Instant::now();
    let ticks = (secs / TICK.as_secs_f64()) as u32;
    for i in 0..=ticks {
        let t = TICK.as_secs_f64() * f64::from(i);
        meter.tick(t0 + TICK * i, read(jobs, t, reads_early));
    }
    t0 + TICK * ticks
}

#[test]
fn offered_load_not_requests_in_system_near_capacity() {
    // SPEC: five workers at ρ = 0.9; "requests in the system / c" gives about 2.3 (M/M/5,
    // when everything waiting counts). The estimator must stay with the offered load.
    let jobs = simulate(0.9, 5, 0.05, 240.0, 7);
    let mut m = Meter::new(Duration::from_secs(240), 5, 2);
    let now = run(&mut m, &jobs, 240.0, true);
    let e = m.estimate(now, None).unwrap();
    let web = e.web.unwrap();
    assert!(
        (web - 0.9).abs() < 0.08,
        "web part {web}, want ≈ 0.9: {e:?}"
    );
    // The wrong estimator, on the same data, overshoots.
    let wrong = e.load.in_server / 5.0;
    assert!(wrong > 1.3, "requests in the system / c = {wrong}: {e:?}");
}

#[test]
fn tracks_offered_load_from_idle_to_overload() {
    let mut last = 0.0;
    for (i, rho) in [0.25, 0.5, 0.75, 1.0, 1.5, 2.0].into_iter().enumerate() {
        let jobs = simulate(rho, 4, 0.05, 60.0, 11 + i as u64);
        let mut m = Meter::new(WINDOW, 4, 2);
        let now = run(&mut m, &jobs, 60.0, false);
        let web = m.estimate(now, None).unwrap().web.unwrap();
        let tolerance = if rho <= 1.0 { 0.1 } else { 0.25 };
        assert!(
            (web - rho).abs() < tolerance,
            "ρ = {rho}: web part {web} (tolerance {tolerance})"
        );
        assert!(
            web > last,
            "ρ = {rho}: {web} not above the step before, {last}"
        );
        last = web;
    }
}

#[test]
fn learns_the_workers_where_work_starts_to_wait() {
    let jobs = simulate(1.3, 6, 0.05, 60.0, 3);
    let mut m = Meter::new(WINDOW, 0, 2);
    assert_eq!(m.capacity().basis, Basis::Unknown);
    let now = run(&mut m, &jobs, 60.0, false);
    let cap = m.capacity();
    assert_eq!(
        (cap.workers, cap.basis),
        (Some(6), Basis::Learned),
        "{cap:?}"
    );
    assert_eq!(
        (cap.cores, cap.cores_basis),
        (2.0, Basis::Unknown),
        "no CPU readings: every core of the host"
    );
    let web = m.estimate(now, None).unwrap().web.unwrap();
    assert!((web - 1.3).abs() < 0.25, "{web}");
}

#[test]
fn a_server_that_reads_everything_early_teaches_nothing() {
    // Its accept queue stays empty however full it is: the hand-over is invisible, and the
    // report must say so rather than guess.
    let jobs = simulate(0.9, 4, 0.05, 60.0, 5);
    let mut m = Meter::new(WINDOW, 0, 2);
    let now = run(&mut m, &jobs, 60.0, true);
    assert_eq!(m.capacity().basis, Basis::Unknown);
    assert_eq!(m.estimate(now, None).unwrap().web, None);
    let r = assess(
        m.estimate(now, None).as_ref(),
        None,
        m.capacity(),
        &cx(None, None),
    );
    assert!(r.note.as_deref().unwrap().contains("web.workers"), "{r:?}");
}

/// 50 s of half load on four workers (seed `seed`), ticked into a meter: the meter, the first
/// tick's instant, the last sample (to stall from) and the web part it gave.
fn half_load(seed: u64) -> (Meter, Instant, LoadSample, f64) {
    let jobs = simulate(0.5, 4, 0.05, 50.0, seed);
    let mut m = Meter::new(WINDOW, 4, 2);
    let t0 = Instant::now();
    let mut s = LoadSample::default();
    for i in 0..=200u32 {
        s = read(&jobs, TICK.as_secs_f64() * f64::from(i), false);
        m.tick(t0 + TICK * i, s);
    }
    let before = m.estimate(t0 + TICK * 200, None).unwrap().web.unwrap();
    (m, t0, s, before)
}

#[test]
fn blocked_work_is_dropped_with_what_led_up_to_it() {
    // Half load for 50 s; then a dependency stalls every worker: arrivals go on, nothing is
    // answered. The agent notices after 2 s and withholds.
    let (mut m, t0, mut s, before) = half_load(9);
    for i in 201..=280u32 {
        s.established += 10;
        s.pending = 4;
        s.waiting += 10;
        let held = i >= 209; // noticed 2 s in
        m.hold(t0 + TICK * i, held, Duration::from_secs(5));
        m.tick(t0 + TICK * i, s);
    }
    let during = m.estimate(t0 + TICK * 280, None).unwrap().web.unwrap();
    assert!(
        (during - before).abs() < 0.05,
        "during the stall {during}, before {before}"
    );
}

#[test]
fn a_cpu_bound_server_is_measured_against_the_cores_it_used_when_full() {
    // One core's worth of CPU at saturation (threads sharing a lock), then half of it.
    let mut m = Meter::new(WINDOW, 4, 2);
    let t0 = Instant::now();
    let mut s = LoadSample {
        backend_cpu_seconds: Some(0.0),
        ..LoadSample::default()
    };
    let mut cpu = 0.0;
    for i in 0..=40u32 {
        s.established += 12;
        s.answered += 12;
        s.pending = 4;
        s.waiting = 3;
        cpu += 0.25 * 0.98;
        s.backend_cpu_seconds = Some(cpu);
        m.tick(t0 + TICK * i, s);
    }
    assert_eq!(
        (m.capacity().cores, m.capacity().cores_basis),
        (0.98, Basis::Learned)
    );
    let mut m2 = Meter::new(WINDOW, 4, 2);
    m2.full_cpu = m.full_cpu.clone();
    for i in 0..=40u32 {
        s.established += 6;
        s.answered += 6;
        s.pending = 1;
        s.waiting = 0;
        cpu += 0.25 * 0.5;
        s.backend_cpu_seconds = Some(cpu);
        m2.tick(t0 + TICK * i, s);
    }
    let e = m2.estimate(t0 + TICK * 40, None).unwrap();
    let part = e.backend_cpu.unwrap();
    assert!((part - 0.5).abs() < 0.05, "{part}: {e:?}");
}

fn cx(host: Option<HostLoad>, withheld: Option<&str>) -> Context {
    Context {
        host,
        memory_low_percent: 30.0,
        memory_high_percent: 90.0,
        withheld: withheld.map(String::from),
        no_kernel: None,
        window: WINDOW,
    }
}

fn estimate(web: f64) -> Estimate {
    Estimate {
        web: Some(web),
        backend_cpu: Some(0.05),
        seconds: 60.0,
        ..Estimate::default()
    }
}

#[test]
fn s_is_the_largest_part_and_names_it() {
    let cap = Meter::new(WINDOW, 4, 2).capacity();
    let host = HostLoad {
        cpu_percent: 20.0,
        memory_percent: 60.0,
    };
    let r = assess(
        Some(&estimate(0.42)),
        None,
        cap.clone(),
        &cx(Some(host), None),
    );
    assert_eq!((r.ratio, r.largest), (Some(0.5), Some("memory")), "{r:?}");
    assert_eq!(r.parts.cpu, Some(0.2));
    let r = assess(
        Some(&estimate(1.7)),
        None,
        cap.clone(),
        &cx(Some(host), None),
    );
    assert_eq!((r.ratio, r.largest), (Some(1.7), Some("web")), "not capped");
    assert_eq!(r.summary(), "170%");
    assert_eq!(r.capacity.basis, Basis::Configured);
    let quiet = HostLoad {
        cpu_percent: 5.0,
        memory_percent: 20.0,
    };
    let r = assess(Some(&estimate(0.1)), None, cap, &cx(Some(quiet), None));
    assert_eq!(
        r.parts.memory,
        Some(0.0),
        "below memory_low_percent is no load"
    );
}

#[test]
fn withheld_publishes_nothing_and_says_why() {
    let cap = Meter::new(WINDOW, 4, 2).capacity();
    let r = assess(
        Some(&estimate(0.6)),
        Some(&estimate(3.0)),
        cap,
        &cx(None, Some("database unreachable")),
    );
    assert_eq!(r.ratio, None);
    assert_eq!(r.withheld.as_deref(), Some("database unreachable"));
    assert_eq!(r.summary(), "withheld");
    assert_eq!(
        r.instant,
        Some(3.0),
        "the blocked work still shows in the details"
    );
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "ratio",
        "instant",
        "parts",
        "capacity",
        "withheld",
        "window_seconds",
    ] {
        assert!(
            v.get(key).is_some(),
            "details.saturation.{key} missing: {v}"
        );
    }
    assert_eq!(v["capacity"]["basis"], "configured");
}

/// A fault the policy puts on the fleet withholds S after the fact; a reason already given
/// stands.
#[test]
fn withheld_after_the_decision_keeps_the_first_reason() {
    let cap = Meter::new(WINDOW, 4, 2).capacity();
    let measured = |withheld| {
        assess(
            Some(&estimate(0.6)),
            Some(&estimate(3.0)),
            cap.clone(),
            &cx(None, withheld),
        )
    };
    assert_eq!(measured(None).ratio, Some(0.6));
    let r = measured(None).withheld_for("a fault most peers share");
    assert_eq!(
        (r.ratio, r.withheld.as_deref(), r.summary().as_str()),
        (None, Some("a fault most peers share"), "withheld")
    );
    assert_eq!(r.instant, Some(3.0), "the blocked work still shows");
    let r = measured(Some("database unreachable")).withheld_for("a fault most peers share");
    assert_eq!(r.withheld.as_deref(), Some("database unreachable"));
}

#[test]
fn nothing_measured_is_unknown_not_zero() {
    let r = SaturationReport::unknown(WINDOW);
    assert_eq!((r.ratio, r.summary().as_str()), (None, "unknown"));
    let m = Meter::new(WINDOW, 4, 2);
    assert_eq!(m.estimate(Instant::now(), None), None);
}

#[test]
fn stalled_work_is_not_load_even_before_the_fault_is_named() {
    // Half load; then nothing is answered while arrivals go on, for 8 s before anyone names
    // the dependency: the window must not show the stall meanwhile.
    let (mut m, t0, mut s, before) = half_load(21);
    for i in 201..=232u32 {
        s.established += 10;
        s.pending = 4;
        s.waiting += 10;
        m.tick(t0 + TICK * i, s);
        let now = m.estimate(t0 + TICK * i, None).unwrap().web.unwrap();
        assert!(
            now <= before + 0.1,
            "{:.2}s into the stall S is {now}, before {before}",
            f64::from(i - 200) / 4.0
        );
    }
    // It was slow work after all: answers go out again, and the stall counts.
    for i in 233..=240u32 {
        s.answered += 12;
        s.established += 2;
        m.tick(t0 + TICK * i, s);
    }
    // Its 10 s of every worker in service, in a 60 s window at half load, add 10/60 × 0.5.
    let after = m.estimate(t0 + TICK * 240, None).unwrap().web.unwrap();
    assert!(
        after > before + 0.08,
        "the slow spell counts once it moved: {after}, {before}"
    );
}

#[test]
fn a_slow_servers_own_rhythm_is_no_stall() {
    // Two workers, 3 s per request: no answer for 3 s at a time is its normal.
    let jobs = simulate(0.5, 2, 3.0, 240.0, 31);
    let mut m = Meter::new(Duration::from_secs(240), 2, 2);
    let now = run(&mut m, &jobs, 240.0, false);
    let web = m.estimate(now, None).unwrap().web.unwrap();
    assert!((web - 0.5).abs() < 0.15, "{web}");
}

/// What sock_diag shows at `t` with the programs detached: requests in service and
/// connections waiting, no counts; `moved`: an answer went out in the tick before.
fn sampled(jobs: &[Job], t: f64) -> LoadSample {
    let counted = read(jobs, t, false);
    let dt = TICK.as_secs_f64();
    LoadSample {
        pending: counted.pending,
        waiting: counted.waiting,
        sampled: true,
        moved: jobs.iter().any(|j| j.end > t - dt && j.end <= t),
        ..LoadSample::default()
    }
}

#[test]
fn sampled_ticks_measure_the_load_in_service_without_counts() {
    // Detached programs (`web.socket_tracing = "on_suspicion"`): requests in service read from
    // sock_diag each tick still give the offered load below capacity, and no rate is made up.
    let jobs = simulate(0.5, 4, 0.2, 120.0, 5);
    let mut m = Meter::new(WINDOW, 4, 2);
    let t0 = Instant::now();
    let ticks = (120.0 / TICK.as_secs_f64()) as u32;
    for i in 0..=ticks {
        m.tick(
            t0 + TICK * i,
            sampled(&jobs, TICK.as_secs_f64() * f64::from(i)),
        );
    }
    let e = m.estimate(t0 + TICK * ticks, None).unwrap();
    let web = e.web.unwrap();
    assert!((web - 0.5).abs() < 0.1, "web part {web}, want ≈ 0.5: {e:?}");
    assert_eq!(e.load.arrivals_per_second, None, "{e:?}");
    assert_eq!(e.load.answered_per_second, None, "{e:?}");

    // Work in service that stops moving (a dependency outage) is left out, as when counted.
    let mut m = Meter::new(WINDOW, 4, 2);
    let stuck = LoadSample {
        pending: 4,
        sampled: true,
        ..LoadSample::default()
    };
    let moving = LoadSample {
        moved: true,
        ..stuck
    };
    for i in 0..=40u32 {
        m.tick(t0 + TICK * i, moving);
    }
    for i in 41..=80u32 {
        m.tick(t0 + TICK * i, stuck);
    }
    let e = m
        .estimate(t0 + TICK * 80, Some(Duration::from_secs(5)))
        .unwrap_or_default();
    assert!(e.seconds < 2.0, "stalled ticks counted as load: {e:?}");
}

#[test]
fn counted_windows_measure_keep_alive_service_by_its_latency() {
    // Keep-alive requests sent the moment their predecessor's answer arrived: sock_diag is
    // unsure between the windows, and at a window's ticks the counters too may catch a
    // request between its read and the previous answer's count. Each window's answers say
    // how long they were in service: 200 a second, 20 ms each, is 4 in service, half of 8
    // workers, whatever the ticks caught.
    let mut m = Meter::new(WINDOW, 8, 2);
    let t0 = Instant::now();
    let blind = LoadSample {
        sampled: true,
        moved: true,
        unsure: true,
        ..LoadSample::default()
    };
    let (mut answered, mut i) = (0u64, 0u32);
    while i < 240 {
        for _ in 0..56 {
            m.tick(t0 + TICK * i, blind);
            i += 1;
        }
        for _ in 0..4 {
            answered += 50; // 200/s over a 250 ms tick
            m.tick(
                t0 + TICK * i,
                LoadSample {
                    established: answered,
                    answered,
                    exchange_us: answered * 20_000,
                    pending: 1,
                    ..LoadSample::default()
                },
            );
            i += 1;
        }
    }
    let e = m.estimate(t0 + TICK * (i - 1), None).unwrap();
    let web = e.web.unwrap();
    assert!((web - 0.5).abs() < 0.05, "web part {web}, want 0.5: {e:?}");
}

#[test]
fn a_freeze_the_counting_programs_attach_into_is_not_load() {
    // Sampled at a light load (one request in service of four workers), then the server's
    // dependency freezes: the programs attach on suspicion and count from zero. The requests
    // stuck in service were read before they attached, so they count none in service; what
    // they see is connections piling up in the accept queue and nothing answered. That is a
    // stall, not a pile-up of offered load to multiply the web part by.
    let mut m = Meter::new(WINDOW, 4, 2);
    let t0 = Instant::now();
    let light = LoadSample {
        pending: 1,
        sampled: true,
        moved: true,
        ..LoadSample::default()
    };
    for i in 0..=40u32 {
        m.tick(t0 + TICK * i, light);
    }
    let before = m.estimate(t0 + TICK * 40, None).unwrap().web.unwrap();
    for (n, i) in (41..=72u32).enumerate() {
        let n = n as u64;
        m.tick(
            t0 + TICK * i,
            LoadSample {
                established: 3 * n,
                answered: 0,
                pending: 0,
                waiting: 3 * n,
                ..LoadSample::default()
            },
        );
        // The stall is recognised after STALL_AFTER without an answer, and then taken back
        // to the last answer; until then a few arrivals move the ratio a little.
        let into = f64::from(i - 40) * TICK.as_secs_f64();
        let allowed = if into > 1.5 { 0.01 } else { 0.25 };
        if let Some(web) = m.estimate(t0 + TICK * i, None).and_then(|e| e.web) {
            assert!(
                web <= before + allowed,
                "the web part rose from {before} to {web} {into:.2} s into the freeze"
            );
        }
    }
}

#[test]
fn sampled_ticks_that_cannot_see_requests_in_service_give_no_web_part() {
    // Back-to-back keep-alive requests under detached programs: sock_diag reads them as
    // answered, so the requests in service it reports are too few. No figure, and a note
    // that says why, rather than spare workers that are not there.
    let mut m = Meter::new(WINDOW, 4, 2);
    let t0 = Instant::now();
    let blind = LoadSample {
        pending: 0,
        sampled: true,
        moved: true,
        unsure: true,
        ..LoadSample::default()
    };
    for i in 0..=40u32 {
        m.tick(t0 + TICK * i, blind);
    }
    let e = m.estimate(t0 + TICK * 40, None).unwrap();
    assert_eq!(e.web, None, "{e:?}");
    assert!(e.unsure);
    let r = assess(Some(&e), Some(&e), m.capacity(), &cx(None, None));
    assert_eq!(r.parts.web, None, "{r:?}");
    assert!(
        r.note.as_deref().is_some_and(|n| n.contains("jiffy")),
        "{r:?}"
    );

    // Counting windows (the programs attached for a moment now and then) measure what the
    // samples miss: the web part comes from them alone, not diluted by the blind samples.
    let mut w = Meter::new(WINDOW, 4, 2);
    let (mut n, mut i) = (0u64, 0u32);
    while i < 240 {
        for _ in 0..8 {
            w.tick(t0 + TICK * i, blind);
            i += 1;
        }
        for _ in 0..4 {
            n += 10;
            // Ten answers a 250 ms tick with two in service: 50 ms each.
            let counted = LoadSample {
                established: n,
                answered: n,
                exchange_us: n * 50_000,
                pending: 2,
                ..LoadSample::default()
            };
            w.tick(t0 + TICK * i, counted);
            i += 1;
        }
    }
    let e = w.estimate(t0 + TICK * (i - 1), None).unwrap();
    assert!(e.unsure, "{e:?}");
    let web = e.web.expect("counted ticks give a web part");
    assert!(
        (web - 0.5).abs() < 0.05,
        "2 of 4 workers busy while counted: {web}"
    );
    let r = assess(Some(&e), Some(&e), w.capacity(), &cx(None, None));
    assert_eq!(r.note, None, "{r:?}");

    // A span with a single window: its two counted ticks, run a few ms early, are enough.
    let mut one = Meter::new(WINDOW, 4, 2);
    let early = Duration::from_millis(245);
    let mut t = t0;
    for _ in 0..40 {
        one.tick(t, blind);
        t += TICK;
    }
    // The tick that attaches (not counted: nothing to count from), then two counted ones.
    for k in 1..=3u64 {
        // A hundred answers a 245 ms tick with two in service: 4.9 ms each.
        let counted = LoadSample {
            established: 100 * k,
            answered: 100 * k,
            exchange_us: 100 * k * 4_900,
            pending: 2,
            ..LoadSample::default()
        };
        one.tick(t, counted);
        t += early;
    }
    for _ in 0..20 {
        one.tick(t, blind);
        t += TICK;
    }
    let e = one.estimate(t - TICK, None).unwrap();
    let web = e.web.expect("one window's counted ticks give a web part");
    assert!((web - 0.5).abs() < 0.05, "2 of 4 workers busy: {web} {e:?}");

    // Once the reads can tell again (a window later), the figure comes back.
    let seen = LoadSample {
        pending: 2,
        unsure: false,
        ..blind
    };
    let later = 40 + (WINDOW.as_secs_f64() / TICK.as_secs_f64()) as u32 + 8;
    for i in 41..=later {
        m.tick(t0 + TICK * i, seen);
    }
    let e = m.estimate(t0 + TICK * later, None).unwrap();
    assert!(!e.unsure, "{e:?}");
    let web = e.web.unwrap();
    assert!((web - 0.5).abs() < 0.05, "2 of 4 workers busy: {web}");
}
