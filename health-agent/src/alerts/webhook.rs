//! Generic JSON webhook, the prior art's shape: `{event, timestamp, hostname, payload}` with
//! `event` = `incident.triggered` | `incident.resolved` (and `test` from `alert test`).
//! `payload` carries the incident and the state of the instance at that moment, including the
//! full `/health` diagnostics. A fault the fleet shares is one incident (`scope` `fleet`), sent
//! by the agent that reports it: `hostname` and the state are that agent's.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::{
    http::Pacer,
    incident::{Event, Kind},
    sink::JsonSink,
};
use crate::text::rfc3339;

/// The webhook destination: the URL is its only secret.
pub fn sink(url: &str, pacer: Pacer) -> JsonSink {
    JsonSink::new(url, pacer, payload, |host| vec![test_payload(host)])
}

pub fn payload(ev: &Event) -> Value {
    let (event, resolved_at) = match ev.kind {
        Kind::Trigger => ("incident.triggered", Value::Null),
        Kind::Resolve => ("incident.resolved", json!(rfc3339(ev.at))),
    };
    json!({
        "event": event,
        "timestamp": rfc3339(ev.at),
        "hostname": &*ev.host,
        "payload": {
            "incident": {
                "condition": ev.condition.key(),
                "title": ev.condition.title(),
                "severity": ev.condition.pd_severity(),
                "fingerprint": ev.fingerprint(),
                "scope": if ev.fleet.is_some() { "fleet" } else { "host" },
                "fleet": ev.fleet.as_ref().map(|f| &*f.name),
                "instances": ev.fleet.as_ref().map(|f| f.instances),
                "opened_at": rfc3339(ev.opened_at),
                "resolved_at": resolved_at,
                "duration_seconds": ev.duration().as_secs(),
            },
            "status": ev.status.as_str(),
            "http": ev.http,
            "recommendation": ev.recommendation.as_str(),
            "reasons": ev.reasons,
            "checks": ev.checks(),
            "snapshot": ev.snapshot(),
        },
    })
}

pub fn test_payload(host: &str) -> Value {
    json!({
        "event": "test",
        "timestamp": rfc3339(SystemTime::now()),
        "hostname": host,
        "payload": { "message": format!("health-agent test message from {host}") },
    })
}
