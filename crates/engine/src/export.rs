//! An exported directory tree: its root, its handle key, and the mapping
//! between wire handles and open descriptors.

use super::cred::as_root;
use super::fs::{self, Stat};
use super::handle::{kernel_handle, open_kernel_handle, HandleError, HandleKey};
use super::handle_memo::{Fresh, HandleMemo};
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Descriptors kept open for recently used handles.
const CACHE_LIMIT: usize = 8192;
/// How often, at most, the cache is swept of objects removed behind the
/// server's back (see [`Export::sweep`]).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

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
    cache: Mutex<HashMap<Vec<u8>, Arc<OwnedFd>>>,
    last_sweep: Mutex<std::time::Instant>,
    /// Handles of inodes seen, for listings.
    memo: HandleMemo,
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
    /// Opens `path` for export with handles sealed by `key`.
    pub fn open(path: &Path, id: u8, key: HandleKey) -> io::Result<Self> {
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
        Ok(Export {
            memo,
            path: path.to_path_buf(),
            root: Arc::new(root),
            root_fh,
            root_stat,
            mount,
            key,
            id,
            cache: Mutex::new(HashMap::new()),
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

    /// Wire handle for `name` in directory `dir` (not following symlinks).
    pub fn handle_in(&self, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
        let (kind, bytes) = kernel_handle(dir, name)?;
        Ok(self.key.seal(self.id, kind, &bytes))
    }

    /// The memo of handles seen (see [`crate::handle_memo`]).
    pub fn memo(&self) -> &HandleMemo {
        &self.memo
    }

    /// Wire handle for `name` in directory `dir`, which `st` describes
    /// (a stat made between the ticket `fresh` was made from and `fresh`):
    /// the memo's, or the kernel's, which the memo then keeps.
    pub fn handle_seen(
        &self,
        fresh: &mut Fresh<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
    ) -> io::Result<Vec<u8>> {
        if let Some(wire) = fresh.get(st) {
            return Ok(wire);
        }
        let (kind, bytes) = kernel_handle(dir, name)?;
        let wire = self.key.seal(self.id, kind, &bytes);
        fresh.note(st, kind, &bytes, &wire);
        Ok(wire)
    }

    /// Opens the object a wire handle names, as an O_PATH descriptor.
    pub fn resolve(&self, wire: &[u8]) -> Result<Arc<OwnedFd>, HandleError> {
        if wire == self.root_fh.as_slice() {
            return Ok(self.root.clone());
        }
        let cached = self.cache.lock().ok().and_then(|c| c.get(wire).cloned());
        if let Some(fd) = cached {
            // A descriptor stays valid after its object is removed; a
            // removed object's handle is stale. (Not a full stat: asking
            // for the times would make the next write take a new one.)
            match fs::identity(fd.as_fd()) {
                Ok(st) if st.nlink > 0 => return Ok(fd),
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
        let st = fs::identity(fd.as_fd()).map_err(|_| HandleError::Stale)?;
        if st.dev != self.root_stat.dev || st.nlink == 0 {
            return Err(HandleError::Stale);
        }
        let fd = Arc::new(fd);
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
        self.remember(wire, &fd);
        Ok(fd)
    }

    /// Drops the cached descriptors of objects that have no name left
    /// (removed by a local process, not through the server): a cached
    /// descriptor would keep a removed file's blocks allocated. Runs at
    /// most every [`SWEEP_EVERY`], when a handle is opened.
    pub fn sweep(&self) {
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|_, fd| fs::identity(fd.as_fd()).is_ok_and(|st| st.nlink > 0));
        }
    }

    /// Handles with a cached descriptor (for tests).
    pub fn cached(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.len())
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
    /// open it again). A full cache is emptied first.
    pub fn remember(&self, wire: &[u8], fd: &Arc<OwnedFd>) {
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_LIMIT {
                c.clear();
            }
            c.entry(wire.to_vec()).or_insert_with(|| fd.clone());
        }
    }

    /// Forgets the cached descriptor of a handle (after removal), and
    /// reads the deletes queued for the memo of handles (this one among
    /// them, once its last descriptor is closed).
    pub fn forget(&self, wire: &[u8]) {
        let fd = self.cache.lock().ok().and_then(|mut c| c.remove(wire));
        drop(fd);
        self.memo.read_deletes();
    }
}
