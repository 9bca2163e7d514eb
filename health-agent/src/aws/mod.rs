//! AWS without an SDK, for the two things the agent asks of it: publishing the saturation
//! (`cloudwatch`) and listing its auto-scaling group's members (`fleet::asg`). SigV4 signing
//! (sigv4.rs), IMDSv2 (imds.rs), credentials from the environment or the instance role
//! (credentials.rs), one signed call in the Query protocol with its errors sorted (query.rs), and
//! a reader for the small XML documents the Query protocol answers with (xml.rs). One API call
//! each does not justify the SDK's size and compile time; reqwest with rustls is in the tree.

pub mod credentials;
pub mod endpoint;
pub mod imds;
pub mod profile;
pub mod query;
pub mod sigv4;
pub mod xml;

use imds::{Imds, ImdsError};

/// The region: `configured` when set, else `AWS_REGION` or `AWS_DEFAULT_REGION`, else the
/// selected profile's `region` in the shared config files, else the instance's own from its
/// metadata.
pub async fn region(configured: &str, imds: &Imds) -> Result<String, ImdsError> {
    region_from(configured, imds).await.map(|(r, _)| r)
}

/// [`region`] and where it came from: "config", the variable's name, "profile NAME" or
/// "instance metadata".
pub async fn region_from(configured: &str, imds: &Imds) -> Result<(String, String), ImdsError> {
    if !configured.is_empty() {
        return Ok((configured.to_string(), "config".into()));
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    for var in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
        if let Some(r) = env(var) {
            return Ok((r.trim().to_string(), var.into()));
        }
    }
    if let Some(r) = profile::region(&env) {
        let (name, _) = profile::selected(&env);
        return Ok((r, format!("profile {name}")));
    }
    Ok((
        imds.get("placement/region").await?,
        "instance metadata".into(),
    ))
}
