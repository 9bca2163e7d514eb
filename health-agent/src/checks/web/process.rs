//! The web server's own processes as /proc shows them: whether they are stopped or frozen (then
//! nothing of theirs can move, whatever else is true), how much CPU they burn, and which of
//! their outbound connections wait for an answer (a database, a cache, an API). Read only while
//! the backend's work is stuck, so a healthy server costs nothing here.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::net;

/// What the processes holding the listener are doing, from one read of each `/proc/PID/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processes {
    /// Set when every one of them is unable to run, and why: stopped by a signal (`kill -STOP`,
    /// a debugger) or in a frozen cgroup (`docker pause`).
    pub frozen: Option<String>,
    /// CPU time (user + system, all threads) of them together, in clock ticks.
    pub cpu_ticks: u64,
}

/// None when there are none, or one has gone (a restart under way).
pub fn look_at(pids: &[u32]) -> Option<Processes> {
    if pids.is_empty() {
        return None;
    }
    let (mut why, mut all_frozen, mut cpu_ticks) = (Vec::new(), true, 0);
    for &pid in pids {
        let st = stat(pid)?;
        cpu_ticks += st.ticks;
        if !all_frozen {
            continue;
        }
        match frozen_why(pid, st.state) {
            Some(w) => why.push(format!("{pid} {w}")),
            None => all_frozen = false,
        }
    }
    Some(Processes {
        frozen: all_frozen.then(|| format!("server processes {}", why.join(", "))),
        cpu_ticks,
    })
}

/// One read of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
    pub parent: u32,
    /// utime + stime, all threads, in clock ticks.
    pub ticks: u64,
    /// Clock ticks after boot when it started: with the pid, names this process and not a
    /// later one that reused the pid.
    pub start: u64,
}

/// None when the process has gone.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Why `pid` cannot run (`stopped`, `in a frozen cgroup`), if it cannot; `state` from its stat.
pub fn frozen_why(pid: u32, state: char) -> Option<&'static str> {
    if matches!(state, 'T' | 't') {
        Some("stopped")
    } else if cgroup_frozen(pid) {
        Some("in a frozen cgroup")
    } else {
        None
    }
}

/// Its command line, spaces for NULs, cut at 120 characters (a Puma worker's title says
/// which worker of which master it is); its `comm` when the command line is empty.
pub fn command(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let line: String = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if line.is_empty() {
        return net::process_name(pid);
    }
    Some(line.chars().take(120).collect())
}

/// Whether `pid`'s cgroup is frozen: `frozen 1` in its v2 `cgroup.events` (under
/// /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts), or `FROZEN` in the v1 freezer's
/// `freezer.state` (`docker pause` on a cgroup v1 host).
fn cgroup_frozen(pid: u32) -> bool {
    let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    cgroups.lines().any(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            return false;
        };
        if controllers.is_empty() {
            ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .any(|root| {
                    std::fs::read_to_string(format!("{root}{path}/cgroup.events"))
                        .is_ok_and(|e| e.lines().any(|l| l.trim() == "frozen 1"))
                })
        } else if controllers.split(',').any(|c| c == "freezer") {
            std::fs::read_to_string(format!("/sys/fs/cgroup/freezer{path}/freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
        } else {
            false
        }
    })
}

/// The fields of `/proc/<pid>/stat` used here. The command name may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the file, ppid 4, utime 14, stime 15, starttime 22.
    let state = fields.first()?.chars().next()?;
    let parent: u32 = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let start = fields.get(19).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some(Stat {
        state,
        parent,
        ticks: utime + stime,
        start,
    })
}

/// CPU seconds (user + system, all threads) of `pids` together, from `/proc/PID/stat` alone:
/// cheap enough for every tick (the saturation meter's backend CPU). None when one is gone.
pub fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    let mut ticks = 0;
    for &pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        ticks += parse_stat(&stat)?.ticks;
    }
    Some(ticks as f64 / ticks_per_second())
}

/// The CPU time the calling thread has used so far (user and system, nanosecond resolution):
/// what a piece of its own work cost, the kernel's share of its system calls included.
pub fn thread_cpu_time() -> Option<Duration> {
    crate::sys::thread_cpu_time()
}

fn ticks_per_second() -> f64 {
    crate::sys::clock_ticks_per_second().unwrap_or(100.0)
}

/// How much CPU the server burns, from samples taken while its work is stuck.
#[derive(Debug, Default)]
pub struct CpuMeter {
    samples: VecDeque<(Instant, u64)>,
}

/// The span a CPU figure is taken over: long enough for 10 ms clock ticks to mean something.
const CPU_SPAN: Duration = Duration::from_millis(1000);
/// Below this share of one core the server is not working on anything: a frozen or
/// deadlocked server uses none; Ruby or Java idling in timers use a tick now and then.
pub const BUSY_PERCENT: f64 = 10.0;

impl CpuMeter {
    pub fn observe(&mut self, now: Instant, ticks: u64) {
        if self.samples.back().is_some_and(|&(_, t)| ticks < t) {
            // The process set changed (a restart): start over.
            self.samples.clear();
        }
        self.samples.push_back((now, ticks));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(t, _)| now.saturating_duration_since(t) >= CPU_SPAN)
        {
            self.samples.pop_front();
        }
    }

    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// Percent of one core over the last second or so; None until samples span half of that.
    pub fn percent(&self) -> Option<f64> {
        let (&(t0, c0), &(t1, c1)) = (self.samples.front()?, self.samples.back()?);
        let span = t1.saturating_duration_since(t0);
        if span < CPU_SPAN / 2 {
            return None;
        }
        let used = (c1 - c0) as f64 / ticks_per_second();
        Some((used / span.as_secs_f64() * 1000.0).round() / 10.0)
    }
}

/// Outbound requests of the server to one endpoint that wait for an answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DependencyWait {
    /// `host:port` of the peer.
    pub endpoint: String,
    /// The longest any of them has waited since its request went out.
    pub waiting_ms: u64,
    /// How many connections wait on it (connecting ones included).
    pub connections: u32,
    /// Connections still in their handshake (SYN sent, nothing back: a firewall or a dead host).
    pub connecting: u32,
}

/// The outbound connections of `pids` (among `conns`, their namespace's connections) that wait
/// for an answer, by endpoint, longest wait first. Connections on the web port are the server's
/// own clients and do not count; neither does a request sent more than `sent_within` ago (an
/// idle `LISTEN` or long poll opened long before the server got stuck).
pub fn dependency_waits(
    pids: &[u32],
    conns: &[net::TcpConn],
    web_port: u16,
    sent_within: Option<Duration>,
) -> Vec<DependencyWait> {
    let inodes: HashSet<u64> = pids.iter().flat_map(|&p| net::socket_inodes(p)).collect();
    group_waits(
        conns.iter().filter(|c| {
            // A peer that closed its side answers nothing more: not waited on.
            c.state != net::TCP_CLOSE_WAIT
                && inodes.contains(&c.inode)
                && c.local.port() != web_port
        }),
        sent_within,
    )
}

fn group_waits<'a>(
    conns: impl Iterator<Item = &'a net::TcpConn>,
    sent_within: Option<Duration>,
) -> Vec<DependencyWait> {
    let mut by_peer: BTreeMap<String, DependencyWait> = BTreeMap::new();
    for c in conns.filter(|c| c.awaits_answer()) {
        let connecting = c.state == net::TCP_SYN_SENT;
        let waited = Duration::from_millis(c.last_data_sent_ms.into());
        if !connecting && sent_within.is_some_and(|w| waited > w) {
            continue;
        }
        let endpoint = c.remote.to_string();
        let w = by_peer
            .entry(endpoint.clone())
            .or_insert_with(|| DependencyWait {
                endpoint,
                waiting_ms: 0,
                connections: 0,
                connecting: 0,
            });
        w.connections += 1;
        w.connecting += u32::from(connecting);
        if !connecting {
            w.waiting_ms = w.waiting_ms.max(waited.as_millis() as u64);
        }
    }
    let mut out: Vec<DependencyWait> = by_peer.into_values().collect();
    out.sort_by_key(|w| std::cmp::Reverse(w.waiting_ms));
    out
}

/// The processes whose parent is `parent` (one scan of /proc/*/stat).
pub fn children(parent: u32) -> Vec<u32> {
    children_of(&[parent])
}

/// The processes whose parent is one of `parents` (one scan of /proc/*/stat).
pub fn children_of(parents: &[u32]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| parents.contains(&s.parent)))
        .collect()
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One process holding the listener whose own requests went unanswered while it was looked
/// at, or that is stopped or frozen: the facts a partial hang (one stuck worker of a pre-fork
/// server) is decided from, and what replacing it must check first.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerView {
    pub pid: u32,
    pub command: String,
    pub parent: u32,
    /// The parent holds the listener too: the master of a pre-fork server, which replaces a
    /// worker that dies.
    pub parent_holds_listener: bool,
    /// Why the parent could not replace it: stopped, frozen, gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_unable: Option<String>,
    /// Other processes holding the listener are its children: a master, never replaced.
    pub is_master: bool,
    /// Set when it cannot run: `stopped`, `in a frozen cgroup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen: Option<String>,
    /// Since the agent first saw it stopped or frozen (0 while it runs): a worker stopped while
    /// it held no request is stuck all the same, its share of the capacity gone.
    #[serde(skip_serializing_if = "is_zero")]
    pub frozen_ms: u64,
    /// The server's workers (the processes holding the listener that are no master), this one
    /// among them: the share of the capacity one takes.
    pub workers: u32,
    /// Its connections on the web port with a request in and no answer out.
    pub unanswered: u32,
    /// The oldest of them: since its request came in.
    pub oldest_unanswered_ms: u64,
    /// Since it last sent anything on any of its web connections (None: nothing since they
    /// were opened).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sent_ms: Option<u64>,
    /// Percent of one core over the last second (None until a second of samples).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "crate::text::shown::percent_opt")]
    pub cpu_percent: Option<f64>,
    /// Its own outbound requests waiting for an answer.
    pub outbound_waiting: u32,
    /// With the pid, names this process and not a later one that reused the pid.
    #[serde(skip)]
    pub start: u64,
    /// The listener's socket inode: a replacement is a new child of the parent holding it.
    #[serde(skip)]
    pub listener: u64,
}

/// What one process's connections on the web port show: (requests in and unanswered, the
/// oldest of them in ms, ms since it last sent on any). A connection counts as unanswered
/// when data came in after the last it sent, or it got bytes and never sent one; one whose
/// client gave up and closed (CLOSE_WAIT) still counts: the process holds it unanswered. The
/// timers are jiffies: a keep-alive request that came in within the same tick as the previous
/// answer ties with it and is not counted (never a false stuck, at worst a missed one).
pub fn web_connections(
    inodes: &HashSet<u64>,
    conns: &[net::TcpConn],
    web_port: u16,
) -> (u32, Option<u64>, Option<u64>) {
    let (mut unanswered, mut oldest, mut last_sent) = (0u32, None::<u64>, None::<u64>);
    for c in conns.iter().filter(|c| {
        matches!(c.state, net::TCP_ESTABLISHED | net::TCP_CLOSE_WAIT)
            && c.local.port() == web_port
            && inodes.contains(&c.inode)
    }) {
        if c.sent_data() {
            let s = u64::from(c.last_data_sent_ms);
            last_sent = Some(last_sent.map_or(s, |l| l.min(s)));
        }
        if c.request_unanswered() {
            unanswered += 1;
            let age = u64::from(c.last_data_recv_ms);
            oldest = Some(oldest.map_or(age, |o| o.max(age)));
        }
    }
    (unanswered, oldest, last_sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_an_awkward_name() {
        let line = "4242 (web (worker) 1) T 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 9 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'T',
                parent: 1,
                ticks: 287,
                start: 0
            })
        );
        let full = format!("{line} 123456 7");
        assert_eq!(parse_stat(&full).map(|s| s.start), Some(123456));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_neither_stopped_nor_frozen_and_uses_cpu() {
        let me = [std::process::id()];
        assert_eq!(look_at(&me).unwrap().frozen, None);
        let start = look_at(&me).expect("own /proc/self/stat").cpu_ticks;
        let until = Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(
            look_at(&me).unwrap().cpu_ticks > start,
            "300 ms of spinning shows"
        );
        assert_eq!(look_at(&[]), None, "no process: no evidence");
    }

    #[test]
    fn stopped_child_is_frozen_evidence() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        crate::sys::kill(pid as i32, libc::SIGSTOP).expect("stopping our own child");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = None;
        while Instant::now() < deadline && seen.is_none() {
            seen = look_at(&[pid]).and_then(|p| p.frozen);
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let why = seen.expect("a stopped process is reported");
        assert!(why.contains(&format!("{pid} stopped")), "{why}");
    }

    #[test]
    fn cpu_meter_needs_a_span_and_measures_a_rate() {
        let t0 = Instant::now();
        let hz = ticks_per_second() as u64;
        let mut m = CpuMeter::default();
        m.observe(t0, 1000);
        assert_eq!(m.percent(), None);
        m.observe(t0 + Duration::from_millis(250), 1000);
        assert_eq!(m.percent(), None, "too short a span");
        m.observe(t0 + Duration::from_millis(1000), 1000 + hz / 2);
        assert_eq!(m.percent(), Some(50.0));
        m.observe(t0 + Duration::from_millis(3000), 1000 + hz / 2);
        assert_eq!(m.percent(), Some(0.0), "old samples age out");
        m.observe(t0 + Duration::from_millis(3500), 5);
        assert_eq!(m.percent(), None, "a smaller count starts over");
    }

    fn conn(state: u8, remote: &str, sent: u32, recv: u32) -> net::TcpConn {
        net::TcpConn {
            state,
            local: "127.0.0.1:40000".parse().unwrap(),
            remote: remote.parse().unwrap(),
            inode: 1,
            last_data_sent_ms: sent,
            last_data_recv_ms: recv,
            last_ack_recv_ms: sent.min(recv),
            unacked: 0,
            bytes_acked: 10,
            bytes_received: 10,
            unread: 0,
        }
    }

    #[test]
    fn waits_are_grouped_by_endpoint_and_old_requests_ignored() {
        let conns = [
            conn(net::TCP_ESTABLISHED, "10.0.3.7:5432", 4200, 9000),
            conn(net::TCP_ESTABLISHED, "10.0.3.7:5432", 1200, 9000),
            conn(net::TCP_SYN_SENT, "10.0.3.7:5432", 0, 0),
            // Answered: the last data came in after the request went out.
            conn(net::TCP_ESTABLISHED, "10.0.3.8:6379", 5000, 10),
            // A LISTEN sent an hour ago.
            conn(net::TCP_ESTABLISHED, "10.0.3.9:5432", 3_600_000, 3_700_000),
        ];
        let waits = group_waits(conns.iter(), Some(Duration::from_secs(60)));
        assert_eq!(
            waits,
            [DependencyWait {
                endpoint: "10.0.3.7:5432".into(),
                waiting_ms: 4200,
                connections: 3,
                connecting: 1,
            }]
        );
        assert_eq!(group_waits(conns.iter(), None).len(), 2);
    }
}
