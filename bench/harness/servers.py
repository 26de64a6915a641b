"""The two servers under test, both on 127.0.0.1 (or, with `--wire`, in the
rate-limited network namespace) and exporting the same directory as their
NFSv4 root: sluice and nfs-ganesha (VFS backend). For NFSv3 both export it
too (MOUNT v3 gives its handle); nfs-ganesha then registers with rpcbind,
which the harness starts for the run if none is running (`Rpcbind`)."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time
from pathlib import Path

from .fs import RPCBIND_PID
from .util import Teardown, log, run, wait_until
from .wire import Link

READY_TIMEOUT = 60
LOOPBACK = "127.0.0.1"


class Server:
    """A server process we started, in its own session so that Ctrl-C in the
    terminal reaches only the harness, which then stops it in order. With a
    `link` it runs in the link's network namespace and listens there."""

    name = "server"
    # NFSv3: the path MOUNT v3 MNT takes for the export's root, and the
    # MOUNT port (None: the NFS port).
    mount_path = "/"
    mount_port: int | None = None

    def __init__(self, link: Link | None = None):
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path: Path | None = None
        self.link = link
        self.host = link.server_addr if link else LOOPBACK

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self, argv: list[str]) -> list[str]:
        return self.link.command(argv) if self.link else argv

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def disk_read_bytes(self) -> int | None:
        """Bytes the server process has read from storage so far
        (read_bytes of /proc/PID/io), or None when it cannot be read."""
        try:
            text = Path(f"/proc/{self.proc.pid}/io").read_text()
        except (OSError, AttributeError):
            return None
        for line in text.splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split(":", 1)[1])
        return None

    def drop_caches(self) -> None:
        """Empty the server's own data cache, if it keeps one."""

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited ({self.proc.returncode if self.proc else '-'}); log:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError):
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 15 s; only our own PID."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log(f"{self.name} (pid {self.proc.pid}) ignored SIGTERM; killing it")
            self.proc.kill()
            self.proc.wait()


class Sluice(Server):
    """sluice serves NFSv4, NFSv3 and MOUNT on one port; MNT of "/" (its
    NFSv4 root) gives the export's root."""

    name = "sluice"

    def drop_caches(self) -> None:
        """Empty sluice's read cache (SIGUSR1) and wait until its log says so
        (where new huge pages are slow to come by, sluice first turns the
        ordinary memory it keeps for reuse into huge pages: seconds per
        gigabyte, before anything is measured)."""
        if not self.alive():
            return
        mark = "read cache dropped"
        seen = self._log_text().count(mark)
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 120
        while self._log_text().count(mark) <= seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not drop its read cache on SIGUSR1; log:\n{self.log_tail()}")
            time.sleep(0.01)

    def _log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def __init__(
        self,
        binary: Path,
        export: Path,
        workdir: Path,
        name: str = "sluice",
        extra_args=(),
        link: Link | None = None,
    ):
        super().__init__(link)
        self.binary, self.export, self.workdir = binary, export, workdir
        self.name, self.extra_args = name, list(extra_args)
        # The benchmark's clients work as root: --no-root-squash (builds
        # from before root was squashed by default do not know the flag,
        # and squash no one).
        usage = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True).stdout
        if "--no-root-squash" in usage:
            self.extra_args.insert(0, "--no-root-squash")

    def start(self, teardown: Teardown) -> None:
        state = self.workdir / f"{self.name}-state"
        state.mkdir(exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.command(
                    [
                        str(self.binary),
                        "serve",
                        str(self.export),
                        "--listen",
                        f"{self.host}:0",
                        "--state-dir",
                        str(state),
                        *self.extra_args,
                    ]
                ),
                stdout=subprocess.PIPE,
                stderr=logf,
                start_new_session=True,
            )
        teardown.push(f"stop {self.name} (pid {self.proc.pid})", self.stop)
        # Readiness: the server prints "listening on ADDR:PORT" once bound.
        line = _read_line(self.proc.stdout, READY_TIMEOUT)
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"{self.name} did not start (printed {line!r}); log:\n{self.log_tail()}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        log(f"{self.name} (pid {self.proc.pid}) serves {self.export} on {self.address} {' '.join(self.extra_args)}")


GANESHA_CONFIG = """\
# Generated by bench/run: one NFSv4{v3_what} VFS export of {export} as the
# root of the pseudo file system, on {address} only, without grace period.
NFS_CORE_PARAM {{
    Protocols = {protocols};
    Bind_Addr = {host};
    NFS_Port = {port};{mnt_port}
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSv4 {{
    Graceless = true;
    Minor_Versions = 1, 2;
    Delegations = false;
    Only_Numeric_Owners = true;
}}
EXPORT {{
    Export_Id = 77;
    Path = {export};
    Pseudo = /;
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = {protocols};
    Transports = TCP;
    SecType = sys;
    MaxRead = 1048576;
    MaxWrite = 1048576;
    FSAL {{
        Name = VFS;
    }}
}}
LOG {{
    Default_Log_Level = EVENT;
}}
"""


class Ganesha(Server):
    """nfs-ganesha; with `v3` it also serves NFSv3, and MOUNT on a port of
    its own (`mount_port`), where MNT takes the export's directory path. It
    will not start NFSv3 unless it can register with rpcbind."""

    name = "ganesha"

    def __init__(self, export: Path, workdir: Path, link: Link | None = None, v3: bool = False):
        super().__init__(link)
        self.export, self.workdir, self.v3 = export, workdir, v3
        self.mount_path = str(export)

    def start(self, teardown: Teardown) -> None:
        self.port = free_port()
        if self.v3:
            self.mount_port = free_port()
            while self.mount_port == self.port:
                self.mount_port = free_port()
        config = self.workdir / "ganesha.conf"
        config.write_text(
            GANESHA_CONFIG.format(
                export=self.export,
                address=self.address,
                host=self.host,
                port=self.port,
                protocols="3, 4" if self.v3 else "4",
                v3_what=" and NFSv3" if self.v3 else "",
                mnt_port=f"\n    MNT_Port = {self.mount_port};" if self.v3 else "",
            )
        )
        self.log_path = self.workdir / "ganesha.log"
        self.proc = subprocess.Popen(
            self.command(
                [
                    "ganesha.nfsd",
                    "-F",
                    "-f",
                    str(config),
                    "-L",
                    str(self.log_path),
                    "-p",
                    str(self.workdir / "ganesha.pid"),
                    "-N",
                    "NIV_EVENT",
                ]
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        teardown.push(f"stop nfs-ganesha (pid {self.proc.pid})", self.stop)

        # Readiness: the log says the server is initialised and the port
        # accepts connections. Its complaints about rpcbind, D-Bus and
        # Kerberos (none here) are harmless.
        def ready() -> bool:
            if not self.alive():
                return True
            return (
                "NFS SERVER INITIALIZED" in self._log_text()
                and port_open(self.host, self.port)
                and (self.mount_port is None or port_open(self.host, self.mount_port))
            )

        if not wait_until(ready, READY_TIMEOUT) or not self.alive():
            self.stop()
            raise RuntimeError(f"nfs-ganesha did not start; log:\n{self.log_tail()}")
        bad = [
            line
            for line in self._log_text().splitlines()
            if "CONFIG" in line and ("rror" in line or "nknown" in line)
        ]
        if bad:
            log("nfs-ganesha config warnings: " + " | ".join(bad[:3]))
        mount = f", MOUNT on port {self.mount_port}" if self.v3 else ""
        log(f"nfs-ganesha (pid {self.proc.pid}) serves {self.export} on {self.address}{mount}")

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def version() -> str:
        out = run(["ganesha.nfsd", "-v"], check=False)
        text = (out.stdout + out.stderr).strip().splitlines()
        pkg = run(["dpkg-query", "-W", "-f=${Version}", "nfs-ganesha"], check=False).stdout.strip()
        return f"{text[0] if text else 'unknown'} (Debian {pkg or '?'})"


RPCBIND_PORT = 111


class Rpcbind:
    """rpcbind for nfs-ganesha's NFSv3 (it registers NFS and MOUNT there, and
    will not start NFSv3 otherwise). One already running is used and left
    alone; else one is started in the foreground for the run and stopped
    by its PID at teardown. Servers in the `--wire` namespace reach it
    through its Unix socket, which the namespace shares."""

    def __init__(self, workdir: Path):
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / "rpcbind.log"
        # For `bench/run --clean-stale` after a run killed outright.
        self.pid_path = workdir / RPCBIND_PID

    def describe(self) -> dict:
        """For the environment: whether the run started rpcbind, and its PID."""
        if self.proc is None:
            return {"started_by_bench": False, "note": "already running; used as it is"}
        return {"started_by_bench": True, "pid": self.proc.pid, "command": "rpcbind -f", "stopped": "at the end"}

    def start(self, teardown: Teardown) -> None:
        if port_open(LOOPBACK, RPCBIND_PORT):
            log("rpcbind is already running: nfs-ganesha registers NFSv3 there")
            return
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                ["rpcbind", "-f"],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        teardown.push(f"stop rpcbind (pid {self.proc.pid})", self.stop)
        self.pid_path.write_text(f"{self.proc.pid}\n")
        if not wait_until(lambda: self.proc.poll() is not None or port_open(LOOPBACK, RPCBIND_PORT), 10):
            self.stop()
            raise RuntimeError("rpcbind did not start listening on port 111 within 10 s")
        if self.proc.poll() is not None:
            err = self.log_path.read_text(errors="replace").strip()
            raise RuntimeError(f"rpcbind exited ({self.proc.returncode}): {err[-500:]}")
        log(f"rpcbind (pid {self.proc.pid}) started for nfs-ganesha's NFSv3")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 10 s; only our own PID."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log(f"rpcbind (pid {self.proc.pid}) ignored SIGTERM; killing it")
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    """A port free on the host's loopback (in a fresh namespace every port is)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _read_line(stream, timeout: float) -> str:
    """One line from a pipe, or '' if none arrives in time."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            break
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    sel.close()
    return buf.decode(errors="replace")
