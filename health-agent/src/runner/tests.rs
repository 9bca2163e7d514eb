use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::{
    periodic::{DatabaseWiring, Slots},
    *,
};
use crate::{
    checks::{
        database::test_support::{fake_redis, free_port, redis_ok},
        disk::DiskReport,
        DatabaseReport,
    },
    status::{DbState, DiskLevel, Recommendation, Status},
};

type DiskSender = watch::Sender<Option<Timed<DiskReport>>>;

/// A composer with only the web monitor (no kernel view) and a disk slot the test fills.
fn composer(cfg: Config, started: Instant) -> (Composer, DiskSender) {
    let cfg = Arc::new(cfg);
    let (disk_tx, disk) = watch::channel(None);
    let slots = Slots {
        disk,
        probe: None,
        web_container: None,
        containers: None,
        database: None,
        fleet: None,
        ask_fleet: Arc::new(Notify::new()),
        exchange: None,
    };
    let wiring = DatabaseWiring {
        pending: DatabaseReport::not_configured(),
        recheck: Arc::new(Notify::new()),
    };
    let checks = Checks::build(&cfg, Mode::Once);
    let healer = Healer::new(cfg.heal.clone(), cfg.web.clone(), None);
    let c = Composer::new(
        cfg,
        started,
        checks.web,
        checks.system,
        healer,
        (slots, wiring),
    );
    (c, disk_tx)
}

fn disk_ok(at: Instant) -> Option<Timed<DiskReport>> {
    Some(Timed {
        at,
        value: DiskReport {
            level: DiskLevel::Ok,
            mounts: Vec::new(),
        },
    })
}

#[tokio::test]
async fn due_only_looks_and_the_round_takes_the_new_results() {
    let mut cfg = Config::default();
    cfg.checks.interval = Duration::from_secs(60);
    let t0 = Instant::now();
    let (mut c, disk) = composer(cfg, t0);
    assert!(!c.due(t0), "nothing new, nothing wrong");
    disk.send(disk_ok(t0)).unwrap();
    assert!(c.due(t0), "a check reported");
    assert!(c.due(t0), "asking again changes nothing");
    c.compose(t0);
    assert!(!c.due(t0), "the round took the new result");
    assert!(c.due(t0 + Duration::from_secs(60)), "checks.interval");
}

/// The answers around a restart, through the composer's one evaluation: `recovering` (200)
/// while the restart command runs, 503 once it failed, the fault and the healing named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_answers_recovering_then_503_once_it_fails() {
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = Config::default();
    cfg.checks.boot_grace = Duration::ZERO;
    cfg.checks.fail_after = Duration::ZERO;
    cfg.checks.recover_after = Duration::ZERO;
    cfg.web.port = backend.local_addr().unwrap().port();
    cfg.web.kernel = false;
    cfg.web.probe_path = String::new();
    cfg.web.restart_command = "sleep 0.3; exit 1".into();
    cfg.heal.enabled = true;
    let t0 = Instant::now();
    let (mut c, disk) = composer(cfg, t0);
    disk.send(disk_ok(t0)).unwrap();
    let snap = c.compose(Instant::now());
    assert_eq!(snap.decision.http, 200, "{:?}", snap.decision);
    assert!(snap.report.web.served);

    drop(backend);
    let snap = c.compose(Instant::now());
    assert_eq!(
        (snap.decision.status, snap.decision.http),
        (Status::Recovering, 200),
        "{:?}",
        snap.decision
    );
    assert_eq!(
        snap.decision.reasons.last().map(String::as_str),
        Some("self-heal in progress")
    );
    assert_eq!(snap.heal.phase, Some(crate::status::HealPhase::Recovering));

    let deadline = Instant::now() + Duration::from_secs(5);
    let snap = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let snap = c.compose(Instant::now());
        if snap.decision.http == 503 || Instant::now() > deadline {
            break snap;
        }
    };
    assert_eq!(
        snap.decision.status,
        Status::Unhealthy,
        "{:?}",
        snap.decision
    );
    assert_eq!(snap.decision.http, 503);
    assert_eq!(
        snap.decision.reasons.last().map(String::as_str),
        Some("self-heal failed or its budget is spent")
    );
    assert_eq!(
        snap.heal.attempts[0].outcome,
        crate::heal::HealOutcome::Failed
    );
}

#[tokio::test]
async fn database_check_runs_on_its_own_cadence_and_feeds_the_policy() {
    let (redis, seen) = fake_redis(redis_ok, Duration::ZERO).await;
    let down = free_port();
    let mut cfg = Config::default();
    cfg.checks.boot_grace = Duration::ZERO;
    cfg.web.eval_interval = Duration::from_millis(50);
    cfg.disk.warn_percent = 100.0;
    cfg.disk.fail_percent = 100.0;
    cfg.database.url = format!("redis://:Sekr1t@{redis}");
    cfg.database.urls = vec![format!("redis://127.0.0.1:{down}")];
    cfg.database.interval = Duration::from_millis(400);
    cfg.database.timeout = Duration::from_secs(1);
    cfg.database.slow_after = Duration::from_secs(10);
    cfg.database.fail_after = 2;
    let shutdown = CancellationToken::new();
    let agent = start(Arc::new(cfg), shutdown.clone()).await;

    let first = agent.snapshot.load_full();
    assert_eq!(
        first.report.database.databases.len(),
        2,
        "listed before the first round"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen_states = Vec::new();
    let snap = loop {
        let snap = agent.snapshot.load_full();
        let state = snap.report.database.state;
        if seen_states.last() != Some(&state) {
            seen_states.push(state);
        }
        if state == DbState::Unreachable {
            break snap;
        }
        assert!(
            Instant::now() < deadline,
            "never unreachable: {seen_states:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        seen_states,
        [DbState::Unknown, DbState::Unreachable],
        "one failed round trip is not enough with fail_after = 2"
    );
    // A shared dependency: 200 degraded, never 503.
    assert_eq!(snap.decision.http, 200);
    assert_eq!(snap.decision.status, Status::Degraded);
    assert_eq!(
        snap.decision.recommendation,
        Recommendation::InfrastructureIssue
    );
    let dbs = &snap.report.database.databases;
    assert_eq!(dbs[0].state, DbState::Connected, "{dbs:?}");
    assert_eq!(dbs[1].name, format!("redis://127.0.0.1:{down}"));
    let full = String::from_utf8_lossy(snap.body(crate::snapshot::Rendering::Full)).into_owned();
    assert!(full.contains(&format!("redis://{redis}")), "{full}");
    assert!(!full.contains("Sekr1t"), "{full}");

    // Its own cadence: about one round every 400 ms while the composer runs every 50 ms.
    let before = seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let pings = seen.lock().unwrap().len() - before;
    // Each round is AUTH + PING on the good database.
    assert!((2..=8).contains(&pings), "{pings} commands in 1s");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), agent.composer)
        .await
        .expect("composer stops on shutdown")
        .expect("composer task");
}

/// A local webhook receiver: every JSON body POSTed to it.
async fn webhook() -> (String, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
            let store = store.clone();
            async move {
                store.lock().unwrap().push(v);
                "ok"
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, seen)
}

async fn get(app: Arc<crate::server::App>, path: &str) -> (u16, String) {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let req = axum::http::Request::builder()
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = crate::server::router(app).oneshot(req).await.unwrap();
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_check_loop_fails_livez_and_raises_an_alert() {
    let (url, hooks) = webhook().await;
    let mut cfg = Config::default();
    cfg.checks.boot_grace = Duration::ZERO;
    cfg.checks.interval = Duration::from_millis(200);
    cfg.checks.stale_after = Duration::from_secs(1);
    cfg.disk.warn_percent = 100.0;
    cfg.disk.fail_percent = 100.0;
    cfg.alerts.webhook_url = url;
    let cfg = Arc::new(cfg);
    let shutdown = CancellationToken::new();
    let agent = start(cfg.clone(), shutdown.clone()).await;
    let app = Arc::new(crate::server::App {
        snapshot: agent.snapshot.clone(),
        details: crate::config::Details::Always,
        token: None,
        stale_after: cfg.checks.stale_after,
        fleet_access: crate::server::FleetAccess::NotConfigured,
        fresh_gate: Default::default(),
        host: "web-1".into(),
        witness: Default::default(),
        socket_tracing: crate::config::SocketTracing::OnSuspicion,
    });
    assert_eq!(get(app.clone(), "/livez").await, (200, "ok\n".into()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(hooks.lock().unwrap().is_empty(), "nothing to alert yet");

    agent.check_loop.abort();
    let deadline = Instant::now() + Duration::from_secs(6);
    let alert = loop {
        if let Some(a) = hooks.lock().unwrap().first().cloned() {
            break a;
        }
        assert!(Instant::now() < deadline, "no alert after the loop died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(alert["event"], "incident.triggered", "{alert}");
    assert_eq!(
        alert["payload"]["incident"]["condition"], "unhealthy",
        "{alert}"
    );
    assert!(
        alert["payload"]["reasons"][0]
            .as_str()
            .is_some_and(|r| r.contains("check loop was stopped")),
        "{alert}"
    );
    // Both fail once the last snapshot is older than stale_after.
    let (code, body) = loop {
        let (code, body) = get(app.clone(), "/livez").await;
        if code != 200 || Instant::now() > deadline {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("check loop"), "{body}");
    assert_eq!(get(app, "/health").await.0, 503);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent.composer)
        .await
        .expect("the supervisor stops on shutdown")
        .expect("supervisor task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_snapshot_carries_every_checks_first_result() {
    // A database that answers after 300 ms, a web backend whose probe path answers.
    let (redis, _) = fake_redis(redis_ok, Duration::from_millis(300)).await;
    let web = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = web.local_addr().unwrap().port();
    let app = axum::Router::new().route("/up", axum::routing::get(|| async { "up" }));
    tokio::spawn(async move { axum::serve(web, app).await });

    let mut cfg = Config::default();
    cfg.disk.warn_percent = 100.0;
    cfg.disk.fail_percent = 100.0;
    cfg.database.url = format!("redis://{redis}");
    cfg.web.port = port;
    cfg.web.kernel = false;
    let shutdown = CancellationToken::new();
    let agent = start(Arc::new(cfg), shutdown.clone()).await;
    let first = agent.snapshot.load_full();
    assert_eq!(first.report.database.state, DbState::Connected);
    let probe = first.report.web.probe.as_ref().expect("a probe result");
    assert_eq!(probe.status, Some(200), "{probe:?}");
    assert_eq!(first.report.web.verdict, crate::status::WebVerdict::Up);
    assert_eq!(first.decision.http, 200, "{:?}", first.decision);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent.composer)
        .await
        .expect("the composer stops on shutdown")
        .expect("composer task");
}
