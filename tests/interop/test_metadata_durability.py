"""Names made, removed, renamed and linked, and attributes set, are on the
disk when the op that changed them is answered (exports with `sync`, the
default), over raw RPC with NFSv4.1 and NFSv3.

The export is an ext4 file system on a loop device, mounted with
commit=600: the kernel then commits its journal only when something asks
(an fsync, a sync), not every 5 seconds, so a change nobody synced stays in
memory for the length of the test. Right after the last op is answered the
test copies the file system's image, which is what a crash of the whole
machine at that instant would leave on the disk, replays the copy's
journal (e2fsck, as a mount after the crash would) and lists it with
debugfs: every change the server answered must be there.

Without the server's syncs (`--async`) the same copy holds none of the
changes; that is not asserted here, since a `sync` run by any other
process on the machine meanwhile would commit them.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import rpcclient as rc
import v3client as v3
from conftest import LoopMount, SluiceServer, make_ext4
from rpcclient import Client, Packer, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root (and mounts an ext4 image)")

MiB = 1 << 20
OP_LINK = 11
OP_ALLOCATE = 59
NF4DIR, NF4LNK = 2, 5
FATTR4_MODE = 33


class Disk(LoopMount):
    """An ext4 file system in `base`/ext4.img on a loop device, mounted on
    `base`/ext4 with a journal the kernel commits only when asked."""

    def __init__(self, base: Path):
        self.image = base / "ext4.img"
        make_ext4(self.image, 64 * MiB)
        (base / "ext4").mkdir()
        super().__init__(self.image, base / "ext4", "commit=600")

    def after_crash(self, copy: Path, directory: str) -> dict[str, tuple[int, int, int]]:
        """What the disk holds in `directory` now: the image copied as it is,
        its journal replayed; each name with its inode number, mode and
        size."""
        shutil.copyfile(self.image, copy)
        # 0: nothing to fix, 1: fixed (the journal replayed).
        r = subprocess.run(["e2fsck", "-y", "-E", "journal_only", str(copy)], capture_output=True, text=True)
        assert r.returncode in (0, 1), f"e2fsck of the copy: {r.returncode}\n{r.stdout}{r.stderr}"
        out = subprocess.run(["debugfs", "-R", f"ls -p {directory}", str(copy)], check=True,
                             capture_output=True, text=True).stdout
        entries = {}
        for line in out.splitlines():
            # /inode/mode/uid/gid/name/size/
            parts = line.strip().split("/")
            if len(parts) >= 7 and parts[5] not in (".", ".."):
                entries[parts[5]] = (int(parts[1]), int(parts[2], 8), int(parts[6] or 0))
        assert entries, f"debugfs listed nothing in {directory}:\n{out}"
        return entries


@pytest.fixture
def disk_export(tmp_path):
    """The disk, with an export directory holding `a` (to rename), `gone`
    (to remove), `keep` (to link and chmod), `olddir` (to remove) and the
    empty `alloc` (to ALLOCATE), all on the disk before the server
    starts."""
    disk = Disk(tmp_path)
    try:
        ex = disk.mnt / "export"
        ex.mkdir()
        (ex / "alloc").write_bytes(b"")
        for name in ("a", "gone", "keep"):
            (ex / name).write_bytes(b"x")
            (ex / name).chmod(0o644)
        (ex / "olddir").mkdir()
        os.sync()
        yield disk, ex
    finally:
        disk.close()


def start(binary: Path, export: Path, state: Path, *args) -> SluiceServer:
    state.mkdir()
    server = SluiceServer(binary, export, state, ["--grace-time", "0", *args])
    server.start()
    return server


def expected_after(entries: dict[str, tuple[int, int, int]], ino_keep: int):
    names = set(entries)
    assert {"new", "newdir", "b", "keep", "keep2", "sym"} <= names, f"answered changes lost in a crash: {sorted(names)}"
    assert not {"a", "gone", "olddir"} & names, f"removed or renamed names back after a crash: {sorted(names)}"
    assert entries["keep2"][0] == ino_keep, "keep2 is not a link of keep"
    assert entries["keep"][1] & 0o7777 == 0o600, f"keep's mode after a crash: {oct(entries['keep'][1])}"
    assert entries["newdir"][1] & 0o170000 == 0o040000
    assert entries["sym"][1] & 0o170000 == 0o120000


def test_nfs4_changes_are_on_the_disk_when_answered(sluice_binary, tmp_path, disk_export):
    disk, ex = disk_export
    ino_keep = (ex / "keep").stat().st_ino
    server = start(sluice_binary, ex, tmp_path / "state")
    try:
        c = Client(server.port)
        c.establish()
        root = rc.op_putrootfh()
        r = c.compound([root, rc.op_open(c.owner + b"/new", "new", create=True), rc.op_getfh()])
        expect_ok(r, "OPEN create new")
        expect_ok(c.compound([rc.op_putfh(r.results[-1].fh), rc.op_close(r.results[-2].stateid)]), "CLOSE new")
        mode = Packer().bitmap([0, 1 << (FATTR4_MODE - 32)]).opaque(struct.pack(">I", 0o755)).bytes()
        expect_ok(c.compound([root, (rc.Op.CREATE, Packer().u32(NF4DIR).string("newdir").raw(mode).bytes())]), "CREATE newdir")
        no_attrs = Packer().bitmap([]).opaque(b"").bytes()
        expect_ok(c.compound([root, (rc.Op.CREATE, Packer().u32(NF4LNK).string("keep").string("sym").raw(no_attrs).bytes())]),
                  "CREATE symlink sym")
        expect_ok(c.compound([root, rc.op_savefh(), root, rc.op_rename("a", "b")]), "RENAME a b")
        expect_ok(c.compound([root, rc.op_remove("gone")]), "REMOVE gone")
        expect_ok(c.compound([root, rc.op_remove("olddir")]), "REMOVE olddir")
        expect_ok(c.compound([root, rc.op_lookup("keep"), rc.op_savefh(), root, (OP_LINK, Packer().string("keep2").bytes())]),
                  "LINK keep keep2")
        chmod = Packer().fixed(rc.ANONYMOUS_STATEID).bytes() + Packer().bitmap([0, 1 << (FATTR4_MODE - 32)]).opaque(struct.pack(">I", 0o600)).bytes()
        expect_ok(c.compound([root, rc.op_lookup("keep"), (rc.Op.SETATTR, chmod)]), "SETATTR keep 0600")
        alloc = Packer().fixed(rc.ANONYMOUS_STATEID).u64(0).u64(MiB).bytes()
        expect_ok(c.compound([root, rc.op_lookup("alloc"), (OP_ALLOCATE, alloc)], minor=2), "ALLOCATE alloc 1 MiB")
        # The crash: the disk as it is right after the last answer.
        entries = disk.after_crash(tmp_path / "copy.img", "/export")
        c.close()
    finally:
        server.stop()
    expected_after(entries, ino_keep)
    assert entries["alloc"][2] == MiB, f"alloc's size after a crash: {entries['alloc'][2]}"


def test_nfs3_changes_are_on_the_disk_when_answered(sluice_binary, tmp_path, disk_export):
    disk, ex = disk_export
    ino_keep = (ex / "keep").stat().st_ino
    server = start(sluice_binary, ex, tmp_path / "state")
    try:
        t = v3.sluice_target(server)
        root = t.root_fh()
        with t.nfs() as n:
            def ok(r, what):
                assert r.status == v3.E.OK, f"{what}: {r!r}"
                return r

            ok(n.create(root, "new", attrs=v3.sattr3(mode=0o644)), "CREATE new")
            ok(n.mkdir(root, "newdir", attrs=v3.sattr3(mode=0o755)), "MKDIR newdir")
            ok(n.symlink(root, "sym", "keep"), "SYMLINK sym")
            ok(n.rename(root, "a", root, "b"), "RENAME a b")
            ok(n.remove(root, "gone"), "REMOVE gone")
            ok(n.rmdir(root, "olddir"), "RMDIR olddir")
            keep = ok(n.lookup(root, "keep"), "LOOKUP keep").fh
            ok(n.link(keep, root, "keep2"), "LINK keep keep2")
            ok(n.setattr(keep, v3.sattr3(mode=0o600)), "SETATTR keep 0600")
            # The crash: the disk as it is right after the last answer.
            entries = disk.after_crash(tmp_path / "copy.img", "/export")
    finally:
        server.stop()
    expected_after(entries, ino_keep)


@pytest.mark.parametrize("flag, syncs", [((), True), (("--async",), False)])
def test_async_answers_without_syncing(sluice_factory, flag, syncs):
    """`--async` (config: `sync = false`) answers first: the server then
    syncs nothing for the ops that change names and attributes, where by
    default each syncs (counted in sluice_metadata_commits)."""
    server = sluice_factory(*flag, metrics=True, root_squash=False)
    (server.export / "gone").write_bytes(b"x")
    t = v3.sluice_target(server)
    root = t.root_fh()
    with t.nfs() as n:
        for what, r in [("MKDIR d", n.mkdir(root, "d")), ("RENAME d e", n.rename(root, "d", root, "e")),
                        ("REMOVE gone", n.remove(root, "gone")), ("RMDIR e", n.rmdir(root, "e"))]:
            assert r.status == v3.E.OK, f"{what}: {r!r}"
    commits = server.counter("sluice_metadata_commits")
    if syncs:
        assert commits >= 4, f"{commits} syncs for 4 changes"
    else:
        assert commits == 0, f"--async synced {commits} times"
    assert not (server.export / "e").exists() and not (server.export / "gone").exists()
