"""Train a tiny YOLO (ultralytics) on the synthetic world's frames and boxes, from a seed, on the CPU.

The frames of several worlds (core.world) and their truth boxes are written as an ultralytics
dataset (images/, labels/, data.yaml; one class per shape, junk frames as images without boxes),
with a held-out world as the validation split. The model is the YOLOv8 detection graph at a small
width, trained by ultralytics' own trainer, and saved as the `.pt` checkpoint that `YOLO(path)`
and the detect stage load. Its validation figures (mAP50, mAP50-95 on the held-out world) are
printed and saved as training.json beside the weights. training.json records the CPU it ran on
(`models.device.training_cpu`): on the kind of CPU that trained the shipped weights a seed gave
the same weights again, on another kind other weights (bench/README.md,
bench/retrain_world_models.py).

    PYTHONPATH=. python scripts/train_world_yolo.py --out dataminer_dagster/models/world/yolo
    PYTHONPATH=. python scripts/train_world_yolo.py --out /tmp/y --epochs 1 --worlds 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import yaml

from dataminer_dagster.core.world import plan_world
from dataminer_dagster.core.world_render import SHAPES
from dataminer_dagster.models.device import training_cpu

TRAIN_WORLD_SEEDS_FROM = 1000  # training worlds are seeds 1000, 1001, ...
EVAL_WORLD_SEED = 900  # the held-out world of the validation split
EVAL_FRAME_STEP = 2  # every other frame of the held-out world, whatever the training step
# YOLOv8's graph at an eighth of the nano model's width: about 0.35M parameters, under 1 MB.
SCALE = [0.33, 0.125, 256]  # depth, width, max channels


def write_split(root: Path, split: str, seeds: list[int], step: int) -> int:
    """Every `step`-th frame of the worlds as JPEGs under images/<split> with YOLO label files."""
    import cv2

    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    count = 0
    for seed in seeds:
        for video in plan_world(seed).videos:
            for index in range(0, video.frame_count, step):
                frame, truth = video.render(index)
                height, width = frame.shape[:2]
                stem = f"w{seed}_{Path(video.name).stem}_{index:04d}"
                cv2.imwrite(str(images / f"{stem}.jpg"), frame, [cv2.IMWRITE_JPEG_QUALITY, 90])
                boxes = [(obj.shape, obj.box) for obj in truth.objects]
                (labels / f"{stem}.txt").write_text(yolo_label_text(boxes, width, height))
                count += 1
    return count


def yolo_label_text(boxes, width: int, height: int) -> str:
    """A YOLO label file's text for (shape, (x, y, w, h) in pixels) boxes of a width x height image."""
    rows = [
        f"{SHAPES.index(shape)} {(x + w / 2) / width:.6f} {(y + h / 2) / height:.6f}"
        f" {w / width:.6f} {h / height:.6f}"
        for shape, (x, y, w, h) in boxes
    ]
    return "".join(row + "\n" for row in rows)


def write_data_yaml(dataset: Path) -> Path:
    """data.yaml of a dataset with images/train and images/val, one class per shape."""
    data = dataset / "data.yaml"
    names = dict(enumerate(SHAPES))
    data.write_text(
        yaml.safe_dump(
            {"path": str(dataset), "train": "images/train", "val": "images/val", "names": names}
        )
    )
    return data


def model_config(folder: Path) -> Path:
    """yolov8n.yaml at SCALE with the world's classes; the file name keeps ultralytics' 'n' scale."""
    from ultralytics.nn.tasks import yaml_model_load

    config = yaml_model_load("yolov8n.yaml")
    config.update(scales={"n": SCALE}, nc=len(SHAPES))
    config.pop("yaml_file", None)
    path = folder / "tiny-yolov8n.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def train_detector(
    data: Path,
    work: Path,
    *,
    epochs: int,
    imgsz: int,
    batch: int,
    workers: int,
    seed: int,
    **settings,
) -> Path:
    """A fresh tiny YOLO (`model_config`) trained by ultralytics' trainer on the train split of
    `data` (a data.yaml), its runs under `work`; the last weights' path. `settings` are further
    arguments of ultralytics' `train`."""
    from ultralytics import YOLO

    work.mkdir(parents=True, exist_ok=True)
    model = YOLO(str(model_config(work)), task="detect")
    model.train(
        data=str(data),
        epochs=epochs,
        imgsz=imgsz,
        batch=batch,
        workers=workers,
        device="cpu",
        seed=seed,
        deterministic=True,
        project=str(work / "runs"),
        name="train",
        exist_ok=True,
        plots=False,
        val=False,  # measured once, on the final weights, by the caller
        amp=False,
        verbose=False,
        **settings,
    )
    return Path(model.trainer.last)


def train(args: argparse.Namespace) -> dict:
    import torch
    from ultralytics import YOLO

    torch.set_num_threads(args.threads)

    work = args.out / "work"
    if work.exists():
        shutil.rmtree(work)
    dataset = work / "dataset"
    started = time.perf_counter()
    seeds = [TRAIN_WORLD_SEEDS_FROM + k for k in range(args.worlds)]
    train_images = write_split(dataset, "train", seeds, args.frame_step)
    val_images = write_split(dataset, "val", [EVAL_WORLD_SEED], EVAL_FRAME_STEP)
    data = write_data_yaml(dataset)
    names = dict(enumerate(SHAPES))
    print(
        f"{train_images} training and {val_images} validation frames in {time.perf_counter() - started:.0f} s"
    )

    last = train_detector(
        data,
        work,
        epochs=args.epochs,
        imgsz=args.imgsz,
        batch=args.batch_size,
        workers=args.workers,
        seed=args.seed,
    )
    train_s = time.perf_counter() - started
    weights = args.out / "world-yolov8.pt"
    shutil.copyfile(last, weights)
    metrics = YOLO(str(weights)).val(
        data=str(data), imgsz=args.imgsz, batch=args.batch_size, device="cpu", plots=False
    )
    figures = {
        "command": shlex.join(["python", *sys.argv]),
        "cpu": training_cpu(),
        "seed": args.seed,
        "epochs": args.epochs,
        "imgsz": args.imgsz,
        "frame_step": args.frame_step,
        "training_worlds": seeds,
        "training_frames": train_images,
        "eval_world_seed": EVAL_WORLD_SEED,
        "eval_frames": val_images,
        "map50": round(float(metrics.box.map50), 4),
        "map50_95": round(float(metrics.box.map), 4),
        "per_class_map50_95": {
            names[i]: round(float(v), 4) for i, v in enumerate(metrics.box.maps)
        },
        "weights_bytes": weights.stat().st_size,
        "train_seconds": round(train_s),
    }
    (args.out / "training.json").write_text(json.dumps(figures, indent=1))
    if not args.keep_work:
        shutil.rmtree(work)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the trained model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--worlds", type=int, default=16, help="training worlds")
    parser.add_argument("--frame-step", type=int, default=8, help="use every n-th frame")
    parser.add_argument("--imgsz", type=int, default=192, help="training and validation size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="data loader processes")
    parser.add_argument("--keep-work", action="store_true", help="keep the dataset and runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(train(args), indent=1))


if __name__ == "__main__":
    main()
