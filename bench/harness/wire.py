"""A rate-limited network between the clients and the servers (`--wire`).

The servers run in a network namespace of their own, joined to the host by
a veth pair; a token bucket (tc tbf) on each end's egress limits both
directions to the chosen rate. Clients stay on the host and connect to the
namespace's address. Only the network is separate: the file systems
mounted on the host are the same inside.

Names carry the harness's PID, so that `bench/run --clean-stale` can find
what a killed run left (see fs.clean_stale).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import linkprobe
from .util import CommandError, MiB, Teardown, log, run

PROBE = Path(__file__).with_name("linkprobe.py")
NETNS_DIR = Path("/run/netns")
# The /30 subnets the link may use; the first one without an address on
# the host is taken.
SUBNETS = ipaddress.ip_network("10.213.0.0/16").subnets(new_prefix=30)
# tbf: the bucket holds 256 KiB (several GSO packets, so that the rate
# rather than the bucket paces TCP); up to 4 MiB may queue (TCP small
# queues keep a socket's share far below that, so nothing is dropped).
TBF_BURST = "256kb"
TBF_LIMIT = "4mb"
# A link measured faster than this share of its rate is not limited.
MAX_SHARE = 1.05
# ... and one slower than this share is noted: the figures are then
# limited by something else as well (a busy CPU).
LOW_SHARE = 0.8
# Bytes sent each way to measure the link.
PROBE_BYTES = 128 * MiB
PROBE_BYTES_SMOKE = 16 * MiB

_RATE = re.compile(r"(\d+(?:\.\d+)?)([kmg]?)bit", re.IGNORECASE)


class WireError(RuntimeError):
    """The link could not be set up, or it is not limited."""


def parse_rate(text: str) -> int:
    """'1gbit', '100mbit', '2.5gbit' -> bits per second (decimal units, as tc)."""
    m = _RATE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a rate: {text!r} (e.g. 1gbit, 100mbit)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    bits = int(float(m.group(1)) * scale)
    if bits <= 0:
        raise ValueError(f"not a rate: {text!r}")
    return bits


def names_for(pid: int) -> tuple[str, str, str]:
    """(namespace, host interface, namespace interface) of harness `pid`;
    interface names have at most 15 characters."""
    return f"sluice-bench-{pid}", f"slb{pid}h", f"slb{pid}n"


@dataclass
class Link:
    """The namespace, its veth pair and the rate limit on both ends."""

    rate_bits: int
    namespace: str
    host_if: str
    ns_if: str
    host_addr: str
    server_addr: str
    tbf: str
    measured: dict = field(default_factory=dict)

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bits / 8

    @property
    def rate_text(self) -> str:
        if self.rate_bits >= 10**9:
            return f"{self.rate_bits / 1e9:g} Gbit/s"
        return f"{self.rate_bits / 1e6:g} Mbit/s"

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace (network only; nsenter then
        execs it, so the process we start is the command itself)."""
        return ["nsenter", f"--net={NETNS_DIR / self.namespace}", *argv]

    def describe(self) -> dict:
        return {
            "rate": self.rate_text,
            "rate_bits_per_s": self.rate_bits,
            "setup": (
                f"The servers run in network namespace {self.namespace} at {self.server_addr}, the clients on "
                f"the host at {self.host_addr}, joined by a veth pair; tc {self.tbf} on the egress of both ends"
            ),
            "namespace": self.namespace,
            "interfaces": [self.host_if, self.ns_if],
            "server_address": self.server_addr,
            "measured": self.measured,
        }


def create(rate_bits: int, pid: int, teardown: Teardown) -> Link:
    """Sets up the namespace and the limited veth pair; undone by `teardown`."""
    try:
        return _create(rate_bits, pid, teardown)
    except CommandError as e:
        raise WireError(str(e)) from e


def _create(rate_bits: int, pid: int, teardown: Teardown) -> Link:
    namespace, host_if, ns_if = names_for(pid)
    subnet = _free_subnet()
    host_ip, ns_ip = (str(a) for a in subnet.hosts())
    tbf = f"qdisc tbf rate {rate_bits}bit burst {TBF_BURST} limit {TBF_LIMIT}"

    run(["ip", "netns", "add", namespace])
    teardown.push(f"delete network namespace {namespace}", lambda: run(["ip", "netns", "delete", namespace]))
    run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", namespace])
    # Deleting one end deletes both, at once (a namespace's own interfaces
    # go only when the kernel gets round to destroying it).
    teardown.push(f"delete veth {host_if}", lambda: run(["ip", "link", "delete", host_if]))
    run(["ip", "addr", "add", f"{host_ip}/{subnet.prefixlen}", "dev", host_if])
    run(["ip", "link", "set", host_if, "up"])
    ns = ["ip", "-n", namespace]
    run([*ns, "addr", "add", f"{ns_ip}/{subnet.prefixlen}", "dev", ns_if])
    run([*ns, "link", "set", ns_if, "up"])
    run([*ns, "link", "set", "lo", "up"])
    limit = ["root", "tbf", "rate", f"{rate_bits}bit", "burst", TBF_BURST, "limit", TBF_LIMIT]
    run(["tc", "qdisc", "add", "dev", host_if, *limit])
    run(["tc", "-n", namespace, "qdisc", "add", "dev", ns_if, *limit])
    link = Link(rate_bits, namespace, host_if, ns_if, host_ip, ns_ip, tbf)
    log(f"wire: namespace {namespace}, servers at {ns_ip}, clients at {host_ip}, {link.rate_text} each way")
    return link


def remove_leftovers(pid: int) -> None:
    """Deletes the veth pair and namespace a killed harness `pid` left."""
    namespace, host_if, _ = names_for(pid)
    if run(["ip", "link", "show", host_if], check=False).returncode == 0:
        run(["ip", "link", "delete", host_if], check=False)
        log(f"deleted leftover veth {host_if}")
    if namespace in run(["ip", "netns", "list"]).stdout.split():
        run(["ip", "netns", "delete", namespace], check=False)
        log(f"deleted leftover network namespace {namespace}")


def _free_subnet() -> ipaddress.IPv4Network:
    used = [
        ipaddress.ip_interface(word).ip
        for line in run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines()
        for word in line.split()[3:4]
    ]
    for subnet in SUBNETS:
        if not any(ip in subnet for ip in used):
            return subnet
    raise WireError("no free /30 in 10.213.0.0/16 for the benchmark link")


def measure(link: Link, nbytes: int) -> dict:
    """Measures the link with a TCP stream each way and small round trips
    (linkprobe.py in the namespace, this process on the host), stores the
    figures in `link.measured` and checks that the limit holds."""
    probe = subprocess.Popen(
        link.command([sys.executable, str(PROBE), "serve", "--host", link.server_addr, "--bytes", str(nbytes)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = probe.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"no 'listening on' line: {line!r} {probe.stderr.read()[-500:]}")
        port = int(line.split()[-1])
        figures = linkprobe.measure(link.server_addr, port, nbytes)
        probe.wait(timeout=30)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise WireError(f"link probe failed: {e}") from e
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    figures["bytes_each_way"] = nbytes
    link.measured = figures
    rate = link.bytes_per_s / 1e6
    log(
        f"wire: measured {figures['to_client_mb_per_s']:.1f} MB/s to the clients, "
        f"{figures['to_server_mb_per_s']:.1f} MB/s to the servers (limit {rate:.0f} MB/s), "
        f"round trip {figures['rtt_us_median']:.0f} us"
    )
    for direction in ("to_client_mb_per_s", "to_server_mb_per_s"):
        if figures[direction] > MAX_SHARE * rate:
            raise WireError(f"the link is not limited: {direction} {figures[direction]:.1f} MB/s > {rate:.0f}")
    return figures


def low_rate_note(link: Link) -> str | None:
    rate = link.bytes_per_s / 1e6
    slow = [d for d in ("to_client_mb_per_s", "to_server_mb_per_s") if link.measured[d] < LOW_SHARE * rate]
    if not slow:
        return None
    return (
        f"The link measured below {LOW_SHARE:.0%} of its rate ({', '.join(slow)}): "
        "something besides the wire limited the transfer."
    )
