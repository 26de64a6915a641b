"""Server restart, grace period and reclaim (RFC 8881 sections 8.4.2, 8.4.3,
18.16, 18.10, 18.51), over raw RPC.

Each test starts `sluice serve --lease-time L --grace-time G` (the state
directory keeps the stable client records), gives clients state, kills the
server with SIGKILL (a crash) and starts it again on the same port with the
same state directory (`SluiceServer.restart`). Clients then come back with
the same owner and verifier, as a client that lived through the server's
restart does: EXCHANGE_ID, CREATE_SESSION, OPEN with CLAIM_PREVIOUS, LOCK
with reclaim, RECLAIM_COMPLETE.

Rules checked:

* during grace, non-reclaim OPEN and LOCK get NFS4ERR_GRACE; the old
  session is gone (NFS4ERR_BADSESSION) and old stateids are refused;
* reclaims by a client known from before work, once; RECLAIM_COMPLETE twice
  is NFS4ERR_COMPLETE_ALREADY;
* grace ends early once every client known from before has sent
  RECLAIM_COMPLETE, and on time when one never comes back;
* a reclaim by a client not known from before is NFS4ERR_RECLAIM_BAD; a
  reclaim after the client's own RECLAIM_COMPLETE, after grace, or with
  no grace at all is NFS4ERR_NO_GRACE;
* edge condition 2 of section 8.4.3: a client that missed a grace period
  cannot reclaim in the next one.

Waiting for a grace period to run out is the behaviour under test; it is
polled with a deadline. Nothing else sleeps for synchronisation.
"""

from __future__ import annotations

import os
import time

import pytest

import rpcclient as rc
from rpcclient import (
    CLAIM_PREVIOUS,
    OPEN4_SHARE_ACCESS_BOTH,
    OPEN4_SHARE_DENY_NONE,
    WRITE_LT,
    Client,
    St,
    expect,
    expect_in,
    expect_ok,
    unique_name,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

LEASE = 10  # long enough that no client's lease runs out during a test
LONG_GRACE = 30  # longer than any test: grace can only end early
SHORT_GRACE = 3  # for tests that wait grace out
VERIFIER = b"grace-v1"


@pytest.fixture
def serve(sluice_factory):
    """serve(grace) starts sluice with a LEASE-second lease and a
    `grace`-second grace period after every start; the export is
    world-writable (squashed root creates the files)."""

    def start(grace: int):
        server = sluice_factory("--lease-time", LEASE, "--grace-time", grace)
        server.export.chmod(0o777)
        return server

    return start


# --- helpers -----------------------------------------------------------------


class Holder:
    """A client holding an open (share both, deny none) and, if asked, a
    write lock on bytes [0, 100) of `name`."""

    def __init__(self, server, name: str, lock: bool = True, verifier: bytes = VERIFIER):
        self.client = Client(server.port, verifier=verifier)
        self.client.establish()
        self.name = name
        self.open_sid, self.fh = self.client.must_open(name, access=OPEN4_SHARE_ACCESS_BOTH, deny=OPEN4_SHARE_DENY_NONE)
        self.lock_sid = None
        if lock:
            self.lock_sid = expect_ok(self.client.lock(self.fh, self.open_sid, offset=0, length=100), f"{name}: LOCK").stateid
        self.old_session = self.client.sessionid

    def come_back(self) -> Client:
        """After the restart: a new connection, EXCHANGE_ID with the same
        owner and verifier, CREATE_SESSION (no RECLAIM_COMPLETE yet)."""
        c = self.client
        c.reconnect()
        expect_ok(c.exchange_id(), "EXCHANGE_ID of a client known from before, after the restart")
        expect_ok(c.create_session(), "its CREATE_SESSION")
        return c

    def reclaim_open(self, owner: bytes | None = None):
        r = self.client.compound([rc.op_putfh(self.fh), rc.op_open(owner or (self.client.owner + b"/open"), claim=CLAIM_PREVIOUS)])
        if r.status == St.OK:
            r.stateid = r[2].stateid
        return r

    def reclaim_lock(self, open_sid: bytes, owner: bytes | None = None):
        return self.client.lock(self.fh, open_sid, owner=owner, offset=0, length=100, locktype=WRITE_LT, reclaim=True)

    def reclaim_all(self):
        """OPEN CLAIM_PREVIOUS, LOCK reclaim (if it held one), RECLAIM_COMPLETE."""
        r = expect_ok(self.reclaim_open(), f"{self.name}: OPEN with CLAIM_PREVIOUS")
        self.open_sid = r.stateid
        if self.lock_sid is not None:
            self.lock_sid = expect_ok(self.reclaim_lock(self.open_sid), f"{self.name}: LOCK with reclaim").stateid
        expect_ok(self.client.compound([rc.op_reclaim_complete()]), f"{self.name}: RECLAIM_COMPLETE")


def newcomer(server) -> Client:
    """A client not known before the restart, past its RECLAIM_COMPLETE."""
    return Client(server.port).establish()


def poll(fn, until, what: str, deadline: float, pause: float = 0.2):
    """Calls fn() until until(reply) holds or `deadline` (monotonic) passes;
    returns the (reply, time) of the first that holds, else fails."""
    while True:
        r = fn()
        now = time.monotonic()
        if until(r):
            return r, now
        if now > deadline:
            raise AssertionError(f"{what}: still {r!r} at the deadline")
        time.sleep(pause)


def open_new_file(c: Client):
    return c.open(unique_name("new"), owner=unique_name("o").encode())


# --- tests -------------------------------------------------------------------


def test_reclaim_during_grace_and_early_end(serve):
    """RFC 8881 sections 8.4.2, 18.16.3 (CLAIM_PREVIOUS), 18.10.3 (reclaim),
    18.51.3 (RECLAIM_COMPLETE): clients A (open + write lock) and B (open of
    the same file) hold state when the server crashes. During grace: B's
    non-reclaim OPEN and LOCK get NFS4ERR_GRACE; A's old session is
    NFS4ERR_BADSESSION and its old stateid is refused (NFS4ERR_STALE_STATEID,
    or NFS4ERR_BAD_STATEID: section 15.1 calls NFS4ERR_STALE_STATEID moot in
    NFSv4.1, where the session already tells an earlier server instance); A and B reclaim with
    CLAIM_PREVIOUS and LOCK reclaim=true; RECLAIM_COMPLETE works once, then
    NFS4ERR_COMPLETE_ALREADY. With every known client complete, grace ends
    at once (long before --grace-time): B's LOCK is NFS4ERR_DENIED by A's
    reclaimed lock, and new OPENs work."""
    server = serve(LONG_GRACE)
    name = unique_name("shared")
    a = Holder(server, name, lock=True, verifier=b"grace-va")
    b = Holder(server, name, lock=False, verifier=b"grace-vb")

    server.restart()
    restarted = time.monotonic()

    with Client(server.port) as old:
        r = old.call([rc.op_sequence(a.old_session, 1), rc.op_putrootfh()])
        expect(r, St.BADSESSION, "A's session from before the restart")

    bc = b.come_back()
    expect(open_new_file(bc), St.GRACE, "B's non-reclaim OPEN during grace")
    r = expect_ok(b.reclaim_open(), "B's OPEN with CLAIM_PREVIOUS")
    b.open_sid = r.stateid
    expect(bc.lock(b.fh, b.open_sid, owner=b"b-lock-1", offset=0, length=100), St.GRACE, "B's non-reclaim LOCK during grace")

    ac = a.come_back()
    r = ac.compound([rc.op_putfh(a.fh), rc.op_read(0, 10, a.open_sid)])
    expect_in(r, (St.STALE_STATEID, St.BAD_STATEID), "READ with A's open stateid from before the restart")
    a.reclaim_all()
    expect(ac.compound([rc.op_reclaim_complete()]), St.COMPLETE_ALREADY, "A's second RECLAIM_COMPLETE")

    expect_ok(bc.compound([rc.op_reclaim_complete()]), "B's RECLAIM_COMPLETE")
    n = [0]

    def b_lock():
        n[0] += 1
        return bc.lock(b.fh, b.open_sid, owner=b"b-lock-%d" % (n[0] + 1), offset=50, length=10)

    r, when = poll(b_lock, lambda r: r.status != St.GRACE, "B's LOCK once all known clients completed", restarted + 8)
    expect(r, St.DENIED, "B's LOCK over A's reclaimed lock after grace ended")
    assert when - restarted < LONG_GRACE / 2, f"grace ended {when - restarted:.1f} s after the restart, not early"
    expect_ok(open_new_file(bc), "B's non-reclaim OPEN after grace")
    a.client.close()
    bc.close()


def test_claim_previous_from_unknown_client_is_reclaim_bad(serve):
    """RFC 8881 sections 8.4.2 and 15.1.9.4 (NFS4ERR_RECLAIM_BAD): during
    grace, a client that the server did not know before the restart (no
    stable record) reclaims with CLAIM_PREVIOUS: NFS4ERR_RECLAIM_BAD. (The
    Linux server answers so: nfs4_check_open_reclaim finds no record of the
    client. NFS4ERR_NO_GRACE is for a client past its RECLAIM_COMPLETE or a
    server out of grace.) Grace goes on: its non-reclaim OPEN after
    RECLAIM_COMPLETE is NFS4ERR_GRACE."""
    server = serve(LONG_GRACE)
    a = Holder(server, unique_name("known"), lock=False)
    server.restart()
    with Client(server.port) as stranger:
        stranger.establish(reclaim_complete=False)
        r = stranger.compound([rc.op_putfh(a.fh), rc.op_open(stranger.owner, claim=CLAIM_PREVIOUS)])
        expect(r, St.RECLAIM_BAD, "CLAIM_PREVIOUS by a client not known before the restart")
        expect_ok(stranger.compound([rc.op_reclaim_complete()]), "its RECLAIM_COMPLETE")
        expect(open_new_file(stranger), St.GRACE, "its non-reclaim OPEN while a known client has not come back")
    a.client.close()


def test_reclaim_after_own_reclaim_complete_is_no_grace(serve):
    """RFC 8881 section 18.51.3: after a client's RECLAIM_COMPLETE, its
    reclaims (OPEN with CLAIM_PREVIOUS, LOCK with reclaim=true) are
    NFS4ERR_NO_GRACE, although the server is still in grace for others (a
    newcomer's OPEN is NFS4ERR_GRACE)."""
    server = serve(LONG_GRACE)
    name = unique_name("own-rc")
    a = Holder(server, name, lock=True, verifier=b"grace-va")
    b = Holder(server, unique_name("other"), lock=False, verifier=b"grace-vb")  # keeps grace going
    server.restart()
    ac = a.come_back()
    r = expect_ok(a.reclaim_open(), "A's OPEN with CLAIM_PREVIOUS")
    expect_ok(ac.compound([rc.op_reclaim_complete()]), "A's RECLAIM_COMPLETE")
    expect(a.reclaim_open(owner=b"second-owner"), St.NO_GRACE, "A's CLAIM_PREVIOUS after its RECLAIM_COMPLETE")
    expect(a.reclaim_lock(r.stateid), St.NO_GRACE, "A's LOCK reclaim after its RECLAIM_COMPLETE")
    with newcomer(server) as c:
        expect(open_new_file(c), St.GRACE, "a newcomer's OPEN while B has not reclaimed")
    ac.close()
    b.client.close()


def test_reclaim_after_grace_ended_is_no_grace(serve):
    """RFC 8881 sections 8.4.2 and 15.1.9.3 (NFS4ERR_NO_GRACE): a client
    known from before that comes back only after grace has run out (seen by
    a newcomer's OPEN working) gets NFS4ERR_NO_GRACE for OPEN with
    CLAIM_PREVIOUS."""
    server = serve(SHORT_GRACE)
    a = Holder(server, unique_name("late"), lock=False)
    server.restart()
    restarted = time.monotonic()
    with newcomer(server) as c:
        poll(lambda: open_new_file(c), lambda r: r.status == St.OK, "a newcomer's OPEN until grace ends", restarted + SHORT_GRACE + 5)
    a.come_back()
    expect(a.reclaim_open(), St.NO_GRACE, "CLAIM_PREVIOUS after grace ended")
    a.client.close()


def test_reclaim_without_grace_is_no_grace(serve):
    """RFC 8881 sections 18.10.4 and 18.16.4: with no grace period
    (--grace-time 0), LOCK with reclaim=true and OPEN with CLAIM_PREVIOUS
    are NFS4ERR_NO_GRACE; the same LOCK without reclaim works."""
    server = serve(0)
    with Client(server.port) as a:
        a.establish()
        sid, fh = a.must_open(unique_name("nograce"))
        expect(a.lock(fh, sid, owner=b"reclaimer", reclaim=True), St.NO_GRACE, "LOCK reclaim=true outside grace")
        expect(a.compound([rc.op_putfh(fh), rc.op_open(b"prev-owner", claim=CLAIM_PREVIOUS)]), St.NO_GRACE, "CLAIM_PREVIOUS outside grace")
        expect_ok(a.lock(fh, sid, owner=b"locker"), "LOCK without reclaim")


def test_edge_condition_2_missed_grace_cannot_reclaim_later(serve):
    """RFC 8881 section 8.4.3, edge condition 2: client A holds state, the
    server restarts, A does not come back during that grace period (grace
    runs out, seen by a newcomer's OPEN working), the server restarts again:
    A must not reclaim in the second grace period (the first grace may have
    let others take conflicting state): NFS4ERR_RECLAIM_BAD or
    NFS4ERR_NO_GRACE."""
    server = serve(SHORT_GRACE)
    a = Holder(server, unique_name("edge2"), lock=True)
    server.restart()
    restarted = time.monotonic()
    with newcomer(server) as c:
        poll(lambda: open_new_file(c), lambda r: r.status == St.OK, "a newcomer's OPEN until the first grace ends", restarted + SHORT_GRACE + 5)
    server.restart()
    a.come_back()
    expect_in(a.reclaim_open(), (St.RECLAIM_BAD, St.NO_GRACE), "CLAIM_PREVIOUS in the grace period after the one A missed")
    a.client.close()


def test_reclaim_after_each_of_two_restarts(serve):
    """RFC 8881 section 8.4.2: a client that reclaims (OPEN CLAIM_PREVIOUS,
    LOCK reclaim, RECLAIM_COMPLETE) after a restart is still known at the
    next restart and reclaims again; its lock then holds against a
    newcomer (NFS4ERR_DENIED once grace ends, which is early, as the only
    known client completed)."""
    server = serve(LONG_GRACE)
    a = Holder(server, unique_name("twice"), lock=True)
    for i in (1, 2):
        server.restart()
        a.come_back()
        a.reclaim_all()
    restarted = time.monotonic()
    with newcomer(server) as c:
        sid, _ = c.must_open(a.name)
        r, when = poll(lambda: c.lock(a.fh, sid, owner=unique_name("c").encode(), offset=0, length=10), lambda r: r.status != St.GRACE, "a newcomer's LOCK", restarted + 8)
        expect(r, St.DENIED, "a newcomer's LOCK over A's twice-reclaimed lock")
    a.client.close()


def test_grace_ends_on_time_without_a_known_client(serve):
    """RFC 8881 section 8.4.2: when a client known from before never comes
    back, grace lasts its full length (--grace-time) and then ends: a
    newcomer's OPEN is NFS4ERR_GRACE until then and works after."""
    server = serve(SHORT_GRACE + 1)
    a = Holder(server, unique_name("absent"), lock=False)
    a.client.close()
    server.restart()
    restarted = time.monotonic()
    with newcomer(server) as c:
        expect(open_new_file(c), St.GRACE, "a newcomer's OPEN just after the restart")
        r, when = poll(lambda: open_new_file(c), lambda r: r.status != St.GRACE, "a newcomer's OPEN until grace ends", restarted + SHORT_GRACE + 1 + 5)
        expect_ok(r, "a newcomer's OPEN after grace")
        took = when - restarted
        assert took >= SHORT_GRACE + 1 - 1.0, f"grace ended after {took:.1f} s, before --grace-time {SHORT_GRACE + 1} while a known client was missing"


def test_grace_holds_back_everything_that_could_conflict_with_a_reclaim(serve):
    """RFC 8881 section 8.4.2.1 (as the Linux server does it): while a known
    client has not reclaimed, a newcomer's LOCKT, REMOVE and RENAME get
    NFS4ERR_GRACE, and so do WRITE with the anonymous stateid and READ with
    it; READ with the bypass stateid (all ones) is served; an OPEN that
    would create gets NFS4ERR_GRACE and creates nothing. Once the known
    client has reclaimed, all of them work."""
    server = serve(LONG_GRACE)
    name = unique_name("held")
    a = Holder(server, name)
    (server.export / "victim").write_bytes(b"v")
    server.restart()
    bypass = rc.Packer().u32(0xFFFFFFFF).fixed(b"\xff" * 12).bytes()
    with newcomer(server) as c:
        root = c.root_fh()
        file_fh = a.fh
        checks = {
            "LOCKT": [rc.op_putfh(file_fh), rc.op_lockt(b"someone", 0, 10)],
            "REMOVE": [rc.op_putfh(root), rc.op_remove("victim")],
            "RENAME": [rc.op_putfh(root), rc.op_savefh(), rc.op_rename("victim", "victim2")],
            "anonymous WRITE": [rc.op_putfh(file_fh), rc.op_write(0, b"x")],
            "anonymous READ": [rc.op_putfh(file_fh), rc.op_read(0, 1)],
            "OPEN that creates": [rc.op_putfh(root), rc.op_open(b"newcomer", "made-in-grace", create=True)],
        }
        for what, ops in checks.items():
            expect(c.compound(ops), St.GRACE, f"{what} during grace")
        # Refused before anything was done: the OPEN made no file.
        assert not (server.export / "made-in-grace").exists(), "an OPEN refused with NFS4ERR_GRACE created its file"
        expect_ok(c.compound([rc.op_putfh(file_fh), rc.op_read(0, 1, stateid=bypass)]), "READ with the bypass stateid during grace")
        a.come_back()
        a.reclaim_all()
        expect(c.compound(checks["LOCKT"]), St.DENIED, "LOCKT against the reclaimed lock after grace")
        for what in ("anonymous READ", "anonymous WRITE", "RENAME"):
            expect_ok(c.compound(checks[what]), f"{what} after grace")
    assert (server.export / "victim2").read_bytes() == b"v"
