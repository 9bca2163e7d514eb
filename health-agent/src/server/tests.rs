use super::*;
use crate::{
    checks::{ContainersReport, DatabaseReport, Report},
    heal::HealLog,
    policy::evaluate,
    snapshot::Snapshot,
    status::DiskLevel,
};
use arc_swap::ArcSwap;
use http_body_util::BodyExt as _;
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

fn report(disk: DiskLevel) -> Report {
    Report {
        web: crate::checks::web::WebReport::not_configured(),
        disk: crate::checks::disk::DiskReport {
            level: disk,
            mounts: Vec::new(),
        },
        system: None,
        // One watched container: with nothing watched at all (no web port either) the answer
        // is `degraded`, never `healthy`.
        containers: ContainersReport {
            state: crate::status::ContainersState::AllRunning,
            summary: "1/1 running".into(),
            ..ContainersReport::not_configured()
        },
        database: DatabaseReport::not_configured(),
    }
}

const FLEET_KEY: &str = "k4BXzRk0J1lHq3Qm6mQbC4sDq4kU5Xo2cTgR1Y0vZ8I=";

fn app(disk: DiskLevel, details: Details) -> Arc<App> {
    let r = report(disk);
    let d = evaluate(&crate::policy::PolicyInput::of(&r, false));
    Arc::new(App {
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(
            d,
            r,
            HealLog::default(),
            100,
            5,
        ))),
        details,
        token: Some("s3cret".into()),
        stale_after: Duration::from_secs(10),
        fleet_access: FleetAccess::Keyed(Arc::new(
            crate::fleet::key::Keyring::parse(FLEET_KEY, "test").unwrap(),
        )),
        fresh_gate: FreshGate::new(Duration::from_secs(2)),
        host: "web-1".into(),
        witness: Default::default(),
        socket_tracing: crate::config::SocketTracing::OnSuspicion,
    })
}

/// The real accept loop on 127.0.0.1, with `per_client` connections per address and
/// `timeout` for request heads and stalled writes.
async fn served(
    per_client: u32,
    timeout: Duration,
) -> (SocketAddr, Arc<Clients>, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let clients = Arc::new(Clients::new(per_client));
    let limits = Limits {
        slots: Arc::new(Semaphore::new(64)),
        clients: clients.clone(),
        header_timeout: timeout,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        router(app(DiskLevel::Ok, Details::Always)),
        limits,
        shutdown.clone(),
    ));
    (addr, clients, shutdown)
}

/// A blocking client socket bound to `from` (another loopback address is another client).
fn connect_from(from: [u8; 4], to: SocketAddr) -> std::net::TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&to.into()).unwrap();
    let s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// One request on `s`; the status code, or None when the server closed it.
fn ask(s: &mut std::net::TcpStream, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).ok()?;
    std::str::from_utf8(buf.get(9..12.min(n))?)
        .ok()?
        .parse()
        .ok()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let (addr, clients, shutdown) = served(3, Duration::from_secs(30)).await;
    let (held, extra, other) = blocking(move || {
        let mut held: Vec<_> = (0..3).map(|_| connect_from([127, 0, 0, 1], addr)).collect();
        let answered: Vec<_> = held.iter_mut().map(|s| ask(s, "/livez")).collect();
        let extra = ask(&mut connect_from([127, 0, 0, 1], addr), "/livez");
        let other = ask(&mut connect_from([127, 0, 0, 2], addr), "/livez");
        (answered, extra, other)
    })
    .await;
    assert_eq!(held, [Some(200); 3], "the first three are served");
    assert_eq!(extra, None, "the fourth from the same address is closed");
    assert_eq!(other, Some(200), "another address is served meanwhile");
    assert_eq!(clients.refused_total(), 1);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_off() {
    let (addr, clients, shutdown) = served(8, Duration::from_millis(500)).await;
    // Pipelines /metrics requests and never reads an answer: the server's writes fill both
    // socket buffers and stall.
    let flood = std::thread::spawn(move || {
        use std::io::Write as _;
        let mut s = connect_from([127, 0, 0, 1], addr);
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        let mut sent = 0;
        while s.write_all(&req).is_ok() {
            sent += 1000;
        }
        (sent, s)
    });
    let deadline = Instant::now() + Duration::from_secs(3);
    while clients.open_from([127, 0, 0, 1].into()) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        clients.open_from([127, 0, 0, 1].into()),
        1,
        "the flood connected"
    );
    let cut = loop {
        if clients.open_from([127, 0, 0, 1].into()) == 0 {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "never cut off"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (sent, _s) = blocking(move || flood.join().unwrap()).await;
    assert!(sent >= 1000, "it pipelined {sent} requests");
    // Another client is served the whole time, and after.
    let other = blocking(move || ask(&mut connect_from([127, 0, 0, 2], addr), "/health")).await;
    assert_eq!(other, Some(200));
    assert!(cut.elapsed() < Duration::from_secs(20));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let (addr, clients, shutdown) = served(8, Duration::from_millis(300)).await;
    let (first, idle_for) = blocking(move || {
        use std::io::Read as _;
        let mut s = connect_from([127, 0, 0, 1], addr);
        let first = ask(&mut s, "/livez");
        let t = Instant::now();
        let mut buf = [0u8; 16];
        // EOF (Ok(0)) once the server gives up on the next request.
        let n = s.read(&mut buf).unwrap_or(0);
        (first.filter(|_| n == 0), t.elapsed())
    })
    .await;
    assert_eq!(
        first,
        Some(200),
        "answered, then closed with nothing more sent"
    );
    assert!(
        idle_for >= Duration::from_millis(250) && idle_for < Duration::from_secs(3),
        "closed after {idle_for:?} idle"
    );
    // Its place is given back once the connection's task ends (just after the close).
    let deadline = Instant::now() + Duration::from_secs(2);
    while clients.open_from([127, 0, 0, 1].into()) != 0 {
        assert!(Instant::now() < deadline, "the slot was never given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
}

#[test]
fn the_connection_cap_fits_the_open_files_limit() {
    assert_eq!(connection_cap(1024, 1_048_576), 1024);
    assert_eq!(connection_cap(1024, 1024), 1024 - RESERVED_FDS as usize);
    assert_eq!(connection_cap(1024, 100), 16, "never below a handful");
}

/// The view is served only to an asker proven with the fleet key, and signed for its nonce;
/// without a key it is closed, saying why.
#[tokio::test]
async fn the_peer_view_needs_the_fleet_key_and_answers_signed() {
    use crate::fleet::{key::Keyring, proof};
    let a = app(DiskLevel::Ok, Details::Always);
    let ours = Keyring::parse(FLEET_KEY, "test").unwrap();
    let theirs = Keyring::parse("Zq0m3wN2b7f1Hk9Xc4Vt6Ls8Pa5Rd0Ey2Uj7Io3Gh1=", "test").unwrap();
    let nonce = proof::nonce();
    let path = format!("{}?nonce={nonce}", crate::fleet::VIEW_PATH);
    let view = |auth: Option<String>| {
        let mut r = req(&path);
        if let Some(a) = auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        r.body(Body::empty()).unwrap()
    };
    let now = proof::unix_now();
    for (auth, why) in [
        (None, "no proof"),
        (
            Some("Bearer s3cret".to_string()),
            "a bearer token is no proof",
        ),
        (Some(theirs.ask(&path, now)), "another fleet's key"),
        (Some(ours.ask(&path, now - 3_600)), "an ask an hour old"),
        (
            Some(ours.ask(&format!("{path}&fresh=dependency"), now)),
            "another path",
        ),
    ] {
        let resp = router(a.clone()).oneshot(view(auth)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{why}");
    }
    let resp = router(a.clone())
        .oneshot(view(Some(ours.ask(&path, now))))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let signed = resp.headers()[proof::PROOF_HEADER]
        .to_str()
        .unwrap()
        .to_string();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(ours.check_view(Some(&signed), &nonce, &body), Ok(()));
    assert!(
        ours.check_view(Some(&signed), &proof::nonce(), &body)
            .is_err(),
        "another ask"
    );
    let v = crate::fleet::PeerView::parse(&body).unwrap();
    assert_eq!((v.version, v.host.as_str()), (1, "web-1"));
    assert!(!String::from_utf8_lossy(&body).contains(FLEET_KEY));

    let closed = App {
        fleet_access: FleetAccess::Closed("no fleet key".into()),
        ..Arc::into_inner(app(DiskLevel::Ok, Details::Always)).unwrap()
    };
    let resp = router(Arc::new(closed))
        .oneshot(view(Some(ours.ask(&path, now))))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

async fn get(app: Arc<App>, req: Request<Body>) -> (StatusCode, HeaderMap, serde_json::Value) {
    let resp = router(app).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (parts.status, parts.headers, json)
}

fn req(uri: &str) -> axum::http::request::Builder {
    Request::builder().uri(uri)
}

#[tokio::test]
async fn healthy_body_has_the_seed_fields() {
    let (code, headers, body) = get(
        app(DiskLevel::Ok, Details::Always),
        req("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(body["status"], "healthy");
    assert_eq!(body["uptime"], 100);
    assert_eq!(body["recommendation"], "stable");
    for k in [
        "webserver",
        "database",
        "disk",
        "containers",
        "cpu",
        "memory",
    ] {
        assert!(
            body["checks"].get(k).is_some(),
            "checks.{k} missing: {body}"
        );
    }
    assert!(body["details"]["heal"].is_object(), "{body}");
}

#[tokio::test]
async fn full_disk_is_503_with_reason() {
    let (code, _, body) = get(
        app(DiskLevel::Fail, Details::Always),
        req("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "unhealthy");
    assert!(
        body["reasons"][0].as_str().unwrap().contains("disk"),
        "{body}"
    );
}

#[tokio::test]
async fn head_has_no_body_and_same_code() {
    let resp = router(app(DiskLevel::Fail, Details::Always))
        .oneshot(req("/health").method("HEAD").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.is_empty());
}

#[tokio::test]
async fn ietf_format_on_accept() {
    let (code, headers, body) = get(
        app(DiskLevel::Warn, Details::Always),
        req("/health")
            .header(header::ACCEPT, HEALTH_JSON)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], HEALTH_JSON);
    assert_eq!(body["status"], "warn");
    assert!(body["checks"]["disk:utilization"].is_array(), "{body}");
}

#[tokio::test]
async fn details_only_for_loopback_or_token() {
    // No peer (not loopback): brief body.
    let (_, _, body) = get(
        app(DiskLevel::Ok, Details::Loopback),
        req("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert!(body.get("details").is_none(), "{body}");
    assert_eq!(body["status"], "healthy");
    let mut r = req("/health").body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(Peer("127.0.0.1:5000".parse().unwrap()));
    let (_, _, body) = get(app(DiskLevel::Ok, Details::Loopback), r).await;
    assert!(body.get("details").is_some());
    let mut r = req("/health").body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(Peer("10.1.2.3:5000".parse().unwrap()));
    let (_, _, body) = get(app(DiskLevel::Ok, Details::Loopback), r).await;
    assert!(body.get("details").is_none());

    let (_, _, body) = get(
        app(DiskLevel::Ok, Details::Token),
        req("/health")
            .header(header::AUTHORIZATION, "Bearer wrong")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(body.get("details").is_none());
    let (_, _, body) = get(
        app(DiskLevel::Ok, Details::Token),
        req("/health")
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(body.get("details").is_some());
}

#[tokio::test]
async fn stale_snapshot_is_503() {
    let a = app(DiskLevel::Ok, Details::Always);
    let a = Arc::new(App {
        snapshot: a.snapshot.clone(),
        details: Details::Always,
        token: None,
        stale_after: Duration::ZERO,
        fleet_access: FleetAccess::NotConfigured,
        fresh_gate: FreshGate::default(),
        host: "web-1".into(),
        witness: Default::default(),
        socket_tracing: crate::config::SocketTracing::OnSuspicion,
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (code, _, body) = get(a, req("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body["reasons"][0].as_str().unwrap().contains("check loop"),
        "{body}"
    );
}

#[tokio::test]
async fn metrics_and_livez_and_404() {
    let resp = router(app(DiskLevel::Ok, Details::Always))
        .oneshot(req("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(text.contains("health_agent_http_status 200"), "{text}");
    assert!(
        !text.contains("# EOF"),
        "the text format 0.0.4 by default:\n{text}"
    );
    assert!(text.contains("# TYPE health_agent_heal_attempts_total counter"));
    // OpenMetrics for a client that prefers it, as Prometheus does.
    let resp = router(app(DiskLevel::Ok, Details::Always))
        .oneshot(
            req("/metrics")
                .header(
                    header::ACCEPT,
                    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                )
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    let om = String::from_utf8(b.to_vec()).unwrap();
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# TYPE health_agent_heal_attempts counter"),
        "{om}"
    );
    // server.details = "loopback": the mounts' names only for a loopback client.
    let metrics = |peer: &str| {
        let mut r = req("/metrics").body(Body::empty()).unwrap();
        r.extensions_mut().insert(Peer(peer.parse().unwrap()));
        r
    };
    let text = |resp: Response| async {
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(b.to_vec()).unwrap()
    };
    let mut a = app(DiskLevel::Ok, Details::Loopback);
    Arc::get_mut(&mut a).unwrap().snapshot = {
        let mut r = report(DiskLevel::Ok);
        r.disk.mounts.push(crate::checks::disk::MountUsage {
            path: "/srv/secret-project".into(),
            used_percent: 42.0,
            total_bytes: 1,
            available_bytes: 1,
            level: DiskLevel::Ok,
            error: None,
        });
        let d = evaluate(&crate::policy::PolicyInput::of(&r, false));
        Arc::new(ArcSwap::from_pointee(Snapshot::new(
            d,
            r,
            HealLog::default(),
            1,
            1,
        )))
    };
    let local = text(
        router(a.clone())
            .oneshot(metrics("127.0.0.1:5000"))
            .await
            .unwrap(),
    )
    .await;
    assert!(local.contains("/srv/secret-project"), "{local}");
    let remote = text(router(a).oneshot(metrics("10.1.2.3:5000")).await.unwrap()).await;
    assert!(!remote.contains("/srv/secret-project"), "{remote}");
    assert!(
        remote.contains("health_agent_disk_used_ratio_max 0.42"),
        "{remote}"
    );
    let resp = router(app(DiskLevel::Ok, Details::Always))
        .oneshot(req("/livez").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = router(app(DiskLevel::Ok, Details::Always))
        .oneshot(req("/nope").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn every_5xx_is_fail_in_the_health_json_format() {
    // Booting, the backend not seen serving: 503 with status `booting`.
    let mut r = report(DiskLevel::Ok);
    r.web.verdict = crate::status::WebVerdict::Down;
    let mut input = crate::policy::PolicyInput::of(&r, true);
    input.web_served = false;
    let d = evaluate(&input);
    assert_eq!((d.http, d.status), (503, crate::status::Status::Booting));
    let a = App {
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(
            d,
            r,
            HealLog::default(),
            100,
            5,
        ))),
        ..Arc::into_inner(app(DiskLevel::Ok, Details::Always)).unwrap()
    };
    let (code, _, body) = get(
        Arc::new(a),
        req("/health")
            .header(header::ACCEPT, HEALTH_JSON)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "fail", "{body}");
}

#[tokio::test]
async fn without_fleet_there_is_no_peer_view() {
    let a = App {
        fleet_access: FleetAccess::NotConfigured,
        ..Arc::into_inner(app(DiskLevel::Ok, Details::Always)).unwrap()
    };
    let resp = router(Arc::new(a))
        .oneshot(req(crate::fleet::VIEW_PATH).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_body_has_the_seed_fields_first_and_generated_at() {
    for details in [Details::Always, Details::Token] {
        let resp = router(app(DiskLevel::Ok, details))
            .oneshot(req("/health").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.starts_with(r#"{"status":"healthy","uptime":100,"checks":{"#),
            "{text}"
        );
        let order: Vec<usize> = ["\"recommendation\"", "\"reasons\"", "\"generated_at\""]
            .iter()
            .map(|k| text.find(k).unwrap_or_else(|| panic!("no {k}: {text}")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(text.contains("\"details\""), details == Details::Always);
    }
}

#[tokio::test]
async fn cpu_and_memory_each_have_their_own_status_in_the_health_json_format() {
    // A busy CPU (95 %, sustained) and 4 % memory: the CPU warns, the memory passes.
    let mut r = report(DiskLevel::Ok);
    r.system = Some(crate::checks::system::SystemReport {
        cpu_percent: 95.0,
        memory_percent: 4.0,
        cpu_avg_percent: 95.0,
        memory_avg_percent: 4.0,
        cpu_high: true,
        memory_high: false,
        window_seconds: 60.0,
        load1: 2.0,
        load5: 2.0,
        cpus: 2,
        memory_total_bytes: 1 << 30,
        memory_available_bytes: 1 << 29,
        pressure: crate::status::Pressure::High,
    });
    let d = evaluate(&crate::policy::PolicyInput::of(&r, false));
    assert!(
        d.reasons.iter().any(|r| r == "sustained high CPU"),
        "{:?}",
        d.reasons
    );
    let a = App {
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(
            d,
            r,
            HealLog::default(),
            100,
            5,
        ))),
        ..Arc::into_inner(app(DiskLevel::Ok, Details::Always)).unwrap()
    };
    let (_, _, body) = get(
        Arc::new(a),
        req("/health")
            .header(header::ACCEPT, HEALTH_JSON)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        body["checks"]["cpu:utilization"][0]["status"], "warn",
        "{body}"
    );
    assert_eq!(
        body["checks"]["memory:utilization"][0]["status"], "pass",
        "{body}"
    );
}
