//! Delivery of one HTTP request to one destination: pacing (a minimum interval between
//! requests, the receiver's documented rate), a per-request timeout, and retries with
//! exponential backoff on connect errors, timeouts, 429 and 5xx — honouring `Retry-After` on
//! 429/503 (and GitHub's rate-limit 403). Any other 4xx is final: retrying a rejected payload or
//! a revoked key only repeats the rejection.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::{header::HeaderMap, RequestBuilder, StatusCode};

use super::error::AlertError;
use crate::config::AlertsConfig;
use crate::redact::describe_error;

/// A `Retry-After` longer than this is cut: the flap guard and the next incident will not wait.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Timing knobs that production takes from the receivers' documentation and tests shrink.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// Minimum interval between two requests to one destination.
    pub pace_slack: Duration,
    pub pace_pagerduty: Duration,
    pub pace_github: Duration,
    pub pace_webhook: Duration,
    /// How long the sender tasks may keep delivering after shutdown.
    pub flush: Duration,
    /// CPU sampling interval of the incident report's process list.
    pub evidence_interval: Duration,
    /// Use HTTP(S)_PROXY from the environment (tests talk to loopback directly).
    pub env_proxy: bool,
    /// Reads the GitHub token from the variable `alerts.github_token_env` names (tests pass a
    /// lookup rather than mutate the process environment under other threads).
    pub token: fn(&str) -> Option<String>,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            // Slack: about 1 message/s per webhook.
            pace_slack: Duration::from_secs(1),
            // PagerDuty: 120 events/min per routing key.
            pace_pagerduty: Duration::from_millis(500),
            // GitHub: 80 content-creating requests/min.
            pace_github: Duration::from_millis(750),
            pace_webhook: Duration::from_millis(100),
            flush: Duration::from_secs(5),
            evidence_interval: Duration::from_millis(500),
            env_proxy: true,
            token: |var| std::env::var(var).ok(),
        }
    }
}

/// Minimum interval between requests to one destination.
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    next: Option<Instant>,
}

impl Pacer {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            next: None,
        }
    }

    /// When the next request may go, and books the slot after it.
    pub fn book(&mut self, now: Instant) -> Instant {
        let at = self.next.map_or(now, |n| n.max(now));
        self.next = Some(at + self.interval);
        at
    }

    async fn wait(&mut self) {
        let at = self.book(Instant::now());
        tokio::time::sleep_until(at.into()).await;
    }
}

/// What a successful request returned.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
}

impl Http {
    pub fn new(cfg: &AlertsConfig, tuning: &Tuning) -> Result<Self, AlertError> {
        let mut b = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("health-agent/", env!("CARGO_PKG_VERSION")))
            // A redirect would re-send a webhook body somewhere else; report it instead.
            .redirect(reqwest::redirect::Policy::none());
        if !tuning.env_proxy {
            b = b.no_proxy();
        }
        let client = b
            .build()
            .map_err(|e| AlertError::Client(describe_error(e)))?;
        Ok(Self {
            client,
            max_retries: cfg.max_retries,
            backoff_base: tuning.backoff_base,
            backoff_cap: tuning.backoff_cap,
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The same client with at most `n` retries (`alert test` should answer promptly).
    pub fn with_max_retries(&self, n: u32) -> Self {
        Self {
            max_retries: self.max_retries.min(n),
            ..self.clone()
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.backoff_base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.backoff_cap)
    }

    /// Sends the request `build` makes (once per attempt) until it succeeds, fails for good, or
    /// `alerts.max_retries` retries are spent. Errors name no secret: the request's URL is left
    /// out and the reply is shown only in its documented shapes (`redact::reply`).
    pub async fn send(
        &self,
        pacer: &mut Pacer,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Reply, AlertError> {
        let mut attempt = 0u32;
        loop {
            pacer.wait().await;
            let (error, retry_after) = match build(&self.client).send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let body = resp.bytes().await.unwrap_or_default();
                    if status.is_success() {
                        return Ok(Reply { status, body });
                    }
                    let error = format!("{status}{}", snippet(&body));
                    match retry_policy(status, &headers) {
                        Some(after) => (error, after),
                        None => return Err(AlertError::Rejected(error)),
                    }
                }
                Err(e) if e.is_builder() => return Err(AlertError::Request(describe_error(e))),
                Err(e) => (describe_error(e), None),
            };
            if attempt >= self.max_retries {
                return Err(AlertError::GaveUp {
                    attempts: attempt + 1,
                    last: error,
                });
            }
            let wait = retry_after.unwrap_or_else(|| self.backoff(attempt));
            tracing::debug!(
                "attempt {} failed ({}), retrying in {:?}",
                attempt + 1,
                error,
                wait
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// `Some(retry_after)` when the status is worth retrying.
fn retry_policy(status: StatusCode, headers: &HeaderMap) -> Option<Option<Duration>> {
    let retry_after = || {
        headers
            .get(reqwest::header::RETRY_AFTER)?
            .to_str()
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
            .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
    };
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Some(retry_after()),
        s if s.is_server_error() => Some(None),
        // GitHub answers its rate limits with 403 and either Retry-After or an exhausted
        // x-ratelimit-remaining (reset at x-ratelimit-reset, epoch seconds).
        StatusCode::FORBIDDEN => {
            if let Some(after) = retry_after() {
                return Some(Some(after));
            }
            let h = |k: &str| headers.get(k)?.to_str().ok()?.trim().parse::<u64>().ok();
            if h("x-ratelimit-remaining") != Some(0) {
                return None;
            }
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            Some(
                h("x-ratelimit-reset")
                    .map(|reset| Duration::from_secs(reset.saturating_sub(now).max(1)))
                    .map(|d| d.min(MAX_RETRY_AFTER)),
            )
        }
        _ => None,
    }
}

/// `: <start of the body>` for error messages, on one line.
fn snippet(body: &[u8]) -> String {
    match crate::redact::reply(body) {
        said if said.is_empty() => said,
        said => format!(": {said}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn pacer_spaces_requests() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut p = Pacer::new(s);
        assert_eq!(p.book(t0), t0);
        assert_eq!(p.book(t0), t0 + s);
        assert_eq!(p.book(t0 + s / 2), t0 + 2 * s);
        // After a quiet spell the next request goes at once.
        assert_eq!(p.book(t0 + 10 * s), t0 + 10 * s);
    }

    #[test]
    fn which_statuses_retry() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_policy(StatusCode::BAD_REQUEST, &h), None);
        assert_eq!(retry_policy(StatusCode::NOT_FOUND, &h), None);
        assert_eq!(retry_policy(StatusCode::FORBIDDEN, &h), None);
        assert_eq!(
            retry_policy(StatusCode::INTERNAL_SERVER_ERROR, &h),
            Some(None)
        );
        assert_eq!(retry_policy(StatusCode::TOO_MANY_REQUESTS, &h), Some(None));
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(
            retry_policy(StatusCode::TOO_MANY_REQUESTS, &h),
            Some(Some(Duration::from_secs(7)))
        );
        assert_eq!(
            retry_policy(StatusCode::SERVICE_UNAVAILABLE, &h),
            Some(Some(Duration::from_secs(7)))
        );
        assert_eq!(
            retry_policy(StatusCode::FORBIDDEN, &h),
            Some(Some(Duration::from_secs(7)))
        );
        h.insert("retry-after", HeaderValue::from_static("86400"));
        assert_eq!(
            retry_policy(StatusCode::TOO_MANY_REQUESTS, &h),
            Some(Some(MAX_RETRY_AFTER))
        );
        let mut gh = HeaderMap::new();
        gh.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        assert!(retry_policy(StatusCode::FORBIDDEN, &gh).is_some());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let http = Http {
            client: reqwest::Client::new(),
            max_retries: 5,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(10),
        };
        let waits: Vec<u64> = (0..6).map(|a| http.backoff(a).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
    }
}
