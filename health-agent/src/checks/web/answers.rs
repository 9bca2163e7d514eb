//! What the backend answers, by status class, over `web.errors_window`: the kernel's answer
//! counters (cgroup-skb, see `ebpf::answers`) read every round, kept as a sliding window, and
//! the `erroring` judgement drawn from them.
//!
//! Real answers are the ones the balancer's traffic got: the probe path's requests (the
//! agent's own probe, and a balancer's checks of the same path) are counted apart by the
//! kernel and taken off the class the agent's own probe got. A 4xx is never a fault (bots, 404
//! floods); only the 5xx share of real answers is judged, and only over at least
//! `web.error_min_answers` of them.
//!
//! The judgement holds once made: after a restart (new processes, or none listening) the
//! window starts over, and `erroring` stays until the new answers show the share below the
//! threshold (or no real traffic for a whole window). So a restart is judged by the answers
//! after it, never by the quiet moment before they come.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use health_common::AnswerCounters;
use serde::Serialize;

use crate::config::WebConfig;

/// The peers weigh this instance's latest answers, over this long, against an errors fault
/// of theirs (see `fine_at`).
const RECENT: Duration = Duration::from_secs(1);

/// The status classes' names, by index (0 unused).
const CLASSES: [&str; 6] = ["", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// The answers of one window, as the report shows them (`details.web.answers`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AnswersReport {
    /// Whether the status of the answers can be read (plaintext HTTP/1.x).
    pub status_visible: bool,
    /// Why not, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_visible: Option<String>,
    /// Real answers in the window by class (`1xx` … `5xx`), the probe path's left out.
    pub by_class: std::collections::BTreeMap<&'static str, u64>,
    /// Real answers in the window, every class.
    pub answers: u64,
    /// Their 5xx share (None: no real answer in the window).
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub share_5xx: Option<f64>,
    /// The probe path's answers in the window, left out of the figures above.
    pub probe_answers: u64,
    /// How much time the window covers (less than `errors_window` after a start or a
    /// restart).
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub window_seconds: f64,
    /// `web.error_share` and `web.error_min_answers`, the threshold the share is judged by.
    #[serde(serialize_with = "crate::text::shown::ratio")]
    pub error_share: f64,
    pub min_answers: u32,
    /// Whether the share is judged `erroring` now.
    pub erroring: bool,
    /// Real answers by class since the answer programs loaded (monotonic: `/metrics`).
    pub total_by_class: std::collections::BTreeMap<&'static str, u64>,
}

/// One window's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub by_class: [u64; 6],
    pub probe: u64,
    pub answers: u64,
    pub errors: u64,
    pub tls: u64,
    pub h2: u64,
    pub span: Duration,
}

impl Stats {
    pub fn share(&self) -> Option<f64> {
        (self.answers > 0).then(|| self.errors as f64 / self.answers as f64)
    }

    /// The window's share and count, in words.
    pub fn describe(&self) -> String {
        match self.share() {
            Some(s) => format!(
                "{:.0}% of {} real answers 5xx in {:.0}s",
                s * 100.0,
                self.answers,
                self.span.as_secs_f64()
            ),
            None => "no real answers".into(),
        }
    }
}

/// One round's reading: the kernel's counters, and the probe path's answers taken off each
/// class up to then (each round's new ones in the class the agent's own probe got at that
/// round: a probe that answered 500 during an outage is not a real 500 later).
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    counters: AnswerCounters,
    probe: [u64; 6],
}

#[derive(Debug, Default)]
pub struct AnswerWindow {
    /// Each round's counters, with the probe path's answers attributed by class so far.
    samples: VecDeque<Sample>,
    /// The judgement, held between windows that have too few answers to make one.
    erroring: bool,
    /// Since when the window's evidence runs (the latest start over).
    since: Option<Instant>,
    /// Since when every second's real answers have been mostly 5xx (None: the latest was
    /// not).
    failing_since: Option<Instant>,
    /// The figures the latest judgement rests on: the window's, or a run of failing seconds'.
    basis: Stats,
    /// When the latest second's real answers were last mostly not 5xx (and the window not
    /// erroring): the evidence peers weigh against an errors fault of theirs.
    fine_at: Option<Instant>,
    /// The class the agent's own probe last got (2 until one is known).
    probe_class: usize,
    /// The judgement was made on this window's own answers (enough of them since the latest
    /// start over), not held from before it.
    judged: bool,
    /// Why the status is not visible at all (no answer programs).
    unavailable: Option<String>,
}

/// What the answer programs gave this round.
#[derive(Debug, Clone)]
pub enum Round {
    Counters(AnswerCounters),
    /// The status is not visible (no answer programs), and why: said in `details`.
    Unavailable(String),
}

impl AnswerWindow {
    /// Takes in this round's counters, or why there are none.
    pub fn observe(
        &mut self,
        counters: Round,
        probe_status: Option<u16>,
        now: Instant,
        cfg: &WebConfig,
    ) {
        if let Some(s) = probe_status {
            self.probe_class = usize::from(s / 100).clamp(1, 5);
        }
        let c = match counters {
            Round::Counters(c) => c,
            Round::Unavailable(why) => {
                self.unavailable = Some(why);
                self.samples.clear();
                self.erroring = false;
                return;
            }
        };
        self.unavailable = None;
        self.since.get_or_insert(now);
        // Counters that went back (a slot reused for another port) start the window over.
        let last = self.samples.back().copied();
        let went_back = last.is_some_and(|l| {
            l.counters.answers() > c.answers() || l.counters.requests > c.requests
        });
        if went_back {
            self.samples.clear();
        }
        let mut probe = last.filter(|_| !went_back).map_or([0; 6], |l| l.probe);
        let new_probes = last.filter(|_| !went_back).map_or(0, |l| {
            c.probe_requests.saturating_sub(l.counters.probe_requests)
        });
        probe[self.probe_class()] += new_probes;
        self.samples.push_back(Sample {
            at: now,
            counters: c,
            probe,
        });
        // Keep one sample at or before the window's start, as its base.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| now.saturating_duration_since(s.at) >= cfg.errors_window)
        {
            self.samples.pop_front();
        }
        let min = u64::from(cfg.error_min_answers);
        let failing = |s: &Stats| s.share().is_some_and(|v| v >= cfg.error_share);
        // The latest second: evidence for the peers is of now, not of the window (a shared
        // fault that began a few seconds ago leaves a window still mostly fine while the
        // latest answers fail), and the start of a run of failing seconds.
        let recent = self.stats_since(now.checked_sub(RECENT));
        if recent.answers > 0 {
            if failing(&recent) {
                self.failing_since
                    .get_or_insert(now.checked_sub(RECENT).unwrap_or(now));
            } else {
                self.failing_since = None;
            }
        }
        let stats = self.stats();
        // A run of failing seconds a quarter of the window long judges as the window does:
        // an errors fault is seen in seconds, not only once it fills half the window.
        let run = self
            .failing_since
            .map(|t| self.stats_since(Some(t)))
            .filter(|r| r.span >= cfg.errors_window / 4 && r.answers >= min && failing(r));
        if let Some(run) = run {
            self.erroring = true;
            self.judged = true;
            self.basis = run;
        } else if stats.answers >= min {
            self.erroring = failing(&stats);
            self.judged = true;
            self.basis = stats;
        } else if stats.answers == 0 && stats.span >= cfg.errors_window {
            // A whole window without real traffic: no evidence either way.
            self.erroring = false;
        }
        if !self.erroring && recent.answers > 0 && !failing(&recent) {
            self.fine_at = Some(now);
        }
    }

    /// Starts the window over (a restart: new processes, or none listening). The judgement
    /// holds until the answers after it make a new one.
    pub fn restart(&mut self, now: Instant) {
        if let Some(last) = self.samples.pop_back() {
            self.samples.clear();
            self.samples.push_back(Sample { at: now, ..last });
        }
        self.since = Some(now);
        self.judged = false;
        self.failing_since = None;
    }

    /// The class whose count the probe path's answers are taken off.
    fn probe_class(&self) -> usize {
        if self.probe_class == 0 {
            2
        } else {
            self.probe_class
        }
    }

    /// Real answers by class since the programs loaded.
    fn totals(&self) -> [u64; 6] {
        let mut t = [0; 6];
        if let Some(last) = self.samples.back() {
            for (i, n) in t.iter_mut().enumerate() {
                *n = last.counters.status[i].saturating_sub(last.probe[i]);
            }
        }
        t
    }

    /// The window's figures: the newest sample against the oldest kept.
    pub fn stats(&self) -> Stats {
        self.stats_since(None)
    }

    /// The figures since the latest sample at or before `from` (the oldest kept when None or
    /// older).
    fn stats_since(&self, from: Option<Instant>) -> Stats {
        let base = from.and_then(|from| self.samples.iter().rev().find(|s| s.at <= from));
        let (Some(first), Some(last)) = (base.or(self.samples.front()), self.samples.back()) else {
            return Stats::default();
        };
        let mut by_class = [0u64; 6];
        let mut probe = 0;
        for (i, n) in by_class.iter_mut().enumerate().skip(1) {
            let all = last.counters.status[i].saturating_sub(first.counters.status[i]);
            let probes = last.probe[i].saturating_sub(first.probe[i]).min(all);
            probe += probes;
            *n = all - probes;
        }
        let (a, b) = (&first.counters, &last.counters);
        Stats {
            by_class,
            probe,
            answers: by_class.iter().sum(),
            errors: by_class[5],
            tls: b.tls.saturating_sub(a.tls),
            h2: b.h2.saturating_sub(a.h2),
            span: last.at.saturating_duration_since(first.at),
        }
    }

    pub fn erroring(&self) -> bool {
        self.erroring
    }

    /// The figures the judgement rests on (the window's when no judgement was made yet).
    pub fn basis(&self) -> Stats {
        if self.judged {
            self.basis
        } else {
            self.stats()
        }
    }

    /// Whether the answers fail now: the judgement is `erroring`, or the latest second's were
    /// mostly 5xx.
    pub fn failing(&self) -> bool {
        self.erroring || self.failing_since.is_some()
    }

    /// Whether the judgement rests on enough answers since the latest start over.
    pub fn judged(&self) -> bool {
        self.judged
    }

    /// Real answers by class (index 1–5: 1xx–5xx) since the programs loaded, the probe's taken
    /// off; None while the status is not visible. Monotonic while the same programs count.
    pub fn answered_by_class(&self) -> Option<[u64; 6]> {
        (self.unavailable.is_none() && !self.samples.is_empty()).then(|| self.totals())
    }

    /// Since when the evidence behind the judgement runs (the latest start over).
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    pub fn fine_at(&self) -> Option<Instant> {
        self.fine_at
    }

    pub fn report(&self, cfg: &WebConfig) -> AnswersReport {
        let s = self.stats();
        let not_visible = if let Some(why) = &self.unavailable {
            Some(why.clone())
        } else if s.answers + s.probe == 0 && s.tls > 0 {
            Some("the backend answers in TLS: the status is encrypted".into())
        } else if s.answers + s.probe == 0 && s.h2 > 0 {
            Some("the backend speaks HTTP/2: its status is in compressed frames".into())
        } else {
            None
        };
        AnswersReport {
            status_visible: not_visible.is_none(),
            not_visible,
            by_class: (1..6).map(|i| (CLASSES[i], s.by_class[i])).collect(),
            answers: s.answers,
            share_5xx: s.share().map(|v| (v * 1000.0).round() / 1000.0),
            probe_answers: s.probe,
            window_seconds: (s.span.as_secs_f64() * 10.0).round() / 10.0,
            error_share: cfg.error_share,
            min_answers: cfg.error_min_answers,
            erroring: self.erroring,
            total_by_class: {
                let t = self.totals();
                (1..6).map(|i| (CLASSES[i], t[i])).collect()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(status: [u64; 6], probe_requests: u64) -> Round {
        Round::Counters(AnswerCounters {
            status,
            probe_requests,
            ..AnswerCounters::default()
        })
    }

    fn cfg() -> WebConfig {
        WebConfig {
            errors_window: Duration::from_secs(10),
            error_share: 0.5,
            error_min_answers: 10,
            ..WebConfig::default()
        }
    }

    #[test]
    fn the_probes_answers_are_left_out_and_a_few_answers_judge_nothing() {
        let cfg = cfg();
        let t = Instant::now();
        let mut w = AnswerWindow::default();
        w.observe(counters([0; 6], 0), Some(200), t, &cfg);
        // Five 500s and four probe answers (200): five real answers, all 5xx, too few.
        w.observe(
            counters([0, 0, 4, 0, 0, 5], 4),
            Some(200),
            t + Duration::from_secs(1),
            &cfg,
        );
        let s = w.stats();
        assert_eq!((s.answers, s.errors, s.probe), (5, 5, 4));
        assert!(!w.erroring());
        // Ten more 500s: fifteen real answers, all 5xx.
        w.observe(
            counters([0, 0, 8, 0, 0, 15], 8),
            Some(200),
            t + Duration::from_secs(2),
            &cfg,
        );
        assert!(w.erroring());
        let r = w.report(&cfg);
        assert_eq!(r.answers, 15);
        assert_eq!(r.share_5xx, Some(1.0));
        assert_eq!(r.probe_answers, 8);
        assert!(r.status_visible);
    }

    #[test]
    fn a_4xx_flood_and_a_small_5xx_share_are_never_erroring() {
        let cfg = cfg();
        let t = Instant::now();
        let mut w = AnswerWindow::default();
        w.observe(counters([0; 6], 0), Some(200), t, &cfg);
        // 2 % 5xx, the rest 404s and 200s.
        w.observe(
            counters([0, 0, 480, 0, 500, 20], 0),
            Some(200),
            t + Duration::from_secs(5),
            &cfg,
        );
        assert!(!w.erroring());
        assert_eq!(w.fine_at(), Some(t + Duration::from_secs(5)));
        assert_eq!(w.stats().share(), Some(0.02));
    }

    #[test]
    fn the_window_slides_and_a_restart_holds_the_judgement_until_new_answers_make_one() {
        let cfg = cfg();
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let mut w = AnswerWindow::default();
        w.observe(counters([0; 6], 0), Some(200), at(0), &cfg);
        w.observe(counters([0, 0, 0, 0, 0, 50], 0), Some(200), at(5), &cfg);
        assert!(w.erroring());
        // A restart: nothing new yet, the judgement holds.
        w.restart(at(6));
        w.observe(counters([0, 0, 0, 0, 0, 50], 0), Some(200), at(7), &cfg);
        assert_eq!(w.stats().answers, 0);
        assert!(w.erroring());
        assert_eq!(w.since(), Some(at(6)));
        // The new processes answer 200s: fine.
        w.observe(counters([0, 0, 30, 0, 0, 50], 0), Some(200), at(8), &cfg);
        assert!(!w.erroring());
        // Fifteen seconds later the 200s have slid out of the window, and 5xx came back.
        w.observe(counters([0, 0, 30, 0, 0, 50], 0), Some(200), at(20), &cfg);
        w.observe(counters([0, 0, 31, 0, 0, 80], 0), Some(200), at(23), &cfg);
        let s = w.stats();
        assert_eq!((s.answers, s.errors), (31, 30), "{s:?}");
        assert!(w.erroring());
        // No real traffic for a whole window: no evidence either way.
        w.observe(counters([0, 0, 31, 0, 0, 80], 0), Some(200), at(40), &cfg);
        w.observe(counters([0, 0, 31, 0, 0, 80], 0), Some(200), at(51), &cfg);
        assert!(!w.erroring());
    }

    #[test]
    fn the_peers_hear_of_the_latest_answers_not_of_a_window_still_full_of_old_ones() {
        let cfg = cfg();
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let mut w = AnswerWindow::default();
        // Ten seconds of 200s, 20 a second, a sample every 250 ms.
        let mut c = [0u64; 6];
        for i in 0..=40 {
            w.observe(counters(c, 0), Some(200), ms(i * 250), &cfg);
            c[2] += 5;
        }
        assert_eq!(w.fine_at(), Some(ms(10_000)));
        // Errors begin: for a few seconds the window is still mostly 200s, not erroring, but
        // the latest answers are 5xx and no longer count as evidence of being fine.
        for i in 41..=48 {
            c[5] += 5;
            w.observe(counters(c, 0), Some(200), ms(i * 250), &cfg);
        }
        assert!(!w.erroring(), "{:?}", w.stats());
        assert!(w.fine_at() <= Some(ms(10_500)), "{:?}", w.fine_at());
        // A run of failing seconds a quarter of the window long is erroring, though the window
        // is still mostly 200s.
        for i in 49..=52 {
            c[5] += 5;
            w.observe(counters(c, 0), Some(200), ms(i * 250), &cfg);
        }
        assert!(w.erroring(), "{:?}", w.stats());
        assert!(w.stats().share() < Some(0.5));
    }

    #[test]
    fn the_probes_own_500s_stay_the_probes_once_it_answers_200_again() {
        // A backend with no real traffic answers its probe 500, then 200 again: none of it
        // is a real answer, whatever the probe gets now.
        let cfg = cfg();
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_secs(n);
        let mut w = AnswerWindow::default();
        w.observe(counters([0; 6], 0), Some(200), s(0), &cfg);
        w.observe(counters([0, 0, 0, 0, 0, 8], 8), Some(500), s(4), &cfg);
        w.observe(counters([0, 0, 0, 0, 0, 16], 16), Some(500), s(8), &cfg);
        w.observe(counters([0, 0, 2, 0, 0, 16], 18), Some(200), s(9), &cfg);
        let st = w.stats();
        assert_eq!((st.answers, st.errors, st.probe), (0, 0, 18), "{st:?}");
        assert!(!w.erroring());
        assert_eq!(w.report(&cfg).total_by_class["5xx"], 0);
    }

    #[test]
    fn tls_and_http2_are_not_visible_and_never_erroring() {
        let cfg = cfg();
        let t = Instant::now();
        let mut w = AnswerWindow::default();
        w.observe(Round::Counters(AnswerCounters::default()), None, t, &cfg);
        w.observe(
            Round::Counters(AnswerCounters {
                tls: 300,
                ..AnswerCounters::default()
            }),
            None,
            t + Duration::from_secs(2),
            &cfg,
        );
        let r = w.report(&cfg);
        assert!(!r.status_visible);
        assert!(r.not_visible.unwrap().contains("TLS"));
        assert!(!w.erroring());
        let mut w = AnswerWindow::default();
        w.observe(Round::Unavailable("no cgroup v2".into()), None, t, &cfg);
        let r = w.report(&cfg);
        assert_eq!(r.not_visible.as_deref(), Some("no cgroup v2"));
    }
}
