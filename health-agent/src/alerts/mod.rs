//! Alerting: incidents out of snapshots, to Slack, PagerDuty (Events v2), a generic JSON webhook
//! and GitHub issues. `Alerts::follow` subscribes to the snapshots the runner publishes and
//! `observe`s each: it only tracks incidents and queues messages; one sender task per
//! destination drains its own bounded queue, paced, with retries — so a dead or slow receiver
//! delays neither `/health` nor the other destinations, and one destination's messages stay in
//! order.
//!
//! A fault the fleet shares is one incident for the fleet, sent by one agent (`fleet`); the
//! others only follow it.
//!
//! Files: `incident` (conditions, the per-condition state machine, the event), `fleet` (who
//! sends the fleet's incidents), `queue` (the
//! bounded queue and its drop rule), `http` (pacing, timeout, retry/backoff), `error` (why a
//! message did not go out), `sink` (one JSON POST per message, told what to send by `slack`,
//! `pagerduty` and `webhook`), `github`, `report` (the incident report), `evidence` (its process
//! evidence). Secrets are kept out of logs by `crate::redact`.

pub mod error;
pub mod evidence;
pub mod fleet;
pub mod github;
pub mod http;
pub mod incident;
pub mod markdown;
pub mod pagerduty;
pub mod queue;
pub mod report;
pub mod sink;
pub mod slack;
pub mod webhook;

#[cfg(test)]
pub(crate) mod tests;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    sync::broadcast::{self, error::RecvError},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

pub use self::error::AlertError;
use self::{
    evidence::Pending,
    github::GitHub,
    http::{Http, Pacer, Tuning},
    incident::{Event, Kind, Scope, Tracker},
    queue::{Pushed, Queue},
    sink::JsonSink,
};
use crate::redact::host_of;
use crate::{config::AlertsConfig, snapshot::Snapshot};

/// `alert test` answers promptly: at most this many retries whatever `alerts.max_retries` says.
const TEST_MAX_RETRIES: u32 = 1;

enum Sink {
    /// Slack, PagerDuty, the webhook: one JSON POST per message.
    Json(JsonSink),
    GitHub(Box<GitHub>),
}

/// One configured receiver. `name` is what logs and `alert test` show: never a URL or key.
struct Destination {
    name: String,
    sink: Sink,
}

impl Destination {
    async fn deliver(&mut self, http: &Http, ev: &Event) -> Result<(), AlertError> {
        match &mut self.sink {
            Sink::Json(s) => s.deliver(http, ev).await,
            Sink::GitHub(s) => s.deliver(http, ev).await,
        }
    }

    async fn send_test(&mut self, http: &Http, host: &str) -> Result<(), AlertError> {
        match &mut self.sink {
            Sink::Json(s) => s.send_test(http, host).await,
            Sink::GitHub(s) => s.send_test(http, host).await,
        }
    }
}

/// The configured destinations, plus the name and reason of each configured one that cannot
/// work (a GitHub repo without a token).
fn destinations(
    cfg: &AlertsConfig,
    tuning: &Tuning,
) -> (Vec<Destination>, Vec<(String, AlertError)>) {
    let mut out = Vec::new();
    let mut unusable = Vec::new();
    if !cfg.slack_webhook_url.is_empty() {
        out.push(Destination {
            name: "slack".into(),
            sink: Sink::Json(slack::sink(
                &cfg.slack_webhook_url,
                Pacer::new(tuning.pace_slack),
            )),
        });
    }
    if !cfg.pagerduty_routing_key.is_empty() {
        out.push(Destination {
            name: "pagerduty".into(),
            sink: Sink::Json(pagerduty::sink(
                &cfg.pagerduty_url,
                &cfg.pagerduty_routing_key,
                Pacer::new(tuning.pace_pagerduty),
            )),
        });
    }
    if !cfg.webhook_url.is_empty() {
        out.push(Destination {
            name: format!("webhook {}", host_of(&cfg.webhook_url)),
            sink: Sink::Json(webhook::sink(
                &cfg.webhook_url,
                Pacer::new(tuning.pace_webhook),
            )),
        });
    }
    if !cfg.github_repo.is_empty() {
        let name = format!("github {}", cfg.github_repo);
        match (tuning.token)(&cfg.github_token_env).filter(|t| !t.trim().is_empty()) {
            Some(token) => out.push(Destination {
                name,
                sink: Sink::GitHub(Box::new(GitHub::new(
                    &cfg.github_api_url,
                    &cfg.github_repo,
                    token.trim(),
                    Pacer::new(tuning.pace_github),
                    tuning.evidence_interval,
                ))),
            }),
            None => unusable.push((name, AlertError::NoToken(cfg.github_token_env.clone()))),
        }
    }
    (out, unusable)
}

/// The running alerting: incident tracking here, one sender task per destination.
pub struct Alerts {
    host: Arc<str>,
    tracker: Tracker,
    queues: Vec<(String, Arc<Queue>)>,
    /// GitHub is configured: collect process evidence when an incident opens.
    evidence: Option<Duration>,
    senders: Vec<JoinHandle<()>>,
    /// With `[fleet]`: the incidents the fleet shares, sent by one agent for all.
    fleet: Option<fleet::Fleet>,
}

/// The destinations' queues, read when a snapshot is published: the messages waiting, all
/// destinations together (each queue bounded by `alerts.queue_size`; one being sent is out of
/// its queue).
#[derive(Clone, Default)]
pub struct Queued(Vec<Arc<Queue>>);

impl Queued {
    pub fn total(&self) -> usize {
        self.0.iter().map(|q| q.len()).sum()
    }
}

impl Alerts {
    /// A handle on the queues' lengths, kept after the alerts move into their task.
    pub fn queued(&self) -> Queued {
        Queued(self.queues.iter().map(|(_, q)| q.clone()).collect())
    }

    /// None when no destination is configured. Spawns the sender task (needs a tokio runtime).
    pub fn start(
        cfg: &AlertsConfig,
        hostname: String,
        shutdown: CancellationToken,
    ) -> Option<Self> {
        Self::start_tuned(cfg, hostname, shutdown, Tuning::default())
    }

    pub(crate) fn start_tuned(
        cfg: &AlertsConfig,
        hostname: String,
        shutdown: CancellationToken,
        tuning: Tuning,
    ) -> Option<Self> {
        let (dests, unusable) = destinations(cfg, &tuning);
        for (name, why) in &unusable {
            tracing::error!(destination = %name, "alerts to {name} are off: {why}");
        }
        if dests.is_empty() {
            return None;
        }
        let http = match Http::new(cfg, &tuning) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!("alerts are off: {e}");
                return None;
            }
        };
        let evidence = dests
            .iter()
            .any(|d| matches!(d.sink, Sink::GitHub(_)))
            .then_some(tuning.evidence_interval);
        let names: Vec<&str> = dests.iter().map(|d| d.name.as_str()).collect();
        tracing::info!(
            "alerts to {} (resolve after {}s)",
            names.join(", "),
            cfg.resolve_after.as_secs_f64()
        );
        let mut queues = Vec::new();
        let mut senders = Vec::new();
        for dest in dests {
            let queue = Arc::new(Queue::new(cfg.queue_size));
            queues.push((dest.name.clone(), queue.clone()));
            senders.push(tokio::spawn(run_sender(
                dest,
                queue,
                http.clone(),
                shutdown.clone(),
                tuning.flush,
            )));
        }
        Some(Self {
            host: hostname.into(),
            tracker: Tracker::new(cfg.resolve_after),
            queues,
            evidence,
            senders,
            fleet: None,
        })
    }

    /// Shares the fleet's incidents with the peers: one agent sends each for all of them.
    pub fn with_fleet(mut self, fleet: fleet::Fleet) -> Self {
        tracing::info!(
            "a fault the fleet shares is alerted once for fleet {}, by one agent",
            fleet.name()
        );
        self.fleet = Some(fleet);
        self
    }

    /// Observes every snapshot published on `snapshots` until every publisher is gone, then
    /// waits for the senders (`closed`).
    pub async fn follow(mut self, mut snapshots: broadcast::Receiver<Arc<Snapshot>>) {
        loop {
            match snapshots.recv().await {
                Ok(snap) => self.observe(&snap, Instant::now()),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!("alerts fell behind: {n} snapshots not looked at")
                }
                Err(RecvError::Closed) => break,
            }
        }
        self.closed().await;
    }

    /// Called for every snapshot (every ~250 ms). Must be cheap and NEVER block or await:
    /// it tracks incidents and enqueues messages into a bounded queue (drop-oldest-trigger,
    /// but never drop a resolve that follows a sent trigger — the rule is in `queue`).
    pub fn observe(&mut self, snap: &Snapshot, now: Instant) {
        let fleet_on = self.fleet.is_some();
        let transitions = self.tracker.step(|c| c.scope_in(snap, fleet_on), now);
        for t in transitions {
            if let (Scope::Fleet, Some(fleet)) = (t.scope, self.fleet.as_mut()) {
                let (verb, here) = match t.kind {
                    Kind::Trigger => ("open", "seen here"),
                    Kind::Resolve => ("close", "gone here"),
                };
                tracing::info!(
                    incident = %format!("{verb} {} #{}", t.condition.key(), t.incident),
                    "{} shared by fleet {}: {here} (one agent alerts for the fleet)",
                    t.condition.title(),
                    fleet.name()
                );
                fleet.local(&t, now);
                continue;
            }
            let ev = Event::new(
                &t,
                snap,
                self.host.clone(),
                evidence_for(t.kind, self.evidence),
            );
            Self::push(&self.queues, Arc::new(ev));
        }
        let Some(fleet) = self.fleet.as_mut() else {
            return;
        };
        for send in fleet.step(&snap.fleet.peer_alerts, now) {
            let evidence = evidence_for(send.kind, self.evidence);
            let ev = Event::new(&send.transition(), snap, self.host.clone(), evidence);
            let ev = Arc::new(ev.for_fleet(send.tag));
            if send.kind == Kind::Trigger {
                fleet.queued(send.condition, &ev);
            }
            Self::push(&self.queues, ev);
        }
        fleet.publish(now);
    }

    /// Into every destination's queue, saying what a full one dropped.
    fn push(queues: &[(String, Arc<Queue>)], ev: Arc<Event>) {
        tracing::info!(incident = %ev.describe(), "{}", ev.summary());
        for (name, queue) in queues {
            match queue.push(ev.clone()) {
                Pushed::Queued => {}
                Pushed::Evicted { incident } => tracing::warn!(
                    destination = %name,
                    "alert queue full: dropped the unsent incident #{incident}"
                ),
                Pushed::Dropped => tracing::warn!(
                    destination = %name,
                    "alert queue full: dropped {}",
                    ev.describe()
                ),
            }
        }
    }

    /// Waits for the sender tasks: after shutdown they deliver what is queued for at most a
    /// few seconds (`flush`), then stop. Call once the composer has stopped observing.
    pub async fn closed(self) {
        for s in self.senders {
            let _ = s.await;
        }
    }
}

/// A trigger's process evidence, started now, when GitHub is configured (`interval`).
fn evidence_for(kind: Kind, interval: Option<Duration>) -> Option<Pending> {
    match (kind, interval) {
        (Kind::Trigger, Some(interval)) => Pending::start(interval),
        _ => None,
    }
}

async fn run_sender(
    mut dest: Destination,
    queue: Arc<Queue>,
    http: Http,
    shutdown: CancellationToken,
    flush: Duration,
) {
    let name = dest.name.clone();
    let work = async {
        while let Some(ev) = queue.next(&shutdown).await {
            match dest.deliver(&http, &ev).await {
                Ok(()) => {
                    tracing::info!(destination = %name, incident = %ev.describe(), "alert sent")
                }
                Err(e) => tracing::error!(
                    destination = %name,
                    incident = %ev.describe(),
                    "alert not delivered: {e}"
                ),
            }
        }
    };
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(flush).await;
    };
    tokio::select! {
        _ = work => {}
        _ = deadline => {
            tracing::warn!(
                destination = %name,
                "shutdown: gave up flushing, {} alert(s) not delivered",
                queue.len()
            );
        }
    }
}

/// `health-agent alert test`: sends one test message to every configured destination.
pub async fn send_test(
    cfg: &AlertsConfig,
    hostname: &str,
) -> Vec<(String /*destination*/, Result<(), AlertError>)> {
    send_test_tuned(cfg, hostname, &Tuning::default()).await
}

pub(crate) async fn send_test_tuned(
    cfg: &AlertsConfig,
    hostname: &str,
    tuning: &Tuning,
) -> Vec<(String, Result<(), AlertError>)> {
    let (dests, unusable) = destinations(cfg, tuning);
    let mut results: Vec<(String, Result<(), AlertError>)> = Vec::new();
    if !dests.is_empty() {
        match Http::new(cfg, tuning) {
            Ok(http) => {
                let http = http.with_max_retries(TEST_MAX_RETRIES);
                let sends = dests.into_iter().map(|mut d| {
                    let http = http.clone();
                    async move {
                        // Already redacted: `AlertError` carries only redacted text.
                        let r = d.send_test(&http, hostname).await;
                        (d.name, r)
                    }
                });
                results.extend(futures_util::future::join_all(sends).await);
            }
            Err(e) => results.extend(dests.into_iter().map(|d| (d.name, Err(e.clone())))),
        }
    }
    results.extend(unusable.into_iter().map(|(n, why)| (n, Err(why))));
    results
}

/// What `alert test` says when no destination is configured: the variables it would read
/// and the keys.
pub fn none_configured(cfg: &AlertsConfig) -> String {
    let vars: Vec<&str> = [
        &cfg.slack_webhook_url_env,
        &cfg.pagerduty_routing_key_env,
        &cfg.webhook_url_env,
    ]
    .into_iter()
    .map(|v| v.trim())
    .filter(|v| !v.is_empty())
    .collect();
    let keys = "slack_webhook_url, pagerduty_routing_key, webhook_url or github_repo in [alerts]";
    match vars.as_slice() {
        [] => format!("no alert destination configured: set {keys}"),
        [one] => format!(
            "no alert destination configured: set {one} in the agent's environment, or {keys}"
        ),
        [first @ .., last] => format!(
            "no alert destination configured: set {} or {last} in the agent's environment, or \
             {keys}",
            first.join(", ")
        ),
    }
}

/// This machine's name for alerts: `/proc/sys/kernel/hostname`, else gethostname(2).
pub fn hostname() -> String {
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            return h.to_string();
        }
    }
    crate::sys::hostname().unwrap_or_else(|| "unknown-host".into())
}
