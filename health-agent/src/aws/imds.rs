//! The EC2 instance metadata service, version 2 only: a session token from `PUT
//! /latest/api/token`, sent with every `GET /latest/meta-data/...`. Its address comes from
//! `AWS_EC2_METADATA_SERVICE_ENDPOINT` (the AWS SDKs' variable; tests point it at a stub on
//! loopback); `AWS_EC2_METADATA_DISABLED=true` turns it off.

use std::time::{Duration, Instant};

use reqwest::{StatusCode, Url};
use tokio::sync::Mutex;

const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// Asked-for token lifetime (the maximum, 6 hours); renewed a minute before it ends.
const TOKEN_TTL: Duration = Duration::from_secs(21_600);
const TOKEN_MARGIN: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("instance metadata is off (AWS_EC2_METADATA_DISABLED, or AWS_EC2_METADATA_SERVICE_ENDPOINT is not a URL)")]
    Disabled,
    #[error("instance metadata at {endpoint}: {what}")]
    Http { endpoint: String, what: String },
    #[error("instance metadata has no {path} (HTTP 404){hint}")]
    NotFound { path: String, hint: &'static str },
}

pub struct Imds {
    base: Option<Url>,
    http: reqwest::Client,
    timeout: Duration,
    token: Mutex<Option<(String, Instant)>>,
}

impl Imds {
    /// From the environment. Never fails: a bad endpoint or a disabled service shows up as
    /// the error of the first look-up, where the status reports it.
    pub fn from_env(timeout: Duration) -> Self {
        let disabled = std::env::var("AWS_EC2_METADATA_DISABLED")
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let endpoint = std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let base = match Url::parse(endpoint.trim()) {
            _ if disabled => None,
            Ok(u) => Some(u),
            Err(e) => {
                tracing::warn!("AWS_EC2_METADATA_SERVICE_ENDPOINT {endpoint:?}: {e}");
                None
            }
        };
        Self::new(base, timeout)
    }

    pub fn new(base: Option<Url>, timeout: Duration) -> Self {
        // The metadata service is link-local: never through a proxy.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .unwrap_or_default();
        Self {
            base,
            http,
            timeout,
            token: Mutex::new(None),
        }
    }

    /// The per-request timeout it was made with (the other credential sources use it too).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn base(&self) -> Result<&Url, ImdsError> {
        self.base.as_ref().ok_or(ImdsError::Disabled)
    }

    fn http_error(&self, what: impl std::fmt::Display) -> ImdsError {
        ImdsError::Http {
            endpoint: self
                .base
                .as_ref()
                .map_or_else(String::new, |u| u.as_str().trim_end_matches('/').into()),
            what: what.to_string(),
        }
    }

    async fn token(&self, renew: bool) -> Result<String, ImdsError> {
        let mut cached = self.token.lock().await;
        if let Some((token, until)) = cached.as_ref() {
            if !renew && Instant::now() < *until {
                return Ok(token.clone());
            }
        }
        let url = self
            .base()?
            .join("/latest/api/token")
            .map_err(|e| self.http_error(e))?;
        let resp = self
            .http
            .put(url)
            .header(
                "X-aws-ec2-metadata-token-ttl-seconds",
                TOKEN_TTL.as_secs().to_string(),
            )
            .send()
            .await
            .map_err(|e| self.http_error(format!("token: {}", without_url(&e))))?;
        if !resp.status().is_success() {
            return Err(self.http_error(format!(
                "token: HTTP {} (IMDSv2 needs PUT /latest/api/token; a container may need a hop limit of 2)",
                resp.status().as_u16()
            )));
        }
        let token = resp
            .text()
            .await
            .map_err(|e| self.http_error(format!("token: {}", without_url(&e))))?;
        *cached = Some((
            token.clone(),
            Instant::now() + TOKEN_TTL.saturating_sub(TOKEN_MARGIN),
        ));
        Ok(token)
    }

    /// `GET /latest/meta-data/<path>`, the body trimmed.
    pub async fn get(&self, path: &str) -> Result<String, ImdsError> {
        let url = self
            .base()?
            .join(&format!("/latest/meta-data/{path}"))
            .map_err(|e| self.http_error(e))?;
        // A 401 means the token expired early (the service restarted): once more, renewed.
        for renew in [false, true] {
            let token = self.token(renew).await?;
            let resp = self
                .http
                .get(url.clone())
                .header("X-aws-ec2-metadata-token", token)
                .send()
                .await
                .map_err(|e| self.http_error(format!("{path}: {}", without_url(&e))))?;
            match resp.status() {
                StatusCode::UNAUTHORIZED if !renew => continue,
                StatusCode::NOT_FOUND => {
                    return Err(ImdsError::NotFound {
                        path: path.into(),
                        hint: if path.starts_with("tags/") {
                            " — enable instance metadata tags (InstanceMetadataTags) or set \
                             scaling.cloudwatch.auto_scaling_group"
                        } else if path.starts_with("iam/") {
                            " — attach an instance profile, or give the agent keys another way \
                             (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, web identity, a profile, \
                             container credentials)"
                        } else {
                            ""
                        },
                    })
                }
                s if s.is_success() => {
                    return resp
                        .text()
                        .await
                        .map(|t| t.trim().to_string())
                        .map_err(|e| self.http_error(format!("{path}: {}", without_url(&e))))
                }
                s => return Err(self.http_error(format!("{path}: HTTP {}", s.as_u16()))),
            }
        }
        Err(self.http_error(format!("{path}: HTTP 401 with a fresh token")))
    }
}

/// reqwest's message without the URL it repeats (the caller names the endpoint once).
pub fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.into()
    } else {
        format!("{kind} ({detail})")
    }
}
