//! The judge of the web backend: where it is (its target, found from the config and the
//! container engine), which processes hold its listener, what the probe found, and the verdict
//! it had. Each round it finds the backend, takes its listeners and the port's `PortSample` from
//! the watching (`port::PortWatch`, which alone reads the port), looks at the server's processes
//! while work is stuck, and turns all that into a `WebReport` through `verdict::decide`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    port::{PortSample, PortWatch, Sight},
    probed::Probed,
    process::{self, CpuMeter, WorkerView},
    target::{self, Target, Unresolved},
    verdict::{self, Evidence},
    ProcessView, WebReport,
};
use crate::{
    checks::probe::{ProbeResult, ProbeTarget, SharedProbeTarget},
    config::WebConfig,
    engine::ContainerNet,
    net,
    status::WebVerdict,
};

mod evaluate;
mod look;

pub use evaluate::Found;

/// Reads every TCP connection of the backend's namespace for the look at what its processes
/// wait on while work is stuck (`PortWatch::connections`); None: nothing to read them with.
pub type Connections<'a> = &'a mut dyn FnMut() -> Option<std::io::Result<Vec<net::TcpConn>>>;

pub struct WebMonitor {
    cfg: WebConfig,
    /// Where the backend listens, once known (shared with the watching of its port).
    target: Option<Arc<Target>>,
    /// The container engine's latest report on `web.container`'s network.
    container_net: Option<Result<ContainerNet, crate::engine::EngineError>>,
    /// Where the probe task connects: set from the listeners seen.
    probe_target: SharedProbeTarget,
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
    cpu: CpuMeter,
    /// The backend has been seen serving since the agent started.
    served: bool,
    queue_busy_since: Option<Instant>,
    /// The latest sample came from a loaded kernel view: without one, the accept queue stands
    /// for the work in flight (see `hot`).
    kernel_loaded: bool,
    /// What the probe found lately.
    probed: Probed,
    owner_name: Option<String>,
    last_verdict: WebVerdict,
    /// When `decide` could next change its mind on the evidence seen (see `next_look`).
    next_look: Option<Instant>,
    /// `web.container` / `web.netns` has been found at least once since the agent started.
    found_once: bool,
    /// Since when what they name has not been found.
    missing_since: Option<Instant>,
}

/// A container that was found before and is gone this long is no longer "being recreated"
/// (docker compose up, a deploy's rm + run take seconds): it is reported as a config error.
const GONE_FOR_GOOD: Duration = Duration::from_secs(60);

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

impl WebMonitor {
    pub fn new(cfg: WebConfig) -> Self {
        Self {
            cfg,
            target: None,
            container_net: None,
            probe_target: SharedProbeTarget::default(),
            owners: Vec::new(),
            owners_inode: 0,
            owners_scanned: None,
            worker_cpu: HashMap::new(),
            frozen_since: HashMap::new(),
            held_found_nothing: None,
            cpu: CpuMeter::default(),
            served: false,
            queue_busy_since: None,
            kernel_loaded: false,
            probed: Probed::default(),
            owner_name: None,
            last_verdict: WebVerdict::Unknown,
            next_look: None,
            found_once: false,
            missing_since: None,
        }
    }

    /// What the watching of the port needs of the judge: where the backend is, who holds it,
    /// the last verdict and the probe.
    pub fn sight(&self) -> Sight {
        Sight {
            target: self.target.clone(),
            owners: self.owners.clone(),
            verdict: self.last_verdict,
            probe: self.probed.sight(),
        }
    }

    /// When the composer should evaluate again, ahead of its next tick: the instant a
    /// waiting or pending connection could cross its threshold (None once it has passed).
    pub fn next_look(&self, now: Instant) -> Option<Instant> {
        self.next_look.filter(|&t| t > now)
    }

    /// Whether the backend needs a full round every tick: the last verdict was not fine, or
    /// (without the kernel view) the accept queue was non-empty. The watching of the port says
    /// the same of work in flight without progress (`PortWatch::hot`); a busy server that keeps
    /// taking and answering is watched on `checks.interval`, and `next_look` still wakes the
    /// composer when a connection seen then can cross a threshold.
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
        bad || (!self.kernel_loaded && self.queue_busy_since.is_some())
    }

    /// Takes in a new probe result (the probe runs on its own cadence).
    pub fn record_probe(&mut self, p: ProbeResult, now: Instant) {
        self.probed.record(p, now);
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

    /// The round's answer signs: the port's, with the last probe that passed.
    fn signs(&self, sample: &PortSample) -> super::AnswerSigns {
        super::AnswerSigns {
            answered_at: sample.signs.answered_at.max(self.probed.passed_at()),
            ..sample.signs
        }
    }
}

#[cfg(test)]
mod tests;
