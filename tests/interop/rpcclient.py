"""A tiny raw ONC RPC (RFC 5531) / NFSv4.1 (RFC 8881) client for tests.

Pure Python, no dependencies. It exists to send requests a real NFS client
never would (wrong versions, truncated arguments, forged handles, replays,
garbage), so every layer is exposed:

* ``Packer`` / ``Unpacker``: XDR (RFC 4506) primitives.
* ``frame()``: record marking (RFC 5531 section 11), optionally split into
  several fragments.
* ``call_header()`` / ``auth_sys()``: RPC call headers and AUTH_SYS creds.
* ``RpcReply``: decoded reply header (accepted or denied).
* ``compound_args()`` and ``op_*()`` builders; ``CompoundReply`` decodes the
  results of the ops used by the tests.
* ``Conn``: one TCP connection (send records, receive records, match xids).
* ``Session``: EXCHANGE_ID + CREATE_SESSION and SEQUENCE-prefixed COMPOUNDs.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading

# --- constants ---------------------------------------------------------------

NFS_PROGRAM = 100003
NFS_V4 = 4
PROC_NULL = 0
PROC_COMPOUND = 1

MSG_CALL = 0
MSG_REPLY = 1
MSG_ACCEPTED = 0
MSG_DENIED = 1

# accept_stat
SUCCESS = 0
PROG_UNAVAIL = 1
PROG_MISMATCH = 2
PROC_UNAVAIL = 3
GARBAGE_ARGS = 4
SYSTEM_ERR = 5

# reject_stat
RPC_MISMATCH = 0
AUTH_ERROR = 1

# auth flavors
AUTH_NONE = 0
AUTH_SYS = 1
RPCSEC_GSS = 6

LAST_FRAGMENT = 0x8000_0000


class Op:
    """nfs_opnum4 values (RFC 8881, RFC 7862)."""

    ACCESS = 3
    CLOSE = 4
    COMMIT = 5
    CREATE = 6
    DELEGRETURN = 8
    GETATTR = 9
    GETFH = 10
    LOOKUP = 15
    LOOKUPP = 16
    LOCK = 12
    LOCKT = 13
    LOCKU = 14
    OPEN = 18
    OPEN_DOWNGRADE = 21
    PUTFH = 22
    PUTROOTFH = 24
    READ = 25
    READDIR = 26
    SAVEFH = 32
    RESTOREFH = 31
    REMOVE = 28
    RENAME = 29
    SETATTR = 34
    WRITE = 38
    FREE_STATEID = 45
    TEST_STATEID = 55
    EXCHANGE_ID = 42
    CREATE_SESSION = 43
    DESTROY_SESSION = 44
    LAYOUTGET = 50
    SECINFO_NO_NAME = 52
    SEQUENCE = 53
    DESTROY_CLIENTID = 57
    RECLAIM_COMPLETE = 58
    COPY = 60
    COPY_NOTIFY = 61
    OFFLOAD_CANCEL = 66
    OFFLOAD_STATUS = 67
    READ_PLUS = 68
    GETXATTR = 72
    SETXATTR = 73
    LISTXATTRS = 74
    REMOVEXATTR = 75
    ILLEGAL = 10044


class St:
    """nfsstat4 values used by the tests."""

    OK = 0
    PERM = 1
    NOENT = 2
    ACCESS = 13
    EXIST = 17
    INVAL = 22
    FBIG = 27
    ISDIR = 21
    ROFS = 30
    NAMETOOLONG = 63
    NOSPC = 28
    STALE = 70
    BADHANDLE = 10001
    NOTSUPP = 10004
    TOOSMALL = 10005
    BAD_COOKIE = 10003
    NOFILEHANDLE = 10020
    DELAY = 10008
    DENIED = 10010
    EXPIRED = 10011
    LOCKED = 10012
    GRACE = 10013
    SHARE_DENIED = 10015
    CLID_INUSE = 10017
    MINOR_VERS_MISMATCH = 10021
    STALE_CLIENTID = 10022
    STALE_STATEID = 10023
    OLD_STATEID = 10024
    BAD_STATEID = 10025
    NOT_SAME = 10027
    NO_GRACE = 10033
    RECLAIM_BAD = 10034
    RECLAIM_CONFLICT = 10035
    BADXDR = 10036
    LOCKS_HELD = 10037
    OPENMODE = 10038
    ADMIN_REVOKED = 10047
    COMPLETE_ALREADY = 10054
    WRONG_CRED = 10082
    DELEG_REVOKED = 10087
    BADNAME = 10041
    OP_ILLEGAL = 10044
    BADSESSION = 10052
    BADSLOT = 10053
    SEQ_MISORDERED = 10063
    SEQ_FALSE_RETRY = 10076
    SEQUENCE_POS = 10064
    REQ_TOO_BIG = 10065
    REP_TOO_BIG = 10066
    REP_TOO_BIG_TO_CACHE = 10067
    RETRY_UNCACHED_REP = 10068
    TOO_MANY_OPS = 10070
    OP_NOT_IN_SESSION = 10071
    ENCR_ALG_UNSUPP = 10079
    NOXATTR = 10095
    XATTR2BIG = 10096
    OFFLOAD_DENIED = 10091
    OFFLOAD_NO_REQS = 10094
    NOT_ONLY_OP = 10081


# --- XDR ---------------------------------------------------------------------


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


class Packer:
    """Builds XDR data; every method returns self so calls chain."""

    def __init__(self):
        self._parts: list[bytes] = []

    def u32(self, v: int) -> "Packer":
        self._parts.append(struct.pack(">I", v & 0xFFFFFFFF))
        return self

    def i32(self, v: int) -> "Packer":
        self._parts.append(struct.pack(">i", v))
        return self

    def u64(self, v: int) -> "Packer":
        self._parts.append(struct.pack(">Q", v & 0xFFFFFFFFFFFFFFFF))
        return self

    def i64(self, v: int) -> "Packer":
        self._parts.append(struct.pack(">q", v))
        return self

    def bool(self, v: bool) -> "Packer":
        return self.u32(1 if v else 0)

    def fixed(self, b: bytes) -> "Packer":
        """Fixed-length opaque: the bytes plus padding, no length."""
        self._parts.append(bytes(b) + _pad(len(b)))
        return self

    def opaque(self, b: bytes) -> "Packer":
        """Variable-length opaque: length, bytes, padding."""
        self.u32(len(b))
        return self.fixed(b)

    def string(self, s: str) -> "Packer":
        return self.opaque(s.encode())

    def raw(self, b: bytes) -> "Packer":
        """Appends bytes as they are (no length, no padding)."""
        self._parts.append(bytes(b))
        return self

    def bitmap(self, words) -> "Packer":
        self.u32(len(words))
        for w in words:
            self.u32(w)
        return self

    def bytes(self) -> bytes:
        return b"".join(self._parts)


class XdrError(Exception):
    """The data ended early or held a value XDR does not allow."""


class Unpacker:
    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int) -> bytes:
        if n < 0 or self.remaining() < n:
            raise XdrError(f"need {n} bytes at {self.pos}, have {self.remaining()}")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self._take(8))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def bool(self) -> bool:
        v = self.u32()
        if v not in (0, 1):
            raise XdrError(f"bad bool {v}")
        return v == 1

    def fixed(self, n: int) -> bytes:
        b = self._take(n)
        self._take((4 - n % 4) % 4)
        return b

    def opaque(self) -> bytes:
        return self.fixed(self.u32())

    def bitmap(self) -> list[int]:
        return [self.u32() for _ in range(self.u32())]

    def rest(self) -> bytes:
        b = self.data[self.pos :]
        self.pos = len(self.data)
        return b

    def done(self):
        if self.remaining():
            raise XdrError(f"{self.remaining()} trailing bytes")


# --- RPC ---------------------------------------------------------------------


def frame(record: bytes, fragments: int | list[int] = 1) -> bytes:
    """Record-marks `record`.

    `fragments` is either a number of (roughly equal) fragments or an explicit
    list of fragment sizes summing to len(record); only the last fragment
    carries the last-fragment bit.
    """
    if isinstance(fragments, int):
        n = max(1, fragments)
        step = -(-len(record) // n) if record else 0
        sizes = [step] * (n - 1) + [len(record) - step * (n - 1)]
    else:
        sizes = list(fragments)
    if sum(sizes) != len(record) or any(s < 0 for s in sizes):
        raise ValueError(f"fragment sizes {sizes} do not cover {len(record)} bytes")
    out = []
    pos = 0
    for i, size in enumerate(sizes):
        mark = size | (LAST_FRAGMENT if i == len(sizes) - 1 else 0)
        out.append(struct.pack(">I", mark) + record[pos : pos + size])
        pos += size
    return b"".join(out)


def auth_sys(uid: int = 0, gid: int = 0, gids=(), machine: str = "rpcclient", stamp: int = 0) -> bytes:
    """An authsys_parms body (RFC 5531 appendix A)."""
    p = Packer().u32(stamp).string(machine).u32(uid).u32(gid)
    return p.bitmap(list(gids)).bytes()


def call_header(
    xid: int,
    prog: int = NFS_PROGRAM,
    vers: int = NFS_V4,
    proc: int = PROC_NULL,
    cred_flavor: int = AUTH_SYS,
    cred_body: bytes | None = None,
    verf_flavor: int = AUTH_NONE,
    verf_body: bytes = b"",
    rpcvers: int = 2,
    mtype: int = MSG_CALL,
) -> bytes:
    """The call header up to (not including) the procedure arguments."""
    if cred_body is None:
        cred_body = auth_sys() if cred_flavor == AUTH_SYS else b""
    p = Packer().u32(xid).u32(mtype).u32(rpcvers).u32(prog).u32(vers).u32(proc)
    p.u32(cred_flavor).opaque(cred_body).u32(verf_flavor).opaque(verf_body)
    return p.bytes()


class RpcReply:
    """A decoded reply message header.

    Attributes: xid, reply_stat (MSG_ACCEPTED/MSG_DENIED); for accepted
    replies verf, accept_stat, body (procedure results for SUCCESS) and
    low/high for PROG_MISMATCH; for denied replies reject_stat and low/high
    (RPC_MISMATCH) or auth_stat (AUTH_ERROR).
    """

    def __init__(self, record: bytes):
        self.record = record
        u = Unpacker(record)
        self.xid = u.u32()
        mtype = u.u32()
        if mtype != MSG_REPLY:
            raise XdrError(f"message type {mtype} is not a reply")
        self.reply_stat = u.u32()
        self.accept_stat = self.reject_stat = self.auth_stat = None
        self.low = self.high = None
        self.body = b""
        if self.reply_stat == MSG_ACCEPTED:
            self.verf = (u.u32(), u.opaque())
            self.accept_stat = u.u32()
            if self.accept_stat == SUCCESS:
                self.body = u.rest()
            elif self.accept_stat == PROG_MISMATCH:
                self.low, self.high = u.u32(), u.u32()
            u.done()
        elif self.reply_stat == MSG_DENIED:
            self.reject_stat = u.u32()
            if self.reject_stat == RPC_MISMATCH:
                self.low, self.high = u.u32(), u.u32()
            elif self.reject_stat == AUTH_ERROR:
                self.auth_stat = u.u32()
            else:
                raise XdrError(f"bad reject_stat {self.reject_stat}")
            u.done()
        else:
            raise XdrError(f"bad reply_stat {self.reply_stat}")

    def __repr__(self):
        return (
            f"RpcReply(xid={self.xid:#x}, reply_stat={self.reply_stat}, "
            f"accept_stat={self.accept_stat}, reject_stat={self.reject_stat}, "
            f"auth_stat={self.auth_stat}, low={self.low}, high={self.high}, body={len(self.body)}B)"
        )


class RpcCall:
    """A call from the server (over the back channel): xid, prog, vers,
    proc, the credential's flavor and body, and the arguments."""

    def __init__(self, record: bytes):
        u = Unpacker(record)
        self.xid = u.u32()
        assert u.u32() == MSG_CALL
        self.rpcvers, self.prog, self.vers, self.proc = u.u32(), u.u32(), u.u32(), u.u32()
        self.cred_flavor, self.cred_body = u.u32(), u.opaque()
        self.verf = (u.u32(), u.opaque())
        self.args = u.rest()

    def __repr__(self):
        return f"RpcCall(xid={self.xid:#x}, prog={self.prog:#x}, vers={self.vers}, proc={self.proc}, cred={self.cred_flavor}, args={len(self.args)}B)"


_xids = itertools.count((os.getpid() << 12) & 0x7FFFFFFF)


def next_xid() -> int:
    return next(_xids) & 0xFFFFFFFF


class ConnectionClosed(Exception):
    """The server closed the connection."""


class Conn:
    """One TCP connection to the server."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self._stash: dict[int, RpcReply] = {}
        # Calls the server made on this connection (its back channel),
        # not yet taken with next_call().
        self.calls: list[RpcCall] = []

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes):
        self.sock.sendall(data)

    def send_record(self, record: bytes, fragments: int | list[int] = 1):
        self.send(frame(record, fragments))

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionClosed(f"EOF after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_record(self) -> bytes:
        """One whole record (fragments reassembled). Raises socket.timeout."""
        out = bytearray()
        while True:
            (mark,) = struct.unpack(">I", self._read_exact(4))
            out += self._read_exact(mark & ~LAST_FRAGMENT)
            if mark & LAST_FRAGMENT:
                return bytes(out)

    def recv_reply(self) -> RpcReply:
        """The next reply; calls from the server that come first are kept
        in `calls`."""
        while True:
            rec = self.recv_record()
            if struct.unpack(">I", rec[4:8])[0] == MSG_CALL:
                self.calls.append(RpcCall(rec))
                continue
            return RpcReply(rec)

    def next_call(self, timeout: float | None = None) -> "RpcCall":
        """The next call from the server (a callback), keeping replies that
        come first for wait_for(). Raises socket.timeout after `timeout`."""
        old = self.sock.gettimeout()
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            while not self.calls:
                rec = self.recv_record()
                if struct.unpack(">I", rec[4:8])[0] == MSG_CALL:
                    self.calls.append(RpcCall(rec))
                else:
                    r = RpcReply(rec)
                    self._stash[r.xid] = r
            return self.calls.pop(0)
        finally:
            self.sock.settimeout(old)

    def answer(self, call: "RpcCall", body: bytes = b"", accept_stat: int = SUCCESS):
        """Replies to a call from the server: accepted, with `accept_stat`
        and the results `body`."""
        p = Packer().u32(call.xid).u32(MSG_REPLY).u32(MSG_ACCEPTED).u32(AUTH_NONE).opaque(b"").u32(accept_stat)
        self.send_record(p.bytes() + body)

    def wait_for(self, xid: int) -> RpcReply:
        """The reply to `xid`, keeping replies to other xids for later."""
        while xid not in self._stash:
            r = self.recv_reply()
            self._stash[r.xid] = r
        return self._stash.pop(xid)

    def call(self, proc: int, args: bytes = b"", xid: int | None = None, fragments=1, **hdr) -> RpcReply:
        xid = next_xid() if xid is None else xid
        self.send_record(call_header(xid, proc=proc, **hdr) + args, fragments)
        return self.wait_for(xid)

    def null(self, **hdr) -> RpcReply:
        return self.call(PROC_NULL, **hdr)

    def compound(self, ops, minor: int = 1, tag: bytes = b"", **kw) -> "CompoundReply":
        r = self.call(PROC_COMPOUND, compound_args(ops, minor, tag), **kw)
        if r.reply_stat != MSG_ACCEPTED or r.accept_stat != SUCCESS:
            raise AssertionError(f"COMPOUND not accepted: {r!r}")
        return CompoundReply(r.body)

    def pipeline(self, records: list[tuple[int, bytes]]) -> dict[int, RpcReply]:
        """Sends all (xid, record) pairs without waiting (from a second
        thread, so neither side can block on a full socket buffer) and
        returns the replies by xid. Every xid must be answered."""
        err: list[BaseException] = []

        def sender():
            try:
                for _, rec in records:
                    self.send_record(rec)
            except BaseException as e:  # reported below
                err.append(e)

        t = threading.Thread(target=sender, daemon=True)
        t.start()
        want = {x for x, _ in records}
        got: dict[int, RpcReply] = {}
        try:
            while want - got.keys():
                r = self.recv_reply()
                got[r.xid] = r
        finally:
            t.join(timeout=10)
        if err:
            raise err[0]
        return got


# --- NFSv4 COMPOUND ----------------------------------------------------------


def compound_args(ops, minor: int = 1, tag: bytes = b"") -> bytes:
    """COMPOUND4args; `ops` is a list of (opnum, encoded args) pairs."""
    p = Packer().opaque(tag).u32(minor).u32(len(ops))
    for opnum, args in ops:
        p.u32(opnum).raw(args)
    return p.bytes()


def op_sequence(sessionid: bytes, seqid: int, slot: int = 0, highest: int = 0, cachethis: bool = False):
    assert len(sessionid) == 16
    return (Op.SEQUENCE, Packer().fixed(sessionid).u32(seqid).u32(slot).u32(highest).bool(cachethis).bytes())


def op_putrootfh():
    return (Op.PUTROOTFH, b"")


def op_getfh():
    return (Op.GETFH, b"")


def op_putfh(fh: bytes):
    return (Op.PUTFH, Packer().opaque(fh).bytes())


def op_lookup(name: bytes | str):
    if isinstance(name, str):
        name = name.encode()
    return (Op.LOOKUP, Packer().opaque(name).bytes())


def op_lookupp():
    return (Op.LOOKUPP, b"")


def op_getattr(words=(0x0010011A, 0x00B0A23A)):
    """GETATTR; the default asks for type, change, size, fsid, fileid, mode,
    numlinks, owner, owner_group, rawdev, space_used, times and
    mounted_on_fileid."""
    return (Op.GETATTR, Packer().bitmap(list(words)).bytes())


def op_readdir(cookie: int = 0, verifier: bytes = b"\0" * 8, dircount: int = 4096, maxcount: int = 8192, words=(0x0010011A, 0x00B0A23A)):
    p = Packer().u64(cookie).fixed(verifier).u32(dircount).u32(maxcount).bitmap(list(words))
    return (Op.READDIR, p.bytes())


ANONYMOUS_STATEID = b"\0" * 16


def op_read(offset: int = 0, count: int = 4096, stateid: bytes = ANONYMOUS_STATEID):
    return (Op.READ, Packer().fixed(stateid).u64(offset).u32(count).bytes())


SETXATTR4_EITHER, SETXATTR4_CREATE, SETXATTR4_REPLACE = 0, 1, 2


def op_access(mask: int):
    return (Op.ACCESS, Packer().u32(mask).bytes())


def op_getxattr(name: bytes):
    return (Op.GETXATTR, Packer().opaque(name).bytes())


def op_setxattr(name: bytes, value: bytes, option: int = SETXATTR4_EITHER):
    return (Op.SETXATTR, Packer().u32(option).opaque(name).opaque(value).bytes())


def op_listxattrs(cookie: int = 0, maxcount: int = 65536):
    return (Op.LISTXATTRS, Packer().u64(cookie).u32(maxcount).bytes())


def op_removexattr(name: bytes):
    return (Op.REMOVEXATTR, Packer().opaque(name).bytes())


def op_copy(src_sid: bytes, dst_sid: bytes, src_off: int, dst_off: int, count: int,
            synchronous: bool = True, consecutive: bool = True, source_servers: list[bytes] | None = None):
    """COPY (RFC 7862) from the saved filehandle's file to the current
    one's; `source_servers` are netloc4 values (a copy from another
    server)."""
    p = Packer().fixed(src_sid).fixed(dst_sid).u64(src_off).u64(dst_off).u64(count)
    p.bool(consecutive).bool(synchronous).u32(len(source_servers or []))
    for s in source_servers or []:
        p.raw(s)
    return (Op.COPY, p.bytes())


def op_offload_status(stateid: bytes):
    return (Op.OFFLOAD_STATUS, Packer().fixed(stateid).bytes())


def op_offload_cancel(stateid: bytes):
    return (Op.OFFLOAD_CANCEL, Packer().fixed(stateid).bytes())


def op_commit(offset: int = 0, count: int = 0):
    """COMMIT of [offset, offset + count), count 0 to the end."""
    return (Op.COMMIT, Packer().u64(offset).u32(count).bytes())


def op_write(offset: int, data: bytes, stable: int = 0, stateid: bytes = ANONYMOUS_STATEID):
    """WRITE; `stable` 0 is UNSTABLE4, 2 FILE_SYNC4."""
    return (Op.WRITE, Packer().fixed(stateid).u64(offset).u32(stable).opaque(data).bytes())


def op_read_plus(offset: int = 0, count: int = 4096, stateid: bytes = ANONYMOUS_STATEID):
    return (Op.READ_PLUS, Packer().fixed(stateid).u64(offset).u32(count).bytes())


def op_exchange_id(owner: bytes, verifier: bytes = b"rpcclnt\0", flags: int = 0):
    p = Packer().fixed(verifier).opaque(owner).u32(flags)
    p.u32(0)  # state_protect4_a: SP4_NONE
    p.u32(0)  # client_impl_id<1>: none
    return (Op.EXCHANGE_ID, p.bytes())


def _channel_attrs(p: Packer, headerpad, maxreq, maxresp, maxcached, maxops, maxreqs):
    p.u32(headerpad).u32(maxreq).u32(maxresp).u32(maxcached).u32(maxops).u32(maxreqs)
    p.u32(0)  # ca_rdma_ird<1>: none


CB_PROGRAM = 0x40000000


def cb_sec_none() -> bytes:
    """callback_sec_parms4 for AUTH_NONE."""
    return Packer().u32(AUTH_NONE).bytes()


def cb_sec_sys(uid: int = 0, gid: int = 0, machine: str = "cbclient") -> bytes:
    """callback_sec_parms4 for AUTH_SYS."""
    return Packer().u32(AUTH_SYS).raw(auth_sys(uid=uid, gid=gid, machine=machine)).bytes()


def cb_sec_gss() -> bytes:
    """callback_sec_parms4 for RPCSEC_GSS (service none, empty handles)."""
    return Packer().u32(6).u32(1).opaque(b"").opaque(b"").bytes()


def op_create_session(clientid: int, seq: int, flags: int = 0, fore=(0, 1 << 20, 1 << 20, 64 << 10, 16, 8), back=(0, 4096, 4096, 0, 2, 1), cb_program: int = CB_PROGRAM, sec=None):
    p = Packer().u64(clientid).u32(seq).u32(flags)
    _channel_attrs(p, *fore)
    _channel_attrs(p, *back)
    p.u32(cb_program)
    sec = [cb_sec_none()] if sec is None else sec
    p.u32(len(sec))
    for s in sec:
        p.raw(s)
    return (Op.CREATE_SESSION, p.bytes())


def op_backchannel_ctl(cb_program: int, sec) -> tuple[int, bytes]:
    p = Packer().u32(cb_program).u32(len(sec))
    for s in sec:
        p.raw(s)
    return (40, p.bytes())  # BACKCHANNEL_CTL



def op_destroy_session(sessionid: bytes):
    return (Op.DESTROY_SESSION, Packer().fixed(sessionid).bytes())


def op_destroy_clientid(clientid: int):
    return (Op.DESTROY_CLIENTID, Packer().u64(clientid).bytes())


def op_raw(opnum: int, args: bytes = b""):
    return (opnum, args)


class OpResult:
    def __init__(self, opnum: int, status: int, **fields):
        self.opnum = opnum
        self.status = status
        self.__dict__.update(fields)

    def __repr__(self):
        extra = {k: v for k, v in self.__dict__.items() if k not in ("opnum", "status")}
        return f"OpResult(op={self.opnum}, status={self.status}{', ' if extra else ''}{extra if extra else ''})"


def _channel(u: Unpacker) -> dict:
    keys = ("headerpad", "maxreq", "maxresp", "maxcached", "maxops", "maxreqs")
    c = {k: u.u32() for k in keys}
    c["rdma_ird"] = [u.u32() for _ in range(u.u32())]
    return c


def _decode_ok(opnum: int, u: Unpacker) -> dict | None:
    """Decodes a successful result body; None when the op is unknown here."""
    if opnum in (
        Op.PUTFH,
        Op.PUTROOTFH,
        Op.LOOKUP,
        Op.LOOKUPP,
        Op.SAVEFH,
        Op.RESTOREFH,
        Op.DESTROY_SESSION,
        Op.DESTROY_CLIENTID,
        Op.RECLAIM_COMPLETE,
    ):
        return {}
    if opnum == Op.GETFH:
        return {"fh": u.opaque()}
    if opnum == Op.GETATTR:
        return {"attrmask": u.bitmap(), "attrvals": u.opaque()}
    if opnum == Op.READ:
        return {"eof": u.bool(), "data": u.opaque()}
    if opnum == Op.ACCESS:
        return {"supported": u.u32(), "access": u.u32()}
    if opnum == Op.GETXATTR:
        return {"value": u.opaque()}
    if opnum in (Op.SETXATTR, Op.REMOVEXATTR):
        return {"atomic": u.bool(), "before": u.u64(), "after": u.u64()}
    if opnum == Op.LISTXATTRS:
        cookie = u.u64()
        names = [u.opaque() for _ in range(u.u32())]
        return {"cookie": cookie, "names": names, "eof": u.bool()}
    if opnum == Op.WRITE:
        return {"count": u.u32(), "committed": u.u32(), "verifier": u.fixed(8)}
    if opnum == Op.COMMIT:
        return {"verifier": u.fixed(8)}
    if opnum == Op.COPY:
        callback_id = u.fixed(16) if u.u32() else None
        return {
            "callback_id": callback_id,
            "count": u.u64(),
            "committed": u.u32(),
            "verifier": u.fixed(8),
            "consecutive": u.bool(),
            "synchronous": u.bool(),
        }
    if opnum == Op.OFFLOAD_STATUS:
        count = u.u64()
        complete = u.u32() if u.u32() else None
        return {"count": count, "complete": complete}
    if opnum == Op.OFFLOAD_CANCEL:
        return {}
    if opnum == Op.SEQUENCE:
        return {
            "sessionid": u.fixed(16),
            "seqid": u.u32(),
            "slot": u.u32(),
            "highest_slot": u.u32(),
            "target_highest_slot": u.u32(),
            "status_flags": u.u32(),
        }
    if opnum == Op.EXCHANGE_ID:
        r = {"clientid": u.u64(), "seqid": u.u32(), "flags": u.u32()}
        how = u.u32()
        r["state_protect"] = how
        if how == 1:
            u.bitmap()
            u.bitmap()
        elif how != 0:
            return None
        r["owner_minor"] = u.u64()
        r["owner_major"] = u.opaque()
        r["scope"] = u.opaque()
        impl = []
        for _ in range(u.u32()):
            impl.append((u.opaque(), u.opaque(), u.i64(), u.u32()))
        r["impl_id"] = impl
        return r
    if opnum == Op.CREATE_SESSION:
        return {
            "sessionid": u.fixed(16),
            "seq": u.u32(),
            "flags": u.u32(),
            "fore": _channel(u),
            "back": _channel(u),
        }
    return None


class CompoundReply:
    """COMPOUND4res: status, tag and the op results decoded so far.

    Results of ops this module cannot decode stop decoding; their bytes and
    everything after are kept in `undecoded`.
    """

    def __init__(self, body: bytes):
        self.body = body
        u = Unpacker(body)
        self.status = u.u32()
        self.tag = u.opaque()
        self.count = u.u32()
        self.results: list[OpResult] = []
        self.undecoded = b""
        for _ in range(self.count):
            opnum, status = u.u32(), u.u32()
            if status != St.OK:
                # A failed op ends the COMPOUND (RFC 8881 section 16.2.3).
                # Most failed results have no body; the few that do (LOCK
                # denied, SETATTR attrsset, ...) are left in `undecoded`
                # unless _decode_failed reads them.
                self.results.append(OpResult(opnum, status, **self._decode_failed(opnum, status, u)))
                self.undecoded = u.rest()
                return
            start = u.pos
            fields = self._decode_ok(opnum, u)
            if fields is None:
                u.pos = start
                self.results.append(OpResult(opnum, status))
                self.undecoded = u.rest()
                return
            self.results.append(OpResult(opnum, status, **fields))
        u.done()

    @staticmethod
    def _decode_ok(opnum: int, u: Unpacker) -> dict | None:
        """The fields of a successful result; None when unknown here."""
        return _decode_ok(opnum, u)

    @staticmethod
    def _decode_failed(opnum: int, status: int, u: Unpacker) -> dict:
        """The fields of a failed result that has a body (none here)."""
        return {}

    def __getitem__(self, i) -> OpResult:
        return self.results[i]

    def __len__(self):
        return len(self.results)

    def __repr__(self):
        return f"CompoundReply(status={self.status}, tag={self.tag!r}, results={self.results})"


# --- sessions ----------------------------------------------------------------

_owners = itertools.count()


class Session:
    """A client id and a session on `conn`, with slot 0 driven by `compound`."""

    def __init__(self, conn: Conn, owner: bytes | None = None, slots: int = 8, fore=None):
        """`fore` overrides the fore channel attributes asked for: (headerpad,
        maxrequestsize, maxresponsesize, maxresponsesize_cached, maxoperations,
        maxrequests)."""
        self.conn = conn
        if owner is None:
            owner = f"rpcclient-{os.getpid()}-{next(_owners)}".encode()
        self.owner = owner
        r = conn.compound([op_exchange_id(owner)])
        if r.status != St.OK:
            raise AssertionError(f"EXCHANGE_ID failed: {r!r}")
        self.clientid = r[0].clientid
        # Sequence id of this client's next CREATE_SESSION.
        self.next_cs_seq = r[0].seqid + 1
        if fore is None:
            fore = (0, 1 << 20, 1 << 20, 64 << 10, 16, slots)
        r = conn.compound([op_create_session(self.clientid, r[0].seqid, fore=fore)])
        if r.status != St.OK:
            raise AssertionError(f"CREATE_SESSION failed: {r!r}")
        self.sessionid = r[0].sessionid
        self.fore = r[0].fore
        # Next sequence id per slot: slots start at 1 in a new session.
        self.next_seq = {}

    def seq_op(self, slot: int = 0, cachethis: bool = False, seqid: int | None = None):
        """A SEQUENCE op for `slot`, consuming the slot's next sequence id
        unless `seqid` is given."""
        if seqid is None:
            seqid = self.next_seq.get(slot, 1)
            self.next_seq[slot] = seqid + 1
        return op_sequence(self.sessionid, seqid, slot, max(self.next_seq.keys(), default=0), cachethis)

    def compound(self, ops, slot: int = 0, cachethis: bool = False, minor: int = 1) -> CompoundReply:
        return self.conn.compound([self.seq_op(slot, cachethis)] + list(ops), minor=minor)

    def root_fh(self) -> bytes:
        r = self.compound([op_putrootfh(), op_getfh()])
        if r.status != St.OK:
            raise AssertionError(f"PUTROOTFH+GETFH failed: {r!r}")
        return r[2].fh


# --- state: client records, opens, locks (RFC 8881 sections 8, 9, 18) --------
#
# Builders and a fuller reply decoder for the state tests
# (test_state_clients.py, test_state_grace.py), and `Client`: one NFSv4.1
# client with its own connection, owner, verifier and AUTH_SYS principal.

# EXCHANGE_ID flags (RFC 8881 section 18.35)
EXCHGID4_FLAG_SUPP_MOVED_REFER = 0x00000001
EXCHGID4_FLAG_BIND_PRINC_STATEID = 0x00000100
EXCHGID4_FLAG_USE_NON_PNFS = 0x00010000
EXCHGID4_FLAG_UPD_CONFIRMED_REC_A = 0x40000000
EXCHGID4_FLAG_CONFIRMED_R = 0x80000000

# CREATE_SESSION flags (section 18.36)
CREATE_SESSION4_FLAG_PERSIST = 0x1
CREATE_SESSION4_FLAG_CONN_BACK_CHAN = 0x2

# OPEN (section 18.16)
OPEN4_SHARE_ACCESS_READ = 1
OPEN4_SHARE_ACCESS_WRITE = 2
OPEN4_SHARE_ACCESS_BOTH = 3
OPEN4_SHARE_DENY_NONE = 0
OPEN4_SHARE_DENY_READ = 1
OPEN4_SHARE_DENY_WRITE = 2
OPEN4_SHARE_DENY_BOTH = 3
CLAIM_NULL = 0
CLAIM_PREVIOUS = 1
CLAIM_FH = 4
CLAIM_DELEG_CUR_FH = 5
OPEN_DELEGATE_NONE = 0
UNCHECKED4 = 0
GUARDED4 = 1
EXCLUSIVE4_1 = 3

# LOCK types (section 18.10)
READ_LT = 1
WRITE_LT = 2
READW_LT = 3
WRITEW_LT = 4

NFS4_UINT64_MAX = 0xFFFFFFFFFFFFFFFF
# The special stateid meaning "the current stateid" (section 16.2.3.1.2):
# seqid 1, other all zero.
CURRENT_STATEID = struct.pack(">I", 1) + b"\0" * 12

FATTR4_MODE = 33
FATTR4_OWNER = 36
FATTR4_OWNER_GROUP = 37

_ST_NAMES = {v: k for k, v in vars(St).items() if isinstance(v, int)}


def st_name(code: int) -> str:
    """'NFS4ERR_GRACE(10013)' style name of an nfsstat4, for messages."""
    name = _ST_NAMES.get(code)
    if name == "OK":
        return "NFS4_OK"
    return f"NFS4ERR_{name}({code})" if name else f"nfsstat4 {code}"


def fattr4(words=(), vals: bytes = b"") -> bytes:
    return Packer().bitmap(list(words)).opaque(vals).bytes()


def fattr4_mode(mode: int) -> bytes:
    return fattr4([0, 1 << (FATTR4_MODE - 32)], struct.pack(">I", mode))


def open_owner4(clientid: int, owner: bytes) -> bytes:
    return Packer().u64(clientid).opaque(owner).bytes()


def op_open(
    owner: bytes,
    name: str | bytes | None = None,
    clientid: int = 0,
    access: int = OPEN4_SHARE_ACCESS_BOTH,
    deny: int = OPEN4_SHARE_DENY_NONE,
    create: bool = False,
    mode: int = 0o666,
    claim: int | None = None,
    delegate_type: int = OPEN_DELEGATE_NONE,
    seqid: int = 0,
    deleg_stateid: bytes | None = None,
    createmode: int = 0,
    verifier: bytes = bytes(8),
):
    """OPEN. With `name` the claim is CLAIM_NULL (the name in the current
    directory); without, CLAIM_FH (the current filehandle) unless `claim`
    says CLAIM_PREVIOUS (a reclaim of the current filehandle after a server
    restart, with `delegate_type`). `create` opens with OPEN4_CREATE,
    `createmode` (UNCHECKED4 unless told) and the given mode; EXCLUSIVE4_1
    sends `verifier` and no attributes. The clientid of an open owner is
    ignored in NFSv4.1 (the session's client is used)."""
    p = Packer().u32(seqid).u32(access).u32(deny).raw(open_owner4(clientid, owner))
    if create and createmode == EXCLUSIVE4_1:
        p.u32(1).u32(EXCLUSIVE4_1).fixed(verifier).bitmap([]).opaque(b"")
    elif create:
        p.u32(1).u32(createmode).raw(fattr4_mode(mode))
    else:
        p.u32(0)
    if claim is None:
        claim = CLAIM_NULL if name is not None else CLAIM_FH
    p.u32(claim)
    if claim == CLAIM_NULL:
        p.opaque(name.encode() if isinstance(name, str) else name)
    elif claim == CLAIM_PREVIOUS:
        p.u32(delegate_type)
    elif claim == CLAIM_DELEG_CUR_FH:
        p.fixed(deleg_stateid)
    elif claim != CLAIM_FH:
        raise ValueError(f"claim {claim} not built here")
    return (Op.OPEN, p.bytes())


def op_close(stateid: bytes, seqid: int = 0):
    return (Op.CLOSE, Packer().u32(seqid).fixed(stateid).bytes())


def op_open_downgrade(stateid: bytes, access: int, deny: int = OPEN4_SHARE_DENY_NONE, seqid: int = 0):
    return (Op.OPEN_DOWNGRADE, Packer().fixed(stateid).u32(seqid).u32(access).u32(deny).bytes())


def op_lock_new(
    open_stateid: bytes,
    owner: bytes,
    offset: int = 0,
    length: int = NFS4_UINT64_MAX,
    locktype: int = WRITE_LT,
    reclaim: bool = False,
    clientid: int = 0,
    open_seqid: int = 0,
    lock_seqid: int = 0,
):
    """LOCK by a new lock owner (open_to_lock_owner4) under `open_stateid`."""
    p = Packer().u32(locktype).bool(reclaim).u64(offset).u64(length)
    p.bool(True).u32(open_seqid).fixed(open_stateid).u32(lock_seqid).raw(open_owner4(clientid, owner))
    return (Op.LOCK, p.bytes())


def op_lock_existing(
    lock_stateid: bytes,
    offset: int = 0,
    length: int = NFS4_UINT64_MAX,
    locktype: int = WRITE_LT,
    reclaim: bool = False,
    lock_seqid: int = 0,
):
    """LOCK by a lock owner that already has `lock_stateid` (exist_lock_owner4)."""
    p = Packer().u32(locktype).bool(reclaim).u64(offset).u64(length)
    p.bool(False).fixed(lock_stateid).u32(lock_seqid)
    return (Op.LOCK, p.bytes())


def op_lockt(owner: bytes, offset: int = 0, length: int = NFS4_UINT64_MAX, locktype: int = WRITE_LT, clientid: int = 0):
    p = Packer().u32(locktype).u64(offset).u64(length).raw(open_owner4(clientid, owner))
    return (Op.LOCKT, p.bytes())


def op_locku(lock_stateid: bytes, offset: int = 0, length: int = NFS4_UINT64_MAX, locktype: int = WRITE_LT, seqid: int = 0):
    p = Packer().u32(locktype).u32(seqid).fixed(lock_stateid).u64(offset).u64(length)
    return (Op.LOCKU, p.bytes())


def op_test_stateid(stateids):
    p = Packer().u32(len(stateids))
    for s in stateids:
        p.fixed(s)
    return (Op.TEST_STATEID, p.bytes())


def op_delegreturn(stateid: bytes):
    return (Op.DELEGRETURN, Packer().fixed(stateid).bytes())


def op_free_stateid(stateid: bytes):
    return (Op.FREE_STATEID, Packer().fixed(stateid).bytes())


def op_reclaim_complete(one_fs: bool = False):
    return (Op.RECLAIM_COMPLETE, Packer().bool(one_fs).bytes())


def op_savefh():
    return (Op.SAVEFH, b"")


def op_restorefh():
    return (Op.RESTOREFH, b"")


def op_remove(name: str | bytes):
    return (Op.REMOVE, Packer().opaque(name.encode() if isinstance(name, str) else name).bytes())


def op_rename(old: str | bytes, new: str | bytes):
    """RENAME from the saved filehandle's directory to the current one."""
    enc = lambda n: n.encode() if isinstance(n, str) else n  # noqa: E731
    return (Op.RENAME, Packer().opaque(enc(old)).opaque(enc(new)).bytes())


def op_bind_conn_to_session(sessionid: bytes, direction: int = 1, rdma: bool = False):
    """BIND_CONN_TO_SESSION; direction 1 is CDFC4_FORE."""
    return (41, Packer().fixed(sessionid).u32(direction).bool(rdma).bytes())


def _change_info(u: Unpacker) -> dict:
    return {"atomic": u.bool(), "before": u.u64(), "after": u.u64()}


def _nfsace4(u: Unpacker):
    return (u.u32(), u.u32(), u.u32(), u.opaque())


def _open_delegation(u: Unpacker) -> dict:
    kind = u.u32()
    d = {"deleg_type": kind}
    if kind == 1:  # OPEN_DELEGATE_READ
        d.update(deleg_stateid=u.fixed(16), recall=u.bool(), ace=_nfsace4(u))
    elif kind == 2:  # OPEN_DELEGATE_WRITE
        d.update(deleg_stateid=u.fixed(16), recall=u.bool())
        limitby = u.u32()
        if limitby == 1:
            d["space_limit"] = u.u64()
        elif limitby == 2:
            u.u32()
            u.u32()
        else:
            raise XdrError(f"bad limitby {limitby}")
        d["ace"] = _nfsace4(u)
    elif kind == 3:  # OPEN_DELEGATE_NONE_EXT
        why = u.u32()
        d["why"] = why
        if why in (1, 2):  # WND4_CONTENTION, WND4_RESOURCE
            u.bool()
    elif kind != 0:
        raise XdrError(f"bad delegation type {kind}")
    return d


def _lock_denied(u: Unpacker) -> dict:
    return {
        "denied_offset": u.u64(),
        "denied_length": u.u64(),
        "denied_type": u.u32(),
        "denied_clientid": u.u64(),
        "denied_owner": u.opaque(),
    }


def _decode_state_ok(opnum: int, u: Unpacker) -> dict | None:
    """Successful result bodies of the ops the state tests use."""
    if opnum in (Op.FREE_STATEID, Op.LOCKT, Op.RECLAIM_COMPLETE, Op.SAVEFH, Op.RESTOREFH):
        return {}
    if opnum == Op.OPEN:
        r = {"stateid": u.fixed(16), "cinfo": _change_info(u), "rflags": u.u32(), "attrset": u.bitmap()}
        r.update(_open_delegation(u))
        return r
    if opnum in (Op.CLOSE, Op.LOCK, Op.LOCKU, Op.OPEN_DOWNGRADE):
        return {"stateid": u.fixed(16)}
    if opnum == Op.TEST_STATEID:
        return {"codes": [u.u32() for _ in range(u.u32())]}
    if opnum == Op.REMOVE:
        return {"cinfo": _change_info(u)}
    if opnum == Op.RENAME:
        return {"source_cinfo": _change_info(u), "target_cinfo": _change_info(u)}
    if opnum == Op.CREATE:
        return {"cinfo": _change_info(u), "attrset": u.bitmap()}
    if opnum == Op.SETATTR:
        return {"attrsset": u.bitmap()}
    if opnum == 41:  # BIND_CONN_TO_SESSION
        return {"sessionid": u.fixed(16), "dir": u.u32(), "rdma": u.bool()}
    return _decode_ok(opnum, u)


class StateReply(CompoundReply):
    """COMPOUND4res decoded like CompoundReply, also for OPEN, CLOSE, LOCK,
    LOCKT, LOCKU, TEST_STATEID, FREE_STATEID, RECLAIM_COMPLETE, REMOVE,
    RENAME, SAVEFH, RESTOREFH, OPEN_DOWNGRADE; a LOCK or LOCKT that fails
    with NFS4ERR_DENIED carries the conflicting lock (denied_offset,
    denied_length, denied_type, denied_clientid, denied_owner)."""

    def __init__(self, body: bytes, record: bytes = b""):
        self.record = record
        super().__init__(body)

    @staticmethod
    def _decode_ok(opnum: int, u: Unpacker) -> dict | None:
        return _decode_state_ok(opnum, u)

    @staticmethod
    def _decode_failed(opnum: int, status: int, u: Unpacker) -> dict:
        if opnum in (Op.LOCK, Op.LOCKT) and status == St.DENIED:
            return _lock_denied(u)
        return {}

    def statuses(self) -> list[tuple[int, int]]:
        return [(r.opnum, r.status) for r in self.results]

    def last(self) -> OpResult:
        return self.results[-1]

    def describe(self) -> str:
        """'SEQUENCE=NFS4_OK, OPEN=NFS4ERR_GRACE(10013)' for messages."""
        names = {v: k for k, v in vars(Op).items() if isinstance(v, int)}
        return ", ".join(f"{names.get(r.opnum, r.opnum)}={st_name(r.status)}" for r in self.results) or f"status {st_name(self.status)}, no results"

    def __repr__(self):
        return f"StateReply(status={st_name(self.status)}, results=[{self.describe()}])"


_client_ids = itertools.count()


def unique_name(prefix: str) -> str:
    """A name no other test run uses (pid, a counter and random bits)."""
    return f"{prefix}-{os.getpid()}-{next(_client_ids)}-{os.urandom(3).hex()}"


class Client:
    """One NFSv4.1 client: its own TCP connection, client owner, verifier
    and AUTH_SYS principal (uid, gid). Nothing is sent until asked; the
    helpers return StateReply and keep the client id, the session and the
    slots' sequence ids up to date. A SEQUENCE that fails does not use up
    its sequence id (RFC 8881 section 18.46.3), and neither does it here."""

    def __init__(self, port: int, owner: bytes | None = None, verifier: bytes = b"verif-01", uid: int = 0, gid: int = 0, host: str = "127.0.0.1", machine: str = "stateclient", timeout: float = 10.0):
        assert len(verifier) == 8
        self.port, self.host, self.timeout = port, host, timeout
        self.owner = owner if owner is not None else unique_name("client").encode()
        self.verifier = verifier
        self.uid, self.gid, self.machine = uid, gid, machine
        self.cred = auth_sys(uid=uid, gid=gid, gids=[gid], machine=machine)
        self.conn = Conn(port, host, timeout=timeout)
        self.clientid: int | None = None
        self.cs_seq: int | None = None  # csa_sequence of the next CREATE_SESSION
        self.exchange_flags = 0
        self.sessionid: bytes | None = None
        self.fore: dict | None = None
        self.next_seq: dict[int, int] = {}

    # -- transport --

    def close(self):
        self.conn.close()

    def reconnect(self):
        """A new TCP connection (after a server restart, say); the client
        id and session are kept as they were."""
        try:
            self.conn.close()
        except OSError:
            pass
        self.conn = Conn(self.port, self.host, timeout=self.timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, ops, cred: bytes | None = None, minor: int = 1) -> StateReply:
        """A COMPOUND of exactly `ops` (no SEQUENCE added)."""
        r = self.conn.call(PROC_COMPOUND, compound_args(list(ops), minor), cred_body=cred if cred is not None else self.cred)
        if r.reply_stat != MSG_ACCEPTED or r.accept_stat != SUCCESS:
            raise AssertionError(f"COMPOUND not accepted: {r!r}")
        return StateReply(r.body, r.record)

    # -- client id and session --

    def exchange_id(self, flags: int = 0, verifier: bytes | None = None, cred: bytes | None = None, owner: bytes | None = None) -> StateReply:
        r = self.call([op_exchange_id(owner or self.owner, verifier or self.verifier, flags)], cred)
        if r.status == St.OK:
            self.clientid = r[0].clientid
            self.cs_seq = r[0].seqid
            self.exchange_flags = r[0].flags
        return r

    def create_session(self, seq: int | None = None, clientid: int | None = None, flags: int = 0, fore=None, back=(0, 4096, 4096, 0, 2, 1), cred: bytes | None = None, cb_program: int = CB_PROGRAM, sec=None, minor: int = 1) -> StateReply:
        """CREATE_SESSION for this client's id with the next sequence id
        (both overridable); on success the session becomes this client's
        and the next sequence id moves on."""
        if fore is None:
            fore = (0, 1 << 20, 1 << 20, 16 << 10, 16, 8)
        seq = self.cs_seq if seq is None else seq
        cid = self.clientid if clientid is None else clientid
        r = self.call([op_create_session(cid, seq, flags, fore, back, cb_program, sec)], cred, minor=minor)
        if r.status == St.OK and clientid is None:
            self.sessionid = r[0].sessionid
            self.fore = r[0].fore
            self.next_seq = {}
            self.cs_seq = seq + 1
        return r

    def establish(self, reclaim_complete: bool = True, fore=None) -> "Client":
        """EXCHANGE_ID + CREATE_SESSION (+ RECLAIM_COMPLETE, which RFC 8881
        section 18.51.3 requires before the first non-reclaim OPEN or LOCK of
        a new client id), each required to succeed."""
        r = self.exchange_id()
        assert r.status == St.OK, f"EXCHANGE_ID of {self.owner!r}: {r!r}"
        r = self.create_session(fore=fore)
        assert r.status == St.OK, f"CREATE_SESSION of {self.owner!r}: {r!r}"
        if reclaim_complete:
            r = self.compound([op_reclaim_complete()])
            assert r.status == St.OK, f"RECLAIM_COMPLETE of {self.owner!r}: {r!r}"
        return self

    def seq_op(self, slot: int = 0, cachethis: bool = False, seqid: int | None = None, sessionid: bytes | None = None):
        if seqid is None:
            seqid = self.next_seq.get(slot, 1)
        highest = max([slot, *self.next_seq.keys()])
        return op_sequence(sessionid or self.sessionid, seqid, slot, highest, cachethis)

    def compound(self, ops, slot: int = 0, cachethis: bool = False, seqid: int | None = None, cred: bytes | None = None, sessionid: bytes | None = None, minor: int = 1) -> StateReply:
        """SEQUENCE (this session, `slot`, its next sequence id unless
        `seqid` is given) + ops, in a COMPOUND of minor version `minor`."""
        seq = self.seq_op(slot, cachethis, seqid, sessionid)
        used = Unpacker(seq[1][16:20]).u32()
        r = self.call([seq] + list(ops), cred, minor=minor)
        if sessionid is None and r.results and r[0].opnum == Op.SEQUENCE and r[0].status == St.OK:
            self.next_seq[slot] = used + 1
        return r

    def sequence(self, **kw) -> StateReply:
        """A lone SEQUENCE (lease renewal)."""
        return self.compound([], **kw)

    # -- files, opens and locks --

    def root_fh(self) -> bytes:
        r = self.compound([op_putrootfh(), op_getfh()])
        assert r.status == St.OK, f"PUTROOTFH+GETFH: {r!r}"
        return r[2].fh

    def open(self, name: str, access: int = OPEN4_SHARE_ACCESS_BOTH, deny: int = OPEN4_SHARE_DENY_NONE, create: bool = True, owner: bytes | None = None, dir_fh: bytes | None = None) -> StateReply:
        """OPEN `name` in the root (or dir_fh) + GETFH. On success the reply
        has .stateid and .fh."""
        put = op_putfh(dir_fh) if dir_fh is not None else op_putrootfh()
        r = self.compound([put, op_open(owner or (self.owner + b"/open"), name, access=access, deny=deny, create=create), op_getfh()])
        if r.status == St.OK:
            r.stateid, r.fh = r[2].stateid, r[3].fh
        return r

    def must_open(self, name: str, **kw) -> tuple[bytes, bytes]:
        """(open stateid, filehandle) of a successful open."""
        r = self.open(name, **kw)
        assert r.status == St.OK, f"OPEN {name!r} by {self.owner!r}: {r!r}"
        return r.stateid, r.fh

    def lock(self, fh: bytes, open_stateid: bytes, owner: bytes | None = None, offset: int = 0, length: int = NFS4_UINT64_MAX, locktype: int = WRITE_LT, reclaim: bool = False) -> StateReply:
        """PUTFH + LOCK by a new lock owner; on success the reply has .stateid."""
        r = self.compound([op_putfh(fh), op_lock_new(open_stateid, owner or (self.owner + b"/lock"), offset, length, locktype, reclaim)])
        if r.status == St.OK:
            r.stateid = r[2].stateid
        return r

    def test_stateids(self, stateids) -> list[int]:
        r = self.compound([op_test_stateid(list(stateids))])
        assert r.status == St.OK, f"TEST_STATEID: {r!r}"
        return r[1].codes


# --- assertions on replies ----------------------------------------------------


def expect(r, status: int, what: str):
    """The COMPOUND `r` ended with `status` (on its last result)."""
    assert r.status == status, f"{what}: expected {st_name(status)}, got {r!r}"
    return r


def expect_ok(r, what: str):
    return expect(r, St.OK, what)


def expect_in(r, statuses, what: str):
    assert r.status in statuses, f"{what}: expected one of {[st_name(s) for s in statuses]}, got {r!r}"
    return r
