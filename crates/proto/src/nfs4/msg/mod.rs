//! Typed NFSv4.1 messages (RFC 8881 section 18, XDR from RFC 5662): the
//! arguments and results of operations, each with one [`Xdr`] impl that
//! both encodes and decodes it, shared by the server, the project's own
//! client, the tests and the fuzzers.
//!
//! Decoding bounds every variable-length field (opaques at
//! NFS4_OPAQUE_LIMIT, arrays at small counts), so a hostile message costs
//! at most its own size.

use super::consts::{OPAQUE_LIMIT, SESSIONID_SIZE};
use crate::xdr::{Decoder, Encoder, XdrError, XdrResult};

mod cb;
mod common;
mod copy;
mod file;
mod ns;
mod xattr;
pub use cb::*;
use common::{array, put_array};
pub use common::{
    Bitmap4, ChangeInfo4, Component4, Fattr4, Nfsace4, StateOwner4, MAX_ATTR_VALS,
    MAX_BITMAP_WORDS, MAX_COMPONENT,
};
pub use copy::*;
pub use file::*;
pub use ns::*;
pub use xattr::*;

/// A type with an XDR form: [`Xdr::encode`] writes it, [`Xdr::decode`]
/// reads it back.
pub trait Xdr: Sized {
    /// Writes the value.
    fn encode(&self, e: &mut Encoder);
    /// Reads a value.
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self>;
}

/// Most entries in the small arrays of these messages.
const SMALL_ARRAY: usize = 16;

impl Xdr for u32 {
    fn encode(&self, e: &mut Encoder) {
        e.u32(*self);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        d.u32()
    }
}

/// A session id.
pub type SessionId = [u8; SESSIONID_SIZE];

/// stateid4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stateid4 {
    /// Sequence number, bumped on every change of the state.
    pub seqid: u32,
    /// Identifies the state.
    pub other: [u8; 12],
}

impl Stateid4 {
    /// The anonymous stateid (all zeros).
    pub const ANONYMOUS: Stateid4 = Stateid4 {
        seqid: 0,
        other: [0; 12],
    };
    /// The READ bypass stateid (all ones).
    pub const BYPASS: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0xff; 12],
    };
    /// The "current stateid" of a COMPOUND (RFC 8881 section 16.2.3.1.2).
    pub const CURRENT: Stateid4 = Stateid4 {
        seqid: 1,
        other: [0; 12],
    };
    /// The invalid stateid returned by CLOSE.
    pub const INVALID: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0; 12],
    };

    /// True for the anonymous and bypass special stateids.
    pub fn is_special_io(&self) -> bool {
        *self == Self::ANONYMOUS || *self == Self::BYPASS
    }
}

impl Xdr for Stateid4 {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.seqid);
        e.opaque_fixed(&self.other);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Stateid4 {
            seqid: d.u32()?,
            other: d.array()?,
        })
    }
}

/// SEQUENCE4args (section 18.46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceArgs {
    /// The session.
    pub sessionid: SessionId,
    /// The slot's sequence id.
    pub sequenceid: u32,
    /// The slot.
    pub slotid: u32,
    /// The highest slot the client is using.
    pub highest_slotid: u32,
    /// Keep the reply for a retry.
    pub cachethis: bool,
}

impl Xdr for SequenceArgs {
    fn encode(&self, e: &mut Encoder) {
        e.opaque_fixed(&self.sessionid);
        e.u32(self.sequenceid);
        e.u32(self.slotid);
        e.u32(self.highest_slotid);
        e.bool(self.cachethis);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(SequenceArgs {
            sessionid: d.array()?,
            sequenceid: d.u32()?,
            slotid: d.u32()?,
            highest_slotid: d.u32()?,
            cachethis: d.bool()?,
        })
    }
}

/// SEQUENCE4resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceResOk {
    /// The session.
    pub sessionid: SessionId,
    /// The slot's sequence id.
    pub sequenceid: u32,
    /// The slot.
    pub slotid: u32,
    /// The highest slot the server will accept now.
    pub highest_slotid: u32,
    /// The highest slot the server would like the client to use.
    pub target_highest_slotid: u32,
    /// SEQ4_STATUS_* flags.
    pub status_flags: u32,
}

impl Xdr for SequenceResOk {
    fn encode(&self, e: &mut Encoder) {
        e.opaque_fixed(&self.sessionid);
        e.u32(self.sequenceid);
        e.u32(self.slotid);
        e.u32(self.highest_slotid);
        e.u32(self.target_highest_slotid);
        e.u32(self.status_flags);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(SequenceResOk {
            sessionid: d.array()?,
            sequenceid: d.u32()?,
            slotid: d.u32()?,
            highest_slotid: d.u32()?,
            target_highest_slotid: d.u32()?,
            status_flags: d.u32()?,
        })
    }
}

/// state_protect_ops4: operations that must or may use the state
/// protection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StateProtectOps {
    /// spo_must_enforce.
    pub must_enforce: Vec<u32>,
    /// spo_must_allow.
    pub must_allow: Vec<u32>,
}

impl Xdr for StateProtectOps {
    fn encode(&self, e: &mut Encoder) {
        // The words as they are (trailing zero words too), so that what
        // was decoded encodes to the same bytes.
        put_array(e, &self.must_enforce);
        put_array(e, &self.must_allow);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(StateProtectOps {
            must_enforce: d.bitmap(8)?,
            must_allow: d.bitmap(8)?,
        })
    }
}

/// state_protect4_a: how the client wants its state protected.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateProtectArgs {
    /// SP4_NONE.
    #[default]
    None,
    /// SP4_MACH_CRED.
    MachCred(StateProtectOps),
    /// SP4_SSV (needs RPCSEC_GSS; its parameters are read and dropped).
    Ssv(StateProtectOps),
}

impl Xdr for StateProtectArgs {
    fn encode(&self, e: &mut Encoder) {
        match self {
            StateProtectArgs::None => e.u32(0),
            StateProtectArgs::MachCred(ops) => {
                e.u32(1);
                ops.encode(e);
            }
            StateProtectArgs::Ssv(ops) => {
                e.u32(2);
                ops.encode(e);
                e.u32(0); // no hash algorithms
                e.u32(0); // no encryption algorithms
                e.u32(0); // window
                e.u32(0); // GSS handles
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            0 => StateProtectArgs::None,
            1 => StateProtectArgs::MachCred(StateProtectOps::decode(d)?),
            2 => {
                let ops = StateProtectOps::decode(d)?;
                for _ in 0..2 {
                    let n = d.count(SMALL_ARRAY, 4)?;
                    for _ in 0..n {
                        d.opaque(OPAQUE_LIMIT)?;
                    }
                }
                d.u32()?;
                d.u32()?;
                StateProtectArgs::Ssv(ops)
            }
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

/// nfstime4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Nfstime4 {
    /// Seconds since the epoch.
    pub seconds: i64,
    /// Nanoseconds.
    pub nseconds: u32,
}

impl Xdr for Nfstime4 {
    fn encode(&self, e: &mut Encoder) {
        e.i64(self.seconds);
        e.u32(self.nseconds);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(Nfstime4 {
            seconds: d.i64()?,
            nseconds: d.u32()?,
        })
    }
}

/// nfs_impl_id4: who wrote the implementation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImplId {
    /// A DNS domain of the implementer.
    pub domain: Vec<u8>,
    /// Name and version.
    pub name: Vec<u8>,
    /// Build date.
    pub date: Nfstime4,
}

impl Xdr for ImplId {
    fn encode(&self, e: &mut Encoder) {
        e.opaque(&self.domain);
        e.opaque(&self.name);
        self.date.encode(e);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(ImplId {
            domain: Vec::<u8>::decode(d)?,
            name: Vec::<u8>::decode(d)?,
            date: Nfstime4::decode(d)?,
        })
    }
}

/// EXCHANGE_ID4args (section 18.35).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExchangeIdArgs {
    /// The client's boot verifier.
    pub verifier: [u8; 8],
    /// The client's owner id.
    pub ownerid: Vec<u8>,
    /// EXCHGID4_FLAG_* bits.
    pub flags: u32,
    /// State protection asked for.
    pub state_protect: StateProtectArgs,
    /// At most one implementation id.
    pub impl_id: Vec<ImplId>,
}

impl Xdr for ExchangeIdArgs {
    fn encode(&self, e: &mut Encoder) {
        e.opaque_fixed(&self.verifier);
        e.opaque(&self.ownerid);
        e.u32(self.flags);
        self.state_protect.encode(e);
        put_array(e, &self.impl_id);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(ExchangeIdArgs {
            verifier: d.array()?,
            ownerid: Vec::<u8>::decode(d)?,
            flags: d.u32()?,
            state_protect: StateProtectArgs::decode(d)?,
            impl_id: array(d, 1, 20)?,
        })
    }
}

/// EXCHANGE_ID4resok.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExchangeIdResOk {
    /// The client id.
    pub clientid: u64,
    /// Sequence id for the first CREATE_SESSION.
    pub sequenceid: u32,
    /// EXCHGID4_FLAG_* bits.
    pub flags: u32,
    /// The state protection granted (SP4_NONE here: 0).
    pub state_protect: u32,
    /// server_owner4's minor id.
    pub owner_minor: u64,
    /// server_owner4's major id.
    pub owner_major: Vec<u8>,
    /// The server scope.
    pub scope: Vec<u8>,
    /// At most one implementation id.
    pub impl_id: Vec<ImplId>,
}

impl Xdr for ExchangeIdResOk {
    fn encode(&self, e: &mut Encoder) {
        e.u64(self.clientid);
        e.u32(self.sequenceid);
        e.u32(self.flags);
        e.u32(self.state_protect);
        e.u64(self.owner_minor);
        e.opaque(&self.owner_major);
        e.opaque(&self.scope);
        put_array(e, &self.impl_id);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let clientid = d.u64()?;
        let sequenceid = d.u32()?;
        let flags = d.u32()?;
        let state_protect = d.u32()?;
        if state_protect != 0 {
            // Only SP4_NONE is granted by sluice.
            return Err(XdrError::BadValue(state_protect));
        }
        Ok(ExchangeIdResOk {
            clientid,
            sequenceid,
            flags,
            state_protect,
            owner_minor: d.u64()?,
            owner_major: Vec::<u8>::decode(d)?,
            scope: Vec::<u8>::decode(d)?,
            impl_id: array(d, 1, 20)?,
        })
    }
}

/// channel_attrs4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelAttrs4 {
    /// ca_headerpadsize.
    pub header_pad: u32,
    /// ca_maxrequestsize.
    pub max_request: u32,
    /// ca_maxresponsesize.
    pub max_response: u32,
    /// ca_maxresponsesize_cached.
    pub max_response_cached: u32,
    /// ca_maxoperations.
    pub max_ops: u32,
    /// ca_maxrequests.
    pub max_requests: u32,
    /// ca_rdma_ird, when RDMA is used.
    pub rdma_ird: Option<u32>,
}

impl Xdr for ChannelAttrs4 {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.header_pad);
        e.u32(self.max_request);
        e.u32(self.max_response);
        e.u32(self.max_response_cached);
        e.u32(self.max_ops);
        e.u32(self.max_requests);
        match self.rdma_ird {
            Some(v) => {
                e.u32(1);
                e.u32(v);
            }
            None => e.u32(0),
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        let mut c = ChannelAttrs4 {
            header_pad: d.u32()?,
            max_request: d.u32()?,
            max_response: d.u32()?,
            max_response_cached: d.u32()?,
            max_ops: d.u32()?,
            max_requests: d.u32()?,
            rdma_ird: None,
        };
        let n = d.count(1, 4)?;
        if n == 1 {
            c.rdma_ird = Some(d.u32()?);
        }
        Ok(c)
    }
}

/// authsys_parms (RFC 5531), as a callback credential.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthSysParms {
    /// Stamp.
    pub stamp: u32,
    /// Machine name.
    pub machine: Vec<u8>,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Supplementary groups.
    pub gids: Vec<u32>,
}

/// callback_sec_parms4: how the server may call the client back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackSec {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS.
    Sys(AuthSysParms),
    /// RPCSEC_GSS: service and the two handles.
    Gss(u32, Vec<u8>, Vec<u8>),
}

impl Xdr for CallbackSec {
    fn encode(&self, e: &mut Encoder) {
        match self {
            CallbackSec::None => e.u32(0),
            CallbackSec::Sys(p) => {
                e.u32(1);
                e.u32(p.stamp);
                e.opaque(&p.machine);
                e.u32(p.uid);
                e.u32(p.gid);
                put_array(e, &p.gids);
            }
            CallbackSec::Gss(service, from_server, from_client) => {
                e.u32(6);
                e.u32(*service);
                e.opaque(from_server);
                e.opaque(from_client);
            }
        }
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(match d.u32()? {
            0 => CallbackSec::None,
            1 => CallbackSec::Sys(AuthSysParms {
                stamp: d.u32()?,
                machine: d.opaque(255)?.to_vec(),
                uid: d.u32()?,
                gid: d.u32()?,
                gids: array(d, SMALL_ARRAY, 4)?,
            }),
            6 => CallbackSec::Gss(d.u32()?, Vec::<u8>::decode(d)?, Vec::<u8>::decode(d)?),
            v => return Err(XdrError::BadValue(v)),
        })
    }
}

/// CREATE_SESSION4args (section 18.36).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSessionArgs {
    /// The client id from EXCHANGE_ID.
    pub clientid: u64,
    /// The CREATE_SESSION sequence id.
    pub sequence: u32,
    /// CREATE_SESSION4_FLAG_* bits.
    pub flags: u32,
    /// Fore channel attributes asked for.
    pub fore: ChannelAttrs4,
    /// Back channel attributes asked for.
    pub back: ChannelAttrs4,
    /// The callback program.
    pub cb_program: u32,
    /// How the server may call back.
    pub cb_sec: Vec<CallbackSec>,
}

impl Xdr for CreateSessionArgs {
    fn encode(&self, e: &mut Encoder) {
        e.u64(self.clientid);
        e.u32(self.sequence);
        e.u32(self.flags);
        self.fore.encode(e);
        self.back.encode(e);
        e.u32(self.cb_program);
        put_array(e, &self.cb_sec);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(CreateSessionArgs {
            clientid: d.u64()?,
            sequence: d.u32()?,
            flags: d.u32()?,
            fore: ChannelAttrs4::decode(d)?,
            back: ChannelAttrs4::decode(d)?,
            cb_program: d.u32()?,
            cb_sec: array(d, SMALL_ARRAY, 4)?,
        })
    }
}

/// CREATE_SESSION4resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateSessionResOk {
    /// The new session.
    pub sessionid: SessionId,
    /// The CREATE_SESSION sequence id.
    pub sequence: u32,
    /// CREATE_SESSION4_FLAG_* bits granted.
    pub flags: u32,
    /// Fore channel attributes granted.
    pub fore: ChannelAttrs4,
    /// Back channel attributes granted.
    pub back: ChannelAttrs4,
}

impl Xdr for CreateSessionResOk {
    fn encode(&self, e: &mut Encoder) {
        e.opaque_fixed(&self.sessionid);
        e.u32(self.sequence);
        e.u32(self.flags);
        self.fore.encode(e);
        self.back.encode(e);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(CreateSessionResOk {
            sessionid: d.array()?,
            sequence: d.u32()?,
            flags: d.u32()?,
            fore: ChannelAttrs4::decode(d)?,
            back: ChannelAttrs4::decode(d)?,
        })
    }
}

/// READ4args (section 18.22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadArgs {
    /// The open, lock or special stateid.
    pub stateid: Stateid4,
    /// First byte.
    pub offset: u64,
    /// Bytes wanted.
    pub count: u32,
}

impl Xdr for ReadArgs {
    fn encode(&self, e: &mut Encoder) {
        self.stateid.encode(e);
        e.u64(self.offset);
        e.u32(self.count);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(ReadArgs {
            stateid: Stateid4::decode(d)?,
            offset: d.u64()?,
            count: d.u32()?,
        })
    }
}

/// WRITE4args (section 18.32), with the data borrowed from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteArgs<'a> {
    /// The open, lock or special stateid.
    pub stateid: Stateid4,
    /// First byte.
    pub offset: u64,
    /// UNSTABLE4 (0), DATA_SYNC4 (1) or FILE_SYNC4 (2).
    pub stable: u32,
    /// The bytes.
    pub data: &'a [u8],
}

impl<'a> WriteArgs<'a> {
    /// Writes the arguments.
    pub fn encode(&self, e: &mut Encoder) {
        self.stateid.encode(e);
        e.u64(self.offset);
        e.u32(self.stable);
        e.opaque(self.data);
    }

    /// Reads the arguments, the data up to `max` bytes.
    pub fn decode(d: &mut Decoder<'a>, max: usize) -> XdrResult<Self> {
        Ok(WriteArgs {
            stateid: Stateid4::decode(d)?,
            offset: d.u64()?,
            stable: d.u32()?,
            data: d.opaque(max)?,
        })
    }
}

/// WRITE4resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteResOk {
    /// Bytes written.
    pub count: u32,
    /// How stable they are.
    pub committed: u32,
    /// The write verifier.
    pub verifier: [u8; 8],
}

impl Xdr for WriteResOk {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.count);
        e.u32(self.committed);
        e.opaque_fixed(&self.verifier);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(WriteResOk {
            count: d.u32()?,
            committed: d.u32()?,
            verifier: d.array()?,
        })
    }
}

/// CLOSE4args (section 18.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseArgs {
    /// Ignored in NFSv4.1.
    pub seqid: u32,
    /// The open stateid.
    pub stateid: Stateid4,
}

impl Xdr for CloseArgs {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.seqid);
        self.stateid.encode(e);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(CloseArgs {
            seqid: d.u32()?,
            stateid: Stateid4::decode(d)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(super) fn roundtrip<T: Xdr + PartialEq + std::fmt::Debug>(v: &T) {
        let mut e = Encoder::new();
        v.encode(&mut e);
        let bytes = e.into_inner();
        let mut d = Decoder::new(&bytes);
        let back = T::decode(&mut d).expect("decodes what it encoded");
        assert_eq!(&back, v);
        assert_eq!(d.remaining(), 0, "decoding left bytes");
        // Any shorter message is an error, never a panic.
        for cut in 0..bytes.len() {
            let _ = T::decode(&mut Decoder::new(&bytes[..cut]));
        }
    }

    pub(super) fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..max)
    }

    pub(super) fn stateid() -> impl Strategy<Value = Stateid4> {
        (any::<u32>(), any::<[u8; 12]>()).prop_map(|(seqid, other)| Stateid4 { seqid, other })
    }

    fn channel() -> impl Strategy<Value = ChannelAttrs4> {
        (any::<[u32; 6]>(), proptest::option::of(any::<u32>())).prop_map(|(v, rdma_ird)| {
            ChannelAttrs4 {
                header_pad: v[0],
                max_request: v[1],
                max_response: v[2],
                max_response_cached: v[3],
                max_ops: v[4],
                max_requests: v[5],
                rdma_ird,
            }
        })
    }

    fn impl_ids() -> impl Strategy<Value = Vec<ImplId>> {
        proptest::collection::vec(
            (bytes(40), bytes(40), any::<i64>(), any::<u32>()).prop_map(|(domain, name, s, n)| {
                ImplId {
                    domain,
                    name,
                    date: Nfstime4 {
                        seconds: s,
                        nseconds: n,
                    },
                }
            }),
            0..=1,
        )
    }

    fn ops() -> impl Strategy<Value = StateProtectOps> {
        (
            proptest::collection::vec(any::<u32>(), 0..3),
            proptest::collection::vec(any::<u32>(), 0..3),
        )
            .prop_map(|(must_enforce, must_allow)| StateProtectOps {
                must_enforce,
                must_allow,
            })
    }

    fn cb_sec() -> impl Strategy<Value = CallbackSec> {
        prop_oneof![
            Just(CallbackSec::None),
            (
                any::<u32>(),
                bytes(255),
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(any::<u32>(), 0..16)
            )
                .prop_map(|(stamp, machine, uid, gid, gids)| CallbackSec::Sys(
                    AuthSysParms {
                        stamp,
                        machine,
                        uid,
                        gid,
                        gids
                    }
                )),
            (any::<u32>(), bytes(64), bytes(64)).prop_map(|(s, a, b)| CallbackSec::Gss(s, a, b)),
        ]
    }

    proptest! {
        #[test]
        fn sequence_roundtrips(a in any::<([u8; 16], u32, u32, u32, bool)>(), r in any::<([u8; 16], [u32; 5])>()) {
            roundtrip(&SequenceArgs { sessionid: a.0, sequenceid: a.1, slotid: a.2, highest_slotid: a.3, cachethis: a.4 });
            roundtrip(&SequenceResOk {
                sessionid: r.0, sequenceid: r.1[0], slotid: r.1[1], highest_slotid: r.1[2],
                target_highest_slotid: r.1[3], status_flags: r.1[4],
            });
        }

        #[test]
        fn exchange_id_roundtrips(
            verifier in any::<[u8; 8]>(), ownerid in bytes(1024), flags in any::<u32>(),
            sp in prop_oneof![Just(StateProtectArgs::None), ops().prop_map(StateProtectArgs::MachCred), ops().prop_map(StateProtectArgs::Ssv)],
            impl_id in impl_ids(), clientid in any::<u64>(), seq in any::<u32>(), major in bytes(1024), scope in bytes(1024),
        ) {
            roundtrip(&ExchangeIdArgs { verifier, ownerid, flags, state_protect: sp, impl_id: impl_id.clone() });
            roundtrip(&ExchangeIdResOk {
                clientid, sequenceid: seq, flags, state_protect: 0, owner_minor: clientid,
                owner_major: major, scope, impl_id,
            });
        }

        #[test]
        fn create_session_roundtrips(
            clientid in any::<u64>(), sequence in any::<u32>(), flags in any::<u32>(),
            fore in channel(), back in channel(), cb_program in any::<u32>(),
            cb in proptest::collection::vec(cb_sec(), 0..4), sessionid in any::<[u8; 16]>(),
        ) {
            roundtrip(&CreateSessionArgs { clientid, sequence, flags, fore, back, cb_program, cb_sec: cb });
            roundtrip(&CreateSessionResOk { sessionid, sequence, flags, fore, back });
        }

        #[test]
        fn io_ops_roundtrip(sid in stateid(), offset in any::<u64>(), count in any::<u32>(),
                            stable in 0u32..3, data in bytes(300), verifier in any::<[u8; 8]>()) {
            roundtrip(&ReadArgs { stateid: sid, offset, count });
            roundtrip(&WriteResOk { count, committed: stable, verifier });
            roundtrip(&CloseArgs { seqid: count, stateid: sid });
            let w = WriteArgs { stateid: sid, offset, stable, data: &data };
            let mut e = Encoder::new();
            w.encode(&mut e);
            let b = e.into_inner();
            let back = WriteArgs::decode(&mut Decoder::new(&b), 1 << 20).unwrap();
            prop_assert_eq!(back, w);
        }
    }
}
