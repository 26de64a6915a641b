//! The layout of `nfs3` inputs: NFSv3, MOUNT, NLM, NSM and portmapper
//! calls to the harness's server.
//!
//! The first byte picks the call: its low six bits modulo [`CALLS`] are
//! an NFSv3 procedure (0 to 21), a MOUNT v3 procedure (22 to 27 are
//! MOUNT's 0 to 5), an NLM v4 procedure (28 to 36 are NULL, TEST, LOCK,
//! CANCEL, UNLOCK, SHARE, UNSHARE, NM_LOCK and FREE_ALL; 44 to 47 the
//! asynchronous TEST_MSG, LOCK_MSG, CANCEL_MSG and UNLOCK_MSG) or an NSM
//! procedure (37 to 43 are its 0 to 6), or a portmapper procedure that
//! sluice answers on the NFS port (48 to 57, see [`PMAP_CALLS`]); bit
//! 0x80 calls as uid and gid 1000 (else root). For an NFSv3 procedure
//! other than NULL a handle is put first: the export root's, or with bit
//! 0x40 the fixture file's. The rest of the input is what follows the
//! first handle in the procedure's arguments (a name, offsets,
//! attributes, data, a second handle), or the whole arguments of the
//! other programs.
//! Every call must get a reply, and the server must go on serving.

use crate::harness::Harness;
use crate::wire::{self, Auth};
use sluice::mount::{Mapping, Rpcb, MOUNT_PROGRAM, NLM_PROGRAM, NSM_PROGRAM, PMAP_PROGRAM};
use sluice::nfs3::{Args3, VERSION};
use sluice::nlm::{NlmArgs, NsmArgs};
use sluice::rpc;
use sluice::xdr::{Decoder, Encoder};

/// Values of the first byte's low 6 bits (modulo this) that pick a call.
pub const CALLS: u8 = 58;
/// The portmapper calls of selectors 48 to 57: (version, procedure).
/// PMAP version 2's NULL, SET, UNSET, GETPORT and DUMP; rpcbind version
/// 3's UNSET and GETADDR; version 4's SET, GETADDR and DUMP.
pub const PMAP_CALLS: [(u32, u32); 10] = [
    (2, 0),
    (2, 1),
    (2, 2),
    (2, 3),
    (2, 4),
    (3, 2),
    (3, 3),
    (4, 1),
    (4, 3),
    (4, 4),
];
/// The NLM procedures of selectors 28 to 36, then of 44 to 47.
const NLM_PROCS: [u32; 9] = [0, 1, 2, 3, 4, 20, 21, 22, 23];
const NLM_MSG_PROCS: [u32; 4] = [6, 7, 8, 9];
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
    } else if sel < 28 {
        wire::call_header(&mut e, xid, MOUNT_PROGRAM, 3, (sel - 22) as u32, auth);
        e.raw(rest);
    } else if sel < 37 || (44..48).contains(&sel) {
        let proc_ = if sel < 37 {
            NLM_PROCS[(sel - 28) as usize]
        } else {
            NLM_MSG_PROCS[(sel - 44) as usize]
        };
        let _ = NlmArgs::decode(proc_, &mut Decoder::new(rest));
        wire::call_header(&mut e, xid, NLM_PROGRAM, 4, proc_, auth);
        e.raw(rest);
    } else if sel >= 48 {
        let (vers, proc_) = PMAP_CALLS[(sel - 48) as usize];
        // The decoders alone must not panic either.
        let _ = Mapping::decode(&mut Decoder::new(rest));
        let _ = Rpcb::decode(&mut Decoder::new(rest));
        wire::call_header(&mut e, xid, PMAP_PROGRAM, vers, proc_, auth);
        e.raw(rest);
    } else {
        let proc_ = (sel - 37) as u32;
        let _ = NsmArgs::decode(proc_, &mut Decoder::new(rest));
        wire::call_header(&mut e, xid, NSM_PROGRAM, 1, proc_, auth);
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
    assert!(
        reply.is_some(),
        "no reply to an NFSv3, MOUNT, NLM, NSM or portmapper call"
    );
}
