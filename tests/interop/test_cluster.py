"""Several sluice nodes over one shared directory, with the cluster's grace
period and client records in etcd (docs/cluster.md).

The directory stands in for the cluster file system, a TCP proxy for the
floating address, and another proxy for the network between a node and
etcd. Clients speak raw NFSv4.1 (rpcclient); the Linux guest's failover is
in test_linux_cluster.py.
"""

from __future__ import annotations

import signal
import time

import pytest

from cluster import Etcd, Node, Proxy
from rpcclient import (
    CLAIM_PREVIOUS,
    Client,
    St,
    op_exchange_id,
    op_lock_existing,
    op_locku,
    op_lockt,
    op_getattr,
    op_getfh,
    op_lock_new,
    op_open,
    op_putfh,
    op_read,
    op_reclaim_complete,
    op_write,
)

LEASE = 2  # --cluster-lease: a dead node is noticed after this many seconds
GRACE = 6


@pytest.fixture
def cluster(sluice_binary, tmp_path):
    """(etcd, start_node(n, **kw)): nodes export tmp_path/export."""
    etcd = Etcd(tmp_path)
    etcd.start()
    export = tmp_path / "export"
    export.mkdir()
    nodes: list[Node] = []

    def start(n: int, etcd_url: str | None = None, grace: int = GRACE, lease: int = LEASE) -> Node:
        node = Node(
            sluice_binary,
            export,
            tmp_path / f"node{n}",
            etcd_url or etcd.url,
            n,
            extra=["--grace-time", grace, "--lease-time", 10, "--cluster-lease", lease],
        )
        node.start()
        nodes.append(node)
        return node

    yield etcd, start
    for n in nodes:
        n.stop()
    etcd.kill()


def settled(*nodes: Node):
    """Waits until no node is in grace (each start begins one)."""
    for n in nodes:
        n.wait_grace(False, GRACE + LEASE + 5)


def retry_delay(f, what: str, deadline: float = 10):
    """Calls f() until it answers something other than NFS4ERR_DELAY."""
    t0 = time.monotonic()
    while True:
        r = f()
        if r.status != St.DELAY:
            return r
        assert time.monotonic() - t0 < deadline, f"{what}: NFS4ERR_DELAY for {deadline} s"
        time.sleep(0.05)


def stays_in_grace(node: Node, seconds: float, what: str):
    """The node stays in grace for `seconds` (when grace would end, it ends
    within about 0.1 s of the last reclaim)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert node.in_grace(), what
        time.sleep(0.05)


def reclaim_open(c: Client, fh: bytes, what: str):
    """A client reconnects (to whatever its port leads to now), makes a new
    client id and session and reclaims its open of `fh` (CLAIM_PREVIOUS,
    retried while NFS4ERR_DELAY): the reply."""
    c.reconnect()
    r = c.exchange_id()
    assert r.status == St.OK, f"{what}: EXCHANGE_ID: {r!r}"
    r = c.create_session()
    assert r.status == St.OK, f"{what}: CREATE_SESSION: {r!r}"
    return retry_delay(lambda: c.compound([op_putfh(fh), op_open(c.owner + b"/open", claim=CLAIM_PREVIOUS), op_getfh()]), what)


def reclaim(c: Client, fh: bytes, what: str):
    """reclaim_open, which must succeed, then RECLAIM_COMPLETE."""
    r = reclaim_open(c, fh, what)
    assert r.status == St.OK, f"{what}: {r!r}"
    r = c.compound([op_reclaim_complete()])
    assert r.status == St.OK, f"{what}: RECLAIM_COMPLETE: {r!r}"


def test_nodes_are_one_server(cluster):
    """Same handles, owner and scope on every node; client ids that cannot
    collide; client records in etcd by node and epoch."""
    etcd, start = cluster
    a, b = start(1), start(2)
    settled(a, b)
    ca, cb = Client(a.port, owner=b"one-a"), Client(b.port, owner=b"one-b")
    ra, rb = ca.call([op_exchange_id(ca.owner)]), cb.call([op_exchange_id(cb.owner)])
    assert ra.status == St.OK and rb.status == St.OK, (ra, rb)
    assert ra[0].owner_major == rb[0].owner_major == b"sluice-cluster:t"
    assert ra[0].scope == rb[0].scope
    assert (ra[0].clientid >> 56, rb[0].clientid >> 56) == (1, 2), "node number in the client id"
    ca.establish()
    cb.establish()
    assert ca.root_fh() == cb.root_fh()
    sid, fh = ca.must_open("shared")
    r = ca.compound([op_putfh(fh), op_write(0, b"written on node 1", stable=2, stateid=sid)])
    assert r.status == St.OK, r
    # A handle node 1 gave works on node 2, and names the same file.
    r = cb.compound([op_putfh(fh), op_read(0, 100)])
    assert r.status == St.OK and r[2].data == b"written on node 1", r
    r = cb.compound([op_putfh(fh), op_getattr()])
    assert r.status == St.OK, r
    # Both clients hold state: each is recorded by its node in the epoch.
    epoch = int(etcd.get("sluice/t/epochs").split()[0])
    recs = etcd.keys(f"sluice/t/clients/{epoch:020d}/")
    assert any(k.endswith(f"/{b'one-a'.hex()}/001") for k in recs), recs
    assert any(k.endswith(f"/{b'one-b'.hex()}/002") for k in recs), recs
    ca.close()
    cb.close()


def test_failover_reclaim_on_another_node(cluster):
    """A client of node 1 holds an open, a lock and written data; node 1 is
    killed and its address moves to node 2. Grace begins on every node; the
    client reclaims on node 2 and writes on; a client of node 3 cannot take
    the lock during grace, nor after it. Grace ends once node 1's client
    has sent RECLAIM_COMPLETE."""
    etcd, start = cluster
    a, b, c = start(1), start(2), start(3)
    settled(a, b, c)
    addr = Proxy(a.port)
    x = Client(addr.port, owner=b"mover", verifier=b"boot-001").establish()
    sid, fh = x.must_open("data")
    r = x.lock(fh, sid, offset=0, length=100)
    assert r.status == St.OK, r
    r = x.compound([op_putfh(fh), op_write(0, b"A" * 100, stable=2, stateid=sid)])
    assert r.status == St.OK, r
    y = Client(c.port, owner=b"bystander").establish()
    ysid, yfh = y.must_open("data", create=False)
    assert yfh == fh

    a.stop(signal.SIGKILL)
    t_kill = time.monotonic()
    addr.switch(b.port)
    # Node 3 learns of the death when node 1's lease in etcd runs out.
    c.wait_grace(True, LEASE + 5)
    noticed = time.monotonic() - t_kill
    b.wait_grace(True, 2)
    r = y.lock(yfh, ysid, offset=50, length=10)
    assert r.status == St.GRACE, f"new lock on node 3 during grace: {r!r}"
    r = y.open("other")
    assert r.status == St.GRACE, f"new open on node 3 during grace: {r!r}"

    # The client follows its address to node 2 and reclaims there.
    x.reconnect()
    r = x.exchange_id()
    assert r.status == St.OK, r
    assert r[0].clientid >> 56 == 2
    r = x.create_session()
    assert r.status == St.OK, r
    r = retry_delay(lambda: x.compound([op_putfh(fh), op_open(b"mover/open", claim=CLAIM_PREVIOUS), op_getfh()]), "CLAIM_PREVIOUS")
    assert r.status == St.OK, f"CLAIM_PREVIOUS on node 2: {r!r}"
    sid = r[2].stateid
    r = x.compound([op_putfh(fh), op_lock_new(sid, b"mover/lock", 0, 100, reclaim=True)])
    assert r.status == St.OK, f"LOCK reclaim on node 2: {r!r}"
    # Still in grace on node 3 until the client says it is done.
    r = y.lock(yfh, ysid, offset=50, length=10)
    assert r.status == St.GRACE, f"new lock on node 3 during grace: {r!r}"
    # The reclaim was recorded by node 2 in the new epoch.
    cur, rec = map(int, etcd.get("sluice/t/epochs").split())
    assert rec != 0
    assert f"sluice/t/clients/{cur:020d}/{b'mover'.hex()}/002" in etcd.keys("sluice/t/clients/")
    r = x.compound([op_reclaim_complete()])
    assert r.status == St.OK, r
    # Node 1's only client is done: the cluster's grace ends well before
    # its time.
    t0 = time.monotonic()
    c.wait_grace(False, GRACE + 5)
    b.wait_grace(False, 2)
    ended = time.monotonic() - t0
    assert ended < GRACE / 2, f"grace went on {ended:.1f} s after the last client of node 1 reclaimed"
    lasted = time.monotonic() - t_kill
    r = x.compound([op_putfh(fh), op_write(100, b"B" * 100, stable=2, stateid=sid)])
    assert r.status == St.OK, r
    assert (a.export / "data").read_bytes() == b"A" * 100 + b"B" * 100
    cur2, rec2 = map(int, etcd.get("sluice/t/epochs").split())
    assert (cur2, rec2) == (cur, 0)
    assert not etcd.keys(f"sluice/t/clients/{rec:020d}/"), "recovery epoch records not dropped"
    r = y.open("other")
    assert r.status == St.OK, f"new open after grace: {r!r}"
    # The reclaimed lock is on the shared file system: node 3 sees it.
    r = y.lock(yfh, ysid, offset=50, length=10)
    assert r.status == St.DENIED, f"node 3's LOCK against the lock reclaimed on node 2: {r!r}"
    assert (r[2].denied_offset, r[2].denied_length) == (0, 100), r
    print(f"\nnode 1's death noticed after {noticed:.2f} s (lease {LEASE} s); cluster grace over "
          f"{ended * 1000:.0f} ms after its client's RECLAIM_COMPLETE, {lasted:.1f} s after the kill")
    x.close()
    y.close()
    addr.close()


def test_locks_conflict_between_nodes(cluster):
    """Byte-range locks are taken on the shared file system too: a lock
    held through one node keeps a client of another node out, read locks
    share, and an unlock or the holder's departure frees the range."""
    etcd, start = cluster
    a, b = start(1), start(2)
    settled(a, b)
    x = Client(a.port, owner=b"locker-1").establish()
    y = Client(b.port, owner=b"locker-2").establish()
    xsid, fh = x.must_open("locked")
    ysid, _ = y.must_open("locked", create=False)
    rx = x.lock(fh, xsid, offset=0, length=100)
    assert rx.status == St.OK, rx
    r = y.lock(fh, ysid, offset=50, length=10)
    assert r.status == St.DENIED, f"node 2 granted a lock that node 1 holds: {r!r}"
    assert (r[2].denied_offset, r[2].denied_length, r[2].denied_type) == (0, 100, 2), r
    r = y.compound([op_putfh(fh), op_lockt(b"locker-2/t", 99, 1)])
    assert r.status == St.DENIED, f"node 2's LOCKT: {r!r}"
    r = y.lock(fh, ysid, offset=100, length=10)
    assert r.status == St.OK, f"the next range is free: {r!r}"
    ylock = r.stateid
    # Read locks share across nodes; a write lock does not.
    r = x.compound([op_putfh(fh), op_lock_new(xsid, b"locker-1/read", 200, 10, locktype=1)])
    assert r.status == St.OK, r
    r = y.compound([op_putfh(fh), op_lock_existing(ylock, 205, 10, locktype=1)])
    assert r.status == St.OK, f"read lock beside another node's read lock: {r!r}"
    ylock = r[2].stateid
    r = y.compound([op_putfh(fh), op_lock_existing(ylock, 205, 1)])
    assert r.status == St.DENIED, f"write lock over another node's read lock: {r!r}"
    # Node 1's unlock frees the range for node 2.
    r = x.compound([op_putfh(fh), op_locku(rx.stateid, 0, 100)])
    assert r.status == St.OK, r
    r = y.compound([op_putfh(fh), op_lock_existing(ylock, 50, 10)])
    assert r.status == St.OK, f"after node 1's unlock: {r!r}"
    ylock = r[2].stateid
    # Node 2 dies: its locks go with it.
    r = x.lock(fh, xsid, owner=b"locker-1/again", offset=50, length=10)
    assert r.status == St.DENIED, r
    y.close()
    b.stop(signal.SIGKILL)  # its descriptors close: the file system drops its locks
    a.wait_grace(True, LEASE + 5)
    a.wait_grace(False, GRACE + 5)
    r = x.lock(fh, xsid, owner=b"locker-1/again", offset=50, length=10)
    assert r.status == St.OK, f"node 2 is gone, its lock too: {r!r}"
    x.close()


def test_restarted_node_clients_reclaim_and_grace_ends_early(cluster):
    """A node restarts: every node enforces grace, its clients reclaim on
    it, and the cluster's grace ends as soon as they are done, not after
    the grace time."""
    etcd, start = cluster
    a, b = start(1, grace=60), start(2, grace=60)
    settled(a, b)
    x = Client(a.port, owner=b"restarter", verifier=b"boot-001").establish()
    sid, fh = x.must_open("r")
    assert x.lock(fh, sid, offset=0, length=10).status == St.OK
    y = Client(b.port, owner=b"other-node").establish()
    ysid, yfh = y.must_open("r", create=False)
    a.restart(signal.SIGKILL)  # same node id: takes its place at once
    b.wait_grace(True, LEASE + 5)
    assert y.lock(yfh, ysid, offset=0, length=10).status == St.GRACE
    r = reclaim_open(x, fh, "CLAIM_PREVIOUS on the restarted node")
    assert r.status == St.OK, r
    r = x.compound([op_putfh(fh), op_lock_new(r[2].stateid, b"restarter/lock", 0, 10, reclaim=True)])
    assert r.status == St.OK, r
    t0 = time.monotonic()
    assert x.compound([op_reclaim_complete()]).status == St.OK
    b.wait_grace(False, 10)
    a.wait_grace(False, 2)
    ended = time.monotonic() - t0
    assert ended < 5, f"grace went on {ended:.1f} s after the last reclaim (grace time 60 s)"
    print(f"\ncluster grace ended {ended * 1000:.0f} ms after the restarted node's last RECLAIM_COMPLETE")
    x.close()
    y.close()


def test_etcd_restart_and_node_cut_off(cluster):
    """etcd restarts: nodes grant no new state while it is away and carry on
    after, keeping their clients. A node cut off from etcd past its lease
    leaves; the others begin grace; its client reclaims when it is back."""
    etcd, start = cluster
    cable = Proxy(etcd.port)
    lease = 6  # longer than etcd takes to restart
    a, b = start(1, lease=lease), start(2, etcd_url=f"127.0.0.1:{cable.port}", lease=lease)
    settled(a, b)
    x = Client(a.port, owner=b"stays").establish()
    sid, fh = x.must_open("e")
    assert x.lock(fh, sid, offset=0, length=10).status == St.OK
    epochs = etcd.get("sluice/t/epochs")

    etcd.kill()
    t_kill = time.monotonic()
    newcomer = Client(a.port, owner=b"newcomer").establish(reclaim_complete=False)
    r = newcomer.compound([op_reclaim_complete()])
    assert r.status == St.DELAY, f"a new client's record while etcd is away: {r!r}"
    while True:
        r = x.open("e2")
        if r.status == St.DELAY:
            break
        assert r.status == St.OK, r
        assert time.monotonic() - t_kill < 5, "new opens still granted 5 s after etcd went away"
        time.sleep(0.1)
    isolated = time.monotonic() - t_kill
    assert a.metrics()["sluice_cluster_isolated"] == 1
    # What the client holds is still served.
    r = x.compound([op_putfh(fh), op_write(0, b"still here", stable=2, stateid=sid)])
    assert r.status == St.OK, r
    etcd.start()
    r = retry_delay(lambda: x.open("e2"), "open after etcd is back")
    assert r.status == St.OK, r
    assert etcd.get("sluice/t/epochs") == epochs, "no grace: every node kept its lease"
    assert a.metrics()["sluice_cluster_isolated"] == 0
    assert not a.in_grace() and not b.in_grace()
    assert a.alive() and b.alive()

    # Node 2 loses etcd for longer than its lease.
    z = Client(b.port, owner=b"cut-off", verifier=b"boot-001")
    z.exchange_id()
    z.create_session()
    # Node 2 renews its lease again too, then grants new state.
    r = retry_delay(lambda: z.compound([op_reclaim_complete()]), "node 2's first client record after etcd is back")
    assert r.status == St.OK, r
    r = retry_delay(lambda: z.open("z"), "node 2's first open after etcd is back")
    assert r.status == St.OK, r
    zsid, zfh = r.stateid, r.fh
    assert z.lock(zfh, zsid, offset=0, length=10).status == St.OK
    cable.cut()
    t0 = time.monotonic()
    b.proc.wait(timeout=lease + 10)
    left = time.monotonic() - t0
    assert b.proc.returncode == 75, b.proc.returncode
    assert "left the cluster" in b.log()
    a.wait_grace(True, lease + 5)
    # Node 2 comes back (a supervisor would start it) and its client
    # reclaims there.
    cable.mend()
    b.proc = None
    b.start()
    reclaim(z, zfh, "node 2's client after node 2 is back")
    a.wait_grace(False, GRACE + 5)
    b.wait_grace(False, 2)
    r = newcomer.compound([op_reclaim_complete()])
    assert r.status == St.OK, r
    print(f"\nno new state {isolated:.1f} s after etcd went away; node 2 left {left:.1f} s after losing etcd (lease {lease} s)")
    for c in (x, z, newcomer):
        c.close()
    cable.close()


def test_grace_edges(cluster):
    """A node that joins a grace period in progress leaves the epochs as
    they are; a survivor's clients are recorded again in each new epoch;
    a client of a dead node that did not reclaim in that grace period
    cannot reclaim after a later restart (RFC 8881 section 8.4.3)."""
    etcd, start = cluster
    a, b = start(1, grace=3), start(2, grace=3)
    settled(a, b)
    x = Client(a.port, owner=b"misses-grace", verifier=b"boot-001").establish()
    _, xfh = x.must_open("edge")
    w = Client(b.port, owner=b"survivor").establish()
    w.must_open("edge2")
    a.stop(signal.SIGKILL)
    b.wait_grace(True, LEASE + 5)
    during = etcd.get("sluice/t/epochs")
    cur, rec = map(int, during.split())
    assert rec != 0
    # The survivor's client keeps its state into the new epoch.
    assert f"sluice/t/clients/{cur:020d}/{b'survivor'.hex()}/002" in etcd.keys("sluice/t/clients/")
    c = start(3, grace=3)
    assert etcd.get("sluice/t/epochs") == during, "joining a grace period in progress changed the epochs"
    assert c.in_grace()
    # Nobody reclaims for node 1: its part of grace runs out.
    b.wait_grace(False, 10)
    c.wait_grace(False, 2)
    assert not etcd.keys(f"sluice/t/clients/{rec:020d}/")
    # Node 1 comes back: a new grace period, in which its old client may
    # not reclaim (it missed the last one), while the survivor could.
    a.proc = None
    a.start()
    r = reclaim_open(x, xfh, "reclaim by a client that missed the last grace")
    assert r.status in (St.RECLAIM_BAD, St.NO_GRACE), f"reclaim by a client that missed the last grace: {r!r}"
    cur2, rec2 = map(int, etcd.get("sluice/t/epochs").split())
    if rec2:
        assert f"sluice/t/clients/{rec2:020d}/{b'survivor'.hex()}/002" in etcd.keys("sluice/t/clients/")
    for n in (a, b, c):
        n.wait_grace(False, 10)
    x.close()
    w.close()


def test_records_survive_sigkill_during_churn(cluster):
    """Clients arrive and leave on node 1 while it is killed at random
    points, five times: etcd holds every client whose arrival node 1
    acknowledged, in the epoch it recorded into, and none whose departure
    it acknowledged; the restarted node waits in grace for exactly those."""
    import random

    from test_state_recovery import churn_then_kill

    etcd, start = cluster
    a = start(1, grace=2)
    settled(a)
    rng = random.Random(21)
    total = 0
    for round_ in range(5):
        a.wait_grace(False, 15)
        epoch = int(etcd.get("sluice/t/epochs").split()[0])
        done, acked, departed, leaving = churn_then_kill(a, round_, rng.randrange(100, 300))
        total += done
        keys = etcd.keys(f"sluice/t/clients/{epoch:020d}/")
        recorded = {bytes.fromhex(k.split("/")[-2]) for k in keys if k.endswith("/001")}
        missing = (acked - leaving) - recorded
        assert not missing, f"round {round_}: {len(missing)} acknowledged arrivals missing, e.g. {sorted(missing)[:3]}"
        gone = departed & recorded
        assert not gone, f"round {round_}: {len(gone)} acknowledged departures still recorded"
        a.proc = None
        a.start()
        waiting = a.metrics()["sluice_grace_waiting_clients"]
        if recorded:
            assert a.in_grace() and waiting == len(recorded), (round_, waiting, len(recorded))
    assert total >= 500, f"only {total} arrivals and departures in 5 rounds"
    print(f"\n{total} client arrivals and departures on a cluster node, 5 SIGKILLs: etcd consistent every time")


def test_node_dies_during_grace(cluster):
    """Node 1 dies; its client X reclaims on node 2, which then dies too
    before grace is over: X lost its state again, and grace waits until X
    has reclaimed once more, on node 3."""
    etcd, start = cluster
    a, b, c = start(1, grace=30), start(2, grace=30), start(3, grace=30)
    settled(a, b, c)
    to_a, to_b = Proxy(a.port), Proxy(b.port)
    x = Client(to_a.port, owner=b"twice", verifier=b"boot-001").establish()
    _, xfh = x.must_open("x")
    w = Client(to_a.port, owner=b"late", verifier=b"boot-001").establish()
    _, wfh = w.must_open("w")
    a.stop(signal.SIGKILL)
    c.wait_grace(True, LEASE + 5)
    to_a.switch(b.port)
    reclaim(x, xfh, "X on node 2")
    b.stop(signal.SIGKILL)
    t0 = time.monotonic()
    while b"twice".hex() not in (etcd.get("sluice/t/need/002") or ""):
        assert time.monotonic() - t0 < LEASE + 5, f"node 2's death not handled: {etcd.keys('sluice/t/need/')}"
        time.sleep(0.05)
    to_a.switch(c.port)
    reclaim(w, wfh, "W on node 3")
    # W is done, X is not (its reclaim on node 2 went with node 2).
    stays_in_grace(c, 1.0, "grace ended while node 2's reclaimed client had lost its state again")
    reclaim(x, xfh, "X on node 3")
    ended = c.wait_grace(False, 5)
    print(f"\ngrace ended {ended * 1000:.0f} ms after the twice-moved client reclaimed again")
    for cl in (x, w):
        cl.close()
    to_a.close()
    to_b.close()


def test_whole_cluster_down(cluster):
    """Both nodes go down; node 1 comes back alone: grace waits for node
    2's clients too, which reclaim on node 1."""
    etcd, start = cluster
    a, b = start(1, grace=30), start(2, grace=30)
    settled(a, b)
    to_b = Proxy(b.port)
    x = Client(a.port, owner=b"of-node-1", verifier=b"boot-001").establish()
    _, xfh = x.must_open("x1")
    y = Client(to_b.port, owner=b"of-node-2", verifier=b"boot-001").establish()
    _, yfh = y.must_open("y1")
    a.stop(signal.SIGKILL)
    b.stop(signal.SIGKILL)
    t0 = time.monotonic()
    while etcd.keys("sluice/t/live/"):  # both leases run out in etcd
        assert time.monotonic() - t0 < LEASE + 5, etcd.keys("sluice/t/live/")
        time.sleep(0.05)
    a.proc = None
    a.start()
    assert a.in_grace()
    assert etcd.get("sluice/t/need/002") is not None, etcd.keys("sluice/t/need/")
    reclaim(x, xfh, "node 1's client")
    stays_in_grace(a, 1.0, "grace ended before node 2's client could reclaim")
    to_b.switch(a.port)
    reclaim(y, yfh, "node 2's client on node 1")
    a.wait_grace(False, 5)
    for cl in (x, y):
        cl.close()
    to_b.close()
