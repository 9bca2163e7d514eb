//! Scratch roots for the package checks: the Debian 12 root file system the systemd tests boot
//! (tests/src/nspawn.rs: minbase with systemd, cached by `cargo xtask setup`) under a tmpfs
//! overlay, so every install lands in memory and the cached tree stays as it was. It is a real
//! system for dpkg (its own database, deb-systemd-helper, /bin/sh for the maintainer scripts)
//! and gives rpm the shell and systemctl its scriptlets run, though no package in an rpm
//! database provides them ([`Root::rpm`]).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

use crate::cmd;

/// A mounted overlay of the cached root; unmounted and removed on drop.
pub struct Root {
    pub path: PathBuf,
    scratch: PathBuf,
}

impl Root {
    /// The cached Debian root under a fresh overlay; `name` tells scratch directories apart.
    pub fn debian(name: &str) -> Result<Self> {
        let lower = health_agent_tests::nspawn::rootfs();
        let scratch =
            std::env::temp_dir().join(format!("health-agent-dist-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&scratch);
        fs::create_dir_all(&scratch)?;
        // The upper layer in memory: an overlay's upper directory cannot be on an overlay.
        cmd::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=512m", "tmpfs"])
                .arg(&scratch),
        )?;
        let root = Self {
            path: scratch.join("root"),
            scratch,
        };
        for dir in ["upper", "work", "root"] {
            fs::create_dir(root.scratch.join(dir))?;
        }
        cmd::run(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!(
                    "lowerdir={},upperdir={},workdir={}",
                    lower.display(),
                    root.scratch.join("upper").display(),
                    root.scratch.join("work").display()
                ))
                .arg(&root.path),
        )
        .context("cannot mount an overlay of the cached Debian root")?;
        Ok(root)
    }

    /// The same root with an empty rpm database, and the preset policy Fedora and Amazon Linux
    /// ship (`99-default-disable.preset`) plus `presets` before it.
    pub fn rpm(name: &str, presets: &str) -> Result<Self> {
        let root = Self::debian(name)?;
        cmd::run(
            Command::new("rpm")
                .arg("--root")
                .arg(&root.path)
                .arg("--initdb"),
        )?;
        let dir = root.path.join("usr/lib/systemd/system-preset");
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("99-default-disable.preset"), "disable *\n")?;
        if !presets.is_empty() {
            fs::write(dir.join("50-health-agent-check.preset"), presets)?;
        }
        Ok(root)
    }

    /// A path inside the root, given as on the installed system (`/etc/...`).
    pub fn at(&self, path: &str) -> PathBuf {
        self.path.join(path.trim_start_matches('/'))
    }

    pub fn read(&self, path: &str) -> Result<String> {
        fs::read_to_string(self.at(path))
            .with_context(|| format!("{path} is not in the root ({})", self.path.display()))
    }

    /// Whether `unit` is enabled for multi-user.target (its `WantedBy=`).
    pub fn enabled(&self, unit: &str) -> bool {
        self.at(&format!(
            "/etc/systemd/system/multi-user.target.wants/{unit}"
        ))
        .symlink_metadata()
        .is_ok()
    }

    /// `systemd-analyze verify` of the installed unit, as on the installed system: every
    /// path it names (ExecStart=, ExecStartPre=, ...) resolved in this root.
    pub fn verify_unit(&self, unit_path: &str) -> Result<String> {
        let out = Command::new("systemd-analyze")
            .arg(format!("--root={}", self.path.display()))
            .arg("verify")
            .arg(unit_path)
            .output()
            .context("cannot run systemd-analyze (Debian's systemd)")?;
        let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if !out.status.success() || !said.is_empty() {
            bail!(
                "systemd-analyze verify {unit_path} in {}: {} {said}",
                self.path.display(),
                out.status
            );
        }
        Ok(format!(
            "systemd-analyze --root=ROOT verify {unit_path}: ok"
        ))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for dir in [&self.path, &self.scratch] {
            let _ = Command::new("umount").arg(dir).status();
        }
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// The paths the unit at `unit` (inside `root`) runs and reads: every `Exec*=` program and the
/// `--config` file, so a check can see that the package put them there.
pub fn unit_paths(unit_text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for line in unit_text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !key.starts_with("Exec") {
            continue;
        }
        // systemd's prefixes: `-` (failure ignored), `+`/`!` (privileges), `@` (argv[0]).
        let words: Vec<&str> = value.split_whitespace().collect();
        if let Some(program) = words.first() {
            let program = program.trim_start_matches(['-', '+', '!', '@', ':']);
            if program.starts_with('/') {
                paths.push(program.to_owned());
            }
        }
        for pair in words.windows(2) {
            if pair[0] == "--config" || pair[0] == "--validate" {
                paths.push(pair[1].to_owned());
            }
        }
    }
    paths.sort();
    paths.dedup();
    paths
}

/// That each of `paths` is in `root` (a file; the programs executable).
pub fn assert_installed(root: &Root, paths: &[String]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for path in paths {
        let meta = fs::metadata(root.at(path))
            .with_context(|| format!("the unit names {path}, which the package did not install"))?;
        if path.contains("/bin/") && meta.permissions().mode() & 0o111 == 0 {
            bail!("{path} is installed but not executable");
        }
    }
    Ok(())
}

/// A package's own view of what it installed, for the report: `paths`' sizes.
pub fn describe(root: &Root, paths: &[String]) -> String {
    paths
        .iter()
        .map(|p| {
            let size = fs::metadata(root.at(p)).map_or(0, |m| m.len());
            format!("{p} ({size} bytes)")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `path` exists in `root`.
pub fn exists(root: &Root, path: &str) -> bool {
    root.at(path).symlink_metadata().is_ok()
}

/// The directory a check writes its second release's packages to.
pub fn scratch_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("health-agent-dist-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_a_unit_runs_and_reads_are_found() {
        let unit = "[Service]\nExecStartPre=/usr/bin/a config --validate /etc/a/a.toml\n\
                    ExecStart=/usr/bin/a --config /etc/a/a.toml serve\n\
                    ExecStop=-+/bin/sh -c 'x'\nUser=root\n";
        assert_eq!(unit_paths(unit), ["/bin/sh", "/etc/a/a.toml", "/usr/bin/a"]);
    }

    #[test]
    fn the_shipped_unit_runs_the_packaged_binary_with_the_packaged_config() {
        let unit = fs::read_to_string(cmd::root().join(super::super::payload::UNIT)).unwrap();
        assert_eq!(
            unit_paths(&unit),
            [super::super::payload::CONFIG, super::super::payload::BIN]
        );
    }
}
