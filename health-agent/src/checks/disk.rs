//! Disk usage of every configured mount, as `df` computes it (space reserved for root does not
//! count as free), against the warn/fail thresholds.

use serde::Serialize;

use crate::{config::DiskConfig, status::DiskLevel};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MountUsage {
    pub path: String,
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub used_percent: f64,
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub level: DiskLevel,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiskReport {
    pub level: DiskLevel,
    pub mounts: Vec<MountUsage>,
}

impl DiskReport {
    /// No answer from the disk check (it timed out or has not run yet).
    pub fn unknown() -> Self {
        Self {
            level: DiskLevel::Unknown,
            mounts: Vec::new(),
        }
    }

    /// The seed's one-word `checks.disk`: `ok`, `warning`, `critical` or `unknown`.
    pub fn summary(&self) -> &'static str {
        match self.level {
            DiskLevel::Ok => "ok",
            DiskLevel::Warn => "warning",
            DiskLevel::Fail => "critical",
            DiskLevel::Unknown => "unknown",
        }
    }
}

pub fn check(cfg: &DiskConfig) -> DiskReport {
    let mounts: Vec<MountUsage> = cfg.paths.iter().map(|p| usage(p, cfg)).collect();
    // The worst mount decides; an unreadable mount is unknown unless another one fails.
    let level = mounts
        .iter()
        .map(|m| m.level)
        .max_by_key(|l| match l {
            DiskLevel::Ok => 0,
            DiskLevel::Warn => 1,
            DiskLevel::Unknown => 2,
            DiskLevel::Fail => 3,
        })
        .unwrap_or(DiskLevel::Ok);
    DiskReport { level, mounts }
}

fn usage(path: &str, cfg: &DiskConfig) -> MountUsage {
    let failed = |error: String| MountUsage {
        path: path.to_string(),
        used_percent: 0.0,
        total_bytes: 0,
        available_bytes: 0,
        level: DiskLevel::Unknown,
        error: Some(error),
    };
    let st = match crate::sys::statvfs(std::path::Path::new(path)) {
        Ok(st) => st,
        Err(e) => return failed(e.to_string()),
    };
    let frsize = st.fragment_size;
    let used = st.blocks.saturating_sub(st.free);
    let avail = st.available;
    let denominator = used + avail;
    let used_percent = if denominator == 0 {
        0.0
    } else {
        used as f64 * 100.0 / denominator as f64
    };
    let level = if used_percent >= cfg.fail_percent {
        DiskLevel::Fail
    } else if used_percent >= cfg.warn_percent {
        DiskLevel::Warn
    } else {
        DiskLevel::Ok
    };
    MountUsage {
        path: path.to_string(),
        used_percent: (used_percent * 10.0).round() / 10.0,
        total_bytes: st.blocks * frsize,
        available_bytes: avail * frsize,
        level,
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_root_and_reports_missing_paths() {
        let cfg = DiskConfig {
            paths: vec!["/".into(), "/definitely/not/here".into()],
            warn_percent: 100.0,
            fail_percent: 100.0,
        };
        let r = check(&cfg);
        assert_eq!(r.mounts[0].error, None);
        assert!(r.mounts[0].total_bytes > 0);
        assert!(r.mounts[1]
            .error
            .as_deref()
            .unwrap()
            .contains("No such file"));
        assert_eq!(r.level, DiskLevel::Unknown);
    }

    #[test]
    fn thresholds_are_inclusive() {
        let used = check(&DiskConfig {
            paths: vec!["/".into()],
            warn_percent: 100.0,
            fail_percent: 100.0,
        })
        .mounts[0]
            .used_percent;
        let at = |warn: f64, fail: f64| {
            check(&DiskConfig {
                paths: vec!["/".into()],
                warn_percent: warn,
                fail_percent: fail,
            })
            .level
        };
        assert_eq!(at(0.0, 100.0), DiskLevel::Warn);
        assert_eq!(at(0.0, 0.0), DiskLevel::Fail);
        assert_eq!(at(used + 1.0, used + 2.0), DiskLevel::Ok);
    }
}
