//! What the judge remembers of the probe, which runs on its own cadence: its latest result on
//! the backend, the agent's own trouble making it (never evidence), since when it has failed,
//! when it last passed, and how many the backend answered.

use std::time::{Duration, Instant};

use crate::checks::probe::ProbeResult;

#[derive(Debug, Default)]
pub struct Probed {
    /// The latest result on the backend; None after the agent's own failure to probe.
    latest: Option<ProbeResult>,
    /// The latest probe the agent itself could not make (no descriptors, no local port): shown,
    /// never evidence.
    trouble: Option<ProbeResult>,
    /// Since when the probe has failed (not set up wrong: that runs no clock).
    failing_since: Option<Instant>,
    /// When a probe last passed.
    passed_at: Option<Instant>,
    /// Probes the backend answered so far, whatever the status.
    answered: u64,
    /// When the backend last answered one, whatever the status.
    answered_at: Option<Instant>,
}

impl Probed {
    /// Takes in a result at `now`.
    pub fn record(&mut self, p: ProbeResult, now: Instant) {
        if p.agent_error {
            // The agent's own failure: it knows nothing new about the backend, and what it
            // knew before is no longer current.
            tracing::warn!(
                "the probe could not be made: {} (the agent's own error, not the backend's)",
                p.error.as_deref().unwrap_or("?")
            );
            self.latest = None;
            self.failing_since = None;
            self.trouble = Some(p);
            return;
        }
        self.trouble = None;
        let answered = p.status.is_some();
        self.answered += u64::from(answered);
        if answered {
            self.answered_at = Some(now);
        }
        if p.ok {
            self.failing_since = None;
            self.passed_at = Some(now);
        } else if p.misconfigured.is_some() {
            // Set up wrong, not failing: no clock runs against the backend.
            self.failing_since = None;
        } else if self.failing_since.is_none() {
            self.failing_since = Some(now);
        }
        self.latest = Some(p);
    }

    /// The latest result on the backend.
    pub fn latest(&self) -> Option<&ProbeResult> {
        self.latest.as_ref()
    }

    /// The agent's own trouble making the latest probe.
    pub fn trouble(&self) -> Option<&ProbeResult> {
        self.trouble.as_ref()
    }

    /// What a report shows: the latest result, else the agent's trouble.
    pub fn shown(&self) -> Option<ProbeResult> {
        self.latest.clone().or_else(|| self.trouble.clone())
    }

    /// How long the probe has failed by `now`.
    pub fn failing_for(&self, now: Instant) -> Option<Duration> {
        self.failing_since.map(|s| now.saturating_duration_since(s))
    }

    /// Whether the probe fails (its failing clock runs).
    pub fn failing(&self) -> bool {
        self.failing_since.is_some()
    }

    /// When a probe last passed.
    pub fn passed_at(&self) -> Option<Instant> {
        self.passed_at
    }

    /// What the watching of the port needs of the probe (see `ProbeSight`).
    pub fn sight(&self) -> super::port::ProbeSight {
        super::port::ProbeSight {
            failing: self.failing(),
            status: self.latest.as_ref().and_then(|p| p.status),
            class: self.class(),
            answered: self.answered,
            answered_at: self.answered_at,
            passed_at: self.passed_at,
        }
    }

    /// The status class of the latest answer (2 before any): the probe path's answers come
    /// off it in the figures.
    pub fn class(&self) -> usize {
        self.latest
            .as_ref()
            .and_then(|p| p.status)
            .map_or(2, |s| usize::from(s / 100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: Option<u16>, ok: bool) -> ProbeResult {
        ProbeResult {
            ok,
            status,
            ..ProbeResult::default()
        }
    }

    #[test]
    fn the_failing_clock_runs_from_the_first_failure_and_stops_at_a_pass() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut p = Probed::default();
        p.record(result(Some(200), true), t0);
        assert_eq!((p.passed_at(), p.failing_for(t0)), (Some(t0), None));
        p.record(result(Some(503), false), t0 + s);
        assert_eq!(p.sight().answered_at, Some(t0 + s), "a 503 went out");
        p.record(result(None, false), t0 + 2 * s);
        assert_eq!(
            p.sight().answered_at,
            Some(t0 + s),
            "no answer: none went out"
        );
        assert_eq!(
            p.failing_for(t0 + 3 * s),
            Some(2 * s),
            "from the first failure"
        );
        assert_eq!(
            (p.sight().answered, p.class()),
            (2, 2),
            "the latest had no status"
        );
        p.record(result(Some(200), true), t0 + 4 * s);
        assert_eq!(p.failing_for(t0 + 5 * s), None);
    }

    #[test]
    fn the_agents_own_trouble_is_shown_and_forgets_what_was_known() {
        let t0 = Instant::now();
        let mut p = Probed::default();
        p.record(result(Some(503), false), t0);
        let trouble = ProbeResult {
            agent_error: true,
            error: Some("no local port".into()),
            ..ProbeResult::default()
        };
        p.record(trouble, t0 + Duration::from_secs(1));
        assert_eq!(
            p.sight().answered_at,
            Some(t0),
            "the agent's trouble: none went out"
        );
        assert!(p.latest().is_none() && p.failing_for(t0).is_none());
        assert_eq!(
            p.shown().and_then(|r| r.error).as_deref(),
            Some("no local port")
        );
        let misconfigured = ProbeResult {
            status: Some(404),
            misconfigured: Some("web.probe_path: 404".into()),
            ..ProbeResult::default()
        };
        p.record(misconfigured, t0 + Duration::from_secs(2));
        assert_eq!(p.sight().answered_at, Some(t0 + Duration::from_secs(2)));
        assert!(p.trouble().is_none());
        assert_eq!(
            (p.failing_for(t0), p.class()),
            (None, 4),
            "set up wrong: no clock"
        );
    }
}
