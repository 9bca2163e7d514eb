//! User-space side of the kernel programs: load the embedded object, hand the programs their
//! record offsets and watched ports, attach the tracepoints, drain aya-log into `tracing`, and
//! read the maps into plain samples. Dropping `KernelView` detaches everything.
//!
//! `KernelView` and the helpers every part shares live here; `load` loads the object and the
//! programs, `attach` says what is watched and attaches or detaches the programs, `read` reads
//! the maps.

pub mod answers;
mod attach;
pub mod btf;
mod load;
mod read;
mod sample;
#[cfg(test)]
mod tests;
pub mod tier;
pub mod tracefs;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{raw_trace_point::RawTracePointLinkId, trace_point::TracePointLinkId},
    Ebpf,
};
use health_common::{
    AcceptKey, AcceptStat, ConnState, LatencyHist, PortCounters, WatchKey, MAX_PORTS,
};

pub use load::NoSocketCalls;
pub use sample::{KernelSample, MapErrors, PortSample};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{0}")]
    Tracefs(String),
    #[error("loading the eBPF object failed: {0} (needs root or CAP_BPF+CAP_PERFMON, and a kernel with BTF)")]
    Load(#[source] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("map {name}: {detail}")]
    Map { name: &'static str, detail: String },
    #[error("too many watched ports (at most {MAX_PORTS})")]
    TooManyPorts,
}

/// The accept syscall tracepoints: (program, category, tracepoint). Loaded at start-up, attached
/// on demand (`web.accept_tracing`): while any syscall tracepoint is attached, every syscall of
/// every process on the host takes the kernel's tracing slow path.
const ACCEPT_PROGRAMS: [(&str, &str, &str); 4] = [
    ("sys_enter_accept4", "syscalls", "sys_enter_accept4"),
    ("sys_exit_accept4", "syscalls", "sys_exit_accept4"),
    ("sys_enter_accept", "syscalls", "sys_enter_accept"),
    ("sys_exit_accept", "syscalls", "sys_exit_accept"),
];

/// Raw tracepoints (program = tracepoint): every socket read and write passes them, and the raw
/// form skips building a trace record.
const RAW_PROGRAMS: [&str; 2] = ["sock_recv_length", "sock_send_length"];

/// The TCP state hook, in one of two forms: raw when the kernel's BTF gives the `struct sock`
/// offsets it needs, classic (record offsets from tracefs) otherwise.
const STATE_RAW: &str = "inet_sock_set_state_raw";
const STATE_CLASSIC: &str = "inet_sock_set_state";

/// Where the running kernel describes its own types.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

pub struct KernelView {
    /// What is watched, by counter slot.
    watched: Vec<WatchKey>,
    watched_map: HashMap<MapData, WatchKey, u32>,
    bitmap: Array<MapData, u64>,
    /// The programs read each connection's network namespace (BTF gave the offsets): keys
    /// carry the namespace's inode. Otherwise they say 0, any namespace.
    netns_keyed: bool,
    counters: PerCpuArray<MapData, PortCounters>,
    latency: PerCpuArray<MapData, LatencyHist>,
    conns: HashMap<MapData, u64, ConnState>,
    /// A second descriptor of the connection table, for batch reads (see `conn_entries`).
    conns_fd: Option<std::os::fd::OwnedFd>,
    /// Batch reads failed once (a kernel without them for this map type): entry by entry.
    conns_batch_failed: std::sync::atomic::AtomicBool,
    accepts: HashMap<MapData, AcceptKey, AcceptStat>,
    map_errors: PerCpuArray<MapData, u64>,
    log_task: Option<tokio::task::JoinHandle<()>>,
    /// The accept tracepoints' links while they are attached.
    accept_links: Vec<(&'static str, TracePointLinkId)>,
    /// The TCP state hook's form (`STATE_RAW` or `STATE_CLASSIC`), loaded at start-up.
    state_hook: &'static str,
    /// The TCP state and send/receive programs' links while they are attached.
    follow_links: Vec<FollowLink>,
    /// Set when the programs run in a slower form than they could, and why.
    pub note: Option<String>,
    /// The answer programs (status classes), or why they are not attached.
    answers: Result<answers::Answers, answers::AnswersError>,
    /// The socket-call tracepoints can attach (the `full` tier), or why not (`sock_diag`).
    socket_calls: Result<(), NoSocketCalls>,
    // Owns the programs and their links: dropping it detaches every tracepoint.
    ebpf: Ebpf,
}

/// A link of one of the programs that follow connections: the raw tracepoints, or the TCP state
/// hook in its classic form.
enum FollowLink {
    Raw(&'static str, RawTracePointLinkId),
    Classic(&'static str, TracePointLinkId),
}

impl Drop for KernelView {
    fn drop(&mut self) {
        if let Some(t) = self.log_task.take() {
            t.abort();
        }
        tracing::info!("kernel programs detached");
    }
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> KernelError {
    move |e| KernelError::Map {
        name,
        detail: e.to_string(),
    }
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(KernelError::Map {
        name,
        detail: "missing from the object".into(),
    })?;
    T::try_from(map).map_err(map_err(name))
}

/// The program `name` of the object, as its hook type.
fn typed<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, KernelError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(KernelError::Program {
            name,
            source: aya::programs::ProgramError::UnexpectedProgramType,
        })?
        .try_into()
        .map_err(|source| KernelError::Program { name, source })
}
