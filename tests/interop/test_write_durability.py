"""WRITE FILE_SYNC and COMMIT reach the disk before they are answered, and
what they acknowledged survives a server SIGKILL, over raw RPC.

The export is an ext4 file system on a loop device, so the device's own
count of sectors written (/sys/block/loopN/stat) shows what reached it:
a FILE_SYNC WRITE, or UNSTABLE WRITEs and then COMMIT, have put at least
their bytes on the device by the time they are answered; UNSTABLE WRITEs
alone have not (the kernel writes dirty pages back after 30 s or under
memory pressure, neither of which a few MiB cause). After a SIGKILL the
restarted server has every acknowledged byte, and a new write verifier,
so a client knows to send again what it had not committed. The same holds
for a synchronous COPY (UNSTABLE) and the COMMIT after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import rpcclient as rc
from conftest import LoopMount, MetricsServer, SluiceServer, make_ext4
from rpcclient import Client, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root (and mounts an ext4 image)")

MiB = 1 << 20
CHUNK = 512 << 10  # WRITEs that fit the session's request size
UNSTABLE, FILE_SYNC = 0, 2


class Disk(LoopMount):
    """An ext4 file system on a loop device."""

    def __init__(self, base: Path):
        image = base / "ext4.img"
        make_ext4(image, 256 * MiB)
        (base / "ext4").mkdir()
        super().__init__(image, base / "ext4")

    def sectors_written(self) -> int:
        """Sectors written to the device so far (field 7 of its stat)."""
        return int(Path(f"/sys/block/{Path(self.device).name}/stat").read_text().split()[6])


@pytest.fixture
def disk_server(sluice_binary, tmp_path, request):
    """The server on an ext4 image; WRITEs go through the page cache
    (--direct-write-min 0, the default) and leave their writeback to the
    kernel (--write-behind-min 0), where the probe can tell UNSTABLE from
    stable, unless the test is marked `direct` (--direct-write-min 256K)
    or `behind` (--write-behind-min 256K, the default)."""
    disk = Disk(tmp_path)
    server = None
    direct = request.node.get_closest_marker("direct") is not None
    behind = request.node.get_closest_marker("behind") is not None
    try:
        (disk.mnt / "export").mkdir()
        (tmp_path / "state").mkdir()
        args = ["--grace-time", "0", "--direct-write-min", "256K" if direct else "0",
                "--write-behind-min", "256K" if behind else "0"]
        server = SluiceServer(sluice_binary, disk.mnt / "export", tmp_path / "state", args)
        server.start()
        yield disk, server
    finally:
        if server is not None:
            server.stop()
        disk.close()


def open_new(c: Client, name: str):
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/" + name.encode(), name, create=True), rc.op_getfh()])
    expect_ok(r, f"OPEN {name}")
    return r[2].stateid, r[3].fh


def write_all(c: Client, f, data: bytes, stable: int) -> bytes:
    """WRITEs of `data` from offset 0; the verifier they returned."""
    sid, fh = f
    verf = None
    for off in range(0, len(data), CHUNK):
        r = c.compound([rc.op_putfh(fh), rc.op_write(off, data[off:off + CHUNK], stable, stateid=sid)])
        expect_ok(r, "WRITE")
        assert r[2].count == len(data[off:off + CHUNK])
        assert r[2].committed >= stable, f"asked for {stable}, got {r[2].committed}"
        verf = r[2].verifier if verf is None else verf
        assert r[2].verifier == verf, "the write verifier changed without a restart"
    return verf


def read_all(c: Client, name: str, size: int) -> bytes:
    r = c.compound([rc.op_putrootfh(), rc.op_lookup(name), rc.op_getfh()])
    expect_ok(r, f"LOOKUP {name}")
    fh, out = r[3].fh, b""
    while len(out) < size:
        r = c.compound([rc.op_putfh(fh), rc.op_read(len(out), CHUNK)])
        expect_ok(r, "READ")
        assert r[2].data, "READ came back empty before the end"
        out += r[2].data
    return out


def test_file_sync_write_is_on_the_device_when_answered(disk_server):
    disk, srv = disk_server
    c = Client(srv.port).establish()
    data = os.urandom(4 * MiB)
    before = disk.sectors_written()
    write_all(c, open_new(c, "unstable"), data, UNSTABLE)
    unstable = (disk.sectors_written() - before) * 512
    assert unstable < len(data), f"UNSTABLE WRITEs put {unstable} bytes on the device: the probe cannot tell"
    before = disk.sectors_written()
    write_all(c, open_new(c, "sync"), data, FILE_SYNC)
    synced = (disk.sectors_written() - before) * 512
    assert synced >= len(data), f"FILE_SYNC WRITEs of {len(data)} bytes were answered with {synced} on the device"


@pytest.mark.direct
def test_large_aligned_writes_go_past_the_page_cache(disk_server):
    """With --direct-write-min 256K, 512 KiB WRITEs at aligned offsets are
    written with O_DIRECT: on the device when answered, even UNSTABLE
    ones, and what reads see afterwards, also after unaligned writes over
    them."""
    disk, srv = disk_server
    c = Client(srv.port).establish()
    data = bytearray(os.urandom(4 * MiB))
    before = disk.sectors_written()
    f = open_new(c, "direct")
    write_all(c, f, bytes(data), UNSTABLE)
    direct = (disk.sectors_written() - before) * 512
    assert direct >= len(data), f"4 MiB of aligned UNSTABLE WRITEs put only {direct} bytes on the device"
    # A small unaligned write through the page cache, then a direct one
    # over part of it: each read sees the latest.
    r = c.compound([rc.op_putfh(f[1]), rc.op_write(1000, b"x" * 5000, UNSTABLE, stateid=f[0])])
    expect_ok(r, "small WRITE")
    data[1000:6000] = b"x" * 5000
    assert read_all(c, "direct", len(data)) == bytes(data)
    fresh = os.urandom(CHUNK)
    r = c.compound([rc.op_putfh(f[1]), rc.op_write(0, fresh, UNSTABLE, stateid=f[0])])
    expect_ok(r, "WRITE over the small one")
    data[:CHUNK] = fresh
    assert read_all(c, "direct", len(data)) == bytes(data)
    assert (disk.mnt / "export" / "direct").read_bytes() == bytes(data)


def wait_on_device(disk, before: int, n: int, what: str):
    """Waits until `n` bytes more than `before` sectors were written to
    `disk`; fails if that takes more than 10 s."""
    deadline = time.monotonic() + 10
    while (disk.sectors_written() - before) * 512 < n:
        assert time.monotonic() < deadline, (
            f"{(disk.sectors_written() - before) * 512} of {n} bytes of {what} "
            "on the device 10 s after they were answered: no writeback was started")
        time.sleep(0.05)  # polling interval for the device's counter


@pytest.mark.behind
def test_large_unstable_writes_start_their_own_writeback(disk_server):
    """With --write-behind-min 256K (the default), 512 KiB UNSTABLE WRITEs
    start their writeback as they are answered: the device has them soon
    after, long before the kernel's own writeback would have written them
    (30 s; test_commit_puts_unstable_writes_on_the_device shows that
    without it they are not there). The replies still say UNSTABLE, and
    COMMIT answers with their verifier. Small WRITEs leave writeback to
    the kernel: their pages stay dirty."""
    disk, srv = disk_server
    c = Client(srv.port).establish()
    small = os.urandom(64 << 10)
    before = disk.sectors_written()
    f = open_new(c, "small")
    for off in range(0, len(small), 8 << 10):
        r = c.compound([rc.op_putfh(f[1]), rc.op_write(off, small[off:off + (8 << 10)], UNSTABLE, stateid=f[0])])
        expect_ok(r, "small WRITE")
    data = os.urandom(8 * MiB)
    f = open_new(c, "f")
    verf = write_all(c, f, data, UNSTABLE)
    wait_on_device(disk, before, len(data), "UNSTABLE WRITEs")
    r = c.compound([rc.op_putfh(f[1]), rc.op_commit()])
    expect_ok(r, "COMMIT")
    assert r[2].verifier == verf
    assert (disk.mnt / "export" / "f").read_bytes() == data
    # The small WRITEs' pages are still dirty: written back by nobody yet.
    fd = os.open(disk.mnt / "export" / "small", os.O_RDONLY)
    try:
        assert dirty_pages(fd) == len(small) // 4096, "8 KiB WRITEs started their writeback"
    finally:
        os.close(fd)


@pytest.mark.behind
def test_large_unstable_nfs3_writes_start_their_own_writeback(disk_server):
    """NFSv3 WRITE does the same: 512 KiB UNSTABLE WRITEs are on the
    device within 10 s of being answered, their replies still say
    UNSTABLE, and COMMIT answers with their verifier."""
    import v3client as v

    disk, srv = disk_server
    target = v.sluice_target(srv)
    data = os.urandom(8 * MiB)
    with target.nfs() as c:
        fh = c.must(c.create(target.root_fh(), "v3")).fh
        before = disk.sectors_written()
        verf = None
        for off in range(0, len(data), CHUNK):
            r = c.must(c.write(fh, off, data[off:off + CHUNK], v.UNSTABLE), "WRITE")
            assert (r.count, r.committed) == (CHUNK, v.UNSTABLE), r
            verf = verf or r.verf
            assert r.verf == verf, "the write verifier changed without a restart"
        wait_on_device(disk, before, len(data), "NFSv3 UNSTABLE WRITEs")
        assert c.must(c.commit(fh), "COMMIT").verf == verf
    assert (disk.mnt / "export" / "v3").read_bytes() == data


def cache_state(fd: int, offset: int = 0, length: int = 0) -> tuple[int, int]:
    """(dirty, under writeback) page-cache pages of the file open as
    `fd`, in `length` bytes from `offset` (0: to the end) (cachestat(2))."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rng = (ctypes.c_uint64 * 2)(offset, length)
    out = (ctypes.c_uint64 * 5)()  # cache, dirty, writeback, evicted, recently evicted
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(out), 0) != 0:  # 451: cachestat
        raise OSError(ctypes.get_errno(), "cachestat")
    return out[1], out[2]


def dirty_pages(fd: int) -> int:
    """Dirty page-cache pages of the file open as `fd`."""
    return cache_state(fd)[0]


def test_file_sync_writes_at_once_are_each_clean_when_answered(disk_server):
    """Four clients write FILE_SYNC WRITEs to their own quarters of one
    file at the same time, so that each WRITE's flush runs beside others'
    and beside other WRITEs: every WRITE's range must be neither dirty
    nor under writeback when it is answered."""
    import threading

    disk, srv = disk_server
    clients = [Client(srv.port).establish() for _ in range(4)]
    opened = [open_new(c, "shared") for c in clients]
    path = disk.mnt / "export" / "shared"
    writes = 24
    data = os.urandom(len(clients) * writes * CHUNK)
    fd = os.open(path, os.O_RDONLY)
    failures: list[str] = []

    def writer(i: int):
        c, (sid, fh) = clients[i], opened[i]
        try:
            for k in range(writes):
                off = (i * writes + k) * CHUNK
                r = c.compound([rc.op_putfh(fh), rc.op_write(off, data[off:off + CHUNK], FILE_SYNC, stateid=sid)])
                expect_ok(r, "WRITE")
                assert r[2].committed == FILE_SYNC
                dirty, writeback = cache_state(fd, off, CHUNK)
                assert (dirty, writeback) == (0, 0), \
                    f"WRITE at {off} answered FILE_SYNC with {dirty} dirty and {writeback} pages under writeback"
        except BaseException as e:  # reported below
            failures.append(f"client {i}: {e}")

    try:
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    assert not failures, failures
    assert path.read_bytes() == data


def plain_descriptors_of(pid: int, path: Path, only_reading: bool = True) -> int:
    """Descriptors process `pid` has open of `path` (also once it is
    removed), not O_PATH ones, which only name a file (sluice keeps those
    of the handles it gave out); with `only_reading`, those for reading
    only, through the page cache: not the ones NFSv3 WRITEs (for writing)
    and cold READs (O_DIRECT) keep."""
    O_PATH, O_DIRECT, O_ACCMODE = 0o10000000, 0o40000, 0o3
    skip = O_PATH | O_DIRECT | O_ACCMODE if only_reading else O_PATH
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = next(int(line.split()[1], 8) for line in open(f"/proc/{pid}/fdinfo/{fd}")
                         if line.startswith("flags:"))
        except (OSError, StopIteration):
            continue  # closed meanwhile
        if target in (str(path), f"{path} (deleted)") and not flags & skip:
            n += 1
    return n


def test_stable_writes_of_a_file_flush_through_one_kept_descriptor(sluice_factory):
    """Each stable WRITE flushes through a descriptor no one else flushes
    meanwhile, opened or last flushed before it wrote (so that it learns of
    every failed writeback of its data). One that an earlier stable WRITE
    of the file flushed through serves: NFSv4.1 and NFSv3 FILE_SYNC WRITEs
    one after another open one between them, where each opened its own
    before. After CLOSE it stays open (read-only), and REMOVE closes it at
    once, so that it keeps no removed file's blocks, with the descriptor
    the NFSv3 WRITEs kept."""
    import v3client as v

    srv = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)
    c = Client(srv.port).establish()
    sid, fh = open_new(c, "f")
    # Mounted first, so that the NFSv3 WRITEs follow the NFSv4.1 ones at
    # once (a descriptor unused for 2 s is closed).
    target = v.sluice_target(srv)
    b = target.nfs()
    vfh = b.must(b.lookup(target.root_fh(), "f"), "LOOKUP").fh
    data = bytearray(os.urandom(20 * 8192))
    for k in range(20):
        off = (k * 7 % 20) * 8192
        r = c.compound([rc.op_putfh(fh), rc.op_write(off, bytes(data[off:off + 8192]), FILE_SYNC, stateid=sid)])
        expect_ok(r, "WRITE")
        assert r[2].committed == FILE_SYNC
    assert srv.counter("sluice_flush_witnesses_opened") == 1, \
        "20 FILE_SYNC WRITEs one after another did not share one descriptor to flush through"
    with b:
        for k in range(20):
            piece = os.urandom(4096)
            data[k * 8192:k * 8192 + 4096] = piece
            r = b.must(b.write(vfh, k * 8192, piece, v.FILE_SYNC), "NFSv3 WRITE")
            assert r.committed == v.FILE_SYNC
    assert srv.counter("sluice_flush_witnesses_opened") == 1, "NFSv3 FILE_SYNC WRITEs opened descriptors of their own"
    assert read_all(c, "f", len(data)) == bytes(data)
    expect_ok(c.compound([rc.op_putfh(fh), rc.op_close(sid)]), "CLOSE")
    path = srv.export / "f"
    assert plain_descriptors_of(srv.proc.pid, path) == 1, "the descriptor was not kept after CLOSE"
    expect_ok(c.compound([rc.op_putrootfh(), rc.op_remove("f")]), "REMOVE")
    assert plain_descriptors_of(srv.proc.pid, path, only_reading=False) == 0, \
        "REMOVE left a descriptor of the file open"


def test_kept_descriptors_are_closed_when_idle(sluice_factory):
    """A descriptor kept for stable WRITEs is closed once no stable WRITE
    of its file used it for 2 s, also when the file was removed by someone
    other than a client (whose blocks it would keep)."""
    srv = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)
    c = Client(srv.port).establish()
    sid, fh = open_new(c, "f")
    expect_ok(c.compound([rc.op_putfh(fh), rc.op_write(0, b"x" * 8192, FILE_SYNC, stateid=sid)]), "WRITE")
    expect_ok(c.compound([rc.op_putfh(fh), rc.op_close(sid)]), "CLOSE")
    path = srv.export / "f"
    assert plain_descriptors_of(srv.proc.pid, path) == 1
    path.unlink()
    deadline = time.monotonic() + 10
    while plain_descriptors_of(srv.proc.pid, path) > 0:
        assert time.monotonic() < deadline, "the kept descriptor of a removed file is still open after 10 s"
        time.sleep(0.1)


def test_commit_puts_unstable_writes_on_the_device(disk_server):
    disk, srv = disk_server
    c = Client(srv.port).establish()
    data = os.urandom(4 * MiB)
    before = disk.sectors_written()
    f = open_new(c, "f")
    verf = write_all(c, f, data, UNSTABLE)
    assert (disk.sectors_written() - before) * 512 < len(data), "UNSTABLE WRITEs already on the device"
    r = c.compound([rc.op_putfh(f[1]), rc.op_commit()])
    expect_ok(r, "COMMIT")
    assert r[2].verifier == verf
    committed = (disk.sectors_written() - before) * 512
    assert committed >= len(data), f"COMMIT of {len(data)} bytes answered with {committed} on the device"


def test_sigterm_puts_unstable_writes_on_the_device(disk_server):
    """A server told to stop (SIGTERM) flushes its exports' file systems
    before it exits: UNSTABLE WRITEs nobody committed are on the device
    afterwards."""
    disk, srv = disk_server
    c = Client(srv.port).establish()
    data = os.urandom(4 * MiB)
    before = disk.sectors_written()
    write_all(c, open_new(c, "f"), data, UNSTABLE)
    assert (disk.sectors_written() - before) * 512 < len(data), "UNSTABLE WRITEs already on the device"
    c.close()
    srv.stop(signal.SIGTERM)
    flushed = (disk.sectors_written() - before) * 512
    log = srv.log_path.read_text(errors="replace")
    assert "could not flush" not in log, f"the server could not flush its export:\n{log[-2000:]}"
    assert flushed >= len(data), f"{len(data)} bytes of UNSTABLE WRITEs, {flushed} on the device after SIGTERM"


@pytest.mark.parametrize("writeback", ["kernel", pytest.param("behind", marks=pytest.mark.behind)])
def test_acknowledged_data_survives_sigkill(disk_server, writeback):
    """What FILE_SYNC answered and COMMIT acknowledged survives a SIGKILL,
    with the kernel's writeback and with write-behind."""
    disk, srv = disk_server
    c = Client(srv.port).establish()
    synced, committed = os.urandom(3 * MiB + 17), os.urandom(2 * MiB + 5)
    verf = write_all(c, open_new(c, "synced"), synced, FILE_SYNC)
    f = open_new(c, "committed")
    assert write_all(c, f, committed, UNSTABLE) == verf
    expect_ok(c.compound([rc.op_putfh(f[1]), rc.op_commit()]), "COMMIT")
    srv.restart(signal.SIGKILL)
    c2 = Client(srv.port).establish()
    assert read_all(c2, "synced", len(synced)) == synced, "FILE_SYNC data lost by a SIGKILL"
    assert read_all(c2, "committed", len(committed)) == committed, "committed data lost by a SIGKILL"
    g = open_new(c2, "after")
    assert write_all(c2, g, b"x", UNSTABLE) != verf, "the write verifier did not change with the restart"


def test_copy_is_on_the_device_after_commit_and_survives_sigkill(disk_server):
    """A synchronous COPY is UNSTABLE: COMMIT on the destination puts the
    copy on the device, and then it survives a SIGKILL."""
    disk, srv = disk_server
    c = Client(srv.port).establish()
    data = os.urandom(4 * MiB)
    src = open_new(c, "src")
    write_all(c, src, data, FILE_SYNC)
    dst = open_new(c, "dst")
    before = disk.sectors_written()
    r = c.compound([rc.op_putfh(src[1]), rc.op_savefh(), rc.op_putfh(dst[1]),
                    rc.op_copy(src[0], dst[0], 0, 0, len(data))], minor=2)
    expect_ok(r, "COPY")
    assert (r[4].count, r[4].committed) == (len(data), UNSTABLE)
    copied = (disk.sectors_written() - before) * 512
    assert copied < len(data), f"the UNSTABLE copy already put {copied} bytes on the device: the probe cannot tell"
    r = c.compound([rc.op_putfh(dst[1]), rc.op_commit()])
    expect_ok(r, "COMMIT")
    committed = (disk.sectors_written() - before) * 512
    assert committed >= len(data), f"COMMIT of a {len(data)}-byte copy answered with {committed} on the device"
    srv.restart(signal.SIGKILL)
    c2 = Client(srv.port).establish()
    assert read_all(c2, "dst", len(data)) == data, "the committed copy was lost by a SIGKILL"


class FailingDisk:
    """An ext4 file system on a loop device whose backing file lies in a
    tmpfs smaller than the device: once the tmpfs is full, the device
    fails writes, and the kernel's writeback of the file system's pages
    fails (EIO, then the journal aborts)."""

    def __init__(self, base: Path, room: int, size: int):
        self.tmpfs = base / "tmpfs"
        self.tmpfs.mkdir()
        self.image = self.tmpfs / "ext4.img"
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(self.tmpfs)], check=True)
        self.mnt = base / "ext4"
        self.mnt.mkdir()
        self.device = None
        try:
            with open(self.image, "wb") as f:
                f.truncate(size)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(self.image)],
                           check=True)
            self.device = subprocess.run(["losetup", "--find", "--show", str(self.image)], check=True,
                                         capture_output=True, text=True).stdout.strip()
            subprocess.run(["mount", self.device, str(self.mnt)], check=True)
        except BaseException:
            self.close()
            raise

    def close(self):
        """Unmounts everything, also after a failure half-way (the loop
        device may be let go of lazily, and the tmpfs busy until then)."""
        if self.device is not None:
            subprocess.run(["umount", str(self.mnt)], check=False)
            subprocess.run(["losetup", "--detach", self.device], check=False)
            self.device = None
        for _ in range(50):
            if subprocess.run(["umount", str(self.tmpfs)], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        subprocess.run(["umount", "--lazy", str(self.tmpfs)], check=True)


@contextlib.contextmanager
def failing_export(binary: Path, base: Path, room: int):
    """A server (with metrics) exporting a FailingDisk of 512 MiB with
    `room` bytes behind it: yields (disk, server, its NFSv3 target)."""
    import v3client as v

    disk = FailingDisk(base, room=room, size=512 * MiB)
    server = None
    try:
        (disk.mnt / "export").mkdir()
        (base / "state").mkdir()
        server = MetricsServer(binary, disk.mnt / "export", base / "state", ["--grace-time", "0"])
        server.start()
        yield disk, server, v.sluice_target(server)
    finally:
        try:
            if server is not None:
                server.stop()
        finally:
            disk.close()


def test_a_commit_after_lost_writeback_does_not_answer_the_old_verifier(sluice_binary, tmp_path):
    """The kernel reports a failed writeback once to each open file that
    was open before it, and not to files opened after someone saw it.
    Client B (NFSv3) writes 64 KiB UNSTABLE far into a file. Client A
    (NFSv4.1) then writes more to it than the device can still take; its
    COMMIT writes back the file's pages, B's among them, and fails. A
    COMMITs again until one succeeds: the kernel has nothing left to say.
    Those COMMITs, and B's, which flushes through a descriptor opened
    after that, must answer an error or a verifier other than the one
    their WRITEs got, so that the clients send their data again (RFC 1813
    section 3.3.21; RFC 8881 section 18.32.3). Before sluice changed its
    verifier on such failures, both answered the old one."""
    import v3client as v

    with failing_export(sluice_binary, tmp_path, 48 * MiB) as (disk, server, target):
        with target.nfs() as b:
            fh = b.must(b.create(target.root_fh(), "shared")).fh
            b_verf = b.must(b.write(fh, 400 * MiB, os.urandom(64 << 10), v.UNSTABLE), "B's WRITE").verf

            a = Client(server.port).establish()
            sid, afh = open_new(a, "shared")
            written, a_verf = 0, None
            chunk = os.urandom(CHUNK)
            while written < 96 * MiB:
                r = a.compound([rc.op_putfh(afh), rc.op_write(written, chunk, UNSTABLE, stateid=sid)])
                if r.status != 0:
                    break  # the file system gave up already (EIO, or read-only)
                a_verf = a_verf or r[2].verifier
                written += CHUNK
            assert a_verf is not None, "none of A's WRITEs went through"
            commits = []
            for _ in range(5):
                r = a.compound([rc.op_putfh(afh), rc.op_commit()])
                commits.append(r.status)
                if r.status == 0:
                    assert r[2].verifier != a_verf, \
                        f"A's COMMIT answered its WRITEs' verifier after the file's writeback failed ({commits})"
                    break
            # (Unless a WRITE failed already, the first COMMIT fails.)
            assert commits[0] != 0 or written < 96 * MiB, \
                f"A's {written} bytes were committed on a device with room for 48 MiB"
            assert 0 in commits, f"A's COMMITs kept failing ({commits}): the test checked nothing"

            c = b.commit(fh)
            assert not (c.ok and c.verf == b_verf), \
                "B's COMMIT answered its WRITE's verifier after the file's writeback failed"
        assert server.counter("sluice_write_verifier_changes") >= 1


def test_a_file_sync_write_through_a_kept_descriptor_learns_of_its_failed_writeback(sluice_binary, tmp_path):
    """A FILE_SYNC WRITE flushes through the descriptor an earlier one of
    the file kept: when the device can no longer take its data, it must
    fail, not answer FILE_SYNC. The device is a loop device whose image
    lies in a small tmpfs; the test fills the tmpfs itself between the
    two WRITEs."""
    import errno

    with failing_export(sluice_binary, tmp_path, 48 * MiB) as (disk, server, target):
        c = Client(server.port).establish()
        sid, fh = open_new(c, "synced")
        # Blocks the file system gives the file now, where the device has
        # none yet: a WRITE there needs no allocation, only writeback.
        fd = os.open(disk.mnt / "export" / "synced", os.O_WRONLY)
        try:
            os.posix_fallocate(fd, 0, 32 * MiB)
        finally:
            os.close(fd)
        expect_ok(c.compound([rc.op_putfh(fh), rc.op_write(0, os.urandom(8192), FILE_SYNC, stateid=sid)]), "WRITE")
        assert server.counter("sluice_flush_witnesses_opened") == 1
        ballast = os.open(disk.tmpfs / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            chunk = b"\xff" * MiB
            while True:
                os.write(ballast, chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        finally:
            os.close(ballast)
        r = c.compound([rc.op_putfh(fh), rc.op_write(16 * MiB, os.urandom(CHUNK), FILE_SYNC, stateid=sid)])
        assert r.status != 0, "a FILE_SYNC WRITE was answered after its data's writeback could not succeed"
        assert server.counter("sluice_flush_witnesses_opened") == 1, \
            "the WRITE did not flush through the kept descriptor: the test checked something else"
