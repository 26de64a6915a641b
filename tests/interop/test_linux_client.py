"""The Linux kernel NFS client against sluice, in a QEMU guest.

For each guest kernel (Debian's 6.1 and 6.12) and NFS minor version (4.1,
4.2) this boots tests/vm/linux-client once and runs
tests/vm/guest/nfs-client-suite.sh in it against a real `sluice serve`. The
guest checks what it reads back; afterwards this side checks the export
directory on the host. A small TCP control server lets the guest ask for a
server restart (and for a file to be made behind its back) without sleeps.

Each boot takes a few minutes under software emulation.
"""

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VM = REPO / "tests" / "vm" / "linux-client"
GUEST_SUITE = REPO / "tests" / "vm" / "guest" / "nfs-client-suite.sh"
# A boot takes 4-7 minutes on 2 idle cores (TCG); leave room for a busy host.
BOOT_TIMEOUT = int(os.environ.get("SLUICE_VM_TIMEOUT", "1200"))
BIG_DIR_ENTRIES = 20000
FIXED_MTIME = 981173106  # 2001-02-03 04:05:06 UTC, set by `touch -d` in the guest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="the VM harness boots x86_64 Debian kernels",
)


class ControlServer:
    """Line-based requests from the guest, one per connection.

    "restart"     -> server.restart(); reply "ok" once it listens again
    "mkfile PATH" -> create PATH in the export with content "host\\n"; "ok"
    Anything that goes wrong is replied as "error ..." and kept in .errors.
    """

    def __init__(self, server):
        self.server = server
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.requests = []
        self.errors = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(60)
                try:
                    line = conn.makefile("rb").readline().decode().strip()
                    self.requests.append(line)
                    reply = self._handle(line)
                except Exception as e:  # noqa: BLE001 - reported to the guest and the test
                    reply = f"error {type(e).__name__}: {e}"
                if reply != "ok":
                    self.errors.append(f"{line!r}: {reply}")
                try:
                    conn.sendall(reply.encode() + b"\n")
                except OSError:
                    pass

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        if cmd == "restart":
            self.server.restart()
            return "ok"
        if cmd == "mkfile":
            export = self.server.export.resolve()
            target = (export / arg).resolve()
            if export not in target.parents:
                return f"error: {arg!r} is outside the export"
            target.write_text("host\n")
            return "ok"
        return f"error: unknown request {line!r}"

    def close(self):
        self.sock.close()


def guest_tool(name):
    """A host binary the guest suite needs (busybox lacks flock; perl gives
    fcntl locks and O_EXCL opens without a stat first)."""
    path = shutil.which(name)
    assert path, f"{name} is not installed on the host (util-linux / perl-base)"
    return path


def tail(text, lines):
    return "\n".join(text.splitlines()[-lines:])


def md5_of(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


ALL_SIZES = "tiny:1 page:4095 mib:1048583 m64:67108864 m256:268435456"


def guest_sizes(kernel: str, vers: str) -> str:
    """Random data is made at ~1.3 MB/s under emulation, so the 256 MiB file
    is written by one boot per kernel (6.1 with 4.1, 6.12 with 4.2) and the
    other two boots stop at 64 MiB. SLUICE_VM_ALL_SIZES=1 writes it on all."""
    if os.environ.get("SLUICE_VM_ALL_SIZES") == "1" or (kernel, vers) in {("6.1", "4.1"), ("6.12", "4.2")}:
        return ALL_SIZES
    return ALL_SIZES.replace(" m256:268435456", "")


@pytest.mark.parametrize("vers", ["4.1", "4.2"], ids=lambda v: f"nfs{v}")
@pytest.mark.parametrize("kernel", ["6.1", "6.12"], ids=lambda k: f"linux{k}")
def test_linux_client(sluice_server, tmp_path, kernel, vers):
    export = sluice_server.export
    big = export / "big"
    big.mkdir()
    for i in range(BIG_DIR_ENTRIES):
        name = f"f{i:05d}"
        (big / name).write_text(name + "\n")

    ctl = ControlServer(sluice_server)
    console_path = tmp_path / "guest-console.log"
    try:
        with open(console_path, "w") as console:
            proc = subprocess.run(
                [
                    str(VM),
                    "--kernel", kernel,
                    "--port", str(sluice_server.port),
                    "--ctl-port", str(ctl.port),
                    "--mem", "1024",
                    "--bin", guest_tool("flock"),
                    "--bin", guest_tool("perl"),
                    "--env", f"VERS={vers}",
                    "--env", f"SIZES={guest_sizes(kernel, vers)}",
                    "--timeout", str(BOOT_TIMEOUT),
                    str(GUEST_SUITE),
                ],
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=BOOT_TIMEOUT + 120,
            )
    finally:
        ctl.close()
    out = console_path.read_text(errors="replace")
    print(out)  # shown by pytest when the test fails

    def context():
        log = sluice_server.log_path
        server_log = log.read_text(errors="replace") if log.exists() else "(no server log)"
        return (
            f"\n--- guest console (last 120 lines; full: {console_path}) ---\n"
            f"{tail(out, 120)}\n"
            f"--- server log (last 60 lines; full: {log}) ---\n{tail(server_log, 60)}"
        )

    status = {124: "timed out", 125: "harness failure", 126: "guest died (panic?)"}
    failed_step = re.findall(r"^FAIL in step .*$", out, re.M)
    assert proc.returncode == 0, (
        f"guest suite failed: exit {proc.returncode} "
        f"{status.get(proc.returncode, '')}\n"
        + "\n".join(failed_step or ["(no failing step reported)"])
        + context()
    )
    assert "ALL STEPS PASSED" in out, "guest exited 0 without finishing" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    assert ctl.requests.count("restart") == 1, ctl.requests

    # --- what the guest wrote, as seen on the host ---
    manifest = re.findall(r"^MANIFEST (\S+) ([0-9a-f]{32}) (\d+)$", out, re.M)
    names = {m[0] for m in manifest}
    m256 = ["data/m256"] if "m256" in guest_sizes(kernel, vers) else []
    for expected in ["data/tiny", "data/page", "data/mib", "data/m64", *m256,
                     "app/log", "trunc/f", "rs/before", "rs/after", "rs/open-across"]:
        assert expected in names, f"{expected} missing from the guest manifest"
    for rel, md5, size in manifest:
        p = export / rel
        assert p.is_file(), f"{rel} written by the guest is not in the export"
        assert p.stat().st_size == int(size), f"size of {rel} on the host"
        assert md5_of(p) == md5, f"content of {rel} on the host differs from the guest's"
    sizes = {"tiny": 1, "page": 4095, "mib": 1048576 + 7,
             "m64": 64 << 20, "m256": 256 << 20}
    if not m256:
        del sizes["m256"]
    for name, size in sizes.items():
        assert (export / "data" / name).stat().st_size == size

    sparse = export / "trunc" / "sparse"
    assert sparse.stat().st_size == 4096 * 1000 + 5000
    with open(sparse, "rb") as f:
        assert f.read(4096 * 1000) == bytes(4096 * 1000)
    assert (export / "trunc" / "f0").stat().st_size == 0

    leaf = export / "deep" / "/".join(f"d{i:02d}" for i in range(1, 31)) / "leaf"
    assert leaf.read_text() == "bottom\n"

    ren = export / "ren"
    assert sorted(os.listdir(ren / "a")) == []
    assert sorted(os.listdir(ren / "b")) == ["file1-moved", "sub-moved", "victim"]
    assert (ren / "b" / "file1-moved").read_text() == "one\n"
    assert (ren / "b" / "sub-moved" / "inner").read_text() == "two\n"
    assert (ren / "b" / "victim").read_text() == "replacement\n"

    links = export / "links"
    orig, hard = os.stat(links / "orig"), os.stat(links / "hard")
    assert orig.st_nlink == 2 and hard.st_nlink == 2
    assert (orig.st_ino, orig.st_dev) == (hard.st_ino, hard.st_dev)
    assert (links / "orig").read_text() == "content\nmore\n"
    assert os.readlink(links / "sym") == "orig"
    assert os.readlink(links / "dangling") == "../data/does-not-exist"

    f = os.stat(export / "attrs" / "f")
    assert (f.st_mode & 0o7777, f.st_uid, f.st_gid) == (0o640, 1234, 5678)
    assert int(f.st_mtime) == FIXED_MTIME
    d = os.stat(export / "attrs" / "d")
    assert (d.st_mode & 0o7777, d.st_uid, d.st_gid) == (0o751, 4321, 8765)

    assert not (export / "rmtree").exists()
    assert os.listdir(export / "silly") == []
    assert (export / "excl" / "hostmade").read_text() == "host\n"
    assert (export / "excl" / "noclobber").read_text() == "first\n"
    new = os.stat(export / "excl" / "new")
    assert (new.st_size, new.st_mode & 0o7777) == (0, 0o644)
    assert (export / "rs" / "open-across").read_text() == "before\nafter\n"
    assert (export / "rs" / "fresh").read_text() == "fresh\n"
    assert len(os.listdir(big)) == BIG_DIR_ENTRIES
