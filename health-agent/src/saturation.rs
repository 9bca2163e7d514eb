//! Saturation S: how full this instance is, as one number auto-scaling can act on (0 idle, 1.0
//! at capacity, above 1 overloaded, never capped). Owns the estimator — a pure window of
//! per-tick kernel counters — and the report `/health`, `/metrics` and CloudWatch show.
//!
//! The web part is the *offered* load ρ = λ·E[S]/c:
//! - λ counts connections as their handshakes complete (they arrive whether or not a worker is
//!   free), and the later requests of keep-alive connections as the server reads them (what a
//!   load balancer sends); never completions, which cap at capacity and would hide overload;
//! - work is counted per request (exchange: request read → answer begun), not per connection,
//!   so a keep-alive connection's every request is in service from its read to its answer;
//! - E[S] is the worker time one request takes: the busy-worker seconds of the window (at each
//!   tick `min(requests read and unanswered, c)`) per request answered. Work that waits in the
//!   accept queue is not in it, and neither is work a server reads early and queues inside
//!   (the `min` with c), so queueing is never counted as load — "requests in the system / c"
//!   would give about 2.3 for five workers at ρ = 0.9;
//! - c is `web.workers`, or learned: the number of requests in service whenever work kept
//!   waiting in the accept queue for a tick (a server that is full stops taking connections;
//!   keep-alive requests never wait there, so behind a load balancer set `web.workers`).
//!
//! A server whose threads share one core (Ruby's GVL, a single-threaded event loop) runs out of
//! CPU before it runs out of workers, so the backend's own CPU is a part too, in the same
//! offered form: its processes' CPU rate over the CPU they reached when work started to wait
//! (a server short of workers reaches less, and then the part reads like the web part; one
//! that never used a fifth of a core while full is not short of CPU: every core of the host).
//! Host CPU and memory are the last parts; S is the largest.
//!
//! Work blocked on a dependency is not load: while one holds, S is withheld (not published, so
//! target tracking holds capacity), and the ticks just before it was noticed — already blocked
//! — are dropped from the window with the ones during it.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use serde::Serialize;

/// "instant" is averaged over this much of the latest data (one tick alone is noise).
const INSTANT: Duration = Duration::from_secs(5);
/// Less data than this in the window: no estimate yet.
const MIN_SPAN: Duration = Duration::from_secs(1);
/// Counted time a web part needs when the sampled ticks could not see requests in service.
/// One counting window yields two counted ticks: about 0.5 s, a little less when the ticks run
/// early; this lets a span that holds one window give a figure.
const MIN_COUNTED: Duration = Duration::from_millis(400);
/// Requests added to both sides of the offered/served ratio (see `estimate`).
const OFFERED_PRIOR: f64 = 10.0;
/// Answers in the counted ticks from which their service time measures the requests in
/// service (see `estimate`).
const LITTLE_FROM: u64 = 20;
/// Work in service with no answer for this long (or four times the server's mean time in
/// service, when longer) has stalled.
const STALL_AFTER: Duration = Duration::from_secs(1);
/// A server that used less CPU than this (cores) while full was short of workers, not CPU.
const MIN_CPU_LIMIT: f64 = 0.2;
/// Ticks with work waiting needed before a capacity counts as learned.
const LEARN_AFTER: usize = 8;
/// The learned capacity is the median of at most this many recent observations.
const LEARN_KEEP: usize = 240;

/// What one tick read: the kernel's per-port counters and the backend's CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadSample {
    /// Work arrived since the programs loaded: handshakes completed into the accept queue,
    /// plus the later requests of keep-alive connections as they were read.
    pub established: u64,
    /// Requests answered (first response byte of each exchange) since the programs loaded.
    pub answered: u64,
    /// Their server latencies summed, in microseconds (the programs' `exchange_us`).
    pub exchange_us: u64,
    /// Requests read and not yet answered now, on any connection.
    pub pending: u64,
    /// Connections in the accept queue that no process has touched yet, now.
    pub waiting: u64,
    /// CPU seconds of the processes holding the listener (None: could not be read).
    pub backend_cpu_seconds: Option<f64>,
    /// Nothing was counted this tick (`web.socket_tracing = "on_suspicion"` with the programs
    /// detached): `pending` and `waiting` were read from sock_diag, and `established` and
    /// `answered` mean nothing. Such a tick has no arrivals or answers to offer; its requests
    /// in service still measure the load.
    pub sampled: bool,
    /// With `sampled`: whether anything went out on the port's connections since the previous
    /// tick (what a counted tick's answers say).
    pub moved: bool,
    /// With `sampled`: keep-alive requests came back to back within a jiffy, so `pending`
    /// may miss requests in service (sock_diag cannot tell them from answered ones).
    pub unsure: bool,
}

/// One tick's worth of evidence.
#[derive(Debug, Clone, Copy)]
struct Record {
    end: Instant,
    dt: f64,
    arrivals: u64,
    completions: u64,
    /// Seconds of service the requests answered in this tick took (counted ticks only).
    served_s: f64,
    pending: u64,
    cpu_seconds: Option<f64>,
    /// Taken while a dependency fault holds (or just before it was noticed): not load.
    excluded: bool,
    /// Arrivals and completions were not counted (`LoadSample::sampled`).
    sampled: bool,
    /// Its requests in service may be too few (`LoadSample::unsure`).
    unsure: bool,
    /// Taken while work in service stopped moving (nothing answered for far longer than this
    /// server's requests take): left out until it moves again — then it was slow work, and
    /// counts — or a dependency fault is named — then it was blocked, and stays out.
    stalled: bool,
}

/// The per-tick estimator. Pure: time and counters come in, estimates go out.
#[derive(Debug)]
pub struct Meter {
    window: Duration,
    workers: u32,
    host_cores: f64,
    prev: Option<(Instant, LoadSample)>,
    records: VecDeque<Record>,
    /// Work waited in the accept queue at the previous tick.
    waited: bool,
    held: bool,
    /// In service when work kept waiting: what `c` is learned from.
    full_at: VecDeque<u64>,
    /// The backend's CPU seconds and the ticks' lengths at those ticks.
    full_cpu: VecDeque<(f64, f64)>,
    /// The latest tick that saw an answer go out.
    last_answer: Option<Instant>,
}

/// Where the worker count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Configured,
    Learned,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    /// Concurrency the backend serves (`web.workers`, or learned); None while unknown.
    pub workers: Option<u32>,
    pub basis: Basis,
    /// Cores the backend's processes can use: what they used when they ran full (learned),
    /// else the host's.
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub cores: f64,
    pub cores_basis: Basis,
}

/// The web backend's load over a span, as the kernel saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct WebLoad {
    /// Requests arriving per second; None when none of the span was counted (the programs
    /// detached while nothing looked wrong).
    #[serde(serialize_with = "crate::text::shown::hundredths_opt")]
    pub arrivals_per_second: Option<f64>,
    /// Requests answered per second; None likewise.
    #[serde(serialize_with = "crate::text::shown::hundredths_opt")]
    pub answered_per_second: Option<f64>,
    /// Worker time per answered request (E[S]), when the worker count is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::shown::ms_opt")]
    pub service_ms: Option<f64>,
    /// Requests read and unanswered, averaged (in service plus queued inside the server).
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub in_server: f64,
    /// The backend's processes' CPU, in cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::shown::hundredths_opt")]
    pub backend_cpu_cores: Option<f64>,
}

/// The meter's view of one span: the two web parts and what they rest on.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Estimate {
    /// λ·E[S]/c; None while c is unknown.
    pub web: Option<f64>,
    /// The backend's offered CPU over its cores; None without CPU readings.
    pub backend_cpu: Option<f64>,
    pub load: WebLoad,
    pub seconds: f64,
    /// Some of the span's sampled ticks could not tell requests in service (`web` is None
    /// for it).
    pub unsure: bool,
}

impl Meter {
    /// `workers`: `web.workers` (0 = learn it).
    pub fn new(window: Duration, workers: u32, host_cores: usize) -> Self {
        Self {
            window,
            workers,
            host_cores: host_cores.max(1) as f64,
            prev: None,
            records: VecDeque::new(),
            waited: false,
            held: false,
            full_at: VecDeque::new(),
            full_cpu: VecDeque::new(),
            last_answer: None,
        }
    }

    /// How long work in service may go without an answer before it counts as stalled: four
    /// times this server's mean time in service over the window, at least STALL_AFTER.
    fn stall_after(&self) -> Duration {
        let (mut in_server, mut answered) = (0.0, 0u64);
        // Counted ticks only: sampled ones answer nothing, and their requests in service over
        // a counting window's few answers would make a mean of many seconds.
        for r in self
            .records
            .iter()
            .filter(|r| !r.excluded && !r.stalled && !r.sampled)
        {
            in_server += r.pending as f64 * r.dt;
            answered += r.completions;
        }
        let mean = if answered > 0 {
            in_server / answered as f64
        } else {
            0.0
        };
        STALL_AFTER.max(Duration::from_secs_f64((4.0 * mean).min(3600.0)))
    }

    /// Whether a dependency fault holds now (S is withheld): ticks from now on are left out
    /// until it ends, and when it starts the last `lookback` of data goes too — the work was
    /// already blocked while the fault was being recognised.
    pub fn hold(&mut self, now: Instant, held: bool, lookback: Duration) {
        if held && !self.held {
            for r in self.records.iter_mut().rev() {
                if now.saturating_duration_since(r.end) > lookback && !r.stalled {
                    break;
                }
                r.excluded = true;
            }
        }
        self.held = held;
    }

    /// Takes in one tick.
    pub fn tick(&mut self, now: Instant, s: LoadSample) {
        let held = self.held;
        let Some((t0, p)) = self.prev.replace((now, s)) else {
            return;
        };
        let dt = now.saturating_duration_since(t0).as_secs_f64();
        // Counters that went backwards: the programs reloaded or attached afresh; a counted
        // tick after a sampled one has nothing to count from. Start over from here.
        let counted = !s.sampled && !p.sampled;
        if dt <= 0.0
            || (counted && (s.established < p.established || s.answered < p.answered))
            || (!s.sampled && p.sampled)
        {
            return;
        }
        let cpu_seconds = match (s.backend_cpu_seconds, p.backend_cpu_seconds) {
            // Less CPU than before: another set of processes (a restart).
            (Some(a), Some(b)) if a >= b => Some(a - b),
            _ => None,
        };
        let completions = if counted { s.answered - p.answered } else { 0 };
        // Read from sock_diag, work that was not there at the previous read is new, not
        // stuck: between two reads a second apart (quiet reads) the answers that went out on
        // connections opened and closed meanwhile show nowhere.
        let progressed = if s.sampled {
            s.moved || p.pending == 0
        } else {
            completions > 0
        };
        // Work the server holds: read and unanswered, or waiting in the accept queue. Counting
        // programs attached after a freeze began know nothing of the requests already stuck in
        // service (they were read before); what piles up in the accept queue meanwhile shows.
        let holds_work = s.pending > 0 || s.waiting > 0;
        let stalled = if progressed {
            // Read from sock_diag with nothing answered since, the server was last seen free
            // of work at the previous read, not now.
            let seen = if s.sampled && !s.moved { t0 } else { now };
            self.last_answer = Some(seen);
            // It moves again: what stalled was slow work, and counts.
            for r in self.records.iter_mut().rev().take_while(|r| r.stalled) {
                r.stalled = false;
            }
            false
        } else {
            let quiet = self
                .last_answer
                .is_some_and(|t| now.saturating_duration_since(t) > self.stall_after());
            if holds_work && quiet {
                // Back to the last answer: the whole stall, not only its recognised part.
                let since = self.last_answer.unwrap_or(now);
                for r in self.records.iter_mut().rev() {
                    if r.end <= since {
                        break;
                    }
                    r.stalled = true;
                }
                true
            } else {
                self.records.back().is_some_and(|r| r.stalled) && holds_work
            }
        };
        // A tick with work still waiting after a tick with work waiting: the server is full
        // (a healthy one takes a connection within milliseconds while it has a free worker).
        let full = s.waiting > 0 && self.waited && s.pending > 0 && !held && !stalled;
        self.waited = s.waiting > 0;
        if full {
            push_capped(&mut self.full_at, s.pending);
            if let Some(c) = cpu_seconds {
                push_capped(&mut self.full_cpu, (c, dt));
            }
        }
        self.records.push_back(Record {
            end: now,
            dt,
            arrivals: if counted {
                s.established - p.established
            } else {
                0
            },
            completions,
            served_s: if counted {
                s.exchange_us.saturating_sub(p.exchange_us) as f64 / 1e6
            } else {
                0.0
            },
            pending: s.pending,
            cpu_seconds,
            excluded: held,
            sampled: s.sampled,
            unsure: s.sampled && s.unsure,
            stalled,
        });
        while self
            .records
            .front()
            .is_some_and(|r| now.saturating_duration_since(r.end) > self.window)
        {
            self.records.pop_front();
        }
    }

    pub fn capacity(&self) -> Capacity {
        let (workers, basis) = if self.workers > 0 {
            (Some(self.workers), Basis::Configured)
        } else if self.full_at.len() >= LEARN_AFTER {
            let mut v: Vec<f64> = self.full_at.iter().map(|&p| p as f64).collect();
            (Some(median(&mut v).round().max(1.0) as u32), Basis::Learned)
        } else {
            (None, Basis::Unknown)
        };
        // Summed, not a median of ticks: /proc counts CPU in 10 ms steps, a tick is 250 ms.
        let (cpu, t) = self
            .full_cpu
            .iter()
            .fold((0.0, 0.0), |(c, t), (dc, dt)| (c + dc, t + dt));
        let rate = if t > 0.0 { cpu / t } else { 0.0 };
        let (cores, cores_basis) = if self.full_cpu.len() >= LEARN_AFTER && rate >= MIN_CPU_LIMIT {
            (round2(rate.min(self.host_cores)), Basis::Learned)
        } else {
            (self.host_cores, Basis::Unknown)
        };
        Capacity {
            workers,
            basis,
            cores,
            cores_basis,
        }
    }

    /// The estimate over the window (`span = None`) or over the latest `span`.
    pub fn estimate(&self, now: Instant, span: Option<Duration>) -> Option<Estimate> {
        let span = span.unwrap_or(self.window);
        let cap = self.capacity();
        let (mut t, mut a, mut d, mut busy, mut in_server) = (0.0, 0u64, 0u64, 0.0, 0.0);
        let (mut counted_t, mut counted_busy, mut counted_in) = (0.0, 0.0, 0.0);
        // Counted time with every worker in service.
        let mut counted_full = 0.0;
        // The service the counted ticks' answers took (see below).
        let (mut served_in, mut served_busy) = (0.0, 0.0);
        let mut unsure = false;
        // Requests still in service at the end of each run of counted ticks (a counting
        // window): arrived, not yet answered when the window closed.
        let (mut open_at_ends, mut later_counted) = (0u64, false);
        let (mut cpu, mut cpu_t) = (0.0, 0.0);
        let c = cap.workers.map(f64::from);
        for r in self.records.iter().rev() {
            if now.saturating_duration_since(r.end) > span {
                break;
            }
            if r.excluded || r.stalled {
                continue;
            }
            t += r.dt;
            unsure |= r.unsure;
            if !r.sampled {
                counted_t += r.dt;
                a += r.arrivals;
                d += r.completions;
                if !later_counted {
                    open_at_ends += r.pending;
                }
            }
            later_counted = !r.sampled;
            in_server += r.pending as f64 * r.dt;
            if !r.sampled {
                counted_in += r.pending as f64 * r.dt;
                served_in += r.served_s;
            }
            if let Some(c) = c {
                busy += (r.pending as f64).min(c) * r.dt;
                if !r.sampled {
                    counted_busy += (r.pending as f64).min(c) * r.dt;
                    served_busy += r.served_s.min(c * r.dt);
                    if r.pending as f64 >= c {
                        counted_full += r.dt;
                    }
                }
            }
            if let Some(s) = r.cpu_seconds {
                cpu += s;
                cpu_t += r.dt;
            }
        }
        if t < MIN_SPAN.as_secs_f64() {
            return None;
        }
        // Counting windows restart from zero and close with requests in service: those are
        // served after the window, not piling up (a half-second window of 50 ms requests
        // would otherwise read a tenth more offered than served). Counted all along, the one
        // at the end of the span is the window's in service, which its length makes
        // negligible.
        let served = d + open_at_ends;
        // Offered over served: above 1 only while work piles up (or the server stalls). A few
        // counted requests (a half-second counting window at low load: five arrived, eight
        // answered) say nothing of the kind, so the ratio is taken toward 1 by OFFERED_PRIOR
        // requests each side — noise of a handful moves it little, a real pile-up of hundreds
        // shows — and is never below 1: a server draining a backlog is as busy as it reads.
        let offered = ((a as f64 + OFFERED_PRIOR) / (served as f64 + OFFERED_PRIOR)).max(1.0);
        // Requests in service that sock_diag could not see would read as spare workers: then
        // only the counted ticks (the counting windows `on_suspicion` opens) measure them, and
        // without enough of those there is no figure rather than a low one.
        // Counted, the requests in service come from the counters' reading at each tick; but
        // a keep-alive request read as its predecessor's answer went out may not be in it yet,
        // while its latency shows in the service its answer took. With answers enough to
        // speak for the span (requests short against a counting window), that service over the
        // counted time is the requests in service on average (Little's law).
        let (counted_busy, counted_in) = if d >= LITTLE_FROM {
            (served_busy, served_in)
        } else {
            (counted_busy, counted_in)
        };
        let (busy, in_server, t_web) = if unsure {
            (counted_busy, counted_in, counted_t)
        } else {
            (busy, in_server, t)
        };
        // Short of workers, work piles up only while every worker is in service: with one to
        // spare, a server takes a connection at once, and a counting window's surplus of
        // arrivals over answers is the queue's own jitter (27 arrived against 16 answered in
        // half a second at three quarters of capacity). So for the web part the surplus counts
        // for the share of the counted time the workers were full. Short of CPU (threads that
        // share one core), it piles up with workers to spare: the backend's CPU part takes it
        // whole.
        let full = if counted_t > 0.0 {
            counted_full / counted_t
        } else {
            0.0
        };
        let offered_web = 1.0 + (offered - 1.0) * full;
        let web = c
            .filter(|_| t_web >= MIN_COUNTED.as_secs_f64())
            .map(|c| busy / (c * t_web) * offered_web);
        let cpu_rate = (cpu_t > 0.0).then(|| cpu / cpu_t);
        let backend_cpu = cpu_rate.map(|r| r / cap.cores.max(0.01) * offered);
        let load = WebLoad {
            arrivals_per_second: (counted_t > 0.0).then(|| round2(a as f64 / counted_t)),
            answered_per_second: (counted_t > 0.0).then(|| round2(d as f64 / counted_t)),
            service_ms: (d > 0 && c.is_some()).then(|| round2(busy / d as f64 * 1000.0)),
            in_server: if t_web > 0.0 {
                round2(in_server / t_web)
            } else {
                0.0
            },
            backend_cpu_cores: cpu_rate.map(round2),
        };
        Some(Estimate {
            web,
            backend_cpu,
            load,
            seconds: t,
            unsure,
        })
    }
}

/// Two decimals: the figures are ratios and rates, not measurements to the last digit.
fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn push_capped<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == LEARN_KEEP {
        q.pop_front();
    }
    q.push_back(v);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) mod report;
pub use report::{assess, Context, HostLoad, SaturationReport};

#[cfg(test)]
mod tests;
