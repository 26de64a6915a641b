//! COMPOUND processing (RFC 8881 sections 2.10.6 and 16.2): the op loop,
//! SEQUENCE and the reply cache, and the per-request context.

use super::callback::CbConn;
use super::context::{Ctx, Fh};
use super::context::{MayWaitGuard, NoWaitGuard, Outcome};
use super::exports::Loc;
use super::optable::{self, flags, Handler, OnPseudo, OpDesc};
use super::state::session::SEQ4_STATUS_RECALLABLE_STATE_REVOKED;
use super::state::{request_fingerprint, SlotDecision, SlotGuard, Stateid};
use super::Server;
use crate::engine::cred;
use crate::engine::fs::Stat;
use crate::nfs4::consts::{attr, op, status};
use crate::nfs4::msg::{
    OpenArgs, Openflag4, SequenceArgs, SequenceResOk, SetattrArgs, WriteArgs, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::rpc::Cred;
use crate::xdr::{Decoder, Encoder};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// Longest COMPOUND tag accepted.
const MAX_TAG: usize = 1024;

/// Runs one op by its row of the op table, then moves the current
/// stateid along with the current filehandle (RFC 8881 section
/// 16.2.3.1.2): ops that set a new current filehandle without returning a
/// stateid reset it, SAVEFH and RESTOREFH save and restore it with the
/// filehandle.
fn run_op(
    cx: &mut Ctx<'_>,
    desc: &OpDesc,
    opnum: u32,
    d: &mut Decoder<'_>,
    e: &mut Encoder,
) -> Outcome {
    let st = dispatch(cx, desc, d, e);
    if st == Outcome::Done(status::OK) {
        if desc.has(flags::CLEARS_STATEID) {
            cx.cur_sid = None;
        }
        match opnum {
            op::SAVEFH => cx.saved_sid = cx.cur_sid,
            op::RESTOREFH => cx.cur_sid = cx.saved_sid,
            _ => {}
        }
    }
    st
}

fn dispatch(cx: &mut Ctx<'_>, desc: &OpDesc, d: &mut Decoder<'_>, e: &mut Encoder) -> Outcome {
    if desc.uses_cur_object() {
        if let Some(Loc::Pseudo(n)) = cx.cur.as_ref().map(|f| f.loc) {
            // Pseudo directories never reach the file system ops.
            match desc.pseudo {
                OnPseudo::Same => {}
                OnPseudo::Run(f) => return f(cx, n, d, e).into(),
                OnPseudo::Fail(st) => return st.into(),
            }
        }
        if desc.has(flags::TWO_OBJECTS) {
            if let (Some(s), Some(c)) = (&cx.saved, &cx.cur) {
                if s.loc != c.loc {
                    return status::XDEV.into();
                }
            }
        }
        if desc.has(flags::CHANGES_FS) && cx.cur_ex().rules.read_only {
            return status::ROFS.into();
        }
    }
    match desc.run {
        Some(Handler::Plain(f)) => f(cx, d, e).into(),
        Some(Handler::MayBlock(f)) => f(cx, d, e),
        // Defined but not implemented; NFSv4.0-only ops are not for
        // sessions (RFC 8881 section 18).
        None => status::NOTSUPP.into(),
    }
}

/// Builds the COMPOUND4res body: status, tag, results.
fn finish(status_: Nfsstat4, tag: &[u8], count: u32, results: Encoder) -> Encoder {
    let mut e = Encoder::with_capacity(tag.len() + 16 + results.len().min(4096));
    e.status(status_);
    e.opaque(tag);
    e.u32(count);
    e.append(results);
    e
}

/// Bytes of an accepted RPC reply header in front of the COMPOUND4res.
const REPLY_HEADER: usize = 24;

/// What became of a COMPOUND run where waiting is not allowed.
pub(super) enum Step {
    /// Finished: the COMPOUND4res, or None for GARBAGE_ARGS.
    Done(Option<Encoder>),
    /// Stopped before an op that may wait; [`Paused::resume`] finishes it
    /// on a thread that may.
    Paused(Paused),
}

/// A COMPOUND stopped before an op that may have to wait.
pub(super) struct Paused(PausedAt);

/// Where a COMPOUND's ops run, and so which of them may.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// On a thread that may wait: every op.
    Wait,
    /// On the connection's task: the ops that touch only memory or only
    /// try ([`flags::NO_WAIT`]).
    NoWait,
    /// On the connection's task, which the server lets run the
    /// [`flags::QUICK`] ops too (see [`Paused::try_quick`]).
    Quick,
}

/// stable_how4's UNSTABLE4.
const UNSTABLE4: u32 = 0;

/// Whether the QUICK op `opnum`, whose arguments `d` is at, may run on
/// the connection's task: not when its arguments ask for work that goes
/// to storage (a WRITE that is FILE_SYNC, DATA_SYNC, large or direct; a
/// SETATTR of the size, which may free a large file's blocks), an OPEN
/// that would first write its client's stable record, nor, on an export
/// with `sync` (the default), an op that syncs what it changed before
/// its answer (see `ops_fs::commit_meta`) and either syncs a file (LINK,
/// SETATTR) or makes a new object (CREATE, and OPEN that creates): a new
/// inode takes more of the journal's buffers, and a thread that waits
/// there while the journal writes them out holds up every connection its
/// task serves (creates on ext4 were 4-10% slower so). REMOVE runs here,
/// and so does RENAME while a sync of its (target) directory runs: they
/// leave the directory's next sync, which the changes made meanwhile
/// share, for the COMPOUND to wait for without holding the task (see
/// `Ctx::deferred`). A RENAME with no sync of its directory running goes
/// to a worker, which renames and syncs on one thread: the sync would
/// start at once anyway, on a worker, and btrfs makes a log sync wait a
/// clock tick when a thread other than the syncing one joined the log,
/// as a rename does (one client's renames ran at a third of the rate
/// so).
fn quick_args(cx: &Ctx<'_>, opnum: u32, d: &Decoder<'_>) -> bool {
    // Malformed arguments are answered at once (NFS4ERR_BADXDR): quick.
    let mut d = d.clone();
    let sync = || cx.cur().is_ok_and(|fh| super::ops_fs::syncs(cx, fh));
    match opnum {
        op::WRITE => WriteArgs::decode(&mut d, usize::MAX).ok().is_none_or(|a| {
            a.stable == UNSTABLE4 && super::inline::small_cached_write(cx.srv, a.data.len())
        }),
        op::SETATTR => {
            SetattrArgs::decode(&mut d)
                .ok()
                .is_none_or(|a| !a.attrs.mask.has(attr::SIZE))
                && !sync()
        }
        op::OPEN => {
            cx.clientid().is_ok_and(|c| cx.srv.state.client_recorded(c))
                && !(sync()
                    && OpenArgs::decode(&mut d)
                        .is_ok_and(|a| matches!(a.openhow, Openflag4::Create(_))))
        }
        op::CREATE | op::LINK => !sync(),
        op::RENAME => !sync() || syncing_cur(cx),
        _ => true,
    }
}

/// Whether a sync of the current filehandle's directory is running, by
/// the identity kept of it, or else one read now (which always finds the
/// inode in memory: its descriptor holds it).
fn syncing_cur(cx: &Ctx<'_>) -> bool {
    let st = match (cx.cur_identity(), cx.cur()) {
        (Some(st), _) => st,
        (None, Ok(fh)) => match crate::engine::fs::identity(fh.fd.as_fd()) {
            Ok(st) => st,
            Err(_) => return false,
        },
        (None, Err(_)) => return false,
    };
    st.is_dir() && cx.srv.dir_syncs.running((st.dev, st.ino))
}

enum PausedAt {
    /// Before its first op (one outside a session, which may wait).
    Start(Args),
    /// After SEQUENCE and the ops that could run.
    Midway(Box<Running>),
    /// After an op that ran on the connection's task and left syncs of
    /// the directories it changed to wait for (see `Ctx::deferred`):
    /// the next op runs, and the answer goes, only after them.
    Syncing(Box<Synced>),
}

/// A COMPOUND waiting for the directory syncs its last op left.
struct Synced {
    r: Box<Running>,
    pending: Vec<super::dirsync::Pending>,
    /// Where that op's status is in the results.
    status_at: usize,
    /// That op's status: the COMPOUND ends after the syncs unless it is
    /// OK and ops are left.
    last: Nfsstat4,
}

/// A COMPOUND's arguments and caller, owned so it can move between threads.
struct Args {
    /// Holds the COMPOUND4args at `at`.
    buf: Vec<u8>,
    at: usize,
    /// Size of the call's RPC header (counts against the session's limit).
    rpc_header: usize,
    cred: Cred,
    peer: Option<IpAddr>,
    /// The connection the call came over, if it can carry callbacks.
    conn: Option<Arc<CbConn>>,
}

impl Args {
    fn args(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// A COMPOUND that has passed SEQUENCE, with what its remaining ops need.
struct Running {
    args: Args,
    /// Where the tag is in the arguments.
    tag: std::ops::Range<usize>,
    /// Where the next op starts in the arguments.
    next: usize,
    /// Ops not yet run.
    left: usize,
    /// Results encoded so far, and their number.
    res: Encoder,
    count: u32,
    cur: Option<Fh>,
    saved: Option<Fh>,
    cur_sid: Option<Stateid>,
    saved_sid: Option<Stateid>,
    /// PUTFH's check of the handle before a WRITE (see
    /// `Ctx::cur_identity`), kept over a pause: the type and inode number
    /// of a descriptor's object never change, and WRITE's own stat would
    /// not see a removal that came after it either.
    cur_identity: Option<(Arc<OwnedFd>, Stat)>,
    /// The status PUTFH, LOOKUP or OPEN read (see `Ctx::cur_stat`), kept
    /// over a pause too: nothing of this COMPOUND has run since, and a
    /// change by another client during the pause could as well have come
    /// just after the op that reads it (the directory an OPEN creates in,
    /// which runs on a worker, has its status from the LOOKUP before).
    cur_stat: Option<(Arc<OwnedFd>, Stat)>,
    /// The slot, given back when the COMPOUND ends, also by a panic.
    slot: SlotGuard,
    cachethis: bool,
    /// The COMPOUND's minor version.
    minor: u32,
    /// Whether the op at `next` has not been tried yet (after a pause
    /// for syncs, not for that op).
    untried: bool,
}

impl Paused {
    /// Finishes the COMPOUND on the calling thread, which may wait.
    pub(super) fn resume(self, srv: &Server) -> Option<Encoder> {
        // On a worker that may keep the last caller's identity (see
        // `cred::lending`): `run_ops` keeps it for ops of the same caller
        // that may run with it; client and session set-up and the
        // directory syncs are the server's work.
        let step = match self.0 {
            PausedAt::Start(args) => {
                cred::reclaim();
                start(srv, args, Mode::Wait)
            }
            PausedAt::Midway(r) => run_ops(srv, r, Mode::Wait),
            PausedAt::Syncing(s) => {
                cred::reclaim();
                let r = super::ops_fs::sync_deferred(srv, &s.pending);
                match s.synced(r) {
                    Step::Paused(Paused(PausedAt::Midway(r))) => run_ops(srv, r, Mode::Wait),
                    step => step,
                }
            }
        };
        match step {
            Step::Done(body) => body,
            Step::Paused(_) => unreachable!("a COMPOUND allowed to wait does not pause"),
        }
    }

    /// Whether the COMPOUND waits for directory syncs that its last op
    /// left (see [`Paused::sync`]).
    pub(super) fn awaits_syncs(&self) -> bool {
        matches!(self.0, PausedAt::Syncing(_))
    }

    /// The directory syncs the COMPOUND waits for (none when it does not).
    pub(super) fn pending_syncs(&self) -> &[super::dirsync::Pending] {
        match &self.0 {
            PausedAt::Syncing(s) => &s.pending,
            _ => &[],
        }
    }

    /// Goes on as [`Paused::sync`] would have after the syncs gave `r`.
    #[cfg(test)]
    pub(super) fn synced_with(self, r: Result<(), Nfsstat4>) -> Step {
        match self.0 {
            PausedAt::Syncing(s) => s.synced(r),
            at => Step::Paused(Paused(at)),
        }
    }

    /// Waits, without holding a thread, for the directory syncs the
    /// COMPOUND's last op left, and goes on: the COMPOUND ends there (the
    /// op failed, was the last, or its syncs failed) or comes back paused
    /// before its next op.
    pub(super) async fn sync(self, srv: &Server) -> Step {
        match self.0 {
            PausedAt::Syncing(s) => {
                let r = super::ops_fs::sync_deferred_async(srv, &s.pending).await;
                s.synced(r)
            }
            at => Step::Paused(Paused(at)),
        }
    }

    /// Goes on with the COMPOUND on the connection's task, as far as the
    /// [`flags::QUICK`] ops and those that never wait take it: the caller
    /// has made sure that the task may be held for as long as they take.
    pub(super) fn try_quick(self, srv: &Server) -> Step {
        match self.0 {
            PausedAt::Midway(r) => {
                let _nowait = NoWaitGuard::new();
                run_ops(srv, r, Mode::Quick)
            }
            at @ (PausedAt::Start(_) | PausedAt::Syncing(_)) => Step::Paused(Paused(at)),
        }
    }
}

impl Synced {
    /// Goes on after the syncs, with their result `r`. Syncs that failed
    /// turn an op that succeeded into one that failed with their error,
    /// as the op would have had it synced itself; its results are
    /// dropped. (The op's change stays made, as it would have.)
    fn synced(self, result: Result<(), Nfsstat4>) -> Step {
        let Synced {
            r: mut run,
            status_at,
            last,
            ..
        } = self;
        let last = match result {
            Err(st) if last == status::OK => {
                run.res.truncate(status_at);
                run.res.u32(st.code());
                st
            }
            _ => last,
        };
        if last == status::OK && run.left > 0 {
            run.untried = true;
            return Step::Paused(Paused(PausedAt::Midway(run)));
        }
        end(run, last)
    }
}

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
    let args = Args {
        buf: args.to_vec(),
        at: 0,
        rpc_header,
        cred: rpc_cred.clone(),
        peer,
        conn: None,
    };
    match start(srv, args, Mode::Wait) {
        Step::Done(body) => body,
        Step::Paused(p) => p.resume(srv),
    }
}

/// Runs the COMPOUND4args at `at` in `buf` (an RPC record whose header has
/// `at` bytes) as far as it can go without waiting.
pub(super) fn try_compound(
    srv: &Server,
    buf: Vec<u8>,
    at: usize,
    cred: Cred,
    peer: Option<IpAddr>,
    conn: Option<Arc<CbConn>>,
) -> Step {
    let _nowait = NoWaitGuard::new();
    let args = Args {
        conn,
        buf,
        at,
        rpc_header: at,
        cred,
        peer,
    };
    start(srv, args, Mode::NoWait)
}

/// Decodes the COMPOUND header and runs SEQUENCE (or the one op allowed
/// outside a session), then the ops.
fn start(srv: &Server, args: Args, mode: Mode) -> Step {
    let mut d = Decoder::new(args.args());
    let Ok(tag) = d.opaque(MAX_TAG) else {
        return Step::Done(None);
    };
    let tag_at = d.position() - tag.len().div_ceil(4) * 4;
    let tag_range = tag_at..tag_at + tag.len();
    let (Ok(minor), Ok(nops)) = (d.u32(), d.u32()) else {
        return Step::Done(None);
    };
    let nops = nops as usize;
    let done =
        |st: Nfsstat4, count: u32, res: Encoder| Step::Done(Some(finish(st, tag, count, res)));
    if minor != 1 && minor != 2 {
        return done(status::MINOR_VERS_MISMATCH, 0, Encoder::new());
    }
    if nops == 0 {
        return done(status::OK, 0, Encoder::new());
    }
    let mut res = Encoder::with_capacity(512);
    let Ok(first) = d.u32() else {
        return done(status::BADXDR, 0, Encoder::new());
    };

    if first != op::SEQUENCE {
        let Some(desc) = optable::desc(first, minor) else {
            res.u32(op::ILLEGAL);
            res.status(status::OP_ILLEGAL);
            return done(status::OP_ILLEGAL, 1, res);
        };
        res.u32(first);
        let st = if !desc.has(flags::SESSIONLESS) {
            status::OP_NOT_IN_SESSION
        } else if nops > 1 {
            status::NOT_ONLY_OP
        } else if mode != Mode::Wait {
            // Client and session set-up may write to the state directory.
            return Step::Paused(Paused(PausedAt::Start(args)));
        } else {
            let mut cx = Ctx {
                srv,
                cred: &args.cred,
                peer: args.peer,
                conn: args.conn.as_ref(),
                minor,
                id: Server::identity(&args.cred, &srv.exports.list()[0].rules),
                cur: None,
                saved: None,
                session: None,
                cur_sid: None,
                saved_sid: None,
                cur_stat: None,
                cur_identity: None,
                lend: false,
                deferred: None,
            };
            let at = res.len();
            res.u32(0);
            // As the server: they may write the state directory.
            cred::reclaim();
            // The ops allowed here are never stopped for waiting.
            let st = match run_op(&mut cx, desc, first, &mut d, &mut res) {
                Outcome::Done(st) => st,
                Outcome::WouldBlock => status::SERVERFAULT,
            };
            res.patch_u32(at, st.code());
            return done(st, 1, res);
        };
        res.status(st);
        return done(st, 1, res);
    }

    // SEQUENCE (which only looks at sessions in memory) runs with the
    // identity the thread kept when it is this caller's (see
    // `cred::lending`), and as the server otherwise.
    if cred::lent() {
        cred::keep_lent_for(
            &Server::identity(&args.cred, &srv.exports.list()[0].rules),
            true,
        );
    }
    // SEQUENCE first: find the session and the slot.
    res.u32(op::SEQUENCE);
    let (sid, seqid, slot, cachethis) = match SequenceArgs::decode(&mut d) {
        Ok(a) => (a.sessionid, a.sequenceid, a.slotid, a.cachethis),
        Err(_) => {
            res.status(status::BADXDR);
            return done(status::BADXDR, 1, res);
        }
    };
    let session = match srv.state.session(&sid) {
        Ok(s) => s,
        Err(st) => {
            res.status(st);
            return done(st, 1, res);
        }
    };
    if nops > session.fore.max_ops as usize {
        res.status(status::TOO_MANY_OPS);
        return done(status::TOO_MANY_OPS, 1, res);
    }
    if args.args().len() + args.rpc_header > session.fore.max_request as usize {
        res.status(status::REQ_TOO_BIG);
        return done(status::REQ_TOO_BIG, 1, res);
    }
    // A retransmission carries the same operations from the same caller;
    // anything else on the same slot and sequence id is a false retry.
    let request = request_fingerprint(&args.cred, nops, &args.args()[d.position()..]);
    let decision = session.begin_request(slot, seqid, request, cachethis);
    if let Err(st) = decision {
        res.status(st);
        return done(st, 1, res);
    }
    if let Ok(SlotDecision::Replay(body)) = decision {
        return Step::Done(Some(Encoder::from(body.as_ref().clone())));
    }
    res.status(status::OK);
    SequenceResOk {
        sessionid: sid,
        sequenceid: seqid,
        slotid: slot,
        highest_slotid: session.highest_slot(),
        target_highest_slotid: session.highest_slot(),
        status_flags: session.back_channel_flags()
            | if srv.state.has_revoked_delegs(session.clientid) {
                SEQ4_STATUS_RECALLABLE_STATE_REVOKED
            } else {
                0
            },
    }
    .encode(&mut res);
    if let Ok(SlotDecision::Uncached) = decision {
        // RFC 8881 section 2.10.6.1.3: a retry whose reply was not kept
        // gets SEQUENCE's result and NFS4ERR_RETRY_UNCACHED_REP on the
        // second op (never on SEQUENCE itself, when it is the first op);
        // ops that cannot be in the COMPOUND get their own error.
        if nops == 1 {
            return done(status::OK, 1, res);
        }
        let (opnum, st) = match d.u32().map(|n| (n, optable::desc(n, minor))) {
            Err(_) => (op::ILLEGAL, status::BADXDR),
            Ok((_, None)) => (op::ILLEGAL, status::OP_ILLEGAL),
            Ok((n, Some(desc))) if desc.has(flags::V40_ONLY) => (n, status::NOTSUPP),
            Ok((n, Some(_))) => (n, status::RETRY_UNCACHED_REP),
        };
        res.u32(opnum);
        res.status(st);
        return done(st, 2, res);
    }
    let next = d.position();
    let slot = SlotGuard::new(session, slot);
    run_ops(
        srv,
        Box::new(Running {
            args,
            tag: tag_range,
            next,
            left: nops - 1,
            res,
            count: 1,
            cur: None,
            saved: None,
            cur_sid: None,
            saved_sid: None,
            cur_identity: None,
            cur_stat: None,
            slot,
            cachethis,
            minor,
            untried: false,
        }),
        mode,
    )
}

/// Runs the ops after SEQUENCE, then finishes the slot. Stops before an
/// op that `mode` does not let run, and returns the rest.
fn run_ops(srv: &Server, mut r: Box<Running>, mode: Mode) -> Step {
    let mut last = status::OK;
    let mut paused = false;
    // Syncs the last op left, and where its status is.
    let mut syncing = None;
    {
        let Running {
            args,
            tag,
            next,
            left,
            res,
            count,
            cur,
            saved,
            cur_sid,
            saved_sid,
            cur_identity,
            cur_stat,
            slot,
            cachethis,
            minor,
            untried,
        } = &mut *r;
        let untried = std::mem::take(untried);
        let session = slot.session().clone();
        let mut cx = Ctx {
            srv,
            cred: &args.cred,
            peer: args.peer,
            conn: args.conn.as_ref(),
            minor: *minor,
            id: Server::identity(&args.cred, &srv.exports.list()[0].rules),
            cur: cur.take(),
            saved: saved.take(),
            session: Some(&session),
            cur_sid: *cur_sid,
            saved_sid: *saved_sid,
            cur_stat: cur_stat.take(),
            cur_identity: cur_identity.take(),
            lend: !*cachethis && super::may_lend(args.conn.as_ref()),
            deferred: (mode == Mode::Quick).then(Default::default),
        };
        let mut d = Decoder::new(&args.buf[args.at..]);
        let _ = d.skip(*next);
        // Reply size limits (RFC 8881 section 18.36.3): the whole reply must
        // fit max_response, and one the client asked to cache must fit
        // max_response_cached.
        let fixed = REPLY_HEADER + 12 + tag.len().div_ceil(4) * 4;
        let max_reply = session.fore.max_response as usize;
        let max_cached = session.fore.max_response_cached as usize;
        // The caller's identity follows the export of the current
        // filehandle, whose squash rules apply.
        // Taken only for the ops that need it (see `OpDesc::runs_as_caller`):
        // SEQUENCE, PUTFH, READ is the most common COMPOUND of all, and
        // switching identities costs the kernel two new credentials each way.
        let mut as_caller: Option<(Loc, cred::IdentityGuard)> = None;
        // The export cx.id was worked out for.
        let mut id_loc = Loc::Export(0);
        let first_count = *count;
        while *left > 0 {
            let op_at = d.position();
            let Ok(opnum) = d.u32() else {
                // The op array ended early: the next op cannot be decoded.
                res.u32(op::ILLEGAL);
                res.status(status::BADXDR);
                *count += 1;
                last = status::BADXDR;
                break;
            };
            let Some(desc) = optable::desc(opnum, cx.minor) else {
                res.u32(op::ILLEGAL);
                res.status(status::OP_ILLEGAL);
                *count += 1;
                last = status::OP_ILLEGAL;
                break;
            };
            let quick = || desc.has(flags::QUICK) && quick_args(&cx, opnum, &d);
            let runs_here = match mode {
                Mode::Wait => true,
                Mode::NoWait => desc.has(flags::NO_WAIT),
                // The op the COMPOUND stopped at runs here only if it is
                // quick: one that tried and found it would wait is not
                // tried again (a READ's second try would tell the
                // readahead engine of a second request in flight).
                Mode::Quick if *count == first_count && !untried => quick(),
                Mode::Quick => desc.has(flags::NO_WAIT) || quick(),
            };
            if !runs_here {
                *next = op_at;
                paused = true;
                break;
            }
            // A quick op runs as it would on a worker: it is never stopped
            // halfway for waiting, which might leave it half done.
            let _may_wait =
                (mode == Mode::Quick && !desc.has(flags::NO_WAIT)).then(MayWaitGuard::new);
            res.u32(opnum);
            let at = res.len();
            res.u32(0);
            let loc = cx.cur.as_ref().map_or(Loc::Export(0), |f| match f.loc {
                Loc::Pseudo(_) => Loc::Export(0),
                l => l,
            });
            if id_loc != loc {
                cx.id = Server::identity(cx.cred, &srv.exports.get(loc).rules);
                id_loc = loc;
            }
            if as_caller.is_none() {
                // The thread may still have the identity of a caller
                // before (see `cred::lending`): kept while the ops may run
                // with this caller's, until one takes it.
                cred::keep_lent_for(&cx.id, desc.may_run_lent());
            }
            if desc.runs_as_caller() && as_caller.as_ref().map(|(l, _)| *l) != Some(loc) {
                // The old guard goes first: it gives back the identity
                // from before the COMPOUND.
                drop(as_caller.take());
                as_caller = Some((loc, cred::assume_kept(&cx.id)));
            }
            // An op that changes things must be sure its result fits the
            // reply (and the reply cache, when asked) before it runs: once
            // it has run, the client must get its result (RFC 8881
            // sections 2.10.6.4 and 18.46.3).
            if desc.has(flags::MODIFIES) {
                let worst = fixed + res.len() + desc.reply_bound as usize;
                let refuse = if worst > max_reply {
                    Some(status::REP_TOO_BIG)
                } else if *cachethis && worst > max_cached {
                    Some(status::REP_TOO_BIG_TO_CACHE)
                } else {
                    None
                };
                if let Some(st) = refuse {
                    res.patch_u32(at, st.code());
                    *count += 1;
                    tracing::debug!(
                        op = desc.name,
                        status = %st,
                        "op not run: its result might not fit"
                    );
                    last = st;
                    break;
                }
            }
            let mut st = match run_op(&mut cx, desc, opnum, &mut d, res) {
                Outcome::Done(st) => {
                    cx.keep_stat_after(opnum);
                    st
                }
                Outcome::WouldBlock => {
                    debug_assert!(
                        mode != Mode::Wait && _may_wait.is_none(),
                        "op {opnum} would block where waiting is allowed"
                    );
                    res.truncate(at - 4);
                    *next = op_at;
                    paused = true;
                    break;
                }
            };
            *count += 1;
            *left -= 1;
            let size = fixed + res.len();
            if size > max_reply || (*cachethis && size > max_cached) {
                res.truncate(at + 4);
                st = if size > max_reply {
                    status::REP_TOO_BIG
                } else {
                    status::REP_TOO_BIG_TO_CACHE
                };
            }
            res.patch_u32(at, st.code());
            if st != status::OK {
                tracing::debug!(op = desc.name, status = %st, "op failed");
                last = st;
            }
            // Syncs the op left are waited for before anything else runs,
            // even when it failed after a change.
            let pending = cx.deferred.as_ref().map(|d| d.take()).unwrap_or_default();
            if !pending.is_empty() {
                *next = d.position();
                syncing = Some((pending, at));
                break;
            }
            if st != status::OK {
                break;
            }
        }
        *cur = cx.cur.take();
        *saved = cx.saved.take();
        *cur_sid = cx.cur_sid;
        *saved_sid = cx.saved_sid;
        *cur_identity = cx.cur_identity.take();
        *cur_stat = cx.cur_stat.take();
    }
    if let Some((pending, status_at)) = syncing {
        return Step::Paused(Paused(PausedAt::Syncing(Box::new(Synced {
            r,
            pending,
            status_at,
            last,
        }))));
    }
    if paused {
        return Step::Paused(Paused(PausedAt::Midway(r)));
    }
    end(r, last)
}

/// Ends the COMPOUND `r` with status `last`: encodes its answer and
/// finishes its slot (keeping the answer when it should).
fn end(r: Box<Running>, last: Nfsstat4) -> Step {
    let Running {
        args,
        tag,
        res,
        count,
        slot,
        cachethis,
        ..
    } = *r;
    let body = finish(last, &args.args()[tag], count, res);
    let cached = if cachethis {
        Some(Arc::new(body.to_vec()))
    } else {
        // Not asked to cache: keep small replies anyway so a retransmission
        // after a lost connection gets the real answer (but not file data
        // lent from a mapping, which the server must not read itself: a
        // READ_PLUS of a few data bytes among holes).
        (body.len() <= 4096 && !body.has_lent()).then(|| Arc::new(body.to_vec()))
    };
    slot.finish(cached);
    Step::Done(Some(body))
}
