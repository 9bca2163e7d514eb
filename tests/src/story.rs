//! What the verdict tests share: the config they start from, reading a run's answers (from a
//! moment on, seconds after an event, the contract every answer keeps), and [`Watched`]: a Puma
//! watched by an agent with every `/health` answer recorded, the stage of the hang stories.

use std::time::Duration;

use serde_json::Value;

use crate::{
    merge_toml, Agent, Fixture, HealthPoller, HealthSample, Load, LoadStats, Postgres, Puma,
    PumaOptions, TcpProxy,
};

/// The config the web tests start from: the web check on `port` probing `/up` (2 s timeout), a
/// 500 ms check cadence, a 1 s recovery, and the CPU, memory and saturation scaling thresholds
/// out of the way (an idle test machine would say `scale_down`, parallel tests `scale_up`).
/// `extra` is merged in.
pub fn web_config(port: u16, extra: &str) -> String {
    let base = format!(
        "[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n\
         [web]\nport = {port}\nprobe_path = \"/up\"\nprobe_timeout = \"2s\"\n\
         [scaling]\ncpu_high_percent = 100.0\nmemory_high_percent = 100.0\n\
         cpu_low_percent = 0.0\nmemory_low_percent = 0.0\nup_at = 10.0\ndown_at = 0.0\n"
    );
    merge_toml(&base, extra)
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// A private PostgreSQL and a [`TcpProxy`] to it, which a test freezes to stand in for a
/// network path to the database that silently stops answering.
pub fn database_behind_proxy() -> (Postgres, TcpProxy) {
    let pg = Postgres::start();
    let proxy = TcpProxy::start(pg.port);
    (pg, proxy)
}

/// The fixture backend in mode `normal`, watched by an agent with `extra` merged into its
/// `[web] port` config.
pub fn watched_fixture(extra: &str) -> (Fixture, Agent) {
    let backend = Fixture::start("normal");
    let agent = Agent::on_port(backend.port, extra);
    (backend, agent)
}

/// About 10 requests a second to `/` on `port`, each on a new connection, 5 s timeout: the
/// traffic a frozen server must be seen under.
pub fn steady_load(port: u16) -> Load {
    Load::new_connections(
        port,
        "/",
        2,
        Duration::from_millis(200),
        Duration::from_secs(5),
    )
}

/// Every answer before `t` was a 200 (`what` happened at `t`).
pub fn assert_200_before(samples: &[HealthSample], t: Duration, what: &str, ctx: &str) {
    if let Some(s) = samples.iter().find(|s| s.at < t && s.code != 200) {
        panic!("a {} before {what}: {s}{ctx}", s.code);
    }
}

/// The answers from `from` on (the poller's clock). From an instance's first 200 on, say: before
/// it, an instance is not in rotation (503 `booting` until its backend has served).
pub fn since(samples: &[HealthSample], from: Duration) -> Vec<HealthSample> {
    samples.iter().filter(|s| s.at >= from).cloned().collect()
}

/// The agent answered every time, with 200 or 503.
pub fn assert_answered(samples: &[HealthSample], ctx: &str) {
    for s in samples {
        assert!(s.error.is_none(), "the agent did not answer: {s}{ctx}");
        assert!(
            s.code == 200 || s.code == 503,
            "HTTP {} is neither 200 nor 503: {s}{ctx}",
            s.code
        );
    }
}

const STATUSES: &[&str] = &[
    "healthy",
    "degraded",
    "unhealthy",
    "booting",
    "recovering",
    "draining",
];
const RECOMMENDATIONS: &[&str] = &["stable", "scale_up", "scale_down", "infrastructure_issue"];
const WEBSERVER: &[&str] = &[
    "up",
    "slow",
    "hung",
    "unresponsive",
    "waiting",
    "down",
    "unknown",
];
const DATABASE: &[&str] = &[
    "connected",
    "slow",
    "unreachable",
    "misconfigured",
    "unknown",
    "not_configured",
];

/// [`assert_answered`], and every field is one of its documented values.
pub fn assert_contract(samples: &[HealthSample], ctx: &str) {
    assert_answered(samples, ctx);
    for s in samples {
        for (field, value, allowed) in [
            ("status", &s.status, STATUSES),
            ("recommendation", &s.recommendation, RECOMMENDATIONS),
            ("checks.webserver", &s.webserver, WEBSERVER),
            ("checks.database", &s.database, DATABASE),
        ] {
            assert!(
                allowed.contains(&value.as_str()),
                "{field} {value:?} is not one of {allowed:?}: {s}{ctx}"
            );
        }
    }
}

/// What an answer's `reasons` say while the web backend is slow with requests waiting
/// unanswered: (how many wait, seconds since anything was answered), from "web backend slow: 3
/// requests unanswered (oldest 4.2s), …; nothing answered for 5.1s, 0% CPU: unresponsive (503)
/// once …", or, while the last answer is as recent as the wait, "…; the last answer went out
/// 1.8s ago". None when no reason says so.
pub fn unanswered_reason(reasons: &Value) -> Option<(u64, f64)> {
    reasons
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|r| {
            let r = r.strip_prefix("web backend slow: ")?;
            let (head, _) = r.split_once(" requests unanswered (oldest ")?;
            let n = head.rsplit(' ').next()?.parse().ok()?;
            let quiet = match r.split_once("; nothing answered for ") {
                Some((_, q)) if r.contains(": unresponsive (503) once") => q,
                _ => r.split_once("; the last answer went out ")?.1,
            };
            Some((n, quiet.split_once('s')?.0.parse().ok()?))
        })
}

/// `details.heal.total_attempts` of an answer (0 when absent).
pub fn heal_attempts(s: &HealthSample) -> u64 {
    s.body["details"]["heal"]["total_attempts"]
        .as_u64()
        .unwrap_or(0)
}

/// Counts the agent's restarts: its `web.restart_command` appends a line to a file and exits 0.
pub struct Restarts {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
}

impl Restarts {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("restarts");
        Self { _dir: dir, file }
    }

    /// The shell command to give as `web.restart_command`.
    pub fn command(&self) -> String {
        format!("echo restart >> '{}'", self.file.display())
    }

    pub fn count(&self) -> usize {
        std::fs::read_to_string(&self.file)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

impl Default for Restarts {
    fn default() -> Self {
        Self::new()
    }
}

/// The one way a test waits for a verdict: on a run whose `/health` answers a poller records,
/// and which can say what went on (logs) when the wait times out.
pub trait Watch {
    fn poller(&self) -> &HealthPoller;

    /// What a timed-out wait adds to the timeline: the logs that tell why.
    fn explain(&self) -> String;

    /// The first answer from now on that satisfies `pred`; panics after `within` with the
    /// timeline, the last body and [`Watch::explain`].
    fn wait(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
    ) -> HealthSample {
        self.poller()
            .wait_for_explained(within, what, pred, || self.explain())
    }
}

/// A Puma watched by an agent, every `/health` answer of the run recorded. Its fields are the
/// parts (a test may stop the poller, or Puma, on its own).
pub struct Watched {
    pub puma: Puma,
    pub agent: Agent,
    pub poller: HealthPoller,
}

impl Watched {
    /// An agent of `config(&puma)` watching `puma`, its answers recorded from now on.
    pub fn new(puma: Puma, config: impl FnOnce(&Puma) -> String) -> Self {
        let agent = Agent::start(&config(&puma));
        Self::of(puma, agent)
    }

    /// `agent` (already watching `puma`), its answers recorded from now on and timed from the
    /// agent's spawn: a boot test's bounds (the boot grace) count from there, as the agent's do.
    pub fn of(puma: Puma, agent: Agent) -> Self {
        let poller = HealthPoller::start_from(agent.addr, agent.started);
        Self {
            puma,
            agent,
            poller,
        }
    }

    /// Where every hang story starts: Puma with 4 threads under about 10 requests a second on
    /// new connections (5 s timeout), watched by an agent of `config(&puma)`, once the
    /// agent says `healthy` with the web server `up`. Returns that first healthy answer and
    /// the load.
    pub fn under_load(config: impl FnOnce(&Puma) -> String) -> (Self, Load, HealthSample) {
        let puma = Puma::start(PumaOptions::threads(4));
        let watched = Self::new(puma, config);
        let load = steady_load(watched.puma.port);
        let ready = watched.wait_healthy();
        (watched, load, ready)
    }

    /// The first answer from now on that says `healthy` with the web server `up`, within 30 s
    /// (an agent's start to its first verdict).
    pub fn wait_healthy(&self) -> HealthSample {
        self.wait(Duration::from_secs(30), "healthy, the web server up", |s| {
            s.code == 200 && s.status == "healthy" && s.webserver == "up"
        })
    }

    /// SIGSTOP to Puma; when, on the poller's clock.
    pub fn freeze(&self) -> Duration {
        self.puma.signal(libc::SIGSTOP);
        self.poller.elapsed()
    }

    /// SIGCONT to Puma; when, on the poller's clock.
    pub fn thaw(&self) -> Duration {
        self.puma.signal(libc::SIGCONT);
        self.poller.elapsed()
    }

    /// Stops `load`, prints the run, and returns its answers from `from` on, the load's figures
    /// and what a failed assertion prints.
    pub fn finish(&self, load: Load, from: Duration) -> (Vec<HealthSample>, LoadStats, String) {
        let stats = load.stop();
        let samples = self.answers_since(from);
        let ctx = self.context(&samples, &stats.to_string());
        println!("{stats}\n{}", crate::timeline(&samples));
        (samples, stats, ctx)
    }

    /// Every answer so far, printed, and what a failed assertion prints (no load ran).
    pub fn so_far(&self) -> (Vec<HealthSample>, String) {
        let samples = self.poller.samples();
        let ctx = self.context(&samples, "none");
        println!("{}", crate::timeline(&samples));
        (samples, ctx)
    }

    /// Every answer from `from` on (the poller's clock), so far.
    pub fn answers_since(&self, from: Duration) -> Vec<HealthSample> {
        since(&self.poller.samples(), from)
    }

    /// What a failed assertion prints: `samples`, the `load`, both logs and the last body.
    pub fn context(&self, samples: &[HealthSample], load: &str) -> String {
        context(&self.agent, &self.puma, samples, load)
    }
}

impl Watch for Watched {
    fn poller(&self) -> &HealthPoller {
        &self.poller
    }

    fn explain(&self) -> String {
        format!(
            "\npuma log (tail):\n{}\nagent log (tail):\n{}",
            tail(&self.puma.logs(), 20),
            tail(&self.agent.logs(), 40)
        )
    }
}

/// What a failed assertion of a Puma test prints: every answer of the run, the load, both logs.
pub fn context(agent: &Agent, puma: &Puma, samples: &[HealthSample], load: &str) -> String {
    format!(
        "\n/health answers:\n{}load: {load}\npuma log (tail):\n{}\nagent log (tail):\n{}\nlast body: {}",
        crate::timeline(samples),
        tail(&puma.logs(), 20),
        tail(&agent.logs(), 40),
        samples.last().map(|s| pretty(&s.body)).unwrap_or_default()
    )
}
