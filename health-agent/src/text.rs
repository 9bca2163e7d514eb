//! How values are shown: UTF-8-safe truncation, one-decimal rounding and RFC 3339 timestamps.
//! A leaf: it imports nothing from the crate, so any module may use it.

use std::time::SystemTime;

/// The longest prefix of `s` that is at most `limit` bytes and ends on a character boundary.
pub fn cut(s: &str, limit: usize) -> &str {
    &s[..s.floor_char_boundary(limit)]
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
    (v * 10.0).round() / 10.0
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
    fn rounds_to_one_decimal() {
        assert_eq!(round1(12.34), 12.3);
        assert_eq!(round1(0.25), 0.3);
    }
}
