//! The agent in the stack users run: a real Prometheus (Debian's `prometheus`) scrapes real
//! agents on loopback every second.
//!
//! - `responses_rate_matches_a_known_load_in_both_modes`: four agents — `socket_tracing =
//!   "always"` and `"on_suspicion"`, each under a fixed-rate load on keep-alive connections and
//!   on a new connection per request — and `rate(health_agent_web_responses_total[1m])` against
//!   the rate the clients got; `promtool check metrics` on a live scrape of each.
//! - `shipped_rules_and_dashboard_work_on_a_real_prometheus`: three agents under traffic,
//!   the shipped rules loaded, one backend stopped (SIGSTOP: hung, 503): the unhealthy alert
//!   fires, and every dashboard query and every rule expression returns series.

use std::time::{Duration, Instant};

use health_agent_tests::{
    open_loop::EVEN,
    prometheus::{check_metrics, Job, Prometheus},
    require_root, web_config, workspace, Agent, OpenLoop, OpenLoopStats, Puma, PumaOptions,
};
use serde_json::Value;

const THREADS: usize = 4;
/// Agent start to its first verdict.
const WAIT: Duration = Duration::from_secs(30);

/// An agent on `puma`, with `socket_tracing` as given and saturation over a short window.
fn agent_on(puma: &Puma, socket_tracing: &str) -> Agent {
    Agent::start(&web_config(
        puma.port,
        &format!(
            "[web]\nsocket_tracing = \"{socket_tracing}\"\nworkers = {THREADS}\n\
             [scaling]\nwindow = \"8s\"\n"
        ),
    ))
}

fn puma() -> Puma {
    Puma::start(PumaOptions {
        threads: THREADS,
        ..PumaOptions::default()
    })
}

/// Every line `promtool check metrics` has to say about the agent's live scrape (none).
fn assert_promtool_clean(agent: &Agent, what: &str) {
    let text = agent.metrics();
    let (ok, said) = check_metrics(&text);
    println!(
        "promtool check metrics ({what}): {}",
        if ok { "clean" } else { &said }
    );
    assert!(ok, "promtool check metrics on {what}:\n{said}\n{text}");
}

#[test]
fn responses_rate_matches_a_known_load_in_both_modes() {
    require_root();
    const RATE: f64 = 40.0;
    let cases = [
        ("always", "keep_alive"),
        ("always", "new_connection"),
        ("on_suspicion", "keep_alive"),
        ("on_suspicion", "new_connection"),
    ];
    let pumas: Vec<Puma> = cases.iter().map(|_| puma()).collect();
    let agents: Vec<Agent> = cases
        .iter()
        .zip(&pumas)
        .map(|((mode, _), p)| agent_on(p, mode))
        .collect();
    for a in &agents {
        a.wait_up(WAIT, "the backend up");
    }
    let timeout = Duration::from_secs(5);
    let loads: Vec<OpenLoop> = cases
        .iter()
        .zip(&pumas)
        .map(|((_, load), p)| match *load {
            "keep_alive" => OpenLoop::keep_alive(p.port, "/", RATE, EVEN, THREADS, timeout),
            _ => OpenLoop::start(p.port, "/", RATE, EVEN, timeout),
        })
        .collect();
    let prometheus = Prometheus::start(
        &[Job {
            name: "health-agent",
            targets: cases
                .iter()
                .zip(&agents)
                .map(|((mode, load), a)| (a.addr, vec![("mode", *mode), ("load", *load)]))
                .collect(),
        }],
        &[],
    );
    // A minute of counter at the load's steady rate, past the windows' 30 s lookback.
    std::thread::sleep(Duration::from_secs(40));
    for ((mode, load), a) in cases.iter().zip(&agents) {
        assert_promtool_clean(a, &format!("{mode}, {load}"));
    }
    let before: Vec<OpenLoopStats> = loads.iter().map(OpenLoop::stats).collect();
    std::thread::sleep(Duration::from_secs(60));
    let after: Vec<OpenLoopStats> = loads.iter().map(OpenLoop::stats).collect();
    let rates = prometheus.query(r#"rate(health_agent_web_responses_total{class="2xx"}[1m])"#);
    let mut failures = Vec::new();
    for (i, (mode, load)) in cases.iter().enumerate() {
        let sent = (after[i].answers() - before[i].answers()) as f64
            / (after[i].elapsed - before[i].elapsed).as_secs_f64();
        let got = rates
            .iter()
            .find(|(l, _)| l["mode"] == *mode && l["load"] == *load)
            .map(|(_, v)| *v);
        let ratio = got.map_or(f64::NAN, |g| g / sent);
        let basis = prometheus.query(&format!(
            "health_agent_web_responses_basis{{mode=\"{mode}\",load=\"{load}\"}} == 1"
        ));
        let basis = basis.first().map(|(l, _)| l["basis"].clone());
        println!(
            "{mode}, {load}: rate() {got:?}/s against {sent:.2}/s answered: ratio {ratio:.3} \
             (basis {basis:?}; max lag {:?})",
            after[i].max_lag
        );
        if !(0.85..=1.15).contains(&ratio) {
            failures.push(format!("{mode}, {load}: ratio {ratio:.3}"));
        }
        let want = if *mode == "always" {
            "counted"
        } else {
            "estimated"
        };
        assert_eq!(basis, Some(Value::from(want)), "{mode}, {load}");
    }
    drop(loads);
    assert!(
        failures.is_empty(),
        "rate() off by more than 15 %: {failures:?}\n{}",
        prometheus.logs()
    );
}

/// A rule's alerting expression with its last comparison made a `bool` one: it returns its
/// series whether or not the condition holds, so an empty answer means a missing input.
fn as_bool(expr: &str) -> String {
    let ops = [" == ", " != ", " >= ", " <= ", " > ", " < "];
    let at = ops
        .iter()
        .filter_map(|op| expr.rfind(op).map(|i| (i, op.len())))
        .max();
    match at {
        Some((i, n)) => format!("{} bool {}", &expr[..i + n - 1], &expr[i + n..]),
        None => expr.to_string(),
    }
}

/// Every `expr` of the shipped dashboard, with its variables set as Grafana would.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = workspace().join("deploy/grafana/health-agent.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard"))
        .expect("the dashboard is JSON");
    let mut out: Vec<(String, String)> = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            out.push((
                p["title"].to_string(),
                t["expr"].as_str().expect("expr").into(),
            ));
        }
    }
    for a in dash["annotations"]["list"].as_array().expect("annotations") {
        out.push((
            "annotation".into(),
            a["expr"].as_str().expect("expr").into(),
        ));
    }
    out.into_iter()
        .map(|(title, e)| {
            let e = e
                .replace("$job", "health-agent")
                .replace("$__rate_interval", "1m");
            (title, e)
        })
        .collect()
}

#[test]
fn shipped_rules_and_dashboard_work_on_a_real_prometheus() {
    require_root();
    let pumas: Vec<Puma> = (0..3).map(|_| puma()).collect();
    let agents: Vec<Agent> = pumas.iter().map(|p| agent_on(p, "on_suspicion")).collect();
    for a in &agents {
        a.wait_up(WAIT, "the backend up");
    }
    let loads: Vec<OpenLoop> = pumas
        .iter()
        .map(|p| OpenLoop::start(p.port, "/", 20.0, EVEN, Duration::from_secs(2)))
        .collect();
    let rules = workspace().join("deploy/prometheus/health-agent.rules.yml");
    let prometheus = Prometheus::start(
        &[Job {
            name: "health-agent",
            targets: agents.iter().map(|a| (a.addr, vec![])).collect(),
        }],
        &[&rules],
    );
    std::thread::sleep(Duration::from_secs(20));
    // The fault: the first backend stops (SIGSTOP), holding its port; its agent says hung, 503.
    pumas[0].signal(libc::SIGSTOP);
    let started = Instant::now();
    let (code, body) = agents[0].wait_health(Duration::from_secs(60), "unhealthy", |c, b| {
        c == 503 && b["status"] == "unhealthy"
    });
    println!(
        "503 {} in {:.1} s: {}",
        body["status"],
        started.elapsed().as_secs_f64(),
        body["reasons"]
    );
    assert_eq!(code, 503);
    let deadline = Instant::now() + Duration::from_secs(90);
    let firing = loop {
        let alerts = prometheus.alerts();
        let unhealthy = alerts.iter().find(|a| {
            a["labels"]["alertname"] == "HealthAgentInstanceUnhealthy" && a["state"] == "firing"
        });
        if let Some(a) = unhealthy {
            break a.clone();
        }
        assert!(
            Instant::now() < deadline,
            "HealthAgentInstanceUnhealthy not firing 90 s after the 503: {alerts:#?}\n{}",
            prometheus.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    println!(
        "alert firing {:.1} s after the 503: {} {}",
        started.elapsed().as_secs_f64(),
        firing["labels"],
        firing["annotations"]["summary"]
    );
    assert_eq!(firing["labels"]["instance"], agents[0].addr.to_string());
    let others = prometheus.alerts();
    assert!(
        !others.iter().any(
            |a| a["labels"]["alertname"] == "HealthAgentInstanceUnhealthy"
                && a["labels"]["instance"] != agents[0].addr.to_string()
        ),
        "only the stopped backend's instance is unhealthy: {others:#?}"
    );

    let histogram = !prometheus
        .query("health_agent_web_latency_seconds_bucket")
        .is_empty();
    let mut empty = Vec::new();
    for (title, expr) in dashboard_queries() {
        if expr.contains("health_agent_web_latency_seconds_bucket") && !histogram {
            println!("dashboard {title}: {expr} — skipped: no latency histogram in the scrape");
            continue;
        }
        let n = prometheus.query(&expr).len();
        println!("dashboard {title}: {expr} → {n} series");
        if n == 0 {
            empty.push(format!("dashboard {title}: {expr}"));
        }
    }
    let groups = prometheus.api_rules();
    let mut rules = 0;
    for g in groups.as_array().expect("rule groups") {
        for r in g["rules"].as_array().expect("rules") {
            rules += 1;
            assert_eq!(r["health"], "ok", "rule {r:#}");
            let expr = r["query"].as_str().expect("query");
            let q = if r["type"] == "alerting" {
                as_bool(expr)
            } else {
                r["name"].as_str().expect("record").to_string()
            };
            let n = prometheus.query(&q).len();
            println!("rule {}: {q} → {n} series", r["name"]);
            if n == 0 {
                empty.push(format!("rule {}: {q}", r["name"]));
            }
        }
    }
    assert_eq!(rules, 11, "every shipped rule loaded");
    pumas[0].signal(libc::SIGCONT);
    drop(loads);
    assert!(
        empty.is_empty(),
        "queries without series:\n{}",
        empty.join("\n")
    );
}
