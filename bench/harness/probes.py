"""One-off protocol checks whose answers go into the results' notes."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def read_plus_reply(host: str, port: int, name: str, count: int = 65536) -> str:
    """Sends one READ_PLUS (NFSv4.2) for the first `count` bytes of `name`
    in the export root and describes the reply: status and segments."""
    sys.path.insert(0, str(REPO / "tests" / "interop"))
    try:
        import rpcclient as rc
    finally:
        sys.path.pop(0)

    with rc.Conn(port, host=host, timeout=10) as conn:
        session = rc.Session(conn)
        r = session.compound([rc.op_putrootfh(), rc.op_lookup(name), rc.op_read_plus(0, count)], minor=2)
    last = r.results[-1]
    if last.opnum != rc.Op.READ_PLUS:
        return f"the COMPOUND stopped before READ_PLUS (op {last.opnum}, status {last.status})"
    if last.status != rc.St.OK:
        return f"status {last.status}" + (" (NFS4ERR_NOTSUPP)" if last.status == rc.St.NOTSUPP else "")
    u = rc.Unpacker(r.undecoded)
    eof, n = u.bool(), u.u32()
    segments, covered = [], 0
    for _ in range(n):
        kind = u.u32()
        if kind == 0:
            off, length = u.u64(), len(u.opaque())
            segments.append(f"data at {off}, {length} bytes")
        elif kind == 1:
            off, length = u.u64(), u.u64()
            segments.append(f"hole at {off}, {length} bytes")
        else:
            segments.append(f"segment type {kind}")
            break
        covered += length
    return (
        f"NFS4_OK, eof={eof}, {n} segment(s): " + "; ".join(segments[:4]) + f" (covers {covered} of the "
        f"{count} bytes asked for)"
    )


def describe_ganesha_read_plus(host: str, port: int, name: str, count: int = 65536) -> str:
    try:
        answer = read_plus_reply(host, port, name, count)
    except (Exception, struct.error) as e:  # noqa: BLE001 - a probe never stops the run
        answer = f"probe failed: {e}"
    return f"nfs-ganesha READ_PLUS of {count} bytes at offset 0 of `{name}`: {answer}"
