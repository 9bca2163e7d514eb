//! `Judge`: per fault class, this instance's own or the fleet's, from the latest round of
//! the peers' views.

use super::*;

/// Decides, per fault class, whether this instance's fault is its own or the fleet's.
#[derive(Debug)]
pub struct Judge {
    /// When each current fault class was first seen here.
    onset: HashMap<FaultClass, Instant>,
    /// When each current fault class was last judged the fleet's: a turn to "this instance's
    /// own" right after is first the shared fault ending (the peers' checks saw it end before
    /// this instance's did), and waits for its own check (see `judge`).
    shared_at: HashMap<FaultClass, Instant>,
    /// How long peers that predate `fine_ms` get to see a fault before their "fine" counts.
    settle: Duration,
    /// A round older than this is no evidence.
    max_age: Duration,
    /// How long a fault waits for fresh word from peers whose latest evidence predates it;
    /// after that such peers are left out of the count.
    confirm_within: Duration,
}

const MIN_CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// How long a fault waits for fresh word from peers whose latest evidence predates it
/// (`fleet.confirm_within`; by default, time for a peer with the same fault to see it too —
/// its probe's cadence and timeout — and answer).
fn confirm_within(cfg: &crate::config::Config) -> Duration {
    if !cfg.fleet.confirm_within.is_zero() {
        return cfg.fleet.confirm_within;
    }
    let seen = cfg
        .checks
        .interval
        .saturating_mul(2)
        .saturating_add(cfg.web.probe_timeout)
        .saturating_add(cfg.fleet.timeout);
    seen.max(MIN_CONFIRM_WITHIN)
}

/// However short `fleet.interval`, peers that predate `fine_ms` get this long to notice a
/// fault of their own before this instance calls the fault its own.
const MIN_SETTLE: Duration = Duration::from_secs(5);

/// What one peer's view says of one fault class of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    /// It has the same kind of fault.
    With,
    /// It has evidence, newer than our fault, that it does not.
    Fine,
    /// It shows no fault, but its latest evidence predates ours: it may not have seen it yet.
    Stale,
    /// It has nothing to compare (no web backend watched, for a web fault).
    Mute,
}

fn word(
    view: &PeerView,
    class: FaultClass,
    onset: Instant,
    asked: Instant,
    settle: Duration,
) -> Word {
    if view.classes().contains(&class) {
        return Word::With;
    }
    if class == FaultClass::Web && view.web == WebVerdict::NotConfigured {
        return Word::Mute;
    }
    // A peer that cannot read its answers' status has nothing to compare with.
    if class == FaultClass::Errors
        && (view.web == WebVerdict::NotConfigured || !view.answers.is_some_and(|a| a.visible))
    {
        return Word::Mute;
    }
    let fresh = match view.fine_ms {
        // An agent before `fine_ms`: its "fine" counts once it had time to notice.
        None => asked >= onset + settle,
        // It answered after `asked`, so its evidence is no older than `asked - age`.
        Some(ages) => ages
            .of(class)
            .and_then(|ms| asked.checked_sub(Duration::from_millis(ms)))
            .is_some_and(|at| at > onset),
    };
    if fresh {
        Word::Fine
    } else {
        Word::Stale
    }
}

/// Tally of the peers' words on one class.
#[derive(Debug, Default)]
struct Tally<'a> {
    with: Vec<&'a str>,
    fine: Vec<&'a str>,
    stale: Vec<&'a str>,
}

impl Judge {
    /// The judge the configuration sets up (`fleet.interval`, `fleet.timeout`,
    /// `fleet.confirm_within`).
    pub fn of_config(cfg: &crate::config::Config) -> Self {
        Self::new(cfg.fleet.interval, cfg.fleet.timeout, confirm_within(cfg))
    }

    pub fn new(interval: Duration, timeout: Duration, confirm_within: Duration) -> Self {
        Self {
            onset: HashMap::new(),
            shared_at: HashMap::new(),
            settle: MIN_SETTLE.max(interval.saturating_mul(2)),
            max_age: interval.saturating_add(timeout).saturating_mul(3),
            confirm_within,
        }
    }

    /// Whether `round` is recent enough to be evidence at `now`.
    pub fn fresh(&self, round: &Round, now: Instant) -> bool {
        round
            .started
            .is_some_and(|t| now.saturating_duration_since(t) <= self.max_age)
    }

    /// Judges `own`, a dependency fault among them being the web backend waiting on one (a
    /// peer whose backend answers speaks against it, database check or not).
    #[cfg(test)]
    pub fn judge(
        &mut self,
        own: &[FaultClass],
        round: Option<&Round>,
        now: Instant,
    ) -> FleetReport {
        self.judge_own(own, false, round, now)
    }

    /// Judges `own`; `database_down`: this instance's dependency fault is its database
    /// (unreachable or slow), of which a peer that checks no database can say nothing — its
    /// backend answering is no sign it reaches that database.
    pub fn judge_own(
        &mut self,
        own: &[FaultClass],
        database_down: bool,
        round: Option<&Round>,
        now: Instant,
    ) -> FleetReport {
        self.onset.retain(|c, _| own.contains(c));
        self.shared_at.retain(|c, _| own.contains(c));
        for &c in own {
            self.onset.entry(c).or_insert(now);
        }
        let mut report = FleetReport {
            configured: true,
            ..FleetReport::default()
        };
        let Some(round) = round else {
            // The first round is under way (the peers are asked at start): wait for it, within
            // the bound.
            report.asking = own
                .iter()
                .copied()
                .filter(|c| self.waited(*c, now) < self.confirm_within)
                .collect();
            report.note = Some(if report.asking.is_empty() {
                "no round of asking yet: judged alone".into()
            } else {
                "no round of asking yet: no 503 until the peers answer".into()
            });
            return report;
        };
        let started = round.started.unwrap_or(now);
        report.peers_asked = round.asked.clone();
        report.peers_answered = round.answered.iter().map(|(a, _)| a.clone()).collect();
        report.peers_failed = round
            .failed
            .iter()
            .map(|(a, why)| format!("{a}: {why}"))
            .collect();
        report.discovery = round.discovery_error.as_ref().map(ToString::to_string);
        report.failures = round.failures;
        report.peer_alerts = round
            .answered
            .iter()
            .map(|(_, v)| PeerAlerts {
                instance: v.instance.clone(),
                heard: started,
                alerts: v.alerts.clone(),
            })
            .collect();
        report.round_age_ms = Some(now.saturating_duration_since(started).as_millis() as u64);
        report.round_ms = Some((round.took.as_secs_f64() * 10_000.0).round() / 10.0);
        if now.saturating_duration_since(started) > self.max_age {
            report.note = Some("the latest round is too old: judged alone".into());
            return report;
        }
        if round.answered.is_empty() {
            report.note = Some(match &round.discovery_error {
                Some(e) => format!("no peers to ask ({e}): single-instance rule"),
                None => "no peer answered: single-instance rule".into(),
            });
            return report;
        }
        let mut notes = Vec::new();
        for &class in own {
            let onset = self.onset.get(&class).copied().unwrap_or(now);
            let mut tally = Tally::default();
            for (addr, view) in &round.answered {
                let blind = class == FaultClass::Dependency
                    && database_down
                    && view.database == DbState::NotConfigured;
                if blind {
                    continue;
                }
                match word(view, class, onset, started, self.settle) {
                    Word::With => tally.with.push(addr),
                    Word::Fine => tally.fine.push(addr),
                    Word::Stale => tally.stale.push(addr),
                    Word::Mute => {}
                }
            }
            let waited = now.saturating_duration_since(onset);
            let mut verdict = self.decide(class, &tally, waited);
            if let Verdict::Judged(j) = &verdict {
                match j.scope {
                    Scope::Shared => {
                        self.shared_at.insert(class, now);
                    }
                    // The fleet's fault a moment ago, the peers fine now: it is ending, and this
                    // instance's own check has not seen it end yet. Its own only if that holds
                    // past the bound (then the peers recovered and this instance did not).
                    Scope::Local
                        if self.shared_at.get(&class).is_some_and(|t| {
                            now.saturating_duration_since(*t) < self.confirm_within
                        }) =>
                    {
                        verdict = Verdict::Ending(format!(
                            "{} fault: the fleet's until {:.1}s ago, the peers fine since ({}): \
                             waiting for this instance's own check to see it end, no 503 \
                             meanwhile (at most {}s)",
                            class.as_str(),
                            now.saturating_duration_since(self.shared_at[&class])
                                .as_secs_f64(),
                            j.reason,
                            self.confirm_within.as_secs_f64()
                        ));
                    }
                    _ => {}
                }
            }
            match verdict {
                Verdict::Judged(mut j) => {
                    if class == FaultClass::Errors {
                        j.reason.push_str(&format!(
                            " (the peers' 5xx shares: {})",
                            peer_shares(&round.answered)
                        ));
                    }
                    report.judgements.push(j)
                }
                Verdict::Asking => {
                    report.asking.push(class);
                    notes.push(format!(
                        "{} fault: {} of the peers ({}) show none but have no evidence newer than it; asking again, no 503 until they answer (at most {}s, {:.1}s so far)",
                        class.as_str(),
                        tally.stale.len(),
                        tally.stale.join(", "),
                        self.confirm_within.as_secs_f64(),
                        waited.as_secs_f64()
                    ));
                }
                Verdict::Ending(why) => {
                    report.asking.push(class);
                    notes.push(why);
                }
                Verdict::Alone(why) => notes.push(format!("{} fault: {why}", class.as_str())),
            }
        }
        if !notes.is_empty() {
            report.note = Some(notes.join("; "));
        }
        report
    }

    /// How long this instance has had a fault of `class`.
    fn waited(&self, class: FaultClass, now: Instant) -> Duration {
        self.onset
            .get(&class)
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(*t))
    }

    fn decide(&self, class: FaultClass, t: &Tally, waited: Duration) -> Verdict {
        let noun = class.as_str();
        let judged = |scope, peers_with: usize, peers_answered: usize, reason: String| {
            Verdict::Judged(Judgement {
                class,
                scope,
                peers_with,
                peers_answered,
                reason,
            })
        };
        let (with, fine, stale) = (t.with.len(), t.fine.len(), t.stale.len());
        // Stale peers count while they may still show the fault; past the bound they are left
        // out (a peer that cannot show fresh evidence in that time is no evidence either way).
        let counted = if stale > 0 && waited >= self.confirm_within {
            with + fine
        } else {
            with + fine + stale
        };
        if counted == 0 {
            return Verdict::Alone(if stale > 0 {
                format!(
                    "no peer has evidence newer than it after {}s: single-instance rule",
                    self.confirm_within.as_secs_f64()
                )
            } else {
                "no peer answering watches this kind of check: single-instance rule".into()
            });
        }
        if with * 2 > counted {
            return judged(
                Scope::Shared,
                with,
                counted,
                format!(
                    "{with}/{counted} peers answering have a {noun} fault too: the fleet's, not this instance's"
                ),
            );
        }
        if fine * 2 > counted {
            return judged(
                Scope::Local,
                with,
                counted,
                format!(
                    "{fine}/{counted} peers answering ({}) have no {noun} fault, with evidence newer than it: this instance's own",
                    t.fine.join(", ")
                ),
            );
        }
        if stale > 0 && counted > with + fine {
            return Verdict::Asking;
        }
        Verdict::Alone("the peers are split: single-instance rule".into())
    }
}

/// Each answering peer's 5xx share, for the reason of an errors judgement.
fn peer_shares(answered: &[(String, PeerView)]) -> String {
    answered
        .iter()
        .map(|(addr, v)| {
            format!(
                "{addr} {}",
                v.answers
                    .filter(|a| a.visible)
                    .map_or("not visible".into(), |a| a.describe())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

enum Verdict {
    Judged(Judgement),
    /// Some peers' word is older than the fault: ask again before any 503.
    Asking,
    /// No judgement: the single-instance rule holds.
    Alone(String),
    /// Judged the fleet's a moment ago, the peers fine now: the shared fault is ending; no 503
    /// while this instance's own check catches up (why).
    Ending(String),
}
