"""Extended attributes (RFC 8276), over raw RPC.

GETXATTR, SETXATTR (either, create, replace), LISTXATTRS (with cookies
and maxcount) and REMOVEXATTR act on the file's own "user." attributes:
a name on the wire is the file's user.NAME, seen by local processes too.
"""

from __future__ import annotations

import os

import pytest

import rpcclient as rc
from rpcclient import (
    SETXATTR4_CREATE,
    SETXATTR4_REPLACE,
    Client,
    St,
    expect,
    expect_ok,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

XATTR_SUPPORT_WORDS = (0, 0, 1 << (82 - 64))
ACCESS_XAREAD, ACCESS_XAWRITE, ACCESS_XALIST = 0x40, 0x80, 0x100


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, root_squash=False)


def on(c: Client, name: str, *ops, minor: int = 2):
    """PUTROOTFH, LOOKUP name, ops, in an NFSv4.2 COMPOUND."""
    return c.compound([rc.op_putrootfh(), rc.op_lookup(name), *ops], minor=minor)


def make(srv, name: str = "f", data: bytes = b"data\n"):
    p = srv.export / name
    p.write_bytes(data)
    return p


def test_set_get_list_remove_round_trip(srv):
    path = make(srv)
    c = Client(srv.port).establish()
    r = expect_ok(on(c, "f", rc.op_setxattr(b"color", b"blue")), "SETXATTR")
    assert r[3].after != r[3].before, "the change attribute did not move"
    assert os.getxattr(path, "user.color") == b"blue", "not the file's user.color"
    r = expect_ok(on(c, "f", rc.op_getxattr(b"color")), "GETXATTR")
    assert r[3].value == b"blue"
    os.setxattr(path, "user.local", b"set on the server")
    r = expect_ok(on(c, "f", rc.op_listxattrs()), "LISTXATTRS")
    assert sorted(r[3].names) == [b"color", b"local"] and r[3].eof
    r = expect_ok(on(c, "f", rc.op_getxattr(b"local")), "GETXATTR of an attribute set locally")
    assert r[3].value == b"set on the server"
    r = expect_ok(on(c, "f", rc.op_removexattr(b"color")), "REMOVEXATTR")
    assert r[3].after != r[3].before
    assert "user.color" not in os.listxattr(path)
    expect(on(c, "f", rc.op_getxattr(b"color")), St.NOXATTR, "GETXATTR of a removed attribute")
    expect(on(c, "f", rc.op_removexattr(b"color")), St.NOXATTR, "REMOVEXATTR of a removed attribute")
    # An empty value is a value.
    expect_ok(on(c, "f", rc.op_setxattr(b"empty", b"")), "SETXATTR of an empty value")
    assert expect_ok(on(c, "f", rc.op_getxattr(b"empty")), "GETXATTR")[3].value == b""


def test_create_and_replace(srv):
    make(srv)
    c = Client(srv.port).establish()
    expect(on(c, "f", rc.op_setxattr(b"a", b"1", SETXATTR4_REPLACE)), St.NOXATTR, "REPLACE of a missing attribute")
    expect_ok(on(c, "f", rc.op_setxattr(b"a", b"1", SETXATTR4_CREATE)), "CREATE")
    expect(on(c, "f", rc.op_setxattr(b"a", b"2", SETXATTR4_CREATE)), St.EXIST, "CREATE of an existing attribute")
    expect_ok(on(c, "f", rc.op_setxattr(b"a", b"3", SETXATTR4_REPLACE)), "REPLACE")
    assert expect_ok(on(c, "f", rc.op_getxattr(b"a")), "GETXATTR")[3].value == b"3"
    expect(on(c, "f", rc.op_setxattr(b"a", b"4", 7)), St.INVAL, "an unknown setxattr_option4")


def test_names_and_limits(srv):
    make(srv)
    c = Client(srv.port).establish()
    expect(on(c, "f", rc.op_getxattr(b"")), St.INVAL, "GETXATTR of an empty name")
    expect(on(c, "f", rc.op_setxattr(b"a\0b", b"1")), St.INVAL, "a name with a NUL")
    # 255 bytes with "user.": the longest name.
    expect_ok(on(c, "f", rc.op_setxattr(b"n" * 250, b"1")), "the longest name")
    expect(on(c, "f", rc.op_setxattr(b"n" * 251, b"1")), St.NAMETOOLONG, "a name one byte too long")
    expect(on(c, "f", rc.op_setxattr(b"big", b"v" * (64 * 1024 + 1))), St.XATTR2BIG, "a value past 64 KiB")
    # What the file system takes decides below that (ext4: about a block).
    r = on(c, "f", rc.op_setxattr(b"big", b"v" * (64 * 1024)))
    assert r.status in (St.OK, St.XATTR2BIG, St.NOSPC), r


def test_list_with_cookies_and_maxcount(srv):
    path = make(srv)
    names = [f"attr{i}".encode() for i in range(5)]
    for n in names:
        os.setxattr(path, "user." + n.decode(), b"v")
    # Not in the user namespace: not listed.
    os.setxattr(path, "trusted.hidden", b"v")
    c = Client(srv.port).establish()
    # cookie + count + eof = 16 bytes, "attrN" = 4 + 8 bytes each.
    got, cookie, calls = [], 0, 0
    while True:
        r = expect_ok(on(c, "f", rc.op_listxattrs(cookie, 16 + 2 * 12)), "LISTXATTRS")
        calls += 1
        assert len(r[3].names) <= 2
        got += r[3].names
        cookie = r[3].cookie
        if r[3].eof:
            break
        assert calls < 10
    assert sorted(got) == names and calls == 3
    expect(on(c, "f", rc.op_listxattrs(0, 16 + 11)), St.TOOSMALL, "maxcount too small for one name")
    expect(on(c, "f", rc.op_listxattrs(6, 4096)), St.BAD_COOKIE, "a cookie past the end")
    # The cookie of the last page (the number of names) is one the server
    # gave out: an empty last page (the Linux server: BAD_COOKIE).
    r = expect_ok(on(c, "f", rc.op_listxattrs(5, 4096)), "a cookie at the end")
    assert r[3].names == [] and r[3].eof


def test_directories_have_them_symlinks_do_not(srv):
    (srv.export / "d").mkdir()
    os.symlink("d", srv.export / "l")
    c = Client(srv.port).establish()
    expect_ok(on(c, "d", rc.op_setxattr(b"dir", b"yes")), "SETXATTR on a directory")
    assert os.getxattr(srv.export / "d", "user.dir") == b"yes"
    expect(on(c, "l", rc.op_setxattr(b"x", b"1")), St.PERM, "SETXATTR on a symlink")
    expect(on(c, "l", rc.op_getxattr(b"x")), St.NOXATTR, "GETXATTR on a symlink")
    r = expect_ok(on(c, "l", rc.op_listxattrs()), "LISTXATTRS on a symlink")
    assert r[3].names == [] and r[3].eof
    # The export root is a directory like any other.
    expect(c.compound([rc.op_putrootfh(), rc.op_setxattr(b"x", b"1")], minor=2), St.OK, "SETXATTR on the export root")
    expect(on(c, "l", rc.op_removexattr(b"x")), St.PERM, "REMOVEXATTR on a symlink")


def test_permissions_and_access_bits(srv):
    path = make(srv)
    os.chmod(path, 0o644)
    os.setxattr(path, "user.a", b"1")
    owner = Client(srv.port).establish()
    r = expect_ok(on(owner, "f", rc.op_access(0x1FF)), "ACCESS")
    assert r[3].supported & 0x1C0 == 0x1C0
    assert r[3].access & (ACCESS_XAREAD | ACCESS_XAWRITE | ACCESS_XALIST) == ACCESS_XAREAD | ACCESS_XAWRITE | ACCESS_XALIST
    other = Client(srv.port, uid=1000, gid=1000).establish()
    r = expect_ok(on(other, "f", rc.op_access(0x1FF)), "ACCESS of another user")
    assert r[3].access & (ACCESS_XAREAD | ACCESS_XALIST) and not r[3].access & ACCESS_XAWRITE
    assert expect_ok(on(other, "f", rc.op_getxattr(b"a")), "GETXATTR by another user")[3].value == b"1"
    expect(on(other, "f", rc.op_setxattr(b"a", b"2")), St.ACCESS, "SETXATTR without write permission")
    expect(on(other, "f", rc.op_removexattr(b"a")), St.ACCESS, "REMOVEXATTR without write permission")
    os.chmod(path, 0o600)
    expect(on(other, "f", rc.op_getxattr(b"a")), St.ACCESS, "GETXATTR without read permission")
    expect(on(other, "f", rc.op_listxattrs()), St.ACCESS, "LISTXATTRS without read permission")
    assert os.getxattr(path, "user.a") == b"1"


def test_xattr_support_attribute(srv):
    make(srv)
    c = Client(srv.port).establish()
    r = expect_ok(on(c, "f", rc.op_getattr(XATTR_SUPPORT_WORDS)), "GETATTR xattr_support")
    assert r[3].attrmask[2:3] == [1 << (82 - 64)], r[3].attrmask
    assert r[3].attrvals == (1).to_bytes(4, "big")
    r = expect_ok(on(c, "f", rc.op_getattr((1, 0, 0))), "GETATTR supported_attrs")
    vals = r[3].attrvals
    words = [int.from_bytes(vals[4 + 4 * i: 8 + 4 * i], "big") for i in range(int.from_bytes(vals[:4], "big"))]
    assert len(words) == 3 and words[2] & (1 << (82 - 64)), words


def test_an_nfsv41_compound_has_no_extended_attributes(srv):
    """RFC 8276 extends NFSv4.2 only: in a 4.1 COMPOUND the ops are
    illegal, xattr_support is not supported and ACCESS leaves the bits
    out (as on the Linux server)."""
    make(srv)
    c = Client(srv.port).establish()
    for op in (rc.op_getxattr(b"a"), rc.op_setxattr(b"a", b"1"), rc.op_listxattrs(), rc.op_removexattr(b"a")):
        r = on(c, "f", op, minor=1)
        assert r.status == St.OP_ILLEGAL and r.results[-1].opnum == 10044, r
    r = expect_ok(on(c, "f", rc.op_getattr((1, 0, 0)), minor=1), "GETATTR supported_attrs in 4.1")
    vals = r[3].attrvals
    words = [int.from_bytes(vals[4 + 4 * i: 8 + 4 * i], "big") for i in range(int.from_bytes(vals[:4], "big"))]
    assert len(words) < 3 or not words[2] & (1 << (82 - 64)), words
    r = expect_ok(on(c, "f", rc.op_access(0x1FF), minor=1), "ACCESS in 4.1")
    assert r[3].supported == 0x3F, hex(r[3].supported)
