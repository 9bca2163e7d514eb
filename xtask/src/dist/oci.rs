//! The container image, written here without a registry, a base image or a builder: one layer
//! holding the static binary, the default config and its empty drop-in directory (what
//! `FROM scratch` plus two `COPY`s makes), an image config naming the architecture, and a
//! manifest. The tarball is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`)
//! and, with `manifest.json` beside it, a `docker save` archive too, which every `docker load`
//! reads (Docker before 25 only knows that one).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{
    payload::{self, Item, What, BIN, CONFIG, DROPINS},
    release::rfc3339,
    sha256_hex, Arch, Payload, Release, NAME,
};

/// The tag `docker load` gives the image: `health-agent:<version>-<arch>`, one per
/// architecture, so loading one never replaces the other.
pub fn tag(release: &Release, arch: &Arch) -> String {
    format!("{NAME}:{}-{}", release.version, arch.oci)
}

/// Builds `health-agent-<version>-oci-<arch>.tar` in `out` and returns its path.
pub fn build(p: &Payload, release: &Release, out: &Path) -> Result<PathBuf> {
    let name = format!("{NAME}-{}-oci-{}", release.version, p.arch.oci);
    let stage = out.join(format!(".{name}"));
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("cannot clear {}", stage.display()))?;
    }
    let rootfs = stage.join("rootfs");
    let items = [
        Item {
            path: BIN.to_owned(),
            what: What::File(p.bin.clone()),
            mode: 0o755,
        },
        Item {
            path: CONFIG.to_owned(),
            what: What::Text(p.config.clone()),
            mode: 0o644,
        },
        Item {
            path: DROPINS.to_owned(),
            what: What::Dir,
            mode: 0o755,
        },
    ];
    payload::write_items(&items, &rootfs)?;
    // No /tmp (readOnlyRootFilesystem needs none); Docker and the kubelet make their own
    // mount points.
    let layer_tar = stage.join("layer.tar");
    payload::tar(&rootfs, &["etc", "usr"], &layer_tar, release.epoch(), false)?;
    let diff_id = sha256_hex(&layer_tar)?;
    let layer_gz = stage.join("layer.tar.gz");
    fs::write(&layer_gz, payload::gzip(&fs::read(&layer_tar)?)?)?;

    let image = stage.join("image");
    let layer = blob(&image, &fs::read(&layer_gz)?)?;
    // When it was built: tests/tests/image.rs refuses an image older than the agent's sources.
    let built = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let created = rfc3339(i64::try_from(built)?);
    let mut config = json!({
        "created": created,
        "architecture": p.arch.oci,
        "os": "linux",
        "config": {
            "Entrypoint": [BIN],
            "Cmd": ["--config", CONFIG, "serve"],
            "Env": ["HEALTH_AGENT_LOG=info"],
            "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}},
            "Labels": {
                "org.opencontainers.image.title": NAME,
                "org.opencontainers.image.version": release.version,
                "health-agent.built-unix": built.to_string(),
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created": created, "created_by": "cargo xtask dist"}],
    });
    if p.arch.oci == "arm64" {
        config["variant"] = json!("v8");
    }
    let config = blob(&image, &serde_json::to_vec(&config)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
    });
    let manifest = blob(&image, &serde_json::to_vec(&manifest)?)?;
    let tag = tag(release, p.arch);
    let mut platform = json!({"architecture": p.arch.oci, "os": "linux"});
    if p.arch.oci == "arm64" {
        platform["variant"] = json!("v8");
    }
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["platform"] = platform;
    entry["annotations"] = json!({
        "org.opencontainers.image.ref.name": tag.split_once(':').map_or("", |(_, t)| t),
        "io.containerd.image.name": tag,
    });
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    });
    fs::write(image.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(
        image.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    // The `docker save` view of the same blobs.
    let docker = json!([{
        "Config": config.path,
        "RepoTags": [tag],
        "Layers": [layer.path],
    }]);
    fs::write(image.join("manifest.json"), serde_json::to_vec(&docker)?)?;

    let tarball = out.join(format!("{name}.tar"));
    payload::tar(
        &image,
        &["blobs", "index.json", "manifest.json", "oci-layout"],
        &tarball,
        release.epoch(),
        false,
    )?;
    fs::remove_dir_all(&stage)?;
    Ok(tarball)
}

/// A blob written under `blobs/sha256/`.
struct Blob {
    digest: String,
    size: usize,
    /// Relative to the layout's root.
    path: String,
}

fn blob(layout: &Path, bytes: &[u8]) -> Result<Blob> {
    let dir = layout.join("blobs/sha256");
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(".new");
    fs::write(&tmp, bytes)?;
    let hex = sha256_hex(&tmp)?;
    fs::rename(&tmp, dir.join(&hex))?;
    Ok(Blob {
        digest: format!("sha256:{hex}"),
        size: bytes.len(),
        path: format!("blobs/sha256/{hex}"),
    })
}

fn descriptor(media_type: &str, blob: &Blob) -> Value {
    json!({"mediaType": media_type, "digest": blob.digest, "size": blob.size})
}
