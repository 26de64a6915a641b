"""Server-side COPY (RFC 7862 sections 15.2, 15.8, 15.9 and 16.1), over
raw RPC.

A COPY of at most 16 MiB, or one the client wants synchronous, or one
from a client without a working back channel, is done before the reply
(at most 16 MiB of it: the client asks again for the rest), UNSTABLE
with the server's write verifier. A longer one the client lets run
asynchronously goes on after the reply under a stateid of its own: the
reply carries that stateid, OFFLOAD_STATUS tells how far it got,
OFFLOAD_CANCEL stops it, and CB_OFFLOAD tells the client how it ended
(FILE_SYNC: the server flushed the copy). Holes of the source stay
holes, and each piece is copied under the range locks, so a writer of
the source sees it copied before or after, never torn.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

import rpcclient as rc
from rpcclient import (
    ANONYMOUS_STATEID,
    OPEN4_SHARE_ACCESS_BOTH,
    OPEN4_SHARE_ACCESS_READ,
    Client,
    Packer,
    St,
    expect,
    expect_ok,
)
from test_delegations import CB_COMPOUND, CB_SEQUENCE, PROGRAM, cb_reply, counter, holder
from test_sparse import data_map

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

MiB = 1 << 20
SYNC_MAX = 16 * MiB
CB_OFFLOAD = 15
UNSTABLE, FILE_SYNC = 0, 2


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, "--lease-time", 5, metrics=True, root_squash=False)


def open_file(c: Client, name: str, access: int = OPEN4_SHARE_ACCESS_BOTH):
    """OPEN (creating) `name`: (open stateid, fh)."""
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/" + name.encode(), name, access=access, create=True), rc.op_getfh()])
    expect_ok(r, f"OPEN {name}")
    return r[2].stateid, r[3].fh


def copy(c: Client, src, dst, src_off=0, dst_off=0, count=0, synchronous=True, **kw):
    """COPY from src (stateid, fh) to dst (stateid, fh)."""
    return c.compound([rc.op_putfh(src[1]), rc.op_savefh(), rc.op_putfh(dst[1]),
                       rc.op_copy(src[0], dst[0], src_off, dst_off, count, synchronous=synchronous, **kw)], minor=2)


def offload(c: Client, op, fh: bytes):
    """OFFLOAD_STATUS or OFFLOAD_CANCEL on the destination `fh` (a copy is
    known by its stateid and its destination); its result is r[2]."""
    return c.compound([rc.op_putfh(fh), op], minor=2)


def write_verifier(c: Client, dst) -> bytes:
    r = c.compound([rc.op_putfh(dst[1]), rc.op_write(0, b"", stateid=dst[0])])
    expect_ok(r, "WRITE")
    return r[2].verifier


def random_file(path, size: int) -> bytes:
    """`size` random-looking bytes in `path` (fast: one random MiB
    repeated with its index); their sha256."""
    block = os.urandom(MiB)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(size // MiB):
            b = i.to_bytes(8, "big") + block[8:]
            f.write(b)
            h.update(b)
        rest = os.urandom(size % MiB)
        f.write(rest)
        h.update(rest)
    return h.hexdigest()


def sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(8 * MiB):
            h.update(b)
    return h.hexdigest()


def offload_of(call: rc.RpcCall) -> dict:
    """The CB_OFFLOAD in a CB_COMPOUND (after CB_SEQUENCE)."""
    assert (call.prog, call.proc) == (PROGRAM, CB_COMPOUND), call
    u = rc.Unpacker(call.args)
    u.opaque()
    assert u.u32() == 2, "CB_COMPOUND of the session's minor version"
    u.u32()
    assert u.u32() == 2, "CB_SEQUENCE and CB_OFFLOAD"
    assert u.u32() == CB_SEQUENCE
    u.fixed(16), u.u32(), u.u32(), u.u32(), u.bool()
    assert u.u32() == 0
    assert u.u32() == CB_OFFLOAD, "not a CB_OFFLOAD"
    out = {"fh": u.opaque(), "stateid": u.fixed(16), "status": u.u32()}
    if out["status"] == St.OK:
        assert u.u32() == 0, "wr_callback_id must be empty in CB_OFFLOAD (the Linux client skips it unread)"
        out.update(count=u.u64(), committed=u.u32(), verifier=u.fixed(8))
    else:
        out["count"] = u.u64()
    u.done()
    return out


def answer_offload(c: Client, timeout: float = 60) -> dict:
    call = c.conn.next_call(timeout=timeout)
    off = offload_of(call)
    c.conn.answer(call, cb_reply(call) + Packer().u32(CB_OFFLOAD).u32(St.OK).bytes())
    return off


def test_sync_copy_is_exact_unstable_and_committed(srv):
    c = Client(srv.port).establish()
    digest = random_file(srv.export / "src", 3 * MiB + 123)
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    r = copy(c, src, dst)
    expect_ok(r, "COPY")
    res = r[4]
    assert res.callback_id is None and res.synchronous and res.consecutive
    assert res.count == 3 * MiB + 123
    assert res.committed == UNSTABLE
    verf = write_verifier(c, dst)
    assert res.verifier == verf, "COPY's verifier is not the server's write verifier"
    r = c.compound([rc.op_putfh(dst[1]), rc.op_commit()])
    expect_ok(r, "COMMIT")
    assert r[2].verifier == verf
    assert sha(srv.export / "dst") == digest
    assert counter(srv, "sluice_copy_bytes") == 3 * MiB + 123


def test_copy_of_a_range_into_the_middle(srv):
    c = Client(srv.port).establish()
    (srv.export / "src").write_bytes(b"0123456789" * 10)
    (srv.export / "dst").write_bytes(b"x" * 50)
    src, dst = open_file(c, "src"), open_file(c, "dst")
    r = copy(c, src, dst, src_off=10, dst_off=45, count=20)
    expect_ok(r, "COPY")
    assert r[4].count == 20
    assert (srv.export / "dst").read_bytes() == b"x" * 45 + b"0123456789" * 2
    # Within one file, ranges that do not overlap.
    r = copy(c, src, src, src_off=0, dst_off=100, count=10)
    expect_ok(r, "COPY within one file")
    assert (srv.export / "src").read_bytes() == b"0123456789" * 11


@pytest.mark.parametrize(
    "what,args,want",
    [
        ("source range past the end", dict(src_off=90, count=20), St.INVAL),
        ("source offset past the end", dict(src_off=200, count=0), St.INVAL),
        ("overlapping ranges of one file", dict(src_off=0, dst_off=5, count=10, same=True), St.INVAL),
        ("destination past the largest offset", dict(dst_off=(1 << 63) - 5, count=10), St.FBIG),
    ],
)
def test_bad_ranges(srv, what, args, want):
    c = Client(srv.port).establish()
    (srv.export / "src").write_bytes(b"a" * 100)
    src, dst = open_file(c, "src"), open_file(c, "dst")
    same = args.pop("same", False)
    expect(copy(c, src, src if same else dst, **args), want, what)


def test_copy_errors(srv):
    c = Client(srv.port).establish()
    (srv.export / "src").write_bytes(b"a" * 100)
    (srv.export / "d").mkdir()
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    r = c.compound([rc.op_putrootfh(), rc.op_lookup("d"), rc.op_getfh()])
    dirfh = r[3].fh
    expect(copy(c, src, (ANONYMOUS_STATEID, dirfh)), St.ISDIR, "COPY into a directory")
    # The destination's stateid must allow writing.
    expect(copy(c, dst, src), St.OPENMODE, "COPY into a file opened for reading")
    # No saved filehandle.
    r = c.compound([rc.op_putfh(dst[1]), rc.op_copy(src[0], dst[0], 0, 0, 0)], minor=2)
    expect(r, St.NOFILEHANDLE, "COPY without a saved filehandle")
    # A copy from another server: not offered.
    netloc = Packer().u32(3).opaque(b"tcp").opaque(b"127.0.0.1.8.1").bytes()
    expect(copy(c, src, dst, source_servers=[netloc]), St.NOTSUPP, "inter-server COPY")
    # COPY_NOTIFY (the source side of an inter-server copy): not offered.
    r = c.compound([rc.op_putfh(src[1]), (rc.Op.COPY_NOTIFY, Packer().fixed(src[0]).u32(3).opaque(b"tcp").opaque(b"x").bytes())], minor=2)
    expect(r, St.NOTSUPP, "COPY_NOTIFY")
    # Unknown copy stateids.
    bogus = bytes(4) + bytes(srv_boot_of(src[0])) + b"\x7f" * 8
    expect(offload(c, rc.op_offload_status(bogus), dst[1]), St.BAD_STATEID, "OFFLOAD_STATUS of no copy")
    expect(offload(c, rc.op_offload_cancel(bogus), dst[1]), St.BAD_STATEID, "OFFLOAD_CANCEL of no copy")
    expect(offload(c, rc.op_offload_status(ANONYMOUS_STATEID), dst[1]), St.BAD_STATEID, "OFFLOAD_STATUS of a special stateid")
    old = bytes(4) + b"\x00\x00\x00\x09" + b"\x7f" * 8
    expect(offload(c, rc.op_offload_status(old), dst[1]), St.STALE_STATEID, "OFFLOAD_STATUS of an earlier server's copy")
    expect(c.compound([rc.op_offload_status(bogus)], minor=2), St.NOFILEHANDLE, "OFFLOAD_STATUS without a filehandle")
    # The copy ops are NFSv4.2's: an NFSv4.1 COMPOUND cannot carry them
    # (as on the Linux server).
    r = c.compound([rc.op_putfh(src[1]), rc.op_savefh(), rc.op_putfh(dst[1]), rc.op_copy(src[0], dst[0], 0, 0, 0)], minor=1)
    expect(r, St.OP_ILLEGAL, "COPY in an NFSv4.1 COMPOUND")
    r = c.compound([rc.op_putfh(dst[1]), rc.op_offload_status(bogus)], minor=1)
    expect(r, St.OP_ILLEGAL, "OFFLOAD_STATUS in an NFSv4.1 COMPOUND")


def srv_boot_of(sid: bytes) -> bytes:
    """The server instance part of a stateid's `other`."""
    return sid[4:8]


def test_long_sync_copy_is_short_and_the_client_goes_on(srv):
    """Asked asynchronously, but without a back channel for CB_OFFLOAD:
    synchronous, 16 MiB at a time."""
    size = 40 * MiB + 5
    digest = random_file(srv.export / "src", size)
    c = Client(srv.port).establish()
    src, dst = open_file(c, "src"), open_file(c, "dst")
    done, counts = 0, []
    while done < size:
        r = copy(c, src, dst, src_off=done, dst_off=done, count=size - done, synchronous=False)
        expect_ok(r, "COPY")
        assert r[4].synchronous and r[4].callback_id is None
        counts.append(r[4].count)
        done += r[4].count
    assert counts == [SYNC_MAX, SYNC_MAX, size - 2 * SYNC_MAX]
    assert sha(srv.export / "dst") == digest


def test_async_copy_ends_with_cb_offload(srv):
    size = 64 * MiB + 7
    digest = random_file(srv.export / "src", size)
    c = holder(srv, minor=2)
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    verf = write_verifier(c, dst)
    r = copy(c, src, dst, synchronous=False)
    expect_ok(r, "COPY")
    res = r[4]
    assert not res.synchronous and res.consecutive
    assert res.callback_id is not None, "a long COPY the client lets run asynchronously does"
    assert res.count == 0
    off = answer_offload(c)
    assert off["fh"] == dst[1] and off["stateid"] == res.callback_id
    assert off["status"] == St.OK
    assert off["count"] == size
    assert off["committed"] == FILE_SYNC, "the server flushes an asynchronous copy before CB_OFFLOAD"
    assert off["verifier"] == verf
    assert sha(srv.export / "dst") == digest
    # Answered CB_OFFLOAD gave the stateid back (RFC 7862 section 4.8).
    deadline = time.monotonic() + 10
    while True:
        r = offload(c, rc.op_offload_status(res.callback_id), dst[1])
        if r.status == St.BAD_STATEID:
            break
        expect_ok(r, "OFFLOAD_STATUS before the CB_OFFLOAD answer is taken")
        assert r[2].complete == St.OK and r[2].count == size
        assert time.monotonic() < deadline, "the copy's stateid outlived the CB_OFFLOAD answer"
        time.sleep(0.05)
    assert counter(srv, "sluice_async_copies") == 0


def test_offload_status_reports_a_finished_copy_until_cb_offload_is_answered(srv):
    size = 32 * MiB
    random_file(srv.export / "src", size)
    c = holder(srv, minor=2)
    src, dst = open_file(c, "src"), open_file(c, "dst")
    r = copy(c, src, dst, synchronous=False)
    expect_ok(r, "COPY")
    sid = r[4].callback_id
    call = c.conn.next_call(timeout=60)
    assert offload_of(call)["count"] == size
    # Not answered yet: the copy is finished and known.
    r = offload(c, rc.op_offload_status(sid), dst[1])
    expect_ok(r, "OFFLOAD_STATUS")
    assert (r[2].count, r[2].complete) == (size, St.OK)
    # Not with another file as the current one, nor for another client.
    expect(offload(c, rc.op_offload_status(sid), src[1]), St.BAD_STATEID, "OFFLOAD_STATUS on the source")
    o = Client(srv.port).establish()
    expect(offload(o, rc.op_offload_status(sid), dst[1]), St.BAD_STATEID, "another client's copy")
    c.conn.answer(call, cb_reply(call) + Packer().u32(CB_OFFLOAD).u32(St.OK).bytes())


def test_offload_cancel_stops_the_copy_at_a_prefix(srv):
    size = 1024 * MiB
    random_file(srv.export / "src", size)
    c = holder(srv, minor=2)
    (srv.export / "dst").write_bytes(b"")
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    r = copy(c, src, dst, synchronous=False)
    expect_ok(r, "COPY")
    sid = r[4].callback_id
    r = offload(c, rc.op_offload_status(sid), dst[1])
    expect_ok(r, "OFFLOAD_STATUS")
    assert r[2].complete is None, "the 1 GiB copy ended before OFFLOAD_STATUS could ask"
    expect_ok(offload(c, rc.op_offload_cancel(sid), dst[1]), "OFFLOAD_CANCEL")
    # Once OFFLOAD_CANCEL is answered, the copy has stopped: the
    # destination is a prefix of the source, and stays as it is.
    n = os.path.getsize(srv.export / "dst")
    assert n < size, "OFFLOAD_CANCEL did not stop the copy"
    with open(srv.export / "src", "rb") as a, open(srv.export / "dst", "rb") as b:
        assert a.read(n) == b.read(n), "the destination is not a prefix of the source"
    # The stateid went back with the cancel; no CB_OFFLOAD comes for it.
    expect(offload(c, rc.op_offload_status(sid), dst[1]), St.BAD_STATEID, "OFFLOAD_STATUS after OFFLOAD_CANCEL")
    r = c.compound([rc.op_putfh(dst[1]), rc.op_getattr([1 << 4])])
    expect_ok(r, "GETATTR")
    assert int.from_bytes(r[2].attrvals[:8], "big") == n, "the destination changed after OFFLOAD_CANCEL"
    assert not c.conn.calls, f"a callback came after OFFLOAD_CANCEL: {c.conn.calls}"
    assert counter(srv, "sluice_async_copies") == 0


def test_copy_keeps_holes(srv):
    c = Client(srv.port).establish()
    path = srv.export / "sparse"
    with open(path, "wb") as f:
        for at in (0, 8 * MiB, 20 * MiB):
            f.seek(at)
            f.write(os.urandom(MiB))
        f.truncate(30 * MiB)
    src_map = data_map(path)
    if len(src_map) != 3:
        pytest.fail(f"the export's file system does not keep holes: {src_map}")
    # The destination had data where the source has holes.
    (srv.export / "dst").write_bytes(b"\xee" * 12 * MiB)
    src, dst = open_file(c, "sparse"), open_file(c, "dst")
    r = copy(c, src, dst, count=0)
    expect_ok(r, "COPY")
    assert r[4].count == SYNC_MAX
    r = copy(c, src, dst, src_off=SYNC_MAX, dst_off=SYNC_MAX, count=30 * MiB - SYNC_MAX)
    expect_ok(r, "COPY of the rest")
    assert sha(srv.export / "dst") == sha(path)
    assert data_map(srv.export / "dst") == src_map


def test_a_writer_of_the_source_during_an_async_copy_is_never_torn(srv):
    """Each 8 MiB piece is copied under the range locks: every 256 KiB
    block of the destination is the source's block from before or after
    the writer's rewrite of it (one WRITE), never a mix."""
    c = holder(srv, minor=2)
    size, unit = 256 * MiB, 256 << 10
    with open(srv.export / "src", "wb") as f:
        for _ in range(size // MiB):
            f.write(bytes([1]) * MiB)
    src, dst = open_file(c, "src"), open_file(c, "dst")
    w = Client(srv.port).establish()
    wsid, wfh = open_file(w, "src")
    stop = threading.Event()
    rewrites = []

    def writer():
        i = 0
        while not stop.is_set():
            at = (i * 37 % (size // unit)) * unit
            r = w.compound([rc.op_putfh(wfh), rc.op_write(at, bytes([2]) * unit, stateid=wsid)])
            expect_ok(r, "WRITE")
            rewrites.append(at)
            i += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        r = copy(c, src, dst, synchronous=False)
        expect_ok(r, "COPY")
        off = answer_offload(c)
    finally:
        stop.set()
        t.join(30)
    assert off["status"] == St.OK and off["count"] == size
    assert rewrites, "the writer wrote nothing"
    with open(srv.export / "dst", "rb") as f:
        for i in range(size // unit):
            block = f.read(unit)
            assert block in (bytes([1]) * unit, bytes([2]) * unit), f"block {i} of the copy is torn"
