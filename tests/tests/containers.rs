//! Containers and self-healing against a real Docker daemon (and Podman's Docker-compatible API): restart before ever reporting
//! 503, give up within the budget, heal plain processes through `web.restart_command`.

use std::{
    os::unix::net::UnixListener,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use health_agent_tests::{
    docker, get, require_root, wait_until, Agent, Container, Engine, Fixture,
};

const WAIT: Duration = Duration::from_secs(40);

/// Polls /health in the background and remembers whether any answer was a 503.
struct Watch503 {
    seen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch503 {
    fn start(port: u16) -> Self {
        let seen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if get(port, "/health").is_ok_and(|(c, _)| c == 503) {
                    s.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn saw_503(mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.seen.load(Ordering::Relaxed)
    }
}

fn web_container_config(c: &Container, extra: &str) -> String {
    format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"{}\"\nhung_after = \"2s\"\nprobe_timeout = \"1s\"\n\
         [containers]\nnames = [\"{}\"]\n{}[heal]\ntimeout = \"20s\"\n{extra}",
        c.port, c.name, c.name, found_or_configured(c.engine)
    )
}

/// `[containers]` lines for `engine`: none for Docker, whose socket the agent finds first
/// (`/var/run/docker.sock` exists here), Podman's socket for Podman (both run here).
fn found_or_configured(engine: Engine) -> String {
    match engine {
        Engine::Docker => String::new(),
        Engine::Podman | Engine::PodmanRootless => format!("docker_host = {:?}\n", engine.host()),
    }
}

#[test]
fn killed_web_container_is_restarted_without_a_503() {
    killed_container_is_restarted_without_a_503(Engine::Docker);
}

#[test]
fn killed_podman_container_is_restarted_without_a_503() {
    killed_container_is_restarted_without_a_503(Engine::Podman);
}

#[test]
fn killed_rootless_podman_container_is_restarted_without_a_503() {
    killed_container_is_restarted_without_a_503(Engine::PodmanRootless);
}

/// The agent restarts a killed container through `engine`'s Engine API before any 503.
fn killed_container_is_restarted_without_a_503(engine: Engine) {
    require_root();
    let web = Container::serving_on(engine, "killed", &[], &[]);
    let agent = Agent::start(&web_container_config(&web, ""));
    let (_, body) = agent.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    assert_eq!(body["checks"]["containers"], "1/1 running");
    let answered = body["details"]["containers"]["engine"]
        .as_str()
        .unwrap_or("");
    assert!(
        answered.starts_with(&format!("{} ", engine.product())),
        "{engine:?} answered: {answered:?}"
    );

    let watch = Watch503::start(agent.port);
    let killed = Instant::now();
    engine.run(&["kill", &web.name]);
    agent.wait_health(WAIT, "a heal attempt", |_, b| {
        b["details"]["heal"]["total_attempts"] == 1
    });
    let detected = killed.elapsed();
    let (_, body) = agent.wait_health(WAIT, "healed", |c, b| {
        c == 200 && b["status"] == "healthy" && b["details"]["heal"]["total_recovered"] == 1
    });
    let healed = killed.elapsed();
    eprintln!(
        "{answered}: kill to heal attempt {:.2} s, kill to healthy again {:.2} s",
        detected.as_secs_f64(),
        healed.as_secs_f64()
    );
    assert!(!watch.saw_503(), "self-heal must come before any 503");
    let heal = &body["details"]["heal"];
    assert_eq!(heal["total_attempts"], 1, "{heal}");
    assert_eq!(
        heal["attempts"][0]["action"],
        format!("docker restart {}", web.name)
    );
    assert_eq!(heal["attempts"][0]["outcome"], "recovered");
    assert_eq!(
        engine.run(&["inspect", "-f", "{{.State.Running}}", &web.name]),
        "true"
    );
}

#[test]
fn paused_web_container_is_seen_hung_and_restarted() {
    require_root();
    let web = Container::serving("paused", &[]);
    // Only `web.container`, not `containers.names`: the container check would see `paused`
    // at once; this test is about the kernel view seeing the frozen server hang.
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"{}\"\nhung_after = \"2s\"\nprobe_timeout = \"1s\"\n[heal]\ntimeout = \"20s\"\n",
        web.port, web.name
    ));
    agent.wait_up(WAIT, "healthy");

    let watch = Watch503::start(agent.port);
    docker(&["pause", &web.name]);
    // Real traffic queues on the frozen server; the kernel view calls it hung.
    let clients = health_agent_tests::background_requests(web.port, 5, Duration::from_secs(10));
    let (_, body) = agent.wait_health(WAIT, "recovering", |_, b| b["status"] == "recovering");
    assert_eq!(body["checks"]["webserver"], "hung", "{body}");
    let (_, body) = agent.wait_health(WAIT, "healed", |c, b| {
        c == 200 && b["status"] == "healthy" && b["details"]["heal"]["total_recovered"] == 1
    });
    assert!(!watch.saw_503(), "self-heal must come before any 503");
    let reason = body["details"]["heal"]["attempts"][0]["reason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("web backend hung"),
        "the heal was for the hang: {reason}"
    );
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.Status}}", &web.name]),
        "running"
    );
    for c in clients {
        let _ = c.join();
    }
}

#[test]
fn crash_looping_container_turns_503_within_the_budget() {
    crash_looping_turns_503_within_the_budget(Engine::Docker);
}

#[test]
fn crash_looping_podman_container_turns_503_within_the_budget() {
    crash_looping_turns_503_within_the_budget(Engine::Podman);
}

#[test]
fn crash_looping_rootless_podman_container_turns_503_within_the_budget() {
    crash_looping_turns_503_within_the_budget(Engine::PodmanRootless);
}

/// A container that dies on every start, in `engine`: restarted `max_restarts` times, then 503.
fn crash_looping_turns_503_within_the_budget(engine: Engine) {
    require_root();
    // The fixture in `exit` mode dies at once, on every start.
    let web = Container::run_on(engine, "crashloop", &[], &["--mode", "exit"]);
    wait_until(Duration::from_secs(10), "the container to exit", || {
        (engine.run(&["inspect", "-f", "{{.State.Status}}", &web.name]) == "exited").then_some(())
    });
    let started = Instant::now();
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"{}\"\n[containers]\nnames = [\"{}\"]\n\
         docker_host = \"{}\"\n[heal]\nmax_restarts = 2\nwindow = \"10m\"\ntimeout = \"3s\"\n",
        web.port, web.name, web.name, engine.host()
    ));
    // `budget_spent` turns true when the last attempt starts; `exhausted` once it failed too.
    // The container may still show `running` for a moment after the last restart (a slow
    // engine, rootless Podman on a busy machine, notices the exit late): wait for it to settle.
    let (code, body) = agent.wait_health(WAIT, "503 once heals failed", |c, b| {
        c == 503
            && b["details"]["heal"]["budget_spent"] == true
            && b["details"]["heal"]["phase"] == "exhausted"
            && b["checks"]["containers"] == "0/1 running"
    });
    eprintln!(
        "{:?}: agent start to 503 after 2 failed restarts {:.2} s",
        engine,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(code, 503);
    assert_eq!(body["status"], "unhealthy");
    assert_eq!(body["checks"]["containers"], "0/1 running");
    assert!(
        body["details"]["containers"]["reason"]
            .as_str()
            .unwrap()
            .contains(&web.name),
        "names the container: {body}"
    );
    assert!(
        body["reasons"]
            .to_string()
            .contains("self-heal failed or its budget is spent"),
        "{body}"
    );
    // Give it time to (wrongly) try again: the budget holds.
    std::thread::sleep(Duration::from_secs(8));
    let (code, body) = agent.health();
    assert_eq!(code, 503);
    let heal = &body["details"]["heal"];
    assert_eq!(
        heal["total_attempts"], 2,
        "no more than max_restarts: {heal}"
    );
    assert_eq!(heal["attempts"].as_array().unwrap().len(), 2);
    for a in heal["attempts"].as_array().unwrap() {
        assert_eq!(a["outcome"], "failed", "{a}");
        assert_eq!(a["action"], format!("docker restart {}", web.name));
    }
}

#[test]
fn containers_summary_counts_running_ones() {
    require_root();
    let a = Container::serving("count-a", &[]);
    let b = Container::serving("count-b", &[]);
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[containers]\nnames = [\"{}\", \"{}\"]\n[heal]\nenabled = false\n",
        a.name, b.name
    ));
    let (code, body) = agent.wait_health(WAIT, "2/2", |_, b| {
        b["checks"]["containers"] == "2/2 running"
    });
    assert_eq!(code, 200);
    let info = &body["details"]["containers"]["containers"];
    assert_eq!(info.as_array().unwrap().len(), 2);
    assert!(
        info[0]["memory_bytes"].as_u64().unwrap() > 0,
        "per-container memory: {info}"
    );
    docker(&["stop", "-t", "1", &b.name]);
    let (code, body) = agent.wait_health(WAIT, "1/2", |_, b| {
        b["checks"]["containers"] == "1/2 running"
    });
    assert_eq!(
        code, 503,
        "an expected container down is a fault a new instance fixes: {body}"
    );
    assert_eq!(body["details"]["containers"]["faulty"][0], b.name.as_str());
}

#[test]
fn unreachable_docker_is_unknown_not_503() {
    require_root();
    // What a crashed dockerd leaves behind: a socket file nobody listens on.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("docker.sock");
    drop(UnixListener::bind(&sock).unwrap());
    let backend = Fixture::start("normal");
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\n[containers]\nnames = [\"web\"]\ndocker_host = \"unix://{}\"\n",
        backend.port,
        sock.display()
    ));
    // "unknown" is also the state before the first check: wait for Docker's answer (or its
    // absence) and the first probe.
    let (code, body) = agent.wait_health(WAIT, "containers unknown", |_, b| {
        b["details"]["containers"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Docker did not answer"))
            && b["checks"]["webserver"] != "unknown"
    });
    assert_eq!(body["checks"]["containers"], "unknown");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(
        body["checks"]["webserver"], "up",
        "the web check keeps deciding"
    );
}

#[test]
fn restart_command_heals_a_plain_process() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let port = health_agent_tests::free_port();
    let pid_file = dir.path().join("backend.pid");
    let env_file = dir.path().join("restart.env");
    let bin = health_agent_tests::binary("fixture-backend", "health-agent-tests");
    let start = format!(
        "setsid {} --listen 127.0.0.1:{port} >/dev/null 2>&1 & echo $! > {}",
        bin.display(),
        pid_file.display()
    );
    let script = dir.path().join("restart.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nenv > {}\nkill -KILL $(cat {}) 2>/dev/null\nsleep 0.2\n{start}\necho restarted\n",
            env_file.display(),
            pid_file.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    std::process::Command::new("sh")
        .arg("-c")
        .arg(&start)
        .status()
        .unwrap();
    wait_until(Duration::from_secs(5), "backend up", || {
        get(port, "/up").ok().filter(|(c, _)| *c == 200)
    });

    // The agent's secrets: none of them may reach the restart command.
    let secrets = [
        ("HEALTH_AGENT_TOKEN", "agent-t0ken-s3cr3t"),
        ("GITHUB_TOKEN", "ghp_g1thub-s3cr3t"),
        ("PGPASSWORD", "pg-passw0rd-s3cr3t"),
    ];
    let agent = Agent::start_with_env(
        &format!(
            "[checks]\ninterval = \"500ms\"\n[web]\nport = {port}\nhung_after = \"2s\"\nrestart_command = \"{}\"\n[heal]\ntimeout = \"10s\"\n",
            script.display()
        ),
        &secrets,
    );
    agent.wait_up(WAIT, "healthy");
    let watch = Watch503::start(agent.port);
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: stopping the backend this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let _clients = health_agent_tests::background_requests(port, 3, Duration::from_secs(6));
    let (_, body) = agent.wait_health(WAIT, "healed", |c, b| {
        c == 200 && b["status"] == "healthy" && b["details"]["heal"]["total_recovered"] == 1
    });
    assert!(!watch.saw_503());
    let a = &body["details"]["heal"]["attempts"][0];
    assert_eq!(a["output"], "restarted", "{a}");
    assert_eq!(a["outcome"], "recovered");
    let new_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_pid, pid, "a new process serves now");
    let env = std::fs::read_to_string(&env_file).expect("the restart command ran env");
    assert!(env.contains("PATH="), "{env}");
    for (name, value) in secrets {
        assert!(
            !env.contains(name) && !env.contains(value),
            "{name} reached restart_command: {env}"
        );
    }
    // SAFETY: cleaning up the process the restart script started.
    unsafe { libc::kill(new_pid, libc::SIGKILL) };
}

#[test]
fn a_finished_job_under_a_watched_label_is_not_a_fault() {
    finished_job_under_a_watched_label_is_not_a_fault(Engine::Docker);
}

#[test]
fn a_finished_podman_job_under_a_watched_label_is_not_a_fault() {
    finished_job_under_a_watched_label_is_not_a_fault(Engine::Podman);
}

/// Containers found by label in `engine` (the agent lists them all and matches the labels
/// itself, so the engine's list filters do not matter); a job that exited 0 is `completed`.
fn finished_job_under_a_watched_label_is_not_a_fault(engine: Engine) {
    require_root();
    let label = format!("ha.test.group=jobs-{engine:?}-{}", std::process::id());
    let _service = Container::serving_on(engine, "service", &["--label", &label], &[]);
    // A one-shot job: it prints its usage and exits 0.
    let job = Container::run_on(engine, "job", &["--label", &label], &["--help"]);
    wait_until(WAIT, "the job to finish", || {
        (engine.run(&[
            "inspect",
            "-f",
            "{{.State.Status}} {{.State.ExitCode}}",
            &job.name,
        ]) == "exited 0")
            .then_some(())
    });
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\nboot_grace = \"0s\"\n[containers]\nlabels = [\"{label}\"]\n{}",
        found_or_configured(engine)
    ));
    let (code, body) = agent.wait_health(WAIT, "both containers seen", |_, b| {
        b["details"]["containers"]["containers"]
            .as_array()
            .is_some_and(|a| a.len() == 2)
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["checks"]["containers"], "1/1 running, 1 completed");
    assert_eq!(
        body["details"]["containers"]["state"], "all_running",
        "{body}"
    );
    let info = body["details"]["containers"]["containers"]
        .as_array()
        .unwrap();
    let job_info = info
        .iter()
        .find(|c| c["name"] == job.name.as_str())
        .unwrap();
    assert_eq!(job_info["completed"], true, "{job_info}");
    // Some rounds later: still fine, and never restarted.
    std::thread::sleep(Duration::from_secs(3));
    let (code, body) = agent.health();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["details"]["heal"]["total_attempts"], 0, "{body}");
    assert_eq!(
        engine.run(&[
            "inspect",
            "-f",
            "{{.RestartCount}} {{.State.Status}}",
            &job.name
        ]),
        "0 exited"
    );
}
