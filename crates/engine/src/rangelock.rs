//! Byte-range locks held around backing I/O, per file.
//!
//! Reads hold their range shared and writes theirs exclusive, so a read
//! sees each overlapping write entirely or not at all, whatever the backing
//! file system promises. Grants among overlapping, conflicting requests
//! follow arrival order: a request waits for every earlier request it
//! conflicts with, granted or still waiting, so neither readers nor writers
//! starve. Requests that do not overlap never wait for each other.
//!
//! Held and waiting ranges live in an ordered map keyed by start; ranges up
//! to [`SMALL`] bytes (every READ and WRITE) are found in O(log n + k), and
//! the rare larger ones (size changes, ALLOCATE) are kept in a short list.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};

/// Ranges up to this length are indexed by start.
pub const SMALL: u64 = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy)]
struct Entry {
    end: u64,
    exclusive: bool,
}

#[derive(Debug, Default)]
struct Ranges {
    /// (start, ticket) -> entry, for ranges up to SMALL bytes.
    small: BTreeMap<(u64, u64), Entry>,
    /// ticket -> (start, entry), for larger ranges.
    large: BTreeMap<u64, (u64, Entry)>,
    /// Requests waiting on the table's condition variable: a guard let go
    /// wakes them only when there are some (a wake is a system call even
    /// when no one waits).
    waiters: usize,
}

impl Ranges {
    fn is_empty(&self) -> bool {
        self.small.is_empty() && self.large.is_empty()
    }

    /// True when an earlier request (lower ticket) conflicts with this one.
    fn blocked(&self, ticket: u64, start: u64, e: Entry) -> bool {
        let conflicts = |t: u64, s: u64, o: &Entry| {
            t < ticket && s < e.end && start < o.end && (e.exclusive || o.exclusive)
        };
        let lo = start.saturating_sub(SMALL);
        let small = self
            .small
            .range((lo, 0)..(e.end, 0))
            .any(|(&(s, t), o)| conflicts(t, s, o));
        small
            || self
                .large
                .iter()
                .take_while(|(&t, _)| t < ticket)
                .any(|(&t, (s, o))| conflicts(t, *s, o))
    }

    fn insert(&mut self, ticket: u64, start: u64, e: Entry) {
        if e.end - start <= SMALL {
            self.small.insert((start, ticket), e);
        } else {
            self.large.insert(ticket, (start, e));
        }
    }

    fn remove(&mut self, ticket: u64, start: u64, end: u64) {
        if end - start <= SMALL {
            self.small.remove(&(start, ticket));
        } else {
            self.large.remove(&ticket);
        }
    }
}

#[derive(Debug, Default)]
struct FileTable {
    ranges: Mutex<Ranges>,
    changed: Condvar,
}

/// The range locks of all files.
#[derive(Debug)]
pub struct RangeLocks {
    files: Mutex<HashMap<(u64, u64), Arc<FileTable>>>,
    tickets: std::sync::atomic::AtomicU64,
    enabled: bool,
}

impl Default for RangeLocks {
    fn default() -> Self {
        Self::new(true)
    }
}

/// The lock table a guard belongs to: borrowed, or shared for a guard
/// that outlives its caller (see [`RangeLocks::try_read_owned`]).
enum Owner<'a> {
    Borrowed(&'a RangeLocks),
    Shared(Arc<RangeLocks>),
}

impl std::ops::Deref for Owner<'_> {
    type Target = RangeLocks;

    fn deref(&self) -> &RangeLocks {
        match self {
            Owner::Borrowed(l) => l,
            Owner::Shared(l) => l,
        }
    }
}

/// A held range; released when dropped.
#[must_use]
pub struct RangeGuard<'a> {
    owner: Owner<'a>,
    key: (u64, u64),
    table: Option<Arc<FileTable>>,
    ticket: u64,
    start: u64,
    end: u64,
}

impl RangeLocks {
    /// A lock table; with `enabled` false every lock is granted at once
    /// (a test-only switch to show what torn reads look like).
    pub fn new(enabled: bool) -> Self {
        RangeLocks {
            files: Mutex::new(HashMap::new()),
            tickets: Default::default(),
            enabled,
        }
    }

    /// Locks `[start, end)` of file `key`, shared or exclusive, waiting for
    /// earlier conflicting requests.
    pub fn lock(&self, key: (u64, u64), start: u64, end: u64, exclusive: bool) -> RangeGuard<'_> {
        self.acquire(Owner::Borrowed(self), key, start, end, exclusive, true)
            .expect("a waiting lock is always granted")
    }

    /// Locks `[start, end)` of file `key` if no earlier conflicting
    /// request holds or waits for it; None (and nothing held) otherwise.
    pub fn try_lock(
        &self,
        key: (u64, u64),
        start: u64,
        end: u64,
        exclusive: bool,
    ) -> Option<RangeGuard<'_>> {
        self.acquire(Owner::Borrowed(self), key, start, end, exclusive, false)
    }

    /// Like [`RangeLocks::try_read`], for a guard that may outlive the
    /// caller (data lent to a reply until it is sent).
    pub fn try_read_owned(
        self: &Arc<Self>,
        key: (u64, u64),
        start: u64,
        end: u64,
    ) -> Option<RangeGuard<'static>> {
        self.acquire(Owner::Shared(self.clone()), key, start, end, false, false)
    }

    fn acquire<'a>(
        &self,
        owner: Owner<'a>,
        key: (u64, u64),
        start: u64,
        end: u64,
        exclusive: bool,
        wait: bool,
    ) -> Option<RangeGuard<'a>> {
        let end = end.max(start.saturating_add(1));
        if !self.enabled {
            return Some(RangeGuard {
                owner,
                key,
                table: None,
                ticket: 0,
                start,
                end,
            });
        }
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let table = files.entry(key).or_default().clone();
        let e = Entry { end, exclusive };
        let mut r = table.ranges.lock().unwrap_or_else(|e| e.into_inner());
        // The ticket is taken under the table's mutex, so ticket order is
        // insertion order and every earlier ticket is already visible.
        let ticket = self
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r.insert(ticket, start, e);
        // The request is in the table before the file map is let go, so a
        // table found empty under the map's mutex has no users and can go.
        drop(files);
        let guard = RangeGuard {
            owner,
            key,
            table: Some(table.clone()),
            ticket,
            start,
            end,
        };
        if !wait && r.blocked(ticket, start, e) {
            drop(r);
            // Dropping the guard takes the request out again.
            drop(guard);
            return None;
        }
        while r.blocked(ticket, start, e) {
            r.waiters += 1;
            r = table.changed.wait(r).unwrap_or_else(|e| e.into_inner());
            r.waiters -= 1;
        }
        drop(r);
        Some(guard)
    }

    /// Shared lock for reading `[start, end)`.
    pub fn read(&self, key: (u64, u64), start: u64, end: u64) -> RangeGuard<'_> {
        self.lock(key, start, end, false)
    }

    /// Exclusive lock for changing `[start, end)`.
    pub fn write(&self, key: (u64, u64), start: u64, end: u64) -> RangeGuard<'_> {
        self.lock(key, start, end, true)
    }

    /// Shared lock for reading `[start, end)` if it is free now.
    pub fn try_read(&self, key: (u64, u64), start: u64, end: u64) -> Option<RangeGuard<'_>> {
        self.try_lock(key, start, end, false)
    }

    /// Number of files with held or waiting ranges.
    pub fn files_in_use(&self) -> usize {
        self.files.lock().map(|f| f.len()).unwrap_or(0)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let Some(table) = self.table.take() else {
            return;
        };
        // A waiter counts itself under the mutex before it waits, so one
        // that is not counted here has not begun to wait, and will find
        // this range gone when it looks.
        let (empty, waiting) = {
            let mut r = table.ranges.lock().unwrap_or_else(|e| e.into_inner());
            r.remove(self.ticket, self.start, self.end);
            (r.is_empty(), r.waiters > 0)
        };
        if waiting {
            table.changed.notify_all();
        }
        if empty {
            let mut files = self.owner.files.lock().unwrap_or_else(|e| e.into_inner());
            // Drop the table unless a request entered it meanwhile (requests
            // enter while holding the map's mutex, see `lock`).
            let unused = files.get(&self.key).is_some_and(|t| {
                Arc::ptr_eq(t, &table) && t.ranges.lock().map(|r| r.is_empty()).unwrap_or(false)
            });
            if unused {
                files.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    const K: (u64, u64) = (1, 1);

    #[test]
    fn try_lock_takes_free_ranges_and_leaves_no_trace_otherwise() {
        let l = RangeLocks::default();
        let w = l.write(K, 100, 200);
        // Overlapping the writer: refused, and nothing left waiting.
        assert!(l.try_read(K, 150, 250).is_none());
        assert!(l.try_read(K, 0, 101).is_none());
        // Beside it, or a read beside a read: granted.
        let r = l.try_read(K, 200, 300).expect("free range");
        let r2 = l.try_read(K, 250, 260).expect("shared with a read");
        assert!(l.try_lock(K, 290, 310, true).is_none());
        drop((w, r, r2));
        assert_eq!(l.files_in_use(), 0);
        let all = l.try_lock(K, 0, 1000, true).expect("all free");
        drop(all);
        assert_eq!(l.files_in_use(), 0);
    }

    #[test]
    fn non_overlapping_and_shared_ranges_do_not_wait() {
        let l = RangeLocks::default();
        let _a = l.write(K, 0, 100);
        let _b = l.write(K, 100, 200);
        let _c = l.read(K, 300, 400);
        let _d = l.read(K, 350, 450);
        let _e = l.write((2, 2), 0, 100);
    }

    /// Runs `f` on a thread and reports whether it finished within `wait`.
    fn finishes<F: FnOnce() + Send + 'static>(f: F) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx
    }

    #[test]
    fn overlapping_writer_waits_for_reader_then_proceeds() {
        let l = Arc::new(RangeLocks::default());
        let r = l.read(K, 0, 8192);
        let l2 = l.clone();
        let done = finishes(move || drop(l2.write(K, 4096, 12288)));
        // The writer cannot finish while the read is held...
        assert!(done.recv_timeout(Duration::from_millis(100)).is_err());
        drop(r);
        // ...and finishes once it is released.
        done.recv_timeout(Duration::from_secs(10))
            .expect("writer granted after release");
        assert_eq!(l.files_in_use(), 0);
    }

    #[test]
    fn grants_follow_arrival_order() {
        // A reader arriving after a waiting writer waits behind it, so a
        // stream of readers cannot starve the writer.
        let l = Arc::new(RangeLocks::default());
        let first = l.read(K, 0, 100);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (l2, o2) = (l.clone(), order.clone());
        let (started_tx, started_rx) = mpsc::channel();
        let w = thread::spawn(move || {
            started_tx.send(()).unwrap();
            let _g = l2.write(K, 0, 100);
            o2.lock().unwrap().push("writer");
        });
        started_rx.recv().unwrap();
        // Wait until the writer is queued (its ticket is taken).
        while l.tickets.load(Ordering::SeqCst) < 2 {
            thread::yield_now();
        }
        let (l3, o3) = (l.clone(), order.clone());
        let r = thread::spawn(move || {
            let _g = l3.read(K, 50, 60);
            o3.lock().unwrap().push("reader");
        });
        while l.tickets.load(Ordering::SeqCst) < 3 {
            thread::yield_now();
        }
        drop(first);
        w.join().unwrap();
        r.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["writer", "reader"]);
    }

    #[test]
    fn large_ranges_conflict_with_small_ones() {
        let l = Arc::new(RangeLocks::default());
        let big = l.write(K, 0, u64::MAX);
        let l2 = l.clone();
        let done = finishes(move || drop(l2.read(K, 10 << 30, (10 << 30) + 4096)));
        assert!(done.recv_timeout(Duration::from_millis(100)).is_err());
        drop(big);
        done.recv_timeout(Duration::from_secs(10)).expect("granted");
    }

    #[test]
    fn reads_never_see_torn_writes_under_the_lock() {
        // Writers fill a block with one byte value; readers check the block
        // is uniform. With the lock this never fails.
        let l = Arc::new(RangeLocks::default());
        let block = Arc::new(Mutex::new(vec![0u8; 4096]));
        let torn = Arc::new(AtomicUsize::new(0));
        let mut hs = Vec::new();
        for w in 0..4u8 {
            let (l, b) = (l.clone(), block.clone());
            hs.push(thread::spawn(move || {
                for i in 0..200u32 {
                    let _g = l.write(K, 0, 4096);
                    let v = w.wrapping_mul(50).wrapping_add(i as u8);
                    for j in 0..4096 {
                        b.lock().unwrap()[j] = v;
                    }
                }
            }));
        }
        for _ in 0..4 {
            let (l, b, t) = (l.clone(), block.clone(), torn.clone());
            hs.push(thread::spawn(move || {
                for _ in 0..200 {
                    let _g = l.read(K, 0, 4096);
                    let snap = b.lock().unwrap().clone();
                    if snap.iter().any(|&x| x != snap[0]) {
                        t.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(torn.load(Ordering::Relaxed), 0);
    }

    /// Guards let go wake waiters only when some are counted: many threads
    /// taking the same range in turn all finish (a wake lost would leave
    /// one waiting for good), and never hold it together.
    #[test]
    fn every_waiter_is_woken_when_many_take_the_same_range() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let l = Arc::new(RangeLocks::default());
        let inside = Arc::new(AtomicU64::new(0));
        let done = finishes({
            let (l, inside) = (l.clone(), inside.clone());
            move || {
                let threads: Vec<_> = (0..8)
                    .map(|i| {
                        let (l, inside) = (l.clone(), inside.clone());
                        std::thread::spawn(move || {
                            for n in 0..2000u64 {
                                // Writers and readers of overlapping ranges.
                                let write = (n + i) % 3 != 0;
                                let g = if write {
                                    l.write(K, 2048, 8192)
                                } else {
                                    l.read(K, 0, 4096)
                                };
                                if write {
                                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                                    std::hint::spin_loop();
                                    inside.fetch_sub(1, Ordering::SeqCst);
                                }
                                drop(g);
                            }
                        })
                    })
                    .collect();
                for t in threads {
                    t.join().unwrap();
                }
            }
        });
        done.recv_timeout(Duration::from_secs(60))
            .expect("every thread got the range in turn");
        assert_eq!(l.files_in_use(), 0);
    }
}
