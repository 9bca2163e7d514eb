//! The agent run like a real service: the .deb installs and its unit verifies, the unit's
//! capability set is enough for the kernel view, and real HAProxy (Debian's package) takes a
//! frozen backend out of rotation through the agent check while its own TCP check keeps it.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port, get, get_within, require_root, succeed, target_dir, workspace, Agent, Fixture,
    Haproxy,
};

const WAIT: Duration = Duration::from_secs(20);

const UNIT: &str = "deploy/systemd/health-agent.service";

/// Purges the package on drop, so a failed assertion leaves nothing installed.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "health-agent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn installed_version() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status} ${Version}", "health-agent"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.starts_with("install ok installed").then_some(text)
}

#[test]
fn the_package_installs_its_unit_verifies_and_its_default_config_validates() {
    require_root();
    let debian = target_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("debian");
    let deb = std::fs::read_dir(&debian)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!(
                "no .deb in {}: run `cargo xtask package` (cargo xtask test does)",
                debian.display()
            )
        });
    let deb_mtime = std::fs::metadata(&deb)
        .and_then(|m| m.modified())
        .expect("the .deb");
    // What the package is made of: a .deb older than either was made without the change.
    for source in [UNIT, "xtask/src/dist/deb.rs", "xtask/src/dist/payload.rs"] {
        let mtime = std::fs::metadata(workspace().join(source))
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        assert!(
            deb_mtime >= mtime,
            "{} is older than {source}: run `cargo xtask package`",
            deb.display()
        );
    }
    if let Some(v) = installed_version() {
        panic!("health-agent is already installed ({v}): this test would replace and purge it");
    }

    let _purge = Installed;
    succeed(Command::new("dpkg").arg("-i").arg(&deb));
    for path in [
        "/usr/bin/health-agent",
        "/lib/systemd/system/health-agent.service",
        "/etc/health-agent/health-agent.toml",
    ] {
        assert!(Path::new(path).is_file(), "{path} not installed");
    }
    // The README's links lead somewhere on the box: the manual lands beside it.
    let doc = Path::new("/usr/share/doc/health-agent");
    let readme = std::fs::read_to_string(doc.join("README.md")).expect("the packaged README");
    let targets = readme_links(&readme);
    assert!(
        targets.iter().any(|t| t == "docs/verdicts.md"),
        "the README links docs/verdicts.md: {targets:?}"
    );
    for target in &targets {
        assert!(
            doc.join(target).is_file(),
            "the README links {target}, but the package has no {}",
            doc.join(target).display()
        );
    }
    println!("the packaged README's {} links resolve", targets.len());
    let conffiles =
        succeed(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "health-agent"]));
    let conffiles = String::from_utf8_lossy(&conffiles.stdout);
    assert!(
        conffiles.contains("/etc/health-agent/health-agent.toml"),
        "the config is a conffile: {conffiles:?}"
    );

    // systemd-analyze verify prints nothing for a clean unit.
    let tmp = tempfile::tempdir().expect("tempdir");
    let verify = succeed(
        Command::new("systemd-analyze")
            .args(["verify", "/lib/systemd/system/health-agent.service"])
            .current_dir(tmp.path()),
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
    println!("systemd-analyze verify: clean");

    let validate = succeed(Command::new("/usr/bin/health-agent").args([
        "config",
        "--validate",
        "/etc/health-agent/health-agent.toml",
    ]));
    println!("{}", String::from_utf8_lossy(&validate.stdout).trim());

    succeed(Command::new("dpkg").args(["--purge", "health-agent"]));
    assert!(!Path::new("/usr/bin/health-agent").exists());
    assert!(!Path::new("/etc/health-agent/health-agent.toml").exists());
}

/// The README's relative link targets (`docs/drain.md`), anchors dropped: what a reader of
/// the installed copy follows.
fn readme_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") && !out.iter().any(|t| t == target) {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

/// Capability numbers (linux/capability.h) of the candidates the issue names.
const CAPS: &[(&str, u32)] = &[
    ("CAP_DAC_OVERRIDE", 1),
    ("CAP_DAC_READ_SEARCH", 2),
    ("CAP_NET_ADMIN", 12),
    ("CAP_SYS_PTRACE", 19),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_SYS_RESOURCE", 24),
    ("CAP_PERFMON", 38),
    ("CAP_BPF", 39),
];

/// The capabilities in the unit's `CapabilityBoundingSet=`.
fn unit_capabilities() -> Vec<&'static str> {
    let unit = std::fs::read_to_string(workspace().join(UNIT)).expect("reading the unit");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet=");
    line.split_whitespace()
        .map(|name| {
            CAPS.iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} is not in this test's table"))
                .0
        })
        .collect()
}

fn cap_number(name: &str) -> u32 {
    CAPS.iter().find(|(n, _)| *n == name).expect("known").1
}

/// A capability mask line of /proc/PID/status, e.g. "CapEff".
fn cap_mask(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .expect("the field")
        .trim();
    u64::from_str_radix(hex, 16).expect("hex mask")
}

#[test]
fn the_units_capabilities_are_enough_for_the_kernel_view_and_the_process_view() {
    require_root();
    let caps = unit_capabilities();
    let want: u64 = caps.iter().map(|c| 1u64 << cap_number(c)).sum();
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let fixture = Fixture::start_with("normal", &["--backlog", "128"]);
    // uid 0 whose bounding set is the unit's: after exec its permitted and effective sets are
    // exactly that, as under systemd's CapabilityBoundingSet=.
    let agent = Agent::start_under(
        &["setpriv", "--bounding-set", &bounding, "--inh-caps", "-all", "--"],
        &format!(
            "[web]\nport = {}\nprobe_path = \"/\"\n[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n",
            fixture.port
        ),
        &[],
    );
    let eff = cap_mask(agent.pid(), "CapEff");
    let prm = cap_mask(agent.pid(), "CapPrm");
    println!("unit capabilities {caps:?}: CapEff {eff:016x}, CapPrm {prm:016x}, want {want:016x}");
    assert_eq!(eff, want, "effective set is the unit's, not full root");
    assert_eq!(prm, want, "permitted set is the unit's");

    for _ in 0..10 {
        let _ = get(fixture.port, "/");
    }
    // Traffic all along, counted in the programs' counting windows (the first as the agent
    // starts, then every 15 s).
    let (code, body) = agent.wait_health(WAIT, "200 with the kernel view counting", |c, b| {
        let _ = get(fixture.port, "/");
        c == 200
            && b["details"]["web"]["kernel"]["state"] == "active"
            && b["details"]["web"]["figures"]["requests_per_second"].as_f64() > Some(0.0)
    });
    assert_eq!(code, 200, "{body}");

    // CAP_SYS_PTRACE: the server's processes are found and seen stopped.
    fixture.signal(libc::SIGSTOP);
    let stuck: Vec<_> = (0..4)
        .map(|_| {
            let port = fixture.port;
            std::thread::spawn(move || {
                let _ = get_within(port, "/", Duration::from_secs(4));
            })
        })
        .collect();
    let (_, body) = agent.wait_health(WAIT, "the stopped server seen as stopped", |c, b| {
        c == 503
            && b["details"]["web"]["processes"]["frozen"]
                .as_str()
                .is_some_and(|f| f.contains("stopped"))
    });
    println!(
        "stopped server: {}",
        body["details"]["web"]["detail"]
            .as_str()
            .unwrap_or_default()
    );
    fixture.signal(libc::SIGCONT);
    for t in stuck {
        let _ = t.join();
    }
}

/// Out of rotation: down, or drained (weight 0 shows as DRAIN).
fn out_of_rotation(status: &str, weight: u32) -> bool {
    !status.starts_with("UP") || weight == 0
}

/// The server `web` of `backend`: (status, weight).
fn web(haproxy: &Haproxy, backend: &str) -> (String, u32) {
    let s = haproxy.state(backend, "web");
    (s.status, s.weight)
}

#[test]
fn haproxy_agent_check_takes_a_frozen_backend_out_and_its_tcp_check_does_not() {
    require_root();
    let fixture = Fixture::start_with("normal", &["--backlog", "128"]);
    let agent_check = free_port();
    let agent = Agent::start(&format!(
        "[server]\nagent_check_listen = \"127.0.0.1:{agent_check}\"\n\
         [web]\nport = {}\nprobe_path = \"/\"\n",
        fixture.port
    ));
    let (fe_agent, fe_tcp) = (free_port(), free_port());
    let haproxy = Haproxy::start(&format!(
        "defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    \
         timeout server 10s\n    timeout check 1s\n\
         frontend fe_agent\n    bind 127.0.0.1:{fe_agent}\n    default_backend be_agent\n\
         frontend fe_tcp\n    bind 127.0.0.1:{fe_tcp}\n    default_backend be_tcp\n\
         backend be_agent\n    server web 127.0.0.1:{port} weight 100 check inter 1s \
         agent-check agent-addr 127.0.0.1 agent-port {agent_check} agent-inter 1s\n\
         backend be_tcp\n    server web 127.0.0.1:{port} weight 100 check inter 1s\n",
        port = fixture.port
    ));
    health_agent_tests::wait_until(WAIT, "both servers UP, the agent's weight in", || {
        let (a, w) = web(&haproxy, "be_agent");
        let (t, _) = web(&haproxy, "be_tcp");
        (a == "UP" && w > 0 && t == "UP").then_some(())
    });

    // Traffic through both frontends, as a balancer would send it.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = [fe_agent, fe_tcp]
        .into_iter()
        .map(|port| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = get_within(port, "/", Duration::from_secs(1));
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));

    fixture.signal(libc::SIGSTOP);
    let frozen = Instant::now();
    let mut left = None;
    let mut tcp_states = Vec::new();
    while frozen.elapsed() < Duration::from_secs(8) {
        let (a, w) = web(&haproxy, "be_agent");
        let (t, tw) = web(&haproxy, "be_tcp");
        if left.is_none() && out_of_rotation(&a, w) {
            left = Some((frozen.elapsed(), a.clone()));
        }
        if tcp_states.last() != Some(&t) {
            tcp_states.push(t.clone());
        }
        assert!(
            !out_of_rotation(&t, tw),
            "the TCP check alone took the frozen backend out ({t}, weight {tw}): the kernel \
             should keep completing handshakes into its 128-deep backlog"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (left_after, how) = left.unwrap_or_else(|| {
        panic!(
            "the agent check did not take the frozen backend out in 8 s; agent says {:?}\n{}",
            agent.health().1["reasons"],
            agent.logs()
        )
    });
    println!(
        "SIGSTOP: be_agent {how} after {:.1} s; be_tcp (TCP check only) stayed {tcp_states:?} for 8 s",
        left_after.as_secs_f64()
    );
    assert!(
        left_after <= Duration::from_secs(5),
        "out of rotation after {left_after:?}, want within 5 s"
    );

    fixture.signal(libc::SIGCONT);
    let thawed = Instant::now();
    let back = health_agent_tests::wait_until(WAIT, "be_agent back UP after SIGCONT", || {
        let (a, w) = web(&haproxy, "be_agent");
        (a == "UP" && w > 0).then(|| thawed.elapsed())
    });
    println!(
        "SIGCONT: be_agent UP again after {:.1} s",
        back.as_secs_f64()
    );

    stop.store(true, Ordering::Relaxed);
    for t in load {
        let _ = t.join();
    }
}

#[test]
fn the_agent_tells_systemd_it_is_ready_and_pings_the_watchdog_from_its_check_loop() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("notify socket");
    // systemd's WatchdogSec=1s: a ping every 500 ms.
    let agent = Agent::start_with_env(
        "",
        &[
            ("NOTIFY_SOCKET", path.to_str().expect("utf-8 path")),
            ("WATCHDOG_USEC", "1000000"),
        ],
    );
    let mut buf = [0u8; 512];
    let mut recv = |timeout: Duration| {
        socket.set_read_timeout(Some(timeout)).expect("timeout");
        socket
            .recv(&mut buf)
            .ok()
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    // What queued while the agent started (READY=1 and the first rounds' pings), then a window
    // of 3 s from the first ping after them: the pings are counted on their own clock.
    let mut got: Vec<String> = std::iter::from_fn(|| recv(Duration::from_millis(1))).collect();
    let mut pings = 0;
    let mut window: Option<Instant> = None;
    while window.is_none_or(|w| w.elapsed() < Duration::from_secs(3)) {
        let left = window.map_or(Duration::from_secs(2), |w| {
            Duration::from_secs(3).saturating_sub(w.elapsed())
        });
        let Some(m) = recv(left.max(Duration::from_millis(1))) else {
            if window.is_none() {
                break;
            }
            continue;
        };
        if m == "WATCHDOG=1" {
            window.get_or_insert_with(Instant::now);
            pings += 1;
        }
        got.push(m);
    }
    assert!(
        got.iter().any(|m| m.starts_with("READY=1")),
        "READY=1 sent: {got:?}\n{}",
        agent.logs()
    );
    assert!(
        (4..=8).contains(&pings),
        "about one WATCHDOG=1 per 500 ms over 3 s, got {pings}: {got:?}"
    );
    println!("notify socket got: READY=1 and {pings} WATCHDOG=1 in 3 s");
}

/// Runs the agent binary (with the arguments after it) as `nobody` with no capability, the
/// config it is given made readable to that user first.
const AS_NOBODY: &[&str] = &[
    "sh",
    "-c",
    "chmod 755 \"$(dirname \"$3\")\" && chmod 644 \"$3\" && exec setpriv --reuid=nobody \
     --regid=nogroup --clear-groups --inh-caps=-all \"$@\"",
    "sh",
];

#[test]
fn without_privilege_every_place_says_no_privilege_not_tracefs() {
    require_root();
    let fixture = Fixture::start("normal");
    let agent = Agent::start_under(
        AS_NOBODY,
        &format!("[web]\nport = {}\nprobe_path = \"/\"\n", fixture.port),
        &[],
    );
    assert_eq!(
        cap_mask(agent.pid(), "CapEff"),
        0,
        "runs without any capability"
    );
    let (_, body) = agent.wait_health(WAIT, "the kernel view's state", |_, b| {
        b["details"]["web"]["kernel"]["state"].is_string()
    });
    let kernel = &body["details"]["web"]["kernel"];
    println!(
        "details.web.kernel: reason {}, missing {}",
        kernel["reason"], kernel["missing"]
    );
    assert_eq!(kernel["tier"], "no_ebpf", "{kernel}");
    for said in [&kernel["reason"], &kernel["missing"][0]] {
        let said = said.as_str().unwrap_or_default();
        assert!(said.contains("no privilege"), "{kernel}");
        assert!(!said.contains("tracefs"), "tracefs is mounted: {kernel}");
    }
    let logs = agent.logs();
    let first = logs.lines().next().unwrap_or_default();
    println!("first log line: {first}");
    assert!(first.contains("no privilege"), "{logs}");
    assert!(!logs.contains("tracefs"), "tracefs is mounted:\n{logs}");

    let config = agent.config_path();
    let config = config.to_str().expect("a UTF-8 path");
    for args in [&["check"][..], &["check", "--json"][..]] {
        let out = Command::new(AS_NOBODY[0])
            .args(&AS_NOBODY[1..])
            .arg(health_agent_tests::agent_binary())
            .args(["--config", config])
            .args(args)
            .output()
            .expect("health-agent check as nobody");
        let text = String::from_utf8_lossy(&out.stdout);
        let said = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => v["details"]["web"]["kernel"]["missing"].to_string(),
            Err(_) => text
                .lines()
                .find(|l| l.contains("privilege"))
                .unwrap_or("")
                .into(),
        };
        println!("check {args:?}: {said}");
        assert!(text.contains("no privilege"), "{text}");
        assert!(!text.contains("tracefs"), "{text}");
    }
}

/// The set the Kubernetes sidecars use, and the unit's once CAP_SYS_ADMIN is dropped: the
/// kernel view loads, the answer programs (cgroup-skb) cannot attach.
const WITHOUT_NET_ADMIN: &str = "-all,+bpf,+perfmon,+sys_ptrace";

/// `health-agent check` under `setpriv --bounding-set <bounding>` as uid 0: (table, JSON).
fn check_under(bounding: &str, config: &Path) -> (String, serde_json::Value) {
    let run = |json: bool| {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set", bounding, "--inh-caps", "-all", "--"])
            .arg(health_agent_tests::agent_binary())
            .arg("--config")
            .arg(config)
            .arg("check");
        if json {
            c.arg("--json");
        }
        String::from_utf8_lossy(&c.output().expect("health-agent check").stdout).into_owned()
    };
    let json = run(true);
    let json = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    (run(false), json)
}

#[test]
fn without_cap_net_admin_every_place_names_it_and_what_it_costs() {
    require_root();
    let fixture = Fixture::start("normal");
    let agent = Agent::start_under(
        &[
            "setpriv",
            "--bounding-set",
            WITHOUT_NET_ADMIN,
            "--inh-caps",
            "-all",
            "--",
        ],
        &format!(
            "[web]\nport = {}\nprobe_path = \"/\"\nsocket_tracing = \"on_suspicion\"\n",
            fixture.port
        ),
        &[],
    );
    let eff = cap_mask(agent.pid(), "CapEff");
    assert_eq!(eff & (1 << cap_number("CAP_NET_ADMIN")), 0, "{eff:016x}");
    assert_eq!(eff & (1 << cap_number("CAP_SYS_ADMIN")), 0, "{eff:016x}");
    let (_, body) = agent.wait_health(WAIT, "the kernel view active", |_, b| {
        let _ = get(fixture.port, "/");
        b["details"]["web"]["kernel"]["state"] == "active"
    });
    let web = &body["details"]["web"];
    println!(
        "details.web.kernel: tier {}, missing {}",
        web["kernel"]["tier"], web["kernel"]["missing"]
    );
    let named = |said: &str| said.contains("no CAP_NET_ADMIN") && said.contains("erroring");
    assert!(
        web["kernel"]["missing"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| named(m.as_str().unwrap_or_default()))),
        "{}",
        web["kernel"]
    );
    assert_eq!(
        web["answers"]["status_visible"], false,
        "{}",
        web["answers"]
    );
    let logs = agent.logs();
    let first = logs.lines().next().unwrap_or_default();
    println!("first log line: {first}");
    assert!(named(first), "{logs}");

    let (table, json) = check_under(WITHOUT_NET_ADMIN, &agent.config_path());
    let row = table
        .lines()
        .find(|l| l.starts_with("kernel tier"))
        .unwrap_or("");
    println!("check: {row}");
    assert!(named(row), "{table}");
    let web = &json["details"]["web"];
    println!(
        "check --json: not_visible {}",
        web["answers"]["not_visible"]
    );
    assert!(
        named(web["answers"]["not_visible"].as_str().unwrap_or_default()),
        "{web}"
    );
    assert!(
        !web["answers"]["not_visible"]
            .to_string()
            .contains("web.kernel = false"),
        "{web}"
    );

    // The unit's comment: CAP_NET_ADMIN in CAP_SYS_ADMIN's place attaches them.
    let with = format!("{WITHOUT_NET_ADMIN},+net_admin");
    let (table, json) = check_under(&with, &agent.config_path());
    let row = table
        .lines()
        .find(|l| l.starts_with("kernel tier"))
        .unwrap_or("");
    assert!(!row.contains("CAP_NET_ADMIN"), "{table}");
    assert!(
        json["details"]["web"]["kernel"]["missing"].is_null(),
        "{json}"
    );
    drop(agent);
    let agent = Agent::start_under(
        &[
            "setpriv",
            "--bounding-set",
            &with,
            "--inh-caps",
            "-all",
            "--",
        ],
        &format!(
            "[web]\nport = {}\nprobe_path = \"/\"\nsocket_tracing = \"always\"\n",
            fixture.port
        ),
        &[],
    );
    let (_, body) = agent.wait_health(WAIT, "the answers' status visible", |_, b| {
        // Not the probe's path: its answers are counted apart.
        let _ = get(fixture.port, "/real");
        b["details"]["web"]["answers"]["status_visible"] == true
            && b["details"]["web"]["answers"]["total_by_class"]["2xx"].as_u64() > Some(0)
    });
    println!(
        "with CAP_NET_ADMIN: missing {}, answers {}",
        body["details"]["web"]["kernel"]["missing"],
        body["details"]["web"]["answers"]["total_by_class"]
    );
}
