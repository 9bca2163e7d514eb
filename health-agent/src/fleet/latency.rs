//! Slow against its peers: this instance's answer latency (request read → first response byte,
//! kernel-seen) compared with what its peers publish of theirs.
//!
//! Gray failure — a box that still answers, only several times slower than its peers (a noisy
//! neighbour, CPU credits spent, a degraded volume) — is invisible to a balancer and to any
//! one box alone: busy looks the same. Compared with the peers it is not. The rule:
//!
//! - both sides' **medians** of their latest answers (each agent's newest counted spans that
//!   hold at least MIN_ANSWERS, within `web.latency_window`; after a restart, only spans that
//!   began after it returned): a median needs half the answers slow to move, so a few slow
//!   requests (a report, a cold cache) on one box do not take it out, and the newest spans
//!   make a box that turns slow seen at the next span, not once its window's minute tips;
//! - at least MIN_ANSWERS answers here, and at least MIN_PEERS peers with MIN_ANSWERS each
//!   (a peer with fewer is left out, and said so);
//! - slow when this median is at least `web.slow_vs_peers` times the peers' (the median of
//!   their medians) and at least MIN_GAP_MS more: below that the difference is the
//!   histogram's resolution, and nobody waits for it.
//!
//! The comparison is per answer, not per volume: with sticky sessions a box may get more or
//! fewer requests than its peers, and its latency is still that of each answer.
//!
//! At most a third of the fleet (rounded down, at least one) is out for this at once
//! (`may_go_out`): peers publish whether they are out for it, and the lowest instance id wins
//! a tie. A fleet that is slow everywhere compares alike and stays `slow` → `scale_up`.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checks::web::PortWatch;

/// Answers this instance, and each peer counted, must have in its window.
pub const MIN_ANSWERS: u64 = 10;
/// Peers with enough answers needed to compare at all.
pub const MIN_PEERS: usize = 2;
/// How long the connection programs stay attached (`"on_suspicion"`) after this instance last
/// looked slow against its peers.
const MEASURE_FOR: Duration = Duration::from_secs(30);
/// A restart of a box slow against its peers recovers only once the answers after it have
/// compared alike this long: a restarted server's first answers can be quick (its CPU quota
/// unspent, its clients still reconnecting) and the slowness back seconds later — one
/// restart that did not help, not two.
/// Short beside `heal.timeout` (30 s), which must still see a restart that helped recover: at
/// one answer a second, the 10 answers a comparison needs and this fit well inside it.
pub const RECOVER_FOR: Duration = Duration::from_secs(5);
/// A difference smaller than this is no slowness, whatever the ratio.
pub const MIN_GAP_MS: f64 = 10.0;

/// An agent's answer latency as its peer view carries it (and this agent's own, as compared).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PeerLatency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    /// Answers the figures rest on (the probe path's left out).
    pub answers: u64,
    /// The time they were counted in, and how: `counted` (`socket_tracing = "always"`) or
    /// `windows` (estimates from the counting windows of `"on_suspicion"`).
    pub window_seconds: f64,
    pub basis: String,
    /// How long before the view was served the oldest answer these figures count began: a
    /// peer's figures confirm this instance's slowness only when all of them are newer than it
    /// (see `SlowTracker::round`). None from agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub began_seconds_ago: Option<f64>,
    /// Its own comparison finds it slow against its peers.
    pub slow_vs_peers: bool,
    /// It is out of rotation (or restarting) for that: what the cap counts.
    pub out_slow: bool,
    /// The kind of machine it runs on (`kind`): latency is compared with peers of the same
    /// type only. None from agents that predate it, which are compared with all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
}

impl PeerLatency {
    fn describe(&self) -> String {
        format!(
            "median {:.1} ms, p90 {:.1} ms over {} answers",
            self.p50_ms, self.p90_ms, self.answers
        )
    }
}

/// What one comparison found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Compared {
    pub own_p50_ms: f64,
    pub peers_p50_ms: f64,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub ratio: f64,
    pub own_answers: u64,
    /// The peers compared with, and their figures.
    pub peers: Vec<String>,
}

impl Compared {
    /// The reason a 503 (or a held 200) gives.
    pub fn describe(&self) -> String {
        format!(
            "slow against its peers: answer latency median {:.1} ms over {} answers, {:.1}× the \
             peers' median {:.1} ms ({})",
            self.own_p50_ms,
            self.own_answers,
            self.ratio,
            self.peers_p50_ms,
            self.peers.join("; ")
        )
    }
}

/// The outcome of comparing this instance's latency with its peers'.
#[derive(Debug, Clone, PartialEq)]
pub enum Comparison {
    Slow(Compared),
    /// Compared: not slow against them (the ratio below the threshold, or the gap too small).
    Alike(Compared),
    /// Too few answers here to compare (why).
    TooFewHere(String),
    /// Too few peers with enough answers (why).
    NoPeers(String),
}

/// Compares `own` with the peers' figures (`threshold`: `web.slow_vs_peers`).
pub fn compare(own: &PeerLatency, peers: &[(String, PeerLatency)], threshold: f64) -> Comparison {
    if own.answers < MIN_ANSWERS {
        return Comparison::TooFewHere(format!(
            "{} answers here, at least {MIN_ANSWERS} needed to compare latency with the peers",
            own.answers
        ));
    }
    // Like with like: a peer of another known type answers at its own pace.
    let (like, unlike): (Vec<_>, Vec<_>) =
        peers
            .iter()
            .partition(|(_, p)| match (&own.instance_type, &p.instance_type) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            });
    let (counted, short): (Vec<_>, Vec<_>) = like
        .into_iter()
        .partition(|(_, p)| p.answers >= MIN_ANSWERS);
    if counted.len() < MIN_PEERS {
        let mut left: Vec<String> = short
            .iter()
            .map(|(a, p)| format!("{a} {} answers", p.answers))
            .collect();
        left.extend(
            unlike
                .iter()
                .map(|(a, p)| format!("{a} is {}", p.instance_type.as_deref().unwrap_or_default())),
        );
        return Comparison::NoPeers(format!(
            "{} peers {}with at least {MIN_ANSWERS} answers, {MIN_PEERS} needed to compare \
             latency{}",
            counted.len(),
            match (&own.instance_type, unlike.is_empty()) {
                (Some(t), false) => format!("of this instance's type ({t}) "),
                _ => String::new(),
            },
            if left.is_empty() {
                String::new()
            } else {
                format!(" (left out: {})", left.join(", "))
            }
        ));
    }
    let mut medians: Vec<f64> = counted.iter().map(|(_, p)| p.p50_ms).collect();
    medians.sort_by(f64::total_cmp);
    let mid = medians.len() / 2;
    let peers_p50 = if medians.len().is_multiple_of(2) {
        (medians[mid - 1] + medians[mid]) / 2.0
    } else {
        medians[mid]
    };
    // A bucket's midpoint is never 0 past the first microseconds; keep the ratio finite.
    let ratio = own.p50_ms / peers_p50.max(0.001);
    let compared = Compared {
        own_p50_ms: own.p50_ms,
        peers_p50_ms: (peers_p50 * 100.0).round() / 100.0,
        ratio: (ratio * 100.0).round() / 100.0,
        own_answers: own.answers,
        peers: counted
            .iter()
            .map(|(a, p)| format!("{a} {}", p.describe()))
            .collect(),
    };
    if ratio >= threshold && own.p50_ms - peers_p50 >= MIN_GAP_MS {
        Comparison::Slow(compared)
    } else {
        Comparison::Alike(compared)
    }
}

/// How many instances may be out for slowness against their peers at once, in a fleet of
/// `fleet` (this one and the peers that answered): a third, rounded down, at least one.
pub fn cap(fleet: usize) -> usize {
    (fleet / 3).max(1)
}

/// Whether this instance may go out (or stay out) for slowness against its peers: those out
/// already keep their places (lowest instance id first if more are out than the cap allows),
/// then those that find themselves slow, lowest instance id first. `peers`: each answering
/// peer's instance id and latency figures. Err: why not.
pub fn may_go_out(
    own_id: &str,
    own_out: bool,
    peers: &[(String, Option<PeerLatency>)],
) -> Result<(), String> {
    let cap = cap(peers.len() + 1);
    let mut queue: Vec<(bool, &str)> = peers
        .iter()
        .filter_map(|(id, l)| {
            let l = l.as_ref()?;
            (l.out_slow || l.slow_vs_peers).then_some((!l.out_slow, id.as_str()))
        })
        .collect();
    queue.push((!own_out, own_id));
    // Out first (false sorts first), then by instance id.
    queue.sort();
    let place = queue
        .iter()
        .position(|(_, id)| *id == own_id)
        .unwrap_or(usize::MAX);
    if place < cap {
        return Ok(());
    }
    let out = queue.iter().filter(|(waiting, _)| !waiting).count();
    Err(format!(
        "not taken out: at most {cap} of the {} instances may be out for slowness against \
         their peers at once ({out} out, {} slow in all; the lowest instance id goes first)",
        peers.len() + 1,
        queue.len()
    ))
}

/// The judgement between rounds. Once made it holds while too few answers have come since
/// the evidence started over (a restart returned): a restart is judged by the answers after
/// it, never by the quiet moment before they come.
#[derive(Debug, Default)]
pub struct SlowTracker {
    held: Option<Compared>,
    /// Where the evidence of the latest judgement starts (None: the whole window).
    judged_since: Option<Instant>,
    /// The latest judgement was made this round on its own answers, not held.
    judged_now: bool,
    /// Out (or restarting) for slowness against its peers since the latest round.
    out: bool,
    /// `web.slow_vs_peers`.
    threshold: f64,
    /// When its comparison first found it slow (None: not slow now): the peers' figures must
    /// count only answers that began after it before they can confirm it.
    slow_since: Option<Instant>,
    /// The peers' figures counted after `slow_since` confirmed it: it acts on the comparison
    /// until it is no longer slow.
    confirmed: bool,
    /// This instance's type (`kind::detect`), published with its figures.
    instance_type: Option<String>,
    /// Every answer is counted until then (`measuring`).
    measure_until: Option<Instant>,
    /// The latest restart's return, as the previous round knew it.
    last_since: Option<Instant>,
    /// Since when the answers after a restart (judged on a held judgement from before it)
    /// have compared alike (`RECOVER_FOR`).
    alike_since: Option<Instant>,
}

/// Whether `p`'s figures, from a round asked at `asked`, count only answers that began at or
/// after `after`.
fn counted_after(p: &PeerLatency, asked: Option<Instant>, after: Instant) -> bool {
    match (asked, p.began_seconds_ago) {
        // `view::PeerView::parse` bounds `ago` already; a figure that still makes no
        // duration (negative, NaN, past `Duration`) confirms nothing rather than panicking.
        (Some(asked), Some(ago)) => Duration::try_from_secs_f64(ago)
            .ok()
            .and_then(|ago| asked.checked_sub(ago))
            .is_some_and(|began| began >= after),
        _ => false,
    }
}

impl SlowTracker {
    /// Takes in this round's comparison, made on the answers since `since`; returns the
    /// judgement: slow (with its figures) or not.
    ///
    /// A judgement from before the latest restart holds through RECOVER_FOR of alike answers
    /// after it (`now`).
    pub fn observe(
        &mut self,
        c: &Comparison,
        since: Option<Instant>,
        now: Instant,
    ) -> Option<&Compared> {
        self.judged_now = false;
        let judging_restart = self.held.is_some() && since.is_some() && self.judged_since != since;
        match c {
            Comparison::Slow(f) => {
                self.held = Some(f.clone());
                self.judged_since = since;
                self.judged_now = true;
                self.alike_since = None;
            }
            Comparison::Alike(_) if judging_restart => {
                let alike = *self.alike_since.get_or_insert(now);
                if now.saturating_duration_since(alike) >= RECOVER_FOR {
                    self.held = None;
                    self.alike_since = None;
                }
            }
            Comparison::Alike(_) | Comparison::NoPeers(_) => {
                self.held = None;
                self.alike_since = None;
            }
            // Too few answers since a restart: the judgement holds until they come.
            Comparison::TooFewHere(_) => {}
        }
        self.held.as_ref()
    }

    /// While slow on answers judged this round: where their evidence starts (what judges a
    /// restart: answers that began after it returned).
    pub fn judged_since(&self) -> Option<Option<Instant>> {
        (self.held.is_some() && self.judged_now).then_some(self.judged_since)
    }
}

/// This round's comparison, for one agent: what it compares, the peers' word, and what it
/// knows of itself.
pub struct RoundInput<'a> {
    /// Its own figures (None: no kernel figures, nothing to compare).
    pub own: Option<PeerLatency>,
    /// Where its evidence starts (the latest restart's return).
    pub since: Option<Instant>,
    /// The peers' views, when the latest round is fresh.
    pub answered: Option<&'a [(String, super::PeerView)]>,
    /// `web.slow_vs_peers`.
    pub threshold: f64,
    /// When the round the peers' views come from started.
    pub round_started: Option<Instant>,
    pub now: Instant,
}

/// What this instance's own answers show, read from the port's watching for the fleet's round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnAnswers {
    /// The latest answers' figures, when there are MIN_ANSWERS of them (see `own`).
    pub judged: Option<PeerLatency>,
    /// The newest span's figures, however few its answers.
    pub newest: Option<PeerLatency>,
    /// Most requests of its newest counting window went unanswered.
    pub starved: bool,
}

impl OwnAnswers {
    /// Read from `web`: the answers that began after `since` (the latest restart's return).
    pub fn of(web: &PortWatch, since: Option<Instant>, now: Instant) -> Self {
        Self {
            judged: own(web, now, since, MIN_ANSWERS),
            newest: own(web, now, since, 1),
            starved: web.newest_span_starved(now),
        }
    }
}

/// What the fleet's round asks of the port's watching's counting (the composer passes it on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountingAsks {
    /// Count every answer from now on (`PortWatch::sample_answers_soon`).
    pub count_now: bool,
    /// A restart returned at this instant: the span in progress ends at the next tick, so the
    /// answers after it count apart (`PortWatch::cut_span_after`).
    pub cut_after: Option<Instant>,
}

/// The latest answers' latency of the backend `web` watches, as the peers compare it: those
/// that began after `since` (the latest restart's return).
pub fn own(
    web: &PortWatch,
    now: Instant,
    since: Option<Instant>,
    enough: u64,
) -> Option<PeerLatency> {
    let (l, seconds, basis, began) = web.latency_since(now, since, enough)?;
    Some(PeerLatency {
        began_seconds_ago: began
            .map(|b| (now.saturating_duration_since(b).as_secs_f64() * 100.0).round() / 100.0),
        p50_ms: l.p50_ms,
        p90_ms: l.p90_ms,
        answers: l.samples,
        window_seconds: (seconds * 100.0).round() / 100.0,
        basis: basis.into(),
        ..PeerLatency::default()
    })
}

impl SlowTracker {
    pub fn new(threshold: f64, instance_type: Option<String>) -> Self {
        Self {
            threshold,
            instance_type,
            ..Self::default()
        }
    }

    /// One round of the composer: this instance's figures (`own`, read from the port's watching
    /// before), the peers' from `round` (None when none is fresh), into `report`. Returns what
    /// the policy reads, and what the watching's counting is asked: while a judgement is
    /// held for want of answers after a restart, to count them now (with `"on_suspicion"`,
    /// rather than at the next window).
    pub fn round_of(
        &mut self,
        own: OwnAnswers,
        since: Option<Instant>,
        round: Option<&super::Round>,
        report: &mut super::FleetReport,
        now: Instant,
    ) -> (Option<crate::policy::SlowVsPeers>, CountingAsks) {
        let instance_type = self.instance_type.clone();
        let typed = move |l: PeerLatency| PeerLatency {
            instance_type: instance_type.clone(),
            ..l
        };
        let input = RoundInput {
            own: own.judged.map(&typed),
            since,
            answered: round.map(|r| r.answered.as_slice()),
            threshold: self.threshold,
            round_started: round.and_then(|r| r.started),
            now,
        };
        let verdict = self.round(input, report);
        // Judged slow (out, restarting, or held for want of answers after a restart), asking
        // the peers, the newest span alone (too few answers to judge) slow against the peers,
        // or a newest span whose requests mostly went unanswered (a starved backend's answers
        // come after the window): with `"on_suspicion"`, count every answer from now on
        // (`measuring`) rather than in the next windows, which a starved box's slow answers
        // outlast.
        let why = if verdict.is_some() {
            Some("judged slow")
        } else if report.asking_latency {
            Some("asking the peers")
        } else if self.hint(own.newest.map(&typed), report) {
            Some("its newest answers, too few to judge, are slow against the peers'")
        } else if own.starved {
            Some("most requests of its newest counting window went unanswered")
        } else {
            None
        };
        let mut asks = CountingAsks::default();
        if let Some(why) = why {
            if self.measuring(now).is_none() {
                tracing::info!("latency against the peers: {why}; counting every answer");
            }
            asks.count_now = true;
            self.measure_until = Some(now + MEASURE_FOR);
        }
        // A restart returned: its answers count from the next tick, not from the next span.
        if since.is_some() && since != self.last_since {
            asks.cut_after = since;
        }
        self.last_since = since;
        (verdict, asks)
    }

    /// Why the connection programs should stay attached (`Asks::hold`): this
    /// instance looked slow against its peers within MEASURE_FOR.
    pub fn measuring(&self, now: Instant) -> Option<&'static str> {
        self.measure_until
            .is_some_and(|t| now < t)
            .then_some("its latency looked slow against its peers': every answer is counted")
    }

    /// Whether `newest` (the newest span's figures), judged as if it had enough answers, is
    /// slow against the peers' figures in `report`.
    fn hint(&self, newest: Option<PeerLatency>, report: &super::FleetReport) -> bool {
        let Some(newest) = newest.filter(|n| n.answers > 0 && n.answers < MIN_ANSWERS) else {
            return false;
        };
        let peers: Vec<(String, PeerLatency)> = report
            .peers_latency
            .iter()
            .map(|(a, l)| (a.clone(), l.clone()))
            .collect();
        let as_if = PeerLatency {
            answers: MIN_ANSWERS,
            ..newest
        };
        matches!(compare(&as_if, &peers, self.threshold), Comparison::Slow(_))
    }
}

impl SlowTracker {
    /// Compares, writes the figures and the outcome into `report`, and returns what the policy
    /// reads: None when not slow against the peers (or not compared).
    pub fn round(
        &mut self,
        input: RoundInput,
        report: &mut super::FleetReport,
    ) -> Option<crate::policy::SlowVsPeers> {
        let RoundInput {
            own,
            since,
            answered,
            threshold,
            round_started,
            now,
        } = input;
        let answered = answered.unwrap_or_default();
        report.peers_latency = answered
            .iter()
            .filter_map(|(a, v)| Some((a.clone(), v.latency.clone()?)))
            .collect();
        let Some(mut own) = own else {
            self.out = false;
            return None;
        };
        let peers: Vec<(String, PeerLatency)> = report
            .peers_latency
            .iter()
            .map(|(a, l)| (a.clone(), l.clone()))
            .collect();
        let comparison = compare(&own, &peers, threshold);
        let mut slow = self.observe(&comparison, since, now).cloned();
        let slow_since = *self.slow_since.get_or_insert(now);
        if slow.is_none() {
            self.slow_since = None;
            self.confirmed = false;
        }
        // The peers' figures confirm only when every answer they count began after this
        // instance first looked slow: figures that mix older answers may predate a slowdown of
        // the whole fleet, which reached this instance's figures first. Until then it asks them
        // for fresh answers, never out.
        if slow.is_some() && !self.confirmed {
            let fresh: Vec<(String, PeerLatency)> = peers
                .iter()
                .filter(|(_, p)| counted_after(p, round_started, slow_since))
                .cloned()
                .collect();
            match compare(&own, &fresh, threshold) {
                Comparison::Slow(_) => self.confirmed = true,
                Comparison::Alike(_) => {
                    self.held = None;
                    self.slow_since = None;
                    slow = None;
                }
                Comparison::TooFewHere(_) | Comparison::NoPeers(_) => {}
            }
        }
        report.asking_latency = slow.is_some() && !self.confirmed;
        if report.asking_latency {
            slow = None;
        }
        report.latency_comparison = Some(match (&comparison, &slow) {
            (Comparison::Slow(c), None) => format!(
                "{}; asking the peers for figures counted since ({:.1} s ago) before acting",
                c.describe(),
                now.saturating_duration_since(slow_since).as_secs_f64()
            ),
            (Comparison::Slow(c), _) => c.describe(),
            (Comparison::Alike(c), _) => format!(
                "alike: median {:.1} ms, {:.2}× the peers' {:.1} ms (slow at {threshold}×)",
                c.own_p50_ms, c.ratio, c.peers_p50_ms
            ),
            (Comparison::TooFewHere(why), Some(held)) => {
                format!("{why}; held from the latest judgement: {}", held.describe())
            }
            (Comparison::TooFewHere(why) | Comparison::NoPeers(why), _) => why.clone(),
        });
        own.slow_vs_peers = slow.is_some();
        let verdict = slow.map(|c| {
            let ids: Vec<(String, Option<PeerLatency>)> = answered
                .iter()
                .map(|(_, v)| (v.instance.clone(), v.latency.clone()))
                .collect();
            crate::policy::SlowVsPeers {
                reason: c.describe(),
                capped: may_go_out(super::instance_id(), self.out, &ids).err(),
            }
        });
        self.out = verdict.as_ref().is_some_and(|v| v.capped.is_none());
        own.out_slow = self.out;
        report.latency = Some(own);
        verdict
    }
}

#[cfg(test)]
mod tests;
