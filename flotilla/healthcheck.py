"""The image's HEALTHCHECK: `python -m flotilla.healthcheck`.

One image runs the proxy (port 8000), the look-alike vLLM (8000) and llama-server (8080) on
whatever port their command names, so the check does not take a port: it finds the ports this
container listens on (/proc/net/tcp and tcp6: the container's own network namespace) and asks
each one's /health, as Docker and Kubernetes probes would. Exit 0 when one answers 200, else 1.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

LISTEN = "0A"
"""The TCP state of a listening socket in /proc/net/tcp."""
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TIMEOUT_S = 3.0


def listening_ports(table: str) -> list[int]:
    """Local ports of the listening sockets in a /proc/net/tcp{,6} table, in order, once each."""
    ports: list[int] = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == LISTEN:
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port not in ports:
                ports.append(port)
    return ports


def healthy(port: int, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether http://127.0.0.1:PORT/health answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def check(ports: Iterable[int]) -> bool:
    return any(healthy(p) for p in ports)


def main() -> int:
    ports = [p for t in TABLES if Path(t).exists() for p in listening_ports(Path(t).read_text())]
    return 0 if check(dict.fromkeys(ports)) else 1


if __name__ == "__main__":
    sys.exit(main())
