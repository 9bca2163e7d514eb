//! The web verdict as a pure function of the evidence, so the rules are tested as a table.
//!
//! The rules tell three things apart that look alike from outside (connections queue, the
//! probe gets nothing back):
//! - **nothing moves** — the server's processes are stopped or frozen, or (weaker evidence)
//!   nothing is taken or answered for longer than this server normally goes quiet, with nothing
//!   in progress, no CPU and no outbound request in flight: `hung`;
//! - **slow** — answers still go out on some connection, or the server burns CPU: `slow`,
//!   whatever the queue; a CPU-bound livelock only turns `unresponsive` after
//!   `unanswered_after`;
//! - **waiting on someone else** — its own outbound requests (database, cache, API) have gone
//!   unanswered: `waiting`, which a restart or a new instance does not fix.

use std::time::{Duration, Instant};

use super::{
    latency::LatencySummary,
    process::{DependencyWait, BUSY_PERCENT},
};
use crate::{checks::probe::ProbeResult, config::WebConfig, status::WebVerdict};

/// The facts one verdict is drawn from.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub listening: bool,
    pub queue: u32,
    /// How long the accept queue has been non-empty without a break.
    pub queue_busy_for: Option<Duration>,
    pub kernel: Option<KernelEvidence>,
    pub probe: Option<ProbeResult>,
    /// How long the probe has been failing without a break.
    pub probe_failing_for: Option<Duration>,
    /// Set, with the reason, when every process holding the listener is stopped or frozen.
    pub frozen: Option<String>,
    /// Percent of one core the server's processes used over the last second, while stuck.
    pub cpu_percent: Option<f64>,
    /// The server's outbound requests that wait for an answer, longest first.
    pub dependencies: Vec<DependencyWait>,
}

#[derive(Debug, Clone, Default)]
pub struct KernelEvidence {
    pub oldest_waiting: Option<Duration>,
    /// Since the server last took a connection from its accept queue (first read or write, or
    /// accept() while traced). None: none seen since the agent started.
    pub since_claim: Option<Duration>,
    /// Since a response byte last went out on any of its connections, keep-alive ones
    /// included. None: none seen since the agent started.
    pub since_answer: Option<Duration>,
    /// The longest stretch this server went without answering while it had work, over the
    /// latency window: how long it normally goes quiet when busy.
    pub longest_quiet: Duration,
    pub pending: u32,
    pub oldest_pending: Option<Duration>,
    pub latency: LatencySummary,
    pub answered: u64,
}

impl KernelEvidence {
    /// Since the server last did anything visible: took a connection or answered on one.
    fn since_progress(&self) -> Option<Duration> {
        [self.since_claim, self.since_answer]
            .into_iter()
            .flatten()
            .min()
    }

    fn answered_within(&self, d: Duration) -> bool {
        self.since_answer.is_some_and(|s| s < d)
    }
}

/// Work stuck under a stopped or frozen server must be this old before it is `hung`: a brief
/// stop (a debugger, a checkpoint) is not a hang. Never longer than `hung_after`.
const FREEZE_CONFIRM: Duration = Duration::from_millis(500);
fn freeze_confirm(cfg: &WebConfig) -> Duration {
    FREEZE_CONFIRM.min(cfg.hung_after)
}

/// How long a queue may go without anything taken or answered before it is hung on weak
/// evidence: `hung_after`, stretched to twice this server's own longest quiet spell and p99
/// latency (a pool of threads sleeping 3 s per request answers every 3 s), never past
/// `unanswered_after`.
fn quiet_limit(k: &KernelEvidence, cfg: &WebConfig) -> Duration {
    let p99 =
        Duration::try_from_secs_f64(k.latency.p99_ms.max(0.0) / 1000.0).unwrap_or(Duration::MAX);
    cfg.hung_after
        .max(k.longest_quiet.saturating_mul(2))
        .max(p99.saturating_mul(2))
        .min(cfg.hung_after.max(cfg.unanswered_after))
}

/// Waiting on a dependency needs the server quiet this long, for the same reason.
fn dependency_limit(k: Option<&KernelEvidence>, cfg: &WebConfig) -> Duration {
    let base = cfg.hung_after / 2;
    k.map_or(base, |k| {
        base.max(k.longest_quiet.saturating_mul(2))
            .min(base.max(cfg.unanswered_after))
    })
}

/// How long the oldest stuck piece of work has waited: a connection in the accept queue, a
/// request read and unanswered, or the probe timing out.
fn stuck_for(e: &Evidence) -> Option<Duration> {
    let queued = match &e.kernel {
        Some(k) => k.oldest_waiting.filter(|_| e.queue > 0),
        None => e.queue_busy_for.filter(|_| e.queue > 0),
    };
    let pending = e.kernel.as_ref().and_then(|k| k.oldest_pending);
    let probe = e
        .probe
        .as_ref()
        .filter(|p| p.timed_out)
        .and(e.probe_failing_for);
    [queued, pending, probe].into_iter().flatten().max()
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// "3 connections wait in the accept queue (oldest 1.2s), 2 requests unanswered (oldest 0.8s)"
fn work(e: &Evidence) -> String {
    let mut parts = Vec::new();
    if e.queue > 0 {
        let oldest = e
            .kernel
            .as_ref()
            .and_then(|k| k.oldest_waiting)
            .or(e.queue_busy_for)
            .map_or(String::new(), |d| format!(" (oldest {})", secs(d)));
        parts.push(format!(
            "{} connections wait in the accept queue{oldest}",
            e.queue
        ));
    }
    if let Some(k) = e.kernel.as_ref().filter(|k| k.pending > 0) {
        let oldest = k
            .oldest_pending
            .map_or(String::new(), |d| format!(" (oldest {})", secs(d)));
        parts.push(format!("{} requests unanswered{oldest}", k.pending));
    }
    if let (Some(p), Some(d)) = (e.probe.as_ref().filter(|p| !p.ok), e.probe_failing_for) {
        parts.push(format!(
            "the probe failing for {} ({})",
            secs(d),
            p.error.as_deref().unwrap_or("no answer")
        ));
    }
    if parts.is_empty() {
        "work waits".into()
    } else {
        parts.join(", ")
    }
}

/// "nothing answered for 3.1s" / "nothing answered since the agent started"
fn last_answer(k: Option<&KernelEvidence>) -> String {
    match k.map(|k| k.since_answer) {
        Some(Some(d)) => format!("the last answer went out {} ago", secs(d)),
        Some(None) => "no answer seen since the agent started".into(),
        None => "kernel view unavailable".into(),
    }
}

fn waiting_on(d: &DependencyWait) -> String {
    let mut s = format!("waiting on {}", d.endpoint);
    if d.waiting_ms > 0 {
        s.push_str(&format!(
            " for {}",
            secs(Duration::from_millis(d.waiting_ms))
        ));
    }
    s.push_str(&format!(
        " ({} connection{}",
        d.connections,
        if d.connections == 1 { "" } else { "s" }
    ));
    if d.connecting > 0 {
        s.push_str(&format!(", {} still connecting", d.connecting));
    }
    s.push(')');
    s
}

pub fn decide(e: &Evidence, cfg: &WebConfig) -> (WebVerdict, String) {
    if !e.listening {
        return (
            WebVerdict::Down,
            format!("nothing listens on port {}", cfg.port),
        );
    }
    let k = e.kernel.as_ref();
    let stuck = stuck_for(e);
    let cpu_busy = e.cpu_percent.is_some_and(|p| p >= BUSY_PERCENT);
    let cpu = |e: &Evidence| {
        e.cpu_percent
            .map_or(String::new(), |p| format!(", {p:.0}% CPU"))
    };

    // Nothing can move: every process holding the listener is stopped or frozen.
    if let Some(why) = &e.frozen {
        if stuck.is_some_and(|d| d >= freeze_confirm(cfg)) {
            return (
                WebVerdict::Hung,
                format!("{why}: {}; {}", work(e), last_answer(k)),
            );
        }
    }

    // Waiting on someone else: its own requests go unanswered and nothing comes back out.
    if !e.dependencies.is_empty() {
        let limit = dependency_limit(k, cfg);
        if stuck.is_some_and(|d| d >= limit) && !k.is_some_and(|k| k.answered_within(limit)) {
            return (
                WebVerdict::Waiting,
                format!(
                    "{}; {}; {}",
                    e.dependencies
                        .iter()
                        .map(waiting_on)
                        .collect::<Vec<_>>()
                        .join(", "),
                    work(e),
                    last_answer(k)
                ),
            );
        }
    }

    if let Some(k) = k {
        if let Some(oldest) = k.oldest_waiting.filter(|_| e.queue > 0) {
            // Weak evidence of a hang: the queue holds connections, nothing has been taken or
            // answered for longer than this server ever goes quiet, nothing is in progress,
            // no CPU, no outbound request. A server that never finished booting looks so.
            let limit = quiet_limit(k, cfg);
            if until_hung(oldest, k.since_progress(), limit).is_zero()
                && k.oldest_pending.is_none()
                && !cpu_busy
                && e.dependencies.is_empty()
            {
                return (
                    WebVerdict::Hung,
                    format!(
                        "{}; nothing taken or answered for {} (limit {}){}; {}",
                        work(e),
                        k.since_progress().map_or("ever".to_string(), secs),
                        secs(limit),
                        cpu(e),
                        last_answer(Some(k))
                    ),
                );
            }
            // Work in progress, CPU burning or a livelock: only `unanswered_after` of nothing
            // taken or answered makes it unresponsive.
            if until_hung(oldest, k.since_progress(), cfg.unanswered_after).is_zero()
                && e.dependencies.is_empty()
            {
                return (
                    WebVerdict::Unresponsive,
                    format!(
                        "{}; nothing taken or answered for {}{}",
                        work(e),
                        k.since_progress().map_or("ever".to_string(), secs),
                        cpu(e)
                    ),
                );
            }
        }
        if let Some(_oldest) = k.oldest_pending.filter(|d| *d >= cfg.unanswered_after) {
            if !k.answered_within(cfg.unanswered_after) && e.dependencies.is_empty() {
                return (
                    WebVerdict::Unresponsive,
                    format!("{}; {}{}", work(e), last_answer(Some(k)), cpu(e)),
                );
            }
        }
    } else if let (Some(busy), Some(p)) = (e.queue_busy_for, &e.probe) {
        // Without the kernel view: a queue that never drains, a probe that gets nothing, and
        // (where /proc tells) no CPU.
        if e.queue > 0 && busy >= cfg.hung_after && p.timed_out && !cpu_busy {
            return (
                WebVerdict::Hung,
                format!(
                    "accept queue non-empty ({}) for {} and the probe timed out{} (kernel view unavailable)",
                    e.queue,
                    secs(busy),
                    cpu(e)
                ),
            );
        }
    }

    if let Some(p) = &e.probe {
        let failing = e.probe_failing_for.unwrap_or_default();
        let server_error = p.status.is_some_and(|s| s >= 500);
        // Refused while the kernel shows a listener: the probe's address is wrong, the backend
        // is not at fault (see below).
        let no_answer = p.status.is_none() && !p.refused;
        if !p.ok && (p.timed_out || server_error || no_answer) && failing >= cfg.unanswered_after {
            if p.timed_out && k.is_some_and(|k| k.answered_within(failing)) {
                // It answers others: the probe waits its turn behind slow requests.
                return (
                    WebVerdict::Slow,
                    format!(
                        "the probe timed out for {} but answers still go out ({})",
                        secs(failing),
                        last_answer(k)
                    ),
                );
            }
            if !e.dependencies.is_empty() {
                return (
                    WebVerdict::Waiting,
                    format!(
                        "{}; {}",
                        e.dependencies
                            .iter()
                            .map(waiting_on)
                            .collect::<Vec<_>>()
                            .join(", "),
                        work(e)
                    ),
                );
            }
            let what = p
                .error
                .clone()
                .unwrap_or_else(|| format!("HTTP {}", p.status.unwrap_or_default()));
            return (
                WebVerdict::Unresponsive,
                format!(
                    "probe {} failing for {}: {what}",
                    cfg.probe_path,
                    secs(failing)
                ),
            );
        }
    }

    // Busy: work waits, but answers still go out or the CPU is working on it.
    if let Some(d) = stuck.filter(|d| *d >= cfg.slow_after) {
        let answering = k.is_some_and(|k| k.answered_within(d.max(cfg.hung_after)));
        if answering || cpu_busy {
            return (
                WebVerdict::Slow,
                format!("{}; {}{}", work(e), last_answer(k), cpu(e)),
            );
        }
    }
    if let Some(k) = k {
        if k.latency.samples >= 5 && k.latency.p99_ms >= cfg.slow_after.as_secs_f64() * 1000.0 {
            return (
                WebVerdict::Slow,
                format!(
                    "server latency p99 {:.0}ms over {} requests (threshold {}ms)",
                    k.latency.p99_ms,
                    k.latency.samples,
                    cfg.slow_after.as_millis()
                ),
            );
        }
    }
    if let Some(p) = e.probe.as_ref().filter(|p| p.ok) {
        if p.latency_ms >= cfg.slow_after.as_secs_f64() * 1000.0 {
            return (
                WebVerdict::Slow,
                format!(
                    "probe answered in {:.0}ms (threshold {}ms)",
                    p.latency_ms,
                    cfg.slow_after.as_millis()
                ),
            );
        }
        return (
            WebVerdict::Up,
            format!(
                "probe answered {} in {:.1}ms",
                p.status.unwrap_or(0),
                p.latency_ms
            ),
        );
    }
    if let Some(p) = e
        .probe
        .as_ref()
        .filter(|p| p.status.is_some_and(|s| (400..500).contains(&s)))
    {
        // A 4xx is the probe path's fault, not the backend's: never a reason to restart it.
        return (
            WebVerdict::Unknown,
            format!(
                "probe {} answered {}: check web.probe_path",
                cfg.probe_path,
                p.status.unwrap_or(0)
            ),
        );
    }
    if let Some(p) = e.probe.as_ref().filter(|p| p.refused) {
        return (
            WebVerdict::Unknown,
            format!(
                "the probe to {} was refused although port {} has a listener: a probe problem \
                 (the listener's address?), not the backend's",
                p.target, cfg.port
            ),
        );
    }
    if let Some(k) = k.filter(|k| k.answered > 0) {
        return (
            WebVerdict::Up,
            format!(
                "{} connections answered, latency p99 {:.1}ms",
                k.answered, k.latency.p99_ms
            ),
        );
    }
    if e.probe.as_ref().is_some_and(|p| !p.ok) {
        return (
            WebVerdict::Unknown,
            "listening; the probe is failing, not yet for long".into(),
        );
    }
    (
        WebVerdict::Unknown,
        "listening; no traffic and no probe yet".into(),
    )
}

/// How long until queued connections count as stuck for `limit`; zero: they do now. Nothing
/// taken or answered for `limit` (from the last progress, or the oldest arrival when none was
/// seen), and the oldest connection waiting at least half of that, so an idle server's next
/// connection is not judged by how long ago the previous one came.
fn until_hung(oldest: Duration, since_progress: Option<Duration>, limit: Duration) -> Duration {
    let stalled_for = since_progress.unwrap_or(oldest);
    (limit / 2)
        .saturating_sub(oldest)
        .max(limit.saturating_sub(stalled_for))
}

/// The earliest instant at which `decide` could turn on this evidence: the composer looks
/// again right then rather than at its next tick, so a hang is reported when it crosses its
/// threshold, not up to an `eval_interval` later.
pub fn next_look(e: &Evidence, cfg: &WebConfig, now: Instant) -> Option<Instant> {
    let stuck = stuck_for(e);
    let k = e.kernel.as_ref();
    let until = |limit: Duration| stuck.map(|s| limit.saturating_sub(s));
    let frozen = e.frozen.as_ref().and_then(|_| until(freeze_confirm(cfg)));
    let waiting = (!e.dependencies.is_empty())
        .then(|| until(dependency_limit(k, cfg)))
        .flatten();
    let (hung, unresponsive, unanswered) = match k {
        Some(k) => {
            let queued = k.oldest_waiting.filter(|_| e.queue > 0);
            (
                queued.map(|o| until_hung(o, k.since_progress(), quiet_limit(k, cfg))),
                queued.map(|o| until_hung(o, k.since_progress(), cfg.unanswered_after)),
                k.oldest_pending
                    .map(|p| cfg.unanswered_after.saturating_sub(p)),
            )
        }
        None => (None, None, None),
    };
    // Ages are whole milliseconds, read a moment after `now`: aim a little past the edge.
    [frozen, waiting, hung, unresponsive, unanswered]
        .into_iter()
        .flatten()
        .filter(|w| !w.is_zero())
        .min()
        // Checked: a limit past the end of time (a hand-built config) means no early look.
        .and_then(|w| now.checked_add(w.saturating_add(Duration::from_millis(2))))
}

/// How the probe and the kernel view differ, if they do.
pub fn disagreement(verdict: WebVerdict, e: &Evidence) -> Option<String> {
    let (k, p) = (e.kernel.as_ref()?, e.probe.as_ref()?);
    let kernel_stalled = k.oldest_waiting.is_some() && e.queue > 0 || k.oldest_pending.is_some();
    if p.ok && matches!(verdict, WebVerdict::Hung | WebVerdict::Unresponsive) {
        return Some("the probe was answered but the kernel sees stalled connections".into());
    }
    if p.refused {
        return Some(format!(
            "the probe to {} was refused while the kernel shows a listener",
            p.target
        ));
    }
    if !p.ok && !kernel_stalled && k.answered > 0 && p.timed_out {
        return Some(
            "the probe timed out but the kernel sees no waiting or unanswered connection".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> WebConfig {
        WebConfig {
            port: 9000,
            ..WebConfig::default()
        }
    }

    fn probe_ok(ms: f64) -> ProbeResult {
        ProbeResult {
            ok: true,
            status: Some(200),
            latency_ms: ms,
            error: None,
            timed_out: false,
            refused: false,
            agent_error: false,
            target: "127.0.0.1:9000".into(),
        }
    }

    fn probe_timeout() -> ProbeResult {
        ProbeResult {
            ok: false,
            status: None,
            latency_ms: 2000.0,
            error: Some("no answer within 2000ms".into()),
            timed_out: true,
            ..probe_ok(2000.0)
        }
    }

    fn listening() -> Evidence {
        Evidence {
            listening: true,
            ..Evidence::default()
        }
    }

    const S: Duration = Duration::from_secs(1);
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A queue whose oldest connection waited `oldest`, with the last claim and answer long
    /// ago (or never) unless set.
    fn waiting(oldest: Duration, since_progress: Option<Duration>) -> Evidence {
        Evidence {
            queue: 1,
            kernel: Some(KernelEvidence {
                oldest_waiting: Some(oldest),
                since_claim: since_progress,
                ..Default::default()
            }),
            ..listening()
        }
    }

    fn kernel(e: &mut Evidence) -> &mut KernelEvidence {
        e.kernel.as_mut().unwrap()
    }

    fn dep(endpoint: &str, waiting_ms: u64) -> DependencyWait {
        DependencyWait {
            endpoint: endpoint.into(),
            waiting_ms,
            connections: 4,
            connecting: 0,
        }
    }

    #[test]
    fn no_listener_is_down() {
        assert_eq!(decide(&Evidence::default(), &cfg()).0, WebVerdict::Down);
    }

    /// One row per situation the verdict must tell apart: the evidence, and what it must say.
    #[test]
    fn verdict_table() {
        type Case = (&'static str, fn() -> Evidence, WebVerdict, &'static str);
        let cases: &[Case] = &[
            (
                "stopped server, work stuck 0.5 s: hung at once",
                || {
                    let mut e = waiting(ms(500), Some(ms(600)));
                    e.frozen = Some("server processes 42 stopped".into());
                    e
                },
                WebVerdict::Hung,
                "42 stopped",
            ),
            (
                "stopped server, the first connection just came: not yet",
                || {
                    let mut e = waiting(ms(200), Some(ms(600)));
                    e.frozen = Some("server processes 42 stopped".into());
                    e
                },
                WebVerdict::Unknown,
                "",
            ),
            (
                "never took or answered anything, queue 2 s, no CPU: hung (weak evidence)",
                || waiting(2 * S, None),
                WebVerdict::Hung,
                "nothing taken or answered for ever",
            ),
            (
                "queue 3 s, nothing taken, but answers go out on keep-alive connections: slow",
                || {
                    let mut e = waiting(3 * S, Some(5 * S));
                    kernel(&mut e).since_answer = Some(ms(300));
                    e
                },
                WebVerdict::Slow,
                "the last answer went out 0.3s ago",
            ),
            (
                "queue and nothing answered for 2.5 s, but this server went quiet 3 s before: slow",
                || {
                    let mut e = waiting(3 * S, Some(5 * S));
                    let k = kernel(&mut e);
                    k.since_answer = Some(ms(2500));
                    k.longest_quiet = 3 * S;
                    e
                },
                WebVerdict::Slow,
                "the last answer went out 2.5s ago",
            ),
            (
                "requests in progress, queue behind them: not hung before unanswered_after",
                || {
                    let mut e = waiting(4 * S, Some(4 * S));
                    let k = kernel(&mut e);
                    k.pending = 2;
                    k.oldest_pending = Some(4 * S);
                    e
                },
                WebVerdict::Unknown,
                "",
            ),
            (
                "burning CPU with the queue stuck: slow, not hung",
                || {
                    let mut e = waiting(3 * S, Some(3 * S));
                    e.cpu_percent = Some(95.0);
                    e
                },
                WebVerdict::Slow,
                "95% CPU",
            ),
            (
                "burning CPU and nothing taken or answered for unanswered_after: unresponsive",
                || {
                    let mut e = waiting(10 * S, Some(10 * S));
                    e.cpu_percent = Some(95.0);
                    e
                },
                WebVerdict::Unresponsive,
                "95% CPU",
            ),
            (
                "requests read, nothing answered anywhere for unanswered_after: unresponsive",
                || {
                    let mut e = listening();
                    e.kernel = Some(KernelEvidence {
                        pending: 1,
                        oldest_pending: Some(10 * S),
                        since_answer: Some(11 * S),
                        answered: 5,
                        ..Default::default()
                    });
                    e
                },
                WebVerdict::Unresponsive,
                "1 requests unanswered",
            ),
            (
                "a request unanswered 10 s while others are answered: not unresponsive",
                || {
                    let mut e = listening();
                    e.kernel = Some(KernelEvidence {
                        pending: 1,
                        oldest_pending: Some(10 * S),
                        since_answer: Some(S),
                        answered: 5,
                        ..Default::default()
                    });
                    e
                },
                WebVerdict::Slow,
                "",
            ),
            (
                "outbound requests unanswered, nothing comes back out: waiting, names the endpoint",
                || {
                    let mut e = waiting(3 * S, Some(3 * S));
                    let k = kernel(&mut e);
                    k.pending = 2;
                    k.oldest_pending = Some(3 * S);
                    e.dependencies = vec![dep("10.0.3.7:5432", 3200)];
                    e
                },
                WebVerdict::Waiting,
                "waiting on 10.0.3.7:5432 for 3.2s (4 connections)",
            ),
            (
                "outbound waiting for 12 s, requests pending past unanswered_after: still waiting",
                || {
                    let mut e = waiting(12 * S, Some(12 * S));
                    let k = kernel(&mut e);
                    k.pending = 2;
                    k.oldest_pending = Some(12 * S);
                    e.dependencies = vec![dep("10.0.3.7:5432", 12_000)];
                    e
                },
                WebVerdict::Waiting,
                "10.0.3.7:5432",
            ),
            (
                "a slow dependency while answers still go out: slow, not waiting",
                || {
                    let mut e = waiting(3 * S, Some(3 * S));
                    kernel(&mut e).since_answer = Some(ms(200));
                    e.dependencies = vec![dep("10.0.3.7:5432", 900)];
                    e
                },
                WebVerdict::Slow,
                "",
            ),
            (
                "probe times out for unanswered_after while the kernel sees answers: slow",
                || {
                    let mut e = listening();
                    e.kernel = Some(KernelEvidence {
                        since_answer: Some(ms(800)),
                        answered: 50,
                        ..Default::default()
                    });
                    e.probe = Some(probe_timeout());
                    e.probe_failing_for = Some(10 * S);
                    e
                },
                WebVerdict::Slow,
                "answers still go out",
            ),
        ];
        for (name, evidence, verdict, says) in cases {
            let (v, detail) = decide(&evidence(), &cfg());
            assert_eq!(v, *verdict, "{name}: {detail}");
            assert!(detail.contains(says), "{name}: {detail:?} lacks {says:?}");
        }
    }

    #[test]
    fn saturated_but_accepting_is_never_hung() {
        let e = Evidence {
            queue: 100,
            kernel: Some(KernelEvidence {
                oldest_waiting: Some(5 * S),
                since_claim: Some(ms(20)),
                since_answer: Some(ms(20)),
                answered: 1000,
                latency: LatencySummary {
                    samples: 1000,
                    p50_ms: 1500.0,
                    p95_ms: 2000.0,
                    p99_ms: 2500.0,
                },
                ..Default::default()
            }),
            ..listening()
        };
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Slow);
    }

    #[test]
    fn without_any_progress_seen_the_queue_must_wait_hung_after() {
        assert_ne!(decide(&waiting(ms(1999), None), &cfg()).0, WebVerdict::Hung);
        assert_eq!(decide(&waiting(2 * S, None), &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn the_stall_clock_runs_from_the_last_progress() {
        // Stopped 2.05 s after its last claim; the first connection after that arrived 0.1 s
        // later and has waited 1.95 s: hung now, not 0.1 s from now.
        let (v, detail) = decide(&waiting(ms(1950), Some(ms(2100))), &cfg());
        assert_eq!(v, WebVerdict::Hung, "{detail}");
        assert!(
            detail.contains("nothing taken or answered for 2.1s"),
            "{detail}"
        );
        assert_ne!(
            decide(&waiting(ms(1950), Some(ms(1900))), &cfg()).0,
            WebVerdict::Hung
        );
        // An answer counts as progress as much as a claim.
        let mut e = waiting(ms(1950), Some(ms(2100)));
        kernel(&mut e).since_answer = Some(ms(100));
        assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn an_idle_servers_next_connection_is_not_hung_at_once() {
        let e = waiting(ms(900), Some(600 * S));
        assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
        let e = waiting(S, Some(600 * S));
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn a_servers_own_quiet_spells_stretch_the_limit_up_to_unanswered_after() {
        let mut e = waiting(5 * S, Some(5 * S));
        kernel(&mut e).longest_quiet = 3 * S;
        assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung, "6 s limit");
        let mut e = waiting(6 * S, Some(6 * S));
        kernel(&mut e).longest_quiet = 3 * S;
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
        // However slow it used to be: unanswered_after bounds it.
        let mut e = waiting(10 * S, Some(10 * S));
        kernel(&mut e).longest_quiet = 60 * S;
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn a_waiting_connection_without_a_queue_is_not_hung() {
        // Taken by accept() but never read: the kernel's accept queue is empty.
        let mut e = waiting(10 * S, Some(10 * S));
        e.queue = 0;
        assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn limits_past_the_end_of_time_never_panic() {
        // Config validation bounds these; a hand-built config must not panic the composer
        // (a panic there leaves a stale snapshot: 503 for ever).
        let huge = WebConfig {
            hung_after: Duration::from_secs(9_000_000_000_000_000_000),
            unanswered_after: Duration::MAX,
            ..cfg()
        };
        let mut e = waiting(ms(700), Some(ms(1500)));
        if let Some(k) = e.kernel.as_mut() {
            k.longest_quiet = Duration::MAX;
            k.latency.p99_ms = f64::INFINITY;
        }
        assert_eq!(next_look(&e, &huge, Instant::now()), None);
        let _ = decide(&e, &huge);
    }

    #[test]
    fn the_next_look_lands_where_the_verdict_can_change() {
        let now = Instant::now();
        // Stall clock at 1.5 s, oldest 0.7 s: hung_after is reached in 0.5 s.
        let at = next_look(&waiting(ms(700), Some(ms(1500))), &cfg(), now).unwrap();
        assert_eq!(at - now, ms(502));
        // Oldest 0.2 s, stall clock far past: half of hung_after is reached in 0.8 s.
        let at = next_look(&waiting(ms(200), Some(60 * S)), &cfg(), now).unwrap();
        assert_eq!(at - now, ms(802));
        // Stopped: the freeze is confirmed once the oldest has waited 0.5 s.
        let mut e = waiting(ms(200), Some(ms(300)));
        e.frozen = Some("stopped".into());
        assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(302));
        // A pending request: unanswered_after (10 s) minus its age.
        let e = Evidence {
            kernel: Some(KernelEvidence {
                oldest_pending: Some(4 * S),
                ..Default::default()
            }),
            ..listening()
        };
        assert_eq!(next_look(&e, &cfg(), now).unwrap() - now, ms(6002));
        // Nothing waits: the regular tick will do.
        assert_eq!(next_look(&listening(), &cfg(), now), None);
    }

    #[test]
    fn degraded_mode_uses_queue_probe_and_process_state() {
        let e = Evidence {
            queue: 2,
            queue_busy_for: Some(3 * S),
            probe: Some(probe_timeout()),
            probe_failing_for: Some(3 * S),
            ..listening()
        };
        let (v, d) = decide(&e, &cfg());
        assert_eq!(v, WebVerdict::Hung);
        assert!(d.contains("kernel view unavailable"), "{d}");
        // A queue that just formed is not enough…
        let young = Evidence {
            queue_busy_for: Some(S),
            probe_failing_for: Some(S),
            ..e.clone()
        };
        assert_ne!(decide(&young, &cfg()).0, WebVerdict::Hung);
        // …unless the server is stopped.
        let stopped = Evidence {
            frozen: Some("server processes 7 stopped".into()),
            ..young
        };
        assert_eq!(decide(&stopped, &cfg()).0, WebVerdict::Hung);
        // A CPU-bound server is not hung.
        let busy = Evidence {
            cpu_percent: Some(80.0),
            ..e
        };
        assert_ne!(decide(&busy, &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn probe_failures_need_to_last() {
        let mut e = Evidence {
            probe: Some(probe_timeout()),
            probe_failing_for: Some(2 * S),
            ..listening()
        };
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unknown);
        e.probe_failing_for = Some(10 * S);
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unresponsive);
        // A 404 means a wrong probe path: never a restart.
        e.probe = Some(ProbeResult {
            ok: false,
            status: Some(404),
            ..probe_ok(1.0)
        });
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unknown);
    }

    #[test]
    fn a_refused_probe_with_a_listener_in_view_is_the_probes_problem() {
        let e = Evidence {
            probe: Some(ProbeResult {
                ok: false,
                error: Some("Connection refused".into()),
                refused: true,
                target: "127.0.0.1:9000".into(),
                ..probe_timeout()
            }),
            probe_failing_for: Some(60 * S),
            ..listening()
        };
        let mut e = e;
        e.probe.as_mut().unwrap().timed_out = false;
        let (v, d) = decide(&e, &cfg());
        assert_eq!(v, WebVerdict::Unknown, "{d}");
        assert!(d.contains("probe problem"), "{d}");
        // Refused with nothing listening is simply down.
        e.listening = false;
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Down);
    }

    #[test]
    fn slow_probe_and_fast_probe() {
        let e = Evidence {
            probe: Some(probe_ok(1500.0)),
            ..listening()
        };
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Slow);
        let e = Evidence {
            probe: Some(probe_ok(3.0)),
            ..listening()
        };
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Up);
    }

    #[test]
    fn disagreement_is_reported() {
        let e = Evidence {
            queue: 0,
            kernel: Some(KernelEvidence {
                answered: 10,
                ..Default::default()
            }),
            probe: Some(probe_timeout()),
            ..listening()
        };
        assert!(disagreement(WebVerdict::Unknown, &e).is_some());
    }
}
