//! PID 1 of the old-kernel VM (`tests/tests/old_kernel.rs`, harness in `tests/src/qemu.rs`).
//!
//! The VM boots Debian's own Linux 6.1 under qemu with an initramfs and no root disk. This
//! program is its init: it mounts what a booted Debian has mounted (proc, sysfs, devtmpfs,
//! tracefs, cgroup v2), loads the sock_diag modules that Debian's udev and modprobe would load on
//! the first request, brings loopback up, and then runs each scenario the harness asked for on
//! the kernel command line (`vm.scenarios=busy,frozen,...`): a fresh fixture backend, a fresh
//! agent with that scenario's configuration, traffic, and `/health` polled every 100 ms.
//!
//! It judges nothing. Each scenario's raw record (every `/health` answer with its time, the
//! moments of the signals, the load's results, the restarts, the agent's log) goes out on the
//! serial console as one line `vm-result <json>`; the host test asserts on it. At the end it
//! powers the VM off.
//!
//! `vm-init restart` is the agents' `web.restart_command`: it counts the restart in
//! `/run/restarts` and kills the backend, which the supervisor thread here starts again, as
//! systemd's `Restart=always` would.
//!
//! std and libc only, linked static (musl): the initramfs has no libc.

use std::{
    ffi::CString,
    fs,
    io::{self, BufRead, Read, Write},
    net::{SocketAddr, TcpStream},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

const WEB: u16 = 9000;
const CONTROL: u16 = 9001;
const HEALTH: u16 = 8080;
const BACKEND_PID: &str = "/run/backend.pid";
const RESTARTS: &str = "/run/restarts";
const AGENT_LOG: &str = "/run/agent.log";
const MODULES: &[&str] = &["/lib/modules/inet_diag.ko", "/lib/modules/tcp_diag.ko"];

fn main() {
    if std::env::args().nth(1).as_deref() == Some("restart") {
        restart();
        return;
    }
    let started = Instant::now();
    if let Err(e) = boot() {
        say(&format!("vm-error boot: {e}"));
        power_off();
    }
    let scenarios = kernel_arg("vm.scenarios").unwrap_or_default();
    say(&format!(
        "vm-ready {}",
        json!({
            "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "uptime_s": uptime(),
            "init_s": started.elapsed().as_secs_f64(),
            "btf": std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        })
    ));
    for name in scenarios.split(',').filter(|s| !s.is_empty()) {
        let record = match name {
            "busy" => busy(),
            "frozen" => frozen(false),
            "frozen_restarted" => frozen(true),
            "deb" => deb(),
            "unresponsive" => fault("no-respond"),
            "never_accepts" => fault("stop-accepting"),
            other => Err(io::Error::other(format!("unknown scenario {other}"))),
        };
        match record {
            Ok(mut r) => {
                r["scenario"] = json!(name);
                say(&format!("vm-result {r}"));
            }
            Err(e) => say(&format!("vm-error {name}: {e}")),
        }
    }
    say("vm-done");
    power_off();
}

/// One line on the console (the serial port), whole.
fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn uptime() -> f64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn kernel_arg(key: &str) -> Option<String> {
    let cmdline = fs::read_to_string("/proc/cmdline").ok()?;
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

fn mount(source: &str, target: &str, fstype: &str) -> io::Result<()> {
    fs::create_dir_all(target)?;
    // SAFETY: valid NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe {
        libc::mount(
            cstr(source).as_ptr(),
            cstr(target).as_ptr(),
            cstr(fstype).as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    check(rc, &format!("mount {fstype} on {target}"))
}

/// What a booted Debian has before any service starts.
fn boot() -> io::Result<()> {
    mount("proc", "/proc", "proc")?;
    mount("sysfs", "/sys", "sysfs")?;
    mount("devtmpfs", "/dev", "devtmpfs")?;
    mount("tmpfs", "/run", "tmpfs")?;
    mount("tmpfs", "/tmp", "tmpfs")?;
    mount("tracefs", "/sys/kernel/tracing", "tracefs")?;
    mount("cgroup2", "/sys/fs/cgroup", "cgroup2")?;
    mount("bpf", "/sys/fs/bpf", "bpf")?;
    for module in MODULES {
        let file = fs::File::open(module)?;
        use std::os::fd::AsRawFd;
        // SAFETY: finit_module(fd, params, flags) with an open fd and an empty parameter string.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_finit_module,
                file.as_raw_fd(),
                cstr("").as_ptr(),
                0,
            )
        };
        check(rc as libc::c_int, &format!("finit_module {module}"))?;
    }
    loopback_up()
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain datagram socket for the interface ioctls, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: fd is a socket, req a valid ifreq naming `lo`; the union member is the flags.
    let rc = unsafe {
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req);
        }
        libc::close(fd);
        rc
    };
    check(rc, "bringing lo up")
}

fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// `web.restart_command`: count, then kill the backend (the supervisor starts a new one).
fn restart() {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(RESTARTS)
        .expect("open the restart count");
    let _ = writeln!(f, "restart");
    if let Some(pid) = fs::read_to_string(BACKEND_PID)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    {
        // SAFETY: signalling a pid read from our own pid file.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

fn restarts() -> usize {
    fs::read_to_string(RESTARTS)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The fixture backend under a supervisor that starts it again whenever it exits, until the
/// scenario ends.
struct Backend {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicU64>,
    supervisor: Option<thread::JoinHandle<()>>,
}

impl Backend {
    fn start(args: &[&str]) -> io::Result<Backend> {
        let _ = fs::remove_file(RESTARTS);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU64::new(0));
        let spawn = {
            let args = args.clone();
            move || -> io::Result<Child> {
                let child = Command::new("/bin/fixture-backend")
                    .args(["--listen", &format!("127.0.0.1:{WEB}")])
                    .args(["--control", &format!("127.0.0.1:{CONTROL}")])
                    .args(&args)
                    .stdout(Stdio::null())
                    .spawn()?;
                fs::write(BACKEND_PID, child.id().to_string())?;
                Ok(child)
            }
        };
        let mut first = spawn()?;
        pid.store(u64::from(first.id()), Ordering::SeqCst);
        let supervisor = {
            let (stop, pid) = (stop.clone(), pid.clone());
            thread::spawn(move || loop {
                // Polled, so that a stop is seen while the child runs.
                while matches!(first.try_wait(), Ok(None)) {
                    if stop.load(Ordering::SeqCst) {
                        let _ = first.kill();
                        let _ = first.wait();
                        return;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
                match spawn() {
                    Ok(c) => {
                        pid.store(u64::from(c.id()), Ordering::SeqCst);
                        first = c;
                    }
                    Err(e) => {
                        say(&format!("vm-error respawning the backend: {e}"));
                        return;
                    }
                }
            })
        };
        wait_until(Duration::from_secs(20), || {
            TcpStream::connect(("127.0.0.1", CONTROL)).is_ok()
        })?;
        Ok(Backend {
            stop,
            pid,
            supervisor: Some(supervisor),
        })
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid.load(Ordering::SeqCst) as i32, sig);
        }
    }

    fn pid(&self) -> u64 {
        self.pid.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self.supervisor.take() {
            let _ = s.join();
        }
    }
}

fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> io::Result<()> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if ready() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("not ready within {limit:?}"),
    ))
}

/// The agent, its log in [`AGENT_LOG`].
struct Agent(Child);

impl Agent {
    fn start(config: &str) -> io::Result<Agent> {
        fs::create_dir_all("/etc/health-agent")?;
        fs::write("/etc/health-agent/config.toml", config)?;
        let log = fs::File::create(AGENT_LOG)?;
        let child = Command::new("/bin/health-agent")
            .args(["--config", "/etc/health-agent/config.toml", "serve"])
            .env("RUST_LOG", "info")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Agent(child))
    }
}

/// A drop-in for this backend beside the .deb's shipped configuration.
fn deb_drop_in() -> io::Result<()> {
    fs::create_dir_all("/etc/health-agent/conf.d")?;
    fs::write(
        "/etc/health-agent/conf.d/vm.toml",
        format!(
            "[server]\ndetails = \"always\"\n[checks]\nboot_grace = \"0s\"\n[web]\nport = {WEB}\n"
        ),
    )
}

/// The .deb's agent (glibc, `/usr/bin/health-agent`) as its unit starts it: the shipped
/// configuration and its drop-ins.
fn start_deb_agent() -> io::Result<Agent> {
    let log = fs::File::create(AGENT_LOG)?;
    let child = Command::new("/usr/bin/health-agent")
        .arg("serve")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok(Agent(child))
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange on `stream`: the status code and the body (Content-Length framed).
fn exchange(stream: &mut TcpStream, path: &str, close: bool) -> io::Result<(u16, Vec<u8>)> {
    let connection = if close { "close" } else { "keep-alive" };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {connection}\r\n\r\n"
    )?;
    let mut reader = io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((code, body))
}

fn connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

fn get(port: u16, path: &str, timeout: Duration) -> io::Result<(u16, Vec<u8>)> {
    exchange(&mut connect(port, timeout)?, path, true)
}

/// `/health` every 100 ms: each answer with its time from `zero`, reduced to what the host
/// asserts on; the first answer's `details.web.kernel` whole.
struct Poller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Value>>>,
    kernel: Arc<Mutex<Value>>,
    /// The latest answer's `details.web.answers`.
    answers: Arc<Mutex<Value>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Poller {
    fn start(zero: Instant) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let kernel = Arc::new(Mutex::new(Value::Null));
        let answers = Arc::new(Mutex::new(Value::Null));
        let thread = {
            let (stop, samples, kernel) = (stop.clone(), samples.clone(), kernel.clone());
            let answers = answers.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let at = zero.elapsed().as_secs_f64();
                    let sample = match get(HEALTH, "/health", Duration::from_secs(2)) {
                        Ok((code, body)) => {
                            let b: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let mut k = kernel.lock().unwrap();
                            if k.is_null() && !b["details"]["web"]["kernel"].is_null() {
                                *k = b["details"]["web"]["kernel"].clone();
                            }
                            drop(k);
                            *answers.lock().unwrap() = b["details"]["web"]["answers"].clone();
                            json!({
                                "t": at,
                                "code": code,
                                "status": b["status"],
                                "webserver": b["checks"]["webserver"],
                                "heal": b["details"]["heal"]["total_attempts"],
                                "reasons": b["reasons"],
                            })
                        }
                        Err(e) => json!({ "t": at, "error": e.to_string() }),
                    };
                    samples.lock().unwrap().push(sample);
                    thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Poller {
            stop,
            samples,
            kernel,
            answers,
            thread: Some(thread),
        }
    }

    fn latest(&self) -> Value {
        self.samples
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Waits for an answer after `since` (seconds from zero) that `pred` accepts.
    fn wait(&self, limit: Duration, since: f64, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            let found = self
                .samples
                .lock()
                .unwrap()
                .iter()
                .find(|s| s["t"].as_f64().unwrap_or(0.0) >= since && pred(s))
                .cloned();
            if found.is_some() {
                return found;
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Every answer, the first `details.web.kernel` and the last `details.web.answers`.
    fn stop(mut self) -> (Vec<Value>, Value, Value) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap());
        let kernel = self.kernel.lock().unwrap().clone();
        let answers = self.answers.lock().unwrap().clone();
        (samples, kernel, answers)
    }
}

/// Clients that each send a request on a new connection, then pause, until stopped; answers
/// counted by status code, failures by kind.
struct Load {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start(clients: usize, path: &'static str, pause: Duration, timeout: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let threads = (0..clients)
            .map(|_| {
                let (stop, counts) = (stop.clone(), counts.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let key = match get(WEB, path, timeout) {
                            Ok((code, _)) => code.to_string(),
                            Err(e) => format!("{:?}", e.kind()),
                        };
                        *counts.lock().unwrap().entry(key).or_insert(0) += 1;
                        thread::sleep(pause);
                    }
                })
            })
            .collect();
        Load {
            stop,
            counts,
            threads,
        }
    }

    fn stop(self) -> Value {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        json!(*self.counts.lock().unwrap())
    }
}

/// The configuration of the verdict suite (tests/tests/verdicts.rs and the harness's agent): no
/// boot grace, details in every answer, a 500 ms cadence, a 1 s recovery, the web check on the backend probing `/up` with a 2 s timeout, and the CPU, memory
/// and saturation thresholds out of the way (this is a busy emulated machine).
fn config(restart: bool) -> String {
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

fn healthy(s: &Value) -> bool {
    s["code"] == 200 && s["status"] == "healthy" && s["webserver"] == "up"
}

fn agent_log() -> String {
    fs::read_to_string(AGENT_LOG).unwrap_or_default()
}

/// The agent's start, from its launch to its first `200 healthy` with the backend serving.
fn ready(poller: &Poller, zero: Instant) -> io::Result<f64> {
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
fn finish(poller: Poller, agent: Agent, backend: Backend, mut record: Value) -> Value {
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
fn busy() -> io::Result<Value> {
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
    let counts = load.stop();
    let record = json!({
        "ready": ready,
        "load_start": load_start,
        "load_end": load_end,
        "load": counts,
    });
    Ok(finish(poller, agent, backend, record))
}

/// The production failure: the backend frozen (SIGSTOP) under traffic, 2 clients each sending
/// a request on a new connection every 200 ms. Without a restart command: 503 `hung`, then
/// SIGCONT and 200 again. With one that really replaces it: healed without a 503.
fn frozen(restart: bool) -> io::Result<Value> {
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
    let counts = load.stop();
    let record = json!({
        "ready": ready,
        "stopped": stopped,
        "continued": continued,
        "load": counts,
        "frozen_pid": frozen_pid,
    });
    Ok(finish(poller, agent, backend, record))
}

/// The backend switched, under traffic, to a mode that fails every request: `no-respond` (it
/// reads each request and never answers) or `stop-accepting` (it keeps its port and never
/// accepts). The agent's configuration is the product's (`web.unanswered_after` 10 s,
/// `web.hung_after` 2 s). Then back to `normal`, and 200 again.
fn fault(mode: &str) -> io::Result<Value> {
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
    let counts = load.stop();
    let record = json!({
        "ready": ready,
        "switched": switched,
        "mended": mended,
        "load": counts,
    });
    Ok(finish(poller, agent, backend, record))
}

/// The install path of Debian 12 and Amazon Linux 2023: the .deb's own binary and shipped
/// configuration start on this kernel, say the tier in their first log line, and serve;
/// `health-agent check` says the tier at once.
fn deb() -> io::Result<Value> {
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
    Ok(finish(poller, agent, backend, record))
}
