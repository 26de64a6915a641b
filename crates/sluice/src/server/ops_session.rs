//! Client and session ops: EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION,
//! BIND_CONN_TO_SESSION, DESTROY_CLIENTID, RECLAIM_COMPLETE.

use super::attrs::MAX_IO;
use super::callback::{self, BackChannel, CbConn};
use super::context::{Ctx, OpStatus};
use super::state::Session;
use super::state::{ChannelAttrs, ExchangeFlags, Principal};
use crate::nfs4::consts::status;
use crate::nfs4::msg::{
    cdfc, BackchannelCtlArgs, BindConnToSessionArgs, BindConnToSessionResOk, CallbackSec,
    CreateSessionArgs, CreateSessionResOk, ExchangeIdArgs, ExchangeIdResOk, ImplId, SessionId,
    StateProtectArgs, Xdr,
};
use crate::xdr::{Decoder, Encoder};
use std::sync::Arc;

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
    // As the Linux server: callbacks need a flavor the server can call
    // with (AUTH_SYS or AUTH_NONE).
    if !callback::usable_sec(&args.cb_sec) {
        return status::ENCR_ALG_UNSUPP;
    }
    // The back channel goes over this connection when the client asks
    // and the call came over one that can carry it.
    let bind_back = flags & CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0 && cx.conn.is_some();
    let out_flags = if bind_back {
        CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    } else {
        0
    };
    let principal = Principal::of(cx.cred);
    let mut made = None;
    let r = cx
        .srv
        .state
        .create_session(clientid, &principal, seq, fore, back, |s| {
            made = Some(s.id);
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
            if let Some(session) = made.and_then(|id| cx.srv.state.session(&id).ok()) {
                let conn = cx.conn.filter(|_| bind_back);
                set_back_channel(cx, &session, conn, args.cb_program, &args.cb_sec, bind_back);
            }
            e.raw(&body);
            status::OK
        }
        Err(st) => st,
    }
}

/// Gives `session` a back channel over `conn` (none: not bound yet) for
/// the client's `program` and security `sec`; `wanted`: the client asked
/// for one, so SEQUENCE reports when it does not work. A bound channel is
/// probed with CB_NULL once the reply to this request is sent.
fn set_back_channel(
    cx: &Ctx<'_>,
    session: &Arc<Session>,
    conn: Option<&Arc<CbConn>>,
    program: u32,
    sec: &[CallbackSec],
    wanted: bool,
) {
    let mut b = match conn {
        Some(c) => BackChannel::new(c, cx.minor, program, sec),
        None => BackChannel::unbound(cx.minor, program, sec),
    };
    b.wanted = wanted;
    *session.back_channel() = Some(b);
    if let Some(c) = conn {
        probe_after_reply(cx, c, session);
    }
}

/// Probes the session's back channel once this request's reply is out.
fn probe_after_reply(cx: &Ctx<'_>, conn: &Arc<CbConn>, session: &Arc<Session>) {
    let session = session.clone();
    let metrics = cx.srv.metrics.clone();
    conn.after_reply(move || {
        let started = std::time::Instant::now();
        let ok = callback::probe(&session).is_ok();
        metrics.callback(ok, started.elapsed());
    });
}

/// BACKCHANNEL_CTL (RFC 8881 section 18.33): a new callback program and
/// security for the session's back channel.
pub(super) fn backchannel_ctl(cx: &mut Ctx<'_>, d: &mut Decoder<'_>, _e: &mut Encoder) -> OpStatus {
    let args = xdr!(BackchannelCtlArgs::decode(d));
    if !callback::usable_sec(&args.sec_parms) {
        return status::ENCR_ALG_UNSUPP;
    }
    let Some(session) = cx.session else {
        return status::OP_NOT_IN_SESSION;
    };
    let mut b = session.back_channel();
    match b.as_mut() {
        Some(b) => {
            b.program = args.cb_program;
            b.cred = callback::cred_of(&args.sec_parms);
        }
        None => {
            *b = Some(BackChannel::unbound(
                cx.minor,
                args.cb_program,
                &args.sec_parms,
            ))
        }
    }
    status::OK
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
    let session = match cx.srv.state.session(&args.sessionid) {
        Ok(s) => s,
        Err(st) => return st,
    };
    let dir = match args.dir {
        cdfc::FORE => cdfc::FORE,
        cdfc::BACK => cdfc::BACK,
        cdfc::FORE_OR_BOTH | cdfc::BACK_OR_BOTH => cdfc::FORE_OR_BOTH,
        _ => return status::INVAL,
    };
    // A connection bound for callbacks becomes the session's back channel.
    let conn = cx.conn.filter(|_| dir & cdfc::BACK != 0);
    if let Some(c) = conn {
        {
            let mut b = session.back_channel();
            match b.as_mut() {
                Some(b) => b.bind(c),
                None => *b = Some(BackChannel::new(c, cx.minor, 0, &[])),
            }
        }
        probe_after_reply(cx, c, &session);
    }
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
