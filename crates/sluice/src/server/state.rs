//! Client, session, open and lock state (RFC 8881 sections 2.4, 2.10, 8, 9).
//!
//! All of the NFSv4 state machine lives here: client records created by
//! EXCHANGE_ID and confirmed by CREATE_SESSION, sessions with their slot
//! tables and reply cache, open and lock stateids, share reservations and
//! byte-range locks, and lease expiry. Op handlers call into it and never
//! touch the tables directly.

use crate::nfs4::consts::{status, LENGTH_TO_EOF, SESSIONID_SIZE};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A stateid: sequence number and 12 opaque bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stateid {
    /// Sequence number, bumped on every change of the state.
    pub seqid: u32,
    /// Identifies the state.
    pub other: [u8; 12],
}

impl Stateid {
    /// The anonymous stateid (all zeros).
    pub const ANONYMOUS: Stateid = Stateid {
        seqid: 0,
        other: [0; 12],
    };
    /// The READ bypass stateid (all ones).
    pub const BYPASS: Stateid = Stateid {
        seqid: u32::MAX,
        other: [0xff; 12],
    };
    /// The "current stateid" of a COMPOUND (RFC 8881 section 16.2.3.1.2).
    pub const CURRENT: Stateid = Stateid {
        seqid: 1,
        other: [0; 12],
    };
    /// The invalid stateid returned by CLOSE.
    pub const INVALID: Stateid = Stateid {
        seqid: u32::MAX,
        other: [0; 12],
    };

    /// True for the anonymous and bypass special stateids.
    pub fn is_special_io(&self) -> bool {
        *self == Self::ANONYMOUS || *self == Self::BYPASS
    }
}

/// Identifies a file across handles: device and inode.
pub type FileKey = (u64, u64);

/// Fore-channel limits agreed at CREATE_SESSION.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelAttrs {
    /// Header padding (always 0 here).
    pub header_pad: u32,
    /// Largest request.
    pub max_request: u32,
    /// Largest response.
    pub max_response: u32,
    /// Largest response kept in the reply cache.
    pub max_response_cached: u32,
    /// Most operations in one COMPOUND.
    pub max_ops: u32,
    /// Number of slots.
    pub max_requests: u32,
}

/// A slot of a session's table.
#[derive(Debug, Default)]
struct Slot {
    seqid: u32,
    busy: bool,
    reply: Option<Arc<Vec<u8>>>,
    /// [`request_fingerprint`] of the last request, when it was given.
    request: Option<u64>,
}

/// Identifies a request on a slot, so that a retransmission can be told
/// from a false retry (RFC 8881 section 2.10.6.1.3.1: another request with
/// the same slot and sequence id): a hash of the caller's identity and of
/// the COMPOUND's operations after SEQUENCE (`ops`, `nops` of them in all):
/// their length and first [`FINGERPRINT_SAMPLE`] bytes, so a 1 MiB WRITE
/// is not hashed whole on every request. SEQUENCE's own arguments are
/// left out: a retry may change the highest slot it reports.
pub fn request_fingerprint(cred: &crate::rpc::Cred, nops: usize, ops: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let sample = &ops[..ops.len().min(FINGERPRINT_SAMPLE)];
    (
        cred.flavor,
        cred.uid,
        cred.gid,
        &cred.gids,
        nops,
        ops.len(),
        sample,
    )
        .hash(&mut h);
    h.finish()
}

/// Bytes of a request's operations that go into its fingerprint.
pub const FINGERPRINT_SAMPLE: usize = 512;

/// What SEQUENCE decided for a request.
#[derive(Debug)]
pub enum SlotDecision {
    /// New request: execute it and then call [`Session::finish`].
    Execute,
    /// Retransmission with a cached reply: send it again.
    Replay(Arc<Vec<u8>>),
    /// Retransmission whose reply was not cached.
    Uncached,
}

/// A session (RFC 8881 section 2.10).
#[derive(Debug)]
pub struct Session {
    /// Session id.
    pub id: [u8; SESSIONID_SIZE],
    /// Owning client.
    pub clientid: u64,
    /// Fore channel limits.
    pub fore: ChannelAttrs,
    /// Back channel limits, echoed back to the client.
    pub back: ChannelAttrs,
    slots: Mutex<Vec<Slot>>,
    /// Largest reply one slot keeps: what the table reserved per slot.
    slot_bytes: usize,
}

impl Session {
    /// Checks slot and sequence id of a SEQUENCE op.
    pub fn begin(&self, slot: u32, seqid: u32) -> Result<SlotDecision, u32> {
        self.begin_slot(slot, seqid, None)
    }

    /// Like [`Session::begin`] for a request with [`request_fingerprint`]
    /// `request`: a retransmission that is not the request the slot last
    /// executed is a false retry and gets NFS4ERR_SEQ_FALSE_RETRY (RFC
    /// 8881 section 2.10.6.1.3.1; a MUST when the caller differs) instead
    /// of the other request's reply.
    pub fn begin_request(&self, slot: u32, seqid: u32, request: u64) -> Result<SlotDecision, u32> {
        self.begin_slot(slot, seqid, Some(request))
    }

    fn begin_slot(&self, slot: u32, seqid: u32, request: Option<u64>) -> Result<SlotDecision, u32> {
        let mut slots = self.slots.lock().map_err(|_| status::SERVERFAULT)?;
        let s = slots.get_mut(slot as usize).ok_or(status::BADSLOT)?;
        if seqid == s.seqid.wrapping_add(1) {
            if s.busy {
                return Err(status::DELAY);
            }
            s.busy = true;
            s.seqid = seqid;
            s.reply = None;
            s.request = request;
            Ok(SlotDecision::Execute)
        } else if seqid == s.seqid {
            if s.busy {
                return Err(status::DELAY);
            }
            if let (Some(was), Some(now)) = (s.request, request) {
                if was != now {
                    return Err(status::SEQ_FALSE_RETRY);
                }
            }
            match &s.reply {
                Some(r) => Ok(SlotDecision::Replay(r.clone())),
                None => Ok(SlotDecision::Uncached),
            }
        } else {
            Err(status::SEQ_MISORDERED)
        }
    }

    /// Releases a slot after executing, keeping `reply` for retransmissions
    /// if it fits the slot's share of the reply cache.
    pub fn finish(&self, slot: u32, reply: Option<Arc<Vec<u8>>>) {
        if let Ok(mut slots) = self.slots.lock() {
            if let Some(s) = slots.get_mut(slot as usize) {
                s.busy = false;
                s.reply = reply.filter(|r| r.len() <= self.slot_bytes);
            }
        }
    }

    /// Reply cache bytes reserved for this session: slots times the
    /// largest reply a slot keeps.
    pub fn cache_bytes(&self) -> usize {
        self.fore.max_requests as usize * self.slot_bytes
    }

    /// Highest slot id.
    pub fn highest_slot(&self) -> u32 {
        self.fore.max_requests.saturating_sub(1)
    }
}

/// A client record (RFC 8881 section 2.4).
#[derive(Debug)]
struct Client {
    owner: Vec<u8>,
    verifier: [u8; 8],
    confirmed: bool,
    /// Sequence id expected by the next CREATE_SESSION.
    cs_seq: u32,
    /// The last CREATE_SESSION result, for its replay.
    cs_reply: Option<(u32, Result<Vec<u8>, u32>)>,
    last_renew: Instant,
    sessions: Vec<[u8; SESSIONID_SIZE]>,
    reclaim_complete: bool,
}

/// An open of a file by an open-owner.
#[derive(Debug)]
pub struct OpenState {
    /// Owning client.
    pub clientid: u64,
    /// Open-owner bytes.
    pub owner: Vec<u8>,
    /// The file.
    pub file: FileKey,
    /// Current stateid sequence.
    pub seqid: u32,
    /// OPEN4_SHARE_ACCESS bits held.
    pub access: u32,
    /// OPEN4_SHARE_DENY bits held.
    pub deny: u32,
    /// Descriptor opened with the access mode.
    pub fd: Arc<OwnedFd>,
}

/// A lock-owner's state on one file, derived from an open.
#[derive(Debug)]
pub struct LockState {
    /// Owning client.
    pub clientid: u64,
    /// Lock-owner bytes.
    pub owner: Vec<u8>,
    /// The open this lock state came from.
    pub open: [u8; 12],
    /// The file.
    pub file: FileKey,
    /// Current stateid sequence.
    pub seqid: u32,
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
    pub holder: [u8; 12],
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
pub fn lock_range(offset: u64, length: u64) -> Result<(u64, u64), u32> {
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

/// Results of EXCHANGE_ID.
#[derive(Debug, Clone, Copy)]
pub struct ExchangeResult {
    /// Client id.
    pub clientid: u64,
    /// Sequence id for the next CREATE_SESSION.
    pub seq: u32,
    /// The record was already confirmed.
    pub confirmed: bool,
}

/// Replies up to this size are kept in a slot even when the client did
/// not ask for caching (see `process_compound`), so a slot reserves at
/// least this much.
pub const MIN_SLOT_BYTES: usize = 4096;

/// Bounds on the state clients can make the server keep. RFC 8881 leaves
/// their values to the server; the errors are the ones it allows for each
/// op (section 15.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Client records, confirmed or not. A new one beyond this pushes out
    /// the least recently renewed unconfirmed record; when every record
    /// is confirmed, EXCHANGE_ID gets NFS4ERR_DELAY (section 15.1.1.3).
    pub clients: usize,
    /// Sessions of one client id; CREATE_SESSION beyond this gets
    /// NFS4ERR_NOSPC (section 18.36.4, session creation).
    pub sessions_per_client: usize,
    /// Slots of one session: a client asking for more gets this many
    /// (the server may lower ca_maxrequests, section 18.36.3).
    pub slots: u32,
    /// Bytes the reply caches of all sessions may hold together. Each
    /// session reserves slots x max(ca_maxresponsesize_cached,
    /// [`MIN_SLOT_BYTES`]); when the rest of the budget is smaller, the
    /// session gets fewer slots, and NFS4ERR_NOSPC when not even one fits.
    pub reply_cache: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            clients: 1024,
            sessions_per_client: 8,
            slots: 64,
            reply_cache: 64 << 20,
        }
    }
}

/// How much of the [`Limits`] is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Client records, confirmed or not.
    pub clients: usize,
    /// Sessions of all clients.
    pub sessions: usize,
    /// Reply cache bytes reserved by all sessions.
    pub reply_cache: usize,
}

/// All NFSv4 state of the server.
#[derive(Debug)]
pub struct StateTable {
    inner: Mutex<Inner>,
    lease: Duration,
    boot: u32,
    limits: Limits,
}

#[derive(Debug, Default)]
struct Inner {
    counter: u64,
    clients: HashMap<u64, Client>,
    sessions: HashMap<[u8; SESSIONID_SIZE], Arc<Session>>,
    states: HashMap<[u8; 12], StateEntry>,
    locks: HashMap<FileKey, Vec<LockRange>>,
    /// Sum of the sessions' [`Session::cache_bytes`].
    reply_cache: usize,
}

impl Inner {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn remove_session(&mut self, id: &[u8; SESSIONID_SIZE]) -> Option<Arc<Session>> {
        let s = self.sessions.remove(id)?;
        self.reply_cache -= s.cache_bytes();
        Some(s)
    }

    fn remove_client(&mut self, id: u64) {
        if let Some(c) = self.clients.remove(&id) {
            for s in c.sessions {
                self.remove_session(&s);
            }
        }
        self.states.retain(|_, s| match s {
            StateEntry::Open(o) => o.clientid != id,
            StateEntry::Lock(l) => l.clientid != id,
        });
        for ranges in self.locks.values_mut() {
            ranges.retain(|r| r.clientid != id);
        }
        self.locks.retain(|_, r| !r.is_empty());
    }

    fn client_has_state(&self, id: u64) -> bool {
        self.states.values().any(|s| match s {
            StateEntry::Open(o) => o.clientid == id,
            StateEntry::Lock(l) => l.clientid == id,
        })
    }

    fn remove_lock_state(&mut self, other: &[u8; 12]) {
        if let Some(StateEntry::Lock(l)) = self.states.remove(other) {
            if let Some(r) = self.locks.get_mut(&l.file) {
                r.retain(|x| &x.holder != other);
            }
        }
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
    /// Requested share access (1 read, 2 write, 3 both).
    pub access: u32,
    /// Requested share deny.
    pub deny: u32,
}

impl StateTable {
    /// An empty table with the default [`Limits`]; `boot` distinguishes
    /// this server instance's ids.
    pub fn new(lease: Duration, boot: u32) -> Self {
        Self::with_limits(lease, boot, Limits::default())
    }

    /// An empty table that keeps within `limits`.
    pub fn with_limits(lease: Duration, boot: u32, limits: Limits) -> Self {
        StateTable {
            inner: Mutex::new(Inner::default()),
            lease,
            boot,
            limits,
        }
    }

    /// The limits this table keeps within.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How much of the limits is in use.
    pub fn usage(&self) -> Usage {
        let inner = self.lock();
        Usage {
            clients: inner.clients.len(),
            sessions: inner.sessions.len(),
            reply_cache: inner.reply_cache,
        }
    }

    /// The lease period.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_other(&self, inner: &mut Inner) -> [u8; 12] {
        let mut o = [0u8; 12];
        o[..4].copy_from_slice(&self.boot.to_be_bytes());
        o[4..].copy_from_slice(&inner.next().to_be_bytes());
        o
    }

    /// EXCHANGE_ID (RFC 8881 section 18.35): finds or creates the record of
    /// the client `owner` with boot `verifier`. NFS4ERR_DELAY when a new
    /// record is needed and the table is full of confirmed ones.
    pub fn exchange_id(&self, owner: &[u8], verifier: [u8; 8]) -> Result<ExchangeResult, u32> {
        let mut inner = self.lock();
        // The owner has at most one confirmed and one unconfirmed record.
        let mine: Vec<(u64, [u8; 8], bool, u32)> = inner
            .clients
            .iter()
            .filter(|(_, c)| c.owner == owner)
            .map(|(id, c)| (*id, c.verifier, c.confirmed, c.cs_seq))
            .collect();
        if let Some(&(id, _, confirmed, seq)) = mine.iter().find(|r| r.1 == verifier) {
            if let Some(c) = inner.clients.get_mut(&id) {
                c.last_renew = Instant::now();
            }
            return Ok(ExchangeResult {
                clientid: id,
                seq,
                confirmed,
            });
        }
        // Another verifier: an unconfirmed record is replaced; a confirmed
        // one means the client restarted, and its old state goes when the
        // new record is confirmed. Such a new record may join the old one
        // beyond the limit, as it soon takes the old one's place.
        let mut restarted = false;
        for &(id, _, confirmed, _) in &mine {
            if confirmed {
                restarted = true;
            } else {
                inner.remove_client(id);
            }
        }
        if !restarted && inner.clients.len() >= self.limits.clients {
            // Make room by dropping the unconfirmed record renewed longest
            // ago: it has no sessions and no state, and its client, if it
            // is still there, gets NFS4ERR_STALE_CLIENTID and starts over.
            // Confirmed records stay until they expire or are destroyed.
            let oldest = inner
                .clients
                .iter()
                .filter(|(_, c)| !c.confirmed)
                .min_by_key(|(id, c)| (c.last_renew, **id))
                .map(|(id, _)| *id);
            match oldest {
                Some(old) => {
                    tracing::debug!(
                        clientid = old,
                        "client table full: dropping an unconfirmed record"
                    );
                    inner.remove_client(old);
                }
                None => {
                    tracing::debug!(
                        limit = self.limits.clients,
                        "client table full of confirmed clients: EXCHANGE_ID delayed"
                    );
                    return Err(status::DELAY);
                }
            }
        }
        let id = ((self.boot as u64) << 32) | (inner.next() & 0xffff_ffff);
        inner.clients.insert(
            id,
            Client {
                owner: owner.to_vec(),
                verifier,
                confirmed: false,
                cs_seq: 1,
                cs_reply: None,
                last_renew: Instant::now(),
                sessions: Vec::new(),
                reclaim_complete: false,
            },
        );
        Ok(ExchangeResult {
            clientid: id,
            seq: 1,
            confirmed: false,
        })
    }

    /// CREATE_SESSION (RFC 8881 section 18.36). `make_reply` encodes the
    /// result for the new session so that a replay can return it verbatim.
    /// The session gets at most [`Limits::slots`] slots, fewer when the
    /// reply cache budget is short; NFS4ERR_NOSPC when the client has
    /// [`Limits::sessions_per_client`] sessions or not one slot fits.
    pub fn create_session(
        &self,
        clientid: u64,
        seq: u32,
        mut fore: ChannelAttrs,
        back: ChannelAttrs,
        make_reply: impl FnOnce(&Session) -> Vec<u8>,
    ) -> Result<Vec<u8>, u32> {
        let mut inner = self.lock();
        let Some(c) = inner.clients.get(&clientid) else {
            return Err(status::STALE_CLIENTID);
        };
        if let Some((s, reply)) = &c.cs_reply {
            if *s == seq {
                return reply.clone();
            }
        }
        if seq != c.cs_seq {
            return Err(status::SEQ_MISORDERED);
        }
        let owner = c.owner.clone();
        let was_confirmed = c.confirmed;
        let sessions = c.sessions.len();
        // Confirming a record replaces any older record of the same owner;
        // the reply cache its sessions hold is then free for this one.
        let old: Vec<u64> = if was_confirmed {
            Vec::new()
        } else {
            inner
                .clients
                .iter()
                .filter(|(id, o)| **id != clientid && o.owner == owner)
                .map(|(id, _)| *id)
                .collect()
        };
        let freed: usize = old
            .iter()
            .filter_map(|id| inner.clients.get(id))
            .flat_map(|o| o.sessions.iter())
            .filter_map(|s| inner.sessions.get(s))
            .map(|s| s.cache_bytes())
            .sum();
        let slot_bytes = (fore.max_response_cached as usize).max(MIN_SLOT_BYTES);
        let room = (self.limits.reply_cache + freed).saturating_sub(inner.reply_cache) / slot_bytes;
        let slots = fore
            .max_requests
            .min(self.limits.slots)
            .min(u32::try_from(room).unwrap_or(u32::MAX));
        if sessions >= self.limits.sessions_per_client || slots == 0 {
            tracing::debug!(
                clientid,
                sessions,
                reply_cache = inner.reply_cache,
                "CREATE_SESSION refused: no room for another session"
            );
            // The sequence slot moves on and the error is what a replay
            // gets; the client record stays as it was.
            if let Some(c) = inner.clients.get_mut(&clientid) {
                c.cs_seq = seq.wrapping_add(1);
                c.cs_reply = Some((seq, Err(status::NOSPC)));
            }
            return Err(status::NOSPC);
        }
        for id in old {
            inner.remove_client(id);
        }
        fore.max_requests = slots;
        let mut id = [0u8; SESSIONID_SIZE];
        id[..8].copy_from_slice(&clientid.to_be_bytes());
        id[8..].copy_from_slice(&inner.next().to_be_bytes());
        let session = Arc::new(Session {
            id,
            clientid,
            fore,
            back,
            slots: Mutex::new((0..slots).map(|_| Slot::default()).collect()),
            slot_bytes,
        });
        let reply = make_reply(&session);
        inner.reply_cache += session.cache_bytes();
        inner.sessions.insert(id, session);
        let c = inner
            .clients
            .get_mut(&clientid)
            .ok_or(status::STALE_CLIENTID)?;
        c.confirmed = true;
        c.cs_seq = seq.wrapping_add(1);
        c.cs_reply = Some((seq, Ok(reply.clone())));
        c.sessions.push(id);
        c.last_renew = Instant::now();
        Ok(reply)
    }

    /// Finds a session and renews its client's lease.
    pub fn session(&self, id: &[u8; SESSIONID_SIZE]) -> Result<Arc<Session>, u32> {
        let mut inner = self.lock();
        let s = inner.sessions.get(id).cloned().ok_or(status::BADSESSION)?;
        if let Some(c) = inner.clients.get_mut(&s.clientid) {
            c.last_renew = Instant::now();
        }
        Ok(s)
    }

    /// DESTROY_SESSION.
    pub fn destroy_session(&self, id: &[u8; SESSIONID_SIZE]) -> Result<(), u32> {
        let mut inner = self.lock();
        let s = inner.remove_session(id).ok_or(status::BADSESSION)?;
        if let Some(c) = inner.clients.get_mut(&s.clientid) {
            c.sessions.retain(|x| x != id);
        }
        Ok(())
    }

    /// DESTROY_CLIENTID.
    pub fn destroy_client(&self, clientid: u64) -> Result<(), u32> {
        let mut inner = self.lock();
        let c = inner.clients.get(&clientid).ok_or(status::STALE_CLIENTID)?;
        if !c.sessions.is_empty() || inner.client_has_state(clientid) {
            return Err(status::CLIENTID_BUSY);
        }
        inner.remove_client(clientid);
        Ok(())
    }

    /// RECLAIM_COMPLETE.
    pub fn reclaim_complete(&self, clientid: u64, one_fs: bool) -> Result<(), u32> {
        let mut inner = self.lock();
        let c = inner
            .clients
            .get_mut(&clientid)
            .ok_or(status::STALE_CLIENTID)?;
        if one_fs {
            return Ok(());
        }
        if c.reclaim_complete {
            return Err(status::COMPLETE_ALREADY);
        }
        c.reclaim_complete = true;
        Ok(())
    }

    /// Frees the state of clients whose lease ran out; returns how many.
    pub fn expire(&self) -> usize {
        self.expire_at(Instant::now())
    }

    /// Frees the state of clients silent for 1.5 leases before `now`, and
    /// unconfirmed records not confirmed within a lease (RFC 8881 section
    /// 18.35.4 says they SHOULD go then).
    pub fn expire_at(&self, now: Instant) -> usize {
        let mut inner = self.lock();
        let confirmed = self.lease + self.lease / 2;
        let dead: Vec<u64> = inner
            .clients
            .iter()
            .filter(|(_, c)| {
                let limit = if c.confirmed { confirmed } else { self.lease };
                now.saturating_duration_since(c.last_renew) > limit
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            inner.remove_client(*id);
        }
        dead.len()
    }

    /// Number of client records (for tests and metrics).
    pub fn client_count(&self) -> usize {
        self.lock().clients.len()
    }

    /// OPEN: adds or upgrades the open of `req.owner` on the file. `open_fd`
    /// is called with the access wanted when a new descriptor is needed.
    pub fn open(
        &self,
        req: OpenRequest,
        open_fd: impl FnOnce(u32) -> Result<Arc<OwnedFd>, u32>,
    ) -> Result<Stateid, u32> {
        let mut inner = self.lock();
        // Share reservations of other owners.
        let mut mine: Option<[u8; 12]> = None;
        for (other, s) in &inner.states {
            if let StateEntry::Open(o) = s {
                if o.file != req.file {
                    continue;
                }
                if o.clientid == req.clientid && o.owner == req.owner {
                    mine = Some(*other);
                    continue;
                }
                if o.deny & req.access != 0 || o.access & req.deny != 0 {
                    return Err(status::SHARE_DENIED);
                }
            }
        }
        if let Some(other) = mine {
            let Some(StateEntry::Open(o)) = inner.states.get_mut(&other) else {
                return Err(status::SERVERFAULT);
            };
            let want = o.access | req.access;
            if want != o.access {
                o.fd = open_fd(want)?;
            }
            o.access = want;
            o.deny |= req.deny;
            o.seqid = o.seqid.wrapping_add(1);
            return Ok(Stateid {
                seqid: o.seqid,
                other,
            });
        }
        let fd = open_fd(req.access)?;
        let other = self.new_other(&mut inner);
        inner.states.insert(
            other,
            StateEntry::Open(OpenState {
                clientid: req.clientid,
                owner: req.owner,
                file: req.file,
                seqid: 1,
                access: req.access,
                deny: req.deny,
                fd,
            }),
        );
        Ok(Stateid { seqid: 1, other })
    }

    fn check_seqid(held: u32, given: u32) -> Result<(), u32> {
        if given == 0 || given == held {
            Ok(())
        } else if given < held {
            Err(status::OLD_STATEID)
        } else {
            Err(status::BAD_STATEID)
        }
    }

    /// Checks that `sid` names a current open state (or with `lock`, a
    /// lock state) on `file`.
    fn check_on_file(
        &self,
        inner: &Inner,
        sid: &Stateid,
        file: FileKey,
        lock: bool,
    ) -> Result<(), u32> {
        match inner.states.get(&sid.other) {
            Some(StateEntry::Open(o)) if !lock && o.file == file => {
                Self::check_seqid(o.seqid, sid.seqid)
            }
            Some(StateEntry::Lock(l)) if lock && l.file == file => {
                Self::check_seqid(l.seqid, sid.seqid)
            }
            Some(_) => Err(status::BAD_STATEID),
            None => {
                self.check_stale(sid)?;
                Err(status::BAD_STATEID)
            }
        }
    }

    fn check_stale(&self, sid: &Stateid) -> Result<(), u32> {
        if sid.other[..4] != self.boot.to_be_bytes() {
            return Err(status::STALE_STATEID);
        }
        Ok(())
    }

    /// For READ/WRITE/SETATTR: the descriptor and access of an open or lock
    /// stateid on `file`.
    pub fn io_state(&self, sid: &Stateid, file: FileKey) -> Result<(Arc<OwnedFd>, u32), u32> {
        let inner = self.lock();
        let open_other = match inner.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => {
                Self::check_seqid(o.seqid, sid.seqid)?;
                sid.other
            }
            Some(StateEntry::Lock(l)) => {
                Self::check_seqid(l.seqid, sid.seqid)?;
                l.open
            }
            None => {
                self.check_stale(sid)?;
                return Err(status::BAD_STATEID);
            }
        };
        match inner.states.get(&open_other) {
            Some(StateEntry::Open(o)) if o.file == file => Ok((o.fd.clone(), o.access)),
            Some(StateEntry::Open(_)) => Err(status::BAD_STATEID),
            _ => Err(status::BAD_STATEID),
        }
    }

    /// OPEN_DOWNGRADE.
    pub fn downgrade(&self, sid: &Stateid, access: u32, deny: u32) -> Result<Stateid, u32> {
        let mut inner = self.lock();
        let Some(StateEntry::Open(o)) = inner.states.get_mut(&sid.other) else {
            self.check_stale(sid)?;
            return Err(status::BAD_STATEID);
        };
        Self::check_seqid(o.seqid, sid.seqid)?;
        if access & !o.access != 0 || deny & !o.deny != 0 || access == 0 {
            return Err(status::INVAL);
        }
        o.access = access;
        o.deny = deny;
        o.seqid = o.seqid.wrapping_add(1);
        Ok(Stateid {
            seqid: o.seqid,
            other: sid.other,
        })
    }

    /// CLOSE: drops the open and the lock states derived from it.
    pub fn close(&self, sid: &Stateid) -> Result<(), u32> {
        let mut inner = self.lock();
        match inner.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => Self::check_seqid(o.seqid, sid.seqid)?,
            _ => {
                self.check_stale(sid)?;
                return Err(status::BAD_STATEID);
            }
        }
        let locks: Vec<[u8; 12]> = inner
            .states
            .iter()
            .filter_map(|(k, s)| match s {
                StateEntry::Lock(l) if l.open == sid.other => Some(*k),
                _ => None,
            })
            .collect();
        for l in locks {
            inner.remove_lock_state(&l);
        }
        inner.states.remove(&sid.other);
        Ok(())
    }

    /// TEST_STATEID for one stateid.
    pub fn test(&self, sid: &Stateid) -> u32 {
        let inner = self.lock();
        match inner.states.get(&sid.other) {
            Some(StateEntry::Open(o)) => Self::check_seqid(o.seqid, sid.seqid)
                .err()
                .unwrap_or(status::OK),
            Some(StateEntry::Lock(l)) => Self::check_seqid(l.seqid, sid.seqid)
                .err()
                .unwrap_or(status::OK),
            None => status::BAD_STATEID,
        }
    }

    /// FREE_STATEID.
    pub fn free(&self, sid: &Stateid) -> Result<(), u32> {
        let mut inner = self.lock();
        match inner.states.get(&sid.other) {
            Some(StateEntry::Lock(l)) => {
                let held = inner
                    .locks
                    .get(&l.file)
                    .is_some_and(|r| r.iter().any(|x| x.holder == sid.other));
                if held {
                    return Err(status::LOCKS_HELD);
                }
                inner.states.remove(&sid.other);
                Ok(())
            }
            Some(StateEntry::Open(_)) => Err(status::LOCKS_HELD),
            None => Err(status::BAD_STATEID),
        }
    }

    fn find_conflict(
        ranges: &[LockRange],
        clientid: u64,
        owner: &[u8],
        start: u64,
        end: u64,
        write: bool,
    ) -> Option<Denied> {
        ranges
            .iter()
            .find(|r| {
                !(r.clientid == clientid && r.owner == owner)
                    && r.start < end
                    && start < r.end
                    && (write || r.write)
            })
            .map(|r| Denied {
                offset: r.start,
                length: range_length(r.start, r.end),
                write: r.write,
                clientid: r.clientid,
                owner: r.owner.clone(),
            })
    }

    /// LOCK with a new lock-owner: creates its lock state from an open.
    pub fn lock_new_owner(
        &self,
        open: &Stateid,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
    ) -> Result<Result<Stateid, Denied>, u32> {
        let mut inner = self.lock();
        self.check_on_file(&inner, open, file, false)?;
        // Reuse the lock state this owner already has on the file.
        let existing = inner.states.iter().find_map(|(k, s)| match s {
            StateEntry::Lock(l) if l.file == file && l.clientid == clientid && l.owner == owner => {
                Some(*k)
            }
            _ => None,
        });
        let other = match existing {
            Some(o) => o,
            None => {
                let other = self.new_other(&mut inner);
                inner.states.insert(
                    other,
                    StateEntry::Lock(LockState {
                        clientid,
                        owner: owner.to_vec(),
                        open: open.other,
                        file,
                        seqid: 0,
                    }),
                );
                other
            }
        };
        Ok(Self::apply_lock(&mut inner, other, range, write))
    }

    /// LOCK by an existing lock-owner.
    pub fn lock_existing(
        &self,
        sid: &Stateid,
        file: FileKey,
        range: (u64, u64),
        write: bool,
    ) -> Result<Result<Stateid, Denied>, u32> {
        let mut inner = self.lock();
        self.check_on_file(&inner, sid, file, true)?;
        Ok(Self::apply_lock(&mut inner, sid.other, range, write))
    }

    fn apply_lock(
        inner: &mut Inner,
        other: [u8; 12],
        (start, end): (u64, u64),
        write: bool,
    ) -> Result<Stateid, Denied> {
        let (clientid, owner, file) = match inner.states.get(&other) {
            Some(StateEntry::Lock(l)) => (l.clientid, l.owner.clone(), l.file),
            _ => unreachable!("caller checked the lock state"),
        };
        let ranges = inner.locks.entry(file).or_default();
        if let Some(d) = Self::find_conflict(ranges, clientid, &owner, start, end, write) {
            return Err(d);
        }
        Self::subtract(ranges, &other, start, end);
        ranges.push(LockRange {
            holder: other,
            clientid,
            owner,
            start,
            end,
            write,
        });
        let Some(StateEntry::Lock(l)) = inner.states.get_mut(&other) else {
            unreachable!("checked above");
        };
        l.seqid = l.seqid.wrapping_add(1);
        Ok(Stateid {
            seqid: l.seqid,
            other,
        })
    }

    /// Removes [start, end) from the ranges held by `holder`, splitting.
    fn subtract(ranges: &mut Vec<LockRange>, holder: &[u8; 12], start: u64, end: u64) {
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

    /// LOCKT: the conflicting lock, if any.
    pub fn test_lock(
        &self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        (start, end): (u64, u64),
        write: bool,
    ) -> Option<Denied> {
        let inner = self.lock();
        inner
            .locks
            .get(&file)
            .and_then(|r| Self::find_conflict(r, clientid, owner, start, end, write))
    }

    /// LOCKU.
    pub fn unlock(
        &self,
        sid: &Stateid,
        file: FileKey,
        (start, end): (u64, u64),
    ) -> Result<Stateid, u32> {
        let mut inner = self.lock();
        self.check_on_file(&inner, sid, file, true)?;
        if let Some(r) = inner.locks.get_mut(&file) {
            Self::subtract(r, &sid.other, start, end);
        }
        let Some(StateEntry::Lock(l)) = inner.states.get_mut(&sid.other) else {
            return Err(status::BAD_STATEID);
        };
        l.seqid = l.seqid.wrapping_add(1);
        Ok(Stateid {
            seqid: l.seqid,
            other: sid.other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> StateTable {
        StateTable::new(Duration::from_secs(90), 7)
    }

    fn attrs(slots: u32) -> ChannelAttrs {
        ChannelAttrs {
            max_requests: slots,
            max_ops: 8,
            ..Default::default()
        }
    }

    fn devnull() -> Result<Arc<OwnedFd>, u32> {
        Ok(Arc::new(std::fs::File::open("/dev/null").unwrap().into()))
    }

    #[test]
    fn exchange_and_create_session_with_replay() {
        let t = table();
        let r = t.exchange_id(b"client-a", [1; 8]).unwrap();
        assert!(!r.confirmed);
        assert_eq!(
            t.create_session(r.clientid, 2, attrs(4), attrs(1), |_| vec![9]),
            Err(status::SEQ_MISORDERED)
        );
        let reply = t
            .create_session(r.clientid, 1, attrs(4), attrs(1), |s| s.id.to_vec())
            .unwrap();
        // Replay of the same sequence returns the same bytes.
        assert_eq!(
            t.create_session(r.clientid, 1, attrs(4), attrs(1), |_| vec![0])
                .unwrap(),
            reply
        );
        let again = t.exchange_id(b"client-a", [1; 8]).unwrap();
        assert_eq!(again.clientid, r.clientid);
        assert!(again.confirmed);
        // Unknown client id.
        assert_eq!(
            t.create_session(12345, 1, attrs(4), attrs(1), |_| vec![]),
            Err(status::STALE_CLIENTID)
        );
    }

    #[test]
    fn slots_detect_replays_and_misordering() {
        let t = table();
        let r = t.exchange_id(b"c", [1; 8]).unwrap();
        let reply = t
            .create_session(r.clientid, 1, attrs(2), attrs(1), |s| s.id.to_vec())
            .unwrap();
        let id: [u8; 16] = reply.try_into().unwrap();
        let s = t.session(&id).unwrap();
        assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Execute)));
        assert_eq!(s.begin(0, 1).unwrap_err(), status::DELAY);
        s.finish(0, Some(Arc::new(vec![42])));
        match s.begin(0, 1) {
            Ok(SlotDecision::Replay(r)) => assert_eq!(*r, vec![42]),
            other => panic!("expected replay, got {other:?}"),
        }
        assert_eq!(s.begin(0, 3).unwrap_err(), status::SEQ_MISORDERED);
        assert_eq!(s.begin(2, 1).unwrap_err(), status::BADSLOT);
        assert!(matches!(s.begin(1, 1), Ok(SlotDecision::Execute)));
        s.finish(1, None);
        assert!(matches!(s.begin(1, 1), Ok(SlotDecision::Uncached)));
        t.destroy_session(&id).unwrap();
        assert_eq!(t.session(&id).unwrap_err(), status::BADSESSION);
    }

    #[test]
    fn false_retries_do_not_get_another_requests_reply() {
        let t = table();
        let r = t.exchange_id(b"c", [1; 8]).unwrap();
        let id: [u8; 16] = t
            .create_session(r.clientid, 1, attrs(2), attrs(1), |s| s.id.to_vec())
            .unwrap()
            .try_into()
            .unwrap();
        let s = t.session(&id).unwrap();
        let user = |uid| crate::rpc::Cred {
            uid,
            gid: 100,
            gids: vec![],
            flavor: crate::rpc::AUTH_SYS,
        };
        let getattr = request_fingerprint(&user(1000), 3, b"putfh+getattr");
        let write = request_fingerprint(&user(1000), 3, b"putfh+write");
        assert!(matches!(
            s.begin_request(0, 1, getattr),
            Ok(SlotDecision::Execute)
        ));
        s.finish(0, Some(Arc::new(vec![7])));
        // The same request again is a retransmission: the cached reply.
        assert!(matches!(
            s.begin_request(0, 1, getattr),
            Ok(SlotDecision::Replay(_))
        ));
        // Other operations, or the same ones from another user, with the
        // same sequence id are a false retry.
        assert_eq!(
            s.begin_request(0, 1, write).unwrap_err(),
            status::SEQ_FALSE_RETRY
        );
        let other_user = request_fingerprint(&user(0), 3, b"putfh+getattr");
        assert_eq!(
            s.begin_request(0, 1, other_user).unwrap_err(),
            status::SEQ_FALSE_RETRY
        );
        // Not cached either: still told apart.
        assert!(matches!(
            s.begin_request(1, 1, getattr),
            Ok(SlotDecision::Execute)
        ));
        s.finish(1, None);
        assert_eq!(
            s.begin_request(1, 1, write).unwrap_err(),
            status::SEQ_FALSE_RETRY
        );
        assert!(matches!(
            s.begin_request(1, 1, getattr),
            Ok(SlotDecision::Uncached)
        ));
        // The next sequence id runs whatever it carries.
        assert!(matches!(
            s.begin_request(0, 2, write),
            Ok(SlotDecision::Execute)
        ));
    }

    #[test]
    fn share_reservations_conflict() {
        let t = table();
        let req = |owner: &[u8], access, deny| OpenRequest {
            clientid: 1,
            owner: owner.to_vec(),
            file: (1, 2),
            access,
            deny,
        };
        t.open(req(b"a", 1, 2), |_| devnull()).unwrap();
        assert_eq!(
            t.open(req(b"b", 2, 0), |_| devnull()).unwrap_err(),
            status::SHARE_DENIED
        );
        t.open(req(b"b", 1, 0), |_| devnull()).unwrap();
        // The same owner upgrades its open and bumps the seqid.
        let s = t.open(req(b"a", 1, 0), |_| devnull()).unwrap();
        assert_eq!(s.seqid, 2);
    }

    #[test]
    fn locks_conflict_split_and_release() {
        let t = table();
        let file = (1, 1);
        let oa = t
            .open(
                OpenRequest {
                    clientid: 1,
                    owner: b"oa".to_vec(),
                    file,
                    access: 3,
                    deny: 0,
                },
                |_| devnull(),
            )
            .unwrap();
        let ob = t
            .open(
                OpenRequest {
                    clientid: 2,
                    owner: b"ob".to_vec(),
                    file,
                    access: 3,
                    deny: 0,
                },
                |_| devnull(),
            )
            .unwrap();
        let la = t
            .lock_new_owner(&oa, 1, b"la", file, lock_range(0, 100).unwrap(), true)
            .unwrap()
            .unwrap();
        let denied = t
            .lock_new_owner(&ob, 2, b"lb", file, lock_range(50, 10).unwrap(), false)
            .unwrap()
            .unwrap_err();
        assert_eq!((denied.offset, denied.length, denied.write), (0, 100, true));
        assert_eq!(denied.owner, b"la");
        // Unlock the middle; the split leaves [0,40) and [60,100).
        let la = t.unlock(&la, file, lock_range(40, 20).unwrap()).unwrap();
        let lb = t
            .lock_new_owner(&ob, 2, b"lb", file, lock_range(45, 10).unwrap(), false)
            .unwrap()
            .unwrap();
        assert!(t
            .test_lock(2, b"lb", file, lock_range(0, 1).unwrap(), false)
            .is_some());
        assert!(t
            .test_lock(1, b"la", file, lock_range(0, 1).unwrap(), true)
            .is_none());
        assert_eq!(t.free(&lb), Err(status::LOCKS_HELD));
        t.unlock(&lb, file, lock_range(0, LENGTH_TO_EOF).unwrap())
            .unwrap();
        assert_eq!(t.free(&Stateid { seqid: 0, ..lb }), Ok(()));
        // Closing the open drops the lock state and its locks.
        t.close(&oa).unwrap();
        assert!(t
            .test_lock(2, b"x", file, lock_range(0, LENGTH_TO_EOF).unwrap(), true)
            .is_none());
        assert_eq!(t.test(&la), status::BAD_STATEID);
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(lock_range(5, 0), Err(status::INVAL));
        assert_eq!(lock_range(u64::MAX - 1, 5), Err(status::INVAL));
        assert_eq!(lock_range(10, LENGTH_TO_EOF), Ok((10, u64::MAX)));
    }

    #[test]
    fn stale_stateids_from_another_boot() {
        let t = table();
        let mut other = [0u8; 12];
        other[..4].copy_from_slice(&99u32.to_be_bytes());
        let s = Stateid { seqid: 1, other };
        assert_eq!(t.io_state(&s, (0, 0)).unwrap_err(), status::STALE_STATEID);
    }

    #[test]
    fn silent_clients_expire() {
        let t = StateTable::new(Duration::from_secs(10), 1);
        let r = t.exchange_id(b"gone", [0; 8]).unwrap();
        t.create_session(r.clientid, r.seq, attrs(4), attrs(1), |_| vec![])
            .unwrap();
        t.open(
            OpenRequest {
                clientid: r.clientid,
                owner: b"o".to_vec(),
                file: (1, 1),
                access: 1,
                deny: 0,
            },
            |_| devnull(),
        )
        .unwrap();
        assert_eq!(t.client_count(), 1);
        assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(14)), 0);
        assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(16)), 1);
        assert_eq!(t.client_count(), 0);
        assert_eq!(t.usage(), Usage::default());
    }

    #[test]
    fn unconfirmed_records_expire_after_one_lease() {
        let t = StateTable::new(Duration::from_secs(10), 1);
        let u = t.exchange_id(b"unconfirmed", [0; 8]).unwrap();
        let c = t.exchange_id(b"confirmed", [0; 8]).unwrap();
        t.create_session(c.clientid, c.seq, attrs(4), attrs(1), |_| vec![])
            .unwrap();
        assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(9)), 0);
        assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(11)), 1);
        assert_eq!(
            t.create_session(u.clientid, u.seq, attrs(4), attrs(1), |_| vec![]),
            Err(status::STALE_CLIENTID)
        );
        assert_eq!(t.client_count(), 1);
    }

    fn small_limits() -> Limits {
        Limits {
            clients: 3,
            sessions_per_client: 2,
            slots: 8,
            reply_cache: 64 * MIN_SLOT_BYTES,
        }
    }

    /// A confirmed client with one session; returns its id and the
    /// sequence id for its next CREATE_SESSION.
    fn confirmed(t: &StateTable, owner: &[u8], slots: u32) -> (u64, u32) {
        let r = t.exchange_id(owner, [1; 8]).unwrap();
        t.create_session(r.clientid, r.seq, attrs(slots), attrs(1), |_| vec![])
            .unwrap();
        (r.clientid, r.seq + 1)
    }

    fn session_id(reply: Vec<u8>) -> [u8; SESSIONID_SIZE] {
        reply.try_into().unwrap()
    }

    #[test]
    fn sessions_per_client_are_capped_with_nospc() {
        let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
        let (id, seq) = confirmed(&t, b"a", 1);
        let second = t
            .create_session(id, seq, attrs(1), attrs(1), |s| s.id.to_vec())
            .unwrap();
        // A third is refused; the sequence slot moves on and a replay gets
        // the same error.
        assert_eq!(
            t.create_session(id, seq + 1, attrs(1), attrs(1), |_| vec![]),
            Err(status::NOSPC)
        );
        assert_eq!(
            t.create_session(id, seq + 1, attrs(1), attrs(1), |_| vec![]),
            Err(status::NOSPC)
        );
        assert_eq!(t.usage().sessions, 2);
        // Another client is not affected.
        confirmed(&t, b"b", 1);
        // Destroying one makes room again.
        t.destroy_session(&session_id(second)).unwrap();
        t.create_session(id, seq + 2, attrs(1), attrs(1), |_| vec![])
            .unwrap();
        assert_eq!(t.usage().sessions, 3);
    }

    #[test]
    fn slots_are_capped_and_shrink_to_the_reply_cache_budget() {
        let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
        let big = |slots, cached| ChannelAttrs {
            max_requests: slots,
            max_response_cached: cached,
            max_ops: 8,
            ..Default::default()
        };
        // 1000 slots asked, the limit (8) granted; each reserves 4 KiB.
        let r = t.exchange_id(b"a", [1; 8]).unwrap();
        let sid = session_id(
            t.create_session(r.clientid, r.seq, big(1000, 0), attrs(1), |s| s.id.to_vec())
                .unwrap(),
        );
        let s = t.session(&sid).unwrap();
        assert_eq!(s.fore.max_requests, 8);
        assert_eq!(s.begin(8, 1).unwrap_err(), status::BADSLOT);
        assert!(matches!(s.begin(7, 1), Ok(SlotDecision::Execute)));
        assert_eq!(t.usage().reply_cache, 8 * MIN_SLOT_BYTES);
        // 8 slots of 24 KiB (48 pages) fit in the 56 pages left.
        let r = t.exchange_id(b"b", [1; 8]).unwrap();
        t.create_session(r.clientid, r.seq, big(8, 6 * 4096), attrs(1), |_| vec![])
            .unwrap();
        assert_eq!(t.usage().reply_cache, 56 * MIN_SLOT_BYTES);
        // 8 pages left: one slot of 32 KiB does not fit ...
        let r = t.exchange_id(b"c", [1; 8]).unwrap();
        assert_eq!(
            t.create_session(r.clientid, r.seq, big(8, 9 * 4096), attrs(1), |_| vec![]),
            Err(status::NOSPC)
        );
        // ... but the next try with 4 KiB replies gets the 8 slots left,
        // shrunk from the 64 asked for.
        let sid = session_id(
            t.create_session(r.clientid, r.seq + 1, big(64, 1024), attrs(1), |s| {
                s.id.to_vec()
            })
            .unwrap(),
        );
        assert_eq!(t.session(&sid).unwrap().fore.max_requests, 8);
        assert_eq!(t.usage().reply_cache, 64 * MIN_SLOT_BYTES);
        // Replies longer than the slot's share are not kept.
        let s = t.session(&sid).unwrap();
        assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Execute)));
        s.finish(0, Some(Arc::new(vec![0; MIN_SLOT_BYTES + 1])));
        assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Uncached)));
        // Expiry gives the budget back.
        assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(200)), 3);
        assert_eq!(t.usage(), Usage::default());
    }

    #[test]
    fn full_client_table_drops_unconfirmed_records_then_delays() {
        let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
        let (a, _) = confirmed(&t, b"a", 1);
        let u1 = t.exchange_id(b"u1", [1; 8]).unwrap();
        let u2 = t.exchange_id(b"u2", [1; 8]).unwrap();
        assert_eq!(t.client_count(), 3);
        // A fourth owner pushes out the oldest unconfirmed record (u1).
        let u3 = t.exchange_id(b"u3", [1; 8]).unwrap();
        assert_eq!(t.client_count(), 3);
        assert_eq!(
            t.create_session(u1.clientid, u1.seq, attrs(1), attrs(1), |_| vec![]),
            Err(status::STALE_CLIENTID)
        );
        t.create_session(u2.clientid, u2.seq, attrs(1), attrs(1), |_| vec![])
            .unwrap();
        t.create_session(u3.clientid, u3.seq, attrs(1), attrs(1), |_| vec![])
            .unwrap();
        // All three confirmed: a new owner waits, known owners carry on.
        assert_eq!(t.exchange_id(b"new", [1; 8]).unwrap_err(), status::DELAY);
        assert_eq!(t.exchange_id(b"a", [1; 8]).unwrap().clientid, a);
        // A restarted client (new verifier) gets in beside its old record,
        // then takes its place.
        let restarted = t.exchange_id(b"a", [2; 8]).unwrap();
        assert_ne!(restarted.clientid, a);
        assert_eq!(t.client_count(), 4);
        let again = t.exchange_id(b"a", [3; 8]).unwrap();
        assert_eq!(t.client_count(), 4);
        t.create_session(again.clientid, again.seq, attrs(1), attrs(1), |_| vec![])
            .unwrap();
        assert_eq!(t.client_count(), 3);
        assert_eq!(
            t.create_session(restarted.clientid, 1, attrs(1), attrs(1), |_| vec![]),
            Err(status::STALE_CLIENTID)
        );
        // A destroyed client makes room.
        let r = t.exchange_id(b"u2", [1; 8]).unwrap();
        assert_eq!(r.clientid, u2.clientid);
        let sid = t
            .lock()
            .clients
            .get(&u2.clientid)
            .map(|c| c.sessions[0])
            .unwrap();
        t.destroy_session(&sid).unwrap();
        t.destroy_client(u2.clientid).unwrap();
        assert!(t.exchange_id(b"new", [1; 8]).is_ok());
    }
}
