//! Slack incoming webhook: `POST {"text": …}` as `application/json`. The URL is the credential.
//! One message per trigger and per resolve; `text` carries everything (host, condition,
//! status, reasons, recommendation), so it reads the same in a notification as in the channel.
//! A fault the fleet shares is one message for the fleet, from the agent that reports it.

use serde_json::{json, Value};

use super::{
    http::Pacer,
    incident::{human, instances, Event, Kind},
    sink::JsonSink,
};

/// The Slack destination: the URL is its only secret.
pub fn sink(url: &str, pacer: Pacer) -> JsonSink {
    JsonSink::new(url, pacer, payload, |host| vec![test_payload(host)])
}

/// Slack's mrkdwn control characters, on one line without control characters.
fn esc(s: &str) -> String {
    crate::text::clean(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn payload(ev: &Event) -> Value {
    let host = esc(&ev.host);
    let state = format!(
        "status {} (HTTP {}), recommendation `{}`",
        ev.status.as_str(),
        ev.http,
        ev.recommendation.as_str()
    );
    let reasons = if ev.reasons.is_empty() {
        "none".to_string()
    } else {
        esc(&ev.reasons.join("; "))
    };
    // A fleet's incident is one message for all of it: the fleet, how many have it, and the
    // state of the agent that reports it.
    let (place, seen) = match &ev.fleet {
        Some(f) => (
            format!("across fleet `{}`", esc(&f.name)),
            format!(
                "seen by {}{}; reported by `{host}`\n• ",
                if ev.kind == Kind::Resolve {
                    "up to "
                } else {
                    ""
                },
                instances(f.instances)
            ),
        ),
        None => (format!("on `{host}`"), String::new()),
    };
    let text = match ev.kind {
        Kind::Trigger => format!(
            ":rotating_light: *{}* {place} — triggered\n• condition: `{}`\n• {seen}{state}\n• reasons: {reasons}",
            ev.condition.title(),
            ev.condition.key(),
        ),
        Kind::Resolve => format!(
            ":white_check_mark: *{}* {place} — resolved after {}\n• condition: `{}`\n• {seen}now: {state}\n• reasons: {reasons}",
            ev.condition.title(),
            human(ev.duration()),
            ev.condition.key(),
        ),
    };
    json!({ "text": text })
}

pub fn test_payload(host: &str) -> Value {
    json!({
        "text": format!(
            ":wave: health-agent test message from `{}`: alerts reach this channel.",
            esc(host)
        )
    })
}
