//! Bench section 11: what the agent's eBPF programs cost, by the kernel's own account
//! (its run statistics, on through `BPF_ENABLE_STATS` for each counted run), under nginx keep-alive, nginx with a new connection per request
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
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use health_agent_tests::{bpf_stats::BpfStats, free_port, Nginx, NginxOptions};

use super::{
    agent_config, cpu_seconds, harness, idle_cpu, start_nginx,
    throughput::start_puma,
    wrk::{wrk, Wrk},
};
use crate::{
    cmd,
    live::{agent_command, health, spawn_agent, start_agent},
};

mod idle;
mod programs;
mod report;

use idle::*;
use programs::*;
use report::*;

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
    let loads = loads(&nginx, pport, &cfg)?;
    let variants = variants(agent_bin, baseline);
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
        "`wrk -t2 -c{CONNS} -d{secs}s` on loopback against nginx (1 worker, 1 KiB static file) with keep-alive and with `Connection: close`, and `-c{PUMA_CONNS}` (one connection per thread) against Puma (Debian's, single mode, 8 threads, a Rack app answering 1 KiB), each wall-clock run right after {WARM_SECS} s of the same load, not counted ({secs} s is the interval of `on_suspicion`'s counting windows, and its first opens as load starts: each run holds one, as the steady state does); variants: no agent, this build with `web.socket_tracing = \"always\"` (every program attached, as before) and with `\"on_suspicion\"` (the targets are judged on it){}; {trials} trial(s). Each agent starts {} s before its runs and does two: one with the statistics off for the wall clock, paired with a run without the agent just before or after it (by turns; the builds' order also turns from trial to trial), then one with the kernel's run statistics on for the kernel's figures (`BPF_ENABLE_STATS`, whose descriptor is held for that run only, so nothing is left on whatever happens to the bench): {} s with `on_suspicion`, which then holds exactly one of its answer programs' sampling windows (1 s every 30 s) and two of its counting windows (half a second every 15 s under back-to-back keep-alive), the steady state's share, so its figure is the long-run average; {} s for the builds whose programs are attached all the time. The kernel's `run_time_ns` counts our programs' own run time, from entry to exit; the tracepoint's dispatch to them and the clock reads the statistics add are not in it. The agent's programs are the ones its process holds (program and link descriptors in /proc/<pid>/fd); counters from `bpftool -j prog show`, summed over the counted runs.\n",
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

/// The three loads: nginx keep-alive, nginx with a new connection per request, Puma.
fn loads(
    nginx: &Nginx,
    pport: u16,
    cfg: &dyn Fn(&str, u16) -> Result<PathBuf>,
) -> Result<[Load; 3]> {
    let nginx_url = format!("http://127.0.0.1:{}/index.html", nginx.port);
    Ok([
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
    ])
}

/// No agent, this build in both modes, and the baseline build when given.
fn variants(agent_bin: &Path, baseline: Option<&Path>) -> Vec<Variant> {
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
    variants
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
    let on = harness(
        "turning the kernel's run statistics on (BPF_ENABLE_STATS)",
        BpfStats::enable,
    )?;
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

#[cfg(test)]
mod tests {
    use super::{calls_per_request, full_name, socket_calls, Cell, Counted, RECV, SEND};

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
