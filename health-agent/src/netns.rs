//! Network namespaces: where the web backend's sockets live when it is not in the agent's own
//! (a Docker bridge container, a pod, `ip netns`, systemd's `PrivateNetwork=`). A namespace is
//! held open by its file, so it outlives the process that made it for as long as we look at it;
//! work inside it (a sock_diag socket, the probe's connect) runs on a short-lived thread that
//! entered it with setns(2), since a socket belongs to the namespace it was created in.

use std::{
    fs::File,
    io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

/// An open network namespace.
#[derive(Debug)]
pub struct Namespace {
    path: PathBuf,
    /// Its inode: the kernel's `net->ns.inum`, by which the eBPF programs tell namespaces apart.
    inode: u64,
    /// None for the agent's own namespace: work runs right here, no thread needed.
    file: Option<File>,
}

const OWN: &str = "/proc/self/ns/net";

impl Namespace {
    /// The agent's own network namespace.
    pub fn own() -> io::Result<Self> {
        let inode = std::fs::metadata(OWN)?.ino();
        Ok(Self {
            path: PathBuf::from(OWN),
            inode,
            file: None,
        })
    }

    /// The namespace at `path` (`/var/run/netns/NAME`, `/proc/PID/ns/net`). When it is the
    /// agent's own, it is treated as such.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let own = std::fs::metadata(OWN)?;
        if meta.dev() == own.dev() && meta.ino() == own.ino() {
            return Ok(Self {
                path: path.to_path_buf(),
                inode: own.ino(),
                file: None,
            });
        }
        // A network namespace file is an nsfs inode; anything else is a wrong path.
        if crate::sys::fs_magic(file.as_fd()).is_ok_and(|m| m != i128::from(NSFS_MAGIC)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a namespace file", path.display()),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            inode: meta.ino(),
            file: Some(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn inode(&self) -> u64 {
        self.inode
    }

    pub fn is_own(&self) -> bool {
        self.file.is_none()
    }

    /// Runs `f` inside the namespace: on a thread that entered it, or right here for the
    /// agent's own. Sockets `f` creates belong to the namespace for their whole life.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let Some(file) = &self.file else {
            return f();
        };
        let fd = file.as_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // This thread only, which ends right after `f`.
                crate::sys::enter_net_namespace(fd)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("namespace worker panicked")))
        })
    }
}

/// `NSFS_MAGIC` from linux/magic.h.
const NSFS_MAGIC: i64 = 0x6e73_6673;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_namespace_runs_in_place() {
        let own = Namespace::own().unwrap();
        assert!(own.is_own());
        let same = Namespace::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(
            same.is_own(),
            "opening our own namespace by path is still ours"
        );
        assert_eq!(same.inode(), own.inode());
        assert_eq!(own.run(|| Ok(7)).unwrap(), 7);
    }

    #[test]
    fn a_wrong_path_is_an_error() {
        assert!(Namespace::open(Path::new("/nonexistent/ns")).is_err());
        let e = Namespace::open(Path::new("/etc/hostname")).unwrap_err();
        assert!(e.to_string().contains("not a namespace"), "{e}");
    }
}
