//! Alerts end to end against local receivers: real HTTP servers on 127.0.0.1:0 that record
//! every request (method, path, query, headers, JSON body, arrival time), answer scripted
//! replies, and — for GitHub — keep a list of open issues so dedup is exercised.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    Router,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{
    http::Tuning,
    incident::{fingerprint, Condition, Event, Kind, Scope, Transition},
    report, send_test_tuned, AlertError, Alerts,
};
use crate::{
    checks::{
        disk::{DiskReport, MountUsage},
        web::WebReport,
        ContainersReport, DatabaseReport, Report,
    },
    config::AlertsConfig,
    heal::HealLog,
    policy::evaluate,
    snapshot::Snapshot,
    status::{DbState, DiskLevel, HealPhase, WebVerdict},
};

const SLACK_PATH: &str = "/services/T0000/B0000/XXXXslackSECRETXXXX";
const ROUTING_KEY: &str = "R0UTINGKEY0123456789abcdefABCDEF";
const WEBHOOK_PATH: &str = "/hook?token=whSECRET42";
const TOKEN: &str = "ghp_TESTtoken0123456789";
const TOKEN_ENV: &str = "HA_TEST_GITHUB_TOKEN";
const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------- snapshots

fn report(disk: DiskLevel, db: DbState, web: WebVerdict) -> Report {
    let mut w = WebReport::not_configured();
    if web != WebVerdict::NotConfigured {
        w.port = 9000;
        w.verdict = web;
        w.detail = format!("backend {}", web.as_str());
    }
    Report {
        web: w,
        disk: DiskReport {
            level: disk,
            mounts: vec![MountUsage {
                path: "/".into(),
                used_percent: if disk == DiskLevel::Fail { 95.5 } else { 40.0 },
                total_bytes: 10 << 30,
                available_bytes: 1 << 30,
                level: disk,
                error: None,
            }],
        },
        system: None,
        containers: ContainersReport::not_configured(),
        database: if db == DbState::NotConfigured {
            DatabaseReport::not_configured()
        } else {
            DatabaseReport {
                state: db,
                reason: Some("connection refused".into()),
                databases: Vec::new(),
            }
        },
    }
}

fn snapshot(r: Report, heal: Option<HealPhase>) -> Snapshot {
    let raw = evaluate(&crate::policy::PolicyInput::of(&r, false));
    let decision = match heal {
        Some(phase) => crate::heal::applied(raw, phase),
        None => raw,
    };
    let log = HealLog {
        enabled: true,
        phase: heal,
        max_restarts: 3,
        ..HealLog::default()
    };
    Snapshot::new(decision, r, log, 100, 5)
}

/// Disk over the fail threshold: 503.
pub(crate) fn unhealthy_snapshot() -> Snapshot {
    let s = snapshot(
        report(
            DiskLevel::Fail,
            DbState::NotConfigured,
            WebVerdict::NotConfigured,
        ),
        None,
    );
    assert_eq!(s.decision.http, 503);
    s
}

fn healthy_snapshot() -> Snapshot {
    // A watched web backend: with nothing watched at all the answer is `degraded`.
    let s = snapshot(
        report(DiskLevel::Ok, DbState::NotConfigured, WebVerdict::Up),
        None,
    );
    assert_eq!(s.decision.http, 200);
    s
}

fn infra_snapshot() -> Snapshot {
    snapshot(
        report(DiskLevel::Ok, DbState::Unreachable, WebVerdict::Up),
        None,
    )
}

fn heal_failed_snapshot() -> Snapshot {
    snapshot(
        report(DiskLevel::Ok, DbState::Connected, WebVerdict::Down),
        Some(HealPhase::Exhausted),
    )
}

/// A queue-test event.
pub(crate) fn event(kind: Kind, incident: u64) -> Arc<Event> {
    let t = Transition {
        kind,
        condition: Condition::Unhealthy,
        scope: Scope::Host,
        incident,
        opened_at: SystemTime::now(),
    };
    Arc::new(Event::new(&t, &unhealthy_snapshot(), "h".into(), None))
}

#[test]
fn conditions_read_the_snapshot() {
    use Condition::*;
    let holds = |s: &Snapshot| -> Vec<Condition> {
        Condition::ALL.into_iter().filter(|c| c.holds(s)).collect()
    };
    assert_eq!(holds(&healthy_snapshot()), vec![]);
    assert_eq!(holds(&unhealthy_snapshot()), vec![Unhealthy]);
    assert_eq!(holds(&infra_snapshot()), vec![InfrastructureIssue]);
    assert_eq!(holds(&heal_failed_snapshot()), vec![Unhealthy, HealFailed]);
}

/// The infrastructure issue with `[fleet]`: the fleet's when the peers judged it shared,
/// undecided while they are asked, this host's when judged alone; every other condition, and
/// every condition without fleet alerting, this host's.
#[test]
fn the_fleet_owns_only_a_shared_infrastructure_issue() {
    use super::incident::{Holds, Scope};
    use crate::fleet::FleetReport;
    use crate::status::FaultClass;
    let judged = |scope| crate::policy::Judgement {
        class: FaultClass::Dependency,
        scope,
        peers_with: 2,
        peers_answered: 2,
        reason: "2/2".into(),
    };
    let fleet = |judgements, asking| FleetReport {
        configured: true,
        judgements,
        asking,
        ..FleetReport::default()
    };
    let infra = Condition::InfrastructureIssue;
    let shared =
        infra_snapshot().with_fleet(fleet(vec![judged(crate::status::Scope::Shared)], vec![]));
    assert_eq!(infra.scope_in(&shared, true), Holds::Yes(Scope::Fleet));
    assert_eq!(infra.scope_in(&shared, false), Holds::Yes(Scope::Host));
    let asking = infra_snapshot().with_fleet(fleet(vec![], vec![FaultClass::Dependency]));
    assert_eq!(infra.scope_in(&asking, true), Holds::Undecided);
    let alone = infra_snapshot().with_fleet(fleet(vec![], vec![]));
    assert_eq!(infra.scope_in(&alone, true), Holds::Yes(Scope::Host));
    assert_eq!(
        infra.scope_in(&infra_snapshot(), true),
        Holds::Yes(Scope::Host)
    );
    assert_eq!(infra.scope_in(&healthy_snapshot(), true), Holds::No);
    let disk =
        unhealthy_snapshot().with_fleet(fleet(vec![judged(crate::status::Scope::Shared)], vec![]));
    assert_eq!(
        Condition::Unhealthy.scope_in(&disk, true),
        Holds::Yes(Scope::Host)
    );
}

/// A fleet's incident in each destination's documented shape: the fleet's key everywhere, the
/// fleet as PagerDuty's source, who reports it and how many have it.
#[test]
fn a_fleet_incident_reads_as_the_fleets_at_every_destination() {
    use super::incident::{FleetTag, Scope};
    let tag = FleetTag {
        name: "shop".into(),
        instances: 3,
    };
    let ev = |kind| {
        let t = Transition {
            kind,
            condition: Condition::InfrastructureIssue,
            scope: Scope::Fleet,
            incident: 4,
            opened_at: SystemTime::now(),
        };
        Event::new(&t, &infra_snapshot(), "web-2".into(), None).for_fleet(tag.clone())
    };
    let (trigger, resolve) = (ev(Kind::Trigger), ev(Kind::Resolve));
    let key = "health-agent/fleet/shop/infrastructure_issue";
    assert_eq!(trigger.fingerprint(), key);
    assert_eq!(
        trigger.describe(),
        "trigger infrastructure_issue #4 for fleet shop"
    );
    let pd = super::pagerduty::payload(&trigger, ROUTING_KEY);
    assert_eq!(pd["dedup_key"], key);
    assert_eq!(pd["payload"]["source"], "fleet shop");
    assert!(pd["payload"]["summary"]
        .as_str()
        .unwrap()
        .starts_with("fleet shop (3 instances): infrastructure issue — database unreachable"));
    assert_eq!(pd["payload"]["custom_details"]["reported_by"], "web-2");
    assert_eq!(pd["payload"]["custom_details"]["instances"], 3);
    let pd = super::pagerduty::payload(&resolve, ROUTING_KEY);
    assert_eq!(
        pd,
        json!({"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": key})
    );
    let slack = super::slack::payload(&trigger)["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        slack
            .starts_with(":rotating_light: *infrastructure issue* across fleet `shop` — triggered")
            && slack.contains("• seen by 3 instances; reported by `web-2`\n• status degraded"),
        "{slack}"
    );
    let slack = super::slack::payload(&resolve)["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        slack.contains("seen by up to 3 instances; reported by `web-2`\n• now: "),
        "{slack}"
    );
    let hook = super::webhook::payload(&trigger);
    assert_eq!(hook["hostname"], "web-2");
    let inc = &hook["payload"]["incident"];
    assert_eq!(
        (&inc["scope"], &inc["fleet"], &inc["instances"]),
        (&json!("fleet"), &json!("shop"), &json!(3))
    );
    assert_eq!(inc["fingerprint"], key);
    let host = super::webhook::payload(&event(Kind::Trigger, 1));
    assert_eq!(host["payload"]["incident"]["scope"], "host");
    assert!(host["payload"]["incident"]["fleet"].is_null());
    assert_eq!(
        report::title(&trigger),
        "[health-agent] fleet shop: infrastructure issue — database unreachable"
    );
    let body = report::body(&trigger, None);
    assert!(
        body.starts_with("## Incident: infrastructure issue across fleet `shop`"),
        "{body}"
    );
    assert!(
        body.contains("| fleet | `shop`: seen by 3 instances, reported by this host;"),
        "{body}"
    );
    assert!(report::carries_fingerprint(&body, key));
}

/// A database the agent cannot log in to (a password the server asks for and nobody set) is a
/// `config_error` incident, not an infrastructure issue, and the alert says the cause and the
/// key to change in its reasons.
#[test]
fn a_misconfigured_database_alerts_config_error_naming_the_cause() {
    use crate::checks::database::{DatabaseEntry, DbKind};
    let cause = "the server asks for a password and none is set: put PGPASSWORD=... in the \
                 agent's environment file (/etc/health-agent/environment)";
    let mut r = report(DiskLevel::Ok, DbState::Misconfigured, WebVerdict::Up);
    r.database.databases = vec![DatabaseEntry {
        name: "postgres://app@127.0.0.1:5432/app".into(),
        key: "database.url".into(),
        kind: DbKind::Postgres,
        state: DbState::Misconfigured,
        latency_ms: None,
        error: Some(cause.into()),
        detail: None,
        consecutive_failures: 0,
        last_checked: None,
    }];
    let snap = snapshot(r, None);
    let holds: Vec<Condition> = Condition::ALL
        .into_iter()
        .filter(|c| c.holds(&snap))
        .collect();
    assert_eq!(holds, [Condition::ConfigError], "{:?}", snap.decision);
    let t = Transition {
        kind: Kind::Trigger,
        condition: Condition::ConfigError,
        scope: Scope::Host,
        incident: 1,
        opened_at: SystemTime::now(),
    };
    let body = super::webhook::payload(&Event::new(&t, &snap, "web-1".into(), None));
    let reasons = body["payload"]["reasons"].to_string();
    assert!(
        reasons.contains(&format!(
            "database check misconfigured: database.url postgres://app@127.0.0.1:5432/app: {}",
            serde_json::to_string(cause).unwrap().trim_matches('"')
        )),
        "{reasons}"
    );
    assert_eq!(body["payload"]["incident"]["condition"], "config_error");
    assert_eq!(body["payload"]["recommendation"], "stable");
}

// ---------------------------------------------------------------- receivers

#[derive(Debug, Clone)]
struct Hit {
    method: Method,
    path: String,
    query: String,
    headers: HeaderMap,
    body: Value,
    at: Instant,
}

impl Hit {
    fn header(&self, k: &str) -> &str {
        self.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: Value,
    delay: Duration,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
        body: json!({}),
        delay: Duration::ZERO,
    }
}

#[derive(Default)]
struct Recv {
    hits: Vec<Hit>,
    script: VecDeque<Reply>,
    /// Sticky reply once the script is used up (default: the receiver's normal answer).
    always: Option<Reply>,
    /// GitHub: every issue, open or closed.
    issues: Vec<Value>,
}

struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<Recv>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(st): State<Arc<Mutex<Recv>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let scripted = {
        let mut s = st.lock().unwrap();
        s.hits.push(Hit {
            method: method.clone(),
            path: uri.path().to_string(),
            query: uri.query().unwrap_or("").to_string(),
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            at: Instant::now(),
        });
        s.script.pop_front().or_else(|| s.always.clone())
    };
    if let Some(r) = scripted {
        tokio::time::sleep(r.delay).await;
        let mut resp =
            (StatusCode::from_u16(r.status).unwrap(), axum::Json(r.body)).into_response();
        for (k, v) in r.headers {
            resp.headers_mut().insert(k, v.parse().unwrap());
        }
        return resp;
    }
    let path = uri.path();
    if !path.starts_with("/repos/") {
        return (
            StatusCode::ACCEPTED,
            axum::Json(json!({"status": "success", "message": "Event processed"})),
        )
            .into_response();
    }
    // A small GitHub: /repos/{owner}/{repo}/issues[/{n}[/comments]].
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut s = st.lock().unwrap();
    match (method.clone(), &parts[..]) {
        (Method::GET, ["repos", _, _, "issues"]) => {
            let open: Vec<Value> = s
                .issues
                .iter()
                .filter(|i| i["state"] == "open")
                .cloned()
                .collect();
            axum::Json(Value::Array(open)).into_response()
        }
        (Method::POST, ["repos", _, _, "issues"]) => {
            let number = 100 + s.issues.len() as u64;
            let mut issue = body;
            issue["number"] = json!(number);
            issue["state"] = json!("open");
            s.issues.push(issue.clone());
            (StatusCode::CREATED, axum::Json(issue)).into_response()
        }
        (Method::POST, ["repos", _, _, "issues", n, "comments"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            if s.issues.iter().any(|i| i["number"] == n) {
                (StatusCode::CREATED, axum::Json(json!({"id": 1}))).into_response()
            } else {
                StatusCode::NOT_FOUND.into_response()
            }
        }
        (Method::PATCH, ["repos", _, _, "issues", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match s.issues.iter_mut().find(|i| i["number"] == n) {
                Some(i) => {
                    if let Some(state) = body.get("state") {
                        i["state"] = state.clone();
                    }
                    axum::Json(i.clone()).into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

impl Receiver {
    async fn start() -> Self {
        let state = Arc::new(Mutex::new(Recv::default()));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a receiver on loopback");
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    fn script(&self, replies: Vec<Reply>) {
        self.state.lock().unwrap().script.extend(replies);
    }

    fn always(&self, r: Reply) {
        self.state.lock().unwrap().always = Some(r);
    }

    fn add_issue(&self, number: u64, body: &str) {
        self.state.lock().unwrap().issues.push(json!({
            "number": number, "state": "open", "title": "t", "body": body,
        }));
    }

    fn issues(&self) -> Vec<Value> {
        self.state.lock().unwrap().issues.clone()
    }

    /// Waits until `n` requests arrived; panics with what did arrive otherwise.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<Hit> {
        let until = Instant::now() + within;
        loop {
            let hits = self.hits();
            if hits.len() >= n {
                return hits;
            }
            if Instant::now() > until {
                panic!(
                    "{}: expected {n} requests within {within:?}, got {}: {:#?}",
                    self.addr,
                    hits.len(),
                    hits.iter()
                        .map(|h| (&h.method, &h.path, &h.body))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(10 * MS).await;
        }
    }
}

fn tuning() -> Tuning {
    Tuning {
        backoff_base: 100 * MS,
        backoff_cap: Duration::from_secs(2),
        pace_slack: 10 * MS,
        pace_pagerduty: 10 * MS,
        pace_github: 10 * MS,
        pace_webhook: 10 * MS,
        flush: Duration::from_secs(2),
        evidence_interval: 50 * MS,
        env_proxy: false,
        token: |var| (var == TOKEN_ENV).then(|| TOKEN.to_string()),
    }
}

#[derive(Default)]
struct Receivers<'a> {
    slack: Option<&'a Receiver>,
    pd: Option<&'a Receiver>,
    webhook: Option<&'a Receiver>,
    github: Option<&'a Receiver>,
}

fn config(r: Receivers<'_>) -> AlertsConfig {
    let mut c = AlertsConfig {
        resolve_after: 200 * MS,
        max_retries: 5,
        timeout: Duration::from_secs(5),
        github_token_env: TOKEN_ENV.into(),
        ..AlertsConfig::default()
    };
    if let Some(s) = r.slack {
        c.slack_webhook_url = s.url(SLACK_PATH);
    }
    if let Some(p) = r.pd {
        c.pagerduty_routing_key = ROUTING_KEY.into();
        c.pagerduty_url = p.url("/v2/enqueue");
    }
    if let Some(w) = r.webhook {
        c.webhook_url = w.url(WEBHOOK_PATH);
    }
    if let Some(g) = r.github {
        c.github_repo = "acme/web".into();
        c.github_api_url = g.url("");
    }
    c
}

fn start(cfg: &AlertsConfig, host: &str, shutdown: &CancellationToken) -> Alerts {
    Alerts::start_tuned(cfg, host.into(), shutdown.clone(), tuning())
        .expect("destinations are configured")
}

const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- 1. trigger formats

#[tokio::test]
// The lock's other holder is a plain #[test] on another thread: nothing on this runtime waits
// for it, so holding it across awaits cannot deadlock.
#[allow(clippy::await_holding_lock)]
async fn trigger_reaches_every_destination_in_its_format() {
    // No fake miner from another test while this one runs; what the host itself runs from a
    // scratch directory (a checkout under /tmp, say) is scanned here, apart from the report.
    let _no_fake_miner = crate::suspicious::FAKE_MINERS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let host_suspicious = !crate::suspicious::scan().is_empty();
    let (slack, pd, wh, gh) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let cfg = config(Receivers {
        slack: Some(&slack),
        pd: Some(&pd),
        webhook: Some(&wh),
        github: Some(&gh),
    });
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, "web-test-1", &stop);
    alerts.observe(&unhealthy_snapshot(), Instant::now());
    let fp = "health-agent/web-test-1/unhealthy";

    // Slack: {"text": …} as JSON.
    let s = &slack.wait_for(1, WAIT).await[0];
    assert_eq!((&s.method, s.path.as_str()), (&Method::POST, SLACK_PATH));
    assert_eq!(s.header("content-type"), "application/json");
    let text = s.body["text"].as_str().expect("slack text");
    for want in [
        "web-test-1",
        "unhealthy",
        "triggered",
        "status unhealthy (HTTP 503)",
        "recommendation `stable`",
        "disk usage at or above the fail threshold",
    ] {
        assert!(text.contains(want), "slack text lacks {want:?}: {text}");
    }

    // PagerDuty Events v2 trigger.
    let p = &pd.wait_for(1, WAIT).await[0];
    assert_eq!((&p.method, p.path.as_str()), (&Method::POST, "/v2/enqueue"));
    assert_eq!(p.header("content-type"), "application/json");
    let b = &p.body;
    assert_eq!(b["routing_key"], ROUTING_KEY);
    assert_eq!(b["event_action"], "trigger");
    assert_eq!(b["dedup_key"], fp);
    let summary = b["payload"]["summary"].as_str().unwrap();
    assert!(summary.len() <= 1024 && summary.contains("web-test-1") && summary.contains("disk"));
    assert_eq!(b["payload"]["source"], "web-test-1");
    assert_eq!(b["payload"]["severity"], "critical");
    let ts = b["payload"]["timestamp"].as_str().unwrap();
    assert!(
        ts.len() >= 20 && ts.contains('T') && ts.ends_with('Z'),
        "{ts}"
    );
    assert_eq!(b["payload"]["component"], "disk");
    assert_eq!(b["payload"]["group"], "health-agent");
    assert_eq!(b["payload"]["class"], "unhealthy");
    let details = &b["payload"]["custom_details"];
    assert_eq!(details["status"], "unhealthy");
    assert_eq!(details["checks"]["disk"], "critical");
    assert!(details["reasons"][0].as_str().unwrap().contains("disk"));

    // Generic webhook: {event, timestamp, hostname, payload}.
    let w = &wh.wait_for(1, WAIT).await[0];
    assert_eq!(w.path, "/hook");
    assert_eq!(w.query, "token=whSECRET42");
    assert_eq!(w.body["event"], "incident.triggered");
    assert_eq!(w.body["hostname"], "web-test-1");
    assert!(w.body["timestamp"].as_str().unwrap().ends_with('Z'));
    let payload = &w.body["payload"];
    assert_eq!(payload["incident"]["condition"], "unhealthy");
    assert_eq!(payload["incident"]["fingerprint"], fp);
    assert_eq!(payload["status"], "unhealthy");
    assert_eq!(payload["http"], 503);
    assert_eq!(payload["snapshot"]["details"]["disk"]["level"], "fail");

    // GitHub: the dedup lookup, then a new issue.
    let g = gh.wait_for(2, WAIT).await;
    assert_eq!(
        (&g[0].method, g[0].path.as_str()),
        (&Method::GET, "/repos/acme/web/issues")
    );
    for q in ["state=open", "labels=health-agent", "per_page=100"] {
        assert!(g[0].query.contains(q), "{}", g[0].query);
    }
    let create = &g[1];
    assert_eq!(
        (&create.method, create.path.as_str()),
        (&Method::POST, "/repos/acme/web/issues")
    );
    for h in [&g[0], create] {
        assert_eq!(h.header("authorization"), format!("Bearer {TOKEN}"));
        assert_eq!(h.header("accept"), "application/vnd.github+json");
        assert_eq!(h.header("x-github-api-version"), "2022-11-28");
        assert!(h.header("user-agent").starts_with("health-agent/"));
    }
    let title = create.body["title"].as_str().unwrap();
    assert!(
        title.contains("web-test-1") && title.contains("unhealthy"),
        "{title}"
    );
    let body = create.body["body"].as_str().unwrap();
    assert!(report::carries_fingerprint(body, fp), "{body}");
    assert!(body.contains(&format!("fingerprint: `{fp}`")));
    for section in [
        "### Disks",
        "### Top 10 processes by CPU",
        "### Self-heal log",
        "### Suspicious processes",
    ] {
        assert!(body.contains(section), "issue body lacks {section}");
    }
    // Unhealthy is p2, p1 when something suspicious runs: the report must agree with the scan
    // made before it, and the label with both.
    assert_eq!(
        host_suspicious,
        !body.contains("### Suspicious processes\n\nnone found"),
        "the report's suspicious section disagrees with a scan of this host"
    );
    let suspicious = host_suspicious;
    let labels: Vec<&str> = create.body["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        vec![
            "incident",
            if suspicious { "p1" } else { "p2" },
            "health-agent"
        ]
    );
    assert_eq!(gh.issues().len(), 1);
    stop.cancel();
    alerts.closed().await;
}

// ---------------------------------------------------------------- 2. resolve

#[tokio::test]
async fn resolve_after_quiet_period_closes_the_same_incident_everywhere() {
    let (slack, pd, wh, gh) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let host = "web-test-2";
    let fp = fingerprint(host, Condition::Unhealthy);
    gh.add_issue(
        3,
        &report::marker(&fingerprint(host, Condition::HealFailed)),
    );
    gh.add_issue(17, &format!("earlier report\n{}", report::marker(&fp)));
    let cfg = config(Receivers {
        slack: Some(&slack),
        pd: Some(&pd),
        webhook: Some(&wh),
        github: Some(&gh),
    });
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, host, &stop);
    let t0 = Instant::now();
    alerts.observe(&unhealthy_snapshot(), t0);
    pd.wait_for(1, WAIT).await;
    gh.wait_for(2, WAIT).await;
    alerts.observe(&healthy_snapshot(), t0 + 100 * MS);
    alerts.observe(&healthy_snapshot(), t0 + 250 * MS);
    tokio::time::sleep(200 * MS).await;
    assert_eq!(pd.hits().len(), 1, "resolved before resolve_after of quiet");
    alerts.observe(&healthy_snapshot(), t0 + 300 * MS);

    let p = pd.wait_for(2, WAIT).await;
    assert_eq!(p[0].body["event_action"], "trigger");
    let resolve = &p[1].body;
    assert_eq!(
        resolve,
        &json!({"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": p[0].body["dedup_key"]}),
        "a resolve carries exactly routing_key, event_action and the trigger's dedup_key"
    );
    assert_eq!(resolve["dedup_key"], fp);

    let s = slack.wait_for(2, WAIT).await;
    let text = s[1].body["text"].as_str().unwrap();
    assert!(
        text.contains("resolved") && text.contains(host) && text.contains("HTTP 200"),
        "{text}"
    );

    let w = wh.wait_for(2, WAIT).await;
    assert_eq!(w[1].body["event"], "incident.resolved");
    assert_eq!(w[1].body["payload"]["status"], "healthy");

    // GitHub: found #17 by its fingerprint → comment (no new issue), then the resolve comment.
    let g = gh.wait_for(3, WAIT).await;
    let calls: Vec<(Method, &str)> = g
        .iter()
        .map(|h| (h.method.clone(), h.path.as_str()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (Method::GET, "/repos/acme/web/issues"),
            (Method::POST, "/repos/acme/web/issues/17/comments"),
            (Method::POST, "/repos/acme/web/issues/17/comments"),
        ]
    );
    let recurred = g[1].body["body"].as_str().unwrap();
    assert!(recurred.starts_with("**Recurred**") && report::carries_fingerprint(recurred, &fp));
    let resolved = g[2].body["body"].as_str().unwrap();
    assert!(resolved.starts_with("**Resolved**"), "{resolved}");
    assert_eq!(gh.issues().len(), 2, "no issue created");
    assert!(
        gh.issues().iter().all(|i| i["state"] == "open"),
        "the issue stays open"
    );
    stop.cancel();
    alerts.closed().await;
}

// ---------------------------------------------------------------- 3. flapping

#[tokio::test]
async fn ten_flaps_within_resolve_after_are_one_incident() {
    let (slack, pd) = (Receiver::start().await, Receiver::start().await);
    let cfg = config(Receivers {
        slack: Some(&slack),
        pd: Some(&pd),
        ..Receivers::default()
    });
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, "web-test-3", &stop);
    let (bad, good) = (infra_snapshot(), healthy_snapshot());
    let t0 = Instant::now();
    for i in 0..10u32 {
        alerts.observe(&bad, t0 + i * 100 * MS);
        alerts.observe(&good, t0 + (i * 100 + 50) * MS);
        tokio::time::sleep(10 * MS).await;
    }
    alerts.observe(&good, t0 + 1000 * MS);
    alerts.observe(&good, t0 + 1300 * MS);
    let p = pd.wait_for(2, WAIT).await;
    slack.wait_for(2, WAIT).await;
    tokio::time::sleep(300 * MS).await;
    let actions: Vec<Value> = pd
        .hits()
        .iter()
        .map(|h| h.body["event_action"].clone())
        .collect();
    assert_eq!(actions, vec![json!("trigger"), json!("resolve")]);
    assert_eq!(p[0].body["payload"]["severity"], "warning");
    assert_eq!(p[0].body["payload"]["class"], "infrastructure_issue");
    assert_eq!(slack.hits().len(), 2);
    stop.cancel();
    alerts.closed().await;
}

// ---------------------------------------------------------------- 4. retries

#[tokio::test]
async fn retries_honour_retry_after_deliver_once_in_order_and_never_block_observe() {
    let pd = Receiver::start().await;
    pd.script(vec![
        Reply {
            headers: vec![("retry-after", "1")],
            delay: 300 * MS, // a stalling receiver
            ..reply(429)
        },
        reply(500),
    ]);
    let cfg = config(Receivers {
        pd: Some(&pd),
        ..Receivers::default()
    });
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, "web-test-4", &stop);
    let (bad, good) = (unhealthy_snapshot(), healthy_snapshot());
    let mut took = Vec::new();
    let begin = Instant::now();
    // Keep observing every 5 ms for 2 s: unhealthy for 0.4 s, then healthy (resolve queued
    // at ~0.6 s while the trigger is still being retried).
    while begin.elapsed() < Duration::from_secs(2) {
        let now = Instant::now();
        let snap = if now - begin < 400 * MS { &bad } else { &good };
        let t = Instant::now();
        alerts.observe(snap, now);
        took.push(t.elapsed());
        tokio::time::sleep(5 * MS).await;
    }
    let h = pd.wait_for(4, WAIT).await;
    tokio::time::sleep(500 * MS).await;
    let h2 = pd.hits();
    let actions: Vec<&str> = h2
        .iter()
        .map(|x| x.body["event_action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        vec!["trigger", "trigger", "trigger", "resolve"],
        "429, 500, then delivered; the resolve only after its trigger, each delivered once"
    );
    assert!(
        h[1].at - h[0].at >= Duration::from_secs(1),
        "Retry-After: 1 honoured"
    );
    assert!(
        h[2].at - h[1].at >= 150 * MS,
        "exponential backoff (2 × 100 ms) after the 500"
    );
    assert_eq!(h[1].body, h[0].body, "a retry resends the same message");

    took.sort();
    let (median, p99, max) = (
        took[took.len() / 2],
        took[took.len() * 99 / 100],
        *took.last().unwrap(),
    );
    // A blocking observe would take the receiver's 300 ms stall or the 1 s Retry-After; the
    // loose max only forgives the scheduler on a busy 2-core machine.
    assert!(median < 100 * Duration::from_micros(1), "median {median:?}");
    assert!(p99 < MS, "p99 {p99:?}");
    assert!(max < 50 * MS, "max {max:?}");
    stop.cancel();
    alerts.closed().await;
}

#[tokio::test]
async fn a_stalled_destination_does_not_delay_the_others() {
    let (slack, pd) = (Receiver::start().await, Receiver::start().await);
    slack.script(vec![Reply {
        delay: Duration::from_secs(3),
        ..reply(200)
    }]);
    let cfg = config(Receivers {
        slack: Some(&slack),
        pd: Some(&pd),
        ..Receivers::default()
    });
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, "web-test-5", &stop);
    let t = Instant::now();
    alerts.observe(&heal_failed_snapshot(), t);
    // Two incidents (unhealthy and heal_failed): PagerDuty gets both while Slack still hangs
    // on the first.
    let p = pd.wait_for(2, Duration::from_secs(2)).await;
    assert!(
        p[1].at - t < Duration::from_secs(1),
        "pagerduty waited for slack"
    );
    assert_eq!(slack.hits().len(), 1);
    let severities: Vec<&Value> = p.iter().map(|h| &h.body["payload"]["severity"]).collect();
    assert_eq!(severities, vec!["critical", "critical"]);
    slack.wait_for(2, WAIT).await;
    stop.cancel();
    alerts.closed().await;
}

#[tokio::test]
async fn shutdown_flushes_what_is_queued_but_not_forever() {
    let (ok, dead) = (Receiver::start().await, Receiver::start().await);
    dead.always(Reply {
        headers: vec![("retry-after", "60")],
        ..reply(503)
    });
    let cfg = config(Receivers {
        pd: Some(&ok),
        webhook: Some(&dead),
        ..Receivers::default()
    });
    let stop = CancellationToken::new();
    let mut alerts = Alerts::start_tuned(
        &cfg,
        "web-test-6".into(),
        stop.clone(),
        Tuning {
            flush: 500 * MS,
            ..tuning()
        },
    )
    .unwrap();
    alerts.observe(&unhealthy_snapshot(), Instant::now());
    stop.cancel();
    let t = Instant::now();
    alerts.closed().await;
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "flush is bounded: {:?}",
        t.elapsed()
    );
    assert_eq!(ok.hits().len(), 1, "the queued trigger was flushed");
    assert_eq!(
        dead.hits().len(),
        1,
        "tried once, then gave up at the deadline"
    );
}

// ---------------------------------------------------------------- 5. alert test

#[tokio::test]
async fn send_test_reaches_every_destination() {
    let (slack, pd, wh, gh) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let cfg = config(Receivers {
        slack: Some(&slack),
        pd: Some(&pd),
        webhook: Some(&wh),
        github: Some(&gh),
    });
    let results = send_test_tuned(&cfg, "web-test-7", &tuning()).await;
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    let webhook_name = format!("webhook {}", wh.addr);
    assert_eq!(
        names,
        vec![
            "slack",
            "pagerduty",
            webhook_name.as_str(),
            "github acme/web"
        ]
    );
    for (n, r) in &results {
        assert!(r.is_ok(), "{n}: {r:?}");
    }
    let s = slack.hits();
    assert!(s[0].body["text"]
        .as_str()
        .unwrap()
        .contains("test message from `web-test-7`"));
    let p = pd.hits();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].body["event_action"], "trigger");
    assert_eq!(p[0].body["payload"]["severity"], "info");
    assert_eq!(p[1].body["event_action"], "resolve");
    assert_eq!(p[1].body["dedup_key"], p[0].body["dedup_key"]);
    assert_eq!(wh.hits()[0].body["event"], "test");
    let g = gh.hits();
    assert_eq!(
        (&g[0].method, g[0].path.as_str()),
        (&Method::POST, "/repos/acme/web/issues")
    );
    assert_eq!(g[0].body["labels"], json!(["health-agent"]));
    assert_eq!(
        (&g[1].method, g[1].path.as_str()),
        (&Method::PATCH, "/repos/acme/web/issues/100")
    );
    assert_eq!(
        gh.issues()[0]["state"],
        "closed",
        "the test issue is closed again"
    );
}

#[tokio::test]
async fn send_test_reports_failures_and_nothing_configured() {
    assert!(send_test_tuned(&AlertsConfig::default(), "h", &tuning())
        .await
        .is_empty());
    let pd = Receiver::start().await;
    pd.always(Reply {
        body: json!({"status": "invalid event", "errors": [format!("routing_key {ROUTING_KEY} is not valid")]}),
        ..reply(400)
    });
    let mut cfg = config(Receivers {
        pd: Some(&pd),
        ..Receivers::default()
    });
    cfg.github_repo = "acme/web".into();
    cfg.github_token_env = "HA_TEST_NO_SUCH_TOKEN".into();
    // Never api.github.com, even if a token were found.
    cfg.github_api_url = "http://127.0.0.1:9".into();
    let results = send_test_tuned(&cfg, "h", &tuning()).await;
    assert_eq!(results.len(), 2);
    let (name, err) = (&results[0].0, results[0].1.as_ref().unwrap_err());
    assert_eq!(name, "pagerduty");
    assert!(matches!(err, AlertError::Rejected(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("400") && err.contains("not retried"), "{err}");
    // PagerDuty's status and message; its errors list, which quoted the key, left out.
    assert!(
        !err.contains(ROUTING_KEY) && err.contains("status: invalid event"),
        "{err}"
    );
    assert_eq!(pd.hits().len(), 1, "a 400 is not retried");
    let (name, err) = (&results[1].0, results[1].1.as_ref().unwrap_err());
    assert_eq!(name, "github acme/web");
    assert_eq!(err, &AlertError::NoToken("HA_TEST_NO_SUCH_TOKEN".into()));
    assert!(err.to_string().contains("HA_TEST_NO_SUCH_TOKEN"), "{err}");
}

// ---------------------------------------------------------------- 6. secrets

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn no_secret_reaches_a_log_line_or_an_error() {
    let logs = LogBuf::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // A Slack URL on a port nobody listens on, a webhook that always fails, a PagerDuty that
    // echoes the routing key back, a GitHub that rejects the token.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (pd, wh, gh) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    pd.always(Reply {
        body: json!({"errors": [format!("bad key {ROUTING_KEY}")]}),
        ..reply(400)
    });
    wh.always(reply(500));
    gh.always(Reply {
        body: json!({"message": format!("Bad credentials for {TOKEN}")}),
        ..reply(401)
    });
    let mut cfg = config(Receivers {
        pd: Some(&pd),
        webhook: Some(&wh),
        github: Some(&gh),
        ..Receivers::default()
    });
    cfg.slack_webhook_url = format!("http://{closed}{SLACK_PATH}");
    cfg.max_retries = 1;

    let results = send_test_tuned(&cfg, "web-test-8", &tuning()).await;
    assert!(results.iter().all(|(_, r)| r.is_err()), "{results:?}");
    let stop = CancellationToken::new();
    let mut alerts = start(&cfg, "web-test-8", &stop);
    alerts.observe(&unhealthy_snapshot(), Instant::now());
    wh.wait_for(2 + 2, WAIT).await; // alert test: 2 attempts; the trigger: 2 attempts
    let dests = [
        "slack".to_string(),
        "pagerduty".into(),
        format!("webhook {}", wh.addr),
        "github acme/web".into(),
    ];
    let until = Instant::now() + WAIT;
    loop {
        let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
        let missing: Vec<&String> = dests
            .iter()
            .filter(|d| {
                !text.lines().any(|l| {
                    l.contains("alert not delivered") && l.contains(&format!("destination={d}"))
                })
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "no failure logged for {missing:?}:\n{text}"
        );
        tokio::time::sleep(20 * MS).await;
    }
    stop.cancel();
    alerts.closed().await;

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    let mut outputs = text.clone();
    for (n, r) in &results {
        outputs.push_str(&format!("\n{n}: {r:?}"));
    }
    for secret in ["slackSECRET", ROUTING_KEY, "whSECRET42", TOKEN, SLACK_PATH] {
        assert!(!outputs.contains(secret), "{secret} leaked:\n{outputs}");
    }
    assert!(outputs.contains("cannot connect"), "{outputs}");
    assert!(
        outputs.contains(&format!("webhook {}", wh.addr)),
        "{outputs}"
    );
}
