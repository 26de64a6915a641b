"""Busy polling for a lone client's next request (`--busy-poll-us`).

A client that sends each call as soon as it has the answer to the one
before has the connection's thread poll its socket for the next call
instead of sleeping; the metrics count what was found that way. With
`--busy-poll-us 0`, or while two clients take turns, nothing is polled
for; either way every call is answered, in order.
"""

from __future__ import annotations

import os

import pytest

import rpcclient as rc
from rpcclient import Client, Conn, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

CALLS = 400


def page_counts(srv) -> tuple[float, float]:
    page = srv.page()
    for name in ("sluice_requests_polled_total", "sluice_polls_missed_total"):
        assert f"\n{name} " in page, f"{name} missing from the metrics page"
    return srv.counter("sluice_requests_polled"), srv.counter("sluice_polls_missed")


def one_at_a_time(srv):
    """CALLS GETATTRs and NULLs, each sent when the one before is answered."""
    (srv.export / "f").write_bytes(b"x" * 1234)
    with Client(srv.port) as c:
        c.establish()
        for i in range(CALLS):
            if i % 2:
                r = c.conn.null()
                assert r.accept_stat == rc.SUCCESS, r
            else:
                expect_ok(c.compound([rc.op_putrootfh(), rc.op_lookup("f"), rc.op_getattr()]), f"GETATTR {i}")


def test_a_lone_client_s_calls_are_polled_for(sluice_factory):
    srv = sluice_factory("--busy-poll-us", 5000, metrics=True)
    polled, _ = page_counts(srv)
    one_at_a_time(srv)
    polled_after, _ = page_counts(srv)
    # Each call follows its answer within milliseconds; only one whose
    # client lost its CPU for longer than the poll is not polled for.
    assert polled_after - polled > CALLS / 4, f"{polled_after - polled} of {CALLS} calls polled for"


def test_nothing_is_polled_for_with_busy_poll_0(sluice_factory):
    srv = sluice_factory("--busy-poll-us", 0, metrics=True)
    one_at_a_time(srv)
    assert page_counts(srv) == (0, 0)


def test_clients_taking_turns_are_not_polled_for(sluice_factory):
    """Polling one socket while another client's call waits would hold
    that call up: a connection polls only after bringing the last 64
    requests."""
    srv = sluice_factory("--busy-poll-us", 5000, metrics=True)
    with Conn(srv.port) as a, Conn(srv.port) as b:
        for _ in range(CALLS // 2):
            for c in (a, b):
                assert c.null().accept_stat == rc.SUCCESS
    assert page_counts(srv) == (0, 0)
