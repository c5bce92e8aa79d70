"""Drawing the synthetic world (`core.world`): backgrounds, shapes, junk scenes, and the edits that
turn a source clip into a planted near-duplicate.

Every frame is drawn with a label map beside it (which object owns each pixel, 0 for none), and the
edits (crop, mirror, resize, overlay) transform both. An object's box is the bounding box of its
pixels in the label map after the last edit, so the truth is what the pixels show, occlusion
included, rather than what an edit's geometry predicts. Frames are BGR (OpenCV's order); colours
are named and given in RGB.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

import numpy as np

from dataminer_dagster.core.world_truth import ObjectTruth

SHAPES = ("circle", "square", "triangle", "star")
COLOURS = {  # RGB, saturated or bright: no background colour comes near them
    "red": (230, 30, 30),
    "green": (40, 190, 60),
    "blue": (40, 70, 230),
    "yellow": (240, 215, 30),
    "white": (245, 245, 245),
}
BACKGROUNDS = ("noise", "gradient", "stripes", "checks", "texture")
JUNK_KINDS = ("black", "blur", "text")
# Backgrounds are dull (low saturation) and within these levels, far from every object colour.
BACKGROUND_LEVELS = (20, 190)
# Fewer visible pixels than this and an object is not in the truth: a sliver is no box.
MIN_VISIBLE_PIXELS = 24
_WORDS = ("breaking", "news", "live", "today", "update", "weather", "sports", "market", "report")


@dataclass(frozen=True)
class ObjectSpec:
    """One moving object of a scene; positions and sizes are fractions of the frame."""

    shape: str
    colour: str
    x: float  # centre at the scene's start, fraction of the width
    y: float  # centre at the scene's start, fraction of the height
    vx: float  # fraction of the width per second (objects bounce off the borders)
    vy: float
    size: float  # half-extent at the scene's start, fraction of the shorter side
    growth: float  # relative change of size per second: the scale changes
    angle: float  # degrees


@dataclass(frozen=True)
class SceneSpec:
    start: float  # seconds in the source clip
    end: float
    seed: int
    background: str
    junk: str | None = None  # "black", "blur", "text"; None for a content scene
    objects: tuple[ObjectSpec, ...] = ()
    occluder: bool = False  # a bar sweeps across in front of the objects

    @property
    def kind(self) -> str:
        return "junk" if self.junk else "content"


@dataclass(frozen=True)
class SourceSpec:
    """A source clip: scenes back to back, cut where one ends and the next starts."""

    name: str
    width: int
    height: int
    fps: float
    scenes: tuple[SceneSpec, ...]
    noise: int = 6  # amplitude of the per-pixel noise, as a camera adds

    @property
    def duration(self) -> float:
        return self.scenes[-1].end

    @property
    def frame_count(self) -> int:
        return int(round(self.duration * self.fps))

    def scene_index(self, t: float) -> int:
        for index, scene in enumerate(self.scenes):
            if t < scene.end:
                return index
        return len(self.scenes) - 1


@dataclass
class Layers:
    """A frame being drawn and edited: pixels, the label map, and each object's whole area."""

    frame: np.ndarray  # H x W x 3 uint8, BGR
    labels: np.ndarray  # H x W int16: 0 for no object, i + 1 for objects[i]
    objects: tuple[ObjectSpec, ...]
    areas: list[float] = field(default_factory=list)  # pixels of each whole shape at this scale


def render_source(source: SourceSpec, t: float) -> Layers:
    """The source clip's frame at `t` seconds."""
    scene = source.scenes[source.scene_index(t)]
    height, width = source.height, source.width
    labels = np.zeros((height, width), np.int16)
    if scene.junk == "black":
        layers = Layers(np.zeros((height, width, 3), np.uint8), labels, ())
    elif scene.junk == "text":
        layers = Layers(_text_screen(scene, width, height), labels, ())
    else:
        layers = Layers(_background(scene, width, height).copy(), labels, scene.objects)
        _draw_objects(layers, scene, t - scene.start, min(width, height))
        if scene.occluder:
            _draw_occluder(layers, (t - scene.start) / (scene.end - scene.start))
        if scene.junk == "blur":
            layers = _blurred(layers)
    frame_number = int(round(t * source.fps))
    rng = np.random.default_rng((scene.seed, frame_number))
    noise = rng.integers(-source.noise, source.noise + 1, size=(height, width, 1), dtype=np.int16)
    layers.frame = np.clip(layers.frame.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return layers


def visible_objects(layers: Layers) -> tuple[ObjectTruth, ...]:
    """The objects with enough visible pixels, boxed tightly around those pixels."""
    found = []
    for index, spec in enumerate(layers.objects):
        ys, xs = np.nonzero(layers.labels == index + 1)
        if len(xs) < MIN_VISIBLE_PIXELS:
            continue
        x0, y0 = int(xs.min()), int(ys.min())
        box = (x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1)
        visible = min(1.0, len(xs) / max(layers.areas[index], 1.0))
        found.append(ObjectTruth(spec.shape, spec.colour, box, len(xs), round(visible, 3)))
    return tuple(found)


def bgr(colour: str) -> tuple[int, int, int]:
    red, green, blue = COLOURS[colour]
    return blue, green, red


# --- edits: each takes the layers of a frame and returns the edited layers -----------------------


class Edit:
    kind: ClassVar[str]

    def apply(self, layers: Layers) -> Layers:
        return layers

    def to_json(self) -> dict:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class Reencode(Edit):
    """The same pixels encoded at another quality (x264's constant rate factor)."""

    crf: int
    kind: ClassVar[str] = "reencode"


@dataclass(frozen=True)
class SpeedUp(Edit):
    """The clip played `factor` times faster; frame i shows the source at i / fps * factor."""

    factor: float
    kind: ClassVar[str] = "speed"


@dataclass(frozen=True)
class Resize(Edit):
    width: int
    height: int
    kind: ClassVar[str] = "resize"

    def apply(self, layers: Layers) -> Layers:
        import cv2

        height, width = layers.labels.shape
        size = (self.width, self.height)
        scale = self.width * self.height / (width * height)
        return replace(
            layers,
            frame=cv2.resize(layers.frame, size, interpolation=cv2.INTER_AREA),
            labels=cv2.resize(layers.labels, size, interpolation=cv2.INTER_NEAREST),
            areas=[area * scale for area in layers.areas],
        )


@dataclass(frozen=True)
class Crop(Edit):
    """Keep a window given in fractions of the frame (rounded to even pixels, as x264 needs)."""

    left: float
    top: float
    width: float
    height: float
    kind: ClassVar[str] = "crop"

    def window(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(x, y, width, height) in pixels of a `width` x `height` frame."""
        x, y = int(self.left * width), int(self.top * height)
        w, h = int(self.width * width) // 2 * 2, int(self.height * height) // 2 * 2
        return x, y, min(w, width - x), min(h, height - y)

    def apply(self, layers: Layers) -> Layers:
        x, y, w, h = self.window(layers.labels.shape[1], layers.labels.shape[0])
        return replace(
            layers,
            frame=np.ascontiguousarray(layers.frame[y : y + h, x : x + w]),
            labels=np.ascontiguousarray(layers.labels[y : y + h, x : x + w]),
        )


@dataclass(frozen=True)
class Mirror(Edit):
    kind: ClassVar[str] = "mirror"

    def apply(self, layers: Layers) -> Layers:
        return replace(
            layers,
            frame=np.ascontiguousarray(layers.frame[:, ::-1]),
            labels=np.ascontiguousarray(layers.labels[:, ::-1]),
        )


@dataclass(frozen=True)
class Overlay(Edit):
    """A broadcaster's banner with text along the bottom, hiding what is under it."""

    text: str
    kind: ClassVar[str] = "overlay"

    def banner_height(self, height: int) -> int:
        return max(14, height // 7)

    def apply(self, layers: Layers) -> Layers:
        import cv2

        height = layers.labels.shape[0]
        top = height - self.banner_height(height)
        frame, labels = layers.frame.copy(), layers.labels.copy()
        frame[top:] = (24, 24, 24)
        labels[top:] = 0
        cv2.putText(
            frame, self.text, (6, height - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1
        )
        return replace(layers, frame=frame, labels=labels)


EDITS: dict[str, type[Edit]] = {
    e.kind: e for e in (Reencode, SpeedUp, Resize, Crop, Mirror, Overlay)
}


def edit_from_json(data: dict) -> Edit:
    fields = {k: v for k, v in data.items() if k != "kind"}
    return EDITS[data["kind"]](**fields)


# --- drawing ------------------------------------------------------------------------------------


def _dull_colours(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` BGR colours of low saturation within BACKGROUND_LEVELS."""
    import cv2

    hsv = np.stack(
        [rng.integers(0, 180, count), rng.integers(15, 90, count), rng.integers(60, 185, count)],
        axis=1,
    ).astype(np.uint8)
    return cv2.cvtColor(hsv[None], cv2.COLOR_HSV2BGR)[0].astype(np.float32)


@functools.lru_cache(maxsize=16)
def _background(scene: SceneSpec, width: int, height: int) -> np.ndarray:
    """A scene's still background (cached: every frame of the scene draws on a copy of it)."""
    import cv2

    rng = np.random.default_rng(scene.seed)
    first, second = _dull_colours(rng, 2)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    if scene.background == "noise":
        grain = rng.normal(0, 28, size=(height, width, 1)).astype(np.float32)
        image = first + cv2.GaussianBlur(grain, (0, 0), 1.2)[..., None]
    elif scene.background == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        ramp = xs * np.cos(angle) + ys * np.sin(angle)
        ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1.0)
        image = first + (second - first) * ramp[..., None]
    elif scene.background == "stripes":
        angle, period = rng.uniform(0, np.pi), rng.uniform(10, 24)
        phase = (xs * np.cos(angle) + ys * np.sin(angle)) / period
        image = np.where((np.floor(phase) % 2 == 0)[..., None], first, second)
    elif scene.background == "checks":
        cell = int(rng.integers(12, 25))
        odd = (xs // cell + ys // cell) % 2 == 1
        image = np.where(odd[..., None], first, second)
    elif scene.background == "texture":
        coarse = rng.uniform(0, 1, size=(6, 8)).astype(np.float32)
        blend = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
        grain = rng.normal(0, 10, size=(height, width)).astype(np.float32)
        image = first + (second - first) * np.clip(blend, 0, 1)[..., None] + grain[..., None]
    else:
        raise ValueError(f"unknown background {scene.background!r}; one of {BACKGROUNDS}")
    return np.clip(image, *BACKGROUND_LEVELS).astype(np.uint8)


def _bounce(position: float, low: float = 0.1, high: float = 0.9) -> float:
    """`position` folded back into [low, high], as a ball bouncing between two walls."""
    span = high - low
    phase = (position - low) % (2 * span)
    return low + (phase if phase <= span else 2 * span - phase)


def _draw_objects(layers: Layers, scene: SceneSpec, local_t: float, side: int) -> None:
    import cv2

    height, width = layers.labels.shape
    mask = np.zeros((height, width), np.uint8)
    for index, obj in enumerate(scene.objects):
        cx = _bounce(obj.x + obj.vx * local_t) * width
        cy = _bounce(obj.y + obj.vy * local_t) * height
        radius = max(5.0, min(0.4, obj.size * (1 + obj.growth * local_t)) * side)
        mask[:] = 0
        if obj.shape == "circle":
            cv2.circle(mask, (round(cx), round(cy)), round(radius), 1, -1, cv2.LINE_8)
            area = np.pi * round(radius) ** 2
        else:
            points = _polygon(obj.shape, cx, cy, radius, obj.angle)
            cv2.fillPoly(mask, [np.round(points).astype(np.int32)], 1, cv2.LINE_8)
            area = float(cv2.contourArea(points.astype(np.float32)))
        drawn = mask.astype(bool)
        layers.frame[drawn] = bgr(obj.colour)
        layers.labels[drawn] = index + 1
        layers.areas.append(area)


def _polygon(shape: str, cx: float, cy: float, radius: float, angle: float) -> np.ndarray:
    """Vertices of a square (half side `radius`), triangle or five-pointed star (outer radius)."""
    if shape == "square":
        corners = np.radians(angle + 45 + 90 * np.arange(4))
        radii = np.full(4, radius * np.sqrt(2))
    elif shape == "triangle":
        corners = np.radians(angle - 90 + 120 * np.arange(3))
        radii = np.full(3, radius)
    elif shape == "star":
        corners = np.radians(angle - 90 + 36 * np.arange(10))
        radii = np.where(np.arange(10) % 2 == 0, radius, radius * 0.45)
    else:
        raise ValueError(f"unknown shape {shape!r}; one of {SHAPES}")
    return np.stack([cx + radii * np.cos(corners), cy + radii * np.sin(corners)], axis=1)


def _draw_occluder(layers: Layers, progress: float) -> None:
    """A dark grey pillar sweeping left to right over the scene, in front of every object."""
    height, width = layers.labels.shape
    bar = max(8, width // 8)
    left = int(-bar + (width + bar) * progress)
    x0, x1 = max(0, left), min(width, left + bar)
    layers.frame[:, x0:x1] = (70, 70, 70)
    layers.labels[:, x0:x1] = 0


def _blurred(layers: Layers) -> Layers:
    """Out of focus: nothing in it is worth a box."""
    import cv2

    sigma = 0.05 * min(layers.labels.shape)
    frame = cv2.GaussianBlur(layers.frame, (0, 0), sigma)
    return Layers(frame, np.zeros_like(layers.labels), ())


def _text_screen(scene: SceneSpec, width: int, height: int) -> np.ndarray:
    """A plain screen filled with lines of words."""
    import cv2

    rng = np.random.default_rng(scene.seed)
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = _dull_colours(rng, 1)[0].astype(np.uint8)
    ink = (255, 255, 255) if frame[0, 0].mean() < 110 else (0, 0, 0)
    for y in range(18, height, 18):
        line = " ".join(rng.choice(_WORDS, size=4))
        cv2.putText(frame, line, (4, y), cv2.FONT_HERSHEY_SIMPLEX, 0.45, ink, 1)
    return frame
