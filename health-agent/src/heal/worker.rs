//! Replacing one stuck worker of a pre-fork server (Puma cluster, Unicorn, gunicorn, php-fpm,
//! nginx): the web check names it (`partial_hang`), and its master, which replaces any worker
//! that dies, does the rest once the worker is gone. SIGTERM (and SIGCONT, so a stopped worker
//! can act on it), SIGKILL after `TERM_GRACE`, then a new child of the master holding the
//! listener must appear within `heal.timeout`, and the verdict must leave `partial_hang`.
//!
//! The safety rules (`may_replace`): `heal.replace_workers` on; never a master (a process
//! whose children hold the listener); only a process whose parent holds the listener too and
//! can run (not stopped, frozen or gone); never while a restart runs; one restart of the
//! `heal.max_restarts` per `heal.window` budget each. The pid is checked against its start
//! time just before each signal, so a pid the kernel reused is never signalled.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinHandle;

use super::{futures_now, Action, HealError, HealOutcome, Healer};
use crate::{
    checks::web::{process, WebReport, WorkerView},
    net,
    status::WebVerdict,
};

/// How long a worker gets to exit on SIGTERM before SIGKILL: a stuck worker rarely finishes
/// gracefully, and every second it lingers the requests it holds wait.
const TERM_GRACE: Duration = Duration::from_secs(2);
/// How long a SIGKILLed worker may take to go (a frozen cgroup v1 task never does).
const KILL_WAIT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(50);

/// The worker to replace, as it was when it was found stuck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub pid: u32,
    /// Its start time (clock ticks after boot): with the pid, this very process.
    pub start: u64,
    pub master: u32,
    pub listener: u64,
}

/// Why replacing a worker failed. The messages are what the heal log shows.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("worker {0} is no longer the process found stuck (gone or pid reused)")]
    Changed(u32),
    #[error("master {0} can no longer replace it: {1}")]
    MasterUnable(u32, String),
    #[error("signalling worker {0} failed: {1}")]
    Signal(u32, std::io::Error),
    #[error("worker {0} still runs {secs}s after SIGKILL", secs = KILL_WAIT.as_secs())]
    WouldNotDie(u32),
    #[error("worker {pid} {how}, but master {master} started no new worker within {}s", .timeout.as_secs())]
    NoReplacement {
        pid: u32,
        how: String,
        master: u32,
        timeout: Duration,
    },
}

/// Why a stuck worker is left alone: the safety rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("heal.replace_workers = false")]
    Off,
    #[error("process {0} is a master (its children hold the listener): never replaced")]
    Master(u32),
    #[error(
        "the parent {parent} of process {pid} does not hold the listener: no master to replace it"
    )]
    NoMaster { pid: u32, parent: u32 },
    #[error("its master {0} is {1}: it cannot start a replacement")]
    MasterUnable(u32, String),
    #[error("a restart is under way")]
    Busy,
    #[error("the restart budget is spent")]
    Budget,
}

/// Whether `w` may be replaced now: the safety rules of this module, as a pure function.
pub fn may_replace(
    w: &WorkerView,
    replace_workers: bool,
    restart_running: bool,
    budget_left: bool,
) -> Result<Target, Refusal> {
    if !replace_workers {
        return Err(Refusal::Off);
    }
    if w.is_master {
        return Err(Refusal::Master(w.pid));
    }
    // pid 1 (init, a container's entrypoint) and the agent itself are nobody's master here.
    if !w.parent_holds_listener || w.parent <= 1 || w.parent == std::process::id() {
        return Err(Refusal::NoMaster {
            pid: w.pid,
            parent: w.parent,
        });
    }
    if let Some(why) = &w.parent_unable {
        return Err(Refusal::MasterUnable(w.parent, why.clone()));
    }
    if restart_running {
        return Err(Refusal::Busy);
    }
    if !budget_left {
        return Err(Refusal::Budget);
    }
    Ok(Target {
        pid: w.pid,
        start: w.start,
        master: w.parent,
        listener: w.listener,
    })
}

/// Where replacing a worker stands, and the last refusal (logged once, not every round).
#[derive(Default)]
pub(super) struct WorkerHeal {
    state: WorkerState,
    last_refusal: Option<Refusal>,
}

#[derive(Default)]
enum WorkerState {
    #[default]
    Idle,
    /// Signalling the worker and waiting for the master's new one.
    Running {
        started: Instant,
        pid: u32,
        task: JoinHandle<Result<String, HealError>>,
    },
    /// The new worker is there; waiting for the verdict to leave `partial_hang`.
    Waiting { started: Instant, pid: u32 },
}

impl Healer {
    /// Advances worker replacement with this round's web report (outside boot grace only,
    /// like `step`, which must have run first this round: it ages the budget).
    pub fn replace_worker(&mut self, web: &WebReport, now: Instant) {
        let stuck = (web.verdict == WebVerdict::PartialHang)
            .then_some(web.stuck_worker.as_ref())
            .flatten();
        match &mut self.worker.state {
            WorkerState::Running { started, pid, task } => {
                let (started, pid) = (*started, *pid);
                if !task.is_finished() {
                    // `replace` bounds itself by heal.timeout; this only guards a lost task.
                    if now.saturating_duration_since(started) > self.cfg.timeout + TERM_GRACE {
                        task.abort();
                        self.worker_failed(HealError::Overran(self.cfg.timeout), started, now);
                    }
                    return;
                }
                let result = futures_now(task).unwrap_or(Err(HealError::TaskEnded));
                match result {
                    Ok(output) => {
                        self.update_last(|a| {
                            a.outcome = HealOutcome::Waiting;
                            a.output = Some(output);
                        });
                        self.worker.state = WorkerState::Waiting { started, pid };
                    }
                    Err(e) => self.worker_failed(e, started, now),
                }
                return;
            }
            WorkerState::Waiting { started, pid } => {
                let (started, pid) = (*started, *pid);
                if stuck.is_none_or(|w| w.pid != pid) {
                    let why = format!("worker {pid} is gone and the partial hang cleared");
                    self.finish_last(HealOutcome::Recovered, Some(why), None, started, now);
                    self.log.total_recovered += 1;
                    tracing::info!("worker {pid} replaced: the partial hang cleared");
                    self.worker.state = WorkerState::Idle;
                } else if now.saturating_duration_since(started) > self.cfg.timeout {
                    let e = HealError::StillFaulty {
                        reasons: web.detail.clone(),
                        timeout: self.cfg.timeout,
                    };
                    self.worker_failed(e, started, now);
                }
                return;
            }
            WorkerState::Idle => {}
        }
        let Some(w) = stuck else { return };
        if !self.cfg.enabled {
            return;
        }
        let budget_left = (self.restarts.len() as u32) < self.cfg.max_restarts;
        // A restart under way (or one that failed this incident) goes first.
        let restart_running = self.busy();
        let target = match may_replace(w, self.cfg.replace_workers, restart_running, budget_left) {
            Ok(t) => t,
            Err(refusal) => {
                if self.worker.last_refusal.as_ref() != Some(&refusal) {
                    tracing::warn!(pid = w.pid, "not replacing the stuck worker: {refusal}");
                    self.worker.last_refusal = Some(refusal);
                }
                return;
            }
        };
        self.worker.last_refusal = None;
        let pid = target.pid;
        let action = Action::ReplaceWorker(target);
        let reason = format!("web backend partially hung: {}", web.detail);
        tracing::warn!(action = %action.describe(), %reason, "self-heal: replacing a worker");
        self.begin_attempt(&action, reason, now);
        let timeout = self.cfg.timeout;
        let task = tokio::spawn(async move { super::run(action, None, timeout).await });
        self.worker.state = WorkerState::Running {
            started: now,
            pid,
            task,
        };
    }

    /// Whether a worker is being replaced (the composer keeps evaluating every tick).
    pub fn replacing_worker(&self) -> bool {
        !matches!(self.worker.state, WorkerState::Idle)
    }

    fn worker_failed(&mut self, e: HealError, started: Instant, now: Instant) {
        // The action's own failure is its `error`; a judgement of its effect is its `why`.
        let (why, error) = if e.of_the_action() {
            (None, Some(e.to_string()))
        } else {
            (Some(e.to_string()), None)
        };
        self.finish_last(HealOutcome::Failed, why, error, started, now);
        self.log.total_failed += 1;
        self.worker.state = WorkerState::Idle;
    }
}

/// The worker's state now: None once it is gone or a zombie (dead, waiting for its master to
/// reap it), or when the pid names another process.
fn alive(t: &Target) -> Option<char> {
    process::stat(t.pid)
        .filter(|s| s.start == t.start && s.state != 'Z' && s.state != 'X')
        .map(|s| s.state)
}

fn signal(pid: u32, sig: i32) -> std::io::Result<()> {
    let pid =
        i32::try_from(pid).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // The pid was checked against its start time just before.
    crate::sys::kill(pid, sig)
}

/// Polls `f` every POLL until it holds or `within` passes.
async fn until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The master's children that hold the listener.
fn serving_children(t: &Target) -> Vec<u32> {
    process::children(t.master)
        .into_iter()
        .filter(|&c| net::socket_inodes(c).contains(&t.listener))
        .collect()
}

/// Stops the worker and waits for its master's replacement. The text says what happened.
pub async fn replace(t: Target, timeout: Duration) -> Result<String, WorkerError> {
    let started = Instant::now();
    alive(&t).ok_or(WorkerError::Changed(t.pid))?;
    match process::stat(t.master) {
        None => return Err(WorkerError::MasterUnable(t.master, "gone".into())),
        Some(m) => {
            if let Some(why) = process::frozen_why(t.master, m.state) {
                return Err(WorkerError::MasterUnable(t.master, why.into()));
            }
        }
    }
    let before = serving_children(&t);
    signal(t.pid, libc::SIGTERM).map_err(|e| WorkerError::Signal(t.pid, e))?;
    // A stopped worker acts on nothing but SIGKILL until continued; continued, it may finish
    // the requests it holds while it shuts down.
    let _ = signal(t.pid, libc::SIGCONT);
    let how = if until(TERM_GRACE, || alive(&t).is_none()).await {
        format!(
            "exited on SIGTERM in {:.1}s",
            started.elapsed().as_secs_f64()
        )
    } else {
        if alive(&t).is_some() {
            signal(t.pid, libc::SIGKILL).map_err(|e| WorkerError::Signal(t.pid, e))?;
        }
        if !until(KILL_WAIT, || alive(&t).is_none()).await {
            return Err(WorkerError::WouldNotDie(t.pid));
        }
        format!(
            "killed with SIGKILL after {:.1}s of SIGTERM",
            TERM_GRACE.as_secs_f64()
        )
    };
    let mut new = None;
    let left = timeout.saturating_sub(started.elapsed());
    until(left, || {
        new = serving_children(&t)
            .into_iter()
            .find(|c| *c != t.pid && !before.contains(c));
        new.is_some()
    })
    .await;
    let Some(new) = new else {
        return Err(WorkerError::NoReplacement {
            pid: t.pid,
            how,
            master: t.master,
            timeout,
        });
    };
    Ok(format!(
        "worker {} {how}; master {} started worker {new} ({:.1}s in all)",
        t.pid,
        t.master,
        started.elapsed().as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> WorkerView {
        WorkerView {
            pid: 4242,
            command: "puma: cluster worker 1: 4200".into(),
            parent: 4200,
            parent_holds_listener: true,
            parent_unable: None,
            is_master: false,
            frozen: Some("stopped".into()),
            frozen_ms: 0,
            workers: 2,
            unanswered: 2,
            oldest_unanswered_ms: 900,
            last_sent_ms: None,
            cpu_percent: None,
            outbound_waiting: 0,
            start: 777,
            listener: 99,
        }
    }

    #[test]
    fn the_safety_rules() {
        let ok = |w: &WorkerView| may_replace(w, true, false, true);
        assert_eq!(
            ok(&worker()),
            Ok(Target {
                pid: 4242,
                start: 777,
                master: 4200,
                listener: 99
            })
        );
        let master = WorkerView {
            is_master: true,
            ..worker()
        };
        assert_eq!(ok(&master), Err(Refusal::Master(4242)), "never the master");
        let orphan = WorkerView {
            parent_holds_listener: false,
            ..worker()
        };
        assert!(
            matches!(ok(&orphan), Err(Refusal::NoMaster { parent: 4200, .. })),
            "never a process whose parent does not hold the listener"
        );
        let under_init = WorkerView {
            parent: 1,
            ..worker()
        };
        assert!(matches!(ok(&under_init), Err(Refusal::NoMaster { .. })));
        let under_agent = WorkerView {
            parent: std::process::id(),
            ..worker()
        };
        assert!(matches!(ok(&under_agent), Err(Refusal::NoMaster { .. })));
        let master_stopped = WorkerView {
            parent_unable: Some("stopped".into()),
            ..worker()
        };
        assert_eq!(
            ok(&master_stopped),
            Err(Refusal::MasterUnable(4200, "stopped".into())),
            "a stuck master cannot start a replacement: the hang rules apply"
        );
        assert_eq!(
            may_replace(&worker(), true, false, false),
            Err(Refusal::Budget),
            "the budget"
        );
        assert_eq!(may_replace(&worker(), true, true, true), Err(Refusal::Busy));
        assert_eq!(
            may_replace(&worker(), false, false, true),
            Err(Refusal::Off)
        );
    }

    fn report(w: Option<WorkerView>) -> WebReport {
        WebReport {
            verdict: if w.is_some() {
                WebVerdict::PartialHang
            } else {
                WebVerdict::Up
            },
            detail: "process 4242 stopped".into(),
            stuck_worker: w,
            ..WebReport::not_configured()
        }
    }

    fn healer(max: u32, replace_workers: bool) -> Healer {
        Healer::new(
            crate::config::HealConfig {
                max_restarts: max,
                replace_workers,
                ..crate::config::HealConfig::default()
            },
            crate::config::WebConfig::default(),
            None,
        )
    }

    /// A pre-fork master in a few lines of Perl (perl-base is in every Debian): it listens,
    /// forks two workers that inherit the listener, and forks a new one whenever one dies.
    const MASTER: &str = r#"
        use Socket;
        socket(my $s, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
        bind($s, pack_sockaddr_in(0, inet_aton("127.0.0.1"))) or die "bind: $!";
        listen($s, 16) or die "listen: $!";
        my %kids;
        $SIG{TERM} = sub { kill "KILL", keys %kids; exit 0 };
        sub spawn { my $p = fork(); if ($p == 0) { sleep 1 while 1; exit 0 } $kids{$p} = 1 }
        spawn(); spawn();
        while (1) { my $p = waitpid(-1, 0); if ($p > 0) { delete $kids{$p}; spawn() } }
    "#;

    /// Kills the master (and with it its workers) however the test ends.
    struct Master(std::process::Child);

    impl Drop for Master {
        fn drop(&mut self) {
            let _ = signal(self.0.id(), libc::SIGTERM);
            let _ = self.0.wait();
        }
    }

    fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(Instant::now() < end, "{what} within 5s");
            std::thread::sleep(POLL);
        }
    }

    /// A real process tree: one worker of a master that replaces its workers is stopped and
    /// replaced; the attempt is logged, counted against the budget, and recovered once the
    /// verdict has left `partial_hang`.
    #[tokio::test]
    async fn a_stopped_worker_is_replaced_by_its_master() {
        let master = Master(
            std::process::Command::new("perl")
                .args(["-e", MASTER])
                .spawn()
                .expect("perl"),
        );
        let m = master.0.id();
        let workers = wait_for("two workers", || {
            let c = process::children(m);
            (c.len() == 2).then_some(c)
        });
        let listener = wait_for("the master's listener", || {
            net::socket_inodes(m)
                .into_iter()
                .find(|i| net::socket_inodes(workers[0]).contains(i))
        });
        let stuck = workers[0];
        signal(stuck, libc::SIGSTOP).unwrap();
        let w = WorkerView {
            pid: stuck,
            parent: m,
            start: process::stat(stuck).unwrap().start,
            listener,
            ..worker()
        };
        let mut h = healer(3, true);
        let t0 = Instant::now();
        h.replace_worker(&report(Some(w.clone())), t0);
        assert!(h.replacing_worker());
        while h.log().attempts.back().unwrap().outcome == HealOutcome::Running {
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", h.log());
            tokio::time::sleep(POLL).await;
            h.replace_worker(&report(Some(w.clone())), Instant::now());
        }
        let a = h.log().attempts.back().cloned().unwrap();
        assert_eq!(a.outcome, HealOutcome::Waiting, "{a:?}");
        let out = a.output.unwrap_or_default();
        assert!(out.contains(&format!("master {m} started worker")), "{out}");
        assert!(process::stat(stuck).is_none_or(|s| s.state == 'Z'), "{out}");
        let now = process::children(m);
        assert!(now.len() == 2 && now.contains(&workers[1]) && !now.contains(&stuck));
        h.replace_worker(&report(None), Instant::now());
        let log = h.log();
        assert_eq!(log.attempts.back().unwrap().outcome, HealOutcome::Recovered);
        assert_eq!((log.total_attempts, log.total_recovered), (1, 1));
        assert_eq!(log.restarts_in_window, 1, "counted in the restart budget");

        let mut orphan = w.clone();
        orphan.parent_holds_listener = false;
        h.replace_worker(&report(Some(orphan)), Instant::now());
        assert_eq!(h.log().total_attempts, 1, "no master: left alone");
        let mut off = healer(1, false);
        off.replace_worker(&report(Some(worker())), Instant::now());
        assert_eq!(off.log().total_attempts, 0, "replace_workers off");
    }

    #[tokio::test]
    async fn the_budget_bounds_replacements() {
        let mut h = healer(1, true);
        // A worker that does not exist: the attempt runs and fails at once, and uses the
        // budget's one restart.
        let gone = WorkerView {
            pid: u32::MAX - 1,
            parent: u32::MAX - 2,
            ..worker()
        };
        h.replace_worker(&report(Some(gone.clone())), Instant::now());
        for _ in 0..100 {
            if !h.replacing_worker() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            h.replace_worker(&report(Some(gone.clone())), Instant::now());
        }
        let log = h.log();
        assert_eq!((log.total_attempts, log.total_failed), (1, 1), "{log:?}");
        assert!(log.attempts[0].action.contains("replace worker"), "{log:?}");
        h.replace_worker(&report(Some(gone)), Instant::now());
        assert_eq!(h.log().total_attempts, 1, "the budget is spent");
    }
}
