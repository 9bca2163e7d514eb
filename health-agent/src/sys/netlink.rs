//! The netlink socket sock_diag is asked through: open, send a request to the kernel, receive.

use std::{
    io, mem,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

/// A netlink datagram socket for `protocol` (close-on-exec), in the calling thread's network
/// namespace.
pub fn netlink_socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes three integers.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `message` to the kernel (netlink port 0) whole.
pub fn send_to_kernel(sock: BorrowedFd<'_>, message: &[u8]) -> io::Result<()> {
    // SAFETY: an all-zero sockaddr_nl is valid: port 0 is the kernel.
    let mut addr: libc::sockaddr_nl = unsafe { mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: the message and the address are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
            std::ptr::from_ref(&addr).cast(),
            mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One `recv(2)` into `buf`, retried when a signal interrupts it: the bytes received.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: a buffer we own, valid for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
