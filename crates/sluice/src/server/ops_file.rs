//! File state and data ops: OPEN, OPEN_DOWNGRADE, CLOSE, READ, WRITE,
//! COMMIT, LOCK, LOCKT, LOCKU, TEST_STATEID, FREE_STATEID, DELEGRETURN.

use super::attrs::{self, MAX_IO};
use super::context::{must_not_wait, Ctx, Fh, OpStatus, Outcome, Stop};
use super::ops_fs::{
    apply_attrs, cinfo, component_of, cur_dir, deleg_conflicts, fh_at, io, put_stateid, run,
    run_or_block, stat_cur, stat_of, stateid, x,
};
use super::state::{lock_range, DelegRequest, Denied, FileKey, OpenRequest, Stateid};
use super::Delegations;
use crate::engine::cred;
use crate::engine::fs::{self, SetTime, Stat, Time};
use crate::engine::rangelock::RangeGuard;
use crate::engine::read::{Data, Mode, ReadAt, ReadError};
use crate::nfs4::consts::status;
use crate::nfs4::msg::{
    deleg, lock_type, why_no_deleg, Bitmap4, CloseArgs, CommitArgs, Createhow4, LockArgs,
    LockDenied4, Locker4, LocktArgs, LockuArgs, Nfsace4, OpenArgs, OpenClaim4, OpenDelegation4,
    OpenDowngradeArgs, OpenNoneDelegation4, OpenReadDelegation4, OpenResOk, OpenWriteDelegation4,
    Openflag4, ReadArgs, SpaceLimit4, StateOwner4, TestStateidArgs, TestStateidResOk, WriteArgs,
    WriteResOk, Xdr, OPEN_RESULT_LOCKTYPE_POSIX, SHARE_ACCESS_READ, SHARE_ACCESS_WRITE,
    SHARE_WANT_ANY_DELEG, SHARE_WANT_CANCEL, SHARE_WANT_MASK, SHARE_WANT_NO_DELEG,
    SHARE_WANT_NO_PREFERENCE, SHARE_WANT_READ_DELEG, SHARE_WANT_WRITE_DELEG,
};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The (device, inode) key of a file.
pub(super) fn file_key(st: &Stat) -> FileKey {
    (st.dev, st.ino)
}

/// The current filehandle, which must be a regular file.
pub(super) fn cur_file(cx: &Ctx<'_>) -> Result<(Fh, Stat), Nfsstat4> {
    let fh = cx.cur()?.clone();
    let st = stat_of(&fh)?;
    file_only(fh, st)
}

/// Like [`cur_file`], for ops that write: the type and the (device,
/// inode) key only, without asking for the file's times (see
/// [`fs::identity`]).
pub(super) fn cur_file_to_write(cx: &Ctx<'_>) -> Result<(Fh, Stat), Nfsstat4> {
    let fh = cx.cur()?.clone();
    // What PUTFH read when it checked the handle, or a stat now.
    let st = match cx.cur_identity() {
        Some(st) => st,
        None => io(fs::identity(fh.fd.as_fd()))?,
    };
    file_only(fh, st)
}

fn file_only(fh: Fh, st: Stat) -> Result<(Fh, Stat), Nfsstat4> {
    if st.is_file() {
        Ok((fh, st))
    } else if st.is_dir() {
        Err(status::ISDIR)
    } else if st.is_symlink() {
        Err(status::SYMLINK)
    } else {
        Err(status::WRONG_TYPE)
    }
}

/// Opens the file with the descriptor flags matching share `access`.
fn open_for(fh: &Fh, access: u32) -> Result<Arc<OwnedFd>, Nfsstat4> {
    let fd = fh.fd.as_fd();
    let r = match access {
        SHARE_ACCESS_READ => fs::reopen(fd, libc::O_RDONLY),
        // Writers may need to read to fill partial pages: prefer O_RDWR.
        SHARE_ACCESS_WRITE => {
            fs::reopen(fd, libc::O_RDWR).or_else(|_| fs::reopen(fd, libc::O_WRONLY))
        }
        _ => fs::reopen(fd, libc::O_RDWR),
    };
    io(r).map(Arc::new)
}

/// A file OPEN created or found: handle, descriptor if opened, attributes
/// set, and the file's status when nothing changed it since it was read.
type Opened = (Fh, Option<Arc<OwnedFd>>, [u32; 3], Option<Stat>);

enum How {
    NoCreate,
    Unchecked(attrs::SetAttrs),
    Guarded(attrs::SetAttrs),
    Exclusive([u8; 8], attrs::SetAttrs),
}

/// The access and modify times an exclusive create keeps its verifier
/// in (NFSv4's EXCLUSIVE4_1 and NFSv3's EXCLUSIVE alike).
pub(super) fn verifier_times(v: &[u8; 8]) -> (Time, Time) {
    let a = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
    let m = u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
    (
        Time {
            sec: a as i64,
            nsec: 0,
        },
        Time {
            sec: m as i64,
            nsec: 0,
        },
    )
}

/// Creates or opens `name` in `dir` as OPEN's createhow asks. Returns the
/// handle, a descriptor if one was opened, and the attributes set.
/// `existing` runs first when the name is there already (a new file has
/// no delegations to recall, and is not looked for before it is made).
fn open_create(
    cx: &Ctx<'_>,
    dir: &Fh,
    name: &CString,
    how: &How,
    access: u32,
    existing: impl FnOnce() -> Result<(), Nfsstat4>,
) -> Result<Opened, Nfsstat4> {
    let flags = if access == SHARE_ACCESS_READ {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    let (a, exclusive) = match how {
        How::NoCreate => unreachable!("caller handles lookups"),
        How::Unchecked(a) => (a, false),
        How::Guarded(a) | How::Exclusive(_, a) => (a, true),
    };
    let mode = a.mode.unwrap_or(0o644);
    let created = match fs::create_file(dir.fd.as_fd(), name, mode, true, flags) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            existing()?;
            if exclusive {
                Err(e)
            } else {
                fs::create_file(dir.fd.as_fd(), name, mode, false, flags)
            }
        }
        r => r,
    };
    let (fd, made) = match created {
        Ok(v) => v,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let How::Exclusive(verf, _) = how else {
                return Err(status::EXIST);
            };
            // A retransmitted exclusive create finds its own verifier.
            let fd = io(fs::open_path_at(dir.fd.as_fd(), name))?;
            let st = io(fs::stat(fd.as_fd()))?;
            let (at, mt) = verifier_times(verf);
            if !st.is_file() || st.atime.sec != at.sec || st.mtime.sec != mt.sec {
                return Err(status::EXIST);
            }
            return Ok((fh_at(cx, dir, fd, &st)?, None, [0; 3], Some(st)));
        }
        Err(e) => return io(Err(e)),
    };
    let pfd = io(fs::open_path_at(dir.fd.as_fd(), name))?;
    let st = io(fs::stat(pfd.as_fd()))?;
    let fh = fh_at(cx, dir, pfd, &st)?;
    let mut set = a.mask;
    let changed;
    if made {
        let rest = attrs::SetAttrs {
            mode: None,
            ..a.clone()
        };
        let rest = if let How::Exclusive(verf, _) = how {
            // The verifier lives in atime and mtime: say so in attrset, so
            // the client sets the real times afterwards (RFC 8881 18.16.3).
            set[1] |= (1 << (crate::nfs4::consts::attr::TIME_ACCESS_SET - 32))
                | (1 << (crate::nfs4::consts::attr::TIME_MODIFY_SET - 32));
            let (at, mt) = verifier_times(verf);
            attrs::SetAttrs {
                atime: SetTime::At(at),
                mtime: SetTime::At(mt),
                ..rest
            }
        } else {
            rest
        };
        changed = apply_attrs(&fh, &st, &rest)?;
    } else {
        // UNCHECKED on an existing file: only the size is applied (others'
        // delegations were checked before the file was opened, in open).
        let only_size = attrs::SetAttrs {
            size: a.size,
            ..Default::default()
        };
        changed = apply_attrs(&fh, &st, &only_size)?;
        set = [0; 3];
        if a.size.is_some() {
            set[0] |= 1 << crate::nfs4::consts::attr::SIZE;
        }
    }
    if made {
        super::ops_fs::commit_dir(cx, dir)?;
    }
    if changed {
        super::ops_fs::commit_meta(cx, &fh, &st)?;
    }
    Ok((fh, Some(Arc::new(fd)), set, (!changed).then_some(st)))
}

/// OPEN (RFC 8881 section 18.16).
pub(super) fn open(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(OpenArgs::decode(d))?;
        let access = args.share_access & 3;
        let deny = args.share_deny & 3;
        let how = match &args.openhow {
            Openflag4::NoCreate => How::NoCreate,
            Openflag4::Create(Createhow4::Unchecked(a)) => How::Unchecked(attrs::settable(a)?),
            Openflag4::Create(Createhow4::Guarded(a)) => How::Guarded(attrs::settable(a)?),
            Openflag4::Create(Createhow4::Exclusive(v)) => {
                How::Exclusive(*v, attrs::SetAttrs::default())
            }
            Openflag4::Create(Createhow4::Exclusive41 { verifier, attrs: a }) => {
                let a = attrs::settable(a)?;
                let ok = attrs::exclcreat();
                if a.mask.iter().zip(ok.iter()).any(|(m, o)| m & !o != 0) {
                    return Err(status::INVAL);
                }
                How::Exclusive(*verifier, a)
            }
        };
        // CLAIM_PREVIOUS: an open held before the server restarted.
        let reclaim = matches!(args.claim, OpenClaim4::Previous(_));
        // CLAIM_DELEG_CUR_FH and CLAIM_DELEGATE_CUR: an open the client
        // made under its delegation, made real before it gives it back.
        let under_deleg = match &args.claim {
            OpenClaim4::DelegCurFh(sid) | OpenClaim4::DelegateCur { stateid: sid, .. } => {
                Some(cx.stateid(*sid)?)
            }
            _ => None,
        };
        let name = match &args.claim {
            OpenClaim4::Null(file) | OpenClaim4::DelegateCur { file, .. } => {
                Some(component_of(file)?)
            }
            OpenClaim4::Previous(_) | OpenClaim4::Fh | OpenClaim4::DelegCurFh(_) => None,
            OpenClaim4::DelegatePrev(_) | OpenClaim4::DelegPrevFh => return Err(status::NOTSUPP),
        };
        if access == 0 {
            return Err(status::INVAL);
        }
        if cx.cur_ex().rules.read_only
            && (access & SHARE_ACCESS_WRITE != 0 || !matches!(how, How::NoCreate))
        {
            return Err(status::ROFS);
        }
        let clientid = cx.clientid()?;
        // A new open in grace (any claim but CLAIM_PREVIOUS, as on the
        // Linux server) is refused before it creates or truncates
        // anything; the state table would refuse it too, but only after.
        if !reclaim {
            cx.srv.state.check_not_in_grace()?;
        }

        let (fh, fd, attrset, st, before, after_dir) = match &name {
            Some(name) => {
                let (dir, before) = cur_dir(cx)?;
                let (fh, fd, set, st) = match &how {
                    How::NoCreate => {
                        // The status first, so that the handle cache
                        // knows the descriptor's inode (see
                        // `Export::forget_inode`).
                        let pfd = io(fs::open_path_at(dir.fd.as_fd(), name))?;
                        let st = io(fs::stat(pfd.as_fd()))?;
                        (fh_at(cx, &dir, pfd, &st)?, None, [0; 3], Some(st))
                    }
                    h => {
                        // Creating opens an existing file for writing (or
                        // truncates it): delegations of others on it first.
                        let existing = || {
                            if let Ok(st) = fs::stat_at(dir.fd.as_fd(), name) {
                                let sized = matches!(h, How::Unchecked(a) if a.size.is_some());
                                if st.is_file() && (access != SHARE_ACCESS_READ || sized) {
                                    deleg_conflicts(cx, file_key(&st), true)?;
                                }
                                if st.is_file() {
                                    cx.srv.state.before_own_open(file_key(&st));
                                }
                            }
                            Ok(())
                        };
                        open_create(cx, &dir, name, h, access, existing)?
                    }
                };
                let after = stat_of(&dir)?;
                (fh, fd, set, st, before, after)
            }
            None => {
                if !matches!(how, How::NoCreate) {
                    return Err(status::INVAL);
                }
                let fh = cx.cur()?.clone();
                let st = stat_cur(cx, &fh)?;
                (fh, None, [0; 3], Some(st), st, st)
            }
        };
        let st = match st {
            Some(st) => st,
            None => stat_of(&fh)?,
        };
        if st.is_dir() {
            return Err(status::ISDIR);
        }
        if st.is_symlink() {
            return Err(status::SYMLINK);
        }
        if !st.is_file() {
            return Err(status::WRONG_TYPE);
        }
        let file = file_key(&st);
        match under_deleg {
            Some(d) => cx.srv.state.check_deleg_claim(&d, clientid, file)?,
            // Others' delegations give way to an open that may change the
            // file or keeps them from reading it.
            None => deleg_conflicts(
                cx,
                file,
                access & SHARE_ACCESS_WRITE != 0 || deny & SHARE_ACCESS_READ != 0,
            )?,
        }
        let req = OpenRequest {
            clientid,
            owner: args.owner.owner,
            file: file_key(&st),
            fh: fh.wire.clone(),
            access,
            deny,
            reclaim,
        };
        // An open made under a delegation uses the delegation's
        // descriptor when it allows the access: opening the file again
        // would break the write delegation's kernel lease.
        let deleg_fd = under_deleg.and_then(|d| cx.srv.state.io_state(&d, file).ok());
        let sid = cx.srv.state.open(req, |want| match (&fd, want) {
            (Some(fd), w) if w == access => Ok(fd.clone()),
            _ => match &deleg_fd {
                Some((dfd, allowed)) if want & !allowed == 0 => Ok(dfd.clone()),
                _ => {
                    cx.srv.state.before_own_open(file);
                    open_for(&fh, want)
                }
            },
        })?;
        // A new open may get a delegation; a reclaim gets back the one it
        // names.
        let reclaimed = match args.claim {
            OpenClaim4::Null(_) | OpenClaim4::Fh => Some(None),
            OpenClaim4::Previous(t) if t != deleg::NONE => Some(Some(t)),
            _ => None,
        };
        let delegation = match reclaimed {
            Some(reclaim) => delegate(
                cx,
                args.share_access,
                access,
                clientid,
                &sid,
                &fh,
                &st,
                reclaim,
            ),
            None => OpenDelegation4::None,
        };
        OpenResOk {
            stateid: sid,
            cinfo: cinfo(&before, &after_dir),
            rflags: OPEN_RESULT_LOCKTYPE_POSIX,
            attrset: Bitmap4::trimmed(&attrset),
            delegation,
        }
        .encode(e);
        // `st` is the file as the OPEN leaves it (read again after any
        // attribute it set): a GETATTR that follows answers from it.
        cx.cur_stat = Some((fh.fd.clone(), st));
        cx.cur = Some(fh);
        cx.cur_sid = Some(sid);
        Ok(())
    })
}

/// The delegation an OPEN of the file `st` for `access` gets (RFC 8881
/// section 10.4), when the server grants them and the client's back
/// channel answered its probe: a read delegation for a read-only open; a
/// write delegation for an open with write access under `--delegations
/// all`. With a WANT bit, the answer says why there is none. A reclaim
/// (`reclaim`, the delegation type of OPEN CLAIM_PREVIOUS) gets the type
/// it names back, with the recall flag set when the back channel is not
/// up or a local process has the file open.
#[allow(clippy::too_many_arguments)]
fn delegate(
    cx: &Ctx<'_>,
    share_access: u32,
    access: u32,
    clientid: u64,
    open: &Stateid,
    fh: &Fh,
    st: &Stat,
    reclaim: Option<u32>,
) -> OpenDelegation4 {
    let want = share_access & SHARE_WANT_MASK;
    let none = |why| OpenDelegation4::NoneExt(OpenNoneDelegation4 { why, later: false });
    if reclaim.is_none() {
        match want {
            SHARE_WANT_NO_DELEG => return none(why_no_deleg::NOT_WANTED),
            SHARE_WANT_CANCEL => return none(why_no_deleg::CANCELLED),
            _ => {}
        }
    }
    let asked = want != SHARE_WANT_NO_PREFERENCE && reclaim.is_none();
    let refused = |why| {
        if asked {
            none(why)
        } else {
            OpenDelegation4::None
        }
    };
    let back_channel_up = cx.back_channel_up();
    let write = match reclaim {
        Some(deleg::READ) => false,
        Some(deleg::WRITE) if access & SHARE_ACCESS_WRITE != 0 => true,
        Some(_) => return OpenDelegation4::None,
        None => {
            let policy = cx.srv.config.delegations;
            let may_write = policy == Delegations::All && access & SHARE_ACCESS_WRITE != 0;
            let may_read = policy != Delegations::None && access == SHARE_ACCESS_READ;
            let write = match want {
                SHARE_WANT_WRITE_DELEG if may_write => true,
                SHARE_WANT_READ_DELEG if may_read => false,
                SHARE_WANT_NO_PREFERENCE | SHARE_WANT_ANY_DELEG if may_write || may_read => {
                    may_write
                }
                _ => return refused(why_no_deleg::RESOURCE),
            };
            if !back_channel_up {
                return refused(why_no_deleg::RESOURCE);
            }
            write
        }
    };
    let Ok((fd, _)) = cx.srv.state.io_state(open, file_key(st)) else {
        return refused(why_no_deleg::RESOURCE);
    };
    if write {
        // The kernel grants a write lease only to the one open of the
        // file: what READs keep open of it for their streams (mappings of
        // earlier opens, O_DIRECT descriptors) goes first; streams open
        // it again when they read next. So do the descriptors stable
        // WRITEs keep to flush through (see `witness`).
        cx.srv.read.readahead.forget_file(file_key(st));
        cx.srv.witnesses.forget(file_key(st));
    }
    let granted = cx.srv.state.grant_deleg(DelegRequest {
        clientid,
        file: file_key(st),
        fh: &fh.wire,
        fd,
        access,
        write,
        change: st.change(),
        reclaim: reclaim.is_some(),
    });
    let Some(g) = granted else {
        return refused(why_no_deleg::CONTENTION);
    };
    let recall = g.unleased || !back_channel_up;
    // Nobody in particular: the client checks access itself (ACCESS).
    let permissions = Nfsace4 {
        acetype: 0, // ACE4_ACCESS_ALLOWED_ACE_TYPE
        flag: 0,
        access_mask: 0,
        who: Vec::new(),
    };
    if write {
        OpenDelegation4::Write(OpenWriteDelegation4 {
            stateid: g.stateid,
            recall,
            // Nothing is set aside for data the client keeps past CLOSE,
            // so it writes back when it closes (a limit of 0, as the Linux
            // server gives): a full file system then fails the close,
            // not a write-back nobody waits for.
            space_limit: SpaceLimit4::Size(0),
            permissions,
        })
    } else {
        OpenDelegation4::Read(OpenReadDelegation4 {
            stateid: g.stateid,
            recall,
            permissions,
        })
    }
}

/// OPEN_DOWNGRADE.
pub(super) fn open_downgrade(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(OpenDowngradeArgs::decode(d))?;
        let sid = cx.stateid(args.stateid)?;
        let (fh, _) = cur_file(cx)?;
        if cx.srv.state.other_file(&sid, &fh.wire) {
            return Err(status::BAD_STATEID);
        }
        let sid = cx
            .srv
            .state
            .downgrade(&sid, args.share_access & 3, args.share_deny & 3)?;
        put_stateid(e, &sid);
        cx.cur_sid = Some(sid);
        Ok(())
    })
}

/// CLOSE.
pub(super) fn close(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(CloseArgs::decode(d))?;
        let sid = cx.stateid(args.stateid)?;
        if cx.srv.state.other_file(&sid, &cx.cur()?.wire) {
            return Err(status::BAD_STATEID);
        }
        let file = cx.srv.state.close(&sid)?;
        cx.srv.read.readahead.forget_stream(file, stream_id(&sid));
        put_stateid(e, &Stateid::INVALID);
        Ok(())
    })
}

/// The descriptor to do I/O through for `sid` on the current file.
pub(super) fn io_fd(
    cx: &Ctx<'_>,
    fh: &Fh,
    st: &Stat,
    sid: Stateid,
    write: bool,
) -> Result<Arc<OwnedFd>, Nfsstat4> {
    let sid = cx.stateid(sid)?;
    deleg_conflicts(cx, file_key(st), write)?;
    if sid.is_special_io() {
        // I/O without an open could conflict with what clients are about
        // to reclaim: during grace only READ with the bypass stateid goes
        // (as on the Linux server).
        if write || sid == Stateid::ANONYMOUS {
            cx.srv.state.check_not_in_grace()?;
        }
        // Anonymous I/O: the caller's permissions decide.
        let flags = if write {
            libc::O_WRONLY
        } else {
            libc::O_RDONLY
        };
        cx.srv.state.before_own_open(file_key(st));
        // READ runs with whatever identity the thread has (see
        // `flags::ANY_IDENTITY`): the open is the caller's.
        let _as = cred::assume(&cx.id);
        return io(fs::reopen(fh.fd.as_fd(), flags)).map(Arc::new);
    }
    let (fd, access) = cx.srv.state.io_state(&sid, file_key(st))?;
    if write && access & SHARE_ACCESS_WRITE == 0 {
        return Err(status::OPENMODE);
    }
    Ok(fd)
}

/// The readahead stream a stateid reads as: one per open (or lock) state.
pub(super) fn stream_id(sid: &Stateid) -> u64 {
    let o = sid.other;
    u64::from_le_bytes([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
        ^ (u32::from_le_bytes([o[8], o[9], o[10], o[11]]) as u64).rotate_left(32)
}

/// Whether this COMPOUND's ops may wait (see [`must_not_wait`]).
pub(super) fn read_mode() -> Mode {
    if must_not_wait() {
        Mode::NoWait
    } else {
        Mode::Wait
    }
}

/// What a read that gave no data means for the op.
fn stop(e: ReadError) -> Stop {
    match e {
        ReadError::WouldBlock => Stop::WouldBlock,
        ReadError::Io(e) => Stop::Status(Nfsstat4::from(&e)),
    }
}

/// Reads up to `count` bytes at `offset` for READ and READ_PLUS through the
/// engine's read path (see `sluice_engine::read`), as the open's stream;
/// a write-only open reads through a fresh descriptor.
pub(super) fn read_data(
    cx: &Ctx<'_>,
    fh: &Fh,
    fd: &Arc<OwnedFd>,
    st: &Stat,
    sid: Stateid,
    offset: u64,
    count: usize,
) -> Result<Data, Stop> {
    // Under a write delegation's kernel lease the file is not opened
    // again (O_DIRECT) to read; a write-only descriptor has to be, and the
    // lease goes first.
    let leased = cx.srv.state.write_delegated(file_key(st));
    if leased && fs::write_only(fd.as_fd()) {
        cx.srv.state.before_own_open(file_key(st));
    }
    let at = ReadAt {
        file: file_key(st),
        st,
        fd,
        path: fh.fd.as_fd(),
        stream: stream_id(&cx.stateid(sid)?),
        offset,
        count,
        direct: !leased,
        lend: cx.lend,
    };
    let data = cx.srv.read.read(&at, read_mode()).map_err(stop)?;
    cx.srv.metrics.reads.fetch_add(1, Ordering::Relaxed);
    Ok(data)
}

/// Writes file data as XDR opaque data: spliced in by reference, and
/// marked as lent when it is (see `sluice_engine::mapped`).
pub(super) fn put_data(e: &mut Encoder, data: Data) {
    if data.lent {
        e.opaque_lent(data.bytes);
    } else if data.more.is_empty() {
        e.opaque_shared(data.bytes);
    } else {
        let mut pieces = Vec::with_capacity(1 + data.more.len());
        pieces.push(data.bytes);
        pieces.extend(data.more);
        e.opaque_pieces(&pieces);
    }
}

/// The shared range lock a READ or READ_PLUS holds around its data. On
/// the connection's task only when it is free now ([`Stop::WouldBlock`]
/// otherwise, to wait for it elsewhere).
pub(super) fn read_lock<'a>(
    cx: &Ctx<'a>,
    key: (u64, u64),
    start: u64,
    end: u64,
) -> Result<RangeGuard<'a>, Stop> {
    cx.srv.read.lock(key, start, end, read_mode()).map_err(stop)
}

/// What READ and READ_PLUS begin with: the arguments (the count cut to
/// the export's limit), the file, the descriptor to read through, and the
/// shared range lock over the range asked for, held while it lives.
pub(super) struct ReadStart<'a> {
    pub sid: Stateid,
    pub offset: u64,
    pub count: u64,
    pub fh: Fh,
    pub st: Stat,
    pub fd: Arc<OwnedFd>,
    pub _shared: RangeGuard<'a>,
}

/// Decodes READ4args (also READ_PLUS's) and takes what the read needs.
pub(super) fn read_start<'a>(cx: &Ctx<'a>, d: &mut Decoder<'_>) -> Result<ReadStart<'a>, Stop> {
    let ReadArgs {
        stateid: sid,
        offset,
        count,
    } = x(ReadArgs::decode(d))?;
    let count = count.min(cx.cur_ex().rules.max_read) as u64;
    // The status the op before read (PUTFH before READ), or a stat now.
    let (fh, st) = match cx.cur_stat() {
        Some(st) => file_only(cx.cur()?.clone(), st)?,
        None => cur_file(cx)?,
    };
    let fd = io_fd(cx, &fh, &st, sid, false)?;
    let _shared = read_lock(cx, file_key(&st), offset, offset.saturating_add(count))?;
    Ok(ReadStart {
        sid,
        offset,
        count,
        fh,
        st,
        fd,
        _shared,
    })
}

/// Runs a READ or READ_PLUS body and records its latency, unless it
/// stopped to wait (it is timed again when it runs where it may).
pub(super) fn timed_read(cx: &Ctx<'_>, body: impl FnOnce() -> Result<(), Stop>) -> Outcome {
    let started = Instant::now();
    let st = run_or_block(body);
    if st != Outcome::WouldBlock {
        cx.srv.metrics.read_latency.observe(started.elapsed());
    }
    st
}

/// READ.
pub(super) fn read(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> Outcome {
    let cx = &*cx;
    timed_read(cx, || {
        let r = read_start(cx, d)?;
        let data = read_data(cx, &r.fh, &r.fd, &r.st, r.sid, r.offset, r.count as usize)?;
        let len = data.len() as u64;
        let end = r.offset.saturating_add(len);
        let eof = end >= io(status_after_read(&r.fd, &r.st, r.count, len, end))?.size;
        cx.srv
            .metrics
            .read_bytes_sent
            .fetch_add(len, Ordering::Relaxed);
        e.bool(eof);
        put_data(e, data);
        Ok(())
    })
}

/// The status a READ (NFSv4's and NFSv3's) answers its eof by, and
/// NFSv3's post-op attributes: `st`, read before the data, when the READ
/// got all the `count` bytes it asked for (`len`) and ends at `end`
/// before that size; otherwise the file's status now, through `fd`.
///
/// A file cut shorter after `st` was read gives a short read, which is
/// checked against its size now. One cut to just where the READ ends is
/// answered eof false, and the client's next READ gets eof. Attributes
/// read before the data are never newer than it: a write that came
/// between the two makes the client read again, where attributes read
/// after could label old data with the write's times. (A READ changes no
/// attribute a client keeps.)
pub(super) fn status_after_read(
    fd: &OwnedFd,
    st: &Stat,
    count: u64,
    len: u64,
    end: u64,
) -> std::io::Result<Stat> {
    if len == count && end < st.size {
        Ok(*st)
    } else {
        fs::stat(fd.as_fd())
    }
}

/// WRITE.
pub(super) fn write(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let WriteArgs {
            stateid: sid,
            offset,
            stable,
            data,
        } = x(WriteArgs::decode(d, MAX_IO as usize))?;
        if stable > 2 {
            return Err(status::BADXDR);
        }
        // Past the export's limit: a short write, which clients resume.
        let data = &data[..data.len().min(cx.cur_ex().rules.max_write as usize)];
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(status::FBIG);
        }
        let (fh, st) = cur_file_to_write(cx)?;
        let fd = io_fd(cx, &fh, &st, sid, true)?;
        // The verifier before the write: should a failure change it while
        // this WRITE runs, the client sends the data again.
        let verifier = cx.srv.write_verifier();
        let witness = if stable > 0 {
            cx.srv.flush_witness(file_key(&st), fh.fd.as_fd())
        } else {
            None
        };
        let (n, cached) = {
            let _exclusive = cx
                .srv
                .locks
                .write(file_key(&st), offset, offset + data.len() as u64);
            let written = io(write_data(cx.srv, file_key(&st), fd.as_fd(), data, offset))?;
            cx.srv.file_changed(file_key(&st));
            written
        };
        if cached && stable == 0 {
            write_behind(cx.srv, fd.as_fd(), offset, n);
        }
        if stable > 0 {
            stable_flush(cx.srv, file_key(&st), witness, &fd, stable == 2, verifier)?;
        }
        WriteResOk {
            count: n as u32,
            committed: stable,
            verifier,
        }
        .encode(e);
        Ok(())
    })
}

/// The flush of a stable WRITE (NFSv4's and NFSv3's), which wrote
/// through `fd` after reading `verifier`: through `witness`, a
/// description of its own (see `Server::flush_witness`), when it has one;
/// otherwise through `fd`, and then a changed verifier says that a
/// failure may have been told to another flush of `fd` instead: the WRITE
/// fails with NFS4ERR_IO, since a stable WRITE cannot be answered as
/// UNSTABLE.
pub(super) fn stable_flush(
    srv: &super::Server,
    file: (u64, u64),
    witness: Option<super::witness::Witness>,
    fd: &OwnedFd,
    metadata: bool,
    verifier: [u8; 8],
) -> Result<(), Nfsstat4> {
    match witness {
        Some(w) => {
            let r = srv.flush_file(file, w.as_fd(), metadata);
            // Its flush has ended: it serves the next stable WRITE of the
            // file as a new one would (see `witness`).
            srv.witnesses.keep(file, w);
            io(r)
        }
        None => {
            let now = io(srv.flush_then_verifier(file, fd.as_fd(), metadata))?;
            if now == verifier {
                Ok(())
            } else {
                Err(status::IO)
            }
        }
    }
}

/// WRITEs through the page cache of at least this many bytes copy their
/// data one at a time per file, asleep while they wait (see
/// `engine::turns`). Measured on a 2-CPU machine, 1 GiB streams into new
/// page-cache pages: 1 MiB and 512 KiB WRITEs, 8 in flight, took 11-36%
/// less server CPU, at the same rate or faster; 256 KiB and 128 KiB ones
/// 10-17% less CPU but up to 9% slower, the turn handed over once per
/// shorter copy. Overwriting cached pages, no difference
/// (docs/benchmarks.md, "Large WRITEs of one file take turns").
pub(super) const WRITE_TURN_MIN: usize = 512 * 1024;

// Quick WRITEs run on the connection's thread, which must not wait for a
// turn.
const _: () = assert!(WRITE_TURN_MIN > super::inline::QUICK_WRITE);

/// Writes a WRITE's data: large aligned writes past the page cache
/// (O_DIRECT), where writeback would hold a stream back; the rest, and
/// everything on file systems without O_DIRECT, through it.
/// Not while the file has a delegation: the descriptor of its own that
/// such a write opens would break the delegation's kernel lease.
/// The bytes written, and whether they went through the page cache (see
/// [`write_behind`]).
pub(super) fn write_data(
    srv: &super::Server,
    file: (u64, u64),
    fd: std::os::fd::BorrowedFd<'_>,
    data: &[u8],
    offset: u64,
) -> std::io::Result<(usize, bool)> {
    let min = srv.config.direct_write_min;
    if min > 0
        && data.len() as u64 >= min
        && offset.is_multiple_of(4096)
        && data.len().is_multiple_of(4096)
        && !srv.state.file_delegated(file)
    {
        match fs::write_direct_at(fd, data, offset) {
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            // It writes back the range's cached pages first: its failures
            // may be theirs.
            r => {
                return r
                    .map(|n| (n, false))
                    .inspect_err(|e| srv.storage_failed(file, super::Storing::Flush, e))
            }
        }
    }
    // Large copies into the page cache take turns (engine::turns).
    let _turn = (data.len() >= WRITE_TURN_MIN).then(|| {
        let (held, waited) = srv.write_turns.take(file);
        if waited {
            srv.metrics
                .write_turns_waited
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        held
    });
    fs::write_at(fd, data, offset)
        .map(|n| (n, true))
        .inspect_err(|e| srv.storage_failed(file, super::Storing::Write, e))
}

/// After an UNSTABLE WRITE of `n` bytes at `offset` through the page
/// cache (and outside its range lock, since the device may make this
/// wait): a large one is a stream's, and starts its writeback now, so
/// that the COMMIT ending the stream waits for its last pieces only
/// (`Config::write_behind_min`). Nothing is answered as stable on the
/// strength of this. (A stable WRITE syncs its data at once anyway; on
/// xfs, starting its writeback first made a FILE_SYNC stream slower.)
pub(super) fn write_behind(
    srv: &super::Server,
    fd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
    n: usize,
) {
    let min = srv.config.write_behind_min;
    if min > 0 && n as u64 >= min && fs::start_writeback(fd, offset, n as u64).is_ok() {
        srv.metrics
            .write_behind_bytes
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// COMMIT: flushes the file to stable storage.
pub(super) fn commit(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let CommitArgs { offset, count } = x(CommitArgs::decode(d))?;
        if offset.checked_add(count as u64).is_none() {
            return Err(status::INVAL);
        }
        let (fh, st) = cur_file(cx)?;
        // Through a descriptor an open (or delegation) of the file has,
        // when there is one: opening it again would break a write
        // delegation's kernel lease.
        let fd = match cx.srv.state.any_fd(file_key(&st)) {
            Some(fd) => fd,
            None => {
                cx.srv.state.before_own_open(file_key(&st));
                Arc::new(io(cred::as_root(|| {
                    fs::reopen(fh.fd.as_fd(), libc::O_RDONLY)
                }))?)
            }
        };
        let verifier = io(cx.srv.flush_then_verifier(file_key(&st), fd.as_fd(), true))?;
        e.opaque_fixed(&verifier);
        Ok(())
    })
}

fn denied4(dn: Denied) -> LockDenied4 {
    LockDenied4 {
        offset: dn.offset,
        length: dn.length,
        locktype: if dn.write {
            lock_type::WRITE
        } else {
            lock_type::READ
        },
        owner: StateOwner4 {
            clientid: dn.clientid,
            owner: dn.owner,
        },
    }
}

/// Whether a lock type is for writing; INVAL for no lock type.
fn lock_kind(t: u32) -> Result<bool, Nfsstat4> {
    match t {
        lock_type::READ | lock_type::READW => Ok(false),
        lock_type::WRITE | lock_type::WRITEW => Ok(true),
        _ => Err(status::INVAL),
    }
}

/// LOCK.
pub(super) fn lock(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let mut denied = None;
    let st = run(|| {
        let args = x(LockArgs::decode(d))?;
        let write = lock_kind(args.locktype)?;
        let (_, st) = cur_file(cx)?;
        let range = lock_range(args.offset, args.length)?;
        let file = file_key(&st);
        let r = match args.locker {
            Locker4::New(n) => {
                let open = cx.stateid(n.open_stateid)?;
                let clientid = cx.clientid()?;
                cx.srv.state.lock_new_owner(
                    &open,
                    clientid,
                    &n.lock_owner.owner,
                    file,
                    range,
                    write,
                    args.reclaim,
                )?
            }
            Locker4::Existing(x) => {
                let sid = cx.stateid(x.lock_stateid)?;
                cx.srv
                    .state
                    .lock_existing(&sid, file, range, write, args.reclaim)?
            }
        };
        match r {
            Ok(sid) => {
                sid.encode(e);
                cx.cur_sid = Some(sid);
                // A write lock made a read lock frees what NLM locks may
                // wait for.
                if !write {
                    super::nlm::wake_file(cx.srv, file);
                }
                Ok(())
            }
            Err(dn) => {
                denied = Some(dn);
                Err(status::DENIED)
            }
        }
    });
    if let Some(dn) = denied {
        denied4(dn).encode(e);
    }
    st
}

/// LOCKT.
pub(super) fn lockt(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let mut denied = None;
    let st = run(|| {
        let args = x(LocktArgs::decode(d))?;
        let write = lock_kind(args.locktype)?;
        let (fh, st) = cur_file(cx)?;
        let range = lock_range(args.offset, args.length)?;
        let clientid = cx.clientid()?;
        // Other nodes' locks are seen through a descriptor of the file.
        let probe = if cx.srv.config.shared_locks {
            cred::as_root(|| fs::reopen(fh.fd.as_fd(), libc::O_RDONLY)).ok()
        } else {
            None
        };
        match cx.srv.state.test_lock(
            clientid,
            &args.owner.owner,
            file_key(&st),
            range,
            write,
            probe.as_ref(),
        )? {
            None => Ok(()),
            Some(dn) => {
                denied = Some(dn);
                Err(status::DENIED)
            }
        }
    });
    if let Some(dn) = denied {
        denied4(dn).encode(e);
    }
    st
}

/// LOCKU.
pub(super) fn locku(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(LockuArgs::decode(d))?;
        lock_kind(args.locktype)?;
        let sid = cx.stateid(args.lock_stateid)?;
        let (_, st) = cur_file(cx)?;
        let range = lock_range(args.offset, args.length)?;
        let sid = cx.srv.state.unlock(&sid, file_key(&st), range)?;
        sid.encode(e);
        cx.cur_sid = Some(sid);
        super::nlm::wake_file(cx.srv, file_key(&st));
        Ok(())
    })
}

/// TEST_STATEID.
pub(super) fn test_stateid(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(TestStateidArgs::decode(d))?;
        TestStateidResOk {
            codes: args.stateids.iter().map(|s| cx.srv.state.test(s)).collect(),
        }
        .encode(e);
        Ok(())
    })
}

/// FREE_STATEID.
pub(super) fn free_stateid(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let sid = stateid(d)?;
        cx.srv.state.free(&sid)
    })
}

/// DELEGRETURN (RFC 8881 section 18.6).
pub(super) fn delegreturn(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let sid = cx.stateid(stateid(d)?)?;
        let fh = cx.cur()?.clone();
        let st = stat_of(&fh)?;
        cx.srv.state.delegreturn(&sid, file_key(&st))?;
        // What its READs kept (a mapping of the file, an O_DIRECT
        // descriptor) goes with it, as an open's does at CLOSE.
        cx.srv
            .read
            .readahead
            .forget_stream(file_key(&st), stream_id(&sid));
        // NLM locks that waited for the delegation to come back.
        super::nlm::wake_file(cx.srv, file_key(&st));
        Ok(())
    })
}
