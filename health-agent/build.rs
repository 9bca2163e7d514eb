//! Builds the kernel programs (`health-agent-ebpf`, nightly + bpf-linker) and leaves the object
//! in OUT_DIR for `include_bytes_aligned!`. `cargo xtask setup` installs what this needs.
//!
//! aya-build runs a nested cargo and prints each line of its stderr as `cargo:warning=`, so a
//! clean build would show dozens of `warning: … Compiling …` lines that are no warnings. This
//! script therefore runs itself again as a child (with `INNER` set) to do the build, and reads
//! what the child prints: cargo's progress lines are dropped, everything else (a real compiler
//! warning, the `rerun-if` instructions) is passed on. When the build fails, the rest goes to
//! stderr, which cargo shows with the failure: the compiler's errors, then the cause.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::Context as _;

/// Set in the child that runs aya-build.
const INNER: &str = "HEALTH_AGENT_EBPF_BUILD_INNER";

fn main() -> anyhow::Result<()> {
    if std::env::var_os(INNER).is_some() {
        return build_ebpf();
    }
    let me = std::env::current_exe().context("the build script cannot find itself")?;
    let out = Command::new(&me)
        .env(INNER, "1")
        // The child's error is read by people: its cause chain, not anyhow's backtrace.
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {} for the eBPF build", me.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let shown = stdout.lines().filter(|l| !is_progress(l));
    if !out.status.success() {
        // Cargo shows a failed build script's stderr: the compiler's messages, then the cause.
        let mut err = std::io::stderr().lock();
        for line in shown.filter(|l| !l.starts_with("cargo:") || l.starts_with("cargo:warning=")) {
            let _ = writeln!(
                err,
                "{}",
                line.strip_prefix("cargo:warning=").unwrap_or(line)
            );
        }
        let _ = err.write_all(&out.stderr);
        std::process::exit(out.status.code().unwrap_or(1));
    }
    let mut kept = std::io::stdout().lock();
    for line in shown {
        writeln!(kept, "{line}")?;
    }
    commit(&mut kept)?;
    Ok(())
}

/// The commit built, for `/metrics`' `health_agent_build_info`: `HEALTH_AGENT_COMMIT` when the
/// packager sets it, else git's HEAD (rebuilt when HEAD moves), else `unknown` (a source
/// tarball).
fn commit(out: &mut impl std::io::Write) -> anyhow::Result<()> {
    writeln!(out, "cargo:rerun-if-env-changed=HEALTH_AGENT_COMMIT")?;
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match std::env::var("HEALTH_AGENT_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into()),
    };
    // HEAD moves on a checkout; the branch's ref (in the common dir of a worktree) on a commit.
    let head = git(&["rev-parse", "--git-path", "HEAD"]);
    let branch =
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r]));
    for path in [head, branch].into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            let path = std::fs::canonicalize(&path)?;
            writeln!(out, "cargo:rerun-if-changed={}", path.display())?;
        }
    }
    writeln!(out, "cargo:rustc-env=HEALTH_AGENT_COMMIT={commit}")?;
    Ok(())
}

/// A `cargo:warning=` line that only reports the nested cargo's progress ("   Compiling x",
/// "    Finished …"), or is empty.
fn is_progress(line: &str) -> bool {
    let Some(text) = line.strip_prefix("cargo:warning=") else {
        return false;
    };
    if text.trim().is_empty() {
        return true;
    }
    // Cargo's status lines: a capitalised verb right-aligned in 12 columns, then a space.
    let verb = text.trim_start();
    let indent = text.len() - verb.len();
    let word_len = verb.find(' ').unwrap_or(verb.len());
    indent > 0
        && indent + word_len == 12
        && verb.starts_with(|c: char| c.is_ascii_uppercase())
        && verb[..word_len].chars().all(|c| c.is_ascii_alphabetic())
}

fn build_ebpf() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .context("health-agent has no parent directory")?
        .join("health-agent-ebpf");
    let root = root
        .to_str()
        .context("non-UTF-8 path to health-agent-ebpf")?;
    println!("cargo:rerun-if-changed=../health-common/src");
    let ebpf = aya_build::Package {
        name: "health-agent-ebpf",
        root_dir: root,
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom("nightly")).context(
        "building the eBPF programs (health-agent-ebpf) failed: the compiler's messages are above; \
         if they name bpf-linker or rust-src, run `cargo xtask setup`",
    )
}
