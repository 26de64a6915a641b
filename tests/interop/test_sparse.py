"""Sparse files through the Linux kernel client: READ_PLUS (6.12) and READ
(6.1) return the exact bytes of data, hole and mixed layouts; lseek
SEEK_DATA/SEEK_HOLE in the guest sees the server file's real layout;
fallocate and hole punching in the guest change the server file's
allocation; `cp --sparse=always` through the mount writes a sparse copy."""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "vm" / "linux-client"
SEG_SIZES = (4, 8, 16, 32)
MIXED_SIZE = 4 << 20


def write_layout(path: Path, size: int, seg: int, data_first: bool, seed: int):
    """Alternating data/hole segments of `seg` bytes (the seed's mixed-Nd/h)."""
    rnd = __import__("random").Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        pos, data = 0, data_first
        while pos < size:
            if data:
                f.seek(pos)
                f.write(rnd.randbytes(min(seg, size - pos)))
            pos += seg
            data = not data


def data_map(path: Path):
    """Data extents of a host file, found the same way the guest tool does."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            out.append((d, h))
            pos = h
    finally:
        os.close(fd)
    return out


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def sparsetool() -> Path:
    # Not under /tmp: the guest mounts a fresh tmpfs there.
    out = REPO / "target" / "test-tools" / "sparsetool"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gcc", "-static", "-O2", "-Wall", "-o", str(out), str(REPO / "tests/tools/sparsetool.c")],
        check=True,
    )
    return out


def make_files(export: Path):
    files = {}
    p = export / "data"
    p.write_bytes(os.urandom(4 << 20))
    files["data"] = p
    p = export / "hole"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    files["hole"] = p
    for kb in SEG_SIZES:
        for first in ("d", "h"):
            name = f"mixed-{kb}{first}"
            p = export / name
            write_layout(p, MIXED_SIZE, kb * 1024, first == "d", seed=kb * 2 + (first == "d"))
            files[name] = p
    # Big holes between big data runs, so READ_PLUS has holes to report.
    p = export / "mixed-1m"
    write_layout(p, 16 << 20, 1 << 20, True, seed=99)
    files["mixed-1m"] = p
    p = export / "punchme"
    p.write_bytes(os.urandom(2 << 20))
    files["punchme"] = p
    return files


GUEST = r"""
set -u
fail() { echo "FAILED: $*"; exit 1; }
mkdir -p /mnt
mount -t nfs4 -o vers=4.2,port=$PORT,addr=$SERVER,proto=tcp,sec=sys $SERVER:/ /mnt || fail mount
cd /mnt
for f in $(cat expected.md5 | awk '{print $2}'); do
  got=$(md5sum "$f" | awk '{print $1}')
  want=$(grep " $f\$" expected.md5 | awk '{print $1}')
  [ "$got" = "$want" ] || fail "checksum of $f: got $got want $want"
done
echo "checksums ok"
for f in $(cat expected.md5 | awk '{print $2}'); do
  echo "== map $f"
  $SPARSETOOL map "$f" || fail "map $f"
done
echo "== mountstats"
grep -E '^[[:space:]]+(READ|READ_PLUS|SEEK|ALLOCATE|DEALLOCATE):' /proc/self/mountstats
$SPARSETOOL falloc /mnt/fa 0 1048576 || fail falloc
$SPARSETOOL punch /mnt/punchme 65536 1048576 || fail punch
/usr/bin/cp --sparse=always /mnt/mixed-1m /mnt/copy-1m || fail "cp --sparse=always"
sync
echo "== done"
"""


def run_guest(kernel: str, port: int, tool: Path, tmp: Path):
    script = tmp / "guest.sh"
    script.write_text(GUEST)
    proc = subprocess.run(
        [str(HARNESS), "--kernel", kernel, "--port", str(port), "--bin", "/usr/bin/cp",
         "--bin", str(tool), "--env", f"SPARSETOOL={tool}", "--timeout", "600", str(script)],
        capture_output=True,
        text=True,
    )
    return proc


def parse_output(out: str):
    maps, stats, cur = {}, {}, None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("== map "):
            cur = line[len("== map "):]
            maps[cur] = []
        elif line == "== mountstats":
            cur = "__stats__"
        elif line.startswith("=="):
            cur = None
        elif cur == "__stats__":
            m = re.match(r"(\w+):\s+(\d+)", line)
            if m:
                stats[m.group(1)] = int(m.group(2))
        elif cur and line.startswith("data "):
            _, s, e = line.split()
            maps[cur].append((int(s), int(e)))
    return maps, stats


@pytest.mark.guest
@pytest.mark.parametrize("kernel", ["6.12", "6.1"])
def test_sparse_files_through_linux_client(kernel, sluice_server, sparsetool, tmp_path):
    export = sluice_server.export
    files = make_files(export)
    expected = {name: md5(p) for name, p in files.items() if name != "punchme"}
    (export / "expected.md5").write_text("".join(f"{h}  {n}\n" for n, h in expected.items()))
    host_maps = {name: data_map(files[name]) for name in expected}
    punch_before = files["punchme"].read_bytes()

    proc = run_guest(kernel, sluice_server.port, sparsetool, tmp_path)
    assert proc.returncode == 0, f"guest failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert "checksums ok" in proc.stdout
    maps, stats = parse_output(proc.stdout)

    # The guest's lseek sees the server file's layout.
    for name, want in host_maps.items():
        assert maps.get(name) == want, f"{name}: guest map {maps.get(name)[:6]} != host map {want[:6]}"

    if kernel == "6.12":
        assert stats.get("READ_PLUS", 0) > 0, f"READ_PLUS not used: {stats}"
    else:
        assert stats.get("READ", 0) > 0, f"READ not used: {stats}"
    assert stats.get("SEEK", 0) > 0, f"SEEK not used: {stats}"

    # fallocate in the guest allocated space on the server.
    fa = os.stat(export / "fa")
    assert fa.st_size == 1 << 20 and fa.st_blocks * 512 >= 1 << 20, fa
    # Punching a hole freed the range and kept the size and other bytes.
    after = files["punchme"].read_bytes()
    assert len(after) == len(punch_before)
    assert after[65536:65536 + (1 << 20)] == bytes(1 << 20)
    assert after[:65536] == punch_before[:65536]
    assert after[65536 + (1 << 20):] == punch_before[65536 + (1 << 20):]
    assert os.stat(files["punchme"]).st_blocks * 512 <= (2 << 20) - (1 << 20) + 65536
    # cp --sparse=always made an equal, sparse copy.
    copy = export / "copy-1m"
    assert md5(copy) == expected["mixed-1m"]
    assert os.stat(copy).st_blocks * 512 <= (9 << 20), os.stat(copy)
    assert data_map(copy) != [(0, 16 << 20)], "the copy has no holes"
