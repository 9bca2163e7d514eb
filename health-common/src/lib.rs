//! Types and names shared by the kernel programs (`health-agent-ebpf`) and user space
//! (`health-agent`). Everything here is `#[repr(C)]` plain data: both sides read the same bytes
//! out of the same maps, so a field added here is added for both at once.
#![no_std]
// The one unsafe here: the `aya::Pod` impls (`mod pod`).
#![deny(unsafe_code)]

/// Map names, spelled once for both sides.
pub mod maps {
    /// `HashMap<WatchKey, u32 slot>`: listen ports to watch, per network namespace, and their
    /// counter slot.
    pub const WATCHED_PORTS: &str = "WATCHED_PORTS";
    /// `PerCpuArray<PortCounters>` indexed by slot.
    pub const PORT_COUNTERS: &str = "PORT_COUNTERS";
    /// `PerCpuArray<LatencyHist>` indexed by slot.
    pub const LATENCY: &str = "LATENCY";
    /// `LruHashMap<u64 sock pointer, ConnState>`: server-side connections of watched ports.
    pub const CONNS: &str = "CONNS";
    /// `LruHashMap<AcceptKey, AcceptStat>`: successful accepts per (process, listen fd).
    pub const ACCEPTS: &str = "ACCEPTS";
    /// `HashMap<u64 pid_tgid, u32 fd>`: listen fd of an accept call in flight.
    pub const ACCEPT_ARGS: &str = "ACCEPT_ARGS";
    /// `Array<TracepointOffsets>` with one entry, written by user space before attaching.
    pub const OFFSETS: &str = "OFFSETS";
    /// `Array<u64>` of `PORT_BITMAP_WORDS` words: bit `port` set for every watched port. The
    /// send/receive hooks test it before any hash lookup.
    pub const PORT_BITMAP: &str = "PORT_BITMAP";
    /// `PerCpuArray<u64>` of `MapErrorKind::COUNT` entries, indexed by [`MapErrorKind`]: map
    /// updates the programs could not make. User space sums the CPUs.
    pub const MAP_ERRORS: &str = "MAP_ERRORS";
    /// `PerCpuArray<AnswerCounters>` indexed by slot: answers by status class, from the
    /// packets' first bytes (cgroup-skb).
    pub const ANSWERS: &str = "ANSWERS";
    /// `Array<ProbePath>` with one entry: the probe path, whose requests are not real traffic.
    pub const ANSWER_PROBE: &str = "ANSWER_PROBE";
    /// `LruHashMap<u64 socket cookie, _>`: what each connection's latest answer acknowledged,
    /// so that only the first segment after a request counts as an answer (kernel-only state;
    /// user space sizes it as [`CONNS`]).
    pub const ANSWER_STARTS: &str = "ANSWER_STARTS";
}

/// Index of [`maps::MAP_ERRORS`]: which kind of map update failed in the kernel. Each failure
/// loses an observation (a connection not followed, an event not counted), so the figures that
/// depend on it read low; a non-zero counter says so instead of the loss staying silent.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapErrorKind {
    /// Inserting into the connection table (`CONNS`) failed: the connection goes untracked.
    /// It is an LRU map, so a full table evicts rather than fails (even at one entry shared
    /// by two CPUs, tried on 6.18); a failure is the kernel refusing the update (ENOMEM).
    ConnInsert = 0,
    /// A watched port's counter or histogram slot could not be looked up: the event is not
    /// counted.
    PortCounters = 1,
    /// Any other map update: an accept goes uncounted (the accept maps), or an answer does
    /// (`ANSWER_STARTS`).
    Other = 2,
}

impl MapErrorKind {
    pub const ALL: [Self; 3] = [Self::ConnInsert, Self::PortCounters, Self::Other];
    /// Entries of [`maps::MAP_ERRORS`].
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// The `kind` label of `health_agent_kernel_map_errors_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ConnInsert => "conn_insert",
            Self::PortCounters => "port_counters",
            Self::Other => "other",
        }
    }
}

/// 65,536 ports, one bit each.
pub const PORT_BITMAP_WORDS: u32 = 1024;

/// Word index and bit mask of `port` in the watched-port bitmap.
#[inline(always)]
pub const fn port_bit(port: u16) -> (u32, u64) {
    ((port >> 6) as u32, 1u64 << (port & 63))
}

/// Key of [`maps::WATCHED_PORTS`]: a listen port in one network namespace, so another
/// namespace's server on the same port number never mixes in. `netns` is the namespace's inode
/// (`net->ns.inum`), or 0 — any namespace — when the kernel's BTF does not say where to read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WatchKey {
    pub netns: u32,
    pub port: u16,
    /// Explicit padding, always 0: the key's bytes are hashed as they are.
    pub _pad: u16,
}

impl WatchKey {
    pub const fn new(netns: u32, port: u16) -> Self {
        Self {
            netns,
            port,
            _pad: 0,
        }
    }
}

/// Upper bound on watched listen ports (size of the slot-indexed arrays).
pub const MAX_PORTS: u32 = 64;
/// Default size of the per-connection LRU map; the config can change it at load time.
pub const DEFAULT_MAX_CONNS: u32 = 16_384;

/// Kernel constants the programs compare against (include/net/tcp_states.h, socket.h, in.h).
pub mod kernel {
    pub const TCP_ESTABLISHED: i32 = 1;
    pub const TCP_SYN_RECV: i32 = 3;
    pub const TCP_CLOSE: i32 = 7;
    pub const AF_INET: u16 = 2;
    pub const AF_INET6: u16 = 10;
    pub const IPPROTO_TCP: u16 = 6;
}

/// Monotonic counters for one watched port. Per CPU in the kernel; user space sums them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Passive handshakes completed (SYN_RECV → ESTABLISHED): the connection is now in the
    /// listener's accept queue.
    pub established: u64,
    /// Connections first touched (read or written) by a process: claimed by the server.
    pub claimed: u64,
    /// Connections whose first request byte was read by the server.
    pub requests: u64,
    /// Connections whose first response byte was sent.
    pub answered: u64,
    /// Connections that reached CLOSE without the server ever sending a byte.
    pub closed_unanswered: u64,
    /// Connections that reached CLOSE without any process touching them (died in the queue).
    pub closed_unclaimed: u64,
    /// Connections that reached CLOSE with a request read and no response byte sent.
    pub closed_pending: u64,
    /// `bpf_ktime_get_ns` of the latest claim: the server's progress through its accept
    /// queue, seen without any syscall hook. Not a count: summed per CPU as a maximum.
    pub last_claim_ns: u64,
    /// Successful send calls on any server-side connection, keep-alive exchanges after the
    /// first included: answers still going out. No clock is read for it; user space notes
    /// when the count moves.
    pub sent: u64,
    /// Successful reads (of at least one byte) on server-side connections, keep-alive
    /// requests included: with `sent`, tells a server working through requests from an idle
    /// one.
    pub received: u64,
    /// Exchanges (request read → answer) begun: a read with data on a connection whose
    /// previous request was answered, or that had none. Every request of a keep-alive
    /// connection counts, not only its first; a request read in several calls counts once.
    pub exchanges_in: u64,
    /// Exchanges answered: the first send after such a read.
    pub exchanges_out: u64,
    /// Exchanges whose connection reached CLOSE before the answer began.
    pub exchanges_dropped: u64,
    /// The answered exchanges' server latencies (request read → first response byte) summed,
    /// in microseconds: over a span, divided by its length, the requests in service on
    /// average (Little's law), which sock_diag cannot see on keep-alive connections.
    pub exchange_us: u64,
}

impl PortCounters {
    pub fn add(&mut self, o: &PortCounters) {
        self.established += o.established;
        self.claimed += o.claimed;
        self.requests += o.requests;
        self.answered += o.answered;
        self.closed_unanswered += o.closed_unanswered;
        self.closed_unclaimed += o.closed_unclaimed;
        self.closed_pending += o.closed_pending;
        self.last_claim_ns = self.last_claim_ns.max(o.last_claim_ns);
        self.sent += o.sent;
        self.received += o.received;
        self.exchanges_in += o.exchanges_in;
        self.exchanges_out += o.exchanges_out;
        self.exchanges_dropped += o.exchanges_dropped;
        self.exchange_us += o.exchange_us;
    }

    /// Connections waiting in the accept queue now (exact unless the LRU table evicted some).
    pub fn waiting(&self) -> u64 {
        self.established
            .saturating_sub(self.claimed + self.closed_unclaimed)
    }

    /// Requests read and not answered now (same caveat).
    pub fn pending(&self) -> u64 {
        self.requests
            .saturating_sub(self.answered.min(self.requests) + self.closed_pending)
    }

    /// Requests read and not answered now, on any connection, keep-alive ones included (same
    /// caveat: an evicted connection's open exchange stays counted).
    pub fn in_service(&self) -> u64 {
        self.exchanges_in
            .saturating_sub(self.exchanges_out + self.exchanges_dropped)
    }

    /// Work that arrived, since the programs loaded: every connection as its handshake
    /// completes (it arrives whether or not a worker is free to take it), and every later
    /// request of a kept-alive connection as the server reads it.
    pub fn arrivals(&self) -> u64 {
        self.established + self.exchanges_in.saturating_sub(self.requests)
    }
}

/// What one watched port answers, by the first bytes of its TCP segments (cgroup-skb
/// programs). Monotonic, per CPU in the kernel; user space sums them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnswerCounters {
    /// Answers by the status's first digit (index 1–5; 0 unused): the first segment sent after
    /// a request that starts with `HTTP/1.x D..` (a body segment that starts so is not one),
    /// keep-alive answers included; an interim `1xx` (all but `101`) is not an answer.
    pub status: [u64; 6],
    /// Segments sent that start like a TLS record: answers whose status is not visible.
    pub tls: u64,
    /// Segments received that start with a request line.
    pub requests: u64,
    /// … of which for the probe path (`GET` or `HEAD`): the agent's probe, a balancer's checks.
    pub probe_requests: u64,
    /// Segments received that start with the HTTP/2 connection preface.
    pub h2: u64,
    /// Segments sent with a payload (at least 12 bytes), whatever it is: answers going out,
    /// the evidence of a server moving where the socket-call tracepoints are missing (before
    /// Linux 6.3).
    pub sent: u64,
}

impl AnswerCounters {
    pub fn add(&mut self, o: &AnswerCounters) {
        for (a, b) in self.status.iter_mut().zip(o.status) {
            *a += b;
        }
        self.tls += o.tls;
        self.requests += o.requests;
        self.probe_requests += o.probe_requests;
        self.h2 += o.h2;
        self.sent += o.sent;
    }

    /// Answers with a visible status, every class.
    pub fn answers(&self) -> u64 {
        self.status.iter().sum()
    }
}

/// Longest probe path the ingress program compares.
pub const PROBE_PATH_MAX: usize = 64;

/// The probe path (without its query), for [`maps::ANSWER_PROBE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbePath {
    /// Bytes of `path` in use; 0: no probe path.
    pub len: u32,
    /// 1: count every segment sent (`AnswerCounters::sent`), the evidence of answers going out
    /// where the socket-call tracepoints are missing; 0: only the segments that start an
    /// answer are looked at further.
    pub count_sent: u32,
    pub path: [u8; PROBE_PATH_MAX],
}

impl Default for ProbePath {
    fn default() -> Self {
        Self {
            len: 0,
            count_sent: 0,
            path: [0; PROBE_PATH_MAX],
        }
    }
}

/// What the kernel remembers about one server-side connection, keyed by its `struct sock *`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnState {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) when the handshake completed.
    pub established_ns: u64,
    /// First read or write by a process; 0 while the connection waits in the accept queue.
    pub claimed_ns: u64,
    /// First request byte read by the server; 0 until then.
    pub first_request_ns: u64,
    /// First response byte sent by the server; 0 until then.
    pub first_response_ns: u64,
    /// Counter slot of the listen port.
    pub slot: u32,
    /// 1 while the latest request seen arriving is for the probe path (the agent's own
    /// probe, a balancer's checks): its answer's latency stays out of the histogram, as its
    /// answer stays out of the real ones. Set by the answer programs, which see the bytes.
    pub probe: u32,
    /// While a request has been read and its answer has not begun (an exchange is open):
    /// when that request's first byte was read (`bpf_ktime_get_ns`, never 0); else 0.
    pub exchange_ns: u64,
}

/// Buckets of the server-latency histogram (request read → first response byte).
pub const LATENCY_BUCKETS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHist {
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl Default for LatencyHist {
    fn default() -> Self {
        Self {
            buckets: [0; LATENCY_BUCKETS],
        }
    }
}

/// Floor of log2(v) for v > 0, branch-only so the verifier sees no loop.
#[inline(always)]
pub fn log2_floor(v: u64) -> u32 {
    let mut x = v;
    let mut n = 0u32;
    if x >= 1 << 32 {
        x >>= 32;
        n += 32;
    }
    if x >= 1 << 16 {
        x >>= 16;
        n += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        n += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        n += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        n += 2;
    }
    if x >= 1 << 1 {
        n += 1;
    }
    n
}

/// Histogram bucket of a latency in microseconds: exact below 4 µs, then two buckets per
/// power of two (each bucket spans at most a third of its value), capped at the last bucket.
#[inline(always)]
pub fn latency_bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let msb = log2_floor(us);
    let half = ((us >> (msb - 1)) & 1) as usize;
    let idx = 4 + (msb as usize - 2) * 2 + half;
    if idx >= LATENCY_BUCKETS {
        LATENCY_BUCKETS - 1
    } else {
        idx
    }
}

/// Smallest latency in microseconds that falls into `bucket` (inverse of [`latency_bucket`]).
pub fn latency_bucket_floor(bucket: usize) -> u64 {
    if bucket < 4 {
        return bucket as u64;
    }
    let msb = (bucket - 4) / 2 + 2;
    let half = ((bucket - 4) % 2) as u64;
    (1u64 << msb) | (half << (msb - 1))
}

/// Key of [`maps::ACCEPTS`]: a process and the listen fd it accepted from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AcceptKey {
    pub tgid: u32,
    pub fd: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcceptStat {
    /// Successful accepts (a returned socket; EAGAIN and errors are not counted).
    pub count: u64,
    /// `bpf_ktime_get_ns` of the latest one.
    pub last_ns: u64,
}

/// Byte offsets of the tracepoint record fields the programs read. Record layouts change
/// between kernel versions, so user space reads them from tracefs `format` files at start-up.
/// The raw tracepoints get the prototype's arguments instead, and read the two `struct sock`
/// fields they need at offsets user space resolves from the kernel's BTF (no CO-RE in Rust
/// eBPF).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracepointOffsets {
    /// sock:inet_sock_set_state
    pub state_skaddr: u32,
    pub state_oldstate: u32,
    pub state_newstate: u32,
    pub state_sport: u32,
    pub state_protocol: u32,
    /// syscalls:sys_enter_accept4 / sys_enter_accept (`fd`)
    pub accept_enter_fd: u32,
    /// syscalls:sys_exit_accept4 / sys_exit_accept (`ret`)
    pub accept_exit_ret: u32,
    /// Set to 1 by user space once the offsets are valid; the programs do nothing until then.
    pub ready: u32,
    /// `struct sock`: `__sk_common.skc_num` (local port, host order, u16) and `sk_protocol`
    /// (u16), valid when `sock_known` is 1. Without them (no BTF) the classic
    /// `inet_sock_set_state` tracepoint runs instead of the raw one, and the send/receive
    /// hooks skip their port pre-filter.
    pub sock_num: u32,
    pub sock_protocol: u32,
    pub sock_known: u32,
    /// `struct sock`: `__sk_common.skc_net` (the `struct net *`), and in `struct net` the
    /// namespace's `ns.inum`; valid when `net_known` is 1. Without them watched ports match
    /// in any namespace (key netns 0).
    pub sock_net: u32,
    pub net_inum: u32,
    pub net_known: u32,
}

#[cfg(feature = "user")]
#[allow(unsafe_code)]
mod pod {
    // SAFETY: all of these are repr(C) structs of integers with no padding holes.
    unsafe impl aya::Pod for super::PortCounters {}
    unsafe impl aya::Pod for super::ConnState {}
    unsafe impl aya::Pod for super::LatencyHist {}
    unsafe impl aya::Pod for super::AcceptKey {}
    unsafe impl aya::Pod for super::AcceptStat {}
    unsafe impl aya::Pod for super::TracepointOffsets {}
    unsafe impl aya::Pod for super::WatchKey {}
    unsafe impl aya::Pod for super::AnswerCounters {}
    unsafe impl aya::Pod for super::ProbePath {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_invert() {
        let mut last = 0;
        for us in 0..2_000_000u64 {
            let b = latency_bucket(us);
            assert!(b >= last, "bucket went backwards at {us}");
            last = b;
            assert!(
                latency_bucket_floor(b) <= us,
                "floor of bucket {b} above {us}"
            );
        }
        for b in 0..LATENCY_BUCKETS - 1 {
            assert_eq!(latency_bucket(latency_bucket_floor(b)), b);
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn map_error_kinds_index_their_own_slot() {
        // User space reads slot i as ALL[i]: the order must follow the discriminants.
        for (i, kind) in MapErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{kind:?}");
        }
        let labels = MapErrorKind::ALL.map(MapErrorKind::as_str);
        for (i, l) in labels.iter().enumerate() {
            assert!(!labels[..i].contains(l), "label {l} twice");
        }
    }

    #[test]
    fn keep_alive_requests_arrive_and_stay_in_service_until_answered_or_dropped() {
        // Two connections: one asked once and answered; one kept alive for three requests,
        // the last read and not answered yet.
        let mut c = PortCounters {
            established: 2,
            requests: 2,
            answered: 2,
            exchanges_in: 4,
            exchanges_out: 3,
            ..PortCounters::default()
        };
        assert_eq!(c.arrivals(), 4);
        assert_eq!(c.in_service(), 1);
        // The per-connection view sees neither the later requests nor the open one.
        assert_eq!(c.pending(), 0);
        // Its client gives up: the connection closes with the exchange open.
        c.exchanges_dropped += 1;
        assert_eq!(c.in_service(), 0);
        assert_eq!(c.arrivals(), 4);
        // Per-CPU copies read a moment apart never make the figures wrap.
        let torn = PortCounters {
            requests: 1,
            exchanges_out: 1,
            ..PortCounters::default()
        };
        assert_eq!((torn.in_service(), torn.arrivals()), (0, 0));
        let mut sum = PortCounters::default();
        sum.add(&c);
        sum.add(&c);
        assert_eq!(
            (sum.exchanges_in, sum.exchanges_out, sum.exchanges_dropped),
            (8, 6, 2)
        );
    }

    #[test]
    fn log2_matches_std() {
        for v in [1u64, 2, 3, 4, 7, 8, 1000, 1 << 40, u64::MAX] {
            assert_eq!(log2_floor(v), 63 - v.leading_zeros());
        }
    }
}
