"""CLONE (RFC 7862 section 15.13), over raw RPC.

On a file system with shared extents (xfs made with reflink, and btrfs,
each on a loop device here) CLONE makes the destination range share the
source's extents: the bytes are the same and `filefrag -v` marks the extents
"shared". On ext4 it answers NFS4ERR_NOTSUPP, which the Linux client
turns into EOPNOTSUPP for `cp --reflink=always`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import rpcclient as rc
from conftest import SluiceServer
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

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root (and mounts file system images)")

OP_CLONE = 71
CLONE_BLKSIZE = 77
MiB = 1 << 20


def op_clone(src_sid: bytes, dst_sid: bytes, src_off: int, dst_off: int, count: int):
    return (OP_CLONE, Packer().fixed(src_sid).fixed(dst_sid).u64(src_off).u64(dst_off).u64(count).bytes())


MKFS = {"xfs": ["mkfs.xfs", "-q", "-m", "reflink=1"], "btrfs": ["mkfs.btrfs", "-q"]}
PACKAGE = {"xfs": "xfsprogs", "btrfs": "btrfs-progs"}


@pytest.fixture(params=["xfs", "btrfs"])
def reflink_server(sluice_binary, tmp_path, request):
    """sluice exporting a fresh file system with shared extents (xfs with
    reflink, btrfs) on a loop device."""
    fs = request.param
    assert shutil.which(MKFS[fs][0]), f"{MKFS[fs][0]} is missing ({PACKAGE[fs]}; scripts/setup installs it)"
    image, mnt = tmp_path / f"{fs}.img", tmp_path / fs
    with open(image, "wb") as f:
        f.truncate(512 * MiB)
    subprocess.run([*MKFS[fs], str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    server = None
    try:
        (mnt / "export").mkdir()
        (tmp_path / "state").mkdir()
        server = SluiceServer(sluice_binary, mnt / "export", tmp_path / "state", ["--grace-time", "0"])
        server.start()
        yield server
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["umount", str(mnt)], check=True)


def open_file(c: Client, name: str, access: int):
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/" + name.encode(), name, access=access), rc.op_getfh()])
    expect_ok(r, f"OPEN {name}")
    return r[2].stateid, r[3].fh


def clone(c: Client, src_fh, src_sid, dst_fh, dst_sid, src_off=0, dst_off=0, count=0):
    return c.compound([rc.op_putfh(src_fh), rc.op_savefh(), rc.op_putfh(dst_fh),
                       op_clone(src_sid, dst_sid, src_off, dst_off, count)])


def shared_extents(path) -> int:
    """Extents of `path` that filefrag -v marks shared."""
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if "shared" in line)


def test_clone_shares_extents(reflink_server):
    src = os.urandom(4 * MiB)
    (reflink_server.export / "src").write_bytes(src)
    (reflink_server.export / "dst").write_bytes(b"")
    c = Client(reflink_server.port).establish()
    ssid, sfh = open_file(c, "src", OPEN4_SHARE_ACCESS_READ)
    dsid, dfh = open_file(c, "dst", OPEN4_SHARE_ACCESS_BOTH)
    r = expect_ok(c.compound([rc.op_putfh(dfh), rc.op_getattr((0, 0, 1 << (CLONE_BLKSIZE - 64)))]), "GETATTR clone_blksize")
    blk = int.from_bytes(r[2].attrvals, "big")
    assert blk == 4096, f"clone_blksize {blk}"
    expect_ok(clone(c, sfh, ssid, dfh, dsid), "CLONE of the whole file (count 0)")
    dst = reflink_server.export / "dst"
    assert dst.read_bytes() == src
    assert shared_extents(dst) >= 1 and shared_extents(reflink_server.export / "src") >= 1, (
        subprocess.run(["filefrag", "-v", str(dst)], capture_output=True, text=True).stdout)
    # A block-aligned part, into the middle of another file.
    (reflink_server.export / "mid").write_bytes(bytes(2 * MiB))
    msid, mfh = open_file(c, "mid", OPEN4_SHARE_ACCESS_BOTH)
    expect_ok(clone(c, sfh, ssid, mfh, msid, src_off=blk, dst_off=2 * blk, count=8 * blk), "CLONE of 8 blocks")
    mid = (reflink_server.export / "mid").read_bytes()
    assert mid[2 * blk:10 * blk] == src[blk:9 * blk] and mid[:2 * blk] == bytes(2 * blk) and len(mid) == 2 * MiB
    # Not aligned to the block size: the file system refuses.
    expect(clone(c, sfh, ssid, mfh, msid, src_off=1, dst_off=0, count=blk), St.INVAL, "CLONE of an unaligned range")


def test_clone_checks_ranges_and_stateids(reflink_server):
    (reflink_server.export / "src").write_bytes(os.urandom(MiB))
    (reflink_server.export / "dst").write_bytes(b"")
    c = Client(reflink_server.port).establish()
    ssid, sfh = open_file(c, "src", OPEN4_SHARE_ACCESS_READ)
    dsid, dfh = open_file(c, "dst", OPEN4_SHARE_ACCESS_BOTH)
    expect(clone(c, sfh, ssid, dfh, dsid, src_off=0, count=2 * MiB), St.INVAL, "a source range past the end")
    expect(clone(c, sfh, ssid, dfh, dsid, src_off=2 * MiB), St.INVAL, "a source offset past the end, count 0")
    expect(clone(c, sfh, ssid, sfh, ssid, src_off=0, dst_off=4096, count=8192), St.OPENMODE, "into a file opened for reading")
    expect(clone(c, dfh, dsid, dfh, dsid, src_off=0, dst_off=0, count=0), St.OK, "an empty file onto itself, count 0")
    # The source's stateid must be one of the source.
    expect(clone(c, sfh, dsid, dfh, dsid), St.BAD_STATEID, "the destination's stateid for the source")
    # Overlapping ranges of one file.
    (reflink_server.export / "one").write_bytes(os.urandom(MiB))
    osid, ofh = open_file(c, "one", OPEN4_SHARE_ACCESS_BOTH)
    expect(clone(c, ofh, osid, ofh, osid, src_off=0, dst_off=4096, count=8192), St.INVAL, "overlapping ranges of one file")
    expect_ok(clone(c, ofh, osid, ofh, osid, src_off=0, dst_off=65536, count=8192), "two ranges of one file")
    # Without a saved filehandle.
    r = c.compound([rc.op_putfh(dfh), op_clone(ssid, dsid, 0, 0, 0)])
    expect(r, St.NOFILEHANDLE, "CLONE without a saved filehandle")
    # The anonymous stateid reads and writes as the caller.
    expect_ok(clone(c, sfh, ANONYMOUS_STATEID, dfh, ANONYMOUS_STATEID), "CLONE with anonymous stateids")
    assert (reflink_server.export / "dst").read_bytes() == (reflink_server.export / "src").read_bytes()


def test_clone_on_ext4_is_notsupp(sluice_factory):
    srv = sluice_factory("--grace-time", 0, root_squash=False)
    (srv.export / "src").write_bytes(os.urandom(MiB))
    (srv.export / "dst").write_bytes(b"")
    c = Client(srv.port).establish()
    ssid, sfh = open_file(c, "src", OPEN4_SHARE_ACCESS_READ)
    dsid, dfh = open_file(c, "dst", OPEN4_SHARE_ACCESS_BOTH)
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(srv.export)], capture_output=True, text=True).stdout.strip()
    r = clone(c, sfh, ssid, dfh, dsid)
    if kind in ("xfs", "btrfs"):
        expect_ok(r, f"CLONE on {kind}")
    else:
        expect(r, St.NOTSUPP, f"CLONE on {kind}, which has no shared extents")
        assert (srv.export / "dst").read_bytes() == b""
