"""A video file's content identity: the SHA-256 of its bytes.

Two files (or two URLs' downloads) with the same bytes are the same video, whatever their names.
The whole file is hashed, streamed in large blocks: a hash of parts of it (size, head and tail)
would call two different videos the same now and then. Hashing runs at disk speed (OpenSSL's
SHA-256 uses the CPU's SHA instructions; bench/content_hash.py compares it with a plain read of
the same file) and a file just downloaded is usually still in the page cache.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ALGORITHM = "sha256"


def file_content_hash(path: Path) -> str:
    """The hex SHA-256 of the file's bytes, read once in large blocks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGORITHM).hexdigest()
