//! Client and session ops: EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION,
//! BIND_CONN_TO_SESSION, DESTROY_CLIENTID, RECLAIM_COMPLETE.

use super::attrs::MAX_IO;
use super::context::{Ctx, OpStatus};
use super::state::{ChannelAttrs, ExchangeFlags, Principal};
use crate::nfs4::consts::status;
use crate::nfs4::msg::{
    cdfc, BindConnToSessionArgs, BindConnToSessionResOk, CreateSessionArgs, CreateSessionResOk,
    ExchangeIdArgs, ExchangeIdResOk, ImplId, SessionId, StateProtectArgs, Xdr,
};
use crate::xdr::{Decoder, Encoder};

const CREATE_SESSION4_FLAG_PERSIST: u32 = 0x1;
const CREATE_SESSION4_FLAG_CONN_BACK_CHAN: u32 = 0x2;
const CREATE_SESSION4_FLAG_CONN_RDMA: u32 = 0x4;

/// The smallest request that can carry a COMPOUND with SEQUENCE: RPC
/// header with empty credentials, tag, minor version, op count, and the
/// SEQUENCE op (the Linux server's bound, 64 bytes).
const MIN_REQUEST: u32 = 64;
/// The smallest reply that can carry SEQUENCE's result.
const MIN_RESPONSE: u32 = 64;

macro_rules! xdr {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(_) => return status::BADXDR,
        }
    };
}

/// EXCHANGE_ID (RFC 8881 section 18.35).
pub(super) fn exchange_id(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let args = xdr!(ExchangeIdArgs::decode(d));
    if let StateProtectArgs::Ssv(_) = args.state_protect {
        // SP4_SSV needs GSS: not offered.
        return status::NOTSUPP;
    }
    let principal = Principal::of(cx.cred);
    let flags = ExchangeFlags(args.flags);
    let r = match cx
        .srv
        .state
        .exchange_id(&args.ownerid, args.verifier, &principal, flags)
    {
        Ok(r) => r,
        Err(st) => return st,
    };
    let mut flags = ExchangeFlags::USE_NON_PNFS;
    if r.confirmed {
        flags |= ExchangeFlags::CONFIRMED_R;
    }
    ExchangeIdResOk {
        clientid: r.clientid,
        sequenceid: r.seq,
        flags,
        state_protect: 0, // SP4_NONE
        owner_minor: 0,
        owner_major: cx.srv.owner.clone(),
        scope: cx.srv.owner.clone(),
        impl_id: vec![ImplId {
            domain: b"sluice.invalid".to_vec(),
            name: concat!("sluice ", env!("CARGO_PKG_VERSION"))
                .as_bytes()
                .to_vec(),
            date: Default::default(),
        }],
    }
    .encode(e);
    status::OK
}

/// CREATE_SESSION (RFC 8881 section 18.36).
pub(super) fn create_session(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let args = xdr!(CreateSessionArgs::decode(d));
    let (clientid, seq, flags) = (args.clientid, args.sequence, args.flags);
    let (fore, back) = (args.fore, args.back);
    // RFC 8881 section 18.36.3: undefined flags are an error; channels
    // too small for any COMPOUND get NFS4ERR_TOOSMALL.
    if flags
        & !(CREATE_SESSION4_FLAG_PERSIST
            | CREATE_SESSION4_FLAG_CONN_BACK_CHAN
            | CREATE_SESSION4_FLAG_CONN_RDMA)
        != 0
    {
        return status::INVAL;
    }
    if fore.max_request < MIN_REQUEST || fore.max_response < MIN_RESPONSE {
        return status::TOOSMALL;
    }
    if fore.max_requests == 0 || fore.max_ops < 2 {
        return status::INVAL;
    }
    let limit = MAX_IO + 64 * 1024;
    // No header padding, no RDMA.
    let fore = ChannelAttrs {
        header_pad: 0,
        max_request: fore.max_request.min(limit),
        max_response: fore.max_response.min(limit),
        max_response_cached: fore.max_response_cached.min(64 * 1024),
        max_ops: fore.max_ops.min(128),
        // The state table grants at most its slot limit.
        max_requests: fore.max_requests,
        rdma_ird: None,
    };
    let back = ChannelAttrs {
        header_pad: 0,
        max_requests: back.max_requests.clamp(1, 4),
        rdma_ird: None,
        ..back
    };
    // The back channel is accepted but never used: no delegations or
    // layouts are granted, so there is nothing to call back about.
    let out_flags = flags & CREATE_SESSION4_FLAG_CONN_BACK_CHAN;
    let principal = Principal::of(cx.cred);
    let r = cx
        .srv
        .state
        .create_session(clientid, &principal, seq, fore, back, |s| {
            let mut r = Encoder::with_capacity(128);
            CreateSessionResOk {
                sessionid: s.id,
                sequence: seq,
                flags: out_flags,
                fore: s.fore,
                back: s.back,
            }
            .encode(&mut r);
            r.into_inner()
        });
    match r {
        Ok(body) => {
            e.raw(&body);
            status::OK
        }
        Err(st) => st,
    }
}

/// DESTROY_SESSION.
pub(super) fn destroy_session(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    let sid = xdr!(SessionId::decode(d));
    match cx.srv.state.destroy_session(&sid) {
        Ok(()) => status::OK,
        Err(st) => st,
    }
}

/// BIND_CONN_TO_SESSION: connections are not tied to sessions here, so
/// any connection may serve any session; the answer confirms the binding.
pub(super) fn bind_conn_to_session(
    cx: &mut Ctx<'_>,
    d: &mut Decoder<'_>,
    e: &mut Encoder,
) -> OpStatus {
    let args = xdr!(BindConnToSessionArgs::decode(d));
    if let Err(st) = cx.srv.state.session(&args.sessionid) {
        return st;
    }
    let dir = match args.dir {
        cdfc::FORE => cdfc::FORE,
        cdfc::BACK => cdfc::BACK,
        cdfc::FORE_OR_BOTH | cdfc::BACK_OR_BOTH => cdfc::FORE_OR_BOTH,
        _ => return status::INVAL,
    };
    BindConnToSessionResOk {
        sessionid: args.sessionid,
        dir,
        use_conn_in_rdma_mode: false,
    }
    .encode(e);
    status::OK
}

/// DESTROY_CLIENTID.
pub(super) fn destroy_clientid(
    cx: &mut Ctx<'_>,
    d: &mut Decoder<'_>,
    _e: &mut Encoder,
) -> OpStatus {
    let clientid = xdr!(u64::decode(d));
    match cx.srv.state.destroy_client(clientid) {
        Ok(()) => status::OK,
        Err(st) => st,
    }
}

/// RECLAIM_COMPLETE.
pub(super) fn reclaim_complete(
    cx: &mut Ctx<'_>,
    d: &mut Decoder<'_>,
    _e: &mut Encoder,
) -> OpStatus {
    let one_fs = xdr!(bool::decode(d));
    let clientid = match cx.clientid() {
        Ok(c) => c,
        Err(st) => return st,
    };
    match cx.srv.state.reclaim_complete(clientid, one_fs) {
        Ok(()) => status::OK,
        Err(st) => st,
    }
}
