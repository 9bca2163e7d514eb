//! `cargo xtask package`: the Debian package, `target/debian/health-agent_<version>_<arch>.deb`,
//! laid out by hand and built with `dpkg-deb --root-owner-group` (what cargo-deb does, without
//! another tool to install): the release binary in /usr/bin, the systemd unit from
//! deploy/systemd, the default config from `health-agent config --dump` as a conffile, and the
//! empty drop-in directory /etc/health-agent/conf.d/ beside it (tools add their files there), and
//! the README with the manual (docs/*.md) in /usr/share/doc/health-agent, laid out as in the
//! repository so the README's links resolve on the box.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{cmd, run};

const NAME: &str = "health-agent";
const UNIT: &str = "deploy/systemd/health-agent.service";
const CONFIG: &str = "/etc/health-agent/health-agent.toml";
/// Drop-ins merged over CONFIG, in name order. Shipped empty: dpkg owns the directory, never
/// the files a tool or an operator puts in it.
const DROPINS: &str = "/etc/health-agent/conf.d";
/// The newest glibc symbol version the binary links (`objdump -T`), and libgcc_s for unwinding.
const DEPENDS: &str = "libc6 (>= 2.34), libgcc-s1";

/// Builds the package and returns its path.
pub fn run() -> Result<PathBuf> {
    let bin = run::build(&run::BuildArgs { release: true })?;
    let version = env!("CARGO_PKG_VERSION");
    let arch = cmd::stdout(Command::new("dpkg").arg("--print-architecture"))
        .context("dpkg --print-architecture failed — packaging needs Debian's dpkg")?;
    let arch = arch.trim();
    let out_dir = bin
        .parent()
        .and_then(Path::parent)
        .context("the agent binary is not in target/<profile>/")?
        .join("debian");
    let root = out_dir.join(format!("{NAME}_{version}_{arch}"));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("cannot clear {}", root.display()))?;
    }

    install(&bin, &root.join("usr/bin").join(NAME), 0o755)?;
    install(
        &cmd::root().join(UNIT),
        &root.join("lib/systemd/system/health-agent.service"),
        0o644,
    )?;
    let dump = cmd::stdout(Command::new(&bin).args(["config", "--dump"]))
        .context("`health-agent config --dump` failed")?;
    write(&root.join(CONFIG.trim_start_matches('/')), &dump, 0o644)?;
    let dropins = root.join(DROPINS.trim_start_matches('/'));
    fs::create_dir_all(&dropins)
        .and_then(|()| fs::set_permissions(&dropins, fs::Permissions::from_mode(0o755)))
        .with_context(|| format!("cannot create {}", dropins.display()))?;
    let doc = root.join("usr/share/doc").join(NAME);
    install(
        &cmd::root().join("README.md"),
        &doc.join("README.md"),
        0o644,
    )?;
    // The manual beside it, where the README's relative links (docs/verdicts.md) lead.
    for page in manual_pages(&cmd::root().join("docs"))? {
        let name = page.file_name().context("a page in docs/ has no name")?;
        install(&page, &doc.join("docs").join(name), 0o644)?;
    }
    write(
        &root.join("usr/share/doc").join(NAME).join("copyright"),
        "health-agent\nLicense: MIT OR Apache-2.0\n",
        0o644,
    )?;

    let debian = root.join("DEBIAN");
    write(&debian.join("conffiles"), &format!("{CONFIG}\n"), 0o644)?;
    write(
        &debian.join("control"),
        &control(version, arch, installed_size_kib(&root)?),
        0o644,
    )?;
    write(&debian.join("postinst"), POSTINST, 0o755)?;
    write(&debian.join("prerm"), PRERM, 0o755)?;
    write(&debian.join("postrm"), POSTRM, 0o755)?;

    let deb = out_dir.join(format!("{NAME}_{version}_{arch}.deb"));
    cmd::run(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .arg(&root)
            .arg(&deb),
    )
    .context("dpkg-deb --build failed")?;
    println!("package: {}", deb.display());
    Ok(deb)
}

fn control(version: &str, arch: &str, size_kib: u64) -> String {
    format!(
        "Package: {NAME}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: health-agent maintainers <health-agent@localhost>\n\
         Installed-Size: {size_kib}\n\
         Depends: {DEPENDS}\n\
         Recommends: systemd\n\
         Section: admin\n\
         Priority: optional\n\
         Description: honest GET /health for load balancers, from eBPF and local checks\n \
         health-agent runs on each instance behind a load balancer (AWS ALB, Caddy,\n \
         HAProxy) and serves GET /health on port 8080: eBPF tracepoints see a web\n \
         backend that holds its port but never answers; disk, container, database,\n \
         CPU and memory checks complete the picture. It also speaks HAProxy's\n \
         agent-check protocol.\n"
    )
}

// The unit is enabled by the administrator (`systemctl enable --now health-agent`), not on
// install; these only keep systemd's view of the unit files current, when systemd runs.
const POSTINST: &str = "#!/bin/sh\nset -e\n\
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\n\
if [ -d /run/systemd/system ] && [ \"$1\" = configure ] && systemctl is-active --quiet health-agent; then\n\
    systemctl restart health-agent || true\nfi\n";
const PRERM: &str = "#!/bin/sh\nset -e\n\
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n\
    systemctl stop health-agent || true\n    systemctl disable health-agent || true\nfi\n";
const POSTRM: &str = "#!/bin/sh\nset -e\n\
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\n";

/// The manual's pages: every `*.md` in `dir`, in name order.
fn manual_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut pages = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "md") && path.is_file() {
            pages.push(path);
        }
    }
    pages.sort();
    Ok(pages)
}

fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let bytes = fs::read(from).with_context(|| format!("cannot read {}", from.display()))?;
    write_bytes(to, &bytes, mode)
}

fn write(to: &Path, text: &str, mode: u32) -> Result<()> {
    write_bytes(to, text.as_bytes(), mode)
}

fn write_bytes(to: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    }
    fs::write(to, bytes).with_context(|| format!("cannot write {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", to.display()))
}

/// The tree's size in KiB, as Installed-Size wants it.
fn installed_size_kib(root: &Path) -> Result<u64> {
    let mut bytes = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                bytes += meta.len();
            }
        }
    }
    Ok(bytes.div_ceil(1024))
}
