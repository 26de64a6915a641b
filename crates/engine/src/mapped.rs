//! File data lent to a reply straight from the page cache.
//!
//! A READ of cached data would otherwise be copied twice on its way out:
//! from the page cache into a buffer (`preadv2`), and from the buffer into
//! the socket. Through a read-only shared mapping of the file, the socket
//! copies from the page cache itself, once. On a 2-core machine a warm 1
//! MiB stream spent a quarter of the server's CPU in the first copy.
//!
//! Two things make such data different from a buffer of the server's own:
//!
//! - **It can change.** The page cache is the file: a WRITE after the READ
//!   would show through. So the data holds a shared range lock of its
//!   bytes ([`crate::rangelock`]) until it is dropped, that is until the
//!   kernel has copied it into the socket; whoever queues a reply instead
//!   of sending it at once first copies lent data with [`settle`], which
//!   lets the lock go.
//! - **It can vanish.** Pages past the end of a file that another process
//!   truncated fault with SIGBUS when this process reads them. So the
//!   process never reads lent data itself: only the kernel does (a
//!   vectored write to the socket, or [`settle`]'s `process_vm_readv`),
//!   and the kernel answers such a fault with EFAULT. The XDR encoder
//!   marks lent data (`Encoder::opaque_lent`) so that nothing copies it by
//!   accident.

use crate::rangelock::RangeGuard;
use bytes::Bytes;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Mappings cover the file in steps of this many bytes, so that a growing
/// file is mapped again only now and then.
pub const MAP_STEP: u64 = 64 << 20;

/// A read-only shared mapping of the start of a file; unmapped when
/// dropped (once no lent data points into it).
#[derive(Debug)]
pub struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory that this process never writes;
// the pointer is only handed to the kernel (see the module's notes).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first bytes of the file `fd` (opened for reading) up to
    /// `end` rounded up to [`MAP_STEP`]; the mapping may reach past the end
    /// of the file (nothing reads there).
    pub fn new(fd: BorrowedFd<'_>, end: u64) -> io::Result<Self> {
        let len = end.max(1).next_multiple_of(MAP_STEP);
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: a new mapping at an address the kernel picks; nothing
        // else is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { addr, len })
    }

    /// Bytes mapped, from the start of the file.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether nothing is mapped (never: at least one step is).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no lent data points
        // into it any more (each holds the mapping).
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// `len` bytes at `offset` of a mapping, with the range lock that keeps
/// writes of the server's out of them while they are lent.
struct Lent {
    map: Arc<Mapping>,
    offset: usize,
    len: usize,
    _range: RangeGuard<'static>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: within the mapping (checked by `lend`), which lives as
        // long as this. The slice is only handed to the kernel (see the
        // module's notes); it is never read here.
        unsafe {
            std::slice::from_raw_parts((self.map.addr as *const u8).add(self.offset), self.len)
        }
    }
}

/// `len` bytes of the file at `offset` through `map`, holding `range`
/// until the data is dropped. None when the mapping does not reach that
/// far.
pub fn lend(
    map: &Arc<Mapping>,
    offset: u64,
    len: usize,
    range: RangeGuard<'static>,
) -> Option<Bytes> {
    let end = offset.checked_add(len as u64)?;
    if end > map.len() {
        return None;
    }
    Some(Bytes::from_owner(Lent {
        map: map.clone(),
        offset: offset as usize,
        len,
        _range: range,
    }))
}

static SETTLED: AtomicU64 = AtomicU64::new(0);

/// Bytes of lent data copied by [`settle`] so far.
pub fn settled_bytes() -> u64 {
    SETTLED.load(Ordering::Relaxed)
}

/// A copy of lent data in memory of the server's own, made by the kernel
/// (`process_vm_readv` of this process): bytes that a truncation by
/// another process took away read as zeros instead of killing the server.
pub fn settle(lent: &Bytes) -> Bytes {
    SETTLED.fetch_add(lent.len() as u64, Ordering::Relaxed);
    let mut out = vec![0u8; lent.len()];
    let mut done = 0;
    while done < out.len() {
        let local = libc::iovec {
            iov_base: out[done..].as_mut_ptr().cast(),
            iov_len: out.len() - done,
        };
        let remote = libc::iovec {
            iov_base: lent[done..].as_ptr() as *mut libc::c_void,
            iov_len: out.len() - done,
        };
        // SAFETY: the local iovec covers our own buffer; the remote one
        // is read by the kernel, which reports a fault instead of raising
        // it.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n <= 0 {
            // Gone (EFAULT) or not allowed: leave the rest as zeros, one
            // page at a time past what cannot be read.
            let page = 4096 - (lent[done..].as_ptr() as usize % 4096);
            done += page.min(out.len() - done);
            continue;
        }
        done += n as usize;
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rangelock::RangeLocks;
    use std::io::Write;

    fn file_of(data: &[u8]) -> std::fs::File {
        use std::os::fd::FromRawFd;
        // SAFETY: a new anonymous file; its descriptor is ours.
        let fd = unsafe { libc::memfd_create(c"lent".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: as above.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(data).expect("write");
        f
    }

    #[test]
    fn lent_data_is_the_file_and_holds_its_range_until_dropped() {
        use std::os::fd::AsFd;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let f = file_of(&data);
        let map = Arc::new(Mapping::new(f.as_fd(), data.len() as u64).expect("map"));
        assert_eq!(map.len(), MAP_STEP);
        let locks = Arc::new(RangeLocks::default());
        let key = (1, 2);
        let guard = locks.try_read_owned(key, 4096, 4096 + 65536).expect("free");
        let b = lend(&map, 4096, 65536, guard).expect("within the mapping");
        // Read back through the kernel, as the socket would.
        assert_eq!(&settle(&b)[..], &data[4096..4096 + 65536]);
        // A writer of an overlapping range waits while the data is lent.
        assert!(locks.try_lock(key, 8192, 8193, true).is_none());
        drop(b);
        assert!(locks.try_lock(key, 8192, 8193, true).is_some());
        assert_eq!(locks.files_in_use(), 0);
        // Past the mapping: not lent.
        let g = locks.try_read_owned(key, 0, 1).expect("free");
        assert!(lend(&map, MAP_STEP - 10, 11, g).is_none());
        assert_eq!(locks.files_in_use(), 0);
    }

    #[test]
    fn settle_reads_truncated_pages_as_zeros_without_a_signal() {
        use std::os::fd::AsFd;
        let data = vec![7u8; 3 * 4096];
        let f = file_of(&data);
        let map = Arc::new(Mapping::new(f.as_fd(), data.len() as u64).expect("map"));
        let locks = Arc::new(RangeLocks::default());
        let g = locks.try_read_owned((1, 1), 0, 3 * 4096).expect("free");
        let b = lend(&map, 0, 3 * 4096, g).expect("lent");
        // Another process cuts the file to one page and a half.
        f.set_len(4096 + 2048).expect("truncate");
        let copy = settle(&b);
        assert_eq!(copy.len(), 3 * 4096);
        assert!(copy[..4096 + 2048].iter().all(|&x| x == 7));
        assert!(
            copy[2 * 4096..].iter().all(|&x| x == 0),
            "the page past the end reads as zeros"
        );
    }
}
