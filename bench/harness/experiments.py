"""The experiments. Each is planned as a list of rounds; a round measures
every variant of one case (both servers, READ and READ_PLUS, the local
limit) back to back in the same cache state, so that ratios between them are
taken within one round (the records' `run`), then summarised as
min/median/max over rounds.

sparse  READ vs READ_PLUS over data, hole and mixed layouts (seed 001).
stream  sequential streaming (1 and 4 streams) and random 8 KiB reads
        against the device's direct-read rate (seed 000), cross-checked
        with nfs-rs, with sluice's readahead on and off, and the bytes each
        server read from storage.
mix     16 threads of 8 KiB random reads and writes, 50/50, on one
        preallocated file, and a readers-only baseline (seed 002).
write   sequential 1 MiB WRITE streams (UNSTABLE then COMMIT, and
        FILE_SYNC; 1 and 4 streams) and random 8 KiB writes, each on a new
        file, against the device's direct write rate.
scale   1, 4, 16, 64 and 256 connections reading a cached file, 8 KiB
        and 1 MiB random reads, one request each: throughput, p99 and
        the server's memory (peak private memory, and peak RSS) as
        connections grow.
meta    16 NFSv4.1 clients in one new directory (sluice-meta): create
        (OPEN, 4 KiB WRITE, CLOSE), stat (LOOKUP, GETATTR), READDIR of the
        whole directory by every client, rename, remove; operations per
        second and the server's CPU time per operation. Then the same by
        one client alone (each call waiting for the one before, as one
        process unpacking an archive does).

stream-v3, mix-v3, write-v3, meta-v3
        the same over NFSv3 (MOUNT v3, then READ, WRITE, COMMIT; for
        meta CREATE and WRITE, LOOKUP, READDIRPLUS, RENAME, REMOVE),
        sluice against nfs-ganesha's NFSv3; stream-v3 without the nfs-rs
        cross-check (NFSv4 only) and the local buffered read. Not run
        unless asked for.
"""

from __future__ import annotations

import math
import os
import shutil
import threading

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import clients
from .clients import LoadSpec
from .fs import TestFs
from .layouts import LAYOUTS, Layout
from .servers import Server
from .util import MiB, Progress, log

# What a run measures unless --experiments says otherwise.
DEFAULT_EXPERIMENTS = ["sparse", "stream", "mix", "write", "meta", "scale"]
# NFSv3 variants of stream, mix, write and meta.
V3 = "-v3"
EXPERIMENTS = DEFAULT_EXPERIMENTS + ["stream" + V3, "mix" + V3, "write" + V3, "meta" + V3]
# sluice with --readahead-max 0 (server readahead off).
RA_OFF = "sluice-ra-off"
# sluice with --read-plus-min-hole 4K (every hole the file system reports).
HOLE_4K = "sluice-hole4k"
# Another sluice binary (--baseline-binary), measured beside this one.
BASELINE = "sluice-base"
# sluice with --async: changes answered before they are synced, as
# nfs-ganesha answers them (the default syncs each first).
ASYNC = "sluice-async"
# The servers a run can start; the variants of the others are left out.
SERVERS = ["sluice", RA_OFF, HOLE_4K, ASYNC, BASELINE, "ganesha"]
CACHES = ["cold", "warm"]
# The stream case whose warm-up fills the page cache only (see
# `_pagecache_variant`).
PAGECACHE = "seq-1-stream-pagecache"
# nfs-rs with glibc's heap trimming off (clients.HEAP_KEPT).
NFSRS_HEAP_KEPT = "nfs-rs-seq-1-stream-heap-kept"

SEQ_1M = LoadSpec(mode="read", pattern="seq", bs=MiB, inflight=8)


def is_v3(experiment: str) -> bool:
    return experiment.endswith(V3)


def base_experiment(experiment: str) -> str:
    """The experiment an NFSv3 variant repeats (stream for stream-v3)."""
    return experiment.removesuffix(V3)
STREAM_FILE = "data"  # the sparse experiment's fully written file
MIX_FILE = "mixfile"


@dataclass
class Config:
    runs: int
    size: int  # bytes per sparse/stream file
    mix_size: int
    duration: float  # seconds per random or mixed measurement
    smoke: bool
    mixed_layout_size: int = 0  # bytes per mixed-* sparse file; 0: size
    # meta: files each of META_CLIENTS clients makes (16 x 6250: a
    # 100,000-entry directory).
    meta_files: int = 6250
    # meta: the user (AUTH_SYS uid and gid) its clients call as; 0, root,
    # is not squashed in these runs, so no server switches identity.
    meta_uid: int = 0
    # write: the user (AUTH_SYS uid and gid) sluice-load writes as; 0,
    # root. Each file is made for that user before it is written.
    write_uid: int = 0
    # With --wire: the link's rate, and warm-ups read the file on the
    # server host instead of over the link.
    wire_bytes_per_s: float | None = None
    warm_locally: bool = False

    def layout_size(self, layout: Layout) -> int:
        return self.mixed_layout_size if layout.segment and self.mixed_layout_size else self.size

    def pass_seconds(self, nbytes: int) -> float:
        """Rough time of one sequential pass, for the progress estimate."""
        rate = min(ASSUMED_MB_PER_S, self.wire_bytes_per_s or ASSUMED_MB_PER_S)
        return nbytes / rate


@dataclass
class Context:
    """What a measurement needs for one file system."""

    fs: TestFs
    servers: dict[str, Server]
    sluice_load: Path
    config: Config
    progress: Progress
    records: list[dict]

    def local(self, name: str) -> Path:
        return self.fs.mountpoint / name

    def check_servers(self) -> None:
        for s in self.servers.values():
            s.check_alive()


# Rough cost of a measurement, for the progress estimate only (it is
# rescaled by the measured pace as the run goes): a fixed part (starting
# the client, dropping caches) and a sequential pass at this rate.
ASSUMED_MB_PER_S = 400e6
FIXED_SECONDS = 0.5


@dataclass
class Variant:
    """One measured thing within a round: who serves, which client, which op."""

    server: str  # sluice, ganesha, local
    client: str  # sluice-load, nfs-rs, dd
    op: str  # read, read_plus, mix, ...
    measure: Callable[[Context], dict]
    warmup: Callable[[Context], object] | None = None
    seconds: float = 1.0  # expected time of the measurement
    warmup_seconds: float = 0.0  # and of the warm-up pass
    # The file the warm-up reads (None: not a file read, e.g. dd).
    warm_file: str | None = None
    # sluice-load's measurement and warm-up, when it is the client.
    spec: LoadSpec | None = None
    warm_spec: LoadSpec | None = None


@dataclass
class Round:
    """Every variant of one case, back to back, in one cache state."""

    experiment: str
    case: str
    cache: str
    run: int
    variants: list[Variant]
    file_bytes: int

    def cost(self) -> float:
        return sum(self.step_cost(v) for v in self.variants)

    def step_cost(self, v: "Variant") -> float:
        warming = self.cache == "warm" and v.warmup is not None
        return FIXED_SECONDS + v.seconds + (v.warmup_seconds if warming else 0)

    def only(self, servers: list[str]) -> "Round":
        """This round without the variants of servers not in `servers`."""
        kept = [v for v in self.variants if v.server == "local" or v.server in servers]
        return Round(self.experiment, self.case, self.cache, self.run, kept, self.file_bytes)


def _load(server: str, path: str, spec: LoadSpec) -> Callable[[Context], dict]:
    def measure(ctx: Context) -> dict:
        s = ctx.servers[server]
        r = clients.sluice_load(ctx.sluice_load, s.address, path, spec, s.mount_path, s.mount_port)
        r["spec"] = spec.describe()
        if spec.pattern == "seq":
            _check_whole_file(ctx, path, r)
        return r

    return measure


def _load_variant(
    server: str, op: str, path: str, spec: LoadSpec, cfg: Config, warm: LoadSpec | None = None, size: int = 0
) -> Variant:
    """sluice-load runs `spec` on `path` of `size` bytes (default: the
    configured size); the warm-up is one pass of `warm` (default: the same
    as the measurement, which must then be a sequential pass)."""
    warm = warm or spec
    pass_seconds = cfg.pass_seconds(size or cfg.size)
    seconds = pass_seconds if spec.pattern == "seq" else spec.duration
    return Variant(
        server,
        "sluice-load",
        op,
        _load(server, path, spec),
        _load(server, path, warm),
        seconds,
        pass_seconds,
        path,
        spec,
        warm,
    )


def _nfsrs(server: str, path: str, heap_kept: bool = False) -> Callable[[Context], dict]:
    def measure(ctx: Context) -> dict:
        s = ctx.servers[server]
        return _check_whole_file(ctx, path, clients.nfsrs_read(s.host, s.port, path, heap_kept=heap_kept))

    return measure


def _check_whole_file(ctx: Context, path: str, result: dict) -> dict:
    """A sequential pass must cover the file exactly once; anything else (a
    pass cut short, a reply claiming more than was asked) is no figure."""
    if "error" in result:
        return result
    size = ctx.local(path.lstrip("/")).stat().st_size
    if result.get("bytes") != size:
        result["error"] = f"the pass covered {result.get('bytes')} bytes of a {size}-byte file"
    return result


def _dd(name: str, direct: bool = True) -> Callable[[Context], dict]:
    return lambda ctx: clients.dd_direct(ctx.local(name), direct=direct)


def _fio_read(name: str, cfg: Config) -> Variant:
    """The device's best direct read rate (fio, io_uring, queue depths 1 to
    32), in the cold rounds."""
    return Variant("local", "fio", "direct_read_best", lambda ctx: clients.fio_best(ctx.local(name), cfg.size, False),
                   None, len(clients.FIO_DEPTHS) * cfg.pass_seconds(cfg.size))  # fmt: skip


def _fio_beside(name: str, cfg: Config) -> Variant:
    """The device's direct read rate while loopback TCP carries a stream
    of that rate (see `clients.fio_beside_loopback`), in the cold rounds,
    after `_fio_read` in the same round: it starts from that figure."""

    def measure(ctx: Context) -> dict:
        alone = next((r["result"] for r in reversed(ctx.records) if r["op"] == "direct_read_best"
                      and r["fs"] == ctx.fs.name), None)  # fmt: skip
        if alone is None or "error" in alone:
            alone = clients.fio_best(ctx.local(name), cfg.size, False)
            if "error" in alone:
                return alone
        return clients.fio_beside_loopback(ctx.local(name), cfg.size, alone["best_depth"], alone["mb_per_s"])

    return Variant("local", "fio+iperf3", "direct_read_beside_loopback", measure, None,
                   4 * cfg.pass_seconds(cfg.size) + 2.0)  # fmt: skip


def _loopback(cfg: Config) -> Variant:
    """The loopback TCP ceiling for a transfer of the file's size, in the
    warm rounds."""
    return Variant("local", "iperf3", "loopback_tcp", lambda ctx: clients.loopback_tcp(cfg.size), None, 1.0)


def _pagecache_variant(server: str, path: str, spec: LoadSpec, cfg: Config) -> Variant:
    """One sequential pass over a file that the page cache holds but the
    server's own read cache does not (the file a client wrote, or a local
    process read): warmed by emptying the server's own cache and reading
    the file locally, not over the wire."""
    v = _load_variant(server, "read", path, spec, cfg)

    def warm(ctx: Context) -> None:
        ctx.servers[server].drop_caches()
        ctx.fs.read_through(path.lstrip("/"))

    v.warmup = warm
    v.warmup_seconds = cfg.pass_seconds(cfg.size)
    return v


def _only_cache(rounds: list[Round], case: str, cache: str) -> list[Round]:
    """`rounds` without the rounds of `case` in other cache states."""
    return [r for r in rounds if r.case != case or r.cache == cache]


def _cold_limits(rounds: list[Round]) -> list[Round]:
    """The device's limits in the cold rounds only, the loopback's in the
    warm ones."""
    for op in ("direct_read_best", "direct_read_beside_loopback"):
        rounds = _only_in(rounds, op, "cold")
    return _only_in(rounds, "loopback_tcp", "warm")


def _only_in(rounds: list[Round], op: str, cache: str) -> list[Round]:
    """`rounds` with the variant of `op` kept in the rounds of `cache` only."""
    for rnd in rounds:
        if rnd.cache != cache:
            rnd.variants = [v for v in rnd.variants if v.op != op]
    return rounds


def run_round(ctx: Context, rnd: Round) -> None:
    for v in rnd.variants:
        label = f"{ctx.fs.name} {rnd.experiment} {rnd.case} {rnd.cache} run {rnd.run}: {v.server} {v.client} {v.op}"
        ctx.progress.step(label, rnd.step_cost(v))
        if rnd.cache == "cold":
            ctx.fs.drop_caches()
            for s in ctx.servers.values():
                s.drop_caches()
        elif v.warmup is not None and ctx.config.warm_locally and v.warm_file:
            ctx.fs.read_through(v.warm_file.lstrip("/"))  # the server's page cache, not over the wire
        elif v.warmup is not None:
            v.warmup(ctx)  # one untimed pass
        server = ctx.servers.get(v.server)
        disk_before = server.disk_read_bytes() if server else None
        result = v.measure(ctx)
        disk_after = server.disk_read_bytes() if server else None
        if disk_before is not None and disk_after is not None:
            _disk_figures(result, disk_after - disk_before, rnd.file_bytes)
        ctx.check_servers()
        ctx.records.append(
            {
                "fs": ctx.fs.name,
                "experiment": rnd.experiment,
                "case": rnd.case,
                "cache": rnd.cache,
                "run": rnd.run,
                "server": v.server,
                "client": v.client,
                "op": v.op,
                "file_bytes": rnd.file_bytes,
                "result": result,
            }
        )
        log(f"    -> {_headline(result)}")


def _disk_figures(result: dict, disk: int, file_bytes: int) -> None:
    """Bytes the server read from storage during the measurement, per byte
    asked for: `disk_per_requested` over all requested bytes, and for random
    reads `disk_per_distinct` over the distinct blocks a uniform random
    pattern is expected to touch (repeats are served from cache)."""
    result["server_disk_read_bytes"] = disk
    requested = result.get("bytes")
    if requested:
        result["disk_per_requested"] = disk / requested
    bs, ops = result.get("bs"), result.get("ops")
    if result.get("pattern") == "random" and bs and ops and file_bytes >= bs:
        blocks = file_bytes // bs
        distinct = blocks * -math.expm1(-ops / blocks)
        result["disk_per_distinct"] = disk / (distinct * bs)


def _headline(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error'][:300]}"
    if "phases" in r:
        return ", ".join(f"{k} {v.get('ops_per_s', 0):.0f}/s" for k, v in r["phases"].items())
    parts = [f"{r.get('mb_per_s', 0):.1f} MB/s"]
    if "iops" in r:
        parts.append(f"{r['iops']:.0f} IOPS")
    if "disk_per_requested" in r:
        parts.append(f"disk/requested {r['disk_per_requested']:.2f}")
    if "disk_per_distinct" in r:
        parts.append(f"disk/distinct {r['disk_per_distinct']:.2f}")
    for kind in ("read", "write"):
        lat = r.get(kind)
        if isinstance(lat, dict):
            parts.append(f"{kind} p50 {lat['p50_us']} us p99 {lat['p99_us']} us")
    return ", ".join(parts)


def rotated(variants: list[Variant], run: int) -> list[Variant]:
    """The variants in the order run `run` measures them: local figures
    first, then the servers' rotated by one place each run. A server
    measured right after another can find the machine warmer or cooler
    than the first did (page cache, CPU frequency, memory layout), so
    every server takes every place in turn and no server gains from
    always coming first."""
    local = [v for v in variants if v.server == "local"]
    served = [v for v in variants if v.server != "local"]
    k = (run - 1) % len(served) if served else 0
    return local + served[k:] + served[:k]


def _rounds(
    experiment: str, cfg: Config, cases: dict[str, list[Variant]], caches: list[str], file_bytes: int
) -> list[Round]:
    return [
        Round(experiment, case, cache, run, variants, file_bytes)
        for case, variants in cases.items()
        for cache in caches
        for run in range(1, cfg.runs + 1)
    ]


# --- sparse -----------------------------------------------------------------


def plan_sparse(cfg: Config) -> list[Round]:
    plus = LoadSpec(mode="read-plus", pattern="seq", bs=MiB, inflight=8)
    rounds = []
    for layout in LAYOUTS:
        path, size = "/" + layout.name, cfg.layout_size(layout)
        variants = [
            _load_variant("sluice", "read", path, SEQ_1M, cfg, size=size),
            _load_variant("sluice", "read_plus", path, plus, cfg, size=size),
            _load_variant(HOLE_4K, "read_plus", path, plus, cfg, size=size),
            # nfs-ganesha's VFS backend has no usable READ_PLUS (see the notes): READ only.
            _load_variant("ganesha", "read", path, SEQ_1M, cfg, size=size),
        ]
        rounds += _rounds("sparse", cfg, {layout.name: variants}, CACHES, size)
    return rounds


# --- stream -----------------------------------------------------------------


def plan_stream(cfg: Config, proto: str = "v4") -> list[Round]:
    path = "/" + STREAM_FILE
    seq = replace(SEQ_1M, proto=proto)
    four = LoadSpec(mode="read", pattern="seq", bs=MiB, inflight=8, streams=4, proto=proto)
    rand = LoadSpec(mode="read", pattern="random", bs=8192, inflight=8, duration=cfg.duration, proto=proto)
    pass_seconds = cfg.pass_seconds(cfg.size)
    both = ("sluice", "ganesha")
    three = ("sluice", BASELINE, RA_OFF, "ganesha")
    if proto == "v3":
        # NFSv3: the device's limit, both servers (and the variants of
        # sluice); nfs-rs speaks NFSv4 only.
        cases = {
            "seq-1-stream": [Variant("local", "dd", "direct_read", _dd(STREAM_FILE), None, pass_seconds),
                             _fio_read(STREAM_FILE, cfg), _fio_beside(STREAM_FILE, cfg), _loopback(cfg)]
            + [_load_variant(s, "read", path, seq, cfg) for s in three],
            PAGECACHE: [_loopback(cfg)] + [_pagecache_variant(s, path, seq, cfg) for s in three],
            "seq-4-streams": [_load_variant(s, "read", path, four, cfg) for s in three],
            "random-8k": [_load_variant(s, "read", path, rand, cfg, warm=seq) for s in three],
        }
        rounds = _only_cache(_rounds("stream" + V3, cfg, cases, CACHES, cfg.size), PAGECACHE, "warm")
        return _cold_limits(rounds)
    cases = {
        "seq-1-stream": [
            Variant("local", "dd", "direct_read", _dd(STREAM_FILE), None, pass_seconds),
            Variant("local", "dd", "buffered_read", _dd(STREAM_FILE, direct=False), None, pass_seconds),
            _fio_read(STREAM_FILE, cfg),
            _fio_beside(STREAM_FILE, cfg),
            _loopback(cfg),
        ]
        + [_load_variant(s, "read", path, SEQ_1M, cfg) for s in three],
        # Warm from the page cache alone (in the seq-1-stream warm rounds,
        # sluice answers from its own read cache, filled by the pass before).
        PAGECACHE: [_loopback(cfg)] + [_pagecache_variant(s, path, SEQ_1M, cfg) for s in three],
        "seq-4-streams": [_load_variant(s, "read", path, four, cfg) for s in three],
        # Warm for random reads means the whole file is cached: one
        # sequential READ pass first.
        "random-8k": [_load_variant(s, "read", path, rand, cfg, warm=SEQ_1M) for s in three],
        "nfs-rs-seq-1-stream": [
            Variant(s, "nfs-rs", "read", _nfsrs(s, path), _nfsrs(s, path), pass_seconds, pass_seconds, path)
            for s in both
        ],
        # The same client with its freed memory kept (warm only: cold
        # passes wait for the device, not for the client).
        NFSRS_HEAP_KEPT: [
            Variant(
                s, "nfs-rs", "read", _nfsrs(s, path, True), _nfsrs(s, path, True), pass_seconds, pass_seconds, path
            )
            for s in both
        ],
    }
    rounds = _only_cache(_rounds("stream", cfg, cases, CACHES, cfg.size), PAGECACHE, "warm")
    rounds = _only_cache(rounds, NFSRS_HEAP_KEPT, "warm")
    return _cold_limits(rounds)


# --- mix --------------------------------------------------------------------

MIX_STREAMS = 16
MIX_CACHES = ["cold"]


def plan_mix(cfg: Config, proto: str = "v4") -> list[Round]:
    path = "/" + MIX_FILE
    # 16 clients with one request each, like fio's 16 psync threads.
    common = dict(pattern="random", bs=8192, inflight=1, streams=MIX_STREAMS, duration=cfg.duration, proto=proto)
    mixed = LoadSpec(mode="mix", write_pct=50, **common)
    readers = LoadSpec(mode="read", **common)
    warm = replace(SEQ_1M, proto=proto)
    both = ("sluice", BASELINE, "ganesha")
    cases = {
        "randrw-50": [_load_variant(s, "mix", path, mixed, cfg, warm=warm) for s in both],
        "randread-only": [_load_variant(s, "read", path, readers, cfg, warm=warm) for s in both],
    }
    return _rounds("mix" + (V3 if proto == "v3" else ""), cfg, cases, MIX_CACHES, cfg.mix_size)


# --- write ------------------------------------------------------------------

WRITE_FILE = "wfile"
WRITE_CACHES = ["cold"]


def _write_variant(server: str, spec: LoadSpec, cfg: Config) -> Variant:
    """sluice-load writes `spec` into a new file, of a name never used
    before (nfs-ganesha caches names: a file removed behind its back and
    made again under the same name would be written to the old one), and
    the file is emptied and removed afterwards on the server's file
    system (emptied first: a server that still has it open would keep its
    blocks)."""

    def measure(ctx: Context) -> dict:
        name = f"{WRITE_FILE}-{len(ctx.records)}"
        try:
            if spec.uid:
                # The export's root is root's: the file is made there for
                # the user, who then opens it as theirs.
                path = ctx.local(name)
                path.touch(mode=0o644)
                os.chown(path, spec.uid, spec.uid)
            return _load(server, "/" + name, spec)(ctx)
        finally:
            path = ctx.local(name)
            if path.exists():
                os.truncate(path, 0)
                path.unlink()

    seconds = cfg.pass_seconds(cfg.size) if spec.pattern == "seq" else spec.duration
    return Variant(server, "sluice-load", "write", measure, None, seconds, spec=spec)


def plan_write(cfg: Config, proto: str = "v4") -> list[Round]:
    uid = cfg.write_uid
    seq = dict(mode="write", pattern="seq", bs=MiB, inflight=8, size=cfg.size, proto=proto, uid=uid)
    specs = {
        "seq-1-stream-unstable": LoadSpec(stable="unstable", **seq),
        "seq-1-stream-filesync": LoadSpec(stable="file-sync", **seq),
        "seq-4-streams-unstable": LoadSpec(stable="unstable", streams=4, **seq),
        "random-8k-unstable": LoadSpec(mode="write", pattern="random", bs=8192, inflight=8, size=cfg.size,
                                       duration=cfg.duration, proto=proto, uid=uid),
        "random-8k-filesync": LoadSpec(mode="write", pattern="random", bs=8192, inflight=8, size=cfg.size,
                                       duration=cfg.duration, proto=proto, stable="file-sync", uid=uid),
    }  # fmt: skip
    direct = Variant(
        "local",
        "dd",
        "direct_write",
        lambda ctx: clients.dd_direct_write(ctx.local(WRITE_FILE), cfg.size),
        None,
        cfg.pass_seconds(cfg.size),
    )
    fio = Variant(
        "local",
        "fio",
        "direct_write_best",
        lambda ctx: clients.fio_best(ctx.local(WRITE_FILE), cfg.size, True),
        None,
        len(clients.FIO_DEPTHS) * cfg.pass_seconds(cfg.size),
    )
    cases = {
        case: ([direct, fio] if case.startswith("seq-1-stream") else [])
        + [_write_variant(s, spec, cfg) for s in ("sluice", BASELINE, "ganesha")]
        for case, spec in specs.items()
    }
    return _rounds("write" + (V3 if proto == "v3" else ""), cfg, cases, WRITE_CACHES, cfg.size)


# --- meta -------------------------------------------------------------------

META_CLIENTS = 16
# Cases: how many clients work at once. One client alone measures each
# call's turnaround (an archive unpacked, a tree checked out), many the
# server's throughput.
META_CASES = {"16-clients": META_CLIENTS, "1-client": 1}
META_CACHES = ["cold"]
META_PHASES = ["create", "stat", "readdir", "names", "rename", "remove"]
# Rough server rate for the progress estimate (operations per second).
ASSUMED_META_OPS = 5000


def _meta_variant(server: str, cfg: Config, proto: str = "v4", nclients: int = META_CLIENTS) -> Variant:
    """sluice-meta's phases with `nclients` clients in a new directory of a
    name never used before, removed afterwards on the server's file
    system; over NFSv3 after a MOUNT of the export (`proto` v3)."""

    def measure(ctx: Context) -> dict:
        name = f"meta-{len(ctx.records)}"
        path = ctx.local(name)
        path.mkdir()
        path.chmod(0o777)
        try:
            s = ctx.servers[server]
            return clients.sluice_meta(
                ctx.sluice_load.with_name("sluice-meta"), s.address, "/" + name, nclients, cfg.meta_files,
                s.proc.pid if s.proc else None, proto, s.mount_path, s.mount_port, META_PHASES, cfg.meta_uid,
            )
        finally:
            shutil.rmtree(path, ignore_errors=True)

    files = nclients * cfg.meta_files
    # Every client lists the whole directory twice (readdir, names), at
    # roughly 50 times the rate of the other phases' operations.
    seconds = (files * (len(META_PHASES) - 2) + 2 * nclients * files / 50) / ASSUMED_META_OPS
    return Variant(server, "sluice-meta", "meta", measure, None, seconds)


def _meta_local_variant(cfg: Config, nclients: int, synced: bool) -> Variant:
    """sluice-meta's phases done by `nclients` local threads with system
    calls in a new directory of the file system, no server between: the
    file system's own rate for the same work, with (`synced`) the
    directory synced after each change as sluice's default makes, or
    without, as `--async` and nfs-ganesha answer."""

    def measure(ctx: Context) -> dict:
        path = ctx.local(f"meta-local-{len(ctx.records)}")
        path.mkdir()
        try:
            return clients.sluice_meta_local(
                ctx.sluice_load.with_name("sluice-meta"), path, nclients, cfg.meta_files, synced, META_PHASES
            )
        finally:
            shutil.rmtree(path, ignore_errors=True)

    files = nclients * cfg.meta_files
    seconds = files * 3 / (ASSUMED_META_OPS if synced else 10 * ASSUMED_META_OPS)
    return Variant("local", "sluice-meta", "meta_synced" if synced else "meta", measure, None, seconds)


def plan_meta(cfg: Config, proto: str = "v4") -> list[Round]:
    cases = {
        case: [_meta_local_variant(cfg, n, synced) for synced in (True, False)]
        + [_meta_variant(s, cfg, proto, n) for s in ("sluice", ASYNC, BASELINE, "ganesha")]
        for case, n in META_CASES.items()
    }
    return _rounds("meta" + (V3 if proto == "v3" else ""), cfg, cases, META_CACHES, 0)


# --- scale ------------------------------------------------------------------

SCALE_CONNECTIONS = [1, 4, 16, 64, 256]
SCALE_CONNECTIONS_SMOKE = [4, 256]
SCALE_BLOCKS = {"8k": 8192, "1m": MiB}


def _status_kib(pid: int, keys: tuple[str, ...]) -> dict:
    """The fields `keys` of /proc/PID/status that process `pid` has, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = int(value.split()[0])
    return out


def _server_memory(pid: int) -> dict:
    """VmRSS and VmHWM (peak) of process `pid`, in KiB."""
    return _status_kib(pid, ("VmRSS", "VmHWM"))


# Memory of the process's own, not the page cache it maps: a mapped file's
# pages count in VmRSS and VmHWM once for every mapping of them, so a
# server that sends cached file data from mappings (sluice's lent READs)
# shows a peak many times its real use.
PRIVATE_MEMORY = ("RssAnon", "RssShmem", "HugetlbPages")
# How often the private memory is sampled during a measurement.
MEMORY_SAMPLE_S = 0.05


def _private_memory_kib(pid: int) -> int:
    """Anonymous, shared-memory and huge-page memory of process `pid`, KiB."""
    return sum(_status_kib(pid, PRIVATE_MEMORY).values())


class _PeakPrivateMemory:
    """Samples a process's private memory in a thread until stopped; the
    peak is the largest sample (0 when the process went away)."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.peak = max(self.peak, _private_memory_kib(self.pid))
            except (OSError, ValueError):
                return
            if self._stop.wait(MEMORY_SAMPLE_S):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        try:
            self.peak = max(self.peak, _private_memory_kib(self.pid))
        except (OSError, ValueError):
            pass
        return self.peak


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _with_server_figures(server: str, measure: Callable[[Context], dict]) -> Callable[[Context], dict]:
    """`measure`, with the server's peak RSS during it (the kernel's
    high-water mark, reset first), its peak private memory (sampled every
    MEMORY_SAMPLE_S: RSS without the file pages it maps), its RSS at the
    end, and the CPU time
    per operation of the server and of the client (sluice-load, the one
    child that ends meanwhile), so that a fall in throughput can be put
    on the side that costs more."""

    def run(ctx: Context) -> dict:
        pid = ctx.servers[server].proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5\n")  # resets VmHWM
        server_cpu = _cpu_seconds(pid)
        children = os.times()
        private = _PeakPrivateMemory(pid)
        try:
            result = measure(ctx)
        finally:
            peak_private = private.stop()
        server_cpu = _cpu_seconds(pid) - server_cpu
        after = os.times()
        client_cpu = (after.children_user - children.children_user) + (after.children_system - children.children_system)
        mem = _server_memory(pid)
        result["server_peak_rss_mib"] = mem.get("VmHWM", 0) / 1024
        result["server_rss_mib"] = mem.get("VmRSS", 0) / 1024
        result["server_peak_private_mib"] = peak_private / 1024
        ops = result.get("ops") or 0
        if ops > 0:
            result["server_cpu_us_per_op"] = server_cpu * 1e6 / ops
            result["client_cpu_us_per_op"] = client_cpu * 1e6 / ops
        return result

    return run


def plan_scale(cfg: Config) -> list[Round]:
    path = "/" + STREAM_FILE
    counts = SCALE_CONNECTIONS_SMOKE if cfg.smoke else SCALE_CONNECTIONS
    cases = {}
    for kind, bs in SCALE_BLOCKS.items():
        for n in counts:
            spec = LoadSpec(mode="read", pattern="random", bs=bs, inflight=1, streams=n, duration=cfg.duration)
            variants = []
            for s in ("sluice", BASELINE, "ganesha"):
                v = _load_variant(s, "read", path, spec, cfg, warm=SEQ_1M)
                v.measure = _with_server_figures(s, v.measure)
                variants.append(v)
            cases[f"{kind}-{n}"] = variants
    return _rounds("scale", cfg, cases, ["warm"], cfg.size)


PLANS = {
    "scale": plan_scale,
    "meta": plan_meta,
    "sparse": plan_sparse,
    "stream": plan_stream,
    "mix": plan_mix,
    "write": plan_write,
    "stream" + V3: lambda cfg: plan_stream(cfg, "v3"),
    "mix" + V3: lambda cfg: plan_mix(cfg, "v3"),
    "write" + V3: lambda cfg: plan_write(cfg, "v3"),
    "meta" + V3: lambda cfg: plan_meta(cfg, "v3"),
}


def plan(experiment: str, cfg: Config, servers: list[str]) -> list[Round]:
    """The rounds of `experiment`, with the variants of `servers` only."""
    rounds = [rnd.only(servers) for rnd in PLANS[experiment](cfg)]
    for rnd in rounds:
        rnd.variants = rotated(rnd.variants, rnd.run)
    return [rnd for rnd in rounds if rnd.variants]
