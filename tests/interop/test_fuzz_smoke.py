"""A bounded run of each cargo-fuzz target (fuzz/): the decoders and COMPOUND
processing must survive the checked-in seed corpus and everything libFuzzer
derives from it for a short while.

The targets are built with `cargo fuzz build` on the stable toolchain
(RUSTC_BOOTSTRAP=1 lets it take cargo-fuzz's nightly flags); cargo-fuzz is
installed from crates.io when it is missing. Each target then runs for
SLUICE_FUZZ_SECONDS (default 30; `msg`, whose decoders are small and fast,
for MSG_SECONDS) over a copy of its corpus, so the run never
writes into fuzz/corpus/. A crash, panic, timeout or out-of-memory fails the
test with the path of the input that caused it.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FUZZ = REPO / "fuzz"
TARGETS = ["rpc_record", "xdr", "compound", "msg", "nfs3"]
SECONDS = int(os.environ.get("SLUICE_FUZZ_SECONDS", "30"))
# The typed message decoders: a few seconds are hundreds of thousands of runs.
MSG_SECONDS = min(SECONDS, 5)
# NFSv3 and MOUNT calls: one procedure each, no sessions to get through.
NFS3_SECONDS = min(SECONDS, 20)
# A request that blocks this long counts as a hang.
UNIT_TIMEOUT = 10
# The C code in the build (SQLite, which the record store bundles) is not
# instrumented and barely runs under the targets: compiled at -O1 without
# debug information it takes 24 s of CPU instead of about 6 minutes at
# cargo-fuzz's settings. (fuzz/Cargo.toml leaves out the cluster feature,
# etcd-client and its gRPC stack, too.)
ENV = {**os.environ, "RUSTC_BOOTSTRAP": "1", "CFLAGS": os.environ.get("CFLAGS", "-O1 -g0")}


def cargo_fuzz() -> str:
    """The cargo-fuzz binary, installed from crates.io if it is missing."""
    found = shutil.which("cargo-fuzz") or shutil.which("cargo-fuzz", path=str(Path.home() / ".cargo" / "bin"))
    if found:
        return found
    subprocess.run(["cargo", "install", "--locked", "--quiet", "cargo-fuzz"], check=True, timeout=900)
    found = shutil.which("cargo-fuzz") or shutil.which("cargo-fuzz", path=str(Path.home() / ".cargo" / "bin"))
    assert found, "cargo install cargo-fuzz did not put cargo-fuzz on PATH or in ~/.cargo/bin"
    return found


def host_triple() -> str:
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("host:"))


@pytest.fixture(scope="module")
def fuzz_binaries() -> dict[str, Path]:
    """Builds every fuzz target once (release, AddressSanitizer, debug assertions)."""
    tool = cargo_fuzz()
    p = subprocess.run(
        [tool, "fuzz", "build", "--fuzz-dir", str(FUZZ)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert p.returncode == 0, f"cargo fuzz build failed ({p.returncode}):\n{p.stderr[-6000:]}"
    out = FUZZ / "target" / host_triple() / "release"
    bins = {t: out / t for t in TARGETS}
    missing = [str(b) for b in bins.values() if not b.is_file()]
    assert not missing, f"cargo fuzz build did not produce {missing}"
    return bins


def corpus_listing(target: str) -> set[str]:
    return {p.name for p in (FUZZ / "corpus" / target).iterdir()}


def executions(log: str) -> int:
    """Runs libFuzzer reported at the end: "Done N runs" or "#N DONE"."""
    m = re.search(r"^Done (\d+) runs in", log, re.M) or re.search(r"^#(\d+)\s+DONE\b", log, re.M)
    return int(m.group(1)) if m else 0


def describe_failure(log: str, artifacts: Path) -> str:
    found = sorted(p for p in artifacts.iterdir() if p.is_file()) if artifacts.exists() else []
    lines = [f"libFuzzer output (tail):\n{log[-8000:]}"]
    for p in found:
        data = p.read_bytes()
        lines.append(f"failing input: {p} ({len(data)} bytes)")
        lines.append(f"  base64: {base64.b64encode(data[:4096]).decode()}")
    if not found:
        lines.append(f"no input was saved in {artifacts}")
    return "\n".join(lines)


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_survives_bounded_run(target, fuzz_binaries, tmp_path):
    if target == "compound" and os.geteuid() != 0:
        pytest.skip("the compound target runs the server, which needs root (open_by_handle_at)")
    seeds = FUZZ / "corpus" / target
    assert len(list(seeds.iterdir())) > 0, f"no seed corpus in {seeds}"
    before = corpus_listing(target)
    corpus = tmp_path / "corpus"
    shutil.copytree(seeds, corpus)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    log_path = tmp_path / "fuzz.log"
    seconds = MSG_SECONDS if target == "msg" else NFS3_SECONDS if target == "nfs3" else SECONDS
    with open(log_path, "wb") as log:
        p = subprocess.run(
            [
                str(fuzz_binaries[target]),
                str(corpus),
                f"-max_total_time={seconds}",
                f"-timeout={UNIT_TIMEOUT}",
                f"-artifact_prefix={artifacts}/",
                "-print_final_stats=1",
            ],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=seconds + 180,
        )
    log = log_path.read_text(errors="replace")
    assert p.returncode == 0, f"{target}: libFuzzer exited with {p.returncode}\n" + describe_failure(log, artifacts)
    runs = executions(log)
    assert runs > 0, f"{target}: libFuzzer reported no executions\n{log[-4000:]}"
    assert not any(artifacts.iterdir()), describe_failure(log, artifacts)
    assert corpus_listing(target) == before, "the run wrote into the checked-in corpus"
    print(f"{target}: {runs} runs in {seconds} s")
