//! `[scaling.cloudwatch]` against CloudWatch's own rules for the strings it is sent, so a bad
//! name is refused by `config --validate` rather than by every PutMetricData in production.

use super::CloudWatchConfig;

/// Why a value would be refused, said as the rest of the config's messages: after the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Refused(String);

/// `(key, message)` for the first value CloudWatch (or the agent) would refuse.
pub(super) fn validate(c: &CloudWatchConfig) -> Result<(), (&'static str, Refused)> {
    namespace(&c.namespace).map_err(|m| ("scaling.cloudwatch.namespace", m))?;
    metric_name(&c.metric).map_err(|m| ("scaling.cloudwatch.metric", m))?;
    if !c.auto_scaling_group.is_empty() {
        dimension_value(&c.auto_scaling_group)
            .map_err(|m| ("scaling.cloudwatch.auto_scaling_group", m))?;
    }
    if !c.region.is_empty() {
        region(&c.region).map_err(|m| ("scaling.cloudwatch.region", m))?;
    }
    if !c.endpoint.is_empty() {
        endpoint(&c.endpoint).map_err(|m| ("scaling.cloudwatch.endpoint", m))?;
    }
    if !c.high_resolution && c.interval < std::time::Duration::from_secs(60) {
        return Err((
            "scaling.cloudwatch.interval",
            Refused(format!(
                "= \"{}\" needs high_resolution = true: standard CloudWatch metrics keep one \
                 value per minute, so publish every 60s or more, or set high_resolution",
                humantime::format_duration(c.interval)
            )),
        ));
    }
    Ok(())
}

/// CloudWatch's documented namespace characters: alphanumerics, period, hyphen, underscore,
/// forward slash, hash, colon and space; 1 to 255 of them; not starting with ':' (the API's
/// pattern) nor with "AWS/" (reserved for AWS's own services).
fn namespace(v: &str) -> Result<(), Refused> {
    if v.is_empty() || v.len() > 255 {
        return Err(Refused(format!(
            "{v:?} must be 1 to 255 characters (CloudWatch's limit)"
        )));
    }
    if let Some(bad) = v.chars().find(|c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | '#' | ':' | ' '))
    }) {
        return Err(Refused(format!(
            "{v:?} contains {bad:?}: CloudWatch namespaces allow only letters, digits and . - _ / # : space"
        )));
    }
    if v.starts_with(':') {
        return Err(Refused(format!(
            "{v:?} must not start with ':' (CloudWatch refuses it)"
        )));
    }
    if v.starts_with("AWS/") {
        return Err(Refused(format!(
            "{v:?}: namespaces starting with AWS/ are reserved for AWS services; use your own, e.g. \"HealthAgent\""
        )));
    }
    if v.trim().is_empty() {
        return Err(Refused(format!("{v:?} must contain more than spaces")));
    }
    Ok(())
}

/// Metric names: 1 to 255 ASCII characters, no control characters.
fn metric_name(v: &str) -> Result<(), Refused> {
    if v.is_empty() || v.len() > 255 {
        return Err(Refused(format!(
            "{v:?} must be 1 to 255 characters (CloudWatch's limit)"
        )));
    }
    printable_ascii(v)
}

/// Dimension values: ASCII without control characters, at least one that is not white space,
/// at most 1024 (CloudWatch) — and 255 for an auto-scaling group's name, the only value here.
fn dimension_value(v: &str) -> Result<(), Refused> {
    if v.len() > 255 {
        return Err(Refused(format!(
            "is {} characters long: an auto-scaling group's name has at most 255",
            v.len()
        )));
    }
    if v.trim().is_empty() {
        return Err(Refused(format!(
            "{v:?} must contain a character other than white space (CloudWatch dimension values do)"
        )));
    }
    printable_ascii(v)
}

fn printable_ascii(v: &str) -> Result<(), Refused> {
    match v.chars().find(|c| !c.is_ascii() || c.is_ascii_control()) {
        Some(bad) => Err(Refused(format!(
            "{v:?} contains {bad:?}: CloudWatch accepts only ASCII without control characters here"
        ))),
        None => Ok(()),
    }
}

/// An AWS region code: "us-east-1", "eu-central-2", "us-gov-west-1", "cn-north-1".
fn region(v: &str) -> Result<(), Refused> {
    let parts: Vec<&str> = v.split('-').collect();
    let ok = v.len() <= 32
        && parts.len() >= 3
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts[parts.len() - 1].parse::<u8>().is_ok();
    if ok {
        Ok(())
    } else {
        Err(Refused(format!(
            "{v:?} is not an AWS region code such as \"us-east-1\" (or leave it empty: from AWS_REGION or the instance metadata)"
        )))
    }
}

/// https://, or http:// to a loopback host: the request carries a session token in a header.
/// Also `fleet.aws_endpoint`'s rule.
pub(super) fn endpoint(v: &str) -> Result<(), Refused> {
    let Ok(u) = reqwest::Url::parse(v) else {
        return Err(Refused(format!(
            "{v:?} is not a URL; e.g. https://monitoring.us-east-1.amazonaws.com"
        )));
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Refused(
            "must not carry a user or password (value not shown)".into(),
        ));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(Refused(format!("{v:?} must not have a query or fragment")));
    }
    match u.scheme() {
        "https" if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(()),
        "http" if super::loopback::loopback_host(&u) => Ok(()),
        _ => Err(Refused(format!(
            "{v:?} must be https:// (http:// only to a loopback host, e.g. a test server): \
             requests carry the instance role's session token"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn err(body: &str) -> String {
        let toml = format!("[scaling.cloudwatch]\n{body}\n");
        match Config::parse(&toml, "x.toml") {
            Ok(_) => panic!("accepted: {toml}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_namespaces_are_refused_with_the_rule() {
        for (v, says) in [
            ("", "1 to 255"),
            ("AWS/EC2", "reserved"),
            ("Health Agent!", "'!'"),
            ("Healthé", "'é'"),
            (":x", "':'"),
        ] {
            let e = err(&format!("namespace = {v:?}"));
            assert!(e.contains("`scaling.cloudwatch.namespace`"), "{v}: {e}");
            assert!(e.contains(says), "{v}: {e}");
        }
        let long = "a".repeat(256);
        assert!(err(&format!("namespace = {long:?}")).contains("1 to 255"));
        for ok in ["HealthAgent", "My/App-1_x.y #2:z", &"a".repeat(255)] {
            let toml = format!("[scaling.cloudwatch]\nnamespace = {ok:?}\n");
            Config::parse(&toml, "x").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn bad_dimension_values_are_refused() {
        // TOML strings as written in the file.
        for (v, says) in [
            (r#""   ""#, "white space"),
            (r#""asg\u0001""#, "control"),
            (r#""gruppe-ä""#, "ASCII"),
        ] {
            let e = err(&format!("auto_scaling_group = {v}"));
            assert!(e.contains("`scaling.cloudwatch.auto_scaling_group`"), "{e}");
            assert!(e.contains(says), "{v}: {e}");
        }
        let e = err(&format!("auto_scaling_group = {:?}", "g".repeat(256)));
        assert!(e.contains("at most 255"), "{e}");
        let e = err("metric = \"\"");
        assert!(e.contains("`scaling.cloudwatch.metric`"), "{e}");
    }

    #[test]
    fn region_endpoint_and_interval_are_checked() {
        assert!(err("region = \"US East\"").contains("region code"));
        assert!(err("endpoint = \"http://monitoring.example.com\"").contains("https://"));
        let e = err("endpoint = \"https://user:pw@monitoring.example.com\"");
        assert!(!e.contains("pw@"), "never echoes a password: {e}");
        let e = err("interval = \"10s\"");
        assert!(e.contains("high_resolution"), "{e}");
        for ok in [
            "region = \"us-gov-west-1\"\nendpoint = \"https://vpce-1.monitoring.eu-west-1.vpce.amazonaws.com\"",
            "endpoint = \"http://127.0.0.1:4566\"",
            "interval = \"10s\"\nhigh_resolution = true",
        ] {
            let toml = format!("[scaling.cloudwatch]\n{ok}\n");
            Config::parse(&toml, "x").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }
}
