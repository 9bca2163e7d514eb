//! What a release ships, once: the stripped static binary and the default config
//! ([`Payload`]), the files the .deb and the .rpm install and where ([`installed`]), and the
//! file helpers every format uses to lay them out.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{Arch, NAME};
use crate::cmd;

pub const BIN: &str = "/usr/bin/health-agent";
pub const CONFIG: &str = "/etc/health-agent/health-agent.toml";
/// Drop-ins merged over CONFIG, in name order. Shipped empty: the package owns the directory,
/// never the files a tool or an operator puts in it.
pub const DROPINS: &str = "/etc/health-agent/conf.d";
pub const DOC: &str = "/usr/share/doc/health-agent";
/// The agent's unit, in the workspace.
pub const UNIT: &str = "deploy/systemd/health-agent.service";
/// The drop-in for the web application's unit that drains before it stops (docs/drain.md).
pub const DRAIN_DROPIN: &str = "deploy/systemd/drain-before-stop.conf";

/// One architecture's binary, ready to pack, and the default config.
pub struct Payload {
    pub arch: &'static Arch,
    /// A stripped copy of the release build.
    pub bin: PathBuf,
    /// `health-agent config --dump`: every key with its default, commented.
    pub config: String,
}

impl Payload {
    /// Strips a copy of `built` into `dir/health-agent`. Symbols are 3 MB of 16; a panic's
    /// message and location survive without them.
    pub fn stage(arch: &'static Arch, built: &Path, config: &str, dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let bin = dir.join(NAME);
        let mut strip = Command::new(arch.strip);
        strip
            .args(["--remove-section=.comment", "-o"])
            .arg(&bin)
            .arg(built);
        cmd::run(&mut strip).with_context(|| {
            format!(
                "{} failed — binutils (and gcc-aarch64-linux-gnu for aarch64)",
                arch.strip
            )
        })?;
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
        Ok(Self {
            arch,
            bin,
            config: config.to_owned(),
        })
    }
}

/// `health-agent config --dump` of a binary this machine runs.
pub fn default_config(bin: &Path) -> Result<String> {
    cmd::stdout(Command::new(bin).args(["config", "--dump"]))
        .with_context(|| format!("`{} config --dump` failed", bin.display()))
}

/// A file or directory a package installs, by its absolute path on the target system.
pub struct Item {
    pub path: String,
    pub what: What,
    pub mode: u32,
}

pub enum What {
    File(PathBuf),
    Text(String),
    Dir,
}

impl Item {
    fn file(path: &str, from: PathBuf, mode: u32) -> Self {
        let path = path.to_owned();
        Self {
            path,
            what: What::File(from),
            mode,
        }
    }
}

/// What both packages install: the binary, the unit in `unit_dir` (Debian 12's /lib, rpm's
/// /usr/lib), the default config (a config file: an upgrade keeps an edited one), the empty
/// drop-in directory, and the docs — the README with the manual (docs/*.md) beside it, laid out
/// as in the repository so the README's links resolve on the box, the changelog, and the
/// application drop-in as an example.
pub fn installed(p: &Payload, unit_dir: &str) -> Result<Vec<Item>> {
    let root = cmd::root();
    let mut items = vec![
        Item::file(BIN, p.bin.clone(), 0o755),
        Item::file(
            &format!("{unit_dir}/{NAME}.service"),
            root.join(UNIT),
            0o644,
        ),
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
        Item::file(&format!("{DOC}/README.md"), root.join("README.md"), 0o644),
        Item::file(
            &format!("{DOC}/CHANGELOG.md"),
            root.join("CHANGELOG.md"),
            0o644,
        ),
        Item::file(
            &format!("{DOC}/examples/drain-before-stop.conf"),
            root.join(DRAIN_DROPIN),
            0o644,
        ),
    ];
    for page in manual_pages(&root.join("docs"))? {
        let name = page.file_name().context("a page in docs/ has no name")?;
        let path = format!("{DOC}/docs/{}", name.to_string_lossy());
        items.push(Item::file(&path, page, 0o644));
    }
    Ok(items)
}

/// Lays `items` out under `root` (their paths relative to it), with their modes.
pub fn write_items(items: &[Item], root: &Path) -> Result<()> {
    for item in items {
        let to = root.join(item.path.trim_start_matches('/'));
        match &item.what {
            What::File(from) => put(from, &to, item.mode)?,
            What::Text(text) => write(&to, text.as_bytes(), item.mode)?,
            What::Dir => mkdir(&to, item.mode)?,
        }
    }
    Ok(())
}

/// The manual's pages: every `*.md` in `dir`, in name order.
pub fn manual_pages(dir: &Path) -> Result<Vec<PathBuf>> {
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

/// Copies `from` to `to` with `mode`, making `to`'s directories (0755).
pub fn put(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let bytes = fs::read(from).with_context(|| format!("cannot read {}", from.display()))?;
    write(to, &bytes, mode)
}

/// Writes `bytes` to `to` with `mode`, making `to`'s directories (0755).
pub fn write(to: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        mkdir(dir, 0o755)?;
    }
    fs::write(to, bytes).with_context(|| format!("cannot write {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", to.display()))
}

/// `mkdir -p` with `mode` on the last directory (and 0755 on those it makes above it).
pub fn mkdir(dir: &Path, mode: u32) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.exists()) {
        mkdir(parent, 0o755)?;
    }
    if !dir.exists() {
        fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", dir.display()))
}

/// Every regular file under `dir`, recursively.
pub fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk_files(&entry.path(), out)?;
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// A tree's size in KiB (files only), as a .deb's Installed-Size wants it.
pub fn size_kib(root: &Path) -> Result<u64> {
    let mut files = Vec::new();
    walk_files(root, &mut files)?;
    let mut bytes = 0;
    for file in files {
        bytes += fs::metadata(&file)?.len();
    }
    Ok(bytes.div_ceil(1024))
}

/// `tar` of `names` (relative to `dir`) into `out`, as root-owned files dated `epoch` in name
/// order, so the same inputs pack the same bytes. `gzip`: compressed, without a name or time.
pub fn tar(dir: &Path, names: &[&str], out: &Path, epoch: i64, gzip: bool) -> Result<()> {
    let mut tar = Command::new("tar");
    tar.current_dir(dir)
        .args(["--sort=name", "--format=gnu", "--owner=0", "--group=0"])
        .arg("--numeric-owner")
        .arg(format!("--mtime=@{epoch}"))
        .arg("-cf")
        .arg(out);
    if gzip {
        tar.args(["--use-compress-program", "gzip -n9"]);
    }
    tar.args(names);
    cmd::run(&mut tar).context("tar failed")
}

/// gzip -9n: no name and no time in the header, as lintian wants.
pub fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot start gzip")?;
    let mut stdin = child.stdin.take().context("gzip's stdin")?;
    // Fed from a thread: gzip writes while it reads, and a full stdout pipe would stop it.
    let out = std::thread::scope(|s| {
        let feeder = s.spawn(move || stdin.write_all(bytes));
        let out = child.wait_with_output();
        let fed = feeder
            .join()
            .map_err(|_| anyhow::anyhow!("gzip's feeder panicked"))?;
        fed.context("writing to gzip")?;
        out.context("gzip")
    })?;
    anyhow::ensure!(out.status.success(), "gzip failed ({})", out.status);
    Ok(out.stdout)
}
