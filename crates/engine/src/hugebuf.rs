//! Buffers for O_DIRECT reads, cut from 2 MiB regions of memory that the
//! kernel backs with transparent huge pages.
//!
//! A block device takes a request as pieces of physically contiguous
//! memory and limits how many pieces one request may have (a loop device:
//! 128 pieces of at most 64 KiB). A 1 MiB buffer of scattered 4 KiB pages
//! has 256 pieces, so the kernel splits each 1 MiB read into two 512 KiB
//! requests. On the loop devices of our benchmarks, three to eight 1 MiB
//! reads in flight gave 1.6–1.7 GB/s from ordinary memory against 2.7–2.9
//! GB/s into huge pages, where a read stays one request (docs/readahead.md).
//!
//! Regions are used again once every buffer cut from them is gone: freed
//! regions are kept up to [`keep_free`] bytes (the server's read cache
//! size, which these buffers fill) and never given back. A new huge page
//! must be zeroed, and in a virtual machine whose host takes back the
//! guest's free memory, the host must supply it first: on our benchmark
//! machine the first gigabyte a fresh server reads this way comes at about
//! 0.4 GB/s, against 1.6 GB/s into ordinary pages, and every pass after it
//! at 2.3 GB/s against 1.7–1.9 (docs/readahead.md). So each new region is
//! filled at once (`MADV_POPULATE_WRITE`) and timed; once eight new huge
//! pages in a row have proved slow (over 2 ms each), no read waits for a
//! new huge page any more. A read that finds no huge region to reuse then
//! gets ordinary memory, and a thread of its own ([`filler`]) makes huge
//! regions for the reads that follow: after such misses, and only while
//! the server reads nothing (filling a page the host must supply holds up
//! a CPU for milliseconds), it fills a small stock of new ones and turns
//! the ordinary regions kept for reuse into huge ones, so that over time
//! the regions reused are huge ([`settle`] does the latter at once). When
//! the kernel has no huge page to give, a region is ordinary memory too,
//! and everything works as before, only without the gain.

use bytes::Bytes;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Size and alignment of a region: one huge page on x86-64 and arm64
/// with 4 KiB pages.
pub const REGION: usize = 2 << 20;

/// Buffers start and end on this boundary (what O_DIRECT asks of them).
const ALIGN: usize = 4096;

/// Freed regions kept for the next buffers, at most; more are unmapped.
static KEEP_FREE: AtomicUsize = AtomicUsize::new(32);

/// Keeps up to `bytes` of freed regions for reuse (default 64 MiB).
pub fn keep_free(bytes: u64) {
    let regions = usize::try_from(bytes / REGION as u64).unwrap_or(usize::MAX);
    KEEP_FREE.store(regions, Ordering::Relaxed);
    let mut free = lock(&FREE);
    let plain = free.plain.len().min(regions);
    free.plain.truncate(plain);
    free.huge.truncate(regions - plain);
}

/// An anonymous mapping, aligned to [`REGION`].
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Asked for huge pages (counted in [`HUGE_ALIVE`]).
    huge: bool,
}

// SAFETY: the mapping is plain memory owned by this value; who may write
// where is governed by `Buf` (disjoint ranges, then read-only).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (a multiple of [`REGION`]) on a [`REGION`]
    /// boundary; with `huge`, asks for huge pages (and fills a region at
    /// once, timing it).
    fn new(len: usize, huge: bool) -> io::Result<Mapping> {
        debug_assert!(len > 0 && len.is_multiple_of(REGION));
        let total = len + REGION;
        // SAFETY: a new private anonymous mapping; no existing memory is
        // touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(REGION);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: both ranges lie inside the mapping just made and outside
        // the part kept; unmapping them cannot fail in a way that matters
        // (the worst case leaves them mapped and unused).
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        if huge {
            let at = aligned as *mut libc::c_void;
            // SAFETY: advice on the mapping just made. Only hints: without
            // huge pages the memory works the same, and memory not filled
            // now is filled when first written.
            unsafe { libc::madvise(at, len, libc::MADV_HUGEPAGE) };
            if len == REGION {
                let started = Instant::now();
                // SAFETY: as above.
                if unsafe { libc::madvise(at, len, libc::MADV_POPULATE_WRITE) } == 0 {
                    note_fill(started.elapsed());
                }
            }
        }
        let ptr = NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::other("mmap at 0"))?;
        if huge {
            HUGE_ALIVE.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Mapping { ptr, len, huge })
    }
}

/// New regions ask for huge pages until those prove slow to fill.
static HUGE: AtomicBool = AtomicBool::new(true);
/// New regions in a row that were slow to fill.
static SLOW_FILLS: AtomicU32 = AtomicU32::new(0);
/// A new region filled more slowly than this (1 GB/s) counts as slow;
/// zeroing a huge page takes a tenth of that on bare metal.
const SLOW_FILL: Duration = Duration::from_millis(2);
/// Slow fills in a row after which new regions are ordinary memory.
const SLOW_LIMIT: u32 = 8;

/// Whether huge pages have proved too slow to fill: the host of a virtual
/// machine that has taken the guest's free memory back supplies a new huge
/// page at a fraction of the device's rate, and a stream would wait for
/// it. Regions made so far stay in use either way.
/// (Pages the guest freed just before, which the host still backs, fill
/// fast; hence a run of slow fills, not a share of all.)
fn too_slow(slow_in_a_row: u32) -> bool {
    slow_in_a_row >= SLOW_LIMIT
}

fn note_fill(took: Duration) {
    let slow = if took > SLOW_FILL {
        SLOW_FILLS.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        SLOW_FILLS.store(0, Ordering::Relaxed);
        0
    };
    if too_slow(slow) && HUGE.swap(false, Ordering::Relaxed) {
        tracing::info!(
            slow,
            "new huge pages are slow to fill here (over 2 ms each): reads no longer wait for them; a background thread makes them while the server is idle"
        );
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.huge {
            HUGE_ALIVE.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// A region shared by the buffers cut from it.
struct Region {
    map: Option<Mapping>,
}

impl Region {
    /// A region of `map`, counted among the [`LIVE`] ones.
    fn new(map: Mapping) -> Region {
        let live = Live {
            len: map.len,
            cached: false,
            fixed: false,
        };
        lock(&LIVE).insert(map.ptr.as_ptr() as usize, live);
        Region { map: Some(map) }
    }

    fn ptr(&self) -> *mut u8 {
        self.map
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.ptr.as_ptr())
    }
}

/// A region alive, as [`LIVE`] knows it.
struct Live {
    len: usize,
    /// The read cache serves data from it (see [`cached`]).
    cached: bool,
    /// Its pages went to the kernel by reference (see [`fix`]).
    fixed: bool,
}

/// The regions alive, by start address.
static LIVE: Mutex<std::collections::BTreeMap<usize, Live>> =
    Mutex::new(std::collections::BTreeMap::new());

/// The region all of the `len` bytes at address `at` lie in, if any.
fn live_of(
    live: &mut std::collections::BTreeMap<usize, Live>,
    at: usize,
    len: usize,
) -> Option<&mut Live> {
    live.range_mut(..=at)
        .next_back()
        .filter(|(&start, r)| at + len <= start + r.len)
        .map(|(_, r)| r)
}

/// Notes that the read cache serves `data` (when it lies in a region of
/// these buffers): from then on [`fix`] may hand its region's pages to
/// the kernel by reference.
pub fn cached(data: &[u8]) {
    if let Some(r) = live_of(&mut lock(&LIVE), data.as_ptr() as usize, data.len()) {
        r.cached = true;
    }
}

/// Whether `data` lies in a region whose data the read cache serves
/// again ([`cached`]): a candidate for [`fix`].
pub fn is_cached(data: &[u8]) -> bool {
    live_of(&mut lock(&LIVE), data.as_ptr() as usize, data.len()).is_some_and(|r| r.cached)
}

/// Whether `data` lies in a region that [`fix`] marked.
pub fn is_fixed(data: &[u8]) -> bool {
    live_of(&mut lock(&LIVE), data.as_ptr() as usize, data.len()).is_some_and(|r| r.fixed)
}

/// Marks the memory of `data`, when it lies in a region whose data the
/// read cache serves ([`cached`]), as memory the kernel may keep
/// referring to after the last buffer of its region is gone: the region
/// is then unmapped, never used again for new data. True when it is so,
/// and `data` may go to a socket by reference; false for any other
/// memory, which stays as it was.
///
/// A reply that hands pages to a socket by reference (`vmsplice`)
/// instead of copying them leaves them to the kernel until the client
/// has read them, long after the reply has left the server's hands; a
/// region used again meanwhile would change what the client reads.
/// Buffers are filled once and never written after, and the cache holds
/// data of one version of a file (a change drops it, never writes into
/// it). Only cached regions are fixed, so that regions whose data is
/// sent once (a cold stream larger than the cache) are used again, as
/// ever.
pub fn fix(data: &[u8]) -> bool {
    match live_of(&mut lock(&LIVE), data.as_ptr() as usize, data.len()) {
        Some(r) if r.cached => {
            r.fixed = true;
            true
        }
        _ => false,
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
            let fixed = lock(&LIVE)
                .remove(&(m.ptr.as_ptr() as usize))
                .is_some_and(|r| r.fixed);
            if fixed {
                // Its pages may still be referred to by a socket: they go
                // with the mapping, and new data gets new memory.
                FIXED_UNMAPPED.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if m.len == REGION {
                let mut free = lock(&FREE);
                if free.huge.len() + free.plain.len() < KEEP_FREE.load(Ordering::Relaxed) {
                    if m.huge {
                        free.huge.push(m);
                    } else {
                        free.plain.push(m);
                    }
                }
            }
        }
    }
}

/// Freed regions kept for reuse, huge ones apart from ordinary ones.
struct Free {
    huge: Vec<Mapping>,
    plain: Vec<Mapping>,
}

static FREE: Mutex<Free> = Mutex::new(Free {
    huge: Vec::new(),
    plain: Vec::new(),
});
/// Huge regions the filler made that no buffer has used yet.
static STOCK: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());
/// Regions the filler keeps in [`STOCK`] at most (32 MiB).
const STOCK_MAX: usize = 16;
/// Huge regions alive, in use or not.
static HUGE_ALIVE: AtomicUsize = AtomicUsize::new(0);
/// Fixed regions unmapped when their last buffer went (see [`fix`]).
static FIXED_UNMAPPED: AtomicU64 = AtomicU64::new(0);

/// Regions that [`fix`] kept from being used again, unmapped so far.
pub fn fixed_unmapped() -> u64 {
    FIXED_UNMAPPED.load(Ordering::Relaxed)
}
/// Set when a read wanted a huge region that was not there; the filler
/// waits for it.
static WANTED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Whether the filler makes another huge region for its stock: while the
/// stock is short and the huge regions alive fit in what is kept for
/// reuse plus the stock.
fn fill_more(stock: usize, alive: usize, keep_free: usize) -> bool {
    stock < STOCK_MAX && alive < keep_free.saturating_add(STOCK_MAX)
}

/// Tells the filler that a read found no huge region to reuse (starting
/// it the first time).
fn want_more() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("sluice-hugefill".into())
            .spawn(|| {
                // The server's identity, whatever the starter's.
                crate::cred::reclaim();
                filler()
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to make huge pages: O_DIRECT buffers use ordinary pages");
        }
    });
    *lock(&WANTED.0) = true;
    WANTED.1.notify_one();
}

/// Whenever reads have wanted huge regions: fills the stock, then turns
/// the ordinary regions kept for reuse into huge ones, only while the
/// server reads nothing ([`QUIET`]). Measured on the benchmark machine: a
/// cold stream with new huge pages filled beside it ran at 0.5-0.65 GB/s
/// against 1.4-2.1 GB/s without.
fn filler() {
    loop {
        {
            let mut wanted = lock(&WANTED.0);
            while !*wanted {
                wanted = WANTED.1.wait(wanted).unwrap_or_else(|e| e.into_inner());
            }
            *wanted = false;
        }
        loop {
            let since = since_busy();
            if since < QUIET {
                std::thread::sleep(QUIET - since);
                continue;
            }
            let go = || since_busy() >= QUIET;
            if fill_stock(go) && make_free_huge(go) {
                break;
            }
        }
    }
}

/// How long the server must have read nothing before the filler works.
const QUIET: Duration = Duration::from_millis(100);

/// When a read last began, in milliseconds since [`EPOCH`].
static BUSY_AT: AtomicU64 = AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Notes that the server is reading or writing, which keeps the filler
/// away for a while.
pub fn busy() {
    BUSY_AT.store(now_ms(), Ordering::Relaxed);
}

fn since_busy() -> Duration {
    Duration::from_millis(now_ms().saturating_sub(BUSY_AT.load(Ordering::Relaxed)))
}

/// Fills the stock while `go` says so: true once there is nothing more to
/// make, false when `go` stopped it first.
fn fill_stock(go: impl Fn() -> bool) -> bool {
    let more = |stocked| {
        fill_more(
            stocked,
            HUGE_ALIVE.load(Ordering::Relaxed),
            KEEP_FREE.load(Ordering::Relaxed),
        )
    };
    fill_into(&STOCK, more, go)
}

/// [`fill_stock`] into `stock`, while `more` says so of its length.
fn fill_into(
    stock: &Mutex<Vec<Mapping>>,
    more: impl Fn(usize) -> bool,
    go: impl Fn() -> bool,
) -> bool {
    while more(lock(stock).len()) {
        if !go() {
            return false;
        }
        match Mapping::new(REGION, true) {
            Ok(m) => lock(stock).push(m),
            Err(_) => return true,
        }
    }
    true
}

/// Turns the ordinary regions kept for reuse into huge ones while `go`
/// says so: true once none is left, false when `go` stopped it first.
fn make_free_huge(go: impl Fn() -> bool) -> bool {
    make_huge(&FREE, go)
}

/// [`make_free_huge`] on the regions `free` keeps.
fn make_huge(free: &Mutex<Free>, go: impl Fn() -> bool) -> bool {
    loop {
        if !go() {
            return false;
        }
        let Some(plain) = lock(free).plain.pop() else {
            return true;
        };
        drop(plain);
        match Mapping::new(REGION, true) {
            Ok(m) => lock(free).huge.push(m),
            Err(_) => return true,
        }
    }
}

/// Turns the ordinary regions kept for reuse into huge ones now, where new
/// huge pages are slow to fill (elsewhere they are huge already), and
/// returns how many: for a server about to be measured cold (after its
/// read cache was emptied), which should not wait for an idle moment.
pub fn settle() -> usize {
    if HUGE.load(Ordering::Relaxed) {
        return 0;
    }
    let before = lock(&FREE).plain.len();
    make_free_huge(|| true);
    // Others may have freed ordinary regions meanwhile: a count to log.
    before.saturating_sub(lock(&FREE).plain.len())
}

/// A region for new buffers: a huge one freed before, else (while huge
/// pages fill fast) a new huge one, else one from the filler's stock, else
/// an ordinary one freed before, else a new ordinary one.
fn new_region() -> io::Result<Mapping> {
    if let Some(m) = lock(&FREE).huge.pop() {
        return Ok(m);
    }
    let huge = HUGE.load(Ordering::Relaxed);
    if !huge {
        want_more();
        if let Some(m) = lock(&STOCK).pop() {
            return Ok(m);
        }
    }
    let plain = lock(&FREE).plain.pop();
    match plain {
        Some(m) => Ok(m),
        None => Mapping::new(REGION, huge),
    }
}
/// The region buffers are being cut from, and how much of it is taken.
static CURRENT: Mutex<Option<(Arc<Region>, usize)>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer being filled: `cap` bytes at `off` in its region, which no
/// other buffer uses.
pub struct Buf {
    region: Arc<Region>,
    off: usize,
    cap: usize,
}

impl Buf {
    /// A buffer of at least `len` bytes (rounded up to 4 KiB), starting
    /// on a 4 KiB boundary.
    pub fn new(len: usize) -> io::Result<Buf> {
        let cap = len.max(1).next_multiple_of(ALIGN);
        if cap > REGION {
            let map = Mapping::new(cap.next_multiple_of(REGION), HUGE.load(Ordering::Relaxed))?;
            let region = Arc::new(Region::new(map));
            return Ok(Buf {
                region,
                off: 0,
                cap,
            });
        }
        let mut cur = lock(&CURRENT);
        if let Some((region, used)) = cur.as_mut() {
            if REGION - *used >= cap {
                let off = *used;
                *used += cap;
                return Ok(Buf {
                    region: region.clone(),
                    off,
                    cap,
                });
            }
        }
        let map = new_region()?;
        let region = Arc::new(Region::new(map));
        *cur = Some((region.clone(), cap));
        Ok(Buf {
            region,
            off: 0,
            cap,
        })
    }

    /// The buffer's bytes: `cap` of them, for the kernel to write into.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `off + cap` lies within the region (checked in `new`).
        unsafe { self.region.ptr().add(self.off) }
    }

    /// Its size.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The first `len` bytes, which the caller has filled, as shared
    /// bytes that keep the region alive.
    pub fn freeze(self, len: usize) -> Bytes {
        assert!(len <= self.cap, "more than the buffer holds");
        Bytes::from_owner(Filled {
            region: self.region,
            off: self.off,
            len,
        })
    }
}

/// A filled buffer, read-only from now on.
struct Filled {
    region: Arc<Region>,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range was this buffer's alone and was filled before
        // `freeze`; nothing writes to it any more, and the region lives as
        // long as `self.region`.
        unsafe { std::slice::from_raw_parts(self.region.ptr().add(self.off), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(len: usize, byte: u8) -> Bytes {
        let mut b = Buf::new(len).unwrap();
        assert!(b.capacity() >= len);
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
        // SAFETY: within the buffer's capacity.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), byte, len) };
        b.freeze(len)
    }

    #[test]
    fn buffers_are_aligned_disjoint_and_keep_their_bytes() {
        let bufs: Vec<Bytes> = (0..9u8)
            .map(|i| fill((i as usize + 1) * 300_000, i))
            .collect();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(b.len(), (i + 1) * 300_000);
            assert!(
                b.iter().all(|&x| x == i as u8),
                "buffer {i} was overwritten"
            );
        }
        // Slices share the buffer.
        let s = bufs[3].slice(10..20);
        drop(bufs);
        assert_eq!(&s[..], &[3u8; 10]);
    }

    #[test]
    fn huge_pages_stop_after_a_run_of_slow_fills() {
        assert!(!too_slow(0));
        assert!(!too_slow(SLOW_LIMIT - 1));
        assert!(too_slow(SLOW_LIMIT));
    }

    #[test]
    fn the_filler_stops_at_its_stock_and_at_the_regions_kept() {
        assert!(fill_more(0, 0, 32));
        assert!(!fill_more(STOCK_MAX, 0, 32));
        assert!(fill_more(STOCK_MAX - 1, 32 + STOCK_MAX - 1, 32));
        assert!(!fill_more(0, 32 + STOCK_MAX, 32));
        // Nothing kept for reuse: the stock alone.
        assert!(!fill_more(0, STOCK_MAX, 0));
    }

    #[test]
    fn the_filler_makes_huge_regions_that_are_counted_while_alive() {
        // A stock of its own: the filler thread may be at work on the
        // shared one in this process.
        let stock = Mutex::new(Vec::new());
        assert!(!fill_into(&stock, |n| n < 3, || false));
        assert!(lock(&stock).is_empty(), "stopped before the first region");
        assert!(fill_into(&stock, |n| n < 3, || true));
        let stocked: Vec<Mapping> = std::mem::take(&mut *lock(&stock));
        assert_eq!(stocked.len(), 3);
        assert!(stocked.iter().all(|m| m.huge && m.len == REGION));
        assert_eq!(stocked[0].ptr.as_ptr() as usize % REGION, 0);
        assert!(HUGE_ALIVE.load(Ordering::Relaxed) >= stocked.len());
        // Written and read back through a buffer of its region.
        let bytes = whole_region(stocked.into_iter().next().unwrap(), 9);
        assert!(bytes.iter().all(|&x| x == 9));
    }

    /// One buffer over all of a new region of `map`, filled with `byte`.
    fn whole_region(map: Mapping, byte: u8) -> Bytes {
        let mut b = Buf {
            region: Arc::new(Region::new(map)),
            off: 0,
            cap: REGION,
        };
        // SAFETY: within the buffer's capacity.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), byte, REGION) };
        b.freeze(REGION)
    }

    /// A region that [`fix`] marked is unmapped when its last buffer goes,
    /// never kept for new data: the kernel may still hold its pages.
    /// Only memory of a live region that the cache serves can be fixed,
    /// and only within it.
    #[test]
    fn fixed_regions_are_never_used_again() {
        let bytes = whole_region(Mapping::new(REGION, false).unwrap(), 5);
        let start = bytes.as_ptr() as usize;
        let half = bytes.slice(REGION / 2..);
        assert!(!fix(&half), "fixed before the cache served it");
        cached(&half);
        assert!(fix(&half) && fix(&bytes.slice(..4096)));
        // Memory that is no region's, or not all of it: never fixed.
        let heap = vec![1u8; 1 << 20];
        cached(&heap);
        assert!(!fix(&heap));
        assert!(live_of(&mut lock(&LIVE), start + REGION - 1, 2).is_none());
        let unmapped = fixed_unmapped();
        drop(half);
        drop(bytes);
        assert!(fixed_unmapped() > unmapped, "the region was not unmapped");
        assert!(
            !lock(&LIVE).contains_key(&start),
            "a dropped region is still counted alive"
        );
        let free = lock(&FREE);
        assert!(
            free.plain
                .iter()
                .chain(&free.huge)
                .all(|m| m.ptr.as_ptr() as usize != start),
            "a fixed region was kept for new data"
        );
    }

    #[test]
    fn ordinary_regions_kept_for_reuse_become_huge() {
        let free = Mutex::new(Free {
            huge: Vec::new(),
            plain: (0..3)
                .map(|_| Mapping::new(REGION, false).unwrap())
                .collect(),
        });
        assert!(!make_huge(&free, || false));
        assert_eq!(lock(&free).plain.len(), 3, "stopped before the first");
        assert!(make_huge(&free, || true));
        let free = lock(&free);
        assert!(free.plain.is_empty());
        assert_eq!(free.huge.len(), 3);
        assert!(free.huge.iter().all(|m| m.huge && m.len == REGION));
    }

    #[test]
    fn large_buffers_get_their_own_region() {
        let b = fill(REGION + 5, 7);
        assert_eq!(b.len(), REGION + 5);
        assert!(b.iter().all(|&x| x == 7));
    }

    #[test]
    fn one_mib_buffers_pair_up_in_a_region_and_regions_are_reused() {
        let a = fill(1 << 20, 1);
        let b = fill(1 << 20, 2);
        // Two 1 MiB buffers share a region unless another test took part
        // of it in between; either way they are 4 KiB-aligned and apart.
        let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
        assert!(pa.abs_diff(pb) >= 1 << 20);
        drop((a, b));
        let c = fill(1 << 20, 3);
        assert!(c.iter().all(|&x| x == 3));
    }
}
