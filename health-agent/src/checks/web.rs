//! The web backend check: who listens on `web.port`, how full its accept queue is, what the
//! kernel programs saw of its connections, and what the active probe got — merged into one
//! verdict (`up`, `slow`, `hung`, `unresponsive`, `down`). Without eBPF the probe and the
//! accept queue still decide, and the report says the kernel view is unavailable.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use health_common::{latency_bucket_floor, AcceptKey, LatencyHist, PortCounters, LATENCY_BUCKETS};
use serde::Serialize;

use super::probe::ProbeResult;
use crate::{
    config::{AcceptTracing, WebConfig},
    ebpf::{KernelSample, KernelView, PortSample},
    net,
    policy::WebVerdict,
};

/// Whether the kernel view is running, and why not.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelStatus {
    /// `active`, `unavailable` or `disabled`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct LatencySummary {
    pub samples: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// What the kernel programs counted for the port (since the agent started).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct KernelCounters {
    /// Handshakes completed into the accept queue.
    pub established: u64,
    /// accept() calls that returned a connection from this listener, while traced.
    pub accepted: u64,
    /// Connections first read or written by a process.
    pub claimed: u64,
    pub requests: u64,
    pub answered: u64,
    pub closed_unanswered: u64,
    pub closed_unaccepted: u64,
    /// Waiting in the accept queue now, untouched by any process.
    pub waiting: u32,
    pub oldest_waiting_ms: Option<u64>,
    /// Requests read and not yet answered now.
    pub pending: u32,
    pub oldest_pending_ms: Option<u64>,
    /// Since the latest accept() on this listener, while the accept tracepoints are attached.
    pub ms_since_last_accept: Option<u64>,
    /// Since the server last claimed a connection (first read or write on it).
    pub ms_since_last_claim: Option<u64>,
    /// Whether accept() is traced now (`web.accept_tracing`); `accepted` counts only then.
    pub accepts_traced: bool,
    /// Server-side latency (request read → first response byte) over `web.latency_window`.
    pub latency: LatencySummary,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WebReport {
    pub port: u16,
    pub verdict: WebVerdict,
    pub detail: String,
    pub listening: bool,
    pub pids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub accept_queue: u32,
    pub accept_queue_max: u32,
    /// TcpExt ListenOverflows / ListenDrops since the agent started (host-wide counters).
    pub listen_overflows: u64,
    pub listen_drops: u64,
    pub kernel: KernelStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<KernelCounters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeResult>,
    /// Set when the probe and the kernel view tell different stories.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagreement: Option<String>,
}

impl WebReport {
    pub fn not_configured() -> Self {
        Self {
            port: 0,
            verdict: WebVerdict::NotConfigured,
            detail: "web.port is 0: no web backend to watch".into(),
            listening: false,
            pids: Vec::new(),
            process: None,
            accept_queue: 0,
            accept_queue_max: 0,
            listen_overflows: 0,
            listen_drops: 0,
            kernel: KernelStatus {
                state: "disabled",
                reason: Some("no web port configured".into()),
            },
            counters: None,
            probe: None,
            disagreement: None,
        }
    }
}

/// The facts one verdict is drawn from; kept apart so the rules are a pure, tested function.
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
}

#[derive(Debug, Clone, Default)]
pub struct KernelEvidence {
    pub waiting: u32,
    pub oldest_waiting: Option<Duration>,
    /// Since the server last made progress through its accept queue: its latest claim of a
    /// connection (first read or write) or accept() (while those are traced). None: no
    /// progress seen since the agent started.
    pub since_progress: Option<Duration>,
    pub pending: u32,
    pub oldest_pending: Option<Duration>,
    pub latency: LatencySummary,
    pub answered: u64,
}

pub fn decide(e: &Evidence, cfg: &WebConfig) -> (WebVerdict, String) {
    let secs = |d: Duration| format!("{:.1}s", d.as_secs_f64());
    if !e.listening {
        return (
            WebVerdict::Down,
            format!("nothing listens on port {}", cfg.port),
        );
    }
    if let Some(k) = &e.kernel {
        if let Some(oldest) = k.oldest_waiting.filter(|_| e.queue > 0) {
            // Hung: connections queue and the server has taken none of them for hung_after.
            // The clock runs from its last progress, not from the first queued arrival; the
            // oldest connection must still have waited half as long, so an idle server's
            // first new connection is not "hung" merely because the previous one was long ago.
            if until_hung(oldest, k.since_progress, cfg).is_zero() {
                let last = k.since_progress.map_or(
                    "no connection taken since the agent started".to_string(),
                    |d| format!("the server last took one {} ago", secs(d)),
                );
                return (
                    WebVerdict::Hung,
                    format!(
                        "{} connections wait in the accept queue, oldest {}, {last}",
                        e.queue,
                        secs(oldest)
                    ),
                );
            }
        }
        if let Some(oldest) = k.oldest_pending.filter(|d| *d >= cfg.unanswered_after) {
            return (
                WebVerdict::Unresponsive,
                format!(
                    "{} requests read and unanswered, oldest {}",
                    k.pending,
                    secs(oldest)
                ),
            );
        }
    } else if let (Some(busy), Some(p)) = (e.queue_busy_for, &e.probe) {
        // Without the kernel view: a queue that never drains and a probe that gets nothing.
        if e.queue > 0 && busy >= cfg.hung_after && p.timed_out {
            return (
                WebVerdict::Hung,
                format!(
                    "accept queue non-empty ({}) for {} and the probe timed out (kernel view unavailable)",
                    e.queue,
                    secs(busy)
                ),
            );
        }
    }
    if let Some(p) = &e.probe {
        let failing = e.probe_failing_for.unwrap_or_default();
        let server_error = p.status.is_some_and(|s| s >= 500);
        if !p.ok
            && (p.timed_out || server_error || p.status.is_none())
            && failing >= cfg.unanswered_after
        {
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
    if let Some(k) = &e.kernel {
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
    if let Some(k) = e.kernel.as_ref().filter(|k| k.answered > 0) {
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

/// How long until queued connections count as hung; zero: they do now. Nothing taken for
/// `hung_after` (from the last progress, or the oldest arrival when none was seen), and the
/// oldest connection waiting at least half of that.
fn until_hung(oldest: Duration, since_progress: Option<Duration>, cfg: &WebConfig) -> Duration {
    let stalled_for = since_progress.unwrap_or(oldest);
    (cfg.hung_after / 2)
        .saturating_sub(oldest)
        .max(cfg.hung_after.saturating_sub(stalled_for))
}

/// The earliest instant at which `decide` could turn hung or unresponsive on this evidence:
/// the composer looks again right then rather than at its next tick, so a hang is reported
/// when it crosses its threshold, not up to an `eval_interval` later.
fn next_look(e: &Evidence, cfg: &WebConfig, now: Instant) -> Option<Instant> {
    let k = e.kernel.as_ref()?;
    let hung = k
        .oldest_waiting
        .filter(|_| e.queue > 0)
        .map(|oldest| until_hung(oldest, k.since_progress, cfg));
    let unanswered = k
        .oldest_pending
        .map(|p| cfg.unanswered_after.saturating_sub(p));
    // Ages are whole milliseconds, read a moment after `now`: aim a little past the edge.
    [hung, unanswered]
        .into_iter()
        .flatten()
        .filter(|w| !w.is_zero())
        .min()
        .map(|w| now + w + Duration::from_millis(2))
}

/// How the probe and the kernel view differ, if they do.
fn disagreement(verdict: WebVerdict, e: &Evidence) -> Option<String> {
    let (k, p) = (e.kernel.as_ref()?, e.probe.as_ref()?);
    let kernel_stalled = k.oldest_waiting.is_some() && e.queue > 0 || k.oldest_pending.is_some();
    if p.ok && matches!(verdict, WebVerdict::Hung | WebVerdict::Unresponsive) {
        return Some("the probe was answered but the kernel sees stalled connections".into());
    }
    if !p.ok && !kernel_stalled && k.answered > 0 && p.timed_out {
        return Some(
            "the probe timed out but the kernel sees no waiting or unanswered connection".into(),
        );
    }
    None
}

fn percentiles(h: &LatencyHist) -> LatencySummary {
    let samples: u64 = h.buckets.iter().sum();
    if samples == 0 {
        return LatencySummary::default();
    }
    let at = |q: f64| -> f64 {
        let rank = ((samples as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in h.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                // Report the middle of the bucket: its floor and the next bucket's floor.
                let lo = latency_bucket_floor(i) as f64;
                let hi = if i + 1 < LATENCY_BUCKETS {
                    latency_bucket_floor(i + 1) as f64
                } else {
                    lo
                };
                return ((lo + hi) / 2.0 / 1000.0 * 100.0).round() / 100.0;
            }
        }
        0.0
    };
    LatencySummary {
        samples,
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
    }
}

fn hist_delta(now: &LatencyHist, then: &LatencyHist) -> LatencyHist {
    let mut d = LatencyHist::default();
    for i in 0..LATENCY_BUCKETS {
        d.buckets[i] = now.buckets[i].saturating_sub(then.buckets[i]);
    }
    d
}

pub struct WebMonitor {
    cfg: WebConfig,
    kernel: Option<KernelView>,
    kernel_status: KernelStatus,
    owners: Vec<u32>,
    owners_inode: u64,
    /// (process, listen fd) → socket inode, resolved once through /proc.
    accept_fds: HashMap<AcceptKey, Option<u64>>,
    latency_ring: VecDeque<(Instant, LatencyHist)>,
    queue_busy_since: Option<Instant>,
    probe_failing_since: Option<Instant>,
    last_probe: Option<ProbeResult>,
    drops_baseline: Option<net::ListenDrops>,
    /// Host-wide counters change slowly and only inform: read every DROPS_EVERY, not per tick.
    drops_seen: Option<(Instant, net::ListenDrops)>,
    owner_name: Option<String>,
    last_verdict: WebVerdict,
    /// When `decide` could next change its mind on the evidence seen (see `next_look`).
    next_look: Option<Instant>,
    /// The latest evaluation that saw a connection wait unclaimed past WATCH_ACCEPTS_AFTER.
    last_stall: Option<Instant>,
    /// Attaching the accept tracepoints failed once: do not retry (and warn) every tick.
    accept_tracing_failed: bool,
}

const DROPS_EVERY: Duration = Duration::from_secs(2);
/// `accept_tracing = "on_stall"`: a connection unclaimed this long attaches the accept
/// tracepoints. A healthy server, even saturated, claims within milliseconds (the 5-minute
/// saturation run in docs/BENCHMARKS.md saw at most 13 ms).
const WATCH_ACCEPTS_AFTER: Duration = Duration::from_millis(200);
/// … and this long without such a connection detaches them again.
const UNWATCH_ACCEPTS_AFTER: Duration = Duration::from_secs(30);

impl WebMonitor {
    /// Loads the kernel programs when configured; a failure leaves the monitor running on
    /// the probe and the accept queue, and says why.
    pub fn new(cfg: WebConfig) -> Self {
        let (kernel, kernel_status) = if cfg.port == 0 {
            (
                None,
                KernelStatus {
                    state: "disabled",
                    reason: Some("no web port configured".into()),
                },
            )
        } else if !cfg.kernel {
            (
                None,
                KernelStatus {
                    state: "disabled",
                    reason: Some("web.kernel = false: probe and accept queue only".into()),
                },
            )
        } else {
            let always = cfg.accept_tracing == AcceptTracing::Always;
            match KernelView::load(&[cfg.port], cfg.max_connections_tracked, always) {
                Ok(k) => {
                    let status = KernelStatus {
                        state: "active",
                        reason: k.note.clone(),
                    };
                    (Some(k), status)
                }
                Err(e) => {
                    let reason = format!("{e}; deciding from the probe and the accept queue");
                    tracing::warn!("kernel view unavailable: {reason}");
                    (
                        None,
                        KernelStatus {
                            state: "unavailable",
                            reason: Some(reason),
                        },
                    )
                }
            }
        };
        Self {
            cfg,
            kernel,
            kernel_status,
            owners: Vec::new(),
            owners_inode: 0,
            accept_fds: HashMap::new(),
            latency_ring: VecDeque::new(),
            queue_busy_since: None,
            probe_failing_since: None,
            last_probe: None,
            drops_baseline: net::listen_drops().ok(),
            drops_seen: None,
            owner_name: None,
            last_verdict: WebVerdict::Unknown,
            next_look: None,
            last_stall: None,
            accept_tracing_failed: false,
        }
    }

    /// When the composer should evaluate again, ahead of its next tick: the instant a
    /// waiting or pending connection could cross its threshold (None once it has passed).
    pub fn next_look(&self, now: Instant) -> Option<Instant> {
        self.next_look.filter(|&t| t > now)
    }

    /// With `accept_tracing = "on_stall"`, attaches the accept tracepoints once a connection
    /// has waited unclaimed for WATCH_ACCEPTS_AFTER and detaches them after
    /// UNWATCH_ACCEPTS_AFTER without one.
    fn steer_accept_tracing(&mut self, oldest_waiting: Option<Duration>, now: Instant) {
        if self.cfg.accept_tracing != AcceptTracing::OnStall || self.accept_tracing_failed {
            return;
        }
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        if oldest_waiting.is_some_and(|d| d >= WATCH_ACCEPTS_AFTER) {
            self.last_stall = Some(now);
        }
        let want = self
            .last_stall
            .is_some_and(|t| now.saturating_duration_since(t) < UNWATCH_ACCEPTS_AFTER);
        if want == k.accepts_watched() {
            return;
        }
        match k.watch_accepts(want) {
            Ok(()) if want => tracing::info!(
                "a connection waits unclaimed on port {}: tracing accept() until none has for {}s",
                self.cfg.port,
                UNWATCH_ACCEPTS_AFTER.as_secs()
            ),
            Ok(()) => tracing::info!("accept() tracing detached: connections are claimed promptly"),
            Err(e) => {
                self.accept_tracing_failed = true;
                tracing::warn!("accept() tracing unavailable, claims alone show progress: {e}");
            }
        }
    }

    /// Whether the backend needs watching every tick: the last verdict was bad, or work is in
    /// flight without progress since the previous tick (one map read; without the kernel
    /// view, an accept queue that was non-empty). A busy server that keeps taking and
    /// answering connections is watched on `checks.interval`, and `next_look` still wakes the
    /// composer when a connection seen then can cross a threshold.
    pub fn hot(&self) -> bool {
        let bad = matches!(
            self.last_verdict,
            WebVerdict::Slow | WebVerdict::Hung | WebVerdict::Unresponsive | WebVerdict::Down
        );
        bad || match &self.kernel {
            Some(k) => k.stalled_in_flight(),
            None => self.queue_busy_since.is_some(),
        }
    }

    /// Takes in a new probe result (the probe runs on its own cadence).
    pub fn record_probe(&mut self, p: ProbeResult, now: Instant) {
        if p.ok {
            self.probe_failing_since = None;
        } else if self.probe_failing_since.is_none() {
            self.probe_failing_since = Some(now);
        }
        self.last_probe = Some(p);
    }

    pub fn evaluate(&mut self, now: Instant) -> WebReport {
        if self.cfg.port == 0 {
            return WebReport::not_configured();
        }
        let listeners = match net::listeners_on(self.cfg.port) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("sock_diag failed: {e}");
                Vec::new()
            }
        };
        let listening = !listeners.is_empty();
        let queue: u32 = listeners.iter().map(|l| l.queue).sum();
        let queue_max: u32 = listeners.iter().map(|l| l.max_queue).sum();
        if queue > 0 {
            self.queue_busy_since.get_or_insert(now);
        } else {
            self.queue_busy_since = None;
        }
        if let Some(first) = listeners.first() {
            if first.inode != self.owners_inode || self.owners.is_empty() {
                self.owners = net::socket_owners(first.inode);
                self.owners_inode = first.inode;
                self.owner_name = self.owners.first().and_then(|&p| net::process_name(p));
            }
        } else {
            self.owners.clear();
            self.owners_inode = 0;
            self.owner_name = None;
        }

        let sample = self.kernel.as_ref().map(KernelView::sample);
        let counters = sample
            .as_ref()
            .and_then(|s| s.ports.iter().find(|p| p.port == self.cfg.port).cloned())
            .map(|p| self.kernel_counters(&p, sample.as_ref(), &listeners, now));

        let evidence = Evidence {
            listening,
            queue,
            queue_busy_for: self
                .queue_busy_since
                .map(|s| now.saturating_duration_since(s)),
            kernel: counters.as_ref().map(|c| KernelEvidence {
                waiting: c.waiting,
                oldest_waiting: c.oldest_waiting_ms.map(Duration::from_millis),
                since_progress: [c.ms_since_last_accept, c.ms_since_last_claim]
                    .into_iter()
                    .flatten()
                    .min()
                    .map(Duration::from_millis),
                pending: c.pending,
                oldest_pending: c.oldest_pending_ms.map(Duration::from_millis),
                latency: c.latency.clone(),
                answered: c.answered,
            }),
            probe: self.last_probe.clone(),
            probe_failing_for: self
                .probe_failing_since
                .map(|s| now.saturating_duration_since(s)),
        };
        let (verdict, detail) = decide(&evidence, &self.cfg);
        self.last_verdict = verdict;
        self.next_look = next_look(&evidence, &self.cfg, now);
        self.steer_accept_tracing(evidence.kernel.as_ref().and_then(|k| k.oldest_waiting), now);
        let stale = self
            .drops_seen
            .is_none_or(|(t, _)| now.saturating_duration_since(t) >= DROPS_EVERY);
        if stale {
            if let Ok(d) = net::listen_drops() {
                self.drops_seen = Some((now, d));
            }
        }
        let (overflows, dropped) = match (self.drops_seen.map(|(_, d)| d), self.drops_baseline) {
            (Some(d), Some(b)) => (
                d.overflows.saturating_sub(b.overflows),
                d.drops.saturating_sub(b.drops),
            ),
            _ => (0, 0),
        };
        WebReport {
            port: self.cfg.port,
            verdict,
            detail,
            listening,
            pids: self.owners.clone(),
            process: self.owner_name.clone(),
            accept_queue: queue,
            accept_queue_max: queue_max,
            listen_overflows: overflows,
            listen_drops: dropped,
            kernel: self.kernel_status.clone(),
            disagreement: disagreement(verdict, &evidence),
            counters,
            probe: self.last_probe.clone(),
        }
    }

    fn kernel_counters(
        &mut self,
        p: &PortSample,
        sample: Option<&KernelSample>,
        listeners: &[net::Listener],
        now: Instant,
    ) -> KernelCounters {
        let c: &PortCounters = &p.counters;
        // accept() progress on this port's listen sockets.
        let inodes: Vec<u64> = listeners.iter().map(|l| l.inode).collect();
        let mut accepted = 0;
        let mut last_ns = None::<u64>;
        let now_ns = sample.map_or(0, |s| s.now_ns);
        if let Some(s) = sample {
            self.accept_fds
                .retain(|k, _| s.accepts.iter().any(|(a, _)| a == k));
            for (key, stat) in &s.accepts {
                let inode = *self
                    .accept_fds
                    .entry(*key)
                    .or_insert_with(|| net::fd_socket_inode(key.tgid, key.fd));
                if inode.is_some_and(|i| inodes.contains(&i)) {
                    accepted += stat.count;
                    last_ns = Some(last_ns.map_or(stat.last_ns, |l: u64| l.max(stat.last_ns)));
                }
            }
        }
        // Latency over the sliding window.
        self.latency_ring.push_back((now, p.latency));
        while self
            .latency_ring
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.cfg.latency_window)
        {
            self.latency_ring.pop_front();
        }
        let window = match self.latency_ring.front() {
            // Until a full window has passed, everything since start counts.
            Some((t, h))
                if now.saturating_duration_since(*t) + self.cfg.eval_interval
                    >= self.cfg.latency_window =>
            {
                hist_delta(&p.latency, h)
            }
            _ => p.latency,
        };
        let ms = |d: Duration| d.as_millis() as u64;
        KernelCounters {
            established: c.established,
            accepted,
            claimed: c.claimed,
            requests: c.requests,
            answered: c.answered,
            closed_unanswered: c.closed_unanswered,
            closed_unaccepted: c.closed_unclaimed,
            waiting: p.waiting,
            oldest_waiting_ms: p.oldest_waiting.map(ms),
            pending: p.pending,
            oldest_pending_ms: p.oldest_pending.map(ms),
            ms_since_last_accept: last_ns.map(|l| now_ns.saturating_sub(l) / 1_000_000),
            ms_since_last_claim: (c.last_claim_ns != 0)
                .then(|| now_ns.saturating_sub(c.last_claim_ns) / 1_000_000),
            accepts_traced: self
                .kernel
                .as_ref()
                .is_some_and(KernelView::accepts_watched),
            latency: percentiles(&window),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::latency_bucket;

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
        }
    }

    fn probe_timeout() -> ProbeResult {
        ProbeResult {
            ok: false,
            status: None,
            latency_ms: 2000.0,
            error: Some("no answer within 2000ms".into()),
            timed_out: true,
        }
    }

    fn listening() -> Evidence {
        Evidence {
            listening: true,
            ..Evidence::default()
        }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn no_listener_is_down() {
        assert_eq!(decide(&Evidence::default(), &cfg()).0, WebVerdict::Down);
    }

    #[test]
    fn queue_without_accepts_is_hung() {
        let e = Evidence {
            queue: 3,
            kernel: Some(KernelEvidence {
                waiting: 3,
                oldest_waiting: Some(3 * S),
                since_progress: Some(10 * S),
                ..Default::default()
            }),
            ..listening()
        };
        let (v, detail) = decide(&e, &cfg());
        assert_eq!(v, WebVerdict::Hung, "{detail}");
        assert!(detail.contains("3 connections"), "{detail}");
    }

    #[test]
    fn saturated_but_accepting_is_never_hung() {
        let e = Evidence {
            queue: 100,
            kernel: Some(KernelEvidence {
                waiting: 100,
                oldest_waiting: Some(5 * S),
                since_progress: Some(Duration::from_millis(20)),
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

    fn waiting(oldest: Duration, since_progress: Option<Duration>) -> Evidence {
        Evidence {
            queue: 1,
            kernel: Some(KernelEvidence {
                waiting: 1,
                oldest_waiting: Some(oldest),
                since_progress,
                ..Default::default()
            }),
            ..listening()
        }
    }

    #[test]
    fn without_any_progress_seen_the_queue_must_wait_hung_after() {
        let young = waiting(Duration::from_millis(1999), None);
        assert_eq!(decide(&young, &cfg()).0, WebVerdict::Unknown);
        assert_eq!(decide(&waiting(2 * S, None), &cfg()).0, WebVerdict::Hung);
    }

    #[test]
    fn the_stall_clock_runs_from_the_last_progress() {
        // Stopped 2.05 s after its last accept; the first connection after that arrived
        // 0.1 s later and has waited 1.95 s: hung now, not 0.1 s from now.
        let ms = Duration::from_millis;
        let e = waiting(ms(1950), Some(ms(2050)));
        let (v, detail) = decide(&e, &cfg());
        assert_eq!(v, WebVerdict::Hung, "{detail}");
        assert!(detail.contains("last took one 2.0s ago"), "{detail}");
        // Progress within hung_after: still fine.
        assert_eq!(
            decide(&waiting(ms(1950), Some(ms(1900))), &cfg()).0,
            WebVerdict::Unknown
        );
    }

    #[test]
    fn an_idle_servers_next_connection_is_not_hung_at_once() {
        // The previous connection was taken ten minutes ago; this one arrived 0.9 s ago.
        let e = waiting(Duration::from_millis(900), Some(600 * S));
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unknown);
        let e = waiting(S, Some(600 * S));
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
    fn the_next_look_lands_where_the_verdict_can_change() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        // Stall clock at 1.5 s, oldest 0.7 s: hung_after is reached in 0.5 s (and by then the
        // oldest has waited 1.2 s, past hung_after / 2).
        let at = next_look(&waiting(ms(700), Some(ms(1500))), &cfg(), now).unwrap();
        assert_eq!(at - now, ms(502));
        // Oldest 0.2 s, stall clock far past: half of hung_after is reached in 0.8 s.
        let at = next_look(&waiting(ms(200), Some(60 * S)), &cfg(), now).unwrap();
        assert_eq!(at - now, ms(802));
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
    fn unanswered_request_is_unresponsive_only_after_threshold() {
        let mut e = Evidence {
            kernel: Some(KernelEvidence {
                pending: 1,
                oldest_pending: Some(9 * S),
                answered: 5,
                ..Default::default()
            }),
            ..listening()
        };
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Up);
        e.kernel.as_mut().unwrap().oldest_pending = Some(10 * S);
        assert_eq!(decide(&e, &cfg()).0, WebVerdict::Unresponsive);
    }

    #[test]
    fn degraded_mode_uses_queue_and_probe() {
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
        // A queue that just formed is not enough.
        let e = Evidence {
            queue_busy_for: Some(S),
            ..e
        };
        assert_ne!(decide(&e, &cfg()).0, WebVerdict::Hung);
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

    #[test]
    fn percentiles_from_buckets() {
        let mut h = LatencyHist::default();
        for _ in 0..98 {
            h.buckets[latency_bucket(1_000)] += 1; // 1 ms
        }
        h.buckets[latency_bucket(100_000)] += 2; // 100 ms
        let p = percentiles(&h);
        assert_eq!(p.samples, 100);
        assert!((0.8..1.3).contains(&p.p50_ms), "{p:?}");
        assert!((0.8..1.3).contains(&p.p95_ms), "{p:?}");
        assert!((80.0..130.0).contains(&p.p99_ms), "{p:?}");
    }
}
