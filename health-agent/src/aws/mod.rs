//! AWS without an SDK, for what the agent asks of it: publishing the saturation (`cloudwatch`),
//! listing its auto-scaling group's members (`fleet::asg`) and completing the termination
//! hook (`drain::lifecycle`). SigV4 signing (sigv4.rs), IMDSv2 (imds.rs), the SDKs' credential
//! chain (credentials/: environment, web identity, shared profile, container, instance role),
//! the shared config files (profile.rs), endpoints from the config, `AWS_ENDPOINT_URL_<SERVICE>`
//! and `AWS_ENDPOINT_URL` (endpoint.rs), one signed call in the Query protocol with its errors
//! sorted (query.rs), and a reader for the small XML documents the Query protocol answers with
//! (xml.rs). reqwest with rustls (ring) is in the tree for the rest of the agent.
//!
//! Why not the SDK, measured: a scratch crate outside the workspace with what these calls stand
//! on (tokio, reqwest with rustls, serde_json, time, ring), built clean in release on this
//! project's 2-core machine; then the same crate plus aws-config, aws-sdk-cloudwatch and
//! aws-sdk-autoscaling (default features: rustls, with aws-lc-rs) doing the default chain,
//! PutMetricData and DescribeAutoScalingGroups; then the same crate plus this module doing the
//! same. CPU time (user + system) of the clean build, and the binary:
//!
//! | | build CPU | binary | stripped | crates |
//! |---|---|---|---|---|
//! | base | 150 s | 4.77 MB | 3.67 MB | 96 |
//! | base + this module | 191 s (+41 s) | 5.36 MB (+0.58 MB) | 4.17 MB (+0.49 MB) | 97 |
//! | base + the SDK | 802 s (+652 s) | 24.12 MB (+19.35 MB) | 17.06 MB (+13.38 MB) | 194 |
//!
//! The SDK would add 16 times this module's build CPU and 27 times its stripped size (wall
//! times on the shared, loaded machine: 522 s, 1109 s and 3640 s). What it would save is this
//! module's code (some 2,100 lines besides tests); its SSO, `credential_process` and FIPS
//! support, which the agent does not have, are the difference in function.

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
