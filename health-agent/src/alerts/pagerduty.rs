//! PagerDuty Events API v2 (`POST /v2/enqueue`). Trigger and resolve share one `dedup_key` per
//! host and condition (per fleet and condition for a fault the fleet shares), so a resolve
//! closes exactly the alert its trigger opened and a repeat trigger while open folds into it. A
//! resolve carries only `routing_key`, `event_action` and `dedup_key`, as the API wants. The
//! routing key is the credential.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::{
    http::Pacer,
    incident::{Event, Kind},
    sink::JsonSink,
};
use crate::text::{clean, rfc3339, truncate};

const SUMMARY_LIMIT: usize = 1024;

pub fn payload(ev: &Event, routing_key: &str) -> Value {
    match ev.kind {
        Kind::Resolve => json!({
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": ev.fingerprint(),
        }),
        Kind::Trigger => {
            let mut details = json!({
                "status": ev.status.as_str(),
                "http": ev.http,
                "recommendation": ev.recommendation.as_str(),
                "reasons": ev.reasons,
                "checks": ev.checks(),
            });
            // A fleet's incident: the fleet is where it is; the reporter's state is one sample.
            let source = match &ev.fleet {
                Some(f) => {
                    details["fleet"] = json!(&*f.name);
                    details["instances"] = json!(f.instances);
                    details["reported_by"] = json!(&*ev.host);
                    format!("fleet {}", f.name)
                }
                None => clean(&ev.host).into_owned(),
            };
            json!({
                "routing_key": routing_key,
                "event_action": "trigger",
                "dedup_key": ev.fingerprint(),
                "client": "health-agent",
                "payload": {
                    "summary": truncate(&clean(&ev.summary()), SUMMARY_LIMIT),
                    "source": source,
                    "severity": ev.condition.pd_severity(),
                    "timestamp": rfc3339(ev.at),
                    "component": ev.component(),
                    "group": "health-agent",
                    "class": ev.condition.key(),
                    "custom_details": details,
                },
            })
        }
    }
}

fn test_key(host: &str) -> String {
    truncate(&format!("health-agent/{host}/test"), 255)
}

/// The PagerDuty destination: the routing key goes into every body and is its secret.
pub fn sink(url: &str, routing_key: &str, pacer: Pacer) -> JsonSink {
    let (key, test_key) = (routing_key.to_string(), routing_key.to_string());
    JsonSink::new(
        url,
        pacer,
        move |ev| payload(ev, &key),
        move |host| test_payloads(&test_key, host),
    )
}

/// An `info` trigger and, at once, its resolve: proves the key works and leaves nothing open
/// on the service.
fn test_payloads(routing_key: &str, host: &str) -> Vec<Value> {
    let trigger = json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": test_key(host),
        "client": "health-agent",
        "payload": {
            "summary": truncate(
                &format!("health-agent test alert from {}", clean(host)),
                SUMMARY_LIMIT
            ),
            "source": clean(host),
            "severity": "info",
            "timestamp": rfc3339(SystemTime::now()),
            "component": "health-agent",
            "group": "health-agent",
            "class": "test",
        },
    });
    let resolve = json!({
        "routing_key": routing_key,
        "event_action": "resolve",
        "dedup_key": test_key(host),
    });
    vec![trigger, resolve]
}
