//! One `PutMetricData` call in CloudWatch's Query protocol (a form-encoded POST with
//! `Action=PutMetricData&Version=2010-08-01`, XML answers), sent and sorted by `aws::query`.

use std::time::SystemTime;

use reqwest::Url;
use url::form_urlencoded;

use crate::aws::{
    query::{self, QueryError, Service},
    sigv4::Credentials,
};

/// CloudWatch's service name in the signature's scope.
const SERVICE: &str = "monitoring";

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

/// Sends one signed PutMetricData.
pub async fn put(
    http: &reqwest::Client,
    target: &Target,
    creds: &Credentials,
    data: &[Datum],
) -> Result<(), QueryError> {
    let service = Service {
        endpoint: target.endpoint.clone(),
        region: target.region.clone(),
        name: SERVICE,
    };
    query::call(http, &service, creds, body(target, data))
        .await
        .map(drop)
}

/// CloudWatch's public endpoint for a region.
pub fn regional_endpoint(region: &str) -> String {
    query::regional_endpoint(SERVICE, region)
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
