"""SigLIP / SigLIP2 prompt scoring and image embeddings for frames on disk.

`SiglipScorer` embeds prompts and frames with a transformers SiglipModel (the fixed-resolution
SigLIP2 checkpoints such as google/siglip2-so400m-patch14-384) or Siglip2Model (the naflex
checkpoints) and turns them into per-prompt probabilities. `ImageEmbedder` does the image half
for any transformers vision backbone whose output has a `pooler_output` (DINOv2, DINOv3), for the
dedup stage.

Frames are read, decoded and preprocessed by the embedder's threads (kept across calls,
`models.device.PrefetchThreads`) a few batches ahead of the model (a bounded queue of futures
consumed in input order), so the model does not wait on JPEG decoding. A frame that cannot be
read is reported with its index and the reason and left out of its batch; it never fails the
batch (reference bug 24).

On CUDA, with a fixed-size SigLIP processor, the threads only read the files: JPEGs are decoded
in batches by nvjpeg (`torchvision.io.decode_jpeg`) and resized and normalised on the GPU by
`DevicePreprocessing`, which equals the PIL processor up to its rounding. Other formats, JPEGs
with EXIF data and JPEGs nvjpeg rejects take the CPU path one by one, which reports unreadable
files as before. Elsewhere (the CPU, naflex and DINO processors, a torchvision without nvjpeg)
preprocessing stays on the CPU (`device_input_path` decides).
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

from dataminer_dagster.core.filter_rule import sigmoid_scores
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
from dataminer_dagster.models.loading import LoadedModel, load_pretrained

# SigLIP2 was trained on prompts padded to 64 tokens; the text tower has 64 positions.
TEXT_MAX_LENGTH = 64
# Prefetch threads on the CPU, where they share the cores with the model (bench/filter.py), and
# on CUDA when the GPU decodes (bench/gpu.md).
CPU_PREFETCH_WORKERS = 2
# Images resized together on the device: bounds the float32 copies of full-size frames.
DEVICE_RESIZE_CHUNK = 16
# EXIF data (orientation) sits in an APP1 segment near the start; such files take the CPU path.
_EXIF_MARKER = b"Exif\x00\x00"
_EXIF_SEARCH_BYTES = 65_536


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
    preprocessing (H200, bench/gpu.md: 0.950x of bare with 2, 0.920x with 8). A GPU model fed by
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


@dataclass(frozen=True)
class DevicePreprocessing:
    """A fixed-size SigLIP image processor as tensor ops on decoded CHW uint8 images.

    As the PIL processor: resize to height x width with its filter (antialiased, as PIL
    resamples), one axis at a time in Pillow's order, each pass rounded to uint8 levels as
    Pillow's; rescale; normalise. Pillow's fixed-point weights make up to a few percent of the
    pixels differ by one level (the tests bound it). On CUDA the input comes from nvjpeg, whose
    pixels may differ from libjpeg-turbo's (OpenCV) by a level or so as well.
    """

    height: int
    width: int
    mode: str  # torch.nn.functional.interpolate mode: "bilinear" or "bicubic"
    rescale_factor: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, processor: Any) -> DevicePreprocessing | None:
        """The equivalent of `processor`, or None where it is not a fixed-size SigLIP processor
        (Siglip2's naflex processor keeps the aspect ratio; DINO's crops)."""
        size = getattr(processor, "size", None) or {}
        keys = ("height", "width", "shortest_edge", "longest_edge", "max_height", "max_width")
        # a dict, or transformers 5's SizeDict
        fields = {
            key: size.get(key) if isinstance(size, dict) else getattr(size, key, None)
            for key in keys
        }
        given = {key for key, value in fields.items() if value}
        modes = {2: "bilinear", 3: "bicubic"}  # PIL's BILINEAR and BICUBIC
        if (
            not type(processor).__name__.startswith("SiglipImageProcessor")
            or given != {"height", "width"}
            or not (processor.do_resize and processor.do_rescale and processor.do_normalize)
            or getattr(processor, "do_center_crop", False)
            or getattr(processor, "do_pad", False)
            or int(processor.resample) not in modes
        ):
            return None
        channels = 3
        mean, std = processor.image_mean, processor.image_std
        return cls(
            height=int(fields["height"]),
            width=int(fields["width"]),
            mode=modes[int(processor.resample)],
            rescale_factor=float(processor.rescale_factor),
            mean=tuple(float(m) for m in np.broadcast_to(mean, channels)),
            std=tuple(float(s) for s in np.broadcast_to(std, channels)),
        )

    def __call__(self, images: Sequence[Any], dtype: Any) -> Any:
        """(N, 3, height, width) pixel values in `dtype` on the images' device."""
        import torch

        device = images[0].device
        mean = torch.tensor(self.mean, device=device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=device).view(1, -1, 1, 1)
        out = torch.empty((len(images), 3, self.height, self.width), dtype=dtype, device=device)
        for start in range(0, len(images), DEVICE_RESIZE_CHUNK):
            part = images[start : start + DEVICE_RESIZE_CHUNK]
            resized = torch.cat([self._resize(image) for image in _same_size_runs(part)])
            pixels = resized.mul_(self.rescale_factor)
            out[start : start + len(part)] = pixels.sub_(mean).div_(std)
        return out

    def _resize(self, images: Any) -> Any:
        """One axis at a time, each pass rounded to uint8 levels, as Pillow resamples uint8."""
        import torch

        resized = images.float()
        for size in self._pass_sizes(*images.shape[-2:]):
            if tuple(resized.shape[-2:]) != size:
                resized = torch.nn.functional.interpolate(
                    resized, size=size, mode=self.mode, align_corners=False, antialias=True
                )
                # Pillow rounds halves up; ties are common where the weights are dyadic.
                resized = resized.add_(0.5).floor_().clamp_(0, 255)
        return resized

    def _pass_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """Pillow's order: height first where it shrinks more than the width, else width first."""
        if height > self.height and height / self.height > width / self.width:
            return [(self.height, width), (self.height, self.width)]
        return [(height, self.width), (self.height, self.width)]


def _same_size_runs(images: Sequence[Any]) -> Iterator[Any]:
    """Consecutive images of one size stacked (N, C, H, W): one resize for a video's frames."""
    import torch

    start = 0
    for end in range(1, len(images) + 1):
        if end == len(images) or images[end].shape != images[start].shape:
            yield torch.stack(list(images[start:end]))
            start = end


def device_input_path(
    processor: Any,
    decode_on_device: bool | None,
    *,
    device: Any,
    jpeg_on_device: bool,
    model: str,
) -> DevicePreprocessing | None:
    """Where a batch is decoded and preprocessed: on `device` (the returned preprocessing) or on
    the CPU (None).

    None for `decode_on_device` means on the device when it is a GPU, torchvision decodes JPEGs
    there (`jpeg_on_device`: nvjpeg) and the processor is a fixed-size SigLIP one; otherwise the CPU
    path, which always works. True insists and says why it cannot be done; False never.
    """
    if decode_on_device is False or (decode_on_device is None and device.type != "cuda"):
        return None
    preprocessing = DevicePreprocessing.of(processor)
    if decode_on_device:
        if preprocessing is None:
            raise ValueError(
                f"decode_on_device=True needs a fixed-size SigLIP image processor; model "
                f"{model} has {type(processor).__name__}. Leave decode_on_device unset to "
                "preprocess its images on the CPU."
            )
        if not jpeg_on_device:
            raise ValueError(
                f"decode_on_device=True but torchvision cannot decode JPEGs on {device} (no "
                "nvjpeg in this torchvision build). Leave decode_on_device unset to decode on "
                "the CPU."
            )
    return preprocessing if jpeg_on_device else None


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
        encoded = {index: _jpeg_bytes(paths[index]) for index in chunk}
        encoded = {index: data for index, data in encoded.items() if data is not None}
        with side_stream(self.device):
            decoded = self._decode_jpegs(encoded)
            rest = self._prepare_on_host(paths, [i for i in chunk if i not in decoded])
            pixels = None
            if decoded:
                pixels = self.device_preprocessing(list(decoded.values()), self.loaded.dtype)
            if rest.inputs is not None:
                host = rest.inputs["pixel_values"]
                host = host.to(self.device, dtype=self.loaded.dtype, non_blocking=True)
                pixels, indices = _merge_rows(list(decoded), pixels, rest.indices, host)
            else:
                indices = list(decoded)
            # Done before the model sees it; the model's own .cpu() copy then finishes its use
            # of these tensors before they are freed.
            finish_stream(self.device)
        inputs = None if pixels is None else {"pixel_values": pixels}
        return _PreparedBatch(indices, inputs, rest.errors)

    def _decode_jpegs(self, encoded: dict[int, Any]) -> dict[int, Any]:
        """Decoded CHW uint8 RGB images on the device by input position; those the decoder
        rejects are left out (the CPU path reads them again and says why they fail)."""
        from torchvision.io import ImageReadMode, decode_jpeg

        if not encoded:
            return {}
        try:
            images = decode_jpeg(list(encoded.values()), mode=ImageReadMode.RGB, device=self.device)
            return dict(zip(encoded, images, strict=True))
        except RuntimeError:  # one bad file fails the whole batched call
            decoded = {}
            for index, data in encoded.items():
                with contextlib.suppress(RuntimeError):
                    decoded[index] = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
            return decoded

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


def _merge_rows(
    first: list[int], first_rows: Any, second: list[int], second_rows: Any
) -> tuple[Any, list[int]]:
    """Two sets of rows by input position as one tensor in input order, and the positions."""
    import torch

    rows = dict(zip(second, second_rows, strict=True))
    if first_rows is not None:
        rows.update(zip(first, first_rows, strict=True))
    indices = sorted(rows)
    return torch.stack([rows[index] for index in indices]), indices


def _jpeg_bytes(path: Path) -> Any:
    """The file as a uint8 tensor when it is a JPEG without EXIF data, else None.

    EXIF orientation is applied by OpenCV and not by nvjpeg, so such files keep the CPU path, as
    do files that cannot be read (the CPU path reports why).
    """
    import torch

    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(b"\xff\xd8\xff") or _EXIF_MARKER in data[:_EXIF_SEARCH_BYTES]:
        return None
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


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
