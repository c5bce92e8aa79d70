"""A video file's content identity: the SHA-256 of its bytes.

Two files (or two URLs' downloads) with the same bytes are the same video, whatever their names.
The whole file is hashed, streamed in large blocks: a hash of parts of it (size, head and tail)
would call two different videos the same now and then. SHA-256, because OpenSSL runs it on the
CPU's SHA instructions, faster than BLAKE2b or MD5 (bench/content_hash.py measures it against a
plain read of the same file; the figures are in bench/README.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ALGORITHM = "sha256"


def file_content_hash(path: Path) -> str:
    """The hex SHA-256 of the file's bytes, read once in large blocks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGORITHM).hexdigest()
