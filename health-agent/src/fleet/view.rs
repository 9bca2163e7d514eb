//! A peer's view as bytes from the network: parsed, then every field range-checked, before any
//! of it reaches the judge. An out-of-range view is rejected whole, naming the field: even a
//! peer that holds the fleet key (a compromised member) must not crash this agent with a
//! number (`Duration::from_secs_f64(1e300)` panics), grow it with a string, or steer sums
//! past their types.

use super::{latency::PeerLatency, PeerView, VIEW_VERSION};

/// The largest view read from a peer; the answer is cut off there, while it is read. A view
/// of a busy agent with every field filled is about 2 KiB.
pub const MAX_VIEW_BYTES: usize = 64 * 1024;
/// An age of evidence (ms) beyond a year is no age an agent keeps.
const MAX_AGE_MS: u64 = 366 * 24 * 3_600 * 1_000;
const MAX_AGE_S: f64 = (MAX_AGE_MS / 1_000) as f64;
/// A latency figure beyond an hour is no answer's latency.
const MAX_LATENCY_MS: f64 = 3_600_000.0;
/// No window counts more answers than this (a million a second for ten days).
const MAX_COUNT: u64 = 1_000_000_000_000;
const MAX_LIST: usize = 64;
const MAX_ALERTS: usize = 16;
/// A `host:port` (a DNS name of 253 characters, a colon, a port).
const MAX_ENDPOINT: usize = 261;
const MAX_NAME: usize = 253;
const MAX_ID: usize = 64;
/// A view nests three levels; a document nested deeper is no view, whatever field holds it
/// (unknown fields are skipped, not refused, so that a newer peer's view still reads).
const MAX_DEPTH: usize = 16;

/// Why a peer's answer is not a view this agent counts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("not a peer view: {0}")]
    NotJson(String),
    #[error("peer view version {0}")]
    Version(u32),
    #[error("field {field} {why}")]
    Field { field: String, why: &'static str },
}

fn bad(field: impl Into<String>, why: &'static str) -> ViewError {
    ViewError::Field {
        field: field.into(),
        why,
    }
}

impl PeerView {
    /// The view in `body`, checked whole.
    pub fn parse(body: &[u8]) -> Result<Self, ViewError> {
        if depth(body) > MAX_DEPTH {
            return Err(ViewError::NotJson(format!(
                "nested deeper than {MAX_DEPTH} levels"
            )));
        }
        let view: PeerView = serde_json::from_slice(body).map_err(|e| {
            // serde's message names the line and column, never echoes the input at length.
            let mut s = e.to_string();
            s.truncate(160);
            ViewError::NotJson(s)
        })?;
        if view.version != VIEW_VERSION {
            return Err(ViewError::Version(view.version));
        }
        view.check()?;
        Ok(view)
    }

    fn check(&self) -> Result<(), ViewError> {
        id("instance", &self.instance)?;
        text("host", &self.host, MAX_NAME)?;
        list("dependencies", &self.dependencies)?;
        list("unreachable", &self.unreachable)?;
        if let Some(f) = &self.fine_ms {
            for (name, v) in [
                ("fine_ms.web", f.web),
                ("fine_ms.dependency", f.dependency),
                ("fine_ms.containers", f.containers),
                ("fine_ms.errors", f.errors),
            ] {
                age(name, v)?;
            }
        }
        if let Some(a) = &self.answers {
            count("answers.answers", a.answers)?;
            if let Some(s) = a.share_5xx {
                within("answers.share_5xx", s, 1.0)?;
            }
        }
        if self.alerts.len() > MAX_ALERTS {
            return Err(bad("alerts", "holds too many entries"));
        }
        for (i, a) in self.alerts.iter().enumerate() {
            id(&format!("alerts[{i}].condition"), &a.condition)?;
            id(&format!("alerts[{i}].reporter"), &a.reporter)?;
            age(&format!("alerts[{i}].reporter_ms"), Some(a.reporter_ms))?;
        }
        if let Some(l) = &self.latency {
            latency(l)?;
        }
        Ok(())
    }
}

/// How deep `body` nests arrays and objects, strings skipped; one pass, no allocation.
fn depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn latency(l: &PeerLatency) -> Result<(), ViewError> {
    within("latency.p50_ms", l.p50_ms, MAX_LATENCY_MS)?;
    within("latency.p90_ms", l.p90_ms, MAX_LATENCY_MS)?;
    count("latency.answers", l.answers)?;
    within("latency.window_seconds", l.window_seconds, MAX_AGE_S)?;
    if let Some(b) = l.began_seconds_ago {
        within("latency.began_seconds_ago", b, MAX_AGE_S)?;
    }
    id("latency.basis", &l.basis)?;
    if let Some(t) = &l.instance_type {
        text("latency.instance_type", t, MAX_NAME)?;
    }
    Ok(())
}

/// A finite number from 0 to `max`.
fn within(field: &str, v: f64, max: f64) -> Result<(), ViewError> {
    if !v.is_finite() {
        return Err(bad(field, "is not a finite number"));
    }
    if v < 0.0 {
        return Err(bad(field, "is negative"));
    }
    if v > max {
        return Err(bad(field, "is out of range"));
    }
    Ok(())
}

fn age(field: &str, ms: Option<u64>) -> Result<(), ViewError> {
    match ms {
        Some(ms) if ms > MAX_AGE_MS => Err(bad(field, "is out of range")),
        _ => Ok(()),
    }
}

fn count(field: &str, n: u64) -> Result<(), ViewError> {
    if n > MAX_COUNT {
        return Err(bad(field, "is out of range"));
    }
    Ok(())
}

/// An id or a key word: letters, digits, `_` and `-`.
fn id(field: &str, s: &str) -> Result<(), ViewError> {
    if s.len() > MAX_ID {
        return Err(bad(field, "is too long"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(bad(field, "holds characters an id has not"));
    }
    Ok(())
}

/// Free text shown to users: no control characters, bounded.
fn text(field: &str, s: &str, max: usize) -> Result<(), ViewError> {
    if s.len() > max {
        return Err(bad(field, "is too long"));
    }
    if s.chars().any(char::is_control) {
        return Err(bad(field, "holds control characters"));
    }
    Ok(())
}

fn list(field: &str, items: &[String]) -> Result<(), ViewError> {
    if items.len() > MAX_LIST {
        return Err(bad(field, "holds too many entries"));
    }
    for (i, s) in items.iter().enumerate() {
        text(&format!("{field}[{i}]"), s, MAX_ENDPOINT)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        PeerView::parse(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn a_genuine_view_reads() {
        let v = PeerView {
            instance: "00aa11bb22cc33dd".into(),
            host: "web-1".into(),
            dependencies: vec!["10.0.0.9:5432".into()],
            ..PeerView::default()
        };
        let body = serde_json::to_vec(&v).unwrap();
        assert_eq!(PeerView::parse(&body).unwrap(), v);
    }

    #[test]
    fn hostile_numbers_are_rejected_naming_the_field() {
        let lat = |f: &str| {
            format!(
                r#"{{"version":1,"latency":{{"p50_ms":1,"p90_ms":2,"answers":5,"window_seconds":10,"basis":"counted","slow_vs_peers":false,"out_slow":false,{f}}}}}"#
            )
        };
        let e = err(&lat(r#""began_seconds_ago":1e300"#));
        assert!(
            e.contains("latency.began_seconds_ago is out of range"),
            "{e}"
        );
        let e = err(&lat(r#""began_seconds_ago":-1"#));
        assert!(e.contains("latency.began_seconds_ago is negative"), "{e}");
        // NaN has no JSON spelling; an exponent past f64 is refused by the parser.
        let e = err(&lat(r#""began_seconds_ago":1e999"#));
        assert!(e.contains("not a peer view"), "{e}");
        let e = err(
            r#"{"version":1,"latency":{"p50_ms":-1e9,"p90_ms":1,"answers":1,"window_seconds":1,"basis":"x","slow_vs_peers":false,"out_slow":false}}"#,
        );
        assert!(e.contains("latency.p50_ms is negative"), "{e}");
        let e = err(r#"{"version":1,"answers":{"visible":true,"answers":10,"share_5xx":7}}"#);
        assert!(e.contains("answers.share_5xx is out of range"), "{e}");
        let e = err(r#"{"version":1,"fine_ms":{"web":18446744073709551615}}"#);
        assert!(e.contains("fine_ms.web is out of range"), "{e}");
        let e = err(
            r#"{"version":1,"alerts":[{"condition":"x","reporter":"y","reporter_ms":18446744073709551615}]}"#,
        );
        assert!(e.contains("alerts[0].reporter_ms"), "{e}");
        let e = err(r#"{"version":1,"fine_ms":{"web":-5}}"#);
        assert!(e.contains("not a peer view"), "{e}");
    }

    #[test]
    fn hostile_shapes_are_rejected() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(err(&deep).contains("not a peer view"));
        // In a field the view does not know, which serde would skip whole.
        let e = err(&format!(
            r#"{{"version":1,"future":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        ));
        assert!(e.contains("nested deeper than 16 levels"), "{e}");
        // Brackets inside strings are text.
        assert_eq!(depth(br#"{"host":"[[[[{{{{\"[[[["}"#), 1);
        let e = err(&format!(
            r#"{{"version":1,"host":"{}"}}"#,
            "x".repeat(1_000)
        ));
        assert!(e.contains("field host is too long"), "{e}");
        let e = err(r#"{"version":1,"host":"web\u001b[2J"}"#);
        assert!(e.contains("host holds control characters"), "{e}");
        let e = err(r#"{"version":1,"instance":"a b"}"#);
        assert!(e.contains("instance"), "{e}");
        let many: Vec<String> = (0..100).map(|i| format!("\"10.0.0.{i}:1\"")).collect();
        let e = err(&format!(
            r#"{{"version":1,"dependencies":[{}]}}"#,
            many.join(",")
        ));
        assert!(e.contains("dependencies holds too many"), "{e}");
        assert_eq!(
            PeerView::parse(br#"{"version":2}"#),
            Err(ViewError::Version(2))
        );
    }
}
