//! What the kernel says about sockets without eBPF: accept-queue depth and maximum for each
//! listener, and connections with their `tcp_info` timers (sock_diag netlink, asking only for
//! the states wanted), the processes holding a socket (/proc/<pid>/fd), and the TcpExt
//! ListenOverflows/ListenDrops counters.

use crate::{netns::Namespace, sys};

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsFd, OwnedFd},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// The address it is bound to (`0.0.0.0`, `::`, `::1`, a specific address).
    pub addr: IpAddr,
    pub port: u16,
    /// Connections completed and waiting for accept() (ss Recv-Q).
    pub queue: u32,
    /// The accept queue's maximum (ss Send-Q): min(listen backlog, somaxconn).
    pub max_queue: u32,
    pub inode: u64,
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_LISTEN: u32 = 10;
const NLMSG_HDR: usize = 16;
const REQ_LEN: usize = 56; // struct inet_diag_req_v2
const MSG_LEN: usize = 72; // struct inet_diag_msg
const INET_DIAG_INFO: u16 = 2;

/// A sock_diag socket, bound for life to the network namespace it was made in.
#[derive(Debug)]
pub struct Diag {
    sock: OwnedFd,
}

impl Diag {
    /// One for the sockets of `ns`.
    pub fn new(ns: &Namespace) -> io::Result<Self> {
        ns.run(|| {
            Ok(Self {
                sock: sys::netlink_socket(NETLINK_SOCK_DIAG)?,
            })
        })
    }

    /// Every TCP listen socket of the namespace (both families).
    pub fn listeners(&self) -> io::Result<Vec<Listener>> {
        let mut out = Vec::new();
        self.dump_tcp(BOTH_FAMILIES, 1 << TCP_LISTEN, 0, &[], |m, _| {
            out.push(parse_msg(m))
        })?;
        Ok(out)
    }

    /// The listen sockets bound to `port`.
    pub fn listeners_on(&self, port: u16) -> io::Result<Vec<Listener>> {
        Ok(self
            .listeners()?
            .into_iter()
            .filter(|l| l.port == port)
            .collect())
    }

    /// Established and connecting TCP sockets of the namespace, and those whose peer closed
    /// its side (a client that gave up on a request still held by a stuck server), with
    /// `tcp_info`.
    pub fn connections(&self) -> io::Result<Vec<TcpConn>> {
        let mut out = Vec::new();
        let states = (1u32 << TCP_ESTABLISHED) | (1u32 << TCP_SYN_SENT) | (1u32 << TCP_CLOSE_WAIT);
        self.dump_tcp(
            BOTH_FAMILIES,
            states,
            1 << (INET_DIAG_INFO - 1),
            &[],
            |m, attrs| out.push(parse_conn(m, attrs)),
        )?;
        Ok(out)
    }

    /// The server side of the connections of the listen port `port` (their local port is the
    /// listener's), established or closed by the peer, with `tcp_info`; those still in the
    /// accept queue have inode 0. The kernel filters by port (an inet_diag bytecode), so only
    /// those are copied out and parsed; the kernel still walks every TCP socket of the
    /// namespace (and the whole established hash table, each family a walk of its own) to
    /// filter them, so only the families of `on` are asked for. A client's socket can have
    /// the same local port on another address (a listener on 127.0.0.1:P leaves 127.0.0.2:P
    /// free for an outgoing connection); those are left out.
    pub fn server_connections(&self, port: u16, on: &ListenAddrs) -> io::Result<Vec<TcpConn>> {
        let mut out = Vec::new();
        let states = (1u32 << TCP_ESTABLISHED) | (1u32 << TCP_CLOSE_WAIT);
        self.dump_tcp(
            on.families(),
            states,
            1 << (INET_DIAG_INFO - 1),
            &source_port_filter(port),
            |m, attrs| {
                let c = parse_conn(m, attrs);
                if on.serves(c.local.ip()) {
                    out.push(c);
                }
            },
        )?;
        Ok(out)
    }

    /// The peers of the port's server-side connections in TIME_WAIT (closed by the server in
    /// the last minute): connections that opened and closed between two reads of
    /// `server_connections` still show here.
    pub fn server_time_wait(&self, port: u16, on: &ListenAddrs) -> io::Result<Vec<SocketAddr>> {
        let mut out = Vec::new();
        self.dump_tcp(
            on.families(),
            1 << TCP_TIME_WAIT,
            0,
            &source_port_filter(port),
            |m, attrs| {
                let c = parse_conn(m, attrs);
                if on.serves(c.local.ip()) {
                    out.push(c.remote);
                }
            },
        )?;
        Ok(out)
    }

    /// Dumps the TCP sockets of `families` in `states` (a bit mask of TCP states) that pass
    /// `bytecode` (an inet_diag filter; empty: all), handing each `inet_diag_msg` and its
    /// attributes to `each`.
    fn dump_tcp(
        &self,
        families: impl IntoIterator<Item = u8>,
        states: u32,
        ext: u8,
        bytecode: &[u8],
        mut each: impl FnMut(&[u8], &[u8]),
    ) -> io::Result<()> {
        for family in families {
            dump(&self.sock, family, states, ext, bytecode, &mut each)?;
        }
        Ok(())
    }
}

/// The addresses a port's listeners are bound to: which of the port's sockets are theirs. A
/// listener on `::` takes IPv4 clients too, as IPv6 sockets with v4-mapped addresses. Empty
/// (no listener, e.g. a server that closed its listen socket and still serves): every socket
/// of the port, in both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenAddrs(Vec<IpAddr>);

impl ListenAddrs {
    pub fn of(listeners: &[Listener]) -> Self {
        let mut addrs: Vec<IpAddr> = listeners.iter().map(|l| l.addr).collect();
        addrs.sort_unstable();
        addrs.dedup();
        Self(addrs)
    }

    /// Whether a socket of the port with this local address can have been accepted from one
    /// of the listeners.
    pub fn serves(&self, local: IpAddr) -> bool {
        self.0.is_empty()
            || self
                .0
                .iter()
                .any(|&a| a == local || (a.is_unspecified() && a.is_ipv4() == local.is_ipv4()))
    }

    fn families(&self) -> impl Iterator<Item = u8> + '_ {
        let has = move |v4: bool| self.0.is_empty() || self.0.iter().any(|a| a.is_ipv4() == v4);
        BOTH_FAMILIES
            .into_iter()
            .filter(move |&f| has(f == libc::AF_INET as u8))
    }
}

const BOTH_FAMILIES: [u8; 2] = [libc::AF_INET as u8, libc::AF_INET6 as u8];

/// One TCP connection as sock_diag reports it, with the `tcp_info` timers that tell whether
/// it waits for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConn {
    pub state: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub inode: u64,
    /// ms since data was last sent / received (`tcpi_last_data_sent`/`_recv`; jiffies, so a
    /// few ms coarse).
    pub last_data_sent_ms: u32,
    pub last_data_recv_ms: u32,
    /// ms since an acknowledgement last came in (`tcpi_last_ack_recv`).
    pub last_ack_recv_ms: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Bytes of ours the peer acknowledged (the SYN included), and bytes it sent us
    /// (`tcpi_bytes_acked`, `tcpi_bytes_received`).
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// Bytes received that no process has read yet (`idiag_rqueue`: rcv_nxt − copied_seq).
    pub unread: u32,
}

pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_SYN_SENT: u8 = 2;
pub const TCP_CLOSE_WAIT: u8 = 8;
const TCP_TIME_WAIT: u8 = 6;

impl TcpConn {
    /// Data went out on it: the SYN counts as one acknowledged byte, so more than that, or
    /// bytes in flight.
    pub fn sent_data(&self) -> bool {
        self.bytes_acked > 1 || self.unacked > 0
    }

    /// Server side: a request came in after the last byte sent (or bytes came and none were
    /// ever sent). The timers are jiffies: a keep-alive request that came within the same tick
    /// as the previous answer ties with it and reads as answered.
    pub fn request_unanswered(&self) -> bool {
        self.bytes_received > 0
            && (!self.sent_data() || self.last_data_recv_ms < self.last_data_sent_ms)
    }

    /// A request went out after the last answer came in (or the handshake is still under
    /// way): the owner waits on the peer. The peer's kernel acknowledging the bytes does not
    /// count as an answer; its application sending some does. The timers are jiffies (4 ms
    /// at HZ=250), so a request sent in the same tick as the connect or the last answer ties
    /// with it; the byte counts and the acknowledgement timer break most such ties.
    pub fn awaits_answer(&self) -> bool {
        self.state == TCP_SYN_SENT
            || self.last_data_sent_ms < self.last_data_recv_ms
            || self.unacked > 0
            // Asked on a fresh connection and never heard back (a database startup message);
            // the SYN counts as one acknowledged byte.
            || (self.bytes_received == 0 && self.bytes_acked > 1)
            // Our bytes were acknowledged after the peer last sent data: taken, unanswered.
            || self.last_ack_recv_ms < self.last_data_recv_ms
    }
}

/// `INET_DIAG_REQ_BYTECODE`: a filter program the kernel runs on each socket of a dump.
const INET_DIAG_REQ_BYTECODE: u16 = 1;
/// `INET_DIAG_BC_S_EQ` (include/uapi/linux/inet_diag.h): local port equal to the one in the
/// next op's `no` field.
const INET_DIAG_BC_S_EQ: u8 = 11;

/// The bytecode that keeps only sockets whose local port is `port`: two `inet_diag_bc_op`s
/// (`code`, `yes`, `no`: u8, u8, u16), the comparison and the operand. A match jumps to the
/// end (8 bytes: accept); a miss jumps past it (12: reject).
fn source_port_filter(port: u16) -> [u8; 8] {
    let mut ops = [0u8; 8];
    ops[0] = INET_DIAG_BC_S_EQ;
    ops[1] = 8;
    ops[2..4].copy_from_slice(&12u16.to_ne_bytes());
    ops[6..8].copy_from_slice(&port.to_ne_bytes());
    ops
}

fn dump(
    sock: &OwnedFd,
    family: u8,
    states: u32,
    ext: u8,
    bytecode: &[u8],
    each: &mut impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    // The request, then the filter as one attribute (struct rtattr: len, type), 4-aligned.
    let attr_len = if bytecode.is_empty() {
        0
    } else {
        (4 + bytecode.len() + 3) & !3
    };
    let total = NLMSG_HDR + REQ_LEN + attr_len;
    let mut req = vec![0u8; total];
    if attr_len > 0 {
        let a = NLMSG_HDR + REQ_LEN;
        req[a..a + 2].copy_from_slice(&((4 + bytecode.len()) as u16).to_ne_bytes());
        req[a + 2..a + 4].copy_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
        req[a + 4..a + 4 + bytecode.len()].copy_from_slice(bytecode);
    }
    req[0..4].copy_from_slice(&(total as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[NLMSG_HDR] = family;
    req[NLMSG_HDR + 1] = libc::IPPROTO_TCP as u8;
    req[NLMSG_HDR + 2] = ext;
    req[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&states.to_ne_bytes());
    sys::send_to_kernel(sock.as_fd(), &req)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = sys::recv(sock.as_fd(), &mut buf)?;
        if parse_reply(&buf[..n], each)? {
            return Ok(());
        }
    }
}

/// One `recv` worth of a sock_diag dump: hands each `inet_diag_msg` and its attributes to
/// `each`. True once the dump is done (NLMSG_DONE), an error for NLMSG_ERROR or a message that
/// does not fit in the buffer.
pub(crate) fn parse_reply(
    mut msgs: &[u8],
    each: &mut impl FnMut(&[u8], &[u8]),
) -> io::Result<bool> {
    while msgs.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
        let ty = u16::from_ne_bytes([msgs[4], msgs[5]]);
        if len < NLMSG_HDR || len > msgs.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated netlink message",
            ));
        }
        match ty as i32 {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                // struct nlmsgerr starts with the negative errno, inside this message.
                let errno = msgs
                    .get(NLMSG_HDR..NLMSG_HDR + 4)
                    .filter(|_| len >= NLMSG_HDR + 4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidData, "truncated netlink error")
                    })?;
                // wrapping: i32::MIN has no positive counterpart (negating it panics).
                return Err(io::Error::from_raw_os_error(errno.wrapping_neg()));
            }
            _ if ty == SOCK_DIAG_BY_FAMILY && len >= NLMSG_HDR + MSG_LEN => {
                each(
                    &msgs[NLMSG_HDR..NLMSG_HDR + MSG_LEN],
                    &msgs[NLMSG_HDR + MSG_LEN..len],
                );
            }
            _ => {}
        }
        let aligned = (len + 3) & !3;
        msgs = &msgs[aligned.min(msgs.len())..];
    }
    Ok(false)
}

/// struct inet_diag_msg: family, state, timer, retrans, sockid (sport/dport big-endian,
/// addresses, interface, cookie: 48 bytes), expires, rqueue, wqueue, uid, inode.
pub(crate) fn parse_msg(m: &[u8]) -> Listener {
    let u32_at = |o: usize| u32::from_ne_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
    Listener {
        addr: addresses(m).0.ip(),
        port: u16::from_be_bytes([m[4], m[5]]),
        queue: u32_at(56),
        max_queue: u32_at(60),
        inode: u32_at(68) as u64,
    }
}

/// The local and remote address of an `inet_diag_msg`.
fn addresses(m: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip = |o: usize| -> IpAddr {
        if m[0] == libc::AF_INET6 as u8 {
            let mut b = [0u8; 16];
            b.copy_from_slice(&m[o..o + 16]);
            let v6 = Ipv6Addr::from(b);
            // Dual-stack sockets report IPv4 peers as ::ffff:a.b.c.d.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        } else {
            IpAddr::V4(Ipv4Addr::new(m[o], m[o + 1], m[o + 2], m[o + 3]))
        }
    };
    (
        SocketAddr::new(ip(8), u16::from_be_bytes([m[4], m[5]])),
        SocketAddr::new(ip(24), u16::from_be_bytes([m[6], m[7]])),
    )
}

pub(crate) fn parse_conn(m: &[u8], mut attrs: &[u8]) -> TcpConn {
    let (local, remote) = addresses(m);
    let mut conn = TcpConn {
        state: m[1],
        local,
        remote,
        inode: u32::from_ne_bytes([m[68], m[69], m[70], m[71]]) as u64,
        last_data_sent_ms: 0,
        last_data_recv_ms: 0,
        last_ack_recv_ms: 0,
        unacked: 0,
        bytes_acked: 0,
        bytes_received: 0,
        unread: u32::from_ne_bytes([m[56], m[57], m[58], m[59]]),
    };
    // struct rtattr { u16 len; u16 type; } + payload, each aligned to 4 bytes.
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let ty = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            break;
        }
        let info = &attrs[4..len];
        // struct tcp_info (include/uapi/linux/tcp.h): tcpi_unacked at 24, tcpi_last_data_sent
        // at 44, _data_recv at 52, _ack_recv at 56, tcpi_bytes_acked at 120 and
        // tcpi_bytes_received at 128 (Linux 4.1+).
        if ty == INET_DIAG_INFO && info.len() >= 136 {
            let u32_at =
                |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
            let u64_at = |o: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&info[o..o + 8]);
                u64::from_ne_bytes(b)
            };
            conn.unacked = u32_at(24);
            conn.last_data_sent_ms = u32_at(44);
            conn.last_data_recv_ms = u32_at(52);
            conn.last_ack_recv_ms = u32_at(56);
            conn.bytes_acked = u64_at(120);
            conn.bytes_received = u64_at(128);
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    conn
}

/// The socket inodes process `pid` holds open.
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Finds the processes holding socket `inode` open (a scan of /proc/*/fd; the caller caches
/// the answer per listener inode).
pub fn socket_owners(inode: u64) -> Vec<u32> {
    let needle = format!("socket:[{inode}]");
    let owned_by = |pid: u32| -> bool {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        dir.filter_map(Result::ok)
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == needle.as_str()))
    };
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = proc_dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| owned_by(pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// `/proc/<pid>/fd/<fd>` as a socket inode, if it is a socket.
pub fn fd_socket_inode(pid: u32, fd: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

pub fn process_name(pid: u32) -> Option<String> {
    Some(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()?
            .trim()
            .to_string(),
    )
}

/// TcpExt counters from /proc/net/netstat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenDrops {
    pub overflows: u64,
    pub drops: u64,
}

pub fn listen_drops() -> io::Result<ListenDrops> {
    Ok(parse_netstat(&std::fs::read_to_string(
        "/proc/net/netstat",
    )?))
}

fn parse_netstat(text: &str) -> ListenDrops {
    let mut lines = text.lines();
    let mut out = ListenDrops::default();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let map: HashMap<&str, u64> = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .filter_map(|(n, v)| Some((n, v.parse().ok()?)))
            .collect();
        out.overflows = map.get("ListenOverflows").copied().unwrap_or(0);
        out.drops = map.get("ListenDrops").copied().unwrap_or(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs the fuzz smoke found panicking (`fuzz/corpus/sock_diag/regression_*`).
    #[test]
    fn malformed_netlink_errors_are_errors_not_panics() {
        let header = |len: u32, ty: u16| {
            let mut m = len.to_ne_bytes().to_vec();
            m.extend_from_slice(&ty.to_ne_bytes());
            m.extend_from_slice(&[0; 10]);
            m
        };
        let mut never = |_: &[u8], _: &[u8]| panic!("no inet_diag_msg here");
        // An NLMSG_ERROR of header only: its errno would be read past the buffer.
        let short = header(16, libc::NLMSG_ERROR as u16);
        let err = parse_reply(&short, &mut never).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        // errno i32::MIN: negating it overflowed.
        let mut min = header(20, libc::NLMSG_ERROR as u16);
        min.extend_from_slice(&i32::MIN.to_ne_bytes());
        assert!(parse_reply(&min, &mut never).is_err());
        // The usual: -EINVAL.
        let mut einval = header(20, libc::NLMSG_ERROR as u16);
        einval.extend_from_slice(&(-libc::EINVAL).to_ne_bytes());
        let err = parse_reply(&einval, &mut never).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn netstat_counters() {
        let t = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 7 9\nIpExt: InNoRoutes\nIpExt: 1\n";
        assert_eq!(
            parse_netstat(t),
            ListenDrops {
                overflows: 7,
                drops: 9
            }
        );
    }

    #[test]
    fn finds_a_real_listener_with_its_queue_and_owner() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _c1 = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _c2 = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();
        let listeners_on = |port| diag.listeners_on(port);
        let found = listeners_on(port).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].queue, 2, "two handshakes wait for accept()");
        assert_eq!(found[0].max_queue, 128.min(found[0].max_queue.max(1)));
        let owners = socket_owners(found[0].inode);
        assert_eq!(owners, vec![std::process::id()]);
        let (_s, _) = l.accept().unwrap();
        assert_eq!(listeners_on(port).unwrap()[0].queue, 1);
        drop(l);
        assert!(listeners_on(port).unwrap().is_empty());
    }

    #[test]
    fn a_request_without_an_answer_awaits_one() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let mine = socket_inodes(std::process::id());
        let diag = Diag::new(&Namespace::own().unwrap()).unwrap();
        let find = || {
            diag.connections()
                .unwrap()
                .into_iter()
                .find(|c| c.remote.port() == port && mine.contains(&c.inode))
                .expect("the client side of the connection")
        };
        // Jiffies are coarse: let the clock move between each step.
        let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!find().awaits_answer(), "nothing asked yet: {:?}", find());
        // Written within the same jiffy as the connect, as a database client does: the
        // timers tie, the byte counts tell.
        client.write_all(b"ping").unwrap();
        tick();
        let c = find();
        assert_eq!(c.state, TCP_ESTABLISHED);
        assert_eq!(c.local.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(c.awaits_answer(), "request sent, nothing back: {c:?}");
        let mut b = [0u8; 4];
        server.read_exact(&mut b).unwrap();
        tick();
        server.write_all(b"pong").unwrap();
        client.read_exact(&mut b).unwrap();
        tick();
        assert!(!find().awaits_answer(), "answered: {:?}", find());
        // The next request on the same connection, then silence.
        tick();
        client.write_all(b"ping").unwrap();
        tick();
        assert!(find().awaits_answer(), "asked again: {:?}", find());
    }
}
