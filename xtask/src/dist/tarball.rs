//! The tarball, for any distribution without a package: one directory,
//! `health-agent-<version>-<arch>/`, holding the binary, the default config with its empty
//! drop-in directory, the systemd unit and the application drop-in (`systemd/`), and the docs.
//! The unit expects the binary at /usr/bin/health-agent and the config in /etc/health-agent/.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

use super::{
    payload::{self, Item, What, DRAIN_DROPIN, UNIT},
    Payload, Release, NAME,
};
use crate::cmd;

/// Builds `health-agent-<version>-<arch>.tar.gz` in `out` and returns its path.
pub fn build(p: &Payload, release: &Release, out: &std::path::Path) -> Result<PathBuf> {
    let top = format!("{NAME}-{}-{}", release.version, p.arch.name);
    let stage = out.join(format!(".{top}"));
    let _ = fs::remove_dir_all(&stage);
    let root = cmd::root();
    let file = |path: &str, from: PathBuf, mode| Item {
        path: format!("{top}/{path}"),
        what: What::File(from),
        mode,
    };
    let mut items = vec![
        file(NAME, p.bin.clone(), 0o755),
        Item {
            path: format!("{top}/{NAME}.toml"),
            what: What::Text(p.config.clone()),
            mode: 0o644,
        },
        Item {
            path: format!("{top}/conf.d"),
            what: What::Dir,
            mode: 0o755,
        },
        file(&format!("systemd/{NAME}.service"), root.join(UNIT), 0o644),
        file(
            "systemd/drain-before-stop.conf",
            root.join(DRAIN_DROPIN),
            0o644,
        ),
        file("README.md", root.join("README.md"), 0o644),
        file("CHANGELOG.md", root.join("CHANGELOG.md"), 0o644),
    ];
    for page in payload::manual_pages(&root.join("docs"))? {
        let name = page.file_name().context("a page in docs/ has no name")?;
        items.push(file(
            &format!("docs/{}", name.to_string_lossy()),
            page,
            0o644,
        ));
    }
    payload::write_items(&items, &stage)?;
    let tarball = out.join(format!("{top}.tar.gz"));
    payload::tar(&stage, &[&top], &tarball, release.epoch(), true)?;
    fs::remove_dir_all(&stage)?;
    Ok(tarball)
}
