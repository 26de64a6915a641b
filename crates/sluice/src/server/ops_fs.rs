//! Namespace and attribute ops: filehandles, LOOKUP, GETATTR, SETATTR,
//! ACCESS, READDIR, CREATE, REMOVE, RENAME, LINK, READLINK, SECINFO,
//! VERIFY/NVERIFY.

use super::attrs::{self, AttrSource};
use super::callback;
use super::context::{Ctx, Fh, OpStatus, Outcome, Stop};
use super::exports::Loc;
use super::state::{FileKey, Stateid};
use crate::engine::fs::{self, SetTime, Stat};
use crate::nfs4::consts::{access, attr, ftype, op, status};
use crate::nfs4::msg::{
    AccessResOk, Bitmap4, ChangeInfo4, Component4, CreateArgs, CreateResOk, Createtype4, Fattr4,
    NfsFh4, ReaddirArgs, RenameArgs, RenameResOk, SetattrArgs, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder, XdrResult};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Runs an op body written with `?`, turning its error into the status.
pub(super) fn run(f: impl FnOnce() -> Result<(), Nfsstat4>) -> OpStatus {
    match f() {
        Ok(()) => status::OK,
        Err(st) => st,
    }
}

/// Like [`run`] for an op that may have to wait (see [`Stop`]).
pub(super) fn run_or_block(f: impl FnOnce() -> Result<(), Stop>) -> Outcome {
    match f() {
        Ok(()) => Outcome::Done(status::OK),
        Err(Stop::Status(st)) => Outcome::Done(st),
        Err(Stop::WouldBlock) => Outcome::WouldBlock,
    }
}

/// Maps a decode failure to NFS4ERR_BADXDR.
pub(super) fn x<T>(r: XdrResult<T>) -> Result<T, Nfsstat4> {
    r.map_err(|_| status::BADXDR)
}

/// Maps a system error to its status.
pub(super) fn io<T>(r: io::Result<T>) -> Result<T, Nfsstat4> {
    r.map_err(|e| Nfsstat4::from(&e))
}

/// Reads a stateid.
pub(super) fn stateid(d: &mut Decoder<'_>) -> Result<Stateid, Nfsstat4> {
    x(Stateid::decode(d))
}

/// Writes a stateid.
pub(super) fn put_stateid(e: &mut Encoder, s: &Stateid) {
    s.encode(e);
}

/// Reads and checks a component name.
pub(super) fn component(d: &mut Decoder<'_>) -> Result<CString, Nfsstat4> {
    component_of(&x(Component4::decode(d))?)
}

/// Checks a component name: NFS4ERR_INVAL when empty, NAMETOOLONG past
/// 255 bytes, BADNAME for "." and ".." and names with '/' or NUL.
pub(super) fn component_of(c: &Component4) -> Result<CString, Nfsstat4> {
    let name = &c.0[..];
    if name.is_empty() {
        return Err(status::INVAL);
    }
    if name.len() > 255 {
        return Err(status::NAMETOOLONG);
    }
    if name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(status::BADNAME);
    }
    CString::new(name).map_err(|_| status::BADNAME)
}

/// Recalls delegations of other clients on `file` that a change to it
/// (`write`) conflicts with: NFS4ERR_DELAY until they are back or revoked.
pub(super) fn deleg_conflicts(cx: &Ctx<'_>, file: FileKey, write: bool) -> Result<(), Nfsstat4> {
    match cx
        .srv
        .state
        .deleg_conflicts(file, cx.clientid().ok(), write)
    {
        Ok(()) => Ok(()),
        Err((st, recalls)) => {
            if !recalls.is_empty() {
                callback::start_recalls(recalls, |c| cx.srv.state.sessions_of(c), &cx.srv.metrics);
            }
            Err(st)
        }
    }
}

/// When another client holds a write delegation on the file `st`, asks it
/// for the file's size and change attribute with CB_GETATTR (RFC 8881
/// section 10.4.3), so that a GETATTR sees what the holder wrote but has
/// not sent yet: when the holder changed the file, its modify time is set
/// to now (which moves the change attribute on) and its size is the
/// holder's. A holder that does not answer has its delegation recalled
/// (NFS4ERR_DELAY until it is back), and so does a GETATTR while a recall
/// is out.
fn holder_attrs(cx: &Ctx<'_>, fh: &Fh, st: &mut Stat) -> Result<(), Stop> {
    let file = (st.dev, st.ino);
    let Some(h) = cx.srv.state.write_holder(file, cx.clientid().ok()) else {
        return Ok(());
    };
    if h.recalled {
        return Err(status::DELAY.into());
    }
    if super::context::must_not_wait() {
        // The callback is waited for on a worker.
        return Err(Stop::WouldBlock);
    }
    let sessions = cx.srv.state.sessions_of(h.clientid);
    match callback::getattr(&sessions, &h.fh, &cx.srv.metrics) {
        Ok(a) => {
            if a.change != h.change || a.size != st.size {
                // The server's own act on the holder's behalf, whoever
                // asked: as root (setting the modify time alone takes the
                // file's owner; write permission is not enough), so a
                // GETATTR never fails for want of permission and needs no
                // caller identity.
                io(crate::engine::cred::as_root(|| {
                    fs::utimens(fh.fd.as_fd(), SetTime::Keep, SetTime::Now)
                }))?;
                *st = stat_of(fh)?;
                st.size = a.size;
            }
            Ok(())
        }
        Err(e) => {
            tracing::info!(
                clientid = format!("{:#x}", h.clientid),
                error = %e,
                "CB_GETATTR not answered: recalling the write delegation"
            );
            Ok(deleg_conflicts(cx, file, true)?)
        }
    }
}

/// Stats the object behind a filehandle of an export.
pub(super) fn stat_of(fh: &Fh) -> Result<Stat, Nfsstat4> {
    io(fs::stat(fh.fd.as_fd()))
}

/// Stats the object behind any filehandle, pseudo directories included.
pub(super) fn stat_any(cx: &Ctx<'_>, fh: &Fh) -> Result<Stat, Nfsstat4> {
    match fh.loc {
        Loc::Pseudo(n) => Ok(cx.srv.exports.node_stat(n)),
        Loc::Export(_) => stat_of(fh),
    }
}

/// Stats `fh`, the current filehandle, or gives the status the op
/// before read of it when that is still good (see [`Ctx::cur_stat`]).
pub(super) fn stat_cur(cx: &Ctx<'_>, fh: &Fh) -> Result<Stat, Nfsstat4> {
    match cx.cur_stat() {
        Some(st) => Ok(st),
        None => stat_any(cx, fh),
    }
}

/// The current filehandle, which must be a directory, and its status:
/// the one PUTFH or LOOKUP read of it when still good (see
/// [`Ctx::cur_stat`]), as the status before an op that changes it.
pub(super) fn cur_dir(cx: &Ctx<'_>) -> Result<(Fh, Stat), Nfsstat4> {
    let fh = cx.cur()?.clone();
    let st = match (fh.loc, cx.cur_stat()) {
        (Loc::Export(_), Some(st)) => st,
        _ => stat_of(&fh)?,
    };
    if st.is_dir() {
        Ok((fh, st))
    } else if st.is_symlink() {
        Err(status::SYMLINK)
    } else {
        Err(status::NOTDIR)
    }
}

/// Under a `sync` export (the default), puts what an op changed in the
/// object `fh`, of status `st`, on stable storage before the op is
/// answered: a directory's entries after a name in it was made, removed
/// or renamed, an object's attributes after they were set. This is what
/// the Linux server does on its `sync` exports (its default), and what a
/// client that was answered may count on: a crash of the server's
/// machine right after the answer does not undo the change. Only
/// directories and regular files are synced (see
/// [`fs::open_for_sync`]); a new symlink, device or FIFO is made durable
/// with its directory. An op that made an object syncs its directory,
/// and then the object only if it set attributes after making it: ext4,
/// xfs and btrfs make the object and its name in one transaction, which
/// the directory's sync makes durable, so a second sync would only wait
/// for another device flush.
pub(super) fn commit_meta(cx: &Ctx<'_>, fh: &Fh, st: &Stat) -> Result<(), Nfsstat4> {
    if st.is_dir() {
        commit(cx, fh, None)
    } else if st.is_file() {
        commit_file(cx, fh, (st.dev, st.ino))
    } else {
        Ok(())
    }
}

/// Whether `fh`'s export syncs changes before answering them (`sync`,
/// the default); never for the pseudo file system, which has none.
pub(super) fn syncs(cx: &Ctx<'_>, fh: &Fh) -> bool {
    matches!(fh.loc, Loc::Export(_)) && cx.ex(fh).rules.sync
}

/// [`commit_meta`] of the regular file `fh`, of inode `file`.
pub(super) fn commit_file(cx: &Ctx<'_>, fh: &Fh, file: FileKey) -> Result<(), Nfsstat4> {
    commit(cx, fh, Some(file))
}

/// [`commit_meta`] of a directory.
pub(super) fn commit_dir(cx: &Ctx<'_>, dir: &Fh) -> Result<(), Nfsstat4> {
    commit(cx, dir, None)
}

/// Syncs the directory `fh`, or with `file`, the regular file `fh`.
fn commit(cx: &Ctx<'_>, fh: &Fh, file: Option<FileKey>) -> Result<(), Nfsstat4> {
    if !syncs(cx, fh) {
        return Ok(());
    }
    let counted = || {
        cx.srv
            .metrics
            .metadata_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
    // As root: the caller may change a file it may not read.
    let open = || crate::engine::cred::as_root(|| fs::open_for_sync(fh.fd.as_fd(), false));
    let Some(key) = file else {
        // Ops that changed the directory while it was being synced share
        // the next sync (see `dirsync`).
        let st = io(fs::stat(fh.fd.as_fd()))?;
        if let Some(deferred) = &cx.deferred {
            // On the connection's task: the COMPOUND waits for the sync
            // before its next op and its answer, without holding a thread.
            let mut pending = deferred.borrow_mut();
            if !pending.iter().any(|p| p.dir == (st.dev, st.ino)) {
                pending.push(super::dirsync::Pending {
                    dir: (st.dev, st.ino),
                    fd: fh.fd.clone(),
                });
            }
            return Ok(());
        }
        let (r, _) = cx.srv.dir_syncs.sync_job(
            (st.dev, st.ino),
            Arc::new(dir_sync(cx.srv.metrics.clone(), fh.fd.clone())),
        );
        return io(r);
    };
    counted();
    // A file's fsync also writes its dirty data back, so it goes through
    // the server's flush, whose failure changes the write verifier (the
    // kernel reports a lost writeback once per open file description).
    // A file some open or delegation holds open is synced through that
    // descriptor: a new open of a file under a write delegation would
    // break the kernel lease that keeps local processes out.
    let fd = match cx.srv.state.any_fd(key) {
        Some(fd) => fd,
        None => Arc::new(io(open())?),
    };
    io(cx.srv.flush_file(key, fd.as_fd(), true))
}

/// The sync of the directory `fd` on a `sync` export, counted.
fn dir_sync(
    metrics: Arc<super::counters::Metrics>,
    fd: Arc<OwnedFd>,
) -> impl Fn() -> io::Result<()> + Send + Sync + 'static {
    move || {
        metrics
            .metadata_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // As root: the caller may write a directory it may not read.
        crate::engine::cred::as_root(|| fs::open_for_sync(fd.as_fd(), true))
            .and_then(|d| fs::sync(d.as_fd(), true))
    }
}

/// Waits for syncs of the directories that ops left for their COMPOUND
/// (see [`Ctx::deferred`]), on a thread that may wait; the first
/// failure, as an NFS status.
pub(super) fn sync_deferred(
    srv: &super::Server,
    pending: &[super::dirsync::Pending],
) -> Result<(), Nfsstat4> {
    for p in pending {
        let (r, _) = srv.dir_syncs.sync_job(p.dir, deferred_job(srv, p));
        sync_failed(r)?;
    }
    Ok(())
}

/// [`sync_deferred`] for a task, which holds no thread while it waits.
pub(super) async fn sync_deferred_async(
    srv: &super::Server,
    pending: &[super::dirsync::Pending],
) -> Result<(), Nfsstat4> {
    for p in pending {
        let (r, _) = srv.dir_syncs.sync_async(p.dir, deferred_job(srv, p)).await;
        sync_failed(r)?;
    }
    Ok(())
}

/// The sync an op left for its call, as [`DirSyncs`] runs it.
///
/// [`DirSyncs`]: super::dirsync::DirSyncs
fn deferred_job(srv: &super::Server, p: &super::dirsync::Pending) -> super::dirsync::Job {
    Arc::new(dir_sync(srv.metrics.clone(), p.fd.clone()))
}

/// A deferred directory sync's result, its failure logged: the op that
/// changed the directory fails with it after its change was made.
fn sync_failed(r: io::Result<()>) -> Result<(), Nfsstat4> {
    r.map_err(|e| {
        tracing::warn!(error = %e, "directory sync failed; the op that changed it fails");
        Nfsstat4::from(&e)
    })
}

/// The change_info4 from directory states before and after an op.
pub(super) fn cinfo(before: &Stat, after: &Stat) -> ChangeInfo4 {
    ChangeInfo4 {
        atomic: false,
        before: before.change(),
        after: after.change(),
    }
}

/// Encodes the attributes `req` of an object with status `st`, in the
/// file system of `fs_of` (an export, or the pseudo file system).
pub(super) fn put_fattr(
    cx: &Ctx<'_>,
    e: &mut Encoder,
    fh_wire: Option<&[u8]>,
    st: &Stat,
    req: &[u32],
    fs_of: &Fh,
) {
    let exports = &cx.srv.exports;
    let (fsid, max_read, max_write, fs, mounted_on) = match fs_of.loc {
        // The pseudo file system is empty and has no space of its own.
        Loc::Pseudo(_) => ((0, 0), attrs::MAX_IO, attrs::MAX_IO, None, None),
        Loc::Export(i) => {
            let ex = cx.ex(fs_of);
            let fs = if attrs::wants_fs_stat(req) {
                fs::statfs(fs_of.fd.as_fd()).ok()
            } else {
                None
            };
            // An export root sits on a fileid of the pseudo file system.
            let mounted_on =
                (exports.has_pseudo() && ex.fs.is_root(st)).then(|| exports.mounted_on_fileid(i));
            // Exports on one device are told apart by the minor number.
            let fsid = (ex.fs.dev(), i as u64);
            (fsid, ex.rules.max_read, ex.rules.max_write, fs, mounted_on)
        }
    };
    let src = AttrSource {
        st,
        fh: fh_wire,
        fs,
        fsid,
        mounted_on,
        lease_secs: cx.srv.config.lease.as_secs() as u32,
        max_read,
        max_write,
        minor: cx.minor,
    };
    attrs::encode_fattr(e, req, &src);
}

/// PUTROOTFH and PUTPUBFH: the export at "/", or the pseudo root.
pub(super) fn putrootfh(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    let (wire, fd, loc) = cx.srv.exports.root();
    cx.cur = Some(Fh { wire, fd, loc });
    status::OK
}

/// PUTFH. When GETATTR comes next (the COMPOUND a client revalidates
/// its cache with), the stat that checks the handle reads the whole
/// status, and GETATTR answers from it.
pub(super) fn putfh(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let fh = x(NfsFh4::decode(d))?;
        // The stat that checks the handle reads everything when the next
        // op would stat the object anyway (GETATTR answers from it, READ
        // takes the size and times from it): one stat instead of two.
        // So do ACCESS, and the ops that read the directory's status
        // before they change it or list it. Before WRITE, the check
        // (type, inode number and links) is all WRITE needs.
        let next = d.clone().u32();
        let stat_next = matches!(
            next,
            Ok(op::GETATTR
                | op::READ
                | op::ACCESS
                | op::OPEN
                | op::CREATE
                | op::REMOVE
                | op::RENAME
                | op::LINK
                | op::READDIR
                | op::LOOKUPP)
        );
        let (fh, st) = cx.resolve_with(&fh.0, stat_next)?;
        cx.cur_identity = None;
        match st {
            Some(st) if stat_next => cx.cur_stat = Some((fh.fd.clone(), st)),
            Some(st) if next == Ok(op::WRITE) => cx.cur_identity = Some((fh.fd.clone(), st)),
            _ => {}
        }
        cx.cur = Some(fh);
        Ok(())
    })
}

/// GETFH.
pub(super) fn getfh(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        e.opaque(&cx.cur()?.wire);
        Ok(())
    })
}

/// SAVEFH.
pub(super) fn savefh(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        cx.saved = Some(cx.cur()?.clone());
        Ok(())
    })
}

/// RESTOREFH.
pub(super) fn restorefh(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        cx.cur = Some(cx.saved.clone().ok_or(status::RESTOREFH)?);
        Ok(())
    })
}

/// Opens `name` in directory `dir` as a new filehandle.
pub(super) fn child(cx: &Ctx<'_>, dir: &Fh, name: &CString) -> Result<(Fh, Stat), Nfsstat4> {
    let fd = io(fs::open_path_at(dir.fd.as_fd(), name))?;
    child_of(cx, dir, fd)
}

/// Like [`child`], but where waiting is not allowed (the connection's
/// task) only from the kernel's caches: [`Stop::WouldBlock`] when the
/// directory or the inode would have to be read from storage.
pub(super) fn child_or_block(cx: &Ctx<'_>, dir: &Fh, name: &CString) -> Result<(Fh, Stat), Stop> {
    if !super::context::must_not_wait() {
        return Ok(child(cx, dir, name)?);
    }
    match fs::open_path_at_cached(dir.fd.as_fd(), name) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(Stop::WouldBlock),
        fd => Ok(child_of(cx, dir, io(fd)?)?),
    }
}

/// The handle and status of `fd`, just opened below `dir`. When the
/// handle cache already holds the inode, its handle and descriptor are
/// used, and the kernel is not asked for the handle again.
fn child_of(cx: &Ctx<'_>, dir: &Fh, fd: OwnedFd) -> Result<(Fh, Stat), Nfsstat4> {
    let ex = &cx.ex(dir).fs;
    let st = io(fs::stat(fd.as_fd()))?;
    if st.dev != ex.dev() {
        // Another file system mounted inside the export is not exported.
        return Err(status::NOENT);
    }
    if let Some((wire, fd)) = ex.cached_handle(&st) {
        let fh = Fh {
            wire,
            fd,
            loc: dir.loc,
        };
        return Ok((fh, st));
    }
    Ok((fh_at(cx, dir, fd, &st)?, st))
}

/// The file handle of `fd`, just opened by name below `dir` (`st` its
/// status). Its descriptor goes into the handle
/// cache: the client sends the handle next, and PUTFH then need not open
/// the object again. The memo of handles keeps the handle too, for the
/// listings of the directory.
pub(super) fn fh_at(cx: &Ctx<'_>, dir: &Fh, fd: OwnedFd, st: &Stat) -> Result<Fh, Nfsstat4> {
    let ex = &cx.ex(dir).fs;
    let wire = io(ex.handle_of_opened(fd.as_fd(), st))?;
    let fd = Arc::new(fd);
    ex.remember(&wire, &fd, st);
    Ok(Fh {
        wire,
        fd,
        loc: dir.loc,
    })
}

/// LOOKUP. On the connection's task only what the kernel has in memory;
/// a name that must be read from storage is looked up on a worker.
///
/// The directory is not stat'ed first: the kernel's lookup says when the
/// current filehandle is not a directory (ENOTDIR), and only then is it
/// looked at, to tell a symbolic link (NFS4ERR_SYMLINK) from another
/// non-directory (NFS4ERR_NOTDIR). The status read of what was found is
/// kept for a GETATTR that follows.
pub(super) fn lookup(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> Outcome {
    run_or_block(|| {
        let name = component(d)?;
        let dir = cx.cur()?.clone();
        let (fh, st) = match child_or_block(cx, &dir, &name) {
            Err(Stop::Status(s)) if s == status::NOTDIR => {
                cur_dir(cx)?;
                return Err(Stop::Status(s));
            }
            r => r?,
        };
        cx.cur_stat = Some((fh.fd.clone(), st));
        cx.cur = Some(fh);
        Ok(())
    })
}

/// LOOKUPP: the parent, never above the export root but into the
/// pseudo directory holding it, when there is one.
pub(super) fn lookupp(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let (dir, st) = cur_dir(cx)?;
        if cx.ex(&dir).fs.is_root(&st) {
            let Loc::Export(i) = dir.loc else {
                return Err(status::NOENT);
            };
            let n = cx.srv.exports.parent_of_export(i).ok_or(status::NOENT)?;
            cx.cur = Some(super::ops_pseudo::node_fh(cx, n));
            return Ok(());
        }
        let (fh, _) = child(cx, &dir, &CString::new("..").expect("no NUL"))?;
        cx.cur = Some(fh);
        Ok(())
    })
}

/// GETATTR.
pub(super) fn getattr(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> Outcome {
    let cx = &*cx;
    run_or_block(|| {
        let Bitmap4(req) = x(Bitmap4::decode(d))?;
        let fh = cx.cur()?;
        let mut st = stat_cur(cx, fh)?;
        let asks = |bit: u32| req.first().is_some_and(|w| w & (1 << bit) != 0);
        if st.is_file() && (asks(attr::CHANGE) || asks(attr::SIZE)) {
            holder_attrs(cx, fh, &mut st)?;
        }
        put_fattr(cx, e, Some(&fh.wire), &st, &req, fh);
        Ok(())
    })
}

/// Applies settable attributes to the object behind `fh` (a size by
/// path).
pub(super) fn apply_attrs(fh: &Fh, st: &Stat, a: &attrs::SetAttrs) -> Result<bool, Nfsstat4> {
    apply_attrs_through(fh, st, a, None)
}

/// [`apply_attrs`], a size set through `open` (a descriptor of the file
/// open for writing) when given: truncating by path would break a write
/// delegation's kernel lease. True when it changed the file (`st` no
/// longer describes it); false when there was nothing to do.
pub(super) fn apply_attrs_through(
    fh: &Fh,
    st: &Stat,
    a: &attrs::SetAttrs,
    open: Option<BorrowedFd<'_>>,
) -> Result<bool, Nfsstat4> {
    let fd = fh.fd.as_fd();
    let mut changed = false;
    if let Some(size) = a.size {
        if st.is_dir() {
            return Err(status::ISDIR);
        }
        if !st.is_file() {
            return Err(status::INVAL);
        }
        if size != st.size {
            match open {
                Some(open) => io(fs::ftruncate(open, size))?,
                None => io(fs::truncate(fd, size))?,
            }
        } else {
            // Setting the same size still updates mtime and ctime.
            io(fs::utimens(fd, SetTime::Keep, SetTime::Now))?;
        }
        changed = true;
    }
    if a.uid.is_some() || a.gid.is_some() {
        let uid = a.uid.unwrap_or(u32::MAX);
        let gid = a.gid.unwrap_or(u32::MAX);
        if a.uid.is_some_and(|u| u != st.uid) || a.gid.is_some_and(|g| g != st.gid) {
            io(fs::chown(fd, uid, gid))?;
            changed = true;
        }
    }
    if let Some(mode) = a.mode {
        if !st.is_symlink() {
            io(fs::chmod(fd, mode))?;
            changed = true;
        }
    }
    if a.atime != SetTime::Keep || a.mtime != SetTime::Keep {
        if st.is_symlink() {
            return Ok(changed);
        }
        io(fs::utimens(fd, a.atime, a.mtime))?;
        changed = true;
    }
    Ok(changed)
}

/// SETATTR.
pub(super) fn setattr(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let mut set = [0u32; 3];
    let st = run(|| {
        let SetattrArgs {
            stateid: sid,
            attrs,
        } = x(SetattrArgs::decode(d))?;
        let a = attrs::settable(&attrs)?;
        let fh = cx.cur()?.clone();
        let st = stat_of(&fh)?;
        deleg_conflicts(cx, (st.dev, st.ino), a.size.is_some() || a.mode.is_some())?;
        // A size set with an open (or delegation) stateid goes through its
        // descriptor.
        let mut open_fd = None;
        if a.size.is_some() && st.is_file() {
            let sid = cx.stateid(sid)?;
            if !sid.is_special_io() {
                let (fd, acc) = cx.srv.state.io_state(&sid, (st.dev, st.ino))?;
                if acc & 2 == 0 {
                    return Err(status::OPENMODE);
                }
                open_fd = Some(fd);
            }
        }
        if a.size.is_some() && open_fd.is_none() {
            // Truncating by path would break a write delegation's kernel
            // lease (the holder's own: others got DELAY above).
            cx.srv.state.before_own_open((st.dev, st.ino));
        }
        {
            let key = (st.dev, st.ino);
            let _exclusive = a
                .size
                .map(|n| cx.srv.locks.write(key, n.min(st.size), u64::MAX));
            apply_attrs_through(&fh, &st, &a, open_fd.as_ref().map(|f| f.as_fd()))?;
            cx.srv.file_changed(key);
        }
        commit_meta(cx, &fh, &st)?;
        set = a.mask;
        Ok(())
    });
    Bitmap4::trimmed(&set).encode(e);
    st
}

pub(super) fn may(st: &Stat, cx: &Ctx<'_>, bit: u32) -> bool {
    let id = &cx.id;
    if id.uid == 0 {
        // Root may do anything but execute files no one may execute.
        return bit != 0o1 || st.is_dir() || st.mode & 0o111 != 0;
    }
    let shift = if st.uid == id.uid {
        6
    } else if st.gid == id.gid || id.groups.contains(&st.gid) {
        3
    } else {
        0
    };
    st.mode & (bit << shift) != 0
}

/// ACCESS: what the caller may do, from the mode bits.
pub(super) fn access(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let want = x(u32::decode(d))?;
        let fh = cx.cur()?;
        let st = stat_cur(cx, fh)?;
        let (r, w, xx) = (may(&st, cx, 0o4), may(&st, cx, 0o2), may(&st, cx, 0o1));
        let mut granted = 0;
        // The extended attribute bits (RFC 8276) are NFSv4.2's; in 4.1
        // they are not supported (left out of `supported`).
        let supported = want & if cx.minor >= 2 { 0x1ff } else { 0x3f };
        // Extended attributes: of regular files and directories, read
        // with read permission, changed with write.
        let xattrs = st.is_file() || st.is_dir();
        if r {
            granted |= access::READ;
            if xattrs {
                granted |= access::XAREAD | access::XALIST;
            }
        }
        if w {
            granted |= access::MODIFY | access::EXTEND;
            if xattrs {
                granted |= access::XAWRITE;
            }
        }
        if st.is_dir() {
            if xx {
                granted |= access::LOOKUP;
                if w {
                    granted |= access::DELETE;
                }
            }
        } else if xx {
            granted |= access::EXECUTE;
        }
        AccessResOk {
            supported,
            access: granted & supported,
        }
        .encode(e);
        Ok(())
    })
}

/// A READDIR reply being built: the arguments and the entries that fit.
pub(super) struct Listing {
    /// Where the listing starts (0, or the cookie of the last entry seen).
    pub cookie: u64,
    /// Attributes asked for each entry.
    pub req: Vec<u32>,
    dircount: usize,
    budget: usize,
    list: Encoder,
    names_bytes: usize,
    n: usize,
}

impl Listing {
    /// Bytes of reply left for entries.
    pub(super) fn room(&self) -> usize {
        self.budget.saturating_sub(self.list.len())
    }

    /// How many more entries are likely to fit the reply, judging by the
    /// ones added so far (before any: as if each took `guess` bytes).
    pub(super) fn entries_left(&self, guess: usize) -> usize {
        entries_left(
            self.room(),
            self.list.len(),
            self.n,
            guess,
            (self.dircount > 0).then_some((self.dircount, self.names_bytes)),
        )
    }

    /// Reads READDIR4args; cookies 1 and 2 are reserved.
    pub(super) fn decode(d: &mut Decoder<'_>) -> Result<Self, Nfsstat4> {
        let args = x(ReaddirArgs::decode(d))?;
        let (cookie, req) = (args.cookie, args.attr_request.0);
        let (dircount, maxcount) = (args.dircount as usize, args.maxcount as usize);
        if cookie == 1 || cookie == 2 {
            return Err(status::BAD_COOKIE);
        }
        Ok(Listing {
            cookie,
            req,
            dircount,
            // Reply overhead: verifier, end-of-list marker and eof flag.
            budget: maxcount.saturating_sub(8 + 4 + 4 + 16),
            list: Encoder::with_capacity(maxcount.min(64 * 1024)),
            names_bytes: 0,
            n: 0,
        })
    }

    /// Adds an entry whose attributes `attrs` writes (given the attributes
    /// asked for); false (and nothing added) when it does not fit the
    /// sizes the client asked for.
    pub(super) fn add(
        &mut self,
        next: u64,
        name: &[u8],
        attrs: impl FnOnce(&mut Encoder, &[u32]),
    ) -> bool {
        let mark = self.list.len();
        self.list.bool(true);
        self.list.u64(next);
        self.list.opaque(name);
        attrs(&mut self.list, &self.req);
        self.names_bytes += 8 + 4 + name.len().div_ceil(4) * 4;
        let names_full = self.dircount > 0 && self.n > 0 && self.names_bytes > self.dircount;
        if self.list.len() > self.budget || names_full {
            self.list.truncate(mark);
            return false;
        }
        self.n += 1;
        true
    }

    /// Writes READDIR4resok; NFS4ERR_TOOSMALL when not even one entry fit.
    pub(super) fn finish(self, e: &mut Encoder, eof: bool) -> Result<(), Nfsstat4> {
        if self.n == 0 && !eof {
            return Err(status::TOOSMALL);
        }
        e.opaque_fixed(&[0u8; 8]);
        e.raw(self.list.as_slice());
        e.bool(false);
        e.bool(eof);
        Ok(())
    }
}

/// How many more entries are likely to fit a listing's reply with `room`
/// bytes left, after `n` entries took `used` bytes (before any: as if each
/// took `guess`); `names` is the client's limit on the bytes of names and
/// cookies (dircount) and what the entries so far counted against it.
pub(super) fn entries_left(
    room: usize,
    used: usize,
    n: usize,
    guess: usize,
    names: Option<(usize, usize)>,
) -> usize {
    let per = if n == 0 { guess } else { used.div_ceil(n) };
    let mut left = room / per.max(1);
    if let Some((limit, counted)) = names {
        // Names and cookies take at least 16 bytes an entry.
        let per = if n == 0 { 16 } else { counted.div_ceil(n) };
        left = left.min(limit.saturating_sub(counted) / per.max(1) + 1);
    }
    left
}

/// Entries a listing stats before it looks their handles up (see
/// [`crate::engine::handle_memo`]): one read of the memo's deletes for
/// at most this many, and for as many as `room` bytes of reply may hold
/// (entries with attributes and a handle take 160 bytes or more), so
/// that few stats are made for entries that will not fit.
pub(super) fn stat_batch(room: usize) -> usize {
    (room / 160).clamp(1, 64)
}

/// The attributes a listing can answer from the directory alone, for
/// entries that are not directories: what the Linux client asks READDIR
/// for when it lists without attributes (`ls`, `find`, a shell's glob,
/// and every listing of a mount with `nordirplus`): each entry's type and
/// the file id that may be mounted on it. The directory gives each
/// entry's number and type with its name, and an entry that is not a
/// directory is no mount point (but for a file bind-mounted over another,
/// listed then as the file beneath, as the Linux server lists a mount
/// point it does not cross).
const FROM_THE_DIRECTORY: [u32; 4] = [
    attr::RDATTR_ERROR,
    attr::TYPE,
    attr::FILEID,
    attr::MOUNTED_ON_FILEID,
];

/// READDIR (RFC 8881 section 18.23). Cookies are the file system's own
/// directory offsets, which stay valid while the directory changes.
pub(super) fn readdir(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let mut listing = Listing::decode(d)?;
        let (dir, dst) = cur_dir(cx)?;
        let mut reader = io(fs::DirReader::open(dir.fd.as_fd(), listing.cookie))?;
        let mut eof = false;
        let want_fh = attrs::has(&listing.req, attr::FILEHANDLE);
        let ex = &cx.ex(&dir).fs;
        let names_only =
            attrs::only(&listing.req, &FROM_THE_DIRECTORY) && ex.numbers_in_directory();
        let dev = ex.dev();
        let mut batch = Vec::new();
        let mut entries = Vec::new();
        let mut unstatted = 0;
        'list: while !eof {
            // A batch of entries and their stats, then their handles: the
            // memo answers for stats made between its ticket and its
            // reading of deletes, once per batch. Stats the attribute
            // cache gives were true when it read its events, after the
            // ticket.
            batch.clear();
            let ticket = ex.memo().ticket();
            let size = stat_batch(listing.room());
            reader.expect(listing.entries_left(if names_only { 64 } else { 256 }));
            entries.clear();
            while entries.len() < size {
                let Some(ent) = io(reader.next_entry())? else {
                    eof = true;
                    break;
                };
                entries.push(ent);
            }
            // Names only: the directory gives a non-directory's type and
            // number; directories are stat'ed for the number a mount
            // point shows.
            let stats = ex.stats_of(dir.fd.as_fd(), dst.dev, &entries, |ent| {
                !names_only || ent.mode().is_none()
            });
            for (ent, st) in entries.drain(..).zip(stats) {
                if let Some(mode) = ent.mode().filter(|_| names_only) {
                    let st = fs::Stat {
                        mode,
                        dev,
                        ino: ent.ino,
                        ..fs::Stat::default()
                    };
                    batch.push((ent, st, true));
                } else if let Some(st) = st {
                    batch.push((ent, st, false));
                }
            }
            let mut fresh = want_fh.then(|| ex.memo().fresh(ticket));
            let mut kept = match &fresh {
                Some(f) => f.get_all(batch.iter().map(|(_, st, _)| Some(st))),
                None => Vec::new(),
            }
            .into_iter();
            for (ent, st, unstatted_entry) in &batch {
                let wire = match &mut fresh {
                    Some(f) => {
                        let kept = kept.next().flatten();
                        ex.handle_seen(f, kept, dir.fd.as_fd(), &ent.name, st).ok()
                    }
                    None => None,
                };
                let fits = listing.add(ent.next, ent.name.as_bytes(), |list, req| {
                    put_fattr(cx, list, wire.as_deref(), st, req, &dir)
                });
                if !fits {
                    eof = false;
                    break 'list;
                }
                unstatted += u64::from(*unstatted_entry);
            }
        }
        cx.srv
            .metrics
            .entries_listed_without_stat
            .fetch_add(unstatted, std::sync::atomic::Ordering::Relaxed);
        listing.finish(e, eof)
    })
}

/// READLINK.
pub(super) fn readlink(cx: &mut Ctx<'_>, _d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let fh = cx.cur()?;
        let st = stat_of(fh)?;
        if !st.is_symlink() {
            return Err(if st.is_dir() {
                status::ISDIR
            } else {
                status::INVAL
            });
        }
        let target = io(fs::readlink(fh.fd.as_fd()))?;
        e.opaque(&target);
        Ok(())
    })
}

/// CREATE: directories, symlinks, device nodes, sockets and FIFOs.
pub(super) fn create(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(CreateArgs::decode(d))?;
        let (kind, rdev) = match &args.objtype {
            Createtype4::Link(_) => (ftype::LNK, 0),
            Createtype4::Block(s) => (ftype::BLK, libc::makedev(s.major, s.minor)),
            Createtype4::Char(s) => (ftype::CHR, libc::makedev(s.major, s.minor)),
            Createtype4::Socket => (ftype::SOCK, 0),
            Createtype4::Fifo => (ftype::FIFO, 0),
            Createtype4::Dir => (ftype::DIR, 0),
            // Regular files are made by OPEN.
            Createtype4::Other(_) => return Err(status::BADTYPE),
        };
        let name = component_of(&args.objname)?;
        let a = attrs::settable(&args.attrs)?;
        let (dir, before) = cur_dir(cx)?;
        let dfd = dir.fd.as_fd();
        let mode = a
            .mode
            .unwrap_or(if kind == ftype::DIR { 0o755 } else { 0o644 });
        match kind {
            ftype::DIR => io(fs::mkdir_at(dfd, &name, mode))?,
            ftype::LNK => {
                let Createtype4::Link(t) = args.objtype else {
                    unreachable!("kind follows objtype")
                };
                let t = CString::new(t).map_err(|_| status::INVAL)?;
                io(fs::symlink_at(dfd, &name, &t))?
            }
            ftype::BLK => io(fs::mknod_at(dfd, &name, libc::S_IFBLK | mode, rdev))?,
            ftype::CHR => io(fs::mknod_at(dfd, &name, libc::S_IFCHR | mode, rdev))?,
            ftype::SOCK => io(fs::mknod_at(dfd, &name, libc::S_IFSOCK | mode, 0))?,
            _ => io(fs::mknod_at(dfd, &name, libc::S_IFIFO | mode, 0))?,
        }
        let (fh, st) = child(cx, &dir, &name)?;
        let rest = attrs::SetAttrs {
            mode: None,
            size: None,
            ..a.clone()
        };
        let changed = apply_attrs(&fh, &st, &rest)?;
        commit_dir(cx, &dir)?;
        if changed {
            commit_meta(cx, &fh, &st)?;
        }
        let after = stat_of(&dir)?;
        let mut set = a.mask;
        set[0] &= !(1 << attr::SIZE);
        CreateResOk {
            cinfo: cinfo(&before, &after),
            attrset: Bitmap4::trimmed(&set),
        }
        .encode(e);
        cx.cur = Some(fh);
        Ok(())
    })
}

/// REMOVE: files and empty directories.
pub(super) fn remove(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let name = component(d)?;
        let (dir, before) = cur_dir(cx)?;
        // A name removed during grace could be one a client is about to
        // reclaim an open of (as the Linux server, NFS4ERR_GRACE).
        cx.srv.state.check_not_in_grace()?;
        let st = io(fs::stat_at(dir.fd.as_fd(), &name))?;
        deleg_conflicts(cx, (st.dev, st.ino), true)?;
        io(fs::unlink_at(dir.fd.as_fd(), &name, st.is_dir()))?;
        if st.nlink <= 1 && !st.is_dir() {
            // What the server keeps open of it would keep its blocks.
            cx.srv.file_unlinked((st.dev, st.ino));
        }
        if st.nlink <= 1 || st.is_dir() {
            cx.ex(&dir).fs.forget_inode(&st);
        }
        commit_dir(cx, &dir)?;
        let after = stat_of(&dir)?;
        cinfo(&before, &after).encode(e);
        Ok(())
    })
}

/// RENAME: from the saved directory to the current one.
pub(super) fn rename(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(RenameArgs::decode(d))?;
        let from = component_of(&args.oldname)?;
        let to = component_of(&args.newname)?;
        let (tdir, tbefore) = cur_dir(cx)?;
        cx.srv.state.check_not_in_grace()?;
        let sdir = cx.saved()?.clone();
        // Within one directory (the usual rename), its status serves as
        // both the source's and the target's.
        let one_dir = Arc::ptr_eq(&sdir.fd, &tdir.fd);
        let sbefore = if one_dir { tbefore } else { stat_of(&sdir)? };
        if !sbefore.is_dir() {
            return Err(status::NOTDIR);
        }
        // A replaced target loses its name; forget its cached descriptor.
        if let Some(gone) = rename_checked(cx, &sdir, &from, &tdir, &to)? {
            if gone.is_file() && gone.nlink <= 1 {
                cx.srv.file_unlinked((gone.dev, gone.ino));
            }
            cx.ex(&tdir).fs.forget_inode(&gone);
        }
        commit_dir(cx, &tdir)?;
        if !one_dir {
            commit_dir(cx, &sdir)?;
        }
        let tafter = stat_of(&tdir)?;
        let safter = if one_dir { tafter } else { stat_of(&sdir)? };
        RenameResOk {
            source_cinfo: cinfo(&sbefore, &safter),
            target_cinfo: cinfo(&tbefore, &tafter),
        }
        .encode(e);
        Ok(())
    })
}

/// RENAME's work, NFSv4.1's and NFSv3's: renames `from` in `sdir` to
/// `to` in `tdir` once the delegations on what it changes are back, and
/// gives the inode it replaced (not when both names were links of one
/// inode: then nothing moved), whose descriptors the caller lets go.
///
/// It first asks for a rename that replaces nothing (RENAME_NOREPLACE),
/// which needs no look at either name: a name not in the kernel's cache
/// is looked up under the directory's lock, which every change in the
/// directory takes. The renamed object is stat'ed first only when some
/// file has a delegation. When the target exists (or the file system
/// cannot tell), both are looked at, and the rename replaces the target.
pub(super) fn rename_checked(
    cx: &Ctx<'_>,
    sdir: &Fh,
    from: &CStr,
    tdir: &Fh,
    to: &CStr,
) -> Result<Option<Stat>, Nfsstat4> {
    let recall = |st: &Stat| deleg_conflicts(cx, (st.dev, st.ino), true);
    let moved_now = || -> Result<Stat, Nfsstat4> {
        let st = io(fs::stat_at(sdir.fd.as_fd(), from))?;
        recall(&st)?;
        Ok(st)
    };
    let moved = if cx.srv.state.any_delegated() {
        Some(moved_now()?)
    } else {
        None
    };
    match fs::rename_noreplace(sdir.fd.as_fd(), from, tdir.fd.as_fd(), to) {
        Ok(()) => return Ok(None),
        Err(e) if !matches!(e.raw_os_error(), Some(libc::EEXIST | libc::EINVAL)) => {
            return io(Err(e))
        }
        Err(_) => {}
    }
    let moved = match moved {
        Some(st) => st,
        None => moved_now()?,
    };
    let gone = fs::stat_at(tdir.fd.as_fd(), to).ok();
    if let Some(gone) = &gone {
        recall(gone)?;
    }
    io(fs::rename_at(sdir.fd.as_fd(), from, tdir.fd.as_fd(), to))?;
    Ok(gone.filter(|g| (g.dev, g.ino) != (moved.dev, moved.ino)))
}

/// LINK: a new name in the current directory for the saved object.
pub(super) fn link(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let name = component(d)?;
        let (dir, before) = cur_dir(cx)?;
        let src = cx.saved()?.clone();
        let st = stat_of(&src)?;
        if st.is_dir() {
            return Err(status::ISDIR);
        }
        deleg_conflicts(cx, (st.dev, st.ino), true)?;
        io(fs::link_at(src.fd.as_fd(), dir.fd.as_fd(), &name))?;
        commit_dir(cx, &dir)?;
        commit_meta(cx, &src, &st)?;
        let after = stat_of(&dir)?;
        cinfo(&before, &after).encode(e);
        Ok(())
    })
}

/// SECINFO: AUTH_SYS and AUTH_NONE. It consumes the current filehandle.
pub(super) fn secinfo(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    secinfo_of(cx, d, e, false)
}

/// SECINFO_NO_NAME: as SECINFO, for the current filehandle or its parent.
pub(super) fn secinfo_no_name(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    secinfo_of(cx, d, e, true)
}

fn secinfo_of(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder, no_name: bool) -> OpStatus {
    run(|| {
        if no_name {
            let style = x(d.u32())?;
            if style > 1 {
                return Err(status::INVAL);
            }
            if style == 1 {
                let (dir, st) = cur_dir(cx)?;
                if cx.ex(&dir).fs.is_root(&st)
                    && !matches!(dir.loc, Loc::Export(i) if cx.srv.exports.parent_of_export(i).is_some())
                {
                    return Err(status::NOENT);
                }
            } else {
                cx.cur()?;
            }
        } else {
            let name = component(d)?;
            let (dir, _) = cur_dir(cx)?;
            io(fs::stat_at(dir.fd.as_fd(), &name))?;
        }
        put_flavors(e);
        cx.cur = None;
        Ok(())
    })
}

/// The security flavors of every object: AUTH_SYS and AUTH_NONE.
pub(super) fn put_flavors(e: &mut Encoder) {
    e.u32(2);
    e.u32(crate::rpc::AUTH_SYS);
    e.u32(crate::rpc::AUTH_NONE);
}

/// VERIFY: NFS4ERR_NOT_SAME unless the attributes are as given.
pub(super) fn verify(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    compare(cx, d, e, true)
}

/// NVERIFY: NFS4ERR_SAME when the attributes are as given.
pub(super) fn nverify(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    compare(cx, d, e, false)
}

fn compare(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder, same: bool) -> OpStatus {
    run(|| {
        let Fattr4 {
            mask: Bitmap4(bm),
            vals,
        } = x(Fattr4::decode(d))?;
        let sup = attrs::supported_in(cx.minor);
        for n in 0..(bm.len() as u32 * 32) {
            if attrs::has(&bm, n) {
                if !attrs::has(&sup, n) {
                    return Err(status::ATTRNOTSUPP);
                }
                if n == attr::RDATTR_ERROR
                    || n == attr::TIME_ACCESS_SET
                    || n == attr::TIME_MODIFY_SET
                {
                    return Err(status::INVAL);
                }
            }
        }
        let fh = cx.cur()?;
        let st = stat_any(cx, fh)?;
        let mut ours = Encoder::new();
        put_fattr(cx, &mut ours, Some(&fh.wire), &st, &bm, fh);
        let mut od = Decoder::new(ours.as_slice());
        let _ = od.bitmap(8);
        let ours_vals = od.opaque(usize::MAX).unwrap_or_default();
        let equal = ours_vals == vals;
        match (same, equal) {
            (true, true) | (false, false) => Ok(()),
            (true, false) => Err(status::NOT_SAME),
            (false, true) => Err(status::SAME),
        }
    })
}
