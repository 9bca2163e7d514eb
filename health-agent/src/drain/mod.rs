//! Drain with proof: `health-agent drain` takes the instance out of the load balancer and
//! returns once the kernel shows that nothing new reaches the web backend and nothing is in
//! flight; `health-agent undrain` puts it back once the backend answers again.
//!
//! - this module: the drain's state (`Drain`, shared by the control socket, the lifecycle hook
//!   and the composer), what it does to the policy's decision (`apply`), and the state file
//!   that keeps a drain across agent restarts;
//! - `judge`: when a drain is done, the command's progress line, `details.drain`;
//! - `watch`: the backend port's connections while a drain runs, as the port's watching reads
//!   them for it: new connections and requests by peer, and what is in flight;
//! - `control`: the root-only Unix socket and the commands' client side;
//! - `lifecycle`: the auto-scaling group's termination hook (IMDSv2, CompleteLifecycleAction).

pub mod control;
mod judge;
pub mod lifecycle;
mod watch;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use self::judge::round1;
pub use self::{
    judge::{
        judge, peer_list, peer_name, DrainReport, Judgement, PeerCount, ProgressLines, UNSEEN,
    },
    watch::Progress,
};
use crate::{
    policy::Decision,
    status::{Status, WebVerdict},
    text::rfc3339,
};

/// How long arrivals are kept: a timed-out drain names the senders of this span.
pub const RECENT: Duration = Duration::from_secs(10);

/// Who started a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum By {
    #[serde(rename = "drain command")]
    Command,
    #[serde(rename = "lifecycle hook")]
    LifecycleHook,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Command => "drain command",
            Self::LifecycleHook => "lifecycle hook",
        }
    }
}

/// What the state file holds while drained.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Kept {
    /// Seconds since the Unix epoch.
    started_unix: f64,
    by: By,
}

/// A drain in progress, or done and still holding the instance out.
#[derive(Debug, Clone)]
struct Draining {
    started: SystemTime,
    started_at: Instant,
    by: By,
    /// The state file was written: the drain survives an agent restart.
    persisted: bool,
    /// Resumed from the state file at start.
    resumed: bool,
    /// The last judgement a waiting command or hook reached.
    result: Option<Outcome>,
}

/// A waiting command's or hook's final judgement, kept for `details.drain` until undrain or
/// another drain command watches again.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Drained(String),
    TimedOut(String),
}

impl Outcome {
    fn state(&self) -> &'static str {
        match self {
            Self::Drained(_) => "drained",
            Self::TimedOut(_) => "timed_out",
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::Drained(m) | Self::TimedOut(m) => m,
        }
    }
}

#[derive(Debug, Clone)]
enum Phase {
    Serving,
    Draining(Draining),
    /// Undrained: the booting rule holds until the backend answers after `since`.
    Returning {
        since: Instant,
    },
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    progress: Progress,
    /// The connections between two reads of the port.
    reader: watch::Reader,
    kernel: KernelCount,
    /// Counts the judgements kept (`Draining::result` changed), so a command can wait until
    /// `/health` serves the one it prints.
    judged: u64,
}

/// The kernel's arrival counter between two notes, the agent's probes taken off.
#[derive(Debug, Default)]
struct KernelCount {
    arrivals: Option<u64>,
    /// None before the first note: the probes begun before the drain are no credit.
    probes: Option<u64>,
    /// Probes begun whose arrival the kernel has not counted yet, and since when.
    credit: u64,
    credit_at: Option<Instant>,
}

/// A probe's connection is counted by the kernel within this of its start, or never.
const PROBE_CREDIT: Duration = Duration::from_secs(2);

/// The drain's shared state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Drain {
    inner: Arc<Mutex<Inner>>,
    /// Wakes the composer when a drain starts: the port is read at once.
    wake: Arc<Notify>,
    state_file: Option<PathBuf>,
    /// Whether a backend is watched at all (`web.port` set).
    watched: bool,
    /// After undrain, how long a backend that is not listening yet (a restart under way) is
    /// not restarted by self-healing: `checks.boot_grace`.
    boot_grace: Duration,
    /// The latest `Inner::judged` a published snapshot carries in `details.drain`.
    shown: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Could not start or end a drain.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("writing the drain state to {path}: {error}")]
    Persist { path: String, error: std::io::Error },
}

impl Drain {
    /// The drain state, resumed from `state_file` when a drain was kept there (None: nothing
    /// kept, for tests).
    pub fn new(state_file: Option<PathBuf>, watched: bool, boot_grace: Duration) -> Self {
        let mut phase = Phase::Serving;
        if let Some(path) = &state_file {
            match read_kept(path) {
                Ok(Some(k)) => {
                    // A number that is no time (a hand-edited file) is now.
                    let started = Duration::try_from_secs_f64(k.started_unix)
                        .ok()
                        .and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d))
                        .unwrap_or_else(SystemTime::now);
                    let ago = SystemTime::now()
                        .duration_since(started)
                        .unwrap_or_default();
                    tracing::warn!(
                        "a drain is on: the {} started it at {} (kept in {}); /health answers \
                         503 draining until `health-agent undrain`",
                        k.by.as_str(),
                        rfc3339(started),
                        path.display()
                    );
                    phase = Phase::Draining(Draining {
                        started,
                        started_at: Instant::now().checked_sub(ago).unwrap_or_else(Instant::now),
                        by: k.by,
                        persisted: true,
                        resumed: true,
                        result: None,
                    });
                }
                Ok(None) => {}
                Err(e) => tracing::error!(
                    "cannot read the drain state {}: {e}; not draining",
                    path.display()
                ),
            }
        }
        Self {
            inner: Arc::new(Mutex::new(Inner {
                phase,
                progress: Progress::default(),
                reader: watch::Reader::default(),
                kernel: KernelCount::default(),
                judged: 0,
            })),
            wake: Arc::new(Notify::new()),
            state_file,
            watched,
            boot_grace,
            shown: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a drain (or keeps the one running, whoever started it). The 503 begins with the
    /// next snapshot. A state file that cannot be written is said, not fatal: the drain holds
    /// until the agent restarts.
    pub fn start(&self, by: By) -> Result<(), DrainError> {
        let mut g = self.lock();
        if let Phase::Draining(d) = &mut g.phase {
            d.result = None;
            return Ok(());
        }
        let started = SystemTime::now();
        let persisted = match &self.state_file {
            None => Ok(false),
            Some(path) => write_kept(
                path,
                &Kept {
                    started_unix: started
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs_f64(),
                    by,
                },
            )
            .map(|()| true)
            .map_err(|error| DrainError::Persist {
                path: path.display().to_string(),
                error,
            }),
        };
        let (persisted, error) = match persisted {
            Ok(p) => (p, None),
            Err(e) => (false, Some(e)),
        };
        g.phase = Phase::Draining(Draining {
            started,
            started_at: Instant::now(),
            by,
            persisted,
            resumed: false,
            result: None,
        });
        g.progress = Progress::default();
        g.reader = watch::Reader::default();
        drop(g);
        tracing::info!(
            "draining (started by the {}): /health answers 503",
            by.as_str()
        );
        self.wake.notify_one();
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ends a drain; false when there was none. The state file goes first: an agent that
    /// restarts now does not drain again.
    pub fn undrain(&self) -> Result<bool, DrainError> {
        if let Some(path) = &self.state_file {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(DrainError::Persist {
                        path: path.display().to_string(),
                        error,
                    })
                }
            }
        }
        let mut g = self.lock();
        if !matches!(g.phase, Phase::Draining(_)) {
            return Ok(false);
        }
        g.phase = if self.watched {
            Phase::Returning {
                since: Instant::now(),
            }
        } else {
            Phase::Serving
        };
        tracing::info!("undrained: back in rotation once the web backend answers");
        Ok(true)
    }

    /// Whether a drain holds the instance out (running or done, until undrain).
    pub fn draining(&self) -> bool {
        matches!(self.lock().phase, Phase::Draining(_))
    }

    /// Whether the drain has anything to say: the composer makes a snapshot every tick
    /// meanwhile, so a drain's 503 and its end show at once.
    pub fn busy(&self) -> bool {
        !matches!(self.lock().phase, Phase::Serving)
    }

    /// What the reads of the port showed, and when the drain started.
    pub fn progress(&self) -> Option<(Progress, Instant)> {
        let g = self.lock();
        match &g.phase {
            Phase::Draining(d) => Some((g.progress.clone(), d.started_at)),
            _ => None,
        }
    }

    /// Where the drain stands for a caller waiting with `quiet` and `timeout` from `since`
    /// (when it asked): the result is kept for `details.drain`.
    pub fn judge(&self, quiet: Duration, timeout: Duration, since: Instant) -> Option<Judgement> {
        let now = Instant::now();
        let mut g = self.lock();
        let progress = g.progress.clone();
        let Phase::Draining(d) = &mut g.phase else {
            return None;
        };
        let j = judge(
            &progress,
            d.started_at,
            since,
            now,
            quiet,
            timeout,
            self.watched,
        );
        let outcome = match &j {
            Judgement::Drained(m) => Some(Outcome::Drained(m.clone())),
            Judgement::TimedOut(m) => Some(Outcome::TimedOut(m.clone())),
            Judgement::Draining => None,
        };
        if outcome.is_some() && d.result != outcome {
            d.result = outcome;
            g.judged += 1;
        }
        Some(j)
    }

    /// The runner's note once a snapshot is published: the judgement its `details.drain`
    /// carries (`DrainReport::judged`) is what `/health` now serves.
    pub fn published(&self, judged: u64) {
        self.shown.send_if_modified(|v| {
            let newer = judged > *v;
            *v = (*v).max(judged);
            newer
        });
    }

    /// Waits, at most `limit`, until a published snapshot carries the latest judgement: the
    /// command prints its last line only once `details.drain` says the same (state and result).
    pub async fn until_shown(&self, limit: Duration) {
        let want = self.lock().judged;
        let mut shown = self.shown.subscribe();
        let _ = tokio::time::timeout(limit, shown.wait_for(|v| *v >= want)).await;
    }

    /// Whether self-healing may act on this round's verdict: a backend that is not listening
    /// while drained, or within `checks.boot_grace` of undrain, is a deploy restarting it.
    pub fn heal_allowed(&self, verdict: WebVerdict, now: Instant) -> bool {
        if verdict != WebVerdict::Down {
            return true;
        }
        match self.lock().phase {
            Phase::Serving => true,
            Phase::Draining(_) => false,
            Phase::Returning { since } => now.saturating_duration_since(since) >= self.boot_grace,
        }
    }

    /// The policy's decision with the drain applied: 503 `draining` while drained (a fault that
    /// needs a restart stays `unhealthy`), then the booting rule until the backend answered
    /// after undrain (`answered_at`: its last answer).
    pub fn apply(
        &self,
        mut d: Decision,
        verdict: WebVerdict,
        answered_at: Option<Instant>,
        now: Instant,
    ) -> Decision {
        let mut g = self.lock();
        match &g.phase {
            Phase::Serving => d,
            Phase::Draining(dr) => {
                if d.status == Status::Unhealthy && verdict != WebVerdict::Down {
                    return d;
                }
                let ago = now.saturating_duration_since(dr.started_at).as_secs();
                let mut reason = format!(
                    "draining: started by the {} {ago}s ago (undrain ends it)",
                    dr.by.as_str()
                );
                if dr.resumed {
                    reason.push_str("; kept across an agent restart");
                }
                d.reasons.retain(|r| !r.starts_with("web backend down"));
                d.reasons.insert(0, reason);
                d.status = Status::Draining;
                d.http = 503;
                d.faults.clear();
                d
            }
            Phase::Returning { since } => {
                let since = *since;
                let answered = answered_at.is_some_and(|t| t > since)
                    && matches!(verdict, WebVerdict::Up | WebVerdict::Slow);
                if answered {
                    g.phase = Phase::Serving;
                    tracing::info!("the web backend answers again after undrain: in rotation");
                    return d;
                }
                if d.status == Status::Unhealthy && verdict != WebVerdict::Down {
                    return d;
                }
                d.reasons.insert(
                    0,
                    "booting: undrained, waiting for the web backend to answer again".into(),
                );
                d.status = Status::Booting;
                d.http = 503;
                d.faults.clear();
                d
            }
        }
    }

    /// `details.drain`: None while serving.
    pub fn report(&self, now: Instant) -> Option<DrainReport> {
        let g = self.lock();
        match &g.phase {
            Phase::Serving => None,
            Phase::Returning { since } => Some(DrainReport {
                state: "returning",
                by: None,
                started: None,
                persisted: None,
                in_flight: None,
                new_last_second: None,
                peers_last_second: Vec::new(),
                last_new_request_ago_s: None,
                in_flight_at_start: None,
                result: Some(format!(
                    "undrained {:.1}s ago; waiting for the web backend to answer",
                    now.saturating_duration_since(*since).as_secs_f64()
                )),
                error: None,
                judged: g.judged,
            }),
            Phase::Draining(d) => {
                let p = &g.progress;
                let peers = p.peers_within(now, Duration::from_secs(1));
                Some(DrainReport {
                    state: d.result.as_ref().map_or("draining", Outcome::state),
                    by: Some(d.by.as_str()),
                    started: Some(rfc3339(d.started)),
                    persisted: Some(d.persisted),
                    in_flight: Some(p.in_flight),
                    new_last_second: Some(peers.iter().map(|(_, n)| n).sum()),
                    peers_last_second: peers
                        .into_iter()
                        .map(|(addr, requests)| PeerCount {
                            addr: peer_name(addr),
                            requests,
                        })
                        .collect(),
                    last_new_request_ago_s: p
                        .last_new
                        .map(|t| round1(now.saturating_duration_since(t).as_secs_f64())),
                    in_flight_at_start: p.in_flight_at_start,
                    result: d.result.as_ref().map(|r| r.message().to_string()),
                    error: p.error.clone(),
                    judged: g.judged,
                })
            }
        }
    }

    /// The composer's note, every tick of a drain: the kernel's count of arrivals (None while
    /// the connection programs are detached) and the agent's probes begun so far.
    pub fn note_kernel(&self, arrivals: Option<u64>, probes: u64, now: Instant) {
        let mut g = self.lock();
        if !matches!(g.phase, Phase::Draining(_)) {
            g.kernel = KernelCount::default();
            return;
        }
        let Inner {
            kernel: k,
            progress: p,
            ..
        } = &mut *g;
        let new_probes = k.probes.map_or(0, |before| probes.saturating_sub(before));
        k.probes = Some(probes);
        if new_probes > 0 {
            k.credit += new_probes;
            k.credit_at = Some(now);
        } else if k
            .credit_at
            .is_some_and(|t| now.saturating_duration_since(t) > PROBE_CREDIT)
        {
            // A probe that never connected: nothing of it will be counted.
            k.credit = 0;
        }
        let Some(now_arrivals) = arrivals else {
            k.arrivals = None;
            return;
        };
        // Counts restart when the programs attach again.
        let came = match k.arrivals {
            Some(before) if now_arrivals >= before => now_arrivals - before,
            Some(_) | None => 0,
        };
        k.arrivals = Some(now_arrivals);
        let probes_in = came.min(k.credit);
        k.credit -= probes_in;
        p.kernel_total += came - probes_in;
    }

    /// For the reads: the progress to update while a drain runs, else None.
    fn progress_mut(&self) -> Option<MutexGuard<'_, Inner>> {
        let g = self.lock();
        matches!(g.phase, Phase::Draining(_)).then_some(g)
    }

    /// Notified when a drain starts (`next_read` is then due).
    pub fn woken(&self) -> Arc<Notify> {
        self.wake.clone()
    }
}

fn read_kept(path: &Path) -> std::io::Result<Option<Kept>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Written whole or not at all: a temporary file beside it, renamed over it.
fn write_kept(path: &Path, kept: &Kept) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string(kept).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests;
