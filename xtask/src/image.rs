//! `cargo xtask image`: the DaemonSet's OCI image, `health-agent:<version>` and `:latest`, in the
//! local Docker daemon. Nothing is pulled from a registry: `cargo xtask dist`'s image of this
//! machine's architecture (xtask/src/dist/oci.rs: the static binary, the default config and its
//! empty drop-in directory in one layer), written to `$CARGO_TARGET_DIR/image/` and loaded with
//! `docker load`.

use std::process::Command;

use anyhow::{Context, Result};

use crate::{cmd, dist, setup};

use dist::NAME;

/// Builds and loads the image and returns its `name:version` tag.
pub fn run() -> Result<String> {
    setup::ensure_toolchain()?;
    let out = cmd::target_dir().join("image");
    let (payload, release) = dist::stage_host(&out)?;
    let tarball = dist::build_oci(&payload, &release, &out)?;
    cmd::run(Command::new("docker").arg("load").arg("-i").arg(&tarball))
        .context("docker load failed — is dockerd running? `cargo xtask services` starts it")?;
    let loaded = dist::oci_tag(&release, payload.arch);
    let tag = format!("{NAME}:{}", release.version);
    for name in [&tag, &format!("{NAME}:latest")] {
        cmd::run(Command::new("docker").args(["tag", &loaded, name]))?;
    }
    let size =
        cmd::stdout(Command::new("docker").args(["image", "inspect", "-f", "{{.Size}}", &tag]))?;
    let size: u64 = size
        .trim()
        .parse()
        .context("docker image inspect: no size")?;
    println!(
        "image: {tag} and {NAME}:latest, {:.1} MB (one static binary, {})",
        size as f64 / 1e6,
        payload.arch.target
    );
    Ok(tag)
}
