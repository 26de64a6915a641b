//! The MOUNT protocol (RFC 1813 appendix I, versions 1 and 3) and the
//! portmapper (RFC 1833: PMAP version 2, and GETADDR of rpcbind versions
//! 3 and 4): program and procedure numbers, statuses, and argument
//! decoding.

use crate::xdr::{Decoder, XdrResult};

/// The MOUNT program.
pub const MOUNT_PROGRAM: u32 = 100005;
/// The portmapper (rpcbind) program.
pub const PMAP_PROGRAM: u32 = 100000;
/// The NLM program.
pub const NLM_PROGRAM: u32 = 100021;
/// The NSM (status monitor) program.
pub const NSM_PROGRAM: u32 = 100024;
/// Longest path in a MOUNT call (MNTPATHLEN).
pub const MNTPATHLEN: usize = 1024;

/// MOUNT procedures (the same numbers in versions 1 and 3).
pub mod mntproc {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;
}

/// mountstat3 values.
pub mod mntstat {
    #![allow(missing_docs)]
    pub const OK: u32 = 0;
    pub const PERM: u32 = 1;
    pub const NOENT: u32 = 2;
    pub const IO: u32 = 5;
    pub const ACCES: u32 = 13;
    pub const NOTDIR: u32 = 20;
    pub const INVAL: u32 = 22;
    pub const NAMETOOLONG: u32 = 63;
    pub const NOTSUPP: u32 = 10004;
    pub const SERVERFAULT: u32 = 10006;
}

/// The arguments of a MOUNT call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountArgs<'a> {
    /// NULL, DUMP, UMNTALL, EXPORT: none.
    None,
    /// MNT and UMNT: a path.
    Path(&'a [u8]),
}

impl<'a> MountArgs<'a> {
    /// Decodes the arguments of MOUNT procedure `proc_`; None for a
    /// procedure that does not exist.
    pub fn decode(proc_: u32, d: &mut Decoder<'a>) -> Option<XdrResult<Self>> {
        let r = match proc_ {
            mntproc::NULL | mntproc::DUMP | mntproc::UMNTALL | mntproc::EXPORT => {
                Ok(MountArgs::None)
            }
            mntproc::MNT | mntproc::UMNT => d.opaque(MNTPATHLEN).map(MountArgs::Path),
            _ => return None,
        };
        Some(d.whole(r))
    }
}

/// Portmapper procedures of version 2 (rpcbind versions 3 and 4 number
/// theirs alike up to DUMP; GETADDR is 3 there).
pub mod pmapproc {
    #![allow(missing_docs)]
    pub const NULL: u32 = 0;
    pub const SET: u32 = 1;
    pub const UNSET: u32 = 2;
    pub const GETPORT: u32 = 3;
    pub const DUMP: u32 = 4;
    pub const CALLIT: u32 = 5;
}

/// IPPROTO_TCP in a portmapper mapping.
pub const IPPROTO_TCP: u32 = 6;
/// IPPROTO_UDP in a portmapper mapping.
pub const IPPROTO_UDP: u32 = 17;

/// A portmapper mapping (version 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// IPPROTO_TCP or IPPROTO_UDP.
    pub prot: u32,
    /// Port.
    pub port: u32,
}

impl Mapping {
    /// Reads a mapping.
    pub fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Mapping {
            prog: d.u32()?,
            vers: d.u32()?,
            prot: d.u32()?,
            port: d.u32()?,
        })
    }
}

/// An rpcb (rpcbind versions 3 and 4): what GETADDR, SET and UNSET take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rpcb<'a> {
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Network id ("tcp", "udp", "tcp6", ...).
    pub netid: &'a [u8],
    /// Universal address.
    pub addr: &'a [u8],
    /// Owner.
    pub owner: &'a [u8],
}

impl<'a> Rpcb<'a> {
    /// Reads an rpcb.
    pub fn decode(d: &mut Decoder<'a>) -> XdrResult<Self> {
        Ok(Rpcb {
            prog: d.u32()?,
            vers: d.u32()?,
            netid: d.opaque(64)?,
            addr: d.opaque(128)?,
            owner: d.opaque(256)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::Encoder;

    #[test]
    fn decodes_mount_paths() {
        let mut e = Encoder::new();
        e.opaque(b"/export");
        let buf = e.into_inner();
        assert_eq!(
            MountArgs::decode(mntproc::MNT, &mut Decoder::new(&buf)),
            Some(Ok(MountArgs::Path(b"/export")))
        );
        assert!(MountArgs::decode(mntproc::EXPORT, &mut Decoder::new(&buf))
            .unwrap()
            .is_err());
        assert!(MountArgs::decode(6, &mut Decoder::new(&buf)).is_none());
        let mut e = Encoder::new();
        e.opaque(&[b'a'; MNTPATHLEN + 1]);
        let buf = e.into_inner();
        assert!(MountArgs::decode(mntproc::MNT, &mut Decoder::new(&buf))
            .unwrap()
            .is_err());
    }

    #[test]
    fn decodes_rpcb() {
        let mut e = Encoder::new();
        e.u32(100003);
        e.u32(3);
        e.string("tcp");
        e.string("127.0.0.1.8.1");
        e.string("superuser");
        let buf = e.into_inner();
        let r = Rpcb::decode(&mut Decoder::new(&buf)).unwrap();
        assert_eq!((r.prog, r.vers, r.netid), (100003, 3, &b"tcp"[..]));
    }
}
