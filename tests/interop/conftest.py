"""Shared fixtures for interop tests: build and run the real `sluice` binary."""

import contextlib
import fcntl
import os
import tempfile
import time
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BINARY = REPO / "target" / "release" / "sluice"


@contextlib.contextmanager
def port_111_held():
    """Port 111 on 127.0.0.1 for the caller alone among the tests, waiting
    while another test holds it. scripts/test runs two pytest processes
    side by side, and two kinds of tests listen there: the guest tests
    with NFSv3 locking (the server's portmapper, see GuestNsm in
    test_linux_client.py) and the bench smoke test (bench/run's rpcbind
    for nfs-ganesha's NFSv3)."""
    with open(Path(tempfile.gettempdir()) / "sluice-tests-port-111.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make_ext4(image: Path, size: int, *options: str):
    """A new ext4 file system of `size` bytes in the file `image`, made
    with mkfs.ext4 and `options`."""
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", *options, str(image)], check=True)


class LoopMount:
    """The file system in `image` on a loop device, mounted on `mnt` (an
    existing directory) with mount `options` (as `-o` takes them) until
    close()."""

    def __init__(self, image: Path, mnt: Path, options: str = ""):
        self.mnt = mnt
        self.device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                                     capture_output=True, text=True).stdout.strip()
        try:
            subprocess.run(["mount", *(["-o", options] if options else []), self.device, str(mnt)], check=True)
        except BaseException:
            subprocess.run(["losetup", "--detach", self.device], check=True)
            raise

    def close(self):
        subprocess.run(["umount", str(self.mnt)], check=True)
        subprocess.run(["losetup", "--detach", self.device], check=True)


def build_binary() -> Path:
    """Build the release binary once per session (cargo is a no-op when fresh)."""
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "sluice", "-p", "sluice-load"],
        cwd=REPO,
        check=True,
    )
    return BINARY


class SluiceServer:
    """One `sluice serve` process on 127.0.0.1, restartable on the same port.

    Tests act as root on the export, so root is not squashed unless a test
    asks for the server's default (`root_squash=True`)."""

    def __init__(self, binary: Path, export: Path, state: Path, extra_args=(), root_squash: bool = False):
        self.binary = binary
        self.export = export
        self.state = state
        self.extra_args = list(extra_args)
        if not root_squash:
            self.extra_args.insert(0, "--no-root-squash")
        self.port = 0
        self.proc = None
        self.log_path = state / "server.log"

    def start(self):
        listen = f"127.0.0.1:{self.port}"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "serve",
                str(self.export),
                "--listen",
                listen,
                "--state-dir",
                str(self.state),
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        log.close()
        # The server prints exactly one line "listening on ADDR:PORT" once the
        # socket is bound; reading it is the readiness signal.
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(
                f"sluice did not start (got {line!r}); log:\n{self.log_path.read_text()}"
            )
        self.port = int(line.strip().rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig=signal.SIGKILL):
        """Stop (by default abruptly, like a crash) and start on the same port."""
        self.stop(sig)
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class MetricsServer(SluiceServer):
    """A SluiceServer with its metrics endpoint on a free port: the
    `metrics on ADDR:PORT` line after `listening on` is read at every
    start."""

    def __init__(self, binary: Path, export: Path, state: Path, extra_args=(), root_squash: bool = False):
        super().__init__(binary, export, state, ["--metrics", "127.0.0.1:0", *extra_args], root_squash)
        self.metrics_port = 0

    def start(self):
        super().start()
        line = self.proc.stdout.readline().decode()
        if not line.startswith("metrics on "):
            self.proc.kill()
            raise RuntimeError(f"no 'metrics on' line after 'listening on' (got {line!r})")
        self.metrics_port = int(line.strip().rsplit(":", 1)[1])

    def page(self) -> str:
        """The metrics page, checked to be OpenMetrics text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            ctype = r.headers.get("Content-Type", "")
            text = r.read().decode()
        assert ctype.startswith("application/openmetrics-text"), f"Content-Type {ctype!r}"
        assert text.endswith("# EOF\n"), "the OpenMetrics page does not end with # EOF"
        return text

    def counter(self, name: str) -> float:
        """The value of counter `name` (its `_total` sample; 0 when absent)."""
        return self.metrics().get(name + "_total", 0.0)

    def wait_counter(self, name: str, want: float, deadline: float = 10.0) -> bool:
        """Whether counter `name` reaches `want` within `deadline` seconds."""
        end = time.monotonic() + deadline
        while self.counter(name) < want:
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def metrics(self) -> dict[str, float]:
        """{"name" or "name{labels}": value} of every sample on the page."""
        out = {}
        for line in self.page().splitlines():
            if line.strip() and not line.startswith("#"):
                name, value = line.rsplit(None, 1)
                out[name] = float(value)
        return out


@pytest.fixture(scope="session")
def sluice_binary() -> Path:
    return build_binary()


@pytest.fixture
def sluice_server(sluice_binary, tmp_path):
    export = tmp_path / "export"
    state = tmp_path / "state"
    export.mkdir()
    state.mkdir()
    server = SluiceServer(sluice_binary, export, state)
    server.start()
    yield server
    assert server.alive(), f"sluice died during the test; log:\n{server.log_path.read_text()}"
    server.stop()


class SluiceFactory:
    """Starts `sluice serve` processes with extra arguments for one test:
    `factory(*extra_args, name="srv")` gives a started SluiceServer whose
    export and state directories are tmp_path/name/{export,state}. The
    server runs with exactly these arguments besides the export, --listen
    and --state-dir (so with the server's own defaults, root squashing
    included, unless `root_squash=False`); with `metrics=True` it is a
    MetricsServer. Every server is checked to be alive and stopped when the
    test ends."""

    def __init__(self, binary: Path, base: Path):
        self.binary = binary
        self.base = base
        self.servers: list[SluiceServer] = []

    def __call__(self, *extra_args, name: str = "srv", metrics: bool = False, root_squash: bool = True) -> SluiceServer:
        export = self.base / name / "export"
        state = self.base / name / "state"
        export.mkdir(parents=True)
        state.mkdir(parents=True)
        kind = MetricsServer if metrics else SluiceServer
        server = kind(self.binary, export, state, [str(a) for a in extra_args], root_squash=root_squash)
        server.start()
        self.servers.append(server)
        return server


@pytest.fixture
def sluice_factory(sluice_binary, tmp_path):
    """A SluiceFactory for one test."""
    factory = SluiceFactory(sluice_binary, tmp_path)
    yield factory
    dead = [s for s in factory.servers if s.proc is not None and not s.alive()]
    for s in factory.servers:
        s.stop()
    assert not dead, "sluice died during the test; log:\n" + "\n".join(s.log_path.read_text(errors="replace") for s in dead)


def pytest_configure(config):
    # scripts/test runs the tests marked `guest` and the others in two
    # pytest processes side by side (see there).
    config.addinivalue_line("markers", "guest: boots a Linux guest (tests/vm) to run a real client")
    config.addinivalue_line("markers", "direct: run test_write_durability's server with direct writes (--direct-write-min 256K)")
    config.addinivalue_line("markers", "behind: run test_write_durability's server with write-behind (--write-behind-min 256K)")
