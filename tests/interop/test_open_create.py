"""OPEN with OPEN4_CREATE, one test per row of RFC 8881 section 18.16.3's
createmodes, on a name that is new and on one that exists, over raw RPC:

| createmode   | new name                       | existing name                          |
| UNCHECKED4   | created, mode as sent          | opened, its data kept                  |
| GUARDED4     | created                        | NFS4ERR_EXIST, the file untouched      |
| EXCLUSIVE4_1 | created, times in attrset      | same verifier: the same file (a        |
|              | (the verifier is kept there)   | retransmission); another: NFS4ERR_EXIST |

The Linux server answers these the same way (nfsd4_create_file in
fs/nfsd/nfs4proc.c: NFS4ERR_EXIST for GUARDED4 on an existing name, and for
an exclusive create whose file's atime and mtime seconds are not the
verifier's).
"""

from __future__ import annotations

import os

import pytest

import rpcclient as rc
from rpcclient import EXCLUSIVE4_1, GUARDED4, UNCHECKED4, Client, St, expect, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

TIME_ACCESS_SET, TIME_MODIFY_SET = 48, 54


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, root_squash=False)


def open_create(c: Client, name: str, createmode: int, verifier: bytes = bytes(8), mode: int = 0o640):
    return c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/" + name.encode(), name, create=True,
                                                     createmode=createmode, verifier=verifier, mode=mode),
                       rc.op_getfh()])


def attrset_has(words: list[int], bit: int) -> bool:
    return len(words) > bit // 32 and bool(words[bit // 32] & (1 << (bit % 32)))


@pytest.mark.parametrize("createmode", [UNCHECKED4, GUARDED4], ids=["unchecked", "guarded"])
def test_a_new_name_is_created_with_the_mode_sent(srv, createmode):
    c = Client(srv.port).establish()
    expect_ok(open_create(c, "new", createmode), "OPEN create of a new name")
    f = srv.export / "new"
    assert f.is_file() and (f.stat().st_mode & 0o7777) == 0o640, oct(f.stat().st_mode)


def test_unchecked_on_an_existing_name_opens_it_and_keeps_its_data(srv):
    (srv.export / "old").write_bytes(b"kept")
    c = Client(srv.port).establish()
    r = open_create(c, "old", UNCHECKED4)
    expect_ok(r, "UNCHECKED4 OPEN of an existing file")
    assert not any(r[2].attrset), f"attributes said set on an existing file: {r[2].attrset}"
    assert (srv.export / "old").read_bytes() == b"kept"


def test_guarded_on_an_existing_name_is_exist_and_leaves_the_file(srv):
    (srv.export / "old").write_bytes(b"kept")
    os.chmod(srv.export / "old", 0o600)
    c = Client(srv.port).establish()
    expect(open_create(c, "old", GUARDED4), St.EXIST, "GUARDED4 OPEN of an existing file")
    assert (srv.export / "old").read_bytes() == b"kept"
    assert ((srv.export / "old").stat().st_mode & 0o777) == 0o600


def test_exclusive_create_keeps_the_verifier_and_a_retransmission_gets_the_same_file(srv):
    c = Client(srv.port).establish()
    verf = b"\x12\x34\x56\x78\x9a\xbc\xde\xf0"
    r = open_create(c, "excl", EXCLUSIVE4_1, verf)
    expect_ok(r, "EXCLUSIVE4_1 OPEN of a new name")
    words = r[2].attrset
    assert attrset_has(words, TIME_ACCESS_SET) and attrset_has(words, TIME_MODIFY_SET), (
        f"attrset {words} does not say the times hold the verifier")
    st = (srv.export / "excl").stat()
    assert (int(st.st_atime), int(st.st_mtime)) == (0x12345678, 0x9abcdef0)
    again = open_create(c, "excl", EXCLUSIVE4_1, verf)
    expect_ok(again, "the same EXCLUSIVE4_1 OPEN again (a retransmission)")
    assert again[3].fh == r[3].fh, "the retransmission opened another file"


def test_exclusive_create_with_another_verifier_on_an_existing_name_is_exist(srv):
    c = Client(srv.port).establish()
    expect_ok(open_create(c, "excl", EXCLUSIVE4_1, b"A" * 8), "EXCLUSIVE4_1 OPEN of a new name")
    expect(open_create(c, "excl", EXCLUSIVE4_1, b"B" * 8), St.EXIST, "EXCLUSIVE4_1 OPEN with another verifier")
    (srv.export / "plain").write_bytes(b"x")
    expect(open_create(c, "plain", EXCLUSIVE4_1, b"A" * 8), St.EXIST, "EXCLUSIVE4_1 OPEN of a file made otherwise")
