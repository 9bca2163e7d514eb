//! Whether a segment that starts like a status line starts an answer: only the first such
//! segment the server sends after the client sent it something new (a request) does. Without
//! this, a body that happens to begin with `HTTP/1.1 500` (a proxy relaying a captured
//! answer, a large body whose later segment starts with those bytes) would count as a 5xx:
//! content served by the backend could forge the `erroring` verdict.
//!
//! What the client sent is read off the segment itself: its acknowledgement number is how much
//! of the client's byte stream the server has received. Each counted answer records it; a
//! later segment that acknowledges nothing new (every body segment of the same answer) is not
//! an answer. A client sends its next request only after reading the answer whole, so the next
//! answer acknowledges more.
//!
//! Why not "a request line seen by the ingress program arms the next segment": the answer
//! programs attach in sampling windows (`socket_tracing = "on_suspicion"`), and a request that
//! arrived before the attach would leave its answer uncounted. Answers that take longer than a
//! window (a busy pool, an upstream timeout's 504) would all be lost: Debian 12's 6.1 VM
//! (`tests/tests/old_kernel.rs`, busy pool) saw none of its 200s that way. The acknowledgement
//! number says a request arrived whether or not anything watched it arrive, and the ingress
//! program keeps no per-connection state.
//!
//! Left open, all needing the client to send while an answer is still going out: a pipelining
//! client, or one that streams data during the answer, moves the acknowledgement number in the
//! middle of an answer, and the next body segment that starts like a status line then counts.
//! So does one that the programs see first after an attach in the middle of an answer (at most
//! one per connection and attach).
//!
//! Home: an LRU hash of its own keyed by the socket's cookie, not `CONNS` (whose entries exist
//! only while the connection-following programs run, for connections taken up since: the
//! answer programs run without them) nor socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`, which
//! the kernel creates only with the map's key and value types in the object's BTF: aya-ebpf
//! 0.2.1 has it only as a BTF map, `btf_maps::SkStorage`, whose accessors take a sock_addr
//! context, and the object is linked without BTF, which turning on would change how every map
//! and program in it loads, on 6.1 as on 6.18). The cookie, unlike the socket's address, is
//! never reused: an entry left by a closed connection can never speak for a new one.

use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::map, maps::LruHashMap, programs::SkBuffContext,
};
use health_common::{MapErrorKind, DEFAULT_MAX_CONNS};

use super::Segment;
use crate::map_error;

/// What the latest answer of a connection acknowledged.
#[repr(C)]
#[derive(Clone, Copy)]
struct Answered {
    /// The acknowledgement number (host order) its first segment carried: the client's byte
    /// stream up to there had arrived.
    ack: u32,
    /// 1 after `101 Switching Protocols`: the connection speaks another protocol now, and no
    /// later segment of it is an HTTP/1.x answer.
    switched: u32,
}

// LRU: a connection flood evicts the oldest entries instead of failing inserts; an evicted
// connection's next answer is judged as a new connection's. User space sizes it as `CONNS`.
#[map]
static ANSWER_STARTS: LruHashMap<u64, Answered> =
    LruHashMap::with_max_entries(DEFAULT_MAX_CONNS, 0);

/// Offset of the acknowledgement number in the TCP header.
const TCP_ACK: usize = 8;

/// Segment `seg` starts like a status line of `class` (1–5; `head` its first bytes): the class
/// to count, or 0 when it is not the start of an answer.
///
/// An interim answer (`1xx` but `101`, e.g. `100 Continue`) is not the answer to the request:
/// it is not counted (counted, it would add a second answer to each such request and dilute
/// the 5xx share) and not recorded, so that the final answer after it still counts. `101
/// Switching Protocols` is the final answer: after it the connection speaks another protocol.
#[inline(always)]
pub fn take(ctx: &SkBuffContext, seg: &Segment, head: &[u8; 12], class: u8) -> u8 {
    let Some(ack) = ctx.load::<u32>(seg.tcp + TCP_ACK).ok().map(u32::from_be) else {
        return 0;
    };
    // SAFETY: the helper reads the socket of the packet the context points to (0 for none)
    // and gives it a cookie the first time; it touches no memory of ours.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.skb.skb.cast()) };
    if cookie == 0 {
        return 0;
    }
    let interim = class == 1 && !(head[10] == b'0' && head[11] == b'1');
    let answered = Answered {
        ack,
        switched: u32::from(class == 1),
    };
    match ANSWER_STARTS.get_ptr_mut(cookie) {
        Some(p) => {
            // SAFETY: the pointer comes from a successful lookup into the LRU map's
            // preallocated entries, so it points into map memory. One socket's segments leave
            // one at a time; should the entry be evicted and reused meanwhile, the write lands
            // in another connection's integers, never outside the map.
            let last = unsafe { &mut *p };
            // Nothing new from the client, or only its FIN (one sequence number): no request
            // since the latest answer, so this is a body segment (or a retransmission).
            if last.switched == 1 || ack.wrapping_sub(last.ack) <= 1 || interim {
                return 0;
            }
            *last = answered;
        }
        None => {
            if interim {
                return 0;
            }
            if ANSWER_STARTS.insert(cookie, answered, 0).is_err() {
                map_error(MapErrorKind::Other);
            }
        }
    }
    class
}
