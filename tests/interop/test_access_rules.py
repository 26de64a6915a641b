"""Access rules from `sluice serve --config FILE`, checked against the real binary.

Each test writes a TOML config into tmp_path (export and state directories
in tmp_path, `listen = "127.0.0.1:0"`), starts `sluice serve --config FILE`,
reads the "listening on ADDR:PORT" line and talks raw ONC RPC / NFSv4.1 to
it with rpcclient.py:

* bad config files stop the server at start with the file, line and key;
* `clients` address ranges and `require_privileged_port` close refused
  connections without a reply, and allowed clients are still served;
* `read_only` refuses every change with NFS4ERR_ROFS while reads work;
* `squash` / `anon_uid` / `anon_gid` decide who owns created files;
* callers run with their own groups only, and only root may use the
  blocks a file system keeps for root;
* `max_read` / `max_write` are advertised and enforced;
* `max_connections` closes connections over the limit;
* SIGTERM stops the server cleanly (exit status 0).

Loopback accepts any 127.0.0.0/8 source address, so a client socket bound
to 127.0.0.2 before connecting looks like another host to the server; as
root, a client can bind a source port below 1024.

The binary is $SLUICE_BINARY when set (a separately built copy), else the
one conftest builds. No sleeps are used for synchronisation: waits are
blocking socket reads with timeouts, or polls bounded by a deadline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

import rpcclient as rc
from conftest import LoopMount, make_ext4
from rpcclient import MSG_ACCEPTED, SUCCESS, Conn, Packer, Session, St, Unpacker, call_header, next_xid

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

# nfs_opnum4 values not in rpcclient.Op.
OP_CLOSE = 4
OP_CREATE = 6
OP_OPEN = 18
OP_REMOVE = 28
OP_SETATTR = 34
OP_WRITE = 38

NFS4ERR_ACCESS = 13
NFS4ERR_NOSPC = 28
NFS4ERR_ROFS = 30
NFS4ERR_DQUOT = 69
SHARE_ACCESS_READ = 1
SHARE_ACCESS_WRITE = 2
SHARE_ACCESS_BOTH = 3
NF4DIR = 2
FILE_SYNC4 = 2
ATTR_MAXREAD = 30
ATTR_MAXWRITE = 31
ATTR_MODE = 33


# --- the server under test ---------------------------------------------------


@pytest.fixture(scope="module")
def binary(request) -> Path:
    """$SLUICE_BINARY if set (so nothing is rebuilt), else conftest's build."""
    env = os.environ.get("SLUICE_BINARY")
    if env:
        path = Path(env)
        assert path.is_file() and os.access(path, os.X_OK), f"SLUICE_BINARY={env} is not an executable"
        return path
    return request.getfixturevalue("sluice_binary")


def toml_str(s) -> str:
    """A TOML basic string (JSON string escapes are valid TOML)."""
    return json.dumps(str(s))


class ConfigServer:
    """`sluice serve --config FILE` on 127.0.0.1, port picked by the kernel."""

    def __init__(self, binary: Path, base: Path, server: str = "", export: str = "", wrapper=()):
        base.mkdir()
        self.binary = binary
        # A command the server is started through (e.g. setpriv).
        self.wrapper = list(wrapper)
        self.export = base / "export"
        self.state = base / "state"
        self.export.mkdir()
        self.state.mkdir()
        self.config = base / "sluice.toml"
        self.config.write_text(
            "[server]\n"
            'listen = "127.0.0.1:0"\n'
            f"state_dir = {toml_str(self.state)}\n"
            f"{server}\n"
            "[[export]]\n"
            f"path = {toml_str(self.export)}\n"
            f"{export}\n"
        )
        self.log_path = base / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.wrapper, str(self.binary), "serve", "--config", str(self.config)],
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


@pytest.fixture
def serve(binary, tmp_path):
    """Starts servers from config snippets; stops them all at the end."""
    servers: list[ConfigServer] = []

    def start(server: str = "", export: str = "", name: str | None = None, wrapper=()) -> ConfigServer:
        s = ConfigServer(binary, tmp_path / (name or f"srv{len(servers)}"), server, export, wrapper)
        servers.append(s)
        s.start()
        return s

    yield start
    for s in servers:
        s.stop()


# --- clients -----------------------------------------------------------------


class SrcConn(Conn):
    """A Conn whose socket is bound to a chosen source address and port."""

    def __init__(self, port: int, src_ip: str = "127.0.0.1", src_port: int = 0, timeout: float = 5.0):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((src_ip, src_port))
            sock.settimeout(timeout)
            sock.connect(("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._stash = {}


def privileged_conn(port: int, src_ip: str = "127.0.0.1") -> SrcConn:
    """A connection from a free source port in 600..1023 (we are root)."""
    ports = list(range(600, 1024))
    random.shuffle(ports)
    last = None
    for p in ports[:60]:
        try:
            return SrcConn(port, src_ip, p)
        except OSError as e:  # in use, or that 4-tuple still in TIME_WAIT
            last = e
    raise AssertionError(f"no free privileged source port found: {last}")


def null_ok(c: Conn):
    r = c.null()
    assert (r.reply_stat, r.accept_stat, r.body) == (MSG_ACCEPTED, SUCCESS, b""), r


def refusal(make_conn) -> str | None:
    """Connects with make_conn() and sends a NULL call. None when the server
    closed the connection without a reply (EOF or reset); otherwise what
    happened instead."""
    try:
        c = make_conn()
    except ConnectionRefusedError:
        return "connect() refused: nothing listens on the port"
    with c:
        try:
            c.send_record(call_header(next_xid()))
        except (BrokenPipeError, ConnectionResetError):
            return None
        try:
            data = c.sock.recv(65536)
        except ConnectionResetError:
            return None
        except socket.timeout:
            return "no reply, and the connection was still open after 5 s"
        if data == b"":
            return None
        try:
            return f"the server answered: {rc.RpcReply(data[4:])!r}"
        except Exception:
            return f"the server sent {len(data)} bytes: {data[:32]!r}"


def refusal_logged(server: ConfigServer, ip: str) -> bool:
    return any("connection refused" in line and f"{ip}:" in line for line in server.log().splitlines())


def assert_serves(server: ConfigServer, make_conn=None):
    """The server is alive, answers NULL on a fresh allowed connection, and
    its log holds no panic."""
    assert server.alive(), f"server exited; log:\n{server.log()}"
    with (make_conn or (lambda: Conn(server.port)))() as c:
        null_ok(c)
    log = server.log()
    assert "panicked" not in log, f"server panicked; log:\n{log}"


def poll_until(what: str, fn, timeout: float = 5.0):
    """Calls fn() until it returns a true value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- NFSv4.1 ops and results -------------------------------------------------


def fattr(words=(), vals: bytes = b"") -> bytes:
    return Packer().bitmap(list(words)).opaque(vals).bytes()


def mode_attr(mode: int) -> bytes:
    return fattr([0, 1 << (ATTR_MODE - 32)], struct.pack(">I", mode))


def op_open(clientid: int, name: str, access: int, create: bool = False, owner: bytes = b"rules-owner", mode: int = 0o644):
    p = Packer().u32(0).u32(access).u32(0).u64(clientid).opaque(owner)
    if create:
        p.u32(1).u32(0).raw(mode_attr(mode))  # OPEN4_CREATE, UNCHECKED4
    else:
        p.u32(0)  # OPEN4_NOCREATE
    p.u32(0).string(name)  # CLAIM_NULL
    return (OP_OPEN, p.bytes())


def op_close(sid: bytes):
    return (OP_CLOSE, Packer().u32(0).fixed(sid).bytes())


def op_write(sid: bytes, offset: int, data: bytes, stable: int = FILE_SYNC4):
    return (OP_WRITE, Packer().fixed(sid).u64(offset).u32(stable).opaque(data).bytes())


def op_mkdir(name: str):
    return (OP_CREATE, Packer().u32(NF4DIR).string(name).raw(fattr()).bytes())


def op_remove(name: str):
    return (OP_REMOVE, Packer().string(name).bytes())


def op_setattr_mode(mode: int, sid: bytes = rc.ANONYMOUS_STATEID):
    return (OP_SETATTR, Packer().fixed(sid).raw(mode_attr(mode)).bytes())


class Res:
    def __init__(self, opnum: int, status: int, **fields):
        self.opnum, self.status = opnum, status
        self.__dict__.update(fields)

    def __repr__(self):
        extra = {k: (f"<{len(v)} bytes>" if isinstance(v, bytes) and len(v) > 32 else v) for k, v in self.__dict__.items() if k not in ("opnum", "status")}
        return f"Res(op={self.opnum}, status={self.status}, {extra})"


def _cinfo(u: Unpacker) -> dict:
    return {"atomic": u.bool(), "before": u.u64(), "after": u.u64()}


def _body(opnum: int, u: Unpacker) -> dict:
    if opnum in (rc.Op.PUTROOTFH, rc.Op.PUTFH, rc.Op.LOOKUP, rc.Op.SAVEFH, rc.Op.RESTOREFH):
        return {}
    if opnum == rc.Op.SEQUENCE:
        return {"sessionid": u.fixed(16), "rest": [u.u32() for _ in range(5)]}
    if opnum == rc.Op.GETFH:
        return {"fh": u.opaque()}
    if opnum == rc.Op.GETATTR:
        return {"attrmask": u.bitmap(), "attrvals": u.opaque()}
    if opnum == rc.Op.READ:
        return {"eof": u.bool(), "data": u.opaque()}
    if opnum == OP_OPEN:
        r = {"stateid": u.fixed(16), **_cinfo(u), "rflags": u.u32(), "attrset": u.bitmap(), "deleg": u.u32()}
        assert r["deleg"] == 0, f"unexpected delegation {r}"
        return r
    if opnum == OP_CLOSE:
        return {"stateid": u.fixed(16)}
    if opnum == OP_WRITE:
        return {"count": u.u32(), "committed": u.u32(), "verf": u.fixed(8)}
    if opnum == OP_CREATE:
        return {**_cinfo(u), "attrset": u.bitmap()}
    if opnum == OP_REMOVE:
        return _cinfo(u)
    if opnum == OP_SETATTR:
        return {"attrsset": u.bitmap()}
    raise AssertionError(f"no decoder for op {opnum}")


class Reply:
    """A COMPOUND reply decoded for the ops used here; decoding stops at the
    first failed op (which ends the COMPOUND)."""

    def __init__(self, body: bytes):
        u = Unpacker(body)
        self.status = u.u32()
        u.opaque()
        n = u.u32()
        self.results: list[Res] = []
        for _ in range(n):
            opnum, status = u.u32(), u.u32()
            if status != St.OK:
                self.results.append(Res(opnum, status))
                break
            self.results.append(Res(opnum, status, **_body(opnum, u)))

    def __getitem__(self, i) -> Res:
        return self.results[i]

    def statuses(self):
        return [(r.opnum, r.status) for r in self.results]

    def __repr__(self):
        return f"Reply(status={self.status}, results={self.results})"


def compound(s: Session, ops, uid: int = 0, gid: int = 0, minor: int = 1) -> Reply:
    """SEQUENCE + ops on s's slot 0, as AUTH_SYS uid/gid, in a COMPOUND of
    minor version `minor`."""
    cred = rc.auth_sys(uid=uid, gid=gid, gids=[gid])
    r = s.conn.call(rc.PROC_COMPOUND, rc.compound_args([s.seq_op()] + list(ops), minor), cred_body=cred)
    assert (r.reply_stat, r.accept_stat) == (MSG_ACCEPTED, SUCCESS), r
    return Reply(r.body)


def expect_ok(r: Reply, what: str) -> Reply:
    assert r.status == St.OK, f"{what}: {r!r}"
    return r


def expect_rofs(r: Reply, opnum: int, what: str):
    assert r.status == NFS4ERR_ROFS and r.results[-1].opnum == opnum, f"{what}: expected NFS4ERR_ROFS from op {opnum}, got {r!r}"


# --- 1. bad config files -----------------------------------------------------


@pytest.mark.parametrize(
    "section,line,key",
    [
        ("export", "read_onyl = true", "read_onyl"),
        ("export", 'squash = "some"', "squash"),
        ("export", 'clients = ["10.0.0.0/40"]', "clients"),
        ("export", 'max_read = "2M"', "max_read"),
        ("server", 'lease_time = "long"', "lease_time"),
        ("server", "max_connections = 0", "max_connections"),
        ("server", "busy_poll_us = 20000", "busy_poll_us"),
        ("server", 'tcp_congestion = "nonesuch"', "tcp_congestion"),
    ],
    ids=[
        "unknown-key",
        "bad-squash",
        "bad-prefix",
        "max-read-too-big",
        "lease-not-number",
        "zero-connections",
        "busy-poll-too-long",
        "unknown-congestion-control",
    ],
)
def test_bad_config_fails_at_start(binary, tmp_path, section, line, key):
    export = tmp_path / "export"
    export.mkdir()
    lines = [
        "# sluice test config",
        "[server]",
        'listen = "127.0.0.1:0"',
        f"state_dir = {toml_str(tmp_path / 'state')}",
        "",
        "[[export]]",
        f"path = {toml_str(export)}",
    ]
    at = lines.index("[[export]]") if section == "server" else len(lines)
    lines.insert(at, line)
    lineno = at + 1
    cfg = tmp_path / "bad.toml"
    cfg.write_text("\n".join(lines) + "\n")
    try:
        p = subprocess.run(
            [str(binary), "serve", "--config", str(cfg)],
            capture_output=True,
            timeout=15,
            env={**os.environ, "RUST_LOG": "info"},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"sluice kept running with a bad config ({line!r}); stdout {e.stdout!r}")
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    assert p.returncode != 0, f"exit status 0 for {line!r}; stderr:\n{err}"
    assert "listening on" not in out, f"sluice listened with a bad config ({line!r}): {out!r}"
    assert f"{cfg}:{lineno}:" in err, f"stderr does not name {cfg}:{lineno} for {line!r}:\n{err}"
    assert key in err.replace(str(cfg), ""), f"stderr does not name the key {key!r} for {line!r}:\n{err}"
    assert not (tmp_path / "state" / "handle.key").exists(), "a bad config still got as far as creating the handle key"


def test_missing_config_file_fails(binary, tmp_path):
    cfg = tmp_path / "nope.toml"
    p = subprocess.run([str(binary), "serve", "--config", str(cfg)], capture_output=True, timeout=15)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and str(cfg) in err, (p.returncode, err)
    assert b"listening on" not in p.stdout


# --- 2. client address ranges ------------------------------------------------


def test_client_outside_range_is_closed_without_reply(serve):
    shut = serve(export='clients = ["10.9.9.0/24"]')
    why = refusal(lambda: Conn(shut.port))
    assert why is None, f"NULL from 127.0.0.1 with clients = [10.9.9.0/24]: expected the connection closed without a reply; {why}"
    assert shut.alive(), f"server exited after refusing a client; log:\n{shut.log()}"
    assert refusal_logged(shut, "127.0.0.1"), f"no 'connection refused' log line for 127.0.0.1; log:\n{shut.log()}"

    opened = serve(export='clients = ["127.0.0.0/8"]')
    assert_serves(opened)


def test_refused_address_does_not_disturb_allowed_one(serve):
    srv = serve(export='clients = ["127.0.0.1"]')
    with SrcConn(srv.port, "127.0.0.1") as keep:
        null_ok(keep)
        why = refusal(lambda: SrcConn(srv.port, "127.0.0.2"))
        assert why is None, f"NULL from 127.0.0.2 with clients = [127.0.0.1]: expected the connection closed without a reply; {why}"
        # The connection open before the refusal still works, and so does a new one.
        null_ok(keep)
        s = Session(keep)
        assert s.root_fh()
    assert_serves(srv, lambda: SrcConn(srv.port, "127.0.0.1"))
    assert refusal_logged(srv, "127.0.0.2"), f"no 'connection refused' log line for 127.0.0.2; log:\n{srv.log()}"
    assert not refusal_logged(srv, "127.0.0.1"), f"127.0.0.1 was refused; log:\n{srv.log()}"


# --- 3. privileged source ports ----------------------------------------------


def test_require_privileged_port(serve):
    srv = serve(server="require_privileged_port = true")
    why = refusal(lambda: SrcConn(srv.port, "127.0.0.1", 0))
    assert why is None, f"NULL from an ephemeral (>= 1024) source port with require_privileged_port: expected the connection closed without a reply; {why}"
    with privileged_conn(srv.port) as c:
        assert c.sock.getsockname()[1] < 1024
        null_ok(c)
        s = Session(c)
        assert s.root_fh()
    assert_serves(srv, lambda: privileged_conn(srv.port))


# --- 4. read-only export -----------------------------------------------------


def test_read_only_export_refuses_changes(serve):
    srv = serve(export="read_only = true\nsquash = \"none\"")
    content = bytes(range(256)) * 40 + b"tail"
    (srv.export / "file").write_bytes(content)
    (srv.export / "victim").write_bytes(b"keep me")
    os.chmod(srv.export / "victim", 0o644)
    before = sorted(os.listdir(srv.export))
    with Conn(srv.port) as c:
        s = Session(c)
        root = s.root_fh()
        cid = s.clientid

        r = compound(s, [rc.op_putfh(root), op_open(cid, "file", SHARE_ACCESS_WRITE)])
        expect_rofs(r, OP_OPEN, "OPEN existing file for SHARE_ACCESS_WRITE")
        r = compound(s, [rc.op_putfh(root), op_open(cid, "file", SHARE_ACCESS_BOTH)])
        expect_rofs(r, OP_OPEN, "OPEN existing file for SHARE_ACCESS_BOTH")
        r = compound(s, [rc.op_putfh(root), op_open(cid, "newfile", SHARE_ACCESS_READ, create=True)])
        expect_rofs(r, OP_OPEN, "OPEN(create) newfile for read")
        r = compound(s, [rc.op_putfh(root), op_open(cid, "file", SHARE_ACCESS_READ, create=True)])
        expect_rofs(r, OP_OPEN, "OPEN(create, UNCHECKED) of an existing file")
        r = compound(s, [rc.op_putfh(root), op_mkdir("newdir")])
        expect_rofs(r, OP_CREATE, "CREATE (mkdir) newdir")
        r = compound(s, [rc.op_putfh(root), op_remove("victim")])
        expect_rofs(r, OP_REMOVE, "REMOVE victim")
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("victim"), op_setattr_mode(0o600)])
        expect_rofs(r, OP_SETATTR, "SETATTR mode 0600 on victim")
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("victim"), op_write(rc.ANONYMOUS_STATEID, 0, b"overwrite")])
        expect_rofs(r, OP_WRITE, "WRITE (anonymous stateid) to victim")
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("victim"), rc.op_setxattr(b"x", b"1")], minor=2)
        expect_rofs(r, rc.Op.SETXATTR, "SETXATTR on victim")
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("victim"), rc.op_removexattr(b"x")], minor=2)
        expect_rofs(r, rc.Op.REMOVEXATTR, "REMOVEXATTR on victim")

        # Reading works: OPEN for read, READ, CLOSE.
        r = expect_ok(compound(s, [rc.op_putfh(root), op_open(cid, "file", SHARE_ACCESS_READ)]), "OPEN file for read")
        sid = r[2].stateid
        r = expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("file"), rc.op_read(0, 1 << 20, sid)]), "READ file")
        assert r[3].data == content and r[3].eof, r
        r = expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("file"), rc.op_read(1000, 100, sid)]), "READ at 1000")
        assert r[3].data == content[1000:1100] and not r[3].eof, r
        expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("file"), op_close(sid)]), "CLOSE")

    # Nothing changed on the host.
    assert sorted(os.listdir(srv.export)) == before
    assert (srv.export / "victim").read_bytes() == b"keep me"
    assert stat.S_IMODE(os.stat(srv.export / "victim").st_mode) == 0o644
    assert (srv.export / "file").read_bytes() == content
    assert_serves(srv)


# --- 5. identity squashing ---------------------------------------------------


@pytest.mark.parametrize(
    "rules,caller,owner",
    [
        ('squash = "root"\nanon_uid = 4321\nanon_gid = 4322', (0, 0), (4321, 4322)),
        ('squash = "root"\nanon_uid = 4321\nanon_gid = 4322', (1000, 1000), (1000, 1000)),
        ("", (0, 0), (65534, 65534)),  # squash defaults to "root", anon to 65534
        ('squash = "none"', (0, 0), (0, 0)),
        ('squash = "all"\nanon_uid = 4321\nanon_gid = 4322', (1000, 1000), (4321, 4322)),
        ('squash = "all"', (0, 0), (65534, 65534)),
    ],
    ids=["root-uid0", "root-uid1000", "default-uid0", "none-uid0", "all-uid1000", "all-uid0"],
)
def test_squash_decides_owner_of_created_files(serve, rules, caller, owner):
    srv = serve(export=rules)
    os.chmod(srv.export, 0o777)  # so any (squashed) caller may create files
    uid, gid = caller
    with Conn(srv.port) as c:
        s = Session(c)
        root = s.root_fh()
        r = compound(s, [rc.op_putfh(root), op_open(s.clientid, "made", SHARE_ACCESS_BOTH, create=True)], uid=uid, gid=gid)
        expect_ok(r, f"OPEN(create) as {uid}:{gid}")
        sid = r[2].stateid
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("made"), op_write(sid, 0, b"owned"), op_close(sid)], uid=uid, gid=gid)
        expect_ok(r, f"WRITE+CLOSE as {uid}:{gid}")
        assert r[3].count == 5, r
        r = expect_ok(compound(s, [rc.op_putfh(root), op_mkdir("dir")], uid=uid, gid=gid), f"CREATE dir as {uid}:{gid}")
    st = os.stat(srv.export / "made")
    assert (st.st_uid, st.st_gid) == owner, f"{rules!r}: file created by {uid}:{gid} is owned by {st.st_uid}:{st.st_gid}, expected {owner[0]}:{owner[1]}"
    assert (srv.export / "made").read_bytes() == b"owned"
    st = os.stat(srv.export / "dir")
    assert (st.st_uid, st.st_gid) == owner, f"{rules!r}: directory created by {uid}:{gid} is owned by {st.st_uid}:{st.st_gid}, expected {owner[0]}:{owner[1]}"
    assert_serves(srv)


def test_squashed_root_cannot_touch_root_only_files(serve):
    """squash = "root" takes root's powers away: a root-owned 0600 file is
    out of reach of a uid 0 caller, but not with squash = "none"."""
    for rules, want in (('squash = "root"', NFS4ERR_ACCESS), ('squash = "none"', St.OK)):
        srv = serve(export=rules)
        (srv.export / "secret").write_bytes(b"root only")
        os.chmod(srv.export / "secret", 0o600)
        with Conn(srv.port) as c:
            s = Session(c)
            r = compound(s, [rc.op_putrootfh(), rc.op_lookup("secret"), rc.op_read(0, 100)])
            assert r.status == want, f"{rules}: READ of a root-only 0600 file as uid 0: expected status {want}, got {r!r}"
            if want == St.OK:
                assert r[3].data == b"root only"
        assert_serves(srv)
        srv.stop()


def test_callers_do_not_get_the_servers_own_groups(serve):
    """A server started with supplementary groups of its own (root under
    sudo or a service manager often has group 0) does not lend them to
    callers: requests run with the caller's groups only. The server here
    has groups 0 and 4; a file of group 4, mode 0640, is readable by a
    caller in group 4 and by nobody else."""
    srv = serve(wrapper=["setpriv", "--groups=0,4", "--"])
    (srv.export / "adm").write_bytes(b"group 4 only")
    os.chown(srv.export / "adm", 0, 4)
    os.chmod(srv.export / "adm", 0o640)
    ops = [rc.op_putrootfh(), rc.op_lookup("adm"), rc.op_read(0, 100)]
    with Conn(srv.port) as c:
        s = Session(c)
        # Callers with no supplementary groups first (a root squashed loses
        # group 0), several times, so that threads that have not switched
        # groups yet serve them.
        for uid, gid in [(1000, 1000), (0, 0)] * 10:
            cred = rc.auth_sys(uid=uid, gid=gid, gids=[])
            r = c.call(rc.PROC_COMPOUND, rc.compound_args([s.seq_op()] + ops, 1), cred_body=cred)
            r = Reply(r.body)
            assert r.status == NFS4ERR_ACCESS, f"READ of a 0640 file of group 4 as {uid}:{gid} with no other groups (root squashed): expected NFS4ERR_ACCESS, got {r!r}"
        r = expect_ok(compound(s, ops, uid=1000, gid=4), "READ of a 0640 file of group 4 as 1000:4")
        assert r[3].data == b"group 4 only"
    assert_serves(srv)


def test_only_root_writes_into_the_blocks_kept_for_root(binary, tmp_path):
    """A caller other than root cannot use the blocks ext4 keeps for root,
    nor go past a disk quota: like the Linux server, the server gives up
    CAP_SYS_RESOURCE while it acts for one. The export is a 64 MiB ext4
    image with half its blocks kept for root (mkfs -m 50). A caller as
    uid 1000 fills it until NFS4ERR_NOSPC, having written no more than
    what statvfs offers users; root, not squashed, writes into the
    reserve too. The boundary is taken halfway between the two figures.
    Where root itself lacks CAP_SYS_RESOURCE (some containers), the server
    never had it to give up; cred::tests::callers_other_than_root_lose_
    cap_sys_resource checks the switch itself, in a user namespace."""
    image = tmp_path / "reserve.img"
    make_ext4(image, 64 << 20, "-m", "50")
    chunk = 256 << 10
    for name, rules, uid, into_reserve in (("user", "", 1000, False), ("root", 'squash = "none"', 0, True)):
        srv = ConfigServer(binary, tmp_path / name, export=rules)
        disk = LoopMount(image, srv.export)
        try:
            os.chmod(srv.export, 0o777)
            st = os.statvfs(srv.export)
            users, everyone = st.f_bavail * st.f_frsize, st.f_bfree * st.f_frsize
            assert everyone - users > 16 << 20, f"the image keeps too little for root: {users} of {everyone} free bytes for users"
            srv.start()
            written, last = 0, None
            with Conn(srv.port) as c:
                s = Session(c)
                root = s.root_fh()
                r = expect_ok(compound(s, [rc.op_putfh(root), op_open(s.clientid, f"fill-{name}", SHARE_ACCESS_BOTH, create=True)], uid=uid, gid=uid),
                              f"OPEN(create) as {uid}")
                sid = r[2].stateid
                block = os.urandom(chunk)
                while written < everyone + (8 << 20):
                    r = compound(s, [rc.op_putfh(root), rc.op_lookup(f"fill-{name}"), op_write(sid, written, block, stable=0)], uid=uid, gid=uid)
                    if r.status != St.OK:
                        last = r
                        break
                    assert r[3].count > 0, "WRITE wrote nothing without an error"
                    written += r[3].count
            assert last is not None and last.status in (NFS4ERR_NOSPC, NFS4ERR_DQUOT), f"as {uid}: {written} bytes written, then {last!r}"
            half = (users + everyone) // 2
            if into_reserve:
                assert written > half, f"root wrote {written} bytes: it could not use the reserve ({users} free for users, {everyone} for root)"
            else:
                assert written < half, f"uid 1000 wrote {written} bytes into the blocks kept for root ({users} free for users, {everyone} for root)"
            assert_serves(srv)
        finally:
            srv.stop()
            disk.close()


# --- 6. READ and WRITE size limits -------------------------------------------


def test_max_read_and_max_write(serve):
    srv = serve(export='max_read = "64K"\nmax_write = "64K"\nsquash = "none"')
    content = os.urandom((1 << 20) + 4096)
    (srv.export / "big").write_bytes(content)
    with Conn(srv.port) as c:
        s = Session(c)
        root = s.root_fh()
        r = expect_ok(compound(s, [rc.op_putfh(root), rc.op_getattr([(1 << ATTR_MAXREAD) | (1 << ATTR_MAXWRITE)])]), "GETATTR maxread maxwrite")
        u = Unpacker(r[2].attrvals)
        maxread, maxwrite = u.u64(), u.u64()
        assert (maxread, maxwrite) == (65536, 65536), f"GETATTR maxread/maxwrite: expected 65536/65536, got {maxread}/{maxwrite}"

        r = expect_ok(compound(s, [rc.op_putfh(root), op_open(s.clientid, "big", SHARE_ACCESS_READ)]), "OPEN big")
        sid = r[2].stateid
        r = expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("big"), rc.op_read(0, 1 << 20, sid)]), "READ 1 MiB")
        data = r[3].data
        assert 0 < len(data) <= 65536, f"READ of 1 MiB with max_read 64K returned {len(data)} bytes"
        assert data == content[: len(data)] and not r[3].eof
        r = expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("big"), rc.op_read(100000, 1 << 20, sid), op_close(sid)]), "READ 1 MiB at 100000")
        assert 0 < len(r[3].data) <= 65536 and r[3].data == content[100000 : 100000 + len(r[3].data)]

        payload = os.urandom(100000)
        r = expect_ok(compound(s, [rc.op_putfh(root), op_open(s.clientid, "out", SHARE_ACCESS_BOTH, create=True)]), "OPEN(create) out")
        sid = r[2].stateid
        r = compound(s, [rc.op_putfh(root), rc.op_lookup("out"), op_write(sid, 0, payload)])
        expect_ok(r, "WRITE 100000 bytes")
        assert r[3].count == 65536, f"WRITE of 100000 bytes with max_write 64K: expected count 65536, got {r[3].count}"
        assert r[3].committed == FILE_SYNC4, r
        expect_ok(compound(s, [rc.op_putfh(root), rc.op_lookup("out"), op_close(sid)]), "CLOSE out")
    assert (srv.export / "out").read_bytes() == payload[:65536], "the host file does not hold exactly the 65536 bytes reported written"
    assert_serves(srv)


# --- 7. connection limit -----------------------------------------------------


def test_max_connections(serve):
    srv = serve(server="max_connections = 2")
    a = Conn(srv.port)
    b = Conn(srv.port)
    try:
        null_ok(a)
        null_ok(b)  # both are being served, so both hold a slot
        why = refusal(lambda: Conn(srv.port))
        assert why is None, f"third connection with max_connections = 2: expected it closed without a reply; {why}"
        assert "too many connections" in srv.log(), srv.log()
        null_ok(a)
        null_ok(b)
        b.close()

        # The server notices the close asynchronously; poll until a new
        # connection is served (each refused try holds no slot).
        def served():
            try:
                with Conn(srv.port) as c:
                    null_ok(c)
                    return True
            except (rc.ConnectionClosed, ConnectionResetError, BrokenPipeError):
                return False

        poll_until("a connection to be served after closing one of two", served)
        null_ok(a)
    finally:
        a.close()
        b.close()
    # Both closed: again the server notices asynchronously.
    poll_until("a connection to be served after closing both", served)
    assert_serves(srv)


# --- 8. graceful shutdown ----------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_signals_right_after_the_ready_line_are_handled(serve, sig):
    """A signal sent as soon as the server says it is listening is the
    server's to handle, not the default action's (which ends the process
    at once): SIGTERM and SIGINT shut it down cleanly, SIGUSR1 empties the
    read cache and it goes on serving. Ten starts each."""
    for _ in range(10):
        srv = serve()
        proc = srv.proc
        proc.send_signal(sig)
        if sig == signal.SIGUSR1:
            with Conn(srv.port) as c:
                assert Session(c).root_fh()
            assert proc.poll() is None, f"sluice ended ({proc.returncode}) after SIGUSR1; log:\n{srv.log()}"
            srv.stop()
            continue
        exits_cleanly(srv, sig, 10)


def exits_cleanly(srv, sig: signal.Signals, seconds: int):
    """`srv`, sent `sig`, ends within `seconds` with status 0 after
    logging its shutdown."""
    try:
        status = srv.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"sluice still running {seconds} s after {sig.name}; log:\n{srv.log()}")
    assert status == 0, f"exit status {status} after {sig.name}; log:\n{srv.log()}"
    assert "shutting down" in srv.log(), srv.log()


def test_sigterm_exits_cleanly(serve):
    srv = serve()
    with Conn(srv.port) as idle:
        s = Session(idle)  # an idle client with a session does not hold shutdown up
        assert s.root_fh()
        srv.proc.send_signal(signal.SIGTERM)
        exits_cleanly(srv, signal.SIGTERM, 5)
    assert "panicked" not in srv.log(), srv.log()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()


def test_request_threads_keep_a_callers_identity_for_that_caller_only(sluice_factory):
    """A thread that serves requests keeps its last caller's identity for
    that caller's next request: 40 FILE_SYNC WRITEs (storage work, done on
    request threads) of one caller one after another change credentials a
    few times in all, where each changed them four times (fsuid and fsgid
    there and back), and so do 40 LOOKUPs (on the connection's thread).
    Two callers taking turns on the same threads each
    get their own rights, over NFSv4.1 and NFSv3: a file only the first
    may write is refused to the second every time, and the files the
    second creates are its own."""
    import v3client as v
    from rpcclient import Client

    srv = sluice_factory("--grace-time", 0, metrics=True)
    (srv.export / "a").write_bytes(b"\0" * 8192)
    os.chown(srv.export / "a", 1000, 1000)
    os.chmod(srv.export / "a", 0o600)
    (srv.export / "d").mkdir()
    os.chmod(srv.export / "d", 0o777)
    first = Client(srv.port, uid=1000, gid=1000).establish()
    other = Client(srv.port, uid=2000, gid=2000).establish()
    a = expect_ok(first.compound([rc.op_putrootfh(), rc.op_lookup("a"), rc.op_getfh()]), "LOOKUP a")[3].fh
    d = expect_ok(first.compound([rc.op_putrootfh(), rc.op_lookup("d"), rc.op_getfh()]), "LOOKUP d")[3].fh

    def write(c, n):
        return c.compound([rc.op_putfh(a), rc.op_write(n * 8 % 8192, b"%08d" % n, 2)])

    expect_ok(write(first, 0), "WRITE as the owner")
    before = srv.counter("sluice_credential_changes")
    for n in range(40):
        expect_ok(write(first, n), "WRITE as the owner")
    changes = srv.counter("sluice_credential_changes") - before
    assert changes < 40, f"40 FILE_SYNC WRITEs of one caller made {changes} credential changes"
    # LOOKUP runs as the caller on the connection's thread, which keeps
    # the identity too.
    before = srv.counter("sluice_credential_changes")
    for n in range(40):
        expect_ok(first.compound([rc.op_putrootfh(), rc.op_lookup("a")]), "LOOKUP")
    changes = srv.counter("sluice_credential_changes") - before
    assert changes < 40, f"40 LOOKUPs of one caller made {changes} credential changes"

    target = v.sluice_target(srv)
    owner3, other3 = target.nfs(uid=1000, gid=1000), target.nfs(uid=2000, gid=2000)
    a3 = owner3.must(owner3.lookup(target.root_fh(), "a"), "LOOKUP").fh
    d3 = owner3.must(owner3.lookup(target.root_fh(), "d"), "LOOKUP").fh
    with owner3, other3:
        for n in range(12):
            expect_ok(write(first, n), "WRITE as the owner")
            r = write(other, n)
            assert r.status == NFS4ERR_ACCESS, f"round {n}: WRITE as 2000 of 1000's 0600 file: {r!r}"
            r = other.compound([rc.op_putfh(d), rc.op_open(other.owner + b"/%d" % n, f"v4-{n}", create=True)])
            expect_ok(r, f"round {n}: OPEN(create) as 2000")
            owner3.must(owner3.write(a3, 0, b"v3 owner"), "NFSv3 WRITE as the owner")
            r = other3.write(a3, 0, b"v3 other")
            assert r.status == v.E.ACCES, f"round {n}: NFSv3 WRITE as 2000 of 1000's 0600 file: {r!r}"
            other3.must(other3.create(d3, f"v3-{n}"), f"round {n}: NFSv3 CREATE as 2000")
    for p in (srv.export / "d").iterdir():
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (2000, 2000), f"{p.name} created by 2000 is owned by {st.st_uid}:{st.st_gid}"
    assert len(list((srv.export / "d").iterdir())) == 24
    assert (srv.export / "a").read_bytes()[:8] == b"v3 owner"
