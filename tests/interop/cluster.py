"""Helpers for cluster tests: an etcd of one member, TCP proxies that stand
in for a floating address or a network cut, and sluice nodes.

etcd comes from Debian's etcd-server package (scripts/setup installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import MetricsServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOOLS = Path(__file__).resolve().parents[2] / "target" / "test-tools" / "etcd" / "usr" / "bin"


def etcd_tool(name: str) -> str:
    """etcd or etcdctl: on PATH, or unpacked by scripts/setup."""
    path = shutil.which(name) or (str(TOOLS / name) if (TOOLS / name).exists() else None)
    assert path, f"{name} is not installed: scripts/setup fetches it (Debian packages etcd-server, etcd-client)"
    return path


class Etcd:
    """One etcd member on loopback, restartable on its data directory."""

    def __init__(self, base: Path):
        self.dir = base / "etcd"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port, self.peer = free_port(), free_port()
        self.proc = None
        self.log_path = base / "etcd.log"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self):
        log = open(self.log_path, "ab")
        peer = f"http://127.0.0.1:{self.peer}"
        self.proc = subprocess.Popen(
            [
                etcd_tool("etcd"),
                "--name", "t",
                "--data-dir", str(self.dir / "data"),
                "--listen-client-urls", f"http://{self.url}",
                "--advertise-client-urls", f"http://{self.url}",
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"t={peer}",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            r = self.ctl("endpoint", "health", check=False)
            if r.returncode == 0:
                return
            assert self.proc.poll() is None, f"etcd exited; log:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"etcd not healthy in 30 s: {r.stderr}"
            time.sleep(0.1)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def ctl(self, *args, check=True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [etcd_tool("etcdctl"), "--endpoints", self.url, "--dial-timeout", "1s", "--command-timeout", "2s", *args],
            capture_output=True,
            text=True,
            check=check,
            env={**os.environ, "ETCDCTL_API": "3"},
        )

    def keys(self, prefix: str) -> list[str]:
        out = self.ctl("get", "--prefix", "--keys-only", prefix).stdout
        return [k for k in out.splitlines() if k]

    def get(self, key: str) -> str | None:
        lines = self.ctl("get", "--print-value-only", key).stdout.splitlines()
        return lines[0] if lines else None


class Proxy:
    """A TCP port that forwards to a target port: a floating address
    (switch() moves it, dropping the connections it carried, as a moved
    address does) or a cable (cut() breaks every connection and refuses
    new ones until mend())."""

    def __init__(self, target: int):
        self.target = target
        self.cut_off = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.cut_off:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket):
        try:
            while True:
                d = a.recv(1 << 16)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _drop(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def switch(self, target: int):
        self.target = target
        self._drop()

    def cut(self):
        self.cut_off = True
        self._drop()

    def mend(self):
        self.cut_off = False

    def close(self):
        self.closed = True
        self.sock.close()
        self._drop()


class Node(MetricsServer):
    """A sluice node of the cluster `name` in etcd at `etcd_url`."""

    def __init__(self, binary, export, state, etcd_url, node, name="t", extra=()):
        self.node = node
        state.mkdir(parents=True, exist_ok=True)
        super().__init__(
            binary,
            export,
            state,
            ["--cluster", f"etcd://{etcd_url}/{name}", "--node-id", str(node), *[str(a) for a in extra]],
        )

    def in_grace(self) -> bool:
        return self.metrics()["sluice_in_grace"] == 1

    def wait_grace(self, want: bool, deadline: float) -> float:
        """Seconds until the node's grace state is `want`."""
        t0 = time.monotonic()
        while self.in_grace() != want:
            assert self.alive(), f"node {self.node} died; log:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() - t0 < deadline, f"node {self.node}: in_grace != {want} after {deadline} s"
            time.sleep(0.05)
        return time.monotonic() - t0

    def log(self) -> str:
        return self.log_path.read_text()
