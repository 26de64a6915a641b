"""sluice-meta, the metadata benchmark's client, and sluice-load, the
others': their calls come from the user `--uid` and `--gid` name (root by
default), so that a server works as that user for them, switching its
file system identity as it does for a Linux client's users (bench/run
--meta-uid and --write-uid)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

CLIENTS, FILES = 2, 5


@pytest.mark.parametrize("uid,gid", [(None, None), (4321, 4322)], ids=["root", "user"])
def test_sluice_meta_calls_as_the_user_it_is_given(sluice_factory, uid, gid):
    srv = sluice_factory(metrics=True, root_squash=False)
    work = srv.export / "work"
    work.mkdir()
    work.chmod(0o777)
    meta = srv.binary.with_name("sluice-meta")
    cmd = [str(meta), "--server", f"127.0.0.1:{srv.port}", "--dir", "/work", "--clients", str(CLIENTS)]
    cmd += ["--files", str(FILES), "--phases", "create,stat", "--json"]
    cmd += ["--uid", str(uid), "--gid", str(gid)] if uid is not None else []
    before = srv.counter("sluice_credential_changes")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    want = (uid, gid) if uid is not None else (0, 0)
    assert (r["uid"], r["gid"]) == want
    for phase in ("create", "stat"):
        assert r["phases"][phase]["ops"] == CLIENTS * FILES and r["phases"][phase]["errors"] == 0, r["phases"]
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in work.iterdir()}
    assert len(list(work.iterdir())) == CLIENTS * FILES
    assert owners == {want}, f"files made by sluice-meta --uid {uid} belong to {owners}"
    changes = srv.counter("sluice_credential_changes") - before
    if uid is None:
        # Root, not squashed: the server works as itself, and never switches.
        assert changes == 0, f"{changes} credential changes for root's requests"
    else:
        assert changes > 0, "the server did not take the user's identity"


@pytest.mark.parametrize("proto", ["v4", "v3"])
def test_sluice_load_writes_as_the_user_it_is_given(sluice_factory, proto):
    """sluice-load --uid writes a file of that user's; one of root's with
    mode 0644 it may not write, which it could as root."""
    srv = sluice_factory(metrics=True, root_squash=False)
    theirs, roots = srv.export / "theirs.dat", srv.export / "roots.dat"
    for path, owner in ((theirs, 4321), (roots, 0)):
        path.touch(mode=0o644)
        path.chmod(0o644)
        os.chown(path, owner, owner)
    load = srv.binary.with_name("sluice-load")

    def write(name: str, uid: int | None) -> tuple[int, dict | None, str]:
        cmd = [str(load), "--server", f"127.0.0.1:{srv.port}", "--file", "/" + name, "--mode", "write"]
        cmd += ["--pattern", "seq", "--bs", "65536", "--inflight", "2", "--size", str(1 << 20), "--json"]
        cmd += ["--proto", proto] + (["--uid", str(uid)] if uid is not None else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else None), out.stderr

    before = srv.counter("sluice_credential_changes")
    code, r, err = write("theirs.dat", 4321)
    assert code == 0 and r["errors"] == 0, err
    assert (r["uid"], r["gid"]) == (4321, 4321)
    assert theirs.stat().st_size == 1 << 20
    assert srv.counter("sluice_credential_changes") > before, "the server did not take the user's identity"
    code, r, err = write("roots.dat", 4321)
    assert code != 0 or r["errors"] > 0, "a user wrote root's 0644 file"
    assert roots.stat().st_size == 0
    code, r, err = write("roots.dat", None)
    assert code == 0 and r["errors"] == 0 and (r["uid"], r["gid"]) == (0, 0), err
    assert roots.stat().st_size == 1 << 20
