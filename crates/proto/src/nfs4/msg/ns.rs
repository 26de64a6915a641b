//! Messages of the namespace and attribute ops (RFC 8881 sections 18.1
//! to 18.30): PUTFH, LOOKUP, GETATTR, SETATTR, ACCESS, READDIR, CREATE,
//! REMOVE, RENAME, LINK, SECINFO_NO_NAME, VERIFY; and the small session
//! ops BIND_CONN_TO_SESSION and RECLAIM_COMPLETE.

use super::common::{xdr_struct, Bitmap4, ChangeInfo4, Component4, Fattr4};
use super::{SessionId, Stateid4, Xdr};
use crate::nfs4::consts::{ftype, FHSIZE};
use crate::xdr::{Decoder, Encoder, XdrResult};

/// nfs_fh4: a filehandle, at most NFS4_FHSIZE bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NfsFh4(pub Vec<u8>);

impl Xdr for NfsFh4 {
    fn encode(&self, e: &mut Encoder) {
        e.opaque(&self.0);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.opaque(FHSIZE).map(|b| NfsFh4(b.to_vec()))
    }
}

xdr_struct! {
    /// SETATTR4args (section 18.30).
    pub struct SetattrArgs {
        /// The open or lock stateid when the size changes.
        pub stateid: Stateid4,
        /// The attributes to set.
        pub attrs: Fattr4,
    }
}

xdr_struct! {
    /// ACCESS4resok (section 18.1).
    pub struct AccessResOk {
        /// The bits the server could check.
        pub supported: u32,
        /// The bits granted.
        pub access: u32,
    }
}

xdr_struct! {
    /// READDIR4args (section 18.23). The result is written entry by entry
    /// as the directory is read.
    pub struct ReaddirArgs {
        /// Where to go on from; 0 for the start.
        pub cookie: u64,
        /// The cookie verifier.
        pub verifier: [u8; 8],
        /// Most bytes of names and cookies wanted.
        pub dircount: u32,
        /// Most bytes of the whole result.
        pub maxcount: u32,
        /// Attributes wanted for each entry.
        pub attr_request: Bitmap4,
    }
}

xdr_struct! {
    /// specdata4: a device's major and minor numbers.
    pub struct Specdata4 {
        /// Major number.
        pub major: u32,
        /// Minor number.
        pub minor: u32,
    }
}

/// createtype4: what CREATE makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Createtype4 {
    /// NF4LNK: a symbolic link to the target.
    Link(Vec<u8>),
    /// NF4BLK: a block device.
    Block(Specdata4),
    /// NF4CHR: a character device.
    Char(Specdata4),
    /// NF4SOCK: a socket.
    Socket,
    /// NF4FIFO: a FIFO.
    Fifo,
    /// NF4DIR: a directory.
    Dir,
    /// Any other type (regular files are made by OPEN): BADTYPE.
    Other(u32),
}

/// Longest symbolic link target a CREATE may carry.
pub const MAX_LINK_TARGET: usize = 4096;

impl Xdr for Createtype4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Createtype4::Link(t) => {
                e.u32(ftype::LNK);
                e.opaque(t);
            }
            Createtype4::Block(s) => {
                e.u32(ftype::BLK);
                s.encode(e);
            }
            Createtype4::Char(s) => {
                e.u32(ftype::CHR);
                s.encode(e);
            }
            Createtype4::Socket => e.u32(ftype::SOCK),
            Createtype4::Fifo => e.u32(ftype::FIFO),
            Createtype4::Dir => e.u32(ftype::DIR),
            Createtype4::Other(t) => e.u32(*t),
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            ftype::LNK => Createtype4::Link(d.opaque(MAX_LINK_TARGET)?.to_vec()),
            ftype::BLK => Createtype4::Block(Specdata4::decode(d)?),
            ftype::CHR => Createtype4::Char(Specdata4::decode(d)?),
            ftype::SOCK => Createtype4::Socket,
            ftype::FIFO => Createtype4::Fifo,
            ftype::DIR => Createtype4::Dir,
            t => Createtype4::Other(t),
        })
    }
}

xdr_struct! {
    /// CREATE4args (section 18.4).
    pub struct CreateArgs {
        /// What to make.
        pub objtype: Createtype4,
        /// Its name in the current directory.
        pub objname: Component4,
        /// Attributes to set.
        pub attrs: Fattr4,
    }
}

xdr_struct! {
    /// CREATE4resok.
    pub struct CreateResOk {
        /// The directory's change.
        pub cinfo: ChangeInfo4,
        /// The attributes set.
        pub attrset: Bitmap4,
    }
}

xdr_struct! {
    /// RENAME4args (section 18.26).
    pub struct RenameArgs {
        /// The name in the saved directory.
        pub oldname: Component4,
        /// The name in the current directory.
        pub newname: Component4,
    }
}

xdr_struct! {
    /// RENAME4resok.
    pub struct RenameResOk {
        /// The saved directory's change.
        pub source_cinfo: ChangeInfo4,
        /// The current directory's change.
        pub target_cinfo: ChangeInfo4,
    }
}

/// channel_dir_from_client4 and channel_dir_from_server4.
pub mod cdfc {
    /// CDFC4_FORE / CDFS4_FORE.
    pub const FORE: u32 = 0x1;
    /// CDFC4_BACK / CDFS4_BACK.
    pub const BACK: u32 = 0x2;
    /// CDFC4_FORE_OR_BOTH / CDFS4_BOTH.
    pub const FORE_OR_BOTH: u32 = 0x3;
    /// CDFC4_BACK_OR_BOTH.
    pub const BACK_OR_BOTH: u32 = 0x7;
}

xdr_struct! {
    /// BIND_CONN_TO_SESSION4args (section 18.34).
    pub struct BindConnToSessionArgs {
        /// The session.
        pub sessionid: SessionId,
        /// A `cdfc` value: the channels wanted.
        pub dir: u32,
        /// Whether to use RDMA.
        pub use_conn_in_rdma_mode: bool,
    }
}

xdr_struct! {
    /// BIND_CONN_TO_SESSION4resok.
    pub struct BindConnToSessionResOk {
        /// The session.
        pub sessionid: SessionId,
        /// A `cdfc` value: the channels bound.
        pub dir: u32,
        /// Whether RDMA is used.
        pub use_conn_in_rdma_mode: bool,
    }
}

xdr_struct! {
    /// COMPOUND4args up to its ops (section 16.2): what comes before the
    /// `numops` operations.
    pub struct CompoundHeader {
        /// Echoed in the reply.
        pub tag: Vec<u8>,
        /// 1 or 2 here.
        pub minorversion: u32,
        /// How many ops follow.
        pub numops: u32,
    }
}

xdr_struct! {
    /// COMPOUND4res up to its results: what comes before the `numres`
    /// results (each an op number, a status and, if OK, the result).
    pub struct CompoundResHeader {
        /// The status of the last op run.
        pub status: crate::nfs4::Nfsstat4,
        /// The tag of the call.
        pub tag: Vec<u8>,
        /// How many results follow.
        pub numres: u32,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, roundtrip, stateid};
    use super::*;
    use proptest::prelude::*;

    fn ctype() -> impl Strategy<Value = Createtype4> {
        prop_oneof![
            bytes(100).prop_map(Createtype4::Link),
            any::<(u32, u32)>()
                .prop_map(|(major, minor)| Createtype4::Block(Specdata4 { major, minor })),
            any::<(u32, u32)>()
                .prop_map(|(major, minor)| Createtype4::Char(Specdata4 { major, minor })),
            Just(Createtype4::Socket),
            Just(Createtype4::Fifo),
            Just(Createtype4::Dir),
            (8u32..).prop_map(Createtype4::Other),
            Just(Createtype4::Other(ftype::REG)),
        ]
    }

    proptest! {
        #[test]
        fn namespace_ops_roundtrip(
            fh in bytes(128), sid in stateid(), mask in proptest::collection::vec(any::<u32>(), 0..4),
            vals in bytes(64), v in any::<(u64, [u8; 8], u32, u32, bool)>(), objtype in ctype(),
            a in bytes(300), b in bytes(300), sessionid in any::<[u8; 16]>(),
        ) {
            roundtrip(&NfsFh4(fh));
            let attrs = Fattr4 { mask: Bitmap4(mask.clone()), vals };
            roundtrip(&SetattrArgs { stateid: sid, attrs: attrs.clone() });
            roundtrip(&AccessResOk { supported: v.2, access: v.3 });
            roundtrip(&ReaddirArgs { cookie: v.0, verifier: v.1, dircount: v.2, maxcount: v.3, attr_request: Bitmap4(mask.clone()) });
            roundtrip(&CreateArgs { objtype, objname: Component4(a.clone()), attrs });
            let cinfo = ChangeInfo4 { atomic: v.4, before: v.0, after: v.0 ^ 1 };
            roundtrip(&CreateResOk { cinfo: cinfo.clone(), attrset: Bitmap4(mask) });
            roundtrip(&RenameArgs { oldname: Component4(a), newname: Component4(b) });
            roundtrip(&RenameResOk { source_cinfo: cinfo.clone(), target_cinfo: cinfo });
            roundtrip(&BindConnToSessionArgs { sessionid, dir: v.2, use_conn_in_rdma_mode: v.4 });
            roundtrip(&BindConnToSessionResOk { sessionid, dir: v.3, use_conn_in_rdma_mode: v.4 });
            roundtrip(&CompoundHeader { tag: b"t".to_vec(), minorversion: v.2, numops: v.3 });
            roundtrip(&CompoundResHeader { status: crate::nfs4::Nfsstat4(v.2), tag: vec![], numres: v.3 });
        }
    }
}
