//! The .deb, laid out by hand and built with `dpkg-deb --root-owner-group` (what cargo-deb
//! does, without another tool to install): [`payload::installed`] with the unit in
//! /lib/systemd/system, the default config as a conffile, `changelog.Debian.gz` and
//! `copyright`, md5sums, and maintainer scripts in Debian's convention for a service (what
//! `dh_installsystemd` writes): enabled on install and started, restarted on upgrade if it
//! runs, stopped on removal, its enablement forgotten on purge — through deb-systemd-helper and
//! deb-systemd-invoke, so that they work with or without systemd running (a chroot, an image
//! build) and honour policy-rc.d.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{
    payload::{self, CONFIG, DOC},
    release::{wrap, MAINTAINER},
    Payload, Release, NAME,
};
use crate::cmd;

/// Debian 12's place for units (dh_installsystemd's until trixie).
pub const UNIT_DIR: &str = "/lib/systemd/system";

/// Builds `health-agent_<version>-<revision>_<arch>.deb` into `out` and returns its path.
pub fn build(p: &Payload, release: &Release, out: &Path) -> Result<PathBuf> {
    let name = format!("{NAME}_{}_{}", release.full(), p.arch.deb);
    let root = out.join(format!(".{name}"));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("cannot clear {}", root.display()))?;
    }
    payload::write_items(&payload::installed(p, UNIT_DIR)?, &root)?;
    let doc = root.join(DOC.trim_start_matches('/'));
    // Debian's name for the upstream changelog, compressed.
    let upstream = doc.join("CHANGELOG.md");
    payload::write(
        &doc.join("changelog.gz"),
        &payload::gzip(&fs::read(&upstream)?)?,
        0o644,
    )?;
    fs::remove_file(&upstream)?;
    payload::write(
        &doc.join("copyright"),
        b"health-agent\n\nCopyright 2026 the health-agent maintainers\nLicense: MIT or Apache-2.0\n \
          On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0.\n",
        0o644,
    )?;
    payload::write(
        &doc.join("changelog.Debian.gz"),
        &payload::gzip(changelog(release).as_bytes())?,
        0o644,
    )?;

    let size = payload::size_kib(&root)?;
    let debian = root.join("DEBIAN");
    payload::write(&debian.join("md5sums"), md5sums(&root)?.as_bytes(), 0o644)?;
    payload::write(
        &debian.join("conffiles"),
        format!("{CONFIG}\n").as_bytes(),
        0o644,
    )?;
    payload::write(
        &debian.join("control"),
        control(release, p.arch.deb, size).as_bytes(),
        0o644,
    )?;
    payload::write(&debian.join("postinst"), POSTINST.as_bytes(), 0o755)?;
    payload::write(&debian.join("prerm"), PRERM.as_bytes(), 0o755)?;
    payload::write(&debian.join("postrm"), POSTRM.as_bytes(), 0o755)?;

    let deb = out.join(format!("{name}.deb"));
    cmd::run(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group", "-Zxz"])
            .arg(&root)
            .arg(&deb),
    )
    .context("dpkg-deb --build failed")?;
    fs::remove_dir_all(&root)?;
    Ok(deb)
}

fn control(release: &Release, arch: &str, size_kib: u64) -> String {
    format!(
        "Package: {NAME}\n\
         Version: {}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {size_kib}\n\
         Section: admin\n\
         Priority: optional\n\
         Description: honest GET /health for load balancers, from eBPF and local checks\n \
         health-agent runs on each instance behind a load balancer (AWS ALB, Caddy,\n \
         HAProxy) and serves GET /health on port 8080: eBPF tracepoints see a web\n \
         backend that holds its port but never answers; disk, container, database,\n \
         CPU and memory checks complete the picture. It also speaks HAProxy's\n \
         agent-check protocol.\n \
         .\n \
         The binary is static: it needs no library from the system.\n",
        release.full()
    )
}

/// Debian's changelog format, newest entry first.
fn changelog(release: &Release) -> String {
    let mut text = String::new();
    for (i, entry) in release.entries.iter().enumerate() {
        // Earlier versions were packaged as revision 1.
        let revision = if i == 0 { release.revision } else { 1 };
        text.push_str(&format!(
            "{NAME} ({}-{revision}) unstable; urgency=medium\n\n",
            entry.version
        ));
        for change in &entry.changes {
            text.push_str(&wrap(change, 78, "  * ", "    "));
            text.push('\n');
        }
        text.push_str(&format!("\n -- {MAINTAINER}  {}\n\n", entry.date.rfc2822()));
    }
    text.truncate(text.trim_end().len() + 1);
    text
}

/// `md5sum` of every file but DEBIAN/, paths relative to the root: dpkg --verify reads it.
fn md5sums(root: &Path) -> Result<String> {
    let mut files = Vec::new();
    payload::walk_files(root, &mut files)?;
    let mut names: Vec<String> = files
        .iter()
        .filter_map(|f| f.strip_prefix(root).ok())
        .map(|p| p.display().to_string())
        .collect();
    names.sort();
    cmd::stdout(Command::new("md5sum").current_dir(root).args(&names)).context("md5sum failed")
}

// Each script keys on its first argument as dpkg passes it (deb-postinst(5) and friends).
// deb-systemd-helper keeps the enablement state dpkg-side: a unit the administrator disabled
// stays disabled through upgrades, and purge removes only the links it made.
const POSTINST: &str = "#!/bin/sh
set -e
case \"$1\" in
configure | abort-upgrade | abort-deconfigure | abort-remove)
    deb-systemd-helper unmask health-agent.service >/dev/null || true
    # was-enabled is true for a unit never seen before: a first install enables it.
    if deb-systemd-helper --quiet was-enabled health-agent.service; then
        deb-systemd-helper enable health-agent.service >/dev/null || true
    else
        deb-systemd-helper update-state health-agent.service >/dev/null || true
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        # An upgrade ($2 is the version replaced) restarts a running agent onto the new binary.
        if [ -n \"$2\" ]; then
            deb-systemd-invoke try-restart health-agent.service >/dev/null || true
        else
            deb-systemd-invoke start health-agent.service >/dev/null || true
        fi
    fi
    ;;
esac
exit 0
";
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop health-agent.service >/dev/null || true
fi
exit 0
";
const POSTRM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ \"$1\" = remove ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper mask health-agent.service >/dev/null || true
fi
if [ \"$1\" = purge ]; then
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper purge health-agent.service >/dev/null || true
        deb-systemd-helper unmask health-agent.service >/dev/null || true
    fi
    # The drain state systemd's StateDirectory= made for the agent.
    rm -rf /var/lib/health-agent
fi
exit 0
";
