//! The storage engine: exports, file handles, identities and file system
//! access. It knows nothing about NFS.

#![warn(missing_docs, unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod ahead;
pub mod attr_cache;
pub mod bufcache;
pub mod copy;
pub mod cred;
pub mod export;
pub mod extents;
pub mod fs;
pub mod handle;
pub mod handle_memo;
pub mod hugebuf;
pub mod mapped;
pub mod rangelock;
pub mod read;
pub mod readahead;
pub mod turns;

/// Keeps I/O buffers (up to 1 MiB each, one per request in flight) on the
/// heap and reused, instead of fresh mappings that the kernel must fault in
/// and zero on every request (measured: about 9% of a warm stream's CPU in
/// the server, and 13% of the load generator's). Call once at start, from
/// the main thread, before other threads allocate.
pub fn tune_allocator() {
    // SAFETY: mallopt only changes glibc's allocation thresholds.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
        // Each allocation arena keeps what it freed; a few arenas shared
        // by the request threads bound that (glibc's default is 8 per
        // core, grown as threads come and go).
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
}
