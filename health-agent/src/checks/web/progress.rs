//! When the server last moved, from the kernel's per-port counters read on every tick: the
//! last answer byte on any connection (keep-alive ones included), whether work is in flight
//! without progress, and how long this server goes quiet while it has work — a pool of
//! threads that each sleep 3 s per request answers every 3 s, and that is its normal.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use health_common::PortCounters;

/// What moved between two ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moves {
    /// Something was sent on a connection.
    pub answered: bool,
    /// Something was received.
    pub read: bool,
    /// A connection waits now, unclaimed.
    pub waiting: bool,
    /// A request is unanswered now.
    pub pending: bool,
    /// A waiting connection was taken up.
    pub taken: bool,
    /// A request was answered or given up on.
    pub finished: bool,
    /// A connection both received and sent since the previous read, the last of each in the
    /// same jiffy: a keep-alive request sent the moment the previous answer arrived reads
    /// like one already answered, so whether it is in service cannot be told.
    pub unsure: bool,
    /// A connection the server had taken is gone: it closed it (a server stuck in a request
    /// leaves its connections in CLOSE_WAIT, listed), or the client reset it.
    pub gone: bool,
}

#[derive(Debug, Default)]
pub struct Progress {
    last: Option<PortCounters>,
    /// The tick that first saw the send count move past its previous reading.
    answer_at: Option<Instant>,
    /// The tick that last saw a waiting connection taken up (sock_diag).
    taken_at: Option<Instant>,
    /// A quiet spell under way: since when, and whether work was seen during it (a spell
    /// that ends with no work seen in it was idleness, not quiet).
    quiet: Option<(Instant, bool)>,
    /// Ended spells (when, how long) within the window.
    spells: VecDeque<(Instant, Duration)>,
    /// Work in flight made no progress since the previous tick.
    stalled: bool,
}

impl Progress {
    /// Takes in this tick's counters.
    #[cfg(test)]
    pub fn observe(&mut self, c: &PortCounters, now: Instant, window: Duration) {
        self.observe_with(c, Moves::default(), now, window);
    }

    /// Takes in this tick's counters and what else was seen to move since the previous tick
    /// (the port's connections through sock_diag, which covers those the programs do not
    /// follow).
    pub fn observe_with(&mut self, c: &PortCounters, seen: Moves, now: Instant, window: Duration) {
        let Some(prev) = self.last.replace(*c) else {
            // The programs count from zero since they loaded: anything sent came after that
            // (and the probe may have been answered already).
            self.answer_at = self
                .answer_at
                .max((c.sent > 0 || seen.answered).then_some(now));
            return;
        };
        self.step(
            Moves {
                answered: c.sent != prev.sent || seen.answered,
                read: c.received != prev.received || seen.read,
                waiting: c.waiting() > 0 || seen.waiting,
                pending: c.pending() > 0 || seen.pending,
                taken: c.claimed + c.closed_unclaimed != prev.claimed + prev.closed_unclaimed
                    || seen.taken,
                finished: c.answered + c.closed_pending != prev.answered + prev.closed_pending,
                unsure: false,
                gone: seen.gone,
            },
            now,
            window,
        );
    }

    /// Takes in a tick seen through sock_diag alone (the programs detached).
    pub fn observe_moves(&mut self, seen: Moves, now: Instant, window: Duration) {
        self.step(seen, now, window);
    }

    fn step(&mut self, m: Moves, now: Instant, window: Duration) {
        if m.taken {
            self.taken_at = Some(now);
        }
        let in_flight = m.waiting || m.pending;
        if m.answered {
            if let Some((from, true)) = self.quiet {
                self.spells
                    .push_back((now, now.saturating_duration_since(from)));
            }
            self.answer_at = Some(now);
            // A request read in the same tick may still be in progress; only work seen later
            // confirms it.
            self.quiet = (in_flight || m.read).then_some((now, in_flight));
        } else if in_flight || m.read {
            match &mut self.quiet {
                Some((_, seen)) => *seen = true,
                None => self.quiet = Some((now, true)),
            }
        } else if matches!(self.quiet, Some((_, false))) {
            // Nothing in flight and nothing read: the request read with the last answer was
            // answered too. The server idles; a spell starts with the next work, not here (an
            // idle minute followed by one request would read as a minute's quiet).
            self.quiet = None;
        }
        while self
            .spells
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
        {
            self.spells.pop_front();
        }
        self.stalled =
            (m.waiting && !m.taken && !m.answered) || (m.pending && !m.finished && !m.answered);
    }

    /// The programs attached afresh and their counters restart from zero: the next reading is
    /// compared with zeros. What was learned (quiet spells, the last answer) stays.
    pub fn rebase(&mut self) {
        self.last = Some(PortCounters::default());
        self.stalled = false;
    }

    /// An answer went out at `at` that the counters and sock_diag may not show: the probe's
    /// (its connection opens and closes between two reads).
    pub fn answered(&mut self, at: Instant) {
        self.answer_at = self.answer_at.max(Some(at));
    }

    /// The tick that last saw an answer go out.
    pub fn answer_at(&self) -> Option<Instant> {
        self.answer_at
    }

    pub fn since_answer(&self, now: Instant) -> Option<Duration> {
        self.answer_at.map(|t| now.saturating_duration_since(t))
    }

    /// Since sock_diag last saw the server take a waiting connection up.
    pub fn since_taken(&self, now: Instant) -> Option<Duration> {
        self.taken_at.map(|t| now.saturating_duration_since(t))
    }

    /// The longest quiet spell with work, ended within the window.
    pub fn longest_quiet(&self) -> Duration {
        self.spells
            .iter()
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }

    pub fn stalled(&self) -> bool {
        self.stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(250);
    const WINDOW: Duration = Duration::from_secs(60);

    #[derive(Default)]
    struct Server {
        c: PortCounters,
    }

    impl Server {
        fn read(&mut self) {
            self.c.received += 1;
        }
        fn answer(&mut self) {
            self.c.sent += 1;
        }
        fn queue(&mut self, n: u64) {
            self.c.established += n;
        }
    }

    #[test]
    fn an_idle_stretch_after_an_answer_is_not_quiet() {
        // A request read and answered between two ticks (the tick cannot tell whether another
        // came in with it); nothing for ten seconds; one request, answered a tick later. The
        // server was quiet with work for one tick, not ten seconds.
        let t0 = Instant::now();
        let mut p = Progress::default();
        let mut s = Server::default();
        p.observe(&s.c, t0, WINDOW);
        s.read();
        s.answer();
        p.observe(&s.c, t0 + TICK, WINDOW);
        for i in 2..40 {
            p.observe(&s.c, t0 + TICK * i, WINDOW);
        }
        s.read();
        p.observe(&s.c, t0 + TICK * 40, WINDOW);
        s.answer();
        p.observe(&s.c, t0 + TICK * 41, WINDOW);
        assert_eq!(p.longest_quiet(), TICK, "the idle stretch counted as quiet");
    }

    #[test]
    fn a_busy_pools_rhythm_is_learned() {
        // Keep-alive clients: requests read at once, answered 3 s later, next read right away;
        // the agent's probe waits in the accept queue meanwhile.
        let t0 = Instant::now();
        let mut p = Progress::default();
        let mut s = Server::default();
        p.observe(&s.c, t0, WINDOW);
        s.read();
        s.queue(1);
        for i in 1..=12 {
            let now = t0 + TICK * i;
            if i == 12 {
                s.answer();
                s.read();
            }
            p.observe(&s.c, now, WINDOW);
        }
        assert_eq!(
            p.longest_quiet(),
            TICK * 11,
            "3 s of work without an answer"
        );
        assert_eq!(p.since_answer(t0 + TICK * 13), Some(TICK));
        assert!(!p.stalled(), "it answered in the last tick");
        p.observe(&s.c, t0 + TICK * 13, WINDOW);
        assert!(p.stalled(), "a connection waits and nothing moved");
    }

    #[test]
    fn idleness_between_quick_requests_is_no_quiet_spell() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        let mut s = Server::default();
        p.observe(&s.c, t0, WINDOW);
        // A request a minute, each read and answered within one tick.
        for minute in 1..=3u32 {
            for i in 0..240 {
                let now = t0 + Duration::from_secs(60 * (minute - 1) as u64) + TICK * i;
                if i == 239 {
                    s.read();
                    s.answer();
                }
                p.observe(&s.c, now, WINDOW);
            }
        }
        assert_eq!(p.longest_quiet(), Duration::ZERO);
    }

    #[test]
    fn old_spells_age_out() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        let mut s = Server::default();
        p.observe(&s.c, t0, WINDOW);
        s.read();
        p.observe(&s.c, t0 + TICK, WINDOW);
        s.answer();
        p.observe(&s.c, t0 + TICK * 9, WINDOW);
        assert_eq!(p.longest_quiet(), TICK * 8);
        p.observe(&s.c, t0 + TICK * 9 + WINDOW + TICK, WINDOW);
        assert_eq!(p.longest_quiet(), Duration::ZERO);
    }
}
