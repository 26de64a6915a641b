"""File systems to measure on: a fresh ext4, xfs or btrfs on a loop device
backed by an image file (`losetup --direct-io=on`, so the host's page cache
does not hide the device), and the page-cache controls for cold runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import wire
from .util import CommandError, GiB, MiB, Teardown, log, run, wait_until

SCRATCH_PARENT = Path("/var/tmp")
SCRATCH_PREFIX = "sluice-bench-"

MKFS = {
    # Initialise inode tables and the journal now, not in a background thread
    # that would write during the measurements.
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}
MOUNT_OPTIONS = "noatime"


def make_scratch(teardown: Teardown) -> Path:
    """A fresh directory under /var/tmp for images, mounts, configs and logs,
    removed at teardown. It names its owner, so that the leftovers of a run
    that was killed outright (SIGKILL, power loss) can be found later."""
    path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SCRATCH_PARENT))
    (path / "owner.pid").write_text(f"{os.getpid()}\n")
    teardown.push(f"remove {path}", lambda: shutil.rmtree(path, ignore_errors=True))
    return path


def owner_pid(path: Path) -> int:
    """The PID of the harness that made scratch directory `path` (0 if unknown)."""
    try:
        return int((path / "owner.pid").read_text())
    except (OSError, ValueError):
        return 0


def stale_scratch() -> list[Path]:
    """Scratch directories whose harness process is gone."""
    stale = []
    for path in SCRATCH_PARENT.glob(SCRATCH_PREFIX + "*"):
        pid = owner_pid(path)
        if pid <= 0 or not Path(f"/proc/{pid}").exists():
            stale.append(path)
    return stale


def clean_stale(path: Path) -> None:
    """Undoes what a killed run left in `path`: stops its servers (only
    sluice and ganesha.nfsd processes whose command line names this
    directory, and the rpcbind it started, by the PID it wrote there),
    deletes its network namespace and veth pair (named after the same
    PID), unmounts, detaches loop devices and removes the directory."""
    prefix = str(path) + "/"
    stop_recorded(path / RPCBIND_PID, "rpcbind")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        cmdline = " ".join(argv)
        if Path(argv[0]).name in ("sluice", "ganesha.nfsd") and prefix in cmdline:
            log(f"stopping leftover process {proc.name}: {cmdline[:120]}")
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
    if pid := owner_pid(path):
        wire.remove_leftovers(pid)
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        mountpoint = line.split()[1]
        if mountpoint.startswith(prefix):
            unmount(Path(mountpoint))
    loops = run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], check=False).stdout
    for line in loops.splitlines():
        name, _, back = line.strip().partition(" ")
        if back.strip().startswith(prefix):
            run(["losetup", "--detach", name], check=False)
    shutil.rmtree(path, ignore_errors=True)
    log(f"removed leftovers in {path}")


# Where a run that started rpcbind keeps its PID, in the scratch directory.
RPCBIND_PID = "rpcbind.pid"


def stop_recorded(pid_file: Path, name: str) -> None:
    """SIGKILL for the process whose PID `pid_file` holds, if that process is
    still `name` (not another that reused the PID)."""
    try:
        pid = int(pid_file.read_text())
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except (OSError, ValueError):
        return
    if Path(argv0).name == name:
        log(f"stopping leftover {name} (pid {pid})")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def loop_devices_available() -> bool:
    if not os.path.exists("/dev/loop-control") or shutil.which("losetup") is None:
        return False
    return subprocess.run(["losetup", "--find"], capture_output=True).returncode == 0


@dataclass
class TestFs:
    """A mounted file system the servers export."""

    name: str  # ext4, xfs, btrfs, or host-<type> without loop devices
    mountpoint: Path
    device: str | None = None
    image: Path | None = None
    details: dict = field(default_factory=dict)

    def drop_caches(self) -> None:
        """Cold cache: write back, drop the page, dentry and inode caches, and
        the loop device's buffer cache."""
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        if self.device:
            run(["blockdev", "--flushbufs", self.device])

    def read_through(self, name: str) -> None:
        """Warm cache without a client: reads the file once through the
        page cache, as the server would."""
        buf = bytearray(MiB)
        with open(self.mountpoint / name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def image_size_for(data_bytes: int) -> int:
    """Image size for `data_bytes` of file data, with room for metadata (btrfs
    keeps its metadata twice) rounded up to whole MiB."""
    size = data_bytes + data_bytes // 8 + GiB // 2
    return -(-size // MiB) * MiB


def fill_image(image: Path, size: int) -> None:
    """Writes the whole image with zeros (and syncs it), so that its blocks
    exist on the host before any measurement. A sparse image makes the
    first writer onto fresh image blocks pay for the host's allocation:
    measured here, the first of two servers writing 1 GiB after fio's
    direct write got 460-680 MB/s and the second 1,400-2,000."""
    chunk = bytes(64 * MiB)
    started = time.monotonic()
    with open(image, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    log(f"{image.name}: {size // MiB} MiB written with zeros in {time.monotonic() - started:.1f} s")


def create_loop_fs(fs: str, scratch: Path, data_bytes: int, teardown: Teardown) -> TestFs:
    """Image file -> loop device (direct I/O) -> mkfs -> mount at scratch/fs."""
    image = scratch / f"{fs}.img"
    size = image_size_for(data_bytes)
    teardown.push(f"remove {image}", lambda: image.unlink(missing_ok=True))
    fill_image(image, size)

    device = run(["losetup", "--find", "--show", "--direct-io=on", str(image)]).stdout.strip()
    teardown.push(f"detach {device}", lambda: run(["losetup", "--detach", device]))
    dio = Path(f"/sys/block/{Path(device).name}/loop/dio").read_text().strip()
    if dio != "1":
        log(f"warning: {device} does not use direct I/O (dio={dio}); the host page cache may serve reads")

    run([*MKFS[fs], device], timeout=600)
    mountpoint = scratch / "export"
    mountpoint.mkdir()
    run(["mount", "-t", fs, "-o", MOUNT_OPTIONS, device, str(mountpoint)])
    teardown.push(f"unmount {mountpoint}", lambda: unmount(mountpoint))
    log(
        f"{fs}: {size // MiB} MiB image on {device} (direct I/O {'on' if dio == '1' else 'off'}) mounted at {mountpoint}"
    )
    return TestFs(
        name=fs,
        mountpoint=mountpoint,
        device=device,
        image=image,
        details={
            "device": device,
            "image_bytes": size,
            "loop_direct_io": dio == "1",
            "mkfs": " ".join(MKFS[fs]),
            "mount_options": mount_options(mountpoint),
            "backing_fs": fs_type(scratch),
        },
    )


def host_dir_fs(scratch: Path) -> TestFs:
    """Without loop devices (containers): a directory on the scratch file system."""
    path = scratch / "export"
    path.mkdir()
    kind = fs_type(scratch)
    log(f"loop devices are unavailable: measuring on a directory of the host's {kind} file system")
    return TestFs(name=f"host-{kind}", mountpoint=path, details={"note": "no loop device available"})


def unmount(mountpoint: Path) -> None:
    """Unmounts, retrying while the mount is briefly busy (a server that was
    just killed may still hold files); lazily as the last resort."""

    def try_umount() -> bool:
        return subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0

    if not wait_until(try_umount, timeout=30, interval=0.2):
        log(f"warning: {mountpoint} stays busy; detaching it lazily")
        run(["umount", "--lazy", str(mountpoint)])


def fs_type(path: Path) -> str:
    try:
        return run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)]).stdout.strip()
    except CommandError:
        return "unknown"


def mount_options(path: Path) -> str:
    try:
        return run(["findmnt", "-n", "-o", "OPTIONS", "--target", str(path)]).stdout.strip()
    except CommandError:
        return ""
