//! Kernel side of health-agent: tracepoints that follow the web backend's server-side TCP
//! connections from handshake to first response byte. Tracepoints only: kprobes and
//! fentry/fexit do not load on the kernels this runs on (see shared notes/ebpf.md).
#![no_std]
#![no_main]

mod accept;
mod send_recv;
mod tcp_state;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel, macros::map, maps::Array, programs::TracePointContext,
};
use health_common::{port_bit, TracepointOffsets, PORT_BITMAP_WORDS};

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

/// Bit `port` set for every watched port: the first, cheapest test on the hottest paths.
#[map]
static PORT_BITMAP: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);

#[inline(always)]
fn port_watched(port: u16) -> bool {
    let (word, mask) = port_bit(port);
    PORT_BITMAP.get(word).is_some_and(|w| w & mask != 0)
}

/// The local port of `struct sock *sk`, when user space found its offset in the kernel's BTF.
#[inline(always)]
fn sock_port(off: &TracepointOffsets, sk: u64) -> Option<u16> {
    sock_u16(off, sk, off.sock_num)
}

/// A `u16` field of `struct sock *sk` at a BTF-resolved offset.
#[inline(always)]
fn sock_u16(off: &TracepointOffsets, sk: u64, field: u32) -> Option<u16> {
    if off.sock_known != 1 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel copes with any address.
    unsafe { bpf_probe_read_kernel((sk + field as u64) as *const u16).ok() }
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
