//! `sock:inet_sock_set_state` (layout read from tracefs; written against 6.18): a passive
//! handshake that completes puts a connection into the listener's accept queue; CLOSE ends it.
//! This area owns the watched-port table, the per-port counters and the connection table.

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use health_common::{
    kernel::{IPPROTO_TCP, TCP_CLOSE, TCP_ESTABLISHED, TCP_SYN_RECV},
    ConnState, PortCounters, DEFAULT_MAX_CONNS, MAX_PORTS,
};

use crate::{field, now_ns, offsets};

#[map]
pub static WATCHED_PORTS: HashMap<u16, u32> = HashMap::with_max_entries(MAX_PORTS, 0);

#[map]
pub static PORT_COUNTERS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

// LRU: a connection flood evicts the oldest entries instead of failing inserts. User space
// resizes it from the config at load time.
#[map]
pub static CONNS: LruHashMap<u64, ConnState> = LruHashMap::with_max_entries(DEFAULT_MAX_CONNS, 0);

#[inline(always)]
pub fn counters(slot: u32) -> Option<&'static mut PortCounters> {
    // SAFETY: per-CPU value; no other program touches this CPU's copy while we run.
    PORT_COUNTERS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Option<()> {
    let off = offsets()?;
    // Most transitions (SYN_SENT, FIN_WAIT*, TIME_WAIT, ...) concern nobody here: one read and
    // out, before anything else is looked at.
    let newstate: i32 = field(ctx, off.state_newstate)?;
    if newstate != TCP_CLOSE && newstate != TCP_ESTABLISHED {
        return None;
    }
    let protocol: u16 = field(ctx, off.state_protocol)?;
    if protocol != IPPROTO_TCP {
        return None;
    }
    let sk: u64 = field(ctx, off.state_skaddr)?;
    if newstate == TCP_CLOSE {
        return on_close(sk);
    }
    let oldstate: i32 = field(ctx, off.state_oldstate)?;
    if oldstate != TCP_SYN_RECV {
        return None;
    }
    // Child sockets carry the listener's port as their local port (host byte order here).
    let sport: u16 = field(ctx, off.state_sport)?;
    // The cheap exit for every other port on the box.
    let slot = *unsafe { WATCHED_PORTS.get(sport) }?;

    let conn = ConnState {
        established_ns: now_ns(),
        slot,
        ..ConnState::default()
    };
    if let Err(err) = CONNS.insert(sk, conn, 0) {
        warn!(ctx, "conns insert failed on port {}: {}", sport, err);
    }
    counters(slot)?.established += 1;
    Some(())
}

fn on_close(sk: u64) -> Option<()> {
    // SAFETY: the entry is read once and removed right after; a racing update is harmless.
    let conn = *unsafe { CONNS.get(sk) }?;
    let _ = CONNS.remove(sk);
    let c = counters(conn.slot)?;
    if conn.claimed_ns == 0 {
        c.closed_unclaimed += 1;
    }
    if conn.first_response_ns == 0 {
        c.closed_unanswered += 1;
        if conn.first_request_ns != 0 {
            c.closed_pending += 1;
        }
    }
    Some(())
}
