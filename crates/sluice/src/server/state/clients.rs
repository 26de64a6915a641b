//! Client records (RFC 8881 section 2.4): EXCHANGE_ID and its case table
//! (section 18.35.5), confirmation by CREATE_SESSION (section 18.36.4),
//! DESTROY_SESSION, DESTROY_CLIENTID and RECLAIM_COMPLETE.

use super::session::Session;
use super::{ChannelAttrs, Inner, SessionId, StateTable, MIN_SLOT_BYTES};
use crate::nfs4::consts::{status, SESSIONID_SIZE};
use crate::nfs4::Nfsstat4;
use crate::rpc::Cred;
use std::sync::Arc;
use std::time::Instant;

/// Who made a request, as far as client records care (RFC 8881 section
/// 2.4: "principal"): for AUTH_SYS the user, group and groups, compared
/// as the Linux server does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    flavor: u32,
    uid: u32,
    gid: u32,
    gids: Vec<u32>,
}

impl Principal {
    /// The principal of an RPC caller.
    pub fn of(cred: &Cred) -> Self {
        let mut gids = cred.gids.clone();
        gids.sort_unstable();
        gids.dedup();
        Principal {
            flavor: cred.flavor,
            uid: cred.uid,
            gid: cred.gid,
            gids,
        }
    }
}

/// A client record.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) owner: Vec<u8>,
    verifier: [u8; 8],
    principal: Principal,
    pub(super) confirmed: bool,
    /// Sequence id expected by the next CREATE_SESSION.
    cs_seq: u32,
    /// The last CREATE_SESSION result, for its replay.
    cs_reply: Option<(u32, Result<Vec<u8>, Nfsstat4>)>,
    pub(super) last_renew: Instant,
    pub(super) sessions: Vec<SessionId>,
    pub(super) reclaim_complete: bool,
    /// Its stable record is written: it may reclaim after a restart.
    pub(super) recorded: bool,
    /// Known from before the start: may reclaim during grace.
    pub(super) reclaimable: bool,
    /// Since when its lease has run out while it kept state.
    pub(super) courtesy: Option<Instant>,
}

/// The records of one co_ownerid: at most one confirmed and one
/// unconfirmed (a restarted client's, until it is confirmed).
#[derive(Debug, Default)]
pub(super) struct OwnerRecords {
    confirmed: Option<u64>,
    unconfirmed: Option<u64>,
}

impl OwnerRecords {
    pub(super) fn forget(&mut self, id: u64) {
        if self.confirmed == Some(id) {
            self.confirmed = None;
        }
        if self.unconfirmed == Some(id) {
            self.unconfirmed = None;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.confirmed.is_none() && self.unconfirmed.is_none()
    }
}

/// EXCHANGE_ID's eia_flags (RFC 8881 section 18.35.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExchangeFlags(pub u32);

impl ExchangeFlags {
    /// EXCHGID4_FLAG_SUPP_MOVED_REFER.
    pub const SUPP_MOVED_REFER: u32 = 0x0000_0001;
    /// EXCHGID4_FLAG_SUPP_MOVED_MIGR.
    pub const SUPP_MOVED_MIGR: u32 = 0x0000_0002;
    /// EXCHGID4_FLAG_SUPP_FENCE_OPS (RFC 7862).
    pub const SUPP_FENCE_OPS: u32 = 0x0000_0004;
    /// EXCHGID4_FLAG_BIND_PRINC_STATEID.
    pub const BIND_PRINC_STATEID: u32 = 0x0000_0100;
    /// EXCHGID4_FLAG_USE_NON_PNFS.
    pub const USE_NON_PNFS: u32 = 0x0001_0000;
    /// EXCHGID4_FLAG_USE_PNFS_MDS.
    pub const USE_PNFS_MDS: u32 = 0x0002_0000;
    /// EXCHGID4_FLAG_USE_PNFS_DS.
    pub const USE_PNFS_DS: u32 = 0x0004_0000;
    /// EXCHGID4_FLAG_UPD_CONFIRMED_REC_A: update a confirmed record.
    pub const UPD_CONFIRMED_REC_A: u32 = 0x4000_0000;
    /// EXCHGID4_FLAG_CONFIRMED_R: the record is confirmed (results only).
    pub const CONFIRMED_R: u32 = 0x8000_0000;
    /// The bits a client may set.
    pub const CLIENT_MASK: u32 = Self::SUPP_MOVED_REFER
        | Self::SUPP_MOVED_MIGR
        | Self::SUPP_FENCE_OPS
        | Self::BIND_PRINC_STATEID
        | Self::USE_NON_PNFS
        | Self::USE_PNFS_MDS
        | Self::USE_PNFS_DS
        | Self::UPD_CONFIRMED_REC_A;

    /// NFS4ERR_INVAL for bits a client may not set (section 18.35.3:
    /// undefined ones and CONFIRMED_R).
    pub fn check(self) -> Result<Self, Nfsstat4> {
        if self.0 & !Self::CLIENT_MASK != 0 {
            Err(status::INVAL)
        } else {
            Ok(self)
        }
    }

    /// The client asks to update its confirmed record.
    pub fn update(self) -> bool {
        self.0 & Self::UPD_CONFIRMED_REC_A != 0
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

impl StateTable {
    /// EXCHANGE_ID (RFC 8881 section 18.35): finds, updates or creates the
    /// record of the client `owner` with boot `verifier`, following the
    /// case table of section 18.35.5. NFS4ERR_DELAY when a new record is
    /// needed and the table is full of confirmed ones.
    pub fn exchange_id(
        &self,
        owner: &[u8],
        verifier: [u8; 8],
        principal: &Principal,
        flags: ExchangeFlags,
    ) -> Result<ExchangeResult, Nfsstat4> {
        let flags = flags.check()?;
        let mut inner = self.lock();
        let now = Instant::now();
        let (conf, unconf) = inner
            .owners
            .get(owner)
            .map_or((None, None), |o| (o.confirmed, o.unconfirmed));
        let confirmed_result = |c: &Client, id: u64| ExchangeResult {
            clientid: id,
            seq: c.cs_seq,
            confirmed: true,
        };
        if flags.update() {
            // Cases 6 to 9: only a confirmed record can be updated.
            let id = conf.ok_or(status::NOENT)?;
            let c = inner.clients.get_mut(&id).ok_or(status::SERVERFAULT)?;
            if c.verifier != verifier {
                return Err(status::NOT_SAME);
            }
            if &c.principal != principal {
                return Err(status::PERM);
            }
            Self::renew(c, now);
            return Ok(confirmed_result(c, id));
        }
        if let Some(id) = conf {
            let expirable = self.expirable(&inner, id, now);
            let c = inner.clients.get_mut(&id).ok_or(status::SERVERFAULT)?;
            if &c.principal != principal {
                // Case 3, a collision: another principal uses the owner.
                // A record holding live state is in use; one without, or
                // whose lease ran out, gives way once the new one is
                // confirmed.
                if inner.ids.client_has_state(id) && !expirable {
                    tracing::debug!(
                        clientid = id,
                        "EXCHANGE_ID: owner in use by another principal"
                    );
                    return Err(status::CLID_INUSE);
                }
            } else if c.verifier == verifier {
                // Case 2: the same client again.
                Self::renew(c, now);
                return Ok(confirmed_result(c, id));
            }
            // Case 5 (a restarted client) or 3: a new record beside the
            // old one, which goes when the new one is confirmed.
        }
        if let Some(id) = unconf {
            // Case 4: an unconfirmed record is replaced.
            self.remove_client(&mut inner, id, true);
        }
        if conf.is_none() && inner.clients.len() >= self.settings.limits.clients {
            self.make_room(&mut inner)?;
        }
        // Case 1: a new record.
        let id = ((self.boot as u64) << 32) | (inner.next() & 0xffff_ffff);
        let reclaimable = inner.grace.may_reclaim(owner);
        inner.clients.insert(
            id,
            Client {
                owner: owner.to_vec(),
                verifier,
                principal: principal.clone(),
                confirmed: false,
                cs_seq: 1,
                cs_reply: None,
                last_renew: now,
                sessions: Vec::new(),
                reclaim_complete: false,
                recorded: false,
                reclaimable,
                courtesy: None,
            },
        );
        inner.owners.entry(owner.to_vec()).or_default().unconfirmed = Some(id);
        Ok(ExchangeResult {
            clientid: id,
            seq: 1,
            confirmed: false,
        })
    }

    /// Makes room for a new client record by dropping the unconfirmed
    /// record renewed longest ago: it has no sessions and no state, and
    /// its client, if it is still there, gets NFS4ERR_STALE_CLIENTID and
    /// starts over. Confirmed records stay until they expire or are
    /// destroyed: NFS4ERR_DELAY when there is no unconfirmed one.
    fn make_room(&self, inner: &mut Inner) -> Result<(), Nfsstat4> {
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
                self.remove_client(inner, old, true);
                Ok(())
            }
            None => {
                tracing::debug!(
                    limit = self.settings.limits.clients,
                    "client table full of confirmed clients: EXCHANGE_ID delayed"
                );
                Err(status::DELAY)
            }
        }
    }

    /// A client was heard from: its lease starts again, and a courtesy
    /// client is active again.
    pub(super) fn renew(c: &mut Client, now: Instant) {
        c.last_renew = now;
        c.courtesy = None;
    }

    /// CREATE_SESSION (RFC 8881 section 18.36). `make_reply` encodes the
    /// result for the new session so that a replay can return it verbatim.
    /// The session gets at most [`super::Limits::slots`] slots, fewer when
    /// the reply cache budget is short; NFS4ERR_NOSPC when the client has
    /// [`super::Limits::sessions_per_client`] sessions or not one slot
    /// fits. Confirming a record replaces the other record of its owner
    /// (a restarted client's old state goes).
    pub fn create_session(
        &self,
        clientid: u64,
        principal: &Principal,
        seq: u32,
        mut fore: ChannelAttrs,
        back: ChannelAttrs,
        make_reply: impl FnOnce(&Session) -> Vec<u8>,
    ) -> Result<Vec<u8>, Nfsstat4> {
        let mut inner = self.lock();
        let Some(c) = inner.clients.get(&clientid) else {
            return Err(status::STALE_CLIENTID);
        };
        if &c.principal != principal {
            return Err(status::CLID_INUSE);
        }
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
        // Confirming a record replaces the older record of the same owner;
        // the reply cache its sessions hold is then free for this one.
        let old = if was_confirmed {
            None
        } else {
            inner
                .owners
                .get(&owner)
                .and_then(|o| o.confirmed)
                .filter(|id| *id != clientid)
        };
        let freed: usize = old
            .iter()
            .filter_map(|id| inner.clients.get(id))
            .flat_map(|o| o.sessions.iter())
            .filter_map(|s| inner.sessions.get(s))
            .map(|s| s.cache_bytes())
            .sum();
        let limits = self.settings.limits;
        let slot_bytes = (fore.max_response_cached as usize).max(MIN_SLOT_BYTES);
        let room = (limits.reply_cache + freed).saturating_sub(inner.reply_cache) / slot_bytes;
        let slots = fore
            .max_requests
            .min(limits.slots)
            .min(u32::try_from(room).unwrap_or(u32::MAX));
        if sessions >= limits.sessions_per_client || slots == 0 {
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
        if let Some(old) = old {
            tracing::info!(
                old = old,
                new = clientid,
                "client restarted: its old state is released"
            );
            self.remove_client(&mut inner, old, true);
        }
        fore.max_requests = slots;
        let mut id = [0u8; SESSIONID_SIZE];
        id[..8].copy_from_slice(&clientid.to_be_bytes());
        id[8..].copy_from_slice(&inner.next().to_be_bytes());
        let session = Arc::new(Session::new(id, clientid, fore, back, slot_bytes));
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
        Self::renew(c, Instant::now());
        if !was_confirmed {
            let o = inner.owners.entry(owner).or_default();
            o.unconfirmed = None;
            o.confirmed = Some(clientid);
        }
        Ok(reply)
    }

    /// The sessions of a client (for callbacks).
    pub fn sessions_of(&self, clientid: u64) -> Vec<Arc<Session>> {
        let inner = self.lock();
        inner
            .clients
            .get(&clientid)
            .map(|c| {
                c.sessions
                    .iter()
                    .filter_map(|id| inner.sessions.get(id).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Finds a session and renews its client's lease (SEQUENCE).
    pub fn session(&self, id: &SessionId) -> Result<Arc<Session>, Nfsstat4> {
        let mut inner = self.lock();
        let s = inner.sessions.get(id).cloned().ok_or(status::BADSESSION)?;
        if let Some(c) = inner.clients.get_mut(&s.clientid) {
            Self::renew(c, Instant::now());
        }
        Ok(s)
    }

    /// DESTROY_SESSION.
    pub fn destroy_session(&self, id: &SessionId) -> Result<(), Nfsstat4> {
        let mut inner = self.lock();
        let s = Self::remove_session(&mut inner, id).ok_or(status::BADSESSION)?;
        if let Some(c) = inner.clients.get_mut(&s.clientid) {
            c.sessions.retain(|x| x != id);
        }
        Ok(())
    }

    /// DESTROY_CLIENTID (RFC 8881 section 18.50): NFS4ERR_CLIENTID_BUSY
    /// while the client has sessions or state.
    pub fn destroy_client(&self, clientid: u64) -> Result<(), Nfsstat4> {
        let mut inner = self.lock();
        let c = inner.clients.get(&clientid).ok_or(status::STALE_CLIENTID)?;
        if !c.sessions.is_empty() || inner.ids.client_has_state(clientid) {
            return Err(status::CLIENTID_BUSY);
        }
        self.remove_client(&mut inner, clientid, true);
        Ok(())
    }

    /// RECLAIM_COMPLETE (RFC 8881 section 18.51). The client is recorded
    /// as one that may reclaim after a restart; a second one gets
    /// NFS4ERR_COMPLETE_ALREADY. When every client known from before has
    /// sent it, grace ends.
    pub fn reclaim_complete(&self, clientid: u64, one_fs: bool) -> Result<(), Nfsstat4> {
        let mut inner = self.lock();
        let c = inner.clients.get(&clientid).ok_or(status::STALE_CLIENTID)?;
        if one_fs {
            // Only one file system's reclaims are done; the client's own
            // RECLAIM_COMPLETE for all of them is still to come.
            return Ok(());
        }
        if c.reclaim_complete {
            return Err(status::COMPLETE_ALREADY);
        }
        self.record_client(&mut inner, clientid)?;
        let Some(c) = inner.clients.get_mut(&clientid) else {
            return Err(status::STALE_CLIENTID);
        };
        c.reclaim_complete = true;
        if c.reclaimable {
            let owner = c.owner.clone();
            inner.grace.client_done(&owner);
            self.recovery.reclaimed(&owner);
        }
        self.grace_check_end(&mut inner, Instant::now());
        Ok(())
    }

    /// Whether `clientid`'s stable record is written, so that granting it
    /// state writes nothing to storage.
    pub fn client_recorded(&self, clientid: u64) -> bool {
        self.lock()
            .clients
            .get(&clientid)
            .is_some_and(|c| c.recorded)
    }

    /// Writes the client's stable record, if it is not written yet: before
    /// any state is granted to it. NFS4ERR_SERVERFAULT when the store
    /// cannot be written (nothing is granted then).
    pub(super) fn record_client(&self, inner: &mut Inner, clientid: u64) -> Result<(), Nfsstat4> {
        let c = inner
            .clients
            .get_mut(&clientid)
            .ok_or(status::STALE_CLIENTID)?;
        if c.recorded {
            return Ok(());
        }
        if let Err(e) = self.recovery.add(&c.owner) {
            tracing::error!(error = %e, clientid, "cannot write a client's stable record");
            return Err(if e.is_transient() {
                status::DELAY
            } else {
                status::SERVERFAULT
            });
        }
        c.recorded = true;
        Ok(())
    }
}
