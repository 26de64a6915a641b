"""Reads one file sequentially through nfs-rs (NFSv4.1) and prints one JSON
line: bytes, seconds, mb_per_s and the negotiated read size.

nfs-rs splits each call into negotiated-size READs with up to eight in
flight, so 8 MiB calls keep eight 1 MiB READs going, like sluice-load's
default --bs 1M --inflight 8.
"""

import argparse
import json
import sys
import time

from nfs_rs import Client

CALL_BYTES = 8 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--file", required=True, help="path from the export root")
    args = ap.parse_args()

    url = f"nfs://{args.host}/?version=4.1&nfsport={args.port}&noresvport=true"
    with Client.connect(url, connect_timeout=20, operation_timeout=120) as client:
        limits = client.io_limits
        with client.open(args.file.lstrip("/"), "rb") as f:
            buf = bytearray(CALL_BYTES)
            total = 0
            started = time.monotonic()
            while True:
                n = f.readinto_at(buf, total)
                if n == 0:
                    break
                total += n
            secs = time.monotonic() - started
    print(
        json.dumps(
            {
                "bytes": total,
                "seconds": secs,
                "mb_per_s": total / secs / 1e6 if secs > 0 else 0.0,
                "max_read": limits.max_read,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
