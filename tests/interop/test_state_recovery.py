"""Stable client records across crashes, and many clients reclaiming.

* The record store (clients.db in the state directory, SQLite) must be
  consistent whenever the server dies: SIGKILL it in the middle of client
  arrivals (EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE: the client is
  recorded) and departures (DESTROY_SESSION, DESTROY_CLIENTID: the record
  goes), several times; every time the store must open, pass SQLite's
  integrity check, hold every client whose arrival was acknowledged and
  none whose departure was, and the restarted server must wait in grace for
  exactly the clients the store holds.
* 64 clients hold opens and locks, the server is killed and restarted, they
  all reclaim; grace must end as soon as the last one sends
  RECLAIM_COMPLETE (target: under 1 s), and their locks must hold.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import threading
import time

import pytest

from conftest import MetricsServer

from rpcclient import (
    CLAIM_PREVIOUS,
    Client,
    St,
    op_destroy_clientid,
    op_destroy_session,
    op_getfh,
    op_lock_new,
    op_open,
    op_putfh,
    op_reclaim_complete,
)


def store_rows(state_dir):
    """(integrity, (current, recovery), {epoch: set(owners)}) of clients.db,
    read as a separate process would after a crash."""
    db = sqlite3.connect(f"file:{state_dir / 'clients.db'}?mode=ro", uri=True)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        epochs = db.execute("SELECT current, recovery FROM epochs WHERE id = 1").fetchone()
        rows = {}
        for epoch, owner in db.execute("SELECT epoch, owner FROM clients"):
            rows.setdefault(epoch, set()).add(bytes(owner))
        return integrity, epochs, rows
    finally:
        db.close()


def metric(server, name):
    """A value from the server's metrics page."""
    m = server.metrics()
    assert name in m, f"{name} not on the metrics page"
    return m[name]


@pytest.fixture
def serve_state(sluice_binary, tmp_path):
    """A server with a metrics endpoint, restartable on its state dir."""
    servers = []

    def make(*extra):
        export, state = tmp_path / "export", tmp_path / "state"
        export.mkdir(exist_ok=True)
        state.mkdir(exist_ok=True)
        s = MetricsServer(sluice_binary, export, state, list(extra))
        s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def churn(port, tag, stop, progress, acked, departed, started_leaving):
    """Clients arrive and about half of them leave again, until `stop` or
    the connection fails (the server was killed). Records what the server
    acknowledged."""
    i = 0
    rng = random.Random(tag)
    while not stop.is_set():
        owner = f"churn-{tag}-{i}".encode()
        i += 1
        try:
            c = Client(port, owner=owner, timeout=5)
        except OSError:
            if stop.wait(30):
                return
            raise
        try:
            c.establish()  # ends with RECLAIM_COMPLETE: the client is recorded
            acked.add(owner)
            progress[0] += 1
            if rng.random() < 0.5:
                started_leaving.add(owner)
                r = c.call([op_destroy_session(c.sessionid)])
                assert r.status == St.OK, r
                r = c.call([op_destroy_clientid(c.clientid)])
                assert r.status == St.OK, r
                departed.add(owner)
                progress[0] += 1
        except Exception:  # noqa: BLE001
            # The server was killed under us: the test sets `stop` right
            # after the kill. Anything else is a real failure.
            if stop.wait(30):
                return
            raise
        finally:
            c.close()


def churn_then_kill(srv, tag, kill_after: int):
    """Runs `churn` against `srv` and SIGKILLs the server once it has seen
    `kill_after` arrivals and departures. Returns (how many it saw, acked,
    departed, started leaving)."""
    stop = threading.Event()
    progress = [0]
    acked, departed, leaving = set(), set(), set()
    t = threading.Thread(target=churn, args=(srv.port, tag, stop, progress, acked, departed, leaving))
    t.start()
    deadline = time.monotonic() + 60
    while progress[0] < kill_after and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.is_alive(), "the churn stopped before the kill"
    assert progress[0] >= kill_after, f"only {progress[0]} arrivals/departures in 60 s"
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    stop.set()
    t.join(30)
    return progress[0], acked, departed, leaving


def test_record_store_survives_sigkill_during_client_churn(serve_state):
    """SIGKILL at random points of 1,000+ arrivals and departures, five
    times: the store is whole and says exactly what was acknowledged."""
    srv = serve_state("--grace-time", "1", "--lease-time", "30")
    rng = random.Random(8881)
    total = 0
    all_acked, all_departed = set(), set()
    for round_ in range(5):
        if round_ % 2 == 0:
            # Every other round starts after grace is over; the others are
            # killed during grace, which must keep the recovery epoch.
            deadline = time.monotonic() + 10
            while metric(srv, "sluice_in_grace") != 0:
                assert time.monotonic() < deadline, "grace did not end after its time"
                time.sleep(0.05)
        done, acked, departed, leaving = churn_then_kill(srv, round_, rng.randrange(120, 320))
        total += done
        all_acked |= acked
        all_departed |= departed
        integrity, (current, recovery), rows = store_rows(srv.state)
        assert integrity == "ok", f"round {round_}: clients.db integrity check: {integrity}"
        recorded = set().union(*rows.values()) if rows else set()
        # Clients that arrived this round and never started leaving, and
        # earlier rounds' clients still in grace's recovery epoch, are there.
        must = acked - leaving
        missing = must - rows.get(current, set())
        assert not missing, f"round {round_}: {len(missing)} acknowledged arrivals missing, e.g. {sorted(missing)[:3]}"
        gone = departed & recorded
        assert not gone, f"round {round_}: {len(gone)} acknowledged departures still recorded"
        # The restarted server opens the store and waits in grace for
        # exactly the clients recorded in the epoch that just ended, or, when
        # it was killed during grace, for those that could reclaim then.
        srv.proc = None
        srv.start()
        waiting = metric(srv, "sluice_grace_waiting_clients")
        in_grace = metric(srv, "sluice_in_grace")
        expected = len(rows.get(recovery or current, set()))
        if expected:
            assert in_grace == 1 and waiting == expected, (round_, in_grace, waiting, expected)
        else:
            assert in_grace == 0
    assert total >= 1000, f"only {total} arrivals and departures in 5 rounds"
    print(f"\n{total} client arrivals and departures, 5 SIGKILLs: store consistent every time")


N_CLIENTS = 64


def test_64_clients_reclaim_and_grace_ends_at_once(serve_state):
    """64 clients each hold an open and a write lock on their own range of
    one file; after a SIGKILL and restart (grace 60 s) they all reclaim, and
    grace ends when the last RECLAIM_COMPLETE is answered."""
    srv = serve_state("--grace-time", "60")
    (srv.export / "shared").write_bytes(b"x" * N_CLIENTS * 10)
    clients = []
    for i in range(N_CLIENTS):
        c = Client(srv.port, owner=f"reclaimer-{i:02d}".encode(), verifier=b"boot-001").establish()
        sid, fh = c.must_open("shared", create=False)
        r = c.lock(fh, sid, offset=i * 10, length=10)
        assert r.status == St.OK, r
        clients.append((c, fh))
    assert metric(srv, "sluice_locks") == N_CLIENTS

    srv.restart(signal.SIGKILL)
    assert metric(srv, "sluice_in_grace") == 1
    assert metric(srv, "sluice_grace_waiting_clients") == N_CLIENTS
    newcomer = Client(srv.port, owner=b"newcomer").establish()
    r = newcomer.open("shared", create=False)
    assert r.status == St.GRACE, f"new OPEN during grace: {r!r}"

    t0 = time.monotonic()
    last_done = None
    for i, (c, fh) in enumerate(clients):
        c.reconnect()
        r = c.exchange_id()
        assert r.status == St.OK, r
        r = c.create_session()
        assert r.status == St.OK, r
        r = c.compound([op_putfh(fh), op_open(c.owner + b"/open", claim=CLAIM_PREVIOUS), op_getfh()])
        assert r.status == St.OK, f"client {i}: CLAIM_PREVIOUS: {r!r}"
        sid = r[2].stateid
        r = c.compound([op_putfh(fh), op_lock_new(sid, c.owner + b"/lock", i * 10, 10, reclaim=True)])
        assert r.status == St.OK, f"client {i}: LOCK reclaim: {r!r}"
        if i == N_CLIENTS - 1:
            assert metric(srv, "sluice_in_grace") == 1
            assert metric(srv, "sluice_grace_waiting_clients") == 1
        r = c.compound([op_reclaim_complete()])
        assert r.status == St.OK, r
        last_done = time.monotonic()
    reclaim_time = last_done - t0
    # Grace must be over now: poll a new OPEN until it is not refused.
    while True:
        r = newcomer.open("shared", create=False)
        if r.status != St.GRACE:
            break
        assert time.monotonic() - last_done < 5, "grace did not end within 5 s of the last RECLAIM_COMPLETE"
    ended_after = time.monotonic() - last_done
    assert r.status == St.OK, r
    assert ended_after < 1.0, f"grace ended {ended_after:.3f} s after the last RECLAIM_COMPLETE"
    assert metric(srv, "sluice_reclaims_total") == 2 * N_CLIENTS
    assert metric(srv, "sluice_locks") == N_CLIENTS
    assert "every client known from before has reclaimed" in srv.log_path.read_text()
    # The reclaimed locks hold against the newcomer.
    r = newcomer.lock(r.fh, r.stateid, offset=5, length=10)
    assert r.status == St.DENIED, r
    print(
        f"\n{N_CLIENTS} clients reclaimed {2 * N_CLIENTS} opens and locks in {reclaim_time:.2f} s; "
        f"grace ended {ended_after * 1000:.1f} ms after the last RECLAIM_COMPLETE"
    )
    for c, _ in clients:
        c.close()
    newcomer.close()
