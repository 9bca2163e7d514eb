//! Debian's own Linux 6.1 booted under qemu (TCG), on x86_64 or arm64, with an initramfs that
//! holds the static agent, the fixture backend, busybox (the agent's `restart_command` runs
//! under `/bin/sh`), the sock_diag modules and `vm-init` (`tests/src/bin/vm-init/`) as PID 1,
//! which runs the scenarios named on the kernel command line and reports each on the serial
//! console. The same `vm-init` and scenarios run on both architectures.
//!
//! | piece | where from |
//! |---|---|
//! | kernel | `linux-image-6.1.0-*-cloud-{amd64,arm64}`, the package `linux-image-cloud-<arch>` depends on in Debian 12's archive (`apt-get download`), unpacked once into `/var/cache/health-agent/kernel-<package>` ([`debian`]) |
//! | agent | the release build for `<arch>-unknown-linux-musl` ([`static_agent`]) |
//! | fixture backend, `vm-init` | this crate's binaries, built static for the same target |
//! | `/bin/busybox`, `/bin/sh` | Debian's `busybox-static` of the guest's architecture |
//! | `/usr/bin/health-agent`, its shipped configuration, the libraries it loads (x86_64 only) | the .deb (`cargo xtask package`), glibc from this Debian 12 host |
//!
//! No root disk and no network device: the initramfs is the root file system and the guest's
//! traffic stays on its loopback. Nested KVM is not used (`-cpu host` fails on this machine's
//! MSRs, and arm64 is foreign anyway): TCG emulates both CPUs on one host thread, many times
//! slower than the host. A soft lockup panics the guest (`softlockup_panic=1`), so a stuck VM
//! fails at once with the kernel's trace on the console rather than at the time limit.

mod debian;
mod initramfs;
pub mod verdicts;

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

pub use debian::{busybox, cached, kernel};
pub use initramfs::static_agent;

/// The guest's architecture: the kernel booted, the emulator, and the static target its
/// binaries are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Debian 12's `cloud-amd64` kernel on qemu's q35 machine.
    X86_64,
    /// Debian 12's `cloud-arm64` kernel (the flavour for EC2's Graviton instances) on qemu's
    /// `virt` machine with a Neoverse N1, Graviton 2's core.
    Aarch64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// Rust's static (musl) target.
    pub fn target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-musl",
            Arch::Aarch64 => "aarch64-unknown-linux-musl",
        }
    }

    /// Debian's name of the architecture.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// What `uname -m` says in the guest.
    pub fn machine(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The emulator and the machine it emulates. One host thread for both vCPUs: with
    /// multi-threaded TCG, the kernel's text patching (a tracepoint attached at run time flips
    /// a static key in the syscall entry path) left both x86_64 vCPUs looping on the patched
    /// jump, a soft lockup of emulation only. On arm64, `-cpu max` would emulate pointer
    /// authentication's QARMA cipher on every call and return, far slower than the N1, which
    /// has none.
    fn qemu(self) -> (&'static str, [&'static str; 6]) {
        let tcg = ["-accel", "tcg,thread=single"];
        match self {
            Arch::X86_64 => (
                "qemu-system-x86_64",
                ["-machine", "q35", tcg[0], tcg[1], "-cpu", "max"],
            ),
            Arch::Aarch64 => (
                "qemu-system-aarch64",
                ["-machine", "virt", tcg[0], tcg[1], "-cpu", "neoverse-n1"],
            ),
        }
    }

    /// The serial console's device in the guest: the PC's 16550, the virt machine's PL011.
    fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }
}

/// What one boot reported.
pub struct VmRun {
    pub arch: Arch,
    /// The guest's `vm-ready` line: kernel release, machine, uptime at init, BTF.
    pub ready: Value,
    /// One record per scenario, in order (see bin/vm-init/).
    pub results: Vec<Value>,
    /// Every console line, for failure messages.
    pub console: Vec<String>,
    /// The kernel package booted.
    pub package: String,
    /// Building the guest's binaries (cargo's work, when any) and its initramfs.
    pub setup: Duration,
    /// From qemu's start to the guest's init (`vm-ready`), and to its last scenario's end
    /// (`vm-done`).
    pub boot: Duration,
    pub run: Duration,
    /// All of it, from the call.
    pub total: Duration,
}

impl VmRun {
    pub fn result(&self, scenario: &str) -> &Value {
        self.results
            .iter()
            .find(|r| r["scenario"] == scenario)
            .unwrap_or_else(|| {
                panic!(
                    "no result for {scenario}; console:\n{}",
                    self.console.join("\n")
                )
            })
    }
}

/// Boots `arch`'s 6.1 kernel with `scenarios` and returns their records; panics with the
/// console when the guest fails or does not finish within `limit`.
pub fn boot(arch: Arch, scenarios: &[&str], limit: Duration) -> VmRun {
    let start = Instant::now();
    let (vmlinuz, modules, package) = kernel(arch);
    let dir = tempfile::tempdir().expect("tempdir");
    let initrd = dir.path().join("initramfs.cpio");
    initramfs::initramfs(arch, &initrd, &modules);
    let setup = start.elapsed();

    let append = format!(
        "console={} rdinit=/init panic=-1 softlockup_panic=1 loglevel=5 vm.scenarios={}",
        arch.console(),
        scenarios.join(",")
    );
    let (emulator, machine) = arch.qemu();
    let booted = Instant::now();
    let mut qemu = Command::new(emulator)
        .args(machine)
        .args(["-smp", "2", "-m", "1536", "-nodefaults", "-display", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{emulator}: {e} (Debian's qemu-system-x86 and qemu-system-arm; cargo xtask \
                 setup installs them)"
            )
        });
    let (tx, rx) = mpsc::channel();
    let stdout = qemu.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut run = VmRun {
        arch,
        ready: Value::Null,
        results: Vec::new(),
        console: Vec::new(),
        package,
        setup,
        boot: Duration::ZERO,
        run: Duration::ZERO,
        total: Duration::ZERO,
    };
    let end = Instant::now() + limit;
    let mut done = false;
    while Instant::now() < end && !done {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            if matches!(qemu.try_wait(), Ok(Some(_))) {
                break;
            }
            continue;
        };
        let line = line.trim_end_matches('\r').to_owned();
        // The console as it comes (a record only by name: it holds every answer).
        match line.split_once(' ') {
            Some(("vm-result", json)) => println!("vm| vm-result ({} bytes)", json.len()),
            _ => println!("vm| {line}"),
        }
        if let Some(json) = line.strip_prefix("vm-ready ") {
            run.boot = booted.elapsed();
            run.ready = serde_json::from_str(json).unwrap_or(Value::Null);
        } else if let Some(json) = line.strip_prefix("vm-result ") {
            match serde_json::from_str(json) {
                Ok(v) => run.results.push(v),
                Err(e) => run.console.push(format!("(unparsed result: {e})")),
            }
            continue;
        } else if line == "vm-done" {
            run.run = booted.elapsed();
            done = true;
        }
        run.console.push(line);
    }
    let _ = qemu.kill();
    let output = qemu.wait_with_output().expect("qemu output");
    run.total = start.elapsed();
    let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    stderr.truncate(4000);
    assert!(
        done,
        "the VM did not finish its scenarios within {limit:?} (qemu: {}); console:\n{}",
        stderr.trim(),
        run.console.join("\n")
    );
    assert_eq!(
        run.ready["machine"],
        arch.machine(),
        "the guest is not {arch:?}: {}",
        run.ready
    );
    let errors: Vec<&String> = run
        .console
        .iter()
        .filter(|l| l.starts_with("vm-error"))
        .collect();
    assert!(
        errors.is_empty(),
        "the guest reported errors: {errors:?}; console:\n{}",
        run.console.join("\n")
    );
    let _ = std::io::stdout().flush();
    run
}
