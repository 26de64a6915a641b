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
    fn ptr(&self) -> *mut u8 {
        self.map
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.ptr.as_ptr())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
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
            .spawn(filler);
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
            let region = Arc::new(Region { map: Some(map) });
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
        let region = Arc::new(Region { map: Some(map) });
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
        let region = Arc::new(Region {
            map: stocked.into_iter().next(),
        });
        let mut b = Buf {
            region,
            off: 0,
            cap: REGION,
        };
        // SAFETY: within the buffer's capacity.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), 9, REGION) };
        let bytes = b.freeze(REGION);
        assert!(bytes.iter().all(|&x| x == 9));
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
