"""The soak program end to end, briefly: `bench/soak.py --clients 4
--duration 10` starts the real server, runs four nfs-rs clients through
every kind of operation, checks every result and prints its summary.

This checks the program and that a short mixed load is clean (no errors,
no wrong results, no descriptors left behind), not the figures of the
full run (docs/soak.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "bench" / "soak.py"


def test_soak_smoke(sluice_binary, tmp_path):
    out = tmp_path / "soak.json"
    p = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--clients", "4",
            "--duration", "10",
            "--interval", "2",
            "--binary", str(sluice_binary),
            "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, f"soak failed ({p.returncode}):\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    for line in ("summary: 4 clients", "errors: 0", "verification failures: 0", "server RSS MiB:", "server fds:", "result: PASS"):
        assert line in p.stdout, f"{line!r} missing from the summary:\n{p.stdout[-3000:]}"
    assert p.stdout.count("s] ops ") >= 3, "fewer progress lines than expected"
    r = json.loads(out.read_text())
    assert r["result"] == "PASS" and r["errors"] == [] and r["failures"] == []
    # Every kind of operation ran, and a few thousand in all.
    assert all(n > 0 for n in r["ops"].values()), r["ops"]
    assert sum(r["ops"].values()) > 500, r["ops"]
    assert r["bytes_read"] > 0 and r["bytes_written"] > 0
    # Among the checks: the server's connections and open files went with
    # the clients, and RSS stayed within its bounds.
    assert r["checks"] and all(r["checks"].values()), r["checks"]
