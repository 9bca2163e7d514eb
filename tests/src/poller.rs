//! A recorder of every `/health` answer of an agent at any address, for tests that assert over
//! a whole run ("no 503 at any point", "`slow` was seen"), and for `cargo xtask bench`. The one
//! `/health` poller: the tests on 127.0.0.1, the fleet tests on 127.0.0.2…, and the bench
//! (without a time limit) all use [`HealthPoller`].
//!
//! The poller runs on a thread that stops on [`HealthPoller::stop`], on drop (a failing test),
//! and by itself after [`MAX_RUN`] at the latest unless started [`HealthPoller::unbounded`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{load::MAX_RUN, request_at};

/// How often [`HealthPoller`] asks.
pub const POLL_EVERY: Duration = Duration::from_millis(200);

/// One `/health` answer seen by a [`HealthPoller`].
#[derive(Debug, Clone)]
pub struct HealthSample {
    /// Since the poller's origin: its start, or the agent's spawn ([`HealthPoller::start_from`]).
    pub at: Duration,
    /// 0 when there was no answer (see `error`).
    pub code: u16,
    pub status: String,
    pub webserver: String,
    pub database: String,
    pub recommendation: String,
    pub body: Value,
    pub error: Option<String>,
}

impl HealthSample {
    /// A sample from a `/health` answer (code, body text), or why there was none.
    pub fn from_answer(at: Duration, answer: std::io::Result<(u16, String)>) -> Self {
        let (code, body, error) = match answer {
            Ok((code, text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v) => (code, v, None),
                Err(e) => (code, Value::Null, Some(format!("not JSON ({e}): {text}"))),
            },
            Err(e) => (0, Value::Null, Some(format!("GET /health: {e}"))),
        };
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        Self {
            at,
            code,
            status: s(&body["status"]),
            webserver: s(&body["checks"]["webserver"]),
            database: s(&body["checks"]["database"]),
            recommendation: s(&body["recommendation"]),
            body,
            error,
        }
    }

    /// Seconds from `from` (the poller's clock) to this answer; 0 for one before it.
    pub fn after(&self, from: Duration) -> f64 {
        self.at.saturating_sub(from).as_secs_f64()
    }

    /// `body.details.web`.
    pub fn web(&self) -> &Value {
        &self.body["details"]["web"]
    }

    fn key(&self) -> (u16, &str, &str, &str, &str) {
        (
            self.code,
            &self.status,
            &self.webserver,
            &self.database,
            &self.recommendation,
        )
    }
}

impl fmt::Display for HealthSample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.error {
            return write!(f, "t={:6.1}s  no answer: {e}", self.at.as_secs_f64());
        }
        write!(
            f,
            "t={:6.1}s  {} {:<10} webserver={:<12} database={:<13} recommendation={}",
            self.at.as_secs_f64(),
            self.code,
            self.status,
            self.webserver,
            self.database,
            self.recommendation
        )
    }
}

/// The run as lines of equal consecutive answers: `t=  0.2s ..   3.4s  ×17  200 healthy ...`.
pub fn timeline(samples: &[HealthSample]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < samples.len() {
        let mut j = i;
        while j + 1 < samples.len()
            && samples[j + 1].key() == samples[i].key()
            && samples[j + 1].error == samples[i].error
        {
            j += 1;
        }
        out.push_str(&format!(
            "  {} .. {:6.1}s ×{}\n",
            samples[i],
            samples[j].at.as_secs_f64(),
            j - i + 1
        ));
        i = j + 1;
    }
    out
}

/// A `/health` answer with its latency.
#[derive(Debug, Clone)]
pub struct Timed {
    pub sample: HealthSample,
    /// From connect to the end of the answer.
    pub took: Duration,
}

/// Polls an agent's `/health` every 200 ms on its own thread and keeps every answer with its
/// latency.
pub struct HealthPoller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Timed>>>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
    /// The port of `addr`.
    pub port: u16,
    pub addr: SocketAddr,
}

impl HealthPoller {
    /// The agent on 127.0.0.1:`port`.
    pub fn start(port: u16) -> Self {
        Self::start_at(([127, 0, 0, 1], port).into())
    }

    /// The agent at `addr` (127.0.0.2:PORT, say).
    pub fn start_at(addr: SocketAddr) -> Self {
        Self::spawn(addr, Some(MAX_RUN))
    }

    /// The agent at `addr`, its answers timed from `origin` (the agent's spawn, for a test of
    /// the boot: the boot grace counts from there, not from the first answer, which comes only
    /// after the agent's first snapshot).
    pub fn start_from(addr: SocketAddr, origin: Instant) -> Self {
        Self::spawn_every_from(addr, Some(MAX_RUN), POLL_EVERY, origin)
    }

    /// Without the [`MAX_RUN`] limit, for runs longer than a test (the bench's 300 s soak):
    /// it stops only on [`HealthPoller::stop`] or drop.
    pub fn unbounded(addr: SocketAddr) -> Self {
        Self::spawn(addr, None)
    }

    /// The agent at `addr`, asked every `every` (a balancer checking more often than
    /// [`POLL_EVERY`] would see shorter spells).
    pub fn every(addr: SocketAddr, every: Duration) -> Self {
        Self::spawn_every(addr, Some(MAX_RUN), every)
    }

    fn spawn(addr: SocketAddr, limit: Option<Duration>) -> Self {
        Self::spawn_every(addr, limit, POLL_EVERY)
    }

    fn spawn_every(addr: SocketAddr, limit: Option<Duration>, every: Duration) -> Self {
        Self::spawn_every_from(addr, limit, every, Instant::now())
    }

    fn spawn_every_from(
        addr: SocketAddr,
        limit: Option<Duration>,
        every: Duration,
        started: Instant,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (st, sa) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let deadline = limit.map(|l| started + l);
            let mut next = started;
            while !st.load(Ordering::SeqCst) && deadline.is_none_or(|d| Instant::now() < d) {
                let sample = poll_once_at(addr, started);
                if let Ok(mut v) = sa.lock() {
                    v.push(sample);
                }
                next += every;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        });
        Self {
            stop,
            samples,
            thread: Some(thread),
            started,
            port: addr.port(),
            addr,
        }
    }

    /// Time since the poller's origin (the clock of [`HealthSample::at`]).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every answer so far, with latencies.
    pub fn timed(&self) -> Vec<Timed> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Every answer so far.
    pub fn samples(&self) -> Vec<HealthSample> {
        self.timed().into_iter().map(|t| t.sample).collect()
    }

    /// Waits until an answer recorded from now on satisfies `pred` and returns it; panics
    /// after `timeout` with the whole timeline and the last body.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
    ) -> HealthSample {
        self.wait_for_explained(timeout, what, pred, String::new)
    }

    /// [`HealthPoller::wait_for`], adding `explain()` (logs, say) to the panic message.
    pub fn wait_for_explained(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
        explain: impl FnOnce() -> String,
    ) -> HealthSample {
        self.wait_for_from(self.elapsed(), timeout, what, pred, explain)
    }

    /// Waits until an answer recorded at or after `from` (poller clock) satisfies `pred`, and
    /// returns the first such; panics after `timeout` with the timeline, the last body and
    /// `explain()`.
    pub fn wait_for_from(
        &self,
        from: Duration,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&HealthSample) -> bool,
        explain: impl FnOnce() -> String,
    ) -> HealthSample {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = self.samples.lock() {
                if let Some(t) = v.iter().find(|t| t.sample.at >= from && pred(&t.sample)) {
                    return t.sample.clone();
                }
            }
            if Instant::now() >= deadline {
                let all = self.samples();
                panic!(
                    "timed out after {timeout:?} waiting for {what} on the agent at {} (from t={:.1}s); answers:\n{}last body: {}{}",
                    self.addr,
                    from.as_secs_f64(),
                    timeline(&all),
                    all.last()
                        .map(|s| serde_json::to_string_pretty(&s.body).unwrap_or_default())
                        .unwrap_or_default(),
                    explain()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops polling and returns every answer.
    pub fn stop(self) -> Vec<HealthSample> {
        self.stop_timed().into_iter().map(|t| t.sample).collect()
    }

    /// Stops polling and returns every answer with its latency.
    pub fn stop_timed(mut self) -> Vec<Timed> {
        self.halt();
        self.timed()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HealthPoller {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One `GET /health` on `addr`, `started` being the run's start.
fn poll_once_at(addr: SocketAddr, started: Instant) -> Timed {
    let at = started.elapsed();
    let t0 = Instant::now();
    let result = request_at(addr, "GET", "/health", &[], Duration::from_secs(5));
    let took = t0.elapsed();
    Timed {
        sample: HealthSample::from_answer(at, result.map(|(code, _, text)| (code, text))),
        took,
    }
}
