//! PagerDuty Events API v2 (`POST /v2/enqueue`). Trigger and resolve share one `dedup_key` per
//! host and condition, so a resolve closes exactly the alert its trigger opened and a repeat
//! trigger while open folds into it. A resolve carries only `routing_key`, `event_action` and
//! `dedup_key`, as the API wants. The routing key is the credential.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::{
    http::{Http, JsonPost, Pacer},
    incident::{Event, Kind},
    redact::Secrets,
};
use crate::{snapshot::rfc3339, text::truncate};

const SUMMARY_LIMIT: usize = 1024;

pub struct PagerDuty {
    routing_key: String,
    endpoint: JsonPost,
}

pub fn payload(ev: &Event, routing_key: &str) -> Value {
    match ev.kind {
        Kind::Resolve => json!({
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": ev.fingerprint(),
        }),
        Kind::Trigger => json!({
            "routing_key": routing_key,
            "event_action": "trigger",
            "dedup_key": ev.fingerprint(),
            "client": "health-agent",
            "payload": {
                "summary": truncate(&ev.summary(), SUMMARY_LIMIT),
                "source": &*ev.host,
                "severity": ev.condition.pd_severity(),
                "timestamp": rfc3339(ev.at),
                "component": ev.component(),
                "group": "health-agent",
                "class": ev.condition.key(),
                "custom_details": {
                    "status": ev.status.as_str(),
                    "http": ev.http,
                    "recommendation": ev.recommendation.as_str(),
                    "reasons": ev.reasons,
                    "checks": ev.checks(),
                },
            },
        }),
    }
}

fn test_key(host: &str) -> String {
    truncate(&format!("health-agent/{host}/test"), 255)
}

impl PagerDuty {
    pub fn new(url: &str, routing_key: &str, pacer: Pacer) -> Self {
        Self {
            routing_key: routing_key.to_string(),
            endpoint: JsonPost::new(url, pacer, Secrets::new().with(routing_key).with_url(url)),
        }
    }

    pub fn secrets(&self) -> &Secrets {
        self.endpoint.secrets()
    }

    pub async fn deliver(&mut self, http: &Http, ev: &Event) -> Result<(), String> {
        let body = payload(ev, &self.routing_key);
        self.endpoint.post(http, &body).await
    }

    /// An `info` trigger and, at once, its resolve: proves the key works and leaves nothing
    /// open on the service.
    pub async fn send_test(&mut self, http: &Http, host: &str) -> Result<(), String> {
        let trigger = json!({
            "routing_key": self.routing_key,
            "event_action": "trigger",
            "dedup_key": test_key(host),
            "client": "health-agent",
            "payload": {
                "summary": truncate(&format!("health-agent test alert from {host}"), SUMMARY_LIMIT),
                "source": host,
                "severity": "info",
                "timestamp": rfc3339(SystemTime::now()),
                "component": "health-agent",
                "group": "health-agent",
                "class": "test",
            },
        });
        self.endpoint.post(http, &trigger).await?;
        let resolve = json!({
            "routing_key": self.routing_key,
            "event_action": "resolve",
            "dedup_key": test_key(host),
        });
        self.endpoint.post(http, &resolve).await
    }
}
