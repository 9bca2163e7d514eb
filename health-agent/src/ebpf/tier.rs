//! Which tier of the kernel view this kernel offers, told without loading anything: what
//! `health-agent check` says at once, and what `serve` then finds by loading the programs.

use std::path::Path;

use crate::config::{KernelTier, WebConfig};

/// Linux capability numbers (`linux/capability.h`).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The tier `serve` would run with `cfg` on this kernel, and what it lacks against `full`
/// (None: no web port, nothing to watch).
pub fn offered(cfg: &WebConfig) -> Option<(KernelTier, Vec<String>)> {
    if cfg.port == 0 {
        return None;
    }
    let none = |why: String| Some((KernelTier::NoEbpf, vec![format!("eBPF: {why}")]));
    if !cfg.kernel {
        return none("web.kernel = false".into());
    }
    if cfg.kernel_tier == KernelTier::NoEbpf {
        return none("web.kernel_tier = \"no_ebpf\"".into());
    }
    let btf = match std::fs::read(super::VMLINUX_BTF) {
        Ok(b) => b,
        Err(e) => return none(format!("no kernel BTF ({}: {e})", super::VMLINUX_BTF)),
    };
    if let Some(why) = no_privilege() {
        return none(why.into());
    }
    let (tier, mut missing) = if cfg.kernel_tier == KernelTier::SockDiag {
        (
            KernelTier::SockDiag,
            vec!["the socket-call tracepoints: web.kernel_tier = \"sock_diag\"".into()],
        )
    // A raw tracepoint shows in the kernel's BTF as the typedef `btf_trace_<name>`.
    } else if contains(&btf, b"btf_trace_sock_send_length\0") {
        (KernelTier::Full, Vec::new())
    } else {
        (
            KernelTier::SockDiag,
            vec![
                "the socket-call tracepoints: no sock_send_length (it arrived in Linux 6.3)".into(),
            ],
        )
    };
    if no_net_admin() {
        missing.push(format!("{ANSWERS_MISSING}: {NO_NET_ADMIN}"));
    }
    Some((tier, missing))
}

/// How `details.web.kernel.missing` names the answers' status classes when it lacks them.
pub const ANSWERS_MISSING: &str = "the answers' status classes (erroring)";

/// Why the answer programs do not count without CAP_NET_ADMIN (`no_net_admin`).
pub const NO_NET_ADMIN: &str = "no CAP_NET_ADMIN: the answer programs (cgroup-skb) attach only \
    with CAP_NET_ADMIN or CAP_SYS_ADMIN, so the status of the backend's answers is not seen and \
    it is never `erroring`: add CAP_NET_ADMIN to the agent's capabilities";

/// Whether this process lacks what attaches the answer programs (cgroup-skb): CAP_NET_ADMIN
/// or CAP_SYS_ADMIN. They load without it, and then fail at every attach.
pub fn no_net_admin() -> bool {
    lacks_net_admin(Path::new("/proc/self/status"))
}

fn lacks_net_admin(status: &Path) -> bool {
    effective(status).is_some_and(|e| e & ((1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)) == 0)
}

/// Why this process cannot load eBPF programs (its effective capabilities lack them), or None.
/// `check`, the first log line and `serve`'s kernel status all say this one reason.
pub fn no_privilege() -> Option<&'static str> {
    (!privileged(Path::new("/proc/self/status")))
        .then_some("no privilege (needs root, or CAP_BPF and CAP_PERFMON)")
}

/// Whether the effective capabilities in a `/proc/PID/status` file load eBPF programs.
fn privileged(status: &Path) -> bool {
    let has = |eff: u64, cap: u32| eff & (1 << cap) != 0;
    effective(status)
        .is_some_and(|e| has(e, CAP_SYS_ADMIN) || (has(e, CAP_BPF) && has(e, CAP_PERFMON)))
}

/// The effective capabilities in a `/proc/PID/status` file.
fn effective(status: &Path) -> Option<u64> {
    std::fs::read_to_string(status).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privilege_is_sys_admin_or_bpf_with_perfmon() {
        let dir = tempfile::tempdir().unwrap();
        let at = |eff: u64| {
            let p = dir.path().join(format!("s{eff:x}"));
            std::fs::write(&p, format!("Name:\tx\nCapEff:\t{eff:016x}\n")).unwrap();
            privileged(&p)
        };
        assert!(at(1 << CAP_SYS_ADMIN));
        assert!(at((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!at(1 << CAP_BPF));
        assert!(!at(0));
        assert!(!privileged(&dir.path().join("missing")));
    }

    #[test]
    fn the_answer_programs_need_net_admin_or_sys_admin() {
        let dir = tempfile::tempdir().unwrap();
        let lacks = |eff: u64| {
            let p = dir.path().join(format!("s{eff:x}"));
            std::fs::write(&p, format!("Name:\tx\nCapEff:\t{eff:016x}\n")).unwrap();
            lacks_net_admin(&p)
        };
        let bpf = (1 << CAP_BPF) | (1 << CAP_PERFMON);
        assert!(
            lacks(bpf | (1 << 19)),
            "the sidecars' set: BPF, PERFMON, SYS_PTRACE"
        );
        assert!(!lacks(bpf | (1 << CAP_NET_ADMIN)));
        assert!(!lacks(bpf | (1 << CAP_SYS_ADMIN)));
    }

    #[test]
    fn no_port_no_tier_and_forced_tiers_are_said() {
        let cfg = WebConfig::default();
        assert_eq!(offered(&cfg), None);
        let cfg = WebConfig {
            port: 9000,
            kernel: false,
            ..WebConfig::default()
        };
        let (tier, missing) = offered(&cfg).unwrap();
        assert_eq!(tier, KernelTier::NoEbpf);
        assert!(missing[0].contains("web.kernel = false"), "{missing:?}");
    }
}
