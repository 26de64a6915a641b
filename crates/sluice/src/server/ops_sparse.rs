//! NFSv4.2 sparse file ops (RFC 7862): READ_PLUS, SEEK, ALLOCATE and
//! DEALLOCATE.

use super::context::{must_not_wait, Ctx, OpStatus, Outcome, Stop};
use super::ops_file::{
    cur_file, file_key, io_fd, put_data, read_data, read_start, timed_read, ReadStart,
};
use super::ops_fs::{io, run, x};
use crate::engine::extents::{self, Segment};
use crate::engine::fs;
use crate::engine::read::Data;
use crate::nfs4::consts::status;
use crate::nfs4::msg::{AllocateArgs, SeekArgs, SeekResOk, Xdr};
use crate::xdr::{Decoder, Encoder};
use bytes::Bytes;
use std::io as stdio;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;

/// Holes shorter than this are sent as data by default (see
/// [`super::Config::min_hole`]): a hole segment saves wire bytes only when
/// it replaces enough zeros, and fewer segments keep the client's reply
/// budget for data. Chosen by measurement: docs/benchmarks.md.
pub(super) const MIN_HOLE: u64 = 32 * 1024;

const CONTENT_DATA: u32 = 0;
const CONTENT_HOLE: u32 = 1;
/// Encoded size of a data segment header (type, offset, length).
const DATA_HEADER: usize = 4 + 8 + 4;
/// Encoded size of a hole segment (type, offset, length).
const HOLE_SIZE: usize = 4 + 8 + 8;

/// READ_PLUS: data and hole segments in ascending, contiguous order. The
/// encoded segments never take more than `count` bytes plus one segment
/// header, which is what the Linux client budgets for.
pub(super) fn read_plus(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> Outcome {
    let cx = &*cx;
    timed_read(cx, || {
        let ReadStart {
            sid,
            offset,
            count,
            fh,
            st: _,
            fd,
            _shared,
        } = read_start(cx, d)?;
        // Size and layout are read under the lock, with the data.
        let st = io(fs::stat(fd.as_fd()))?;
        let end = offset.saturating_add(count).min(st.size);
        if offset >= end {
            e.bool(offset >= st.size);
            e.u32(0);
            return Ok(());
        }
        let min_hole = cx.srv.config.min_hole;
        let data = if must_not_wait() {
            // Extent lookups may read metadata from the disk.
            cx.srv
                .extents
                .cached_extents(&st, offset, end)
                .ok_or(Stop::WouldBlock)?
        } else {
            io(cx
                .srv
                .extents
                .data_extents(fd.as_fd(), &st, offset, end, min_hole))?
        };
        let mut segs = extents::segments(&data, offset, end, min_hole);
        // One read of the whole range keeps readahead going over holes; a
        // range that is all hole needs no read at all (reading holes costs
        // the file system an extent lookup per page: btrfs, cold).
        let buf = if segs.iter().any(|s| matches!(s, Segment::Data(..))) {
            // Cut into segments below: in one buffer.
            let buf =
                read_data(cx, &fh, &fd, &st, sid, offset, (end - offset) as usize)?.contiguous();
            let got = offset + buf.bytes.len() as u64;
            if got < end {
                segs = extents::segments(&data, offset, got, min_hole);
            }
            buf
        } else {
            Data {
                bytes: Bytes::new(),
                more: Vec::new(),
                lent: false,
            }
        };
        let mut budget = count as usize + DATA_HEADER;
        let mut body = Encoder::with_capacity(256);
        let mut nsegs = 0u32;
        let mut covered = offset;
        let mut data_bytes = 0u64;
        for s in segs {
            match s {
                Segment::Data(o, l) => {
                    if budget < DATA_HEADER + 4 {
                        break;
                    }
                    let room = ((budget - DATA_HEADER) & !3) as u64;
                    let l = l.min(room);
                    let from = (o - offset) as usize;
                    body.u32(CONTENT_DATA);
                    body.u64(o);
                    put_data(
                        &mut body,
                        Data {
                            bytes: buf.bytes.slice(from..from + l as usize),
                            more: Vec::new(),
                            lent: buf.lent,
                        },
                    );
                    budget -= DATA_HEADER + (l as usize).div_ceil(4) * 4;
                    covered = o + l;
                    nsegs += 1;
                    data_bytes += l;
                    if o + l < s.offset() + s.len() {
                        break;
                    }
                }
                Segment::Hole(o, l) => {
                    if budget < HOLE_SIZE {
                        break;
                    }
                    body.u32(CONTENT_HOLE);
                    body.u64(o);
                    body.u64(l);
                    budget -= HOLE_SIZE;
                    covered = o + l;
                    nsegs += 1;
                }
            }
        }
        cx.srv
            .metrics
            .read_bytes_sent
            .fetch_add(data_bytes, Ordering::Relaxed);
        e.bool(covered >= st.size);
        e.u32(nsegs);
        e.append(body);
        Ok(())
    })
}

/// SEEK: the next data or hole at or after an offset.
pub(super) fn seek(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let SeekArgs {
            stateid: sid,
            offset,
            what,
        } = x(SeekArgs::decode(d))?;
        if what > CONTENT_HOLE {
            return Err(status::UNION_NOTSUPP);
        }
        let (fh, st) = cur_file(cx)?;
        let fd = io_fd(cx, &fh, &st, sid, false)?;
        let _shared = cx.srv.locks.read(file_key(&st), offset, u64::MAX);
        let st = io(fs::stat(fd.as_fd()))?;
        if offset >= st.size {
            return Err(status::NXIO);
        }
        let found = io(extents::seek(fd.as_fd(), offset, what == CONTENT_DATA))?;
        let Some(pos) = found else {
            return Err(status::NXIO);
        };
        SeekResOk {
            eof: pos >= st.size,
            offset: pos,
        }
        .encode(e);
        Ok(())
    })
}

/// ALLOCATE: reserves space for a range.
pub(super) fn allocate(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    fallocate(cx, d, e, false)
}

/// DEALLOCATE: punches a hole over a range.
pub(super) fn deallocate(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    fallocate(cx, d, e, true)
}

fn fallocate(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder, punch: bool) -> OpStatus {
    run(|| {
        let AllocateArgs {
            stateid: sid,
            offset,
            length,
        } = x(AllocateArgs::decode(d))?;
        if length == 0 {
            return Err(status::INVAL);
        }
        let end = offset.checked_add(length).ok_or(status::INVAL)?;
        if end > i64::MAX as u64 {
            return Err(if punch { status::INVAL } else { status::FBIG });
        }
        let (fh, st) = cur_file(cx)?;
        let fd = io_fd(cx, &fh, &st, sid, true)?;
        let key = file_key(&st);
        let mode = if punch {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        let r = {
            let _exclusive = cx.srv.locks.write(key, offset, end);
            // SAFETY: valid descriptor; fallocate has no memory arguments.
            let r =
                unsafe { libc::fallocate64(fd.as_raw_fd(), mode, offset as i64, length as i64) };
            // errno before anything else can change it.
            let r = if r != 0 {
                Err(stdio::Error::last_os_error())
            } else {
                Ok(())
            };
            cx.srv.file_changed(key);
            r
        };
        io(r)?;
        // The blocks given or taken are the file's metadata: durable
        // before the answer on a `sync` export, as the Linux server does.
        super::ops_fs::commit_meta(cx, &fh, &st)
    })
}
