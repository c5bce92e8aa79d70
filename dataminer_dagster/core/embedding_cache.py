"""Image embeddings kept on disk, keyed by (model identity, frame content hash).

One file per (model slug, video): `<root>/<model_slug>/<video_id>.npz` holds the frame content
hashes (sorted) and their L2-normalised embeddings in float16. Frames are looked up by content,
not by path, so every project that shares a video, and the dedup stage, reuse the same vectors.
A file per video rather than per frame keeps a 100k-frame project to a few hundred files.

Writes are atomic (temporary sibling, then rename) and merge with what is already stored, so a
reader sees either the old or the new file, never a partial one. Two writers updating the same
video at the same moment can lose one side's additions (last rename wins); the cache stays
consistent and those frames are simply computed again next time.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# Names that are safe as a single path component (video ids and model slugs).
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._@+=-]*")
_STORE_DTYPE = np.float16


def quantize(embeddings: np.ndarray) -> np.ndarray:
    """The float32 values `EmbeddingCache.get` returns for `embeddings` once stored.

    L2-normalises, rounds to float16 and widens back. Scoring fresh embeddings through this gives
    the same decisions as scoring them from the cache on a later run.
    """
    return _normalise(embeddings).astype(_STORE_DTYPE).astype(np.float32)


def _normalise(embeddings: np.ndarray) -> np.ndarray:
    vectors = np.asarray(embeddings, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"{kind} {value!r} cannot name a cache file: use letters, digits and . _ - @ + = only"
        )
    return value


class EmbeddingCache:
    """Embeddings of one model, stored per video under `root/model_slug/`."""

    def __init__(self, root: Path, model_slug: str):
        self.root = Path(root)
        self.model_slug = _check_name("model slug", model_slug)

    @property
    def directory(self) -> Path:
        return self.root / self.model_slug

    def path_for(self, video_id: str) -> Path:
        return self.directory / f"{_check_name('video id', video_id)}.npz"

    def get(self, video_id: str, hashes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Look up frames by content hash.

        Returns `(found, embeddings)`: `found` is a bool mask over `hashes`, and `embeddings`
        (float32, shape (found.sum(), D)) holds the vectors of `hashes[found]` in that order.
        A missing or unreadable file is a miss for every hash (D is then 0).
        """
        query = _as_hash_array(hashes)
        stored_hashes, stored_embeddings = self._load(self.path_for(video_id))
        if stored_hashes.size == 0 or query.size == 0:
            dim = stored_embeddings.shape[1] if stored_embeddings.ndim == 2 else 0
            return np.zeros(query.size, dtype=bool), np.zeros((0, dim), dtype=np.float32)
        positions = np.searchsorted(stored_hashes, query)
        clipped = np.minimum(positions, stored_hashes.size - 1)
        found = stored_hashes[clipped] == query
        return found, stored_embeddings[clipped[found]].astype(np.float32)

    def put(self, video_id: str, hashes: Sequence[str], embeddings: np.ndarray) -> None:
        """Store embeddings (normalised, float16) for `hashes`, merged with the video's file.

        A hash already stored is overwritten with the new vector.
        """
        new_hashes = _as_hash_array(hashes)
        vectors = np.asarray(embeddings)
        if vectors.ndim != 2 or vectors.shape[0] != new_hashes.size:
            raise ValueError(
                f"need one embedding row per hash: {new_hashes.size} hashes, embeddings of shape "
                f"{vectors.shape}"
            )
        if new_hashes.size == 0:
            return
        path = self.path_for(video_id)
        old_hashes, old_embeddings = self._load(path)
        if old_hashes.size and old_embeddings.shape[1] != vectors.shape[1]:
            raise ValueError(
                f"embeddings of dimension {vectors.shape[1]} do not match the {old_embeddings.shape[1]} "
                f"already cached in {path}; a different model needs a different model slug"
            )
        merged_hashes = new_hashes
        merged = _normalise(vectors).astype(_STORE_DTYPE)
        if old_hashes.size:
            # New rows first: np.unique keeps the first occurrence, so new vectors win.
            merged_hashes = np.concatenate([new_hashes, old_hashes])
            merged = np.concatenate([merged, old_embeddings])
        unique_hashes, first = np.unique(merged_hashes, return_index=True)
        _write_atomically(path, unique_hashes, merged[first])

    def _load(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        empty = np.zeros(0, dtype=str), np.zeros((0, 0), dtype=_STORE_DTYPE)
        if not path.is_file():
            return empty
        try:
            with np.load(path, allow_pickle=False) as data:
                return data["hashes"], data["embeddings"]
        except (OSError, ValueError, KeyError) as error:
            logger.warning("Ignoring unreadable embedding cache file %s: %s", path, error)
            return empty


def _as_hash_array(hashes: Sequence[str]) -> np.ndarray:
    values = np.asarray(list(hashes), dtype=str)
    if values.ndim != 1:
        raise ValueError("hashes must be a flat sequence of strings")
    return values


def _write_atomically(path: Path, hashes: np.ndarray, embeddings: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, hashes=hashes, embeddings=embeddings)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
