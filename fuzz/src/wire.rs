//! Encoding of RPC calls and COMPOUND arguments, and the rewriting of a
//! COMPOUND's leading SEQUENCE op, shared by the fuzz targets and the seed
//! generator.

use sluice::nfs4::consts::{op, SESSIONID_SIZE};
use sluice::nfs4::msg::{SequenceArgs, Xdr};
use sluice::nfs4::Nfsstat4;
use sluice::rpc;
use sluice::xdr::{Decoder, Encoder};

/// The NFS version served.
pub const NFS_V4: u32 = 4;
/// The COMPOUND procedure.
pub const PROC_COMPOUND: u32 = 1;
/// Longest COMPOUND tag the server accepts.
pub const MAX_TAG: usize = 1024;

/// The credential put in a call header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// AUTH_NONE: the server maps the caller to nobody.
    None,
    /// AUTH_SYS with these ids and no supplementary groups.
    Sys {
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
    },
}

impl Auth {
    /// AUTH_SYS as root.
    pub const ROOT: Auth = Auth::Sys { uid: 0, gid: 0 };
}

/// Writes an RPC call header (RFC 5531) for `prog`/`vers`/`proc_`.
pub fn call_header(e: &mut Encoder, xid: u32, prog: u32, vers: u32, proc_: u32, auth: Auth) {
    e.u32(xid);
    e.u32(rpc::MSG_CALL);
    e.u32(2);
    e.u32(prog);
    e.u32(vers);
    e.u32(proc_);
    match auth {
        Auth::None => {
            e.u32(rpc::AUTH_NONE);
            e.u32(0);
        }
        Auth::Sys { uid, gid } => {
            let mut cred = Encoder::new();
            cred.u32(0); // stamp
            cred.string("fuzz");
            cred.u32(uid);
            cred.u32(gid);
            cred.u32(0); // no supplementary groups
            e.u32(rpc::AUTH_SYS);
            e.opaque(cred.as_slice());
        }
    }
    e.u32(rpc::AUTH_NONE); // verifier
    e.u32(0);
}

/// A whole NFSv4 COMPOUND call record with `args` as its arguments.
pub fn compound_call(xid: u32, auth: Auth, args: &[u8]) -> Vec<u8> {
    let mut e = Encoder::with_capacity(args.len() + 64);
    call_header(&mut e, xid, rpc::NFS_PROGRAM, NFS_V4, PROC_COMPOUND, auth);
    e.raw(args);
    e.into_inner()
}

/// COMPOUND4args under construction.
#[derive(Debug, Clone)]
pub struct Compound {
    tag: Vec<u8>,
    minor: u32,
    count: u32,
    ops: Encoder,
}

impl Compound {
    /// An empty COMPOUND of `minor` version with `tag`.
    pub fn new(minor: u32, tag: &str) -> Self {
        Compound {
            tag: tag.as_bytes().to_vec(),
            minor,
            count: 0,
            ops: Encoder::new(),
        }
    }

    /// Appends op `opnum` whose arguments `args` writes.
    pub fn op(mut self, opnum: u32, args: impl FnOnce(&mut Encoder)) -> Self {
        self.ops.u32(opnum);
        args(&mut self.ops);
        self.count += 1;
        self
    }

    /// Appends an op without arguments.
    pub fn bare(self, opnum: u32) -> Self {
        self.op(opnum, |_| {})
    }

    /// Appends a SEQUENCE op (slot `slot`, highest slot `slot`).
    pub fn sequence(self, sid: &[u8; SESSIONID_SIZE], seqid: u32, slot: u32, cache: bool) -> Self {
        self.op(op::SEQUENCE, |e| {
            SequenceArgs {
                sessionid: *sid,
                sequenceid: seqid,
                slotid: slot,
                highest_slotid: slot,
                cachethis: cache,
            }
            .encode(e)
        })
    }

    /// The encoded COMPOUND4args.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(self.ops.len() + self.tag.len() + 16);
        e.opaque(&self.tag);
        e.u32(self.minor);
        e.u32(self.count);
        e.raw(self.ops.as_slice());
        e.into_inner()
    }
}

/// Where the fields of a leading SEQUENCE op sit in COMPOUND4args.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceAt {
    /// Byte offset of the session id.
    pub sessionid: usize,
    /// Byte offset of the sequence id (the slot id follows it).
    pub seqid: usize,
    /// The slot id the arguments carry.
    pub slot: u32,
}

/// Finds the SEQUENCE op at the start of `args`, if the arguments begin
/// with a well-formed tag, minor version, op count and a SEQUENCE whose
/// session id, sequence id and slot id are all present.
pub fn find_sequence(args: &[u8]) -> Option<SequenceAt> {
    let mut d = Decoder::new(args);
    d.opaque(MAX_TAG).ok()?;
    let _minor = d.u32().ok()?;
    let _nops = d.u32().ok()?;
    if d.u32().ok()? != op::SEQUENCE {
        return None;
    }
    let sessionid = d.position();
    d.opaque_fixed(SESSIONID_SIZE).ok()?;
    let seqid = d.position();
    let _ = d.u32().ok()?;
    let slot = d.u32().ok()?;
    Some(SequenceAt {
        sessionid,
        seqid,
        slot,
    })
}

/// Overwrites the session id, sequence id and slot id of the SEQUENCE
/// found by [`find_sequence`].
pub fn patch_sequence(
    args: &mut [u8],
    at: SequenceAt,
    sid: &[u8; SESSIONID_SIZE],
    seqid: u32,
    slot: u32,
) {
    args[at.sessionid..at.sessionid + SESSIONID_SIZE].copy_from_slice(sid);
    args[at.seqid..at.seqid + 4].copy_from_slice(&seqid.to_be_bytes());
    args[at.seqid + 4..at.seqid + 8].copy_from_slice(&slot.to_be_bytes());
}

/// The overall status and the first op's number and status of a COMPOUND
/// reply record, if the record is an accepted, successful RPC reply.
pub fn reply_first_op(reply: &[u8]) -> Option<(Nfsstat4, Option<(u32, Nfsstat4)>)> {
    let mut d = Decoder::new(reply);
    let _xid = d.u32().ok()?;
    if d.u32().ok()? != rpc::MSG_REPLY || d.u32().ok()? != 0 {
        return None;
    }
    let _verf_flavor = d.u32().ok()?;
    d.opaque(rpc::MAX_AUTH_BYTES).ok()?;
    if d.u32().ok()? != 0 {
        return None;
    }
    let status = Nfsstat4(d.u32().ok()?);
    d.opaque(MAX_TAG).ok()?;
    let n = d.u32().ok()?;
    if n == 0 {
        return Some((status, None));
    }
    let opnum = d.u32().ok()?;
    let op_status = Nfsstat4(d.u32().ok()?);
    Some((status, Some((opnum, op_status))))
}

/// The results of a COMPOUND reply record after its RPC header, status,
/// tag and result count, with the count: for pulling values (client id,
/// session id) out of the results of a known request.
pub fn reply_results(reply: &[u8]) -> Option<(u32, Decoder<'_>)> {
    let mut d = Decoder::new(reply);
    for _ in 0..3 {
        d.u32().ok()?;
    }
    d.u32().ok()?;
    d.opaque(rpc::MAX_AUTH_BYTES).ok()?;
    d.u32().ok()?;
    d.u32().ok()?; // status
    d.opaque(MAX_TAG).ok()?;
    let n = d.u32().ok()?;
    Some((n, d))
}
