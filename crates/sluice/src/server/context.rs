//! What an op handler works with: the COMPOUND's context ([`Ctx`]: the
//! caller, current and saved filehandles and stateids), its outcome type,
//! and whether it may wait ([`must_not_wait`]).

use super::callback::{CbConn, CbState};
use super::exports::{Exported, Loc};
use super::state::{Session, Stateid};
use super::Server;
use crate::engine::cred::Identity;
use crate::engine::fs::Stat;
use crate::engine::handle::HandleError;
use crate::nfs4::consts::{op, status};
use crate::nfs4::Nfsstat4;
use crate::rpc::Cred;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A current or saved filehandle: its wire form and an open descriptor.
#[derive(Debug, Clone)]
pub(super) struct Fh {
    /// The handle as the client sees it.
    pub wire: Vec<u8>,
    /// O_PATH descriptor of the object (a placeholder for pseudo
    /// directories).
    pub fd: Arc<OwnedFd>,
    /// The export it belongs to, or the pseudo directory it is.
    pub loc: Loc,
}

/// State of one COMPOUND while its ops run.
pub(super) struct Ctx<'a> {
    /// The server.
    pub srv: &'a Server,
    /// The caller's credentials as sent.
    pub cred: &'a Cred,
    /// The caller's address (None for in-process callers).
    pub peer: Option<IpAddr>,
    /// The connection the call came over, when it can carry callbacks.
    pub conn: Option<&'a Arc<CbConn>>,
    /// The COMPOUND's minor version (1 or 2).
    pub minor: u32,
    /// Caller identity on the file system, after the squashing of the
    /// current filehandle's export.
    pub id: Identity,
    /// Current filehandle.
    pub cur: Option<Fh>,
    /// Saved filehandle.
    pub saved: Option<Fh>,
    /// The session the COMPOUND runs in.
    pub session: Option<&'a Arc<Session>>,
    /// Stateid produced by the last op that made one.
    pub cur_sid: Option<Stateid>,
    /// The current stateid saved with the filehandle by SAVEFH.
    pub saved_sid: Option<Stateid>,
    /// A status of the current filehandle's object that an op before
    /// read (PUTFH, LOOKUP, OPEN), with the descriptor it was read through:
    /// GETATTR answers from it when nothing ran in between that could
    /// change the object (see [`Ctx::keep_stat_after`]).
    pub cur_stat: Option<(Arc<OwnedFd>, Stat)>,
    /// Like `cur_stat`, a status of the current filehandle's object, but
    /// only its type, mode, inode number, links and device (PUTFH's check
    /// before a WRITE, see `fs::identity`).
    pub cur_identity: Option<(Arc<OwnedFd>, Stat)>,
    /// Whether READs may lend file data from a mapping of the file
    /// (`sluice_engine::mapped`): not when the reply will be copied by the
    /// server itself (an NFSv4.1 reply the client asked to cache).
    pub lend: bool,
    /// Where the COMPOUND runs on the connection's task: the directory
    /// syncs of a `sync` export that its ops leave for it to wait for
    /// before the next op runs and before it is answered (see
    /// `ops_fs::commit_dir`). None where the ops sync themselves.
    pub deferred: Option<std::cell::RefCell<Vec<super::dirsync::Pending>>>,
}

impl<'a> Ctx<'a> {
    /// The current filehandle or NFS4ERR_NOFILEHANDLE.
    pub(super) fn cur(&self) -> Result<&Fh, Nfsstat4> {
        self.cur.as_ref().ok_or(status::NOFILEHANDLE)
    }

    /// The status PUTFH, LOOKUP or OPEN read of the current filehandle's
    /// object, when it is still the current one and nothing has run since
    /// that could have changed it.
    pub(super) fn cur_stat(&self) -> Option<Stat> {
        let (fd, st) = self.cur_stat.as_ref()?;
        let cur = self.cur.as_ref()?;
        Arc::ptr_eq(fd, &cur.fd).then_some(*st)
    }

    /// The type, mode, inode number, links and device of the current
    /// filehandle's object, from a status kept as [`Ctx::cur_stat`] is,
    /// full or not.
    pub(super) fn cur_identity(&self) -> Option<Stat> {
        let cur = self.cur.as_ref()?;
        [&self.cur_identity, &self.cur_stat]
            .into_iter()
            .flatten()
            .find(|(fd, _)| Arc::ptr_eq(fd, &cur.fd))
            .map(|(_, st)| *st)
    }

    /// Forgets the status kept for the current filehandle unless op
    /// `opnum`, just run, is one that keeps it: PUTFH, LOOKUP and OPEN,
    /// which may have read it last, and GETFH, GETATTR, ACCESS and SAVEFH,
    /// which change nothing. Any other op might change the object or the
    /// current filehandle. (A status kept from before a PUTFH that read
    /// none is of the object only if PUTFH put the same descriptor back,
    /// and nothing that changes things ran since.)
    pub(super) fn keep_stat_after(&mut self, opnum: u32) {
        if !matches!(
            opnum,
            op::PUTFH | op::LOOKUP | op::OPEN | op::GETFH | op::GETATTR | op::ACCESS | op::SAVEFH
        ) {
            self.cur_stat = None;
            self.cur_identity = None;
        }
    }

    /// The saved filehandle or NFS4ERR_NOFILEHANDLE.
    pub(super) fn saved(&self) -> Result<&Fh, Nfsstat4> {
        self.saved.as_ref().ok_or(status::NOFILEHANDLE)
    }

    /// Resolves a wire handle; handles of exports that do not admit the
    /// caller's address get NFS4ERR_ACCESS. With `full`, also a full
    /// status of the object when the check of the handle read one (see
    /// `Export::resolve_with`).
    pub(super) fn resolve_with(
        &self,
        wire: &[u8],
        full: bool,
    ) -> Result<(Fh, Option<Stat>), Nfsstat4> {
        // No identity switch here: the export opens a handle as root
        // itself, and only when its cache does not have the descriptor
        // (two credential changes fewer per request for a client that
        // does not work as root).
        let (fd, loc, st) = match self.srv.exports.resolve_with(wire, full) {
            Ok(r) => r,
            Err(HandleError::Bad) => return Err(status::BADHANDLE),
            // A file whose last name went (REMOVE, or a RENAME over it)
            // while a client has it open stays reachable by its handle
            // until closed, as on the Linux server: CLOSE, and I/O through
            // the open, must still work.
            Err(HandleError::Stale) => self
                .srv
                .exports
                .resolve_unlinked(wire, |st| {
                    self.srv.state.file_is_open(super::ops_file::file_key(st))
                })
                .map(|(fd, loc)| (fd, loc, None))
                .ok_or(status::STALE)?,
        };
        if let Loc::Export(i) = loc {
            if !self.srv.exports.list()[i].rules.admits(self.peer) {
                return Err(status::ACCESS);
            }
        }
        let fh = Fh {
            wire: wire.to_vec(),
            fd,
            loc,
        };
        Ok((fh, st))
    }

    /// The export `fh` belongs to.
    pub(super) fn ex(&self, fh: &Fh) -> &'a Exported {
        self.srv.exports.get(fh.loc)
    }

    /// The export of the current filehandle (the first export when there
    /// is none).
    pub(super) fn cur_ex(&self) -> &'a Exported {
        self.srv
            .exports
            .get(self.cur.as_ref().map_or(Loc::Export(0), |f| f.loc))
    }

    /// Substitutes the current stateid for the special "current" value.
    pub(super) fn stateid(&self, sid: Stateid) -> Result<Stateid, Nfsstat4> {
        if sid == Stateid::CURRENT {
            self.cur_sid.ok_or(status::BAD_STATEID)
        } else {
            Ok(sid)
        }
    }

    /// Whether the session's back channel is bound and answered its last
    /// call (what delegations and asynchronous copies need).
    pub(super) fn back_channel_up(&self) -> bool {
        self.session.is_some_and(|s| {
            s.back_channel()
                .as_ref()
                .is_some_and(|b| b.wanted && b.usable() && b.state == CbState::Up)
        })
    }

    /// The client id of the session or NFS4ERR_OP_NOT_IN_SESSION.
    pub(super) fn clientid(&self) -> Result<u64, Nfsstat4> {
        self.session
            .map(|s| s.clientid)
            .ok_or(status::OP_NOT_IN_SESSION)
    }
}

/// What became of an op: the handler has written its result body (if
/// any) after the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It ran, or was refused, with this status.
    Done(Nfsstat4),
    /// Under [`must_not_wait`] it would have to wait: it has changed
    /// nothing (its arguments are decoded again later), and the COMPOUND
    /// goes on from it on a worker thread. Never sent.
    WouldBlock,
}

impl From<Nfsstat4> for Outcome {
    fn from(st: Nfsstat4) -> Self {
        Outcome::Done(st)
    }
}

/// The status of an op that cannot have to wait; the handler has written
/// its result body (if any).
pub(super) type OpStatus = Nfsstat4;

/// Why an op that may wait stopped short of its result: a status, or
/// having to wait where it must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The op fails with this status.
    Status(Nfsstat4),
    /// See [`Outcome::WouldBlock`].
    WouldBlock,
}

impl From<Nfsstat4> for Stop {
    fn from(st: Nfsstat4) -> Self {
        Stop::Status(st)
    }
}

thread_local! {
    static MUST_NOT_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True while the COMPOUND runs on a thread that must not wait (the
/// connection's network task): ops that would have to wait for the disk
/// or for a range lock answer [`Outcome::WouldBlock`] instead.
pub(super) fn must_not_wait() -> bool {
    MUST_NOT_WAIT.with(|c| c.get())
}

/// Sets [`must_not_wait`] for the calling thread until dropped.
pub(super) struct NoWaitGuard;

impl NoWaitGuard {
    pub(super) fn new() -> Self {
        MUST_NOT_WAIT.with(|c| c.set(true));
        NoWaitGuard
    }
}

impl Drop for NoWaitGuard {
    fn drop(&mut self) {
        MUST_NOT_WAIT.with(|c| c.set(false));
    }
}

/// Clears [`must_not_wait`] for the calling thread until dropped: for a
/// quick op run on the connection's task as a worker would run it.
pub(super) struct MayWaitGuard(bool);

impl MayWaitGuard {
    pub(super) fn new() -> Self {
        MayWaitGuard(MUST_NOT_WAIT.with(|c| c.replace(false)))
    }
}

impl Drop for MayWaitGuard {
    fn drop(&mut self) {
        MUST_NOT_WAIT.with(|c| c.set(self.0));
    }
}
