"""The download stage's content hash against a plain read of the same file.

Every video's file is hashed once at download (dataminer_dagster/assets/download/content_hash.py, SHA-256 of
the bytes). Hashing is meant to cost no more than reading the file: this measures, on one file of
`--size-mb` random bytes, in the same process,

* **warm**: the file in the page cache (a file just downloaded usually is): a plain read into one
  buffer, `file_content_hash` (SHA-256), and BLAKE2b and MD5 through the same `hashlib.file_digest`
  for comparison;
* **cold**: the file's pages dropped from the cache first (`posix_fadvise(DONTNEED)` after an
  fsync), a plain read against `file_content_hash`: what hashing a local file costs.

Medians of `--repeats`; MB/s and the ratio to the plain read of the same kind.

    python bench/content_hash.py                        # 2 GB file in a temporary directory
    python bench/content_hash.py --size-mb 512 --repeats 5 --dir /data
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BLOCK = 1 << 20


def _write(path: Path, size_mb: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(BLOCK))
        f.flush()
        os.fsync(f.fileno())


def _drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _plain_read(path: Path) -> None:
    buffer = bytearray(BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass


def _digest(algorithm: str) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        with open(path, "rb") as f:
            hashlib.file_digest(f, algorithm)

    return run


def _seconds(fn: Callable[[Path], None], path: Path, repeats: int, *, cold: bool) -> float:
    times = []
    for _ in range(repeats):
        if cold:
            _drop_from_cache(path)
        else:
            _plain_read(path)  # make sure every page is cached
        started = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    from dataminer_dagster.assets.download.content_hash import file_content_hash

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the test file is written")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-content-hash-") as tmp:
        path = Path(tmp) / "video.bin"
        _write(path, args.size_mb)
        rows = []
        for kind, cold, cases in (
            (
                "warm",
                False,
                [
                    ("plain read", _plain_read),
                    ("file_content_hash (sha256)", file_content_hash),
                    ("blake2b", _digest("blake2b")),
                    ("md5", _digest("md5")),
                ],
            ),
            (
                "cold",
                True,
                [("plain read", _plain_read), ("file_content_hash (sha256)", file_content_hash)],
            ),
        ):
            baseline = None
            for name, fn in cases:
                seconds = _seconds(fn, path, args.repeats, cold=cold)
                baseline = baseline or seconds
                rows.append((kind, name, seconds, args.size_mb / seconds, seconds / baseline))
    print(f"file: {args.size_mb} MB of random bytes, medians of {args.repeats}")
    print("| cache | what | seconds | MB/s | x plain read |\n|---|---|---:|---:|---:|")
    for kind, name, seconds, rate, ratio in rows:
        print(f"| {kind} | {name} | {seconds:.3f} | {rate:,.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
