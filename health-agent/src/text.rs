//! How values are shown: UTF-8-safe truncation, text from outside cleaned of control
//! characters, figures rounded to what they mean, and RFC 3339 timestamps. A leaf: it imports
//! nothing from the crate, so any module may use it.
//!
//! Figures are computed in full precision and rounded where they are written out (`shown`, the
//! serde helpers): `5.3812809999999995` ms is noise, `5.38` is what was measured.

use std::{borrow::Cow, time::SystemTime};

/// The longest prefix of `s` that is at most `limit` bytes and ends on a character boundary.
pub fn cut(s: &str, limit: usize) -> &str {
    &s[..s.floor_char_boundary(limit)]
}

/// `s` on one line without control characters, for a terminal, a log line or an alert: text
/// from outside (a peer's address or error, a database server's message, a container's name,
/// a Consul value) may carry an escape sequence that repaints a terminal, a line break that
/// forges a log line, or a bidirectional override that shows a name other than it is. C0 (tab
/// and line breaks too), DEL, C1 and the bidirectional controls go: tab and line breaks become
/// a space, so words stay apart; the rest are dropped.
pub fn clean(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unclean) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .filter_map(|c| match c {
                '\t' | '\n' | '\r' => Some(' '),
                c if unclean(c) => None,
                c => Some(c),
            })
            .collect(),
    )
}

/// A control character (`char::is_control`: C0, DEL, C1) or a bidirectional embedding,
/// override or isolate, or a direction mark.
fn unclean(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Truncates to at most `limit` bytes on a character boundary, marking the cut with `…`
/// (the mark counts towards the limit).
pub fn truncate(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_string();
    }
    format!("{}…", cut(s, limit.saturating_sub('…'.len_utf8())))
}

/// Rounded to one decimal, as reports show percentages and milliseconds.
pub fn round1(v: f64) -> f64 {
    round_to(v, 1)
}

/// Rounded to `decimals` places: the double nearest the decimal, so it prints short.
pub fn round_to(v: f64, decimals: i32) -> f64 {
    if !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(decimals);
    let r = (v * scale).round() / scale;
    // The product overflows past 1e300 or so: the value itself is then as exact as it gets.
    if r.is_finite() {
        r
    } else {
        v
    }
}

/// Milliseconds, to 0.01 ms (10 µs: below the clocks' and the kernel's own jitter).
pub fn ms(v: f64) -> f64 {
    round_to(v, 2)
}

/// A percentage, to 0.1 point.
pub fn percent(v: f64) -> f64 {
    round_to(v, 1)
}

/// A ratio or share (0 to 1, or above for an overload), to 3 decimals (0.1 %).
pub fn ratio(v: f64) -> f64 {
    round_to(v, 3)
}

/// Seconds, rates (per second), cores and load averages: to 0.01.
pub fn hundredths(v: f64) -> f64 {
    round_to(v, 2)
}

/// `#[serde(serialize_with = "...")]` helpers: the field's figure rounded as it is written out,
/// by what it means. `_opt` for `Option<f64>` (None stays null, or is skipped as the field
/// says).
pub mod shown {
    use std::collections::BTreeMap;

    use serde::{ser::SerializeMap, Serializer};

    macro_rules! shown {
        ($plain:ident, $opt:ident, $round:path) => {
            pub fn $plain<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_f64($round(*v))
            }

            pub fn $opt<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
                match v {
                    Some(v) => s.serialize_some(&$round(*v)),
                    None => s.serialize_none(),
                }
            }
        };
    }

    shown!(ms, ms_opt, super::ms);
    shown!(percent, percent_opt, super::percent);
    shown!(ratio, ratio_opt, super::ratio);
    shown!(hundredths, hundredths_opt, super::hundredths);

    /// Per-second rates keyed by name (`answers_per_second`).
    pub fn hundredths_map_opt<S: Serializer>(
        v: &Option<BTreeMap<&'static str, f64>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let Some(map) = v else {
            return s.serialize_none();
        };
        let mut m = s.serialize_map(Some(map.len()))?;
        for (k, v) in map {
            m.serialize_entry(k, &super::hundredths(*v))?;
        }
        m.end()
    }
}

/// A wall-clock time as RFC 3339 (UTC), as every report and payload shows it; empty in the
/// unrepresentable case rather than a panic.
pub fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(truncate("ééé", 4), "…");
        assert_eq!(truncate("abcdef", 5), "ab…");
        assert_eq!(truncate("abc", 5), "abc");
    }

    #[test]
    fn clean_leaves_one_line_without_control_characters() {
        assert!(matches!(clean("web-1:8080 — ok"), Cow::Borrowed(_)));
        assert_eq!(clean("\x1b[31mred\x1b[0m"), "[31mred[0m");
        assert_eq!(clean("\x1b[2Jgone"), "[2Jgone");
        assert_eq!(
            clean("line one\r\nINFO forged\tline"),
            "line one  INFO forged line"
        );
        assert_eq!(clean("a\u{7f}b\u{9b}c\u{0}d"), "abcd");
        assert_eq!(clean("evil\u{202e}gnp.exe"), "evilgnp.exe");
        // Letters of every script stay.
        assert_eq!(clean("héllo 日本"), "héllo 日本");
    }

    #[test]
    fn rounds_to_one_decimal() {
        assert_eq!(round1(12.34), 12.3);
        assert_eq!(round1(0.25), 0.3);
    }

    #[test]
    fn figures_are_written_out_as_short_as_they_mean() {
        // The noise the issue quotes, as it would be written out.
        assert_eq!(ms(5.3812809999999995).to_string(), "5.38");
        assert_eq!(ratio(0.16399999999999999).to_string(), "0.164");
        assert_eq!(ratio(16.4 / 100.0).to_string(), "0.164");
        assert_eq!(percent(36.934805000000004).to_string(), "36.9");
        assert_eq!(hundredths(1.551360574).to_string(), "1.55");
        // Exact and odd values pass through.
        assert_eq!(ms(250.0), 250.0);
        assert_eq!(ratio(1.0), 1.0);
        assert!(ms(f64::NAN).is_nan());
        assert_eq!(round_to(1e306, 2), 1e306);
    }

    #[test]
    fn the_serde_helpers_round_where_the_value_is_written() {
        #[derive(serde::Serialize)]
        struct Row {
            #[serde(serialize_with = "shown::ms")]
            latency_ms: f64,
            #[serde(serialize_with = "shown::ratio_opt")]
            share: Option<f64>,
            #[serde(serialize_with = "shown::percent_opt")]
            cpu_percent: Option<f64>,
            #[serde(serialize_with = "shown::hundredths_map_opt")]
            per_second: Option<std::collections::BTreeMap<&'static str, f64>>,
        }
        let row = Row {
            latency_ms: 36.934805000000004,
            share: Some(0.16399999999999999),
            cpu_percent: None,
            per_second: Some([("2xx", 7.233333333333333)].into_iter().collect()),
        };
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"{"latency_ms":36.93,"share":0.164,"cpu_percent":null,"per_second":{"2xx":7.23}}"#
        );
    }
}
