//! The kernel's own account of BPF programs: `BPF_ENABLE_STATS` turns run counting on for as long
//! as its descriptor is open (a reference, so it never turns off what someone else turned on),
//! and /proc/<pid>/fdinfo of a process's program descriptors says how often each ran and for
//! how long.

use std::os::fd::{FromRawFd, OwnedFd};

/// Run counting on while this lives.
pub struct BpfStats {
    _fd: OwnedFd,
}

impl BpfStats {
    /// Turns run counting on (`bpf(BPF_ENABLE_STATS, {type: BPF_STATS_RUN_TIME})`).
    pub fn enable() -> Self {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        // union bpf_attr's enable_stats: one u32, 0 = BPF_STATS_RUN_TIME.
        let attr = [0u8; 4];
        // SAFETY: bpf(2) reads `attr` (4 bytes, all valid) and returns a new descriptor.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_ptr(),
                attr.len() as libc::c_uint,
            )
        };
        assert!(
            fd >= 0,
            "BPF_ENABLE_STATS failed: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor the kernel just returned, owned from here on.
        Self {
            _fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        }
    }
}

/// One BPF program held by a process, as its fdinfo reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgRuns {
    pub id: u64,
    /// `BPF_PROG_TYPE_*` (8: cgroup-skb, the answer programs).
    pub prog_type: u64,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// `BPF_PROG_TYPE_CGROUP_SKB`: the answer programs, which run per packet of the watched port.
pub const CGROUP_SKB: u64 = 8;

/// Every BPF program `pid` holds a descriptor to, with its run count and time so far (both
/// move only while run counting is on).
pub fn prog_runs(pid: u32) -> Vec<ProgRuns> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(run_cnt), Some(run_time_ns)) =
            (field("prog_id:"), field("run_cnt:"), field("run_time_ns:"))
        {
            if !out.iter().any(|p: &ProgRuns| p.id == id) {
                out.push(ProgRuns {
                    id,
                    prog_type: field("prog_type:").unwrap_or(0),
                    run_cnt,
                    run_time_ns,
                });
            }
        }
    }
    out.sort_by_key(|p| p.id);
    out
}

/// Runs of all of `pid`'s programs together.
pub fn total_runs(pid: u32) -> u64 {
    prog_runs(pid).iter().map(|p| p.run_cnt).sum()
}

/// Runs of `pid`'s programs of one type (`keep` true) or of every other type.
pub fn runs_of_type(pid: u32, prog_type: u64, keep: bool) -> u64 {
    prog_runs(pid)
        .iter()
        .filter(|p| (p.prog_type == prog_type) == keep)
        .map(|p| p.run_cnt)
        .sum()
}
