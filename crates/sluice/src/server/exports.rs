//! The exports of one server and the pseudo file system that joins them
//! (RFC 8881 section 7.3).
//!
//! With one export at "/" the client's root is the export's own root.
//! Otherwise the root is a small read-only tree of directories built from
//! the exports' pseudo paths ("/home", "/data/archive"), whose leaves are
//! the export roots. Pseudo directories have sealed handles of their own
//! (export id [`PSEUDO_ID`], the node number in place of a kernel handle).

use crate::engine::export::Export;
use crate::engine::fs::{Stat, Time};
use crate::engine::handle::{HandleError, HandleKey};
use crate::rules::{IpRange, Squash};
use std::io;
use std::net::IpAddr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

/// Export id byte of pseudo directory handles.
pub const PSEUDO_ID: u8 = 0xff;
/// Most exports one server serves (ids 0 to 254).
pub const MAX_EXPORTS: usize = PSEUDO_ID as usize;

/// The access rules of one export.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Every change is refused with NFS4ERR_ROFS.
    pub read_only: bool,
    /// What an op changes in the namespace or in an object's attributes
    /// is on stable storage before the op is answered (see
    /// `ops_fs::commit_meta`); false answers first, as the Linux server's
    /// `async` exports do.
    pub sync: bool,
    /// Whose identity is replaced by the anonymous one.
    pub squash: Squash,
    /// The anonymous user and group.
    pub anon: (u32, u32),
    /// Largest READ payload (at most [`super::attrs::MAX_IO`]).
    pub max_read: u32,
    /// Largest WRITE payload (at most [`super::attrs::MAX_IO`]).
    pub max_write: u32,
    /// Client address ranges allowed; empty means everyone.
    pub clients: Vec<IpRange>,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            read_only: false,
            sync: true,
            squash: Squash::None,
            anon: (65534, 65534),
            max_read: super::attrs::MAX_IO,
            max_write: super::attrs::MAX_IO,
            clients: Vec::new(),
        }
    }
}

impl Rules {
    /// True when a client at `peer` may use the export. `None` is an
    /// in-process caller (tests, fuzzing), which may use everything.
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        match peer {
            Some(ip) => crate::rules::admitted(&self.clients, ip),
            None => true,
        }
    }
}

/// One export as the server serves it.
#[derive(Debug)]
pub struct Exported {
    /// The directory tree and its handles.
    pub fs: Export,
    /// Where clients see it ("/" or "/a/b").
    pub pseudo: String,
    /// Its access rules.
    pub rules: Rules,
}

/// What a name in a pseudo directory leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// Another pseudo directory.
    Node(usize),
    /// The root of an export.
    Export(usize),
}

/// One directory of the pseudo file system.
#[derive(Debug)]
pub struct PseudoNode {
    /// Parent node (the root is its own parent).
    pub parent: usize,
    /// Entries, sorted by name.
    pub children: Vec<(String, Child)>,
    /// Its sealed handle.
    pub fh: Vec<u8>,
}

/// Where a filehandle points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Inside export number n.
    Export(usize),
    /// Pseudo directory number n.
    Pseudo(usize),
}

/// All exports of a server.
#[derive(Debug)]
pub struct Exports {
    list: Vec<Exported>,
    /// Empty when the only export sits at "/".
    nodes: Vec<PseudoNode>,
    key: HandleKey,
    /// Stands in for a descriptor in pseudo directory filehandles; the
    /// ops never reach the file system through it (see
    /// `compound::dispatch`), and if one did, it would find an empty,
    /// anonymous memory file.
    placeholder: Arc<OwnedFd>,
    /// Times reported for pseudo directories.
    born: Time,
}

/// Checks a pseudo path and splits it into components.
pub fn pseudo_components(path: &str) -> Result<Vec<&str>, String> {
    if !path.starts_with('/') {
        return Err(format!("pseudo path {path:?} must start with '/'"));
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for c in &parts {
        if *c == "." || *c == ".." || c.len() > 255 || c.contains('\0') {
            return Err(format!("pseudo path {path:?} has a bad component {c:?}"));
        }
    }
    Ok(parts)
}

/// Checks the pseudo paths of a server's exports: each well formed, none
/// the same as or nested in another, and "/" only for a single export.
/// Returns their components, or the index of a bad path and why.
pub fn check_pseudo_paths<'a>(paths: &[&'a str]) -> Result<Vec<Vec<&'a str>>, (usize, String)> {
    let mut seen: Vec<Vec<&str>> = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let parts = pseudo_components(path).map_err(|m| (i, m))?;
        if parts.is_empty() && paths.len() > 1 {
            return Err((
                i,
                format!(
                    "each of the {} exports needs a pseudo path of its own such as \"/data\" (\"/\", the default, is for a single export)",
                    paths.len()
                ),
            ));
        }
        if let Some(j) = seen
            .iter()
            .position(|p| p.starts_with(&parts) || parts.starts_with(p))
        {
            return Err((
                i,
                format!(
                    "pseudo path {path:?} is the same as or nested with {:?}; exports cannot share or nest pseudo paths",
                    paths[j]
                ),
            ));
        }
        seen.push(parts);
    }
    Ok(seen)
}

impl Exports {
    /// One export at "/" with default rules.
    pub fn single(fs: Export, key: HandleKey) -> io::Result<Self> {
        Self::new(
            vec![Exported {
                fs,
                pseudo: "/".into(),
                rules: Rules::default(),
            }],
            key,
        )
    }

    /// Joins `list` (export ids must equal positions) under one pseudo
    /// root. Pseudo paths must not be nested in one another, and "/" is
    /// only allowed for a single export.
    pub fn new(list: Vec<Exported>, key: HandleKey) -> io::Result<Self> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        if list.is_empty() || list.len() > MAX_EXPORTS {
            return Err(bad(format!("serve 1 to {MAX_EXPORTS} exports")));
        }
        for (i, e) in list.iter().enumerate() {
            if e.fs.id() as usize != i {
                return Err(bad(format!("export {i} was opened with id {}", e.fs.id())));
            }
        }
        let pseudo: Vec<&str> = list.iter().map(|e| e.pseudo.as_str()).collect();
        let paths = check_pseudo_paths(&pseudo)
            .map_err(|(i, m)| bad(format!("{}: {m}", list[i].fs.path().display())))?;
        let mut nodes = Vec::new();
        if !(list.len() == 1 && paths[0].is_empty()) {
            nodes.push(PseudoNode {
                parent: 0,
                children: Vec::new(),
                fh: Vec::new(),
            });
            for (i, parts) in paths.iter().enumerate() {
                let mut at = 0;
                for (k, name) in parts.iter().enumerate() {
                    let last = k + 1 == parts.len();
                    let found = nodes[at].children.iter().find(|(n, _)| n == name);
                    at = match (found, last) {
                        (Some(&(_, Child::Node(n))), false) => n,
                        (None, false) => {
                            let n = nodes.len();
                            nodes.push(PseudoNode {
                                parent: at,
                                children: Vec::new(),
                                fh: Vec::new(),
                            });
                            nodes[at].children.push((name.to_string(), Child::Node(n)));
                            n
                        }
                        (None, true) => {
                            nodes[at]
                                .children
                                .push((name.to_string(), Child::Export(i)));
                            at
                        }
                        // Nesting and duplicates were refused above.
                        _ => unreachable!("nested pseudo paths"),
                    };
                }
            }
            for (n, node) in nodes.iter_mut().enumerate() {
                node.children.sort_by(|a, b| a.0.cmp(&b.0));
                node.fh = key.seal(PSEUDO_ID, n as i32, &[]);
            }
        }
        // SAFETY: memfd_create with a valid name; the descriptor is ours.
        let raw = unsafe { libc::memfd_create(c"sluice-pseudo".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let placeholder = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Ok(Exports {
            list,
            nodes,
            key,
            placeholder,
            born: Time {
                sec: now.as_secs() as i64,
                nsec: now.subsec_nanos(),
            },
        })
    }

    /// The exports, by id.
    pub fn list(&self) -> &[Exported] {
        &self.list
    }

    /// Export number `i` (a pseudo location maps to the first export; ops
    /// never get there, see `compound::dispatch`).
    pub fn get(&self, loc: Loc) -> &Exported {
        match loc {
            Loc::Export(i) => &self.list[i],
            Loc::Pseudo(_) => &self.list[0],
        }
    }

    /// True when a pseudo file system joins the exports.
    pub fn has_pseudo(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Pseudo directory `n`.
    pub fn node(&self, n: usize) -> &PseudoNode {
        &self.nodes[n]
    }

    /// The root the client starts from: (handle, descriptor, location).
    pub fn root(&self) -> (Vec<u8>, Arc<OwnedFd>, Loc) {
        if self.has_pseudo() {
            self.node_handle(0)
        } else {
            let e = &self.list[0].fs;
            (e.root_fh().to_vec(), e.root_fd(), Loc::Export(0))
        }
    }

    /// The handle, descriptor and location of pseudo directory `n`.
    pub fn node_handle(&self, n: usize) -> (Vec<u8>, Arc<OwnedFd>, Loc) {
        (
            self.nodes[n].fh.clone(),
            self.placeholder.clone(),
            Loc::Pseudo(n),
        )
    }

    /// The pseudo directory holding export `i`, when there is one.
    pub fn parent_of_export(&self, i: usize) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.children.iter().any(|&(_, c)| c == Child::Export(i)))
    }

    /// True when `peer` may see `child`: an export that admits it, or a
    /// directory leading to one.
    pub fn visible(&self, child: Child, peer: Option<IpAddr>) -> bool {
        match child {
            Child::Export(i) => self.list[i].rules.admits(peer),
            Child::Node(n) => self.nodes[n]
                .children
                .iter()
                .any(|&(_, c)| self.visible(c, peer)),
        }
    }

    /// Opens a wire handle: the object's descriptor and where it is.
    /// Like [`Exports::resolve`] for a file that has lost its last name
    /// but that `still_open` says is still open: its descriptor and the
    /// export it is in.
    pub fn resolve_unlinked(
        &self,
        wire: &[u8],
        still_open: impl FnOnce(&crate::engine::fs::Stat) -> bool,
    ) -> Option<(Arc<OwnedFd>, Loc)> {
        let id = *wire.get(1)?;
        let e = self.list.get(id as usize)?;
        let (fd, st) = e.fs.resolve_unlinked(wire)?;
        still_open(&st).then(|| (Arc::new(fd), Loc::Export(id as usize)))
    }

    /// Opens the object a wire handle names.
    pub fn resolve(&self, wire: &[u8]) -> Result<(Arc<OwnedFd>, Loc), HandleError> {
        self.resolve_with(wire, false).map(|(fd, loc, _)| (fd, loc))
    }

    /// Opens the object a wire handle names; with `full`, also gives a
    /// full status of it when it is an exported object other than an
    /// export's root (see [`Export::resolve_with`]).
    pub fn resolve_with(
        &self,
        wire: &[u8],
        full: bool,
    ) -> Result<(Arc<OwnedFd>, Loc, Option<Stat>), HandleError> {
        // The export id byte routes the handle; the export checks the seal
        // (and that the sealed id is its own) before trusting it.
        let id = *wire.get(1).ok_or(HandleError::Bad)?;
        if id == PSEUDO_ID {
            let (_, n, rest) = self.key.open(wire)?;
            if !rest.is_empty() {
                return Err(HandleError::Bad);
            }
            let n = usize::try_from(n).map_err(|_| HandleError::Bad)?;
            if n >= self.nodes.len() {
                // A pseudo directory of an earlier configuration.
                return Err(HandleError::Stale);
            }
            return Ok((self.placeholder.clone(), Loc::Pseudo(n), None));
        }
        match self.list.get(id as usize) {
            Some(e) => {
                let (fd, st) = e.fs.resolve_with(wire, full)?;
                Ok((fd, Loc::Export(id as usize), st))
            }
            None => {
                // Sealed by us for an export no longer configured?
                self.key.open(wire)?;
                Err(HandleError::Stale)
            }
        }
    }

    /// The pseudo fileid export `i`'s root is mounted on (after the
    /// directories' own fileids).
    pub fn mounted_on_fileid(&self, i: usize) -> u64 {
        (self.nodes.len() + 1 + i) as u64
    }

    /// The status reported for pseudo directory `n`.
    pub fn node_stat(&self, n: usize) -> Stat {
        let node = &self.nodes[n];
        let subdirs = node.children.len() as u64;
        Stat {
            mode: libc::S_IFDIR | 0o555,
            nlink: 2 + subdirs,
            uid: 0,
            gid: 0,
            size: 4096,
            blocks: 0,
            rdev: 0,
            dev: 0,
            ino: n as u64 + 1,
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_paths_are_checked() {
        assert_eq!(pseudo_components("/").unwrap(), Vec::<&str>::new());
        assert_eq!(pseudo_components("/a//b/").unwrap(), vec!["a", "b"]);
        assert!(pseudo_components("a").is_err());
        assert!(pseudo_components("/a/../b").is_err());
        assert!(pseudo_components("/./b").is_err());
    }

    #[test]
    fn rules_admit_listed_clients() {
        let r = Rules {
            clients: vec![IpRange::parse("10.0.0.0/8").unwrap()],
            ..Default::default()
        };
        assert!(r.admits(Some("10.1.2.3".parse().unwrap())));
        assert!(!r.admits(Some("192.0.2.1".parse().unwrap())));
        assert!(r.admits(None));
        assert!(Rules::default().admits(Some("192.0.2.1".parse().unwrap())));
    }
}
