"""The server's memo of file handles, seen through NFSv3 READDIRPLUS.

A listing gives every entry's handle. sluice keeps the handles it asked
the kernel for, so that the next listing of the same entries need not ask
again (a second walk of each name), and forgets one when the kernel says
its inode was deleted (fanotify). Files deleted behind the server's back
give their inode numbers to the next files made (ext4 does so at once):
those must be listed with their own handles, never with the deleted
files' ones.
"""

from __future__ import annotations

import os

import pytest

import v3client as v

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

FILES = 60


def listing(c: v.Nfs3, dfh: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (fileid, handle) of every entry but . and .., from
    READDIRPLUS replies small enough to take several calls."""
    out = {}
    for fileid, name, attrs, fh in c.readdirplus_in_pieces(dfh):
        assert attrs.fileid == fileid, name
        out[name] = (fileid, fh)
    return out


def test_listed_handles_are_remembered_and_right_after_local_deletes(sluice_factory):
    srv = sluice_factory("--grace-time", 0, metrics=True, root_squash=False)
    d = srv.export / "dir"
    d.mkdir()
    for i in range(FILES):
        (d / f"a{i:03d}").write_bytes(b"a")
    target = v.sluice_target(srv)
    with target.nfs() as c:
        dfh = c.must(c.lookup(target.root_fh(), "dir")).fh
        first = listing(c, dfh)
        assert sorted(first) == [f"a{i:03d}" for i in range(FILES)]
        before = srv.counter("sluice_listed_handles_remembered")
        assert listing(c, dfh) == first
        # Every file's handle, and ..'s; an entry that did not fit a reply
        # counts again in the next.
        remembered = srv.counter("sluice_listed_handles_remembered") - before
        assert remembered >= FILES + 1, f"the second listing found {remembered} of {FILES + 1} handles in the memo"

        # Behind the server's back: the files go, new ones take their
        # inode numbers.
        for i in range(FILES):
            (d / f"a{i:03d}").unlink()
        for i in range(FILES):
            (d / f"b{i:03d}").write_bytes(b"b")
        again = listing(c, dfh)
        assert sorted(again) == [f"b{i:03d}" for i in range(FILES)]
        old = {fileid for fileid, _ in first.values()}
        reused = [n for n, (fileid, _) in again.items() if fileid in old]
        assert reused, "no inode number was given again: this file system does not show the case"
        for name, (fileid, fh) in again.items():
            looked_up = c.must(c.lookup(dfh, name)).fh
            assert fh == looked_up, f"{name} (inode {fileid}) listed with a handle LOOKUP does not give"
            assert c.must(c.getattr(fh)).attr.fileid == fileid, name
            assert c.must(c.read(fh, 0, 10)).data == b"b", name
