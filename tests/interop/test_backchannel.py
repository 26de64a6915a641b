"""The NFSv4.1 back channel (RFC 8881 section 2.10.3.1), over raw RPC.

A client that asks for a back channel in CREATE_SESSION
(CREATE_SESSION4_FLAG_CONN_BACK_CHAN) gets it on the connection it asked
over: the server probes it with CB_NULL once the CREATE_SESSION reply is
out, to the callback program the client named. A back channel that does
not answer, refuses, or whose connection is gone shows in every SEQUENCE
as SEQ4_STATUS_CB_PATH_DOWN and SEQ4_STATUS_CB_PATH_DOWN_SESSION; a
client that never asked for one is not told anything.
BIND_CONN_TO_SESSION with a back direction moves the back channel to
another connection, BACKCHANNEL_CTL changes the program, and security
the server cannot call with (RPCSEC_GSS alone) gets
NFS4ERR_ENCR_ALG_UNSUPP, as on the Linux server.

Waiting for the probe's time-out (5 s) is the behaviour under test where it
happens; other waits poll for a state with a deadline.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

import rpcclient as rc
from rpcclient import AUTH_NONE, AUTH_SYS, Client, St, expect, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

CONN_BACK_CHAN = 0x2
CB_PATH_DOWN = 0x1
CB_PATH_DOWN_SESSION = 0x200
DOWN = CB_PATH_DOWN | CB_PATH_DOWN_SESSION
PROGRAM = 0x40000123
CDFC4_BACK, CDFC4_BACK_OR_BOTH, CDFS4_BOTH = 0x2, 0x7, 0x3
PROBE_TIMEOUT = 5.0  # the server's callback time-out


@pytest.fixture
def srv(sluice_factory):
    return sluice_factory("--grace-time", 0, metrics=True, root_squash=False)


def with_back_channel(srv, program: int = PROGRAM, sec=None) -> Client:
    c = Client(srv.port)
    expect_ok(c.exchange_id(), "EXCHANGE_ID")
    sec = [rc.cb_sec_sys(machine="cbtest")] if sec is None else sec
    r = c.create_session(flags=CONN_BACK_CHAN, cb_program=program, sec=sec)
    expect_ok(r, "CREATE_SESSION with a back channel")
    assert r[0].flags & CONN_BACK_CHAN, f"back channel not granted on this connection: {r[0].flags:#x}"
    return c


def flags(c: Client) -> int:
    r = c.sequence()
    expect_ok(r, "SEQUENCE")
    return r[0].status_flags


def until_flags(c: Client, want: int, deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while True:
        f = flags(c)
        if f & DOWN == want:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{what}: SEQUENCE status flags {f:#x} after {deadline} s")
        time.sleep(0.1)


def test_probe_reaches_the_client_program_and_path_is_up(srv):
    c = with_back_channel(srv)
    call = c.conn.next_call(timeout=10)
    assert (call.prog, call.vers, call.proc) == (PROGRAM, 1, 0), f"not a CB_NULL to the client's program: {call!r}"
    assert call.cred_flavor in (AUTH_NONE, AUTH_SYS)
    c.conn.answer(call)
    assert srv.wait_counter("sluice_callbacks", 1), "the answered probe was not counted"
    assert flags(c) & DOWN == 0
    assert srv.counter("sluice_callback_failures") == 0


def test_unanswered_probe_puts_the_path_down(srv):
    c = with_back_channel(srv)
    call = c.conn.next_call(timeout=10)
    assert call.proc == 0
    started = time.monotonic()
    until_flags(c, DOWN, PROBE_TIMEOUT + 5, "a probe nobody answers")
    assert time.monotonic() - started >= PROBE_TIMEOUT - 1, "down before the probe timed out"
    assert srv.counter("sluice_callback_failures") == 1


def test_sigterm_does_not_wait_for_a_callback_nobody_answers(srv):
    """A server told to stop has finished its requests and flushed its
    exports; a call to a client still waiting for its answer (here the
    probe, never answered) is dropped, not waited for. Had the server
    waited, the probe's time-out would be in its log before it exited."""
    c = with_back_channel(srv)
    call = c.conn.next_call(timeout=10)
    assert call.proc == 0, f"not the CB_NULL probe: {call!r}"
    started = time.monotonic()
    srv.stop()  # SIGTERM, with the probe unanswered and the connection open
    took = time.monotonic() - started
    log = srv.log_path.read_text(errors="replace")
    assert "SIGTERM: shutting down" in log, "the server did not log its shutdown"
    assert "no reply within" not in log, (
        f"the server waited for the unanswered probe to time out before it exited ({took:.1f} s):\n{log[-2000:]}")
    c.close()


def test_refused_probe_puts_the_path_down(srv):
    c = with_back_channel(srv)
    c.conn.answer(c.conn.next_call(timeout=10), accept_stat=1)  # PROG_UNAVAIL
    until_flags(c, DOWN, 3, "a refused probe")


def test_gone_connection_puts_the_path_down(srv):
    c = with_back_channel(srv)
    c.conn.answer(c.conn.next_call(timeout=10))
    assert flags(c) & DOWN == 0
    c.reconnect()  # the back channel's connection closes
    until_flags(c, DOWN, 5, "the back channel's connection closed")


def test_no_flags_for_a_client_without_a_back_channel(srv):
    c = Client(srv.port)
    expect_ok(c.exchange_id(), "EXCHANGE_ID")
    r = c.create_session(flags=0)
    expect_ok(r, "CREATE_SESSION")
    assert r[0].flags & CONN_BACK_CHAN == 0
    with pytest.raises(socket.timeout):
        c.conn.next_call(timeout=1)
    assert flags(c) & DOWN == 0


def test_bind_conn_to_session_moves_the_back_channel(srv):
    c = with_back_channel(srv)
    c.conn.answer(c.conn.next_call(timeout=10))
    other = rc.Conn(srv.port)
    try:
        r = rc.StateReply(
            other.call(rc.PROC_COMPOUND, rc.compound_args([rc.op_bind_conn_to_session(c.sessionid, CDFC4_BACK_OR_BOTH)]), cred_body=c.cred).body
        )
        expect_ok(r, "BIND_CONN_TO_SESSION back or both")
        assert r[0].dir == CDFS4_BOTH
        call = other.next_call(timeout=10)
        assert (call.prog, call.proc) == (PROGRAM, 0), f"no probe on the newly bound connection: {call!r}"
        other.answer(call)
        with pytest.raises(socket.timeout):
            c.conn.next_call(timeout=1)
    finally:
        other.close()
    # The bound connection is gone now: the path is down although the
    # session's first connection is still there.
    until_flags(c, DOWN, 5, "the bound connection closed")


def test_backchannel_ctl_changes_the_program(srv):
    c = with_back_channel(srv)
    c.conn.answer(c.conn.next_call(timeout=10))
    expect_ok(c.compound([rc.op_backchannel_ctl(PROGRAM + 1, [rc.cb_sec_none()])]), "BACKCHANNEL_CTL")
    r = c.call([rc.op_bind_conn_to_session(c.sessionid, CDFC4_BACK)])
    expect_ok(r, "BIND_CONN_TO_SESSION back")
    call = c.conn.next_call(timeout=10)
    assert call.prog == PROGRAM + 1, f"probe went to {call.prog:#x}, not the program BACKCHANNEL_CTL set"
    c.conn.answer(call)


def test_security_the_server_cannot_call_with_is_refused(srv):
    c = Client(srv.port)
    expect_ok(c.exchange_id(), "EXCHANGE_ID")
    expect(c.create_session(flags=CONN_BACK_CHAN, sec=[rc.cb_sec_gss()]), St.ENCR_ALG_UNSUPP, "CREATE_SESSION with RPCSEC_GSS only")
    c = with_back_channel(srv)
    c.conn.answer(c.conn.next_call(timeout=10))
    expect(c.compound([rc.op_backchannel_ctl(PROGRAM, [rc.cb_sec_gss()])]), St.ENCR_ALG_UNSUPP, "BACKCHANNEL_CTL with RPCSEC_GSS only")
