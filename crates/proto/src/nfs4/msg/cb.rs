//! Messages of the back channel (RFC 8881 sections 18.33 and 20): the
//! BACKCHANNEL_CTL op, and the CB_COMPOUND procedure the server calls on
//! the client with CB_SEQUENCE, CB_RECALL and CB_RECALL_ANY.

use super::common::{array, put_array, xdr_struct, Bitmap4, Fattr4};
use super::ns::NfsFh4;
use super::{CallbackSec, SessionId, Stateid4, Xdr, SMALL_ARRAY};
use crate::xdr::{Decoder, Encoder, XdrResult};

/// Callback operation numbers (nfs_cb_opnum4).
pub mod cb_op {
    /// CB_GETATTR.
    pub const GETATTR: u32 = 3;
    /// CB_RECALL.
    pub const RECALL: u32 = 4;
    /// CB_RECALL_ANY.
    pub const RECALL_ANY: u32 = 8;
    /// CB_SEQUENCE.
    pub const SEQUENCE: u32 = 11;
    /// CB_OFFLOAD (RFC 7862).
    pub const OFFLOAD: u32 = 15;
    /// CB_ILLEGAL.
    pub const ILLEGAL: u32 = 10044;
}

/// The procedures of the callback program.
pub mod cb_proc {
    /// CB_NULL: does nothing; probes the path.
    pub const NULL: u32 = 0;
    /// CB_COMPOUND.
    pub const COMPOUND: u32 = 1;
}

/// BACKCHANNEL_CTL4args (section 18.33).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackchannelCtlArgs {
    /// The callback program to use from now on.
    pub cb_program: u32,
    /// How the server may call back.
    pub sec_parms: Vec<CallbackSec>,
}

impl Xdr for BackchannelCtlArgs {
    fn encode(&self, e: &mut Encoder) {
        e.u32(self.cb_program);
        put_array(e, &self.sec_parms);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(BackchannelCtlArgs {
            cb_program: d.u32()?,
            sec_parms: array(d, SMALL_ARRAY, 4)?,
        })
    }
}

xdr_struct! {
    /// CB_COMPOUND4args up to its ops.
    pub struct CbCompoundHeader {
        /// Echoed in the reply.
        pub tag: Vec<u8>,
        /// The minor version (1 or 2).
        pub minorversion: u32,
        /// 0 in NFSv4.1 (it identified the callback in NFSv4.0).
        pub callback_ident: u32,
        /// How many ops follow.
        pub numops: u32,
    }
}

xdr_struct! {
    /// CB_COMPOUND4res up to its results.
    pub struct CbCompoundResHeader {
        /// The status of the last op run.
        pub status: crate::nfs4::Nfsstat4,
        /// The tag of the call.
        pub tag: Vec<u8>,
        /// How many results follow.
        pub numres: u32,
    }
}

xdr_struct! {
    /// referring_call4: a fore channel call a callback follows from.
    pub struct ReferringCall4 {
        /// Its sequence id.
        pub sequenceid: u32,
        /// Its slot.
        pub slotid: u32,
    }
}

/// referring_call_list4: the referring calls of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferringCallList4 {
    /// The session.
    pub sessionid: SessionId,
    /// Its calls.
    pub calls: Vec<ReferringCall4>,
}

impl Xdr for ReferringCallList4 {
    fn encode(&self, e: &mut Encoder) {
        self.sessionid.encode(e);
        put_array(e, &self.calls);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(ReferringCallList4 {
            sessionid: SessionId::decode(d)?,
            calls: array(d, SMALL_ARRAY, 8)?,
        })
    }
}

/// CB_SEQUENCE4args (section 20.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbSequenceArgs {
    /// The session whose back channel carries the call.
    pub sessionid: SessionId,
    /// The slot's sequence id.
    pub sequenceid: u32,
    /// The slot.
    pub slotid: u32,
    /// Highest slot in use.
    pub highest_slotid: u32,
    /// Whether the client should keep the reply.
    pub cachethis: bool,
    /// Fore channel calls this one follows from.
    pub referring_call_lists: Vec<ReferringCallList4>,
}

impl Xdr for CbSequenceArgs {
    fn encode(&self, e: &mut Encoder) {
        self.sessionid.encode(e);
        e.u32(self.sequenceid);
        e.u32(self.slotid);
        e.u32(self.highest_slotid);
        e.bool(self.cachethis);
        put_array(e, &self.referring_call_lists);
    }
    fn decode(d: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(CbSequenceArgs {
            sessionid: SessionId::decode(d)?,
            sequenceid: d.u32()?,
            slotid: d.u32()?,
            highest_slotid: d.u32()?,
            cachethis: d.bool()?,
            referring_call_lists: array(d, SMALL_ARRAY, 20)?,
        })
    }
}

xdr_struct! {
    /// CB_SEQUENCE4resok.
    pub struct CbSequenceResOk {
        /// The session.
        pub sessionid: SessionId,
        /// The slot's sequence id.
        pub sequenceid: u32,
        /// The slot.
        pub slotid: u32,
        /// Highest slot the client has.
        pub highest_slotid: u32,
        /// Highest slot the client wants used.
        pub target_highest_slotid: u32,
    }
}

xdr_struct! {
    /// CB_RECALL4args (section 20.2).
    pub struct CbRecallArgs {
        /// The delegation recalled.
        pub stateid: Stateid4,
        /// Whether the file is about to be truncated to zero.
        pub truncate: bool,
        /// The file.
        pub fh: NfsFh4,
    }
}

xdr_struct! {
    /// CB_GETATTR4args (section 20.1).
    pub struct CbGetattrArgs {
        /// The file.
        pub fh: NfsFh4,
        /// The attributes wanted (the server asks for change and size).
        pub attr_request: Bitmap4,
    }
}

xdr_struct! {
    /// CB_GETATTR4resok: the holder's view of the file.
    pub struct CbGetattrResOk {
        /// The attributes.
        pub obj_attributes: Fattr4,
    }
}

xdr_struct! {
    /// CB_RECALL_ANY4args (section 20.6).
    pub struct CbRecallAnyArgs {
        /// How many objects the client may keep.
        pub objects_to_keep: u32,
        /// Which kinds (RCA4_TYPE_MASK_* bits).
        pub type_mask: Bitmap4,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, roundtrip, stateid};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn callback_messages_roundtrip(
            sessionid in any::<[u8; 16]>(), v in any::<[u32; 5]>(), flag in any::<bool>(), sid in stateid(),
            fh in bytes(128), calls in proptest::collection::vec(any::<(u32, u32)>(), 0..4),
            lists in 0usize..3, mask in proptest::collection::vec(any::<u32>(), 0..3),
        ) {
            roundtrip(&BackchannelCtlArgs { cb_program: v[0], sec_parms: vec![CallbackSec::None] });
            roundtrip(&CbCompoundHeader { tag: vec![1, 2], minorversion: v[0], callback_ident: v[1], numops: v[2] });
            roundtrip(&CbCompoundResHeader { status: crate::nfs4::Nfsstat4(v[0]), tag: vec![], numres: v[1] });
            let list = ReferringCallList4 {
                sessionid,
                calls: calls.iter().map(|&(sequenceid, slotid)| ReferringCall4 { sequenceid, slotid }).collect(),
            };
            roundtrip(&CbSequenceArgs {
                sessionid, sequenceid: v[0], slotid: v[1], highest_slotid: v[2], cachethis: flag,
                referring_call_lists: vec![list; lists],
            });
            roundtrip(&CbSequenceResOk { sessionid, sequenceid: v[0], slotid: v[1], highest_slotid: v[2], target_highest_slotid: v[3] });
            roundtrip(&CbRecallArgs { stateid: sid, truncate: flag, fh: NfsFh4(fh.clone()) });
            roundtrip(&CbRecallAnyArgs { objects_to_keep: v[4], type_mask: Bitmap4(mask.clone()) });
            roundtrip(&CbGetattrArgs { fh: NfsFh4(fh.clone()), attr_request: Bitmap4(mask.clone()) });
            roundtrip(&CbGetattrResOk { obj_attributes: Fattr4 { mask: Bitmap4(mask), vals: fh } });
        }
    }
}
