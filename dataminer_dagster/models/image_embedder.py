"""Image embeddings for frames on disk, batched and prefetched.

`ImageEmbedder` embeds frames with any transformers vision backbone whose output has a
`pooler_output` (DINOv2, DINOv3), for the dedup stage; `siglip.SiglipScorer` is an ImageEmbedder
that also embeds prompts.

Frames are read, decoded and preprocessed by the embedder's threads (kept across calls,
`models.device.PrefetchThreads`) a few batches ahead of the model (a bounded queue of futures
consumed in input order), so the model does not wait on JPEG decoding. A frame that cannot be
read is reported with its index and the reason and left out of its batch; it never fails the
batch, so one bad file costs one frame, not a batch. On CUDA the threads may only read the files and leave decoding and
preprocessing to the GPU (`models.device_preprocessing`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dataminer_dagster.core.images import ImageReadError, read_image
from dataminer_dagster.models.device import (
    CudaMemory,
    DeviceMemory,
    DevicePlan,
    PrefetchThreads,
    decodes_jpeg,
    finish_stream,
    plan_batch_size,
    side_stream,
)
from dataminer_dagster.models.device_preprocessing import (
    DevicePreprocessing,
    decode_jpegs,
    device_input_path,
    jpeg_bytes,
    merge_rows,
)
from dataminer_dagster.models.loading import LoadedModel, load_pretrained

# Prefetch threads on the CPU, where they share the cores with the model (bench/filter.py), and
# on CUDA when the GPU decodes (bench/gpu.md).
CPU_PREFETCH_WORKERS = 2


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


def default_prefetch_workers(device_type: str, cpus: int | None, *, decodes_on_device: bool) -> int:
    """Prefetch threads for a model on `device_type` on a machine with `cpus` cores.

    On the CPU the threads compete with the model for the cores, so a fixed few. When the GPU
    decodes, the threads only read files, and more of them only crowd the GPU with
    preprocessing (bench/gpu.md measures both counts). A GPU model fed by
    the CPU path (naflex, DINO) gets half the cores, at most 8.
    """
    if device_type != "cuda" or decodes_on_device:
        return CPU_PREFETCH_WORKERS
    return max(CPU_PREFETCH_WORKERS, min(8, (cpus or 1) // 2))


def _available_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


DEFAULT_BATCH_SIZE = 32  # images per model call without memory figures (the CPU)
AUTO_BATCH_LIMIT = 64  # the most images per call that free memory may give on a GPU
# Side of the blank frames that size the batch: the processors resize (naflex: and pad) every
# frame to the model's input, so any size gives the same batch.
BLANK_FRAME_SIDE = 224


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
        batch_size: int | None = None,
        prefetch_workers: int | None = None,
        decode_on_device: bool | None = None,
        revision: str | None = None,
        memory: DeviceMemory | None = None,
    ):
        """`batch_size`: the most images per model call; None: as many as fit in half the free
        memory of a CUDA device, up to AUTO_BATCH_LIMIT (DEFAULT_BATCH_SIZE elsewhere).
        `memory`: the device's memory figures (default: CUDA's, none elsewhere); with them the
        batch is what fits of the limit. `prefetch_workers`: None chooses from the device and the
        cores (`default_prefetch_workers`). `decode_on_device`: decode JPEGs and preprocess on the
        model's device; None does so on CUDA where the processor allows (`DevicePreprocessing`).
        """
        import transformers

        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch_workers is not None and prefetch_workers < 0:
            raise ValueError(f"prefetch_workers must not be negative, got {prefetch_workers}")
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
        self.device_preprocessing = self._device_preprocessing(decode_on_device)
        if prefetch_workers is None:
            prefetch_workers = default_prefetch_workers(
                self.device.type,
                _available_cpus(),
                decodes_on_device=self.device_preprocessing is not None,
            )
        self.prefetch_workers = prefetch_workers
        self._prefetch = PrefetchThreads(prefetch_workers, "image-prefetch")
        if memory is None and self.device.type == "cuda":
            memory = CudaMemory(self.device)
        limit = batch_size or (AUTO_BATCH_LIMIT if memory is not None else DEFAULT_BATCH_SIZE)
        plan = DevicePlan(self.device, self.loaded.dtype, False, 0, memory)
        self.batch_size = plan_batch_size(plan, limit, self._embed_blank)

    def _embed_blank(self, images: int) -> None:
        """Embed `images` blank frames as a real batch is (batch sizing): the model's own image
        processor gives every input it takes at its size (naflex: the patch mask and shapes;
        DINO: the crop), staged and moved to the device in the model's dtype."""
        frames = [np.zeros((BLANK_FRAME_SIDE, BLANK_FRAME_SIDE, 3), np.uint8)] * images
        inputs = self._stage(dict(self.image_processor(frames, return_tensors="pt")))
        self._embed(_PreparedBatch(list(range(images)), inputs, {}), wait_s=0.0)

    def _device_preprocessing(self, decode_on_device: bool | None) -> DevicePreprocessing | None:
        wanted = decode_on_device or (decode_on_device is None and self.device.type == "cuda")
        return device_input_path(
            self.image_processor,
            decode_on_device,
            device=self.device,
            jpeg_on_device=wanted and decodes_jpeg(self.device),
            model=self.loaded.source.reference,
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
        # One batch per worker in flight plus one ready and waiting: bounded memory.
        lead = self.prefetch_workers + 1
        prepare = functools.partial(self._prepare, paths)
        with contextlib.closing(self._prefetch.ahead(chunks, prepare, lead)) as futures:
            for _, future in futures:
                started = time.perf_counter()
                prepared = future.result()
                yield self._embed(prepared, wait_s=time.perf_counter() - started)

    def embed_all(self, paths: Sequence[Path | str]) -> ImageBatchResult:
        """`embed_images` gathered into one result."""
        return ImageBatchResult.concatenate(list(self.embed_images(paths)), self.embedding_dim)

    def _prepare(self, paths: Sequence[Path], chunk: Sequence[int]) -> _PreparedBatch:
        """Read, decode and preprocess one batch (runs on a prefetch thread)."""
        if self.device_preprocessing is None:
            return self._prepare_on_host(paths, chunk)
        return self._prepare_on_device(paths, chunk)

    def _prepare_on_device(self, paths: Sequence[Path], chunk: Sequence[int]) -> _PreparedBatch:
        """JPEGs decoded and preprocessed on the device; the other files as `_prepare_on_host`.

        On CUDA the work runs on a stream of this thread, finished before the batch is handed
        over, so the model's stream never waits on it.
        """
        encoded = {index: jpeg_bytes(paths[index]) for index in chunk}
        encoded = {index: data for index, data in encoded.items() if data is not None}
        with side_stream(self.device):
            decoded = decode_jpegs(encoded, self.device)
            rest = self._prepare_on_host(paths, [i for i in chunk if i not in decoded])
            pixels = None
            if decoded:
                pixels = self.device_preprocessing(list(decoded.values()), self.loaded.dtype)
            if rest.inputs is not None:
                host = rest.inputs["pixel_values"]
                host = host.to(self.device, dtype=self.loaded.dtype, non_blocking=True)
                pixels, indices = merge_rows(list(decoded), pixels, rest.indices, host)
            else:
                indices = list(decoded)
            # Done before the model sees it; the model's own .cpu() copy then finishes its use
            # of these tensors before they are freed.
            finish_stream(self.device)
        inputs = None if pixels is None else {"pixel_values": pixels}
        return _PreparedBatch(indices, inputs, rest.errors)

    def _prepare_on_host(self, paths: Sequence[Path], chunk: Sequence[int]) -> _PreparedBatch:
        """Read, decode (OpenCV) and preprocess (the PIL processor) on this thread."""
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
            embeddings = normalised_numpy(features)
        return ImageBatchResult(
            indices=np.asarray(prepared.indices, dtype=np.int64),
            embeddings=embeddings,
            errors=prepared.errors,
            wait_s=wait_s,
            model_s=time.perf_counter() - started,
        )

    def _image_features(self, inputs: dict[str, Any]) -> Any:
        """Pooled image features, one row per image (DINOv2/DINOv3: the normalised CLS token)."""
        return pooled_features(self.model(**inputs))


def pooled_features(output: Any) -> Any:
    """The pooled features of a model output, or the tensor itself.

    Depending on the transformers release, get_image_features / get_text_features return an
    output object or a tensor; both are accepted.
    """
    import torch

    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        raise TypeError(f"{type(output).__name__} has no pooler_output to embed with")
    return pooled


def normalised_numpy(features: Any) -> np.ndarray:
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
