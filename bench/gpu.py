"""GPU benchmark in one run: our code paths against the bare models, on CUDA, offline.

Sections (each guarded: a failure prints one line and the run goes on; each has a time cap):

1. filter: SigLIP2 so400m-patch14-384 sizes (random weights) through `SiglipScorer.embed_images`
   on JPEG files on disk (read on the prefetch threads, decode and preprocess on the GPU or the
   threads, forward, copy back) vs `get_image_features` on a batch already on the device; with
   the stage's defaults (GPU decoding, 2 workers), with 8 workers, and with the CPU input path
   (workers from the cores). Goals: >= 800 images/s and >= 0.9x bare.
2. detect: YOLO11 (ultralytics, random weights from the packaged yaml) and OWLv2 base-patch16 at
   960 through `load_detector(...).detect` on decoded frames (staged in pinned memory, letterbox
   or the OWLv2 processor on the device, suppression on the device) vs the model's forward pass
   on the same batch already on the device; also the libraries' own paths (ultralytics
   `predict`, the OWLv2 processor on the CPU), the preparation alone, the batch the stage would
   size from the free memory, and whether our boxes are the libraries' boxes. Goal: >= 0.85x.
3. dedup: 1,110,500 x 768 unit vectors with planted near-duplicate groups (bench/dedup.py's
   data), exact cosine range search in tiles of torch matrix products: half-precision products
   with a margin, every candidate re-checked in float32 (cosine >= threshold - 1e-6, as
   assets.dedup.grouping), and plain float32 products; vs the CPU product code (bench/dedup.py: 128 s).
   Then the product's `assets.dedup.grouping.deduplicate` itself at 110,500 and 1,110,500 vectors with the
   engine it picks on this machine (faiss-gpu, or torch on CUDA when FAISS has no GPU support)
   against `device="cpu"` (FAISS and NumPy on every core) in the same run: time, and whether both
   keep the same frames, every planted group at one frame, no random frame removed. faiss-cpu
   comes from .whl/ (k-means and the CPU engine need it).
4. decode: torchvision.io.decode_jpeg on the GPU (nvjpeg, batched) vs core.images.decode_image
   (OpenCV) on one thread per core, same files.
5. decode video: which GPU video decoder (NVDEC) the installed stack offers (torchcodec,
   torchaudio.io, OpenCV cudacodec), and why each other one is not usable; decoding through one is
   not built or measured.

Models are built from configs written here with random weights, saved with save_pretrained and
loaded through models.loading, as real weights would be; nothing is downloaded. The last lines are
one markdown table, also written to $OUT/gpu.md with the environment, and $OUT/gpu.json.

    bash bench/gpu.sh            # full sizes (CUDA machine)
    bash bench/gpu.sh --smoke    # tiny sizes, any device: checks the code paths
    bash bench/gpu.sh --dry-run  # CPU, under a minute: the script is complete (see dry_run)
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
        # The product's deduplicate: random vectors (planted ones come on top), exact up to
        # the stage's default limit.
        product_dedup=[100_000, 1_100_000],
        product_exact_limit=20_000,
        decode_batch=128,
        rounds=4,
        caps=dict(filter=120, yolo=45, owlv2=40, dedup=100, product_dedup=150, decode=20),
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
        product_dedup=[4_000],
        product_exact_limit=2_000,  # the approximate path too
        decode_batch=16,
        rounds=2,
        caps=dict(filter=30, yolo=20, owlv2=20, dedup=30, product_dedup=30, decode=10),
    ),
    # --dry-run: every section once, as small as still exercises its code
    "dry": dict(
        frames=12,
        filter_batch=4,
        filter_inputs=[{}, dict(decode_on_device=True)],
        yolo=["yolo11n.yaml"],
        yolo_batch=4,
        yolo_images=8,
        owl_batch=2,
        owl_images=4,
        dedup_random=1_000,
        dedup_tile=2_048,
        product_dedup=[1_000],
        product_exact_limit=2_000,  # the approximate path too
        decode_batch=4,
        rounds=1,
        caps=dict(filter=10, yolo=10, owlv2=10, dedup=10, product_dedup=20, decode=5),
    ),
}
# Confidence of the YOLO agreement check: a random-weight YOLO scores every class near its
# initial prior (about 1e-5 for 80 classes), so the bench's 0.25 leaves nothing to compare.
YOLO_AGREEMENT_CONFIDENCE = 1e-6


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


def preset(table: dict[str, Any], mode: str) -> dict[str, Any]:
    """A model preset of SIGLIP or OWLV2: the real sizes in full mode, tiny ones otherwise."""
    return table["full" if mode == "full" else "smoke"]


@dataclass
class Bench:
    mode: str  # full, smoke or dry (the sizes); models are tiny unless full
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
    others: dict[str, Callable[[range], float]] | None = None,
) -> tuple[int, dict[str, float]]:
    """Bare, ours and any `others` take turns over segments of `count` items until done or
    `cap_s` is spent.

    Returns (items measured, seconds by name: bare, ours, others); the same items go through all.
    """
    timers = {"bare": bare, "ours": ours, **(others or {})}
    started = time.perf_counter()
    done, seconds = 0, dict.fromkeys(timers, 0.0)
    for segment in segments(count, bench.sizes["rounds"]):
        for name, timer in timers.items():
            seconds[name] += timer(segment)
        done += len(segment)
        rates = ", ".join(f"{name} {done / spent:.1f}/s" for name, spent in seconds.items())
        bench.log(f"  {done}/{count}: {rates}, ratio {seconds['bare'] / seconds['ours']:.3f}")
        if time.perf_counter() - started > cap_s:
            bench.log(f"  time cap {cap_s:.0f} s reached after {done} of {count}")
            break
    return done, seconds


def throughput_row(
    section: str, done: int, seconds: dict[str, float], goal: str, extra: dict | None = None
) -> Row:
    """Ours against bare; other timers' rates go into the raw values as `<name>_per_s`."""
    rates = {f"{name}_per_s": done / spent for name, spent in seconds.items()}
    return Row(
        section,
        ours=f"{rates['ours_per_s']:,.1f} img/s",
        baseline=f"{rates['bare_per_s']:,.1f} img/s",
        ratio=f"{seconds['bare'] / seconds['ours']:.3f}",
        goal=goal,
        values=dict(images=done, **rates, **(extra or {})),
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


def siglip_config(mode: str, tokenizer: Any) -> Any:
    """The SiglipConfig of the mode's preset, with the token ids of `tokenizer`."""
    from transformers import SiglipConfig

    text = dict(preset(SIGLIP, mode)["text"])
    text.setdefault("vocab_size", len(tokenizer))
    text.update(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return SiglipConfig(text_config=text, vision_config=preset(SIGLIP, mode)["vision"])


def owlv2_config(mode: str, tokenizer: Any) -> Any:
    """The Owlv2Config of the mode's preset, with the token ids of `tokenizer`."""
    from transformers import Owlv2Config

    sizes = preset(OWLV2, mode)
    text = dict(sizes["text"], max_position_embeddings=OWLV2_TEXT_TOKENS)
    text.setdefault("vocab_size", len(tokenizer))
    text.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Owlv2Config(
        text_config=text, vision_config=sizes["vision"], projection_dim=sizes["projection_dim"]
    )


def siglip_processor(workdir: Path) -> Any:
    """The tiny SigLIP's processor (its tokenizer and a real image processor)."""
    from transformers import AutoProcessor

    from dataminer_dagster.models.tiny import build_tiny_siglip

    return AutoProcessor.from_pretrained(build_tiny_siglip(workdir / "siglip-tokenizer"))


def owlv2_processor(workdir: Path) -> Any:
    """The tiny OWLv2's processor, reading OWLv2's 16 tokens."""
    from transformers import Owlv2Processor

    from dataminer_dagster.models.tiny_detectors import build_tiny_owlv2

    processor = Owlv2Processor.from_pretrained(build_tiny_owlv2(workdir / "owl-tokenizer"))
    processor.tokenizer.model_max_length = OWLV2_TEXT_TOKENS
    return processor


def build_siglip(bench: Bench, directory: Path) -> Path:
    """A SiglipModel of the preset's sizes with the tiny SigLIP tokenizer and a real processor."""
    from transformers import SiglipModel

    sizes = preset(SIGLIP, bench.mode)
    processor = siglip_processor(bench.workdir)
    model = random_model(SiglipModel, siglip_config(bench.mode, processor.tokenizer), bench.device)
    size = sizes["vision"]["image_size"]
    processor.image_processor.size = {"height": size, "width": size}
    processor.image_processor.resample = 2  # bilinear, as google/siglip2-*-patch14-384
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    bench.log(f"  {sizes['name']}: {parameters / 1e6:.0f}M parameters saved to {directory}")
    return directory


def build_owlv2(bench: Bench, directory: Path) -> Path:
    """An Owlv2ForObjectDetection of the preset's sizes with the tiny CLIP tokenizer."""
    import torch
    from transformers import Owlv2ForObjectDetection

    sizes = preset(OWLV2, bench.mode)
    processor = owlv2_processor(bench.workdir)
    config = owlv2_config(bench.mode, processor.tokenizer)
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
    size = sizes["vision"]["image_size"]
    processor.image_processor.size = {"height": size, "width": size}
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    bench.log(f"  {sizes['name']}: {parameters / 1e6:.0f}M parameters saved to {directory}")
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
    done, seconds = alternate(bench, len(bench.frames), bare, ours, cap_s)
    name = preset(SIGLIP, bench.mode)["name"]
    row = throughput_row(
        f"filter: {name}, {setting}",
        done,
        seconds,
        ">= 800 img/s and >= 0.9x",
        dict(workers=workers, decode_on=decode_on, batch=batch, model_wait_s=wait[0]),
    )
    row.notes.append(
        f"filter, {setting}: batch {batch}, {done} JPEGs 640x360 from disk, "
        f"{scorer.loaded.dtype}; the model waited for input "
        f"{100 * wait[0] / seconds['ours']:.0f}% of "
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
    network = detector.network  # the fused network ours runs, in the precision ours asked for
    pixels = detector.prepare(frames[:batch]).pixels  # our letterboxed batch, on the device
    detector.detect(frames[:batch])  # warm-up
    _yolo_predict(detector, frames[:batch], batch)
    with torch.inference_mode():
        network.backend(pixels)
    bench.synchronize()
    bench.reset_peak()
    found = [0]

    def bare(segment: range) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            for start in range(0, len(segment), batch):
                network.backend(pixels[: min(batch, len(segment) - start)])
        bench.synchronize()
        return time.perf_counter() - started

    def ours(segment: range) -> float:
        started = time.perf_counter()
        found[0] += sum(len(d) for d in detector.detect(frames[segment.start : segment.stop]))
        return time.perf_counter() - started

    def predict(segment: range) -> float:
        started = time.perf_counter()
        _yolo_predict(detector, frames[segment.start : segment.stop], batch)
        return time.perf_counter() - started

    done, seconds = alternate(
        bench,
        len(frames),
        bare,
        ours,
        bench.cap("yolo"),
        others={"predict": predict, "prepare": _preparation_timer(bench, detector, frames, batch)},
    )
    peak_mib = bench.peak_mib()
    model = name.removesuffix(".yaml")
    height, width = pixels.shape[2:]
    auto_batch, agreement = _yolo_checks(bench, name, frames[:batch])
    row = throughput_row(
        f"detect: {model}",
        done,
        seconds,
        ">= 0.85x",
        dict(batch=batch, input=[height, width], auto_batch=auto_batch, agreement=agreement),
    )
    row.notes.append(
        f"{model}: batch {batch}, frames 640x360 in memory, network input {width}x{height} "
        f"{str(network.dtype).removeprefix('torch.')}; ours = detect (frames staged, pinned on "
        f"CUDA; letterbox on the device; NMS; one copy back per batch); "
        f"{found[0] / done:.1f} detections per "
        f"frame. ultralytics predict: {done / seconds['predict']:,.1f} img/s; our preparation "
        f"alone: {done / seconds['prepare']:,.1f} img/s; batch_size unset would take "
        f"{auto_batch}. Same boxes as predict (confidence {YOLO_AGREEMENT_CONFIDENCE}, IoU >= "
        "0.9, same label): "
        + "; ".join(f"{size}: {_agreement_note(counts)}" for size, counts in agreement.items())
    )
    row.peak_mib = peak_mib
    return row


def _yolo_checks(
    bench: Bench, name: str, frames: list[np.ndarray]
) -> tuple[int, dict[str, dict[str, int]]]:
    """The batch the stage would size from the free memory, and whether ours gives predict's
    boxes on frames that are only padded (640x360) and on frames also resized (1280x720)."""
    import cv2

    from dataminer_dagster.models.detectors import load_detector

    device = str(bench.device)
    auto_batch = load_detector("yolo", name, confidence=0.25, device=device).batch_size(
        frames[0].shape
    )
    loose = load_detector("yolo", name, confidence=YOLO_AGREEMENT_CONFIDENCE, device=device)
    agreement = {}
    for size in ((640, 360), (1280, 720)):
        sample = [cv2.resize(frame, size) for frame in frames]
        agreement[f"{size[0]}x{size[1]}"] = _agreement(
            loose.detect(sample), _yolo_predict(loose, sample, len(sample))
        )
    return auto_batch, agreement


def _yolo_predict(detector: Any, frames: list[np.ndarray], batch: int) -> list[list[Any]]:
    """ultralytics' own path, as the detector took it before the device path: predict on BGR
    frames, batch by batch, Results converted to detections."""
    import torch

    from dataminer_dagster.models.detection_boxes import to_detections

    precision = {"quantize": 16} if detector.network.dtype == torch.float16 else {}
    results = []
    for start in range(0, len(frames), batch):
        part = frames[start : start + batch]
        predictions = detector.model.predict(
            [np.ascontiguousarray(f[:, :, ::-1]) for f in part],
            conf=detector.confidence,
            classes=detector.class_ids,
            device=str(detector.plan.device),
            verbose=False,
            **precision,
        )
        for frame, prediction in zip(part, predictions, strict=True):
            boxes = prediction.boxes
            labels = [detector.names[int(c)] for c in boxes.cls.tolist()]
            results.append(
                to_detections(boxes.xyxy, boxes.conf, labels, frame.shape, detector.confidence)
            )
    return results


def _preparation_timer(
    bench: Bench, detector: Any, frames: list[np.ndarray], batch: int
) -> Callable[[range], float]:
    """Seconds for our preparation alone (staging, copy, preprocessing on the device)."""

    def prepare(segment: range) -> float:
        started = time.perf_counter()
        for start in range(segment.start, segment.stop, batch):
            detector.prepare(frames[start : min(start + batch, segment.stop)])
        bench.synchronize()
        return time.perf_counter() - started

    return prepare


def _agreement(ours: list[list[Any]], theirs: list[list[Any]]) -> dict[str, int]:
    """How many of our detections have one of the same label in the library's result with an
    IoU of at least 0.9, and the other way round."""

    def iou(a: Any, b: Any) -> float:
        width = min(a.x + a.w, b.x + b.w) - max(a.x, b.x)
        height = min(a.y + a.h, b.y + b.h) - max(a.y, b.y)
        inter = max(width, 0) * max(height, 0)
        return inter / (a.w * a.h + b.w * b.h - inter)

    def matched(left: list[list[Any]], right: list[list[Any]]) -> int:
        return sum(
            any(d.label == e.label and iou(d, e) >= 0.9 for e in other)
            for found, other in zip(left, right, strict=True)
            for d in found
        )

    return dict(
        ours=sum(map(len, ours)),
        theirs=sum(map(len, theirs)),
        ours_matched=matched(ours, theirs),
        theirs_matched=matched(theirs, ours),
    )


def _agreement_note(agreement: dict[str, int]) -> str:
    return (
        f"{agreement['ours_matched']} of our {agreement['ours']}, "
        f"{agreement['theirs_matched']} of its {agreement['theirs']}"
    )


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
    inputs = detector.prepare(frames[:batch]).inputs  # our batch, on the device
    with torch.inference_mode():
        detector.model(**inputs)
    library = _owlv2_library_path(detector, frames[:batch], batch)
    bench.synchronize()
    bench.reset_peak()
    found = [0]

    def ours(segment: range) -> float:
        started = time.perf_counter()
        found[0] += sum(len(d) for d in detector.detect(frames[segment.start : segment.stop]))
        return time.perf_counter() - started

    def processor_on_cpu(segment: range) -> float:
        started = time.perf_counter()
        _owlv2_library_path(detector, frames[segment.start : segment.stop], batch)
        return time.perf_counter() - started

    done, seconds = alternate(
        bench,
        len(frames),
        _owlv2_bare_timer(bench, detector, inputs, batch),
        ours,
        bench.cap("owlv2"),
        others={
            "processor_on_cpu": processor_on_cpu,
            "prepare": _preparation_timer(bench, detector, frames, batch),
        },
    )
    peak_mib = bench.peak_mib()
    auto = load_detector(
        "owlv2", str(model_dir), prompts=PROMPTS, confidence=0.3, device=str(bench.device)
    )
    auto_batch = auto.batch_size(frames[0].shape)
    agreement = _agreement(detector.detect(frames[:batch]), library)
    row = throughput_row(
        "detect: OWLv2 base 960" if bench.mode == "full" else "detect: OWLv2 tiny",
        done,
        seconds,
        ">= 0.85x",
        dict(batch=batch, auto_batch=auto_batch, agreement=agreement),
    )
    row.notes.append(
        _owlv2_note(bench, detector, done, seconds, found[0] / done, auto_batch)
        + " Same boxes as the processor on the CPU (IoU >= 0.9, same label): "
        + _agreement_note(agreement)
    )
    row.peak_mib = peak_mib
    return [row]


def _owlv2_note(bench, detector, done, seconds, per_frame, auto_batch) -> str:
    size = preset(OWLV2, bench.mode)["vision"]["image_size"]
    return (
        f"OWLv2: batch {detector.batch_limit}, {len(PROMPTS)} prompts, input {size}x{size} "
        f"{detector.dtype}; ours = detect (frames staged, pinned on CUDA; "
        f"{type(detector.processor.image_processor).__name__} on the device; post-processing and "
        f"NMS on the device; one copy back per batch); {per_frame:.1f} detections per frame. The "
        f"processor on the CPU (the path before): {done / seconds['processor_on_cpu']:,.1f} "
        f"img/s; our preparation alone: {done / seconds['prepare']:,.1f} img/s; batch_size unset "
        f"would take {auto_batch}."
    )


def _owlv2_bare_timer(
    bench: Bench, detector: Any, inputs: dict[str, Any], batch: int
) -> Callable[[range], float]:
    """Seconds for the model's forward pass alone on `inputs`, a batch already on the device."""
    import torch

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

    return bare


def _owlv2_library_path(detector: Any, frames: list[np.ndarray], batch: int) -> list[list[Any]]:
    """OWLv2 as the detector ran it before the device path: the processor on the CPU, the
    forward on the device, post-processing and NMS on the CPU in float32."""
    import torch

    from dataminer_dagster.models.detection_boxes import to_detections
    from dataminer_dagster.models.open_vocabulary_detectors import _nms

    device, results = detector.plan.device, []
    for start in range(0, len(frames), batch):
        part = frames[start : start + batch]
        inputs = detector.processor(
            text=[PROMPTS] * len(part),
            images=part,
            input_data_format="channels_last",
            return_tensors="pt",
        )
        inputs = {
            key: value.to(device, dtype=detector.dtype)
            if value.is_floating_point()
            else value.to(device)
            for key, value in dict(inputs).items()
        }
        with torch.inference_mode():
            outputs = detector.model(**inputs)
        outputs.logits = outputs.logits.float().cpu()
        outputs.pred_boxes = outputs.pred_boxes.float().cpu()
        processed = detector.processor.post_process_grounded_object_detection(
            outputs=outputs,
            threshold=detector.confidence,
            target_sizes=[frame.shape[:2] for frame in part],
        )
        for frame, found in zip(part, processed, strict=True):
            boxes, scores, ids = _nms(found["boxes"], found["scores"], found["labels"])
            labels = [PROMPTS[int(k)] for k in ids.tolist()]
            results.append(to_detections(boxes, scores, labels, frame.shape, detector.confidence))
    return results


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

    from dataminer_dagster.assets.dedup.grouping import SIMILARITY_TOLERANCE

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


def product_dedup_section(bench: Bench) -> list[Row]:
    """The product's deduplicate with the engine it picks here, against device="cpu"."""
    import dedup as dedup_bench  # bench/dedup.py: the CPU benchmark's data and checks

    from dataminer_dagster.assets.dedup.pair_search import search_engine

    engine = search_engine("auto")
    options = argparse.Namespace(
        threshold=DEDUP_THRESHOLD,
        exact_limit=bench.sizes["product_exact_limit"],
        nprobe=16,
        recall_sample=1000,
    )
    started = time.perf_counter()
    rows, cpu_per_auto = [], None
    for random_count in bench.sizes["product_dedup"]:
        data = dedup_bench.make_data(random_count, 768, 100, seed=0)
        bench.reset_peak()
        ours = dedup_bench.run_ours(data, options, device="auto")
        peak = bench.peak_mib()
        # The CPU takes about cpu_per_auto times as long; skip it when it would overrun the cap.
        estimate = None if cpu_per_auto is None else cpu_per_auto * ours.seconds
        spent = time.perf_counter() - started
        cpu = None
        if estimate is None or spent + estimate <= bench.cap("product_dedup"):
            cpu = dedup_bench.run_ours(data, options, device="cpu")
            cpu_per_auto = cpu.seconds / ours.seconds
        rows.append(_product_dedup_row(engine, data, ours, cpu, estimate, peak))
        bench.log(f"  {len(data.x):,} vectors: {rows[-1].ours}; CPU {rows[-1].baseline}")
    return rows


def _product_dedup_row(engine, data, ours, cpu, estimate, peak) -> Row:
    import dedup as dedup_bench

    n = len(data.x)
    summary = dedup_bench.summarise(data, ours)
    groups = dedup_bench.GROUPS + 1  # the near-duplicate groups and the identical copies
    at_one = (
        summary["in-video groups at 1"]
        + summary["spread groups at 1"]
        + int(summary["identical kept"] == 1)
    )
    same = None if cpu is None else bool((ours.kept == cpu.kept).all())
    row = Row(
        f"dedup {n:,} x 768: product deduplicate, engine {engine}",
        ours=f"{ours.seconds:.1f} s",
        baseline=f"skipped: about {estimate:.0f} s, past the section's cap"
        if cpu is None
        else f"{cpu.seconds:.1f} s (device cpu, {os.cpu_count()} CPUs)",
        ratio="" if cpu is None else f"{cpu.seconds / ours.seconds:.2f}x (CPU s / ours)",
        goal="same frames as the CPU, every planted group to 1, no random frame removed",
        peak_mib=peak,
        values=dict(
            vectors=n,
            engine=engine,
            seconds=ours.seconds,
            cpu_seconds=None if cpu is None else cpu.seconds,
            kept=summary["kept"],
            planted_groups_at_one=at_one,
            planted_groups=groups,
            random_removed=summary["random removed"],
            recall=ours.recall,
            same_frames_as_cpu=same,
        ),
    )
    row.notes.append(
        f"product dedup {n:,}: {ours.method}, {summary['kept']:,} kept, {at_one} of {groups} "
        f"planted groups at one frame, {summary['random removed']} random frames removed, "
        f"recall estimate {ours.recall}; "
        + ("the CPU run was skipped" if same is None else f"same frames as device cpu: {same}")
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

        done, seconds = alternate(bench, len(blobs), cpu, gpu, bench.cap("decode"))
    cpu_s, gpu_s = seconds["bare"], seconds["ours"]
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


def nvdec_section(bench: Bench) -> list[Row]:
    """Which GPU video decoder (NVDEC) this stack offers; measuring one is not built yet."""
    found, missing = video_decoders_on_gpu()
    row = Row(
        "decode video: NVDEC",
        ours=f"available: {', '.join(found)}" if found else "not available in this stack",
        baseline="OpenCV on the CPU (the extract stage's decoder)",
        goal="(information: measure when available)",
        values=dict(available=found, missing=missing),
    )
    row.notes.append(
        "NVDEC: "
        + (f"available through {', '.join(found)}; " if found else "")
        + "; ".join(missing)
        + (
            "; decoding through it is not built or measured yet"
            if found
            else "; the extract stage decodes with OpenCV on the CPU"
        )
    )
    return [row]


def video_decoders_on_gpu() -> tuple[list[str], list[str]]:
    """(the GPU video decoders this Python can use, why each other one cannot be used)."""
    found, missing = [], []

    def why(name: str, error: Exception) -> str:
        return f"{name}: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"

    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401

        found.append("torchcodec")
    except Exception as error:  # ImportError, or its FFmpeg libraries missing
        missing.append(why("torchcodec", error))
    try:
        from torchaudio.io import StreamReader  # noqa: F401 (torchaudio 2.9 dropped torchaudio.io)

        found.append("torchaudio.io StreamReader (h264_cuvid)")
    except Exception as error:
        missing.append(why("torchaudio.io", error))
    try:
        import cv2

        if hasattr(cv2, "cudacodec") and cv2.cuda.getCudaEnabledDeviceCount() > 0:
            found.append("OpenCV cudacodec")
        else:
            missing.append(f"OpenCV {cv2.__version__}: no cudacodec or no CUDA device")
    except Exception as error:
        missing.append(why("OpenCV", error))
    return found, missing


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


SECTIONS: dict[str, list[tuple[str, Callable[[Bench], list[Row]]]]] = {
    "filter": [("filter", filter_section)],
    "detect": [("detect yolo", yolo_section), ("detect owlv2", owlv2_section)],
    "dedup": [("dedup", dedup_section), ("dedup product", product_dedup_section)],
    "decode": [("decode", decode_section), ("decode video", nvdec_section)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code paths")
    parser.add_argument(
        "--dry-run", action="store_true", help="check on the CPU that the script is complete"
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cuda, cpu")
    parser.add_argument("--budget-s", type=float, default=360, help="no section starts after this")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS))
    args = parser.parse_args()

    import torch
    import transformers

    from dataminer_dagster.models.loading import resolve_device

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    if args.dry_run:
        sys.exit(dry_run(args.budget_s))
    mode = "smoke" if args.smoke else "full"
    device = resolve_device(args.device)
    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    bench = Bench(mode, SIZES[mode], device, workdir, deadline=STARTED + args.budget_s)
    env = environment(bench)
    bench.log(json.dumps(env))
    if mode == "full" and device.type != "cuda":
        bench.log("warning: full sizes without CUDA will not finish in the budget; use --smoke")
    run_sections(bench, env, args.only or list(SECTIONS))
    print("\n" + write_report(bench, env))


def run_sections(bench: Bench, env: dict[str, Any], names: Sequence[str]) -> None:
    """Write the frames, run the named sections (the report rewritten after each), clean up."""
    try:
        try:
            bench.frames = write_frames(bench.workdir / "frames", bench.sizes["frames"])
            bench.log(f"{len(bench.frames)} JPEGs written to {bench.workdir / 'frames'}")
        except Exception as error:  # the sections that read frames will each say so
            print(f"section frames failed: {type(error).__name__}: {error}", flush=True)
        for name in names:
            for section, run in SECTIONS[name]:
                guarded(bench, section, lambda run=run: run(bench))
                write_report(bench, env)  # so far, in case the run is stopped
    finally:
        shutil.rmtree(bench.workdir, ignore_errors=True)


def write_report(bench: Bench, env: dict[str, Any]) -> str:
    """The report as markdown; also $OUT/gpu.md and $OUT/gpu.json when $OUT is set."""
    text = report(bench, env)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu.md").write_text(text)
        rows = [asdict(row) for row in bench.rows]
        Path(out, "gpu.json").write_text(json.dumps(dict(environment=env, rows=rows), indent=2))
    return text


# -------------------------------------------------------------------------------------- dry run

# Parameters of the real checkpoints the full run stands in for (model cards; ultralytics docs).
PUBLISHED_PARAMETERS = {
    "SigLIP2 so400m-patch14-384 vision tower": 428e6,
    "SigLIP2 so400m-patch14-384": 1.14e9,
    "OWLv2 base-patch16 960": 155e6,
    "yolo11m": 20.1e6,
    "yolo11l": 25.3e6,
}


def dry_run(budget_s: float) -> int:
    """Check on the CPU, in well under a minute, that a full run has everything it needs.

    1. Every section has a time cap in every size preset, and --only names them all.
    2. Every full-size architecture builds with random weights, with the parameter count of the
       real checkpoint (within 1%), and its forward pass gives the real output shape: SigLIP2
       so400m and OWLv2 on the meta device (no weights allocated), YOLO11m/l on the CPU.
    3. Every section runs at the smallest sizes on the CPU and leaves rows that did not fail.
    4. The report is written to $OUT (a temporary folder when unset) and reads back.
    5. The environment has what the run imports, and the packages gpu.sh installed from wheels
       (GPU_BENCH_SITE) import from where they were installed.

    One line per check; the exit status is 1 when any failed.
    """
    import torch

    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-dry-"))
    out = os.environ.setdefault("OUT", str(workdir / "out"))
    problems: list[str] = []

    def check(name: str, run: Callable[[], str]) -> None:
        try:
            print(f"dry run: {name}: {run()}", flush=True)
        except Exception as error:
            first_line = (str(error).strip().splitlines() or [""])[0]
            problems.append(f"{name}: {type(error).__name__}: {first_line}")
            print(f"dry run: {name}: FAILED {type(error).__name__}: {first_line}", flush=True)
            _append_error_log(f"dry run {name}", traceback.format_exc())

    try:
        check("sections", _check_sections)
        check("environment", _check_environment)
        check("wheels", _check_wheels)
        check("SigLIP2 so400m-patch14-384", lambda: _check_siglip(workdir))
        check("OWLv2 base-patch16 960", lambda: _check_owlv2(workdir))
        for name in SIZES["full"]["yolo"]:
            check(name.removesuffix(".yaml"), lambda name=name: _check_yolo(name))
        bench = Bench(
            "dry", SIZES["dry"], torch.device("cpu"), workdir / "sections", STARTED + budget_s
        )
        bench.workdir.mkdir()
        env = environment(bench)
        run_sections(bench, env, list(SECTIONS))
        print("\n" + write_report(bench, env), flush=True)
        check("sections ran", lambda: _check_rows(bench))
        check("report", lambda: _check_report(Path(out), bench))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    total = time.perf_counter() - STARTED
    if problems:
        print(f"dry run: {len(problems)} problem(s) in {total:.0f} s: " + "; ".join(problems))
        return 1
    print(f"dry run: complete in {total:.0f} s")
    return 0


def _check_sections() -> str:
    for mode, sizes in SIZES.items():
        sections = {"filter", "yolo", "owlv2", "dedup", "product_dedup", "decode"}
        missing = sections - set(sizes["caps"])
        if missing:
            raise KeyError(f"size preset {mode} has no time cap for {sorted(missing)}")
    sections = [section for runs in SECTIONS.values() for section, _ in runs]
    return f"{len(sections)} sections ({', '.join(sections)}) in {len(SIZES)} size presets"


def _check_environment() -> str:
    import faiss  # the product's dedup needs it; gpu.sh installs faiss-cpu from .whl there
    import torch
    import torchvision
    import transformers
    import ultralytics  # the YOLO rows need it; gpu.sh installs it from .whl on the GPU machine
    from torchvision.io import decode_jpeg  # noqa: F401 (the decode section and the filter's)

    return (
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, transformers "
        f"{transformers.__version__}, ultralytics {ultralytics.__version__}, faiss "
        f"{faiss.__version__}"
    )


def _check_wheels() -> str:
    """Each package gpu.sh installed from a wheel imports from the folder it went to."""
    import importlib

    site = os.environ.get("GPU_BENCH_SITE")
    if not site:
        return "no wheels folder: every package comes from the environment"
    imported = []
    for record in sorted(Path(site).glob("*.dist-info/RECORD")):
        tops = {
            line.split("/", 1)[0].removesuffix(".py")
            for line in record.read_text().splitlines()
            if line and ".dist-info/" not in line.split(",", 1)[0]
        }
        for top in sorted(t for t in tops if t.isidentifier()):
            module = importlib.import_module(top)
            where = Path(module.__file__ or "").resolve()
            if not where.is_relative_to(Path(site).resolve()):
                raise ImportError(f"{top} imports from {where}, not from the wheel in {site}")
            imported.append(top)
    if not imported:
        raise ImportError(f"no package was installed into {site}")
    return f"{', '.join(imported)} import from {site}"


def _meta_model(model_class: Any, config: Any) -> Any:
    import torch

    with torch.device("meta"):
        return model_class(config).eval()


def _parameters(name: str, module: Any) -> str:
    count = sum(p.numel() for p in module.parameters())
    expected = PUBLISHED_PARAMETERS[name]
    if abs(count - expected) > 0.01 * expected:
        raise ValueError(f"{name} has {count:,} parameters; the real one about {expected:,.0f}")
    return f"{count / 1e6:,.1f}M parameters"


def _check_siglip(workdir: Path) -> str:
    import torch
    from transformers import SiglipModel

    processor = siglip_processor(workdir)
    model = _meta_model(SiglipModel, siglip_config("full", processor.tokenizer))
    name = "SigLIP2 so400m-patch14-384"
    vision = _parameters(f"{name} vision tower", model.vision_model)
    side = SIGLIP["full"]["vision"]["image_size"]
    with torch.inference_mode():
        features = model.get_image_features(
            pixel_values=torch.empty(2, 3, side, side, device="meta")
        )
    shape = tuple(getattr(features, "pooler_output", features).shape)
    if shape != (2, SO400M["hidden_size"]):
        raise ValueError(f"image features of shape {shape}")
    return f"{_parameters(name, model)} ({vision} in the vision tower), features {shape} on meta"


def _check_owlv2(workdir: Path) -> str:
    import torch
    from transformers import Owlv2ForObjectDetection

    processor = owlv2_processor(workdir)
    model = _meta_model(Owlv2ForObjectDetection, owlv2_config("full", processor.tokenizer))
    vision = OWLV2["full"]["vision"]
    side, patches = vision["image_size"], (vision["image_size"] // vision["patch_size"]) ** 2
    with torch.inference_mode():
        # no attention mask: building one reads values, which meta tensors do not have
        outputs = model(
            input_ids=torch.zeros(
                2 * len(PROMPTS), OWLV2_TEXT_TOKENS, dtype=torch.long, device="meta"
            ),
            pixel_values=torch.empty(2, 3, side, side, device="meta"),
        )
    shape = tuple(outputs.logits.shape)
    if shape != (2, patches, len(PROMPTS)) or tuple(outputs.pred_boxes.shape) != (2, patches, 4):
        raise ValueError(f"logits {shape}, boxes {tuple(outputs.pred_boxes.shape)}")
    return f"{_parameters('OWLv2 base-patch16 960', model)}, logits {shape} on meta"


def _check_yolo(name: str) -> str:
    import torch
    from ultralytics.nn.tasks import DetectionModel

    from dataminer_dagster.models.yolo_detector import Letterbox

    # ultralytics computes its strides with a forward pass, which the meta device cannot run
    model = DetectionModel(name, verbose=False).eval()
    stride = int(model.stride.max())
    box = Letterbox.of((360, 640), (640, 640), stride, rect=True)
    height, width = box.height + box.top + box.bottom, box.width + box.left + box.right
    with torch.inference_mode():
        output = model(torch.zeros(1, 3, height, width))
    shape = tuple((output[0] if isinstance(output, (list, tuple)) else output).shape)
    cells = sum((height // s) * (width // s) for s in model.stride.int().tolist())
    if shape != (1, 4 + len(model.names), cells):
        raise ValueError(f"output of shape {shape} for a {width}x{height} input")
    return (
        f"{_parameters(name.removesuffix('.yaml'), model)}, output {shape} for 640x360 frames "
        f"(network input {width}x{height})"
    )


def _check_rows(bench: Bench) -> str:
    bad = [row.section for row in bench.rows if row.ours.startswith(("failed", "skipped"))]
    if bad:
        raise RuntimeError(f"rows that failed or were skipped: {bad}")
    expected = sum(len(runs) for runs in SECTIONS.values())
    if len(bench.rows) < expected:
        raise RuntimeError(f"{len(bench.rows)} rows for {expected} sections")
    return f"{len(bench.rows)} rows, none failed"


def _check_report(out: Path, bench: Bench) -> str:
    table = (out / "gpu.md").read_text()
    missing = [row.section for row in bench.rows if f"| {row.section} |" not in table]
    rows = json.loads((out / "gpu.json").read_text())["rows"]
    if missing or len(rows) != len(bench.rows) or "| section | ours |" not in table:
        raise ValueError(f"{out} lacks rows {missing} ({len(rows)} in gpu.json)")
    return f"{out / 'gpu.md'} and gpu.json hold the {len(rows)} rows"


if __name__ == "__main__":
    main()
