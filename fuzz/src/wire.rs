//! Encoding of RPC calls and COMPOUND arguments, and the rewriting of a
//! COMPOUND's leading SEQUENCE op, shared by the fuzz targets and the seed
//! generator.

use sluice::nfs4::consts::{op, SESSIONID_SIZE};
use sluice::nfs4::msg::{CompoundHeader, CompoundResHeader, SequenceArgs, Xdr};
use sluice::nfs4::Nfsstat4;
use sluice::rpc;
use sluice::xdr::{Decoder, Encoder};

/// The NFS version served.
pub const NFS_V4: u32 = 4;
/// The COMPOUND procedure.
pub const PROC_COMPOUND: u32 = 1;

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

    /// The credential as written in a call: AUTH_SYS from machine `fuzz`
    /// with stamp 0.
    pub fn cred(self) -> rpc::CallCred {
        match self {
            Auth::None => rpc::CallCred::None,
            Auth::Sys { uid, gid } => rpc::CallCred::Sys {
                stamp: 0,
                machine: b"fuzz".to_vec(),
                uid,
                gid,
                gids: Vec::new(),
            },
        }
    }
}

/// Writes an RPC call header (RFC 5531) for `prog`/`vers`/`proc_`, with
/// an AUTH_NONE verifier.
pub fn call_header(e: &mut Encoder, xid: u32, prog: u32, vers: u32, proc_: u32, auth: Auth) {
    rpc::call_header(e, xid, prog, vers, proc_, &auth.cred());
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
    header: CompoundHeader,
    ops: Encoder,
}

impl Compound {
    /// An empty COMPOUND of `minor` version with `tag`.
    pub fn new(minor: u32, tag: &str) -> Self {
        Compound {
            header: CompoundHeader {
                tag: tag.as_bytes().to_vec(),
                minorversion: minor,
                numops: 0,
            },
            ops: Encoder::new(),
        }
    }

    /// Appends op `opnum` whose arguments `args` writes.
    pub fn op(mut self, opnum: u32, args: impl FnOnce(&mut Encoder)) -> Self {
        self.ops.u32(opnum);
        args(&mut self.ops);
        self.header.numops += 1;
        self
    }

    /// Appends op `opnum` with the typed arguments `args`.
    pub fn op_args(self, opnum: u32, args: &impl Xdr) -> Self {
        self.op(opnum, |e| args.encode(e))
    }

    /// Appends an op without arguments.
    pub fn bare(self, opnum: u32) -> Self {
        self.op(opnum, |_| {})
    }

    /// Appends a SEQUENCE op (slot `slot`, highest slot `slot`).
    pub fn sequence(self, sid: &[u8; SESSIONID_SIZE], seqid: u32, slot: u32, cache: bool) -> Self {
        self.op_args(
            op::SEQUENCE,
            &SequenceArgs {
                sessionid: *sid,
                sequenceid: seqid,
                slotid: slot,
                highest_slotid: slot,
                cachethis: cache,
            },
        )
    }

    /// The encoded COMPOUND4args.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(self.ops.len() + self.header.tag.len() + 16);
        self.header.encode(&mut e);
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
/// with a well-formed COMPOUND header and a SEQUENCE whose arguments
/// decode. (A SEQUENCE whose arguments do not decode is left alone: the
/// server answers BADXDR before it looks at the session.)
pub fn find_sequence(args: &[u8]) -> Option<SequenceAt> {
    let mut d = Decoder::new(args);
    CompoundHeader::decode(&mut d).ok()?;
    if d.u32().ok()? != op::SEQUENCE {
        return None;
    }
    let sessionid = d.position();
    let seq = SequenceArgs::decode(&mut d).ok()?;
    Some(SequenceAt {
        sessionid,
        // SEQUENCE4args: the session id, then the sequence id.
        seqid: sessionid + SESSIONID_SIZE,
        slot: seq.slotid,
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

/// The COMPOUND4res header of a reply record and a decoder at its first
/// result, if the record is an accepted, successful RPC reply.
pub fn reply_header(reply: &[u8]) -> Option<(CompoundResHeader, Decoder<'_>)> {
    let (_xid, results) = rpc::parse_reply(reply).ok()?;
    let mut d = Decoder::new(reply);
    d.skip(results.ok()?).ok()?;
    let header = CompoundResHeader::decode(&mut d).ok()?;
    Some((header, d))
}

/// The overall status and the first op's number and status of a COMPOUND
/// reply record, if the record is an accepted, successful RPC reply.
pub fn reply_first_op(reply: &[u8]) -> Option<(Nfsstat4, Option<(u32, Nfsstat4)>)> {
    let (header, mut d) = reply_header(reply)?;
    if header.numres == 0 {
        return Some((header.status, None));
    }
    // Each result: the op number and its status, then the result.
    let opnum = d.u32().ok()?;
    let op_status = Nfsstat4::decode(&mut d).ok()?;
    Some((header.status, Some((opnum, op_status))))
}

/// The results of a COMPOUND reply record after its RPC header, status,
/// tag and result count, with the count, if the record is an accepted,
/// successful RPC reply: for pulling values (client id, session id) out of
/// the results of a known request.
pub fn reply_results(reply: &[u8]) -> Option<(u32, Decoder<'_>)> {
    reply_header(reply).map(|(header, d)| (header.numres, d))
}
