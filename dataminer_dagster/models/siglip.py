"""SigLIP / SigLIP2 prompt scoring and image embeddings for frames on disk.

`SiglipScorer` embeds prompts and frames with a transformers SiglipModel (the fixed-resolution
SigLIP2 checkpoints such as google/siglip2-so400m-patch14-384) or Siglip2Model (the naflex
checkpoints) and turns them into per-prompt probabilities. `ImageEmbedder` does the image half
for any transformers vision backbone whose output has a `pooler_output` (DINOv2, DINOv3), for the
dedup stage.

Frames are read, decoded and preprocessed by a thread pool a few batches ahead of the model
(a bounded queue of futures consumed in input order), so the model does not wait on JPEG
decoding. A frame that cannot be read is reported with its index and the reason and left out of
its batch; it never fails the batch (reference bug 24).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dataminer_dagster.core.filter_rule import sigmoid_scores
from dataminer_dagster.core.images import ImageReadError, read_image
from dataminer_dagster.models.loading import LoadedModel, load_pretrained

# SigLIP2 was trained on prompts padded to 64 tokens; the text tower has 64 positions.
TEXT_MAX_LENGTH = 64


@dataclass(frozen=True)
class ImageBatchResult:
    """One batch of `embed_images`, in input order."""

    indices: np.ndarray  # (B,) int64: positions in the input sequence of the embedded images
    embeddings: np.ndarray  # (B, D) float32, L2-normalised; row i belongs to indices[i]
    errors: dict[int, str] = field(default_factory=dict)  # input position -> why it was skipped
    wait_s: float = 0.0  # time the model loop waited for this batch to be prepared
    model_s: float = 0.0  # time spent in the model (forward pass and copy back)

    @classmethod
    def concatenate(cls, batches: Sequence[ImageBatchResult], dim: int) -> ImageBatchResult:
        """All batches as one result (`dim` sizes the embeddings when there are none)."""
        errors: dict[int, str] = {}
        for batch in batches:
            errors.update(batch.errors)
        return cls(
            indices=np.concatenate([np.zeros(0, np.int64)] + [b.indices for b in batches]),
            embeddings=np.concatenate(
                [np.zeros((0, dim), np.float32)] + [b.embeddings for b in batches]
            ),
            errors=errors,
            wait_s=sum(b.wait_s for b in batches),
            model_s=sum(b.model_s for b in batches),
        )


@dataclass
class _PreparedBatch:
    indices: list[int]
    inputs: dict[str, Any] | None  # processor output as tensors; None when no image was usable
    errors: dict[int, str]


class ImageEmbedder:
    """L2-normalised image embeddings from a transformers vision model, batched and prefetched.

    `model_ref` is a directory saved with save_pretrained or a hub id (see models.loading). The
    model is loaded once per process for each (reference, device, dtype).
    """

    processor_class_name = "AutoImageProcessor"

    def __init__(
        self,
        model_ref: str | os.PathLike[str],
        *,
        device: str = "auto",
        dtype: str | None = None,
        batch_size: int = 32,
        prefetch_workers: int = 2,
        revision: str | None = None,
    ):
        import transformers

        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch_workers < 0:
            raise ValueError(f"prefetch_workers must not be negative, got {prefetch_workers}")
        self.batch_size = batch_size
        self.prefetch_workers = prefetch_workers
        # The PIL image processors reproduce the preprocessing of the reference system, and are
        # faster on the CPU than the torchvision ones, whose threads compete with the model.
        self.loaded: LoadedModel = load_pretrained(
            model_ref,
            device=device,
            dtype=dtype,
            revision=revision,
            processor_class=getattr(transformers, self.processor_class_name),
            processor_kwargs={"backend": "pil"},
        )

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def device(self) -> Any:
        return self.loaded.device

    @property
    def model_slug(self) -> str:
        """Stable identity of the weights and image preprocessing, for the embedding cache."""
        return self.loaded.source.slug

    @property
    def embedding_dim(self) -> int:
        config = self.model.config
        return int(getattr(config, "vision_config", config).hidden_size)

    @property
    def image_processor(self) -> Any:
        return getattr(self.loaded.processor, "image_processor", self.loaded.processor)

    def embed_images(self, paths: Sequence[Path | str]) -> Iterator[ImageBatchResult]:
        """Embed the image files in batches of `batch_size`, yielded in input order.

        Unreadable files appear in `errors` of their batch and are absent from `indices`.
        """
        paths = [Path(p) for p in paths]
        chunks = iter(
            list(range(start, min(start + self.batch_size, len(paths))))
            for start in range(0, len(paths), self.batch_size)
        )
        if self.prefetch_workers == 0:
            for chunk in chunks:
                yield self._embed(self._prepare(paths, chunk), wait_s=0.0)
            return
        pool = ThreadPoolExecutor(self.prefetch_workers, thread_name_prefix="image-prefetch")
        pending: deque[Future[_PreparedBatch]] = deque()

        def submit_next() -> None:
            chunk = next(chunks, None)
            if chunk is not None:
                pending.append(pool.submit(self._prepare, paths, chunk))

        try:
            # One batch per worker in flight plus one ready and waiting: bounded memory.
            for _ in range(self.prefetch_workers + 1):
                submit_next()
            while pending:
                started = time.perf_counter()
                prepared = pending.popleft().result()
                waited = time.perf_counter() - started
                submit_next()
                yield self._embed(prepared, wait_s=waited)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def embed_all(self, paths: Sequence[Path | str]) -> ImageBatchResult:
        """`embed_images` gathered into one result."""
        return ImageBatchResult.concatenate(list(self.embed_images(paths)), self.embedding_dim)

    def _prepare(self, paths: Sequence[Path], chunk: Sequence[int]) -> _PreparedBatch:
        """Read, decode and preprocess one batch (runs on a prefetch thread)."""
        indices: list[int] = []
        images: list[np.ndarray] = []
        errors: dict[int, str] = {}
        for index in chunk:
            try:
                images.append(read_image(paths[index], order="rgb"))
                indices.append(index)
            except Exception as error:
                errors[index] = _unreadable(paths[index], error)
        if not images:
            return _PreparedBatch([], None, errors)
        try:
            inputs = dict(self.image_processor(images, return_tensors="pt"))
        except Exception:
            # Find the image the processor rejects instead of losing the whole batch.
            inputs, indices = self._preprocess_one_by_one(paths, indices, images, errors)
        return _PreparedBatch(indices, self._stage(inputs) if indices else None, errors)

    def _preprocess_one_by_one(
        self,
        paths: Sequence[Path],
        indices: list[int],
        images: list[np.ndarray],
        errors: dict[int, str],
    ) -> tuple[dict[str, Any], list[int]]:
        import torch

        kept: list[int] = []
        parts: list[dict[str, Any]] = []
        for index, image in zip(indices, images, strict=True):
            try:
                parts.append(dict(self.image_processor([image], return_tensors="pt")))
                kept.append(index)
            except Exception as error:
                errors[index] = _unreadable(paths[index], error, what="preprocessed")
        if not parts:
            return {}, []
        return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}, kept

    def _stage(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """On CUDA, cast and pin on the prefetch thread so the copy overlaps the model."""
        if self.device.type != "cuda":
            return inputs
        return {
            key: (value.to(self.loaded.dtype) if value.is_floating_point() else value).pin_memory()
            for key, value in inputs.items()
        }

    def _embed(self, prepared: _PreparedBatch, *, wait_s: float) -> ImageBatchResult:
        import torch

        if prepared.inputs is None:
            return ImageBatchResult(
                indices=np.zeros(0, np.int64),
                embeddings=np.zeros((0, self.embedding_dim), np.float32),
                errors=prepared.errors,
                wait_s=wait_s,
            )
        started = time.perf_counter()
        with torch.inference_mode():
            inputs = {
                key: value.to(
                    self.device,
                    dtype=self.loaded.dtype if value.is_floating_point() else value.dtype,
                    non_blocking=True,
                )
                for key, value in prepared.inputs.items()
            }
            features = self._image_features(inputs)
            embeddings = _normalised_numpy(features)
        return ImageBatchResult(
            indices=np.asarray(prepared.indices, dtype=np.int64),
            embeddings=embeddings,
            errors=prepared.errors,
            wait_s=wait_s,
            model_s=time.perf_counter() - started,
        )

    def _image_features(self, inputs: dict[str, Any]) -> Any:
        """Pooled image features, one row per image (DINOv2/DINOv3: the normalised CLS token)."""
        return _pooled(self.model(**inputs))


class SiglipScorer(ImageEmbedder):
    """SigLIP / SigLIP2 prompt probabilities for frames.

    Scores are sigmoid(img @ txt.T * exp(logit_scale) + logit_bias) on L2-normalised embeddings,
    in float32, as the reference system computed them.
    """

    processor_class_name = "AutoProcessor"

    def __init__(self, model_ref: str | os.PathLike[str], **options: Any):
        """`options` as for ImageEmbedder: device, dtype, batch_size, prefetch_workers, revision."""
        super().__init__(model_ref, **options)
        missing = [
            name
            for name in ("get_text_features", "get_image_features", "logit_scale", "logit_bias")
            if not hasattr(self.model, name)
        ]
        if missing or not hasattr(self.loaded.processor, "tokenizer"):
            raise ValueError(
                f"Model {self.loaded.source.reference} ({type(self.model).__name__}) is not a "
                "SigLIP image-text model: it lacks "
                + ", ".join(missing or ["a tokenizer in its processor"])
            )
        self.logit_scale = float(self.model.logit_scale.detach().float().cpu().reshape(-1)[0])
        self.logit_bias = float(self.model.logit_bias.detach().float().cpu().reshape(-1)[0])
        text_positions = getattr(self.model.config.text_config, "max_position_embeddings", None)
        self.text_max_length = min(TEXT_MAX_LENGTH, text_positions or TEXT_MAX_LENGTH)

    def embed_texts(self, prompts: Sequence[str]) -> np.ndarray:
        """(P, D) L2-normalised float32 embeddings of the lower-cased prompts."""
        import torch

        if isinstance(prompts, str):
            raise TypeError("embed_texts takes a sequence of prompts, not a single string")
        tokenizer = self.loaded.processor.tokenizer
        rows = [np.zeros((0, self.embedding_dim), np.float32)]
        for start in range(0, len(prompts), self.batch_size):
            texts = [prompt.lower() for prompt in prompts[start : start + self.batch_size]]
            tokens = tokenizer(
                texts,
                padding="max_length",
                max_length=self.text_max_length,
                truncation=True,
                return_tensors="pt",
            )
            with torch.inference_mode():
                inputs = {
                    key: tokens[key].to(self.device)
                    for key in ("input_ids", "attention_mask")
                    if key in tokens
                }
                rows.append(_normalised_numpy(_pooled(self.model.get_text_features(**inputs))))
        return np.concatenate(rows)

    def score(self, image_embeddings: np.ndarray, text_embeddings: np.ndarray) -> np.ndarray:
        """(N, P) probabilities in [0, 1] for N image and P prompt embeddings."""
        return sigmoid_scores(
            image_embeddings,
            text_embeddings,
            logit_scale=self.logit_scale,
            logit_bias=self.logit_bias,
        )

    def _image_features(self, inputs: dict[str, Any]) -> Any:
        return _pooled(self.model.get_image_features(**inputs))


def _pooled(output: Any) -> Any:
    """The pooled features of a model output, or the tensor itself.

    transformers 5 returns an output object from get_image_features / get_text_features where
    4.x returned a tensor (reference bug 2); both are accepted.
    """
    import torch

    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        raise TypeError(f"{type(output).__name__} has no pooler_output to embed with")
    return pooled


def _normalised_numpy(features: Any) -> np.ndarray:
    import torch

    vectors = torch.nn.functional.normalize(features.float(), dim=-1)
    return vectors.cpu().numpy().astype(np.float32, copy=False)


def _unreadable(path: Path, error: Exception, *, what: str = "read") -> str:
    if isinstance(error, ImageReadError):
        return str(error)
    if isinstance(error, FileNotFoundError):
        reason = "file not found"
    elif isinstance(error, IsADirectoryError):
        reason = "is a directory"
    else:
        reason = str(error) or type(error).__name__
    return f"Image {path.name} could not be {what}: {reason} (file {path})"
