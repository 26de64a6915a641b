//! Client, session, open and lock state (RFC 8881 sections 2.4, 2.10, 8, 9).
//!
//! All of the NFSv4 state machine lives here, one concept a module:
//!
//! - [`clients`]: client records made by EXCHANGE_ID (its case table) and
//!   confirmed by CREATE_SESSION, RECLAIM_COMPLETE, DESTROY_CLIENTID;
//! - [`session`]: sessions, slot tables, the reply cache, the slot guard;
//! - [`stateids`]: open and lock stateids, share reservations and
//!   byte-range locks, indexed by owner and by file;
//! - [`lease`]: lease expiry and courtesy (an expired client keeps its
//!   state until somebody conflicts with it);
//! - [`grace`]: the grace period after a start and the reclaim rules;
//! - [`recovery`]: the stable records of which clients may reclaim.
//!
//! Op handlers call into [`StateTable`] and never touch the tables. One
//! mutex guards them; every op's work under it is bounded by what the
//! caller's own client, owner or file holds, never by the number of
//! clients.

mod clients;
mod delegs;
pub mod grace;
mod lease;
pub mod nlm;
pub mod recovery;
pub mod session;
mod stateids;

pub use clients::{ExchangeFlags, ExchangeResult, Principal};
pub use delegs::{DelegRequest, Granted, Recall, WriteHolder};
pub use grace::GraceStatus;
pub use session::{request_fingerprint, Fingerprint, Session, SlotDecision, SlotGuard};
pub use stateids::{lock_range, Denied, LockRange, OpenRequest};

use crate::nfs4::consts::SESSIONID_SIZE;
use recovery::Recovery;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A stateid: sequence number and 12 opaque bytes (the protocol's
/// stateid4, with its special values).
pub use crate::nfs4::msg::Stateid4 as Stateid;

/// Identifies a file across handles: device and inode.
pub type FileKey = (u64, u64);

/// The `other` part of a stateid: the key of an open or lock state.
type Other = [u8; 12];

/// A session id.
type SessionId = [u8; SESSIONID_SIZE];

/// Channel limits agreed at CREATE_SESSION (the protocol's
/// channel_attrs4).
pub use crate::nfs4::msg::ChannelAttrs4 as ChannelAttrs;

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
    /// How long a client whose lease ran out keeps its state while nobody
    /// conflicts with it (the Linux server keeps such "courtesy" clients
    /// for a day).
    pub courtesy: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            clients: 1024,
            sessions_per_client: 8,
            slots: 64,
            reply_cache: 64 << 20,
            courtesy: Duration::from_secs(24 * 3600),
        }
    }
}

/// How much of the [`Limits`] is in use, and what the state holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Client records, confirmed or not.
    pub clients: usize,
    /// Sessions of all clients.
    pub sessions: usize,
    /// Reply cache bytes reserved by all sessions.
    pub reply_cache: usize,
    /// Open stateids.
    pub opens: usize,
    /// Lock stateids.
    pub lock_owners: usize,
    /// Byte ranges locked.
    pub locks: usize,
    /// Clients whose lease ran out but which keep their state.
    pub courtesy: usize,
}

/// Settings of a [`StateTable`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// The lease period given to clients.
    pub lease: Duration,
    /// The grace period after the start, for clients known from before
    /// to reclaim their state; it ends early once all of them did.
    pub grace: Duration,
    /// Bounds on what clients can make the server keep.
    pub limits: Limits,
    /// Delegations hold kernel leases on their files, so that local
    /// processes that open them for writing wait for the recall (the
    /// process must take the lease signal: see `server::leases`).
    pub local_leases: bool,
    /// Byte-range locks are also taken on the file system (OFD locks), so
    /// that the other nodes of a cluster, which share it, see them.
    pub shared_locks: bool,
}

impl Settings {
    /// A lease of `lease`, a grace period of one lease, default limits.
    pub fn new(lease: Duration) -> Self {
        Settings {
            lease,
            grace: lease,
            limits: Limits::default(),
            local_leases: false,
            shared_locks: false,
        }
    }
}

/// Counters of state events, for the metrics endpoint.
#[derive(Debug, Default)]
pub struct Counters {
    /// Opens and locks reclaimed during grace.
    pub reclaims: std::sync::atomic::AtomicU64,
    /// Clients expired: their lease ran out and nothing kept them, or a
    /// conflict ended their courtesy.
    pub expired: std::sync::atomic::AtomicU64,
    /// Delegations granted.
    pub delegs_granted: std::sync::atomic::AtomicU64,
    /// Write delegations granted (also in `delegs_granted`).
    pub write_delegs_granted: std::sync::atomic::AtomicU64,
    /// Delegations recalled.
    pub delegs_recalled: std::sync::atomic::AtomicU64,
    /// Delegations returned with DELEGRETURN.
    pub delegs_returned: std::sync::atomic::AtomicU64,
    /// Delegations revoked (not returned within a lease of their recall,
    /// no way to recall them, or their client's lease ran out).
    pub delegs_revoked: std::sync::atomic::AtomicU64,
}

/// All NFSv4 state of the server.
#[derive(Debug)]
pub struct StateTable {
    inner: Mutex<Inner>,
    settings: Settings,
    boot: u32,
    recovery: Arc<dyn Recovery>,
    /// State events so far.
    pub counters: Counters,
    /// Revoked delegations not yet freed (read without the lock by every
    /// SEQUENCE).
    revoked: std::sync::atomic::AtomicUsize,
    /// Files with delegations (read without the lock by every change).
    delegated_files: std::sync::atomic::AtomicUsize,
    /// Write delegations held (read without the lock by every read and
    /// GETATTR).
    write_delegs: std::sync::atomic::AtomicUsize,
    /// How this start began: its epoch and who may reclaim.
    epoch: recovery::EpochStart,
}

/// The tables, under [`StateTable`]'s mutex.
#[derive(Debug, Default)]
struct Inner {
    counter: u64,
    clients: HashMap<u64, clients::Client>,
    /// Client records by co_ownerid.
    owners: HashMap<Vec<u8>, clients::OwnerRecords>,
    sessions: HashMap<SessionId, Arc<Session>>,
    /// Sum of the sessions' [`Session::cache_bytes`].
    reply_cache: usize,
    ids: stateids::Stateids,
    delegs: delegs::Delegs,
    grace: grace::Grace,
    nlm: nlm::NlmHosts,
}

impl Inner {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }
}

impl StateTable {
    /// An empty table with a lease of `lease`, no grace period and no
    /// stable records; `boot` distinguishes this server instance's ids.
    pub fn new(lease: Duration, boot: u32) -> Self {
        Self::with_limits(lease, boot, Limits::default())
    }

    /// Like [`StateTable::new`], keeping within `limits`.
    pub fn with_limits(lease: Duration, boot: u32, limits: Limits) -> Self {
        let settings = Settings {
            limits,
            ..Settings::new(lease)
        };
        Self::start(
            settings,
            boot,
            Arc::new(recovery::SqliteRecovery::in_memory()),
        )
        .expect("an in-memory record store starts")
    }

    /// A table for a server that starts now: the clients `recovery` knew
    /// in the last epoch may reclaim during a grace period of
    /// `settings.grace` (none when there are no such clients).
    pub fn start(
        settings: Settings,
        boot: u32,
        recovery: Arc<dyn Recovery>,
    ) -> recovery::Result<Self> {
        let epoch = recovery.start_epoch()?;
        let t = StateTable {
            inner: Mutex::new(Inner::default()),
            settings,
            boot,
            recovery,
            counters: Counters::default(),
            revoked: Default::default(),
            delegated_files: Default::default(),
            write_delegs: Default::default(),
            epoch: epoch.clone(),
        };
        {
            let mut inner = t.lock();
            inner.grace = grace::Grace::begin(&epoch, t.settings.grace, Instant::now());
            t.grace_check_end(&mut inner, Instant::now());
        }
        Ok(t)
    }

    /// The limits this table keeps within.
    pub fn limits(&self) -> Limits {
        self.settings.limits
    }

    /// How much of the limits is in use.
    pub fn usage(&self) -> Usage {
        let inner = self.lock();
        Usage {
            clients: inner.clients.len(),
            sessions: inner.sessions.len(),
            reply_cache: inner.reply_cache,
            opens: inner.ids.open_count(),
            lock_owners: inner.ids.lock_owner_count(),
            locks: inner.ids.range_count(),
            courtesy: inner
                .clients
                .values()
                .filter(|c| c.courtesy.is_some())
                .count(),
        }
    }

    /// The lease period.
    pub fn lease(&self) -> Duration {
        self.settings.lease
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_other(&self, inner: &mut Inner) -> Other {
        let mut o = [0u8; 12];
        o[..4].copy_from_slice(&self.boot.to_be_bytes());
        o[4..].copy_from_slice(&inner.next().to_be_bytes());
        o
    }

    /// Number of client records (for tests and metrics).
    pub fn client_count(&self) -> usize {
        self.lock().clients.len()
    }

    /// Removes a session from the tables.
    fn remove_session(inner: &mut Inner, id: &SessionId) -> Option<Arc<Session>> {
        let s = inner.sessions.remove(id)?;
        inner.reply_cache -= s.cache_bytes();
        Some(s)
    }

    /// Removes a client record with its sessions and state. `forget`
    /// also removes its stable record: the client is expired, destroyed
    /// or replaced, and may not reclaim after a restart.
    fn remove_client(&self, inner: &mut Inner, id: u64, forget: bool) {
        let Some(c) = inner.clients.remove(&id) else {
            return;
        };
        for s in &c.sessions {
            Self::remove_session(inner, s);
        }
        if let Some(o) = inner.owners.get_mut(&c.owner) {
            o.forget(id);
            if o.is_empty() {
                inner.owners.remove(&c.owner);
            }
        }
        inner.ids.remove_client(id);
        inner.delegs.remove_client(id);
        self.delegs_removed(inner);
        if c.reclaimable {
            // Judged gone: grace need not wait for it.
            inner.grace.client_done(&c.owner);
        }
        if forget && c.recorded {
            if let Err(e) = self.recovery.remove(&c.owner) {
                tracing::error!(error = %e, clientid = id, "cannot remove a client's stable record");
            }
        }
    }
}

#[cfg(test)]
mod tests;
