"""The dataset's training formats and quality report at 10,000 images, against copying the images
once.

A frame store of `--images` JPEG frames (synthetic 1280x720 pictures at quality 95, about the size
of a 720p video's frames; `--videos` videos), and a dataset folder as the dataset stage makes it:
images/ as hard links into the store, a manifest with splits, a COCO file with `--boxes` boxes per
image over 5 classes. Then, in this process, on the same files:

* **copy once** (the baseline): every image copied into a new folder (`shutil.copy2`);
* **formats**: `write_formats` with coco, yolo and hf (per split: COCO files, YOLO images as hard
  links and label files, imagefolder images as hard links and metadata.jsonl);
* **report**: `summarize` and `write_report` (report.md and its PNG plots);
* **export**: `dataminer export`'s `export_dataset` of the dataset with the three formats, copies
  (the images copied once, the formats linked to the copies);
* **review export**: `dataminer review export`'s Label Studio tasks, every box a prediction;
* **review import**: `dataminer review import` of an export where every task was answered with
  its predictions (each image's boxes read back and compared), and the dataset build's
  application of the corrections to the COCO file.

Time: wall seconds. Disk: the blocks the step allocated (st_blocks of every file it made, each
inode counted once and inodes of the frame store not at all: a hard link costs a directory entry,
which `du` does not count either). Medians of `--repeats`.

    python bench/exports.py                         # 10,000 images in a temporary directory
    python bench/exports.py --images 2000 --dir /data --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLASSES = ["car", "person", "bicycle", "dog", "traffic light"]
DISTINCT_PICTURES = 50  # encoded once each, then written under every name


def make_store(root: Path, images: int, videos: int, boxes: int):
    """The frame store, the dataset folder (images/ linked into the store, manifest, COCO),
    and the dedup table's (video, group) rows."""
    import numpy as np
    import pandas as pd

    from dataminer_dagster.assets.dataset.dataset_splits import assign_splits
    from dataminer_dagster.core.coco import Detection, ImageDetections, build_coco, write_coco
    from dataminer_dagster.core.images import encode_image
    from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames

    spec = SyntheticVideoSpec(width=1280, height=720, fps=10, seconds=DISTINCT_PICTURES / 10)
    pictures = [encode_image(f, "jpg", quality=95) for f in synthetic_frames(spec)]
    store = root / "frames"
    dataset = root / "dataset"
    (dataset / "images").mkdir(parents=True)
    store.mkdir()
    rng = np.random.default_rng(0)
    rows, detections = [], []
    for i in range(images):
        video = f"video{i % videos:04d}"
        name = f"{video}_{i // videos:06d}.jpg"
        (store / name).write_bytes(pictures[i % len(pictures)])
        os.link(store / name, dataset / "images" / name)
        found = []
        for _ in range(boxes):
            w, h = rng.uniform(20, 400, 2)
            x, y = rng.uniform(0, 1280 - w), rng.uniform(0, 720 - h)
            found.append(Detection(x, y, w, h, rng.uniform(0.25, 1), CLASSES[rng.integers(5)]))
        detections.append(ImageDetections(name, 1280, 720, found))
        rows.append(
            {
                "file_name": name,
                "video_id": video,
                "source_url": f"https://example.com/{video}.mp4",
                "sources": [f"https://example.com/{video}.mp4"],
                "video_title": f"video {video}",
                "frame_index": i // videos,
                "timestamp": float(i // videos),
                "width": 1280,
                "height": 720,
                "pos_max": rng.uniform(0.3, 1),
                "sharpness": rng.uniform(10, 900),
                "brightness": rng.uniform(0, 255),
                "group": i,
                "detections": boxes,
            }
        )
    manifest = pd.DataFrame(rows)
    splits = assign_splits(
        manifest.groupby("video_id").size().to_dict(),
        [],
        {"train": 0.8, "val": 0.1, "test": 0.1},
        seed=0,
    )
    manifest["split"] = manifest["video_id"].map(splits.split_of)
    manifest.to_parquet(dataset / "manifest.parquet", index=False)
    write_coco(build_coco(detections, CLASSES), dataset / "annotations.coco.json")
    return store, dataset, manifest


def allocated(paths: list[Path], exclude: set[int]) -> int:
    """Bytes of the blocks of every file under `paths`, each inode once, `exclude`d inodes not."""
    seen = set(exclude)
    total = 0
    for top in paths:
        for directory, _, files in os.walk(top):
            for name in files:
                stat = os.lstat(Path(directory) / name)
                if stat.st_ino not in seen:
                    seen.add(stat.st_ino)
                    total += stat.st_blocks * 512
    return total


def timed(step: Callable[[], None], repeats: int, reset: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        reset()
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--videos", type=int, default=100)
    parser.add_argument("--boxes", type=int, default=3, help="boxes per image")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to build (a temp dir)")
    args = parser.parse_args()

    from dataminer_dagster.assets.dataset.corrections import (
        apply_review,
        import_review,
        load_corrections,
    )
    from dataminer_dagster.assets.dataset.dataset_formats import (
        export_dataset,
        read_contents,
        write_formats,
    )
    from dataminer_dagster.assets.dataset.dataset_report import Thresholds, summarize, write_report
    from dataminer_dagster.assets.dataset.review_formats import label_studio_tasks

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        store, dataset, manifest = make_store(root, args.images, args.videos, args.boxes)
        print(f"made {args.images} frames and the dataset in {time.perf_counter() - started:.1f} s")
        store_inodes = {os.lstat(p).st_ino for p in store.iterdir()}
        image_bytes = allocated([store], set())
        copy_dir = root / "copy"
        format_dirs = [dataset / d for d in ("coco", "yolo", "hf")]
        export_dir = root / "export"

        def copy_once() -> None:
            copy_dir.mkdir()
            for image in (dataset / "images").iterdir():
                shutil.copy2(image, copy_dir / image.name)

        def formats() -> None:
            write_formats(
                dataset, read_contents(dataset), ["coco", "yolo", "hf"], published_at=dataset
            )

        def report() -> None:
            contents = read_contents(dataset)
            summary = summarize(
                manifest,
                contents.images,
                contents.names,
                zip(manifest["video_id"], manifest["group"], strict=True),
                ratios={"train": 0.8, "val": 0.1, "test": 0.1},
                seed=0,
                thresholds=Thresholds(100, 40, 215, 0.3, 0.25),
            )
            write_report(summary, manifest, contents.images, dataset, title="bench", formats={})

        def export() -> None:
            export_dataset(dataset, export_dir, copy=True, formats=["coco", "yolo", "hf"])

        review_dir, answered = root / "review", root / "answered.json"

        def review_export() -> None:
            review_dir.mkdir()
            tasks = label_studio_tasks(
                read_contents(dataset), lambda name: f"/data/local-files/?d=images/{name}", "bench"
            )
            (review_dir / "tasks.json").write_text(json.dumps(tasks))

        review_export()  # the answers to import: every task answered with its predictions
        tasks = json.loads((review_dir / "tasks.json").read_text())
        for n, task in enumerate(tasks, start=1):
            task.update(id=n, annotations=[{"id": n, "result": task["predictions"][0]["result"]}])
        answered.write_text(json.dumps(tasks))
        del tasks

        def review_import() -> None:
            """`dataminer review import` of every image, and the build's application of it."""
            import_review(answered, dataset, review_dir / "corrections")
            apply_review(
                json.loads((dataset / "annotations.coco.json").read_text()),
                manifest["file_name"],
                load_corrections(review_dir / "corrections"),
            )

        def clear(*paths: Path) -> Callable[[], None]:
            def run() -> None:
                for path in paths:
                    shutil.rmtree(path, ignore_errors=True)
                (dataset / "report.md").unlink(missing_ok=True)

            return run

        results = {
            "copy_once": (timed(copy_once, args.repeats, clear(copy_dir)), [copy_dir]),
            "formats": (timed(formats, args.repeats, clear(*format_dirs)), format_dirs),
            "report": (
                timed(report, args.repeats, clear(dataset / "report")),
                [dataset / "report", dataset / "report.md"],
            ),
            "export": (timed(export, args.repeats, clear(export_dir)), [export_dir]),
            "review_export": (timed(review_export, args.repeats, clear(review_dir)), [review_dir]),
            "review_import": (
                timed(review_import, args.repeats, clear(review_dir / "corrections")),
                [review_dir / "corrections"],
            ),
        }
        baseline_s = results["copy_once"][0]
        table = {}
        for name, (seconds, paths) in results.items():
            size = allocated([p for p in paths if p.is_dir()], store_inodes) + sum(
                p.stat().st_blocks * 512 for p in paths if p.is_file()
            )
            table[name] = {
                "seconds": round(seconds, 2),
                "vs_copy_time": round(seconds / baseline_s, 3),
                "disk_mb": round(size / 1e6, 1),
                "vs_copy_disk": round(size / max(image_bytes, 1), 4),
            }
        print(f"images: {args.images}, {image_bytes / 1e6:.0f} MB in the frame store")
        print(f"{'step':<14} {'seconds':>8} {'x copy':>7} {'disk MB':>9} {'x copy':>7}")
        for name, row in table.items():
            print(
                f"{name:<14} {row['seconds']:>8.2f} {row['vs_copy_time']:>7.3f} "
                f"{row['disk_mb']:>9.1f} {row['vs_copy_disk']:>7.4f}"
            )
        out = REPO / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "exports.json").write_text(
            json.dumps(
                {
                    "images": args.images,
                    "image_mb": round(image_bytes / 1e6, 1),
                    "load_average": os.getloadavg(),
                    "steps": table,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
