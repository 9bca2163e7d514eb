//! Signals, identity, clocks, resource limits and the heap.

use std::{io, time::Duration};

/// `kill(2)`: `signal` to `pid` (a negative `pid` is a process group).
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `gethostname(2)`, when it answers with a name.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is NUL-terminated on success unless
    // truncated, and the read below stops at the buffer's end either way.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The kernel's clock ticks per second (`/proc`'s CPU times are in these), when it says.
pub fn clock_ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf(3) only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then_some(hz as f64)
}

/// The memory page size in bytes (`/proc`'s resident sizes are in pages).
pub fn page_size() -> u64 {
    // SAFETY: sysconf(3) only reads a constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

fn clock(id: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into the one we own.
    let ok = unsafe { libc::clock_gettime(id, &mut ts) } == 0;
    ok.then(|| {
        Duration::new(
            ts.tv_sec.max(0) as u64,
            ts.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    })
}

/// The CPU time the calling thread has used so far (user and system, nanosecond resolution).
pub fn thread_cpu_time() -> Option<Duration> {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Time since the host booted, suspend included (CLOCK_BOOTTIME).
pub fn boottime() -> Duration {
    clock(libc::CLOCK_BOOTTIME).unwrap_or_default()
}

/// CLOCK_MONOTONIC: the clock of the kernel programs' `bpf_ktime_get_ns`.
pub fn monotonic() -> Duration {
    clock(libc::CLOCK_MONOTONIC).unwrap_or_default()
}

/// Raises the soft limit on open files to the hard limit (systemd's default soft limit is 1024,
/// which a flood of connections to the health port would exhaust, starving the checks' own
/// sockets). The soft limit in force.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit(2) reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// Lifts RLIMIT_MEMLOCK (kernels before 5.11 charge BPF maps to it).
pub fn raise_memlock_limit() -> io::Result<()> {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit(2) reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hands the heap's free pages back to the kernel (glibc keeps them mapped; other allocators
/// purge on their own, and this does nothing).
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim(3) only returns free pages to the kernel; nothing in use moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs `f` with the process's file-mode creation mask set to `mask`, then restores it.
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: umask(2) only changes this process's file-mode mask; restored right after.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let out = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    out
}

/// mimalloc's defaults trade memory for speed in a way an agent idling between probes never
/// pays back: freed pages wait for a purge that only later allocations run (1 s after), and
/// arenas are committed whole. Purging at once and committing as used keeps the static build's
/// RSS at the glibc build's (37.9 → 12.8 MB idle; docs/BENCHMARKS.md section 1 measures both,
/// and the other candidates).
#[cfg(target_env = "musl")]
pub fn tune_mimalloc() {
    // mimalloc.h's `mi_option_e` (v3): the numbers are its ABI, not exported by the crate.
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: mi_option_set only stores an integer option; any value is valid for these two.
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
    }
}
