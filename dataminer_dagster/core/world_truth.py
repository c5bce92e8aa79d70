"""The ground truth of the synthetic world (`core.world`): what each frame of a video shows.

One truth file per video, `<video>.truth.json`, written beside the video:

```
{
  "format": "dataminer-world-truth/1",
  "video": "v03.mp4",              file name of the video
  "source": "s01",                 the source clip it was rendered from
  "edits": [{"kind": "mirror"}],   edits applied to the source, in order (core.world_render)
  "width": 256, "height": 192, "fps": 10.0,
  "frames": [                      one entry per frame, in order; frame i is shown from i / fps
    {"index": 0, "t": 0.0,         frame number and presentation time (s) in this video
     "source_t": 0.0,              the time of the source clip it shows (a sped-up copy differs)
     "scene": 0,                   scene number within the source clip
     "kind": "content",            "content", or "junk" (nothing a dataset wants)
     "junk": null,                 for junk: "black", "blur" or "text"
     "background": "stripes",      what the objects stand on
     "group": "s01/0",             duplicate group: frames of one source scene, whatever the edit
     "objects": [                  visible objects, in drawing order (later ones occlude earlier)
       {"shape": "circle", "colour": "red",
        "box": [x, y, w, h],       pixels of this video's frame, tight around the visible pixels
        "area": 412,               visible pixels
        "visible": 0.93}           visible pixels / pixels of the whole shape at this scale
     ]}
  ]
}
```

`VideoTruth.at(t)` answers "what does the frame shown at time t hold", so a frame the pipeline
sampled at any timestamp can be matched to its truth. `caption` says a frame's truth in words
("a red circle and a blue square on stripes"), as prompts and training captions do.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRUTH_FORMAT = "dataminer-world-truth/1"
# How a caption names each background and junk scene.
BACKGROUND_WORDS = {
    "noise": "noise",
    "gradient": "a gradient",
    "stripes": "stripes",
    "checks": "a checkerboard",
    "texture": "a texture",
}
JUNK_CAPTIONS = {"black": "a black screen", "blur": "a blurry photo", "text": "a screen of text"}
# A timestamp may sit this far outside a video (container rounding) and still name a frame.
TIME_TOLERANCE_S = 1e-3


@dataclass(frozen=True)
class ObjectTruth:
    shape: str
    colour: str
    box: tuple[int, int, int, int]  # x, y, width, height in pixels
    area: int  # visible pixels
    visible: float  # visible fraction of the whole shape

    @property
    def label(self) -> str:
        """The object in words: "a red circle"."""
        return f"a {self.colour} {self.shape}"


@dataclass(frozen=True)
class FrameTruth:
    index: int
    t: float
    source_t: float
    scene: int
    kind: str  # "content" or "junk"
    junk: str | None
    background: str
    group: str
    objects: tuple[ObjectTruth, ...] = field(default_factory=tuple)

    @property
    def is_junk(self) -> bool:
        return self.kind == "junk"


def caption(frame: FrameTruth) -> str:
    """The frame in words: "a red circle and a blue square on stripes", "a black screen"."""
    if frame.junk:
        return JUNK_CAPTIONS[frame.junk]
    background = BACKGROUND_WORDS[frame.background]
    labels = [obj.label for obj in frame.objects]
    if not labels:
        return background
    things = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
    return f"{things} on {background}"


@dataclass(frozen=True)
class VideoTruth:
    video: str
    source: str
    edits: tuple[dict, ...]
    width: int
    height: int
    fps: float
    frames: tuple[FrameTruth, ...]

    @property
    def duration(self) -> float:
        return len(self.frames) / self.fps

    def at(self, t: float) -> FrameTruth:
        """The truth of the frame shown at `t` seconds (frame i is shown from i / fps on)."""
        if not -TIME_TOLERANCE_S <= t <= self.duration + TIME_TOLERANCE_S:
            raise ValueError(
                f"{t:.3f} s is outside video {self.video} (0 to {self.duration:.3f} s)"
            )
        index = math.floor(t * self.fps + TIME_TOLERANCE_S)
        return self.frames[min(max(index, 0), len(self.frames) - 1)]

    def to_json(self) -> dict:
        header = {k: v for k, v in asdict(self).items() if k != "frames"}
        frames = [
            dict(asdict(frame), objects=[asdict(obj) for obj in frame.objects])
            for frame in self.frames
        ]
        return {"format": TRUTH_FORMAT, **header, "edits": list(self.edits), "frames": frames}

    @classmethod
    def from_json(cls, data: dict) -> VideoTruth:
        if data.get("format") != TRUTH_FORMAT:
            raise ValueError(f"not a {TRUTH_FORMAT} truth file (format {data.get('format')!r})")
        frames = tuple(
            FrameTruth(
                **{k: v for k, v in frame.items() if k != "objects"},
                objects=tuple(
                    ObjectTruth(**dict(obj, box=tuple(obj["box"]))) for obj in frame["objects"]
                ),
            )
            for frame in data["frames"]
        )
        header = {k: data[k] for k in ("video", "source", "width", "height", "fps")}
        return cls(**header, edits=tuple(data["edits"]), frames=frames)

    def save(self, path: Path) -> Path:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")))
        tmp.replace(path)
        return path


def load_truth(path: Path) -> VideoTruth:
    """Read a truth file written by `core.world.write_world`."""
    return VideoTruth.from_json(json.loads(Path(path).read_text()))
