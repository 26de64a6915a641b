//! The MOUNT protocol, versions 3 and 1 (RFC 1813 appendix I), on the
//! NFS port: what gives NFSv3 clients the handle of an export's root (or
//! of a directory inside it).
//!
//! An export mounts by its NFSv4 path ("/" for `sluice serve DIR`) and by
//! its directory's own path, and a directory inside an export mounts by
//! either followed by the rest of the path. The mount list that DUMP
//! reports is kept in memory only: it is advisory (RFC 1813 says as
//! much), and clients never depend on it.

use super::exports::Exported;
use super::Server;
use crate::engine::fs;
use crate::mount::{mntproc, mntstat, MountArgs};
use crate::xdr::{Decoder, Encoder};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::Mutex;

/// What became of a MOUNT call.
pub(super) enum DoneMnt {
    /// The results.
    Reply(Encoder),
    /// GARBAGE_ARGS.
    Garbage,
    /// PROC_UNAVAIL.
    NoProc,
}

/// The clients' mounts, as DUMP lists them: (client address, path).
#[derive(Debug, Default)]
pub struct MountList {
    list: Mutex<Vec<(String, String)>>,
}

/// Runs MOUNT procedure `proc_` of version `vers` (1 or 3).
pub(super) fn call(
    srv: &Server,
    vers: u32,
    proc_: u32,
    args: &[u8],
    peer: Option<IpAddr>,
) -> DoneMnt {
    let mut d = Decoder::new(args);
    let a = match MountArgs::decode(proc_, &mut d) {
        None => return DoneMnt::NoProc,
        Some(Err(_)) => return DoneMnt::Garbage,
        Some(Ok(a)) => a,
    };
    let host = peer.map_or_else(|| "local".to_string(), |p| p.to_string());
    let mut e = Encoder::with_capacity(256);
    match (proc_, a) {
        (mntproc::NULL, _) => {}
        (mntproc::MNT, MountArgs::Path(path)) => match mnt(srv, path, peer) {
            Ok(fh) if vers == 3 => {
                e.u32(mntstat::OK);
                e.opaque(&fh);
                // Flavors: AUTH_SYS.
                e.u32(1);
                e.u32(crate::rpc::AUTH_SYS);
                remember(srv, host, path);
            }
            Ok(_) => {
                // MOUNT version 1 hands out NFSv2 handles, and NFSv2 is
                // not served.
                tracing::info!(client = %host, "MOUNT v1 MNT refused: NFSv2 is not served");
                e.u32(mntstat::ACCES);
            }
            Err(st) => {
                tracing::info!(
                    client = %host,
                    path = %String::from_utf8_lossy(path),
                    status = st,
                    "MOUNT refused"
                );
                e.u32(st);
            }
        },
        (mntproc::UMNT, MountArgs::Path(path)) => {
            let path = String::from_utf8_lossy(path);
            srv.mounts
                .list
                .lock()
                .expect("mount list")
                .retain(|(h, p)| !(*h == host && *p == path));
        }
        (mntproc::UMNTALL, _) => {
            srv.mounts
                .list
                .lock()
                .expect("mount list")
                .retain(|(h, _)| *h != host);
        }
        (mntproc::DUMP, _) => {
            for (h, p) in srv.mounts.list.lock().expect("mount list").iter() {
                e.bool(true);
                e.string(h);
                e.string(p);
            }
            e.bool(false);
        }
        (mntproc::EXPORT, _) => {
            for x in srv.exports.list() {
                if !x.rules.admits(peer) {
                    continue;
                }
                for name in names(x) {
                    e.bool(true);
                    e.string(&name);
                    for c in &x.rules.clients {
                        e.bool(true);
                        e.string(&c.to_string());
                    }
                    e.bool(false);
                }
            }
            e.bool(false);
        }
        _ => return DoneMnt::Garbage,
    }
    DoneMnt::Reply(e)
}

fn remember(srv: &Server, host: String, path: &[u8]) {
    let path = String::from_utf8_lossy(path).into_owned();
    let mut l = srv.mounts.list.lock().expect("mount list");
    if !l.iter().any(|(h, p)| *h == host && *p == path) && l.len() < 4096 {
        l.push((host, path));
    }
}

/// The paths an export mounts by: its NFSv4 path, and its directory's.
fn names(x: &Exported) -> Vec<String> {
    let mut v = vec![x.pseudo.clone()];
    if let Ok(dir) = std::fs::canonicalize(x.fs.path()) {
        let dir = dir.to_string_lossy().into_owned();
        if dir != x.pseudo {
            v.push(dir);
        }
    }
    v
}

/// The components of `path` after `base` ("/" and "/a/b" style, with
/// redundant slashes ignored), or None when it is not under it.
fn under<'p>(path: &'p str, base: &str) -> Option<Vec<&'p str>> {
    let comps = |s: &'p str| -> Vec<&'p str> { s.split('/').filter(|c| !c.is_empty()).collect() };
    let p = comps(path);
    let b: Vec<&str> = base.split('/').filter(|c| !c.is_empty()).collect();
    if p.len() < b.len() || p[..b.len()] != b[..] {
        return None;
    }
    Some(p[b.len()..].to_vec())
}

/// MNT: the handle of `path` for a client at `peer`, or a mountstat3.
fn mnt(srv: &Server, path: &[u8], peer: Option<IpAddr>) -> Result<Vec<u8>, u32> {
    let path = std::str::from_utf8(path).map_err(|_| mntstat::NOENT)?;
    // An empty path is the root (what nfs-rs sends for "nfs://HOST/").
    let path = if path.is_empty() { "/" } else { path };
    if !path.starts_with('/') {
        return Err(mntstat::INVAL);
    }
    // The export whose path is the longest prefix of the one asked for.
    let mut best: Option<(usize, &Exported, Vec<&str>)> = None;
    for x in srv.exports.list() {
        for name in names(x) {
            if let Some(rest) = under(path, &name) {
                let depth = name.split('/').filter(|c| !c.is_empty()).count();
                if best.as_ref().is_none_or(|(d, _, _)| depth > *d) {
                    best = Some((depth, x, rest));
                }
            }
        }
    }
    let (_, x, rest) = best.ok_or(mntstat::NOENT)?;
    if !x.rules.admits(peer) {
        return Err(mntstat::ACCES);
    }
    let wire = if rest.is_empty() {
        x.fs.root_fh().to_vec()
    } else {
        walk(x, &rest)?
    };
    if wire.len() > srv.config.v3_max_fh {
        tracing::warn!(
            len = wire.len(),
            max = srv.config.v3_max_fh,
            "the export's file handles are longer than NFSv3 clients accept here (--v3-max-fh)"
        );
        return Err(mntstat::SERVERFAULT);
    }
    Ok(wire)
}

/// The handle of the directory `rest` below export `x`'s root, walked one
/// name at a time without following symbolic links or leaving the
/// export's file system.
fn walk(x: &Exported, rest: &[&str]) -> Result<Vec<u8>, u32> {
    let err = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOENT) => mntstat::NOENT,
        Some(libc::ENOTDIR) => mntstat::NOTDIR,
        Some(libc::EACCES) => mntstat::ACCES,
        Some(libc::ENAMETOOLONG) => mntstat::NAMETOOLONG,
        _ => mntstat::IO,
    };
    let root = x.fs.root_fd();
    let mut cur: Option<OwnedFd> = None;
    for c in rest {
        if matches!(Path::new(c).components().next(), Some(Component::ParentDir)) || *c == "." {
            return Err(mntstat::NOENT);
        }
        let name = fs::cname(c.as_bytes()).map_err(err)?;
        let next = {
            let dir = match &cur {
                Some(fd) => fd.as_fd(),
                None => root.as_fd(),
            };
            fs::open_path_at(dir, &name).map_err(err)?
        };
        let st = fs::stat(next.as_fd()).map_err(err)?;
        if st.dev != x.fs.dev() {
            return Err(mntstat::NOENT);
        }
        if !st.is_dir() {
            return Err(mntstat::NOTDIR);
        }
        cur = Some(next);
    }
    let fd = cur.expect("rest is not empty");
    x.fs.handle_of(fd.as_fd()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::under;

    #[test]
    fn paths_under_an_export() {
        assert_eq!(under("/", "/"), Some(vec![]));
        assert_eq!(under("/a/b", "/"), Some(vec!["a", "b"]));
        assert_eq!(under("/srv/x//y/", "/srv/x"), Some(vec!["y"]));
        assert_eq!(under("/srv/xy", "/srv/x"), None);
        assert_eq!(under("/srv", "/srv/x"), None);
    }
}
