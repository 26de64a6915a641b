"""Measures a TCP path: one stream each way and small round trips.

The far end runs as a script (`linkprobe.py serve --host ADDR --bytes N`,
started in the servers' network namespace): it prints "listening on PORT"
and then answers three connections in order:

1. sends N bytes and closes            (the rate towards the clients)
2. reads until EOF, answers the count  (the rate towards the servers)
3. echoes single bytes until EOF       (the round trip of a small request)

`measure` is the near end, called from the harness. Nothing here imports
the rest of the harness, so the script runs on its own.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import time

CHUNK = 1 << 20
ROUND_TRIPS = 200
TIMEOUT = 60


def serve(host: str, nbytes: int) -> None:
    with socket.create_server((host, 0)) as listener:
        listener.settimeout(TIMEOUT)
        print(f"listening on {listener.getsockname()[1]}", flush=True)
        with listener.accept()[0] as conn:
            _send(conn, nbytes)
        with listener.accept()[0] as conn:
            conn.sendall(struct.pack(">Q", _drain(conn)))
        with listener.accept()[0] as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while byte := conn.recv(1):
                conn.sendall(byte)


def measure(host: str, port: int, nbytes: int) -> dict:
    """MB/s (10^6 bytes) each way and the median small round trip."""
    with _connect(host, port) as conn:
        started = time.monotonic()
        got = _drain(conn)
        down = time.monotonic() - started
    if got != nbytes:
        raise RuntimeError(f"link probe: received {got} of {nbytes} bytes")

    with _connect(host, port) as conn:
        started = time.monotonic()
        _send(conn, nbytes)
        conn.shutdown(socket.SHUT_WR)
        (counted,) = struct.unpack(">Q", _exactly(conn, 8))
        up = time.monotonic() - started
    if counted != nbytes:
        raise RuntimeError(f"link probe: the far end received {counted} of {nbytes} bytes")

    trips = []
    with _connect(host, port) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(ROUND_TRIPS):
            started = time.monotonic()
            conn.sendall(b"x")
            _exactly(conn, 1)
            trips.append(time.monotonic() - started)
    return {
        "to_client_mb_per_s": nbytes / down / 1e6,
        "to_server_mb_per_s": nbytes / up / 1e6,
        "rtt_us_median": statistics.median(trips) * 1e6,
        "rtt_us_max": max(trips) * 1e6,
    }


def _connect(host: str, port: int) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=TIMEOUT)
    conn.settimeout(TIMEOUT)
    return conn


def _send(conn: socket.socket, nbytes: int) -> None:
    chunk = bytes(CHUNK)
    left = nbytes
    while left:
        n = min(left, CHUNK)
        conn.sendall(chunk[:n])
        left -= n


def _drain(conn: socket.socket) -> int:
    total = 0
    while data := conn.recv(CHUNK):
        total += len(data)
    return total


def _exactly(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = conn.recv(n - len(buf))
        if not data:
            raise RuntimeError("link probe: connection closed early")
        buf += data
    return buf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["serve"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    args = ap.parse_args()
    serve(args.host, args.bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
