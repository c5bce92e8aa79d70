"""Secrets out of URLs before they are shown: in logs, stored errors, status reports, the CLI.

A video URL may carry a password (`http://user:pass@host/...`) or a signed token in its query; a
database URL a password, in the user info or as `?password=`. `redact` masks them in any text:
the password of the user info (and a user name given alone, often a token, except in database
URLs where it names a role), every query value except those that only name a thing (a YouTube
video id, a database host or port) and the fragment, keeping the scheme, host, path and the
query's keys. The full URL is used only to fetch or connect, never to explain.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"
# Query parameters whose values say what is fetched, not who may fetch it.
_NAMING_KEYS = frozenset({"v", "host", "port", "dbname", "sslmode"})
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def redact(text: str) -> str:
    """`text` with every URL in it redacted (see `redact_url`)."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)


def redact_url(url: str) -> str:
    """`url` with its password, query values (but the naming ones) and fragment masked."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not parseable (e.g. a broken IPv6 host): show no part of it
        return MASK
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if not password and not parts.scheme.startswith("postgres"):
            user = MASK  # a user name alone is often the token itself (https://TOKEN@host)
        netloc = f"{user}{colon}{MASK if password else ''}@{host}"
    redacted = f"{parts.scheme}://{netloc}{parts.path}"  # urlunsplit would drop an empty host
    if parts.query:
        redacted += "?" + "&".join(_redact_parameter(p) for p in parts.query.split("&"))
    return redacted + (f"#{MASK}" if parts.fragment else "")


def _redact_parameter(parameter: str) -> str:
    key, equals, value = parameter.partition("=")
    if not equals:
        return MASK  # a bare value may itself be the token
    return parameter if key in _NAMING_KEYS or not value else f"{key}={MASK}"
