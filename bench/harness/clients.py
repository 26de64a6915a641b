"""The clients that produce figures: sluice-load and sluice-meta (the
project's own load generators), nfs-rs (an independent NFSv4.1 client, for
cross-checks), and the machine's limits: `dd` and fio with direct I/O on
the local file system (the device's read and write rates) and iperf3 over
loopback (the TCP ceiling of a warm read)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NFSRS_READER = Path(__file__).with_name("nfsrs_read.py")
# A sequential pass ends when the file is read; this only bounds a hung one.
SEQ_PASS_LIMIT = 1800


@dataclass
class LoadSpec:
    """One sluice-load invocation."""

    mode: str  # read, read-plus, write, mix
    pattern: str  # seq, random
    bs: int
    inflight: int
    streams: int = 1
    duration: float = SEQ_PASS_LIMIT
    write_pct: int = 50
    minor: int = 2
    stable: str = "unstable"  # WRITEs: unstable (COMMIT at the end) or file-sync
    size: int | None = None  # the byte range used (default: the file's size)
    proto: str = "v4"  # v4 (NFSv4.`minor`) or v3 (MOUNT v3, then NFSv3)
    uid: int = 0  # the user (AUTH_SYS uid and gid) the calls come from; 0: root

    def describe(self) -> dict:
        return {
            k: v
            for k, v in self.__dict__.items()
            if not (k == "duration" and self.pattern == "seq")
            and not (k == "minor" and self.proto == "v3")
            and not (k == "uid" and not self.uid)
        }


def sluice_load(
    binary: Path, address: str, path: str, spec: LoadSpec, mount_path: str = "/", mount_port: int | None = None
) -> dict:
    """Runs sluice-load; returns its JSON figures plus 'error' when it failed
    or reported failed requests. NFSv3 mounts `mount_path` first, on
    `mount_port` of the server's host (default: its NFS port), and `path`
    is taken from there."""
    cmd = [
        str(binary), "--server", address, "--file", path,
        "--mode", spec.mode, "--pattern", spec.pattern,
        "--bs", str(spec.bs), "--inflight", str(spec.inflight), "--streams", str(spec.streams),
        "--duration", str(spec.duration), "--write-pct", str(spec.write_pct),
        "--minor", str(spec.minor), "--stable", spec.stable, "--json",
    ] + (["--size", str(spec.size)] if spec.size else [])  # fmt: skip
    cmd += ["--uid", str(spec.uid)] if spec.uid else []
    if spec.proto == "v3":
        cmd += ["--proto", "v3", "--mount-path", mount_path]
        cmd += ["--mount-port", str(mount_port)] if mount_port else []
    result, stderr = _json_of(cmd, spec.duration + 120)
    if result.get("errors") and "error" not in result:
        result["error"] = f"{result['errors']} requests failed: {stderr[-500:]}"
    return result


def _json_of(cmd: list[str], timeout: float) -> tuple[dict, str]:
    """Runs one of the project's load programs with --json: its JSON
    object (with 'error' when it failed or printed none) and its stderr."""
    name = Path(cmd[0]).name
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{name} did not finish within {timeout:.0f} s", "command": cmd}, ""
    result: dict = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
    if not result:
        return {"error": (p.stderr.strip() or f"{name} exited {p.returncode}")[-1000:], "command": cmd}, p.stderr
    return result, p.stderr.strip()


def sluice_meta(
    binary: Path, address: str, directory: str, nclients: int, files: int, pid: int | None, proto: str = "v4",
    mount_path: str = "/", mount_port: int | None = None, phases: list[str] | None = None, uid: int = 0,
) -> dict:  # fmt: skip
    """Runs sluice-meta's `phases` (default: its own) in `directory` (which exists, empty);
    returns its JSON figures plus 'error' when it failed or an operation
    did. With `pid`, the server's CPU time per operation is measured.
    NFSv3 (`proto` v3) mounts `mount_path` first, on `mount_port` of the
    server's host (default: its NFS port), and `directory` is taken from
    there. The calls come from user and group `uid` (AUTH_SYS)."""
    cmd = [str(binary), "--server", address, "--dir", directory, "--clients", str(nclients),
           "--files", str(files), "--json"] + (["--server-pid", str(pid)] if pid else [])  # fmt: skip
    cmd += ["--phases", ",".join(phases)] if phases else []
    cmd += ["--uid", str(uid)] if uid else []
    if proto == "v3":
        cmd += ["--proto", "v3", "--mount-path", mount_path]
        cmd += ["--mount-port", str(mount_port)] if mount_port else []
    return _meta_json_of(cmd, nclients * files)


def _meta_json_of(cmd: list[str], files: int) -> dict:
    """Runs sluice-meta's `cmd` over `files` files; its JSON figures, with
    'error' when it failed or an operation did."""
    result, _ = _json_of(cmd, 600 + files / 100)
    failed = {k: v for k, v in result.get("phases", {}).items() if v.get("errors")}
    if failed and "error" not in result:
        first = next(iter(failed.values()))
        result["error"] = f"operations failed in {', '.join(failed)}: {first.get('first_error')}"
    return result


def sluice_meta_local(binary: Path, directory: Path, nclients: int, files: int, synced: bool,
                      phases: list[str] | None = None) -> dict:  # fmt: skip
    """sluice-meta's `phases` done by `nclients` local threads with system
    calls in `directory` (which exists, empty), no server between; with
    `synced`, each create, rename and remove followed by a sync of the
    directory, as a server on a `sync` export makes before it answers.
    The file system's own rate for the work."""
    cmd = [str(binary), "--local", str(directory), "--clients", str(nclients), "--files", str(files), "--json"]
    cmd += ["--sync-dir"] if synced else []
    cmd += ["--phases", ",".join(phases)] if phases else []
    return _meta_json_of(cmd, nclients * files)


# glibc settings under which a client's heap keeps the memory it freed:
# no trimming of the heap's top below 1 GiB, and blocks up to 16 MiB from
# the heap rather than from mmap of their own.
HEAP_KEPT = "glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=16777216"


def nfsrs_read(
    host: str, port: int, path: str, timeout: float = SEQ_PASS_LIMIT, heap_kept: bool = False
) -> dict:
    """One sequential pass over `path` with nfs-rs (in a child process so a
    hung client cannot hang the harness); with `heap_kept`, under
    HEAP_KEPT: nfs-rs 0.8.7's heap grows by megabytes when replies come
    quickly, glibc hands the freed top back to the kernel
    (MADV_DONTNEED), and the next burst faults and zeroes it anew."""
    cmd = [sys.executable, str(NFSRS_READER), "--host", host, "--port", str(port), "--file", path]
    env = {**os.environ, "GLIBC_TUNABLES": HEAP_KEPT} if heap_kept else None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"nfs-rs read did not finish within {timeout:.0f} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip() or f"nfs-rs reader exited {p.returncode}")[-1000:]}


def dd_direct_write(path: Path, size: int, bs: int = 1 << 20) -> dict:
    """`dd if=/dev/zero of=FILE bs=1M oflag=direct conv=fsync`: the device's
    sequential write rate through the local file system, past the page
    cache, on a new file."""
    path.unlink(missing_ok=True)
    cmd = ["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", f"count={max(size // bs, 1)}", "oflag=direct",
           "conv=fsync"]  # fmt: skip
    try:
        return _dd_figures(cmd)
    finally:
        path.unlink(missing_ok=True)


# Queue depths fio tries for the device's best rate.
FIO_DEPTHS = (1, 4, 8, 16, 32)
HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


@contextlib.contextmanager
def _huge_pages(depth: int) -> Iterator[bool]:
    """The huge-page pool raised to what fio's buffers at `depth` need (2
    MiB pages, with room) while the block runs, and given back its size
    after; yields whether fio may use it (--iomem=shmhuge)."""
    need = 2 * depth + 16
    before = int(HUGEPAGES.read_text())
    try:
        if before < need:
            HUGEPAGES.write_text(f"{need}\n")
        yield int(HUGEPAGES.read_text()) >= need
    finally:
        if int(HUGEPAGES.read_text()) != before:
            HUGEPAGES.write_text(f"{before}\n")


def fio_best(path: Path, size: int, write: bool) -> dict:
    """The best sequential rate of the device through the local file
    system, past the page cache: fio with io_uring, O_DIRECT, 1 MiB
    requests from huge-page buffers (a 1 MiB buffer of scattered pages is
    split into several requests on a loop device), at each queue depth of
    FIO_DEPTHS. `mb_per_s` is the best; `by_depth` every depth's. Writing
    makes a new file, fsynced at the end and removed afterwards."""
    by_depth: dict[str, float] = {}
    with _huge_pages(max(FIO_DEPTHS)) as huge:
        try:
            for depth in FIO_DEPTHS:
                if write:
                    path.unlink(missing_ok=True)
                cmd = ["fio", "--name=limit", f"--filename={path}", f"--rw={'write' if write else 'read'}",
                       "--bs=1M", f"--size={size}", "--ioengine=io_uring", "--direct=1", f"--iodepth={depth}",
                       "--output-format=json"] + (["--iomem=shmhuge"] if huge else []) + (
                       ["--end_fsync=1"] if write else [])  # fmt: skip
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=SEQ_PASS_LIMIT)
                try:
                    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
                except (ValueError, KeyError, IndexError):
                    return {"error": (p.stderr.strip() or p.stdout.strip())[-1000:], "command": " ".join(cmd)}
                by_depth[str(depth)] = job["write" if write else "read"]["bw_bytes"] / 1e6
        finally:
            if write:
                path.unlink(missing_ok=True)
    best = max(by_depth, key=lambda d: by_depth[d])
    return {"mb_per_s": by_depth[best], "best_depth": int(best), "by_depth": by_depth, "huge_pages": huge,
            "bytes": size}  # fmt: skip


_IPERF_INTERVAL = re.compile(r"^\[\s*\d+\]\s+([\d.]+)-([\d.]+)\s+sec\s+[\d.]+ \w+\s+([\d.]+) MBytes/sec")


def fio_beside_loopback(path: Path, size: int, depth: int, alone_mb_per_s: float) -> dict:
    """The device's direct read rate while loopback TCP carries a stream of
    the same rate, as it must when a cold file is read over the wire: the
    sender's and the receiver's copies and the loopback's processing take
    CPU and memory bandwidth from the reads.

    fio (as in `fio_best`, at `depth`) reads `size` bytes while iperf3 sends
    1 MiB writes paced at a given rate. The rate that both can sustain at
    once, R, is where fio's rate beside a stream of R is R itself; fio's
    rate falls as the stream's grows, so starting from the rate fio reaches
    alone, one step gives a rate at most R (`lower_mb_per_s`) and a second
    step, beside a stream of that rate, a rate at least R (`mb_per_s`,
    the figure compared with: a bound from above)."""
    steps = []
    rate = alone_mb_per_s
    for _ in range(2):
        step = _fio_beside_one(path, size, depth, rate)
        if "error" in step:
            return step
        steps.append(step)
        rate = step["mb_per_s"]
    return {"mb_per_s": steps[1]["mb_per_s"], "lower_mb_per_s": steps[0]["mb_per_s"], "depth": depth,
            "alone_mb_per_s": alone_mb_per_s, "steps": steps, "bytes": size}  # fmt: skip


def _fio_beside_one(path: Path, size: int, depth: int, stream_mb_per_s: float) -> dict:
    port = _free_port()
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    client = None
    try:
        cmd = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", "600", "-i", "0.1", "-f", "M", "--forceflush",
               "-l", "1M", "-b", f"{int(stream_mb_per_s * 8)}M"]  # fmt: skip
        for _ in range(50):  # the server needs a moment to listen
            client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            first = _first_interval(client)
            if first is not None:
                break
            client.wait()
            client = None
            time.sleep(0.1)  # retry interval while iperf3 -s starts
        if client is None:
            return {"error": "iperf3 did not start a stream", "command": " ".join(cmd)}
        # The stream is flowing: iperf3's clock reads first[1] now.
        origin = time.monotonic() - first[1]
        fio = ["fio", "--name=limit", f"--filename={path}", "--rw=read", "--bs=1M", f"--size={size}",
               "--ioengine=io_uring", "--direct=1", f"--iodepth={depth}", "--output-format=json"]  # fmt: skip
        with _huge_pages(depth) as huge:
            fio += ["--iomem=shmhuge"] if huge else []
            start = time.monotonic() - origin
            p = subprocess.run(fio, capture_output=True, text=True, timeout=SEQ_PASS_LIMIT)
            end = time.monotonic() - origin
        client.send_signal(signal.SIGINT)
        out, _ = client.communicate(timeout=30)
        try:
            bw = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]["read"]["bw_bytes"] / 1e6
        except (ValueError, KeyError, IndexError):
            return {"error": (p.stderr.strip() or p.stdout.strip())[-1000:], "command": " ".join(fio)}
        # The stream's rate over the intervals that lie within fio's run.
        rates = [float(m.group(3)) * 1.048576 for line in out.splitlines() if (m := _IPERF_INTERVAL.match(line))
                 and float(m.group(1)) >= start and float(m.group(2)) <= end]  # fmt: skip
        return {"mb_per_s": bw, "stream_target_mb_per_s": stream_mb_per_s,
                "stream_mb_per_s": statistics.mean(rates) if rates else None, "huge_pages": huge}  # fmt: skip
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait()


def _first_interval(client: subprocess.Popen) -> tuple[float, float] | None:
    """Reads iperf3's output up to its first interval report: (start, end)
    of that interval in iperf3's clock, or None if it exits first."""
    assert client.stdout is not None
    for line in client.stdout:
        if m := _IPERF_INTERVAL.match(line):
            return float(m.group(1)), float(m.group(2))
    return None


def loopback_tcp(size: int) -> dict:
    """The loopback TCP ceiling for one stream: iperf3 sending `size`
    bytes in 1 MiB writes to a server on 127.0.0.1 (the rate a warm read
    of that size could reach if nothing but the transfer cost anything)."""
    port = _free_port()
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        cmd = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(size), "-l", "1M", "--json"]
        received = sent = None
        for _ in range(50):  # the server needs a moment to listen
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=SEQ_PASS_LIMIT)
            try:
                end = json.loads(p.stdout)["end"]
                received, sent = end["sum_received"], end["sum_sent"]
                break
            except (ValueError, KeyError):
                time.sleep(0.1)  # retry interval while iperf3 -s starts
        if received is None:
            return {"error": (p.stderr.strip() or p.stdout.strip())[-1000:], "command": " ".join(cmd)}
        # The rate is the receiver's. Its byte count can fall short of what
        # was sent when it lags (on a busy machine iperf3 stops counting at
        # the sender's end of test), so `bytes` is what was sent: the
        # transfer's size.
        return {"mb_per_s": received["bits_per_second"] / 8 / 1e6, "bytes": int(sent["bytes"]),
                "received_bytes": int(received["bytes"]), "seconds": received["seconds"],
                "command": " ".join(cmd)}  # fmt: skip
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DD_SUMMARY = re.compile(r"^(\d+) bytes .* copied, ([\d.]+) s", re.MULTILINE)


def dd_direct(path: Path, bs: int = 1 << 20, direct: bool = True) -> dict:
    """`dd if=FILE of=/dev/null bs=1M iflag=direct`: the device's sequential
    read rate through the local file system, bypassing the page cache. With
    `direct` false, a plain buffered read: what the kernel's own readahead
    gives a local reader."""
    cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={bs}"] + (["iflag=direct"] if direct else [])
    return _dd_figures(cmd)


def _dd_figures(cmd: list[str]) -> dict:
    started = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=SEQ_PASS_LIMIT)
    wall = time.monotonic() - started
    m = _DD_SUMMARY.search(p.stderr)
    if p.returncode != 0 or not m:
        return {"error": p.stderr.strip()[-1000:], "command": cmd}
    nbytes, secs = int(m.group(1)), float(m.group(2))
    secs = secs or wall
    return {"bytes": nbytes, "seconds": secs, "mb_per_s": nbytes / secs / 1e6, "command": " ".join(cmd)}
