//! A small tmpfs mounted on a temp dir (a disk that fills up on demand).

use std::{path::PathBuf, process::Command};

/// A small tmpfs mounted on a temp dir, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs failed (needs root)");
        Self {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
