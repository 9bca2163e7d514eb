//! Whether a restart took, judged from fresh evidence once its action has returned: a pure
//! function of what the web check saw when the attempt started and what it sees now, so the
//! rules are tested as a table.
//!
//! A restart that did not take leaves the same strong evidence of a hang behind: the same
//! stopped or frozen processes hold the listener and nothing is answered. That is a
//! failed attempt at once, not at `heal.timeout`. A restart under way looks different: the
//! listener is gone (the old server stopped, the new one not bound yet), or new processes hold
//! it and have not served yet, or the old ones run again. Only then does `recovering` last,
//! and never past `heal.timeout`.

use std::time::Duration;

use crate::{checks::web::WebReport, status::WebVerdict};

/// What the web check shows of the backend's processes, as far as judging a restart needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebSigns {
    pub verdict: Option<WebVerdict>,
    pub listening: bool,
    /// The processes holding the listener (empty when unknown or not listening).
    pub pids: Vec<u32>,
    /// Set, with the reason, when every process holding the listener is stopped or frozen.
    pub frozen: Option<String>,
    /// Answers going out, as the kernel counted them (connections answered plus send calls;
    /// None without the kernel view): any change is the server moving. Connections taken alone
    /// are not: an unresponsive server keeps reading requests it never answers.
    pub progress: Option<u64>,
    /// While the web backend is erroring on enough real answers: since when the evidence
    /// runs (the answers' window starts over at a restart), to tell errors after a restart
    /// from the ones before it.
    pub erroring_since: Option<std::time::Instant>,
    /// Real answers by class (1xx–5xx at 1–5) since the answer programs loaded, without the
    /// agent's probe: those counted after a restart returned judge it, whether or not the
    /// processes changed (a restart command that does nothing leaves the same ones).
    pub answered: Option<[u64; 6]>,
    /// Slow against its peers, judged this round on the answers that began after this
    /// instant (a restart's return; `fleet::latency`).
    pub slow_judged_after: Option<std::time::Instant>,
}

impl WebSigns {
    pub fn of(web: &WebReport) -> Self {
        Self {
            verdict: Some(web.verdict),
            listening: web.listening,
            pids: web.pids.clone(),
            frozen: web.processes.as_ref().and_then(|p| p.frozen.clone()),
            progress: web
                .counters
                .as_ref()
                .map(|c| c.answered.saturating_add(c.sent)),
            erroring_since: web.signs.erroring_since,
            answered: web.signs.answered_by_class,
            slow_judged_after: None,
        }
    }

    /// With the peers' latency comparison (see `slow_judged_after`).
    pub fn with_slow(mut self, judged_after: Option<std::time::Instant>) -> Self {
        self.slow_judged_after = judged_after;
        self
    }
}

/// What the real answers counted since a restart returned say about it: `Failed` once at
/// least `min` of them came and `share` or more were 5xx; None while there are too few, they
/// are mostly fine, or the counts are not comparable (not visible, or counted afresh).
pub fn answers_after_return(
    at_return: Option<[u64; 6]>,
    now: Option<[u64; 6]>,
    since_return: Duration,
    min: u32,
    share: f64,
) -> Option<Judgement> {
    let (before, now) = (at_return?, now?);
    if now.iter().zip(&before).any(|(n, b)| n < b) {
        return None;
    }
    let answers: u64 = (1..6).map(|i| now[i] - before[i]).sum();
    let errors = now[5] - before[5];
    if answers < u64::from(min.max(1)) {
        return None;
    }
    let ratio = errors as f64 / answers as f64;
    (ratio >= share).then(|| {
        Judgement::Failed(format!(
            "the restart returned {} ago and changed nothing: {errors} of the {answers} real \
             answers since were 5xx ({:.0} %)",
            secs(since_return),
            ratio * 100.0
        ))
    })
}

/// Erroring after a restart that started at `started`: failed once the real answers counted
/// since it returned are mostly 5xx (`answers_after_return`, with `min_share`: the minimum
/// number and the share), or a window started over by new processes judges erroring again;
/// until then, waiting for them.
pub fn errors_after_return(
    answered_at_return: Option<[u64; 6]>,
    signs: &WebSigns,
    started: std::time::Instant,
    since_return: Duration,
    (min, share): (u32, f64),
    reason: &str,
) -> Judgement {
    let counted =
        answers_after_return(answered_at_return, signs.answered, since_return, min, share);
    if let Some(failed) = counted {
        return failed;
    }
    if signs.erroring_since.is_some_and(|t| t >= started) {
        return Judgement::Failed(format!(
            "the answers since the restart are still mostly 5xx ({reason})"
        ));
    }
    Judgement::UnderWay("waiting for enough answers after the restart to judge it".into())
}

/// Slow against its peers after a restart that returned at `returned`: failed once the
/// comparison is made on answers that all began after it and still says slow (`reason`);
/// until then, waiting for them.
pub fn slow_after_return(
    signs: &WebSigns,
    returned: std::time::Instant,
    since_return: Duration,
    reason: &str,
) -> Judgement {
    if signs.slow_judged_after.is_some_and(|t| t >= returned) {
        Judgement::Failed(format!(
            "the restart returned {} ago and the answers since are still {reason}",
            secs(since_return)
        ))
    } else {
        Judgement::UnderWay("waiting for enough answers after the restart to judge it".into())
    }
}

/// What the fresh evidence says about an attempt whose action has returned and whose fault
/// is still there.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    /// A restart is really under way (why): `recovering`, until `heal.timeout`.
    UnderWay(String),
    /// It did not take (why): the attempt failed.
    Failed(String),
}

/// Fresh evidence only: the first look after the action returned may have been taken before
/// it did, and a resumed process needs a moment to be seen running.
pub const SETTLE: Duration = Duration::from_millis(300);

fn pids(p: &[u32]) -> String {
    p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Judges a web fault that is still there `since_return` after the restart action returned.
/// `before`: the signs when the attempt started; `at_return`: the progress counter at the
/// first look after the action returned; `quiet_limit`: how long the same running processes
/// may take or answer nothing before the restart counts as having changed nothing
/// (`web.hung_after`).
pub fn judge(
    before: &WebSigns,
    now: &WebSigns,
    at_return: Option<u64>,
    since_return: Duration,
    quiet_limit: Duration,
) -> Judgement {
    if !now.listening {
        return Judgement::UnderWay("the listener is gone: a new server may be coming up".into());
    }
    let same: Vec<u32> = now
        .pids
        .iter()
        .copied()
        .filter(|p| before.pids.contains(p))
        .collect();
    if same.is_empty() && !now.pids.is_empty() {
        return Judgement::UnderWay(format!(
            "new processes ({}) hold the listener and have not served yet",
            pids(&now.pids)
        ));
    }
    if now.pids.is_empty() {
        // The agent could not tell who holds the listener: nothing to judge by but time.
        return Judgement::UnderWay("the processes holding the listener are not known".into());
    }
    let moved = match (at_return, now.progress) {
        (Some(a), Some(n)) => Some(n != a),
        _ => None,
    };
    if let Some(why) = &now.frozen {
        if moved != Some(true) {
            return Judgement::Failed(format!(
                "the restart returned {} ago and changed nothing: the same processes ({}) hold \
                 the listener, {why}{}",
                secs(since_return),
                pids(&same),
                if moved.is_some() {
                    ", nothing answered since"
                } else {
                    ""
                }
            ));
        }
    }
    match moved {
        Some(false) if since_return >= quiet_limit => Judgement::Failed(format!(
            "the same processes ({}) hold the listener and answered nothing in the {} after \
             the restart returned",
            pids(&same),
            secs(since_return)
        )),
        Some(true) => Judgement::UnderWay(format!(
            "the same processes ({}) run and answer again",
            pids(&same)
        )),
        _ => Judgement::UnderWay(format!(
            "the same processes ({}) are no longer stopped",
            pids(&same)
        )),
    }
}

/// Why the fault counts as gone, or None while the web check cannot confirm it: it sees
/// nothing (`unknown`, e.g. a restarted container's new namespace not found yet), or a fault
/// still (the policy may hold it back a moment, while the peers are asked: that is no
/// recovery).
pub fn recovered(now: &WebSigns) -> Option<String> {
    match now.verdict {
        Some(v) if v == WebVerdict::Unknown || v.is_fault() || v == WebVerdict::Erroring => None,
        Some(v) if v != WebVerdict::NotConfigured => Some(format!(
            "the fault cleared: webserver {}{}",
            v.as_str(),
            if now.pids.is_empty() {
                String::new()
            } else {
                format!(", processes {} hold the listener", pids(&now.pids))
            }
        )),
        _ => Some("the fault cleared".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signs(listening: bool, p: &[u32], frozen: bool, progress: Option<u64>) -> WebSigns {
        WebSigns {
            verdict: Some(WebVerdict::Hung),
            listening,
            pids: p.to_vec(),
            frozen: frozen.then(|| "server processes 7 stopped".to_string()),
            progress,
            erroring_since: None,
            answered: None,
            slow_judged_after: None,
        }
    }

    const QUIET: Duration = Duration::from_secs(2);

    fn failed(j: &Judgement) -> bool {
        matches!(j, Judgement::Failed(_))
    }

    #[test]
    fn the_same_stopped_processes_fail_the_attempt_at_the_first_fresh_look() {
        let before = signs(true, &[7], true, Some(40));
        let now = signs(true, &[7], true, Some(40));
        let j = judge(&before, &now, Some(40), SETTLE, QUIET);
        assert!(failed(&j), "{j:?}");
        let Judgement::Failed(why) = j else {
            unreachable!()
        };
        assert!(
            why.contains("same processes (7)") && why.contains("stopped"),
            "{why}"
        );
        // Without the kernel view the stopped processes alone say it.
        let j = judge(
            &signs(true, &[7], true, None),
            &signs(true, &[7], true, None),
            None,
            SETTLE,
            QUIET,
        );
        assert!(failed(&j), "{j:?}");
    }

    #[test]
    fn a_restart_under_way_is_not_failed() {
        let before = signs(true, &[7], true, Some(40));
        let table = [
            (signs(false, &[], false, Some(40)), "listener gone"),
            (signs(true, &[9], false, Some(40)), "new processes"),
            (signs(true, &[9], true, Some(40)), "new processes, stopped"),
            (signs(true, &[7], false, Some(41)), "the old ones move"),
            (
                signs(true, &[7], false, Some(40)),
                "resumed, not quiet long",
            ),
            (signs(true, &[7], true, Some(45)), "stopped but moved since"),
        ];
        for (now, what) in table {
            let j = judge(&before, &now, Some(40), SETTLE, QUIET);
            assert!(matches!(j, Judgement::UnderWay(_)), "{what}: {j:?}");
        }
    }

    #[test]
    fn the_same_running_processes_quiet_past_the_limit_fail_it() {
        let before = signs(true, &[7, 8], false, Some(40));
        let now = signs(true, &[7, 8], false, Some(40));
        assert!(!failed(&judge(&before, &now, Some(40), QUIET / 2, QUIET)));
        let j = judge(&before, &now, Some(40), QUIET, QUIET);
        assert!(failed(&j), "{j:?}");
        // Without counters, time alone (heal.timeout) decides.
        let now = signs(true, &[7, 8], false, None);
        assert!(!failed(&judge(&before, &now, None, QUIET * 5, QUIET)));
    }

    #[test]
    fn unknown_is_not_recovered() {
        let mut s = signs(true, &[9], false, Some(1));
        s.verdict = Some(WebVerdict::Unknown);
        assert_eq!(recovered(&s), None);
        // A fault the policy holds back for a moment is not a recovery either.
        for v in [WebVerdict::Down, WebVerdict::Hung, WebVerdict::Erroring] {
            let s = WebSigns {
                verdict: Some(v),
                ..s.clone()
            };
            assert_eq!(recovered(&s), None, "{v:?}");
        }
        s.verdict = Some(WebVerdict::Up);
        assert!(recovered(&s).is_some_and(|w| w.contains("up") && w.contains('9')));
    }
}
