//! ONC RPC v2 (RFC 5531): record marking, call headers, authentication
//! flavors and reply headers.

use crate::xdr::{Decoder, Encoder, XdrError};

/// The NFS program number.
pub const NFS_PROGRAM: u32 = 100003;
/// Message type of a call.
pub const MSG_CALL: u32 = 0;
/// Message type of a reply.
pub const MSG_REPLY: u32 = 1;
/// AUTH_NONE flavor.
pub const AUTH_NONE: u32 = 0;
/// AUTH_SYS flavor.
pub const AUTH_SYS: u32 = 1;
/// Largest credential or verifier body (RFC 5531).
pub const MAX_AUTH_BYTES: usize = 400;
/// Last-fragment bit of a record mark.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;

/// How an accepted call fared (accept_stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptStat {
    /// The procedure ran.
    Success = 0,
    /// The program is not served here.
    ProgUnavail = 1,
    /// The program version is not served here.
    ProgMismatch = 2,
    /// The procedure does not exist.
    ProcUnavail = 3,
    /// The arguments could not be decoded.
    GarbageArgs = 4,
    /// The server failed internally.
    SystemErr = 5,
}

/// Why a call was denied (auth_stat values used here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStat {
    /// The credential is malformed.
    BadCred = 1,
    /// The flavor is not accepted.
    TooWeak = 5,
}

/// The caller's identity taken from its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// Effective user id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub gids: Vec<u32>,
    /// Flavor the identity came from.
    pub flavor: u32,
}

impl Cred {
    /// The identity given to AUTH_NONE callers.
    pub fn nobody() -> Self {
        Cred {
            uid: 65534,
            gid: 65534,
            gids: Vec::new(),
            flavor: AUTH_NONE,
        }
    }
}

/// A decoded call header; the procedure's arguments follow at `args_at`.
#[derive(Debug, Clone)]
pub struct CallHeader {
    /// Transaction id, echoed in the reply.
    pub xid: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// Caller identity.
    pub cred: Cred,
    /// Byte offset of the procedure arguments in the record.
    pub args_at: usize,
}

/// A call that cannot be processed, with what to answer (if anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Not even an xid could be read, or the message is a reply: drop it.
    Drop,
    /// RPC version other than 2: answer RPC_MISMATCH.
    RpcMismatch(u32),
    /// Credential unacceptable: answer AUTH_ERROR.
    Auth(u32, AuthStat),
    /// The header is malformed after the xid: answer GARBAGE_ARGS.
    Garbage(u32),
}

fn parse_auth_sys(body: &[u8]) -> Result<Cred, XdrError> {
    let mut d = Decoder::new(body);
    let _stamp = d.u32()?;
    let _machine = d.opaque(255)?;
    let uid = d.u32()?;
    let gid = d.u32()?;
    let n = d.count(16, 4)?;
    let mut gids = Vec::with_capacity(n);
    for _ in 0..n {
        gids.push(d.u32()?);
    }
    Ok(Cred {
        uid,
        gid,
        gids,
        flavor: AUTH_SYS,
    })
}

/// Decodes the call header at the start of a record.
pub fn parse_call(record: &[u8]) -> Result<CallHeader, CallError> {
    let mut d = Decoder::new(record);
    let xid = d.u32().map_err(|_| CallError::Drop)?;
    let mtype = d.u32().map_err(|_| CallError::Drop)?;
    if mtype != MSG_CALL {
        return Err(CallError::Drop);
    }
    let g = |_| CallError::Garbage(xid);
    let rpcvers = d.u32().map_err(g)?;
    if rpcvers != 2 {
        return Err(CallError::RpcMismatch(xid));
    }
    let prog = d.u32().map_err(g)?;
    let vers = d.u32().map_err(g)?;
    let proc_ = d.u32().map_err(g)?;
    let flavor = d.u32().map_err(g)?;
    let body = d
        .opaque(MAX_AUTH_BYTES)
        .map_err(|_| CallError::Auth(xid, AuthStat::BadCred))?;
    let _vflavor = d.u32().map_err(g)?;
    let _vbody = d.opaque(MAX_AUTH_BYTES).map_err(g)?;
    let cred = match flavor {
        AUTH_NONE => Cred::nobody(),
        AUTH_SYS => parse_auth_sys(body).map_err(|_| CallError::Auth(xid, AuthStat::BadCred))?,
        _ => return Err(CallError::Auth(xid, AuthStat::TooWeak)),
    };
    Ok(CallHeader {
        xid,
        prog,
        vers,
        proc_,
        cred,
        args_at: d.position(),
    })
}

/// Starts an accepted reply; the caller appends the results on success.
pub fn accepted_reply(xid: u32, stat: AcceptStat) -> Encoder {
    let mut e = Encoder::with_capacity(256);
    e.u32(xid);
    e.u32(MSG_REPLY);
    e.u32(0); // MSG_ACCEPTED
    e.u32(AUTH_NONE);
    e.u32(0); // empty verifier body
    e.u32(stat as u32);
    e
}

/// An accepted reply for PROG_MISMATCH with the supported version range.
pub fn prog_mismatch(xid: u32, low: u32, high: u32) -> Vec<u8> {
    let mut e = accepted_reply(xid, AcceptStat::ProgMismatch);
    e.u32(low);
    e.u32(high);
    e.into_inner()
}

/// The reply for a call that cannot be processed.
pub fn error_reply(err: &CallError) -> Option<Vec<u8>> {
    let mut e = Encoder::with_capacity(32);
    match *err {
        CallError::Drop => return None,
        CallError::Garbage(xid) => {
            return Some(accepted_reply(xid, AcceptStat::GarbageArgs).into_inner())
        }
        CallError::RpcMismatch(xid) => {
            e.u32(xid);
            e.u32(MSG_REPLY);
            e.u32(1); // MSG_DENIED
            e.u32(0); // RPC_MISMATCH
            e.u32(2);
            e.u32(2);
        }
        CallError::Auth(xid, stat) => {
            e.u32(xid);
            e.u32(MSG_REPLY);
            e.u32(1); // MSG_DENIED
            e.u32(1); // AUTH_ERROR
            e.u32(stat as u32);
        }
    }
    Some(e.into_inner())
}

/// The credential of a call this side makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallCred {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS: stamp, machine name, uid, gid, supplementary groups.
    Sys {
        /// Arbitrary id of the credential.
        stamp: u32,
        /// The caller's machine name.
        machine: Vec<u8>,
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
        /// Supplementary groups (at most 16).
        gids: Vec<u32>,
    },
}

/// Writes the header of a call (RFC 5531 section 9) with `cred` and an
/// empty verifier; the arguments follow.
pub fn call_header(e: &mut Encoder, xid: u32, prog: u32, vers: u32, proc_: u32, cred: &CallCred) {
    e.u32(xid);
    e.u32(MSG_CALL);
    e.u32(2);
    e.u32(prog);
    e.u32(vers);
    e.u32(proc_);
    match cred {
        CallCred::None => {
            e.u32(AUTH_NONE);
            e.u32(0);
        }
        CallCred::Sys {
            stamp,
            machine,
            uid,
            gid,
            gids,
        } => {
            let mut body = Encoder::new();
            body.u32(*stamp);
            body.opaque(machine);
            body.u32(*uid);
            body.u32(*gid);
            body.u32(gids.len().min(16) as u32);
            for g in gids.iter().take(16) {
                body.u32(*g);
            }
            e.u32(AUTH_SYS);
            e.opaque(body.as_slice());
        }
    }
    e.u32(AUTH_NONE);
    e.u32(0);
}

/// Why a reply to one of this side's calls carries no results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The record is not a well-formed reply.
    #[error("malformed RPC reply")]
    Malformed,
    /// MSG_DENIED: RPC version mismatch (0) or an authentication error
    /// (1) with its auth_stat.
    #[error("call denied (reject_stat {0}, auth_stat {1})")]
    Denied(u32, u32),
    /// MSG_ACCEPTED with a status other than SUCCESS.
    #[error("call not accepted: accept_stat {0}")]
    NotAccepted(u32),
}

/// Whether a record is a reply (rather than a call): a connection that
/// carries calls both ways gets both.
pub fn is_reply(record: &[u8]) -> bool {
    record.get(4..8) == Some(&MSG_REPLY.to_be_bytes()[..])
}

/// The xid of a reply and where its results start in `record`.
pub fn parse_reply(record: &[u8]) -> Result<(u32, Result<usize, ReplyError>), ReplyError> {
    let mut d = Decoder::new(record);
    let m = |_| ReplyError::Malformed;
    let xid = d.u32().map_err(m)?;
    if d.u32().map_err(m)? != MSG_REPLY {
        return Err(ReplyError::Malformed);
    }
    let r = match d.u32().map_err(m)? {
        0 => {
            let _flavor = d.u32().map_err(m)?;
            let _verf = d.opaque(MAX_AUTH_BYTES).map_err(m)?;
            match d.u32().map_err(m)? {
                0 => Ok(d.position()),
                stat => Err(ReplyError::NotAccepted(stat)),
            }
        }
        1 => {
            let why = d.u32().map_err(m)?;
            let detail = d.u32().map_err(m)?;
            Err(ReplyError::Denied(why, detail))
        }
        _ => return Err(ReplyError::Malformed),
    };
    Ok((xid, r))
}

/// Reassembles records from record-marked fragments (RFC 5531 section 11).
///
/// Feed it the fragment headers and bodies as they arrive; it enforces a
/// bound on the whole record's size.
#[derive(Debug)]
pub struct RecordAssembler {
    max_record: usize,
    record: Vec<u8>,
}

/// What to do after a fragment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentHeader {
    /// Bytes in this fragment.
    pub len: usize,
    /// True for the final fragment of the record.
    pub last: bool,
}

impl FragmentHeader {
    /// Parses a 4-byte record mark.
    pub fn parse(b: [u8; 4]) -> Self {
        let v = u32::from_be_bytes(b);
        FragmentHeader {
            len: (v & !LAST_FRAGMENT) as usize,
            last: v & LAST_FRAGMENT != 0,
        }
    }
}

/// The record grew past the configured bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTooLarge;

impl RecordAssembler {
    /// An assembler that refuses records above `max_record` bytes.
    pub fn new(max_record: usize) -> Self {
        RecordAssembler {
            max_record,
            record: Vec::new(),
        }
    }

    /// Checks a fragment header before its body is read, so oversized
    /// records are refused before memory is spent on them.
    pub fn admit(&self, h: FragmentHeader) -> Result<(), RecordTooLarge> {
        if self.record.len().saturating_add(h.len) > self.max_record {
            Err(RecordTooLarge)
        } else {
            Ok(())
        }
    }

    /// Adds a fragment body; returns the record when `last` is set.
    pub fn push(&mut self, body: &[u8], last: bool) -> Result<Option<Vec<u8>>, RecordTooLarge> {
        if self.record.len() + body.len() > self.max_record {
            return Err(RecordTooLarge);
        }
        self.record.extend_from_slice(body);
        if last {
            Ok(Some(std::mem::take(&mut self.record)))
        } else {
            Ok(None)
        }
    }
}

/// Frames a reply as a single last fragment.
pub fn record_mark(len: usize) -> [u8; 4] {
    (len as u32 | LAST_FRAGMENT).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn calls_made_here_parse_as_calls_and_replies_as_replies() {
        let cred = CallCred::Sys {
            stamp: 7,
            machine: b"server".to_vec(),
            uid: 0,
            gid: 0,
            gids: vec![1, 2],
        };
        let mut e = Encoder::new();
        call_header(&mut e, 42, 0x4000_0000, 1, 1, &cred);
        e.u32(99);
        let call = e.into_inner();
        assert!(!is_reply(&call));
        let h = parse_call(&call).expect("a call");
        assert_eq!((h.xid, h.prog, h.vers, h.proc_), (42, 0x4000_0000, 1, 1));
        assert_eq!((h.cred.uid, h.cred.gids.clone()), (0, vec![1, 2]));
        assert_eq!(&call[h.args_at..], &99u32.to_be_bytes());

        let mut ok = accepted_reply(42, AcceptStat::Success);
        ok.u32(5);
        let ok = ok.into_inner();
        assert!(is_reply(&ok));
        let (xid, at) = parse_reply(&ok).unwrap();
        assert_eq!((xid, &ok[at.unwrap()..]), (42, &5u32.to_be_bytes()[..]));
        let unavail = accepted_reply(43, AcceptStat::ProgUnavail).into_inner();
        assert_eq!(
            parse_reply(&unavail),
            Ok((43, Err(ReplyError::NotAccepted(1))))
        );
        let denied = error_reply(&CallError::Auth(44, AuthStat::TooWeak)).unwrap();
        assert_eq!(
            parse_reply(&denied),
            Ok((44, Err(ReplyError::Denied(1, 5))))
        );
        // Cut anywhere in its header, a reply is malformed.
        for cut in 0..24 {
            assert_eq!(parse_reply(&ok[..cut]), Err(ReplyError::Malformed));
        }
        assert_eq!(parse_reply(&call), Err(ReplyError::Malformed));
    }

    fn call(flavor: u32, cred: &[u8], rpcvers: u32) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(7);
        e.u32(MSG_CALL);
        e.u32(rpcvers);
        e.u32(NFS_PROGRAM);
        e.u32(4);
        e.u32(1);
        e.u32(flavor);
        e.opaque(cred);
        e.u32(0);
        e.u32(0);
        e.u32(0xdead);
        e.into_inner()
    }

    fn sys_cred(uid: u32, gid: u32, gids: &[u32]) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(1);
        e.string("host");
        e.u32(uid);
        e.u32(gid);
        e.u32(gids.len() as u32);
        for g in gids {
            e.u32(*g);
        }
        e.into_inner()
    }

    #[test]
    fn parses_auth_sys_call() {
        let rec = call(AUTH_SYS, &sys_cred(1000, 100, &[4, 5]), 2);
        let h = parse_call(&rec).unwrap();
        assert_eq!((h.xid, h.prog, h.vers, h.proc_), (7, NFS_PROGRAM, 4, 1));
        assert_eq!(h.cred.uid, 1000);
        assert_eq!(h.cred.gids, vec![4, 5]);
        assert_eq!(&rec[h.args_at..], &0xdeadu32.to_be_bytes());
    }

    #[test]
    fn auth_none_is_nobody() {
        let h = parse_call(&call(AUTH_NONE, &[], 2)).unwrap();
        assert_eq!(h.cred, Cred::nobody());
    }

    #[test]
    fn rejects_bad_headers() {
        assert_eq!(
            parse_call(&call(AUTH_NONE, &[], 3)).unwrap_err(),
            CallError::RpcMismatch(7)
        );
        assert_eq!(
            parse_call(&call(6, &[], 2)).unwrap_err(),
            CallError::Auth(7, AuthStat::TooWeak)
        );
        assert_eq!(
            parse_call(&call(AUTH_SYS, &[0, 0], 2)).unwrap_err(),
            CallError::Auth(7, AuthStat::BadCred)
        );
        // 17 supplementary groups is over the AUTH_SYS limit.
        let many: Vec<u32> = (0..17).collect();
        assert!(parse_call(&call(AUTH_SYS, &sys_cred(1, 1, &many), 2)).is_err());
        assert_eq!(parse_call(&[0, 0]).unwrap_err(), CallError::Drop);
        let full = call(AUTH_NONE, &[], 2);
        assert_eq!(parse_call(&full[..10]).unwrap_err(), CallError::Garbage(7));
    }

    #[test]
    fn error_replies_encode() {
        let r = error_reply(&CallError::RpcMismatch(9)).unwrap();
        assert_eq!(r.len(), 24);
        assert_eq!(&r[..4], &9u32.to_be_bytes());
        assert!(error_reply(&CallError::Drop).is_none());
    }

    #[test]
    fn assembles_multi_fragment_records_with_bound() {
        let mut a = RecordAssembler::new(10);
        assert_eq!(a.push(b"abcd", false).unwrap(), None);
        assert_eq!(a.push(b"ef", true).unwrap(), Some(b"abcdef".to_vec()));
        assert!(a
            .admit(FragmentHeader {
                len: 11,
                last: true
            })
            .is_err());
        a.push(b"123456", false).unwrap();
        assert!(a.push(b"12345", true).is_err());
        let h = FragmentHeader::parse(record_mark(5));
        assert_eq!(h, FragmentHeader { len: 5, last: true });
    }

    proptest! {
        #[test]
        fn parse_call_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = parse_call(&buf);
        }

        #[test]
        fn truncated_calls_never_succeed(cut in 0usize..44) {
            let rec = call(AUTH_SYS, &sys_cred(1, 2, &[3]), 2);
            // Everything before the verifier is needed.
            let cut = cut.min(rec.len() - 5);
            prop_assert!(parse_call(&rec[..cut]).is_err());
        }
    }
}
