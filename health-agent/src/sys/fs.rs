//! File system statistics, mounting tracefs, entering a network namespace.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, BorrowedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

/// What `statvfs(3)` says of a mounted file system, in its fragment size's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub fragment_size: u64,
    pub blocks: u64,
    pub free: u64,
    /// Free to an unprivileged user (the root reserve left out).
    pub available: u64,
}

/// `statvfs(3)` of the file system holding `path`.
pub fn statvfs(path: &Path) -> io::Result<FsStats> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and an out-pointer to the struct we own.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FsStats {
        fragment_size: st.f_frsize as u64,
        blocks: st.f_blocks as u64,
        free: st.f_bfree as u64,
        available: st.f_bavail as u64,
    })
}

/// The magic number of the file system holding the open file `fd` (`fstatfs(2)`'s `f_type`),
/// widened: it is i64 on glibc and u64 on musl.
pub fn fs_magic(fd: BorrowedFd<'_>) -> io::Result<i128> {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an fd we borrow for the call and an out-pointer to the struct we own.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i128::from(st.f_type))
}

/// `mount -t tracefs nodev /sys/kernel/tracing`.
pub fn mount_tracefs() -> io::Result<()> {
    // SAFETY: mount(2) with static NUL-terminated strings and no data.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Moves the calling thread into the network namespace `fd` refers to (`setns(2)`): the thread
/// only, never the process.
pub fn enter_net_namespace(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns(2) on a namespace fd we borrow for the call; it changes this thread only.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
