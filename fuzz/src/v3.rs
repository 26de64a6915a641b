//! The layout of `nfs3` inputs: NFSv3 and MOUNT calls to the harness's
//! server.
//!
//! The first byte picks the call: its low six bits modulo 28 are an
//! NFSv3 procedure (0 to 21) or a MOUNT v3 procedure (22 to 27 are
//! MOUNT's 0 to 5); bit 0x80 calls as uid and gid 1000 (else root). For
//! an NFSv3 procedure other than NULL a handle is put first: the export
//! root's, or with bit 0x40 the fixture file's. The rest of the input is
//! what follows the first handle in the procedure's arguments (a name,
//! offsets, attributes, data, a second handle).
//! Every call must get a reply, and the server must go on serving.

use crate::harness::Harness;
use crate::wire::{self, Auth};
use sluice::mount::MOUNT_PROGRAM;
use sluice::nfs3::{Args3, VERSION};
use sluice::rpc;
use sluice::xdr::{Decoder, Encoder};

/// Values of the first byte's low 7 bits (modulo this) that pick a call.
pub const CALLS: u8 = 28;
/// First byte bit: call as uid and gid 1000.
pub const FLAG_USER: u8 = 0x80;
/// First byte bit: the first handle is the fixture file's.
pub const FLAG_FILE: u8 = 0x40;

/// The input for call `sel` (an NFSv3 procedure, or 22 plus a MOUNT
/// procedure) with `rest` after the first handle (the fixture file's
/// with `file`), as root.
pub fn input(sel: u8, file: bool, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![sel | if file { FLAG_FILE } else { 0 }];
    v.extend_from_slice(rest);
    v
}

/// The call record an input makes, given the handles of the export root
/// and of the fixture file.
pub fn record(data: &[u8], root: &[u8], file: &[u8], xid: u32) -> Option<Vec<u8>> {
    let (&ctl, rest) = data.split_first()?;
    let sel = (ctl & 0x3f) % CALLS;
    let first = if ctl & FLAG_FILE != 0 { file } else { root };
    let auth = if ctl & FLAG_USER != 0 {
        Auth::Sys {
            uid: 1000,
            gid: 1000,
        }
    } else {
        Auth::ROOT
    };
    let mut e = Encoder::with_capacity(rest.len() + 128);
    if sel < 22 {
        let proc_ = sel as u32;
        wire::call_header(&mut e, xid, rpc::NFS_PROGRAM, VERSION, proc_, auth);
        let mut args = Encoder::with_capacity(rest.len() + 72);
        if proc_ != 0 {
            args.opaque(first);
        }
        args.raw(rest);
        // The decoder alone must not panic either.
        let _ = Args3::decode(proc_, &mut Decoder::new(args.as_slice()));
        e.raw(args.as_slice());
    } else {
        wire::call_header(&mut e, xid, MOUNT_PROGRAM, 3, (sel - 22) as u32, auth);
        e.raw(rest);
    }
    Some(e.into_inner())
}

/// Runs one `nfs3` input; panics when the server gives no reply to a
/// well-formed call.
pub fn run(h: &mut Harness, data: &[u8]) {
    let (root, fd, _) = h.server().exports.root();
    let file = h.server().exports.list()[0]
        .fs
        .handle_in(std::os::fd::AsFd::as_fd(&*fd), c"file")
        .unwrap_or_default();
    let Some(rec) = record(data, &root, &file, 0x3300_0000) else {
        return;
    };
    let reply = h.run_record(&rec);
    assert!(reply.is_some(), "no reply to an NFSv3 or MOUNT call");
}
