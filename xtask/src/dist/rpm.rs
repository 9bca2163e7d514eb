//! The .rpm, for Amazon Linux, Fedora and RHEL: a spec generated here and built with rpmbuild
//! (Debian's `rpm` package), `--target` the architecture. It compiles nothing: `%install`
//! copies the files [`payload::installed`] lays out (unit in /usr/lib/systemd/system). The
//! default config is `%config(noreplace)`: an upgrade keeps an edited one (and writes the new
//! default beside it as `.rpmnew` when that changed too).
//!
//! The scriptlets are what Fedora's `%systemd_post`, `%systemd_preun` and
//! `%systemd_postun_with_restart` do, written out because Debian's rpm has no systemd macros:
//! a first install applies the distribution's preset policy (Fedora and Amazon Linux ship
//! `disable *`, so the unit is not enabled unless a preset names it), removal disables and
//! stops the unit, an upgrade restarts it if it runs. Each tolerates a system without systemd
//! running (an image build, a chroot).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{
    payload::{self, What, CONFIG, DOC},
    release::{wrap, MAINTAINER},
    Payload, Release, NAME,
};
use crate::cmd;

pub const UNIT_DIR: &str = "/usr/lib/systemd/system";

/// Builds `health-agent-<version>-<revision>.<arch>.rpm` into `out` and returns its path.
pub fn build(p: &Payload, release: &Release, out: &Path) -> Result<PathBuf> {
    let top = out.join(format!(".rpmbuild-{}", p.arch.rpm));
    if top.exists() {
        fs::remove_dir_all(&top).with_context(|| format!("cannot clear {}", top.display()))?;
    }
    let stage = top.join("stage");
    let items = payload::installed(p, UNIT_DIR)?;
    payload::write_items(&items, &stage)?;
    let spec_file = top.join(format!("{NAME}.spec"));
    fs::write(&spec_file, spec(release, &items, &stage))?;
    cmd::run(
        Command::new("rpmbuild")
            .arg("-bb")
            .args(["--target", p.arch.rpm])
            .arg("--define")
            .arg(format!("_topdir {}", top.display()))
            .arg(&spec_file),
    )
    .context("rpmbuild failed — Debian's `rpm` package (cargo xtask setup installs it)")?;
    let name = format!("{NAME}-{}.{}.rpm", release.full(), p.arch.rpm);
    let built = top.join("RPMS").join(p.arch.rpm).join(&name);
    let rpm = out.join(&name);
    fs::rename(&built, &rpm).with_context(|| format!("rpmbuild left no {}", built.display()))?;
    fs::remove_dir_all(&top)?;
    Ok(rpm)
}

fn spec(release: &Release, items: &[payload::Item], stage: &Path) -> String {
    let mut files = String::from("%defattr(-,root,root,-)\n%dir /etc/health-agent\n");
    let _ = writeln!(files, "%dir {DOC}\n%dir {DOC}/docs\n%dir {DOC}/examples");
    for item in items {
        let line = match item.what {
            What::Dir => format!("%dir {}", item.path),
            _ if item.path == CONFIG => format!("%config(noreplace) {}", item.path),
            _ if item.path.starts_with(DOC) => format!("%doc {}", item.path),
            _ => item.path.clone(),
        };
        files.push_str(&line);
        files.push('\n');
    }
    let mut changelog = String::new();
    for (i, entry) in release.entries.iter().enumerate() {
        let revision = if i == 0 { release.revision } else { 1 };
        let _ = writeln!(
            changelog,
            "* {} {MAINTAINER} - {}-{revision}",
            entry.date.rpm(),
            entry.version
        );
        for change in &entry.changes {
            changelog.push_str(&wrap(change, 78, "- ", "  "));
            changelog.push('\n');
        }
        changelog.push('\n');
    }
    format!(
        "Name: {NAME}
Version: {version}
Release: {revision}
Summary: Honest GET /health for load balancers, from eBPF and local checks
License: MIT OR Apache-2.0
Group: System Environment/Daemons
Packager: {MAINTAINER}

# Prebuilt, already stripped: no debuginfo package, no brp scripts (Debian's strip cannot read
# the other architecture), no build-id links. xz payload: Amazon Linux 2's rpm 4.11 reads it,
# not zstd.
# No automatic requires: the binary is static (rpm would read `rtld(GNU_HASH)` off its hash
# section, a glibc loader's feature it never asks for).
AutoReq: no
%global debug_package %{{nil}}
%global __os_install_post %{{nil}}
%global _build_id_links none
%global _binary_payload w6.xzdio

%description
health-agent runs on each instance behind a load balancer (AWS ALB, Caddy,
HAProxy) and serves GET /health on port 8080: eBPF tracepoints see a web
backend that holds its port but never answers; disk, container, database,
CPU and memory checks complete the picture. It also speaks HAProxy's
agent-check protocol. The binary is static: it needs no library from the
system.

%prep

%build

%install
cp -a {stage}/. %{{buildroot}}/

%post
if [ $1 -eq 1 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload preset health-agent.service >/dev/null 2>&1 || :
fi

%preun
if [ $1 -eq 0 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload disable --now health-agent.service >/dev/null 2>&1 || :
fi

%postun
if command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ $1 -ge 1 ]; then
        systemctl try-restart health-agent.service >/dev/null 2>&1 || :
    fi
fi

%files
{files}
%changelog
{changelog}",
        version = release.version,
        revision = release.revision,
        stage = stage.display(),
    )
}
