//! The shipped unit under real systemd: a Debian 12 system booted with `systemd-nspawn -b`
//! (tests/src/nspawn.rs says how and why), the .deb from `cargo xtask package` installed inside,
//! and the agent driven through `systemctl` and `journalctl` there — start through `Type=notify`,
//! a frozen backend turning 503, the journal filing each line under its priority
//! (`journalctl -p warning`), the watchdog restarting a frozen agent, a clean stop that leaves
//! nothing in the kernel, and no reload on offer.

use std::{
    collections::BTreeSet,
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent_tests::{
    background_requests, free_port, get, nspawn::UNIT, require_root, wait_health_at, wait_hung_at,
    wait_until, workspace, Machine,
};

const SERVICE: &str = "health-agent.service";
const WAIT: Duration = Duration::from_secs(30);

/// The `prog_id:` and `link_id:` values of a process's open BPF objects (its fdinfo).
fn bpf_ids(host_pid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut progs, mut links) = (BTreeSet::new(), BTreeSet::new());
    for fd in fs::read_dir(format!("/proc/{host_pid}/fdinfo"))
        .expect("the agent's fdinfo")
        .flatten()
    {
        let info = fs::read_to_string(fd.path()).unwrap_or_default();
        for line in info.lines() {
            let id = |key: &str| line.strip_prefix(key).and_then(|v| v.trim().parse().ok());
            if let Some(id) = id("prog_id:") {
                progs.insert(id);
            }
            if let Some(id) = id("link_id:") {
                links.insert(id);
            }
        }
    }
    (progs, links)
}

/// Whether the kernel still has BPF object `kind` ("prog", "link") with this id.
fn bpf_exists(kind: &str, id: u32) -> bool {
    Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string()])
        .output()
        .expect("running bpftool (cargo xtask setup installs it)")
        .status
        .success()
}

/// A systemd time span as `systemctl show` prints it: "20s", "1min 30s", "500ms".
fn timespan(text: &str) -> Duration {
    text.split_whitespace()
        .map(|word| {
            let split = word
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(word.len());
            let (n, unit) = word.split_at(split);
            let n: u64 = n.parse().unwrap_or_else(|_| panic!("time span {text:?}"));
            match unit {
                "us" => Duration::from_micros(n),
                "ms" => Duration::from_millis(n),
                "s" | "" => Duration::from_secs(n),
                "min" => Duration::from_secs(60 * n),
                "h" => Duration::from_secs(3600 * n),
                _ => panic!("time span {text:?}: unit {unit:?}"),
            }
        })
        .sum()
}

fn journal(machine: &Machine) -> String {
    machine.run(&["journalctl", "-u", SERVICE, "--no-pager", "-o", "cat"])
}

#[test]
fn the_shipped_unit_starts_detects_restarts_on_watchdog_and_stops_clean_under_real_systemd() {
    require_root();
    let started = Instant::now();
    let machine = Machine::with_package();
    let installed = machine.run(&["cat", "/lib/systemd/system/health-agent.service"]);
    let shipped = fs::read_to_string(workspace().join(UNIT)).expect("the unit");
    assert_eq!(
        installed.trim(),
        shipped.trim(),
        "the unit the .deb installed is not {UNIT}: run `cargo xtask package`"
    );

    // A backend in the container, and the conffile edited as an operator would: ports picked
    // free, since the container shares the host's network namespace with parallel tests.
    let (web, control, listen) = (free_port(), free_port(), free_port());
    machine.start_fixture("backend", web, control, &["--backlog", "128"]);
    machine.write(
        "/etc/health-agent/health-agent.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\n[web]\nport = {web}\nprobe_path = \"/\"\n"
        ),
    );

    // Start: `systemctl start` of a Type=notify unit returns once READY=1 arrived.
    let start = Instant::now();
    machine.run(&["systemctl", "start", SERVICE]);
    let took = start.elapsed();
    let show = |name: &str| machine.unit_property(SERVICE, name);
    assert_eq!(show("Type"), "notify");
    assert_eq!(
        (show("ActiveState").as_str(), show("SubState").as_str()),
        ("active", "running"),
        "{}",
        journal(&machine)
    );
    let status_text = show("StatusText");
    let main_pid: u32 = show("MainPID").parse().expect("MainPID");
    let host_pid = machine.host_pid(main_pid).expect("the agent's host pid");
    let proc_status = fs::read_to_string(format!("/proc/{host_pid}/status")).expect("status");
    let field = |key: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    println!(
        "start: active (running) {:.2} s after `systemctl start` (READY=1; status {status_text:?}); \
         CapEff {}, NoNewPrivs {}, Seccomp {}",
        took.as_secs_f64(),
        field("CapEff:"),
        field("NoNewPrivs:"),
        field("Seccomp:")
    );
    // The unit's four capabilities and nothing else: BPF 39, PERFMON 38, SYS_ADMIN 21, SYS_PTRACE 19.
    assert_eq!(
        field("CapEff:"),
        "000000c000280000",
        "the unit's capability set"
    );
    assert_eq!(field("NoNewPrivs:"), "1");
    assert!(
        journal(&machine).contains("told systemd we are ready"),
        "{}",
        journal(&machine)
    );

    for _ in 0..5 {
        let _ = get(web, "/");
    }
    // Traffic all along, counted in the programs' counting windows (the first as the agent
    // starts, then every 15 s).
    let (code, body) = wait_health_at(listen, WAIT, "200 with the kernel view counting", |c, b| {
        let _ = get(web, "/");
        c == 200
            && b["details"]["web"]["kernel"]["state"] == "active"
            && b["details"]["web"]["figures"]["requests_per_second"].as_f64() > Some(0.0)
    });
    println!(
        "start: /health {code} {}, webserver {}, kernel view {}, figures {}",
        body["status"],
        body["checks"]["webserver"],
        body["details"]["web"]["kernel"]["state"],
        body["details"]["web"]["figures"]
    );

    // Detection: the backend frozen, connections queue behind it.
    machine.run(&["systemctl", "kill", "--signal=SIGSTOP", "backend.service"]);
    let frozen = Instant::now();
    let stuck = background_requests(web, 4, Duration::from_secs(6));
    wait_hung_at(listen, WAIT, "detection", frozen);
    // Connections waiting attach the accept tracepoints (perf_event_open under the unit's
    // syscall filter).
    wait_health_at(listen, WAIT, "the accept tracepoints attached", |_, b| {
        b["details"]["web"]["counters"]["accepts_traced"] == true
    });
    machine.run(&["systemctl", "kill", "--signal=SIGCONT", "backend.service"]);
    for t in stuck {
        let _ = t.join();
    }
    wait_health_at(listen, WAIT, "200 again after SIGCONT", |c, _| c == 200);

    // Priorities: each line went to the journal with its `<N>` prefix, so `-p warning` keeps
    // the warnings (the 503) and leaves the info lines out; the prefix itself is taken off.
    let warnings = wait_until(WAIT, "the 503 among the journal's warnings", || {
        let w = machine.run(&[
            "journalctl",
            "-u",
            SERVICE,
            "-p",
            "warning",
            "--no-pager",
            "-o",
            "cat",
        ]);
        w.contains("/health now 503").then_some(w)
    });
    let all = journal(&machine);
    let info = "told systemd we are ready";
    assert!(all.contains(info), "{all}");
    assert!(
        !warnings.contains(info) && !warnings.contains("serving /health"),
        "info lines among the warnings:\n{warnings}"
    );
    assert!(
        !all.lines().any(|l| l.starts_with('<')),
        "a priority prefix left in the journal:\n{all}"
    );
    println!(
        "journal: `journalctl -p warning` shows {} of the agent's {} lines, e.g. {:?}",
        warnings.lines().count(),
        all.lines().count(),
        warnings
            .lines()
            .find(|l| l.contains("/health now 503"))
            .unwrap_or_default()
    );

    // Watchdog: the agent frozen; its check loop stops sending WATCHDOG=1.
    let watchdog = timespan(&show("WatchdogUSec"));
    let restarts_before: u32 = show("NRestarts").parse().expect("NRestarts");
    // Signalled from the host: minbase has no kill(1) outside a shell.
    // SAFETY: a plain signal to a process this test started (through systemd).
    unsafe { libc::kill(host_pid as i32, libc::SIGSTOP) };
    let stopped = Instant::now();
    let new_pid = wait_until(
        watchdog + Duration::from_secs(30),
        "the watchdog restart",
        || {
            let pid: u32 = show("MainPID").parse().ok()?;
            (pid != 0 && pid != main_pid && show("ActiveState") == "active").then_some(pid)
        },
    );
    let restarted = stopped.elapsed();
    let log = journal(&machine);
    let said = log
        .lines()
        .find(|l| l.contains("Watchdog timeout"))
        .unwrap_or_else(|| panic!("the journal does not say watchdog:\n{log}"))
        .to_owned();
    println!(
        "watchdog: agent SIGSTOPped, active again as pid {new_pid} after {:.1} s (WatchdogSec {} s, \
         NRestarts {} → {}); journal: {said:?}",
        restarted.as_secs_f64(),
        watchdog.as_secs(),
        restarts_before,
        show("NRestarts")
    );
    assert!(
        restarted <= watchdog + Duration::from_secs(5),
        "restarted after {restarted:?}, want within WatchdogSec + 5 s"
    );
    wait_health_at(
        listen,
        WAIT,
        "/health answering after the restart",
        |c, b| c == 200 && b["details"]["web"]["kernel"]["state"] == "active",
    );

    // Nothing the sandbox denied (seccomp's EPERM, a read-only path) showed up in either run.
    let denied: Vec<String> = journal(&machine)
        .lines()
        .filter(|l| l.contains("Operation not permitted") || l.contains("Read-only file system"))
        .map(str::to_owned)
        .collect();
    assert!(
        denied.is_empty(),
        "the sandbox denied the agent: {denied:#?}"
    );

    // Reload is not on offer: the agent has no reload path, so the unit has no ExecReload.
    assert_eq!(show("CanReload"), "no");
    let reload = machine.exec(&["systemctl", "reload", SERVICE]);
    assert!(!reload.status.success(), "systemctl reload must be refused");
    println!(
        "reload: not offered ({})",
        String::from_utf8_lossy(&reload.stderr).trim()
    );

    // Stop: clean, quick, and nothing of the agent left in the kernel.
    let host_pid = machine.host_pid(new_pid).expect("the new agent's host pid");
    let (progs, links) = bpf_ids(host_pid);
    assert!(
        !progs.is_empty() && progs.iter().all(|&id| bpf_exists("prog", id)),
        "the running agent holds loaded programs: {progs:?}"
    );
    assert!(
        links.iter().all(|&id| bpf_exists("link", id)),
        "the running agent's links: {links:?}"
    );
    let stop = Instant::now();
    machine.run(&["systemctl", "stop", SERVICE]);
    let took = stop.elapsed();
    let (state, result, code) = (show("ActiveState"), show("Result"), show("ExecMainStatus"));
    let left = wait_until(Duration::from_secs(3), "programs and links gone", || {
        let left: Vec<String> = progs
            .iter()
            .filter(|&&id| bpf_exists("prog", id))
            .map(|id| format!("prog {id}"))
            .chain(
                links
                    .iter()
                    .filter(|&&id| bpf_exists("link", id))
                    .map(|id| format!("link {id}")),
            )
            .collect();
        left.is_empty().then_some(left)
    });
    println!(
        "stop: {state} ({result}, exit status {code}) {:.2} s after `systemctl stop`; {} programs \
         and {} links before, {} left",
        took.as_secs_f64(),
        progs.len(),
        links.len(),
        left.len()
    );
    assert!(
        took < Duration::from_secs(5),
        "systemctl stop took {took:?}"
    );
    assert_eq!(
        (state.as_str(), result.as_str(), code.as_str()),
        ("inactive", "success", "0")
    );
    // Power off: nothing of the container may stay behind on the host.
    let name = machine.name.clone();
    drop(machine);
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&name)
            && !Path::new("/run/systemd/nspawn/propagate")
                .join(&name)
                .exists(),
        "{name} left mounts behind"
    );
    println!(
        "systemd test: {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}
