"""Tiny random-weight detectors of the real architectures, for tests and the offline demo.

Each builder writes what the real model's distribution looks like on disk, so `load_detector`
reads it through the same code path as real weights:

* `build_tiny_yolo`: an ultralytics YOLOv8 detection model (the `yolov8.yaml` graph at a tiny
  width) with the 80 COCO class names, saved as a `.pt` checkpoint that `YOLO(path)` loads.
* `build_tiny_owlv2`: OWLv2 (`Owlv2ForObjectDetection`) with a CLIP byte-level BPE tokenizer and
  the OWLv2 image processor, saved with `save_pretrained`.
* `build_tiny_grounding_dino`: Grounding DINO (Swin backbone, BERT text encoder, deformable
  encoder/decoder) with a WordPiece tokenizer, saved with `save_pretrained`.

The tokenizers are built here from a generated vocabulary; nothing is downloaded. The weights are
random but seeded, so the same seed gives the same model. A few parameters are set so that random
weights still produce detections worth looking at (scores spread over (0, 1), boxes inside the
frame) instead of all-zero or all-saturated outputs. The models detect nothing meaningful.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TINY_OWLV2_IMAGE_SIZE = 64  # OWLv2 input side (frames are padded to a square and resized)
# Grounding DINO's shortest input side. Its smallest feature map is 1/64 of the input and is
# group-normalised, which needs more than one pixel: 128 keeps square frames at 2x2.
TINY_GROUNDING_DINO_IMAGE_SIZE = 128
TINY_YOLO_IMAGE_SIZE = 128  # inference size stored in the tiny YOLO checkpoint
# Real OWLv2 reads 16 tokens, about a dozen words of CLIP BPE. The tiny tokenizer has no merges
# (one token per character), so it gets a longer context to accept prompts of the same length.
OWLV2_MAX_TEXT_TOKENS = 64


def coco_class_names() -> list[str]:
    """The 80 COCO class names, in the order of ultralytics' COCO-trained checkpoints."""
    from ultralytics.utils import ROOT, YAML

    names = YAML.load(ROOT / "cfg" / "datasets" / "coco.yaml")["names"]
    return [names[i] for i in sorted(names)]


def build_tiny_yolo(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny YOLOv8 detection checkpoint with the COCO classes to `path` (a .pt file)."""
    import torch
    import ultralytics
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    path = Path(path)
    if path.suffix != ".pt":
        raise ValueError(f"A YOLO checkpoint path must end in .pt, got {path}")
    names = coco_class_names()
    config = yaml_model_load("yolov8n.yaml")
    config["scales"] = {"n": [0.33, 0.0625, 64]}  # depth, width, max channels: ~0.36M parameters
    with _seeded(seed) as generator:
        model = DetectionModel(config, nc=len(names), verbose=False)
        _calibrate_batch_norm(model, generator)
        # The trained-model bias init (class prior 1e-2 per cell) leaves random-weight scores
        # near zero. Per-class biases around sigmoid(-5) and stronger class weights let the
        # image decide which classes pass a usual threshold, so several classes show up.
        with torch.no_grad():
            for head in model.model[-1].cv3:
                head[-1].weight.mul_(2.5)
                head[-1].bias.copy_(0.5 * torch.randn(len(names), generator=generator) - 5.0)
    model.names = dict(enumerate(names))
    model.args = {"task": "detect", "imgsz": TINY_YOLO_IMAGE_SIZE}
    checkpoint = {
        "model": model.half(),
        "ema": None,
        "train_args": {"task": "detect", "imgsz": TINY_YOLO_IMAGE_SIZE},
        "version": ultralytics.__version__,
        "docs": "tiny random-weight YOLOv8 built by dataminer_dagster.models.tiny_detectors",
    }
    with _replacing_path(path) as tmp:
        torch.save(checkpoint, tmp)
    return path


def build_tiny_owlv2(directory: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny OWLv2 model, processor and tokenizer to `directory`."""
    import torch
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
    )

    tokenizer = CLIPTokenizer(
        vocab=_clip_byte_vocab(), merges=[], model_max_length=OWLV2_MAX_TEXT_TOKENS
    )
    config = Owlv2Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": OWLV2_MAX_TEXT_TOKENS,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": TINY_OWLV2_IMAGE_SIZE,
            "patch_size": 16,
        },
        projection_dim=32,
    )
    with _seeded(seed):
        model = Owlv2ForObjectDetection(config).eval()
        with torch.no_grad():
            # Boxes: the per-patch prior (a patch-sized box on its patch) instead of random
            # offsets that throw every box off the frame.
            model.box_head.dense2.weight.zero_()
            model.box_head.dense2.bias.zero_()
            # Logits = (cosine + shift) * scale: a constant scale of 5 spreads the scores.
            model.class_head.logit_scale.weight.zero_()
            model.class_head.logit_scale.bias.fill_(4.0)
            model.class_head.logit_shift.weight.mul_(0.1)
            model.class_head.logit_shift.bias.fill_(-0.3)
    image_processor = Owlv2ImageProcessor(
        size={"height": TINY_OWLV2_IMAGE_SIZE, "width": TINY_OWLV2_IMAGE_SIZE}
    )
    processor = Owlv2Processor(image_processor=image_processor, tokenizer=tokenizer)
    return _save_pretrained(directory, model, processor)


def build_tiny_grounding_dino(directory: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny Grounding DINO model, processor and tokenizer to `directory`."""
    import torch
    from transformers import (
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
    )

    max_text_len = 64
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = ["##" + c for c in string.ascii_lowercase + string.digits]
    vocab = {token: i for i, token in enumerate(specials + words + pieces)}
    tokenizer = BertTokenizer(vocab=vocab, model_max_length=max_text_len)
    config = GroundingDinoConfig(
        backbone_config={
            "model_type": "swin",
            "image_size": TINY_GROUNDING_DINO_IMAGE_SIZE,
            "patch_size": 4,
            "embed_dim": 8,
            "depths": [1, 1, 1, 1],
            "num_heads": [1, 1, 1, 1],
            "window_size": 4,
            "out_indices": [2, 3, 4],
        },
        text_config={
            "model_type": "bert",
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": max_text_len,
        },
        d_model=32,  # the input projections use GroupNorm(32, d_model)
        encoder_layers=1,
        decoder_layers=2,  # the box heads of the decoder layers are tied: at least two
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_n_points=2,
        decoder_n_points=2,
        num_queries=20,
        max_text_len=max_text_len,
    )
    with _seeded(seed):
        model = GroundingDinoForObjectDetection(config).eval()
        # Class logits are dot products of layer-normed query and text states, far beyond the
        # sigmoid's range at random init; a smaller final decoder norm brings them into it.
        with torch.no_grad():
            model.model.decoder.layer_norm.weight.mul_(0.2)
    image_processor = GroundingDinoImageProcessor(
        size={
            "shortest_edge": TINY_GROUNDING_DINO_IMAGE_SIZE,
            "longest_edge": 2 * TINY_GROUNDING_DINO_IMAGE_SIZE,
        }
    )
    processor = GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return _save_pretrained(directory, model, processor)


def build_tiny_detectors(root: str | os.PathLike[str], *, seed: int = 0) -> dict[str, Path]:
    """Build every tiny detector under `root`; returns the model path for each detector kind."""
    root = Path(root)
    return {
        "yolo": build_tiny_yolo(root / "tiny-yolov8.pt", seed=seed),
        "owlv2": build_tiny_owlv2(root / "tiny-owlv2", seed=seed),
        "grounding_dino": build_tiny_grounding_dino(root / "tiny-grounding-dino", seed=seed),
    }


def _clip_byte_vocab() -> dict[str, int]:
    """A CLIP-style byte-level vocabulary with no merges: every byte alone and word-final.

    Ids follow the real CLIP layout (plain bytes first, special tokens last), which matters:
    OWLv2 treats a query whose first token id is 0 as padding.
    """
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = alphabet + [c + "</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(tokens)}


def _calibrate_batch_norm(model, generator) -> None:
    """Set BatchNorm statistics from a few random blocky images.

    PyTorch's default initialisation shrinks activations layer by layer, so an untrained YOLO
    outputs the same constant for every input. Normalising each layer with statistics measured
    on image-like inputs keeps the outputs dependent on the image.
    """
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(4):
            coarse = torch.rand(8, 3, 8, 8, generator=generator)
            images = torch.nn.functional.interpolate(coarse, size=(128, 128), mode="nearest")
            model((images + 0.05 * torch.randn(images.shape, generator=generator)).clamp(0, 1))
    model.eval()
    for norm in norms:
        norm.momentum = 0.03


@contextmanager
def _seeded(seed: int) -> Iterator:
    """Seed torch's global generator (used by module initialisers) without leaking the state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield torch.Generator().manual_seed(seed)


@contextmanager
def _replacing_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of `path` that replaces it when the block succeeds (a file in one
    rename; a folder is removed first, so for a moment there is none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        target = tmp / path.name
        yield target
        if path.is_dir():
            shutil.rmtree(path)
        os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_pretrained(directory: str | os.PathLike[str], model, processor) -> Path:
    directory = Path(directory)
    with _replacing_path(directory) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    return directory
