"""`dataminer demo`: a real pipeline run that needs no network beyond the package index.

It writes a synthetic world (core.world: twelve short clips of coloured shapes moving over dull
backgrounds, with junk scenes and planted near-duplicates, one of them behind a second URL),
serves it on 127.0.0.1 so that yt-dlp downloads it for real, and drives a project over it to a
dataset exactly as `dataminer run` does, with the tiny models trained on that world and shipped
with the package (models.world_models). They know nothing but that world.

The project asks for what the shipped SigLIP tells apart. It names an object's colour far more
reliably than its shape, and every junk scene, so the prompts are every shape of two colours
(a frame passes on its best prompt, so a shape taken for another of the same colour still
passes), the junk scenes are negative prompts, and the filter's thresholds are its defaults.
Dedup's threshold sits between the similarity of frames of different clips and that of a planted
copy's frames with its source's, on the same model's embeddings. bench/README.md has the figures
these choices rest on.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import yaml

from dataminer_dagster.core.world import WrittenWorld, load_world, plan_world, write_world
from dataminer_dagster.core.world_render import SHAPES
from dataminer_dagster.core.world_truth import JUNK_CAPTIONS

# Chosen among seeds 1-8 as one whose clips these settings keep, group and split as the truth
# says (bench/README.md has the others); no other test or script uses it.
WORLD_SEED = 5
PROMPTED_COLOURS = ("red", "white")


def write_demo_world(directory: Path) -> WrittenWorld:
    """The demo's world under `directory`, written once (world.json is its last file)."""
    if (directory / "world.json").is_file():
        written = load_world(directory)
        if written.seed == WORLD_SEED:
            return written
    write_world(directory, plan_world(WORLD_SEED))
    return load_world(directory)


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


def prompted_objects() -> list[str]:
    """The objects the demo asks for, as its positive prompts name them: "a red circle", ..."""
    return [f"a {colour} {shape}" for colour in PROMPTED_COLOURS for shape in SHAPES]


def demo_config(name: str, urls: list[str], output_dir: Path) -> dict:
    """The demo project over `urls` (the world's), with the world's models."""
    from dataminer_dagster.models.world_models import WORLD_SIGLIP, WORLD_YOLO

    return {
        "name": name,
        "output_dir": str(output_dir),
        "inputs": {"urls": urls},
        "download": {"max_height": 480, "allow_private_networks": True},  # served on 127.0.0.1
        "extract": {"strategy": "time", "every_seconds": 0.5, "image_format": "jpg"},
        "filter": {
            "model": str(WORLD_SIGLIP),
            "device": "auto",
            "positive_prompts": prompted_objects(),
            "negative_prompts": list(JUNK_CAPTIONS.values()),
            "positive_threshold": 0.3,
            "negative_threshold": 0.3,
            "pos_neg_margin": 0.1,
        },
        "dedup": {"threshold": 0.6, "colour_overlap": 0.85},
        "detect": {
            "detector": "yolo",
            "model": str(WORLD_YOLO),
            "classes": list(SHAPES),
            "confidence": 0.25,
            "visualizations": True,
        },
        "dataset": {"formats": ["coco", "yolo", "hf"]},
    }


def write_demo_config(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
