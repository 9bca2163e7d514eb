//! Loading: the embedded object, the record and struct offsets the programs need, the programs
//! loaded ready to attach, and the aya-log drain.

use aya::{
    maps::{Array, MapData},
    programs::{RawTracePoint, TracePoint},
    Ebpf, EbpfLoader,
};
use health_common::{maps, TracepointOffsets};
use tokio::io::unix::AsyncFd;

use super::{
    answers, btf, map_err, take, tracefs, typed, KernelError, KernelView, ACCEPT_PROGRAMS,
    RAW_PROGRAMS, STATE_CLASSIC, STATE_RAW, VMLINUX_BTF,
};

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
            .map_max_entries(maps::ANSWER_STARTS, max_conns)
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
}

#[allow(unsafe_code)]
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
    if let Err(e) = crate::sys::raise_memlock_limit() {
        tracing::debug!("could not raise RLIMIT_MEMLOCK: {e}");
    }
}
