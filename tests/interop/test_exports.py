"""Several exports joined by a pseudo file system, through the Linux client.

One `sluice serve --config FILE` serves three exports:

* /home           read-write, everyone;
* /data/archive   read-only, everyone;
* /secret         only for 192.0.2.0/24, which the guest is not in.

A Linux 6.12 guest mounts the pseudo root and checks that it lists only
what it may see, walks into each export (a separate file system on the
client, with its own device number), reads and writes where allowed, gets
EROFS where not, cannot rename between exports, finds /secret absent, and
mounts an export path directly. The host then checks the export
directories. A config with nested pseudo paths is refused at start.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "vm" / "linux-client"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="sluice must run as root"),
]


def toml_str(s) -> str:
    return json.dumps(str(s))


def write_config(base: Path, exports: list[tuple[str, str, str]]) -> Path:
    """exports: (directory name under base, pseudo path, extra TOML lines)."""
    state = base / "state"
    state.mkdir(exist_ok=True)
    text = f'[server]\nlisten = "127.0.0.1:0"\nstate_dir = {toml_str(state)}\n'
    for name, pseudo, extra in exports:
        d = base / name
        d.mkdir(exist_ok=True)
        text += f"\n[[export]]\npath = {toml_str(d)}\npseudo = {toml_str(pseudo)}\nsquash = \"none\"\n{extra}\n"
    cfg = base / "sluice.toml"
    cfg.write_text(text)
    return cfg


class Served:
    def __init__(self, binary: Path, cfg: Path, log: Path):
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                [str(binary), "serve", "--config", str(cfg)],
                stdout=subprocess.PIPE,
                stderr=f,
            )
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"sluice did not start ({line!r}):\n{log.read_text()}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


GUEST = r"""
set -u
fail() { echo "FAILED: $*"; exit 1; }
O="vers=4.2,port=$PORT,addr=$SERVER,proto=tcp,sec=sys"
mkdir -p /mnt /mnt2
mount -t nfs4 -o "$O" $SERVER:/ /mnt || fail "mount of the pseudo root"
top=$(ls /mnt | tr '\n' ' ')
[ "$top" = "data home " ] || fail "pseudo root lists '$top'"
[ "$(ls /mnt/data)" = "archive" ] || fail "/data lists '$(ls /mnt/data)'"
[ "$(cat /mnt/home/hello)" = "from home" ] || fail "read in /home"
[ "$(cat /mnt/data/archive/readme)" = "archived" ] || fail "read in /data/archive"
echo written > /mnt/home/new || fail "write in /home"
mkdir /mnt/home/dir || fail "mkdir in /home"
mv /mnt/home/new /mnt/home/dir/moved || fail "rename in /home"
out=$(touch /mnt/data/archive/x 2>&1) && fail "created a file in the read-only export"
echo "$out" | grep -q "Read-only file system" || fail "read-only export said: $out"
out=$(mkdir /mnt/newdir 2>&1) && fail "mkdir in the pseudo root"
echo "pseudo mkdir: $out"
out=$(rm /mnt/data/archive/readme 2>&1) && fail "removed from the read-only export"
[ -e /mnt/secret ] && fail "/secret is visible"
out=$(ls /mnt/secret 2>&1) && fail "listed /secret"
echo "$out" | grep -q "No such file" || fail "/secret said: $out"
ln /mnt/home/hello /mnt/data/archive/hello 2>/dev/null && fail "hard link across exports"
dh=$(stat -c %d /mnt/home); da=$(stat -c %d /mnt/data/archive); dr=$(stat -c %d /mnt)
[ "$dh" != "$da" ] && [ "$dh" != "$dr" ] || fail "device numbers root=$dr home=$dh archive=$da"
echo "devices root=$dr home=$dh archive=$da"
cd /mnt/data/archive && cd .. && [ "$(ls)" = "archive" ] || fail "cd .. from an export root"
cd /
umount /mnt/data/archive /mnt/home 2>/dev/null
umount /mnt || fail "umount"
mount -t nfs4 -o "$O" $SERVER:/data/archive /mnt2 || fail "direct mount of /data/archive"
[ "$(cat /mnt2/readme)" = "archived" ] || fail "read through the direct mount"
umount /mnt2
out=$(mount -t nfs4 -o "$O" $SERVER:/secret /mnt2 2>&1) && fail "mounted /secret"
echo "secret mount: $out"
echo "== exports ok"
"""


@pytest.fixture(scope="module")
def binary(request) -> Path:
    env = os.environ.get("SLUICE_BINARY")
    if env:
        return Path(env)
    return request.getfixturevalue("sluice_binary")


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="the VM harness boots x86_64 Debian kernels",
)
@pytest.mark.guest
@pytest.mark.parametrize("kernel", ["6.12", "6.1"])
def test_linux_client_walks_the_pseudo_file_system(binary, tmp_path, kernel):
    cfg = write_config(
        tmp_path,
        [
            ("home", "/home", ""),
            ("archive", "/data/archive", "read_only = true"),
            ("secret", "/secret", 'clients = ["192.0.2.0/24"]'),
        ],
    )
    (tmp_path / "home" / "hello").write_text("from home\n")
    (tmp_path / "archive" / "readme").write_text("archived\n")
    (tmp_path / "secret" / "key").write_text("hidden\n")
    srv = Served(binary, cfg, tmp_path / "server.log")
    try:
        script = tmp_path / "guest.sh"
        script.write_text(GUEST)
        proc = subprocess.run(
            [str(HARNESS), "--kernel", kernel, "--port", str(srv.port), "--timeout", "600", str(script)],
            capture_output=True,
            text=True,
        )
    finally:
        srv.stop()
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert proc.returncode == 0 and "== exports ok" in proc.stdout, (
        f"guest failed ({proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-2000:]}\nserver log:\n{log[-3000:]}"
    )
    # What the guest did, seen on the host.
    assert (tmp_path / "home" / "dir" / "moved").read_text() == "written\n"
    assert not (tmp_path / "home" / "new").exists()
    assert sorted(os.listdir(tmp_path / "archive")) == ["readme"]
    assert sorted(os.listdir(tmp_path / "secret")) == ["key"]
    assert srv.proc.returncode == 0, log[-3000:]


@pytest.mark.parametrize(
    "exports, words",
    [
        ([("a", "/x", ""), ("b", "/x/y", "")], ["nested"]),
        ([("a", "/x", ""), ("b", "/x", "")], ["same"]),
        ([("a", "/", ""), ("b", "/y", "")], ["single export"]),
        ([("a", "x", "")], ["must start with '/'"]),
    ],
    ids=["nested", "duplicate", "root-and-more", "relative"],
)
def test_bad_pseudo_paths_stop_the_server(binary, tmp_path, exports, words):
    cfg = write_config(tmp_path, exports)
    proc = subprocess.run(
        [str(binary), "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    err = proc.stderr
    assert f"{cfg}:" in err and "export.pseudo" in err, err
    for w in words:
        assert w in err, err
