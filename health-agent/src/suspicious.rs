//! Suspicious processes for the incident report (never a 503: a miner does not make the web
//! backend fail, and a false positive must not take an instance out). The prior art's signals:
//! known crypto-miner names, and executables running from world-writable scratch space
//! (`/tmp`, `/var/tmp`, `/dev/shm`) — plus one that catches a renamed miner: a mining-pool URL
//! (`stratum+tcp://`) in the command line. Not flagged, on purpose: executables that exist
//! only in memory (`/memfd:…`) — runc and sandboxing tools run sealed memfd binaries, and a
//! false positive here turns every incident into a P1 — and executables deleted from disk
//! (every service after a package upgrade). Reads `/proc`; other users' `exe` links need root
//! (the agent's normal privilege), without it those processes are judged by name and command
//! line only.

use std::path::Path;

use serde::Serialize;

/// Known miners and the droppers that start them. A name matches when the process name, the
/// executable's file name or `argv[0]` equals one of these or starts with it followed by a
/// non-alphanumeric character (`xmrig-6.21`, `cpuminer-opt`), so `t-rex` does not match
/// `t-rexx` and nothing matches inside a longer word.
pub const MINER_NAMES: &[&str] = &[
    "xmrig",
    "xmr-stak",
    "minerd",
    "cpuminer",
    "cgminer",
    "bfgminer",
    "ccminer",
    "kdevtmpfsi",
    "kinsing",
    "ethminer",
    "nbminer",
    "t-rex",
    "lolminer",
    "phoenixminer",
    "nanominer",
    "teamredminer",
    "gminer",
    "srbminer",
    "bminer",
    "xmr-miner",
];

/// World-writable scratch directories no service should run its executable from.
pub const SCRATCH_DIRS: &[&str] = &["/tmp/", "/var/tmp/", "/dev/shm/"];

const DELETED: &str = " (deleted)";
const CMDLINE_LIMIT: usize = 240;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SuspiciousProcess {
    pub pid: u32,
    /// The kernel's process name (`comm`, at most 15 bytes).
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Arguments, with secret-looking values masked and the whole truncated.
    pub cmdline: String,
    pub reasons: Vec<String>,
}

/// Why a process looks suspicious, from what `/proc` says about it; empty when it does not.
/// `exe` is the raw `readlink /proc/<pid>/exe` (it may end in " (deleted)").
pub fn classify(name: &str, exe: Option<&str>, args: &[String]) -> Vec<String> {
    let mut reasons = Vec::new();
    let exe_path = exe.map(|e| e.strip_suffix(DELETED).unwrap_or(e));
    let deleted = exe.is_some_and(|e| e.ends_with(DELETED));
    let candidates = [
        Some(name),
        exe_path.and_then(file_name),
        args.first().and_then(|a| file_name(a)),
    ];
    if let Some(miner) = candidates.into_iter().flatten().find_map(miner_name) {
        reasons.push(format!("known crypto-miner name `{miner}`"));
    }
    if let Some(path) = exe_path {
        if let Some(dir) = SCRATCH_DIRS.iter().find(|d| path.starts_with(**d)) {
            reasons.push(format!(
                "executable runs from {}{}",
                dir.trim_end_matches('/'),
                if deleted {
                    " and was deleted from disk"
                } else {
                    ""
                }
            ));
        }
    }
    if args.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        a.contains("stratum+tcp://") || a.contains("stratum+ssl://") || a.contains("stratum2+")
    }) {
        reasons.push("mining-pool URL (stratum) in its command line".into());
    }
    reasons
}

fn file_name(path: &str) -> Option<&str> {
    Path::new(path).file_name().and_then(|n| n.to_str())
}

/// The miner `name` is, if any (see `MINER_NAMES` for the matching rule).
pub fn miner_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    MINER_NAMES.iter().copied().find(|m| {
        lower
            .strip_prefix(m)
            .is_some_and(|rest| rest.chars().next().is_none_or(|c| !c.is_alphanumeric()))
    })
}

/// Masks values that look like credentials: `--password=x`, `--token x`, URL user info.
/// Command lines end up in a GitHub issue; they must not carry the host's secrets there.
pub fn mask_args(args: &[String]) -> Vec<String> {
    const WORDS: &[&str] = &["pass", "token", "secret", "key", "auth", "cred"];
    let secretish = |k: &str| {
        let k = k.to_ascii_lowercase();
        WORDS.iter().any(|w| k.contains(w))
    };
    let mut out = Vec::with_capacity(args.len());
    let mut mask_next = false;
    for a in args {
        if mask_next {
            out.push("***".to_string());
            mask_next = false;
            continue;
        }
        if let Some((k, _)) = a.split_once('=') {
            if secretish(k) && !k.contains("://") {
                out.push(format!("{k}=***"));
                continue;
            }
        }
        if a.starts_with('-') && !a.contains('=') && secretish(a) {
            mask_next = true;
        }
        out.push(mask_userinfo(a));
    }
    out
}

/// `scheme://user:password@host` → `scheme://user:***@host`.
fn mask_userinfo(a: &str) -> String {
    let Some(scheme_end) = a.find("://") else {
        return a.to_string();
    };
    let rest = &a[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return a.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &a[..scheme_end + 3], &rest[at..]),
        None => a.to_string(),
    }
}

fn truncate(mut s: String, limit: usize) -> String {
    if s.len() > limit {
        s.truncate(crate::text::cut(&s, limit).len());
        s.push('…');
    }
    s
}

/// Reads `/proc/<pid>/cmdline` as arguments (empty for kernel threads and vanished processes).
pub fn read_args(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every numeric entry of `/proc`.
pub fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Scans every process. Blocking (reads `/proc`): call from a blocking task.
/// Held by tests that run a fake miner, and by tests whose expectations depend on what a scan
/// finds: one never sees the other's miner.
#[cfg(test)]
pub(crate) static FAKE_MINERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn scan() -> Vec<SuspiciousProcess> {
    pids().into_iter().filter_map(inspect).collect()
}

/// One process, if it looks suspicious.
pub fn inspect(pid: u32) -> Option<SuspiciousProcess> {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let name = name.trim_end().to_string();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let args = read_args(pid);
    let reasons = classify(&name, exe.as_deref(), &args);
    if reasons.is_empty() {
        return None;
    }
    Some(SuspiciousProcess {
        pid,
        name,
        exe,
        cmdline: truncate(mask_args(&args).join(" "), CMDLINE_LIMIT),
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn miner_names_match_whole_words_only() {
        assert_eq!(miner_name("xmrig"), Some("xmrig"));
        assert_eq!(miner_name("XMRig-6.21.0"), Some("xmrig"));
        assert_eq!(miner_name("cpuminer-opt"), Some("cpuminer"));
        assert_eq!(miner_name("kdevtmpfsi"), Some("kdevtmpfsi"));
        assert_eq!(miner_name("t-rex"), Some("t-rex"));
        assert_eq!(miner_name("t-rexx"), None);
        assert_eq!(
            miner_name("kdevtmpfs"),
            None,
            "the kernel thread it imitates"
        );
        assert_eq!(miner_name("postgres"), None);
        assert_eq!(miner_name("myxmrig"), None);
    }

    #[test]
    fn classify_reads_every_signal() {
        assert!(classify("puma", Some("/usr/bin/ruby"), &args(&["puma"])).is_empty());
        let r = classify("kworker", Some("/tmp/.x/kworker"), &args(&["kworker"]));
        assert_eq!(r, vec!["executable runs from /tmp"]);
        let r = classify("a", Some("/dev/shm/a (deleted)"), &[]);
        assert_eq!(
            r,
            vec!["executable runs from /dev/shm and was deleted from disk"]
        );
        let r = classify(
            "systemd-helper",
            Some("/usr/local/bin/systemd-helper"),
            &args(&["systemd-helper", "-o", "stratum+tcp://pool:3333"]),
        );
        assert!(r[0].contains("stratum"), "{r:?}");
        let r = classify("sh", Some("/var/tmp/xmrig"), &args(&["/var/tmp/xmrig"]));
        assert_eq!(r.len(), 2, "{r:?}");
        // An upgraded package leaves services on a deleted binary, runc runs a sealed memfd
        // copy of itself: neither is suspicious by itself.
        assert!(classify("nginx", Some("/usr/sbin/nginx (deleted)"), &[]).is_empty());
        assert!(classify(
            "runc",
            Some("/memfd:runc_cloned:/proc/self/exe (deleted)"),
            &[]
        )
        .is_empty());
    }

    #[test]
    fn mask_args_hides_credentials() {
        let masked = mask_args(&args(&[
            "app",
            "--password=hunter2",
            "--api-token",
            "abc123",
            "DB_URL=postgres://u:pw@db/x",
            "postgres://admin:s3cret@10.0.0.1:5432/app",
            "--port=80",
        ]))
        .join(" ");
        for s in ["hunter2", "abc123", "s3cret", ":pw@"] {
            assert!(!masked.contains(s), "{s} leaked: {masked}");
        }
        assert!(masked.contains("--port=80") && masked.contains("admin:***@10.0.0.1"));
    }

    /// Kills and removes the fake miner even when an assertion fails.
    struct FakeMiner {
        child: std::process::Child,
        path: std::path::PathBuf,
    }

    impl Drop for FakeMiner {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn spawn_copy_of_sleep(path: &std::path::Path) -> std::process::Child {
        std::fs::copy("/bin/sleep", path).expect("copy /bin/sleep into /tmp");
        // Another test thread forking while the copy's write descriptor was open can leave it
        // open in that child for a moment: exec then fails with ETXTBSY. Retry briefly.
        for _ in 0..50 {
            match std::process::Command::new(path).arg("30").spawn() {
                Ok(c) => return c,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("cannot run {}: {e}", path.display()),
            }
        }
        panic!("{} stayed busy", path.display());
    }

    #[test]
    fn scan_finds_a_miner_running_from_tmp() {
        let _only_miner = super::FAKE_MINERS.lock().unwrap_or_else(|e| e.into_inner());
        let path = std::path::PathBuf::from(format!("/tmp/xmrig-test-{}", std::process::id()));
        let child = spawn_copy_of_sleep(&path);
        let miner = FakeMiner { child, path };
        let pid = miner.child.id();
        let found = scan();
        let p = found
            .iter()
            .find(|p| p.pid == pid)
            .unwrap_or_else(|| panic!("pid {pid} not reported: {found:?}"));
        assert!(
            p.reasons.iter().any(|r| r.contains("`xmrig`")),
            "{:?}",
            p.reasons
        );
        assert!(
            p.reasons.iter().any(|r| r.contains("/tmp")),
            "{:?}",
            p.reasons
        );
        assert_eq!(p.exe.as_deref(), Some(miner.path.to_str().unwrap()));
        assert!(p.cmdline.ends_with(" 30"), "{}", p.cmdline);
        // This test process is suspicious exactly when it runs from a temp dir itself (a
        // checkout under /tmp, as CI may use): the scan must not flag it otherwise.
        let me = std::env::current_exe().unwrap();
        let from_tmp = ["/tmp/", "/var/tmp/", "/dev/shm/"]
            .iter()
            .any(|d| me.starts_with(d));
        assert_eq!(
            found.iter().any(|p| p.pid == std::process::id()),
            from_tmp,
            "{me:?}: {found:?}"
        );
        drop(miner);
        assert!(inspect(pid).is_none(), "killed process still reported");
    }
}
