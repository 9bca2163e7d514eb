//! `cargo xtask dist --check`, CI's `dist` stage: proof that what `dist` built is what a user
//! gets. Each step prints what it saw and fails the stage on the first broken artifact:
//!
//! - the binaries: static, of their architecture (`file`, and the ELF header);
//! - `SHA256SUMS` verifies (`sha256sum -c`); each tarball holds what its unit expects;
//! - lintian (no error) on each .deb, rpmlint (no error) on each .rpm, their output shown;
//! - the .deb in a scratch Debian root (`dpkg --root`): the files where the unit expects them,
//!   the unit enabled (Debian's convention), `systemd-analyze verify` of the installed unit, an
//!   upgrade to a later version that keeps an edited config, a purge that leaves nothing; the
//!   arm64 .deb installed as a foreign architecture;
//! - the .rpm in a scratch root with an empty rpm database (`rpm --root`): the same files, the
//!   unit left to the preset policy (not enabled under Fedora's and Amazon Linux's
//!   `disable *`, enabled when a preset names it), verify, the upgrade, removal;
//! - the binary serving `/health` in a root holding only itself and its config (`bare.rs`);
//! - each image loaded with `docker load`, of its architecture; the host's runs.

use std::{fs, process::Command};

use anyhow::{bail, ensure, Context, Result};

use super::{
    bare, deb, elf,
    payload::{self, BIN, CONFIG},
    roots::{self, Root},
    rpm, ArchArtifacts, Artifacts, Payload,
};
use crate::cmd;

const UNIT: &str = "health-agent.service";

pub fn run(a: &Artifacts) -> Result<()> {
    binaries(a)?;
    let sums = cmd::stdout(
        Command::new("sha256sum")
            .current_dir(&a.dir)
            .args(["-c", "SHA256SUMS"]),
    )
    .context("SHA256SUMS does not verify")?;
    println!(
        "check: sha256sum -c SHA256SUMS: {} files OK",
        sums.lines().filter(|l| l.ends_with(": OK")).count()
    );
    for arch in &a.per_arch {
        tarball(arch)?;
        lint(
            "lintian",
            Command::new("lintian")
                .args(["--allow-root", "--display-info", "--fail-on", "error"])
                .arg(&arch.deb),
        )?;
        lint(
            "rpmlint",
            Command::new("rpmlint")
                .arg("--rpmlintrc")
                .arg(rpmlintrc()?)
                .arg(&arch.rpm),
        )?;
    }
    let host = &a.per_arch[0];
    deb_install(a, host)?;
    deb_foreign(&a.per_arch[1])?;
    rpm_install(a, host)?;
    rpm_foreign(host, &a.per_arch[1])?;
    bare::serve(&host.bin)?;
    bare::images(a)?;
    println!("check: every artifact in {} holds", a.dir.display());
    Ok(())
}

fn binaries(a: &Artifacts) -> Result<()> {
    for arch in &a.per_arch {
        let said = cmd::stdout(Command::new("file").arg(&arch.bin))?;
        println!("check: {}", said.trim());
        let header = elf::Header::read(&arch.bin)?;
        ensure!(
            header.machine == arch.arch.elf_machine && !header.interpreter,
            "{} is not a static {} binary",
            arch.bin.display(),
            arch.arch.name
        );
        ensure!(
            said.contains("statically linked") || said.contains("static-pie linked"),
            "file(1) does not call {} static",
            arch.bin.display()
        );
    }
    Ok(())
}

/// The tarball lists the binary, the config, the unit and the README.
fn tarball(arch: &ArchArtifacts) -> Result<()> {
    let list = cmd::stdout(Command::new("tar").arg("-tzf").arg(&arch.tarball))?;
    for want in [
        "/health-agent",
        "/health-agent.toml",
        "/conf.d/",
        "/systemd/health-agent.service",
        "/systemd/drain-before-stop.conf",
        "/README.md",
        "/docs/deploy.md",
    ] {
        ensure!(
            list.lines().any(|l| l.ends_with(want)),
            "{} has no …{want}",
            arch.tarball.display()
        );
    }
    println!(
        "check: {}: {} entries, binary, config, unit, drop-in and docs present",
        file_name(&arch.tarball),
        list.lines().count()
    );
    // Unpacked by root, they keep these: the config and conf.d/ must be root's and writable by
    // root alone, or the agent refuses them (it runs their commands as root).
    let long = cmd::stdout(
        Command::new("tar")
            .args(["--numeric-owner", "-tvzf"])
            .arg(&arch.tarball),
    )?;
    for line in long
        .lines()
        .filter(|l| l.ends_with("/health-agent.toml") || l.ends_with("/conf.d/"))
    {
        let mut fields = line.split_whitespace();
        let (mode, owner) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        let others_write = mode.len() != 10 || &mode[5..6] != "-" || &mode[8..9] != "-";
        ensure!(
            owner == "0/0" && !others_write,
            "{}: `{line}`: the config must be root's (0/0) and writable by root alone",
            arch.tarball.display()
        );
    }
    println!("check: its config and conf.d/ are root's, writable by root alone");
    Ok(())
}

/// The agent's own `config --validate` on the config and conf.d/ the package installed in
/// `root`: it refuses a file any user but root could change, so this proves what the package
/// installs is root's and writable by root alone.
fn validate_installed(root: &Root, bin: &std::path::Path) -> Result<String> {
    let said = cmd::stdout(
        Command::new(bin)
            .args(["config", "--validate", "--config"])
            .arg(root.at(CONFIG)),
    )
    .with_context(|| format!("the agent refuses the installed {CONFIG} or its conf.d/"))?;
    Ok(said.trim().to_owned())
}

/// Runs a linter, shows all it said, and fails on an error it reports.
fn lint(name: &str, linter: &mut Command) -> Result<()> {
    let line = cmd::display(linter);
    let out = linter
        .output()
        .with_context(|| format!("cannot run {name} (cargo xtask setup installs it)"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("check: {line}\n{}", indent(said.trim()));
    // Both tag an error `E:` (lintian at the line's start, rpmlint after the package name).
    let errors = said
        .lines()
        .filter(|l| l.starts_with("E: ") || l.contains(": E: "))
        .count();
    if errors > 0 || !out.status.success() {
        bail!("{name} found {errors} errors ({})", out.status);
    }
    Ok(())
}

/// rpmlint's filters, each with its reason.
fn rpmlintrc() -> Result<std::path::PathBuf> {
    let path = roots::scratch_dir("rpmlintrc")?.join("rpmlintrc");
    fs::write(
        &path,
        "# Unsigned: signing needs the publisher's key, which a build machine does not hold;\n\
         # SHA256SUMS carries each file's checksum.\n\
         addFilter(\"no-signature\")\n\
         # Static on purpose: one binary for every distribution, with no library from the host.\n\
         addFilter(\"statically-linked-binary\")\n",
    )?;
    Ok(path)
}

/// The .deb in a scratch Debian root: install, upgrade keeping an edited config, purge.
fn deb_install(a: &Artifacts, host: &ArchArtifacts) -> Result<()> {
    let root = Root::debian("deb")?;
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.path.display())).args(args);
        c
    };
    let deb = host.deb.to_string_lossy().into_owned();
    cmd::run(&mut dpkg(&["-i", &deb]))?;
    let status = query_deb(&root)?;
    ensure!(
        status == format!("install ok installed {}", a.release.full()),
        "dpkg-query says {status:?}"
    );
    let paths = installed_unit_paths(&root, deb::UNIT_DIR)?;
    println!(
        "check: dpkg --root ROOT -i {}: {status}; the unit's paths are there: {}",
        file_name(&host.deb),
        roots::describe(&root, &paths)
    );
    ensure!(
        root.enabled(UNIT),
        "{UNIT} is not enabled after the first install: Debian's convention enables it"
    );
    println!("check: deb-systemd-helper enabled {UNIT} (multi-user.target.wants)");
    println!(
        "check: config --validate: {}",
        validate_installed(&root, &host.bin)?
    );
    println!(
        "check: {}",
        root.verify_unit(&format!("{}/{UNIT}", deb::UNIT_DIR))?
    );

    let edited = edit_config(&root)?;
    let next = a.release.next_patch()?;
    let dir = roots::scratch_dir("deb-next")?;
    let payload = Payload {
        arch: host.arch,
        bin: host.bin.clone(),
        config: payload::default_config(&host.bin)?,
    };
    let deb2 = deb::build(&payload, &next, &dir)?;
    cmd::run(&mut dpkg(&["-i", &deb2.to_string_lossy()]))?;
    let status = query_deb(&root)?;
    ensure!(
        status == format!("install ok installed {}", next.full()),
        "after the upgrade dpkg-query says {status:?}"
    );
    ensure!(
        root.read(CONFIG)? == edited,
        "the upgrade to {} did not keep the edited {CONFIG}",
        next.full()
    );
    ensure!(root.enabled(UNIT), "the upgrade disabled {UNIT}");
    println!(
        "check: upgrade {} → {}: {status}; the edited {CONFIG} kept, {UNIT} still enabled",
        a.release.full(),
        next.full()
    );
    cmd::run(&mut dpkg(&["--purge", "health-agent"]))?;
    for path in [BIN, CONFIG] {
        ensure!(!roots::exists(&root, path), "{path} is left after a purge");
    }
    ensure!(!root.enabled(UNIT), "{UNIT} is still enabled after a purge");
    println!("check: dpkg --purge: the binary, the config and the unit's enablement are gone");
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

/// The arm64 .deb on this amd64 root, arm64 added as a foreign architecture (multiarch): its
/// files land as the amd64 one's do.
fn deb_foreign(arm: &ArchArtifacts) -> Result<()> {
    let root = Root::debian("deb-arm64")?;
    let at = format!("--root={}", root.path.display());
    cmd::run(Command::new("dpkg").args([&at, "--add-architecture", arm.arch.deb]))?;
    cmd::run(Command::new("dpkg").args([&at, "-i"]).arg(&arm.deb))?;
    let paths = installed_unit_paths(&root, deb::UNIT_DIR)?;
    let header = elf::Header::read(&root.at(BIN))?;
    ensure!(header.machine == arm.arch.elf_machine && !header.interpreter);
    println!(
        "check: dpkg --add-architecture {0}; dpkg -i {1}: {2} is a static {3} binary; {4}",
        arm.arch.deb,
        file_name(&arm.deb),
        BIN,
        arm.arch.name,
        roots::describe(&root, &paths)
    );
    Ok(())
}

/// dpkg's word on the package: `<status> <version>`.
fn query_deb(root: &Root) -> Result<String> {
    let out = cmd::stdout(
        Command::new("dpkg-query")
            .arg(format!("--root={}", root.path.display()))
            .args(["-W", "-f=${Status} ${Version}", "health-agent"]),
    )?;
    Ok(out.trim().to_owned())
}

/// The installed unit's `Exec*=` programs and `--config` file, checked to be in the root.
fn installed_unit_paths(root: &Root, unit_dir: &str) -> Result<Vec<String>> {
    let unit = root.read(&format!("{unit_dir}/{UNIT}"))?;
    let shipped = fs::read_to_string(cmd::root().join(payload::UNIT))?;
    ensure!(
        unit == shipped,
        "the installed unit is not {}",
        payload::UNIT
    );
    let paths = roots::unit_paths(&unit);
    ensure!(
        paths.iter().any(|p| p == BIN) && paths.iter().any(|p| p == CONFIG),
        "the unit no longer runs {BIN} with {CONFIG}: {paths:?}"
    );
    roots::assert_installed(root, &paths)?;
    Ok(paths)
}

/// An operator's edit of the config: the health port moved. Returns the edited text.
fn edit_config(root: &Root) -> Result<String> {
    let text = root.read(CONFIG)?;
    let edited = text.replacen(
        "listen = \"0.0.0.0:8080\"",
        "listen = \"0.0.0.0:9090\"  # edited by the operator",
        1,
    );
    ensure!(
        edited != text,
        "the default config has no `listen = \"0.0.0.0:8080\"`"
    );
    fs::write(root.at(CONFIG), &edited)?;
    Ok(edited)
}

/// The .rpm in a scratch root with an empty rpm database: install, upgrade, removal, presets.
fn rpm_install(a: &Artifacts, host: &ArchArtifacts) -> Result<()> {
    let requires = cmd::stdout(
        Command::new("rpm")
            .args(["-qp", "--requires"])
            .arg(&host.rpm),
    )?;
    // A static binary: nothing but the scriptlets' shell and rpm's own features.
    if let Some(other) = requires
        .lines()
        .find(|r| !r.starts_with("rpmlib(") && r.trim() != "/bin/sh")
    {
        bail!("the rpm requires {other:?}: a static package needs no library");
    }
    println!(
        "check: rpm -qp --requires: {}",
        requires.lines().collect::<Vec<_>>().join(", ")
    );
    let root = Root::rpm("rpm", "")?;
    // --nodeps: this root's rpm database is empty, so nothing in it provides the /bin/sh the
    // scriptlets need, though the file is there.
    let rpm = |args: &[&str]| {
        let mut c = Command::new("rpm");
        c.arg("--root").arg(&root.path).args(args);
        c
    };
    cmd::run(rpm(&["-i", "--nodeps"]).arg(&host.rpm))?;
    let version = cmd::stdout(&mut rpm(&["-q", "health-agent"]))?;
    ensure!(
        version.trim() == format!("health-agent-{}.{}", a.release.full(), host.arch.rpm),
        "rpm -q says {version:?}"
    );
    let paths = installed_unit_paths(&root, rpm::UNIT_DIR)?;
    println!(
        "check: rpm --root ROOT -i --nodeps {}: {}; the unit's paths are there: {}",
        file_name(&host.rpm),
        version.trim(),
        roots::describe(&root, &paths)
    );
    ensure!(
        !root.enabled(UNIT),
        "{UNIT} is enabled though the preset policy says `disable *`"
    );
    println!("check: under the preset `disable *` (Fedora, Amazon Linux) {UNIT} is not enabled");
    println!(
        "check: config --validate: {}",
        validate_installed(&root, &host.bin)?
    );
    println!(
        "check: {}",
        root.verify_unit(&format!("{}/{UNIT}", rpm::UNIT_DIR))?
    );
    // --nodeps: as for the install, nothing in the empty database provides /bin/sh.
    cmd::run(&mut rpm(&["-V", "--nodeps", "health-agent"])).context("rpm -V after the install")?;

    let edited = edit_config(&root)?;
    let next = a.release.next_patch()?;
    let dir = roots::scratch_dir("rpm-next")?;
    let payload = Payload {
        arch: host.arch,
        bin: host.bin.clone(),
        config: payload::default_config(&host.bin)?,
    };
    let rpm2 = rpm::build(&payload, &next, &dir)?;
    cmd::run(rpm(&["-U", "--nodeps"]).arg(&rpm2))?;
    let version = cmd::stdout(&mut rpm(&["-q", "health-agent"]))?;
    ensure!(
        version.trim() == format!("health-agent-{}.{}", next.full(), host.arch.rpm),
        "after the upgrade rpm -q says {version:?}"
    );
    ensure!(
        root.read(CONFIG)? == edited,
        "the upgrade to {} did not keep the edited {CONFIG}",
        next.full()
    );
    println!(
        "check: rpm -U {}: {}; the edited {CONFIG} kept",
        file_name(&rpm2),
        version.trim()
    );
    cmd::run(&mut rpm(&["-e", "health-agent"]))?;
    ensure!(!roots::exists(&root, BIN), "{BIN} is left after rpm -e");
    let saved = format!("{CONFIG}.rpmsave");
    ensure!(
        root.read(&saved)? == edited,
        "rpm -e did not keep the edited config as {saved}"
    );
    println!("check: rpm -e: the binary is gone, the edited config kept as {saved}");
    drop(root);

    // A preset that names the unit enables it: the policy decides, not the package.
    let root = Root::rpm("rpm-preset", &format!("enable {UNIT}\n"))?;
    cmd::run(
        Command::new("rpm")
            .arg("--root")
            .arg(&root.path)
            .args(["-i", "--nodeps"])
            .arg(&host.rpm),
    )?;
    ensure!(
        root.enabled(UNIT),
        "a preset `enable {UNIT}` did not enable it on install"
    );
    println!("check: with a preset `enable {UNIT}` the first install enables it");
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

/// The aarch64 rpm: its architecture, the same file list as the host's, and a static aarch64
/// binary inside.
fn rpm_foreign(host: &ArchArtifacts, arm: &ArchArtifacts) -> Result<()> {
    let arch = cmd::stdout(
        Command::new("rpm")
            .args(["-qp", "--queryformat", "%{ARCH}"])
            .arg(&arm.rpm),
    )?;
    ensure!(
        arch == arm.arch.rpm,
        "{} says arch {arch}",
        arm.rpm.display()
    );
    let list = |rpm: &std::path::Path| cmd::stdout(Command::new("rpm").arg("-qpl").arg(rpm));
    ensure!(
        list(&arm.rpm)? == list(&host.rpm)?,
        "the {} and {} rpms install different files",
        arm.arch.rpm,
        host.arch.rpm
    );
    let dir = roots::scratch_dir("rpm-arm")?;
    cmd::run(Command::new("sh").current_dir(&dir).arg("-c").arg(format!(
        "rpm2cpio '{}' | cpio -idm --quiet ./usr/bin/health-agent",
        arm.rpm.display()
    )))?;
    let header = elf::Header::read(&dir.join("usr/bin/health-agent"))?;
    ensure!(header.machine == arm.arch.elf_machine && !header.interpreter);
    println!(
        "check: {}: arch {arch}, the same files as the {} rpm, a static {} binary",
        file_name(&arm.rpm),
        host.arch.rpm,
        arm.arch.name
    );
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

pub fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
