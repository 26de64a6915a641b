"""Cached READs lent from a mapping of the file (crates/engine/src/mapped.rs).

A READ of at least --lend-read-min bytes (64 KiB) that the page cache holds
is sent from a mapping of the file: the socket copies the page cache
itself. Such data is the file, not a copy, so:

* a WRITE to its range must wait until the socket has taken it (the
  READ's range lock lives as long as the lent data): READs stay whole
  against WRITEs, checked here with 256 KiB blocks that each WRITE fills
  with one generation number;
* a reply that waits for a slow client is copied first, so that it does
  not hold up WRITEs to its range for as long as the client takes; while
  replies wait so, the connection takes no new request, so the READs
  behind them are lent once the client has read enough.
"""

from __future__ import annotations

import struct
import threading
import time

import rpcclient as rc
from rpcclient import Conn, Session, expect_ok

BLOCK = 256 << 10
BLOCKS = 2
# Stop after this many checked READs, or after SECONDS.
READS = 4_000
SECONDS = 40


def block_data(block: int, gen: int) -> bytes:
    return struct.pack("<QQ", block, gen) * (BLOCK // 16)


def torn(data: bytes, block: int) -> str | None:
    """None when `data` is block `block` of one generation throughout."""
    if len(data) != BLOCK:
        return f"{len(data)} bytes"
    b, gen = struct.unpack_from("<QQ", data, 0)
    if b != block:
        return f"block number {b}"
    if data != block_data(block, gen):
        gens = {struct.unpack_from("<QQ", data, i)[1] for i in range(0, BLOCK, 4096)}
        return f"generations {sorted(gens)[:6]}"
    return None


def file_ops(name: str):
    return [rc.op_putrootfh(), rc.op_lookup(name)]


def test_large_cached_reads_are_lent_and_never_torn_by_writes(sluice_factory):
    srv = sluice_factory(metrics=True, root_squash=False)
    (srv.export / "lent.dat").write_bytes(b"".join(block_data(b, 0) for b in range(BLOCKS)))
    stop = threading.Event()
    deadline = time.monotonic() + SECONDS
    counts = {"reads": 0, "writes": 0}
    bad: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(step):
        """Runs `step(session, n)` for n = 1, 2, ... on a connection of its
        own until the test stops; an error stops the test."""
        try:
            with Conn(srv.port, timeout=30) as c:
                s = Session(c)
                n = 0
                while not stop.is_set():
                    n += 1
                    step(s, n)
        except BaseException as e:  # reported by the test
            errors.append(e)
            stop.set()

    def writer(seed: int):
        def step(s: Session, n: int):
            gen = seed + 2 * n
            b = gen % BLOCKS
            expect_ok(s.compound(file_ops("lent.dat") + [rc.op_write(b * BLOCK, block_data(b, gen))]), "WRITE")
            with lock:
                counts["writes"] += 1

        client(step)

    def reader(seed: int):
        def step(s: Session, n: int):
            b = (seed + n) % BLOCKS
            r = s.compound(file_ops("lent.dat") + [rc.op_read(b * BLOCK, BLOCK)])
            expect_ok(r, "READ")
            why = torn(r[3].data, b)
            with lock:
                counts["reads"] += 1
                if why:
                    bad.append(f"block {b}: {why}")
                if counts["reads"] >= READS or time.monotonic() > deadline:
                    stop.set()

        client(step)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=reader, args=(r * 7,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SECONDS + 60)
    assert not errors, errors
    lent = srv.counter("sluice_read_lent_bytes")
    print(f"{counts['reads']} READs of 256 KiB, {counts['writes']} WRITEs; "
          f"{lent / BLOCK:.0f} blocks lent, {len(bad)} torn")
    assert not bad, bad[:10]
    assert counts["reads"] >= 500 and counts["writes"] >= 200, counts
    # Most READs were lent (the rest met a WRITE waiting for their range,
    # and were copied under their lock as before).
    assert lent >= BLOCK * counts["reads"] // 4, (lent, counts)


def test_a_reply_waiting_for_a_slow_client_lets_writes_through(sluice_factory):
    srv = sluice_factory(metrics=True, root_squash=False)
    # 16 MiB of replies: more than loopback sockets hold (about 4 MiB).
    blocks = 64
    (srv.export / "slow.dat").write_bytes(b"".join(block_data(b, 0) for b in range(blocks)))
    with Conn(srv.port, timeout=30) as slow, Conn(srv.port, timeout=30) as other:
        s = Session(slow, slots=blocks)
        # 64 READs of 256 KiB at once, none of whose replies is read:
        # they fill the socket, and the rest wait in the server.
        xids = []
        for b in range(blocks):
            xid = rc.next_xid()
            ops = [s.seq_op(slot=b)] + file_ops("slow.dat") + [rc.op_read(b * BLOCK, BLOCK)]
            slow.send_record(rc.call_header(xid, proc=rc.PROC_COMPOUND) + rc.compound_args(ops))
            xids.append(xid)
        # The socket filled while lent replies were on their way: those
        # still waiting are copied (the READs after them wait unread).
        assert srv.wait_counter("sluice_read_lent_settled_bytes", 1, deadline=20), \
            "no lent reply was copied while the client did not read"
        lent_before = srv.counter("sluice_read_lent_bytes")
        assert lent_before < blocks * BLOCK, "every READ was answered while the client read nothing"
        # A WRITE to every block goes through while those replies wait.
        o = Session(other)
        for b in range(blocks):
            expect_ok(o.compound(file_ops("slow.dat") + [rc.op_write(b * BLOCK, block_data(b, 1))]),
                      "WRITE while replies wait")
        # Now the slow client reads its replies: each block whole, of one
        # generation (those answered before the WRITEs: the old one).
        gens = []
        for b, xid in enumerate(xids):
            r = slow.wait_for(xid)
            reply = rc.CompoundReply(r.body)
            expect_ok(reply, "READ")
            data = reply[3].data
            assert torn(data, b) is None, (b, torn(data, b))
            gens.append(struct.unpack_from("<QQ", data, 0)[1])
        assert 0 in gens, gens
        # The READs taken once there was room again were lent too, not
        # copied from the page cache into a buffer first.
        lent = srv.counter("sluice_read_lent_bytes")
        assert lent == blocks * BLOCK, (lent_before, lent)
        # Those came after the WRITEs.
        assert 1 in gens, gens


def test_a_file_truncated_under_lent_reads_does_not_bring_the_server_down(sluice_factory):
    """A local process truncating the file while READs of it are lent: the
    pages behind the lent data are gone, so touching them would kill the
    server (SIGBUS). The server never reads lent memory itself (the
    socket's copy of a lost page fails, and that connection is dropped;
    a queued reply's copy reads zeros), so every client keeps being
    served."""
    srv = sluice_factory(metrics=True, root_squash=False)
    path = srv.export / "shrinking.dat"
    blocks = 16
    path.write_bytes(b"".join(block_data(b, 0) for b in range(blocks)))
    stop = threading.Event()
    deadline = time.monotonic() + SECONDS
    counts = {"reads": 0, "truncations": 0, "dropped": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def reader(seed: int):
        n = seed
        try:
            while not stop.is_set():
                try:
                    with Conn(srv.port, timeout=30) as c:
                        s = Session(c)
                        while not stop.is_set():
                            n += 1
                            b = n % blocks
                            r = s.compound(file_ops("shrinking.dat") + [rc.op_read(b * BLOCK, BLOCK)])
                            expect_ok(r, "READ")
                            with lock:
                                counts["reads"] += 1
                except (ConnectionError, rc.ConnectionClosed):
                    # The server drops a connection whose lent data was
                    # lost under it; the client reconnects, as NFS clients do.
                    with lock:
                        counts["dropped"] += 1
        except BaseException as e:  # reported by the test
            errors.append(e)
            stop.set()

    def truncater():
        gen = 0
        try:
            while not stop.is_set():
                gen += 1
                with open(path, "r+b") as f:
                    f.truncate(0)
                    f.write(b"".join(block_data(b, gen) for b in range(blocks)))
                with lock:
                    counts["truncations"] += 1
                    if (counts["truncations"] >= 300 and counts["reads"] >= 2_000) or time.monotonic() > deadline:
                        stop.set()
        except BaseException as e:  # reported by the test
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=reader, args=(r * 5,)) for r in range(3)]
    threads.append(threading.Thread(target=truncater))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SECONDS + 60)
    assert not errors, errors
    assert srv.alive(), "the server died while files under lent READs were truncated"
    lent = srv.counter("sluice_read_lent_bytes")
    print(f"{counts['reads']} READs, {counts['truncations']} truncations, {counts['dropped']} connections "
          f"dropped, {lent / BLOCK:.0f} blocks lent")
    assert counts["reads"] >= 200 and counts["truncations"] >= 20, counts
    assert lent > 0, "no READ was lent: the test did not test lending"
    # Everyone is still served: a new client reads the last contents whole.
    expected = path.read_bytes()
    with Conn(srv.port, timeout=30) as c:
        s = Session(c)
        for b in range(blocks):
            r = s.compound(file_ops("shrinking.dat") + [rc.op_read(b * BLOCK, BLOCK)])
            expect_ok(r, "READ after the truncations")
            assert r[3].data == expected[b * BLOCK:(b + 1) * BLOCK], b


def test_readers_of_one_file_share_one_mapping_of_it(sluice_factory):
    """Clients reading one cached file at random, each through an OPEN of
    its own (a readahead stream each), are lent its data from one mapping
    of the whole file: the server maps it once, not once per reader and
    again each time a READ lands past what that reader had mapped (whose
    page faults and unmapping took 8.6% of the server's CPU with 256 such
    readers). The data is exact."""
    srv = sluice_factory(metrics=True, root_squash=False)
    blocks = 32
    path = srv.export / "shared.dat"
    path.write_bytes(b"".join(block_data(b, 0) for b in range(blocks)))
    path.read_bytes()  # in the page cache
    mapped = srv.counter("sluice_read_lent_mappings")
    lent = srv.counter("sluice_read_lent_bytes")
    readers = [rc.Client(srv.port).establish() for _ in range(8)]
    try:
        opened = [c.must_open("shared.dat", create=False, access=rc.OPEN4_SHARE_ACCESS_READ) for c in readers]
        reads = 0
        for n in range(6):
            for i, (c, (sid, fh)) in enumerate(zip(readers, opened, strict=True)):
                # Each reader its own blocks, the first ones anywhere in
                # the file.
                b = (i * 11 + n * 5 + (blocks - 1 if n == 0 else 0)) % blocks
                r = c.compound([rc.op_putfh(fh), rc.op_read(b * BLOCK, BLOCK, sid)])
                expect_ok(r, "READ")
                assert torn(r[2].data, b) is None, f"reader {i}, block {b}: {torn(r[2].data, b)}"
                reads += 1
    finally:
        for c in readers:
            c.close()
    lent = srv.counter("sluice_read_lent_bytes") - lent
    mapped = srv.counter("sluice_read_lent_mappings") - mapped
    print(f"{reads} READs by {len(readers)} readers, {lent / BLOCK:.0f} lent, {mapped:.0f} mappings made")
    assert lent >= BLOCK * reads // 2, "most READs were lent"
    assert mapped == 1, f"{mapped} mappings of one file for {len(readers)} readers"
