"""Hostile clients: symlinks swapped in during lookups, and COMPOUNDs with
thousands of ops, while other clients carry on.

No way out of the export through symlinks swapped in while a client looks
names up.
A host thread keeps swapping a name inside the export between a real entry
and a symlink that points outside the export (a directory, then a file),
while a client sends PUTROOTFH, LOOKUP..., READ as fast as it can. The
server resolves one component at a time without following symlinks, so
every READ must return the inside file's bytes or fail; the outside file's
bytes must never come back. The test also checks that the race was really
run: both some reads and some failed lookups happened while swapping.

A COMPOUND of 5,000 ops (in a session, or without one) is answered with
NFS4ERR_TOO_MANY_OPS (or the session-less error) after at most one result,
and a client served on another connection meanwhile gets its answers.
"""

from __future__ import annotations

import os
import threading

import rpcclient as rc
from rpcclient import Conn, Session, St

INSIDE = b"inside the export\n"
OUTSIDE = b"OUTSIDE THE EXPORT\n"
ROUNDS = 3000


def swapper(a: str, b: str, swap: str, stop: threading.Event, counter: list[int]):
    """Exchange the entries at `a` and `b` through `swap` until stopped."""
    while not stop.is_set():
        os.rename(a, swap)
        os.rename(b, a)
        os.rename(a, b)
        os.rename(swap, a)
        counter[0] += 1


def run_race(server, path: list[str], a: str, b: str, swap: str):
    stop = threading.Event()
    swaps = [0]
    t = threading.Thread(target=swapper, args=(a, b, swap, stop, swaps), daemon=True)
    outcomes: dict[str, int] = {}
    leaked = []
    with Conn(server.port) as c:
        s = Session(c)
        t.start()
        try:
            for _ in range(ROUNDS):
                ops = [rc.op_putrootfh(), *[rc.op_lookup(n) for n in path], rc.op_read(0, 4096)]
                r = s.compound(ops)
                if r.status == St.OK:
                    data = r[len(r) - 1].data
                    if data != INSIDE:
                        leaked.append(data)
                    outcomes["read"] = outcomes.get("read", 0) + 1
                else:
                    key = f"status {r.status}"
                    outcomes[key] = outcomes.get(key, 0) + 1
        finally:
            stop.set()
            t.join()
    return outcomes, leaked, swaps[0]


def check_race(outcomes: dict[str, int], leaked: list[bytes], swaps: int):
    """Nothing from outside came back, and the race really ran: some reads
    succeeded and some requests met the symlink."""
    assert not leaked, f"read data from outside the export: {leaked[:3]}"
    assert outcomes.get("read", 0) > 0, outcomes
    assert sum(v for k, v in outcomes.items() if k != "read") > 0, (
        f"no request ever met the symlink ({swaps} swaps): the race did not happen {outcomes}"
    )


def layout(server, tmp_path):
    ex = server.export
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(OUTSIDE)
    (ex / "d").mkdir()
    (ex / "d" / "secret").write_bytes(INSIDE)
    return ex, outside


def test_directory_swapped_for_symlink_during_lookup(sluice_server, tmp_path):
    ex, outside = layout(sluice_server, tmp_path)
    os.symlink(outside, ex / "d.link")
    check_race(*run_race(
        sluice_server, ["d", "secret"], str(ex / "d"), str(ex / "d.link"), str(ex / "d.swap")
    ))
    # After the race the tree is as it was and still served.
    assert (ex / "d" / "secret").read_bytes() == INSIDE
    assert sluice_server.alive()


def test_file_swapped_for_symlink_during_lookup(sluice_server, tmp_path):
    ex, outside = layout(sluice_server, tmp_path)
    os.symlink(outside / "secret", ex / "d" / "secret.link")
    d = ex / "d"
    check_race(*run_race(
        sluice_server, ["d", "secret"], str(d / "secret"), str(d / "secret.link"), str(d / "secret.swap")
    ))
    assert sluice_server.alive()


def test_compound_with_thousands_of_ops(sluice_server):
    ops = [rc.op_putrootfh()] * 5000
    with Conn(sluice_server.port) as bystander, Conn(sluice_server.port) as c:
        other = Session(bystander)
        s = Session(c)
        r = s.compound(ops)
        assert r.status == St.TOO_MANY_OPS, r
        assert len(r) == 1, r
        # A failed SEQUENCE leaves the slot as it was (RFC 8881 section
        # 18.46.3): the next request reuses the sequence id.
        s.next_seq[0] -= 1
        # Without SEQUENCE first: the first op is refused and nothing runs.
        r = c.compound(ops)
        assert r.status == St.OP_NOT_IN_SESSION, r
        assert len(r) == 1, r
        # The same session and another client are served normally after.
        assert s.compound([rc.op_putrootfh(), rc.op_getfh()]).status == St.OK
        r = other.compound([rc.op_putrootfh(), rc.op_getfh()])
        assert r.status == St.OK and r[2].fh == s.root_fh(), r
    assert sluice_server.alive()
