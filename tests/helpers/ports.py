"""Ports for the servers a test starts and connects to by number (a scratch PostgreSQL, a
webserver, supervisord's HTTP server).

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range every
client connection's local port is taken from; the suite opens thousands of those, so between the
choice and the server's own bind (or while a server is stopped for a restart) a connection could
hold the port and the server fail to start ("could not bind"). These ports are drawn below that
range instead, and checked free."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on or holds, outside the ephemeral range."""
    top = _ephemeral_start()
    for port in random.sample(range(_LOWEST, top), min(200, top - _LOWEST)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOWEST} and {top}")
