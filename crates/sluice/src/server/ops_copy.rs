//! Server-side copies (RFC 7862): CLONE, which makes a range of the
//! destination share the source's extents (FICLONERANGE), on file
//! systems that have shared extents (xfs with reflink, btrfs).

use super::context::{Ctx, OpStatus};
use super::ops_file::{file_key, io_fd};
use super::ops_fs::{run, stat_of, x};
use crate::engine::fs;
use crate::nfs4::consts::status;
use crate::nfs4::msg::{CloneArgs, Xdr};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};
use std::os::fd::AsFd;

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

/// CLONE (RFC 7862 section 15.13): from the saved filehandle's file to the
/// current one's. The source range is read-locked and the destination
/// range write-locked (in file order), as READ and WRITE lock theirs.
pub(super) fn clone(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    run(|| {
        let a = x(CloneArgs::decode(d))?;
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
        let sfd = io_fd(cx, &src, &sst, a.src_stateid, false)?;
        let dfd = io_fd(cx, &dst, &dst_st, a.dst_stateid, true)?;
        let count = if a.count == 0 {
            sst.size.checked_sub(a.src_offset).ok_or(status::INVAL)?
        } else {
            a.count
        };
        let (Some(send), Some(dend)) = (
            a.src_offset.checked_add(count),
            a.dst_offset.checked_add(count),
        ) else {
            return Err(status::INVAL);
        };
        if send > sst.size {
            return Err(status::INVAL);
        }
        if count == 0 {
            // Nothing to clone (FICLONERANGE would take 0 as "to the end").
            return Ok(());
        }
        let (skey, dkey) = (file_key(&sst), file_key(&dst_st));
        if skey == dkey && a.src_offset < dend && a.dst_offset < send {
            // Overlapping ranges of one file.
            return Err(status::INVAL);
        }
        // Both ranges locked in one order (file, then offset), so two
        // clones the other way round cannot wait for each other.
        let locks = &cx.srv.locks;
        let (_read, _write);
        if (skey, a.src_offset) <= (dkey, a.dst_offset) {
            _read = locks.read(skey, a.src_offset, send);
            _write = locks.write(dkey, a.dst_offset, dend);
        } else {
            _write = locks.write(dkey, a.dst_offset, dend);
            _read = locks.read(skey, a.src_offset, send);
        }
        fs::clone_range(sfd.as_fd(), a.src_offset, count, dfd.as_fd(), a.dst_offset)
            .map_err(clone_err)?;
        cx.srv.file_changed(dkey);
        Ok(())
    })
}
