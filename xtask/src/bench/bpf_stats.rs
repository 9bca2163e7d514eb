//! Bench section 11: what the agent's eBPF programs cost, by the kernel's own account
//! (`kernel.bpf_stats_enabled`), under nginx keep-alive, nginx with a new connection per request
//! and Puma, with no agent, this build and `--baseline-agent` alternated trial by trial; then the
//! agent's own CPU while 10,000 idle connections are held open to its backend. Also run alone by
//! `--only bpf-stats`.
//!
//! The agent's programs are the ones its process holds: program and link file descriptors in
//! /proc/<pid>/fd, whose fdinfo names the program id. (Debian's bpftool is built without the
//! `pids` feature, so its JSON cannot say who owns a program.) Names and counters come from
//! `bpftool -j prog show`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use health_agent_tests::{free_port, NginxOptions};

use super::{
    agent_config, cpu_seconds, idle_cpu, start_nginx,
    throughput::start_puma,
    wrk::{wrk, Wrk},
};
use crate::{
    cmd,
    live::{agent_command, health, spawn_agent, start_agent},
};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
const STATS_SYSCTL_C: &std::ffi::CStr = c"/proc/sys/kernel/bpf_stats_enabled";

/// The per-socket-call programs: while attached, their run counts are the host's socket calls.
const RECV: &str = "sock_recv_length";
const SEND: &str = "sock_send_length";
/// Every program the agent's object has, by its full name: the kernel keeps 15 characters of a
/// name, and an older bpftool prints only those.
const FULL_NAMES: [&str; 8] = [
    RECV,
    SEND,
    "inet_sock_set_state_raw",
    "inet_sock_set_state",
    "sys_enter_accept4",
    "sys_exit_accept4",
    "sys_enter_accept",
    "sys_exit_accept",
];
/// BPF_OBJ_NAME_LEN less its terminating NUL.
const KERNEL_NAME_LEN: usize = 15;

/// wrk's connections to nginx, as section 3 uses.
const CONNS: u32 = 50;
/// … and to Puma: as many as its threads, a pool within its capacity. (With more, the rest wait
/// in its accept queue for a free thread, hundreds of ms each: a full server, which
/// `on_suspicion` follows by design; section 11's text has that run.)
const PUMA_CONNS: u32 = 8;
const SETTLE: Duration = Duration::from_secs(2);
/// The wall-clock runs' length: the 15 s between `on_suspicion`'s counting windows under
/// back-to-back keep-alive requests. Each run follows WARM_SECS of the same load, during which
/// the first window opens, so it holds one window as the steady state does, not one per run
/// whatever its length (5 s runs held one each: three times the long-run rate).
const WALL_SECS: u32 = 15;
const WARM_SECS: u32 = 2;
/// The counted runs' length with `on_suspicion`: the longest period of its sampling (the answer
/// programs' 1 s every 30 s; the counting windows' half second every 15 s while keep-alive
/// requests come back to back). A run starting 19 s after the agent holds exactly one answer
/// window and two counting windows, the steady state's share: its average is the long-run cost.
/// (16 s runs held one answer window each: twice the long-run rate.)
const COUNTED_SECS: u32 = 30;
/// … and with every program attached all the time, where the length changes nothing.
const COUNTED_SECS_ATTACHED: u32 = 16;
const IDLE_CONNS: usize = 10_000;
/// Source addresses the idle connections are spread over, so no one address runs short of
/// ephemeral ports after the connection-per-request loads.
const IDLE_SOURCES: [[u8; 4]; 4] = [
    [127, 0, 0, 2],
    [127, 0, 0, 3],
    [127, 0, 0, 4],
    [127, 0, 0, 5],
];

/// The value bpf_stats_enabled had before the guard, for the signal handler.
static PREV_ON: AtomicBool = AtomicBool::new(false);

/// `kernel.bpf_stats_enabled` = 1 while this lives. Drop puts the previous value back, also on
/// an error or a panic unwinding through it; SIGINT and SIGTERM put it back before the process
/// dies of them, so an interrupted bench does not leave every BPF program on the host paying
/// for two clock reads per run.
struct StatsOn {
    prev: String,
    old_int: libc::sigaction,
    old_term: libc::sigaction,
}

extern "C" fn restore_and_die(sig: libc::c_int) {
    let v: &[u8] = if PREV_ON.load(Ordering::SeqCst) {
        b"1\n"
    } else {
        b"0\n"
    };
    // SAFETY: open, write, close, signal and raise are async-signal-safe.
    unsafe {
        let fd = libc::open(STATS_SYSCTL_C.as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, v.as_ptr().cast(), v.len());
            libc::close(fd);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

impl StatsOn {
    fn new() -> Result<Self> {
        let prev = fs::read_to_string(STATS_SYSCTL)
            .with_context(|| format!("reading {STATS_SYSCTL} (a kernel with BPF statistics)"))?
            .trim()
            .to_string();
        PREV_ON.store(prev != "0", Ordering::SeqCst);
        // SAFETY: a zeroed sigaction is valid; the handler only makes async-signal-safe calls.
        let (old_int, old_term) = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = restore_and_die as *const () as libc::sighandler_t;
            let (mut old_int, mut old_term) = (std::mem::zeroed(), std::mem::zeroed());
            libc::sigaction(libc::SIGINT, &sa, &mut old_int);
            libc::sigaction(libc::SIGTERM, &sa, &mut old_term);
            (old_int, old_term)
        };
        let on = Self {
            prev,
            old_int,
            old_term,
        };
        fs::write(STATS_SYSCTL, "1\n").with_context(|| format!("writing 1 to {STATS_SYSCTL}"))?;
        Ok(on)
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        if let Err(e) = fs::write(STATS_SYSCTL, format!("{}\n", self.prev)) {
            eprintln!(
                "bench: could not put {STATS_SYSCTL} back to {}: {e}",
                self.prev
            );
        }
        // SAFETY: putting back the handlers `new` replaced.
        unsafe {
            libc::sigaction(libc::SIGINT, &self.old_int, std::ptr::null_mut());
            libc::sigaction(libc::SIGTERM, &self.old_term, std::ptr::null_mut());
        }
    }
}

/// One program's counters: (run_cnt, run_time_ns).
type Counters = (u64, u64);

/// The full name of a program whose name the kernel (or an older bpftool) may have cut to 15
/// characters, among the names of the other programs in the same listing (`others`): its type
/// tells the raw from the classic state hook, and a full name another program already shows is
/// not this one's. A cut name two programs still share is given as both.
fn full_name(name: &str, kind: &str, others: &[&str]) -> String {
    if name.len() != KERNEL_NAME_LEN {
        return name.to_string();
    }
    let raw = kind == "raw_tracepoint";
    let candidates: Vec<&str> = FULL_NAMES
        .iter()
        .copied()
        // Another program showing a longer name whole has it; a 15-character one may be cut.
        .filter(|n| n.starts_with(name) && !(n.len() > KERNEL_NAME_LEN && others.contains(n)))
        .filter(|n| [RECV, SEND, "inet_sock_set_state_raw"].contains(n) == raw)
        .collect();
    match candidates.as_slice() {
        [] => format!("{name}… (cut by the kernel)"),
        [one] => one.to_string(),
        many => many.join(" or "),
    }
}

/// The ids of the programs `pid` holds: its program descriptors and the programs its link
/// descriptors attach.
fn program_ids(pid: u32) -> Result<BTreeSet<u32>> {
    let mut ids = BTreeSet::new();
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing the descriptors of process {pid}"))?;
    for fd in fds.flatten() {
        let Ok(target) = fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if !(target.contains("bpf-prog") || target.contains("bpf-link")) {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        ids.extend(info.lines().filter_map(|l| {
            l.strip_prefix("prog_id:")
                .and_then(|v| v.trim().parse::<u32>().ok())
        }));
    }
    Ok(ids)
}

/// The counters of every program `pid` holds, by full name (programs of one name summed).
fn agent_programs(pid: u32) -> Result<BTreeMap<String, Counters>> {
    let ids = program_ids(pid)?;
    let out = cmd::stdout(Command::new("bpftool").args(["-j", "prog", "show"]))
        .context("bpftool (apt-get install bpftool; cargo xtask setup does)")?;
    let progs: serde_json::Value = serde_json::from_str(&out).context("bpftool's JSON")?;
    let ours: Vec<&serde_json::Value> = progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            let id = p["id"].as_u64().unwrap_or(0) as u32;
            let owned = p["pids"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["pid"].as_u64() == Some(u64::from(pid))));
            ids.contains(&id) || owned
        })
        .collect();
    let names: Vec<&str> = ours
        .iter()
        .map(|p| p["name"].as_str().unwrap_or("?"))
        .collect();
    let mut by_name = BTreeMap::new();
    for (i, p) in ours.iter().enumerate() {
        let others: Vec<&str> = names
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, n)| *n)
            .collect();
        let name = full_name(names[i], p["type"].as_str().unwrap_or(""), &others);
        // bpftool leaves the counters out while they are zero.
        let c: &mut Counters = by_name.entry(name).or_default();
        c.0 += p["run_cnt"].as_u64().unwrap_or(0);
        c.1 += p["run_time_ns"].as_u64().unwrap_or(0);
    }
    if by_name.is_empty() {
        bail!("the agent (pid {pid}) holds no eBPF programs");
    }
    Ok(by_name)
}

fn diff(
    before: &BTreeMap<String, Counters>,
    after: &BTreeMap<String, Counters>,
) -> BTreeMap<String, Counters> {
    after
        .iter()
        .map(|(name, &(cnt, ns))| {
            let (c0, n0) = before.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                (cnt.saturating_sub(c0), ns.saturating_sub(n0)),
            )
        })
        .collect()
}

/// What the kernel counted during one measured load with an agent.
struct Counted {
    requests: u64,
    programs: BTreeMap<String, Counters>,
}

impl Counted {
    /// Host socket calls in the run, when the per-call programs fired for all of them: every
    /// request is at least one receive and one send, so fewer runs than 2 per request means
    /// they were not attached (or not for the whole run).
    fn socket_calls(&self) -> Option<u64> {
        let get = |n: &str| self.programs.get(n).map_or(0, |c| c.0);
        let calls = get(RECV) + get(SEND);
        (calls >= 2 * self.requests && self.requests > 0).then_some(calls)
    }
}

/// One (load, variant) cell across trials.
#[derive(Default)]
struct Cell {
    rps: Vec<f64>,
    /// With an agent: the run without one next to each of `rps`, same index.
    paired_none: Vec<f64>,
    counted: Vec<Counted>,
    kernel: BTreeSet<String>,
    codes: BTreeSet<u16>,
    /// The agent process's own CPU during each wall-clock run, % of a core (its programs run
    /// in the backend's and the client's system calls, not in it).
    agent_cpu: Vec<f64>,
    /// Why the programs attached during the runs other than for a counting window, as the
    /// agent's log said (`on_suspicion`).
    attached: Vec<String>,
}

struct Load {
    label: &'static str,
    url: String,
    conns: u32,
    extra: Vec<&'static str>,
    /// The agent's config watching this load's backend.
    cfg: PathBuf,
}

struct Variant {
    label: String,
    bin: Option<PathBuf>,
    /// Appended to the agent's config (`[web]` keys; empty for a build that may not know them).
    web_extra: &'static str,
    /// The targets (≤ 20 ns per socket call, the throughput ratios) are judged on this one:
    /// the mode built for a healthy backend's cost.
    judged: bool,
}

/// `cfg` with the variant's `[web]` keys appended (the config ends in its `[web]` table), as a
/// file of its own next to it.
fn variant_config(cfg: &Path, variant: &Variant, tag: &str) -> Result<PathBuf> {
    if variant.web_extra.is_empty() {
        return Ok(cfg.to_path_buf());
    }
    let path = cfg.with_extension(format!("{tag}.toml"));
    fs::write(&path, fs::read_to_string(cfg)? + variant.web_extra)?;
    Ok(path)
}

pub(super) fn run(
    agent_bin: &Path,
    baseline: Option<&Path>,
    dir: &Path,
    quick: bool,
) -> Result<String> {
    let dir = dir.join("bpf-stats");
    fs::create_dir_all(&dir)?;
    // The idle connections: 10,000 here, as many in nginx, which inherits the limit.
    super::flood::raise_own_nofile();
    // Four trials: the wall clock on two shared cores moves by several percent run to run.
    let (trials, secs, idle_secs) = if quick {
        (1, 3, 10)
    } else {
        (4, WALL_SECS, 30)
    };
    let counted_secs = |judged: bool| match (quick, judged) {
        (true, _) => secs,
        (false, true) => COUNTED_SECS,
        (false, false) => COUNTED_SECS_ATTACHED,
    };
    let nginx = start_nginx(NginxOptions {
        worker_connections: 16_384,
        // Idle connections, with or without a request, stay open for the whole window.
        http_extra: "client_header_timeout 300s;\n  keepalive_timeout 300s;".into(),
        ..NginxOptions::bench(1).file("index.html", vec![b'x'; 1024])
    })?;
    let pport = free_port();
    let puma = start_puma(&dir.join("puma"), pport)?;
    let aport = free_port();
    let cfg = |name: &str, port: u16| -> Result<PathBuf> {
        let path = dir.join(name);
        fs::write(&path, agent_config(aport, port, true))?;
        Ok(path)
    };
    let nginx_url = format!("http://127.0.0.1:{}/index.html", nginx.port);
    let loads = [
        Load {
            label: "nginx keep-alive",
            url: nginx_url.clone(),
            conns: CONNS,
            extra: vec![],
            cfg: cfg("agent-nginx.toml", nginx.port)?,
        },
        Load {
            label: "nginx new connection per request",
            url: nginx_url,
            conns: CONNS,
            extra: vec!["-H", "Connection: close"],
            cfg: cfg("agent-nginx.toml", nginx.port)?,
        },
        Load {
            label: "Puma keep-alive",
            url: format!("http://127.0.0.1:{pport}/"),
            conns: PUMA_CONNS,
            extra: vec![],
            cfg: cfg("agent-puma.toml", pport)?,
        },
    ];
    let mut variants = vec![
        Variant {
            label: "no agent".into(),
            bin: None,
            web_extra: "",
            judged: false,
        },
        Variant {
            label: "this build, socket_tracing = \"always\"".into(),
            bin: Some(agent_bin.to_path_buf()),
            web_extra: "socket_tracing = \"always\"\n",
            judged: false,
        },
        Variant {
            label: "this build, socket_tracing = \"on_suspicion\"".into(),
            bin: Some(agent_bin.to_path_buf()),
            web_extra: "socket_tracing = \"on_suspicion\"\n",
            judged: true,
        },
    ];
    if let Some(b) = baseline {
        variants.push(Variant {
            label: "baseline build".into(),
            bin: Some(b.to_path_buf()),
            web_extra: "",
            judged: false,
        });
    }
    let mut cells: Vec<Vec<Cell>> = loads
        .iter()
        .map(|_| variants.iter().map(|_| Cell::default()).collect())
        .collect();
    let log = dir.join("agent.log");
    let agents = variants.len() - 1;
    for trial in 0..trials {
        for (li, load) in loads.iter().enumerate() {
            let load_for = |secs| wrk(&load.url, load.conns, secs, &load.extra, None);
            // Warmed up by the same load, discarded (see WALL_SECS).
            let run = || load_for(WARM_SECS).and_then(|_| load_for(secs));
            let counted = |judged| load_for(counted_secs(judged));
            // Each agent run has a run without the agent right next to it, before or after by
            // turns, and the builds' order turns from trial to trial: the machine's other load
            // comes and goes over tens of seconds, and pairs this close mostly share it.
            for k in 0..agents {
                let vi = 1 + (k + trial) % agents;
                let variant = &variants[vi];
                let Some(bin) = &variant.bin else {
                    continue;
                };
                let none_first = (trial + k) % 2 == 0;
                let mut none = if none_first { Some(run()?.rps) } else { None };
                let cfg = variant_config(&load.cfg, variant, &format!("v{vi}"))?;
                // At `info`, as a service runs it: its log says when and why the programs
                // attached.
                let agent = spawn_agent(
                    &mut agent_command(bin, &cfg, &log, "info")?,
                    &log,
                    aport,
                    Duration::from_secs(20),
                )?;
                // Past the agent's start-up work: the steady state is what a backend lives with.
                thread::sleep(SETTLE);
                // Wall clock with the statistics off: they cost every program two clock reads.
                load_for(WARM_SECS)?;
                let c0 = super::cpu_seconds(agent.pid());
                let w = load_for(secs)?;
                let c1 = super::cpu_seconds(agent.pid());
                let counted = counted_run(agent.pid(), || counted(variant.judged))?;
                let attached = suspicions(&log);
                for why in &attached {
                    println!("bench:   the programs attached: {why}");
                }
                let (code, body) = health(aport)?;
                drop(agent);
                let none = match none.take() {
                    Some(n) => n,
                    None => run()?.rps,
                };
                let ns: u64 = counted.programs.values().map(|c| c.1).sum();
                println!(
                    "bench: bpf stats, trial {}, {}, {}: {:.0} req/s, without an agent {none:.0} req/s ({:.3}x); counted run {} requests, {} socket calls, programs {ns} ns; /health {code}",
                    trial + 1,
                    load.label,
                    variant.label,
                    w.rps,
                    w.rps / none,
                    counted.requests,
                    counted
                        .socket_calls()
                        .map_or("not counted".into(), |c| c.to_string()),
                );
                cells[li][0].rps.push(none);
                let cell = &mut cells[li][vi];
                cell.rps.push(w.rps);
                cell.paired_none.push(none);
                cell.counted.push(counted);
                cell.codes.insert(code);
                cell.kernel.insert(kernel_mode(&body));
                if let (Some(a), Some(b)) = (c0, c1) {
                    cell.agent_cpu.push((b - a) / f64::from(secs) * 100.0);
                }
                cell.attached.extend(attached);
            }
        }
    }
    drop(puma);
    let mut md = String::from("\n## 11. What the programs cost, by the kernel's own account\n\n");
    let _ = writeln!(
        md,
        "Produced by `cargo xtask bench --only bpf-stats{}{}` (or as part of `cargo xtask bench`), {}.\n",
        if quick { " --quick" } else { "" },
        baseline.map_or(String::new(), |b| format!(" --baseline-agent {}", b.display())),
        super::time_now()
    );
    let _ = writeln!(
        md,
        "`wrk -t2 -c{CONNS} -d{secs}s` on loopback against nginx (1 worker, 1 KiB static file) with keep-alive and with `Connection: close`, and `-c{PUMA_CONNS}` (one connection per thread) against Puma (Debian's, single mode, 8 threads, a Rack app answering 1 KiB), each wall-clock run right after {WARM_SECS} s of the same load, not counted ({secs} s is the interval of `on_suspicion`'s counting windows, and its first opens as load starts: each run holds one, as the steady state does); variants: no agent, this build with `web.socket_tracing = \"always\"` (every program attached, as before) and with `\"on_suspicion\"` (the targets are judged on it){}; {trials} trial(s). Each agent starts {} s before its runs and does two: one with the statistics off for the wall clock, paired with a run without the agent just before or after it (by turns; the builds' order also turns from trial to trial), then one with `kernel.bpf_stats_enabled = 1` for the kernel's figures (the sysctl goes back to its previous value after each): {} s with `on_suspicion`, which then holds exactly one of its answer programs' sampling windows (1 s every 30 s) and two of its counting windows (half a second every 15 s under back-to-back keep-alive), the steady state's share, so its figure is the long-run average; {} s for the builds whose programs are attached all the time. The kernel's `run_time_ns` counts our programs' own run time, from entry to exit; the tracepoint's dispatch to them and the clock reads the statistics add are not in it. The agent's programs are the ones its process holds (program and link descriptors in /proc/<pid>/fd); counters from `bpftool -j prog show`, summed over the counted runs.\n",
        baseline.map_or(String::new(), |b| format!(", and the baseline build `{}`", b.display())),
        SETTLE.as_secs(),
        counted_secs(true),
        counted_secs(false)
    );
    md.push_str(&summary(&loads, &variants, &cells));
    md.push_str(&per_program(&loads, &variants, &cells));
    println!("bench: {IDLE_CONNS} idle connections, {idle_secs} s per build");
    md.push_str(&idle_connections(
        &variants, nginx.port, aport, &dir, idle_secs,
    )?);
    drop(nginx);
    Ok(md)
}

/// Why an `on_suspicion` agent attached its programs outside counting windows, one entry per
/// time, from its log (at `info`).
pub(super) fn suspicions(log: &Path) -> Vec<String> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("following every connection"))
        .map(|l| l.split_once(": ").map_or(l, |(_, w)| w).trim().to_string())
        .collect()
}

/// The kernel's counters of the agent `pid`'s programs over one `load`, with the statistics on
/// only for it.
fn counted_run(pid: u32, load: impl FnOnce() -> Result<Wrk>) -> Result<Counted> {
    let on = StatsOn::new()?;
    let before = agent_programs(pid)?;
    let w = load()?;
    let after = agent_programs(pid)?;
    drop(on);
    if w.requests == 0 {
        bail!("wrk counted no requests");
    }
    Ok(Counted {
        requests: w.requests,
        programs: diff(&before, &after),
    })
}

/// `details.web.kernel`'s state, and its mode when the build reports one.
fn kernel_mode(body: &serde_json::Value) -> String {
    let k = &body["details"]["web"]["kernel"];
    let state = k["state"].as_str().unwrap_or("?");
    match k["mode"].as_str() {
        Some(mode) => format!("{state}, {mode}"),
        None => state.to_string(),
    }
}

/// Socket calls per request of `load` (index `li`), from the counted runs in which the
/// per-call programs were attached, of any variant: for runs where they were not.
fn calls_per_request(cells: &[Cell]) -> Option<f64> {
    let (calls, requests) = cells
        .iter()
        .flat_map(|c| &c.counted)
        .filter_map(|r| r.socket_calls().map(|c| (c, r.requests)))
        .fold((0u64, 0u64), |(a, b), (c, r)| (a + c, b + r));
    (requests > 0).then(|| calls as f64 / requests as f64)
}

/// A cell's socket calls over its counted runs, and in how many of them they were derived.
fn socket_calls(cell: &Cell, per_request: Option<f64>) -> Option<(f64, usize)> {
    let mut total = 0.0;
    let mut derived = 0;
    for r in &cell.counted {
        match r.socket_calls() {
            Some(c) => total += c as f64,
            None => {
                total += r.requests as f64 * per_request?;
                derived += 1;
            }
        }
    }
    (!cell.counted.is_empty()).then_some((total, derived))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The mean of `v` and the half-width of its 95 % confidence interval (Student's t, the
/// trials being few); None for fewer than two values.
pub(super) fn interval95(v: &[f64]) -> Option<(f64, f64)> {
    // t at 0.975 for 1 to 9 degrees of freedom; past that, 2.2 is within 5 % of it.
    const T: [f64; 9] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26];
    let n = v.len();
    if n < 2 {
        return None;
    }
    let m = mean(v);
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
    let t = T.get(n - 2).copied().unwrap_or(2.2);
    Some((m, t * (var / n as f64).sqrt()))
}

fn summary(loads: &[Load], variants: &[Variant], cells: &[Vec<Cell>]) -> String {
    let mut attached = Vec::new();
    let mut md = String::from("| load | agent | req/s (wall clock) | ratio to its paired runs without an agent | spread of the pairs | socket calls per request | all programs, ns per socket call | the agent process's own CPU during the load, % of a core | /health, `details.web.kernel` |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut verdicts = Vec::new();
    for (li, load) in loads.iter().enumerate() {
        let per_request = calls_per_request(&cells[li]);
        for (vi, variant) in variants.iter().enumerate() {
            let cell = &cells[li][vi];
            let rps = mean(&cell.rps);
            let ratio_of_means = rps / mean(&cell.paired_none);
            let mut ratios: Vec<f64> = cell
                .rps
                .iter()
                .zip(&cell.paired_none)
                .map(|(a, b)| a / b)
                .collect();
            let pairs = interval95(&ratios);
            let (ratio, spread) = if vi == 0 {
                ("—".to_string(), "—".to_string())
            } else {
                (
                    format!("**{ratio_of_means:.3}×**"),
                    format!(
                        "{:.3}–{:.3}, median {:.3}{}",
                        ratios.iter().cloned().fold(f64::MAX, f64::min),
                        ratios.iter().cloned().fold(0.0, f64::max),
                        super::median(&mut ratios),
                        pairs.map_or(String::new(), |(m, h)| format!(
                            "; mean {m:.3} ± {h:.3} (95 %)"
                        ))
                    ),
                )
            };
            let (calls, ns) = match socket_calls(cell, per_request) {
                Some((calls, derived)) => {
                    let requests: u64 = cell.counted.iter().map(|r| r.requests).sum();
                    let ns: u64 = cell
                        .counted
                        .iter()
                        .flat_map(|r| r.programs.values())
                        .map(|c| c.1)
                        .sum();
                    let per_call = ns as f64 / calls;
                    if variant.judged {
                        verdicts.push((
                            load.label,
                            Some(per_call),
                            ratio_of_means,
                            pairs,
                            cell.codes.iter().all(|&c| c == 200),
                        ));
                    }
                    (
                        format!(
                            "{:.2}{}",
                            calls / requests.max(1) as f64,
                            if derived > 0 {
                                format!(" (derived in {derived} of {} runs: their requests × this load's socket calls per request, counted with the per-call programs attached in this bench run)", cell.counted.len())
                            } else {
                                " (counted: run_cnt of sock_recv_length + sock_send_length)".into()
                            }
                        ),
                        format!("**{per_call:.1}**"),
                    )
                }
                None if vi == 0 => ("—".into(), "0 (nothing loaded)".into()),
                None => {
                    if variant.judged {
                        verdicts.push((
                            load.label,
                            None,
                            ratio_of_means,
                            pairs,
                            cell.codes.iter().all(|&c| c == 200),
                        ));
                    }
                    (
                        "not known: no run had the per-call programs attached".into(),
                        "—".into(),
                    )
                }
            };
            let health = if vi == 0 {
                "—".to_string()
            } else {
                format!(
                    "{} / {}",
                    cell.codes
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    cell.kernel.iter().cloned().collect::<Vec<_>>().join("; ")
                )
            };
            let cpu = if cell.agent_cpu.is_empty() {
                "—".to_string()
            } else {
                format!("{:.2} %", mean(&cell.agent_cpu))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {rps:.0} | {ratio} | {spread} | {calls} | {ns} | {cpu} | {health} |",
                load.label, variant.label
            );
            if variant.judged && !cell.attached.is_empty() {
                attached.push(format!("{}: {}", load.label, cell.attached.join("; ")));
            }
        }
    }
    let mut ok = true;
    let mut lines = Vec::new();
    for &(label, per_call, ratio, pairs, all_200) in &verdicts {
        let want = if label.contains("new connection") {
            Some(0.98)
        } else if label.starts_with("nginx") {
            Some(0.99)
        } else {
            None
        };
        let good =
            per_call.is_some_and(|n| n <= 20.0) && want.is_none_or(|w| ratio >= w) && all_200;
        ok &= good;
        lines.push(format!(
            "{label}: {}{}{} {}",
            per_call.map_or("ns per socket call not known".into(), |n| format!(
                "{n:.1} ns per socket call"
            )),
            want.map_or(String::new(), |w| format!(
                ", {ratio:.3}× (≥ {w}×{})",
                pairs.map_or(String::new(), |(m, h)| format!(
                    "; the pairs' mean {m:.3} ± {h:.3} {}",
                    if m - h >= w {
                        "resolves it"
                    } else if m + h < w {
                        "falls short"
                    } else {
                        "does not resolve it"
                    }
                ))
            )),
            if all_200 { "" } else { ", /health was not 200" },
            if good { "✓" } else { "✗" }
        ));
    }
    ok &= !verdicts.is_empty();
    let _ = writeln!(
        md,
        "\nTargets for this build (issue 21): ≤ 20 ns of the agent's programs per socket call on every load; nginx keeps ≥ 0.99× keep-alive and ≥ 0.98× new-connection throughput. {}: {}\n",
        if ok { "Met ✓" } else { "Not met ✗" },
        lines.join("; ")
    );
    println!("bench: bpf stats targets: {}", lines.join("; "));
    let _ = writeln!(
        md,
        "The programs of the judged build attached on a suspicion (not a counting window) during these runs: {}\n",
        if attached.is_empty() {
            "never".to_string()
        } else {
            attached.join("; ")
        }
    );
    md
}

fn per_program(loads: &[Load], variants: &[Variant], cells: &[Vec<Cell>]) -> String {
    let mut md = String::from("Per program, summed over the counted runs (runs per socket call: the program's run_cnt over the socket calls of the same runs):\n\n| load | agent | program | run_cnt | run_time_ns | ns per run | runs per socket call |\n|---|---|---|---|---|---|---|\n");
    for (li, load) in loads.iter().enumerate() {
        let per_request = calls_per_request(&cells[li]);
        for (vi, variant) in variants.iter().enumerate().skip(1) {
            let cell = &cells[li][vi];
            let mut sums: BTreeMap<&str, Counters> = BTreeMap::new();
            for r in &cell.counted {
                for (name, c) in &r.programs {
                    let s = sums.entry(name).or_default();
                    s.0 += c.0;
                    s.1 += c.1;
                }
            }
            let calls = socket_calls(cell, per_request).map(|c| c.0);
            let idle: Vec<&str> = sums
                .iter()
                .filter(|(_, c)| c.0 == 0)
                .map(|(n, _)| *n)
                .collect();
            if !idle.is_empty() {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | 0 | 0 | — (loaded, did not run) | 0 |",
                    load.label,
                    variant.label,
                    idle.join(", ")
                );
            }
            for (name, (cnt, ns)) in sums.into_iter().filter(|(_, c)| c.0 > 0) {
                let _ = writeln!(
                    md,
                    "| {} | {} | {name} | {cnt} | {ns} | {:.1} | {} |",
                    load.label,
                    variant.label,
                    ns as f64 / cnt as f64,
                    calls.map_or("—".into(), |c| format!("{:.3}", cnt as f64 / c)),
                );
            }
        }
    }
    md
}

/// The agent's own CPU and its programs' kernel time while IDLE_CONNS idle connections are held
/// open to nginx, per agent variant: connections that never sent anything (pre-opened by a
/// proxy, or a slow client), and keep-alive connections idle after one answered request.
fn idle_connections(
    variants: &[Variant],
    nport: u16,
    aport: u16,
    dir: &Path,
    secs: u64,
) -> Result<String> {
    let cfg = dir.join("agent-idle.toml");
    fs::write(&cfg, agent_config(aport, nport, true))?;
    let mut rows = String::new();
    let mut verdicts = Vec::new();
    for (vi, variant) in variants.iter().enumerate() {
        let Some(bin) = &variant.bin else { continue };
        let vcfg = variant_config(&cfg, variant, &format!("v{vi}"))?;
        let agent = start_agent(bin, &vcfg, &dir.join("agent-idle.log"), aport)?;
        thread::sleep(SETTLE);
        let pid = agent.pid();
        // The same window with no connections held: what the connections add to it.
        let bare = idle_cpu(pid, secs);
        println!(
            "bench: {}: agent {bare:.2} % of a core with no connections held",
            variant.label
        );
        let _ = writeln!(
            rows,
            "| {} | none | — | **{bare:.2} %** | — | — |",
            variant.label
        );
        for (kind, request) in [
            ("never sent a byte", false),
            ("keep-alive, idle after one answered request", true),
        ] {
            let t0 = Instant::now();
            let (held, failed) = hold(nport, IDLE_CONNS, request);
            println!(
                "bench: {} idle connections ({kind}) open, {failed} failed, in {:.1} s; measuring {} for {secs} s",
                held.len(),
                t0.elapsed().as_secs_f64(),
                variant.label
            );
            // The agent has seen them arrive; what is measured is the steady state of holding
            // them.
            thread::sleep(Duration::from_secs(3));
            let (cpu, prog_ns) = {
                let on = StatsOn::new()?;
                let before = agent_programs(pid)?;
                let c0 = cpu_seconds(pid).context("the agent's schedstat")?;
                thread::sleep(Duration::from_secs(secs));
                let c1 = cpu_seconds(pid).context("the agent's schedstat")?;
                let after = agent_programs(pid)?;
                drop(on);
                let ns: u64 = diff(&before, &after).values().map(|c| c.1).sum();
                ((c1 - c0) / secs as f64 * 100.0, ns)
            };
            let open = still_open(&held);
            let (code, body) = health(aport)?;
            drop(held);
            let prog_pct = prog_ns as f64 / (secs as f64 * 1e9) * 100.0;
            let counters = &body["details"]["web"]["counters"];
            let seen = format!(
                "{code}, `{}`; waiting {}, pending {}, accept() traced {}",
                body["checks"]["webserver"].as_str().unwrap_or("?"),
                counters["waiting"],
                counters["pending"],
                counters["accepts_traced"]
            );
            let following = &body["details"]["web"]["kernel"]["following"];
            if body["checks"]["webserver"] != "up"
                || (following["attached"] == true && following["mode"] == "on_suspicion")
            {
                println!(
                    "bench: {} ({kind}): /health says {}; kernel view {}",
                    variant.label,
                    body["details"]["web"]["detail"],
                    body["details"]["web"]["kernel"]
                );
                // What the kernel said of the connections read as holding work, before they
                // close: tcp_info as `ss` prints it.
                for l in ss_with_work(nport) {
                    println!("bench:   ss: {l}");
                }
            }
            println!(
                "bench: {} ({kind}): agent {cpu:.2} % of a core, programs {prog_pct:.4} %, {open} of {IDLE_CONNS} still open; /health {seen}",
                variant.label
            );
            let _ = writeln!(
                rows,
                "| {} | {kind} | {open} of {IDLE_CONNS} | **{cpu:.2} %** | {prog_pct:.4} % | {seen} |",
                variant.label,
            );
            if variant.judged {
                verdicts.push(format!(
                    "{kind}: {cpu:.2} % {}",
                    if cpu < 2.0 { "✓" } else { "✗" }
                ));
            }
            // The closes pass before the next window.
            thread::sleep(Duration::from_secs(3));
        }
        drop(agent);
    }
    let mut md =
        String::from("\n### The agent's own CPU while 10,000 idle connections are held open\n\n");
    let _ = writeln!(
        md,
        "The agent watching nginx (1 worker, 16,384 worker connections). First {secs} s with no connections held; then {IDLE_CONNS} connections from 127.0.0.2–5, held for 3 s and then a {secs} s window, twice: connections that never send a byte, then keep-alive connections idle after one answered request. The agent's CPU time from the scheduler's account (/proc/<pid>/task/*/schedstat), its programs' `run_time_ns` over the same window, and what `/health` said at its end (`details.web.counters`). \"Still open\": a non-blocking read on each at the end would block (nginx had not closed it).\n"
    );
    md.push_str("| agent | idle connections | still open at the end | agent CPU, % of a core | its programs, % of a core | /health at the end |\n|---|---|---|---|---|---|\n");
    md.push_str(&rows);
    if !verdicts.is_empty() {
        let _ = writeln!(
            md,
            "\nTarget: this build < 2 % of a core while they are held: {}\n",
            verdicts.join("; ")
        );
    }
    println!(
        "bench: idle connections, this build: {}",
        verdicts.join("; ")
    );
    Ok(md)
}

/// `ss -tin` of the port's established connections that hold unread bytes or a receive later
/// than their last send (at most 5), each as its two lines joined.
fn ss_with_work(port: u16) -> Vec<String> {
    let out = match Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ])
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return vec![format!("ss: {e}")],
    };
    let field = |info: &str, key: &str| -> Option<u64> {
        info.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    let mut found = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(head) = lines.next() {
        let info = match lines.peek() {
            Some(l) if l.starts_with(char::is_whitespace) => lines.next().unwrap_or_default(),
            _ => "",
        };
        let unread = head
            .split_whitespace()
            .next()
            .and_then(|q| q.parse::<u64>().ok())
            .unwrap_or(0);
        let later = match (field(info, "lastrcv:"), field(info, "lastsnd:")) {
            (Some(r), Some(s)) => r < s,
            (Some(_), None) => true,
            _ => false,
        };
        if unread > 0 || later {
            found.push(format!("{} | {}", head.trim(), info.trim()));
            if found.len() == 5 {
                break;
            }
        }
    }
    found
}

/// `n` connections to 127.0.0.1:`port`, spread over IDLE_SOURCES; with `request`, each has one
/// request answered first. Those that failed are counted.
fn hold(port: u16, n: usize, request: bool) -> (Vec<TcpStream>, usize) {
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for i in 0..n {
        let from = IDLE_SOURCES[i % IDLE_SOURCES.len()];
        let conn = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .and_then(|s| {
                s.bind(&SocketAddr::from((from, 0)).into())?;
                s.connect_timeout(&to.into(), Duration::from_secs(1))?;
                Ok(TcpStream::from(s))
            });
        match conn {
            Ok(s) => held.push(s),
            Err(_) => failed += 1,
        }
    }
    if request {
        // All requests first, then the answers: nginx serves them while the rest are written.
        let req = b"GET /index.html HTTP/1.1\r\nHost: idle\r\n\r\n";
        held.retain(|s| {
            let ok = (&*s).write_all(req).is_ok();
            failed += usize::from(!ok);
            ok
        });
        held.retain(|s| {
            let ok = read_answer(s).is_ok();
            failed += usize::from(!ok);
            ok
        });
    }
    (held, failed)
}

/// Reads one HTTP answer with a Content-Length body off `s`.
fn read_answer(mut s: &TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            if body.len() >= len {
                return Ok(());
            }
        }
    }
}

/// How many of `conns` the server has not closed: a non-blocking read would block.
fn still_open(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|&s| {
            let mut r: &TcpStream = s;
            s.set_nonblocking(true).is_ok()
                && matches!(r.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::{
        calls_per_request, full_name, interval95, socket_calls, Cell, Counted, RECV, SEND,
    };

    #[test]
    fn the_pairs_interval_widens_with_their_spread_and_needs_two() {
        assert_eq!(interval95(&[0.98]), None);
        let (m, h) = interval95(&[0.99, 1.01, 0.99, 1.01]).unwrap();
        assert!((m - 1.0).abs() < 1e-9);
        // s = 0.01155, n = 4, t(3) = 3.18: 3.18 × 0.01155 / 2.
        assert!((h - 0.01836).abs() < 1e-4, "{h}");
        let (_, wide) = interval95(&[0.9, 1.1, 0.9, 1.1]).unwrap();
        assert!(wide > 9.0 * h);
    }

    fn run(requests: u64, recv: u64, send: u64, state: u64) -> Counted {
        Counted {
            requests,
            programs: [
                (RECV.to_string(), (recv, recv * 100)),
                (SEND.to_string(), (send, send * 100)),
                ("inet_sock_set_state_raw".to_string(), (state, state * 100)),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn socket_calls_are_counted_while_the_per_call_programs_run_and_derived_when_not() {
        let attached = Cell {
            counted: vec![run(1000, 2000, 2000, 10), run(500, 1000, 1000, 0)],
            ..Cell::default()
        };
        // A build that keeps the per-call programs detached while healthy: they ran for a few
        // calls only (fewer than two per request), so the host's calls are not theirs to count.
        let detached = Cell {
            counted: vec![run(2000, 3, 3, 40)],
            ..Cell::default()
        };
        let cells = [Cell::default(), attached, detached];
        let per_request = calls_per_request(&cells);
        assert_eq!(per_request, Some(4.0));
        assert_eq!(socket_calls(&cells[1], per_request), Some((6000.0, 0)));
        assert_eq!(socket_calls(&cells[2], per_request), Some((8000.0, 1)));
        // Nothing to derive from: not known, rather than a guess.
        assert_eq!(
            socket_calls(&cells[2], calls_per_request(&cells[2..])),
            None
        );
        assert_eq!(socket_calls(&cells[0], per_request), None);
    }

    #[test]
    fn names_cut_by_the_kernel_map_back_to_the_programs() {
        let raw = "raw_tracepoint";
        let tp = "tracepoint";
        assert_eq!(full_name("sock_recv_lengt", raw, &[]), "sock_recv_length");
        assert_eq!(full_name("sock_send_lengt", raw, &[]), "sock_send_length");
        assert_eq!(
            full_name("inet_sock_set_s", raw, &[]),
            "inet_sock_set_state_raw"
        );
        assert_eq!(full_name("inet_sock_set_s", tp, &[]), "inet_sock_set_state");
        // Whole names (a newer bpftool reads them from BTF) stay as they are.
        assert_eq!(
            full_name("inet_sock_set_state_raw", raw, &[]),
            "inet_sock_set_state_raw"
        );
        // A bpftool that shows whole names: the 15-character one is the program of that name.
        assert_eq!(
            full_name("sys_exit_accept", tp, &["sys_exit_accept4"]),
            "sys_exit_accept"
        );
        // Both cut alike: say so rather than guess.
        assert_eq!(
            full_name("sys_exit_accept", tp, &["sys_exit_accept"]),
            "sys_exit_accept4 or sys_exit_accept"
        );
        assert_eq!(
            full_name("sys_enter_accep", tp, &["sys_enter_accep"]),
            "sys_enter_accept4 or sys_enter_accept"
        );
        assert_eq!(
            full_name("some_other_prog", raw, &[]),
            "some_other_prog… (cut by the kernel)"
        );
        assert_eq!(full_name("other", raw, &[]), "other");
    }
}
