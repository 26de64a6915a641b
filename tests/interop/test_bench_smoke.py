"""The benchmark harness end to end: `bench/run --smoke` sets up a loop-device
file system, starts sluice and nfs-ganesha, runs every experiment for a few
seconds, tears everything down and writes results.json, results.md and plots.

This checks the pipeline, not the figures: every planned measurement must
exist, be non-zero and carry no error, and nothing may be left mounted,
attached or running afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "run"
LAYOUTS = ["data", "hole"] + [f"mixed-{k}{s}" for k in (4, 8, 16, 32) for s in "dh"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="bench/run needs root (loop devices, mounts, drop_caches, nfs-ganesha)"
)


def leftovers() -> set[str]:
    """Mounts, loop devices and scratch directories of any bench/run."""
    found = {
        line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if "sluice-bench-" in line
    }
    loops = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "BACK-FILE"], capture_output=True, text=True
    )
    found |= {line.strip() for line in loops.stdout.splitlines() if "sluice-bench-" in line}
    found |= {str(p) for p in Path("/var/tmp").glob("sluice-bench-*")}
    return found


@pytest.fixture(scope="module")
def smoke(sluice_binary, tmp_path_factory):
    """Runs the smoke benchmark once; yields (results, output directory, stderr)."""
    out = tmp_path_factory.mktemp("bench")
    before = leftovers()
    p = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--no-build", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, f"bench/run --smoke failed ({p.returncode}):\n{p.stderr[-6000:]}"
    assert leftovers() <= before, f"bench/run left things behind: {leftovers() - before}"
    return json.loads((out / "results.json").read_text()), out, p.stderr


def variants(results, experiment):
    """(case, cache, server, client, op) -> result, for every record of `experiment`."""
    return {
        (r["case"], r["cache"], r["server"], r["client"], r["op"]): r["result"]
        for r in results["records"]
        if r["experiment"] == experiment
    }


def test_every_experiment_ran_without_errors(smoke):
    results, _, _ = smoke
    assert results["failures"] == []
    assert results["errors"] == []
    assert {r["experiment"] for r in results["records"]} == {"sparse", "stream", "mix"}
    for r in results["records"]:
        assert "error" not in r["result"], r
        assert r["result"]["mb_per_s"] > 0, r


def test_sparse_covers_every_layout_with_read_and_read_plus(smoke):
    results, _, _ = smoke
    got = variants(results, "sparse")
    size = results["config"]["size"]
    for layout in LAYOUTS:
        for cache in ("cold", "warm"):
            for server, op in (("sluice", "read"), ("sluice", "read_plus"), ("ganesha", "read")):
                r = got[(layout, cache, server, "sluice-load", op)]
                assert r["bytes"] == size, (layout, cache, server, op, r)
    # READ ships every byte; READ_PLUS on an all-hole file ships none.
    assert got[("hole", "cold", "sluice", "sluice-load", "read")]["wire_data_bytes"] == size
    assert got[("hole", "cold", "sluice", "sluice-load", "read_plus")]["wire_data_bytes"] == 0
    ratio_names = {r["ratio"] for r in results["ratios"] if r["experiment"] == "sparse"}
    assert "read_plus/read (sluice)" in ratio_names


def test_stream_has_both_servers_the_limit_and_the_independent_client(smoke):
    results, _, _ = smoke
    got = variants(results, "stream")
    assert got[("seq-1-stream", "cold", "local", "dd", "direct_read")]["mb_per_s"] > 0
    for case in ("seq-1-stream", "seq-4-streams", "random-8k"):
        for server in ("sluice", "ganesha"):
            for cache in ("cold", "warm"):
                assert got[(case, cache, server, "sluice-load", "read")]["mb_per_s"] > 0
    for server in ("sluice", "ganesha"):
        assert (
            got[("nfs-rs-seq-1-stream", "cold", server, "nfs-rs", "read")]["bytes"]
            == results["config"]["size"]
        )


def test_mix_reports_iops_and_latencies(smoke):
    results, _, _ = smoke
    got = variants(results, "mix")
    for server in ("sluice", "ganesha"):
        mixed = got[("randrw-50", "cold", server, "sluice-load", "mix")]
        assert mixed["iops"] > 0
        for kind in ("read", "write"):
            lat = mixed[kind]
            assert lat["count"] > 0 and 0 < lat["p50_us"] <= lat["p99_us"] <= lat["max_us"]
        readers = got[("randread-only", "cold", server, "sluice-load", "read")]
        assert readers["iops"] > 0 and readers["write"] is None


def test_outputs_and_environment(smoke):
    results, out, stderr = smoke
    env = results["environment"]
    for key in ("kernel", "sluice_rev", "ganesha_version", "cpus", "date", "command", "cache_states"):
        assert env[key], key
    fs = env["file_systems"]
    assert fs, "no file system recorded"
    for details in fs.values():
        if "loop_direct_io" in details:
            assert details["loop_direct_io"] is True
    md = (out / "results.md").read_text()
    for heading in ("### sparse", "### stream", "### mix", "READ_PLUS/READ"):
        assert heading in md
    for plot in results["plots"]:
        assert (out / plot).stat().st_size > 1000
        assert f"]({plot})" in md
    assert len(results["plots"]) == 3 * len(fs)
    # Progress lines during the run.
    assert "(1/" in stderr and "tearing down" in stderr
