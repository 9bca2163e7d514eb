//! Validation beyond the types serde checks: every duration and count against bounds that keep
//! the agent's arithmetic finite and its behaviour meaningful, alert URLs that carry secrets,
//! and config errors that never echo a value that may be a secret. A file that holds secrets
//! and is readable by every user is warned about.

use std::{path::Path, time::Duration};

use super::Config;
use crate::{alerts::redact::Secrets, dburl as database};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// (key, value, min, max, why the bounds). The upper bounds keep every sum and multiple the
/// agent makes of these values (`2 × interval`, `now + hung_after`…) far from overflow, and are
/// longer than any setting that still does its job.
type DurationBound = (
    &'static str,
    fn(&Config) -> Duration,
    Duration,
    Duration,
    &'static str,
);

#[rustfmt::skip]
const DURATIONS: &[DurationBound] = &[
    ("server.request_timeout", |c| c.server.request_timeout, Duration::from_millis(10), HOUR,
     "0 cuts off every client; a slow client holds a connection slot this long"),
    ("checks.interval", |c| c.checks.interval, Duration::from_millis(100), HOUR,
     "faster burns CPU on disk and process scans; slower leaves /health stale"),
    ("checks.timeout", |c| c.checks.timeout, Duration::from_millis(10), HOUR,
     "0 times out every check at once"),
    ("checks.boot_grace", |c| c.checks.boot_grace, Duration::ZERO, DAY,
     "0 means no grace; longer than a day is no longer booting"),
    ("checks.stale_after", |c| c.checks.stale_after, Duration::from_millis(200), DAY,
     "it must also be at least twice checks.interval"),
    ("checks.fail_after", |c| c.checks.fail_after, Duration::ZERO, HOUR,
     "0 turns 503 at once; a fault held back longer than an hour is hidden"),
    ("checks.recover_after", |c| c.checks.recover_after, Duration::ZERO, HOUR,
     "0 turns 200 at once; longer than an hour keeps a recovered node out"),
    ("web.probe_timeout", |c| c.web.probe_timeout, Duration::from_millis(10), Duration::from_secs(600),
     "0 fails every probe at once"),
    ("web.hung_after", |c| c.web.hung_after, Duration::from_millis(10), HOUR,
     "0 calls every queued connection a hang; longer than an hour hides a hang"),
    ("web.unanswered_after", |c| c.web.unanswered_after, Duration::from_millis(10), HOUR,
     "0 calls every pending request unanswered; longer than an hour hides a hang"),
    ("web.slow_after", |c| c.web.slow_after, MS, HOUR,
     "0 calls every request slow"),
    ("web.latency_window", |c| c.web.latency_window, SEC, DAY,
     "the percentiles need at least a second of requests"),
    ("web.eval_interval", |c| c.web.eval_interval, Duration::from_millis(10), MINUTE,
     "faster costs CPU for nothing; slower reports a hang that much later"),
    ("database.interval", |c| c.database.interval, Duration::from_millis(100), DAY,
     "faster hammers the database; slower than a day is no check"),
    ("database.timeout", |c| c.database.timeout, Duration::from_millis(10), HOUR,
     "0 fails every round trip at once"),
    ("database.slow_after", |c| c.database.slow_after, MS, HOUR,
     "0 calls every round trip slow"),
    ("scaling.window", |c| c.scaling.window, SEC, DAY,
     "CPU and memory need at least a second to average"),
    ("heal.window", |c| c.heal.window, SEC, DAY,
     "0 forgets every restart at once: unlimited restarts"),
    ("heal.timeout", |c| c.heal.timeout, SEC, HOUR,
     "0 fails every restart at once; a restart command is killed after this long"),
    ("alerts.resolve_after", |c| c.alerts.resolve_after, Duration::from_millis(100), DAY,
     "0 makes every flap a new incident"),
    ("alerts.timeout", |c| c.alerts.timeout, Duration::from_millis(100), Duration::from_secs(600),
     "0 fails every alert at once"),
    ("fleet.interval", |c| c.fleet.interval, Duration::from_millis(100), HOUR,
     "faster floods the peers; slower makes their view useless"),
    ("fleet.timeout", |c| c.fleet.timeout, Duration::from_millis(10), MINUTE,
     "0 fails every peer at once; a peer slower than a minute is no evidence"),
];

/// (key, value, min, max, why the bounds).
type CountBound = (&'static str, fn(&Config) -> u64, u64, u64, &'static str);

#[rustfmt::skip]
const COUNTS: &[CountBound] = &[
    ("server.max_connections", |c| c.server.max_connections as u64, 1, 1_000_000,
     "0 serves nobody"),
    ("server.max_connections_per_client", |c| u64::from(c.server.max_connections_per_client), 1, 1_000_000,
     "0 serves nobody"),
    ("server.threads", |c| c.server.threads as u64, 0, 1024,
     "0 means one per core"),
    ("web.max_connections_tracked", |c| u64::from(c.web.max_connections_tracked), 64, 1 << 22,
     "the kernel's LRU table: smaller loses connections, larger wastes kernel memory"),
    ("database.fail_after", |c| u64::from(c.database.fail_after), 1, 1000,
     "0 round trips cannot fail"),
    ("database.recover_after", |c| u64::from(c.database.recover_after), 1, 1000,
     "0 round trips cannot succeed"),
    ("heal.max_restarts", |c| u64::from(c.heal.max_restarts), 1, 1000,
     "0 never restarts: set heal.enabled = false instead"),
    ("alerts.max_retries", |c| u64::from(c.alerts.max_retries), 0, 20,
     "backoff doubles per retry: 20 is already days"),
    ("alerts.queue_size", |c| c.alerts.queue_size as u64, 1, 65_536,
     "0 drops every message"),
    ("fleet.sample", |c| c.fleet.sample as u64, 1, 1000,
     "0 asks no peer: leave the peers empty instead"),
];

/// (key, value): percentages, 0 to 100.
type PercentKey = (&'static str, fn(&Config) -> f64);

#[rustfmt::skip]
const PERCENTS: &[PercentKey] = &[
    ("disk.warn_percent", |c| c.disk.warn_percent),
    ("disk.fail_percent", |c| c.disk.fail_percent),
    ("scaling.cpu_high_percent", |c| c.scaling.cpu_high_percent),
    ("scaling.memory_high_percent", |c| c.scaling.memory_high_percent),
    ("scaling.cpu_low_percent", |c| c.scaling.cpu_low_percent),
    ("scaling.memory_low_percent", |c| c.scaling.memory_low_percent),
];

/// (lower key, higher key): the first must be below the second.
const ORDERED_PERCENTS: &[(&str, &str)] = &[
    ("disk.warn_percent", "disk.fail_percent"),
    ("scaling.cpu_low_percent", "scaling.cpu_high_percent"),
    ("scaling.memory_low_percent", "scaling.memory_high_percent"),
];

/// A duration as the user would write it; absurdly long ones in plain seconds.
fn show(d: Duration) -> String {
    if d > 1000 * DAY {
        format!("{}s", d.as_secs())
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Every duration, count and percentage within its bounds: `(key, message)` for the first
/// that is not. These are plain numbers, never secrets, so the message shows the value.
pub(super) fn bounds(cfg: &Config) -> Result<(), (&'static str, String)> {
    for (key, get, min, max, why) in DURATIONS {
        let v = get(cfg);
        if v < *min || v > *max {
            return Err((
                key,
                format!(
                    "= \"{}\" is out of range: allowed {} to {} ({why})",
                    show(v),
                    show(*min),
                    show(*max)
                ),
            ));
        }
    }
    for (key, get, min, max, why) in COUNTS {
        let v = get(cfg);
        if v < *min || v > *max {
            return Err((
                key,
                format!("= {v} is out of range: allowed {min} to {max} ({why})"),
            ));
        }
    }
    let percent = |key: &str| {
        PERCENTS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, g)| g(cfg))
    };
    for (key, get) in PERCENTS {
        let v = get(cfg);
        // NaN fails `contains` too.
        if !(0.0..=100.0).contains(&v) {
            return Err((
                key,
                format!("= {v} is out of range: must be between 0 and 100"),
            ));
        }
    }
    for (low, high) in ORDERED_PERCENTS {
        if let (Some(l), Some(h)) = (percent(low), percent(high)) {
            if l >= h {
                return Err((low, format!("({l}) must be below {high} ({h})")));
            }
        }
    }
    Ok(())
}

/// A URL that carries a secret (a webhook's path, a token or key sent with the request):
/// https://, or http:// to a loopback host only, where nothing crosses a network. The message
/// never shows the URL.
pub(super) fn secret_url(url: &str) -> Result<(), &'static str> {
    let Ok(u) = reqwest::Url::parse(url) else {
        return Err("must be an https:// URL (value not shown: it may be a secret)");
    };
    let host = u.host_str().unwrap_or("");
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match u.scheme() {
        "https" if u.host().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(
            "must be https://; http:// only to a loopback host (127.0.0.0/8, ::1, \
             localhost): it carries a secret (value not shown)",
        ),
        _ => Err("must be an https:// URL (value not shown: it may be a secret)"),
    }
}

/// The config keys that hold a secret in this config, with their values: alert URLs and keys,
/// database URLs with a password, URLs with credentials in them.
fn secret_fields(cfg: &Config) -> Vec<(String, &str)> {
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
        if !database::url_secrets(url).is_empty() {
            out.push((key, url));
        }
    }
    out
}

/// Every secret value in the config, for scrubbing messages.
pub(super) fn secrets(cfg: &Config) -> Secrets {
    let mut s = Secrets::new();
    for (key, v) in secret_fields(cfg) {
        if key.starts_with("database.") {
            // The URL itself is shown redacted in database errors; only its password is secret.
            for p in database::url_secrets(v) {
                s = s.with(&p);
            }
        } else {
            s = s.with_url(v);
        }
    }
    s
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
    let at = match full_key {
        Some(k) => format!("line {line_no}, column {column}, key `{k}`"),
        None => format!("line {line_no}, column {column}"),
    };
    format!("{at}: {}", scrub(message, &values))
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

/// `message` without the given values, then without any URL's secret parts. A short value is
/// replaced only where the message quotes it, so `5` does not eat every digit; a long one
/// wherever it appears.
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
        if v.len() >= 8 {
            out = Secrets::new().with(v).replace(&out);
        }
    }
    crate::alerts::redact::redact(&database::redact_urls_in(&out), &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(toml: &str) -> String {
        Config::parse(toml, "x.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_issues_bad_values_are_refused_by_key() {
        for (toml, key) in [
            ("[heal]\nwindow = \"0s\"\n", "`heal.window`"),
            ("[heal]\ntimeout = \"0s\"\n", "`heal.timeout`"),
            (
                "[web]\nhung_after = \"9000000000000000000s\"\n",
                "`web.hung_after`",
            ),
        ] {
            let e = err(toml);
            assert!(e.contains(key), "{toml}: {e}");
            assert!(e.contains("allowed"), "says what is allowed: {e}");
        }
        let e = err("[web]\nhung_after = \"9000000000000000000s\"\n");
        assert!(
            e.contains("9000000000000000000s"),
            "shows the value given: {e}"
        );
    }

    #[test]
    fn every_bound_is_enforced_at_both_ends() {
        for (key, get, min, max, _) in DURATIONS {
            let (section, field) = key.split_once('.').unwrap();
            let mut outside = vec![*max + MS];
            if let Some(below) = min.checked_sub(MS) {
                outside.push(below);
            }
            for v in outside {
                let toml = format!("[{section}]\n{field} = \"{}\"\n", show(v));
                let e = err(&toml);
                assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
            }
            // The bounds themselves are allowed (unless a cross-check says otherwise).
            for v in [*min, *max] {
                let toml = format!("[{section}]\n{field} = \"{}\"\n", show(v));
                match Config::parse(&toml, "x") {
                    Ok(cfg) => assert_eq!(get(&cfg), v, "{toml}"),
                    Err(e) => assert!(!e.to_string().contains("out of range"), "{toml}: {e}"),
                }
            }
        }
        for (key, get, min, max, _) in COUNTS {
            let (section, field) = key.split_once('.').unwrap();
            let mut outside = vec![max + 1];
            if let Some(below) = min.checked_sub(1) {
                outside.push(below);
            }
            for v in outside {
                let toml = format!("[{section}]\n{field} = {v}\n");
                let e = err(&toml);
                // Values beyond the field's type are refused by serde, with the key's line.
                assert!(
                    e.contains(&format!("`{key}`")) || e.contains(&format!("key `{key}`")),
                    "{toml}: {e}"
                );
            }
            for v in [*min, *max] {
                let toml = format!("[{section}]\n{field} = {v}\n");
                let cfg = Config::parse(&toml, "x").unwrap_or_else(|e| panic!("{toml}: {e}"));
                assert_eq!(get(&cfg), v, "{toml}");
            }
        }
        for (key, _) in PERCENTS {
            let (section, field) = key.split_once('.').unwrap();
            for v in ["-0.5", "100.5", "nan", "inf"] {
                let toml = format!("[{section}]\n{field} = {v}\n");
                assert!(err(&toml).contains(&format!("`{key}`")), "{toml}");
            }
        }
        for (low, high) in ORDERED_PERCENTS {
            let (section, l) = low.split_once('.').unwrap();
            let (_, h) = high.split_once('.').unwrap();
            let toml = format!("[{section}]\n{l} = 50.0\n{h} = 50.0\n");
            assert!(err(&toml).contains(&format!("`{low}`")), "{toml}");
        }
    }

    #[test]
    fn huge_values_never_panic() {
        for (key, ..) in DURATIONS {
            let (section, field) = key.split_once('.').unwrap();
            for v in [
                "18446744073709551615s",
                "9000000000000000000s",
                "584942417355years",
            ] {
                let toml = format!("[{section}]\n{field} = \"{v}\"\n");
                // An error (out of range, or humantime's own overflow), never a panic.
                assert!(Config::parse(&toml, "x").is_err(), "{toml}");
            }
        }
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
    fn secret_urls_need_https_unless_loopback() {
        for key in [
            "slack_webhook_url",
            "webhook_url",
            "pagerduty_url",
            "github_api_url",
        ] {
            let e = err(&format!(
                "[alerts]\n{key} = \"http://hooks.example.com/services/T1/B2/s3cr3t?token=t0k\"\n"
            ));
            assert!(e.contains(&format!("`alerts.{key}`")), "{e}");
            assert!(e.contains("https://"), "{e}");
            assert!(!e.contains("s3cr3t") && !e.contains("t0k"), "{e}");
            for ok in [
                "https://hooks.example.com/x",
                "http://127.0.0.1:9/x",
                "http://127.8.9.10/x",
                "http://[::1]:8080/x",
                "http://localhost:8080/x",
                "http://LOCALHOST/x",
            ] {
                Config::parse(&format!("[alerts]\n{key} = \"{ok}\"\n"), "x")
                    .unwrap_or_else(|e| panic!("{key} = {ok}: {e}"));
            }
            for bad in [
                "http://127.0.0.1.evil.com/x",
                "http://[::2]/x",
                "ftp://127.0.0.1/x",
            ] {
                let e = err(&format!("[alerts]\n{key} = \"{bad}\"\n"));
                assert!(e.contains(&format!("`alerts.{key}`")), "{bad}: {e}");
            }
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
}
