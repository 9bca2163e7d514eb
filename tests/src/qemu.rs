//! Debian's own Linux 6.1 booted under qemu (TCG) with an initramfs that holds the static agent,
//! the fixture backend, busybox (the agent's `restart_command` runs under `/bin/sh`), the
//! sock_diag modules and `vm-init` (`tests/src/bin/vm-init/`) as PID 1, which runs the
//! scenarios named on the kernel command line and reports each on the serial console.
//!
//! | piece | where from |
//! |---|---|
//! | kernel | `linux-image-6.1.0-*-cloud-amd64`, the package `linux-image-cloud-amd64` depends on in Debian 12's archive (`apt-get download`), unpacked once into `/var/cache/health-agent/kernel-<package>` |
//! | agent | the release build for `x86_64-unknown-linux-musl` (the image's binary: `cargo xtask image` builds it) |
//! | fixture backend, `vm-init` | this crate's binaries, built static for the same target |
//! | `/bin/busybox`, `/bin/sh` | Debian's `busybox-static` |
//! | `/usr/bin/health-agent`, its shipped configuration, the libraries it loads | the .deb (`cargo xtask package`), glibc from this Debian 12 host |
//!
//! No root disk and no network device: the initramfs is the root file system and the guest's
//! traffic stays on its loopback. Nested KVM is not used (`-cpu host` fails on this machine's
//! MSRs): TCG emulates both CPUs on one host thread, many times slower than the host. A soft
//! lockup panics the guest (`softlockup_panic=1`), so a stuck VM fails at once with the kernel's
//! trace on the console rather than at the time limit.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{stdout_of, succeed};

const CACHE: &str = "/var/cache/health-agent";
const TARGET: &str = "x86_64-unknown-linux-musl";
const META: &str = "linux-image-cloud-amd64";
const BUSYBOX: &str = "/bin/busybox";

/// Where Debian's 6.1 cloud kernel package is unpacked, and the package's name.
fn kernel_dir() -> (PathBuf, String) {
    let depends = stdout_of(Command::new("apt-cache").args(["depends", META]));
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("apt-cache depends {META}: no kernel package (apt-get update?)"));
    assert!(
        package.starts_with("linux-image-6.1."),
        "{META} depends on {package}: not Debian 12's 6.1 kernel"
    );
    (
        PathBuf::from(CACHE).join(format!("kernel-{package}")),
        package,
    )
}

/// Whether [`kernel`] has the package unpacked already (it then downloads nothing).
pub fn kernel_cached() -> bool {
    kernel_dir().0.join("boot").exists()
}

/// Debian's 6.1 cloud kernel: `(vmlinuz, the kernel's modules directory, the package name)`,
/// downloaded from the host's Debian mirror and unpacked when missing. `cargo xtask setup` does
/// that, so the test stage reaches no mirror.
pub fn kernel() -> (PathBuf, PathBuf, String) {
    let (dir, package) = kernel_dir();
    if !dir.join("boot").exists() {
        fs::create_dir_all(CACHE).expect("cache dir");
        let tmp = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
        fs::create_dir_all(&tmp).expect("tmp dir");
        succeed(
            Command::new("apt-get")
                .args(["download", &package])
                .current_dir(&tmp),
        );
        let deb = fs::read_dir(&tmp)
            .expect("tmp dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .expect("the downloaded .deb");
        let root = tmp.join("root");
        succeed(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&root, &dir).expect("rename the unpacked kernel into the cache");
        let _ = fs::remove_dir_all(&tmp);
    }
    let version = package.trim_start_matches("linux-image-");
    (
        dir.join(format!("boot/vmlinuz-{version}")),
        dir.join(format!("lib/modules/{version}")),
        package,
    )
}

/// The static binaries the guest runs: the image's agent (`cargo xtask image` builds it; a
/// build from here would differ from that one in its build scripts' environment and rebuild it
/// each time), and this crate's fixture backend and `vm-init`, built here (seconds).
fn static_binaries() -> [PathBuf; 3] {
    let dir = crate::target_dir()
        .parent()
        .expect("target dir")
        .join(TARGET)
        .join("release");
    let agent = dir.join("health-agent");
    let built = fs::metadata(&agent)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "no {}: run `cargo xtask image` (cargo xtask test does)",
                agent.display()
            )
        });
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for c in ["health-agent", "health-common", "health-agent-ebpf"] {
        assert!(
            crate::newest(&root.join(c).join("src")) <= built,
            "{} is older than {c}/src: run `cargo xtask image` (cargo xtask test does)",
            agent.display()
        );
    }
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "-p",
            "health-agent-tests",
        ])
        .args(["--bin", "fixture-backend", "--bin", "vm-init"])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(
        status.success(),
        "cargo build --release --target {TARGET} of the fixture backend and vm-init failed \
         (cargo xtask setup adds the target)"
    );
    [agent, dir.join("fixture-backend"), dir.join("vm-init")]
}

/// A `newc` cpio archive, the format the kernel unpacks as its initramfs.
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Cpio {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            self.ino,
            mode,
            0,
            0,
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, from: &Path) {
        let data = fs::read(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        let mode = fs::metadata(from).expect("metadata").permissions().mode() & 0o777;
        self.entry(name, 0o100000 | mode, (0, 0), &data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, (0, 0), target.as_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

/// The .deb's binary and shipped configuration, and the libraries the binary loads (from this
/// Debian 12 host, the same release the .deb is for), as `(path in the guest, file)`.
fn deb_files(deb: &Path, into: &Path) -> Vec<(String, PathBuf)> {
    let x = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(into)
        .status()
        .expect("dpkg-deb");
    assert!(x.success(), "dpkg-deb -x {}", deb.display());
    let bin = into.join("usr/bin/health-agent");
    let mut files = vec![
        ("usr/bin/health-agent".to_owned(), bin.clone()),
        (
            "etc/health-agent/health-agent.toml".to_owned(),
            into.join("etc/health-agent/health-agent.toml"),
        ),
    ];
    let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(str::to_owned);
        if let Some(path) = path {
            files.push((path.trim_start_matches('/').to_owned(), PathBuf::from(path)));
        }
    }
    files
}

/// The guest's initramfs, written to `out`.
fn initramfs(out: &Path, modules: &Path) {
    let [agent, backend, init] = static_binaries();
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} missing: Debian's busybox-static (cargo xtask setup installs it)"
    );
    let mut cpio = Cpio::new();
    for d in [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "proc",
        "run",
        "sys",
        "tmp",
    ] {
        cpio.dir(d);
    }
    // The kernel opens /dev/console for init's stdio before anything is mounted.
    cpio.entry("dev/console", 0o020600, (5, 1), &[]);
    cpio.file("init", &init);
    cpio.file("bin/health-agent", &agent);
    cpio.file("bin/fixture-backend", &backend);
    cpio.file("bin/busybox", Path::new(BUSYBOX));
    cpio.symlink("bin/sh", "busybox");
    let unpacked = tempfile::tempdir().expect("tempdir");
    let mut dirs = std::collections::BTreeSet::new();
    for (at, from) in deb_files(&crate::nspawn::built_deb(), unpacked.path()) {
        // Parents first: the kernel's unpacker creates no missing directory.
        let parents: Vec<&Path> = Path::new(&at).ancestors().skip(1).collect();
        for parent in parents.into_iter().rev() {
            let p = parent.to_string_lossy().into_owned();
            if !p.is_empty() && dirs.insert(p.clone()) && !["etc", "lib"].contains(&p.as_str()) {
                cpio.dir(&p);
            }
        }
        cpio.file(&at, &from);
    }
    for m in ["inet_diag", "tcp_diag"] {
        cpio.file(
            &format!("lib/modules/{m}.ko"),
            &modules.join(format!("kernel/net/ipv4/{m}.ko")),
        );
    }
    fs::write(out, cpio.finish()).expect("write the initramfs");
}

/// What one boot reported.
pub struct VmRun {
    /// The guest's `vm-ready` line: kernel release, uptime at init, BTF.
    pub ready: Value,
    /// One record per scenario, in order (see bin/vm-init/).
    pub results: Vec<Value>,
    /// Every console line, for failure messages.
    pub console: Vec<String>,
    /// The kernel package booted.
    pub package: String,
    /// Building the initramfs (binaries already built), and qemu's start to the guest's init.
    pub setup: Duration,
    pub boot: Duration,
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

/// Boots the 6.1 kernel with `scenarios` and returns their records; panics with the console
/// when the guest fails or does not finish within `limit`.
pub fn boot(scenarios: &[&str], limit: Duration) -> VmRun {
    let start = Instant::now();
    let (vmlinuz, modules, package) = kernel();
    let dir = tempfile::tempdir().expect("tempdir");
    let initrd = dir.path().join("initramfs.cpio");
    initramfs(&initrd, &modules);
    let setup = start.elapsed();

    let append = format!(
        "console=ttyS0 rdinit=/init panic=-1 softlockup_panic=1 loglevel=5 vm.scenarios={}",
        scenarios.join(",")
    );
    let booted = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        // One host thread for both vCPUs: with multi-threaded TCG, the kernel's text patching
        // (a tracepoint attached at run time flips a static key in the syscall entry path)
        // left both vCPUs looping on the patched jump, a soft lockup of emulation only.
        .args([
            "-machine",
            "q35",
            "-accel",
            "tcg,thread=single",
            "-cpu",
            "max",
        ])
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
        .expect("qemu-system-x86_64 (Debian's qemu-system-x86; cargo xtask setup installs it)");
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
        ready: Value::Null,
        results: Vec::new(),
        console: Vec::new(),
        package,
        setup,
        boot: Duration::ZERO,
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
