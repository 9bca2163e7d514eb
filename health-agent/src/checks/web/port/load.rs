//! Loading the kernel view in the tier this kernel and the config allow, and what the report
//! says about it.

use super::*;
use crate::{
    checks::web::{Following, KernelState},
    config::{AcceptTracing, SocketTracing},
};

/// Loads the kernel programs when `cfg` asks for them, in the highest tier the kernel offers
/// (or the one `web.kernel_tier` forces). A failure is not fatal: the monitor then decides from
/// sock_diag, /proc and the probe (the `no_ebpf` tier), and its report says why.
pub fn load_kernel(cfg: &WebConfig) -> (Option<KernelView>, KernelStatus) {
    if cfg.port == 0 {
        let status = KernelStatus {
            state: KernelState::Disabled,
            reason: Some("no web port configured".into()),
            following: None,
            tier: None,
            missing: Vec::new(),
        };
        return (None, status);
    }
    let no_ebpf = |state, why: String| {
        let status = KernelStatus {
            state,
            reason: Some(format!("{why}; sock_diag, /proc and the probe decide")),
            following: None,
            tier: Some(KernelTier::NoEbpf),
            missing: vec![
                format!("eBPF: {why}"),
                "the answers' status classes (erroring)".into(),
            ],
        };
        (None, status)
    };
    if !cfg.kernel {
        return no_ebpf(KernelState::Disabled, "web.kernel = false".into());
    }
    if cfg.kernel_tier == KernelTier::NoEbpf {
        return no_ebpf(
            KernelState::Disabled,
            "web.kernel_tier = \"no_ebpf\"".into(),
        );
    }
    // Said before loading: without privilege the first step that fails is reading tracefs
    // (root's alone), which would blame tracefs rather than the privilege.
    if let Some(why) = crate::ebpf::tier::no_privilege() {
        tracing::warn!("kernel view unavailable: {why}; tier no_ebpf");
        return no_ebpf(KernelState::Unavailable, why.into());
    }
    let always = cfg.accept_tracing == AcceptTracing::Always;
    let follow = cfg.socket_tracing == SocketTracing::Always;
    let socket_calls = cfg.kernel_tier != KernelTier::SockDiag;
    match KernelView::load(cfg.max_connections_tracked, always, follow, socket_calls) {
        Ok(mut k) => {
            let mut missing = Vec::new();
            let tier = match k.socket_calls_missing() {
                None => KernelTier::Full,
                Some(why) => {
                    missing.push(format!(
                        "the socket-call tracepoints: {why}; sock_diag reads the port's \
                         connections every evaluation instead (no per-exchange counts, no \
                         latency histogram)"
                    ));
                    KernelTier::SockDiag
                }
            };
            if tier == KernelTier::SockDiag {
                // Every segment sent is the evidence of answers going out there.
                k.count_segments_sent();
            }
            if cfg.kernel_tier == KernelTier::Full && tier != KernelTier::Full {
                tracing::warn!(
                    "web.kernel_tier = \"full\" asked for, but this kernel has no socket-call \
                     tracepoints: running the sock_diag tier"
                );
            }
            if let Some(why) = k.answers_unavailable() {
                missing.push(format!("{}: {why}", crate::ebpf::tier::ANSWERS_MISSING));
            }
            let following = (tier == KernelTier::Full).then(|| Following {
                mode: cfg.socket_tracing,
                attached: follow,
                why: if follow {
                    "web.socket_tracing = \"always\"".to_string()
                } else {
                    "nothing suspicious yet: sock_diag reads the port's connections".to_string()
                },
                connections: None,
                quiet_read_every_ms: None,
            });
            tracing::info!(
                "kernel view: tier {}{}",
                tier.as_str(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(" (without {})", missing.join("; "))
                }
            );
            let status = KernelStatus {
                state: KernelState::Active,
                reason: k.note.clone(),
                following,
                tier: Some(tier),
                missing,
            };
            (Some(k), status)
        }
        Err(e) => {
            tracing::warn!("kernel view unavailable: {e}; tier no_ebpf");
            no_ebpf(KernelState::Unavailable, e.to_string())
        }
    }
}
