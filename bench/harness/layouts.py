"""The test files: the sparse layouts of the READ_PLUS experiment (after the
2020 NFSD READ_PLUS measurements: all data, all hole, and alternating data
and hole segments of 4, 8, 16 and 32 KiB starting with either), and a fully
written file for the streaming and mixed read/write experiments."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .util import KiB, MiB

CHUNK = 4 * MiB


@dataclass(frozen=True)
class Layout:
    name: str
    segment: int  # bytes per data or hole segment; 0 for uniform files
    starts_with_data: bool

    def data_bytes(self, size: int) -> int:
        """Bytes of data (not hole) in a file of `size` bytes."""
        if self.segment == 0:
            return size if self.starts_with_data else 0
        pairs, rest = divmod(size, 2 * self.segment)
        first = min(rest, self.segment)
        if self.starts_with_data:
            return pairs * self.segment + first
        return pairs * self.segment + (rest - first)


LAYOUTS = [Layout("data", 0, True), Layout("hole", 0, False)] + [
    Layout(f"mixed-{k}{'d' if data_first else 'h'}", k * KiB, data_first)
    for k in (4, 8, 16, 32)
    for data_first in (True, False)
]


def _pattern() -> bytes:
    # Random bytes, so that no layer can compress or deduplicate them.
    return os.urandom(CHUNK)


def write_layout(path: Path, layout: Layout, size: int) -> None:
    """Creates `path` with `layout`. The size is set first so that no write
    extends the file: file systems that preallocate past EOF on extending
    writes (xfs) then leave the holes alone."""
    data = _pattern()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        if layout.segment == 0:
            if layout.starts_with_data:
                _fill(fd, 0, size, data)
        else:
            view = memoryview(data)
            seg = layout.segment
            start = 0 if layout.starts_with_data else seg
            for off in range(start, size, 2 * seg):
                n = min(seg, size - off)
                i = off % (CHUNK - seg)
                os.pwrite(fd, view[i : i + n], off)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_full(path: Path, size: int) -> None:
    """A fully written file (every block allocated and on disk)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _fill(fd, 0, size, _pattern())
        os.fsync(fd)
    finally:
        os.close(fd)


def _fill(fd: int, start: int, end: int, data: bytes) -> None:
    off = start
    while off < end:
        off += os.pwrite(fd, data[: min(len(data), end - off)], off)


def measure_layout(path: Path) -> dict:
    """What the file system reports (SEEK_DATA/SEEK_HOLE): data bytes and
    the number of data extents, to check that the holes are real holes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data, extents, off = 0, 0, 0
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole remains
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            data += end - start
            extents += 1
            off = end
        return {"size": size, "data_bytes": data, "data_extents": extents}
    finally:
        os.close(fd)
