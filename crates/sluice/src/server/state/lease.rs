//! Leases (RFC 8881 section 8.3) and courtesy.
//!
//! A client renews its lease with every SEQUENCE. When the lease runs out
//! the server may release the client's state; like the Linux server since
//! 6.2, sluice keeps it instead ("courtesy") for as long as nobody
//! conflicts with it (and at most [`super::Limits::courtesy`]): a client
//! cut off for a while comes back to find its opens and locks intact. The
//! first request that conflicts with a courtesy client's share reservation
//! or lock expires that client on the spot and goes on.

use super::{Inner, StateTable};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl StateTable {
    /// True when `id`'s lease has run out: its state gives way to others.
    pub(super) fn expirable(&self, inner: &Inner, id: u64, now: Instant) -> bool {
        // NLM hosts have no lease: their locks stay until they go.
        if super::nlm::is_nlm(id) {
            return false;
        }
        inner.clients.get(&id).is_none_or(|c| {
            c.courtesy.is_some()
                || now.saturating_duration_since(c.last_renew) > self.settings.lease
        })
    }

    /// Expires a client: its sessions, state and stable record go.
    pub(super) fn expire_client(&self, inner: &mut Inner, id: u64, why: &str) {
        if let Some(c) = inner.clients.get(&id) {
            tracing::info!(
                clientid = id,
                owner = %String::from_utf8_lossy(&c.owner),
                reason = why,
                "client expired"
            );
        }
        self.remove_client(inner, id, true);
        self.counters.expired.fetch_add(1, Ordering::Relaxed);
    }

    /// Expires clients whose lease ran out; returns how many.
    pub fn expire(&self) -> usize {
        self.expire_at(Instant::now())
    }

    /// Lease bookkeeping as of `now`:
    /// - unconfirmed records not confirmed within a lease go (RFC 8881
    ///   section 18.35.4 says they SHOULD);
    /// - confirmed clients silent for a lease and a half (a margin for
    ///   clients that renew late) go when they hold no state, and become
    ///   courtesy clients when they do;
    /// - courtesy clients go after [`super::Limits::courtesy`].
    ///
    /// Also ends grace when it is due. Returns how many clients went.
    pub fn expire_at(&self, now: Instant) -> usize {
        let mut inner = self.lock();
        self.grace_check_end(&mut inner, now);
        self.revoke_unreturned(&mut inner, now);
        let lease = self.settings.lease;
        let confirmed_limit = lease + lease / 2;
        let courtesy_limit = self.settings.limits.courtesy;
        let mut dead = Vec::new();
        let mut unconfirmed = Vec::new();
        let mut courteous = Vec::new();
        for (id, c) in &inner.clients {
            let silent = now.saturating_duration_since(c.last_renew);
            if !c.confirmed {
                if silent > lease {
                    unconfirmed.push(*id);
                }
            } else if let Some(since) = c.courtesy {
                if now.saturating_duration_since(since) > courtesy_limit {
                    dead.push((*id, "courtesy time ran out"));
                }
            } else if silent > confirmed_limit {
                // With locks on a shared file system, other nodes' clients
                // cannot make a courtesy client give its locks up: it goes.
                let shared_locks = self.settings.shared_locks && inner.ids.client_has_locks(*id);
                if shared_locks {
                    dead.push((*id, "lease ran out (its locks are shared with other nodes)"));
                } else if inner.ids.client_has_state(*id) || inner.delegs.client_has(*id) {
                    courteous.push(*id);
                } else {
                    dead.push((*id, "lease ran out"));
                }
            }
        }
        for id in courteous {
            if let Some(c) = inner.clients.get_mut(&id) {
                tracing::info!(
                    clientid = id,
                    "lease ran out: the client keeps its state until somebody conflicts with it"
                );
                c.courtesy = Some(now);
            }
        }
        for id in &unconfirmed {
            self.remove_client(&mut inner, *id, true);
        }
        for (id, why) in &dead {
            self.expire_client(&mut inner, *id, why);
        }
        dead.len() + unconfirmed.len()
    }

    /// How long the expiry task may sleep before its next round: a
    /// quarter lease (between 250 ms and 15 s), and no later than the end
    /// of grace, which the round records in the client record store.
    pub fn expiry_interval(&self) -> Duration {
        let normal =
            (self.settings.lease / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
        let inner = self.lock();
        match inner.grace.time_left(Instant::now()) {
            Some(left) => normal.min(left + Duration::from_millis(10)),
            None => normal,
        }
    }
}
