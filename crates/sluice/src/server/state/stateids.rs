//! Open and lock stateids (RFC 8881 sections 8.2, 9), share reservations
//! and byte-range locks, indexed by owner and by file so that OPEN, LOCK,
//! CLOSE and expiry cost what the owner or file holds, not what the
//! server holds.

use super::{FileKey, Inner, Other, StateTable, Stateid};
use crate::engine::fs;
use crate::nfs4::consts::{status, LENGTH_TO_EOF};
use crate::nfs4::Nfsstat4;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

/// An open of a file by an open-owner.
#[derive(Debug)]
pub(super) struct OpenState {
    /// Owning client.
    pub clientid: u64,
    /// Open-owner bytes.
    pub owner: Vec<u8>,
    /// The file.
    pub file: FileKey,
    /// The wire handle the file was first opened by: ops that act on
    /// the open (or its locks) must name it (see [`StateTable::other_file`]).
    pub fh: Vec<u8>,
    /// Current stateid sequence.
    pub seqid: u32,
    /// OPEN4_SHARE_ACCESS bits held.
    pub access: u32,
    /// OPEN4_SHARE_DENY bits held.
    pub deny: u32,
    /// The (access, deny) pairs of the OPENs in effect (at most 12
    /// different ones): what OPEN_DOWNGRADE may go back to.
    pub opens: Vec<(u32, u32)>,
    /// Descriptor opened with the access mode.
    pub fd: Arc<OwnedFd>,
}

impl OpenState {
    /// Whether OPEN_DOWNGRADE may set (`access`, `deny`): RFC 8881
    /// section 18.18.3 asks that they be exactly the union of the bits of
    /// some of the OPENs in effect. The OPENs whose bits all lie within
    /// them are the largest such set, so the union of theirs must be
    /// them.
    fn may_downgrade_to(&self, access: u32, deny: u32) -> bool {
        let (mut a, mut d) = (0, 0);
        for &(oa, od) in &self.opens {
            if oa & !access == 0 && od & !deny == 0 {
                a |= oa;
                d |= od;
            }
        }
        (a, d) == (access, deny)
    }

    /// Notes an OPEN's (access, deny) as in effect.
    fn add_open(&mut self, access: u32, deny: u32) {
        if !self.opens.contains(&(access, deny)) {
            self.opens.push((access, deny));
        }
    }
}

/// A lock-owner's state on one file, derived from an open.
#[derive(Debug)]
pub(super) struct LockState {
    /// Owning client.
    pub clientid: u64,
    /// Lock-owner bytes.
    pub owner: Vec<u8>,
    /// The open this lock state came from.
    pub open: Other,
    /// The file.
    pub file: FileKey,
    /// Current stateid sequence.
    pub seqid: u32,
    /// With shared locks (a cluster node): this owner's own descriptor of
    /// the file, holding its ranges as OFD locks on the file system, so
    /// that other nodes see them. Closed, and the locks with it, when the
    /// lock state goes.
    pub shared: Option<OwnedFd>,
}

#[derive(Debug)]
enum StateEntry {
    Open(OpenState),
    Lock(LockState),
}

/// One held byte-range lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRange {
    /// Lock stateid `other` of the holder.
    pub holder: Other,
    /// Owning client.
    pub clientid: u64,
    /// Lock-owner bytes.
    pub owner: Vec<u8>,
    /// First byte.
    pub start: u64,
    /// One past the last byte (u64::MAX = to end of file).
    pub end: u64,
    /// Exclusive (write) lock.
    pub write: bool,
}

/// The conflicting lock reported with NFS4ERR_DENIED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Offset of the conflicting lock.
    pub offset: u64,
    /// Length of the conflicting lock.
    pub length: u64,
    /// True for a write lock.
    pub write: bool,
    /// Its owner's client.
    pub clientid: u64,
    /// Its owner.
    pub owner: Vec<u8>,
}

/// Turns an (offset, length) pair into a half-open range, checking it.
pub fn lock_range(offset: u64, length: u64) -> Result<(u64, u64), Nfsstat4> {
    if length == 0 {
        return Err(status::INVAL);
    }
    if length == LENGTH_TO_EOF {
        return Ok((offset, u64::MAX));
    }
    let end = offset.checked_add(length).ok_or(status::INVAL)?;
    Ok((offset, end))
}

fn range_length(start: u64, end: u64) -> u64 {
    if end == u64::MAX {
        LENGTH_TO_EOF
    } else {
        end - start
    }
}

/// Attributes of a new open, from OPEN's arguments.
#[derive(Debug)]
pub struct OpenRequest {
    /// Client id of the open-owner.
    pub clientid: u64,
    /// Open-owner bytes.
    pub owner: Vec<u8>,
    /// The file.
    pub file: FileKey,
    /// The file's wire handle.
    pub fh: Vec<u8>,
    /// Requested share access (1 read, 2 write, 3 both).
    pub access: u32,
    /// Requested share deny.
    pub deny: u32,
    /// CLAIM_PREVIOUS: the client reclaims an open it held before the
    /// server restarted.
    pub reclaim: bool,
}

/// (client, owner, file): one owner's state on one file.
type OwnerKey = (u64, Vec<u8>, FileKey);

/// The stateid tables and their indexes.
#[derive(Debug, Default)]
pub(super) struct Stateids {
    states: HashMap<Other, StateEntry>,
    /// The open of each open-owner on each file.
    opens_by_owner: HashMap<OwnerKey, Other>,
    /// The lock state of each lock-owner on each file.
    locks_by_owner: HashMap<OwnerKey, Other>,
    /// The opens of each file.
    opens_by_file: HashMap<FileKey, HashSet<Other>>,
    /// The lock states derived from each open.
    locks_by_open: HashMap<Other, HashSet<Other>>,
    /// Every state of each client.
    by_client: HashMap<u64, HashSet<Other>>,
    /// The byte ranges locked in each file.
    ranges: HashMap<FileKey, Vec<LockRange>>,
}

impl Stateids {
    pub(super) fn open_count(&self) -> usize {
        self.opens_by_owner.len()
    }

    pub(super) fn lock_owner_count(&self) -> usize {
        self.locks_by_owner.len()
    }

    pub(super) fn range_count(&self) -> usize {
        self.ranges.values().map(Vec::len).sum()
    }

    /// True when the client holds lock states.
    pub(super) fn client_has_locks(&self, id: u64) -> bool {
        self.by_client.get(&id).is_some_and(|s| {
            s.iter()
                .any(|o| matches!(self.states.get(o), Some(StateEntry::Lock(_))))
        })
    }

    /// True when the client holds opens or lock states.
    pub(super) fn client_has_state(&self, id: u64) -> bool {
        self.by_client.get(&id).is_some_and(|s| !s.is_empty())
    }

    /// Forgets every state of a client.
    pub(super) fn remove_client(&mut self, id: u64) {
        let Some(all) = self.by_client.remove(&id) else {
            return;
        };
        for other in all {
            self.remove(&other);
        }
    }

    fn insert(&mut self, other: Other, entry: StateEntry) {
        let (clientid, owner, file) = match &entry {
            StateEntry::Open(o) => (o.clientid, o.owner.clone(), o.file),
            StateEntry::Lock(l) => (l.clientid, l.owner.clone(), l.file),
        };
        match &entry {
            StateEntry::Open(_) => {
                self.opens_by_owner.insert((clientid, owner, file), other);
                self.opens_by_file.entry(file).or_default().insert(other);
            }
            StateEntry::Lock(l) => {
                self.locks_by_owner.insert((clientid, owner, file), other);
                self.locks_by_open.entry(l.open).or_default().insert(other);
            }
        }
        self.by_client.entry(clientid).or_default().insert(other);
        self.states.insert(other, entry);
    }

    /// Removes a state and everything derived from it: an open's lock
    /// states, a lock state's ranges.
    fn remove(&mut self, other: &Other) {
        let Some(entry) = self.states.remove(other) else {
            return;
        };
        let clientid = match entry {
            StateEntry::Open(o) => {
                for l in self.locks_by_open.remove(other).unwrap_or_default() {
                    self.remove(&l);
                }
                self.opens_by_owner.remove(&(o.clientid, o.owner, o.file));
                if let Some(s) = self.opens_by_file.get_mut(&o.file) {
                    s.remove(other);
                    if s.is_empty() {
                        self.opens_by_file.remove(&o.file);
                    }
                }
                o.clientid
            }
            StateEntry::Lock(l) => {
                if let Some(r) = self.ranges.get_mut(&l.file) {
                    r.retain(|x| &x.holder != other);
                    if r.is_empty() {
                        self.ranges.remove(&l.file);
                    }
                }
                if let Some(s) = self.locks_by_open.get_mut(&l.open) {
                    s.remove(other);
                    if s.is_empty() {
                        self.locks_by_open.remove(&l.open);
                    }
                }
                self.locks_by_owner.remove(&(l.clientid, l.owner, l.file));
                l.clientid
            }
        };
        if let Some(s) = self.by_client.get_mut(&clientid) {
            s.remove(other);
        }
    }

    /// Clients other than `clientid` whose opens of `file` conflict with
    /// the share access and deny asked for.
    fn share_conflicts(
        &self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        for other in self.opens_by_file.get(&file).into_iter().flatten() {
            if let Some(StateEntry::Open(o)) = self.states.get(other) {
                if o.clientid == clientid && o.owner == owner {
                    continue;
                }
                if o.deny & access != 0 || o.access & deny != 0 {
                    out.push(o.clientid);
                }
            }
        }
        out
    }

    /// The opens of `file`.
    fn opens_of(&self, file: FileKey) -> impl Iterator<Item = &OpenState> {
        self.opens_by_file
            .get(&file)
            .into_iter()
            .flatten()
            .filter_map(|other| match self.states.get(other) {
                Some(StateEntry::Open(o)) => Some(o),
                _ => None,
            })
    }

    /// Whether a client other than `clientid` has `file` open at all.
    pub(super) fn file_has_open_other_than(&self, file: FileKey, clientid: u64) -> bool {
        self.opens_of(file).any(|o| o.clientid != clientid)
    }

    /// An open descriptor of `file`, from any client's open.
    pub(super) fn any_fd(&self, file: FileKey) -> Option<Arc<OwnedFd>> {
        self.opens_of(file).next().map(|o| o.fd.clone())
    }

    /// Whether a client other than `clientid` has `file` open for writing.
    pub(super) fn file_has_writer_other_than(&self, file: FileKey, clientid: u64) -> bool {
        self.opens_of(file)
            .any(|o| o.clientid != clientid && o.access & 2 != 0)
    }

    /// Locks of other owners that conflict with [start, end).
    pub(super) fn lock_conflicts<'a>(
        &'a self,
        clientid: u64,
        owner: &'a [u8],
        file: FileKey,
        (start, end): (u64, u64),
        write: bool,
    ) -> impl Iterator<Item = &'a LockRange> + 'a {
        self.ranges
            .get(&file)
            .into_iter()
            .flatten()
            .filter(move |r| {
                !(r.clientid == clientid && r.owner == owner)
                    && r.start < end
                    && start < r.end
                    && (write || r.write)
            })
    }

    /// Adds a held range.
    pub(super) fn push_range(&mut self, file: FileKey, r: LockRange) {
        self.ranges.entry(file).or_default().push(r);
    }

    /// The ranges held on `file`.
    pub(super) fn ranges_of(&self, file: FileKey) -> &[LockRange] {
        self.ranges.get(&file).map_or(&[], Vec::as_slice)
    }

    /// Drops every range of `clientid`; returns the files it had some on.
    pub(super) fn remove_ranges_of(&mut self, clientid: u64) -> Vec<FileKey> {
        let mut files = Vec::new();
        self.ranges.retain(|file, ranges| {
            let before = ranges.len();
            ranges.retain(|r| r.clientid != clientid);
            if ranges.len() != before {
                files.push(*file);
            }
            !ranges.is_empty()
        });
        files
    }

    /// Removes [start, end) from the ranges held by `holder`, splitting.
    pub(super) fn subtract(&mut self, file: FileKey, holder: &Other, start: u64, end: u64) {
        let Some(ranges) = self.ranges.get_mut(&file) else {
            return;
        };
        let mut out = Vec::with_capacity(ranges.len() + 1);
        for r in ranges.drain(..) {
            if &r.holder != holder || r.end <= start || end <= r.start {
                out.push(r);
                continue;
            }
            if r.start < start {
                out.push(LockRange {
                    end: start,
                    ..r.clone()
                });
            }
            if end < r.end {
                out.push(LockRange { start: end, ..r });
            }
        }
        *ranges = out;
    }
}

/// The conflict of a lock held through another node (or a local process):
/// its owner is not known here.
fn remote_denied(start: u64, end: u64, write: bool) -> Denied {
    Denied {
        offset: start,
        length: range_length(start, end),
        write,
        clientid: 0,
        owner: b"another node".to_vec(),
    }
}

pub(super) fn denied(r: &LockRange) -> Denied {
    Denied {
        offset: r.start,
        length: range_length(r.start, r.end),
        write: r.write,
        clientid: r.clientid,
        owner: r.owner.clone(),
    }
}

pub(super) fn check_seqid(held: u32, given: u32) -> Result<(), Nfsstat4> {
    if given == 0 || given == held {
        Ok(())
    } else if given < held {
        Err(status::OLD_STATEID)
    } else {
        Err(status::BAD_STATEID)
    }
}

impl StateTable {
    /// Resolves a conflict with the state of `holders`: clients whose
    /// lease ran out (courtesy clients) are expired so the request can go
    /// on; any live holder means the request is refused (false).
    pub(super) fn clear_conflicts(
        &self,
        inner: &mut Inner,
        holders: Vec<u64>,
        now: Instant,
    ) -> bool {
        if holders.is_empty() {
            return true;
        }
        if holders.iter().any(|id| !self.expirable(inner, *id, now)) {
            return false;
        }
        for id in holders {
            self.expire_client(
                inner,
                id,
                "its state conflicts with another client's request",
            );
        }
        true
    }

    /// OPEN: adds or upgrades the open of `req.owner` on the file. `open_fd`
    /// is called with the access wanted when a new descriptor is needed,
    /// without the table's lock held (opening may wait for the disk); the
    /// checks are then made again. During grace only reclaims are allowed
    /// (NFS4ERR_GRACE), and only from clients known from before the
    /// restart.
    pub fn open(
        &self,
        req: OpenRequest,
        open_fd: impl Fn(u32) -> Result<Arc<OwnedFd>, Nfsstat4>,
    ) -> Result<Stateid, Nfsstat4> {
        let key = (req.clientid, req.owner.clone(), req.file);
        let mut opened: Option<(u32, Arc<OwnedFd>)> = None;
        // Another request of the same owner may change the open while the
        // descriptor is opened; a few rounds settle it.
        for _ in 0..4 {
            let mut inner = self.lock();
            let now = Instant::now();
            self.check_grace(&inner, req.clientid, req.reclaim)?;
            let holders =
                inner
                    .ids
                    .share_conflicts(req.clientid, &req.owner, req.file, req.access, req.deny);
            if !self.clear_conflicts(&mut inner, holders, now) {
                return Err(status::SHARE_DENIED);
            }
            let existing = inner.ids.opens_by_owner.get(&key).copied();
            let held = match existing.and_then(|o| inner.ids.states.get(&o)) {
                Some(StateEntry::Open(o)) => Some(o.access),
                Some(StateEntry::Lock(_)) => return Err(status::SERVERFAULT),
                None => None,
            };
            let want = held.unwrap_or(0) | req.access;
            // A descriptor with the access wanted, unless the open has it.
            let fd = if held == Some(want) {
                None
            } else {
                match opened.take() {
                    Some((access, fd)) if access == want => Some(fd),
                    _ => {
                        drop(inner);
                        opened = Some((want, open_fd(want)?));
                        continue;
                    }
                }
            };
            self.record_client(&mut inner, req.clientid)?;
            if req.reclaim {
                self.counters
                    .reclaims
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(other) = existing {
                let Some(StateEntry::Open(o)) = inner.ids.states.get_mut(&other) else {
                    return Err(status::SERVERFAULT);
                };
                if let Some(fd) = fd {
                    o.fd = fd;
                }
                o.access = want;
                o.deny |= req.deny;
                o.add_open(req.access, req.deny);
                o.seqid = o.seqid.wrapping_add(1);
                return Ok(Stateid {
                    seqid: o.seqid,
                    other,
                });
            }
            let Some(fd) = fd else {
                return Err(status::SERVERFAULT);
            };
            let other = self.new_other(&mut inner);
            let (clientid, owner, file) = key;
            inner.ids.insert(
                other,
                StateEntry::Open(OpenState {
                    clientid,
                    owner,
                    file,
                    fh: req.fh,
                    seqid: 1,
                    access: req.access,
                    deny: req.deny,
                    opens: vec![(req.access, req.deny)],
                    fd,
                }),
            );
            return Ok(Stateid { seqid: 1, other });
        }
        Err(status::DELAY)
    }

    /// True while some client has `file` open.
    pub fn file_is_open(&self, file: FileKey) -> bool {
        self.lock().ids.opens_by_file.contains_key(&file)
    }

    /// Checks that `sid` names a current open state (or with `lock`, a
    /// lock state) on `file`.
    fn check_on_file(
        &self,
        inner: &Inner,
        sid: &Stateid,
        file: FileKey,
        lock: bool,
    ) -> Result<(), Nfsstat4> {
        match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Open(o)) if !lock && o.file == file => check_seqid(o.seqid, sid.seqid),
            Some(StateEntry::Lock(l)) if lock && l.file == file => check_seqid(l.seqid, sid.seqid),
            Some(_) => Err(status::BAD_STATEID),
            None => {
                self.check_stale(sid)?;
                Err(status::BAD_STATEID)
            }
        }
    }

    /// A new stateid for state kept outside this table (an asynchronous
    /// copy): unique, and of this server instance.
    pub fn new_stateid(&self) -> Stateid {
        let mut inner = self.lock();
        Stateid {
            seqid: 1,
            other: self.new_other(&mut inner),
        }
    }

    /// NFS4ERR_STALE_STATEID for a stateid of an earlier server instance.
    pub fn check_stale(&self, sid: &Stateid) -> Result<(), Nfsstat4> {
        if sid.other[..4] != self.boot.to_be_bytes() {
            return Err(status::STALE_STATEID);
        }
        Ok(())
    }

    /// For READ/WRITE/SETATTR: the descriptor and access of an open or lock
    /// stateid on `file`.
    pub fn io_state(&self, sid: &Stateid, file: FileKey) -> Result<(Arc<OwnedFd>, u32), Nfsstat4> {
        let inner = self.lock();
        let open_other = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => {
                check_seqid(o.seqid, sid.seqid)?;
                sid.other
            }
            Some(StateEntry::Lock(l)) => {
                check_seqid(l.seqid, sid.seqid)?;
                l.open
            }
            None => {
                if let Some(r) = Self::deleg_io(&inner, sid, file) {
                    // A delegation's stateid reads; a write delegation's
                    // also writes.
                    return r;
                }
                self.check_stale(sid)?;
                return Err(status::BAD_STATEID);
            }
        };
        match inner.ids.states.get(&open_other) {
            Some(StateEntry::Open(o)) if o.file == file => Ok((o.fd.clone(), o.access)),
            _ => Err(status::BAD_STATEID),
        }
    }

    /// OPEN_DOWNGRADE: to access and deny bits that are the union of
    /// those of some of the open's OPENs (RFC 8881 section 18.18.3), or
    /// NFS4ERR_INVAL. The OPENs with bits beyond the new ones are given up.
    pub fn downgrade(&self, sid: &Stateid, access: u32, deny: u32) -> Result<Stateid, Nfsstat4> {
        let mut inner = self.lock();
        let Some(StateEntry::Open(o)) = inner.ids.states.get_mut(&sid.other) else {
            self.check_stale(sid)?;
            return Err(status::BAD_STATEID);
        };
        check_seqid(o.seqid, sid.seqid)?;
        // (Bits beyond those held are refused there too: every OPEN's
        // bits are held.)
        if access == 0 || !o.may_downgrade_to(access, deny) {
            return Err(status::INVAL);
        }
        o.access = access;
        o.deny = deny;
        // The OPENs with more than these bits are given up.
        o.opens
            .retain(|&(oa, od)| oa & !access == 0 && od & !deny == 0);
        o.seqid = o.seqid.wrapping_add(1);
        Ok(Stateid {
            seqid: o.seqid,
            other: sid.other,
        })
    }

    /// CLOSE: drops the open and the lock states derived from it.
    pub fn close(&self, sid: &Stateid) -> Result<FileKey, Nfsstat4> {
        let mut inner = self.lock();
        let file = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => {
                check_seqid(o.seqid, sid.seqid)?;
                o.file
            }
            _ => {
                self.check_stale(sid)?;
                return Err(status::BAD_STATEID);
            }
        };
        inner.ids.remove(&sid.other);
        Ok(file)
    }

    /// Whether `sid`, an open or lock stateid of this server with a
    /// current seqid, is of another file than the one wire handle `fh`
    /// names: CLOSE and OPEN_DOWNGRADE then answer NFS4ERR_BAD_STATEID,
    /// as the Linux server does (`nfs4_check_fh` compares the handles,
    /// after the stateid's own checks, which is why any other fault of
    /// the stateid is left to the op). LOCK, LOCKU, READ and WRITE check
    /// the file itself against the stateid's.
    pub fn other_file(&self, sid: &Stateid, fh: &[u8]) -> bool {
        let inner = self.lock();
        let open = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Open(o)) if check_seqid(o.seqid, sid.seqid).is_ok() => o,
            Some(StateEntry::Lock(l)) if check_seqid(l.seqid, sid.seqid).is_ok() => {
                match inner.ids.states.get(&l.open) {
                    Some(StateEntry::Open(o)) => o,
                    _ => return false,
                }
            }
            _ => return false,
        };
        open.fh != fh
    }

    /// TEST_STATEID for one stateid.
    pub fn test(&self, sid: &Stateid) -> Nfsstat4 {
        let inner = self.lock();
        let held = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => o.seqid,
            Some(StateEntry::Lock(l)) => l.seqid,
            None => return Self::deleg_test(&inner, sid).unwrap_or(status::BAD_STATEID),
        };
        check_seqid(held, sid.seqid).err().unwrap_or(status::OK)
    }

    /// FREE_STATEID (RFC 8881 section 18.38): a lock stateid that holds no
    /// locks is freed; one that does, and any open stateid, gets
    /// NFS4ERR_LOCKS_HELD.
    pub fn free(&self, sid: &Stateid) -> Result<(), Nfsstat4> {
        let mut inner = self.lock();
        let held = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Lock(l)) => {
                check_seqid(l.seqid, sid.seqid)?;
                inner
                    .ids
                    .ranges
                    .get(&l.file)
                    .is_some_and(|r| r.iter().any(|x| x.holder == sid.other))
            }
            Some(StateEntry::Open(o)) => {
                check_seqid(o.seqid, sid.seqid)?;
                true
            }
            None => {
                return self
                    .deleg_free(&mut inner, sid)
                    .unwrap_or(Err(status::BAD_STATEID))
            }
        };
        if held {
            return Err(status::LOCKS_HELD);
        }
        inner.ids.remove(&sid.other);
        Ok(())
    }

    /// Checks grace for an OPEN or a LOCK: reclaims only during grace and
    /// from clients known from before, new opens and locks only after it.
    fn check_grace(&self, inner: &Inner, clientid: u64, reclaim: bool) -> Result<(), Nfsstat4> {
        if reclaim {
            self.check_reclaim(inner, clientid)
        } else {
            self.check_new_state(inner)
        }
    }

    /// [`StateTable::check_grace`] for a LOCK: a new lock also waits for
    /// NLM hosts to reclaim theirs.
    fn check_lock_grace(
        &self,
        inner: &Inner,
        clientid: u64,
        reclaim: bool,
        now: Instant,
    ) -> Result<(), Nfsstat4> {
        if reclaim {
            self.check_reclaim(inner, clientid)
        } else {
            self.check_new_lock(inner, now)
        }
    }

    /// LOCK with a new lock-owner: creates its lock state from an open.
    #[allow(clippy::too_many_arguments)]
    pub fn lock_new_owner(
        &self,
        open: &Stateid,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
        reclaim: bool,
    ) -> Result<Result<Stateid, Denied>, Nfsstat4> {
        let mut inner = self.lock();
        let now = Instant::now();
        self.check_lock_grace(&inner, clientid, reclaim, now)?;
        self.check_on_file(&inner, open, file, false)?;
        // Reuse the lock state this owner already has on the file.
        let key = (clientid, owner.to_vec(), file);
        let mut made = false;
        let other = match inner.ids.locks_by_owner.get(&key) {
            Some(o) => *o,
            None => {
                made = true;
                // Conflicts first, so a refused lock leaves no state.
                if let Some(d) =
                    self.lock_conflict(&mut inner, clientid, owner, file, range, write, now)
                {
                    return Ok(Err(d));
                }
                let other = self.new_other(&mut inner);
                inner.ids.insert(
                    other,
                    StateEntry::Lock(LockState {
                        clientid,
                        owner: owner.to_vec(),
                        open: open.other,
                        file,
                        seqid: 0,
                        shared: None,
                    }),
                );
                other
            }
        };
        let r = self.apply_lock(&mut inner, other, range, write, reclaim, now);
        if made && !matches!(r, Ok(Ok(_))) {
            // Refused (another node holds the range): no state is left.
            inner.ids.remove(&other);
        }
        r
    }

    /// LOCK by an existing lock-owner.
    pub fn lock_existing(
        &self,
        sid: &Stateid,
        file: FileKey,
        range: (u64, u64),
        write: bool,
        reclaim: bool,
    ) -> Result<Result<Stateid, Denied>, Nfsstat4> {
        let mut inner = self.lock();
        let now = Instant::now();
        let clientid = match inner.ids.states.get(&sid.other) {
            Some(StateEntry::Lock(l)) => l.clientid,
            _ => {
                self.check_stale(sid)?;
                return Err(status::BAD_STATEID);
            }
        };
        self.check_lock_grace(&inner, clientid, reclaim, now)?;
        self.check_on_file(&inner, sid, file, true)?;
        self.apply_lock(&mut inner, sid.other, range, write, reclaim, now)
    }

    /// The lock of another owner that keeps [start, end) from `owner`,
    /// after expiring courtesy clients in the way.
    #[allow(clippy::too_many_arguments)]
    fn lock_conflict(
        &self,
        inner: &mut Inner,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
        now: Instant,
    ) -> Option<Denied> {
        let holders: Vec<u64> = inner
            .ids
            .lock_conflicts(clientid, owner, file, range, write)
            .map(|r| r.clientid)
            .collect();
        if self.clear_conflicts(inner, holders, now) {
            return None;
        }
        inner
            .ids
            .lock_conflicts(clientid, owner, file, range, write)
            .next()
            .map(denied)
    }

    fn apply_lock(
        &self,
        inner: &mut Inner,
        other: Other,
        (start, end): (u64, u64),
        write: bool,
        reclaim: bool,
        now: Instant,
    ) -> Result<Result<Stateid, Denied>, Nfsstat4> {
        let (clientid, owner, file) = match inner.ids.states.get(&other) {
            Some(StateEntry::Lock(l)) => (l.clientid, l.owner.clone(), l.file),
            _ => return Err(status::BAD_STATEID),
        };
        if let Some(d) = self.lock_conflict(inner, clientid, &owner, file, (start, end), write, now)
        {
            return Ok(Err(d));
        }
        if self.settings.shared_locks {
            if let Some(d) = self.shared_lock(inner, other, (start, end), Some(write))? {
                if reclaim {
                    // A lock a gone node still holds on the file system
                    // (its process is exiting, or the cluster file system
                    // has not evicted it yet): it goes soon, and then the
                    // reclaim can be granted.
                    return Err(status::DELAY);
                }
                return Ok(Err(d));
            }
        }
        self.record_client(inner, clientid)?;
        if reclaim {
            self.counters
                .reclaims
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        inner.ids.subtract(file, &other, start, end);
        inner.ids.ranges.entry(file).or_default().push(LockRange {
            holder: other,
            clientid,
            owner,
            start,
            end,
            write,
        });
        let Some(StateEntry::Lock(l)) = inner.ids.states.get_mut(&other) else {
            return Err(status::SERVERFAULT);
        };
        l.seqid = l.seqid.wrapping_add(1);
        Ok(Ok(Stateid {
            seqid: l.seqid,
            other,
        }))
    }

    /// Mirrors a change of lock-owner `other`'s ranges on the file system
    /// (see [`LockState::shared`]): `kind` Some(write) locks, None unlocks.
    /// A lock another node holds is reported as the conflict.
    fn shared_lock(
        &self,
        inner: &mut Inner,
        other: Other,
        (start, end): (u64, u64),
        kind: Option<bool>,
    ) -> Result<Option<Denied>, Nfsstat4> {
        let (open, has) = match inner.ids.states.get(&other) {
            Some(StateEntry::Lock(l)) => (l.open, l.shared.is_some()),
            _ => return Err(status::BAD_STATEID),
        };
        if !has {
            if kind.is_none() {
                return Ok(None);
            }
            let Some(StateEntry::Open(o)) = inner.ids.states.get(&open) else {
                return Err(status::BAD_STATEID);
            };
            let fd = o.fd.clone();
            // Its own open file description: OFD locks of one description
            // merge, as one owner's ranges do.
            let own = crate::engine::cred::as_root(|| {
                fs::reopen(fd.as_fd(), libc::O_RDWR)
                    .or_else(|_| fs::reopen(fd.as_fd(), libc::O_RDONLY))
            })
            .map_err(|e| {
                tracing::error!(error = %e, "cannot open a file to lock it on the shared file system");
                status::SERVERFAULT
            })?;
            if let Some(StateEntry::Lock(l)) = inner.ids.states.get_mut(&other) {
                l.shared = Some(own);
            }
        }
        let Some(StateEntry::Lock(l)) = inner.ids.states.get(&other) else {
            return Err(status::BAD_STATEID);
        };
        let fd = l.shared.as_ref().expect("set above").as_fd();
        match fs::ofd_lock(fd, start, end, kind) {
            Ok(()) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let (s, e, w) = fs::ofd_conflict(fd, start, end, kind.unwrap_or(true))
                    .ok()
                    .flatten()
                    .unwrap_or((start, end, true));
                Ok(Some(remote_denied(s, e, w)))
            }
            // A write lock through a file opened for reading only.
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => Err(status::OPENMODE),
            Err(e) => {
                tracing::error!(error = %e, "cannot lock a range on the shared file system");
                Err(status::SERVERFAULT)
            }
        }
    }

    /// LOCKT: the conflicting lock, if any; NFS4ERR_GRACE during grace.
    /// With shared locks, also another node's, looked for through the
    /// tester's own lock descriptor or else `probe` (a descriptor of the
    /// file the caller opened).
    pub fn test_lock(
        &self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
        probe: Option<&OwnedFd>,
    ) -> Result<Option<Denied>, Nfsstat4> {
        let inner = self.lock();
        self.check_new_lock(&inner, Instant::now())?;
        let found = inner
            .ids
            .lock_conflicts(clientid, owner, file, range, write)
            .next()
            .map(denied);
        if found.is_none() && self.settings.shared_locks {
            // Through the tester's own descriptor the file system leaves
            // out its own locks; a fresh one has none. This node's other
            // owners were looked at above.
            let own = inner
                .ids
                .locks_by_owner
                .get(&(clientid, owner.to_vec(), file))
                .and_then(|o| match inner.ids.states.get(o) {
                    Some(StateEntry::Lock(l)) => l.shared.as_ref(),
                    _ => None,
                });
            if let Some(fd) = own.or(probe) {
                if let Ok(Some((s, e, w))) = fs::ofd_conflict(fd.as_fd(), range.0, range.1, write) {
                    return Ok(Some(remote_denied(s, e, w)));
                }
            }
        }
        Ok(found)
    }

    /// LOCKU.
    pub fn unlock(
        &self,
        sid: &Stateid,
        file: FileKey,
        (start, end): (u64, u64),
    ) -> Result<Stateid, Nfsstat4> {
        let mut inner = self.lock();
        self.check_on_file(&inner, sid, file, true)?;
        if self.settings.shared_locks {
            self.shared_lock(&mut inner, sid.other, (start, end), None)?;
        }
        inner.ids.subtract(file, &sid.other, start, end);
        let Some(StateEntry::Lock(l)) = inner.ids.states.get_mut(&sid.other) else {
            return Err(status::BAD_STATEID);
        };
        l.seqid = l.seqid.wrapping_add(1);
        Ok(Stateid {
            seqid: l.seqid,
            other: sid.other,
        })
    }
}
