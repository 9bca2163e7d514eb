//! Polling with a deadline.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::get;

/// Polls `f` every 100 ms until it returns Some, or panics after `timeout` with `what`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `/health` on 127.0.0.1:`port`, code and JSON body; None while nothing answers with JSON.
/// For an agent the harness did not start (a container, a booted system); the harness's own
/// [`crate::Agent`] has `wait_health`, which adds its log.
pub fn health_at(port: u16) -> Option<(u16, Value)> {
    let (code, body) = get(port, "/health").ok()?;
    Some((code, serde_json::from_str(&body).ok()?))
}

/// Polls [`health_at`] every 100 ms until `ok` holds; panics after `timeout` with `what` and the
/// last answer.
pub fn wait_health_at(
    port: u16,
    timeout: Duration,
    what: &str,
    ok: impl Fn(u16, &Value) -> bool,
) -> (u16, Value) {
    let mut last = None;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some((code, body)) = health_at(port) {
            if ok(code, &body) {
                return (code, body);
            }
            last = Some((code, body));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}; last /health: {last:?}");
}

/// [`wait_health_at`] for 503 `hung` after a SIGSTOP at `frozen`; prints, as `label`, what
/// `/health` said and how long after the SIGSTOP.
pub fn wait_hung_at(port: u16, timeout: Duration, label: &str, frozen: Instant) -> (u16, Value) {
    let what = format!("503 hung ({label})");
    let (code, body) = wait_health_at(port, timeout, &what, |c, b| {
        c == 503 && b["checks"]["webserver"] == "hung"
    });
    println!(
        "{label}: /health {code} {} webserver {} {:.1} s after SIGSTOP: {}",
        body["status"],
        body["checks"]["webserver"],
        frozen.elapsed().as_secs_f64(),
        body["reasons"][0]
    );
    (code, body)
}
