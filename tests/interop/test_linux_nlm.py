"""NFSv3 locking (NLM and NSM) with the Linux kernel client, in a QEMU guest.

One boot per kernel (6.1, 6.12) runs tests/vm/guest/nlm.sh: the guest runs
rpcbind and rpc.statd (Debian's, see tests/vm/guest/lib/nsm.sh), mounts
NFSv3 without nolock, and takes fcntl locks that its kernel sends to
sluice over NLM. The host checks each step on the server, over raw RPC as
another NFSv3 host (NLM TEST) and as an NFSv4 client (LOCK, LOCKT), and in
the metrics:

- a guest's lock is on the server: another host's TEST and an NFSv4
  LOCKT are denied by exactly it;
- an NFSv4 client's lock makes the guest's F_SETLKW wait on the server
  (NLM4_BLOCKED); when the NFSv4 client unlocks, the server calls the
  guest's lock manager back (NLM4_GRANTED) and the guest's process gets
  the lock at once (the Linux client would only ask again after 30 s);
- the server is killed (SIGKILL) under a guest that holds a lock and an
  open file, and started again: another host is refused in the grace
  period (NLM4_DENIED_GRACE_PERIOD), the server tells the guest's
  rpc.statd that it restarted (SM_NOTIFY), the guest's lock manager
  reclaims the lock, and after grace the lock is the guest's again while
  its writes through the open file go on, byte-exact.

The server's portmapper runs on 127.0.0.1:111 (the guest's lock manager
asks there; no mount option names another port), so the boots run one
after the other. Each takes about a minute under software emulation.
"""

import hashlib
import time

import pytest

import nlmclient
import rpcclient as rc
from conftest import REPO
from rpcclient import WRITE_LT, Client, St, expect
from test_linux_client import (
    GUEST_EXIT,
    ControlServer,
    boot_guest,
    expect_nlm_held,
    failure_context,
    nlm_test,
    open_path,
    retire,
    serve_for_guest,
)

GUEST_SCRIPT = REPO / "tests" / "vm" / "guest" / "nlm.sh"
GRACE = 15  # --grace-time: NLM's grace period lasts all of it
WAIT = 60  # how long the host waits for the server to get somewhere


class NlmControl(ControlServer):
    """The control requests of guest/nlm.sh (see its header); each checks
    the server from the host before the guest is answered "ok"."""

    def __init__(self, server):
        super().__init__(server)
        self.v4 = None  # the NFSv4 client of v4-lock: (client, fh, open stateid, lock stateid, range)
        self.timings = {}

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        if cmd == "v4-lock":
            path, start, length = arg.split()
            self._v4_lock(path, int(start), int(length))
            return "ok"
        if cmd == "v4-unlock":
            self._v4_unlock()
            return "ok"
        if cmd == "nlm-restart":
            path, start, length = arg.split()
            self._nlm_restart(path, int(start), int(length))
            return "ok"
        if cmd == "nlm-free":
            path, start, length = arg.split()
            r = nlm_test(self.server.port, path, int(start), int(length))
            assert r.stat == nlmclient.S.GRANTED, f"{line}: another host's NLM TEST: {r!r}, expected GRANTED"
            return "ok"
        return super()._handle(line)

    def _wait(self, what, ok, deadline=WAIT):
        """Polls `ok()` (the behaviour under test) until it is true, for at
        most `deadline` seconds; returns the seconds it took."""
        t0 = time.monotonic()
        while not ok():
            assert time.monotonic() - t0 < deadline, f"{what}: not within {deadline} s"
            time.sleep(0.05)
        return time.monotonic() - t0

    def _v4_lock(self, path, start, length):
        c = Client(self.server.port, machine="host-v4").establish()
        open_stateid, fh = open_path(c, path)
        r = expect(c.lock(fh, open_stateid, owner=c.owner + b"/lock", offset=start, length=length, locktype=WRITE_LT),
                   St.OK, "NFSv4 client's LOCK")
        self.v4 = (c, fh, open_stateid, r.stateid, (start, length))

    def _v4_unlock(self):
        assert self.v4, "v4-lock did not run"
        c, fh, open_stateid, lock_stateid, (start, length) = self.v4
        self.v4 = None
        # The guest's F_SETLKW must be waiting on the server first, or the
        # unlock would not test the callback.
        self.timings["blocked"] = self._wait(
            "the guest's blocking LOCK waits on the server (sluice_nlm_waiting_locks)",
            lambda: self.server.metrics().get("sluice_nlm_waiting_locks", 0) >= 1)
        granted = self.server.counter("sluice_nlm_granted_callbacks")
        expect(c.compound([rc.op_putfh(fh), rc.op_locku(lock_stateid, start, length)]), St.OK, "NFSv4 LOCKU")
        retire(c, fh, open_stateid)
        self.timings["granted"] = self._wait(
            "NLM4_GRANTED accepted by the guest's lock manager",
            lambda: self.server.counter("sluice_nlm_granted_callbacks") > granted, deadline=20)
        assert self.server.metrics().get("sluice_nlm_waiting_locks", 0) == 0, "a LOCK still waits"

    def _nlm_restart(self, path, start, length):
        at = self.server.log_size()
        self.server.restart()  # SIGKILL, then start on the same ports and state
        self.boot_log = at
        # Right after the start, before the guest could reclaim: another
        # host is held back by the grace period.
        r = nlm_test(self.server.port, path, start, length)
        assert r.stat == nlmclient.S.DENIED_GRACE_PERIOD, f"NLM TEST just after the restart: {r!r}"
        self.timings["notify"] = self._wait(
            "SM_NOTIFY answered by the guest's rpc.statd",
            lambda: self.server.counter("sluice_sm_notify_sent") >= 1)
        self.timings["reclaim"] = self._wait(
            "the guest's lock manager reclaims (sluice_reclaims_total)",
            lambda: self.server.counter("sluice_reclaims") >= 1)
        self.timings["grace"] = self._wait(
            "the end of NLM's grace period",
            lambda: nlm_test(self.server.port, path, start, length).stat != nlmclient.S.DENIED_GRACE_PERIOD,
            deadline=GRACE + WAIT)
        log = self.server.log_since(self.boot_log)
        assert "SM_NOTIFY sent" in log, "no 'SM_NOTIFY sent' line in the server log since the restart"
        expect_nlm_held(self.server.port, path, start, length, "after the guest's reclaim")


@pytest.fixture
def nlm_server(sluice_binary, tmp_path):
    """A GuestServer with its portmapper on 127.0.0.1:111, the guest's NSM
    ports to call, and a short grace period."""
    yield from serve_for_guest(sluice_binary, tmp_path, ["--grace-time", str(GRACE)], nsm=True)


@pytest.mark.guest
@pytest.mark.parametrize("kernel", ["6.1", "6.12"], ids=lambda k: f"linux{k}")
def test_linux_nlm(nlm_server, tmp_path, kernel):
    ctl = NlmControl(nlm_server)
    console_path = tmp_path / "guest-console.log"
    try:
        rc_ = boot_guest(kernel, nlm_server, ctl, GUEST_SCRIPT, console_path, bins=("perl",), nsm=nlm_server.nsm)
    finally:
        ctl.close()
    out = console_path.read_text(errors="replace")
    print(out)

    def context():
        return failure_context(out, console_path, nlm_server, 80)

    assert rc_ == 0, f"guest script failed: exit {rc_} {GUEST_EXIT.get(rc_, '')}" + context()
    assert f"ALL NLM STEPS PASSED (kernel {kernel}" in out, "the guest did not finish" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    sent = [r.partition(" ")[0] for r in ctl.requests]
    assert sent == ["nlm-held", "nlm-free", "v4-lock", "v4-unlock", "nlm-held", "nlm-restart", "nlm-held", "nlm-free"], sent
    print("host-side timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in ctl.timings.items()))

    # What the guest wrote across the crash is on the server, exact.
    want = hashlib.md5(b"first line\nafter the restart\n").hexdigest()
    assert f"MD5 locks/recl {want}" in out, "the guest read back other content" + context()
    with open(nlm_server.export / "locks" / "recl", "rb") as f:
        assert hashlib.md5(f.read()).hexdigest() == want, "locks/recl on the server"
