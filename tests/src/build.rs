//! Where the workspace's binaries are, built on demand, and the guard that refuses to test an
//! agent binary older than its sources.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The workspace's root (where the README, deploy/ and docs/ are).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace's target directory for this build profile (where cargo put this test).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Path of a workspace binary, built on demand if `cargo test` was run on this crate alone.
pub fn binary(name: &str, package: &str) -> PathBuf {
    let path = target_dir().join(name);
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build -p {package} failed");
    }
    path
}

pub fn agent_binary() -> PathBuf {
    let bin = binary("health-agent", "health-agent");
    assert_fresh(
        &bin,
        &["health-agent", "health-common", "health-agent-ebpf"],
    );
    bin
}

/// Newest modification time of the files under `dir`: what a binary, package or image built
/// from them must not be older than.
pub fn newest(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                newest = newest.max(m);
            }
        }
    }
    newest
}

/// `cargo test -p health-agent-tests` does not rebuild the agent: refuse to test old code.
fn assert_fresh(bin: &Path, crates: &[&str]) {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .expect("binary mtime");
    let root = workspace();
    for c in crates {
        let src = root.join(c).join("src");
        assert!(
            newest(&src) <= built,
            "{} is older than {}: run `cargo build --bins` (cargo xtask test does) before these tests",
            bin.display(),
            src.display()
        );
    }
}
