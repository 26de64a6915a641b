"""A small raw ONC RPC client for NFSv3 (RFC 1813), MOUNT v1/v3 (RFC 1813
appendix I, RFC 1094 appendix A) and portmap v2 (RFC 1833), for tests.

Framing, XDR and the connection come from rpcclient.py. Every procedure
returns a `Res` with the status and the decoded results (also for errors,
where RFC 1813 still sends post-op attributes or wcc data), so tests can
check both. `call_raw()` sends arbitrary argument bytes and returns the
RPC reply header, for malformed requests.

`Target` says where the server under test is: by default sluice started by
the fixtures, or whatever NFS3_TARGET names, as
`host:nfsport:mountport:exportpath[:portmapport]` (for checking the tests
against another server, e.g. nfs-ganesha).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import rpcclient as rc
from rpcclient import MSG_ACCEPTED, SUCCESS, Conn, Packer, RpcReply, Unpacker, auth_sys, call_header, next_xid

# --- programs and constants --------------------------------------------------

NFS_PROGRAM = 100003
NFS_V3 = 3
MOUNT_PROGRAM = 100005
MOUNT_V1 = 1
MOUNT_V3 = 3
PMAP_PROGRAM = 100000
PMAP_V2 = 2
IPPROTO_TCP = 6
IPPROTO_UDP = 17

NFS3_FHSIZE = 64
FHSIZE_V1 = 32


class Proc:
    """NFSv3 procedure numbers (RFC 1813 section 3)."""

    NULL = 0
    GETATTR = 1
    SETATTR = 2
    LOOKUP = 3
    ACCESS = 4
    READLINK = 5
    READ = 6
    WRITE = 7
    CREATE = 8
    MKDIR = 9
    SYMLINK = 10
    MKNOD = 11
    REMOVE = 12
    RMDIR = 13
    RENAME = 14
    LINK = 15
    READDIR = 16
    READDIRPLUS = 17
    FSSTAT = 18
    FSINFO = 19
    PATHCONF = 20
    COMMIT = 21


class MntProc:
    NULL = 0
    MNT = 1
    DUMP = 2
    UMNT = 3
    UMNTALL = 4
    EXPORT = 5


class PmapProc:
    NULL = 0
    SET = 1
    UNSET = 2
    GETPORT = 3
    DUMP = 4


class E:
    """nfsstat3 (RFC 1813 section 2.6)."""

    OK = 0
    PERM = 1
    NOENT = 2
    IO = 5
    NXIO = 6
    ACCES = 13
    EXIST = 17
    XDEV = 18
    NODEV = 19
    NOTDIR = 20
    ISDIR = 21
    INVAL = 22
    FBIG = 27
    NOSPC = 28
    ROFS = 30
    MLINK = 31
    NAMETOOLONG = 63
    NOTEMPTY = 66
    DQUOT = 69
    STALE = 70
    REMOTE = 71
    BADHANDLE = 10001
    NOT_SYNC = 10002
    BAD_COOKIE = 10003
    NOTSUPP = 10004
    TOOSMALL = 10005
    SERVERFAULT = 10006
    BADTYPE = 10007
    JUKEBOX = 10008


_E_NAMES = {v: k for k, v in vars(E).items() if not k.startswith("_")}


def err_name(code) -> str:
    if code is None:
        return "None"
    n = _E_NAMES.get(code)
    return ("NFS3_OK" if n == "OK" else f"NFS3ERR_{n}({code})") if n else f"nfsstat3 {code}"


class M:
    """mountstat3 (RFC 1813 appendix I)."""

    OK = 0
    PERM = 1
    NOENT = 2
    IO = 5
    ACCES = 13
    NOTDIR = 20
    INVAL = 22
    NAMETOOLONG = 63
    NOTSUPP = 10004
    SERVERFAULT = 10006


# ftype3
NF3REG, NF3DIR, NF3BLK, NF3CHR, NF3LNK, NF3SOCK, NF3FIFO = 1, 2, 3, 4, 5, 6, 7

# ACCESS3 bits
ACCESS3_READ = 0x01
ACCESS3_LOOKUP = 0x02
ACCESS3_MODIFY = 0x04
ACCESS3_EXTEND = 0x08
ACCESS3_DELETE = 0x10
ACCESS3_EXECUTE = 0x20
ACCESS3_ALL = 0x3F

# stable_how
UNSTABLE, DATA_SYNC, FILE_SYNC = 0, 1, 2
# createmode3
UNCHECKED, GUARDED, EXCLUSIVE = 0, 1, 2
# time_how
DONT_CHANGE, SET_TO_SERVER_TIME, SET_TO_CLIENT_TIME = 0, 1, 2
# FSINFO properties
FSF3_LINK = 0x1
FSF3_SYMLINK = 0x2
FSF3_HOMOGENEOUS = 0x8
FSF3_CANSETTIME = 0x10

ZERO_VERF = b"\0" * 8


# --- XDR of RFC 1813 types ---------------------------------------------------


@dataclass
class Fattr3:
    type: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    used: int
    rdev: tuple
    fsid: int
    fileid: int
    atime: tuple
    mtime: tuple
    ctime: tuple


@dataclass
class WccAttr:
    size: int
    mtime: tuple
    ctime: tuple


@dataclass
class Wcc:
    before: WccAttr | None
    after: Fattr3 | None


def _time(u: Unpacker) -> tuple:
    return (u.u32(), u.u32())


def fattr3(u: Unpacker) -> Fattr3:
    return Fattr3(
        u.u32(), u.u32(), u.u32(), u.u32(), u.u32(), u.u64(), u.u64(), (u.u32(), u.u32()), u.u64(), u.u64(), _time(u), _time(u), _time(u)
    )


def post_op_attr(u: Unpacker) -> Fattr3 | None:
    return fattr3(u) if u.bool() else None


def pre_op_attr(u: Unpacker) -> WccAttr | None:
    return WccAttr(u.u64(), _time(u), _time(u)) if u.bool() else None


def wcc_data(u: Unpacker) -> Wcc:
    return Wcc(pre_op_attr(u), post_op_attr(u))


def post_op_fh3(u: Unpacker) -> bytes | None:
    return u.opaque() if u.bool() else None



def sattr3(mode=None, uid=None, gid=None, size=None, atime=None, mtime=None) -> bytes:
    """sattr3; atime/mtime: None (don't change), "server", or (sec, nsec)."""
    p = Packer()
    for v in (mode, uid, gid):
        if v is None:
            p.bool(False)
        else:
            p.bool(True).u32(v)
    if size is None:
        p.bool(False)
    else:
        p.bool(True).u64(size)
    for t in (atime, mtime):
        if t is None:
            p.u32(DONT_CHANGE)
        elif t == "server":
            p.u32(SET_TO_SERVER_TIME)
        else:
            p.u32(SET_TO_CLIENT_TIME).u32(t[0]).u32(t[1])
    return p.bytes()


def diropargs(dir_fh: bytes, name) -> bytes:
    name = name.encode() if isinstance(name, str) else name
    return Packer().opaque(dir_fh).opaque(name).bytes()


class Res:
    """One procedure's results: .status plus named fields."""

    def __init__(self, proc: str, status: int, **fields):
        self.proc, self.status = proc, status
        self.__dict__.update(fields)

    @property
    def ok(self) -> bool:
        return self.status == E.OK

    def __repr__(self):
        def short(v):
            if isinstance(v, bytes) and len(v) > 24:
                return f"<{len(v)} bytes {v[:12].hex()}..>"
            if isinstance(v, list) and len(v) > 6:
                return f"[{len(v)} items: {v[:3]!r}...]"
            return repr(v)

        extra = ", ".join(f"{k}={short(v)}" for k, v in self.__dict__.items() if k not in ("proc", "status"))
        return f"{self.proc}({err_name(self.status)}{', ' + extra if extra else ''})"


class RpcFailure(AssertionError):
    """The call was not accepted with SUCCESS."""

    def __init__(self, what: str, reply: RpcReply):
        super().__init__(f"{what}: RPC not accepted with SUCCESS: {reply!r}")
        self.reply = reply


# --- clients -----------------------------------------------------------------


class RpcClient:
    """One TCP connection and an AUTH_SYS identity."""

    def __init__(self, port: int, host: str = "127.0.0.1", uid: int = 0, gid: int = 0, gids=(), timeout: float = 10.0, conn: Conn | None = None):
        self.host, self.port = host, port
        self.conn = conn if conn is not None else Conn(port, host, timeout=timeout)
        self.uid, self.gid = uid, gid
        self.cred = auth_sys(uid=uid, gid=gid, gids=list(gids), machine="v3client")

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call_raw(self, prog: int, vers: int, proc: int, args: bytes = b"", cred: bytes | None = None, cred_flavor: int = rc.AUTH_SYS) -> RpcReply:
        xid = next_xid()
        body = cred if cred is not None else (self.cred if cred_flavor == rc.AUTH_SYS else b"")
        hdr = call_header(xid, prog=prog, vers=vers, proc=proc, cred_flavor=cred_flavor, cred_body=body)
        self.conn.send_record(hdr + args)
        return self.conn.wait_for(xid)

    def call(self, prog: int, vers: int, proc: int, args: bytes = b"", what: str = "", cred: bytes | None = None) -> Unpacker:
        r = self.call_raw(prog, vers, proc, args, cred)
        if r.reply_stat != MSG_ACCEPTED or r.accept_stat != SUCCESS:
            raise RpcFailure(what or f"prog {prog} v{vers} proc {proc}", r)
        return Unpacker(r.body)


class Nfs3(RpcClient):
    """NFSv3 procedures. `cred` on each call overrides the identity."""

    def _c(self, proc: int, args: bytes, name: str, cred=None) -> Unpacker:
        return self.call(NFS_PROGRAM, NFS_V3, proc, args, name, cred)

    def null(self) -> RpcReply:
        return self.call_raw(NFS_PROGRAM, NFS_V3, Proc.NULL)

    def getattr(self, fh: bytes, cred=None) -> Res:
        u = self._c(Proc.GETATTR, Packer().opaque(fh).bytes(), "GETATTR", cred)
        st = u.u32()
        r = Res("GETATTR", st, attr=fattr3(u) if st == E.OK else None)
        u.done()
        return r

    def setattr(self, fh: bytes, attrs: bytes, guard: tuple | None = None, cred=None) -> Res:
        p = Packer().opaque(fh).raw(attrs)
        if guard is None:
            p.bool(False)
        else:
            p.bool(True).u32(guard[0]).u32(guard[1])
        u = self._c(Proc.SETATTR, p.bytes(), "SETATTR", cred)
        r = Res("SETATTR", u.u32(), wcc=wcc_data(u))
        u.done()
        return r

    def lookup(self, dir_fh: bytes, name, cred=None) -> Res:
        u = self._c(Proc.LOOKUP, diropargs(dir_fh, name), "LOOKUP", cred)
        st = u.u32()
        if st == E.OK:
            r = Res("LOOKUP", st, fh=u.opaque(), attr=post_op_attr(u), dir_attr=post_op_attr(u))
        else:
            r = Res("LOOKUP", st, dir_attr=post_op_attr(u))
        u.done()
        return r

    def access(self, fh: bytes, bits: int, cred=None) -> Res:
        u = self._c(Proc.ACCESS, Packer().opaque(fh).u32(bits).bytes(), "ACCESS", cred)
        st = u.u32()
        attr = post_op_attr(u)
        r = Res("ACCESS", st, attr=attr, access=u.u32() if st == E.OK else None)
        u.done()
        return r

    def readlink(self, fh: bytes, cred=None) -> Res:
        u = self._c(Proc.READLINK, Packer().opaque(fh).bytes(), "READLINK", cred)
        st = u.u32()
        attr = post_op_attr(u)
        r = Res("READLINK", st, attr=attr, path=u.opaque() if st == E.OK else None)
        u.done()
        return r

    def read(self, fh: bytes, offset: int, count: int, cred=None) -> Res:
        u = self._c(Proc.READ, Packer().opaque(fh).u64(offset).u32(count).bytes(), "READ", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st == E.OK:
            r = Res("READ", st, attr=attr, count=u.u32(), eof=u.bool(), data=u.opaque())
        else:
            r = Res("READ", st, attr=attr)
        u.done()
        return r

    def write(self, fh: bytes, offset: int, data: bytes, stable: int = FILE_SYNC, count: int | None = None, cred=None) -> Res:
        n = len(data) if count is None else count
        u = self._c(Proc.WRITE, Packer().opaque(fh).u64(offset).u32(n).u32(stable).opaque(data).bytes(), "WRITE", cred)
        st = u.u32()
        wcc = wcc_data(u)
        if st == E.OK:
            r = Res("WRITE", st, wcc=wcc, count=u.u32(), committed=u.u32(), verf=u.fixed(8))
        else:
            r = Res("WRITE", st, wcc=wcc)
        u.done()
        return r

    def _diropres(self, name: str, u: Unpacker) -> Res:
        st = u.u32()
        if st == E.OK:
            r = Res(name, st, fh=post_op_fh3(u), attr=post_op_attr(u), dir_wcc=wcc_data(u))
        else:
            r = Res(name, st, dir_wcc=wcc_data(u))
        u.done()
        return r

    def create(self, dir_fh: bytes, name, how: int = UNCHECKED, attrs: bytes | None = None, verf: bytes = ZERO_VERF, cred=None) -> Res:
        p = Packer().raw(diropargs(dir_fh, name)).u32(how)
        if how == EXCLUSIVE:
            p.fixed(verf)
        else:
            p.raw(attrs if attrs is not None else sattr3(mode=0o644))
        return self._diropres("CREATE", self._c(Proc.CREATE, p.bytes(), "CREATE", cred))

    def mkdir(self, dir_fh: bytes, name, attrs: bytes | None = None, cred=None) -> Res:
        p = Packer().raw(diropargs(dir_fh, name)).raw(attrs if attrs is not None else sattr3(mode=0o755))
        return self._diropres("MKDIR", self._c(Proc.MKDIR, p.bytes(), "MKDIR", cred))

    def symlink(self, dir_fh: bytes, name, target, attrs: bytes | None = None, cred=None) -> Res:
        target = target.encode() if isinstance(target, str) else target
        p = Packer().raw(diropargs(dir_fh, name)).raw(attrs if attrs is not None else sattr3()).opaque(target)
        return self._diropres("SYMLINK", self._c(Proc.SYMLINK, p.bytes(), "SYMLINK", cred))

    def mknod(self, dir_fh: bytes, name, ftype: int, attrs: bytes | None = None, spec=(0, 0), cred=None) -> Res:
        p = Packer().raw(diropargs(dir_fh, name)).u32(ftype)
        a = attrs if attrs is not None else sattr3(mode=0o644)
        if ftype in (NF3CHR, NF3BLK):
            p.raw(a).u32(spec[0]).u32(spec[1])
        elif ftype in (NF3SOCK, NF3FIFO):
            p.raw(a)
        return self._diropres("MKNOD", self._c(Proc.MKNOD, p.bytes(), "MKNOD", cred))

    def _wccstat(self, name: str, proc: int, args: bytes, cred) -> Res:
        u = self._c(proc, args, name, cred)
        r = Res(name, u.u32(), dir_wcc=wcc_data(u))
        u.done()
        return r

    def remove(self, dir_fh: bytes, name, cred=None) -> Res:
        return self._wccstat("REMOVE", Proc.REMOVE, diropargs(dir_fh, name), cred)

    def rmdir(self, dir_fh: bytes, name, cred=None) -> Res:
        return self._wccstat("RMDIR", Proc.RMDIR, diropargs(dir_fh, name), cred)

    def rename(self, from_dir: bytes, from_name, to_dir: bytes, to_name, cred=None) -> Res:
        u = self._c(Proc.RENAME, diropargs(from_dir, from_name) + diropargs(to_dir, to_name), "RENAME", cred)
        r = Res("RENAME", u.u32(), from_wcc=wcc_data(u), to_wcc=wcc_data(u))
        u.done()
        return r

    def link(self, fh: bytes, dir_fh: bytes, name, cred=None) -> Res:
        u = self._c(Proc.LINK, Packer().opaque(fh).raw(diropargs(dir_fh, name)).bytes(), "LINK", cred)
        r = Res("LINK", u.u32(), attr=post_op_attr(u), dir_wcc=wcc_data(u))
        u.done()
        return r

    def readdir(self, dir_fh: bytes, cookie: int = 0, verf: bytes = ZERO_VERF, count: int = 4096, cred=None) -> Res:
        u = self._c(Proc.READDIR, Packer().opaque(dir_fh).u64(cookie).fixed(verf).u32(count).bytes(), "READDIR", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st != E.OK:
            r = Res("READDIR", st, dir_attr=attr)
        else:
            verf_out = u.fixed(8)
            entries = []
            while u.bool():
                entries.append((u.u64(), u.opaque().decode("utf-8", "surrogateescape"), u.u64()))
            r = Res("READDIR", st, dir_attr=attr, verf=verf_out, entries=entries, eof=u.bool(), body_len=len(u.data))
        u.done()
        return r

    def readdirplus(self, dir_fh: bytes, cookie: int = 0, verf: bytes = ZERO_VERF, dircount: int = 1024, maxcount: int = 8192, cred=None) -> Res:
        args = Packer().opaque(dir_fh).u64(cookie).fixed(verf).u32(dircount).u32(maxcount).bytes()
        u = self._c(Proc.READDIRPLUS, args, "READDIRPLUS", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st != E.OK:
            r = Res("READDIRPLUS", st, dir_attr=attr)
        else:
            verf_out = u.fixed(8)
            entries = []
            while u.bool():
                fileid, name, cookie_ = u.u64(), u.opaque().decode("utf-8", "surrogateescape"), u.u64()
                entries.append((fileid, name, cookie_, post_op_attr(u), post_op_fh3(u)))
            r = Res("READDIRPLUS", st, dir_attr=attr, verf=verf_out, entries=entries, eof=u.bool(), body_len=len(u.data))
        u.done()
        return r

    def fsstat(self, fh: bytes, cred=None) -> Res:
        u = self._c(Proc.FSSTAT, Packer().opaque(fh).bytes(), "FSSTAT", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st == E.OK:
            r = Res("FSSTAT", st, attr=attr, tbytes=u.u64(), fbytes=u.u64(), abytes=u.u64(), tfiles=u.u64(), ffiles=u.u64(), afiles=u.u64(), invarsec=u.u32())
        else:
            r = Res("FSSTAT", st, attr=attr)
        u.done()
        return r

    def fsinfo(self, fh: bytes, cred=None) -> Res:
        u = self._c(Proc.FSINFO, Packer().opaque(fh).bytes(), "FSINFO", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st == E.OK:
            r = Res(
                "FSINFO", st, attr=attr,
                rtmax=u.u32(), rtpref=u.u32(), rtmult=u.u32(), wtmax=u.u32(), wtpref=u.u32(), wtmult=u.u32(), dtpref=u.u32(),
                maxfilesize=u.u64(), time_delta=_time(u), properties=u.u32(),
            )  # fmt: skip
        else:
            r = Res("FSINFO", st, attr=attr)
        u.done()
        return r

    def pathconf(self, fh: bytes, cred=None) -> Res:
        u = self._c(Proc.PATHCONF, Packer().opaque(fh).bytes(), "PATHCONF", cred)
        st = u.u32()
        attr = post_op_attr(u)
        if st == E.OK:
            r = Res(
                "PATHCONF", st, attr=attr, linkmax=u.u32(), name_max=u.u32(), no_trunc=u.bool(),
                chown_restricted=u.bool(), case_insensitive=u.bool(), case_preserving=u.bool(),
            )  # fmt: skip
        else:
            r = Res("PATHCONF", st, attr=attr)
        u.done()
        return r

    def commit(self, fh: bytes, offset: int = 0, count: int = 0, cred=None) -> Res:
        u = self._c(Proc.COMMIT, Packer().opaque(fh).u64(offset).u32(count).bytes(), "COMMIT", cred)
        st = u.u32()
        wcc = wcc_data(u)
        r = Res("COMMIT", st, wcc=wcc, verf=u.fixed(8) if st == E.OK else None)
        u.done()
        return r

    # -- helpers that require success --

    def must(self, res: Res, what: str = "") -> Res:
        assert res.status == E.OK, f"{what or res.proc}: expected NFS3_OK, got {res!r}"
        return res

    def readdirplus_in_pieces(self, dir_fh: bytes) -> list:
        """(fileid, name, attributes, handle) of every entry but . and ..,
        from READDIRPLUS replies small enough to take several calls (each
        entry checked to have attributes and a handle)."""
        entries, calls = self.readdir_all(dir_fh, count=1024, plus=True, maxcount=8192)
        assert calls > 1, "one READDIRPLUS listed everything: the test wants several"
        out = []
        for fileid, name, _cookie, attrs, fh in entries:
            if name in (".", ".."):
                continue
            assert attrs is not None and fh is not None, f"{name}: listed without attributes or handle"
            out.append((fileid, name, attrs, fh))
        return out

    def readdir_all(self, dir_fh: bytes, count: int = 4096, plus: bool = False, maxcount: int = 8192, limit: int = 100000):
        """Every entry of a directory, following cookies until eof; returns
        (entries, number of calls)."""
        out, cookie, verf, calls = [], 0, ZERO_VERF, 0
        while True:
            if plus:
                r = self.readdirplus(dir_fh, cookie, verf, count, maxcount)
            else:
                r = self.readdir(dir_fh, cookie, verf, count)
            calls += 1
            self.must(r, f"{r.proc} at cookie {cookie}")
            out.extend(r.entries)
            verf = r.verf
            if r.eof:
                return out, calls
            assert r.entries, f"{r.proc} at cookie {cookie}: no entries and no eof: {r!r}"
            cookie = r.entries[-1][2]
            assert calls < limit, "READDIR does not end"


class Mount(RpcClient):
    """MOUNT v3 (and v1 where the encodings agree)."""

    def null(self, vers: int = MOUNT_V3) -> RpcReply:
        return self.call_raw(MOUNT_PROGRAM, vers, MntProc.NULL)

    def mnt(self, path, vers: int = MOUNT_V3, cred=None) -> Res:
        path = path.encode() if isinstance(path, str) else path
        u = self.call(MOUNT_PROGRAM, vers, MntProc.MNT, Packer().opaque(path).bytes(), "MNT", cred)
        st = u.u32()
        if st != M.OK:
            r = Res("MNT", st)
        elif vers == MOUNT_V1:
            r = Res("MNT", st, fh=u.fixed(FHSIZE_V1))
        else:
            fh = u.opaque()
            r = Res("MNT", st, fh=fh, flavors=[u.u32() for _ in range(u.u32())])
        u.done()
        return r

    def umnt(self, path, vers: int = MOUNT_V3) -> RpcReply:
        path = path.encode() if isinstance(path, str) else path
        return self.call_raw(MOUNT_PROGRAM, vers, MntProc.UMNT, Packer().opaque(path).bytes())

    def umntall(self, vers: int = MOUNT_V3) -> RpcReply:
        return self.call_raw(MOUNT_PROGRAM, vers, MntProc.UMNTALL)

    def dump(self, vers: int = MOUNT_V3) -> list[tuple[str, str]]:
        u = self.call(MOUNT_PROGRAM, vers, MntProc.DUMP, b"", "DUMP")
        out = []
        while u.bool():
            out.append((u.opaque().decode(errors="replace"), u.opaque().decode(errors="replace")))
        u.done()
        return out

    def export(self, vers: int = MOUNT_V3) -> list[tuple[str, list[str]]]:
        u = self.call(MOUNT_PROGRAM, vers, MntProc.EXPORT, b"", "EXPORT")
        out = []
        while u.bool():
            d = u.opaque().decode(errors="replace")
            groups = []
            while u.bool():
                groups.append(u.opaque().decode(errors="replace"))
            out.append((d, groups))
        u.done()
        return out


class Portmap(RpcClient):
    def getport(self, prog: int, vers: int, prot: int = IPPROTO_TCP) -> int:
        u = self.call(PMAP_PROGRAM, PMAP_V2, PmapProc.GETPORT, Packer().u32(prog).u32(vers).u32(prot).u32(0).bytes(), "GETPORT")
        port = u.u32()
        u.done()
        return port

    def dump(self) -> list[tuple[int, int, int, int]]:
        u = self.call(PMAP_PROGRAM, PMAP_V2, PmapProc.DUMP, b"", "PMAP DUMP")
        out = []
        while u.bool():
            out.append((u.u32(), u.u32(), u.u32(), u.u32()))
        u.done()
        return out


# --- where the server is -----------------------------------------------------


@dataclass
class Target:
    host: str
    port: int
    mount_port: int
    path: str
    pmap_port: int
    server: object = None  # the SluiceServer when the fixtures started one

    @property
    def external(self) -> bool:
        return self.server is None

    def nfs(self, **kw) -> Nfs3:
        return Nfs3(self.port, self.host, **kw)

    def mount(self, **kw) -> Mount:
        return Mount(self.mount_port, self.host, **kw)

    def portmap(self, **kw) -> Portmap:
        return Portmap(self.pmap_port, self.host, **kw)

    def root_fh(self) -> bytes:
        with self.mount() as m:
            r = m.mnt(self.path)
        assert r.status == M.OK, f"MNT {self.path!r}: {r!r}"
        return r.fh


def external_target() -> Target | None:
    """The Target named by NFS3_TARGET (host:nfsport:mountport:path[:pmapport]),
    or None."""
    env = os.environ.get("NFS3_TARGET")
    if not env:
        return None
    host, port, mport, rest = env.split(":", 3)
    path, pmap = rest, "111"
    if ":" in rest:
        path, pmap = rest.rsplit(":", 1)
    return Target(host, int(port), int(mport), path, int(pmap))


def sluice_target(server) -> Target:
    """A Target for a SluiceServer (or ConfigServer): one port for all."""
    return Target("127.0.0.1", server.port, server.port, "/", server.port, server)


# --- sluice with a config file -----------------------------------------------


def toml_str(s) -> str:
    return json.dumps(str(s))


class ConfigServer:
    """`sluice serve --config FILE` on 127.0.0.1 with a free port. `exports`
    is a list of (directory name under base, TOML lines of the export)."""

    def __init__(self, binary: Path, base: Path, exports, server_toml: str = ""):
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.binary = binary
        self.state = base / "state"
        self.state.mkdir(exist_ok=True)
        self.dirs = {}
        text = f'[server]\nlisten = "127.0.0.1:0"\nstate_dir = {toml_str(self.state)}\n{server_toml}\n'
        for name, extra in exports:
            d = base / name
            d.mkdir(exist_ok=True)
            self.dirs[name] = d
            text += f"\n[[export]]\npath = {toml_str(d)}\n{extra}\n"
        self.config = base / "sluice.toml"
        self.config.write_text(text)
        self.log_path = base / "server.log"
        self.proc = None
        self.port = 0

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve", "--config", str(self.config)],
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
            )
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"sluice did not start (got {line!r}); log:\n{self.log()}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc = None


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{os.getpid()}-{struct.unpack('>I', os.urandom(4))[0]:08x}"
