//! Server-side copy ops (RFC 7862): COPY, OFFLOAD_STATUS, OFFLOAD_CANCEL
//! and the callback CB_OFFLOAD that ends an asynchronous copy. CLONE's
//! arguments are with the other file ops.

use super::common::{array, put_array, xdr_struct};
use super::{NfsFh4, Stateid4, Xdr, SMALL_ARRAY};
use crate::nfs4::consts::OPAQUE_LIMIT;
use crate::nfs4::Nfsstat4;
use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

/// netloc_type4.
pub mod netloc_type {
    /// NL4_NAME: a host name.
    pub const NAME: u32 = 1;
    /// NL4_URL: a URL.
    pub const URL: u32 = 2;
    /// NL4_NETADDR: a netaddr4 (netid and universal address).
    pub const NETADDR: u32 = 3;
}

/// netloc4: where a source server is (inter-server copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Netloc4 {
    /// A host name.
    Name(Vec<u8>),
    /// A URL.
    Url(Vec<u8>),
    /// A netid and a universal address.
    Addr {
        /// r_netid ("tcp", "tcp6").
        netid: Vec<u8>,
        /// r_addr ("h1.h2.h3.h4.p1.p2").
        addr: Vec<u8>,
    },
}

impl Xdr for Netloc4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Netloc4::Name(n) => {
                e.u32(netloc_type::NAME);
                e.opaque(n);
            }
            Netloc4::Url(u) => {
                e.u32(netloc_type::URL);
                e.opaque(u);
            }
            Netloc4::Addr { netid, addr } => {
                e.u32(netloc_type::NETADDR);
                e.opaque(netid);
                e.opaque(addr);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let s = |d: &mut Decoder<'_>| d.opaque(OPAQUE_LIMIT).map(<[u8]>::to_vec);
        Ok(match d.u32()? {
            netloc_type::NAME => Netloc4::Name(s(d)?),
            netloc_type::URL => Netloc4::Url(s(d)?),
            netloc_type::NETADDR => Netloc4::Addr {
                netid: s(d)?,
                addr: s(d)?,
            },
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

xdr_struct! {
    /// COPY4args (section 15.2): the saved filehandle is the source, the
    /// current one the destination.
    pub struct CopyArgs {
        /// A stateid of the source that reads.
        pub src_stateid: Stateid4,
        /// A stateid of the destination that writes.
        pub dst_stateid: Stateid4,
        /// Where the range starts in the source.
        pub src_offset: u64,
        /// Where it goes in the destination.
        pub dst_offset: u64,
        /// Its length; 0 to the end of the source.
        pub count: u64,
        /// Whether a partial copy must be a prefix of the range.
        pub consecutive: bool,
        /// Whether the client wants the copy done before the reply.
        pub synchronous: bool,
        /// Where the source is, for a copy from another server; empty
        /// for a copy within this one.
        pub source_server: Vec<Netloc4>,
    }
}

impl Xdr for Vec<Netloc4> {
    fn encode(&self, e: &mut Encoder) {
        put_array(e, self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        array(d, SMALL_ARRAY, 8)
    }
}

/// write_response4: what a copy wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteResponse4 {
    /// The copy's stateid when it goes on after the reply (asynchronous);
    /// None when it is done.
    pub callback_id: Option<Stateid4>,
    /// Bytes written.
    pub count: u64,
    /// How stable they are (stable_how4).
    pub committed: u32,
    /// The write verifier.
    pub verifier: [u8; 8],
}

impl Xdr for WriteResponse4 {
    fn encode(&self, e: &mut Encoder) {
        match &self.callback_id {
            Some(s) => {
                e.u32(1);
                s.encode(e);
            }
            None => e.u32(0),
        }
        e.u64(self.count);
        e.u32(self.committed);
        e.opaque_fixed(&self.verifier);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let callback_id = match d.count(1, 16)? {
            0 => None,
            _ => Some(Stateid4::decode(d)?),
        };
        Ok(WriteResponse4 {
            callback_id,
            count: d.u64()?,
            committed: d.u32()?,
            verifier: d.array()?,
        })
    }
}

xdr_struct! {
    /// copy_requirements4: how the server did the copy.
    pub struct CopyRequirements4 {
        /// A partial copy is a prefix of the range.
        pub consecutive: bool,
        /// The copy was done before the reply.
        pub synchronous: bool,
    }
}

xdr_struct! {
    /// COPY4resok.
    pub struct CopyResOk {
        /// What was written, or the copy's stateid.
        pub response: WriteResponse4,
        /// How it was done.
        pub requirements: CopyRequirements4,
    }
}

xdr_struct! {
    /// OFFLOAD_CANCEL4args and OFFLOAD_STATUS4args (sections 15.8, 15.9).
    pub struct OffloadArgs {
        /// The copy's stateid (wr_callback_id of its COPY).
        pub stateid: Stateid4,
    }
}

/// OFFLOAD_STATUS4resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadStatusResOk {
    /// Bytes copied so far.
    pub count: u64,
    /// How it ended, once it has.
    pub complete: Option<Nfsstat4>,
}

impl Xdr for OffloadStatusResOk {
    fn encode(&self, e: &mut Encoder) {
        e.u64(self.count);
        match self.complete {
            Some(s) => {
                e.u32(1);
                s.encode(e);
            }
            None => e.u32(0),
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let count = d.u64()?;
        let complete = match d.count(1, 4)? {
            0 => None,
            _ => Some(Nfsstat4::decode(d)?),
        };
        Ok(OffloadStatusResOk { count, complete })
    }
}

/// offload_info4: how an asynchronous copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadInfo4 {
    /// It ended well: what it wrote.
    Done(WriteResponse4),
    /// It failed with this status after copying this many bytes.
    Failed(Nfsstat4, u64),
}

impl Xdr for OffloadInfo4 {
    fn encode(&self, e: &mut Encoder) {
        match self {
            OffloadInfo4::Done(w) => {
                e.u32(0);
                w.encode(e);
            }
            OffloadInfo4::Failed(st, n) => {
                st.encode(e);
                e.u64(*n);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let st = Nfsstat4::decode(d)?;
        if st.0 == 0 {
            Ok(OffloadInfo4::Done(WriteResponse4::decode(d)?))
        } else {
            Ok(OffloadInfo4::Failed(st, d.u64()?))
        }
    }
}

xdr_struct! {
    /// CB_OFFLOAD4args (section 16.1).
    pub struct CbOffloadArgs {
        /// The destination file.
        pub fh: NfsFh4,
        /// The copy's stateid.
        pub stateid: Stateid4,
        /// How it ended.
        pub info: OffloadInfo4,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, roundtrip, stateid};
    use super::*;
    use proptest::prelude::*;

    fn netloc() -> impl Strategy<Value = Netloc4> {
        prop_oneof![
            bytes(40).prop_map(Netloc4::Name),
            bytes(40).prop_map(Netloc4::Url),
            (bytes(8), bytes(24)).prop_map(|(netid, addr)| Netloc4::Addr { netid, addr }),
        ]
    }

    fn response() -> impl Strategy<Value = WriteResponse4> {
        (
            proptest::option::of(stateid()),
            any::<(u64, u32, [u8; 8])>(),
        )
            .prop_map(|(id, v)| WriteResponse4 {
                callback_id: id,
                count: v.0,
                committed: v.1,
                verifier: v.2,
            })
    }

    proptest! {
        #[test]
        fn copy_messages_roundtrip(
            s in stateid(), t in stateid(), v in any::<(u64, u64, u64, bool, bool, u32)>(),
            servers in proptest::collection::vec(netloc(), 0..3), w in response(), fh in bytes(64),
        ) {
            roundtrip(&CopyArgs {
                src_stateid: s, dst_stateid: t, src_offset: v.0, dst_offset: v.1, count: v.2,
                consecutive: v.3, synchronous: v.4, source_server: servers,
            });
            roundtrip(&CopyResOk {
                response: w,
                requirements: CopyRequirements4 { consecutive: v.3, synchronous: v.4 },
            });
            roundtrip(&OffloadArgs { stateid: s });
            roundtrip(&OffloadStatusResOk { count: v.0, complete: None });
            roundtrip(&OffloadStatusResOk { count: v.0, complete: Some(Nfsstat4(v.5)) });
            roundtrip(&CbOffloadArgs { fh: NfsFh4(fh.clone()), stateid: t, info: OffloadInfo4::Done(w) });
            roundtrip(&CbOffloadArgs {
                fh: NfsFh4(fh), stateid: t, info: OffloadInfo4::Failed(Nfsstat4(v.5 | 1), v.1),
            });
        }
    }
}
