"""Attributes a listing stat'ed, kept for the next listings.

A listing with attributes (NFSv4.1 READDIR, NFSv3 READDIRPLUS) stats
every entry; sluice keeps what it stat'ed for a moment
(`--listing-cache-ms`, 1000 by default), so that many clients listing one
directory need not stat every entry each. It hears of every change to a
kept file through fanotify, so a listing made right after a local process
changed a file (data, size, mode, times, links, name) must give the file's
new attributes, over both protocols.
"""

from __future__ import annotations

import os
import stat as statmod

import pytest

import rpcclient as rc
import v3client as v
from rpcclient import Conn, Session, St, Unpacker

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

FILES = 60

# READDIR attributes: type, change, size, fileid; mode, numlinks,
# time_metadata, time_modify.
WORD0 = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 20)
WORD1 = (1 << (33 - 32)) | (1 << (35 - 32)) | (1 << (52 - 32)) | (1 << (53 - 32))


def v4_listing(s: Session, dfh: bytes) -> dict[str, dict]:
    """name -> attributes of every entry, from NFSv4.1 READDIRs small
    enough to take several calls."""
    out, cookie, verf, calls = {}, 0, b"\0" * 8, 0
    while True:
        r = s.compound([rc.op_putfh(dfh), rc.op_readdir(cookie, verf, 1024, 4096, (WORD0, WORD1))])
        assert r.status == St.OK, f"READDIR at cookie {cookie}: {r!r}"
        calls += 1
        u = Unpacker(r.undecoded)
        verf = u.fixed(8)
        while u.bool():
            cookie = u.u64()
            name = u.opaque().decode()
            words = u.bitmap()
            assert words[:2] == [WORD0, WORD1], f"{name}: attributes {words} answered for {[WORD0, WORD1]}"
            a = Unpacker(u.opaque())
            out[name] = {
                "type": a.u32(),
                "change": a.u64(),
                "size": a.u64(),
                "fileid": a.u64(),
                "mode": a.u32(),
                "nlink": a.u32(),
                "ctime": (a.i64(), a.u32()),
                "mtime": (a.i64(), a.u32()),
            }
            a.done()
        if u.bool():
            assert calls > 1, "one READDIR listed everything: the test wants several"
            return out


def v3_listing(c: v.Nfs3, dfh: bytes) -> dict[str, dict]:
    """name -> attributes of every entry but . and .., from NFSv3
    READDIRPLUS replies small enough to take several calls."""
    out = {}
    for _fileid, name, a, _fh in c.readdirplus_in_pieces(dfh):
        out[name] = {
            "size": a.size,
            "fileid": a.fileid,
            "mode": a.mode,
            "nlink": a.nlink,
            "ctime": tuple(a.ctime),
            "mtime": tuple(a.mtime),
        }
    return out


def stat_of(p) -> dict:
    st = os.lstat(p)
    return {
        "size": st.st_size,
        "fileid": st.st_ino,
        "mode": statmod.S_IMODE(st.st_mode),
        "nlink": st.st_nlink,
        "ctime": (st.st_ctime_ns // 10**9, st.st_ctime_ns % 10**9),
        "mtime": (st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9),
    }


def assert_listed_as_stat(listed: dict[str, dict], d, what: str):
    names = sorted(p.name for p in d.iterdir())
    assert sorted(listed) == names, f"{what}: listed {sorted(listed)}, the directory holds {names}"
    for name, got in listed.items():
        want = stat_of(d / name)
        seen = {k: got[k] for k in want}
        assert seen == want, f"{what}: {name} listed as {seen}, a stat gives {want}"


def changes(d) -> list[str]:
    """Changes every kind of system call makes, by a local process, one
    file each; the names of the files changed."""
    (d / "f00").write_bytes(b"longer than before")  # data and size
    os.truncate(d / "f01", 1)  # size
    os.chmod(d / "f02", 0o600)  # mode
    os.utime(d / "f03", ns=(7 * 10**9, 7 * 10**9))  # times
    os.link(d / "f04", d / "f04-link")  # links
    os.rename(d / "f05", d / "g05")  # name (and ctime)
    with open(d / "f06", "r+b") as f:  # a write into an open file
        f.seek(3)
        f.write(b"xyz")
    os.setxattr(d / "f07", "user.k", b"v")  # ctime
    return ["f00", "f01", "f02", "f03", "f04", "f04-link", "g05", "f06", "f07"]


def served_dir(sluice_factory, *args):
    """A server (with `args`) whose export holds dir/ with FILES files;
    the server, dir/ on the host, and an NFSv3 target."""
    srv = sluice_factory("--grace-time", 0, *args, metrics=True, root_squash=False)
    d = srv.export / "dir"
    d.mkdir()
    for i in range(FILES):
        (d / f"f{i:02d}").write_bytes(b"f")
    return srv, d, v.sluice_target(srv)


def test_listings_reuse_what_they_stat_and_see_every_local_change(sluice_factory):
    srv, d, target = served_dir(sluice_factory)
    with target.nfs() as c, Conn(srv.port) as conn:
        s = Session(conn)
        dfh = c.must(c.lookup(target.root_fh(), "dir")).fh
        first = v3_listing(c, dfh)
        assert_listed_as_stat(first, d, "first NFSv3 listing")
        before = srv.counter("sluice_listed_attributes_remembered")
        assert_listed_as_stat(v3_listing(c, dfh), d, "second NFSv3 listing")
        assert_listed_as_stat(v4_listing(s, dfh), d, "NFSv4.1 listing")
        remembered = srv.counter("sluice_listed_attributes_remembered") - before
        assert remembered >= 2 * FILES, f"the listings after the first found {remembered} of {2 * FILES} files' attributes kept"

        # Behind the server's back, then listed at once: no listing may
        # give a kept attribute the change made stale.
        changed = changes(d)
        for what, listed in [("NFSv3 after the changes", v3_listing(c, dfh)), ("NFSv4.1 after the changes", v4_listing(s, dfh))]:
            assert_listed_as_stat(listed, d, what)
        # The changed files were stat'ed again, and their new attributes
        # differ from the first listing's where a stat shows the change.
        again = v3_listing(c, dfh)
        for name in ["f00", "f01", "f02", "f03", "f04"]:
            assert again[name] != first[name], f"{name}: listed as before its change"
        assert set(changed) <= set(again)


def test_no_attributes_are_kept_with_a_listing_cache_of_0_ms(sluice_factory):
    srv, d, target = served_dir(sluice_factory, "--listing-cache-ms", 0)
    with target.nfs() as c:
        dfh = c.must(c.lookup(target.root_fh(), "dir")).fh
        for _ in range(3):
            assert_listed_as_stat(v3_listing(c, dfh), d, "NFSv3 listing")
    assert srv.counter("sluice_listed_attributes_remembered") == 0
