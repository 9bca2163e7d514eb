//! What the backend answers: cgroup-skb programs on the root cgroup (every socket of the host,
//! containers included) that read the first bytes of each TCP segment of a watched port. No
//! tracepoint hands over the bytes a server sends: `sock_send_length` gives a count, and the
//! payload of a segment sits in page fragments that only `bpf_skb_load_bytes` can read
//! (docs/kernel-view.md, "What it answers").
//!
//! - egress: a segment whose payload starts with `HTTP/1.x DDD` counts in its status class
//!   when it is the first such segment the server sends after the client sent a request
//!   (`due`): the same bytes at the start of a body segment are content, not a status. One
//!   that starts like a TLS record counts as TLS, wherever it is: a TLS count only says that
//!   the status is not visible, and never feeds a class.
//! - ingress: a segment whose payload starts with a request line counts as a request; one for
//!   the probe path (`ANSWER_PROBE`: the agent's own probe, and a balancer's checks of the same
//!   path) counts apart, so that user space can leave those answers out of the real traffic,
//!   and marks its connection (`ConnState::probe`) so that the answer's latency stays out of
//!   the histogram too; an HTTP/2 connection preface counts apart.
//!
//! Both return 1 (pass) whatever they see: they only count. The first test is the local port
//! against the watched-port bitmap, a field of the context and one array read, which turns away
//! every other socket's packets.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{cgroup_skb, map},
    maps::{Array, PerCpuArray},
    programs::SkBuffContext,
};
use health_common::{
    kernel::AF_INET6, AnswerCounters, ProbePath, WatchKey, MAX_PORTS, PROBE_PATH_MAX,
};

use crate::{
    conn::{self, port_watched},
    offsets, tcp_state,
};

mod due;

#[map]
static ANSWERS: PerCpuArray<AnswerCounters> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

/// The probe path, written by user space (one entry; `len` 0: none).
#[map]
static ANSWER_PROBE: Array<ProbePath> = Array::with_max_entries(1, 0);

const IPPROTO_TCP: u8 = 6;

#[cgroup_skb(egress)]
pub fn answers_egress(ctx: SkBuffContext) -> i32 {
    let _ = try_egress(&ctx);
    1
}

#[cgroup_skb(ingress)]
pub fn answers_ingress(ctx: SkBuffContext) -> i32 {
    let _ = try_ingress(&ctx);
    1
}

/// The counters of the watched port `port` (known watched) in this packet socket's
/// namespace; None for the same port number in another namespace. Paid only for segments that
/// start an answer or a request: a namespace read and a hash look-up.
#[inline(always)]
fn counters(ctx: &SkBuffContext, port: u16) -> Option<&'static mut AnswerCounters> {
    let off = offsets()?;
    let netns = if off.net_known == 1 {
        tcp_state::netns(off, sk_addr(ctx)?)
    } else {
        0
    };
    let slot = tcp_state::slot(WatchKey::new(netns, port))?;
    let p = ANSWERS.get_ptr_mut(slot)?;
    // SAFETY: a per-CPU array value, valid for the map's lifetime and touched only by programs
    // on this CPU, which do not preempt one another.
    Some(unsafe { &mut *p })
}

/// The address of this packet's socket, as the tracepoints see it (the connection table's
/// key).
#[inline(always)]
fn sk_addr(ctx: &SkBuffContext) -> Option<u64> {
    // The verifier types the context's `sk` field as a socket pointer, on which it allows no
    // arithmetic; copied through the helper it becomes a plain number.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: reads 8 bytes of our own stack (the local `sk`); the helper never faults.
    unsafe { bpf_probe_read_kernel(&sk as *const _ as *const u64) }.ok()
}

/// Marks the connection's next exchange as the probe path's or a real one: the send program
/// leaves the probe's latency out of the histogram. A connection the table does not follow
/// is left alone.
#[inline(always)]
fn mark_probe(ctx: &SkBuffContext, probe: bool) {
    if let Some(conn) = sk_addr(ctx).and_then(conn::get_mut) {
        conn.probe = u32::from(probe);
    }
}

/// The local port of this packet's socket when it is watched: the first test, a field of the
/// context and one array read, which turns away every other socket's packets.
#[inline(always)]
fn watched_port(ctx: &SkBuffContext) -> Option<u16> {
    // Host byte order for the local port.
    let port = ctx.skb.local_port() as u16;
    port_watched(port).then_some(port)
}

/// Where a segment's TCP header and payload start, from the start of the context's data (the
/// network header).
struct Segment {
    tcp: usize,
    payload: usize,
}

/// Where the TCP header and payload start, when the packet is TCP and holds at least 12
/// payload bytes. A segment too short for that (an ACK, with or without timestamps) is turned
/// away on its length alone, before any byte is read.
#[inline(always)]
fn segment(ctx: &SkBuffContext) -> Option<Segment> {
    // IPv4 + TCP with timestamps + 12 bytes; IPv6 the same. Without timestamps a segment of
    // 12 to 23 payload bytes is turned away too: no status line or request line is that short.
    let min = if ctx.skb.family() == u32::from(AF_INET6) {
        84
    } else {
        64
    };
    if ctx.skb.len() < min {
        return None;
    }
    let b0: u8 = ctx.load(0).ok()?;
    let (ip_len, proto) = match b0 >> 4 {
        4 => (((b0 & 0x0f) as usize) * 4, ctx.load::<u8>(9).ok()?),
        // Extension headers are not followed: a TCP segment of a server has none.
        6 => (40, ctx.load::<u8>(6).ok()?),
        _ => return None,
    };
    if proto != IPPROTO_TCP || !(20..=60).contains(&ip_len) {
        return None;
    }
    let doff: u8 = ctx.load(ip_len + 12).ok()?;
    let at = ip_len + ((doff >> 4) as usize) * 4;
    if (ctx.skb.len() as usize) < at + 12 {
        return None;
    }
    Some(Segment {
        tcp: ip_len,
        payload: at,
    })
}

/// What a segment's first bytes say: 1–5 the class of an `HTTP/1.x` status line, `TLS` a TLS
/// record, 0 anything else (the rest of an answer's body).
#[inline(always)]
fn answer_kind(head: &[u8; 12]) -> u8 {
    if head[0] == b'H'
        && head[1] == b'T'
        && head[2] == b'T'
        && head[3] == b'P'
        && head[4] == b'/'
        && head[5] == b'1'
        && head[6] == b'.'
        && head[8] == b' '
        && (b'1'..=b'5').contains(&head[9])
    {
        head[9] - b'0'
    } else if (0x14..=0x17).contains(&head[0]) && head[1] == 0x03 && head[2] <= 0x04 {
        TLS
    } else {
        0
    }
}

const TLS: u8 = 6;

fn try_egress(ctx: &SkBuffContext) -> Option<()> {
    let port = watched_port(ctx)?;
    let seg = segment(ctx)?;
    let head: [u8; 12] = ctx.load(seg.payload).ok()?;
    let mut kind = answer_kind(&head);
    // Only a segment that looks like a status line pays for the look-up that says whether it
    // starts an answer.
    if (1..=5).contains(&kind) {
        kind = due::take(ctx, &seg, &head, kind);
    }
    // Every segment sent counts only where it is the evidence of answers going out (the
    // sock_diag tier); elsewhere a body segment leaves here, before any look-up.
    let count_sent = ANSWER_PROBE.get(0).is_some_and(|p| p.count_sent == 1);
    if kind == 0 && !count_sent {
        return None;
    }
    let c = counters(ctx, port)?;
    if count_sent {
        c.sent += 1;
    }
    // One constant index per class: a computed one loses its bound to the compiler's
    // rewriting before the verifier sees it.
    match kind {
        1 => c.status[1] += 1,
        2 => c.status[2] += 1,
        3 => c.status[3] += 1,
        4 => c.status[4] += 1,
        5 => c.status[5] += 1,
        TLS => c.tls += 1,
        _ => {}
    }
    Some(())
}

fn try_ingress(ctx: &SkBuffContext) -> Option<()> {
    let port = watched_port(ctx)?;
    let at = segment(ctx)?.payload;
    let head: [u8; 8] = ctx.load(at).ok()?;
    let path_at = if starts(&head, b"GET /") {
        4
    } else if starts(&head, b"HEAD /") {
        5
    } else if starts(&head, b"POST /")
        || starts(&head, b"PUT /")
        || starts(&head, b"PATCH /")
        || starts(&head, b"DELETE")
        || starts(&head, b"OPTIONS")
    {
        0
    } else if starts(&head, b"PRI * HT") {
        counters(ctx, port)?.h2 += 1;
        return Some(());
    } else {
        return None;
    };
    let c = counters(ctx, port)?;
    c.requests += 1;
    // A real request until the path says otherwise.
    mark_probe(ctx, false);
    if path_at == 0 {
        return None;
    }
    let probe = ANSWER_PROBE.get(0)?;
    let len = probe.len as usize;
    if len == 0 || len > PROBE_PATH_MAX {
        return None;
    }
    // The path and the byte after it: a space, or `?` before a query. Byte by byte, each load
    // of a constant size: a real request's path differs within its first bytes, and a load of
    // `len + 1` bytes at once needs a verifier that keeps `len`'s bound through a stack spill,
    // which Linux 6.1's does not ("R4 unbounded memory access").
    let from = at + path_at;
    if (ctx.skb.len() as usize) < from + len + 1 {
        return None;
    }
    let mut i = 0;
    while i < PROBE_PATH_MAX {
        if i == len {
            break;
        }
        let b: u8 = ctx.load(from + i).ok()?;
        if b != probe.path[i] {
            return None;
        }
        i += 1;
    }
    let next: u8 = ctx.load(from + len).ok()?;
    if next == b' ' || next == b'?' {
        c.probe_requests += 1;
        mark_probe(ctx, true);
    }
    Some(())
}

/// Whether `head` starts with `pat` (a loop the compiler unrolls: no `memcmp` in eBPF).
#[inline(always)]
fn starts<const N: usize>(head: &[u8; 8], pat: &[u8; N]) -> bool {
    let mut i = 0;
    while i < N && i < 8 {
        if head[i] != pat[i] {
            return false;
        }
        i += 1;
    }
    true
}
