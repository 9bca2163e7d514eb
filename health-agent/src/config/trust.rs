//! Which config files the agent reads at all. A config can set commands the agent runs as root
//! (`web.restart_command`), so, like sshd's StrictModes and sudo, it reads no file that a user
//! other than root (or the user it runs as) could change: the main file, `conf.d/` and each
//! drop-in must be owned by one of those two and writable by neither group nor others. Every
//! file is held to this whatever it sets: a file that sets no command today may tomorrow. A
//! symlink is judged by its target. [`judge`] decides from the numbers alone; [`read`] and
//! [`check_dir`] are its I/O.

use std::{
    fs::{File, Metadata},
    os::unix::fs::MetadataExt as _,
    path::Path,
};

use super::ConfigError;

/// Whether `path`, of `mode` (`st_mode`) and owner `uid`, may be read by an agent running as
/// `euid`: refused when group or others may write it, or when it is owned by neither root
/// nor `euid`.
pub(super) fn judge(path: &Path, mode: u32, uid: u32, euid: u32) -> Result<(), ConfigError> {
    if writable_by_others(mode) || foreign_owner(uid, euid) {
        return Err(ConfigError::Untrusted {
            path: path.display().to_string(),
            mode: mode & 0o7777,
            uid,
            euid,
        });
    }
    Ok(())
}

fn writable_by_others(mode: u32) -> bool {
    mode & 0o022 != 0
}

/// Owned by neither root nor the user the agent runs as: whoever owns it can change what the
/// agent trusts (a config file, the fleet key).
pub(crate) fn foreign_owner(uid: u32, euid: u32) -> bool {
    uid != 0 && uid != euid
}

/// The message of [`ConfigError::Untrusted`]: what is wrong with `path`, why it matters, and
/// the command that fixes it.
pub(super) fn describe(path: &str, mode: u32, uid: u32, euid: u32) -> String {
    let quoted = shell_quoted(path);
    let mut wrong = Vec::new();
    let mut fix = Vec::new();
    if foreign_owner(uid, euid) {
        wrong.push(if euid == 0 {
            format!("owned by uid {uid}, not root")
        } else {
            format!("owned by uid {uid}, neither root nor the user the agent runs as (uid {euid})")
        });
        fix.push(format!("chown root {quoted}"));
    }
    if writable_by_others(mode) {
        wrong.push(format!("writable by group or others (mode {mode:04o})"));
        fix.push(format!("chmod go-w {quoted}"));
    }
    format!(
        "{path} is {}: config files can set commands the agent runs as root, so it reads none \
         that a user other than root (or the one it runs as) could change; fix: {}",
        wrong.join(" and "),
        fix.join(" && ")
    )
}

/// `path` as a shell word: bare when it holds nothing a shell reads specially.
fn shell_quoted(path: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !path.is_empty() && path.chars().all(plain) {
        path.to_string()
    } else {
        format!("'{}'", path.replace('\'', r"'\''"))
    }
}

/// [`judge`] on what `stat` says of `path`, for the user this process runs as.
fn check(path: &Path, meta: &Metadata) -> Result<(), ConfigError> {
    judge(path, meta.mode(), meta.uid(), crate::sys::effective_uid())
}

/// The text of the config file `path`, once the file opened is trusted: judged by `fstat` on
/// the open file, so no swap between the look and the read goes unseen.
pub(super) fn read(path: &Path) -> Result<String, ConfigError> {
    let read_error = |error| ConfigError::Read {
        path: path.display().to_string(),
        error,
    };
    let file = File::open(path).map_err(read_error)?;
    check(path, &file.metadata().map_err(read_error)?)?;
    std::io::read_to_string(file).map_err(read_error)
}

/// Whether the drop-in directory `dir` is trusted: `Ok(false)` when it does not exist.
pub(super) fn check_dir(dir: &Path) -> Result<bool, ConfigError> {
    match std::fs::metadata(dir) {
        Ok(meta) => check(dir, &meta).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(ConfigError::Read {
            path: dir.display().to_string(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const REG: u32 = 0o100000;
    const DIR: u32 = 0o040000;

    fn verdict(mode: u32, uid: u32, euid: u32) -> Result<(), String> {
        judge(Path::new("/etc/h/conf.d/50-x.toml"), mode, uid, euid).map_err(|e| e.to_string())
    }

    #[test]
    fn files_only_root_or_the_agents_user_can_change_are_trusted() {
        for (mode, uid, euid) in [
            (REG | 0o644, 0, 0),
            (REG | 0o600, 0, 0),
            (REG | 0o640, 0, 0),
            (REG | 0o444, 0, 0),
            (DIR | 0o755, 0, 0),
            (DIR | 0o700, 0, 0),
            // The agent as another user reads root's files, and its own.
            (REG | 0o644, 0, 1000),
            (REG | 0o600, 1000, 1000),
        ] {
            assert_eq!(verdict(mode, uid, euid), Ok(()), "{mode:o} {uid} {euid}");
        }
    }

    #[test]
    fn files_others_can_change_are_refused_with_the_fix() {
        for (mode, uid, euid, says) in [
            (
                REG | 0o666,
                0,
                0,
                &["mode 0666", "chmod go-w /etc/h/conf.d/50-x.toml"][..],
            ),
            (REG | 0o664, 0, 0, &["group or others", "mode 0664"]),
            (REG | 0o646, 0, 0, &["mode 0646", "chmod go-w"]),
            (DIR | 0o777, 0, 0, &["mode 0777"]),
            (DIR | 0o1777, 0, 0, &["mode 1777"]),
            (
                REG | 0o644,
                65534,
                0,
                &["owned by uid 65534, not root", "chown root"],
            ),
            (
                REG | 0o644,
                1001,
                1000,
                &["uid 1001, neither root nor the user the agent runs as (uid 1000)"],
            ),
            // Root's own but writable by the agent's group: still another user's to change.
            (REG | 0o664, 0, 1000, &["mode 0664"]),
        ] {
            let e = verdict(mode, uid, euid).expect_err("refused");
            for s in says {
                assert!(e.contains(s), "{mode:o} {uid} {euid}: {e}");
            }
            assert!(
                e.starts_with("/etc/h/conf.d/50-x.toml is ")
                    && e.contains("commands the agent runs as root"),
                "{e}"
            );
        }
        // Both wrong: both named, both fixed.
        let e = verdict(REG | 0o666, 65534, 0).expect_err("refused");
        assert!(
            e.contains("uid 65534")
                && e.contains("0666")
                && e.contains("chown root /etc/h/conf.d/50-x.toml && chmod go-w"),
            "{e}"
        );
        // Only the wrong half is named.
        let e = verdict(REG | 0o666, 0, 0).expect_err("refused");
        assert!(!e.contains("owned") && !e.contains("chown"), "{e}");
        let e = verdict(REG | 0o644, 7, 0).expect_err("refused");
        assert!(!e.contains("mode") && !e.contains("chmod"), "{e}");
    }

    #[test]
    fn the_fix_quotes_a_path_a_shell_would_split() {
        let e = describe("/etc/my conf/it's.toml", 0o666, 0, 0);
        assert!(e.contains(r"chmod go-w '/etc/my conf/it'\''s.toml'"), "{e}");
    }

    fn mode_of(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn read_judges_the_file_and_a_symlink_by_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.toml");
        std::fs::write(&file, "[web]\nport = 1\n").unwrap();
        mode_of(&file, 0o644);
        assert_eq!(read(&file).unwrap(), "[web]\nport = 1\n");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        read(&link).expect("a link (mode 0777 itself) to a trusted file");
        mode_of(&file, 0o666);
        for p in [&file, &link] {
            let e = read(p).unwrap_err().to_string();
            assert!(
                e.contains(&p.display().to_string()) && e.contains("0666"),
                "{e}"
            );
        }
        let e = read(&dir.path().join("none.toml")).unwrap_err().to_string();
        assert!(e.contains("cannot read") && e.contains("none.toml"), "{e}");
    }

    #[test]
    fn a_file_or_directory_owned_by_another_user_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.toml");
        std::fs::write(&file, "").unwrap();
        let sub = dir.path().join("conf.d");
        std::fs::create_dir(&sub).unwrap();
        mode_of(&sub, 0o755);
        assert!(check_dir(&sub).unwrap(), "a trusted conf.d");
        assert!(!check_dir(&dir.path().join("absent")).unwrap(), "none");
        mode_of(&sub, 0o777);
        let e = check_dir(&sub).unwrap_err().to_string();
        assert!(
            e.contains("conf.d is writable") && e.contains("0777"),
            "{e}"
        );
        mode_of(&sub, 0o755);
        if crate::sys::effective_uid() != 0 {
            eprintln!("not root: chown to another user is not ours to test");
            return;
        }
        for p in [&file, &sub] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        let e = read(&file).unwrap_err().to_string();
        assert!(e.contains("a.toml is owned by uid 65534"), "{e}");
        let e = check_dir(&sub).unwrap_err().to_string();
        assert!(e.contains("conf.d is owned by uid 65534"), "{e}");
    }
}
