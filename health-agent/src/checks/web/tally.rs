//! The answers counter `/metrics` exports (`health_agent_web_responses_total`), monotonic in
//! both `web.socket_tracing` modes and honest about how it was made.
//!
//! - `"always"`: the answer programs count every answer; each round adds what the kernel's
//!   counters moved since the round before (`basis: "counted"`, exact).
//! - `"on_suspicion"`: the programs count only in their windows, so a count of what they saw
//!   would read a fraction of the traffic, a different one each time. Each round instead adds
//!   the windows' rate by class times the time since the round before — the adjusted count of
//!   sampled telemetry (`basis: "estimated"`) — so `rate()` over any range reads the windows'
//!   rate. `sample_ratio` says how much of the time the estimate rests on was counted.
//!
//! Reloaded programs (counters that went back) and a replaced backend start no new series: the
//! totals only ever grow.

use std::time::Instant;

use super::figures::FiguresReport;

/// The status classes, by index as the kernel counts them (0 unused).
pub const CLASSES: [&str; 6] = ["", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// Running totals of real answers by class.
#[derive(Debug, Default)]
pub struct Tally {
    /// The kernel's totals at the round before (`"always"`).
    last_counted: Option<[u64; 6]>,
    /// When the round before added its estimate (`"on_suspicion"`).
    last_at: Option<Instant>,
    totals: [f64; 6],
    /// The latest reading (None before the first answers were seen).
    last: Option<TallyReport>,
}

/// What `/metrics` shows of the tally.
#[derive(Debug, Clone, PartialEq)]
pub struct TallyReport {
    /// Real answers by class since the agent started (counted, or estimated).
    pub by_class: [f64; 6],
    /// True for exact counts, false for estimates from the counting windows.
    pub counted: bool,
    /// The share of the time the figures come from that the programs counted (1 counted).
    pub sample_ratio: f64,
}

impl Tally {
    /// One round. `counted_totals`: the kernel's totals by class while the programs count all
    /// along (`"always"`); otherwise the figures' rates are integrated over the time since
    /// the round before.
    pub fn observe(
        &mut self,
        now: Instant,
        counted_totals: Option<[u64; 6]>,
        figures: Option<&FiguresReport>,
    ) -> Option<TallyReport> {
        if let Some(t) = counted_totals {
            let last = self.last_counted.unwrap_or([0; 6]);
            for i in 1..6 {
                // Gone back: the programs reloaded and count from zero again.
                let moved = if t[i] >= last[i] {
                    t[i] - last[i]
                } else {
                    t[i]
                };
                self.totals[i] += moved as f64;
            }
            self.last_counted = Some(t);
            return self.report(true, 1.0);
        }
        let rates = figures.and_then(|f| f.answers_per_second.as_ref());
        let dt = self
            .last_at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.last_at = Some(now);
        let Some((f, rates)) = figures.zip(rates) else {
            return self
                .last
                .is_some()
                .then(|| self.report(false, 0.0))
                .flatten();
        };
        for (i, class) in CLASSES.iter().enumerate().skip(1) {
            self.totals[i] += rates.get(class).copied().unwrap_or(0.0) * dt;
        }
        let ratio = if f.over_seconds > 0.0 {
            (f.counted_seconds / f.over_seconds).min(1.0)
        } else {
            0.0
        };
        self.report(false, ratio)
    }

    /// The latest reading.
    pub fn current(&self) -> Option<TallyReport> {
        self.last.clone()
    }

    fn report(&mut self, counted: bool, sample_ratio: f64) -> Option<TallyReport> {
        self.last = Some(TallyReport {
            by_class: self.totals,
            counted,
            sample_ratio,
        });
        self.last.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{collections::BTreeMap, time::Duration};

    fn figures(rate_2xx: f64) -> FiguresReport {
        FiguresReport {
            basis: "windows",
            windows: 2,
            counted_seconds: 1.0,
            age_seconds: Some(3.0),
            over_seconds: 30.0,
            requests_counted: 100,
            requests_per_second: Some(rate_2xx),
            answers_per_second: Some(BTreeMap::from([("2xx", rate_2xx), ("5xx", 0.0)])),
            latency: None,
            latency_total: Default::default(),
            traffic: String::new(),
        }
    }

    #[test]
    fn counted_totals_grow_by_what_the_kernel_moved_and_survive_a_reload() {
        let mut t = Tally::default();
        let now = Instant::now();
        t.observe(now, Some([0, 0, 10, 0, 0, 1]), None);
        let r = t.observe(now, Some([0, 0, 25, 0, 0, 1]), None).unwrap();
        assert_eq!(r.by_class[2], 25.0);
        assert!(r.counted);
        // The programs reloaded: their counters start from zero again; the total goes on.
        let r = t.observe(now, Some([0, 0, 4, 0, 0, 0]), None).unwrap();
        assert_eq!(r.by_class[2], 29.0);
        assert_eq!(r.by_class[5], 1.0);
    }

    #[test]
    fn windows_rates_are_integrated_over_the_time_between_rounds() {
        let mut t = Tally::default();
        let start = Instant::now();
        assert_eq!(
            t.observe(start, None, None),
            None,
            "nothing before a window"
        );
        for s in 1..=60 {
            t.observe(start + Duration::from_secs(s), None, Some(&figures(100.0)));
        }
        let r = t
            .observe(start + Duration::from_secs(61), None, Some(&figures(100.0)))
            .unwrap();
        // 61 rounds a second apart at 100 answers/s: 6100 answers estimated.
        assert!((r.by_class[2] - 6100.0).abs() < 1e-6, "{r:?}");
        assert!(!r.counted);
        assert!((r.sample_ratio - 1.0 / 30.0).abs() < 1e-9);
        // No figures this round (the backend replaced): the total holds, never goes back.
        let r = t
            .observe(start + Duration::from_secs(62), None, None)
            .unwrap();
        assert!((r.by_class[2] - 6100.0).abs() < 1e-6);
        assert_eq!(r.sample_ratio, 0.0);
    }
}
