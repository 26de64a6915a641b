"""Read delegations (RFC 8881 section 10.2), over raw RPC.

A client whose back channel answered the server's probe gets a read
delegation when it opens a file for reading and nobody else writes it.
Another client's change to the file (an OPEN for writing, WRITE, SETATTR
of the size, REMOVE, RENAME) recalls it: the server sends CB_RECALL (after
CB_SEQUENCE) over the holder's back channel and answers the change
NFS4ERR_DELAY until the holder gives the delegation back with DELEGRETURN.
A holder that does not is revoked a lease after the recall: the change
goes through, the holder's SEQUENCE carries
SEQ4_STATUS_RECALLABLE_STATE_REVOKED, TEST_STATEID says
NFS4ERR_DELEG_REVOKED, and FREE_STATEID clears it.

Waiting out a lease is the behaviour under test where it happens; other
waits poll with a deadline.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

import rpcclient as rc
from rpcclient import (
    ANONYMOUS_STATEID,
    CLAIM_DELEG_CUR_FH,
    OPEN4_SHARE_ACCESS_BOTH,
    OPEN4_SHARE_ACCESS_READ,
    Client,
    Packer,
    St,
    expect,
    expect_ok,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

LEASE = 3
CONN_BACK_CHAN = 0x2
PROGRAM = 0x40000000
OPEN_DELEGATE_NONE, OPEN_DELEGATE_READ, OPEN_DELEGATE_NONE_EXT = 0, 1, 3
WANT_NO_DELEG = 0x0400
WND4_NOT_WANTED = 0
RECALLABLE_STATE_REVOKED = 0x40
CB_COMPOUND, CB_SEQUENCE, CB_RECALL = 1, 11, 4


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, "--lease-time", LEASE, metrics=True, root_squash=False)


def counter(srv, name: str) -> float:
    return srv.counter(name)


def holder(srv, minor: int = 1) -> Client:
    """A client with a back channel that answered the probe; its session
    made with a COMPOUND of minor version `minor`."""
    c = Client(srv.port)
    expect_ok(c.exchange_id(), "EXCHANGE_ID")
    r = c.create_session(flags=CONN_BACK_CHAN, cb_program=PROGRAM, sec=[rc.cb_sec_sys(machine="holder")], minor=minor)
    expect_ok(r, "CREATE_SESSION with a back channel")
    call = c.conn.next_call(timeout=10)
    assert call.proc == 0, f"expected the CB_NULL probe first: {call!r}"
    c.conn.answer(call)
    deadline = time.monotonic() + 10
    while counter(srv, "sluice_callbacks") < 1:
        assert time.monotonic() < deadline, "the probe's answer was not taken"
        time.sleep(0.05)
    expect_ok(c.compound([rc.op_reclaim_complete()]), "RECLAIM_COMPLETE")
    return c


def other(srv) -> Client:
    return Client(srv.port).establish()


def make_file(srv, name: str, data: bytes = b"original\n"):
    p = srv.export / name
    p.write_bytes(data)
    return p


def open_read(c: Client, name: str, access: int = OPEN4_SHARE_ACCESS_READ):
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/o", name, access=access), rc.op_getfh()])
    expect_ok(r, f"OPEN {name}")
    return r[2], r[3].fh


def read_delegation(c: Client, name: str):
    o, fh = open_read(c, name)
    assert o.deleg_type == OPEN_DELEGATE_READ, f"no read delegation for {name}: {o.deleg_type}"
    return o.stateid, o.deleg_stateid, fh


def delegated(srv, name: str = "f"):
    """A file and a holder of a read delegation on it: (holder, delegation
    stateid, filehandle)."""
    make_file(srv, name)
    h = holder(srv)
    _, deleg, fh = read_delegation(h, name)
    return h, deleg, fh


def cb_reply(call: rc.RpcCall, ops_ok: int = 1) -> bytes:
    """CB_COMPOUND4res answering CB_SEQUENCE and `ops_ok` more ops OK."""
    u = rc.Unpacker(call.args)
    u.opaque()  # tag
    u.u32()  # minorversion
    u.u32()  # callback_ident
    n = u.u32()
    assert u.u32() == CB_SEQUENCE
    sessionid, seq, slot = u.fixed(16), u.u32(), u.u32()
    p = Packer().u32(0).opaque(b"").u32(1 + ops_ok)
    p.u32(CB_SEQUENCE).u32(0).fixed(sessionid).u32(seq).u32(slot).u32(0).u32(0)
    assert n == 1 + ops_ok
    return p.bytes()


def recall_of(call: rc.RpcCall, minor: int = 1) -> tuple[bytes, bytes]:
    """(stateid, fh) of the CB_RECALL in a CB_COMPOUND, which must carry
    the minor version of the holder's session."""
    assert (call.prog, call.proc) == (PROGRAM, CB_COMPOUND), call
    u = rc.Unpacker(call.args)
    u.opaque()
    assert u.u32() == minor, "CB_COMPOUND minor version is not the session's"
    u.u32()
    assert u.u32() == 2, "CB_SEQUENCE and CB_RECALL"
    assert u.u32() == CB_SEQUENCE
    u.fixed(16)
    seq, slot = u.u32(), u.u32()
    assert slot == 0 and seq >= 1
    u.u32()
    u.bool()
    assert u.u32() == 0, "no referring calls"
    assert u.u32() == CB_RECALL
    sid, _truncate, fh = u.fixed(16), u.bool(), u.opaque()
    return sid, fh


def retry_until_ok(fn, what: str, deadline: float):
    """fn() while it answers NFS4ERR_DELAY; the first other answer."""
    end = time.monotonic() + deadline
    while True:
        r = fn()
        if r.status != St.DELAY:
            return r
        assert time.monotonic() < end, f"{what}: still NFS4ERR_DELAY after {deadline} s"
        time.sleep(0.1)


def test_read_open_gets_a_read_delegation_that_reads(srv):
    h, deleg, fh = delegated(srv)
    r = h.compound([rc.op_putfh(fh), rc.op_read(0, 100, stateid=deleg)])
    expect_ok(r, "READ with the delegation stateid")
    assert r[2].data == b"original\n"
    assert h.test_stateids([deleg]) == [St.OK]
    assert counter(srv, "sluice_delegations_granted") == 1
    assert srv.metrics()["sluice_delegations"] == 1


def test_no_delegation_without_a_back_channel_or_for_writers(srv):
    make_file(srv, "f")
    c = other(srv)  # no back channel
    o, _ = open_read(c, "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE
    h = holder(srv)
    o, _ = open_read(h, "f", access=OPEN4_SHARE_ACCESS_BOTH)
    assert o.deleg_type == OPEN_DELEGATE_NONE, "a read-write open got a delegation"
    r = h.compound([rc.op_putrootfh(), rc.op_open(h.owner + b"/w", "f", access=OPEN4_SHARE_ACCESS_READ | WANT_NO_DELEG)])
    expect_ok(r, "OPEN with WANT_NO_DELEG")
    assert (r[2].deleg_type, r[2].why) == (OPEN_DELEGATE_NONE_EXT, WND4_NOT_WANTED)


def test_no_delegation_while_another_client_writes(srv):
    make_file(srv, "f")
    w = other(srv)
    open_read(w, "f", access=OPEN4_SHARE_ACCESS_BOTH)
    h = holder(srv)
    o, _ = open_read(h, "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE


def test_delegations_none_grants_nothing(sluice_factory):
    s = sluice_factory("--grace-time", 0, "--delegations", "none", metrics=True, root_squash=False)
    make_file(s, "f")
    o, _ = open_read(holder(s), "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE


@pytest.mark.parametrize("change", ["open-write", "write", "setattr-size", "remove", "rename", "rename-over"])
def test_conflicting_change_recalls_and_waits_for_delegreturn(srv, change):
    h, deleg, fh = delegated(srv)
    w = other(srv)
    root = w.root_fh()
    if change == "rename-over":
        # Another name renamed onto the delegated file's replaces it.
        make_file(srv, "g")

    def attempt():
        if change == "open-write":
            return w.compound([rc.op_putrootfh(), rc.op_open(w.owner + b"/o", "f", access=OPEN4_SHARE_ACCESS_BOTH)])
        if change == "write":
            return w.compound([rc.op_putfh(fh), rc.op_write(0, b"CHANGED!\n", stable=2)])
        if change == "setattr-size":
            size = rc.fattr4([1 << 4], (0).to_bytes(8, "big"))
            return w.compound([rc.op_putfh(fh), (rc.Op.SETATTR, ANONYMOUS_STATEID + size)])
        if change == "remove":
            return w.compound([rc.op_putfh(root), rc.op_remove("f")])
        if change == "rename-over":
            return w.compound([rc.op_putfh(root), rc.op_savefh(), rc.op_putfh(root), rc.op_rename("g", "f")])
        return w.compound([rc.op_putfh(root), rc.op_savefh(), rc.op_putfh(root), rc.op_rename("f", "g")])

    expect(attempt(), St.DELAY, f"{change} while another client holds a read delegation")
    call = h.conn.next_call(timeout=10)
    sid, rfh = recall_of(call)
    assert (sid, rfh) == (deleg, fh), "CB_RECALL names another delegation or file"
    h.conn.answer(call, cb_reply(call))
    expect(attempt(), St.DELAY, f"{change} before the delegation is back")
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    expect_ok(attempt(), f"{change} after DELEGRETURN")
    assert counter(srv, "sluice_delegations_recalled") == 1
    assert counter(srv, "sluice_delegations_returned") == 1
    assert h.test_stateids([deleg]) == [St.BAD_STATEID]


def test_holder_may_open_under_its_delegation_during_the_recall(srv):
    h, deleg, fh = delegated(srv)
    w = other(srv)
    expect(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), St.DELAY, "WRITE by another client")
    call = h.conn.next_call(timeout=10)
    h.conn.answer(call, cb_reply(call))
    r = h.compound([rc.op_putfh(fh), rc.op_open(h.owner + b"/local", access=OPEN4_SHARE_ACCESS_READ, claim=CLAIM_DELEG_CUR_FH, deleg_stateid=deleg)])
    expect_ok(r, "OPEN CLAIM_DELEG_CUR_FH during the recall")
    assert r[2].deleg_type == OPEN_DELEGATE_NONE
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    expect_ok(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), "WRITE after DELEGRETURN")


def test_holder_ignoring_the_recall_is_revoked_after_a_lease(srv):
    h, deleg, fh = delegated(srv)
    w = other(srv)
    started = time.monotonic()
    expect(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), St.DELAY, "WRITE by another client")
    call = h.conn.next_call(timeout=10)
    recall_of(call)  # never answered, never returned
    # Meanwhile the server serves everyone else.
    make_file(srv, "g")
    expect_ok(w.compound([rc.op_putrootfh(), rc.op_open(w.owner + b"/g", "g", access=OPEN4_SHARE_ACCESS_BOTH)]), "OPEN of another file")
    r = retry_until_ok(lambda: w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), "WRITE", LEASE + 10)
    expect_ok(r, "WRITE once the delegation is revoked")
    assert time.monotonic() - started >= LEASE - 0.5, "revoked before a lease had passed"
    assert counter(srv, "sluice_delegations_revoked") == 1
    r = h.sequence()
    expect_ok(r, "holder's SEQUENCE")
    assert r[0].status_flags & RECALLABLE_STATE_REVOKED
    assert h.test_stateids([deleg]) == [St.DELEG_REVOKED]
    expect(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), St.DELEG_REVOKED, "DELEGRETURN of a revoked delegation")
    expect_ok(h.compound([rc.op_free_stateid(deleg)]), "FREE_STATEID of the revoked delegation")
    r = h.sequence()
    assert r[0].status_flags & RECALLABLE_STATE_REVOKED == 0
    assert h.test_stateids([deleg]) == [St.BAD_STATEID]


def test_reads_by_others_do_not_recall(srv):
    h, _, fh = delegated(srv)
    r = other(srv)
    o, _ = open_read(r, "f")
    expect_ok(r.compound([rc.op_putfh(fh), rc.op_read(0, 10)]), "READ by another client")
    with pytest.raises(socket.timeout):
        h.conn.next_call(timeout=1)
    assert counter(srv, "sluice_delegations_recalled") == 0


def test_no_new_delegation_on_a_file_just_recalled(srv):
    """A holder that took a delegation back at once could keep a writer
    waiting for ever; for a lease after a recall the file gets none."""
    h, deleg, fh = delegated(srv)
    w = other(srv)
    expect(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), St.DELAY, "WRITE by another client")
    call = h.conn.next_call(timeout=10)
    h.conn.answer(call, cb_reply(call))
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    o, _ = open_read(h, "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE, "a delegation again right after its recall"
    expect_ok(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), "WRITE after DELEGRETURN")


def test_local_writer_waits_for_the_recall(srv):
    """A process on the server machine that opens a delegated file for
    writing is held back by the kernel lease until the holder returns the
    delegation; the holder gets CB_RECALL."""
    import threading

    path = make_file(srv, "f")
    h = holder(srv)
    _, deleg, fh = read_delegation(h, "f")
    opened = threading.Event()
    at: dict[str, float] = {}

    def local_writer():
        with open(path, "r+b") as f:
            at["opened"] = time.monotonic()
            opened.set()
            f.write(b"LOCAL")

    t = threading.Thread(target=local_writer, daemon=True)
    t.start()
    call = h.conn.next_call(timeout=10)
    sid, rfh = recall_of(call)
    assert (sid, rfh) == (deleg, fh)
    h.conn.answer(call, cb_reply(call))
    assert not opened.is_set(), "the local open went ahead while the delegation was out"
    at["returned"] = time.monotonic()
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    assert opened.wait(10), "the local open still waits after DELEGRETURN"
    t.join(10)
    assert at["opened"] >= at["returned"]
    assert path.read_bytes().startswith(b"LOCAL")
    assert counter(srv, "sluice_delegations_recalled") == 1


def test_no_delegation_while_a_local_process_writes(srv):
    path = make_file(srv, "f")
    with open(path, "r+b"):
        o, _ = open_read(holder(srv), "f")
        assert o.deleg_type == OPEN_DELEGATE_NONE, "a delegation while a local process has the file open for writing"


def test_recall_carries_the_minor_version_of_the_session(srv):
    """The Linux client refuses a CB_COMPOUND whose minor version is not
    its own (CB_SEQUENCE gets NFS4ERR_BADSESSION): an NFSv4.2 client's
    recall is minor version 2."""
    make_file(srv, "f")
    h = holder(srv, minor=2)
    _, deleg, fh = read_delegation(h, "f")
    w = other(srv)
    expect(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), St.DELAY, "WRITE by another client")
    call = h.conn.next_call(timeout=10)
    assert recall_of(call, minor=2) == (deleg, fh)
    h.conn.answer(call, cb_reply(call))
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")


def test_refused_cb_sequence_puts_the_path_down(srv):
    """A holder whose back channel refuses CB_SEQUENCE (NFS4ERR_BADSESSION,
    what a client answers a call it cannot place) is told its back channel
    is down, and gets no more delegations."""
    h, deleg, fh = delegated(srv)
    w = other(srv)
    expect(w.compound([rc.op_putfh(fh), rc.op_write(0, b"x")]), St.DELAY, "WRITE by another client")
    call = h.conn.next_call(timeout=10)
    recall_of(call)
    h.conn.answer(call, Packer().u32(St.BADSESSION).opaque(b"").u32(1).u32(CB_SEQUENCE).u32(St.BADSESSION).bytes())
    deadline = time.monotonic() + 10
    while h.sequence()[0].status_flags & 0x1 == 0:
        assert time.monotonic() < deadline, "no SEQ4_STATUS_CB_PATH_DOWN after a refused CB_SEQUENCE"
        time.sleep(0.05)
    make_file(srv, "g")
    o, _ = open_read(h, "g")
    assert o.deleg_type == OPEN_DELEGATE_NONE
