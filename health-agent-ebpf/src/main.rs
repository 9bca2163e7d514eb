//! Kernel side of health-agent: tracepoints that follow the web backend's server-side TCP
//! connections from handshake to first response byte. Tracepoints only: kprobes and
//! fentry/fexit do not load on the kernels this runs on (see shared notes/ebpf.md).
#![no_std]
#![no_main]

mod accept;
mod send_recv;
mod tcp_state;

use aya_ebpf::{macros::map, maps::Array, programs::TracePointContext};
use health_common::TracepointOffsets;

/// Record offsets read by user space from tracefs `format` files before anything attaches.
#[map]
static OFFSETS: Array<TracepointOffsets> = Array::with_max_entries(1, 0);

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

/// Reads a record field at an offset known only at run time.
#[inline(always)]
fn field<T>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel copes with any address; a bad offset reads garbage, not UB.
    unsafe { ctx.read_at::<T>(offset as usize).ok() }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: plain helper call without arguments.
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
