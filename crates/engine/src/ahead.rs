//! Readahead past the page cache: the window of a reader that reads with
//! O_DIRECT (see the readahead engine), read into the server's own cache
//! by a few threads of its own.
//!
//! A cold stream's own requests keep the device busy only while the client
//! has some on their way; between a reply going out and the next request
//! coming in, the device waits. The readahead engine therefore keeps a
//! window ahead of such a reader too, and this module reads it: in pieces
//! the size of the reader's requests, so that each request is later served
//! by a slice of one buffer, in order, and each piece under a shared range
//! lock like any READ, so that no write is seen half done. A piece whose
//! range is locked by a writer, or waited for by one, is not read at all:
//! the READ that needs it may hold its own lock while it waits for the
//! piece, and a piece waiting behind that writer would never come.
//!
//! A piece being read is *pending*. A READ that needs a pending piece
//! waits for it ([`Ahead::wait`]) and then finds its data in the cache,
//! rather than asking the device for the same bytes again.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::bufcache::BufCache;
use super::fs::{self, Stat, DIRECT_ALIGN};
use super::rangelock::RangeLocks;
use super::readahead::{FileId, Stats};

/// Threads reading ahead, for all streams: pieces in flight at the device
/// at most, besides the readers' own requests.
pub const THREADS: usize = 4;
/// Pieces waiting for a thread at most; more are not read ahead.
const QUEUE: usize = 256;

/// One piece, done or not.
#[derive(Debug, Default)]
struct Slot {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Slot {
    fn finish(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Pending pieces per file, by start offset: (end, slot).
type PendingMap = HashMap<FileId, BTreeMap<u64, (u64, Arc<Slot>)>>;

struct Job {
    file: FileId,
    st: Stat,
    fd: Arc<OwnedFd>,
    offset: u64,
    len: u64,
    slot: Arc<Slot>,
}

struct Shared {
    pending: Mutex<PendingMap>,
    cache: Arc<BufCache>,
    locks: Arc<RangeLocks>,
    stats: Arc<Stats>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, PendingMap> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, job: &Job) {
        let mut p = self.pending();
        if let Some(m) = p.get_mut(&job.file) {
            if m.get(&job.offset)
                .is_some_and(|(_, s)| Arc::ptr_eq(s, &job.slot))
            {
                m.remove(&job.offset);
            }
            if m.is_empty() {
                p.remove(&job.file);
            }
        }
    }

    fn run(&self, job: &Job) {
        let end = job.offset + job.len;
        if let Some(_shared) = self.locks.try_read(job.file, job.offset, end) {
            match fs::read_direct(job.fd.as_fd(), job.offset, job.len as usize) {
                Ok(data) => {
                    self.stats
                        .direct_bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    // Kept before the lock is let go: a writer that changes
                    // the range afterwards drops it from the cache.
                    self.cache.insert(job.file, &job.st, job.offset, data);
                }
                Err(err) => {
                    // The reader's own request will read it, and report
                    // what goes wrong.
                    tracing::debug!(error = %err, offset = job.offset, "readahead past the page cache failed");
                }
            }
        }
        // Out of the pending map only once the data is in the cache: a
        // READ that misses both is not one this piece could have served.
        self.forget(job);
        job.slot.finish();
    }
}

/// The readahead threads and their pending pieces.
pub struct Ahead {
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job>>,
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead").finish_non_exhaustive()
    }
}

impl Ahead {
    /// Threads that read into `cache` under `locks`, counting in `stats`;
    /// none when `enabled` is false or the cache keeps nothing.
    pub fn new(
        enabled: bool,
        cache: Arc<BufCache>,
        locks: Arc<RangeLocks>,
        stats: Arc<Stats>,
    ) -> Self {
        let on = enabled && cache.limit() > 0;
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            cache,
            locks,
            stats,
        });
        let tx = on.then(|| {
            let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
            let rx = Arc::new(Mutex::new(rx));
            let mut started = 0;
            for i in 0..THREADS {
                let (rx, shared) = (rx.clone(), shared.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("sluice-ahead-{i}"))
                    .spawn(move || {
                        // The server's identity, whatever the starter's.
                        crate::cred::reclaim();
                        worker(&rx, &shared)
                    });
                match spawned {
                    Ok(_) => started += 1,
                    Err(e) => tracing::warn!(error = %e, "a readahead thread did not start"),
                }
            }
            (started > 0).then_some(tx)
        });
        Ahead {
            shared,
            tx: tx.flatten(),
        }
    }

    /// Pieces queued and never read until the test runs them.
    #[cfg(test)]
    fn paused(cache: Arc<BufCache>, locks: Arc<RangeLocks>) -> (Self, Receiver<Job>) {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            cache,
            locks,
            stats: Arc::default(),
        });
        let ahead = Ahead {
            shared,
            tx: Some(tx),
        };
        (ahead, rx)
    }

    /// Whether pieces are read ahead at all.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Reads `from..to` of `file` (status `st` before the read) through
    /// the O_DIRECT descriptor `fd`, in pieces of `piece` bytes, skipping
    /// what is pending already; returns the bytes handed to the threads.
    /// `from` and `piece` must be multiples of 4 KiB, and the range lie
    /// within the file.
    pub fn schedule(
        &self,
        file: FileId,
        st: &Stat,
        fd: &Arc<OwnedFd>,
        from: u64,
        to: u64,
        piece: u64,
    ) -> u64 {
        let Some(tx) = &self.tx else {
            return 0;
        };
        let align = DIRECT_ALIGN as u64;
        if !from.is_multiple_of(align) || piece == 0 || !piece.is_multiple_of(align) {
            return 0;
        }
        // At most a quarter of the cache ahead of one reader: the largest
        // part one file may hold.
        let to = to.min(from.saturating_add(self.shared.cache.limit() / 4));
        let mut queued = 0;
        let mut off = from;
        while off < to {
            let len = piece.min(to - off);
            if self.shared.cache.holds(file, st, off, len) {
                // A reader's second pass: there already.
                off += len;
                continue;
            }
            let slot = Arc::new(Slot::default());
            {
                let mut p = self.shared.pending();
                let m = p.entry(file).or_default();
                let overlaps = m
                    .range(..off + len)
                    .next_back()
                    .is_some_and(|(_, (end, _))| *end > off);
                if overlaps {
                    off += len;
                    continue;
                }
                m.insert(off, (off + len, slot.clone()));
            }
            let job = Job {
                file,
                st: *st,
                fd: fd.clone(),
                offset: off,
                len,
                slot,
            };
            match tx.try_send(job) {
                Ok(()) => {
                    queued += len;
                    self.shared
                        .stats
                        .issued_bytes
                        .fetch_add(len, Ordering::Relaxed);
                }
                Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                    self.shared.forget(&job);
                    job.slot.finish();
                    self.shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
            off += len;
        }
        queued
    }

    /// Whether some of `len` bytes at `offset` of `file` are being read
    /// ahead now.
    pub fn pending(&self, file: FileId, offset: u64, len: u64) -> bool {
        !self.overlapping(file, offset, len).is_empty()
    }

    /// Waits until no piece overlapping `len` bytes at `offset` of `file`
    /// is being read; returns whether there was one.
    pub fn wait(&self, file: FileId, offset: u64, len: u64) -> bool {
        let slots = self.overlapping(file, offset, len);
        for s in &slots {
            s.wait();
        }
        !slots.is_empty()
    }

    fn overlapping(&self, file: FileId, offset: u64, len: u64) -> Vec<Arc<Slot>> {
        if self.tx.is_none() {
            return Vec::new();
        }
        let end = offset.saturating_add(len);
        let p = self.shared.pending();
        let Some(m) = p.get(&file) else {
            return Vec::new();
        };
        let first = m
            .range(..=offset)
            .next_back()
            .filter(|(_, (e, _))| *e > offset)
            .map(|(&s, _)| s)
            .unwrap_or(offset);
        m.range(first..end).map(|(_, (_, s))| s.clone()).collect()
    }
}

fn worker(rx: &Mutex<Receiver<Job>>, shared: &Shared) {
    loop {
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        shared.run(&job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1024 * 1024;

    fn setup(limit: u64) -> (Ahead, Arc<BufCache>, Arc<OwnedFd>, Stat, Vec<u8>) {
        let data: Vec<u8> = (0..4 * MB as usize + 1000)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let f = fs::disk_file("ahead", &data);
        let direct = fs::reopen(f.as_fd(), libc::O_RDONLY | libc::O_DIRECT)
            .expect("O_DIRECT open on the build's file system");
        let mut st = fs::stat(f.as_fd()).unwrap();
        // Old enough to be cached (files changed in the last second are not).
        st.mtime.sec -= 10;
        st.ctime.sec -= 10;
        let cache = Arc::new(BufCache::new(limit));
        let ahead = Ahead::new(
            true,
            cache.clone(),
            Arc::new(RangeLocks::new(true)),
            Arc::new(Stats::default()),
        );
        (ahead, cache, Arc::new(direct), st, data)
    }

    #[test]
    fn pieces_land_in_the_cache_and_waiters_find_them() {
        let (ahead, cache, fd, st, data) = setup(64 * MB);
        let size = data.len() as u64;
        let n = ahead.schedule((9, 9), &st, &fd, 0, size, MB);
        assert_eq!(n, size);
        // Scheduling again while pending or cached adds nothing pending
        // twice (cached pieces are read again only if asked).
        for i in 0..5u64 {
            let off = i * MB;
            ahead.wait((9, 9), off, MB);
            assert!(!ahead.pending((9, 9), off, MB));
            let got = cache
                .get((9, 9), &st, off, MB as usize)
                .expect("piece cached");
            let end = (off + MB).min(size) as usize;
            assert_eq!(&got.concat()[..], &data[off as usize..end], "piece {i}");
        }
        assert_eq!(
            ahead.shared.stats.direct_bytes.load(Ordering::Relaxed),
            size
        );
    }

    #[test]
    fn overlapping_pieces_are_not_scheduled_twice() {
        let (_, cache, fd, st, data) = setup(64 * MB);
        let locks = Arc::new(RangeLocks::new(true));
        let (ahead, rx) = Ahead::paused(cache.clone(), locks);
        assert_eq!(ahead.schedule((9, 9), &st, &fd, 0, 2 * MB, MB), 2 * MB);
        assert!(ahead.pending((9, 9), MB / 2, 4096));
        assert_eq!(ahead.schedule((9, 9), &st, &fd, MB, 3 * MB, MB), MB);
        let jobs: Vec<Job> = rx.try_iter().collect();
        assert_eq!(
            jobs.iter().map(|j| (j.offset, j.len)).collect::<Vec<_>>(),
            [(0, MB), (MB, MB), (2 * MB, MB)]
        );
        for j in &jobs {
            ahead.shared.run(j);
        }
        assert!(!ahead.pending((9, 9), 0, 3 * MB));
        assert!(!ahead.wait((9, 9), 0, 3 * MB));
        assert_eq!(
            &cache.get((9, 9), &st, MB, MB as usize).unwrap().concat()[..],
            &data[MB as usize..2 * MB as usize]
        );
        // What the cache holds is not read again.
        assert_eq!(ahead.schedule((9, 9), &st, &fd, 0, 4 * MB, MB), MB);
        assert_eq!(
            rx.try_iter().map(|j| j.offset).collect::<Vec<_>>(),
            [3 * MB]
        );
    }

    #[test]
    fn a_writer_on_the_range_means_the_piece_is_left_to_the_reader() {
        let (_, cache, fd, st, _data) = setup(64 * MB);
        let locks = Arc::new(RangeLocks::new(true));
        let (ahead, rx) = Ahead::paused(cache.clone(), locks.clone());
        assert_eq!(ahead.schedule((9, 9), &st, &fd, 0, MB, MB), MB);
        let job = rx.try_recv().unwrap();
        {
            // A READ holds its range; a writer waits behind it. The piece
            // must not queue behind the writer: that READ may be waiting
            // for the piece.
            let read = locks.read((9, 9), 0, MB);
            let (tx, writer_in) = mpsc::channel();
            let l2 = locks.clone();
            let writer = std::thread::spawn(move || {
                let _w = l2.write((9, 9), 0, MB);
                tx.send(()).unwrap();
            });
            while locks.try_read((9, 9), 0, 4096).is_some() {
                std::thread::yield_now();
            }
            ahead.shared.run(&job);
            assert!(!ahead.pending((9, 9), 0, MB));
            assert!(cache.get((9, 9), &st, 0, MB as usize).is_none());
            assert!(
                writer_in.try_recv().is_err(),
                "the writer got in past a read"
            );
            drop(read);
            writer.join().unwrap();
        }
    }

    #[test]
    fn unaligned_or_cacheless_asks_read_nothing() {
        let (ahead, _cache, fd, st, _data) = setup(64 * MB);
        assert_eq!(ahead.schedule((9, 9), &st, &fd, 100, MB, MB), 0);
        assert_eq!(ahead.schedule((9, 9), &st, &fd, 0, MB, 1000), 0);
        let (off, _, fd, st, _) = setup(0);
        assert!(!off.enabled());
        assert_eq!(off.schedule((9, 9), &st, &fd, 0, MB, MB), 0);
    }
}
