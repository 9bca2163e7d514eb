//! Where each AWS call goes. For every service, the first of:
//! 1. the agent's own key (`scaling.cloudwatch.endpoint`, `fleet.aws_endpoint`,
//!    `drain.aws_endpoint`), where it has one;
//! 2. `AWS_ENDPOINT_URL_<SERVICE>` (`CLOUDWATCH`, `AUTO_SCALING`, `EC2`, `STS`), the SDKs'
//!    service-specific variable;
//! 3. `AWS_ENDPOINT_URL`, the SDKs' one for every service;
//! 4. the service's public endpoint in the region.
//!
//! `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true` skips 2 and 3, as in the SDKs. A URL from the
//! environment follows the config keys' rule: https://, or http:// to a loopback host only
//! (the requests carry a session token in a header).

use reqwest::Url;

/// The services the agent calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    CloudWatch,
    AutoScaling,
    Ec2,
    Sts,
}

impl Service {
    /// The name in the signature's scope and in the public endpoint's host.
    pub fn signing_name(self) -> &'static str {
        match self {
            Self::CloudWatch => "monitoring",
            Self::AutoScaling => "autoscaling",
            Self::Ec2 => "ec2",
            Self::Sts => "sts",
        }
    }

    /// The service's variable: `AWS_ENDPOINT_URL_` and its SDK service id, upper case, spaces
    /// as underscores.
    pub fn env_var(self) -> &'static str {
        match self {
            Self::CloudWatch => "AWS_ENDPOINT_URL_CLOUDWATCH",
            Self::AutoScaling => "AWS_ENDPOINT_URL_AUTO_SCALING",
            Self::Ec2 => "AWS_ENDPOINT_URL_EC2",
            Self::Sts => "AWS_ENDPOINT_URL_STS",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("{origin}: {reason}")]
    Refused { origin: String, reason: String },
    #[error("no endpoint for region {0:?}")]
    Region(String),
}

/// The endpoint of `service`: `configured` (already checked by the config's validation) when
/// set, else the environment's, else the public one in `region`. Also says where it came from.
pub fn resolve(
    service: Service,
    configured: &str,
    region: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Url, &'static str), EndpointError> {
    if !configured.trim().is_empty() {
        let url = Url::parse(configured.trim()).map_err(|e| EndpointError::Refused {
            origin: "the configured endpoint".into(),
            reason: e.to_string(),
        })?;
        return Ok((url, "config"));
    }
    let var = |k: &str| {
        env(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let ignored =
        var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !ignored {
        for name in [service.env_var(), "AWS_ENDPOINT_URL"] {
            if let Some(v) = var(name) {
                let url = checked(&v).map_err(|reason| EndpointError::Refused {
                    origin: name.into(),
                    reason,
                })?;
                return Ok((url, name));
            }
        }
    }
    let public = regional(service.signing_name(), region);
    Url::parse(&public)
        .map(|u| (u, "region"))
        .map_err(|_| EndpointError::Region(region.into()))
}

/// A service's public endpoint in a region (China's partition has its own domain):
/// `regional("monitoring", "eu-west-1")`. STS with no region: its global endpoint.
pub fn regional(service: &str, region: &str) -> String {
    if region.is_empty() && service == "sts" {
        "https://sts.amazonaws.com".into()
    } else if region.starts_with("cn-") {
        format!("https://{service}.{region}.amazonaws.com.cn")
    } else {
        format!("https://{service}.{region}.amazonaws.com")
    }
}

/// https:// with a host, or http:// to a loopback host; no user, password, query or fragment.
/// The reason names no part of a refused URL that could be a secret.
pub fn checked(v: &str) -> Result<Url, String> {
    let u = Url::parse(v).map_err(|e| format!("not a URL ({e})"))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err("must not carry a user or password (value not shown)".into());
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(format!("{v:?} must not have a query or fragment"));
    }
    match u.scheme() {
        "https" if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(u),
        "http" if crate::config::loopback_host(&u) => Ok(u),
        _ => Err(format!(
            "{v:?} must be https:// (http:// only to a loopback host, e.g. a test server): \
             requests carry a session token"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn config_then_service_variable_then_global_variable_then_region() {
        let env = env_of(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
            (
                "AWS_ENDPOINT_URL_AUTO_SCALING",
                "https://autoscaling.vpce.example.com",
            ),
        ]);
        let r = |s, c: &str| resolve(s, c, "eu-west-1", &env).unwrap();
        let (u, from) = r(Service::CloudWatch, "https://monitoring.example.com");
        assert_eq!(
            (u.as_str(), from),
            ("https://monitoring.example.com/", "config")
        );
        let (u, from) = r(Service::AutoScaling, "");
        assert_eq!(
            (u.as_str(), from),
            (
                "https://autoscaling.vpce.example.com/",
                "AWS_ENDPOINT_URL_AUTO_SCALING"
            )
        );
        let (u, from) = r(Service::Ec2, "");
        assert_eq!(
            (u.as_str(), from),
            ("http://127.0.0.1:4566/", "AWS_ENDPOINT_URL")
        );

        let none = |_: &str| None;
        let (u, from) = resolve(Service::Sts, "", "cn-north-1", &none).unwrap();
        assert_eq!(
            (u.as_str(), from),
            ("https://sts.cn-north-1.amazonaws.com.cn/", "region")
        );
        let (u, _) = resolve(Service::Sts, "", "", &none).unwrap();
        assert_eq!(u.as_str(), "https://sts.amazonaws.com/");

        let ignored = env_of(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "TRUE"),
        ]);
        let (u, from) = resolve(Service::CloudWatch, "", "us-east-1", &ignored).unwrap();
        assert_eq!(
            (u.as_str(), from),
            ("https://monitoring.us-east-1.amazonaws.com/", "region")
        );
    }

    #[test]
    fn an_endpoint_from_the_environment_is_held_to_the_config_rule() {
        for (v, says) in [
            ("http://monitoring.example.com", "https://"),
            ("https://u:pw@monitoring.example.com", "user or password"),
            ("monitoring", "not a URL"),
        ] {
            let env = move |k: &str| (k == "AWS_ENDPOINT_URL_CLOUDWATCH").then(|| v.to_string());
            let e = resolve(Service::CloudWatch, "", "us-east-1", &env).unwrap_err();
            let shown = e.to_string();
            assert!(
                shown.starts_with("AWS_ENDPOINT_URL_CLOUDWATCH: ") && shown.contains(says),
                "{v}: {shown}"
            );
            assert!(!shown.contains("pw@"), "{shown}");
        }
    }
}
