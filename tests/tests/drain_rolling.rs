//! A rolling restart of two real Puma backends under steady load, through real HAProxy and real
//! Caddy, each Puma watched by its own agent. Three ways to restart each backend in turn:
//!
//! - `drain`: `health-agent drain` (exits 0 once nothing new reaches the backend), the restart,
//!   `undrain`: no request may fail;
//! - `no drain`: the restart alone: some requests fail (so this test can fail at all);
//! - `sleep`: the 503 set by a `drain` left in the background, then a fixed 10 s wait instead of
//!   the drain's proof, the restart, `undrain`: no request may fail either (10 s is far more
//!   than the 1 to 2 s the balancers take to stop sending).
//!
//! The drain must also be quicker than the sleep. The table of every pass is printed, with
//! where failures happened and the statuses `/health` went through after each restart.
//!
//! Each backend has a loopback address of its own (127.0.0.2, 127.0.0.3, ...) with its Puma and
//! its agent on it, the agents on one port: Caddy 2.6's `health_port` is one port for every
//! upstream, asked on each upstream's address, as on real hosts.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use health_agent_tests::{
    drain, free_port, free_port_on_all, loopback, pretty, request_at, require_root, succeed, tail,
    undrain, wait_until, web_config, Agent, Caddy, CommandRun, DrainInBackground, Haproxy, Load,
    LoadStats, Puma, PumaOptions,
};

/// `drain --quiet`: at least the balancers' check interval (1 s).
const QUIET: Duration = Duration::from_secs(2);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The fixed wait of the `sleep` mode.
const SLEEP: Duration = Duration::from_secs(10);
/// The load: 4 clients, each on a new connection per request to `/io`, a 100 ms sleep in the
/// app ([`IO_SECONDS`]), and at most one request every 100 ms: back to back while answers
/// come, and a failure that comes at once does not make a client spin.
const CLIENTS: usize = 4;
const PATH: &str = "/io";
const INTERVAL: Duration = Duration::from_millis(100);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `/io` takes: long enough that every client always has a request in flight, about
/// two on each backend. A restart without drain cuts those off even when the balancer hides the
/// restart itself: HAProxy retries a refused connection after 1 s (`retries 3`), by when the
/// new Puma (about 0.4 s to boot) takes it.
const IO_SECONDS: f64 = 0.1;
/// Before each restart, this many `GET /slow` through the balancer (each `SLOW_SECONDS` in the
/// app), so requests are surely in flight on the backend restarted, whichever mode: the drain
/// must wait for them, the bare restart cuts them off.
const SLOW_REQUESTS: usize = 6;
const SLOW_SECONDS: f64 = 1.0;
/// Traffic through both backends before the first restart of a pass and after the last.
const SETTLE: Duration = Duration::from_secs(1);
/// A restarted backend's way back: Puma boots, the agent sees it, the balancer's checks pass.
const BACK_WITHIN: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Drain,
    NoDrain,
    Sleep,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Drain, Mode::NoDrain, Mode::Sleep];

    fn name(self) -> &'static str {
        match self {
            Mode::Drain => "drain",
            Mode::NoDrain => "no drain",
            Mode::Sleep => "sleep 10s",
        }
    }
}

/// A Puma on its own loopback address, the agent watching it on the same address, and the
/// script that restarts it.
struct Backend {
    /// The balancer's name for it.
    name: String,
    puma: Puma,
    agent: Agent,
    restart: PathBuf,
}

/// The ports every backend's agent serves on, each on its backend's address.
#[derive(Debug, Clone, Copy)]
struct AgentPorts {
    /// `/health`.
    http: u16,
    /// HAProxy's agent check (`server.agent_check_listen`).
    agent_check: u16,
}

impl AgentPorts {
    /// Two different ports free on every one of `hosts`.
    fn free_on(hosts: &[IpAddr]) -> Self {
        let http = free_port_on_all(hosts);
        let agent_check = wait_until(Duration::from_secs(5), "a second free port", || {
            Some(free_port_on_all(hosts)).filter(|p| *p != http)
        });
        Self { http, agent_check }
    }
}

impl Backend {
    /// Puma on `host` and its agent on `host:ports.http`, with the agent check on
    /// `host:ports.agent_check`. The agent's checks run every 500 ms (`web_config`).
    fn start(name: &str, host: IpAddr, ports: AgentPorts) -> Self {
        let puma = Puma::start(PumaOptions {
            host,
            io_seconds: IO_SECONDS,
            slow_seconds: SLOW_SECONDS,
            ..PumaOptions::default()
        });
        let restart = puma.restart_script();
        let config = web_config(
            puma.port,
            &format!(
                "[server]\nagent_check_listen = \"{}\"\n",
                SocketAddr::new(host, ports.agent_check)
            ),
        );
        let agent = Agent::start_at(SocketAddr::new(host, ports.http), &config, &[]);
        Self {
            name: name.to_string(),
            puma,
            agent,
            restart,
        }
    }

    /// Two backends on `hosts`, named web1 and web2, once both agents say 200 `healthy`.
    fn pair(hosts: [IpAddr; 2]) -> (Vec<Self>, AgentPorts) {
        let ports = AgentPorts::free_on(&hosts);
        let backends: Vec<Self> = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| Self::start(&format!("web{}", i + 1), *host, ports))
            .collect();
        for b in &backends {
            b.wait_healthy("at the start");
        }
        (backends, ports)
    }

    fn wait_healthy(&self, when: &str) {
        self.agent.wait_health(
            BACK_WITHIN,
            &format!("{} healthy {when}", self.name),
            |c, b| c == 200 && b["status"] == "healthy" && b["checks"]["webserver"] == "up",
        );
    }

    /// Runs the restart script: the old Puma is killed and gone when it returns, the new one
    /// booting in the background.
    fn restart(&self) {
        succeed(&mut Command::new(&self.restart));
    }

    /// Puma answers `GET /up` itself.
    fn puma_answers(&self) -> bool {
        request_at(self.puma.addr(), "GET", "/up", &[], Duration::from_secs(1))
            .is_ok_and(|(c, _, _)| c == 200)
    }

    /// What a failed assertion prints about this backend.
    fn explain(&self) -> String {
        format!(
            "\n{} ({}): /health {}\npuma log (tail):\n{}\nagent log (tail):\n{}",
            self.name,
            self.puma.addr(),
            self.agent
                .get("/health")
                .map(|(c, b)| format!("{c} {b}"))
                .unwrap_or_else(|e| e.to_string()),
            tail(&self.puma.logs(), 10),
            tail(&self.agent.logs(), 30)
        )
    }
}

/// A real load balancer in front of the backends, with its frontend on 127.0.0.1.
enum Balancer {
    Haproxy { haproxy: Haproxy, port: u16 },
    Caddy(Caddy),
}

impl Balancer {
    /// HAProxy as deploy/haproxy/haproxy.cfg has it, checking every second: `option httpchk
    /// GET /health` on the agent's port (`inter 1s fall 2 rise 2`) and the agent check
    /// (`agent-inter 1s`), weight 100.
    fn haproxy(backends: &[Backend], ports: AgentPorts) -> Self {
        let port = free_port();
        let servers: String = backends
            .iter()
            .map(|b| format!("    server {} {}\n", b.name, b.puma.addr()))
            .collect();
        let haproxy = Haproxy::start(&format!(
            "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    \
             timeout server 30s\n    timeout check 2s\n\
             frontend web\n    bind 127.0.0.1:{port}\n    default_backend app\n\
             backend app\n    balance roundrobin\n    option httpchk GET /health\n    \
             http-check expect status 200\n    \
             default-server weight 100 check port {http} inter 1s fall 2 rise 2 \
             agent-check agent-port {agent} agent-inter 1s\n{servers}",
            http = ports.http,
            agent = ports.agent_check,
        ));
        Self::Haproxy { haproxy, port }
    }

    /// Caddy with active health checks on each agent (`health_uri /health`, `health_port`,
    /// `health_interval 1s`). Each answer names its upstream (`X-Upstream`), which is how the
    /// test sees a backend back in rotation: Caddy's admin API does not show active health, and
    /// it is off.
    ///
    /// `lb_policy least_conn`, not `round_robin`: Caddy 2.6's round robin advances one shared
    /// counter for every host it tries, so while one of two upstreams is unhealthy a request
    /// whose two tries interleave with another request's lands on the unhealthy one twice and
    /// gets 503 "no upstreams available", the healthy one idle. Measured without any agent (one
    /// upstream held unhealthy by its check, 4 clients): 9 such 503s in about 2,500 requests
    /// with round robin, none with least_conn. A drain makes an upstream unhealthy on purpose,
    /// so round robin would fail requests the drain has nothing to do with.
    fn caddy(backends: &[Backend], ports: AgentPorts) -> Self {
        let upstreams: Vec<String> = backends.iter().map(|b| b.puma.addr().to_string()).collect();
        Self::Caddy(Caddy::start(&format!(
            "\treverse_proxy {} {{\n\t\tlb_policy least_conn\n\t\thealth_uri /health\n\t\t\
             health_port {}\n\t\thealth_status 200\n\t\thealth_interval 1s\n\t\t\
             health_timeout 2s\n\t\theader_down X-Upstream {{http.reverse_proxy.upstream.hostport}}\n\t}}",
            upstreams.join(" "),
            ports.http
        )))
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Haproxy { .. } => "haproxy",
            Self::Caddy(_) => "caddy",
        }
    }

    fn port(&self) -> u16 {
        match self {
            Self::Haproxy { port, .. } => *port,
            Self::Caddy(c) => c.port,
        }
    }

    /// Whether it sends `b` new requests now: HAProxy's state and weight for it; for Caddy, one
    /// of a few requests through it answered by `b`.
    fn in_rotation(&self, b: &Backend) -> bool {
        match self {
            Self::Haproxy { haproxy, .. } => haproxy.state("app", &b.name).in_rotation(),
            Self::Caddy(c) => {
                let want = b.puma.addr().to_string();
                (0..CADDY_TRIES).any(|_| answered_by(c).as_deref() == Some(want.as_str()))
            }
        }
    }

    fn logs(&self) -> String {
        match self {
            Self::Haproxy { haproxy, .. } => haproxy.logs(),
            Self::Caddy(c) => c.logs(),
        }
    }
}

/// Requests through Caddy that look for a backend before the next look (least_conn over two
/// idle upstreams picks either).
const CADDY_TRIES: usize = 4;

/// The upstream that answered `GET /up` through `caddy` with a 200, if one did.
fn answered_by(caddy: &Caddy) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], caddy.port));
    let (code, head, _) = request_at(addr, "GET", "/up", &[], Duration::from_secs(2)).ok()?;
    if code != 200 {
        return None;
    }
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("x-upstream")
            .then(|| v.trim().to_string())
    })
}

/// Requests that did not get a 200: other answers, errors, timeouts.
fn failed(s: &LoadStats) -> u64 {
    s.answers() - s.count(200) + s.errors + s.timeouts
}

/// One pass of a mode over both backends.
struct Pass {
    balancer: &'static str,
    mode: Mode,
    stats: LoadStats,
    /// Each backend's drain (the command's run) or sleep.
    waited: Vec<Option<Duration>>,
    /// Where failures happened ("web1 restart, undrain: 3 failed"), and what else was seen.
    notes: Vec<String>,
    /// The drain commands' last lines.
    drains: Vec<String>,
    /// The slow requests in flight at the restarts: sent, failed.
    slow: (u64, u64),
}

impl Pass {
    /// Requests that failed: the load's and the slow ones'.
    fn failed(&self) -> u64 {
        failed(&self.stats) + self.slow.1
    }
}

/// `SLOW_REQUESTS` slow requests through `lb` at once, in flight once this returns; each
/// thread says whether its request was answered 200.
fn in_flight(lb: &Balancer) -> Vec<std::thread::JoinHandle<bool>> {
    let port = lb.port();
    let slow: Vec<_> = (0..SLOW_REQUESTS)
        .map(|_| {
            std::thread::spawn(move || {
                health_agent_tests::get_within(port, "/slow", REQUEST_TIMEOUT)
                    .is_ok_and(|(code, _, _)| code == 200)
            })
        })
        .collect();
    // Through the balancer and into Puma.
    std::thread::sleep(Duration::from_millis(300));
    slow
}

/// The load's failures by step of a pass, to tell where they happened.
struct Steps {
    /// The step under way: "web1 drain", "web1 restart, undrain", ...
    step: String,
    since: Instant,
    failed: u64,
    notes: Vec<String>,
}

impl Steps {
    fn new() -> Self {
        Self {
            step: "warm-up".into(),
            since: Instant::now(),
            failed: 0,
            notes: Vec::new(),
        }
    }

    /// Notes `line` with the failures.
    fn said(&mut self, line: String) {
        self.notes.push(line);
    }

    /// The step under way ended with the load at `stats`; `next` begins.
    fn to(&mut self, stats: &LoadStats, next: String) {
        let now = failed(stats);
        if now > self.failed {
            self.notes.push(format!(
                "{} ({:.1} s): {} failed",
                self.step,
                self.since.elapsed().as_secs_f64(),
                now - self.failed
            ));
        }
        self.failed = now;
        self.step = next;
        self.since = Instant::now();
    }
}

/// Drains (or not, or sleeps), restarts, undrains `b` and waits until it is back in `lb`'s
/// rotation: what it waited before the restart, and the drain command's run.
fn roll(
    lb: &Balancer,
    b: &Backend,
    mode: Mode,
    load: &Load,
    steps: &mut Steps,
) -> (Option<Duration>, Option<CommandRun>) {
    steps.to(&load.stats(), format!("{} {}", b.name, mode.name()));
    let (waited, run) = match mode {
        Mode::Drain => {
            let run = drain(&b.agent, QUIET, DRAIN_TIMEOUT);
            assert_eq!(
                run.code,
                Some(0),
                "{} {}: drain did not exit 0: {run}{}",
                lb.name(),
                b.name,
                b.explain()
            );
            (Some(run.took), Some(run))
        }
        Mode::NoDrain => (None, None),
        Mode::Sleep => {
            let started = Instant::now();
            let background = DrainInBackground::start(&b.agent, QUIET, DRAIN_TIMEOUT);
            std::thread::sleep(SLEEP);
            let ended = background.stop();
            steps.said(format!(
                "{}: the background drain {}",
                b.name,
                ended.map_or("was still running: killed".into(), |c| format!(
                    "had exited {c}"
                ))
            ));
            (Some(started.elapsed()), None)
        }
    };
    if mode != Mode::NoDrain {
        let (code, body) = b.agent.health();
        assert!(
            code == 503 && body["status"] == "draining",
            "{} {}: not 503 draining before the restart: {code} {}",
            lb.name(),
            b.name,
            pretty(&body)
        );
    }
    steps.to(&load.stats(), format!("{} restart, undrain", b.name));
    b.restart();
    if mode != Mode::NoDrain {
        let run = undrain(&b.agent);
        assert_eq!(
            run.code,
            Some(0),
            "{} {}: undrain: {run}",
            lb.name(),
            b.name
        );
    }
    steps.to(&load.stats(), format!("{} on its way back", b.name));
    let statuses = back(lb, b);
    steps.to(&load.stats(), format!("{} back in rotation", b.name));
    steps.said(format!("{}: /health after the restart: {statuses}", b.name));
    // A restart through a drain is the deploy's, not a fault: no `unhealthy` on the way back
    // (which would also be an incident), only `draining`, `booting`, then `healthy`.
    if mode != Mode::NoDrain {
        assert!(
            !statuses.to_string().contains("unhealthy"),
            "{} {}: after a drained restart /health went {statuses}{}",
            lb.name(),
            b.name,
            b.explain()
        );
    }
    (waited, run)
}

/// Until `b`'s new Puma has answered, its agent says 200 `healthy`, and `lb` sends it requests.
/// Returns the agent's statuses on the way, each with how long it was seen: `draining 0.2 s,
/// booting 0.3 s, healthy`.
fn back(lb: &Balancer, b: &Backend) -> Statuses {
    let deadline = Instant::now() + BACK_WITHIN;
    let mut seen = Statuses::default();
    let mut puma_answered = false;
    loop {
        let (code, body) = b.agent.health();
        seen.saw(body["status"].as_str().unwrap_or("?"));
        puma_answered = puma_answered || b.puma_answers();
        if puma_answered
            && code == 200
            && body["status"] == "healthy"
            && body["checks"]["webserver"] == "up"
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} not back to 200 healthy within {BACK_WITHIN:?} (Puma answered: {puma_answered}; \
             statuses {seen}): {code} {}{}",
            b.name,
            pretty(&body),
            b.explain()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    while !lb.in_rotation(b) {
        assert!(
            Instant::now() < deadline,
            "{} did not put {} back in rotation within {BACK_WITHIN:?}\n{} log (tail):\n{}{}",
            lb.name(),
            b.name,
            lb.name(),
            tail(&lb.logs(), 20),
            b.explain()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// The statuses `/health` went through, in order, with when each was first seen.
#[derive(Default)]
struct Statuses(Vec<(String, Instant)>);

impl Statuses {
    fn saw(&mut self, status: &str) {
        if self.0.last().is_none_or(|(s, _)| s != status) {
            self.0.push((status.to_string(), Instant::now()));
        }
    }
}

impl std::fmt::Display for Statuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (i, (status, at)) in self.0.iter().enumerate() {
            match self.0.get(i + 1) {
                Some((_, next)) => parts.push(format!(
                    "{status} {:.1} s",
                    next.saturating_duration_since(*at).as_secs_f64()
                )),
                None => parts.push(status.clone()),
            }
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// Every backend restarted in turn in `mode` under the load, through `lb`.
fn pass(lb: &Balancer, backends: &[Backend], mode: Mode) -> Pass {
    let load = Load::new_connections(lb.port(), PATH, CLIENTS, INTERVAL, REQUEST_TIMEOUT);
    std::thread::sleep(SETTLE);
    let mut steps = Steps::new();
    let mut waited = Vec::new();
    let mut drains = Vec::new();
    let mut slow = (0, 0);
    for b in backends {
        let sent = in_flight(lb);
        let (w, run) = roll(lb, b, mode, &load, &mut steps);
        waited.push(w);
        drains.extend(run.map(|r| format!("{}: {}", b.name, r.last_line())));
        let lost = sent
            .into_iter()
            .map(|t| t.join().unwrap_or(false))
            .filter(|ok| !ok)
            .count() as u64;
        slow = (slow.0 + SLOW_REQUESTS as u64, slow.1 + lost);
        if lost > 0 {
            steps.said(format!(
                "{}: {lost} of the {SLOW_REQUESTS} slow requests in flight failed",
                b.name
            ));
        }
    }
    std::thread::sleep(SETTLE);
    let stats = load.stop();
    steps.to(&stats, String::new());
    Pass {
        balancer: lb.name(),
        mode,
        stats,
        waited,
        notes: steps.notes,
        drains,
        slow,
    }
}

/// The table of the passes, one line each, then where failures happened and what the drains
/// said.
fn table(passes: &[Pass]) -> String {
    let mut out = format!(
        "{:<8} {:<10} {:>8} {:>7}  {}\n",
        "balancer", "mode", "requests", "failed", "drain/sleep s per instance"
    );
    for p in passes {
        let waited: Vec<String> = p
            .waited
            .iter()
            .map(|w| w.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())))
            .collect();
        out.push_str(&format!(
            "{:<8} {:<10} {:>8} {:>7}  {}\n",
            p.balancer,
            p.mode.name(),
            p.stats.answers() + p.stats.errors + p.stats.timeouts + p.slow.0,
            p.failed(),
            waited.join(", ")
        ));
    }
    for p in passes {
        for line in p.notes.iter().chain(&p.drains) {
            out.push_str(&format!("  {} {}: {line}\n", p.balancer, p.mode.name()));
        }
        if p.failed() > 0 {
            out.push_str(&format!(
                "  {} {}: {}\n",
                p.balancer,
                p.mode.name(),
                p.stats
            ));
        }
    }
    out
}

/// Every mode through `lb`, printed as a table; then the assertions: the drain and the sleep
/// lose nothing, the bare restart loses something, the drain is quicker than the sleep.
fn rolling_restarts(lb: &Balancer, backends: &[Backend]) {
    let passes: Vec<Pass> = Mode::ALL
        .iter()
        .map(|mode| pass(lb, backends, *mode))
        .collect();
    let printed = table(&passes);
    eprintln!("\n{printed}");
    let of = |mode| {
        passes
            .iter()
            .find(|p| p.mode == mode)
            .expect("every mode ran")
    };
    let context = || {
        format!(
            "\n{printed}\n{} log (tail):\n{}{}",
            lb.name(),
            tail(&lb.logs(), 30),
            backends.iter().map(Backend::explain).collect::<String>()
        )
    };
    assert_eq!(
        of(Mode::Drain).failed(),
        0,
        "{}: requests failed in a rolling restart with drain{}",
        lb.name(),
        context()
    );
    assert!(
        of(Mode::NoDrain).failed() > 0,
        "{}: no request failed in a rolling restart without drain: this test cannot tell{}",
        lb.name(),
        context()
    );
    assert_eq!(
        of(Mode::Sleep).failed(),
        0,
        "{}: requests failed in a rolling restart with a 10 s sleep after the 503{}",
        lb.name(),
        context()
    );
    for w in of(Mode::Drain).waited.iter().flatten() {
        assert!(
            *w < SLEEP,
            "{}: a drain took {w:?}, not less than the {SLEEP:?} sleep{}",
            lb.name(),
            context()
        );
    }
}

/// Two backends on `hosts` behind the balancer `start` makes, both in its rotation, then
/// every mode.
fn rolling_restart_through(hosts: [IpAddr; 2], start: fn(&[Backend], AgentPorts) -> Balancer) {
    require_root();
    let (backends, ports) = Backend::pair(hosts);
    let lb = start(&backends, ports);
    wait_until(
        BACK_WITHIN,
        &format!("both backends in {}'s rotation", lb.name()),
        || backends.iter().all(|b| lb.in_rotation(b)).then_some(()),
    );
    rolling_restarts(&lb, &backends);
}

#[test]
fn a_rolling_restart_through_haproxy_loses_no_request_with_drain() {
    rolling_restart_through([loopback(2), loopback(3)], Balancer::haproxy);
}

#[test]
fn a_rolling_restart_through_caddy_loses_no_request_with_drain() {
    rolling_restart_through([loopback(4), loopback(5)], Balancer::caddy);
}
