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
}
