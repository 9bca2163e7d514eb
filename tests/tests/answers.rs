//! What the backend answers, against real servers: Debian's Puma with a Rack app that raises
//! (Puma answers 500) and nginx `return 500`, over keep-alive and a new connection per request,
//! while their health path still answers 200. Alone (no `[fleet]`), an erroring backend is
//! restarted once and then kept in rotation, degraded, with an alert; a 404 flood or a 2 % 5xx
//! share is healthy; a TLS backend's status is not visible, and it stays healthy.
//!
//! Every test records every `/health` answer of its run ([`HealthPoller`]) and asserts over all
//! of them.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use health_agent_tests::{
    agent_binary, free_port, get, request_at, require_root, tail, timeline, wait_until, web_config,
    Agent, Ca, HealthPoller, HealthSample, Load, Nginx, NginxOptions, Puma, PumaOptions, Receiver,
    Watch, Watched,
};

/// Agent start to a first verdict.
const WAIT: Duration = Duration::from_secs(30);

/// Puma's real pages raise while `/up` answers 200; alone, the agent restarts it once (a
/// restart that really replaces Puma, whose new process raises too), then keeps it at 200
/// `degraded` with the share named, and never answers 503.
/// With no restart target, nothing was restarted.
fn assert_no_restart(body: &serde_json::Value, ctx: &str) {
    let attempts = body["details"]["heal"]["total_attempts"].as_u64();
    assert_eq!(
        attempts.unwrap_or(0),
        0,
        "no restart target, no restart: {body:#}{ctx}"
    );
}

#[test]
fn puma_that_raises_alone_is_restarted_once_then_degraded_never_503() {
    require_root();
    for mode in ["always", "on_suspicion"] {
        let dir = tempfile::tempdir().unwrap();
        let error_file = dir.path().join("broken");
        let puma = Puma::start(PumaOptions {
            error_file: Some(error_file.clone()),
            ..Default::default()
        });
        let w = Watched::new(puma, |puma| {
            let script = puma.restart_script().display().to_string();
            let web = format!("[web]\nrestart_command = {script:?}\nsocket_tracing = \"{mode}\"\n");
            web_config(puma.port, &web)
        });
        let load = Load::keep_alive(w.puma.port, "/orders", 2, Duration::from_secs(5));
        w.wait_healthy();
        let first = w.puma.pid();
        std::fs::write(&error_file, "").unwrap();
        let broke = w.poller.elapsed();
        let degraded = w.wait(Duration::from_secs(40), "degraded after one restart", |s| {
            s.code == 200
                && s.status == "degraded"
                && s.webserver == "erroring"
                && s.body["details"]["heal"]["total_attempts"] == 1
                && s.body["details"]["heal"]["phase"] == "exhausted"
        });
        println!(
            "{mode}: errors began → degraded after one restart in {:.1}s ({degraded})",
            degraded.after(broke)
        );
        std::thread::sleep(Duration::from_secs(3));
        let (code, body) = w.agent.health();
        let (samples, _, ctx) = w.finish(load, Duration::ZERO);
        assert_ne!(
            w.puma.current_pid(),
            first,
            "the restart did not replace Puma{ctx}"
        );
        assert_eq!(code, 200, "{body:#}{ctx}");
        let answers = &body["details"]["web"]["answers"];
        assert_eq!(answers["status_visible"], true, "{answers:#}{ctx}");
        assert!(
            answers["share_5xx"].as_f64().is_some_and(|s| s > 0.9),
            "{answers:#}{ctx}"
        );
        assert!(
            answers["probe_answers"].as_u64().is_some_and(|n| n > 0),
            "the probe's answers are counted apart: {answers:#}{ctx}"
        );
        let heal = &body["details"]["heal"];
        assert_eq!(
            heal["total_attempts"], 1,
            "one restart, no more: {heal:#}{ctx}"
        );
        if let Some(s) = samples.iter().find(|s| s.code == 503) {
            panic!("a 503 for an erroring backend with no peers: {s}{ctx}");
        }
        let metrics = w.agent.metrics();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("health_agent_web_responses_total{class=\"5xx\"}")),
            "{metrics}"
        );
        std::fs::remove_file(&error_file).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// nginx, a 404 flood, a 2 % 5xx share, recovery, TLS.
// ---------------------------------------------------------------------------------------------

/// Every answer the agent may give while the box must stay in rotation: 200. A 503 (or no
/// answer) anywhere in the run fails the test, naming the first one.
fn assert_all_200(samples: &[HealthSample], ctx: &str) {
    if let Some(s) = samples.iter().find(|s| s.code != 200) {
        panic!("an answer other than 200 for a backend that must stay in rotation: {s}{ctx}");
    }
}

/// What a failed assertion of a test without Puma prints: every answer, the load, the agent's
/// log and the server's.
fn explain(agent: &Agent, samples: &[HealthSample], load: &str, server_log: &str) -> String {
    format!(
        "\n/health answers:\n{}load: {load}\nserver log (tail):\n{}\nagent log (tail):\n{}\nlast body: {}",
        timeline(samples),
        tail(server_log, 20),
        tail(&agent.logs(), 40),
        samples
            .last()
            .map(|s| serde_json::to_string_pretty(&s.body).unwrap_or_default())
            .unwrap_or_default()
    )
}

/// nginx with a second `server` of the test's own on a free port, put into its `http` block
/// (nginx.rs builds one server, serving files, whose `location /` cannot be replaced): `body`
/// is that server's directives after `listen 127.0.0.1:PORT{listen_extra};`. Returns nginx
/// and the port of that server, which is the one the tests watch.
fn nginx_with_server(listen_extra: &str, body: &str) -> (Nginx, u16) {
    let port = free_port();
    let nginx = Nginx::launch(NginxOptions {
        http_extra: format!(
            "server {{\n    listen 127.0.0.1:{port}{listen_extra};\n    {body}\n  }}\n"
        ),
        ..NginxOptions::default()
    });
    (nginx, port)
}

fn nginx_log(nginx: &Nginx) -> String {
    std::fs::read_to_string(nginx.dir.path().join("error.log")).unwrap_or_default()
}

/// nginx whose real pages `return 500` while `/up` answers 200.
fn nginx_returning_500() -> (Nginx, u16) {
    let (nginx, port) = nginx_with_server(
        "",
        "location = /up { return 200 \"ok\\n\"; }\n    location / { return 500; }",
    );
    // The fixture itself: the probe path says 200, every other path 500.
    assert_eq!(get(port, "/up").map(|(c, _)| c).ok(), Some(200));
    assert_eq!(get(port, "/orders").map(|(c, _)| c).ok(), Some(500));
    (nginx, port)
}

#[derive(Clone, Copy, Debug)]
enum Traffic {
    KeepAlive,
    NewConnections,
}

impl Traffic {
    fn start(self, port: u16, path: &str) -> Load {
        match self {
            Self::KeepAlive => Load::keep_alive(port, path, 2, Duration::from_secs(5)),
            Self::NewConnections => Load::new_connections(
                port,
                path,
                2,
                Duration::from_millis(5),
                Duration::from_secs(5),
            ),
        }
    }
}

/// nginx `return 500` on every real page, no restart target, alone, in both socket-tracing
/// modes: `erroring` and 200 `degraded` within 10 s of the load's start, the share shown, an
/// `erroring` alert delivered to the webhook, never a 503.
fn nginx_500_alone(traffic: Traffic) {
    require_root();
    for mode in ["always", "on_suspicion"] {
        let (nginx, port) = nginx_returning_500();
        let hook = Receiver::ok();
        let agent = Agent::start(&web_config(
            port,
            &format!(
                "[web]\nsocket_tracing = \"{mode}\"\n[alerts]\nwebhook_url = \"{}\"\n",
                hook.url("/hook")
            ),
        ));
        let poller = HealthPoller::start(agent.port);
        let logs = || format!("\nagent log (tail):\n{}", tail(&agent.logs(), 40));
        poller.wait_for_explained(
            WAIT,
            "healthy before the traffic",
            |s| s.code == 200 && s.status == "healthy" && s.webserver == "up",
            logs,
        );
        let load = traffic.start(port, "/orders");
        let started = poller.elapsed();
        let erroring = poller.wait_for_from(
            started,
            Duration::from_secs(20),
            "200 degraded, erroring",
            |s| s.code == 200 && s.status == "degraded" && s.webserver == "erroring",
            || format!("\nload: {}{}", load.stats(), logs()),
        );
        let took = erroring.at.saturating_sub(started).as_secs_f64();
        println!(
            "nginx 500, {traffic:?}, {mode}: load start → erroring in {took:.1}s ({erroring})"
        );
        let alert = wait_until(
            Duration::from_secs(15),
            "an erroring alert at the webhook",
            || {
                hook.posts().into_iter().find(|r| {
                    r.body["event"] == "incident.triggered"
                        && r.body["payload"]["incident"]["condition"] == "erroring"
                })
            },
        );
        println!(
            "  erroring alert at the webhook by {:.1}s after the load started",
            poller.elapsed().saturating_sub(started).as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(1));
        let (code, body) = agent.health();
        let stats = load.stop();
        let samples = poller.stop();
        let ctx = explain(&agent, &samples, &stats.to_string(), &nginx_log(&nginx));
        assert!(
            took <= 10.0,
            "erroring {took:.1}s after the load started{ctx}"
        );
        assert_all_200(&samples, &ctx);
        assert_eq!(code, 200, "{body:#}{ctx}");
        assert_eq!(body["status"], "degraded", "{body:#}{ctx}");
        assert_eq!(body["recommendation"], "stable", "{body:#}{ctx}");
        assert_eq!(body["checks"]["webserver"], "erroring", "{body:#}{ctx}");
        let answers = &body["details"]["web"]["answers"];
        assert_eq!(answers["status_visible"], true, "{answers:#}{ctx}");
        assert_eq!(answers["erroring"], true, "{answers:#}{ctx}");
        assert!(
            answers["share_5xx"].as_f64().is_some_and(|s| s > 0.9),
            "{answers:#}{ctx}"
        );
        assert!(
            stats.count(500) > 0 && stats.count(200) == 0,
            "the load got nginx's 500s: {stats}{ctx}"
        );
        let incident = &alert.body["payload"];
        assert_eq!(incident["http"], 200, "{:#}{ctx}", alert.body);
        assert_eq!(incident["status"], "degraded", "{:#}{ctx}", alert.body);
        assert_no_restart(&body, &ctx);
        println!("{}", timeline(&samples));
    }
}

#[test]
fn nginx_returning_500_keep_alive_alone_is_erroring_degraded_never_503_and_alerts() {
    nginx_500_alone(Traffic::KeepAlive);
}

#[test]
fn nginx_returning_500_new_connections_alone_is_erroring_degraded_never_503_and_alerts() {
    nginx_500_alone(Traffic::NewConnections);
}

/// Puma under ~15 s of keep-alive load on `path`, no restart target: every answer 200
/// `healthy`, webserver `up`, never `erroring`. Returns the last `details.web.answers`, whose
/// shares the callers assert: counted all along (`socket_tracing = "always"`), not sampled.
fn puma_stays_healthy(path: &str) -> serde_json::Value {
    require_root();
    let w = Watched::new(Puma::start(PumaOptions::default()), |puma| {
        web_config(puma.port, "[web]\nsocket_tracing = \"always\"\n")
    });
    w.wait_healthy();
    let from = w.poller.elapsed();
    let load = Load::keep_alive(w.puma.port, path, 2, Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(15));
    let (code, body) = w.agent.health();
    let (samples, stats, ctx) = w.finish(load, from);
    assert!(stats.answers() > 100, "the load got answers: {stats}{ctx}");
    if let Some(s) = samples
        .iter()
        .find(|s| !(s.code == 200 && s.status == "healthy" && s.webserver == "up"))
    {
        panic!("not 200 healthy/up under {path}: {s}{ctx}");
    }
    if let Some(s) = samples
        .iter()
        .find(|s| s.web()["answers"]["erroring"] != false)
    {
        panic!(
            "answers judged erroring (or not shown) under {path}: {s} {:#}{ctx}",
            s.web()["answers"]
        );
    }
    assert_eq!(code, 200, "{body:#}{ctx}");
    let answers = body["details"]["web"]["answers"].clone();
    assert_eq!(answers["status_visible"], true, "{answers:#}{ctx}");
    println!("{path}: load {stats}\n  answers {answers}");
    println!("{}", timeline(&samples));
    answers
}

/// A 404 flood is not a fault: healthy throughout, the 4xx shown.
#[test]
fn puma_404_flood_is_healthy_never_erroring() {
    let answers = puma_stays_healthy("/missing");
    let n4 = answers["by_class"]["4xx"].as_u64().unwrap_or(0);
    let total = answers["answers"].as_u64().unwrap_or(0);
    assert!(
        n4 > 0 && n4 * 10 >= total * 9,
        "the flood's 404s: {answers:#}"
    );
    assert_eq!(answers["share_5xx"].as_f64(), Some(0.0), "{answers:#}");
}

/// An app's everyday noise (one 500 in fifty) is healthy, the small share shown.
#[test]
fn puma_flaky_2_percent_5xx_is_healthy_never_erroring() {
    let answers = puma_stays_healthy("/flaky");
    let share = answers["share_5xx"].as_f64();
    assert!(
        share.is_some_and(|s| s > 0.0 && s < 0.1),
        "a share near 2 %: {answers:#}"
    );
}

/// Puma's pages raise (no restart target): erroring, 200 degraded; the error goes away:
/// healthy again within 15 s, never a 503.
#[test]
fn puma_that_stops_raising_is_healthy_again_within_15s() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let error_file = dir.path().join("broken");
    let puma = Puma::start(PumaOptions {
        error_file: Some(error_file.clone()),
        ..Default::default()
    });
    let w = Watched::new(puma, |puma| web_config(puma.port, ""));
    let load = Load::keep_alive(w.puma.port, "/orders", 2, Duration::from_secs(5));
    w.wait_healthy();
    std::fs::write(&error_file, "").unwrap();
    let broke = w.poller.elapsed();
    let degraded = w.wait(Duration::from_secs(20), "200 degraded, erroring", |s| {
        s.code == 200 && s.status == "degraded" && s.webserver == "erroring"
    });
    println!(
        "errors began → degraded, erroring in {:.1}s ({degraded})",
        degraded.after(broke)
    );
    // A whole window of 5xx before the fix: recovery has to outweigh all of it.
    std::thread::sleep(Duration::from_secs(10));
    let (_, broken) = w.agent.health();
    let share = broken["details"]["web"]["answers"]["share_5xx"].as_f64();
    assert!(
        share.is_some_and(|s| s > 0.9),
        "a window of 5xx: {:#}{}",
        broken["details"]["web"]["answers"],
        w.context(&w.poller.samples(), &load.stats().to_string())
    );
    std::fs::remove_file(&error_file).unwrap();
    let fixed = w.poller.elapsed();
    let healthy = w.wait_healthy();
    let took = healthy.after(fixed);
    println!("errors ended → healthy in {took:.1}s ({healthy})");
    std::thread::sleep(Duration::from_secs(2));
    let (code, body) = w.agent.health();
    let (samples, _, ctx) = w.finish(load, Duration::ZERO);
    assert!(
        took <= 15.0,
        "healthy {took:.1}s after the errors ended{ctx}"
    );
    assert_all_200(&samples, &ctx);
    assert_eq!(
        (
            code,
            body["status"].as_str(),
            body["checks"]["webserver"].as_str()
        ),
        (200, Some("healthy"), Some("up")),
        "stays healthy: {body:#}{ctx}"
    );
    assert_no_restart(&body, &ctx);
    println!("{}", timeline(&samples));
}

/// `curl -k` clients fetching `https://127.0.0.1:PORT/` over and over, each run of curl
/// fetching it 20 times on one connection (keep-alive) and then exiting (a new connection),
/// counting the status codes curl reports.
struct TlsLoad {
    stop: Arc<AtomicBool>,
    codes: Arc<Mutex<BTreeMap<String, u64>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl TlsLoad {
    fn start(port: u16, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let codes = Arc::new(Mutex::new(BTreeMap::new()));
        let url = format!("https://127.0.0.1:{port}/orders");
        let threads = (0..clients)
            .map(|_| {
                let (stop, codes, url) = (stop.clone(), codes.clone(), url.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        let mut cmd = Command::new("curl");
                        cmd.args(["-sk", "--max-time", "5", "-w", "%{http_code}\\n"]);
                        for _ in 0..20 {
                            cmd.args(["-o", "/dev/null", &url]);
                        }
                        let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output();
                        let text = out
                            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                            .unwrap_or_else(|e| format!("spawn:{e}\n"));
                        if let Ok(mut c) = codes.lock() {
                            for line in text.lines() {
                                *c.entry(line.to_string()).or_default() += 1;
                            }
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            codes,
            threads,
        }
    }

    /// Stops the clients; the status codes curl reported, with counts.
    fn stop(mut self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.codes.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// A TLS backend: the status is encrypted, so the answers are shown as not visible (naming
/// TLS), and nothing is judged from them: 200, never `erroring`.
#[test]
fn tls_backend_status_not_visible_and_never_erroring() {
    require_root();
    let ca = Ca::new("health-agent-tests answers CA");
    let cert = ca.server("127.0.0.1", &["IP:127.0.0.1", "DNS:localhost"]);
    let (nginx, port) = nginx_with_server(
        " ssl",
        &format!(
            "ssl_certificate {};\n    ssl_certificate_key {};\n    location / {{ return 200 \"hello\\n\"; }}",
            cert.cert.display(),
            cert.key.display()
        ),
    );
    let probe = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "5",
            "-w",
            "%{http_code}",
            "-o",
            "/dev/null",
        ])
        .arg(format!("https://127.0.0.1:{port}/"))
        .output()
        .expect("running curl");
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout),
        "200",
        "nginx answers over TLS: {}",
        nginx_log(&nginx)
    );
    let agent = Agent::start(&web_config(port, "[web]\nprobe_path = \"\"\n"));
    let poller = HealthPoller::start(agent.port);
    poller.wait_for_explained(
        WAIT,
        "200 healthy before the traffic (idle, with no probe path, the webserver is unknown)",
        |s| s.code == 200 && s.status == "healthy",
        || tail(&agent.logs(), 40),
    );
    let from = poller.elapsed();
    let load = TlsLoad::start(port, 2);
    let hidden = poller.wait_for_from(
        from,
        Duration::from_secs(15),
        "the answers shown as not visible",
        |s| s.web()["answers"]["status_visible"] == false,
        || tail(&agent.logs(), 40),
    );
    println!(
        "TLS load start → status_visible false in {:.1}s ({hidden})",
        hidden.at.saturating_sub(from).as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(10));
    let (code, body) = agent.health();
    let codes = load.stop();
    let samples = poller.stop();
    let ctx = explain(&agent, &samples, &format!("{codes:?}"), &nginx_log(&nginx));
    assert!(
        codes.get("200").copied().unwrap_or(0) > 100,
        "the TLS load got answers{ctx}"
    );
    assert_all_200(&samples, &ctx);
    if let Some(s) = samples
        .iter()
        .find(|s| s.webserver == "erroring" || s.web()["answers"]["erroring"] == true)
    {
        panic!("erroring for a TLS backend: {s}{ctx}");
    }
    assert_eq!(code, 200, "{body:#}{ctx}");
    let answers = &body["details"]["web"]["answers"];
    assert_eq!(answers["status_visible"], false, "{answers:#}{ctx}");
    let not_visible = answers["not_visible"].as_str().unwrap_or_default();
    assert!(not_visible.contains("TLS"), "{answers:#}{ctx}");
    println!(
        "TLS load: {codes:?}\n  final: {code} {} webserver={} answers {answers}",
        body["status"], body["checks"]["webserver"]
    );
    println!("{}", timeline(&samples));
}

/// The body every real page of [`RelayingBackend`] carries: an upstream's whole 500 answer.
const CAPTURED_500: &str = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\
                            Content-Length: 5\r\n\r\noops\n";

/// A backend that relays a captured upstream answer: every real page is a `200` whose body is
/// [`CAPTURED_500`], written after the head so that it starts a TCP segment of its own (as a
/// proxy's relayed error page, or a large body whose later segment starts with those bytes);
/// `/up` answers 200 `ok`. Threads of the test process, on keep-alive connections; stopped on
/// drop.
struct RelayingBackend {
    port: u16,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl RelayingBackend {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the backend");
        let port = listener.local_addr().expect("the backend's address").port();
        // Polled, so that the accept loop sees `stop`.
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let accept = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let flag = flag.clone();
                        std::thread::spawn(move || relay(conn, &flag));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            port,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for RelayingBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Answers the requests of one connection until the client closes it or `stop`.
fn relay(mut conn: TcpStream, stop: &AtomicBool) {
    // Each write goes out at once, in a segment of its own: the body's starts a segment.
    if conn.set_nonblocking(false).is_err()
        || conn.set_nodelay(true).is_err()
        || conn
            .set_read_timeout(Some(Duration::from_millis(200)))
            .is_err()
    {
        return;
    }
    let mut pending = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
            match conn.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
                // The read timeout: look at `stop` again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
            continue;
        };
        let head: Vec<u8> = pending.drain(..end + 4).collect();
        let line = String::from_utf8_lossy(&head);
        let mut words = line.split(' ');
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let sent = if path == "/up" {
            let body = if method == "HEAD" { "" } else { "ok\n" };
            conn.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{body}").as_bytes())
        } else {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                CAPTURED_500.len()
            );
            conn.write_all(head.as_bytes()).and_then(|()| {
                // The head on the wire before the body is written: never one segment.
                std::thread::sleep(Duration::from_millis(1));
                conn.write_all(CAPTURED_500.as_bytes())
            })
        };
        let close = line
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n");
        if sent.is_err() || close {
            return;
        }
    }
}

/// The value of the `/metrics` sample `name` (with its labels), if shown.
fn metric(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A 200 whose body begins `HTTP/1.1 500 Internal Server Error` (a relayed upstream answer, in
/// a TCP segment of its own) is a 2xx answer and nothing else: only the first segment the
/// server sends after a request holds a status line. Under real traffic the agent shows the
/// 2xx answers and no 5xx, in `/health` and `/metrics`, and never judges the box `erroring`
/// (counted as a 5xx too, each answer would make the share 50 %, `web.error_share`).
#[test]
fn a_body_that_begins_like_a_500_status_line_is_not_a_5xx() {
    require_root();
    let backend = RelayingBackend::start();
    // The fixture itself: a 200 whose body is the upstream's 500.
    let fetched = get(backend.port, "/orders").expect("GET /orders from the backend");
    assert_eq!(fetched, (200, CAPTURED_500.to_string()));
    let agent = Agent::start(&web_config(
        backend.port,
        "[web]\nsocket_tracing = \"always\"\n",
    ));
    let poller = HealthPoller::start(agent.port);
    poller.wait_for_explained(
        WAIT,
        "healthy before the traffic",
        |s| s.code == 200 && s.status == "healthy" && s.webserver == "up",
        || tail(&agent.logs(), 40),
    );
    let from = poller.elapsed();
    let load = Load::keep_alive(backend.port, "/orders", 2, Duration::from_secs(5));
    // Far more than `web.error_min_answers`, and longer than a run of failing seconds.
    std::thread::sleep(Duration::from_secs(8));
    let (code, body) = agent.health();
    let metrics = agent.metrics();
    let stats = load.stop();
    let samples = poller.stop();
    let ctx = explain(&agent, &samples, &stats.to_string(), "");
    assert!(
        stats.answers() > 100 && stats.count(200) == stats.answers(),
        "the load got the backend's 200s: {stats}{ctx}"
    );
    if let Some(s) = samples.iter().filter(|s| s.at >= from).find(|s| {
        s.code != 200 || s.webserver == "erroring" || s.web()["answers"]["erroring"] != false
    }) {
        panic!("a relayed 500 in a body judged as errors: {s}{ctx}");
    }
    assert_eq!(code, 200, "{body:#}{ctx}");
    let answers = &body["details"]["web"]["answers"];
    let class = |v: &serde_json::Value, c: &str| v[c].as_u64().unwrap_or(0);
    assert_eq!(answers["status_visible"], true, "{answers:#}{ctx}");
    // The programs saw this backend's answers: the 2xx are there, the bodies are not.
    assert!(
        class(&answers["by_class"], "2xx") > 100,
        "the 200s counted: {answers:#}{ctx}"
    );
    assert_eq!(
        (
            class(&answers["by_class"], "5xx"),
            class(&answers["total_by_class"], "5xx")
        ),
        (0, 0),
        "a body counted as a 5xx: {answers:#}{ctx}"
    );
    assert_eq!(answers["share_5xx"].as_f64(), Some(0.0), "{answers:#}{ctx}");
    let total = |c: &str| {
        metric(
            &metrics,
            &format!("health_agent_web_responses_total{{class=\"{c}\"}}"),
        )
    };
    assert!(
        total("2xx").is_some_and(|n| n > 100.0) && total("5xx").unwrap_or(0.0) == 0.0,
        "/metrics answers by class:\n{metrics}{ctx}"
    );
    println!("relayed 500 bodies: load {stats}\n  answers {answers}");
}

/// Whether `v` has at most `decimals` decimal places (as the nearest double has them).
fn rounded(v: f64, decimals: i32) -> bool {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale == v
}

/// The numbers in `v` with more than `most` decimals, each with its path: the noise of a
/// figure never rounded (`latency_ms: 5.3812809999999995`).
fn long_decimals(v: &serde_json::Value, path: &str, most: i32, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Number(n)
            if n.is_f64() && !n.as_f64().is_some_and(|x| rounded(x, most)) =>
        {
            out.push(format!("{path} = {n}"));
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                long_decimals(x, &format!("{path}[{i}]"), most, out);
            }
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                long_decimals(x, &format!("{path}.{k}"), most, out);
            }
        }
        _ => {}
    }
}

/// Every figure a user reads is rounded to what it means, in every format: `/health` with its
/// details, the health+json format, `check --json` (at most 3 decimals: a ratio's 0.1 %), and
/// `/metrics` (at most 5: seconds to 10 µs), while real traffic gives the latency, rate and
/// share figures something to show.
#[test]
fn every_figure_is_written_out_rounded_in_every_format() {
    require_root();
    let w = Watched::new(Puma::start(PumaOptions::default()), |puma| {
        web_config(puma.port, "[web]\nsocket_tracing = \"always\"\n")
    });
    let load = Load::keep_alive(w.puma.port, "/orders", 2, Duration::from_secs(5));
    w.wait_healthy();
    std::thread::sleep(Duration::from_secs(4));
    let parse = |what: &str, body: &str| -> serde_json::Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{what} is not JSON ({e}): {body}"))
    };
    let (_, health) = w.agent.get("/health").expect("GET /health");
    let (_, _, ietf) = request_at(
        w.agent.addr,
        "GET",
        "/health",
        &[("Accept", "application/health+json")],
        Duration::from_secs(5),
    )
    .expect("GET /health as health+json");
    let metrics = w.agent.metrics();
    let check = Command::new(agent_binary())
        .arg("--config")
        .arg(w.agent.config_path())
        .args(["check", "--json"])
        .output()
        .expect("health-agent check --json");
    let check = String::from_utf8_lossy(&check.stdout).into_owned();
    let stats = load.stop();
    assert!(stats.answers() > 20, "the load got answers: {stats}");

    let mut noisy = Vec::new();
    for (what, body) in [
        ("/health", &health),
        ("health+json", &ietf),
        ("check --json", &check),
    ] {
        let v = parse(what, body);
        long_decimals(&v, what, 3, &mut noisy);
    }
    // What has figures to show did show them: the rounding was tried on real values.
    let v = parse("/health", &health);
    assert!(
        v["details"]["web"]["probe"]["latency_ms"].is_f64(),
        "{health}"
    );
    assert!(v["details"]["system"]["load1"].is_number(), "{health}");
    for line in metrics
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let value = line.rsplit(' ').next().unwrap_or_default();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("not a number ({e}): {line}"));
        if !rounded(value, 5) {
            noisy.push(format!("/metrics {line}"));
        }
    }
    assert!(
        noisy.is_empty(),
        "figures written out unrounded:\n{}\n/health: {health}",
        noisy.join("\n")
    );
    println!(
        "probe latency {} ms",
        v["details"]["web"]["probe"]["latency_ms"]
    );
}
