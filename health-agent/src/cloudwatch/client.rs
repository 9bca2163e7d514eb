//! One `PutMetricData` call in CloudWatch's Query protocol (a form-encoded POST with
//! `Action=PutMetricData&Version=2010-08-01`, XML answers): the protocol both real AWS and moto
//! accept, with no SDK. Errors are sorted into what a retry may fix and what it cannot.

use std::time::SystemTime;

use reqwest::{StatusCode, Url};
use url::form_urlencoded;

use super::{
    imds::without_url,
    sigv4::{self, Credentials},
};

/// CloudWatch's service name in the signature's scope.
const SERVICE: &str = "monitoring";
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// Error messages are cut to this many characters.
const SNIPPET: usize = 200;

/// One interval's samples of the metric, as a statistic set (its Average is what target
/// tracking reads).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Datum {
    pub timestamp: SystemTime,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

/// Where and under which names the data go.
#[derive(Debug, Clone)]
pub struct Target {
    pub endpoint: Url,
    pub region: String,
    pub namespace: String,
    pub metric: String,
    pub group: String,
    pub high_resolution: bool,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PutError {
    /// Connection refused, reset, timed out: CloudWatch (or the way to it) is down or slow.
    #[error("{0}")]
    Transport(String),
    /// 429, or 400 `Throttling`: too many requests.
    #[error("throttled: HTTP {status} {code}: {message}")]
    Throttled {
        status: u16,
        code: String,
        message: String,
    },
    /// 5xx.
    #[error("HTTP {status} {code}: {message}")]
    Server {
        status: u16,
        code: String,
        message: String,
    },
    /// The keys expired or are not known: new ones may fix it.
    #[error("credentials refused: HTTP {status} {code}: {message}")]
    Credentials {
        status: u16,
        code: String,
        message: String,
    },
    /// Any other 4xx (access denied, a bad parameter): the same request fails again.
    #[error("refused: HTTP {status} {code}: {message}")]
    Rejected {
        status: u16,
        code: String,
        message: String,
    },
}

impl PutError {
    pub fn retryable(&self) -> bool {
        !matches!(self, Self::Rejected { .. })
    }
}

fn number(v: f64) -> String {
    // Percent to a thousandth is far below the metric's noise; no exponent notation.
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.into()
    }
}

/// ISO 8601 in whole seconds, UTC: what every AWS parser of the Query protocol reads (no
/// nanoseconds; CloudWatch keeps at best one value per second anyway).
fn timestamp(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
        ))
        .unwrap_or_default()
}

/// The form body of one PutMetricData request.
pub fn body(target: &Target, data: &[Datum]) -> String {
    let mut f = form_urlencoded::Serializer::new(String::new());
    f.append_pair("Action", "PutMetricData");
    f.append_pair("Version", "2010-08-01");
    f.append_pair("Namespace", &target.namespace);
    for (i, d) in data.iter().enumerate() {
        let m = format!("MetricData.member.{}", i + 1);
        f.append_pair(&format!("{m}.MetricName"), &target.metric);
        f.append_pair(
            &format!("{m}.Dimensions.member.1.Name"),
            "AutoScalingGroupName",
        );
        f.append_pair(&format!("{m}.Dimensions.member.1.Value"), &target.group);
        f.append_pair(&format!("{m}.Timestamp"), &timestamp(d.timestamp));
        f.append_pair(&format!("{m}.Unit"), "Percent");
        f.append_pair(
            &format!("{m}.StatisticValues.SampleCount"),
            &d.count.to_string(),
        );
        f.append_pair(&format!("{m}.StatisticValues.Sum"), &number(d.sum));
        f.append_pair(&format!("{m}.StatisticValues.Minimum"), &number(d.min));
        f.append_pair(&format!("{m}.StatisticValues.Maximum"), &number(d.max));
        if target.high_resolution {
            f.append_pair(&format!("{m}.StorageResolution"), "1");
        }
    }
    f.finish()
}

/// `<Tag>text</Tag>` from an XML error body (CloudWatch's are flat and small).
fn xml_tag<'a>(body: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = body.find(&open)? + open.len();
    let len = body[start..].find(&format!("</{tag}>"))?;
    Some(body[start..start + len].trim())
}

/// Sorts an error answer. `secrets` are cut out of the message: an AWS error may quote the
/// access key id, and no key belongs in a log line or a response.
pub fn classify(status: StatusCode, body: &str, secrets: &[&str]) -> PutError {
    let code = xml_tag(body, "Code").unwrap_or("").to_string();
    let mut message: String = xml_tag(body, "Message")
        .unwrap_or(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(SNIPPET)
        .collect();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        message = message.replace(s, "<redacted>");
    }
    let status_u16 = status.as_u16();
    let code_lc = code.to_ascii_lowercase();
    if status == StatusCode::TOO_MANY_REQUESTS
        || code_lc.contains("throttl")
        || code_lc == "requestlimitexceeded"
    {
        PutError::Throttled {
            status: status_u16,
            code,
            message,
        }
    } else if status.is_server_error() {
        PutError::Server {
            status: status_u16,
            code,
            message,
        }
    } else if matches!(
        code.as_str(),
        "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
    ) {
        PutError::Credentials {
            status: status_u16,
            code,
            message,
        }
    } else {
        PutError::Rejected {
            status: status_u16,
            code,
            message,
        }
    }
}

/// The Host header's value for `url`: the port only when it is not the scheme's default,
/// as reqwest sends it.
fn host_header(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// Sends one signed PutMetricData.
pub async fn put(
    http: &reqwest::Client,
    target: &Target,
    creds: &Credentials,
    data: &[Datum],
) -> Result<(), PutError> {
    let body = body(target, data);
    let host = host_header(&target.endpoint);
    let path = match target.endpoint.path() {
        "" => "/",
        p => p,
    };
    let signed = sigv4::sign(
        creds,
        &target.region,
        SERVICE,
        time::OffsetDateTime::now_utc(),
        &sigv4::Request {
            method: "POST",
            host: &host,
            path,
            query: "",
            headers: &[("content-type", CONTENT_TYPE)],
            payload: body.as_bytes(),
        },
    );
    let mut req = http
        .post(target.endpoint.clone())
        .header("content-type", CONTENT_TYPE)
        .header("x-amz-date", &signed.amz_date)
        .header("authorization", &signed.authorization);
    if let Some(token) = &creds.session_token {
        req = req.header("x-amz-security-token", token);
    }
    let resp = req
        .body(body)
        .send()
        .await
        .map_err(|e| PutError::Transport(without_url(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let text = resp.text().await.unwrap_or_default();
    let secrets = [
        creds.access_key_id.as_str(),
        creds.secret_access_key.as_str(),
        creds.session_token.as_deref().unwrap_or(""),
    ];
    Err(classify(status, &text, &secrets))
}

/// CloudWatch's public endpoint for a region (China's partition has its own domain).
pub fn regional_endpoint(region: &str) -> String {
    if region.starts_with("cn-") {
        format!("https://monitoring.{region}.amazonaws.com.cn")
    } else {
        format!("https://monitoring.{region}.amazonaws.com")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn target() -> Target {
        Target {
            endpoint: Url::parse("http://127.0.0.1:1/").unwrap(),
            region: "us-east-1".into(),
            namespace: "HealthAgent".into(),
            metric: "Saturation".into(),
            group: "web asg/1".into(),
            high_resolution: true,
        }
    }

    #[test]
    fn body_is_the_query_protocols_put_metric_data() {
        let d = Datum {
            // Nanoseconds are cut: whole seconds on the wire.
            timestamp: SystemTime::UNIX_EPOCH + Duration::new(1_764_590_400, 123_456_789),
            count: 3,
            sum: 126.5,
            min: 40.0,
            max: 45.25,
        };
        let b = body(&target(), &[d, d]);
        for part in [
            "Action=PutMetricData&Version=2010-08-01&Namespace=HealthAgent",
            "MetricData.member.1.MetricName=Saturation",
            "MetricData.member.1.Dimensions.member.1.Name=AutoScalingGroupName",
            "MetricData.member.1.Dimensions.member.1.Value=web+asg%2F1",
            "MetricData.member.1.Timestamp=2025-12-01T12%3A00%3A00Z",
            "MetricData.member.1.Unit=Percent",
            "MetricData.member.1.StatisticValues.SampleCount=3",
            "MetricData.member.1.StatisticValues.Sum=126.5",
            "MetricData.member.1.StatisticValues.Minimum=40&",
            "MetricData.member.1.StatisticValues.Maximum=45.25",
            "MetricData.member.1.StorageResolution=1",
            "MetricData.member.2.StatisticValues.Sum=126.5",
        ] {
            assert!(b.contains(part), "{part} in {b}");
        }
    }

    #[test]
    fn errors_are_sorted_by_what_a_retry_can_fix() {
        let xml = |code: &str| {
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>\
                 <Message>key AKIDSECRET is bad</Message></Error></ErrorResponse>"
            )
        };
        let e = classify(StatusCode::BAD_REQUEST, &xml("Throttling"), &[]);
        assert!(
            matches!(e, PutError::Throttled { .. }) && e.retryable(),
            "{e}"
        );
        let e = classify(StatusCode::TOO_MANY_REQUESTS, "slow down", &[]);
        assert!(matches!(e, PutError::Throttled { .. }), "{e}");
        let e = classify(StatusCode::SERVICE_UNAVAILABLE, "", &[]);
        assert!(matches!(e, PutError::Server { .. }) && e.retryable());
        let e = classify(StatusCode::FORBIDDEN, &xml("ExpiredToken"), &[]);
        assert!(matches!(e, PutError::Credentials { .. }) && e.retryable());
        let e = classify(StatusCode::FORBIDDEN, &xml("AccessDenied"), &["AKIDSECRET"]);
        assert!(!e.retryable());
        let shown = e.to_string();
        assert!(
            shown.contains("AccessDenied") && !shown.contains("AKIDSECRET"),
            "{shown}"
        );
    }

    #[test]
    fn numbers_have_no_exponent() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1e-9), "0");
        assert_eq!(number(150.0), "150");
        assert_eq!(number(42.12345), "42.123");
        assert_eq!(
            regional_endpoint("cn-north-1"),
            "https://monitoring.cn-north-1.amazonaws.com.cn"
        );
    }
}
