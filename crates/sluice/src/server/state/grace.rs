//! The grace period (RFC 8881 sections 8.4.2 and 8.4.3, 18.51).
//!
//! After every start, the clients recorded in the previous epoch may
//! reclaim the opens and locks they held (OPEN with CLAIM_PREVIOUS, LOCK
//! with reclaim set) until they send RECLAIM_COMPLETE; meanwhile nobody
//! may take new opens or locks (NFS4ERR_GRACE), so no reclaim can meet a
//! conflict. Grace ends when its time is up, or as soon as every client
//! known from before has sent RECLAIM_COMPLETE or has been judged gone.
//!
//! On a node of a cluster, grace is the cluster's: it begins whenever any
//! node starts or dies and ends when the store says so (see
//! `crate::cluster`). The node's own part (its clients from before its
//! start reclaiming) ends by the same rules as above, which it tells the
//! store; meanwhile every node enforces grace.

use super::recovery::{ClusterGrace, EpochStart};
use super::StateTable;
use crate::nfs4::consts::status;
use crate::nfs4::Nfsstat4;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Why the grace period ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraceEnd {
    /// No client was known from before the start.
    NoClients,
    /// Every known client sent RECLAIM_COMPLETE or was judged gone.
    AllReclaimed,
    /// The grace time ran out.
    Timeout,
}

impl GraceEnd {
    fn describe(self) -> &'static str {
        match self {
            GraceEnd::NoClients => "no clients to reclaim",
            GraceEnd::AllReclaimed => "every client known from before has reclaimed",
            GraceEnd::Timeout => "grace time ran out",
        }
    }
}

/// Where the grace period stands.
#[derive(Debug, Default)]
pub(super) struct Grace {
    active: bool,
    started: Option<Instant>,
    ends: Option<Instant>,
    /// Owners that may reclaim and have not sent RECLAIM_COMPLETE.
    waiting: HashSet<Vec<u8>>,
    /// Owners that may reclaim in this grace period.
    known: HashSet<Vec<u8>>,
    /// When NLM hosts known from before may no longer reclaim (None: there
    /// were none). NLM has no RECLAIM_COMPLETE, so theirs is a grace
    /// period of its own that runs its whole time; it holds back new locks
    /// (NLM and NFSv4) but not NFSv4 opens, as on the Linux server.
    nlm_ends: Option<Instant>,
    /// Set on a node of a cluster: grace begins and ends with the
    /// cluster's, and `waiting` holds only this node's own clients.
    cluster: Option<ClusterGrace>,
    /// This node's part of the cluster's grace is over (told the store).
    own_done: bool,
}

/// Grace as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraceStatus {
    /// Still in grace.
    pub active: bool,
    /// Clients known from before that have not finished reclaiming.
    pub waiting: usize,
}

impl Grace {
    /// Grace after a start with `epoch`, lasting at most `length`.
    pub(super) fn begin(epoch: &EpochStart, length: Duration, now: Instant) -> Self {
        let is_nlm = |r: &Vec<u8>| r.starts_with(super::nlm::HOST_RECORD);
        let known: HashSet<Vec<u8>> = epoch
            .reclaimable
            .iter()
            .filter(|r| !is_nlm(r))
            .cloned()
            .collect();
        if let Some(c) = &epoch.cluster {
            let mine: HashSet<Vec<u8>> = c.mine.iter().filter(|r| !is_nlm(r)).cloned().collect();
            let nlm = c.mine.iter().any(is_nlm);
            return Grace {
                active: epoch.recovery != 0,
                started: Some(now),
                ends: Some(now + length),
                waiting: mine,
                known,
                nlm_ends: nlm.then_some(now + length),
                cluster: Some(c.clone()),
                own_done: epoch.recovery == 0,
            };
        }
        let nlm = epoch.reclaimable.iter().any(is_nlm);
        Grace {
            active: true,
            started: Some(now),
            ends: Some(now + length),
            waiting: known.clone(),
            known,
            nlm_ends: nlm.then_some(now + length),
            cluster: None,
            own_done: false,
        }
    }

    /// True while NLM hosts known from before may reclaim (see
    /// [`Grace::nlm_ends`]).
    pub(super) fn nlm_active_at(&self, now: Instant) -> bool {
        self.nlm_ends.is_some_and(|e| now < e)
    }

    /// True while new opens and locks must wait: grace has not been
    /// ended and somebody may still reclaim. When its time is up, grace
    /// ends only in [`StateTable::grace_check_end`], once the record store
    /// has it (the expiry round wakes for that moment), as on the Linux
    /// server: were the clock alone to end it, a newcomer could be granted
    /// state that a client who missed this grace would still reclaim
    /// after a restart that came before the store knew (RFC 8881 section
    /// 8.4.3, edge condition 2).
    pub(super) fn active(&self) -> bool {
        if self.cluster.is_some() {
            // The cluster's grace ends when the store says so.
            return self.active;
        }
        self.active && !self.waiting.is_empty()
    }

    /// True when this node of a cluster cannot reach the store.
    fn isolated(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.isolated.load(Ordering::Acquire))
    }

    /// False while some node of the cluster does not enforce grace yet.
    fn ready(&self) -> bool {
        self.cluster
            .as_ref()
            .is_none_or(|c| c.ready.load(Ordering::Acquire))
    }

    /// Time until grace runs out, while it has not been ended.
    pub(super) fn time_left(&self, now: Instant) -> Option<Duration> {
        // A cluster node's own part, once over, has nothing left to time.
        let timing = self.active && !(self.cluster.is_some() && self.own_done);
        self.ends
            .filter(|_| timing)
            .map(|e| e.saturating_duration_since(now))
    }

    /// True when `owner` was known before the start: it may reclaim.
    pub(super) fn may_reclaim(&self, owner: &[u8]) -> bool {
        self.active && self.known.contains(owner)
    }

    /// `owner` sent RECLAIM_COMPLETE, or is gone.
    pub(super) fn client_done(&mut self, owner: &[u8]) {
        self.waiting.remove(owner);
    }
}

impl StateTable {
    /// Ends grace when it is due; logs why and drops the recovery epoch.
    pub(super) fn grace_check_end(&self, inner: &mut super::Inner, now: Instant) {
        let g = &mut inner.grace;
        if !g.active {
            return;
        }
        if g.cluster.is_some() {
            // Only this node's part ends here; the cluster's grace ends
            // when every node's has (cluster_grace_end).
            if g.own_done || !(g.waiting.is_empty() || g.ends.is_some_and(|e| now >= e)) {
                return;
            }
            g.own_done = true;
            tracing::info!(
                lasted_ms = g.started.map_or(0, |s| now.saturating_duration_since(s).as_millis() as u64),
                not_reclaimed = g.waiting.len(),
                "this node's clients from before its start are done reclaiming; grace goes on until every node's are"
            );
            g.waiting.clear();
            if let Err(e) = self.recovery.end_grace() {
                tracing::error!(error = %e, "cannot tell the cluster that this node's grace is over");
            }
            return;
        }
        let why = if g.known.is_empty() {
            GraceEnd::NoClients
        } else if g.waiting.is_empty() {
            GraceEnd::AllReclaimed
        } else if g.ends.is_some_and(|e| now >= e) {
            GraceEnd::Timeout
        } else {
            return;
        };
        g.active = false;
        let lasted = g.started.map(|s| now.saturating_duration_since(s));
        if why == GraceEnd::NoClients {
            match g.nlm_ends {
                Some(e) => tracing::info!(
                    nlm_grace_ms = e.saturating_duration_since(now).as_millis() as u64,
                    "no NFSv4 clients known from before this start; NLM hosts are: new locks wait for their grace period"
                ),
                None => tracing::info!("no grace period: no clients known from before this start"),
            }
        } else {
            tracing::info!(
                reason = why.describe(),
                lasted_ms = lasted.map_or(0, |d| d.as_millis() as u64),
                known = g.known.len(),
                not_reclaimed = g.waiting.len(),
                "grace period ended"
            );
        }
        g.waiting.clear();
        if let Err(e) = self.recovery.end_grace() {
            tracing::error!(error = %e, "cannot end grace in the client record store");
        }
    }

    /// A node of the cluster started or died: grace begins here too, and
    /// the clients in `reclaimable` (those of every node in the recovery
    /// epoch) may reclaim on this node until the cluster's grace ends.
    /// Nothing that this node's clients hold is touched.
    pub fn cluster_grace_begin(&self, reclaimable: &[Vec<u8>]) {
        let mut inner = self.lock();
        let g = &mut inner.grace;
        if g.cluster.is_none() {
            return;
        }
        let is_nlm = |r: &&Vec<u8>| r.starts_with(super::nlm::HOST_RECORD);
        let known: HashSet<Vec<u8>> = reclaimable.iter().filter(|r| !is_nlm(r)).cloned().collect();
        if g.active {
            // Another node's start or death within the same grace period:
            // its clients may reclaim too.
            g.known.extend(known);
            return;
        }
        let now = Instant::now();
        *g = Grace {
            active: true,
            started: Some(now),
            ends: None,
            waiting: HashSet::new(),
            known,
            nlm_ends: None,
            cluster: g.cluster.take(),
            own_done: true,
        };
        tracing::info!(
            clients = g.known.len(),
            "cluster grace period started: no new opens or locks; clients known from before may reclaim here"
        );
    }

    /// The cluster's grace period is over.
    pub fn cluster_grace_end(&self) {
        let mut inner = self.lock();
        let now = Instant::now();
        let g = &mut inner.grace;
        if g.cluster.is_none() || !g.active {
            return;
        }
        g.active = false;
        g.own_done = true;
        tracing::info!(
            lasted_ms = g
                .started
                .map_or(0, |s| now.saturating_duration_since(s).as_millis() as u64),
            known = g.known.len(),
            "cluster grace period ended"
        );
        g.waiting.clear();
    }

    /// The grace period as it stands now.
    pub fn grace_status(&self) -> GraceStatus {
        let inner = self.lock();
        let active = inner.grace.active();
        GraceStatus {
            active,
            waiting: if active { inner.grace.waiting.len() } else { 0 },
        }
    }

    /// True while this node of a cluster cannot reach the cluster's store
    /// and so grants no new state.
    pub fn cluster_isolated(&self) -> bool {
        self.lock().grace.isolated()
    }

    /// NFS4ERR_GRACE while in grace: for ops that would take or change
    /// state that a reclaim might conflict with (REMOVE, RENAME, I/O with
    /// a special stateid). Never waits (no store write).
    pub fn check_not_in_grace(&self) -> Result<(), Nfsstat4> {
        if self.lock().grace.active() {
            Err(status::GRACE)
        } else {
            Ok(())
        }
    }

    /// Logs the start of grace (called once the server is up).
    pub fn log_grace_start(&self) {
        let inner = self.lock();
        if inner.grace.active {
            tracing::info!(
                clients = inner.grace.known.len(),
                seconds = self.settings.grace.as_secs_f64(),
                "grace period started: clients known from before may reclaim their state"
            );
        }
    }

    /// Checks that `clientid` may reclaim now (RFC 8881 sections 8.4.2.1,
    /// 18.16.3, 18.10.3): NFS4ERR_NO_GRACE outside grace or after its
    /// RECLAIM_COMPLETE, NFS4ERR_RECLAIM_BAD when it held nothing before
    /// the start (no stable record).
    pub(super) fn check_reclaim(
        &self,
        inner: &super::Inner,
        clientid: u64,
    ) -> Result<(), Nfsstat4> {
        let c = inner.clients.get(&clientid).ok_or(status::STALE_CLIENTID)?;
        if !inner.grace.active() || c.reclaim_complete {
            return Err(status::NO_GRACE);
        }
        if !c.reclaimable {
            return Err(status::RECLAIM_BAD);
        }
        if inner.grace.isolated() {
            // Out of touch with the cluster, whose grace may be over.
            return Err(status::DELAY);
        }
        if !inner.grace.ready() {
            // Some node may still grant what this reclaim would conflict
            // with; it will not once it sees the grace period.
            return Err(status::DELAY);
        }
        Ok(())
    }

    /// NFS4ERR_GRACE for a new open or lock while in grace.
    pub(super) fn check_new_state(&self, inner: &super::Inner) -> Result<(), Nfsstat4> {
        if inner.grace.active() {
            Err(status::GRACE)
        } else if inner.grace.isolated() {
            // Out of touch with the cluster: another node may be granting
            // state on the same files after a grace period this node did
            // not see.
            Err(status::DELAY)
        } else {
            Ok(())
        }
    }

    /// Like [`StateTable::check_new_state`] for a new byte-range lock,
    /// which also waits for NLM hosts to reclaim theirs.
    pub(super) fn check_new_lock(
        &self,
        inner: &super::Inner,
        now: Instant,
    ) -> Result<(), Nfsstat4> {
        self.check_new_state(inner)?;
        if inner.grace.nlm_active_at(now) {
            Err(status::GRACE)
        } else {
            Ok(())
        }
    }

    /// Whether NLM requests meet a grace period: NFSv4's or NLM's own.
    pub fn nlm_in_grace(&self) -> bool {
        let inner = self.lock();
        let now = Instant::now();
        inner.grace.active() || inner.grace.nlm_active_at(now)
    }
}
