//! `sock:inet_sock_set_state`: a passive handshake that completes puts a connection into the
//! listener's accept queue; CLOSE ends it. Two forms of the same hook, one attached: the raw
//! tracepoint (`TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)`, read
//! against 6.18) when user space found the `struct sock` offsets in BTF, else the classic one
//! (record layout read from tracefs). The raw form skips building a record for the ten or so
//! state changes every connection on the box goes through, nine of which concern nobody here.
//! This area owns the watched-port table; it puts connections into the shared table (`conn`)
//! and takes them out.
//!
//! The classic record as 6.18 lays it out (`events/sock/inet_sock_set_state/format`; the
//! offsets the program uses come from that file at start-up, these are for reading):
//!
//! ```text
//! const void * skaddr;   offset:8;  size:8
//! int oldstate;          offset:16; size:4
//! int newstate;          offset:20; size:4
//! __u16 sport;           offset:24; size:2   (host byte order)
//! __u16 dport;           offset:26; size:2
//! __u16 family;          offset:28; size:2
//! __u16 protocol;        offset:30; size:2
//! saddr[4], daddr[4], saddr_v6[16], daddr_v6[16] follow, unread
//! ```

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{map, raw_tracepoint, tracepoint},
    maps::HashMap,
    programs::{RawTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::warn;
use health_common::{
    kernel::{IPPROTO_TCP, TCP_CLOSE, TCP_ESTABLISHED, TCP_SYN_RECV},
    ConnState, TracepointOffsets, WatchKey, MAX_PORTS,
};

use crate::{
    conn::{self, counters, port_watched, sock_port, sock_u16},
    field, now_ns, offsets,
};

#[map]
static WATCHED_PORTS: HashMap<WatchKey, u32> = HashMap::with_max_entries(MAX_PORTS, 0);

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn inet_sock_set_state_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_raw(&ctx);
    0
}

fn try_raw(ctx: &RawTracePointContext) -> Option<()> {
    // Arguments arrive as u64 slots; the `int`s sit in the low halves.
    let newstate = ctx.arg::<u64>(2) as u32 as i32;
    if newstate == TCP_CLOSE {
        // Not filtered by port: by now tcp_set_state has released the port (`skc_num` reads
        // 0). The lookup finds only connections this program inserted.
        return on_close(ctx.arg(0));
    }
    if newstate != TCP_ESTABLISHED || ctx.arg::<u64>(1) as u32 as i32 != TCP_SYN_RECV {
        return None;
    }
    let off = offsets()?;
    let sk: u64 = ctx.arg(0);
    // Child sockets carry the listener's port as their local port.
    let sport = sock_port(off, sk)?;
    if !port_watched(sport) || sock_u16(off, sk, off.sock_protocol)? != IPPROTO_TCP {
        return None;
    }
    on_established(ctx, sk, WatchKey::new(netns(off, sk), sport))
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_classic(&ctx);
    0
}

fn try_classic(ctx: &TracePointContext) -> Option<()> {
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
    // Without BTF there is no namespace to read: keys say 0, any namespace.
    let sport: u16 = field(ctx, off.state_sport)?;
    on_established(ctx, sk, WatchKey::new(0, sport))
}

/// The inode of `sk`'s network namespace (`sk->__sk_common.skc_net.net->ns.inum`), or 0 when
/// the kernel's BTF did not give its offsets. Two reads, paid once per accepted connection on a
/// watched port number, never per socket call.
#[inline(always)]
pub fn netns(off: &TracepointOffsets, sk: u64) -> u32 {
    if off.net_known != 1 {
        return 0;
    }
    // SAFETY: `sk` is the `struct sock *` this hook was handed and `sock_net` the offset of
    // `skc_net` from this kernel's BTF (`net_known` says user space found it).
    // bpf_probe_read_kernel copies into our stack and never faults: an unmapped address
    // returns an error, handled below.
    let net: u64 = match unsafe { bpf_probe_read_kernel((sk + off.sock_net as u64) as *const u64) }
    {
        Ok(p) => p,
        Err(_) => return 0,
    };
    // SAFETY: `net` is the `struct net *` just read and `net_inum` the BTF offset of
    // `ns.inum` in it; the same helper, the same guarantee (an error reads as 0, any namespace).
    unsafe { bpf_probe_read_kernel((net + off.net_inum as u64) as *const u32) }.unwrap_or(0)
}

/// The counter slot of a watched port, or None for any other port (or namespace).
#[inline(always)]
pub fn slot(key: WatchKey) -> Option<u32> {
    // SAFETY: copied out at once (a u32); user space replacing the entry meanwhile can only
    // hand us the old or the new slot, both plain integers.
    unsafe { WATCHED_PORTS.get(key) }.copied()
}

/// A passive handshake on a watched port completed: the connection waits in the accept queue.
fn on_established<C: EbpfContext>(ctx: &C, sk: u64, key: WatchKey) -> Option<()> {
    // The exit for every other port, and for the same port in another namespace.
    // SAFETY: the value is copied out at once (a u32); user space replacing the entry
    // meanwhile can only hand us the old or the new slot, both plain integers.
    let slot = *unsafe { WATCHED_PORTS.get(key) }?;
    let sport = key.port;

    let conn = ConnState {
        established_ns: now_ns(),
        slot,
        ..ConnState::default()
    };
    if let Err(err) = conn::insert(sk, &conn) {
        warn!(ctx, "conns insert failed on port {}: {}", sport, err);
    }
    counters(slot)?.established += 1;
    Some(())
}

/// Takes up `sk`, a TCP connection on the watched `port` that the table does not follow: it
/// opened before the programs attached (or before the agent started, or was evicted). From
/// this socket call on its exchanges count, so a load balancer's long-lived connections are
/// seen moving. Its handshake, claim, first request and first answer are past: the entry says
/// so (their times set to now), and none of them is counted. One namespace read and one map
/// look-up and insert, once per such connection.
pub fn adopt(off: &TracepointOffsets, sk: u64, port: u16) -> Option<&'static mut ConnState> {
    if sock_u16(off, sk, off.sock_protocol)? != IPPROTO_TCP {
        return None;
    }
    // SAFETY: copied out at once, as in `on_established`.
    let slot = *unsafe { WATCHED_PORTS.get(WatchKey::new(netns(off, sk), port)) }?;
    let now = now_ns();
    conn::insert_new(
        sk,
        &ConnState {
            established_ns: now,
            claimed_ns: now,
            first_request_ns: now,
            first_response_ns: now,
            slot,
            probe: 0,
            exchange_ns: 0,
        },
    );
    conn::get_mut(sk)
}

fn on_close(sk: u64) -> Option<()> {
    let conn = conn::take(sk)?;
    let c = counters(conn.slot)?;
    if conn.claimed_ns == 0 {
        c.closed_unclaimed += 1;
    }
    // A request read and never answered, on any exchange of the connection: what keeps the
    // in-service count (in − out − dropped) from growing by every client that gave up.
    if conn.exchange_ns != 0 {
        c.exchanges_dropped += 1;
    }
    if conn.first_response_ns == 0 {
        c.closed_unanswered += 1;
        if conn.first_request_ns != 0 {
            c.closed_pending += 1;
        }
    }
    Some(())
}
