//! Server-side readahead: per-stream sequential detection and an
//! asynchronous window of page-cache reads kept ahead of the reader.
//!
//! A *stream* is one reader of one file: the caller names it by the file
//! and a stream id (for NFS, the open). Several sequential readers can
//! share a stream id (parallel readers through one open); each is tracked
//! on its own. Requests may arrive out of order, as they do when a client
//! keeps many READs in flight: a request counts as sequential when it
//! lands near the highest offset the stream has read so far.
//!
//! On a sequential stream the window starts at [`Config::initial`], doubles
//! with every request that stays sequential, up to [`Config::max`], and is
//! refilled when less than half of it lies ahead of the reader. The window
//! is read into the page cache by a background worker with `readahead(2)`,
//! which submits the whole range at once and returns without waiting for
//! the disk, so no request is ever held back while somebody waits. A random
//! request resets the stream and issues nothing, and the kernel's own
//! readahead is switched off on the descriptors this engine sees
//! (`POSIX_FADV_RANDOM`), so random reads are not amplified.
//!
//! A sequential reader that keeps several large requests in flight and
//! finds its data not cached is served past the page cache instead
//! ([`Access::direct`]): reading straight into the reply's buffer saves
//! the page cache's allocation and copy, which limit a cold buffered
//! stream well below the device's rate. Its window is not read into the
//! page cache but handed back to the caller ([`Access::ahead`]), to be
//! read the same way into the server's own cache (see `engine::ahead`).

use crate::mapped::Mapping;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The file a stream reads: (device, inode).
pub type FileId = (u64, u64);

/// Readahead settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// First window of a stream that turned sequential.
    pub initial: u64,
    /// Largest window; 0 switches server readahead off.
    pub max: u64,
    /// Smallest request of a sequential reader that may be read past the
    /// page cache (see [`Access::direct`]); 0 never does.
    pub direct_min: u64,
    /// Keep a window ahead of readers that read past the page cache too
    /// ([`Access::ahead`]); off when there is no cache to read it into.
    pub direct_ahead: bool,
    /// Smallest read of cached data that is lent to the reply from a
    /// mapping of the file instead of copied (see [`crate::mapped`]); 0
    /// never is.
    pub lend_min: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            initial: 512 * 1024,
            max: 16 * 1024 * 1024,
            direct_min: 256 * 1024,
            direct_ahead: true,
            lend_min: 64 * 1024,
        }
    }
}

/// Counters, read by the metrics endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes handed to the readahead worker.
    pub issued_bytes: AtomicU64,
    /// Readahead requests dropped because the worker's queue was full.
    pub dropped: AtomicU64,
    /// Bytes read ahead that no request reached before the stream moved
    /// elsewhere or was forgotten.
    pub wasted_bytes: AtomicU64,
    /// Reads on a sequential stream served wholly from the page cache.
    pub hits: AtomicU64,
    /// Reads on a sequential stream that had to wait for the disk.
    pub misses: AtomicU64,
    /// Bytes read past the page cache for sequential readers.
    pub direct_bytes: AtomicU64,
    /// Bytes of cached data lent to replies from mappings of files
    /// instead of copied (see [`crate::mapped`]).
    pub lent_bytes: AtomicU64,
    /// Mappings of files made to lend from (see [`Readahead::mapping`]).
    pub mappings: AtomicU64,
}

/// What [`Readahead::access`] or [`Readahead::begin`] found out about one
/// request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The request continues a sequential stream.
    pub sequential: bool,
    /// Bytes of readahead this request started.
    pub issued: u64,
    /// Read this request past the page cache (O_DIRECT): it is large and
    /// aligned, continues a sequential reader with other requests in
    /// flight, and its data is not cached.
    pub direct: bool,
    /// The request belongs to a reader that reads past the page cache:
    /// whatever it reads is worth keeping in the server's own cache,
    /// where the reader's next pass will look.
    pub keep: bool,
    /// For such a reader: the part of its window to read ahead now, past
    /// the page cache, in pieces of the request's size (start, end).
    pub ahead: Option<(u64, u64)>,
    /// The reader counting this request in flight until
    /// [`Readahead::record`]: (file, stream, reader).
    inflight: Option<(FileId, u64, u64)>,
}

/// Streams per (file, stream id): parallel sequential readers of one open.
const READERS_PER_STREAM: usize = 8;
/// Streams remembered in all; the least recently used is forgotten first.
const MAX_STREAMS: usize = 4096;
/// Requests in a row near each other before readahead starts: a random
/// request that happens to land near another is not a stream, and two in
/// a row by chance are rare enough not to matter.
const SEQ_THRESHOLD: u32 = 3;
/// Readahead requests waiting for the worker at most.
const QUEUE: usize = 256;
/// The worker hands the kernel at most this much in one call (the unit the
/// kernel itself splits forced readahead into), so a large window of one
/// stream does not delay the start of another's.
const CHUNK: u64 = 2 * 1024 * 1024;

#[derive(Debug, Clone)]
struct Reader {
    /// Highest end offset requested.
    hi: u64,
    /// Readahead issued up to here.
    ra_end: u64,
    /// Current window; 0 before the stream turned sequential.
    window: u64,
    /// Sequential requests in a row.
    run: u32,
    /// Last use, for forgetting.
    tick: u64,
    /// Requests begun and not yet recorded.
    inflight: u32,
    /// Requests announced by [`Readahead::queued`] and not yet begun.
    queued: u32,
    /// Names the reader while its requests are in flight.
    id: u64,
    /// Its data is read past the page cache, and so is its window
    /// ([`Access::ahead`]): no page-cache readahead for it.
    direct: bool,
}

impl Reader {
    fn new(end: u64, tick: u64) -> Self {
        Reader {
            hi: end,
            ra_end: end,
            window: 0,
            run: 1,
            tick,
            inflight: 0,
            queued: 0,
            id: tick,
            direct: false,
        }
    }

    /// Read-ahead bytes nobody asked for.
    fn unused(&self) -> u64 {
        self.ra_end.saturating_sub(self.hi)
    }
}

#[derive(Debug, Default)]
struct Table {
    streams: HashMap<(FileId, u64), Vec<Reader>>,
    /// O_DIRECT descriptors of streams that read past the page cache,
    /// kept while the stream is.
    direct_fds: HashMap<(FileId, u64), Arc<OwnedFd>>,
    /// Mappings of the file that streams' cached reads are lent from,
    /// kept while the stream is.
    maps: HashMap<(FileId, u64), Arc<Mapping>>,
    /// The longest mapping of each file that a stream (or a reply) still
    /// holds, for its other streams to share (see [`Table::shared_map`]).
    shared: HashMap<FileId, Weak<Mapping>>,
    /// Mappings that forgotten streams let go of, oldest first, kept for
    /// a while for the next stream of their file (see [`Idle`]).
    idle: Vec<Idle>,
    tick: u64,
}

/// A mapping no stream uses, kept for the file's next stream: a client
/// that opens a file again (NFSv4: a stream per open) would otherwise map
/// it anew, and fault every page of it in again as the socket copies
/// them (one fault per 16 pages of small folios: 12,000 for a 1 GiB
/// file, a fifth to a quarter of the server's CPU per READ of a warm
/// pass).
#[derive(Debug)]
struct Idle {
    file: FileId,
    map: Arc<Mapping>,
    since: std::time::Instant,
}

/// Idle mappings kept at most.
const IDLE_MAPS: usize = 16;
/// A new mapping covers the whole file up to this size (beyond it, up to
/// the read that asked for it), so that the file's streams map it once,
/// not again each time a read lands past what was mapped. Only the
/// pages the socket copies get page tables; this bounds the address
/// space that the streams' mappings take (4,096 streams of different
/// files: 64 TiB).
pub const MAP_WHOLE_MAX: u64 = 16 << 30;
/// How long an idle mapping is kept (a file removed by a local process
/// keeps its blocks as long as a mapping of it lives).
pub const IDLE_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Table {
    /// Keeps `map`, which a stream of `file` let go of, for the file's
    /// next stream; returns what it pushes out, to be unmapped outside
    /// the table's lock.
    fn park(&mut self, file: FileId, map: Arc<Mapping>) -> Vec<Arc<Mapping>> {
        let mut out = Vec::new();
        if let Some(i) = self.idle.iter().position(|x| x.file == file) {
            out.push(self.idle.remove(i).map);
        }
        self.idle.push(Idle {
            file,
            map,
            since: std::time::Instant::now(),
        });
        while self.idle.len() > IDLE_MAPS {
            out.push(self.idle.remove(0).map);
        }
        out
    }

    /// The mapping of `file` that another of its streams (or an idle one,
    /// or a reply) holds, when it reaches `end`. Many clients reading one
    /// file at random (a stream each) would otherwise each map it, and
    /// each fault every page it lends in again: at 256 connections of 1
    /// MiB READs, the faults and the unmapping took 8.6% of the server's
    /// CPU.
    fn shared_map(&mut self, file: FileId, end: u64) -> Option<Arc<Mapping>> {
        match self.shared.get(&file).map(Weak::upgrade) {
            Some(Some(m)) => (m.len() >= end).then_some(m),
            Some(None) => {
                self.shared.remove(&file);
                None
            }
            None => None,
        }
    }

    /// Offers `m` to the other streams of `file`, unless the one offered
    /// already is as long.
    fn share(&mut self, file: FileId, m: &Arc<Mapping>) {
        let longer = self
            .shared
            .get(&file)
            .and_then(Weak::upgrade)
            .is_some_and(|o| o.len() >= m.len());
        if !longer {
            self.shared.insert(file, Arc::downgrade(m));
        }
    }
}

struct Job {
    fd: Arc<OwnedFd>,
    offset: u64,
    len: u64,
}

/// What the worker is sent: a range to read, or a request to say when
/// everything sent before it is done.
enum Work {
    Read(Job),
    Settle(SyncSender<()>),
}

/// The readahead engine: stream table and background worker.
pub struct Readahead {
    config: Config,
    table: Mutex<Table>,
    worker: Option<SyncSender<Work>>,
    /// Counters.
    pub stats: Arc<Stats>,
}

impl std::fmt::Debug for Readahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readahead")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Readahead {
    /// A readahead engine with its worker thread (none when `config.max`
    /// is 0).
    pub fn new(config: Config) -> Self {
        let stats = Arc::new(Stats::default());
        let worker = (config.max > 0).then(|| {
            let (tx, rx) = mpsc::sync_channel::<Work>(QUEUE);
            std::thread::Builder::new()
                .name("sluice-readahead".into())
                .spawn(move || {
                    // The server's identity, whatever the starter's.
                    crate::cred::reclaim();
                    while let Ok(work) = rx.recv() {
                        match work {
                            Work::Read(job) => prefetch(&job),
                            Work::Settle(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                })
                .map(|_| tx)
                .map_err(|e| tracing::warn!(error = %e, "no readahead worker: readahead is off"))
                .ok()
        });
        Readahead {
            config,
            table: Mutex::new(Table::default()),
            worker: worker.flatten(),
            stats,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Returns once the worker has issued every read queued before the
    /// call: a caller that then drops a file's pages from the page cache
    /// knows no readahead of this engine's brings them back.
    pub fn settle(&self) {
        let Some(tx) = &self.worker else {
            return;
        };
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if tx.send(Work::Settle(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a read of `len` bytes at `offset` of `file` (of `size`
    /// bytes) by stream `stream` through `fd` that has been served already,
    /// and starts readahead when the stream is sequential and its window
    /// needs refilling.
    pub fn access(
        &self,
        file: FileId,
        stream: u64,
        fd: &Arc<OwnedFd>,
        offset: u64,
        len: u64,
        size: u64,
    ) -> Access {
        self.note(file, stream, fd, offset, len, size, Phase::Served)
    }

    /// Like [`Readahead::access`] for a read served from the server's own
    /// cache of data read past the page cache: the reader is one that
    /// reads past the page cache, whose window is handed back in
    /// [`Access::ahead`] (no page-cache readahead).
    pub fn access_own_cache(
        &self,
        file: FileId,
        stream: u64,
        fd: &Arc<OwnedFd>,
        offset: u64,
        len: u64,
        size: u64,
    ) -> Access {
        self.note(file, stream, fd, offset, len, size, Phase::OwnCache)
    }

    /// Like [`Readahead::access`] for a read about to be served, whose data
    /// is `uncached` (not all in the page cache): the request counts as in
    /// flight until it is passed to [`Readahead::record`], and the answer
    /// says whether to read it past the page cache.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &self,
        file: FileId,
        stream: u64,
        fd: &Arc<OwnedFd>,
        offset: u64,
        len: u64,
        size: u64,
        uncached: bool,
    ) -> Access {
        self.note(
            file,
            stream,
            fd,
            offset,
            len,
            size,
            Phase::Begin { uncached },
        )
    }

    /// Announces a request that [`Readahead::begin`] will see shortly, for
    /// its reader's count of requests on their way: a client with several
    /// in flight sends them back to back, and they are announced as they
    /// arrive, before any has been served.
    pub fn queued(&self, file: FileId, stream: u64, fd: &Arc<OwnedFd>, offset: u64, len: u64) {
        self.note(file, stream, fd, offset, len, u64::MAX, Phase::Queued);
    }

    /// Whether a request of `len` bytes at `offset` is one that
    /// [`Readahead::begin`] may send past the page cache (when it finds the
    /// reader and the cache as that needs): worth asking the page cache.
    pub fn direct_candidate(&self, offset: u64, len: u64) -> bool {
        self.config.max > 0
            && self.config.direct_min > 0
            && len >= self.config.direct_min
            && offset.is_multiple_of(crate::fs::DIRECT_ALIGN as u64)
    }

    #[allow(clippy::too_many_arguments)]
    fn note(
        &self,
        file: FileId,
        stream: u64,
        fd: &Arc<OwnedFd>,
        offset: u64,
        len: u64,
        size: u64,
        phase: Phase,
    ) -> Access {
        let begin = match phase {
            Phase::Begin { uncached } => Some(uncached),
            _ => None,
        };
        let end = offset.saturating_add(len);
        let mut job = None;
        let access = {
            let mut t = self.lock();
            t.tick += 1;
            let tick = t.tick;
            if !t.streams.contains_key(&(file, stream)) {
                if t.streams.len() >= MAX_STREAMS {
                    self.forget_oldest(&mut t);
                }
                if self.config.max > 0 {
                    // This engine does all readahead for the descriptor: the
                    // kernel's own heuristics would read more than asked on
                    // random requests that happen to land side by side.
                    // SAFETY: valid descriptor; no memory arguments.
                    unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
                }
            }
            let readers = t.streams.entry((file, stream)).or_default();
            // The reader this request continues: the nearest one whose
            // reach covers the offset.
            let found = readers
                .iter_mut()
                .filter(|r| near(r, offset, len))
                .min_by_key(|r| r.hi.abs_diff(offset));
            let mut result = Access {
                sequential: false,
                issued: 0,
                direct: false,
                keep: false,
                ahead: None,
                inflight: None,
            };
            match found {
                Some(r) if phase == Phase::Queued => {
                    r.tick = tick;
                    r.queued = r.queued.saturating_add(1);
                }
                Some(r) => {
                    r.tick = tick;
                    r.run = r.run.saturating_add(1);
                    r.hi = r.hi.max(end);
                    if begin.is_some() {
                        // This request is no longer only announced.
                        r.queued = r.queued.saturating_sub(1);
                        r.inflight = r.inflight.saturating_add(1);
                        result.inflight = Some((file, stream, r.id));
                    }
                    if r.run >= SEQ_THRESHOLD && self.config.max > 0 {
                        result.sequential = true;
                        // A cold reader with another request on its way goes
                        // past the page cache. Once direct, it stays so (no
                        // page-cache readahead fills the cache ahead of it
                        // any more: its window is read past it too).
                        result.direct = begin == Some(true)
                            && (r.direct || r.inflight + r.queued >= 2)
                            && self.direct_candidate(offset, len);
                        r.direct |= result.direct
                            || (phase == Phase::OwnCache && self.direct_candidate(offset, len));
                        result.keep = r.direct;
                        r.window = if r.window == 0 {
                            // Small requests start with a small window.
                            len.saturating_mul(4)
                                .clamp(128 * 1024, self.config.initial.max(len.saturating_mul(2)))
                        } else {
                            r.window.saturating_mul(2)
                        }
                        .min(self.config.max.max(len));
                        let target = r.hi.saturating_add(r.window).min(size);
                        // Refill once less than half the window lies ahead.
                        // A reader past the page cache has its window read
                        // by the caller, into the server's cache.
                        let refill = r.ra_end < target
                            && r.ra_end.saturating_sub(r.hi) < r.window / 2
                            && (!r.direct || self.config.direct_ahead);
                        if refill {
                            let from = r.ra_end.max(r.hi);
                            if target > from && r.direct {
                                result.ahead = Some((from, target));
                            } else if target > from {
                                job = Some((from, target - from));
                                result.issued = target - from;
                            }
                            r.ra_end = target;
                        }
                    }
                }
                None => {
                    // A new reader, or a random request: start over here.
                    if readers.len() >= READERS_PER_STREAM {
                        let (i, _) = readers
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, r)| r.tick)
                            .expect("a full list is not empty");
                        let old = readers.swap_remove(i);
                        self.stats
                            .wasted_bytes
                            .fetch_add(old.unused(), Ordering::Relaxed);
                    }
                    let mut r = Reader::new(end, tick);
                    if offset == 0 {
                        // Reading from the start is the usual beginning of a
                        // stream: treat it as sequential at once, as the
                        // kernel does.
                        r.run = SEQ_THRESHOLD - 1;
                    }
                    if phase == Phase::Queued {
                        // Seen when it begins; until then only counted.
                        r.run -= 1;
                        r.queued = 1;
                    }
                    r.direct = phase == Phase::OwnCache && self.direct_candidate(offset, len);
                    if begin.is_some() {
                        r.inflight = 1;
                        result.inflight = Some((file, stream, r.id));
                    }
                    readers.push(r);
                }
            }
            result
        };
        if let Some((from, n)) = job {
            self.submit(fd, from, n);
        }
        access
    }

    fn forget_oldest(&self, t: &mut Table) {
        let Some(key) = t
            .streams
            .iter()
            .min_by_key(|(_, v)| v.iter().map(|r| r.tick).max().unwrap_or(0))
            .map(|(k, _)| *k)
        else {
            return;
        };
        t.direct_fds.remove(&key);
        if let Some(map) = t.maps.remove(&key) {
            // (Unmapped under the lock, rarely: one in 4096 streams.)
            drop(t.park(key.0, map));
        }
        if let Some(v) = t.streams.remove(&key) {
            let unused: u64 = v.iter().map(Reader::unused).sum();
            self.stats.wasted_bytes.fetch_add(unused, Ordering::Relaxed);
        }
    }

    /// Forgets one stream of `file` (its open was closed).
    pub fn forget_stream(&self, file: FileId, stream: u64) {
        let (removed, _fd, _pushed_out) = {
            let mut t = self.lock();
            let fd = t.direct_fds.remove(&(file, stream));
            let pushed_out = match t.maps.remove(&(file, stream)) {
                Some(map) => t.park(file, map),
                None => Vec::new(),
            };
            (t.streams.remove(&(file, stream)), fd, pushed_out)
        };
        // (The descriptor is closed and mappings unmapped once the table
        // is let go of.)
        if let Some(v) = removed {
            let unused: u64 = v.iter().map(Reader::unused).sum();
            self.stats.wasted_bytes.fetch_add(unused, Ordering::Relaxed);
        }
    }

    /// Lets go of what the streams of `file` keep open of it (O_DIRECT
    /// descriptors, mappings), so that a file removed by its name frees
    /// its space without waiting for its streams to be forgotten; a
    /// stream that reads again opens it again.
    pub fn forget_file(&self, file: FileId) {
        let (fds, maps, idle) = {
            let mut t = self.lock();
            if t.direct_fds.is_empty()
                && t.maps.is_empty()
                && t.idle.is_empty()
                && t.shared.is_empty()
            {
                return;
            }
            t.shared.remove(&file);
            let fds: Vec<_> = t.direct_fds.extract_if(|k, _| k.0 == file).collect();
            let maps: Vec<_> = t.maps.extract_if(|k, _| k.0 == file).collect();
            let idle: Vec<_> = t.idle.extract_if(.., |x| x.file == file).collect();
            (fds, maps, idle)
        };
        // Closed and unmapped outside the table's lock.
        drop((fds, maps, idle));
    }

    /// Unmaps the idle mappings kept longer than [`IDLE_FOR`] (the
    /// server calls it every second).
    pub fn expire_idle(&self) {
        self.expire_idle_after(IDLE_FOR)
    }

    fn expire_idle_after(&self, after: std::time::Duration) {
        let old: Vec<_> = {
            let mut t = self.lock();
            // What no stream, idle list or reply holds any more.
            t.shared.retain(|_, m| m.strong_count() > 0);
            if t.idle.is_empty() {
                return;
            }
            t.idle
                .extract_if(.., |x| x.since.elapsed() >= after)
                .collect()
        };
        drop(old);
    }

    /// The mapping of `file` that stream `stream` lends cached reads
    /// from, reaching at least to `end`: the stream's own; or one that
    /// another stream of the file, a reply, or the idle list holds
    /// ([`Idle`]); or made through `fd` on first use, or when the file
    /// grew past it, covering the file's `size` (up to
    /// [`MAP_WHOLE_MAX`]). Kept as long as the stream is.
    pub fn mapping(
        &self,
        file: FileId,
        stream: u64,
        fd: BorrowedFd<'_>,
        end: u64,
        size: u64,
    ) -> std::io::Result<Arc<Mapping>> {
        {
            let mut t = self.lock();
            if let Some(m) = t.maps.get(&(file, stream)) {
                if m.len() >= end {
                    return Ok(m.clone());
                }
            }
            let found = match t.shared_map(file, end) {
                Some(m) => Some(m),
                None => t
                    .idle
                    .iter()
                    .find(|x| x.file == file && x.map.len() >= end)
                    .map(|x| x.map.clone()),
            };
            if let Some(m) = found {
                if !t.streams.contains_key(&(file, stream)) {
                    // A stream's first read: lent from it, left where it is.
                    return Ok(m);
                }
                // Taken over: idle no more.
                let idle = t
                    .idle
                    .iter()
                    .position(|x| Arc::ptr_eq(&x.map, &m))
                    .map(|i| t.idle.remove(i));
                t.share(file, &m);
                let shorter = t.maps.insert((file, stream), m.clone());
                drop(t);
                drop((idle, shorter));
                return Ok(m);
            }
        }
        // Mapped without the table's lock; of two racing maps one is kept.
        let m = Arc::new(Mapping::new(fd, end.max(size.min(MAP_WHOLE_MAX)))?);
        self.stats.mappings.fetch_add(1, Ordering::Relaxed);
        let mut t = self.lock();
        t.share(file, &m);
        if !t.streams.contains_key(&(file, stream)) {
            // A stream's first read (or forgotten meanwhile): kept idle
            // for the file's next streams, which each read first too.
            let pushed_out = t.park(file, m.clone());
            drop(t);
            drop(pushed_out);
            return Ok(m);
        }
        let kept = t.maps.entry((file, stream)).or_insert_with(|| m.clone());
        let old = if kept.len() < end {
            Some(std::mem::replace(kept, m))
        } else {
            None
        };
        let kept = kept.clone();
        drop(t);
        // Unmapped (when nothing else holds it) outside the table's lock.
        drop(old);
        Ok(kept)
    }

    /// The O_DIRECT descriptor stream `stream` of `file` reads through,
    /// opened by `open` on first use and kept as long as the stream is.
    pub fn direct_fd(
        &self,
        file: FileId,
        stream: u64,
        open: impl FnOnce() -> std::io::Result<OwnedFd>,
    ) -> std::io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.lock().direct_fds.get(&(file, stream)) {
            return Ok(fd.clone());
        }
        // Opened without the table's lock; of two racing opens one is kept.
        let fd = Arc::new(open()?);
        let mut t = self.lock();
        if !t.streams.contains_key(&(file, stream)) {
            // Forgotten meanwhile: used once, not kept.
            return Ok(fd);
        }
        Ok(t.direct_fds.entry((file, stream)).or_insert(fd).clone())
    }

    /// Records whether a read of a sequential stream was served from the
    /// page cache (and, for one that [`Readahead::begin`] counted, that it is
    /// no longer in flight).
    pub fn record(&self, access: Access, cached: bool) {
        if let Some((file, stream, id)) = access.inflight {
            let mut t = self.lock();
            if let Some(r) = t
                .streams
                .get_mut(&(file, stream))
                .and_then(|v| v.iter_mut().find(|r| r.id == id))
            {
                r.inflight = r.inflight.saturating_sub(1);
            }
        }
        if !access.sequential {
            return;
        }
        let c = if cached {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn submit(&self, fd: &Arc<OwnedFd>, offset: u64, len: u64) {
        let Some(tx) = &self.worker else {
            return;
        };
        let job = Job {
            fd: fd.clone(),
            offset,
            len,
        };
        match tx.try_send(Work::Read(job)) {
            Ok(()) => {
                self.stats.issued_bytes.fetch_add(len, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where a request is when the engine hears of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Served from the page cache already.
    Served,
    /// Served from the server's own cache already.
    OwnCache,
    /// About to be served; its data is (not) all in the page cache.
    Begin { uncached: bool },
    /// Arrived, to be served elsewhere (see [`Readahead::queued`]).
    Queued,
}

/// True when a request at `offset` continues reader `r`: it starts within
/// reach of the highest offset read so far (behind it when requests arrive
/// out of order, or just past it when some are still on their way).
fn near(r: &Reader, offset: u64, len: u64) -> bool {
    let reach = len
        .saturating_mul(16)
        .max(r.window)
        .clamp(128 * 1024, 64 * 1024 * 1024);
    offset.saturating_add(reach) >= r.hi && offset <= r.hi.saturating_add(reach)
}

/// Reads a range into the page cache in chunks; the kernel submits each
/// chunk as large requests and returns without waiting for the data.
fn prefetch(job: &Job) {
    let mut off = job.offset;
    let end = job.offset.saturating_add(job.len);
    while off < end {
        let n = (end - off).min(CHUNK);
        // SAFETY: valid descriptor; readahead has no memory arguments.
        let r = unsafe { libc::readahead(job.fd.as_raw_fd(), off as i64, n as usize) };
        if r != 0 {
            // EINVAL for files that cannot read ahead (e.g. special
            // files): nothing to gain from retrying.
            return;
        }
        off += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    const MB: u64 = 1024 * 1024;

    fn fd() -> Arc<OwnedFd> {
        let mut f = crate::fs::scratch_file("ra");
        f.write_all(&[1u8; 4096]).unwrap();
        Arc::new(OwnedFd::from(f))
    }

    #[test]
    fn sequential_stream_grows_window_and_stays_ahead() {
        let ra = Readahead::new(Config {
            initial: 512 * 1024,
            max: 8 * MB,
            ..Config::default()
        });
        let fd = fd();
        let size = 1024 * MB;
        let mut issued_to = 0u64;
        let mut total = 0;
        for i in 0..64u64 {
            let a = ra.access((1, 1), 7, &fd, i * MB, MB, size);
            assert!(a.sequential || i == 0, "request {i} not sequential");
            total += a.issued;
            if a.issued > 0 {
                issued_to = issued_to.max((i + 1) * MB + a.issued);
            }
            // Readahead always covers the next request.
            if i > 0 {
                let t = ra.lock();
                let r = &t.streams[&((1, 1), 7)][0];
                assert!(r.ra_end >= (i + 2) * MB, "window fell behind at {i}");
                assert!(r.window <= 8 * MB);
            }
        }
        // Never more than one window read ahead of the reader.
        assert!(total <= 64 * MB + 8 * MB, "issued {total}");
        assert_eq!(ra.stats.issued_bytes.load(Ordering::Relaxed), total);
    }

    #[test]
    fn out_of_order_arrivals_stay_sequential() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        // Requests of 1 MiB, 8 in flight, arriving shuffled within a batch.
        let order = [1u64, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14];
        let mut seq = 0;
        for &i in &order {
            if ra.access((1, 2), 1, &fd, i * MB, MB, 64 * MB).sequential {
                seq += 1;
            }
        }
        assert!(seq >= order.len() - 2, "only {seq} sequential");
        assert_eq!(ra.lock().streams[&((1, 2), 1)].len(), 1);
    }

    #[test]
    fn random_reads_issue_nothing() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let mut x: u64 = 12345;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = ((x >> 20) % (1 << 17)) * 8192; // within 1 GiB
            ra.access((1, 3), 1, &fd, off, 8192, 1024 * MB);
        }
        let issued = ra.stats.issued_bytes.load(Ordering::Relaxed);
        assert!(
            issued <= 4 * MB,
            "random reads issued {issued} bytes of readahead"
        );
    }

    #[test]
    fn parallel_readers_of_one_stream_are_tracked_apart() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let starts = [0u64, 256 * MB, 512 * MB, 768 * MB];
        let mut seq = 0;
        for step in 0..16u64 {
            for s in starts {
                if ra
                    .access((1, 4), 1, &fd, s + step * MB, MB, 1024 * MB)
                    .sequential
                {
                    seq += 1;
                }
            }
        }
        assert!(seq >= 4 * 16 - 8, "only {seq} of 64 sequential");
        assert_eq!(ra.lock().streams[&((1, 4), 1)].len(), 4);
    }

    #[test]
    fn off_means_no_readahead() {
        let ra = Readahead::new(Config {
            initial: 0,
            max: 0,
            ..Config::default()
        });
        let fd = fd();
        for i in 0..16u64 {
            let a = ra.access((1, 5), 1, &fd, i * MB, MB, 64 * MB);
            assert_eq!(a.issued, 0);
            assert!(!a.sequential);
        }
    }

    #[test]
    fn abandoned_readahead_counts_as_wasted() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        for i in 0..8u64 {
            ra.access((1, 6), 1, &fd, i * MB, MB, 1024 * MB);
        }
        let issued = ra.stats.issued_bytes.load(Ordering::Relaxed);
        assert!(issued > 0);
        ra.forget_stream((1, 6), 1);
        let wasted = ra.stats.wasted_bytes.load(Ordering::Relaxed);
        assert!(
            wasted > 0 && wasted <= issued,
            "wasted {wasted} of {issued}"
        );
    }

    #[test]
    fn cold_readers_with_requests_in_flight_read_direct_and_stay_so() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let size = 1024 * MB;
        // Eight 1 MiB requests in flight, none answered yet.
        let first: Vec<Access> = (0..8u64)
            .map(|i| ra.begin((3, 1), 1, &fd, i * MB, MB, size, true))
            .collect();
        assert!(!first[0].direct, "a lone first request went direct");
        assert!(first[1..].iter().all(|a| a.direct), "{first:?}");
        // Direct requests issue no page-cache readahead: their window is
        // handed back, to be read past the page cache, end to end and
        // ahead of every request begun.
        assert_eq!(ra.stats.issued_bytes.load(Ordering::Relaxed), 0);
        let mut ahead_end = 0;
        for (i, a) in first.iter().enumerate() {
            if let Some((from, to)) = a.ahead {
                assert!(a.direct, "window handed back for a page-cache read");
                assert!(from >= (i as u64 + 1) * MB, "ahead of request {i}: {from}");
                assert!(
                    ahead_end == 0 || from == ahead_end,
                    "gap or overlap at {from}"
                );
                assert!(to > from && to <= (i as u64 + 1) * MB + 16 * MB);
                ahead_end = to;
            }
        }
        assert!(ahead_end >= 8 * MB, "window read ahead ends at {ahead_end}");
        for a in first {
            ra.record(a, false);
        }
        // Once direct, one request at a time stays direct.
        let a = ra.begin((3, 1), 1, &fd, 8 * MB, MB, size, true);
        assert!(a.direct);
        ra.record(a, false);
        // Cached data is never read past the cache, nor are small or
        // unaligned requests.
        assert!(!ra.begin((3, 1), 1, &fd, 9 * MB, MB, size, false).direct);
        assert!(
            !ra.begin((3, 1), 1, &fd, 10 * MB, 64 * 1024, size, true)
                .direct
        );
        assert!(
            !ra.begin((3, 1), 1, &fd, 11 * MB + 512, MB, size, true)
                .direct
        );
        assert_eq!(ra.stats.issued_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn one_request_at_a_time_keeps_page_cache_readahead() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        for i in 0..16u64 {
            ra.queued((3, 2), 1, &fd, i * MB, MB);
            let a = ra.begin((3, 2), 1, &fd, i * MB, MB, 1024 * MB, true);
            assert!(
                !a.direct,
                "request {i} went direct with nothing else in flight"
            );
            ra.record(a, false);
        }
        assert!(ra.stats.issued_bytes.load(Ordering::Relaxed) > 0);
        // In-flight counts went back to zero.
        assert!(ra.lock().streams[&((3, 2), 1)]
            .iter()
            .all(|r| r.inflight == 0));
    }

    #[test]
    fn requests_announced_together_count_as_in_flight() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        // Eight arrive back to back; the workers then serve them one after
        // another, so no two are ever begun at once.
        for i in 0..8u64 {
            ra.queued((3, 5), 1, &fd, i * MB, MB);
        }
        let mut direct = 0;
        for i in 0..8u64 {
            let a = ra.begin((3, 5), 1, &fd, i * MB, MB, 1024 * MB, true);
            direct += a.direct as u32;
            ra.record(a, false);
        }
        assert!(direct >= 6, "only {direct} of 8 direct");
        let t = ra.lock();
        let r = &t.streams[&((3, 5), 1)][0];
        assert_eq!((r.inflight, r.queued), (0, 0));
    }

    #[test]
    fn reads_from_the_own_cache_read_ahead_past_the_page_cache() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let mut ahead_end = 0;
        for i in 0..16u64 {
            let a = ra.access_own_cache((3, 3), 1, &fd, i * MB, MB, 1024 * MB);
            if let Some((from, to)) = a.ahead {
                assert!(from >= (i + 1) * MB && (ahead_end == 0 || from == ahead_end));
                ahead_end = to;
            }
        }
        // At least half of the largest window ahead (it is refilled once
        // less than that is left), none of it in the page cache.
        assert!((24 * MB..=32 * MB).contains(&ahead_end), "{ahead_end}");
        assert_eq!(ra.stats.issued_bytes.load(Ordering::Relaxed), 0);
        // Without a cache to read into, nothing is handed back.
        let off = Readahead::new(Config {
            direct_ahead: false,
            ..Config::default()
        });
        for i in 0..16u64 {
            let a = off.access_own_cache((3, 3), 1, &fd, i * MB, MB, 1024 * MB);
            assert_eq!(a.ahead, None);
        }
        assert_eq!(off.stats.issued_bytes.load(Ordering::Relaxed), 0);
        // Past the cached part the reader goes on direct.
        let a = ra.begin((3, 3), 1, &fd, 16 * MB, MB, 1024 * MB, true);
        assert!(a.direct);
    }

    #[test]
    fn direct_reads_off_means_never_direct() {
        let ra = Readahead::new(Config {
            direct_min: 0,
            ..Config::default()
        });
        let fd = fd();
        let all: Vec<Access> = (0..8u64)
            .map(|i| ra.begin((3, 4), 1, &fd, i * MB, MB, 1024 * MB, true))
            .collect();
        assert!(all.iter().all(|a| !a.direct));
        assert!(ra.stats.issued_bytes.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn stream_table_is_bounded() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        for i in 0..(MAX_STREAMS as u64 + 100) {
            ra.access((2, i), 1, &fd, 0, 8192, 1 << 30);
        }
        assert!(ra.lock().streams.len() <= MAX_STREAMS);
    }

    #[test]
    fn mappings_are_kept_with_their_streams_and_go_with_them_or_the_file() {
        use crate::mapped::MAP_STEP;
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let file = (3, 1);
        // No stream yet: mapped, and kept idle for the file's next
        // streams, whose first reads find it.
        let a = ra.mapping(file, 1, fd.as_fd(), 4096, 4096).expect("map");
        assert_eq!(Arc::strong_count(&a), 2, "the test's and the idle one");
        let b = ra.mapping(file, 9, fd.as_fd(), 4096, 4096).expect("map");
        assert!(Arc::ptr_eq(&a, &b));
        drop(b);
        ra.expire_idle_after(std::time::Duration::ZERO);
        assert_eq!(Arc::strong_count(&a), 1, "expired");
        drop(a);
        // Once the stream is known, kept and found again.
        ra.access(file, 1, &fd, 0, 4096, 4096);
        ra.access(file, 2, &fd, 0, 4096, 4096);
        let a = ra.mapping(file, 1, fd.as_fd(), 4096, 4096).expect("map");
        assert!(Arc::ptr_eq(
            &a,
            &ra.mapping(file, 1, fd.as_fd(), MAP_STEP, 4096).unwrap()
        ));
        assert_eq!(Arc::strong_count(&a), 2, "the test's and the stream's");
        // A read past it (the file grew) maps the file again, further.
        let longer = ra
            .mapping(file, 1, fd.as_fd(), MAP_STEP + 1, MAP_STEP + 1)
            .expect("map");
        assert_eq!(longer.len(), 2 * MAP_STEP);
        assert_eq!(Arc::strong_count(&a), 1, "replaced");
        assert_eq!(Arc::strong_count(&longer), 2);
        // The file's other stream shares it.
        let two = ra.mapping(file, 2, fd.as_fd(), 4096, 4096).expect("map");
        assert!(Arc::ptr_eq(&two, &longer));
        assert_eq!(
            Arc::strong_count(&longer),
            4,
            "the test's twice, each stream's"
        );
        drop(two);
        ra.forget_stream(file, 1);
        assert_eq!(
            Arc::strong_count(&longer),
            3,
            "stream 2's, and kept idle for the file's next stream"
        );
        ra.forget_stream(file, 2);
        assert_eq!(Arc::strong_count(&longer), 2, "idle once");
        // The file's next stream takes it over.
        ra.access(file, 3, &fd, 0, 4096, 4096);
        let other = ra.mapping(file, 3, fd.as_fd(), 4096, 4096).expect("map");
        assert!(Arc::ptr_eq(&other, &longer));
        drop(longer);
        assert_eq!(Arc::strong_count(&other), 2, "the test's and stream 3's");
        // The file's name removed: every stream of it lets go.
        ra.forget_file((3, 9));
        assert_eq!(Arc::strong_count(&other), 2, "another file's");
        ra.forget_file(file);
        assert_eq!(Arc::strong_count(&other), 1);
        assert!(ra.lock().shared.is_empty());
    }

    /// Many clients reading one file at random (a stream each) share one
    /// mapping of it, which covers the whole file from the first read:
    /// it is mapped, and its pages faulted in, once, not once per stream
    /// and again each time a read lands past what was mapped.
    #[test]
    fn random_readers_of_a_file_share_one_mapping_of_all_of_it() {
        use crate::mapped::MAP_STEP;
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let file = (5, 1);
        let size = 3 * MAP_STEP + 5;
        let streams: Vec<u64> = (1..=64).collect();
        for &s in &streams {
            ra.access(file, s, &fd, 0, 4096, size);
        }
        let first = ra.mapping(file, 1, fd.as_fd(), 4096, size).expect("map");
        assert_eq!(first.len(), 4 * MAP_STEP, "the whole file, in steps");
        for &s in &streams {
            // Reads anywhere in the file, the last byte's included.
            let end = 4096 + (s * 7919 * 4096) % (size - 4096);
            let m = ra.mapping(file, s, fd.as_fd(), end, size).expect("map");
            assert!(Arc::ptr_eq(&m, &first), "stream {s}, read ending at {end}");
            let last = ra.mapping(file, s, fd.as_fd(), size, size).expect("map");
            assert!(Arc::ptr_eq(&last, &first));
        }
        assert_eq!(Arc::strong_count(&first), 1 + streams.len());
        // Past MAP_WHOLE_MAX, only as far as the read.
        let huge = (5, 2);
        ra.access(huge, 1, &fd, 0, 4096, 4 * MAP_WHOLE_MAX);
        let m = ra
            .mapping(huge, 1, fd.as_fd(), MAP_WHOLE_MAX + 1, 4 * MAP_WHOLE_MAX)
            .expect("map");
        assert_eq!(m.len(), MAP_WHOLE_MAX + MAP_STEP);
        drop(m);
        // Gone with the streams and the idle list: nothing left to share.
        for &s in &streams {
            ra.forget_stream(file, s);
        }
        ra.forget_stream(huge, 1);
        drop(first);
        ra.expire_idle_after(std::time::Duration::ZERO);
        ra.expire_idle_after(std::time::Duration::ZERO);
        assert!(ra.lock().shared.is_empty());
    }

    /// A stream's mapping outlives it, for a while, for the next stream
    /// of the same file only: a new stream's first read lends from it
    /// and leaves it idle, a known stream takes it over; it goes with the
    /// file's name, after `IDLE_FOR`, or when `IDLE_MAPS` newer ones
    /// are kept.
    #[test]
    fn mappings_of_forgotten_streams_wait_for_the_file_s_next_stream() {
        let ra = Readahead::new(Config::default());
        let fd = fd();
        let kept = |ra: &Readahead, file: FileId, stream: u64| {
            ra.access(file, stream, &fd, 0, 4096, 4096);
            let m = ra
                .mapping(file, stream, fd.as_fd(), 4096, 4096)
                .expect("map");
            ra.forget_stream(file, stream);
            m
        };
        let file = (4, 1);
        let first = kept(&ra, file, 1);
        assert_eq!(Arc::strong_count(&first), 2, "the test's and the idle one");
        // Not another file's stream.
        let elsewhere = kept(&ra, (4, 2), 1);
        assert!(!Arc::ptr_eq(&elsewhere, &first));
        // A new stream's first read (not yet known): lent from it, left idle.
        let once = ra.mapping(file, 7, fd.as_fd(), 4096, 4096).expect("map");
        assert!(Arc::ptr_eq(&once, &first));
        drop(once);
        // A known stream takes it over, and parks it again when forgotten.
        let again = kept(&ra, file, 8);
        assert!(Arc::ptr_eq(&again, &first));
        drop(again);
        assert_eq!(Arc::strong_count(&first), 2);
        // The file's name removed: unmapped (when the test lets go).
        ra.forget_file(file);
        assert_eq!(Arc::strong_count(&first), 1);
        // Expired, the other file's too.
        assert_eq!(Arc::strong_count(&elsewhere), 2);
        ra.expire_idle();
        assert_eq!(Arc::strong_count(&elsewhere), 2, "expired at once");
        ra.expire_idle_after(std::time::Duration::ZERO);
        assert_eq!(Arc::strong_count(&elsewhere), 1);
        // At most IDLE_MAPS, the oldest going first.
        let maps: Vec<_> = (0..IDLE_MAPS as u64 + 1)
            .map(|i| kept(&ra, (5, i), 1))
            .collect();
        assert_eq!(Arc::strong_count(&maps[0]), 1, "the oldest went");
        assert!(maps[1..].iter().all(|m| Arc::strong_count(m) == 2));
    }
}
