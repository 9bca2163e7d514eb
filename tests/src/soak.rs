//! What the soak (tests/tests/soak.rs, `cargo xtask soak`) measures and judges: a fixture
//! backend that can be restarted on the same port, the agent's process figures from /proc, its
//! BPF objects (from `/proc/<pid>/fdinfo`) and the entries of its hash maps (`bpftool`), the
//! faults injected and the verdict over every `/health` answer against them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{binary, free_port, get, HealthSample, Proc, Timed};

/// The fixture backend on fixed ports, so that a restart comes back where the agent and the
/// load look (`Fixture` picks new ports each start).
pub struct Backend {
    child: Option<Proc>,
    pub port: u16,
    pub control: u16,
}

impl Backend {
    pub fn start() -> Self {
        let mut b = Self {
            child: None,
            port: free_port(),
            control: free_port(),
        };
        b.spawn();
        b
    }

    /// Starts it on its ports, retrying while a port is still held by the killed one.
    fn spawn(&mut self) {
        for _ in 0..50 {
            let mut child = Command::new(binary("fixture-backend", "health-agent-tests"))
                .args(["--listen", &format!("127.0.0.1:{}", self.port)])
                .args(["--control", &format!("127.0.0.1:{}", self.control)])
                .args(["--mode", "normal"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting fixture-backend");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if get(self.control, "/mode").is_ok() {
                    self.child = Some(Proc(child));
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("fixture-backend did not start on its ports");
    }

    /// SIGKILL, then a new process on the same ports: a crash and its supervisor's restart.
    pub fn restart(&mut self) {
        if let Some(mut p) = self.child.take() {
            let _ = p.0.kill();
            let _ = p.0.wait();
        }
        self.spawn();
    }

    pub fn set_mode(&self, mode: &str) {
        let (code, body) = get(self.control, &format!("/mode/{mode}")).expect("fixture control");
        assert_eq!(code, 200, "fixture refused mode {mode}: {body}");
    }

    pub fn signal(&self, sig: i32) {
        if let Some(p) = &self.child {
            p.signal(sig);
        }
    }
}

/// A trivial HTTP server on 127.0.0.1 answering `200 {}` and closing, for as long as the
/// process runs: what a client's latency to it shows is the host's own delay (scheduling on a
/// loaded machine), the baseline `/health`'s latency is read against. Returns its address.
pub fn control_server() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the control server");
    let addr = listener.local_addr().expect("control address");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            );
        }
    });
    addr
}

/// The agent's process figures at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcFigures {
    pub rss_kb: u64,
    pub fds: u64,
    pub threads: u64,
}

/// RSS, open descriptors and threads of `pid`, from /proc.
pub fn proc_figures(pid: u32) -> Option<ProcFigures> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcFigures {
        rss_kb: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}

/// One BPF map a process holds: id, type (`BPF_MAP_TYPE_*`), capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MapRef {
    pub id: u32,
    pub kind: u32,
    pub max_entries: u32,
}

/// The BPF programs and maps `pid` holds a descriptor of (links and perf events name their
/// program too): (program ids, maps).
pub fn bpf_objects(pid: u32) -> (Vec<u32>, Vec<MapRef>) {
    let (mut progs, mut maps) = (Vec::new(), Vec::new());
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (progs, maps);
    };
    for entry in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        if let Some(id) = field("prog_id:") {
            progs.push(id);
        }
        if let (Some(id), Some(kind), Some(max_entries)) =
            (field("map_id:"), field("map_type:"), field("max_entries:"))
        {
            maps.push(MapRef {
                id,
                kind,
                max_entries,
            });
        }
    }
    progs.sort_unstable();
    progs.dedup();
    maps.sort_unstable();
    maps.dedup();
    (progs, maps)
}

/// Entries in the hash maps (`BPF_MAP_TYPE_HASH`, `PERCPU_HASH`, `LRU_HASH`,
/// `LRU_PERCPU_HASH`) of `maps`, by map name, with their capacity: the ones whose fill could
/// grow. Arrays and ring buffers have a fixed size.
/// `bpftool -j map <verb> id <id>`'s JSON (None if it failed).
fn map_json(verb: &str, id: u32) -> Option<serde_json::Value> {
    let out = Command::new("bpftool")
        .args(["-j", "map", verb, "id", &id.to_string()])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

pub fn hash_map_entries(maps: &[MapRef]) -> BTreeMap<String, (u64, u32)> {
    let mut out = BTreeMap::new();
    for MapRef {
        id,
        kind,
        max_entries,
    } in maps
    {
        if ![1, 5, 9, 10].contains(kind) {
            continue;
        }
        let name = map_json("show", *id)
            .and_then(|v| v["name"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("map{id}"));
        let n = map_json("dump", *id).and_then(|v| v.as_array().map(|a| a.len() as u64));
        if let Some(n) = n {
            let e = out.entry(name).or_insert((0, 0));
            e.0 += n;
            e.1 += max_entries;
        }
    }
    out
}

/// Whether the kernel still has program `id` (`bpftool prog show id`).
pub fn prog_exists(id: u32) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether programs `progs` (a process's, just killed) have all left the kernel within 5 s:
/// the kernel frees them once the last descriptor and link is gone.
pub fn released(progs: &[u32]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if !progs.iter().any(|id| prog_exists(*id)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Programs loaded in the kernel now (all of the host's, not only the agent's).
pub fn prog_count() -> usize {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .ok();
    out.and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0)
}

/// One injected fault: from `from` to `to` on the poller's clock.
#[derive(Debug, Clone)]
pub struct Fault {
    pub name: &'static str,
    pub from: Duration,
    pub to: Duration,
    /// Whether a 503 is the right answer during it (and for [`RECOVERY`] after).
    pub may_503: bool,
}

/// After a fault that may make a 503 ends, how long the 503 may last: the documented
/// `recover_after` (1 s in the soak), a check round (0.5 s), and the booting spell after an
/// undrain until the backend is seen answering again, with room for a loaded 2-core host.
pub const RECOVERY: Duration = Duration::from_secs(5);

/// A 503 that no fault explains: nothing that may make one was under way at `at` or ended
/// within [`RECOVERY`] before.
pub fn wrong_503s<'a>(samples: &'a [HealthSample], faults: &[Fault]) -> Vec<&'a HealthSample> {
    samples
        .iter()
        .filter(|s| s.code == 503)
        .filter(|s| {
            !faults.iter().any(|f| {
                f.may_503 && s.at + Duration::from_millis(300) >= f.from && s.at <= f.to + RECOVERY
            })
        })
        .collect()
}

/// The agent's figures at one sample.
#[derive(Debug, Clone, Default)]
pub struct Sampled {
    pub at: Duration,
    pub proc: ProcFigures,
    /// Entries and capacity of each hash map.
    pub maps: BTreeMap<String, (u64, u32)>,
    /// Gauges of bounded lists from `/metrics`.
    pub lists: BTreeMap<String, f64>,
}

/// One figure over the run: at the start, after warm-up, at the end, and its slope after
/// warm-up (least squares, per hour).
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub start: f64,
    pub warm: f64,
    pub end: f64,
    pub max_after_warm: f64,
    pub slope_per_hour: f64,
}

impl Series {
    /// `values` (time, value) over the run; `warm_up` the end of the warm-up.
    pub fn of(name: &str, values: &[(Duration, f64)], warm_up: Duration) -> Option<Self> {
        let (first, last) = (values.first()?, values.last()?);
        let after: Vec<&(Duration, f64)> = values.iter().filter(|(t, _)| *t >= warm_up).collect();
        let warm = after.first().map_or(first.1, |v| v.1);
        let n = after.len() as f64;
        let slope_per_hour = if after.len() >= 2 {
            let mx = after.iter().map(|(t, _)| t.as_secs_f64()).sum::<f64>() / n;
            let my = after.iter().map(|(_, v)| v).sum::<f64>() / n;
            let (mut num, mut den) = (0.0, 0.0);
            for (t, v) in &after {
                let dx = t.as_secs_f64() - mx;
                num += dx * (v - my);
                den += dx * dx;
            }
            if den > 0.0 {
                num / den * 3600.0
            } else {
                0.0
            }
        } else {
            0.0
        };
        Some(Self {
            name: name.to_string(),
            start: first.1,
            warm,
            end: last.1,
            max_after_warm: after.iter().map(|(_, v)| *v).fold(warm, f64::max),
            slope_per_hour,
        })
    }

    /// The median of the last tenth of the run after warm-up: the end level, not one spike.
    pub fn end_level(values: &[(Duration, f64)], warm_up: Duration) -> f64 {
        let after: Vec<f64> = values
            .iter()
            .filter(|(t, _)| *t >= warm_up)
            .map(|(_, v)| *v)
            .collect();
        let tail = &after[after.len() - after.len().div_ceil(10).min(after.len())..];
        let mut tail = tail.to_vec();
        tail.sort_by(f64::total_cmp);
        tail.get(tail.len() / 2).copied().unwrap_or(0.0)
    }
}

/// `/health` latency from the client: (p50, p99, max) in ms.
pub fn latency_ms(timed: &[Timed]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = timed
        .iter()
        .filter(|t| t.sample.error.is_none())
        .map(|t| t.took.as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.99), ms.last().copied().unwrap_or(0.0))
}

/// A Markdown table of figures: start, warm, end level, max after warm-up, slope per hour,
/// bound and whether it held.
pub fn figures_table(rows: &[(Series, f64, String, bool)]) -> String {
    let mut out = String::from(
        "| figure | start | after warm-up | end | max after warm-up | slope per hour | bound | held |\n\
         |---|---:|---:|---:|---:|---:|---|---|\n",
    );
    for (s, end, bound, held) in rows {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:+.1} | {} | {} |",
            s.name,
            s.start,
            s.warm,
            end,
            s.max_after_warm,
            s.slope_per_hour,
            bound,
            if *held { "yes" } else { "**NO**" }
        );
    }
    out
}
