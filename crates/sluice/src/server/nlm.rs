//! NLM version 4 (byte-range locks for NFSv3 clients) and the server's
//! side of NSM (the status monitor), as the Open Group's XNFS specifies
//! them and the Linux server answers.
//!
//! - NLM locks live in the state table with NFSv4's (see
//!   `state::nlm`), so v3 and v4 locks conflict both ways.
//! - A blocking LOCK that meets a conflict is answered NLM4_BLOCKED and
//!   queued. When the conflict goes (UNLOCK, or the holder's host
//!   restarting) the lock is granted and the client told with an
//!   NLM4_GRANTED call to its lock manager, found through its
//!   portmapper. A client that missed that call re-sends its LOCK and
//!   gets NLM4_GRANTED, since it holds the lock.
//! - After a start, during the grace period (NFSv4's, or NLM's own when
//!   NLM hosts held locks before), only reclaims (LOCK with `reclaim`) are
//!   granted, and TEST, CANCEL, UNLOCK, UNSHARE and new locks get
//!   NLM4_DENIED_GRACE_PERIOD, as from the Linux server. Every host that
//!   held locks before is sent SM_NOTIFY with the server's new state
//!   number, which makes its lock manager reclaim.
//! - An SM_NOTIFY (or FREE_ALL) from a client that restarted releases
//!   all its locks.
//! - SHARE and UNSHARE keep DOS share reservations, which conflict only
//!   with each other.
//! - The asynchronous requests (TEST_MSG, LOCK_MSG, CANCEL_MSG,
//!   UNLOCK_MSG), which macOS's lock manager sends, do what their
//!   synchronous twins do. The call itself is answered with nothing; the
//!   results go to the caller's lock manager in a call of their own
//!   (TEST_RES, LOCK_RES, CANCEL_RES, UNLOCK_RES), found through the
//!   caller's portmapper, over the transport the request came by, as
//!   the Linux server sends them.

use super::state::nlm::{nlm_holder, owner_key, NlmHost, NlmRefusal};
use super::state::FileKey;
use super::Server;
use crate::engine::cred;
use crate::engine::fs;
use crate::engine::handle::HandleError;
use crate::mount::{pmapproc, IPPROTO_TCP, IPPROTO_UDP, NLM_PROGRAM, NSM_PROGRAM, PMAP_PROGRAM};
use crate::nlm::{
    async_request, nlmproc, nlmstat, smproc, Nlm4Lock, NlmArgs, NsmArgs, NLM_VERSION, NSM_VERSION,
};
use crate::rpc::{self, Cred};
use crate::xdr::{Decoder, Encoder};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What became of an NLM or NSM call.
pub(super) enum DoneNlm {
    /// The results.
    Reply(Encoder),
    /// GARBAGE_ARGS.
    Garbage,
    /// PROC_UNAVAIL.
    NoProc,
}

/// How long a blocked LOCK waits in the queue without being sent again
/// (Linux clients send it again every 30 s).
const BLOCKED_KEEP: Duration = Duration::from_secs(120);
/// Most blocked LOCKs queued at once.
const BLOCKED_MAX: usize = 4096;
/// Time allowed for each call to a client (portmapper, lock manager,
/// status monitor).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most results of asynchronous requests being sent at once; past it a
/// result is dropped (the client sends its request again).
const RESULTS_MAX: usize = 64;

/// A LOCK waiting for its conflict to go.
#[derive(Debug, Clone)]
struct Blocked {
    host: NlmHost,
    owner: Vec<u8>,
    file: FileKey,
    range: (u64, u64),
    write: bool,
    /// What the GRANTED call repeats: cookie, file handle, owner handle,
    /// process, offset and length as the client sent them.
    cookie: Vec<u8>,
    fh: Vec<u8>,
    oh: Vec<u8>,
    svid: i32,
    offset: u64,
    len: u64,
    since: Instant,
}

/// The NLM side of a server: blocked locks and where to find clients'
/// status monitors.
#[derive(Debug, Default)]
pub struct NlmServer {
    blocked: Mutex<Vec<Blocked>>,
    shares: Mutex<Vec<Share>>,
    /// Test only: the portmapper to ask for every client's lock manager
    /// and status monitor (instead of port 111 at the client's address).
    pub portmap: Option<SocketAddr>,
    /// NLM4_GRANTED calls a client's lock manager accepted.
    pub granted_sent: AtomicU64,
    /// SM_NOTIFY calls a client's status monitor answered.
    pub notify_sent: AtomicU64,
    /// Results of asynchronous requests (the _RES calls) sent to a
    /// client's lock manager.
    pub results_sent: AtomicU64,
    /// Those being sent now.
    results_sending: AtomicUsize,
}

impl NlmServer {
    /// An NLM server that finds clients' services through `portmap` when
    /// given (tests), else through each client's own portmapper.
    pub fn new(portmap: Option<SocketAddr>) -> Self {
        NlmServer {
            blocked: Mutex::new(Vec::new()),
            shares: Mutex::new(Vec::new()),
            portmap,
            granted_sent: AtomicU64::new(0),
            notify_sent: AtomicU64::new(0),
            results_sent: AtomicU64::new(0),
            results_sending: AtomicUsize::new(0),
        }
    }

    /// Blocking LOCKs waiting for a conflicting lock to go.
    pub fn waiting(&self) -> usize {
        self.blocked().len()
    }

    fn blocked(&self) -> std::sync::MutexGuard<'_, Vec<Blocked>> {
        self.blocked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The half-open range of an NLM lock, or NLM4_FBIG past 2^63 - 1 (what
/// the Linux server accepts).
fn range(offset: u64, len: u64) -> Result<(u64, u64), u32> {
    const MAX: u64 = i64::MAX as u64;
    if offset > MAX {
        return Err(nlmstat::FBIG);
    }
    if len == 0 {
        return Ok((offset, u64::MAX));
    }
    match offset.checked_add(len) {
        Some(end) if end - 1 <= MAX => Ok((offset, end)),
        _ => Err(nlmstat::FBIG),
    }
}

/// The file an NLM call names: its (device, inode) key, its O_PATH
/// descriptor and status, and its export's rules.
struct NlmFile<'a> {
    key: FileKey,
    fd: Arc<std::os::fd::OwnedFd>,
    st: fs::Stat,
    rules: &'a super::exports::Rules,
}

fn file_of<'a>(srv: &'a Server, fh: &[u8], peer: Option<IpAddr>) -> Result<NlmFile<'a>, u32> {
    let (fd, loc) = match srv.exports.resolve(fh) {
        Ok(r) => r,
        Err(HandleError::Bad) | Err(HandleError::Stale) => return Err(nlmstat::STALE_FH),
    };
    let super::exports::Loc::Export(i) = loc else {
        return Err(nlmstat::STALE_FH);
    };
    let rules = &srv.exports.list()[i].rules;
    if !rules.admits(peer) {
        return Err(nlmstat::FAILED);
    }
    let st = fs::stat(fd.as_fd()).map_err(|_| nlmstat::STALE_FH)?;
    Ok(NlmFile {
        key: (st.dev, st.ino),
        fd,
        st,
        rules,
    })
}

/// Whether the caller may lock the file as it asks: as on the Linux
/// server, which opens the file for the lock with the caller's identity
/// (for reading for a shared lock, for writing for an exclusive one), a
/// caller that could not open it gets NLM4_FAILED, and so does a lock of
/// anything but a regular file, and an exclusive lock on a read-only
/// export. The owner of a file may lock it whatever its mode bits say.
fn may_lock(srv: &Server, f: &NlmFile<'_>, cred: &Cred, exclusive: bool) -> Result<(), u32> {
    if !f.st.is_file() || (exclusive && f.rules.read_only) {
        return Err(nlmstat::FAILED);
    }
    let id = Server::identity(cred, f.rules);
    if id.uid == f.st.uid {
        return Ok(());
    }
    let flags = if exclusive {
        libc::O_WRONLY
    } else {
        libc::O_RDONLY
    };
    if srv.state.write_delegated(f.key) {
        // Opening the file would wait for the kernel to break the
        // delegation's lease: the mode bits decide instead.
        let bit = if exclusive { 0o2 } else { 0o4 };
        let shift = if f.st.gid == id.gid || id.groups.contains(&f.st.gid) {
            3
        } else {
            0
        };
        return if f.st.mode & (bit << shift) != 0 || id.uid == 0 {
            Ok(())
        } else {
            Err(nlmstat::FAILED)
        };
    }
    let _as = cred::assume(&id);
    fs::reopen(f.fd.as_fd(), flags)
        .map(drop)
        .map_err(|_| nlmstat::FAILED)
}

fn host_of(l: &Nlm4Lock<'_>, peer: Option<IpAddr>, local: Option<IpAddr>) -> NlmHost {
    let any = IpAddr::from([0, 0, 0, 0]);
    NlmHost {
        name: l.caller_name.to_vec(),
        addr: peer.unwrap_or(any),
        local: local.unwrap_or(any),
    }
}

/// Runs NLM version 4 procedure `proc_` for a client at `peer` that
/// reached this server at `local` (over UDP when `udp`). An asynchronous
/// request is answered with nothing, and its results are sent to the
/// client (see [`send_result`]).
pub(super) fn call_nlm(
    srv: &Server,
    proc_: u32,
    args: &[u8],
    cred: &Cred,
    peer: Option<IpAddr>,
    local: Option<IpAddr>,
    udp: bool,
) -> DoneNlm {
    let mut d = Decoder::new(args);
    let a = match NlmArgs::decode(proc_, &mut d) {
        None => return DoneNlm::NoProc,
        Some(Err(_)) => return DoneNlm::Garbage,
        Some(Ok(a)) => a,
    };
    let Some((sync, result)) = async_request(proc_) else {
        return DoneNlm::Reply(run_nlm(srv, proc_, a, cred, peer, local));
    };
    let results = run_nlm(srv, sync, a, cred, peer, local);
    match peer {
        Some(addr) => send_result(srv, addr, udp, result, results.into_inner()),
        None => tracing::debug!(
            proc_,
            "asynchronous NLM request from no address: no results sent"
        ),
    }
    DoneNlm::Reply(Encoder::new())
}

/// The results of NLM procedure `proc_` (a synchronous one) with
/// arguments `a`.
fn run_nlm(
    srv: &Server,
    proc_: u32,
    a: NlmArgs<'_>,
    cred: &Cred,
    peer: Option<IpAddr>,
    local: Option<IpAddr>,
) -> Encoder {
    let mut e = Encoder::with_capacity(128);
    let in_grace = || srv.state.nlm_in_grace();
    match a {
        NlmArgs::Null => {}
        NlmArgs::Test(cookie, exclusive, l) => {
            e.opaque(cookie);
            let r = (|| {
                if in_grace() {
                    return Err(nlmstat::DENIED_GRACE_PERIOD);
                }
                let rg = range(l.offset, l.len)?;
                let f = file_of(srv, l.fh, peer)?;
                may_lock(srv, &f, cred, exclusive)?;
                let owner = owner_key(l.caller_name, l.svid, l.oh);
                srv.state
                    .nlm_test(&host_of(&l, peer, local), &owner, f.key, rg, exclusive)
                    .map_err(|_| nlmstat::DENIED_GRACE_PERIOD)
            })();
            match r {
                Ok(None) => e.u32(nlmstat::GRANTED),
                Ok(Some(d)) => {
                    let (excl, svid, oh, offset, len) = nlm_holder(&d);
                    e.u32(nlmstat::DENIED);
                    e.bool(excl);
                    e.i32(svid);
                    e.opaque(&oh);
                    e.u64(offset);
                    e.u64(len);
                }
                Err(st) => e.u32(st),
            }
        }
        NlmArgs::Lock(cookie, block, exclusive, l, reclaim, _state) => {
            e.opaque(cookie);
            e.u32(lock(
                srv, cookie, block, exclusive, &l, reclaim, cred, peer, local,
            ));
        }
        NlmArgs::Cancel(cookie, _block, exclusive, l) => {
            e.opaque(cookie);
            let st = (|| {
                if in_grace() {
                    return Err(nlmstat::DENIED_GRACE_PERIOD);
                }
                let rg = range(l.offset, l.len)?;
                let file = file_of(srv, l.fh, peer)?.key;
                let owner = owner_key(l.caller_name, l.svid, l.oh);
                let mut q = srv.nlm.blocked();
                let before = q.len();
                q.retain(|b| {
                    !(b.owner == owner && b.file == file && b.range == rg && b.write == exclusive)
                });
                Ok(if q.len() < before {
                    nlmstat::GRANTED
                } else {
                    nlmstat::DENIED
                })
            })();
            e.u32(st.unwrap_or_else(|s| s));
        }
        NlmArgs::Unlock(cookie, l) => {
            e.opaque(cookie);
            let st = (|| {
                if in_grace() {
                    return Err(nlmstat::DENIED_GRACE_PERIOD);
                }
                let rg = range(l.offset, l.len)?;
                let file = file_of(srv, l.fh, peer)?.key;
                let owner = owner_key(l.caller_name, l.svid, l.oh);
                // The owner's own waiting request on the range goes first
                // (an UNLOCK after a GRANTED it did not see), as on the
                // Linux server.
                srv.nlm.blocked().retain(|b| {
                    !(b.owner == owner && b.file == file && b.range.0 < rg.1 && rg.0 < b.range.1)
                });
                srv.state.nlm_unlock(&owner, file, rg);
                wake(srv, &[file]);
                Ok(nlmstat::GRANTED)
            })();
            e.u32(st.unwrap_or_else(|s| s));
        }
        NlmArgs::Share(cookie, share, reclaim) => {
            e.opaque(cookie);
            let unshare = proc_ == nlmproc::UNSHARE;
            // During grace only reclaiming SHAREs go; UNSHARE waits too
            // (as on the Linux server).
            let refused = if unshare {
                in_grace()
            } else {
                in_grace() != reclaim
            };
            let st = if refused {
                nlmstat::DENIED_GRACE_PERIOD
            } else {
                match file_of(srv, share.fh, peer) {
                    Ok(f) => srv.nlm.share(f.key, &share, unshare),
                    Err(st) => st,
                }
            };
            e.u32(st);
            e.i32(0);
        }
        NlmArgs::FreeAll(name, _state) => {
            forget_host(srv, name, None);
        }
    }
    e
}

/// A DOS share reservation: the file, its owner (host name and owner
/// handle), what it denies others and what it uses.
#[derive(Debug, Clone)]
struct Share {
    file: FileKey,
    host: Vec<u8>,
    oh: Vec<u8>,
    mode: u32,
    access: u32,
}

impl NlmServer {
    /// SHARE (or UNSHARE): a share conflicts when what it uses meets what
    /// another owner's denies, or what it denies meets what another's
    /// uses (XNFS, as the Linux server).
    fn share(&self, file: FileKey, s: &crate::nlm::Nlm4Share<'_>, unshare: bool) -> u32 {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let same = |x: &Share| x.file == file && x.host == s.caller_name && x.oh == s.oh;
        if unshare {
            shares.retain(|x| !same(x));
            return nlmstat::GRANTED;
        }
        let conflict = shares.iter().any(|x| {
            !same(x) && x.file == file && (s.access & x.mode != 0 || s.mode & x.access != 0)
        });
        if conflict {
            return nlmstat::DENIED;
        }
        let full = shares.len() >= BLOCKED_MAX;
        match shares.iter_mut().find(|x| same(x)) {
            Some(x) => {
                x.mode = s.mode;
                x.access = s.access;
            }
            None if !full => shares.push(Share {
                file,
                host: s.caller_name.to_vec(),
                oh: s.oh.to_vec(),
                mode: s.mode,
                access: s.access,
            }),
            None => return nlmstat::DENIED_NOLOCKS,
        }
        nlmstat::GRANTED
    }
}

/// LOCK (and NM_LOCK): the nlm4_stats to answer.
#[allow(clippy::too_many_arguments)]
fn lock(
    srv: &Server,
    cookie: &[u8],
    block: bool,
    exclusive: bool,
    l: &Nlm4Lock<'_>,
    reclaim: bool,
    cred: &Cred,
    peer: Option<IpAddr>,
    local: Option<IpAddr>,
) -> u32 {
    let rg = match range(l.offset, l.len) {
        Ok(r) => r,
        Err(st) => return st,
    };
    let f = match file_of(srv, l.fh, peer) {
        Ok(f) => f,
        Err(st) => return st,
    };
    if let Err(st) = may_lock(srv, &f, cred, exclusive) {
        return st;
    }
    let file = f.key;
    // An NFSv4 client keeps its locks to itself under a delegation: one
    // that may hold a conflicting lock is recalled first (any lock against
    // a write delegation, an exclusive one against a read delegation), and
    // the lock waits for it.
    if !reclaim {
        if let Err((_, recalls)) = srv.state.deleg_conflicts(file, None, exclusive) {
            if !recalls.is_empty() {
                super::callback::start_recalls(recalls, |c| srv.state.sessions_of(c), &srv.metrics);
            }
            return if block {
                let owner = owner_key(l.caller_name, l.svid, l.oh);
                queue(
                    srv,
                    host_of(l, peer, local),
                    owner,
                    file,
                    rg,
                    exclusive,
                    cookie,
                    l,
                )
            } else {
                nlmstat::DENIED
            };
        }
    }
    let owner = owner_key(l.caller_name, l.svid, l.oh);
    let host = host_of(l, peer, local);
    // A LOCK sent again after it was granted (the GRANTED call missed).
    if !reclaim && srv.state.nlm_holds(&owner, file, rg, exclusive) {
        drop_blocked(srv, &owner, file, rg);
        return nlmstat::GRANTED;
    }
    match srv
        .state
        .nlm_lock(&host, &owner, file, rg, exclusive, reclaim)
    {
        Ok(Ok(())) => {
            drop_blocked(srv, &owner, file, rg);
            // A shared lock may have replaced an exclusive one of the same
            // owner: what waited for it may go now.
            if !exclusive {
                wake_file(srv, file);
            }
            nlmstat::GRANTED
        }
        Ok(Err(_)) if block => {
            if would_deadlock(srv, &owner, file, rg, exclusive) {
                return nlmstat::DEADLCK;
            }
            queue(srv, host, owner, file, rg, exclusive, cookie, l)
        }
        Ok(Err(_)) => nlmstat::DENIED,
        Err(NlmRefusal::Grace) => nlmstat::DENIED_GRACE_PERIOD,
        Err(NlmRefusal::Failed) => nlmstat::FAILED,
    }
}

/// Whether `owner` waiting for [start, end) of `file` would close a
/// circle of NLM owners each waiting for the next one's lock (XNFS
/// NLM4_DEADLCK; the Linux server asks the VFS's deadlock check).
fn would_deadlock(srv: &Server, owner: &[u8], file: FileKey, rg: (u64, u64), write: bool) -> bool {
    let waiting: Vec<Blocked> = srv.nlm.blocked().clone();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut todo = srv.state.nlm_blockers(owner, file, rg, write);
    while let Some(o) = todo.pop() {
        if o == owner {
            return true;
        }
        if seen.contains(&o) || seen.len() > 1024 {
            continue;
        }
        for b in waiting.iter().filter(|b| b.owner == o) {
            todo.extend(srv.state.nlm_blockers(&b.owner, b.file, b.range, b.write));
        }
        seen.push(o);
    }
    false
}

/// Queues a blocking LOCK (or refreshes the one queued): NLM4_BLOCKED, or
/// NLM4_DENIED_NOLOCKS when the queue is full.
#[allow(clippy::too_many_arguments)]
fn queue(
    srv: &Server,
    host: NlmHost,
    owner: Vec<u8>,
    file: FileKey,
    rg: (u64, u64),
    exclusive: bool,
    cookie: &[u8],
    l: &Nlm4Lock<'_>,
) -> u32 {
    let mut q = srv.nlm.blocked();
    let now = Instant::now();
    q.retain(|b| now.saturating_duration_since(b.since) < BLOCKED_KEEP);
    let full = q.len() >= BLOCKED_MAX;
    match q
        .iter_mut()
        .find(|b| b.owner == owner && b.file == file && b.range == rg)
    {
        Some(b) => {
            b.since = now;
            b.write = exclusive;
            b.cookie = cookie.to_vec();
        }
        None if full => return nlmstat::DENIED_NOLOCKS,
        None => q.push(Blocked {
            host,
            owner,
            file,
            range: rg,
            write: exclusive,
            cookie: cookie.to_vec(),
            fh: l.fh.to_vec(),
            oh: l.oh.to_vec(),
            svid: l.svid,
            offset: l.offset,
            len: l.len,
            since: now,
        }),
    }
    nlmstat::BLOCKED
}

fn drop_blocked(srv: &Server, owner: &[u8], file: FileKey, rg: (u64, u64)) {
    srv.nlm
        .blocked()
        .retain(|b| !(b.owner == owner && b.file == file && b.range == rg));
}

/// Tries every waiting LOCK again (with lease expiry): conflicts can also
/// go without a call that wakes them, when a delegation is revoked or a
/// courtesy client in the way is expired, which trying does.
pub fn retry_blocked(srv: &Server) {
    let mut files: Vec<FileKey> = srv.nlm.blocked().iter().map(|b| b.file).collect();
    if files.is_empty() {
        return;
    }
    files.sort_unstable();
    files.dedup();
    wake(srv, &files);
}

/// After an NFSv4 lock on `file` went or changed (LOCKU, a LOCK that
/// changed a range's type): grants the NLM locks that waited for it.
pub(super) fn wake_file(srv: &Server, file: FileKey) {
    if !srv.nlm.blocked().is_empty() {
        wake(srv, &[file]);
    }
}

/// Grants the blocked LOCKs on `files` whose conflicts are gone, and
/// tells their clients (NLM4_GRANTED, on threads of their own).
fn wake(srv: &Server, files: &[FileKey]) {
    let waiting: Vec<Blocked> = srv
        .nlm
        .blocked()
        .iter()
        .filter(|b| files.contains(&b.file))
        .cloned()
        .collect();
    for b in waiting {
        // One that waits for a delegation's recall waits on (the
        // delegation's return or revocation wakes it).
        if srv.state.deleg_conflicts(b.file, None, b.write).is_err() {
            continue;
        }
        if let Ok(Ok(())) = srv
            .state
            .nlm_lock(&b.host, &b.owner, b.file, b.range, b.write, false)
        {
            drop_blocked(srv, &b.owner, b.file, b.range);
            // In-process servers (tests, fuzzing) grant without calling.
            let Some(srv) = srv.me() else {
                continue;
            };
            let _ = std::thread::Builder::new()
                .name("nlm-granted".into())
                .spawn(move || {
                    // The server's identity, whatever the starter's.
                    crate::engine::cred::reclaim();
                    if let Err(e) = send_granted(&srv, &b) {
                        tracing::info!(
                            host = %String::from_utf8_lossy(&b.host.name),
                            addr = %b.host.addr,
                            error = %e,
                            "NLM4_GRANTED not delivered; the client gets the lock when it asks again"
                        );
                    }
                });
        }
    }
}

/// Releases everything of the client host `name` (or, when no host has
/// that name, at `addr`), which restarted, and grants what waited for it.
fn forget_host(srv: &Server, name: &[u8], addr: Option<IpAddr>) {
    let files = srv.state.nlm_forget_host(name, addr);
    srv.nlm.blocked().retain(|b| b.host.name != name);
    srv.nlm
        .shares
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|s| s.host != name);
    wake(srv, &files);
}

/// Runs NSM procedure `proc_` for a caller at `peer`. Remote callers may
/// tell the server they restarted (SM_NOTIFY) and ask its state
/// (SM_STAT); monitoring requests are for a host's own lock manager, and
/// are refused, as the Linux status monitor refuses them from elsewhere.
pub(super) fn call_nsm(srv: &Server, proc_: u32, args: &[u8], peer: Option<IpAddr>) -> DoneNlm {
    let mut d = Decoder::new(args);
    let a = match NsmArgs::decode(proc_, &mut d) {
        None => return DoneNlm::NoProc,
        Some(Err(_)) => return DoneNlm::Garbage,
        Some(Ok(a)) => a,
    };
    let mut e = Encoder::with_capacity(16);
    let state = srv.state.nsm_state();
    match (proc_, a) {
        (smproc::NOTIFY, NsmArgs::Notify(name, _)) => forget_host(srv, name, peer),
        (smproc::STAT, _) => {
            e.u32(0); // stat_succ
            e.i32(state);
        }
        (smproc::MON, _) => {
            e.u32(1); // stat_fail
            e.i32(state);
        }
        (smproc::UNMON | smproc::UNMON_ALL, _) => e.i32(state),
        _ => {}
    }
    DoneNlm::Reply(e)
}

/// A call record (without record mark) and its xid.
fn call_record(prog: u32, vers: u32, proc_: u32, args: &[u8]) -> std::io::Result<(u32, Vec<u8>)> {
    let mut e = Encoder::with_capacity(args.len() + 64);
    let mut x = [0u8; 4];
    getrandom::getrandom(&mut x).map_err(|e| std::io::Error::other(e.to_string()))?;
    let xid = u32::from_be_bytes(x);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cred = rpc::CallCred::Sys {
        stamp: 0,
        machine: host.trim().as_bytes().to_vec(),
        uid: 0,
        gid: 0,
        gids: vec![],
    };
    rpc::call_header(&mut e, xid, prog, vers, proc_, &cred);
    e.raw(args);
    Ok((xid, e.into_inner()))
}

/// A datagram socket on an ephemeral port of `target`'s address family.
fn udp_socket_for(target: SocketAddr) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    })
}

/// One call over a connected stream or datagram socket: the result body.
fn rpc_call(
    target: SocketAddr,
    udp: bool,
    prog: u32,
    vers: u32,
    proc_: u32,
    args: &[u8],
) -> std::io::Result<Vec<u8>> {
    let (xid, call) = call_record(prog, vers, proc_, args)?;
    let reply = if udp {
        let s = udp_socket_for(target)?;
        s.set_read_timeout(Some(CALL_TIMEOUT))?;
        s.connect(target)?;
        let mut buf = vec![0u8; 8192];
        let mut got = None;
        for _ in 0..3 {
            s.send(&call)?;
            match s.recv(&mut buf) {
                Ok(n) => {
                    got = Some(buf[..n].to_vec());
                    break;
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
        }
        got.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))?
    } else {
        let mut s = TcpStream::connect_timeout(&target, CALL_TIMEOUT)?;
        s.set_read_timeout(Some(CALL_TIMEOUT))?;
        s.set_write_timeout(Some(CALL_TIMEOUT))?;
        s.write_all(&rpc::record_mark(call.len()))?;
        s.write_all(&call)?;
        let mut mark = [0u8; 4];
        s.read_exact(&mut mark)?;
        let len = (u32::from_be_bytes(mark) & !rpc::LAST_FRAGMENT) as usize;
        if len > 65536 {
            return Err(std::io::Error::other("oversized reply"));
        }
        let mut r = vec![0u8; len];
        s.read_exact(&mut r)?;
        r
    };
    match rpc::parse_reply(&reply) {
        Ok((rx, Ok(at))) if rx == xid => Ok(reply[at..].to_vec()),
        Ok((_, Err(e))) => Err(std::io::Error::other(e.to_string())),
        _ => Err(std::io::Error::other("malformed reply")),
    }
}

/// One call whose answer, if any, is not waited for: the _RES calls,
/// which lock managers answer with nothing (their results are the call).
/// Over UDP one datagram; over TCP the record, then the connection is
/// closed for writing and read until the client closes it (waiting at
/// most [`CALL_TIMEOUT`] for each read), so that it has read the call.
fn rpc_send(
    target: SocketAddr,
    udp: bool,
    prog: u32,
    vers: u32,
    proc_: u32,
    args: &[u8],
) -> std::io::Result<()> {
    let (_, call) = call_record(prog, vers, proc_, args)?;
    if udp {
        udp_socket_for(target)?.send_to(&call, target)?;
        return Ok(());
    }
    let mut s = TcpStream::connect_timeout(&target, CALL_TIMEOUT)?;
    s.set_read_timeout(Some(CALL_TIMEOUT))?;
    s.set_write_timeout(Some(CALL_TIMEOUT))?;
    s.write_all(&rpc::record_mark(call.len()))?;
    s.write_all(&call)?;
    s.shutdown(std::net::Shutdown::Write)?;
    // A reply, if any, is a few dozen bytes: read at most 64 KiB of it.
    let mut sink = [0u8; 512];
    let mut left = 64 * 1024usize;
    while left > 0 {
        match s.read(&mut sink) {
            Ok(n) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
    Ok(())
}

/// Sends the results `args` of an asynchronous request (procedure
/// `proc_`: TEST_RES, LOCK_RES, CANCEL_RES or UNLOCK_RES) to the lock
/// manager of the host at `addr`, on a thread of its own: over UDP when
/// the request came by UDP, else over TCP, or over the other when the
/// host's portmapper knows only that one. A client that does not get
/// them sends its request again.
fn send_result(srv: &Server, addr: IpAddr, udp: bool, proc_: u32, args: Vec<u8>) {
    // In-process servers (tests, fuzzing) send nothing.
    let Some(srv) = srv.me() else {
        return;
    };
    if srv.nlm.results_sending.fetch_add(1, Ordering::AcqRel) >= RESULTS_MAX {
        srv.nlm.results_sending.fetch_sub(1, Ordering::AcqRel);
        // Each of those waits for an unanswering client at most a few
        // seconds; a flood of requests is not logged line by line.
        tracing::debug!(%addr, proc_, "too many NLM results being sent; this one is dropped");
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("nlm-result".into())
        .spawn({
            let srv = srv.clone();
            move || {
                // The server's identity, whatever the starter's.
                crate::engine::cred::reclaim();
                let sent = lock_manager(&srv, addr, udp).and_then(|(target, over_udp)| {
                    rpc_send(target, over_udp, NLM_PROGRAM, NLM_VERSION, proc_, &args)
                });
                match sent {
                    Ok(()) => {
                        srv.nlm.results_sent.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%addr, proc_, "NLM results sent");
                    }
                    Err(e) => tracing::info!(
                        %addr,
                        proc_,
                        error = %e,
                        "NLM results not delivered; the client sends its request again"
                    ),
                }
                srv.nlm.results_sending.fetch_sub(1, Ordering::AcqRel);
            }
        });
    if spawned.is_err() {
        srv.nlm.results_sending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where the lock manager (NLM 4) of `host` listens, and whether over
/// UDP: over the transport `udp` names, or over the other when the host's
/// portmapper knows it only there (the first transport's error when
/// neither).
fn lock_manager(srv: &Server, host: IpAddr, udp: bool) -> std::io::Result<(SocketAddr, bool)> {
    let (first, second) = if udp {
        (IPPROTO_UDP, IPPROTO_TCP)
    } else {
        (IPPROTO_TCP, IPPROTO_UDP)
    };
    match getport(srv, host, NLM_PROGRAM, NLM_VERSION, first) {
        Ok(t) => Ok((t, udp)),
        Err(e) => getport(srv, host, NLM_PROGRAM, NLM_VERSION, second)
            .map(|t| (t, !udp))
            .map_err(|_| e),
    }
}

/// The port of `prog`/`vers` over `prot` at the portmapper of `host`
/// (or the test's).
fn getport(
    srv: &Server,
    host: IpAddr,
    prog: u32,
    vers: u32,
    prot: u32,
) -> std::io::Result<SocketAddr> {
    let pm = srv.nlm.portmap.unwrap_or(SocketAddr::new(host, 111));
    let mut a = Encoder::new();
    for v in [prog, vers, prot, 0] {
        a.u32(v);
    }
    let body = rpc_call(pm, true, PMAP_PROGRAM, 2, pmapproc::GETPORT, a.as_slice())?;
    let port = Decoder::new(&body)
        .u32()
        .map_err(|_| std::io::Error::other("short GETPORT reply"))?;
    if port == 0 || port > 65535 {
        return Err(std::io::Error::other(format!(
            "program {prog} version {vers} is not registered there"
        )));
    }
    Ok(SocketAddr::new(pm.ip(), port as u16))
}

/// Sends NLM4_GRANTED for a lock granted after it blocked: over TCP, or
/// over UDP when the client's portmapper knows its lock manager only
/// there.
fn send_granted(srv: &Server, b: &Blocked) -> std::io::Result<()> {
    let (target, udp) = lock_manager(srv, b.host.addr, false)?;
    let mut a = Encoder::new();
    a.opaque(&b.cookie);
    a.bool(b.write);
    Nlm4Lock {
        caller_name: &b.host.name,
        fh: &b.fh,
        oh: &b.oh,
        svid: b.svid,
        offset: b.offset,
        len: b.len,
    }
    .encode(&mut a);
    let res = rpc_call(
        target,
        udp,
        NLM_PROGRAM,
        NLM_VERSION,
        nlmproc::GRANTED,
        a.as_slice(),
    )?;
    // nlm4_res: the cookie, then the client's answer. A client that no
    // longer waits (its process gave up) refuses: the lock goes, as on the
    // Linux server, and what waited for it is granted.
    let mut d = Decoder::new(&res);
    let answer = match d.opaque(crate::nlm::MAXNETOBJ) {
        Ok(_) => d.u32(),
        Err(e) => Err(e),
    }
    .map_err(|_| std::io::Error::other("malformed NLM4_GRANTED reply"))?;
    if answer != nlmstat::GRANTED {
        srv.state.nlm_unlock(&b.owner, b.file, b.range);
        wake(srv, &[b.file]);
        tracing::info!(
            host = %String::from_utf8_lossy(&b.host.name),
            answer,
            "the client refused a granted lock; it is released"
        );
        return Ok(());
    }
    srv.nlm.granted_sent.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(host = %String::from_utf8_lossy(&b.host.name), "NLM4_GRANTED delivered");
    Ok(())
}

/// After a start: tells every NLM client host that held locks before it
/// that the server restarted (SM_NOTIFY with the new state number), so
/// its lock manager reclaims them during the grace period. One thread per
/// host; each tries for up to a minute.
pub fn notify_hosts(srv: &Arc<Server>) {
    let state = srv.state.nsm_state();
    for h in srv.state.nlm_hosts_from_before() {
        let srv = srv.clone();
        let _ = std::thread::Builder::new()
            .name("sm-notify".into())
            .spawn(move || {
                // The server's identity, whatever the starter's.
                crate::engine::cred::reclaim();
                let started = Instant::now();
                let mut wait = Duration::from_secs(1);
                loop {
                    match notify(&srv, &h, state) {
                        Ok(()) => {
                            srv.nlm.notify_sent.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(
                                host = %String::from_utf8_lossy(&h.name),
                                addr = %h.addr,
                                state,
                                "SM_NOTIFY sent: the host reclaims its locks"
                            );
                            return;
                        }
                        Err(e) if started.elapsed() > Duration::from_secs(60) => {
                            tracing::warn!(
                                host = %String::from_utf8_lossy(&h.name),
                                addr = %h.addr,
                                error = %e,
                                "SM_NOTIFY not delivered; the host's locks are not reclaimed"
                            );
                            return;
                        }
                        Err(_) => {
                            std::thread::sleep(wait);
                            wait = (wait * 2).min(Duration::from_secs(15));
                        }
                    }
                }
            });
    }
}

fn notify(srv: &Server, h: &NlmHost, state: i32) -> std::io::Result<()> {
    let target = getport(srv, h.addr, NSM_PROGRAM, NSM_VERSION, IPPROTO_UDP)?;
    let mut a = Encoder::new();
    // The name the client's lock manager knows the server by: the address
    // it called.
    a.string(&h.local.to_string());
    a.i32(state);
    rpc_call(
        target,
        true,
        NSM_PROGRAM,
        NSM_VERSION,
        smproc::NOTIFY,
        a.as_slice(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::range;

    #[test]
    fn ranges_and_their_limits() {
        assert_eq!(range(0, 0), Ok((0, u64::MAX)));
        assert_eq!(range(10, 5), Ok((10, 15)));
        assert_eq!(range(i64::MAX as u64, 1), Ok((i64::MAX as u64, 1 << 63)));
        assert!(range(1 << 63, 0).is_err());
        assert!(range(i64::MAX as u64, 2).is_err());
        assert!(range(u64::MAX, 1).is_err());
    }
}
