//! The scenarios: each one's configuration, run, and raw record.

use std::{
    fs,
    io::{self},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::*;

/// The configuration of the verdict suite (tests/tests/verdicts.rs and the harness's agent): no
/// boot grace, details in every answer, a 500 ms cadence, a 1 s recovery, the web check on the backend probing `/up` with a 2 s timeout, and the CPU, memory
/// and saturation thresholds out of the way (this is a busy emulated machine).
pub(crate) fn config(restart: bool) -> String {
    let mut c = format!(
        "[server]\ndetails = \"always\"\n\
         [checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\nboot_grace = \"0s\"\n\
         [web]\nport = {WEB}\nprobe_path = \"/up\"\nprobe_timeout = \"2s\"\n"
    );
    if restart {
        c.push_str("restart_command = \"/init restart\"\n");
    }
    c.push_str(
        "[scaling]\ncpu_high_percent = 100.0\nmemory_high_percent = 100.0\n\
         cpu_low_percent = 0.0\nmemory_low_percent = 0.0\nup_at = 10.0\ndown_at = 0.0\n",
    );
    c
}

pub(crate) fn healthy(s: &Value) -> bool {
    s["code"] == 200 && s["status"] == "healthy" && s["webserver"] == "up"
}

pub(crate) fn agent_log() -> String {
    fs::read_to_string(AGENT_LOG).unwrap_or_default()
}

/// The agent's start, from its launch to its first `200 healthy` with the backend serving.
pub(crate) fn ready(poller: &Poller, zero: Instant) -> io::Result<f64> {
    let from = zero.elapsed().as_secs_f64();
    poller
        .wait(Duration::from_secs(60), from, healthy)
        .and_then(|s| s["t"].as_f64())
        .ok_or_else(|| {
            io::Error::other(format!(
                "not healthy within 60 s; last answer {}; agent log:\n{}",
                poller.latest(),
                agent_log()
            ))
        })
}

/// Ends a scenario: stops the polling, the agent and the backend (in that order: the agent's
/// last answers are of a live backend), and adds what every record holds to `record`.
pub(crate) fn finish(
    poller: Poller,
    agent: Agent,
    backend: Backend,
    load: Option<Load>,
    mut record: Value,
) -> Value {
    if let Some(load) = load {
        record["load"] = load.stop();
    }
    let (samples, kernel, answers) = poller.stop();
    let restarts = restarts();
    drop(agent);
    let pid = backend.pid();
    drop(backend);
    record["samples"] = json!(samples);
    record["kernel"] = kernel;
    record["answers"] = answers;
    record["restarts"] = json!(restarts);
    record["backend_pid_at_end"] = json!(pid);
    record["agent_log"] = json!(agent_log());
    record
}

/// A busy pool: 2 workers, every request takes 3 s, 4 clients on new connections. The workers
/// are always full, the accept queue holds the rest (the agent's probe among them), and answers
/// keep going out. 40 s of it.
pub(crate) fn busy() -> io::Result<Value> {
    let zero = Instant::now();
    let backend = Backend::start(&["--workers", "2"])?;
    let agent = Agent::start(&config(true))?;
    let poller = Poller::start(zero);
    let ready = ready(&poller, zero)?;
    get(CONTROL, "/mode/slow?delay_ms=3000", Duration::from_secs(5))?;
    let load_start = zero.elapsed().as_secs_f64();
    let load = Load::start(4, "/", Duration::ZERO, Duration::from_secs(15));
    thread::sleep(Duration::from_secs(40));
    let load_end = zero.elapsed().as_secs_f64();
    let record = json!({"ready": ready, "load_start": load_start, "load_end": load_end});
    Ok(finish(poller, agent, backend, Some(load), record))
}

/// The production failure: the backend frozen (SIGSTOP) under traffic, 2 clients each sending
/// a request on a new connection every 200 ms. Without a restart command: 503 `hung`, then
/// SIGCONT and 200 again. With one that really replaces it: healed without a 503.
pub(crate) fn frozen(restart: bool) -> io::Result<Value> {
    let zero = Instant::now();
    let backend = Backend::start(&["--workers", "4"])?;
    let agent = Agent::start(&config(restart))?;
    let poller = Poller::start(zero);
    let load = Load::start(2, "/", Duration::from_millis(200), Duration::from_secs(5));
    let ready = ready(&poller, zero)?;
    // A few seconds of healthy traffic before the freeze, as in production.
    thread::sleep(Duration::from_secs(3));
    let frozen_pid = backend.pid();
    backend.signal(libc::SIGSTOP);
    let stopped = zero.elapsed().as_secs_f64();
    let mut continued = Value::Null;
    if restart {
        // Healed: a new backend serves and the agent says healthy again.
        poller.wait(Duration::from_secs(30), stopped + 0.5, |s| {
            healthy(s) && s["heal"].as_u64().unwrap_or(0) >= 1
        });
    } else {
        poller.wait(Duration::from_secs(10), stopped, |s| s["code"] == 503);
        // SAFETY: signalling the frozen child.
        unsafe {
            libc::kill(frozen_pid as i32, libc::SIGCONT);
        }
        let at = zero.elapsed().as_secs_f64();
        continued = json!(at);
        poller.wait(Duration::from_secs(20), at, |s| s["code"] == 200);
    }
    thread::sleep(Duration::from_secs(1));
    let record = json!({
        "ready": ready,
        "stopped": stopped,
        "continued": continued,
        "frozen_pid": frozen_pid,
    });
    Ok(finish(poller, agent, backend, Some(load), record))
}

/// The backend switched, under traffic, to a mode that fails every request: `no-respond` (it
/// reads each request and never answers) or `stop-accepting` (it keeps its port and never
/// accepts). The agent's configuration is the product's (`web.unanswered_after` 10 s,
/// `web.hung_after` 2 s). Then back to `normal`, and 200 again.
pub(crate) fn fault(mode: &str) -> io::Result<Value> {
    let zero = Instant::now();
    // A thread per connection, no pool: requests held unanswered never stop the accepting.
    let backend = Backend::start(&[])?;
    let agent = Agent::start(&config(false))?;
    let poller = Poller::start(zero);
    let load = Load::start(2, "/", Duration::from_millis(200), Duration::from_secs(5));
    let ready = ready(&poller, zero)?;
    thread::sleep(Duration::from_secs(2));
    get(CONTROL, &format!("/mode/{mode}"), Duration::from_secs(5))?;
    let switched = zero.elapsed().as_secs_f64();
    poller.wait(Duration::from_secs(20), switched, |s| s["code"] == 503);
    get(CONTROL, "/mode/normal", Duration::from_secs(5))?;
    let mended = zero.elapsed().as_secs_f64();
    poller.wait(Duration::from_secs(20), mended, |s| s["code"] == 200);
    thread::sleep(Duration::from_secs(1));
    let record = json!({"ready": ready, "switched": switched, "mended": mended});
    Ok(finish(poller, agent, backend, Some(load), record))
}

/// `health-agent drain` on this kernel, where sock_diag alone sees the connections: requests
/// that take 1 s each keep arriving for 3 s after the drain starts (a balancer slow to notice),
/// then stop. Each client sends its next request 200 ms after an answer: a new request every
/// 1.2 s at most, so `--quiet 2s` spans the gaps. The drain must return 0, after the last of
/// them was answered and 2 s of quiet.
pub(crate) fn drain() -> io::Result<Value> {
    let zero = Instant::now();
    let at = || zero.elapsed().as_secs_f64();
    let backend = Backend::start(&["--workers", "4"])?;
    let agent = Agent::start(&config(false))?;
    let poller = Poller::start(zero);
    let ready = ready(&poller, zero)?;
    get(CONTROL, "/mode/slow?delay_ms=1000", Duration::from_secs(5))?;
    let load = Load::start(2, "/", Duration::from_millis(200), Duration::from_secs(5));
    thread::sleep(Duration::from_secs(2));
    let drain_start = at();
    let child = Command::new("/bin/health-agent")
        .args(["--config", CONFIG, "drain"])
        .args(["--quiet", "2s", "--timeout", "30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // Its own clock: when it returned, whatever this thread does meanwhile.
    let waiter = thread::spawn(move || {
        let out = child.wait_with_output();
        (out, zero.elapsed().as_secs_f64())
    });
    thread::sleep(Duration::from_secs(3));
    let load_end = at();
    // Returns once the clients' requests in flight were answered.
    let counts = load.stop();
    let answered_end = at();
    let (out, drain_end) = waiter
        .join()
        .map_err(|_| io::Error::other("the drain's waiter panicked"))?;
    let out = out?;
    thread::sleep(Duration::from_secs(1));
    let mut record = json!({
        "ready": ready,
        "drain_start": drain_start,
        "load_end": load_end,
        "answered_end": answered_end,
        "drain_end": drain_end,
        "drain_exit": out.status.code(),
        "drain_stdout": String::from_utf8_lossy(&out.stdout),
        "drain_stderr": String::from_utf8_lossy(&out.stderr),
    });
    record["load"] = counts;
    Ok(finish(poller, agent, backend, None, record))
}

/// `health-agent check` of the static binary with the scenarios' configuration, the backend
/// serving: what it says at once of the kernel tier on this kernel.
pub(crate) fn static_check() -> io::Result<Value> {
    let backend = Backend::start(&["--workers", "4"])?;
    write_config(&config(false))?;
    let check = Command::new("/bin/health-agent")
        .args(["--config", CONFIG, "check"])
        .env("RUST_LOG", "off")
        .output()?;
    drop(backend);
    Ok(json!({
        "check": String::from_utf8_lossy(&check.stdout),
        "check_stderr": String::from_utf8_lossy(&check.stderr),
        "check_status": check.status.code(),
    }))
}

/// The install path of Debian 12 and Amazon Linux 2023: the .deb's own binary and shipped
/// configuration start on this kernel, say the tier in their first log line, and serve;
/// `health-agent check` says the tier at once.
pub(crate) fn deb() -> io::Result<Value> {
    let zero = Instant::now();
    let backend = Backend::start(&["--workers", "4"])?;
    deb_drop_in()?;
    let check = Command::new("/usr/bin/health-agent")
        .arg("check")
        .env("RUST_LOG", "off")
        .output()?;
    let agent = start_deb_agent()?;
    let poller = Poller::start(zero);
    let ready = ready(&poller, zero)?;
    let record = json!({
        "ready": ready,
        "check": String::from_utf8_lossy(&check.stdout),
        "check_status": check.status.code(),
    });
    Ok(finish(poller, agent, backend, None, record))
}
