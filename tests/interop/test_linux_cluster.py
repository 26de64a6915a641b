"""Failover between cluster nodes with the Linux 6.12 kernel client.

etcd and three sluice nodes export one directory (standing in for the
cluster file system); the guest mounts NFSv4.1 through a TCP proxy on the
host that stands in for node 1's floating address. While the guest holds
an open file, an fcntl lock and has written a large file, the host kills
node 1 (SIGKILL). Once the other nodes have begun the cluster's grace
period (node 1's etcd lease ran out), the address moves to node 2, as
keepalived or Pacemaker would move it. The guest's client reconnects,
finds the server restarted, and reclaims its open and lock on node 2; its
writes through the open file go on and every file is exact. During grace
a client of node 3 cannot take a new lock. Guest half:
tests/vm/guest/cluster.sh. One boot, about a minute under emulation.
"""

from __future__ import annotations

import hashlib
import signal
import time

import pytest

import rpcclient as rc
from cluster import Etcd, Node, Proxy
from conftest import REPO
from rpcclient import WRITE_LT, Client, St, expect
from test_linux_client import GUEST_EXIT, ControlServer, boot_guest, failure_context, open_path

GUEST_SCRIPT = REPO / "tests" / "vm" / "guest" / "cluster.sh"
LEASE = 3  # --cluster-lease
GRACE = 15  # --grace-time
WAIT = 60


class Address:
    """What boot_guest and ControlServer need of a server: the floating
    address (port), the export and a log."""

    def __init__(self, proxy: Proxy, node: Node):
        self.proxy, self.node = proxy, node

    @property
    def port(self):
        return self.proxy.port

    @property
    def export(self):
        return self.node.export

    @property
    def log_path(self):
        return self.node.log_path


def lockt(port: int, path: str, start: int, length: int):
    """Another client's LOCKT of PATH's range on the node at `port`."""
    c = Client(port, machine="host-lockt").establish()
    try:
        *dirs, name = path.split("/")
        r = c.compound([rc.op_putrootfh(), *[rc.op_lookup(d) for d in [*dirs, name]],
                        rc.op_lockt(c.owner + b"/lockt", start, length, WRITE_LT)])
        return r
    finally:
        c.close()


def expect_held(port: int, path: str, start: int, length: int, what: str):
    r = lockt(port, path, start, length)
    expect(r, St.DENIED, what)
    d = r.results[-1]
    got = (d.denied_offset, d.denied_length, d.denied_type)
    assert got == (start, length, WRITE_LT), f"{what}: denied by {got}"


class ClusterControl(ControlServer):
    def __init__(self, nodes: list[Node], addr: Address):
        super().__init__(addr)
        self.nodes = nodes
        self.addr = addr
        self.timings = {}

    def _wait(self, what, ok, deadline=WAIT):
        t0 = time.monotonic()
        while not ok():
            assert time.monotonic() - t0 < deadline, f"{what}: not within {deadline} s"
            time.sleep(0.05)
        return time.monotonic() - t0

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        a, b, c = self.nodes
        if cmd == "held":
            path, start, length = arg.split()
            expect_held(a.port, path, int(start), int(length), f"{line} on node 1")
            return "ok"
        if cmd == "failover":
            a.stop(signal.SIGKILL)
            t0 = time.monotonic()
            self._wait("node 2 and node 3 in grace", lambda: b.in_grace() and c.in_grace(), LEASE + 10)
            self.timings["noticed"] = time.monotonic() - t0
            self.addr.proxy.switch(b.port)
            self.addr.node = b
            # A client of node 3 cannot take a lock on anything meanwhile.
            y = Client(c.port, machine="host-node3").establish()
            try:
                stateid, fh = open_path_or_grace(y, "fo/file")
                if stateid is not None:
                    r = y.lock(fh, stateid, offset=0, length=100)
                    expect(r, St.GRACE, "node 3: LOCK during the cluster's grace")
            finally:
                y.close()
            return "ok"
        if cmd == "reclaimed":
            path, start, length = arg.split()
            self.timings["reclaimed"] = self._wait(
                "node 2 counted the guest's reclaims (open and lock)",
                lambda: b.counter("sluice_reclaims") >= 2)
            self.timings["grace over"] = self._wait("the cluster's grace ends", lambda: not b.in_grace(), GRACE + WAIT)
            assert not c.in_grace()
            expect_held(b.port, path, int(start), int(length), f"{line} on node 2 after grace")
            return "ok"
        if cmd == "free":
            path, start, length = arg.split()
            r = lockt(b.port, path, int(start), int(length))
            expect(r, St.OK, f"{line} on node 2")
            return "ok"
        return super()._handle(line)


def open_path_or_grace(c: Client, path: str):
    """OPEN of an existing file during grace is a new open too: the node
    refuses it with NFS4ERR_GRACE, which is what the step wants to see.
    Returns (None, None) then."""
    *dirs, name = path.split("/")
    r = c.compound([rc.op_putrootfh(), *[rc.op_lookup(d) for d in dirs],
                    rc.op_open(c.owner + b"/open", name, create=False), rc.op_getfh()])
    if r.status == St.GRACE:
        return None, None
    expect(r, St.OK, f"node 3: OPEN of {path}")
    return r[2 + len(dirs)].stateid, r[3 + len(dirs)].fh


@pytest.fixture
def three_nodes(sluice_binary, tmp_path):
    etcd = Etcd(tmp_path)
    etcd.start()
    export = tmp_path / "export"
    export.mkdir()
    nodes = []
    for n in (1, 2, 3):
        node = Node(sluice_binary, export, tmp_path / f"node{n}", etcd.url, n,
                    extra=["--grace-time", GRACE, "--lease-time", 15, "--cluster-lease", LEASE])
        node.start()
        nodes.append(node)
    for node in nodes:
        deadline = time.monotonic() + GRACE + 10
        while node.in_grace():
            assert time.monotonic() < deadline, "the nodes' start-up grace did not end"
            time.sleep(0.05)
    yield etcd, nodes
    for node in nodes:
        node.stop()
    etcd.kill()


@pytest.mark.guest
def test_linux_failover(three_nodes, tmp_path):
    etcd, nodes = three_nodes
    proxy = Proxy(nodes[0].port)
    addr = Address(proxy, nodes[0])
    ctl = ClusterControl(nodes, addr)
    console_path = tmp_path / "guest-console.log"
    try:
        rc_ = boot_guest("6.12", addr, ctl, GUEST_SCRIPT, console_path, bins=("perl",))
    finally:
        ctl.close()
        proxy.close()
    out = console_path.read_text(errors="replace")
    print(out)

    def context():
        return failure_context(out, console_path, addr.node, 80)

    assert rc_ == 0, f"guest script failed: exit {rc_} {GUEST_EXIT.get(rc_, '')}" + context()
    assert "ALL CLUSTER STEPS PASSED" in out, "the guest did not finish" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    sent = [r.partition(" ")[0] for r in ctl.requests]
    assert sent == ["held", "failover", "reclaimed", "free"], sent
    print("host-side timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in ctl.timings.items()))
    export = nodes[0].export
    want = hashlib.md5(b"before the failover\nafter the failover\n").hexdigest()
    assert f"MD5 fo/file {want}" in out, "the guest read back other content" + context()
    assert hashlib.md5((export / "fo" / "file").read_bytes()).hexdigest() == want
    big = hashlib.md5((export / "fo" / "big").read_bytes()).hexdigest()
    assert f"MD5 fo/big {big}" in out, "fo/big on the server is not what the guest wrote"
    assert (export / "fo" / "big2").read_bytes() == (export / "fo" / "big").read_bytes()
    assert nodes[1].alive() and nodes[2].alive()
