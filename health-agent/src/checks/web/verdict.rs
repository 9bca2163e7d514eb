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
//!   unanswered: `waiting`, which a restart or a new instance does not fix;
//! - **one process stuck while the others answer** — a pre-fork server's worker stopped,
//!   frozen or deadlocked: `partial_hang`, named by pid, which replacing that worker fixes.

use std::time::{Duration, Instant};

use super::{
    latency::LatencySummary,
    process::{DependencyWait, WorkerView, BUSY_PERCENT},
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
    /// The processes holding the listener (when there are several) whose own requests went
    /// unanswered, read while work was stuck.
    pub workers: Vec<WorkerView>,
    /// The real answers over `web.errors_window`, and whether their 5xx share is judged
    /// erroring (see `answers`).
    pub answers: Option<super::answers::Stats>,
    pub erroring: bool,
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

/// How long until `w` counts as stuck on this evidence; zero: it does now; None: not on this
/// evidence. Stopped or frozen: its oldest request, or the stop itself when it holds none,
/// FREEZE_CONFIRM old. Otherwise: requests unanswered and nothing sent on any of its
/// connections for `unanswered_after`, and (checked by `stuck_worker`, not timed) no CPU and no
/// outbound request in flight.
fn until_worker_stuck(w: &WorkerView, cfg: &WebConfig) -> Option<Duration> {
    let oldest = Duration::from_millis(w.oldest_unanswered_ms);
    if w.frozen.is_some() {
        let stopped = oldest.max(Duration::from_millis(w.frozen_ms));
        return Some(freeze_confirm(cfg).saturating_sub(stopped));
    }
    if w.outbound_waiting > 0 || w.cpu_percent.is_some_and(|p| p >= BUSY_PERCENT) {
        return None;
    }
    let quiet = w.last_sent_ms.map_or(oldest, Duration::from_millis);
    Some(
        cfg.unanswered_after
            .saturating_sub(oldest)
            .max(cfg.unanswered_after.saturating_sub(quiet)),
    )
}

/// Whether someone else answers while `w` is stuck: a response byte went out on the port
/// since `w`'s oldest request came in (without the kernel view: the probe was answered). For a
/// worker stopped while it held nothing, with nothing waiting on the port, the probe answered
/// is the others answering too (the kernel's last answer is old news while its programs are
/// detached because all looked well). Work waiting that nobody answers is the hang rules'.
fn others_answer(e: &Evidence, w: &WorkerView) -> bool {
    let probe_ok = e.probe.as_ref().is_some_and(|p| p.ok);
    match &e.kernel {
        Some(k) if w.unanswered == 0 && w.frozen.is_some() => {
            let waiting = e.queue > 0 || k.oldest_pending.is_some();
            k.answered_within(Duration::from_millis(w.frozen_ms)) || (probe_ok && !waiting)
        }
        Some(k) => k.answered_within(Duration::from_millis(w.oldest_unanswered_ms)),
        None => probe_ok,
    }
}

/// The process that holds work which does not move while the other processes answer (the
/// longest stuck first). A deadlocked process must have been seen idle (its CPU known).
fn stuck_worker<'a>(e: &'a Evidence, cfg: &WebConfig) -> Option<&'a WorkerView> {
    e.workers
        .iter()
        .filter(|w| until_worker_stuck(w, cfg).is_some_and(|d| d.is_zero()))
        .filter(|w| w.frozen.is_some() || w.cpu_percent.is_some())
        .filter(|w| others_answer(e, w))
        .max_by_key(|w| w.oldest_unanswered_ms)
}

/// A verdict and the detail that says why.
type Judgement = (WebVerdict, String);

pub fn decide(e: &Evidence, cfg: &WebConfig) -> Judgement {
    if !e.listening {
        return (
            WebVerdict::Down,
            format!("nothing listens on port {}", cfg.port),
        );
    }
    stuck_work(e, cfg)
        .or_else(|| stalled(e, cfg))
        .or_else(|| probe_failing(e, cfg))
        .or_else(|| erroring(e, cfg))
        .or_else(|| slow(e, cfg))
        .unwrap_or_else(|| answering(e, cfg))
}

/// ", 95% CPU" when the processes' CPU is known.
fn cpu(e: &Evidence) -> String {
    e.cpu_percent
        .map_or(String::new(), |p| format!(", {p:.0}% CPU"))
}

fn cpu_busy(e: &Evidence) -> bool {
    e.cpu_percent.is_some_and(|p| p >= BUSY_PERCENT)
}

/// Work that cannot move: every process stopped or frozen, one process stuck while the others
/// answer, or the server waiting on a dependency.
fn stuck_work(e: &Evidence, cfg: &WebConfig) -> Option<Judgement> {
    let k = e.kernel.as_ref();
    let stuck = stuck_for(e);
    // Nothing can move: every process holding the listener is stopped or frozen.
    if let Some(why) = &e.frozen {
        if stuck.is_some_and(|d| d >= freeze_confirm(cfg)) {
            return Some((
                WebVerdict::Hung,
                format!("{why}: {}; {}", work(e), last_answer(k)),
            ));
        }
    }

    // One process stuck while the others answer: half capacity, not a reason to scale up,
    // and no reason to take the whole instance out.
    if let Some(w) = stuck_worker(e, cfg) {
        return Some((WebVerdict::PartialHang, describe_stuck(w, k)));
    }

    // Waiting on someone else: its own requests go unanswered and nothing comes back out.
    if !e.dependencies.is_empty() {
        let limit = dependency_limit(k, cfg);
        if stuck.is_some_and(|d| d >= limit) && !k.is_some_and(|k| k.answered_within(limit)) {
            return Some((
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
            ));
        }
    }

    None
}

/// Nothing taken or answered: from the kernel's view, or without it from a queue that never
/// drains and a probe that gets nothing.
fn stalled(e: &Evidence, cfg: &WebConfig) -> Option<Judgement> {
    let k = e.kernel.as_ref();
    let cpu_busy = cpu_busy(e);
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
                return Some((
                    WebVerdict::Hung,
                    format!(
                        "{}; nothing taken or answered for {} (limit {}){}; {}",
                        work(e),
                        k.since_progress().map_or("ever".to_string(), secs),
                        secs(limit),
                        cpu(e),
                        last_answer(Some(k))
                    ),
                ));
            }
            // Work in progress, CPU burning or a livelock: only `unanswered_after` of nothing
            // taken or answered makes it unresponsive.
            if until_hung(oldest, k.since_progress(), cfg.unanswered_after).is_zero()
                && e.dependencies.is_empty()
            {
                return Some((
                    WebVerdict::Unresponsive,
                    format!(
                        "{}; nothing taken or answered for {}{}",
                        work(e),
                        k.since_progress().map_or("ever".to_string(), secs),
                        cpu(e)
                    ),
                ));
            }
        }
        if let Some(_oldest) = k.oldest_pending.filter(|d| *d >= cfg.unanswered_after) {
            if !k.answered_within(cfg.unanswered_after) && e.dependencies.is_empty() {
                return Some((
                    WebVerdict::Unresponsive,
                    format!("{}; {}{}", work(e), last_answer(Some(k)), cpu(e)),
                ));
            }
        }
    } else if let (Some(busy), Some(p)) = (e.queue_busy_for, &e.probe) {
        // Without the kernel view: a queue that never drains, a probe that gets nothing, and
        // (where /proc tells) no CPU.
        if e.queue > 0 && busy >= cfg.hung_after && p.timed_out && !cpu_busy {
            return Some((
                WebVerdict::Hung,
                format!(
                    "accept queue non-empty ({}) for {} and the probe timed out{} (kernel view unavailable)",
                    e.queue,
                    secs(busy),
                    cpu(e)
                ),
            ));
        }
    }

    None
}

/// The probe failing for `unanswered_after`: slow behind other requests, waiting on a
/// dependency, or unresponsive.
fn probe_failing(e: &Evidence, cfg: &WebConfig) -> Option<Judgement> {
    let k = e.kernel.as_ref();
    // A probe set up wrong says nothing about the backend (the monitor names the key).
    if let Some(p) = e.probe.as_ref().filter(|p| p.misconfigured.is_none()) {
        let failing = e.probe_failing_for.unwrap_or_default();
        let server_error = p.status.is_some_and(|s| s >= 500);
        // Refused while the kernel shows a listener: the probe's address is wrong, the backend
        // is not at fault (see below).
        let no_answer = p.status.is_none() && !p.refused;
        if !p.ok && (p.timed_out || server_error || no_answer) && failing >= cfg.unanswered_after {
            if p.timed_out && k.is_some_and(|k| k.answered_within(failing)) {
                // It answers others: the probe waits its turn behind slow requests.
                return Some((
                    WebVerdict::Slow,
                    format!(
                        "the probe timed out for {} but answers still go out ({})",
                        secs(failing),
                        last_answer(k)
                    ),
                ));
            }
            if !e.dependencies.is_empty() {
                return Some((
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
                ));
            }
            let what = p
                .error
                .clone()
                .unwrap_or_else(|| format!("HTTP {}", p.status.unwrap_or_default()));
            return Some((
                WebVerdict::Unresponsive,
                format!(
                    "probe {} failing for {}: {what}",
                    cfg.probe_path,
                    secs(failing)
                ),
            ));
        }
    }

    None
}

fn erroring(e: &Evidence, cfg: &WebConfig) -> Option<Judgement> {
    // It answers, but its real answers mostly fail while its own probe passes: not slow, not
    // busy (more capacity serves more errors), whatever the queue.
    if e.erroring {
        let probe = e.probe.as_ref();
        if probe.map_or(cfg.probe_path.is_empty(), |p| p.ok) {
            let stats = e.answers.unwrap_or_default();
            return Some((
                WebVerdict::Erroring,
                format!(
                    "{}{}",
                    stats.describe(),
                    probe.map_or(String::new(), |p| format!(
                        " while the probe {} answers {}",
                        cfg.probe_path,
                        p.status.unwrap_or(0)
                    ))
                ),
            ));
        }
    }

    None
}

/// Work waits past `slow_after` (a busy server whose answers still go out or whose CPU works
/// on it, or one that answers nothing yet, short of the hang rules' limits), or the latency is
/// over `slow_after`.
fn slow(e: &Evidence, cfg: &WebConfig) -> Option<Judgement> {
    let k = e.kernel.as_ref();
    let stuck = stuck_for(e);
    let cpu_busy = cpu_busy(e);
    if let Some(d) = stuck.filter(|d| *d >= cfg.slow_after) {
        // Busy: work waits, but answers still go out or the CPU is working on it.
        let answering = k.is_some_and(|k| k.answered_within(d.max(cfg.hung_after)));
        if answering || cpu_busy {
            return Some((
                WebVerdict::Slow,
                format!("{}; {}{}", work(e), last_answer(k), cpu(e)),
            ));
        }
        // Nothing goes out while work waits: a server that never answers and a pool whose
        // every worker is in a long request look alike until the hang rules' limits
        // (`unanswered_after`, the stretched `hung_after`) tell them apart. Neither is up.
        return Some((WebVerdict::Slow, unanswered(e, cfg)));
    }
    if let Some(k) = k {
        if k.latency.samples >= 5 && k.latency.p99_ms >= cfg.slow_after.as_secs_f64() * 1000.0 {
            return Some((
                WebVerdict::Slow,
                format!(
                    "server latency p99 {:.0}ms over {} requests (threshold {}ms)",
                    k.latency.p99_ms,
                    k.latency.samples,
                    cfg.slow_after.as_millis()
                ),
            ));
        }
    }
    None
}

/// Nothing wrong seen: up on what answered, or unknown for want of anything to go on.
fn answering(e: &Evidence, cfg: &WebConfig) -> Judgement {
    let k = e.kernel.as_ref();
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
    if let Some(p) = e.probe.as_ref().filter(|p| p.misconfigured.is_some()) {
        // A redirect, a refused Host, a 404, or a TLS mismatch proves the server answers: it
        // is up, and the probe is set up wrong (the monitor reports that as a config error
        // naming the key). Never a reason to restart it.
        return (
            WebVerdict::Up,
            format!(
                "the backend answers, but probe {} got {}: the probe is misconfigured (check \
                 web.probe_path, web.probe_host, web.probe_scheme)",
                cfg.probe_path,
                p.status
                    .map_or_else(|| "a TLS mismatch".to_string(), |s| s.to_string())
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

/// The process `decide` named in a `partial_hang` verdict on this evidence.
pub fn stuck_process(e: &Evidence, cfg: &WebConfig) -> Option<WorkerView> {
    stuck_worker(e, cfg).cloned()
}

/// The earliest instant at which `decide` could turn on this evidence: the composer looks
/// again right then rather than at its next tick, so a hang is reported when it crosses its
/// threshold, not up to an `eval_interval` later.
pub fn next_look(e: &Evidence, cfg: &WebConfig, now: Instant) -> Option<Instant> {
    let stuck = stuck_for(e);
    let k = e.kernel.as_ref();
    let until = |limit: Duration| stuck.map(|s| limit.saturating_sub(s));
    let frozen = e.frozen.as_ref().and_then(|_| until(freeze_confirm(cfg)));
    // Stuck work `slow_after` old is slow, answers going out or not.
    let slow = until(cfg.slow_after);
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
    let worker = e
        .workers
        .iter()
        .filter_map(|w| until_worker_stuck(w, cfg))
        .filter(|w| !w.is_zero())
        .min();
    // Ages are whole milliseconds, read a moment after `now`: aim a little past the edge.
    [
        frozen,
        slow,
        waiting,
        hung,
        unresponsive,
        unanswered,
        worker,
    ]
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

mod describe;
use describe::{describe_stuck, last_answer, secs, unanswered, waiting_on, work};

#[cfg(test)]
mod tests;
