//! Every duration, count and percentage against bounds that keep the agent's arithmetic finite
//! and its behaviour meaningful: one table row per key, with why its bounds are what they are.

use std::time::Duration;

use super::Config;

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
    ("web.errors_window", |c| c.web.errors_window, SEC, HOUR,
     "a share needs at least a second of answers; longer than an hour keeps an erroring box in"),
    ("database.interval", |c| c.database.interval, Duration::from_millis(100), DAY,
     "faster hammers the database; slower than a day is no check"),
    ("database.timeout", |c| c.database.timeout, Duration::from_millis(10), HOUR,
     "0 fails every round trip at once"),
    ("database.slow_after", |c| c.database.slow_after, MS, HOUR,
     "0 calls every round trip slow"),
    ("scaling.window", |c| c.scaling.window, SEC, DAY,
     "CPU and memory need at least a second to average"),
    ("scaling.cloudwatch.interval", |c| c.scaling.cloudwatch.interval, Duration::from_secs(10), HOUR,
     "CloudWatch stores 1-second data at best and bills per request; below 60s needs high_resolution"),
    ("scaling.cloudwatch.timeout", |c| c.scaling.cloudwatch.timeout, Duration::from_millis(100), MINUTE,
     "0 fails every request at once; a publish stuck longer than a minute is better retried"),
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
    ("fleet.confirm_within", |c| c.fleet.confirm_within, Duration::ZERO, MINUTE,
     "longer keeps a dead instance in rotation while its peers stay silent"),
    ("drain.lifecycle_poll", |c| c.drain.lifecycle_poll, SEC, Duration::from_secs(60),
     "IMDS is local but not free; slower than a minute eats the hook's heartbeat"),
    ("drain.lifecycle_quiet", |c| c.drain.lifecycle_quiet, Duration::from_millis(100), MINUTE,
     "below one read of the connections proves nothing; longer than a minute is a sleep"),
    ("drain.lifecycle_timeout", |c| c.drain.lifecycle_timeout, SEC, Duration::from_secs(7200),
     "a lifecycle hook's heartbeat timeout is at most 2 hours"),
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
    ("scaling.cloudwatch.max_retries", |c| u64::from(c.scaling.cloudwatch.max_retries), 0, 10,
     "backoff doubles per retry; the next interval brings a new batch anyway"),
    ("alerts.queue_size", |c| c.alerts.queue_size as u64, 1, 65_536,
     "0 drops every message"),
    ("fleet.sample", |c| c.fleet.sample as u64, 1, 1000,
     "0 asks no peer: leave the peers empty instead"),
    ("web.workers", |c| u64::from(c.web.workers), 0, 100_000,
     "0 learns it; more threads than this is no single backend"),
    ("web.error_min_answers", |c| u64::from(c.web.error_min_answers), 1, 1_000_000,
     "0 answers would judge an idle backend; more than a million never judges"),
];

/// (key, value, min, max, why the bounds): saturation ratios (1.0 = at capacity).
type RatioBound = (&'static str, fn(&Config) -> f64, f64, f64, &'static str);

#[rustfmt::skip]
const RATIOS: &[RatioBound] = &[
    ("scaling.up_at", |c| c.scaling.up_at, 0.05, 10.0,
     "near 0 asks to scale up when idle; above 10 waits for a tenfold overload"),
    ("scaling.down_at", |c| c.scaling.down_at, 0.0, 5.0,
     "0 never scales down; above 5 scales down an overloaded instance"),
    ("web.error_share", |c| c.web.error_share, 0.01, 1.0,
     "a share of real answers that are 5xx: near 0 takes a box out for one error, 1 only when every answer fails"),
    ("web.slow_vs_peers", |c| c.web.slow_vs_peers, 1.5, 100.0,
     "a ratio of medians: below 1.5 the ordinary spread of a fleet takes boxes out; above 100 never"),
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
pub(super) fn check(cfg: &Config) -> Result<(), (&'static str, String)> {
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
    for (key, get, min, max, why) in RATIOS {
        let v = get(cfg);
        if !(*min..=*max).contains(&v) {
            return Err((
                key,
                format!("= {v} is out of range: allowed {min} to {max} ({why})"),
            ));
        }
    }
    let (down, up) = (cfg.scaling.down_at, cfg.scaling.up_at);
    if down >= up {
        return Err((
            "scaling.down_at",
            format!("({down}) must be below scaling.up_at ({up}): one load cannot ask for both"),
        ));
    }
    Ok(())
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
        for (key, get, min, max, _) in RATIOS {
            let (section, field) = key.split_once('.').unwrap();
            for v in [
                format!("{}", min - 0.01),
                format!("{}", max + 0.01),
                "nan".into(),
            ] {
                let toml = format!("[{section}]\n{field} = {v}\n");
                assert!(err(&toml).contains(&format!("`{key}`")), "{toml}");
            }
            // Each bound is allowed with the other key moved out of its way.
            for v in [*min, *max] {
                let other = match *key {
                    "scaling.up_at" => "down_at = 0.0",
                    "scaling.down_at" => "up_at = 10.0",
                    _ => "",
                };
                let toml = format!("[{section}]\n{field} = {v:?}\n{other}\n");
                let cfg = Config::parse(&toml, "x").unwrap_or_else(|e| panic!("{toml}: {e}"));
                assert_eq!(get(&cfg), v, "{toml}");
            }
        }
        let e = err("[scaling]\nup_at = 0.5\ndown_at = 0.5\n");
        assert!(
            e.contains("`scaling.down_at`") && e.contains("up_at"),
            "{e}"
        );
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
}
