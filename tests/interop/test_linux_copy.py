"""CLONE and COPY with the Linux kernel NFS client (6.12, NFS 4.2), in a
QEMU guest.

The server exports an xfs file system made with reflink on a loop device
as /x and an ext4 directory as /e (one `sluice serve --config`). The
guest runs tests/vm/guest/copy.sh:

- `cp --reflink=always` of a 64 MiB file on /x sends CLONE and no READ or
  WRITE, and the host checks that the copy shares the source's extents on
  the server (filefrag) and has its bytes; on /e it fails with "Operation
  not supported".
- `cp` of a 256 MiB file on /e sends COPY and no READ or WRITE (the
  client lets it run asynchronously: CB_OFFLOAD ends it), and the host
  checks the bytes.
- One copy_file_range of a sparse file, and `cp` of it: the host checks
  that the copies have the source's data and holes.
"""

import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import REPO
from test_copy import sha
from test_linux_client import GUEST_EXIT, ControlServer, boot_guest, failure_context
from test_sparse import data_map

GUEST_SCRIPT = REPO / "tests" / "vm" / "guest" / "copy.sh"
MiB = 1 << 20

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(
        os.uname().sysname != "Linux" or os.uname().machine != "x86_64",
        reason="the VM harness boots x86_64 Debian kernels",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts an xfs image"),
]


def toml_str(p) -> str:
    return '"' + str(p).replace("\\", "\\\\").replace('"', '\\"') + '"'


class TwoExports:
    """`sluice serve --config` exporting `xfs` as /x and `ext4` as /e."""

    def __init__(self, binary, base, xfs, ext4):
        self.binary = binary
        self.state = base / "state"
        self.state.mkdir()
        self.config = base / "sluice.toml"
        self.config.write_text(
            "[server]\n"
            'listen = "127.0.0.1:0"\n'
            f"state_dir = {toml_str(self.state)}\n"
            "grace_time = 0\n"
            "[[export]]\n"
            f"path = {toml_str(xfs)}\n"
            'pseudo = "/x"\n'
            'squash = "none"\n'
            "[[export]]\n"
            f"path = {toml_str(ext4)}\n"
            'pseudo = "/e"\n'
            'squash = "none"\n'
        )
        self.log_path = base / "server.log"
        self.proc = None
        self.port = 0

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "serve", "--config", str(self.config)],
                                         stdout=subprocess.PIPE, stderr=log)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"sluice did not start (got {line!r}); log:\n{self.log_path.read_text()}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class CopyControl(ControlServer):
    """Checks of the server's files; each answers "ok":
    "shared x/PATH": x/PATH shares extents (filefrag -v marks some
    "shared") and has the bytes of x/src;
    "same e/PATH e/SRC": e/PATH has the bytes of e/SRC;
    "holes e/PATH e/SRC": e/PATH has the bytes of e/SRC, and its data and
    holes."""

    def __init__(self, server, xfs, ext4):
        self.xfs, self.ext4 = xfs, ext4
        self.report = ""
        self.maps = []
        super().__init__(server)

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        if cmd in ("same", "holes"):
            a, _, b = arg.partition(" ")
            path, src = self.ext4 / a.removeprefix("e/"), self.ext4 / b.removeprefix("e/")
            assert sha(path) == sha(src), f"{a} on the server differs from {b}"
            if cmd == "holes":
                got, want = data_map(path), data_map(src)
                self.maps.append(f"{a}: {got}")
                assert got == want, f"{a} on the server has data at {got}, {b} at {want}"
            return "ok"
        if cmd != "shared":
            return f"error: unknown request {line!r}"
        rel = arg.removeprefix("x/")
        path = self.xfs / rel
        out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True).stdout
        shared = sum(1 for ln in out.splitlines() if "shared" in ln)
        extents = sum(1 for ln in out.splitlines() if re.match(r"\s*\d+:", ln))
        self.report = f"{rel}: {extents} extents, {shared} shared"
        assert shared >= 1, f"{rel} on the server shares no extents:\n{out}"
        assert path.read_bytes() == (self.xfs / "src").read_bytes(), f"{rel} on the server differs from src"
        return "ok"


def sparse_file(path):
    """30 MiB: 1 MiB of data at 0, 8 and 20 MiB, holes between."""
    with open(path, "wb") as f:
        for at in (0, 8 * MiB, 20 * MiB):
            f.seek(at)
            f.write(os.urandom(MiB))
        f.truncate(30 * MiB)
    assert len(data_map(path)) == 3, "the ext4 directory does not keep holes"


def test_linux_clone_and_copy(sluice_binary, tmp_path, capsys):
    assert shutil.which("mkfs.xfs"), "mkfs.xfs is missing (xfsprogs; scripts/setup installs it)"
    image, mnt, ext4 = tmp_path / "xfs.img", tmp_path / "xfs", tmp_path / "ext4"
    with open(image, "wb") as f:
        f.truncate(512 * MiB)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    mnt.mkdir()
    ext4.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    server = ctl = None
    try:
        (mnt / "src").write_bytes(os.urandom(64 * MiB))
        (ext4 / "src").write_bytes(os.urandom(MiB))
        with open(ext4 / "big", "wb") as f:
            block = os.urandom(MiB)
            for i in range(256):
                f.write(i.to_bytes(8, "big") + block[8:])
        sparse_file(ext4 / "sparse")
        server = TwoExports(sluice_binary, tmp_path, mnt, ext4)
        server.start()
        ctl = CopyControl(server, mnt, ext4)
        console = tmp_path / "guest-console.log"
        started = time.monotonic()
        rc = boot_guest("6.12", server, ctl, GUEST_SCRIPT, console, bins=("cp", "perl"))
        took = time.monotonic() - started
        out = console.read_text(errors="replace")
        print(out)
        alive = server.alive()
    finally:
        if ctl is not None:
            ctl.close()
        if server is not None:
            server.stop()
        subprocess.run(["umount", str(mnt)], check=True)

    def context():
        return failure_context(out, console, server, 60)

    calls = re.findall(r"^CLONE_CALLS (.*)$", out, re.M)
    copies = re.findall(r"^COPY_CALLS (.*)$", out, re.M)
    with capsys.disabled():
        print(f"\nCLONE linux 6.12: cp --reflink=always of 64 MiB: {calls}; {ctl.report}; boot {took:.0f} s")
        print(f"COPY linux 6.12: cp of 256 MiB: {copies}; sparse copies: {ctl.maps}")
    assert alive, "sluice died during the test" + context()
    assert rc == 0, (f"guest script failed: exit {rc} {GUEST_EXIT.get(rc, '')}\n"
                     + "\n".join(re.findall(r"^FAIL in step .*$", out, re.M)) + context())
    assert "ALL STEPS PASSED" in out, "guest exited 0 without finishing" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    assert ctl.requests == ["shared x/dst", "same e/big.copy e/big", "holes e/sparse.copy e/sparse",
                            "holes e/sparse.cp e/sparse"], ctl.requests
