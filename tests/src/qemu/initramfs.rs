//! The guest's initramfs: a `newc` cpio archive the kernel unpacks as its root file system,
//! holding the static agent, the fixture backend and `vm-init` built for the guest's
//! architecture, busybox, the sock_diag modules and, on x86_64, the .deb's binary with its
//! shipped configuration and the host's glibc.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use super::{debian, Arch};

/// Builds what the guest runs and no earlier stage builds: this crate's fixture backend and
/// `vm-init`, static for `arch` (seconds).
fn build_guest(arch: Arch) -> Result<(), String> {
    cargo_build(
        arch,
        &[
            "-p",
            "health-agent-tests",
            "--bin",
            "fixture-backend",
            "--bin",
            "vm-init",
        ],
    )
}

/// The static agent for `arch`, from the workspace's target directory, as
/// `cargo xtask test` built it before the tests: x86_64's by the `image` stage, aarch64's by
/// the `dist` stage (both `dist::static_binary`). A build from here would differ from those in
/// its build scripts' environment and rebuild them each time; one older than the sources is
/// refused.
pub fn static_agent(arch: Arch) -> PathBuf {
    let agent = workspace_target()
        .join(arch.target())
        .join("release/health-agent");
    let how = match arch {
        Arch::X86_64 => "`cargo xtask image`".to_owned(),
        Arch::Aarch64 => format!(
            "`cargo xtask dist`, or `cargo build --release -p health-agent --target {}`",
            arch.target()
        ),
    };
    let built = fs::metadata(&agent)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("no {}: run {how} (cargo xtask test does)", agent.display()));
    for c in ["health-agent", "health-common", "health-agent-ebpf"] {
        assert!(
            crate::newest(&crate::workspace().join(c).join("src")) <= built,
            "{} is older than {c}/src: run {how} (cargo xtask test does)",
            agent.display()
        );
    }
    agent
}

/// `cargo build --release --target <arch's static target>` of `what`. Cargo's variables of
/// this test process are left out, so that the build is the one a shell would run: cargo
/// rebuilds a build script that reads one of them (ring's reads `CARGO_MANIFEST_DIR`) whenever
/// it differs from the last build's.
fn cargo_build(arch: Arch, what: &[&str]) -> Result<(), String> {
    let mut cargo = Command::new(env!("CARGO"));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_") && !["CARGO_HOME", "CARGO_TARGET_DIR"].contains(&key.as_str())
        {
            cargo.env_remove(&key);
        }
    }
    let status = cargo
        .args(["build", "--release", "--target", arch.target()])
        .args(what)
        .current_dir(crate::workspace())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build --release --target {} {} failed (cargo xtask setup adds the target and \
             its cross compiler)",
            arch.target(),
            what.join(" ")
        ))
    }
}

/// The static binaries the guest runs: the agent ([`static_agent`]), and this crate's fixture
/// backend and `vm-init` ([`build_guest`]).
fn static_binaries(arch: Arch) -> [PathBuf; 3] {
    build_guest(arch).unwrap_or_else(|e| panic!("{e}"));
    let dir = workspace_target().join(arch.target()).join("release");
    [
        static_agent(arch),
        dir.join("fixture-backend"),
        dir.join("vm-init"),
    ]
}

/// The workspace's target directory (the one holding `debug/` and `<triple>/`).
fn workspace_target() -> PathBuf {
    crate::target_dir()
        .parent()
        .expect("target dir")
        .to_path_buf()
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

/// The guest's initramfs for `arch`, written to `out`. The .deb is x86_64's only.
pub(super) fn initramfs(arch: Arch, out: &Path, modules: &Path) {
    let [agent, backend, init] = static_binaries(arch);
    let busybox = debian::busybox(arch);
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
    cpio.file("bin/busybox", &busybox);
    cpio.symlink("bin/sh", "busybox");
    let unpacked = tempfile::tempdir().expect("tempdir");
    let deb = if arch == Arch::X86_64 {
        deb_files(&crate::nspawn::built_deb(), unpacked.path())
    } else {
        Vec::new()
    };
    let mut dirs = std::collections::BTreeSet::new();
    for (at, from) in deb {
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
