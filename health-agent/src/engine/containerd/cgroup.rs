//! A task's CPU and memory from its cgroup, v2 (unified) or v1 (one hierarchy per controller,
//! as hosts on a hybrid layout still run containers), found from `/proc/PID/cgroup`.

use std::path::Path;

/// What the cgroup says now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub memory_bytes: Option<u64>,
    /// None when unlimited.
    pub memory_limit: Option<u64>,
    /// CPU time used since the cgroup was made, in µs.
    pub cpu_usec: Option<u64>,
}

/// Above this a v1 limit means "no limit" (the kernel reports a page-rounded i64::MAX).
const V1_UNLIMITED: u64 = 1 << 62;

/// Reads `pid`'s cgroup under /sys/fs/cgroup.
pub fn of_pid(pid: u32) -> Sample {
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(text) => read(Path::new("/sys/fs/cgroup"), &text),
        Err(_) => Sample::default(),
    }
}

/// Reads the cgroup `proc_cgroup` (a `/proc/PID/cgroup`) names, with the hierarchies mounted
/// under `root`: the unified one when `root` is cgroup2 itself, else the v1 `memory` and
/// `cpuacct` hierarchies (mounted under their controller list, e.g. `cpu,cpuacct`).
pub fn read(root: &Path, proc_cgroup: &str) -> Sample {
    let number = |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let lines = proc_cgroup.lines().filter_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        Some((controllers, path.trim_start_matches('/')))
    });
    if root.join("cgroup.controllers").exists() {
        let Some((_, path)) = lines.clone().find(|(c, _)| c.is_empty()) else {
            return Sample::default();
        };
        let dir = root.join(path);
        let cpu_usec = std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
            });
        return Sample {
            memory_bytes: number(&dir.join("memory.current")),
            memory_limit: number(&dir.join("memory.max")),
            cpu_usec,
        };
    }
    let mut sample = Sample::default();
    for (controllers, path) in lines {
        let dir = root.join(controllers).join(path);
        let has = |c: &str| controllers.split(',').any(|x| x == c);
        if has("memory") {
            sample.memory_bytes = number(&dir.join("memory.usage_in_bytes"));
            sample.memory_limit =
                number(&dir.join("memory.limit_in_bytes")).filter(|&l| l < V1_UNLIMITED);
        }
        if has("cpuacct") {
            sample.cpu_usec = number(&dir.join("cpuacct.usage")).map(|ns| ns / 1000);
        }
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn unified_cgroup_v2() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cgroup.controllers", "cpu memory pids\n");
        write(r, "k8s.io/web/memory.current", "5242880\n");
        write(r, "k8s.io/web/memory.max", "max\n");
        write(
            r,
            "k8s.io/web/cpu.stat",
            "usage_usec 1500\nuser_usec 1000\n",
        );
        assert_eq!(
            read(r, "0::/k8s.io/web\n"),
            Sample {
                memory_bytes: Some(5_242_880),
                memory_limit: None,
                cpu_usec: Some(1500),
            }
        );
    }

    #[test]
    fn v1_hierarchies_by_controller_including_a_combined_one() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "memory/k8s.io/web/memory.usage_in_bytes", "1048576\n");
        write(
            r,
            "memory/k8s.io/web/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(r, "cpu,cpuacct/k8s.io/web/cpuacct.usage", "2500000\n");
        let proc_cgroup = "12:memory:/k8s.io/web\n3:cpu,cpuacct:/k8s.io/web\n0::/k8s.io/web\n";
        assert_eq!(
            read(r, proc_cgroup),
            Sample {
                memory_bytes: Some(1_048_576),
                memory_limit: None,
                cpu_usec: Some(2500),
            }
        );
        write(r, "memory/k8s.io/web/memory.limit_in_bytes", "4194304\n");
        assert_eq!(read(r, proc_cgroup).memory_limit, Some(4_194_304));
    }

    #[test]
    fn nothing_readable_is_nothing_known() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(read(root.path(), "0::/gone\n"), Sample::default());
        assert_eq!(read(root.path(), "garbage"), Sample::default());
    }
}
