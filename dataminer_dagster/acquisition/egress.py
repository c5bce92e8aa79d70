"""Where the tool may connect to fetch a video, a listing or a search: the egress policy.

A project config may come from someone else, and its URLs (or the redirects and stream URLs
behind them) could make the tool fetch from the cloud's metadata service or a machine on the
local network and store what comes back. So every address a fetch connects to is checked:

* link-local addresses (169.254.0.0/16, fe80::/10) and the cloud metadata services' addresses
  are always refused;
* loopback, private, shared (carrier NAT), unspecified, multicast and reserved addresses are
  refused unless every project of the fetch sets `download.allow_private_networks: true`.

The check is made on the address a socket connects to, after name resolution (a name that
resolves to a private address, or is made to resolve to one between two lookups, is refused
alike), inside each HTTP request yt-dlp makes (`egress_checked`, wrapped around
`YoutubeDL.urlopen` in `throttled_ytdlp`): pages, APIs, media, fragments and every redirect.
Its limits: a connection made outside `urlopen` is not seen (a program yt-dlp starts, such as
ffmpeg for some stream protocols); through a proxy, the proxy connects and resolves, so only the
address of the URL asked for is checked, not where the proxy's redirects lead. URLs whose host is
a literal refused-always address are refused earlier, when a project's inputs are read
(`refused_literal_address`).
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from dataminer_dagster.acquisition.errors import PermanentDownloadError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Never fetched from, whatever a project allows.
ALWAYS_REFUSED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",  # link-local; 169.254.169.254 is AWS', GCP's, Azure's, ... metadata
        "fe80::/10",  # link-local
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "168.63.129.16/32",  # Azure's host endpoint (wire server)
    )
)
ALLOW_KEY = "download.allow_private_networks"


class EgressRefused(PermanentDownloadError):
    """A fetch would connect to an address the egress policy refuses; retrying cannot help."""


def address_refusal(address: str | IPAddress, *, allow_private: bool) -> str | None:
    """Why connecting to `address` is refused, or None when it is allowed."""
    ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in network for network in ALWAYS_REFUSED):
        return f"{ip} is a link-local or cloud metadata address, never fetched from"
    if not allow_private and (not ip.is_global or ip.is_multicast):
        return (
            f"{ip} is a loopback or private network address, fetched from only where the "
            f"project sets {ALLOW_KEY}: true"
        )
    return None


def refused_literal_address(url: str) -> str | None:
    """Why a URL whose host is a literal link-local or metadata address is refused, or None
    (names and other addresses are checked when they are fetched)."""
    try:
        host = urlsplit(url).hostname or ""
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    reason = address_refusal(ip, allow_private=True)
    return f"refused: {reason}" if reason else None


@dataclass
class _Guard:
    allow_private: bool
    exempt: frozenset[tuple[str, int]]  # the proxy's addresses: the proxy connects onwards
    refused: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, address: str, port: int) -> None:
        if (address, port) in self.exempt:
            return
        try:
            reason = address_refusal(address, allow_private=self.allow_private)
        except ValueError:  # a name, which the socket would resolve: its addresses are checked
            for resolved, resolved_port in _resolved(f"//{address}:{port}"):
                self.check(resolved, resolved_port)
            return
        if reason:
            with self._lock:
                self.refused = self.refused or f"connection to {address} refused: {reason}"
            raise EgressRefused(self.refused)


_ACTIVE: contextvars.ContextVar[_Guard | None] = contextvars.ContextVar(
    "dataminer_egress_guard", default=None
)
_INSTALLED = threading.Lock()
_installed = False


@contextmanager
def egress_checked(*, allow_private: bool, url: str, proxy: str | None) -> Iterator[None]:
    """Every internet socket this thread connects inside the block is checked against the
    policy; a refused one raises EgressRefused, whatever the caller would make of the error.
    Through a proxy, the proxy's own address is let through and `url`'s host is checked (its
    resolved addresses) before anything is sent."""
    _install()
    exempt = frozenset(_resolved(proxy)) if proxy else frozenset()
    guard = _Guard(allow_private, exempt)
    if proxy:
        host = urlsplit(url).hostname
        for address, port in _resolved(url) if host else ():
            guard.check(address, port)
    token = _ACTIVE.set(guard)
    try:
        yield
    except EgressRefused:
        raise
    except Exception as exc:  # the refusal, as a library wrapped it (or another error after it)
        if guard.refused:
            raise EgressRefused(guard.refused) from exc
        raise
    finally:
        _ACTIVE.reset(token)


def _resolved(url: str) -> list[tuple[str, int]]:
    """The (address, port) pairs `url`'s host resolves to; none when it does not resolve (the
    fetch then fails on its own)."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    try:
        port = (
            parts.port
            or {"https": 443}.get(parts.scheme)
            or (1080 if "socks" in parts.scheme else 80)
        )
        infos = socket.getaddrinfo(parts.hostname or "", port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError):
        return []
    return [(info[4][0], info[4][1]) for info in infos]


def _install() -> None:
    """Check every connect of an internet socket made while a guard is active in its context.
    Installed once per process; without an active guard a connect is what it always was."""
    global _installed
    with _INSTALLED:
        if _installed:
            return
        original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex

        def connect(self: socket.socket, address) -> None:
            _check(self, address)
            return original_connect(self, address)

        def connect_ex(self: socket.socket, address) -> int:
            _check(self, address)
            return original_connect_ex(self, address)

        socket.socket.connect = connect  # type: ignore[method-assign]
        socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
        _installed = True


def _check(sock: socket.socket, address) -> None:
    guard = _ACTIVE.get()
    if guard is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        guard.check(str(address[0]), int(address[1]))
