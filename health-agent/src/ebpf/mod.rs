//! User-space side of the kernel programs: load the embedded object, hand the programs their
//! record offsets and watched ports, attach the tracepoints, drain aya-log into `tracing`, and
//! read the maps into plain samples. Dropping `KernelView` detaches everything.

pub mod answers;
mod batch;
pub mod btf;
mod sample;
#[cfg(test)]
mod tests;
pub mod tier;
pub mod tracefs;

use std::time::Duration;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuValues},
    programs::{
        raw_trace_point::RawTracePointLinkId, trace_point::TracePointLinkId, RawTracePoint,
        TracePoint,
    },
    Ebpf, EbpfLoader,
};
use health_common::{
    maps, port_bit, AcceptKey, AcceptStat, ConnState, LatencyHist, MapErrorKind, PortCounters,
    TracepointOffsets, WatchKey, MAX_PORTS,
};
use tokio::io::unix::AsyncFd;

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

/// The program `name` of the object, loaded into the kernel and ready to attach.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, KernelError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    P: LoadProgram + 'a,
{
    let program: &mut P = typed(ebpf, name)?;
    program
        .load_program()
        .map_err(|source| KernelError::Program { name, source })?;
    Ok(program)
}

/// aya's program types each have their own `load`; this names the one both hook kinds share.
trait LoadProgram {
    fn load_program(&mut self) -> Result<(), aya::programs::ProgramError>;
}

impl LoadProgram for TracePoint {
    fn load_program(&mut self) -> Result<(), aya::programs::ProgramError> {
        self.load()
    }
}

impl LoadProgram for RawTracePoint {
    fn load_program(&mut self) -> Result<(), aya::programs::ProgramError> {
        self.load()
    }
}

/// Why the socket-call tracepoints are not used (the `sock_diag` tier).
#[derive(Debug, thiserror::Error)]
pub enum NoSocketCalls {
    #[error("no {name} tracepoint (it arrived in Linux 6.3): {source}")]
    Missing {
        name: &'static str,
        source: KernelError,
    },
    #[error("web.kernel_tier = \"sock_diag\" leaves them out")]
    LeftOut,
}

/// Whether the kernel has the socket-call tracepoints (`sock_{send,recv}_length`, Linux 6.3),
/// or why not.
fn socket_calls(root: &std::path::Path) -> Result<(), NoSocketCalls> {
    for name in RAW_PROGRAMS {
        tracefs::Format::read(root, "sock", name)
            .map_err(|source| NoSocketCalls::Missing { name, source })?;
    }
    Ok(())
}

/// Reads the record offsets of every tracepoint the programs use.
fn read_offsets(root: &std::path::Path) -> Result<TracepointOffsets, KernelError> {
    use tracefs::Format;
    let state = Format::read(root, "sock", "inet_sock_set_state")?;
    let enter = Format::read(root, "syscalls", "sys_enter_accept4")?;
    let exit = Format::read(root, "syscalls", "sys_exit_accept4")?;
    // The plain accept pair must share the accept4 layout: one offset serves both.
    let enter_plain = Format::read(root, "syscalls", "sys_enter_accept")?;
    let exit_plain = Format::read(root, "syscalls", "sys_exit_accept")?;
    let accept_enter_fd = enter.offset("fd", 8)?;
    let accept_exit_ret = exit.offset("ret", 8)?;
    if enter_plain.offset("fd", 8)? != accept_enter_fd
        || exit_plain.offset("ret", 8)? != accept_exit_ret
    {
        return Err(KernelError::Tracefs(
            "sys_enter_accept and sys_enter_accept4 record layouts differ".into(),
        ));
    }
    Ok(TracepointOffsets {
        state_skaddr: state.offset("skaddr", 8)?,
        state_oldstate: state.offset("oldstate", 4)?,
        state_newstate: state.offset("newstate", 4)?,
        state_sport: state.offset("sport", 2)?,
        state_protocol: state.offset("protocol", 2)?,
        accept_enter_fd,
        accept_exit_ret,
        ready: 1,
        ..TracepointOffsets::default()
    })
}

/// The compiled kernel programs, built by build.rs from `health-agent-ebpf`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/health-agent"));

impl KernelView {
    /// Loads and attaches the programs, watching nothing until `watch` says what. Must run
    /// inside a tokio runtime (the aya-log drain is a task).
    /// `follow`: attach the TCP state and send/receive programs now (else `follow` later).
    /// `socket_calls`: use the socket-call tracepoints where the kernel has them (false: the
    /// `sock_diag` tier, forced).
    pub fn load(
        max_conns: u32,
        watch_accepts: bool,
        follow: bool,
        socket_calls: bool,
    ) -> Result<Self, KernelError> {
        let root = tracefs::ensure_mounted()?;
        let mut offsets = read_offsets(&root)?;
        let socket_calls = if socket_calls {
            self::socket_calls(&root)
        } else {
            Err(NoSocketCalls::LeftOut)
        };
        let follow = follow && socket_calls.is_ok();
        raise_memlock_limit();

        let mut ebpf = EbpfLoader::new()
            // The object has no CO-RE relocations (Rust eBPF emits none): aya's copy of the
            // kernel's BTF can go now rather than after loading, which lowers the start-up peak.
            .btf(None)
            .map_max_entries(maps::CONNS, max_conns)
            .load(OBJECT)
            .map_err(KernelError::Load)?;

        let log_task = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => drain_logs(logger),
            Err(e) => {
                tracing::warn!(
                    "eBPF log channel unavailable, kernel-side warnings will not show: {e}"
                );
                None
            }
        };

        // Read after aya is done with its own BTF parsing, so the two never share the heap.
        let note = match btf::sock_offsets(std::path::Path::new(VMLINUX_BTF)) {
            Ok(sock) => {
                offsets.sock_num = sock.num;
                offsets.sock_protocol = sock.protocol;
                offsets.sock_known = 1;
                match sock.net {
                    Ok((sock_net, net_inum)) => {
                        offsets.sock_net = sock_net;
                        offsets.net_inum = net_inum;
                        offsets.net_known = 1;
                        None
                    }
                    Err(e) => {
                        let note = format!(
                            "network namespace offsets unavailable ({e}): the watched port is \
                             matched in every namespace"
                        );
                        tracing::warn!("{note}");
                        Some(note)
                    }
                }
            }
            Err(e) => {
                let note = format!(
                    "struct sock offsets unavailable ({e}): TCP state changes use the classic \
                     tracepoint and socket reads/writes skip the port pre-filter, which costs \
                     the backend more"
                );
                tracing::warn!("{note}");
                Some(note)
            }
        };
        let mut offsets_map: Array<MapData, TracepointOffsets> = take(&mut ebpf, maps::OFFSETS)?;
        offsets_map
            .set(0, offsets, 0)
            .map_err(map_err(maps::OFFSETS))?;
        let watched_map = take(&mut ebpf, maps::WATCHED_PORTS)?;
        let bitmap = take(&mut ebpf, maps::PORT_BITMAP)?;
        let netns_keyed = offsets.net_known == 1;
        let counters = take(&mut ebpf, maps::PORT_COUNTERS)?;
        let latency = take(&mut ebpf, maps::LATENCY)?;
        let conns_fd = match ebpf.map(maps::CONNS) {
            Some(aya::maps::Map::LruHashMap(d) | aya::maps::Map::HashMap(d)) => {
                use std::os::fd::AsFd;
                d.fd().as_fd().try_clone_to_owned().ok()
            }
            _ => None,
        };
        let conns = take(&mut ebpf, maps::CONNS)?;
        let accepts = take(&mut ebpf, maps::ACCEPTS)?;
        let map_errors = take(&mut ebpf, maps::MAP_ERRORS)?;

        for (name, _, _) in ACCEPT_PROGRAMS {
            program::<TracePoint>(&mut ebpf, name)?;
        }
        for name in RAW_PROGRAMS {
            program::<RawTracePoint>(&mut ebpf, name)?;
        }
        let state_hook = if offsets.sock_known == 1 {
            program::<RawTracePoint>(&mut ebpf, STATE_RAW)?;
            STATE_RAW
        } else {
            program::<TracePoint>(&mut ebpf, STATE_CLASSIC)?;
            STATE_CLASSIC
        };
        tracing::info!(
            max_conns,
            "kernel programs loaded (inet_sock_set_state {}, {} raw tracepoints for send/recv: {}; \
             accept tracepoints {})",
            if state_hook == STATE_RAW { "raw" } else { "classic" },
            RAW_PROGRAMS.len(),
            if follow { "attached" } else { "attached on suspicion" },
            if watch_accepts {
                "attached"
            } else {
                "on demand"
            }
        );
        let answers = answers::Answers::load(&mut ebpf, follow || socket_calls.is_err());
        match &answers {
            Ok(a) if a.attached() => tracing::info!("answer programs attached"),
            Ok(_) => tracing::info!("answer programs loaded, attached on demand"),
            Err(e) => tracing::warn!("answers' status classes not visible: {e}"),
        }
        // The offsets map stays referenced by the loaded programs; our handle can go.
        drop(offsets_map);
        let mut view = Self {
            watched: Vec::new(),
            watched_map,
            bitmap,
            netns_keyed,
            counters,
            latency,
            conns,
            conns_fd,
            conns_batch_failed: std::sync::atomic::AtomicBool::new(false),
            accepts,
            map_errors,
            log_task,
            accept_links: Vec::new(),
            state_hook,
            follow_links: Vec::new(),
            note,
            answers,
            socket_calls,
            ebpf,
        };
        if follow {
            view.follow(true)?;
        }
        if watch_accepts {
            view.watch_accepts(true)?;
        }
        Ok(view)
    }

    /// Watches `ports`, each a listen port in the network namespace with inode `netns`, instead
    /// of whatever was watched before (a restarted container has a new namespace). Slots follow
    /// the order given; counters of a slot carry on.
    pub fn watch(&mut self, ports: &[(u64, u16)]) -> Result<(), KernelError> {
        if ports.len() > MAX_PORTS as usize {
            return Err(KernelError::TooManyPorts);
        }
        let keys: Vec<WatchKey> = ports
            .iter()
            .map(|&(netns, port)| {
                // Namespace inodes are 32-bit in the kernel (`ns.inum`).
                WatchKey::new(if self.netns_keyed { netns as u32 } else { 0 }, port)
            })
            .collect();
        if keys == self.watched {
            return Ok(());
        }
        for old in std::mem::take(&mut self.watched) {
            let _ = self.watched_map.remove(&old);
            let (word, _) = port_bit(old.port);
            self.bitmap
                .set(word, 0, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
        }
        for (key, slot) in keys.iter().zip(0u32..) {
            self.watched_map
                .insert(key, slot, 0)
                .map_err(map_err(maps::WATCHED_PORTS))?;
            let (word, mask) = port_bit(key.port);
            let bits = self
                .bitmap
                .get(&word, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
            self.bitmap
                .set(word, bits | mask, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
        }
        let watched: Vec<String> = keys
            .iter()
            .map(|k| match k.netns {
                0 => format!("port {} in any namespace", k.port),
                ns => format!("port {} in namespace inode {ns}", k.port),
            })
            .collect();
        tracing::info!("kernel programs watch {}", watched.join(", "));
        self.watched = keys;
        Ok(())
    }

    /// Why the answers' status classes are not visible, when they are not.
    pub fn answers_unavailable(&self) -> Option<&answers::AnswersError> {
        self.answers.as_ref().err()
    }

    /// What `port` answered since the programs loaded, by status class (every namespace it
    /// is watched in), or why that is not visible.
    pub fn answer_counters(
        &self,
        port: u16,
    ) -> Result<health_common::AnswerCounters, answers::AnswersError> {
        let a = self.answers.as_ref().map_err(Clone::clone)?;
        let mut sum = health_common::AnswerCounters::default();
        for (slot, key) in (0u32..).zip(&self.watched) {
            if key.port == port {
                sum.add(&a.counters(slot));
            }
        }
        Ok(sum)
    }

    /// Whether the answer programs are attached now.
    pub fn answers_attached(&self) -> bool {
        self.answers.as_ref().is_ok_and(answers::Answers::attached)
    }

    /// Attaches or detaches the answer programs (sampling windows with `on_suspicion`).
    pub fn attach_answers(&mut self, on: bool) -> Result<(), answers::AnswersError> {
        match self.answers.as_mut() {
            Ok(a) => a.attach(&mut self.ebpf, on),
            Err(e) => Err(e.clone()),
        }
    }

    /// Tells the answer programs to count every segment sent (the `sock_diag` tier).
    pub fn count_segments_sent(&mut self) {
        if let Ok(a) = self.answers.as_mut() {
            if let Err(e) = a.count_sent(true) {
                tracing::warn!("segments sent will not be counted: {e}");
            }
        }
    }

    /// Tells the answer programs the probe path: its requests are not real traffic.
    pub fn set_probe_path(&mut self, path: &str) {
        if let Ok(a) = self.answers.as_mut() {
            if let Err(e) = a.set_probe_path(path) {
                tracing::warn!("the probe's requests will count as real traffic: {e}");
            }
        }
    }

    /// Why the socket-call tracepoints cannot attach (the `sock_diag` tier), when they cannot.
    pub fn socket_calls_missing(&self) -> Option<&NoSocketCalls> {
        self.socket_calls.as_ref().err()
    }

    /// Whether connections are told apart by network namespace.
    pub fn netns_keyed(&self) -> bool {
        self.netns_keyed
    }

    /// Whether the accept tracepoints are attached.
    pub fn accepts_watched(&self) -> bool {
        !self.accept_links.is_empty()
    }

    /// Attaches or detaches the accept tracepoints. Attaching starts the accept statistics
    /// afresh: accepts made while detached were not seen, so older figures would mislead.
    pub fn watch_accepts(&mut self, on: bool) -> Result<(), KernelError> {
        if on == self.accepts_watched() {
            return Ok(());
        }
        if on {
            let stale: Vec<AcceptKey> = self.accepts.keys().filter_map(Result::ok).collect();
            for key in stale {
                let _ = self.accepts.remove(&key);
            }
            for (name, category, tracepoint) in ACCEPT_PROGRAMS {
                let link = self
                    .tracepoint(name)?
                    .attach(category, tracepoint)
                    .map_err(|source| KernelError::Program { name, source });
                match link {
                    Ok(link) => self.accept_links.push((name, link)),
                    Err(e) => {
                        let _ = self.watch_accepts(false);
                        return Err(e);
                    }
                }
            }
        } else {
            for (name, link) in std::mem::take(&mut self.accept_links) {
                self.tracepoint(name)?
                    .detach(link)
                    .map_err(|source| KernelError::Program { name, source })?;
            }
        }
        Ok(())
    }

    fn tracepoint(&mut self, name: &'static str) -> Result<&mut TracePoint, KernelError> {
        typed(&mut self.ebpf, name)
    }

    fn raw_tracepoint(&mut self, name: &'static str) -> Result<&mut RawTracePoint, KernelError> {
        typed(&mut self.ebpf, name)
    }

    /// Whether the TCP state and send/receive programs are attached.
    pub fn following(&self) -> bool {
        !self.follow_links.is_empty()
    }

    /// Attaches or detaches the programs that follow connections: the TCP state hook and the
    /// send/receive raw tracepoints. Attaching starts afresh: the connection table is emptied
    /// (connections closed while detached would otherwise stay in it for ever) and the
    /// counters and latency histogram restart from zero, so what they count is consistent —
    /// every connection in them was seen from its handshake, or taken up at its first socket
    /// call after it (its exchanges only: see `tcp_state::adopt` in the programs); sock_diag
    /// covers what happened on it before.
    pub fn follow(&mut self, on: bool) -> Result<(), KernelError> {
        if on == self.following() {
            return Ok(());
        }
        if let (true, Err(why)) = (on, &self.socket_calls) {
            return Err(KernelError::Tracefs(why.to_string()));
        }
        if !on {
            for link in std::mem::take(&mut self.follow_links) {
                match link {
                    FollowLink::Raw(name, id) => self
                        .raw_tracepoint(name)?
                        .detach(id)
                        .map_err(|source| KernelError::Program { name, source })?,
                    FollowLink::Classic(name, id) => self
                        .tracepoint(name)?
                        .detach(id)
                        .map_err(|source| KernelError::Program { name, source })?,
                }
            }
            return Ok(());
        }
        self.restart_counts()?;
        // The state hook first: a connection is in the table before its first read is seen.
        let state = self.state_hook;
        let link = if state == STATE_RAW {
            self.raw_tracepoint(state)?
                .attach(STATE_CLASSIC)
                .map(|id| FollowLink::Raw(state, id))
        } else {
            self.tracepoint(state)?
                .attach("sock", STATE_CLASSIC)
                .map(|id| FollowLink::Classic(state, id))
        };
        let link = link.map_err(|source| KernelError::Program {
            name: state,
            source,
        })?;
        self.follow_links.push(link);
        for name in RAW_PROGRAMS {
            match self.raw_tracepoint(name)?.attach(name) {
                Ok(id) => self.follow_links.push(FollowLink::Raw(name, id)),
                Err(source) => {
                    let _ = self.follow(false);
                    return Err(KernelError::Program { name, source });
                }
            }
        }
        Ok(())
    }

    /// Empties the connection table and zeroes the counters and histograms (nothing is
    /// attached to change them meanwhile).
    fn restart_counts(&mut self) -> Result<(), KernelError> {
        let stale: Vec<u64> = self.conns.keys().filter_map(Result::ok).collect();
        for key in stale {
            let _ = self.conns.remove(&key);
        }
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| KernelError::Map {
            name: maps::PORT_COUNTERS,
            detail: format!("counting CPUs: {e}"),
        })?;
        for slot in 0..MAX_PORTS {
            zero_slot(&mut self.counters, slot, cpus, maps::PORT_COUNTERS)?;
            zero_slot(&mut self.latency, slot, cpus, maps::LATENCY)?;
        }
        Ok(())
    }

    /// The counters of every watched port, in the order given to `load`: one map read, cheap
    /// enough for every tick.
    pub fn counters(&self) -> Vec<PortCounters> {
        (0..self.watched.len() as u32)
            .map(|slot| self.port_counters(slot))
            .collect()
    }

    fn port_counters(&self, slot: u32) -> PortCounters {
        let mut counters = PortCounters::default();
        if let Ok(per_cpu) = self.counters.get(&slot, 0) {
            for c in per_cpu.iter() {
                counters.add(c);
            }
        }
        counters
    }

    /// One port's counters and latency histogram, summed over its slots (no connection-table
    /// read): what the figures of a span are made of.
    pub fn port_totals(&self, port: u16) -> (PortCounters, LatencyHist) {
        let (mut counters, mut latency) = (PortCounters::default(), LatencyHist::default());
        for (slot, key) in (0u32..).zip(&self.watched) {
            if key.port != port {
                continue;
            }
            counters.add(&self.port_counters(slot));
            if let Ok(per_cpu) = self.latency.get(&slot, 0) {
                for h in per_cpu.iter() {
                    for (sum, b) in latency.buckets.iter_mut().zip(h.buckets.iter()) {
                        *sum += b;
                    }
                }
            }
        }
        (counters, latency)
    }

    /// Reads every map once. Cost grows with the connection table only while connections wait
    /// or requests are pending; otherwise it is a handful of syscalls.
    pub fn sample(&self) -> KernelSample {
        let now_ns = monotonic_ns();
        let mut ports: Vec<PortSample> = self
            .watched
            .iter()
            .zip(0u32..)
            .map(|(&WatchKey { port, .. }, slot)| {
                let counters = self.port_counters(slot);
                let mut latency = LatencyHist::default();
                if let Ok(per_cpu) = self.latency.get(&slot, 0) {
                    for h in per_cpu.iter() {
                        for (sum, b) in latency.buckets.iter_mut().zip(h.buckets.iter()) {
                            *sum += b;
                        }
                    }
                }
                PortSample {
                    port,
                    counters,
                    latency,
                    answers: self.answers.as_ref().ok().map(|a| a.counters(slot)),
                    ..PortSample::default()
                }
            })
            .collect();

        let maybe_busy = ports
            .iter()
            .any(|p| p.counters.waiting() > 0 || p.counters.pending() > 0);
        if maybe_busy {
            for conn in self.conn_entries() {
                let Some(p) = ports.get_mut(conn.slot as usize) else {
                    continue;
                };
                if conn.claimed_ns == 0 {
                    p.waiting += 1;
                    let age = Duration::from_nanos(now_ns.saturating_sub(conn.established_ns));
                    p.oldest_waiting = Some(p.oldest_waiting.map_or(age, |o| o.max(age)));
                } else if conn.first_request_ns != 0 && conn.first_response_ns == 0 {
                    p.pending += 1;
                    let age = Duration::from_nanos(now_ns.saturating_sub(conn.first_request_ns));
                    p.oldest_pending = Some(p.oldest_pending.map_or(age, |o| o.max(age)));
                }
            }
        }
        let accepts = self.accepts.iter().filter_map(Result::ok).collect();
        KernelSample {
            ports,
            accepts,
            map_errors: self.map_errors(),
            now_ns,
        }
    }

    /// Every entry of the connection table: in a few batch reads where the kernel has them,
    /// else entry by entry (two syscalls each).
    fn conn_entries(&self) -> Vec<ConnState> {
        use std::{os::fd::AsFd, sync::atomic::Ordering};
        if let Some(fd) = self
            .conns_fd
            .as_ref()
            .filter(|_| !self.conns_batch_failed.load(Ordering::Relaxed))
        {
            match batch::lookup_all::<u64, ConnState>(fd.as_fd()) {
                Ok(entries) => return entries.into_iter().map(|(_, c)| c).collect(),
                Err(e) => {
                    self.conns_batch_failed.store(true, Ordering::Relaxed);
                    tracing::info!(
                        "the connection table cannot be read in batches ({e}): entry by entry"
                    );
                }
            }
        }
        self.conns
            .iter()
            .filter_map(Result::ok)
            .map(|(_, c)| c)
            .collect()
    }

    /// The map-error counters, summed over CPUs: one small map read. A slot that cannot be
    /// read counts as 0 (the map is the programs' own; a failed read is the agent's trouble,
    /// logged at debug, and must not turn into a figure).
    pub fn map_errors(&self) -> MapErrors {
        let per_cpu: Vec<(MapErrorKind, aya::maps::PerCpuValues<u64>)> = MapErrorKind::ALL
            .into_iter()
            .filter_map(|kind| match self.map_errors.get(&(kind as u32), 0) {
                Ok(v) => Some((kind, v)),
                Err(e) => {
                    tracing::debug!("reading {} {kind:?}: {e}", maps::MAP_ERRORS);
                    None
                }
            })
            .collect();
        MapErrors::sum(per_cpu.iter().map(|(kind, v)| (*kind, &v[..])))
    }
}

/// Sets every CPU's copy of `slot` in the per-CPU array `name` to zeros.
fn zero_slot<T: aya::Pod + Default + Clone>(
    map: &mut PerCpuArray<MapData, T>,
    slot: u32,
    cpus: usize,
    name: &'static str,
) -> Result<(), KernelError> {
    let zeros = PerCpuValues::try_from(vec![T::default(); cpus]).map_err(|e| KernelError::Map {
        name,
        detail: e.to_string(),
    })?;
    map.set(slot, zeros, 0).map_err(map_err(name))
}

fn drain_logs(
    logger: aya_log::EbpfLogger<&'static dyn log::Log>,
) -> Option<tokio::task::JoinHandle<()>> {
    // SAFETY: the logger owns its ring buffer fd for its whole life, and the AsyncFd owns the
    // logger, so the fd stays open and the same until the AsyncFd is dropped.
    let registered =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot poll the eBPF log channel: {e}");
            return None;
        }
    };
    Some(tokio::spawn(async move {
        loop {
            match fd.readable_mut().await {
                Ok(mut guard) => {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                Err(e) => {
                    tracing::warn!("eBPF log channel closed: {e}");
                    return;
                }
            }
        }
    }))
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so loading does not fail
/// there for want of a few pages.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
