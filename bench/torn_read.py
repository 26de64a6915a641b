#!/usr/bin/env python3
"""Torn-read detector for an NFSv4.1 server, driven through nfs-rs.

Writers rewrite random 8 KiB blocks of one file; every write stamps each of
the block's 16 512-byte sectors with the block number and a generation
number that no other write uses. Concurrent readers read random blocks and
check that each one is self-consistent: every sector carries the magic, its
own sector index, the right block number and the same generation, and its
filler words match. A read that sees part of one write and part of another
(or of the old contents) fails the check and is counted as torn.

Sector layout (little endian, 512 bytes; shared with tests/tools/tornread.c):

    0   4  magic b"TORN"
    4   4  sector index within the block (0..15)
    8   8  block number
    16  8  generation (0 = preallocated contents)
    24  8  filler word W = mix(block, generation, sector)
    32 480 W repeated 60 times

usage: bench/torn_read.py (--port P [--host H] | --fs ext4|xfs|btrfs)
           [--file torn.dat] [--blocks N]
           [--writers W] [--readers R] [--reads N] [--seconds S]
           [--mode thread|process] [--export-dir DIR] [--prealloc-chunk BYTES]
           [--stop-after-torn K] [--seed N] [--unsafe-no-range-locks]

--port P runs against a server that is already listening. --fs NAME (as
root) sets one up instead, as bench/run does: a fresh NAME file system on a
loop device (`losetup --direct-io=on`, bench/harness/fs.py) exported by
target/release/sluice on 127.0.0.1 (with --unsafe-no-range-locks, the
hidden test-only flag that turns byte-range locks off), the file made on
the host; all of it is torn down at exit, also on Ctrl-C. For example

    bench/torn_read.py --fs xfs --blocks 4 --writers 4 --readers 8 \
        --prealloc-chunk 4096 --reads 1000000

The file is created and preallocated (every block at generation 0) through
NFS, or directly in the server's exported directory with --export-dir, in
--prealloc-chunk sized writes (default 1 MiB; 4096 leaves 4 KiB page-cache
folios on ext4, where an unprotected 8 KiB write is copied a page at a time
and tears far more often). Each worker has its own nfs-rs client; threads
are the default (nfs-rs releases the GIL in I/O, and threads measured
faster than processes on the 2-core test machine). Readers share the
--reads target evenly; writers run until the readers are done; --seconds
caps the run. The program prints a summary and, as its last line, one JSON
object with the figures. Exit status: 0 when no torn read was seen, 1 when
some were, 2 on an error.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import random
import struct
import sys
import threading
import time

BLOCK = 8192
SECTOR = 512
SECTORS = BLOCK // SECTOR
MAGIC = b"TORN"
_HDR = struct.Struct("<4sIQQQ")  # magic, sector, block, generation, word
_WORD = struct.Struct("<Q")
_FILL_WORDS = (SECTOR - _HDR.size) // _WORD.size
assert _HDR.size + _FILL_WORDS * _WORD.size == SECTOR
_M64 = (1 << 64) - 1


def mix(block: int, gen: int, sector: int) -> int:
    """The sector's filler word: a 64-bit mix of its coordinates."""
    x = (block * 0x9E3779B97F4A7C15 + gen * 0xC2B2AE3D27D4EB4F + sector * 0x165667B19E3779F9) & _M64
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 32
    return x


def make_sector(block: int, gen: int, sector: int) -> bytes:
    w = mix(block, gen, sector)
    return _HDR.pack(MAGIC, sector, block, gen, w) + _WORD.pack(w) * _FILL_WORDS


@functools.lru_cache(maxsize=2048)
def make_block(block: int, gen: int) -> bytes:
    """The 8 KiB contents a write of generation `gen` gives block `block`.

    Cached: readers see each (block, generation) many times between writes.
    """
    return b"".join(make_sector(block, gen, s) for s in range(SECTORS))


def describe(data: bytes) -> str:
    """Per-sector (block, generation) labels of a block read, for reports."""
    out = []
    for s in range(len(data) // SECTOR):
        magic, idx, blk, gen, _ = _HDR.unpack_from(data, s * SECTOR)
        ok = magic == MAGIC and data[s * SECTOR:(s + 1) * SECTOR] == make_sector(blk, gen, idx)
        out.append(f"{s}:b{blk}g{gen}" + ("" if ok and idx == s else "!"))  # ! = damaged
    return " ".join(out)


def check_block(data: bytes, block: int) -> str | None:
    """Check one 8 KiB read of block `block`.

    Returns None when the block is self-consistent (all 16 sectors are intact
    and carry block number `block` and one same generation), else a short
    description of what is wrong.
    """
    if len(data) != BLOCK:
        return f"short read: {len(data)} bytes"
    magic, idx, blk, gen, _ = _HDR.unpack_from(data, 0)
    if magic == MAGIC and idx == 0 and blk == block and data == make_block(block, gen):
        return None
    # Not consistent: work out a description (slow path, only on failures).
    gens = set()
    bad = []
    for s in range(SECTORS):
        magic, idx, blk, g, _ = _HDR.unpack_from(data, s * SECTOR)
        intact = magic == MAGIC and idx == s and blk == block and \
            data[s * SECTOR:(s + 1) * SECTOR] == make_sector(blk, g, s)
        if intact:
            gens.add(g)
        else:
            bad.append(s)
    what = f"damaged sectors {bad}" if bad else f"mixed generations {sorted(gens)}"
    return f"block {block}: {what}: {describe(data)}"


def generation(writer: int, writers: int, seq: int) -> int:
    """Generation numbers unique across writers, never 0 (the preallocation)."""
    return seq * writers + writer + 1


# ---------------------------------------------------------------------------
# NFS side


def nfs_url(host: str, port: int) -> str:
    return f"nfs://{host}/?version=4.1&nfsport={port}&noresvport=true"


def connect(host: str, port: int):
    from nfs_rs import Client

    return Client.connect(nfs_url(host, port), connect_timeout=20, operation_timeout=120)


def initial_contents(blocks: int) -> bytes:
    return b"".join(make_block(b, 0) for b in range(blocks))


def preallocate_nfs(host: str, port: int, path: str, blocks: int, chunk: int = 1 << 20) -> None:
    """Create the file through NFS, every block at generation 0, in `chunk`-byte writes."""
    data = initial_contents(blocks)
    client = connect(host, port)
    try:
        with client.open(path, "w+b") as f:
            for off in range(0, len(data), chunk):
                f.write_at(data[off:off + chunk], off)
    finally:
        client.close()


def preallocate_host(export_dir: str, path: str, blocks: int, chunk: int = 1 << 20) -> None:
    """Create the file directly in the exported directory, in `chunk`-byte writes.

    The write size shapes the backing file's page cache: on Linux 6.x ext4 a
    large write makes large folios, which later writes fill with one copy,
    while 4 KiB writes leave 4 KiB folios that a write fills one at a time.
    """
    data = initial_contents(blocks)
    fd = os.open(os.path.join(export_dir, path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), chunk):
            os.pwrite(fd, data[off:off + chunk], off)
        os.fsync(fd)
    finally:
        os.close(fd)


class _Counter:
    """threading stand-in for multiprocessing.Value: .value and get_lock()."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def get_lock(self):
        return self._lock


class Shared:
    """Stop flag, start barrier and torn-read counter, for threads or processes."""

    def __init__(self, ctx, parties: int):
        self.stop = ctx.Event()
        self.start = ctx.Barrier(parties)
        self.torn = ctx.Value("q", 0) if ctx is not threading else _Counter()


def worker(role: str, wid: int, args: dict, shared: Shared, quota: int, out):
    """One reader or writer with its own nfs-rs client; puts a result dict in out."""
    res = {"role": role, "id": wid, "reads": 0, "torn": 0, "writes": 0, "examples": [],
           "error": None}
    client = None
    try:
        client = connect(args["host"], args["port"])
        f = client.open(args["file"], "r+b" if role == "writer" else "rb")
        rnd = random.Random(args["seed"] * 1000003 + (wid if role == "reader" else 500 + wid))
        blocks = args["blocks"]
        writers = args["writers"]
        stop_after = args["stop_after_torn"]
        stop = shared.stop
        shared.start.wait()
        if role == "writer":
            seq = 0
            while not stop.is_set():
                b = rnd.randrange(blocks)
                f.write_at(make_block(b, generation(wid, writers, seq)), b * BLOCK)
                seq += 1
                res["writes"] = seq
        else:
            reads = torn = 0
            examples = res["examples"]
            while reads < quota and not stop.is_set():
                b = rnd.randrange(blocks)
                data = f.read_at(b * BLOCK, BLOCK)
                reads += 1
                problem = check_block(data, b)
                if problem is not None:
                    torn += 1
                    if len(examples) < 5:
                        examples.append(problem)
                    if stop_after:
                        with shared.torn.get_lock():
                            shared.torn.value += 1
                            if shared.torn.value >= stop_after:
                                stop.set()
            res["reads"], res["torn"] = reads, torn
        f.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        res["error"] = f"{role} {wid}: {type(e).__name__}: {e}"
        shared.stop.set()
        shared.start.abort()
    finally:
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
    out.put(res)


def run(args: argparse.Namespace) -> dict:
    if args.export_dir:
        preallocate_host(args.export_dir, args.file, args.blocks, args.prealloc_chunk)
    else:
        preallocate_nfs(args.host, args.port, args.file, args.blocks, args.prealloc_chunk)

    n = args.writers + args.readers
    if args.mode == "process":
        ctx = multiprocessing.get_context("spawn")
        shared = Shared(ctx, n + 1)
        out = ctx.Queue()
        spawn = lambda **kw: ctx.Process(target=worker, kwargs=kw, daemon=True)  # noqa: E731
    else:
        import queue

        shared = Shared(threading, n + 1)
        out = queue.Queue()
        spawn = lambda **kw: threading.Thread(target=worker, kwargs=kw, daemon=True)  # noqa: E731

    wargs = {"host": args.host, "port": args.port, "file": args.file, "blocks": args.blocks,
             "writers": args.writers, "seed": args.seed, "stop_after_torn": args.stop_after_torn}
    quotas = [args.reads // args.readers + (i < args.reads % args.readers)
              for i in range(args.readers)]
    procs = [spawn(role="writer", wid=i, args=wargs, shared=shared, quota=0, out=out)
             for i in range(args.writers)]
    procs += [spawn(role="reader", wid=i, args=wargs, shared=shared, quota=quotas[i], out=out)
              for i in range(args.readers)]
    for p in procs:
        p.start()
    # Everyone connects and opens first; the clock starts when all are ready.
    try:
        shared.start.wait(120)
    except threading.BrokenBarrierError:
        shared.stop.set()
    t0 = time.time()
    cap = t0 + args.seconds
    results = []
    readers_left = args.readers
    t_readers = None
    while len(results) < n:
        try:
            r = out.get(timeout=max(0.05, cap - time.time()))
        except Exception:  # queue.Empty, from either kind of queue
            if time.time() >= cap:
                shared.stop.set()  # the cap: stop readers and writers
            if time.time() >= cap + 300:
                raise RuntimeError("workers did not stop")
            continue
        results.append(r)
        if r["error"]:
            shared.stop.set()
        if r["role"] == "reader":
            readers_left -= 1
            if readers_left == 0:
                t_readers = time.time()
                shared.stop.set()  # readers done: stop the writers
    for p in procs:
        p.join(30)
    elapsed = max(1e-9, (t_readers or time.time()) - t0)
    reads = sum(r["reads"] for r in results)
    torn = sum(r["torn"] for r in results)
    writes = sum(r["writes"] for r in results)
    errors = [r["error"] for r in results if r["error"]]
    examples = [e for r in results for e in r["examples"]][:10]
    return {
        "tool": "torn_read.py", "client": "nfs-rs", "mode": args.mode,
        "blocks": args.blocks, "writers": args.writers, "readers": args.readers,
        "reads_target": args.reads, "checked_reads": reads, "torn_reads": torn,
        "writes": writes, "seconds": round(elapsed, 3),
        "reads_per_s": round(reads / elapsed, 1), "writes_per_s": round(writes / elapsed, 1),
        "stopped_after_torn": bool(args.stop_after_torn and torn >= args.stop_after_torn),
        "errors": errors, "examples": examples,
    }


def run_on_loop_fs(args: argparse.Namespace) -> dict:
    """`run` against a sluice of our own on a fresh loop-device file system."""
    from pathlib import Path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import fs as fsmod
    from harness.servers import Sluice
    from harness.util import Teardown

    binary = Path(__file__).resolve().parents[1] / "target" / "release" / "sluice"
    if not binary.exists():
        raise RuntimeError("target/release/sluice is missing: cargo build --release")
    with Teardown("torn_read") as td:
        scratch = fsmod.make_scratch(td)
        tfs = fsmod.create_loop_fs(args.fs, scratch, args.blocks * BLOCK, td)
        extra = ["--unsafe-no-range-locks"] if args.unsafe_no_range_locks else []
        server = Sluice(binary, tfs.mountpoint, scratch, extra_args=extra)
        server.start(td)
        args.host, args.port, args.export_dir = "127.0.0.1", server.port, str(tfs.mountpoint)
        result = run(args)
        if not server.alive():
            result["errors"].append(f"sluice exited; log:\n{server.log_tail()}")
        # What the writers left on the server must be consistent too.
        with open(os.path.join(args.export_dir, args.file), "rb") as f:
            data = f.read()
        bad = [b for b in range(args.blocks)
               if check_block(data[b * BLOCK:(b + 1) * BLOCK], b) is not None]
        result["server_file_ok"] = not bad
        if bad and not args.unsafe_no_range_locks:
            result["errors"].append(f"blocks {bad} of the file on the server are not consistent")
    result["fs"] = args.fs
    result["range_locks"] = not args.unsafe_no_range_locks
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="torn-read detector through nfs-rs (NFSv4.1)")
    p.add_argument("--host", default="127.0.0.1")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="NFS port of a running server")
    where.add_argument("--fs", choices=("ext4", "xfs", "btrfs"),
                       help="set up a loop-device file system and a sluice on it (root)")
    p.add_argument("--unsafe-no-range-locks", action="store_true",
                   help="with --fs: start sluice without byte-range locks (must fail)")
    p.add_argument("--file", default="torn.dat", help="export-relative path of the test file")
    p.add_argument("--blocks", type=int, default=64, help="file size in 8 KiB blocks")
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--reads", type=int, default=1_000_000, help="total checked reads to do")
    p.add_argument("--seconds", type=float, default=3600, help="cap on the run's duration")
    p.add_argument("--mode", choices=("thread", "process"), default="thread",
                   help="one nfs-rs client per thread or per process")
    p.add_argument("--export-dir", help="preallocate on the host in this exported directory")
    p.add_argument("--prealloc-chunk", type=int, default=1 << 20, metavar="BYTES",
                   help="write size used to preallocate the file (default 1 MiB)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stop-after-torn", type=int, default=0, metavar="K",
                   help="stop as soon as K torn reads were seen (0: never)")
    args = p.parse_args(argv)
    if args.blocks < 1 or args.writers < 1 or args.readers < 1 or args.reads < 1:
        p.error("--blocks, --writers, --readers and --reads must be positive")
    if args.prealloc_chunk < 1:
        p.error("--prealloc-chunk must be positive")
    if args.unsafe_no_range_locks and not args.fs:
        p.error("--unsafe-no-range-locks needs --fs (it is a server flag)")
    try:
        result = run_on_loop_fs(args) if args.fs else run(args)
    except KeyboardInterrupt:
        print("torn_read.py: interrupted", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - setup failures (connect, prealloc)
        print(f"torn_read.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"checked reads: {result['checked_reads']}")
    print(f"torn reads:    {result['torn_reads']}")
    print(f"writes:        {result['writes']}")
    print(f"duration:      {result['seconds']:.1f} s")
    print(f"reads/s:       {result['reads_per_s']:.0f}")
    print(f"writes/s:      {result['writes_per_s']:.0f}")
    for e in result["examples"]:
        print(f"torn: {e}")
    for e in result["errors"]:
        print(f"error: {e}", file=sys.stderr)
    print(json.dumps(result), flush=True)
    if result["errors"]:
        return 2
    return 1 if result["torn_reads"] else 0


if __name__ == "__main__":
    sys.exit(main())
