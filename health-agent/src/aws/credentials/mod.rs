//! Where the signing keys come from: the AWS SDKs' default chain, the first source that is set.
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`);
//! 2. web identity (EKS IRSA): `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` (and
//!    `AWS_ROLE_SESSION_NAME`), exchanged with STS `AssumeRoleWithWebIdentity`;
//! 3. the shared files' profile (`AWS_PROFILE`, else `default`; profile.rs): static keys, or a
//!    `role_arn` assumed with STS `AssumeRole` from `source_profile`'s keys or a
//!    `credential_source`, or from a `web_identity_token_file`. SSO, `credential_process` and
//!    console logins are refused by name;
//! 4. container credentials (ECS task role, EKS Pod Identity; container.rs);
//! 5. the instance role, from IMDSv2.
//!
//! Temporary keys (2–5) are kept until [`RENEW_BEFORE`] their `Expiration` and fetched anew
//! on the next use after that, or at once after AWS refused them ([`Provider::invalidate`]).
//! [`Provider::source`] names the source for the status and `check`; nothing here ever shows
//! a key, a secret, a session token or a web identity or authorization token.

mod chain;
pub mod container;
pub mod sts;

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use self::{
    container::Container,
    sts::{Role, Sts, WebIdentity},
};
use super::{
    endpoint::{self, Service},
    imds::{Imds, ImdsError},
    sigv4::Credentials,
};

/// Temporary keys are renewed this long before their `Expiration` (the SDKs use 5–15
/// minutes; EC2, ECS and STS hand out keys valid for an hour or more).
pub const RENEW_BEFORE: Duration = Duration::from_secs(10 * 60);

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Every other source unset, and no instance role either.
    #[error("no credentials: neither AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, web identity, a profile nor container credentials are set, and the instance role is unavailable: {0}")]
    Imds(#[from] ImdsError),
    /// The source the chain chose failed: named, with why.
    #[error("credentials from {from}: {reason}")]
    Source { from: String, reason: String },
}

/// Keys, and when they expire (None: they do not). `Debug` shows no key (see Credentials).
#[derive(Clone, Debug)]
pub struct Fetched {
    pub credentials: Credentials,
    pub expires: Option<SystemTime>,
}

/// An RFC 3339 time, as every source writes `Expiration`; the error quotes it (a time is no
/// secret).
pub fn parse_expiration(s: &str) -> Result<SystemTime, String> {
    time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| format!("{s:?} is not an RFC 3339 time"))
}

/// The keys a profile's roles are assumed with.
#[derive(Debug, Clone)]
pub enum Base {
    Static {
        profile: String,
        file: PathBuf,
        credentials: Credentials,
    },
    WebIdentity(WebIdentity),
    Environment(Credentials),
    Container(Container),
    Instance,
}

#[derive(Debug, Clone)]
pub enum Source {
    Environment(Credentials),
    WebIdentity(WebIdentity),
    Profile {
        name: String,
        /// The file that holds its keys, or its `role_arn`.
        file: PathBuf,
        base: Base,
        /// Assumed in turn from `base`; empty: the base's keys themselves.
        roles: Vec<Role>,
    },
    Container(Container),
    Instance,
    /// Set, but not usable: the chain stops here.
    Unusable {
        what: String,
        reason: String,
    },
}

impl Source {
    /// What `check` and the status say: the source and where it is, never a key.
    pub fn describe(&self) -> String {
        match self {
            Self::Environment(_) => "environment".into(),
            Self::WebIdentity(w) => format!("web identity (role {})", w.role_arn),
            Self::Profile {
                name,
                file,
                base,
                roles,
            } => match roles.last() {
                None => match base {
                    Base::WebIdentity(w) => {
                        format!("profile {name}: web identity (role {})", w.role_arn)
                    }
                    _ => format!("profile {name} ({})", file.display()),
                },
                Some(role) => format!(
                    "profile {name} ({}): role {} assumed with {}",
                    file.display(),
                    role.role_arn,
                    match base {
                        Base::Static { profile, file, .. } => {
                            format!("the keys of profile {profile} ({})", file.display())
                        }
                        Base::WebIdentity(w) => format!("web identity (role {})", w.role_arn),
                        Base::Environment(_) => "the environment's keys".into(),
                        Base::Container(c) => format!("container credentials ({})", c.shown()),
                        Base::Instance => "the instance role (IMDSv2)".into(),
                    }
                ),
            },
            Self::Container(c) => format!("container credentials ({})", c.shown()),
            Self::Instance => "instance role (IMDSv2)".into(),
            Self::Unusable { what, .. } => what.clone(),
        }
    }
}

pub struct Provider {
    source: Source,
    shown: String,
    imds: Arc<Imds>,
    /// For STS: through a proxy when one is set.
    http: reqwest::Client,
    /// For the container endpoint: link-local or loopback, never through a proxy.
    local: reqwest::Client,
    sts: Result<Sts, String>,
    cached: Option<Fetched>,
}

impl Provider {
    /// The first source `env` sets; `region` (the agent's configured one, or "") is where
    /// STS is asked, else `AWS_REGION`, `AWS_DEFAULT_REGION` or the profile's.
    pub fn new(env: impl Fn(&str) -> Option<String>, imds: Arc<Imds>, region: &str) -> Self {
        let source = chain::select(&env);
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let region = Some(region.trim().to_string())
            .filter(|r| !r.is_empty())
            .or_else(|| var("AWS_REGION"))
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| super::profile::region(&env))
            .unwrap_or_default();
        let sts = endpoint::resolve(Service::Sts, "", &region, &env)
            .map(|(endpoint, _)| Sts { endpoint, region })
            .map_err(|e| e.to_string());
        let timeout = imds.timeout();
        let client = |proxy: bool| {
            let b = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout);
            if proxy { b } else { b.no_proxy() }
                .build()
                .unwrap_or_default()
        };
        Self {
            shown: source.describe(),
            source,
            imds,
            http: client(true),
            local: client(false),
            sts,
            cached: None,
        }
    }

    /// [`Provider::new`] on the process's environment.
    pub fn from_env(imds: Arc<Imds>, region: &str) -> Self {
        Self::new(|k| std::env::var(k).ok(), imds, region)
    }

    /// The source, as the status and `check` show it.
    pub fn source(&self) -> &str {
        &self.shown
    }

    /// When the keys last fetched expire (None: not fetched, or they do not).
    pub fn expires(&self) -> Option<SystemTime> {
        self.cached.as_ref().and_then(|f| f.expires)
    }

    pub async fn get(&mut self) -> Result<Credentials, CredentialsError> {
        if let Some(f) = &self.cached {
            if f.expires
                .is_none_or(|e| SystemTime::now() + RENEW_BEFORE < e)
            {
                return Ok(f.credentials.clone());
            }
        }
        let fresh = self.fetch().await?;
        let credentials = fresh.credentials.clone();
        self.cached = Some(fresh);
        Ok(credentials)
    }

    /// AWS said the keys expired or are unknown: fetch new ones next time.
    pub fn invalidate(&mut self) {
        self.cached = None;
    }

    async fn fetch(&self) -> Result<Fetched, CredentialsError> {
        let failed = |reason: String| CredentialsError::Source {
            from: self.shown.clone(),
            reason,
        };
        match &self.source {
            Source::Environment(c) => Ok(Fetched {
                credentials: c.clone(),
                expires: None,
            }),
            Source::WebIdentity(w) => self.web_identity(w).await.map_err(failed),
            Source::Profile { base, roles, .. } => {
                let mut keys = self.base(base).await.map_err(failed)?;
                for role in roles {
                    let sts = self.sts.as_ref().map_err(|e| failed(e.clone()))?;
                    keys = sts::assume_role(&self.http, sts, role, &keys.credentials)
                        .await
                        .map_err(failed)?;
                }
                Ok(keys)
            }
            Source::Container(c) => c.fetch(&self.local).await.map_err(failed),
            Source::Instance => match instance_role(&self.imds).await {
                Ok(f) => Ok(f),
                Err(InstanceError::Imds(e)) => Err(CredentialsError::Imds(e)),
                Err(InstanceError::Bad(reason)) => Err(failed(reason)),
            },
            Source::Unusable { reason, .. } => Err(failed(reason.clone())),
        }
    }

    async fn web_identity(&self, w: &WebIdentity) -> Result<Fetched, String> {
        let sts = self.sts.as_ref().map_err(Clone::clone)?;
        sts::assume_role_with_web_identity(&self.http, sts, w).await
    }

    async fn base(&self, base: &Base) -> Result<Fetched, String> {
        match base {
            Base::Static { credentials, .. } | Base::Environment(credentials) => Ok(Fetched {
                credentials: credentials.clone(),
                expires: None,
            }),
            Base::WebIdentity(w) => self.web_identity(w).await,
            Base::Container(c) => c.fetch(&self.local).await,
            Base::Instance => instance_role(&self.imds).await.map_err(|e| match e {
                InstanceError::Imds(e) => format!("the instance role: {e}"),
                InstanceError::Bad(e) => e,
            }),
        }
    }
}

enum InstanceError {
    Imds(ImdsError),
    Bad(String),
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

/// The instance role's keys from IMDSv2.
async fn instance_role(imds: &Imds) -> Result<Fetched, InstanceError> {
    let roles = imds
        .get("iam/security-credentials/")
        .await
        .map_err(InstanceError::Imds)?;
    let role = roles
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| InstanceError::Bad("the instance has no role attached".into()))?;
    let body = imds
        .get(&format!("iam/security-credentials/{role}"))
        .await
        .map_err(InstanceError::Imds)?;
    // The body holds the secret: serde's message may quote it, so it is not passed on.
    let c: RoleCredentials = serde_json::from_str(&body)
        .map_err(|_| InstanceError::Bad(format!("role {role}: unreadable JSON")))?;
    if let Some(code) = c.code.as_deref().filter(|c| *c != "Success") {
        return Err(InstanceError::Bad(format!("role {role}: Code {code}")));
    }
    let expires = parse_expiration(&c.expiration)
        .map_err(|e| InstanceError::Bad(format!("role {role}: Expiration {e}")))?;
    Ok(Fetched {
        credentials: Credentials {
            access_key_id: c.access_key_id,
            secret_access_key: c.secret_access_key,
            session_token: c.token,
        },
        expires: Some(expires),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment of `pairs` and nothing else (no HOME: no shared files).
    fn env_of(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    fn shown(pairs: Vec<(&'static str, String)>) -> (String, Source) {
        let imds = Arc::new(Imds::new(None, Duration::from_secs(1)));
        let p = Provider::new(env_of(pairs), imds, "");
        (p.source().to_string(), p.source)
    }

    #[test]
    fn the_first_source_set_wins_in_the_sdks_order() {
        let s = |k: &'static str, v: &str| (k, v.to_string());
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap().to_string();
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(
            dir.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = SECRETFILE\n\
             [base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = SECRETBASE\n\
             [tool]\ncredential_process = /bin/get-keys\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join(".aws/config"),
            "[profile prod]\nrole_arn = arn:aws:iam::1:role/prod\nsource_profile = base\n\
             [profile chained]\nrole_arn = arn:aws:iam::1:role/second\nsource_profile = prod\n\
             [profile sso]\nsso_session = corp\n[profile empty]\nregion = eu-west-1\n\
             [profile loop]\nrole_arn = arn:aws:iam::1:role/l\nsource_profile = loop2\n\
             [profile loop2]\nrole_arn = arn:aws:iam::1:role/l2\nsource_profile = loop\n",
        )
        .unwrap();
        let keys = vec![
            s("AWS_ACCESS_KEY_ID", "AKID"),
            s("AWS_SECRET_ACCESS_KEY", "SECRET"),
            s("AWS_SESSION_TOKEN", ""),
        ];
        let web = vec![
            s("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
            s("AWS_ROLE_ARN", "arn:aws:iam::1:role/irsa"),
        ];
        let container = vec![s(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://127.0.0.1:9/c",
        )];
        let profile = vec![s("HOME", &home)];
        let all = [
            keys.clone(),
            web.clone(),
            profile.clone(),
            container.clone(),
        ]
        .concat();

        let (text, src) = shown(all.clone());
        assert_eq!(text, "environment");
        match src {
            Source::Environment(c) => assert_eq!(c.session_token, None, "empty is no token"),
            _ => panic!("{text}"),
        }
        assert_eq!(
            shown(all[3..].to_vec()).0,
            "web identity (role arn:aws:iam::1:role/irsa)"
        );
        let after_web = [profile.clone(), container.clone()].concat();
        assert_eq!(
            shown(after_web).0,
            format!("profile default ({home}/.aws/credentials)")
        );
        assert_eq!(
            shown(container.clone()).0,
            "container credentials (http://127.0.0.1:9/c)"
        );
        assert_eq!(shown(Vec::new()).0, "instance role (IMDSv2)");
        // Only the key id: not the environment's keys.
        assert_eq!(shown(vec![keys[0].clone()]).0, "instance role (IMDSv2)");

        let named = |p: &str| shown(vec![s("HOME", &home), s("AWS_PROFILE", p)]);
        assert_eq!(
            named("prod").0,
            format!(
                "profile prod ({home}/.aws/config): role arn:aws:iam::1:role/prod assumed with \
                 the keys of profile base ({home}/.aws/credentials)"
            )
        );
        match named("chained").1 {
            Source::Profile { roles, .. } => assert_eq!(
                roles
                    .iter()
                    .map(|r| r.role_arn.as_str())
                    .collect::<Vec<_>>(),
                ["arn:aws:iam::1:role/prod", "arn:aws:iam::1:role/second"]
            ),
            other => panic!("{}", other.describe()),
        }
        for (p, says) in [
            ("sso", "IAM Identity Center"),
            (
                "tool",
                "credential_process, which health-agent does not support",
            ),
            ("empty", "has no credentials"),
            ("missing", "not found in"),
            ("loop", "loop"),
        ] {
            match named(p).1 {
                Source::Unusable { what, reason } => {
                    assert_eq!(what, format!("profile {p}"));
                    assert!(reason.contains(says), "{p}: {reason}");
                }
                other => panic!("{p}: {}", other.describe()),
            }
        }
        // A web identity token without a role, a container URI to a host the SDKs refuse:
        // the chain stops there rather than going on to the instance role.
        let (text, src) = shown(vec![web[0].clone()]);
        assert!(matches!(src, Source::Unusable { .. }), "{text}");
        let (text, src) = shown(vec![s(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://10.1.2.3/",
        )]);
        assert_eq!(text, "container credentials");
        assert!(matches!(src, Source::Unusable { .. }));
    }

    #[tokio::test]
    async fn a_failing_source_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_of(vec![
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                dir.path().join("none").display().to_string(),
            ),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/irsa".into()),
            ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1".into()),
        ]);
        let imds = Arc::new(Imds::new(None, Duration::from_secs(1)));
        let mut p = Provider::new(env, imds.clone(), "eu-west-1");
        let e = p.get().await.err().unwrap().to_string();
        assert!(
            e.starts_with(
                "credentials from web identity (role arn:aws:iam::1:role/irsa): token file "
            ) && e.contains("No such file"),
            "{e}"
        );
        let mut p = Provider::new(env_of(Vec::new()), imds, "");
        let e = p.get().await.err().unwrap().to_string();
        assert!(e.starts_with("no credentials: "), "{e}");
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
        let mut p = Provider::new(none, imds, "");
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
        let mut p = Provider::new(none, imds, "");
        p.get().await.unwrap();
        p.get().await.unwrap();
        assert_eq!(role_reads(&seen), 2, "renewed before expiry");
    }
}
