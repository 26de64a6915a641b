"""Small helpers shared by the harness: commands, sizes, progress, teardown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_START = time.monotonic()


def log(msg: str) -> None:
    """One progress line on stderr, stamped with the time since start. Never
    raises: a closed stderr (`bench/run 2>&1 | head`) must not stop a
    teardown."""
    try:
        print(f"[{fmt_duration(time.monotonic() - _START):>7}] {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def fmt_duration(secs: float) -> str:
    secs = int(secs)
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def parse_size(text: str) -> int:
    """'64M', '2G', '1048576', '512K' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    scale = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024 * GiB}[m.group(2).lower()]
    return int(m.group(1)) * scale


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def run(
    cmd: list[str], *, check: bool = True, timeout: float | None = None, **kw
) -> subprocess.CompletedProcess:
    """Runs a command, capturing text output; raises CommandError on failure."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise CommandError(cmd, None, f"timed out after {timeout} s") from e
    if check and p.returncode != 0:
        raise CommandError(cmd, p.returncode, (p.stderr or p.stdout).strip())
    return p


class CommandError(RuntimeError):
    def __init__(self, cmd, returncode, output):
        self.cmd, self.returncode, self.output = cmd, returncode, output
        super().__init__(f"{' '.join(map(str, cmd))} failed ({returncode}): {output[-2000:]}")


class Progress:
    """Counts planned measurements and prints each with the elapsed time and
    an estimate of what is left. Each step has a weight (its expected
    seconds); the estimate scales the remaining weight by the pace so far."""

    def __init__(self, total_steps: int, total_weight: float):
        self.total_steps = max(total_steps, 1)
        self.total_weight = total_weight
        self.steps = 0
        self.weight_done = 0.0
        self.started = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def step(self, label: str, weight: float) -> None:
        self.steps += 1
        left = ""
        if self.weight_done > 0:
            pace = self.elapsed / self.weight_done
            left = f", ~{fmt_duration(pace * max(self.total_weight - self.weight_done, 0))} left"
        log(f"({self.steps}/{self.total_steps}{left}) {label}")
        self.weight_done += weight


class Interrupted(Exception):
    """Raised in the main thread when SIGTERM or SIGHUP arrives."""


class Teardown:
    """Undo actions run in reverse order on exit, on an exception, on Ctrl-C
    (SIGINT), SIGTERM and SIGHUP. Use as a context manager.

    Each action is (description, callable). A failing action is reported and
    the others still run. While tearing down, further signals are ignored so
    that a second Ctrl-C cannot leave mounts or loop devices behind.
    """

    def __init__(self, what: str = ""):
        self.what = what
        self._actions: list[tuple[str, Callable[[], None]]] = []
        self._old_handlers = {}

    def push(self, what: str, action: Callable[[], None]) -> None:
        self._actions.append((what, action))

    def run_all(self) -> None:
        ignored = {
            s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            while self._actions:
                what, action = self._actions.pop()
                started = time.monotonic()
                try:
                    action()
                except Exception as e:  # noqa: BLE001 - keep undoing the rest
                    log(f"teardown: {what} failed: {e}")
                took = time.monotonic() - started
                if took >= 2:
                    log(f"teardown: {what} took {took:.0f} s")
        finally:
            for s, h in ignored.items():
                signal.signal(s, h)

    def _raise(self, signum, _frame):
        raise Interrupted(f"got {signal.Signals(signum).name}")

    def __enter__(self):
        # Ctrl-C raises KeyboardInterrupt even where SIGINT was inherited as
        # ignored (a background job of a non-interactive shell).
        self._old_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[s] = signal.signal(s, self._raise)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._actions:
            reason = "" if exc_type is None else f" after {exc_type.__name__}"
            log(f"tearing down {self.what}{reason}".replace("  ", " "))
        self.run_all()
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        return False


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Polls `predicate` until it is true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def is_root() -> bool:
    return os.geteuid() == 0
