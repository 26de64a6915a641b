//! Extended attribute ops (RFC 8276): GETXATTR, SETXATTR, LISTXATTRS and
//! REMOVEXATTR on the user namespace. A name on the wire is the file's
//! "user." attribute of that name; attributes of other namespaces are not
//! seen. Regular files and directories have them; other objects have none
//! and take none (as the Linux file systems' own rule for user.*).

use super::context::{Ctx, Fh, OpStatus};
use super::ops_fs::{cinfo, deleg_conflicts, io, may, run, stat_of, x};
use crate::engine::fs::{self, Stat};
use crate::nfs4::consts::status;
use crate::nfs4::msg::{
    setxattr_option, Component4, GetxattrArgs, ListxattrsArgs, ListxattrsResOk, RemovexattrArgs,
    SetxattrArgs, XattrValue4, Xdr,
};
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder};
use std::ffi::CString;
use std::os::fd::AsFd;

/// The namespace names on the wire live in.
const PREFIX: &[u8] = b"user.";
/// Longest value (the Linux limit, XATTR_SIZE_MAX).
pub(super) const MAX_VALUE: usize = 64 * 1024;
/// Longest full name (XATTR_NAME_MAX).
const MAX_NAME: usize = 255;

/// The full name of wire name `c`: INVAL when empty or holding a NUL,
/// NAMETOOLONG when "user." and it are longer than the file system takes.
fn full_name(c: &Component4) -> Result<CString, Nfsstat4> {
    if c.0.is_empty() {
        return Err(status::INVAL);
    }
    if PREFIX.len() + c.0.len() > MAX_NAME {
        return Err(status::NAMETOOLONG);
    }
    let mut n = PREFIX.to_vec();
    n.extend_from_slice(&c.0);
    CString::new(n).map_err(|_| status::INVAL)
}

/// The status of a failed extended attribute call.
fn xerr(e: std::io::Error) -> Nfsstat4 {
    match e.raw_os_error() {
        Some(libc::ENODATA) => status::NOXATTR,
        Some(libc::E2BIG) => status::XATTR2BIG,
        Some(libc::ERANGE) => status::TOOSMALL,
        Some(libc::EOPNOTSUPP) => status::NOTSUPP,
        _ => Nfsstat4::from(&e),
    }
}

/// The current object, which must have extended attributes: a regular
/// file or a directory (others answer `otherwise`).
fn cur_object(cx: &Ctx<'_>, otherwise: Nfsstat4) -> Result<(Fh, Stat), Nfsstat4> {
    let fh = cx.cur()?.clone();
    let st = stat_of(&fh)?;
    if st.is_file() || st.is_dir() {
        Ok((fh, st))
    } else {
        Err(otherwise)
    }
}

/// GETXATTR (RFC 8276 section 8.4.2).
pub(super) fn getxattr(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(GetxattrArgs::decode(d))?;
        let name = full_name(&args.name)?;
        let (fh, _) = cur_object(cx, status::NOXATTR)?;
        let value = fs::getxattr(fh.fd.as_fd(), &name).map_err(xerr)?;
        XattrValue4(value).encode(e);
        Ok(())
    })
}

/// SETXATTR (section 8.4.3): create, replace, or either.
pub(super) fn setxattr(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(SetxattrArgs::decode(d))?;
        let flags = match args.option {
            setxattr_option::EITHER => 0,
            setxattr_option::CREATE => libc::XATTR_CREATE,
            setxattr_option::REPLACE => libc::XATTR_REPLACE,
            _ => return Err(status::INVAL),
        };
        let name = full_name(&args.name)?;
        if args.value.0.len() > MAX_VALUE {
            return Err(status::XATTR2BIG);
        }
        changing(cx, e, |fh| {
            fs::setxattr(fh.fd.as_fd(), &name, &args.value.0, flags).map_err(|e| {
                match e.raw_os_error() {
                    // The RFC's answers to create and replace conflicts.
                    Some(libc::EEXIST) => status::EXIST,
                    _ => xerr(e),
                }
            })
        })
    })
}

/// SETXATTR's and REMOVEXATTR's frame: the current object must take
/// extended attributes (NFS4ERR_PERM otherwise, as the kernel's rule for
/// user.*), other clients' delegations of it are recalled (holders cache
/// its change attribute), `change` runs, and the change info is written.
fn changing(
    cx: &Ctx<'_>,
    e: &mut Encoder,
    change: impl FnOnce(&Fh) -> Result<(), Nfsstat4>,
) -> Result<(), Nfsstat4> {
    let (fh, before) = cur_object(cx, status::PERM)?;
    deleg_conflicts(cx, (before.dev, before.ino), true)?;
    change(&fh)?;
    let after = stat_of(&fh)?;
    cinfo(&before, &after).encode(e);
    Ok(())
}

/// REMOVEXATTR (section 8.4.5).
pub(super) fn removexattr(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(RemovexattrArgs::decode(d))?;
        let name = full_name(&args.name)?;
        changing(cx, e, |fh| {
            fs::removexattr(fh.fd.as_fd(), &name).map_err(xerr)
        })
    })
}

/// LISTXATTRS (section 8.4.4): the names from the cookie on (the index of
/// the next name) that fit in maxcount bytes with the cookie, the array
/// length and eof; NFS4ERR_TOOSMALL when not even the next one fits, and
/// NFS4ERR_BAD_COOKIE for a cookie past the end.
pub(super) fn listxattrs(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    run(|| {
        let args = x(ListxattrsArgs::decode(d))?;
        let names: Vec<Vec<u8>> = match cur_object(cx, status::NOXATTR) {
            Ok((fh, st)) => {
                // Listing needs read permission (ACCESS4_XALIST), which
                // listxattr(2) itself does not ask for.
                if !may(&st, cx, 0o4) {
                    return Err(status::ACCESS);
                }
                let all = io(fs::listxattr(fh.fd.as_fd()))?;
                all.into_iter()
                    .filter_map(|n| n.strip_prefix(PREFIX).map(<[u8]>::to_vec))
                    .filter(|n| !n.is_empty())
                    .collect()
            }
            // Other objects have none.
            Err(status::NOXATTR) => Vec::new(),
            Err(st) => return Err(st),
        };
        let from = usize::try_from(args.cookie).unwrap_or(usize::MAX);
        if from > names.len() {
            return Err(status::BAD_COOKIE);
        }
        // cookie, array length, eof
        let mut used: usize = 8 + 4 + 4;
        let mut out = Vec::new();
        for n in &names[from..] {
            let size = 4 + n.len().next_multiple_of(4);
            if used + size > args.maxcount as usize {
                break;
            }
            used += size;
            out.push(Component4(n.clone()));
        }
        if used > args.maxcount as usize || (out.is_empty() && from < names.len()) {
            return Err(status::TOOSMALL);
        }
        let next = from + out.len();
        ListxattrsResOk {
            cookie: next as u64,
            eof: next == names.len(),
            names: out,
        }
        .encode(e);
        Ok(())
    })
}
