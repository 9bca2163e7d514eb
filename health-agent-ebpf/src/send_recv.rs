//! `sock_recv_length` / `sock_send_length` as raw tracepoints (6.3+; `TP_PROTO(struct sock *sk,
//! int ret, int flags)`, read against 6.18). They fire for every socket read and write on the
//! box, so they take the raw form: the kernel hands over the prototype's arguments without
//! building a trace record, and no field offsets are needed. A process's first read or write
//! on a connection is its claim; they also say when its first request byte was read and when
//! its first response byte left, and count every request → answer exchange, keep-alive ones
//! included. They update the shared connection table (`conn`) in place, and take up a
//! connection of a watched port it does not follow yet (`tcp_state::adopt`: one opened before
//! they attached), whose exchanges then count; this area owns the server-latency histogram.

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
};
use health_common::{latency_bucket, LatencyHist, MapErrorKind, LATENCY_BUCKETS, MAX_PORTS};

use crate::{
    conn::{self, counters, port_watched, sock_port},
    map_error, now_ns, offsets, tcp_state,
};

#[map]
static LATENCY: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn sock_recv_length(ctx: RawTracePointContext) -> i32 {
    let _ = try_io(&ctx, false);
    0
}

#[raw_tracepoint(tracepoint = "sock_send_length")]
pub fn sock_send_length(ctx: RawTracePointContext) -> i32 {
    let _ = try_io(&ctx, true);
    0
}

fn try_io(ctx: &RawTracePointContext, send: bool) -> Option<()> {
    // Arguments arrive as u64 slots; `int ret` sits zero-extended in the low half.
    let ret = ctx.arg::<u64>(1) as u32 as i32;
    // Errors (EAGAIN included) move nothing. A read of 0 is end-of-file: the server took the
    // connection and found no request in it.
    if ret < 0 || (send && ret == 0) {
        return None;
    }
    let sk: u64 = ctx.arg(0);
    // Every socket read/write on the box passes here. The local port (one read, one bit)
    // turns away the client side of every connection and every other server; without BTF
    // offsets the hash lookup alone decides.
    let off = offsets()?;
    let port = if off.sock_known == 1 {
        let port = sock_port(off, sk)?;
        if !port_watched(port) {
            return None;
        }
        Some(port)
    } else {
        None
    };
    let conn = match conn::get_mut(sk) {
        Some(conn) => conn,
        // A connection of the watched port the table does not follow yet (without the port
        // there is no telling): taken up, unless this is the read that finds it ended.
        None if send || ret > 0 => tcp_state::adopt(off, sk, port?)?,
        None => return None,
    };
    // Every byte in or out is movement, keep-alive exchanges included: one per-CPU add (the
    // array lookup is inlined by the verifier), no clock read.
    let c = counters(conn.slot)?;
    // Exchanges are counted on the entry already in hand: a request read opens one (however
    // many reads it takes), the first send after it closes it, and its time between the two
    // goes in the latency histogram. Every request of a keep-alive connection counts, which
    // the first-request and first-response timestamps below cannot see. One clock read at
    // each end of an exchange; none for the reads and sends in between.
    if send {
        c.sent += 1;
        if conn.exchange_ns != 0 {
            let us = now_ns().saturating_sub(conn.exchange_ns) / 1000;
            conn.exchange_ns = 0;
            c.exchanges_out += 1;
            c.exchange_us += us;
            // The probe path's answers (marked by the answer programs, which see the request
            // line) are no real traffic: their latency stays out, as their status does.
            if conn.probe == 0 {
                record_latency(conn.slot, us)?;
            }
        }
    } else if ret > 0 {
        c.received += 1;
        if conn.exchange_ns == 0 {
            conn.exchange_ns = now_ns().max(1);
            c.exchanges_in += 1;
        }
    }
    let first = if send {
        conn.first_response_ns == 0
    } else {
        ret > 0 && conn.first_request_ns == 0
    };
    // Keep-alive traffic after its first exchange needs nothing more: no clock read.
    if conn.claimed_ns != 0 && !first {
        return None;
    }
    let now = now_ns();
    if conn.claimed_ns == 0 {
        conn.claimed_ns = now;
        c.claimed += 1;
        c.last_claim_ns = now;
    }
    if !first {
        return Some(());
    }
    if !send {
        conn.first_request_ns = now;
        c.requests += 1;
        return Some(());
    }
    conn.first_response_ns = now;
    c.answered += 1;
    Some(())
}

/// One exchange's server latency (request read → first response byte) into the port's
/// histogram.
#[inline(always)]
fn record_latency(slot: u32, us: u64) -> Option<()> {
    let bucket = latency_bucket(us);
    let Some(hist) = LATENCY.get_ptr_mut(slot) else {
        map_error(MapErrorKind::PortCounters);
        return None;
    };
    // SAFETY: a per-CPU array value, valid for the map's lifetime and touched only by
    // programs on this CPU, which do not preempt one another.
    let hist = unsafe { &mut *hist };
    // Redundant for correctness; it gives the verifier a bound it can see.
    if bucket < LATENCY_BUCKETS {
        hist.buckets[bucket] += 1;
    }
    Some(())
}
