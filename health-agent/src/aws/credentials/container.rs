//! Container credentials: the ECS task role and EKS Pod Identity. The agent GETs
//! `http://169.254.170.2` + `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS), or
//! `AWS_CONTAINER_CREDENTIALS_FULL_URI` (EKS Pod Identity's `http://169.254.170.23/v1/credentials`,
//! a local credentials server), sending `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`'s content
//! (read anew each time: EKS rotates it) or `AWS_CONTAINER_AUTHORIZATION_TOKEN` as the
//! `Authorization` header. As in the SDKs, a full URI must be https://, or http:// to a
//! loopback address, `localhost`, or the ECS and EKS link-local hosts (169.254.170.2,
//! 169.254.170.23, fd00:ec2::23); others are refused, keys being sent over plain HTTP
//! otherwise. The answer: `{AccessKeyId, SecretAccessKey, Token, Expiration}`.

use std::path::PathBuf;

use reqwest::Url;

use super::{parse_expiration, Fetched};
use crate::aws::{imds::without_url, sigv4::Credentials};

const ECS_HOST: &str = "http://169.254.170.2";
/// An answer larger than this is not credentials.
const MAX_ANSWER: usize = 64 << 10;

/// Where the `Authorization` header comes from.
#[derive(Debug, Clone)]
pub enum Token {
    None,
    /// The value itself: never shown.
    Value(String),
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Container {
    pub url: Url,
    pub token: Token,
}

impl Container {
    /// From the environment: None when neither URI variable is set; an error naming the
    /// variable when it is not usable.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<Result<Self, String>> {
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let url = if let Some(rel) = var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            let joined = format!("{ECS_HOST}/{}", rel.trim_start_matches('/'));
            Url::parse(&joined).map_err(|e| format!("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI: {e}"))
        } else {
            let full = var("AWS_CONTAINER_CREDENTIALS_FULL_URI")?;
            allowed(&full).map_err(|e| format!("AWS_CONTAINER_CREDENTIALS_FULL_URI: {e}"))
        };
        let token = match (
            var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
            var("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        ) {
            (Some(f), _) => Token::File(f.into()),
            (None, Some(v)) => Token::Value(v),
            (None, None) => Token::None,
        };
        Some(url.map(|url| Self { url, token }))
    }

    /// The URL as shown: without a query (it could carry something private).
    pub fn shown(&self) -> String {
        let mut u = self.url.clone();
        u.set_query(None);
        u.to_string()
    }

    pub async fn fetch(&self, http: &reqwest::Client) -> Result<Fetched, String> {
        let at = self.shown();
        let mut req = http.get(self.url.clone());
        let token = match &self.token {
            Token::None => None,
            Token::Value(v) => Some(v.clone()),
            Token::File(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| {
                        format!(
                            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {}: {e}",
                            f.display()
                        )
                    })?
                    .trim()
                    .to_string(),
            ),
        };
        if let Some(t) = token {
            if t.contains(['\r', '\n']) {
                return Err("the authorization token has a line break".into());
            }
            req = req.header("authorization", t);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| format!("{at}: {}", without_url(&e)))?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("{at}: {}", without_url(&e)))?
        {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(format!(
                    "{at}: an answer larger than {} KiB",
                    MAX_ANSWER >> 10
                ));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(format!("{at}: HTTP {}{}", status.as_u16(), error_of(&body)));
        }
        parse(&body).map_err(|e| format!("{at}: {e}"))
    }
}

/// A full URI the SDKs accept.
fn allowed(v: &str) -> Result<Url, String> {
    let u = Url::parse(v).map_err(|e| format!("not a URL ({e})"))?;
    if u.scheme() == "https" {
        return Ok(u);
    }
    if u.scheme() != "http" {
        return Err(format!("{} is neither http:// nor https://", u.scheme()));
    }
    let ok = match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => {
            ip.is_loopback()
                || ip.octets() == [169, 254, 170, 2]
                || ip.octets() == [169, 254, 170, 23]
        }
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23]
        }
        None => false,
    };
    if ok {
        Ok(u)
    } else {
        Err(format!(
            "http:// to {} is refused: only https://, or http:// to a loopback address, \
             169.254.170.2 (ECS), 169.254.170.23 or fd00:ec2::23 (EKS Pod Identity)",
            u.host_str().unwrap_or("")
        ))
    }
}

/// ` (Code: Message)` from an error answer in JSON, cut short; nothing else of the body.
fn error_of(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let (code, message) = (s("Code"), s("Message"));
    let message: String = message
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    match (code.is_empty(), message.is_empty()) {
        (true, true) => String::new(),
        _ => format!(" ({code}: {message})"),
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<String>,
}

/// The answer's keys. serde's message may quote the secret, so it is not passed on.
pub fn parse(body: &[u8]) -> Result<Fetched, String> {
    let a: Answer = serde_json::from_slice(body).map_err(|_| {
        "unreadable JSON (want AccessKeyId, SecretAccessKey, Token, Expiration)".to_string()
    })?;
    if a.access_key_id.is_empty() || a.secret_access_key.is_empty() {
        return Err("an empty AccessKeyId or SecretAccessKey".into());
    }
    let expires = match a.expiration.as_deref().filter(|e| !e.is_empty()) {
        Some(e) => Some(parse_expiration(e).map_err(|e| format!("Expiration {e}"))?),
        None => None,
    };
    Ok(Fetched {
        credentials: Credentials {
            access_key_id: a.access_key_id,
            secret_access_key: a.secret_access_key,
            session_token: a.token.filter(|t| !t.is_empty()),
        },
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&'static str, &'static str)]) -> Option<Result<Container, String>> {
        let pairs = pairs.to_vec();
        Container::from_env(&move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_uri_variables_and_the_hosts_the_sdks_allow() {
        assert!(from(&[]).is_none());
        let c = from(&[
            (
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "/v2/credentials/abc",
            ),
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://127.0.0.1:1/ignored",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.url.as_str(), "http://169.254.170.2/v2/credentials/abc");
        for ok in [
            "http://169.254.170.23/v1/credentials",
            "http://[fd00:ec2::23]/v1/credentials",
            "http://127.0.0.1:8080/creds",
            "http://[::1]:8080/creds",
            "http://localhost/creds",
            "https://creds.example.com/x",
        ] {
            let c = from(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", ok)]);
            assert!(matches!(c, Some(Ok(_))), "{ok}");
        }
        for refused in [
            "http://169.254.169.254/latest",
            "http://10.0.0.5/creds",
            "http://creds.example.com/x",
            "ftp://127.0.0.1/x",
        ] {
            let e = from(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", refused)])
                .unwrap()
                .unwrap_err();
            assert!(e.starts_with("AWS_CONTAINER_CREDENTIALS_FULL_URI: "), "{e}");
        }
        let c = from(&[
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://127.0.0.1/c?x=1",
            ),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "tok"),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/run/token"),
        ])
        .unwrap()
        .unwrap();
        assert!(matches!(c.token, Token::File(ref f) if f == &PathBuf::from("/run/token")));
        assert_eq!(c.shown(), "http://127.0.0.1/c");
    }

    #[test]
    fn the_answer_is_read_and_a_bad_one_never_quoted() {
        let f = parse(
            br#"{"AccessKeyId":"ASIA1","SecretAccessKey":"S1","Token":"T1",
                 "Expiration":"2031-01-02T03:04:05Z","RoleArn":"arn:aws:iam::1:role/x"}"#,
        )
        .unwrap();
        assert_eq!(f.credentials.session_token.as_deref(), Some("T1"));
        assert!(f.expires.is_some());
        let f = parse(br#"{"AccessKeyId":"AKIA1","SecretAccessKey":"S1"}"#).unwrap();
        assert!(f.expires.is_none() && f.credentials.session_token.is_none());
        let e = parse(br#"{"AccessKeyId":"ASIA1","SecretAccessKey":1234567}"#).unwrap_err();
        assert!(!e.contains("1234567"), "{e}");
        assert_eq!(
            error_of(br#"{"Code":"AccessDenied","Message":"no task role"}"#),
            " (AccessDenied: no task role)"
        );
        assert_eq!(error_of(b"<html>secret</html>"), "");
    }
}
