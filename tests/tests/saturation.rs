//! The scaling signal against a real Puma: saturation grows with the offered load, shows in
//! `/health` and `/metrics`, and is withheld (nothing published) while the app's path to its
//! database is frozen — blocked work is not load.

use std::time::{Duration, Instant};

use health_agent_tests::{
    database_behind_proxy, require_root, Agent, Load, OpenLoop, Puma, PumaOptions,
};
use serde_json::Value;

/// Puma with 4 threads on `/io` (sleep 50 ms, then `SELECT 1` on the thread's own database
/// connection): about 75 requests a second at capacity.
const THREADS: usize = 4;

fn saturation(agent: &Agent) -> (Value, Value) {
    let (_, body) = agent.health();
    let mut details = body["details"]["saturation"].clone();
    details["kernel_latency"] = body["details"]["web"]["counters"]["latency"].clone();
    (body["checks"]["saturation"].clone(), details)
}

/// Offered load at `rate` for `secs`, then S and its web part as the agent averages them (its
/// window is shorter than the phase, so only this load is in it).
fn s_at(agent: &Agent, puma: &Puma, rate: f64, secs: u64, seed: u64) -> (f64, f64, Value) {
    let load = OpenLoop::start(puma.port, "/io", rate, seed, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(secs));
    let (check, details) = saturation(agent);
    let stats = load.stop();
    let ratio = details["ratio"].as_f64().unwrap_or_else(|| {
        panic!("no saturation at {rate}/s ({stats:?}): checks.saturation {check}, details {details:#}\nagent log:\n{}", agent.logs())
    });
    assert_eq!(
        check.as_str().unwrap_or(""),
        format!("{:.0}%", ratio * 100.0),
        "checks.saturation says the ratio in percent: {details:#}"
    );
    // S is the largest part, and names it.
    let parts = details["parts"]
        .as_object()
        .expect("details.saturation.parts");
    let largest = parts.values().filter_map(Value::as_f64).fold(0.0, f64::max);
    assert!(
        (ratio - largest).abs() < 0.011,
        "S is not its largest part: {details:#}"
    );
    assert!(
        parts
            .get(details["largest"].as_str().unwrap_or("?"))
            .is_some(),
        "details.saturation.largest names a part: {details:#}"
    );
    let web = details["parts"]["web"].as_f64().expect("a web part");
    println!(
        "asked {rate}/s ({} sent, {} answered): S = {ratio}, web part {web}, details {details}",
        stats.sent,
        stats.answers()
    );
    (ratio, web, details)
}

#[test]
fn saturation_follows_offered_load_and_is_withheld_while_the_database_path_is_frozen() {
    require_root();
    let (pg, proxy) = database_behind_proxy();
    let db = format!("127.0.0.1:{}", proxy.port);
    let puma = Puma::start(PumaOptions {
        threads: THREADS,
        db_url: Some(format!("postgres://postgres:{}@{db}/postgres", pg.password)),
        ..Default::default()
    });
    let agent = Agent::start_with_env(
        &format!(
            "[web]\nport = {}\nworkers = {THREADS}\n\n[scaling]\nwindow = \"8s\"\n\n\
             [database]\nurl = \"postgres://postgres@{db}/postgres\"\ninterval = \"2s\"\n",
            puma.port
        ),
        &[("PGPASSWORD", pg.password.as_str())],
    );
    agent.wait_health(Duration::from_secs(30), "healthy", |code, b| {
        code == 200 && b["status"] == "healthy"
    });

    // About 0.1 and 0.6 of capacity (the requests take 52-62 ms in service here, more while
    // other tests share the cores). Host CPU is a part of S too, and this machine's CPU is
    // shared with whatever else runs on it: the web part is what this load alone moves.
    let (_, low, _) = s_at(&agent, &puma, 6.0, 10, 1);
    let (high_s, high, details) = s_at(&agent, &puma, 45.0, 10, 2);
    assert!(
        high > low + 0.3,
        "the web part did not grow with the load: {low} at 6/s, {high} at 45/s: {details:#}"
    );
    assert!(high_s >= high, "S below its web part: {details:#}");
    assert_eq!(details["capacity"]["workers"], THREADS, "{details:#}");
    assert_eq!(details["capacity"]["basis"], "configured", "{details:#}");
    assert!(
        agent.metrics().contains("health_agent_saturation_ratio "),
        "/metrics has the gauge while S is published"
    );

    // The database path freezes under load: every thread waits in SELECT 1. That is no load a
    // new instance would take off this one: S is withheld, and nothing is published.
    // Back at the low load for longer than the window first, so what S was is this load's.
    let load = OpenLoop::start(puma.port, "/io", 12.0, 3, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(10));
    let (_, before) = saturation(&agent);
    let low = before["parts"]["web"]
        .as_f64()
        .unwrap_or_else(|| panic!("no web part at 12/s: {before:#}"));
    proxy.freeze();
    let frozen = Instant::now();
    let mut seen = None;
    while frozen.elapsed() < Duration::from_secs(20) {
        let (check, details) = saturation(&agent);
        if check == "withheld" {
            seen = Some((frozen.elapsed(), details));
            break;
        }
        if details["ratio"].is_number() {
            let web = details["parts"]["web"].as_f64().unwrap_or(0.0);
            assert!(
                web <= low + 0.25,
                "the web part rose to {web} with the database path frozen (it was {low} at this load): {details:#}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (after, details) = seen.unwrap_or_else(|| {
        panic!(
            "S was never withheld while the database path was frozen: {:#}\nagent log:\n{}",
            saturation(&agent).1,
            agent.logs()
        )
    });
    println!(
        "withheld {:.1}s after the freeze: {details}",
        after.as_secs_f64()
    );
    assert!(details["ratio"].is_null(), "{details:#}");
    assert!(
        details["withheld"].as_str().is_some_and(|w| !w.is_empty()),
        "withheld says why: {details:#}"
    );
    let metrics = agent.metrics();
    assert!(
        !metrics.contains("health_agent_saturation"),
        "no saturation series while withheld:\n{metrics}"
    );
    let (_, body) = agent.health();
    assert_eq!(body["recommendation"], "infrastructure_issue", "{body:#}");
    proxy.thaw();
    drop(load);
}

/// `clients` keep-alive clients, each sending `/io` back to back on one connection, for
/// `secs`: (the web part, the utilisation they made — answers × 50 ms over the threads —,
/// the details).
fn keep_alive_at(agent: &Agent, puma: &Puma, clients: usize, secs: u64) -> (f64, f64, Value) {
    let load = Load::keep_alive(puma.port, "/io", clients, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(secs));
    let (_, body) = agent.health();
    let stats = load.stop();
    let details = &body["details"]["saturation"];
    let counters = &body["details"]["web"]["counters"];
    let web = details["parts"]["web"].as_f64().unwrap_or_else(|| {
        panic!(
            "no web part under {clients} keep-alive clients ({stats:?}): {details:#}\nagent log:\n{}",
            agent.logs()
        )
    });
    let rate = stats.answers() as f64 / stats.elapsed.as_secs_f64();
    let utilisation = rate * puma.options.io_seconds / THREADS as f64;
    println!(
        "{clients} keep-alive clients: {rate:.1} answers/s on {} connections, utilisation \
         {utilisation:.2}, web part {web}; saturation {details}; counters {counters}",
        stats.connections
    );
    assert!(
        stats.errors + stats.timeouts == 0 && stats.connections as usize <= clients + 1,
        "the load did not stay on its keep-alive connections: {stats:?}"
    );
    (web, utilisation, body)
}

#[test]
fn saturation_follows_keep_alive_load_as_a_load_balancer_sends_it() {
    keep_alive_saturation("always", 8, 10);
}

/// With the programs detached while nothing is wrong, sock_diag cannot tell back-to-back
/// keep-alive requests in service from answered ones; the agent attaches them for half a second
/// every 15 s to count, and the web part comes from those windows. The window holds at least one.
#[test]
fn saturation_follows_keep_alive_load_with_programs_attached_on_suspicion() {
    keep_alive_saturation("on_suspicion", 24, 26);
}

fn keep_alive_saturation(socket_tracing: &str, window: u64, phase: u64) {
    require_root();
    let puma = Puma::start(PumaOptions::threads(THREADS));
    let agent = Agent::start(&format!(
        "[web]\nport = {}\nworkers = {THREADS}\nsocket_tracing = \"{socket_tracing}\"\n\n\
         [scaling]\nwindow = \"{window}s\"\n",
        puma.port
    ));
    agent.wait_health(Duration::from_secs(30), "healthy", |code, b| {
        code == 200 && b["status"] == "healthy"
    });

    // One client keeps one thread busy about a quarter of the time; three, three quarters.
    // The window is shorter than each phase: only that load is in it.
    let (low, low_util, _) = keep_alive_at(&agent, &puma, 1, phase);
    let (high, high_util, body) = keep_alive_at(&agent, &puma, 3, phase);
    let details = &body["details"]["saturation"];
    for (web, util, clients) in [(low, low_util, 1), (high, high_util, 3)] {
        assert!(
            (web - util).abs() <= 0.15,
            "the web part is {web} under {clients} keep-alive clients, the utilisation they \
             made {util:.2}: {details:#}"
        );
    }
    assert!(
        high > low + 0.3,
        "the web part did not grow with the keep-alive load: {low} with 1 client, {high} \
         with 3: {details:#}"
    );
    if socket_tracing != "always" {
        // Counters are kept only while the programs run.
        return;
    }
    // Every request of those connections was counted, not only their first.
    let counters = &body["details"]["web"]["counters"];
    let requests_in = counters["exchanges_in"].as_u64().unwrap_or(0);
    let handshakes = counters["established"].as_u64().unwrap_or(0);
    assert!(
        requests_in > 10 * handshakes,
        "keep-alive requests are not counted per request: {counters:#}"
    );
}

#[test]
fn a_load_balancers_connections_opened_before_the_agent_started_are_counted() {
    // The agent restarts (an upgrade, a crash) while the load balancer keeps its pooled
    // keep-alive connections open: their requests must count from the agent's start, not
    // from whenever the balancer happens to reopen them.
    require_root();
    let puma = Puma::start(PumaOptions::threads(THREADS));
    let load = Load::keep_alive(puma.port, "/io", 2, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    let agent = Agent::start(&format!(
        "[web]\nport = {}\nworkers = {THREADS}\nsocket_tracing = \"always\"\n\n[scaling]\nwindow = \"8s\"\n",
        puma.port
    ));
    std::thread::sleep(Duration::from_secs(10));
    let (_, body) = agent.health();
    let stats = load.stop();
    assert!(
        stats.errors + stats.timeouts == 0 && stats.connections <= 3,
        "the load did not stay on its keep-alive connections: {stats:?}"
    );
    let utilisation = stats.answers() as f64 / stats.elapsed.as_secs_f64()
        * puma.options.io_seconds
        / THREADS as f64;
    let details = &body["details"]["saturation"];
    let counters = &body["details"]["web"]["counters"];
    let web = details["parts"]["web"].as_f64().unwrap_or(0.0);
    println!("web part {web}, utilisation {utilisation:.2}; counters {counters}");
    assert!(
        (web - utilisation).abs() <= 0.15,
        "the web part is {web} for connections opened before the agent, the utilisation they \
         made {utilisation:.2}: {details:#}\ncounters {counters:#}"
    );
    let requests_in = counters["exchanges_in"].as_u64().unwrap_or(0);
    let handshakes = counters["established"].as_u64().unwrap_or(0);
    assert!(
        requests_in > 10 * handshakes.max(1),
        "the pooled connections' requests were not counted: {counters:#}"
    );
}

/// A pool that is not Puma — the fixture backend with 5 workers, each request 100 ms — at the
/// product's default (`socket_tracing` unset), its capacity learned from the accept queue and
/// `scaling.window = "10s"`: S tracks offered / capacity from a quarter to full load, reads
/// overload at 1.5×, and never says both `scale_down` and `scale_up` during one steady load.
#[test]
fn saturation_at_the_default_tracks_a_pool_whose_capacity_is_learned() {
    require_root();
    const WORKERS: usize = 5;
    let pool = health_agent_tests::Fixture::start_with(
        "slow",
        &[
            "--workers",
            &WORKERS.to_string(),
            "--delay-ms",
            "100",
            "--backlog",
            "4096",
        ],
    );
    let agent = Agent::on_port(pool.port, "[scaling]\nwindow = \"10s\"\n");
    agent.wait_health(Duration::from_secs(30), "healthy", |code, b| {
        code == 200 && b["status"] == "healthy"
    });
    // Flat out (closed loop, more clients than workers): the capacity, and the agent learns
    // the worker count from the connections waiting in the accept queue.
    let flat = Load::new_connections(pool.port, "/", 16, Duration::ZERO, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(12));
    let flat = flat.stop();
    let capacity = flat.answers() as f64 / flat.elapsed.as_secs_f64();
    let (_, details) = saturation(&agent);
    println!(
        "capacity {capacity:.1}/s flat out; the agent's capacity {}",
        details["capacity"]
    );

    let mut failures = Vec::new();
    for (i, m) in [0.25, 0.5, 0.75, 1.0, 1.5].into_iter().enumerate() {
        let load = OpenLoop::start(
            pool.port,
            "/",
            m * capacity,
            11 + i as u64,
            Duration::from_secs(30),
        );
        // The window fills with this load only, then it is read for as long again.
        std::thread::sleep(Duration::from_secs(12));
        let (mut readings, mut advice) = (Vec::new(), std::collections::BTreeSet::new());
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let (_, body) = agent.health();
            if let Some(s) = body["details"]["saturation"]["parts"]["web"].as_f64() {
                readings.push(s);
            }
            advice.insert(body["recommendation"].as_str().unwrap_or("?").to_string());
            std::thread::sleep(Duration::from_millis(500));
        }
        let (_, details) = saturation(&agent);
        let stats = load.stop();
        let truth = stats.offered_rate() / capacity;
        let web = details["parts"]["web"].as_f64();
        let (lo, hi) = readings
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &s| (l.min(s), h.max(s)));
        println!(
            "{m}×: true {truth:.2}, web part {web:?} at the end ({} readings {lo:.2}–{hi:.2}), \
             advice {advice:?}; {details}",
            readings.len()
        );
        let ok = match web {
            Some(w) if m >= 1.5 => w >= 1.3,
            Some(w) => (w - truth).abs() <= 0.15,
            None => false,
        };
        if !ok {
            failures.push(format!("{m}×: web part {web:?} against {truth:.2}"));
        }
        if advice.contains("scale_down") && advice.contains("scale_up") {
            failures.push(format!("{m}×: both scale_down and scale_up ({advice:?})"));
        }
    }
    assert!(
        failures.is_empty(),
        "{failures:#?}\nagent log:\n{}",
        agent.logs()
    );
}
