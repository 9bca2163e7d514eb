//! Child processes: echo what runs, and fail with the command line in the error; and the
//! one-line steps setup and services print.

use std::{
    env,
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of this crate).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace when relative), else
/// `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    root().join(std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), PathBuf::from))
}

/// Runs `cmd` with the terminal's stdio, after printing it.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    eprintln!("+ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}` — is it installed and on PATH?"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; the error carries its stderr.
pub fn stdout(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}` — is it installed and on PATH?"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `cmd` starts and exits 0; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// `cmd` as a shell-like line, with its directory when that is not the workspace root.
pub fn display(cmd: &Command) -> String {
    let mut line = String::new();
    if let Some(dir) = cmd.get_current_dir().filter(|dir| *dir != root()) {
        let dir = dir.strip_prefix(root()).unwrap_or(dir);
        line = format!("(cd {} && ", dir.display());
    }
    let words = std::iter::once(cmd.get_program()).chain(cmd.get_args());
    let words: Vec<String> = words.map(quote).collect();
    line.push_str(&words.join(" "));
    if line.starts_with('(') {
        line.push(')');
    }
    line
}

fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    if word.is_empty() || word.contains(|c: char| c.is_whitespace() || c == '\'') {
        format!("'{}'", word.replace('\'', r"'\''"))
    } else {
        word.into_owned()
    }
}

/// `cargo` as a shell would run it, without the variables `cargo run` set for xtask itself
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, …). A build script that reads one of them (ring's
/// reads both) is run again whenever its value differs from the last build's: inherited, the
/// xtask's own path would rebuild ring and all that depends on it (rustls, reqwest) in every
/// clone, and after every build the tests or a shell made.
pub fn cargo() -> Command {
    const OWN_PREFIXES: &[&str] = &[
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
    ];
    let mut cargo = Command::new("cargo");
    for (key, _) in env::vars_os() {
        let name = key.to_string_lossy();
        if name == "CARGO_PRIMARY_PACKAGE" || OWN_PREFIXES.iter().any(|p| name.starts_with(p)) {
            cargo.env_remove(&key);
        }
    }
    cargo
}

/// `cargo` for the eBPF crate, whose rust-toolchain.toml selects nightly.
///
/// The outer `cargo xtask` runs on stable and leaves its choices in the environment:
/// RUSTUP_TOOLCHAIN would override rust-toolchain.toml, CARGO/RUSTC point at stable binaries,
/// RUSTFLAGS meant for the host would break the bpf target, and LD_LIBRARY_PATH holds stable's
/// sysroot. Drop them all (and xtask's own, see [`cargo`]) so the crate builds as a plain
/// `cargo` there would.
pub fn ebpf_cargo() -> Command {
    const OUTER: &[&str] = &[
        "RUSTUP_TOOLCHAIN",
        "RUSTUP_TOOLCHAIN_SOURCE",
        "RUST_RECURSION_COUNT",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTC",
        "CARGO_BUILD_RUSTC_WRAPPER",
        "CARGO_BUILD_RUSTFLAGS",
        "LD_LIBRARY_PATH",
    ];
    let mut cargo = cargo();
    cargo.current_dir(root().join("health-agent-ebpf"));
    for key in OUTER {
        cargo.env_remove(key);
    }
    cargo
}

/// The first `name` on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // "Uid:\treal\teffective\tsaved\tfs"; reading it avoids a libc dependency for one call.
    fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

pub fn home() -> Result<PathBuf> {
    env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set — set it to the user's home directory")
}

/// What a step found.
pub enum Outcome {
    /// Nothing to do; the note says why ("already present").
    Ok(&'static str),
    /// It changed something ("installed"); printed with the time it took.
    Done(&'static str),
}

/// Runs one step and prints its one-line result; `verb` prefixes the line.
pub fn step(verb: &str, thing: &str, f: impl FnOnce() -> Result<Outcome>) -> Result<()> {
    let start = Instant::now();
    match f().with_context(|| format!("{verb}: {thing} failed"))? {
        Outcome::Ok(note) => println!("{verb}: {thing}: ok ({note})"),
        Outcome::Done(what) => println!("{verb}: {thing}: {what} in {} s", secs(start)),
    }
    Ok(())
}

/// Whole seconds since `start`, for the timing lines.
pub fn secs(start: Instant) -> u64 {
    start.elapsed().as_secs()
}
