"""Decoding and preprocessing images on the model's device, for `image_embedder.ImageEmbedder`.

On CUDA, with a fixed-size SigLIP processor, the embedder's prefetch threads only read the files:
JPEGs are decoded in batches by nvjpeg (`decode_jpegs`) and resized and normalised on the GPU by
`DevicePreprocessing`, which equals the PIL processor up to its rounding. Other formats, JPEGs
with EXIF data and JPEGs nvjpeg rejects take the CPU path one by one, which reports unreadable
files as before. Elsewhere (the CPU, naflex and DINO processors, a torchvision without nvjpeg)
preprocessing stays on the CPU (`device_input_path` decides).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Images resized together on the device: bounds the float32 copies of full-size frames.
DEVICE_RESIZE_CHUNK = 16
# EXIF data (orientation) sits in an APP1 segment near the start; such files take the CPU path.
_EXIF_MARKER = b"Exif\x00\x00"
_EXIF_SEARCH_BYTES = 65_536


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


def jpeg_bytes(path: Path) -> Any:
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


def decode_jpegs(encoded: dict[int, Any], device: Any) -> dict[int, Any]:
    """Decoded CHW uint8 RGB images on `device` by input position; those the decoder rejects are
    left out (the CPU path reads them again and says why they fail)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return {}
    try:
        images = decode_jpeg(list(encoded.values()), mode=ImageReadMode.RGB, device=device)
        return dict(zip(encoded, images, strict=True))
    except RuntimeError:  # one bad file fails the whole batched call
        decoded = {}
        for index, data in encoded.items():
            with contextlib.suppress(RuntimeError):
                decoded[index] = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return decoded


def merge_rows(
    first: list[int], first_rows: Any, second: list[int], second_rows: Any
) -> tuple[Any, list[int]]:
    """Two sets of rows by input position as one tensor in input order, and the positions."""
    import torch

    rows = dict(zip(second, second_rows, strict=True))
    if first_rows is not None:
        rows.update(zip(first, first_rows, strict=True))
    indices = sorted(rows)
    return torch.stack([rows[index] for index in indices]), indices
