//! The web backend check: who listens on `web.port`, how full its accept queue is, what the
//! kernel programs saw of its connections, what its processes are doing (stopped, burning
//! CPU, waiting on their own outbound requests, one worker stuck), and what the active probe
//! got — merged into one verdict (`up`, `slow`, `waiting`, `partial_hang`, `erroring`,
//! `hung`, `unresponsive`, `down`) that names its evidence. Without eBPF the probe, the accept queue
//! and /proc still decide, and the report says the kernel view is unavailable.
//!
//! - `verdict`: the rules, a pure function of the evidence;
//! - `progress`: when the server last moved, from the kernel counters read every tick;
//! - `process`: the server's processes — stopped or frozen, CPU, outbound waits, and each
//!   worker's own unanswered requests (a partial hang);
//! - `latency`: server-side latency over a sliding window;
//! - `sockets`: what the port's connections say (`SocketView`, the `Moves` between two reads,
//!   the `PortRead` the drain gets);
//! - `reader`: every sock_diag read of the port (`PortReader`, with its socket in the backend's
//!   namespace, `PortSocket`): the listeners, the watching's own reads of the connections on a
//!   cadence that follows the traffic and the drain's, one dump serving both;
//! - `answers`: what it answers by status class over `web.errors_window` (`erroring`);
//! - `cadence`: when the programs count with `socket_tracing = "on_suspicion"` (counting and
//!   answer sampling windows), a clock with no program of its own;
//! - `figures`: request rate, answers by class and latency over `web.latency_window`, counted
//!   or estimated from the programs' counting windows;
//! - `port`: watches the port, and only watches: the kernel programs and their steering, the
//!   counting and answer windows, and every read of the port's connections through its
//!   `PortReader`; each tick a `TickSample`, each round one `PortSample`;
//! - `monitor`: the judge (`WebMonitor`): the target, the listeners' owners, the probe and the
//!   verdict's memory; it turns a round's `PortSample` into the report.

pub mod answers;
mod cadence;
mod figures;
mod latency;
mod monitor;
mod port;
mod probed;
pub(crate) mod process;
mod progress;
mod reader;
pub(crate) mod sockets;
mod tally;
mod target;
mod verdict;

use std::time::Instant;

use serde::Serialize;

pub use figures::FiguresReport;
pub use latency::{percentiles, LatencySummary};
pub use monitor::{Found, WebMonitor};
pub use port::{load_kernel, Asks, PortSample, PortWatch, ProbeSight, Sight, TickSample};
pub use process::{DependencyWait, WorkerView};
pub use sockets::PortRead;
pub use tally::{TallyReport, CLASSES as ANSWER_CLASSES};
pub use target::NamespaceView;

use super::probe::ProbeResult;
use crate::status::WebVerdict;

/// Whether the kernel view is running; serialized as `active`, `unavailable`, `disabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelState {
    Active,
    Unavailable,
    Disabled,
}

/// Whether the kernel view is running, and why not.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelStatus {
    pub state: KernelState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// While the kernel view is active: whether the programs that follow connections (TCP
    /// state, every send and receive) are attached now, and why (`web.socket_tracing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub following: Option<Following>,
    /// The tier of the kernel view in use (`full`, `sock_diag`, `no_ebpf`; None: no web
    /// port), and what it lacks against `full`, with why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::config::KernelTier>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

impl KernelStatus {
    /// Why there is no kernel view, when there is none.
    pub fn unloaded_why(&self) -> Option<String> {
        (self.state != KernelState::Active).then(|| {
            self.reason
                .clone()
                .unwrap_or_else(|| "the kernel view is not loaded".into())
        })
    }
}

/// Whether the programs that follow connections are attached, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Following {
    /// `web.socket_tracing`: `always` or `on_suspicion`.
    pub mode: crate::config::SocketTracing,
    pub attached: bool,
    /// Why they are attached or not: the suspicion that attached them, or what the port's
    /// connections look like while they are detached.
    pub why: String,
    /// The port's connections as sock_diag showed them at the latest read (`on_suspicion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<sockets::SocketView>,
    /// `on_suspicion`: how often the connections are read while nothing goes on (every tick
    /// while work is seen): 1 s, or up to 5 s when one read costs over 1 % of that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet_read_every_ms: Option<u64>,
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
    /// Send calls on any of the port's connections (keep-alive exchanges included).
    pub sent: u64,
    /// Reads of at least one byte on any of the port's connections.
    pub received: u64,
    /// Requests read (every request of a keep-alive connection, each once however many reads
    /// it took), answers begun to them, and those whose connection closed first: the
    /// per-request figures saturation rests on.
    pub exchanges_in: u64,
    pub exchanges_out: u64,
    pub exchanges_dropped: u64,
    /// Requests read and not yet answered now, on any connection (in − out − dropped).
    pub in_service: u64,
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
    /// Since a response byte last went out on any connection (to within one tick).
    pub ms_since_last_answer: Option<u64>,
    /// The longest this server went without answering while it had work, over the latency
    /// window: it stretches the weak-evidence hung limit.
    pub longest_quiet_ms: u64,
    /// Whether accept() is traced now (`web.accept_tracing`); `accepted` counts only then.
    pub accepts_traced: bool,
    /// Server-side latency (request read → first response byte) over `web.latency_window`.
    pub latency: LatencySummary,
    /// Map updates the kernel programs could not make since they loaded, by kind (all ports).
    pub map_errors: crate::ebpf::MapErrors,
}

/// What the server's processes were seen doing while its work was stuck (read only then).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct ProcessView {
    /// Set when every process holding the listener is stopped or in a frozen cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen: Option<String>,
    /// Percent of one core over the last second.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::shown::percent_opt")]
    pub cpu_percent: Option<f64>,
    /// Set when the outbound connections could not be read (the verdict then has no
    /// dependency evidence, and says nothing either way).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WebReport {
    pub port: u16,
    /// Where the backend was looked for (None: not configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<NamespaceView>,
    pub verdict: WebVerdict,
    /// The verdict's evidence, in a sentence.
    pub detail: String,
    /// Whether the backend has been seen serving since the agent started: the probe got an
    /// answer other than a 5xx (with `probe_path = ""`: it listens). Until then the instance
    /// is not ready.
    pub served: bool,
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
    /// The server's outbound requests waiting for an answer (read while its work is stuck).
    pub dependencies: Vec<DependencyWait>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<ProcessView>,
    /// Set when the probe and the kernel view tell different stories.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagreement: Option<String>,
    /// A setting of `[web]` that cannot be right, naming the key: the probe path answers 4xx,
    /// `web.container` or `web.netns` names nothing. Degraded and alerted, never a 503.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    /// What it answered over `web.errors_window`, by status class (None: no web port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<answers::AnswersReport>,
    /// Request rate, answers by class and latency over `web.latency_window`: counted
    /// (`socket_tracing = "always"`) or estimated from the programs' counting windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<FiguresReport>,
    /// Real answers by class since the agent started, counted or estimated (`/metrics`).
    #[serde(skip)]
    pub responses_total: Option<TallyReport>,
    /// The process a `partial_hang` verdict names: what it holds, and whether its master can
    /// replace it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck_worker: Option<WorkerView>,
    /// The verdict is `unknown` because of the agent's own error (it could not enter the
    /// namespace, make or bind the probe socket, or had no permission; `detail` says which):
    /// never evidence against the backend, never a 503.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub agent_error: bool,
    /// What the round's later steps weigh and /health does not show: the heal judge, the
    /// drain and the peers' view read it here, after the verdict, not from the monitor.
    #[serde(skip)]
    pub signs: AnswerSigns,
}

/// When the backend last answered and what its real answers say, as the round's verdict
/// leaves them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnswerSigns {
    /// The kernel view's last response byte on the port, or the last probe that passed,
    /// whichever is later.
    pub answered_at: Option<Instant>,
    /// When its real answers were last judged mostly not 5xx.
    pub fine_at: Option<Instant>,
    /// While it errors on enough real answers: since when that evidence runs (the window
    /// starts over at a restart).
    pub erroring_since: Option<Instant>,
    /// Real answers by class (1xx–5xx at 1–5) since the answer programs loaded, without the
    /// agent's probe; None when they are not counted.
    pub answered_by_class: Option<[u64; 6]>,
}

impl WebReport {
    pub fn not_configured() -> Self {
        Self {
            port: 0,
            namespace: None,
            verdict: WebVerdict::NotConfigured,
            detail: "web.port is 0: no web backend to watch".into(),
            served: false,
            listening: false,
            pids: Vec::new(),
            process: None,
            accept_queue: 0,
            accept_queue_max: 0,
            listen_overflows: 0,
            listen_drops: 0,
            kernel: KernelStatus {
                state: KernelState::Disabled,
                reason: Some("no web port configured".into()),
                following: None,
                tier: None,
                missing: Vec::new(),
            },
            counters: None,
            probe: None,
            dependencies: Vec::new(),
            processes: None,
            disagreement: None,
            config_error: None,
            answers: None,
            figures: None,
            responses_total: None,
            stuck_worker: None,
            agent_error: false,
            signs: AnswerSigns::default(),
        }
    }

    fn with_port(self, port: u16) -> Self {
        Self { port, ..self }
    }
}
