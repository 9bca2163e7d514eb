//! Process evidence for the incident report: the top processes by CPU and memory and the
//! suspicious ones, collected on a blocking task started at trigger time (two `/proc` samples
//! `evidence_interval` apart for CPU), so it shows the box as it was when the incident opened
//! even if GitHub is slow or rate-limited. A leaf of `alerts`: `incident` carries a `Pending`,
//! `report` renders an `Evidence`, and neither imports the other for it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use serde::Serialize;
use tokio::sync::watch;

use crate::suspicious::{self, SuspiciousProcess};

/// Rows per table in the report.
pub const TOP: usize = 10;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub name: String,
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Evidence {
    pub top_cpu: Vec<ProcRow>,
    pub top_memory: Vec<ProcRow>,
    pub suspicious: Vec<SuspiciousProcess>,
    pub sample_ms: u64,
}

/// Evidence being collected in the background.
#[derive(Clone)]
pub struct Pending(watch::Receiver<Option<Arc<Evidence>>>);

impl Pending {
    /// Starts collecting on the blocking pool; `None` outside a tokio runtime.
    pub fn start(interval: Duration) -> Option<Self> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = watch::channel(None);
        rt.spawn_blocking(move || {
            let _ = tx.send(Some(Arc::new(collect(interval))));
        });
        Some(Self(rx))
    }

    pub async fn get(&self, wait: Duration) -> Option<Arc<Evidence>> {
        let mut rx = self.0.clone();
        let got = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some()))
            .await
            .ok()?
            .ok()?;
        got.clone()
    }
}

struct Stat {
    name: String,
    ticks: u64,
    rss_pages: u64,
}

fn read_stat(pid: u32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let name = s.get(open + 1..close)?.to_string();
    // Fields after the name, from field 3 (state): utime is 14, stime 15, rss 24.
    let f: Vec<&str> = s.get(close + 1..)?.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        name,
        ticks: num(11)? + num(12)?,
        rss_pages: num(21)?,
    })
}

/// Blocking: samples `/proc` twice, `interval` apart, and scans for suspicious processes.
pub fn collect(interval: Duration) -> Evidence {
    let clk = crate::sys::clock_ticks_per_second().unwrap_or(100.0);
    let page = crate::sys::page_size();
    let t0 = std::time::Instant::now();
    let first: HashMap<u32, u64> = suspicious::pids()
        .into_iter()
        .filter_map(|p| Some((p, read_stat(p)?.ticks)))
        .collect();
    std::thread::sleep(interval);
    let elapsed = t0.elapsed().as_secs_f64().max(0.001);
    let mut rows: Vec<ProcRow> = suspicious::pids()
        .into_iter()
        .filter_map(|pid| {
            let s = read_stat(pid)?;
            let before = first.get(&pid).copied().unwrap_or(0);
            Some(ProcRow {
                pid,
                name: s.name,
                cpu_percent: s.ticks.saturating_sub(before) as f64 / clk / elapsed * 100.0,
                rss_bytes: s.rss_pages * page,
                exe: None,
            })
        })
        .collect();
    let with_exe = |mut r: ProcRow| {
        r.exe = std::fs::read_link(format!("/proc/{}/exe", r.pid))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        r
    };
    rows.sort_by(|a, b| b.cpu_percent.total_cmp(&a.cpu_percent));
    let top_cpu = rows.iter().take(TOP).cloned().map(with_exe).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.rss_bytes));
    let top_memory = rows.iter().take(TOP).cloned().map(with_exe).collect();
    Evidence {
        top_cpu,
        top_memory,
        suspicious: suspicious::scan(),
        sample_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_sees_this_process() {
        let e = collect(Duration::from_millis(20));
        assert_eq!(e.top_cpu.len().min(TOP), e.top_cpu.len());
        assert!(!e.top_memory.is_empty());
        assert!(e.top_memory[0].rss_bytes > 0);
    }
}
