"""Boot a throwaway Linux guest under QEMU and run a shell script in it.

The guest exists to exercise a real Linux kernel NFS client against a server
running on this machine. It is deliberately tiny: a stock Debian cloud kernel,
an initramfs holding a static busybox, the few kernel modules the NFS client
and the virtio NIC need, the script, and whatever extra host binaries the
caller asks for. QEMU's user-mode network makes the host's loopback reachable
from the guest as 10.0.2.2.

Used by `tests/vm/linux-client` (run one script) and `tests/vm/setup`
(install host packages and prefetch kernels, e.g. for CI).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import lzma
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Exit statuses of the harness itself (anything else is the guest script's).
EXIT_TIMEOUT = 124
EXIT_HARNESS = 125
EXIT_NO_STATUS = 126  # the guest stopped without reporting (panic, crash, ...)

GUEST_IP = "10.0.2.15"
HOST_FROM_GUEST = "10.0.2.2"

# Host packages the harness needs, with a file each one provides.
HOST_PACKAGES = {
    "qemu-system-x86": "/usr/bin/qemu-system-x86_64",
    "busybox-static": "/bin/busybox",
    "cpio": "/usr/bin/cpio",
    "kmod": "/usr/bin/kmod",
    "zstd": "/usr/bin/zstd",
}

# Kernel series we know how to boot, as the Debian package name pattern.
KERNELS = {
    "6.1": re.compile(r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64$"),
    "6.12": re.compile(r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64$"),
}

# Modules the guest loads (with their dependencies); missing ones are
# either built in or optional.
WANTED_MODULES = ["virtio_pci", "virtio_net", "virtio_rng", "nfsv4", "nfsv3"]

BANNER_BEGIN = "==== sluice-vm: script begin ===="
BANNER_END_RE = re.compile(r"==== sluice-vm: script end, exit status (\d+) ====")


class HarnessError(Exception):
    pass


def log(msg: str) -> None:
    print(f"sluice-vm: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    d = Path(base) / "sluice-vm"
    d.mkdir(parents=True, exist_ok=True)
    return d


# --------------------------------------------------------------------------
# host packages


def _installed(pkg: str) -> bool:
    r = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", pkg],
        capture_output=True,
        text=True,
    )
    return r.returncode == 0 and "install ok installed" in r.stdout


def _root_prefix() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise HarnessError("need root (or sudo) to install packages")


def ensure_packages() -> None:
    """Install the host packages the harness needs, if any is missing."""
    missing = [
        p
        for p, f in HOST_PACKAGES.items()
        if not (_installed(p) and os.path.exists(f))
    ]
    if not missing:
        return
    _apt_install(missing)


def _apt_install(packages: list[str]) -> None:
    log(f"installing {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sudo = _root_prefix()
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        sudo
        + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        env=env,
    )


# --------------------------------------------------------------------------
# the NSM tools (rpcbind and rpc.statd) for NFSv3 locking in the guest

# Debian packages the guest's rpcbind, rpcinfo and rpc.statd come from. They
# are unpacked into the cache, not installed: an installed rpcbind would
# start on the host and take port 111 from the servers under test.
NSM_PACKAGES = ["rpcbind", "nfs-common"]
# The shared libraries they need, installed on the host so that the
# harness finds them (libraries only: nothing starts).
NSM_LIBRARIES = {"libtirpc3": "libtirpc.so.3", "libwrap0": "libwrap.so.0"}
# The tools, by the path they have in their packages (and in the guest).
NSM_TOOLS = ["sbin/rpcbind", "usr/bin/rpcinfo", "sbin/rpc.statd"]


def fetch_nsm_tools() -> dict[str, Path]:
    """The unpacked rpcbind, rpcinfo and rpc.statd (downloaded on first
    use into the cache), their libraries installed on the host: {path in
    the guest: file}."""
    missing = [p for p, lib in NSM_LIBRARIES.items()
               if not _installed(p) or not _find_lib(lib)]
    if missing:
        _apt_install(missing)
    top = cache_dir()
    root = top / "nsm" / "root"
    with open(top / ".lock-nsm", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if not all((root / t).exists() for t in NSM_TOOLS):
            log(f"fetching {' '.join(NSM_PACKAGES)} (unpacked, not installed)")
            if root.exists():
                shutil.rmtree(root)
            _unpack_debs(NSM_PACKAGES, root)
    tools = {"/" + t: root / t for t in NSM_TOOLS}
    for t in tools.values():
        if not t.exists():
            raise HarnessError(f"{t.name} is not in {' '.join(NSM_PACKAGES)}: remove {root} and retry")
    return tools


def _unpack_debs(packages: list[str], root: Path) -> None:
    """Downloads the Debian `packages` (one .deb each) and unpacks them into
    `root`, without installing them."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as dl:
        # apt drops privileges to _apt for downloads; let it write here.
        os.chmod(dl, 0o777)
        subprocess.run(["apt-get", "download", "-qq", *packages], cwd=dl, check=True)
        debs = list(Path(dl).glob("*.deb"))
        if len(debs) != len(packages):
            raise HarnessError(f"apt-get download {' '.join(packages)} gave {debs}")
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)


def _find_lib(name: str) -> bool:
    return any(Path(d, name).exists() for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"))


# --------------------------------------------------------------------------
# kernels


@dataclass
class Kernel:
    series: str
    package: str
    release: str  # uname -r
    root: Path  # unpacked package

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def moddir(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def _candidates(pattern: re.Pattern) -> list[str]:
    r = subprocess.run(
        ["apt-cache", "search", "--names-only", pattern.pattern],
        capture_output=True,
        text=True,
    )
    names = [line.split(" ", 1)[0] for line in r.stdout.splitlines() if line]
    return [n for n in names if pattern.match(n)]


def _newest(names: list[str]) -> str:
    def key(name: str):
        return [int(x) for x in re.findall(r"\d+", name)]

    return max(names, key=key)


def _add_backports_source() -> None:
    path = Path("/etc/apt/sources.list.d/sluice-vm-bookworm-backports.sources")
    if path.exists():
        return
    text = (
        "Types: deb\n"
        "URIs: http://deb.debian.org/debian\n"
        "Suites: bookworm-backports\n"
        "Components: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    sudo = _root_prefix()
    subprocess.run(sudo + ["tee", str(path)], input=text, text=True, check=True,
                   stdout=subprocess.DEVNULL)


def _pick_package(series: str) -> str:
    pattern = KERNELS[series]
    names = _candidates(pattern)
    if not names:
        # Stale or missing package lists; 6.12 may only be in backports.
        if series == "6.12":
            _add_backports_source()
        subprocess.run(_root_prefix() + ["apt-get", "update", "-qq"], check=True)
        names = _candidates(pattern)
    if not names:
        raise HarnessError(f"no Debian package matches {pattern.pattern}")
    return _newest(names)


def fetch_kernel(series: str) -> Kernel:
    """Return the unpacked kernel for SERIES, downloading it on first use."""
    if series not in KERNELS:
        raise HarnessError(f"unknown kernel {series!r}; choose from {', '.join(KERNELS)}")
    top = cache_dir()
    kdir = top / f"kernel-{series}"
    stamp = kdir / "kernel.json"
    with open(top / f".lock-{series}", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if not stamp.exists():
            _download_kernel(series, kdir)
        info = json.loads(stamp.read_text())
    k = Kernel(series, info["package"], info["release"], kdir / "root")
    if not k.vmlinuz.exists():
        raise HarnessError(f"cached kernel is incomplete: remove {kdir} and retry")
    return k


def _download_kernel(series: str, kdir: Path) -> None:
    pkg = _pick_package(series)
    log(f"fetching {pkg}")
    if kdir.exists():
        shutil.rmtree(kdir)
    kdir.mkdir(parents=True)
    _unpack_debs([pkg], kdir / "root")
    releases = os.listdir(kdir / "root" / "lib" / "modules")
    if len(releases) != 1:
        raise HarnessError(f"unexpected module trees in {pkg}: {releases}")
    release = releases[0]
    subprocess.run(["depmod", "-b", str(kdir / "root"), release], check=True)
    (kdir / "kernel.json").write_text(
        json.dumps({"package": pkg, "release": release}) + "\n"
    )


# --------------------------------------------------------------------------
# modules


def _modname(path: str) -> str:
    base = os.path.basename(path)
    base = re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base)
    return base.replace("-", "_")


def module_closure(k: Kernel, wanted: list[str]) -> list[tuple[str, Path]]:
    """Modules to insmod, dependencies first, as (name, file) pairs."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (k.moddir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[_modname(target)] = (target, [_modname(d) for d in rest.split()])
    order: list[tuple[str, Path]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in deps:
            return  # built in, optional, or already queued
        seen.add(name)
        for d in deps[name][1]:
            visit(d)
        order.append((name, k.moddir / deps[name][0]))

    for w in wanted:
        visit(w.replace("-", "_"))
    return order


def read_module(path: Path) -> bytes:
    name = path.name
    if name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if name.endswith(".ko.gz"):
        return gzip.decompress(path.read_bytes())
    if name.endswith(".ko.zst"):
        return subprocess.run(
            ["zstd", "-qdc", str(path)], capture_output=True, check=True
        ).stdout
    return path.read_bytes()


# --------------------------------------------------------------------------
# initramfs (cpio "newc", written directly)


class Cpio:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ino = 1000
        self.dirs: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev=(0, 0)) -> None:
        self.ino += 1
        fields = [
            self.ino, mode, 0, 0, 2 if stat.S_ISDIR(mode) else 1, 0, len(data),
            0, 0, rdev[0], rdev[1], len(name) + 1, 0,
        ]
        hdr = b"070701" + b"".join(b"%08x" % f for f in fields)
        blob = hdr + name.encode() + b"\0"
        blob += b"\0" * (-len(blob) % 4)
        blob += data + b"\0" * (-len(data) % 4)
        self.chunks.append(blob)

    def mkdir(self, path: str) -> None:
        path = path.strip("/")
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p and p not in self.dirs:
                self.dirs.add(p)
                self._entry(p, stat.S_IFDIR | 0o755)

    def file(self, path: str, data: bytes, perm: int = 0o644) -> None:
        path = path.strip("/")
        self.mkdir(os.path.dirname(path))
        self._entry(path, stat.S_IFREG | perm, data)

    def symlink(self, path: str, target: str) -> None:
        path = path.strip("/")
        self.mkdir(os.path.dirname(path))
        self._entry(path, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, path: str, major: int, minor: int, perm: int = 0o600) -> None:
        path = path.strip("/")
        self.mkdir(os.path.dirname(path))
        self._entry(path, stat.S_IFCHR | perm, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        out = b"".join(self.chunks)
        return out + b"\0" * (-len(out) % 512)


INIT = r"""#!/bin/sh
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o size=128m tmpfs /tmp
while read -r m; do
  insmod "/lib/modules/$m.ko" || echo "sluice-vm: insmod $m failed"
done < /etc/sluice-vm/modules
nic=
for d in /sys/class/net/*; do
  [ "${d##*/}" = lo ] || { nic=${d##*/}; break; }
done
ip link set lo up
if [ -n "$nic" ]; then
  ip addr add @GUEST_IP@/24 dev "$nic"
  ip link set "$nic" up
  ip route add default via @HOST_IP@
else
  echo "sluice-vm: no network interface in the guest"
fi
. /etc/sluice-vm/env
echo "sluice-vm: guest kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s"
echo "@BEGIN@"
cd /root
/bin/sh /etc/sluice-vm/script < /dev/null
rc=$?
echo "==== sluice-vm: script end, exit status $rc ===="
if [ "$rc" -ne 0 ]; then
  echo "---- sluice-vm: guest dmesg (last 60 lines) ----"
  dmesg | tail -n 60
  echo "---- sluice-vm: end of dmesg ----"
fi
echo "$rc" > /dev/ttyS1
sync
poweroff -f
"""


def _libs_of(binary: str) -> list[str]:
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if r.returncode != 0:
        return []  # static, or not an ELF we can inspect
    libs = []
    for line in r.stdout.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def build_initramfs(
    k: Kernel,
    script: bytes,
    env: dict[str, str],
    bins: list[str],
    placed: dict[str, Path] | None = None,
) -> bytes:
    """The guest's initramfs. `bins` are host binaries copied to the same
    path with their libraries; `placed` maps a guest path to a host file
    (and its libraries) put there. The shell scripts of tests/vm/guest/lib
    are in /etc/sluice-vm/lib for the script to source."""
    busybox = HOST_PACKAGES["busybox-static"]
    c = Cpio()
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp",
              "mnt", "root", "etc/sluice-vm", "lib/modules"]:
        c.mkdir(d)
    c.chardev("dev/console", 5, 1)
    c.file("bin/busybox", Path(busybox).read_bytes(), 0o755)
    c.symlink("bin/sh", "busybox")
    init = (INIT.replace("@GUEST_IP@", GUEST_IP)
            .replace("@HOST_IP@", HOST_FROM_GUEST)
            .replace("@BEGIN@", BANNER_BEGIN))
    c.file("init", init.encode(), 0o755)
    mods = module_closure(k, WANTED_MODULES)
    if "nfsv4" not in [m for m, _ in mods]:
        raise HarnessError(f"kernel {k.release} has no nfsv4 module")
    for name, path in mods:
        c.file(f"lib/modules/{name}.ko", read_module(path))
    c.file("etc/sluice-vm/modules", "".join(f"{m}\n" for m, _ in mods).encode())
    env_text = "".join(f"export {k_}={shlex.quote(v)}\n" for k_, v in env.items())
    c.file("etc/sluice-vm/env", env_text.encode())
    c.file("etc/sluice-vm/script", script, 0o755)
    c.mkdir("etc/sluice-vm/lib")
    for lib in sorted((HERE / "guest" / "lib").glob("*.sh")):
        c.file(f"etc/sluice-vm/lib/{lib.name}", lib.read_bytes(), 0o644)
    done: set[str] = set()

    def put(host: str, guest: str) -> None:
        if guest in done:
            return
        done.add(guest)
        real = os.path.realpath(host)
        c.file(guest, Path(real).read_bytes(), os.stat(real).st_mode & 0o777)

    for b in bins:
        src = shutil.which(b) if "/" not in b else b
        if not src or not os.path.isfile(src):
            raise HarnessError(f"--bin {b}: not found")
        src = os.path.abspath(src)
        for f in [src, *_libs_of(src)]:
            put(f, f)
    for guest, host in (placed or {}).items():
        put(str(host), guest)
        for f in _libs_of(str(host)):
            put(f, f)
    return c.finish()


# --------------------------------------------------------------------------
# running


def _accel() -> list[str]:
    # TCG by default: it behaves the same everywhere. KVM is opt-in because a
    # /dev/kvm that opens is not always one that works (nested sandboxes).
    if os.environ.get("SLUICE_VM_ACCEL") == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg", "-cpu", "max"]


def run(
    series: str,
    script: Path,
    env: dict[str, str],
    bins: list[str],
    mem_mb: int,
    timeout: float,
    out=None,
    smp: int = 1,
    forwards: list[tuple[str, int, int]] = (),
    nsm: bool = False,
) -> int:
    """Boot the guest with SMP vCPUs, stream its console to OUT, return the
    exit status. QEMU is killed if this is interrupted (Ctrl-C, an exception
    raised by a signal handler).

    `forwards` are (protocol "tcp" or "udp", host port, guest port): a
    connection to 127.0.0.1:host port reaches the guest's port, coming
    from 10.0.2.2 (how the server calls the guest's portmapper, status
    monitor and lock manager). With `nsm` the guest gets rpcbind, rpcinfo
    and rpc.statd (see guest/lib/nsm.sh)."""
    out = out or sys.stdout
    ensure_packages()
    k = fetch_kernel(series)
    placed = fetch_nsm_tools() if nsm else {}
    netdev = "user,id=n0"
    for proto, host_port, guest_port in forwards:
        if proto not in ("tcp", "udp"):
            raise HarnessError(f"forward protocol {proto!r}: tcp or udp")
        netdev += f",hostfwd={proto}:127.0.0.1:{host_port}-:{guest_port}"
    with tempfile.TemporaryDirectory(prefix="sluice-vm-") as work:
        work_p = Path(work)
        initrd = work_p / "initramfs.cpio"
        initrd.write_bytes(build_initramfs(k, script.read_bytes(), env, bins, placed))
        status = work_p / "status"
        cmd = [
            "qemu-system-x86_64", *_accel(), "-smp", str(smp), "-m", str(mem_mb),
            "-nodefaults", "-display", "none", "-no-reboot",
            "-kernel", str(k.vmlinuz), "-initrd", str(initrd),
            "-append", "console=ttyS0 quiet panic=-1 oops=panic",
            "-serial", "stdio", "-serial", f"file:{status}",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
            "-device", "virtio-rng-pci",
        ]
        log(f"booting {k.package} ({k.release}), {smp} vCPU, {mem_mb} MiB, "
            f"timeout {timeout:.0f}s")
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        seen_end: list[int] = []

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").replace("\r", "")
                m = BANNER_END_RE.search(line)
                if m:
                    seen_end.append(int(m.group(1)))
                out.write(line)
                out.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            qrc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(5)
            log(f"timed out after {timeout:.0f}s")
            return EXIT_TIMEOUT
        except BaseException:
            if proc.poll() is None:
                log(f"interrupted: stopping QEMU (pid {proc.pid})")
                proc.kill()
                proc.wait()
            raise
        reader.join(10)
        text = status.read_text(errors="replace").strip() if status.exists() else ""
        if text.isdigit():
            return int(text)
        if seen_end:
            return seen_end[-1]
        log(f"the guest stopped without reporting a status (qemu exit {qrc})")
        return EXIT_NO_STATUS
