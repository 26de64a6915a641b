//! Copying a range of one file into another on the server (NFSv4.2
//! COPY): a piece at a time, so a long copy can be locked, watched and
//! stopped between pieces. Data goes through copy_file_range, which
//! shares extents where the file system can (xfs, btrfs) and copies in
//! the kernel elsewhere; holes of the source stay holes in the
//! destination (copy_file_range alone would fill them with zeros on
//! file systems without shared extents).

use crate::extents::seek;
use crate::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A range to copy: `len` bytes from `src_offset` of the source to
/// `dst_offset` of the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Where it starts in the source.
    pub src_offset: u64,
    /// Where it goes in the destination.
    pub dst_offset: u64,
    /// Its length.
    pub len: u64,
}

/// Copies the part of `r` that starts `done` bytes in, up to `max` bytes
/// of it, and returns how many bytes of the range that covered: data
/// copied, or a hole kept as a hole. 0 means the source ended early (it
/// was cut shorter than the range).
pub fn step(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    r: Range,
    done: u64,
    max: u64,
) -> io::Result<u64> {
    let want = r.len.saturating_sub(done).min(max);
    if want == 0 {
        return Ok(0);
    }
    let s = r.src_offset + done;
    let d = r.dst_offset + done;
    let size = fs::stat(src)?.size;
    if s >= size {
        return Ok(0);
    }
    let want = want.min(size - s);
    match seek(src, s, true)? {
        Some(data) if data <= s => {
            // Data here: up to the next hole (the end of the file is one).
            let hole = seek(src, s, false)?.unwrap_or(size);
            let n = want.min(hole.max(s + 1) - s);
            copy_data(src, s, dst, d, n)
        }
        next => {
            // A hole up to the next data, or to the end of the file.
            let n = want.min(next.unwrap_or(size) - s);
            keep_hole(dst, d, n)?;
            Ok(n)
        }
    }
}

/// Asks the kernel to start reading `[offset, offset + len)` of the
/// source into the page cache without waiting (POSIX_FADV_WILLNEED), so
/// that the next piece's reads overlap this piece's copy.
pub fn prefetch(src: BorrowedFd<'_>, offset: u64, len: u64) {
    // SAFETY: valid descriptor; fadvise has no memory arguments. Only a
    // hint: its failure changes nothing.
    unsafe {
        libc::posix_fadvise(
            src.as_raw_fd(),
            offset as i64,
            len as i64,
            libc::POSIX_FADV_WILLNEED,
        )
    };
}

/// Makes `[d, d + n)` of the destination a hole: punched where the
/// destination has bytes there, and the size raised to its end.
fn keep_hole(dst: BorrowedFd<'_>, d: u64, n: u64) -> io::Result<()> {
    let size = fs::stat(dst)?.size;
    if d < size {
        let len = n.min(size - d);
        // SAFETY: valid descriptor; fallocate has no memory arguments.
        let r = unsafe {
            libc::fallocate64(
                dst.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                d as i64,
                len as i64,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP)) {
                return Err(e);
            }
            // No holes on this file system: zeros are what a hole reads as.
            zero(dst, d, len)?;
        }
    }
    if d + n > size {
        fs::ftruncate(dst, d + n)?;
    }
    Ok(())
}

fn zero(dst: BorrowedFd<'_>, mut at: u64, mut n: u64) -> io::Result<()> {
    let buf = vec![0u8; n.min(1 << 20) as usize];
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        let w = fs::write_at(dst, &buf[..k], at)?;
        at += w as u64;
        n -= w as u64;
    }
    Ok(())
}

/// Copies `n` bytes of data; fewer only when the source ends first.
fn copy_data(src: BorrowedFd<'_>, s: u64, dst: BorrowedFd<'_>, d: u64, n: u64) -> io::Result<u64> {
    let mut done = 0u64;
    while done < n {
        let mut off_in = (s + done) as i64;
        let mut off_out = (d + done) as i64;
        let len = (n - done).min(1 << 30) as usize;
        // SAFETY: valid descriptors; the offsets are locals the call
        // updates.
        let r = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                len,
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Across file systems, or not offered for these files:
                // read and write.
                Some(libc::EXDEV | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                    return Ok(done + read_write(src, s + done, dst, d + done, n - done)?);
                }
                _ if done > 0 => return Ok(done),
                _ => return Err(e),
            }
        }
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    Ok(done)
}

fn read_write(src: BorrowedFd<'_>, s: u64, dst: BorrowedFd<'_>, d: u64, n: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; n.min(1 << 20) as usize];
    let mut done = 0u64;
    while done < n {
        let k = (n - done).min(buf.len() as u64) as usize;
        // SAFETY: valid descriptor; the buffer holds k bytes.
        let r = unsafe {
            libc::pread64(
                src.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                k,
                (s + done) as i64,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if done > 0 { Ok(done) } else { Err(e) };
        }
        if r == 0 {
            break;
        }
        let w = fs::write_at(dst, &buf[..r as usize], d + done)?;
        done += w as u64;
        if w < r as usize {
            break;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn map(f: &std::fs::File) -> Vec<(u64, u64)> {
        let fd = f.as_fd();
        let size = fs::stat(fd).unwrap().size;
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(data) = seek(fd, at, true).unwrap() {
            let hole = seek(fd, data, false).unwrap().unwrap_or(size);
            out.push((data, hole));
            at = hole;
        }
        out
    }

    fn copy_all(src: &std::fs::File, dst: &std::fs::File, r: Range, max: u64) -> u64 {
        let mut done = 0;
        loop {
            let n = step(src.as_fd(), dst.as_fd(), r, done, max).unwrap();
            if n == 0 {
                return done;
            }
            done += n;
        }
    }

    #[test]
    fn copies_data_and_keeps_holes() {
        let src = fs::scratch_file("copy-src");
        let dst = fs::scratch_file("copy-dst");
        let mb = 1u64 << 20;
        fs::write_at(src.as_fd(), &vec![7u8; mb as usize], 0).unwrap();
        fs::write_at(src.as_fd(), &vec![9u8; mb as usize], 5 * mb).unwrap();
        fs::ftruncate(src.as_fd(), 8 * mb).unwrap();
        // The destination has bytes where the source has its hole.
        fs::write_at(dst.as_fd(), &vec![1u8; 3 * mb as usize], 2 * mb).unwrap();
        let r = Range {
            src_offset: 0,
            dst_offset: 0,
            len: 8 * mb,
        };
        assert_eq!(copy_all(&src, &dst, r, 3 * mb / 2), 8 * mb);
        assert_eq!(fs::stat(dst.as_fd()).unwrap().size, 8 * mb);
        let (a, _) = fs::read_buf(src.as_fd(), 0, 8 * mb as usize).unwrap();
        let (b, _) = fs::read_buf(dst.as_fd(), 0, 8 * mb as usize).unwrap();
        assert!(a[..] == b[..], "the copy differs from the source");
        if map(&src) == vec![(0, mb), (5 * mb, 6 * mb)] {
            // The file system keeps holes: so does the copy.
            assert_eq!(map(&dst), map(&src));
        }
    }

    #[test]
    fn stops_where_the_source_ends() {
        let src = fs::scratch_file("copy-short-src");
        let dst = fs::scratch_file("copy-short-dst");
        fs::write_at(src.as_fd(), b"hello world", 0).unwrap();
        let r = Range {
            src_offset: 6,
            dst_offset: 100,
            len: 50,
        };
        assert_eq!(copy_all(&src, &dst, r, 4), 5);
        let (b, _) = fs::read_buf(dst.as_fd(), 100, 5).unwrap();
        assert_eq!(&b[..], b"world");
    }
}
