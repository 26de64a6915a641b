//! COMPOUND processing (RFC 8881 sections 2.10.6 and 16.2): the op loop,
//! SEQUENCE and the reply cache, and the per-request context.

use super::exports::{Exported, Loc};
use super::state::{request_fingerprint, SlotDecision, Stateid};
use super::{ops_file, ops_fs, ops_pseudo, ops_session, ops_sparse, Server};
use crate::engine::cred::{self, Identity};
use crate::engine::handle::HandleError;
use crate::nfs4::consts::{op, status, SESSIONID_SIZE};
use crate::rpc::Cred;
use crate::xdr::{Decoder, Encoder};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// Longest COMPOUND tag accepted.
const MAX_TAG: usize = 1024;

/// A current or saved filehandle: its wire form and an open descriptor.
#[derive(Debug, Clone)]
pub struct Fh {
    /// The handle as the client sees it.
    pub wire: Vec<u8>,
    /// O_PATH descriptor of the object (a placeholder for pseudo
    /// directories).
    pub fd: Arc<OwnedFd>,
    /// The export it belongs to, or the pseudo directory it is.
    pub loc: Loc,
}

/// State of one COMPOUND while its ops run.
pub struct Ctx<'a> {
    /// The server.
    pub srv: &'a Server,
    /// The caller's credentials as sent.
    pub cred: &'a Cred,
    /// The caller's address (None for in-process callers).
    pub peer: Option<IpAddr>,
    /// Caller identity on the file system, after the squashing of the
    /// current filehandle's export.
    pub id: Identity,
    /// Current filehandle.
    pub cur: Option<Fh>,
    /// Saved filehandle.
    pub saved: Option<Fh>,
    /// Client id of the session, when the COMPOUND runs in one.
    pub clientid: Option<u64>,
    /// Stateid produced by the last op that made one.
    pub cur_sid: Option<Stateid>,
}

impl<'a> Ctx<'a> {
    /// The current filehandle or NFS4ERR_NOFILEHANDLE.
    pub fn cur(&self) -> Result<&Fh, u32> {
        self.cur.as_ref().ok_or(status::NOFILEHANDLE)
    }

    /// The saved filehandle or NFS4ERR_NOFILEHANDLE.
    pub fn saved(&self) -> Result<&Fh, u32> {
        self.saved.as_ref().ok_or(status::NOFILEHANDLE)
    }

    /// Resolves a wire handle; handles of exports that do not admit the
    /// caller's address get NFS4ERR_ACCESS.
    pub fn resolve(&self, wire: &[u8]) -> Result<Fh, u32> {
        let (fd, loc) = cred::as_root(|| self.srv.exports.resolve(wire)).map_err(|e| match e {
            HandleError::Bad => status::BADHANDLE,
            HandleError::Stale => status::STALE,
        })?;
        if let Loc::Export(i) = loc {
            if !self.srv.exports.list()[i].rules.admits(self.peer) {
                return Err(status::ACCESS);
            }
        }
        Ok(Fh {
            wire: wire.to_vec(),
            fd,
            loc,
        })
    }

    /// The export `fh` belongs to.
    pub fn ex(&self, fh: &Fh) -> &'a Exported {
        self.srv.exports.get(fh.loc)
    }

    /// The export of the current filehandle (the first export when there
    /// is none).
    pub fn cur_ex(&self) -> &'a Exported {
        self.srv
            .exports
            .get(self.cur.as_ref().map_or(Loc::Export(0), |f| f.loc))
    }

    /// Substitutes the current stateid for the special "current" value.
    pub fn stateid(&self, sid: Stateid) -> Result<Stateid, u32> {
        if sid == Stateid::CURRENT {
            self.cur_sid.ok_or(status::BAD_STATEID)
        } else {
            Ok(sid)
        }
    }

    /// The client id of the session or NFS4ERR_OP_NOT_IN_SESSION.
    pub fn clientid(&self) -> Result<u64, u32> {
        self.clientid.ok_or(status::OP_NOT_IN_SESSION)
    }
}

/// An op's outcome: NFS4_OK or an error status. The handler has written
/// the result body (if any) after the status.
pub type OpStatus = u32;

/// Ops that change the file system, refused on a read-only export (OPEN
/// checks its own arguments).
pub fn changes_fs(opnum: u32) -> bool {
    matches!(
        opnum,
        op::CREATE
            | op::LINK
            | op::REMOVE
            | op::RENAME
            | op::SETATTR
            | op::WRITE
            | op::ALLOCATE
            | op::DEALLOCATE
    )
}

/// Ops that act on the object behind the current filehandle.
fn uses_cur_object(opnum: u32) -> bool {
    !matches!(
        opnum,
        op::PUTFH
            | op::PUTROOTFH
            | op::PUTPUBFH
            | op::GETFH
            | op::SAVEFH
            | op::RESTOREFH
            | op::SEQUENCE
            | op::EXCHANGE_ID
            | op::CREATE_SESSION
            | op::DESTROY_SESSION
            | op::DESTROY_CLIENTID
            | op::BIND_CONN_TO_SESSION
            | op::RECLAIM_COMPLETE
            | op::FREE_STATEID
            | op::TEST_STATEID
    )
}

fn run_op(cx: &mut Ctx<'_>, opnum: u32, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    if uses_cur_object(opnum) {
        if let Some(Loc::Pseudo(n)) = cx.cur.as_ref().map(|f| f.loc) {
            // Pseudo directories never reach the file system ops.
            return ops_pseudo::run_op(cx, n, opnum, d, e);
        }
        if matches!(opnum, op::RENAME | op::LINK) {
            if let (Some(s), Some(c)) = (&cx.saved, &cx.cur) {
                if s.loc != c.loc {
                    return status::XDEV;
                }
            }
        }
        if changes_fs(opnum) && cx.cur_ex().rules.read_only {
            return status::ROFS;
        }
    }
    match opnum {
        op::ACCESS => ops_fs::access(cx, d, e),
        op::CLOSE => ops_file::close(cx, d, e),
        op::COMMIT => ops_file::commit(cx, d, e),
        op::CREATE => ops_fs::create(cx, d, e),
        op::DELEGRETURN => ops_file::delegreturn(cx, d, e),
        op::GETATTR => ops_fs::getattr(cx, d, e),
        op::GETFH => ops_fs::getfh(cx, d, e),
        op::LINK => ops_fs::link(cx, d, e),
        op::LOCK => ops_file::lock(cx, d, e),
        op::LOCKT => ops_file::lockt(cx, d, e),
        op::LOCKU => ops_file::locku(cx, d, e),
        op::LOOKUP => ops_fs::lookup(cx, d, e),
        op::LOOKUPP => ops_fs::lookupp(cx, d, e),
        op::NVERIFY => ops_fs::verify(cx, d, e, false),
        op::OPEN => ops_file::open(cx, d, e),
        op::OPEN_DOWNGRADE => ops_file::open_downgrade(cx, d, e),
        op::PUTFH => ops_fs::putfh(cx, d, e),
        op::PUTPUBFH | op::PUTROOTFH => ops_fs::putrootfh(cx, d, e),
        op::READ => ops_file::read(cx, d, e),
        op::READDIR => ops_fs::readdir(cx, d, e),
        op::READLINK => ops_fs::readlink(cx, d, e),
        op::REMOVE => ops_fs::remove(cx, d, e),
        op::RENAME => ops_fs::rename(cx, d, e),
        op::RESTOREFH => ops_fs::restorefh(cx, d, e),
        op::SAVEFH => ops_fs::savefh(cx, d, e),
        op::SECINFO => ops_fs::secinfo(cx, d, e, false),
        op::SECINFO_NO_NAME => ops_fs::secinfo(cx, d, e, true),
        op::SETATTR => ops_fs::setattr(cx, d, e),
        op::VERIFY => ops_fs::verify(cx, d, e, true),
        op::WRITE => ops_file::write(cx, d, e),
        op::BIND_CONN_TO_SESSION => ops_session::bind_conn_to_session(cx, d, e),
        op::EXCHANGE_ID => ops_session::exchange_id(cx, d, e),
        op::CREATE_SESSION => ops_session::create_session(cx, d, e),
        op::DESTROY_SESSION => ops_session::destroy_session(cx, d, e),
        op::FREE_STATEID => ops_file::free_stateid(cx, d, e),
        op::TEST_STATEID => ops_file::test_stateid(cx, d, e),
        op::DESTROY_CLIENTID => ops_session::destroy_clientid(cx, d, e),
        op::RECLAIM_COMPLETE => ops_session::reclaim_complete(cx, d, e),
        op::READ_PLUS => ops_sparse::read_plus(cx, d, e),
        op::SEEK => ops_sparse::seek(cx, d, e),
        op::ALLOCATE => ops_sparse::allocate(cx, d, e, false),
        op::DEALLOCATE => ops_sparse::allocate(cx, d, e, true),
        op::SEQUENCE => status::SEQUENCE_POS,
        // NFSv4.0-only ops are not for sessions (RFC 8881 section 18).
        op::OPEN_CONFIRM
        | op::RENEW
        | op::SETCLIENTID
        | op::SETCLIENTID_CONFIRM
        | op::RELEASE_LOCKOWNER => status::NOTSUPP,
        _ => status::NOTSUPP,
    }
}

fn sessionless_ok(opnum: u32) -> bool {
    matches!(
        opnum,
        op::EXCHANGE_ID
            | op::CREATE_SESSION
            | op::DESTROY_SESSION
            | op::BIND_CONN_TO_SESSION
            | op::DESTROY_CLIENTID
    )
}

/// Builds the COMPOUND4res body: status, tag, results.
fn finish(status_: u32, tag: &[u8], count: u32, results: Encoder) -> Encoder {
    let mut e = Encoder::with_capacity(tag.len() + 16 + results.len().min(4096));
    e.u32(status_);
    e.opaque(tag);
    e.u32(count);
    e.append(results);
    e
}

/// Bytes of an accepted RPC reply header in front of the COMPOUND4res.
const REPLY_HEADER: usize = 24;

/// Runs one COMPOUND and returns the encoded COMPOUND4res, or None when the
/// arguments cannot even be framed (GARBAGE_ARGS). `rpc_header` is the size
/// of the call's RPC header, which counts against the session's request
/// size limit.
pub fn process_compound(
    srv: &Server,
    rpc_cred: &Cred,
    peer: Option<IpAddr>,
    args: &[u8],
    rpc_header: usize,
) -> Option<Encoder> {
    let mut d = Decoder::new(args);
    let tag = d.opaque(MAX_TAG).ok()?;
    let minor = d.u32().ok()?;
    let nops = d.u32().ok()? as usize;
    if minor != 1 && minor != 2 {
        return Some(finish(status::MINOR_VERS_MISMATCH, tag, 0, Encoder::new()));
    }
    if nops == 0 {
        return Some(finish(status::OK, tag, 0, Encoder::new()));
    }
    let mut cx = Ctx {
        srv,
        cred: rpc_cred,
        peer,
        id: Server::identity(rpc_cred, &srv.exports.list()[0].rules),
        cur: None,
        saved: None,
        clientid: None,
        cur_sid: None,
    };
    let mut res = Encoder::with_capacity(512);
    let Ok(first) = d.u32() else {
        return Some(finish(status::BADXDR, tag, 0, Encoder::new()));
    };

    if first != op::SEQUENCE {
        if !(op::ACCESS..=op::LAST_KNOWN).contains(&first) {
            res.u32(op::ILLEGAL);
            res.u32(status::OP_ILLEGAL);
            return Some(finish(status::OP_ILLEGAL, tag, 1, res));
        }
        res.u32(first);
        let st = if !sessionless_ok(first) {
            status::OP_NOT_IN_SESSION
        } else if nops > 1 {
            status::NOT_ONLY_OP
        } else {
            let at = res.len();
            res.u32(0);
            let st = run_op(&mut cx, first, &mut d, &mut res);
            res.patch_u32(at, st);
            return Some(finish(st, tag, 1, res));
        };
        res.u32(st);
        return Some(finish(st, tag, 1, res));
    }

    // SEQUENCE first: find the session and the slot.
    res.u32(op::SEQUENCE);
    let seq = (|| -> Result<_, u32> {
        let sid: [u8; SESSIONID_SIZE] = d.array().map_err(|_| status::BADXDR)?;
        let seqid = d.u32().map_err(|_| status::BADXDR)?;
        let slot = d.u32().map_err(|_| status::BADXDR)?;
        let _highest = d.u32().map_err(|_| status::BADXDR)?;
        let cachethis = d.bool().map_err(|_| status::BADXDR)?;
        Ok((sid, seqid, slot, cachethis))
    })();
    let (sid, seqid, slot, cachethis) = match seq {
        Ok(v) => v,
        Err(st) => {
            res.u32(st);
            return Some(finish(st, tag, 1, res));
        }
    };
    let session = match srv.state.session(&sid) {
        Ok(s) => s,
        Err(st) => {
            res.u32(st);
            return Some(finish(st, tag, 1, res));
        }
    };
    if nops > session.fore.max_ops as usize {
        res.u32(status::TOO_MANY_OPS);
        return Some(finish(status::TOO_MANY_OPS, tag, 1, res));
    }
    if args.len() + rpc_header > session.fore.max_request as usize {
        res.u32(status::REQ_TOO_BIG);
        return Some(finish(status::REQ_TOO_BIG, tag, 1, res));
    }
    // A retransmission carries the same operations from the same caller;
    // anything else on the same slot and sequence id is a false retry.
    let request = request_fingerprint(rpc_cred, nops, &args[d.position()..]);
    match session.begin_request(slot, seqid, request) {
        Err(st) => {
            res.u32(st);
            return Some(finish(st, tag, 1, res));
        }
        Ok(SlotDecision::Replay(body)) => return Some(Encoder::from(body.as_ref().clone())),
        Ok(SlotDecision::Uncached) => {
            res.u32(status::RETRY_UNCACHED_REP);
            return Some(finish(status::RETRY_UNCACHED_REP, tag, 1, res));
        }
        Ok(SlotDecision::Execute) => {}
    }
    res.u32(status::OK);
    res.opaque_fixed(&sid);
    res.u32(seqid);
    res.u32(slot);
    res.u32(session.highest_slot());
    res.u32(session.highest_slot());
    res.u32(0); // status flags
    cx.clientid = Some(session.clientid);

    let mut count = 1u32;
    let mut last = status::OK;
    // Reply size limits (RFC 8881 section 18.36.3): the whole reply must
    // fit max_response, and one the client asked to cache must fit
    // max_response_cached.
    let fixed = REPLY_HEADER + 12 + tag.len().div_ceil(4) * 4;
    let max_reply = session.fore.max_response as usize;
    let max_cached = session.fore.max_response_cached as usize;
    {
        // The caller's identity follows the export of the current
        // filehandle, whose squash rules apply.
        let mut as_caller: Option<(Loc, cred::IdentityGuard)> = None;
        for _ in 1..nops {
            let Ok(opnum) = d.u32() else {
                // The op array ended early: the next op cannot be decoded.
                res.u32(op::ILLEGAL);
                res.u32(status::BADXDR);
                count += 1;
                last = status::BADXDR;
                break;
            };
            count += 1;
            if !(op::ACCESS..=op::LAST_KNOWN).contains(&opnum) {
                res.u32(op::ILLEGAL);
                res.u32(status::OP_ILLEGAL);
                last = status::OP_ILLEGAL;
                break;
            }
            res.u32(opnum);
            let at = res.len();
            res.u32(0);
            let loc = cx.cur.as_ref().map_or(Loc::Export(0), |f| match f.loc {
                Loc::Pseudo(_) => Loc::Export(0),
                l => l,
            });
            if as_caller.as_ref().map(|(l, _)| *l) != Some(loc) {
                // The old guard must go first: dropping it resets to root.
                drop(as_caller.take());
                cx.id = Server::identity(cx.cred, &srv.exports.get(loc).rules);
                as_caller = Some((loc, cred::assume(&cx.id)));
            }
            let mut st = run_op(&mut cx, opnum, &mut d, &mut res);
            let size = fixed + res.len();
            if size > max_reply || (cachethis && size > max_cached) {
                res.truncate(at + 4);
                st = if size > max_reply {
                    status::REP_TOO_BIG
                } else {
                    status::REP_TOO_BIG_TO_CACHE
                };
            }
            res.patch_u32(at, st);
            if st != status::OK {
                tracing::debug!(op = opnum, status = st, "op failed");
                last = st;
                break;
            }
        }
    }
    let body = finish(last, tag, count, res);
    let cached = if cachethis {
        Some(Arc::new(body.to_vec()))
    } else {
        // Not asked to cache: keep small replies anyway so a retransmission
        // after a lost connection gets the real answer.
        (body.len() <= 4096).then(|| Arc::new(body.to_vec()))
    };
    session.finish(slot, cached);
    Some(body)
}
