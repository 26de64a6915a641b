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
    for exp in ("stream", "mix", "stream-v3", "mix-v3"):
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


def test_v3_experiments_measure_and_warm_up_over_nfsv3():
    """stream-v3, mix-v3 and write-v3 repeat their experiment's cases with
    every sluice-load run (warm-ups too) over NFSv3, and run only when
    asked for."""
    assert set(experiments.DEFAULT_EXPERIMENTS) == {"sparse", "stream", "mix", "write", "meta", "scale"}
    servers = ["sluice", "ganesha"]
    for exp in ("stream", "mix", "write"):
        v4 = experiments.plan(exp, config(1), servers)
        v3 = experiments.plan(exp + "-v3", config(1), servers)
        assert v3 and {r.experiment for r in v3} == {exp + "-v3"}
        # The same cases, less what only NFSv4 has (nfs-rs).
        v4_cases = {r.case for r in v4 if not r.case.startswith("nfs-rs")}
        assert {r.case for r in v3} == v4_cases
        for rnd in v3:
            for v in rnd.variants:
                if v.client == "sluice-load":
                    assert v.spec.proto == "v3", (exp, rnd.case, v.server)
                    assert v.warm_spec is None or v.warm_spec.proto == "v3", (exp, rnd.case, v.server)
                else:
                    assert v.server == "local", (exp, rnd.case, v.server, v.client)
        for rnd in v4:
            assert all(v.spec.proto == "v4" for v in rnd.variants if v.spec), (exp, rnd.case)


def test_the_page_cache_stream_is_warm_only_and_warms_without_the_wire():
    """seq-1-stream-pagecache: warm rounds only, next to the loopback
    ceiling, each server's pass warmed by emptying that server's own cache
    and reading the file locally (not by a pass over the wire)."""

    class Fs:
        def __init__(self):
            self.read = []

        def read_through(self, name):
            self.read.append(name)

    class Srv:
        def __init__(self):
            self.dropped = 0

        def drop_caches(self):
            self.dropped += 1

    class Ctx:
        def __init__(self, servers):
            self.fs = Fs()
            self.servers = {s: Srv() for s in servers}

    servers = ["sluice", experiments.BASELINE, "ganesha"]
    for exp in ("stream", "stream-v3"):
        rounds = [r for r in experiments.plan(exp, config(3), servers) if r.case == experiments.PAGECACHE]
        assert len(rounds) == 3 and {r.cache for r in rounds} == {"warm"}, exp
        for rnd in rounds:
            assert [v.op for v in rnd.variants if v.server == "local"] == ["loopback_tcp"]
            for v in rnd.variants:
                if v.server == "local":
                    continue
                ctx = Ctx(servers)
                v.warmup(ctx)
                assert ctx.fs.read == [experiments.STREAM_FILE]
                assert {s: c.dropped for s, c in ctx.servers.items()} == {
                    s: int(s == v.server) for s in servers
                }
