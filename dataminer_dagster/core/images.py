"""Frame images on disk: encode and write JPEG, PNG or WebP, read any of them back as an array.

Every stage that reads frames goes through `list_images` and `read_image`, so a frame directory
written in any supported format works everywhere (a stage that looked for *.jpg alone would
find no WebP frame). Arrays are uint8 height x width x 3; OpenCV's BGR
channel order unless `order="rgb"` is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # numpy is imported where an image is decoded: the CLI reads the formats only
    import numpy as np

ImageFormat = Literal["jpg", "png", "webp"]
ChannelOrder = Literal["rgb", "bgr"]

IMAGE_FORMATS: tuple[str, ...] = ("jpg", "png", "webp")
IMAGE_SUFFIXES: frozenset[str] = frozenset({".jpg", ".jpeg", ".png", ".webp"})

# zlib level 3 is several times faster than 6 on noisy frames and only a few percent larger.
PNG_COMPRESSION = 3
# Sharpness is measured at a fixed scale so that frames of different resolutions compare.
SHARPNESS_SIDE = 512


class ImageReadError(ValueError):
    """An image file that cannot be read. The message names the file and the reason."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"Image {self.path.name} could not be read: {reason} (file {self.path})")


def image_format_of(path: Path) -> ImageFormat:
    """The format written for `path`, from its suffix (`.jpeg` counts as jpg)."""
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        allowed = ", ".join(sorted(IMAGE_SUFFIXES))
        raise ValueError(f"Unsupported image suffix {suffix!r} for {path}; allowed: {allowed}")
    return "jpg" if suffix == ".jpeg" else suffix[1:]  # type: ignore[return-value]


def fit_within(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """(width, height) scaled down, keeping the aspect ratio, so the longest side is <= max_side."""
    longest = max(width, height)
    if max_side is None or longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


def resize_to_max_side(image: np.ndarray, max_side: int | None) -> np.ndarray:
    import cv2

    height, width = image.shape[:2]
    size = fit_within(width, height, max_side)
    if size == (width, height):
        return image
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def encode_image(
    image: np.ndarray,
    image_format: ImageFormat,
    *,
    quality: int = 95,
    max_side: int | None = None,
    order: ChannelOrder = "bgr",
) -> bytes:
    """Encode a uint8 image. `quality` (1-100) applies to jpg and webp; png is lossless."""
    import cv2

    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"Unsupported image_format {image_format!r}; allowed: jpg, png, webp")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be between 1 and 100, got {quality}")
    image = resize_to_max_side(image, max_side)
    if order == "rgb" and image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    params = {
        "jpg": [cv2.IMWRITE_JPEG_QUALITY, quality],
        "png": [cv2.IMWRITE_PNG_COMPRESSION, PNG_COMPRESSION],
        "webp": [cv2.IMWRITE_WEBP_QUALITY, quality],
    }[image_format]
    ok, encoded = cv2.imencode(f".{image_format}", image, params)
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} image as {image_format}")
    return encoded.tobytes()


def write_image(
    path: Path,
    image: np.ndarray,
    *,
    quality: int = 95,
    max_side: int | None = None,
    order: ChannelOrder = "bgr",
) -> bytes:
    """Write `image` in the format named by the suffix of `path`; return the bytes written."""
    data = encode_image(
        image, image_format_of(path), quality=quality, max_side=max_side, order=order
    )
    Path(path).write_bytes(data)
    return data


def decode_image(data: bytes, *, order: ChannelOrder = "rgb") -> np.ndarray | None:
    """Decode JPEG, PNG or WebP bytes to a height x width x 3 array; None if they are not an image."""
    import cv2
    import numpy as np

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        return None
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if order == "rgb" else image


def read_image(path: Path, *, order: ChannelOrder = "rgb") -> np.ndarray:
    """Read a JPEG, PNG or WebP file as uint8 height x width x 3, RGB by default."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageReadError(path, "file not found") from None
    if not data:
        raise ImageReadError(path, "file is empty (0 bytes)")
    image = decode_image(data, order=order)
    if image is None:
        raise ImageReadError(path, "not a readable JPEG, PNG or WebP image")
    return image


def is_image_path(path: Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def list_images(directory: Path) -> list[Path]:
    """Image files (any supported format) directly inside `directory`, sorted by name."""
    return sorted(p for p in Path(directory).iterdir() if is_image_path(p) and p.is_file())


def picture_measures(image: np.ndarray) -> tuple[float, float]:
    """(sharpness, brightness) of a BGR (or grey) picture, from one grey copy scaled to a longest
    side of 512: the variance of its Laplacian (higher is sharper) and its mean level (0 black,
    255 white). Both cost little beside the frame's encoding, which is why extraction measures
    them."""
    import cv2

    grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    grey = resize_to_max_side(grey, SHARPNESS_SIDE)
    return float(cv2.Laplacian(grey, cv2.CV_64F).var()), float(grey.mean())


def brightness_of_file(path: Path) -> float:
    """The mean grey level (0-255) of an image file, for frames extracted before extraction
    measured it. A JPEG is decoded at an eighth of its size (libjpeg keeps each 8x8 block's
    mean while scaling, so the mean moves by a fraction of a level); OpenCV reduces other formats
    by picking pixels, which moves it more, so they are decoded whole."""
    import cv2

    reduced = image_format_of(path) == "jpg"
    grey = cv2.imread(
        str(path), cv2.IMREAD_REDUCED_GRAYSCALE_8 if reduced else cv2.IMREAD_GRAYSCALE
    )
    if grey is None:
        raise ImageReadError(Path(path), "not a readable JPEG, PNG or WebP image")
    return float(grey.mean())
