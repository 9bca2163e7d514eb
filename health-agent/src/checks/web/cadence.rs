//! When the kernel programs count, with `web.socket_tracing = "on_suspicion"`: the counting
//! windows of the connection programs and the sampling windows of the answer programs, as a
//! clock that is told what each tick saw and says what the programs should do. It touches no
//! program: the monitor attaches and detaches them as it says.

use std::time::{Duration, Instant};

/// While sock_diag cannot tell keep-alive requests in service from answered ones
/// (`Moves::unsure`), the programs attach this long every COUNT_EVERY to count them for the
/// saturation meter: the window closes on the first tick COUNT_FOR after it opened, the second
/// at the default 250 ms ticks (a tick a few ms early still closes it), and that tick reads the
/// counts before detaching: two counted ticks, half a second attached in 15, a thirtieth of the
/// per-call cost for a web part that is measured.
pub const COUNT_FOR: Duration = Duration::from_millis(450);
pub const COUNT_EVERY: Duration = Duration::from_secs(15);
/// … but a window that saw requests and fewer than WINDOW_ANSWERS answers stays open until it
/// has them, for at most COUNT_LONGEST: a backend starved of CPU answers after 450 ms, and its
/// latency against its peers' (`fleet::latency`) would never be counted. A busy backend fills a
/// window in its first 450 ms, so the cost stays where it matters little.
pub const COUNT_LONGEST: Duration = Duration::from_secs(3);
pub const WINDOW_ANSWERS: u64 = 10;
/// The answer programs (status classes) run per packet of the watched port, so they too attach
/// only while the programs that follow connections are (a counting window, a suspicion), for a
/// longer sampling window of ANSWERS_FOR every ANSWERS_EVERY (opened with a counting window),
/// and while the answers' latest second failed: a box that answers only 5xx is seen within
/// COUNT_EVERY, then followed until the judgement is made.
const ANSWERS_FOR: Duration = Duration::from_secs(1);
/// … and a peer asking for fresh answers opens one at most this often.
const ANSWERS_ON_ASK: Duration = Duration::from_secs(3);
const ANSWERS_EVERY: Duration = Duration::from_secs(30);

/// The windows' clock.
#[derive(Debug, Default)]
pub struct Cadence {
    /// A counting window opened then…
    counting_since: Option<Instant>,
    /// … and the previous one closed then.
    counted_at: Option<Instant>,
    /// When the latest sampling window of the answer programs opened.
    answers_sampled_at: Option<Instant>,
}

impl Cadence {
    /// Whether a counting window is open.
    pub fn counting(&self) -> bool {
        self.counting_since.is_some()
    }

    /// One tick of the counting windows: an open one closes COUNT_FOR after it opened, unless
    /// it is `thin` (requests came and fewer than WINDOW_ANSWERS were answered; then up to
    /// COUNT_LONGEST); a new one opens COUNT_EVERY after the last closed, while the programs
    /// are not `attached` for another reason and nothing was `suspicious` lately. Returns
    /// whether the window closed at this tick.
    pub fn tick(&mut self, now: Instant, thin: bool, attached: bool, suspicious: bool) -> bool {
        if let Some(t) = self.counting_since {
            let open = now.saturating_duration_since(t);
            if open >= COUNT_FOR && (open >= COUNT_LONGEST || !thin) {
                self.counting_since = None;
                self.counted_at = Some(now);
                return true;
            }
        } else if !suspicious
            && !attached
            && self
                .counted_at
                .is_none_or(|t| now.saturating_duration_since(t) >= COUNT_EVERY)
        {
            self.counting_since = Some(now);
        }
        false
    }

    /// Whether the answer programs should be attached: a sampling window is due (ANSWERS_EVERY
    /// after the last, opened with the connection programs `following`, or with them failed to
    /// attach: `follow_failed`), or open (ANSWERS_FOR), or the connection programs are
    /// `following`, or the answers are `failing`. A due window is opened by `answers_opened`.
    pub fn answers_wanted(
        &self,
        now: Instant,
        following: bool,
        follow_failed: bool,
        failing: bool,
    ) -> (bool, bool) {
        let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
        let due = since(self.answers_sampled_at).is_none_or(|d| d >= ANSWERS_EVERY)
            && (following || follow_failed);
        let sampling = since(self.answers_sampled_at).is_some_and(|d| d < ANSWERS_FOR);
        (due || sampling || following || failing, due)
    }

    /// The answer programs attached for a due sampling window at `now`.
    pub fn answers_opened(&mut self, now: Instant) {
        self.answers_sampled_at = Some(now);
    }

    /// A peer waits on this instance's word about its answers (`?fresh=answers`): the next
    /// tick opens a counting window with an answers sampling window, unless one opened within
    /// ANSWERS_ON_ASK (a peer asks four times a second while it waits) or one is open.
    pub fn ask_soon(&mut self, now: Instant) {
        let recent = self
            .answers_sampled_at
            .is_some_and(|t| now.saturating_duration_since(t) < ANSWERS_ON_ASK);
        if recent || self.counting_since.is_some() {
            return;
        }
        self.counted_at = None;
        self.answers_sampled_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(250);

    /// Ticks from `from` for `ticks` ticks; the instants at which a window opened and closed.
    fn run(c: &mut Cadence, from: Instant, ticks: u32, thin: bool) -> (Vec<Instant>, Vec<Instant>) {
        let (mut opened, mut closed) = (Vec::new(), Vec::new());
        for i in 0..ticks {
            let now = from + TICK * i;
            let was = c.counting();
            if c.tick(now, thin, false, false) {
                closed.push(now);
            } else if !was && c.counting() {
                opened.push(now);
            }
        }
        (opened, closed)
    }

    #[test]
    fn a_counting_window_opens_every_15_s_for_two_ticks() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        let (opened, closed) = run(&mut c, t0, 4 * 31, false);
        assert_eq!(opened, vec![t0, t0 + TICK * 2 + COUNT_EVERY]);
        assert_eq!(closed, vec![t0 + TICK * 2, t0 + TICK * 4 + COUNT_EVERY]);
    }

    #[test]
    fn a_thin_window_stays_open_up_to_3_s_and_a_suspicion_opens_none() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        let (_, closed) = run(&mut c, t0, 16, true);
        assert_eq!(closed, vec![t0 + COUNT_LONGEST]);
        let mut quiet = Cadence::default();
        assert!(!quiet.tick(t0, false, false, true));
        assert!(!quiet.counting(), "suspicious: the programs follow anyway");
        assert!(!quiet.tick(t0, false, true, false));
        assert!(!quiet.counting(), "already attached");
    }

    #[test]
    fn the_answers_sample_with_a_window_every_30_s_and_a_peer_asks_for_one_sooner() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        assert_eq!(c.answers_wanted(t0, false, false, false), (false, false));
        assert_eq!(c.answers_wanted(t0, true, false, false), (true, true));
        c.answers_opened(t0);
        // Open for a second, even once the counting window closed.
        assert_eq!(
            c.answers_wanted(t0 + TICK * 3, false, false, false),
            (true, false)
        );
        assert_eq!(
            c.answers_wanted(t0 + ANSWERS_FOR, false, false, false),
            (false, false)
        );
        // Failing answers keep them attached.
        assert_eq!(
            c.answers_wanted(t0 + ANSWERS_FOR, false, false, true),
            (true, false)
        );
        // The next counting window 15 s on is not a sampling one: that is due at 30 s.
        assert_eq!(
            c.answers_wanted(t0 + COUNT_EVERY, true, false, false),
            (true, false)
        );
        assert_eq!(
            c.answers_wanted(t0 + ANSWERS_EVERY, true, false, false),
            (true, true)
        );

        // A peer asks 2 s after a sample: too soon. At 4 s: the next tick counts and samples.
        c.tick(t0, false, false, false);
        c.tick(t0 + COUNT_FOR, false, false, false);
        c.ask_soon(t0 + 2 * Duration::from_secs(1));
        assert!(!c.tick(t0 + 2 * Duration::from_secs(1), false, false, false));
        assert!(!c.counting(), "asked too soon: no window");
        c.ask_soon(t0 + ANSWERS_ON_ASK + TICK);
        c.tick(t0 + ANSWERS_ON_ASK + TICK * 2, false, false, false);
        assert!(c.counting());
        let now = t0 + ANSWERS_ON_ASK + TICK * 2;
        assert_eq!(c.answers_wanted(now, true, false, false), (true, true));
    }
}
