"""NLM version 4 (byte-range locks for NFSv3 clients) and NSM version 1
(the status monitor) over raw RPC, against the real binary.

References: the Open Group's "Protocols for Interworking: XNFS, Version
3W", chapter 10 (NLM) and chapter 11 (NSM), with the 64-bit NLMv4 types of
RFC 1813; where XNFS leaves a choice, what the Linux server answers:
fs/lockd/svc4proc.c (procedures), fs/lockd/svclock.c (locking, blocking,
grace), fs/lockd/xdr4.c (decoding), fs/lockd/svcsubs.c (FREE_ALL and
reboot cleanup), fs/nfsd/lockd.c (opening the file) and nfs-utils' statd.
Each test says which one it follows.

Each test starts `sluice serve DIR` through conftest's fixtures (root not
squashed) and talks to it with nlmclient.py: MOUNT and NFSv3
(v3client.py) for the file handles, then NLM and NSM, all on the server's
one port, over TCP unless the test says UDP. NFSv4 locks go through
rpcclient.py's sessions. Lock owners are (caller_name, svid, oh).

Rules checked:

* NLM 4 and NSM 1 answer on the NFS port over TCP and UDP; other NLM
  versions get PROG_MISMATCH 4-4; the portmapper on the NFS port, and
  sluice's own (--portmap), map both programs, TCP and UDP, to that port;
  the _MSG/_RES procedures get PROC_UNAVAIL;
* TEST/LOCK/UNLOCK/CANCEL semantics: conflicts, the holder a TEST
  reports, ranges to the end of the file, an owner never conflicts with
  itself (relock, upgrade, downgrade, split, merge), blocking requests,
  their order, their cancellation and the NLM_GRANTED call to the client
  when they are granted, stale handles, FBIG, read-only exports, export
  client rules, permissions, NM_LOCK, SHARE/UNSHARE, FREE_ALL, SM_NOTIFY
  from a rebooted client;
* NLM and NFSv4 locks are one lock table: conflicts both ways, releases
  on either side granting waiters on the other, courtesy clients, and
  delegations recalled before an NLM lock could contradict locks their
  holder keeps to itself; NLM locks stay advisory for NFSv3 READ/WRITE;
* grace after a restart when there were clients (NLM hosts or NFSv4
  clients), none without, and not cut short by NFSv4 clients finishing
  while NLM hosts may still reclaim; reclaims; the NSM state number;
  SM_NOTIFY to the hosts that held locks, through a fake portmapper and
  status monitor (`--nsm-portmap`);
* malformed calls get GARBAGE_ARGS and the connection keeps serving.

Run (as root):

    python3 -m pytest -q tests/interop/test_nlm.py

`SLUICE_BINARY=PATH` uses a binary built elsewhere (nothing is rebuilt).
`NLM_TARGET=HOST:NFSPORT:MOUNTPORT:EXPORTPATH:PMAPPORT:NLMPORT` runs the
tests that need no sluice of their own against another server (the
export must not squash root); NSM's are skipped then, since another
server's status monitor is a program apart.

Run so against the Linux server (knfsd and lockd of Linux 6.12 in a
guest, rpc.statd running, every caller_name the tests use resolving to
the host), 51 passed and 29 failed, each on one of these differences:
- it tells client hosts apart by address, not by caller_name
  (fs/lockd/host.c): the tests' hosts, all from one address, are one
  host to it, so owners with the same svid are one owner, and FREE_ALL
  releases the locks of every caller_name at the caller's address;
- TEST's holder has svid 173 whoever holds the lock, and an empty
  owner handle, where XNFS reports the holder's own;
- an exclusive TEST over another owner's shared lock answers
  NLM4_GRANTED, while the exclusive LOCK of the same range is denied;
- a blocking request that would close a circle of waiters is answered
  NLM4_BLOCKED, not NLM4_DEADLCK; a CANCEL of nothing NLM4_GRANTED (XNFS
  allows both; sluice answers NLM4_DENIED);
- a zeroed handle gets NLM4_FAILED and a handle with bytes appended
  works (sluice: NLM4_STALE_FH), and a SHARE without its reclaim flag is
  taken;
- NLM versions 1 and 3 are served (sluice serves 4, the one NFSv3
  clients use), and GRANTED_MSG and the _RES procedures are answered:
  lockd is a client's lock manager too.
Its answers to LOCK_MSG and UNLOCK_MSG over TCP, checked by hand with a
fake portmapper and lock manager on the host, are what sluice sends: a
void reply, a PMAP GETPORT for NLM 4 over TCP at the caller's address,
then LOCK_RES and UNLOCK_RES with the request's cookie.

No sleeps for synchronisation: every wait is a blocking read with a
timeout; only the tests of a grace period and of a lease running out
poll, since time passing is what they check.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

import nlmclient as n
import rpcclient as rc
import v3client as v
from nlmclient import (
    FSA_R,
    FSA_W,
    FSM_DN,
    FSM_DR,
    FSM_DW,
    NLM_PROGRAM,
    NLM_V4,
    NSM_PROGRAM,
    NSM_V1,
    OFFSET_MAX,
    STAT_FAIL,
    STAT_SUCC,
    Lock,
    NlmClient,
    NlmProc,
    S,
    Share,
    SmProc,
    stat_name,
)
from rpcclient import OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_DENY_NONE, READ_LT, WRITE_LT, Client, St
from rpcclient import expect_ok as expect_ok4
from v3client import IPPROTO_TCP, IPPROTO_UDP, UNCHECKED, Packer, sattr3, unique

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

GRACE = 8  # --grace-time of the restart tests: the checks are made right after the restart
U64 = (1 << 64) - 1

# --- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sluice_binary() -> Path:
    """$SLUICE_BINARY when set (a separately built copy: nothing is
    rebuilt), else conftest's build."""
    env = os.environ.get("SLUICE_BINARY")
    if env:
        return Path(env)
    import conftest

    return conftest.build_binary()


def external_target() -> tuple[v.Target, int] | None:
    """The server named by NLM_TARGET
    (HOST:NFSPORT:MOUNTPORT:EXPORTPATH:PMAPPORT:NLMPORT) and its NLM port,
    or None."""
    env = os.environ.get("NLM_TARGET")
    if not env:
        return None
    host, port, mport, rest = env.split(":", 3)
    path, pmap, nlm_port = rest.rsplit(":", 2)
    return v.Target(host, int(port), int(mport), path, int(pmap)), int(nlm_port)


EXTERNAL = external_target()

# Tests that start, configure, restart or look inside sluice: skipped
# against another server.
SLUICE_FIXTURES = {"server", "sluice_server", "sluice_factory", "restartable", "sluice_binary"}


@pytest.fixture(autouse=True)
def _sluice_or_external(request):
    if EXTERNAL and SLUICE_FIXTURES & set(request.fixturenames):
        pytest.skip("needs sluice started by the fixtures (NLM_TARGET is set)")


@pytest.fixture
def nsm_here():
    """NSM on the NLM port, as sluice serves it; another server's status
    monitor is a program of its own elsewhere."""
    if EXTERNAL:
        pytest.skip("NSM is not served on another server's NLM port (NLM_TARGET is set)")


class Env:
    """The export root's handle, an NFSv3 client for making files, and the
    port, of one server (sluice on `port`, or `target`)."""

    def __init__(self, port: int, target: v.Target | None = None):
        self.port = port
        self.target = target or v.Target("127.0.0.1", port, port, "/", port)
        self.root = self.target.root_fh()
        self.nfs = self.target.nfs()

    def new_file(self, name: str | None = None, data: bytes = b"0123456789" * 100) -> bytes:
        """A new file in the export root (mode 0666); its NFSv3 handle."""
        name = name or unique("nlm")
        r = self.nfs.must(self.nfs.create(self.root, name, UNCHECKED, sattr3(mode=0o666)), f"CREATE {name}")
        fh = r.fh or self.nfs.must(self.nfs.lookup(self.root, name)).fh
        if data:
            self.nfs.must(self.nfs.write(fh, 0, data, v.FILE_SYNC), f"WRITE {name}")
        return fh

    def lookup(self, name: str) -> bytes:
        return self.nfs.must(self.nfs.lookup(self.root, name), f"LOOKUP {name}").fh

    def close(self):
        self.nfs.close()


@pytest.fixture
def server(sluice_server):
    return sluice_server


@pytest.fixture
def env(request):
    if EXTERNAL:
        e = Env(EXTERNAL[0].port, EXTERNAL[0])
    else:
        e = Env(request.getfixturevalue("sluice_server").port)
    yield e
    e.close()


@pytest.fixture
def nlm(request):
    if EXTERNAL:
        port, host = EXTERNAL[1], EXTERNAL[0].host
    else:
        port, host = request.getfixturevalue("sluice_server").port, "127.0.0.1"
    with NlmClient(port, host) as c:
        yield c


@pytest.fixture
def fh(env) -> bytes:
    return env.new_file()


# --- helpers -----------------------------------------------------------------


def expect(res: n.NlmRes, stat: int, what: str = "") -> n.NlmRes:
    assert res.stat == stat, f"{what or res.proc}: expected {stat_name(stat)}, got {res!r}"
    return res


def owner(fh: bytes, name: str = "host-a", svid: int = 1, offset: int = 0, length: int = 100, oh: bytes | None = None) -> Lock:
    """A lock of owner (name, svid, oh) on bytes [offset, offset+length)."""
    return Lock(name, fh, oh if oh is not None else f"{name}/{svid}".encode(), svid, offset, length)


def accepted(r, what: str):
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.SUCCESS), f"{what}: {r!r}"
    return r


def garbage(c: NlmClient, prog: int, vers: int, proc: int, args: bytes, what: str):
    r = c.call_raw(prog, vers, proc, args)
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.GARBAGE_ARGS), f"{what}: expected GARBAGE_ARGS, got {r!r}"


def v4_client(port: int) -> Client:
    return Client(port).establish()


def v4_open(c: Client, name: str) -> tuple[bytes, bytes]:
    """(open stateid, NFSv4 handle) of `name` in the root, opened for both
    and created if missing."""
    return c.must_open(name, access=OPEN4_SHARE_ACCESS_BOTH, deny=OPEN4_SHARE_DENY_NONE)


def v4_lock(c: Client, fh4: bytes, sid: bytes, owner_: bytes, offset: int, length: int, locktype: int = WRITE_LT):
    return c.lock(fh4, sid, owner=owner_, offset=offset, length=length, locktype=locktype)


def unique_name_v4() -> str:
    return rc.unique_name("nlmv4")


def sm_state(port: int) -> int:
    with NlmClient(port) as c:
        return c.sm_stat("localhost").state


# --- 1. programs, versions, procedures, portmapper -----------------------------


def test_nlm_null_over_tcp(nlm):
    r = accepted(nlm.null(), "NLM4 NULL over TCP")
    assert r.body == b"", r


def test_nlm_null_over_udp(server):
    with NlmClient(server.port, udp=True) as c:
        r = accepted(c.null(), "NLM4 NULL over UDP on the NFS port")
        assert r.body == b"", r


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_nsm_null(server, udp):
    with NlmClient(server.port, udp=udp) as c:
        r = accepted(c.sm_null(), f"NSM NULL over {'UDP' if udp else 'TCP'}")
        assert r.body == b"", r


@pytest.mark.parametrize("vers", [1, 2, 3, 5])
def test_other_nlm_versions_get_prog_mismatch_4_to_4(nlm, vers):
    r = nlm.call_raw(NLM_PROGRAM, vers, 0)
    assert (r.reply_stat, r.accept_stat, r.low, r.high) == (rc.MSG_ACCEPTED, rc.PROG_MISMATCH, 4, 4), f"NLM version {vers} NULL: {r!r}"
    assert accepted(nlm.null(), "NLM4 NULL afterwards")


def test_other_nsm_versions_get_prog_mismatch_1_to_1(nlm, nsm_here):
    r = nlm.call_raw(NSM_PROGRAM, 2, 0)
    assert (r.reply_stat, r.accept_stat, r.low, r.high) == (rc.MSG_ACCEPTED, rc.PROG_MISMATCH, 1, 1), f"NSM version 2 NULL: {r!r}"


@pytest.mark.parametrize("proc", list(range(NlmProc.GRANTED_MSG, NlmProc.GRANTED_RES + 1)))
def test_granted_msg_and_res_procedures_get_proc_unavail(nlm, fh, proc):
    """GRANTED_MSG and the _RES procedures (10-15) go from a server to a
    client, or answer calls a server never makes: they are not served.
    Whatever they carry, they change nothing. (The Linux server, which
    is a client too, answers them.)"""
    args = n.testargs(owner(fh), True, b"msgcookie") if proc == NlmProc.GRANTED_MSG else n.encode_res(b"msgcookie", S.GRANTED)
    r = nlm.call_raw(NLM_PROGRAM, NLM_V4, proc, args)
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.PROC_UNAVAIL), f"NLM4 procedure {proc}: {r!r}"
    expect(nlm.test(owner(fh, "host-b", 2)), S.GRANTED, "TEST after the refused call (no lock may have been taken)")


@pytest.mark.parametrize("proc", [17, 18, 19, 24, 1000])
def test_unassigned_procedures_get_proc_unavail(nlm, proc):
    r = nlm.call_raw(NLM_PROGRAM, NLM_V4, proc, b"")
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.PROC_UNAVAIL), f"NLM4 procedure {proc}: {r!r}"


def test_unassigned_nsm_procedure_gets_proc_unavail(nlm, nsm_here):
    r = nlm.call_raw(NSM_PROGRAM, NSM_V1, 99, b"")
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.PROC_UNAVAIL), f"NSM procedure 99: {r!r}"


@pytest.mark.parametrize("prot", [IPPROTO_TCP, IPPROTO_UDP], ids=["tcp", "udp"])
def test_portmapper_maps_nlm4_and_nsm1_to_the_nfs_port(server, prot):
    with v.Portmap(server.port) as pm:
        assert pm.getport(NLM_PROGRAM, NLM_V4, prot) == server.port, f"GETPORT NLM 4 prot {prot}"
        assert pm.getport(NSM_PROGRAM, NSM_V1, prot) == server.port, f"GETPORT NSM 1 prot {prot}"


def test_portmapper_dump_lists_nlm4_and_nsm1(server):
    """rpcinfo -p shows what GETPORT answers."""
    with v.Portmap(server.port) as pm:
        maps = pm.dump()
    for prog, vers in ((NLM_PROGRAM, NLM_V4), (NSM_PROGRAM, NSM_V1)):
        for prot in (IPPROTO_TCP, IPPROTO_UDP):
            assert (prog, vers, prot, server.port) in maps, f"({prog}, {vers}, {prot}, {server.port}) not in DUMP {maps}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u.bind(("127.0.0.1", port))
        return port


def test_own_portmapper_maps_nlm4_and_nsm1(sluice_factory):
    """With --portmap (a machine without rpcbind), the portmapper that
    NFSv3 clients ask on port 111 (here on another port) also maps NLM 4
    and NSM 1, TCP and UDP, to the NFS port: a Linux client mounting
    without `nolock` asks it for NLM."""
    pport = _free_port()
    srv = sluice_factory("--portmap", "--portmap-listen", f"127.0.0.1:{pport}", root_squash=False)
    with v.Portmap(pport) as pm:
        for prot in (IPPROTO_TCP, IPPROTO_UDP):
            assert pm.getport(NLM_PROGRAM, NLM_V4, prot) == srv.port, f"GETPORT NLM 4 prot {prot} at --portmap"
            assert pm.getport(NSM_PROGRAM, NSM_V1, prot) == srv.port, f"GETPORT NSM 1 prot {prot} at --portmap"
    with NlmClient(pport, udp=True) as u:
        xid = rc.next_xid()
        u.conn.send_record(rc.call_header(xid, prog=v.PMAP_PROGRAM, vers=2, proc=3, cred_flavor=rc.AUTH_NONE, cred_body=b"") + Packer().u32(NLM_PROGRAM).u32(NLM_V4).u32(IPPROTO_UDP).u32(0).bytes())
        r = accepted(u.conn.wait_for(xid), "GETPORT over UDP at --portmap")
        assert rc.Unpacker(r.body).u32() == srv.port, "GETPORT NLM 4 udp, asked over UDP"


# --- 2. TEST, LOCK, UNLOCK -------------------------------------------------------


def test_conflicting_lock_is_denied_and_replies_echo_the_cookie(nlm, fh):
    a, b = owner(fh, "host-a", 1), owner(fh, "host-b", 2, offset=50, length=10)
    r = expect(nlm.lock(a, cookie=b"\x01\x02\x03"), S.GRANTED, "A's LOCK")
    assert r.cookie == b"\x01\x02\x03", f"LOCK did not echo the 3-byte cookie: {r!r}"
    r = expect(nlm.lock(b, cookie=b"c" * 32), S.DENIED, "B's overlapping non-blocking LOCK")
    assert r.cookie == b"c" * 32, f"LOCK did not echo the 32-byte cookie: {r!r}"
    r = expect(nlm.unlock(a, cookie=b"unlk"), S.GRANTED, "A's UNLOCK")
    assert r.cookie == b"unlk", r
    expect(nlm.lock(b), S.GRANTED, "B's LOCK once A unlocked")


def test_test_reports_the_holder(nlm, fh):
    """XNFS NLM_TEST: LCK_DENIED with the conflicting lock's holder:
    exclusive, svid, offset and length as locked (Linux leaves the owner
    handle empty; the holder's own is also right)."""
    a = owner(fh, "host-a", 4242, offset=100, length=50, oh=b"owner-handle-a")
    expect(nlm.lock(a), S.GRANTED, "A's LOCK")
    r = expect(nlm.test(owner(fh, "host-b", 7, offset=120, length=1), cookie=b"tst"), S.DENIED, "B's TEST inside A's range")
    assert r.cookie == b"tst", r
    h = r.holder
    assert h is not None and (h.exclusive, h.svid, h.offset, h.length) == (True, 4242, 100, 50), f"holder: {r!r}"
    assert h.oh in (b"owner-handle-a", b""), f"holder oh {h.oh!r} is neither A's owner handle nor empty"
    expect(nlm.test(owner(fh, "host-b", 7, offset=150, length=10)), S.GRANTED, "B's TEST just past A's range")
    expect(nlm.test(owner(fh, "host-b", 7, offset=0, length=100)), S.GRANTED, "B's TEST just before A's range")


def test_test_takes_no_lock(nlm, fh):
    expect(nlm.test(owner(fh, "host-a", 1)), S.GRANTED, "A's TEST")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.GRANTED, "B's LOCK after A's TEST")


def test_shared_locks_coexist_and_exclude_exclusive_ones(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1), exclusive=False), S.GRANTED, "A's shared LOCK")
    expect(nlm.lock(owner(fh, "host-b", 2), exclusive=False), S.GRANTED, "B's shared LOCK on the same range")
    expect(nlm.test(owner(fh, "host-c", 3), exclusive=False), S.GRANTED, "C's shared TEST")
    r = expect(nlm.test(owner(fh, "host-c", 3), exclusive=True), S.DENIED, "C's exclusive TEST")
    assert r.holder.exclusive is False, f"the holder of a shared lock is reported exclusive: {r!r}"
    expect(nlm.lock(owner(fh, "host-c", 3)), S.DENIED, "C's exclusive LOCK")


def test_exclusive_lock_excludes_shared_ones(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's exclusive LOCK")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=99, length=1), exclusive=False), S.DENIED, "B's shared LOCK on A's last byte")


def test_length_zero_locks_to_the_end_of_the_file(nlm, fh):
    """l_len 0 means to the end of the file, also past its current size;
    TEST reports such a holder with length 0 (Linux nlm4_encode_testres)."""
    expect(nlm.lock(owner(fh, "host-a", 1, offset=100, length=0)), S.GRANTED, "A's LOCK [100, EOF)")
    r = expect(nlm.test(owner(fh, "host-b", 2, offset=1 << 40, length=1)), S.DENIED, "B's TEST at 1 TiB")
    assert (r.holder.offset, r.holder.length) == (100, 0), f"holder of a lock to EOF: {r!r}"
    expect(nlm.test(owner(fh, "host-b", 2, offset=OFFSET_MAX, length=1)), S.DENIED, "B's TEST of the last lockable byte")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=0, length=100)), S.GRANTED, "B's LOCK of [0, 100)")


def test_adjacent_ranges_do_not_conflict(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1, offset=0, length=100)), S.GRANTED, "A [0, 100)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=100, length=100)), S.GRANTED, "B [100, 200)")
    expect(nlm.lock(owner(fh, "host-c", 3, offset=200, length=0)), S.GRANTED, "C [200, EOF)")
    expect(nlm.lock(owner(fh, "host-d", 4, offset=99, length=2)), S.DENIED, "D [99, 101) across A and B")


def test_locks_are_per_file(nlm, env):
    f1, f2 = env.new_file(), env.new_file()
    expect(nlm.lock(owner(f1, "host-a", 1)), S.GRANTED, "A on file 1")
    expect(nlm.lock(owner(f2, "host-b", 2)), S.GRANTED, "B on file 2, same range")


def test_relocking_is_granted_and_locks_do_not_stack(nlm, fh):
    """POSIX locks of one owner do not count: locking a range twice and
    unlocking it once leaves nothing."""
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a), S.GRANTED, "A's LOCK")
    expect(nlm.lock(a), S.GRANTED, "A's LOCK again (an owner never conflicts with itself)")
    expect(nlm.test(a), S.GRANTED, "A's TEST of its own lock")
    expect(nlm.unlock(a), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.GRANTED, "B's LOCK after A's single UNLOCK")


def test_upgrade_shared_to_exclusive(nlm, fh):
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a, exclusive=False), S.GRANTED, "A's shared LOCK")
    expect(nlm.lock(a, exclusive=True), S.GRANTED, "A's upgrade to exclusive")
    r = expect(nlm.test(owner(fh, "host-b", 2), exclusive=False), S.DENIED, "B's shared TEST after A's upgrade")
    assert r.holder.exclusive is True, r


def test_upgrade_is_denied_while_another_owner_shares(nlm, fh):
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a, exclusive=False), S.GRANTED, "A's shared LOCK")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=50, length=1), exclusive=False), S.GRANTED, "B's shared LOCK of byte 50")
    expect(nlm.lock(a, exclusive=True), S.DENIED, "A's upgrade over B's shared byte")
    # the failed upgrade left A's shared lock as it was
    expect(nlm.lock(owner(fh, "host-c", 3), exclusive=False), S.GRANTED, "C's shared LOCK")


def test_downgrade_exclusive_to_shared(nlm, fh):
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a, exclusive=True), S.GRANTED, "A's exclusive LOCK")
    expect(nlm.lock(a, exclusive=False), S.GRANTED, "A's downgrade to shared")
    expect(nlm.lock(owner(fh, "host-b", 2), exclusive=False), S.GRANTED, "B's shared LOCK after the downgrade")
    expect(nlm.lock(owner(fh, "host-c", 3), exclusive=True), S.DENIED, "C's exclusive LOCK")


def test_unlocking_the_middle_splits_a_lock(nlm, fh):
    a = owner(fh, "host-a", 1, offset=0, length=100)
    expect(nlm.lock(a), S.GRANTED, "A [0, 100)")
    expect(nlm.unlock(a.range(40, 20)), S.GRANTED, "A's UNLOCK [40, 60)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=40, length=20)), S.GRANTED, "B [40, 60)")
    expect(nlm.test(owner(fh, "host-c", 3, offset=39, length=1)), S.DENIED, "C's TEST of byte 39 (A's left part)")
    r = expect(nlm.test(owner(fh, "host-c", 3, offset=60, length=1)), S.DENIED, "C's TEST of byte 60 (A's right part)")
    assert (r.holder.svid, r.holder.offset, r.holder.length) == (1, 60, 40), f"the right part of the split lock: {r!r}"


def test_adjacent_locks_of_an_owner_unlock_together(nlm, fh):
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a.range(0, 50)), S.GRANTED, "A [0, 50)")
    expect(nlm.lock(a.range(50, 50)), S.GRANTED, "A [50, 100)")
    expect(nlm.unlock(a.range(0, 100)), S.GRANTED, "A's UNLOCK [0, 100)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=0, length=100)), S.GRANTED, "B [0, 100)")


def test_overlapping_relock_of_another_mode_replaces_the_overlap_only(nlm, fh):
    """POSIX: A exclusive [0, 100) then A shared [50, 150) leaves A
    exclusive on [0, 50) and shared on [50, 150)."""
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a.range(0, 100), exclusive=True), S.GRANTED, "A exclusive [0, 100)")
    expect(nlm.lock(a.range(50, 100), exclusive=False), S.GRANTED, "A shared [50, 150)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=60, length=10), exclusive=False), S.GRANTED, "B shared [60, 70)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=10, length=10), exclusive=False), S.DENIED, "B shared [10, 20)")


def test_unlock_of_a_range_not_held_is_granted(nlm, fh):
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "UNLOCK of nothing")


def test_unlock_by_another_owner_does_not_release(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    expect(nlm.unlock(owner(fh, "host-b", 2)), S.GRANTED, "B's UNLOCK of the same range (nothing of B's)")
    expect(nlm.unlock(owner(fh, "host-a", 2)), S.GRANTED, "UNLOCK by A's host with another svid")
    r = expect(nlm.test(owner(fh, "host-c", 3)), S.DENIED, "C's TEST: A's lock must still be there")
    assert r.holder.svid == 1, r


def test_svid_tells_owners_of_one_host_apart(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "host-a svid 1")
    expect(nlm.lock(owner(fh, "host-a", 2)), S.DENIED, "host-a svid 2 on the same range")


def test_caller_name_tells_hosts_apart(nlm, fh):
    expect(nlm.lock(Lock("host-a", fh, b"same-oh", 1, 0, 100)), S.GRANTED, "host-a svid 1")
    expect(nlm.lock(Lock("host-b", fh, b"same-oh", 1, 0, 100)), S.DENIED, "host-b with the same svid and oh")


def test_locks_outlive_the_connection(server, fh):
    """NLM locks belong to the host, not to a TCP connection: a client
    that reconnects (or sends the next call over UDP) still holds them."""
    with NlmClient(server.port) as first:
        expect(first.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK on a first connection")
    with NlmClient(server.port) as second:
        expect(second.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK after A's connection closed")
        expect(second.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK on a new connection")
        expect(second.lock(owner(fh, "host-b", 2)), S.GRANTED, "B's LOCK after that")


def test_fragmented_and_pipelined_calls(server, nlm, fh):
    """A LOCK split over several record fragments, and 32 LOCKs sent
    without waiting, each answered once with its own cookie."""
    xid = rc.next_xid()
    nlm.conn.send_record(rc.call_header(xid, prog=NLM_PROGRAM, vers=NLM_V4, proc=NlmProc.LOCK, cred_body=nlm.cred) + n.lockargs(owner(fh, "host-f", 1, offset=0, length=1), True, False, False, 1, b"frag"), fragments=5)
    r = accepted(nlm.conn.wait_for(xid), "LOCK in 5 fragments")
    got = n.decode_res("LOCK", r.body)
    assert (got.cookie, got.stat) == (b"frag", S.GRANTED), got
    records = []
    for i in range(32):
        x = rc.next_xid()
        args = n.lockargs(owner(fh, f"host-{i}", i, offset=100 + i, length=1), True, False, False, 1, b"p%03d" % i)
        records.append((x, rc.call_header(x, prog=NLM_PROGRAM, vers=NLM_V4, proc=NlmProc.LOCK, cred_body=nlm.cred) + args))
    replies = nlm.conn.pipeline(records)
    for i, (x, _) in enumerate(records):
        res = n.decode_res("LOCK", accepted(replies[x], f"pipelined LOCK {i}").body)
        assert (res.cookie, res.stat) == (b"p%03d" % i, S.GRANTED), f"pipelined LOCK {i}: {res!r}"
    expect(nlm.test(owner(fh, "host-x", 99, offset=100, length=32)), S.DENIED, "TEST over the 32 pipelined locks")


def test_racing_nlm_and_nfsv4_lockers_get_exactly_one_lock(server, env):
    """Six NLM hosts and two NFSv4 clients ask for the same range at once:
    exactly one of them gets it."""
    name = unique("race")
    v4s = [v4_client(server.port) for _ in range(2)]
    opened = [v4_open(c, name) for c in v4s]
    fh3 = env.lookup(name)
    nlms = [NlmClient(server.port) for _ in range(6)]
    barrier = threading.Barrier(len(v4s) + len(nlms))
    results: dict[str, object] = {}

    def nlm_locker(i, c):
        barrier.wait(timeout=10)
        results[f"nlm-{i}"] = c.lock(owner(fh3, f"racer-{i}", i, offset=0, length=10)).stat == S.GRANTED

    def v4_locker(i, c, sid, fh4):
        barrier.wait(timeout=10)
        results[f"v4-{i}"] = v4_lock(c, fh4, sid, b"racer-v4-%d" % i, 5, 10).status == St.OK

    threads = [threading.Thread(target=nlm_locker, args=(i, c)) for i, c in enumerate(nlms)]
    threads += [threading.Thread(target=v4_locker, args=(i, c, sid, fh4)) for i, (c, (sid, fh4)) in enumerate(zip(v4s, opened))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(results) == len(threads), f"some lockers got no answer: {results}"
        winners = [k for k, ok in results.items() if ok]
        assert len(winners) == 1, f"overlapping exclusive locks granted to {winners}"
    finally:
        for c in nlms:
            c.close()
        for c in v4s:
            c.close()


# --- 3. blocking requests and CANCEL ----------------------------------------------


def test_blocking_lock_is_blocked_then_granted_when_the_conflict_goes(nlm, fh):
    """XNFS NLM_LOCK with block=true: LCK_BLOCKED while the conflict lasts
    (a retransmission too), the lock is granted once it goes; the client
    that sends the same LOCK again then gets LCK_GRANTED (Linux
    nlmsvc_lock finds its block, or the lock already given to it)."""
    a, b = owner(fh, "host-a", 1), owner(fh, "host-b", 2, offset=50, length=100)
    expect(nlm.lock(a), S.GRANTED, "A's LOCK")
    expect(nlm.lock(b, block=True), S.BLOCKED, "B's blocking LOCK")
    expect(nlm.lock(b, block=True), S.BLOCKED, "B's blocking LOCK sent again while A holds")
    r = expect(nlm.test(owner(fh, "host-c", 3, offset=60, length=1)), S.DENIED, "C's TEST of a byte A holds and B waits for")
    assert r.holder.svid == 1, f"the holder should be A (B only waits): {r!r}"
    expect(nlm.unlock(a), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(b, block=True), S.GRANTED, "B's blocking LOCK sent again after A unlocked")
    r = expect(nlm.test(owner(fh, "host-c", 3, offset=120, length=1)), S.DENIED, "C's TEST: B now holds")
    assert r.holder.svid == 2, r


def test_blocking_request_that_would_deadlock_is_refused(nlm, fh):
    """A waits for B's range while holding its own; B's blocking request
    for A's range would close the circle: NLM4_DEADLCK (XNFS: "blocking
    would cause a deadlock"). The Linux server (6.12) answers
    NLM4_BLOCKED here: see the module's notes."""
    a, b = owner(fh, "host-a", 1, offset=0, length=10), owner(fh, "host-b", 2, offset=10, length=10)
    expect(nlm.lock(a), S.GRANTED, "A [0, 10)")
    expect(nlm.lock(b), S.GRANTED, "B [10, 20)")
    expect(nlm.lock(a.range(10, 10), block=True), S.BLOCKED, "A's blocking LOCK of B's range")
    expect(nlm.lock(b.range(0, 10), block=True), S.DEADLCK, "B's blocking LOCK of A's range")


def test_three_owner_deadlock_is_refused(nlm, fh):
    a = owner(fh, "host-a", 1, offset=0, length=10)
    b = owner(fh, "host-b", 2, offset=10, length=10)
    c = owner(fh, "host-c", 3, offset=20, length=10)
    for lk, who in ((a, "A"), (b, "B"), (c, "C")):
        expect(nlm.lock(lk), S.GRANTED, f"{who}'s LOCK")
    expect(nlm.lock(a.range(10, 10), block=True), S.BLOCKED, "A waits for B")
    expect(nlm.lock(b.range(20, 10), block=True), S.BLOCKED, "B waits for C")
    expect(nlm.lock(c.range(0, 10), block=True), S.DEADLCK, "C's request for A's range closes the circle")


@pytest.mark.parametrize("how", ["granted", "cancelled", "unrelated"])
def test_no_deadlock_without_a_circle(nlm, fh, how):
    """Only a real circle is a deadlock: not once the waiter got its lock
    or cancelled its request, nor when the holder asked for is not waiting
    for anybody."""
    a = owner(fh, "host-a", 1, offset=0, length=10)
    b = owner(fh, "host-b", 2, offset=10, length=10)
    expect(nlm.lock(a), S.GRANTED, "A [0, 10)")
    expect(nlm.lock(b), S.GRANTED, "B [10, 20)")
    if how == "unrelated":
        c = owner(fh, "host-c", 3, offset=20, length=10)
        expect(nlm.lock(c), S.GRANTED, "C [20, 30)")
        expect(nlm.lock(a.range(10, 10), block=True), S.BLOCKED, "A waits for B")
        expect(nlm.lock(b.range(20, 10), block=True), S.BLOCKED, "B waits for C, who waits for nobody")
        return
    expect(nlm.lock(a.range(10, 10), block=True), S.BLOCKED, "A waits for B")
    if how == "granted":
        expect(nlm.unlock(b), S.GRANTED, "B's UNLOCK")
        expect(nlm.lock(a.range(10, 10), block=True), S.GRANTED, "A's request sent again: granted")
        b2 = owner(fh, "host-b", 2, offset=30, length=10)
        expect(nlm.lock(b2), S.GRANTED, "B [30, 40)")
        expect(nlm.lock(b2.range(0, 10), block=True), S.BLOCKED, "B waits for A, who waits for nobody now")
    else:
        expect(nlm.cancel(a.range(10, 10), block=True), S.GRANTED, "A's CANCEL")
        expect(nlm.lock(b.range(0, 10), block=True), S.BLOCKED, "B waits for A, whose request was cancelled")


def test_a_waiting_request_holds_nothing(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1, offset=0, length=100)), S.GRANTED, "A [0, 100)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=50, length=100), block=True), S.BLOCKED, "B's blocking LOCK [50, 150)")
    expect(nlm.test(owner(fh, "host-c", 3, offset=120, length=1)), S.GRANTED, "C's TEST of byte 120, which only B waits for")
    expect(nlm.lock(owner(fh, "host-c", 3, offset=120, length=1)), S.GRANTED, "C's LOCK of byte 120")


def test_non_blocking_lock_is_denied_not_blocked(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    expect(nlm.lock(owner(fh, "host-b", 2), block=False), S.DENIED, "B's non-blocking LOCK")
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
    expect(nlm.test(owner(fh, "host-c", 3)), S.GRANTED, "C's TEST: B's denied request left nothing waiting or held")


def test_cancel_removes_a_blocked_request(nlm, fh):
    a, b = owner(fh, "host-a", 1), owner(fh, "host-b", 2)
    expect(nlm.lock(a), S.GRANTED, "A's LOCK")
    expect(nlm.lock(b, block=True), S.BLOCKED, "B's blocking LOCK")
    r = expect(nlm.cancel(b, block=True, cookie=b"cncl"), S.GRANTED, "B's CANCEL of its blocked request")
    assert r.cookie == b"cncl", r
    expect(nlm.unlock(a), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(owner(fh, "host-c", 3)), S.GRANTED, "C's LOCK: B's cancelled request must not have been granted")
    r = expect(nlm.test(owner(fh, "host-d", 4)), S.DENIED, "D's TEST")
    assert r.holder.svid == 3, f"the holder should be C, not B: {r!r}"


def test_cancel_of_nothing_is_denied(nlm, fh):
    """XNFS NLM_CANCEL allows LCK_GRANTED or LCK_DENIED when there is no
    matching request; sluice answers LCK_DENIED (Linux answers
    LCK_GRANTED: nlmsvc_cancel_blocked)."""
    expect(nlm.cancel(owner(fh, "host-a", 1), block=True), S.DENIED, "CANCEL with no blocked request")


def test_cancel_does_not_release_a_granted_lock(nlm, fh):
    """NLM_CANCEL cancels an outstanding blocked request only (XNFS; Linux
    stopped unlocking on CANCEL for this reason): a CANCEL matching a
    granted lock leaves it held."""
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a, block=True), S.GRANTED, "A's blocking LOCK, granted at once")
    r = nlm.cancel(a, block=True)
    assert r.stat in (S.GRANTED, S.DENIED), f"CANCEL of a granted lock: {r!r}"
    r = expect(nlm.test(owner(fh, "host-b", 2)), S.DENIED, "B's TEST after A's CANCEL: A's lock must still be held")
    assert r.holder.svid == 1, r


def test_one_of_two_waiters_gets_an_exclusive_lock(nlm, fh):
    """Two blocked exclusive requests for the same range: when the holder
    unlocks, exactly one of them gets the lock, the other keeps waiting and
    gets it when that one unlocks."""
    b, c = owner(fh, "host-b", 2), owner(fh, "host-c", 3)
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    expect(nlm.lock(b, block=True), S.BLOCKED, "B's blocking LOCK")
    expect(nlm.lock(c, block=True), S.BLOCKED, "C's blocking LOCK")
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
    rb, rc_ = nlm.lock(b, block=True), nlm.lock(c, block=True)
    got = sorted([rb.stat, rc_.stat])
    assert got == [S.GRANTED, S.BLOCKED], f"after A's UNLOCK, B's and C's LOCK sent again: {rb!r}, {rc_!r} (exactly one may hold)"
    winner, loser = (b, c) if rb.stat == S.GRANTED else (c, b)
    expect(nlm.unlock(winner), S.GRANTED, "the winner's UNLOCK")
    expect(nlm.lock(loser, block=True), S.GRANTED, "the other waiter's LOCK sent again")


def test_waiting_shared_requests_are_all_granted(nlm, fh):
    b, c = owner(fh, "host-b", 2), owner(fh, "host-c", 3)
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's exclusive LOCK")
    expect(nlm.lock(b, exclusive=False, block=True), S.BLOCKED, "B's blocking shared LOCK")
    expect(nlm.lock(c, exclusive=False, block=True), S.BLOCKED, "C's blocking shared LOCK")
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(b, exclusive=False, block=True), S.GRANTED, "B's shared LOCK sent again")
    expect(nlm.lock(c, exclusive=False, block=True), S.GRANTED, "C's shared LOCK sent again")
    expect(nlm.lock(owner(fh, "host-d", 4)), S.DENIED, "D's exclusive LOCK over B's and C's shared locks")


def test_blocked_upgrade_keeps_the_shared_lock(nlm, fh):
    """A blocked upgrade (POSIX F_SETLKW) leaves the owner's shared lock in
    place while it waits."""
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a, exclusive=False), S.GRANTED, "A's shared LOCK")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=50, length=1), exclusive=False), S.GRANTED, "B's shared LOCK of byte 50")
    expect(nlm.lock(a, exclusive=True, block=True), S.BLOCKED, "A's blocking upgrade")
    expect(nlm.lock(owner(fh, "host-c", 3, offset=0, length=10)), S.DENIED, "C's exclusive LOCK of [0, 10) while A waits")
    expect(nlm.unlock(owner(fh, "host-b", 2, offset=50, length=1)), S.GRANTED, "B's UNLOCK")
    expect(nlm.lock(a, exclusive=True, block=True), S.GRANTED, "A's upgrade sent again")
    r = expect(nlm.test(owner(fh, "host-c", 3), exclusive=False), S.DENIED, "C's shared TEST after the upgrade")
    assert (r.holder.svid, r.holder.exclusive) == (1, True), r


def test_unlock_by_a_waiter_cancels_its_request(nlm, fh):
    """Linux nlmsvc_unlock cancels the owner's blocked request on the
    range first (an UNLOCK after a lost GRANTED reply)."""
    b = owner(fh, "host-b", 2)
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    expect(nlm.lock(b, block=True), S.BLOCKED, "B's blocking LOCK")
    expect(nlm.unlock(b), S.GRANTED, "B's UNLOCK of the range it waits for")
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(owner(fh, "host-c", 3)), S.GRANTED, "C's LOCK: B's request went with its UNLOCK")


def test_negative_svid_round_trips(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", -12345)), S.GRANTED, "LOCK with svid -12345")
    r = expect(nlm.test(owner(fh, "host-b", 2)), S.DENIED, "B's TEST")
    assert r.holder.svid == -12345, f"holder svid: {r!r}"
    expect(nlm.unlock(owner(fh, "host-a", -12345)), S.GRANTED, "UNLOCK with svid -12345")
    expect(nlm.test(owner(fh, "host-b", 2)), S.GRANTED, "B's TEST after the UNLOCK")


def test_unlock_of_length_zero_unlocks_to_the_end(nlm, fh):
    a = owner(fh, "host-a", 1)
    expect(nlm.lock(a.range(0, 100)), S.GRANTED, "A [0, 100)")
    expect(nlm.lock(a.range(200, 100)), S.GRANTED, "A [200, 300)")
    expect(nlm.unlock(a.range(50, 0)), S.GRANTED, "A's UNLOCK [50, EOF)")
    expect(nlm.lock(owner(fh, "host-b", 2, offset=50, length=0)), S.GRANTED, "B [50, EOF)")
    expect(nlm.test(owner(fh, "host-c", 3, offset=49, length=1)), S.DENIED, "C's TEST of byte 49, still A's")


def test_lock_with_auth_none_is_served(server, nlm, fh):
    """Some clients send NLM calls with AUTH_NULL (Linux lockd serves them,
    fs/nfsd/lockd.c)."""
    r = nlm.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.LOCK, n.lockargs(owner(fh), True, False, False, 1, b"anon"), cred_flavor=rc.AUTH_NONE)
    accepted(r, "LOCK with AUTH_NONE")
    expect(n.decode_res("LOCK", r.body), S.GRANTED, "LOCK with AUTH_NONE")
    expect(nlm.test(owner(fh, "host-b", 2)), S.DENIED, "B's TEST")


def test_lock_needs_access_to_the_file(server, env):
    """Linux opens the file for the lock with the caller's identity
    (nlm_fopen: read for a shared lock, write for an exclusive one, the
    owner always): a user who may not read a root-only file cannot lock
    it (NLM4_FAILED); its owner can."""
    fh = env.new_file()
    env.nfs.must(env.nfs.setattr(fh, sattr3(mode=0o600)), "SETATTR mode 0600")
    with NlmClient(server.port, uid=1000, gid=1000) as user:
        expect(user.lock(owner(fh, "host-u", 1), exclusive=False), S.FAILED, "uid 1000's shared LOCK of a 0600 root file")
        expect(user.lock(owner(fh, "host-u", 1), exclusive=True), S.FAILED, "uid 1000's exclusive LOCK of a 0600 root file")
    with NlmClient(server.port) as root:
        expect(root.lock(owner(fh, "host-r", 1)), S.GRANTED, "root's LOCK of its file")


# --- 4. handles, sizes, exports ---------------------------------------------------


def test_handle_of_a_removed_file_is_stale(nlm, env):
    name = unique("gone")
    fh = env.new_file(name)
    env.nfs.must(env.nfs.remove(env.root, name), "REMOVE")
    expect(nlm.lock(owner(fh)), S.STALE_FH, "LOCK on a removed file")
    expect(nlm.test(owner(fh)), S.STALE_FH, "TEST on a removed file")
    expect(nlm.unlock(owner(fh)), S.STALE_FH, "UNLOCK on a removed file")


@pytest.mark.parametrize("how", ["flipped", "zeros", "short", "long"])
def test_garbage_handle_is_stale(nlm, fh, how):
    """A handle the server never made is NLM4_STALE_FH (a netobj of 65
    bytes is valid XDR, longer than any NFSv3 handle)."""
    if how == "flipped":
        bad = fh[:-1] + bytes([fh[-1] ^ 0xFF])
    elif how == "zeros":
        bad = b"\0" * len(fh)
    elif how == "short":
        bad = fh[:8]
    else:
        bad = fh + b"\0" * (65 - len(fh))
    expect(nlm.lock(owner(bad)), S.STALE_FH, f"LOCK with a {how} handle")
    expect(nlm.test(owner(bad)), S.STALE_FH, f"TEST with a {how} handle")
    expect(nlm.lock(owner(fh)), S.GRANTED, "LOCK with the real handle")


def test_lock_on_a_directory_fails(nlm, env):
    """Linux opens the file with nfsd_open(S_IFREG): a directory fails
    (nfserr_isdir), and nlm_fopen answers NLM4_FAILED."""
    expect(nlm.lock(owner(env.root)), S.FAILED, "LOCK on the export root directory")


FBIG_RANGES = [
    (1 << 63, 0),
    (1 << 63, 1),
    (U64, 1),
    (1, 1 << 63),
    (0, U64),
    (OFFSET_MAX, 2),
    (1 << 62, 1 << 63),
]


@pytest.mark.parametrize("offset,length", FBIG_RANGES, ids=[f"{o:#x}+{l:#x}" for o, l in FBIG_RANGES])
def test_ranges_beyond_the_largest_offset_are_fbig(nlm, fh, offset, length):
    """NLMv4 offsets are unsigned 64-bit, files end at 2^63-1: a range
    starting or ending past it is NLM4_FBIG (Linux
    nlm4svc_retrieve_args), for TEST, LOCK and UNLOCK alike."""
    lk = owner(fh, offset=offset, length=length)
    expect(nlm.lock(lk), S.FBIG, f"LOCK [{offset:#x}, +{length:#x})")
    expect(nlm.test(lk), S.FBIG, f"TEST [{offset:#x}, +{length:#x})")
    expect(nlm.unlock(lk), S.FBIG, f"UNLOCK [{offset:#x}, +{length:#x})")


OK_RANGES = [(0, 1 << 63), (OFFSET_MAX, 1), (OFFSET_MAX, 0), ((1 << 62), (1 << 62))]


@pytest.mark.parametrize("offset,length", OK_RANGES, ids=[f"{o:#x}+{l:#x}" for o, l in OK_RANGES])
def test_ranges_up_to_the_largest_offset_are_granted(nlm, fh, offset, length):
    expect(nlm.lock(owner(fh, offset=offset, length=length)), S.GRANTED, f"LOCK [{offset:#x}, +{length:#x})")
    last = offset + length - 1 if length else OFFSET_MAX
    expect(nlm.test(owner(fh, "host-b", 2, offset=last, length=1)), S.DENIED, f"B's TEST of the lock's last byte {last:#x}")


def test_reclaim_outside_grace_is_denied_grace_period(nlm, fh):
    """Linux nlmsvc_lock: a LOCK with reclaim=true when the server is not
    in grace answers NLM4_DENIED_GRACE_PERIOD (nothing to reclaim)."""
    expect(nlm.lock(owner(fh), reclaim=True), S.DENIED_GRACE_PERIOD, "LOCK reclaim=true outside grace")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.GRANTED, "another host's LOCK: the refused reclaim took nothing")


def test_read_only_export_takes_shared_locks_only(sluice_binary, tmp_path):
    """A read-only export: shared locks are granted; an exclusive lock
    needs the file open for writing, which Linux refuses (nfsd_open with
    NFSD_MAY_WRITE gives nfserr_rofs) and nlm_fopen answers NLM4_FAILED
    (XNFS also has NLM4_ROFS; Linux never sends it)."""
    srv = v.ConfigServer(sluice_binary, tmp_path / "ro", [("export", 'read_only = true\nsquash = "none"')])
    (srv.dirs["export"] / "f").write_bytes(b"read only")
    srv.start()
    try:
        e = Env(srv.port)
        fh = e.lookup("f")
        e.close()
        with NlmClient(srv.port) as c:
            expect(c.lock(owner(fh, "host-a", 1), exclusive=False), S.GRANTED, "shared LOCK on a read-only export")
            expect(c.lock(owner(fh, "host-b", 2), exclusive=False), S.GRANTED, "another shared LOCK on a read-only export")
            expect(c.lock(owner(fh, "host-c", 3, offset=500, length=10), exclusive=True), S.FAILED, "exclusive LOCK on a read-only export")
            expect(c.unlock(owner(fh, "host-a", 1)), S.GRANTED, "UNLOCK on a read-only export")
        assert srv.alive(), srv.log()
    finally:
        srv.stop()


# --- 5. NM_LOCK, SHARE, FREE_ALL, SM_NOTIFY, UDP -------------------------------------


def test_nm_lock_takes_a_lock_like_lock(nlm, fh):
    a = owner(fh, "host-a", 1)
    r = expect(nlm.nm_lock(a, cookie=b"nm"), S.GRANTED, "A's NM_LOCK")
    assert r.cookie == b"nm", r
    expect(nlm.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK over A's NM_LOCK")
    expect(nlm.nm_lock(owner(fh, "host-b", 2)), S.DENIED, "B's NM_LOCK over A's NM_LOCK")
    expect(nlm.unlock(a), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.GRANTED, "B's LOCK after A's UNLOCK")


def test_share_reservations(nlm, fh):
    """XNFS NLM_SHARE: a share conflicts when its access meets another's
    deny mode or its deny mode meets another's access (Linux
    nlmsvc_share_file); UNSHARE removes one (LCK_GRANTED also when there
    was none)."""
    a = Share("host-a", fh, b"share-a", mode=FSM_DW, access=FSA_R)
    r = expect(nlm.share(a, cookie=b"shr"), S.GRANTED, "A: read, deny write")
    assert r.cookie == b"shr", r
    expect(nlm.share(Share("host-b", fh, b"share-b", mode=FSM_DN, access=FSA_W)), S.DENIED, "B: write, while A denies write")
    expect(nlm.share(Share("host-c", fh, b"share-c", mode=FSM_DN, access=FSA_R)), S.GRANTED, "C: read, deny none")
    expect(nlm.share(Share("host-d", fh, b"share-d", mode=FSM_DR, access=FSA_R)), S.DENIED, "D: deny read, while A and C read")
    expect(nlm.unshare(a), S.GRANTED, "A's UNSHARE")
    expect(nlm.share(Share("host-b", fh, b"share-b", mode=FSM_DN, access=FSA_W)), S.GRANTED, "B: write, after A's UNSHARE")
    expect(nlm.unshare(Share("host-e", fh, b"share-e")), S.GRANTED, "UNSHARE of a share never made")


def test_share_of_the_same_owner_is_updated_not_added(nlm, fh):
    """A second SHARE by the same host and owner handle changes that share
    (Linux nlmsvc_share_file updates it in place)."""
    a = Share("host-a", fh, b"share-a", mode=FSM_DW, access=FSA_R)
    expect(nlm.share(a), S.GRANTED, "A: read, deny write")
    expect(nlm.share(Share("host-a", fh, b"share-a", mode=FSM_DN, access=FSA_R)), S.GRANTED, "A again: read, deny none")
    expect(nlm.share(Share("host-b", fh, b"share-b", mode=FSM_DN, access=FSA_W)), S.GRANTED, "B: write, after A stopped denying write")


def test_free_all_and_sm_notify_release_shares(server, fh):
    """A host's shares go with its locks when it restarted (Linux
    nlm_inspect_file traverses blocks, shares and locks)."""
    with NlmClient(server.port, source="127.0.0.2") as a, NlmClient(server.port, source="127.0.0.3") as b:
        expect(a.share(Share("host-a", fh, b"sa", mode=FSM_DW, access=FSA_R)), S.GRANTED, "host-a: read, deny write")
        expect(a.share(Share("host-c", fh, b"sc", mode=FSM_DW, access=FSA_R)), S.GRANTED, "host-c: read, deny write")
        a.free_all("host-a", 3)
        expect(b.share(Share("host-b", fh, b"sb", mode=FSM_DN, access=FSA_W)), S.DENIED, "host-b: write, while host-c still denies write")
        a.sm_notify("host-c", 5)
        expect(b.share(Share("host-b", fh, b"sb", mode=FSM_DN, access=FSA_W)), S.GRANTED, "host-b: write, after FREE_ALL of host-a and SM_NOTIFY of host-c")


def test_share_reservations_do_not_block_byte_range_locks(nlm, fh):
    expect(nlm.share(Share("host-a", fh, b"share-a", mode=FSM_DW, access=FSA_R)), S.GRANTED, "A: read, deny write")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.GRANTED, "B's exclusive LOCK")


def test_free_all_releases_every_lock_of_that_host_only(nlm, env):
    """NLM4 FREE_ALL {name, state}: every lock of caller_name `name`, on
    every file and of every svid, goes (Linux nlmsvc_free_host_resources);
    other hosts keep theirs; the reply is void."""
    f1, f2, f3 = env.new_file(), env.new_file(), env.new_file()
    expect(nlm.lock(owner(f1, "host-gone", 1)), S.GRANTED, "host-gone svid 1 on file 1")
    expect(nlm.lock(owner(f2, "host-gone", 2)), S.GRANTED, "host-gone svid 2 on file 2")
    expect(nlm.nm_lock(owner(f2, "host-gone", 3, offset=500, length=10)), S.GRANTED, "host-gone svid 3 NM_LOCK on file 2")
    expect(nlm.lock(owner(f3, "host-stays", 1)), S.GRANTED, "host-stays on file 3")
    nlm.free_all("host-gone", 7)
    expect(nlm.lock(owner(f1, "host-new", 9)), S.GRANTED, "a new host on file 1 after FREE_ALL")
    expect(nlm.lock(owner(f2, "host-new", 9, offset=0, length=0)), S.GRANTED, "a new host on all of file 2 after FREE_ALL")
    expect(nlm.lock(owner(f3, "host-new", 9)), S.DENIED, "a new host on file 3 (host-stays keeps its lock)")


def test_free_all_of_an_unknown_host_changes_nothing(nlm, fh):
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    nlm.free_all("host-never-seen", 1)
    expect(nlm.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK: A's lock is still there")


def test_free_all_drops_the_hosts_blocked_requests(nlm, fh):
    """Linux nlmsvc_free_host_resources also drops the host's blocks: once
    the conflict goes, the lock goes to nobody of that host."""
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    expect(nlm.lock(owner(fh, "host-gone", 2), block=True), S.BLOCKED, "host-gone's blocking LOCK")
    nlm.free_all("host-gone", 3)
    expect(nlm.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
    expect(nlm.lock(owner(fh, "host-c", 3)), S.GRANTED, "C's LOCK: host-gone's request went with FREE_ALL")


def test_sm_notify_from_a_rebooted_client_releases_its_locks(server, env):
    """SM_NOTIFY {mon_name, state} from a client host that rebooted: the
    NLM locks it held (caller_name == mon_name) go; another host's (at
    another address) stay; void. The hosts use their own loopback
    addresses."""
    f1, f2 = env.new_file(), env.new_file()
    with NlmClient(server.port, source="127.0.0.2") as rebooted, NlmClient(server.port, source="127.0.0.3") as fine:
        expect(rebooted.lock(owner(f1, "client-rebooted", 1)), S.GRANTED, "client-rebooted on file 1")
        expect(rebooted.lock(owner(f2, "client-rebooted", 2, offset=0, length=0)), S.GRANTED, "client-rebooted on file 2")
        expect(fine.lock(owner(f2, "client-fine", 1, offset=0, length=0), exclusive=False), S.DENIED, "client-fine on file 2 before the notify")
        expect(fine.lock(owner(f1, "client-fine", 1, offset=200, length=10)), S.GRANTED, "client-fine on file 1 elsewhere")
        rebooted.sm_notify("client-rebooted", 5)
        expect(fine.lock(owner(f1, "client-fine", 2)), S.GRANTED, "another host on file 1 after SM_NOTIFY")
        expect(fine.lock(owner(f2, "client-fine", 2)), S.GRANTED, "another host on file 2 after SM_NOTIFY")
        expect(rebooted.lock(owner(f1, "client-rebooted", 1, offset=205, length=1)), S.DENIED, "the rebooted host over client-fine's lock, which stays")


def test_sm_notify_spares_other_hosts_at_the_same_address(server, fh):
    """Several client hosts behind one address (NAT, containers): the
    SM_NOTIFY of one of them releases its locks, not its neighbours'."""
    with NlmClient(server.port, source="127.0.0.2") as nat:
        expect(nat.lock(owner(fh, "behind-nat-1", 1, offset=0, length=10)), S.GRANTED, "behind-nat-1's LOCK")
        expect(nat.lock(owner(fh, "behind-nat-2", 1, offset=10, length=10)), S.GRANTED, "behind-nat-2's LOCK")
        nat.sm_notify("behind-nat-1", 7)
    with NlmClient(server.port, source="127.0.0.3") as other:
        expect(other.lock(owner(fh, "host-x", 1, offset=0, length=10)), S.GRANTED, "another host over behind-nat-1's released range")
        expect(other.lock(owner(fh, "host-x", 1, offset=10, length=10)), S.DENIED, "another host over behind-nat-2's range, which stays")


def test_sm_notify_of_an_unknown_host_changes_nothing(server, fh):
    with NlmClient(server.port, source="127.0.0.2") as a, NlmClient(server.port, source="127.0.0.3") as other:
        expect(a.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
        other.sm_notify("somebody-else", 3)
        expect(other.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK: A's lock is still there")


def test_locks_over_udp_are_the_same_locks(server, nlm, fh):
    a = owner(fh, "host-udp", 1)
    with NlmClient(server.port, udp=True) as u:
        r = expect(u.lock(a, cookie=b"udp!"), S.GRANTED, "LOCK over UDP")
        assert r.cookie == b"udp!", r
        expect(nlm.test(owner(fh, "host-tcp", 2)), S.DENIED, "TEST over TCP of the range locked over UDP")
        expect(u.test(owner(fh, "host-tcp", 2)), S.DENIED, "TEST over UDP of the same")
        expect(u.unlock(a), S.GRANTED, "UNLOCK over UDP")
    expect(nlm.lock(owner(fh, "host-tcp", 2)), S.GRANTED, "LOCK over TCP after the UDP UNLOCK")


# --- 6. one lock table with NFSv4 ------------------------------------------------------


def test_nlm_lock_conflicts_with_nfsv4_lock_and_lockt(server, env, nlm):
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=0, length=100)), S.GRANTED, "NLM LOCK [0, 100)")
        r = v4_lock(c, fh4, sid, b"v4-owner", 99, 1)
        assert r.status == St.DENIED, f"NFSv4 LOCK of byte 99 under an NLM lock: expected NFS4ERR_DENIED, got {r!r}"
        d = r.last()
        assert (d.denied_offset, d.denied_length, d.denied_type) == (0, 100, WRITE_LT), f"LOCK4denied {vars(d)}"
        r = c.compound([rc.op_putfh(fh4), rc.op_lockt(b"v4-owner", 50, 1, READ_LT)])
        assert r.status == St.DENIED, f"NFSv4 LOCKT READ under an NLM exclusive lock: {r!r}"
        assert v4_lock(c, fh4, sid, b"v4-owner", 100, 100).status == St.OK, "NFSv4 LOCK of [100, 200), next to the NLM lock"
        expect(nlm.unlock(owner(fh3, "host-a", 1, offset=0, length=100)), S.GRANTED, "NLM UNLOCK")
        r = v4_lock(c, fh4, sid, b"v4-owner-2", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK [0, 100) after the NLM UNLOCK: {r!r}"
    finally:
        c.close()


def test_nfsv4_lock_conflicts_with_nlm_lock_and_test(server, env, nlm):
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        r = v4_lock(c, fh4, sid, b"v4-owner", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK [0, 100): {r!r}"
        lock_sid = r.stateid
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=50, length=10)), S.DENIED, "NLM LOCK inside an NFSv4 lock")
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=50, length=10), exclusive=False), S.DENIED, "NLM shared LOCK inside an NFSv4 write lock")
        r = expect(nlm.test(owner(fh3, "host-a", 1, offset=0, length=0)), S.DENIED, "NLM TEST of the whole file")
        assert (r.holder.exclusive, r.holder.offset, r.holder.length) == (True, 0, 100), f"holder of an NFSv4 write lock: {r!r}"
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=100, length=0)), S.GRANTED, "NLM LOCK [100, EOF), past the NFSv4 lock")
        r = c.compound([rc.op_putfh(fh4), rc.op_locku(lock_sid, 0, 100, WRITE_LT, seqid=0)])
        assert r.status == St.OK, f"NFSv4 LOCKU: {r!r}"
        expect(nlm.lock(owner(fh3, "host-b", 2, offset=0, length=100)), S.GRANTED, "NLM LOCK [0, 100) after the NFSv4 LOCKU")
    finally:
        c.close()


def test_shared_nlm_and_nfsv4_read_locks_coexist(server, env, nlm):
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        expect(nlm.lock(owner(fh3, "host-a", 1), exclusive=False), S.GRANTED, "NLM shared LOCK [0, 100)")
        r = v4_lock(c, fh4, sid, b"v4-reader", 0, 100, READ_LT)
        assert r.status == St.OK, f"NFSv4 READ_LT over an NLM shared lock: {r!r}"
        r = v4_lock(c, fh4, sid, b"v4-writer", 10, 1, WRITE_LT)
        assert r.status == St.DENIED, f"NFSv4 WRITE_LT over an NLM shared lock: {r!r}"
        expect(nlm.lock(owner(fh3, "host-b", 2), exclusive=False), S.GRANTED, "another NLM shared LOCK")
        expect(nlm.lock(owner(fh3, "host-c", 3, offset=10, length=1)), S.DENIED, "NLM exclusive LOCK over the NFSv4 read lock")
    finally:
        c.close()


def test_blocked_nlm_request_is_granted_when_the_nfsv4_lock_goes(server, env, nlm):
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        r = v4_lock(c, fh4, sid, b"v4-owner", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK: {r!r}"
        b = owner(fh3, "host-b", 2, offset=0, length=10)
        expect(nlm.lock(b, block=True), S.BLOCKED, "NLM blocking LOCK under the NFSv4 lock")
        r = c.compound([rc.op_putfh(fh4), rc.op_locku(r.stateid, 0, 100, WRITE_LT)])
        assert r.status == St.OK, f"NFSv4 LOCKU: {r!r}"
        expect(nlm.lock(b, block=True), S.GRANTED, "the NLM blocking LOCK sent again after the LOCKU")
        r = v4_lock(c, fh4, sid, b"v4-owner-2", 5, 1)
        assert r.status == St.DENIED, f"NFSv4 LOCK over the NLM lock granted after the wait: {r!r}"
    finally:
        c.close()


def test_lock_ranges_to_the_end_translate_between_nlm_and_nfsv4(server, env, nlm):
    """Length 0 in NLM and NFS4_UINT64_MAX in NFSv4 both mean to the end
    of the file; each side reports the other's lock in its own terms."""
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        r = v4_lock(c, fh4, sid, b"v4-owner", 1000, rc.NFS4_UINT64_MAX)
        assert r.status == St.OK, f"NFSv4 LOCK [1000, EOF): {r!r}"
        r = expect(nlm.test(owner(fh3, "host-a", 1, offset=1 << 50, length=1)), S.DENIED, "NLM TEST far past 1000")
        assert (r.holder.offset, r.holder.length) == (1000, 0), f"an NFSv4 lock to EOF, as NLM's holder: {r!r}"
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=0, length=1000)), S.GRANTED, "NLM LOCK [0, 1000)")
        r = v4_lock(c, fh4, sid, b"v4-owner-2", 10, 1)
        assert r.status == St.DENIED, f"NFSv4 LOCK inside the NLM lock: {r!r}"
        expect(nlm.unlock(owner(fh3, "host-a", 1, offset=0, length=1000)), S.GRANTED, "NLM UNLOCK")
        expect(nlm.lock(owner(fh3, "host-b", 2, offset=0, length=0)), S.DENIED, "NLM LOCK of the whole file")
    finally:
        c.close()


def test_nfsv4_sees_an_nlm_lock_to_the_end_as_uint64_max(server, env, nlm):
    name = unique("x4")
    c = v4_client(server.port)
    try:
        sid, fh4 = v4_open(c, name)
        fh3 = env.lookup(name)
        expect(nlm.lock(owner(fh3, "host-a", 1, offset=4096, length=0)), S.GRANTED, "NLM LOCK [4096, EOF)")
        r = v4_lock(c, fh4, sid, b"v4-owner", 1 << 60, 1)
        assert r.status == St.DENIED, f"NFSv4 LOCK far past 4096: {r!r}"
        d = r.last()
        assert (d.denied_offset, d.denied_length) == (4096, rc.NFS4_UINT64_MAX), f"LOCK4denied of an NLM lock to EOF: {vars(d)}"
    finally:
        c.close()


def test_nlm_locks_are_advisory_for_nfsv3_io(env, nlm):
    """NLM locks are advisory: an NFSv3 READ or WRITE carries no lock
    owner, so the server cannot tell the holder's own I/O from anybody
    else's and lets both through (as the Linux server does)."""
    fh = env.new_file()
    expect(nlm.lock(owner(fh, "host-a", 1, offset=0, length=0)), S.GRANTED, "A's exclusive LOCK of the whole file")
    w = env.nfs.write(fh, 10, b"written under a lock", v.FILE_SYNC)
    assert w.ok, f"NFSv3 WRITE inside an NLM lock: {w!r}"
    r = env.nfs.read(fh, 10, 20)
    assert r.ok and r.data == b"written under a lock", f"NFSv3 READ inside an NLM lock: {r!r}"


def test_sm_notify_wakes_requests_blocked_by_the_rebooted_host(server, fh):
    with NlmClient(server.port, source="127.0.0.2") as gone, NlmClient(server.port, source="127.0.0.3") as waiter:
        expect(gone.lock(owner(fh, "host-gone", 1)), S.GRANTED, "host-gone's LOCK")
        b = owner(fh, "host-wait", 2)
        expect(waiter.lock(b, block=True), S.BLOCKED, "host-wait's blocking LOCK")
        gone.sm_notify("host-gone", 9)
        expect(waiter.lock(b, block=True), S.GRANTED, "host-wait's LOCK sent again after host-gone's SM_NOTIFY")


@pytest.mark.parametrize(
    "deleg,exclusive",
    [("write", True), ("write", False), ("read", True)],
    ids=["write-deleg-exclusive-lock", "write-deleg-shared-lock", "read-deleg-exclusive-lock"],
)
def test_nlm_lock_recalls_a_conflicting_delegation(sluice_factory, deleg, exclusive):
    """An NFSv4 client caches byte-range locks under a delegation without
    telling the server (Linux client, fs/nfs/nfs4proc.c _nfs4_proc_setlk:
    "cache locks!"), so an NLM lock that conflicts with what the holder may
    do (any lock against a write delegation, an exclusive one against a
    read delegation) must recall the delegation before it is granted
    (Linux server: nlm_fopen opens the file, which breaks the lease;
    nfserr_jukebox, and the request is dropped for the client to
    retransmit). No NLM lock is granted while the delegation is out; after
    DELEGRETURN the LOCK is granted."""
    import test_delegations as td
    import test_write_delegations as tw

    srv = sluice_factory("--grace-time", 0, "--lease-time", 10, "--delegations", "all", metrics=True, root_squash=False)
    td.make_file(srv, "f", b"delegated\n")
    h = td.holder(srv)
    try:
        if deleg == "write":
            o, fh4, _ = tw.open_rw(h, "f")
            assert o.deleg_type == tw.OPEN_DELEGATE_WRITE, f"no write delegation to test with: {o.deleg_type}"
            deleg_sid = o.deleg_stateid
        else:
            _, deleg_sid, fh4 = td.read_delegation(h, "f")
        e = Env(srv.port)
        fh3 = e.lookup("f")
        e.close()
        lk = owner(fh3, "host-b", 2)
        with NlmClient(srv.port) as c:
            xid = rc.next_xid()
            c.conn.send_record(rc.call_header(xid, prog=NLM_PROGRAM, vers=NLM_V4, proc=NlmProc.LOCK, cred_body=c.cred) + n.lockargs(lk, exclusive, False, False, 1, b"first"))
            try:
                call = h.conn.next_call(timeout=5)
            except socket.timeout:
                early = c.conn.wait_for(xid)
                got = n.decode_res("LOCK", early.body) if early.accept_stat == rc.SUCCESS else early
                raise AssertionError(f"an NLM {'exclusive' if exclusive else 'shared'} LOCK on a file under a {deleg} delegation sent no CB_RECALL within 5 s; the LOCK answered {got!r}") from None
            sid, rfh = td.recall_of(call)
            assert (sid, rfh) == (deleg_sid, fh4), "CB_RECALL names another delegation or file"
            # whatever came back for the first LOCK so far must not be a grant
            while select.select([c.conn.sock], [], [], 0)[0]:
                r = c.conn.recv_reply()
                c.conn._stash[r.xid] = r
            early = c.conn._stash.pop(xid, None)
            if early is not None and early.accept_stat == rc.SUCCESS:
                assert n.decode_res("LOCK", early.body).stat != S.GRANTED, "the NLM LOCK was granted while the delegation was out"
            h.conn.answer(call, td.cb_reply(call))
            expect_ok4(h.compound([rc.op_putfh(fh4), rc.op_delegreturn(deleg_sid)]), "DELEGRETURN")
            expect(c.lock(lk, exclusive=exclusive), S.GRANTED, "the NLM LOCK sent again after DELEGRETURN")
    finally:
        h.close()


def test_blocked_under_a_delegation_is_granted_after_delegreturn(sluice_factory):
    """A blocking NLM LOCK that must wait for a delegation's recall: if the
    server answers NLM4_BLOCKED, it has promised an NLM_GRANTED call (XNFS
    NLM_LOCK), so once the holder returns the delegation the lock is
    granted and the client called."""
    import test_delegations as td
    import test_write_delegations as tw

    fake = FakeClientHost()
    srv = sluice_factory("--grace-time", 0, "--lease-time", 10, "--delegations", "all", "--nsm-portmap", f"127.0.0.1:{fake.pmap_port}", metrics=True, root_squash=False)
    td.make_file(srv, "f", b"delegated\n")
    h = td.holder(srv)
    try:
        o, fh4, _ = tw.open_rw(h, "f")
        assert o.deleg_type == tw.OPEN_DELEGATE_WRITE, f"no write delegation to test with: {o.deleg_type}"
        e = Env(srv.port)
        fh3 = e.lookup("f")
        e.close()
        lk = owner(fh3, "host-b", 2, offset=0, length=10)
        with NlmClient(srv.port) as c:
            xid = rc.next_xid()
            c.conn.send_record(rc.call_header(xid, prog=NLM_PROGRAM, vers=NLM_V4, proc=NlmProc.LOCK, cred_body=c.cred) + n.lockargs(lk, True, True, False, 1, b"blk"))
            call = h.conn.next_call(timeout=5)
            td.recall_of(call)
            h.conn.answer(call, td.cb_reply(call))
            try:
                st = n.decode_res("LOCK", accepted(c.conn.wait_for(xid), "the blocking LOCK").body).stat
            except socket.timeout:
                st = None  # dropped for the client to send again, as Linux does
            expect_ok4(h.compound([rc.op_putfh(fh4), rc.op_delegreturn(o.deleg_stateid)]), "DELEGRETURN")
            if st == S.BLOCKED:
                _wait_granted(fake, lk, True, "after DELEGRETURN, for a LOCK answered NLM4_BLOCKED")
            else:
                assert st in (None, S.DENIED), f"the blocking LOCK under a delegation answered {stat_name(st)}"
                expect(c.lock(lk, block=True), S.GRANTED, "the LOCK sent again after DELEGRETURN")
    finally:
        h.close()
        fake.close()


def test_blocked_under_an_ignored_recall_is_granted_when_revoked(sluice_factory):
    """The holder answers CB_RECALL but never returns the delegation: the
    server revokes it after a lease, and a LOCK answered NLM4_BLOCKED
    meanwhile is then granted with an NLM_GRANTED call."""
    import test_delegations as td
    import test_write_delegations as tw

    fake = FakeClientHost()
    srv = sluice_factory("--grace-time", 0, "--lease-time", 3, "--delegations", "all", "--nsm-portmap", f"127.0.0.1:{fake.pmap_port}", metrics=True, root_squash=False)
    td.make_file(srv, "f", b"delegated\n")
    h = td.holder(srv)
    try:
        o, fh4, _ = tw.open_rw(h, "f")
        assert o.deleg_type == tw.OPEN_DELEGATE_WRITE, f"no write delegation to test with: {o.deleg_type}"
        e = Env(srv.port)
        fh3 = e.lookup("f")
        e.close()
        lk = owner(fh3, "host-b", 2, offset=0, length=10)
        with NlmClient(srv.port) as c:
            xid = rc.next_xid()
            c.conn.send_record(rc.call_header(xid, prog=NLM_PROGRAM, vers=NLM_V4, proc=NlmProc.LOCK, cred_body=c.cred) + n.lockargs(lk, True, True, False, 1, b"blk"))
            call = h.conn.next_call(timeout=5)
            td.recall_of(call)
            h.conn.answer(call, td.cb_reply(call))
            try:
                st = n.decode_res("LOCK", accepted(c.conn.wait_for(xid), "the blocking LOCK").body).stat
            except socket.timeout:
                st = None
            if st != S.BLOCKED:
                pytest.skip(f"the blocking LOCK under a delegation answered {stat_name(st) if st is not None else 'nothing'}, no promise of NLM_GRANTED")
            _wait_granted(fake, lk, True, "after the ignored recall, once the delegation is revoked", probe=lambda: f"the same LOCK sent again now answers {c.lock(lk, block=True)!r}")
    finally:
        h.close()
        fake.close()


def test_nlm_shared_lock_leaves_a_read_delegation_alone(sluice_factory):
    """A shared NLM lock conflicts with nothing a read delegation allows."""
    import test_delegations as td

    srv = sluice_factory("--grace-time", 0, "--lease-time", 10, "--delegations", "all", metrics=True, root_squash=False)
    td.make_file(srv, "f", b"delegated\n")
    h = td.holder(srv)
    try:
        _, deleg_sid, fh4 = td.read_delegation(h, "f")
        e = Env(srv.port)
        fh3 = e.lookup("f")
        e.close()
        with NlmClient(srv.port) as c:
            expect(c.lock(owner(fh3, "host-b", 2), exclusive=False), S.GRANTED, "NLM shared LOCK under a read delegation")
        r = h.compound([rc.op_putfh(fh4), rc.op_read(0, 100, stateid=deleg_sid)])
        expect_ok4(r, "READ with the delegation stateid afterwards")
    finally:
        h.close()


# --- 7. NSM ----------------------------------------------------------------------------


def test_sm_stat_answers_the_servers_odd_state(nlm, nsm_here):
    """SM_STAT: stat_succ or stat_fail (XNFS: many implementations always
    fail), and the local NSM state, odd while up (nfs-utils statd)."""
    r = nlm.sm_stat("localhost")
    assert r.res_stat in (STAT_SUCC, STAT_FAIL), r
    assert r.state > 0 and r.state % 2 == 1, f"SM_STAT state {r.state} is not odd"
    assert nlm.sm_stat("no-such-host.invalid").state == r.state, "the state is the server's, whatever the name"


def test_sm_mon_unmon_from_clients_are_refused_and_harmless(nlm, fh, nsm_here):
    """sluice monitors no host on request: SM_MON answers stat_fail (as
    nfs-utils statd does for callers other than the local lockd);
    SM_UNMON and SM_UNMON_ALL answer the state; nothing else changes."""
    state = nlm.sm_stat("localhost").state
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    r = nlm.sm_mon("host-a", "evil-host", priv=b"p" * 16)
    assert r.res_stat == STAT_FAIL, f"SM_MON from a client: {r!r}"
    assert nlm.sm_unmon("host-a", "evil-host") == state, "SM_UNMON state"
    assert nlm.sm_unmon_all("evil-host") == state, "SM_UNMON_ALL state"
    accepted(nlm.sm_null(), "NSM NULL afterwards")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK: A's lock survives the SM_* calls")


# --- 8. restarts: grace, state number, SM_NOTIFY ----------------------------------------------


@pytest.fixture
def restartable(sluice_factory):
    """start(*extra) gives a started server (root not squashed) with
    --grace-time GRACE unless extra sets it."""

    def start(*extra):
        args = list(extra)
        if "--grace-time" not in args:
            args = ["--grace-time", GRACE, *args]
        return sluice_factory(*args, root_squash=False)

    return start


def test_restart_after_nlm_locks_has_grace(restartable):
    """An NLM host that held locks makes the next start a grace period
    (XNFS: locks may be reclaimed, no new ones): a new LOCK and a TEST get
    NLM4_DENIED_GRACE_PERIOD, reclaims are granted, and one reclaim does
    not end grace for everybody."""
    srv = restartable()
    e = Env(srv.port)
    f1, f2, f3 = e.new_file(), e.new_file(), e.new_file()
    e.close()
    a1, a2 = owner(f1, "host-a", 1, offset=0, length=100), owner(f2, "host-a", 2, offset=0, length=0)
    with NlmClient(srv.port) as c:
        expect(c.lock(a1), S.GRANTED, "A's LOCK on file 1")
        expect(c.lock(a2, exclusive=False), S.GRANTED, "A's shared LOCK on file 2")
    srv.restart()
    with NlmClient(srv.port) as c:
        expect(c.lock(owner(f3, "host-new", 7)), S.DENIED_GRACE_PERIOD, "a new host's LOCK on an unlocked file, in grace")
        expect(c.test(owner(f1, "host-new", 7)), S.DENIED_GRACE_PERIOD, "a new host's TEST, in grace")
        expect(c.nm_lock(owner(f3, "host-new", 7)), S.DENIED_GRACE_PERIOD, "a new host's NM_LOCK, in grace")
        expect(c.lock(owner(f3, "host-a", 3)), S.DENIED_GRACE_PERIOD, "A's own new (non-reclaim) LOCK, in grace")
        expect(c.lock(a1, reclaim=True), S.GRANTED, "A's reclaim of its lock on file 1")
        expect(c.lock(owner(f3, "host-new", 7)), S.DENIED_GRACE_PERIOD, "a new host's LOCK after A's first reclaim")
        expect(c.lock(a2, exclusive=False, reclaim=True), S.GRANTED, "A's reclaim of its shared lock on file 2")
        expect(c.lock(owner(f1, "host-b", 5, offset=50, length=10), reclaim=True), S.DENIED, "B's reclaim over A's reclaimed lock")


def test_unlock_cancel_and_share_in_grace_are_refused(restartable):
    """Linux (svc4proc.c) refuses UNLOCK, CANCEL, UNSHARE and non-reclaim
    SHARE in grace with NLM4_DENIED_GRACE_PERIOD, as XNFS lists for
    them."""
    srv = restartable()
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    a = owner(fh, "host-a", 1)
    with NlmClient(srv.port) as c:
        expect(c.lock(a), S.GRANTED, "A's LOCK")
    srv.restart()
    with NlmClient(srv.port) as c:
        expect(c.unlock(a), S.DENIED_GRACE_PERIOD, "UNLOCK in grace")
        expect(c.cancel(a, block=True), S.DENIED_GRACE_PERIOD, "CANCEL in grace")
        expect(c.share(Share("host-b", fh, b"sb")), S.DENIED_GRACE_PERIOD, "non-reclaim SHARE in grace")
        expect(c.unshare(Share("host-b", fh, b"sb")), S.DENIED_GRACE_PERIOD, "UNSHARE in grace")


def test_restart_without_clients_has_no_grace(restartable):
    """No client ever (no NLM host, no NFSv4 client): nothing to reclaim,
    so the restarted server serves locks at once."""
    srv = restartable("--grace-time", 60)
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    srv.restart()
    with NlmClient(srv.port) as c:
        expect(c.test(owner(fh)), S.GRANTED, "TEST right after a restart with no clients before")
        expect(c.lock(owner(fh)), S.GRANTED, "LOCK right after a restart with no clients before")


def test_nfsv4_clients_grace_holds_nlm_back(restartable):
    """One lock table, one grace: after a restart that NFSv4 clients must
    reclaim in, a new NLM LOCK or TEST could take or see what a client is
    about to reclaim, so both get NLM4_DENIED_GRACE_PERIOD."""
    srv = restartable()
    name = unique("g4")
    c = v4_client(srv.port)
    try:
        sid, fh4 = v4_open(c, name)
        r = v4_lock(c, fh4, sid, b"v4-owner", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK: {r!r}"
    finally:
        c.close()
    e = Env(srv.port)
    fh3 = e.lookup(name)
    e.close()
    srv.restart()
    with NlmClient(srv.port) as nc:
        expect(nc.lock(owner(fh3, "host-new", 1, offset=0, length=10)), S.DENIED_GRACE_PERIOD, "NLM LOCK where the NFSv4 client held a lock, in its grace")
        expect(nc.lock(owner(fh3, "host-new", 1, offset=500, length=10)), S.DENIED_GRACE_PERIOD, "NLM LOCK elsewhere in the file, in grace")
        expect(nc.test(owner(fh3, "host-new", 1)), S.DENIED_GRACE_PERIOD, "NLM TEST, in grace")


def test_grace_waits_for_nlm_hosts_when_nfsv4_clients_are_done(restartable):
    """Grace ends early once every NFSv4 client known from before sent
    RECLAIM_COMPLETE, but NLM hosts send no such thing: while one that
    held locks may still reclaim, grace must go on (else another host
    takes its locks first)."""
    from test_state_grace import Holder

    srv = restartable()
    srv.export.chmod(0o777)
    v4 = Holder(srv, unique_name_v4(), lock=True, verifier=b"nlm-grc1")
    e = Env(srv.port)
    hname = unique("hfile")
    fh = e.new_file(hname)
    e.close()
    h = owner(fh, "host-h", 1)
    with NlmClient(srv.port) as c:
        expect(c.lock(h), S.GRANTED, "NLM host H's LOCK")
    srv.restart()
    v4.come_back()
    v4.reclaim_all()  # OPEN CLAIM_PREVIOUS, LOCK reclaim, RECLAIM_COMPLETE
    with NlmClient(srv.port) as c:
        expect(c.lock(owner(fh, "host-new", 2)), S.DENIED_GRACE_PERIOD, "a new host's LOCK over H's old lock, once the NFSv4 client is done")
        r = v4.client.open(hname, create=False, owner=b"nlm-grace-open")
        assert r.status == St.OK, f"the NFSv4 client's OPEN of H's file: {r!r}"
        r = v4_lock(v4.client, r.fh, r.stateid, b"nlm-grace-lock", 0, 10)
        assert r.status == St.GRACE, f"the NFSv4 client's new LOCK over H's old lock while H may reclaim: expected NFS4ERR_GRACE, got {r!r}"
        expect(c.lock(h, reclaim=True), S.GRANTED, "H's reclaim")
    v4.client.close()


def test_nlm_grace_does_not_hold_back_nfsv4_opens(restartable):
    """NLM locks do not conflict with NFSv4 share reservations, so a grace
    period kept only for NLM hosts must not refuse a new NFSv4 client's
    OPEN (Linux: lockd's grace does not block opens, commit "lockd: NLM
    grace period shouldn't block NFSv4 opens"); its LOCK, which could take
    what an NLM host is about to reclaim, waits (NFS4ERR_GRACE)."""
    srv = restartable()
    srv.export.chmod(0o777)
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    with NlmClient(srv.port) as c:
        expect(c.lock(owner(fh, "host-h", 1)), S.GRANTED, "NLM host H's LOCK")
    srv.restart()
    c4 = v4_client(srv.port)
    try:
        r = c4.open(unique("new4"), owner=b"fresh-open-owner")
        assert r.status == St.OK, f"a new NFSv4 client's OPEN of a new file while only NLM hosts may reclaim: {r!r}"
        r = v4_lock(c4, r.fh, r.stateid, b"fresh-lock-owner", 0, 10)
        assert r.status == St.GRACE, f"its LOCK in grace: expected NFS4ERR_GRACE, got {r!r}"
    finally:
        c4.close()


def test_grace_ends_and_reclaimed_locks_hold(restartable):
    """After the grace period new locks are served again, and a reclaimed
    lock is a lock like any other. Waiting for grace to run out is what
    is checked: it is polled with a deadline."""
    srv = restartable("--grace-time", 3)
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    a = owner(fh, "host-a", 1, offset=0, length=100)
    with NlmClient(srv.port) as c:
        expect(c.lock(a), S.GRANTED, "A's LOCK")
    srv.restart()
    started = time.monotonic()
    with NlmClient(srv.port) as c:
        expect(c.lock(a, reclaim=True), S.GRANTED, "A's reclaim")
        while True:
            r = c.lock(owner(fh, "host-b", 2, offset=50, length=100))
            if r.stat != S.DENIED_GRACE_PERIOD:
                break
            assert time.monotonic() - started < 3 + 20, f"still in grace 20 s after a 3 s grace period: {r!r}"
            time.sleep(0.2)
        expect(r, S.DENIED, "B's LOCK over A's reclaimed lock, after grace")
        expect(c.lock(owner(fh, "host-b", 2, offset=100, length=100)), S.GRANTED, "B's LOCK next to it, after grace")
        expect(c.lock(owner(fh, "host-c", 3), reclaim=True), S.DENIED_GRACE_PERIOD, "a reclaim after grace")


def test_state_number_is_odd_and_advances_by_two_each_start(restartable):
    """The NSM state number is kept in the state directory: odd while up,
    2 more at every start, whether the server crashed or stopped."""
    srv = restartable()
    s1 = sm_state(srv.port)
    assert s1 % 2 == 1, f"state {s1} at the first start"
    srv.restart()  # SIGKILL
    s2 = sm_state(srv.port)
    srv.stop()  # SIGTERM
    srv.start()
    s3 = sm_state(srv.port)
    assert (s2, s3) == (s1 + 2, s1 + 4), f"states at three starts: {s1}, {s2}, {s3}"


def _read_record(sock: socket.socket) -> bytes:
    """One record-marked RPC message from a stream socket."""

    def exact(k: int) -> bytes:
        buf = b""
        while len(buf) < k:
            chunk = sock.recv(k - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    out = b""
    while True:
        (mark,) = struct.unpack(">I", exact(4))
        out += exact(mark & 0x7FFFFFFF)
        if mark & 0x80000000:
            return out


class FakeClientHost:
    """What an NFSv3 client host runs for the server to call back, on
    127.0.0.1: a portmapper (UDP; PMAP v2 GETPORT and rpcbind v3/v4
    GETADDR) answering for NSM 1 over UDP and NLM 4 over TCP and UDP, a
    status monitor (UDP) and a lock manager (TCP and UDP). The portmapper
    runs in a thread; the test reads the others itself, blocking with a
    timeout (`wait_call`)."""

    def __init__(self, nlm_over: tuple[str, ...] = ("tcp", "udp")):
        self.nlm_over = nlm_over

        def udp():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            return s

        self.pmap, self.statd, self.nlm_udp = udp(), udp(), udp()
        self.pmap.settimeout(0.5)
        self.nlm_tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.nlm_tcp.bind(("127.0.0.1", 0))
        self.nlm_tcp.listen(8)
        self.pmap_port = self.pmap.getsockname()[1]
        self.statd_port = self.statd.getsockname()[1]
        self.nlm_udp_port = self.nlm_udp.getsockname()[1]
        self.nlm_tcp_port = self.nlm_tcp.getsockname()[1]
        self.queries: list[n.PortmapQuery] = []
        self.other_calls: list[rc.RpcCall] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_pmap, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)
        for s in (self.pmap, self.statd, self.nlm_udp, self.nlm_tcp):
            s.close()

    def _port_of(self, prog: int, prot) -> int:
        udp = prot == IPPROTO_UDP or (isinstance(prot, str) and prot.startswith("udp"))
        tcp = prot == IPPROTO_TCP or (isinstance(prot, str) and prot.startswith("tcp"))
        if prog == NSM_PROGRAM and udp:
            return self.statd_port
        if prog == NLM_PROGRAM and udp and "udp" in self.nlm_over:
            return self.nlm_udp_port
        if prog == NLM_PROGRAM and tcp and "tcp" in self.nlm_over:
            return self.nlm_tcp_port
        return 0

    def _serve_pmap(self):
        while not self._stop.is_set():
            try:
                data, addr = self.pmap.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            call = n.parse_call(data)
            if call is None or call.prog != n.PMAP_PROGRAM:
                continue
            q = n.PortmapQuery(call.vers, call.proc, raw=call.args)
            self.queries.append(q)
            try:
                if call.proc == 0:
                    body = b""
                elif call.vers == 2 and call.proc == 3:  # PMAPPROC_GETPORT
                    u = rc.Unpacker(call.args)
                    q.prog, q.prog_vers, q.prot = u.u32(), u.u32(), u.u32()
                    q.answered = self._port_of(q.prog, q.prot)
                    body = Packer().u32(q.answered).bytes()
                elif call.vers in (3, 4) and call.proc == 3:  # RPCBPROC_GETADDR
                    u = rc.Unpacker(call.args)
                    q.prog, q.prog_vers, q.prot = u.u32(), u.u32(), u.opaque().decode(errors="replace")
                    port = self._port_of(q.prog, q.prot)
                    q.answered = n.universal_address("127.0.0.1", port) if port else ""
                    body = Packer().string(q.answered).bytes()
                else:
                    self.pmap.sendto(n.accepted_reply(call, b"", rc.PROC_UNAVAIL), addr)
                    continue
            except rc.XdrError:
                self.pmap.sendto(n.accepted_reply(call, b"", rc.GARBAGE_ARGS), addr)
                continue
            self.pmap.sendto(n.accepted_reply(call, body), addr)

    def wait_call(self, want, timeout: float, answer=lambda call: b""):
        """The first call for which want(call) holds, on the status monitor
        or the lock manager (TCP or UDP), answered with answer(call) (not at
        all when `answer` is None, as if lost); other
        calls are answered PROC_UNAVAIL (NULL: void) and kept in
        `other_calls`. Raises socket.timeout after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        streams: list[socket.socket] = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                ready, _, _ = select.select([self.statd, self.nlm_udp, self.nlm_tcp, *streams], [], [], left)
                for s in ready:
                    if s is self.nlm_tcp:
                        conn, _ = s.accept()
                        conn.settimeout(max(1.0, left))
                        streams.append(conn)
                        continue
                    if s in streams:
                        try:
                            data = _read_record(s)
                        except (ConnectionError, OSError):
                            streams.remove(s)
                            s.close()
                            continue
                        call = n.parse_call(data)
                        if call is None:
                            continue
                        send = lambda rec, s=s: s.sendall(rc.frame(rec))  # noqa: E731
                    else:
                        data, addr = s.recvfrom(65536)
                        call = n.parse_call(data)
                        if call is None:
                            continue
                        send = lambda rec, s=s, addr=addr: s.sendto(rec, addr)  # noqa: E731
                    if want(call):
                        if answer is not None:
                            send(n.accepted_reply(call, answer(call)))
                        return call
                    self.other_calls.append(call)
                    send(n.accepted_reply(call, b"", rc.SUCCESS if call.proc == 0 else rc.PROC_UNAVAIL))
        finally:
            for s in streams:
                s.close()


def test_sm_notify_goes_to_hosts_that_held_locks_after_a_restart(restartable):
    """After a restart the server tells every host that held NLM locks
    that it rebooted (XNFS NSM; nfs-utils sm-notify): it asks the host's
    portmapper for NSM version 1 over UDP and sends SM_NOTIFY {mon_name =
    its own name, state = its new odd state}. `--nsm-portmap` points it at
    the test's fake portmapper."""
    srv = restartable()
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    with NlmClient(srv.port) as c:
        before = c.sm_stat("localhost").state
        expect(c.lock(owner(fh, "testhost", 1)), S.GRANTED, "testhost's LOCK")
    host = FakeClientHost()
    try:
        srv.extra_args += ["--nsm-portmap", f"127.0.0.1:{host.pmap_port}"]
        srv.restart()
        is_notify = lambda call: (call.prog, call.vers, call.proc) == (NSM_PROGRAM, NSM_V1, SmProc.NOTIFY)  # noqa: E731
        try:
            call = host.wait_call(is_notify, 30)
        except socket.timeout:
            raise AssertionError(
                f"no SM_NOTIFY within 30 s of the restart; portmapper queries: {host.queries}; other calls: {host.other_calls}"
            ) from None
        mon_name, state = n.decode_stat_chge(call.args)
        assert any(q.prog == NSM_PROGRAM for q in host.queries), f"the SM_NOTIFY came without asking the portmapper for NSM: {host.queries}"
        assert mon_name, "SM_NOTIFY with an empty mon_name"
        assert state % 2 == 1 and state > before, f"SM_NOTIFY state {state}: not odd or not above the state {before} before the restart"
        assert sm_state(srv.port) == state, "SM_STAT after the restart disagrees with the state sent in SM_NOTIFY"
    finally:
        host.close()


def _is_notify(call) -> bool:
    return (call.prog, call.vers, call.proc) == (NSM_PROGRAM, NSM_V1, SmProc.NOTIFY)


def test_sm_notify_goes_to_every_host_that_held_locks(restartable):
    """Two client hosts (two addresses, two names) held locks: each gets
    its SM_NOTIFY (both go to the test's fake status monitor here)."""
    srv = restartable()
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    with NlmClient(srv.port, source="127.0.0.2") as a, NlmClient(srv.port, source="127.0.0.3") as b:
        expect(a.lock(owner(fh, "client-two", 1, offset=0, length=10)), S.GRANTED, "client-two's LOCK")
        expect(b.lock(owner(fh, "client-three", 1, offset=10, length=10)), S.GRANTED, "client-three's LOCK")
    host = FakeClientHost()
    try:
        srv.extra_args += ["--nsm-portmap", f"127.0.0.1:{host.pmap_port}"]
        srv.restart()
        got = []
        for i in range(2):
            try:
                got.append(host.wait_call(_is_notify, 30))
            except socket.timeout:
                raise AssertionError(f"{len(got)} SM_NOTIFY within 30 s of the restart, for two hosts that held locks; portmapper queries: {host.queries}") from None
    finally:
        host.close()


def test_sm_notify_is_sent_again_when_lost(restartable):
    """SM_NOTIFY goes over UDP: when no answer comes, the server sends it
    again (nfs-utils sm-notify retries for 15 minutes)."""
    srv = restartable()
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    with NlmClient(srv.port) as c:
        expect(c.lock(owner(fh, "testhost", 1)), S.GRANTED, "testhost's LOCK")
    host = FakeClientHost()
    try:
        srv.extra_args += ["--nsm-portmap", f"127.0.0.1:{host.pmap_port}"]
        srv.restart()
        try:
            first = host.wait_call(_is_notify, 30, answer=None)
        except socket.timeout:
            raise AssertionError(f"no SM_NOTIFY within 30 s of the restart; portmapper queries: {host.queries}") from None
        try:
            again = host.wait_call(_is_notify, 60)
        except socket.timeout:
            raise AssertionError("the SM_NOTIFY left unanswered was not sent again within 60 s") from None
        assert n.decode_stat_chge(again.args) == n.decode_stat_chge(first.args), "the SM_NOTIFY sent again says something else"
    finally:
        host.close()


def test_caller_name_cannot_rewrite_what_the_server_records(restartable):
    """caller_name is the client's to choose, bytes included: one with NUL
    bytes in it must not change what the server keeps about the host
    (where it is, which address it called) across a restart, or a client
    could make the server send SM_NOTIFY, and portmapper queries, to any
    address it likes after every start, naming itself as it likes. Either
    the LOCK is refused, or after the restart that host's SM_NOTIFY names
    the server just as a plain host's does."""
    srv = restartable()
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    sly = b"sly\x00198.51.100.7\x00198.51.100.8"
    with NlmClient(srv.port) as c:
        expect(c.lock(owner(fh, "plain-host", 1, offset=100, length=10)), S.GRANTED, "a plain host's LOCK")
        r = c.lock(Lock(sly, fh, b"o", 1, 0, 10))
    if r.stat != S.GRANTED:
        return
    host = FakeClientHost()
    try:
        srv.extra_args += ["--nsm-portmap", f"127.0.0.1:{host.pmap_port}"]
        srv.restart()
        names = []
        for _ in range(2):
            try:
                names.append(n.decode_stat_chge(host.wait_call(_is_notify, 30).args)[0])
            except socket.timeout:
                raise AssertionError(f"{len(names)} SM_NOTIFY within 30 s of the restart for 2 hosts; portmapper queries: {host.queries}") from None
        assert names[0] == names[1], f"the two SM_NOTIFYs name the server {names[0]!r} and {names[1]!r}: one took its name from the caller_name {sly!r}"
    finally:
        host.close()


def test_granted_callback_when_a_blocked_lock_is_granted(restartable):
    """XNFS NLM_LOCK with block=true: once the conflict goes the server
    grants the lock and calls the client's lock manager (found through
    its portmapper, here the fake one given with `--nsm-portmap`) with
    NLM_GRANTED (Linux sends NLM_GRANTED_MSG) carrying the lock: exclusive,
    handle, svid, offset and length as requested. Meanwhile the lock is
    the waiter's."""
    host = FakeClientHost()
    try:
        srv = restartable("--nsm-portmap", f"127.0.0.1:{host.pmap_port}")
        e = Env(srv.port)
        fh = e.new_file()
        e.close()
        b = owner(fh, "host-b", 77, offset=10, length=20, oh=b"waiter-oh")
        with NlmClient(srv.port) as c:
            expect(c.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
            expect(c.lock(b, block=True, cookie=b"wait-ck"), S.BLOCKED, "B's blocking LOCK")
            expect(c.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
            is_granted = lambda call: call.prog == NLM_PROGRAM and call.proc in (NlmProc.GRANTED, NlmProc.GRANTED_MSG)  # noqa: E731
            try:
                call = host.wait_call(is_granted, 30, answer=lambda call: n.encode_res(n.decode_testargs(call.args)[0], S.GRANTED) if call.proc == NlmProc.GRANTED else b"")
            except socket.timeout:
                raise AssertionError(f"no NLM GRANTED within 30 s; portmapper queries: {host.queries}; other calls: {host.other_calls}") from None
            assert call.vers == NLM_V4, f"GRANTED of NLM version {call.vers}"
            _, exclusive, lk = n.decode_testargs(call.args)
            assert (exclusive, lk.fh, lk.svid, lk.offset, lk.length) == (True, fh, 77, 10, 20), f"GRANTED for {exclusive=} {lk!r}"
            assert lk.oh == b"waiter-oh", f"GRANTED names the owner handle {lk.oh!r}"
            r = expect(c.test(owner(fh, "host-c", 3, offset=15, length=1)), S.DENIED, "C's TEST: B holds the granted lock")
            assert r.holder.svid == 77, r
            expect(c.lock(b, block=True), S.GRANTED, "B's LOCK sent again")
    finally:
        host.close()


# --- asynchronous requests (the _MSG procedures) -------------------------------


def _wait_result(host: "FakeClientHost", proc: int, cookie: bytes, what: str, timeout: float = 20) -> rc.RpcCall:
    """The NLM _RES call `proc` carrying `cookie`, answered with nothing
    (as lock managers answer them)."""
    want = lambda call: call.prog == NLM_PROGRAM and call.proc == proc and call.args[4 : 4 + len(cookie)] == cookie  # noqa: E731
    try:
        call = host.wait_call(want, timeout, answer=None)
    except socket.timeout:
        raise AssertionError(f"{what}: no NLM procedure {proc} within {timeout} s; portmapper queries: {host.queries}; other calls: {host.other_calls}") from None
    assert call.vers == NLM_V4, f"{what}: NLM version {call.vers}"
    return call


def _nlm_ports_asked(host: "FakeClientHost") -> list:
    return [q.prot for q in host.queries if q.prog == NLM_PROGRAM]


def _msg_server(sluice_factory, host: "FakeClientHost") -> tuple:
    """A sluice (metrics on, no grace) that finds client hosts' services
    through `host`'s portmapper, and a new file of its export."""
    srv = sluice_factory("--grace-time", 0, "--nsm-portmap", f"127.0.0.1:{host.pmap_port}", root_squash=False, metrics=True)
    e = Env(srv.port)
    fh = e.new_file()
    e.close()
    return srv, fh


@pytest.mark.parametrize("udp", [False, True], ids=["tcp", "udp"])
def test_async_requests_send_their_results_to_the_callers_lock_manager(sluice_factory, udp):
    """XNFS's asynchronous requests, which macOS's lock manager sends
    (TEST_MSG, LOCK_MSG, CANCEL_MSG, UNLOCK_MSG, with a zero timeout: it
    does not wait for the call's answer): each does what its synchronous
    twin does, the call is answered with nothing, and the results come
    in a call to the caller's lock manager (TEST_RES, LOCK_RES,
    CANCEL_RES, UNLOCK_RES) with the request's cookie. The manager is
    found through the caller's portmapper (here the fake one given with
    `--nsm-portmap`), over the transport the request came by, as the
    Linux server sends them (fs/lockd/svc4proc.c)."""
    host = FakeClientHost()
    try:
        srv, fh = _msg_server(sluice_factory, host)
        a = owner(fh, "host-mac", 31, offset=0, length=100)
        with NlmClient(srv.port, udp=udp) as c:
            r = accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.LOCK_MSG, n.lockargs(a, True, False, False, 1, b"lock-ck")), "LOCK_MSG")
            assert r.body == b"", f"LOCK_MSG answered {r.body!r}, not nothing"
            res = n.decode_res("LOCK_RES", _wait_result(host, NlmProc.LOCK_RES, b"lock-ck", "LOCK_MSG").args)
            assert (res.cookie, res.stat) == (b"lock-ck", S.GRANTED), res
            want = IPPROTO_UDP if udp else IPPROTO_TCP
            assert _nlm_ports_asked(host)[:1] == [want], f"the portmapper was asked for NLM over {_nlm_ports_asked(host)}, the request came over {'UDP' if udp else 'TCP'}"
            # The lock is held: another host's synchronous TEST is denied.
            r = expect(c.test(owner(fh, "host-b", 2, offset=50, length=10)), S.DENIED, "B's TEST of the range locked by LOCK_MSG")
            assert r.holder.svid == 31, r

            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.TEST_MSG, n.testargs(owner(fh, "host-b", 2, offset=50, length=10), True, b"test-ck")), "TEST_MSG")
            res = n.decode_testres(_wait_result(host, NlmProc.TEST_RES, b"test-ck", "TEST_MSG").args)
            assert (res.cookie, res.stat) == (b"test-ck", S.DENIED), res
            assert (res.holder.exclusive, res.holder.svid, res.holder.offset, res.holder.length) == (True, 31, 0, 100), res

            # A blocking LOCK_MSG that meets the lock: BLOCKED in its
            # LOCK_RES; CANCEL_MSG takes the request back.
            b = owner(fh, "host-b", 2, offset=50, length=10)
            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.LOCK_MSG, n.lockargs(b, True, True, False, 1, b"block-ck")), "blocking LOCK_MSG")
            res = n.decode_res("LOCK_RES", _wait_result(host, NlmProc.LOCK_RES, b"block-ck", "blocking LOCK_MSG").args)
            assert res.stat == S.BLOCKED, res
            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.CANCEL_MSG, n.cancargs(b, True, True, b"cancel-ck")), "CANCEL_MSG")
            res = n.decode_res("CANCEL_RES", _wait_result(host, NlmProc.CANCEL_RES, b"cancel-ck", "CANCEL_MSG").args)
            assert (res.cookie, res.stat) == (b"cancel-ck", S.GRANTED), res

            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.UNLOCK_MSG, n.unlockargs(a, b"unlock-ck")), "UNLOCK_MSG")
            res = n.decode_res("UNLOCK_RES", _wait_result(host, NlmProc.UNLOCK_RES, b"unlock-ck", "UNLOCK_MSG").args)
            assert (res.cookie, res.stat) == (b"unlock-ck", S.GRANTED), res
            # Released, and the cancelled request was not granted meanwhile.
            expect(c.test(owner(fh, "host-c", 3)), S.GRANTED, "C's TEST after UNLOCK_MSG (and B's request cancelled)")
        assert srv.wait_counter("sluice_nlm_results_sent", 5), f"sluice_nlm_results_sent {srv.counter('sluice_nlm_results_sent')} after five results came"
        assert srv.counter("sluice_nlm_results_sent") == 5
    finally:
        host.close()


@pytest.mark.parametrize("nlm_over", [("tcp", "udp"), ("udp",)], ids=["tcp-and-udp", "udp-only"])
def test_async_lock_blocked_then_granted_by_a_granted_call(sluice_factory, nlm_over):
    """A blocking LOCK_MSG answered NLM4_BLOCKED (in its LOCK_RES) is
    granted like a blocking LOCK: when the conflict goes the client's lock
    manager gets NLM_GRANTED for it, over TCP, or over UDP when its
    portmapper knows it only there. The results go over TCP, the
    request's transport, or UDP likewise."""
    host = FakeClientHost(nlm_over)
    try:
        srv, fh = _msg_server(sluice_factory, host)
        b = owner(fh, "host-mac", 32, offset=10, length=20)
        with NlmClient(srv.port) as c:
            expect(c.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.LOCK_MSG, n.lockargs(b, True, True, False, 1, b"wait-ck")), "blocking LOCK_MSG")
            res = n.decode_res("LOCK_RES", _wait_result(host, NlmProc.LOCK_RES, b"wait-ck", "blocking LOCK_MSG").args)
            assert res.stat == S.BLOCKED, res
            assert _nlm_ports_asked(host)[:1] == [IPPROTO_TCP], f"the portmapper was asked for NLM over {_nlm_ports_asked(host)} for the LOCK_RES of a request over TCP"
            expect(c.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")
            _wait_granted(host, b, True, "the LOCK_MSG's lock once A's went")
            if nlm_over == ("udp",):
                # Both the LOCK_RES and the GRANTED found the lock manager over UDP.
                over_udp = [q for q in host.queries if q.prog == NLM_PROGRAM and q.prot == IPPROTO_UDP and q.answered]
                assert len(over_udp) == 2, f"NLM over UDP asked of the portmapper: {host.queries}"
            r = expect(c.test(owner(fh, "host-c", 3, offset=15, length=1)), S.DENIED, "C's TEST: the LOCK_MSG's owner holds the granted lock")
            assert r.holder.svid == 32, r
    finally:
        host.close()


def test_malformed_async_request_gets_garbage_args_and_no_results(sluice_factory):
    """A LOCK_MSG whose arguments do not decode gets GARBAGE_ARGS, takes
    no lock and sends no LOCK_RES; the next well-formed one is served."""
    host = FakeClientHost()
    try:
        srv, fh = _msg_server(sluice_factory, host)
        a = owner(fh, "host-mac", 33)
        with NlmClient(srv.port) as c:
            garbage(c, NLM_PROGRAM, NLM_V4, NlmProc.LOCK_MSG, n.lockargs(a, True, False, False, 1, b"bad-ck")[:-4], "LOCK_MSG without its state")
            expect(c.test(owner(fh, "host-b", 2)), S.GRANTED, "B's TEST: the malformed LOCK_MSG took no lock")
            accepted(c.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.LOCK_MSG, n.lockargs(a, True, False, False, 1, b"good-ck")), "LOCK_MSG")
            call = _wait_result(host, NlmProc.LOCK_RES, b"good-ck", "the well-formed LOCK_MSG")
            assert n.decode_res("LOCK_RES", call.args).stat == S.GRANTED
            stray = [x for x in host.other_calls if x.prog == NLM_PROGRAM and x.proc == NlmProc.LOCK_RES]
            assert not stray, f"LOCK_RES calls for the malformed request: {stray}"
        assert srv.wait_counter("sluice_nlm_results_sent", 1)
        assert srv.counter("sluice_nlm_results_sent") == 1
    finally:
        host.close()


def _wait_granted(host: "FakeClientHost", lk: Lock, exclusive: bool, what: str, timeout: float = 20, probe=None):
    """The NLM GRANTED call for `lk`, answered NLM4_GRANTED. When none
    comes, probe() (if given) says in the failure what the server answers
    now."""
    is_granted = lambda call: call.prog == NLM_PROGRAM and call.proc in (NlmProc.GRANTED, NlmProc.GRANTED_MSG)  # noqa: E731

    def answer(call):
        return n.encode_res(n.decode_testargs(call.args)[0], S.GRANTED) if call.proc == NlmProc.GRANTED else b""

    try:
        call = host.wait_call(is_granted, timeout, answer=answer)
    except socket.timeout:
        now = f"; {probe()}" if probe is not None else ""
        raise AssertionError(f"{what}: no NLM GRANTED within {timeout} s; portmapper queries: {host.queries}; other calls: {host.other_calls}{now}") from None
    _, excl, got = n.decode_testargs(call.args)
    assert (excl, got.fh, got.svid, got.offset, got.length) == (exclusive, lk.fh, lk.svid, lk.offset, lk.length), f"{what}: GRANTED for {excl=} {got!r}"


def test_granted_callback_when_an_nfsv4_unlock_frees_the_range(restartable):
    """The conflict may go on the NFSv4 side: a LOCKU there grants the
    waiting NLM request as an NLM UNLOCK would (Linux: the VFS wakes
    lockd's block whoever released the lock), and the client is called
    at once instead of finding out when it next re-sends (30 s later for
    Linux clients)."""
    host = FakeClientHost()
    try:
        srv = restartable("--nsm-portmap", f"127.0.0.1:{host.pmap_port}")
        name = unique("x4")
        c4 = v4_client(srv.port)
        sid, fh4 = v4_open(c4, name)
        e = Env(srv.port)
        fh3 = e.lookup(name)
        e.close()
        r = v4_lock(c4, fh4, sid, b"v4-owner", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK: {r!r}"
        b = owner(fh3, "host-b", 5, offset=0, length=10)
        with NlmClient(srv.port) as c:
            expect(c.lock(b, block=True), S.BLOCKED, "NLM blocking LOCK under the NFSv4 lock")
            r = c4.compound([rc.op_putfh(fh4), rc.op_locku(r.stateid, 0, 100, WRITE_LT)])
            assert r.status == St.OK, f"NFSv4 LOCKU: {r!r}"
            _wait_granted(host, b, True, "after the NFSv4 LOCKU")
        c4.close()
    finally:
        host.close()


def test_granted_callback_when_the_holder_downgrades(restartable):
    """A holder that downgrades its exclusive lock to a shared one lets a
    waiting shared request through (POSIX: changing a lock wakes its
    waiters)."""
    host = FakeClientHost()
    try:
        srv = restartable("--nsm-portmap", f"127.0.0.1:{host.pmap_port}")
        e = Env(srv.port)
        fh = e.new_file()
        e.close()
        a, b = owner(fh, "host-a", 1), owner(fh, "host-b", 2)
        with NlmClient(srv.port) as c:
            expect(c.lock(a), S.GRANTED, "A's exclusive LOCK")
            expect(c.lock(b, exclusive=False, block=True), S.BLOCKED, "B's blocking shared LOCK")
            expect(c.lock(a, exclusive=False), S.GRANTED, "A's downgrade to shared")
            _wait_granted(host, b, False, "after A's downgrade")
    finally:
        host.close()


def test_lock_the_client_refuses_in_granted_is_released(restartable):
    """A client that no longer waits (its process gave up, its CANCEL
    crossed the grant) answers NLM_GRANTED with NLM4_DENIED; the server
    then unlocks (Linux nlmsvc_grant_reply: "Client doesn't want it, just
    unlock it"), so the next waiter gets the lock and its own GRANTED."""
    host = FakeClientHost()
    try:
        srv = restartable("--nsm-portmap", f"127.0.0.1:{host.pmap_port}")
        e = Env(srv.port)
        fh = e.new_file()
        e.close()
        b, d = owner(fh, "host-b", 2), owner(fh, "host-d", 4)
        with NlmClient(srv.port) as c:
            expect(c.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
            expect(c.lock(b, block=True), S.BLOCKED, "B's blocking LOCK")
            expect(c.lock(d, block=True), S.BLOCKED, "D's blocking LOCK, queued after B's")
            expect(c.unlock(owner(fh, "host-a", 1)), S.GRANTED, "A's UNLOCK")

            def granted_to(svid):
                return lambda call: call.prog == NLM_PROGRAM and call.proc in (NlmProc.GRANTED, NlmProc.GRANTED_MSG) and n.decode_testargs(call.args)[2].svid == svid

            def refuse(call):
                return n.encode_res(n.decode_testargs(call.args)[0], S.DENIED) if call.proc == NlmProc.GRANTED else b""

            try:
                host.wait_call(granted_to(2), 10, answer=refuse)
            except socket.timeout:
                raise AssertionError(f"no NLM GRANTED for B within 10 s; other calls: {host.other_calls}") from None
            try:
                host.wait_call(granted_to(4), 10, answer=lambda call: n.encode_res(n.decode_testargs(call.args)[0], S.GRANTED))
            except socket.timeout:
                r = c.test(owner(fh, "host-c", 3))
                raise AssertionError(f"B refused the lock (NLM4_DENIED to GRANTED), yet D got no GRANTED within 10 s; C's TEST now: {r!r}") from None
            r = expect(c.test(owner(fh, "host-c", 3)), S.DENIED, "C's TEST: D holds")
            assert r.holder.svid == 4, r
    finally:
        host.close()


def test_nlm_waiter_expires_a_courtesy_client_in_its_way(sluice_factory):
    """A courteous server keeps an NFSv4 client whose lease ran out only
    while nobody waits for its locks (Linux nfs4_anylock_blockers: a
    courtesy client whose locks block someone, lockd's waiters included,
    is expired): an NLM LOCK answered NLM4_BLOCKED behind such a lock is
    granted, with NLM_GRANTED, once the lease is out, without the client
    having to ask again."""
    fake = FakeClientHost()
    try:
        srv = sluice_factory("--lease-time", 2, "--grace-time", 0, "--nsm-portmap", f"127.0.0.1:{fake.pmap_port}", root_squash=False)
        name = unique("court")
        c4 = v4_client(srv.port)
        sid, fh4 = v4_open(c4, name)
        r = v4_lock(c4, fh4, sid, b"v4-owner", 0, 100)
        assert r.status == St.OK, f"NFSv4 LOCK: {r!r}"
        c4.close()
        e = Env(srv.port)
        fh3 = e.lookup(name)
        e.close()
        lk = owner(fh3, "host-b", 2, offset=50, length=10)
        with NlmClient(srv.port) as c:
            expect(c.lock(lk, block=True), S.BLOCKED, "NLM blocking LOCK behind the NFSv4 client's lock (lease not out yet)")
            _wait_granted(fake, lk, True, "after the NFSv4 client's lease ran out with an NLM request waiting for its lock", probe=lambda: f"the same LOCK sent again now answers {c.lock(lk, block=True)!r}")
    finally:
        fake.close()


def test_test_agrees_with_lock_about_a_courtesy_clients_lock(sluice_factory):
    """A courteous server keeps the locks of an NFSv4 client whose lease
    ran out until somebody needs them: then the client is expired and the
    request goes through. TEST must say what LOCK would do (Linux
    posix_test_lock also expires courtesy clients in the way).
    Waiting for the lease to run out is what is checked: polled."""
    srv = sluice_factory("--lease-time", 2, "--grace-time", 0, metrics=True, root_squash=False)
    name = unique("court")
    c4 = v4_client(srv.port)
    sid, fh4 = v4_open(c4, name)
    r = v4_lock(c4, fh4, sid, b"v4-owner", 0, 100)
    assert r.status == St.OK, f"NFSv4 LOCK: {r!r}"
    c4.close()
    e = Env(srv.port)
    fh3 = e.lookup(name)
    e.close()
    deadline = time.monotonic() + 20
    while srv.metrics().get("sluice_courtesy_clients", 0) < 1:
        assert time.monotonic() < deadline, "the silent NFSv4 client did not become a courtesy client within 20 s"
        time.sleep(0.1)
    with NlmClient(srv.port) as c:
        t = c.test(owner(fh3, "host-b", 2, offset=50, length=10))
        lk = c.lock(owner(fh3, "host-b", 2, offset=50, length=10))
    expect(lk, S.GRANTED, "NLM LOCK over a courtesy client's lock")
    assert t.stat == S.GRANTED, f"NLM TEST over a courtesy client's lock answered {t!r}, but the LOCK right after it was granted"


def test_export_client_rules_apply_to_nlm(sluice_binary, tmp_path):
    """An export open to 127.0.0.2 only: its handles do not lock for
    anybody else (Linux: nlm_fopen's nfsd_open checks the export's
    clients; NLM4_FAILED)."""
    srv = v.ConfigServer(
        sluice_binary,
        tmp_path / "cl",
        [("a", 'pseudo = "/a"\nsquash = "none"\nclients = ["127.0.0.2"]'), ("b", 'pseudo = "/b"\nsquash = "none"')],
    )
    (srv.dirs["a"] / "f").write_bytes(b"for 127.0.0.2")
    srv.start()
    try:
        with v.Mount(srv.port, conn=n.BoundConn(srv.port, source="127.0.0.2")) as m:
            r = m.mnt("/a")
            assert r.status == v.M.OK, f"MNT /a from 127.0.0.2: {r!r}"
        with v.Nfs3(srv.port, conn=n.BoundConn(srv.port, source="127.0.0.2")) as nfs:
            fh = nfs.must(nfs.lookup(r.fh, "f")).fh
        with NlmClient(srv.port, source="127.0.0.2") as inside:
            expect(inside.lock(owner(fh, "host-in", 1, offset=0, length=10)), S.GRANTED, "LOCK from 127.0.0.2")
        with NlmClient(srv.port) as outside:
            r = outside.lock(owner(fh, "host-out", 2, offset=100, length=10))
            assert r.stat == S.FAILED, f"LOCK from 127.0.0.1 with a handle of an export for 127.0.0.2 only: expected NLM4_FAILED, got {r!r}"
            r = outside.test(owner(fh, "host-out", 2, offset=0, length=10))
            assert r.stat == S.FAILED, f"TEST from 127.0.0.1 of that export: expected NLM4_FAILED, got {r!r}"
        assert srv.alive(), srv.log()
    finally:
        srv.stop()


# --- 9. malformed calls -----------------------------------------------------------------


def test_truncated_nlm_arguments_get_garbage_args(nlm, fh):
    a = owner(fh)
    full_lock = n.lockargs(a, True, False, False, 1, b"ck")
    cases = [
        (NlmProc.TEST, b"", "TEST without arguments"),
        (NlmProc.TEST, Packer().opaque(b"ck").bool(True).bytes(), "TEST without the lock"),
        (NlmProc.TEST, n.testargs(a, True, b"ck")[:-4], "TEST with half a length"),
        (NlmProc.LOCK, full_lock[:-4], "LOCK without the state"),
        (NlmProc.LOCK, full_lock[:-8], "LOCK without reclaim and state"),
        (NlmProc.CANCEL, n.cancargs(a, True, True, b"ck")[:-8], "CANCEL without the length"),
        (NlmProc.UNLOCK, Packer().opaque(b"ck").opaque(b"host-a").u32(len(fh)).raw(fh[:4]).bytes(), "UNLOCK with a handle cut short"),
        (NlmProc.SHARE, n.shareargs(Share("host-a", fh, b"o"), False, b"ck")[:-4], "SHARE without reclaim"),
        (NlmProc.UNSHARE, Packer().opaque(b"ck").bytes(), "UNSHARE without the share"),
        (NlmProc.NM_LOCK, full_lock[:20], "NM_LOCK cut short"),
        (NlmProc.FREE_ALL, Packer().opaque(b"host-a").bytes(), "FREE_ALL without the state"),
    ]
    for proc, args, what in cases:
        garbage(nlm, NLM_PROGRAM, NLM_V4, proc, args, what)
    accepted(nlm.null(), "NULL on the same connection afterwards")
    expect(nlm.lock(a), S.GRANTED, "a well-formed LOCK on the same connection: nothing was locked by the truncated ones")


def test_oversized_nlm_fields_get_garbage_args(nlm, fh):
    """Bounds of the XDR: caller_name<LM_MAXSTRLEN> (1024), netobj
    <MAXNETOBJ_SZ> (1024) for the handle and the owner, nlm4_notify's
    name<LM_MAXNAMELEN> (1025); Linux refuses them while decoding (and
    handles over 128 bytes)."""
    cases = [
        (Lock("h" * 1025, fh, b"o", 1, 0, 1), "caller_name of 1025 bytes"),
        (Lock("host", fh + b"\0" * (1025 - len(fh)), b"o", 1, 0, 1), "handle of 1025 bytes"),
        (Lock("host", fh, b"o" * 1025, 1, 0, 1), "owner handle of 1025 bytes"),
    ]
    for lk, what in cases:
        garbage(nlm, NLM_PROGRAM, NLM_V4, NlmProc.LOCK, n.lockargs(lk, True, False, False, 1, b"ck"), f"LOCK with a {what}")
        garbage(nlm, NLM_PROGRAM, NLM_V4, NlmProc.TEST, n.testargs(lk, True, b"ck"), f"TEST with a {what}")
    huge = Packer().opaque(b"ck").bool(False).bool(True).u32(1 << 30).bytes()
    garbage(nlm, NLM_PROGRAM, NLM_V4, NlmProc.LOCK, huge, "LOCK with a caller_name length of 1 GiB")
    garbage(nlm, NLM_PROGRAM, NLM_V4, NlmProc.FREE_ALL, n.notifyargs("h" * 1026, 1), "FREE_ALL with a name of 1026 bytes")
    accepted(nlm.null(), "NULL afterwards")
    expect(nlm.lock(Lock("h" * 1024, fh, b"o" * 1024, 1, 0, 100)), S.GRANTED, "LOCK with a caller_name and an owner handle of 1024 bytes each")
    expect(nlm.lock(owner(fh)), S.DENIED, "a well-formed LOCK of another owner afterwards")


def test_malformed_nsm_arguments_get_garbage_args(nlm, fh, nsm_here):
    cases = [
        (SmProc.STAT, b"", "SM_STAT without a name"),
        (SmProc.STAT, n.sm_name("h" * 1025), "SM_STAT with a name of 1025 bytes"),
        (SmProc.MON, n.mon("host", "me")[:-8], "SM_MON with half the private data"),
        (SmProc.UNMON, Packer().opaque(b"host").bytes(), "SM_UNMON without my_id"),
        (SmProc.UNMON_ALL, Packer().opaque(b"me").u32(NLM_PROGRAM).bytes(), "SM_UNMON_ALL cut short"),
        (SmProc.NOTIFY, Packer().opaque(b"host-a").bytes(), "SM_NOTIFY without the state"),
        (SmProc.NOTIFY, n.stat_chge("h" * 1025, 3), "SM_NOTIFY with a mon_name of 1025 bytes"),
    ]
    expect(nlm.lock(owner(fh, "host-a", 1)), S.GRANTED, "A's LOCK")
    for proc, args, what in cases:
        garbage(nlm, NSM_PROGRAM, NSM_V1, proc, args, what)
    accepted(nlm.sm_null(), "NSM NULL afterwards")
    expect(nlm.lock(owner(fh, "host-b", 2)), S.DENIED, "B's LOCK: the malformed SM_NOTIFY released nothing")


def test_malformed_calls_over_udp_get_garbage_args(server, fh):
    """Over UDP too; and datagrams that are no RPC call at all (too short,
    a reply, a record mark as over TCP) get nothing and harm nothing."""
    with NlmClient(server.port, udp=True) as u:
        u.conn.sock.send(b"\x01\x02")
        u.conn.sock.send(Packer().u32(0x1234).u32(rc.MSG_REPLY).u32(0).u32(0).u32(0).u32(0).bytes())
        u.conn.sock.send(rc.frame(rc.call_header(rc.next_xid(), prog=NLM_PROGRAM, vers=NLM_V4, proc=0)))
        garbage(u, NLM_PROGRAM, NLM_V4, NlmProc.LOCK, b"\xff\xff\xff\xff", "LOCK of nonsense over UDP")
        garbage(u, NSM_PROGRAM, NSM_V1, SmProc.NOTIFY, b"\0\0\0\x10ab", "SM_NOTIFY cut short over UDP")
        accepted(u.null(), "NLM NULL over UDP afterwards")
        expect(u.lock(owner(fh)), S.GRANTED, "a well-formed LOCK over UDP afterwards")


def test_garbage_on_one_connection_does_not_disturb_another(server, nlm, fh):
    with NlmClient(server.port) as other:
        garbage(other, NLM_PROGRAM, NLM_V4, NlmProc.TEST, b"\xff" * 7, "TEST of 7 bytes of nonsense")
        expect(nlm.lock(owner(fh)), S.GRANTED, "LOCK on the other connection")
        expect(other.test(owner(fh, "host-b", 2)), S.DENIED, "TEST on the connection that sent garbage")
