//! Bench section 12: section 11's wall clock by alternation. One `on_suspicion` agent runs and
//! is stopped (SIGSTOP) by turns, for one-second runs of the same load. Runs 15 s apart share
//! the machine's drift poorly on two shared cores (nginx alone moves by ±10 % from one to the
//! next); runs one second apart share most of it, and enough pairs resolve a 1 % difference.
//! nginx runs on the second CPU and wrk on the first, the agent where the scheduler puts it:
//! left to the scheduler, where the three land moves one-second runs by 10 %; pinned, by 5 %.
//!
//! Stopped is as good as absent only while no program is attached: detached, the agent's
//! loaded programs run nowhere. So the agent is stopped only while it holds as many links as it
//! did when `/health` said it was detached; one caught in a counting window (or attached on a
//! suspicion) is let run until it detaches. Counting windows come every 15 s of wall time and
//! open at the first tick past due, which is in a running second: the running seconds hold
//! about twice the steady state's share of them, so the cost measured is an upper bound.

use std::{fmt::Write as _, fs, path::Path, thread, time::Duration};

use anyhow::{bail, Result};
use health_agent_tests::{free_port, NginxOptions};

use super::{
    agent_config,
    bpf_stats::suspicions,
    kill, start_nginx,
    stats::interval95,
    wrk::{wrk_on_cpu, Wrk},
};
use crate::live::{agent_command, health, spawn_agent};

const RUN_SECS: u32 = 1;
const CONNS: u32 = 50;
/// Pairs per load: about 2.5 s each with the stops' waits; at 5 % per pair, 200 resolve about
/// 0.7 %.
const PAIRS: usize = 200;
/// wrk's CPU; nginx gets the next one.
const WRK_CPU: usize = 0;
const NGINX_CPU: usize = 1;
/// How long a stop waits for the agent to detach (a suspicion keeps it attached 30 s).
const DETACH_WITHIN: Duration = Duration::from_secs(40);

/// Link descriptors the process holds (`anon_inode:bpf-link`): one per attached program.
fn links(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
        fds.flatten()
            .filter(|fd| {
                fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("bpf-link"))
            })
            .count()
    })
}

/// Keeps `pid` (one thread: an nginx worker is one) on CPU `cpu`.
#[allow(unsafe_code)]
fn pin(pid: u32, cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set, CPU_SET writes inside it, and
    // sched_setaffinity reads it for its size.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(
            pid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ) == 0
    };
    if !ok {
        bail!(
            "pinning process {pid} to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// SIGCONT on drop: an agent left stopped would outlive the bench's SIGTERM.
struct Stopped(u32);

impl Stopped {
    /// Stops `pid` once it holds `detached` links, within DETACH_WITHIN.
    fn when_detached(pid: u32, detached: usize) -> Result<Self> {
        let deadline = std::time::Instant::now() + DETACH_WITHIN;
        loop {
            if links(pid) == detached {
                kill(pid, libc::SIGSTOP);
                let s = Stopped(pid);
                // It may have attached between the count and the stop.
                if links(pid) == detached {
                    return Ok(s);
                }
            }
            if std::time::Instant::now() > deadline {
                bail!("the agent stayed attached for {DETACH_WITHIN:?}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// One load's pairs: (running, stopped) requests per second.
struct Pairs {
    label: &'static str,
    runs: Vec<(f64, f64)>,
    /// Why the agent attached outside counting windows, from its log.
    attached: Vec<String>,
}

impl Pairs {
    fn ratios(&self) -> Vec<f64> {
        self.runs.iter().map(|(a, b)| a / b).collect()
    }
}

/// Section 12: nginx (1 worker, 1 KiB static file) with keep-alive and with a new connection
/// per request, each against its target.
pub(super) fn run(agent_bin: &Path, dir: &Path, quick: bool) -> Result<String> {
    let dir = dir.join("alternate");
    fs::create_dir_all(&dir)?;
    let pairs = if quick { 4 } else { PAIRS };
    let nginx = start_nginx(NginxOptions::bench(1).file("index.html", vec![b'x'; 1024]))?;
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        bail!("the alternation runs nginx and wrk on CPUs of their own: {cpus} CPU here");
    }
    for pid in nginx.pids() {
        pin(pid, NGINX_CPU)?;
    }
    let aport = free_port();
    let cfg = dir.join("agent.toml");
    fs::write(
        &cfg,
        agent_config(aport, nginx.port, true) + "socket_tracing = \"on_suspicion\"\n",
    )?;
    let url = format!("http://127.0.0.1:{}/index.html", nginx.port);
    let mut results = Vec::new();
    for (i, (label, extra, want)) in [
        ("nginx keep-alive", &[][..], 0.99),
        (
            "nginx new connection per request",
            &["-H", "Connection: close"][..],
            0.98,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let log = dir.join(format!("agent-{i}.log"));
        let p = alternate(
            label,
            agent_bin,
            &cfg,
            &log,
            aport,
            (&url, CONNS, extra),
            pairs,
        )?;
        results.push((p, want));
    }
    drop(nginx);
    let mut md =
        String::from("\n## 12. What `on_suspicion` costs nginx in wall clock, by alternation\n\n");
    let _ = writeln!(
        md,
        "Produced by `cargo xtask bench --only alternation{}` (or as part of `cargo xtask bench`), {}.\n",
        if quick { " --quick" } else { "" },
        super::time_now()
    );
    md += &section(&results, pairs);
    Ok(md)
}

/// `pairs` alternations of `url` (extra wrk arguments `extra`, `conns` connections) with the
/// agent `bin` (config `cfg`, health port `aport`) running and stopped, in turns of order.
fn alternate(
    label: &'static str,
    bin: &Path,
    cfg: &Path,
    log: &Path,
    aport: u16,
    (url, conns, extra): (&str, u32, &[&str]),
    pairs: usize,
) -> Result<Pairs> {
    let agent = spawn_agent(
        &mut agent_command(bin, cfg, log, "info")?,
        log,
        aport,
        Duration::from_secs(20),
    )?;
    let pid = agent.pid();
    let run = || -> Result<Wrk> { wrk_on_cpu(WRK_CPU, url, conns, RUN_SECS, extra) };
    // Past start-up and the first counting window, then the links of the detached state.
    wrk_on_cpu(WRK_CPU, url, conns, 2, extra)?;
    let deadline = std::time::Instant::now() + DETACH_WITHIN;
    loop {
        let (_, body) = health(aport)?;
        if body["details"]["web"]["kernel"]["following"]["attached"] == false {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the agent did not detach: {}",
                body["details"]["web"]["kernel"]
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let detached = links(pid);
    let mut runs = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let (mut on, mut off) = (0.0, 0.0);
        for stopped in [i % 2 == 0, i % 2 != 0] {
            if stopped {
                let _s = Stopped::when_detached(pid, detached)?;
                off = run()?.rps;
            } else {
                on = run()?.rps;
            }
        }
        runs.push((on, off));
    }
    drop(agent);
    let p = Pairs {
        label,
        runs,
        attached: suspicions(log),
    };
    if let Some((m, h)) = interval95(&p.ratios()) {
        println!(
            "bench: by alternation, {label}: running / stopped {m:.4} ± {h:.4} over {} pairs",
            p.runs.len()
        );
    }
    Ok(p)
}

/// The table of `results` and each nginx load's verdict against its target (`want`).
fn section(results: &[(Pairs, f64)], pairs: usize) -> String {
    let mut md = format!(
        "One `on_suspicion` agent of this build watching nginx, running and stopped (SIGSTOP) by turns for {RUN_SECS}-second `wrk -t2 -c50` runs, {pairs} pairs per load, the order turning from pair to pair: runs a second apart share the drift that runs 15 s apart do not. nginx (1 worker, 1 KiB static file) is pinned to CPU {NGINX_CPU} and wrk to CPU {WRK_CPU}, the agent left to the scheduler: unpinned, where the three land moves one-second runs by about 10 %, pinned by about 5 %. The agent is stopped only while it holds no more bpf links than when `/health` said it was detached (a counting window or a suspicion is waited out), so a stopped agent costs the backend nothing, as no agent would. Counting windows fall due every 15 s of wall time and open in a running second: the running seconds hold about twice their steady share, so the cost measured is an upper bound.\n\n| load | pairs | running / stopped, mean of the pairs | 95 % interval | spread | target | the programs attached on a suspicion |\n|---|---|---|---|---|---|---|\n"
    );
    let mut lines = Vec::new();
    for (p, want) in results {
        let mut r = p.ratios();
        let Some((m, h)) = interval95(&r) else {
            continue;
        };
        r.sort_by(f64::total_cmp);
        let verdict = if m - h >= *want {
            "met, resolved ✓"
        } else if m >= *want {
            "met, not resolved"
        } else {
            "not met ✗"
        };
        lines.push(format!("{}: {m:.4} ± {h:.4}, {verdict}", p.label));
        md += &format!(
            "| {} | {} | **{m:.4}×** | {:.4}–{:.4} | {:.3}–{:.3} | ≥ {want}×: {verdict} | {} |\n",
            p.label,
            r.len(),
            m - h,
            m + h,
            r[0],
            r[r.len() - 1],
            if p.attached.is_empty() {
                "never".to_string()
            } else {
                p.attached.join("; ")
            }
        );
    }
    println!("bench: by alternation: {}", lines.join("; "));
    md.push('\n');
    md
}
