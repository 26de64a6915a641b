#!/usr/bin/env python3
"""Soak run: many nfs-rs clients doing a random mix of operations against a
real sluice for a long time, checking every result, while the server's
memory and descriptors are sampled.

    python3 bench/soak.py --clients 64 --duration 600

The script starts `target/release/sluice serve` on a fresh export under
/var/tmp (127.0.0.1 only), connects the clients (nfs-rs AsyncClient,
NFSv4.1, all on one asyncio loop: one connection and session each) and lets
each one loop over randomly chosen operations until the time is up:

* in its own directory: create (open "wb" + write), write (write_at into an
  existing file, also past its end), read (the whole file, compared with
  what the client wrote), getattr (size), readdir (the names), rename
  (sometimes over another file), remove, truncate (SETATTR size, shrinking
  or growing);
* bigread: a large sequential read of a shared 32 MiB file in 8 MiB calls
  (nfs-rs keeps eight 1 MiB READs in flight), compared with its content;
* shared_write / shared_read: each client owns a 64 KiB region of a few
  shared files and rewrites it with a new version (one WRITE); reads of
  any client's region must return one whole version (never torn), no
  older than the last one completed before the read began, no newer than
  the last one begun before it ended.

Every error is one error (printed with the operation, path and the
exception); every wrong result is a verification failure. Every few
seconds a progress line shows the operations done and the server's RSS,
peak RSS (VmHWM), open descriptors and threads. At the end the script
compares each client's directory on the host with what the client thinks
is there, stops the server with SIGTERM (it must exit 0 without a panic)
and prints the summary: duration, operations per kind with latencies,
errors, verification failures, RSS and descriptors at the start, after
the warm-up, at their peak and at the end, and PASS or FAIL:

* no errors and no verification failures;
* peak RSS below --rss-bound (default 256 MiB, see docs/soak.md for how it
  follows from the server's limits and this workload);
* no leak: RSS at the end of the load within --leak-bound (default
  32 MiB) of RSS after the warm-up; once the clients have gone, no more
  sockets and open files than before they came; O_PATH descriptors (the
  server's file handle cache) never above its 8192.

The exit status is 0 for PASS, 1 for FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nfs_rs

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
KiB = 1 << 10

BIG_SIZE = 32 * MiB  # the shared file of the large sequential reads
BIG_CALL = 8 * MiB  # bytes per read call (eight 1 MiB READs in flight)
BIG_READERS = 8  # clients in a large read at once
SHARED_FILES = 4
REGION = 64 * KiB  # each client's part of a shared file
MAX_FILES = 24  # files in a client's own directory
POOL_SIZE = 8 * MiB  # random bytes new content is cut from
OPERATION_TIMEOUT = 120
HANDLE_CACHE = 8192  # O_PATH descriptors the server keeps for file handles

# Relative frequency of each operation.
WEIGHTS = {
    "create": 12,
    "write": 10,
    "read": 16,
    "getattr": 14,
    "readdir": 8,
    "rename": 7,
    "remove": 6,
    "truncate": 7,
    "bigread": 2,
    "shared_write": 8,
    "shared_read": 10,
}


def file_size(rng: random.Random) -> int:
    """Mostly small files, some of several READ/WRITE sizes."""
    r = rng.random()
    if r < 0.10:
        return rng.randrange(0, 16)
    if r < 0.55:
        return rng.randrange(16, 16 * KiB)
    if r < 0.90:
        return rng.randrange(16 * KiB, 256 * KiB)
    return rng.randrange(256 * KiB, 2 * MiB + 1)


def first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    if a[:n] == b[:n]:
        return n
    while hi - lo > 4096:  # bisect to a page, then scan
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return next(i for i in range(lo, hi) if a[i] != b[i])


class Stats:
    def __init__(self):
        self.ops = {k: 0 for k in WEIGHTS}
        self.lat = {k: [] for k in WEIGHTS}
        self.errors: list[str] = []
        self.failures: list[str] = []
        self.bytes_read = 0
        self.bytes_written = 0

    def error(self, what: str):
        self.errors.append(what)
        if len(self.errors) <= 20:
            print(f"ERROR {what}", flush=True)

    def fail(self, what: str):
        self.failures.append(what)
        if len(self.failures) <= 20:
            print(f"VERIFY {what}", flush=True)


class Shared:
    """What every client can check: the big file and the shared regions."""

    def __init__(self, clients: int, seed: int):
        rng = random.Random(seed)
        self.pool = rng.randbytes(POOL_SIZE)
        self.big = rng.randbytes(BIG_SIZE)
        self.clients = clients
        # (file, client) -> versions begun and completed
        self.begun = {}
        self.done = {}
        self.big_readers = asyncio.Semaphore(BIG_READERS)

    def region(self, file: int, client: int, version: int) -> bytes:
        """Version `version` of `client`'s region in shared file `file`:
        a header naming it, then bytes from the pool chosen by it."""
        head = struct.pack(">4sIII", b"SOAK", file, client, version)
        off = (file * 7919 + client * 104729 + version * 15485863) % (POOL_SIZE - REGION)
        return head + self.pool[off : off + REGION - len(head)]


class Worker:
    def __init__(self, idx: int, client, shared: Shared, stats: Stats, seed: int):
        self.idx = idx
        self.c = client
        self.shared = shared
        self.stats = stats
        self.rng = random.Random(seed * 1000003 + idx)
        self.dir = f"c{idx:03d}"
        self.files: dict[str, bytearray] = {}
        self.counter = 0
        self.version = [0] * SHARED_FILES
        kinds = list(WEIGHTS)
        self.kinds = kinds
        self.weights = [WEIGHTS[k] for k in kinds]

    def data(self, n: int) -> bytes:
        off = self.rng.randrange(0, POOL_SIZE - n) if n < POOL_SIZE else 0
        return self.shared.pool[off : off + n]

    def path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    def new_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pick(self) -> str | None:
        return self.rng.choice(sorted(self.files)) if self.files else None

    def check(self, kind: str, path: str, got: bytes, want: bytes):
        if got != want:
            at = first_difference(got, want)
            self.stats.fail(f"{kind} {path}: {len(got)} bytes, expected {len(want)}; first difference at byte {at}")

    async def run(self, stop_at: float):
        while time.monotonic() < stop_at:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            started = time.monotonic()
            try:
                await getattr(self, "op_" + kind)()
            except Exception as e:  # an error of the operation, reported in full
                self.stats.error(f"client {self.idx} {kind}: {type(e).__name__}: {e!r}")
                # What the file holds is uncertain now: stop checking it.
                self.files.pop(getattr(self, "last_name", None), None)
            self.stats.ops[kind] += 1
            self.stats.lat[kind].append(time.monotonic() - started)

    async def op_create(self):
        if len(self.files) >= MAX_FILES:
            return await self.op_remove()
        name = self.last_name = self.new_name("f")
        data = self.data(file_size(self.rng))
        f = await self.c.open(self.path(name), "wb")
        try:
            n = await f.write(data)
        finally:
            await f.close()
        if n != len(data):
            self.stats.fail(f"create {self.path(name)}: wrote {n} of {len(data)} bytes")
        self.files[name] = bytearray(data)
        self.stats.bytes_written += len(data)

    async def op_write(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        model = self.files[name]
        off = self.rng.randrange(0, len(model) + 64 * KiB)
        data = self.data(self.rng.choice([1, 512, 4096, 65536, 300_000]))
        f = await self.c.open(self.path(name), "r+b")
        try:
            n = await f.write_at(data, off)
        finally:
            await f.close()
        if n != len(data):
            self.stats.fail(f"write {self.path(name)}: wrote {n} of {len(data)} bytes")
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off : off + len(data)] = data
        self.stats.bytes_written += len(data)

    async def op_read(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        want = bytes(self.files[name])
        f = await self.c.open(self.path(name), "rb")
        try:
            # The size is known: reading to EOF with read() lets nfs-rs
            # send READs past the end and give up on them, and it then
            # reuses their slots' sequence ids (see docs/soak.md).
            got = await f.read_at(0, len(want) + 1)
        finally:
            await f.close()
        self.check("read", self.path(name), got, want)
        self.stats.bytes_read += len(got)

    async def op_getattr(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        info = await self.c.stat(self.path(name))
        if info.size != len(self.files[name]) or info.type != nfs_rs.FileType.FILE:
            self.stats.fail(
                f"getattr {self.path(name)}: size {info.size} type {info.type}, "
                f"expected {len(self.files[name])} FILE"
            )

    async def op_readdir(self):
        self.last_name = None
        names = set(await self.c.listdir(self.dir)) - {".", ".."}
        if names != set(self.files):
            self.stats.fail(
                f"readdir {self.dir}: extra {sorted(names - set(self.files))[:5]}, "
                f"missing {sorted(set(self.files) - names)[:5]}"
            )

    async def op_rename(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        others = [n for n in self.files if n != name]
        if others and self.rng.random() < 0.3:
            target = self.rng.choice(sorted(others))  # replaces that file
        else:
            target = self.new_name("r")
        await self.c.rename(self.path(name), self.path(target))
        self.files[target] = self.files.pop(name)
        self.last_name = target

    async def op_remove(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        await self.c.remove(self.path(name))
        del self.files[name]

    async def op_truncate(self):
        name = self.last_name = self.pick()
        if name is None:
            return await self.op_create()
        model = self.files[name]
        size = self.rng.choice([0, len(model) // 2, len(model) + self.rng.randrange(1, 200_000)])
        await self.c.truncate(self.path(name), size)
        if size < len(model):
            del model[size:]
        else:
            model.extend(bytes(size - len(model)))

    async def op_bigread(self):
        self.last_name = None
        async with self.shared.big_readers:
            start = self.rng.randrange(0, BIG_SIZE // MiB) * MiB
            length = min(BIG_SIZE - start, self.rng.choice([8, 16, 32]) * MiB)
            f = await self.c.open("big", "rb")
            try:
                off = start
                while off < start + length:
                    n = min(BIG_CALL, start + length - off)
                    got = await f.read_at(off, n)
                    self.check("bigread", f"big@{off}", got, self.shared.big[off : off + n])
                    self.stats.bytes_read += len(got)
                    off += n
            finally:
                await f.close()

    async def op_shared_write(self):
        self.last_name = None
        k = self.rng.randrange(SHARED_FILES)
        v = self.version[k] + 1
        key = (k, self.idx)
        self.shared.begun[key] = v
        f = await self.c.open(f"shared{k}", "r+b")
        try:
            n = await f.write_at(self.shared.region(k, self.idx, v), self.idx * REGION)
        finally:
            await f.close()
        if n != REGION:
            self.stats.fail(f"shared_write shared{k} region {self.idx}: wrote {n} of {REGION} bytes")
        self.version[k] = v
        self.shared.done[key] = v
        self.stats.bytes_written += REGION

    async def op_shared_read(self):
        self.last_name = None
        k = self.rng.randrange(SHARED_FILES)
        j = self.idx if self.rng.random() < 0.3 else self.rng.randrange(self.shared.clients)
        key = (k, j)
        low = self.shared.done.get(key, 0)
        f = await self.c.open(f"shared{k}", "rb")
        try:
            got = await f.read_at(j * REGION, REGION)
        finally:
            await f.close()
        high = self.shared.begun.get(key, 0)
        where = f"shared{k} region {j}"
        if got == bytes(REGION):
            if low:
                self.stats.fail(f"shared_read {where}: zeros after version {low} was written")
            return
        if len(got) != REGION:
            return self.stats.fail(f"shared_read {where}: {len(got)} bytes, expected {REGION}")
        magic, file, client, version = struct.unpack(">4sIII", got[:16])
        if (magic, file, client) != (b"SOAK", k, j) or not low <= version <= high:
            return self.stats.fail(
                f"shared_read {where}: header {magic!r} file {file} client {client} version {version}, "
                f"expected a version of {low}..{high}"
            )
        self.check("shared_read", f"{where} v{version}", got, self.shared.region(k, j, version))
        self.stats.bytes_read += REGION


O_PATH = 0o10000000


def proc_status(pid: int) -> dict:
    """RSS and peak RSS in KiB, threads, and open descriptors of `pid`:
    all of them, sockets, O_PATH ones (the server's file handle cache,
    at most 8192) and the rest (open files, the log, epoll, ...)."""
    out = {"fds": 0, "sockets": 0, "paths": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0])
        elif key == "Threads":
            out[key] = int(val)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = next(
                int(line.split()[1], 8)
                for line in open(f"/proc/{pid}/fdinfo/{fd}")
                if line.startswith("flags:")
            )
        except (OSError, StopIteration):
            continue  # closed meanwhile
        out["fds"] += 1
        if target.startswith("socket:"):
            out["sockets"] += 1
        elif flags & O_PATH:
            out["paths"] += 1
    out["files"] = out["fds"] - out["sockets"] - out["paths"]
    return out


class Server:
    def __init__(self, binary: Path, export: Path, state: Path, port: int):
        self.log_path = state / "server.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "serve", str(export), "--listen", f"127.0.0.1:{port}", "--state-dir", str(state), "--no-root-squash"],
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # Ctrl-C reaches only this script
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        log.close()
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"sluice did not start: {line!r}\n{self.log_path.read_text()}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode


def prepare(export: Path, shared: Shared):
    (export / "big").write_bytes(shared.big)
    for k in range(SHARED_FILES):
        (export / f"shared{k}").write_bytes(bytes(shared.clients * REGION))
    for i in range(shared.clients):
        (export / f"c{i:03d}").mkdir()


def host_check(export: Path, workers: list[Worker], stats: Stats):
    """The export as the host sees it must hold what the clients wrote."""
    for w in workers:
        d = export / w.dir
        names = {p.name for p in d.iterdir()}
        if names != set(w.files):
            stats.fail(f"host {w.dir}: extra {sorted(names - set(w.files))[:5]}, missing {sorted(set(w.files) - names)[:5]}")
            continue
        for name, model in w.files.items():
            got = (d / name).read_bytes()
            if got != model:
                stats.fail(f"host {w.dir}/{name}: {len(got)} bytes, expected {len(model)}, first difference at {first_difference(got, bytes(model))}")


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def soak(args, server: Server, shared: Shared, stats: Stats) -> dict:
    pid = server.proc.pid
    samples = []  # (seconds, status)
    t0 = time.monotonic()

    def sample(tag: str | None = None):
        try:
            st = proc_status(pid)
        except OSError:  # the server is gone (reported as an error)
            st = dict(samples[-1][1])
        samples.append((time.monotonic() - t0, st))
        if tag:
            marks[tag] = st
        return st

    marks = {}
    sample("start")
    url = f"nfs://127.0.0.1/?version=4.1&nfsport={server.port}&noresvport=true"
    clients = await asyncio.gather(
        *[
            nfs_rs.AsyncClient.connect(url, connect_timeout=30, operation_timeout=OPERATION_TIMEOUT)
            for _ in range(args.clients)
        ]
    )
    workers = [Worker(i, c, shared, stats, args.seed) for i, c in enumerate(clients)]
    started = time.monotonic()
    stop_at = started + args.duration
    warmup = min(60.0, args.duration * 0.1)
    tasks = [asyncio.ensure_future(w.run(stop_at)) for w in workers]
    last_ops = 0
    last_t = started
    warm_taken = False
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=args.interval)
        now = time.monotonic()
        st = sample()
        if not warm_taken and now - started >= warmup:
            marks["warm"] = st
            warm_taken = True
        if server.proc.poll() is not None:
            stats.error(f"server exited with status {server.proc.returncode}")
            for t in tasks:
                t.cancel()
            break
        ops = sum(stats.ops.values())
        print(
            f"[{now - started:6.0f}s] ops {ops} ({(ops - last_ops) / max(now - last_t, 1e-9):.0f}/s) "
            f"errors {len(stats.errors)} verify {len(stats.failures)} | server RSS {mib(st['VmRSS'])} MiB "
            f"(peak {mib(st['VmHWM'])}) fds {st['fds']} ({st['sockets']} sockets, {st['files']} files, "
            f"{st['paths']} O_PATH) threads {st['Threads']}",
            flush=True,
        )
        last_ops, last_t = ops, now
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception():
            stats.error(f"worker crashed: {t.exception()!r}")
    elapsed = time.monotonic() - started
    marks.setdefault("warm", marks["start"])
    sample("end")  # load over, clients still connected
    for c in clients:
        try:
            await c.close()
        except Exception as e:
            stats.error(f"close: {e!r}")
    # nfs-rs closes a client's connection when the client object goes.
    for w in workers:
        w.c = None
    del c, clients
    gc.collect()
    # Clients gone: once the server has seen their connections close, it
    # should hold no more sockets and open files than before they came.
    deadline = time.monotonic() + 30
    while True:
        st = sample("idle")
        if (st["sockets"], st["files"]) <= (marks["start"]["sockets"], marks["start"]["files"]):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)  # polling for the server to close connections, bounded above
    return {"elapsed": elapsed, "marks": marks, "samples": samples, "workers": workers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    ap.add_argument("--binary", type=Path, default=REPO / "target" / "release" / "sluice")
    ap.add_argument("--port", type=int, default=0, help="port for the server (default: any free one)")
    ap.add_argument("--interval", type=float, default=5, help="seconds between samples and progress lines")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-bound", type=float, default=256, help="MiB the server's peak RSS must stay below")
    ap.add_argument("--leak-bound", type=float, default=32, help="MiB RSS may grow from after the warm-up to the end")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--keep", action="store_true", help="keep the export and server log")
    args = ap.parse_args()
    if args.clients < 1 or args.duration <= 0:
        ap.error("--clients and --duration must be positive")

    scratch = Path(tempfile.mkdtemp(prefix="sluice-soak-", dir="/var/tmp"))
    export, state = scratch / "export", scratch / "state"
    export.mkdir()
    state.mkdir()
    stats = Stats()
    shared = Shared(args.clients, args.seed)
    prepare(export, shared)
    server = Server(args.binary, export, state, args.port)
    print(
        f"soak: {args.clients} nfs-rs {nfs_rs.__version__} clients for {args.duration:.0f} s against "
        f"{args.binary} (PID {server.proc.pid}, 127.0.0.1:{server.port}, export {export})",
        flush=True,
    )
    try:
        run = asyncio.run(soak(args, server, shared, stats))
    except KeyboardInterrupt:
        server.stop()
        print(f"interrupted; scratch left in {scratch}", file=sys.stderr)
        return 1
    host_check(export, run["workers"], stats)
    status = server.stop()
    log = server.log_path.read_text(errors="replace")
    if status != 0:
        stats.error(f"server exit status {status} after SIGTERM")
    if "panicked" in log:
        stats.error("server log holds a panic:\n" + "\n".join(line for line in log.splitlines() if "panicked" in line))

    m = run["marks"]
    peak_hwm = max(st["VmHWM"] for _, st in run["samples"])
    peak_fds = max(st["fds"] for _, st in run["samples"])
    peak_paths = max(st["paths"] for _, st in run["samples"])
    growth = m["end"]["VmRSS"] - m["warm"]["VmRSS"]
    checks = {
        "no errors": not stats.errors,
        "no verification failures": not stats.failures,
        f"peak RSS < {args.rss_bound:.0f} MiB": peak_hwm < args.rss_bound * 1024,
        f"end RSS - after-warm-up RSS < {args.leak_bound:.0f} MiB": growth < args.leak_bound * 1024,
        "sockets and open files once the clients are gone <= at the start": (
            m["idle"]["sockets"] <= m["start"]["sockets"] and m["idle"]["files"] <= m["start"]["files"]
        ),
        f"O_PATH descriptors (handle cache) <= {HANDLE_CACHE}": peak_paths <= HANDLE_CACHE + 1,
    }
    ok = all(checks.values())
    total = sum(stats.ops.values())

    print()
    print(f"summary: {args.clients} clients, {run['elapsed']:.1f} s of load (asked {args.duration:.0f} s)")
    print(f"operations: {total} ({total / run['elapsed']:.0f}/s); {stats.bytes_read / MiB:.0f} MiB read, {stats.bytes_written / MiB:.0f} MiB written")
    print(f"  {'kind':<13}{'count':>9}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for k in WEIGHTS:
        lat = stats.lat[k]
        print(
            f"  {k:<13}{stats.ops[k]:>9}{percentile(lat, 0.5) * 1e3:>10.1f}"
            f"{percentile(lat, 0.99) * 1e3:>10.1f}{max(lat, default=0) * 1e3:>10.1f}"
        )
    print(f"errors: {len(stats.errors)}")
    for e in stats.errors[:50]:
        print(f"  {e}")
    print(f"verification failures: {len(stats.failures)}")
    for f in stats.failures[:50]:
        print(f"  {f}")
    print(
        f"server RSS MiB: start {mib(m['start']['VmRSS'])}, after warm-up {mib(m['warm']['VmRSS'])}, "
        f"peak {mib(peak_hwm)}, end {mib(m['end']['VmRSS'])}, idle {mib(m['idle']['VmRSS'])}"
    )
    print(
        f"server fds: start {m['start']['fds']}, peak {peak_fds}, end {m['end']['fds']}, idle {m['idle']['fds']} "
        f"(idle: {m['idle']['sockets']} sockets, {m['idle']['files']} files, {m['idle']['paths']} O_PATH; "
        f"start: {m['start']['sockets']}, {m['start']['files']}, {m['start']['paths']}); "
        f"threads: start {m['start']['Threads']}, end {m['end']['Threads']}"
    )
    for name, good in checks.items():
        print(f"check: {name}: {'ok' if good else 'FAILED'}")
    print(f"result: {'PASS' if ok else 'FAIL'}")

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "clients": args.clients,
                    "duration": args.duration,
                    "elapsed": run["elapsed"],
                    "nfs_rs": nfs_rs.__version__,
                    "ops": stats.ops,
                    "bytes_read": stats.bytes_read,
                    "bytes_written": stats.bytes_written,
                    "latency_ms": {
                        k: {p: percentile(v, q) * 1e3 for p, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}
                        for k, v in stats.lat.items()
                    },
                    "errors": stats.errors,
                    "failures": stats.failures,
                    "rss_kib": {k: m[k]["VmRSS"] for k in ("start", "warm", "end", "idle")} | {"peak": peak_hwm},
                    "fds": {k: m[k]["fds"] for k in ("start", "warm", "end", "idle")} | {"peak": peak_fds},
                    "samples": [{"t": round(t, 1), **st} for t, st in run["samples"]],
                    "checks": checks,
                    "result": "PASS" if ok else "FAIL",
                },
                indent=1,
            )
            + "\n"
        )
    if args.keep or not ok:
        print(f"export and server log kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
