//! The read path: one call that serves a read of a file from the server's
//! read cache, the page cache or the device, drives the readahead engine,
//! and either waits for the disk and for the range lock ([`Mode::Wait`])
//! or says it would have to ([`ReadError::WouldBlock`]), for callers that
//! must not wait (a connection's network task). Protocol front ends (NFSv4
//! READ and READ_PLUS; NFSv3 READ) call it; it knows nothing about them.

use crate::ahead::Ahead;
use crate::bufcache::BufCache;
use crate::cred;
use crate::fs::{self, Stat};
use crate::rangelock::{RangeGuard, RangeLocks};
use crate::readahead::{self, Access, Readahead};
use bytes::Bytes;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Whether a read may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It may wait for the disk and for the range lock.
    Wait,
    /// It must not: it serves only what is in memory now.
    NoWait,
}

/// Why a read gave no data.
#[derive(Debug)]
pub enum ReadError {
    /// In [`Mode::NoWait`], the read would have to wait: nothing was
    /// changed, and it can be asked again with [`Mode::Wait`].
    WouldBlock,
    /// The read failed.
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// One read of a file.
#[derive(Debug, Clone, Copy)]
pub struct ReadAt<'a> {
    /// The file's (device, inode).
    pub file: (u64, u64),
    /// Its attributes now (size, times: they version the read cache).
    pub st: &'a Stat,
    /// The descriptor to read through (an open's).
    pub fd: &'a Arc<OwnedFd>,
    /// An O_PATH descriptor of the file, to open it again (for O_DIRECT,
    /// or when `fd` was opened write-only).
    pub path: BorrowedFd<'a>,
    /// The reader: its requests form one stream for readahead.
    pub stream: u64,
    /// First byte.
    pub offset: u64,
    /// Bytes wanted.
    pub count: usize,
    /// Whether the file may be opened again with O_DIRECT (not while a
    /// kernel lease on it would be broken by that open).
    pub direct: bool,
    /// Whether the caller can take data lent from a mapping of the file
    /// ([`Data::lent`]): it hands the data only to the kernel.
    pub lend: bool,
}

/// Data read for a reply.
#[derive(Debug, Clone)]
pub struct Data {
    /// The bytes (the first of them, with [`Data::more`]).
    pub bytes: Bytes,
    /// The bytes that follow `bytes`, when the read cache holds the data
    /// in several buffers end to end (a reader whose requests do not fall
    /// on the buffers' boundaries): they go out as they are, not copied
    /// together. Empty otherwise.
    pub more: Vec<Bytes>,
    /// Whether they are lent from a mapping of the file (see
    /// [`crate::mapped`]): they hold a shared range lock until dropped,
    /// and must be given only to the kernel (the XDR encoder's
    /// `opaque_lent`), never read here.
    pub lent: bool,
}

impl Data {
    fn own(bytes: Bytes) -> Self {
        Data {
            bytes,
            more: Vec::new(),
            lent: false,
        }
    }

    /// Data of the read cache, in the pieces it holds.
    fn cached(mut pieces: Vec<Bytes>) -> Self {
        let first = if pieces.is_empty() {
            Bytes::new()
        } else {
            pieces.remove(0)
        };
        Data {
            bytes: first,
            more: pieces,
            lent: false,
        }
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.more.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same data in one buffer (copied together when in pieces), for
    /// callers that cut it up.
    pub fn contiguous(self) -> Self {
        if self.more.is_empty() {
            return self;
        }
        let mut out = bytes::BytesMut::with_capacity(self.len());
        out.extend_from_slice(&self.bytes);
        for b in &self.more {
            out.extend_from_slice(b);
        }
        Data::own(out.freeze())
    }
}

/// The read path's parts: the readahead engine, the read cache of data read
/// past the page cache, readahead past the page cache, and the range locks
/// that make each read see each write whole or not at all.
#[derive(Debug)]
pub struct ReadPath {
    /// Sequential stream detection and readahead.
    pub readahead: Readahead,
    /// Data of cold streams, read past the page cache.
    pub bufcache: Arc<BufCache>,
    /// Readahead past the page cache, into `bufcache`.
    pub ahead: Ahead,
    locks: Arc<RangeLocks>,
}

impl ReadPath {
    /// A read path with readahead as `config` says and a read cache of up
    /// to `read_cache` bytes, taking its range locks in `locks`.
    pub fn new(config: readahead::Config, read_cache: u64, locks: Arc<RangeLocks>) -> Self {
        let bufcache = Arc::new(BufCache::new(read_cache));
        // Buffers of data read past the page cache fill the read cache:
        // keep as much memory for them when the cache lets go of some.
        crate::hugebuf::keep_free(read_cache);
        let mut ra = config;
        ra.direct_ahead &= read_cache > 0;
        let readahead = Readahead::new(ra);
        let ahead = Ahead::new(
            ra.direct_ahead && ra.max > 0 && ra.direct_min > 0,
            bufcache.clone(),
            locks.clone(),
            readahead.stats.clone(),
        );
        ReadPath {
            readahead,
            bufcache,
            ahead,
            locks,
        }
    }

    /// The shared range lock a read holds around its data; in
    /// [`Mode::NoWait`] only when it is free now.
    pub fn lock(
        &self,
        file: (u64, u64),
        start: u64,
        end: u64,
        mode: Mode,
    ) -> Result<RangeGuard<'_>, ReadError> {
        match mode {
            Mode::NoWait => self
                .locks
                .try_read(file, start, end)
                .ok_or(ReadError::WouldBlock),
            Mode::Wait => Ok(self.locks.read(file, start, end)),
        }
    }

    /// Reads up to `r.count` bytes at `r.offset` into a fresh buffer that a
    /// reply can carry without copying (or, for a caller that can take it,
    /// lends them from a mapping of the file: [`Data::lent`]): from the
    /// read cache, else the page cache, else the device, with O_DIRECT for a large request of a cold
    /// sequential reader that keeps several in flight (the readahead
    /// engine decides), and tells the readahead engine about the request.
    /// In [`Mode::NoWait`], only what is in memory is served.
    pub fn read(&self, r: &ReadAt<'_>, mode: Mode) -> Result<Data, ReadError> {
        crate::hugebuf::busy();
        let (file, st, fd) = (r.file, r.st, r.fd);
        let count64 = r.count as u64;
        if let Some(data) = self.bufcache.get(file, st, r.offset, r.count) {
            let access = self
                .readahead
                .access_own_cache(file, r.stream, fd, r.offset, count64, st.size);
            self.read_ahead(r, &access);
            self.readahead.record(access, true);
            return Ok(Data::cached(data));
        }
        // Whether the page cache lacks some of the data, asked only for a
        // request that may go past the cache, and without touching the
        // cache: a non-blocking read of missing pages would start reading
        // them in, and the data would then come from the disk twice.
        let within = st.size.saturating_sub(r.offset).min(count64);
        let direct_candidate = r.direct && self.readahead.direct_candidate(r.offset, count64);
        let lend_min = self.readahead.config().lend_min;
        let may_lend = r.lend && lend_min > 0 && within >= lend_min;
        // Asked once, for both uses.
        let cached = if within > 0 && (direct_candidate || may_lend) {
            fs::cached_fully(fd.as_fd(), r.offset, within)
        } else {
            None
        };
        let uncached = direct_candidate && cached == Some(false);
        let lendable = may_lend && cached == Some(true);
        if mode == Mode::NoWait {
            if cached == Some(false) {
                // Known to need the disk: a non-blocking read would
                // start the kernel's readahead here, and may even finish
                // it (and the block lookups it needs) on this thread.
                if uncached {
                    self.readahead.queued(file, r.stream, fd, r.offset, count64);
                }
                return Err(ReadError::WouldBlock);
            }
            if lendable {
                if let Some(data) = self.lend(r, within) {
                    let access = self
                        .readahead
                        .access(file, r.stream, fd, r.offset, count64, st.size);
                    self.readahead.record(access, true);
                    return Ok(data);
                }
            }
            // Only what the page cache holds; the rest is read where
            // waiting is allowed (also the reopen a write-only open
            // needs). The readahead engine hears of the request once it
            // has been served, so a request finished elsewhere is not
            // counted twice.
            let buf = match fs::read_cached(fd.as_fd(), r.offset, r.count) {
                Ok(Some(buf)) => buf,
                Ok(None) => return Err(ReadError::WouldBlock),
                Err(err) if err.raw_os_error() == Some(libc::EBADF) => {
                    return Err(ReadError::WouldBlock)
                }
                Err(err) => return Err(err.into()),
            };
            let access = self
                .readahead
                .access(file, r.stream, fd, r.offset, count64, st.size);
            self.readahead.record(access, true);
            let buf = buf.freeze();
            if access.keep {
                self.bufcache.insert_served(file, st, r.offset, buf.clone());
            }
            return Ok(Data::own(buf));
        }
        // Readahead starts before this request waits for the disk.
        let access = self
            .readahead
            .begin(file, r.stream, fd, r.offset, count64, st.size, uncached);
        self.read_ahead(r, &access);
        // Part of it being read ahead: wait for that rather than ask the
        // device for the same bytes again.
        if self.ahead.wait(file, r.offset, count64) {
            if let Some(data) = self.bufcache.get(file, st, r.offset, r.count) {
                self.readahead.record(access, false);
                return Ok(Data::cached(data));
            }
        }
        let direct = if access.direct && r.direct {
            self.read_direct(r)
        } else {
            None
        };
        if direct.is_none() && lendable {
            if let Some(data) = self.lend(r, within) {
                self.readahead.record(access, true);
                return Ok(data);
            }
        }
        let read = match direct {
            Some(res) => res.map(|buf| {
                self.readahead
                    .stats
                    .direct_bytes
                    .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
                (buf, false)
            }),
            None => match fs::read_buf(fd.as_fd(), r.offset, r.count) {
                Err(err) if err.raw_os_error() == Some(libc::EBADF) => {
                    cred::as_root(|| fs::reopen(r.path, libc::O_RDONLY))
                        .and_then(|rfd| fs::read_buf(rfd.as_fd(), r.offset, r.count))
                }
                res => res,
            }
            .map(|(buf, cached)| (buf.freeze(), cached)),
        };
        // Recorded whatever the outcome: the request is no longer in flight.
        self.readahead
            .record(access, read.as_ref().is_ok_and(|(_, cached)| *cached));
        let buf = read?.0;
        if access.keep {
            // Kept for the reader's next pass: the page cache has not got
            // what was read past it.
            self.bufcache.insert_served(file, st, r.offset, buf.clone());
        }
        Ok(Data::own(buf))
    }

    /// Lends the `within` bytes at `r.offset` (all inside the file, all
    /// in the page cache) from a mapping of the file, when they are read
    /// in and no WRITE of the server's waits for them; None otherwise (to
    /// be copied as usual).
    fn lend(&self, r: &ReadAt<'_>, within: u64) -> Option<Data> {
        let fd = r.fd.as_fd();
        let end = r.offset + within;
        // Pages being read in count as cached; readahead reads them in
        // order, so the last one is the one to ask.
        if !fs::page_ready(fd, end - 1) {
            return None;
        }
        let map = self
            .readahead
            .mapping(r.file, r.stream, fd, end, r.st.size)
            .ok()?;
        let range = self.locks.try_read_owned(r.file, r.offset, end)?;
        let bytes = crate::mapped::lend(&map, r.offset, within as usize, range)?;
        self.readahead
            .stats
            .lent_bytes
            .fetch_add(within, std::sync::atomic::Ordering::Relaxed);
        Some(Data {
            bytes,
            more: Vec::new(),
            lent: true,
        })
    }

    /// The stream's own O_DIRECT descriptor (the open's has the page
    /// cache's flags), opened as root: the caller already checked
    /// permission to read.
    fn direct_fd(&self, r: &ReadAt<'_>) -> io::Result<Arc<OwnedFd>> {
        self.readahead.direct_fd(r.file, r.stream, || {
            cred::as_root(|| fs::reopen(r.path, libc::O_RDONLY | libc::O_DIRECT))
        })
    }

    /// Starts reading the part of a window that the readahead engine
    /// handed back for a reader past the page cache, in pieces of the
    /// reader's request size, into the read cache.
    fn read_ahead(&self, r: &ReadAt<'_>, access: &Access) {
        let Some((from, to)) = access.ahead.filter(|_| r.direct) else {
            return;
        };
        let align = fs::DIRECT_ALIGN as u64;
        let piece = (r.count as u64 / align * align)
            .max(self.readahead.config().direct_min.next_multiple_of(align));
        if let Ok(fd) = self.direct_fd(r) {
            self.ahead.schedule(r.file, r.st, &fd, from, to, piece);
        }
    }

    /// Reads with O_DIRECT through the stream's own descriptor. None when
    /// the file system refuses direct I/O here, to read through the page
    /// cache instead.
    fn read_direct(&self, r: &ReadAt<'_>) -> Option<io::Result<Bytes>> {
        let fd = match self.direct_fd(r) {
            Ok(fd) => fd,
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => return None,
            Err(err) => return Some(Err(err)),
        };
        match fs::read_direct(fd.as_fd(), r.offset, r.count) {
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => None,
            res => Some(res),
        }
    }
}
