//! PID 1 of the 6.1-kernel VMs (`tests/tests/old_kernel.rs` on x86_64,
//! `tests/tests/arm64_kernel.rs` on arm64; harness in `tests/src/qemu/`).
//!
//! The VM boots Debian's own Linux 6.1 under qemu with an initramfs and no root disk. This
//! program is its init, the same source for both architectures: it mounts what a booted Debian has mounted (proc, sysfs, devtmpfs,
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
    io::{self, Write},
    thread,
    time::{Duration, Instant},
};

use serde_json::json;

mod http;
mod scenarios;
mod servers;

use http::*;
use scenarios::*;
use servers::*;

const WEB: u16 = 9000;
const CONTROL: u16 = 9001;
const HEALTH: u16 = 8080;
const BACKEND_PID: &str = "/run/backend.pid";
const RESTARTS: &str = "/run/restarts";
const AGENT_LOG: &str = "/run/agent.log";
/// The static agent's configuration (`/bin/health-agent`); the .deb's is its shipped one.
const CONFIG: &str = "/etc/health-agent/config.toml";
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
            "machine": machine(),
            "btf": std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        })
    ));
    for name in scenarios.split(',').filter(|s| !s.is_empty()) {
        let record = match name {
            "busy" => busy(),
            "frozen" => frozen(false),
            "frozen_restarted" => frozen(true),
            "deb" => deb(),
            "check" => static_check(),
            "unresponsive" => fault("no-respond"),
            "never_accepts" => fault("stop-accepting"),
            "drain" => drain(),
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

/// `uname -m`: what the kernel says it runs on.
fn machine() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates each field.
    unsafe { std::ffi::CStr::from_ptr(u.machine.as_ptr()) }
        .to_string_lossy()
        .into_owned()
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
