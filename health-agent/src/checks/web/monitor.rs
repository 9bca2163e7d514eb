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
    answers::{AnswerWindow, AnswersReport, Round},
    cadence::{Cadence, COUNT_EVERY, COUNT_FOR, COUNT_LONGEST, WINDOW_ANSWERS},
    figures::{Figures, FiguresReport, Mark},
    latency::LatencyWindow,
    probed::Probed,
    process::{self, CpuMeter, WorkerView},
    progress::{Moves, Progress},
    reader::PortReader,
    sockets::SocketView,
    tally::{Tally, CLASSES as ANSWER_CLASSES},
    target::{self, Target, Unresolved},
    verdict::{self, Evidence, KernelEvidence},
    AnswerSigns, Following, KernelCounters, KernelState, KernelStatus, ProcessView, WebReport,
};
use crate::{
    checks::probe::{ProbeLedger, ProbeResult, ProbeTarget, SharedProbeTarget},
    config::{AcceptTracing, KernelTier, SocketTracing, WebConfig},
    ebpf::{KernelSample, KernelView, PortSample},
    engine::ContainerNet,
    net,
    status::WebVerdict,
};

mod evaluate;
mod evidence;
mod load;
mod look;
mod port;
mod steer;

pub use load::load_kernel;
pub use port::TickSample;

pub struct WebMonitor {
    cfg: WebConfig,
    /// Where the backend listens, once known.
    target: Option<Target>,
    /// The container engine's latest report on `web.container`'s network.
    container_net: Option<Result<ContainerNet, crate::engine::EngineError>>,
    /// Where the probe task connects: set from the listeners seen.
    probe_target: SharedProbeTarget,
    /// What the agent's own probes put on the port: left out of what sock_diag shows.
    probes: ProbeLedger,
    /// Every read of the port's connections (sock_diag): the monitor's own and the drain's.
    reader: PortReader,
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
    /// When each process holding the listener (pid, start) was first seen stopped or frozen.
    frozen_since: HashMap<(u32, u64), Instant>,
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
    /// What the probe found lately.
    probed: Probed,
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
    /// The latest evaluation that found something suspicious, and what.
    last_suspicion: Option<(Instant, String)>,
    /// Attaching the following programs failed once: do not retry (and warn) every tick.
    follow_failed: bool,
    /// Why the connection programs stay attached whatever the suspicion (a drain counting
    /// arrivals); None: the suspicion decides.
    held: Option<&'static str>,
    /// The latest read found something suspicious: evaluate every tick.
    suspicious: bool,
    /// `socket_tracing = "on_suspicion"`: when the programs count (counting windows, answer
    /// sampling windows).
    cadence: Cadence,
    /// This tick detached the programs after reading their counters (`last_counters`): its
    /// load sample is still a counted one.
    counted_detaching: bool,
    /// This tick's `observe` read the port's connections: a sampled load sample is fresh.
    read_now: bool,
    /// Request rate, answers by class and latency over `web.latency_window`, from the spans
    /// the programs counted.
    figures: Figures,
    /// The answers counter `/metrics` exports.
    tally: Tally,
    /// Attaches of the answer programs so far (see `Mark`).
    answers_attaches: u64,
    /// What the backend answered over `web.errors_window`, by status class.
    answers: AnswerWindow,
    /// The kernel view's tier (`web.kernel_tier`, or what the kernel offers).
    tier: KernelTier,
    /// In the `sock_diag` tier: the segments-sent count at the previous tick.
    segments: Option<u64>,
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

impl WebMonitor {
    /// A monitor on `kernel` (loaded by `load_kernel`, or None: probe, accept queue and /proc
    /// only), whose reports carry `kernel_status`; `probes` is the probe task's ledger.
    pub fn new(
        cfg: WebConfig,
        mut kernel: Option<KernelView>,
        kernel_status: KernelStatus,
        probes: ProbeLedger,
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
            probes,
            reader: PortReader::default(),
            kernel,
            kernel_status,
            owners: Vec::new(),
            owners_inode: 0,
            owners_scanned: None,
            worker_cpu: HashMap::new(),
            frozen_since: HashMap::new(),
            held_found_nothing: None,
            accept_fds: HashMap::new(),
            latency: LatencyWindow::default(),
            progress: Progress::default(),
            cpu: CpuMeter::default(),
            served: false,
            queue_busy_since: None,
            probed: Probed::default(),
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
            last_suspicion: None,
            follow_failed: false,
            held: None,
            suspicious: false,
            cadence: Cadence::default(),
            counted_detaching: false,
            read_now: false,
            figures: Figures::default(),
            tally: Tally::default(),
            answers_attaches: 0,
            answers: AnswerWindow::default(),
            answers_pids: Vec::new(),
            tier,
            segments: None,
            answers_attach_failed: None,
        }
    }

    /// When the composer should evaluate again, ahead of its next tick: the instant a
    /// waiting or pending connection could cross its threshold (None once it has passed).
    pub fn next_look(&self, now: Instant) -> Option<Instant> {
        self.next_look.filter(|&t| t > now)
    }

    /// Every tick: what the tick saw of the port, for whoever else reads it (the drain, the
    /// saturation meter, the peers' view of this instance), handed over once.
    pub fn observe(&mut self, now: Instant) -> TickSample {
        self.watch(now);
        TickSample {
            port: self.reader.take_for_others(),
            kernel_arrivals: self.kernel_arrivals(),
            probes_started: self.probes.started(),
            answered_at: self.answered_at(),
            load: self.load_sample(),
        }
    }

    /// Reads the kernel counters (one map read) and notes what moved since the previous tick.
    /// Runs on every tick, so the time of the last answer is known to within one tick.
    fn watch(&mut self, now: Instant) {
        // With `socket_tracing = "on_suspicion"`, or below the `full` tier, the port's
        // connections (one sock_diag dump filtered by port): what moved on them, and whether
        // anything is suspicious. While others want the port read, that read comes first and
        // serves this one when it can.
        let shared = self.read_port_for_tick();
        let seen = if self.sockets_due(now) {
            self.read_sockets(now, shared)
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
    fn load_sample(&self) -> Option<crate::saturation::LoadSample> {
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
            let v = self.reader.view()?;
            return Some(crate::saturation::LoadSample {
                pending: u64::from(v.pending),
                waiting: u64::from(v.unaccepted),
                backend_cpu_seconds: process::cpu_seconds(&self.owners),
                sampled: true,
                // A connection the server had taken that is gone was served and closed (one
                // request per connection lives between two reads): progress too.
                moved: self.reader.last_moves().answered || self.reader.last_moves().gone,
                unsure: self.reader.last_moves().unsure,
                ..Default::default()
            });
        }
        let c = self.last_counters.as_ref()?;
        // Per request, not per connection: the later requests of a keep-alive connection —
        // all a load balancer's traffic — show in none of the per-connection counters.
        Some(crate::saturation::LoadSample {
            established: c.arrivals(),
            answered: c.exchanges_out,
            exchange_us: c.exchange_us,
            pending: c.in_service(),
            waiting: c.waiting(),
            backend_cpu_seconds: process::cpu_seconds(&self.owners),
            sampled: false,
            moved: false,
            unsure: false,
        })
    }

    /// Keeps the connection programs attached while `why` is Some (`on_suspicion`, full
    /// tier), so every new connection and request is counted.
    pub fn hold_following(&mut self, why: Option<&'static str>) {
        self.held = why;
    }

    /// Arrivals the kernel counted (every connection and keep-alive request, the agent's probes
    /// included) while the connection programs are attached; None while they are not. The
    /// count restarts at each attach.
    fn kernel_arrivals(&self) -> Option<u64> {
        self.kernel.as_ref().filter(|k| k.following())?;
        self.last_counters.as_ref().map(|c| c.arrivals())
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
        if self.probed.record(p, now) {
            // The backend answered it: an answer went out, whatever sock_diag saw of it.
            self.progress.answered(now);
        }
    }

    /// Takes in Docker's latest report on `web.container`'s network (the runner asks every
    /// `checks.interval`): a restarted container is found in its new namespace.
    pub fn set_container(&mut self, net: Result<ContainerNet, crate::engine::EngineError>) {
        self.container_net = Some(net);
    }

    /// Where the probe task should connect; None until the backend's listener is seen.
    pub fn probe_target(&self) -> SharedProbeTarget {
        self.probe_target.clone()
    }

    /// When the backend last answered: the kernel view's last response byte on the port, or
    /// the last probe that passed, whichever is later. What the peers weigh against a fault of
    /// theirs (see `fleet::Evidence`).
    fn answered_at(&self) -> Option<Instant> {
        self.progress.answer_at().max(self.probed.passed_at())
    }

    /// The round's [`AnswerSigns`], for the report.
    fn signs(&self) -> AnswerSigns {
        let a = &self.answers;
        let enough = a.stats().answers > 0 && a.erroring() && a.judged();
        AnswerSigns {
            answered_at: self.answered_at(),
            fine_at: a.fine_at(),
            erroring_since: enough.then(|| a.since()).flatten(),
            answered_by_class: a.answered_by_class(),
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
            ..ProbeResult::default()
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
        let mut m = WebMonitor::new(cfg, kernel, status, ProbeLedger::default());
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
        let mut m = WebMonitor::new(cfg, kernel, status, ProbeLedger::default());
        let t0 = Instant::now();
        let answered = |status| ProbeResult {
            ok: false,
            status: Some(status),
            error: None,
            misconfigured: (status < 500).then(|| format!("answered {status}")),
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
        let mut m = WebMonitor::new(cfg, kernel, status, ProbeLedger::default());
        let t0 = Instant::now();
        let missing = || {
            Err(crate::engine::EngineError::NoSuchContainer {
                engine: "Docker".into(),
                name: "wbe".into(),
            })
        };
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
