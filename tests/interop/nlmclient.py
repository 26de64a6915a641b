"""A small raw ONC RPC client for the Network Lock Manager, version 4
(NLMv4: the XNFS NLM protocol, Open Group "Protocols for Interworking:
XNFS, Version 3W" chapter 10, with the 64-bit types of RFC 1813's NLMv4
section) and the Network Status Monitor, version 1 (XNFS chapter 11), for
tests.

Framing, XDR and the TCP connection come from rpcclient.py; over UDP a
`UdpConn` with the same calling interface is used, and `source=` makes a
client call from another local address (127.0.0.2, say: another client
host as the server sees it). Every NLM procedure returns an `NlmRes`
(cookie, status, and for TEST the holder of a conflicting lock, for
SHARE the sequence); `call_raw()` sends arbitrary argument bytes and
returns the RPC reply header, for malformed requests.

The encoders and decoders of the NSM types and of NLM_GRANTED's
arguments also serve the tests' fake client host (portmapper, status
monitor, lock manager), which the server under test calls back.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import rpcclient as rc
from rpcclient import AUTH_NONE, MSG_ACCEPTED, MSG_REPLY, SUCCESS, Packer, RpcCall, RpcReply, Unpacker, auth_sys, call_header, next_xid

# --- programs and procedures -------------------------------------------------

NLM_PROGRAM = 100021
NLM_V4 = 4
NSM_PROGRAM = 100024
NSM_V1 = 1
PMAP_PROGRAM = 100000
IPPROTO_TCP = 6
IPPROTO_UDP = 17

# XNFS limits: LM_MAXSTRLEN for caller_name, MAXNETOBJ_SZ for netobj,
# SM_MAXSTRLEN for NSM names; NFS3_FHSIZE bounds an NLMv4 file handle.
LM_MAXSTRLEN = 1024
MAXNETOBJ_SZ = 1024
SM_MAXSTRLEN = 1024
NFS3_FHSIZE = 64

# The largest offset an NLMv4 lock may reach (Linux: NLM4_OFFSET_MAX).
OFFSET_MAX = (1 << 63) - 1


class NlmProc:
    """NLMv4 procedure numbers (XNFS chapter 10; RFC 1813 NLMv4)."""

    NULL = 0
    TEST = 1
    LOCK = 2
    CANCEL = 3
    UNLOCK = 4
    GRANTED = 5
    TEST_MSG = 6
    LOCK_MSG = 7
    CANCEL_MSG = 8
    UNLOCK_MSG = 9
    GRANTED_MSG = 10
    TEST_RES = 11
    LOCK_RES = 12
    CANCEL_RES = 13
    UNLOCK_RES = 14
    GRANTED_RES = 15
    SHARE = 20
    UNSHARE = 21
    NM_LOCK = 22
    FREE_ALL = 23


class SmProc:
    """NSM version 1 procedure numbers (XNFS chapter 11)."""

    NULL = 0
    STAT = 1
    MON = 2
    UNMON = 3
    UNMON_ALL = 4
    SIMU_CRASH = 5
    NOTIFY = 6


class S:
    """nlm4_stats."""

    GRANTED = 0
    DENIED = 1
    DENIED_NOLOCKS = 2
    BLOCKED = 3
    DENIED_GRACE_PERIOD = 4
    DEADLCK = 5
    ROFS = 6
    STALE_FH = 7
    FBIG = 8
    FAILED = 9


_S_NAMES = {v: k for k, v in vars(S).items() if not k.startswith("_")}


def stat_name(code) -> str:
    if code is None:
        return "None"
    n = _S_NAMES.get(code)
    return f"NLM4_{n}({code})" if n else f"nlm4_stats {code}"


# NSM res
STAT_SUCC = 0
STAT_FAIL = 1

# fsh4_mode (deny modes) and fsh4_access of NLM SHARE
FSM_DN, FSM_DR, FSM_DW, FSM_DRW = 0, 1, 2, 3
FSA_NONE, FSA_R, FSA_W, FSA_RW = 0, 1, 2, 3


# --- XDR of the NLMv4 types ----------------------------------------------------


def _b(s) -> bytes:
    return s.encode() if isinstance(s, str) else bytes(s)


@dataclass
class Lock:
    """nlm4_lock: who (caller_name, svid, oh) locks which bytes of which
    file. `length` 0 means to the end of the file, whatever its size."""

    caller: str | bytes
    fh: bytes
    oh: bytes
    svid: int
    offset: int = 0
    length: int = 0

    def encode(self) -> bytes:
        p = Packer().opaque(_b(self.caller)).opaque(self.fh).opaque(self.oh).i32(self.svid)
        return p.u64(self.offset).u64(self.length).bytes()

    def range(self, offset: int, length: int) -> "Lock":
        """The same owner and file, another range."""
        return Lock(self.caller, self.fh, self.oh, self.svid, offset, length)


@dataclass
class Share:
    """nlm4_share: a DOS share reservation (XNFS NLM_SHARE)."""

    caller: str | bytes
    fh: bytes
    oh: bytes
    mode: int = FSM_DN
    access: int = FSA_R

    def encode(self) -> bytes:
        return Packer().opaque(_b(self.caller)).opaque(self.fh).opaque(self.oh).u32(self.mode).u32(self.access).bytes()


@dataclass
class Holder:
    """nlm4_holder: the conflicting lock a TEST reports."""

    exclusive: bool
    svid: int
    oh: bytes
    offset: int
    length: int


def testargs(lock: Lock, exclusive: bool, cookie: bytes) -> bytes:
    return Packer().opaque(cookie).bool(exclusive).raw(lock.encode()).bytes()


def lockargs(lock: Lock, exclusive: bool, block: bool, reclaim: bool, state: int, cookie: bytes) -> bytes:
    return Packer().opaque(cookie).bool(block).bool(exclusive).raw(lock.encode()).bool(reclaim).i32(state).bytes()


def cancargs(lock: Lock, exclusive: bool, block: bool, cookie: bytes) -> bytes:
    return Packer().opaque(cookie).bool(block).bool(exclusive).raw(lock.encode()).bytes()


def unlockargs(lock: Lock, cookie: bytes) -> bytes:
    return Packer().opaque(cookie).raw(lock.encode()).bytes()


def shareargs(share: Share, reclaim: bool, cookie: bytes) -> bytes:
    return Packer().opaque(cookie).raw(share.encode()).bool(reclaim).bytes()


def notifyargs(name: str | bytes, state: int) -> bytes:
    """nlm4_notify (FREE_ALL)."""
    return Packer().opaque(_b(name)).i32(state).bytes()


@dataclass
class NlmRes:
    """One NLM procedure's results."""

    proc: str
    cookie: bytes
    stat: int
    holder: Holder | None = None
    sequence: int | None = None

    def __repr__(self):
        extra = ""
        if self.holder is not None:
            extra += f", holder={self.holder!r}"
        if self.sequence is not None:
            extra += f", sequence={self.sequence}"
        return f"{self.proc}({stat_name(self.stat)}, cookie={self.cookie.hex()}{extra})"


def decode_testargs(args: bytes) -> tuple[bytes, bool, Lock]:
    """(cookie, exclusive, lock) of nlm4_testargs, as NLM4 GRANTED carries
    them to a client."""
    u = Unpacker(args)
    cookie, exclusive = u.opaque(), u.bool()
    lk = Lock(u.opaque(), u.opaque(), u.opaque(), u.i32(), u.u64(), u.u64())
    u.done()
    return cookie, exclusive, lk


def encode_res(cookie: bytes, stat: int) -> bytes:
    """nlm4_res, as a client answers NLM4 GRANTED."""
    return Packer().opaque(cookie).u32(stat).bytes()


def decode_res(proc: str, body: bytes) -> NlmRes:
    u = Unpacker(body)
    r = NlmRes(proc, u.opaque(), u.u32())
    u.done()
    return r


def decode_testres(body: bytes) -> NlmRes:
    u = Unpacker(body)
    cookie, st = u.opaque(), u.u32()
    holder = None
    if st == S.DENIED:
        holder = Holder(u.bool(), u.i32(), u.opaque(), u.u64(), u.u64())
    u.done()
    return NlmRes("TEST", cookie, st, holder=holder)


def decode_shareres(proc: str, body: bytes) -> NlmRes:
    u = Unpacker(body)
    r = NlmRes(proc, u.opaque(), u.u32(), sequence=u.i32())
    u.done()
    return r


# --- XDR of the NSM types ---------------------------------------------------------


def sm_name(name: str | bytes) -> bytes:
    return Packer().opaque(_b(name)).bytes()


def my_id(my_name: str | bytes, prog: int = NLM_PROGRAM, vers: int = NLM_V4, proc: int = 16) -> bytes:
    return Packer().opaque(_b(my_name)).i32(prog).i32(vers).i32(proc).bytes()


def mon_id(mon_name: str | bytes, my_name: str | bytes, prog: int = NLM_PROGRAM, vers: int = NLM_V4, proc: int = 16) -> bytes:
    return Packer().opaque(_b(mon_name)).raw(my_id(my_name, prog, vers, proc)).bytes()


def mon(mon_name, my_name, priv: bytes = b"\0" * 16, prog: int = NLM_PROGRAM, vers: int = NLM_V4, proc: int = 16) -> bytes:
    assert len(priv) == 16
    return Packer().raw(mon_id(mon_name, my_name, prog, vers, proc)).fixed(priv).bytes()


def stat_chge(mon_name: str | bytes, state: int) -> bytes:
    return Packer().opaque(_b(mon_name)).i32(state).bytes()


@dataclass
class SmStatRes:
    res_stat: int
    state: int


def decode_sm_stat_res(body: bytes) -> SmStatRes:
    u = Unpacker(body)
    r = SmStatRes(u.u32(), u.i32())
    u.done()
    return r


def decode_sm_stat(body: bytes) -> int:
    u = Unpacker(body)
    state = u.i32()
    u.done()
    return state


def decode_stat_chge(args: bytes) -> tuple[bytes, int]:
    """(mon_name, state) of an SM_NOTIFY's arguments."""
    u = Unpacker(args)
    name, state = u.opaque(), u.i32()
    u.done()
    return name, state


# --- transports ------------------------------------------------------------------


class BoundConn(rc.Conn):
    """rpcclient.Conn from a chosen local address (another loopback
    address, 127.0.0.2 say, so the server sees another client host)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, source: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self._stash = {}
        self.calls = []


class UdpConn:
    """RPC over UDP (RFC 5531: one call per datagram, no record marking),
    with the calling interface of rpcclient.Conn that the clients use."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, source: str | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(timeout)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.connect((host, port))
        self._stash: dict[int, RpcReply] = {}

    def close(self):
        self.sock.close()

    def send_record(self, record: bytes, fragments=1):
        self.sock.send(record)

    def wait_for(self, xid: int) -> RpcReply:
        """The reply to `xid` (raises socket.timeout); datagrams answering
        other xids are kept."""
        while xid not in self._stash:
            data = self.sock.recv(65536)
            if len(data) < 8 or struct.unpack(">I", data[4:8])[0] != MSG_REPLY:
                continue
            r = RpcReply(data)
            self._stash[r.xid] = r
        return self._stash.pop(xid)


class RpcFailure(AssertionError):
    """The call was not accepted with SUCCESS."""

    def __init__(self, what: str, reply: RpcReply):
        super().__init__(f"{what}: RPC not accepted with SUCCESS: {reply!r}")
        self.reply = reply


class NlmClient:
    """NLMv4 and NSM v1 calls over one TCP connection (or UDP socket) with
    an AUTH_SYS identity, from 127.0.0.1 or the local address `source`.
    Each call takes its own cookie (`cookie=`); the default is a fresh
    8-byte one, so replies can be checked to echo it."""

    def __init__(self, port: int, host: str = "127.0.0.1", udp: bool = False, uid: int = 0, gid: int = 0, machine: str = "nlmclient", timeout: float = 10.0, source: str | None = None):
        self.port, self.host, self.udp = port, host, udp
        if udp:
            self.conn = UdpConn(port, host, timeout, source)
        elif source is not None:
            self.conn = BoundConn(port, host, timeout, source)
        else:
            self.conn = rc.Conn(port, host, timeout=timeout)
        self.cred = auth_sys(uid=uid, gid=gid, gids=[gid], machine=machine)
        self._cookies = 0

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def new_cookie(self) -> bytes:
        self._cookies += 1
        return struct.pack(">II", 0x6E6C6D00, self._cookies)

    # -- raw --

    def call_raw(self, prog: int, vers: int, proc: int, args: bytes = b"", cred: bytes | None = None, cred_flavor: int = rc.AUTH_SYS) -> RpcReply:
        xid = next_xid()
        body = cred if cred is not None else (self.cred if cred_flavor == rc.AUTH_SYS else b"")
        hdr = call_header(xid, prog=prog, vers=vers, proc=proc, cred_flavor=cred_flavor, cred_body=body)
        self.conn.send_record(hdr + args)
        return self.conn.wait_for(xid)

    def call(self, prog: int, vers: int, proc: int, args: bytes, what: str) -> bytes:
        r = self.call_raw(prog, vers, proc, args)
        if r.reply_stat != MSG_ACCEPTED or r.accept_stat != SUCCESS:
            raise RpcFailure(what, r)
        return r.body

    def nlm(self, proc: int, args: bytes, what: str) -> bytes:
        return self.call(NLM_PROGRAM, NLM_V4, proc, args, what)

    def nsm(self, proc: int, args: bytes, what: str) -> bytes:
        return self.call(NSM_PROGRAM, NSM_V1, proc, args, what)

    # -- NLMv4 --

    def null(self) -> RpcReply:
        return self.call_raw(NLM_PROGRAM, NLM_V4, NlmProc.NULL)

    def test(self, lock: Lock, exclusive: bool = True, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_testres(self.nlm(NlmProc.TEST, testargs(lock, exclusive, c), "NLM4 TEST"))

    def lock(self, lock: Lock, exclusive: bool = True, block: bool = False, reclaim: bool = False, state: int = 1, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_res("LOCK", self.nlm(NlmProc.LOCK, lockargs(lock, exclusive, block, reclaim, state, c), "NLM4 LOCK"))

    def nm_lock(self, lock: Lock, exclusive: bool = True, block: bool = False, reclaim: bool = False, state: int = 0, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_res("NM_LOCK", self.nlm(NlmProc.NM_LOCK, lockargs(lock, exclusive, block, reclaim, state, c), "NLM4 NM_LOCK"))

    def cancel(self, lock: Lock, exclusive: bool = True, block: bool = True, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_res("CANCEL", self.nlm(NlmProc.CANCEL, cancargs(lock, exclusive, block, c), "NLM4 CANCEL"))

    def unlock(self, lock: Lock, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_res("UNLOCK", self.nlm(NlmProc.UNLOCK, unlockargs(lock, c), "NLM4 UNLOCK"))

    def share(self, share: Share, reclaim: bool = False, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_shareres("SHARE", self.nlm(NlmProc.SHARE, shareargs(share, reclaim, c), "NLM4 SHARE"))

    def unshare(self, share: Share, cookie: bytes | None = None) -> NlmRes:
        c = self.new_cookie() if cookie is None else cookie
        return decode_shareres("UNSHARE", self.nlm(NlmProc.UNSHARE, shareargs(share, False, c), "NLM4 UNSHARE"))

    def free_all(self, name: str | bytes, state: int = 0) -> None:
        body = self.nlm(NlmProc.FREE_ALL, notifyargs(name, state), "NLM4 FREE_ALL")
        assert body == b"", f"FREE_ALL returns void, got {len(body)} bytes"

    # -- NSM v1 --

    def sm_null(self) -> RpcReply:
        return self.call_raw(NSM_PROGRAM, NSM_V1, SmProc.NULL)

    def sm_stat(self, name: str | bytes) -> SmStatRes:
        return decode_sm_stat_res(self.nsm(SmProc.STAT, sm_name(name), "SM_STAT"))

    def sm_mon(self, mon_name, my_name, priv: bytes = b"\0" * 16) -> SmStatRes:
        return decode_sm_stat_res(self.nsm(SmProc.MON, mon(mon_name, my_name, priv), "SM_MON"))

    def sm_unmon(self, mon_name, my_name) -> int:
        return decode_sm_stat(self.nsm(SmProc.UNMON, mon_id(mon_name, my_name), "SM_UNMON"))

    def sm_unmon_all(self, my_name) -> int:
        return decode_sm_stat(self.nsm(SmProc.UNMON_ALL, my_id(my_name), "SM_UNMON_ALL"))

    def sm_notify(self, mon_name: str | bytes, state: int) -> None:
        body = self.nsm(SmProc.NOTIFY, stat_chge(mon_name, state), "SM_NOTIFY")
        assert body == b"", f"SM_NOTIFY returns void, got {len(body)} bytes"


# --- the server side, for fakes the server under test calls ------------------------


def accepted_reply(call: RpcCall, body: bytes = b"", accept_stat: int = SUCCESS) -> bytes:
    """An accepted reply (AUTH_NONE verifier) to `call`, unframed."""
    return Packer().u32(call.xid).u32(MSG_REPLY).u32(MSG_ACCEPTED).u32(AUTH_NONE).opaque(b"").u32(accept_stat).bytes() + body


def parse_call(data: bytes) -> RpcCall | None:
    """The RPC call in a datagram, or None when it is not one."""
    if len(data) < 8 or struct.unpack(">I", data[4:8])[0] != rc.MSG_CALL:
        return None
    try:
        return RpcCall(data)
    except (rc.XdrError, AssertionError):
        return None


def universal_address(host: str, port: int) -> str:
    """RFC 5665 universal address of an IPv4 host and port."""
    return f"{host}.{port >> 8}.{port & 0xFF}"


@dataclass
class PortmapQuery:
    """One question the fake portmapper was asked."""

    vers: int
    proc: int
    prog: int | None = None
    prog_vers: int | None = None
    prot: int | str | None = None
    answered: int | str | None = None
    raw: bytes = field(default=b"", repr=False)
