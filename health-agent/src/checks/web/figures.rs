//! The figures users read about the backend's traffic — request rate, answers by status class,
//! server latency — in both `web.socket_tracing` modes, over `web.latency_window`.
//!
//! - `"always"`: the programs count all along, cut into spans of FIGURES_EVERY: the figures
//!   are exact (`basis: "counted"`).
//! - `"on_suspicion"`: the programs count only while attached — a counting window of under
//!   half a second every 15 s, or a suspicion's spell (cut like `"always"`) — so the figures
//!   are estimates from those spans (`basis: "windows"`), as precise as the requests counted
//!   in them (a Poisson count of n is within about 2/√n of its rate).
//!
//! Each span is what the programs counted from its start to its end: requests read and
//! answered (every request of a keep-alive connection), the latency histogram, and — while the
//! answer programs were attached all through it — the answers by status class. The agent's
//! own probes are left out of the requests, and the probe path's answers out of the classes.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use health_common::{AnswerCounters, LatencyHist, LATENCY_BUCKETS};
use serde::Serialize;

use super::latency::{percentiles, LatencySummary};

/// `"always"`: the counted window is cut into spans this long.
pub const FIGURES_EVERY: Duration = Duration::from_secs(5);
/// Spans kept whatever `web.latency_window` says: with `"on_suspicion"` a window shorter than
/// two counting cadences could hold none.
const MIN_LOOKBACK: Duration = Duration::from_secs(30);
const CLASSES: [&str; 6] = ["0xx", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// What the programs counted over one span.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Span {
    pub seconds: f64,
    /// Requests that arrived — a connection as its handshake completes, and each later
    /// request of a keep-alive connection as it is read —, the agent's own probes left out.
    pub requests: u64,
    /// Exchanges the backend answered (its first response byte sent), the agent's own probes
    /// left out: timed or not (the probe path's answers keep out of the latency).
    pub answered: u64,
    pub latency: LatencyHist,
    /// Answers by status class and the probe path's answers, when the answer programs were
    /// attached all through the span.
    pub answers: Option<(AnswerCounters, u64)>,
}

/// Cumulative readings at the start of a span: the difference at its end is the span.
#[derive(Debug, Clone)]
pub struct Mark {
    pub at: Instant,
    pub requests: u64,
    pub answered: u64,
    pub latency: LatencyHist,
    /// The answer programs' counters, and how many times they had been attached then (a span
    /// they were detached in, even briefly, has no classes).
    pub answers: Option<(AnswerCounters, u64)>,
    /// The agent's probes made so far.
    pub probes: u64,
}

impl Mark {
    /// The span from this mark to `end` (readings of the same counters, later).
    pub fn span_to(&self, end: &Mark, probe_class: usize) -> Option<Span> {
        if end.requests < self.requests {
            // Counters that went back: the programs reloaded. No span.
            return None;
        }
        let mut latency = LatencyHist::default();
        for i in 0..LATENCY_BUCKETS {
            latency.buckets[i] = end.latency.buckets[i].saturating_sub(self.latency.buckets[i]);
        }
        let probes = end.probes.saturating_sub(self.probes);
        let answers = match (&self.answers, &end.answers) {
            (Some((a, n)), Some((b, m))) if n == m => {
                let mut d = AnswerCounters::default();
                for i in 0..6 {
                    d.status[i] = b.status[i].saturating_sub(a.status[i]);
                }
                d.requests = b.requests.saturating_sub(a.requests);
                let probe = b.probe_requests.saturating_sub(a.probe_requests);
                // The probe path's answers come off the class its probe got.
                let c = probe_class.clamp(1, 5);
                d.status[c] = d.status[c].saturating_sub(probe);
                Some((d, probe))
            }
            _ => None,
        };
        Some(Span {
            seconds: end.at.saturating_duration_since(self.at).as_secs_f64(),
            requests: (end.requests - self.requests).saturating_sub(probes),
            answered: end
                .answered
                .saturating_sub(self.answered)
                .saturating_sub(probes),
            latency,
            answers,
        })
    }
}

/// Requests a span must have seen before its few answers say anything (`newest_starved`).
const STARVED_MIN_REQUESTS: u64 = 4;

/// The spans of the latest `web.latency_window`, and the one in progress.
#[derive(Debug, Default)]
pub struct Figures {
    spans: VecDeque<(Instant, Span)>,
    /// Where the span in progress started (the programs attached, or the last cut of an
    /// `"always"` span).
    from: Option<Mark>,
    /// The span in progress ends at the next tick if it began before this (`cut_span_after`).
    cut_after: Option<Instant>,
    /// Every span's latency since the agent started, restarts included: `/metrics`' histogram
    /// (monotonic, as a Prometheus histogram must be).
    total: LatencyHist,
}

/// The figures as `/health`'s details and `/metrics` show them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FiguresReport {
    /// `counted`: the programs counted all of `seconds` (`socket_tracing = "always"`);
    /// `windows`: estimates from the spans they were attached (`"on_suspicion"`).
    pub basis: &'static str,
    /// Spans the figures come from, and how long they counted in all.
    pub windows: usize,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub counted_seconds: f64,
    /// Age of the newest span's end.
    #[serde(serialize_with = "crate::text::shown::hundredths_opt")]
    pub age_seconds: Option<f64>,
    /// The time the spans are taken from (`web.latency_window`).
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub over_seconds: f64,
    /// Requests counted (the agent's probes left out): the estimates' precision.
    pub requests_counted: u64,
    /// Requests arriving per second; None before any span. (Not answers per second: a short
    /// window closes with the answers of its latest requests still to come.)
    #[serde(serialize_with = "crate::text::shown::hundredths_opt")]
    pub requests_per_second: Option<f64>,
    /// Real answers per second by status class (the probe path's left out); None while the
    /// status is not visible or no span had the answer programs attached.
    #[serde(serialize_with = "crate::text::shown::hundredths_map_opt")]
    pub answers_per_second: Option<BTreeMap<&'static str, f64>>,
    /// Server latency (request read → first response byte) over the spans' requests.
    pub latency: Option<LatencySummary>,
    /// Every span's latency histogram since the agent started (`/metrics`).
    #[serde(skip)]
    pub latency_total: LatencyHist,
    /// In words: whether traffic flows, or none was counted.
    pub traffic: String,
}

impl Figures {
    /// One tick of the spans while the connection programs count: the first tick they are
    /// `attached` opens one; it is cut every FIGURES_EVERY, at a `cut_span_after`, and when
    /// they detach (their counts start from zero when they attach and stand still once
    /// detached, so a counting window is one span). `mark`: the readings now, asked only when
    /// a span opens or ends (None: nothing to read them from). `probe_class`: the class the
    /// probe's latest answer had, which the probe path's answers come off.
    pub fn track(
        &mut self,
        now: Instant,
        attached: bool,
        mark: impl FnOnce() -> Option<Mark>,
        probe_class: usize,
        window: Duration,
    ) {
        let cut = match &self.from {
            None => {
                if attached {
                    self.from = mark();
                }
                return;
            }
            Some(from) => {
                !attached
                    || now.saturating_duration_since(from.at) >= FIGURES_EVERY
                    || self.cut_after.is_some_and(|t| from.at < t)
            }
        };
        self.cut_after = None;
        if !cut {
            return;
        }
        let Some(end) = mark() else {
            self.from = None;
            return;
        };
        if let Some(span) = self
            .from
            .as_ref()
            .and_then(|f| f.span_to(&end, probe_class))
        {
            self.record(now, span, window);
        }
        self.from = attached.then_some(end);
    }

    /// The span in progress, counted up to now (`mark`: the readings now, asked only while a
    /// span is open); None while the programs are detached.
    pub fn open_span(
        &self,
        mark: impl FnOnce() -> Option<Mark>,
        probe_class: usize,
    ) -> Option<Span> {
        self.from.as_ref()?.span_to(&mark()?, probe_class)
    }

    /// Ends the span in progress at the next tick if it began before `t`: the figures asked
    /// for answers since `t` (a restart's return, a peer's question) then count from the
    /// next tick, not from the next FIGURES_EVERY.
    pub fn cut_span_after(&mut self, t: Instant) {
        if self.from.as_ref().is_some_and(|f| f.at < t) {
            self.cut_after = Some(t);
        }
    }

    /// Takes in one span that ended at `now`; forgets those older than the lookback.
    pub fn record(&mut self, now: Instant, span: Span, window: Duration) {
        if span.seconds > 0.0 {
            for (sum, b) in self
                .total
                .buckets
                .iter_mut()
                .zip(span.latency.buckets.iter())
            {
                *sum += b;
            }
            self.spans.push_back((now, span));
        }
        let keep = window.max(MIN_LOOKBACK);
        while self
            .spans
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > keep)
        {
            self.spans.pop_front();
        }
    }

    /// Forgets every span (the backend was replaced: its figures are not the new one's).
    pub fn restart(&mut self) {
        self.spans.clear();
    }

    /// The latency of the latest answers, as the peers compare it: the newest spans, newest
    /// first, until they hold `enough` answers — within the latest `window` and among the
    /// spans that began at or after `since` (a restart's return) —, and the seconds those
    /// spans counted. The newest span alone, under any traffic that matters (`"always"` cuts
    /// one every FIGURES_EVERY; `"on_suspicion"` counts one window every 15 s), so a box
    /// that turns slow is compared on its slow answers, not on a median of the minute before.
    /// `open`: the span in progress (counted up to `now`), newest of all.
    pub fn latency_since(
        &self,
        now: Instant,
        window: Duration,
        since: Option<Instant>,
        enough: u64,
        open: Option<&Span>,
    ) -> (LatencyHist, f64, Option<Instant>) {
        let keep = window.max(MIN_LOOKBACK);
        let mut hist = LatencyHist::default();
        let (mut seconds, mut answers) = (0.0, 0);
        let mut began = None;
        let open = open.map(|s| (now, s));
        for (end, s) in open
            .into_iter()
            .chain(self.spans.iter().rev().map(|(e, s)| (*e, s)))
        {
            let start = end.checked_sub(Duration::from_secs_f64(s.seconds));
            let fresh = match (since, start) {
                (None, _) => true,
                (Some(t), Some(start)) => start >= t,
                (Some(_), None) => false,
            };
            if answers >= enough || now.saturating_duration_since(end) > keep || !fresh {
                break;
            }
            seconds += s.seconds;
            began = start.or(Some(end));
            for (sum, b) in hist.buckets.iter_mut().zip(s.latency.buckets.iter()) {
                *sum += b;
                answers += b;
            }
        }
        (hist, seconds, began)
    }

    /// Whether the newest span, ended within `within` of `now`, saw requests arrive and at most
    /// a third of that many answered: a backend starved of answers (or of CPU), whose slow
    /// answers the next span will show.
    pub fn newest_starved(&self, now: Instant, within: Duration) -> bool {
        self.spans.back().is_some_and(|(end, s)| {
            now.saturating_duration_since(*end) <= within
                && s.requests >= STARVED_MIN_REQUESTS
                && s.answered * 3 <= s.requests
        })
    }

    pub fn report(&self, now: Instant, window: Duration, counted: bool) -> FiguresReport {
        let keep = window.max(MIN_LOOKBACK);
        let spans: Vec<&Span> = self
            .spans
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= keep)
            .map(|(_, s)| s)
            .collect();
        let seconds = spans.iter().fold(0.0, |t, s| t + s.seconds);
        let requests: u64 = spans.iter().map(|s| s.requests).sum();
        let mut hist = LatencyHist::default();
        for s in &spans {
            for (sum, b) in hist.buckets.iter_mut().zip(s.latency.buckets.iter()) {
                *sum += b;
            }
        }
        let latency = percentiles(&hist);
        let (mut by_class, mut class_seconds) = ([0u64; 6], 0.0);
        for s in &spans {
            if let Some((a, _)) = &s.answers {
                for (sum, n) in by_class.iter_mut().zip(a.status) {
                    *sum += n;
                }
                class_seconds += s.seconds;
            }
        }
        let rate = |n: u64, t: f64| (t > 0.0).then(|| round2(n as f64 / t));
        let answers_per_second = (class_seconds > 0.0).then(|| {
            (1..6)
                .map(|i| (CLASSES[i], round2(by_class[i] as f64 / class_seconds)))
                .collect()
        });
        let traffic = match rate(requests, seconds) {
            None => "no span counted yet".to_string(),
            Some(_) if requests == 0 => format!(
                "no traffic: no request in {seconds:.1} s counted over the last {:.0} s (the \
                 agent's probes aside)",
                keep.as_secs_f64()
            ),
            Some(r) => format!("{r} requests/s ({requests} counted in {seconds:.1} s)"),
        };
        FiguresReport {
            basis: if counted { "counted" } else { "windows" },
            windows: spans.len(),
            counted_seconds: round2(seconds),
            age_seconds: self
                .spans
                .back()
                .map(|(t, _)| round2(now.saturating_duration_since(*t).as_secs_f64())),
            over_seconds: keep.as_secs_f64(),
            requests_counted: requests,
            requests_per_second: rate(requests, seconds),
            answers_per_second,
            latency: (latency.samples > 0).then_some(latency),
            latency_total: self.total,
            traffic,
        }
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::latency_bucket;

    fn mark(
        at: Instant,
        requests: u64,
        probes: u64,
        answers: Option<(AnswerCounters, u64)>,
    ) -> Mark {
        let mut latency = LatencyHist::default();
        latency.buckets[latency_bucket(20_000)] = requests; // 20 ms each
        Mark {
            at,
            requests,
            answered: requests,
            latency,
            answers,
            probes,
        }
    }

    #[test]
    fn spans_open_at_the_attach_are_cut_every_five_seconds_at_an_ask_and_at_the_detach() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let window = Duration::from_secs(60);
        let mut f = Figures::default();
        let at = |secs: f64, requests: u64| Some(mark(t0 + s.mul_f64(secs), requests, 0, None));
        // Detached: nothing opens, and the readings are never asked for.
        f.track(t0, false, || panic!("no reading while detached"), 2, window);
        let closed = |f: &Figures| {
            f.open_span(|| panic!("no reading: no span open"), 2)
                .is_none()
        };
        assert!(closed(&f));
        f.track(t0, true, || at(0.0, 0), 2, window);
        assert!(
            f.open_span(|| at(0.5, 10), 2).is_some(),
            "open from the attach"
        );
        // Within FIGURES_EVERY: nothing cut, and nothing read.
        f.track(t0 + s, true, || panic!("no cut yet"), 2, window);
        assert_eq!(f.open_span(|| at(2.0, 40), 2).map(|s| s.requests), Some(40));
        f.track(t0 + 5 * s, true, || at(5.0, 100), 2, window);
        let r = f.report(t0 + 5 * s, window, true);
        assert_eq!((r.windows, r.requests_counted), (1, 100), "{r:?}");
        // A peer asks for answers since 6 s: the span begun at 5 s ends at the next tick.
        f.cut_span_after(t0 + 6 * s);
        f.track(t0 + 7 * s, true, || at(7.0, 150), 2, window);
        let r = f.report(t0 + 7 * s, window, true);
        assert_eq!((r.windows, r.requests_counted), (2, 150), "{r:?}");
        // The detach ends the span in progress and opens none.
        f.track(t0 + 8 * s, false, || at(8.0, 170), 2, window);
        assert!(closed(&f));
        assert_eq!(f.report(t0 + 8 * s, window, true).requests_counted, 170);
        // Nothing to read at the cut: the span is dropped, not kept open.
        f.track(t0 + 9 * s, true, || at(9.0, 0), 2, window);
        f.track(t0 + 15 * s, true, || None, 2, window);
        assert!(closed(&f));
    }

    #[test]
    fn windows_give_rates_over_the_time_counted_not_the_time_passed() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Figures::default();
        // Three half-second windows 15 s apart, 50 requests/s, one probe in each.
        for i in 0..3u32 {
            let start = t0 + i * 15 * s;
            let a = mark(start, 0, 10 * u64::from(i), None);
            let b = mark(start + s / 2, 26, 10 * u64::from(i) + 1, None);
            let span = a.span_to(&b, 2).expect("a span");
            f.record(start + s / 2, span, 60 * s);
        }
        let r = f.report(t0 + 31 * s, 60 * s, false);
        assert_eq!(r.basis, "windows");
        assert_eq!(r.windows, 3);
        assert_eq!(r.requests_counted, 75, "the probes are left out: {r:?}");
        assert_eq!(r.requests_per_second, Some(50.0), "{r:?}");
        assert!(
            r.latency
                .as_ref()
                .is_some_and(|l| (15.0..25.0).contains(&l.p50_ms)),
            "{r:?}"
        );
        assert_eq!(
            r.answers_per_second, None,
            "no span had the answer programs: {r:?}"
        );
        assert_eq!(r.age_seconds, Some(0.5));
        // A minute later the windows have aged out: nothing counted, said so.
        let r = f.report(t0 + 100 * s, 60 * s, false);
        assert_eq!((r.windows, r.requests_per_second), (0, None), "{r:?}");
    }

    #[test]
    fn classes_need_the_answer_programs_all_through_the_span_and_leave_the_probe_out() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut before = AnswerCounters::default();
        before.status[2] = 100;
        let mut after = before;
        after.status[2] += 12; // 10 real answers and 2 probes
        after.status[5] += 10;
        after.probe_requests += 2;
        let a = mark(t0, 0, 0, Some((before, 3)));
        let b = mark(t0 + s, 22, 0, Some((after, 3)));
        let mut f = Figures::default();
        f.record(t0 + s, a.span_to(&b, 2).unwrap(), 60 * s);
        let r = f.report(t0 + s, 60 * s, true);
        let classes = r.answers_per_second.expect("classes");
        assert_eq!(
            (classes["2xx"], classes["5xx"]),
            (10.0, 10.0),
            "{classes:?}"
        );
        // Re-attached in between (4 attaches at the end): the counts are not the span's.
        let b = mark(t0 + s, 22, 0, Some((after, 4)));
        assert_eq!(a.span_to(&b, 2).unwrap().answers, None);
    }

    #[test]
    fn no_request_but_the_probes_is_no_traffic_and_says_so() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Figures::default();
        let span = mark(t0, 0, 0, None)
            .span_to(&mark(t0 + s, 1, 1, None), 2)
            .unwrap();
        f.record(t0 + s, span, 60 * s);
        let r = f.report(t0 + s, 60 * s, false);
        assert_eq!(r.requests_per_second, Some(0.0));
        assert!(r.traffic.starts_with("no traffic"), "{r:?}");
    }

    /// Answers the latency leaves out (real traffic on the probe path) are answers all the
    /// same: a backend that answers them is not starved; one that answers a tenth is.
    #[test]
    fn starved_counts_answers_timed_or_not() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Figures::default();
        let mut end = mark(t0 + s, 100, 0, None);
        end.latency = LatencyHist::default();
        f.record(
            t0 + s,
            mark(t0, 0, 0, None).span_to(&end, 2).unwrap(),
            60 * s,
        );
        assert!(!f.newest_starved(t0 + s, s), "100 answered, none timed");
        end.answered = 10;
        f.record(
            t0 + s,
            mark(t0, 0, 0, None).span_to(&end, 2).unwrap(),
            60 * s,
        );
        assert!(f.newest_starved(t0 + s, s), "10 answered of 100");
    }
}
