//! Server-side copies (RFC 7862): CLONE, which makes a range of the
//! destination share the source's extents (FICLONERANGE), on file
//! systems that have shared extents (xfs with reflink, btrfs); and COPY,
//! which copies the range on the server (synchronously, or on a thread of
//! its own that OFFLOAD_STATUS and OFFLOAD_CANCEL reach and CB_OFFLOAD
//! ends; see [`super::copies`]).

use super::callback;
use super::context::{Ctx, Fh, OpStatus};
use super::copies::{End, Job};
use super::ops_file::{file_key, io_fd};
use super::ops_fs::{run, stat_of, x};
use super::state::{FileKey, Stateid};
use super::Server;
use crate::engine::copy::{self, Range};
use crate::engine::fs;
use crate::engine::rangelock::{RangeGuard, RangeLocks};
use crate::nfs4::consts::status;
use crate::nfs4::msg::{
    CloneArgs, CopyArgs, CopyRequirements4, CopyResOk, OffloadArgs, OffloadInfo4,
    OffloadStatusResOk, WriteResponse4, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Most bytes one synchronous COPY copies (the client asks again for the
/// rest), so that no request thread is held for long; also the size from
/// which a COPY the client lets run asynchronously does.
pub(super) const SYNC_MAX: u64 = 16 << 20;
/// Bytes copied under one pair of range locks: readers and writers of
/// the ranges wait at most for one piece.
const PIECE: u64 = 8 << 20;

/// UNSTABLE4 and FILE_SYNC4.
const UNSTABLE: u32 = 0;
const FILE_SYNC: u32 = 2;

/// The status of a failed FICLONERANGE: NFS4ERR_NOTSUPP where the file
/// system has no shared extents (as the Linux server; the Linux client
/// then tells `cp --reflink` EOPNOTSUPP), NFS4ERR_INVAL for a range the
/// file system cannot clone (not aligned to its block size).
fn clone_err(e: std::io::Error) -> Nfsstat4 {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOTTY) => status::NOTSUPP,
        Some(libc::EXDEV) => status::XDEV,
        Some(libc::EINVAL) => status::INVAL,
        _ => Nfsstat4::from(&e),
    }
}

/// What CLONE and COPY start from: the source (saved filehandle) and the
/// destination (current filehandle), descriptors for reading and writing
/// them through the stateids given, and the range, checked.
#[derive(Clone)]
struct TwoFiles {
    dst: Fh,
    sfd: Arc<OwnedFd>,
    dfd: Arc<OwnedFd>,
    skey: FileKey,
    dkey: FileKey,
    range: Range,
}

/// Checks both files and the range (RFC 7862 sections 15.2.3 and
/// 15.13.3): regular files, a source range within the source (`count` 0
/// is to its end), and no overlap within one file.
fn two_files(
    cx: &Ctx<'_>,
    src_sid: Stateid,
    dst_sid: Stateid,
    src_offset: u64,
    dst_offset: u64,
    count: u64,
) -> Result<TwoFiles, Nfsstat4> {
    let src = cx.saved()?.clone();
    let dst = cx.cur()?.clone();
    let (sst, dst_st) = (stat_of(&src)?, stat_of(&dst)?);
    for st in [&sst, &dst_st] {
        if st.is_dir() {
            return Err(status::ISDIR);
        }
        if !st.is_file() {
            return Err(status::WRONG_TYPE);
        }
    }
    let sfd = io_fd(cx, &src, &sst, src_sid, false)?;
    let dfd = io_fd(cx, &dst, &dst_st, dst_sid, true)?;
    let len = if count == 0 {
        sst.size.checked_sub(src_offset).ok_or(status::INVAL)?
    } else {
        count
    };
    let (Some(send), Some(dend)) = (src_offset.checked_add(len), dst_offset.checked_add(len))
    else {
        return Err(status::INVAL);
    };
    if send > sst.size {
        return Err(status::INVAL);
    }
    if dend > i64::MAX as u64 {
        return Err(status::FBIG);
    }
    let (skey, dkey) = (file_key(&sst), file_key(&dst_st));
    if skey == dkey && len > 0 && src_offset < dend && dst_offset < send {
        // Overlapping ranges of one file.
        return Err(status::INVAL);
    }
    Ok(TwoFiles {
        dst,
        sfd,
        dfd,
        skey,
        dkey,
        range: Range {
            src_offset,
            dst_offset,
            len,
        },
    })
}

/// The source range read-locked and the destination range write-locked,
/// in one order (file, then offset), so that two copies the other way
/// round cannot wait for each other.
fn lock_both<'a>(
    locks: &'a RangeLocks,
    skey: FileKey,
    dkey: FileKey,
    src_offset: u64,
    dst_offset: u64,
    len: u64,
) -> (RangeGuard<'a>, RangeGuard<'a>) {
    if (skey, src_offset) <= (dkey, dst_offset) {
        let r = locks.read(skey, src_offset, src_offset + len);
        (r, locks.write(dkey, dst_offset, dst_offset + len))
    } else {
        let w = locks.write(dkey, dst_offset, dst_offset + len);
        (locks.read(skey, src_offset, src_offset + len), w)
    }
}

/// CLONE (RFC 7862 section 15.13): from the saved filehandle's file to the
/// current one's, with both ranges locked as READ and WRITE lock theirs.
pub(super) fn clone(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let a = x(CloneArgs::decode(d))?;
        let f = two_files(
            cx,
            a.src_stateid,
            a.dst_stateid,
            a.src_offset,
            a.dst_offset,
            a.count,
        )?;
        let r = f.range;
        if r.len == 0 {
            // Nothing to clone (FICLONERANGE would take 0 as "to the end").
            return Ok(());
        }
        {
            let _locked = lock_both(
                &cx.srv.locks,
                f.skey,
                f.dkey,
                r.src_offset,
                r.dst_offset,
                r.len,
            );
            fs::clone_range(
                f.sfd.as_fd(),
                r.src_offset,
                r.len,
                f.dfd.as_fd(),
                r.dst_offset,
            )
            .map_err(clone_err)?;
            cx.srv.file_changed(f.dkey);
        }
        // On a `sync` export the clone is durable before it is answered,
        // as the Linux server does (the destination's blocks are its
        // metadata: fsync, not an fdatasync that may skip them).
        super::ops_fs::commit_file(cx, cx.cur()?, f.dkey)
    })
}

/// Copies up to `limit` bytes of `f.range`, a piece at a time, each
/// under the range locks; stops early when `job` is cancelled. The bytes
/// of the range covered (a prefix of it). An error after some bytes were
/// copied ends the copy short, as a short copy.
fn copy_pieces(srv: &Server, f: &TwoFiles, limit: u64, job: Option<&Job>) -> Result<u64, Nfsstat4> {
    let r = f.range;
    let limit = limit.min(r.len);
    let mut done = 0u64;
    copy::prefetch(f.sfd.as_fd(), r.src_offset, PIECE.min(limit));
    while done < limit && !job.is_some_and(|j| j.cancelled()) {
        let piece = PIECE.min(limit - done);
        let next = done + piece;
        if next < limit {
            copy::prefetch(f.sfd.as_fd(), r.src_offset + next, PIECE.min(limit - next));
        }
        let step = {
            let _locked = lock_both(
                &srv.locks,
                f.skey,
                f.dkey,
                r.src_offset + done,
                r.dst_offset + done,
                piece,
            );
            copy::step(f.sfd.as_fd(), f.dfd.as_fd(), r, done, piece)
        };
        srv.file_changed(f.dkey);
        match step {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                srv.metrics.copy_bytes.fetch_add(n, Ordering::Relaxed);
                if let Some(j) = job {
                    j.set_copied(done);
                }
            }
            Err(e) if done == 0 => {
                srv.storage_failed(f.dkey, super::Storing::Write, &e);
                return Err(Nfsstat4::from(&e));
            }
            Err(e) => {
                srv.storage_failed(f.dkey, super::Storing::Write, &e);
                tracing::info!(error = %e, copied = done, "copy ended short");
                break;
            }
        }
    }
    Ok(done)
}

/// COPY (RFC 7862 section 15.2) within this server, from the saved
/// filehandle's file to the current one's. A copy of at most
/// [`SYNC_MAX`] bytes, one the client wants synchronous, or one from a
/// client whose back channel does not work is done before the reply (at
/// most [`SYNC_MAX`] bytes of it: the client asks for the rest). Longer
/// ones run on a thread of their own.
pub(super) fn copy(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let a = x(CopyArgs::decode(d))?;
        if !a.source_server.is_empty() {
            // A copy from another server (COPY_NOTIFY's partner): not
            // offered.
            return Err(status::NOTSUPP);
        }
        let f = two_files(
            cx,
            a.src_stateid,
            a.dst_stateid,
            a.src_offset,
            a.dst_offset,
            a.count,
        )?;
        cx.srv.metrics.copies.fetch_add(1, Ordering::Relaxed);
        let may_go_on = !a.synchronous && f.range.len > SYNC_MAX && cx.back_channel_up();
        if let Some(id) = may_go_on.then(|| start_async(cx, &f)).flatten() {
            CopyResOk {
                response: WriteResponse4 {
                    callback_id: Some(id),
                    count: 0,
                    committed: UNSTABLE,
                    verifier: cx.srv.write_verifier(),
                },
                requirements: CopyRequirements4 {
                    consecutive: true,
                    synchronous: false,
                },
            }
            .encode(e);
            return Ok(());
        }
        // The verifier before the copy (see WRITE).
        let verifier = cx.srv.write_verifier();
        let n = copy_pieces(cx.srv, &f, SYNC_MAX, None)?;
        CopyResOk {
            response: WriteResponse4 {
                callback_id: None,
                count: n,
                committed: UNSTABLE,
                verifier,
            },
            requirements: CopyRequirements4 {
                consecutive: true,
                synchronous: true,
            },
        }
        .encode(e);
        Ok(())
    })
}

/// Starts copying `f` on a thread of its own; its stateid. None when no
/// thread can take it (too many copies running, or a server that is not
/// shared): the caller copies synchronously instead.
fn start_async(cx: &Ctx<'_>, f: &TwoFiles) -> Option<Stateid> {
    let clientid = cx.clientid().ok()?;
    let srv = cx.srv.me()?;
    let job = cx
        .srv
        .copies
        .start(clientid, cx.srv.state.new_stateid(), f.dst.wire.clone())?;
    let spawned = std::thread::Builder::new()
        .name("sluice-copy".into())
        .spawn({
            let (job, f) = (job.clone(), f.clone());
            move || run_async(&srv, &f, &job)
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a copy thread; copying synchronously");
        cx.srv.copies.remove(&job.stateid.other);
        cx.srv.copies.stopped();
        return None;
    }
    match cx.conn {
        Some(conn) => {
            let j = job.clone();
            conn.after_reply(move || j.replied());
        }
        None => job.replied(),
    }
    Some(job.stateid)
}

/// An asynchronous copy, on its own thread: copies, makes the copy
/// durable, records how it ended and, unless it was cancelled, tells the
/// client with CB_OFFLOAD.
fn run_async(srv: &Arc<Server>, f: &TwoFiles, job: &Job) {
    let started = std::time::Instant::now();
    // The verifier before the copy (see WRITE): should a flush fail
    // meanwhile, the client's COMMIT answers another one.
    let verifier = srv.write_verifier();
    let result = copy_pieces(srv, f, u64::MAX, Some(job));
    let end = match result {
        Ok(n) => {
            // As the Linux server: the copy is on disk when CB_OFFLOAD
            // says so (FILE_SYNC), or the client commits (UNSTABLE).
            let flushed = n == 0
                || srv
                    .flush_then_verifier(f.dkey, f.dfd.as_fd(), false)
                    .is_ok_and(|now| now == verifier);
            let committed = if !flushed { UNSTABLE } else { FILE_SYNC };
            End {
                status: status::OK,
                count: n,
                committed,
                cancelled: false,
            }
        }
        Err(st) => End {
            status: st,
            count: 0,
            committed: UNSTABLE,
            cancelled: false,
        },
    };
    job.finish(end);
    srv.copies.stopped();
    let end = job.end().unwrap_or(end);
    tracing::debug!(
        clientid = format!("{:#x}", job.clientid),
        bytes = end.count,
        status = %end.status,
        cancelled = end.cancelled,
        elapsed = ?started.elapsed(),
        "asynchronous copy ended"
    );
    if end.cancelled {
        // OFFLOAD_CANCEL: no CB_OFFLOAD (RFC 7862 section 15.8.3).
        return;
    }
    job.wait_replied(Duration::from_secs(5));
    let info = if end.status == status::OK {
        OffloadInfo4::Done(WriteResponse4 {
            callback_id: None,
            count: end.count,
            committed: end.committed,
            verifier,
        })
    } else {
        OffloadInfo4::Failed(end.status, end.count)
    };
    // A client waits for CB_OFFLOAD (Linux clients before 6.14 do not
    // ask with OFFLOAD_STATUS): try again while its connection comes
    // back, for up to a lease.
    let deadline = std::time::Instant::now() + srv.state.lease();
    let mut pause = Duration::from_millis(100);
    loop {
        let sessions = srv.state.sessions_of(job.clientid);
        match callback::offload(&sessions, &job.dst_fh, job.stateid, info, &srv.metrics) {
            Ok(()) => {
                // Answered: the copy's stateid is done with (RFC 7862
                // section 4.8).
                srv.copies.remove(&job.stateid.other);
                return;
            }
            Err(e @ callback::CbError::Status(_)) => {
                tracing::info!(
                    clientid = format!("{:#x}", job.clientid),
                    error = %e,
                    "CB_OFFLOAD refused; the client can still ask with OFFLOAD_STATUS"
                );
                return;
            }
            Err(e) if std::time::Instant::now() + pause > deadline => {
                tracing::info!(
                    clientid = format!("{:#x}", job.clientid),
                    error = %e,
                    "CB_OFFLOAD not delivered within a lease; the client can still ask with OFFLOAD_STATUS"
                );
                return;
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The caller's asynchronous copy with stateid `sid` into the current
/// file: a copy is known by both (RFC 7862 sections 15.8.3 and 15.9.3).
fn job_of(cx: &Ctx<'_>, sid: Stateid) -> Result<Arc<Job>, Nfsstat4> {
    let clientid = cx.clientid()?;
    let cur = cx.cur()?;
    if sid.is_special_io() {
        return Err(status::BAD_STATEID);
    }
    cx.srv.state.check_stale(&sid)?;
    cx.srv
        .copies
        .get(clientid, &sid.other)
        .filter(|j| j.dst_fh == cur.wire)
        .ok_or(status::BAD_STATEID)
}

/// OFFLOAD_STATUS (RFC 7862 section 15.9): bytes copied so far (counted
/// a piece at a time), and how the copy ended once it has.
pub(super) fn offload_status(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let a = x(OffloadArgs::decode(d))?;
        let job = job_of(cx, a.stateid)?;
        let res = match job.end() {
            Some(end) => OffloadStatusResOk {
                count: end.count,
                complete: Some(end.status),
            },
            None => OffloadStatusResOk {
                count: job.copied(),
                complete: None,
            },
        };
        res.encode(e);
        Ok(())
    })
}

/// OFFLOAD_CANCEL (RFC 7862 section 15.8): stops the copy after the piece
/// it is at, and answers once it has stopped. What was copied stays, a
/// prefix of the range. The client gives the copy's stateid back with it
/// (RFC 7862 section 4.8): no CB_OFFLOAD follows, and OFFLOAD_STATUS no
/// longer knows it.
pub(super) fn offload_cancel(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let a = x(OffloadArgs::decode(d))?;
        let job = job_of(cx, a.stateid)?;
        if job.end().is_none() {
            let end = job.cancel();
            tracing::debug!(copied = end.count, "asynchronous copy cancelled");
        }
        cx.srv.copies.remove(&job.stateid.other);
        Ok(())
    })
}
