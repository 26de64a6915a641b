//! Unit tests of the state tables.

use super::*;
use crate::nfs4::consts::{status, LENGTH_TO_EOF};
use crate::nfs4::Nfsstat4;
use std::os::fd::OwnedFd;

fn me() -> Principal {
    Principal::of(&crate::rpc::Cred {
        uid: 0,
        gid: 0,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    })
}

/// A confirmed client of `t` with one session of two slots: its id and
/// the session.
fn two_slot_session(t: &StateTable) -> ([u8; 16], Arc<Session>) {
    let r = t
        .exchange_id(b"c", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    let id: [u8; 16] = t
        .create_session(r.clientid, &me(), 1, attrs(2), attrs(1), |s| s.id.to_vec())
        .unwrap()
        .try_into()
        .unwrap();
    let s = t.session(&id).unwrap();
    (id, s)
}

fn table() -> StateTable {
    StateTable::new(Duration::from_secs(90), 7)
}

fn attrs(slots: u32) -> ChannelAttrs {
    ChannelAttrs {
        max_requests: slots,
        max_ops: 8,
        ..Default::default()
    }
}

fn devnull() -> Result<Arc<OwnedFd>, Nfsstat4> {
    Ok(Arc::new(std::fs::File::open("/dev/null").unwrap().into()))
}

#[test]
fn exchange_and_create_session_with_replay() {
    let t = table();
    let r = t
        .exchange_id(b"client-a", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert!(!r.confirmed);
    assert_eq!(
        t.create_session(r.clientid, &me(), 2, attrs(4), attrs(1), |_| vec![9]),
        Err(status::SEQ_MISORDERED)
    );
    let reply = t
        .create_session(r.clientid, &me(), 1, attrs(4), attrs(1), |s| s.id.to_vec())
        .unwrap();
    // Replay of the same sequence returns the same bytes.
    assert_eq!(
        t.create_session(r.clientid, &me(), 1, attrs(4), attrs(1), |_| vec![0])
            .unwrap(),
        reply
    );
    let again = t
        .exchange_id(b"client-a", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(again.clientid, r.clientid);
    assert!(again.confirmed);
    // Unknown client id.
    assert_eq!(
        t.create_session(12345, &me(), 1, attrs(4), attrs(1), |_| vec![]),
        Err(status::STALE_CLIENTID)
    );
}

#[test]
fn slots_detect_replays_and_misordering() {
    let t = table();
    let (id, s) = two_slot_session(&t);
    assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Execute)));
    assert_eq!(s.begin(0, 1).unwrap_err(), status::DELAY);
    s.finish(0, Some(Arc::new(vec![42])));
    match s.begin(0, 1) {
        Ok(SlotDecision::Replay(r)) => assert_eq!(*r, vec![42]),
        other => panic!("expected replay, got {other:?}"),
    }
    assert_eq!(s.begin(0, 3).unwrap_err(), status::SEQ_MISORDERED);
    assert_eq!(s.begin(2, 1).unwrap_err(), status::BADSLOT);
    assert!(matches!(s.begin(1, 1), Ok(SlotDecision::Execute)));
    s.finish(1, None);
    assert!(matches!(s.begin(1, 1), Ok(SlotDecision::Uncached)));
    t.destroy_session(&id).unwrap();
    assert_eq!(t.session(&id).unwrap_err(), status::BADSESSION);
}

#[test]
fn false_retries_do_not_get_another_requests_reply() {
    let t = table();
    let (_, s) = two_slot_session(&t);
    let user = |uid| crate::rpc::Cred {
        uid,
        gid: 100,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    };
    let getattr = request_fingerprint(&user(1000), 3, b"putfh+getattr");
    let write = request_fingerprint(&user(1000), 3, b"putfh+write");
    assert!(matches!(
        s.begin_request(0, 1, getattr, true),
        Ok(SlotDecision::Execute)
    ));
    s.finish(0, Some(Arc::new(vec![7])));
    // The same request again is a retransmission: the cached reply.
    assert!(matches!(
        s.begin_request(0, 1, getattr, true),
        Ok(SlotDecision::Replay(_))
    ));
    // Other operations, or the same ones from another user, with the
    // same sequence id are a false retry.
    assert_eq!(
        s.begin_request(0, 1, write, true).unwrap_err(),
        status::SEQ_FALSE_RETRY
    );
    let other_user = request_fingerprint(&user(0), 3, b"putfh+getattr");
    assert_eq!(
        s.begin_request(0, 1, other_user, true).unwrap_err(),
        status::SEQ_FALSE_RETRY
    );
    // Not asked to be cached (and not kept): another request from the
    // same user gets NFS4ERR_RETRY_UNCACHED_REP, so a client that reused
    // the sequence id can move on; from another user it is still a false
    // retry.
    assert!(matches!(
        s.begin_request(1, 1, getattr, false),
        Ok(SlotDecision::Execute)
    ));
    s.finish(1, None);
    assert!(matches!(
        s.begin_request(1, 1, write, false),
        Ok(SlotDecision::Uncached)
    ));
    assert_eq!(
        s.begin_request(1, 1, other_user, false).unwrap_err(),
        status::SEQ_FALSE_RETRY
    );
    assert!(matches!(
        s.begin_request(1, 1, getattr, true),
        Ok(SlotDecision::Uncached)
    ));
    // The next sequence id runs whatever it carries.
    assert!(matches!(
        s.begin_request(0, 2, write, true),
        Ok(SlotDecision::Execute)
    ));
}

#[test]
fn share_reservations_conflict() {
    let t = table();
    let (c1, _) = confirmed(&t, b"c1", 1);
    let req = |owner: &[u8], access, deny| OpenRequest {
        clientid: c1,
        owner: owner.to_vec(),
        file: (1, 2),
        fh: b"fh".to_vec(),
        access,
        deny,
        reclaim: false,
    };
    t.open(req(b"a", 1, 2), |_| devnull()).unwrap();
    assert_eq!(
        t.open(req(b"b", 2, 0), |_| devnull()).unwrap_err(),
        status::SHARE_DENIED
    );
    t.open(req(b"b", 1, 0), |_| devnull()).unwrap();
    // The same owner upgrades its open and bumps the seqid.
    let s = t.open(req(b"a", 1, 0), |_| devnull()).unwrap();
    assert_eq!(s.seqid, 2);
}

#[test]
fn locks_conflict_split_and_release() {
    let t = table();
    let (c1, _) = confirmed(&t, b"c1", 1);
    let (c2, _) = confirmed(&t, b"c2", 1);
    let file = (1, 1);
    let oa = t
        .open(
            OpenRequest {
                clientid: c1,
                owner: b"oa".to_vec(),
                file,
                fh: b"fh".to_vec(),
                access: 3,
                deny: 0,
                reclaim: false,
            },
            |_| devnull(),
        )
        .unwrap();
    let ob = t
        .open(
            OpenRequest {
                clientid: c2,
                owner: b"ob".to_vec(),
                file,
                fh: b"fh".to_vec(),
                access: 3,
                deny: 0,
                reclaim: false,
            },
            |_| devnull(),
        )
        .unwrap();
    let la = t
        .lock_new_owner(
            &oa,
            c1,
            b"la",
            file,
            lock_range(0, 100).unwrap(),
            true,
            false,
        )
        .unwrap()
        .unwrap();
    let denied = t
        .lock_new_owner(
            &ob,
            c2,
            b"lb",
            file,
            lock_range(50, 10).unwrap(),
            false,
            false,
        )
        .unwrap()
        .unwrap_err();
    assert_eq!((denied.offset, denied.length, denied.write), (0, 100, true));
    assert_eq!(denied.owner, b"la");
    // Unlock the middle; the split leaves [0,40) and [60,100).
    let la = t.unlock(&la, file, lock_range(40, 20).unwrap()).unwrap();
    let lb = t
        .lock_new_owner(
            &ob,
            c2,
            b"lb",
            file,
            lock_range(45, 10).unwrap(),
            false,
            false,
        )
        .unwrap()
        .unwrap();
    assert!(t
        .test_lock(c2, b"lb", file, lock_range(0, 1).unwrap(), false, None)
        .unwrap()
        .is_some());
    assert!(t
        .test_lock(c1, b"la", file, lock_range(0, 1).unwrap(), true, None)
        .unwrap()
        .is_none());
    assert_eq!(t.free(&lb), Err(status::LOCKS_HELD));
    t.unlock(&lb, file, lock_range(0, LENGTH_TO_EOF).unwrap())
        .unwrap();
    assert_eq!(t.free(&Stateid { seqid: 0, ..lb }), Ok(()));
    // Closing the open drops the lock state and its locks.
    t.close(&oa).unwrap();
    assert!(t
        .test_lock(
            c2,
            b"x",
            file,
            lock_range(0, LENGTH_TO_EOF).unwrap(),
            true,
            None
        )
        .unwrap()
        .is_none());
    assert_eq!(t.test(&la), status::BAD_STATEID);
}

#[test]
fn ranges_are_checked() {
    assert_eq!(lock_range(5, 0), Err(status::INVAL));
    assert_eq!(lock_range(u64::MAX - 1, 5), Err(status::INVAL));
    assert_eq!(lock_range(10, LENGTH_TO_EOF), Ok((10, u64::MAX)));
}

#[test]
fn stale_stateids_from_another_boot() {
    let t = table();
    let mut other = [0u8; 12];
    other[..4].copy_from_slice(&99u32.to_be_bytes());
    let s = Stateid { seqid: 1, other };
    assert_eq!(t.io_state(&s, (0, 0)).unwrap_err(), status::STALE_STATEID);
}

#[test]
fn silent_clients_expire() {
    let t = StateTable::new(Duration::from_secs(10), 1);
    let r = t
        .exchange_id(b"gone", [0; 8], &me(), ExchangeFlags(0))
        .unwrap();
    t.create_session(r.clientid, &me(), r.seq, attrs(4), attrs(1), |_| vec![])
        .unwrap();
    t.open(
        OpenRequest {
            clientid: r.clientid,
            owner: b"o".to_vec(),
            file: (1, 1),
            fh: b"fh".to_vec(),
            access: 1,
            deny: 0,
            reclaim: false,
        },
        |_| devnull(),
    )
    .unwrap();
    assert_eq!(t.client_count(), 1);
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(14)), 0);
    // Its lease ran out, but it holds an open: it becomes a courtesy
    // client and keeps it.
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(16)), 0);
    assert_eq!(t.usage().courtesy, 1);
    assert_eq!(t.usage().opens, 1);
    // Courtesy ends after a day.
    assert_eq!(
        t.expire_at(Instant::now() + Duration::from_secs(24 * 3600 + 20)),
        1
    );
    assert_eq!(t.client_count(), 0);
    assert_eq!(t.usage(), Usage::default());
    // Without state, a silent client goes after a lease and a half.
    let r = t
        .exchange_id(b"idle", [0; 8], &me(), ExchangeFlags(0))
        .unwrap();
    t.create_session(r.clientid, &me(), r.seq, attrs(4), attrs(1), |_| vec![])
        .unwrap();
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(16)), 1);
    assert_eq!(t.usage(), Usage::default());
}

#[test]
fn unconfirmed_records_expire_after_one_lease() {
    let t = StateTable::new(Duration::from_secs(10), 1);
    let u = t
        .exchange_id(b"unconfirmed", [0; 8], &me(), ExchangeFlags(0))
        .unwrap();
    let c = t
        .exchange_id(b"confirmed", [0; 8], &me(), ExchangeFlags(0))
        .unwrap();
    t.create_session(c.clientid, &me(), c.seq, attrs(4), attrs(1), |_| vec![])
        .unwrap();
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(9)), 0);
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(11)), 1);
    assert_eq!(
        t.create_session(u.clientid, &me(), u.seq, attrs(4), attrs(1), |_| vec![]),
        Err(status::STALE_CLIENTID)
    );
    assert_eq!(t.client_count(), 1);
}

fn small_limits() -> Limits {
    Limits {
        clients: 3,
        sessions_per_client: 2,
        slots: 8,
        reply_cache: 64 * MIN_SLOT_BYTES,
        ..Default::default()
    }
}

/// A confirmed client with one session; returns its id and the
/// sequence id for its next CREATE_SESSION.
fn confirmed(t: &StateTable, owner: &[u8], slots: u32) -> (u64, u32) {
    let r = t
        .exchange_id(owner, [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    t.create_session(r.clientid, &me(), r.seq, attrs(slots), attrs(1), |_| vec![])
        .unwrap();
    (r.clientid, r.seq + 1)
}

fn session_id(reply: Vec<u8>) -> [u8; SESSIONID_SIZE] {
    reply.try_into().unwrap()
}

#[test]
fn sessions_per_client_are_capped_with_nospc() {
    let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
    let (id, seq) = confirmed(&t, b"a", 1);
    let second = t
        .create_session(id, &me(), seq, attrs(1), attrs(1), |s| s.id.to_vec())
        .unwrap();
    // A third is refused; the sequence slot moves on and a replay gets
    // the same error.
    assert_eq!(
        t.create_session(id, &me(), seq + 1, attrs(1), attrs(1), |_| vec![]),
        Err(status::NOSPC)
    );
    assert_eq!(
        t.create_session(id, &me(), seq + 1, attrs(1), attrs(1), |_| vec![]),
        Err(status::NOSPC)
    );
    assert_eq!(t.usage().sessions, 2);
    // Another client is not affected.
    confirmed(&t, b"b", 1);
    // Destroying one makes room again.
    t.destroy_session(&session_id(second)).unwrap();
    t.create_session(id, &me(), seq + 2, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    assert_eq!(t.usage().sessions, 3);
}

#[test]
fn slots_are_capped_and_shrink_to_the_reply_cache_budget() {
    let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
    let big = |slots, cached| ChannelAttrs {
        max_requests: slots,
        max_response_cached: cached,
        max_ops: 8,
        ..Default::default()
    };
    // 1000 slots asked, the limit (8) granted; each reserves 4 KiB.
    let r = t
        .exchange_id(b"a", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    let sid = session_id(
        t.create_session(r.clientid, &me(), r.seq, big(1000, 0), attrs(1), |s| {
            s.id.to_vec()
        })
        .unwrap(),
    );
    let s = t.session(&sid).unwrap();
    assert_eq!(s.fore.max_requests, 8);
    assert_eq!(s.begin(8, 1).unwrap_err(), status::BADSLOT);
    assert!(matches!(s.begin(7, 1), Ok(SlotDecision::Execute)));
    assert_eq!(t.usage().reply_cache, 8 * MIN_SLOT_BYTES);
    // 8 slots of 24 KiB (48 pages) fit in the 56 pages left.
    let r = t
        .exchange_id(b"b", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    t.create_session(
        r.clientid,
        &me(),
        r.seq,
        big(8, 6 * 4096),
        attrs(1),
        |_| vec![],
    )
    .unwrap();
    assert_eq!(t.usage().reply_cache, 56 * MIN_SLOT_BYTES);
    // 8 pages left: one slot of 32 KiB does not fit ...
    let r = t
        .exchange_id(b"c", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(
        t.create_session(
            r.clientid,
            &me(),
            r.seq,
            big(8, 9 * 4096),
            attrs(1),
            |_| vec![]
        ),
        Err(status::NOSPC)
    );
    // ... but the next try with 4 KiB replies gets the 8 slots left,
    // shrunk from the 64 asked for.
    let sid = session_id(
        t.create_session(r.clientid, &me(), r.seq + 1, big(64, 1024), attrs(1), |s| {
            s.id.to_vec()
        })
        .unwrap(),
    );
    assert_eq!(t.session(&sid).unwrap().fore.max_requests, 8);
    assert_eq!(t.usage().reply_cache, 64 * MIN_SLOT_BYTES);
    // Replies longer than the slot's share are not kept.
    let s = t.session(&sid).unwrap();
    assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Execute)));
    s.finish(0, Some(Arc::new(vec![0; MIN_SLOT_BYTES + 1])));
    assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Uncached)));
    // Expiry gives the budget back.
    assert_eq!(t.expire_at(Instant::now() + Duration::from_secs(200)), 3);
    assert_eq!(t.usage(), Usage::default());
}

#[test]
fn full_client_table_drops_unconfirmed_records_then_delays() {
    let t = StateTable::with_limits(Duration::from_secs(90), 1, small_limits());
    let (a, _) = confirmed(&t, b"a", 1);
    let u1 = t
        .exchange_id(b"u1", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    let u2 = t
        .exchange_id(b"u2", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(t.client_count(), 3);
    // A fourth owner pushes out the oldest unconfirmed record (u1).
    let u3 = t
        .exchange_id(b"u3", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(t.client_count(), 3);
    assert_eq!(
        t.create_session(u1.clientid, &me(), u1.seq, attrs(1), attrs(1), |_| vec![]),
        Err(status::STALE_CLIENTID)
    );
    t.create_session(u2.clientid, &me(), u2.seq, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    t.create_session(u3.clientid, &me(), u3.seq, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    // All three confirmed: a new owner waits, known owners carry on.
    assert_eq!(
        t.exchange_id(b"new", [1; 8], &me(), ExchangeFlags(0))
            .unwrap_err(),
        status::DELAY
    );
    assert_eq!(
        t.exchange_id(b"a", [1; 8], &me(), ExchangeFlags(0))
            .unwrap()
            .clientid,
        a
    );
    // A restarted client (new verifier) gets in beside its old record,
    // then takes its place.
    let restarted = t
        .exchange_id(b"a", [2; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_ne!(restarted.clientid, a);
    assert_eq!(t.client_count(), 4);
    let again = t
        .exchange_id(b"a", [3; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(t.client_count(), 4);
    t.create_session(
        again.clientid,
        &me(),
        again.seq,
        attrs(1),
        attrs(1),
        |_| vec![],
    )
    .unwrap();
    assert_eq!(t.client_count(), 3);
    assert_eq!(
        t.create_session(restarted.clientid, &me(), 1, attrs(1), attrs(1), |_| vec![]),
        Err(status::STALE_CLIENTID)
    );
    // A destroyed client makes room.
    let r = t
        .exchange_id(b"u2", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(r.clientid, u2.clientid);
    let sid = t
        .lock()
        .clients
        .get(&u2.clientid)
        .map(|c| c.sessions[0])
        .unwrap();
    t.destroy_session(&sid).unwrap();
    t.destroy_client(u2.clientid).unwrap();
    assert!(t
        .exchange_id(b"new", [1; 8], &me(), ExchangeFlags(0))
        .is_ok());
}

fn as_uid(uid: u32) -> Principal {
    Principal::of(&crate::rpc::Cred {
        uid,
        gid: uid,
        gids: vec![],
        flavor: crate::rpc::AUTH_SYS,
    })
}

/// SEQUENCE from `clientid`: renews its lease.
fn renew(t: &StateTable, clientid: u64) {
    let sid = t
        .lock()
        .clients
        .get(&clientid)
        .map(|c| c.sessions[0])
        .unwrap();
    t.session(&sid).unwrap();
}

const UPDATE: ExchangeFlags = ExchangeFlags(ExchangeFlags::UPD_CONFIRMED_REC_A);

fn open_req(clientid: u64, owner: &[u8], file: FileKey, access: u32, deny: u32) -> OpenRequest {
    OpenRequest {
        clientid,
        owner: owner.to_vec(),
        file,
        fh: b"fh".to_vec(),
        access,
        deny,
        reclaim: false,
    }
}

/// RFC 8881 section 18.35.5, one block per case of the table.
#[test]
fn exchange_id_case_table() {
    let t = table();
    let none = ExchangeFlags(0);
    // Flags a client may not set (section 18.35.3).
    assert_eq!(
        t.exchange_id(b"x", [1; 8], &me(), ExchangeFlags(0x800))
            .unwrap_err(),
        status::INVAL
    );
    assert_eq!(
        t.exchange_id(
            b"x",
            [1; 8],
            &me(),
            ExchangeFlags(ExchangeFlags::CONFIRMED_R)
        )
        .unwrap_err(),
        status::INVAL
    );
    // Case 7: update without a confirmed record (none at all, then only
    // an unconfirmed one).
    assert_eq!(
        t.exchange_id(b"a", [1; 8], &me(), UPDATE).unwrap_err(),
        status::NOENT
    );
    // Case 1: a new owner.
    let a = t.exchange_id(b"a", [1; 8], &me(), none).unwrap();
    assert!(!a.confirmed);
    assert_eq!(a.seq, 1);
    assert_eq!(
        t.exchange_id(b"a", [1; 8], &me(), UPDATE).unwrap_err(),
        status::NOENT
    );
    // Case 4: an unconfirmed record is replaced.
    let a2 = t.exchange_id(b"a", [1; 8], &me(), none).unwrap();
    assert_ne!(a2.clientid, a.clientid);
    assert_eq!(
        t.create_session(a.clientid, &me(), 1, attrs(1), attrs(1), |_| vec![]),
        Err(status::STALE_CLIENTID)
    );
    t.create_session(a2.clientid, &me(), 1, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    // Case 2: the same client again.
    let again = t.exchange_id(b"a", [1; 8], &me(), none).unwrap();
    assert_eq!(again.clientid, a2.clientid);
    assert!(again.confirmed);
    assert_eq!(again.seq, 2);
    // Case 6: update of the confirmed record.
    let upd = t.exchange_id(b"a", [1; 8], &me(), UPDATE).unwrap();
    assert_eq!((upd.clientid, upd.confirmed), (a2.clientid, true));
    // Case 8: update with another verifier; case 9: another principal.
    assert_eq!(
        t.exchange_id(b"a", [2; 8], &me(), UPDATE).unwrap_err(),
        status::NOT_SAME
    );
    assert_eq!(
        t.exchange_id(b"a", [1; 8], &as_uid(1000), UPDATE)
            .unwrap_err(),
        status::PERM
    );
    // Case 3: another principal while the record holds state.
    t.open(open_req(a2.clientid, b"o", (1, 1), 1, 0), |_| devnull())
        .unwrap();
    assert_eq!(
        t.exchange_id(b"a", [1; 8], &as_uid(1000), none)
            .unwrap_err(),
        status::CLID_INUSE
    );
    // Case 5: the client restarted (new verifier): a new record, and the
    // old state stays until the new record is confirmed.
    let r = t.exchange_id(b"a", [9; 8], &me(), none).unwrap();
    assert_ne!(r.clientid, a2.clientid);
    assert!(!r.confirmed);
    assert_eq!(t.usage().opens, 1);
    t.create_session(r.clientid, &me(), 1, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    assert_eq!(t.usage().opens, 0);
    assert_eq!(t.client_count(), 1);
    // Case 3 without state: a new record for the other principal, which
    // replaces the old one once confirmed.
    let b = t.exchange_id(b"a", [9; 8], &as_uid(1000), none).unwrap();
    assert_ne!(b.clientid, r.clientid);
    t.create_session(b.clientid, &as_uid(1000), 1, attrs(1), attrs(1), |_| vec![])
        .unwrap();
    assert_eq!(t.client_count(), 1);
}

#[test]
fn create_session_from_another_principal_is_clid_inuse() {
    let t = table();
    let r = t
        .exchange_id(b"a", [1; 8], &me(), ExchangeFlags(0))
        .unwrap();
    assert_eq!(
        t.create_session(r.clientid, &as_uid(7), 1, attrs(1), attrs(1), |_| vec![]),
        Err(status::CLID_INUSE)
    );
    t.create_session(r.clientid, &me(), 1, attrs(1), attrs(1), |_| vec![])
        .unwrap();
}

#[test]
fn courtesy_clients_keep_state_until_someone_conflicts() {
    let t = StateTable::new(Duration::from_secs(10), 1);
    let (a, _) = confirmed(&t, b"a", 1);
    let (b, _) = confirmed(&t, b"b", 1);
    let file = (1, 1);
    let oa = t
        .open(open_req(a, b"oa", file, 3, 2), |_| devnull())
        .unwrap();
    let ob = t
        .open(open_req(b, b"ob", file, 1, 0), |_| devnull())
        .unwrap();
    t.lock_new_owner(&oa, a, b"la", file, lock_range(0, 10).unwrap(), true, false)
        .unwrap()
        .unwrap();
    // While a's lease runs, b is refused.
    assert!(t
        .lock_new_owner(&ob, b, b"lb", file, lock_range(0, 1).unwrap(), true, false)
        .unwrap()
        .is_err());
    // a falls silent: with state, it becomes a courtesy client.
    let later = Instant::now() + Duration::from_secs(16);
    assert_eq!(t.expire_at(later), 0);
    assert_eq!(t.usage().courtesy, 2);
    renew(&t, b);
    assert_eq!(t.usage().courtesy, 1);
    assert_eq!(t.test(&oa), status::OK);
    // b's conflicting LOCK expires a and succeeds at once.
    let lb = t
        .lock_new_owner(&ob, b, b"lb", file, lock_range(0, 1).unwrap(), true, false)
        .unwrap()
        .unwrap();
    assert_eq!(t.test(&lb), status::OK);
    assert_eq!(t.test(&oa), status::BAD_STATEID);
    assert_eq!(t.usage().courtesy, 0);
    assert_eq!(t.client_count(), 1);
    assert_eq!(
        t.counters
            .expired
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn courtesy_client_that_returns_is_active_again_and_deny_conflicts_expire_it() {
    let t = StateTable::new(Duration::from_secs(10), 1);
    let (a, _) = confirmed(&t, b"a", 1);
    let (b, _) = confirmed(&t, b"b", 1);
    let file = (2, 2);
    // a denies writers; b holds another file.
    t.open(open_req(a, b"oa", file, 1, 2), |_| devnull())
        .unwrap();
    t.open(open_req(b, b"ob", (3, 3), 1, 0), |_| devnull())
        .unwrap();
    assert_eq!(
        t.open(open_req(b, b"ob", file, 2, 0), |_| devnull())
            .unwrap_err(),
        status::SHARE_DENIED
    );
    t.expire_at(Instant::now() + Duration::from_secs(16));
    assert_eq!(t.usage().courtesy, 2);
    // a and b come back (SEQUENCE): active again, b still refused.
    renew(&t, a);
    renew(&t, b);
    assert_eq!(t.usage().courtesy, 0);
    let sid = t.lock().clients.get(&a).map(|c| c.sessions[0]).unwrap();
    assert_eq!(
        t.open(open_req(b, b"ob", file, 2, 0), |_| devnull())
            .unwrap_err(),
        status::SHARE_DENIED
    );
    // Silent again; now b's OPEN for writing expires a and succeeds.
    t.expire_at(Instant::now() + Duration::from_secs(16));
    renew(&t, b);
    t.open(open_req(b, b"ob", file, 2, 0), |_| devnull())
        .unwrap();
    assert_eq!(t.session(&sid).unwrap_err(), status::BADSESSION);
}

/// A table that starts on `store`, as a server start does.
fn started(store: &Arc<recovery::SqliteRecovery>, grace: Duration) -> StateTable {
    let settings = Settings {
        grace,
        ..Settings::new(Duration::from_secs(60))
    };
    StateTable::start(settings, 3, store.clone()).unwrap()
}

/// A record store from an earlier start in which client "a" is on record
/// (it sent RECLAIM_COMPLETE), so the next start waits for it in grace.
fn store_knowing_a() -> Arc<recovery::SqliteRecovery> {
    let store = Arc::new(recovery::SqliteRecovery::in_memory());
    let t = started(&store, Duration::from_secs(60));
    let (a, _) = confirmed(&t, b"a", 1);
    t.reclaim_complete(a, false).unwrap();
    store
}

fn reclaim_req(clientid: u64, file: FileKey) -> OpenRequest {
    OpenRequest {
        reclaim: true,
        ..open_req(clientid, b"o", file, 3, 0)
    }
}

#[test]
fn grace_lets_known_clients_reclaim_first() {
    let store = Arc::new(recovery::SqliteRecovery::in_memory());
    let t = started(&store, Duration::from_secs(60));
    assert!(
        !t.grace_status().active,
        "nobody to wait for on a first start"
    );
    let (a, _) = confirmed(&t, b"a", 1);
    t.reclaim_complete(a, false).unwrap();
    assert_eq!(t.reclaim_complete(a, false), Err(status::COMPLETE_ALREADY));
    // Outside grace, reclaims get NO_GRACE.
    assert_eq!(
        t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap_err(),
        status::NO_GRACE
    );
    let oa = t
        .open(open_req(a, b"o", (1, 1), 3, 0), |_| devnull())
        .unwrap();
    t.lock_new_owner(&oa, a, b"l", (1, 1), lock_range(0, 5).unwrap(), true, false)
        .unwrap()
        .unwrap();
    drop(t);

    // Restart: a may reclaim, b (new) must wait.
    let t = started(&store, Duration::from_secs(60));
    assert_eq!(
        t.grace_status(),
        GraceStatus {
            active: true,
            waiting: 1
        }
    );
    let (b, _) = confirmed(&t, b"b", 1);
    assert_eq!(
        t.open(open_req(b, b"o", (1, 1), 3, 0), |_| devnull())
            .unwrap_err(),
        status::GRACE
    );
    assert_eq!(
        t.open(reclaim_req(b, (1, 1)), |_| devnull()).unwrap_err(),
        status::RECLAIM_BAD
    );
    assert_eq!(t.check_not_in_grace(), Err(status::GRACE));
    let (a, _) = confirmed(&t, b"a", 1);
    let oa = t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap();
    let la = t
        .lock_new_owner(&oa, a, b"l", (1, 1), lock_range(0, 5).unwrap(), true, true)
        .unwrap()
        .unwrap();
    // A new lock (not a reclaim) waits for grace to end.
    assert_eq!(
        t.lock_existing(&la, (1, 1), lock_range(10, 5).unwrap(), true, false),
        Err(status::GRACE)
    );
    t.reclaim_complete(a, false).unwrap();
    // Every known client reclaimed: grace is over at once.
    assert!(!t.grace_status().active);
    assert_eq!(
        t.counters
            .reclaims
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(
        t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap_err(),
        status::NO_GRACE
    );
    let ob = t
        .open(open_req(b, b"o", (1, 1), 1, 0), |_| devnull())
        .unwrap();
    assert!(t
        .lock_new_owner(&ob, b, b"l", (1, 1), lock_range(0, 1).unwrap(), true, false)
        .unwrap()
        .is_err());
}

/// Grace whose time is up still holds until the expiry round has
/// recorded its end in the store: a newcomer granted state before that,
/// and a restart right after, would let a client that missed this grace
/// reclaim in the next (RFC 8881 section 8.4.3, edge condition 2).
#[test]
fn grace_ends_when_the_store_has_its_end_not_when_the_clock_says() {
    let store = store_knowing_a();
    let grace = Duration::from_millis(20);
    let t = started(&store, grace);
    assert!(t.grace_status().active);
    // The time passes (what is measured here is that time alone changes
    // nothing), and nothing has ended grace yet.
    std::thread::sleep(grace * 2);
    assert_eq!(
        t.check_not_in_grace(),
        Err(status::GRACE),
        "grace over by the clock alone"
    );
    assert!(t.grace_status().active);
    let (b, _) = confirmed(&t, b"b", 2);
    assert_eq!(
        t.open(open_req(b, b"o", (1, 1), 3, 0), |_| devnull())
            .unwrap_err(),
        status::GRACE
    );
    // A restart now: a is still known and may reclaim.
    drop(t);
    let t = started(&store, grace);
    assert_eq!(
        t.grace_status().waiting,
        1,
        "a missed grace before its end was recorded"
    );
    // The expiry round after the grace time records the end; only then
    // does grace end.
    t.expire_at(Instant::now() + grace * 2);
    assert!(!t.grace_status().active);
    assert_eq!(t.check_not_in_grace(), Ok(()));
    drop(t);
    let t = started(&store, Duration::from_secs(60));
    let (a, _) = confirmed(&t, b"a", 1);
    assert_eq!(
        t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap_err(),
        status::NO_GRACE
    );
}

#[test]
fn a_client_that_misses_grace_may_not_reclaim_later() {
    let store = store_knowing_a();
    // Restart with a short grace that runs out without a.
    let t = started(&store, Duration::from_millis(1));
    // The server's expiry round after the grace time records its end.
    t.expire_at(Instant::now() + Duration::from_millis(5));
    assert!(!t.grace_status().active);
    drop(t);
    // Next restart: nobody to wait for, and a may not reclaim.
    let t = started(&store, Duration::from_secs(60));
    assert!(!t.grace_status().active);
    let (a, _) = confirmed(&t, b"a", 1);
    assert_eq!(
        t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap_err(),
        status::NO_GRACE
    );
}

#[test]
fn an_expired_client_may_not_reclaim_after_a_restart() {
    let store = Arc::new(recovery::SqliteRecovery::in_memory());
    let t = started(&store, Duration::from_secs(60));
    let (a, _) = confirmed(&t, b"a", 1);
    let (b, _) = confirmed(&t, b"b", 1);
    t.reclaim_complete(a, false).unwrap();
    t.reclaim_complete(b, false).unwrap();
    let oa = t
        .open(open_req(a, b"o", (1, 1), 3, 0), |_| devnull())
        .unwrap();
    t.lock_new_owner(&oa, a, b"l", (1, 1), lock_range(0, 5).unwrap(), true, false)
        .unwrap()
        .unwrap();
    t.open(open_req(b, b"o", (2, 2), 1, 0), |_| devnull())
        .unwrap();
    // a is cut off; its lease runs out and b takes the lock (section
    // 8.4.3, first edge condition).
    t.expire_at(Instant::now() + Duration::from_secs(100));
    renew(&t, b);
    let ob = t
        .open(open_req(b, b"o", (1, 1), 3, 0), |_| devnull())
        .unwrap();
    t.lock_new_owner(&ob, b, b"l", (1, 1), lock_range(0, 5).unwrap(), true, false)
        .unwrap()
        .unwrap();
    drop(t);
    let t = started(&store, Duration::from_secs(60));
    assert_eq!(t.grace_status().waiting, 1, "only b is known");
    let (a, _) = confirmed(&t, b"a", 1);
    assert_eq!(
        t.open(reclaim_req(a, (1, 1)), |_| devnull()).unwrap_err(),
        status::RECLAIM_BAD
    );
}

#[test]
fn a_panicking_request_gives_its_slot_back() {
    let t = table();
    let (_, s) = two_slot_session(&t);
    assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Execute)));
    let guard = SlotGuard::new(s.clone(), 0);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _slot = guard;
        panic!("an op failed");
    }));
    assert!(panicked.is_err());
    // The retry is told the reply is gone, and the slot moves on.
    assert!(matches!(s.begin(0, 1), Ok(SlotDecision::Uncached)));
    assert!(matches!(s.begin(0, 2), Ok(SlotDecision::Execute)));
}

#[test]
fn indexes_follow_close_free_and_client_removal() {
    let t = table();
    let (a, _) = confirmed(&t, b"a", 1);
    for i in 0..10 {
        let o = t
            .open(open_req(a, b"o", (9, i), 3, 0), |_| devnull())
            .unwrap();
        t.lock_new_owner(&o, a, b"l", (9, i), lock_range(0, 5).unwrap(), true, false)
            .unwrap()
            .unwrap();
    }
    let u = t.usage();
    assert_eq!((u.opens, u.lock_owners, u.locks), (10, 10, 10));
    let o = t
        .open(open_req(a, b"o", (9, 0), 1, 0), |_| devnull())
        .unwrap();
    t.close(&o).unwrap();
    let u = t.usage();
    assert_eq!((u.opens, u.lock_owners, u.locks), (9, 9, 9));
    t.expire_at(Instant::now() + Duration::from_secs(24 * 3600 + 1000));
    t.expire_at(Instant::now() + Duration::from_secs(2 * 24 * 3600 + 1000));
    assert_eq!(t.usage(), Usage::default());
}

/// A cluster's record store as a node's state table sees it: the epoch it
/// joined with, and what the table told it.
#[derive(Debug, Default)]
struct FakeCluster {
    start: std::sync::Mutex<Option<recovery::EpochStart>>,
    calls: std::sync::Mutex<Vec<String>>,
}

impl recovery::Recovery for FakeCluster {
    fn start_epoch(&self) -> recovery::Result<recovery::EpochStart> {
        Ok(self.start.lock().unwrap().take().unwrap())
    }
    fn add(&self, owner: &[u8]) -> recovery::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("add {}", String::from_utf8_lossy(owner)));
        Ok(())
    }
    fn remove(&self, owner: &[u8]) -> recovery::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("remove {}", String::from_utf8_lossy(owner)));
        Ok(())
    }
    fn end_grace(&self) -> recovery::Result<()> {
        self.calls.lock().unwrap().push("end_grace".into());
        Ok(())
    }
    fn reclaimed(&self, owner: &[u8]) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("reclaimed {}", String::from_utf8_lossy(owner)));
    }
}

/// A node that joined with `recovery` (0: no grace), every node's
/// `reclaimable` clients and its own `mine`.
fn cluster_node(
    recovery: u64,
    reclaimable: &[&[u8]],
    mine: &[&[u8]],
) -> (StateTable, Arc<FakeCluster>, recovery::ClusterGrace) {
    let grace = recovery::ClusterGrace {
        mine: mine.iter().map(|o| o.to_vec()).collect(),
        ..Default::default()
    };
    let store = Arc::new(FakeCluster::default());
    *store.start.lock().unwrap() = Some(recovery::EpochStart {
        current: recovery + 1,
        recovery,
        reclaimable: reclaimable.iter().map(|o| o.to_vec()).collect(),
        cluster: Some(grace.clone()),
    });
    let settings = Settings {
        grace: Duration::from_secs(60),
        ..Settings::new(Duration::from_secs(60))
    };
    let t = StateTable::start(settings, 5, store.clone()).unwrap();
    (t, store, grace)
}

#[test]
fn cluster_grace_rows() {
    use std::sync::atomic::Ordering;
    // A node restarts: every node's clients may reclaim here, but not
    // before every node enforces grace (ready).
    let (t, store, g) = cluster_node(4, &[b"mine", b"theirs"], &[b"mine"]);
    assert!(t.grace_status().active);
    let (m, _) = confirmed(&t, b"mine", 1);
    let (o, _) = confirmed(&t, b"theirs", 1);
    let (n, _) = confirmed(&t, b"new", 1);
    assert_eq!(
        t.open(reclaim_req(m, (1, 1)), |_| devnull()).unwrap_err(),
        status::DELAY,
        "a reclaim before every node enforces grace"
    );
    g.ready.store(true, Ordering::Release);
    t.open(reclaim_req(m, (1, 1)), |_| devnull()).unwrap();
    t.open(reclaim_req(o, (1, 2)), |_| devnull()).unwrap();
    assert_eq!(
        t.open(reclaim_req(n, (1, 3)), |_| devnull()).unwrap_err(),
        status::RECLAIM_BAD
    );
    assert_eq!(
        t.open(open_req(n, b"o", (1, 3), 3, 0), |_| devnull())
            .unwrap_err(),
        status::GRACE
    );
    // Another node's client finishing does not end this node's part ...
    t.reclaim_complete(o, false).unwrap();
    assert!(!store
        .calls
        .lock()
        .unwrap()
        .contains(&"end_grace".to_string()));
    // ... its own last client does, but grace goes on until the cluster's
    // ends.
    t.reclaim_complete(m, false).unwrap();
    // Nothing left to time on this node (the expiry round does not spin).
    assert_eq!(t.expiry_interval(), Duration::from_secs(15));
    let calls = store.calls.lock().unwrap().clone();
    assert!(calls.contains(&"end_grace".to_string()), "{calls:?}");
    assert!(calls.contains(&"reclaimed theirs".to_string()), "{calls:?}");
    assert!(calls.contains(&"reclaimed mine".to_string()), "{calls:?}");
    assert!(t.grace_status().active);
    assert_eq!(
        t.open(open_req(n, b"o", (1, 3), 3, 0), |_| devnull())
            .unwrap_err(),
        status::GRACE
    );
    t.cluster_grace_end();
    assert!(!t.grace_status().active);
    t.open(open_req(n, b"o", (1, 3), 3, 0), |_| devnull())
        .unwrap();
    assert_eq!(
        t.open(reclaim_req(o, (1, 4)), |_| devnull()).unwrap_err(),
        status::NO_GRACE
    );

    // Another node died: grace begins here too; what this node's clients
    // hold stays; the dead node's clients may reclaim.
    t.cluster_grace_begin(&[b"moved".to_vec()]);
    assert!(t.grace_status().active);
    assert_eq!(
        t.open(open_req(n, b"o2", (1, 5), 3, 0), |_| devnull())
            .unwrap_err(),
        status::GRACE
    );
    let (mv, _) = confirmed(&t, b"moved", 1);
    t.open(reclaim_req(mv, (1, 6)), |_| devnull()).unwrap();
    // Out of touch with etcd: no new state, no reclaims.
    g.isolated.store(true, Ordering::Release);
    t.cluster_grace_end();
    assert_eq!(
        t.open(open_req(n, b"o2", (1, 5), 3, 0), |_| devnull())
            .unwrap_err(),
        status::DELAY
    );
    g.isolated.store(false, Ordering::Release);
    t.open(open_req(n, b"o2", (1, 5), 3, 0), |_| devnull())
        .unwrap();
}

#[test]
fn cluster_node_without_grace_and_with_no_own_clients() {
    // First node of a cluster: no grace at all.
    let (t, store, _) = cluster_node(0, &[], &[]);
    assert!(!t.grace_status().active);
    let (n, _) = confirmed(&t, b"n", 1);
    t.open(open_req(n, b"o", (1, 1), 3, 0), |_| devnull())
        .unwrap();
    assert_eq!(store.calls.lock().unwrap().as_slice(), ["add n"]);
    // A node whose own clients are none: its part is over at once, the
    // cluster's grace is not.
    let (t, store, _) = cluster_node(3, &[b"elsewhere"], &[]);
    assert!(t.grace_status().active);
    assert_eq!(store.calls.lock().unwrap().as_slice(), ["end_grace"]);
}
