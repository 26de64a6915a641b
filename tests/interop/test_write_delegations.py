"""Write delegations and CB_GETATTR (RFC 8881 sections 10.4 and 20.1),
and delegations reclaimed after a restart, over raw RPC.

With `--delegations all`, a client whose back channel answered the probe
gets a write delegation when it opens a file with write access and no
other client has the file open. Any access by another client (an OPEN, a
READ, a change) or a local process opening the file recalls it; the
holder writes back what it kept, then returns it, and the other client
sees the holder's data. Another client's GETATTR of the size or change
attribute asks the holder with CB_GETATTR instead of recalling.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import rpcclient as rc
from rpcclient import (
    ANONYMOUS_STATEID,
    CLAIM_PREVIOUS,
    OPEN4_SHARE_ACCESS_BOTH,
    OPEN4_SHARE_ACCESS_READ,
    Client,
    Packer,
    St,
    expect,
    expect_ok,
)
from test_delegations import (
    CB_COMPOUND,
    CB_SEQUENCE,
    CONN_BACK_CHAN,
    PROGRAM,
    cb_reply,
    counter,
    holder,
    make_file,
    other,
    recall_of,
    retry_until_ok,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

LEASE = 3
OPEN_DELEGATE_NONE, OPEN_DELEGATE_READ, OPEN_DELEGATE_WRITE, OPEN_DELEGATE_NONE_EXT = 0, 1, 2, 3
WANT_WRITE_DELEG = 0x0200
WND4_RESOURCE = 2
CB_GETATTR = 3
CHANGE_SIZE = ((1 << 3) | (1 << 4),)


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, "--lease-time", LEASE, "--delegations", "all", metrics=True, root_squash=False)


def open_rw(c: Client, name: str, access: int = OPEN4_SHARE_ACCESS_BOTH):
    """OPEN `name`; (OPEN result, fh, change attribute after it)."""
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/o", name, access=access), rc.op_getfh(), rc.op_getattr(CHANGE_SIZE)])
    expect_ok(r, f"OPEN {name}")
    change = int.from_bytes(r[4].attrvals[:8], "big")
    return r[2], r[3].fh, change


def write_delegated(srv, name: str = "f", data: bytes = b"original\n"):
    """A file and a holder of a write delegation on it: (holder, open
    stateid, delegation stateid, fh, change attribute when granted)."""
    make_file(srv, name, data)
    h = holder(srv)
    o, fh, change = open_rw(h, name)
    assert o.deleg_type == OPEN_DELEGATE_WRITE, f"no write delegation: {o.deleg_type}"
    assert not o.recall
    assert o.space_limit == 0, "the client is to write back when it closes"
    return h, o.stateid, o.deleg_stateid, fh, change


def cb_getattr_of(call: rc.RpcCall) -> bytes:
    """The fh of the CB_GETATTR in a CB_COMPOUND (after CB_SEQUENCE); it
    must ask for the change attribute and the size."""
    assert (call.prog, call.proc) == (PROGRAM, CB_COMPOUND), call
    u = rc.Unpacker(call.args)
    u.opaque()
    u.u32()
    u.u32()
    assert u.u32() == 2, "CB_SEQUENCE and CB_GETATTR"
    assert u.u32() == CB_SEQUENCE
    u.fixed(16)
    u.u32(), u.u32(), u.u32(), u.bool()
    assert u.u32() == 0
    assert u.u32() == CB_GETATTR, "not a CB_GETATTR"
    fh = u.opaque()
    assert u.bitmap() == list(CHANGE_SIZE), "CB_GETATTR does not ask for change and size"
    return fh


def cb_getattr_reply(call: rc.RpcCall, change: int, size: int) -> bytes:
    vals = change.to_bytes(8, "big") + size.to_bytes(8, "big")
    return cb_reply(call) + Packer().u32(CB_GETATTR).u32(0).bytes() + rc.fattr4(list(CHANGE_SIZE), vals)


def in_thread(fn):
    """Runs fn() on a thread; returns a function that waits for its result."""
    out: dict = {}

    def run():
        try:
            out["r"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def result(timeout: float = 10):
        t.join(timeout)
        assert not t.is_alive(), "the call did not finish"
        if "e" in out:
            raise out["e"]
        return out["r"]

    return result


def sizes_and_change(r) -> tuple[int, int]:
    vals = r[2].attrvals
    return int.from_bytes(vals[:8], "big"), int.from_bytes(vals[8:16], "big")


def test_read_write_open_gets_a_write_delegation_that_reads_and_writes(srv):
    h, _, deleg, fh, _ = write_delegated(srv)
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_write(0, b"HOLDER", stable=2, stateid=deleg)]), "WRITE with the delegation stateid")
    r = h.compound([rc.op_putfh(fh), rc.op_read(0, 100, stateid=deleg)])
    expect_ok(r, "READ with the delegation stateid")
    assert r[2].data == b"HOLDERal\n"
    assert counter(srv, "sluice_delegations_granted") == 1
    assert counter(srv, "sluice_write_delegations_granted") == 1
    assert srv.metrics()["sluice_write_delegations"] == 1


def test_write_delegations_only_with_delegations_all(sluice_factory):
    s = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)  # the default: read
    make_file(s, "f")
    h = holder(s)
    o, _, _ = open_rw(h, "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE
    r = h.compound([rc.op_putrootfh(), rc.op_open(h.owner + b"/w", "f", access=OPEN4_SHARE_ACCESS_BOTH | WANT_WRITE_DELEG)])
    expect_ok(r, "OPEN with WANT_WRITE_DELEG")
    assert (r[2].deleg_type, r[2].why) == (OPEN_DELEGATE_NONE_EXT, WND4_RESOURCE)


def test_no_write_delegation_while_another_client_has_the_file_open(srv):
    make_file(srv, "f")
    r = other(srv)
    expect_ok(r.compound([rc.op_putrootfh(), rc.op_open(r.owner + b"/o", "f", access=OPEN4_SHARE_ACCESS_READ)]), "OPEN by another client")
    o, _, _ = open_rw(holder(srv), "f")
    assert o.deleg_type == OPEN_DELEGATE_NONE, "a write delegation while another client has the file open"


def test_no_write_delegation_while_a_local_process_has_the_file_open(srv):
    path = make_file(srv, "f")
    with open(path, "rb"):
        o, _, _ = open_rw(holder(srv), "f")
        assert o.deleg_type == OPEN_DELEGATE_NONE, "a write delegation while a local process has the file open"


def test_a_write_delegation_after_another_clients_file_sync_writes(srv):
    """Stable WRITEs keep a descriptor of the file to flush through for
    the next ones (read-only, held after CLOSE). The kernel grants a write
    lease only to the one open of a file, so OPEN closes it first: the next
    client to open the file alone still gets a write delegation."""
    make_file(srv, "f")
    w = other(srv)
    o, fh, _ = open_rw(w, "f")
    for k in range(4):
        expect_ok(w.compound([rc.op_putfh(fh), rc.op_write(k * 8192, os.urandom(8192), stable=2, stateid=o.stateid)]),
                  "FILE_SYNC WRITE")
    assert counter(srv, "sluice_flush_witnesses_opened") == 1, "the stable WRITEs kept no descriptor: nothing to check"
    expect_ok(w.compound([rc.op_putfh(fh), rc.op_close(o.stateid)]), "CLOSE")
    o, _, _ = open_rw(holder(srv), "f")
    assert o.deleg_type == OPEN_DELEGATE_WRITE, "no write delegation after another client's FILE_SYNC WRITEs and CLOSE"


@pytest.mark.parametrize("access", ["open-read", "read-anonymous", "write"])
def test_any_access_by_another_client_recalls_and_sees_the_holders_data(srv, access):
    h, _, deleg, fh, _ = write_delegated(srv)
    o = other(srv)

    def attempt():
        if access == "open-read":
            return o.compound([rc.op_putfh(fh), rc.op_open(o.owner + b"/o", access=OPEN4_SHARE_ACCESS_READ, claim=4), rc.op_read(0, 100)])
        if access == "read-anonymous":
            return o.compound([rc.op_putfh(fh), rc.op_read(0, 100, stateid=ANONYMOUS_STATEID)])
        return o.compound([rc.op_putfh(fh), rc.op_write(9, b"OTHER\n", stable=2)])

    expect(attempt(), St.DELAY, f"{access} while another client holds a write delegation")
    call = h.conn.next_call(timeout=10)
    assert recall_of(call) == (deleg, fh)
    # What the holder kept goes back before the delegation does.
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_write(0, b"HOLDER", stateid=deleg), rc.op_commit()]), "the holder's WRITE and COMMIT during the recall")
    h.conn.answer(call, cb_reply(call))
    expect(attempt(), St.DELAY, f"{access} before the delegation is back")
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    r = retry_until_ok(attempt, access, 10)
    expect_ok(r, f"{access} after DELEGRETURN")
    if access == "write":
        assert (srv.export / "f").read_bytes() == b"HOLDERal\nOTHER\n"
    else:
        assert r[-1].data == b"HOLDERal\n", "the other client does not see the holder's data"
    assert counter(srv, "sluice_delegations_recalled") == 1


def test_getattr_by_another_client_asks_the_holder(srv):
    """CB_GETATTR: while the holder says it changed the file, another
    client's GETATTR reports the holder's size and a new change attribute;
    when the holder says it did not, the server's own."""
    h, _, deleg, fh, change = write_delegated(srv)
    o = other(srv)
    before = sizes_and_change(expect_ok(h.compound([rc.op_putfh(fh), rc.op_getattr(CHANGE_SIZE)]), "holder's GETATTR"))
    assert before == (change, 9)
    # The holder has not changed the file: the server's own attributes.
    result = in_thread(lambda: o.compound([rc.op_putfh(fh), rc.op_getattr(CHANGE_SIZE)]))
    call = h.conn.next_call(timeout=10)
    assert cb_getattr_of(call) == fh
    h.conn.answer(call, cb_getattr_reply(call, change, 9))
    r = expect_ok(result(), "GETATTR by another client")
    assert sizes_and_change(r) == (change, 9)
    # It wrote 1 MiB it keeps: its size, and the change attribute moves.
    result = in_thread(lambda: o.compound([rc.op_putfh(fh), rc.op_getattr(CHANGE_SIZE)]))
    call = h.conn.next_call(timeout=10)
    cb_getattr_of(call)
    h.conn.answer(call, cb_getattr_reply(call, change + 1, 1 << 20))
    r = expect_ok(result(), "GETATTR by another client")
    new_change, size = sizes_and_change(r)
    assert size == 1 << 20, "GETATTR does not report the holder's size"
    assert new_change != change, "GETATTR reports the old change attribute for a file the holder changed"
    assert (srv.export / "f").stat().st_size == 9
    assert counter(srv, "sluice_delegations_recalled") == 0
    assert h.test_stateids([deleg]) == [St.OK]


def test_cb_getattr_refused_recalls(srv):
    h, _, deleg, fh, _ = write_delegated(srv)
    o = other(srv)
    result = in_thread(lambda: o.compound([rc.op_putfh(fh), rc.op_getattr(CHANGE_SIZE)]))
    call = h.conn.next_call(timeout=10)
    cb_getattr_of(call)
    h.conn.answer(call, cb_reply(call) + Packer().u32(CB_GETATTR).u32(St.BADHANDLE).bytes())
    expect(result(), St.DELAY, "GETATTR when the holder refused CB_GETATTR")
    call = h.conn.next_call(timeout=10)
    assert recall_of(call) == (deleg, fh)
    h.conn.answer(call, cb_reply(call))
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    expect_ok(retry_until_ok(lambda: o.compound([rc.op_putfh(fh), rc.op_getattr(CHANGE_SIZE)]), "GETATTR", 10), "GETATTR after DELEGRETURN")


def test_local_reader_waits_for_the_holders_data(srv):
    """A process on the server machine that opens the file, even for
    reading, is held back by the kernel write lease until the holder has
    written back and returned the delegation; it then reads the holder's
    data."""
    h, _, deleg, fh, _ = write_delegated(srv)
    # What the holder does through the server keeps the lease: READ,
    # WRITE, COMMIT, and SETATTR of the size with its stateid.
    size = rc.fattr4([1 << 4], (20).to_bytes(8, "big"))
    r = h.compound([rc.op_putfh(fh), rc.op_read(0, 100, stateid=deleg), rc.op_write(0, b"HOLDER", stateid=deleg),
                    rc.op_commit(), (rc.Op.SETATTR, deleg + size)])
    expect_ok(r, "the holder's READ, WRITE, COMMIT and SETATTR")
    path = srv.export / "f"
    got: dict[str, bytes] = {}
    opened = threading.Event()

    def local_reader():
        with open(path, "rb") as f:
            opened.set()
            got["data"] = f.read()

    t = threading.Thread(target=local_reader, daemon=True)
    t.start()
    call = h.conn.next_call(timeout=10)
    assert recall_of(call) == (deleg, fh)
    h.conn.answer(call, cb_reply(call))
    assert not opened.is_set(), "the local open went ahead while the write delegation was out"
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_write(9, b"MORE", stateid=deleg), rc.op_commit()]), "the holder's WRITE and COMMIT during the recall")
    assert not opened.is_set(), "the local open went ahead before DELEGRETURN"
    expect_ok(h.compound([rc.op_putfh(fh), rc.op_delegreturn(deleg)]), "DELEGRETURN")
    t.join(10)
    assert got.get("data") == b"HOLDERal\nMORE" + bytes(7), "the local reader did not see the holder's data"


def test_delegations_are_reclaimed_after_a_restart(sluice_factory):
    """OPEN CLAIM_PREVIOUS with a delegation type, during grace, gets that
    delegation back (recall false: the back channel is up), which then
    writes; the server was killed with SIGKILL."""
    s = sluice_factory("--grace-time", 20, "--lease-time", 10, "--delegations", "all", metrics=True, root_squash=False)
    make_file(s, "w")
    make_file(s, "r")
    # The first start has grace too: the holder is new, so it ends at once.
    h = holder(s)
    ow, fhw, _ = open_rw(h, "w")
    assert ow.deleg_type == OPEN_DELEGATE_WRITE
    r = h.compound([rc.op_putrootfh(), rc.op_open(h.owner + b"/r", "r", access=OPEN4_SHARE_ACCESS_READ), rc.op_getfh()])
    expect_ok(r, "OPEN r")
    assert r[2].deleg_type == OPEN_DELEGATE_READ
    fhr = r[3].fh
    s.restart()
    h.reconnect()
    expect_ok(h.exchange_id(), "EXCHANGE_ID after the restart")
    expect_ok(h.create_session(flags=CONN_BACK_CHAN, cb_program=PROGRAM, sec=[rc.cb_sec_sys(machine="holder")]), "CREATE_SESSION")
    call = h.conn.next_call(timeout=10)
    assert call.proc == 0
    h.conn.answer(call)
    deadline = time.monotonic() + 10
    while counter(s, "sluice_callbacks") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = h.compound([rc.op_putfh(fhw), rc.op_open(h.owner + b"/o", claim=CLAIM_PREVIOUS, access=OPEN4_SHARE_ACCESS_BOTH, delegate_type=OPEN_DELEGATE_WRITE)])
    expect_ok(r, "OPEN CLAIM_PREVIOUS of a write delegation")
    assert (r[2].deleg_type, r[2].recall) == (OPEN_DELEGATE_WRITE, False)
    wdeleg = r[2].deleg_stateid
    r = h.compound([rc.op_putfh(fhr), rc.op_open(h.owner + b"/r", claim=CLAIM_PREVIOUS, access=OPEN4_SHARE_ACCESS_READ, delegate_type=OPEN_DELEGATE_READ)])
    expect_ok(r, "OPEN CLAIM_PREVIOUS of a read delegation")
    assert r[2].deleg_type == OPEN_DELEGATE_READ
    expect_ok(h.compound([rc.op_putfh(fhw), rc.op_write(0, b"KEPT", stable=2, stateid=wdeleg)]), "WRITE with the reclaimed delegation")
    expect_ok(h.compound([rc.op_reclaim_complete()]), "RECLAIM_COMPLETE")
    # Still a delegation: another client's read recalls it, and then reads
    # what the holder wrote.
    o = other(s)

    def read():
        return o.compound([rc.op_putfh(fhw), rc.op_read(0, 100, stateid=ANONYMOUS_STATEID)])

    expect(read(), St.DELAY, "READ by another client")
    call = h.conn.next_call(timeout=10)
    assert recall_of(call) == (wdeleg, fhw)
    h.conn.answer(call, cb_reply(call))
    expect_ok(h.compound([rc.op_putfh(fhw), rc.op_delegreturn(wdeleg)]), "DELEGRETURN")
    r = expect_ok(retry_until_ok(read, "READ", 10), "READ after DELEGRETURN")
    assert r[2].data == b"KEPTinal\n"
