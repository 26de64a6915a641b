#!/usr/bin/env python3
"""Server-side copies against copying through the client: prints figures.

For each file system (ext4 and xfs with reflink, each on a loop device
with direct I/O) it writes a source file, starts sluice in the network
namespace of `--wire` (a veth pair limited to RATE each way, as in
bench/run), and from the host, cold caches before each figure, times:

- `client`: the copy a client makes without server-side copy: READ each
  MiB and WRITE it to the destination, a reader and a writer running at
  once on two connections (the wire carries reads and writes in opposite
  directions), then COMMIT. Its floor is the file's size over the wire's
  rate, also printed (`wire floor`).
- `COPY sync`: COPY of 16 MiB at a time (what a client without a back
  channel, or one that asks for synchronous copies, gets), then COMMIT.
- `COPY async`: one COPY the client lets run asynchronously; it ends
  when CB_OFFLOAD arrives (the server flushed the copy: FILE_SYNC).
- nfs-ganesha on the same export: `client` and `COPY sync` (unless
  `--no-ganesha`); "failed" where it refuses COPY.
- `CLONE` (xfs only): one CLONE of the whole file, for each of
  `--clone-sizes`, to show that its time does not grow with the size.

    bench/server_copy.py [--size 1G] [--wire 1gbit] [--fs ext4,xfs] [--clone-sizes 256M,1G,2G] [--runs 3]

Run as root (loop devices, mounts, network namespaces).
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "interop"))

import rpcclient as rc  # noqa: E402
from harness import fs as fsmod, wire  # noqa: E402
from harness.servers import Ganesha, Sluice  # noqa: E402
from harness.util import MiB, Teardown, fmt_size, log, parse_size  # noqa: E402
from rpcclient import OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_ACCESS_READ, Client, Packer, St, expect_ok  # noqa: E402

CB_OFFLOAD = 15
CB_SEQUENCE = 11
PROGRAM = 0x40000000
CONN_BACK_CHAN = 0x2
CHUNK = MiB
# Fore channel: requests and replies of a 1 MiB READ or WRITE.
FORE = (0, 2 * MiB, 2 * MiB, 16 << 10, 16, 8)
OP_CLONE = 71


def holder(port: int, host: str) -> Client:
    """A client with a back channel that answered the probe (for
    asynchronous COPY and CB_OFFLOAD)."""
    c = Client(port, host=host, timeout=600)
    expect_ok(c.exchange_id(), "EXCHANGE_ID")
    expect_ok(c.create_session(flags=CONN_BACK_CHAN, cb_program=PROGRAM, sec=[rc.cb_sec_sys()], minor=2), "CREATE_SESSION")
    call = c.conn.next_call(timeout=30)
    c.conn.answer(call)
    expect_ok(c.compound([rc.op_reclaim_complete()]), "RECLAIM_COMPLETE")
    return c


def open_file(c: Client, name: str, access: int = OPEN4_SHARE_ACCESS_BOTH):
    r = c.compound([rc.op_putrootfh(), rc.op_open(c.owner + b"/" + name.encode(), name, access=access, create=True), rc.op_getfh()])
    expect_ok(r, f"OPEN {name}")
    return r[2].stateid, r[3].fh


def through_client(port: int, host: str, size: int) -> None:
    """READ every MiB on one connection, WRITE it on another, then COMMIT."""
    rd = Client(port, host=host, timeout=600).establish(fore=FORE)
    wr = Client(port, host=host, timeout=600).establish(fore=FORE)
    src, dst = open_file(rd, "src", OPEN4_SHARE_ACCESS_READ), open_file(wr, "dst")
    chunks: queue.Queue = queue.Queue(maxsize=8)
    failed: list[BaseException] = []

    def reader():
        try:
            for off in range(0, size, CHUNK):
                r = rd.compound([rc.op_putfh(src[1]), rc.op_read(off, CHUNK, stateid=src[0])])
                expect_ok(r, "READ")
                chunks.put((off, r[2].data))
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            failed.append(e)
        chunks.put(None)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    while (item := chunks.get()) is not None:
        off, data = item
        r = wr.compound([rc.op_putfh(dst[1]), rc.op_write(off, data, stateid=dst[0])])
        expect_ok(r, "WRITE")
    t.join()
    if failed:
        raise failed[0]
    expect_ok(wr.compound([rc.op_putfh(dst[1]), rc.op_commit()]), "COMMIT")


def copy_compound(c: Client, src, dst, off: int, count: int, synchronous: bool):
    r = c.compound([rc.op_putfh(src[1]), rc.op_savefh(), rc.op_putfh(dst[1]),
                    rc.op_copy(src[0], dst[0], off, off, count, synchronous=synchronous)], minor=2)
    expect_ok(r, "COPY")
    return r[4]


def copy_sync(port: int, host: str, size: int) -> None:
    c = Client(port, host=host, timeout=600).establish()
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    done = 0
    while done < size:
        res = copy_compound(c, src, dst, done, size - done, True)
        assert res.count > 0, "COPY copied nothing"
        done += res.count
    expect_ok(c.compound([rc.op_putfh(dst[1]), rc.op_commit()]), "COMMIT")


def copy_async(port: int, host: str, size: int) -> None:
    c = holder(port, host)
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    res = copy_compound(c, src, dst, 0, size, False)
    assert res.callback_id is not None, "the COPY was not asynchronous"
    call = c.conn.next_call(timeout=600)
    u = rc.Unpacker(call.args)
    u.opaque(), u.u32(), u.u32(), u.u32()
    seq = (u.u32(), u.fixed(16), u.u32(), u.u32())
    u.u32(), u.bool(), u.u32()
    assert u.u32() == CB_OFFLOAD, "not a CB_OFFLOAD"
    u.opaque(), u.fixed(16)
    assert u.u32() == St.OK, "the asynchronous copy failed"
    u.u32()
    assert u.u64() == size, "the asynchronous copy was short"
    p = Packer().u32(0).opaque(b"").u32(2)
    p.u32(CB_SEQUENCE).u32(0).fixed(seq[1]).u32(seq[2]).u32(seq[3]).u32(0).u32(0)
    p.u32(CB_OFFLOAD).u32(0)
    c.conn.answer(call, p.bytes())


def clone(port: int, host: str, size: int) -> None:
    c = Client(port, host=host, timeout=600).establish()
    src, dst = open_file(c, "src", OPEN4_SHARE_ACCESS_READ), open_file(c, "dst")
    args = Packer().fixed(src[0]).fixed(dst[0]).u64(0).u64(0).u64(size).bytes()
    r = c.compound([rc.op_putfh(src[1]), rc.op_savefh(), rc.op_putfh(dst[1]), (OP_CLONE, args)], minor=2)
    expect_ok(r, "CLONE")


def write_source(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(i.to_bytes(8, "big") + block[8:])
        f.write(os.urandom(size % MiB))


def timed(tfs, srv, size: int, what, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        # Emptied in place: the last run's client may still have it open.
        dst = tfs.mountpoint / "dst"
        if dst.exists():
            os.truncate(dst, 0)
        tfs.drop_caches()
        srv.drop_caches()
        started = time.monotonic()
        what(srv.port, srv.host, size)
        times.append(time.monotonic() - started)
        srv.check_alive()
        got = (tfs.mountpoint / "dst").stat().st_size
        assert got == size, f"the destination has {got} bytes, not {size}"
    return times


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/server_copy.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="bytes to copy (default 1G)")
    ap.add_argument("--wire", default="1gbit", help="the link between client and server (default 1gbit)")
    ap.add_argument("--fs", default="ext4,xfs", help="file systems (default ext4,xfs)")
    ap.add_argument("--clone-sizes", default="256M,1G,2G", help="sizes CLONE is timed at on xfs")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure (the median is printed)")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "sluice"))
    ap.add_argument("--no-ganesha", action="store_true", help="do not measure nfs-ganesha on the same export")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/server_copy.py: run as root (loop devices, mounts, network namespaces)", file=sys.stderr)
        return 2
    size = parse_size(a.size)
    clone_sizes = [parse_size(s) for s in a.clone_sizes.split(",") if s]
    rows = []
    with Teardown("copy bench") as td:
        link = wire.create(wire.parse_rate(a.wire), os.getpid(), td)
        measured = wire.measure(link, wire.PROBE_BYTES)
        rate = min(measured["to_client_mb_per_s"], measured["to_server_mb_per_s"]) * 1e6
        scratch = fsmod.make_scratch(td)
        for fs in a.fs.split(","):
            biggest = max([size, *clone_sizes]) if fs == "xfs" else size
            with Teardown(fs) as ftd:
                sub = scratch / fs
                sub.mkdir()
                tfs = fsmod.create_loop_fs(fs, sub, 3 * biggest, ftd)
                log(f"{fs}: writing a {fmt_size(size)} source")
                write_source(tfs.mountpoint / "src", size)
                srv = Sluice(Path(a.binary), tfs.mountpoint, sub, link=link)
                srv.start(ftd)
                figures = {}
                for name, fn in [("client", through_client), ("COPY sync", copy_sync), ("COPY async", copy_async)]:
                    log(f"{fs}: {name} of {fmt_size(size)} x{a.runs}")
                    figures[name] = statistics.median(timed(tfs, srv, size, fn, a.runs))
                floor = size / rate
                for name, t in figures.items():
                    rows.append((fs, name, size, t, figures["client"] / t, floor / t))
                rows.append((fs, "wire floor", size, floor, figures["client"] / floor, 1.0))
                if not a.no_ganesha:
                    g = Ganesha(tfs.mountpoint, sub, link=link)
                    g.start(ftd)
                    for name, fn in [("client", through_client), ("COPY sync", copy_sync)]:
                        log(f"{fs}: nfs-ganesha {name} of {fmt_size(size)} x{a.runs}")
                        try:
                            t = statistics.median(timed(tfs, g, size, fn, a.runs))
                        except AssertionError as e:
                            log(f"{fs}: nfs-ganesha {name}: {str(e)[:160]}")
                            rows.append((fs, f"ganesha {name}", size, None, None, None))
                            continue
                        rows.append((fs, f"ganesha {name}", size, t, figures["client"] / t, floor / t))
                    g.stop()
                if fs == "xfs":
                    for cs in clone_sizes:
                        write_source(tfs.mountpoint / "src", cs)
                        log(f"{fs}: CLONE of {fmt_size(cs)} x{a.runs}")
                        t = statistics.median(timed(tfs, srv, cs, clone, a.runs))
                        rows.append((fs, "CLONE", cs, t, None, None))
    print(f"\nServer-side copy vs through the client, {link.rate_text} wire (measured {rate / 1e6:.0f} MB/s "
          f"each way), median of {a.runs}, cold caches")
    print(f"{'fs':5} {'method':17} {'size':>8} {'seconds':>9} {'x client':>9} {'x floor':>8}")
    for fs, name, sz, t, vs_client, vs_floor in rows:
        if t is None:
            print(f"{fs:5} {name:17} {fmt_size(sz):>8} {'failed':>9}")
            continue
        vc = f"{vs_client:9.1f}" if vs_client is not None else f"{'':9}"
        vf = f"{vs_floor:8.2f}" if vs_floor is not None else f"{'':8}"
        print(f"{fs:5} {name:17} {fmt_size(sz):>8} {t:9.3f} {vc} {vf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
