"""Read delegations with the Linux kernel NFS client, in a QEMU guest.

Boots tests/vm/linux-client like test_linux_client.py and runs
tests/vm/guest/delegations.sh in it against a real `sluice serve`:

Calls per file. The host makes NFILES small files; the guest opens, reads
and closes each of them twice (two passes) and counts the calls each pass
sent (/proc/self/mountstats). With read delegations (the default) the
second pass opens and closes from the delegations the first pass got, so
its OPEN, OPEN_NOATTR and CLOSE calls are at most a tenth of the first
pass's; with `--delegations none` it sends about as many as the first.
The calls per file of both passes are printed (for docs/delegations.md).

No stale data. The guest reads a file (and holds a read delegation on it),
then asks the host over the control channel to change it through another
client: the host's raw-RPC client (tests/interop/rpcclient.py) writes it,
opens it for writing, truncates, removes or renames it (or renames another
file over it). The server recalls the guest's delegation and answers the
host NFS4ERR_DELAY until the guest returned it; the host retries with a
deadline, checks the recall and the return in the server's metrics (no
callback may fail), and only then answers the guest, which must see the
change at once: new content, a removed file that does not open. A name
renamed away must be gone once the caches are dropped (until the client
revalidates the directory, Linux may still open its cached name by
filehandle, which is fine: the file exists).

Three boots: 6.12 with NFS 4.2 and 6.1 with 4.1 do both parts with
delegations on; 6.12 with 4.2 and `--delegations none` gives the baseline
of the first part. A boot takes about 10 s on two idle cores under
software emulation (the guest does little); SLUICE_VM_TIMEOUT bounds it.
"""

import os
import re
import time

import pytest

import rpcclient as rc
from rpcclient import ANONYMOUS_STATEID, OPEN4_SHARE_ACCESS_BOTH, Client, St, expect
from test_linux_client import GUEST_EXIT, ControlServer, GuestServer, boot_guest, failure_context

from conftest import REPO

GUEST_SCRIPT = REPO / "tests" / "vm" / "guest" / "delegations.sh"
NFILES = 200
# The files of the stale data steps: stale/KEY holds "stale/KEY version 1\n".
STALE_KEYS = ["w", "l", "o", "t", "r", "n", "v"]
# The changes the guest asks for, in order (see delegations.sh).
STALE_REQUESTS = [
    "change write stale/w",
    "change local-write stale/l",
    "change open-write stale/o",
    "change truncate stale/t 7",
    "change remove stale/r",
    "change rename stale/n stale/n2",
    "change rename stale/src stale/v",
]
# How long the host keeps retrying a change answered NFS4ERR_DELAY. The
# guest returns the delegation within a second or so; past a lease (90 s)
# the server would revoke it, which the test then reports.
RECALL_DEADLINE = 150
# Callbacks and the failed ops (a change answered NFS4ERR_DELAY, say) at
# debug level in the server log, for the failure context.
SERVER_LOG = "sluice::server::compound=debug,sluice::server::callback=debug"
OPEN_CLOSE = ("OPEN", "OPEN_NOATTR", "CLOSE")

# The write delegation steps (see delegations.sh): the files, and what the
# guest writes to each (kept dirty until it is asked for).
WRITE_KEYS = ["a", "c"]
GUEST_DATA = {"wd/a": "wd/a written by the guest\n", "wd/c": "wd/c written before the restart\n"}
WRITE_REQUESTS = ["change read wd/a"]
CHANGE_SIZE = ((1 << 3) | (1 << 4),)

# (kernel, NFS minor version, --delegations, stale data steps, write
# delegation steps)
BOOTS = [
    ("6.12", "4.2", "all", True, True),
    ("6.1", "4.1", "read", True, False),
    ("6.1", "4.1", "all", False, True),
    ("6.12", "4.2", "none", False, False),
]

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(
        os.uname().sysname != "Linux" or os.uname().machine != "x86_64",
        reason="the VM harness boots x86_64 Debian kernels",
    ),
]


def lookups(path: str):
    """PUTROOTFH and a LOOKUP per component of the directory of `path`;
    (ops, the last component)."""
    *dirs, name = path.split("/")
    return [rc.op_putrootfh(), *[rc.op_lookup(d) for d in dirs]], name


class DelegControl(ControlServer):
    """The guest's requests (see tests/vm/guest/delegations.sh):

    "mark LABEL"
        Keep the server's metrics now under LABEL; "ok".
    "change KIND PATH [ARG]"
        Make a change to PATH through another client (a raw-RPC client of
        the host's without a back channel), retrying it while the server
        answers NFS4ERR_DELAY (it is recalling the guest's delegation), for
        up to RECALL_DEADLINE s; KIND is write, open-write, truncate (to
        ARG bytes), remove or rename (to ARG). With delegations on, the
        first answer must be NFS4ERR_DELAY (the guest held a delegation
        on the file), no callback may fail meanwhile (checked at every
        retry: a failed recall would only end with the lease), and by the
        time the change went through the server must have counted one
        recall more, one return more and no revocation. "ok" when all
        that held.

        KIND may also be read: OPEN for reading and READ, then CLOSE. The
        data read is the file's before the guest wrote, or what it wrote
        (GUEST_DATA): the Linux client returns a recalled write
        delegation at once and keeps what it wrote under its open, to
        write back when the file is closed, as close-to-open allows.
    "dirty PATH SIZE"
        The server's file still has SIZE bytes: what the guest wrote to it
        is only in the guest.
    "getattr PATH SIZE"
        Another client's GETATTR of the size and change attribute answers
        at once (no NFS4ERR_DELAY) with SIZE, the guest's size, which the
        server got with CB_GETATTR: no recall, no failed callback, and the
        server's file still has its old size.
    "restart-dirty PATH SIZE"
        As "dirty", then the server's metrics are kept under
        "before-restart" and it is killed (SIGKILL) and started again.
    "written PATH"
        After the guest closed PATH: another client's READ (retried while
        NFS4ERR_DELAY) gives what the guest wrote.
    "reclaimed PATH"
        After the restart: the server counted reclaims, and another
        client's READ (retried while NFS4ERR_GRACE or NFS4ERR_DELAY) first
        gets NFS4ERR_DELAY (the guest reclaimed a delegation on the file),
        then the guest's data once it was recalled and returned.

    Anything that goes wrong is replied as "error ..." and kept in .errors.
    """

    def __init__(self, server, delegations: bool):
        self.delegations = delegations
        self.marks = {}
        self.changes = []  # (request, NFS4ERR_DELAY answers, seconds until done)
        self.read_after_recall = {}  # path: what "change read" read
        super().__init__(server)

    def _handle(self, line):
        cmd, _, arg = line.partition(" ")
        if cmd == "mark":
            self.marks[arg] = self.server.metrics()
            return "ok"
        if cmd == "change":
            kind, path, *rest = arg.split()
            self._change(line, kind, path, *rest)
            return "ok"
        if cmd in ("dirty", "restart-dirty"):
            path, size = arg.split()
            on_server = (self.server.export / path).stat().st_size
            assert on_server == int(size), (
                f"{path} has {on_server} bytes on the server, not {size}: the guest's data is not only in the guest")
            if cmd == "restart-dirty":
                self.marks["before-restart"] = self.server.metrics()
                self.server.restart()
            return "ok"
        if cmd == "getattr":
            path, size = arg.split()
            self._getattr(path, int(size))
            return "ok"
        if cmd == "reclaimed":
            self._read_back(arg, reclaimed=True)
            return "ok"
        if cmd == "written":
            self._read_back(arg, reclaimed=False)
            return "ok"
        return f"error: unknown request {line!r}"

    def _getattr(self, path, size):
        before = self.server.metrics()
        old = (self.server.export / path).stat().st_size
        c = Client(self.server.port, machine="host-getattr").establish()
        try:
            walk, name = lookups(path)
            r = c.compound([*walk, rc.op_lookup(name), rc.op_getattr(CHANGE_SIZE)])
            expect(r, St.OK, f"another client's GETATTR of {path} while the guest holds a write delegation")
            got = int.from_bytes(r[len(walk) + 2].attrvals[8:16], "big")
            assert got == size, f"GETATTR of {path} says {got} bytes, not the guest's {size}"
            expect(c.call([rc.op_destroy_session(c.sessionid)]), St.OK, "host client's DESTROY_SESSION")
            expect(c.call([rc.op_destroy_clientid(c.clientid)]), St.OK, "host client's DESTROY_CLIENTID")
        finally:
            c.close()
        after = self.server.metrics()
        grew = {n: after.get(n, 0) - before.get(n, 0) for n in (
            "sluice_callbacks_total", "sluice_callback_failures_total", "sluice_delegations_recalled_total")}
        assert grew == {"sluice_callbacks_total": 1, "sluice_callback_failures_total": 0,
                        "sluice_delegations_recalled_total": 0}, (
            f"GETATTR of {path}: {grew}; expected one CB_GETATTR answered, no recall")
        assert (self.server.export / path).stat().st_size == old, f"{path} changed size on the server"

    def _read_back(self, path, reclaimed: bool):
        m = self.server.metrics()
        if reclaimed:
            assert m.get("sluice_reclaims_total", 0) >= 1, f"no reclaims counted after the restart: {m}"
        before = m
        c = Client(self.server.port, machine="host-reclaimed").establish()
        try:
            walk, name = lookups(path)

            def attempt():
                return c.compound([*walk, rc.op_lookup(name), rc.op_read(0, 100, stateid=ANONYMOUS_STATEID)])

            start = time.monotonic()
            statuses = []
            r = attempt()
            while r.status in (St.GRACE, St.DELAY):
                statuses.append(r.status)
                assert time.monotonic() < start + RECALL_DEADLINE, f"READ of {path}: still {r!r} after {RECALL_DEADLINE} s"
                time.sleep(0.05)  # poll interval of the retry loop
                r = attempt()
            expect(r, St.OK, f"another client's READ of {path} after the restart")
            data = r[len(walk) + 2].data.decode(errors="replace")
            assert data == GUEST_DATA[path], f"{path} after the restart: {data!r}, not what the guest wrote"
            if reclaimed:
                assert St.DELAY in statuses, (
                    f"READ of {path} was never answered NFS4ERR_DELAY ({statuses}): the guest held no reclaimed delegation")
            expect(c.call([rc.op_destroy_session(c.sessionid)]), St.OK, "host client's DESTROY_SESSION")
            expect(c.call([rc.op_destroy_clientid(c.clientid)]), St.OK, "host client's DESTROY_CLIENTID")
        finally:
            c.close()
        after = self.server.metrics()
        grew = {n: after.get(n, 0) - before.get(n, 0) for n in (
            "sluice_delegations_recalled_total", "sluice_delegations_returned_total",
            "sluice_delegations_revoked_total", "sluice_callback_failures_total")}
        assert grew["sluice_delegations_revoked_total"] == 0 and grew["sluice_callback_failures_total"] == 0, (
            f"READ of {path}: {grew}; expected no revocation and no failed callback")
        if reclaimed:
            assert grew["sluice_delegations_recalled_total"] >= 1 and grew["sluice_delegations_returned_total"] >= 1, (
                f"READ of {path} after the restart: {grew}; expected a recall and the guest's DELEGRETURN")

    def _change(self, line, kind, path, *rest):
        at = self.server.log_size()
        try:
            self._change_checked(line, kind, path, *rest)
        except AssertionError as e:
            # What the server said about the recall meanwhile (callbacks,
            # revocations), for the report.
            said = [ln for ln in self.server.log_since(at).splitlines()
                    if re.search(r"callback|recall|revoke|back channel", ln)]
            raise AssertionError(f"{e}\nserver log since the request:\n" + "\n".join(said[-20:])) from None

    def _change_checked(self, line, kind, path, *rest):
        before = self.server.metrics()
        held = before.get("sluice_delegations", 0)
        if self.delegations:
            assert held >= 1, f"the server holds {held:g} delegations while the guest should hold one on {path}"
        if kind == "local-write":
            # A process on the server machine: its open for writing waits
            # for the recall (the delegation's kernel lease), then writes.
            start = time.monotonic()
            with open(self.server.export / path, "r+b") as f:
                f.write(f"{path} version 2\n".encode())
            took = time.monotonic() - start
            self.changes.append((line, 0, took))
            after = self.server.metrics()
            if self.delegations:
                grew = {n: after.get(n, 0) - before.get(n, 0) for n in (
                    "sluice_delegations_recalled_total", "sluice_delegations_returned_total",
                    "sluice_delegations_revoked_total", "sluice_callback_failures_total")}
                assert (grew["sluice_delegations_recalled_total"] >= 1 and grew["sluice_delegations_returned_total"] >= 1
                        and grew["sluice_delegations_revoked_total"] == 0 and grew["sluice_callback_failures_total"] == 0), (
                    f"local write of {path}: {grew}; expected a recall and the guest's DELEGRETURN, "
                    "no revocation, no failed callback")
            return
        c = Client(self.server.port, machine="host-deleg").establish()
        try:
            walk, name = lookups(path)
            if kind == "read":
                def attempt():
                    return c.compound([*walk, rc.op_open(c.owner + b"/open", name, access=rc.OPEN4_SHARE_ACCESS_READ),
                                       rc.op_read(0, 100, stateid=ANONYMOUS_STATEID)])
            elif kind == "write":
                def attempt():
                    return c.compound([*walk, rc.op_lookup(name), rc.op_write(0, f"{path} version 2\n".encode(), stable=2)])
            elif kind == "open-write":
                def attempt():
                    return c.compound([*walk, rc.op_open(c.owner + b"/open", name, access=OPEN4_SHARE_ACCESS_BOTH), rc.op_getfh()])
            elif kind == "truncate":
                size = rc.fattr4([1 << 4], int(rest[0]).to_bytes(8, "big"))

                def attempt():
                    return c.compound([*walk, rc.op_lookup(name), (rc.Op.SETATTR, ANONYMOUS_STATEID + size)])
            elif kind == "remove":
                def attempt():
                    return c.compound([*walk, rc.op_remove(name)])
            elif kind == "rename":
                to_walk, to_name = lookups(rest[0])

                def attempt():
                    return c.compound([*walk, rc.op_savefh(), *to_walk, rc.op_rename(name, to_name)])
            else:
                raise ValueError(f"unknown change {kind!r}")

            start = time.monotonic()
            r = attempt()
            first = r
            delays = 0
            while r.status == St.DELAY:
                delays += 1
                assert time.monotonic() < start + RECALL_DEADLINE, (
                    f"{kind} of {path}: still NFS4ERR_DELAY after {RECALL_DEADLINE} s ({delays} tries)")
                # A recall that failed leaves the change waiting for the
                # lease to run out: that is the failure, said at once.
                failed = self.server.metrics().get("sluice_callback_failures_total", 0) - before.get("sluice_callback_failures_total", 0)
                assert failed == 0, (
                    f"{kind} of {path}: {failed:g} callback(s) failed while the server recalled the guest's "
                    f"delegation ({delays} x NFS4ERR_DELAY so far)")
                time.sleep(0.05)  # poll interval of the retry loop
                r = attempt()
            expect(r, St.OK, f"the host client's {kind} of {path}")
            if kind == "read":
                n = len(walk)
                data = r[n + 2].data.decode(errors="replace")
                assert data in (f"{path} version 1\n", GUEST_DATA[path]), f"another client read {data!r} from {path}"
                self.read_after_recall[path] = data
                expect(c.compound([*walk, rc.op_lookup(name), rc.op_close(r[n + 1].stateid)]), St.OK, f"the host client's CLOSE of {path}")
            if kind == "open-write":
                n = len(walk)
                stateid, fh = r[n + 1].stateid, r[n + 2].fh
                w = c.compound([rc.op_putfh(fh), rc.op_write(0, f"{path} version 2\n".encode(), stateid=stateid, stable=2)])
                expect(w, St.OK, f"the host client's WRITE to {path} under its open")
                expect(c.compound([rc.op_putfh(fh), rc.op_close(stateid)]), St.OK, f"the host client's CLOSE of {path}")
            took = time.monotonic() - start
            expect(c.call([rc.op_destroy_session(c.sessionid)]), St.OK, "host client's DESTROY_SESSION")
            expect(c.call([rc.op_destroy_clientid(c.clientid)]), St.OK, "host client's DESTROY_CLIENTID")
        finally:
            c.close()
        after = self.server.metrics()
        self.changes.append((line, delays, took))

        def grew(name):
            return after.get(name, 0) - before.get(name, 0)

        if self.delegations:
            assert first.status == St.DELAY, (
                f"{kind} of {path}: the first answer was {first!r}, not NFS4ERR_DELAY: "
                "the guest held no delegation on the file")
            failed = grew("sluice_callback_failures_total")
            assert failed == 0, f"{kind} of {path}: {failed:g} callback(s) failed"
            recalled = grew("sluice_delegations_recalled_total")
            returned = grew("sluice_delegations_returned_total")
            revoked = grew("sluice_delegations_revoked_total")
            assert recalled >= 1 and returned >= 1 and revoked == 0, (
                f"{kind} of {path}: recalled +{recalled:g}, returned +{returned:g}, revoked +{revoked:g}; "
                "expected a recall and the guest's DELEGRETURN, no revocation")


@pytest.mark.parametrize(
    "kernel,vers,delegations,stale,write", BOOTS,
    ids=[f"linux{k}-nfs{v}-deleg-{d}" for k, v, d, _, _ in BOOTS],
)
def test_linux_delegations(sluice_binary, tmp_path, monkeypatch, capsys, kernel, vers, delegations, stale, write):
    monkeypatch.setenv("RUST_LOG", f"{os.environ.get('RUST_LOG', 'info')},{SERVER_LOG}")
    export, state = tmp_path / "export", tmp_path / "state"
    export.mkdir()
    state.mkdir()
    (export / "calls").mkdir()
    for i in range(NFILES):
        (export / "calls" / f"f{i:03d}").write_text(f"calls/f{i:03d}\n")
    if stale:
        (export / "stale").mkdir()
        for key in STALE_KEYS:
            (export / "stale" / key).write_text(f"stale/{key} version 1\n")
        (export / "stale" / "src").write_text("stale/v version 2\n")
    if write:
        (export / "wd").mkdir()
        for key in WRITE_KEYS:
            (export / "wd" / key).write_text(f"wd/{key} version 1\n")

    server = GuestServer(sluice_binary, export, state, ["--delegations", delegations])
    server.start()
    ctl = DelegControl(server, delegations != "none")
    console_path = tmp_path / "guest-console.log"
    started = time.monotonic()
    try:
        returncode = boot_guest(
            kernel, server, ctl, GUEST_SCRIPT, console_path,
            bins=("perl",),
            env={"VERS": vers, "NFILES": NFILES, "STALE": int(stale), "WRITE": int(write)},
        )
        took = time.monotonic() - started
        out = console_path.read_text(errors="replace")
        print(out)  # shown by pytest when the test fails
        m = server.metrics() if server.alive() else {}
    finally:
        ctl.close()
        alive = server.alive()
        server.stop()

    def context():
        return failure_context(out, console_path, server, 80)

    # --- calls per file (printed first: the passes come before the stale
    # data steps, which may fail) ---
    passes = {}
    for label, fields in re.findall(r"^CALLS pass=(\S+) (.*)$", out, re.M):
        passes[label] = {k: int(v) for k, v in (f.split("=") for f in fields.split())}
    measured = {"1", "2"} <= set(passes)
    if measured:
        opens = {p: sum(passes[p][op] for op in OPEN_CLOSE) for p in ("1", "2")}
        per_file = {p: opens[p] / NFILES for p in opens}
        detail = " | ".join(
            f"pass {p}: " + " ".join(f"{k}={v}" for k, v in passes[p].items() if k != "files") for p in ("1", "2"))
        held = {p: ctl.marks.get(p, {}).get("sluice_delegations", float("nan")) for p in ("pass1", "pass2")}
        summary = (
            f"linux {kernel}, NFS {vers}, --delegations {delegations}: OPEN+OPEN_NOATTR+CLOSE per file "
            f"pass 1 {per_file['1']:.2f}, pass 2 {per_file['2']:.2f} ({detail}); "
            f"delegations granted {m.get('sluice_delegations_granted_total', 0):g}, "
            f"held after pass 1 {held['pass1']:g}, after pass 2 {held['pass2']:g}; boot {took:.0f} s"
        )
        # On the terminal even when the test passes (for docs/delegations.md).
        with capsys.disabled():
            print(f"\nCALLS PER FILE {summary}")
            for line, delays, secs in ctl.changes:
                print(f"  {line}: {delays} x NFS4ERR_DELAY, done after {secs:.2f} s")
            for path, data in ctl.read_after_recall.items():
                print(f"  another client read {data!r} from {path} right after the recall")

    assert alive, "sluice died during the test" + context()
    failed_step = re.findall(r"^FAIL in step .*$", out, re.M)
    assert returncode == 0, (
        f"guest script failed: exit {returncode} {GUEST_EXIT.get(returncode, '')}\n"
        + "\n".join(failed_step or ["(no failing step reported)"])
        + (f"\ncontrol requests that failed: {ctl.errors}" if ctl.errors else "")
        + context()
    )
    assert "ALL STEPS PASSED" in out, "guest exited 0 without finishing" + context()
    assert not ctl.errors, f"control requests failed: {ctl.errors}" + context()
    changes = [r for r in ctl.requests if r.startswith("change ")]
    assert changes == (STALE_REQUESTS if stale else []) + (WRITE_REQUESTS if write else []), f"control requests: {ctl.requests}"
    assert set(ctl.marks) == {"pass1", "pass2"} | ({"before-restart"} if write else set()), f"control requests: {ctl.requests}"

    # --- calls per file ---
    assert measured, f"no CALLS lines for both passes in the guest output: {passes}"
    assert opens["1"] >= NFILES, f"pass 1 sent {opens['1']} OPEN/OPEN_NOATTR/CLOSE for {NFILES} files: {summary}" + context()
    if delegations != "none":
        assert opens["2"] * 10 <= opens["1"], (
            f"with read delegations pass 2 should send at most a tenth of pass 1's opens and closes: {summary}" + context())
    else:
        assert opens["2"] * 2 >= opens["1"], (
            f"without delegations pass 2 should send about as many opens and closes as pass 1: {summary}" + context())
        assert m.get("sluice_delegations_granted_total", 0) == 0, f"--delegations none granted some: {summary}"

    # --- the recalls, from the server's metrics at the end ---
    answered = m.get("sluice_callbacks_total", 0)
    failures = m.get("sluice_callback_failures_total", 0)
    assert answered >= 1 and failures == 0, (
        f"back channel: {answered:g} callbacks answered, {failures:g} failed" + context())
    if stale:
        # Counted before the restart of the write delegation steps.
        before = ctl.marks.get("before-restart", m)
        recalled = before.get("sluice_delegations_recalled_total", 0)
        returned = before.get("sluice_delegations_returned_total", 0)
        revoked = before.get("sluice_delegations_revoked_total", 0)
        assert recalled >= len(STALE_REQUESTS) and returned >= 1 and revoked == 0, (
            f"recalled {recalled:g}, returned {returned:g}, revoked {revoked:g}" + context())
        stale_dir = export / "stale"
        assert (stale_dir / "w").read_text() == "stale/w version 2\n"
        assert (stale_dir / "l").read_text() == "stale/l version 2\n"
        assert (stale_dir / "o").read_text() == "stale/o version 2\n"
        assert (stale_dir / "t").read_text() == "stale/t"
        assert (stale_dir / "v").read_text() == "stale/v version 2\n"
        assert (stale_dir / "n2").read_text() == "stale/n version 1\n"
        assert sorted(os.listdir(stale_dir)) == ["l", "n2", "o", "t", "v", "w"]
    if write:
        # The write delegation the guest reclaimed after the restart.
        assert m.get("sluice_write_delegations_granted_total", 0) >= 1, f"no write delegation since the restart: {m}"
        before = ctl.marks["before-restart"]
        assert before.get("sluice_write_delegations_granted_total", 0) >= 2, (
            f"the guest got {before.get('sluice_write_delegations_granted_total', 0):g} write delegations before the restart; expected wd/a and wd/c")
        for path, data in GUEST_DATA.items():
            assert (export / path).read_text() == data, f"{path} on the server is not what the guest wrote"
