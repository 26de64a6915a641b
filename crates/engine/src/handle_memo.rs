//! The handles of inodes the server has seen, kept so that a listing
//! need not ask the kernel for every entry's handle: `name_to_handle_at`
//! walks the name once more, which costs as much as the stat before it.
//!
//! A kernel handle holds the inode's number and its generation. The
//! generation is new only when the number goes to a new inode, and the
//! number is free again only once the old inode is deleted. A fanotify
//! group with a mark on the whole file system (`FAN_DELETE_SELF`,
//! reporting file ids) hears of every such delete, and the kernel queues
//! the event before it frees the inode. So the memo forgets a number when
//! its delete is read from the group.
//!
//! A listing takes a [`Ticket`] (the count of events read), stats a batch
//! of entries, then reads the group ([`HandleMemo::fresh`]): every delete
//! of an inode those stats saw is read by then, by this listing or by
//! another, and counted after the ticket. A number with such a delete is
//! not answered for (it may already be a new inode's, whose handle
//! another listing may have kept); any other number still belongs to the
//! inode the stat saw, and a handle kept for it is that inode's. A handle
//! asked of the kernel is kept only if no delete of its number was read
//! after the read of the group that came before the asking.
//!
//! Handles asked through a descriptor of a file just made or looked up
//! ([`HandleMemo::note_held`]) are kept by the same rule, without a read
//! of the group of their own: the next read keeps them. The descriptor
//! holds the inode, so its number is its own while the handle is asked.
//!
//! Nothing is kept where fanotify cannot watch the file system (no
//! CAP_SYS_ADMIN, or a file system without file ids), nor for handle
//! types whose inode number this module cannot read: it knows ext4, xfs
//! and btrfs (local file systems, whose deletes all happen here), and
//! keeps nothing on others. It keeps only the inodes of its export's
//! device: on btrfs, where each subvolume is a device and deleting one
//! has no event for its inodes, fanotify marks only the top-level
//! subvolume (which cannot be deleted), so an export inside another keeps
//! nothing. What the memo
//! does not see: a generation changed in place by the root-only ioctls
//! `FS_IOC_SETVERSION` and `EXT4_IOC_SWAP_BOOT`.

use crate::fs::Stat;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Handles kept at most; the memo starts again empty when full.
const LIMIT: usize = 256 * 1024;

/// Kernel handle types this module reads inode numbers from (see
/// include/linux/exportfs.h): 32-bit number and generation (ext4, xfs
/// with small numbers), XFS's 64-bit number, btrfs's object ids.
const FILEID_INO32_GEN: i32 = 1;
const XFS_FILEID_INO64_GEN: i32 = 0x81;
const BTRFS_FILEID: i32 = 0x4d;
const BTRFS_FILEID_WITH_PARENT: i32 = 0x4e;
const BTRFS_FILEID_WITH_PARENT_ROOT: i32 = 0x4f;
/// The file systems whose handles [`ino_of`] reads: ext4, xfs, btrfs
/// (statfs magic numbers). Local ones: every delete is seen here.
const LOCAL_FILE_SYSTEMS: [libc::__fsword_t; 3] = [
    crate::fs::EXT4_MAGIC,
    crate::fs::XFS_MAGIC,
    crate::fs::BTRFS_MAGIC,
];

/// The inode number a kernel handle of type `kind` holds, for the types
/// this module knows.
fn ino_of(kind: i32, bytes: &[u8]) -> Option<u64> {
    match kind {
        FILEID_INO32_GEN if bytes.len() >= 8 => {
            Some(u32::from_ne_bytes(bytes[..4].try_into().ok()?) as u64)
        }
        XFS_FILEID_INO64_GEN
        | BTRFS_FILEID
        | BTRFS_FILEID_WITH_PARENT
        | BTRFS_FILEID_WITH_PARENT_ROOT
            if bytes.len() >= 12 =>
        {
            Some(u64::from_ne_bytes(bytes[..8].try_into().ok()?))
        }
        _ => None,
    }
}

/// The memo of one exported file system.
#[derive(Debug)]
pub struct HandleMemo {
    /// The fanotify group (non-blocking); None: nothing is kept.
    group: Option<OwnedFd>,
    /// The device of the watched directory: only its inodes are kept. (On
    /// btrfs every subvolume is a device of its own, and deleting one has
    /// no event for its inodes; fanotify marks only the top-level one,
    /// which cannot be deleted.)
    dev: u64,
    inner: RwLock<Inner<(u64, Arc<[u8]>)>>,
    /// Handles of inodes held open when they were asked of the kernel
    /// ([`HandleMemo::note_held`]), kept at the next read of the group.
    held: Mutex<Vec<Held>>,
    /// Handles found (for tests and metrics).
    hits: AtomicU64,
}

/// A handle noted by [`HandleMemo::note_held`]: the events read before it
/// was asked, the inode's number (on the memo's device), and the wire
/// handle.
#[derive(Debug)]
struct Held {
    ticket: u64,
    ino: u64,
    wire: Arc<[u8]>,
}

/// Handles noted by [`HandleMemo::note_held`] that wait at most for the
/// next read of the group: past this many, the noting reads it.
const HELD_LIMIT: usize = 4096;

/// What a watch keeps by inode number, and the events it has read.
#[derive(Debug)]
pub(crate) struct Inner<V> {
    /// Inode number -> what is kept of it (here: device and wire handle).
    pub(crate) kept: HashMap<u64, V, BuildHasherDefault<InoHasher>>,
    /// Events read from the group so far.
    events: u64,
    /// The inode numbers of the last [`LOG`] events, the newest last (see
    /// [`Fresh`]'s drop).
    log: VecDeque<u64>,
    /// The count of events when the memo last forgot everything.
    cleared_at: u64,
}

impl<V> Default for Inner<V> {
    fn default() -> Self {
        Inner {
            kept: HashMap::default(),
            events: 0,
            log: VecDeque::new(),
            cleared_at: 0,
        }
    }
}

impl<V> Inner<V> {
    /// The count of events read so far.
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    pub(crate) fn forget_all(&mut self) {
        tracing::debug!(
            kept = self.kept.len(),
            "a watch of the file system forgets everything (events lost or not understood)"
        );
        self.events += 1;
        self.cleared_at = self.events;
        self.kept.clear();
    }

    fn forget(&mut self, ino: u64) {
        self.events += 1;
        if self.log.len() == LOG {
            self.log.pop_front();
        }
        self.log.push_back(ino);
        self.kept.remove(&ino);
    }

    /// The numbers of the inodes deleted (or, for the attribute cache,
    /// changed) after `ticket` events.
    pub(crate) fn gone_since(&self, ticket: u64) -> Gone {
        let since = self.events.saturating_sub(ticket) as usize;
        if self.cleared_at > ticket || since > self.log.len() {
            return Gone::All;
        }
        Gone::These(self.log.iter().rev().take(since).copied().collect())
    }
}

/// Inodes deleted since a [`Ticket`]: these, or perhaps any.
#[derive(Debug)]
pub(crate) enum Gone {
    All,
    These(std::collections::HashSet<u64, BuildHasherDefault<InoHasher>>),
}

impl Gone {
    /// Whether inode `ino` may be among them.
    pub(crate) fn has(&self, ino: u64) -> bool {
        match self {
            Gone::All => true,
            Gone::These(set) => set.contains(&ino),
        }
    }
}

/// The count of events read when it was taken (see [`HandleMemo::ticket`]).
#[derive(Debug, Clone, Copy)]
pub struct Ticket(u64);

/// Events whose inode numbers are remembered, for handles asked of the
/// kernel while they were read.
const LOG: usize = 4096;

/// Hashes an inode number with one multiplication (Fibonacci hashing):
/// numbers are not chosen by clients, and often consecutive.
#[derive(Debug, Default)]
pub(crate) struct InoHasher(u64);

impl Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The memo as of a read of the group made after the stats to be
/// matched against it (see [`HandleMemo::fresh`]), and the handles asked
/// of the kernel since, to keep.
#[derive(Debug)]
pub struct Fresh<'a> {
    memo: &'a HandleMemo,
    /// Events read when it was made.
    ticket: u64,
    /// Inodes deleted between the stats' ticket and then: not answered for.
    gone: Gone,
    /// Inode number, device and wire handle of each handle noted.
    noted: Vec<(u64, u64, Arc<[u8]>)>,
}

impl HandleMemo {
    /// A memo that keeps nothing.
    pub fn off() -> Self {
        HandleMemo {
            group: None,
            dev: 0,
            inner: RwLock::default(),
            held: Mutex::default(),
            hits: AtomicU64::new(0),
        }
    }

    /// A memo for the file system holding `dir`; one that keeps nothing
    /// when fanotify cannot watch it, saying why.
    pub fn watch(dir: BorrowedFd<'_>) -> Self {
        match watch_on(dir, libc::FAN_DELETE_SELF | libc::FAN_ONDIR) {
            Ok((group, dev)) => HandleMemo {
                group: Some(group),
                dev,
                inner: RwLock::default(),
                held: Mutex::default(),
                hits: AtomicU64::new(0),
            },
            Err(why) => {
                tracing::info!(
                    "file handles are asked of the kernel for every entry of a listing: {why}"
                );
                Self::off()
            }
        }
    }

    /// Whether the memo keeps handles at all.
    pub fn on(&self) -> bool {
        self.group.is_some()
    }

    /// To be taken before the stats that a [`HandleMemo::fresh`] will
    /// answer for: the events read so far.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.inner.read().map_or(0, |g| g.events))
    }

    /// Reads the events queued so far, then answers for stats made
    /// between `before` and this call (take the ticket before them, call
    /// this after them, once for many), and keeps the handles noted in
    /// the [`Fresh`] when it is dropped.
    ///
    /// A number whose delete was read since `before` is not answered for,
    /// even from a handle kept since: the inode a stat saw may be the
    /// deleted one, the number a new inode's.
    pub fn fresh(&self, before: Ticket) -> Fresh<'_> {
        let mut f = Fresh {
            memo: self,
            ticket: 0,
            gone: Gone::All,
            noted: Vec::new(),
        };
        if self.group.is_some() {
            let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
            self.drain(&mut g);
            f.ticket = g.events;
            f.gone = g.gone_since(before.0);
        }
        f
    }

    /// Reads the events queued so far. Listings do; so does the server
    /// after it deletes something itself: fanotify compares each new
    /// event with those queued, so a long queue makes every delete on
    /// the file system dearer (measured on ext4: 10.9 us an unlink with no
    /// watch, 15.3 with the queue left to fill, 12.7 read every 64).
    pub fn read_deletes(&self) {
        if self.group.is_some() {
            let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
            self.drain(&mut g);
        }
    }

    /// Handles kept, and found (for tests and metrics).
    pub fn counts(&self) -> (usize, u64) {
        let kept = self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .kept
            .len();
        (kept, self.hits.load(Ordering::Relaxed))
    }

    /// Notes `wire`, the handle (of kernel type `kind`, bytes `bytes`) of
    /// the inode `st` describes, asked of the kernel through a descriptor
    /// that held the inode open, after `before` was taken: as a file just
    /// made or looked up gets its handle, so that the first listing of
    /// its directory need not ask for it again. Kept at the next read of
    /// the group, unless a delete of its number was read since `before`.
    ///
    /// Nothing read at once: the descriptor kept the inode, so its number
    /// was its own when the handle was asked, and its delete, if any, is
    /// queued after that, so read after `before` (the read that keeps the
    /// handle reads it first).
    pub fn note_held(&self, before: Ticket, st: &Stat, kind: i32, bytes: &[u8], wire: &[u8]) {
        if self.group.is_none() || st.dev != self.dev || ino_of(kind, bytes) != Some(st.ino) {
            return;
        }
        let waiting = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.push(Held {
                ticket: before.0,
                ino: st.ino,
                wire: wire.into(),
            });
            held.len()
        };
        if waiting >= HELD_LIMIT {
            self.read_deletes();
        }
    }

    /// Reads the events queued so far, then keeps the handles noted by
    /// [`HandleMemo::note_held`] whose inodes were not deleted since.
    fn drain(&self, g: &mut Inner<(u64, Arc<[u8]>)>) {
        let Some(group) = &self.group else {
            return;
        };
        drain(group, g);
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(oldest) = held.iter().map(|h| h.ticket).min() else {
            return;
        };
        // The deletes read since the oldest ticket: more than each
        // handle's own, never fewer.
        let dev = self.dev;
        keep_unless_gone(g, oldest, held.into_iter().map(|h| (h.ino, dev, h.wire)));
    }
}

impl Fresh<'_> {
    /// Notes `wire`, the handle (of kernel type `kind`, bytes `bytes`) of
    /// the inode `st` describes, asked of the kernel after this was made,
    /// to be kept when this is dropped. Not when its number is not that of
    /// `st` (the name was replaced between the stat and the handle).
    pub fn note(&mut self, st: &Stat, kind: i32, bytes: &[u8], wire: &Arc<[u8]>) {
        if self.memo.group.is_some()
            && st.dev == self.memo.dev
            && ino_of(kind, bytes) == Some(st.ino)
        {
            self.noted.push((st.ino, st.dev, wire.clone()));
        }
    }

    /// The kept handle of the inode `st` describes (made before the
    /// [`HandleMemo::fresh`] this came from); listings ask
    /// [`Fresh::get_all`] for a batch.
    #[cfg(test)]
    pub fn get(&self, st: &Stat) -> Option<Arc<[u8]>> {
        self.get_all([Some(st)]).pop().flatten()
    }

    /// [`Fresh::get`] for each of a batch of stats (None: none asked),
    /// under one lock: a listing asks for every entry of a batch.
    pub fn get_all<'s>(
        &self,
        stats: impl IntoIterator<Item = Option<&'s Stat>>,
    ) -> Vec<Option<Arc<[u8]>>> {
        let Ok(g) = self.memo.inner.read() else {
            return stats.into_iter().map(|_| None).collect();
        };
        let mut hits = 0;
        let found = stats
            .into_iter()
            .map(|st| {
                let st = st.filter(|st| st.dev == self.memo.dev && !self.gone.has(st.ino))?;
                match g.kept.get(&st.ino) {
                    Some((dev, wire)) if *dev == st.dev => {
                        hits += 1;
                        Some(wire.clone())
                    }
                    _ => None,
                }
            })
            .collect();
        drop(g);
        if hits > 0 {
            self.memo.hits.fetch_add(hits, Ordering::Relaxed);
        }
        found
    }
}

impl Drop for Fresh<'_> {
    /// Keeps the handles noted, but not those of inodes whose delete was
    /// read since this was made: the handle may be the deleted inode's,
    /// and its number may already be a new inode's.
    fn drop(&mut self) {
        if self.noted.is_empty() {
            return;
        }
        let mut g = self.memo.inner.write().unwrap_or_else(|e| e.into_inner());
        self.memo.drain(&mut g);
        keep_unless_gone(&mut g, self.ticket, self.noted.drain(..));
    }
}

/// Keeps `handles` (inode number, device, wire handle), asked of the
/// kernel after `since` events were read, but not those whose number had
/// a delete read since: the handle may be the deleted inode's, and the
/// number may already be a new inode's. A memo that would grow past
/// [`LIMIT`] starts again empty.
fn keep_unless_gone(
    g: &mut Inner<(u64, Arc<[u8]>)>,
    since: u64,
    handles: impl ExactSizeIterator<Item = (u64, u64, Arc<[u8]>)>,
) {
    let gone = g.gone_since(since);
    if g.kept.len() + handles.len() > LIMIT {
        g.kept.clear();
    }
    for (ino, dev, wire) in handles {
        if !gone.has(ino) {
            g.kept.insert(ino, (dev, wire));
        }
    }
}

/// Why fanotify cannot watch the file system holding `dir` for what
/// this module needs; or a group of `events` (reporting file ids) with a
/// mark on it, and the device of `dir`.
pub(crate) fn watch_on(dir: BorrowedFd<'_>, events: u64) -> Result<(OwnedFd, u64), String> {
    let magic = crate::fs::fs_magic(dir);
    if !magic.is_some_and(|m| LOCAL_FILE_SYSTEMS.contains(&m)) {
        // Others lay their handles out differently, or change files on
        // other machines without a local event.
        return Err("only ext4, xfs and btrfs are watched".into());
    }
    let dev = crate::fs::stat(dir).map_err(|e| e.to_string())?.dev;
    let group = group_on(dir, events)
        .map_err(|e| format!("fanotify cannot watch the file system ({e})"))?;
    Ok((group, dev))
}

fn group_on(dir: BorrowedFd<'_>, events: u64) -> io::Result<OwnedFd> {
    // SAFETY: plain system call with flag arguments.
    let fd = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_REPORT_FID | libc::FAN_NONBLOCK | libc::FAN_CLOEXEC,
            libc::O_RDONLY as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fanotify_init returned a new descriptor we own.
    let group = unsafe { OwnedFd::from_raw_fd(fd) };
    mark(&group, dir, libc::FAN_MARK_ADD, events)?;
    Ok(group)
}

/// Adds (`how`: FAN_MARK_ADD) or removes (FAN_MARK_REMOVE) `events` of
/// the mark of `group` on the whole file system holding `dir`.
pub(crate) fn mark(group: &OwnedFd, dir: BorrowedFd<'_>, how: u32, events: u64) -> io::Result<()> {
    // SAFETY: valid descriptors; a null path marks what `dir` (not an
    // O_PATH descriptor) is on: FAN_MARK_FILESYSTEM, its whole file
    // system.
    let r = unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            how | libc::FAN_MARK_FILESYSTEM,
            events,
            dir.as_raw_fd(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads every event queued in `group`; forgets what is kept of the
/// inodes they name.
pub(crate) fn drain<V>(group: &OwnedFd, g: &mut Inner<V>) {
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: reads into a buffer of its length.
        let n = unsafe { libc::read(group.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            // EAGAIN: nothing more queued. Any other error leaves the
            // queue unread: forget everything to stay right.
            if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
                g.forget_all();
            }
            return;
        }
        events_in(g, &buf[..n as usize]);
        // The kernel stops filling the buffer only when the queue is
        // empty or the next event does not fit. With room left for any
        // event this group reports (metadata and one file id record: 172
        // bytes at most), the queue was empty: no read just to hear
        // EAGAIN (a REMOVE drains the group after its unlink).
        if n as usize + MAX_EVENT_LEN <= buf.len() {
            return;
        }
    }
}

/// More than the longest event of a group reporting file ids: metadata
/// (24 bytes), the record's header and file system id (12), the handle's
/// header (8) and at most MAX_HANDLE_SZ (128) bytes of handle.
const MAX_EVENT_LEN: usize = 256;

/// The events of one read of a group.
fn events_in<V>(g: &mut Inner<V>, mut buf: &[u8]) {
    while !buf.is_empty() {
        let len = match buf.get(..4) {
            Some(b) => u32::from_ne_bytes(b.try_into().expect("4 bytes")) as usize,
            None => 0,
        };
        if len < META_LEN || len > buf.len() {
            // Not what the kernel writes: trust nothing kept.
            g.forget_all();
            return;
        }
        event(g, &buf[..len]);
        buf = &buf[len..];
    }
}

/// One event (metadata and info records).
fn event<V>(g: &mut Inner<V>, ev: &[u8]) {
    let meta_len = u16::from_ne_bytes([ev[6], ev[7]]) as usize;
    let mask = u64::from_ne_bytes(ev[8..16].try_into().expect("8 bytes"));
    let ino = if mask & libc::FAN_Q_OVERFLOW != 0 {
        None
    } else {
        fid_ino(ev.get(meta_len..).unwrap_or_default())
    };
    match ino {
        Some(ino) => g.forget(ino),
        // Lost events, or a handle this module cannot read.
        None => g.forget_all(),
    }
}

/// Bytes of struct fanotify_event_metadata.
const META_LEN: usize = 24;

/// The inode number in an event's file id record (struct
/// fanotify_event_info_fid: header, fsid, then a struct file_handle).
fn fid_ino(info: &[u8]) -> Option<u64> {
    // Header: info_type (1), pad (1), len (2); fsid (8); handle_bytes (4),
    // handle_type (4), the handle.
    if info.len() < 20 || info[0] != libc::FAN_EVENT_INFO_TYPE_FID {
        return None;
    }
    let hlen = u32::from_ne_bytes(info[12..16].try_into().ok()?) as usize;
    let kind = i32::from_ne_bytes(info[16..20].try_into().ok()?);
    ino_of(kind, info.get(20..20 + hlen)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs;
    use crate::handle::kernel_handle;
    use std::ffi::CStr;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;

    /// A directory next to the build (a disk file system, as exports are),
    /// removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!(".sluice-memo-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).expect("a directory next to the build");
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A memo on `dir`, which must keep handles (tests run as root, on a
    /// disk file system).
    fn memo_on(dir: &std::fs::File) -> HandleMemo {
        let m = HandleMemo::watch(dir.as_fd());
        assert!(
            m.on(),
            "fanotify cannot watch the build's file system (tests run as root)"
        );
        m
    }

    /// A directory holding `files` (each holding its name), opened, and a
    /// memo watching it.
    fn watched(tag: &str, files: &[&str]) -> (Dir, std::fs::File, HandleMemo) {
        let d = Dir::new(tag);
        for n in files {
            std::fs::write(d.0.join(n), n).unwrap();
        }
        let dir = std::fs::File::open(&d.0).unwrap();
        let m = memo_on(&dir);
        (d, dir, m)
    }

    /// Stat and kernel handle of `name` in `dir`; the handle doubles as
    /// the wire handle here.
    fn seen(dir: &std::fs::File, name: &CStr) -> (Stat, i32, Vec<u8>) {
        let st = fs::stat_at(dir.as_fd(), name).expect("stat");
        let (kind, bytes) = kernel_handle(dir.as_fd(), name).expect("handle");
        (st, kind, bytes)
    }

    fn keep(m: &HandleMemo, dir: &std::fs::File, name: &CStr) -> Stat {
        let t = m.ticket();
        let (st, kind, bytes) = seen(dir, name);
        let mut f = m.fresh(t);
        assert_eq!(f.get(&st), None);
        f.note(&st, kind, &bytes, &Arc::from(bytes.as_slice()));
        drop(f);
        st
    }

    /// The memo's handle for `name` in `dir`, stat'ed now.
    fn found(m: &HandleMemo, dir: &std::fs::File, name: &CStr) -> Option<Vec<u8>> {
        let t = m.ticket();
        let st = fs::stat_at(dir.as_fd(), name).expect("stat");
        m.fresh(t).get(&st).map(|w| w.to_vec())
    }

    #[test]
    fn inode_numbers_are_read_from_the_handle_types_of_ext4_xfs_and_btrfs() {
        let mut h = 77u32.to_ne_bytes().to_vec();
        h.extend(5u32.to_ne_bytes());
        assert_eq!(ino_of(FILEID_INO32_GEN, &h), Some(77));
        let mut h = (1u64 << 40).to_ne_bytes().to_vec();
        h.extend(9u32.to_ne_bytes());
        assert_eq!(ino_of(XFS_FILEID_INO64_GEN, &h), Some(1 << 40));
        h.extend(5u64.to_ne_bytes()); // btrfs: object id, root id, generation
        for kind in [
            BTRFS_FILEID,
            BTRFS_FILEID_WITH_PARENT,
            BTRFS_FILEID_WITH_PARENT_ROOT,
        ] {
            assert_eq!(ino_of(kind, &h), Some(1 << 40));
        }
        assert_eq!(ino_of(FILEID_INO32_GEN, &h[..7]), None, "too short");
        assert_eq!(ino_of(0x52, &h), None, "a type it does not know");
    }

    #[test]
    fn an_events_file_id_gives_the_deleted_inodes_number() {
        let mut info = vec![libc::FAN_EVENT_INFO_TYPE_FID, 0, 28, 0];
        info.extend([0u8; 8]); // fsid
        info.extend(8u32.to_ne_bytes());
        info.extend(FILEID_INO32_GEN.to_ne_bytes());
        info.extend(4242u32.to_ne_bytes());
        info.extend(1u32.to_ne_bytes());
        assert_eq!(fid_ino(&info), Some(4242));
        assert_eq!(fid_ino(&info[..24]), None, "handle cut short");
        info[0] = 2; // a record of another kind
        assert_eq!(fid_ino(&info), None);
    }

    #[test]
    fn a_kept_handle_is_found_until_its_inode_is_deleted() {
        let (d, dir, m) = watched("kept", &["a"]);
        let st = keep(&m, &dir, c"a");
        let (_, _, bytes) = seen(&dir, c"a");
        assert_eq!(found(&m, &dir, c"a"), Some(bytes.clone()));
        assert_eq!(m.counts(), (1, 1));
        // Another device with the same number is not this inode.
        let other = Stat {
            dev: st.dev + 1,
            ..st
        };
        assert_eq!(m.fresh(m.ticket()).get(&other), None);

        // Deleted, and its number given to a new file (ext4 gives it
        // again at once): the old handle is not found for the new file.
        std::fs::remove_file(d.0.join("a")).unwrap();
        std::fs::write(d.0.join("b"), b"b").unwrap();
        let (st_b, _, bytes_b) = seen(&dir, c"b");
        assert_ne!(found(&m, &dir, c"b"), Some(bytes), "the old file's handle");
        assert_eq!(m.counts().0, 0, "a deleted inode's handle was kept");
        assert_eq!(keep(&m, &dir, c"b"), st_b);
        assert_eq!(found(&m, &dir, c"b"), Some(bytes_b));
    }

    /// Notes the handle of `name` in `dir` asked through a descriptor of
    /// it, as a file just made or looked up is; returns its stat and
    /// handle, and the descriptor.
    fn note_opened(m: &HandleMemo, dir: &std::fs::File, name: &CStr) -> (Stat, Vec<u8>, OwnedFd) {
        let fd = fs::open_path_at(dir.as_fd(), name).expect("open");
        let st = fs::stat(fd.as_fd()).expect("stat");
        let t = m.ticket();
        let (kind, bytes) = kernel_handle(fd.as_fd(), c"").expect("handle");
        m.note_held(t, &st, kind, &bytes, &bytes);
        (st, bytes, fd)
    }

    #[test]
    fn a_handle_asked_through_a_descriptor_is_kept_at_the_next_read() {
        let (_d, dir, m) = watched("held", &["a", "b"]);
        let (st_a, bytes_a, _fd) = note_opened(&m, &dir, c"a");
        let (st_b, bytes_b, _fd) = note_opened(&m, &dir, c"b");
        assert_eq!(m.counts().0, 0, "kept before the group was read");
        let f = m.fresh(m.ticket());
        assert_eq!(f.get(&st_a).as_deref(), Some(bytes_a.as_slice()));
        assert_eq!(f.get(&st_b).as_deref(), Some(bytes_b.as_slice()));
        assert_eq!(m.counts(), (2, 2));
    }

    #[test]
    fn a_noted_handle_whose_inode_is_deleted_before_the_next_read_is_not_kept() {
        // a is looked up and its handle noted; then a is removed and its
        // descriptor closed, and a new file may take its number before
        // the group is read: a's handle must not be kept for the number.
        let (d, dir, m) = watched("held-gone", &["a", "x"]);
        let (st_a, _, fd) = note_opened(&m, &dir, c"a");
        let (st_x, bytes_x, _fdx) = note_opened(&m, &dir, c"x");
        std::fs::remove_file(d.0.join("a")).unwrap();
        drop(fd);
        std::fs::write(d.0.join("b"), b"b").unwrap();
        let f = m.fresh(m.ticket());
        assert_eq!(f.get(&st_a), None, "a deleted inode's handle was kept");
        assert_eq!(f.get(&st_x).as_deref(), Some(bytes_x.as_slice()));
        let st_b = fs::stat_at(dir.as_fd(), c"b").unwrap();
        assert_eq!(f.get(&st_b), None, "b found with another inode's handle");
    }

    #[test]
    fn noted_handles_are_kept_by_the_noting_once_many_wait() {
        let names: Vec<String> = (0..HELD_LIMIT).map(|i| format!("f{i}")).collect();
        let (d, dir, m) = watched("held-many", &[]);
        for n in &names {
            std::fs::write(d.0.join(n), b"f").unwrap();
        }
        for n in &names[..HELD_LIMIT - 1] {
            note_opened(&m, &dir, &std::ffi::CString::new(n.as_str()).unwrap());
        }
        assert_eq!(m.counts().0, 0);
        assert_eq!(m.held.lock().unwrap().len(), HELD_LIMIT - 1);
        note_opened(
            &m,
            &dir,
            &std::ffi::CString::new(names[HELD_LIMIT - 1].as_str()).unwrap(),
        );
        assert!(
            m.held.lock().unwrap().is_empty(),
            "the noted handles still wait"
        );
        // (Fewer when files deleted by tests running beside this one gave
        // their numbers to these: those are not kept.)
        assert!(m.counts().0 > 0, "none of the noted handles was kept");
    }

    #[test]
    fn deletes_queued_past_one_read_are_all_read_at_once() {
        let names: Vec<String> = (0..400).map(|i| format!("f{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (d, dir, m) = watched("many", &refs);
        for n in &names {
            keep(&m, &dir, &std::ffi::CString::new(n.as_str()).unwrap());
        }
        assert_eq!(m.counts().0, 400);
        // 400 events of about 52 bytes each: several reads of the group.
        for n in &names {
            std::fs::remove_file(d.0.join(n)).unwrap();
        }
        m.read_deletes();
        assert_eq!(m.counts().0, 0, "handles of deleted inodes still kept");
    }

    #[test]
    fn a_file_deleted_while_open_is_forgotten_when_it_is_closed() {
        let (d, dir, m) = watched("open", &["a"]);
        let held = std::fs::File::open(d.0.join("a")).unwrap();
        let st = keep(&m, &dir, c"a");
        std::fs::remove_file(d.0.join("a")).unwrap();
        // Still open, the inode (and its number) cannot be given again.
        assert!(m.fresh(m.ticket()).get(&st).is_some());
        drop(held);
        assert_eq!(m.counts().0, 1);
        m.fresh(m.ticket());
        assert_eq!(m.counts().0, 0, "the closed file's handle is kept");
    }

    #[test]
    fn a_handle_whose_inode_is_deleted_before_it_is_kept_is_not_kept() {
        let (d, dir, m) = watched("race", &["a", "x"]);
        let t = m.ticket();
        let (st_a, kind, bytes_a) = seen(&dir, c"a");
        let (st_x, _, bytes_x) = seen(&dir, c"x");
        let mut f = m.fresh(t);
        f.note(&st_a, kind, &bytes_a, &Arc::from(bytes_a.as_slice()));
        f.note(&st_x, kind, &bytes_x, &Arc::from(bytes_x.as_slice()));
        // x is deleted, and another reading of the memo hears of it,
        // before the handles are kept: x's number may be a new inode's
        // by then. a's delete-free handle is kept.
        std::fs::remove_file(d.0.join("x")).unwrap();
        m.fresh(m.ticket());
        drop(f);
        let f = m.fresh(m.ticket());
        assert_eq!(f.get(&st_x), None, "a deleted inode's handle was kept");
        assert_eq!(f.get(&st_a).as_deref(), Some(bytes_a.as_slice()));
    }

    #[test]
    fn a_stat_of_an_inode_deleted_since_is_not_answered_with_its_numbers_next_owner() {
        // One listing stats x; x is deleted, another listing reads the
        // delete, a new file takes x's number and that listing keeps the
        // new file's handle. The first listing must not give x's entry
        // the new file's handle.
        let (d, dir, m) = watched("reuse", &[]);
        // ext4 gives a freed number to the next file created, but tests
        // running beside this one may create the next file, and keep it:
        // files are created until one gets x's number (those before it
        // keep theirs), and the whole case is tried again if none does.
        for attempt in 0..3 {
            let x = std::ffi::CString::new(format!("x{attempt}")).unwrap();
            std::fs::write(d.0.join(x.to_str().unwrap()), b"x").unwrap();
            let t = m.ticket();
            let (st_x, _, _) = seen(&dir, &x);
            std::fs::remove_file(d.0.join(x.to_str().unwrap())).unwrap();
            m.fresh(m.ticket());
            let y = (0..1000)
                .map(|i| std::ffi::CString::new(format!("y{attempt}-{i}")).unwrap())
                .find(|y| {
                    let p = d.0.join(y.to_str().unwrap());
                    std::fs::write(&p, b"y").unwrap();
                    std::fs::metadata(&p).unwrap().ino() == st_x.ino
                });
            let Some(y) = y else { continue };
            let st_y = keep(&m, &dir, &y);
            assert_eq!(st_y.ino, st_x.ino);
            assert!(found(&m, &dir, &y).is_some());
            assert_eq!(m.fresh(t).get(&st_x), None, "x listed with y's handle");
            return;
        }
        panic!("a deleted file's inode number was not given again in 3 tries of 1000 new files");
    }

    #[test]
    fn a_handle_of_another_inode_than_the_stat_is_not_kept() {
        let (_d, dir, m) = watched("other", &["a", "b"]);
        let t = m.ticket();
        let (st_a, _, _) = seen(&dir, c"a");
        let (_, kind, bytes_b) = seen(&dir, c"b");
        let mut f = m.fresh(t);
        f.note(&st_a, kind, &bytes_b, &Arc::from(bytes_b.as_slice()));
        drop(f);
        assert_eq!(m.counts().0, 0, "b's handle kept as a's");
    }

    proptest::proptest! {
        /// Whatever a read of the group holds, reading it does not panic,
        /// and what is not well formed forgets everything.
        #[test]
        fn any_bytes_read_from_the_group_are_taken_safely(
            buf in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let mut g: Inner<(u64, Arc<[u8]>)> = Inner::default();
            g.kept.insert(7, (1, Arc::from(vec![1u8])));
            events_in(&mut g, &buf);
            proptest::prop_assert!(g.events >= u64::from(!buf.is_empty()));
            if buf.len() < META_LEN && !buf.is_empty() {
                proptest::prop_assert!(g.kept.is_empty() && g.cleared_at == g.events);
            }
        }
    }

    #[test]
    fn a_memo_that_is_off_keeps_nothing() {
        let d = Dir::new("off");
        std::fs::write(d.0.join("a"), b"a").unwrap();
        let dir = std::fs::File::open(&d.0).unwrap();
        let m = HandleMemo::off();
        keep(&m, &dir, c"a");
        assert_eq!(found(&m, &dir, c"a"), None);
        assert_eq!(m.counts(), (0, 0));
    }
}
