//! An exported directory tree: its root, its handle key, and the mapping
//! between wire handles and open descriptors.

use super::attr_cache::AttrCache;
use super::cred::as_root;
use super::fs::{self, Stat};
use super::handle::{kernel_handle, open_kernel_handle, HandleError, HandleKey};
use super::handle_memo::{Fresh, HandleMemo, InoHasher};
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::BuildHasherDefault;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Descriptors kept open for recently used handles.
const CACHE_LIMIT: usize = 8192;
/// How often, at most, the cache is swept of objects removed behind the
/// server's back (see [`Export::sweep`]).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One exported directory.
pub struct Export {
    path: PathBuf,
    root: Arc<OwnedFd>,
    root_fh: Vec<u8>,
    root_stat: Stat,
    /// A plain (not O_PATH) descriptor on the file system, which
    /// open_by_handle_at needs as its mount reference.
    mount: OwnedFd,
    key: HandleKey,
    id: u8,
    cache: Mutex<Cache>,
    last_sweep: Mutex<std::time::Instant>,
    /// Handles of inodes seen, for listings.
    memo: HandleMemo,
    /// Attributes of files listed, for the next listings.
    attrs: AttrCache,
    /// Whether directory entries carry the inode numbers a stat gives
    /// (see [`fs::numbers_in_directory`]).
    numbers_in_directory: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("path", &self.path)
            .field("id", &self.id)
            .finish()
    }
}

impl Export {
    /// Opens `path` for export with handles sealed by `key`, keeping the
    /// attributes of files listed for [`crate::attr_cache::KEEP_FOR`].
    pub fn open(path: &Path, id: u8, key: HandleKey) -> io::Result<Self> {
        Self::open_keeping(path, id, key, super::attr_cache::KEEP_FOR)
    }

    /// [`Export::open`], keeping the attributes of files listed for
    /// `keep_for` (zero: not at all).
    pub fn open_keeping(
        path: &Path,
        id: u8,
        key: HandleKey,
        keep_for: std::time::Duration,
    ) -> io::Result<Self> {
        let root = fs::open_dir_path(path)?;
        let root_stat = fs::stat(root.as_fd())?;
        let (kind, bytes) = kernel_handle(root.as_fd(), c"").map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "the file system of {} cannot give file handles: {e}",
                    path.display()
                ),
            )
        })?;
        let root_fh = key.seal(id, kind, &bytes);
        let mount = fs::reopen(root.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        // Check now that handles can be opened again (needs root).
        open_kernel_handle(mount.as_fd(), kind, &bytes).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot open file handles on {} (sluice must run as root): {e}",
                    path.display()
                ),
            )
        })?;
        // fanotify marks through a descriptor that is not O_PATH.
        let memo = HandleMemo::watch(mount.as_fd());
        let attrs = AttrCache::watch(mount.as_fd(), keep_for);
        let numbers = fs::fs_magic(root.as_fd()).is_some_and(fs::numbers_in_directory);
        if !numbers {
            tracing::info!(
                "{}: listings stat every entry for its number: the directory's numbers are trusted on ext4, xfs, btrfs and tmpfs only",
                path.display()
            );
        }
        Ok(Export {
            memo,
            attrs,
            numbers_in_directory: numbers.into(),
            path: path.to_path_buf(),
            root: Arc::new(root),
            root_fh,
            root_stat,
            mount,
            key,
            id,
            cache: Mutex::new(Cache::default()),
            last_sweep: Mutex::new(std::time::Instant::now()),
        })
    }

    /// The exported directory on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The export id sealed into its handles.
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The wire handle of the export root.
    pub fn root_fh(&self) -> &[u8] {
        &self.root_fh
    }

    /// The root directory descriptor.
    pub fn root_fd(&self) -> Arc<OwnedFd> {
        self.root.clone()
    }

    /// True when `st` describes the export root.
    pub fn is_root(&self, st: &Stat) -> bool {
        st.dev == self.root_stat.dev && st.ino == self.root_stat.ino
    }

    /// The device of the exported file system.
    pub fn dev(&self) -> u64 {
        self.root_stat.dev
    }

    /// Wire handle for the object behind `fd`.
    pub fn handle_of(&self, fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
        let (kind, bytes) = kernel_handle(fd, c"")?;
        Ok(self.key.seal(self.id, kind, &bytes))
    }

    /// Wire handle for the object behind `fd`, which `st` describes, just
    /// opened by name: [`Export::handle_of`], which the memo of handles
    /// then keeps for the listings of its directory (see
    /// [`HandleMemo::note_held`]).
    pub fn handle_of_opened(&self, fd: BorrowedFd<'_>, st: &Stat) -> io::Result<Vec<u8>> {
        let before = self.memo.ticket();
        let (kind, bytes) = kernel_handle(fd, c"")?;
        let wire = self.key.seal(self.id, kind, &bytes);
        self.memo.note_held(before, st, kind, &bytes, &wire);
        Ok(wire)
    }

    /// Wire handle for `name` in directory `dir` (not following symlinks).
    pub fn handle_in(&self, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
        let (kind, bytes) = kernel_handle(dir, name)?;
        Ok(self.key.seal(self.id, kind, &bytes))
    }

    /// True when the numbers of directory entries (`d_ino`) are those a
    /// stat of the entry gives, so that a listing may answer file ids
    /// (and, with the entry's type, types) from the directory alone.
    pub fn numbers_in_directory(&self) -> bool {
        self.numbers_in_directory
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes listings stat every entry for its number, as on a file
    /// system whose directory numbers are not trusted (for tests).
    #[doc(hidden)]
    pub fn distrust_numbers_in_directory(&self) {
        self.numbers_in_directory
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The memo of handles seen (see [`crate::handle_memo`]).
    pub fn memo(&self) -> &HandleMemo {
        &self.memo
    }

    /// The attributes of files listed (see [`crate::attr_cache`]).
    pub fn attrs(&self) -> &AttrCache {
        &self.attrs
    }

    /// The attributes of `entries`, a batch read from directory `dir` on
    /// device `dir_dev`, for a listing: None for the entries `wanted`
    /// refuses, for those gone meanwhile and for those on another file
    /// system (mounted there, not exported). The attribute cache gives
    /// those of non-directories it kept, when the directory's inode number
    /// and type match them; the others are stat'ed, and the cache keeps
    /// the stats it may. What came from the cache keeps the time it was
    /// stat'ed at.
    pub fn stats_of(
        &self,
        dir: BorrowedFd<'_>,
        dir_dev: u64,
        entries: &[fs::DirEntry],
        wanted: impl Fn(&fs::DirEntry) -> bool,
    ) -> Vec<Option<Stat>> {
        let numbers = self.numbers_in_directory();
        // Looked up by the number the directory gives, where it is the
        // one a stat gives: non-directories only (a mount has no event).
        let keys = entries
            .iter()
            .map(|ent| (numbers && wanted(ent) && ent.mode().is_some()).then_some(ent.ino));
        let (kept, ticket) = if self.attrs.on() && keys.clone().any(|k| k.is_some()) {
            let (kept, t) = self.attrs.get_all(dir_dev, keys);
            (kept, Some(t))
        } else {
            (Vec::new(), None)
        };
        let mut kept = kept.into_iter();
        let mut statted = Vec::new();
        let dev = self.dev();
        let stats = entries
            .iter()
            .map(|ent| {
                let kept = kept.next().flatten();
                if !wanted(ent) {
                    return None;
                }
                let same =
                    |st: &Stat| st.ino == ent.ino && ent.mode() == Some(st.mode & libc::S_IFMT);
                if let Some(st) = kept.filter(same) {
                    return Some(st);
                }
                let st = fs::stat_at(dir, &ent.name)
                    .ok()
                    .filter(|st| st.dev == dev)?;
                if ticket.is_some() {
                    statted.push(st);
                }
                Some(st)
            })
            .collect();
        if let Some(t) = ticket.filter(|_| !statted.is_empty()) {
            self.attrs.keep(t, &statted);
        }
        stats
    }

    /// Wire handle for `name` in directory `dir`, which `st` describes
    /// (a stat made between the ticket `fresh` was made from and `fresh`):
    /// `kept`, the memo's (see [`Fresh::get_all`]), or else the kernel's,
    /// which the memo then keeps.
    pub fn handle_seen(
        &self,
        fresh: &mut Fresh<'_>,
        kept: Option<Arc<[u8]>>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
    ) -> io::Result<Arc<[u8]>> {
        if let Some(wire) = kept {
            return Ok(wire);
        }
        let (kind, bytes) = kernel_handle(dir, name)?;
        let wire: Arc<[u8]> = self.key.seal(self.id, kind, &bytes).into();
        fresh.note(st, kind, &bytes, &wire);
        Ok(wire)
    }

    /// Opens the object a wire handle names, as an O_PATH descriptor.
    pub fn resolve(&self, wire: &[u8]) -> Result<Arc<OwnedFd>, HandleError> {
        self.resolve_with(wire, false).map(|(fd, _)| fd)
    }

    /// [`Export::resolve`], and the stat that checked the handle is not
    /// stale (None for the export root, which is not checked). With
    /// `full` it asked for everything, times included: for a caller about
    /// to answer the object's attributes. Without, it has only the type,
    /// mode, inode number, links and device (see [`fs::identity`]).
    pub fn resolve_with(
        &self,
        wire: &[u8],
        full: bool,
    ) -> Result<(Arc<OwnedFd>, Option<Stat>), HandleError> {
        // The status that checks a descriptor's object is still there.
        // Not a full stat unless asked: asking for the times would make
        // the next write take a new one.
        let check = |fd: BorrowedFd<'_>| {
            if full {
                fs::stat(fd)
            } else {
                fs::identity(fd)
            }
        };
        if wire == self.root_fh.as_slice() {
            return Ok((self.root.clone(), None));
        }
        let cached = self.cache.lock().ok().and_then(|c| c.fd(wire));
        if let Some(fd) = cached {
            // A descriptor stays valid after its object is removed; a
            // removed object's handle is stale.
            match check(fd.as_fd()) {
                Ok(st) if st.nlink > 0 => return Ok((fd, Some(st))),
                _ => {
                    if let Ok(mut c) = self.cache.lock() {
                        c.remove(wire);
                    }
                    return Err(HandleError::Stale);
                }
            }
        }
        let (export, kind, bytes) = self.key.open(wire)?;
        if export != self.id {
            return Err(HandleError::Stale);
        }
        let fd = as_root(|| open_kernel_handle(self.mount.as_fd(), kind, bytes))
            .map_err(|_| HandleError::Stale)?;
        let st = check(fd.as_fd()).map_err(|_| HandleError::Stale)?;
        if st.dev != self.root_stat.dev || st.nlink == 0 {
            return Err(HandleError::Stale);
        }
        let fd = Arc::new(fd);
        self.sweep_if_due();
        self.remember(wire, &fd, &st);
        Ok((fd, Some(st)))
    }

    /// [`Export::sweep`], unless it ran less than [`SWEEP_EVERY`] ago:
    /// when a handle is opened, in case the server's timer is late.
    fn sweep_if_due(&self) {
        let due = self.last_sweep.lock().is_ok_and(|mut t| {
            let due = t.elapsed() >= SWEEP_EVERY;
            if due {
                *t = std::time::Instant::now();
            }
            due
        });
        if due {
            self.sweep();
        }
    }

    /// [`Export::sweep`] now, from the server's timer (every
    /// [`SWEEP_EVERY`]), so that an idle server lets go of removed files
    /// too; the sweeps that handle lookups would start wait for the next.
    /// It also lets the attribute cache rest (see [`AttrCache::rest`]).
    pub fn sweep_on_timer(&self) {
        if let Ok(mut t) = self.last_sweep.lock() {
            *t = std::time::Instant::now();
        }
        self.sweep();
        self.attrs.rest();
    }

    /// Drops the cached descriptors of objects that have no name left
    /// (removed by a local process, not through the server): a cached
    /// descriptor would keep a removed file's blocks allocated.
    ///
    /// The descriptors are looked at outside the cache's lock: a stat of
    /// each of a full cache's 8,000 took 8 ms, a wait for every handle
    /// resolved meanwhile. Under the lock, only the dead ones go (and
    /// only if their handle still has the descriptor that was looked at).
    pub fn sweep(&self) {
        let Ok(kept) = self.cache.lock().map(|c| c.all()) else {
            return;
        };
        let dead: Vec<_> = kept
            .into_iter()
            .filter(|(_, fd)| !fs::identity(fd.as_fd()).is_ok_and(|st| st.nlink > 0))
            .collect();
        if dead.is_empty() {
            return;
        }
        if let Ok(mut c) = self.cache.lock() {
            for (wire, fd) in &dead {
                if c.fd(wire).is_some_and(|now| Arc::ptr_eq(&now, fd)) {
                    c.remove(wire);
                }
            }
        }
        // The descriptors close here, outside the lock, with `dead`.
    }

    /// Handles with a cached descriptor (for tests).
    pub fn cached(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.by_wire.len())
    }

    /// Opens the object a wire handle names even when it has no name left
    /// (removed, or renamed over, while something still holds it open):
    /// for callers that know it is still in use. None when the kernel no
    /// longer has it.
    pub fn resolve_unlinked(&self, wire: &[u8]) -> Option<(OwnedFd, fs::Stat)> {
        let (export, kind, bytes) = self.key.open(wire).ok()?;
        if export != self.id {
            return None;
        }
        let fd = as_root(|| open_kernel_handle(self.mount.as_fd(), kind, bytes)).ok()?;
        let st = fs::stat(fd.as_fd()).ok()?;
        (st.dev == self.root_stat.dev).then_some((fd, st))
    }

    /// Keeps `fd` as the descriptor of handle `wire` (one just opened by
    /// handle, or by name: the client that looked the name up or created
    /// it sends the handle next, and [`Export::resolve`] then need not
    /// open it again). `st`, a stat of `fd`, lets
    /// [`Export::cached_handle`] and [`Export::forget_inode`] find the
    /// handle by inode. A full cache is emptied first.
    pub fn remember(&self, wire: &[u8], fd: &Arc<OwnedFd>, st: &Stat) {
        if let Ok(mut c) = self.cache.lock() {
            if c.by_wire.len() >= CACHE_LIMIT {
                c.clear();
            }
            c.insert(wire, fd, (st.dev, st.ino));
        }
    }

    /// The handle and the cached descriptor of the inode `st` describes
    /// (a stat of a descriptor just opened by name), when the cache holds
    /// one: the client's next call then need not ask the kernel for the
    /// handle. A cached descriptor holds its inode, so no other inode can
    /// have its number while it is cached: the same number on the same
    /// device is the same inode.
    pub fn cached_handle(&self, st: &Stat) -> Option<(Vec<u8>, Arc<OwnedFd>)> {
        let c = self.cache.lock().ok()?;
        let wire = c.by_ino.get(&(st.dev, st.ino))?;
        let fd = c.by_wire.get(wire)?.0.clone();
        Some((wire.to_vec(), fd))
    }

    /// Forgets the cached descriptor of the inode `st` describes (a stat
    /// of a name about to be removed or renamed over), and reads the
    /// deletes queued for the memo of handles (this one among them, once
    /// its last descriptor is closed). The descriptor is found without
    /// asking the kernel for the handle: every descriptor the cache keeps
    /// was remembered with its inode (by [`Export::resolve`] and by
    /// callers that opened it by name), and none of another inode has its
    /// number while it is kept.
    pub fn forget_inode(&self, st: &Stat) {
        let fd = self.cache.lock().ok().and_then(|mut c| {
            let wire = c.by_ino.get(&(st.dev, st.ino))?.clone();
            c.remove(&wire)
        });
        drop(fd);
        self.memo.read_deletes();
    }
}

/// Descriptors kept open for recently used handles, by handle and by
/// inode (device and number).
/// (The handle is kept once, shared by both maps; inodes are hashed with
/// one multiplication: their numbers are not chosen by clients.)
#[derive(Default)]
struct Cache {
    by_wire: HashMap<Arc<[u8]>, Kept>,
    by_ino: InoIndex,
}

/// The handles of cached descriptors by inode.
type InoIndex = HashMap<Ino, Arc<[u8]>, BuildHasherDefault<InoHasher>>;

/// An inode: its device and number.
type Ino = (u64, u64);

/// A cached descriptor, and its inode.
type Kept = (Arc<OwnedFd>, Ino);

impl Cache {
    fn fd(&self, wire: &[u8]) -> Option<Arc<OwnedFd>> {
        self.by_wire.get(wire).map(|(fd, _)| fd.clone())
    }

    /// Keeps `fd` for `wire` unless it has one already.
    fn insert(&mut self, wire: &[u8], fd: &Arc<OwnedFd>, ino: Ino) {
        if self.by_wire.contains_key(wire) {
            return;
        }
        let wire: Arc<[u8]> = Arc::from(wire);
        self.by_ino.insert(ino, wire.clone());
        self.by_wire.insert(wire, (fd.clone(), ino));
    }

    fn remove(&mut self, wire: &[u8]) -> Option<Arc<OwnedFd>> {
        let (fd, ino) = self.by_wire.remove(wire)?;
        unindex(&mut self.by_ino, ino, wire);
        Some(fd)
    }

    /// Every handle and its descriptor.
    fn all(&self) -> Vec<(Arc<[u8]>, Arc<OwnedFd>)> {
        self.by_wire
            .iter()
            .map(|(wire, (fd, _))| (wire.clone(), fd.clone()))
            .collect()
    }

    fn clear(&mut self) {
        self.by_wire.clear();
        self.by_ino.clear();
    }
}

/// Drops the inode index's entry of `ino` when it is `wire`'s.
fn unindex(by_ino: &mut InoIndex, ino: Ino, wire: &[u8]) {
    if by_ino.get(&ino).is_some_and(|w| **w == *wire) {
        by_ino.remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(tag: &str) -> (Export, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sluice-export-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ex = Export::open(&dir, 0, HandleKey::new([9; 32])).unwrap();
        (ex, dir)
    }

    /// The cached descriptor and handle of `name`, as LOOKUP keeps them.
    fn keep(ex: &Export, name: &CStr) -> (Vec<u8>, Stat) {
        let fd = fs::open_path_at(ex.root_fd().as_fd(), name).unwrap();
        let st = fs::stat(fd.as_fd()).unwrap();
        let wire = ex.handle_of(fd.as_fd()).unwrap();
        ex.remember(&wire, &Arc::new(fd), &st);
        (wire, st)
    }

    #[test]
    fn listed_stats_are_kept_until_a_change_and_fresh_after_it() {
        use std::os::unix::fs::PermissionsExt;
        let (ex, dir) = export("stats-of");
        std::fs::write(dir.join("f"), "x").unwrap();
        std::fs::create_dir(dir.join("d")).unwrap();
        let fd = fs::reopen(ex.root_fd().as_fd(), libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
        let mut reader = fs::DirReader::open(fd.as_fd(), 0).unwrap();
        let mut entries = Vec::new();
        while let Some(ent) = reader.next_entry().unwrap() {
            entries.push(ent);
        }
        let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_bytes()).collect();
        let at = |name: &[u8]| names.iter().position(|n| *n == name).unwrap();
        let (f, d) = (at(b"f"), at(b"d"));
        let stat = |name: &CStr| fs::stat_at(fd.as_fd(), name).unwrap();
        let all = |_: &fs::DirEntry| true;

        let first = ex.stats_of(fd.as_fd(), ex.dev(), &entries, all);
        assert_eq!(first[f], Some(stat(c"f")));
        assert_eq!(first[d], Some(stat(c"d")));
        let (_, hits) = ex.attrs().counts();
        let second = ex.stats_of(fd.as_fd(), ex.dev(), &entries, all);
        assert_eq!(second, first);
        if ex.attrs().on() {
            // The file came from the cache; the directory never does.
            assert_eq!(ex.attrs().counts().1, hits + 1);
        }

        // A change made by another than the server is seen at once.
        std::fs::set_permissions(dir.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let third = ex.stats_of(fd.as_fd(), ex.dev(), &entries, all);
        assert_eq!(third[f].unwrap().mode & 0o7777, 0o600);
        assert_eq!(third[f], Some(stat(c"f")));

        // Refused entries, and entries gone, have none.
        let refused = ex.stats_of(fd.as_fd(), ex.dev(), &entries, |e| {
            e.name.as_bytes() != b"f"
        });
        assert_eq!((refused[f], refused[d]), (None, Some(stat(c"d"))));
        std::fs::remove_file(dir.join("f")).unwrap();
        let gone = ex.stats_of(fd.as_fd(), ex.dev(), &entries, all);
        assert_eq!(gone[f], None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cached_inode_is_found_by_number_until_its_descriptor_goes() {
        let (ex, dir) = export("by-ino");
        for n in ["a", "b", "c"] {
            std::fs::write(dir.join(n), n).unwrap();
        }
        let (a, sa) = keep(&ex, c"a");
        let (b, sb) = keep(&ex, c"b");
        let (c, sc) = keep(&ex, c"c");
        assert_eq!(ex.cached_handle(&sa).unwrap().0, a);
        assert_eq!(ex.cached_handle(&sb).unwrap().0, b);
        // Another device's inode of the same number is not this one.
        let other = Stat {
            dev: sa.dev + 1,
            ..sa
        };
        assert!(ex.cached_handle(&other).is_none());
        // Forgotten (REMOVE), swept (removed locally): not found.
        ex.forget_inode(&sa);
        assert!(ex.cached_handle(&sa).is_none());
        std::fs::remove_file(dir.join("b")).unwrap();
        ex.sweep();
        assert!(ex.cached_handle(&sb).is_none());
        assert_eq!(ex.cached_handle(&sc).unwrap().0, c);
        // A handle opened again (PUTFH) is found by number too.
        let fd = ex.resolve(&a).unwrap();
        let (wire, found) = ex.cached_handle(&sa).unwrap();
        assert_eq!(wire, a);
        assert!(Arc::ptr_eq(&fd, &found));
        // A full cache starts again empty, by number too.
        for i in 0..CACHE_LIMIT {
            let fd = Arc::new(fs::reopen(ex.root_fd().as_fd(), libc::O_PATH).unwrap());
            let other = Stat {
                dev: u64::MAX,
                ino: i as u64,
                ..Default::default()
            };
            ex.remember(&i.to_ne_bytes(), &fd, &other);
        }
        assert!(ex.cached_handle(&sa).is_none());
        assert!(ex.cached_handle(&sc).is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_name_removed_or_renamed_over_is_forgotten_by_its_inode() {
        let (ex, dir) = export("forget-inode");
        for n in ["a", "b"] {
            std::fs::write(dir.join(n), n).unwrap();
        }
        let (a, sa) = keep(&ex, c"a");
        let (b, sb) = keep(&ex, c"b");
        let kept = ex.cached();
        // Another device's inode of the same number is not this one.
        ex.forget_inode(&Stat {
            dev: sa.dev + 1,
            ..sa
        });
        assert_eq!(ex.cached(), kept);
        ex.forget_inode(&sa);
        assert_eq!(ex.cached(), kept - 1);
        assert!(ex.cached_handle(&sa).is_none());
        assert_eq!(ex.cached_handle(&sb).unwrap().0, b);
        // A descriptor opened by handle (PUTFH), not by name, is found by
        // its inode too.
        ex.resolve(&a).unwrap();
        assert_eq!(ex.cached_handle(&sa).unwrap().0, a);
        ex.forget_inode(&sa);
        assert!(ex.cached_handle(&sa).is_none());
        assert_eq!(ex.cached(), kept - 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
