//! Gathers the web backend's evidence each round — listeners and their queue (sock_diag),
//! the kernel programs' counters, the probe, and, while work is stuck, the server processes'
//! state, CPU and outbound waits — and turns it into a `WebReport` through `verdict::decide`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use health_common::{AcceptKey, PortCounters};

use super::{
    answers::AnswerWindow,
    figures::{Figures, FiguresReport, Mark, FIGURES_EVERY},
    latency::LatencyWindow,
    process::{self, CpuMeter, WorkerView},
    progress::{Moves, Progress},
    sockets::{SocketMoves, SocketView},
    target::{self, Target, Unresolved},
    verdict::{self, Evidence, KernelEvidence},
    Following, KernelCounters, KernelState, KernelStatus, ProcessView, WebReport,
};
use crate::{
    checks::probe::{ProbeResult, ProbeTarget, SharedProbeTarget},
    config::{AcceptTracing, KernelTier, SocketTracing, WebConfig},
    docker::ContainerNet,
    ebpf::{KernelSample, KernelView, PortSample},
    net::{self, ListenAddrs},
    status::WebVerdict,
};

pub struct WebMonitor {
    cfg: WebConfig,
    /// Where the backend listens, once known.
    target: Option<Target>,
    /// The latest Docker report on `web.container`'s network (`String`: the Docker client's
    /// errors are text, see `docker.rs`).
    container_net: Option<Result<ContainerNet, crate::docker::DockerError>>,
    /// Where the probe task connects: set from the listeners seen.
    probe_target: SharedProbeTarget,
    kernel: Option<KernelView>,
    kernel_status: KernelStatus,
    owners: Vec<u32>,
    owners_inode: u64,
    /// When `owners` was last read from /proc: a pre-fork master replaces workers, so the
    /// list is read again when one has gone, and new children of its processes are looked
    /// for before a look at stuck work once it is OWNERS_FRESH old.
    owners_scanned: Option<Instant>,
    /// CPU of each process holding the listener, sampled while work is stuck.
    worker_cpu: HashMap<u32, CpuMeter>,
    /// When a look prompted only by connections accepted and never read found no process
    /// holding a request (see HELD_LOOK_EVERY).
    held_found_nothing: Option<Instant>,
    /// (process, listen fd) → socket inode, resolved once through /proc.
    accept_fds: HashMap<AcceptKey, Option<u64>>,
    latency: LatencyWindow,
    progress: Progress,
    cpu: CpuMeter,
    /// The backend has been seen serving since the agent started.
    served: bool,
    queue_busy_since: Option<Instant>,
    probe_failing_since: Option<Instant>,
    /// When a probe last passed.
    probe_passed_at: Option<Instant>,
    last_probe: Option<ProbeResult>,
    /// The latest probe the agent itself could not make (no descriptors, no local port):
    /// shown, never evidence.
    probe_trouble: Option<ProbeResult>,
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
    /// `web.container` / `web.netns` has been found at least once since the agent started.
    found_once: bool,
    /// Since when what they name has not been found.
    missing_since: Option<Instant>,
    /// The port's counters as the latest tick read them (for the saturation meter).
    last_counters: Option<PortCounters>,
    /// `socket_tracing = "on_suspicion"`: the port's connections as sock_diag showed them at
    /// the latest evaluation.
    sockets: Option<SocketView>,
    /// The latest evaluation that found something suspicious, and what.
    last_suspicion: Option<(Instant, String)>,
    /// Attaching the following programs failed once: do not retry (and warn) every tick.
    follow_failed: bool,
    /// Why the latest read of the port's connections failed.
    sockets_error: Option<String>,
    /// The latest read found something suspicious: evaluate every tick.
    suspicious: bool,
    /// A counting window (COUNT_FOR) opened then; the previous one closed at `counted_at`.
    counting_since: Option<Instant>,
    counted_at: Option<Instant>,
    /// What moved on the port's connections between two ticks (sock_diag).
    socket_moves: SocketMoves,
    /// When `sockets` was read.
    sockets_at: Option<Instant>,
    /// The latest read that saw traffic: something moved, or work was there.
    traffic_at: Option<Instant>,
    /// What moved on the port's connections between the two latest reads.
    last_moves: Moves,
    /// Where the port's listeners are bound: the connection reads ask for their families and
    /// keep their sockets only.
    listen_addrs: ListenAddrs,
    /// This tick detached the programs after reading their counters (`last_counters`): its
    /// load sample is still a counted one.
    counted_detaching: bool,
    /// This tick's `observe` read the port's connections: a sampled load sample is fresh.
    read_now: bool,
    /// Request rate, answers by class and latency over `web.latency_window`, from the spans
    /// the programs counted.
    figures: Figures,
    /// Where the current span started (the programs attached, or the last cut of an
    /// `"always"` span).
    span_from: Option<Mark>,
    /// Probes made so far, and attaches of the answer programs so far (see `Mark`).
    probes_made: u64,
    answers_attaches: u64,
    /// How often the port's connections are read while nothing goes on: QUIET_READ_EVERY, or
    /// longer when a read costs more than QUIET_BUDGET allows (see `read_sockets`).
    quiet_every: Duration,
    /// What the backend answered over `web.errors_window`, by status class.
    answers: AnswerWindow,
    /// The kernel view's tier (`web.kernel_tier`, or what the kernel offers).
    tier: KernelTier,
    /// In the `sock_diag` tier: the segments-sent count at the previous tick.
    segments: Option<u64>,
    /// `socket_tracing = "on_suspicion"`: when the latest sampling window of the answer
    /// programs opened (see ANSWERS_EVERY).
    answers_sampled_at: Option<Instant>,
    /// Attaching the answer programs failed once, and why: not retried (nor warned) every
    /// tick, and the answers say the status is not visible.
    answers_attach_failed: Option<String>,
    /// The processes holding the listener when the answers were last read: a wholly new set
    /// (a restart) starts the answers' window over.
    answers_pids: Vec<u32>,
}

/// A container that was found before and is gone this long is no longer "being recreated"
/// (docker compose up, a deploy's rm + run take seconds): it is reported as a config error.
const GONE_FOR_GOOD: Duration = Duration::from_secs(60);

const DROPS_EVERY: Duration = Duration::from_secs(2);
/// How old the list of processes holding the listener may be when stuck work is looked at.
const OWNERS_FRESH: Duration = Duration::from_secs(5);
/// Work stuck this long makes the monitor look at the server's processes.
const LOOK_AFTER: Duration = Duration::from_millis(200);
/// Connections accepted and never read, with nothing else stuck, are looked into this often
/// once a look found no process holding a request: silent clients (a proxy's pre-opened
/// connections, slow or idle ones) leave the server nothing to read, and each look reads every
/// connection of the namespace and every descriptor of the server's processes.
const HELD_LOOK_EVERY: Duration = Duration::from_secs(1);
/// An outbound request counts as what the server waits on if it went out no earlier than
/// this before the server last moved.
const SENT_BEFORE_STALL: Duration = Duration::from_secs(1);
/// `accept_tracing = "on_stall"`: a connection unclaimed this long attaches the accept
/// tracepoints. A healthy server, even saturated, claims within milliseconds (the 5-minute
/// saturation run in docs/BENCHMARKS.md saw at most 13 ms).
const WATCH_ACCEPTS_AFTER: Duration = Duration::from_millis(200);
/// … and this long without such a connection detaches them again.
const UNWATCH_ACCEPTS_AFTER: Duration = Duration::from_secs(30);
/// `socket_tracing = "on_suspicion"`: this long without anything suspicious detaches the
/// programs that follow connections.
const UNFOLLOW_AFTER: Duration = Duration::from_secs(30);
/// … and reads the port's connections this often while nothing goes on (see `sockets_due`).
const QUIET_READ_EVERY: Duration = Duration::from_secs(1);
/// … unless a read takes more than this share of the agent's thread: then the quiet reads
/// space out so that they stay within it (1 %). A read costs about 2 µs per connection of the
/// port (10,000 idle ones: 15–20 ms), so past about 5,000 connections a request arriving on an
/// idle one is seen a little later than QUIET_READ_EVERY; the probe and the listener's queue,
/// read every tick, are not.
const QUIET_BUDGET: u32 = 100;
/// … but never further apart than this, whatever one read cost.
const QUIET_READ_MAX: Duration = Duration::from_secs(5);
/// … and every tick for this long after a read that saw traffic: short requests on their own
/// connections (50 ms, a dozen a second) mostly live between two reads, so a read that finds
/// the port empty says little; read once a second, their answers would show seconds apart and
/// read as the server going quiet.
const TRAFFIC_HOLD: Duration = Duration::from_secs(2);
/// … and while sock_diag cannot tell keep-alive requests in service from answered ones
/// (`Moves::unsure`), attaches the programs this long every COUNT_EVERY to count them for the
/// saturation meter: the window closes on the first tick COUNT_FOR after it opened, the second
/// at the default 250 ms ticks (a tick a few ms early still closes it), and that tick reads the
/// counts before detaching: two counted ticks, half a second attached in 15, a thirtieth of
/// the per-call cost for a web part that is measured.
const COUNT_FOR: Duration = Duration::from_millis(450);
const COUNT_EVERY: Duration = Duration::from_secs(15);
/// `socket_tracing = "on_suspicion"`: the answer programs (status classes) run per packet of
/// the watched port, so they too attach only while the programs that follow connections are
/// (a counting window, a suspicion), for a longer sampling window of ANSWERS_FOR every
/// ANSWERS_EVERY (opened with a counting window), and while the answers' latest second failed:
/// a box that answers only 5xx is seen within COUNT_EVERY, then followed until the judgement
/// is made.
const ANSWERS_FOR: Duration = Duration::from_secs(1);
/// … and a peer asking for fresh answers opens one at most this often.
const ANSWERS_ON_ASK: Duration = Duration::from_secs(3);
const ANSWERS_EVERY: Duration = Duration::from_secs(30);

/// Loads the kernel programs when `cfg` asks for them, in the highest tier the kernel offers
/// (or the one `web.kernel_tier` forces). A failure is not fatal: the monitor then decides from
/// sock_diag, /proc and the probe (the `no_ebpf` tier), and its report says why.
pub fn load_kernel(cfg: &WebConfig) -> (Option<KernelView>, KernelStatus) {
    if cfg.port == 0 {
        let status = KernelStatus {
            state: KernelState::Disabled,
            reason: Some("no web port configured".into()),
            following: None,
            tier: None,
            missing: Vec::new(),
        };
        return (None, status);
    }
    let no_ebpf = |state, why: String| {
        let status = KernelStatus {
            state,
            reason: Some(format!("{why}; sock_diag, /proc and the probe decide")),
            following: None,
            tier: Some(KernelTier::NoEbpf),
            missing: vec![
                format!("eBPF: {why}"),
                "the answers' status classes (erroring)".into(),
            ],
        };
        (None, status)
    };
    if !cfg.kernel {
        return no_ebpf(KernelState::Disabled, "web.kernel = false".into());
    }
    if cfg.kernel_tier == KernelTier::NoEbpf {
        return no_ebpf(
            KernelState::Disabled,
            "web.kernel_tier = \"no_ebpf\"".into(),
        );
    }
    let always = cfg.accept_tracing == AcceptTracing::Always;
    let follow = cfg.socket_tracing == SocketTracing::Always;
    let socket_calls = cfg.kernel_tier != KernelTier::SockDiag;
    match KernelView::load(cfg.max_connections_tracked, always, follow, socket_calls) {
        Ok(mut k) => {
            let mut missing = Vec::new();
            let tier = match k.socket_calls_missing() {
                None => KernelTier::Full,
                Some(why) => {
                    missing.push(format!(
                        "the socket-call tracepoints: {why}; sock_diag reads the port's \
                         connections every evaluation instead (no per-exchange counts, no \
                         latency histogram)"
                    ));
                    KernelTier::SockDiag
                }
            };
            if tier == KernelTier::SockDiag {
                // Every segment sent is the evidence of answers going out there.
                k.count_segments_sent();
            }
            if cfg.kernel_tier == KernelTier::Full && tier != KernelTier::Full {
                tracing::warn!(
                    "web.kernel_tier = \"full\" asked for, but this kernel has no socket-call \
                     tracepoints: running the sock_diag tier"
                );
            }
            if let Some(why) = k.answers_unavailable() {
                missing.push(format!("the answers' status classes (erroring): {why}"));
            }
            let following = (tier == KernelTier::Full).then(|| Following {
                mode: cfg.socket_tracing,
                attached: follow,
                why: if follow {
                    "web.socket_tracing = \"always\"".to_string()
                } else {
                    "nothing suspicious yet: sock_diag reads the port's connections".to_string()
                },
                connections: None,
                quiet_read_every_ms: None,
            });
            tracing::info!(
                "kernel view: tier {}{}",
                tier.as_str(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(" (without {})", missing.join("; "))
                }
            );
            let status = KernelStatus {
                state: KernelState::Active,
                reason: k.note.clone(),
                following,
                tier: Some(tier),
                missing,
            };
            (Some(k), status)
        }
        Err(e) => {
            tracing::warn!("kernel view unavailable: {e}; tier no_ebpf");
            no_ebpf(KernelState::Unavailable, e.to_string())
        }
    }
}

impl WebMonitor {
    /// A monitor on `kernel` (loaded by `load_kernel`, or None: probe, accept queue and /proc
    /// only), whose reports carry `kernel_status`.
    pub fn new(
        cfg: WebConfig,
        mut kernel: Option<KernelView>,
        kernel_status: KernelStatus,
    ) -> Self {
        if let Some(k) = kernel.as_mut() {
            k.set_probe_path(&cfg.probe_path);
        }
        let tier = kernel_status.tier.unwrap_or(KernelTier::NoEbpf);
        Self {
            cfg,
            target: None,
            container_net: None,
            probe_target: SharedProbeTarget::default(),
            kernel,
            kernel_status,
            owners: Vec::new(),
            owners_inode: 0,
            owners_scanned: None,
            worker_cpu: HashMap::new(),
            held_found_nothing: None,
            accept_fds: HashMap::new(),
            latency: LatencyWindow::default(),
            progress: Progress::default(),
            cpu: CpuMeter::default(),
            served: false,
            queue_busy_since: None,
            probe_failing_since: None,
            probe_passed_at: None,
            last_probe: None,
            probe_trouble: None,
            drops_baseline: net::listen_drops().ok(),
            drops_seen: None,
            owner_name: None,
            last_verdict: WebVerdict::Unknown,
            next_look: None,
            last_stall: None,
            accept_tracing_failed: false,
            found_once: false,
            missing_since: None,
            last_counters: None,
            sockets: None,
            last_suspicion: None,
            follow_failed: false,
            sockets_error: None,
            suspicious: false,
            counting_since: None,
            counted_at: None,
            socket_moves: SocketMoves::default(),
            sockets_at: None,
            traffic_at: None,
            last_moves: Moves::default(),
            listen_addrs: ListenAddrs::default(),
            quiet_every: QUIET_READ_EVERY,
            counted_detaching: false,
            read_now: false,
            figures: Figures::default(),
            span_from: None,
            probes_made: 0,
            answers_attaches: 0,
            answers: AnswerWindow::default(),
            answers_pids: Vec::new(),
            tier,
            segments: None,
            answers_sampled_at: None,
            answers_attach_failed: None,
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

    /// Reads the kernel counters (one map read) and notes what moved since the previous tick.
    /// Runs on every tick, so the time of the last answer is known to within one tick.
    pub fn observe(&mut self, now: Instant) {
        // With `socket_tracing = "on_suspicion"`, or below the `full` tier, the port's
        // connections (one sock_diag dump filtered by port): what moved on them, and whether
        // anything is suspicious.
        let seen = if self.sockets_due(now) {
            self.read_sockets(now)
        } else {
            None
        };
        let read = seen.is_some();
        self.read_now = read;
        let mut seen = seen.unwrap_or_default();
        if self.kernel.is_none() {
            // The no_ebpf tier: what sock_diag saw move is all there is. A connection the
            // server took and that is gone now was closed by it: the server moved.
            if read {
                seen.answered |= seen.gone;
                self.progress
                    .observe_moves(seen, now, self.cfg.latency_window);
            }
            return;
        }
        seen.answered |= self.segments_sent();
        let suspicion = self.suspicion();
        // Read before steering: a tick that detaches the programs (a counting window closing)
        // still counts the quarter-second since the previous one.
        let counted = self
            .kernel
            .as_ref()
            .filter(|k| k.following())
            .and_then(|k| k.counters().first().copied());
        self.steer_following(suspicion, now);
        // The answer programs' sampling windows open with a counting window and close on the
        // tick, not at the next report.
        self.steer_answers(now);
        self.track_span(now);
        let Some(k) = &self.kernel else { return };
        let window = self.cfg.latency_window;
        self.counted_detaching = counted.is_some() && !k.following();
        if counted.is_none() && !k.following() {
            // Detached, the counters stand still: what sock_diag saw move is all there is. A
            // connection the server took that is gone now was answered and closed between two
            // reads (short requests on their own connections mostly live between reads): the
            // server moved, or their wait would read as a quiet spell until the next counting
            // window, and that spell as this server's normal.
            if read {
                // (Not in the sock_diag tier: the answer programs count every segment sent,
                // and a connection its client gave up on is gone too.)
                seen.answered |= seen.gone && self.tier != KernelTier::SockDiag;
                self.progress.observe_moves(seen, now, window);
            }
            return;
        }
        // Attached at this tick, they have counted nothing yet: read them now, as the base.
        self.last_counters = counted.or_else(|| k.counters().first().copied());
        if let Some(c) = &self.last_counters {
            self.progress.observe_with(c, seen, now, window);
        }
    }

    /// What the saturation meter needs from the latest tick: the kernel's counters (read by
    /// `observe`, no map read here) and the server processes' CPU time (one small /proc read
    /// each). None without the kernel view or before the backend is found.
    pub fn load_sample(&self) -> Option<crate::saturation::LoadSample> {
        self.target.as_ref()?;
        if self.kernel.as_ref().is_some_and(|k| !k.following()) && !self.counted_detaching {
            // Detached: requests in service and connections waiting, read from sock_diag —
            // by this tick only. A tick between two reads (once a second while nothing was in
            // service at the last) has nothing of its own: the next read stands for the whole
            // span, rather than the last read's "nothing in service" standing for a second of
            // load that came after it.
            if !self.read_now {
                return None;
            }
            let v = self.sockets.as_ref()?;
            return Some(crate::saturation::LoadSample {
                pending: u64::from(v.pending),
                waiting: u64::from(v.unaccepted),
                backend_cpu_seconds: process::cpu_seconds(&self.owners),
                sampled: true,
                // A connection the server had taken that is gone was served and closed (one
                // request per connection lives between two reads): progress too.
                moved: self.last_moves.answered || self.last_moves.gone,
                unsure: self.last_moves.unsure,
                ..Default::default()
            });
        }
        let c = self.last_counters.as_ref()?;
        // Per request, not per connection: the later requests of a keep-alive connection —
        // all a load balancer's traffic — show in none of the per-connection counters.
        Some(crate::saturation::LoadSample {
            established: c.arrivals(),
            answered: c.exchanges_out,
            pending: c.in_service(),
            waiting: c.waiting(),
            backend_cpu_seconds: process::cpu_seconds(&self.owners),
            sampled: false,
            moved: false,
            unsure: false,
        })
    }

    /// Whether sock_diag reads the port's connections: with `socket_tracing = "on_suspicion"`
    /// (between the programs' attachments), and always below the `full` tier.
    fn reads_sockets(&self) -> bool {
        self.cfg.socket_tracing == SocketTracing::OnSuspicion || self.tier != KernelTier::Full
    }

    /// In the `sock_diag` tier: whether a segment with a payload left the port since the
    /// previous tick (the answer programs count them): answers going out, between two reads
    /// of the connections or on a connection that opened and closed between them.
    fn segments_sent(&mut self) -> bool {
        if self.tier != KernelTier::SockDiag {
            return false;
        }
        let (Some(k), Some(port)) = (&self.kernel, self.target.as_ref().map(|t| t.port)) else {
            return false;
        };
        let Ok(sent) = k.answer_counters(port).map(|c| c.sent) else {
            return false;
        };
        let moved = self.segments.is_some_and(|before| sent > before);
        self.segments = Some(sent);
        moved
    }

    /// With `socket_tracing = "on_suspicion"`, or below the `full` tier: reads the port's
    /// connections into `self.sockets` (None when there is no target yet or sock_diag failed:
    /// the failure is itself a reason to follow, see `suspicion`) and returns what moved on
    /// them since the previous read.
    fn read_sockets(&mut self, now: Instant) -> Option<Moves> {
        self.sockets = None;
        self.sockets_error = None;
        if !self.reads_sockets() {
            return None;
        }
        let t = self.target.as_ref()?;
        let cpu_before = process::thread_cpu_time();
        match t.diag.server_connections(t.port, &self.listen_addrs) {
            Ok(conns) => {
                let v = SocketView::of(&conns);
                let moves = self.socket_moves.update(&conns, &v);
                if let (Some(a), Some(b)) = (cpu_before, process::thread_cpu_time()) {
                    self.quiet_every = (b.saturating_sub(a) * QUIET_BUDGET)
                        .clamp(QUIET_READ_EVERY, QUIET_READ_MAX);
                }
                if moves.read
                    || moves.answered
                    || moves.taken
                    || moves.gone
                    || v.unaccepted + v.unread + v.pending > 0
                {
                    self.traffic_at = Some(now);
                }
                self.last_moves = moves;
                self.sockets = Some(v);
                self.sockets_at = Some(now);
                Some(moves)
            }
            Err(e) => {
                self.sockets_error = Some(e.to_string());
                None
            }
        }
    }

    /// Whether this tick reads the port's connections. A dump walks every TCP socket of the
    /// namespace (the kernel filters by port only after that), so while nothing goes on it is
    /// made once every QUIET_READ_EVERY (or less often, see QUIET_BUDGET); work or traffic
    /// seen at the last read or a listener with connections in its queue (one read of the
    /// listening table) make it every tick. The programs being attached do not: they see every new
    /// connection and socket call, and the read covers the connections opened before them,
    /// which show here as soon as they hold work (10,000 idle keep-alive connections read
    /// every tick cost 6 % of a core).
    fn sockets_due(&self, now: Instant) -> bool {
        let Some(at) = self.sockets_at else {
            return true;
        };
        let m = &self.last_moves;
        if now.saturating_duration_since(at) >= self.quiet_every
            || self.sockets_error.is_some()
            || self
                .traffic_at
                .is_some_and(|t| now.saturating_duration_since(t) < TRAFFIC_HOLD)
            // Traffic moved at the last read: requests come, so every tick's read counts
            // them in service (the saturation's samples), not one a second.
            || m.read
            || m.answered
            || m.taken
            || m.gone
            || self
                .sockets
                .as_ref()
                .is_none_or(|v| v.unaccepted + v.unread + v.pending > 0)
        {
            return true;
        }
        self.target
            .as_ref()
            .is_some_and(|t| t.listeners().is_ok_and(|l| l.iter().any(|l| l.queue > 0)))
    }

    /// What, if anything, makes the programs that follow connections worth their cost now.
    fn suspicion(&self) -> Option<String> {
        if let Some(e) = &self.sockets_error {
            return Some(format!("the port's connections could not be read ({e})"));
        }
        if let Some(why) = self
            .sockets
            .as_ref()
            .and_then(|v| v.suspicion(self.cfg.slow_after / 2))
        {
            return Some(why);
        }
        // A 4xx proves the server answers (the path is wrong: a config error, said apart).
        let answers = self
            .last_probe
            .as_ref()
            .is_some_and(|p| p.status.is_some_and(|s| (400..500).contains(&s)));
        if self.probe_failing_since.is_some() && !answers {
            return Some("the probe fails".into());
        }
        let wrong = !matches!(
            self.last_verdict,
            WebVerdict::Up | WebVerdict::Unknown | WebVerdict::NotConfigured
        );
        wrong.then(|| format!("the backend is {}", self.last_verdict.as_str()))
    }

    /// With `socket_tracing = "on_suspicion"`, attaches the programs that follow connections
    /// on a suspicion and detaches them after UNFOLLOW_AFTER without one. Attaching restarts
    /// their counts: what was learned from them before (quiet spells) stays, the latency
    /// window starts over.
    fn steer_following(&mut self, suspicion: Option<String>, now: Instant) {
        if !self.reads_sockets() {
            return;
        }
        self.suspicious = suspicion.is_some();
        if let Some(why) = suspicion {
            self.last_suspicion = Some((now, why));
        }
        if self.tier != KernelTier::Full {
            // Nothing to attach: sock_diag (and the answer programs) are the view.
            self.kernel_status.following = Some(Following {
                mode: self.cfg.socket_tracing,
                attached: false,
                why: format!(
                    "the {} tier: sock_diag reads the port's connections",
                    self.tier.as_str()
                ),
                connections: self.sockets.clone(),
                quiet_read_every_ms: Some(self.quiet_every.as_millis() as u64),
            });
            return;
        }
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        let recent = self
            .last_suspicion
            .as_ref()
            .filter(|(t, _)| now.saturating_duration_since(*t) < UNFOLLOW_AFTER);
        // A counting window: opened while detached and sock_diag is unsure, closed after
        // COUNT_FOR (unless a suspicion keeps the programs on).
        if let Some(t) = self.counting_since {
            if now.saturating_duration_since(t) >= COUNT_FOR {
                self.counting_since = None;
                self.counted_at = Some(now);
            }
        } else if recent.is_none()
            && !k.following()
            && self
                .counted_at
                .is_none_or(|t| now.saturating_duration_since(t) >= COUNT_EVERY)
        {
            self.counting_since = Some(now);
        }
        let counting = self.counting_since.is_some() && recent.is_none();
        let want = (recent.is_some() || counting) && !self.follow_failed;
        if want != k.following() {
            match k.follow(want) {
                Ok(()) if want => {
                    if let Some((_, why)) = recent {
                        tracing::info!(
                            "following every connection of port {}: {why}",
                            self.cfg.port
                        );
                    } else {
                        // Every COUNT_EVERY under keep-alive load: not worth the journal.
                        tracing::debug!(
                            "counting port {}'s exchanges for {} ms",
                            self.cfg.port,
                            COUNT_FOR.as_millis()
                        );
                    }
                    self.progress.rebase();
                    self.latency = LatencyWindow::default();
                    self.last_counters = None;
                }
                Ok(()) if self.counted_at == Some(now) => {
                    tracing::debug!("counting window of port {} closed", self.cfg.port);
                }
                Ok(()) => tracing::info!(
                    "connection programs detached: nothing suspicious for {}s; sock_diag reads \
                     port {}'s connections",
                    UNFOLLOW_AFTER.as_secs(),
                    self.cfg.port
                ),
                Err(e) => {
                    self.follow_failed = true;
                    tracing::warn!(
                        "the connection programs could not attach ({e}): deciding from the \
                         probe, the accept queue and sock_diag"
                    );
                }
            }
        }
        let attached = k.following();
        let why = match (&self.last_suspicion, attached) {
            _ if self.follow_failed => "attaching failed; sock_diag and the probe only".into(),
            _ if counting && attached => format!(
                "counting exchanges for {} ms every {} s: keep-alive requests come back to back, \
                 and sock_diag cannot tell those in service from those answered",
                COUNT_FOR.as_millis(),
                COUNT_EVERY.as_secs()
            ),
            (Some((t, w)), true) => format!(
                "{w} ({:.1}s ago)",
                now.saturating_duration_since(*t).as_secs_f64()
            ),
            (Some((t, _)), false) => format!(
                "nothing suspicious for {:.0}s: sock_diag reads the port's connections",
                now.saturating_duration_since(*t).as_secs_f64()
            ),
            (None, _) => "nothing suspicious yet: sock_diag reads the port's connections".into(),
        };
        self.kernel_status.following = Some(Following {
            mode: self.cfg.socket_tracing,
            attached,
            why,
            connections: self.sockets.clone(),
            quiet_read_every_ms: Some(self.quiet_every.as_millis() as u64),
        });
    }

    /// Why there is no kernel view, when there is none.
    pub fn kernel_missing(&self) -> Option<String> {
        self.kernel.is_none().then(|| {
            self.kernel_status
                .reason
                .clone()
                .unwrap_or_else(|| "the kernel view is not loaded".into())
        })
    }

    /// Whether the backend needs a full round every tick: the last verdict was not fine, or
    /// work is in flight without progress since the previous tick (without the kernel view,
    /// an accept queue that was non-empty). A busy server that keeps taking and answering is
    /// watched on `checks.interval`, and `next_look` still wakes the composer when a
    /// connection seen then can cross a threshold.
    pub fn hot(&self) -> bool {
        let bad = matches!(
            self.last_verdict,
            WebVerdict::Slow
                | WebVerdict::Waiting
                | WebVerdict::PartialHang
                | WebVerdict::Erroring
                | WebVerdict::Hung
                | WebVerdict::Unresponsive
                | WebVerdict::Down
        );
        bad || self.suspicious
            || match &self.kernel {
                Some(k) if k.following() => self.progress.stalled(),
                Some(_) => false,
                None => self.queue_busy_since.is_some(),
            }
    }

    /// Takes in a new probe result (the probe runs on its own cadence).
    pub fn record_probe(&mut self, p: ProbeResult, now: Instant) {
        if p.agent_error {
            // The agent's own failure: it knows nothing new about the backend, and what it
            // knew before is no longer current.
            tracing::warn!(
                "the probe could not be made: {} (the agent's own error, not the backend's)",
                p.error.as_deref().unwrap_or("?")
            );
            self.last_probe = None;
            self.probe_failing_since = None;
            self.probe_trouble = Some(p);
            return;
        }
        self.probe_trouble = None;
        if p.status.is_some() {
            self.probes_made += 1;
        }
        if p.ok {
            self.probe_failing_since = None;
            self.probe_passed_at = Some(now);
        } else if self.probe_failing_since.is_none() {
            self.probe_failing_since = Some(now);
        }
        self.last_probe = Some(p);
    }

    /// Takes in Docker's latest report on `web.container`'s network (the runner asks every
    /// `checks.interval`): a restarted container is found in its new namespace.
    pub fn set_container(&mut self, net: Result<ContainerNet, crate::docker::DockerError>) {
        self.container_net = Some(net);
    }

    /// Where the probe task should connect; None until the backend's listener is seen.
    pub fn probe_target(&self) -> SharedProbeTarget {
        self.probe_target.clone()
    }

    /// Finds (or keeps) the target and points the kernel programs at it.
    fn resolve_target(&mut self) -> Result<&Target, Unresolved> {
        let before = self.target.as_ref().map(|t| (t.view.inode, t.port));
        let target = target::resolve(&self.cfg, self.target.take(), self.container_net.as_ref())?;
        self.found_once = true;
        self.missing_since = None;
        let now = (target.view.inode, target.port);
        if before != Some(now) {
            let v = &target.view;
            tracing::info!(
                "watching the web backend on port {} in {} (namespace {}, inode {}{})",
                v.port,
                v.path,
                v.source,
                v.inode,
                v.container
                    .as_ref()
                    .map_or(String::new(), |c| format!(", container {c}"))
            );
            self.owners.clear();
            self.owners_inode = 0;
            if let Some(k) = self.kernel.as_mut() {
                if let Err(e) = k.watch(&[now]) {
                    tracing::warn!(
                        "kernel programs cannot watch port {} in namespace inode {}: {e}",
                        now.1,
                        now.0
                    );
                }
            }
        }
        Ok(self.target.insert(target))
    }

    /// A report without a look at the backend: why there is nothing to look at.
    fn without_target(&mut self, verdict: WebVerdict, detail: String) -> WebReport {
        self.last_verdict = verdict;
        self.next_look = None;
        WebReport {
            verdict,
            detail,
            served: self.served,
            kernel: self.kernel_status.clone(),
            probe: self
                .last_probe
                .clone()
                .or_else(|| self.probe_trouble.clone()),
            ..WebReport::not_configured()
        }
        .with_port(self.cfg.port)
    }

    /// What `web.container` / `web.netns` names does not exist. Not found since the agent
    /// started: a configuration mistake. Found before: being recreated, until GONE_FOR_GOOD.
    /// Either way the agent cannot look, so the verdict is `unknown`, never evidence.
    fn not_found(&mut self, key: &'static str, what: String, now: Instant) -> WebReport {
        let gone = now.saturating_duration_since(*self.missing_since.get_or_insert(now));
        let config_error = if !self.found_once {
            Some(format!(
                "{key}: {what}, not since the agent started: check {key}"
            ))
        } else if gone >= GONE_FOR_GOOD {
            Some(format!(
                "{key}: {what} for {}s (it was found before): check {key}",
                gone.as_secs()
            ))
        } else {
            None
        };
        let detail = match &config_error {
            Some(e) => e.clone(),
            None => format!(
                "{key}: {what} for {:.1}s; it was found before (being recreated?)",
                gone.as_secs_f64()
            ),
        };
        let mut r = self.without_target(WebVerdict::Unknown, detail);
        r.config_error = config_error;
        r
    }

    pub fn evaluate(&mut self, now: Instant) -> WebReport {
        if self.cfg.port == 0 {
            return WebReport::not_configured();
        }
        let target = match self.resolve_target() {
            Ok(t) => t,
            // The agent could not look: never a verdict on the backend.
            Err(Unresolved::Unknown(why)) => return self.without_target(WebVerdict::Unknown, why),
            Err(Unresolved::AgentError(why)) => {
                let mut r = self.without_target(WebVerdict::Unknown, why);
                r.agent_error = true;
                return r;
            }
            Err(Unresolved::NotRunning(why)) => return self.without_target(WebVerdict::Down, why),
            Err(Unresolved::NotFound { key, what }) => return self.not_found(key, what, now),
        };
        let (port, namespace) = (target.port, target.view.clone());
        let listeners = match target.listeners() {
            Ok(l) => l,
            Err(e) => {
                let why = format!(
                    "sock_diag in {} failed: {e} (the agent's own error, not the backend's)",
                    namespace.path
                );
                tracing::warn!("{why}");
                let mut r = self.without_target(WebVerdict::Unknown, why);
                r.agent_error = true;
                return r;
            }
        };
        if let Some((addr, fallback)) = target::probe_addr(&listeners, port) {
            let ns = target.ns.clone();
            let mut shared = self.probe_target.lock().unwrap_or_else(|e| e.into_inner());
            if shared.as_ref().is_none_or(|t| {
                t.addr != addr || t.fallback != fallback || !Arc::ptr_eq(&t.ns, &ns)
            }) {
                *shared = Some(ProbeTarget { addr, fallback, ns });
            }
        }
        self.listen_addrs = ListenAddrs::of(&listeners);
        let listening = !listeners.is_empty();
        let queue: u32 = listeners.iter().map(|l| l.queue).sum();
        let queue_max: u32 = listeners.iter().map(|l| l.max_queue).sum();
        if queue > 0 {
            self.queue_busy_since.get_or_insert(now);
        } else {
            self.queue_busy_since = None;
        }
        if let Some(first) = listeners.first() {
            // One stat per owner per round: a worker that died (and was replaced) is noticed.
            let gone = self
                .owners
                .iter()
                .any(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
            if first.inode != self.owners_inode || self.owners.is_empty() || gone {
                self.scan_owners(first.inode, now);
            }
        } else {
            self.owners.clear();
            self.owners_inode = 0;
            self.owner_name = None;
        }

        // With `socket_tracing = "on_suspicion"`: the port's connections from sock_diag, as
        // this tick's `observe` read them (or read now), which may attach the programs before
        // they are read below.
        let fresh = self.sockets_at.is_some_and(|t| {
            now.saturating_duration_since(t) < self.cfg.eval_interval / 2
                || (self.sockets.is_some() && !self.sockets_due(now))
        });
        if !fresh {
            let seen = self.read_sockets(now);
            if let Some(mut seen) = seen {
                if !self.kernel.as_ref().is_some_and(KernelView::following) {
                    seen.answered |= self.segments_sent();
                    // Gone: served and closed between two reads (see `observe`).
                    seen.answered |= seen.gone && self.tier != KernelTier::SockDiag;
                    self.progress
                        .observe_moves(seen, now, self.cfg.latency_window);
                }
            }
        }
        let suspicion = self.suspicion();
        self.steer_following(suspicion, now);
        let following = self.kernel.as_ref().is_some_and(KernelView::following);
        let sample = self
            .kernel
            .as_ref()
            .filter(|_| following)
            .map(KernelView::sample);
        let counters = sample
            .as_ref()
            .and_then(|s| s.ports.iter().find(|p| p.port == port).cloned())
            .map(|p| self.kernel_counters(&p, sample.as_ref(), &listeners, now));
        let mut kernel = counters.as_ref().map(|c| KernelEvidence {
            oldest_waiting: c.oldest_waiting_ms.map(Duration::from_millis),
            since_claim: [c.ms_since_last_accept, c.ms_since_last_claim]
                .into_iter()
                .flatten()
                .min()
                .map(Duration::from_millis),
            since_answer: c.ms_since_last_answer.map(Duration::from_millis),
            longest_quiet: Duration::from_millis(c.longest_quiet_ms),
            pending: c.pending,
            oldest_pending: c.oldest_pending_ms.map(Duration::from_millis),
            latency: c.latency.clone(),
            answered: c.answered,
        });
        if let Some(v) = &self.sockets {
            kernel = Some(self.with_sockets(kernel, v, now));
        }
        // Attaching failed: sock_diag alone misses connections that opened and closed between
        // two reads, so it is not kernel evidence of progress (the probe and the accept queue
        // decide, as without eBPF).
        if self.follow_failed && !following {
            kernel = None;
        }
        self.observe_answers(port, listening, now);
        self.track_span(now);
        let mut evidence = Evidence {
            answers: Some(self.answers.basis()),
            erroring: self.answers.erroring(),
            listening,
            queue,
            queue_busy_for: self
                .queue_busy_since
                .map(|s| now.saturating_duration_since(s)),
            kernel,
            probe: self.last_probe.clone(),
            probe_failing_for: self
                .probe_failing_since
                .map(|s| now.saturating_duration_since(s)),
            ..Evidence::default()
        };
        let processes = self.look_at_processes(&mut evidence, now);
        let (verdict, mut detail) = verdict::decide(&evidence, &self.cfg);
        let stuck_worker = (verdict == WebVerdict::PartialHang)
            .then(|| verdict::stuck_process(&evidence, &self.cfg))
            .flatten();
        if let Some(err) = self.probe_trouble.as_ref().and_then(|p| p.error.as_deref()) {
            detail.push_str(&format!(
                "; the agent could not probe ({err}: its own error, not the backend's)"
            ));
        }
        if !listening && namespace.source == "own" {
            detail.push_str(
                " in the agent's network namespace (a container: set web.container; another \
                 namespace: web.netns)",
            );
        } else if !listening {
            detail.push_str(&format!(" in {}", namespace.path));
        }
        self.last_verdict = verdict;
        self.next_look = verdict::next_look(&evidence, &self.cfg, now);
        self.steer_accept_tracing(evidence.kernel.as_ref().and_then(|k| k.oldest_waiting), now);
        // Ready once it has served: the probe (a readiness path) got an answer that is not a
        // server error. Without a probe nothing would ever ask it while the balancer holds
        // traffic back, so a listener is all the readiness there is to see.
        // While the agent cannot make the probe (its own error), answers the kernel saw go
        // out are the readiness there is: the agent's trouble must not keep it "never served".
        self.served |= if self.cfg.probe_path.is_empty() {
            listening
        } else {
            self.last_probe
                .as_ref()
                .is_some_and(|p| p.status.is_some_and(|s| s < 500))
                || (self.probe_trouble.is_some()
                    && evidence.kernel.as_ref().is_some_and(|k| k.answered > 0))
        };
        // Nothing but the agent's own trouble to go on: say so, so the policy never reads it
        // as the backend's failure.
        let agent_error = verdict == WebVerdict::Unknown && self.probe_trouble.is_some();
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
        // A 4xx proves the server answers; the path is what is wrong.
        let config_error = self.last_probe.as_ref().and_then(|p| {
            let status = p.status.filter(|s| (400..500).contains(s))?;
            Some(format!(
                "web.probe_path = {:?} answered {status} at {}: the backend answers, but not on \
                 this path; set web.probe_path to a route that answers 200 (\"\" watches the \
                 listener only)",
                self.cfg.probe_path, p.target
            ))
        });
        WebReport {
            config_error,
            answers: Some(self.answers.report(&self.cfg)),
            figures: self.figures(now),
            port: self.cfg.port,
            namespace: Some(namespace),
            verdict,
            detail,
            served: self.served,
            listening,
            pids: self.owners.clone(),
            process: self.owner_name.clone(),
            accept_queue: queue,
            accept_queue_max: queue_max,
            listen_overflows: overflows,
            listen_drops: dropped,
            kernel: self.kernel_status.clone(),
            disagreement: verdict::disagreement(verdict, &evidence),
            counters,
            probe: self
                .last_probe
                .clone()
                .or_else(|| self.probe_trouble.clone()),
            dependencies: std::mem::take(&mut evidence.dependencies),
            processes,
            stuck_worker,
            agent_error,
        }
    }

    /// Reads what the port answered this round (one small map read). A restart (no listener,
    /// or a wholly new set of processes holding it) starts the window over.
    fn observe_answers(&mut self, port: u16, listening: bool, now: Instant) {
        self.steer_answers(now);
        let replaced = !self.answers_pids.is_empty()
            && !self.owners.is_empty()
            && !self.owners.iter().any(|p| self.answers_pids.contains(p));
        if !listening || replaced {
            self.answers.restart(now);
            self.figures.restart();
        }
        if !self.owners.is_empty() || !listening {
            self.answers_pids.clone_from(&self.owners);
        }
        let counters = match &self.kernel {
            Some(_) if self.answers_attach_failed.is_some() => {
                Err(self.answers_attach_failed.clone().unwrap_or_default())
            }
            Some(k) => k.answer_counters(port).map_err(|e| e.to_string()),
            None => Err(self
                .kernel_status
                .reason
                .clone()
                .unwrap_or_else(|| "the kernel view is not running".into())),
        };
        let probe_status = self.last_probe.as_ref().and_then(|p| p.status);
        self.answers.observe(counters, probe_status, now, &self.cfg);
    }

    /// With `socket_tracing = "on_suspicion"` in the full tier: attaches the answer programs
    /// for their sampling windows, while the connection programs are attached, and while the
    /// answers fail; detaches them otherwise. The window starts over at each attach: counters
    /// that stood still while detached are no evidence of an idle backend.
    fn steer_answers(&mut self, now: Instant) {
        if self.cfg.socket_tracing != SocketTracing::OnSuspicion
            || self.tier != KernelTier::Full
            || self.answers_attach_failed.is_some()
        {
            return;
        }
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        if k.answers_unavailable().is_some() {
            return;
        }
        let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
        // They attach with the connection programs (a counting window every COUNT_EVERY, or
        // a suspicion): a box that answers only 5xx is seen within COUNT_EVERY. Due, their
        // longer sampling window opens with a counting window too (both at once cost less
        // than each on its own clock); they stay while the answers fail.
        let due = since(self.answers_sampled_at).is_none_or(|d| d >= ANSWERS_EVERY)
            && (k.following() || self.follow_failed);
        let sampling = since(self.answers_sampled_at).is_some_and(|d| d < ANSWERS_FOR);
        let want = due || sampling || k.following() || self.answers.failing();
        if want == k.answers_attached() {
            return;
        }
        if want && due {
            self.answers_sampled_at = Some(now);
        }
        match k.attach_answers(want) {
            Ok(()) if want => {
                self.answers_attaches += 1;
                self.answers.restart(now);
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!("the answer programs: {e}; the answers' status is not sampled");
                self.answers_attach_failed = Some(e.to_string());
            }
        }
    }

    /// A peer's errors fault waits on this instance's word about its answers
    /// (`?fresh=answers`): with `"on_suspicion"` they are sampled only in windows, so the next
    /// tick opens a counting window with an answers sampling window, unless one opened within
    /// ANSWERS_ON_ASK (a peer asks four times a second while it waits).
    pub fn sample_answers_soon(&mut self, now: Instant) {
        if self.cfg.socket_tracing != SocketTracing::OnSuspicion {
            return;
        }
        let recent = |t: Option<Instant>| {
            t.is_some_and(|t| now.saturating_duration_since(t) < ANSWERS_ON_ASK)
        };
        if recent(self.answers_sampled_at) || self.counting_since.is_some() {
            return;
        }
        self.counted_at = None;
        self.answers_sampled_at = None;
    }

    /// The cumulative readings a span is measured from: the port's counters and latency
    /// histogram, the answer programs' counters while they are attached, the probes made.
    fn mark(&self, now: Instant) -> Option<Mark> {
        let (k, port) = (self.kernel.as_ref()?, self.target.as_ref()?.port);
        let (c, latency) = k.port_totals(port);
        let answers = k
            .answers_attached()
            .then(|| k.answer_counters(port).ok())
            .flatten()
            .map(|a| (a, self.answers_attaches));
        Some(Mark {
            at: now,
            requests: c.arrivals(),
            latency,
            answers,
            probes: self.probes_made,
        })
    }

    /// Cuts the figures' spans while the connection programs are attached: every
    /// FIGURES_EVERY (all the time with `"always"`; through a long suspicion with
    /// `"on_suspicion"`), and at the detach (their counts start from zero when they attach and
    /// stand still once detached, so a counting window is one span).
    fn track_span(&mut self, now: Instant) {
        if self.tier != KernelTier::Full {
            return;
        }
        let attached = self.kernel.as_ref().is_some_and(KernelView::following);
        let cut = match &self.span_from {
            None => {
                if attached {
                    self.span_from = self.mark(now);
                }
                return;
            }
            Some(from) => !attached || now.saturating_duration_since(from.at) >= FIGURES_EVERY,
        };
        if !cut {
            return;
        }
        let Some(end) = self.mark(now) else {
            self.span_from = None;
            return;
        };
        let probe_class = self
            .last_probe
            .as_ref()
            .and_then(|p| p.status)
            .map_or(2, |s| usize::from(s / 100));
        if let Some(span) = self
            .span_from
            .as_ref()
            .and_then(|f| f.span_to(&end, probe_class))
        {
            self.figures.record(now, span, self.cfg.latency_window);
        }
        self.span_from = attached.then_some(end);
    }

    /// The figures over `web.latency_window` (None below the `full` tier: no programs count
    /// requests there).
    fn figures(&self, now: Instant) -> Option<FiguresReport> {
        (self.tier == KernelTier::Full && self.kernel.is_some()).then(|| {
            self.figures.report(
                now,
                self.cfg.latency_window,
                self.cfg.socket_tracing == SocketTracing::Always,
            )
        })
    }

    /// The answers' evidence for the peers and for judging a restart: since when the window
    /// runs, and when it last showed real answers mostly fine.
    pub fn answers_window(&self) -> &AnswerWindow {
        &self.answers
    }

    /// When the backend last answered: the kernel view's last response byte on the port, or
    /// the last probe that passed, whichever is later. What the peers weigh against a fault of
    /// theirs (see `fleet::Evidence`).
    pub fn answered_at(&self) -> Option<Instant> {
        self.progress.answer_at().max(self.probe_passed_at)
    }

    /// The programs' evidence merged with the port's connections as sock_diag shows them: the
    /// programs see nothing while they are detached, and of a connection opened before they
    /// attached only its exchanges from its next socket call on (not its handshake, claim or a
    /// request it had read); sock_diag sees every open one but none that closed. Ages take the
    /// older of the two, counts the larger, the last answer the more recent.
    fn with_sockets(
        &self,
        kernel: Option<KernelEvidence>,
        v: &SocketView,
        now: Instant,
    ) -> KernelEvidence {
        let max = |a: Option<Duration>, b: Option<Duration>| a.max(b);
        // Without the programs' counters (detached, or a tier without them), what sock_diag
        // saw move between reads: answers sent, connections taken up (and, in the sock_diag
        // tier, segments the answer programs counted).
        let k = kernel.unwrap_or_else(|| KernelEvidence {
            longest_quiet: self.progress.longest_quiet(),
            since_answer: self.progress.since_answer(now),
            since_claim: self.progress.since_taken(now),
            ..KernelEvidence::default()
        });
        KernelEvidence {
            oldest_waiting: max(k.oldest_waiting, v.oldest_waiting()),
            since_answer: [k.since_answer, v.since_sent].into_iter().flatten().min(),
            pending: k.pending.max(v.pending),
            oldest_pending: max(k.oldest_pending, v.oldest_pending),
            ..k
        }
    }

    /// A pre-fork master's workers come and go: adds the children of the processes holding the
    /// listener that hold it too. One read of /proc/*/stat, and the fds of those children
    /// only, far cheaper than `socket_owners`' look at every process's fds.
    fn add_new_workers(&mut self, now: Instant) {
        self.owners_scanned = Some(now);
        let listener = self.owners_inode;
        let new: Vec<u32> = process::children_of(&self.owners)
            .into_iter()
            .filter(|c| !self.owners.contains(c) && net::socket_inodes(*c).contains(&listener))
            .collect();
        if !new.is_empty() {
            self.owners.extend(new);
            self.owners.sort_unstable();
        }
    }

    fn scan_owners(&mut self, inode: u64, now: Instant) {
        self.owners = net::socket_owners(inode);
        self.owners_inode = inode;
        self.owners_scanned = Some(now);
        self.owner_name = self.owners.first().and_then(|&p| net::process_name(p));
        let owners = &self.owners;
        self.worker_cpu.retain(|p, _| owners.contains(p));
    }

    /// While the backend's work is stuck, looks at its processes: stopped or frozen, CPU,
    /// outbound requests waiting for an answer. A healthy server costs none of these reads.
    fn look_at_processes(&mut self, e: &mut Evidence, now: Instant) -> Option<ProcessView> {
        let stuck = e
            .kernel
            .as_ref()
            .and_then(|k| {
                let queued = k.oldest_waiting.filter(|_| e.queue > 0);
                [queued, k.oldest_pending].into_iter().flatten().max()
            })
            .or(e.queue_busy_for.filter(|_| e.queue > 0))
            .is_some_and(|d| d >= LOOK_AFTER)
            || e.probe.as_ref().is_some_and(|p| p.timed_out);
        // A worker that accepted connections and stopped before reading them leaves them
        // waiting with the accept queue empty: worth a look at the workers, nothing more.
        let held = e
            .kernel
            .as_ref()
            .and_then(|k| k.oldest_waiting)
            .is_some_and(|d| d >= LOOK_AFTER);
        if !(stuck || held) || self.owners.is_empty() {
            self.cpu.clear();
            self.worker_cpu.clear();
            self.held_found_nothing = None;
            return None;
        }
        // Held connections only, and the last look found nobody holding a request: the
        // processes' state and CPU (one small read each) still, the connections not yet.
        let look_at_connections = stuck
            || self
                .held_found_nothing
                .is_none_or(|t| now.saturating_duration_since(t) >= HELD_LOOK_EVERY);
        if self.owners.len() > 1
            && self
                .owners_scanned
                .is_none_or(|t| now.saturating_duration_since(t) >= OWNERS_FRESH)
        {
            self.add_new_workers(now);
        }
        if let Some(p) = process::look_at(&self.owners) {
            if stuck {
                e.frozen = p.frozen;
            }
            self.cpu.observe(now, p.cpu_ticks);
        }
        e.cpu_percent = self.cpu.percent();
        // Requests sent long before the server last moved (an idle LISTEN, a long poll) are
        // not what it waits on now.
        let since_progress = e
            .kernel
            .as_ref()
            .and_then(|k| [k.since_claim, k.since_answer].into_iter().flatten().min());
        let sent_within = since_progress.map(|d| d + SENT_BEFORE_STALL);
        let mut error = None;
        let web_port = self.target.as_ref().map_or(self.cfg.port, |t| t.port);
        let workers = self.owners.len() > 1 && look_at_connections;
        if !(stuck || workers) {
            return Some(ProcessView {
                frozen: e.frozen.clone(),
                cpu_percent: e.cpu_percent,
                error,
            });
        }
        let conns = match self.target.as_ref().map(Target::connections) {
            Some(Ok(conns)) => conns,
            Some(Err(err)) => {
                error = Some(format!("reading the server's connections failed: {err}"));
                Vec::new()
            }
            None => Vec::new(),
        };
        if stuck {
            e.dependencies = process::dependency_waits(&self.owners, &conns, web_port, sent_within);
        }
        if workers && error.is_none() {
            e.workers = self.look_at_workers(&conns, web_port, now);
        }
        // Only held connections brought this look (it was due): when it found nobody
        // holding a request, the next waits HELD_LOOK_EVERY.
        self.held_found_nothing = (!stuck && e.workers.is_empty()).then_some(now);
        Some(ProcessView {
            frozen: e.frozen.clone(),
            cpu_percent: e.cpu_percent,
            error,
        })
    }

    /// Each process holding the listener, when there are several (a pre-fork server): which of
    /// them hold requests nobody answers, whether they can run, their CPU, their own outbound
    /// requests, and whether their parent (a master) holds the listener too.
    fn look_at_workers(
        &mut self,
        conns: &[net::TcpConn],
        web_port: u16,
        now: Instant,
    ) -> Vec<WorkerView> {
        let stats: Vec<(u32, process::Stat)> = self
            .owners
            .iter()
            .filter_map(|&p| process::stat(p).map(|s| (p, s)))
            .collect();
        let mut out = Vec::new();
        for &(pid, st) in &stats {
            let meter = self.worker_cpu.entry(pid).or_default();
            meter.observe(now, st.ticks);
            let cpu_percent = meter.percent();
            let inodes: HashSet<u64> = net::socket_inodes(pid).into_iter().collect();
            let (unanswered, oldest, last_sent) =
                process::web_connections(&inodes, conns, web_port);
            let Some(oldest) = oldest.filter(|_| unanswered > 0) else {
                continue;
            };
            let parent_holds_listener = self.owners.contains(&st.parent);
            let parent_unable = parent_holds_listener
                .then(|| match process::stat(st.parent) {
                    Some(ps) => process::frozen_why(st.parent, ps.state).map(str::to_string),
                    None => Some("gone".into()),
                })
                .flatten();
            let outbound_waiting = process::dependency_waits(&[pid], conns, web_port, None)
                .iter()
                .map(|w| w.connections)
                .sum();
            out.push(WorkerView {
                pid,
                command: process::command(pid).unwrap_or_else(|| "?".into()),
                parent: st.parent,
                parent_holds_listener,
                parent_unable,
                is_master: stats.iter().any(|(_, s)| s.parent == pid),
                frozen: process::frozen_why(pid, st.state).map(str::to_string),
                unanswered,
                oldest_unanswered_ms: oldest,
                last_sent_ms: last_sent,
                cpu_percent,
                outbound_waiting,
                start: st.start,
                listener: self.owners_inode,
            });
        }
        out
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
        let latency = self.latency.push(now, p.latency, self.cfg.latency_window);
        let ms = |d: Duration| d.as_millis() as u64;
        KernelCounters {
            established: c.established,
            accepted,
            claimed: c.claimed,
            requests: c.requests,
            answered: c.answered,
            closed_unanswered: c.closed_unanswered,
            closed_unaccepted: c.closed_unclaimed,
            sent: c.sent,
            received: c.received,
            exchanges_in: c.exchanges_in,
            exchanges_out: c.exchanges_out,
            exchanges_dropped: c.exchanges_dropped,
            in_service: c.in_service(),
            waiting: p.waiting,
            oldest_waiting_ms: p.oldest_waiting.map(ms),
            pending: p.pending,
            oldest_pending_ms: p.oldest_pending.map(ms),
            ms_since_last_accept: last_ns.map(|l| now_ns.saturating_sub(l) / 1_000_000),
            ms_since_last_claim: (c.last_claim_ns != 0)
                .then(|| now_ns.saturating_sub(c.last_claim_ns) / 1_000_000),
            ms_since_last_answer: self.progress.since_answer(now).map(ms),
            longest_quiet_ms: ms(self.progress.longest_quiet()),
            accepts_traced: self
                .kernel
                .as_ref()
                .is_some_and(KernelView::accepts_watched),
            latency,
            map_errors: sample.map(|s| s.map_errors).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(agent_error: bool) -> ProbeResult {
        ProbeResult {
            ok: false,
            status: None,
            latency_ms: 0.1,
            error: Some(if agent_error {
                "Too many open files (os error 24)".into()
            } else {
                "connection reset by peer".into()
            }),
            timed_out: false,
            refused: false,
            agent_error,
            target: "127.0.0.1:1".into(),
        }
    }

    #[test]
    fn the_agents_own_probe_errors_are_never_a_verdict_on_the_backend() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cfg = WebConfig {
            port: listener.local_addr().unwrap().port(),
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        assert_eq!(status.state, KernelState::Disabled);
        let mut m = WebMonitor::new(cfg, kernel, status);
        let t0 = Instant::now();
        // A real failure starts the clock; then the agent runs out of descriptors for a minute.
        m.record_probe(failed(false), t0);
        for s in 1..=60 {
            m.record_probe(failed(true), t0 + Duration::from_secs(s));
        }
        let r = m.evaluate(t0 + Duration::from_secs(60));
        assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
        assert!(r.detail.contains("its own error"), "{}", r.detail);
        assert!(r.agent_error, "the report says the agent could not look");
        assert!(!r.served);
        // Never served, yet no 503 for it: not while booting, not after the grace.
        for in_boot_grace in [true, false] {
            let d = crate::policy::evaluate(&crate::policy::PolicyInput {
                web: r.verdict,
                web_detail: r.detail.clone(),
                web_agent_error: r.agent_error,
                web_served: r.served,
                in_boot_grace,
                ..crate::policy::PolicyInput::default()
            });
            assert_eq!(d.http, 200, "boot grace {in_boot_grace}: {d:?}");
        }
        assert!(r.probe.is_some_and(|p| p.agent_error));
        // The backend's own failures still count once the agent can probe again.
        let t1 = t0 + Duration::from_secs(61);
        m.record_probe(failed(false), t1);
        let r = m.evaluate(t1 + Duration::from_secs(11));
        assert_eq!(r.verdict, WebVerdict::Unresponsive, "{}", r.detail);
    }

    #[test]
    fn a_probe_answered_4xx_is_a_wrong_path_not_a_reason_to_follow_every_connection() {
        let cfg = WebConfig {
            port: 9000,
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        let mut m = WebMonitor::new(cfg, kernel, status);
        let t0 = Instant::now();
        let answered = |status| ProbeResult {
            ok: false,
            status: Some(status),
            error: None,
            ..failed(false)
        };
        m.record_probe(answered(404), t0);
        assert_eq!(
            m.suspicion(),
            None,
            "the server answers: only the path is wrong"
        );
        m.record_probe(answered(503), t0 + Duration::from_secs(1));
        assert_eq!(m.suspicion().as_deref(), Some("the probe fails"));
        m.record_probe(failed(false), t0 + Duration::from_secs(2));
        assert_eq!(m.suspicion().as_deref(), Some("the probe fails"));
    }

    #[test]
    fn a_container_never_found_is_a_config_error_one_found_before_is_being_recreated() {
        let cfg = WebConfig {
            port: 9000,
            container: "wbe".into(),
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        let mut m = WebMonitor::new(cfg, kernel, status);
        let t0 = Instant::now();
        let missing = || Err(crate::docker::DockerError::NoSuchContainer("wbe".into()));
        m.set_container(missing());
        let r = m.evaluate(t0);
        assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
        let e = r.config_error.expect("never found: a config error");
        assert!(e.contains("web.container") && e.contains("wbe"), "{e}");

        // Found once (a host-network container: the agent's own namespace), then gone.
        m.set_container(Ok(ContainerNet {
            pid: Some(std::process::id()),
            host_network: true,
            published: Vec::new(),
        }));
        assert_eq!(m.evaluate(t0).config_error, None);
        m.set_container(missing());
        let r = m.evaluate(t0 + Duration::from_secs(1));
        assert_eq!(r.verdict, WebVerdict::Unknown, "{}", r.detail);
        assert_eq!(r.config_error, None, "being recreated: {}", r.detail);
        assert!(r.detail.contains("found before"), "{}", r.detail);
        let r = m.evaluate(t0 + Duration::from_secs(1) + GONE_FOR_GOOD);
        assert!(r.config_error.is_some(), "gone for good: {}", r.detail);
    }
}
