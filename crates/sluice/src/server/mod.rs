//! The NFSv4.1/4.2 server: RPC dispatch, COMPOUND processing, state and
//! operations, on top of the engine.

pub mod attrs;
pub mod by_file;
pub mod callback;
mod compound;
mod context;
pub mod copies;
pub mod counters;
pub mod dirsync;
pub mod exports;
pub mod inline;
pub mod leases;
pub mod mount;
pub mod nfs3;
pub mod nlm;
mod ops_copy;
mod ops_file;
mod ops_fs;
mod ops_pseudo;
mod ops_session;
mod ops_sparse;
mod ops_xattr;
mod optable;
pub mod portmap;
pub mod state;
pub mod witness;

use crate::engine::export::Export;
use crate::engine::handle::HandleKey;
use crate::rpc::{self, AcceptStat, CallError, Cred};
use crate::xdr::Encoder;
pub use exports::{Exports, Loc, Rules};
use state::StateTable;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use compound::process_compound;

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lease period handed to clients.
    pub lease: Duration,
    /// Grace period after the start, for clients known from before to
    /// reclaim their state (None: one lease).
    pub grace: Option<Duration>,
    /// Where the records of which clients may reclaim are kept (None: in
    /// memory only, so nobody may reclaim after a restart).
    pub recovery: Option<Arc<dyn state::recovery::Recovery>>,
    /// Byte-range locks around backing I/O; switched off only by tests
    /// that show what torn reads look like.
    pub range_locks: bool,
    /// Server-side readahead for sequential readers.
    pub readahead: crate::engine::readahead::Config,
    /// READ_PLUS sends holes shorter than this as data.
    pub min_hole: u64,
    /// How long listings keep the attributes they stat'ed (None: the
    /// engine's default, `attr_cache::KEEP_FOR`). Applied when exports
    /// are opened.
    pub listing_cache: Option<std::time::Duration>,
    /// Bytes of data read past the page cache kept for the next reader.
    pub read_cache: u64,
    /// Which delegations OPEN grants.
    pub delegations: Delegations,
    /// Delegations take kernel leases, so local writers wait for their
    /// recall; only for a process that runs [`leases::watch`].
    pub local_leases: bool,
    /// Longest file handle given to NFSv3 clients (64, RFC 1813's limit;
    /// VMware ESXi takes at most 56).
    pub v3_max_fh: usize,
    /// The NFS port, as the portmapper on the NFS port tells it (0 when
    /// not known: in-process servers).
    pub port: u16,
    /// Test only: the portmapper through which clients' lock managers and
    /// status monitors are found (instead of each client's port 111).
    pub nsm_portmap: Option<std::net::SocketAddr>,
    /// Server owner and scope given to clients (EXCHANGE_ID); None:
    /// `sluice:<host name>`. The nodes of a cluster share theirs.
    pub server_owner: Option<Vec<u8>>,
    /// Boot id of this start, which client and state ids carry (None:
    /// random). The nodes of a cluster put their number in the top byte.
    pub boot_id: Option<u32>,
    /// Byte-range locks are also taken on the file system (OFD locks), so
    /// that other servers of the same shared file system see them (the
    /// nodes of a cluster).
    pub shared_locks: bool,
    /// WRITEs of at least this many bytes, at offsets and of lengths that
    /// are multiples of 4 KiB, go past the page cache (O_DIRECT); 0: none
    /// (the default: what is written that way is not in the page cache
    /// for readers that come soon after).
    pub direct_write_min: u64,
    /// UNSTABLE WRITEs through the page cache of at least this many bytes
    /// start their own writeback at once (`sync_file_range`), so that a
    /// stream's COMMIT has only its last pieces left to wait for; 0: the
    /// kernel's writeback decides when.
    pub write_behind_min: u64,
    /// Connection tasks that may run quick ops themselves at once, rather
    /// than hand them to a worker (see [`inline`]); 0: never.
    pub quick_inline: usize,
    /// How long a connection's thread, having answered a request itself,
    /// polls its socket for the next one before it sleeps (see
    /// `net::Poller`); zero: never.
    pub busy_poll: Duration,
    /// Which connections get cached data by reference (see
    /// [`ZeroCopy`]).
    pub zero_copy: ZeroCopy,
}

/// Which connections get data of the server's read cache handed to the
/// socket by reference (`vmsplice`), without the copy into the socket
/// (see `net::Kind::Fixed`). The copy is then made where the data is
/// received: by the network card of a client on another machine, for
/// free; by the client itself when it runs on this machine, which then
/// copies from memory the CPU has not just touched and becomes the slower
/// side, so that the pair is no faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Clients on other machines: not from a loopback address or from
    /// the address the connection came in on.
    #[default]
    Remote,
    /// Every connection.
    Always,
    /// None.
    Never,
}

impl std::str::FromStr for ZeroCopy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        one_of(
            "zero_copy",
            s,
            &[
                ("remote", ZeroCopy::Remote),
                ("always", ZeroCopy::Always),
                ("never", ZeroCopy::Never),
            ],
        )
    }
}

impl ZeroCopy {
    /// Whether a connection from `peer`, which came in on `local`, gets
    /// data by reference.
    pub fn applies(self, peer: std::net::IpAddr, local: std::net::IpAddr) -> bool {
        let canonical = |ip: std::net::IpAddr| ip.to_canonical();
        match self {
            ZeroCopy::Always => true,
            ZeroCopy::Never => false,
            ZeroCopy::Remote => {
                let peer = canonical(peer);
                !peer.is_loopback() && peer != canonical(local)
            }
        }
    }
}

/// The value named `s` among `names`, or an error that names the `key`
/// and lists the names.
fn one_of<T: Copy>(key: &str, s: &str, names: &[(&str, T)]) -> Result<T, String> {
    names
        .iter()
        .find(|(n, _)| *n == s)
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            let all: Vec<String> = names.iter().map(|(n, _)| format!("{n:?}")).collect();
            format!("{key}: {s:?} is not one of {}", all.join(", "))
        })
}

/// Which delegations the server grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delegations {
    /// None: every OPEN answers OPEN_DELEGATE_NONE.
    None,
    /// Read delegations.
    #[default]
    Read,
    /// Read and write delegations.
    All,
}

impl std::str::FromStr for Delegations {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        one_of(
            "delegations",
            s,
            &[
                ("none", Delegations::None),
                ("read", Delegations::Read),
                ("all", Delegations::All),
            ],
        )
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease: Duration::from_secs(90),
            grace: None,
            recovery: None,
            range_locks: true,
            readahead: Default::default(),
            min_hole: ops_sparse::MIN_HOLE,
            listing_cache: None,
            read_cache: crate::engine::bufcache::default_limit(),
            delegations: Delegations::default(),
            local_leases: false,
            v3_max_fh: crate::nfs3::FHSIZE,
            port: 0,
            nsm_portmap: None,
            server_owner: None,
            boot_id: None,
            shared_locks: false,
            direct_write_min: 0,
            write_behind_min: 256 * 1024,
            quick_inline: 0,
            busy_poll: Duration::ZERO,
            zero_copy: ZeroCopy::default(),
        }
    }
}

/// What failed to put a file's data on stable storage (see
/// [`Server::storage_failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storing {
    /// fsync or fdatasync (COMMIT, a stable WRITE, the end of a copy).
    Flush,
    /// A write of data.
    Write,
}

/// Whether `err`, from `what`, may mean that data written before (and
/// answered UNSTABLE) is lost: not for an interrupted or retried call, a
/// stale handle, or a flush the file does not support; nor for a write
/// refused for want of space or quota or past the largest size, which
/// writes nothing and loses nothing written before (a flush failing for
/// want of space did lose data: its pages could not be written back).
pub(crate) fn loses_written_data(what: Storing, err: &io::Error) -> bool {
    match err.raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR | libc::ESTALE | libc::EINVAL) => false,
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => what == Storing::Flush,
        _ => true,
    }
}

/// One running NFS server instance.
#[derive(Debug)]
pub struct Server {
    /// The exported trees and the pseudo file system joining them.
    pub exports: Exports,
    /// Clients, sessions, opens and locks.
    pub state: StateTable,
    /// The write verifier (see [`Server::write_verifier`]).
    write_verifier: std::sync::atomic::AtomicU64,
    /// Flushes running, by file (see [`Server::flush_then_verifier`]).
    flushing: std::sync::Mutex<std::collections::HashMap<(u64, u64), Vec<u64>>>,
    flush_ended: std::sync::Condvar,
    flush_ids: std::sync::atomic::AtomicU64,
    /// When (milliseconds after `started`, plus one) the last change of
    /// the verifier was logged.
    verifier_warned: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    /// Identifies this server to clients (server_owner major id).
    pub owner: Vec<u8>,
    /// Settings.
    pub config: Config,
    /// Byte-range locks held around backing I/O.
    pub locks: Arc<crate::engine::rangelock::RangeLocks>,
    /// Large buffered WRITEs of a file, one at a time (see
    /// `ops_file::write_data`).
    pub write_turns: crate::engine::turns::Turns,
    /// Cached data/hole maps.
    pub extents: crate::engine::extents::ExtentCache,
    /// The read path: readahead, the read cache, reads that wait or not.
    pub read: crate::engine::read::ReadPath,
    /// Counters for the metrics endpoint.
    pub metrics: Arc<counters::Metrics>,
    /// Asynchronous copies, running and finished.
    pub copies: copies::Copies,
    /// What NFSv3 clients mounted (MOUNT's DUMP).
    pub mounts: mount::MountList,
    /// Blocked NLM locks, and how clients' services are found.
    pub nlm: nlm::NlmServer,
    /// Descriptors NFSv3 READ and WRITE keep open between calls.
    pub v3_files: nfs3::FileCache,
    /// Directory syncs shared by the ops that changed a directory
    /// meanwhile (exports with `sync`).
    pub dir_syncs: dirsync::DirSyncs,
    /// Descriptors stable WRITEs flush through, kept for the next stable
    /// WRITE of their file (see [`Server::flush_witness`]).
    pub witnesses: witness::Witnesses,
    /// Which connection tasks may run quick ops themselves.
    pub inline: inline::Inline,
    /// Connections busy polling for their next request (see
    /// `Config::busy_poll`).
    pub pollers: crate::net::Pollers,
    /// This server, once [`Server::shared`] made it shared: what work
    /// that goes on after a reply (asynchronous copies) holds on to.
    me: std::sync::Weak<Server>,
}

impl Server {
    /// Closes the cached descriptors of files removed behind the server's
    /// back, and the NFSv3 READ and WRITE descriptors and stable WRITEs'
    /// flush descriptors left idle: any of them would keep a removed
    /// file's blocks allocated. The server's timer calls this every
    /// second, so that this happens on an idle server too (not only when
    /// the next handle is opened).
    pub fn sweep_descriptors(&self) {
        for e in self.exports.list() {
            e.fs.sweep_on_timer();
        }
        self.v3_files.sweep();
        self.witnesses.sweep();
        self.read.readahead.expire_idle();
    }

    /// After a client removed the last name of `file`, not a directory (or
    /// renamed another over it): closes what the server keeps open of it
    /// between requests (readahead mappings and descriptors, NFSv3's READ
    /// and WRITE descriptors, stable WRITEs' flush descriptors), so that
    /// its blocks are freed now.
    pub fn file_unlinked(&self, file: (u64, u64)) {
        self.read.readahead.forget_file(file);
        self.v3_files.forget(file);
        self.witnesses.forget(file);
    }

    /// A server for one export at "/" with default rules.
    pub fn new(export: Export, key: HandleKey, config: Config) -> io::Result<Self> {
        // The identity threads that kept a caller's get back (the binary
        // took it already, when it dropped its groups).
        crate::engine::cred::settle_home();
        Self::with_exports(Exports::single(export, key)?, config)
    }

    /// A server for `exports`.
    pub fn with_exports(exports: Exports, config: Config) -> io::Result<Self> {
        let mut random = [0u8; 12];
        getrandom::getrandom(&mut random).map_err(|e| io::Error::other(e.to_string()))?;
        // Random boot ids tell this instance's client, session and state ids
        // from those of earlier starts.
        // (Never all ones: those client ids are NLM hosts', see
        // `state::nlm::NLM_CLIENTS`.)
        let boot_id = config
            .boot_id
            .unwrap_or_else(|| u32::from_be_bytes([random[0], random[1], random[2], random[3]]));
        let boot_id = boot_id.clamp(1, u32::MAX - 1);
        let mut verifier = [0u8; 8];
        verifier.copy_from_slice(&random[4..]);
        let write_verifier = u64::from_ne_bytes(verifier).into();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let locks = Arc::new(crate::engine::rangelock::RangeLocks::new(
            config.range_locks,
        ));
        let read =
            crate::engine::read::ReadPath::new(config.readahead, config.read_cache, locks.clone());
        Ok(Server {
            exports,
            state: StateTable::start(
                state::Settings {
                    lease: config.lease,
                    grace: config.grace.unwrap_or(config.lease),
                    limits: Default::default(),
                    local_leases: config.local_leases,
                    shared_locks: config.shared_locks,
                },
                boot_id,
                config
                    .recovery
                    .clone()
                    .unwrap_or_else(|| Arc::new(state::recovery::SqliteRecovery::in_memory())),
            )
            .map_err(io::Error::other)?,
            write_verifier,
            flushing: Default::default(),
            flush_ended: Default::default(),
            flush_ids: Default::default(),
            write_turns: Default::default(),
            verifier_warned: Default::default(),
            started: std::time::Instant::now(),
            owner: config
                .server_owner
                .clone()
                .unwrap_or_else(|| format!("sluice:{}", host.trim()).into_bytes()),
            locks,
            read,
            copies: copies::Copies::new(config.lease * 2),
            mounts: Default::default(),
            nlm: nlm::NlmServer::new(config.nsm_portmap),
            v3_files: Default::default(),
            dir_syncs: Default::default(),
            witnesses: Default::default(),
            inline: inline::Inline::new(config.quick_inline),
            pollers: crate::net::Pollers::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
            config,
            extents: Default::default(),
            metrics: Default::default(),
            me: std::sync::Weak::new(),
        })
    }

    /// The server, shared with the threads that serve it. Only a shared
    /// server runs copies asynchronously.
    pub fn shared(mut self) -> Arc<Self> {
        Arc::new_cyclic(|me| {
            self.me = me.clone();
            self
        })
    }

    /// For tests: a shared server with `config` exporting a new scratch
    /// directory (named after `tag`) under the system's temporary one.
    #[cfg(test)]
    pub(crate) fn scratch(tag: &str, config: Config) -> Arc<Server> {
        let dir = tests::tempdir(tag);
        let key = crate::engine::handle::HandleKey::new([1; 32]);
        let export = crate::engine::export::Export::open(&dir, 0, key.clone()).unwrap();
        Server::new(export, key, config).unwrap().shared()
    }

    /// This server as a shared reference, when it is one.
    pub(crate) fn me(&self) -> Option<Arc<Server>> {
        self.me.upgrade()
    }

    /// The write verifier that WRITE, COMMIT and COPY replies carry. It
    /// changes on every start and whenever the file system failed to put
    /// data on stable storage (see [`Server::storage_failed`]): a client
    /// whose COMMIT answers another verifier than its UNSTABLE WRITEs did
    /// sends them again.
    pub fn write_verifier(&self) -> [u8; 8] {
        self.write_verifier
            .load(std::sync::atomic::Ordering::SeqCst)
            .to_ne_bytes()
    }

    /// After `err` from flushing `file` to stable storage (fsync or
    /// fdatasync for a COMMIT, a stable WRITE or a copy), or from writing
    /// to it: unless the error loses nothing already written (see
    /// [`loses_written_data`]), the write verifier changes.
    ///
    /// The kernel reports a failed writeback once to each open file
    /// description that was open before it, and never to one opened
    /// after another has seen it. So when one client's COMMIT gets the
    /// error, another client's COMMIT of the same file through another
    /// descriptor may succeed although its data was in the pages lost.
    /// With a new verifier that COMMIT answers another verifier than the
    /// client's WRITEs did, and the client sends its data again, as
    /// RFC 8881 section 18.32.3 (and RFC 1813 section 3.3.21) has it for
    /// a server that lost uncommitted data. The Linux server does the same.
    pub fn storage_failed(&self, file: (u64, u64), what: Storing, err: &io::Error) {
        use std::sync::atomic::Ordering;
        if !loses_written_data(what, err) {
            return;
        }
        // Another value than any before (from a random start, an odd step
        // comes back only after 2^64 changes).
        self.write_verifier
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::SeqCst);
        self.metrics
            .write_verifier_changes
            .fetch_add(1, Ordering::Relaxed);
        // A file system that gave up fails every flush: one line a second.
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.verifier_warned.load(Ordering::Relaxed);
        if last != 0 && now < last + 1000 {
            return;
        }
        self.verifier_warned.store(now, Ordering::Relaxed);
        tracing::warn!(
            dev = file.0,
            ino = file.1,
            "{} failed ({err}): the write verifier changes, so that clients send their uncommitted writes again",
            match what {
                Storing::Flush => "a flush to stable storage",
                Storing::Write => "a write",
            }
        );
    }

    /// Flushes `file` (by device and inode) through `fd`, one of its
    /// descriptors: its data, and with `metadata` its metadata too. A
    /// failure changes the write verifier (see [`Server::storage_failed`])
    /// before this returns.
    ///
    /// The kernel tells of a failed writeback through each open file
    /// description once: a flush through a description that no one else
    /// flushes meanwhile (see [`Server::flush_witness`]) learns of every
    /// failure since that description was opened or last flushed.
    pub fn flush_file(
        &self,
        file: (u64, u64),
        fd: std::os::fd::BorrowedFd<'_>,
        metadata: bool,
    ) -> io::Result<()> {
        self.flush_with(file, || crate::engine::fs::sync(fd, metadata))
    }

    /// [`Server::flush_file`] with `sync` as the flush.
    fn flush_with(
        &self,
        file: (u64, u64),
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let id = self.flush_ids.fetch_add(1, Relaxed);
        self.flushes().entry(file).or_default().push(id);
        let r = sync();
        if let Err(e) = &r {
            self.storage_failed(file, Storing::Flush, e);
        }
        let mut running = self.flushes();
        if let Some(ids) = running.get_mut(&file) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                running.remove(&file);
            }
        }
        drop(running);
        self.flush_ended.notify_all();
        r
    }

    /// [`Server::flush_file`], then the write verifier, read once every
    /// other flush of the file that ran when this one ended has ended too.
    /// For flushes through a description others may flush at the same
    /// time (an open's, or one opened after a failure was reported): the
    /// kernel tells of a failure only the first of them, and the others
    /// succeed; the verifier tells them, once that first one has changed
    /// it. COMMIT answers it; a stable WRITE or a copy compares it with
    /// the verifier from before it wrote.
    pub fn flush_then_verifier(
        &self,
        file: (u64, u64),
        fd: std::os::fd::BorrowedFd<'_>,
        metadata: bool,
    ) -> io::Result<[u8; 8]> {
        self.flush_then_verifier_with(file, || crate::engine::fs::sync(fd, metadata))
    }

    /// [`Server::flush_then_verifier`] with `sync` as the flush.
    fn flush_then_verifier_with(
        &self,
        file: (u64, u64),
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<[u8; 8]> {
        self.flush_with(file, sync)?;
        let mut running = self.flushes();
        let beside: Vec<u64> = running.get(&file).cloned().unwrap_or_default();
        while running
            .get(&file)
            .is_some_and(|ids| ids.iter().any(|i| beside.contains(i)))
        {
            running = self
                .flush_ended
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
        Ok(self.write_verifier())
    }

    /// A description of `file` of its own for a stable WRITE's flush,
    /// taken before the WRITE writes: its flush then learns of every
    /// failed writeback since, whoever else was told (see
    /// [`Server::flush_file`]). One that an earlier stable WRITE of the
    /// file flushed through and gave back (see [`witness`]), or else one
    /// opened now (as root, for reading, through `path`, an O_PATH
    /// descriptor of it); the WRITE gives it back after its flush
    /// ([`witness::Witnesses::keep`]). None when the file has a write
    /// delegation, whose kernel lease another open would break, or when
    /// it cannot be opened.
    pub(crate) fn flush_witness(
        &self,
        file: (u64, u64),
        path: std::os::fd::BorrowedFd<'_>,
    ) -> Option<witness::Witness> {
        if self.state.write_delegated(file) {
            return None;
        }
        if let Some(w) = self.witnesses.take(file) {
            return Some(w);
        }
        let w = self
            .witnesses
            .open(|| {
                crate::engine::cred::as_root(|| crate::engine::fs::reopen(path, libc::O_RDONLY))
            })
            .ok()?;
        self.metrics
            .flush_witnesses_opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(w)
    }

    fn flushes(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(u64, u64), Vec<u64>>> {
        self.flushing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets what is cached of a file (its data/hole map and data) after
    /// the server changed it.
    pub fn file_changed(&self, file: (u64, u64)) {
        self.extents.invalidate(file);
        self.read.bufcache.invalidate(file);
    }

    /// Handles one RPC record from an in-process caller (tests, fuzzing),
    /// which every export admits, the way a connection does (first without
    /// waiting, then the rest), and returns the reply record, if any, as
    /// one vector.
    pub fn handle_record(&self, record: &[u8]) -> Option<Vec<u8>> {
        let reply = match self.try_call(record.to_vec(), None) {
            Call::Done(reply) => reply,
            Call::Paused(p) => p.resume(self),
        };
        reply.map(Encoder::into_inner)
    }

    /// Handles one RPC record from a client at `peer` as far as it goes
    /// without waiting for the disk or a lock (for the connection's own
    /// task): requests for cached data and in-memory state are answered at
    /// once, with file data spliced into the reply by reference (see
    /// [`Encoder::into_parts`]); the rest is handed back to be finished by
    /// [`Paused::resume`] on a thread that may wait.
    pub fn try_call(&self, record: Vec<u8>, peer: Option<IpAddr>) -> Call {
        self.try_call_on(record, peer, None)
    }

    /// Like [`Server::try_call`] for a call that came over `conn`, which
    /// CREATE_SESSION and BIND_CONN_TO_SESSION may make a session's back
    /// channel.
    pub fn try_call_on(
        &self,
        record: Vec<u8>,
        peer: Option<IpAddr>,
        conn: Option<&Arc<callback::CbConn>>,
    ) -> Call {
        let local = conn.and_then(|c| c.local());
        self.try_call_with(record, peer, conn, local, false)
    }

    /// Answers one call that came in a UDP datagram from `peer` to this
    /// server's address `local`: MOUNT, NLM, NSM and the portmapper are
    /// served over UDP, NFS only over TCP (PROG_UNAVAIL). None: no reply.
    pub fn handle_datagram(
        &self,
        record: &[u8],
        peer: Option<IpAddr>,
        local: Option<IpAddr>,
    ) -> Option<Vec<u8>> {
        let call = match rpc::parse_call(record) {
            Ok(c) => c,
            Err(e) => return rpc::error_reply(&e),
        };
        use crate::mount::{MOUNT_PROGRAM, NLM_PROGRAM, NSM_PROGRAM, PMAP_PROGRAM};
        if ![MOUNT_PROGRAM, NLM_PROGRAM, NSM_PROGRAM, PMAP_PROGRAM].contains(&call.prog) {
            return Some(rpc::accepted_reply(call.xid, AcceptStat::ProgUnavail).into_inner());
        }
        let reply = match self.try_call_with(record.to_vec(), peer, None, local, true) {
            Call::Done(r) => r,
            Call::Paused(p) => p.resume(self),
        };
        reply.map(Encoder::into_inner)
    }

    fn try_call_with(
        &self,
        record: Vec<u8>,
        peer: Option<IpAddr>,
        conn: Option<&Arc<callback::CbConn>>,
        local: Option<IpAddr>,
        udp: bool,
    ) -> Call {
        let call = match rpc::parse_call(&record) {
            Ok(c) => c,
            Err(e) => return Call::Done(rpc::error_reply(&e).map(Encoder::from)),
        };
        let xid = call.xid;
        let args_at = call.args_at;
        match (call.prog, call.vers) {
            (rpc::NFS_PROGRAM, 4) => {}
            (rpc::NFS_PROGRAM, 3) => {
                let lend = may_lend(conn);
                if !nfs3::may_try(call.proc_) {
                    return Call::Paused(Paused {
                        xid,
                        rest: Rest::V3(record, call.proc_, args_at, call.cred, peer, lend),
                    });
                }
                let _nowait = context::NoWaitGuard::new();
                return match nfs3::call(
                    self,
                    call.proc_,
                    &record[args_at..],
                    &call.cred,
                    peer,
                    lend,
                    false,
                ) {
                    nfs3::Done3::WouldBlock => Call::Paused(Paused {
                        xid,
                        rest: Rest::V3(record, call.proc_, args_at, call.cred, peer, lend),
                    }),
                    done => Call::Done(v3_reply(xid, done)),
                };
            }
            (rpc::NFS_PROGRAM, _) => {
                return Call::Done(Some(Encoder::from(rpc::prog_mismatch(xid, 3, 4))))
            }
            (crate::mount::MOUNT_PROGRAM, 1 | 3) => {
                return Call::Paused(Paused {
                    xid,
                    rest: Rest::Mount(record, call.vers, call.proc_, args_at, peer),
                })
            }
            (crate::mount::MOUNT_PROGRAM, _) => {
                return Call::Done(Some(Encoder::from(rpc::prog_mismatch(xid, 1, 3))))
            }
            (crate::mount::NLM_PROGRAM, crate::nlm::NLM_VERSION)
            | (crate::mount::NSM_PROGRAM, crate::nlm::NSM_VERSION) => {
                return Call::Paused(Paused {
                    xid,
                    rest: Rest::Lock(
                        record, call.prog, call.proc_, args_at, call.cred, peer, local, udp,
                    ),
                });
            }
            (crate::mount::NLM_PROGRAM, _) => {
                return Call::Done(Some(Encoder::from(rpc::prog_mismatch(xid, 4, 4))))
            }
            (crate::mount::NSM_PROGRAM, _) => {
                return Call::Done(Some(Encoder::from(rpc::prog_mismatch(xid, 1, 1))))
            }
            (crate::mount::PMAP_PROGRAM, _) => {
                let table = portmap::Table {
                    port: self.config.port,
                };
                return Call::Done(portmap::answer_call(&table, &call, &record, local));
            }
            _ => return Call::Done(Some(rpc::accepted_reply(xid, AcceptStat::ProgUnavail))),
        }
        match call.proc_ {
            0 => {
                if record.len() > call.args_at {
                    return Call::Done(
                        rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from),
                    );
                }
                Call::Done(Some(rpc::accepted_reply(xid, AcceptStat::Success)))
            }
            1 => {
                let step = compound::try_compound(
                    self,
                    record,
                    call.args_at,
                    call.cred,
                    peer,
                    conn.cloned(),
                );
                match step {
                    compound::Step::Done(body) => Call::Done(compound_reply(xid, body)),
                    compound::Step::Paused(rest) => Call::Paused(Paused {
                        xid,
                        rest: Rest::Compound(rest),
                    }),
                }
            }
            _ => Call::Done(Some(rpc::accepted_reply(xid, AcceptStat::ProcUnavail))),
        }
    }

    /// The caller identity used for file system access in an export with
    /// `rules`, after squashing.
    pub fn identity(cred: &Cred, rules: &Rules) -> crate::engine::cred::Identity {
        use crate::rules::Squash;
        let (anon_uid, anon_gid) = rules.anon;
        match rules.squash {
            Squash::None => crate::engine::cred::Identity {
                uid: cred.uid,
                gid: cred.gid,
                groups: cred.gids.clone(),
            },
            Squash::Root => crate::engine::cred::Identity {
                uid: if cred.uid == 0 { anon_uid } else { cred.uid },
                gid: if cred.gid == 0 { anon_gid } else { cred.gid },
                groups: cred.gids.iter().copied().filter(|&g| g != 0).collect(),
            },
            Squash::All => crate::engine::cred::Identity {
                uid: anon_uid,
                gid: anon_gid,
                groups: Vec::new(),
            },
        }
    }
}

/// What became of a call run without waiting.
pub enum Call {
    /// Answered: the reply record, if any.
    Done(Option<Encoder>),
    /// To be finished where waiting is allowed.
    Paused(Paused),
}

/// A call stopped before it had to wait.
pub struct Paused {
    xid: u32,
    rest: Rest,
}

/// What is left of a paused call.
enum Rest {
    /// A COMPOUND, stopped before an op that may wait.
    Compound(compound::Paused),
    /// An NFSv3 call not yet run (or that stopped to wait and changed
    /// nothing): the record, procedure, where the arguments start, the
    /// caller, and whether its READ may lend file data (see
    /// [`may_lend`]).
    V3(Vec<u8>, u32, usize, Cred, Option<IpAddr>, bool),
    /// An NFSv3 REMOVE, RMDIR or RENAME done, its results waiting for
    /// the directory syncs it left (see `nfs3::Done3::Syncing`).
    V3Syncing(Encoder, Vec<dirsync::Pending>),
    /// A MOUNT call: the record, version, procedure, where the arguments
    /// start, and the caller's address.
    Mount(Vec<u8>, u32, u32, usize, Option<IpAddr>),
    /// An NLM or NSM call: the record, program, procedure, where the
    /// arguments start, the caller, its address, the server's it
    /// reached, and whether it came over UDP.
    Lock(
        Vec<u8>,
        u32,
        u32,
        usize,
        Cred,
        Option<IpAddr>,
        Option<IpAddr>,
        bool,
    ),
}

impl Paused {
    /// Goes on with a paused COMPOUND on the connection's task as far as
    /// its quick ops take it (see `compound::Paused::try_quick`); other
    /// calls come back as they are. The caller lets its task be held for
    /// as long as the file system takes (see [`inline::Inline`]).
    pub fn try_quick(self, srv: &Server) -> Call {
        let xid = self.xid;
        match self.rest {
            Rest::Compound(rest) => match rest.try_quick(srv) {
                compound::Step::Done(body) => Call::Done(compound_reply(xid, body)),
                compound::Step::Paused(rest) => Call::Paused(Paused {
                    xid,
                    rest: Rest::Compound(rest),
                }),
            },
            Rest::V3(record, proc_, at, cred, peer, lend)
                if nfs3::quick(srv, proc_, &record[at..]) =>
            {
                match nfs3::call(srv, proc_, &record[at..], &cred, peer, lend, true) {
                    nfs3::Done3::Syncing(body, pending) => Call::Paused(Paused {
                        xid,
                        rest: Rest::V3Syncing(body, pending),
                    }),
                    done => Call::Done(v3_reply(xid, done)),
                }
            }
            rest => Call::Paused(Paused { xid, rest }),
        }
    }

    /// Whether the call waits for directory syncs that its op left (see
    /// [`Paused::sync`]).
    pub fn awaits_syncs(&self) -> bool {
        match &self.rest {
            Rest::Compound(rest) => rest.awaits_syncs(),
            Rest::V3Syncing(..) => true,
            _ => false,
        }
    }

    /// Whether a sync of a directory the call waits for is running now:
    /// then a task waits for the next one (see [`Paused::sync`]), which
    /// the changes made meanwhile share. Otherwise the call's own sync
    /// would start at once, and a worker that runs it and then answers
    /// ([`Paused::resume`]) wakes one thread where a task would wake two.
    pub fn syncs_running(&self, srv: &Server) -> bool {
        let pending = match &self.rest {
            Rest::Compound(rest) => rest.pending_syncs(),
            Rest::V3Syncing(_, pending) => pending,
            _ => &[],
        };
        pending.iter().any(|p| srv.dir_syncs.running(p.dir))
    }

    /// Waits, without holding a thread, for the directory syncs a call's
    /// op left (on a `sync` export, an NFSv4 or NFSv3 REMOVE or RENAME
    /// run on the connection's task), and goes on: answered, or a
    /// COMPOUND paused before its next op. Other calls come back as they
    /// are.
    pub async fn sync(self, srv: &Server) -> Call {
        let xid = self.xid;
        match self.rest {
            Rest::Compound(rest) => match rest.sync(srv).await {
                compound::Step::Done(body) => Call::Done(compound_reply(xid, body)),
                compound::Step::Paused(rest) => Call::Paused(Paused {
                    xid,
                    rest: Rest::Compound(rest),
                }),
            },
            Rest::V3Syncing(body, pending) => {
                let r = ops_fs::sync_deferred_async(srv, &pending).await;
                Call::Done(v3_reply(xid, nfs3_synced(body, r)))
            }
            rest => Call::Paused(Paused { xid, rest }),
        }
    }

    /// Finishes the call on the calling thread, which may wait, and
    /// returns the reply record.
    pub fn resume(self, srv: &Server) -> Option<Encoder> {
        let xid = self.xid;
        match self.rest {
            Rest::Compound(rest) => compound_reply(xid, rest.resume(srv)),
            Rest::V3(record, proc_, at, cred, peer, lend) => v3_reply(
                xid,
                nfs3::call(srv, proc_, &record[at..], &cred, peer, lend, false),
            ),
            Rest::V3Syncing(body, pending) => {
                crate::engine::cred::reclaim();
                let r = ops_fs::sync_deferred(srv, &pending);
                v3_reply(xid, nfs3_synced(body, r))
            }
            Rest::Lock(record, prog, proc_, at, cred, peer, local, udp) => {
                crate::engine::cred::reclaim();
                let done = if prog == crate::mount::NLM_PROGRAM {
                    nlm::call_nlm(srv, proc_, &record[at..], &cred, peer, local, udp)
                } else {
                    nlm::call_nsm(srv, proc_, &record[at..], peer)
                };
                match done {
                    nlm::DoneNlm::Reply(body) => {
                        let mut reply = rpc::accepted_reply(xid, AcceptStat::Success);
                        reply.append(body);
                        Some(reply)
                    }
                    nlm::DoneNlm::Garbage => {
                        rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from)
                    }
                    nlm::DoneNlm::NoProc => Some(rpc::accepted_reply(xid, AcceptStat::ProcUnavail)),
                }
            }
            Rest::Mount(record, vers, proc_, at, peer) => {
                crate::engine::cred::reclaim();
                let done = mount::call(srv, vers, proc_, &record[at..], peer);
                match done {
                    mount::DoneMnt::Reply(body) => {
                        let mut reply = rpc::accepted_reply(xid, AcceptStat::Success);
                        reply.append(body);
                        Some(reply)
                    }
                    mount::DoneMnt::Garbage => {
                        rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from)
                    }
                    mount::DoneMnt::NoProc => {
                        Some(rpc::accepted_reply(xid, AcceptStat::ProcUnavail))
                    }
                }
            }
        }
    }
}

/// Whether a READ on connection `conn` may lend file data from a mapping
/// (`sluice_engine::mapped`): not while replies wait for room in its
/// socket, since a reply that waits is copied anyway, and lending and then
/// copying costs more than copying once.
pub(super) fn may_lend(conn: Option<&Arc<callback::CbConn>>) -> bool {
    !conn.is_some_and(|c| c.backlogged())
}

/// The results `body` of an NFSv3 REMOVE, RMDIR or RENAME after the
/// directory syncs it left gave `r`: a failed sync turns a success into
/// the sync's error (the results of these procedures have the same form
/// either way), as if the procedure had synced itself.
fn nfs3_synced(mut body: Encoder, r: Result<(), crate::nfs4::Nfsstat4>) -> nfs3::Done3 {
    if let Err(st) = r {
        if body.as_slice().get(..4) == Some(&[0; 4][..]) {
            body.patch_u32(0, crate::nfs3::Nfsstat3::from(st).0);
        }
    }
    nfs3::Done3::Reply(body)
}

/// The reply record of an NFSv3 call.
fn v3_reply(xid: u32, done: nfs3::Done3) -> Option<Encoder> {
    match done {
        nfs3::Done3::Reply(body) => {
            let mut reply = rpc::accepted_reply(xid, AcceptStat::Success);
            reply.append(body);
            Some(reply)
        }
        nfs3::Done3::Garbage => rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from),
        nfs3::Done3::NoProc => Some(rpc::accepted_reply(xid, AcceptStat::ProcUnavail)),
        nfs3::Done3::WouldBlock => {
            unreachable!("an NFSv3 call stops to wait only where it must not")
        }
        nfs3::Done3::Syncing(..) => {
            unreachable!("an NFSv3 call leaves its syncs only where asked to")
        }
    }
}

/// The reply record for a COMPOUND4res (None: GARBAGE_ARGS).
fn compound_reply(xid: u32, body: Option<Encoder>) -> Option<Encoder> {
    match body {
        Some(body) => {
            let mut reply = rpc::accepted_reply(xid, AcceptStat::Success);
            reply.append(body);
            Some(reply)
        }
        None => rpc::error_reply(&CallError::Garbage(xid)).map(Encoder::from),
    }
}

#[cfg(test)]
mod tests;
