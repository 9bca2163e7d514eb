//! How a verdict's detail says what the evidence shows: the work that waits, the last
//! answer, what the server waits on, and the process that is stuck.

use std::time::Duration;

use super::{DependencyWait, Evidence, KernelEvidence, WebConfig, WorkerView};

pub(super) fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// "3 connections wait in the accept queue (oldest 1.2s), 2 requests unanswered (oldest 0.8s)"
pub(super) fn work(e: &Evidence) -> String {
    let mut parts = Vec::new();
    if e.queue > 0 {
        let oldest = e
            .kernel
            .as_ref()
            .and_then(|k| k.oldest_waiting)
            .or(e.queue_busy_for)
            .map_or(String::new(), |d| format!(" (oldest {})", secs(d)));
        parts.push(format!(
            "{} connections wait in the accept queue{oldest}",
            e.queue
        ));
    }
    if let Some(k) = e.kernel.as_ref().filter(|k| k.pending > 0) {
        let oldest = k
            .oldest_pending
            .map_or(String::new(), |d| format!(" (oldest {})", secs(d)));
        parts.push(format!("{} requests unanswered{oldest}", k.pending));
    }
    if let (Some(p), Some(d)) = (e.probe.as_ref().filter(|p| !p.ok), e.probe_failing_for) {
        parts.push(format!(
            "the probe failing for {} ({})",
            secs(d),
            p.error.as_deref().unwrap_or("no answer")
        ));
    }
    if parts.is_empty() {
        "work waits".into()
    } else {
        parts.join(", ")
    }
}

/// "nothing answered for 3.1s" / "nothing answered since the agent started"
pub(super) fn last_answer(k: Option<&KernelEvidence>) -> String {
    match k.map(|k| k.since_answer) {
        Some(Some(d)) => format!("the last answer went out {} ago", secs(d)),
        Some(None) => "no answer seen since the agent started".into(),
        None => "kernel view unavailable".into(),
    }
}

/// Work waits and nothing goes out: "2 requests unanswered (oldest 3.1s); nothing answered
/// for 4.3s, 0% CPU: unresponsive (503) once …", saying what the hang rules wait for.
pub(super) fn unanswered(e: &Evidence, cfg: &WebConfig) -> String {
    let k = e.kernel.as_ref();
    let quiet = match k.map(|k| k.since_answer) {
        Some(Some(d)) => format!("nothing answered for {}", secs(d)),
        Some(None) => "nothing answered since the agent started".into(),
        None => "no answer seen (kernel view unavailable)".into(),
    };
    let cpu = e
        .cpu_percent
        .map_or(String::new(), |p| format!(", {p:.0}% CPU"));
    let in_progress = k.is_some_and(|k| k.oldest_pending.is_some())
        || e.probe.as_ref().is_some_and(|p| p.timed_out);
    let then = match k {
        // Only connections queued: the weak-evidence hang rule decides.
        Some(k) if !in_progress => format!(
            "hung (503) once nothing is taken or answered for {}",
            secs(super::quiet_limit(k, cfg))
        ),
        _ => format!(
            "unresponsive (503) once a request has waited web.unanswered_after ({}) or the \
             probe has failed that long",
            secs(cfg.unanswered_after)
        ),
    };
    format!("{}; {quiet}{cpu}: {then}", work(e))
}

pub(super) fn waiting_on(d: &DependencyWait) -> String {
    let mut s = format!("waiting on {}", d.endpoint);
    if d.waiting_ms > 0 {
        s.push_str(&format!(
            " for {}",
            secs(Duration::from_millis(d.waiting_ms))
        ));
    }
    s.push_str(&format!(
        " ({} connection{}",
        d.connections,
        if d.connections == 1 { "" } else { "s" }
    ));
    if d.connecting > 0 {
        s.push_str(&format!(", {} still connecting", d.connecting));
    }
    s.push(')');
    s
}

/// "process 4242 (puma: cluster worker 1: 4200) stopped: 2 requests unanswered (oldest 1.2s)…"
pub(super) fn describe_stuck(w: &WorkerView, k: Option<&KernelEvidence>) -> String {
    let held = format!(
        "{} request{} unanswered (oldest {})",
        w.unanswered,
        if w.unanswered == 1 { "" } else { "s" },
        secs(Duration::from_millis(w.oldest_unanswered_ms))
    );
    let how = match &w.frozen {
        Some(why) if w.unanswered == 0 => format!(
            "{why} for {}, holding no request",
            secs(Duration::from_millis(w.frozen_ms))
        ),
        Some(why) => format!("{why}: holds {held}"),
        None => format!(
            "holds {held} and sent nothing for {}, {:.0}% CPU, no outbound request in flight",
            secs(Duration::from_millis(
                w.last_sent_ms.unwrap_or(w.oldest_unanswered_ms)
            )),
            w.cpu_percent.unwrap_or_default()
        ),
    };
    let others = match k {
        Some(_) => format!("the other processes answer ({})", last_answer(k)),
        None => "the probe is answered".into(),
    };
    let parent = if w.is_master {
        "it is the master of other processes holding the listener".to_string()
    } else if !w.parent_holds_listener {
        format!("its parent {} does not hold the listener", w.parent)
    } else if let Some(why) = &w.parent_unable {
        format!("its parent {} (the master) is {why}", w.parent)
    } else {
        format!("its parent {} (the master) holds the listener", w.parent)
    };
    // Its share of the capacity, which the saturation still counts until it is replaced.
    let share = if w.workers > 1 && !w.is_master {
        format!(
            "; 1 of {} workers: {:.0}% of the capacity gone",
            w.workers,
            100.0 / f64::from(w.workers)
        )
    } else {
        String::new()
    };
    format!(
        "process {} ({}) {how}{share}; {others}; {parent}",
        w.pid, w.command
    )
}
