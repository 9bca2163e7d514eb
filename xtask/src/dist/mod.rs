//! `cargo xtask dist`: everything a release publishes, in `dist/`, for x86_64 and aarch64 from
//! this x86_64 machine. One static release build per architecture ([`static_binary`]: musl, the
//! eBPF programs embedded, no dynamic loader) goes into all of it:
//!
//! | file | what |
//! |---|---|
//! | `<arch>/health-agent` | the binary, stripped |
//! | `health-agent-<version>-<arch>.tar.gz` | the binary, the default config, the systemd unit and drop-in, the docs (`tarball.rs`) |
//! | `health-agent_<version>-<rev>_<debarch>.deb` | Debian and Ubuntu (`deb.rs`) |
//! | `health-agent-<version>-<rev>.<rpmarch>.rpm` | Amazon Linux, Fedora, RHEL (`rpm.rs`) |
//! | `health-agent-<version>-oci-<ociarch>.tar` | the container image: an OCI image layout that `docker load` reads too (`oci.rs`) |
//! | `SHA256SUMS` | `sha256sum -c SHA256SUMS` in `dist/` checks every file above |
//!
//! The packages' contents come from one list (`payload.rs`), their version and changelog from
//! CHANGELOG.md (`release.rs`). `--check` then proves them (`check.rs`): what CI's `dist` stage
//! runs. `cargo xtask package` and `cargo xtask image` build the host's .deb and image with the
//! same code.

mod bare;
mod check;
mod deb;
mod elf;
mod oci;
mod payload;
mod release;
mod roots;
mod rpm;
mod tarball;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{cmd, setup};
pub use deb::build as build_deb;
pub use oci::{build as build_oci, tag as oci_tag};
pub use payload::Payload;
pub use release::Release;

pub const NAME: &str = "health-agent";
/// The static build's memory allocator (health-agent/src/main.rs), as the bench names it.
pub const STATIC_ALLOCATOR: &str = "mimalloc, purge_delay 0, arena_eager_commit 0";

/// One architecture a release is built for, by the name each format gives it.
#[derive(Debug)]
pub struct Arch {
    /// `uname -m`, and the name in the tarball's and `dist/`'s file names.
    pub name: &'static str,
    /// Rust's target triple.
    pub target: &'static str,
    /// dpkg's name.
    pub deb: &'static str,
    /// rpm's name.
    pub rpm: &'static str,
    /// The OCI image config's `architecture`.
    pub oci: &'static str,
    /// `e_machine` in the ELF header.
    pub elf_machine: u16,
    /// binutils' strip that reads this architecture's objects.
    pub strip: &'static str,
}

/// Every architecture a release has; the first is this machine's.
pub const ARCHES: [Arch; 2] = [
    Arch {
        name: "x86_64",
        target: setup::STATIC_TARGETS[0],
        deb: "amd64",
        rpm: "x86_64",
        oci: "amd64",
        elf_machine: 62,
        strip: "strip",
    },
    Arch {
        name: "aarch64",
        target: setup::STATIC_TARGETS[1],
        deb: "arm64",
        rpm: "aarch64",
        oci: "arm64",
        elf_machine: 183,
        strip: "aarch64-linux-gnu-strip",
    },
];

/// This machine's architecture: the one whose binary can run here.
pub fn host() -> &'static Arch {
    &ARCHES[0]
}

#[derive(clap::Args, Default)]
pub struct Args {
    /// Then prove the artifacts (what CI's `dist` stage does): lintian and rpmlint, installs
    /// and an upgrade in scratch roots, the binary serving in a root without libc, the images
    /// loaded, the checksums.
    #[arg(long)]
    pub check: bool,
    /// Prove what `dist/` holds, without building: the artifacts of the latest `cargo xtask
    /// dist` (CI builds them beside its quiet tests and proves them beside the others).
    #[arg(long, conflicts_with = "check")]
    pub check_only: bool,
}

/// What `dist` made, for the checks.
pub struct Artifacts {
    pub dir: PathBuf,
    pub release: Release,
    /// Per architecture, in [`ARCHES`]' order.
    pub per_arch: Vec<ArchArtifacts>,
}

pub struct ArchArtifacts {
    pub arch: &'static Arch,
    pub bin: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
    pub rpm: PathBuf,
    pub oci: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    if args.check_only {
        return check::run(&built()?);
    }
    setup::ensure_toolchain()?;
    let artifacts = build_all()?;
    if args.check {
        check::run(&artifacts)?;
    }
    Ok(())
}

/// What the latest `build_all` left in `dist/`, found by the names its builders give: one of
/// each kind per architecture.
fn built() -> Result<Artifacts> {
    let dir = cmd::root().join("dist");
    let names: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("no {}: run `cargo xtask dist` first", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let one = |what: &str, matches: &dyn Fn(&str) -> bool| -> Result<PathBuf> {
        let found: Vec<&String> = names.iter().filter(|n| matches(n)).collect();
        match found.as_slice() {
            [name] => Ok(dir.join(name)),
            [] => bail!(
                "no {what} in {}: run `cargo xtask dist` first",
                dir.display()
            ),
            _ => bail!("more than one {what} in {}: {found:?}", dir.display()),
        }
    };
    let mut per_arch = Vec::new();
    for arch in &ARCHES {
        let bin = dir.join(arch.name).join(NAME);
        ensure!(
            bin.is_file(),
            "no {}: run `cargo xtask dist` first",
            bin.display()
        );
        per_arch.push(ArchArtifacts {
            arch,
            bin,
            tarball: one("tarball", &|n| {
                n.ends_with(&format!("-{}.tar.gz", arch.name))
            })?,
            deb: one(".deb", &|n| n.ends_with(&format!("_{}.deb", arch.deb)))?,
            rpm: one(".rpm", &|n| n.ends_with(&format!(".{}.rpm", arch.rpm)))?,
            oci: one("OCI image", &|n| {
                n.ends_with(&format!("-oci-{}.tar", arch.oci))
            })?,
        });
    }
    Ok(Artifacts {
        dir,
        release: Release::current()?,
        per_arch,
    })
}

/// Builds every artifact into `dist/` (emptied first) and lists them with their sizes.
fn build_all() -> Result<Artifacts> {
    let release = Release::current()?;
    let dir = cmd::root().join("dist");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    let targets: Vec<&str> = ARCHES.iter().map(|a| a.target).collect();
    let bins = static_binaries(&targets)?;
    // The default config is the same on every architecture: the host's binary writes it.
    let config = payload::default_config(&bins[0])?;
    let mut per_arch = Vec::new();
    for (arch, bin) in ARCHES.iter().zip(&bins) {
        let payload = Payload::stage(arch, bin, &config, &dir.join(arch.name))?;
        per_arch.push(ArchArtifacts {
            arch,
            tarball: tarball::build(&payload, &release, &dir)?,
            deb: deb::build(&payload, &release, &dir)?,
            rpm: rpm::build(&payload, &release, &dir)?,
            oci: oci::build(&payload, &release, &dir)?,
            bin: payload.bin,
        });
    }
    let sums = sha256sums(&dir)?;
    println!("dist: {}", dir.display());
    for line in sums.lines() {
        let name = line.split_once("  ").map_or(line, |(_, name)| name);
        let size = fs::metadata(dir.join(name))?.len();
        println!("  {:>7.1} MB  {name}", size as f64 / 1e6);
    }
    Ok(Artifacts {
        dir,
        release,
        per_arch,
    })
}

/// This machine's static binary staged (stripped) in `out/<arch>/`, with the default config, and
/// the release: what `cargo xtask package` and `cargo xtask image` build from.
pub fn stage_host(out: &Path) -> Result<(Payload, Release)> {
    let arch = host();
    let bin = static_binary(arch.target)?;
    let config = payload::default_config(&bin)?;
    let payload = Payload::stage(arch, &bin, &config, &out.join(arch.name))?;
    Ok((payload, Release::current()?))
}

/// The release agent for `target` (a triple of [`ARCHES`]): see [`static_binaries`].
pub fn static_binary(target: &str) -> Result<PathBuf> {
    let mut bins = static_binaries(&[target])?;
    bins.pop().context("a build of one target gave no binary")
}

/// The release agents for `targets` (triples of [`ARCHES`]), in their order: one
/// `cargo build --release` with a `--target` for each, so that their compilations share the
/// cores (the agent crate's own compilation is mostly on one). Each is at
/// `$CARGO_TARGET_DIR/<target>/release/health-agent`, unstripped, checked to be an ELF file of
/// that architecture that asks for no dynamic loader, so it starts with no library from the
/// host (an image `FROM scratch`, Amazon Linux 2's glibc 2.26, a qemu guest's initramfs).
pub fn static_binaries(targets: &[&str]) -> Result<Vec<PathBuf>> {
    let arches = targets
        .iter()
        .map(|target| {
            ARCHES
                .iter()
                .find(|a| a.target == *target)
                .with_context(|| format!("{target} is not a release target ({ARCHES:?})"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(cmd::root())
        .args(["build", "--release", "--package", NAME]);
    for target in targets {
        cargo.args(["--target", target]);
    }
    cmd::run(&mut cargo).with_context(|| {
        format!(
            "the static build for {} failed — `cargo xtask setup` installs their targets and \
             C toolchains (musl-tools, gcc-aarch64-linux-gnu, musl-dev:arm64)",
            targets.join(" and ")
        )
    })?;
    arches.into_iter().map(checked_static).collect()
}

/// The built agent for `arch`, once checked to be a static ELF file of its machine.
fn checked_static(arch: &Arch) -> Result<PathBuf> {
    let bin = cmd::target_dir()
        .join(arch.target)
        .join("release")
        .join(NAME);
    ensure!(bin.is_file(), "no binary at {}", bin.display());
    let elf = elf::Header::read(&bin)?;
    if elf.machine != arch.elf_machine {
        bail!(
            "{} is for ELF machine {}, not {} ({})",
            bin.display(),
            elf.machine,
            arch.elf_machine,
            arch.name
        );
    }
    if elf.interpreter {
        bail!(
            "{} asks for a dynamic loader: it would not start without the host's libc",
            bin.display()
        );
    }
    Ok(bin)
}

/// `SHA256SUMS` over every file under `dir`, in sha256sum's own format and name order (paths
/// relative to `dir`); returns its text.
fn sha256sums(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    payload::walk_files(dir, &mut files)?;
    let mut names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(dir).map(|p| p.display().to_string()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let sums = cmd::stdout(Command::new("sha256sum").current_dir(dir).args(&names))
        .context("sha256sum (coreutils) failed")?;
    fs::write(dir.join("SHA256SUMS"), &sums)?;
    Ok(sums)
}

/// The hex SHA-256 of a file (sha256sum's first word).
pub fn sha256_hex(file: &Path) -> Result<String> {
    let out = cmd::stdout(Command::new("sha256sum").arg(file))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}
