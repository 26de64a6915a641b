//! Access to the backing file system through descriptors.
//!
//! Every object is reached from an `O_PATH` descriptor obtained from its
//! handle, and names are resolved one component at a time relative to a
//! directory descriptor without following symlinks, so nothing outside the
//! export can be reached by name.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};

use super::hugebuf;

/// A point in time as seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

/// What the engine knows of an object (from fstatat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// File type and permission bits (st_mode).
    pub mode: u32,
    /// Hard links.
    pub nlink: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
    /// Device numbers of a device node.
    pub rdev: u64,
    /// Device holding the object.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Last access.
    pub atime: Time,
    /// Last data modification.
    pub mtime: Time,
    /// Last status change.
    pub ctime: Time,
}

impl Stat {
    fn from_raw(s: &libc::stat64) -> Self {
        Stat {
            mode: s.st_mode,
            nlink: s.st_nlink,
            uid: s.st_uid,
            gid: s.st_gid,
            size: s.st_size as u64,
            blocks: s.st_blocks as u64,
            rdev: s.st_rdev,
            dev: s.st_dev,
            ino: s.st_ino,
            atime: Time {
                sec: s.st_atime,
                nsec: s.st_atime_nsec as u32,
            },
            mtime: Time {
                sec: s.st_mtime,
                nsec: s.st_mtime_nsec as u32,
            },
            ctime: Time {
                sec: s.st_ctime,
                nsec: s.st_ctime_nsec as u32,
            },
        }
    }

    /// The file type bits.
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// True for directories.
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// True for regular files.
    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    /// True for symbolic links.
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    /// A value that changes whenever the object's data or metadata does.
    pub fn change(&self) -> u64 {
        (self.ctime.sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(self.ctime.nsec as u64)
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Makes a C string from a name; names with NUL bytes are invalid.
pub fn cname(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The `/proc/self/fd/N` path that reopens or addresses a descriptor.
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// Stats `name` in `dir` (or `dir` itself when `name` is empty) without
/// following symlinks.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let mut st = MaybeUninit::<libc::stat64>::uninit();
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | if name.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: valid fd, C string and output buffer.
    cvt(unsafe { libc::fstatat64(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded and filled the buffer.
    Ok(Stat::from_raw(unsafe { &st.assume_init() }))
}

/// Stats the object behind a descriptor.
pub fn stat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    stat_at(fd, c"")
}

/// The type, mode, link count, device and inode of the object behind a
/// descriptor, without asking for its times (the rest of the [`Stat`] is
/// zero). Ops that change a file use this: since Linux 6.13 a stat that
/// asks for the modification or change time makes the next write to the
/// file take a new fine-grained timestamp, which on xfs logs the whole
/// inode, extent list included, on every WRITE.
pub fn identity(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid fd and C string; the output buffer is a statx.
    cvt(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_NLINK,
            st.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    Ok(Stat {
        mode: u32::from(st.stx_mode),
        nlink: u64::from(st.stx_nlink),
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        ..Default::default()
    })
}

/// Opens `name` in `dir` as an O_PATH descriptor, not following symlinks.
pub fn open_path_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid fd and C string; the result is a fresh descriptor.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the kernel can look names up from its caches only
/// (`openat2` with RESOLVE_CACHED, Linux 5.12); cleared at the first
/// refusal, after which [`open_path_at_cached`] always says WouldBlock.
static RESOLVE_CACHED_WORKS: AtomicBool = AtomicBool::new(true);

/// Like [`open_path_at`], but only from the kernel's caches (dentries and
/// inodes in memory): an error of kind [`io::ErrorKind::WouldBlock`] when
/// the lookup would have to read the directory or the inode from storage,
/// so that a caller that must not wait can hand it to one that may.
pub fn open_path_at_cached(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    if !RESOLVE_CACHED_WORKS.load(Ordering::Relaxed) {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    // struct open_how of <linux/openat2.h>.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_CACHED | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: valid fd, C string and open_how of the size given; the
    // result is a fresh descriptor.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Err(io::ErrorKind::WouldBlock.into()),
            // No openat2 (before 5.6) or no RESOLVE_CACHED (before 5.12).
            Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::E2BIG) => {
                RESOLVE_CACHED_WORKS.store(false, Ordering::Relaxed);
                Err(io::ErrorKind::WouldBlock.into())
            }
            _ => Err(e),
        };
    }
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Opens a directory path on the host as an O_PATH descriptor.
pub fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cname(path.as_os_str().as_bytes())?;
    // SAFETY: valid C string; the result is a fresh descriptor.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reopens an O_PATH descriptor with real access `flags` (O_RDONLY,
/// O_RDWR, ...). Permission is checked against the thread's identity.
pub fn reopen(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    let p = proc_path(fd);
    // The magic link is followed to the object itself; callers check the
    // object's type before reopening, so no symlink is followed here.
    // SAFETY: valid C string; the result is a fresh descriptor.
    let r = cvt(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Creates (or with `exclusive` false, opens) a regular file `name` in `dir`.
/// Returns the descriptor and whether this call created the file.
pub fn create_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
    exclusive: bool,
    access: libc::c_int,
) -> io::Result<(OwnedFd, bool)> {
    let base = access | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    loop {
        // SAFETY: valid fd and C string.
        let r = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                base | libc::O_CREAT | libc::O_EXCL,
                mode,
            )
        };
        if r >= 0 {
            // SAFETY: fresh descriptor.
            return Ok((unsafe { OwnedFd::from_raw_fd(r) }, true));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) || exclusive {
            return Err(e);
        }
        // It exists: look at what it is before opening it for real, so a
        // FIFO (whose open would wait for a peer) or a device node is never
        // opened. Reopening through the O_PATH descriptor opens the very
        // object that was checked.
        let found = match open_path_at(dir, name) {
            Ok(fd) => fd,
            // Removed between the two calls: try again.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let st = stat(found.as_fd())?;
        if !st.is_file() {
            return Err(io::Error::from_raw_os_error(not_a_file_errno(&st)));
        }
        return Ok((reopen(found.as_fd(), access)?, false));
    }
}

/// The error for an object that should have been a regular file: EISDIR
/// for a directory, ELOOP for a symlink, and EMEDIUMTYPE for anything else
/// (FIFO, socket, device), which the server reports as "wrong type".
pub fn not_a_file_errno(st: &Stat) -> i32 {
    if st.is_dir() {
        libc::EISDIR
    } else if st.is_symlink() {
        libc::ELOOP
    } else {
        libc::EMEDIUMTYPE
    }
}

/// Creates a directory.
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// Creates a symbolic link `name` in `dir` pointing at `target`.
pub fn symlink_at(dir: BorrowedFd<'_>, name: &CStr, target: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// Creates a device node, FIFO or socket.
pub fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// Removes `name` from `dir`; `is_dir` selects rmdir semantics.
pub fn unlink_at(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// Renames `from` in `fdir` to `to` in `tdir`.
pub fn rename_at(
    fdir: BorrowedFd<'_>,
    from: &CStr,
    tdir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    renameat2(fdir, from, tdir, to, 0)
}

/// [`rename_at`], unless `to` exists: then EEXIST, and nothing changes
/// (RENAME_NOREPLACE). EINVAL where the file system cannot tell (and for
/// the errors a plain rename gives EINVAL for).
pub fn rename_noreplace(
    fdir: BorrowedFd<'_>,
    from: &CStr,
    tdir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    renameat2(fdir, from, tdir, to, libc::RENAME_NOREPLACE)
}

/// `renameat2` with `flags` (0: what `renameat` does).
fn renameat2(
    fdir: BorrowedFd<'_>,
    from: &CStr,
    tdir: BorrowedFd<'_>,
    to: &CStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    // SAFETY: valid fds and C strings; renameat2 takes no pointer but
    // the names.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            fdir.as_raw_fd(),
            from.as_ptr(),
            tdir.as_raw_fd(),
            to.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a new hard link `name` in `dir` to the object behind `fd`.
pub fn link_at(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid fds and C strings.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            p.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

/// Reads the target of the symlink behind `fd`.
pub fn readlink(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid fd, empty path, buffer of the given length.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Changes permission bits.
pub fn chmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid C string.
    cvt(unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

/// Changes owner and/or group (`u32::MAX` leaves one unchanged).
pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd and empty path.
    cvt(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) })
        .map(drop)
}

/// Sets the size of a regular file.
pub fn truncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    if size > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    let p = proc_path(fd);
    // SAFETY: valid C string.
    cvt(unsafe { libc::truncate64(p.as_ptr(), size as i64) }).map(drop)
}

/// Whether a descriptor was opened write-only (reads through it fail with
/// EBADF).
pub fn write_only(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: valid descriptor; F_GETFL takes no argument.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_ACCMODE == libc::O_WRONLY
}

/// Sets the size of the file open on `fd` (for writing) to `size`.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    if size > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::ftruncate64(fd.as_raw_fd(), size as i64) }).map(drop)
}

/// The value of extended attribute `name` (a full name: "user.x") of the
/// file or directory `fd` (an O_PATH descriptor is enough).
pub fn getxattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let p = proc_path(fd);
    // SAFETY: valid C strings; `sized` passes a buffer of `len` bytes
    // (null with 0 to ask for the size).
    sized(|buf, len| unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf, len) })
}

/// What a call that fills a buffer gives (getxattr, listxattr): first
/// asked for the size with a null buffer, then for the bytes, again if
/// they grew in between (ERANGE).
fn sized(call: impl Fn(*mut libc::c_void, usize) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    loop {
        let n = cvt_size(call(std::ptr::null_mut(), 0))?;
        let mut buf = vec![0u8; n];
        match cvt_size(call(buf.as_mut_ptr().cast(), n)) {
            Ok(got) => {
                buf.truncate(got);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Sets extended attribute `name` of `fd` to `value`; `flags` is 0,
/// XATTR_CREATE or XATTR_REPLACE.
pub fn setxattr(
    fd: BorrowedFd<'_>,
    name: &CStr,
    value: &[u8],
    flags: libc::c_int,
) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    cvt(unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// Removes extended attribute `name` of `fd`.
pub fn removexattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid C strings.
    cvt(unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) }).map(drop)
}

/// The names of the extended attributes of `fd` (those the caller may
/// see), in the file system's order.
pub fn listxattr(fd: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let p = proc_path(fd);
    // SAFETY: valid C string; `sized` passes a buffer of `len` bytes.
    let buf = sized(|buf, len| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) })?;
    Ok(buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// FICLONERANGE: _IOW(0x94, 13, struct file_clone_range).
const FICLONERANGE: libc::c_ulong = 0x4020_940d;

/// struct file_clone_range.
#[repr(C)]
struct FileCloneRange {
    src_fd: i64,
    src_offset: u64,
    src_length: u64,
    dest_offset: u64,
}

/// Makes `[dst_offset, dst_offset + len)` of the file open for writing on
/// `dst` share the extents of `[src_offset, src_offset + len)` of `src`
/// (ioctl FICLONERANGE; `len` 0 is to the end of the source). Fails with
/// EOPNOTSUPP where the file system has no shared extents, EXDEV across
/// file systems, EINVAL for ranges not aligned to its block size.
pub fn clone_range(
    src: BorrowedFd<'_>,
    src_offset: u64,
    len: u64,
    dst: BorrowedFd<'_>,
    dst_offset: u64,
) -> io::Result<()> {
    let arg = FileCloneRange {
        src_fd: i64::from(src.as_raw_fd()),
        src_offset,
        src_length: len,
        dest_offset: dst_offset,
    };
    // SAFETY: valid descriptors; the argument is a file_clone_range.
    cvt(unsafe { libc::ioctl(dst.as_raw_fd(), FICLONERANGE as _, &arg) }).map(drop)
}

/// How to set one timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// Leave it.
    Keep,
    /// The server's current time.
    Now,
    /// This time.
    At(Time),
}

fn timespec(t: SetTime) -> libc::timespec {
    match t {
        SetTime::Keep => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        SetTime::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        SetTime::At(t) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: t.nsec as i64,
        },
    }
}

/// Sets access and modification times.
pub fn utimens(fd: BorrowedFd<'_>, atime: SetTime, mtime: SetTime) -> io::Result<()> {
    let ts = [timespec(atime), timespec(mtime)];
    let p = proc_path(fd);
    // SAFETY: valid C string and a two-element timespec array.
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), 0) }).map(drop)
}

/// File system space and inode counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStat {
    /// Bytes available to unprivileged users.
    pub bytes_avail: u64,
    /// Bytes free.
    pub bytes_free: u64,
    /// Bytes in total.
    pub bytes_total: u64,
    /// Inodes available.
    pub files_avail: u64,
    /// Inodes free.
    pub files_free: u64,
    /// Inodes in total.
    pub files_total: u64,
    /// The block size it allocates (and clones) in.
    pub block_size: u32,
}

/// Space and inode counts of the file system holding `fd`.
pub fn statfs(fd: BorrowedFd<'_>) -> io::Result<FsStat> {
    let mut s = MaybeUninit::<libc::statfs64>::uninit();
    // SAFETY: valid fd and output buffer.
    cvt(unsafe { libc::fstatfs64(fd.as_raw_fd(), s.as_mut_ptr()) })?;
    // SAFETY: filled by the kernel.
    let s = unsafe { s.assume_init() };
    let bs = s.f_bsize as u64;
    Ok(FsStat {
        bytes_avail: s.f_bavail.saturating_mul(bs),
        bytes_free: s.f_bfree.saturating_mul(bs),
        bytes_total: s.f_blocks.saturating_mul(bs),
        files_avail: s.f_ffree,
        files_free: s.f_ffree,
        files_total: s.f_files,
        block_size: u32::try_from(s.f_bsize).unwrap_or(0),
    })
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name, ready to hand to the `*at` calls.
    pub name: CString,
    /// Inode number.
    pub ino: u64,
    /// Position to resume reading after this entry (stable cookie).
    pub next: u64,
    /// The entry's type as the directory records it (`DT_REG`, `DT_DIR`,
    /// ...; `DT_UNKNOWN` where the file system does not say).
    pub kind: u8,
}

impl DirEntry {
    /// The file type bits (`S_IFREG`, ...) of the entry's type when it is
    /// not a directory; None for directories and unknown types.
    pub fn mode(&self) -> Option<u32> {
        Some(match self.kind {
            libc::DT_REG => libc::S_IFREG,
            libc::DT_LNK => libc::S_IFLNK,
            libc::DT_FIFO => libc::S_IFIFO,
            libc::DT_SOCK => libc::S_IFSOCK,
            libc::DT_CHR => libc::S_IFCHR,
            libc::DT_BLK => libc::S_IFBLK,
            _ => return None,
        })
    }
}

/// Largest directory read (`getdents64`) of a [`DirReader`].
const DIR_READ_MAX: usize = 32768;
/// Smallest: room for an entry of a 255-byte name and more (a read too
/// small for the next entry is made again with [`DIR_READ_MAX`]).
const DIR_READ_MIN: usize = 1024;

/// An open directory stream.
pub struct DirReader {
    fd: OwnedFd,
    buf: Vec<u8>,
    len: usize,
    pos: usize,
    done: bool,
    dots: bool,
    /// Bytes the next directory read asks for.
    read_size: usize,
    /// Records taken from the kernel so far, and their bytes.
    records: usize,
    record_bytes: usize,
}

impl DirReader {
    /// Opens the directory behind an O_PATH descriptor, positioned at `cookie`
    /// (0 = start).
    pub fn open(dir: BorrowedFd<'_>, cookie: u64) -> io::Result<Self> {
        let fd = reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
        if cookie != 0 {
            // SAFETY: valid fd.
            let r = unsafe { libc::lseek64(fd.as_raw_fd(), cookie as i64, libc::SEEK_SET) };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(DirReader {
            fd,
            buf: vec![0u8; DIR_READ_MAX],
            len: 0,
            pos: 0,
            done: false,
            dots: false,
            read_size: DIR_READ_MAX,
            records: 0,
            record_bytes: 0,
        })
    }

    /// Makes the next directory read ask for about as many entries as a
    /// caller expects to use: `entries` of them, sized by the records
    /// read so far. The entries a read brings beyond those are read for
    /// nothing: the file system collects and copies every one (ext4's
    /// hashed directories sort them first), and the stream is closed
    /// with the reply.
    pub fn expect(&mut self, entries: usize) {
        let per = if self.records == 0 {
            // Records of names up to 12 bytes; longer ones take more.
            32
        } else {
            self.record_bytes.div_ceil(self.records)
        };
        // A little over, so that a good guess needs no second read.
        let want = entries.saturating_mul(per).saturating_add(per * 8);
        self.read_size = want.clamp(DIR_READ_MIN, DIR_READ_MAX);
    }

    /// Makes [`DirReader::next_entry`] return "." and ".." too (NFSv3
    /// lists them; NFSv4 must not).
    pub fn with_dots(mut self) -> Self {
        self.dots = true;
        self
    }

    /// The next entry (other than "." and ".." unless
    /// [`DirReader::with_dots`]), or None at the end.
    pub fn next_entry(&mut self) -> io::Result<Option<DirEntry>> {
        loop {
            if self.pos >= self.len {
                if self.done {
                    return Ok(None);
                }
                let mut size = self.read_size.min(self.buf.len());
                let n = loop {
                    // SAFETY: valid fd and buffer of at least `size` bytes.
                    let n = unsafe {
                        libc::syscall(
                            libc::SYS_getdents64,
                            self.fd.as_raw_fd(),
                            self.buf.as_mut_ptr(),
                            size,
                        )
                    };
                    if n >= 0 {
                        break n;
                    }
                    let err = io::Error::last_os_error();
                    // EINVAL: the next entry does not fit (FUSE names
                    // run to 1,024 bytes): again with the whole buffer.
                    if err.raw_os_error() != Some(libc::EINVAL) || size == self.buf.len() {
                        return Err(err);
                    }
                    size = self.buf.len();
                };
                if n == 0 {
                    self.done = true;
                    return Ok(None);
                }
                self.len = n as usize;
                self.pos = 0;
            }
            let b = &self.buf[self.pos..self.len];
            if b.len() < 19 {
                self.pos = self.len;
                continue;
            }
            let ino = u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes"));
            let off = u64::from_ne_bytes(b[8..16].try_into().expect("8 bytes"));
            let reclen = u16::from_ne_bytes([b[16], b[17]]) as usize;
            let kind = b[18];
            if reclen < 19 || reclen > b.len() {
                self.pos = self.len;
                continue;
            }
            let name_raw = &b[19..reclen];
            self.pos += reclen;
            self.records += 1;
            self.record_bytes += reclen;
            // The kernel ends each name with a NUL within the record.
            let Some(end) = name_raw.iter().position(|&c| c == 0) else {
                continue;
            };
            let name = &name_raw[..end];
            if !self.dots && (name == b"." || name == b"..") {
                continue;
            }
            let name =
                CString::from_vec_with_nul(name_raw[..=end].to_vec()).expect("one NUL, at the end");
            return Ok(Some(DirEntry {
                name,
                ino,
                next: off,
                kind,
            }));
        }
    }
}

/// The magic number of the file system holding `fd` (statfs f_type).
pub fn fs_magic(fd: BorrowedFd<'_>) -> Option<libc::__fsword_t> {
    let mut s = std::mem::MaybeUninit::<libc::statfs64>::zeroed();
    // SAFETY: valid descriptor and output buffer.
    let r = unsafe { libc::fstatfs64(fd.as_raw_fd(), s.as_mut_ptr()) };
    // SAFETY: fstatfs64 succeeded and filled the buffer.
    (r == 0).then(|| unsafe { s.assume_init() }.f_type)
}

/// True for the file systems (by statfs magic) whose directory entries
/// carry the inode numbers that a stat of the entry gives: ext2/3/4, xfs,
/// btrfs and tmpfs. Elsewhere the two may differ: vfat and exfat number
/// inodes as they come into memory, FUSE file systems without `use_ino`
/// list unknown numbers, CIFS without server inode numbers makes its own,
/// and overlayfs keeps a lower layer's numbers in some setups.
pub fn numbers_in_directory(magic: libc::__fsword_t) -> bool {
    [EXT4_MAGIC, XFS_MAGIC, BTRFS_MAGIC, TMPFS_MAGIC].contains(&magic)
}

/// Statfs magic numbers (`f_type`) of the file systems the engine knows.
pub const EXT4_MAGIC: libc::__fsword_t = 0xef53;
/// xfs.
pub const XFS_MAGIC: libc::__fsword_t = 0x5846_5342;
/// btrfs.
pub const BTRFS_MAGIC: libc::__fsword_t = 0x9123_683e;
/// tmpfs.
pub const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;

/// Reads up to `len` bytes at `offset` into a new buffer, stopping early
/// only at the end of the file. The buffer is not zeroed first.
///
/// The first attempt does not block (`RWF_NOWAIT`): the returned flag is
/// true when every byte came straight from the page cache, false when the
/// read had to wait for the disk.
pub fn read_buf(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<(BytesMut, bool)> {
    if offset > i64::MAX as u64 {
        // Past the end of any file the kernel can hold.
        return Ok((BytesMut::new(), true));
    }
    let len = len.min((i64::MAX as u64 - offset) as usize);
    let mut buf = BytesMut::with_capacity(len);
    let mut cached = true;
    let mut nowait = NOWAIT_WORKS.load(Ordering::Relaxed);
    // The last read was a short non-blocking one: the rest is not cached,
    // or the file ends there, which the next (blocking) read tells.
    let mut short_nowait = false;
    while buf.len() < len {
        let done = buf.len();
        let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
        let n = pread_spare(fd, &mut buf, len - done, offset + done as u64, flags);
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if nowait => {
                    nowait = false;
                    cached = false;
                    continue;
                }
                Some(libc::EOPNOTSUPP) if nowait => {
                    // No non-blocking buffered reads on this kernel: from
                    // now on every read counts as a disk wait.
                    NOWAIT_WORKS.store(false, Ordering::Relaxed);
                    nowait = false;
                    cached = false;
                    continue;
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            if short_nowait {
                // End of file right after the short read: it was complete.
                cached = true;
            }
            break;
        }
        // SAFETY: the kernel initialised `n` more bytes.
        unsafe { buf.set_len(done + n as usize) };
        short_nowait = nowait && buf.len() < len;
        if short_nowait {
            nowait = false;
            cached = false;
        }
    }
    if !NOWAIT_WORKS.load(Ordering::Relaxed) {
        cached = false;
    }
    Ok((buf, cached))
}

/// One `preadv2` of up to `want` bytes at `offset` into the spare
/// capacity of `buf` (which must have that much); the raw result. The
/// caller extends `buf` by what was read.
fn pread_spare(
    fd: BorrowedFd<'_>,
    buf: &mut BytesMut,
    want: usize,
    offset: u64,
    flags: i32,
) -> isize {
    let spare = buf.spare_capacity_mut();
    assert!(spare.len() >= want, "read past the buffer");
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr() as *mut libc::c_void,
        iov_len: want,
    };
    // SAFETY: valid fd; the iovec covers spare capacity of `buf`, which
    // the kernel fills and the caller exposes only as far as filled.
    unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, offset as i64, flags) }
}

/// Reads up to `len` bytes at `offset` like [`read_buf`], but only from
/// the page cache: None when any of it would have to come from the disk
/// (or the kernel cannot tell, without non-blocking buffered reads).
pub fn read_cached(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Option<BytesMut>> {
    if !NOWAIT_WORKS.load(Ordering::Relaxed) {
        return Ok(None);
    }
    if offset > i64::MAX as u64 {
        return Ok(Some(BytesMut::new()));
    }
    let len = len.min((i64::MAX as u64 - offset) as usize);
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        let n = pread_spare(
            fd,
            &mut buf,
            len - done,
            offset + done as u64,
            libc::RWF_NOWAIT,
        );
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EOPNOTSUPP) => {
                    NOWAIT_WORKS.store(false, Ordering::Relaxed);
                    return Ok(None);
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            // End of file (a range not cached is EAGAIN, not 0).
            break;
        }
        // SAFETY: the kernel initialised `n` more bytes.
        unsafe { buf.set_len(done + n as usize) };
    }
    Ok(Some(buf))
}

/// Alignment of O_DIRECT reads: offsets, lengths and buffers are multiples
/// of this (the largest logical block size in common use).
pub const DIRECT_ALIGN: usize = 4096;

/// Whether the byte at `offset` can be read from the page cache without
/// waiting: its page is there and read in (`cached_fully` also counts
/// pages still being read in): a one-byte [`read_cached`].
pub fn page_ready(fd: BorrowedFd<'_>, offset: u64) -> bool {
    matches!(read_cached(fd, offset, 1), Ok(Some(b)) if b.len() == 1)
}

/// Whether every page of `len` bytes at `offset` is in the page cache,
/// asked with `cachestat(2)` (Linux 6.5), which starts no I/O: a
/// non-blocking read of a missing page would itself start reading it.
/// None when the kernel cannot tell.
///
/// Newer kernels answer cachestat only to a caller that may write the
/// file (or owns it), so that unprivileged users cannot watch each
/// other's reads through the cache. The server asks for itself, not for
/// the client whose identity the thread has taken on: when that identity
/// is refused, it asks again as root.
pub fn cached_fully(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Option<bool> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        const SYS_CACHESTAT: libc::c_long = 451;
        if !CACHESTAT_WORKS.load(Ordering::Relaxed) {
            return None;
        }
        let page = 4096u64;
        let first = offset / page * page;
        let end = offset.saturating_add(len.max(1));
        let range: [u64; 2] = [first, end - first];
        // nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted
        let mut out = [0u64; 5];
        let mut ask = || {
            // SAFETY: both pointers are to live arrays of the kernel's
            // layout (struct cachestat_range, struct cachestat); flags
            // must be 0.
            let r = unsafe {
                libc::syscall(
                    SYS_CACHESTAT,
                    fd.as_raw_fd(),
                    range.as_ptr(),
                    out.as_mut_ptr(),
                    0u32,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error().raw_os_error())
            }
        };
        let mut r = ask();
        if r == Err(Some(libc::EPERM)) {
            r = crate::cred::as_root(&mut ask);
        }
        if let Err(errno) = r {
            if errno == Some(libc::ENOSYS) {
                CACHESTAT_WORKS.store(false, Ordering::Relaxed);
            }
            return None;
        }
        // Pages past the end of the file count as missing: callers ask
        // only for ranges within it.
        let pages = (end - first).div_ceil(page);
        Some(out[0] >= pages)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (fd, offset, len);
        None
    }
}

static CACHESTAT_WORKS: AtomicBool = AtomicBool::new(true);

/// Reads up to `len` bytes at `offset` through an `O_DIRECT` descriptor,
/// straight from the device into a new buffer (no page cache, so no copy
/// out of it), stopping early only at the end of the file. `offset` must
/// be a multiple of [`DIRECT_ALIGN`]; the device is asked for `len`
/// rounded up to it. EINVAL means the file system refused the alignment
/// or direct I/O altogether.
pub fn read_direct(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Bytes> {
    if !offset.is_multiple_of(DIRECT_ALIGN as u64) || offset > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let want = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    // Huge-page memory, so that the device gets the read as one request.
    let mut buf = hugebuf::Buf::new(want)?;
    debug_assert_eq!(buf.as_mut_ptr() as usize % DIRECT_ALIGN, 0);
    let mut done = 0;
    while done < want {
        let iov = libc::iovec {
            // SAFETY: `done < want <= capacity`.
            iov_base: unsafe { buf.as_mut_ptr().add(done) } as *mut libc::c_void,
            iov_len: want - done,
        };
        // SAFETY: valid fd; the iovec covers the unfilled rest of `buf`.
        let n = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, (offset + done as u64) as i64, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
        if n == 0 || !(n as usize).is_multiple_of(DIRECT_ALIGN) {
            // The end of the file (a short read ends where the file does).
            break;
        }
    }
    Ok(buf.freeze(done.min(len)))
}

/// False once the kernel refused RWF_NOWAIT for buffered reads.
static NOWAIT_WORKS: AtomicBool = AtomicBool::new(true);

/// Writes all of `buf` at `offset`.
/// Writes `buf` at `offset` of the file `fd` is open on past the page
/// cache (O_DIRECT), through a descriptor of its own, from an aligned copy.
/// `offset` and `buf.len()` must be multiples of 4096. What the page cache
/// held of the range is written back first and dropped (the kernel does
/// so), so buffered readers see the new data. `Unsupported` when the file
/// system takes no O_DIRECT writes: the caller writes through the cache.
pub fn write_direct_at(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<usize> {
    if !offset.is_multiple_of(4096) || !buf.len().is_multiple_of(4096) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // The caller checked the client's right to write when it opened.
    let direct = crate::cred::as_root(|| reopen(fd, libc::O_WRONLY | libc::O_DIRECT)).map_err(
        |e| match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => io::ErrorKind::Unsupported.into(),
            _ => e,
        },
    )?;
    hugebuf::busy();
    let mut staged = hugebuf::Buf::new(buf.len())?;
    // SAFETY: the buffer holds at least buf.len() bytes and is not buf.
    let aligned = unsafe {
        std::ptr::copy_nonoverlapping(buf.as_ptr(), staged.as_mut_ptr(), buf.len());
        std::slice::from_raw_parts(staged.as_mut_ptr(), buf.len())
    };
    write_at(direct.as_fd(), aligned, offset).map_err(|e| match e.raw_os_error() {
        Some(libc::EINVAL) => io::ErrorKind::Unsupported.into(),
        _ => e,
    })
}

/// Writes all of `buf` at `offset` (short only when the disk fills).
pub fn write_at(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: valid fd and buffer bounds.
        let n = unsafe {
            libc::pwrite64(
                fd.as_raw_fd(),
                buf[done..].as_ptr() as *const libc::c_void,
                buf.len() - done,
                (offset + done as u64) as i64,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if done > 0 {
                break;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(done)
}

/// Flushes a file's data (and with `metadata`, its metadata) to stable storage.
pub fn sync(fd: BorrowedFd<'_>, metadata: bool) -> io::Result<()> {
    // SAFETY: valid fd.
    cvt(unsafe {
        if metadata {
            libc::fsync(fd.as_raw_fd())
        } else {
            libc::fdatasync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// A descriptor of `fd`'s object, opened for reading, to sync it with
/// [`sync`] (an O_PATH descriptor cannot be synced). Only for
/// directories (`dir`) and regular files: opening any other type could
/// start a device or wait for a FIFO's writer. Permission to read is
/// checked against the thread's identity, so callers act as root.
pub fn open_for_sync(fd: BorrowedFd<'_>, dir: bool) -> io::Result<OwnedFd> {
    let flags = if dir {
        libc::O_RDONLY | libc::O_DIRECTORY
    } else {
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY
    };
    reopen(fd, flags)
}

/// Starts writing a range of the file's dirty pages back to the device
/// and returns without waiting for them (`sync_file_range` with
/// SYNC_FILE_RANGE_WRITE): a later fsync then has less left to do. Makes
/// nothing durable by itself.
pub fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: valid fd; no memory arguments.
    cvt(unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            offset as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    })
    .map(drop)
}

/// syncfs: writes the whole file system of directory `dir` to stable
/// storage. `dir` may be an O_PATH descriptor (as the exports' roots are),
/// which syncfs itself refuses (EBADF): the directory is opened for
/// reading through it first.
pub fn sync_file_system(dir: BorrowedFd<'_>) -> io::Result<()> {
    let fd = reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    // SAFETY: valid fd.
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// The signal the kernel sends when a process wants a file this process
/// holds a lease on (see [`take_lease`]): SIGRTMIN + 2, so that it
/// carries the descriptor (`si_fd`).
pub fn lease_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

/// fcntl F_SETSIG (Linux): the signal sent for a descriptor's events.
const F_SETSIG: libc::c_int = 10;

/// Takes a lease (fcntl F_SETLEASE) on a descriptor: a read lease
/// (F_RDLCK) when `write` is false, a write lease (F_WRLCK) otherwise.
/// When another process opens the file for writing or truncates it (for a
/// write lease: opens it at all), the kernel sends [`lease_signal`] with
/// the descriptor and holds that open back until the lease is released
/// with [`release_lease`] (or `/proc/sys/fs/lease-break-time` passes).
/// A read lease fails with EAGAIN while the file is open for writing
/// anywhere; a write lease while it is open anywhere but through `fd`.
pub fn take_lease(fd: BorrowedFd<'_>, write: bool) -> io::Result<()> {
    let kind = if write { libc::F_WRLCK } else { libc::F_RDLCK };
    // SAFETY: valid descriptor; these fcntl commands take integers.
    unsafe {
        if libc::fcntl(fd.as_raw_fd(), F_SETSIG, lease_signal()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, kind) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Releases a lease taken with [`take_lease`].
pub fn release_lease(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid descriptor; F_SETLEASE takes an integer.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Blocks [`lease_signal`] in the calling thread and the threads it
/// starts afterwards, so that [`wait_lease_break`] can take it. Call it
/// before any other thread starts.
pub fn block_lease_signal() -> io::Result<()> {
    // SAFETY: a zeroed sigset_t is filled by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, lease_signal());
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// Waits for the next [`lease_signal`] (blocked with
/// [`block_lease_signal`]); the descriptor whose lease another process
/// wants broken.
pub fn wait_lease_break() -> io::Result<i32> {
    // SAFETY: zeroed sigset_t and siginfo_t are filled by the calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, lease_signal());
        let mut info: libc::siginfo_t = std::mem::zeroed();
        loop {
            let r = libc::sigwaitinfo(&set, &mut info);
            if r >= 0 {
                return Ok(sigpoll_fd(&info));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

/// `si_fd` of a SIGPOLL-style siginfo: after si_signo, si_errno, si_code
/// (and padding to 8 bytes on 64-bit), the union holds si_band (a long)
/// and then si_fd.
fn sigpoll_fd(info: &libc::siginfo_t) -> i32 {
    #[repr(C)]
    struct SigPoll {
        signo: libc::c_int,
        errno: libc::c_int,
        code: libc::c_int,
        #[cfg(target_pointer_width = "64")]
        _pad: libc::c_int,
        band: libc::c_long,
        fd: libc::c_int,
    }
    // SAFETY: siginfo_t is larger than SigPoll and laid out as above for
    // SIGPOLL-style signals on Linux.
    unsafe { (*(info as *const libc::siginfo_t as *const SigPoll)).fd }
}

/// Converts a name to an OsStr for logging.
pub fn display_name(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

/// An open file description lock (F_OFD_SETLK) of [start, end) on `fd`
/// (end u64::MAX: to the end of the file): a write lock, a read lock, or
/// with `kind` None an unlock. Such locks belong to the open file
/// description, so one descriptor per lock owner gives POSIX semantics per
/// owner, and they conflict with every other process's locks on the file,
/// on file systems that share locks between machines too. Never waits:
/// `WouldBlock` when another holder is in the way.
pub fn ofd_lock(fd: BorrowedFd<'_>, start: u64, end: u64, kind: Option<bool>) -> io::Result<()> {
    let Some(fl) = flock_of(start, end, kind) else {
        // Past what the kernel can lock: nobody else can lock there either.
        return Ok(());
    };
    // SAFETY: valid descriptor and struct.
    match cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) }) {
        Ok(_) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(libc::EAGAIN) || e.raw_os_error() == Some(libc::EACCES) =>
        {
            Err(io::ErrorKind::WouldBlock.into())
        }
        Err(e) => Err(e),
    }
}

/// The first lock another holder has that keeps [start, end) from a lock
/// of `write` kind through `fd` (F_OFD_GETLK): (start, end, write).
pub fn ofd_conflict(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    write: bool,
) -> io::Result<Option<(u64, u64, bool)>> {
    let Some(mut fl) = flock_of(start, end, Some(write)) else {
        return Ok(None);
    };
    // SAFETY: valid descriptor and struct.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) })?;
    if fl.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    let s = fl.l_start as u64;
    let e = if fl.l_len == 0 {
        u64::MAX
    } else {
        s.saturating_add(fl.l_len as u64)
    };
    Ok(Some((s, e, fl.l_type == libc::F_WRLCK as libc::c_short)))
}

fn flock_of(start: u64, end: u64, kind: Option<bool>) -> Option<libc::flock> {
    if start > i64::MAX as u64 {
        return None;
    }
    // SAFETY: flock is plain data; zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = match kind {
        Some(true) => libc::F_WRLCK,
        Some(false) => libc::F_RDLCK,
        None => libc::F_UNLCK,
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as i64;
    fl.l_len = if end > i64::MAX as u64 {
        0
    } else {
        (end - start) as i64
    };
    Some(fl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_file_system_of_an_o_path_directory_is_synced() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let path = open_path_at(dir.as_fd(), c".").unwrap();
        // syncfs itself refuses an O_PATH descriptor ...
        // SAFETY: valid fd.
        let raw = unsafe { libc::syncfs(path.as_raw_fd()) };
        assert_eq!(raw, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
        // ... which this opens for reading first.
        sync_file_system(path.as_fd()).unwrap();
    }

    #[test]
    fn direct_writes_replace_what_the_page_cache_held() {
        let f = disk_file("direct-write", &vec![b'a'; 3 << 20]);
        let w = reopen(f.as_fd(), libc::O_RDWR).unwrap();
        // Dirty pages over part of the range, then a direct write over all
        // of it: readers through the cache see the direct write's data.
        write_at(w.as_fd(), &vec![b'b'; 100_000], 4096).unwrap();
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
        match write_direct_at(w.as_fd(), &data, 4096) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return, // no O_DIRECT here
            r => assert_eq!(r.unwrap(), data.len()),
        }
        let (b, _) = read_buf(w.as_fd(), 0, 3 << 20).unwrap();
        assert!(b[..4096].iter().all(|&x| x == b'a'));
        assert_eq!(&b[4096..4096 + data.len()], &data[..]);
        assert!(b[4096 + data.len()..].iter().all(|&x| x == b'a'));
        // Past the end: the file grows.
        write_direct_at(w.as_fd(), &data[..8192], 3 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (3 << 20) + 8192);
        let e = write_direct_at(w.as_fd(), &data[..1000], 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(write_direct_at(w.as_fd(), &data[..4096], 100).is_err());
    }

    #[test]
    fn ofd_locks_are_per_description_and_seen_by_others() {
        let f = scratch_file("ofd");
        let a = reopen(f.as_fd(), libc::O_RDWR).unwrap();
        let b = reopen(f.as_fd(), libc::O_RDWR).unwrap();
        ofd_lock(a.as_fd(), 0, 100, Some(true)).unwrap();
        // One description's ranges merge and split like one owner's.
        ofd_lock(a.as_fd(), 50, 200, Some(false)).unwrap();
        let e = ofd_lock(b.as_fd(), 10, 20, Some(false)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(
            ofd_conflict(b.as_fd(), 0, u64::MAX, true).unwrap(),
            Some((0, 50, true))
        );
        // Read locks share.
        ofd_lock(b.as_fd(), 60, 70, Some(false)).unwrap();
        ofd_lock(a.as_fd(), 0, 50, None).unwrap();
        ofd_lock(b.as_fd(), 10, 20, Some(true)).unwrap();
        // To the end of the file, and past what the kernel can lock.
        assert!(ofd_lock(b.as_fd(), 300, u64::MAX, Some(true)).is_ok());
        assert!(ofd_lock(a.as_fd(), 400, 500, Some(false)).is_err());
        assert!(ofd_lock(a.as_fd(), 1 << 63, u64::MAX, Some(true)).is_ok());
        // Closing a description drops its locks.
        drop(b);
        ofd_lock(a.as_fd(), 0, u64::MAX, Some(true)).unwrap();
    }

    #[test]
    fn cached_reads_give_cached_data_and_refuse_the_rest() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let f = disk_file("cached", &data);
        // Just written: in the page cache.
        let b = read_cached(f.as_fd(), 1000, 100_000)
            .unwrap()
            .expect("cached");
        assert_eq!(&b[..], &data[1000..101_000]);
        // Up to the end of the file and past it.
        let b = read_cached(f.as_fd(), 250_000, 100_000)
            .unwrap()
            .expect("cached");
        assert_eq!(&b[..], &data[250_000..]);
        assert!(read_cached(f.as_fd(), 400_000, 10)
            .unwrap()
            .unwrap()
            .is_empty());
        // Dropped from the cache: refused, not read from the disk.
        f.sync_all().unwrap();
        // SAFETY: advice on a descriptor we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert!(read_cached(f.as_fd(), 0, 4096).unwrap().is_none());
        // A blocking read brings it back.
        let (b, _) = read_buf(f.as_fd(), 0, 4096).unwrap();
        assert_eq!(&b[..], &data[..4096]);
        assert_eq!(
            &read_cached(f.as_fd(), 0, 4096)
                .unwrap()
                .expect("cached again")[..],
            &data[..4096]
        );
    }

    #[test]
    fn direct_reads_match_buffered_reads_and_cachestat_sees_the_cache() {
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13 % 253) as u8).collect();
        let f = disk_file("direct", &data);
        let d = reopen(f.as_fd(), libc::O_RDONLY | libc::O_DIRECT);
        if cached_fully(f.as_fd(), 0, 1).is_some() {
            // Just written: cached.
            assert_eq!(cached_fully(f.as_fd(), 0, 1_000_000), Some(true));
            f.sync_all().unwrap();
            // SAFETY: advice on a descriptor we own.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(cached_fully(f.as_fd(), 0, 1_000_000), Some(false));
            assert_eq!(cached_fully(f.as_fd(), 4096, 8192), Some(false));
        }
        let d = d.expect("O_DIRECT open on the build's file system");
        let b = read_direct(d.as_fd(), 0, 262_144).unwrap();
        assert_eq!(&b[..], &data[..262_144]);
        assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
        // An odd length, and the end of the file inside the last block.
        let b = read_direct(d.as_fd(), 4096, 100_001).unwrap();
        assert_eq!(&b[..], &data[4096..104_097]);
        let b = read_direct(d.as_fd(), 983_040, 1 << 20).unwrap();
        assert_eq!(&b[..], &data[983_040..]);
        assert!(read_direct(d.as_fd(), 2 << 20, 4096).unwrap().is_empty());
        // Unaligned offsets are refused, not read wrong.
        let e = read_direct(d.as_fd(), 100, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        // Direct reads leave the page cache alone.
        if let Some(c) = cached_fully(f.as_fd(), 0, 262_144) {
            assert!(!c, "a direct read filled the page cache");
        }
    }

    /// The kernel answers cachestat only to callers that may write the
    /// file; the server's threads take on clients' identities, which
    /// often may not. The answer must not depend on that, or cold
    /// streams never go past the page cache.
    #[test]
    fn cachestat_answers_whatever_identity_the_thread_has() {
        let f = disk_file("cachestat-id", &vec![7u8; 65_536]);
        let Some(as_root) = cached_fully(f.as_fd(), 0, 65_536) else {
            return; // no cachestat in this kernel: nothing to compare
        };
        std::thread::spawn(move || {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return; // cannot take on another identity
            }
            let _nobody = crate::cred::assume(&crate::cred::Identity {
                uid: 65534,
                gid: 65534,
                groups: Vec::new(),
            });
            // The file is root's, mode 0644: not writable by this identity.
            assert_eq!(cached_fully(f.as_fd(), 0, 65_536), Some(as_root));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn read_buf_reads_to_eof_and_reports_cache() {
        let p = std::env::temp_dir().join(format!("sluice-readbuf-{}", std::process::id()));
        let mut f = std::fs::File::create(&p).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        drop(f);
        let f = std::fs::File::open(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        // Just written: in the page cache.
        let (b, cached) = read_buf(f.as_fd(), 10, 50_000).unwrap();
        assert_eq!(&b[..], &data[10..50_010]);
        assert!(cached || !NOWAIT_WORKS.load(Ordering::Relaxed));
        // Past the end: short, and still complete.
        let (b, _) = read_buf(f.as_fd(), 90_000, 50_000).unwrap();
        assert_eq!(&b[..], &data[90_000..]);
        let (b, _) = read_buf(f.as_fd(), 200_000, 10).unwrap();
        assert!(b.is_empty());
        let (b, _) = read_buf(f.as_fd(), u64::MAX - 5, 10).unwrap();
        assert!(b.is_empty());
        assert!(read_buf(f.as_fd(), (1 << 63) - 5, 1 << 20)
            .unwrap()
            .0
            .is_empty());
    }
}

#[cfg(test)]
mod create_tests {
    use super::*;

    #[test]
    fn create_file_never_opens_a_fifo_or_directory() {
        let d = std::env::temp_dir().join(format!("sluice-create-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        let dir = open_dir_path(&d).unwrap();
        mknod_at(dir.as_fd(), c"fifo", libc::S_IFIFO | 0o644, 0).unwrap();
        mkdir_at(dir.as_fd(), c"sub", 0o755).unwrap();
        // Opening a FIFO read-only would wait for a writer forever.
        let e = create_file(dir.as_fd(), c"fifo", 0o644, false, libc::O_RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMEDIUMTYPE));
        let e = create_file(dir.as_fd(), c"sub", 0o644, false, libc::O_RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
        let (_, created) = create_file(dir.as_fd(), c"f", 0o644, false, libc::O_RDWR).unwrap();
        assert!(created);
        let (_, created) = create_file(dir.as_fd(), c"f", 0o644, false, libc::O_RDONLY).unwrap();
        assert!(!created);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_rename_that_must_replace_nothing_leaves_an_existing_target() {
        let d = std::env::temp_dir().join(format!("sluice-noreplace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("a"), "a").unwrap();
        std::fs::write(d.join("b"), "b").unwrap();
        let dir = open_dir_path(&d).unwrap();
        let e = rename_noreplace(dir.as_fd(), c"a", dir.as_fd(), c"b").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(std::fs::read(d.join("a")).unwrap(), b"a");
        assert_eq!(std::fs::read(d.join("b")).unwrap(), b"b");
        rename_noreplace(dir.as_fd(), c"a", dir.as_fd(), c"c").unwrap();
        assert!(!d.join("a").exists());
        assert_eq!(std::fs::read(d.join("c")).unwrap(), b"a");
        let e = rename_noreplace(dir.as_fd(), c"a", dir.as_fd(), c"d").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
mod dir_tests {
    use super::*;

    /// Every entry of the directory behind `dir` from `cookie`, reading
    /// as a listing that expects `expect` more entries at each read would
    /// (None: full reads); and the most records one read brought.
    fn list(
        dir: BorrowedFd<'_>,
        cookie: u64,
        expect: Option<usize>,
    ) -> (Vec<(String, u64)>, usize) {
        let mut r = DirReader::open(dir, cookie).unwrap();
        let (mut out, mut most) = (Vec::new(), 0);
        loop {
            let reads = r.pos >= r.len;
            if let (true, Some(n)) = (reads, expect) {
                r.expect(n);
            }
            let Some(e) = r.next_entry().unwrap() else {
                break;
            };
            if reads {
                let (mut n, mut at) = (0, 0);
                while at + 19 <= r.len {
                    at += u16::from_ne_bytes([r.buf[at + 16], r.buf[at + 17]]) as usize;
                    n += 1;
                }
                most = most.max(n);
            }
            out.push((e.name.to_str().unwrap().to_owned(), e.next));
        }
        (out, most)
    }

    #[test]
    fn reads_sized_to_what_a_listing_expects_list_the_same_entries() {
        let d = std::env::temp_dir().join(format!("sluice-dirread-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        for i in 0..3000 {
            std::fs::write(d.join(format!("entry-{i:05}")), b"").unwrap();
        }
        let dir = open_dir_path(&d).unwrap();
        let (full, most_full) = list(dir.as_fd(), 0, None);
        assert_eq!(full.len(), 3000);
        // Full reads bring hundreds of these entries at once; a listing
        // that expects 20 more asks for a read of about that many.
        assert!(most_full > 500, "{most_full}");
        let (sized, most_sized) = list(dir.as_fd(), 0, Some(20));
        assert!(most_sized < 60, "a read brought {most_sized} entries");
        assert_eq!(sized, full);
        // From a cookie in the middle, the rest, in the same order.
        let (rest, _) = list(dir.as_fd(), full[1233].1, Some(7));
        assert_eq!(rest, full[1234..]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn directory_numbers_are_trusted_on_the_file_systems_that_keep_them() {
        // ext4, xfs, btrfs, tmpfs.
        for magic in [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994] {
            assert!(numbers_in_directory(magic), "{magic:#x}");
        }
        // vfat (msdos), exfat, FUSE, CIFS (SMB2), overlayfs, NFS.
        for magic in [
            0x4d44,
            0x2011_bab0,
            0x6573_5546,
            0xfe53_4d42,
            0x794c_7630,
            0x6969,
        ] {
            assert!(!numbers_in_directory(magic), "{magic:#x}");
        }
        let here = open_dir_path(&std::env::temp_dir()).unwrap();
        assert!(fs_magic(here.as_fd()).is_some());
    }

    #[test]
    fn a_read_too_small_for_the_next_entry_is_made_again_whole() {
        // getdents64 refuses (EINVAL) a buffer too small for the next
        // record: names of FUSE file systems run to 1,024 bytes, longer
        // than the smallest sized read leaves room for.
        let d = std::env::temp_dir().join(format!("sluice-dirlong-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        let long: Vec<String> = (0..5).map(|i| format!("{i}{}", "n".repeat(254))).collect();
        for name in &long {
            std::fs::write(d.join(name), b"").unwrap();
        }
        let dir = open_dir_path(&d).unwrap();
        let mut r = DirReader::open(dir.as_fd(), 0).unwrap();
        let mut names = Vec::new();
        loop {
            // Room for about 100 bytes: not one of these records.
            r.read_size = 100;
            match r.next_entry().unwrap() {
                Some(e) => names.push(e.name.to_str().unwrap().to_owned()),
                None => break,
            }
        }
        names.sort();
        assert_eq!(names, long);
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
#[test]
fn identity_agrees_with_stat() {
    let f = scratch_file("identity");
    let (a, b) = (stat(f.as_fd()).unwrap(), identity(f.as_fd()).unwrap());
    assert_eq!(
        (a.dev, a.ino, a.mode, a.nlink),
        (b.dev, b.ino, b.mode, b.nlink)
    );
}

/// An unnamed file holding `data`, open for reading, on the disk-backed
/// file system next to the build, for tests that need page-cache eviction
/// or O_DIRECT (the temp directory may be tmpfs, whose pages never leave
/// memory).
#[cfg(test)]
pub(crate) fn disk_file(tag: &str, data: &[u8]) -> std::fs::File {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        ".sluice-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&p, data).expect("write a file next to the build");
    let f = std::fs::File::open(&p).expect("open it");
    std::fs::remove_file(&p).expect("unlink it");
    f
}

/// An unnamed read-write file in the temp directory, for tests.
#[cfg(test)]
pub(crate) fn scratch_file(tag: &str) -> std::fs::File {
    let p = std::env::temp_dir().join(format!(
        "sluice-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .expect("create a scratch file");
    std::fs::remove_file(&p).expect("unlink the scratch file");
    f
}
