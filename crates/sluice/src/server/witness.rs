//! Descriptors that stable WRITEs flush through, kept from one stable
//! WRITE of a file to the next.
//!
//! The kernel tells each open file description of a failed writeback of
//! its file once: a flush through a description learns of every failure
//! since the description was opened, or since its last flush. So a stable
//! WRITE flushes through a description that was opened, or last flushed,
//! before the WRITE wrote, and that no one else flushes meanwhile (see
//! `Server::flush_witness`): it learns of every failure of its own data,
//! whoever else was told.
//!
//! A description whose flush has ended serves the next stable WRITE of
//! the file as well as a new one would: its last flush ended before that
//! WRITE writes. Opening one for every WRITE cost an open, a close and
//! four credential changes (the open is root's): 14% of the server's CPU
//! time in a profile of random 8 KiB FILE_SYNC WRITEs. So a WRITE takes one kept here, or opens one, and gives it back
//! after its flush; one WRITE uses it at a time.
//!
//! The difference from a new description: a failure between a kept
//! description's last flush and the next WRITE (of data that a flush
//! nobody waited for, the kernel's own writeback, lost) is told to that
//! WRITE too, which then fails with NFS4ERR_IO (NFS3ERR_IO) and changes
//! the write verifier, where a new description would have said nothing;
//! the data that was lost belongs to the same file.
//!
//! Files are known by device and inode number: a kept descriptor holds
//! its inode, so that number names no other file while it is kept.
//!
//! The descriptors are read-only, so a read delegation's kernel lease is
//! not disturbed; a write delegation's is, and OPEN closes the file's kept
//! ones before it asks for one. A removed file's are closed at once, and
//! every one is closed after [`Witnesses::IDLE`] unused, so that they
//! keep no removed file's blocks for long.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The file, as (device, inode).
type FileKey = (u64, u64);

/// Descriptors kept for stable WRITEs' flushes, by file.
#[derive(Debug, Default)]
pub struct Witnesses {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// By file, its descriptors, each with when its last flush ended.
    map: HashMap<FileKey, Vec<(OwnedFd, Instant)>>,
    /// Descriptors in `map`.
    len: usize,
}

impl Witnesses {
    /// How long an unused descriptor is kept.
    pub const IDLE: Duration = Duration::from_secs(2);
    /// Most descriptors kept in all.
    const MAX: usize = 1024;
    /// Most kept per file: as many stable WRITEs of one file as a client
    /// usually has in flight.
    const PER_FILE: usize = 16;

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept descriptor of `file` whose last flush has ended, for one
    /// stable WRITE to flush through (and give back with
    /// [`Witnesses::keep`]); None when none is kept.
    pub fn take(&self, file: FileKey) -> Option<OwnedFd> {
        let mut k = self.lock();
        let list = k.map.get_mut(&file)?;
        let (fd, _) = list.pop()?;
        if list.is_empty() {
            k.map.remove(&file);
        }
        k.len -= 1;
        Some(fd)
    }

    /// Gives back `fd`, a descriptor of `file` whose flush has just ended,
    /// for the next stable WRITE of the file. Closed instead when as many
    /// as this keeps are kept already.
    pub fn keep(&self, file: FileKey, fd: OwnedFd) {
        let mut k = self.lock();
        if k.len >= Self::MAX || k.map.get(&file).is_some_and(|v| v.len() >= Self::PER_FILE) {
            drop(k);
            drop(fd);
            return;
        }
        k.map.entry(file).or_default().push((fd, Instant::now()));
        k.len += 1;
    }

    /// Closes the descriptors kept of `file` (removed, renamed over, or
    /// about to be delegated for writing).
    pub fn forget(&self, file: FileKey) {
        let gone = {
            let mut k = self.lock();
            let gone = k.map.remove(&file);
            k.len -= gone.as_ref().map_or(0, Vec::len);
            gone
        };
        // Closed outside the lock: closing a removed file's last
        // descriptor frees its blocks, which can take a while.
        drop(gone);
    }

    /// Closes the descriptors unused for [`Witnesses::IDLE`].
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut gone = Vec::new();
        {
            let mut k = self.lock();
            let mut len = 0;
            k.map.retain(|_, v| {
                gone.extend(v.extract_if(.., |(_, at)| {
                    now.saturating_duration_since(*at) >= Self::IDLE
                }));
                len += v.len();
                !v.is_empty()
            });
            k.len = len;
        }
        drop(gone);
    }

    /// Descriptors kept.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn a_kept_descriptor_goes_to_one_taker_of_its_file_only() {
        let w = Witnesses::default();
        assert!(w.take((1, 1)).is_none());
        w.keep((1, 1), fd());
        assert!(
            w.take((1, 2)).is_none(),
            "another file's descriptor was handed out"
        );
        assert!(w.take((1, 1)).is_some());
        assert!(
            w.take((1, 1)).is_none(),
            "one kept descriptor went to two takers"
        );
        assert!(w.is_empty());
    }

    #[test]
    fn forget_closes_a_files_descriptors_and_keeps_the_others() {
        let w = Witnesses::default();
        for _ in 0..3 {
            w.keep((1, 1), fd());
        }
        w.keep((1, 2), fd());
        w.forget((1, 1));
        assert_eq!(w.len(), 1);
        assert!(w.take((1, 1)).is_none());
        assert!(w.take((1, 2)).is_some());
    }

    #[test]
    fn no_more_than_per_file_are_kept_of_one_file() {
        let w = Witnesses::default();
        for _ in 0..Witnesses::PER_FILE + 5 {
            w.keep((1, 1), fd());
        }
        assert_eq!(w.len(), Witnesses::PER_FILE);
    }

    #[test]
    fn sweep_closes_only_the_idle_ones() {
        let w = Witnesses::default();
        w.keep((1, 1), fd());
        w.keep((1, 2), fd());
        {
            let mut k = w.lock();
            let old = Instant::now() - Witnesses::IDLE;
            k.map.get_mut(&(1, 1)).unwrap()[0].1 = old;
        }
        w.sweep();
        assert_eq!(w.len(), 1);
        assert!(w.take((1, 1)).is_none(), "an idle descriptor was kept");
        assert!(w.take((1, 2)).is_some(), "a fresh one was closed");
    }
}
