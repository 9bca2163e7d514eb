//! `cargo xtask package`: this machine's .deb,
//! `$CARGO_TARGET_DIR/debian/health-agent_<version>-<revision>_<arch>.deb` — the static release
//! binary with the systemd unit, the default config as a conffile and the docs, built by the
//! same code as `cargo xtask dist`'s (xtask/src/dist/deb.rs). tests/tests/service.rs,
//! systemd.rs and aws.rs install it.

use std::path::PathBuf;

use anyhow::Result;

use crate::{cmd, dist, setup};

/// Builds the package and returns its path.
pub fn run() -> Result<PathBuf> {
    setup::ensure_toolchain()?;
    let out = cmd::target_dir().join("debian");
    let (payload, release) = dist::stage_host(&out)?;
    let deb = dist::build_deb(&payload, &release, &out)?;
    println!("package: {}", deb.display());
    Ok(deb)
}
