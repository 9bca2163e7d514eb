//! `syscalls:sys_enter_accept4` / `sys_exit_accept4` (and the plain `accept` pair): the
//! server process claiming connections from a listen fd. A non-blocking accept that returns
//! EAGAIN is neither progress nor a drop, so only a returned socket counts. User space maps
//! (process, listen fd) to a listen port through /proc. These hooks run in the calling
//! thread's context: the pid_tgid pairs an exit with its enter.
//!
//! Kernel prototypes (net/socket.c):
//!
//! ```text
//! SYSCALL_DEFINE4(accept4, int fd, struct sockaddr __user *upeer_sockaddr,
//!                 int __user *upeer_addrlen, int flags)
//! SYSCALL_DEFINE3(accept, int fd, struct sockaddr __user *upeer_sockaddr,
//!                 int __user *upeer_addrlen)
//! ```
//!
//! Records as 6.18 lays them out (`events/syscalls/<name>/format`; the offsets the programs
//! use come from those files at start-up, and user space refuses to start the accept hooks if
//! the two pairs disagree, since one offset serves both):
//!
//! ```text
//! sys_enter_accept4, sys_enter_accept:
//!   int __syscall_nr;                 offset:8;  size:4
//!   int fd;                           offset:16; size:8   <- read
//!   struct sockaddr * upeer_sockaddr; offset:24; size:8
//!   int * upeer_addrlen;              offset:32; size:8
//!   int flags;                        offset:40; size:8   (accept4 only)
//! sys_exit_accept4, sys_exit_accept:
//!   int __syscall_nr;                 offset:8;  size:4
//!   long ret;                         offset:16; size:8   <- read: new fd, or -errno
//! ```

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use health_common::{AcceptKey, AcceptStat, MapErrorKind};

use crate::{field, map_error, now_ns, offsets};

/// Threads inside an accept call at once, host-wide. A server blocks one thread per listener
/// (or a few) in accept; 4096 leaves room for thread-per-connection servers too.
const ACCEPTS_IN_FLIGHT: u32 = 4096;
/// (process, listen fd) pairs followed. A server has one listen fd per port it serves (a few
/// with SO_REUSEPORT workers); LRU, so stale pairs of exited processes make room.
const LISTEN_FDS: u32 = 4096;

/// Listen fd of each accept call in flight, by thread. LRU: a thread killed inside accept
/// never reaches the exit hook, and its entry must not pin a slot forever.
#[map]
static ACCEPT_ARGS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(ACCEPTS_IN_FLIGHT, 0);

#[map]
static ACCEPTS: LruHashMap<AcceptKey, AcceptStat> = LruHashMap::with_max_entries(LISTEN_FDS, 0);

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
    if ACCEPT_ARGS
        .insert(bpf_get_current_pid_tgid(), fd as u32, 0)
        .is_err()
    {
        map_error(MapErrorKind::Other);
        return None;
    }
    Some(())
}

fn try_exit(ctx: &TracePointContext) -> Option<()> {
    let off = offsets()?;
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the u32 is copied out at once. The entry is this thread's (keyed by pid_tgid)
    // and only this thread's hooks write it; should another thread's insert evict and reuse it
    // meanwhile, the copy reads that thread's fd: a miscount, never memory we do not own.
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
            // SAFETY: the pointer comes from a successful lookup into the LRU map's
            // preallocated entries, so it points into map memory. Two threads of one process
            // accepting on the same fd at once may race on it: a lost count or timestamp,
            // never corrupt memory (plain integers).
            let stat = unsafe { &mut *stat };
            stat.count += 1;
            stat.last_ns = now;
        }
        None => {
            let stat = AcceptStat {
                count: 1,
                last_ns: now,
            };
            if ACCEPTS.insert(key, stat, 0).is_err() {
                map_error(MapErrorKind::Other);
            }
        }
    }
    Some(())
}
