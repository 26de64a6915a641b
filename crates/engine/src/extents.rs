//! Where a file's data and holes are: a per-file extent map built with
//! SEEK_DATA/SEEK_HOLE, cached and checked against the file's size and
//! timestamps, and dropped whenever the server changes the file.

use super::fs::Stat;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

/// Most extents (after merging holes too small to report) remembered for
/// one file; more fragmented files are looked up range by range instead.
const MAX_CACHED_EXTENTS: usize = 65536;
/// Files whose maps are kept.
const MAX_CACHED_FILES: usize = 4096;

/// A run of bytes that is data or a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Bytes that may be non-zero: offset and length.
    Data(u64, u64),
    /// Bytes that read as zeros and have no storage: offset and length.
    Hole(u64, u64),
}

impl Segment {
    /// First byte.
    pub fn offset(&self) -> u64 {
        match *self {
            Segment::Data(o, _) | Segment::Hole(o, _) => o,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match *self {
            Segment::Data(_, l) | Segment::Hole(_, l) => l,
        }
    }

    /// True for an empty segment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `lseek` with SEEK_DATA or SEEK_HOLE; `None` when there is no such
/// position before the end of the file (ENXIO).
pub fn seek(fd: BorrowedFd<'_>, offset: u64, data: bool) -> io::Result<Option<u64>> {
    if offset > i64::MAX as u64 {
        return Ok(None);
    }
    let whence = if data {
        libc::SEEK_DATA
    } else {
        libc::SEEK_HOLE
    };
    // SAFETY: valid descriptor; lseek has no memory arguments.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), offset as i64, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// What a walk over part of a file found.
#[derive(Debug)]
struct Walk {
    /// Data extents, with holes shorter than the walk's `min_hole` merged
    /// into the data around them.
    data: Vec<(u64, u64)>,
    /// The whole range was looked at (else the rest is reported as data).
    complete: bool,
    /// A hole of at least `min_hole` was found.
    big_hole: bool,
}

/// Data extents of `[start, end)` found with at most `max_seeks` lseek
/// calls; whatever is not reached is reported as data. Holes shorter than
/// `min_hole` are merged into data as they are found, so a file with many
/// small holes keeps a short list.
fn walk(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    max_seeks: usize,
    min_hole: u64,
) -> io::Result<Walk> {
    let mut w = Walk {
        data: Vec::new(),
        complete: true,
        big_hole: false,
    };
    let add = |w: &mut Walk, d: u64, h: u64| match w.data.last_mut() {
        Some((_, last_end)) if d - *last_end < min_hole => *last_end = h,
        last => {
            let gap_from = last.map_or(start, |&mut (_, e)| e);
            if d - gap_from >= min_hole {
                w.big_hole = true;
            }
            w.data.push((d, h));
        }
    };
    let mut pos = start;
    let mut seeks = 0;
    while pos < end {
        if seeks + 2 > max_seeks {
            add(&mut w, pos, end);
            w.complete = false;
            return Ok(w);
        }
        seeks += 2;
        let Some(d) = seek(fd, pos, true)? else { break };
        if d >= end {
            break;
        }
        let h = seek(fd, d, false)?.unwrap_or(end).min(end);
        if h <= d {
            // The file changed under us; call the rest data.
            add(&mut w, d.max(pos), end);
            break;
        }
        add(&mut w, d, h);
        pos = h;
    }
    if end - w.data.last().map_or(start, |&(_, e)| e) >= min_hole {
        w.big_hole = true;
    }
    Ok(w)
}

/// Turns data extents into segments covering `[start, end)` exactly, with
/// holes shorter than `min_hole` merged into the data around them.
pub fn segments(data: &[(u64, u64)], start: u64, end: u64, min_hole: u64) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut push = |s: Segment| {
        if s.is_empty() {
            return;
        }
        let s = match (out.last_mut(), s) {
            (Some(Segment::Data(o, l)), Segment::Data(_, n)) => {
                *l += n;
                let _ = o;
                return;
            }
            (Some(Segment::Hole(_, l)), Segment::Hole(_, n)) => {
                *l += n;
                return;
            }
            (_, s) => s,
        };
        out.push(s);
    };
    let mut pos = start;
    for &(ds, de) in data {
        let (ds, de) = (ds.max(start), de.min(end));
        if de <= ds {
            continue;
        }
        if ds > pos {
            let hole = ds - pos;
            push(if hole >= min_hole {
                Segment::Hole(pos, hole)
            } else {
                Segment::Data(pos, hole)
            });
        }
        push(Segment::Data(ds, de - ds));
        pos = de;
    }
    if end > pos {
        let hole = end - pos;
        push(if hole >= min_hole {
            Segment::Hole(pos, hole)
        } else {
            Segment::Data(pos, hole)
        });
    }
    out
}

/// The version of a file a cached map (or cached data) belongs to: its
/// size, modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validator {
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

impl Validator {
    /// The version `st` describes.
    pub(crate) fn of(st: &Stat) -> Self {
        Validator {
            size: st.size,
            mtime: (st.mtime.sec, st.mtime.nsec),
            ctime: (st.ctime.sec, st.ctime.nsec),
        }
    }
}

/// What the cache knows of a range without looking.
enum Known {
    Extents(Vec<(u64, u64)>),
    Fragmented,
    Unknown,
}

#[derive(Debug)]
enum Map {
    /// Every data extent of the file (small holes merged in).
    Complete(Vec<(u64, u64)>),
    /// Too fragmented to keep, with big holes: look up per request.
    Fragmented,
    /// Many extents and no hole worth reporting among the first ones:
    /// everything is sent as data, without looking.
    Dense,
}

/// Cached extent maps, keyed by (device, inode).
#[derive(Debug, Default)]
pub struct ExtentCache {
    maps: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    files: HashMap<(u64, u64), (Validator, Map)>,
    /// Extents held by all complete maps.
    extents: usize,
}

/// Lookups allowed per request when a file's map is not cached.
pub const MAX_SEEKS_PER_REQUEST: usize = 32;
/// Lookups spent on a file before deciding it is dense when no hole of
/// the reporting size has turned up.
const DENSE_PROBE_SEEKS: usize = 8192;
/// Extents held by all cached maps together (16 bytes each).
const MAX_TOTAL_EXTENTS: usize = 1 << 22;

impl ExtentCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the map of a file the server changed.
    pub fn invalidate(&self, key: (u64, u64)) {
        if let Ok(mut m) = self.maps.lock() {
            if let Some((_, Map::Complete(v))) = m.files.remove(&key) {
                m.extents -= v.len();
            }
        }
    }

    /// What is known of `[start, end)` without a lookup.
    fn known(&self, st: &Stat, start: u64, end: u64) -> Known {
        let end = end.min(st.size);
        if start >= end {
            return Known::Extents(Vec::new());
        }
        if st.blocks.saturating_mul(512) >= st.size {
            // Every byte can have storage: no hole worth a lookup.
            return Known::Extents(vec![(start, end)]);
        }
        let v = Validator::of(st);
        self.maps
            .lock()
            .ok()
            .and_then(|m| match m.files.get(&(st.dev, st.ino)) {
                Some((cv, Map::Complete(ext))) if *cv == v => {
                    Some(Known::Extents(overlapping(ext, start, end)))
                }
                Some((cv, Map::Fragmented)) if *cv == v => Some(Known::Fragmented),
                Some((cv, Map::Dense)) if *cv == v => Some(Known::Extents(vec![(start, end)])),
                _ => None,
            })
            .unwrap_or(Known::Unknown)
    }

    /// Like [`ExtentCache::data_extents`], but only when the answer needs
    /// no lookup in the file system (a file with no unallocated space, or
    /// one whose map is kept); None otherwise.
    pub fn cached_extents(&self, st: &Stat, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        match self.known(st, start, end) {
            Known::Extents(ext) => Some(ext),
            _ => None,
        }
    }

    /// Data extents overlapping `[start, end)` of the file open at `fd`
    /// whose status is `st`, with holes shorter than `min_hole` reported as
    /// data. The caller holds the file's lock so the map and the data it
    /// reads agree.
    ///
    /// The lookups are bounded so that READ_PLUS never costs much more than
    /// READ: a file with no unallocated space gets no lookup at all; a
    /// file's map is built once (and kept while its size and times stay
    /// the same); a file whose first extents show no hole of `min_hole` is
    /// taken as dense and sent as data; a very fragmented file with big
    /// holes gets at most [`MAX_SEEKS_PER_REQUEST`] lookups per request.
    pub fn data_extents(
        &self,
        fd: BorrowedFd<'_>,
        st: &Stat,
        start: u64,
        end: u64,
        min_hole: u64,
    ) -> io::Result<Vec<(u64, u64)>> {
        let key = (st.dev, st.ino);
        let v = Validator::of(st);
        let end = end.min(st.size);
        match self.known(st, start, end) {
            Known::Extents(ext) => return Ok(ext),
            Known::Fragmented => {
                return walk(fd, start, end, MAX_SEEKS_PER_REQUEST, min_hole).map(|w| w.data)
            }
            Known::Unknown => {}
        }
        // Build the whole map once, bounded: first a probe that tells a
        // dense file, then the rest.
        let probe = walk(fd, 0, st.size, DENSE_PROBE_SEEKS, min_hole)?;
        let map = if probe.complete {
            Map::Complete(probe.data)
        } else if !probe.big_hole {
            Map::Dense
        } else {
            let all = walk(fd, 0, st.size, MAX_CACHED_EXTENTS * 2, min_hole)?;
            if all.complete {
                Map::Complete(all.data)
            } else {
                Map::Fragmented
            }
        };
        let result = match &map {
            Map::Complete(all) => Some(overlapping(all, start, end)),
            Map::Dense => Some(vec![(start, end)]),
            Map::Fragmented => None,
        };
        if let Ok(mut m) = self.maps.lock() {
            let n = match &map {
                Map::Complete(v) => v.len(),
                _ => 0,
            };
            if m.files.len() >= MAX_CACHED_FILES || m.extents + n > MAX_TOTAL_EXTENTS {
                m.files.clear();
                m.extents = 0;
            }
            if let Some((_, Map::Complete(old))) = m.files.insert(key, (v, map)) {
                m.extents -= old.len();
            }
            m.extents += n;
        }
        match result {
            Some(r) => Ok(r),
            None => walk(fd, start, end, MAX_SEEKS_PER_REQUEST, min_hole).map(|w| w.data),
        }
    }
}

fn overlapping(ext: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let i = ext.partition_point(|&(_, e)| e <= start);
    ext[i..]
        .iter()
        .take_while(|&&(s, _)| s < end)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_range_and_merge_small_holes() {
        let data = [(0, 4096), (8192, 12288), (1 << 20, (1 << 20) + 4096)];
        let s = segments(&data, 0, (1 << 20) + 8192, 32768);
        assert_eq!(
            s,
            vec![
                Segment::Data(0, 12288),
                Segment::Hole(12288, (1 << 20) - 12288),
                Segment::Data(1 << 20, 8192)
            ]
        );
        let total: u64 = s.iter().map(|x| x.len()).sum();
        assert_eq!(total, (1 << 20) + 8192);
        assert_eq!(segments(&[], 100, 200, 1), vec![Segment::Hole(100, 100)]);
        assert_eq!(segments(&[(0, 50)], 10, 20, 1), vec![Segment::Data(10, 10)]);
    }

    #[test]
    fn finds_real_holes_in_a_sparse_file() {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::fd::AsFd;
        let mut f = super::super::fs::scratch_file("extents");
        f.write_all(&[1u8; 4096]).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&[2u8; 4096]).unwrap();
        f.sync_all().unwrap();
        let st = super::super::fs::stat(f.as_fd()).unwrap();
        let c = ExtentCache::new();
        let ext = c.data_extents(f.as_fd(), &st, 0, st.size, 32768).unwrap();
        // File systems may allocate more than written, but the big hole is found.
        assert!(ext.first().is_some_and(|&(s, _)| s == 0), "{ext:?}");
        assert!(
            ext.last().is_some_and(|&(_, e)| e == (1 << 20) + 4096),
            "{ext:?}"
        );
        let covered: u64 = ext.iter().map(|(s, e)| e - s).sum();
        assert!(covered < 512 * 1024, "hole not found: {ext:?}");
    }

    /// A file of `n` alternating data and hole segments of `seg` bytes.
    fn mixed(name: &str, seg: u64, n: u64) -> (std::fs::File, Stat) {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        let f = super::super::fs::scratch_file(name);
        f.set_len(seg * n).unwrap();
        for i in (0..n).step_by(2) {
            f.write_all_at(&vec![7u8; seg as usize], i * seg).unwrap();
        }
        f.sync_all().unwrap();
        let st = super::super::fs::stat(f.as_fd()).unwrap();
        (f, st)
    }

    #[test]
    fn small_holes_are_merged_and_dense_files_need_no_lookups() {
        use std::os::fd::AsFd;
        // 4 KiB segments, 20,000 of them: more than the probe looks at, no
        // hole of 32 KiB: dense, all data.
        let (f, st) = mixed("dense", 4096, 20_000);
        assert!(
            st.blocks * 512 < st.size,
            "the temp directory's file system made no holes"
        );
        let c = ExtentCache::new();
        let ext = c.data_extents(f.as_fd(), &st, 0, st.size, 32768).unwrap();
        assert_eq!(ext.len(), 1, "{:?}", &ext[..ext.len().min(4)]);
        assert!(matches!(
            c.maps.lock().unwrap().files.get(&(st.dev, st.ino)),
            Some((_, Map::Dense))
        ));
        // The same file with every hole reported.
        let c = ExtentCache::new();
        let ext = c.data_extents(f.as_fd(), &st, 0, 1 << 20, 4096).unwrap();
        assert_eq!(ext.len(), 128, "{:?}", &ext[..ext.len().min(4)]);
    }

    #[test]
    fn big_holes_are_kept_in_a_complete_map() {
        use std::os::fd::AsFd;
        let (f, st) = mixed("big", 65536, 64);
        let c = ExtentCache::new();
        let ext = c.data_extents(f.as_fd(), &st, 0, st.size, 32768).unwrap();
        assert_eq!(ext.len(), 32, "{ext:?}");
        assert!(ext.iter().all(|&(s, e)| e - s == 65536 && s % 131072 == 0));
        assert_eq!(c.maps.lock().unwrap().extents, 32);
        c.invalidate((st.dev, st.ino));
        assert_eq!(c.maps.lock().unwrap().extents, 0);
    }
}
