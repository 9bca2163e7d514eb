//! The agent's own `process_*` metrics, as every Prometheus client library exports them
//! (client_golang's process collector): CPU, resident memory, descriptors and start time,
//! read from `/proc/self`. The reads are one function; the parsers are pure.

/// One reading of the agent's process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    /// Unix time the process started.
    pub start_time: Option<f64>,
}

/// Reads `/proc/self` (None when it cannot be read: the series are then left out).
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let clk = crate::sys::clock_ticks_per_second().unwrap_or(100.0);
    let page = crate::sys::page_size() as f64;
    let (ticks, start_ticks) = parse_stat(&stat)?;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| parse_btime(&s));
    Some(ProcessStats {
        cpu_seconds: ticks as f64 / clk,
        resident_bytes: parse_statm_rss(&statm)? as f64 * page,
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
        max_fds: std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| parse_max_open_files(&s))
            .map(|n| n as f64),
        start_time: boot.map(|b| b as f64 + start_ticks as f64 / clk),
    })
}

/// utime + stime, and starttime, in clock ticks. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some((num(14)? + num(15)?, num(22)?))
}

fn parse_statm_rss(statm: &str) -> Option<u64> {
    statm.split_whitespace().nth(1)?.parse().ok()
}

fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` (None when unlimited).
fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (health (agent) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    150 50 0 0 20 0 9 0 12345 123456789 2048 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((200, 12345)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn statm_btime_and_limits_are_parsed() {
        assert_eq!(parse_statm_rss("5000 1200 300 10 0 900 0\n"), Some(1200));
        assert_eq!(
            parse_btime("cpu  1 2 3\nintr 5\nbtime 1764822000\nprocesses 9\n"),
            Some(1_764_822_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             63432                63432                processes\n\
                      Max open files            65536                524288               files\n";
        assert_eq!(parse_max_open_files(limits), Some(65536));
    }

    #[test]
    fn this_process_reads_sensibly() {
        let p = read().expect("/proc/self is readable");
        assert!(p.resident_bytes > 1e6, "{p:?}");
        assert!(p.open_fds.is_some_and(|n| n >= 3.0), "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = p.start_time.expect("a start time");
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
    }
}
