//! Descriptors that stable WRITEs flush through, kept from one stable
//! WRITE of a file to the next.
//!
//! The kernel tells each open file description of a failed writeback of
//! its file once: a flush through a description learns of every failure
//! since the description was opened (that no other description was told
//! of yet), or since its last flush. So a stable WRITE flushes through a
//! description that was opened, or last flushed, before the WRITE wrote,
//! and that no one else flushes meanwhile (see `Server::flush_witness`):
//! it learns of every failure of its own data, whoever else was told.
//!
//! A description whose flush has ended serves the next stable WRITE of
//! the file as well as a new one would: its last flush ended before that
//! WRITE writes. Opening one for every WRITE cost an open, a close and
//! four credential changes (the open is root's): 14% of the server's CPU
//! time in a profile of random 8 KiB FILE_SYNC WRITEs. So a WRITE takes
//! one kept here, or opens one, and gives it back after its flush; one
//! WRITE uses it at a time.
//!
//! The difference from a new description: a failure between a kept
//! description's last flush and the next WRITE that another description
//! was told of already (a COMMIT's, say) is told to that WRITE too, which
//! then fails with NFS4ERR_IO (NFS3ERR_IO) and changes the write verifier
//! again, where a new description would have said nothing. The data lost
//! was the same file's.
//!
//! Files are known by device and inode number, as everywhere in the
//! server: a kept descriptor holds its inode, so that on ext4, xfs and
//! btrfs the number names no other file while it is kept.
//!
//! The descriptors are read-only, so a read delegation's kernel lease is
//! not disturbed; a write delegation's is, and OPEN closes the file's kept
//! ones before it asks for one. REMOVE and RENAME over a file close its
//! kept ones at once, and the WRITEs under way then close theirs instead
//! of giving them back. Every one is closed after [`Witnesses::IDLE`]
//! unused (a file removed by a local process keeps its blocks until
//! then).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::by_file::{ByFile, FileKey};

/// A descriptor a stable WRITE flushes through.
#[derive(Debug)]
pub struct Witness {
    fd: OwnedFd,
    /// [`Kept::forgets`] when it was taken or opened.
    forgets: u64,
}

impl AsFd for Witness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Descriptors kept for stable WRITEs' flushes.
#[derive(Debug, Default)]
pub struct Witnesses {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// By file, each with when its last flush ended.
    fds: ByFile<(OwnedFd, Instant)>,
    /// Times [`Witnesses::forget`] closed a file's: a descriptor taken
    /// before one of them is closed, not kept, when its WRITE is done.
    forgets: u64,
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
    pub fn take(&self, file: FileKey) -> Option<Witness> {
        let mut k = self.lock();
        let (fd, _) = k.fds.pop(file)?;
        Some(Witness {
            fd,
            forgets: k.forgets,
        })
    }

    /// A new descriptor from `open`, for one stable WRITE to flush
    /// through and then give back.
    pub fn open(&self, open: impl FnOnce() -> io::Result<OwnedFd>) -> io::Result<Witness> {
        // Counted before it is opened: a file removed meanwhile does not
        // get it kept.
        let forgets = self.lock().forgets;
        Ok(Witness {
            fd: open()?,
            forgets,
        })
    }

    /// Gives back `w`, a descriptor of `file` whose flush has just ended,
    /// for the next stable WRITE of the file. Closed instead when the
    /// server forgot a file's descriptors since it was taken (the file
    /// may be gone), or when as many as this keeps are kept already.
    pub fn keep(&self, file: FileKey, w: Witness) {
        let mut k = self.lock();
        if w.forgets != k.forgets
            || k.fds.len() >= Self::MAX
            || k.fds.of(file).len() >= Self::PER_FILE
        {
            drop(k);
            drop(w);
            return;
        }
        k.fds.push(file, (w.fd, Instant::now()));
    }

    /// Closes the descriptors kept of `file` (removed, renamed over, or
    /// about to be delegated for writing), and has the ones in use closed
    /// when their WRITEs are done.
    pub fn forget(&self, file: FileKey) {
        let gone = {
            let mut k = self.lock();
            k.forgets += 1;
            k.fds.remove(file)
        };
        // Closed here, outside the lock (see `by_file`).
        drop(gone);
    }

    /// Closes the descriptors unused for [`Witnesses::IDLE`].
    pub fn sweep(&self) {
        let now = Instant::now();
        let gone = self
            .lock()
            .fds
            .retain(|(_, at)| now.saturating_duration_since(*at) < Self::IDLE);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(w: &Witnesses) -> Witness {
        w.open(|| Ok(std::fs::File::open("/dev/null")?.into()))
            .unwrap()
    }

    #[test]
    fn a_kept_descriptor_goes_to_one_taker_of_its_file_only() {
        let w = Witnesses::default();
        assert!(w.take((1, 1)).is_none());
        w.keep((1, 1), new(&w));
        assert!(
            w.take((1, 2)).is_none(),
            "another file's descriptor was handed out"
        );
        let taken = w.take((1, 1)).expect("kept");
        assert!(
            w.take((1, 1)).is_none(),
            "one kept descriptor went to two takers"
        );
        w.keep((1, 1), taken);
        assert!(w.take((1, 1)).is_some(), "given back, not kept");
        assert!(w.lock().fds.is_empty());
    }

    #[test]
    fn forget_closes_a_files_descriptors_and_keeps_the_others() {
        let w = Witnesses::default();
        for _ in 0..3 {
            w.keep((1, 1), new(&w));
        }
        w.keep((1, 2), new(&w));
        w.forget((1, 1));
        assert_eq!(w.lock().fds.len(), 1);
        assert!(w.take((1, 1)).is_none());
        assert!(w.take((1, 2)).is_some());
    }

    /// A descriptor in use (taken, or being opened) when its file's are
    /// forgotten is closed when given back: the file may be gone.
    #[test]
    fn one_in_use_when_the_file_is_forgotten_is_not_kept() {
        let w = Witnesses::default();
        w.keep((1, 1), new(&w));
        let taken = w.take((1, 1)).unwrap();
        let opened = new(&w);
        w.forget((1, 1));
        w.keep((1, 1), taken);
        w.keep((1, 1), opened);
        assert!(
            w.lock().fds.is_empty(),
            "a descriptor of a forgotten file was kept"
        );
        w.keep((1, 1), new(&w));
        assert_eq!(
            w.lock().fds.len(),
            1,
            "one opened after the forget was not kept"
        );
    }

    #[test]
    fn no_more_than_per_file_are_kept_of_one_file() {
        let w = Witnesses::default();
        for _ in 0..Witnesses::PER_FILE + 5 {
            w.keep((1, 1), new(&w));
        }
        assert_eq!(w.lock().fds.len(), Witnesses::PER_FILE);
    }

    #[test]
    fn sweep_closes_only_the_idle_ones() {
        let w = Witnesses::default();
        w.keep((1, 1), new(&w));
        w.keep((1, 2), new(&w));
        w.lock().fds.of_mut((1, 1))[0].1 = Instant::now() - Witnesses::IDLE;
        w.sweep();
        assert_eq!(w.lock().fds.len(), 1);
        assert!(w.take((1, 1)).is_none(), "an idle descriptor was kept");
        assert!(w.take((1, 2)).is_some(), "a fresh one was closed");
    }
}
