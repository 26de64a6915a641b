//! The back channel (RFC 8881 section 2.10.3.1): calls from the server to
//! a client over a connection the client made and bound to a session.
//!
//! [`CbConn`] is the calling side of one connection: the connection's
//! reader hands it every record that is a reply ([`crate::rpc::is_reply`]),
//! and a caller waits for the reply to its xid, or for the connection to
//! end, or for its timeout. [`BackChannel`] is what a session knows of its
//! back channel: the connection, the client's callback program and
//! credential, the slot's sequence id, and whether the path works. Calls
//! go out on threads of their own, never on a request's thread.

use super::counters::Metrics;
use super::state::{Recall, Session};
use crate::nfs4::msg::{
    cb_op, cb_proc, Bitmap4, CallbackSec, CbCompoundHeader, CbCompoundResHeader, CbGetattrArgs,
    CbGetattrResOk, CbOffloadArgs, CbRecallArgs, CbSequenceArgs, CbSequenceResOk, NfsFh4,
    OffloadInfo4, Stateid4, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::rpc::{self, CallCred, ReplyError};
use crate::xdr::{Decoder, Encoder};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a callback waits for its reply.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a callback got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CbError {
    /// The connection is gone (or none is bound).
    #[error("no back channel connection")]
    NoConnection,
    /// No reply in time.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The client refused the call.
    #[error("{0}")]
    Rejected(#[from] ReplyError),
    /// The reply could not be read.
    #[error("malformed callback reply")]
    Malformed,
    /// CB_SEQUENCE failed with this status: the back channel is faulty.
    #[error("CB_SEQUENCE failed with {0}")]
    Sequence(Nfsstat4),
    /// An op after CB_SEQUENCE failed with this status.
    #[error("callback failed with {0}")]
    Status(Nfsstat4),
}

type Hook = Box<dyn FnOnce() + Send>;

/// The calling side of one client connection.
pub struct CbConn {
    send: Box<dyn Fn(Encoder) -> bool + Send + Sync>,
    pending: Mutex<HashMap<u32, SyncSender<Vec<u8>>>>,
    next_xid: AtomicU32,
    closed: AtomicBool,
    after_reply: Mutex<Vec<Hook>>,
    /// Whether `after_reply` holds anything: every reply asks, without
    /// taking the lock.
    queued: AtomicBool,
    /// This server's address on the connection (what the portmapper on
    /// the NFS port tells callers).
    local: std::sync::OnceLock<std::net::IpAddr>,
    /// Set while replies wait for room in the connection's socket.
    backlog: std::sync::OnceLock<Arc<AtomicBool>>,
}

impl std::fmt::Debug for CbConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CbConn")
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl CbConn {
    /// A connection whose records `send` writes (false once it cannot).
    pub fn new(send: impl Fn(Encoder) -> bool + Send + Sync + 'static) -> Arc<Self> {
        // Start xids away from the client's own, which it counts from
        // small numbers (replies and calls are told apart by type anyway).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        Arc::new(CbConn {
            send: Box::new(send),
            pending: Mutex::new(HashMap::new()),
            next_xid: AtomicU32::new(seed | 0x8000_0000),
            closed: AtomicBool::new(false),
            after_reply: Mutex::new(Vec::new()),
            queued: AtomicBool::new(false),
            local: std::sync::OnceLock::new(),
            backlog: std::sync::OnceLock::new(),
        })
    }

    /// Shares the flag the connection's sending side sets while replies
    /// wait for room in its socket.
    pub fn set_backlog(&self, flag: Arc<AtomicBool>) {
        let _ = self.backlog.set(flag);
    }

    /// Whether replies wait for room in the connection's socket now.
    pub fn backlogged(&self) -> bool {
        self.backlog
            .get()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Records this server's address on the connection.
    pub fn set_local(&self, ip: std::net::IpAddr) {
        let _ = self.local.set(ip);
    }

    /// This server's address on the connection, when recorded.
    pub fn local(&self) -> Option<std::net::IpAddr> {
        self.local.get().copied()
    }

    /// The connection ended: calls waiting for replies fail at once.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Whether a call on this connection waits for the client's answer.
    pub fn awaiting_replies(&self) -> bool {
        !self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Whether the connection is still there.
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    /// A reply record from the client: wakes the call it answers.
    pub fn reply(&self, record: Vec<u8>) {
        let Ok((xid, _)) = rpc::parse_reply(&record) else {
            tracing::debug!("malformed reply on a client connection dropped");
            return;
        };
        let waiter = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&xid);
        match waiter {
            Some(w) => {
                let _ = w.try_send(record);
            }
            None => tracing::debug!(xid, "reply to no callback in flight dropped"),
        }
    }

    /// Runs `f` once the reply of the request being processed is sent,
    /// so that a callback it starts reaches the client after that reply.
    pub(crate) fn after_reply(&self, f: impl FnOnce() + Send + 'static) {
        self.after_reply
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(f));
        self.queued.store(true, Ordering::Release);
    }

    /// What [`CbConn::after_reply`] queued, for the connection to start.
    pub fn take_after_reply(&self) -> Vec<Box<dyn FnOnce() + Send>> {
        if !self.queued.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.after_reply.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Calls procedure `proc_` of `prog` version 1 with `args`; the bytes
    /// of the results. Blocks the calling thread for up to `timeout`.
    pub fn call(
        &self,
        prog: u32,
        proc_: u32,
        cred: &CallCred,
        args: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, CbError> {
        if !self.is_open() {
            return Err(CbError::NoConnection);
        }
        let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(xid, tx);
        let mut e = Encoder::with_capacity(128 + args.len());
        rpc::call_header(&mut e, xid, prog, 1, proc_, cred);
        e.raw(args);
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&xid);
        };
        if !(self.send)(e) {
            forget();
            return Err(CbError::NoConnection);
        }
        let record = match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                forget();
                return Err(CbError::Timeout(timeout));
            }
            Err(RecvTimeoutError::Disconnected) => return Err(CbError::NoConnection),
        };
        let (_, at) = rpc::parse_reply(&record).map_err(|_| CbError::Malformed)?;
        let at = at?;
        Ok(record[at..].to_vec())
    }
}

/// Whether a session's back channel is known to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CbState {
    /// Not probed yet.
    Unknown,
    /// The last call got its answer.
    Up,
    /// The last call failed, or the connection is gone.
    Down,
}

/// What a session knows of its back channel.
#[derive(Debug)]
pub struct BackChannel {
    /// The connection calls go over (dangling when none is bound).
    pub conn: Weak<CbConn>,
    /// The client asked for a back channel: SEQUENCE says when it does
    /// not work.
    pub wanted: bool,
    /// The client's callback program (from CREATE_SESSION or
    /// BACKCHANNEL_CTL).
    pub program: u32,
    /// The credential calls carry: the client's AUTH_SYS parameters, or
    /// none.
    pub cred: CallCred,
    /// Whether the path works.
    pub state: CbState,
    /// The sequence id of the back channel's slot 0, last used.
    pub seq: u32,
    /// The minor version of the session: callbacks carry it (the Linux
    /// client refuses CB_COMPOUNDs of another minor version than its
    /// own, with NFS4ERR_BADSESSION).
    pub minor: u32,
}

impl BackChannel {
    /// A back channel over `conn` for `program`, with the first usable
    /// security of `sec` (AUTH_SYS preferred, then AUTH_NONE).
    pub fn new(conn: &Arc<CbConn>, minor: u32, program: u32, sec: &[CallbackSec]) -> Self {
        BackChannel {
            conn: Arc::downgrade(conn),
            wanted: true,
            program,
            cred: cred_of(sec),
            state: CbState::Unknown,
            seq: 0,
            minor,
        }
    }

    /// A back channel with no connection bound yet.
    pub fn unbound(minor: u32, program: u32, sec: &[CallbackSec]) -> Self {
        BackChannel {
            conn: Weak::new(),
            wanted: false,
            program,
            cred: cred_of(sec),
            state: CbState::Unknown,
            seq: 0,
            minor,
        }
    }

    /// Calls go over `conn` from now on; the client wants them.
    pub fn bind(&mut self, conn: &Arc<CbConn>) {
        self.conn = Arc::downgrade(conn);
        self.wanted = true;
        self.state = CbState::Unknown;
    }

    /// Whether calls can go out now.
    pub fn usable(&self) -> bool {
        self.state != CbState::Down && self.conn.upgrade().is_some_and(|c| c.is_open())
    }
}

/// The credential for callbacks from the client's callback_sec_parms4.
pub fn cred_of(sec: &[CallbackSec]) -> CallCred {
    for s in sec {
        if let CallbackSec::Sys(p) = s {
            return CallCred::Sys {
                stamp: p.stamp,
                machine: p.machine.clone(),
                uid: p.uid,
                gid: p.gid,
                gids: p.gids.clone(),
            };
        }
    }
    CallCred::None
}

/// Whether the client offered a security flavor the server can call with
/// (AUTH_SYS or AUTH_NONE; RPCSEC_GSS is not supported).
pub fn usable_sec(sec: &[CallbackSec]) -> bool {
    sec.iter()
        .any(|s| matches!(s, CallbackSec::None | CallbackSec::Sys(_)))
}

/// Sends CB_NULL over the session's back channel (with AUTH_NONE, which
/// clients accept for it) and records whether it was answered.
pub fn probe(session: &Session) -> Result<(), CbError> {
    let (conn, program) = {
        let b = session.back_channel();
        match b.as_ref() {
            Some(b) => (b.conn.upgrade(), b.program),
            None => return Err(CbError::NoConnection),
        }
    };
    let started = Instant::now();
    let r = match conn {
        Some(c) => c
            .call(program, cb_proc::NULL, &CallCred::None, &[], CALL_TIMEOUT)
            .map(drop),
        None => Err(CbError::NoConnection),
    };
    set_state(session, &r);
    match &r {
        Ok(()) => tracing::debug!(
            clientid = format!("{:#x}", session.clientid),
            elapsed = ?started.elapsed(),
            "back channel up"
        ),
        Err(e) => tracing::info!(
            clientid = format!("{:#x}", session.clientid),
            error = %e,
            "back channel down"
        ),
    }
    r
}

fn set_state<T>(session: &Session, r: &Result<T, CbError>) {
    if let Some(b) = session.back_channel().as_mut() {
        b.state = if r.is_ok() {
            CbState::Up
        } else {
            CbState::Down
        };
    }
}

/// Runs a CB_COMPOUND of CB_SEQUENCE and the ops `ops` writes (`nops` of
/// them) over the session's back channel, one at a time per session (the
/// back channel has one slot); the bytes of the results after
/// CB_SEQUENCE's.
pub fn compound(
    session: &Session,
    nops: u32,
    ops: impl FnOnce(&mut Encoder),
) -> Result<Vec<u8>, CbError> {
    let _one_at_a_time = session.cb_slot();
    let (conn, program, cred, seq, minor) = {
        let mut b = session.back_channel();
        let Some(b) = b.as_mut() else {
            return Err(CbError::NoConnection);
        };
        b.seq = b.seq.wrapping_add(1);
        (b.conn.upgrade(), b.program, b.cred.clone(), b.seq, b.minor)
    };
    let Some(conn) = conn else {
        let r = Err(CbError::NoConnection);
        set_state(session, &r);
        return r;
    };
    let mut e = Encoder::new();
    CbCompoundHeader {
        tag: Vec::new(),
        minorversion: minor,
        callback_ident: 0,
        numops: nops + 1,
    }
    .encode(&mut e);
    e.u32(cb_op::SEQUENCE);
    CbSequenceArgs {
        sessionid: session.id,
        sequenceid: seq,
        slotid: 0,
        highest_slotid: 0,
        cachethis: false,
        referring_call_lists: Vec::new(),
    }
    .encode(&mut e);
    ops(&mut e);
    let r = conn
        .call(
            program,
            cb_proc::COMPOUND,
            &cred,
            e.as_slice(),
            CALL_TIMEOUT,
        )
        .and_then(|body| {
            let mut d = Decoder::new(&body);
            let h = CbCompoundResHeader::decode(&mut d).map_err(|_| CbError::Malformed)?;
            if h.numres == 0 {
                return Err(CbError::Status(h.status));
            }
            let op = d.u32().map_err(|_| CbError::Malformed)?;
            let st = Nfsstat4::decode(&mut d).map_err(|_| CbError::Malformed)?;
            if op != cb_op::SEQUENCE {
                return Err(CbError::Malformed);
            }
            if st != crate::nfs4::consts::status::OK {
                // The client does not take calls on this session's back
                // channel (wrong session, slot or sequence): a fault.
                return Err(CbError::Sequence(st));
            }
            CbSequenceResOk::decode(&mut d).map_err(|_| CbError::Malformed)?;
            if h.status != crate::nfs4::consts::status::OK {
                return Err(CbError::Status(h.status));
            }
            Ok(d.rest().to_vec())
        });
    if let Err(CbError::Status(_)) = &r {
        // The client answered: the path works, the op did not.
        set_state::<()>(session, &Ok(()));
    } else {
        set_state(session, &r);
    }
    r
}

/// The first of a client's sessions whose back channel can carry a call.
fn working(sessions: &[Arc<Session>]) -> Option<&Arc<Session>> {
    sessions.iter().find(|s| {
        s.back_channel()
            .as_ref()
            .is_some_and(|b| b.wanted && b.usable())
    })
}

/// What the holder of a write delegation says of its file (CB_GETATTR):
/// its change attribute and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderAttrs {
    /// The change attribute.
    pub change: u64,
    /// The size.
    pub size: u64,
}

/// Asks the holder of a write delegation (over a working back channel of
/// one of `sessions`) for the change attribute and size of the file `fh`
/// with CB_GETATTR (RFC 8881 section 20.1), and waits for the answer.
pub fn getattr(
    sessions: &[Arc<Session>],
    fh: &[u8],
    metrics: &Arc<Metrics>,
) -> Result<HolderAttrs, CbError> {
    use crate::nfs4::consts::attr;
    let started = Instant::now();
    let result = match working(sessions) {
        Some(s) => compound(s, 1, |e| {
            e.u32(cb_op::GETATTR);
            CbGetattrArgs {
                fh: NfsFh4(fh.to_vec()),
                attr_request: Bitmap4(vec![(1 << attr::CHANGE) | (1 << attr::SIZE)]),
            }
            .encode(e);
        })
        .and_then(|body| {
            let mut d = Decoder::new(&body);
            let op = d.u32().map_err(|_| CbError::Malformed)?;
            let st = Nfsstat4::decode(&mut d).map_err(|_| CbError::Malformed)?;
            if op != cb_op::GETATTR {
                return Err(CbError::Malformed);
            }
            if st != crate::nfs4::consts::status::OK {
                return Err(CbError::Status(st));
            }
            let res = CbGetattrResOk::decode(&mut d).map_err(|_| CbError::Malformed)?;
            let mask = &res.obj_attributes.mask.0;
            let has = |bit: u32| mask.first().is_some_and(|w| w & (1 << bit) != 0);
            let before = mask
                .first()
                .is_some_and(|w| w & ((1 << attr::CHANGE) - 1) != 0);
            if !has(attr::CHANGE) || !has(attr::SIZE) || before {
                return Err(CbError::Malformed);
            }
            // Values in attribute order: change (3) before size (4), and
            // nothing before them was asked for.
            let mut v = Decoder::new(&res.obj_attributes.vals);
            let change = v.u64().map_err(|_| CbError::Malformed)?;
            let size = v.u64().map_err(|_| CbError::Malformed)?;
            Ok(HolderAttrs { change, size })
        }),
        None => Err(CbError::NoConnection),
    };
    metrics.callback(result.is_ok(), started.elapsed());
    result
}

/// Sends CB_RECALL for each of `recalls` over a working back channel of
/// the holder (one of `sessions_of(holder)`), each on a thread of its own.
/// A recall that cannot be sent or is refused is left to the lease: the
/// delegation is revoked when it has not come back a lease after the
/// recall.
pub fn start_recalls(
    recalls: Vec<Recall>,
    sessions_of: impl Fn(u64) -> Vec<Arc<Session>>,
    metrics: &Arc<Metrics>,
) {
    for r in recalls {
        let sessions = sessions_of(r.clientid);
        let metrics = metrics.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-recall".into())
            .spawn(move || {
                // The server's identity, whatever the starter's.
                crate::engine::cred::reclaim();
                let started = Instant::now();
                let result = match working(&sessions) {
                    Some(s) => compound(s, 1, |e| {
                        e.u32(cb_op::RECALL);
                        CbRecallArgs {
                            stateid: r.stateid,
                            truncate: false,
                            fh: NfsFh4(r.fh.clone()),
                        }
                        .encode(e);
                    })
                    .map(drop),
                    None => Err(CbError::NoConnection),
                };
                metrics.callback(result.is_ok(), started.elapsed());
                if let Err(e) = result {
                    tracing::info!(
                        clientid = format!("{:#x}", r.clientid),
                        error = %e,
                        "delegation recall not delivered; revoked a lease after the recall unless returned"
                    );
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a recall thread");
        }
    }
}

/// Tells the client (over a working back channel of one of `sessions`)
/// that its asynchronous copy `stateid` into the file `fh` ended, and how
/// (CB_OFFLOAD, RFC 7862 section 16.1). A client that answers
/// NFS4ERR_DELAY is asked again, a few times.
pub fn offload(
    sessions: &[Arc<Session>],
    fh: &[u8],
    stateid: Stateid4,
    info: OffloadInfo4,
    metrics: &Arc<Metrics>,
) -> Result<(), CbError> {
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    loop {
        let started = Instant::now();
        let result = match working(sessions) {
            Some(s) => compound(s, 1, |e| {
                e.u32(cb_op::OFFLOAD);
                CbOffloadArgs {
                    fh: NfsFh4(fh.to_vec()),
                    stateid,
                    info,
                }
                .encode(e);
            })
            .map(drop),
            None => Err(CbError::NoConnection),
        };
        metrics.callback(result.is_ok(), started.elapsed());
        tries += 1;
        match result {
            Err(CbError::Status(st)) if st == crate::nfs4::consts::status::DELAY && tries < 8 => {
                std::thread::sleep(pause);
                pause *= 2;
            }
            r => return r,
        }
    }
}
