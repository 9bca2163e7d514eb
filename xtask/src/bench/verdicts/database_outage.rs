//! 6b: a frozen path to the database is `infrastructure_issue`, not a 503.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use health_agent_tests::{
    free_port, timeline, HealthSample, Load, LoadStats, Postgres, Puma, PumaOptions, TcpProxy,
};

use super::{
    agent_config, poller,
    report::{
        between, by_verdict, check, counts, describe_503s, heal_attempts, healthy, restarts_row,
        settled, stretches, tail, Failures,
    },
    start_agent, wait_for, Restarts,
};
use crate::bench::harness;

/// 6b: the path from the app to its database freezes for a while, then thaws.
pub(super) fn run(agent_bin: &Path, proxy_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let t = Timing {
        healthy_for: Duration::from_secs(20),
        frozen_for: Duration::from_secs(if quick { 20 } else { 60 }),
        after_thaw: Duration::from_secs(20),
        settled_for: Duration::from_secs(5),
        thaw_limit: Duration::from_secs(60),
    };
    let r = outage(agent_bin, proxy_bin, dir, &t)?;
    Ok(section(&r, &t))
}

#[derive(Clone, Copy)]
/// How long each phase lasts. The run goes on past `after_thaw` until every answer has been
/// `healthy` for `settled_for`, at most `thaw_limit` after the thaw.
struct Timing {
    healthy_for: Duration,
    frozen_for: Duration,
    after_thaw: Duration,
    settled_for: Duration,
    thaw_limit: Duration,
}

/// What one outage gave: every `/health` answer, the load's counts at each phase's edges,
/// when the phases began, and the restarts.
struct Outage {
    samples: Vec<HealthSample>,
    endpoint: String,
    log: PathBuf,
    first_healthy: Duration,
    load_from: Duration,
    frozen: Duration,
    thawed: Duration,
    stats: [LoadStats; 4],
    attempts: u64,
    restarted: usize,
}

/// Runs the outage: a private PostgreSQL behind the proxy, Puma, the agent and the load.
fn outage(agent_bin: &Path, proxy_bin: &Path, dir: &Path, t: &Timing) -> Result<Outage> {
    let Timing {
        healthy_for,
        frozen_for,
        after_thaw,
        settled_for,
        thaw_limit,
    } = *t;

    let pg = harness("starting a private PostgreSQL", Postgres::start)?;
    let proxy = harness("starting tcp-proxy", || {
        TcpProxy::start_with(proxy_bin, pg.port)
    })?;
    let endpoint = format!("127.0.0.1:{}", proxy.port);
    let puma = harness(
        "starting Puma (2 threads, /db and /up through the proxy)",
        || {
            Puma::start(PumaOptions {
                threads: 2,
                db_url: Some(format!(
                    "postgres://postgres:{}@{endpoint}/postgres",
                    pg.password
                )),
                up_uses_db: true,
                ..Default::default()
            })
        },
    )?;
    let restarts = Restarts(dir.join("restarts-db"));
    let aport = free_port();
    let cfg = dir.join("agent-db.toml");
    fs::write(
        &cfg,
        agent_config(
            aport,
            puma.port,
            &restarts,
            &format!("[database]\nurl = \"postgres://postgres@{endpoint}/postgres\"\n"),
        ),
    )?;
    let log = dir.join("agent-db.log");
    let agent = start_agent(
        agent_bin,
        &cfg,
        &log,
        aport,
        &[("PGPASSWORD", pg.password.as_str())],
    )?;
    let poller = poller(aport);
    let first_healthy = wait_for(
        &poller,
        Duration::from_secs(30),
        "healthy with the database connected",
        |s| s.code == 200 && s.status == "healthy" && s.database == "connected",
    )?
    .at;
    // About 16 requests a second, each on a new connection, each a fresh database connection.
    let load = Load::new_connections(
        puma.port,
        "/db",
        4,
        Duration::from_millis(250),
        Duration::from_secs(10),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while load.stats().count(200) < 10 {
        if Instant::now() > deadline {
            bail!(
                "/db never answered through the proxy (a harness problem): {}\npuma log:\n{}",
                load.stats(),
                puma.logs()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let load_from = poller.elapsed();
    let stats_start = load.stats();
    thread::sleep(healthy_for);

    proxy.freeze();
    let frozen = poller.elapsed();
    let stats_frozen = load.stats();
    thread::sleep(frozen_for);
    proxy.thaw();
    let thawed = poller.elapsed();
    let stats_thawed = load.stats();
    thread::sleep(after_thaw);
    // Not settled by then is a result (reported below), not a harness error.
    while poller.elapsed() < thawed + thaw_limit {
        let samples = poller.samples();
        if settled(&samples, thawed).is_some_and(|at| poller.elapsed() >= at + settled_for) {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let stats_end = load.stop();
    let samples = poller.stop();
    let attempts = heal_attempts(&samples);
    let restarted = restarts.count();
    drop(agent);
    drop(puma);
    drop(proxy);
    drop(pg);
    Ok(Outage {
        samples,
        endpoint,
        log,
        first_healthy,
        load_from,
        frozen,
        thawed,
        stats: [stats_start, stats_frozen, stats_thawed, stats_end],
        attempts,
        restarted,
    })
}

/// The section's Markdown (and the run's story on stdout).
fn section(r: &Outage, t: &Timing) -> String {
    let Outage {
        samples,
        endpoint,
        log,
        first_healthy,
        load_from,
        frozen,
        thawed,
        stats: [stats_start, stats_frozen, stats_thawed, stats_end],
        attempts,
        restarted,
    } = r;
    let (first_healthy, load_from, frozen, thawed) = (*first_healthy, *load_from, *frozen, *thawed);
    let (attempts, restarted) = (*attempts, *restarted);
    let phase = |from: Duration, to: Option<Duration>| {
        samples
            .iter()
            .filter(move |s| s.at >= from && to.is_none_or(|t| s.at < t))
    };
    let failures = Failures::of(samples, first_healthy);
    let n503 = failures.n503;
    let secs_after = |s: &HealthSample, from: Duration| s.at.saturating_sub(from).as_secs_f64();
    let infra = phase(frozen, Some(thawed))
        .find(|s| s.recommendation == "infrastructure_issue")
        .map(|s| secs_after(s, frozen));
    let waiting = phase(frozen, Some(thawed)).find(|s| s.webserver == "waiting");
    let endpoints = dependencies_named(phase(frozen, Some(thawed)));
    let healthy_again = phase(thawed, None)
        .find(|s| healthy(s))
        .map(|s| secs_after(s, thawed));
    let settled_at = settled(samples, thawed).map(|at| at.saturating_sub(thawed).as_secs_f64());
    let changes = changes(&phase(thawed, None).collect::<Vec<_>>());

    println!(
        "bench: database outage: before {}; frozen {}; after the thaw {}; 503s {n503}; restarts {restarted} (heal attempts {attempts}); freeze → infrastructure_issue {infra:?} s; dependencies named {endpoints:?} (proxy {endpoint}); thaw → healthy {healthy_again:?} s, for good {settled_at:?} s ({changes} changes of verdict after the thaw)",
        by_verdict(phase(load_from, Some(frozen))),
        by_verdict(phase(frozen, Some(thawed))),
        by_verdict(phase(thawed, None)),
    );
    println!(
        "bench: database outage: froze at t={:.1}s, thawed at t={:.1}s",
        frozen.as_secs_f64(),
        thawed.as_secs_f64()
    );
    if let Some(w) = waiting {
        println!(
            "bench: first `waiting` ({:.1} s after the freeze): {}",
            secs_after(w, frozen),
            w.web()["detail"].as_str().unwrap_or("-")
        );
    }
    print!("{}{}", timeline(samples), stretches(samples));
    if n503 > 0 {
        println!(
            "bench: database outage: 503 answers:\n{}agent log (tail):\n{}",
            describe_503s(samples, first_healthy),
            tail(log, 30)
        );
    }

    let fmt_secs = |v: Option<f64>| v.map_or("never".to_string(), |s| format!("{s:.1} s"));
    let mut md = String::from(
        "\n### 6b. A frozen path to the database is `infrastructure_issue`, not a 503\n\n",
    );
    let _ = writeln!(
        md,
        "A private PostgreSQL behind `tcp-proxy`; Puma with 2 threads whose `/db` and `/up` open a fresh connection through the proxy and run `SELECT 1`; the agent's `[database] url` goes through the proxy too (password from `PGPASSWORD`; the check at its defaults, `interval = 30s`, `timeout = 5s`, `fail_after = 2`, which the agent asks again sooner while the backend looks stuck or the database is down). 4 clients request `/db` on a new connection every 250 ms each (10 s client timeout). Healthy for {} s, then the proxy is frozen (SIGSTOP: connections complete, nothing comes back, as on a path that drops packets) for {} s, then thawed; the run goes on for {} s and until every answer has been `healthy` for {} s, at most {} s after the thaw. Every instance shares that database: a restart or a new instance fixes nothing.\n",
        t.healthy_for.as_secs(),
        t.frozen_for.as_secs(),
        t.after_thaw.as_secs(),
        t.settled_for.as_secs(),
        t.thaw_limit.as_secs()
    );
    md.push_str("| measure | value | target |\n|---|---|---|\n");
    for (label, from, to, (before, after)) in [
        (
            format!("before the freeze ({} s)", t.healthy_for.as_secs()),
            load_from,
            Some(frozen),
            (&stats_start, &stats_frozen),
        ),
        (
            format!("while frozen ({} s)", t.frozen_for.as_secs()),
            frozen,
            Some(thawed),
            (&stats_frozen, &stats_thawed),
        ),
        (
            "after the thaw".to_string(),
            thawed,
            None,
            (&stats_thawed, &stats_end),
        ),
    ] {
        let _ = writeln!(
            md,
            "| {label}: `/health` answers by code and `checks.webserver`; `/db` answers | {}; `/db`: {} | — |",
            by_verdict(phase(from, to)),
            counts(&between(before, after))
        );
    }
    let _ = writeln!(md, "{}", failures.row());
    let _ = writeln!(md, "{}", restarts_row(restarted, attempts));
    let _ = writeln!(
        md,
        "| freeze → first `infrastructure_issue` | **{}** | ≤ 15 s {} |",
        fmt_secs(infra),
        check(infra.is_some_and(|s| s <= 15.0))
    );
    let named = if endpoints.is_empty() {
        "none".to_string()
    } else {
        endpoints
            .iter()
            .map(|e| {
                if e == endpoint {
                    format!("`{e}` (the proxy)")
                } else {
                    format!("`{e}`")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "| endpoint named in `details.web.dependencies` while frozen | {named} | the proxy {} |",
        check(endpoints.contains(endpoint))
    );
    let _ = writeln!(
        md,
        "| thaw → first `healthy` | {} | — |",
        fmt_secs(healthy_again)
    );
    let _ = writeln!(
        md,
        "| thaw → `healthy` for good (every later answer of the run), and the changes of `status`/`checks.webserver` after the thaw | {}, {changes} changes | — |",
        fmt_secs(settled_at)
    );
    md
}

/// The endpoints `details.web.dependencies` named, in order of first mention.
fn dependencies_named<'a>(samples: impl Iterator<Item = &'a HealthSample>) -> Vec<String> {
    let mut endpoints = Vec::<String>::new();
    for s in samples {
        for d in s.web()["dependencies"].as_array().into_iter().flatten() {
            if let Some(e) = d["endpoint"].as_str() {
                if !endpoints.iter().any(|x| x == e) {
                    endpoints.push(e.to_string());
                }
            }
        }
    }
    endpoints
}

/// How often the code, `status` or `checks.webserver` changed from one answer to the next.
fn changes(samples: &[&HealthSample]) -> usize {
    samples
        .windows(2)
        .filter(|w| {
            (w[0].code, &w[0].status, &w[0].webserver) != (w[1].code, &w[1].status, &w[1].webserver)
        })
        .count()
}
