"""MOUNT v3/v1 (RFC 1813 appendix I) and portmap v2 (RFC 1833) over raw RPC.

sluice answers both on its one NFS port. By default each test starts
`sluice serve DIR` through conftest's fixtures; with
NFS3_TARGET=HOST:NFSPORT:MOUNTPORT:EXPORTPATH[:PORTMAPPORT] (portmapper
port 111 by default) the tests that need no sluice configuration run
against that server instead (e.g. nfs-ganesha with rpcbind), so they can
be checked against another implementation:

    python3 -m pytest -q tests/interop/test_mount.py

Against the Linux server (rpc.mountd of nfs-utils 2.6.2 and rpcbind in a
Linux 6.12 guest, reached through forwarded ports) 14 passed and 6
failed. Four fail only because the ports are forwarded: the portmapper
names the guest's own ports and address. The two others are
differences: rpc.mountd serves MOUNT version 2 too (sluice serves 1 and
3, and answers 2 with PROG_MISMATCH), and its UMNTALL left the caller
listed in DUMP (it removes the entries listed under the caller's
canonical host name, utils/mountd/rmtab.c, and the caller had a name in
the guest's /etc/hosts).

No sleeps: every wait is a blocking read with a timeout.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import rpcclient as rc
import v3client as v
from v3client import IPPROTO_TCP, IPPROTO_UDP, M, MntProc, Packer, unique


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("sluice must run as root")


@pytest.fixture(scope="module")
def sluice_binary() -> Path:
    """$SLUICE_BINARY when set (a separately built copy: nothing is
    rebuilt), else conftest's build."""
    env = os.environ.get("SLUICE_BINARY")
    if env:
        return Path(env)
    import conftest

    return conftest.build_binary()


@pytest.fixture
def target(request) -> v.Target:
    t = v.external_target()
    if t is not None:
        return t
    _need_root()
    return v.sluice_target(request.getfixturevalue("sluice_server"))


@pytest.fixture
def sluice_only():
    if v.external_target() is not None:
        pytest.skip("needs sluice started by the fixtures (NFS3_TARGET is set)")
    _need_root()


@pytest.fixture
def binary(sluice_only, sluice_binary) -> Path:
    return sluice_binary


@pytest.fixture
def m(target):
    with target.mount() as client:
        yield client


def accepted_void(r, what: str):
    assert (r.reply_stat, r.accept_stat, r.body) == (rc.MSG_ACCEPTED, rc.SUCCESS, b""), f"{what}: {r!r}"


def mnt_ok(m: v.Mount, path: str, what: str = "") -> v.Res:
    r = m.mnt(path)
    assert r.status == M.OK, f"{what or 'MNT ' + path}: {r!r}"
    assert 0 < len(r.fh) <= v.NFS3_FHSIZE, f"MNT handle of {len(r.fh)} bytes"
    return r


# --- MOUNT v3 ----------------------------------------------------------------


def test_null(m):
    accepted_void(m.null(), "MOUNT v3 NULL")


@pytest.mark.parametrize("vers", [2, 4])
def test_unsupported_mount_version_gets_prog_mismatch(m, vers):
    r = m.call_raw(v.MOUNT_PROGRAM, vers, MntProc.NULL)
    assert (r.accept_stat, r.low, r.high) == (rc.PROG_MISMATCH, 1, 3), r
    accepted_void(m.null(), "NULL after the mismatch")


def test_unknown_mount_procedure_gets_proc_unavail(m):
    r = m.call_raw(v.MOUNT_PROGRAM, 3, 6)
    assert r.accept_stat == rc.PROC_UNAVAIL, r


def test_export_lists_the_export(target, m):
    exports = m.export()
    dirs = [d for d, _ in exports]
    assert target.path in dirs, f"EXPORT answered {exports}"


def test_mnt_gives_a_directory_handle_and_auth_sys(target, m):
    r = mnt_ok(m, target.path)
    assert rc.AUTH_SYS in r.flavors, f"auth flavors {r.flavors}"
    assert set(r.flavors) <= {rc.AUTH_NONE, rc.AUTH_SYS, rc.RPCSEC_GSS, 390003, 390004, 390005}, r.flavors
    with target.nfs() as c:
        a = c.must(c.getattr(r.fh)).attr
        assert a.type == v.NF3DIR, a
        # the handle works for the whole NFSv3 protocol, not only GETATTR
        name = unique("mnt")
        c.must(c.mkdir(r.fh, name))
        c.must(c.lookup(r.fh, name))


def test_mnt_twice_gives_the_same_handle(target, m):
    assert mnt_ok(m, target.path).fh == mnt_ok(m, target.path).fh


def test_mnt_of_the_export_directory_path(sluice_only, sluice_server):
    """`sluice serve DIR`: the export is "/" and DIR's own path, as a Linux
    server would name it, mounts the same directory."""
    t = v.sluice_target(sluice_server)
    with t.mount() as m:
        by_root = mnt_ok(m, "/")
        by_path = mnt_ok(m, str(sluice_server.export), "MNT of the export directory's path")
        with t.nfs() as c:
            assert c.must(c.getattr(by_path.fh)).attr.fileid == c.must(c.getattr(by_root.fh)).attr.fileid


def test_mnt_of_a_missing_path_is_noent(target, m):
    """A path under the export that does not exist: MNT3ERR_NOENT (RFC 1813
    appendix I; Linux's mountd answers so when the stat fails)."""
    base = target.path.rstrip("/")
    r = m.mnt(f"{base}/{unique('missing')}")
    assert r.status == M.NOENT, r


def test_mnt_of_a_path_over_1024_bytes_is_garbage_args(target, m):
    """dirpath is string<MNTPATHLEN> with MNTPATHLEN 1024: a longer one is not
    valid XDR."""
    r = m.call_raw(v.MOUNT_PROGRAM, 3, MntProc.MNT, Packer().opaque(b"/" + b"a" * 1100).bytes())
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.GARBAGE_ARGS), r
    accepted_void(m.null(), "NULL after the garbage")
    mnt_ok(m, target.path)


def test_truncated_mnt_is_garbage_args(target, m):
    r = m.call_raw(v.MOUNT_PROGRAM, 3, MntProc.MNT, Packer().u32(40).raw(b"/short").bytes())
    assert (r.reply_stat, r.accept_stat) == (rc.MSG_ACCEPTED, rc.GARBAGE_ARGS), r
    mnt_ok(m, target.path)


def test_umnt_and_umntall_answer_void(target, m):
    mnt_ok(m, target.path)
    accepted_void(m.umnt(target.path), "UMNT")
    accepted_void(m.umnt("/never/mounted"), "UMNT of a path never mounted")
    accepted_void(m.umntall(), "UMNTALL")
    # unmounting is advisory: the handle keeps working (RFC 1813 appendix I)
    r = mnt_ok(m, target.path)
    accepted_void(m.umnt(target.path), "UMNT")
    with target.nfs() as c:
        c.must(c.getattr(r.fh))


def test_dump_is_well_formed(target, m):
    mnt_ok(m, target.path)
    mounts = m.dump()  # decodes the whole mountlist or raises
    for host, path in mounts:
        assert host and path.startswith("/"), mounts
    if mounts:
        assert target.path in [p for _, p in mounts], f"DUMP lists {mounts} but not the mount just made"
        m.umntall()
        # after UMNTALL this client's entries are gone
        assert target.path not in [p for _, p in m.dump()], "UMNTALL left the client's mount in DUMP"


# --- MOUNT v1 ----------------------------------------------------------------
# MNT v1 answers a fixed 32-byte fhandle; sluice's handles need not fit in
# 32 bytes, so what MNT v1 answers (a padded handle, or an error) is left
# open here. NULL and EXPORT must work.


def test_v1_null(m):
    accepted_void(m.null(vers=v.MOUNT_V1), "MOUNT v1 NULL")


def test_v1_export_lists_the_same_exports(m):
    assert m.export(vers=v.MOUNT_V1) == m.export(vers=v.MOUNT_V3)


# --- client rules -------------------------------------------------------------


def test_mnt_refused_by_the_export_client_rules(binary, tmp_path):
    """Of two exports, one only for 192.0.2.0/24: MNT of it from loopback is
    MNT3ERR_ACCES, under its pseudo path or its directory's path, while the
    open one mounts."""
    srv = v.ConfigServer(
        binary,
        tmp_path / "rules",
        [
            ("open", 'pseudo = "/open"\nsquash = "none"'),
            ("secret", 'pseudo = "/secret"\nsquash = "none"\nclients = ["192.0.2.0/24"]'),
        ],
    )
    srv.start()
    try:
        t = v.sluice_target(srv)
        with t.mount() as m:
            for path in ("/secret", str(srv.dirs["secret"])):
                r = m.mnt(path)
                assert r.status == M.ACCES, f"MNT {path} from a client outside the export's rules: {r!r}"
            open_fh = mnt_ok(m, "/open").fh
            by_path = mnt_ok(m, str(srv.dirs["open"]), "MNT of the open export's directory path")
        with t.nfs() as c:
            ids = {c.must(c.getattr(fh)).attr.fileid for fh in (open_fh, by_path.fh)}
            assert len(ids) == 1, "the pseudo path and the directory path mount different directories"
        assert srv.alive(), srv.log()
    finally:
        srv.stop()


def test_mnt_from_a_refused_address(binary, tmp_path):
    """With one export for 127.0.0.1 only, a client from 127.0.0.2 gets no
    handle: the connection is closed (as for NFSv4) or MNT says
    MNT3ERR_ACCES."""
    srv = v.ConfigServer(binary, tmp_path / "one", [("export", 'squash = "none"\nclients = ["127.0.0.1/32"]')])
    srv.start()
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.2", 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", srv.port))
        conn = rc.Conn.__new__(rc.Conn)
        conn.sock, conn._stash, conn.calls = sock, {}, []
        with v.Mount(srv.port, conn=conn) as m:
            try:
                r = m.mnt(str(srv.dirs["export"]))
            except (rc.ConnectionClosed, ConnectionResetError, BrokenPipeError):
                r = None
            assert r is None or r.status == M.ACCES, f"MNT from 127.0.0.2: {r!r}"
        with v.Mount(srv.port) as ok:
            mnt_ok(ok, str(srv.dirs["export"]), "MNT from the allowed 127.0.0.1")
        assert srv.alive(), srv.log()
    finally:
        srv.stop()


# --- portmap ------------------------------------------------------------------


@pytest.fixture
def pm(target):
    with target.portmap() as client:
        yield client


def test_portmap_null(pm):
    accepted_void(pm.call_raw(v.PMAP_PROGRAM, 2, 0), "portmap NULL")


def test_getport_of_nfs_and_mount_v3_over_tcp(target, pm):
    assert pm.getport(v.NFS_PROGRAM, 3, IPPROTO_TCP) == target.port
    assert pm.getport(v.MOUNT_PROGRAM, 3, IPPROTO_TCP) == target.mount_port
    assert pm.getport(v.MOUNT_PROGRAM, 1, IPPROTO_TCP) == target.mount_port


def test_getport_of_what_is_not_served_is_0(pm):
    assert pm.getport(200999, 1, IPPROTO_TCP) == 0, "an unknown program"
    # (GETPORT of a registered program in another version is left open:
    # the historical portmapper, and rpcbind, answer the port of any
    # version, and the client then learns the versions from PROG_MISMATCH.)
    assert pm.getport(v.NFS_PROGRAM, 3, IPPROTO_UDP) == 0, "NFSv3 over UDP, which is not served"


def test_portmap_dump_lists_nfs_v3(target, pm):
    maps = pm.dump()
    assert (v.NFS_PROGRAM, 3, IPPROTO_TCP, target.port) in maps, maps
    assert (v.MOUNT_PROGRAM, 3, IPPROTO_TCP, target.mount_port) in maps, maps


def _uaddr_port(uaddr: str) -> int:
    """The port of a universal address "h1.h2.h3.h4.p1.p2" (RFC 5665)."""
    parts = uaddr.rsplit(".", 2)
    return int(parts[1]) * 256 + int(parts[2])


@pytest.mark.parametrize("vers", [3, 4])
def test_rpcbind_versions(target, pm, vers):
    """rpcbind versions 3 and 4 (RFC 1833) are either not served
    (PROG_MISMATCH, low and high 2) or served properly: GETADDR of NFSv3
    over "tcp" gives a universal address with the NFS port."""
    r = pm.call_raw(v.PMAP_PROGRAM, vers, 0)
    if r.accept_stat == rc.PROG_MISMATCH:
        assert r.low <= 2 <= r.high and r.high < vers, r
        return
    accepted_void(r, f"rpcbind v{vers} NULL")
    args = Packer().u32(v.NFS_PROGRAM).u32(3).string("tcp").string("").string("").bytes()
    u = pm.call(v.PMAP_PROGRAM, vers, 3, args, f"rpcbind v{vers} GETADDR")
    uaddr = u.opaque().decode()
    u.done()
    assert uaddr, f"rpcbind v{vers} GETADDR of NFSv3 over tcp answered an empty address (not registered)"
    assert _uaddr_port(uaddr) == target.port, f"GETADDR answered {uaddr!r}"
