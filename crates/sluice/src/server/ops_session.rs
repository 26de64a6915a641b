//! Client and session ops: EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION,
//! BIND_CONN_TO_SESSION, DESTROY_CLIENTID, RECLAIM_COMPLETE.

use super::attrs::MAX_IO;
use super::context::{Ctx, OpStatus};
use super::state::{ChannelAttrs, ExchangeFlags, Principal};
use crate::nfs4::consts::{status, OPAQUE_LIMIT, SESSIONID_SIZE};
use crate::xdr::{Decoder, Encoder, XdrResult};

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

fn skip_bitmap(d: &mut Decoder<'_>) -> XdrResult<()> {
    d.bitmap(8).map(drop)
}

/// EXCHANGE_ID (RFC 8881 section 18.35).
pub(super) fn exchange_id(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let verifier: [u8; 8] = xdr!(d.array());
    let owner = xdr!(d.opaque(OPAQUE_LIMIT));
    let flags = ExchangeFlags(xdr!(d.u32()));
    match xdr!(d.u32()) {
        0 => {}
        1 => {
            xdr!(skip_bitmap(d));
            xdr!(skip_bitmap(d));
        }
        // SP4_SSV needs GSS: not offered.
        2 => return status::NOTSUPP,
        _ => return status::BADXDR,
    }
    let n = xdr!(d.count(1, 4));
    for _ in 0..n {
        xdr!(d.opaque(OPAQUE_LIMIT));
        xdr!(d.opaque(OPAQUE_LIMIT));
        xdr!(d.i64());
        xdr!(d.u32());
    }
    let principal = Principal::of(cx.cred);
    let r = match cx.srv.state.exchange_id(owner, verifier, &principal, flags) {
        Ok(r) => r,
        Err(st) => return st,
    };
    e.u64(r.clientid);
    e.u32(r.seq);
    let mut flags = ExchangeFlags::USE_NON_PNFS;
    if r.confirmed {
        flags |= ExchangeFlags::CONFIRMED_R;
    }
    e.u32(flags);
    e.u32(0); // SP4_NONE
    e.u64(0); // server_owner minor id
    e.opaque(&cx.srv.owner);
    e.opaque(&cx.srv.owner); // server scope
    e.u32(1); // one implementation id
    e.string("sluice.invalid");
    e.string(concat!("sluice ", env!("CARGO_PKG_VERSION")));
    e.i64(0);
    e.u32(0);
    status::OK
}

fn decode_channel(d: &mut Decoder<'_>) -> XdrResult<ChannelAttrs> {
    let c = ChannelAttrs {
        header_pad: d.u32()?,
        max_request: d.u32()?,
        max_response: d.u32()?,
        max_response_cached: d.u32()?,
        max_ops: d.u32()?,
        max_requests: d.u32()?,
    };
    let n = d.count(1, 4)?;
    for _ in 0..n {
        d.u32()?;
    }
    Ok(c)
}

fn encode_channel(e: &mut Encoder, c: &ChannelAttrs) {
    e.u32(c.header_pad);
    e.u32(c.max_request);
    e.u32(c.max_response);
    e.u32(c.max_response_cached);
    e.u32(c.max_ops);
    e.u32(c.max_requests);
    e.u32(0); // no RDMA
}

fn skip_cb_sec(d: &mut Decoder<'_>) -> XdrResult<()> {
    let n = d.count(16, 4)?;
    for _ in 0..n {
        match d.u32()? {
            0 => {}
            1 => {
                d.u32()?;
                d.opaque(255)?;
                d.u32()?;
                d.u32()?;
                let g = d.count(16, 4)?;
                for _ in 0..g {
                    d.u32()?;
                }
            }
            6 => {
                d.u32()?;
                d.opaque(OPAQUE_LIMIT)?;
                d.opaque(OPAQUE_LIMIT)?;
            }
            v => return Err(crate::xdr::XdrError::BadValue(v)),
        }
    }
    Ok(())
}

/// CREATE_SESSION (RFC 8881 section 18.36).
pub(super) fn create_session(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, e: &mut Encoder) -> OpStatus {
    let clientid = xdr!(d.u64());
    let seq = xdr!(d.u32());
    let flags = xdr!(d.u32());
    let fore = xdr!(decode_channel(d));
    let back = xdr!(decode_channel(d));
    let _cb_program = xdr!(d.u32());
    xdr!(skip_cb_sec(d));
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
    let fore = ChannelAttrs {
        header_pad: 0,
        max_request: fore.max_request.min(limit),
        max_response: fore.max_response.min(limit),
        max_response_cached: fore.max_response_cached.min(64 * 1024),
        max_ops: fore.max_ops.min(128),
        // The state table grants at most its slot limit.
        max_requests: fore.max_requests,
    };
    let back = ChannelAttrs {
        header_pad: 0,
        max_requests: back.max_requests.clamp(1, 4),
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
            r.opaque_fixed(&s.id);
            r.u32(seq);
            r.u32(out_flags);
            encode_channel(&mut r, &s.fore);
            encode_channel(&mut r, &s.back);
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
    let sid: [u8; SESSIONID_SIZE] = xdr!(d.array());
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
    let sid: [u8; SESSIONID_SIZE] = xdr!(d.array());
    let dir = xdr!(d.u32());
    let _rdma = xdr!(d.bool());
    if let Err(st) = cx.srv.state.session(&sid) {
        return st;
    }
    let out = match dir {
        1 => 1,     // CDFC4_FORE -> CDFS4_FORE
        2 => 2,     // CDFC4_BACK -> CDFS4_BACK
        3 | 7 => 3, // FORE_OR_BOTH, BACK_OR_BOTH -> BOTH
        _ => return status::INVAL,
    };
    e.opaque_fixed(&sid);
    e.u32(out);
    e.bool(false);
    status::OK
}

/// DESTROY_CLIENTID.
pub(super) fn destroy_clientid(
    cx: &mut Ctx<'_>,
    d: &mut Decoder<'_>,
    _e: &mut Encoder,
) -> OpStatus {
    let clientid = xdr!(d.u64());
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
    let one_fs = xdr!(d.bool());
    let clientid = match cx.clientid() {
        Ok(c) => c,
        Err(st) => return st,
    };
    match cx.srv.state.reclaim_complete(clientid, one_fs) {
        Ok(()) => status::OK,
        Err(st) => st,
    }
}
