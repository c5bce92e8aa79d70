"""`dataminer demo`: a real pipeline run that needs no network beyond the package index.

It writes sample videos, serves them on 127.0.0.1 so that yt-dlp downloads them for real, and picks
models: real weights when they are on this machine (or the Hugging Face hub answers), otherwise
tiny random-weight models of the same architectures, which it says plainly. Then it drives the
project to a dataset exactly as `dataminer run` does.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video

REAL_FILTER_MODEL = "google/siglip2-base-patch16-224"
REAL_DETECTOR = "yolo11n.pt"


@dataclass(frozen=True)
class DemoModels:
    filter_model: str
    detector_model: str
    tiny_filter: bool
    tiny_detector: bool


def write_sample_videos(directory: Path, count: int) -> list[Path]:
    """Short clips with scene cuts and moving shapes (different per clip)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"sample{i:02d}.mp4"
        if not path.is_file():
            spec = SyntheticVideoSpec(
                width=320, height=240, fps=15, seconds=6.0, scene_cuts=(2.0, 4.0), seed=i
            )
            write_opencv_video(path, spec)
        paths.append(path)
    return paths


@contextmanager
def serve_directory(directory: Path, port: int = 0, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `directory` over HTTP on `host` (default 127.0.0.1); yields the base URL. A fixed port
    keeps the video URLs (and so their ids) the same from one demo to the next; taken, an ephemeral
    one is used. Another local address serves other network namespaces (tests/helpers/faults.py)."""

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

    class QuietServer(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client hanging up early is fine
            pass

    handler = partial(QuietHandler, directory=str(directory))
    try:
        server = QuietServer((host, port), handler)
    except OSError:
        server = QuietServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def choose_models(models_dir: Path, say: Callable[[str], None]) -> DemoModels:
    """Real weights where available, tiny random-weight models of the same architectures otherwise."""
    from dataminer_dagster.models.loading import ModelLoadError, resolve_model

    try:
        resolve_model(REAL_FILTER_MODEL)
        filter_model, tiny_filter = REAL_FILTER_MODEL, False
        say(f"filter: real SigLIP2 weights ({REAL_FILTER_MODEL})")
    except (ModelLoadError, OSError) as exc:
        from dataminer_dagster.models.tiny import build_tiny_siglip

        path = models_dir / "tiny-siglip"
        if not (path / "config.json").is_file():
            build_tiny_siglip(path)
        filter_model, tiny_filter = str(path), True
        say(
            f"filter: real SigLIP2 weights are not available here ({type(exc).__name__}); using a TINY "
            "RANDOM-WEIGHT SigLIP model. Its scores mean nothing: the demo lets every frame pass."
        )
    local_yolo = Path(REAL_DETECTOR)
    if local_yolo.is_file():
        detector_model, tiny_detector = str(local_yolo.resolve()), False
        say(f"detection: real YOLO weights ({local_yolo})")
    else:
        from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

        path = models_dir / "tiny-yolov8.pt"
        if not path.is_file():
            build_tiny_yolo(path)
        detector_model, tiny_detector = str(path), True
        say(
            f"detection: no {REAL_DETECTOR} in the current directory; using a TINY RANDOM-WEIGHT YOLOv8 "
            "with the 80 COCO class names. Its boxes mean nothing."
        )
    return DemoModels(filter_model, detector_model, tiny_filter, tiny_detector)


def demo_config(name: str, urls: list[str], models: DemoModels, output_dir: Path) -> dict:
    """The demo project. Thresholds are permissive on purpose: the videos are synthetic shapes."""
    permissive = 0.0 if models.tiny_filter else 0.001
    return {
        "name": name,
        "output_dir": str(output_dir),
        "inputs": {"urls": urls},
        "download": {"max_height": 480, "allow_private_networks": True},  # served on 127.0.0.1
        "extract": {"strategy": "time", "every_seconds": 1.0, "image_format": "jpg"},
        "filter": {
            "model": models.filter_model,
            "device": "auto",
            "batch_size": 16,
            "positive_prompts": ["colorful geometric shapes", "a red circle", "a blue square"],
            "negative_prompts": ["a black screen"],
            "positive_threshold": permissive,
            "negative_threshold": 1.0,
            "pos_neg_margin": -1.0,
        },
        "dedup": {"threshold": 0.97},
        "detect": {
            "detector": "yolo",
            "model": models.detector_model,
            "classes": ["person", "car", "sports ball", "frisbee"],
            "confidence": 0.001 if models.tiny_detector else 0.25,
            "visualizations": True,
        },
        "dataset": {"formats": ["coco", "yolo", "hf"]},
    }


def write_demo_config(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
