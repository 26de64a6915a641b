"""The benchmark harness end to end: `bench/run --smoke` sets up a loop-device
file system, starts sluice and nfs-ganesha, runs every experiment for a few
seconds (and two NFSv3 ones, mix-v3 and meta-v3, for which nfs-ganesha needs rpcbind),
tears everything down and writes results.json, results.md and plots.

This checks the pipeline, not the figures: every planned measurement must
exist, be non-zero and carry no error, and nothing may be left mounted,
attached or running afterwards. With `--wire` the servers sit behind a
rate-limited link in a network namespace: the link must limit what goes
over it, and be gone afterwards, also when the run is stopped by SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import port_111_held

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "run"
sys.path.insert(0, str(REPO / "bench"))
from harness.wire import names_for  # noqa: E402

sys.path.pop(0)
LAYOUTS = ["data", "hole"] + [f"mixed-{k}{s}" for k in (4, 8, 16, 32) for s in "dh"]
# Every NFSv4 experiment, and the quickest NFSv3 ones.
SMOKE_EXPERIMENTS = ["sparse", "stream", "mix", "write", "meta", "scale", "mix-v3", "meta-v3"]
META_PHASES = ["create", "stat", "readdir", "names", "rename", "remove"]
META_UID = 1000

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="bench/run needs root (loop devices, mounts, drop_caches, nfs-ganesha)"
)


def leftovers() -> set[str]:
    """Mounts, loop devices and scratch directories of bench/run processes
    that are gone. Those of runs still going (other users of this machine)
    are not leftovers: each scratch directory names its owner."""
    found = {
        line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if "sluice-bench-" in line
    }
    loops = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "BACK-FILE"], capture_output=True, text=True
    )
    found |= {line.strip() for line in loops.stdout.splitlines() if "sluice-bench-" in line}
    found |= {str(p) for p in Path("/var/tmp").glob("sluice-bench-*")}
    return {path for path in found if not owner_alive(path)}


def owner_alive(path: str) -> bool:
    """Whether the bench/run that made the scratch directory holding `path`
    (/var/tmp/sluice-bench-*/...) is still running."""
    scratch = Path(*Path(path).parts[:4])
    try:
        pid = int((scratch / "owner.pid").read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def smoke(sluice_binary, tmp_path_factory):
    """Runs the smoke benchmark once; yields (results, output directory, stderr)."""
    out = tmp_path_factory.mktemp("bench")
    before = leftovers()
    # mix-v3 and meta-v3 start rpcbind on port 111 for nfs-ganesha.
    with port_111_held():
        p = subprocess.run(
            [
                sys.executable,
                str(BENCH),
                "--smoke",
                "--no-build",
                "--experiments",
                ",".join(SMOKE_EXPERIMENTS),
                # The meta clients, and the write experiment's, as a
                # user, whom both servers take on.
                "--meta-uid",
                str(META_UID),
                "--write-uid",
                str(META_UID),
                "--out",
                str(out),
            ],
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
    assert {r["experiment"] for r in results["records"]} == set(SMOKE_EXPERIMENTS)
    for r in results["records"]:
        assert "error" not in r["result"], r
        if r["experiment"] in ("meta", "meta-v3"):
            assert all(r["result"]["phases"][p]["ops_per_s"] > 0 for p in META_PHASES), r
        else:
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
    # The machine's limits: fio's best direct read (cold rounds only, every
    # queue depth tried) and the loopback TCP ceiling (warm rounds only).
    fio = got[("seq-1-stream", "cold", "local", "fio", "direct_read_best")]
    assert sorted(map(int, fio["by_depth"])) == [1, 4, 8, 16, 32] and fio["mb_per_s"] == max(fio["by_depth"].values())
    assert ("seq-1-stream", "warm", "local", "fio", "direct_read_best") not in got
    assert got[("seq-1-stream", "warm", "local", "iperf3", "loopback_tcp")]["bytes"] >= results["config"]["size"]
    assert ("seq-1-stream", "cold", "local", "iperf3", "loopback_tcp") not in got
    # The device beside a loopback stream (cold only): two fio reads, each
    # beside a stream paced at the rate before it, starting from fio alone.
    beside = got[("seq-1-stream", "cold", "local", "fio+iperf3", "direct_read_beside_loopback")]
    assert beside["depth"] == fio["best_depth"] and beside["alone_mb_per_s"] == fio["mb_per_s"]
    first, second = beside["steps"]
    assert first["stream_target_mb_per_s"] == fio["mb_per_s"]
    assert second["stream_target_mb_per_s"] == first["mb_per_s"] == beside["lower_mb_per_s"]
    assert beside["mb_per_s"] == second["mb_per_s"] > 0
    # fio reads into huge pages beside the stream as it did alone.
    assert first["huge_pages"] == second["huge_pages"] == fio["huge_pages"]
    assert ("seq-1-stream", "warm", "local", "fio+iperf3", "direct_read_beside_loopback") not in got
    names = {r["ratio"] for r in results["ratios"] if r["experiment"] == "stream"}
    assert {"sluice/best device read", "sluice/device beside loopback", "sluice/loopback TCP"} <= names
    for case in ("seq-1-stream", "seq-4-streams", "random-8k"):
        for server in ("sluice", "ganesha"):
            for cache in ("cold", "warm"):
                assert got[(case, cache, server, "sluice-load", "read")]["mb_per_s"] > 0
    for server in ("sluice", "ganesha"):
        assert (
            got[("nfs-rs-seq-1-stream", "cold", server, "nfs-rs", "read")]["bytes"]
            == results["config"]["size"]
        )
        # The heap-kept client runs warm only.
        kept = "nfs-rs-seq-1-stream-heap-kept"
        assert got[(kept, "warm", server, "nfs-rs", "read")]["bytes"] == results["config"]["size"]
        assert (kept, "cold", server, "nfs-rs", "read") not in got


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


def test_mix_v3_runs_over_nfsv3_on_both_servers(smoke):
    results, _, _ = smoke
    got = variants(results, "mix-v3")
    for server in ("sluice", "ganesha"):
        mixed = got[("randrw-50", "cold", server, "sluice-load", "mix")]
        assert mixed["proto"] == "v3" and mixed["iops"] > 0, (server, mixed)
        for kind in ("read", "write"):
            lat = mixed[kind]
            assert lat["count"] > 0 and 0 < lat["p50_us"] <= lat["p99_us"] <= lat["max_us"]
        readers = got[("randread-only", "cold", server, "sluice-load", "read")]
        assert readers["proto"] == "v3" and readers["iops"] > 0 and readers["write"] is None
    # The NFSv4 experiments stayed on NFSv4.
    assert {r["result"]["proto"] for r in results["records"] if r["experiment"] == "mix"} == {"v4"}
    names = {r["ratio"] for r in results["ratios"] if r["experiment"] == "mix-v3"}
    assert "IOPS sluice/ganesha" in names


def test_rpcbind_started_for_nfsv3_is_gone(smoke):
    """nfs-ganesha's NFSv3 needs rpcbind: the run starts one when none is
    running, and stops it (by its PID) at the end."""
    results, _, _ = smoke
    rpcbind = results["environment"]["rpcbind"]
    if rpcbind["started_by_bench"]:
        try:
            argv0 = Path(f"/proc/{rpcbind['pid']}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            argv0 = b""
        assert not argv0.endswith(b"rpcbind"), f"rpcbind (pid {rpcbind['pid']}) outlived the run"


def test_write_reports_both_servers_and_the_device(smoke):
    results, _, _ = smoke
    got = variants(results, "write")
    for case in ("seq-1-stream-unstable", "seq-1-stream-filesync"):
        assert got[(case, "cold", "local", "dd", "direct_write")]["mb_per_s"] > 0
    for case in ("seq-1-stream-unstable", "seq-1-stream-filesync", "seq-4-streams-unstable"):
        for server in ("sluice", "ganesha"):
            r = got[(case, "cold", server, "sluice-load", "write")]
            # A sequential pass writes the whole file, exactly once.
            assert r["bytes"] == results["config"]["size"], (case, server, r["bytes"])
            assert r["write"]["count"] > 0 and r["read"] is None
            assert (r["uid"], r["gid"]) == (META_UID, META_UID), (case, server)
    for server in ("sluice", "ganesha"):
        for case, stable in (("random-8k-unstable", "unstable"), ("random-8k-filesync", "filesync")):
            r = got[(case, "cold", server, "sluice-load", "write")]
            assert r["iops"] > 0 and r["stable"] == stable, (case, server)
            assert (r["uid"], r["gid"]) == (META_UID, META_UID), (case, server)
    assert got[("seq-1-stream-unstable", "cold", "local", "fio", "direct_write_best")]["mb_per_s"] > 0
    names = {r["ratio"] for r in results["ratios"] if r["experiment"] == "write"}
    assert {"sluice/ganesha", "sluice/direct write", "sluice/best device write"} <= names


@pytest.mark.parametrize("experiment", ["meta", "meta-v3"])
def test_meta_runs_every_phase_on_both_servers_with_their_cpu_time(smoke, experiment):
    results, _, _ = smoke
    got = variants(results, experiment)
    servers = ("sluice", "sluice-async", "ganesha")
    for server, (case, nclients) in ((s, c) for s in servers for c in (("16-clients", 16), ("1-client", 1))):
        r = got[(case, "cold", server, "sluice-meta", "meta")]
        assert r["clients"] == nclients, (server, case, r["clients"])
        assert r["proto"] == ("v3" if experiment == "meta-v3" else "v4"), (server, r)
        assert (r["uid"], r["gid"]) == (META_UID, META_UID), (server, r)
        files = r["clients"] * r["files_per_client"]
        phases = r["phases"]
        assert sorted(phases) == sorted(META_PHASES), phases
        for p in ("create", "stat", "rename", "remove"):
            assert phases[p]["ops"] == files and phases[p]["errors"] == 0, (server, p, phases[p])
        # Every client lists the whole directory, with attributes and names only.
        for p in ("readdir", "names"):
            assert phases[p]["ops"] == r["clients"] * files and phases[p]["errors"] == 0, (server, p, phases[p])
        # (One client's 50 creates may take less than a clock tick.)
        cpu = phases["create"]["server_cpu_s"]
        assert cpu is not None and (cpu > 0 or nclients == 1), (server, case, cpu)
    # The file system's own rate for the same work, with and without a
    # sync of the directory after each change, by as many local threads.
    for op, synced in (("meta_synced", True), ("meta", False)):
        for case, nclients in (("16-clients", 16), ("1-client", 1)):
            r = got[(case, "cold", "local", "sluice-meta", op)]
            assert r["proto"] == "local" and r["synced"] is synced and r["clients"] == nclients, r
            files = r["clients"] * r["files_per_client"]
            phases = r["phases"]
            assert sorted(phases) == sorted(META_PHASES), phases
            for p in ("create", "stat", "rename", "remove"):
                assert phases[p]["ops"] == files and phases[p]["errors"] == 0, (op, p, phases[p])
            for p in ("readdir", "names"):
                assert phases[p]["ops"] == r["clients"] * files, (op, p, phases[p])
    names = {r["ratio"] for r in results["ratios"] if r["experiment"] == experiment}
    assert {f"{p} ops/s sluice/ganesha" for p in META_PHASES} <= names
    assert {f"{p} ops/s sluice-async/ganesha" for p in META_PHASES} <= names
    assert {f"{p} ops/s sluice/local synced" for p in META_PHASES} <= names
    assert {f"{p} ops/s sluice-async/local" for p in META_PHASES} <= names


def test_scale_reads_with_many_connections_and_reports_memory_and_cpu(smoke):
    results, _, _ = smoke
    got = variants(results, "scale")
    for kind in ("8k", "1m"):
        for n in (4, 256):  # the smoke run's connection counts
            for server in ("sluice", "ganesha"):
                r = got[(f"{kind}-{n}", "warm", server, "sluice-load", "read")]
                assert r["streams"] == n and r["inflight"] == 1 and r["iops"] > 0, (kind, n, server)
                assert r["read"]["p99_us"] > 0
                assert 0 < r["server_rss_mib"] <= r["server_peak_rss_mib"], (kind, n, server, r)
                # Its own memory, sampled, without the file pages it maps.
                assert 0 < r["server_peak_private_mib"], (kind, n, server, r)
                # The server and the client each spend CPU on every read.
                assert r["server_cpu_us_per_op"] > 0 and r["client_cpu_us_per_op"] > 0, (kind, n, server, r)
    names = {r["ratio"] for r in results["ratios"] if r["experiment"] == "scale"}
    assert {"sluice/ganesha", "read p99 sluice/ganesha"} <= names


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
    for heading in ("### sparse", "### stream", "### mix", "### write", "### meta", "### scale", "### mix-v3",
                    "### meta-v3", "READ_PLUS/READ"):
        assert heading in md
    for plot in results["plots"]:
        assert (out / plot).stat().st_size > 1000
        assert f"]({plot})" in md
    assert len(results["plots"]) == len(SMOKE_EXPERIMENTS) * len(fs)
    # Progress lines during the run.
    assert "(1/" in stderr and "tearing down" in stderr


# --- --wire -------------------------------------------------------------------

WIRE = "1gbit"
WIRE_MB_PER_S = 125.0  # 1 Gbit/s in 10^6 bytes per second
WIRE_SMOKE = ["--smoke", "--wire", WIRE, "--experiments", "sparse", "--servers", "sluice", "--size", "16M"]


def link_exists(pid: int) -> bool:
    """Whether the network namespace or the host's veth of harness `pid` exists."""
    namespace, host_if, _ = names_for(pid)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    has_if = subprocess.run(["ip", "link", "show", host_if], capture_output=True).returncode == 0
    return namespace in listed.split() or has_if


@pytest.fixture(scope="module")
def wire_smoke(sluice_binary, tmp_path_factory):
    """A sparse smoke run over a 1 Gbit/s link; yields (results, output directory, harness pid)."""
    out = tmp_path_factory.mktemp("bench-wire")
    before = leftovers()
    p = subprocess.Popen(
        [sys.executable, str(BENCH), *WIRE_SMOKE, "--no-build", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, f"bench/run --wire failed ({p.returncode}):\n{stderr[-6000:]}"
    assert not link_exists(p.pid), "the network namespace or veth pair outlived the run"
    assert leftovers() <= before, f"bench/run left things behind: {leftovers() - before}"
    return json.loads((out / "results.json").read_text()), out, p.pid


def test_wire_link_is_recorded_measured_and_limited(wire_smoke):
    results, out, pid = wire_smoke
    wire = results["environment"]["wire"]
    assert results["config"]["wire"] == WIRE
    assert wire["namespace"] == names_for(pid)[0]
    assert wire["server_address"] not in ("127.0.0.1", "")
    for direction in ("to_client_mb_per_s", "to_server_mb_per_s"):
        assert 0 < wire["measured"][direction] <= 1.05 * WIRE_MB_PER_S, (direction, wire["measured"])
    assert "Wire: 1 Gbit/s" in (out / "results.md").read_text()


def test_wire_limits_data_but_not_holes(wire_smoke):
    results, _, _ = wire_smoke
    got = variants(results, "sparse")
    assert results["errors"] == []
    for cache in ("cold", "warm"):
        data = got[("data", cache, "sluice", "sluice-load", "read")]
        assert data["bytes"] == results["config"]["size"]
        # On loopback this file reads at about 1 GB/s.
        assert data["mb_per_s"] <= 1.05 * WIRE_MB_PER_S, (cache, data["mb_per_s"])
    # An all-hole file sends no data with READ_PLUS: the link does not bound it.
    hole = got[("hole", "warm", "sluice", "sluice-load", "read_plus")]
    assert hole["wire_data_bytes"] == 0 and hole["mb_per_s"] > WIRE_MB_PER_S, hole
    # Only the chosen server ran.
    assert {r["server"] for r in results["records"]} == {"sluice"}


def test_wire_is_torn_down_on_sigterm(sluice_binary, tmp_path):
    """SIGTERM once the first measurement has started (the namespace exists
    then): the run stops with 130 and removes the namespace, the veth
    pair, its servers, mounts and loop devices."""
    before = leftovers()
    p = subprocess.Popen(
        [sys.executable, str(BENCH), *WIRE_SMOKE, "--no-build", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, p.kill)
    watchdog.start()
    try:
        seen = []
        for line in p.stderr:
            seen.append(line)
            if "(1/" in line:
                break
        assert link_exists(p.pid), "no network namespace while measuring:\n" + "".join(seen[-20:])
        p.send_signal(signal.SIGTERM)
        rest = p.stderr.read()
        p.wait()
    finally:
        watchdog.cancel()
    assert p.returncode == 130, f"exit {p.returncode}:\n{rest[-3000:]}"
    assert not link_exists(p.pid), "the network namespace or veth pair outlived SIGTERM"
    assert leftovers() <= before, f"bench/run left things behind: {leftovers() - before}"
