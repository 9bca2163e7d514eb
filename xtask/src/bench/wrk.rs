//! wrk, the load generator of most sections, and its output.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

use crate::cmd;

pub(super) struct Wrk {
    pub rps: f64,
    /// Completed in the whole run.
    pub requests: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub non_2xx: u64,
    pub errors: u64,
}

fn parse_time_ms(s: &str) -> Option<f64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v / 1000.0,
        "ms" => v,
        "s" => v * 1000.0,
        "m" => v * 60_000.0,
        _ => return None,
    })
}

fn parse_wrk(out: &str) -> Result<Wrk> {
    let mut w = Wrk {
        rps: 0.0,
        requests: 0,
        p50_ms: 0.0,
        p99_ms: 0.0,
        non_2xx: 0,
        errors: 0,
    };
    for line in out.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => w.rps = v.parse()?,
            [n, "requests", "in", ..] => w.requests = n.parse()?,
            ["50%", v] => w.p50_ms = parse_time_ms(v).context("wrk p50")?,
            ["99%", v] => w.p99_ms = parse_time_ms(v).context("wrk p99")?,
            ["Non-2xx", "or", "3xx", "responses:", n] => w.non_2xx = n.parse()?,
            ["Socket", "errors:", rest @ ..] => {
                w.errors = rest
                    .iter()
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum()
            }
            _ => {}
        }
    }
    if w.rps == 0.0 {
        bail!("wrk reported no requests:\n{out}");
    }
    Ok(w)
}

/// wrk with `conns` connections for `secs`; `rate_delay_ms` throttles each connection.
pub(super) fn wrk(
    url: &str,
    conns: u32,
    secs: u32,
    extra: &[&str],
    script: Option<&Path>,
) -> Result<Wrk> {
    run(Command::new("wrk"), url, conns, secs, extra, script)
}

/// wrk as `wrk` does it, on CPU `cpu` only (taskset), both of its threads.
pub(super) fn wrk_on_cpu(
    cpu: usize,
    url: &str,
    conns: u32,
    secs: u32,
    extra: &[&str],
) -> Result<Wrk> {
    let mut c = Command::new("taskset");
    c.args(["-c", &cpu.to_string(), "wrk"]);
    run(c, url, conns, secs, extra, None)
}

fn run(
    mut c: Command,
    url: &str,
    conns: u32,
    secs: u32,
    extra: &[&str],
    script: Option<&Path>,
) -> Result<Wrk> {
    let threads = conns.clamp(1, 2);
    c.args([
        "-t",
        &threads.to_string(),
        "-c",
        &conns.to_string(),
        "-d",
        &format!("{secs}s"),
        "--latency",
    ]);
    c.args(extra);
    if let Some(s) = script {
        c.arg("-s").arg(s);
    }
    c.arg(url);
    parse_wrk(
        &cmd::stdout(&mut c)
            .context("running wrk (apt-get install wrk; cargo xtask setup does)")?,
    )
}
