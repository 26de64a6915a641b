//! Delegations (RFC 8881 section 10.2): read and write delegations granted
//! on OPEN, recalled when another client (or a local process) is about to
//! change the file (or, for a write delegation, to look at it), returned
//! with DELEGRETURN, revoked when not returned within a lease. A revoked
//! delegation stays known (TEST_STATEID answers NFS4ERR_DELEG_REVOKED,
//! SEQUENCE flags it) until the client frees it.
//!
//! Nothing here waits for a client: a conflict starts the recall and the
//! request that ran into it gets NFS4ERR_DELAY, which clients retry.

use super::{FileKey, Inner, Other, StateTable, Stateid};
use crate::nfs4::consts::status;
use crate::nfs4::Nfsstat4;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// One delegation.
#[derive(Debug)]
pub(super) struct Deleg {
    clientid: u64,
    file: FileKey,
    /// The file's wire handle, for CB_RECALL.
    fh: Vec<u8>,
    seqid: u32,
    /// A write delegation (else read).
    write: bool,
    /// The file's change attribute when granted: a CB_GETATTR answer
    /// with another one means the holder changed the file.
    change: u64,
    /// The open's descriptor, for I/O with the delegation stateid.
    fd: Arc<OwnedFd>,
    /// The open's access (OPEN4_SHARE_ACCESS_*), which I/O with the
    /// delegation stateid may use.
    access: u32,
    /// When the recall was sent.
    recalled: Option<Instant>,
    /// When it is revoked if not returned.
    deadline: Option<Instant>,
    revoked: bool,
    /// A kernel lease is held on `fd` (a read lease for a read
    /// delegation, so that local writers wait; a write lease for a write
    /// delegation, so that local readers wait too).
    leased: bool,
}

impl Deleg {
    /// Gives back the kernel lease, so a local opener waits no longer.
    fn release(&mut self) {
        if std::mem::take(&mut self.leased) {
            if let Err(e) = crate::engine::fs::release_lease(self.fd.as_fd()) {
                tracing::warn!(error = %e, "cannot release a delegation's lease");
            }
        }
    }
}

/// The delegations and their indexes.
#[derive(Debug, Default)]
pub(super) struct Delegs {
    /// Revoked delegations not yet freed.
    revoked: usize,
    /// Write delegations held.
    writes: usize,
    /// When each file's delegations were last recalled: none is granted
    /// on it again for a lease, so a client that takes one back at once
    /// cannot keep a writer waiting for ever.
    recalled: HashMap<FileKey, Instant>,
    all: HashMap<Other, Deleg>,
    by_file: HashMap<FileKey, Vec<Other>>,
    by_client: HashMap<u64, Vec<Other>>,
}

impl Delegs {
    /// Delegations held (not revoked).
    pub(super) fn held(&self) -> usize {
        self.all.values().filter(|d| !d.revoked).count()
    }

    fn insert(&mut self, other: Other, d: Deleg) {
        self.writes += usize::from(d.write);
        self.by_file.entry(d.file).or_default().push(other);
        self.by_client.entry(d.clientid).or_default().push(other);
        self.all.insert(other, d);
    }

    fn remove(&mut self, other: &Other) -> Option<Deleg> {
        let mut d = self.all.remove(other)?;
        d.release();
        if d.revoked {
            self.revoked -= 1;
        } else {
            self.writes -= usize::from(d.write);
        }
        if let Some(v) = self.by_file.get_mut(&d.file) {
            v.retain(|o| o != other);
            if v.is_empty() {
                self.by_file.remove(&d.file);
            }
        }
        if let Some(v) = self.by_client.get_mut(&d.clientid) {
            v.retain(|o| o != other);
            if v.is_empty() {
                self.by_client.remove(&d.clientid);
            }
        }
        Some(d)
    }

    /// Forgets every delegation of a client.
    pub(super) fn remove_client(&mut self, id: u64) {
        for o in self.by_client.get(&id).cloned().unwrap_or_default() {
            self.remove(&o);
        }
    }

    /// Whether the client holds a delegation that is not revoked.
    pub(super) fn client_has(&self, id: u64) -> bool {
        self.by_client.get(&id).is_some_and(|v| {
            v.iter()
                .any(|o| self.all.get(o).is_some_and(|d| !d.revoked))
        })
    }

    /// Whether the client has revoked delegations it has not freed.
    pub(super) fn client_has_revoked(&self, id: u64) -> bool {
        self.by_client
            .get(&id)
            .is_some_and(|v| v.iter().any(|o| self.all.get(o).is_some_and(|d| d.revoked)))
    }
}

/// What a delegation is asked for on.
#[derive(Debug)]
pub struct DelegRequest<'a> {
    /// The client that opened.
    pub clientid: u64,
    /// The file.
    pub file: FileKey,
    /// Its wire handle, for callbacks.
    pub fh: &'a [u8],
    /// The open's descriptor.
    pub fd: Arc<OwnedFd>,
    /// The open's access (OPEN4_SHARE_ACCESS_*).
    pub access: u32,
    /// A write delegation (else read).
    pub write: bool,
    /// The file's change attribute now.
    pub change: u64,
    /// Reclaimed after a restart (OPEN CLAIM_PREVIOUS during grace).
    pub reclaim: bool,
}

/// A delegation granted.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// Its stateid.
    pub stateid: Stateid,
    /// Given back on a reclaim without the kernel lease that makes local
    /// processes wait (one has the file open): the client is asked to
    /// return it at once (the recall flag of the OPEN result).
    pub unleased: bool,
}

/// A write delegation another client holds, for CB_GETATTR.
#[derive(Debug, Clone)]
pub struct WriteHolder {
    /// The holder.
    pub clientid: u64,
    /// The file's handle.
    pub fh: Vec<u8>,
    /// The change attribute when it was granted.
    pub change: u64,
    /// A recall of it is out: the caller waits for its return.
    pub recalled: bool,
}

/// A recall to send: the holder, its delegation and the file.
#[derive(Debug, Clone)]
pub struct Recall {
    /// The client holding the delegation.
    pub clientid: u64,
    /// The delegation.
    pub stateid: Stateid,
    /// The file's handle.
    pub fh: Vec<u8>,
}

impl StateTable {
    /// Mirrors the counts every request reads without the lock.
    fn publish(&self, inner: &Inner) {
        self.revoked.store(inner.delegs.revoked, Ordering::Relaxed);
        self.delegated_files
            .store(inner.delegs.by_file.len(), Ordering::Relaxed);
        self.write_delegs
            .store(inner.delegs.writes, Ordering::Relaxed);
    }

    /// A delegation on the file of `req` for its client (RFC 8881
    /// section 10.4): a read delegation when nobody else has the file open
    /// for writing, a write delegation when nobody else has it open at
    /// all; neither while a delegation of the file is being recalled (or
    /// was in the last lease), nor when the client holds one on it
    /// already, nor during grace unless reclaimed.
    pub fn grant_deleg(&self, req: DelegRequest<'_>) -> Option<Granted> {
        let mut inner = self.lock();
        let file = req.file;
        if !req.reclaim {
            if inner.grace.active() {
                // New delegations could conflict with what is being
                // reclaimed.
                return None;
            }
            if let Some(at) = inner.delegs.recalled.get(&file) {
                if at.elapsed() < self.settings.lease {
                    return None;
                }
                inner.delegs.recalled.remove(&file);
            }
        }
        let others_open = if req.write {
            inner.ids.file_has_open_other_than(file, req.clientid)
        } else {
            inner.ids.file_has_writer_other_than(file, req.clientid)
        };
        if others_open {
            return None;
        }
        let existing = inner.delegs.by_file.get(&file).cloned().unwrap_or_default();
        for o in &existing {
            let d = &inner.delegs.all[o];
            if d.clientid == req.clientid
                || d.recalled.is_some()
                || d.revoked
                || req.write
                || d.write
            {
                return None;
            }
        }
        // With local leases, a local process that opens the file for
        // writing (for a write delegation: at all) is held back until the
        // delegation is back; one that has it open so now keeps the
        // delegation from being granted, except on a reclaim, which the
        // client is then asked to return at once.
        let mut unleased = false;
        let leased = if self.settings.local_leases {
            match crate::engine::fs::take_lease(req.fd.as_fd(), req.write) {
                Ok(()) => true,
                Err(_) if req.reclaim => {
                    unleased = true;
                    false
                }
                Err(_) => return None,
            }
        } else {
            false
        };
        let other = self.new_other(&mut inner);
        inner.delegs.insert(
            other,
            Deleg {
                clientid: req.clientid,
                file,
                fh: req.fh.to_vec(),
                seqid: 1,
                write: req.write,
                change: req.change,
                fd: req.fd,
                access: req.access,
                recalled: None,
                deadline: None,
                revoked: false,
                leased,
            },
        );
        self.publish(&inner);
        self.counters.delegs_granted.fetch_add(1, Ordering::Relaxed);
        if req.write {
            self.counters
                .write_delegs_granted
                .fetch_add(1, Ordering::Relaxed);
        }
        Some(Granted {
            stateid: Stateid { seqid: 1, other },
            unleased,
        })
    }

    /// The write delegation of a client other than `requester` on `file`,
    /// if there is one: another client's GETATTR of its size or change
    /// asks the holder with CB_GETATTR (RFC 8881 section 10.4.3).
    pub fn write_holder(&self, file: FileKey, requester: Option<u64>) -> Option<WriteHolder> {
        if self.write_delegs.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let inner = self.lock();
        inner
            .delegs
            .by_file
            .get(&file)?
            .iter()
            .map(|o| &inner.delegs.all[o])
            .find(|d| d.write && !d.revoked && Some(d.clientid) != requester)
            .map(|d| WriteHolder {
                clientid: d.clientid,
                fh: d.fh.clone(),
                change: d.change,
                recalled: d.recalled.is_some(),
            })
    }

    /// Whether `file` has any delegation (whose kernel lease an open of
    /// the file for writing would break).
    pub fn file_delegated(&self, file: FileKey) -> bool {
        if self.delegated_files.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.lock().delegs.by_file.contains_key(&file)
    }

    /// Whether any file has a delegation: when none has, a change need
    /// not look up what it changes to recall one.
    pub fn any_delegated(&self) -> bool {
        self.delegated_files.load(Ordering::Relaxed) > 0
    }

    /// Whether `file` has a write delegation whose kernel lease is held.
    pub fn write_delegated(&self, file: FileKey) -> bool {
        if self.write_delegs.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let inner = self.lock();
        inner.delegs.by_file.get(&file).is_some_and(|v| {
            v.iter()
                .any(|o| inner.delegs.all.get(o).is_some_and(|d| d.write && d.leased))
        })
    }

    /// Before the server itself opens or truncates `file` for the holder
    /// of a write delegation on it: the kernel write lease would hold the
    /// server's own open back, so it goes (local processes are no longer
    /// noticed for that delegation).
    pub fn before_own_open(&self, file: FileKey) {
        if self.write_delegs.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut inner = self.lock();
        let Some(list) = inner.delegs.by_file.get(&file).cloned() else {
            return;
        };
        for o in list {
            let d = inner.delegs.all.get_mut(&o).expect("listed");
            if d.write {
                d.release();
            }
        }
    }

    /// An open descriptor of `file` (an open's or a delegation's), to
    /// flush it without opening it again.
    pub fn any_fd(&self, file: FileKey) -> Option<Arc<OwnedFd>> {
        let inner = self.lock();
        inner.ids.any_fd(file).or_else(|| {
            inner
                .delegs
                .by_file
                .get(&file)?
                .iter()
                .find_map(|o| inner.delegs.all.get(o).map(|d| d.fd.clone()))
        })
    }

    /// Checks `file` for delegations of clients other than `requester`
    /// that an access conflicts with: every delegation conflicts with a
    /// change (`write`), a write delegation with a read too. Conflicting
    /// delegations are
    /// recalled (the recalls to send are returned) and the caller gets
    /// NFS4ERR_DELAY until they are returned or revoked; those of
    /// clients whose lease ran out are revoked at once.
    pub fn deleg_conflicts(
        &self,
        file: FileKey,
        requester: Option<u64>,
        write: bool,
    ) -> Result<(), (Nfsstat4, Vec<Recall>)> {
        if self.delegated_files.load(Ordering::Relaxed) == 0
            || (!write && self.write_delegs.load(Ordering::Relaxed) == 0)
        {
            return Ok(());
        }
        let mut inner = self.lock();
        let Some(list) = inner.delegs.by_file.get(&file).cloned() else {
            return Ok(());
        };
        let now = Instant::now();
        let mut recalls = Vec::new();
        let mut waiting = false;
        for o in list {
            let (holder, recalled, revoked, is_write) = {
                let d = &inner.delegs.all[&o];
                (d.clientid, d.recalled, d.revoked, d.write)
            };
            if revoked || (!write && !is_write) {
                continue;
            }
            if Some(holder) == requester {
                if !is_write {
                    // The holder changes its own file through the server:
                    // the kernel read lease would hold the server's own
                    // open for writing back, so it goes (local writers
                    // are no longer noticed for it). A write delegation's
                    // holder writes through the descriptor it opened.
                    inner.delegs.all.get_mut(&o).expect("listed").release();
                }
                continue;
            }
            if inner
                .clients
                .get(&holder)
                .is_none_or(|c| c.courtesy.is_some())
            {
                // The holder's lease ran out: no need to ask.
                self.revoke(&mut inner, &o);
                continue;
            }
            waiting = true;
            if recalled.is_none() {
                let d = inner.delegs.all.get_mut(&o).expect("listed");
                d.recalled = Some(now);
                d.deadline = Some(now + self.settings.lease);
                recalls.push(Recall {
                    clientid: holder,
                    stateid: Stateid {
                        seqid: d.seqid,
                        other: o,
                    },
                    fh: d.fh.clone(),
                });
            }
        }
        if !recalls.is_empty() {
            inner.delegs.recalled.insert(file, now);
        }
        if waiting {
            self.counters
                .delegs_recalled
                .fetch_add(recalls.len() as u64, Ordering::Relaxed);
            Err((status::DELAY, recalls))
        } else {
            Ok(())
        }
    }

    fn revoke(&self, inner: &mut Inner, o: &Other) {
        if let Some(d) = inner.delegs.all.get_mut(o).filter(|d| !d.revoked) {
            d.revoked = true;
            d.release();
            inner.delegs.writes -= usize::from(d.write);
            if let Some(v) = inner.delegs.by_file.get_mut(&d.file) {
                // A revoked delegation no longer holds the file.
                v.retain(|x| x != o);
                if v.is_empty() {
                    inner.delegs.by_file.remove(&d.file);
                }
            }
            inner.delegs.revoked += 1;
            self.publish(inner);
            self.counters.delegs_revoked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A local process wants the file of the delegations whose lease is on
    /// descriptor `fd`: they are recalled (the recalls to send are
    /// returned) and revoked if not back before the kernel gives up
    /// waiting (`lease_break`, less a margin) or a lease, whichever comes
    /// first, so the local writer never goes ahead while a client still
    /// caches the file.
    pub fn lease_broken(&self, fd: i32, lease_break: std::time::Duration) -> Vec<Recall> {
        let mut inner = self.lock();
        let now = Instant::now();
        let wait = self
            .settings
            .lease
            .min(lease_break.saturating_sub(std::time::Duration::from_secs(5)));
        let mut out = Vec::new();
        let mut files = Vec::new();
        for (o, d) in inner.delegs.all.iter_mut() {
            if !d.leased || d.revoked || d.fd.as_raw_fd() != fd {
                continue;
            }
            d.deadline = Some(d.deadline.map_or(now + wait, |t| t.min(now + wait)));
            if d.recalled.is_none() {
                d.recalled = Some(now);
                files.push(d.file);
                out.push(Recall {
                    clientid: d.clientid,
                    stateid: Stateid {
                        seqid: d.seqid,
                        other: *o,
                    },
                    fh: d.fh.clone(),
                });
            }
        }
        for f in files {
            inner.delegs.recalled.insert(f, now);
        }
        self.counters
            .delegs_recalled
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// Revokes delegations not returned by their deadline; how many.
    pub(super) fn revoke_unreturned(&self, inner: &mut Inner, now: Instant) -> usize {
        let lease = self.settings.lease;
        inner
            .delegs
            .recalled
            .retain(|_, at| now.saturating_duration_since(*at) < lease);
        let late: Vec<Other> = inner
            .delegs
            .all
            .iter()
            .filter(|(_, d)| !d.revoked && d.deadline.is_some_and(|t| now >= t))
            .map(|(o, _)| *o)
            .collect();
        for o in &late {
            tracing::info!(
                clientid = format!("{:#x}", inner.delegs.all[o].clientid),
                "delegation not returned within a lease of its recall: revoked"
            );
            self.revoke(inner, o);
        }
        late.len()
    }

    /// DELEGRETURN.
    pub fn delegreturn(&self, sid: &Stateid, file: FileKey) -> Result<(), Nfsstat4> {
        let mut inner = self.lock();
        let Some(d) = inner.delegs.all.get(&sid.other) else {
            self.check_stale(sid)?;
            return Err(status::BAD_STATEID);
        };
        if d.file != file {
            return Err(status::BAD_STATEID);
        }
        super::stateids::check_seqid(d.seqid, sid.seqid)?;
        if d.revoked {
            return Err(status::DELEG_REVOKED);
        }
        // Counted before the kernel lease goes: a local process that
        // waited for it sees the return in the metrics once it runs.
        self.counters
            .delegs_returned
            .fetch_add(1, Ordering::Relaxed);
        inner.delegs.remove(&sid.other);
        self.publish(&inner);
        Ok(())
    }

    /// The delegation `sid` of `clientid` on `file`, for an OPEN that
    /// claims it (CLAIM_DELEG_CUR_FH, CLAIM_DELEGATE_CUR).
    pub fn check_deleg_claim(
        &self,
        sid: &Stateid,
        clientid: u64,
        file: FileKey,
    ) -> Result<(), Nfsstat4> {
        let inner = self.lock();
        match inner.delegs.all.get(&sid.other) {
            Some(d) if d.clientid == clientid && d.file == file => {
                super::stateids::check_seqid(d.seqid, sid.seqid)?;
                if d.revoked {
                    Err(status::DELEG_REVOKED)
                } else {
                    Ok(())
                }
            }
            Some(_) => Err(status::BAD_STATEID),
            None => {
                self.check_stale(sid)?;
                Err(status::BAD_STATEID)
            }
        }
    }

    /// The descriptor and access for I/O with delegation stateid `sid`
    /// on `file`: a read delegation reads, a write delegation also writes
    /// when its open could.
    pub(super) fn deleg_io(
        inner: &Inner,
        sid: &Stateid,
        file: FileKey,
    ) -> Option<Result<(Arc<OwnedFd>, u32), Nfsstat4>> {
        let d = inner.delegs.all.get(&sid.other)?;
        Some(if d.file != file {
            Err(status::BAD_STATEID)
        } else if d.revoked {
            Err(status::DELEG_REVOKED)
        } else {
            let access = if d.write { d.access } else { 1 };
            super::stateids::check_seqid(d.seqid, sid.seqid).map(|()| (d.fd.clone(), access))
        })
    }

    /// TEST_STATEID of a delegation stateid, if `sid` is one.
    pub(super) fn deleg_test(inner: &Inner, sid: &Stateid) -> Option<Nfsstat4> {
        let d = inner.delegs.all.get(&sid.other)?;
        Some(if d.revoked {
            status::DELEG_REVOKED
        } else {
            super::stateids::check_seqid(d.seqid, sid.seqid)
                .err()
                .unwrap_or(status::OK)
        })
    }

    /// FREE_STATEID of a delegation stateid, if `sid` is one: a revoked
    /// delegation is forgotten; one still held gets NFS4ERR_LOCKS_HELD.
    pub(super) fn deleg_free(
        &self,
        inner: &mut Inner,
        sid: &Stateid,
    ) -> Option<Result<(), Nfsstat4>> {
        let d = inner.delegs.all.get(&sid.other)?;
        Some(
            if let Err(e) = super::stateids::check_seqid(d.seqid, sid.seqid) {
                Err(e)
            } else if d.revoked {
                inner.delegs.remove(&sid.other);
                self.publish(inner);
                Ok(())
            } else {
                Err(status::LOCKS_HELD)
            },
        )
    }

    /// Whether `clientid` has revoked delegations it has not freed (for
    /// SEQ4_STATUS_RECALLABLE_STATE_REVOKED).
    pub fn has_revoked_delegs(&self, clientid: u64) -> bool {
        // Without a lock while no delegation is revoked (every SEQUENCE asks).
        self.revoked.load(Ordering::Relaxed) > 0 && self.lock().delegs.client_has_revoked(clientid)
    }

    /// Delegations held now.
    pub fn delegations(&self) -> usize {
        self.lock().delegs.held()
    }

    /// Write delegations held now.
    pub fn write_delegations(&self) -> usize {
        self.write_delegs.load(Ordering::Relaxed)
    }

    /// After a client's delegations went with it.
    pub(super) fn delegs_removed(&self, inner: &Inner) {
        self.publish(inner);
    }
}
