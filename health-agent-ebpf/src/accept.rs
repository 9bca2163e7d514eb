//! `syscalls:sys_enter_accept4` / `sys_exit_accept4` (and the plain `accept` pair): the
//! server process claiming connections from a listen fd. A non-blocking accept that returns
//! EAGAIN is neither progress nor a drop, so only a returned socket counts. User space maps
//! (process, listen fd) to a listen port through /proc.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use health_common::{AcceptKey, AcceptStat};

use crate::{field, now_ns, offsets};

/// Listen fd of each accept call in flight, by thread. LRU: a thread killed inside accept
/// never reaches the exit hook, and its entry must not pin a slot forever.
#[map]
static ACCEPT_ARGS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(4096, 0);

#[map]
static ACCEPTS: LruHashMap<AcceptKey, AcceptStat> = LruHashMap::with_max_entries(4096, 0);

#[tracepoint]
pub fn sys_enter_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_enter(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_accept(ctx: TracePointContext) -> u32 {
    let _ = try_enter(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_accept(ctx: TracePointContext) -> u32 {
    let _ = try_exit(&ctx);
    0
}

fn try_enter(ctx: &TracePointContext) -> Option<()> {
    let off = offsets()?;
    // Syscall arguments are stored as 8-byte slots whatever their C type.
    let fd: u64 = field(ctx, off.accept_enter_fd)?;
    ACCEPT_ARGS
        .insert(bpf_get_current_pid_tgid(), fd as u32, 0)
        .ok()
}

fn try_exit(ctx: &TracePointContext) -> Option<()> {
    let off = offsets()?;
    let id = bpf_get_current_pid_tgid();
    let fd = *unsafe { ACCEPT_ARGS.get(id) }?;
    let _ = ACCEPT_ARGS.remove(id);
    let ret: i64 = field(ctx, off.accept_exit_ret)?;
    if ret < 0 {
        return None;
    }
    let key = AcceptKey {
        tgid: (id >> 32) as u32,
        fd,
    };
    let now = now_ns();
    match ACCEPTS.get_ptr_mut(key) {
        Some(stat) => {
            let stat = unsafe { &mut *stat };
            stat.count += 1;
            stat.last_ns = now;
        }
        None => {
            let stat = AcceptStat {
                count: 1,
                last_ns: now,
            };
            let _ = ACCEPTS.insert(key, stat, 0);
        }
    }
    Some(())
}
