//! The publishing task: samples the saturation from the published snapshot every second,
//! closes one statistic set per `interval`, and sends the closed ones in one PutMetricData —
//! on tasks of their own, so a CloudWatch that is down, stalling or throttling only delays
//! the metric, never `/health`. Retries are bounded (`max_retries`, with exponential backoff
//! and jitter); unsent data wait in a bounded queue, the oldest dropped first.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::{self, Datum, Target};
use crate::{
    aws::{
        credentials::Provider,
        imds::{Imds, ImdsError},
        query::QueryError,
    },
    config::CloudWatchConfig,
    text::rfc3339,
};

/// Reads the latest saturation ratio (1.0 = at capacity); `None` while withheld. The runner
/// reads it from the published snapshot, so this module needs nothing of `snapshot` (which
/// shows this module's `Status`).
pub type Source = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

/// Closed intervals kept while CloudWatch cannot be reached (an hour at the default 60 s).
const MAX_PENDING: usize = 60;
/// Data per request: PutMetricData's long-standing limit (newer accounts allow more).
const MAX_BATCH: usize = 20;

/// Timing knobs; tests shrink the backoff.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub sample_every: Duration,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Tuning {
    pub fn for_interval(interval: Duration) -> Self {
        Self {
            sample_every: Duration::from_secs(1).min(interval),
            backoff_base: Duration::from_secs(1),
            // Retries of one batch end well before the next one is due.
            backoff_cap: (interval / 4).clamp(Duration::from_secs(1), Duration::from_secs(30)),
        }
    }
}

/// `details.scaling.cloudwatch`: what was published, and what went wrong.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Status {
    pub enabled: bool,
    pub namespace: String,
    pub metric: String,
    /// The `AutoScalingGroupName` dimension, once known (configured or from the metadata).
    pub auto_scaling_group: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    /// Where the keys come from: "environment", "web identity (role …)", "profile NAME (file)",
    /// "container credentials (URL)", "instance role (IMDSv2)". Never a key.
    pub credentials: Option<String>,
    pub interval_seconds: u64,
    /// When the last PutMetricData was accepted, and the last value it carried (percent).
    pub last_success: Option<String>,
    #[serde(serialize_with = "crate::text::shown::percent_opt")]
    pub last_value_percent: Option<f64>,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    /// Samples in the interval being collected.
    pub pending_samples: u64,
    /// Closed intervals not yet accepted (queued, or in the request being sent).
    pub pending_data: usize,
    pub published_data: u64,
    /// Intervals given up: the queue overflowed, or CloudWatch refused them for good.
    pub dropped_data: u64,
    /// Batches tried; each is at most 1 + `max_retries` requests.
    pub batches: u64,
    pub requests: u64,
    pub retries: u64,
    /// Samples skipped because the saturation was withheld (a dependency fault).
    pub withheld_samples: u64,
}

impl Status {
    pub fn disabled() -> Self {
        Self::default()
    }
}

#[derive(Default)]
struct Acc {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Acc {
    fn add(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += v;
    }
}

struct State {
    acc: Acc,
    pending: VecDeque<Datum>,
    /// Data taken from `pending` by the request in progress.
    in_flight: usize,
    status: Status,
}

impl State {
    /// Queues data at the back (new) or the front (a failed batch), dropping the oldest
    /// beyond the bound.
    fn queue(&mut self, data: impl IntoIterator<Item = Datum>, front: bool) {
        let data: Vec<Datum> = data.into_iter().collect();
        if front {
            for d in data.into_iter().rev() {
                self.pending.push_front(d);
            }
        } else {
            self.pending.extend(data);
        }
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
            self.status.dropped_data += 1;
        }
        self.status.pending_data = self.pending.len() + self.in_flight;
    }

    fn error(&mut self, e: impl std::fmt::Display) {
        self.status.last_error = Some(e.to_string());
        self.status.last_error_at = Some(rfc3339(SystemTime::now()));
    }
}

/// Why the publisher does not know where to send (shown as `last_error`).
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error("cannot find the region: {0}; set scaling.cloudwatch.region")]
    Region(ImdsError),
    #[error("cannot find the auto-scaling group: {0}")]
    Group(ImdsError),
    #[error("endpoint: {0}")]
    Endpoint(crate::aws::endpoint::EndpointError),
}

/// The running publisher; `status()` is what `details.scaling.cloudwatch` shows.
#[derive(Clone)]
pub struct Handle {
    state: Arc<Mutex<State>>,
}

impl Handle {
    pub fn status(&self) -> Status {
        match self.state.lock() {
            Ok(s) => s.status.clone(),
            Err(p) => p.into_inner().status.clone(),
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A panic while holding it leaves plain numbers behind: still usable.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the sampler and the sender when `[scaling.cloudwatch]` is enabled.
pub fn start(
    cfg: &CloudWatchConfig,
    source: Source,
    tuning: Tuning,
    shutdown: CancellationToken,
) -> Option<Handle> {
    if !cfg.enabled {
        return None;
    }
    let imds = Arc::new(Imds::from_env(cfg.timeout));
    let provider = Provider::from_env(imds.clone(), &cfg.region);
    let state = Arc::new(Mutex::new(State {
        acc: Acc::default(),
        pending: VecDeque::new(),
        in_flight: 0,
        status: Status {
            enabled: true,
            namespace: cfg.namespace.clone(),
            metric: cfg.metric.clone(),
            credentials: Some(provider.source().to_string()),
            interval_seconds: cfg.interval.as_secs(),
            ..Status::default()
        },
    }));
    let closed = Arc::new(Notify::new());
    tokio::spawn(sample(
        cfg.interval,
        tuning.sample_every,
        source,
        state.clone(),
        closed.clone(),
        shutdown.clone(),
    ));
    let http = reqwest::Client::builder()
        .timeout(cfg.timeout)
        .connect_timeout(cfg.timeout)
        .build()
        .unwrap_or_default();
    let sender = Sender {
        cfg: cfg.clone(),
        tuning,
        http,
        imds,
        provider,
        target: None,
        state: state.clone(),
        shutdown: shutdown.clone(),
    };
    tokio::spawn(sender.run(closed));
    tracing::info!(
        "publishing {}/{} to CloudWatch every {}",
        cfg.namespace,
        cfg.metric,
        humantime::format_duration(cfg.interval)
    );
    Some(Handle { state })
}

async fn sample(
    interval: Duration,
    every: Duration,
    source: Source,
    state: Arc<Mutex<State>>,
    closed: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = tokio::time::Instant::now();
    let mut next_close = start + interval;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let value = source();
        let now = tokio::time::Instant::now();
        let mut s = lock(&state);
        match value {
            Some(v) if v.is_finite() && v >= 0.0 => s.acc.add(v * 100.0),
            Some(_) => {}
            None => s.status.withheld_samples += 1,
        }
        if now >= next_close {
            while next_close <= now {
                next_close += interval;
            }
            let acc = std::mem::take(&mut s.acc);
            if acc.count > 0 {
                s.queue(
                    [Datum {
                        timestamp: SystemTime::now(),
                        count: acc.count,
                        sum: acc.sum,
                        min: acc.min,
                        max: acc.max,
                    }],
                    false,
                );
                closed.notify_one();
            }
        }
        s.status.pending_samples = s.acc.count;
    }
}

struct Sender {
    cfg: CloudWatchConfig,
    tuning: Tuning,
    http: reqwest::Client,
    imds: Arc<Imds>,
    provider: Provider,
    target: Option<Target>,
    state: Arc<Mutex<State>>,
    shutdown: CancellationToken,
}

impl Sender {
    async fn run(mut self, closed: Arc<Notify>) {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = closed.notified() => {}
            }
            // Everything pending, a batch at a time; a batch that fails stays queued for the
            // next interval rather than being retried without end.
            loop {
                let batch: Vec<Datum> = {
                    let mut s = lock(&self.state);
                    let n = s.pending.len().min(MAX_BATCH);
                    let batch = s.pending.drain(..n).collect();
                    s.in_flight = n;
                    batch
                };
                if batch.is_empty() {
                    break;
                }
                let sent = self.send(&batch).await;
                let mut s = lock(&self.state);
                s.in_flight = 0;
                s.status.pending_data = s.pending.len();
                match sent {
                    Ok(()) => {
                        s.status.published_data += batch.len() as u64;
                        s.status.last_success = Some(rfc3339(SystemTime::now()));
                        s.status.last_value_percent = batch
                            .last()
                            .map(|d| (d.sum / d.count.max(1) as f64 * 10.0).round() / 10.0);
                    }
                    Err(Some(e)) if e.retryable() => {
                        s.error(&e);
                        s.queue(batch, true);
                        break;
                    }
                    Err(Some(e)) => {
                        s.error(&e);
                        s.status.dropped_data += batch.len() as u64;
                    }
                    Err(None) => {
                        // Shut down, or no target (its error is already recorded).
                        s.queue(batch, true);
                        break;
                    }
                }
            }
        }
    }

    /// Region, group and endpoint: configured, else from the environment and the instance
    /// metadata. Looked up again after a failure (the metadata may come up later).
    async fn target(&mut self) -> Result<Target, TargetError> {
        if let Some(t) = &self.target {
            return Ok(t.clone());
        }
        let region = crate::aws::region(&self.cfg.region, &self.imds)
            .await
            .map_err(TargetError::Region)?;
        let group = if !self.cfg.auto_scaling_group.is_empty() {
            self.cfg.auto_scaling_group.clone()
        } else {
            self.imds
                .get("tags/instance/aws:autoscaling:groupName")
                .await
                .map_err(TargetError::Group)?
        };
        let (endpoint, _) = crate::aws::endpoint::resolve(
            crate::aws::endpoint::Service::CloudWatch,
            &self.cfg.endpoint,
            &region,
            &|k| std::env::var(k).ok(),
        )
        .map_err(TargetError::Endpoint)?;
        let target = Target {
            endpoint,
            region,
            namespace: self.cfg.namespace.clone(),
            metric: self.cfg.metric.clone(),
            group,
            high_resolution: self.cfg.high_resolution,
        };
        {
            let mut s = lock(&self.state);
            s.status.region = Some(target.region.clone());
            s.status.auto_scaling_group = Some(target.group.clone());
            s.status.endpoint = Some(target.endpoint.as_str().to_string());
        }
        self.target = Some(target.clone());
        Ok(target)
    }

    /// One batch, with up to `max_retries` retries. `Err(None)`: nothing was tried (no target
    /// or credentials, recorded as the last error) or shutdown came first.
    async fn send(&mut self, batch: &[Datum]) -> Result<(), Option<QueryError>> {
        let target = match self.target().await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("CloudWatch: {e}");
                lock(&self.state).error(e);
                return Err(None);
            }
        };
        lock(&self.state).status.batches += 1;
        let mut attempt = 0u32;
        loop {
            let creds = match self.provider.get().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("CloudWatch: {e}");
                    lock(&self.state).error(&e);
                    return Err(None);
                }
            };
            lock(&self.state).status.requests += 1;
            let e = match client::put(&self.http, &target, &creds, batch).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if matches!(e, QueryError::Credentials { .. }) {
                self.provider.invalidate();
            }
            if !e.retryable() || attempt >= self.cfg.max_retries {
                tracing::warn!(
                    "CloudWatch PutMetricData failed after {} attempt(s): {e}",
                    attempt + 1
                );
                return Err(Some(e));
            }
            tracing::debug!("CloudWatch PutMetricData: {e}; retrying");
            lock(&self.state).status.retries += 1;
            let delay = backoff(&self.tuning, attempt);
            attempt += 1;
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(None),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Exponential backoff with jitter: a random point in the upper half of `base × 2^attempt`,
/// capped, so agents throttled together do not retry together.
fn backoff(t: &Tuning, attempt: u32) -> Duration {
    let full = t
        .backoff_base
        .saturating_mul(1u32 << attempt.min(16))
        .min(t.backoff_cap);
    full.mul_f64(0.5 + fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let t = Tuning {
            sample_every: Duration::from_secs(1),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(15),
        };
        for attempt in 0..20 {
            let d = backoff(&t, attempt);
            let full = Duration::from_secs(1u64 << attempt.min(16)).min(t.backoff_cap);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
        assert_eq!(
            Tuning::for_interval(Duration::from_secs(60)).backoff_cap,
            Duration::from_secs(15)
        );
    }

    #[test]
    fn the_queue_is_bounded_and_drops_the_oldest() {
        let mut s = State {
            acc: Acc::default(),
            pending: VecDeque::new(),
            in_flight: 0,
            status: Status::default(),
        };
        let d = |i: u64| Datum {
            timestamp: SystemTime::UNIX_EPOCH + Duration::from_secs(i),
            count: 1,
            sum: i as f64,
            min: 0.0,
            max: 0.0,
        };
        s.queue((10..10 + MAX_PENDING as u64).map(d), false);
        // A batch is being sent while new intervals close and overflow the queue.
        let batch: Vec<Datum> = s.pending.drain(..20).collect();
        s.queue((100..130).map(d), false);
        assert_eq!(s.pending.len(), MAX_PENDING);
        assert_eq!(s.status.dropped_data, 10);
        assert_eq!(
            s.pending.front().map(|d| d.sum),
            Some(40.0),
            "the oldest went first"
        );
        // The batch failed: back in front, where it is the oldest, so it goes first.
        s.queue(batch, true);
        assert_eq!(s.pending.len(), MAX_PENDING);
        assert_eq!(s.status.dropped_data, 30);
        assert_eq!(s.pending.front().map(|d| d.sum), Some(40.0));
        assert_eq!(s.pending.back().map(|d| d.sum), Some(129.0));
        assert_eq!(s.status.pending_data, MAX_PENDING);
    }

    #[test]
    fn acc_keeps_count_sum_min_max() {
        let mut a = Acc::default();
        for v in [50.0, 20.0, 80.0] {
            a.add(v);
        }
        assert_eq!((a.count, a.sum, a.min, a.max), (3, 150.0, 20.0, 80.0));
    }
}
