//! NFSv3 (RFC 1813): the 22 procedures over the same engine, exports,
//! access rules, range locks and read path as NFSv4.
//!
//! NFSv3 has no opens: READ and WRITE open the file for each call (as
//! the Linux server does), with the owner allowed to read and write what
//! its mode bits would refuse, since the client checked access when its
//! application opened the file. A v3 change to a file recalls the NFSv4
//! delegations it conflicts with (NFS3ERR_JUKEBOX until they are back),
//! and v3 READ and WRITE take the same range locks as v4's.

use super::attrs::SetAttrs;
use super::by_file::ByFile;
use super::context::{Ctx, Fh, Stop};
use super::exports::Loc;
use super::ops_fs::{
    apply_attrs, child_or_block, commit_dir, commit_meta, component_of, deleg_conflicts, may,
    rename_checked,
};
use super::Server;
use crate::engine::cred;
use crate::engine::fs::{self, SetTime, Stat, Time};
use crate::engine::read::{Mode, ReadAt, ReadError};
use crate::nfs3::{
    self, access3, ftype3, post_op_attr, post_op_fh, proc3, stable, status, wcc_data, Args3,
    CreateHow3, DirOp, Fattr3, MknodData3, Nfsstat3, Sattr3, SetTime3, Time3, WccAttr,
};
use crate::nfs4::consts::status as v4;
use crate::nfs4::msg::Component4;
use crate::nfs4::Nfsstat4;
use crate::rpc::Cred;
use crate::xdr::{Decoder, Encoder};
use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What became of an NFSv3 call.
pub(super) enum Done3 {
    /// The results (after the accepted reply header).
    Reply(Encoder),
    /// The arguments did not decode: GARBAGE_ARGS.
    Garbage,
    /// No such procedure: PROC_UNAVAIL.
    NoProc,
    /// It would have to wait where it must not (see
    /// `context::must_not_wait`); nothing was changed.
    WouldBlock,
    /// The results, to be sent once the directory syncs the procedure
    /// left are done (see `Ctx::deferred`): REMOVE, RMDIR and RENAME on
    /// a `sync` export, run with `defer`. Their results have the same
    /// form whatever the status, which a failed sync replaces.
    Syncing(Encoder, Vec<super::dirsync::Pending>),
}

/// Runs NFSv3 procedure `proc_` with the arguments in `args`; with
/// `defer`, the directory syncs of a `sync` export are left to the caller
/// ([`Done3::Syncing`]).
pub(super) fn call(
    srv: &Server,
    proc_: u32,
    args: &[u8],
    cred: &Cred,
    peer: Option<IpAddr>,
    lend: bool,
    defer: bool,
) -> Done3 {
    let mut d = Decoder::new(args);
    let a = match Args3::decode(proc_, &mut d) {
        None => return Done3::NoProc,
        Some(Err(_)) => return Done3::Garbage,
        Some(Ok(a)) => a,
    };
    let mut cx = Ctx {
        srv,
        cred,
        peer,
        conn: None,
        minor: 0,
        id: Server::identity(cred, &srv.exports.list()[0].rules),
        cur: None,
        saved: None,
        session: None,
        cur_sid: None,
        saved_sid: None,
        cur_stat: None,
        cur_identity: None,
        lend,
        deferred: defer.then(Default::default),
    };
    // The thread may still have the identity of a caller before (see
    // `cred::lending`): kept when it is this caller's (checked again
    // once the object's export is known, see `resolve_stat`). Every
    // procedure runs as the caller once it has found its object, or
    // only reads attributes or data through descriptors, or flushes one.
    cred::keep_lent_for(&cx.id, true);
    let mut e = Encoder::with_capacity(256);
    let r = run(&mut cx, a, &mut e);
    let pending = cx.deferred.map(|d| d.into_inner()).unwrap_or_default();
    match r {
        Ok(()) if !pending.is_empty() => Done3::Syncing(e, pending),
        Ok(()) => Done3::Reply(e),
        Err(Stop::WouldBlock) => Done3::WouldBlock,
        Err(Stop::Status(_)) => unreachable!("statuses are encoded by the procedures"),
    }
}

/// Whether procedure `proc_` may be tried on the connection's task: it
/// only looks at an object's attributes (as NFSv4's GETATTR and ACCESS
/// do there), or it reads or looks up and stops with WouldBlock where it
/// would wait.
pub(super) fn may_try(proc_: u32) -> bool {
    matches!(
        proc_,
        proc3::NULL
            | proc3::GETATTR
            | proc3::ACCESS
            | proc3::LOOKUP
            | proc3::READ
            | proc3::FSINFO
            | proc3::PATHCONF
    )
}

/// Whether procedure `proc_`, with arguments `args`, may run on the
/// connection's task when the server lets it run quick work there (see
/// [`super::inline`]): the procedures that do what NFSv4's QUICK ops do,
/// as a worker would do them. Not a WRITE that goes to storage, nor a
/// SETATTR of the size; and while any export has `sync` (the default),
/// no procedure that syncs what it changed before its answer (see
/// `ops_fs::commit_meta`) but REMOVE, RMDIR, and RENAME while a sync of
/// its target directory runs, whose next sync the caller waits for
/// ([`Done3::Syncing`]): not those that make or link names, nor SETATTR
/// (as NFSv4's CREATE, OPEN that creates, LINK and SETATTR), nor a
/// RENAME whose directory no sync is running for, which a worker renames
/// and syncs on one thread (see `compound::quick_args`).
pub(super) fn quick(srv: &Server, proc_: u32, args: &[u8]) -> bool {
    let mut d = Decoder::new(args);
    let Some(Ok(a)) = Args3::decode(proc_, &mut d) else {
        return false;
    };
    let commits = || srv.exports.list().iter().any(|e| e.rules.sync);
    match a {
        Args3::Setattr(_, s, _) => s.size.is_none() && !commits(),
        Args3::Create(..)
        | Args3::Mkdir(..)
        | Args3::Symlink(..)
        | Args3::Mknod(..)
        | Args3::Link(..) => !commits(),
        Args3::Remove(..) | Args3::Rmdir(..) => true,
        Args3::Rename(_, to) => !commits() || rename_here(srv, to.dir),
        Args3::Write(_, _, how, data) => {
            how == stable::UNSTABLE && super::inline::small_cached_write(srv, data.len())
        }
        Args3::Readdir(..) | Args3::Readdirplus(..) | Args3::Readlink(..) => true,
        _ => false,
    }
}

/// Whether a RENAME into the directory that handle `wire` names runs on
/// the connection's task (see [`quick`]): when its export does not sync
/// changes, or a sync of the directory is running; also when the handle
/// is not a directory of an export, which RENAME answers with an error
/// at once.
fn rename_here(srv: &Server, wire: &[u8]) -> bool {
    let Ok((fd, Loc::Export(i), st)) = srv.exports.resolve_with(wire, false) else {
        return true;
    };
    if !srv.exports.list()[i].rules.sync {
        return true;
    }
    let st = match st {
        Some(st) => st,
        None => match fs::identity(fd.as_fd()) {
            Ok(st) => st,
            Err(_) => return true,
        },
    };
    !st.is_dir() || srv.dir_syncs.running((st.dev, st.ino))
}

type R<T> = Result<T, Nfsstat3>;

fn st3(st: Nfsstat4) -> Nfsstat3 {
    Nfsstat3::from(st)
}

fn io3<T>(r: io::Result<T>) -> R<T> {
    r.map_err(|e| st3(Nfsstat4::from(&e)))
}

fn time3(t: Time) -> Time3 {
    Time3 {
        sec: t.sec.clamp(0, u32::MAX as i64) as u32,
        nsec: t.nsec,
    }
}

fn ftype_of(mode: u32) -> u32 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => ftype3::DIR,
        libc::S_IFLNK => ftype3::LNK,
        libc::S_IFBLK => ftype3::BLK,
        libc::S_IFCHR => ftype3::CHR,
        libc::S_IFSOCK => ftype3::SOCK,
        libc::S_IFIFO => ftype3::FIFO,
        _ => ftype3::REG,
    }
}

/// The fattr3 of `st`, an object of export `loc`.
fn fattr(cx: &Ctx<'_>, loc: Loc, st: &Stat) -> Fattr3 {
    let fsid = match loc {
        // Exports on one device are told apart by their number.
        Loc::Export(i) => cx.srv.exports.list()[i].fs.dev() ^ ((i as u64) << 48),
        Loc::Pseudo(_) => 0,
    };
    Fattr3 {
        ftype: ftype_of(st.mode),
        mode: st.mode & 0o7777,
        nlink: st.nlink.min(u32::MAX as u64) as u32,
        uid: st.uid,
        gid: st.gid,
        size: st.size,
        used: st.blocks.saturating_mul(512),
        rdev: (libc::major(st.rdev), libc::minor(st.rdev)),
        fsid,
        fileid: st.ino,
        atime: time3(st.atime),
        mtime: time3(st.mtime),
        ctime: time3(st.ctime),
    }
}

/// The attributes of `fh` now, if they can be had.
fn attrs_of(cx: &Ctx<'_>, fh: &Fh) -> Option<Fattr3> {
    fs::stat(fh.fd.as_fd())
        .ok()
        .map(|st| fattr(cx, fh.loc, &st))
}

fn wcc_of(cx: &Ctx<'_>, fh: &Fh, st: &Stat) -> WccAttr {
    fattr(cx, fh.loc, st).wcc()
}

/// Resolves an NFSv3 handle, sets the caller's identity for its export
/// (`Ctx::id`), and gives the object's full status, read by the stat
/// that checks the handle (see `Export::resolve_with`): one stat where a
/// procedure answers attributes.
fn resolve_stat(cx: &mut Ctx<'_>, wire: &[u8]) -> R<(Fh, Stat)> {
    let (fh, st) = cx.resolve_with(wire, true).map_err(st3)?;
    let Loc::Export(i) = fh.loc else {
        // NFSv3 clients mount exports, never the NFSv4 pseudo root.
        return Err(status::BADHANDLE);
    };
    cx.id = Server::identity(cx.cred, &cx.srv.exports.list()[i].rules);
    // The identity a thread kept (see `cred::lending`) was checked
    // against the first export's; this one's may squash otherwise.
    cred::keep_lent_for(&cx.id, true);
    let st = match st {
        Some(st) => st,
        None => io3(fs::stat(fh.fd.as_fd()))?,
    };
    Ok((fh, st))
}

/// A handle as an NFSv3 reply carries it: within the configured size.
fn fh_out<'b>(cx: &Ctx<'_>, wire: &'b [u8]) -> R<&'b [u8]> {
    if wire.len() > cx.srv.config.v3_max_fh {
        tracing::warn!(
            len = wire.len(),
            max = cx.srv.config.v3_max_fh,
            "a file handle is longer than NFSv3 clients accept here (--v3-max-fh)"
        );
        return Err(status::SERVERFAULT);
    }
    Ok(wire)
}

fn read_only(cx: &Ctx<'_>, fh: &Fh) -> R<()> {
    if cx.ex(fh).rules.read_only {
        Err(status::ROFS)
    } else {
        Ok(())
    }
}

fn is_dir(st: &Stat) -> R<()> {
    if st.is_dir() {
        Ok(())
    } else {
        Err(status::NOTDIR)
    }
}

/// A name to create or remove: not empty, not "." or "..", no '/'.
fn name(n: &[u8]) -> R<CString> {
    component_of(&Component4(n.to_vec())).map_err(|st| match st {
        v4::BADNAME if n == b"." || n == b".." => status::EXIST,
        v4::BADNAME => status::ACCES,
        st => st3(st),
    })
}

/// What a sattr3 sets. A time with nanoseconds of a second or more is
/// NFS3ERR_INVAL, as from the Linux server (and NFSv4's SETATTR).
fn settable(a: &Sattr3) -> R<SetAttrs> {
    let t = |t: SetTime3| match t {
        SetTime3::Keep => Ok(SetTime::Keep),
        SetTime3::Server => Ok(SetTime::Now),
        SetTime3::Client(t) if t.nsec >= 1_000_000_000 => Err(status::INVAL),
        SetTime3::Client(t) => Ok(SetTime::At(Time {
            sec: t.sec as i64,
            nsec: t.nsec,
        })),
    };
    Ok(SetAttrs {
        size: a.size,
        mode: a.mode.map(|m| m & 0o7777),
        uid: a.uid,
        gid: a.gid,
        atime: t(a.atime)?,
        mtime: t(a.mtime)?,
        mask: [0; 3],
    })
}

/// Descriptors NFSv3 READ and WRITE opened (and CREATE made), kept for
/// the next call of the same caller on the same file: NFSv3 has no opens,
/// and opening for every call costs two system calls and loses what the
/// kernel was told about the file's access pattern (random reads). A
/// descriptor unused for [`FileCache::IDLE`] is closed, so a removed
/// file's blocks are freed soon after its last use; REMOVE and a RENAME
/// over the file close its descriptors at once ([`FileCache::forget`]).
#[derive(Debug, Default)]
pub struct FileCache {
    files: std::sync::Mutex<Files>,
}

#[derive(Debug, Default)]
struct Files {
    /// By file, its descriptors: one per caller and access.
    kept: ByFile<Kept>,
    /// When `put` last closed the idle descriptors.
    swept: Option<std::time::Instant>,
}

#[derive(Debug)]
struct Kept {
    who: Who,
    fd: Arc<OwnedFd>,
    used: std::time::Instant,
}

/// (uid, gid, groups' hash, for writing).
type Who = (u32, u32, u64, bool);

/// (device, inode, uid, gid, groups' hash, for writing).
type FileCacheKey = (u64, u64, u32, u32, u64, bool);

fn split(key: &FileCacheKey) -> ((u64, u64), Who) {
    ((key.0, key.1), (key.2, key.3, key.4, key.5))
}

impl FileCache {
    /// How long an unused descriptor is kept.
    pub const IDLE: std::time::Duration = std::time::Duration::from_secs(2);
    /// Most descriptors kept.
    const MAX: usize = 1024;
    /// How often at most a `put` into a half-full cache looks for idle
    /// descriptors to close: the look goes over every entry, which for a
    /// client creating thousands of files was 5% of the server's time when
    /// every `put` did it.
    const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

    fn lock(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept descriptor of `file` open for writing, whoever opened it.
    pub(super) fn writer(&self, file: (u64, u64)) -> Option<Arc<OwnedFd>> {
        let f = self.lock();
        f.kept
            .of(file)
            .iter()
            .find(|k| k.who.3)
            .map(|k| k.fd.clone())
    }

    fn get(&self, key: &FileCacheKey) -> Option<Arc<OwnedFd>> {
        let (file, who) = split(key);
        let mut f = self.lock();
        let k = f.kept.of_mut(file).iter_mut().find(|k| k.who == who)?;
        k.used = std::time::Instant::now();
        Some(k.fd.clone())
    }

    fn put(&self, key: FileCacheKey, fd: Arc<OwnedFd>) {
        let now = std::time::Instant::now();
        // Declared before the lock's guard, so dropped after it: what is
        // closed here is closed outside the lock (see `by_file`).
        let mut gone = Vec::new();
        let mut f = self.lock();
        let due = f
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= Self::SWEEP_EVERY);
        if f.kept.len() >= Self::MAX / 2 && due {
            gone = f
                .kept
                .retain(|k| now.saturating_duration_since(k.used) < Self::IDLE);
            f.swept = Some(now);
        }
        if f.kept.len() >= Self::MAX {
            // Full of descriptors used within IDLE (a client making files
            // faster than MAX a second): the older half goes, so the newest
            // (the ones the next calls are for) are kept.
            let mut used: Vec<std::time::Instant> = f.kept.iter().map(|k| k.used).collect();
            let mid = used.len() / 2;
            let (_, cut, _) = used.select_nth_unstable(mid);
            let cut = *cut;
            gone.extend(f.kept.retain(|k| k.used > cut));
        }
        let (file, who) = split(&key);
        gone.extend(f.kept.retain_of(file, |k| k.who != who));
        f.kept.push(file, Kept { who, fd, used: now });
    }

    /// Closes the descriptors of `file` (removed, or renamed over).
    pub fn forget(&self, file: (u64, u64)) {
        let gone = self.lock().kept.remove(file);
        // Closed here, outside the lock (see `by_file`).
        drop(gone);
    }

    /// Closes the descriptors unused for [`FileCache::IDLE`].
    pub fn sweep(&self) {
        let now = std::time::Instant::now();
        let gone = {
            let mut f = self.lock();
            f.swept = Some(now);
            f.kept
                .retain(|k| now.saturating_duration_since(k.used) < Self::IDLE)
        };
        drop(gone);
    }

    /// Descriptors held.
    pub fn len(&self) -> usize {
        self.lock().kept.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The [`FileCache`] key of the caller's descriptor of `st` (for
/// writing or reading).
fn io_key(cx: &Ctx<'_>, st: &Stat, write: bool) -> FileCacheKey {
    let groups = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        cx.id.groups.hash(&mut h);
        h.finish()
    };
    (st.dev, st.ino, cx.id.uid, cx.id.gid, groups, write)
}

/// Opens the file for I/O as the caller, or as root when the caller owns
/// it (the owner may read and write its own file whatever the mode bits
/// say: the client checked at open). A descriptor this caller opened
/// before is used again while the mode bits still allow the access (or
/// the caller owns the file).
fn open_io(cx: &Ctx<'_>, fh: &Fh, st: &Stat, write: bool) -> R<Arc<OwnedFd>> {
    let flags = if write {
        libc::O_WRONLY
    } else {
        libc::O_RDONLY
    };
    let key = io_key(cx, st, write);
    let cache = &cx.srv.v3_files;
    let allowed = cx.id.uid == st.uid || may(st, cx, if write { 0o2 } else { 0o4 });
    if allowed {
        if let Some(fd) = cache.get(&key) {
            return Ok(fd);
        }
    }
    cx.srv.state.before_own_open((st.dev, st.ino));
    // The caller's permissions decide (READ does not run as the caller
    // otherwise; WRITE already does).
    let _as = cred::assume(&cx.id);
    let fd = match fs::reopen(fh.fd.as_fd(), flags) {
        Ok(fd) => Arc::new(fd),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) && cx.id.uid == st.uid => {
            io3(cred::as_root(|| fs::reopen(fh.fd.as_fd(), flags))).map(Arc::new)?
        }
        Err(e) => return io3(Err(e)),
    };
    // A write lease (an NFSv4 write delegation) needs no other
    // descriptor open: none is kept for a file under delegation.
    if !cx.srv.state.write_delegated((st.dev, st.ino)) {
        cache.put(key, fd.clone());
    }
    Ok(fd)
}

/// The regular file behind `fh`.
fn file(st: &Stat) -> R<()> {
    if st.is_file() {
        Ok(())
    } else if st.is_dir() {
        Err(status::ISDIR)
    } else {
        Err(status::INVAL)
    }
}

fn run(cx: &mut Ctx<'_>, a: Args3<'_>, e: &mut Encoder) -> Result<(), Stop> {
    let started = e.len();
    // Each procedure writes its status and results; `fail` (the status
    // with the results a failure carries) runs when it returns an error.
    let mut fail_attrs: Option<Fattr3> = None;
    let mut fail_wcc: Vec<(Option<WccAttr>, Option<Fattr3>)> = Vec::new();
    let shape = Shape::of(&a);
    let r: Result<(), Stop> = (|| {
        match a {
            Args3::Null => Ok(()),
            Args3::Getattr(fh) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                e.u32(0);
                fattr(cx, fh.loc, &st).encode(e);
                Ok(())
            }
            Args3::Setattr(fh, sa, guard) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                let _as = cred::assume_kept(&cx.id);
                let before = wcc_of(cx, &fh, &st);
                fail_wcc.push((Some(before), Some(fattr(cx, fh.loc, &st))));
                if let Some(g) = guard {
                    if time3(st.ctime) != g {
                        return Err(status::NOT_SYNC.into());
                    }
                }
                read_only(cx, &fh)?;
                let set = settable(&sa)?;
                deleg_conflicts(
                    cx,
                    (st.dev, st.ino),
                    set.size.is_some() || set.mode.is_some(),
                )
                .map_err(st3)?;
                if set.size.is_some() {
                    cx.srv.state.before_own_open((st.dev, st.ino));
                }
                {
                    let key = (st.dev, st.ino);
                    let _exclusive = set
                        .size
                        .map(|n| cx.srv.locks.write(key, n.min(st.size), u64::MAX));
                    let r = apply_attrs(&fh, &st, &set).map_err(st3);
                    let r = match r {
                        // The owner may truncate its own file (as with
                        // WRITE, the client checked at open).
                        Err(status::ACCES) if set.size.is_some() && cx.id.uid == st.uid => {
                            cred::as_root(|| {
                                apply_attrs(
                                    &fh,
                                    &st,
                                    &SetAttrs {
                                        size: set.size,
                                        ..Default::default()
                                    },
                                )
                            })
                            .map_err(st3)
                            .and_then(|_| {
                                apply_attrs(
                                    &fh,
                                    &st,
                                    &SetAttrs {
                                        size: None,
                                        ..set.clone()
                                    },
                                )
                                .map_err(st3)
                            })
                        }
                        r => r,
                    };
                    cx.srv.file_changed(key);
                    fail_wcc[0].1 = attrs_of(cx, &fh);
                    r?;
                }
                commit_meta(cx, &fh, &st).map_err(st3)?;
                e.u32(0);
                wcc_data(e, Some(&before), attrs_of(cx, &fh).as_ref());
                Ok(())
            }
            Args3::Lookup(DirOp { dir, name: n }) => {
                let (dir, dst) = resolve_stat(cx, dir)?;
                let _as = cred::assume_kept(&cx.id);
                fail_attrs = Some(fattr(cx, dir.loc, &dst));
                is_dir(&dst)?;
                let (fh, st) = lookup(cx, &dir, &dst, n)?;
                e.u32(0);
                e.opaque(fh_out(cx, &fh.wire)?);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                post_op_attr(e, Some(&fattr(cx, dir.loc, &dst)));
                Ok(())
            }
            Args3::Access(fh, want) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                let (r, w, x) = (may(&st, cx, 0o4), may(&st, cx, 0o2), may(&st, cx, 0o1));
                let ro = cx.ex(&fh).rules.read_only;
                let mut granted = 0;
                if r {
                    granted |= access3::READ;
                }
                if w && !ro {
                    granted |= access3::MODIFY | access3::EXTEND;
                }
                if st.is_dir() {
                    if x {
                        granted |= access3::LOOKUP;
                        if w && !ro {
                            granted |= access3::DELETE;
                        }
                    }
                } else if x {
                    granted |= access3::EXECUTE;
                }
                e.u32(0);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                e.u32(granted & want);
                Ok(())
            }
            Args3::Readlink(fh) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                fail_attrs = Some(fattr(cx, fh.loc, &st));
                if !st.is_symlink() {
                    return Err(status::INVAL.into());
                }
                let target = io3(fs::readlink(fh.fd.as_fd()))?;
                e.u32(0);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                e.opaque(&target);
                Ok(())
            }
            Args3::Read(fh, offset, count) => read(cx, fh, offset, count, e, &mut fail_attrs),
            Args3::Write(fh, offset, how, data) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                let _as = cred::assume_kept(&cx.id);
                let before = wcc_of(cx, &fh, &st);
                fail_wcc.push((Some(before), Some(fattr(cx, fh.loc, &st))));
                read_only(cx, &fh)?;
                file(&st)?;
                // Past the export's limit: a short write, which clients
                // resume.
                let data = &data[..data.len().min(cx.ex(&fh).rules.max_write as usize)];
                if offset
                    .checked_add(data.len() as u64)
                    .is_none_or(|end| end > i64::MAX as u64)
                {
                    return Err(status::FBIG.into());
                }
                deleg_conflicts(cx, (st.dev, st.ino), true).map_err(st3)?;
                let fd = open_io(cx, &fh, &st, true)?;
                let key = (st.dev, st.ino);
                // The verifier before the write (see NFSv4's WRITE).
                let verifier = cx.srv.write_verifier();
                let witness = if how != stable::UNSTABLE {
                    cx.srv.flush_witness(key, fh.fd.as_fd())
                } else {
                    None
                };
                let (n, cached) = {
                    let _exclusive = cx.srv.locks.write(key, offset, offset + data.len() as u64);
                    let written = io3(super::ops_file::write_data(
                        cx.srv,
                        key,
                        fd.as_fd(),
                        data,
                        offset,
                    ));
                    cx.srv.file_changed(key);
                    written?
                };
                if cached && how == stable::UNSTABLE {
                    super::ops_file::write_behind(cx.srv, fd.as_fd(), offset, n);
                }
                if how != stable::UNSTABLE {
                    let metadata = how == stable::FILE_SYNC;
                    super::ops_file::stable_flush(cx.srv, key, witness, &fd, metadata, verifier)
                        .map_err(st3)?;
                }
                e.u32(0);
                wcc_data(e, Some(&before), attrs_of(cx, &fh).as_ref());
                e.u32(n as u32);
                e.u32(how);
                e.opaque_fixed(&verifier);
                Ok(())
            }
            Args3::Create(w, how) => {
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                let _as = cred::assume_kept(&cx.id);
                let n = name(w.name)?;
                let (fh, st) = create(cx, &dir, &n, &how)?;
                made(cx, e, &dir, &before, &fh, &st)
            }
            Args3::Mkdir(w, sa) => {
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                let _as = cred::assume_kept(&cx.id);
                let n = name(w.name)?;
                let set = settable(&sa)?;
                io3(fs::mkdir_at(dir.fd.as_fd(), &n, set.mode.unwrap_or(0o755)))?;
                let (fh, st) = made_attrs(cx, &dir, &n, &set)?;
                made(cx, e, &dir, &before, &fh, &st)
            }
            Args3::Symlink(w, sa, target) => {
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                let _as = cred::assume_kept(&cx.id);
                let n = name(w.name)?;
                if target.is_empty() {
                    return Err(status::INVAL.into());
                }
                let t = CString::new(target).map_err(|_| status::INVAL)?;
                let set = SetAttrs {
                    mode: None,
                    size: None,
                    ..settable(&sa)?
                };
                io3(fs::symlink_at(dir.fd.as_fd(), &n, &t))?;
                let (fh, st) = made_attrs(cx, &dir, &n, &set)?;
                made(cx, e, &dir, &before, &fh, &st)
            }
            Args3::Mknod(w, what) => {
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                let _as = cred::assume_kept(&cx.id);
                let n = name(w.name)?;
                let (kind, sa, rdev) = match what {
                    MknodData3::Device(t, sa, major, minor) => {
                        let k = if t == ftype3::CHR {
                            libc::S_IFCHR
                        } else {
                            libc::S_IFBLK
                        };
                        (k, sa, libc::makedev(major, minor))
                    }
                    MknodData3::Pipe(t, sa) => {
                        let k = if t == ftype3::FIFO {
                            libc::S_IFIFO
                        } else {
                            libc::S_IFSOCK
                        };
                        (k, sa, 0)
                    }
                    MknodData3::Other(_) => return Err(status::BADTYPE.into()),
                };
                let set = settable(&sa)?;
                io3(fs::mknod_at(
                    dir.fd.as_fd(),
                    &n,
                    kind | set.mode.unwrap_or(0o644),
                    rdev,
                ))?;
                let (fh, st) = made_attrs(cx, &dir, &n, &set)?;
                made(cx, e, &dir, &before, &fh, &st)
            }
            Args3::Remove(w) | Args3::Rmdir(w) => {
                let rmdir = shape == Shape::Rmdir;
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                let _as = cred::assume_kept(&cx.id);
                // "." and "..": as rmdir(2) answers for RMDIR; NFS3ERR_ACCES
                // for REMOVE, as from the Linux server (NFS3ERR_EXIST is not
                // one of REMOVE's errors in RFC 1813 section 3.3.12).
                let n = match name(w.name) {
                    Err(status::EXIST) if rmdir && w.name == b"." => Err(status::INVAL),
                    Err(status::EXIST) if rmdir => Err(status::NOTEMPTY),
                    Err(status::EXIST) => Err(status::ACCES),
                    r => r,
                }?;
                let st = io3(fs::stat_at(dir.fd.as_fd(), &n))?;
                if rmdir && !st.is_dir() {
                    return Err(status::NOTDIR.into());
                }
                if !rmdir && st.is_dir() {
                    return Err(status::ISDIR.into());
                }
                deleg_conflicts(cx, (st.dev, st.ino), true).map_err(st3)?;
                io3(fs::unlink_at(dir.fd.as_fd(), &n, rmdir))?;
                if st.nlink <= 1 && !st.is_dir() {
                    cx.srv.file_unlinked((st.dev, st.ino));
                }
                if st.nlink <= 1 || st.is_dir() {
                    cx.ex(&dir).fs.forget_inode(&st);
                }
                commit_dir(cx, &dir).map_err(st3)?;
                e.u32(0);
                wcc_data(e, Some(&before), attrs_of(cx, &dir).as_ref());
                Ok(())
            }
            Args3::Rename(from, to) => {
                // Within one directory (the usual rename), one status
                // before and one after serve as the source's and the
                // target's.
                let one_dir = from.dir == to.dir;
                let (sdir, sst) = resolve_stat(cx, from.dir)?;
                let (tdir, tst) = if one_dir {
                    (sdir.clone(), sst)
                } else {
                    resolve_stat(cx, to.dir)?
                };
                let _as = cred::assume_kept(&cx.id);
                let (sb, tb) = (wcc_of(cx, &sdir, &sst), wcc_of(cx, &tdir, &tst));
                fail_wcc.push((Some(sb), Some(fattr(cx, sdir.loc, &sst))));
                fail_wcc.push((Some(tb), Some(fattr(cx, tdir.loc, &tst))));
                is_dir(&sst)?;
                is_dir(&tst)?;
                read_only(cx, &tdir)?;
                if sdir.loc != tdir.loc {
                    return Err(status::XDEV.into());
                }
                let f =
                    name(from.name).map_err(
                        |s| {
                            if s == status::EXIST {
                                status::INVAL
                            } else {
                                s
                            }
                        },
                    )?;
                let t = name(to.name)?;
                let r = rename_checked(cx, &sdir, &f, &tdir, &t).map_err(st3);
                let safter = attrs_of(cx, &sdir);
                let tafter = if one_dir { safter } else { attrs_of(cx, &tdir) };
                fail_wcc[0].1 = safter;
                fail_wcc[1].1 = tafter;
                // A replaced target loses its name.
                if let Some(gone) = r? {
                    if gone.is_file() && gone.nlink <= 1 {
                        cx.srv.file_unlinked((gone.dev, gone.ino));
                    }
                    cx.ex(&tdir).fs.forget_inode(&gone);
                }
                commit_dir(cx, &tdir).map_err(st3)?;
                if !one_dir {
                    commit_dir(cx, &sdir).map_err(st3)?;
                }
                e.u32(0);
                wcc_data(e, Some(&sb), safter.as_ref());
                wcc_data(e, Some(&tb), tafter.as_ref());
                Ok(())
            }
            Args3::Link(fh, w) => {
                let (src, st) = resolve_stat(cx, fh)?;
                let _as = cred::assume_kept(&cx.id);
                fail_attrs = Some(fattr(cx, src.loc, &st));
                let (dir, before) = dir_to_change(cx, &w, &mut fail_wcc)?;
                if src.loc != dir.loc {
                    return Err(status::XDEV.into());
                }
                if st.is_dir() {
                    return Err(status::ISDIR.into());
                }
                let n = name(w.name)?;
                deleg_conflicts(cx, (st.dev, st.ino), true).map_err(st3)?;
                io3(fs::link_at(src.fd.as_fd(), dir.fd.as_fd(), &n))?;
                commit_dir(cx, &dir).map_err(st3)?;
                commit_meta(cx, &src, &st).map_err(st3)?;
                e.u32(0);
                post_op_attr(e, attrs_of(cx, &src).as_ref());
                wcc_data(e, Some(&before), attrs_of(cx, &dir).as_ref());
                Ok(())
            }
            Args3::Readdir(dir, cookie, _verf, count) => {
                readdir(cx, dir, cookie, false, count, e, &mut fail_attrs)
            }
            Args3::Readdirplus(dir, cookie, _verf, _dircount, maxcount) => {
                readdir(cx, dir, cookie, true, maxcount, e, &mut fail_attrs)
            }
            Args3::Fsstat(fh) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                fail_attrs = Some(fattr(cx, fh.loc, &st));
                let s = io3(fs::statfs(fh.fd.as_fd()))?;
                e.u32(0);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                e.u64(s.bytes_total);
                e.u64(s.bytes_free);
                e.u64(s.bytes_avail);
                e.u64(s.files_total);
                e.u64(s.files_free);
                e.u64(s.files_avail);
                e.u32(0);
                Ok(())
            }
            Args3::Fsinfo(fh) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                let rules = &cx.ex(&fh).rules;
                e.u32(0);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                e.u32(rules.max_read);
                e.u32(rules.max_read);
                e.u32(4096);
                e.u32(rules.max_write);
                e.u32(rules.max_write);
                e.u32(4096);
                e.u32(DTPREF);
                e.u64(i64::MAX as u64);
                e.u32(0);
                e.u32(1);
                e.u32(
                    nfs3::fsf::LINK
                        | nfs3::fsf::SYMLINK
                        | nfs3::fsf::HOMOGENEOUS
                        | nfs3::fsf::CANSETTIME,
                );
                Ok(())
            }
            Args3::Pathconf(fh) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                e.u32(0);
                post_op_attr(e, Some(&fattr(cx, fh.loc, &st)));
                e.u32(LINK_MAX);
                e.u32(255);
                e.bool(true); // no_trunc
                e.bool(true); // chown_restricted
                e.bool(false); // case_insensitive
                e.bool(true); // case_preserving
                Ok(())
            }
            Args3::Commit(fh, _offset, _count) => {
                let (fh, st) = resolve_stat(cx, fh)?;
                let before = wcc_of(cx, &fh, &st);
                fail_wcc.push((Some(before), Some(fattr(cx, fh.loc, &st))));
                file(&st)?;
                // The whole file is flushed whatever the range, so one
                // that runs past 2^64 is taken too (RFC 1813 has no
                // NFS3ERR_INVAL for COMMIT; the Linux server commits to
                // the end of the file).
                let key = (st.dev, st.ino);
                // Through a descriptor the WRITEs had, open since before
                // them: NFSv3's kept one, or an NFSv4 open's (opening
                // again would break a write delegation's lease, and a
                // description opened after a failed writeback was
                // reported is not told of it).
                let fd = match cx.srv.v3_files.writer(key) {
                    Some(fd) => fd,
                    None => match cx.srv.state.any_fd(key) {
                        Some(fd) => fd,
                        None => Arc::new(io3(cred::as_root(|| {
                            fs::reopen(fh.fd.as_fd(), libc::O_RDONLY)
                        }))?),
                    },
                };
                let verifier = io3(cx.srv.flush_then_verifier(key, fd.as_fd(), true))?;
                e.u32(0);
                wcc_data(e, Some(&before), attrs_of(cx, &fh).as_ref());
                e.opaque_fixed(&verifier);
                Ok(())
            }
        }
    })()
    .map_err(|s: Stop3| s.0);
    match r {
        Ok(()) => Ok(()),
        Err(Stop::WouldBlock) => Err(Stop::WouldBlock),
        Err(Stop::Status(st)) => {
            e.truncate(started);
            let st = Nfsstat3::from(st);
            e.u32(st.0);
            shape.failure(e, fail_attrs.as_ref(), &fail_wcc);
            Ok(())
        }
    }
}

/// An NFSv3 status or WouldBlock, with `?` from both kinds.
struct Stop3(Stop);

impl From<Nfsstat3> for Stop3 {
    fn from(st: Nfsstat3) -> Self {
        Stop3(Stop::Status(Nfsstat4(st.0)))
    }
}

impl From<Stop> for Stop3 {
    fn from(s: Stop) -> Self {
        match s {
            Stop::Status(st) => Stop3(Stop::Status(Nfsstat4(Nfsstat3::from(st).0))),
            Stop::WouldBlock => Stop3(Stop::WouldBlock),
        }
    }
}

/// The directory preferred size for READDIR (FSINFO dtpref).
const DTPREF: u32 = 64 * 1024;
/// Hard links per file reported by PATHCONF.
const LINK_MAX: u32 = 65000;

/// What a failed procedure's result carries after its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Nothing (NULL).
    Nothing,
    /// One post_op_attr (GETATTR's failure has none).
    Attr,
    /// No attributes at all (GETATTR).
    None,
    /// One wcc_data.
    Wcc,
    /// Two wcc_data (RENAME).
    Wcc2,
    /// post_op_attr and wcc_data (LINK).
    AttrWcc,
    /// RMDIR (a wcc_data), told apart from REMOVE.
    Rmdir,
    /// READDIR and READDIRPLUS: a post_op_attr.
    Dir,
}

impl Shape {
    fn of(a: &Args3<'_>) -> Self {
        match a {
            Args3::Null => Shape::Nothing,
            Args3::Getattr(_) => Shape::None,
            Args3::Setattr(..)
            | Args3::Write(..)
            | Args3::Create(..)
            | Args3::Mkdir(..)
            | Args3::Symlink(..)
            | Args3::Mknod(..)
            | Args3::Remove(_)
            | Args3::Commit(..) => Shape::Wcc,
            Args3::Rmdir(_) => Shape::Rmdir,
            Args3::Rename(..) => Shape::Wcc2,
            Args3::Link(..) => Shape::AttrWcc,
            Args3::Readdir(..) | Args3::Readdirplus(..) => Shape::Dir,
            Args3::Lookup(_)
            | Args3::Access(..)
            | Args3::Readlink(_)
            | Args3::Read(..)
            | Args3::Fsstat(_)
            | Args3::Fsinfo(_)
            | Args3::Pathconf(_) => Shape::Attr,
        }
    }

    fn failure(
        self,
        e: &mut Encoder,
        attrs: Option<&Fattr3>,
        wcc: &[(Option<WccAttr>, Option<Fattr3>)],
    ) {
        let w = |e: &mut Encoder, i: usize| match wcc.get(i) {
            Some((b, a)) => wcc_data(e, b.as_ref(), a.as_ref()),
            None => wcc_data(e, None, None),
        };
        match self {
            Shape::Nothing | Shape::None => {}
            Shape::Attr | Shape::Dir => post_op_attr(e, attrs),
            Shape::Wcc | Shape::Rmdir => w(e, 0),
            Shape::Wcc2 => {
                w(e, 0);
                w(e, 1);
            }
            Shape::AttrWcc => {
                post_op_attr(e, attrs);
                w(e, 0);
            }
        }
    }
}

/// The directory of a create or remove, resolved, checked writable and
/// stated (its wcc_attr before the change, also recorded for failure).
fn dir_to_change(
    cx: &mut Ctx<'_>,
    w: &DirOp<'_>,
    fail_wcc: &mut Vec<(Option<WccAttr>, Option<Fattr3>)>,
) -> R<(Fh, WccAttr)> {
    let (dir, st) = resolve_stat(cx, w.dir)?;
    let before = wcc_of(cx, &dir, &st);
    fail_wcc.push((Some(before), Some(fattr(cx, dir.loc, &st))));
    is_dir(&st)?;
    read_only(cx, &dir)?;
    Ok((dir, before))
}

/// Writes the success of CREATE, MKDIR, SYMLINK and MKNOD.
fn made(
    cx: &Ctx<'_>,
    e: &mut Encoder,
    dir: &Fh,
    before: &WccAttr,
    fh: &Fh,
    st: &Stat,
) -> Result<(), Stop3> {
    let wire = fh_out(cx, &fh.wire)?;
    e.u32(0);
    post_op_fh(e, Some(wire));
    post_op_attr(e, Some(&fattr(cx, fh.loc, st)));
    wcc_data(e, Some(before), attrs_of(cx, dir).as_ref());
    Ok(())
}

/// Opens what was just made as `n` in `dir`, applies the attributes
/// not given to the call that made it (owner, group, times; the size of a
/// new file), and syncs the directory, and then the object if attributes
/// were set (see `ops_fs::commit_meta`).
fn made_attrs(cx: &Ctx<'_>, dir: &Fh, n: &CString, set: &SetAttrs) -> R<(Fh, Stat)> {
    let (fh, st) = child(cx, dir, n)?;
    let rest = SetAttrs {
        mode: None,
        ..set.clone()
    };
    let changed = apply_attrs(&fh, &st, &rest).map_err(st3)?;
    commit_dir(cx, dir).map_err(st3)?;
    if !changed {
        // Nothing set: the attributes `child` read are the file's, and
        // the directory's sync made the new object durable with it.
        return Ok((fh, st));
    }
    commit_meta(cx, &fh, &st).map_err(st3)?;
    let st = io3(fs::stat(fh.fd.as_fd()))?;
    Ok((fh, st))
}

/// Opens `name` in `dir` as a handle of the same export (another file
/// system mounted inside it is not exported: NFS3ERR_NOENT).
fn child(cx: &Ctx<'_>, dir: &Fh, name: &CString) -> R<(Fh, Stat)> {
    super::ops_fs::child(cx, dir, name).map_err(st3)
}

/// LOOKUP of `n` in `dir`: "." is the directory, ".." its parent (the
/// export root's is the root itself, as on the Linux server).
/// On the connection's task only from the kernel's caches (WouldBlock
/// when the name must be read from storage), as NFSv4's LOOKUP.
fn lookup(cx: &Ctx<'_>, dir: &Fh, dst: &Stat, n: &[u8]) -> Result<(Fh, Stat), Stop3> {
    if n.is_empty() {
        return Err(status::NOENT.into());
    }
    if n.len() > 255 {
        return Err(status::NAMETOOLONG.into());
    }
    if n.contains(&b'/') || n.contains(&0) {
        return Err(status::NOENT.into());
    }
    if n == b"." || (n == b".." && cx.ex(dir).fs.is_root(dst)) {
        return Ok((dir.clone(), *dst));
    }
    let name = CString::new(n).map_err(|_| status::NOENT)?;
    Ok(child_or_block(cx, dir, &name)?)
}

/// CREATE as `how` asks.
fn create(cx: &Ctx<'_>, dir: &Fh, n: &CString, how: &CreateHow3) -> R<(Fh, Stat)> {
    let (set, exclusive) = match how {
        CreateHow3::Unchecked(sa) => (settable(sa)?, false),
        CreateHow3::Guarded(sa) => (settable(sa)?, true),
        CreateHow3::Exclusive(_) => (SetAttrs::default(), true),
    };
    let mode = set.mode.unwrap_or(0o644);
    // A new file is opened for writing, whatever its mode (the kernel
    // checks no access on a file its open created), and kept for the
    // client's WRITEs that follow (see [`FileCache`]). An UNCHECKED create
    // of a name that exists opens it only for reading, which the caller
    // may not be allowed to write.
    let made = match fs::create_file(dir.fd.as_fd(), n, mode, true, libc::O_WRONLY) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !exclusive => {
            fs::create_file(dir.fd.as_fd(), n, mode, false, libc::O_RDONLY)
        }
        r => r,
    };
    match made {
        Ok((fd, true)) => {
            let set = match how {
                // The verifier is kept in the times until the client sets
                // them (RFC 1813 section 3.3.8).
                CreateHow3::Exclusive(v) => {
                    let (at, mt) = super::ops_file::verifier_times(v);
                    SetAttrs {
                        atime: SetTime::At(at),
                        mtime: SetTime::At(mt),
                        ..Default::default()
                    }
                }
                _ => set.clone(),
            };
            let (fh, st) = made_attrs(cx, dir, n, &set)?;
            if !cx.srv.state.write_delegated((st.dev, st.ino)) {
                cx.srv.v3_files.put(io_key(cx, &st, true), Arc::new(fd));
            }
            Ok((fh, st))
        }
        Ok((_fd, false)) => {
            // UNCHECKED on an existing file: only the size is applied.
            let (fh, st) = child(cx, dir, n)?;
            if let Some(size) = set.size {
                deleg_conflicts(cx, (st.dev, st.ino), true).map_err(st3)?;
                cx.srv.state.before_own_open((st.dev, st.ino));
                let key = (st.dev, st.ino);
                {
                    let _exclusive = cx.srv.locks.write(key, size.min(st.size), u64::MAX);
                    let only = SetAttrs {
                        size: Some(size),
                        ..Default::default()
                    };
                    apply_attrs(&fh, &st, &only).map_err(st3)?;
                    cx.srv.file_changed(key);
                }
                commit_meta(cx, &fh, &st).map_err(st3)?;
            }
            let st = io3(fs::stat(fh.fd.as_fd()))?;
            Ok((fh, st))
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let CreateHow3::Exclusive(v) = how else {
                return Err(status::EXIST);
            };
            // A retransmitted exclusive create finds its own verifier.
            let (fh, st) = child(cx, dir, n)?;
            let (at, mt) = super::ops_file::verifier_times(v);
            if !st.is_file() || st.atime.sec != at.sec || st.mtime.sec != mt.sec {
                return Err(status::EXIST);
            }
            Ok((fh, st))
        }
        Err(e) => io3(Err(e)),
    }
}

/// The readahead stream of an NFSv3 reader: one per file handle, since
/// NFSv3 has no opens to tell readers apart.
fn stream_of(wire: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    wire.hash(&mut h);
    h.finish() | 1
}

fn read(
    cx: &mut Ctx<'_>,
    fh: &[u8],
    offset: u64,
    count: u32,
    e: &mut Encoder,
    fail_attrs: &mut Option<Fattr3>,
) -> Result<(), Stop3> {
    let started = std::time::Instant::now();
    // The stat that checks the handle reads the size and times too. No
    // identity switch for READ itself: `open_io` takes the caller's
    // identity where it opens the file, and a descriptor it kept needs
    // none.
    let (fh, st) = resolve_stat(cx, fh)?;
    *fail_attrs = Some(fattr(cx, fh.loc, &st));
    file(&st)?;
    let count = count.min(cx.ex(&fh).rules.max_read) as u64;
    deleg_conflicts(cx, (st.dev, st.ino), false).map_err(st3)?;
    let mode = if super::context::must_not_wait() {
        Mode::NoWait
    } else {
        Mode::Wait
    };
    let key = (st.dev, st.ino);
    let stop = |e: ReadError| match e {
        ReadError::WouldBlock => Stop3(Stop::WouldBlock),
        ReadError::Io(e) => Stop3::from(st3(Nfsstat4::from(&e))),
    };
    let _shared = cx
        .srv
        .read
        .lock(key, offset, offset.saturating_add(count), mode)
        .map_err(stop)?;
    let fd = open_io(cx, &fh, &st, false)?;
    let at = ReadAt {
        file: key,
        st: &st,
        fd: &fd,
        path: fh.fd.as_fd(),
        stream: stream_of(&fh.wire),
        offset,
        count: count as usize,
        direct: !cx.srv.state.write_delegated(key),
        lend: cx.lend,
    };
    let data = cx.srv.read.read(&at, mode).map_err(stop)?;
    let len = data.len();
    let end = offset.saturating_add(len as u64);
    let after = io3(super::ops_file::status_after_read(
        &fd, &st, count, len as u64, end,
    ))?;
    let eof = end >= after.size;
    let m = &cx.srv.metrics;
    m.reads.fetch_add(1, Ordering::Relaxed);
    m.read_bytes_sent.fetch_add(len as u64, Ordering::Relaxed);
    e.u32(0);
    post_op_attr(e, Some(&fattr(cx, fh.loc, &after)));
    e.u32(len as u32);
    e.bool(eof);
    super::ops_file::put_data(e, data);
    m.read_latency.observe(started.elapsed());
    Ok(())
}

/// READDIR, and READDIRPLUS with `plus`. Cookies are the file system's
/// own directory offsets; the cookie verifier is always zero and never
/// checked, as on the Linux server.
///
/// READDIRPLUS fills `maxcount` and leaves its `dircount` aside, as the
/// Linux server and nfs-ganesha do. RFC 1813 gives dircount as a bound on
/// the names and cookies, there so that a server need not read more of
/// the directory than the client will use; a reply that holds more
/// entries within maxcount costs the client nothing. Linux clients before
/// 5.18 ask for an eighth of maxcount ("big enough", their comment says),
/// which with short names stopped a reply at about three fifths of the
/// entries maxcount holds: 177 calls instead of 104 for 20,000 entries in
/// 32 KiB replies.
fn readdir(
    cx: &mut Ctx<'_>,
    dir: &[u8],
    cookie: u64,
    plus: bool,
    maxcount: u32,
    e: &mut Encoder,
    fail_attrs: &mut Option<Fattr3>,
) -> Result<(), Stop3> {
    let (dir, dst) = resolve_stat(cx, dir)?;
    let _as = cred::assume_kept(&cx.id);
    *fail_attrs = Some(fattr(cx, dir.loc, &dst));
    is_dir(&dst)?;
    let mut reader = io3(fs::DirReader::open(dir.fd.as_fd(), cookie))?.with_dots();
    let ex = &cx.ex(&dir).fs;
    let is_root = ex.is_root(&dst);
    // The reply around the entries: status, post_op_attr, verifier,
    // end-of-list and eof.
    let budget = (maxcount as usize).saturating_sub(4 + 88 + 8 + 8);
    let mut list = Encoder::with_capacity(budget.min(64 * 1024));
    let mut n = 0;
    let mut eof = false;
    let mut batch = Vec::new();
    let mut entries = Vec::new();
    let from_directory = !plus && ex.numbers_in_directory();
    let is_dots = |ent: &fs::DirEntry| {
        let name = ent.name.as_bytes();
        name == b"." || (name == b".." && is_root)
    };
    'list: while !eof {
        // READDIRPLUS: a batch of entries and their stats, then their
        // handles (the memo answers for stats made between its ticket
        // and its reading of deletes, once per batch). ".." of the export
        // root is the root itself, as LOOKUP says.
        batch.clear();
        let ticket = ex.memo().ticket();
        let size = super::ops_fs::stat_batch(budget.saturating_sub(list.len()));
        reader.expect(super::ops_fs::entries_left(
            budget.saturating_sub(list.len()),
            list.len(),
            n,
            if plus { 192 } else { 40 },
            None,
        ));
        entries.clear();
        while entries.len() < size {
            let Some(ent) = io3(reader.next_entry())? else {
                eof = true;
                break;
            };
            entries.push(ent);
        }
        // READDIR: the file id the directory gives, where it is the one a
        // stat gives too. READDIRPLUS: attributes the cache kept, or a
        // stat; an entry gone meanwhile, or another file system mounted
        // here, is listed without attributes or handle.
        let stats = ex.stats_of(dir.fd.as_fd(), dst.dev, &entries, |ent| {
            !from_directory && !is_dots(ent)
        });
        for (ent, st) in entries.drain(..).zip(stats) {
            let dots = is_dots(&ent);
            let st = if from_directory {
                None
            } else if dots {
                Some(dst)
            } else {
                st
            };
            batch.push((ent, dots, st));
        }
        let mut fresh = plus.then(|| ex.memo().fresh(ticket));
        let mut kept = match &fresh {
            Some(f) => f.get_all(
                batch
                    .iter()
                    .map(|(_, dots, st)| st.as_ref().filter(|_| !dots)),
            ),
            None => Vec::new(),
        }
        .into_iter();
        for (ent, dots, st) in &batch {
            let name = ent.name.as_bytes();
            let kept = kept.next().flatten();
            let fh = match (&mut fresh, st) {
                (Some(_), Some(_)) if *dots => Some(dir.wire.as_slice().into()),
                (Some(f), Some(st)) => ex.handle_seen(f, kept, dir.fd.as_fd(), &ent.name, st).ok(),
                _ => None,
            };
            let fileid = match st {
                Some(st) => st.ino,
                None if name == b".." && is_root => dst.ino,
                None => ent.ino,
            };
            let mark = list.len();
            list.bool(true);
            list.u64(fileid);
            list.opaque(name);
            list.u64(ent.next);
            if plus {
                post_op_attr(&mut list, st.map(|s| fattr(cx, dir.loc, &s)).as_ref());
                let fh = fh.filter(|w| w.len() <= cx.srv.config.v3_max_fh);
                post_op_fh(&mut list, fh.as_deref());
            }
            if list.len() > budget {
                list.truncate(mark);
                eof = false;
                break 'list;
            }
            n += 1;
        }
    }
    if n == 0 && !eof {
        return Err(status::TOOSMALL.into());
    }
    e.u32(0);
    post_op_attr(e, Some(&fattr(cx, dir.loc, &dst)));
    e.opaque_fixed(&[0u8; 8]);
    e.raw(list.as_slice());
    e.bool(false);
    e.bool(eof);
    Ok(())
}

#[cfg(test)]
mod file_cache_tests {
    use super::FileCache;
    use std::os::fd::OwnedFd;
    use std::sync::Arc;

    #[test]
    fn a_full_cache_keeps_its_newest_descriptors() {
        let c = FileCache::default();
        let fd = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let key = |i: u64| (1, i, 1000, 1000, 7, true);
        let n = FileCache::MAX as u64 + 10;
        for i in 0..n {
            c.put(key(i), fd.clone());
        }
        assert!(c.len() <= FileCache::MAX, "{} descriptors kept", c.len());
        assert!(
            c.len() >= FileCache::MAX / 2,
            "{} descriptors kept",
            c.len()
        );
        for i in n - 8..n {
            assert!(
                c.get(&key(i)).is_some(),
                "descriptor {i} of the newest gone"
            );
        }
        assert!(c.get(&key(0)).is_none(), "the oldest descriptor kept");
    }

    #[test]
    fn forget_closes_every_descriptor_of_a_file_and_only_those() {
        let c = FileCache::default();
        let fd = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let (reader, writer, other) = (
            (1, 5, 1000, 1000, 7, false),
            (1, 5, 1000, 1000, 7, true),
            (1, 6, 1000, 1000, 7, true),
        );
        for k in [reader, writer, other] {
            c.put(k, fd.clone());
        }
        c.put(writer, fd.clone());
        assert_eq!(
            c.len(),
            3,
            "a second put of the same key replaces the first"
        );
        c.forget((1, 5));
        assert!(c.get(&reader).is_none() && c.get(&writer).is_none());
        assert!(c.get(&other).is_some());
        assert_eq!(c.len(), 1);
        assert_eq!(
            Arc::strong_count(&fd),
            2,
            "the forgotten descriptors are not held"
        );
    }
}
