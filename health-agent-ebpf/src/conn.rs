//! What the TCP state hook and the send/receive hooks share: the watched-port filter, the
//! connection table and the per-port counters. `tcp_state` inserts a connection when its
//! handshake completes and takes it out at CLOSE; `send_recv` updates it in between. Both count
//! into the same per-port slots.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use health_common::{
    port_bit, ConnState, MapErrorKind, PortCounters, TracepointOffsets, DEFAULT_MAX_CONNS,
    MAX_PORTS, PORT_BITMAP_WORDS,
};

use crate::map_error;

/// Bit `port` set for every watched port: the first, cheapest test on the hottest paths.
#[map]
static PORT_BITMAP: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);

#[map]
static PORT_COUNTERS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

// LRU: a connection flood evicts the oldest entries instead of failing inserts. User space
// resizes it from the config at load time.
#[map]
static CONNS: LruHashMap<u64, ConnState> = LruHashMap::with_max_entries(DEFAULT_MAX_CONNS, 0);

#[inline(always)]
pub fn port_watched(port: u16) -> bool {
    let (word, mask) = port_bit(port);
    PORT_BITMAP.get(word).is_some_and(|w| w & mask != 0)
}

/// The local port of `struct sock *sk`, when user space found its offset in the kernel's BTF.
#[inline(always)]
pub fn sock_port(off: &TracepointOffsets, sk: u64) -> Option<u16> {
    sock_u16(off, sk, off.sock_num)
}

/// A `u16` field of `struct sock *sk` at a BTF-resolved offset.
#[inline(always)]
pub fn sock_u16(off: &TracepointOffsets, sk: u64, field: u32) -> Option<u16> {
    if off.sock_known != 1 {
        return None;
    }
    // SAFETY: `sk` is the `struct sock *` the tracepoint was handed and `field` an offset user
    // space read from this kernel's BTF (`sock_known` says it did). bpf_probe_read_kernel
    // copies into our stack and never faults: an unmapped address returns an error, and a
    // wrong offset reads a wrong value, never memory we do not own.
    unsafe { bpf_probe_read_kernel((sk + field as u64) as *const u16).ok() }
}

/// This CPU's counters of `slot`. A miss (a slot past MAX_PORTS) is counted: the event it was
/// for goes uncounted.
#[inline(always)]
pub fn counters(slot: u32) -> Option<&'static mut PortCounters> {
    let Some(p) = PORT_COUNTERS.get_ptr_mut(slot) else {
        map_error(MapErrorKind::PortCounters);
        return None;
    };
    // SAFETY: a per-CPU array value is valid for the map's lifetime (array entries are never
    // freed), and this CPU's copy is touched only by programs running on this CPU, which do
    // not preempt one another: no other reference to it exists while we hold this one.
    Some(unsafe { &mut *p })
}

/// Starts following `sk`: its handshake completed on the watched port of `conn.slot`. A
/// failed insert is counted (and returned for the caller to log).
#[inline(always)]
pub fn insert(sk: u64, conn: &ConnState) -> Result<(), i32> {
    CONNS.insert(sk, conn, 0).inspect_err(|_| {
        map_error(MapErrorKind::ConnInsert);
    })
}

/// Starts following `sk` unless an entry exists already (another CPU took it up a moment
/// before: not an error). Any other failed insert is counted.
#[inline(always)]
pub fn insert_new(sk: u64, conn: &ConnState) {
    /// `BPF_NOEXIST`: create only.
    const NOEXIST: u64 = 1;
    /// -EEXIST.
    const EXISTS: i32 = -17;
    if let Err(e) = CONNS.insert(sk, conn, NOEXIST) {
        if e != EXISTS {
            map_error(MapErrorKind::ConnInsert);
        }
    }
}

/// The table entry of `sk`, to update in place; None for a connection this table does not
/// follow (another port, or one of a watched port not taken up yet: see `tcp_state::adopt`).
#[inline(always)]
pub fn get_mut(sk: u64) -> Option<&'static mut ConnState> {
    let p = CONNS.get_ptr_mut(sk)?;
    // SAFETY: the pointer comes from a successful lookup and the LRU map's entries are
    // preallocated, so it always points into the map's memory. The entry belongs to this
    // socket, and the socket's events come one at a time, except that a read and a write of
    // the same connection may race on two CPUs: that can lose a timestamp or a count, never
    // corrupt memory, since every field is a plain integer. Should the entry be evicted and
    // reused meanwhile, the writes land in another connection's integers, with the same bound.
    Some(unsafe { &mut *p })
}

/// Stops following `sk`, returning what was seen of it.
#[inline(always)]
pub fn take(sk: u64) -> Option<ConnState> {
    // SAFETY: the entry is copied out at once (`ConnState` is Copy, all integers) and removed
    // right after; a racing update on another CPU can at worst make the copy miss its last
    // change. No reference outlives this statement.
    let conn = *unsafe { CONNS.get(sk) }?;
    // Fails only if another CPU removed it first (two CLOSE events cannot race on one socket;
    // eviction can): nothing lost.
    let _ = CONNS.remove(sk);
    Some(conn)
}
