//! The flap guard: a change of HTTP code is published only once it has held for its time, so
//! one bad (or good) round does not move the instance in or out of rotation.

use std::time::{Duration, Instant};

use super::{Decision, Status};

/// Holds back a change of HTTP code until the new code has held for its time:
/// `fail_after` to go to 503, `recover_after` to come back to 200. Changes within the same
/// code (healthy ↔ degraded) pass straight through.
#[derive(Debug)]
pub struct FlapGuard {
    fail_after: Duration,
    recover_after: Duration,
    published: Option<Decision>,
    /// The HTTP code the raw decisions moved to, and since when.
    pending: Option<(u16, Instant)>,
}

impl FlapGuard {
    pub fn new(fail_after: Duration, recover_after: Duration) -> Self {
        Self {
            fail_after,
            recover_after,
            published: None,
            pending: None,
        }
    }

    /// A change of code is waiting out its time.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    pub fn apply(&mut self, raw: Decision, now: Instant) -> Decision {
        let Some(published) = &self.published else {
            self.published = Some(raw.clone());
            return raw;
        };
        // Leaving boot is not a recovery: an instance becomes ready the moment it is. A drain
        // is the operator's word, not a flap: it takes the instance out at once, and ends at
        // once, into the booting rule (a backend the deploy stopped meanwhile was no fault).
        if raw.http == published.http
            || published.status == Status::Booting
            || raw.status == Status::Draining
            || published.status == Status::Draining
        {
            self.pending = None;
            self.published = Some(raw.clone());
            return raw;
        }
        let since = match self.pending {
            Some((code, since)) if code == raw.http => since,
            _ => {
                self.pending = Some((raw.http, now));
                now
            }
        };
        let needed = if raw.http >= 500 {
            self.fail_after
        } else {
            self.recover_after
        };
        let held = now.saturating_duration_since(since);
        if held >= needed {
            self.pending = None;
            self.published = Some(raw.clone());
            return raw;
        }
        let mut kept = published.clone();
        if raw.http < 500 && kept.http >= 500 {
            // The published 503's evidence is what the instance is recovering from, no longer
            // what it sees now: say so, rather than quote "oldest 7.7s" as if current.
            for r in &mut kept.reasons {
                *r = format!("recovering from: {r}");
            }
        }
        kept.reasons.push(format!(
            "turning {} ({}) once it has held {:.1}s of {}s",
            raw.status.as_str(),
            raw.http,
            held.as_secs_f64(),
            needed.as_secs_f64()
        ));
        kept
    }
}
