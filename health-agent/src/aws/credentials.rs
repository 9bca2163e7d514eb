//! Where the signing keys come from, the standard way: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) when set, else the instance role's
//! temporary keys from IMDSv2, renewed well before they expire.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{
    imds::{Imds, ImdsError},
    sigv4::Credentials,
};

/// Instance-role keys are renewed this long before their `Expiration` (the SDKs use 5–15
/// minutes; EC2 rotates them well ahead of that).
const RENEW_BEFORE: Duration = Duration::from_secs(10 * 60);

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("no credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and the instance role is unavailable: {0}")]
    Imds(#[from] ImdsError),
    #[error("instance role credentials: {0}")]
    Bad(String),
}

pub enum Provider {
    Static(Credentials),
    Instance {
        imds: Arc<Imds>,
        cached: Option<(Credentials, SystemTime)>,
    },
}

impl Provider {
    /// The environment's keys when both are set; else the instance role, through `imds`.
    pub fn new(env: impl Fn(&str) -> Option<String>, imds: Arc<Imds>) -> Self {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => Self::Static(Credentials {
                access_key_id,
                secret_access_key,
                session_token: var("AWS_SESSION_TOKEN"),
            }),
            _ => Self::Instance { imds, cached: None },
        }
    }

    pub fn source(&self) -> &'static str {
        match self {
            Self::Static(_) => "environment",
            Self::Instance { .. } => "instance role (IMDSv2)",
        }
    }

    pub async fn get(&mut self) -> Result<Credentials, CredentialsError> {
        match self {
            Self::Static(c) => Ok(c.clone()),
            Self::Instance { imds, cached } => {
                if let Some((c, expires)) = cached.as_ref() {
                    if SystemTime::now() + RENEW_BEFORE < *expires {
                        return Ok(c.clone());
                    }
                }
                let fresh = role_credentials(imds).await?;
                *cached = Some(fresh.clone());
                Ok(fresh.0)
            }
        }
    }

    /// CloudWatch said the keys expired or are unknown: fetch new ones next time.
    pub fn invalidate(&mut self) {
        if let Self::Instance { cached, .. } = self {
            *cached = None;
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RoleCredentials {
    code: Option<String>,
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: String,
}

async fn role_credentials(imds: &Imds) -> Result<(Credentials, SystemTime), CredentialsError> {
    let roles = imds.get("iam/security-credentials/").await?;
    let role = roles
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| CredentialsError::Bad("the instance has no role attached".into()))?;
    let body = imds
        .get(&format!("iam/security-credentials/{role}"))
        .await?;
    // The body holds the secret: serde's message may quote it, so it is not passed on.
    let c: RoleCredentials = serde_json::from_str(&body)
        .map_err(|_| CredentialsError::Bad(format!("role {role}: unreadable JSON")))?;
    if let Some(code) = c.code.as_deref().filter(|c| *c != "Success") {
        return Err(CredentialsError::Bad(format!("role {role}: Code {code}")));
    }
    let expires = time::OffsetDateTime::parse(
        &c.expiration,
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|_| {
        CredentialsError::Bad(format!(
            "role {role}: Expiration {:?} is not RFC 3339",
            c.expiration
        ))
    })?;
    Ok((
        Credentials {
            access_key_id: c.access_key_id,
            secret_access_key: c.secret_access_key,
            session_token: c.token,
        },
        expires.into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_keys_win_when_both_are_set() {
        let imds = Arc::new(Imds::new(None, Duration::from_secs(1)));
        let env = |k: &str| match k {
            "AWS_ACCESS_KEY_ID" => Some("AKID".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("SECRET".to_string()),
            "AWS_SESSION_TOKEN" => Some(String::new()),
            _ => None,
        };
        match Provider::new(env, imds.clone()) {
            Provider::Static(c) => {
                assert_eq!(c.access_key_id, "AKID");
                assert_eq!(c.session_token, None, "an empty token is no token");
            }
            Provider::Instance { .. } => panic!("the environment's keys are set"),
        }
        let only_id = |k: &str| (k == "AWS_ACCESS_KEY_ID").then(|| "AKID".to_string());
        assert_eq!(
            Provider::new(only_id, imds).source(),
            "instance role (IMDSv2)"
        );
    }

    /// An IMDSv2 stub on loopback: the token, the role, and keys expiring `expires_in` from
    /// now. Records (method, path, token header) of every request.
    async fn stub(expires_in: time::Duration) -> (reqwest::Url, Arc<std::sync::Mutex<Vec<Seen>>>) {
        use axum::{extract::Request, http::StatusCode, response::IntoResponse, Router};
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = Router::new().fallback(move |req: Request| {
            let log = log.clone();
            async move {
                let token = req
                    .headers()
                    .get("x-aws-ec2-metadata-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                log.lock()
                    .unwrap()
                    .push((method.clone(), path.clone(), token.clone()));
                if method == "PUT" && path == "/latest/api/token" {
                    return (StatusCode::OK, "T1".to_string()).into_response();
                }
                if token != "T1" {
                    return StatusCode::UNAUTHORIZED.into_response();
                }
                let expires = (time::OffsetDateTime::now_utc() + expires_in)
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap();
                match path.as_str() {
                    "/latest/meta-data/iam/security-credentials/" => {
                        (StatusCode::OK, "role-a\n".to_string()).into_response()
                    }
                    "/latest/meta-data/iam/security-credentials/role-a" => (
                        StatusCode::OK,
                        serde_json::json!({
                            "Code": "Success", "AccessKeyId": "ASIA1",
                            "SecretAccessKey": "S1", "Token": "TOK1", "Expiration": expires,
                        })
                        .to_string(),
                    )
                        .into_response(),
                    _ => StatusCode::NOT_FOUND.into_response(),
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (url, seen)
    }

    /// (method, path, token header).
    type Seen = (String, String, String);

    fn role_reads(seen: &std::sync::Mutex<Vec<Seen>>) -> usize {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(_, p, _)| p.ends_with("/role-a"))
            .count()
    }

    #[tokio::test]
    async fn instance_role_keys_come_from_imdsv2_and_are_renewed_before_expiry() {
        let none = |_: &str| None;
        // Valid for an hour: fetched once, then served from the cache.
        let (url, seen) = stub(time::Duration::hours(1)).await;
        let imds = Arc::new(Imds::new(Some(url), Duration::from_secs(2)));
        let mut p = Provider::new(none, imds);
        for _ in 0..3 {
            let c = p.get().await.unwrap();
            assert_eq!(c.access_key_id, "ASIA1");
            assert_eq!(c.session_token.as_deref(), Some("TOK1"));
        }
        assert_eq!(role_reads(&seen), 1, "cached while far from expiry");
        {
            let log = seen.lock().unwrap();
            assert_eq!(log[0].0, "PUT", "the IMDSv2 token first: {log:?}");
            assert!(log[1..].iter().all(|(_, _, t)| t == "T1"), "{log:?}");
            let puts = log.iter().filter(|(m, ..)| m == "PUT").count();
            assert_eq!(puts, 1, "one token for every read: {log:?}");
        }
        // CloudWatch said the keys expired: fetched again.
        p.invalidate();
        p.get().await.unwrap();
        assert_eq!(role_reads(&seen), 2);

        // Keys expiring within the renewal margin are renewed on every use.
        let (url, seen) = stub(time::Duration::minutes(5)).await;
        let imds = Arc::new(Imds::new(Some(url), Duration::from_secs(2)));
        let mut p = Provider::new(none, imds);
        p.get().await.unwrap();
        p.get().await.unwrap();
        assert_eq!(role_reads(&seen), 2, "renewed before expiry");
    }
}
