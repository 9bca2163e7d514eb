//! Which segment a status line may start: the first one the server sends after a request.
//! Without it, a body that happens to begin with `HTTP/1.1 500` (a proxy handing on a captured
//! answer, a large body whose later segment starts with those bytes) would count as a 5xx:
//! content served by the backend could forge the `erroring` verdict.
//!
//! The state is where the answer must start in the server's byte stream. A request segment's
//! acknowledgement number is how much of the server's stream the client had received when it
//! sent the request; a client that read the previous answer whole before asking again (every
//! HTTP/1.1 client but a pipelining one) has received all of it, so the next answer starts at
//! exactly that sequence number. A segment sent at any other sequence number is the rest of an
//! answer, never a status line.
//!
//! Why a sequence number rather than a "response due" flag: the answer programs attach in
//! sampling windows, so a request seen just before a detach leaves its flag set until after
//! the next attach, when a body segment of a later answer would have consumed it. A sequence
//! number cannot match a later segment, nor one of a new socket that reuses the address of a
//! closed one (its initial sequence number is random), so a stale entry is harmless and none
//! needs removing.
//!
//! A pipelined request (sent before the previous answer arrived whole) names a sequence number
//! inside that answer: the answer to it goes uncounted, and should a body segment of the
//! earlier answer start at that number with a status line's bytes, that segment counts instead.
//! Only a pipelining client can line that up; undercounting the rare client that pipelines is
//! the price of not counting bodies.
//!
//! Home: an LRU hash of its own keyed by the socket's address (as `CONNS`), not `CONNS`
//! itself, whose entries exist only while the connection-following programs run and only for
//! connections taken up since (the answer programs run without them, in their own windows);
//! not socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`), which the kernel creates only with
//! the map's key and value types in the object's BTF: aya-ebpf 0.2.1 has it only as a BTF
//! map (`btf_maps::SkStorage`, whose accessors take a sock_addr context, not an skb), and the
//! object is linked without BTF, which turning on would change how every map and program of
//! it loads, on 6.1 as on 6.18.

use aya_ebpf::{macros::map, maps::LruHashMap, programs::SkBuffContext};
use health_common::{MapErrorKind, DEFAULT_MAX_CONNS};

use super::Segment;
use crate::map_error;

/// Where the answer a connection owes starts in the server's byte stream.
#[repr(C)]
#[derive(Clone, Copy)]
struct Due {
    /// Sequence number (host order) of the answer's first byte.
    seq: u32,
    /// 1 while the answer is owed; 0 once its first segment went out (a retransmission of it
    /// is not a second answer).
    owed: u32,
}

// LRU: a connection flood evicts the oldest entries (whose next answer then goes uncounted)
// instead of failing inserts. User space sizes it as `CONNS`.
#[map]
static ANSWER_DUE: LruHashMap<u64, Due> = LruHashMap::with_max_entries(DEFAULT_MAX_CONNS, 0);

/// TCP header: sequence number, acknowledgement number, flags (offsets from its start).
const TCP_SEQ: usize = 4;
const TCP_ACK: usize = 8;
const TCP_FLAGS: usize = 13;
const FLAG_ACK: u8 = 0x10;

/// A 32-bit field of the TCP header at `tcp`, in host order.
#[inline(always)]
fn tcp_u32(ctx: &SkBuffContext, at: usize) -> Option<u32> {
    ctx.load::<u32>(at).ok().map(u32::from_be)
}

/// A request arrived on socket `sk` in segment `seg`: its answer is owed from the sequence
/// number the segment acknowledges.
#[inline(always)]
pub fn arm(ctx: &SkBuffContext, sk: u64, seg: &Segment) -> Option<()> {
    let tcp = seg.tcp;
    // Only a segment with ACK set says what the client received (not a Fast Open SYN).
    let flags: u8 = ctx.load(tcp + TCP_FLAGS).ok()?;
    if flags & FLAG_ACK == 0 {
        return None;
    }
    let due = Due {
        seq: tcp_u32(ctx, tcp + TCP_ACK)?,
        owed: 1,
    };
    // In place when the connection has an entry (every request after its first): an LRU
    // insert takes a fresh element each time.
    match ANSWER_DUE.get_ptr_mut(sk) {
        // SAFETY: the pointer comes from a successful lookup into the LRU map's preallocated
        // entries, so it points into map memory; a race with the egress program on another
        // CPU can at worst lose one answer's count (plain integers).
        Some(p) => unsafe { *p = due },
        None => {
            if ANSWER_DUE.insert(sk, due, 0).is_err() {
                map_error(MapErrorKind::Other);
            }
        }
    }
    Some(())
}

/// Segment `seg` of socket `sk` starts like a status line of `class` (1–5; `head` its first
/// bytes): the class to count, or 0 when it is not the first segment of an owed answer.
///
/// An interim answer (`1xx` but `101`, e.g. `100 Continue`) is not the answer to the request:
/// it is not counted (counted, it would add a second answer to each such request and dilute
/// the 5xx share), and the final answer is owed from the byte after it. `101 Switching
/// Protocols` is the final answer: after it the connection speaks another protocol.
#[inline(always)]
pub fn take(ctx: &SkBuffContext, sk: u64, seg: &Segment, head: &[u8; 12], class: u8) -> u8 {
    let Some(p) = ANSWER_DUE.get_ptr_mut(sk) else {
        return 0;
    };
    // SAFETY: as in `arm`.
    let due = unsafe { &mut *p };
    let Some(seq) = tcp_u32(ctx, seg.tcp + TCP_SEQ) else {
        return 0;
    };
    if due.owed != 1 || seq != due.seq {
        return 0;
    }
    if class == 1 && !(head[10] == b'0' && head[11] == b'1') {
        let len = (ctx.skb.len() as usize).saturating_sub(seg.payload);
        due.seq = seq.wrapping_add(len as u32);
        return 0;
    }
    due.owed = 0;
    class
}
