//! Damping (pure): a database turns `unreachable` only after `fail_after` consecutive failed
//! round trips and comes back after `recover_after` consecutive good ones; a good round trip
//! slower than `slow_after` is `slow`; a refusal (the server answered and said no) is reported
//! at once.

use crate::status::DbState;

/// How one round trip went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundTrip {
    Fast,
    Slow,
    Failed,
    /// The database answered and refused us (see `Failure::Refused`).
    Refused,
}

/// The damped state of one database: `Unknown` until the first decisive evidence, `unreachable`
/// after `fail_after` consecutive failures, back after `recover_after` consecutive successes.
/// A failure that has not reached `fail_after` leaves the state as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damper {
    fail_after: u32,
    recover_after: u32,
    state: DbState,
    consecutive_failures: u32,
    consecutive_successes: u32,
}

impl Damper {
    pub fn new(fail_after: u32, recover_after: u32) -> Self {
        Self {
            fail_after: fail_after.max(1),
            recover_after: recover_after.max(1),
            state: DbState::Unknown,
            consecutive_failures: 0,
            consecutive_successes: 0,
        }
    }

    pub fn state(&self) -> DbState {
        self.state
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    pub fn observe(&mut self, r: RoundTrip) -> DbState {
        match r {
            // An answer, not an outage: nothing to damp.
            RoundTrip::Refused => {
                self.consecutive_failures = 0;
                self.consecutive_successes = 0;
                self.state = DbState::Misconfigured;
            }
            RoundTrip::Failed => {
                self.consecutive_successes = 0;
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.consecutive_failures >= self.fail_after {
                    self.state = DbState::Unreachable;
                }
            }
            RoundTrip::Fast | RoundTrip::Slow => {
                self.consecutive_failures = 0;
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                let recovered = self.state != DbState::Unreachable
                    || self.consecutive_successes >= self.recover_after;
                if recovered {
                    self.state = if r == RoundTrip::Slow {
                        DbState::Slow
                    } else {
                        DbState::Connected
                    };
                }
            }
        }
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_reported_at_once_and_an_outage_is_damped() {
        let mut d = Damper::new(3, 1);
        assert_eq!(d.observe(RoundTrip::Fast), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Refused), DbState::Misconfigured);
        assert_eq!(d.observe(RoundTrip::Fast), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Connected);
        assert_eq!(d.observe(RoundTrip::Failed), DbState::Unreachable);
    }

    #[test]
    fn damping_table() {
        use DbState::{Connected as C, Slow as S, Unknown as U, Unreachable as X};
        use RoundTrip::{Failed as F, Fast as G, Slow as Sl};
        /// (what, fail_after, recover_after, round trips, damped state after each)
        type Row = (
            &'static str,
            u32,
            u32,
            &'static [RoundTrip],
            &'static [DbState],
        );
        #[rustfmt::skip]
        let table: &[Row] = &[
            ("one failure is not decisive", 2, 1, &[F], &[U]),
            ("fail_after failures are", 2, 1, &[F, F], &[U, X]),
            ("a success resets the count", 2, 1, &[G, F, G, F, F], &[C, C, C, C, X]),
            ("recover at once by default", 2, 1, &[F, F, G], &[U, X, C]),
            ("recover_after successes", 1, 3, &[F, G, G, G], &[X, X, X, C]),
            ("a failure restarts recovery", 1, 2, &[F, G, F, G, G], &[X, X, X, X, C]),
            ("slow is reported", 2, 1, &[Sl, G, Sl], &[S, C, S]),
            ("slow counts toward recovery", 1, 2, &[F, Sl, Sl, G], &[X, X, S, C]),
            ("slow then failures", 3, 1, &[Sl, F, F, F], &[S, S, S, X]),
            ("fail_after 1 is immediate", 1, 1, &[G, F, G], &[C, X, C]),
        ];
        for (name, fail_after, recover_after, rounds, want) in table {
            let mut d = Damper::new(*fail_after, *recover_after);
            assert_eq!(d.state(), U, "{name}: starts unknown");
            let got: Vec<DbState> = rounds.iter().map(|r| d.observe(*r)).collect();
            assert_eq!(&got, want, "{name}");
        }
        let mut d = Damper::new(3, 1);
        let counts: Vec<u32> = [F, F, G, F]
            .iter()
            .map(|r| {
                d.observe(*r);
                d.consecutive_failures()
            })
            .collect();
        assert_eq!(counts, [1, 2, 0, 1]);
    }
}
