#!/usr/bin/env python3
"""Torn-read detector through the Linux kernel NFS client, at scale.

The long-run companion of tests/interop/test_torn_reads.py (c): for each
file system (ext4 and xfs by default) it makes a fresh image on a loop
device (`losetup --direct-io=on`, bench/harness/fs.py), creates the test
file on the host, starts one sluice per file system on 127.0.0.1, then
boots ONE Linux guest (tests/vm, 6.12 by default) that mounts every export
(NFSv4.2) and runs tests/tools/tornread against each, in parallel (or one
after the other with --sequential). Writers rewrite random 8 KiB blocks
with O_DIRECT, every 512-byte sector stamped with (block, generation);
readers check every block they read. Progress is printed every --progress
seconds; at the end a table gives per file system the checked reads, torn
reads, writes, rates, the READ/WRITE RPCs the guest counted and whether
the file left on the server is consistent. Everything (QEMU, servers,
mounts, loop devices, images) is torn down at exit, on an error and on
Ctrl-C. Run as root.

    bench/torn_kernel.py [--fs ext4,xfs] [--reads 1000000] [--seconds S]
        [--blocks 4] [--writers 2] [--readers 4] [--prealloc-chunk 4096]
        [--kernel 6.12] [--smp 2] [--mem 1024] [--sequential]
        [--progress 60] [--unsafe-no-range-locks] [--stop-after-torn K]
        [--json PATH] [--console PATH] [--no-build]

--reads is per file system; --seconds caps each file system's run (default:
no practical cap). --unsafe-no-range-locks starts the servers with the hidden
test-only flag that turns byte-range locks off, to show that the detector
fails; pair it with --stop-after-torn. The defaults (4 blocks, 2 writers,
4 readers, file made in 4 KiB writes) are those of the CI test.

Guests run under TCG emulation (KVM with SLUICE_VM_ACCEL=kvm where it
works), so the rate is a few hundred checked reads per second: measure it
with a short run (--reads 20000) before a long one. On a shared machine,
serialise heavy runs, e.g.

    bench/torn_kernel.py --reads 1000000

Exit status: 0 when no read was torn, 1 when some were, 2 on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "vm"))

import sluicevm  # noqa: E402
import torn_read as tr  # noqa: E402
from harness import fs as fsmod  # noqa: E402
from harness.servers import Sluice  # noqa: E402
from harness.util import Interrupted, Teardown, fmt_duration, is_root, log, run  # noqa: E402

BINARY = REPO / "target" / "release" / "sluice"
TOOL_SRC = REPO / "tests" / "tools" / "tornread.c"
# Not under /tmp: the guest mounts a fresh tmpfs there.
TOOL = REPO / "target" / "test-tools" / "tornread"
FILE_SYSTEMS = ("ext4", "xfs")
LOCKS_OFF_FLAG = "--unsafe-no-range-locks"

# The guest half. @...@ are filled in by guest_script(); $SERVER comes from
# the VM harness. Each tornread prints progress lines and, at its end, one
# JSON line; the mountstats lines give the RPC counts per mount.
GUEST = r"""
set -u
echo "$(uname -r), $(grep -c ^processor /proc/cpuinfo) vCPU"
$TORNREAD selftest > /dev/null || { echo "FAILED: tornread selftest"; exit 2; }
for fs in @FS@; do
  eval port=\$PORT_$fs
  mkdir -p /mnt/$fs
  mount -t nfs4 -o vers=4.2,port=$port,addr=$SERVER $SERVER:/ /mnt/$fs \
    || { echo "FAILED: mount $fs"; exit 2; }
  # Each export holds only its own file: this fails if the client merged
  # the mounts into one server.
  [ -f /mnt/$fs/torn-$fs.dat ] || { echo "FAILED: /mnt/$fs is not the $fs export"; ls -la /mnt/$fs; exit 2; }
done
run_one() {
  $TORNREAD run /mnt/$1/torn-$1.dat $BLOCKS $WRITERS $READERS $READS $SECONDS $PROGRESS $STOP
  echo "tornread-exit $1 $?"
}
if [ "$SEQUENTIAL" = 1 ]; then
  for fs in @FS@; do run_one $fs; done
else
  for fs in @FS@; do run_one $fs & done
  wait
fi
echo "== mountstats"
grep -E '^device |^[[:space:]]+(READ|READ_PLUS|WRITE|COMMIT):' /proc/self/mountstats
echo "== end mountstats"
for fs in @FS@; do umount /mnt/$fs || { echo "FAILED: umount $fs"; exit 2; }; done
exit 0
"""

PROGRESS_RE = re.compile(
    r"^progress /mnt/(\w+)/\S+ t ([\d.]+) checked (\d+) torn (\d+) writes (\d+)$")
RESULT_RE = re.compile(r"^\{\"tool\": \"tornread\".*\}$")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/torn_kernel.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fs", default=",".join(FILE_SYSTEMS),
                    help="comma-separated file systems (ext4, xfs, btrfs)")
    ap.add_argument("--reads", type=int, default=1_000_000,
                    help="checked reads per file system (default 1,000,000)")
    ap.add_argument("--seconds", type=float, default=100_000,
                    help="cap on each file system's run, in seconds")
    ap.add_argument("--blocks", type=int, default=4, help="file size in 8 KiB blocks")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--prealloc-chunk", type=int, default=4096, metavar="BYTES",
                    help="write size used to create the file on the host (default 4096)")
    ap.add_argument("--kernel", default="6.12", choices=sorted(sluicevm.KERNELS))
    ap.add_argument("--smp", type=int, default=2,
                    help="guest vCPUs (default 2: measured faster than 1 under TCG)")
    ap.add_argument("--mem", type=int, default=1024, metavar="MB", help="guest memory")
    ap.add_argument("--sequential", action="store_true",
                    help="one file system after the other instead of in parallel")
    ap.add_argument("--progress", type=float, default=60, metavar="S",
                    help="seconds between progress lines (default 60)")
    ap.add_argument(LOCKS_OFF_FLAG, dest="locks_off", action="store_true",
                    help="start the servers without byte-range locks (must fail)")
    ap.add_argument("--stop-after-torn", type=int, default=0, metavar="K",
                    help="stop a file system's run after K torn reads (0: never)")
    ap.add_argument("--json", type=Path, help="also write the result object here")
    ap.add_argument("--console", type=Path, help="keep the whole guest console here")
    ap.add_argument("--no-build", action="store_true",
                    help="use target/release/sluice as it is (no cargo build)")
    a = ap.parse_args(argv)
    a.fs = [f for f in a.fs.split(",") if f]
    bad = [f for f in a.fs if f not in fsmod.MKFS]
    if bad or not a.fs or len(set(a.fs)) != len(a.fs):
        ap.error(f"--fs: choose distinct ones of {', '.join(fsmod.MKFS)}")
    if min(a.reads, a.blocks, a.writers, a.readers, a.smp, a.prealloc_chunk) < 1 \
            or a.seconds <= 0 or a.progress <= 0 or a.stop_after_torn < 0:
        ap.error("counts, sizes and durations must be positive")
    return a


def build(no_build: bool) -> None:
    if not no_build:
        log("building sluice (cargo build --release)")
        run(["cargo", "build", "--release", "--quiet", "-p", "sluice"], cwd=REPO, timeout=3600)
    if not BINARY.exists():
        raise RuntimeError(f"{BINARY.relative_to(REPO)} is missing")
    TOOL.parent.mkdir(parents=True, exist_ok=True)
    run(["gcc", "-static", "-O2", "-Wall", "-pthread", "-o", str(TOOL), str(TOOL_SRC)])


def guest_script(a) -> str:
    return GUEST.replace("@FS@", " ".join(a.fs))


def guest_env(a, servers: dict) -> dict:
    env = {
        "SERVER": sluicevm.HOST_FROM_GUEST, "TORNREAD": str(TOOL),
        "BLOCKS": a.blocks, "WRITERS": a.writers, "READERS": a.readers,
        "READS": a.reads, "SECONDS": a.seconds, "PROGRESS": a.progress,
        "STOP": a.stop_after_torn, "SEQUENTIAL": int(a.sequential),
    }
    for name, server in servers.items():
        env[f"PORT_{name}"] = server.port
    return {k: str(v) for k, v in env.items()}


class Console:
    """The guest console, line by line (sluicevm.run writes whole lines):
    turns progress lines into log lines with rates, collects results and
    mountstats, echoes other script output, optionally keeps everything."""

    def __init__(self, a, keep: Path | None):
        self.a = a
        self.keep = open(keep, "w") if keep else None
        self.tail: list[str] = []
        self.in_script = False
        self.in_stats = False
        self.stats_lines: list[str] = []
        self.results: dict[str, dict] = {}
        self.exits: dict[str, int] = {}
        self.last: dict[str, tuple[float, int]] = {}  # fs -> (t, checked) at last line
        self.latest: dict[str, dict] = {}

    def write(self, text: str) -> None:
        if self.keep:
            self.keep.write(text)
        for line in text.splitlines():
            self.line(line)

    def flush(self) -> None:
        if self.keep:
            self.keep.flush()

    def close(self) -> None:
        if self.keep:
            self.keep.close()
            self.keep = None

    def line(self, line: str) -> None:
        self.tail = (self.tail + [line])[-80:]
        if line.startswith(sluicevm.BANNER_BEGIN):
            self.in_script = True
            log("guest booted; script running")
            return
        if sluicevm.BANNER_END_RE.search(line):
            self.in_script = False
            return
        if not self.in_script:
            return
        if line == "== mountstats":
            self.in_stats = True
            return
        if line == "== end mountstats":
            self.in_stats = False
            return
        if self.in_stats:
            self.stats_lines.append(line)
            return
        m = PROGRESS_RE.match(line)
        if m:
            self.progress(m.group(1), float(m.group(2)), *map(int, m.groups()[2:]))
            return
        if RESULT_RE.match(line):
            r = json.loads(line)
            fs = r["file"].split("/")[2]
            self.results[fs] = r
            log(f"{fs}: done: {r['checked_reads']:,} checked, {r['torn_reads']:,} torn, "
                f"{r['writes']:,} writes in {fmt_duration(r['seconds'])}, "
                f"{r['reads_per_s']:.0f} reads/s")
            return
        m = re.match(r"^tornread-exit (\w+) (\d+)$", line)
        if m:
            self.exits[m.group(1)] = int(m.group(2))
            return
        if line.startswith("checked "):
            return  # the human summary of a JSON line we report ourselves
        log(f"guest: {line}")

    def progress(self, fs: str, t: float, checked: int, torn: int, writes: int) -> None:
        t0, c0 = self.last.get(fs, (0.0, 0))
        self.last[fs] = (t, checked)
        self.latest[fs] = {"seconds": t, "checked_reads": checked, "torn_reads": torn,
                           "writes": writes}
        rate = (checked - c0) / max(t - t0, 1e-9)
        avg = checked / max(t, 1e-9)
        left = max(self.a.reads - checked, 0)
        eta = f", ~{fmt_duration(left / avg)} left" if avg > 0 and left else ""
        log(f"{fs}: {fmt_duration(t)}: {checked:,} checked ({100 * checked / self.a.reads:.1f}%), "
            f"{torn} torn, {writes:,} writes; {rate:.0f} reads/s now, {avg:.0f} average{eta}")

    def mountstats(self) -> dict[str, dict[str, int]]:
        """{fs: {"READ": n, "READ_PLUS": n, "WRITE": n, ...}} per mount."""
        out: dict[str, dict[str, int]] = {}
        cur = None
        for line in self.stats_lines:
            m = re.match(r"^device \S+ mounted on /mnt/(\w+) with fstype nfs", line)
            if m:
                cur = out.setdefault(m.group(1), {})
                continue
            if line.startswith("device "):
                cur = None
                continue
            m = re.match(r"^\s+(READ|READ_PLUS|WRITE|COMMIT):\s+(\d+)", line)
            if m and cur is not None:
                cur[m.group(1)] = int(m.group(2))
        return out


def check_host_file(path: Path, blocks: int) -> tuple[bool, int]:
    """(every block consistent, blocks rewritten at least once) of the file
    the writers left on the server's file system."""
    data = path.read_bytes()
    if len(data) != blocks * tr.BLOCK:
        return False, 0
    ok, rewritten = True, 0
    for b in range(blocks):
        block = data[b * tr.BLOCK:(b + 1) * tr.BLOCK]
        if tr.check_block(block, b) is not None:
            ok = False
        else:
            rewritten += tr._HDR.unpack_from(block, 0)[3] > 0
    return ok, rewritten


def watch_servers(servers: dict, stop: threading.Event) -> None:
    """A server that dies would leave the guest's hard mounts hanging until
    the timeout: interrupt the run instead (Teardown turns SIGTERM into an
    exception in the main thread, and sluicevm.run then stops QEMU)."""
    while not stop.wait(2):
        for name, s in servers.items():
            if not s.alive():
                log(f"sluice for {name} exited ({s.proc.returncode}); log tail:\n{s.log_tail()}")
                os.kill(os.getpid(), signal.SIGTERM)
                return


def table(rows: list[dict]) -> str:
    head = ["file system", "kernel", "range locks", "checked reads", "torn reads", "writes",
            "seconds", "reads/s", "writes/s", "READ RPCs", "WRITE RPCs", "server file"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["fs"], r["kernel"], "off" if r["locks_off"] else "on",
            f"{r['checked_reads']:,}", f"{r['torn_reads']:,}", f"{r['writes']:,}",
            f"{r['seconds']:.0f}", f"{r['reads_per_s']:.0f}", f"{r['writes_per_s']:.0f}",
            f"{r['read_rpcs']:,}", f"{r['write_rpcs']:,}",
            "consistent" if r["server_file_ok"] else "DAMAGED",
        ]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    if not is_root():
        print("bench/torn_kernel.py: run as root (loop devices, mounts)", file=sys.stderr)
        return 2
    if not fsmod.loop_devices_available():
        print("bench/torn_kernel.py: no loop devices here", file=sys.stderr)
        return 2
    build(a.no_build)
    started = time.time()
    console = Console(a, a.console)
    stop_watch = threading.Event()
    rows: list[dict] = []
    errors: list[str] = []
    interrupted = False
    kernel = sluicevm.fetch_kernel(a.kernel)
    try:
        with Teardown("torn_kernel") as td:
            scratch = fsmod.make_scratch(td)
            servers: dict[str, Sluice] = {}
            files: dict[str, Path] = {}
            for name in a.fs:
                sub = scratch / name
                sub.mkdir()
                tfs = fsmod.create_loop_fs(name, sub, a.blocks * tr.BLOCK, td)
                fname = f"torn-{name}.dat"
                tr.preallocate_host(str(tfs.mountpoint), fname, a.blocks, a.prealloc_chunk)
                files[name] = tfs.mountpoint / fname
                server = Sluice(BINARY, tfs.mountpoint, sub, name=f"sluice-{name}",
                                extra_args=[LOCKS_OFF_FLAG] if a.locks_off else [])
                server.start(td)
                servers[name] = server
            script = scratch / "guest.sh"
            script.write_text(guest_script(a))
            watcher = threading.Thread(target=watch_servers, args=(servers, stop_watch),
                                       daemon=True)
            watcher.start()
            td.push("stop the server watch", stop_watch.set)
            per_fs = a.seconds + 120
            timeout = 600 + per_fs * (len(a.fs) if a.sequential else 1)
            log(f"booting Linux {kernel.release} ({a.smp} vCPU) for {len(a.fs)} file systems "
                f"({'sequential' if a.sequential else 'parallel'}): {a.reads:,} reads each, "
                f"{a.blocks} blocks, {a.writers} writers, {a.readers} readers"
                f"{', range locks OFF' if a.locks_off else ''}")
            rc = sluicevm.run(a.kernel, script, guest_env(a, servers), [str(TOOL)], a.mem,
                              timeout, out=console, smp=a.smp)
            stop_watch.set()
            if rc != 0:
                errors.append(f"guest script exit status {rc}")
            stats = console.mountstats()
            for name in a.fs:
                r = console.results.get(name)
                if r is None:
                    errors.append(f"{name}: no result from the guest")
                    partial = console.latest.get(name)
                    if partial is None:
                        continue
                    # Report what the last progress line counted.
                    r = {**partial, "errors": 1,
                         "reads_per_s": partial["checked_reads"] / max(partial["seconds"], 1e-9),
                         "writes_per_s": partial["writes"] / max(partial["seconds"], 1e-9)}
                elif r["errors"]:
                    errors.append(f"{name}: tornread reported {r['errors']} I/O errors")
                if not servers[name].alive():
                    errors.append(f"{name}: sluice exited")
                ok, rewritten = check_host_file(files[name], a.blocks)
                st = stats.get(name, {})
                rows.append({
                    "fs": name, "kernel": kernel.release, "locks_off": a.locks_off,
                    "checked_reads": r["checked_reads"], "torn_reads": r["torn_reads"],
                    "writes": r["writes"], "seconds": r["seconds"],
                    "reads_per_s": r["reads_per_s"], "writes_per_s": r["writes_per_s"],
                    "read_rpcs": st.get("READ", 0) + st.get("READ_PLUS", 0),
                    "write_rpcs": st.get("WRITE", 0), "mountstats": st,
                    "server_file_ok": ok, "blocks_rewritten": rewritten,
                    "guest_exit": console.exits.get(name),
                })
                if not ok and not a.locks_off:
                    errors.append(f"{name}: the file on the server is not consistent")
                # O_DIRECT: every checked read and write must have been an RPC.
                if r is console.results.get(name) and (
                        rows[-1]["read_rpcs"] < r["checked_reads"]
                        or rows[-1]["write_rpcs"] < r["writes"]):
                    errors.append(f"{name}: fewer RPCs than reads or writes: {st}")
    except KeyboardInterrupt:
        interrupted = True
        errors.append("interrupted")
    except Interrupted as e:  # SIGTERM or SIGHUP, or a server exited
        interrupted = True
        errors.append(f"interrupted: {e}")
    except Exception as e:  # noqa: BLE001 - reported below, after teardown
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        stop_watch.set()
        console.close()
    if errors and console.tail and not interrupted:
        log("last guest console lines:\n" + "\n".join(console.tail[-40:]))
    if not rows:
        for name, p in console.latest.items():
            log(f"{name}: last progress line: {p['checked_reads']:,} checked, "
                f"{p['torn_reads']} torn, {p['writes']:,} writes in {fmt_duration(p['seconds'])}")
    result = {
        "tool": "torn_kernel.py", "kernel": kernel.release, "smp": a.smp,
        "parallel": not a.sequential, "blocks": a.blocks, "writers": a.writers,
        "readers": a.readers, "reads_target": a.reads, "locks_off": a.locks_off,
        "wall_seconds": round(time.time() - started, 1), "rows": rows, "errors": errors,
    }
    if rows:
        print(table(rows))
    print(f"wall time {fmt_duration(result['wall_seconds'])}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    if errors:
        return 2
    return 1 if any(r["torn_reads"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
