//! The cells of section 6's tables, from the `/health` answers and the load's counts.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path, time::Duration};

use health_agent_tests::{HealthSample, LoadStats};

pub(super) fn heal_attempts(samples: &[HealthSample]) -> u64 {
    samples
        .iter()
        .filter_map(|s| s.body["details"]["heal"]["total_attempts"].as_u64())
        .max()
        .unwrap_or(0)
}

/// "200 slow: 1480, 200 up: 12" — answers by (code, webserver verdict), most frequent first.
pub(super) fn by_verdict<'a>(samples: impl IntoIterator<Item = &'a HealthSample>) -> String {
    let mut counts = BTreeMap::<(u16, String), u64>::new();
    for s in samples {
        let key = if s.error.is_some() {
            (0, "no answer".to_string())
        } else {
            (s.code, s.webserver.clone())
        };
        *counts.entry(key).or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|((code, verdict), n)| {
            if *code == 0 {
                format!("{verdict}: {n}")
            } else {
                format!("{code} {verdict}: {n}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What must not happen once the agent has said `healthy` for the first time (at `from`): 503
/// answers, and polls it did not answer. The 503s before it are the agent's start (`booting`
/// until its first probe of the backend came back), counted apart.
pub(super) struct Failures {
    pub(super) n503: usize,
    pub(super) no_answer: usize,
    pub(super) booting: usize,
}

impl Failures {
    pub(super) fn of(samples: &[HealthSample], from: Duration) -> Self {
        let after = || samples.iter().filter(move |s| s.at >= from);
        Self {
            n503: after().filter(|s| s.code == 503).count(),
            no_answer: after().filter(|s| s.error.is_some()).count(),
            booting: samples
                .iter()
                .filter(|s| s.at < from && s.code == 503)
                .count(),
        }
    }

    /// The table row.
    pub(super) fn row(&self) -> String {
        let mut notes = Vec::new();
        if self.no_answer > 0 {
            notes.push(format!("plus {} polls without an answer", self.no_answer));
        }
        if self.booting > 0 {
            notes.push(format!(
                "not counted: {} × 503 `booting` while the agent's first probe was in flight",
                self.booting
            ));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        format!(
            "| 503 answers from the first `healthy` on{notes} | **{}** | 0 {} |",
            self.n503,
            check(self.n503 == 0 && self.no_answer == 0)
        )
    }
}

/// The 503 answers after `from`, each with its verdict and `details.web.detail`, for the
/// printed report.
pub(super) fn describe_503s(samples: &[HealthSample], from: Duration) -> String {
    let mut out = String::new();
    for s in samples.iter().filter(|s| s.at >= from && s.code == 503) {
        let _ = writeln!(
            out,
            "  {s}\n    web.detail: {}\n    reasons: {}",
            s.web()["detail"].as_str().unwrap_or("-"),
            s.body["reasons"]
        );
    }
    out
}

/// The run as stretches of one verdict, each with the `details.web.detail` and the reasons of
/// its first answer: why the agent said what it said.
pub(super) fn stretches(samples: &[HealthSample]) -> String {
    let key = |s: &HealthSample| {
        (
            s.code,
            s.status.clone(),
            s.webserver.clone(),
            s.database.clone(),
            s.recommendation.clone(),
        )
    };
    let mut out = String::new();
    let mut last = None;
    for s in samples {
        if last.as_ref() != Some(&key(s)) {
            let _ = writeln!(
                out,
                "  t={:6.1}s  {} {} webserver={}: {}\n             reasons: {}",
                s.at.as_secs_f64(),
                s.code,
                s.status,
                s.webserver,
                s.web()["detail"].as_str().unwrap_or("-"),
                s.body["reasons"]
            );
            last = Some(key(s));
        }
    }
    out
}

pub(super) fn healthy(s: &HealthSample) -> bool {
    s.code == 200 && s.status == "healthy"
}

/// When the answers after `from` turned `healthy` for the rest of the run: the first of the
/// unbroken healthy ones at its end. None when the last answer is not healthy.
pub(super) fn settled(samples: &[HealthSample], from: Duration) -> Option<Duration> {
    let after: Vec<&HealthSample> = samples.iter().filter(|s| s.at >= from).collect();
    let unhealthy_tail = after.iter().rposition(|s| !healthy(s));
    let first = unhealthy_tail.map_or(0, |i| i + 1);
    after.get(first).map(|s| s.at)
}

pub(super) fn merge(total: &mut LoadStats, s: LoadStats) {
    for (code, n) in s.by_status {
        *total.by_status.entry(code).or_default() += n;
    }
    total.timeouts += s.timeouts;
    total.errors += s.errors;
    total.connections += s.connections;
    total.reconnects += s.reconnects;
    total.server_closes += s.server_closes;
    total.max_latency = total.max_latency.max(s.max_latency);
    total.elapsed += s.elapsed;
    if s.last_error.is_some() {
        total.last_error = s.last_error;
    }
}

/// "120×200, 0 timeouts, 0 errors, slowest 11.9 s" — what the clients got.
pub(super) fn answers(s: &LoadStats) -> String {
    let slowest = if s.max_latency < Duration::from_secs(1) {
        format!("{} ms", s.max_latency.as_millis())
    } else {
        format!("{:.1} s", s.max_latency.as_secs_f64())
    };
    format!("{}, slowest {slowest}", counts(s))
}

/// "120×200, 0 timeouts, 0 errors".
pub(super) fn counts(s: &LoadStats) -> String {
    let mut out = String::new();
    for (code, n) in &s.by_status {
        let _ = write!(out, "{n}×{code}, ");
    }
    if s.by_status.is_empty() {
        out.push_str("no answers, ");
    }
    let _ = write!(out, "{} timeouts, {} errors", s.timeouts, s.errors);
    out
}

/// The difference of two snapshots of one load: what it got between them (counts only: the
/// slowest answer is not known per stretch).
pub(super) fn between(earlier: &LoadStats, later: &LoadStats) -> LoadStats {
    let mut d = later.clone();
    for (code, n) in &earlier.by_status {
        if let Some(m) = d.by_status.get_mut(code) {
            *m = m.saturating_sub(*n);
        }
    }
    d.by_status.retain(|_, n| *n > 0);
    d.timeouts = d.timeouts.saturating_sub(earlier.timeouts);
    d.errors = d.errors.saturating_sub(earlier.errors);
    d.connections = d.connections.saturating_sub(earlier.connections);
    d
}

/// The table row both scenarios end with: no restart may have happened.
pub(super) fn restarts_row(restarted: usize, attempts: u64) -> String {
    format!(
        "| restarts: `restart_command` runs / `details.heal.total_attempts` | **{restarted} / {attempts}** | 0 {} |",
        check(restarted == 0 && attempts == 0)
    )
}

pub(super) fn check(ok: bool) -> &'static str {
    if ok {
        "✓"
    } else {
        "✗"
    }
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
