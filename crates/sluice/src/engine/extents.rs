//! Where a file's data and holes are: a per-file extent map built with
//! SEEK_DATA/SEEK_HOLE, cached and checked against the file's size and
//! timestamps, and dropped whenever the server changes the file.

use super::fs::Stat;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

/// Most extents remembered for one file; more fragmented files are looked
/// up range by range instead.
const MAX_CACHED_EXTENTS: usize = 4096;
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

/// Data extents of `[start, end)` found with at most `max_seeks` lseek
/// calls; whatever is not reached is reported as data.
fn walk(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    max_seeks: usize,
) -> io::Result<(Vec<(u64, u64)>, bool)> {
    let mut out = Vec::new();
    let mut pos = start;
    let mut seeks = 0;
    while pos < end {
        if seeks + 2 > max_seeks {
            out.push((pos, end));
            return Ok((out, false));
        }
        seeks += 2;
        let Some(d) = seek(fd, pos, true)? else { break };
        if d >= end {
            break;
        }
        let h = seek(fd, d, false)?.unwrap_or(end).min(end);
        if h <= d {
            // The file changed under us; call the rest data.
            out.push((d, end));
            break;
        }
        out.push((d, h));
        pos = h;
    }
    Ok((out, true))
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Validator {
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

impl Validator {
    fn of(st: &Stat) -> Self {
        Validator {
            size: st.size,
            mtime: (st.mtime.sec, st.mtime.nsec),
            ctime: (st.ctime.sec, st.ctime.nsec),
        }
    }
}

#[derive(Debug)]
enum Map {
    /// Every data extent of the file.
    Complete(Vec<(u64, u64)>),
    /// Too fragmented to keep: look up per request.
    Fragmented,
}

/// Cached extent maps, keyed by (device, inode).
#[derive(Debug, Default)]
pub struct ExtentCache {
    maps: Mutex<HashMap<(u64, u64), (Validator, Map)>>,
}

/// Lookups allowed per request when a file's map is not cached.
pub const MAX_SEEKS_PER_REQUEST: usize = 32;

impl ExtentCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the map of a file the server changed.
    pub fn invalidate(&self, key: (u64, u64)) {
        if let Ok(mut m) = self.maps.lock() {
            m.remove(&key);
        }
    }

    /// Data extents overlapping `[start, end)` of the file open at `fd`
    /// whose status is `st`. The caller holds the file's lock so the map
    /// and the data it reads agree.
    pub fn data_extents(
        &self,
        fd: BorrowedFd<'_>,
        st: &Stat,
        start: u64,
        end: u64,
    ) -> io::Result<Vec<(u64, u64)>> {
        let key = (st.dev, st.ino);
        let v = Validator::of(st);
        let end = end.min(st.size);
        if start >= end {
            return Ok(Vec::new());
        }
        let cached = self.maps.lock().ok().and_then(|m| match m.get(&key) {
            Some((cv, Map::Complete(ext))) if *cv == v => Some(Some(overlapping(ext, start, end))),
            Some((cv, Map::Fragmented)) if *cv == v => Some(None),
            _ => None,
        });
        match cached {
            Some(Some(ext)) => return Ok(ext),
            Some(None) => return walk(fd, start, end, MAX_SEEKS_PER_REQUEST).map(|(e, _)| e),
            None => {}
        }
        // Build the whole map once, bounded.
        let (all, complete) = walk(fd, 0, st.size, MAX_CACHED_EXTENTS * 2)?;
        let result = overlapping(&all, start, end);
        if let Ok(mut m) = self.maps.lock() {
            if m.len() >= MAX_CACHED_FILES {
                m.clear();
            }
            m.insert(
                key,
                (
                    v,
                    if complete {
                        Map::Complete(all)
                    } else {
                        Map::Fragmented
                    },
                ),
            );
        }
        if complete {
            Ok(result)
        } else {
            walk(fd, start, end, MAX_SEEKS_PER_REQUEST).map(|(e, _)| e)
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
        let p = std::env::temp_dir().join(format!("sluice-extents-{}", std::process::id()));
        let mut f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.write_all(&[1u8; 4096]).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&[2u8; 4096]).unwrap();
        f.sync_all().unwrap();
        let st = super::super::fs::stat(f.as_fd()).unwrap();
        let c = ExtentCache::new();
        let ext = c.data_extents(f.as_fd(), &st, 0, st.size).unwrap();
        std::fs::remove_file(&p).unwrap();
        // File systems may allocate more than written, but the big hole is found.
        assert!(ext.first().is_some_and(|&(s, _)| s == 0), "{ext:?}");
        assert!(
            ext.last().is_some_and(|&(_, e)| e == (1 << 20) + 4096),
            "{ext:?}"
        );
        let covered: u64 = ext.iter().map(|(s, e)| e - s).sum();
        assert!(covered < 512 * 1024, "hole not found: {ext:?}");
    }
}
