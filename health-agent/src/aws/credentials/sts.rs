//! STS: `AssumeRoleWithWebIdentity` (unsigned; the web identity token is the proof) for IRSA
//! and a profile's `web_identity_token_file`, and `AssumeRole` (signed with the source
//! profile's keys) for a profile's `role_arn`. Both in the Query protocol, at the regional STS
//! endpoint (the global one when no region is known), `AWS_ENDPOINT_URL_STS` /
//! `AWS_ENDPOINT_URL` honoured.

use std::{path::PathBuf, time::SystemTime};

use reqwest::Url;
use url::form_urlencoded;

use super::{parse_expiration, Fetched};
use crate::aws::{
    query::{self, Service},
    sigv4::Credentials,
    xml,
};

const VERSION: &str = "2011-06-15";

/// Where STS is and how requests to it are signed.
#[derive(Debug, Clone)]
pub struct Sts {
    pub endpoint: Url,
    /// "" when no region is known (the global endpoint, signed for us-east-1).
    pub region: String,
}

/// `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, or a profile's `web_identity_token_file` +
/// `role_arn`.
#[derive(Debug, Clone)]
pub struct WebIdentity {
    pub role_arn: String,
    pub token_file: PathBuf,
    pub session_name: String,
}

/// One `role_arn` of a profile, assumed with the keys before it.
#[derive(Debug, Clone)]
pub struct Role {
    pub role_arn: String,
    pub session_name: String,
    pub external_id: Option<String>,
    /// The profile that names it.
    pub profile: String,
}

/// A session name when none is configured: the SDKs' shape, the agent's name and a time.
pub fn session_name() -> String {
    let millis = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("health-agent-{millis}")
}

/// The token file's content: read anew each time (EKS rotates it). Never shown.
fn token(file: &std::path::Path) -> Result<String, String> {
    let t =
        std::fs::read_to_string(file).map_err(|e| format!("token file {}: {e}", file.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(format!("token file {} is empty", file.display()));
    }
    Ok(t)
}

pub async fn assume_role_with_web_identity(
    http: &reqwest::Client,
    sts: &Sts,
    w: &WebIdentity,
) -> Result<Fetched, String> {
    let token = token(&w.token_file)?;
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("Action", "AssumeRoleWithWebIdentity")
        .append_pair("Version", VERSION)
        .append_pair("RoleArn", &w.role_arn)
        .append_pair("RoleSessionName", &w.session_name)
        .append_pair("WebIdentityToken", &token)
        .finish();
    let answer = query::call_unsigned(http, &sts.endpoint, body)
        .await
        .map_err(|e| format!("STS AssumeRoleWithWebIdentity at {}: {e}", sts.endpoint))?;
    parse(&answer, "AssumeRoleWithWebIdentity")
}

pub async fn assume_role(
    http: &reqwest::Client,
    sts: &Sts,
    role: &Role,
    with: &Credentials,
) -> Result<Fetched, String> {
    // Finished before any await: the serializer is not Send.
    let body = {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", "AssumeRole")
            .append_pair("Version", VERSION)
            .append_pair("RoleArn", &role.role_arn)
            .append_pair("RoleSessionName", &role.session_name);
        if let Some(id) = &role.external_id {
            form.append_pair("ExternalId", id);
        }
        form.finish()
    };
    let service = Service {
        endpoint: sts.endpoint.clone(),
        region: if sts.region.is_empty() {
            "us-east-1".into()
        } else {
            sts.region.clone()
        },
        name: "sts",
    };
    let answer = query::call(http, &service, with, body)
        .await
        .map_err(|e| format!("STS AssumeRole {} at {}: {e}", role.role_arn, sts.endpoint))?;
    parse(&answer, "AssumeRole")
}

/// `<ActionResponse><ActionResult><Credentials>…` → the keys and their expiry.
pub fn parse(answer: &str, action: &str) -> Result<Fetched, String> {
    let doc = xml::parse(answer).map_err(|e| format!("STS {action}: {e}"))?;
    let c = doc
        .at(&[&format!("{action}Result"), "Credentials"])
        .ok_or_else(|| format!("STS {action}: no {action}Result/Credentials in the answer"))?;
    let field = |name: &str| {
        c.text_of(name)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("STS {action}: no {name} in the answer"))
    };
    let credentials = Credentials {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: field("SecretAccessKey")?,
        session_token: Some(field("SessionToken")?),
    };
    let expires = parse_expiration(&field("Expiration")?)
        .map_err(|e| format!("STS {action}: Expiration {e}"))?;
    Ok(Fetched {
        credentials,
        expires: Some(expires),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sts_answer_gives_the_keys_and_their_expiry() {
        let answer = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ns:agent</SubjectFromWebIdentityToken>
    <AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/agent/s</Arn>
      <AssumedRoleId>AROA:s</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <SessionToken>FwoGZXIvYXdzEXAMPLE</SessionToken>
      <SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY</SecretAccessKey>
      <Expiration>2031-10-24T23:00:23.000Z</Expiration>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>r</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#;
        let f = parse(answer, "AssumeRoleWithWebIdentity").unwrap();
        assert_eq!(f.credentials.access_key_id, "ASIAEXAMPLE");
        assert_eq!(
            f.credentials.session_token.as_deref(),
            Some("FwoGZXIvYXdzEXAMPLE")
        );
        let at = time::OffsetDateTime::from(f.expires.unwrap());
        assert_eq!((at.year(), at.hour(), at.second()), (2031, 23, 23));

        let e = parse(answer, "AssumeRole").unwrap_err();
        assert!(e.contains("no AssumeRoleResult/Credentials"), "{e}");
        let bad = answer.replace("2031-10-24T23:00:23.000Z", "tomorrow");
        let e = parse(&bad, "AssumeRoleWithWebIdentity").unwrap_err();
        assert!(e.contains("Expiration") && !e.contains("EXAMPLEKEY"), "{e}");
        let e = parse("not xml <", "AssumeRole").unwrap_err();
        assert!(e.starts_with("STS AssumeRole: not XML"), "{e}");
    }
}
