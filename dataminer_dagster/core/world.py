"""A synthetic world with ground truth, to measure what the pipeline keeps, groups and boxes.

`plan_world(seed)` lays out source clips of coloured shapes (circle, square, triangle, star)
moving over varied backgrounds (noise, gradient, stripes, checks, texture), with scene cuts, junk
scenes (black, blurred, a screen of text), occlusion (objects crossing, a sweeping bar) and scale
changes; and planted near-duplicates of them: the same clip re-encoded at another quality,
resized, cropped, mirrored, under a banner, sped up, and one file served behind a second URL.
`write_world(directory, world)` writes each video as an H.264 mp4, a truth file beside it
(`core.world_truth` documents the format) and `world.json`, the list of videos and their URL
paths, for `demo.serve_directory` to serve. The same seed gives the same videos and truth.

The world is small on purpose: a dozen clips of a few seconds at 256 x 192 are written in seconds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataminer_dagster.core.world_render import (
    BACKGROUNDS,
    COLOURS,
    JUNK_KINDS,
    SHAPES,
    Crop,
    Edit,
    Mirror,
    ObjectSpec,
    Overlay,
    Reencode,
    Resize,
    SceneSpec,
    SourceSpec,
    SpeedUp,
    edit_from_json,
    render_source,
    visible_objects,
)
from dataminer_dagster.core.world_truth import FrameTruth, VideoTruth, load_truth

WORLD_FORMAT = "dataminer-world/1"
DEFAULT_CRF = 23
# The planted near-duplicates: the edits that make each one, applied to sources in turn.
DUPLICATE_EDITS: tuple[tuple[Edit, ...], ...] = (
    (Reencode(crf=36),),
    (Resize(width=160, height=120),),
    (Crop(left=0.125, top=0.125, width=0.75, height=0.75),),
    (Mirror(),),
    (Overlay(text="WORLD NEWS 24"),),
    (SpeedUp(factor=2.0),),
)


@dataclass(frozen=True)
class WorldVideo:
    """One video file of the world: a source clip with the edits that make it a duplicate."""

    name: str  # file name, e.g. "v03.mp4"
    source: SourceSpec
    edits: tuple[Edit, ...] = ()
    aliases: tuple[str, ...] = ()  # further URL paths that serve the same file

    @property
    def fps(self) -> float:
        return self.source.fps

    @property
    def speed(self) -> float:
        return math.prod(e.factor for e in self.edits if isinstance(e, SpeedUp))

    @property
    def crf(self) -> int:
        return next((e.crf for e in reversed(self.edits) if isinstance(e, Reencode)), DEFAULT_CRF)

    @property
    def frame_count(self) -> int:
        return math.ceil(self.source.frame_count / self.speed - 1e-9)

    def render(self, index: int) -> tuple[np.ndarray, FrameTruth]:
        """Frame `index` (BGR) and its truth."""
        t = index / self.fps
        source_t = t * self.speed
        layers = render_source(self.source, source_t)
        for edit in self.edits:
            layers = edit.apply(layers)
        scene_index = self.source.scene_index(source_t)
        scene = self.source.scenes[scene_index]
        truth = FrameTruth(
            index=index,
            t=round(t, 6),
            source_t=round(source_t, 6),
            scene=scene_index,
            kind=scene.kind,
            junk=scene.junk,
            background=scene.background,
            group=f"{self.source.name}/{scene_index}",
            objects=visible_objects(layers),
        )
        return layers.frame, truth


@dataclass(frozen=True)
class World:
    seed: int
    videos: tuple[WorldVideo, ...]
    classes: tuple[str, ...] = field(default=SHAPES)


def plan_world(
    seed: int,
    *,
    sources: int = 6,
    width: int = 256,
    height: int = 192,
    fps: float = 10.0,
    seconds: float = 4.0,
) -> World:
    """`sources` source clips and one planted duplicate of each, in DUPLICATE_EDITS' order
    (cycled), named v00.mp4, v01.mp4, ... in a shuffled order so that a name tells nothing.
    Two thirds of the sources have a junk scene; the first source is also served at a second URL.
    """
    rng = np.random.default_rng(seed)
    junk_kinds = iter(JUNK_KINDS * sources)
    clips = [
        _plan_source(
            rng,
            f"s{i:02d}",
            width,
            height,
            fps,
            seconds,
            junk=next(junk_kinds) if i % 3 != 2 else None,
        )
        for i in range(sources)
    ]
    made = [(clip, ()) for clip in clips] + [
        (clips[i], DUPLICATE_EDITS[i % len(DUPLICATE_EDITS)]) for i in range(sources)
    ]
    order = rng.permutation(len(made))
    videos = []
    for number, position in enumerate(order):
        clip, edits = made[position]
        name = f"v{number:02d}.mp4"
        aliases = (f"mirror-site/{clip.name}-copy.mp4",) if position == 0 else ()
        videos.append(WorldVideo(name, clip, edits, aliases))
    return World(seed, tuple(videos))


def _plan_source(
    rng: np.random.Generator,
    name: str,
    width: int,
    height: int,
    fps: float,
    seconds: float,
    *,
    junk: str | None,
) -> SourceSpec:
    """Three scenes cut at random times near the thirds; with `junk`, one of them is junk."""
    cuts = [0.0, *sorted(rng.uniform(0.27, 0.4) * seconds * k for k in (1, 2)), seconds]
    cuts = [round(c * fps) / fps for c in cuts]  # cut on frame boundaries
    junk_at = int(rng.integers(0, 3)) if junk else -1
    scenes = []
    for index in range(3):
        scene_junk = junk if index == junk_at else None
        objects = _plan_objects(rng) if scene_junk in (None, "blur") else ()
        scenes.append(
            SceneSpec(
                start=cuts[index],
                end=cuts[index + 1],
                seed=int(rng.integers(2**31)),
                background=str(rng.choice(BACKGROUNDS)),
                junk=scene_junk,
                objects=objects,
                occluder=scene_junk is None and bool(rng.uniform() < 0.3),
            )
        )
    return SourceSpec(name, width, height, fps, tuple(scenes))


def _plan_objects(rng: np.random.Generator) -> tuple[ObjectSpec, ...]:
    """One to three objects of different colours (white on white would hide a shape's edge)."""
    count = int(rng.integers(1, 4))
    colours = rng.choice(list(COLOURS), size=count, replace=False)
    shapes = rng.choice(SHAPES, size=count)
    return tuple(
        ObjectSpec(
            shape=str(shape),
            colour=str(colour),
            x=float(rng.uniform(0.2, 0.8)),
            y=float(rng.uniform(0.2, 0.8)),
            vx=float(rng.uniform(-0.25, 0.25)),
            vy=float(rng.uniform(-0.25, 0.25)),
            size=float(rng.uniform(0.08, 0.2)),
            growth=float(rng.choice([0.0, rng.uniform(-0.15, 0.3)])),
            angle=0.0 if shape == "square" else float(rng.uniform(-20, 20)),
        )
        for shape, colour in zip(shapes, colours, strict=True)
    )


def write_world(directory: Path, world: World) -> Path:
    """Write every video, its truth file and `world.json` under `directory`; returns the latter."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for video in world.videos:
        path = directory / video.name
        truth_path = truth_path_of(path)
        _encode(path, video).save(truth_path)
        for alias in video.aliases:
            _link(path, directory / alias)
        entries.append(
            {
                "file": video.name,
                "truth": truth_path.name,
                "source": video.source.name,
                "edits": [edit.to_json() for edit in video.edits],
                "paths": [video.name, *video.aliases],
            }
        )
    manifest = {"format": WORLD_FORMAT, "seed": world.seed, "classes": list(world.classes)}
    manifest_path = directory / "world.json"
    manifest_path.write_text(json.dumps(dict(manifest, videos=entries), indent=1))
    return manifest_path


def truth_path_of(video_path: Path) -> Path:
    return video_path.with_name(video_path.name + ".truth.json")


def _encode(path: Path, video: WorldVideo) -> VideoTruth:
    """Encode `video` with x264 to `path` (through a temporary sibling); returns its truth."""
    import av

    frames = []
    tmp = path.with_name(f".{path.name}.tmp.mp4")
    with av.open(str(tmp), "w") as container:
        stream = None
        for index in range(video.frame_count):
            image, truth = video.render(index)
            frames.append(truth)
            if stream is None:
                stream = container.add_stream("libx264", rate=int(round(video.fps)))
                stream.height, stream.width = image.shape[:2]
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": str(video.crf), "preset": "veryfast"}
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode())
    os.replace(tmp, path)
    height, width = image.shape[:2]
    return VideoTruth(
        video=video.name,
        source=video.source.name,
        edits=tuple(edit.to_json() for edit in video.edits),
        width=width,
        height=height,
        fps=video.fps,
        frames=tuple(frames),
    )


def _link(target: Path, alias: Path) -> None:
    """`alias` serves the same bytes as `target`: a hard link, or a copy across devices."""
    alias.parent.mkdir(parents=True, exist_ok=True)
    alias.unlink(missing_ok=True)  # a link to a video this call replaced would show the old one
    try:
        os.link(target, alias)
    except OSError:
        shutil.copyfile(target, alias)


@dataclass(frozen=True)
class WrittenWorld:
    """A world read back from its directory: each URL path's truth."""

    directory: Path
    seed: int
    classes: tuple[str, ...]
    truths: dict[str, VideoTruth]  # by URL path relative to the directory (aliases included)

    def truth_for(self, url_or_path: str) -> VideoTruth:
        """The truth of the video at a URL (or a path) that ends with one of the world's paths."""
        for path, truth in self.truths.items():
            if url_or_path == path or url_or_path.endswith("/" + path):
                return truth
        raise KeyError(f"{url_or_path} is none of the world's videos ({self.directory})")

    def urls(self, base_url: str) -> list[str]:
        """Every video's URL under `base_url` (where `directory` is served), aliases included."""
        return [f"{base_url.rstrip('/')}/{path}" for path in self.truths]


def load_world(directory: Path) -> WrittenWorld:
    """Read `world.json` and the truth files that `write_world` wrote under `directory`."""
    directory = Path(directory)
    manifest = json.loads((directory / "world.json").read_text())
    if manifest.get("format") != WORLD_FORMAT:
        raise ValueError(f"{directory / 'world.json'} is not a {WORLD_FORMAT} manifest")
    truths = {}
    for entry in manifest["videos"]:
        truth = load_truth(directory / entry["truth"])
        for path in entry["paths"]:
            truths[path] = truth
    return WrittenWorld(directory, manifest["seed"], tuple(manifest["classes"]), truths)


def edits_of(truth: VideoTruth) -> list[Edit]:
    """The edits a truth file records, as objects."""
    return [edit_from_json(data) for data in truth.edits]
