"""Quick metadata work on the connection's thread (`--inline-quick-ops`).

A connection none of whose requests is on a request thread has its
REMOVE, RENAME, small UNSTABLE WRITE and the like done on its own thread,
which saves handing each to a request thread, also when the client has
several in flight; the metrics count them. What goes to storage
(FILE_SYNC WRITEs, COMMIT) is still handed over, and `--inline-quick-ops
0` hands over everything. Either way each op does its work once. By
default (`sync`) a REMOVE syncs its directory before it is answered, and
goes to a request thread like other storage work; with `--async` it is
quick.
"""

from __future__ import annotations

import os

import pytest

import rpcclient as rc
from rpcclient import Client, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

FILES = 40


def remove_each(srv, c: Client, prefix: str):
    """Makes FILES files locally, then removes them one REMOVE at a time."""
    for i in range(FILES):
        (srv.export / f"{prefix}{i}").write_bytes(b"x")
    for i in range(FILES):
        expect_ok(c.compound([rc.op_putrootfh(), rc.op_remove(f"{prefix}{i}")]), f"REMOVE {prefix}{i}")
    left = [p for p in os.listdir(srv.export) if p.startswith(prefix)]
    assert left == [], f"not removed: {left}"


def test_quick_ops_are_answered_on_the_connection_thread(sluice_factory):
    srv = sluice_factory("--grace-time", 0, "--async", metrics=True, root_squash=False)
    with Client(srv.port) as c:
        c.establish()
        before = srv.counter("sluice_inline_requests")
        remove_each(srv, c, "q")
        # Every REMOVE was alone on its connection: each was answered on
        # the connection's thread (unless a slow one sent some over).
        done = srv.counter("sluice_inline_requests") - before
        slow = srv.counter("sluice_inline_slow")
        assert done >= FILES - 1 or slow > 0, f"{done} of {FILES} REMOVEs answered inline, {slow} slow"
        assert done >= 1, "no REMOVE was answered on the connection's thread"

        # Storage work is handed over: FILE_SYNC WRITEs and COMMIT.
        (srv.export / "f").write_bytes(b"")
        before = srv.counter("sluice_inline_requests")
        for i in range(5):
            data = bytes([i]) * 4096
            expect_ok(c.compound([rc.op_putrootfh(), rc.op_lookup("f"), rc.op_write(i * 4096, data, stable=2)]), "FILE_SYNC WRITE")
            expect_ok(c.compound([rc.op_putrootfh(), rc.op_lookup("f"), rc.op_commit()]), "COMMIT")
        assert srv.counter("sluice_inline_requests") == before, "storage work was done on the connection's thread"
        # A small UNSTABLE WRITE is quick, and writes what it was given.
        expect_ok(c.compound([rc.op_putrootfh(), rc.op_lookup("f"), rc.op_write(0, b"quick", stable=0)]), "UNSTABLE WRITE")
        assert srv.counter("sluice_inline_requests") == before + 1
        got = (srv.export / "f").read_bytes()
        assert got[:5] == b"quick" and got[5:4096] == bytes([0]) * 4091 and len(got) == 5 * 4096


def test_quick_ops_in_flight_together_are_answered_on_the_connection_thread(sluice_factory):
    """Eight slots' small UNSTABLE WRITEs sent together, round after
    round: each is answered on the connection's thread though the
    others are in flight beside it (none is on a request thread), and
    each writes its own bytes."""
    srv = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)
    slots, rounds, size = 8, 25, 8192
    (srv.export / "p").write_bytes(b"")
    with Client(srv.port) as c:
        c.establish()
        first = {slot: c.next_seq.get(slot, 1) for slot in range(slots)}
        before = srv.counter("sluice_inline_requests")
        # A slot takes its next request once it has answered the last.
        for r in range(rounds):
            records, where = [], {}
            for slot in range(slots):
                n = r * slots + slot
                ops = [c.seq_op(slot, seqid=first[slot] + r), rc.op_putrootfh(), rc.op_lookup("p"), rc.op_write(n * size, bytes([n % 251 + 1]) * size, stable=0)]
                x = rc.next_xid()
                records.append((x, rc.call_header(x, proc=rc.PROC_COMPOUND, cred_body=c.cred) + rc.compound_args(ops)))
                where[x] = n
            replies = c.conn.pipeline(records)
            for x, n in where.items():
                reply = rc.CompoundReply(replies[x].body)
                assert reply.status == rc.St.OK, f"WRITE {n}: {reply!r}"
        done = srv.counter("sluice_inline_requests") - before
        slow = srv.counter("sluice_inline_slow")
    got = (srv.export / "p").read_bytes()
    assert len(got) == rounds * slots * size
    for n in range(rounds * slots):
        assert got[n * size : (n + 1) * size] == bytes([n % 251 + 1]) * size, f"WRITE {n}'s bytes"
    total = rounds * slots
    # A slow one sends the quick work of the next 200 ms over.
    assert done == total or slow > 0, f"{done} of {total} WRITEs in flight together answered on the connection's thread"
    assert done > 0


def test_none_with_inline_quick_ops_0(sluice_factory):
    srv = sluice_factory("--grace-time", 0, "--inline-quick-ops", 0, metrics=True, root_squash=False)
    with Client(srv.port) as c:
        c.establish()
        remove_each(srv, c, "w")
    assert srv.counter("sluice_inline_requests") == 0


def test_removes_that_sync_are_handed_over(sluice_factory):
    srv = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)
    with Client(srv.port) as c:
        c.establish()
        before = srv.counter("sluice_inline_requests")
        remove_each(srv, c, "s")
    assert srv.counter("sluice_inline_requests") == before, "a REMOVE that syncs was done on the connection's thread"
    assert srv.counter("sluice_metadata_commits") >= FILES, "each REMOVE syncs its directory"
