"""GPU benchmark in one run: our code paths against the bare models, on CUDA, offline.

Sections (each guarded: a failure prints one line and the run goes on; each has a time cap):

1. filter: SigLIP2 so400m-patch14-384 sizes (random weights) through `SiglipScorer.embed_images`
   on JPEG files on disk (read on the prefetch threads, decode and preprocess on the GPU or the
   threads, forward, copy back) vs `get_image_features` on a batch already on the device; with
   the stage's defaults (GPU decoding, 2 workers), with 8 workers, and with the CPU input path
   (workers from the cores). Goals: >= 800 images/s and >= 0.9x bare.
2. detect: YOLO11 (ultralytics, random weights from the packaged yaml) and OWLv2 base-patch16 at
   960 through `load_detector(...).detect` on decoded frames vs the model's forward pass on a
   batch already on the device. Goal: >= 0.85x bare.
3. dedup: 1,110,500 x 768 unit vectors with planted near-duplicate groups (bench/dedup.py's
   data), exact cosine range search in tiles of torch matrix products: half-precision products
   with a margin, every candidate re-checked in float32 (cosine >= threshold - 1e-6, as
   core.dedup), and plain float32 products; vs the CPU product code (bench/dedup.py: 128 s).
4. decode: torchvision.io.decode_jpeg on the GPU (nvjpeg, batched) vs core.images.decode_image
   (OpenCV) on one thread per core, same files.

Models are built from configs written here with random weights, saved with save_pretrained and
loaded through models.loading, as real weights would be; nothing is downloaded. The last lines are
one markdown table, also written to $OUT/gpu.md with the environment, and $OUT/gpu.json.

    bash bench/gpu.sh            # full sizes (CUDA machine)
    bash bench/gpu.sh --smoke    # tiny sizes, any device: checks the code paths
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

STARTED = time.perf_counter()
MIB = 2**20

SO400M = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16
)
TINY_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
SIGLIP = {
    "full": dict(
        name="SigLIP2 so400m-patch14-384",
        vision=dict(SO400M, image_size=384, patch_size=14),
        text=dict(SO400M, vocab_size=256_000, max_position_embeddings=64, projection_size=1152),
    ),
    "smoke": dict(
        name="SigLIP tiny",
        vision=dict(TINY_TOWER, image_size=32, patch_size=8),
        text=dict(TINY_TOWER, max_position_embeddings=64, projection_size=32),
    ),
}
OWLV2 = {
    "full": dict(
        name="OWLv2 base-patch16-ensemble 960",
        vision=dict(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=960,
            patch_size=16,
        ),
        text=dict(
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=8,
            vocab_size=49_408,
        ),
        projection_dim=512,
    ),
    "smoke": dict(
        name="OWLv2 tiny 64",
        vision=dict(TINY_TOWER, image_size=64, patch_size=16),
        text=dict(TINY_TOWER),
        projection_dim=32,
    ),
}
OWLV2_TEXT_TOKENS = 16  # OWLv2 reads 16 tokens
PROMPTS = ["person", "car", "dog"]
DEDUP_THRESHOLD = 0.9
HALF_MARGIN = 0.01  # candidates from half-precision products; fp16 error near 0.9 is ~5e-4

SIZES = {
    "full": dict(
        frames=3072,  # 4 rounds of 12 full batches of 64
        filter_batch=64,
        # SiglipScorer options per row; {} is the filter stage's default.
        filter_inputs=[{}, dict(prefetch_workers=8), dict(decode_on_device=False)],
        yolo=["yolo11m.yaml", "yolo11l.yaml"],
        yolo_batch=32,
        yolo_images=1024,
        owl_batch=16,
        owl_images=128,
        dedup_random=1_100_000,
        dedup_tile=32_768,
        decode_batch=128,
        rounds=4,
        caps=dict(filter=120, yolo=45, owlv2=40, dedup=100, decode=20),
    ),
    "smoke": dict(
        frames=48,
        filter_batch=8,
        filter_inputs=[{}, dict(decode_on_device=True)],
        yolo=["yolo11n.yaml"],
        yolo_batch=8,
        yolo_images=16,
        owl_batch=4,
        owl_images=8,
        dedup_random=4_000,
        dedup_tile=4_096,
        decode_batch=16,
        rounds=2,
        caps=dict(filter=30, yolo=20, owlv2=20, dedup=30, decode=10),
    ),
}


@dataclass
class Row:
    section: str
    ours: str = ""
    baseline: str = ""
    ratio: str = ""
    goal: str = ""
    peak_mib: float | None = None
    notes: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # raw numbers for gpu.json


@dataclass
class Bench:
    mode: str
    sizes: dict[str, Any]
    device: Any  # torch.device
    workdir: Path
    deadline: float  # perf_counter() after which sections are skipped
    rows: list[Row] = field(default_factory=list)
    frames: list[Path] = field(default_factory=list)

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - STARTED:6.1f}s] {message}")

    def cap(self, section: str) -> float:
        """Seconds this section may measure for: its cap, within what is left of the run."""
        return max(1.0, min(self.sizes["caps"][section], self.deadline - time.perf_counter()))

    def synchronize(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mib(self) -> float | None:
        import torch

        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device) / MIB


def guarded(bench: Bench, section: str, run: Callable[[], list[Row]]) -> None:
    """Run one section; on failure one line (traceback to gpu-errors.log) and the run goes on."""
    import torch

    if time.perf_counter() > bench.deadline:
        bench.log(f"section {section} skipped: the run's time budget is spent")
        bench.rows.append(Row(section, ours="skipped: time budget spent"))
        return
    bench.log(f"section {section} started")
    bench.reset_peak()
    try:
        rows = run()
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        message = f"{type(error).__name__}: {first_line}"
        print(f"section {section} failed: {message}", flush=True)
        trace = traceback.format_exc()
        print("    " + "\n    ".join(trace.strip().splitlines()[-6:]), flush=True)
        _append_error_log(section, trace)
        rows = [Row(section, ours=f"failed: {message[:160]}")]
    for row in rows:
        if row.peak_mib is None:
            row.peak_mib = bench.peak_mib()
        bench.rows.append(row)
    gc_cuda(torch)
    bench.log(f"section {section} done")


def gc_cuda(torch) -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _append_error_log(section: str, trace: str) -> None:
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "gpu-errors.log", "a") as handle:
            handle.write(f"== section {section}\n{trace}\n")


# ---------------------------------------------------------------------------------------- frames


def write_frames(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """`count` 640x360 JPEGs (quality 90) of smooth random scenes with noise, written in parallel."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)

    def write(index: int) -> Path:
        rng = np.random.default_rng(seed + index)
        coarse = rng.integers(0, 256, (9, 16, 3), dtype=np.uint8)
        image = cv2.resize(coarse, (640, 360), interpolation=cv2.INTER_CUBIC).astype(np.int16)
        image += rng.normal(0, 8, image.shape).astype(np.int16)
        path = folder / f"frame_{index:06d}.jpg"
        cv2.imwrite(str(path), image.clip(0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])
        return path

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(write, range(count)))


def read_frames(paths: Sequence[Path]) -> list[np.ndarray]:
    from dataminer_dagster.core.images import read_image

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(read_image, paths))


def segments(count: int, rounds: int) -> list[range]:
    step = -(-count // rounds)
    return [range(start, min(start + step, count)) for start in range(0, count, step)]


def alternate(
    bench: Bench,
    count: int,
    bare: Callable[[range], float],
    ours: Callable[[range], float],
    cap_s: float,
) -> tuple[int, float, float]:
    """Bare and ours take turns over segments of `count` items until done or `cap_s` is spent.

    Returns (items measured, bare seconds, our seconds); the same items go through both.
    """
    started = time.perf_counter()
    done, bare_s, ours_s = 0, 0.0, 0.0
    for segment in segments(count, bench.sizes["rounds"]):
        bare_s += bare(segment)
        ours_s += ours(segment)
        done += len(segment)
        bench.log(
            f"  {done}/{count}: bare {done / bare_s:.1f}/s, ours {done / ours_s:.1f}/s, "
            f"ratio {bare_s / ours_s:.3f}"
        )
        if time.perf_counter() - started > cap_s:
            bench.log(f"  time cap {cap_s:.0f} s reached after {done} of {count}")
            break
    return done, bare_s, ours_s


def throughput_row(
    section: str, done: int, bare_s: float, ours_s: float, goal: str, extra: dict | None = None
) -> Row:
    ours_rate, bare_rate = done / ours_s, done / bare_s
    return Row(
        section,
        ours=f"{ours_rate:,.1f} img/s",
        baseline=f"{bare_rate:,.1f} img/s",
        ratio=f"{bare_s / ours_s:.3f}",
        goal=goal,
        values=dict(images=done, ours_per_s=ours_rate, bare_per_s=bare_rate, **(extra or {})),
    )


# ---------------------------------------------------------------------------------- model files


def random_model(model_class: Any, config: Any, device: Any) -> Any:
    """The architecture with random weights, initialised on `device` (fast for 1B parameters)."""
    import torch

    try:
        with torch.device(device):
            model = model_class(config)
    except Exception as error:  # initialising on the CPU works everywhere, slowly for 1B weights
        print(
            f"  {model_class.__name__} could not be initialised on {device} ({error}); on the CPU"
        )
        model = model_class(config).to(device)
    return model.half() if device.type == "cuda" else model


def build_siglip(bench: Bench, directory: Path) -> Path:
    """A SiglipModel of the preset's sizes with the tiny SigLIP tokenizer and a real processor."""
    from transformers import AutoProcessor, SiglipConfig, SiglipModel

    from dataminer_dagster.models.tiny import build_tiny_siglip

    preset = SIGLIP[bench.mode]
    source = build_tiny_siglip(bench.workdir / "siglip-tokenizer")
    processor = AutoProcessor.from_pretrained(source)
    tokenizer = processor.tokenizer
    text = dict(preset["text"])
    text.setdefault("vocab_size", len(tokenizer))
    text.update(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    config = SiglipConfig(text_config=text, vision_config=preset["vision"])
    model = random_model(SiglipModel, config, bench.device)
    size = preset["vision"]["image_size"]
    processor.image_processor.size = {"height": size, "width": size}
    processor.image_processor.resample = 2  # bilinear, as google/siglip2-*-patch14-384
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    bench.log(f"  {preset['name']}: {parameters / 1e6:.0f}M parameters saved to {directory}")
    return directory


def build_owlv2(bench: Bench, directory: Path) -> Path:
    """An Owlv2ForObjectDetection of the preset's sizes with the tiny CLIP tokenizer."""
    import torch
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2Processor

    from dataminer_dagster.models.tiny_detectors import build_tiny_owlv2

    preset = OWLV2[bench.mode]
    processor = Owlv2Processor.from_pretrained(build_tiny_owlv2(bench.workdir / "owl-tokenizer"))
    tokenizer = processor.tokenizer
    tokenizer.model_max_length = OWLV2_TEXT_TOKENS
    text = dict(preset["text"], max_position_embeddings=OWLV2_TEXT_TOKENS)
    text.setdefault("vocab_size", len(tokenizer))
    text.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = Owlv2Config(
        text_config=text, vision_config=preset["vision"], projection_dim=preset["projection_dim"]
    )
    model = random_model(Owlv2ForObjectDetection, config, bench.device)
    with torch.no_grad():
        # As models.tiny_detectors: random weights give scores spread over (0, 1) and boxes on
        # their patches, so post-processing sees a realistic handful of boxes, not thousands.
        model.box_head.dense2.weight.zero_()
        model.box_head.dense2.bias.zero_()
        model.class_head.logit_scale.weight.zero_()
        model.class_head.logit_scale.bias.fill_(4.0)
        model.class_head.logit_shift.weight.mul_(0.1)
        model.class_head.logit_shift.bias.fill_(-0.3)
    size = preset["vision"]["image_size"]
    processor.image_processor.size = {"height": size, "width": size}
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    bench.log(f"  {preset['name']}: {parameters / 1e6:.0f}M parameters saved to {directory}")
    return directory


# --------------------------------------------------------------------------------------- filter


def filter_section(bench: Bench) -> list[Row]:
    import torch

    model_dir = build_siglip(bench, bench.workdir / "siglip")
    gc_cuda(torch)
    inputs = bench.sizes["filter_inputs"]
    cap = bench.sizes["caps"]["filter"] / len(inputs)
    return [_filter_row(bench, model_dir, options, cap) for options in inputs]


def _filter_row(bench: Bench, model_dir: Path, options: dict[str, Any], cap_s: float) -> Row:
    import filter as filter_bench  # bench/filter.py: the CPU benchmark's two timed paths

    from dataminer_dagster.models.siglip import SiglipScorer

    batch = bench.sizes["filter_batch"]
    scorer = SiglipScorer(model_dir, device=str(bench.device), batch_size=batch, **options)
    workers = scorer.prefetch_workers
    decode_on = (
        f"{scorer.device.type} (torchvision)"
        if scorer.device_preprocessing
        else "cpu (OpenCV, PIL)"
    )
    setting = f"decode on {decode_on}, {workers} prefetch workers"
    if not options:
        setting += " (stage default)"
    bench.log(
        f"  {type(scorer.model).__name__}, dtype {scorer.loaded.dtype}, device {scorer.device}, "
        f"attention {getattr(scorer.model.config, '_attn_implementation', '?')}, {setting}"
    )
    filter_bench.time_bare(scorer, 2 * batch, batch)  # warm-up: allocations, kernel choice
    list(scorer.embed_images(bench.frames[: 2 * batch]))
    bench.reset_peak()
    wait = [0.0]

    def ours(segment: range) -> float:
        paths = bench.frames[segment.start : segment.stop]
        seconds, waited = filter_bench.time_pipeline(scorer, paths)
        wait[0] += waited
        return seconds

    def bare(segment: range) -> float:
        return filter_bench.time_bare(scorer, len(segment), batch)

    cap_s = min(bench.cap("filter"), cap_s)
    done, bare_s, ours_s = alternate(bench, len(bench.frames), bare, ours, cap_s)
    name = SIGLIP[bench.mode]["name"]
    row = throughput_row(
        f"filter: {name}, {setting}",
        done,
        bare_s,
        ours_s,
        ">= 800 img/s and >= 0.9x",
        dict(workers=workers, decode_on=decode_on, batch=batch, model_wait_s=wait[0]),
    )
    row.notes.append(
        f"filter, {setting}: batch {batch}, {done} JPEGs 640x360 from disk, "
        f"{scorer.loaded.dtype}; the model waited for input {100 * wait[0] / ours_s:.0f}% of "
        "the pipeline time"
    )
    row.peak_mib = bench.peak_mib()
    return row


# --------------------------------------------------------------------------------------- detect


def yolo_section(bench: Bench) -> list[Row]:
    try:
        import ultralytics
    except ImportError as error:
        reason = f"skipped: ultralytics cannot be imported ({error})"
        return [
            Row(f"detect: {name.removesuffix('.yaml')}", ours=reason)
            for name in bench.sizes["yolo"]
        ]
    bench.log(f"  ultralytics {ultralytics.__version__}")
    frames = read_frames(bench.frames[: bench.sizes["yolo_images"]])
    rows = []
    for name in bench.sizes["yolo"]:
        try:
            rows.append(_yolo_row(bench, name, frames))
        except Exception as error:
            print(f"section detect {name} failed: {type(error).__name__}: {error}", flush=True)
            _append_error_log(f"detect {name}", traceback.format_exc())
            rows.append(Row(f"detect: {name.removesuffix('.yaml')}", ours=f"failed: {error}"[:160]))
        bench.reset_peak()
    return rows


def _yolo_row(bench: Bench, name: str, frames: list[np.ndarray]) -> Row:
    import torch

    from dataminer_dagster.models.detectors import load_detector

    batch = bench.sizes["yolo_batch"]
    detector = load_detector(
        "yolo", name, confidence=0.25, device=str(bench.device), batch_size=batch
    )
    detector.detect(frames[:batch])  # warm-up: builds the predictor, fuses, moves to the device
    predictor = detector.model.predictor
    backend = predictor.model  # the fused network ours runs, in the precision ours asked for
    pixels = _network_input(predictor, lambda: detector.detect(frames[:batch]))
    with torch.inference_mode():
        backend(pixels)
    bench.synchronize()
    bench.reset_peak()
    found = [0]

    def bare(segment: range) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            for start in range(0, len(segment), batch):
                backend(pixels[: min(batch, len(segment) - start)])
        bench.synchronize()
        return time.perf_counter() - started

    def ours(segment: range) -> float:
        started = time.perf_counter()
        found[0] += sum(len(d) for d in detector.detect(frames[segment.start : segment.stop]))
        return time.perf_counter() - started

    done, bare_s, ours_s = alternate(bench, len(frames), bare, ours, bench.cap("yolo"))
    model = name.removesuffix(".yaml")
    height, width = pixels.shape[2:]
    row = throughput_row(
        f"detect: {model}",
        done,
        bare_s,
        ours_s,
        ">= 0.85x",
        dict(batch=batch, input=[height, width]),
    )
    row.notes.append(
        f"{model}: batch {batch}, frames 640x360 in memory, network input {width}x{height} "
        f"{'fp16' if backend.fp16 else 'fp32'}; ours = predict (letterbox, NMS, results) + "
        f"our conversion; {found[0] / done:.1f} detections per frame"
    )
    row.peak_mib = bench.peak_mib()
    return row


def _network_input(predictor: Any, run: Callable[[], Any]) -> Any:
    """A random batch shaped like the one ultralytics built from our frames during `run()`."""
    import torch

    seen = []
    preprocess = predictor.preprocess
    predictor.preprocess = lambda images: seen.append(preprocess(images)) or seen[-1]
    try:
        run()
    finally:
        del predictor.preprocess  # back to the class's method
    return torch.rand_like(seen[0])


def owlv2_section(bench: Bench) -> list[Row]:
    import torch

    from dataminer_dagster.models.detectors import load_detector

    model_dir = build_owlv2(bench, bench.workdir / "owlv2")
    gc_cuda(torch)
    batch = bench.sizes["owl_batch"]
    frames = read_frames(bench.frames[: bench.sizes["owl_images"]])
    detector = load_detector(
        "owlv2",
        str(model_dir),
        prompts=PROMPTS,
        confidence=0.3,
        device=str(bench.device),
        batch_size=batch,
    )
    detector.detect(frames[:batch])  # warm-up
    inputs = detector.processor(
        text=[PROMPTS] * batch,
        images=frames[:batch],
        input_data_format="channels_last",
        return_tensors="pt",
    )
    inputs = {
        key: value.to(bench.device, dtype=detector.dtype)
        if value.is_floating_point()
        else value.to(bench.device)
        for key, value in dict(inputs).items()
    }
    with torch.inference_mode():
        detector.model(**inputs)
    bench.synchronize()
    bench.reset_peak()
    found = [0]

    def bare(segment: range) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            for start in range(0, len(segment), batch):
                n = min(batch, len(segment) - start)
                # Text inputs hold one row per (frame, prompt).
                rows = {key: n * len(PROMPTS) if key != "pixel_values" else n for key in inputs}
                detector.model(**{key: value[: rows[key]] for key, value in inputs.items()})
        bench.synchronize()
        return time.perf_counter() - started

    def ours(segment: range) -> float:
        started = time.perf_counter()
        found[0] += sum(len(d) for d in detector.detect(frames[segment.start : segment.stop]))
        return time.perf_counter() - started

    done, bare_s, ours_s = alternate(bench, len(frames), bare, ours, bench.cap("owlv2"))
    size = OWLV2[bench.mode]["vision"]["image_size"]
    row = throughput_row(
        "detect: OWLv2 base 960" if bench.mode == "full" else "detect: OWLv2 tiny",
        done,
        bare_s,
        ours_s,
        ">= 0.85x",
        dict(batch=batch),
    )
    row.notes.append(
        f"OWLv2: batch {batch}, {len(PROMPTS)} prompts, input {size}x{size} {detector.dtype}, "
        f"processor {type(detector.processor.image_processor).__name__}; ours = processor "
        f"(pad, resize) + forward + post-processing + NMS; {found[0] / done:.1f} detections per frame"
    )
    row.peak_mib = bench.peak_mib()
    return [row]


# ---------------------------------------------------------------------------------------- dedup


def dedup_section(bench: Bench) -> list[Row]:
    import dedup as dedup_bench  # bench/dedup.py: the CPU benchmark's data
    import torch

    started = time.perf_counter()
    data = dedup_bench.make_data(bench.sizes["dedup_random"], 768, 100, seed=0)
    x32 = torch.from_numpy(data.x).to(bench.device)
    bench.log(f"  {len(data.x):,} vectors made and moved in {time.perf_counter() - started:.1f} s")
    expected = _planted_pairs(data.kind)
    bench.reset_peak()
    rows = []
    # Half-precision products are slow on a CPU: there the candidate path runs on float32.
    half = torch.float16 if bench.device.type == "cuda" else torch.float32
    for label, dtype, margin in (
        (f"{str(half).removeprefix('torch.')} products, float32 check", half, HALF_MARGIN),
        ("float32 products (no TF32)", torch.float32, 0.0),
    ):
        cap = bench.cap("dedup") / 2
        pairs, seconds, share = _range_search(bench, x32, dtype, margin, cap)
        row = _dedup_row(bench, label, data, pairs, seconds, share, expected)
        row.peak_mib = bench.peak_mib()
        rows.append(row)
        bench.reset_peak()
    return rows


def _range_search(bench: Bench, x32: Any, dtype: Any, margin: float, cap_s: float):
    """Pairs i < j with x[i] . x[j] >= threshold - 1e-6, from upper-triangle tiles.

    Tiles are computed in `dtype`; with a margin, a pair within it becomes a candidate that is
    re-checked with a float32 dot product. Returns (pairs (2, P) on the CPU, seconds, the share
    of the triangle searched before the cap stopped it).
    """
    import torch

    from dataminer_dagster.core.dedup import SIMILARITY_TOLERANCE

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    cut = DEDUP_THRESHOLD - SIMILARITY_TOLERANCE
    n, tile = len(x32), bench.sizes["dedup_tile"]
    x = x32.to(dtype)
    total_tiles = sum(len(range(a0, n, tile)) for a0 in range(0, n, tile))
    tiles, found = 0, []
    bench.synchronize()
    started = time.perf_counter()
    for a0 in range(0, n, tile):
        left = x[a0 : a0 + tile]
        for b0 in range(a0, n, tile):
            sims = left @ x[b0 : b0 + tile].T
            a, b = torch.nonzero(sims >= cut - margin, as_tuple=True)
            a, b = a + a0, b + b0
            upper = a < b
            found.append(torch.stack([a[upper], b[upper]]))
            tiles += 1
        if time.perf_counter() - started > cap_s:
            break
    pairs = torch.cat(found, dim=1)
    if margin:
        exact = (x32[pairs[0]] * x32[pairs[1]]).sum(dim=1)
        pairs = pairs[:, exact >= cut]
    pairs = pairs.cpu()
    bench.synchronize()
    seconds = time.perf_counter() - started
    del x
    return pairs.numpy(), seconds, tiles / total_tiles


def _planted_pairs(kind: np.ndarray) -> int:
    sizes = np.bincount(kind[kind >= 0])
    return int((sizes * (sizes - 1) // 2).sum())


def _whole_groups(kind: np.ndarray, label_of: np.ndarray) -> tuple[int, int]:
    """How many planted groups are exactly one connected component, of how many."""
    rows = np.flatnonzero(kind >= 0)
    group_size = np.bincount(kind[rows])
    component_size = np.bincount(label_of)
    pairs = np.unique(np.stack([kind[rows], label_of[rows]]), axis=1)
    components_per_group = np.bincount(pairs[0], minlength=len(group_size))
    first_label = np.zeros(len(group_size), dtype=np.int64)
    first_label[kind[rows][::-1]] = label_of[rows][::-1]
    whole = (components_per_group == 1) & (component_size[first_label] == group_size)
    present = group_size > 0
    return int((whole & present).sum()), int(present.sum())


def _dedup_row(bench, label, data, pairs, seconds, share, expected) -> Row:
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    kind = data.kind
    i, j = pairs
    planted = (kind[i] >= 0) & (kind[i] == kind[j])
    n = len(kind)
    graph = coo_array((np.ones(len(i)), (i, j)), shape=(n, n))
    _, label_of = connected_components(graph, directed=False)
    whole, groups = _whole_groups(kind, label_of)
    complete = share >= 1.0
    estimate = seconds / share if share > 0 else float("nan")
    row = Row(
        f"dedup {n:,} x 768: {label}",
        ours=f"{seconds:.1f} s"
        if complete
        else f"~{estimate:.0f} s (capped: {100 * share:.0f}% in {seconds:.0f} s)",
        baseline="128 s (CPU, bench/dedup.py)",
        ratio=f"{128 / estimate:.1f}x faster" if bench.mode == "full" else "",
        goal="every planted group, no random pair",
        values=dict(
            seconds=seconds,
            share_searched=share,
            planted_pairs_found=int(planted.sum()),
            planted_pairs=expected,
            other_pairs=int((~planted).sum()),
            groups_whole=whole,
            groups=groups,
        ),
    )
    row.notes.append(
        f"dedup, {label}: {int(planted.sum()):,} of {expected:,} planted pairs, "
        f"{int((~planted).sum())} other pairs, {whole} of {groups} planted groups whole"
        + ("" if complete else " (search capped: counts cover the part searched)")
    )
    return row


# --------------------------------------------------------------------------------------- decode


def decode_section(bench: Bench) -> list[Row]:
    import torch
    from torchvision.io import decode_jpeg

    from dataminer_dagster.core.images import decode_image

    blobs = [path.read_bytes() for path in bench.frames]
    tensors = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
    batch = bench.sizes["decode_batch"]
    device = bench.device
    decode_jpeg(tensors[:batch], device=device)  # warm-up: nvjpeg handles
    bench.synchronize()
    bench.reset_peak()
    threads = os.cpu_count() or 1

    def gpu(segment: range) -> float:
        started = time.perf_counter()
        for start in range(segment.start, segment.stop, batch):
            decode_jpeg(tensors[start : min(start + batch, segment.stop)], device=device)
        bench.synchronize()
        return time.perf_counter() - started

    with ThreadPoolExecutor(threads) as pool:

        def cpu(segment: range) -> float:
            started = time.perf_counter()
            list(pool.map(decode_image, blobs[segment.start : segment.stop]))
            return time.perf_counter() - started

        done, cpu_s, gpu_s = alternate(bench, len(blobs), cpu, gpu, bench.cap("decode"))
    row = Row(
        "decode: 640x360 JPEG",
        ours=f"{done / gpu_s:,.0f} img/s (decode_jpeg on {device.type}, batch {batch})",
        baseline=f"{done / cpu_s:,.0f} img/s (OpenCV, {threads} threads)",
        ratio=f"{cpu_s / gpu_s:.2f}x",
        goal="(information)",
        values=dict(images=done, gpu_per_s=done / gpu_s, cpu_per_s=done / cpu_s, threads=threads),
    )
    row.notes.append(
        f"decode: {done} files in memory; the progress lines call OpenCV 'bare' and decode_jpeg "
        "'ours'; decode_jpeg leaves CHW RGB on the device, OpenCV HWC RGB in host memory"
    )
    return [row]


# ---------------------------------------------------------------------------------------- report


def environment(bench: Bench) -> dict[str, Any]:
    import torch
    import torchvision
    import transformers

    env = dict(
        mode=bench.mode,
        python=sys.version.split()[0],
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        transformers=transformers.__version__,
        cuda=torch.version.cuda,
        device=str(bench.device),
        gpu=torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else None,
        cpus=os.cpu_count(),
        sizes={k: v for k, v in bench.sizes.items() if k != "caps"},
        caps_s=bench.sizes["caps"],
    )
    try:
        import ultralytics

        env["ultralytics"] = ultralytics.__version__
    except ImportError as error:
        env["ultralytics"] = f"absent ({error})"
    return env


def report(bench: Bench, env: dict[str, Any]) -> str:
    lines = [
        "| section | ours | bare/baseline | ratio | goal | peak GPU MiB |",
        "|---|---|---|---|---|---:|",
    ]
    for row in bench.rows:
        peak = "" if row.peak_mib is None else f"{row.peak_mib:,.0f}"
        lines.append(
            f"| {row.section} | {row.ours} | {row.baseline} | {row.ratio} | {row.goal} | {peak} |"
        )
    notes = [f"* {note}" for row in bench.rows for note in row.notes]
    header = (
        f"torch {env['torch']} (CUDA {env['cuda']}), torchvision {env['torchvision']}, "
        f"transformers {env['transformers']}, ultralytics {env['ultralytics']}, Python "
        f"{env['python']}; device {env['device']} {env['gpu'] or ''}; {env['cpus']} CPUs; "
        f"mode {env['mode']}; total {time.perf_counter() - STARTED:.0f} s"
    )
    return "\n".join([header, "", *lines, "", *notes]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code paths")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cuda, cpu")
    parser.add_argument("--budget-s", type=float, default=360, help="no section starts after this")
    parser.add_argument("--only", nargs="+", choices=["filter", "detect", "dedup", "decode"])
    args = parser.parse_args()

    import torch
    import transformers

    from dataminer_dagster.models.loading import resolve_device

    transformers.utils.logging.disable_progress_bar()

    mode = "smoke" if args.smoke else "full"
    device = resolve_device(args.device)
    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    bench = Bench(mode, SIZES[mode], device, workdir, deadline=STARTED + args.budget_s)
    env = environment(bench)
    bench.log(json.dumps(env))
    if mode == "full" and device.type != "cuda":
        bench.log("warning: full sizes without CUDA will not finish in the budget; use --smoke")
    torch.manual_seed(0)
    sections = {
        "filter": [("filter", filter_section)],
        "detect": [("detect yolo", yolo_section), ("detect owlv2", owlv2_section)],
        "dedup": [("dedup", dedup_section)],
        "decode": [("decode", decode_section)],
    }
    try:
        try:
            bench.frames = write_frames(workdir / "frames", bench.sizes["frames"])
            bench.log(f"{len(bench.frames)} JPEGs written to {workdir / 'frames'}")
        except Exception as error:  # the sections that read frames will each say so
            print(f"section frames failed: {type(error).__name__}: {error}", flush=True)
        for name in args.only or list(sections):
            for section, run in sections[name]:
                guarded(bench, section, lambda run=run: run(bench))
                write_report(bench, env)  # so far, in case the run is stopped
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n" + write_report(bench, env))


def write_report(bench: Bench, env: dict[str, Any]) -> str:
    """The report as markdown; also $OUT/gpu.md and $OUT/gpu.json when $OUT is set."""
    text = report(bench, env)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu.md").write_text(text)
        rows = [asdict(row) for row in bench.rows]
        Path(out, "gpu.json").write_text(json.dumps(dict(environment=env, rows=rows), indent=2))
    return text


if __name__ == "__main__":
    main()
