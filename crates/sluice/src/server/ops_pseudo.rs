//! Ops on pseudo directories (RFC 8881 section 7.3): read-only
//! directories whose entries lead to other pseudo directories or to
//! export roots. Entries of exports that do not admit the caller's address
//! are hidden.

use super::context::{Ctx, Fh, OpStatus};
use super::exports::{Child, Loc};
use super::ops_fs::{component, put_fattr, put_flavors, run, x, Listing};
use crate::engine::fs;
use crate::nfs4::consts::status;
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};
use std::os::fd::AsFd;

/// The filehandle of `child`.
fn child_fh(cx: &Ctx<'_>, child: Child) -> Fh {
    let exports = &cx.srv.exports;
    match child {
        Child::Node(m) => node_fh(cx, m),
        Child::Export(i) => {
            let ex = &exports.list()[i].fs;
            Fh {
                wire: ex.root_fh().to_vec(),
                fd: ex.root_fd(),
                loc: Loc::Export(i),
            }
        }
    }
}

/// The filehandle of pseudo directory `n`.
pub(super) fn node_fh(cx: &Ctx<'_>, n: usize) -> Fh {
    let (wire, fd, loc) = cx.srv.exports.node_handle(n);
    Fh { wire, fd, loc }
}

/// The visible entry `name` of pseudo directory `n`.
fn find(cx: &Ctx<'_>, n: usize, name: &[u8]) -> Result<Child, Nfsstat4> {
    let exports = &cx.srv.exports;
    exports
        .node(n)
        .children
        .iter()
        .find(|(c, _)| c.as_bytes() == name)
        .map(|&(_, child)| child)
        .filter(|&child| exports.visible(child, cx.peer))
        .ok_or(status::NOENT)
}

/// LOOKUP in pseudo directory `n`.
pub(super) fn lookup(
    cx: &mut Ctx<'_>,
    n: usize,
    d: &mut Decoder<'_>,
    _e: &mut Encoder,
) -> OpStatus {
    run(|| {
        let name = component(d)?;
        let child = find(cx, n, name.as_bytes())?;
        cx.cur = Some(child_fh(cx, child));
        Ok(())
    })
}

/// LOOKUPP from pseudo directory `n`.
pub(super) fn lookupp(
    cx: &mut Ctx<'_>,
    n: usize,
    _d: &mut Decoder<'_>,
    _e: &mut Encoder,
) -> OpStatus {
    if n == 0 {
        return status::NOENT;
    }
    cx.cur = Some(node_fh(cx, cx.srv.exports.node(n).parent));
    status::OK
}

/// READDIR: cookies 3, 4, ... number the entries in name order.
/// READDIR of pseudo directory `n`.
pub(super) fn readdir(
    cx: &mut Ctx<'_>,
    n: usize,
    d: &mut Decoder<'_>,
    e: &mut Encoder,
) -> OpStatus {
    run(|| {
        let mut listing = Listing::decode(d)?;
        let exports = &cx.srv.exports;
        let mut eof = true;
        for (k, (name, child)) in exports.node(n).children.iter().enumerate() {
            let next = k as u64 + 3;
            if next <= listing.cookie || !exports.visible(*child, cx.peer) {
                continue;
            }
            let fh = child_fh(cx, *child);
            let st = match fh.loc {
                Loc::Pseudo(m) => exports.node_stat(m),
                Loc::Export(_) => match fs::stat(fh.fd.as_fd()) {
                    Ok(st) => st,
                    Err(_) => continue,
                },
            };
            let fits = listing.add(next, name.as_bytes(), |list, req| {
                put_fattr(cx, list, Some(&fh.wire), &st, req, &fh)
            });
            if !fits {
                eof = false;
                break;
            }
        }
        listing.finish(e, eof)
    })
}

/// SECINFO in pseudo directory `n`.
pub(super) fn secinfo(
    cx: &mut Ctx<'_>,
    n: usize,
    d: &mut Decoder<'_>,
    e: &mut Encoder,
) -> OpStatus {
    run(|| {
        let name = component(d)?;
        find(cx, n, name.as_bytes())?;
        put_flavors(e);
        cx.cur = None;
        Ok(())
    })
}

/// SECINFO_NO_NAME in pseudo directory `n`.
pub(super) fn secinfo_no_name(
    cx: &mut Ctx<'_>,
    n: usize,
    d: &mut Decoder<'_>,
    e: &mut Encoder,
) -> OpStatus {
    run(|| {
        let style = x(d.u32())?;
        if style > 1 {
            return Err(status::INVAL);
        }
        if style == 1 && n == 0 {
            return Err(status::NOENT);
        }
        put_flavors(e);
        cx.cur = None;
        Ok(())
    })
}
