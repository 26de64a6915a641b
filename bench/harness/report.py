"""Turns raw records into summaries (min/median/max over runs), ratios taken
within a run, markdown tables, PNG plots and docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

from .layouts import LAYOUTS

# --- numbers ------------------------------------------------------------------

GROUP_KEYS = ("fs", "experiment", "case", "cache", "server", "client", "op")

# The measured variants, as (server, client, op).
SLUICE_READ = ("sluice", "sluice-load", "read")
SLUICE_READ_PLUS = ("sluice", "sluice-load", "read_plus")
SLUICE_MIX = ("sluice", "sluice-load", "mix")
GANESHA_READ = ("ganesha", "sluice-load", "read")
RAOFF_READ = ("sluice-ra-off", "sluice-load", "read")
HOLE4K_READ_PLUS = ("sluice-hole4k", "sluice-load", "read_plus")
GANESHA_MIX = ("ganesha", "sluice-load", "mix")
SLUICE_NFSRS = ("sluice", "nfs-rs", "read")
GANESHA_NFSRS = ("ganesha", "nfs-rs", "read")
DIRECT_READ = ("local", "dd", "direct_read")
DIRECT_WRITE = ("local", "dd", "direct_write")
FIO_READ = ("local", "fio", "direct_read_best")
FIO_WRITE = ("local", "fio", "direct_write_best")
LOOPBACK = ("local", "iperf3", "loopback_tcp")
FIO_BESIDE = ("local", "fio+iperf3", "direct_read_beside_loopback")
SLUICE_WRITE = ("sluice", "sluice-load", "write")
GANESHA_WRITE = ("ganesha", "sluice-load", "write")
BUFFERED_READ = ("local", "dd", "buffered_read")
SLUICE_META = ("sluice", "sluice-meta", "meta")
ASYNC_META = ("sluice-async", "sluice-meta", "meta")
GANESHA_META = ("ganesha", "sluice-meta", "meta")
LOCAL_META = ("local", "sluice-meta", "meta")
LOCAL_META_SYNCED = ("local", "sluice-meta", "meta_synced")
SCALE_KINDS = {"8k": "8 KiB reads", "1m": "1 MiB reads"}
SCALE_CONNECTIONS = [1, 4, 16, 64, 256]
# sluice-meta's phases, in the order they run; metrics "meta.PHASE.FIELD".
META_PHASES = ["create", "stat", "readdir", "names", "rename", "remove"]
# The meta cases and their clients (experiments.META_CASES).
META_CASES = {"16-clients": 16, "1-client": 1}
META_FIELDS = ["ops_per_s", "server_cpu_us_per_op", "p50_us", "p99_us"]

LATENCY_FIELDS = ("avg_us", "p50_us", "p99_us", "max_us")


def metric_of(result: dict, metric: str) -> float | None:
    """A figure from one result: a top-level number (mb_per_s, iops,
    wire_data_bytes, bytes) or a latency such as read_p99_us."""
    if metric.startswith("meta."):
        _, phase, field = metric.split(".")
        return ((result.get("phases") or {}).get(phase) or {}).get(field)
    kind, _, field = metric.partition("_")
    if kind in ("read", "write") and field in LATENCY_FIELDS:
        return (result.get(kind) or {}).get(field)
    return result.get(metric)


METRICS = ["mb_per_s", "iops", "wire_data_bytes", "bytes", "server_disk_read_bytes", "disk_per_requested",
           "disk_per_distinct", "server_peak_rss_mib", "server_peak_private_mib", "server_rss_mib", "server_cpu_us_per_op",
           "client_cpu_us_per_op"] + [
    f"{kind}_{field}" for kind in ("read", "write") for field in LATENCY_FIELDS
] + [f"meta.{phase}.{field}" for phase in META_PHASES for field in META_FIELDS]


def stats(values: list[float | None]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def ok(record: dict) -> bool:
    return "error" not in record["result"]


def summarise(records: list[dict]) -> list[dict]:
    """One entry per (fs, experiment, case, cache, server, client, op) with
    min/median/max of every metric over the successful runs."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for rec in records:
        groups[tuple(rec[k] for k in GROUP_KEYS)].append(rec)
    out = []
    for key, recs in groups.items():
        good = [r["result"] for r in recs if ok(r)]
        metrics = {m: stats([metric_of(r, m) for r in good]) for m in METRICS}
        out.append(
            {
                **dict(zip(GROUP_KEYS, key, strict=True)),
                "runs": len(recs),
                "failed_runs": len(recs) - len(good),
                "metrics": {m: s for m, s in metrics.items() if s is not None},
            }
        )
    return out


# Ratios per experiment: (name, numerator variant, denominator variant,
# metric), each taken between two results of the same fs, case, cache and run.
RATIOS = {
    "sparse": [
        ("read_plus/read (sluice)", SLUICE_READ_PLUS, SLUICE_READ, "mb_per_s"),
        ("read_plus 4k holes/read (sluice)", HOLE4K_READ_PLUS, SLUICE_READ, "mb_per_s"),
        ("sluice READ/ganesha READ", SLUICE_READ, GANESHA_READ, "mb_per_s"),
        ("sluice READ_PLUS/ganesha READ", SLUICE_READ_PLUS, GANESHA_READ, "mb_per_s"),
    ],
    "stream": [
        ("sluice/ganesha", SLUICE_READ, GANESHA_READ, "mb_per_s"),
        ("sluice/ganesha (nfs-rs)", SLUICE_NFSRS, GANESHA_NFSRS, "mb_per_s"),
        ("sluice/direct read", SLUICE_READ, DIRECT_READ, "mb_per_s"),
        ("readahead on/off", SLUICE_READ, RAOFF_READ, "mb_per_s"),
        ("sluice/local buffered read", SLUICE_READ, BUFFERED_READ, "mb_per_s"),
        ("ganesha/direct read", GANESHA_READ, DIRECT_READ, "mb_per_s"),
        ("sluice/best device read", SLUICE_READ, FIO_READ, "mb_per_s"),
        ("ganesha/best device read", GANESHA_READ, FIO_READ, "mb_per_s"),
        ("sluice/device beside loopback", SLUICE_READ, FIO_BESIDE, "mb_per_s"),
        ("ganesha/device beside loopback", GANESHA_READ, FIO_BESIDE, "mb_per_s"),
        ("sluice/loopback TCP", SLUICE_READ, LOOPBACK, "mb_per_s"),
        ("ganesha/loopback TCP", GANESHA_READ, LOOPBACK, "mb_per_s"),
    ],
    "mix": [
        ("IOPS sluice/ganesha", SLUICE_MIX, GANESHA_MIX, "iops"),
        ("IOPS sluice/ganesha", SLUICE_READ, GANESHA_READ, "iops"),
        ("read p99 sluice/ganesha", SLUICE_MIX, GANESHA_MIX, "read_p99_us"),
        ("read p99 sluice/ganesha", SLUICE_READ, GANESHA_READ, "read_p99_us"),
        ("write p99 sluice/ganesha", SLUICE_MIX, GANESHA_MIX, "write_p99_us"),
    ],
    "write": [
        ("sluice/ganesha", SLUICE_WRITE, GANESHA_WRITE, "mb_per_s"),
        ("sluice/direct write", SLUICE_WRITE, DIRECT_WRITE, "mb_per_s"),
        ("ganesha/direct write", GANESHA_WRITE, DIRECT_WRITE, "mb_per_s"),
        ("sluice/best device write", SLUICE_WRITE, FIO_WRITE, "mb_per_s"),
        ("ganesha/best device write", GANESHA_WRITE, FIO_WRITE, "mb_per_s"),
        ("write p99 sluice/ganesha", SLUICE_WRITE, GANESHA_WRITE, "write_p99_us"),
    ],
}

RATIOS["scale"] = [
    ("sluice/ganesha", SLUICE_READ, GANESHA_READ, "mb_per_s"),
    ("read p99 sluice/ganesha", SLUICE_READ, GANESHA_READ, "read_p99_us"),
]
RATIOS["meta"] = [
    ratio
    for phase in META_PHASES
    for ratio in (
        (f"{phase} ops/s sluice/ganesha", SLUICE_META, GANESHA_META, f"meta.{phase}.ops_per_s"),
        (f"{phase} CPU/op sluice/ganesha", SLUICE_META, GANESHA_META, f"meta.{phase}.server_cpu_us_per_op"),
        (f"{phase} ops/s sluice-async/ganesha", ASYNC_META, GANESHA_META, f"meta.{phase}.ops_per_s"),
        (f"{phase} ops/s sluice/local synced", SLUICE_META, LOCAL_META_SYNCED, f"meta.{phase}.ops_per_s"),
        (f"{phase} ops/s sluice-async/local", ASYNC_META, LOCAL_META, f"meta.{phase}.ops_per_s"),
    )
]

# The NFSv3 experiments compare the same variants.
for _exp in ("stream", "mix", "write", "meta"):
    RATIOS[_exp + "-v3"] = [r for r in RATIOS[_exp] if "nfs-rs" not in r[0]]


# Ratios between two cases of one experiment, paired by run number (the
# rounds are not the same, the cache state is): (name, experiment,
# (numerator case, variant), (denominator case, variant), metric), recorded
# under the case "NUMERATOR/DENOMINATOR".
CROSS_RATIOS = [
    ("hole READ_PLUS/data READ (sluice)", "sparse", ("hole", SLUICE_READ_PLUS), ("data", SLUICE_READ), "mb_per_s"),
    ("hole READ_PLUS/data READ_PLUS (sluice)", "sparse", ("hole", SLUICE_READ_PLUS), ("data", SLUICE_READ_PLUS),
     "mb_per_s"),
]  # fmt: skip
HOLE_DATA = "hole/data"


def ratios(records: list[dict]) -> list[dict]:
    rounds: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    for rec in records:
        if ok(rec):
            round_key = (rec["fs"], rec["experiment"], rec["case"], rec["cache"], rec["run"])
            rounds[round_key][(rec["server"], rec["client"], rec["op"])] = rec["result"]
    per_group: dict[tuple, list[float]] = defaultdict(list)

    def add(where: tuple, name: str, num: dict | None, den: dict | None, metric: str) -> None:
        if num is not None and den is not None:
            a, b = metric_of(num, metric), metric_of(den, metric)
            if a is not None and b:
                per_group[where + (name,)].append(a / b)

    for (fs, exp, case, cache, _run), results in rounds.items():
        for name, num, den, metric in RATIOS.get(exp, []):
            add((fs, exp, case, cache), name, results.get(num), results.get(den), metric)
    for fs, exp, case, cache, run in list(rounds):
        for name, cross_exp, (num_case, num), (den_case, den), metric in CROSS_RATIOS:
            if exp == cross_exp and case == num_case:
                num_result = rounds[(fs, exp, num_case, cache, run)].get(num)
                den_result = rounds.get((fs, exp, den_case, cache, run), {}).get(den)
                add((fs, exp, f"{num_case}/{den_case}", cache), name, num_result, den_result, metric)
    return [
        {"fs": fs, "experiment": exp, "case": case, "cache": cache, "ratio": name, **stats(values)}
        for (fs, exp, case, cache, name), values in per_group.items()
    ]


def errors(records: list[dict]) -> list[dict]:
    return [
        {k: rec[k] for k in GROUP_KEYS + ("run",)} | {"error": rec["result"]["error"]}
        for rec in records
        if not ok(rec)
    ]


class Index:
    """Look-ups into the summaries and ratios of one result set."""

    def __init__(self, results: dict):
        self.summary = {tuple(e[k] for k in GROUP_KEYS): e for e in results["summary"]}
        self.ratios = {
            (r["fs"], r["experiment"], r["case"], r["cache"], r["ratio"]): r for r in results["ratios"]
        }

    def metric(self, where: tuple, variant: tuple, metric: str = "mb_per_s") -> dict | None:
        """Stats of `metric` for `variant` at `where` = (fs, experiment, case, cache)."""
        entry = self.summary.get(where + variant)
        return entry["metrics"].get(metric) if entry else None

    def ratio(self, where: tuple, name: str) -> dict | None:
        return self.ratios.get(where + (name,))


def file_systems(results: dict, experiment: str) -> list[str]:
    """File systems with results for `experiment`, in run order."""
    return list(dict.fromkeys(e["fs"] for e in results["summary"] if e["experiment"] == experiment))


# --- markdown -----------------------------------------------------------------

STREAM_CASES = [
    "seq-1-stream",
    "seq-1-stream-pagecache",
    "seq-4-streams",
    "random-8k",
    "nfs-rs-seq-1-stream",
    "nfs-rs-seq-1-stream-heap-kept",
]
MIX_CASES = [("randrw-50", SLUICE_MIX, GANESHA_MIX), ("randread-only", SLUICE_READ, GANESHA_READ)]
WRITE_CASES = ["seq-1-stream-unstable", "seq-1-stream-filesync", "seq-4-streams-unstable", "random-8k-unstable",
               "random-8k-filesync"]


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"


def cell(s: dict | None) -> str:
    """'median (min–max)', or just the value when the runs agree."""
    if not s:
        return "–"
    if s["min"] == s["max"]:
        return _num(s["median"])
    return f"{_num(s['median'])} ({_num(s['min'])}–{_num(s['max'])})"


def ratio_cell(s: dict | None) -> str:
    if not s:
        return "–"
    if s["min"] == s["max"]:
        return f"{s['median']:.2f}×"
    return f"{s['median']:.2f}× ({s['min']:.2f}–{s['max']:.2f})"


def bytes_cell(s: dict | None) -> str:
    if not s:
        return "–"
    v = s["median"]
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, without the columns that are empty in every row
    (the variants of servers a run left out)."""
    keep = [i for i in range(len(header)) if not rows or any(row[i] not in ("", "–") for row in rows)]
    header = [header[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def _sparse_tables(ix: Index, fs: str) -> list[str]:
    rows = []
    for layout in LAYOUTS:
        for cache in ("cold", "warm"):
            at = (fs, "sparse", layout.name, cache)
            if ix.metric(at, SLUICE_READ) is None and ix.metric(at, GANESHA_READ) is None:
                continue
            rows.append(
                [
                    layout.name,
                    cache,
                    cell(ix.metric(at, SLUICE_READ)),
                    cell(ix.metric(at, SLUICE_READ_PLUS)),
                    ratio_cell(ix.ratio(at, "read_plus/read (sluice)")),
                    cell(ix.metric(at, HOLE4K_READ_PLUS)),
                    ratio_cell(ix.ratio(at, "read_plus 4k holes/read (sluice)")),
                    cell(ix.metric(at, GANESHA_READ)),
                    ratio_cell(ix.ratio(at, "sluice READ_PLUS/ganesha READ")),
                    bytes_cell(ix.metric(at, SLUICE_READ, "wire_data_bytes")),
                    bytes_cell(ix.metric(at, SLUICE_READ_PLUS, "wire_data_bytes")),
                ]
            )
    header = ["file", "cache", "sluice READ MB/s", "sluice READ_PLUS MB/s", "READ_PLUS/READ",
              "READ_PLUS 4 KiB holes MB/s", "4 KiB holes/READ",
              "ganesha READ MB/s", "sluice READ_PLUS/ganesha READ", "wire data READ", "wire data READ_PLUS"]  # fmt: skip
    return _table(header, rows)


def _sparse_summary(ix: Index, systems: list[str]) -> list[str]:
    """Per file system and cache state: how much faster the all-hole file
    reads with READ_PLUS than the all-data file, and the mixed layout that
    gains least from READ_PLUS (median over runs, and its slowest run)."""
    rows = []
    for fs in systems:
        for cache in ("cold", "warm"):
            hole_data = ix.ratio((fs, "sparse", HOLE_DATA, cache), "hole READ_PLUS/data READ (sluice)")
            hole_data_plus = ix.ratio((fs, "sparse", HOLE_DATA, cache), "hole READ_PLUS/data READ_PLUS (sluice)")
            mixed = {
                layout.name: r
                for layout in LAYOUTS
                if layout.segment
                and (r := ix.ratio((fs, "sparse", layout.name, cache), "read_plus/read (sluice)")) is not None
            }
            worst_median = min(mixed.items(), key=lambda kv: kv[1]["median"], default=None)
            worst_run = min(mixed.items(), key=lambda kv: kv[1]["min"], default=None)
            if not (hole_data or hole_data_plus or mixed):
                continue
            rows.append(
                [
                    fs,
                    cache,
                    ratio_cell(hole_data),
                    ratio_cell(hole_data_plus),
                    f"{worst_median[0]}: {ratio_cell(worst_median[1])}" if worst_median else "–",
                    f"{worst_run[0]}: {worst_run[1]['min']:.2f}×" if worst_run else "–",
                ]
            )
    header = ["fs", "cache", "hole READ_PLUS / data READ", "hole READ_PLUS / data READ_PLUS",
              "mixed layout: lowest median READ_PLUS/READ", "mixed layout: lowest single run"]  # fmt: skip
    return ["#### summary", ""] + _table(header, rows) if rows else []


def _stream_tables(ix: Index, fs: str, experiment: str = "stream") -> list[str]:
    rows = []
    for case in STREAM_CASES:
        nfsrs = case.startswith("nfs-rs")
        sluice, ganesha = (SLUICE_NFSRS, GANESHA_NFSRS) if nfsrs else (SLUICE_READ, GANESHA_READ)
        for cache in ("cold", "warm"):
            at = (fs, experiment, case, cache)
            if ix.metric(at, sluice) is None and ix.metric(at, ganesha) is None:
                continue
            random = case == "random-8k"
            # The machine's limit: the device's best direct read (cold), the
            # loopback TCP ceiling (warm).
            limit, limit_ratio = (FIO_READ, "sluice/best device read") if cache == "cold" else (
                LOOPBACK, "sluice/loopback TCP")  # fmt: skip
            has_limit = ix.metric(at, limit) is not None
            beside = ix.metric(at, FIO_BESIDE) if cache == "cold" else None
            rows.append(
                [
                    case,
                    cache,
                    cell(ix.metric(at, sluice)),
                    cell(ix.metric(at, ganesha)),
                    ratio_cell(ix.ratio(at, "sluice/ganesha (nfs-rs)" if nfsrs else "sluice/ganesha")),
                    cell(ix.metric(at, limit)) if has_limit else "",
                    ratio_cell(ix.ratio(at, limit_ratio)) if has_limit else "",
                    cell(beside) if beside else "",
                    ratio_cell(ix.ratio(at, "sluice/device beside loopback")) if beside else "",
                    cell(ix.metric(at, DIRECT_READ)) if ix.metric(at, DIRECT_READ) else "",
                    ratio_cell(ix.ratio(at, "sluice/direct read")) if ix.metric(at, DIRECT_READ) else "",
                    cell(ix.metric(at, BUFFERED_READ)) if ix.metric(at, BUFFERED_READ) else "",
                    cell(ix.metric(at, RAOFF_READ)) if not nfsrs else "",
                    ratio_cell(ix.ratio(at, "readahead on/off")) if not nfsrs else "",
                    _disk_cell(ix, at, sluice, random),
                    _disk_cell(ix, at, ganesha, random),
                ]
            )
    header = ["case", "cache", "sluice MB/s", "ganesha MB/s", "sluice/ganesha",
              "limit MB/s (cold: fio best direct read; warm: loopback TCP)", "sluice/limit",
              "device beside loopback MB/s", "sluice/device beside loopback", "direct read MB/s",
              "sluice/direct", "local buffered MB/s", "sluice readahead off MB/s", "readahead on/off", "sluice disk/asked",
              "ganesha disk/asked"]  # fmt: skip
    return _table(header, rows)


def _disk_cell(ix: Index, at: tuple, variant: tuple, random: bool) -> str:
    """Storage bytes the server read per byte asked for (cold cache only:
    warm reads should not touch the disk); for random reads, per distinct
    byte asked for."""
    if at[3] != "cold":
        return ""
    s = ix.metric(at, variant, "disk_per_distinct" if random else "disk_per_requested")
    if not s:
        return "–"
    if s["min"] == s["max"]:
        return f"{s['median']:.2f}"
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _mix_tables(ix: Index, fs: str, experiment: str = "mix") -> list[str]:
    rows, ratio_rows = [], []
    for case, *variants in MIX_CASES:
        at = (fs, experiment, case, "cold")
        for variant in variants:
            if ix.metric(at, variant, "iops") is None:
                continue
            latencies = [
                ix.metric(at, variant, f"{kind}_{f}") for kind in ("read", "write") for f in LATENCY_FIELDS
            ]
            rows.append(
                [case, variant[0], cell(ix.metric(at, variant, "iops"))] + [cell(s) for s in latencies]
            )
        for name in ("IOPS sluice/ganesha", "read p99 sluice/ganesha", "write p99 sluice/ganesha"):
            if r := ix.ratio(at, name):
                ratio_rows.append([case, name, ratio_cell(r)])
    header = ["case", "server", "IOPS", "read avg", "read p50", "read p99", "read max",
              "write avg", "write p50", "write p99", "write max"]  # fmt: skip
    return _table(header, rows) + _table(["case", "ratio", "value"], ratio_rows)


def _write_tables(ix: Index, fs: str, experiment: str = "write") -> list[str]:
    rows = []
    for case in WRITE_CASES:
        at = (fs, experiment, case, "cold")
        if ix.metric(at, SLUICE_WRITE) is None and ix.metric(at, GANESHA_WRITE) is None:
            continue
        direct = ix.metric(at, DIRECT_WRITE)
        fio = ix.metric(at, FIO_WRITE)
        rows.append(
            [
                case,
                cell(ix.metric(at, SLUICE_WRITE)),
                cell(ix.metric(at, GANESHA_WRITE)),
                ratio_cell(ix.ratio(at, "sluice/ganesha")),
                cell(fio) if fio else "",
                ratio_cell(ix.ratio(at, "sluice/best device write")) if fio else "",
                cell(direct) if direct else "",
                ratio_cell(ix.ratio(at, "sluice/direct write")) if direct else "",
                ratio_cell(ix.ratio(at, "ganesha/direct write")) if direct else "",
                cell(ix.metric(at, SLUICE_WRITE, "iops")),
                cell(ix.metric(at, SLUICE_WRITE, "write_p99_us")),
                cell(ix.metric(at, GANESHA_WRITE, "write_p99_us")),
            ]
        )
    header = ["case", "sluice MB/s", "ganesha MB/s", "sluice/ganesha", "fio best direct write MB/s",
              "sluice/fio best", "direct write MB/s", "sluice/direct",
              "ganesha/direct", "sluice IOPS", "sluice write p99 us", "ganesha write p99 us"]  # fmt: skip
    return _table(header, rows)


def _scale_cases(ix: Index, fs: str):
    """(case, kind, connections, where) of the scale rounds that ran."""
    for kind in SCALE_KINDS:
        for n in SCALE_CONNECTIONS:
            at = (fs, "scale", f"{kind}-{n}", "warm")
            if ix.metric(at, SLUICE_READ) is not None or ix.metric(at, GANESHA_READ) is not None:
                yield kind, n, at


def _scale_tables(ix: Index, fs: str) -> list[str]:
    rows = [
        [
            SCALE_KINDS[kind],
            str(n),
            cell(ix.metric(at, SLUICE_READ)),
            cell(ix.metric(at, GANESHA_READ)),
            ratio_cell(ix.ratio(at, "sluice/ganesha")),
            cell(ix.metric(at, SLUICE_READ, "read_p99_us")),
            cell(ix.metric(at, GANESHA_READ, "read_p99_us")),
            cell(ix.metric(at, SLUICE_READ, "server_peak_private_mib")),
            cell(ix.metric(at, GANESHA_READ, "server_peak_private_mib")),
            cell(ix.metric(at, SLUICE_READ, "server_peak_rss_mib")),
            cell(ix.metric(at, GANESHA_READ, "server_peak_rss_mib")),
            cell(ix.metric(at, SLUICE_READ, "server_cpu_us_per_op")),
            cell(ix.metric(at, GANESHA_READ, "server_cpu_us_per_op")),
            cell(ix.metric(at, SLUICE_READ, "client_cpu_us_per_op")),
        ]
        for kind, n, at in _scale_cases(ix, fs)
    ]
    header = ["reads", "connections", "sluice MB/s", "ganesha MB/s", "sluice/ganesha", "sluice p99 us",
              "ganesha p99 us", "sluice peak private MiB", "ganesha peak private MiB", "sluice peak RSS MiB",
              "ganesha peak RSS MiB", "sluice CPU us/op",
              "ganesha CPU us/op", "client CPU us/op (sluice)"]  # fmt: skip
    return _table(header, rows)


def _meta_tables(ix: Index, fs: str, experiment: str = "meta") -> list[str]:
    rows = []
    for case, nclients in META_CASES.items():
        at = (fs, experiment, case, "cold")
        for phase in META_PHASES:
            def m(variant, field):
                return ix.metric(at, variant, f"meta.{phase}.{field}")

            if m(SLUICE_META, "ops_per_s") is None and m(GANESHA_META, "ops_per_s") is None:
                continue
            rows.append(
                [
                    str(nclients),
                    phase,
                    cell(m(SLUICE_META, "ops_per_s")),
                    cell(m(GANESHA_META, "ops_per_s")),
                    ratio_cell(ix.ratio(at, f"{phase} ops/s sluice/ganesha")),
                    cell(m(SLUICE_META, "server_cpu_us_per_op")),
                    cell(m(GANESHA_META, "server_cpu_us_per_op")),
                    ratio_cell(ix.ratio(at, f"{phase} CPU/op sluice/ganesha")),
                    cell(m(SLUICE_META, "p99_us")),
                    cell(m(GANESHA_META, "p99_us")),
                    cell(m(ASYNC_META, "ops_per_s")),
                    ratio_cell(ix.ratio(at, f"{phase} ops/s sluice-async/ganesha")),
                    cell(m(LOCAL_META_SYNCED, "ops_per_s")),
                    ratio_cell(ix.ratio(at, f"{phase} ops/s sluice/local synced")),
                    cell(m(LOCAL_META, "ops_per_s")),
                    ratio_cell(ix.ratio(at, f"{phase} ops/s sluice-async/local")),
                ]
            )
    header = ["clients", "phase", "sluice ops/s", "ganesha ops/s", "sluice/ganesha", "sluice CPU us/op",
              "ganesha CPU us/op", "CPU/op sluice/ganesha", "sluice call p99 us", "ganesha call p99 us",
              "sluice --async ops/s", "sluice --async/ganesha", "local synced ops/s", "sluice/local synced",
              "local ops/s", "sluice --async/local"]  # fmt: skip
    return _table(header, rows)


# (experiment, heading, introduction, tables per file system, summary over
# all file systems or None)
SECTIONS = [
    (
        "sparse",
        "### sparse: READ vs READ_PLUS",
        "One sequential pass over each file (sluice-load, 1 stream, 1 MiB requests, 8 in flight). "
        "Layouts: `data`, `hole`, and `mixed-Nd`/`mixed-Nh`: alternating N KiB data and hole segments "
        "starting with data or hole. nfs-ganesha: READ only (see the notes). Wire data: bytes of file "
        "data on the wire (READ_PLUS sends holes as segment headers). `READ_PLUS 4 KiB holes`: a second "
        "sluice with `--read-plus-min-hole 4K`, reporting every hole the file system reports, against "
        "the default 32 KiB threshold, in the same rounds. Summary: the all-hole file against the all-data "
        "file of the same size, paired by run.",
        _sparse_tables,
        _sparse_summary,
    ),
    (
        "stream",
        "### stream: streaming and random reads against the device limit",
        "`seq-1-stream`: one sequential pass, 1 MiB requests, 8 in flight (warm: after one such pass, so "
        "sluice answers from its own read cache); `seq-1-stream-pagecache` (warm only): the same pass over "
        "the file in the page cache alone (each server's own cache emptied, the file read locally); "
        "`seq-4-streams`: four connections each reading a quarter; `random-8k`: 8 KiB random reads, 8 in flight, for the "
        "configured duration; `nfs-rs-seq-1-stream`: the independent nfs-rs client reading the same "
        "file (NFSv4.1, up to 8 reads in flight); `nfs-rs-seq-1-stream-heap-kept` (warm only): the same "
        "client with glibc keeping the memory it frees (`GLIBC_TUNABLES` trim_threshold 1 GiB, "
        "mmap_threshold 16 MiB), since otherwise its own page faults set its rate when replies come "
        "quickly. Limit: for cold rounds the best direct read of the "
        "file on the server's file system by fio (io_uring, 1 MiB requests from huge-page buffers, the "
        "best of queue depths 1, 4, 8, 16 and 32), for warm rounds the loopback TCP ceiling (iperf3, "
        "one stream, the file's size in 1 MiB writes). Device beside loopback (cold): fio's direct read at "
        "its best depth while iperf3 carries a stream paced at fio's rate, twice (the second stream paced at "
        "the first read's rate): what the device gives while the loopback carries the same bytes, as a cold "
        "stream over the wire needs, a bound from above. Direct read: `dd iflag=direct bs=1M` on the server's "
        "file system, in the same rounds as `seq-1-stream`; local buffered: the same `dd` without "
        "`iflag=direct` (the kernel's own readahead for a local reader). `sluice readahead off`: a second sluice "
        "with `--readahead-max 0` in the same rounds. Disk/asked (cold only): bytes the server process "
        "read from storage (`read_bytes` of /proc/PID/io) per byte of file the client asked for; for "
        "`random-8k`, per distinct byte a uniform random pattern of that many reads is expected to "
        "touch, since repeated blocks come from the cache.",
        _stream_tables,
        None,
    ),
    (
        "mix",
        "### mix: random 8 KiB reads and writes on one file",
        "16 connections with one request each (like 16 psync threads), 8 KiB random requests over one "
        "preallocated file, cache dropped before each run: `randrw-50` is 50% writes (UNSTABLE), "
        "`randread-only` the readers-only baseline. Latencies in microseconds; for latency ratios "
        "lower is better.",
        _mix_tables,
        None,
    ),
    (
        "write",
        "### write: WRITE streams and random writes against the device's write rate",
        "Each measurement writes a new file of the configured size: `seq-1-stream-unstable` one "
        "sequential pass of 1 MiB UNSTABLE WRITEs, 8 in flight, then COMMIT (timed with the pass); "
        "`seq-1-stream-filesync` the same with FILE_SYNC WRITEs; `seq-4-streams-unstable` four "
        "connections each writing a quarter; `random-8k-unstable` 8 KiB UNSTABLE WRITEs at random "
        "offsets, 8 in flight, for the configured duration, then COMMIT; `random-8k-filesync` the same "
        "with FILE_SYNC WRITEs (what the Linux 6.1 client sends when a program syncs pieces it wrote "
        "apart), no COMMIT. fio best: the best direct "
        "write of a new file of the same size by fio (io_uring, 1 MiB requests from huge-page buffers, "
        "queue depths 1 to 32, fsync at the end). Direct write: `dd "
        "if=/dev/zero bs=1M oflag=direct conv=fsync` of the same size on the server's file system, in "
        "the same rounds.",
        _write_tables,
        None,
    ),
    (
        "scale",
        "### scale: many connections reading cached data",
        "N connections (each its own NFSv4.1 session, one request at a time) read random 8 KiB or 1 MiB "
        "blocks of a file in the server's page cache (one sequential pass first) for the configured "
        "duration. Throughput over all connections, the p99 latency of one READ, the server's peak "
        "private memory during the measurement (anonymous, shared and huge-page memory, sampled every "
        "50 ms) and its peak resident memory (VmHWM, reset before it). VmHWM also counts the page-cache "
        "pages the server maps: sluice sends cached data from a mapping of the file (lent READs), one that "
        "all the file's readers share, so its VmHWM counts the pages of the file that were read.",
        _scale_tables,
        None,
    ),
    (
        "meta",
        "### meta: metadata operations of 16 clients, and of one",
        "sluice-meta: 16 NFSv4.1 clients (a connection and session each, one request at a time) in "
        "one new directory, cache dropped first. `create`: each client makes its files with OPEN "
        "(create), a 4 KiB UNSTABLE WRITE and CLOSE; `stat`: LOOKUP, GETFH and GETATTR of the "
        "attributes `ls -l` shows, for each of its files; `readdir`: every client lists the whole "
        "directory (READDIR, 256 KiB replies, the attributes the Linux client asks for when `ls -l` "
        "lists, each entry's file handle among them), counted in entries; `names`: the same listing "
        "asking only for what the Linux client asks for when it lists without attributes (`ls`, `find`, "
        "a `nordirplus` mount): each entry's `type` and `mounted_on_fileid` (and `rdattr_error`); "
        "`rename` within the "
        "directory; `remove`. Operations per second over all clients; the server's CPU time (user "
        "and system, /proc/PID/stat) per operation, lower is better; latency of one call (a create "
        "is three calls, a READDIR one). Then the same phases by one client alone, whose every call "
        "waits for the answer to the one before (one process unpacking an archive or checking out a "
        "tree): there each call's turnaround sets the rate. sluice syncs each create, rename and remove "
        "to the disk before it answers (its default, as the Linux server's `sync` exports); nfs-ganesha "
        "does not. `sluice --async`: a second sluice that answers first too, in the same rounds. "
        "Local: the file system's own rate for the same work, as the limit (`sluice-meta --local`): "
        "as many threads as clients make the same calls on the server's file system with system "
        "calls (`openat`, a 4 KiB `write` and `close`; `fstatat`; reading the directory, with an "
        "`fstatat` of each entry for `readdir`; `renameat`; `unlinkat`), in the same rounds; `local "
        "synced` syncs the directory after each create, rename and remove, as sluice's default does "
        "before it answers, and is the limit for sluice, `local` does not and is the limit for "
        "`sluice --async`.",
        _meta_tables,
        None,
    ),
    (
        "stream-v3",
        "### stream-v3: NFSv3 streaming and random reads",
        "The cases of `stream` over NFSv3: sluice-load mounts the export with MOUNT v3 (sluice serves "
        "it on its NFS port, nfs-ganesha on a MOUNT port of its own, registered with rpcbind), then "
        "reads with NFSv3 READ, 1 MiB requests, 8 in flight per stream (`seq-1-stream`, "
        "`seq-4-streams`) or 8 KiB at random offsets (`random-8k`). Direct read: `dd iflag=direct "
        "bs=1M` in the same rounds as `seq-1-stream`. No nfs-rs cross-check (it speaks NFSv4 only).",
        lambda ix, fs: _stream_tables(ix, fs, "stream-v3"),
        None,
    ),
    (
        "mix-v3",
        "### mix-v3: NFSv3 random 8 KiB reads and writes on one file",
        "The cases of `mix` over NFSv3: 16 connections with one request each, 8 KiB random READs and "
        "WRITEs (UNSTABLE, one COMMIT per connection at the end) over one preallocated file, cache "
        "dropped before each run. Latencies in microseconds; for latency ratios lower is better.",
        lambda ix, fs: _mix_tables(ix, fs, "mix-v3"),
        None,
    ),
    (
        "write-v3",
        "### write-v3: NFSv3 WRITE streams and random writes",
        "The cases of `write` over NFSv3: each measurement makes a new file (CREATE) and writes it with "
        "1 MiB WRITEs, UNSTABLE then COMMIT or FILE_SYNC, 1 or 4 streams, or 8 KiB UNSTABLE WRITEs at "
        "random offsets then COMMIT. Direct write: `dd if=/dev/zero bs=1M oflag=direct conv=fsync` in "
        "the same rounds.",
        lambda ix, fs: _write_tables(ix, fs, "write-v3"),
        None,
    ),
    (
        "meta-v3",
        "### meta-v3: NFSv3 metadata operations of 16 clients, and of one",
        "The phases of `meta` over NFSv3: each client mounts the export with MOUNT v3 and keeps the "
        "directory's handle. `create` is CREATE (UNCHECKED, mode 0644) and a 4 KiB UNSTABLE WRITE, two "
        "calls (NFSv3 has no CLOSE); `stat` a LOOKUP, whose reply carries the attributes; `readdir` "
        "READDIRPLUS with 256 KiB replies (dircount an eighth of that, as Linux clients before 5.18 ask), "
        "counted in entries without `.` and `..`; `names` READDIR (names and file ids) with 256 KiB "
        "replies; `rename` RENAME; `remove` REMOVE. The local limits (`local synced`, `local`) are "
        "measured as for `meta`, in the same rounds.",
        lambda ix, fs: _meta_tables(ix, fs, "meta-v3"),
        None,
    ),
]


def markdown_results(results: dict, image_prefix: str) -> str:
    """The result tables and plot links; `image_prefix` is the plots'
    directory relative to the markdown file."""
    ix = Index(results)
    out = [
        f"Each cell is the median over {results['config']['runs']} run(s), with (min–max) when they "
        "differ. Ratios are taken within each run, then summarised the same way. MB/s is 10^6 bytes "
        "of file covered per second.",
        "",
    ]
    if wire := results["environment"].get("wire"):
        out += [wire_sentence(wire), ""]
    for experiment, heading, intro, tables, summary in SECTIONS:
        systems = file_systems(results, experiment)
        if not systems:
            continue
        out += [heading, "", intro, ""]
        for fs in systems:
            out += (
                [f"#### {fs}", ""]
                + tables(ix, fs)
                + [f"![{experiment} {fs}]({image_prefix}{experiment}-{fs}.png)", ""]
            )
        if summary:
            out += summary(ix, systems)

    if results.get("errors"):
        rows = [
            [e["fs"], e["experiment"], e["case"], e["cache"], e["server"], e["op"], str(e["run"]),
             e["error"].replace("|", "/").replace("\n", " ")[:200]]
            for e in results["errors"]
        ]  # fmt: skip
        out += ["### Failed measurements", ""]
        out += _table(["fs", "experiment", "case", "cache", "server", "op", "run", "error"], rows)
    if results.get("failures"):
        out += ["### Aborted file systems", ""]
        out += [f"- {f['fs']}: {(f['error'].splitlines() or ['(no message)'])[0][:300]}" for f in results["failures"]]
        out += [""]
    if results.get("notes"):
        out += ["### Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    return "\n".join(out)


def wire_sentence(wire: dict) -> str:
    m = wire.get("measured") or {}
    measured = (
        f" Measured before the experiments: {m['to_client_mb_per_s']:.1f} MB/s towards the clients, "
        f"{m['to_server_mb_per_s']:.1f} MB/s towards the servers (one TCP stream of "
        f"{m['bytes_each_way'] >> 20} MiB each way), round trip {m['rtt_us_median']:.0f} us (median of "
        "1-byte exchanges)."
        if m
        else ""
    )
    return f"**Wire: {wire['rate']} each way.** {wire['setup']}.{measured}"


def markdown_environment(results: dict) -> str:
    env = results["environment"]

    def show(key, value) -> str:
        if isinstance(value, list):
            return " ".join(map(str, value))
        if isinstance(value, dict):
            return "; ".join(f"{k}: {v}" for k, v in value.items())
        return f"`{value}`" if key == "command" else str(value)

    rows = [[k.replace("_", " "), show(k, v)] for k, v in env.items() if k not in ("file_systems", "wire")]
    if wire := env.get("wire"):
        rows.append(["wire", wire_sentence(wire).replace("**", "")])
    lines = _table(["", ""], rows)
    for fs, d in env.get("file_systems", {}).items():
        lines.append(f"- **{fs}**: " + ", ".join(f"{k} `{v}`" for k, v in d.items() if k != "files"))
    lines.append("")
    return "\n".join(lines)


def results_json(results: dict) -> str:
    """JSON with the long lists (records, summary, ratios, errors) one item
    per line, so that the file stays readable and diffs stay small."""
    parts = []
    for key, value in results.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n  ".join(json.dumps(v, separators=(",", ":")) for v in value)
            parts.append(f"{json.dumps(key)}: [\n  {items}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: " + json.dumps(value, indent=1).replace("\n", "\n "))
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def write_results(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(results_json(results))
    md = [
        "# sluice benchmark results",
        "",
        f"Command: `{results['environment']['command']}`",
        "",
        "## Environment",
        "",
        markdown_environment(results),
        "## Results",
        "",
        markdown_results(results, ""),
    ]
    (out / "results.md").write_text("\n".join(md))


DOC_HEAD = """\
# Benchmarks

`bench/run` measures sluice against nfs-ganesha (Debian packages, VFS backend)
exporting the same directory, on fresh ext4, xfs and btrfs file systems on
loop devices (`losetup --direct-io=on`), with the machine's own limits
measured in the same runs: the device's best direct read and write (fio,
io_uring, huge-page buffers, queue depths 1 to 32, beside `dd`), the
device's read while loopback carries a stream of that rate (fio beside
iperf3: what a cold read over the wire can get) and the loopback TCP
ceiling (iperf3). It installs what it needs, sets everything up, runs the
experiments, tears everything down (also on failure or Ctrl-C) and writes
this page, `results.json` (every raw figure and the environment),
`results.md` and the plots. Run it as root:

```sh
bench/run                                  # everything: ext4, xfs, btrfs; 3 runs; 2 GiB files
bench/run --fs xfs --experiments mix       # a subset
bench/run --experiments sparse --servers sluice --wire 1gbit   # over a 1 Gbit/s link
bench/run --smoke --out /tmp/bench-smoke   # every experiment for a few seconds (the test suite does this)
```

Options: `--fs`, `--experiments sparse,stream,mix,write,meta,scale` (the
default; `stream-v3`, `mix-v3`, `write-v3` and `meta-v3` repeat stream,
mix, write and meta over NFSv3, with rpcbind started for nfs-ganesha when
none runs),
`--meta-files N` (files per client of the meta experiment's 16, and of
its one client alone; default 6250, a 100,000-entry directory),
`--meta-uid UID` (the user, AUTH_SYS uid and gid, the meta experiment's
clients call as; default 0: root, which neither server squashes in these
runs, so neither changes its file system identity for a request, as both
do for a Linux client's users), `--write-uid UID` (the same for the
write experiment's sluice-load; each file is made for that user first),
`--servers
sluice,sluice-ra-off,sluice-hole4k,sluice-async,ganesha` (the servers to start; the
others' variants are left out), `--runs N` (at least 3 for published
figures), `--size` (per test file), `--mixed-layout-size` (the sparse
experiment's mixed-* files, default `--size`), `--mix-size`, `--duration`
(seconds per random or mixed measurement), `--wire RATE`, `--out DIR`
(default `docs/bench/`), `--docs FILE` (this page; written by default only
when `--out` is the default; hand-written text after the marker comment
that ends the generated part is kept), `--tcp-congestion NAME` (the
machine's TCP congestion control for the run, put back at the end; the
environment table names the one used), `--page-reporting-ms MS` (on a
virtual machine whose balloon gives freed pages back to the host, how long
they stay first, for the run, put back at the end; see "Why write
streams swing on this machine" below), `--no-build`. A run that was killed outright (SIGKILL) cannot
tear down; `bench/run --clean-stale` removes what it left (its servers,
network namespace, mounts, loop devices and images under
`/var/tmp/sluice-bench-*`).

`--wire RATE` (e.g. `1gbit`) puts a network between the clients and the
servers: the servers run in a network namespace of their own, joined to
the host by a veth pair with a token bucket (`tc ... tbf`) on both ends, so
both directions are limited to RATE; the clients connect to the
namespace's address. The file systems stay on the host (a network
namespace shares them). Before the experiments the link is measured (one
TCP stream each way and small round trips; a link faster than its rate
stops the run) and the figures go into the results. Warm then means the
file was read once on the server host, not over the link.

Cache states: **cold** = `sync; echo 3 > /proc/sys/vm/drop_caches` and
`blockdev --flushbufs` on the loop device before the measurement, and
sluice's read cache (the data it read with O_DIRECT) emptied with SIGUSR1;
**warm** = one untimed identical pass first. Servers keep running between
measurements, so their metadata caches (sluice's extent maps, ganesha's
metadata cache) stay warm in both states. Within a run the servers are
measured one after the other, in an order rotated by one place each run, so
that every server takes every place and none gains from going first (with
two servers, an even `--runs` puts each first equally often). The experiments come from the design
brief's seeds: readahead and streaming (000), READ_PLUS on sparse files
(001), mixed random reads and writes on one file (002); and from what users
judge a server on besides: writes, metadata (create, stat, READDIR,
rename, remove by 16 clients and by one alone, with the server's CPU
time per operation, and the file system's own rate for the same work by
local threads as its limit)
and many connections (1 to 256, with the server's memory).

"""


# Everything after this line in the page is written by hand (e.g. runs
# with other options) and kept when bench/run rewrites the page.
KEPT_BELOW = "<!-- bench/run rewrites everything above this line and keeps what follows -->"


def write_docs(results: dict, doc: Path, out: Path) -> None:
    doc.parent.mkdir(parents=True, exist_ok=True)
    old = doc.read_text() if doc.exists() else ""
    kept = old.partition(KEPT_BELOW)[2] if KEPT_BELOW in old else "\n"
    prefix = os.path.relpath(out, doc.parent) + "/"
    env = results["environment"]
    lines = [DOC_HEAD]
    if results["config"].get("smoke"):
        lines += [
            "> **Smoke run.** These figures come from `--smoke` (tiny files, one run, short "
            "durations): they prove the pipeline, they are not measurements.",
            "",
        ]
    lines += [
        "## Latest run",
        "",
        f"Command: `{env['command']}`  ",
        f"Date: {env['date']}  ",
        f"Raw figures: [{prefix}results.json]({prefix}results.json)",
        "",
        "### Environment",
        "",
        markdown_environment(results),
        "## Results",
        "",
        markdown_results(results, prefix),
        KEPT_BELOW,
    ]
    doc.write_text("\n".join(lines) + kept)


# --- plots --------------------------------------------------------------------

COLORS = {
    "sluice": "#1f77b4",
    "sluice READ_PLUS": "#2ca02c",
    "sluice readahead off": "#9ecae1",
    "sluice READ_PLUS 4 KiB holes": "#98df8a",
    "ganesha": "#d62728",
}


def _bars(
    ax, groups: list[str], series: dict[str, list[dict | None]], ylabel: str, log: bool = False
) -> None:
    """Grouped bars of medians with min–max error bars."""
    import numpy as np

    series = {name: values for name, values in series.items() if any(values)}
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        med = [v["median"] if v else 0 for v in values]
        lo = [v["median"] - v["min"] if v else 0 for v in values]
        hi = [v["max"] - v["median"] if v else 0 for v in values]
        color = COLORS.get(name, COLORS.get(name.split()[0]))
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar(x + offset, med, width, yerr=[lo, hi], capsize=2, label=name, color=color)
    ax.set_xticks(x, groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")


def _plot_sparse(plt, ix: Index, fs: str):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    names = [layout.name for layout in LAYOUTS]
    for ax, cache in zip(axes, ("cold", "warm"), strict=True):
        bars = {
            label: [ix.metric((fs, "sparse", name, cache), variant) for name in names]
            for label, variant in (
                ("sluice READ", SLUICE_READ),
                ("sluice READ_PLUS", SLUICE_READ_PLUS),
                ("sluice READ_PLUS 4 KiB holes", HOLE4K_READ_PLUS),
                ("ganesha READ", GANESHA_READ),
            )
        }
        _bars(ax, names, bars, "MB/s of file covered (log)", log=True)
        ax.set_title(f"{fs}, {cache} cache")
    fig.suptitle("sparse files: READ vs READ_PLUS (median, min–max)")
    return fig


def _plot_stream(plt, ix: Index, fs: str, experiment: str = "stream"):
    fig, ax = plt.subplots(figsize=(10, 4.5))
    groups, sluice, raoff, ganesha = [], [], [], []
    for case in STREAM_CASES:
        nfsrs = case.startswith("nfs-rs")
        if nfsrs and experiment != "stream":
            continue
        for cache in ("cold", "warm"):
            at = (fs, experiment, case, cache)
            groups.append(f"{case}\n{cache}")
            sluice.append(ix.metric(at, SLUICE_NFSRS if nfsrs else SLUICE_READ))
            raoff.append(None if nfsrs else ix.metric(at, RAOFF_READ))
            ganesha.append(ix.metric(at, GANESHA_NFSRS if nfsrs else GANESHA_READ))
    _bars(ax, groups, {"sluice": sluice, "sluice readahead off": raoff, "ganesha": ganesha}, "MB/s")
    direct = ix.metric((fs, experiment, "seq-1-stream", "cold"), DIRECT_READ)
    if direct:
        ax.axhline(direct["median"], color="k", linestyle="--", linewidth=1, label="direct read (dd)")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"{fs}: {_proto_title(experiment)}streaming and random reads (median, min–max)")
    return fig


def _proto_title(experiment: str) -> str:
    return "NFSv3 " if experiment.endswith("-v3") else ""


def _plot_mix(plt, ix: Index, fs: str, records: list[dict], experiment: str = "mix"):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    iops = {
        server: [ix.metric((fs, experiment, case, "cold"), variants[i], "iops") for case, *variants in MIX_CASES]
        for i, server in enumerate(("sluice", "ganesha"))
    }
    _bars(ax1, [case for case, *_ in MIX_CASES], iops, "IOPS")
    ax1.set_title(f"{fs}: {_proto_title(experiment)}IOPS, 16 clients, 8 KiB")
    # sluice-load reports p50, p99 and max: plot them as points of the
    # complementary CDF (fraction of requests slower than x; the max is the
    # slowest one of `count`), which shows the tail on log scales.
    styles = {("randrw-50", "read"): "-", ("randrw-50", "write"): ":", ("randread-only", "read"): "--"}
    for case, *variants in MIX_CASES:
        at = (fs, experiment, case, "cold")
        for kind in ("read", "write"):
            if (case, kind) not in styles:
                continue
            for variant in variants:
                points = [ix.metric(at, variant, f"{kind}_{q}") for q in ("p50_us", "p99_us", "max_us")]
                count = _median_count(records, at, variant, kind)
                if not all(points) or not count:
                    continue
                ax2.plot(
                    [max(p["median"], 1) for p in points],
                    [0.5, 0.01, 1 / count],
                    styles[(case, kind)],
                    marker="o",
                    color=COLORS[variant[0]],
                    label=f"{variant[0]} {kind} ({case})",
                )
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("latency (us)")
    ax2.set_ylabel("fraction of requests slower")
    ax2.set_title("latency tail: p50, p99, max (median run)")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=7)
    return fig


def _median_count(records: list[dict], at: tuple, variant: tuple, kind: str) -> float | None:
    """Median number of `kind` requests per run at `at` = (fs, experiment, case, cache)."""
    counts = [
        (r["result"].get(kind) or {}).get("count")
        for r in records
        if ok(r)
        and (r["fs"], r["experiment"], r["case"], r["cache"]) == at
        and (r["server"], r["client"], r["op"]) == variant
    ]
    s = stats(counts)
    return s["median"] if s else None


def _plot_write(plt, ix: Index, fs: str, experiment: str = "write"):
    fig, ax = plt.subplots(figsize=(10, 4.5))
    at = [(fs, experiment, case, "cold") for case in WRITE_CASES]
    bars = {
        "sluice": [ix.metric(a, SLUICE_WRITE) for a in at],
        "ganesha": [ix.metric(a, GANESHA_WRITE) for a in at],
    }
    _bars(ax, WRITE_CASES, bars, "MB/s written")
    direct = ix.metric(at[0], DIRECT_WRITE)
    if direct:
        ax.axhline(direct["median"], color="k", linestyle="--", linewidth=1, label="direct write (dd)")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"{fs}: {_proto_title(experiment)}WRITE streams and random writes (median, min–max)")
    return fig


def _plot_scale(plt, ix: Index, fs: str):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, (kind, title) in zip(axes, SCALE_KINDS.items(), strict=True):
        for server, variant in (("sluice", SLUICE_READ), ("ganesha", GANESHA_READ)):
            pts = [(n, ix.metric(at, variant)) for k, n, at in _scale_cases(ix, fs) if k == kind]
            pts = [(n, m) for n, m in pts if m]
            if pts:
                ax.errorbar([n for n, _ in pts], [m["median"] for _, m in pts],
                            yerr=[[m["median"] - m["min"] for _, m in pts], [m["max"] - m["median"] for _, m in pts]],
                            marker="o", capsize=2, label=server, color=COLORS.get(server))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("connections")
        ax.set_ylabel("MB/s")
        ax.set_title(f"{fs}: cached {title} (median, min–max)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _plot_meta(plt, ix: Index, fs: str, experiment: str = "meta"):
    fig, ax = plt.subplots(figsize=(10, 4.5))
    at = (fs, experiment, "16-clients", "cold")
    bars = {
        "sluice": [ix.metric(at, SLUICE_META, f"meta.{p}.ops_per_s") for p in META_PHASES],
        "ganesha": [ix.metric(at, GANESHA_META, f"meta.{p}.ops_per_s") for p in META_PHASES],
    }
    _bars(ax, META_PHASES, bars, "operations/s (readdir, names: entries/s)", log=True)
    ax.set_title(f"{fs}: {_proto_title(experiment)}metadata, 16 clients (median, min–max)")
    return fig


def plot_all(results: dict, out: Path) -> list[str]:
    """Writes the PNG plots into `out` (replacing an earlier run's) and
    returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for old in [*out.glob("sparse-*.png"), *out.glob("stream-*.png"), *out.glob("mix-*.png"),
                *out.glob("write-*.png"), *out.glob("meta-*.png"), *out.glob("scale-*.png")]:
        old.unlink()
    ix = Index(results)
    written = []
    for experiment, draw in (
        ("sparse", lambda fs: _plot_sparse(plt, ix, fs)),
        ("stream", lambda fs: _plot_stream(plt, ix, fs)),
        ("mix", lambda fs: _plot_mix(plt, ix, fs, results["records"])),
        ("write", lambda fs: _plot_write(plt, ix, fs)),
        ("meta", lambda fs: _plot_meta(plt, ix, fs)),
        ("scale", lambda fs: _plot_scale(plt, ix, fs)),
        ("stream-v3", lambda fs: _plot_stream(plt, ix, fs, "stream-v3")),
        ("mix-v3", lambda fs: _plot_mix(plt, ix, fs, results["records"], "mix-v3")),
        ("write-v3", lambda fs: _plot_write(plt, ix, fs, "write-v3")),
        ("meta-v3", lambda fs: _plot_meta(plt, ix, fs, "meta-v3")),
    ):
        for fs in file_systems(results, experiment):
            fig = draw(fs)
            fig.tight_layout()
            name = f"{experiment}-{fs}.png"
            fig.savefig(out / name, dpi=100)
            plt.close(fig)
            written.append(name)
    return written
