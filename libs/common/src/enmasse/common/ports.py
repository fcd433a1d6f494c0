"""Loopback ports picked now for a process that binds them later.

In: nothing but the kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range).
Out: `unclaimed_port()`, a port on 127.0.0.1 that nobody holds now and that no outgoing
connection will take as its source port meanwhile.

Why not simply bind port 0: the kernel answers with a port from its ephemeral range, the same
range every outgoing connection on the machine draws its source port from. A router's port is
written into its workload file seconds before the router binds it; in between, any client
(a gRPC channel, a probe, a test) may be handed that very port as its source, and while that
connection lives the router cannot bind (seen: a router restarting for minutes on "Address
already in use"). Below the ephemeral range no connection is ever given a port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # below: the well-known and registered services people run on fixed ports
ATTEMPTS = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's (low, high) source port range; Linux's default when it cannot be read."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def unclaimed_port(*, host: str = "127.0.0.1") -> int:
    """A port free on `host` now, outside the ephemeral range (inside it only when the range
    leaves no room below it: then the kernel's own pick)."""
    low, high = ephemeral_range()
    candidates = range(LOWEST, low) if low - LOWEST >= 1_000 else range(high + 1, 65_536)
    for _ in range(ATTEMPTS if len(candidates) >= 1_000 else 0):
        port = random.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
