//! What a new operator meets on the first day, against the running binary: the answers of a
//! half-configured agent (no web port, a probe path the backend does not have, a mistyped
//! container or namespace), the log lines the journal gets, the CLI's shapes, and the README's
//! "your own backend in five minutes" walk-through, run command by command. The manual's own
//! checks (links, the install example) are in `docs.rs`.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use health_agent_tests::{
    agent_binary, check_json, docker, fixture_image, free_port, markdown::fenced, request_at,
    require_root, wait_until, watched_fixture, workspace, Agent, Container, Fixture, Proc,
    Receiver,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// The keys of every `/health` body; `details` comes with them when the server shows it.
const TOP_LEVEL: &str = "status uptime checks recommendation reasons generated_at";

/// `python3 -m http.server` on 127.0.0.1: a real backend with no `/up` route (it answers 404
/// there), as most apps that are not Rails are. Stopped on drop.
struct PlainBackend {
    _proc: Proc,
    port: u16,
}

impl PlainBackend {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new("python3")
                .args([
                    "-m",
                    "http.server",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                ])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting python3 -m http.server");
            let proc = Proc(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if health_agent_tests::get(port, "/").is_ok_and(|(c, _)| c == 200) {
                    return Self { _proc: proc, port };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("python3 -m http.server did not start on 5 tries");
    }
}

fn reasons(body: &Value) -> String {
    body["reasons"].to_string()
}

/// Polls `/health` for `for_how_long` and panics on any 503.
fn never_503(agent: &Agent, for_how_long: Duration) {
    let deadline = Instant::now() + for_how_long;
    while Instant::now() < deadline {
        let (code, body) = agent.health();
        assert_ne!(code, 503, "a configuration mistake turned 503: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for a `config_error` trigger at the webhook receiver; its payload as text.
fn config_error_alert(hook: &Receiver) -> String {
    wait_until(WAIT, "a config_error alert at the webhook", || {
        hook.posts()
            .into_iter()
            .map(|r| r.body.to_string())
            .find(|b| b.contains("config_error") && b.contains("trigger"))
    })
}

#[test]
fn booting_503_says_fail_in_the_health_json_format() {
    require_root();
    // Nothing listens yet: booting, not ready.
    let agent = Agent::start(&format!(
        "[checks]\nboot_grace = \"60s\"\n[web]\nport = {}\n",
        free_port()
    ));
    let (code, head, body) = request_at(
        agent.addr,
        "GET",
        "/health",
        &[("Accept", "application/health+json")],
        Duration::from_secs(5),
    )
    .expect("GET /health");
    assert_eq!(code, 503, "{head}\n{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["status"], "fail", "every 5xx says fail: {body}");
    assert!(v["description"].to_string().contains("booting"), "{body}");
}

/// The DaemonSet's readiness is the agent's own (`/livez`): 200 while the node's app is booting
/// and `/health` says 503, so a node whose app is not up never stalls the agent's rollout.
#[test]
fn the_daemonsets_readiness_is_livez_which_is_200_while_the_app_boots() {
    require_root();
    let manifest = std::fs::read_to_string(workspace().join("deploy/kubernetes/health-agent.yaml"))
        .expect("the DaemonSet");
    let readiness = manifest
        .split("readinessProbe:")
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.trim_start().starts_with("path:")))
        .expect("a readinessProbe with an httpGet path");
    assert_eq!(readiness.trim(), "path: /livez", "{readiness}");
    let agent = Agent::start(&format!(
        "[checks]\nboot_grace = \"60s\"\n[web]\nport = {}\n",
        free_port()
    ));
    let (code, body) = agent.wait_health(WAIT, "503 booting", |c, _| c == 503);
    assert_eq!(body["status"], "booting", "{body}");
    let (livez, text) = agent.get("/livez").expect("GET /livez");
    assert_eq!((livez, text.trim()), (200, "ok"), "/health {code}: {body}");
}

#[test]
fn a_probe_path_the_backend_lacks_is_up_and_degraded_naming_the_key() {
    require_root();
    let backend = PlainBackend::start();
    let hook = Receiver::ok();
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\n[alerts]\nwebhook_url = \"{}\"\n",
        backend.port,
        hook.url("/hook")
    ));
    let (code, body) = agent.wait_health(WAIT, "the probe's 404 judged", |_, b| {
        b["details"]["web"]["probe"]["status"] == 404
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["recommendation"], "stable", "{body}");
    assert_eq!(
        body["checks"]["webserver"], "up",
        "a 404 proves it answers: {body}"
    );
    let why = reasons(&body);
    assert!(
        why.contains("web.probe_path") && why.contains("404"),
        "{why}"
    );
    let alert = config_error_alert(&hook);
    assert!(alert.contains("web.probe_path"), "{alert}");
    never_503(&agent, Duration::from_secs(2));
}

/// The agent, watching a backend that serves, given `web.<key> = "<value>"` that names nothing
/// (and `extra`): 200 `degraded`, a reason naming the key, the value and that it was not found.
fn mistyped(key: &str, value: &str, extra: &str) -> (Fixture, Agent) {
    let backend = Fixture::start("normal");
    let web = format!("[checks]\ninterval = \"500ms\"\n[web]\n{key} = {value:?}\n{extra}");
    let agent = Agent::on_port(backend.port, &web);
    let named = format!("web.{key}");
    let (code, body) = agent.wait_health(WAIT, &format!("a reason naming {named}"), |_, b| {
        reasons(b).contains(&named)
    });
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("degraded")),
        "{body}"
    );
    let why = reasons(&body);
    assert!(why.contains(value) && why.contains("not found"), "{body}");
    (backend, agent)
}

#[test]
fn a_mistyped_netns_is_degraded_naming_the_key_never_503() {
    require_root();
    let (_backend, agent) = mistyped("netns", "/var/run/netns/ha-first-day-no-such-ns", "");
    never_503(&agent, Duration::from_secs(3));
}

#[test]
fn a_mistyped_container_is_degraded_naming_the_key_and_alerts() {
    require_root();
    let hook = Receiver::ok();
    let alerts = format!("[alerts]\nwebhook_url = \"{}\"\n", hook.url("/hook"));
    let (_backend, agent) = mistyped("container", "ha-first-day-no-such-web", &alerts);
    let alert = config_error_alert(&hook);
    assert!(alert.contains("web.container"), "{alert}");
    never_503(&agent, Duration::from_secs(3));
}

/// The other side of a mistyped container: one that was found and is recreated (`docker rm`
/// and `docker run` again, as a deploy or `docker compose up` does) is briefly absent, and that
/// is never called a configuration error.
#[test]
fn a_recreated_container_is_not_a_config_error() {
    require_root();
    let web = Container::serving("recreated", &[]);
    let hook = Receiver::ok();
    let agent = Agent::start(&format!(
        "[checks]\ninterval = \"500ms\"\n[web]\nport = {}\ncontainer = \"{}\"\n\
         [heal]\nenabled = false\n[alerts]\nwebhook_url = \"{}\"\n",
        web.port,
        web.name,
        hook.url("/hook")
    ));
    agent.wait_up(WAIT, "the container's backend up");
    docker(&["rm", "-f", &web.name]);
    let gone = agent.wait_health(WAIT, "the container seen gone", |_, b| {
        b["details"]["web"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("found before"))
    });
    assert_eq!(gone.0, 200, "{}", gone.1);
    assert!(!reasons(&gone.1).contains("web.container"), "{}", gone.1);
    let listen = format!("127.0.0.1:{}", web.port);
    docker(&[
        "run",
        "-d",
        "--name",
        &web.name,
        "--network",
        "host",
        fixture_image(),
        "--listen",
        &listen,
    ]);
    let (code, body) = agent.wait_health(WAIT, "the recreated container up", |_, b| {
        b["checks"]["webserver"] == "up"
    });
    assert_eq!(code, 200, "{body}");
    assert!(
        body["details"]["web"].get("config_error").is_none(),
        "{body}"
    );
    let alerts: Vec<String> = hook.posts().iter().map(|r| r.body.to_string()).collect();
    assert!(
        !alerts.iter().any(|a| a.contains("config_error")),
        "no config_error alert for a recreated container: {alerts:?}"
    );
    // `web` (dropped last) removes the recreated container too: it has the same name.
}

#[test]
fn no_web_port_is_said_at_start_and_in_the_reasons() {
    require_root();
    let agent = Agent::start("");
    let (code, body) = agent.health();
    // Watching nothing is not healthy: degraded, never 503 (README, "Install").
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert!(reasons(&body).contains("web.port"), "{body}");
    let logs = agent.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("WARN") && l.contains("web.port")),
        "{logs}"
    );
}

#[test]
fn the_one_shot_check_says_why_it_has_no_kernel_view() {
    let backend = Fixture::start("normal");
    let (code, v) = check_json(&format!("[web]\nport = {}\nkernel = true\n", backend.port));
    assert_eq!(code, Some(0), "{v}");
    let reason = v["details"]["web"]["kernel"]["reason"].to_string();
    assert!(!reason.contains("web.kernel = false"), "{reason}");
    assert!(reason.contains("one-shot"), "{reason}");
}

#[test]
fn check_json_has_the_shape_of_health_and_keeps_its_exit_codes() {
    let check = |toml: String| check_json(&toml);
    let backend = Fixture::start("normal");
    let (code, v) = check(format!("[web]\nport = {}\n", backend.port));
    assert_eq!(code, Some(0), "{v}");
    for key in TOP_LEVEL.split(' ').chain(["details"]) {
        assert!(v.get(key).is_some(), "no `{key}`: {v}");
    }
    assert_eq!(v["checks"]["webserver"], "up", "{v}");
    assert_eq!(v["details"]["web"]["verdict"], "up", "{v}");
    // Nothing listens: unhealthy, exit 1, the same jq paths.
    let (code, v) = check(format!(
        "[web]\nport = {}\nprobe_path = \"\"\n",
        free_port()
    ));
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["status"], "unhealthy");
    assert_eq!(v["checks"]["webserver"], "down");
}

#[test]
fn the_peer_view_exists_only_with_fleet() {
    require_root();
    let alone = Agent::start("");
    let (code, body) = alone.view(None).expect("GET /fleet/v1/view");
    assert_eq!(
        code, 404,
        "without [fleet] the peer view is not served: {body}"
    );
    let (_, health) = alone.health();
    let note = health["details"]["fleet"]["note"].to_string();
    assert!(note.contains("[fleet]"), "details.fleet.note: {health}");

    let peer = free_port();
    let fleet = Agent::start(&format!("[fleet]\npeers = [\"127.0.0.1:{peer}\"]\n"));
    let (code, body) = fleet.view(None).expect("GET /fleet/v1/view");
    assert_eq!(code, 401, "only a holder of the fleet key reads it: {body}");
    let (code, body) = fleet.view_proven().expect("GET /fleet/v1/view, proven");
    assert_eq!(code, 200, "{body}");
}

#[test]
fn every_answer_change_is_logged_once_in_plain_words() {
    require_root();
    let (backend, agent) = watched_fixture(
        "[checks]\ninterval = \"200ms\"\nrecover_after = \"1s\"\n\
         [web]\nunanswered_after = \"1s\"\n[heal]\nenabled = false\n",
    );
    agent.wait_health(WAIT, "healthy", |c, b| c == 200 && b["status"] == "healthy");
    backend.set_mode("error");
    agent.wait_health(WAIT, "503", |c, _| c == 503);
    // Held a while: a change is logged once, not once per round.
    std::thread::sleep(Duration::from_secs(2));
    backend.set_mode("normal");
    agent.wait_health(WAIT, "healthy again", |c, b| {
        c == 200 && b["status"] == "healthy"
    });
    std::thread::sleep(Duration::from_millis(500));
    let logs = agent.logs();
    let changes: Vec<&str> = logs.lines().filter(|l| l.contains("/health now")).collect();
    // Once into the 503 (later lines may name the verdict changing under the flap guard's
    // hold: those are changes too, and each is one line).
    let to_503: Vec<&&str> = changes
        .iter()
        .filter(|l| l.contains("now 503") && l.contains("was 200"))
        .collect();
    assert_eq!(to_503.len(), 1, "one line for the 503:\n{logs}");
    assert!(
        to_503[0].contains("WARN")
            && to_503[0].contains("unhealthy")
            && to_503[0].contains("webserver unresponsive")
            && to_503[0].contains("HTTP 500"),
        "{}",
        to_503[0]
    );
    let back = changes
        .iter()
        .rev()
        .find(|l| l.contains("now 200 healthy") && l.contains("was 503"))
        .unwrap_or_else(|| panic!("no line for the recovery:\n{logs}"));
    assert!(
        back.contains("INFO") && back.contains("webserver up"),
        "{back}"
    );
    // The journal and log files get plain text: no colour codes, no Rust Debug dumps.
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escape codes in a log file:\n{logs}"
    );
    for dump in ["NamespaceView", "Some(", " { source:"] {
        assert!(
            !logs.contains(dump),
            "a Debug dump ({dump}) in the log:\n{logs}"
        );
    }
}

#[test]
fn the_body_starts_with_the_seed_fields_and_every_answer_has_the_age_header() {
    require_root();
    for details in ["always", "token"] {
        let agent = Agent::start(&format!("[server]\ndetails = \"{details}\"\n"));
        let (code, _, body) =
            request_at(agent.addr, "GET", "/health", &[], Duration::from_secs(5)).unwrap();
        assert_eq!(code, 200, "{body}");
        let keys = top_level_keys(&body);
        let mut want: Vec<&str> = TOP_LEVEL.split(' ').collect();
        if details == "always" {
            want.push("details");
        }
        assert_eq!(keys, want, "details = {details}: {body}");
        for path in ["/health", "/livez", "/metrics"] {
            let (_, head, _) =
                request_at(agent.addr, "GET", path, &[], Duration::from_secs(5)).unwrap();
            assert!(
                head.to_ascii_lowercase().contains("x-snapshot-age-ms:"),
                "{path} has no x-snapshot-age-ms:\n{head}"
            );
        }
    }
}

/// The top-level keys of a JSON object, in the order the text has them.
fn top_level_keys(body: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0, false, false, None);
    let b = body.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
                if let Some(s) = start.take() {
                    if b.get(i + 1) == Some(&b':') {
                        keys.push(body[s..i].to_string());
                    }
                }
            }
            continue;
        }
        match c {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b'"' => {
                in_str = true;
                start = (depth == 1).then_some(i + 1);
            }
            _ => {}
        }
    }
    keys
}

/// `config` reads `--config` for `--effective` and a bare `--validate`; where it reads no file
/// (`--dump`) or is given another (`--validate OTHER`), a `--config` is refused with a message,
/// never silently ignored.
#[test]
fn config_never_ignores_a_config_file_it_is_given() {
    let run = |args: &[&str]| {
        let out = Command::new(agent_binary()).args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, help) = run(&["config", "--help"]);
    assert_eq!(code, Some(0), "{help}");
    for flag in ["--dump", "--effective", "--validate", "--config"] {
        assert!(help.contains(flag), "config --help lacks {flag}:\n{help}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.toml");
    std::fs::write(&file, "[web]\nport = 9000\n").unwrap();
    let file = file.to_string_lossy();
    let (code, out) = run(&["--config", &file, "config", "--dump"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--effective"), "{out}");
    let (code, out) = run(&["config", "--validate", "--config", &file]);
    assert_eq!(code, Some(0), "a bare --validate checks --config: {out}");
    let (code, out) = run(&[
        "--config",
        &file,
        "config",
        "--validate",
        "/nonexistent.toml",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("two files"), "{out}");
}

/// The README section that starts at `heading`, up to the next `## `.
fn readme_section(heading: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README.md");
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?}"));
    let rest = &readme[start + heading.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// A shell script and everything it starts in the background, in one process group that is
/// killed on drop (a failing test leaves no backend or agent behind).
struct Script(Option<std::process::Child>);

impl Drop for Script {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: signalling the process group this test created.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

#[test]
fn the_readme_walk_through_runs_as_written() {
    require_root();
    let section = readme_section("## Your own backend in five minutes");
    let blocks = fenced(&section, "sh");
    assert!(!blocks.is_empty(), "no ```sh block in the walk-through");
    let script = blocks.join("\n");
    // The README's ports, moved to free ones: tests run side by side. Nothing else changes.
    for port in ["9000", "8080"] {
        assert!(script.contains(port), "the walk-through uses port {port}");
    }
    let script = script
        .replace("9000", &free_port().to_string())
        .replace("8080", &free_port().to_string());
    let dir = tempfile::tempdir().unwrap();
    // `health-agent` is the binary under test, as installed.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(agent_binary(), bin.join("health-agent")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new("sh")
        .args(["-ec", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("running the walk-through");
    let mut script_guard = Script(Some(child));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let c = script_guard.0.as_mut().expect("running");
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the walk-through did not finish in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = script_guard
        .0
        .take()
        .expect("finished")
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "{status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // What the README says the commands print: the degraded answer that names the probe
    // path, then, with it fixed, healthy.
    // The walk-through runs the agent with the default `[disk]` on this machine's `/`: a host
    // whose disk is near the warn threshold (80 %) adds that reason, and it is right to. Only
    // then is it taken out before comparing with the README.
    // Likewise its default `[scaling]` on this machine's load: a host busy with other builds
    // adds a scaling reason (the only reasons of the host's CPU and memory), and only those
    // are taken out.
    let disk_near_warn = root_disk_used_percent() >= 78.0;
    let answers: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|a| without_host_disk_reason(a, disk_near_warn))
        .map(without_host_load_reasons)
        .collect();
    assert_eq!(answers.len(), 2, "two answers printed:\n{stdout}\n{stderr}");
    assert_eq!(answers[0]["status"], "degraded", "{stdout}");
    assert_eq!(answers[0]["webserver"], "up", "{stdout}");
    assert!(reasons(&answers[0]).contains("web.probe_path"), "{stdout}");
    assert_eq!(answers[1]["status"], "healthy", "{stdout}");
    assert_eq!(answers[1]["webserver"], "up", "{stdout}");
    // The README shows what they print: the same lines, but for the ports.
    let shown: Vec<Value> = fenced(&section, "")
        .iter()
        .flat_map(|b| b.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("README: {e}: {l}")))
        .collect();
    assert_eq!(shown.len(), 2, "the README shows both answers");
    for (shown, got) in shown.iter().zip(&answers) {
        assert_eq!(
            without_ports(&shown.to_string()),
            without_ports(&got.to_string()),
            "the README's answer vs what the commands print"
        );
    }
}

/// How full `/` is, as the agent's disk check counts it (used over used plus available).
fn root_disk_used_percent() -> f64 {
    // SAFETY: zeroed statvfs is a valid out-parameter; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(c"/".as_ptr(), &mut st) },
        0,
        "statvfs /"
    );
    let used = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64);
    let total = used + st.f_bavail as u64;
    if total == 0 {
        return 0.0;
    }
    used as f64 * 100.0 / total as f64
}

/// One printed answer with the host's disk warning taken out, when the disk is near the warn
/// threshold; a `degraded` that came only from it reads `healthy`, as the README shows for a
/// host with room. With room on the disk, the answer is left as it is.
fn without_host_disk_reason(mut answer: Value, disk_near_warn: bool) -> Value {
    const DISK: &str = "disk usage at or above the warn threshold";
    if !disk_near_warn {
        return answer;
    }
    if let Some(reasons) = answer["reasons"].as_array_mut() {
        let before = reasons.len();
        reasons.retain(|r| r != DISK);
        if reasons.len() < before && reasons.is_empty() && answer["status"] == "degraded" {
            answer["status"] = "healthy".into();
        }
    }
    answer
}

/// One printed answer without the reasons the host's own load gives (saturation at or above
/// `scaling.up_at`, sustained high CPU or memory); a `degraded` that came only from them reads
/// `healthy`. The walk-through's app is idle: on an idle host these reasons never appear.
fn without_host_load_reasons(mut answer: Value) -> Value {
    let of_host = |r: &Value| {
        let r = r.as_str().unwrap_or("");
        (r.starts_with("saturation ") && r.contains("at or above scaling.up_at"))
            || r.starts_with("sustained high ")
    };
    if let Some(reasons) = answer["reasons"].as_array_mut() {
        let before = reasons.len();
        reasons.retain(|r| !of_host(r));
        if reasons.len() < before && reasons.is_empty() && answer["status"] == "degraded" {
            answer["status"] = "healthy".into();
        }
    }
    answer
}

/// `text` with every `:PORT` cut out (the README's 9000 is a free port in the test).
fn without_ports(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(':') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        rest = if digits >= 2 {
            &after[digits..]
        } else {
            out.push(':');
            after
        };
    }
    out.push_str(rest);
    out
}

#[test]
fn the_manual_says_which_uptime_it_is() {
    require_root();
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/verdicts.md"))
            .expect("docs/verdicts.md");
    assert!(
        page.contains("`uptime` is the host's"),
        "docs/verdicts.md says which uptime `uptime` is"
    );
    let agent = Agent::start("");
    let (_, body) = agent.health();
    let proc_uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let seconds = proc_uptime.split_whitespace().next();
    let host: f64 = seconds.and_then(|s| s.parse().ok()).expect("/proc/uptime");
    let uptime = body["uptime"].as_f64().expect("uptime");
    assert!((uptime - host).abs() < 5.0, "uptime {uptime}, host {host}");
}
