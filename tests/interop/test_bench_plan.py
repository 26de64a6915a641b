"""The benchmark's plan: every server takes every place in the measuring
order across runs, so a comparison of two servers (say the old and the new
sluice) is not skewed by one of them always going first."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from harness import experiments  # noqa: E402

sys.path.pop(0)


def config(runs: int) -> experiments.Config:
    return experiments.Config(runs=runs, size=1 << 20, mix_size=1 << 20, duration=1.0, smoke=False)


def test_every_server_takes_every_place():
    servers = ["sluice", experiments.BASELINE, "ganesha"]
    for exp in ("stream", "mix"):
        rounds = experiments.plan(exp, config(len(servers)), servers)
        places = defaultdict(set)
        for rnd in rounds:
            served = [v for v in rnd.variants if v.server != "local"]
            assert rnd.variants[: len(rnd.variants) - len(served)] == [
                v for v in rnd.variants if v.server == "local"
            ], "local figures come first"
            for i, v in enumerate(served):
                places[(rnd.case, rnd.cache, v.server, v.client, v.op)].add((i, len(served)))
        for key, seen in places.items():
            n = next(iter(seen))[1]
            assert {i for i, _ in seen} == set(range(n)), f"{exp} {key} only measured at places {seen}"


def test_two_servers_alternate():
    rounds = experiments.plan("mix", config(4), ["sluice", experiments.BASELINE])
    firsts = [rnd.variants[0].server for rnd in rounds if rnd.case == "randrw-50"]
    assert firsts == ["sluice", experiments.BASELINE, "sluice", experiments.BASELINE]
