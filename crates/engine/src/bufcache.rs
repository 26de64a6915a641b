//! The server's own cache of data read past the page cache.
//!
//! Cold sequential streams are read with O_DIRECT (see the readahead
//! engine), so their data never enters the kernel's page cache. This cache
//! keeps those buffers instead, as they were read, so that the next pass
//! over the file is served from memory, and without a copy: a hit is a
//! slice of the buffer (or of each buffer it spans), which the reply
//! carries by reference.
//!
//! An entry belongs to one version of its file: size, modification and
//! change times as the read saw them. A lookup with a different version
//! drops the file's entries, and the server drops them too whenever it
//! changes the file itself. A file changed in the last second is not
//! cached at all: a local writer may still be copying data, with the times
//! already updated. The cache holds at most its byte limit; the oldest
//! entries go first, unless read since they were last looked at (second
//! chance).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::extents::Validator as Version;
use super::fs::Stat;
use super::readahead::FileId;

#[derive(Debug)]
struct Entry {
    data: Bytes,
    /// Read since the eviction scan last passed it.
    used: bool,
    /// Read at all since it came in.
    served: bool,
}

impl Entry {
    /// A slice of its data for a READ; with whether the entry had served
    /// one before.
    fn serve(&mut self, from: usize, to: usize) -> (Bytes, bool) {
        let again = self.served;
        self.used = true;
        self.served = true;
        (self.data.slice(from..to), again)
    }
}

#[derive(Debug)]
struct File {
    version: Version,
    /// Buffers by file offset; they do not overlap.
    entries: BTreeMap<u64, Entry>,
}

#[derive(Debug, Default)]
struct Inner {
    files: HashMap<FileId, File>,
    /// Entries in the order they were added (some may be gone already).
    order: VecDeque<(FileId, u64)>,
    /// Bytes held by all entries.
    bytes: u64,
    entries: usize,
}

/// Counters and the gauge, read by the metrics endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    /// READs served from the cache.
    pub hits: AtomicU64,
    /// Bytes held now.
    pub bytes: AtomicU64,
}

/// The cache; see the module documentation.
#[derive(Debug)]
pub struct BufCache {
    limit: u64,
    inner: Mutex<Inner>,
    /// Counters.
    pub stats: Stats,
}

/// Files changed this recently (seconds) are not cached.
const SETTLE_SECS: i64 = 1;

impl BufCache {
    /// A cache of at most `limit` bytes (0: keeps nothing).
    pub fn new(limit: u64) -> Self {
        BufCache {
            limit,
            inner: Mutex::new(Inner::default()),
            stats: Stats::default(),
        }
    }

    /// The byte limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `len` bytes at `offset` of `file`, whose status is now `st`,
    /// when the cache holds them all (or all up to the end of the file):
    /// a slice of one buffer, or slices of buffers end to end, in order.
    pub fn get(&self, file: FileId, st: &Stat, offset: u64, len: usize) -> Option<Vec<Bytes>> {
        // Every READ asks; an empty cache answers without its lock.
        if self.stats.bytes.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut inner = self.lock();
        if inner.files.get(&file)?.version != Version::of(st) {
            let f = inner.files.remove(&file)?;
            inner.drop_entries(&f);
            self.stats.bytes.store(inner.bytes, Ordering::Relaxed);
            return None;
        }
        let f = inner.files.get_mut(&file)?;
        let want_end = offset.saturating_add(len as u64).min(st.size);
        if offset >= st.size {
            return None;
        }
        let (&start, e) = f.entries.range_mut(..=offset).next_back()?;
        let data = if start + e.data.len() as u64 >= want_end {
            // One buffer holds it all: a slice, no copy.
            vec![e.serve((offset - start) as usize, (want_end - start) as usize)]
        } else {
            // Buffers end to end hold it (a client whose requests do not
            // fall on the buffers' boundaries): a slice of each, no copy.
            let mut out = Vec::with_capacity(2);
            let mut at = offset;
            for (&s, e) in f.entries.range_mut(start..want_end) {
                if s > at || s + (e.data.len() as u64) <= at {
                    return None;
                }
                let to = (s + e.data.len() as u64).min(want_end);
                out.push(e.serve((at - s) as usize, (to - s) as usize));
                at = to;
            }
            if at < want_end {
                return None;
            }
            out
        };
        for (piece, again) in &data {
            // Served again, unchanged: its pages may go to a socket by
            // reference (see `hugebuf::fix`). Not on its first READ, as
            // for a piece read ahead of a cold stream: data sent once
            // leaves its region to be used again.
            if *again {
                crate::hugebuf::cached(piece);
            }
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(data.into_iter().map(|(piece, _)| piece).collect())
    }

    /// Whether the cache holds all of `len` bytes at `offset` of `file`
    /// (status `st`), in one buffer or several end to end; a question
    /// only, which neither counts as a hit nor keeps the entries longer.
    pub fn holds(&self, file: FileId, st: &Stat, offset: u64, len: u64) -> bool {
        if self.stats.bytes.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let inner = self.lock();
        let Some(f) = inner.files.get(&file) else {
            return false;
        };
        if f.version != Version::of(st) || offset >= st.size {
            return false;
        }
        let end = offset.saturating_add(len).min(st.size);
        let mut at = offset;
        let Some((&start, _)) = f.entries.range(..=offset).next_back() else {
            return false;
        };
        for (&s, e) in f.entries.range(start..end.max(start + 1)) {
            if s > at {
                return false;
            }
            at = at.max(s + e.data.len() as u64);
            if at >= end {
                return true;
            }
        }
        at >= end
    }

    /// Keeps `data`, read at `offset` of `file` whose status was `st`
    /// before the read, ahead of the READs that will want it.
    pub fn insert(&self, file: FileId, st: &Stat, offset: u64, data: Bytes) {
        self.keep(file, st, offset, data, false)
    }

    /// [`BufCache::insert`] for data that a READ has just served: the
    /// next READ of it is its second.
    pub fn insert_served(&self, file: FileId, st: &Stat, offset: u64, data: Bytes) {
        self.keep(file, st, offset, data, true)
    }

    fn keep(&self, file: FileId, st: &Stat, offset: u64, data: Bytes, served: bool) {
        let size = data.len() as u64;
        if self.limit == 0 || size == 0 || size > self.limit / 4 || recently_changed(st) {
            return;
        }
        let version = Version::of(st);
        let mut inner = self.lock();
        let stale = inner.files.get(&file).is_some_and(|f| f.version != version);
        if stale {
            if let Some(f) = inner.files.remove(&file) {
                inner.drop_entries(&f);
            }
        }
        let f = inner.files.entry(file).or_insert_with(|| File {
            version,
            entries: BTreeMap::new(),
        });
        // Buffers do not overlap: one already holding part of the range
        // stays, and this one is not kept.
        let end = offset + size;
        let before = f
            .entries
            .range(..=offset)
            .next_back()
            .is_some_and(|(&s, e)| s + e.data.len() as u64 > offset);
        let after = f.entries.range(offset..end).next().is_some();
        if before || after {
            return;
        }
        f.entries.insert(
            offset,
            Entry {
                data,
                used: false,
                served,
            },
        );
        inner.bytes += size;
        inner.entries += 1;
        inner.order.push_back((file, offset));
        inner.evict(self.limit);
        self.stats.bytes.store(inner.bytes, Ordering::Relaxed);
    }

    /// Forgets everything (an operator's request for a cold cache);
    /// returns the bytes dropped.
    pub fn clear(&self) -> u64 {
        let mut inner = self.lock();
        let dropped = inner.bytes;
        *inner = Inner::default();
        self.stats.bytes.store(0, Ordering::Relaxed);
        dropped
    }

    /// Forgets `file`: the server is changing it.
    pub fn invalidate(&self, file: FileId) {
        if self.limit == 0 {
            return;
        }
        let mut inner = self.lock();
        if let Some(f) = inner.files.remove(&file) {
            inner.drop_entries(&f);
            self.stats.bytes.store(inner.bytes, Ordering::Relaxed);
        }
    }
}

impl Inner {
    fn drop_entries(&mut self, f: &File) {
        let bytes: u64 = f.entries.values().map(|e| e.data.len() as u64).sum();
        self.bytes -= bytes;
        self.entries -= f.entries.len();
        if self.order.len() > 2 * self.entries + 1024 {
            // Mostly keys of entries gone: keep only the live ones.
            let files = &self.files;
            self.order
                .retain(|(file, off)| files.get(file).is_some_and(|f| f.entries.contains_key(off)));
        }
    }

    fn evict(&mut self, limit: u64) {
        while self.bytes > limit {
            let Some((file, off)) = self.order.pop_front() else {
                return;
            };
            let Some(f) = self.files.get_mut(&file) else {
                continue;
            };
            let Some(e) = f.entries.get_mut(&off) else {
                continue;
            };
            if e.used {
                e.used = false;
                self.order.push_back((file, off));
                continue;
            }
            let e = f.entries.remove(&off).expect("entry just seen");
            if f.entries.is_empty() {
                self.files.remove(&file);
            }
            self.bytes -= e.data.len() as u64;
            self.entries -= 1;
        }
    }
}

/// True when the file changed less than [`SETTLE_SECS`] ago.
fn recently_changed(st: &Stat) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let at = |t: crate::fs::Time| t.sec as i128 * 1_000_000_000 + t.nsec as i128;
    at(st.ctime).max(at(st.mtime)) + SETTLE_SECS as i128 * 1_000_000_000 > now
}

/// The default limit: an eighth of the machine's memory.
pub fn default_limit() -> u64 {
    // SAFETY: sysconf has no memory arguments.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 256 << 20;
    }
    (pages as u64).saturating_mul(page as u64) / 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Time;

    const F: FileId = (1, 1);

    fn st(size: u64, ctime: i64) -> Stat {
        Stat {
            mode: libc::S_IFREG | 0o644,
            size,
            ctime: Time {
                sec: ctime,
                nsec: 0,
            },
            mtime: Time {
                sec: ctime,
                nsec: 0,
            },
            ..Default::default()
        }
    }

    fn data(n: usize, seed: u8) -> Bytes {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    }

    #[test]
    fn hits_are_slices_of_what_was_read() {
        let c = BufCache::new(1 << 20);
        let s = st(100_000, 1000);
        let d = data(8192, 3);
        c.insert(F, &s, 4096, d.clone());
        assert_eq!(c.get(F, &s, 4096, 8192).unwrap(), vec![d.clone()]);
        assert_eq!(c.get(F, &s, 5000, 100).unwrap(), vec![d.slice(904..1004)]);
        // Not held whole: a miss.
        assert!(c.get(F, &s, 0, 8192).is_none());
        assert!(c.get(F, &s, 8192, 8192).is_none());
        // Held by buffers end to end: a slice of each, in order.
        let d2 = data(4096, 9);
        c.insert(F, &s, 12_288, d2.clone());
        let both = c.get(F, &s, 8192, 8192).unwrap();
        assert_eq!(both, vec![d.slice(4096..), d2.clone()]);
        assert_eq!(both[0].as_ptr(), d[4096..].as_ptr(), "copied, not sliced");
        // Up to the end of the file is whole, past it is nothing.
        let s2 = st(12_288, 1000);
        let c2 = BufCache::new(1 << 20);
        c2.insert(F, &s2, 4096, d.clone());
        assert_eq!(
            c2.get(F, &s2, 8192, 1 << 20).unwrap(),
            vec![d.slice(4096..)]
        );
        assert!(c2.get(F, &s2, 12_288, 10).is_none());
        assert_eq!(c.stats.hits.load(Ordering::Relaxed), 3);
        // Asking whether it holds a range is no hit.
        assert!(c.holds(F, &s, 4096, 12_288));
        assert!(c.holds(F, &s, 5000, 100));
        assert!(!c.holds(F, &s, 0, 8192));
        assert!(!c.holds(F, &s, 8192, 8193));
        assert!(!c.holds(F, &st(100_000, 1001), 4096, 4096));
        assert!(c2.holds(F, &s2, 8192, 1 << 20));
        assert!(!c2.holds(F, &s2, 12_288, 10));
        assert_eq!(c.stats.hits.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_changed_file_is_forgotten() {
        let c = BufCache::new(1 << 20);
        c.insert(F, &st(10_000, 1000), 0, data(4096, 1));
        // Another version (a write from elsewhere): dropped, not served.
        assert!(c.get(F, &st(10_000, 1001), 0, 4096).is_none());
        assert!(c.get(F, &st(10_000, 1000), 0, 4096).is_none());
        assert_eq!(c.stats.bytes.load(Ordering::Relaxed), 0);
        c.insert(F, &st(10_000, 1000), 0, data(4096, 1));
        c.invalidate(F);
        assert!(c.get(F, &st(10_000, 1000), 0, 4096).is_none());
    }

    #[test]
    fn files_changed_just_now_are_not_kept() {
        let c = BufCache::new(1 << 20);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let s = st(10_000, now);
        c.insert(F, &s, 0, data(4096, 1));
        assert!(c.get(F, &s, 0, 4096).is_none());
    }

    #[test]
    fn the_limit_holds_and_used_entries_stay_longer() {
        let c = BufCache::new(64 * 1024);
        let s = st(1 << 30, 1000);
        for i in 0..8u64 {
            c.insert(F, &s, i * 8192, data(8192, i as u8));
        }
        // Entry 0 was read: it gets a second chance over entry 1.
        assert!(c.get(F, &s, 0, 8192).is_some());
        for i in 8..12u64 {
            c.insert(F, &s, i * 8192, data(8192, i as u8));
        }
        assert!(c.stats.bytes.load(Ordering::Relaxed) <= 64 * 1024);
        assert!(
            c.get(F, &s, 0, 8192).is_some(),
            "a used entry was evicted first"
        );
        assert!(c.get(F, &s, 8192, 8192).is_none());
        assert!(c.get(F, &s, 11 * 8192, 8192).is_some());
    }

    #[test]
    fn clear_forgets_everything() {
        let c = BufCache::new(1 << 20);
        let s = st(1 << 20, 1000);
        c.insert(F, &s, 0, data(8192, 1));
        c.insert((1, 2), &s, 0, data(4096, 1));
        assert_eq!(c.clear(), 12_288);
        assert!(c.get(F, &s, 0, 8192).is_none());
        assert_eq!(c.stats.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn overlapping_buffers_are_not_kept_twice() {
        let c = BufCache::new(1 << 20);
        let s = st(1 << 20, 1000);
        c.insert(F, &s, 0, data(8192, 1));
        c.insert(F, &s, 4096, data(8192, 2));
        c.insert(F, &s, 8192, data(8192, 3));
        assert_eq!(c.stats.bytes.load(Ordering::Relaxed), 16_384);
        assert_eq!(
            c.get(F, &s, 4096, 4096).unwrap(),
            vec![data(8192, 1).slice(4096..)]
        );
    }

    #[test]
    fn invalidation_churn_keeps_the_order_queue_bounded() {
        let c = BufCache::new(1 << 20);
        let s = st(1 << 20, 1000);
        for i in 0..10_000u64 {
            c.insert((2, i), &s, 0, data(64, 1));
            c.invalidate((2, i));
        }
        assert!(c.lock().order.len() <= 1024 + 2);
        assert_eq!(c.lock().bytes, 0);
    }

    /// A buffer of `len` bytes in a region of the server's buffers.
    fn region_data(len: usize) -> Bytes {
        let mut b = crate::hugebuf::Buf::new(len).unwrap();
        // SAFETY: within the buffer's capacity.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), 1, len) };
        b.freeze(len)
    }

    /// Data read ahead is marked as served again (which lets a socket
    /// keep its pages, `hugebuf::fix`) on its second READ, not its first:
    /// the pieces of a cold stream larger than the cache are read once,
    /// and their regions used again. Data a READ read itself and left in
    /// the cache is marked on the next READ of it.
    #[test]
    fn only_data_served_again_may_be_sent_by_reference() {
        // Whole regions: marks are the region's.
        const R: usize = crate::hugebuf::REGION;
        let c = BufCache::new(64 << 20);
        let s = st(4 * R as u64, 1000);
        let ahead = region_data(R);
        c.insert(F, &s, 0, ahead.clone());
        let first = c.get(F, &s, 0, R).unwrap();
        assert_eq!(first[0].as_ptr(), ahead.as_ptr());
        assert!(
            !crate::hugebuf::is_cached(&ahead),
            "marked on its first READ"
        );
        c.get(F, &s, 0, R).unwrap();
        assert!(
            crate::hugebuf::is_cached(&ahead),
            "not marked on its second READ"
        );
        let read = region_data(R);
        c.insert_served(F, &s, R as u64, read.clone());
        assert!(!crate::hugebuf::is_cached(&read));
        // A READ over both buffers: the second one's first READ from the
        // cache is its second in all.
        c.get(F, &s, R as u64 / 2, R).unwrap();
        assert!(crate::hugebuf::is_cached(&read));
    }
}
