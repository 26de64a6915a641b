"""Client records, sessions and state rules of RFC 8881, over raw RPC.

Each test starts its own `sluice serve` (fixture `srv`: lease of LEASE
seconds, no grace period, world-writable export so that squashed root can
create files) and drives it with `rpcclient.Client`: one client per TCP
connection, with its own client owner, verifier and AUTH_SYS principal
(another uid acts as another principal).

Covered:

* EXCHANGE_ID, section 18.35.5: one test per case of the table (1 new
  owner, 2 non-update on a confirmed record, 3 client collision with and
  without state, 4 replacement of an unconfirmed record, 5 client restart,
  6 update, 7 update without a confirmed record, 8 update with another
  verifier, 9 update from another principal), flags the client must not
  send (section 18.35.3), and an unconfirmed record that outlives a lease.
* CREATE_SESSION, section 18.36: channel sizes too small, undefined
  flags, another principal, sequence ids (misordered, replay).
* SEQUENCE and the reply cache, sections 2.10.6.1.3 and 18.46: a reply too
  big to cache, and a slot reused with the same sequence id for another
  request (what nfs-rs 0.8.7 sends), cached or not, by the same or another
  user.
* Courteous leases: an expired client keeps its state until someone
  conflicts with it (sections 8.3 and 8.4.1; the Linux server since 6.2).
* The current stateid (section 16.2.3.1.2), FREE_STATEID with locks held
  (section 18.38), CLOSE of a file whose last name was renamed over, and
  root squashing by default.

Waiting out a lease is the behaviour under test where it happens; nothing
else sleeps for synchronisation.

The tests only use `srv.port` and `srv.lease` (and `srv.export` for the
root squash checks), so the same functions can be pointed at another
server (the Linux kernel's, for comparison) by calling them with an object
that has those attributes.
"""

from __future__ import annotations

import os
import time

import pytest

import rpcclient as rc
from rpcclient import (
    CURRENT_STATEID,
    EXCHGID4_FLAG_CONFIRMED_R,
    EXCHGID4_FLAG_UPD_CONFIRMED_REC_A,
    OPEN4_SHARE_ACCESS_BOTH,
    OPEN4_SHARE_ACCESS_READ,
    OPEN4_SHARE_ACCESS_WRITE,
    OPEN4_SHARE_DENY_WRITE,
    READ_LT,
    WRITE_LT,
    Client,
    Op,
    St,
    expect,
    expect_ok,
    st_name,
    unique_name,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

LEASE = 3  # seconds; short, as some tests wait one out
OTHER_UID = 1000  # another principal
OTHER = rc.auth_sys(uid=OTHER_UID, gid=OTHER_UID, gids=[OTHER_UID], machine="stateclient")
VERIFIER_1 = b"verif-01"
VERIFIER_2 = b"verif-02"


@pytest.fixture
def srv(sluice_factory):
    """sluice with a LEASE-second lease and no grace period, so that new
    clients may open and lock at once."""
    server = sluice_factory("--lease-time", LEASE, "--grace-time", 0)
    server.export.chmod(0o777)
    server.lease = LEASE
    return server


# --- helpers -----------------------------------------------------------------


def client(srv, **kw) -> Client:
    return Client(srv.port, **kw)


def past_lease(srv, since: float):
    """Sleeps until a client silent since `since` is past its lease (with a
    margin): the behaviour under test, not synchronisation."""
    left = since + srv.lease + 2.0 - time.monotonic()
    if left > 0:
        time.sleep(left)


def retry_delay(fn, what: str, tries: int = 10, pause: float = 0.5):
    """Calls fn() again while it answers NFS4ERR_DELAY (a bounded number of
    times, as a client would); returns the first other answer."""
    for _ in range(tries):
        r = fn()
        if r.status != St.DELAY:
            return r
        time.sleep(pause)
    raise AssertionError(f"{what}: still NFS4ERR_DELAY after {tries} tries: {r!r}")


def session_gone_or_state_revoked(c: Client, stateids, what: str):
    """The client's session is gone (NFS4ERR_BADSESSION), or it lives on but
    none of `stateids` is valid any more."""
    r = c.sequence()
    if r.status == St.BADSESSION:
        return
    assert r.status == St.OK, f"{what}: SEQUENCE got {r!r}"
    codes = c.test_stateids(stateids)
    assert all(code != St.OK for code in codes), f"{what}: the session lives and stateids are still valid: {[st_name(x) for x in codes]}"


def _without_status_flags(body: bytes) -> bytes:
    """A COMPOUND reply (empty tag, SEQUENCE first) with SEQUENCE's
    sr_status_flags zeroed: status, tag, count, resop, status, sessionid (16),
    sequenceid, slotid, highest_slotid, target_highest_slotid, status_flags."""
    at = 4 + 4 + 4 + 4 + 4 + 16 + 16
    return body[:at] + b"\0\0\0\0" + body[at + 4 :] if len(body) >= at + 4 else body


# --- EXCHANGE_ID (RFC 8881 section 18.35.5) -----------------------------------


def test_exchange_id_case1_new_owner(srv):
    """RFC 8881 section 18.35.5, case 1 (new owner ID): the server makes an
    unconfirmed record with a new client ID; EXCHGID4_FLAG_CONFIRMED_R is
    not set. CREATE_SESSION with eir_sequenceid confirms it."""
    with client(srv) as a, client(srv) as b:
        r = expect_ok(a.exchange_id(), "EXCHANGE_ID of a new owner")
        assert r[0].clientid != 0, r
        assert not r[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"new owner's record reported confirmed: flags {r[0].flags:#x}"
        r2 = expect_ok(b.exchange_id(), "EXCHANGE_ID of another new owner")
        assert r2[0].clientid != r[0].clientid, "two owners got the same client ID"
        expect_ok(a.create_session(), "CREATE_SESSION confirming the new record")
        expect_ok(a.sequence(), "SEQUENCE on the new session")


def test_exchange_id_case2_non_update_on_confirmed_record(srv):
    """RFC 8881 section 18.35.5, case 2 (non-update on existing client ID):
    the same owner, verifier and principal again on a confirmed record get
    the same client ID with EXCHGID4_FLAG_CONFIRMED_R; the session lives on."""
    with client(srv) as a:
        a.establish()
        first = a.clientid
        r = expect_ok(a.exchange_id(), "EXCHANGE_ID again, same verifier and principal")
        assert r[0].clientid == first, f"client ID changed from {first:#x} to {r[0].clientid:#x}"
        assert r[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"CONFIRMED_R not set: flags {r[0].flags:#x}"
        expect_ok(a.sequence(), "SEQUENCE on the existing session")


def test_exchange_id_case3_collision_with_state_is_clid_inuse(srv):
    """RFC 8881 section 18.35.5, case 3 (client collision): another
    principal presents the owner of a confirmed record that holds state (an
    OPEN), without EXCHGID4_FLAG_UPD_CONFIRMED_REC_A: NFS4ERR_CLID_INUSE,
    and the holder's session and open are untouched."""
    with client(srv) as a:
        a.establish()
        sid, _ = a.must_open(unique_name("collide"))
        with client(srv, owner=a.owner, verifier=VERIFIER_2, uid=OTHER_UID, gid=OTHER_UID) as intruder:
            expect(intruder.exchange_id(), St.CLID_INUSE, "EXCHANGE_ID from another principal for an owner with state")
        expect_ok(a.sequence(), "holder's SEQUENCE after the collision")
        assert a.test_stateids([sid]) == [St.OK], "holder's open stateid after the collision"


def test_exchange_id_case3_collision_without_state_gets_new_clientid(srv):
    """RFC 8881 section 18.35.5, case 3 (client collision) when the confirmed
    record holds no state (no opens, and its only session destroyed, which
    the Linux server also counts as state): the new principal gets a new,
    unconfirmed client ID and the old record is gone (its client ID gets
    NFS4ERR_STALE_CLIENTID on CREATE_SESSION)."""
    with client(srv) as a:
        a.establish(reclaim_complete=False)
        expect_ok(a.call([rc.op_destroy_session(a.sessionid)]), "DESTROY_SESSION")
        with client(srv, owner=a.owner, verifier=VERIFIER_2, uid=OTHER_UID, gid=OTHER_UID) as other:
            r = expect_ok(other.exchange_id(), "EXCHANGE_ID from another principal for an owner without state")
            assert r[0].clientid != a.clientid, "the new principal got the old principal's client ID"
            assert not r[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"CONFIRMED_R set: flags {r[0].flags:#x}"
            expect_ok(other.create_session(), "CREATE_SESSION of the new principal's client ID")
        expect(a.create_session(), St.STALE_CLIENTID, "CREATE_SESSION of the replaced client ID")


def test_exchange_id_case4_replaces_unconfirmed_record(srv):
    """RFC 8881 section 18.35.5, case 4 (replacement of unconfirmed record):
    a second EXCHANGE_ID (new verifier) before CREATE_SESSION replaces the
    unconfirmed record with a new client ID; CREATE_SESSION on the old one
    gets NFS4ERR_STALE_CLIENTID, on the new one it works."""
    with client(srv) as a:
        r1 = expect_ok(a.exchange_id(verifier=VERIFIER_1), "first EXCHANGE_ID")
        old, old_seq = r1[0].clientid, r1[0].seqid
        r2 = expect_ok(a.exchange_id(verifier=VERIFIER_2), "second EXCHANGE_ID, new verifier")
        assert r2[0].clientid != old, "the unconfirmed record kept its client ID"
        assert not r2[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"CONFIRMED_R set: flags {r2[0].flags:#x}"
        expect(a.create_session(seq=old_seq, clientid=old), St.STALE_CLIENTID, "CREATE_SESSION of the replaced unconfirmed client ID")
        expect_ok(a.create_session(), "CREATE_SESSION of the new client ID")
        expect_ok(a.sequence(), "SEQUENCE on the new session")


def test_exchange_id_case5_client_restart(srv):
    """RFC 8881 section 18.35.5, case 5 (client restart): same owner and
    principal, new verifier: a new unconfirmed client ID. The old
    incarnation's opens and locks stay until CREATE_SESSION confirms the new
    record; then the old session is NFS4ERR_BADSESSION and another client
    can take the lock the old one held."""
    name = unique_name("restart")
    with client(srv, verifier=VERIFIER_1) as a, client(srv) as b:
        a.establish()
        sid, fh = a.must_open(name)
        lk = expect_ok(a.lock(fh, sid), "old incarnation's LOCK").stateid
        b.establish()
        sb, _ = b.must_open(name)

        with client(srv, owner=a.owner, verifier=VERIFIER_2) as a2:
            r = expect_ok(a2.exchange_id(), "EXCHANGE_ID after the client restarted (new verifier)")
            assert r[0].clientid != a.clientid, "the restarted client got its old client ID back"
            assert not r[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"CONFIRMED_R set: flags {r[0].flags:#x}"
            # Not confirmed yet: the old incarnation's state stands.
            expect_ok(a.sequence(), "old incarnation's SEQUENCE before the new record is confirmed")
            assert a.test_stateids([sid, lk]) == [St.OK, St.OK], "old incarnation's stateids before the new record is confirmed"
            expect(b.lock(fh, sb, owner=b"b-early"), St.DENIED, "another client's LOCK over the old incarnation's lock")

            expect_ok(a2.create_session(), "CREATE_SESSION confirming the new incarnation")
            expect(a.sequence(), St.BADSESSION, "old incarnation's SEQUENCE after the new record was confirmed")
            r = retry_delay(lambda: b.lock(fh, sb, owner=unique_name("b-late").encode()), "LOCK after the old incarnation went")
            expect_ok(r, "another client's LOCK once the old incarnation's state is gone")


def test_exchange_id_case6_update_confirmed_record(srv):
    """RFC 8881 section 18.35.5, case 6 (update): EXCHGID4_FLAG_UPD_CONFIRMED_REC_A
    on a confirmed record with the same verifier and principal: the same
    client ID, with EXCHGID4_FLAG_CONFIRMED_R."""
    with client(srv) as a:
        a.establish()
        first = a.clientid
        r = expect_ok(a.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A), "update EXCHANGE_ID")
        assert r[0].clientid == first, f"update changed the client ID from {first:#x} to {r[0].clientid:#x}"
        assert r[0].flags & EXCHGID4_FLAG_CONFIRMED_R, f"CONFIRMED_R not set: flags {r[0].flags:#x}"
        expect_ok(a.sequence(), "SEQUENCE after the update")


def test_exchange_id_case7_update_without_confirmed_record_is_noent(srv):
    """RFC 8881 section 18.35.5, case 7 (update but no confirmed record):
    NFS4ERR_NOENT, both when the owner is unknown and when it has only an
    unconfirmed record."""
    with client(srv) as a:
        expect(a.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A), St.NOENT, "update for an unknown owner")
        expect_ok(a.exchange_id(), "EXCHANGE_ID making an unconfirmed record")
        expect(a.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A), St.NOENT, "update for an owner with only an unconfirmed record")


def test_exchange_id_case8_update_with_other_verifier_is_not_same(srv):
    """RFC 8881 section 18.35.5, case 8 (update but wrong verifier):
    NFS4ERR_NOT_SAME; the confirmed record is untouched."""
    with client(srv, verifier=VERIFIER_1) as a:
        a.establish()
        expect(a.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A, verifier=VERIFIER_2), St.NOT_SAME, "update with another verifier")
        expect_ok(a.sequence(), "SEQUENCE after the refused update")


def test_exchange_id_case9_update_from_other_principal_is_perm(srv):
    """RFC 8881 section 18.35.5, case 9 (update but wrong principal):
    NFS4ERR_PERM; the confirmed record is untouched."""
    with client(srv) as a:
        a.establish()
        r = a.exchange_id(flags=EXCHGID4_FLAG_UPD_CONFIRMED_REC_A, cred=OTHER)
        expect(r, St.PERM, "update from another principal")
        expect_ok(a.sequence(), "SEQUENCE after the refused update")


@pytest.mark.parametrize("flags", [0x00000800, EXCHGID4_FLAG_CONFIRMED_R], ids=["undefined-0x800", "CONFIRMED_R"])
def test_exchange_id_bad_flags_are_inval(srv, flags):
    """RFC 8881 section 18.35.3: bits of eia_flags that are not defined, and
    EXCHGID4_FLAG_CONFIRMED_R (a reply-only flag), get NFS4ERR_INVAL."""
    with client(srv) as a:
        expect(a.exchange_id(flags=flags), St.INVAL, f"EXCHANGE_ID with flags {flags:#010x}")


def test_unconfirmed_record_expires_after_a_lease(srv):
    """RFC 8881 sections 18.35 and 18.36.4: an unconfirmed record that no
    CREATE_SESSION confirms within a lease is dropped; CREATE_SESSION on it
    then gets NFS4ERR_STALE_CLIENTID. (Waited: a lease and two seconds.)"""
    with client(srv) as a:
        expect_ok(a.exchange_id(), "EXCHANGE_ID")
        since = time.monotonic()
        past_lease(srv, since)
        expect(a.create_session(), St.STALE_CLIENTID, f"CREATE_SESSION {time.monotonic() - since:.1f} s after EXCHANGE_ID")


# --- CREATE_SESSION (RFC 8881 section 18.36) ----------------------------------


@pytest.mark.parametrize("fore", [(0, 16, 1 << 20, 4096, 16, 8), (0, 1 << 20, 16, 16, 16, 8)], ids=["maxrequestsize-16", "maxresponsesize-16"])
def test_create_session_channel_too_small_is_toosmall(srv, fore):
    """RFC 8881 section 18.36.3: a fore channel whose ca_maxrequestsize or
    ca_maxresponsesize cannot carry any COMPOUND (16 bytes) is
    NFS4ERR_TOOSMALL."""
    with client(srv) as a:
        expect_ok(a.exchange_id(), "EXCHANGE_ID")
        expect(a.create_session(fore=fore), St.TOOSMALL, f"CREATE_SESSION with fore channel {fore}")


def test_create_session_undefined_flags_are_inval(srv):
    """RFC 8881 section 18.36.3 (csa_flags): undefined bits (0x100) get
    NFS4ERR_INVAL."""
    with client(srv) as a:
        expect_ok(a.exchange_id(), "EXCHANGE_ID")
        expect(a.create_session(flags=0x100), St.INVAL, "CREATE_SESSION with csa_flags 0x100")


def test_create_session_other_principal_is_clid_inuse(srv):
    """RFC 8881 section 18.36.4: CREATE_SESSION for an unconfirmed client ID
    from a principal other than the one that did EXCHANGE_ID is
    NFS4ERR_CLID_INUSE; the record stays, and its own principal confirms it.
    (Whether the refusal used up the sequence id is the server's choice:
    Linux 6.12 caches the error as the reply to that csa_sequence, so the
    same sequence id gets it again and the next one works.)"""
    with client(srv) as a:
        r = expect_ok(a.exchange_id(), "EXCHANGE_ID")
        seq = r[0].seqid
        expect(a.create_session(seq=seq, cred=OTHER), St.CLID_INUSE, "CREATE_SESSION from another principal")
        r = a.create_session(seq=seq)
        if r.status == St.CLID_INUSE:  # the refusal, replayed from the CREATE_SESSION slot
            r = a.create_session(seq=seq + 1)
        expect_ok(r, "CREATE_SESSION from the principal of EXCHANGE_ID")
        expect_ok(a.sequence(), "SEQUENCE on the session")


def test_create_session_sequence_misordered_and_replay(srv):
    """RFC 8881 section 18.36.4: csa_sequence must be eir_sequenceid for an
    unconfirmed record and the last one plus one after that, else
    NFS4ERR_SEQ_MISORDERED; the last one again is a replay that returns the
    same session (and makes none)."""
    with client(srv) as a:
        r = expect_ok(a.exchange_id(), "EXCHANGE_ID")
        seq0 = r[0].seqid
        expect(a.create_session(seq=seq0 + 1), St.SEQ_MISORDERED, "unconfirmed record, csa_sequence eir_sequenceid+1")
        first = expect_ok(a.create_session(seq=seq0), "CREATE_SESSION with eir_sequenceid")
        replay = expect_ok(a.create_session(seq=seq0), "CREATE_SESSION replayed (same csa_sequence)")
        assert replay[0].sessionid == first[0].sessionid, "the replay made another session"
        assert replay[0].seq == first[0].seq and replay[0].fore == first[0].fore, (first, replay)
        expect(a.create_session(seq=seq0 + 2), St.SEQ_MISORDERED, "confirmed record, csa_sequence skipping one")
        second = expect_ok(a.create_session(seq=seq0 + 1), "CREATE_SESSION with the next csa_sequence")
        assert second[0].sessionid != first[0].sessionid
        for sid in (first[0].sessionid, second[0].sessionid):
            expect_ok(a.call([rc.op_sequence(sid, 1), rc.op_putrootfh()]), "SEQUENCE on each session")


# --- SEQUENCE and the reply cache (RFC 8881 sections 2.10.6.1.3, 18.46) ------


def test_cachethis_reply_too_big_to_cache(srv):
    """RFC 8881 sections 2.10.6.4 and 18.46.3: with sa_cachethis, the op
    whose result would make the reply larger than ca_maxresponsesize_cached
    fails with NFS4ERR_REP_TOO_BIG_TO_CACHE (the ops before it succeed), and
    a retransmission gets that same reply from the cache (the SEQUENCE
    result is made anew for a replay, so its sr_status_flags may differ:
    Linux reports SEQ4_STATUS_CB_PATH_DOWN on the first reply only)."""
    with client(srv) as a:
        a.establish(fore=(0, 1 << 20, 1 << 20, 256, 16, 8))
        cached = a.fore["maxcached"]
        assert cached <= 256, f"server raised ca_maxresponsesize_cached to {cached}"
        ops = [rc.op_putrootfh(), rc.op_getfh()] + [rc.op_getattr()] * 6
        seq = a.seq_op(cachethis=True)
        first = a.call([seq] + ops)
        assert first.status == St.REP_TOO_BIG_TO_CACHE, f"{len(first.record)}-byte cachethis reply with ca_maxresponsesize_cached {cached}: {first!r}"
        assert first[0].opnum == Op.SEQUENCE and first[0].status == St.OK, first
        assert first.last().status == St.REP_TOO_BIG_TO_CACHE and len(first) >= 3, first
        assert all(x.status == St.OK for x in first.results[:-1]), first
        assert len(first.record) <= cached, f"the error reply ({len(first.record)} bytes) is itself over {cached}"
        again = a.call([seq] + ops)
        assert _without_status_flags(again.body) == _without_status_flags(first.body), f"retransmission: {again!r}, first {first!r}"


def test_slot_reuse_uncached_other_request_is_retry_uncached_rep(srv):
    """RFC 8881 section 2.10.6.1.3: a request sent with sa_cachethis FALSE,
    then another request (same user, other ops) on the same slot and
    sequence id. The server need not have kept anything to tell them apart,
    and answers as for a retry of an uncached reply: the SEQUENCE result,
    then NFS4ERR_RETRY_UNCACHED_REP for the next op ("MUST NOT return
    NFS4ERR_RETRY_UNCACHED_REP in reply to a Sequence operation if the
    Sequence operation is the first operation"), nothing executed. The
    next sequence id then works. (nfs-rs 0.8.7 reuses sequence ids so.)"""
    with client(srv) as a:
        a.establish()
        seqid = a.next_seq.get(0, 1)
        expect_ok(a.compound([rc.op_putrootfh(), rc.op_getfh()], seqid=seqid, cachethis=False), "first request")
        r = a.compound([rc.op_putrootfh(), rc.op_getattr()], seqid=seqid, cachethis=False)
        assert r.status == St.RETRY_UNCACHED_REP, f"other request on a used uncached slot/seqid: {r!r}"
        assert r.statuses() == [(Op.SEQUENCE, St.OK), (Op.PUTROOTFH, St.RETRY_UNCACHED_REP)], f"expected SEQUENCE=OK, PUTROOTFH=RETRY_UNCACHED_REP: {r!r}"
        expect_ok(a.compound([rc.op_putrootfh(), rc.op_getfh()], seqid=seqid + 1), "the next sequence id")


def test_slot_reuse_cached_other_request_is_false_retry(srv):
    """RFC 8881 section 2.10.6.1.3.1: a request whose reply was cached
    (sa_cachethis TRUE), then another request on the same slot and sequence
    id: NFS4ERR_SEQ_FALSE_RETRY on SEQUENCE (not the other request's
    reply); the next sequence id then works."""
    with client(srv) as a:
        a.establish()
        seqid = a.next_seq.get(0, 1)
        expect_ok(a.compound([rc.op_putrootfh(), rc.op_getfh()], seqid=seqid, cachethis=True), "first request")
        r = a.compound([rc.op_putrootfh(), rc.op_getattr(), rc.op_getfh()], seqid=seqid, cachethis=True)
        assert r.statuses() == [(Op.SEQUENCE, St.SEQ_FALSE_RETRY)], f"other request on a cached slot/seqid: {r!r}"
        expect_ok(a.compound([rc.op_putrootfh(), rc.op_getfh()], seqid=seqid + 1), "the next sequence id")


@pytest.mark.parametrize("cachethis", [False, True], ids=["uncached", "cached"])
def test_slot_reuse_by_other_user_is_false_retry(srv, cachethis):
    """RFC 8881 section 2.10.6.1.3.1: the same slot and sequence id with the
    same ops from another user (AUTH_SYS uid) is a false retry whether or not
    the first reply was cached: NFS4ERR_SEQ_FALSE_RETRY on SEQUENCE."""
    with client(srv) as a:
        a.establish()
        seqid = a.next_seq.get(0, 1)
        ops = [rc.op_putrootfh(), rc.op_getfh()]
        expect_ok(a.compound(ops, seqid=seqid, cachethis=cachethis), "first request")
        r = a.compound(ops, seqid=seqid, cachethis=cachethis, cred=OTHER)
        assert r.statuses() == [(Op.SEQUENCE, St.SEQ_FALSE_RETRY)], f"same request from uid {OTHER_UID}: {r!r}"
        expect_ok(a.compound(ops, seqid=seqid + 1), "the next sequence id")


# --- courteous leases (RFC 8881 sections 8.3, 8.4.1) ---------------------------


def test_courtesy_expired_client_keeps_state_without_conflict(srv):
    """RFC 8881 section 8.3 (a server MAY keep an expired client's state
    while nobody conflicts; the Linux server does, since 6.2): client A
    holds an open (deny write) and a write lock and is silent past its
    lease; nobody asks for anything conflicting. A comes back: its session
    works, its stateids are valid, and its lock still keeps B out."""
    name = unique_name("courtesy-a")
    with client(srv) as a, client(srv) as b:
        a.establish()
        sid, fh = a.must_open(name, deny=OPEN4_SHARE_DENY_WRITE)
        lk = expect_ok(a.lock(fh, sid), "A's write LOCK").stateid
        silent = time.monotonic()
        past_lease(srv, silent)
        expect_ok(a.sequence(), f"A's SEQUENCE {time.monotonic() - silent:.1f} s after its last request")
        assert a.test_stateids([sid, lk]) == [St.OK, St.OK], "A's open and lock stateids after the silence"
        b.establish()
        rb = expect_ok(b.open(name, access=OPEN4_SHARE_ACCESS_READ), "B's read OPEN (A denies only writes)")
        expect(b.lock(fh, rb.stateid, locktype=READ_LT), St.DENIED, "B's read LOCK over A's write lock")


def test_courtesy_conflicting_lock_takes_over_expired_lock(srv):
    """RFC 8881 section 8.3, courteous server: client A holds a write lock
    and is silent past its lease; client B's conflicting LOCK succeeds (at
    once, or after NFS4ERR_DELAY while the server expires A); afterwards A's
    session is NFS4ERR_BADSESSION (or its stateids are no longer valid)."""
    name = unique_name("courtesy-b")
    with client(srv) as a, client(srv) as b:
        a.establish()
        sid, fh = a.must_open(name)
        lk = expect_ok(a.lock(fh, sid), "A's write LOCK").stateid
        past_lease(srv, time.monotonic())
        b.establish()
        sb, _ = b.must_open(name)
        r = retry_delay(lambda: b.lock(fh, sb, owner=unique_name("b").encode()), "B's LOCK over the expired client's lock")
        expect_ok(r, "B's LOCK over a lock of a client past its lease")
        session_gone_or_state_revoked(a, [sid, lk], "A after B took its lock")


def test_courtesy_conflicting_open_breaks_expired_deny(srv):
    """RFC 8881 section 8.3, courteous server, share reservations: client A
    opened with OPEN4_SHARE_DENY_WRITE and is silent past its lease; client
    B's OPEN for writing succeeds (at once, or after NFS4ERR_DELAY);
    afterwards A's session is NFS4ERR_BADSESSION (or its open stateid is no
    longer valid)."""
    name = unique_name("courtesy-deny")
    with client(srv) as a, client(srv) as b:
        a.establish()
        sid, _ = a.must_open(name, access=OPEN4_SHARE_ACCESS_READ, deny=OPEN4_SHARE_DENY_WRITE)
        past_lease(srv, time.monotonic())
        b.establish()
        r = retry_delay(lambda: b.open(name, access=OPEN4_SHARE_ACCESS_WRITE, owner=unique_name("b").encode()), "B's write OPEN against the expired deny")
        expect_ok(r, "B's write OPEN against a deny of a client past its lease")
        session_gone_or_state_revoked(a, [sid], "A after B broke its deny")


def test_lease_holder_conflicts_are_refused(srv):
    """RFC 8881 sections 9.7 and 18.10.4, before the lease runs out: client A
    holds an open denying writes and a write lock; client B's OPEN for
    writing is NFS4ERR_SHARE_DENIED, B's read LOCK is NFS4ERR_DENIED (with
    A's lock as the conflict), and A keeps both."""
    name = unique_name("live")
    with client(srv) as a, client(srv) as b:
        a.establish()
        sid, fh = a.must_open(name, deny=OPEN4_SHARE_DENY_WRITE)
        lk = expect_ok(a.lock(fh, sid, offset=0, length=100), "A's write LOCK").stateid
        b.establish()
        expect(b.open(name, access=OPEN4_SHARE_ACCESS_BOTH), St.SHARE_DENIED, "B's write OPEN against A's deny")
        rb = expect_ok(b.open(name, access=OPEN4_SHARE_ACCESS_READ, owner=b"b-reader"), "B's read OPEN")
        r = expect(b.lock(fh, rb.stateid, offset=50, length=10, locktype=READ_LT), St.DENIED, "B's read LOCK over A's write lock")
        d = r.last()
        assert (d.denied_offset, d.denied_length, d.denied_type) == (0, 100, WRITE_LT), f"LOCK4denied does not describe A's lock: {d!r}"
        expect_ok(a.sequence(), "A's SEQUENCE")
        assert a.test_stateids([sid, lk]) == [St.OK, St.OK], "A's stateids"


# --- the current stateid (RFC 8881 section 16.2.3.1.2) ------------------------


def test_current_stateid_open_then_close(srv):
    """RFC 8881 section 16.2.3.1.2: OPEN sets the current stateid; CLOSE
    with the special current stateid (seqid 1, other zero) in the same
    COMPOUND closes that open."""
    with client(srv) as a:
        a.establish()
        r = a.compound([rc.op_putrootfh(), rc.op_open(a.owner, unique_name("cur-close"), create=True), rc.op_close(CURRENT_STATEID)])
        expect_ok(r, "PUTROOTFH, OPEN, CLOSE(current stateid)")
        opened = r[2].stateid
        assert a.test_stateids([opened]) == [St.BAD_STATEID], "the open is still there after CLOSE(current stateid)"


def test_current_stateid_open_then_lock(srv):
    """RFC 8881 section 16.2.3.1.2: OPEN + LOCK by a new lock owner whose
    open stateid is the current stateid works, and the lock is real (another
    client's LOCK is denied)."""
    name = unique_name("cur-lock")
    with client(srv) as a, client(srv) as b:
        a.establish()
        r = a.compound([rc.op_putrootfh(), rc.op_open(a.owner, name, create=True), rc.op_lock_new(CURRENT_STATEID, b"cur-lock-owner"), rc.op_getfh()])
        expect_ok(r, "PUTROOTFH, OPEN, LOCK(open stateid = current stateid)")
        fh = r[4].fh
        b.establish()
        sb, _ = b.must_open(name)
        expect(b.lock(fh, sb), St.DENIED, "another client's LOCK over the lock taken with the current stateid")


@pytest.mark.parametrize("how", ["putfh", "putrootfh-lookup"])
def test_current_stateid_cleared_by_filehandle_change(srv, how):
    """RFC 8881 section 16.2.3.1.2: an op that sets the current filehandle
    without setting a stateid leaves no current stateid, so after OPEN,
    then PUTFH (or PUTROOTFH + LOOKUP) of the same file, CLOSE with the
    current stateid is NFS4ERR_BAD_STATEID. (The Linux server clears the
    current stateid in PUTFH, PUTROOTFH, PUTPUBFH, LOOKUP, LOOKUPP and
    CREATE.) The open itself is untouched: CLOSE with its stateid works."""
    name = unique_name("cur-clear")
    with client(srv) as a:
        a.establish()
        sid, fh = a.must_open(name)
        expect_ok(a.compound([rc.op_putfh(fh), rc.op_close(sid)]), "CLOSE of the creating open")
        change = [rc.op_putfh(fh)] if how == "putfh" else [rc.op_putrootfh(), rc.op_lookup(name)]
        r = a.compound([rc.op_putrootfh(), rc.op_open(a.owner, name)] + change + [rc.op_close(CURRENT_STATEID)])
        assert r.status == St.BAD_STATEID and r.last().opnum == Op.CLOSE, f"OPEN, {how}, CLOSE(current stateid): expected CLOSE=BAD_STATEID, got {r!r}"
        opened = r[2].stateid
        expect_ok(a.compound([rc.op_putfh(fh), rc.op_close(opened)]), "CLOSE with the open's own stateid")


# --- OPEN_DOWNGRADE: back to what some of the OPENs asked (RFC 8881 18.18.3) ----

R, W, B = OPEN4_SHARE_ACCESS_READ, OPEN4_SHARE_ACCESS_WRITE, OPEN4_SHARE_ACCESS_BOTH
DENY_NONE, DENY_W = 0, OPEN4_SHARE_DENY_WRITE


@pytest.mark.parametrize(
    "opens,to,status",
    [
        ([(B, DENY_NONE)], (R, DENY_NONE), St.INVAL),
        ([(R, DENY_NONE), (B, DENY_NONE)], (R, DENY_NONE), St.OK),
        ([(R, DENY_NONE), (W, DENY_NONE)], (R, DENY_NONE), St.OK),
        ([(R, DENY_NONE), (W, DENY_NONE)], (B, DENY_NONE), St.OK),
        ([(B, DENY_W)], (B, DENY_NONE), St.INVAL),
        ([(B, DENY_NONE), (B, DENY_W)], (B, DENY_NONE), St.OK),
        ([(R, DENY_NONE)], (B, DENY_NONE), St.INVAL),
    ],
    ids=["both-to-read", "read+both-to-read", "read+write-to-read", "read+write-to-both",
         "denywrite-to-denynone", "denynone+denywrite-to-denynone", "read-to-both"],
)
def test_open_downgrade_goes_back_only_to_what_opens_asked(srv, opens, to, status):
    """OPEN_DOWNGRADE's access and deny must be exactly the union of those
    of some of the OPENs in effect (RFC 8881 section 18.18.3), else
    NFS4ERR_INVAL and the open is unchanged. The Linux server checks each
    access and deny value on its own, so it refuses the union of a read
    and a write OPEN (read+write-to-both); the RFC allows it."""
    with client(srv) as a:
        a.establish()
        name = unique_name("downgrade")
        for access, deny in opens:
            r = expect_ok(a.open(name, access=access, deny=deny), f"OPEN access {access} deny {deny}")
        sid, fh = r.stateid, r.fh
        r = a.compound([rc.op_putfh(fh), rc.op_open_downgrade(sid, to[0], to[1])])
        assert r.status == status, f"OPEN_DOWNGRADE to {to} after {opens}: {r!r}"
        if status == St.OK:
            sid = r[2].stateid
            # The OPENs beyond the new bits are given up: back up is refused.
            full = (to[0], to[1])
            for access, deny in opens:
                full = (full[0] | access, full[1] | deny)
            if full != to:
                expect(a.compound([rc.op_putfh(fh), rc.op_open_downgrade(sid, full[0], full[1])]), St.INVAL,
                       f"OPEN_DOWNGRADE back up to {full}")
        expect_ok(a.compound([rc.op_putfh(fh), rc.op_close(sid)]), "CLOSE")


# --- a stateid of another file: NFS4ERR_BAD_STATEID (RFC 8881 section 15.1.5.2) -


def two_opens(c: Client, tag: str):
    """(name, stateid, filehandle) of two new files `c` has open."""
    out = []
    for part in "ab":
        name = unique_name(f"{tag}-{part}")
        out.append((name, *c.must_open(name)))
    return out


def test_close_with_another_files_stateid_is_bad_stateid(srv):
    """CLOSE under a filehandle that is not the open's file is
    NFS4ERR_BAD_STATEID, and the open stays: CLOSE under its own file then
    works. (The Linux server compares the current filehandle with the
    stateid's file last, after the stateid's own checks: nfs4_check_fh.)"""
    with client(srv) as a:
        a.establish()
        (_, sa, fa), (_, sb, fb) = two_opens(a, "close-other")
        expect(a.compound([rc.op_putfh(fb), rc.op_close(sa)]), St.BAD_STATEID, "CLOSE of A's open under B")
        assert a.test_stateids([sa, sb]) == [St.OK, St.OK], "an open went with the refused CLOSE"
        expect_ok(a.compound([rc.op_putfh(fa), rc.op_close(sa)]), "CLOSE of A's open under A")
        expect_ok(a.compound([rc.op_putfh(fb), rc.op_close(sb)]), "CLOSE of B's open under B")


def test_open_downgrade_with_another_files_stateid_is_bad_stateid(srv):
    """OPEN_DOWNGRADE under another file is NFS4ERR_BAD_STATEID; the open
    is untouched, and downgrades under its own file. The stateid's own
    checks come first: an old seqid under another file is
    NFS4ERR_OLD_STATEID. (A is opened for reading, then for both, so that
    the downgrade to reading is one the Linux server takes too: it allows
    only access modes the owner has opened with.)"""
    with client(srv) as a:
        a.establish()
        name_a = unique_name("downgrade-other-a")
        first = expect_ok(a.open(name_a, access=OPEN4_SHARE_ACCESS_READ), "OPEN A for reading").stateid
        r = expect_ok(a.open(name_a), "OPEN A for both")
        sa, fa = r.stateid, r.fh
        sb, fb = a.must_open(unique_name("downgrade-other-b"))
        expect(a.compound([rc.op_putfh(fb), rc.op_open_downgrade(sa, OPEN4_SHARE_ACCESS_READ)]), St.BAD_STATEID,
               "OPEN_DOWNGRADE of A's open under B")
        expect(a.compound([rc.op_putfh(fb), rc.op_close(first)]), St.OLD_STATEID, "CLOSE with A's old seqid under B")
        r = expect_ok(a.compound([rc.op_putfh(fa), rc.op_open_downgrade(sa, OPEN4_SHARE_ACCESS_READ)]),
                      "OPEN_DOWNGRADE of A's open under A")
        assert r[2].stateid[4:] == sa[4:], "the downgrade made a new open"
        expect_ok(a.compound([rc.op_putfh(fa), rc.op_close(r[2].stateid)]), "CLOSE of A's open under A")


def test_lock_and_locku_with_another_files_stateid_are_bad_stateid(srv):
    """LOCK by a new lock owner with another file's open stateid, LOCK by an
    existing owner and LOCKU with another file's lock stateid: all
    NFS4ERR_BAD_STATEID, and the lock taken under its own file stays."""
    with client(srv) as a:
        a.establish()
        (name_a, sa, fa), (_, sb, fb) = two_opens(a, "lock-other")
        expect(a.lock(fb, sa), St.BAD_STATEID, "LOCK with A's open stateid under B")
        lk = expect_ok(a.lock(fa, sa, offset=0, length=10), "LOCK of A under A").stateid
        expect(a.compound([rc.op_putfh(fb), rc.op_lock_existing(lk, offset=20, length=10)]), St.BAD_STATEID,
               "LOCK with A's lock stateid under B")
        expect(a.compound([rc.op_putfh(fb), rc.op_locku(lk, 0, 10)]), St.BAD_STATEID, "LOCKU of A's lock under B")
        with client(srv) as b:
            b.establish()
            ob, _ = b.must_open(name_a, create=False)
            expect(b.lock(fa, ob, offset=0, length=10), St.DENIED, "another client's LOCK over A's lock")
            expect_ok(a.compound([rc.op_putfh(fa), rc.op_locku(lk, 0, 10)]), "LOCKU of A's lock under A")
            expect_ok(b.lock(fa, ob, offset=0, length=10), "another client's LOCK after the LOCKU")


def test_read_and_write_with_another_files_stateid_are_bad_stateid(srv):
    """READ and WRITE under another file than their open's are
    NFS4ERR_BAD_STATEID too."""
    with client(srv) as a:
        a.establish()
        (_, sa, fa), (_, sb, fb) = two_opens(a, "io-other")
        expect(a.compound([rc.op_putfh(fb), rc.op_read(0, 10, stateid=sa)]), St.BAD_STATEID, "READ with A's stateid under B")
        expect(a.compound([rc.op_putfh(fb), rc.op_write(0, b"x", stateid=sa)]), St.BAD_STATEID,
               "WRITE with A's stateid under B")
        expect_ok(a.compound([rc.op_putfh(fa), rc.op_write(0, b"x", stateid=sa)]), "WRITE with A's stateid under A")


# --- FREE_STATEID, CLOSE after RENAME ------------------------------------------


def test_free_stateid_with_locks_held(srv):
    """RFC 8881 section 18.38.3: FREE_STATEID of a lock stateid that still
    holds locks is NFS4ERR_LOCKS_HELD; after LOCKU it works and the stateid
    is gone (TEST_STATEID: NFS4ERR_BAD_STATEID)."""
    with client(srv) as a:
        a.establish()
        sid, fh = a.must_open(unique_name("free"))
        lk = expect_ok(a.lock(fh, sid, offset=0, length=10), "LOCK").stateid
        expect(a.compound([rc.op_free_stateid(lk)]), St.LOCKS_HELD, "FREE_STATEID of a lock stateid holding a lock")
        r = expect_ok(a.compound([rc.op_putfh(fh), rc.op_locku(lk, 0, 10)]), "LOCKU")
        lk2 = r[2].stateid
        expect_ok(a.compound([rc.op_free_stateid(lk2)]), "FREE_STATEID after LOCKU")
        assert a.test_stateids([lk2]) == [St.BAD_STATEID], "the freed lock stateid"


def test_close_after_rename_over_open_file(srv):
    """RFC 8881 sections 18.2 and 18.26: client A has file f open; another
    client renames g onto f, so A's file has no name left. A's CLOSE (PUTFH
    of the old handle + CLOSE) must still succeed."""
    f, g = unique_name("ren-f"), unique_name("ren-g")
    with client(srv) as a, client(srv) as b:
        a.establish()
        sid, fh = a.must_open(f)
        b.establish()
        sg, gfh = b.must_open(g)
        expect_ok(b.compound([rc.op_putfh(gfh), rc.op_close(sg)]), "B's CLOSE of g")
        expect_ok(b.compound([rc.op_putrootfh(), rc.op_savefh(), rc.op_putrootfh(), rc.op_rename(g, f)]), "RENAME g onto f")
        expect_ok(a.compound([rc.op_putfh(fh), rc.op_close(sid)]), "A's CLOSE of the renamed-over file")


# --- root squash (sluice only: checks the owner on the host) -------------------


def _create_as_root(srv, name: str):
    with client(srv, uid=0, gid=0) as a:
        a.establish()
        sid, fh = a.must_open(name)
        expect_ok(a.compound([rc.op_putfh(fh), rc.op_close(sid)]), "CLOSE")
    return (srv.export / name).stat()


def test_root_is_squashed_by_default(srv):
    """A file created by uid 0 over AUTH_SYS is owned by the anonymous user
    (65534:65534): root is squashed unless --no-root-squash."""
    st = _create_as_root(srv, "squashed")
    assert (st.st_uid, st.st_gid) == (65534, 65534), f"file created as root is owned by {st.st_uid}:{st.st_gid}"


def test_no_root_squash_flag(sluice_factory):
    """With --no-root-squash, a file created by uid 0 is owned by root."""
    server = sluice_factory("--lease-time", LEASE, "--grace-time", 0, "--no-root-squash")
    server.lease = LEASE
    st = _create_as_root(server, "unsquashed")
    assert (st.st_uid, st.st_gid) == (0, 0), f"file created as root with --no-root-squash is owned by {st.st_uid}:{st.st_gid}"
