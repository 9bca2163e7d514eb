//! `health-agent drain` against real Puma: a request in flight is answered before it returns,
//! a sender that ignores the 503 makes it fail naming that sender, only root can drain, a drain
//! survives an agent restart, and the auto-scaling group's termination hook (moto, an IMDSv2
//! stub) drains before it completes the lifecycle action.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::{fd::FromRawFd, unix::fs::PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use health_agent_tests::{
    agent_binary, get_within,
    moto::{imds_stub, instance_env, Metadata, Role},
    require_root, wait_until, Agent, Moto, Puma, PumaOptions, Receiver,
};

/// The `[drain]` section of an agent whose socket and state live in `dir`.
fn drain_section(dir: &Path) -> String {
    format!(
        "[drain]\ncontrol_socket = \"{}\"\nstate_file = \"{}\"\n",
        dir.join("control.sock").display(),
        dir.join("state/drain.json").display()
    )
}

/// A Puma watched by an agent whose drain lives in `dir`, `extra` merged into its config.
fn watched(options: PumaOptions, dir: &Path, extra: &str) -> (Puma, Agent) {
    let puma = Puma::start(options);
    let agent = agent_on(puma.port, dir, extra);
    agent.wait_up(Duration::from_secs(20), "the agent to see Puma serve");
    (puma, agent)
}

/// An agent watching `port`, its drain in `dir`.
fn agent_on(port: u16, dir: &Path, extra: &str) -> Agent {
    Agent::on_port(
        port,
        // `extra` first: its lines before any table header land in [web].
        &format!("[web]\nprobe_path = \"/up\"\n{extra}{}", drain_section(dir)),
    )
}

fn config_of(agent: &Agent) -> PathBuf {
    agent.dir.path().join("health-agent.toml")
}

/// `health-agent drain` or `undrain` against `agent`, as `as_user` (None: root).
fn command(agent: &Agent, args: &[&str], as_user: Option<&[&str]>) -> Command {
    let mut c = match as_user {
        Some(wrapper) => {
            let mut c = Command::new(wrapper[0]);
            c.args(&wrapper[1..]).arg(agent_binary());
            c
        }
        None => Command::new(agent_binary()),
    };
    c.arg("--config").arg(config_of(agent)).args(args);
    c
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn last_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// The agent check's line (`server.agent_check_listen`).
fn agent_check(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("agent check");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut line = String::new();
    s.read_to_string(&mut line).expect("agent check line");
    line
}

fn undrain(agent: &Agent) -> String {
    let out = command(agent, &["undrain"], None)
        .output()
        .expect("undrain");
    assert!(out.status.success(), "{}", text(&out));
    last_line(&out)
}

#[test]
fn a_request_in_flight_is_answered_before_drain_returns() {
    in_flight_answered_first("auto");
}

/// Linux 5.10–6.2: no socket-call programs, the drain sees through sock_diag alone.
#[test]
fn a_request_in_flight_is_answered_before_drain_returns_in_the_sock_diag_tier() {
    in_flight_answered_first("sock_diag");
}

fn in_flight_answered_first(tier: &str) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let check_port = health_agent_tests::free_port();
    let (puma, agent) = watched(
        PumaOptions {
            slow_seconds: 5.0,
            ..PumaOptions::default()
        },
        dir.path(),
        &format!(
            "kernel_tier = \"{tier}\"\n[server]\nagent_check_listen = \"127.0.0.1:{check_port}\"\n"
        ),
    );
    // A 5 s request, in flight when the drain starts.
    let port = puma.port;
    let slow = thread::spawn(move || {
        let r = get_within(port, "/slow", Duration::from_secs(20));
        (r.map(|(code, _, _)| code).ok(), Instant::now())
    });
    thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let child = command(
        &agent,
        &["drain", "--quiet", "1s", "--timeout", "30s"],
        None,
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("drain");
    // Its exit timed on a thread of its own, not after the checks below.
    let drain = thread::spawn(move || {
        let out = child.wait_with_output().expect("drain output");
        (out, Instant::now())
    });
    // Meanwhile: 503 draining for the balancer, the agent check says drain, /livez stays 200,
    // and details.drain shows the request in flight.
    let (code, body) = agent.wait_health(Duration::from_secs(5), "a 503 draining", |c, b| {
        c == 503 && b["status"] == "draining" && b["details"]["drain"]["in_flight"] == 1
    });
    assert_eq!(code, 503);
    assert_eq!(body["details"]["drain"]["state"], "draining", "{body}");
    assert_eq!(body["details"]["drain"]["by"], "drain command", "{body}");
    assert_eq!(agent_check(([127, 0, 0, 1], check_port).into()), "drain\n");
    assert_eq!(agent.get("/livez").expect("livez").0, 200);
    let (out, returned) = drain.join().expect("the drain's waiter");
    let (slow_code, answered) = slow.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(slow_code, Some(200), "the slow request was answered");
    assert!(
        answered <= returned,
        "drain returned {:?} before the request in flight was answered",
        answered.duration_since(returned)
    );
    let line = last_line(&out);
    assert!(
        line.starts_with("drained in ") && line.contains("1 were in flight at the start"),
        "{}",
        text(&out)
    );
    let took = returned.duration_since(started);
    // The request had 4.5 s to go; nothing new came meanwhile, so the 1 s of quiet was over
    // long before it was answered.
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(8),
        "drain took {took:?}: {}",
        text(&out)
    );
    let progress = String::from_utf8_lossy(&out.stdout);
    assert!(
        progress.contains("draining ") && progress.contains("1 in flight"),
        "progress lines: {progress}"
    );
    println!("{tier}: drain with a 5 s request in flight: {took:?}\n{progress}");
    // Still out until undrain; then back once Puma answers.
    assert_eq!(agent.health().0, 503);
    assert!(undrain(&agent).starts_with("undrained"));
    agent.wait_health(Duration::from_secs(10), "200 after undrain", |c, b| {
        c == 200 && b["details"].get("drain").is_none()
    });
    let line = agent_check(([127, 0, 0, 1], check_port).into());
    assert!(line.starts_with("up ready "), "{line}");
}

/// A connection to 127.0.0.1:`port` from 127.0.0.2, as another host's balancer would come.
fn connect_from_127_0_0_2(port: u16) -> std::io::Result<TcpStream> {
    // SAFETY: socket(2); the descriptor is owned by the TcpStream below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is ours.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    let from = addr([127, 0, 0, 2], 0);
    let to = addr([127, 0, 0, 1], port);
    // SAFETY: valid sockaddr_in of the given length.
    if unsafe { libc::bind(fd, (&from as *const libc::sockaddr_in).cast(), len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::connect(fd, (&to as *const libc::sockaddr_in).cast(), len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
}

/// A balancer that never looks at /health: a new connection every 50 ms from 127.0.0.2, until
/// stopped (or dropped).
struct IgnoringSender {
    stop: Arc<AtomicBool>,
    answered: Arc<Mutex<u32>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl IgnoringSender {
    fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(Mutex::new(0u32));
        let thread = {
            let (stop, answered) = (stop.clone(), answered.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut s) = connect_from_127_0_0_2(port) {
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        let _ =
                            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                        let mut buf = Vec::new();
                        if s.read_to_end(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200") {
                            *answered.lock().unwrap() += 1;
                        }
                    }
                    thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Self {
            stop,
            answered,
            thread: Some(thread),
        }
    }

    /// Stops it; how many of its requests were answered 200.
    fn stop(mut self) -> u32 {
        self.halt();
        *self.answered.lock().unwrap()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for IgnoringSender {
    fn drop(&mut self) {
        self.halt();
    }
}

#[test]
fn a_sender_that_ignores_the_503_makes_drain_fail_naming_it() {
    ignored_drain_names_the_sender("auto");
}

#[test]
fn a_sender_that_ignores_the_503_is_named_in_the_sock_diag_tier() {
    ignored_drain_names_the_sender("sock_diag");
}

fn ignored_drain_names_the_sender(tier: &str) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (puma, agent) = watched(
        PumaOptions::default(),
        dir.path(),
        &format!("kernel_tier = \"{tier}\"\n"),
    );
    let sender = IgnoringSender::start(puma.port);
    let started = Instant::now();
    let out = command(&agent, &["drain", "--quiet", "2s", "--timeout", "5s"], None)
        .output()
        .expect("drain");
    let took = started.elapsed();
    let answered = sender.stop();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let line = last_line(&out);
    assert!(
        line.starts_with("not drained after 5.") && line.contains("from 127.0.0.2 ("),
        "{}",
        text(&out)
    );
    assert!(
        took < Duration::from_secs(7),
        "exit 1 at the timeout, not later: {took:?}"
    );
    assert!(answered > 20, "the sender was served meanwhile");
    println!("{tier}: ignored drain: {line} ({took:?})");
    // Still drained: the 503 holds until undrain, and details.drain says how it ended.
    let (code, body) =
        agent.wait_health(Duration::from_secs(2), "details.drain timed_out", |_, b| {
            b["details"]["drain"]["state"] == "timed_out"
        });
    assert_eq!(
        (code, body["status"].as_str()),
        (503, Some("draining")),
        "{body}"
    );
    assert!(
        body["details"]["drain"]["result"]
            .as_str()
            .is_some_and(|r| r.contains("127.0.0.2")),
        "{body}"
    );
    undrain(&agent);
}

/// The seconds a progress line counts (`draining 3.0s: ...`).
fn progress_seconds(line: &str) -> Option<f64> {
    line.strip_prefix("draining ")?
        .split_once("s:")?
        .0
        .parse()
        .ok()
}

/// What `drain` prints is what `details.drain` says the moment it returns (no wait): `drained`
/// with its line, then, for a second `drain` while drained that times out under a sender that
/// ignores the 503, `timed_out` with its line. Every line counts on one clock, the drain's:
/// the progress lines and the final line agree, and the final line says when this command's own
/// `--timeout` ran out. A sender the kernel counted but no read saw is explained the first time
/// a line names it.
#[test]
fn drain_again_while_drained_speaks_one_clock_and_details_follow_the_command() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (puma, agent) = watched(PumaOptions::default(), dir.path(), "");
    let out = command(
        &agent,
        &["drain", "--quiet", "500ms", "--timeout", "10s"],
        None,
    )
    .output()
    .expect("drain");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = last_line(&out);
    let (code, body) = agent.health();
    let drain = &body["details"]["drain"];
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        (drain["state"].as_str(), drain["result"].as_str()),
        (Some("drained"), Some(printed.as_str())),
        "right after `drain` printed {printed:?}: {body}"
    );
    thread::sleep(Duration::from_secs(2));

    let sender = IgnoringSender::start(puma.port);
    let out = command(&agent, &["drain", "--quiet", "2s", "--timeout", "3s"], None)
        .output()
        .expect("drain again");
    let (code, body) = agent.health();
    sender.stop();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    let last = last_line(&out);
    let drain = &body["details"]["drain"];
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        (drain["state"].as_str(), drain["result"].as_str()),
        (Some("timed_out"), Some(last.as_str())),
        "right after `drain` printed {last:?}: {body}"
    );
    // One clock: the drain began more than 2 s before this command, and the last line counts
    // from there, past every progress line, naming this command's own 3 s.
    let total: f64 = last
        .strip_prefix("not drained after ")
        .and_then(|r| r.split_once(" s"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", text(&out)));
    let progress: Vec<f64> = lines.iter().filter_map(|l| progress_seconds(l)).collect();
    assert!(!progress.is_empty(), "{}", text(&out));
    assert!(
        progress.iter().all(|&p| p > 2.0 && p <= total) && total >= 5.0,
        "progress {progress:?} and the last line ({total} s) on one clock: {}",
        text(&out)
    );
    assert!(
        last.contains("(timed out 3.") && last.contains("after this command asked)"),
        "{}",
        text(&out)
    );
    assert!(last.contains("from 127.0.0.2 ("), "{}", text(&out));
    // `unseen`, when a progress line names it, is explained there the first time only.
    let naming: Vec<&&str> = lines
        .iter()
        .filter(|l| progress_seconds(l).is_some() && l.contains("unseen ("))
        .collect();
    if let Some((first, rest)) = naming.split_first() {
        assert!(first.contains("so their sender is not known"), "{stdout}");
        assert!(
            rest.iter()
                .all(|l| !l.contains("so their sender is not known")),
            "{stdout}"
        );
    }
    println!("{stdout}");
    undrain(&agent);
}

#[test]
fn only_root_can_drain_and_the_public_port_cannot() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Directories another user may pass through: the socket's own mode must keep them out.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_puma, agent) = watched(PumaOptions::default(), dir.path(), "");
    std::fs::set_permissions(agent.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(config_of(&agent), std::fs::Permissions::from_mode(0o644)).unwrap();
    let socket = dir.path().join("control.sock");
    let mode = std::fs::metadata(&socket)
        .expect("control socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the control socket is root's alone");
    let nobody: &[&str] = &[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    for args in [&["drain", "--timeout", "5s"][..], &["undrain"][..]] {
        let out = command(&agent, args, Some(nobody))
            .output()
            .expect("setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            err.contains("permission denied") && err.contains("only root"),
            "{}",
            text(&out)
        );
    }
    // Loosened by someone: the agent checks who connects, too.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = command(&agent, &["drain", "--timeout", "5s"], Some(nobody))
        .output()
        .expect("setpriv");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("only root may drain or undrain (you are uid 65534)"),
        "{}",
        text(&out)
    );
    // The public port has no way to drain.
    for (method, path) in [
        ("POST", "/drain"),
        ("GET", "/drain"),
        ("POST", "/health"),
        ("PUT", "/health"),
    ] {
        let mut s = TcpStream::connect(agent.addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 404") || answer.starts_with("HTTP/1.1 405"),
            "{method} {path}: {answer}"
        );
    }
    let (code, body) = agent.health();
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("healthy")),
        "nobody drained it: {body}"
    );
    assert!(
        agent.logs().contains("uid 65534 refused"),
        "{}",
        agent.logs()
    );
}

#[test]
fn a_drain_survives_an_agent_restart_and_is_no_incident() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let hook = Receiver::ok();
    let alerts = format!(
        "[alerts]\nwebhook_url = \"{}\"\nresolve_after = \"1s\"\n",
        hook.url("/hook")
    );
    let (puma, agent) = watched(PumaOptions::default(), dir.path(), &alerts);
    let out = command(
        &agent,
        &["drain", "--quiet", "500ms", "--timeout", "10s"],
        None,
    )
    .output()
    .expect("drain");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.path().join("state/drain.json").exists());
    // The deploy stops the app while drained: no restart, no alert, still `draining`.
    drop(puma);
    thread::sleep(Duration::from_secs(2));
    let (code, body) = agent.health();
    assert_eq!(
        (code, body["status"].as_str()),
        (503, Some("draining")),
        "{body}"
    );
    assert_eq!(body["details"]["heal"]["total_attempts"], 0, "{body}");
    // The agent restarts (an upgrade) while the app comes back: still drained, and it says why.
    agent.stop();
    let puma = Puma::start(PumaOptions::default());
    let again = agent_on(puma.port, dir.path(), &alerts);
    let (code, body) = again.health();
    assert_eq!(
        (code, body["status"].as_str()),
        (503, Some("draining")),
        "{body}"
    );
    let reason = body["reasons"][0].as_str().unwrap_or_default();
    assert!(
        reason.contains("drain command") && reason.contains("kept across an agent restart"),
        "{body}"
    );
    assert_eq!(body["details"]["drain"]["persisted"], true, "{body}");
    // `health-agent check` says what /health says.
    let out = command(&again, &["check"], None).output().expect("check");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("draining (HTTP 503)"),
        "{}",
        text(&out)
    );
    assert!(
        again
            .logs()
            .contains("a drain is on: the drain command started it"),
        "{}",
        again.logs()
    );
    assert!(undrain(&again).starts_with("undrained"));
    assert!(!dir.path().join("state/drain.json").exists());
    again.wait_health(Duration::from_secs(10), "200 once Puma answers", |c, _| {
        c == 200
    });
    thread::sleep(Duration::from_millis(500));
    assert!(
        hook.posts().is_empty(),
        "a drain is no incident, yet the webhook got: {:?}",
        hook.posts()
            .iter()
            .map(|p| p.body.clone())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_backend_that_hangs_while_drained_is_still_restarted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let puma = Puma::start(PumaOptions::default());
    let script = puma.restart_script();
    let agent = agent_on(
        puma.port,
        dir.path(),
        &format!("restart_command = \"{}\"\n", script.display()),
    );
    agent.wait_up(Duration::from_secs(20), "the agent to see Puma serve");
    let out = command(
        &agent,
        &["drain", "--quiet", "500ms", "--timeout", "10s"],
        None,
    )
    .output()
    .expect("drain");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Frozen while drained: a fault a restart fixes, so self-healing acts as ever.
    let frozen = puma.current_pid();
    // SAFETY: signalling the Puma this test started.
    unsafe { libc::kill(frozen as i32, libc::SIGSTOP) };
    let (_, body) = agent.wait_health(
        Duration::from_secs(20),
        "a restart while drained",
        |_, b| b["details"]["heal"]["total_attempts"].as_u64().unwrap_or(0) >= 1,
    );
    assert_eq!(body["details"]["drain"]["state"], "drained", "{body}");
    // Replaced and answering again (once the flap guard has seen it hold): still drained, until
    // undrain.
    let (code, body) = agent.wait_health(
        Duration::from_secs(20),
        "the new Puma serving, drained",
        |_, b| {
            b["checks"]["webserver"] == "up"
                && b["details"]["heal"]["total_recovered"] == 1
                && b["status"] == "draining"
        },
    );
    assert_eq!(code, 503, "{body}");
    assert_ne!(puma.current_pid(), frozen, "the frozen Puma was replaced");
    undrain(&agent);
    agent.wait_health(Duration::from_secs(10), "200 after undrain", |c, _| {
        c == 200
    });
}

#[test]
fn the_lifecycle_hook_drains_then_continues() {
    require_root();
    let moto = Moto::start();
    let group = moto.auto_scaling_group("eu-west-1", "web-drain", 61, 1);
    moto.termination_hook(&group, "health-agent-drain");
    let instance = group.members[0].0.clone();
    let state = Arc::new(Mutex::new("InService".to_string()));
    let imds = imds_stub(Metadata {
        token: "TOKEN-hook",
        instance_id: instance.clone(),
        region: group.region.clone(),
        group_tag: Some(group.name.clone()),
        role: Some(Role {
            name: "web-role".into(),
            access_key_id: "ASIAHOOKROLE",
            secret_access_key: "hook-role-secret",
            session_token: "hook-session",
        }),
        lifecycle_state: Some(state.clone()),
    });
    let dir = tempfile::tempdir().unwrap();
    let puma = Puma::start(PumaOptions::default());
    let env = instance_env(&imds);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let agent = Agent::start_with_env(
        &format!(
            "[web]\nport = {}\nprobe_path = \"/up\"\n{}lifecycle_hook = \"health-agent-drain\"\n\
             lifecycle_poll = \"1s\"\nlifecycle_quiet = \"2s\"\nlifecycle_timeout = \"60s\"\n\
             aws_endpoint = \"{}\"\n",
            puma.port,
            drain_section(dir.path()),
            moto.endpoint()
        ),
        &env,
    );
    agent.wait_up(Duration::from_secs(20), "the agent to see Puma serve");
    // The balancer still sends for a while after the group starts terminating.
    let load = health_agent_tests::Load::new_connections(
        puma.port,
        "/",
        2,
        Duration::from_millis(50),
        Duration::from_secs(5),
    );
    thread::sleep(Duration::from_secs(3));
    assert!(
        moto.lifecycle_actions().is_empty(),
        "nothing before termination"
    );
    *state.lock().unwrap() = "Terminated".into();
    let (_, body) = agent.wait_health(Duration::from_secs(5), "the hook's drain", |c, b| {
        c == 503 && b["details"]["drain"]["by"] == "lifecycle hook"
    });
    assert_eq!(body["status"], "draining", "{body}");
    thread::sleep(Duration::from_secs(3));
    assert!(
        moto.lifecycle_actions().is_empty(),
        "no CompleteLifecycleAction while requests still arrive: {:?}",
        moto.lifecycle_actions()
    );
    let stats = load.stop();
    let quiet_since = unix_now();
    wait_until(Duration::from_secs(15), "CompleteLifecycleAction", || {
        Some(moto.lifecycle_actions()).filter(|a| !a.is_empty())
    });
    let actions = moto.lifecycle_actions();
    assert_eq!(actions.len(), 1, "{actions:?}");
    let a = &actions[0];
    assert_eq!(
        (
            a["group"].as_str(),
            a["hook"].as_str(),
            a["instance"].as_str(),
            a["result"].as_str()
        ),
        (
            Some(group.name.as_str()),
            Some("health-agent-drain"),
            Some(instance.as_str()),
            Some("CONTINUE")
        ),
        "{a}"
    );
    let after = a["at"].as_f64().unwrap() - quiet_since;
    assert!(
        (1.9..8.0).contains(&after),
        "CONTINUE {after:.1} s after the last request: the 2 s of quiet, then the call"
    );
    println!("lifecycle: load {stats}; CONTINUE {after:.2} s after the last request");
    // moto records the call before it answers: the agent logs it once the answer is back.
    let logs = wait_until(Duration::from_secs(5), "the CONTINUE logged", || {
        Some(agent.logs()).filter(|l| l.contains("CompleteLifecycleAction CONTINUE sent for"))
    });
    assert!(!logs.contains("hook-role-secret"), "no secret in the log");
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
