"""Ports for the servers a test starts and connects to by number (a scratch PostgreSQL, Dagster's
webserver, Label Studio).

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range every
client connection's local port is taken from; the suite opens thousands of those, so between the
choice and the server's own bind (or while a server is stopped for a restart) a connection could
hold the port and the server fail to start ("could not bind"). These ports are drawn outside that
range instead, and checked free."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST, _HIGHEST = 10_000, 65_535
# Services that may run on the machine and be down when a port is drawn (RabbitMQ's management
# and distribution ports, Redis Cluster's bus).
_KNOWN = frozenset({15_672, 25_672, 16_379})


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on or holds, outside the ephemeral range."""
    low, high = _ephemeral_range()
    candidates = [
        port
        for port in (*range(_LOWEST, low), *range(high + 1, _HIGHEST + 1))
        if port not in _KNOWN
    ]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port outside the ephemeral range {low}-{high}")
