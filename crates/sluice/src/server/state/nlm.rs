//! NLM locks (byte-range locks of NFSv3 clients) in the same lock table
//! as NFSv4's, so that a v3 lock and a v4 lock on the same range
//! conflict both ways.
//!
//! Each NLM client host has a client id of its own, outside the range of
//! NFSv4 client ids ([`NLM_CLIENTS`]), which no lease expires: its locks
//! go when it unlocks them, when it says it restarted (SM_NOTIFY,
//! FREE_ALL), or never. Its lock owner is its name, the process id and
//! the owner handle it sends. A host is recorded in the client record
//! store (an owner starting with [`HOST_RECORD`]) before its first lock is
//! granted, so after a restart it counts among the clients of the grace
//! period and gets an SM_NOTIFY telling it to reclaim.

use super::stateids::{denied, Denied, LockRange};
use super::{FileKey, Inner, StateTable};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Client ids of NLM hosts: this value with the host's number in the low
/// 32 bits (NFSv4 client ids have the boot id there, never all ones).
pub const NLM_CLIENTS: u64 = 0xffff_ffff_0000_0000;
/// How an NLM host's client record starts: then its name, address and
/// the server's address it used, separated by NUL bytes.
pub const HOST_RECORD: &[u8] = b"nlm\0";

/// True for the client id of an NLM host.
pub fn is_nlm(clientid: u64) -> bool {
    clientid & NLM_CLIENTS == NLM_CLIENTS
}

/// An NLM client host as it reached the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlmHost {
    /// Its name for itself (caller_name).
    pub name: Vec<u8>,
    /// Its address.
    pub addr: IpAddr,
    /// The server's address it called.
    pub local: IpAddr,
}

impl NlmHost {
    /// Its client record: the name in hexadecimal (it is the client's to
    /// choose, any bytes), its address and the server's, separated by NUL
    /// bytes.
    pub fn record(&self) -> Vec<u8> {
        let mut r = HOST_RECORD.to_vec();
        for b in &self.name {
            r.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        r.push(0);
        r.extend_from_slice(self.addr.to_string().as_bytes());
        r.push(0);
        r.extend_from_slice(self.local.to_string().as_bytes());
        r
    }

    /// The host a client record names, if it is an NLM host's.
    pub fn from_record(r: &[u8]) -> Option<NlmHost> {
        let rest = r.strip_prefix(HOST_RECORD)?;
        let mut parts = rest.split(|&b| b == 0);
        let hex = parts.next()?;
        if hex.len() % 2 != 0 {
            return None;
        }
        let name = hex
            .chunks(2)
            .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let addr = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let local = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(NlmHost { name, addr, local })
    }
}

/// The lock owner bytes of an NLM owner: its name, process id and owner
/// handle, each recoverable (see [`nlm_holder`]).
pub fn owner_key(name: &[u8], svid: i32, oh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + name.len() + oh.len());
    k.extend_from_slice(&(name.len() as u32).to_be_bytes());
    k.extend_from_slice(name);
    k.extend_from_slice(&svid.to_be_bytes());
    k.extend_from_slice(oh);
    k
}

/// The holder of a conflicting lock as NLM reports it: exclusive, process
/// id, owner handle, offset, length (0: to the end of the file). An
/// NFSv4 holder shows as process 0 with its lock-owner as the handle.
pub fn nlm_holder(d: &Denied) -> (bool, i32, Vec<u8>, u64, u64) {
    let len = if d.length == u64::MAX { 0 } else { d.length };
    if is_nlm(d.clientid) && d.owner.len() >= 8 {
        let n = u32::from_be_bytes(d.owner[..4].try_into().expect("4 bytes")) as usize;
        if d.owner.len() >= 4 + n + 4 {
            let svid = i32::from_be_bytes(d.owner[4 + n..8 + n].try_into().expect("4 bytes"));
            return (d.write, svid, d.owner[8 + n..].to_vec(), d.offset, len);
        }
    }
    let mut oh = d.owner.clone();
    oh.truncate(crate::nlm::MAXNETOBJ);
    (d.write, 0, oh, d.offset, len)
}

/// The NLM hosts of the lock table.
#[derive(Debug, Default)]
pub(super) struct NlmHosts {
    /// Host number by name.
    by_name: HashMap<Vec<u8>, u32>,
    /// Hosts by number, and whether their record is written.
    hosts: HashMap<u32, (NlmHost, bool)>,
    /// The holder id of each owner (its locks' `LockRange::holder`).
    holders: HashMap<Vec<u8>, [u8; 12]>,
    next: u32,
}

/// Why an NLM request was refused before any lock was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NlmRefusal {
    /// New locks wait for the grace period's end, and reclaims come only
    /// during it.
    Grace,
    /// The host's record could not be written.
    Failed,
}

impl StateTable {
    fn nlm_host_id(&self, inner: &mut Inner, host: &NlmHost) -> u64 {
        let h = &mut inner.nlm;
        let n = match h.by_name.get(&host.name) {
            Some(&n) => n,
            None => {
                h.next = h.next.wrapping_add(1);
                let n = h.next;
                h.by_name.insert(host.name.clone(), n);
                n
            }
        };
        let entry = h.hosts.entry(n).or_insert_with(|| (host.clone(), false));
        if entry.0 != *host {
            // The same name from another address: the newer one is where
            // it is now.
            *entry = (host.clone(), false);
        }
        NLM_CLIENTS | n as u64
    }

    fn nlm_holder_id(&self, inner: &mut Inner, owner: &[u8]) -> [u8; 12] {
        if let Some(o) = inner.nlm.holders.get(owner) {
            return *o;
        }
        let o = self.new_other(inner);
        inner.nlm.holders.insert(owner.to_vec(), o);
        o
    }

    /// NLM LOCK: takes [start, end) for `owner` of `host` on `file`, or
    /// says which lock is in the way. During grace only reclaims, and
    /// reclaims only then. The host's record is written before the lock
    /// is granted.
    pub fn nlm_lock(
        &self,
        host: &NlmHost,
        owner: &[u8],
        file: FileKey,
        (start, end): (u64, u64),
        write: bool,
        reclaim: bool,
    ) -> Result<Result<(), Denied>, NlmRefusal> {
        let mut inner = self.lock();
        let now = Instant::now();
        let in_grace = inner.grace.active() || inner.grace.nlm_active_at(now);
        if in_grace != reclaim {
            return Err(NlmRefusal::Grace);
        }
        let clientid = self.nlm_host_id(&mut inner, host);
        let holders: Vec<u64> = inner
            .ids
            .lock_conflicts(clientid, owner, file, (start, end), write)
            .map(|r| r.clientid)
            .collect();
        if !self.clear_conflicts(&mut inner, holders, now) {
            let d = inner
                .ids
                .lock_conflicts(clientid, owner, file, (start, end), write)
                .next()
                .map(denied)
                .expect("a conflict was found");
            return Ok(Err(d));
        }
        let n = (clientid & 0xffff_ffff) as u32;
        if let Some((h, recorded)) = inner.nlm.hosts.get_mut(&n) {
            if !*recorded {
                if let Err(e) = self.recovery.add(&h.record()) {
                    tracing::error!(error = %e, "cannot write an NLM host's stable record");
                    return Err(NlmRefusal::Failed);
                }
                *recorded = true;
            }
        }
        if reclaim {
            self.counters
                .reclaims
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let holder = self.nlm_holder_id(&mut inner, owner);
        inner.ids.subtract(file, &holder, start, end);
        inner.ids.push_range(
            file,
            LockRange {
                holder,
                clientid,
                owner: owner.to_vec(),
                start,
                end,
                write,
            },
        );
        Ok(Ok(()))
    }

    /// NLM TEST: the lock in the way of [start, end), if any.
    pub fn nlm_test(
        &self,
        host: &NlmHost,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
    ) -> Result<Option<Denied>, NlmRefusal> {
        let mut inner = self.lock();
        let now = Instant::now();
        if inner.grace.active() || inner.grace.nlm_active_at(now) {
            return Err(NlmRefusal::Grace);
        }
        let clientid = self.nlm_host_id(&mut inner, host);
        // Locks of courtesy clients do not count: a LOCK would expire
        // them.
        let found = inner
            .ids
            .lock_conflicts(clientid, owner, file, range, write)
            .find(|r| !self.expirable(&inner, r.clientid, now))
            .map(denied);
        Ok(found)
    }

    /// The NLM owners whose locks keep [start, end) from `owner` (of
    /// `host`), for deadlock detection.
    pub fn nlm_blockers(
        &self,
        owner: &[u8],
        file: FileKey,
        range: (u64, u64),
        write: bool,
    ) -> Vec<Vec<u8>> {
        let inner = self.lock();
        // The requester's own client id does not matter here: conflicts
        // are between owners, and NLM owners carry their host's name.
        inner
            .ids
            .lock_conflicts(u64::MAX, owner, file, range, write)
            .filter(|r| is_nlm(r.clientid) && r.owner != owner)
            .map(|r| r.owner.clone())
            .collect()
    }

    /// NLM UNLOCK: gives up [start, end) of `owner`'s locks on `file`.
    pub fn nlm_unlock(&self, owner: &[u8], file: FileKey, (start, end): (u64, u64)) {
        let mut inner = self.lock();
        if let Some(holder) = inner.nlm.holders.get(owner).copied() {
            inner.ids.subtract(file, &holder, start, end);
        }
    }

    /// Whether `owner` holds all of [start, end) on `file` the way it
    /// asks (a retransmitted or re-sent LOCK that was granted meanwhile).
    pub fn nlm_holds(
        &self,
        owner: &[u8],
        file: FileKey,
        (start, end): (u64, u64),
        write: bool,
    ) -> bool {
        let inner = self.lock();
        let Some(holder) = inner.nlm.holders.get(owner) else {
            return false;
        };
        inner
            .ids
            .ranges_of(file)
            .iter()
            .any(|r| &r.holder == holder && r.start <= start && end <= r.end && r.write == write)
    }

    /// Forgets every lock of the NLM host named `name` (or, when none has
    /// that name, of the hosts at `addr`): the host restarted (SM_NOTIFY or
    /// FREE_ALL). Its record goes too. Returns the files that had locks of
    /// its.
    pub fn nlm_forget_host(&self, name: &[u8], addr: Option<IpAddr>) -> Vec<FileKey> {
        let mut inner = self.lock();
        // By name; by address only when no host has that name (several
        // clients behind one address must not lose each other's locks).
        let pick = |by_addr: bool| -> Vec<(u32, NlmHost)> {
            inner
                .nlm
                .hosts
                .iter()
                .filter(|(_, (h, _))| {
                    if by_addr {
                        Some(h.addr) == addr
                    } else {
                        h.name == name
                    }
                })
                .map(|(n, (h, _))| (*n, h.clone()))
                .collect()
        };
        let mut gone = pick(false);
        if gone.is_empty() {
            gone = pick(true);
        }
        let mut files = Vec::new();
        for (n, h) in gone {
            let clientid = NLM_CLIENTS | n as u64;
            files.extend(inner.ids.remove_ranges_of(clientid));
            inner.nlm.hosts.remove(&n);
            inner.nlm.by_name.remove(&h.name);
            if let Err(e) = self.recovery.remove(&h.record()) {
                tracing::warn!(error = %e, "cannot remove an NLM host's stable record");
            }
            tracing::info!(host = %String::from_utf8_lossy(&h.name), addr = %h.addr, "NLM host restarted: its locks are released");
        }
        files.sort_unstable();
        files.dedup();
        files
    }

    /// The NLM hosts recorded before this start (to be told to reclaim).
    pub fn nlm_hosts_from_before(&self) -> Vec<NlmHost> {
        // On a node of a cluster, only the hosts that locked here.
        let records = match &self.epoch.cluster {
            Some(c) => &c.mine,
            None => &self.epoch.reclaimable,
        };
        records
            .iter()
            .filter_map(|r| NlmHost::from_record(r))
            .collect()
    }

    /// This start's NSM state number: odd, and higher than every earlier
    /// start's.
    pub fn nsm_state(&self) -> i32 {
        (self.epoch.current.wrapping_mul(2).wrapping_add(1) & 0x7fff_ffff) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn host(name: &str) -> NlmHost {
        NlmHost {
            name: name.as_bytes().to_vec(),
            addr: "192.0.2.1".parse().unwrap(),
            local: "192.0.2.9".parse().unwrap(),
        }
    }

    #[test]
    fn records_round_trip() {
        let h = host("client-a");
        assert_eq!(NlmHost::from_record(&h.record()), Some(h));
        assert_eq!(NlmHost::from_record(b"not an nlm record"), None);
        // A name with NUL bytes cannot change the addresses recorded.
        let sly = NlmHost {
            name: b"sly\x00198.51.100.7\x00198.51.100.8".to_vec(),
            ..host("x")
        };
        assert_eq!(NlmHost::from_record(&sly.record()), Some(sly));
    }

    #[test]
    fn owners_conflict_with_others_and_never_with_themselves() {
        let t = StateTable::new(Duration::from_secs(90), 1);
        let a = owner_key(b"a", 1, b"oh");
        let b = owner_key(b"b", 1, b"oh");
        let file = (1, 2);
        assert_eq!(
            t.nlm_lock(&host("a"), &a, file, (0, 100), true, false),
            Ok(Ok(()))
        );
        // Upgrading, splitting and extending its own lock.
        assert_eq!(
            t.nlm_lock(&host("a"), &a, file, (50, 200), false, false),
            Ok(Ok(()))
        );
        let d = t
            .nlm_lock(&host("b"), &b, file, (10, 20), false, false)
            .unwrap()
            .unwrap_err();
        assert_eq!((d.offset, d.write), (0, true));
        assert_eq!(nlm_holder(&d).1, 1);
        // Shared with shared.
        assert_eq!(
            t.nlm_lock(&host("b"), &b, file, (60, 70), false, false),
            Ok(Ok(()))
        );
        assert!(t.nlm_holds(&b, file, (60, 70), false));
        t.nlm_unlock(&a, file, (0, u64::MAX));
        assert_eq!(
            t.nlm_lock(&host("b"), &b, file, (0, 50), true, false),
            Ok(Ok(()))
        );
        assert_eq!(t.nlm_forget_host(b"b", None), vec![file]);
        assert_eq!(
            t.nlm_lock(&host("a"), &a, file, (0, 50), true, false),
            Ok(Ok(()))
        );
        // A reclaim outside grace is refused.
        assert_eq!(
            t.nlm_lock(&host("a"), &a, file, (0, 50), true, true),
            Err(NlmRefusal::Grace)
        );
    }
}
