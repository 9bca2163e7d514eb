//! A whole hash map read in a few `BPF_MAP_LOOKUP_BATCH` calls (Linux 5.6+) instead of two
//! syscalls per entry (next key, then its value): the connection table holds one entry per
//! connection, and 10,000 waiting ones walked entry by entry every 250 ms cost the agent more
//! than everything else it does. aya 0.14 has no batch operations, so this is the agent's one raw
//! `bpf(2)` call.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per call. A hash map's batch is made of whole buckets, so a bucket with
/// more entries than this fails with ENOSPC; at this size it never does.
const CHUNK: usize = 1024;

/// The `batch` member of `union bpf_attr`, the part these commands read.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of the (non-per-CPU) hash map `map`. An error (a kernel without batch
/// operations for this map type says EINVAL) leaves the caller to walk the map entry by entry.
pub fn lookup_all<K, V>(map: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>>
where
    K: aya::Pod + Default,
    V: aya::Pod + Default,
{
    let mut keys = vec![K::default(); CHUNK];
    let mut values = vec![V::default(); CHUNK];
    let mut out = Vec::new();
    // The kernel's position between calls: an opaque token (a bucket index for hash maps).
    let mut position = 0u64;
    let mut next = 0u64;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_ref(&position) as u64
            },
            out_batch: std::ptr::from_mut(&mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` describes buffers of CHUNK keys and CHUNK values of the map's own key
        // and value types (the caller's K and V), which outlive the call; the kernel writes at
        // most `count` of each, the next position into `next` and the count it wrote back into
        // `attr`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                std::ptr::from_mut(&mut attr),
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let got = (attr.count as usize).min(CHUNK);
        // The last batch ends with ENOENT and may still carry entries.
        if err.is_none() || err.as_ref().and_then(io::Error::raw_os_error) == Some(libc::ENOENT) {
            out.extend(
                keys[..got]
                    .iter()
                    .copied()
                    .zip(values[..got].iter().copied()),
            );
        }
        match err {
            None => {}
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(e),
        }
        position = next;
        first = false;
    }
}
