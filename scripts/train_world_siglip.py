"""Train a tiny SigLIP on the synthetic world (core.world), from a seed, on the CPU.

The model is a transformers SiglipModel with its Gemma tokenizer and SiglipProcessor
(`models.tiny.build_tiny_siglip`, "world" presets), so it is saved and loaded exactly as a hub
checkpoint is. Frames of several worlds go through the processor that is saved with the model,
after a JPEG round trip as the pipeline's frames have had; captions such as "a red circle and a
blue square on stripes" or "a black screen" are drawn from each frame's truth. The loss is
SigLIP's sigmoid loss over every frame-caption pair of a batch, where a pair is positive when the
caption is true of the frame (another frame's caption often is), and left out when it names an
object the frame shows only a sliver of. Besides its frames' captions, every batch carries the
world's short captions (each object, junk kind and background on its own, `prompt_facts`), so
that each frame is a labelled example of each of them at every step: with one caption per frame,
a few hundred steps learnt the junk scenes and none of the twenty objects. The temperature and
bias start as SigLIP's do and learn faster than the towers (SCALAR_LR_FACTOR). Frames are taken
sparsely from many worlds (128 worlds, every 12th frame: 2,300 scenes): from 16 worlds at every
other frame (290 scenes) the model learnt its training scenes by heart (loss 0.01) and scored the
held-out world worse (mean precision 0.45, recall 0.33). training.json records the CPU it ran on
(`models.device.training_cpu`): on the kind of CPU that trained the shipped weights a seed gave
the same weights again, on another kind other weights (bench/README.md,
bench/retrain_world_models.py).

It then scores a held-out world through `models.siglip.SiglipScorer` (the filter stage's scorer,
on JPEG files) with one prompt per object ("a red circle") and per junk kind ("a black screen"),
and prints and saves (training.json beside the weights) the precision and recall of each prompt
at a score of 0.5, and the top-1 accuracy of the object prompts on frames with a single object.

    PYTHONPATH=. python scripts/train_world_siglip.py --out dataminer_dagster/models/world/siglip
    PYTHONPATH=. python scripts/train_world_siglip.py --out /tmp/s --steps 10 --worlds 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dataminer_dagster.core.world import plan_world
from dataminer_dagster.core.world_render import COLOURS, SHAPES
from dataminer_dagster.core.world_truth import (
    BACKGROUND_WORDS,
    JUNK_CAPTIONS,
    FrameTruth,
    ObjectTruth,
)
from dataminer_dagster.models.device import training_cpu
from dataminer_dagster.models.siglip import TEXT_MAX_LENGTH, SiglipScorer
from dataminer_dagster.models.tiny import build_tiny_siglip

TRAIN_WORLD_SEEDS_FROM = 1000  # training worlds are seeds 1000, 1001, ...
EVAL_WORLD_SEED = 900  # the held-out world the figures are measured on
JPEG_QUALITY = 90
THRESHOLD = 0.5
SCALAR_LR_FACTOR = 30


def clear(obj: ObjectTruth) -> bool:
    """Seen well enough for a caption to name it."""
    return obj.visible >= 0.5 and obj.area >= 60


def object_prompts() -> list[str]:
    return [f"a {colour} {shape}" for colour in COLOURS for shape in SHAPES]


def vocabulary() -> list[str]:
    """Words of the captions, for whole-word tokens."""
    words = {"and", "on", *COLOURS, *SHAPES}
    for phrase in [*BACKGROUND_WORDS.values(), *JUNK_CAPTIONS.values()]:
        words.update(phrase.split())
    return sorted(words - {"a"})


# A caption as a fact that is true or false of a frame: the objects it names (colour, shape), the
# background it names (or None) and the junk kind it names (or None).
Fact = tuple[frozenset, str | None, str | None]


def prompt_facts() -> list[tuple[str, Fact]]:
    """The captions every batch carries besides its frames' own: each object, junk kind and
    background on its own, so that every frame is a labelled example of each of them."""
    facts: list[tuple[str, Fact]] = [
        (f"a {colour} {shape}", (frozenset([(colour, shape)]), None, None))
        for colour in COLOURS
        for shape in SHAPES
    ]
    facts += [(text, (frozenset(), None, kind)) for kind, text in JUNK_CAPTIONS.items()]
    facts += [(text, (frozenset(), name, None)) for name, text in BACKGROUND_WORDS.items()]
    return facts


def draw_caption(truth: FrameTruth, rng: np.random.Generator) -> tuple[str, Fact]:
    """A caption true of `truth`: its junk kind, or some of its clear objects, with or without
    the background."""
    if truth.junk:
        return JUNK_CAPTIONS[truth.junk], (frozenset(), None, truth.junk)
    objects = [obj for obj in truth.objects if clear(obj)]
    if not objects:
        return BACKGROUND_WORDS[truth.background], (frozenset(), truth.background, None)
    count = int(rng.integers(1, len(objects) + 1))
    chosen = [objects[i] for i in sorted(rng.choice(len(objects), count, replace=False))]
    labels = [obj.label for obj in chosen]
    text = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
    background = truth.background if rng.uniform() < 0.5 else None
    if background:
        text = f"{text} on {BACKGROUND_WORDS[background]}"
    return text, (frozenset((o.colour, o.shape) for o in chosen), background, None)


def pair_label(fact: Fact, truth: FrameTruth) -> float:
    """1 when the caption is true of the frame, -1 when false, 0 when unsure (a sliver)."""
    objects, background, junk = fact
    if junk or truth.junk:
        return 1.0 if junk == truth.junk else -1.0
    if background and background != truth.background:
        return -1.0
    clear_objects = {(o.colour, o.shape) for o in truth.objects if clear(o)}
    if objects <= clear_objects:
        return 1.0
    return 0.0 if objects <= {(o.colour, o.shape) for o in truth.objects} else -1.0


def world_frames(seeds: list[int], step: int) -> Iterator[tuple[np.ndarray, FrameTruth]]:
    """Every `step`-th frame (BGR) of every video of the worlds, with its truth."""
    for seed in seeds:
        for video in plan_world(seed).videos:
            for index in range(0, video.frame_count, step):
                yield video.render(index)


def jpeg_round_trip(image: np.ndarray) -> np.ndarray:
    """The frame as the pipeline reads it from its JPEG file: RGB, with JPEG's losses."""
    import cv2

    _, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    return cv2.cvtColor(cv2.imdecode(jpeg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def preprocess(processor, seeds: list[int], step: int) -> tuple[Any, list[FrameTruth]]:
    """Pixel values (float16, as the saved processor makes them) and truths of the frames."""
    import torch

    chunks, truths, images = [], [], []
    for image, truth in world_frames(seeds, step):
        images.append(jpeg_round_trip(image))
        truths.append(truth)
        if len(images) == 256:
            chunks.append(processor.image_processor(images, return_tensors="pt")["pixel_values"])
            images = []
    if images:
        chunks.append(processor.image_processor(images, return_tensors="pt")["pixel_values"])
    return torch.cat(chunks).half(), truths


def tokenize(tokenizer, texts: list[str], max_length: int) -> dict:
    """As SiglipScorer.embed_texts tokenizes prompts."""
    tokens = tokenizer(
        [t.lower() for t in texts],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
    )
    return {k: tokens[k] for k in ("input_ids", "attention_mask") if k in tokens}


def train(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoProcessor, SiglipModel

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="world-siglip-init-") as init:
        build_tiny_siglip(
            Path(init),
            seed=args.seed,
            vision_preset="world",
            text_preset="world",
            words=vocabulary(),
            logit_scale=math.log(10.0),  # SigLIP's initial temperature and bias
            logit_bias=-10.0,
        )
        processor = AutoProcessor.from_pretrained(init, backend="pil")
        model = SiglipModel.from_pretrained(init).train()
    max_length = min(TEXT_MAX_LENGTH, model.config.text_config.max_position_embeddings)

    started = time.perf_counter()
    seeds = [TRAIN_WORLD_SEEDS_FROM + k for k in range(args.worlds)]
    pixels, truths = preprocess(processor, seeds, args.frame_step)
    prepared_s = time.perf_counter() - started
    print(f"{len(truths)} training frames from {len(seeds)} worlds in {prepared_s:.0f} s")

    # The temperature and bias start where SigLIP starts them (logit_scale log 10, bias -10), from
    # where Adam at the towers' rate would move them by about lr per step: a few hundred steps
    # would leave every score near sigmoid(-10 + 10 cos), under 0.5 for all but identical
    # embeddings. They learn at SCALAR_LR_FACTOR times the rate, without weight decay.
    scalars = [model.logit_scale, model.logit_bias]
    towers = [p for p in model.parameters() if all(p is not s for s in scalars)]
    optimiser = torch.optim.AdamW(
        [
            {"params": towers},
            {"params": scalars, "lr": args.lr * SCALAR_LR_FACTOR, "weight_decay": 0.0},
        ],
        lr=args.lr,
        weight_decay=0.05,
    )
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda step: (
            min(1.0, (step + 1) / warmup)
            * 0.5
            * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))
        ),
    )
    fixed = prompt_facts()
    losses = []
    for step in range(args.steps):
        batch = rng.choice(len(truths), args.batch_size, replace=False)
        images = pixels[torch.from_numpy(batch)].float()
        flip = torch.from_numpy(rng.uniform(size=len(batch)) < 0.5)
        images[flip] = images[flip].flip(-1)
        captions = [draw_caption(truths[i], rng) for i in batch] + fixed
        labels = torch.tensor(
            [[pair_label(fact, truths[i]) for _, fact in captions] for i in batch]
        )
        image_features = _features(model.get_image_features(pixel_values=images))
        text_features = _features(
            model.get_text_features(
                **tokenize(processor.tokenizer, [c for c, _ in captions], max_length)
            )
        )
        logits = image_features @ text_features.T * model.logit_scale.exp() + model.logit_bias
        loss = -(torch.nn.functional.logsigmoid(labels * logits) * labels.abs()).sum() / len(batch)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            recent = np.mean(losses[-50:])
            print(
                f"step {step:5d}  loss {recent:.3f}  scale {model.logit_scale.exp().item():.1f}"
                f"  bias {model.logit_bias.item():.2f}  {time.perf_counter() - started:.0f} s"
            )
    train_s = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(args.out)
    processor.save_pretrained(args.out)
    figures = evaluate(args.out)
    figures.update(
        command=shlex.join(["python", *sys.argv]),
        cpu=training_cpu(),
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        training_frames=len(truths),
        training_worlds=seeds,
        final_loss=round(float(np.mean(losses[-50:])), 4),
        train_seconds=round(train_s),
    )
    (args.out / "training.json").write_text(json.dumps(figures, indent=1))
    return figures


def _features(output):
    import torch

    from dataminer_dagster.models.image_embedder import pooled_features

    return torch.nn.functional.normalize(pooled_features(output), dim=-1)


def evaluate(model_dir: Path) -> dict:
    """Precision and recall at THRESHOLD of each prompt on every frame of the held-out world,
    scored by the filter stage's SiglipScorer on JPEG files."""
    import cv2

    with tempfile.TemporaryDirectory(prefix="world-eval-") as folder:
        paths, all_truths = [], []
        for number, (image, truth) in enumerate(world_frames([EVAL_WORLD_SEED], 1)):
            path = Path(folder) / f"{number:06d}.jpg"
            cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            paths.append(path)
            all_truths.append(truth)
        scorer = SiglipScorer(model_dir, device="cpu", batch_size=64)
        prompts = object_prompts() + list(JUNK_CAPTIONS.values())
        result = scorer.embed_all(paths)
        scores = scorer.score(result.embeddings, scorer.embed_texts(prompts))
    truths = [all_truths[i] for i in result.indices]
    per_prompt = {}
    for column, prompt in enumerate(prompts):
        fact = (
            (frozenset(), None, _junk_of(prompt))
            if _junk_of(prompt)
            else (frozenset([tuple(prompt.split()[1:])]), None, None)
        )
        labels = np.array([pair_label(fact, truth) for truth in truths])
        kept = scores[:, column] >= THRESHOLD
        positives = labels == 1
        judged = labels != 0
        true_kept = int((kept & positives).sum())
        per_prompt[prompt] = {
            "positives": int(positives.sum()),
            "precision": round(true_kept / max(int((kept & judged).sum()), 1), 3),
            "recall": round(true_kept / max(int(positives.sum()), 1), 3),
        }
    singles = [
        (row, truth.objects[0].label)
        for row, truth in enumerate(truths)
        if not truth.junk and len(truth.objects) == 1 and clear(truth.objects[0])
    ]
    object_count = len(object_prompts())
    top1 = np.mean(
        [prompts[int(scores[row, :object_count].argmax())] == want for row, want in singles]
    )
    with_positives = [p for p in per_prompt.values() if p["positives"]]
    return {
        "eval_world_seed": EVAL_WORLD_SEED,
        "eval_frames": len(truths),
        "threshold": THRESHOLD,
        "mean_precision": round(float(np.mean([p["precision"] for p in with_positives])), 3),
        "mean_recall": round(float(np.mean([p["recall"] for p in with_positives])), 3),
        "single_object_top1": round(float(top1), 3),
        "single_object_frames": len(singles),
        "prompts": per_prompt,
    }


def _junk_of(prompt: str) -> str | None:
    return next((kind for kind, text in JUNK_CAPTIONS.items() if text == prompt), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--worlds", type=int, default=128, help="training worlds")
    parser.add_argument("--frame-step", type=int, default=12, help="use every n-th frame")
    parser.add_argument("--threads", type=int, default=2)
    figures = train(parser.parse_args())
    print(json.dumps({k: v for k, v in figures.items() if k != "prompts"}, indent=1))


if __name__ == "__main__":
    main()
