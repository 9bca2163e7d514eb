//! Every system call the agent makes outside the eBPF loader (`ebpf::load`), each behind a safe
//! function: with the loader, the only place `unsafe` is allowed (the crate denies it
//! everywhere else). Callers get `io::Result`s and plain values; nothing here decides anything.
//!
//! - `process`: signals, identity, clocks, limits and the heap;
//! - `fs`: file system statistics, mounting tracefs, entering a network namespace;
//! - `netlink`: the sock_diag socket's three calls;
//! - `bpf`: the batch read of a hash map that aya does not offer.
#![allow(unsafe_code)]

pub mod bpf;
mod fs;
mod netlink;
mod process;

pub use fs::{enter_net_namespace, fs_magic, mount_tracefs, statvfs, FsStats};
pub use netlink::{netlink_socket, recv, send_to_kernel};
#[cfg(target_env = "musl")]
pub use process::tune_mimalloc;
pub use process::{
    boottime, clock_ticks_per_second, effective_uid, hostname, kill, monotonic, page_size,
    raise_memlock_limit, raise_open_files_limit, thread_cpu_time, trim_heap, with_umask,
};
