"""The Linux kernel NFS client against sluice, in a QEMU guest.

For each guest kernel (Debian's 6.1 and 6.12) and NFS minor version (4.1,
4.2) this boots tests/vm/linux-client once and runs
tests/vm/guest/nfs-client-suite.sh in it against a real `sluice serve`. The
guest checks what it reads back; afterwards this side checks the export
directory on the host. A small TCP control server lets the guest ask for a
server restart (and for a file to be made behind its back) without sleeps.

One boot per kernel (RECLAIM_BOOTS) also crashes the server under a guest
that holds an fcntl lock and an open file, and checks state recovery (RFC
8881 section 8.4.2): the guest reclaims both, another client (the host,
over raw RPC) meanwhile gets NFS4ERR_GRACE and then NFS4ERR_DENIED; the
same after two restarts in a row; and a guest that comes back only after
the grace period has its reclaim refused (NFS4ERR_NO_GRACE) and loses its
lock. The host-side checks run inside the control requests, right after
the restart and before the guest is answered.

Two boots (V3_BOOTS: one per kernel) then run the suite again over NFSv3
(mounted with MOUNT on the NFS port, on the export's v3/ directory, which
mounts by its path), with its own files checked the same way on the host:
Linux 6.1 with nolock, Linux 6.12 with NLM locking (V3_LOCK_BOOTS: the
guest runs rpcbind and rpc.statd, the server its portmapper on port 111,
and the host checks that the guest's fcntl lock is on the server).

Each boot takes a few minutes under software emulation.
"""

import contextlib
import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import nlmclient
import rpcclient as rc
import v3client
from conftest import MetricsServer, port_111_held
from rpcclient import CLAIM_PREVIOUS, OPEN4_SHARE_ACCESS_BOTH, WRITE_LT, Client, St, expect

REPO = Path(__file__).resolve().parents[2]
VM = REPO / "tests" / "vm" / "linux-client"
GUEST_SUITE = REPO / "tests" / "vm" / "guest" / "nfs-client-suite.sh"
# A boot takes 4-7 minutes on 2 idle cores (TCG); leave room for a busy host.
BOOT_TIMEOUT = int(os.environ.get("SLUICE_VM_TIMEOUT", "1200"))
BIG_DIR_ENTRIES = 20000
FIXED_MTIME = 981173106  # 2001-02-03 04:05:06 UTC, set by `touch -d` in the guest
# The boots (kernel, NFS minor version) that also run the crash recovery
# steps: one per kernel, both minor versions covered.
# The --delegations of each boot (read, the default, unless named): one
# boot runs the whole suite with write delegations too.
DELEGATIONS = {("6.12", "4.2"): "all"}
RECLAIM_BOOTS = {("6.1", "4.1"), ("6.12", "4.2")}
# The boots that then run the suite over NFSv3 too (one per kernel, the
# two without the crash recovery steps), and the files that run writes
# (by kernel): 6.12 writes a 256 MiB file over NFSv3, 6.1 one of 64 MiB
# (writing random data in the guest is slow; SLUICE_VM_ALL_SIZES=1 makes
# both 256 MiB).
V3_BOOTS = {("6.1", "4.2"), ("6.12", "4.1")}
# The NFSv3 runs that mount with NLM locking (the others: nolock).
V3_LOCK_BOOTS = {("6.12", "4.1")}
V3_SIZES = {"6.12": "tiny:1 page:4095 mib:1048583 m256:268435456",
            "6.1": "tiny:1 page:4095 mib:1048583 m64:67108864"}


def v3_sizes(kernel: str) -> str:
    if os.environ.get("SLUICE_VM_ALL_SIZES") == "1":
        return V3_SIZES["6.12"]
    return V3_SIZES[kernel]
# Control requests of the crash recovery steps, in the order the guest sends them.
RECLAIM_REQUESTS = ["reclaim-restart", "reclaimed-denied", "restart-twice", "denied", "restart-past-grace", "refused-free"]
# How long the host waits for the server to leave grace (the guest has
# already recovered by then, or the grace time is a few seconds).
GRACE_WAIT = 90
# The failed ops are logged at debug level by this target (one line "op
# failed op=N status=S" each): how the host sees the NO_GRACE the guest got.
FAILED_OP_LOG = "sluice::server::compound=debug"
# An OPEN or LOCK answered NFS4ERR_NO_GRACE in that log, with the op and
# status as numbers or (quoted) names.
NO_GRACE_LOGGED = re.compile(r'op failed op="?(?:12|18|LOCK|OPEN)"? status="?(?:10033|NFS4ERR_NO_GRACE)\b')
ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(
        platform.system() != "Linux" or platform.machine() != "x86_64",
        reason="the VM harness boots x86_64 Debian kernels",
    ),
]


class GuestServer(MetricsServer):
    """The test's sluice: metrics on a free port, restarts with extra
    options, and a log to search; with `nsm` (a GuestNsm), the options
    that let a guest lock over NFSv3, kept as `.nsm` for boot_guest."""

    def __init__(self, binary, export, state, extra_args=(), nsm=None):
        super().__init__(binary, export, state, [*extra_args, *(nsm.server_args() if nsm else [])])
        self.nsm = nsm

    def restart_with(self, *args):
        """SIGKILL, then start once with `args` added (later starts go
        without them)."""
        base = list(self.extra_args)
        self.extra_args = base + [str(a) for a in args]
        try:
            self.restart()
        finally:
            self.extra_args = base

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        """The server log from byte `offset` on, without colour codes."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return ANSI.sub("", f.read().decode(errors="replace"))


def open_path(c: Client, path: str):
    """OPEN (read and write, no create) of PATH under the root by host
    client `c`: (open stateid, filehandle). Retried while the server
    answers NFS4ERR_DELAY (it is recalling the guest's delegation), as a
    client does, for up to a minute."""
    *dirs, name = path.split("/")
    deadline = time.monotonic() + 60
    while True:
        r = c.compound([rc.op_putrootfh(), *[rc.op_lookup(d) for d in dirs],
                        rc.op_open(c.owner + b"/open", name, access=OPEN4_SHARE_ACCESS_BOTH), rc.op_getfh()])
        if r.status != St.DELAY or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # poll interval of the retry loop
    expect(r, St.OK, f"host client's OPEN of {path}")
    return r[2 + len(dirs)].stateid, r[3 + len(dirs)].fh


def host_lock(c: Client, fh: bytes, open_stateid: bytes, start: int, length: int):
    """A write LOCK by the host client on the second half of the guest's
    range [start, start+length) and as far again past it."""
    return c.lock(fh, open_stateid, owner=c.owner + b"/lock", offset=start + length // 2, length=length, locktype=WRITE_LT)


def expect_denied_by_guest(r, start: int, length: int, what: str):
    """LOCK was NFS4ERR_DENIED by a write lock on exactly the guest's range."""
    expect(r, St.DENIED, what)
    d = r.last()
    got = (d.denied_offset, d.denied_length, d.denied_type)
    assert got == (start, length, WRITE_LT), f"{what}: the conflicting lock is (offset, length, type) {got}, expected the guest's {(start, length, WRITE_LT)}"


def retire(c: Client, fh: bytes, open_stateid: bytes):
    """CLOSE, DESTROY_SESSION, DESTROY_CLIENTID: the host client leaves no
    record behind to hold up the next grace period."""
    expect(c.compound([rc.op_putfh(fh), rc.op_close(open_stateid)]), St.OK, "host client's CLOSE")
    expect(c.call([rc.op_destroy_session(c.sessionid)]), St.OK, "host client's DESTROY_SESSION")
    expect(c.call([rc.op_destroy_clientid(c.clientid)]), St.OK, "host client's DESTROY_CLIENTID")
    c.close()


def free_port(kind=socket.SOCK_STREAM) -> int:
    """A port nothing on 127.0.0.1 uses now (of `kind`)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GuestNsm:
    """What NFSv3 locking in a guest needs from this side: the server's
    portmapper on 127.0.0.1:111 (the guest's lock manager asks 10.0.2.2:111,
    which QEMU maps to it; there is no mount option for another port), and
    ports forwarded to the guest's rpcbind, rpc.statd and lock manager, so
    that the server's NLM4_GRANTED and SM_NOTIFY calls reach them
    (--nsm-portmap names the forwarded portmapper). The guest's statd and
    lock manager listen on the same port numbers as their forwards, since
    the server calls the port the guest's rpcbind gives it."""

    def __init__(self):
        for proto in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, proto) as s:
                try:
                    s.bind(("127.0.0.1", 111))
                except OSError as e:
                    raise AssertionError(
                        f"port 111 on 127.0.0.1 is taken ({e}): the guest's lock manager finds NLM there; "
                        "stop the rpcbind or portmapper that holds it") from e
        self.portmap = free_port()
        self.statd = free_port(socket.SOCK_DGRAM)
        self.lockd = free_port()

    def server_args(self) -> list[str]:
        return ["--portmap", "--portmap-listen", "127.0.0.1:111", "--nsm-portmap", f"127.0.0.1:{self.portmap}"]

    def env(self) -> dict[str, str]:
        return {"STATD_PORT": str(self.statd), "LOCKD_PORT": str(self.lockd)}

    def forwards(self) -> list[str]:
        return [f"tcp:{self.portmap}:111", f"udp:{self.portmap}:111",
                f"udp:{self.statd}:{self.statd}", f"tcp:{self.lockd}:{self.lockd}"]


def v3_handle(port: int, path: str) -> bytes:
    """The NFSv3 handle of `path` (under the export root) on the server at
    `port`, through MOUNT and LOOKUP."""
    t = v3client.Target("127.0.0.1", port, port, "/", port)
    fh = t.root_fh()
    with t.nfs() as n:
        for name in path.split("/"):
            fh = n.must(n.lookup(fh, name), f"LOOKUP {name} of {path}").fh
    return fh


def nlm_test(port: int, path: str, start: int, length: int) -> nlmclient.NlmRes:
    """Another host's ("host-ctl") NLM TEST of a write lock on bytes
    [start, start+length) of `path`."""
    fh = v3_handle(port, path)
    with nlmclient.NlmClient(port, machine="host-ctl") as c:
        return c.test(nlmclient.Lock("host-ctl", fh, b"host-ctl/1", 1, start, length))


def expect_nlm_held(port: int, path: str, start: int, length: int, what: str):
    """Another host's NLM TEST and an NFSv4 client's LOCKT on `path` are
    both denied by one write lock on exactly [start, start+length): the
    guest's, held on the server, where NFSv3 and NFSv4 clients meet."""
    r = nlm_test(port, path, start, length)
    assert r.stat == nlmclient.S.DENIED, f"{what}: NLM TEST from another host: {r!r}, expected DENIED"
    h = r.holder
    assert (h.exclusive, h.offset, h.length) == (True, start, length), (
        f"{what}: NLM TEST names the holder {h!r}, expected a write lock on ({start}, {length})")
    c = Client(port, machine="host-ctl").establish()
    try:
        *dirs, name = path.split("/")
        r = c.compound([rc.op_putrootfh(), *[rc.op_lookup(d) for d in [*dirs, name]],
                        rc.op_lockt(c.owner + b"/lockt", start, length, WRITE_LT)])
        expect(r, St.DENIED, f"{what}: NFSv4 LOCKT")
        d = r.last()
        got = (d.denied_offset, d.denied_length, d.denied_type)
        assert got == (start, length, WRITE_LT), f"{what}: NFSv4 LOCKT denied by {got}"
        expect(c.call([rc.op_destroy_session(c.sessionid)]), St.OK, "DESTROY_SESSION")
        expect(c.call([rc.op_destroy_clientid(c.clientid)]), St.OK, "DESTROY_CLIENTID")
    finally:
        c.close()


# The period of the guest's test data (RB_LEN in tests/vm/guest/lib/common.sh).
RB_LEN = 1048589


def pattern_md5(period: bytes, count: int, offset: int) -> str:
    """The md5 of `count` bytes of `period` repeated, from `offset` on."""
    if not 0 <= offset < len(period) or count < 0:
        raise ValueError(f"offset {offset} or count {count} out of range")
    h = hashlib.md5()
    while count > 0:
        piece = period[offset:offset + count]
        h.update(piece)
        count -= len(piece)
        offset = 0
    return h.hexdigest()


class ControlServer:
    """Line-based requests from the guest, one per connection.

    "restart"     -> server.restart(); reply "ok" once it listens again
    "mkfile PATH" -> create PATH in the export with content "host\\n"; "ok"
    "change PATH" -> PATH in the export gets mode 0600 and content "12345"
                     (size 5); "ok"
    "nlm-held PATH START LEN" -> another host's NLM TEST and an NFSv4
                     LOCKT of that range are denied by a write lock on
                     exactly it (the guest's NLM lock); "ok"
    "period"      -> the guest's test data: RB_LEN random bytes (and no
                     newline), drawn once per boot
    "md5 COUNT OFFSET" -> the md5 (hex) of COUNT bytes of the period
                     repeated, starting at OFFSET: what the guest's
                     random_bytes writes (tests/vm/guest/lib/common.sh)

    Crash recovery, while the guest holds PATH open and a write lock on
    bytes [START, START+LEN) of it. Each request checks the server from
    the host (over raw RPC, as "another client", and in its metrics and
    log) before the guest gets its reply, so nothing races with the
    guest's own recovery; the reply is "ok" when every check passed.

    "reclaim-restart PATH START LEN"
        A host client opens PATH (and so is recorded), the server is
        killed and started, and is in grace waiting for two clients. The
        host client reclaims its open (CLAIM_PREVIOUS) and sends
        RECLAIM_COMPLETE; its LOCK and LOCKT on the guest's range then get
        NFS4ERR_GRACE, as the guest, known from before, has not reclaimed.
    "reclaimed-denied PATH START LEN"
        After the guest used its file again: grace ended because every
        known client reclaimed, with two reclaims or more besides the
        host's (the guest's open and lock); the host client's LOCK gets
        NFS4ERR_DENIED by a write lock on exactly the guest's range. The
        host client then goes (DESTROY_CLIENTID).
    "restart-twice"
        Two restarts back to back; after each the server is in grace,
        waiting for one client (the guest, which has not been answered).
    "denied PATH START LEN"
        After the guest used its file again: grace ended because it
        reclaimed (two reclaims or more), and a new host client's LOCK is
        DENIED as above.
    "restart-past-grace SECS"
        A restart with --grace-time SECS, then a wait until grace has
        ended by running out with one client (the guest) not reclaimed.
    "refused-free PATH START LEN"
        After the guest used its file again: since that restart the
        server answered an OPEN or LOCK with NFS4ERR_NO_GRACE (in its log
        of failed ops) and reclaimed nothing, and a new host client's LOCK
        on the guest's range is granted: the guest's lock is gone.

    Anything that goes wrong is replied as "error ..." and kept in .errors.
    """

    def __init__(self, server, write_delegations: bool = False):
        self.server = server
        # The server grants write delegations: a lock the guest takes
        # while it holds one stays in the guest (the Linux client sends
        # LOCK only when the delegation goes back), and is reclaimed with
        # the delegation rather than by a LOCK of its own.
        self.write_delegations = write_delegations
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.requests = []
        # The server's metrics just before each plain "restart".
        self.before_restart = []
        self.errors = []
        self.boot_log = 0  # where the server log of the latest start begins
        self.holder = None  # the host client of reclaim-restart and its open
        self.inline_mark = (0.0, 0.0, 0.0)  # _inline_counts() at "inline-mark"
        self.period = os.urandom(RB_LEN)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(60)
                try:
                    line = conn.makefile("rb").readline().decode().strip()
                    self.requests.append(line)
                    reply = self._handle(line)
                except Exception as e:  # noqa: BLE001 - reported to the guest and the test
                    reply = f"error {type(e).__name__}: {e}"
                # Data (bytes) is sent as it is; anything but "ok" is an error.
                if isinstance(reply, str) and reply != "ok":
                    self.errors.append(f"{line!r}: {reply}")
                try:
                    conn.sendall(reply if isinstance(reply, bytes) else reply.encode() + b"\n")
                except OSError:
                    pass

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        if cmd == "restart":
            self.before_restart.append(self.server.metrics())
            self._restart()
            return "ok"
        if cmd == "period":
            return self.period
        if cmd == "inline-mark":
            self.inline_mark = self._inline_counts()
            return "ok"
        if cmd == "inline-since-mark":
            done, slow, _ = (now - then for now, then in zip(self._inline_counts(), self.inline_mark))
            if done < int(arg) and slow == 0:
                return f"error: {done:.0f} requests answered on the connection's thread, fewer than {arg}"
            return "ok"
        if cmd == "flush-descriptors-since-mark":
            if "sluice_flush_witnesses_opened_total" not in self.server.metrics():
                return "error: the server does not count the descriptors stable WRITEs flush through"
            opened = self._inline_counts()[2] - self.inline_mark[2]
            if opened > int(arg):
                return f"error: {opened:.0f} descriptors opened for stable WRITEs to flush through, more than {arg}"
            return "ok"
        if cmd == "md5":
            count, offset = (int(x) for x in arg.split())
            return pattern_md5(self.period, count, offset).encode() + b"\n"
        if cmd == "mkfile":
            export = self.server.export.resolve()
            target = (export / arg).resolve()
            if export not in target.parents:
                return f"error: {arg!r} is outside the export"
            target.write_text("host\n")
            return "ok"
        if cmd == "change":
            export = self.server.export.resolve()
            target = (export / arg).resolve()
            if export not in target.parents:
                return f"error: {arg!r} is outside the export"
            os.chmod(target, 0o600)
            target.write_bytes(b"12345")
            return "ok"
        if cmd == "nlm-held":
            path, start, length = arg.split()
            expect_nlm_held(self.server.port, path, int(start), int(length), line)
            return "ok"
        if cmd == "xattr":
            path, name, value = arg.split()
            target = self.server.export / path
            got = os.getxattr(target, f"user.{name}")
            assert got == value.encode(), f"{path}: user.{name} on the server is {got!r}, not {value!r}"
            os.setxattr(target, "user.host", b"from the host")
            return "ok"
        if cmd == "no-xattr":
            path, name = arg.split()
            names = os.listxattr(self.server.export / path)
            assert f"user.{name}" not in names, f"{path} on the server still has user.{name}: {names}"
            return "ok"
        if cmd == "restart-twice":
            self._expect_out_of_grace("before the restarts")
            self._restart()
            self._expect_grace(1, "after the first restart")
            self._restart()
            self._expect_grace(1, "after the second restart")
            return "ok"
        if cmd == "restart-past-grace":
            self._expect_out_of_grace("before the restart")
            self._restart("--grace-time", int(arg))
            self._expect_grace(1, "after the restart")
            ended = self._wait_grace_over("grace time ran out")
            assert "not_reclaimed=1" in ended, f"grace should have ended with the guest not reclaimed: {ended}"
            return "ok"
        if cmd in ("reclaim-restart", "reclaimed-denied", "denied", "refused-free"):
            path, start, length = arg.split()
            getattr(self, "_" + cmd.replace("-", "_"))(path, int(start), int(length))
            return "ok"
        return f"error: unknown request {line!r}"

    def _inline_counts(self):
        """Requests answered on the connection's thread, slow turns there
        (each of which sends quick work to request threads for 200 ms),
        and descriptors opened for stable WRITEs to flush through (the
        others are handed on from one WRITE of a file to the next), so
        far."""
        m = self.server.metrics()
        return (m.get("sluice_inline_requests_total", 0), m.get("sluice_inline_slow_total", 0),
                m.get("sluice_flush_witnesses_opened_total", 0))

    # -- the server's grace period, from its metrics and log --

    def _restart(self, *args):
        at = self.server.log_size()
        self.server.restart_with(*args)
        self.boot_log = at

    def _grace(self):
        m = self.server.metrics()
        return m["sluice_in_grace"], m["sluice_grace_waiting_clients"], m["sluice_reclaims_total"]

    def _expect_grace(self, waiting: int, what: str):
        in_grace, waiting_now, _ = self._grace()
        assert (in_grace, waiting_now) == (1, waiting), (
            f"{what}: sluice_in_grace {in_grace:g}, sluice_grace_waiting_clients {waiting_now:g}; "
            f"expected in grace waiting for {waiting} client(s)")

    def _expect_out_of_grace(self, what: str):
        in_grace, _, _ = self._grace()
        assert in_grace == 0, f"{what}: the server is still in grace"

    def _wait_grace_over(self, reason: str) -> str:
        """Polls the metrics until the server leaves grace (the behaviour
        under test, with a deadline); returns the log line that says why,
        which must give `reason`."""
        deadline = time.monotonic() + GRACE_WAIT
        while self._grace()[0] != 0:
            assert time.monotonic() < deadline, (
                f"still in grace {GRACE_WAIT} s after the restart (waiting for "
                f"{self._grace()[1]:g} client(s))")
            time.sleep(0.1)
        ended = re.findall(r"grace period ended .*", self.server.log_since(self.boot_log))
        assert len(ended) == 1, f"expected one 'grace period ended' line since the restart, got {ended}"
        assert f'reason="{reason}"' in ended[0], f"grace should have ended with reason {reason!r}: {ended[0]}"
        return ended[0]

    # -- crash recovery requests --

    def _reclaim_restart(self, path, start, length):
        self._expect_out_of_grace("before the restart")
        h = Client(self.server.port, machine="host-ctl").establish()
        _, fh = open_path(h, path)
        self._restart()
        self._expect_grace(2, "after the restart (the guest and the host client are known)")
        h.reconnect()
        expect(h.exchange_id(), St.OK, "host client's EXCHANGE_ID after the restart")
        expect(h.create_session(), St.OK, "host client's CREATE_SESSION after the restart")
        r = h.compound([rc.op_putfh(fh), rc.op_open(h.owner + b"/open", claim=CLAIM_PREVIOUS, access=OPEN4_SHARE_ACCESS_BOTH)])
        expect(r, St.OK, "host client's OPEN CLAIM_PREVIOUS in grace")
        self.holder = (h, r[2].stateid, fh)
        expect(h.compound([rc.op_reclaim_complete()]), St.OK, "host client's RECLAIM_COMPLETE")
        self._expect_grace(1, "after the host client's RECLAIM_COMPLETE (the guest has not reclaimed)")
        r = host_lock(h, fh, r[2].stateid, start, length)
        expect(r, St.GRACE, "host client's LOCK on the guest's range while the guest has not reclaimed")
        r = h.compound([rc.op_putfh(fh), rc.op_lockt(h.owner + b"/lock", start, length, WRITE_LT)])
        expect(r, St.GRACE, "host client's LOCKT on the guest's range while the guest has not reclaimed")
        in_grace, waiting, reclaims = self._grace()
        assert (in_grace, waiting, reclaims) == (1, 1, 1), (
            f"after the host client's reclaim: in grace {in_grace:g}, waiting {waiting:g}, "
            f"reclaims {reclaims:g}; expected 1, 1 (the guest), 1 (the host client's open)")

    def _reclaimed_denied(self, path, start, length):
        assert self.holder, "reclaim-restart did not run"
        h, open_stateid, fh = self.holder
        self.holder = None
        self._wait_grace_over("every client known from before has reclaimed")
        reclaims = self._grace()[2]
        want = 2 if self.write_delegations else 3
        assert reclaims >= want, (
            f"{reclaims:g} reclaims since the restart; expected the host's open and the guest's open"
            + (" (and its lock, unless under a write delegation)" if self.write_delegations else " and lock"))
        expect_denied_by_guest(host_lock(h, fh, open_stateid, start, length), start, length,
                               "host client's LOCK after the guest reclaimed")
        retire(h, fh, open_stateid)

    def _denied(self, path, start, length):
        self._wait_grace_over("every client known from before has reclaimed")
        reclaims = self._grace()[2]
        want = 1 if self.write_delegations else 2
        assert reclaims >= want, (
            f"{reclaims:g} reclaims since the restart; expected the guest's open"
            + (" (and its lock, unless under a write delegation)" if self.write_delegations else " and lock"))
        c = Client(self.server.port, machine="host-ctl").establish()
        open_stateid, fh = open_path(c, path)
        expect_denied_by_guest(host_lock(c, fh, open_stateid, start, length), start, length,
                               "a new host client's LOCK after the guest reclaimed")
        retire(c, fh, open_stateid)

    def _refused_free(self, path, start, length):
        log = self.server.log_since(self.boot_log)
        refused = re.findall(NO_GRACE_LOGGED, log)
        assert refused, "no OPEN or LOCK was answered NFS4ERR_NO_GRACE since the restart (server log of failed ops)"
        reclaims = self._grace()[2]
        assert reclaims == 0, f"{reclaims:g} reclaims succeeded after grace had ended"
        c = Client(self.server.port, machine="host-ctl").establish()
        open_stateid, fh = open_path(c, path)
        r = expect(host_lock(c, fh, open_stateid, start, length), St.OK,
                   "a new host client's LOCK on the range of the guest's lost lock")
        r = c.compound([rc.op_putfh(fh), rc.op_locku(r.stateid, start + length // 2, length)])
        expect(r, St.OK, "host client's LOCKU")
        retire(c, fh, open_stateid)

    def close(self):
        self.sock.close()


def guest_tool(name):
    """A host binary the guest suite needs (busybox lacks flock; perl gives
    fcntl locks and O_EXCL opens without a stat first; setfattr and
    getfattr extended attributes)."""
    path = shutil.which(name)
    assert path, f"{name} is not installed on the host (util-linux / perl-base / attr; scripts/setup installs them)"
    return path


def tail(text, lines):
    return "\n".join(text.splitlines()[-lines:])


def md5_of(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


ALL_SIZES = "tiny:1 page:4095 mib:1048583 m64:67108864 m256:268435456"


def guest_sizes(kernel: str, vers: str) -> str:
    """An emulated guest writes over NFS at about 6 MB/s, so the 256 MiB
    file is written by one boot per kernel (6.1 with 4.1, 6.12 with 4.2)
    and the other two boots stop at 64 MiB. SLUICE_VM_ALL_SIZES=1 writes
    it on all."""
    if os.environ.get("SLUICE_VM_ALL_SIZES") == "1" or (kernel, vers) in {("6.1", "4.1"), ("6.12", "4.2")}:
        return ALL_SIZES
    return ALL_SIZES.replace(" m256:268435456", "")


# What the VM harness's exit statuses mean.
GUEST_EXIT = {124: "timed out", 125: "harness failure", 126: "guest died (panic?)"}


def boot_guest(kernel: str, server, ctl, script: Path, console_path: Path, bins=(), env=None,
               nsm: GuestNsm | None = None) -> int:
    """Boots a guest with Linux `kernel` that runs `script` against
    `server`, its control requests going to `ctl`; the guest tools `bins`
    are copied in and `env` set; with `nsm`, rpcbind and rpc.statd too,
    and their ports forwarded. The console goes to `console_path`.
    Returns the harness's exit status (0: the script passed)."""
    cmd = [str(VM), "--kernel", kernel, "--port", str(server.port), "--ctl-port", str(ctl.port), "--mem", "1024"]
    for b in bins:
        cmd += ["--bin", guest_tool(b)]
    env = dict(env or {})
    if nsm:
        cmd.append("--nsm")
        for f in nsm.forwards():
            cmd += ["--forward", f]
        env.update(nsm.env())
    for k, v in env.items():
        cmd += ["--env", f"{k}={v}"]
    cmd += ["--timeout", str(BOOT_TIMEOUT), str(script)]
    with open(console_path, "w") as console:
        proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=BOOT_TIMEOUT + 120)
    return proc.returncode


def failure_context(out: str, console_path: Path, server, lines: int) -> str:
    """The ends of the guest console and the server log, for a failure."""
    log = server.log_path
    server_log = log.read_text(errors="replace") if log.exists() else "(no server log)"
    return (
        f"\n--- guest console (last {lines} lines; full: {console_path}) ---\n"
        f"{tail(out, lines)}\n"
        f"--- server log (last 60 lines; full: {log}) ---\n{tail(server_log, 60)}"
    )


@pytest.fixture
def sluice_server(sluice_binary, tmp_path, monkeypatch, request):
    """This module's own sluice_server (instead of conftest's): a
    GuestServer on fresh export and state directories (root not squashed),
    logging failed ops, checked alive and stopped at the end; with the
    delegations of the boot (DELEGATIONS)."""
    monkeypatch.setenv("RUST_LOG", f"{os.environ.get('RUST_LOG', 'info')},{FAILED_OP_LOG}")
    params = request.node.callspec.params
    boot = (params["kernel"], params["vers"])
    # Listed attributes are kept for an hour: every step's listings then
    # rely on the server hearing of each change, not on the time running
    # out.
    args = ["--delegations", DELEGATIONS.get(boot, "read"), "--listing-cache-ms", "3600000"]
    yield from serve_for_guest(sluice_binary, tmp_path, args, nsm=boot in V3_LOCK_BOOTS)


def serve_for_guest(binary, tmp_path: Path, args, nsm=False):
    """For a fixture: a started GuestServer with `args` on fresh export and
    state directories under `tmp_path`; checked alive and stopped once the
    test is done. With `nsm`, what NFSv3 locking in the guest needs too
    (GuestNsm), port 111 held for the whole test (port_111_held)."""
    export = tmp_path / "export"
    state = tmp_path / "state"
    export.mkdir()
    state.mkdir()
    with port_111_held() if nsm else contextlib.nullcontext():
        server = GuestServer(binary, export, state, args, GuestNsm() if nsm else None)
        server.start()
        yield server
        assert server.alive(), f"sluice died during the test; log:\n{server.log_path.read_text(errors='replace')}"
        server.stop()


@pytest.mark.parametrize("vers", ["4.1", "4.2"], ids=lambda v: f"nfs{v}")
@pytest.mark.parametrize("kernel", ["6.1", "6.12"], ids=lambda k: f"linux{k}")
def test_linux_client(sluice_server, tmp_path, kernel, vers):
    reclaim = (kernel, vers) in RECLAIM_BOOTS
    v3 = (kernel, vers) in V3_BOOTS
    export = sluice_server.export
    for root in [export, *([export / "v3"] if v3 else [])]:
        big = root / "big"
        big.mkdir(parents=True)
        for i in range(BIG_DIR_ENTRIES):
            name = f"f{i:05d}"
            (big / name).write_text(name + "\n")

    ctl = ControlServer(sluice_server, DELEGATIONS.get((kernel, vers)) == "all")
    console_path = tmp_path / "guest-console.log"
    v3_lock = (kernel, vers) in V3_LOCK_BOOTS
    try:
        returncode = boot_guest(
            kernel, sluice_server, ctl, GUEST_SUITE, console_path,
            bins=("flock", "perl", "setfattr", "getfattr"),
            env={"VERS": vers, "SIZES": guest_sizes(kernel, vers), "RECLAIM": int(reclaim),
                 "THEN_V3": int(v3), "V3_SIZES": v3_sizes(kernel), "V3_LOCK": int(v3_lock)},
            nsm=sluice_server.nsm,
        )
    finally:
        ctl.close()
    out = console_path.read_text(errors="replace")
    print(out)  # shown by pytest when the test fails

    def context():
        return failure_context(out, console_path, sluice_server, 120)

    failed_step = re.findall(r"^FAIL in step .*$", out, re.M)
    assert returncode == 0, (
        f"guest suite failed: exit {returncode} "
        f"{GUEST_EXIT.get(returncode, '')}\n"
        + "\n".join(failed_step or ["(no failing step reported)"])
        + context()
    )
    assert f"ALL STEPS PASSED (NFS {vers}," in out, "guest exited 0 without finishing" + context()
    if v3:
        assert "ALL STEPS PASSED (NFS 3," in out, "the NFSv3 run did not finish" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    assert ctl.requests.count("restart") == (2 if v3 else 1), ctl.requests
    held = [r for r in ctl.requests if r.startswith("nlm-held ")]
    assert held == (["nlm-held v3/locks/g 0 100"] if v3_lock else []), f"NLM checks: {ctl.requests}"
    sent = [r.partition(" ")[0] for r in ctl.requests if r.partition(" ")[0] in RECLAIM_REQUESTS]
    assert sent == (RECLAIM_REQUESTS if reclaim else []), f"crash recovery requests: {ctl.requests}"

    # The guest's back channel (on its own connection, bound by
    # CREATE_SESSION) answered the server's CB_NULL probes since the last
    # start, and no callback failed. (After an NFSv3 run, whose restart
    # ended the NFSv4 run's counts, up to that restart.)
    m = ctl.before_restart[-1] if v3 else sluice_server.metrics()
    answered, failed = m.get("sluice_callbacks_total", 0), m.get("sluice_callback_failures_total", 0)
    assert answered >= 1 and failed == 0, (
        f"back channel: {answered:g} callbacks answered, {failed:g} failed" + context())
    if DELEGATIONS.get((kernel, vers)) == "all":
        # Counted since the last restart of the crash recovery steps.
        granted = m.get("sluice_write_delegations_granted_total", 0)
        print(f"write delegations granted since the last start: {granted:g}, "
              f"recalled {m.get('sluice_delegations_recalled_total', 0):g}, "
              f"revoked {m.get('sluice_delegations_revoked_total', 0):g}")
        assert granted >= 1, "the boot with --delegations all got no write delegation" + context()

    # --- what the guest wrote, as seen on the host ---
    manifest = re.findall(r"^MANIFEST (\S+) ([0-9a-f]{32}) (\d+)$", out, re.M)
    v4_files = [m for m in manifest if not m[0].startswith("v3/")]
    check_tree(export, v4_files, guest_sizes(kernel, vers), reclaim)
    if v3:
        v3_files = [(m[0][3:], m[1], m[2]) for m in manifest if m[0].startswith("v3/")]
        check_tree(export / "v3", v3_files, v3_sizes(kernel), False)


def check_tree(export: Path, manifest, sizes_spec: str, reclaim: bool):
    """Checks what one run of the guest suite left in `export` (the export,
    or its v3/): the files of its manifest and what each step made."""
    big = export / "big"
    names = {m[0] for m in manifest}
    m256 = ["data/m256"] if "m256" in sizes_spec else []
    m64 = ["data/m64"] if "m64" in sizes_spec else []
    for expected in ["data/tiny", "data/page", "data/mib", *m64, *m256,
                     "app/log", "trunc/f", "rs/before", "rs/after", "rs/open-across",
                     *(["recl/f"] if reclaim else [])]:
        assert expected in names, f"{expected} missing from the guest manifest"
    for rel, md5, size in manifest:
        p = export / rel
        assert p.is_file(), f"{rel} written by the guest is not in the export"
        assert p.stat().st_size == int(size), f"size of {rel} on the host"
        assert md5_of(p) == md5, f"content of {rel} on the host differs from the guest's"
    sizes = {"tiny": 1, "page": 4095, "mib": 1048576 + 7,
             "m64": 64 << 20, "m256": 256 << 20}
    if not m256:
        del sizes["m256"]
    if not m64:
        del sizes["m64"]
    for name, size in sizes.items():
        assert (export / "data" / name).stat().st_size == size

    sparse = export / "trunc" / "sparse"
    assert sparse.stat().st_size == 4096 * 1000 + 5000
    with open(sparse, "rb") as f:
        assert f.read(4096 * 1000) == bytes(4096 * 1000)
    assert (export / "trunc" / "f0").stat().st_size == 0

    leaf = export / "deep" / "/".join(f"d{i:02d}" for i in range(1, 31)) / "leaf"
    assert leaf.read_text() == "bottom\n"

    ren = export / "ren"
    assert sorted(os.listdir(ren / "a")) == []
    assert sorted(os.listdir(ren / "b")) == ["file1-moved", "sub-moved", "victim"]
    assert (ren / "b" / "file1-moved").read_text() == "one\n"
    assert (ren / "b" / "sub-moved" / "inner").read_text() == "two\n"
    assert (ren / "b" / "victim").read_text() == "replacement\n"

    links = export / "links"
    orig, hard = os.stat(links / "orig"), os.stat(links / "hard")
    assert orig.st_nlink == 2 and hard.st_nlink == 2
    assert (orig.st_ino, orig.st_dev) == (hard.st_ino, hard.st_dev)
    assert (links / "orig").read_text() == "content\nmore\n"
    assert os.readlink(links / "sym") == "orig"
    assert os.readlink(links / "dangling") == "../data/does-not-exist"

    f = os.stat(export / "attrs" / "f")
    assert (f.st_mode & 0o7777, f.st_uid, f.st_gid) == (0o640, 1234, 5678)
    assert int(f.st_mtime) == FIXED_MTIME
    d = os.stat(export / "attrs" / "d")
    assert (d.st_mode & 0o7777, d.st_uid, d.st_gid) == (0o751, 4321, 8765)

    assert not (export / "rmtree").exists()
    assert os.listdir(export / "silly") == []
    assert (export / "excl" / "hostmade").read_text() == "host\n"
    assert (export / "excl" / "noclobber").read_text() == "first\n"
    new = os.stat(export / "excl" / "new")
    assert (new.st_size, new.st_mode & 0o7777) == (0, 0o644)
    assert (export / "rs" / "open-across").read_text() == "before\nafter\n"
    assert (export / "rs" / "fresh").read_text() == "fresh\n"
    assert len(os.listdir(big)) == BIG_DIR_ENTRIES


def test_pattern_md5_is_the_md5_of_the_guests_random_bytes(tmp_path):
    """What the host answers to "md5 COUNT OFFSET" is the md5 of what the
    guest's random_bytes writes for them (run here by the host's sh and
    perl), across the period's end too, and RB_LEN is the guest's."""
    common = REPO / "tests" / "vm" / "guest" / "lib" / "common.sh"
    m = re.search(r"^RB_LEN=(\d+)$", common.read_text(), re.M)
    assert m and int(m.group(1)) == RB_LEN, "RB_LEN differs from the guest's"
    period = os.urandom(RB_LEN)
    period_path = tmp_path / "period"
    period_path.write_bytes(period)
    for count, offset in [(0, 0), (1, RB_LEN - 1), (4096, 12345), (3 * RB_LEN + 5, RB_LEN - 7)]:
        out = subprocess.run(
            ["sh", "-c", '. "$1"; RB_PERIOD="$2"; random_bytes "$3" "$4"', "sh",
             str(common), str(period_path), str(count), str(offset)],
            capture_output=True, check=True, timeout=60).stdout
        assert len(out) == count
        assert pattern_md5(period, count, offset) == hashlib.md5(out).hexdigest(), (count, offset)
