//! Sockets built by hand (std's listener hard-codes the backlog) and `poll(2)`.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// std's `TcpListener::bind` hard-codes a backlog of 128, and the accept queue
/// length is exactly what the stop-accepting tests observe, so the socket is
/// built by hand.
pub(crate) fn bind_listener(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; the returned fd is immediately owned below.
    let raw = cvt(unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a fresh, valid fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };

    // Tests restart the fixture on the same port quickly; without this the
    // bind would fail while old connections sit in TIME_WAIT.
    let one: libc::c_int = 1;
    // SAFETY: pointer/len describe `one`, which outlives the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;

    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned
            // for any sockaddr type.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &storage as *const _ as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    })?;
    // SAFETY: plain syscall on an fd we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(TcpListener::from(fd))
}

/// Wait up to `timeout_ms` for any of `events` on `fd`. Returns the revents
/// (0 on timeout or EINTR).
pub(crate) fn poll_fd(
    fd: libc::c_int,
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(if rc == 0 { 0 } else { pfd.revents })
}
