"""Installs what the harness needs, idempotently: Debian packages for the
file systems and nfs-ganesha, Python packages for plots and the independent
client, and the release binaries."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from .util import log, run

# Debian packages per need; e2fsprogs (mkfs.ext4) and util-linux (losetup)
# are part of every Debian system.
GANESHA_PACKAGES = ["nfs-ganesha", "nfs-ganesha-vfs"]
# The machine's own limits: the device (fio) and loopback TCP (iperf3).
LIMIT_PACKAGES = ["fio", "iperf3"]
FS_PACKAGES = {"ext4": ["e2fsprogs"], "xfs": ["xfsprogs"], "btrfs": ["btrfs-progs"]}
PYTHON_PACKAGES = {"matplotlib": "matplotlib", "nfs_rs": "nfs-rs"}


def _installed(package: str) -> bool:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return p.returncode == 0 and p.stdout.strip().endswith("ok installed")


def ensure_debian(packages: list[str]) -> None:
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    log(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, timeout=600)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, timeout=1200)


def ensure_python(modules: list[str]) -> None:
    missing = [PYTHON_PACKAGES[m] for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    log(f"installing Python packages: {' '.join(missing)}")
    base = [sys.executable, "-m", "pip", "install", "-q", *missing]
    if subprocess.run(base, capture_output=True).returncode != 0:
        # Debian's system Python refuses plain pip installs (PEP 668).
        run(base + ["--break-system-packages"], timeout=1200)
    importlib.invalidate_caches()


def ensure_all(file_systems: list[str], rpcbind: bool = False) -> None:
    """The packages for `file_systems`, and rpcbind with `rpcbind` (what
    nfs-ganesha's NFSv3 registers with)."""
    packages = list(GANESHA_PACKAGES) + LIMIT_PACKAGES + (["rpcbind"] if rpcbind else [])
    for fs in file_systems:
        packages += FS_PACKAGES.get(fs, [])
    ensure_debian(packages)
    ensure_python(list(PYTHON_PACKAGES))


def build_binaries(repo: Path) -> dict[str, Path]:
    """Builds sluice, sluice-load and sluice-meta in release mode (a no-op when fresh)."""
    log("building sluice, sluice-load and sluice-meta (cargo build --release)")
    run(["cargo", "build", "--release", "--quiet", "-p", "sluice", "-p", "sluice-load"], cwd=repo, timeout=1800)
    return binaries(repo)


def binaries(repo: Path) -> dict[str, Path]:
    found = {name: repo / "target" / "release" / name for name in ("sluice", "sluice-load", "sluice-meta")}
    for path in found.values():
        if not path.is_file():
            raise RuntimeError(f"{path} is missing: build it with 'cargo build --release' or drop --no-build")
    return found
