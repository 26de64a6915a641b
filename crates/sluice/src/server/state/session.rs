//! Sessions and their slot tables (RFC 8881 section 2.10.6): exactly-once
//! semantics, the reply cache, and the guard that gives a slot back.

use super::ChannelAttrs;
use crate::nfs4::consts::{status, SESSIONID_SIZE};
use crate::nfs4::Nfsstat4;
use crate::server::callback::BackChannel;
use std::sync::{Arc, Mutex, MutexGuard};

/// SEQ4_STATUS_CB_PATH_DOWN: the client has no working back channel.
pub const SEQ4_STATUS_CB_PATH_DOWN: u32 = 0x1;
/// SEQ4_STATUS_RECALLABLE_STATE_REVOKED: a delegation of the client was
/// revoked; it should free it (TEST_STATEID, FREE_STATEID).
pub const SEQ4_STATUS_RECALLABLE_STATE_REVOKED: u32 = 0x40;
/// SEQ4_STATUS_CB_PATH_DOWN_SESSION: this session's back channel does not
/// work.
pub const SEQ4_STATUS_CB_PATH_DOWN_SESSION: u32 = 0x200;

/// A slot of a session's table.
#[derive(Debug, Default)]
struct Slot {
    seqid: u32,
    busy: bool,
    reply: Option<Arc<Vec<u8>>>,
    /// What identifies the request the slot last executed, when given.
    request: Option<Fingerprint>,
    /// The client asked for that request's reply to be cached.
    cachethis: bool,
}

/// Identifies a request on a slot, so that a retransmission can be told
/// from a false retry (RFC 8881 section 2.10.6.1.3.1: another request with
/// the same slot and sequence id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Hash of the caller's identity.
    pub caller: u64,
    /// Hash of the COMPOUND's operations after SEQUENCE (`nops` of them
    /// in all): their length and first [`FINGERPRINT_SAMPLE`] bytes, so a
    /// 1 MiB WRITE is not hashed whole on every request. SEQUENCE's own
    /// arguments are left out: a retry may change the highest slot it
    /// reports.
    pub ops: u64,
}

/// The [`Fingerprint`] of a request from `cred` whose operations after
/// SEQUENCE are `ops`.
pub fn request_fingerprint(cred: &crate::rpc::Cred, nops: usize, ops: &[u8]) -> Fingerprint {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (cred.flavor, cred.uid, cred.gid, &cred.gids).hash(&mut h);
    let caller = h.finish();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let sample = &ops[..ops.len().min(FINGERPRINT_SAMPLE)];
    (nops, ops.len(), sample).hash(&mut h);
    Fingerprint {
        caller,
        ops: h.finish(),
    }
}

/// Bytes of a request's operations that go into its fingerprint.
pub const FINGERPRINT_SAMPLE: usize = 512;

/// What SEQUENCE decided for a request.
#[derive(Debug)]
pub enum SlotDecision {
    /// New request: execute it and then call [`Session::finish`] (or let a
    /// [`SlotGuard`] do it).
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
    /// The back channel, when the client gave one.
    back_chan: Mutex<Option<BackChannel>>,
    /// Held by the callback using the back channel's one slot.
    cb_slot: Mutex<()>,
}

impl Session {
    /// A session with `fore.max_requests` empty slots, each keeping
    /// replies of up to `slot_bytes`.
    pub(super) fn new(
        id: [u8; SESSIONID_SIZE],
        clientid: u64,
        fore: ChannelAttrs,
        back: ChannelAttrs,
        slot_bytes: usize,
    ) -> Self {
        Session {
            id,
            clientid,
            fore,
            back,
            slots: Mutex::new((0..fore.max_requests).map(|_| Slot::default()).collect()),
            slot_bytes,
            back_chan: Mutex::new(None),
            cb_slot: Mutex::new(()),
        }
    }

    /// The session's back channel.
    pub fn back_channel(&self) -> MutexGuard<'_, Option<BackChannel>> {
        self.back_chan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The back channel's slot, held while a callback uses it.
    pub fn cb_slot(&self) -> MutexGuard<'_, ()> {
        self.cb_slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// SEQ4_STATUS flags about the back channel: CB_PATH_DOWN and
    /// CB_PATH_DOWN_SESSION when the client gave one and it does not work
    /// (its connection is gone, or a call to it failed).
    pub fn back_channel_flags(&self) -> u32 {
        match self.back_channel().as_ref() {
            Some(b) if b.wanted && !b.usable() => {
                SEQ4_STATUS_CB_PATH_DOWN | SEQ4_STATUS_CB_PATH_DOWN_SESSION
            }
            _ => 0,
        }
    }

    /// Checks slot and sequence id of a SEQUENCE op.
    pub fn begin(&self, slot: u32, seqid: u32) -> Result<SlotDecision, Nfsstat4> {
        self.begin_slot(slot, seqid, None, false)
    }

    /// Like [`Session::begin`] for a request with [`request_fingerprint`]
    /// `request` whose reply the client asked to be cached or not
    /// (`cachethis`). A retransmission that is not the request the slot
    /// last executed is a false retry (RFC 8881 section 2.10.6.1.3.1):
    /// from another caller it gets NFS4ERR_SEQ_FALSE_RETRY (a MUST there),
    /// as does one whose original asked for its reply to be cached. When
    /// the original did not ask for caching, the server need not have
    /// kept anything to compare with, and the answer is
    /// NFS4ERR_RETRY_UNCACHED_REP (section 2.10.6.1.3): clients that reuse
    /// the sequence id of a request they abandoned (nfs-rs 0.8.7 does, for
    /// READs past the end of a file) then move on to the next one.
    pub fn begin_request(
        &self,
        slot: u32,
        seqid: u32,
        request: Fingerprint,
        cachethis: bool,
    ) -> Result<SlotDecision, Nfsstat4> {
        self.begin_slot(slot, seqid, Some(request), cachethis)
    }

    fn begin_slot(
        &self,
        slot: u32,
        seqid: u32,
        request: Option<Fingerprint>,
        cachethis: bool,
    ) -> Result<SlotDecision, Nfsstat4> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots.get_mut(slot as usize).ok_or(status::BADSLOT)?;
        if seqid == s.seqid.wrapping_add(1) {
            if s.busy {
                return Err(status::DELAY);
            }
            s.busy = true;
            s.seqid = seqid;
            s.reply = None;
            s.request = request;
            s.cachethis = cachethis;
            Ok(SlotDecision::Execute)
        } else if seqid == s.seqid {
            if s.busy {
                return Err(status::DELAY);
            }
            if let (Some(was), Some(now)) = (s.request, request) {
                if was.caller != now.caller {
                    return Err(status::SEQ_FALSE_RETRY);
                }
                if was.ops != now.ops {
                    return if s.cachethis {
                        Err(status::SEQ_FALSE_RETRY)
                    } else {
                        Ok(SlotDecision::Uncached)
                    };
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
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get_mut(slot as usize) {
            s.busy = false;
            s.reply = reply.filter(|r| r.len() <= self.slot_bytes);
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

/// A slot in use by one request: dropped without [`SlotGuard::finish`]
/// (the request panicked, or was given up), it frees the slot with no
/// reply kept, so a retry gets NFS4ERR_RETRY_UNCACHED_REP and the next
/// sequence id runs, instead of NFS4ERR_DELAY until the session ends.
#[derive(Debug)]
pub struct SlotGuard {
    session: Arc<Session>,
    slot: u32,
    done: bool,
}

impl SlotGuard {
    /// Takes charge of `slot` of `session`, for which
    /// [`Session::begin_request`] answered [`SlotDecision::Execute`].
    pub fn new(session: Arc<Session>, slot: u32) -> Self {
        SlotGuard {
            session,
            slot,
            done: false,
        }
    }

    /// The session.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Frees the slot, keeping `reply` for retransmissions.
    pub fn finish(mut self, reply: Option<Arc<Vec<u8>>>) {
        self.done = true;
        self.session.finish(self.slot, reply);
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !self.done {
            self.session.finish(self.slot, None);
        }
    }
}
