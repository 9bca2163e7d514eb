//! `cargo xtask image`: the DaemonSet's OCI image, `health-agent:<version>` and `:latest`, in the
//! local Docker daemon. Nothing is pulled from a registry: the agent is built static (musl), and
//! the image is `docker import`ed from a tarball holding only that binary, the default config
//! and its empty drop-in directory — the equivalent of `FROM scratch` + two `COPY`s.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    cmd,
    setup::{self, TARGET},
};

pub const NAME: &str = "health-agent";
const CONFIG: &str = "etc/health-agent/health-agent.toml";
/// Drop-ins merged over CONFIG: empty, for a volume or a derived image to fill.
const DROPINS: &str = "etc/health-agent/conf.d";

/// Builds the image and returns its `name:version` tag.
pub fn run() -> Result<String> {
    setup::ensure_toolchain()?;
    let bin = build_static()?;
    let version = env!("CARGO_PKG_VERSION");
    let tag = format!("{NAME}:{version}");

    let ctx = cmd::root().join("target/image");
    if ctx.exists() {
        fs::remove_dir_all(&ctx).with_context(|| format!("cannot clear {}", ctx.display()))?;
    }
    let rootfs = ctx.join("rootfs");
    let image_bin = rootfs.join("usr/bin").join(NAME);
    put(&bin, &image_bin, 0o755)?;
    // Symbols are 3 MB of the 16; a panic's message and location survive without them.
    cmd::run(Command::new("strip").arg(&image_bin)).context("strip (binutils) failed")?;
    let dump = cmd::stdout(Command::new(&bin).args(["config", "--dump"]))
        .context("`health-agent config --dump` of the static build failed")?;
    fs::create_dir_all(rootfs.join("etc/health-agent"))?;
    fs::write(rootfs.join(CONFIG), dump)?;
    fs::set_permissions(rootfs.join(CONFIG), fs::Permissions::from_mode(0o644))?;
    fs::create_dir_all(rootfs.join(DROPINS))?;
    fs::set_permissions(rootfs.join(DROPINS), fs::Permissions::from_mode(0o755))?;
    // A writable /tmp is not needed (readOnlyRootFilesystem); the mount points Docker and the
    // kubelet create themselves.
    let tar = ctx.join("rootfs.tar");
    cmd::run(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .args(["usr", "etc"]),
    )
    .context("tar of the image's root file system failed")?;

    let entrypoint = format!("ENTRYPOINT [\"/usr/bin/{NAME}\"]");
    let default_args = format!("CMD [\"--config\", \"/{CONFIG}\", \"serve\"]");
    // When it was built, in Unix seconds: tests/tests/image.rs refuses an image older than the
    // agent's sources.
    let built = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let labels = format!(
        "LABEL org.opencontainers.image.title={NAME} org.opencontainers.image.version={version} \
         health-agent.built-unix={built}"
    );
    cmd::run(
        Command::new("docker")
            .arg("import")
            .args(["--change", &entrypoint])
            .args(["--change", &default_args])
            .args(["--change", "EXPOSE 8080/tcp 8081/tcp"])
            .args(["--change", "ENV HEALTH_AGENT_LOG=info"])
            .args(["--change", &labels])
            .arg(&tar)
            .arg(&tag),
    )
    .context("docker import failed — is dockerd running? `cargo xtask services` starts it")?;
    cmd::run(Command::new("docker").args(["tag", &tag, &format!("{NAME}:latest")]))?;

    let size =
        cmd::stdout(Command::new("docker").args(["image", "inspect", "-f", "{{.Size}}", &tag]))?;
    let size: u64 = size
        .trim()
        .parse()
        .context("docker image inspect: no size")?;
    println!(
        "image: {tag} and {NAME}:latest, {:.1} MB (one static binary, {TARGET})",
        size as f64 / 1e6
    );
    Ok(tag)
}

/// The release agent for [`TARGET`], checked to need no dynamic loader.
fn build_static() -> Result<PathBuf> {
    let mut cargo = Command::new("cargo");
    cargo.current_dir(cmd::root()).args([
        "build",
        "--release",
        "--package",
        NAME,
        "--target",
        TARGET,
    ]);
    cmd::run(&mut cargo).with_context(|| {
        format!(
            "the static build failed — `rustup target add {TARGET}` and Debian's musl-tools \
             (cargo xtask setup installs both)"
        )
    })?;
    let bin = cmd::target_dir().join(TARGET).join("release").join(NAME);
    ensure!(bin.is_file(), "no binary at {}", bin.display());
    if has_interpreter(&bin)? {
        bail!(
            "{} asks for a dynamic loader: it would not start in an image without libc",
            bin.display()
        );
    }
    Ok(bin)
}

/// Whether an ELF file has a PT_INTERP program header (a dynamic loader).
fn has_interpreter(bin: &Path) -> Result<bool> {
    let elf = fs::read(bin).with_context(|| format!("cannot read {}", bin.display()))?;
    let word = |at: usize, len: usize| -> Result<u64> {
        let bytes = elf.get(at..at + len).context("truncated ELF header")?;
        Ok(bytes.iter().rev().fold(0, |v, &b| (v << 8) | u64::from(b)))
    };
    ensure!(
        elf.starts_with(b"\x7fELF") && elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "{} is not a 64-bit little-endian ELF file",
        bin.display()
    );
    let (phoff, phentsize, phnum) = (word(0x20, 8)?, word(0x36, 2)?, word(0x38, 2)?);
    for i in 0..phnum {
        const PT_INTERP: u64 = 3;
        if word((phoff + i * phentsize) as usize, 4)? == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

fn put(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", to.display()))
}
