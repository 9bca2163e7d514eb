//! `cargo xtask setup`: what a fresh Debian 12 machine (as root) needs to build, test and demo the
//! agent. Every step checks before it changes anything, so a second run only prints "ok".
//! `cargo xtask demo` runs only the steps it needs ([`for_demo`]).

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    cmd::{self, step, Outcome},
    services,
};

mod packages;
use packages::packages;

#[derive(clap::Args, Default)]
pub struct Args {
    /// Build bpf-linker into this cargo root even when a good one is installed (tests the recipe).
    #[arg(long, hide = true, value_name = "DIR")]
    pub bpf_linker_root: Option<PathBuf>,
}

const BPF_LINKER_VERSION: &str = "0.13.0";
/// The deploy-file validators that come from PyPI, by the command each installs.
/// (command, PyPI requirement): the deploy validators, and moto (a CloudWatch API server for
/// tests/tests/cloudwatch.rs and the bench; boto3 comes with it and reads back what arrived).
const PIP_TOOLS: &[(&str, &str)] = &[
    ("cfn-lint", "cfn-lint"),
    ("kubernetes-validate", "kubernetes-validate"),
    ("moto_server", "moto[server]"),
];
const TRACEFS: &str = "/sys/kernel/tracing";
/// The static target `cargo xtask image` builds for: it needs no libc from the image; rustup's
/// target, musl-tools for the C parts (ring).
pub const TARGET: &str = "x86_64-unknown-linux-musl";
/// Every static target a release publishes (`cargo xtask dist`); the aarch64 one links with
/// Debian's cross gcc (.cargo/config.toml), against the musl that rustup ships self-contained.
pub const STATIC_TARGETS: &[&str] = &[TARGET, "aarch64-unknown-linux-musl"];

pub fn run(args: &Args) -> Result<()> {
    step("setup", "rust-src (nightly)", rust_src)?;
    step("setup", "bpf-linker", || {
        bpf_linker(args.bpf_linker_root.as_deref())
    })?;
    step("setup", "debian packages", packages)?;
    step(
        "setup",
        "rust targets (musl, x86_64 and aarch64)",
        musl_target,
    )?;
    step("setup", "tracefs", tracefs)?;
    step("setup", "deploy validators and moto (PyPI)", pip_tools)?;
    step("setup", "crates (cargo fetch)", fetch_crates)?;
    step(
        "setup",
        "arm64 package lists (the arm64 VM's kernel and busybox)",
        arm64_lists,
    )?;
    step(
        "setup",
        "test roots (Debian's 6.1 kernels, x86_64 and arm64; nspawn roots)",
        test_roots,
    )?;
    services::run("setup")
}

/// Every crate the lock file names, so the stages after setup build from the local registry.
fn fetch_crates() -> Result<Outcome> {
    cmd::run(
        cmd::cargo()
            .current_dir(cmd::root())
            .args(["fetch", "--locked", "--quiet"]),
    )?;
    Ok(Outcome::Ok("all in the local registry"))
}

/// A package apt knows for arm64 once the architecture is added and its lists fetched.
const ARM64_PROBE: &str = "linux-image-cloud-arm64:arm64";

/// Debian's arm64 package lists, for the arm64 VM's kernel and busybox (tests/tests/
/// arm64_kernel.rs, which `apt-get download` unpacks, never installs): `dpkg
/// --add-architecture arm64` and `apt-get update`, when the packages step (installing
/// `musl-dev:arm64`) has not left them.
fn arm64_lists() -> Result<Outcome> {
    if cmd::succeeds(Command::new("apt-cache").args(["show", ARM64_PROBE])) {
        return Ok(Outcome::Ok("already present"));
    }
    ensure!(
        cmd::is_root(),
        "adding the arm64 architecture needs root — run: sudo cargo xtask setup"
    );
    cmd::run(Command::new("dpkg").args(["--add-architecture", "arm64"]))
        .context("dpkg --add-architecture arm64 failed")?;
    cmd::run(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .arg("update"),
    )
    .context("apt-get update failed — check the network and /etc/apt/sources.list*")?;
    ensure!(
        cmd::succeeds(Command::new("apt-cache").args(["show", ARM64_PROBE])),
        "apt knows no {ARM64_PROBE} after adding arm64 — does the mirror carry arm64?"
    );
    Ok(Outcome::Done("added"))
}

/// What the VM and systemd tests boot, from the host's Debian mirror: here, so that the test
/// stage reaches loopback and its own namespaces only. Debian 12's 6.1 kernel packages for
/// x86_64 and arm64 and arm64's busybox (unpacked) for tests/tests/old_kernel.rs and
/// arm64_kernel.rs, and the root file system mmdebstrap makes for tests/tests/systemd.rs and
/// aws.rs; all cached under /var/cache/health-agent.
fn test_roots() -> Result<Outcome> {
    use health_agent_tests::{
        nspawn,
        qemu::{self, Arch},
    };
    let cached = std::panic::catch_unwind(|| {
        let cached = Arch::ALL.iter().all(|a| qemu::cached(*a)) && nspawn::rootfs_cached();
        for arch in Arch::ALL {
            qemu::kernel(arch);
            qemu::busybox(arch);
        }
        nspawn::rootfs();
        nspawn::dnf_rootfs();
        cached
    })
    .map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        anyhow::anyhow!("{why}")
    })?;
    Ok(if cached {
        Outcome::Ok("already cached")
    } else {
        Outcome::Done("downloaded")
    })
}

/// The static target `cargo xtask image` builds for, on the workspace's (stable) toolchain.
fn musl_target() -> Result<Outcome> {
    let installed = cmd::stdout(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("rustup target list failed")?;
    let missing: Vec<&str> = STATIC_TARGETS
        .iter()
        .copied()
        .filter(|target| !installed.lines().any(|line| line.trim() == *target))
        .collect();
    if missing.is_empty() {
        return Ok(Outcome::Ok("already present"));
    }
    cmd::run(
        Command::new("rustup")
            .args(["target", "add"])
            .args(&missing),
    )
    .with_context(|| {
        format!(
            "could not add {} (about 40 MB each) — check the network",
            missing.join(", ")
        )
    })?;
    Ok(Outcome::Done("installed"))
}

/// cargo-fuzz, for `cargo xtask fuzz` only: a few minutes to build, so `cargo xtask test` (whose
/// fuzz-smoke stage runs the same targets on stable) never installs it.
pub fn cargo_fuzz() -> Result<Outcome> {
    if cmd::succeeds(cmd::cargo().args(["fuzz", "--version"])) {
        return Ok(Outcome::Ok("already installed"));
    }
    cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked"]))
        .context("cargo install cargo-fuzz failed")?;
    Ok(Outcome::Done("installed"))
}

/// What `cargo xtask demo` uses, and nothing more: the toolchain that builds the eBPF programs,
/// and tracefs. The bundled backend is built from this workspace and talks to nothing, so no
/// Debian package, PyPI tool or service is installed for it: the rest waits for
/// `cargo xtask setup` (which `cargo xtask test` and .ci/run call).
pub fn for_demo() -> Result<()> {
    step("demo", "rust-src (nightly)", rust_src)?;
    step("demo", "bpf-linker", || bpf_linker(None))?;
    step("demo", "tracefs", tracefs)
}

/// The part of setup a build needs; runs the whole setup when it is missing.
pub fn ensure_toolchain() -> Result<()> {
    let llvm = NightlyLlvm::detect()?;
    let linker = cmd::on_path("bpf-linker");
    if has_rust_src()? && linker.is_some_and(|bin| linker_mismatch(&bin, &llvm).is_none()) {
        return Ok(());
    }
    println!("build: rust-src or bpf-linker missing, running setup first");
    run(&Args::default())
}

fn has_rust_src() -> Result<bool> {
    let installed = cmd::stdout(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("rustup has no nightly toolchain — the eBPF crate needs nightly 1.97 (LLVM 22)")?;
    Ok(installed.lines().any(|line| line.trim() == "rust-src"))
}

fn rust_src() -> Result<Outcome> {
    if has_rust_src()? {
        return Ok(Outcome::Ok("already present"));
    }
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
    .context("could not add rust-src (about 80 MB download) — check the network and retry")?;
    Ok(Outcome::Done("installed"))
}

/// The LLVM inside the nightly rustc; bpf-linker must link this very library, or the bitcode
/// rustc emits for the eBPF crate may not load.
struct NightlyLlvm {
    /// "22" from `LLVM version: 22.1.4`.
    major: String,
    /// `<sysroot>/lib/libLLVM.so.<ver>-rust-<ver>-nightly`.
    lib: PathBuf,
}

impl NightlyLlvm {
    fn detect() -> Result<Self> {
        let version = cmd::stdout(Command::new("rustc").args(["+nightly", "-vV"]))?;
        let major = llvm_major(&version)
            .context("`rustc +nightly -vV` printed no `LLVM version:` line")?
            .to_owned();
        let sysroot = cmd::stdout(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
        let dir = Path::new(sysroot.trim()).join("lib");
        let mut libs: Vec<PathBuf> = fs::read_dir(&dir)
            .with_context(|| format!("cannot read the nightly's {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| file_name(path).starts_with("libLLVM.so."))
            .collect();
        match libs.len() {
            1 => Ok(Self {
                major,
                lib: libs.remove(0),
            }),
            0 => bail!(
                "the nightly ships no libLLVM.so.* in {} — bpf-linker has no LLVM to link",
                dir.display()
            ),
            _ => bail!(
                "several libLLVM.so.* in {}: {libs:?} — expected one",
                dir.display()
            ),
        }
    }

    fn file_name(&self) -> &str {
        file_name(&self.lib)
    }
}

/// "22" from the `LLVM version: 22.1.4` line of `rustc -vV`.
fn llvm_major(rustc_version: &str) -> Option<&str> {
    rustc_version
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|version| version.split('.').next())
}

/// The libLLVM line of `ldd` output as (name, resolved path).
fn ldd_libllvm(ldd: &str) -> Option<(&str, &str)> {
    ldd.lines().find_map(|line| {
        let (name, rest) = line.trim().split_once(" => ")?;
        let path = rest.split(" (").next()?;
        name.starts_with("libLLVM").then_some((name, path))
    })
}

fn file_name(path: &Path) -> &str {
    path.file_name()
        .and_then(|name| name.to_str())
        .unwrap_or_default()
}

fn bpf_linker(root: Option<&Path>) -> Result<Outcome> {
    let llvm = NightlyLlvm::detect()?;
    if let Some(root) = root {
        println!(
            "setup: bpf-linker: building into {} as asked",
            root.display()
        );
    } else {
        let reason = match cmd::on_path("bpf-linker") {
            None => "not on PATH".to_owned(),
            Some(bin) => match linker_mismatch(&bin, &llvm) {
                None => return Ok(Outcome::Ok("already present")),
                Some(reason) => reason,
            },
        };
        println!(
            "setup: bpf-linker: {reason}; building {BPF_LINKER_VERSION} against the nightly's \
             LLVM {} (about a minute)",
            llvm.major
        );
    }

    install_bpf_linker(&llvm, root)?;

    let bin = match root {
        Some(root) => root.join("bin/bpf-linker"),
        None => cmd::on_path("bpf-linker").context(
            "bpf-linker was installed into ~/.cargo/bin, which is not on PATH — add it: \
             export PATH=\"$HOME/.cargo/bin:$PATH\"",
        )?,
    };
    if let Some(reason) = linker_mismatch(&bin, &llvm) {
        bail!(
            "the freshly built {} is still unusable: {reason}",
            bin.display()
        );
    }
    Ok(Outcome::Done("installed"))
}

/// Why `bin` is not a bpf-linker 0.13 running on the nightly's own libLLVM, or None if it is.
fn linker_mismatch(bin: &Path, llvm: &NightlyLlvm) -> Option<String> {
    let version = match cmd::stdout(Command::new(bin).arg("--version")) {
        Ok(version) => version,
        Err(e) => return Some(format!("it does not run ({e:#})")),
    };
    let version = version.trim();
    if version
        .strip_prefix("bpf-linker 0.13.")
        .is_none_or(str::is_empty)
    {
        return Some(format!("found `{version}`, want 0.13.x"));
    }
    let ldd = match cmd::stdout(Command::new("ldd").arg(bin)) {
        Ok(ldd) => ldd,
        Err(e) => return Some(format!("ldd failed ({e:#})")),
    };
    if let Some(line) = ldd.lines().find(|line| line.contains("not found")) {
        return Some(format!("a library does not resolve: {}", line.trim()));
    }
    let Some((name, path)) = ldd_libllvm(&ldd) else {
        return Some("it does not link libLLVM dynamically".to_owned());
    };
    if name != llvm.file_name() {
        return Some(format!(
            "it links {name}, the nightly has {}",
            llvm.file_name()
        ));
    }
    let same_file = match (fs::canonicalize(path), fs::canonicalize(&llvm.lib)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_file {
        return Some(format!(
            "its {name} is {path}, not the nightly's {}",
            llvm.lib.display()
        ));
    }
    None
}

/// Builds bpf-linker against the nightly's libLLVM through a prefix of symlinks: bpf-linker's
/// build looks for `libLLVM.so` under `$LLVM_PREFIX/lib` and records that directory as RUNPATH,
/// where the loader then needs the exact versioned name. The prefix must therefore outlive the
/// build; it lives under ~/.local/share.
fn install_bpf_linker(llvm: &NightlyLlvm, root: Option<&Path>) -> Result<()> {
    let prefix = cmd::home()?
        .join(".local/share/health-agent")
        .join(format!("llvm-{}", llvm.major));
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    for name in ["libLLVM.so", llvm.file_name()] {
        link(&llvm.lib, &lib.join(name))?;
    }

    let feature = format!("llvm-{}", llvm.major);
    let install = |locked: bool| {
        let mut cargo = cmd::cargo();
        // Not in the workspace, so its .cargo/config.toml does not apply to this build.
        cargo.current_dir(&prefix).env("LLVM_PREFIX", &prefix);
        cargo.args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--force",
        ]);
        cargo.args(["--no-default-features", "--features", &feature]);
        if locked {
            cargo.arg("--locked");
        }
        if let Some(root) = root {
            cargo.arg("--root").arg(root);
        }
        cmd::run(&mut cargo)
    };
    if let Err(e) = install(true) {
        println!("setup: bpf-linker: --locked build failed ({e:#}); retrying without --locked");
        install(false).with_context(|| {
            format!(
                "cargo install bpf-linker failed — does bpf-linker {BPF_LINKER_VERSION} have a \
                 `{feature}` feature for the nightly's LLVM?"
            )
        })?;
    }
    Ok(())
}

/// Points the symlink `path` at `target`, replacing whatever is there.
fn link(target: &Path, path: &Path) -> Result<()> {
    if fs::read_link(path).is_ok_and(|current| current == target) {
        return Ok(());
    }
    if path.symlink_metadata().is_ok() {
        fs::remove_file(path).with_context(|| format!("cannot replace {}", path.display()))?;
    }
    symlink(target, path)
        .with_context(|| format!("cannot link {} -> {}", path.display(), target.display()))
}

/// Where setup installs the PyPI validators when they are not on PATH: a venv of its own, so
/// Debian's externally managed Python is left alone.
fn tools_venv() -> Result<PathBuf> {
    Ok(cmd::home()?.join(".local/share/health-agent/deploy-tools"))
}

/// A PyPI validator: the one on PATH, else the one in setup's venv.
pub fn pip_tool(name: &str) -> Result<PathBuf> {
    if let Some(bin) = cmd::on_path(name) {
        return Ok(bin);
    }
    let bin = tools_venv()?.join("bin").join(name);
    anyhow::ensure!(
        bin.is_file(),
        "{name} is not installed — run `cargo xtask setup` (it installs it from PyPI)"
    );
    Ok(bin)
}

fn pip_tools() -> Result<Outcome> {
    let missing: Vec<&str> = PIP_TOOLS
        .iter()
        .filter(|(bin, _)| pip_tool(bin).is_err())
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(Outcome::Ok("already present"));
    }
    let venv = tools_venv()?;
    println!(
        "setup: deploy validators: installing {} into {}",
        missing.join(" "),
        venv.display()
    );
    if !venv.join("bin/pip").is_file() {
        cmd::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .context("python3 -m venv failed — is python3-venv installed?")?;
    }
    cmd::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet"])
            .args(&missing),
    )
    .context("pip install failed — check the network (PyPI) and retry")?;
    Ok(Outcome::Done("installed"))
}

fn tracefs() -> Result<Outcome> {
    if Path::new(TRACEFS).join("events").exists() {
        return Ok(Outcome::Ok("already present"));
    }
    let mut mount = Command::new("mount");
    mount.args(["-t", "tracefs", "nodev", TRACEFS]);
    cmd::run(&mut mount).context(
        "cannot mount tracefs — run as root, or by hand: mount -t tracefs nodev /sys/kernel/tracing",
    )?;
    Ok(Outcome::Done("mounted at /sys/kernel/tracing"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_comes_from_rustc_vv() {
        let vv = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nhost: x86_64-unknown-linux-gnu\n\
                  release: 1.97.0-nightly\nLLVM version: 22.1.4\n";
        assert_eq!(llvm_major(vv), Some("22"));
        assert_eq!(llvm_major("rustc 1.97.0-nightly\n"), None);
    }

    #[test]
    fn ldd_libllvm_finds_the_resolved_library() {
        let ldd = "\tlinux-vdso.so.1 (0x00007fb299d93000)\n\
                   \tlibLLVM.so.22.1-rust-1.97.0-nightly => /p/libLLVM.so.22.1-rust-1.97.0-nightly (0x1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fb28f01e000)\n";
        assert_eq!(
            ldd_libllvm(ldd),
            Some((
                "libLLVM.so.22.1-rust-1.97.0-nightly",
                "/p/libLLVM.so.22.1-rust-1.97.0-nightly"
            ))
        );
        assert_eq!(
            ldd_libllvm("\tlibLLVM.so.22 => not found\n"),
            Some(("libLLVM.so.22", "not found"))
        );
        assert_eq!(ldd_libllvm("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"), None);
    }
}
