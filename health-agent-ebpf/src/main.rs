//! Kernel side of health-agent: tracepoints that follow the web backend's server-side TCP
//! connections from handshake to first response byte. Tracepoints only: kprobes need
//! `CONFIG_KPROBES`, which hardened kernels turn off, and fentry/fexit loads fail there with
//! EPERM (docs/kernel-view.md).
//!
//! - `tcp_state`: `inet_sock_set_state`, connections in and out of the table;
//! - `send_recv`: `sock_{send,recv}_length`, claims, first request and response, latency;
//! - `accept`: the accept syscalls, listen fd by listen fd;
//! - `answers`: cgroup-skb programs, the status class of each answer;
//! - `conn`: what `tcp_state` and `send_recv` share (port filter, table, counters).
//!
//! This root holds what every area uses: the record offsets and the map-error counters.
#![no_std]
#![no_main]

mod accept;
mod answers;
mod conn;
mod send_recv;
mod tcp_state;

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
    programs::TracePointContext,
};
use health_common::{MapErrorKind, TracepointOffsets};

/// Record offsets read by user space from tracefs `format` files before anything attaches.
#[map]
static OFFSETS: Array<TracepointOffsets> = Array::with_max_entries(1, 0);

/// Map updates that failed, by [`MapErrorKind`]: without them a failure would only show as
/// figures that read low.
#[map]
static MAP_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MapErrorKind::COUNT, 0);

/// The offsets, or `None` until user space has filled them in.
#[inline(always)]
fn offsets() -> Option<&'static TracepointOffsets> {
    let off = OFFSETS.get(0)?;
    if off.ready == 1 {
        Some(off)
    } else {
        None
    }
}

/// Counts one failed map update of `kind`.
#[inline(always)]
fn map_error(kind: MapErrorKind) {
    if let Some(n) = MAP_ERRORS.get_ptr_mut(kind as u32) {
        // SAFETY: every MapErrorKind indexes inside the array (COUNT entries), array entries
        // are never freed, and this CPU's copy is touched only by programs on this CPU, which
        // do not preempt one another.
        unsafe { *n += 1 }
    }
}

/// Reads a record field at an offset known only at run time.
#[inline(always)]
fn field<T>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    // SAFETY: `read_at` is bpf_probe_read_kernel from the record the tracepoint handed us plus
    // `offset`, which user space read from this tracepoint's tracefs `format` file (and checked
    // against the field's size). The helper copies into our stack and never faults: a bad
    // offset reads garbage or an error, never memory we do not own. Every `T` read here is a
    // plain integer, valid for any bit pattern.
    unsafe { ctx.read_at::<T>(offset as usize).ok() }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory of ours.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// bpf_probe_read_kernel is a GPL-only helper.
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
