//! Watching the backend's port, and only watching: the kernel programs (loaded in a tier,
//! steered on and off), every sock_diag read of the port's connections, the counting and answer
//! windows, and what they add up to. Each tick hands a `TickSample` to those that read the port
//! between rounds (the drain, the saturation meter, the peers' view of this instance); each
//! round hands one `PortSample` to the judge (`WebMonitor`), which reads no map and none of the port's connections itself.
//!
//! What the watching needs of the judge — where the backend is, which processes hold it, what
//! the probe and the last verdict said — comes in as a `Sight` at each call, and nothing flows
//! back but the samples.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use health_common::{AcceptKey, PortCounters};

use super::{
    answers::{AnswerWindow, AnswersReport, Stats},
    cadence::Cadence,
    figures::{Figures, FiguresReport},
    latency::LatencyWindow,
    process,
    progress::{Moves, Progress},
    reader::{PortReader, PortSocket},
    sockets::SocketView,
    tally::{Tally, TallyReport},
    target::Target,
    verdict::KernelEvidence,
    AnswerSigns, KernelCounters, KernelStatus,
};
use crate::{
    checks::probe::ProbeLedger,
    config::{KernelTier, WebConfig},
    ebpf::KernelView,
    status::WebVerdict,
};

mod evidence;
mod load;
mod read;
mod steer;

pub use load::load_kernel;

/// What the judge tells the watching at each call: where the backend is, which processes hold
/// its listener, its last verdict and what the probe found.
#[derive(Clone)]
pub struct Sight {
    pub target: Option<Arc<Target>>,
    pub owners: Vec<u32>,
    pub verdict: WebVerdict,
    pub probe: ProbeSight,
}

impl Default for Sight {
    /// Nothing found yet.
    fn default() -> Self {
        Self {
            target: None,
            owners: Vec::new(),
            verdict: WebVerdict::Unknown,
            probe: ProbeSight::default(),
        }
    }
}

/// What the watching needs of the probe's results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeSight {
    /// Its failing clock runs (a probe set up wrong runs none).
    pub failing: bool,
    /// The status the latest answer had.
    pub status: Option<u16>,
    /// The status class of the latest answer (2 before any): the probe path's answers come off
    /// it in the figures.
    pub class: usize,
    /// Probes the backend answered so far.
    pub answered: u64,
    /// When the backend last answered a probe, whatever the status: an answer went out.
    pub answered_at: Option<Instant>,
    /// When a probe last passed.
    pub passed_at: Option<Instant>,
}

/// What the others ask of a tick's watching.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asks {
    /// Read the port's connections for them this tick (`TickSample::port`): a drain watches.
    pub port_reads: bool,
    /// Keep the connection programs attached (`on_suspicion`, full tier), so every new
    /// connection and request is counted, and why: a drain counting arrivals, the peers
    /// measuring latency. None: the suspicion decides.
    pub hold: Option<&'static str>,
    /// A peer waits on this instance's word about its answers (`?fresh=answers`): sample them
    /// soon (see `sample_answers_soon`).
    pub answers_soon: bool,
}

/// What one tick saw of the port, for the others that read it: the drain (the read, the
/// kernel's count of arrivals, the probes), the saturation meter (the load), the peers' view of
/// this instance (the last answer).
#[derive(Debug)]
pub struct TickSample {
    /// The port's connections, read this tick while others want them (`Asks::port_reads`).
    pub port: Option<std::io::Result<super::PortRead>>,
    /// Arrivals the kernel counted (every connection and keep-alive request, the agent's probes
    /// included) while the connection programs are attached; None while they are not. The
    /// count restarts at each attach.
    pub kernel_arrivals: Option<u64>,
    /// The agent's probes begun so far (the probe's ledger).
    pub probes_started: u64,
    /// When the backend last answered: the last answer seen on the port, or the last probe
    /// that passed, whichever is later.
    pub answered_at: Option<Instant>,
    /// What the saturation meter takes from this tick; None without the kernel view, before
    /// the backend is found, or on a tick between two reads of the port while detached.
    pub load: Option<crate::saturation::LoadSample>,
}

/// What one round saw of the port: all the judge reads of it.
#[derive(Debug, Clone)]
pub struct PortSample {
    /// The kernel view is loaded (in any tier): without it the accept queue stands for the
    /// work in flight.
    pub kernel_loaded: bool,
    /// The programs' counters for the port while they follow connections.
    pub counters: Option<KernelCounters>,
    /// The kernel's evidence, with sock_diag's view of the connections merged in; None when
    /// there is no kernel evidence of progress to go on.
    pub kernel: Option<KernelEvidence>,
    /// The real answers over `web.errors_window`, and whether they are judged erroring.
    pub answers_basis: Stats,
    pub erroring: bool,
    pub answers: Option<AnswersReport>,
    pub figures: Option<FiguresReport>,
    pub responses_total: Option<TallyReport>,
    pub status: KernelStatus,
    /// The host's listen overflows and drops since the agent started.
    pub listen_drops: (u64, u64),
    /// The answers' signs, `answered_at` from the port alone (the judge adds the probe's).
    pub signs: AnswerSigns,
}

pub struct PortWatch {
    cfg: WebConfig,
    /// What the judge said last (see `Sight`).
    sight: Sight,
    /// The (namespace inode, port) the kernel programs were pointed at.
    watching: Option<(u64, u16)>,
    /// What the agent's own probes put on the port: left out of what sock_diag shows.
    probes: ProbeLedger,
    /// Every read of the port's connections (sock_diag): the watching's own and the drain's.
    reader: PortReader,
    /// The sock_diag socket they are read with, in the backend's namespace (made at the round's
    /// first read there, see `listeners`).
    socket: Option<PortSocket>,
    kernel: Option<KernelView>,
    kernel_status: KernelStatus,
    /// The kernel view's tier (`web.kernel_tier`, or what the kernel offers).
    tier: KernelTier,
    /// (process, listen fd) → socket inode, resolved once through /proc.
    accept_fds: HashMap<AcceptKey, Option<u64>>,
    latency: LatencyWindow,
    progress: Progress,
    /// The latest evaluation that saw a connection wait unclaimed past WATCH_ACCEPTS_AFTER.
    last_stall: Option<Instant>,
    /// Attaching the accept tracepoints failed once: do not retry (and warn) every tick.
    accept_tracing_failed: bool,
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
    /// This tick read the port's connections: a sampled load sample is fresh.
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
    /// The host's listen overflows and drops when the agent started, and as last read.
    drops_baseline: Option<crate::net::ListenDrops>,
    /// Host-wide counters change slowly and only inform: read every DROPS_EVERY, not per tick.
    drops_seen: Option<(Instant, crate::net::ListenDrops)>,
    /// In the `sock_diag` tier: the segments-sent count at the previous tick.
    segments: Option<u64>,
    /// Attaching the answer programs failed once, and why: not retried (nor warned) every
    /// tick, and the answers say the status is not visible.
    answers_attach_failed: Option<String>,
    /// The processes holding the listener when the answers were last read: a wholly new set
    /// (a restart) starts the answers' window over.
    answers_pids: Vec<u32>,
}

/// `accept_tracing = "on_stall"`: a connection unclaimed this long attaches the accept
/// tracepoints. A healthy server, even saturated, claims within milliseconds (the 5-minute
/// saturation run in docs/BENCHMARKS.md saw at most 13 ms).
const WATCH_ACCEPTS_AFTER: Duration = Duration::from_millis(200);
/// … and this long without such a connection detaches them again.
const UNWATCH_ACCEPTS_AFTER: Duration = Duration::from_secs(30);
/// `socket_tracing = "on_suspicion"`: this long without anything suspicious detaches the
/// programs that follow connections.
const UNFOLLOW_AFTER: Duration = Duration::from_secs(30);
/// How often the host's listen overflows and drops are read.
const DROPS_EVERY: Duration = Duration::from_secs(2);

impl PortWatch {
    /// Watching on `kernel` (loaded by `load_kernel`, or None: sock_diag only), whose samples
    /// carry `kernel_status`; `probes` is the probe task's ledger.
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
            sight: Sight::default(),
            watching: None,
            probes,
            reader: PortReader::default(),
            socket: None,
            kernel,
            kernel_status,
            tier,
            accept_fds: HashMap::new(),
            latency: LatencyWindow::default(),
            progress: Progress::default(),
            last_stall: None,
            accept_tracing_failed: false,
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
            drops_baseline: crate::net::listen_drops().ok(),
            drops_seen: None,
            segments: None,
            answers_attach_failed: None,
            answers_pids: Vec::new(),
        }
    }

    /// Takes in what the judge says now; points the kernel programs at a backend found anew.
    fn see(&mut self, sight: Sight) {
        if let Some(at) = sight.probe.answered_at {
            // The backend answered a probe: an answer went out, whatever sock_diag saw of it.
            self.progress.answered(at);
        }
        let key = sight.target.as_ref().map(|t| (t.view.inode, t.port));
        if key != self.watching {
            if let (Some(k), Some(now)) = (self.kernel.as_mut(), key) {
                if let Err(e) = k.watch(&[now]) {
                    tracing::warn!(
                        "kernel programs cannot watch port {} in namespace inode {}: {e}",
                        now.1,
                        now.0
                    );
                }
            }
            self.watching = key;
            self.socket = None;
        }
        self.sight = sight;
    }

    /// The port's listeners where `sight` says the backend is; the sock_diag socket is made
    /// there first when there is none yet (the agent's own error when it cannot be).
    pub fn listeners(&mut self, sight: Sight) -> std::io::Result<Vec<crate::net::Listener>> {
        self.see(sight);
        let Some(target) = self.sight.target.as_deref() else {
            return Ok(Vec::new());
        };
        let socket = match self.socket.take() {
            Some(socket) => socket,
            None => PortSocket::open(target)?,
        };
        self.socket.insert(socket).listeners()
    }

    /// Every TCP connection of the backend's namespace (the judge's look at what its processes
    /// wait on); None before there is a socket there.
    pub fn connections(&self) -> Option<std::io::Result<Vec<crate::net::TcpConn>>> {
        self.socket.as_ref().map(PortSocket::connections)
    }

    /// Every tick: reads the kernel counters (one map read) and notes what moved since the
    /// previous tick, as `asks` asks; hands what the tick saw to whoever else reads the port,
    /// once.
    pub fn tick(&mut self, now: Instant, sight: Sight, asks: Asks) -> TickSample {
        self.see(sight);
        self.reader.want_reads(asks.port_reads);
        self.held = asks.hold;
        if asks.answers_soon {
            self.sample_answers_soon(now);
        }
        self.watch(now);
        TickSample {
            port: self.reader.take_for_others(),
            kernel_arrivals: self.kernel_arrivals(),
            probes_started: self.probes.started(),
            answered_at: self.answered_at(),
            load: self.load_sample(),
        }
    }

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
    /// `tick`, no map read here) and the server processes' CPU time (one small /proc read
    /// each). None without the kernel view or before the backend is found.
    fn load_sample(&self) -> Option<crate::saturation::LoadSample> {
        self.sight.target.as_ref()?;
        let owners = &self.sight.owners;
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
                backend_cpu_seconds: process::cpu_seconds(owners),
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
            backend_cpu_seconds: process::cpu_seconds(owners),
            sampled: false,
            moved: false,
            unsure: false,
        })
    }

    /// Arrivals the kernel counted while the connection programs are attached (see
    /// `TickSample::kernel_arrivals`).
    fn kernel_arrivals(&self) -> Option<u64> {
        self.kernel.as_ref().filter(|k| k.following())?;
        self.last_counters.as_ref().map(|c| c.arrivals())
    }

    /// Whether the port needs a full round every tick: something suspicious, or work in flight
    /// without progress since the previous tick while the programs follow connections.
    pub fn hot(&self) -> bool {
        self.suspicious
            || (self.kernel.as_ref().is_some_and(KernelView::following) && self.progress.stalled())
    }

    /// When the backend last answered: the last response byte seen on the port, or the last
    /// probe that passed, whichever is later. What the peers weigh against a fault of theirs
    /// (see `fleet::Evidence`).
    fn answered_at(&self) -> Option<Instant> {
        self.progress.answer_at().max(self.sight.probe.passed_at)
    }

    /// The answers' signs as the port shows them.
    fn signs(&self) -> AnswerSigns {
        let a = &self.answers;
        let enough = a.stats().answers > 0 && a.erroring() && a.judged();
        AnswerSigns {
            answered_at: self.progress.answer_at(),
            fine_at: a.fine_at(),
            erroring_since: enough.then(|| a.since()).flatten(),
            answered_by_class: a.answered_by_class(),
        }
    }

    /// A round's sample when there is no backend to look at: what the kernel view is, and what
    /// was counted before.
    pub fn at_rest(&self) -> PortSample {
        PortSample {
            kernel_loaded: self.kernel.is_some(),
            counters: None,
            kernel: None,
            answers_basis: Stats::default(),
            erroring: false,
            answers: None,
            figures: None,
            responses_total: self.tally.current(),
            status: self.kernel_status.clone(),
            listen_drops: (0, 0),
            signs: self.signs(),
        }
    }
}
