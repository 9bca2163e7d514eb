//! Server-side latency (request read → first response byte) over a sliding window, from the
//! kernel's cumulative log-scale histogram.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use health_common::{latency_bucket_floor, LatencyHist, LATENCY_BUCKETS};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct LatencySummary {
    pub samples: u64,
    #[serde(serialize_with = "crate::text::shown::ms")]
    pub p50_ms: f64,
    #[serde(serialize_with = "crate::text::shown::ms")]
    pub p90_ms: f64,
    #[serde(serialize_with = "crate::text::shown::ms")]
    pub p95_ms: f64,
    #[serde(serialize_with = "crate::text::shown::ms")]
    pub p99_ms: f64,
}

/// Cumulative histograms as read each round; the difference to the one a window ago is the
/// window's histogram.
#[derive(Debug, Default)]
pub struct LatencyWindow {
    ring: VecDeque<(Instant, LatencyHist)>,
}

impl LatencyWindow {
    /// Adds the cumulative histogram read at `now` and returns the percentiles over the last
    /// `window` (everything since start until a full window has passed). The baseline is the
    /// newest reading at least a window old, however far apart the readings come: every tick
    /// while the backend is watched closely, every `checks.interval` otherwise.
    pub fn push(
        &mut self,
        now: Instant,
        cumulative: LatencyHist,
        window: Duration,
    ) -> LatencySummary {
        self.ring.push_back((now, cumulative));
        while self
            .ring
            .get(1)
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= window)
        {
            self.ring.pop_front();
        }
        let hist = match self.ring.front() {
            Some((t, h)) if now.saturating_duration_since(*t) >= window => {
                hist_delta(&cumulative, h)
            }
            _ => cumulative,
        };
        percentiles(&hist)
    }
}

pub fn percentiles(h: &LatencyHist) -> LatencySummary {
    let samples: u64 = h.buckets.iter().sum();
    if samples == 0 {
        return LatencySummary::default();
    }
    let at = |q: f64| -> f64 {
        let rank = ((samples as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in h.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                // Report the middle of the bucket: its floor and the next bucket's floor.
                let lo = latency_bucket_floor(i) as f64;
                let hi = if i + 1 < LATENCY_BUCKETS {
                    latency_bucket_floor(i + 1) as f64
                } else {
                    lo
                };
                return ((lo + hi) / 2.0 / 1000.0 * 100.0).round() / 100.0;
            }
        }
        0.0
    };
    LatencySummary {
        samples,
        p50_ms: at(0.50),
        p90_ms: at(0.90),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
    }
}

fn hist_delta(now: &LatencyHist, then: &LatencyHist) -> LatencyHist {
    let mut d = LatencyHist::default();
    for i in 0..LATENCY_BUCKETS {
        d.buckets[i] = now.buckets[i].saturating_sub(then.buckets[i]);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::latency_bucket;

    #[test]
    fn percentiles_from_buckets() {
        let mut h = LatencyHist::default();
        for _ in 0..98 {
            h.buckets[latency_bucket(1_000)] += 1; // 1 ms
        }
        h.buckets[latency_bucket(100_000)] += 2; // 100 ms
        let p = percentiles(&h);
        assert_eq!(p.samples, 100);
        assert!((0.8..1.3).contains(&p.p50_ms), "{p:?}");
        assert!((0.8..1.3).contains(&p.p95_ms), "{p:?}");
        assert!((80.0..130.0).contains(&p.p99_ms), "{p:?}");
    }

    #[test]
    fn the_window_forgets_old_requests_however_often_it_is_read() {
        let s = Duration::from_secs(1);
        for every in [1u32, 2, 5] {
            let t0 = Instant::now();
            let mut w = LatencyWindow::default();
            let mut h = LatencyHist::default();
            h.buckets[latency_bucket(1_000_000)] += 10; // ten 1 s requests before the first read
            assert_eq!(w.push(t0, h, 60 * s).samples, 10);
            // Five fast requests come at 30 s; read every `every` seconds.
            for i in (every..=100).step_by(every as usize) {
                if i == 30 {
                    h.buckets[latency_bucket(1_000)] += 5;
                }
                let p = w.push(t0 + i * s, h, 60 * s);
                let want = match i {
                    ..=29 => 10,
                    // Until a full window has passed: all since start.
                    30..=59 => 15,
                    // Then the slow ones, older than the window, are gone…
                    60..=89 => 5,
                    // …and so, a window after they came, are the fast ones.
                    _ => 0,
                };
                assert_eq!(p.samples, want, "every {every}s, at {i}s: {p:?}");
            }
        }
    }
}
