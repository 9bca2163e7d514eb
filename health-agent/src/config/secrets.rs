//! Config errors and warnings that never echo a secret: the secret values of a config (for
//! scrubbing messages), TOML parse errors re-rendered without the offending line, and the
//! warning for a file that holds secrets and is readable by every user.

use std::path::Path;

use super::{has_password, Config};

/// The config keys that hold a secret in this config, with their values: alert URLs and keys,
/// database URLs with a password, URLs with credentials in them.
pub(super) fn secret_fields(cfg: &Config) -> Vec<(String, &str)> {
    let mut out: Vec<(String, &str)> = Vec::new();
    let a = &cfg.alerts;
    for (key, v) in [
        ("alerts.slack_webhook_url", &a.slack_webhook_url),
        ("alerts.webhook_url", &a.webhook_url),
        ("alerts.pagerduty_routing_key", &a.pagerduty_routing_key),
    ] {
        if !v.trim().is_empty() {
            out.push((key.into(), v));
        }
    }
    for (key, v) in [
        ("alerts.pagerduty_url", &a.pagerduty_url),
        ("alerts.github_api_url", &a.github_api_url),
        ("fleet.consul_addr", &cfg.fleet.consul_addr),
    ] {
        if reqwest::Url::parse(v).is_ok_and(|u| u.password().is_some()) {
            out.push((key.into(), v));
        }
    }
    for (key, url) in cfg.database.all_urls() {
        if has_password(url) {
            out.push((key, url));
        }
    }
    out
}

/// The warning for a config file that any user may read while it holds secrets, naming the
/// file, its mode and the keys (never their values). `None` when there is nothing to warn of.
pub fn world_readable_warning(path: &Path, cfg: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    if mode & 0o004 == 0 {
        return None;
    }
    let keys: Vec<String> = secret_fields(cfg).into_iter().map(|(k, _)| k).collect();
    if keys.is_empty() {
        return None;
    }
    Some(format!(
        "{} is readable by every user (mode {:04o}) and holds secrets ({}): chmod o-r it, or \
         chmod 600 and own it by the agent's user",
        path.display(),
        mode & 0o7777,
        keys.join(", ")
    ))
}

/// A TOML parse error re-rendered from its message and position, never the source excerpt
/// toml's own `Display` quotes: that line may hold a secret under a mistyped key. Whatever the
/// message itself quotes of the offending line's value is redacted too (`invalid type: integer
/// `…``), and any URL left is cut to what is safe to show.
pub(super) fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    let Some(span) = e.span() else {
        return scrub(message, &[]);
    };
    let start = (0..=span.start.min(text.len()))
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    let before = &text[..start];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_no = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let header = line.trim_start().starts_with('[');
    let (key, value_part) = match line.split_once('=') {
        Some((k, v)) if !header && !k.trim_start().starts_with('#') => (Some(k.trim()), v),
        _ => (None, line),
    };
    // What the error points at is a value unless it is a table header or the key itself (an
    // unknown field): those are names, and the message needs them.
    let in_name =
        header || (key.is_some() && line.find('=').is_some_and(|eq| start - line_start < eq));
    let mut values = if header {
        Vec::new()
    } else {
        literals(value_part)
    };
    if let Some(spanned) = text.get(span).filter(|_| !in_name) {
        let spanned = spanned.trim();
        values.push(spanned.to_string());
        values.extend(literals(spanned));
    }
    let full_key = key.map(|k| match section_of(&text[..line_start]) {
        Some(section) => format!("{section}.{k}"),
        None => k.to_string(),
    });
    // A value is shown only under a key the config knows and that holds no secret: a port
    // or a duration helps, and a mistyped key may be a secret's.
    if full_key.as_deref().is_some_and(shows_its_value) {
        values.clear();
    }
    let at = match &full_key {
        Some(k) => format!("line {line_no}, column {column}, key `{k}`"),
        None => format!("line {line_no}, column {column}"),
    };
    format!(
        "{at}: {}",
        scrub(&teach(message, full_key.as_deref()), &values)
    )
}

/// toml's type errors in the words the configuration reference uses: a number's range, a
/// duration's form, no quotes around a number (`invalid value: integer `70000`, expected u16`
/// → `must be a port number, 1 to 65535 (got integer `70000`)`). Anything else as toml said it.
fn teach(message: &str, key: Option<&str>) -> String {
    let Some((got, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|m| m.rsplit_once(", expected "))
    else {
        return message.to_string();
    };
    let whole = |max: u64| format!("must be a whole number from 0 to {max}");
    let rule = match expected {
        "u16" if key == Some("web.port") => {
            "must be the backend's listen port, 1 to 65535 (0 watches no backend)".to_string()
        }
        "u16" if key.is_some_and(|k| k.ends_with("port")) => {
            "must be a port number, 1 to 65535".to_string()
        }
        "u8" => whole(u8::MAX.into()),
        "u16" => whole(u16::MAX.into()),
        "u32" => whole(u32::MAX.into()),
        "u64" | "usize" => whole(u64::MAX),
        "f64" | "f32" => "must be a number".to_string(),
        "a boolean" => "must be true or false".to_string(),
        "a string" if key.is_some_and(is_duration) => {
            "must be a duration in quotes: \"120s\", \"500ms\", \"10m\"".to_string()
        }
        _ => return message.to_string(),
    };
    let unquote = if got.starts_with("string ") && expected != "a string" {
        ", without quotes"
    } else {
        ""
    };
    format!("{rule}{unquote} (got {got})")
}

/// Whether `key` ("section.field", or deeper) holds a duration: its default is one ("2s").
fn is_duration(key: &str) -> bool {
    let Ok(mut at) = toml::Value::try_from(Config::default()) else {
        return false;
    };
    for part in key.split('.') {
        match at.get(part) {
            Some(v) => at = v.clone(),
            None => return false,
        }
    }
    at.as_str()
        .is_some_and(|d| !d.is_empty() && humantime::parse_duration(d).is_ok())
}

/// Whether `key` ("section.field") is a key of the config whose values are never secret.
fn shows_its_value(key: &str) -> bool {
    let Some((section, field)) = key.split_once('.') else {
        return false;
    };
    let secret = ["url", "key", "token", "password", "secret"]
        .iter()
        .any(|w| field.contains(w))
        || key == "fleet.consul_addr";
    let known = toml::Value::try_from(Config::default())
        .ok()
        .and_then(|v| v.get(section)?.get(field).cloned())
        .is_some();
    known && !secret
}

/// The line (1-based) that sets `key` ("section.field") in `text`, under its `[section]` or
/// as a dotted key.
pub(super) fn line_of(text: &str, key: &str) -> Option<usize> {
    let mut section = String::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('[') {
            section = l.trim_matches(['[', ']', ' ']).to_string();
            continue;
        }
        let Some((k, _)) = l.split_once('=').filter(|_| !l.starts_with('#')) else {
            continue;
        };
        let k: String = k
            .split('.')
            .map(|p| p.trim().trim_matches('"'))
            .collect::<Vec<_>>()
            .join(".");
        let full = if section.is_empty() {
            k
        } else {
            format!("{section}.{k}")
        };
        if full == key {
            return Some(i + 1);
        }
    }
    None
}

/// "line 6: " before a key in an error, or nothing.
pub(super) fn line_prefix(line: Option<usize>) -> String {
    line.map_or(String::new(), |n| format!("line {n}: "))
}

/// The quoted strings in a TOML value (each element of an array too) and the value as a bare
/// token (a number, a boolean, an unquoted mistake).
fn literals(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let v = value.trim();
    let bare_end = v
        .find(|c: char| c.is_whitespace() || c == '#')
        .unwrap_or(v.len());
    if !v.starts_with(['"', '\'', '[', '{']) && bare_end > 0 {
        out.push(v[..bare_end].to_string());
    }
    let mut rest = v;
    while let Some(open) = rest.find(['"', '\'']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        let body = &rest[open + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            if c == quote && !escaped {
                end = Some(i);
                break;
            }
            escaped = quote == '"' && c == '\\' && !escaped;
        }
        let end = end.unwrap_or(body.len());
        if end > 0 {
            out.push(body[..end].to_string());
        }
        rest = body.get(end + 1..).unwrap_or("");
    }
    out
}

/// The `[section]` (or `[[section]]`) in force at the end of `before`.
fn section_of(before: &str) -> Option<String> {
    before.lines().rev().find_map(|l| {
        let l = l.trim();
        let l = l.strip_prefix('[')?;
        let end = l.find(']')?;
        Some(l[..end].trim_matches(['[', ']', ' ']).to_string())
    })
}

/// `message` without the given values where it quotes them (toml's messages quote the value
/// they refuse in backticks or quotes), then without any URL's secret parts. Never a search for
/// a value elsewhere in the text: that would mask every `e` for a value `e`.
fn scrub(message: &str, values: &[String]) -> String {
    let mut out = message.to_string();
    let mut values: Vec<&String> = values.iter().filter(|v| !v.is_empty()).collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for v in values {
        for (open, close) in [("`", "`"), ("\"", "\""), ("'", "'")] {
            out = out.replace(
                &format!("{open}{v}{close}"),
                &format!("{open}[redacted]{close}"),
            );
        }
    }
    crate::redact::text(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(toml: &str) -> String {
        Config::parse(toml, "x.toml").unwrap_err().to_string()
    }

    const SLACK: &str = "https://hooks.slack.com/services/T0123/B0456/Xy7sEcReTwEbHoOk";

    #[test]
    fn parse_errors_never_echo_a_value() {
        let cases = [
            // A mistyped secret key: the whole line was once quoted.
            (
                format!("[alerts]\ntimeout = \"5s\"\nslack_webhok_url = \"{SLACK}\"\n"),
                "Xy7sEcReTwEbHoOk",
                "alerts.slack_webhok_url",
                "line 3",
            ),
            (
                "[database]\nurll = \"postgres://app:Pa55w0rd!@db:5432/app\"\n".to_string(),
                "Pa55w0rd",
                "database.urll",
                "line 2",
            ),
            (
                "[alerts]\ngithub_tokn = \"ghp_a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuVwXyZ\"\n".into(),
                "ghp_a1B2c3D4",
                "alerts.github_tokn",
                "line 2",
            ),
            // A secret of the wrong type: serde quotes the value it did not expect.
            (
                "[alerts]\npagerduty_routing_key = 918273645546372819\n".into(),
                "918273645546372819",
                "alerts.pagerduty_routing_key",
                "line 2",
            ),
            (
                format!("alerts.slack_webhok_url = \"{SLACK}\"\n"),
                "Xy7sEcReTwEbHoOk",
                "unknown field `slack_webhok_url`",
                "line 1",
            ),
            (
                "[alertz]\nx = \"S3cr3tS3cr3t\"\n".into(),
                "S3cr3tS3cr3t",
                "unknown field `alertz`",
                "line 1",
            ),
            (
                "[database]\nurls = [\n  \"postgres://u:Pa55w0rd@h/db\",\n  918273645546372819,\n]\n".into(),
                "918273645546372819",
                "invalid type",
                "line 4",
            ),
            (
                format!("[alerts]\nslack_webhook_url = [\"{SLACK}\"]\n"),
                "Xy7sEcReTwEbHoOk",
                "alerts.slack_webhook_url",
                "line 2",
            ),
        ];
        for (toml, secret, key, line) in cases {
            let e = err(&toml);
            assert!(!e.contains(secret), "{e}");
            assert!(e.contains(key) && e.contains(line), "{e}");
            assert!(!e.contains("hooks.slack.com/services"), "{e}");
        }
    }

    #[test]
    fn world_readable_secrets_are_warned_of_without_the_secret() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let text = format!("[alerts]\nslack_webhook_url = \"{SLACK}\"\n");
        std::fs::write(&path, &text).unwrap();
        let cfg = Config::parse(&text, "x").unwrap();
        let chmod = |mode| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        chmod(0o644).unwrap();
        let w = world_readable_warning(&path, &cfg).expect("a warning");
        assert!(w.contains("agent.toml") && w.contains("0644"), "{w}");
        assert!(w.contains("alerts.slack_webhook_url"), "{w}");
        assert!(!w.contains("Xy7sEcReTwEbHoOk"), "{w}");
        chmod(0o640).unwrap();
        assert_eq!(world_readable_warning(&path, &cfg), None);
        chmod(0o644).unwrap();
        assert_eq!(
            world_readable_warning(&path, &Config::default()),
            None,
            "no secrets"
        );
        let db =
            Config::parse("[database]\nurl = \"postgres://u:pw@127.0.0.1/db\"\n", "x").unwrap();
        let w = world_readable_warning(&path, &db).expect("a database password");
        assert!(w.contains("database.url") && !w.contains("pw@"), "{w}");
        let no_pw =
            Config::parse("[database]\nurl = \"postgres://u@127.0.0.1/db\"\n", "x").unwrap();
        assert_eq!(world_readable_warning(&path, &no_pw), None);
    }

    #[test]
    fn plain_values_are_shown_and_out_of_range_errors_name_the_line() {
        let e = err("[web]\nport = 70000\n");
        assert!(e.contains("70000") && e.contains("line 2"), "{e}");
        let e = err("[checks]\nrecover_after = \"2\"\n");
        assert!(e.contains("\"2\"") && !e.contains("redacted"), "{e}");
        let e = err("[checks]\ninterval = \"1s\"\n\n[heal]\nwindow = \"0s\"\n");
        assert!(e.contains("line 5: `heal.window`"), "{e}");
        let e = err("heal.window = \"0s\"\n");
        assert!(e.contains("line 1: `heal.window`"), "{e}");
        // A secret's value, or a value under a key nobody knows, stays hidden.
        let e = err("[alerts]\npagerduty_routing_key = 918273645546372819\n");
        assert!(!e.contains("918273645546372819"), "{e}");
        let e = err("[web]\nprot = 70000\n");
        assert!(!e.contains("70000"), "{e}");
    }
}
