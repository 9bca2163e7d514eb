//! The supervisor: watches the check loop from outside it, so a stuck or dead loop is named in
//! the log and raised as an alert, not only seen as an old snapshot.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Publisher;
use crate::config::Config;

/// How often the supervisor looks at the check loop.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Watches the check loop from outside it. Once its snapshot is older than
/// `checks.stale_after` (the loop is stuck) or its task has ended before shutdown (a panic),
/// `/health` and `/livez` already answer 503 from the snapshot's age; this says why in the log
/// and publishes the last snapshot, marked stopped, to the alerts (an `unhealthy` incident)
/// every look until the loop publishes again. After shutdown it waits for the loop (the
/// kernel programs detached) and then for the alerts to flush.
pub(super) async fn supervise(
    mut composer: JoinHandle<()>,
    publisher: Publisher,
    alerts: Option<JoinHandle<()>>,
    cfg: Arc<Config>,
    shutdown: CancellationToken,
) {
    let mut ended: Option<String> = None;
    let mut was_down = false;
    let mut tick = tokio::time::interval(SUPERVISE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = &mut composer, if ended.is_none() => {
                if shutdown.is_cancelled() {
                    // Joined already: awaiting it again below would panic, and the alerts
                    // would not be flushed.
                    ended = Some("stopped at shutdown".into());
                    break;
                }
                let why = match r {
                    Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
                    Err(_) => "was stopped".to_string(),
                    Ok(()) => "returned".to_string(),
                };
                tracing::error!("the check loop {why}: /health and /livez answer 503 from now on");
                ended = Some(why);
            }
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let snap = publisher.latest();
        let age = now.saturating_duration_since(snap.created);
        let stopped = match &ended {
            Some(why) => Some(format!("the agent's check loop {why}")),
            None if age > cfg.checks.stale_after => Some(format!(
                "the agent's check loop has not finished a round for {:.0}s",
                age.as_secs_f64()
            )),
            None => None,
        };
        match (&stopped, was_down) {
            (Some(why), false) => {
                tracing::error!("{why}: the agent can no longer vouch for this instance")
            }
            (None, true) => tracing::info!("the check loop is running again"),
            _ => {}
        }
        was_down = stopped.is_some();
        // Only the alerts see it: `/health` answers from the old snapshot's age.
        if let Some(why) = &stopped {
            publisher.alert(snap.as_stopped(why));
        }
    }
    if ended.is_none() {
        let _ = composer.await;
    }
    // The last publisher gone, the alerts flush what is queued and stop.
    drop(publisher);
    if let Some(a) = alerts {
        let _ = a.await;
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
