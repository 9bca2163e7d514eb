//! The release artifacts the CloudFormation template installs, an .rpm or a .tar.gz with its
//! SHA-256: `cargo xtask dist`'s from `dist/` when it has made them for x86_64 and they are
//! newer than the agent's sources; else stand-ins built here from the static agent that
//! `cargo xtask image` builds, each file where the unit expects it. [`Artifact::origin`] says
//! which one a test got.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    newest,
    qemu::{static_agent, Arch},
    stdout_of, succeed, workspace,
};

/// The static build the stand-ins hold: this machine's architecture.
const STATIC: Arch = Arch::X86_64;
/// The name the architecture has in artifact names (`uname -m`, rpm's arch).
pub const ARCH: &str = "x86_64";

/// A release artifact, alone in its directory.
pub struct Artifact {
    pub path: PathBuf,
    /// Its SHA-256, lower-case hex, as `sha256sum` and SHA256SUMS print it.
    pub sha256: String,
    /// `dist/...`, or which stand-in.
    pub origin: String,
}

impl Artifact {
    pub fn name(&self) -> &str {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 file name")
    }

    /// The directory holding it (and nothing else of the release).
    pub fn dir(&self) -> &Path {
        self.path.parent().expect("an artifact's directory")
    }
}

/// The SHA-256 of `path`, from coreutils' `sha256sum`.
pub fn sha256(path: &Path) -> String {
    let out = stdout_of(Command::new("sha256sum").arg(path));
    out.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("sha256sum {} printed nothing", path.display()))
        .to_owned()
}

/// The agent's version, as `health-agent --version` of `bin` prints it (`health-agent 0.1.0`).
fn version(bin: &Path) -> String {
    let out = stdout_of(Command::new(bin).arg("--version"));
    out.split_whitespace()
        .last()
        .unwrap_or_else(|| panic!("{} --version printed nothing", bin.display()))
        .to_owned()
}

/// The newest file under `dist/` whose name starts with `health-agent-` and `matches`, if it is
/// newer than the agent's sources.
fn from_dist(matches: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let mut stack = vec![workspace().join("dist")];
    let mut found: Vec<PathBuf> = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if name.starts_with("health-agent-") && matches(&name) {
                found.push(path);
            }
        }
    }
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let sources = ["health-agent", "health-common", "health-agent-ebpf"]
        .iter()
        .map(|c| newest(&workspace().join(c).join("src")))
        .max()
        .expect("sources");
    found
        .into_iter()
        .filter(|p| mtime(p).is_some_and(|t| t >= sources))
        .max_by_key(|p| mtime(p))
}

/// `from` copied into `dir` (the artifacts a test serves are alone there).
fn artifact(from: &Path, dir: &Path, origin: String) -> Artifact {
    let path = dir.join(from.file_name().expect("a file name"));
    if from != path {
        fs::copy(from, &path).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    }
    Artifact {
        sha256: sha256(&path),
        path,
        origin,
    }
}

/// The files every stand-in holds: the static agent, the shipped unit, the default config
/// (`config --dump`, as the packages ship it), in `dir`.
fn stand_in_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    fs::create_dir_all(dir).expect("stand-in dir");
    let bin = dir.join("health-agent");
    fs::copy(static_agent(STATIC), &bin).expect("copying the static agent");
    let unit = dir.join("health-agent.service");
    fs::copy(
        workspace().join("deploy/systemd/health-agent.service"),
        &unit,
    )
    .expect("copying the unit");
    let config = dir.join("health-agent.toml");
    let dump = succeed(Command::new(&bin).args(["config", "--dump"]));
    fs::write(&config, &dump.stdout).expect("writing the config");
    (bin, unit, config)
}

/// The x86_64 tarball (`health-agent-<version>-x86_64.tar.gz`) in `dir`: dist's, else a
/// stand-in laid out as dist's: one directory holding the static agent, the config, and the unit
/// in `systemd/`.
pub fn tarball(dir: &Path) -> Artifact {
    let suffix = format!("-{ARCH}.tar.gz");
    if let Some(dist) = from_dist(|n| n.ends_with(&suffix)) {
        let origin = format!("{} (cargo xtask dist)", dist.display());
        return artifact(&dist, dir, origin);
    }
    let build = tempfile::tempdir().expect("tempdir");
    let bin = static_agent(STATIC);
    let top = format!("health-agent-{}-{ARCH}", version(&bin));
    let (_, unit, _) = stand_in_files(&build.path().join(&top));
    let systemd = build.path().join(&top).join("systemd");
    fs::create_dir_all(&systemd).expect("systemd/");
    fs::rename(&unit, systemd.join("health-agent.service")).expect("moving the unit");
    let path = dir.join(format!("{top}.tar.gz"));
    succeed(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner", "-czf"])
            .arg(&path)
            .arg("-C")
            .arg(build.path())
            .arg(&top),
    );
    Artifact {
        sha256: sha256(&path),
        path,
        origin: format!(
            "a stand-in tarball of {} (no fresh one in dist/)",
            bin.display()
        ),
    }
}

/// The .rpm for `arch` (`health-agent-<version>-1.<arch>.rpm`) in `dir`: dist's, else a
/// stand-in made by rpmbuild with the static agent in /usr/bin, the unit in
/// /usr/lib/systemd/system and the config as a config file, and no dependency (as the static
/// agent needs none). A stand-in for another architecture is refused before anything in it
/// runs, so it holds the same x86_64 files: only its header says `arch`.
pub fn rpm(dir: &Path, arch: &str) -> Artifact {
    let suffix = format!(".{arch}.rpm");
    if let Some(dist) = from_dist(|n| n.ends_with(&suffix)) {
        let origin = format!("{} (cargo xtask dist)", dist.display());
        return artifact(&dist, dir, origin);
    }
    let top = tempfile::tempdir().expect("tempdir");
    let (bin, unit, config) = stand_in_files(&top.path().join("files"));
    let version = version(&bin);
    let spec = top.path().join("health-agent.spec");
    fs::write(
        &spec,
        format!(
            "Name: health-agent\nVersion: {version}\nRelease: 1\n\
             Summary: honest GET /health for load balancers (test stand-in)\n\
             License: MIT OR Apache-2.0\nAutoReqProv: no\n\
             %define debug_package %{{nil}}\n%define __strip /bin/true\n\
             %description\nA stand-in for cargo xtask dist's rpm.\n\
             %install\n\
             install -D -m 755 {bin} %{{buildroot}}/usr/bin/health-agent\n\
             install -D -m 644 {unit} %{{buildroot}}/usr/lib/systemd/system/health-agent.service\n\
             install -D -m 644 {config} %{{buildroot}}/etc/health-agent/health-agent.toml\n\
             install -d -m 755 %{{buildroot}}/etc/health-agent/conf.d\n\
             %files\n/usr/bin/health-agent\n/usr/lib/systemd/system/health-agent.service\n\
             %config(noreplace) /etc/health-agent/health-agent.toml\n\
             %dir /etc/health-agent/conf.d\n",
            bin = bin.display(),
            unit = unit.display(),
            config = config.display()
        ),
    )
    .expect("writing the spec");
    succeed(
        Command::new("rpmbuild")
            .arg("--define")
            .arg(format!("_topdir {}", top.path().display()))
            .args(["--define", "_build_id_links none", "--target", arch, "-bb"])
            .arg(&spec),
    );
    let built = top
        .path()
        .join("RPMS")
        .join(arch)
        .join(format!("health-agent-{version}-1{suffix}"));
    let origin = format!(
        "a stand-in rpm of {} (rpmbuild; no fresh one in dist/)",
        static_agent(STATIC).display()
    );
    artifact(&built, dir, origin)
}

/// What a stock Amazon Linux 2023 has that a package may require of it: the capabilities its
/// bash, glibc, coreutils and systemd packages provide.
pub const AL2023_PROVIDES: &[&str] = &[
    "/bin/sh",
    "/usr/bin/sh",
    "bash",
    "coreutils",
    "glibc",
    "rtld(GNU_HASH)",
    "systemd",
    "systemd-units",
    "/usr/bin/systemctl",
];

/// The capabilities `rpm` requires beyond rpm's own (`rpmlib(...)`) and its own provides,
/// names only (a version bound dropped).
pub fn requires(rpm: &Path) -> Vec<String> {
    let query = |what: &str| -> Vec<String> {
        stdout_of(Command::new("rpm").args(["-qp", what]).arg(rpm))
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(String::from))
            .collect()
    };
    let provides = query("--provides");
    let mut out: Vec<String> = query("--requires")
        .into_iter()
        .filter(|r| !r.starts_with("rpmlib(") && !provides.contains(r))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// For a root whose rpm database is empty (Debian's dnf and rpm): a package that provides
/// `names`, as a stock Amazon Linux 2023's base packages do, in `dir`. Each name must be one
/// of [`AL2023_PROVIDES`]: a requirement beyond them is one the AMI may not meet.
pub fn base_stand_in(dir: &Path, names: &[String]) -> PathBuf {
    for name in names {
        assert!(
            AL2023_PROVIDES.contains(&name.as_str()),
            "the rpm requires {name}, which a stock Amazon Linux 2023 may lack \
             (it has {AL2023_PROVIDES:?})"
        );
    }
    let top = tempfile::tempdir().expect("tempdir");
    let spec = top.path().join("base.spec");
    let provides: String = names.iter().map(|n| format!("Provides: {n}\n")).collect();
    fs::write(
        &spec,
        format!(
            "Name: al2023-base-stand-in\nVersion: 1\nRelease: 1\n\
             Summary: what Amazon Linux 2023's base packages provide (test stand-in)\n\
             License: MIT\nBuildArch: noarch\n{provides}%description\nA stand-in.\n%files\n"
        ),
    )
    .expect("writing the spec");
    succeed(
        Command::new("rpmbuild")
            .arg("--define")
            .arg(format!("_topdir {}", top.path().display()))
            .arg("-bb")
            .arg(&spec),
    );
    let name = "al2023-base-stand-in-1-1.noarch.rpm";
    let path = dir.join(name);
    fs::copy(top.path().join("RPMS/noarch").join(name), &path).expect("copying the stand-in");
    path
}
