"""Interop tests: the independent userspace client `nfs-rs` (PyPI `nfs-rs`) against sluice.

Every test talks to a real `sluice serve` process (fixture `sluice_server`
from conftest.py) and checks each result twice: through nfs-rs and directly on
the exported host directory (`server.export`). The tests that take the
`client` fixture run twice: over NFSv4.1, and over NFSv3 (MOUNT on the NFS
port, ``mountport=``); the others over NFSv4.1.

nfs-rs facts these tests rely on (nfs-rs 0.8.7, see nfs_rs/API.md in the wheel):

* URL: ``nfs://HOST/EXPORT?version=4.1&nfsport=PORT&noresvport=true``.
  ``version`` must be exactly "3", "4.0" or "4.1" (no 4.2); ``nfsport`` sets the
  NFS TCP port (``nfs_port=`` keyword is equivalent); ``noresvport=true`` uses an
  unprivileged source port (the default binds a port below 1024).
* Paths are export-relative strings; ``..`` escapes are rejected client-side.
  ``stat(".")`` / ``listdir(".")`` on the export root fail with NFS4ERR_BADNAME
  against both nfs-ganesha and sluice (nfs-rs apparently sends the name "."),
  so the tests work in subdirectories.
* Errors are ``nfs_rs.NfsError`` subclasses with ``code_name`` (e.g.
  "NFS4ERR_NOENT") and ``errno``: NfsNotFoundError (FileNotFoundError),
  NfsAlreadyExistsError (FileExistsError), NfsNotADirectoryError,
  NfsIsADirectoryError, NfsOSError (e.g. NOTEMPTY), NfsProtocolError (others).
* ``open()`` supports rb/wb/ab/r+b/w+b/a+b only; there is no exclusive-create
  mode and ``touch(exist_ok=False)`` raises NotImplementedError client-side, so
  EXCLUSIVE4_1 OPEN cannot be driven through nfs-rs. "Create must fail on an
  existing name" is covered with mkdir/symlink/link instead.
* A client does not reconnect after the server process is killed (checked
  against nfs-ganesha too): its calls raise NfsError from then on. The restart
  tests therefore verify with a fresh client, and accept either correct results
  or an NfsError from the old client.
* nfs-rs retries NFS4ERR_GRACE internally, so a server grace period after a
  restart only delays calls (operation_timeout below leaves room for that).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import stat as statmod

import pytest

import nfs_rs
from nfs_rs import (
    Client,
    DirectoryCookie,
    DirectoryRef,
    FileType,
    NfsAlreadyExistsError,
    NfsError,
    NfsIsADirectoryError,
    NfsNotADirectoryError,
    NfsNotFoundError,
    Version,
)

# Path of the export in the server's NFSv4 namespace.
EXPORT_PATH = "/"
# Generous: a server grace period after restart makes nfs-rs wait, not fail.
OPERATION_TIMEOUT = 150
MiB = 1024 * 1024


# ----------------------------------------------------------------------------
# helpers


def nfs_url(server, version: str = "4.1", **query) -> str:
    params = {"version": version, "nfsport": str(server.port), "noresvport": "true"}
    if version == "3":
        params["mountport"] = str(server.port)
    params.update({k: str(v) for k, v in query.items()})
    return f"nfs://127.0.0.1{EXPORT_PATH}?" + "&".join(f"{k}={v}" for k, v in params.items())


def connect(server, version: str = "4.1", **kwargs) -> Client:
    client = Client.connect(
        nfs_url(server, version), connect_timeout=20, operation_timeout=OPERATION_TIMEOUT, **kwargs
    )
    assert client.version is Version(version)
    return client


@pytest.fixture(params=["4.1", "3"], ids=["v4.1", "v3"])
def client(sluice_server, request):
    c = connect(sluice_server, request.param)
    yield c
    c.close()


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def nfs_write(client: Client, path: str, data: bytes, mode: str = "wb") -> None:
    with client.open(path, mode) as f:
        assert f.write(data) == len(data)


def _uncached_retry(err: BaseException | None) -> bool:
    """Whether nfs-rs raised NFS4ERR_RETRY_UNCACHED_REP (see nfs_read)."""
    while err is not None:
        if getattr(err, "code_name", None) == "NFS4ERR_RETRY_UNCACHED_REP" or "retry uncached" in str(err):
            return True
        err = err.__cause__
    return False


def nfs_read(client: Client, path: str) -> bytes:
    """The file's bytes through nfs-rs. nfs-rs 0.8.7 can reuse the
    sequence id of a READ it gave up on (one past the end of a file); the
    server answers the next request on that slot with
    NFS4ERR_RETRY_UNCACHED_REP (RFC 8881 section 2.10.6.1.3; see
    server/state/session.rs), and nfs-rs, which then moves the slot on,
    raises it as a retryable error of a read-only operation. Such a read
    is made again, once; any other error fails the test."""
    try:
        with client.open(path, "rb") as f:
            return f.read()
    except nfs_rs.NfsRetryableError as err:
        if not _uncached_retry(err):
            raise
    with client.open(path, "rb") as f:
        return f.read()


def assert_same(actual: bytes, expected: bytes, what: str) -> None:
    assert len(actual) == len(expected), f"{what}: length {len(actual)} != {len(expected)}"
    if actual != expected:
        first = next(i for i, (a, b) in enumerate(zip(actual, expected)) if a != b)
        pytest.fail(f"{what}: content differs, first difference at byte {first} "
                    f"(sha256 {sha(actual)} != {sha(expected)})")


def expect_error(exc_type, code_names, fn, *args, **kwargs) -> NfsError:
    """Call fn, require exc_type with one of code_names; return the error."""
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    err = info.value
    assert isinstance(err, NfsError)
    if isinstance(code_names, str):
        code_names = {code_names}
    assert v4_name(err.code_name) in code_names, f"{err!r}: code_name {err.code_name!r}, wanted {code_names}"
    return err


def v4_name(code_name: str) -> str:
    """An NFSv3 status name as its NFSv4 namesake (the numbers are the
    same; only ACCES is spelt otherwise), so one expectation covers both."""
    if code_name == "NFS3ERR_ACCES":
        return "NFS4ERR_ACCESS"
    return code_name.replace("NFS3ERR_", "NFS4ERR_", 1)


# ----------------------------------------------------------------------------
# connection


def test_connect_reports_v41_and_sane_limits(sluice_server, client):
    assert nfs_rs.__version__  # the installed client, for the record
    limits = client.io_limits
    assert limits.max_read > 0 and limits.max_write > 0
    info = client.fs_info()
    assert info.max_read > 0 and info.max_write > 0
    assert info.supports_symlinks and info.supports_links
    host = os.statvfs(sluice_server.export)
    fs = client.fs_stat()
    assert fs.total_bytes == host.f_blocks * host.f_frsize
    assert fs.total_files == host.f_files
    assert 0 <= fs.available_bytes <= fs.free_bytes <= fs.total_bytes


# ----------------------------------------------------------------------------
# data: write / read


SIZES = [1, 7, 4095, 4096, 4097, 65536 + 13, MiB - 1, MiB, MiB + 1, 3 * MiB + 517, 8 * MiB]


@pytest.mark.parametrize("size", SIZES)
def test_write_then_read_back(sluice_server, client, size):
    client.mkdir("data")
    payload = rand(size, seed=size)
    nfs_write(client, "data/blob", payload)

    assert_same((sluice_server.export / "data" / "blob").read_bytes(), payload, "host copy")
    assert client.stat("data/blob").size == size
    assert_same(nfs_read(client, "data/blob"), payload, "nfs read")

    # readinto with a buffer larger than the file stops at EOF
    buf = bytearray(size + 4096)
    with client.open("data/blob", "rb") as f:
        assert f.readinto(buf) == size
        assert f.read(1) == b""
    assert_same(bytes(buf[:size]), payload, "readinto")


def test_unaligned_positional_writes_and_reads(sluice_server, client):
    client.mkdir("data")
    model = bytearray()
    rng = random.Random(1234)
    writes = [  # (offset, length): unaligned, overlapping, and one past EOF (hole)
        (0, 10_000), (3, 1), (4093, 9), (9_999, 70_001), (65_535, 2),
        (200_003, 131_071), (150_000, 100_000), (1_000_001, 1_048_579), (17, 4096),
    ]
    with client.open("data/f", "w+b") as f:
        for offset, length in writes:
            chunk = rng.randbytes(length)
            assert f.write_at(chunk, offset) == length
            if len(model) < offset:
                model.extend(b"\0" * (offset - len(model)))
            model[offset:offset + length] = chunk
        assert f.tell() == 0  # positional I/O leaves the cursor alone
        for offset, length in [(0, 1), (1, 4095), (4093, 9), (99_999, 100_003),
                               (1_000_000, 5), (len(model) - 3, 100), (len(model), 10)]:
            assert_same(f.read_at(offset, length), bytes(model[offset:offset + length]),
                        f"read_at({offset}, {length})")
    assert_same((sluice_server.export / "data" / "f").read_bytes(), bytes(model), "host copy")
    assert client.stat("data/f").size == len(model)
    assert_same(nfs_read(client, "data/f"), bytes(model), "nfs read")


def test_many_sequential_writes_in_one_open(sluice_server, client):
    client.mkdir("data")
    rng = random.Random(99)
    pieces = [rng.randbytes(n) for n in (1, 2, 4095, 4097, 65_537, 3, MiB + 3, 511, 2 * MiB - 7)]
    with client.open("data/seq", "wb") as f:
        for piece in pieces:
            assert f.write(piece) == len(piece)
        assert f.tell() == sum(map(len, pieces))
    expected = b"".join(pieces)
    assert_same((sluice_server.export / "data" / "seq").read_bytes(), expected, "host copy")
    # read back in odd-sized sequential chunks
    got = bytearray()
    with client.open("data/seq", "rb") as f:
        while chunk := f.read(333_333):
            got += chunk
    assert_same(bytes(got), expected, "chunked nfs read")


def test_overwrite_in_place_keeps_rest(sluice_server, client):
    client.mkdir("data")
    base = rand(300_000, seed=5)
    nfs_write(client, "data/f", base)
    patch = rand(5000, seed=6)
    with client.open("data/f", "r+b") as f:
        f.seek(123_457)
        assert f.write(patch) == len(patch)
    expected = base[:123_457] + patch + base[123_457 + len(patch):]
    assert_same((sluice_server.export / "data" / "f").read_bytes(), expected, "host copy")
    assert_same(nfs_read(client, "data/f"), expected, "nfs read")


def test_read_file_created_on_host(sluice_server, client):
    d = sluice_server.export / "hostdir"
    d.mkdir()
    big = rand(5 * MiB + 3, seed=77)
    (d / "big.bin").write_bytes(big)
    (d / "small.txt").write_bytes(b"hello from the host\n")
    (d / "empty").write_bytes(b"")

    assert client.stat("hostdir/big.bin").size == len(big)
    assert_same(nfs_read(client, "hostdir/big.bin"), big, "big host file")
    with client.open("hostdir/big.bin", "rb") as f:
        assert_same(f.read_at(4_000_001, 70_000), big[4_000_001:4_070_001], "read_at")
        assert f.read_at(len(big) + 10, 5) == b""
    assert nfs_read(client, "hostdir/small.txt") == b"hello from the host\n"
    assert nfs_read(client, "hostdir/empty") == b""
    assert client.stat("hostdir/empty").size == 0

    # a change made on the host afterwards is what the next read returns
    (d / "small.txt").write_bytes(b"changed on the host")
    assert nfs_read(client, "hostdir/small.txt") == b"changed on the host"
    assert client.stat("hostdir/small.txt").size == len(b"changed on the host")


def test_append(sluice_server, client):
    client.mkdir("data")
    host_file = sluice_server.export / "data" / "log"
    first = rand(10_000, seed=1)
    nfs_write(client, "data/log", first)
    second, third = rand(4097, seed=2), rand(3, seed=3)
    with client.open("data/log", "ab") as f:
        assert f.write(second) == len(second)
        assert f.write(third) == len(third)
    assert_same(host_file.read_bytes(), first + second + third, "after nfs appends")
    # the host appends too; the next append must land after the host's bytes
    with open(host_file, "ab") as hf:
        hf.write(b"HOST")
    with client.open("data/log", "ab") as f:
        f.write(b"NFS")
    expected = first + second + third + b"HOST" + b"NFS"
    assert_same(host_file.read_bytes(), expected, "after host+nfs appends")
    assert_same(nfs_read(client, "data/log"), expected, "nfs read")


def test_open_modes_truncate_or_keep(sluice_server, client):
    client.mkdir("data")
    host_file = sluice_server.export / "data" / "f"
    host_file.write_bytes(b"0123456789")
    # "ab" (create if missing) must not truncate an existing file
    with client.open("data/f", "ab"):
        pass
    assert host_file.read_bytes() == b"0123456789"
    # "r+b" writes in place
    with client.open("data/f", "r+b") as f:
        f.write(b"ab")
    assert host_file.read_bytes() == b"ab23456789"
    # "wb" truncates an existing file
    with client.open("data/f", "wb") as f:
        f.write(b"xyz")
    assert host_file.read_bytes() == b"xyz"
    assert client.stat("data/f").size == 3
    # "rb" does not create
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.open, "data/missing", "rb")
    assert not (sluice_server.export / "data" / "missing").exists()


def test_truncate_down_and_up(sluice_server, client):
    client.mkdir("data")
    host_file = sluice_server.export / "data" / "t"
    payload = rand(100_000, seed=8)
    nfs_write(client, "data/t", payload)

    client.truncate("data/t", 12_345)  # SETATTR size, shrink
    assert host_file.stat().st_size == 12_345
    assert client.stat("data/t").size == 12_345
    assert_same(nfs_read(client, "data/t"), payload[:12_345], "after shrink")

    client.truncate("data/t", 3 * MiB + 1)  # grow: the new tail reads as zeros
    expected = payload[:12_345] + b"\0" * (3 * MiB + 1 - 12_345)
    assert host_file.stat().st_size == 3 * MiB + 1
    assert client.stat("data/t").size == 3 * MiB + 1
    assert_same(host_file.read_bytes(), expected, "host after grow")
    assert_same(nfs_read(client, "data/t"), expected, "nfs after grow")

    with client.open("data/t", "r+b") as f:  # File.truncate on an open file
        assert f.truncate(7) == 7
    assert host_file.read_bytes() == payload[:7]
    client.truncate("data/t", 0)
    assert host_file.read_bytes() == b""
    assert client.stat("data/t").size == 0


def test_concurrent_files_from_two_clients(sluice_server, client):
    """Several opens in flight at once (one session's slots, plus a second client)."""
    import concurrent.futures

    client.mkdir("conc")
    other = connect(sluice_server, client.version.value)
    try:
        jobs = [(client if i % 2 else other, f"conc/f{i}", rand(MiB + i * 4099, seed=100 + i))
                for i in range(8)]

        def roundtrip(job):
            c, path, data = job
            nfs_write(c, path, data)
            return nfs_read(c, path)

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(roundtrip, jobs))
        for (c, path, data), got in zip(jobs, results):
            assert_same(got, data, f"nfs {path}")
            assert_same((sluice_server.export / path).read_bytes(), data, f"host {path}")
        # each client sees what the other wrote
        assert sorted(other.listdir("conc")) == sorted(f"f{i}" for i in range(8))
        assert_same(nfs_read(client, jobs[0][1]), jobs[0][2], "cross-client read")
    finally:
        other.close()


# ----------------------------------------------------------------------------
# namespace


def test_mkdir_nested(sluice_server, client):
    client.mkdir("a/b/c/d/e", parents=True)
    for p in ["a", "a/b", "a/b/c", "a/b/c/d", "a/b/c/d/e"]:
        assert (sluice_server.export / p).is_dir()
        assert client.stat(p).type is FileType.DIRECTORY
    assert client.listdir("a/b/c") == ["d"]
    # the mode sent with CREATE is applied as given (not masked by the server's umask)
    client.mkdir("a/m", 0o707)
    assert statmod.S_IMODE((sluice_server.export / "a" / "m").stat().st_mode) == 0o707
    assert client.stat("a/m").mode & 0o7777 == 0o707
    # nlink of a directory counts its subdirectories
    assert client.stat("a").nlink == (sluice_server.export / "a").stat().st_nlink
    # creating into a missing parent fails and creates nothing
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.mkdir, "nope/x")
    assert not (sluice_server.export / "nope").exists()


def test_create_on_existing_name_fails(sluice_server, client):
    """nfs-rs has no exclusive OPEN; mkdir/symlink/link are exclusive creates."""
    client.mkdir("d")
    nfs_write(client, "d/file", b"keep me")
    expect_error(NfsAlreadyExistsError, "NFS4ERR_EXIST", client.mkdir, "d")
    expect_error(NfsAlreadyExistsError, "NFS4ERR_EXIST", client.mkdir, "d/file")
    expect_error(NfsAlreadyExistsError, "NFS4ERR_EXIST", client.symlink, "elsewhere", "d/file")
    nfs_write(client, "d/other", b"other")
    expect_error(NfsAlreadyExistsError, "NFS4ERR_EXIST", client.link, "d/other", "d/file")
    host = sluice_server.export / "d" / "file"
    assert host.is_file() and not host.is_symlink()
    assert host.read_bytes() == b"keep me"
    assert host.stat().st_nlink == 1
    assert nfs_read(client, "d/file") == b"keep me"


def test_readdir_thousands_of_host_entries(sluice_server, client):
    d = sluice_server.export / "big"
    d.mkdir()
    names = {f"entry-{i:05d}" for i in range(2500)}
    names |= {f"{i:03d}-" + "L" * 240 for i in range(300)}          # long names (243 bytes)
    names |= {f"ünï-çødé-{i}" for i in range(100)}                   # UTF-8 names
    names |= {f"sp ace {i}" for i in range(50)}
    for n in names:
        (d / n).write_bytes(n.encode()[:17])
    for i in range(20):
        sub = f"subdir-{i}"
        (d / sub).mkdir()
        names.add(sub)
    os.symlink("entry-00001", d / "a-symlink")
    names.add("a-symlink")
    assert len(names) > 2900

    listed = client.listdir("big")
    assert len(listed) == len(set(listed)), "duplicate names in READDIR"
    assert "." not in listed and ".." not in listed
    assert set(listed) == names

    entries = list(client.scandir("big"))
    assert {e.name for e in entries} == names
    fileids = [e.info.fileid for e in entries]
    assert len(set(fileids)) == len(fileids), "fileid not unique within the directory"
    for e in entries:
        host = os.lstat(d / e.name)
        assert e.path == f"big/{e.name}"
        if statmod.S_ISDIR(host.st_mode):
            assert e.info.type is FileType.DIRECTORY, e.name
        elif statmod.S_ISLNK(host.st_mode):
            assert e.info.type is FileType.SYMLINK, e.name
        else:
            assert e.info.type is FileType.FILE, e.name
            assert e.info.size == host.st_size, e.name
        assert e.info.mode & 0o7777 == statmod.S_IMODE(host.st_mode), e.name


def test_readdir_small_pages_resume(sluice_server):
    """Force many READDIR round trips; cookies must advance and never repeat."""
    d = sluice_server.export / "paged"
    d.mkdir()
    names = {f"n{i:04d}-{'x' * (i % 50)}" for i in range(1500)}
    for n in names:
        (d / n).touch()
    c = connect(sluice_server, readdir_buffer=(1024, 4096))
    try:
        seen, cookies, page_ends = [], set(), []
        position = DirectoryCookie()
        while True:
            page = c.scandir_page("paged", position)
            assert len(page_ends) < 5000, "READDIR never reached EOF"
            seen.extend(e.name for e in page.entries)
            page_ends.append((len(seen), page.next))
            if page.eof:
                break
            assert page.entries, "empty READDIR page before EOF"
            assert page.next.cookie not in cookies, "cookie repeated"
            cookies.add(page.next.cookie)
            position = page.next
        assert len(page_ends) > 2, f"expected several pages with a 4 KiB maxcount, got {len(page_ends)}"
        assert len(seen) == len(set(seen)), "duplicate names across pages"
        assert set(seen) == names
    finally:
        c.close()

    # a position saved mid-listing resumes on another, new client
    done, saved = page_ends[1]
    c = connect(sluice_server, readdir_buffer=(1024, 4096))
    try:
        rest, position = [], saved
        for _ in range(5000):
            page = c.scandir_page("paged", position)
            rest.extend(e.name for e in page.entries)
            if page.eof:
                break
            position = page.next
        else:
            pytest.fail("resumed READDIR never reached EOF")
        assert sorted(rest) == sorted(seen[done:])
    finally:
        c.close()


def test_rename_across_directories(sluice_server, client):
    ex = sluice_server.export
    client.mkdir("src/inner", parents=True)
    client.mkdir("dst")
    payload = rand(70_000, seed=4)
    nfs_write(client, "src/file", payload)
    ino = (ex / "src" / "file").stat().st_ino
    fileid = client.stat("src/file").fileid

    client.rename("src/file", "dst/renamed")
    assert not (ex / "src" / "file").exists()
    assert (ex / "dst" / "renamed").stat().st_ino == ino
    assert_same((ex / "dst" / "renamed").read_bytes(), payload, "host after rename")
    assert client.stat("dst/renamed").fileid == fileid
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "src/file")
    assert client.listdir("src") == ["inner"]
    assert client.listdir("dst") == ["renamed"]

    # rename over an existing file replaces it
    nfs_write(client, "src/new", b"replacement")
    client.rename("src/new", "dst/renamed")
    assert (ex / "dst" / "renamed").read_bytes() == b"replacement"
    assert nfs_read(client, "dst/renamed") == b"replacement"
    assert sorted(client.listdir("src")) == ["inner"]

    # a directory with contents moves to another directory
    nfs_write(client, "src/inner/x", b"x")
    client.rename("src/inner", "dst/inner2")
    assert (ex / "dst" / "inner2" / "x").read_bytes() == b"x"
    assert not (ex / "src" / "inner").exists()
    assert nfs_read(client, "dst/inner2/x") == b"x"

    # error cases leave everything in place
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.rename, "src/missing", "dst/y")
    client.mkdir("dst/empty")
    expect_error(NfsError, {"NFS4ERR_EXIST", "NFS4ERR_NOTEMPTY"},
                 client.rename, "dst/empty", "dst/inner2")
    assert (ex / "dst" / "inner2" / "x").is_file() and (ex / "dst" / "empty").is_dir()
    expect_error(NfsIsADirectoryError, "NFS4ERR_ISDIR", client.rename, "dst/renamed", "dst/empty")
    expect_error(NfsNotADirectoryError, "NFS4ERR_NOTDIR", client.rename, "dst/empty", "dst/renamed")
    assert (ex / "dst" / "renamed").read_bytes() == b"replacement"


def test_remove_and_rmdir(sluice_server, client):
    ex = sluice_server.export
    client.mkdir("r/sub", parents=True)
    nfs_write(client, "r/sub/f", b"data")
    (ex / "r" / "hostfile").write_bytes(b"h")

    err = expect_error(NfsError, "NFS4ERR_NOTEMPTY", client.rmdir, "r/sub")
    assert err.errno == errno.ENOTEMPTY
    assert (ex / "r" / "sub" / "f").exists()

    client.remove("r/sub/f")
    assert not (ex / "r" / "sub" / "f").exists()
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "r/sub/f")
    client.rmdir("r/sub")
    assert not (ex / "r" / "sub").exists()
    client.remove("r/hostfile")  # a file the server never saw created
    assert not (ex / "r" / "hostfile").exists()
    assert client.listdir("r") == []

    err = expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.remove, "r/gone")
    assert err.errno == errno.ENOENT
    client.remove("r/gone", missing_ok=True)
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.rmdir, "r/gone")
    client.rmdir("r")
    assert not (ex / "r").exists()


def test_symlink_and_readlink(sluice_server, client):
    ex = sluice_server.export
    client.mkdir("s/sub", parents=True)
    nfs_write(client, "s/sub/target", b"pointed at")
    for link, target in [("s/rel", "sub/target"), ("s/abs", "/etc/passwd"),
                         ("s/dangling", "../no/such/thing"), ("s/long", "t" * 1000)]:
        client.symlink(target, link)
        assert os.readlink(ex / link) == target
        assert client.readlink(link) == target
        info = client.stat(link)  # GETATTR of the link itself, not its target
        assert info.type is FileType.SYMLINK
        assert info.size == len(target)
    os.symlink("made on host", ex / "s" / "hostlink")
    assert client.readlink("s/hostlink") == "made on host"
    # READLINK of a non-symlink is an error, not data
    expect_error(NfsError, {"NFS4ERR_INVAL", "NFS4ERR_WRONG_TYPE", "NFS4ERR_ISDIR"},
                 client.readlink, "s/sub")
    expect_error(NfsError, {"NFS4ERR_INVAL", "NFS4ERR_WRONG_TYPE"},
                 client.readlink, "s/sub/target")
    client.remove("s/rel")  # removing the link leaves the target
    assert not os.path.lexists(ex / "s" / "rel")
    assert (ex / "s" / "sub" / "target").read_bytes() == b"pointed at"


def test_server_does_not_follow_symlinks_out_of_export(sluice_server, client):
    ex = sluice_server.export
    (ex / "x").mkdir()
    os.symlink("/etc", ex / "x" / "esc")
    os.symlink("/etc/passwd", ex / "x" / "pw")
    # LOOKUP through a symlink, or OPEN of one, must not reach the host's /etc
    for call in (lambda: client.stat("x/esc/passwd"),
                 lambda: client.open("x/esc/passwd", "rb").read(),
                 lambda: client.open("x/pw", "rb").read(),
                 lambda: client.listdir("x/esc")):
        with pytest.raises(NfsError):
            call()
    assert client.readlink("x/esc") == "/etc"


def test_hard_link(sluice_server, client):
    ex = sluice_server.export
    client.mkdir("h/other", parents=True)
    nfs_write(client, "h/orig", b"first")
    client.link("h/orig", "h/other/alias")
    a, b = ex / "h" / "orig", ex / "h" / "other" / "alias"
    assert a.stat().st_ino == b.stat().st_ino
    assert a.stat().st_nlink == 2
    sa, sb = client.stat("h/orig"), client.stat("h/other/alias")
    assert sa.fileid == sb.fileid
    assert sa.nlink == sb.nlink == 2
    nfs_write(client, "h/other/alias", b"through the alias", mode="r+b")
    assert a.read_bytes() == b"through the alias"
    assert nfs_read(client, "h/orig") == b"through the alias"
    client.remove("h/orig")
    assert b.read_bytes() == b"through the alias"
    assert client.stat("h/other/alias").nlink == 1
    assert b.stat().st_nlink == 1
    client.mkdir("h/dir")
    with pytest.raises(NfsError):  # hard links to directories are refused
        client.link("h/dir", "h/dirlink")
    assert not os.path.lexists(ex / "h" / "dirlink")


def test_setattr_mode_owner_times(sluice_server, client):
    ex = sluice_server.export
    client.mkdir("m/dir", parents=True)
    nfs_write(client, "m/f", b"attrs")
    host = ex / "m" / "f"

    # creating a file reports the same mode on the host and over NFS
    assert client.stat("m/f").mode & 0o7777 == statmod.S_IMODE(host.stat().st_mode)

    for mode in (0o640, 0o600, 0o4711, 0o755):
        client.chmod("m/f", mode)
        assert statmod.S_IMODE(host.stat().st_mode) == mode
        assert client.stat("m/f").mode & 0o7777 == mode
    client.chmod("m/dir", 0o3775)
    assert statmod.S_IMODE((ex / "m" / "dir").stat().st_mode) == 0o3775
    assert client.stat("m/dir").mode & 0o7777 == 0o3775

    if os.geteuid() == 0:  # the server runs as us; only root may give files away
        client.chown("m/f", 1234, 5678)
        assert (host.stat().st_uid, host.stat().st_gid) == (1234, 5678)
        info = client.stat("m/f")
        assert (info.uid, info.gid) == (1234, 5678)
        client.chown("m/f", -1, 4321)  # -1 leaves the uid alone
        assert (host.stat().st_uid, host.stat().st_gid) == (1234, 4321)
        assert (client.stat("m/f").uid, client.stat("m/f").gid) == (1234, 4321)

    atime, mtime = 1_000_000_000_123_456_789, 1_100_000_000_987_654_321
    client.utime("m/f", ns=(atime, mtime))
    st = host.stat()
    assert (st.st_atime_ns, st.st_mtime_ns) == (atime, mtime)
    info = client.stat("m/f")
    assert (info.atime, info.mtime) == (atime, mtime)
    assert info.ctime == st.st_ctime_ns

    # a write moves mtime forward again
    nfs_write(client, "m/f", b"newer", mode="r+b")
    assert host.stat().st_mtime_ns > mtime
    assert client.stat("m/f").mtime == host.stat().st_mtime_ns

    # changes made on the host are what GETATTR reports
    os.chmod(host, 0o604)
    os.utime(host, ns=(2_000_000_000_000_000_001, 1_500_000_000_000_000_002))
    info = client.stat("m/f")
    assert info.mode & 0o7777 == 0o604
    assert (info.atime, info.mtime) == (2_000_000_000_000_000_001, 1_500_000_000_000_000_002)
    assert info.size == host.stat().st_size == 5


def test_lookup_missing_name(sluice_server, client):
    client.mkdir("l")
    nfs_write(client, "l/file", b"f")
    err = expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "l/missing")
    assert isinstance(err, FileNotFoundError)
    assert err.errno == errno.ENOENT
    assert client.exists("l/missing") is False
    assert client.exists("l/file") is True
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "no-such-dir/child")
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.open, "l/missing", "rb")
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.listdir, "l/missing")
    # walking through a regular file is NOTDIR, not NOENT
    err = expect_error(NfsNotADirectoryError, "NFS4ERR_NOTDIR", client.stat, "l/file/child")
    assert err.errno == errno.ENOTDIR
    expect_error(NfsNotADirectoryError, "NFS4ERR_NOTDIR", client.listdir, "l/file")
    if client.version is Version.NFS_V3:
        # NFSv3 has no OPEN: the directory is refused at the first READ.
        def open_and_read(path):
            with client.open(path, "rb") as f:
                f.read()

        expect_error(NfsIsADirectoryError, "NFS4ERR_ISDIR", open_and_read, "l")
    else:
        expect_error(NfsIsADirectoryError, "NFS4ERR_ISDIR", client.open, "l", "rb")


def test_host_side_namespace_changes_are_visible(sluice_server, client):
    """The server must not serve stale lookups after the host changed the tree.

    (nfs-ganesha fails this one: its metadata cache keeps removed names.)
    """
    ex = sluice_server.export
    client.mkdir("v")
    nfs_write(client, "v/file", b"f")
    assert client.stat("v/file").size == 1
    (ex / "v" / "file").unlink()
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "v/file")
    assert client.listdir("v") == []
    (ex / "v" / "file").mkdir()
    assert client.stat("v/file").type is FileType.DIRECTORY
    (ex / "v" / "file").rename(ex / "v" / "moved")
    assert client.listdir("v") == ["moved"]
    expect_error(NfsNotFoundError, "NFS4ERR_NOENT", client.stat, "v/file")


@pytest.mark.skipif(os.geteuid() != 0, reason="the server must run as root to act for other uids")
def test_auth_sys_identity_and_permissions(sluice_server, client):
    """Requests run with the caller's AUTH_SYS uid/gid, and permissions are enforced."""
    ex = sluice_server.export
    client.mkdir("pub", 0o777)
    client.mkdir("priv", 0o755)
    nfs_write(client, "pub/rootfile", b"root's")
    client.chmod("pub/rootfile", 0o644)
    nfs_write(client, "priv/rootonly", b"r")
    user = connect(sluice_server, client.version.value, uid=1000, gid=1000)
    try:
        nfs_write(user, "pub/userfile", b"mine")
        user.mkdir("pub/userdir")
        for name in ("userfile", "userdir"):
            st = (ex / "pub" / name).stat()
            assert (st.st_uid, st.st_gid) == (1000, 1000), name
            info = user.stat(f"pub/{name}")
            assert (info.uid, info.gid) == (1000, 1000), name

        assert nfs_read(user, "pub/rootfile") == b"root's"
        assert user.access("pub/rootfile", os.R_OK) is True
        assert user.access("pub/rootfile", os.W_OK) is False
        assert user.access("pub/userfile", os.R_OK | os.W_OK) is True
        with pytest.raises(PermissionError):
            nfs_write(user, "pub/rootfile", b"overwrite", mode="r+b")
        expect_error(PermissionError, "NFS4ERR_PERM", user.chmod, "pub/rootfile", 0o666)
        expect_error(PermissionError, "NFS4ERR_PERM", user.chown, "pub/userfile", 0, 0)
        expect_error(PermissionError, "NFS4ERR_ACCESS", user.mkdir, "priv/nope")
        with pytest.raises(PermissionError):
            nfs_write(user, "priv/nope", b"x")
        expect_error(PermissionError, "NFS4ERR_ACCESS", user.remove, "priv/rootonly")
        expect_error(PermissionError, "NFS4ERR_ACCESS", user.rename, "priv/rootonly", "pub/stolen")
        assert (ex / "priv" / "rootonly").read_bytes() == b"r"
        assert (ex / "pub" / "rootfile").read_bytes() == b"root's"
        assert statmod.S_IMODE((ex / "pub" / "rootfile").stat().st_mode) == 0o644
        assert (ex / "pub" / "userfile").stat().st_uid == 1000
        assert sorted(os.listdir(ex / "priv")) == ["rootonly"]
    finally:
        user.close()


def test_name_length_limit(sluice_server, client):
    client.mkdir("n")
    client.mkdir("n/" + "a" * 255)
    assert (sluice_server.export / "n" / ("a" * 255)).is_dir()
    expect_error(NfsError, "NFS4ERR_NAMETOOLONG", client.mkdir, "n/" + "b" * 256)
    expect_error(NfsError, "NFS4ERR_NAMETOOLONG", client.open, "n/" + "c" * 256, "wb")
    assert os.listdir(sluice_server.export / "n") == ["a" * 255]


# ----------------------------------------------------------------------------
# restart


def _populate(client: Client) -> dict[str, bytes]:
    client.mkdir("keep/deep/er", parents=True)
    files = {
        "keep/big": rand(2 * MiB + 11, seed=21),
        "keep/deep/small": b"small file",
        "keep/deep/er/empty": b"",
    }
    for path, data in files.items():
        nfs_write(client, path, data)
    client.symlink("deep/small", "keep/link")
    client.link("keep/big", "keep/deep/big-hardlink")
    client.chmod("keep/deep/small", 0o640)
    return files


def _verify(client: Client, export, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        assert_same((export / path).read_bytes(), data, f"host {path}")
        assert client.stat(path).size == len(data)
        assert_same(nfs_read(client, path), data, f"nfs {path}")
    assert sorted(client.listdir("keep")) == ["big", "deep", "link"]
    assert sorted(client.listdir("keep/deep")) == ["big-hardlink", "er", "small"]
    assert client.readlink("keep/link") == "deep/small"
    assert client.stat("keep/big").nlink == 2
    assert client.stat("keep/big").fileid == client.stat("keep/deep/big-hardlink").fileid
    assert client.stat("keep/deep/small").mode & 0o7777 == 0o640


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_restart_keeps_files(sluice_factory, sig):
    # The old client held opens, so the restarted server waits for it to
    # reclaim; nfs-rs does not, so grace runs its full time: keep it short.
    sluice_server = sluice_factory("--no-root-squash", "--grace-time", "5")
    old = connect(sluice_server)
    try:
        files = _populate(old)
        _verify(old, sluice_server.export, files)

        sluice_server.restart(sig)

        new = connect(sluice_server)
        try:
            _verify(new, sluice_server.export, files)
            # the restarted server takes new work
            nfs_write(new, "keep/after", b"written after restart")
            assert (sluice_server.export / "keep" / "after").read_bytes() == b"written after restart"
            files["keep/after"] = b"written after restart"
        finally:
            new.close()

        # nfs-rs does not reconnect on its own; if it ever does, it must see the same files
        try:
            data = nfs_read(old, "keep/deep/small")
        except NfsError:
            pass
        else:
            assert data == b"small file"
            assert nfs_read(old, "keep/after") == b"written after restart"
    finally:
        try:
            old.close()
        except NfsError:
            pass  # closing a client whose server went away reports cleanup errors


def test_file_handles_survive_restart(sluice_server):
    """A directory handle obtained before a restart is still valid afterwards."""
    c = connect(sluice_server)
    try:
        c.mkdir("fh/sub", parents=True)
        nfs_write(c, "fh/sub/a", b"a")
        entry = next(e for e in c.scandir("fh") if e.name == "sub")
        assert entry.fh, "server returned no filehandle in READDIR"
        handle = entry.fh
    finally:
        c.close()

    sluice_server.restart()

    c = connect(sluice_server)
    try:
        names = [e.name for e in c.scandir(DirectoryRef("fh/sub", handle))]
        assert names == ["a"]
        again = next(e for e in c.scandir("fh") if e.name == "sub")
        assert again.fh == handle
    finally:
        c.close()


# ----------------------------------------------------------------------------
# extended attributes


def test_xattr_calls_fail_in_the_client_not_the_server(sluice_server, client):
    """nfs-rs 0.8.7 does setxattr and friends with NFSv4 named attributes
    and sends op 20 (OPEN_CONFIRM, not allowed in NFSv4.1) where OPENATTR
    (19) belongs, so every server answers NFS4ERR_NOTSUPP (docs/xattrs.md).
    The calls fail cleanly, change nothing, and the client goes on. When a
    later nfs-rs gets this right, this test fails: then test its calls."""
    nfs_write(client, "xa", b"data")
    os.setxattr(sluice_server.export / "xa", "user.color", b"red")
    for call in (lambda: client.setxattr("xa", "user.color", b"blue"),
                 lambda: client.getxattr("xa", "user.color"),
                 lambda: client.listxattr("xa"),
                 lambda: client.removexattr("xa", "user.color")):
        with pytest.raises(nfs_rs.NfsUnsupportedError):
            call()
    assert os.getxattr(sluice_server.export / "xa", "user.color") == b"red"
    assert nfs_read(client, "xa") == b"data"
