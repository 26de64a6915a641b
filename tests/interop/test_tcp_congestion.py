"""The TCP congestion control of NFS connections (`--tcp-congestion`).

Without the option, connections keep the system's algorithm. With it,
every connection the server accepts uses the named one (read from the
server's side of the socket with `ss`), and serves as before. A name
the kernel does not have stops the start with the names it has.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import rpcclient as rc
from rpcclient import Client, expect_ok

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root")

PROC = Path("/proc/sys/net/ipv4")


def available() -> list[str]:
    return (PROC / "tcp_available_congestion_control").read_text().split()


def system_default() -> str:
    return (PROC / "tcp_congestion_control").read_text().strip()


def server_side(port: int, client_port: int) -> str:
    """The congestion control of the server's socket of one connection."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = set(available())
    found = [t for t in re.split(r"\s+", out) if t in names]
    assert len(found) == 1, f"one algorithm expected for the connection from port {client_port}:\n{out}"
    return found[0]


def read_back(c: Client, content: bytes):
    r = expect_ok(c.compound([rc.op_putrootfh(), rc.op_lookup("f"), rc.op_read(0, 256 << 10)]), "READ f")
    assert r[-1].data == content and r[-1].eof, "READ did not return the file"


@pytest.mark.parametrize("choose", [False, True], ids=["system-default", "chosen"])
def test_connections_use_the_chosen_congestion_control(sluice_factory, choose):
    default = system_default()
    # One that connections would not get by default (reno is always built
    # in), so that the server's choice is what the test sees.
    other = next((n for n in available() if n != default), "reno")
    args = ("--tcp-congestion", other) if choose else ()
    srv = sluice_factory(*args)
    content = os.urandom(256 << 10)
    (srv.export / "f").write_bytes(content)
    with Client(srv.port) as c, Client(srv.port) as d:
        c.establish()
        d.establish()
        read_back(c, content)
        read_back(d, content)
        for client in (c, d):
            port = client.conn.sock.getsockname()[1]
            assert server_side(srv.port, port) == (other if choose else default)


def test_an_unknown_congestion_control_stops_the_start(sluice_binary, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    try:
        p = subprocess.run(
            [
                str(sluice_binary),
                "serve",
                str(export),
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(tmp_path / "state"),
                "--tcp-congestion",
                "nonesuch",
            ],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"sluice kept running with --tcp-congestion nonesuch; stdout {e.stdout!r}")
    assert p.returncode != 0, p.stderr
    assert "--tcp-congestion" in p.stderr and "nonesuch" in p.stderr, p.stderr
    for name in available():
        assert name in p.stderr, f"the error does not list {name}: {p.stderr}"
    assert "listening on" not in p.stdout
