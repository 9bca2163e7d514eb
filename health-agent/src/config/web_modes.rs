//! The `[web]` section's modes: how much of the kernel view the agent uses, when its programs
//! are attached, and how the probe speaks to the backend.

use serde::{Deserialize, Serialize};

/// When the accept()/accept4() syscall tracepoints are attached. Any syscall tracepoint sends
/// every syscall of every process on the host through the kernel's tracing slow path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptTracing {
    /// Only while a connection has waited unclaimed in the accept queue (a suspected hang)
    /// and for a while after; otherwise claims seen by the send/receive hooks show progress.
    OnStall,
    /// All the time: exact accept counts, at a cost to every syscall on the host.
    Always,
}

/// When the per-connection and per-call programs (TCP state changes, every socket send and
/// receive on the host) are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketTracing {
    /// Only while the backend's connections look wrong (one waits unclaimed, a request sits
    /// unread or unanswered, the probe fails) and for 30 s after; meanwhile sock_diag reads the
    /// port's connections every evaluation and the programs cost the host nothing.
    OnSuspicion,
    /// All the time: every exchange counted and the latency histogram always filled, at a
    /// cost on every socket call of the host.
    Always,
}

/// How much of the kernel view the agent uses: what the running kernel offers (`auto`), or a
/// tier forced lower, to see how the judgement holds where a kernel offers less.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelTier {
    /// The highest the kernel offers: `full` on 6.3+, `sock_diag` before, `no_ebpf` without
    /// privilege or BTF.
    Auto,
    /// Every program: the socket-call tracepoints (6.3+) count each exchange and its latency.
    Full,
    /// eBPF without the socket-call tracepoints (Linux 5.10–6.2): the answers' status classes
    /// and segments sent (cgroup-skb), the accept tracepoints on demand, and sock_diag reading
    /// the port's connections every evaluation.
    SockDiag,
    /// No eBPF: sock_diag and /proc alone (and the probe).
    NoEbpf,
}

impl KernelTier {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Full => "full",
            Self::SockDiag => "sock_diag",
            Self::NoEbpf => "no_ebpf",
        }
    }
}

/// How the probe speaks to the backend's port: what the port itself serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeScheme {
    /// Plain HTTP/1.1.
    #[default]
    Http,
    /// HTTP/1.1 over TLS: a backend that serves only TLS on its port.
    Https,
}

impl ProbeScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}
