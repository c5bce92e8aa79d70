"""The training formats per split (assets/dataset/dataset_formats.py), written from a real dataset folder and
read back by the tools that use them: pycocotools for COCO, `datasets` for the imagefolder,
Ultralytics for YOLO (one epoch of training on the export)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE
from dataminer_dagster.assets.dataset.dataset_formats import (
    YOLO_NOTE,
    Box,
    DatasetFormatError,
    export_dataset,
    format_file_counts,
    point_yolo_at,
    read_contents,
    write_formats,
    yolo_line,
)
from dataminer_dagster.core.coco import Detection, ImageDetections, build_coco, write_coco
from dataminer_dagster.core.images import write_image

CLASSES = ["car", "person"]
# file name -> (split, width, height, detections)
IMAGES = {
    "v1_000000.jpg": ("train", 96, 64, [Detection(10, 8, 40, 30, 0.9, "car")]),
    "v1_000010.jpg": (
        "train",
        96,
        64,
        [Detection(0, 0, 96, 64, 0.5, "person"), Detection(50, 20, 10, 10, 0.4, "car")],
    ),
    "v2_000000.jpg": ("train", 80, 80, []),
    "v3_000000.jpg": ("val", 64, 96, [Detection(4, 6, 20, 50, 0.7, "person")]),
    "v3_000005.jpg": ("val", 64, 96, []),
    "v4_000000.jpg": ("test", 96, 64, [Detection(30, 30, 20, 20, 0.8, "car")]),
}


def make_dataset(root: Path, images: dict = IMAGES, *, with_coco: bool = True) -> Path:
    """A dataset folder as the dataset stage writes it: real JPEGs, a manifest with splits and
    provenance, a COCO file."""
    rng = np.random.default_rng(0)
    (root / IMAGES_DIR).mkdir(parents=True)
    rows = []
    for name, (split, width, height, _) in images.items():
        picture = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        write_image(root / IMAGES_DIR / name, picture)
        video = name.split("_")[0]
        rows.append(
            {
                "file_name": name,
                "video_id": video,
                "source_url": f"https://example.com/{video}.mp4",
                "sources": [f"https://example.com/{video}.mp4", f"/videos/{video}.mp4"],
                "video_title": f"video {video}",
                "frame_index": int(name.split("_")[1][:6]),
                "timestamp": float("nan") if video == "v2" else 0.5,
                "width": width,
                "height": height,
                "split": split,
            }
        )
    pd.DataFrame(rows).to_parquet(root / MANIFEST_FILE, index=False)
    if with_coco:
        coco = build_coco(
            [ImageDetections(n, w, h, d) for n, (_, w, h, d) in images.items()], CLASSES
        )
        write_coco(coco, root / COCO_FILE)
    return root


@pytest.fixture
def dataset(tmp_path) -> Path:
    root = make_dataset(tmp_path / "dataset")
    written = write_formats(root, read_contents(root), ["coco", "yolo", "hf"], published_at=root)
    assert written.notes == []
    assert written.images == {f: {"train": 3, "val": 2, "test": 1} for f in ("coco", "yolo", "hf")}
    return root


def test_yolo_labels_are_normalised_centres_and_sizes_with_an_empty_file_for_no_box(dataset):
    labels = dataset / "yolo" / "labels"
    assert (labels / "train" / "v1_000000.txt").read_text() == (
        "0 0.312500 0.359375 0.416667 0.468750\n"  # (10 + 20) / 96, (8 + 15) / 64, 40/96, 30/64
    )
    assert (labels / "train" / "v1_000010.txt").read_text().splitlines() == [
        "1 0.500000 0.500000 1.000000 1.000000",
        "0 0.572917 0.390625 0.104167 0.156250",
    ]
    assert (labels / "train" / "v2_000000.txt").read_text() == ""
    assert (labels / "val" / "v3_000005.txt").read_text() == ""
    assert sorted(p.name for p in (labels / "test").iterdir()) == ["v4_000000.txt"]
    assert yolo_line(Box(-5, 0, 200, 10, 1), 100, 50) == "1 0.950000 0.100000 1.000000 0.200000"


def test_yolo_data_yaml_names_its_folder_and_maps_class_ids_to_names(dataset):
    data = yaml.safe_load((dataset / "yolo" / "data.yaml").read_text())
    assert data == {
        "path": str(dataset / "yolo"),
        "train": "images/train",
        "val": "images/val",
        "test": "images/test",
        "names": {0: "car", 1: "person"},
    }

    moved = dataset.parent / "moved"
    dataset.rename(moved)
    point_yolo_at(moved / "yolo")
    assert yaml.safe_load((moved / "yolo" / "data.yaml").read_text())["path"] == str(moved / "yolo")


def test_every_format_links_the_images_instead_of_copying_them(dataset):
    for name in IMAGES:
        original = (dataset / IMAGES_DIR / name).stat()
        split = IMAGES[name][0]
        hf_split = {"val": "validation"}.get(split, split)
        for placed in (
            dataset / "yolo" / "images" / split / name,
            dataset / "hf" / hf_split / name,
        ):
            assert placed.stat().st_ino == original.st_ino
    assert os.stat(dataset / IMAGES_DIR / "v1_000000.jpg").st_nlink == 3


def test_the_coco_split_files_load_in_pycocotools(dataset):
    from pycocotools.coco import COCO

    expected_boxes = {"train": 3, "val": 1, "test": 1}
    for split, count in (("train", 3), ("val", 2), ("test", 1)):
        coco = COCO(str(dataset / "coco" / f"{split}.json"))
        assert len(coco.getImgIds()) == count
        assert len(coco.getAnnIds()) == expected_boxes[split]
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == CLASSES
        for image in coco.loadImgs(coco.getImgIds()):
            assert IMAGES[image["file_name"]][0] == split
            assert (dataset / IMAGES_DIR / image["file_name"]).is_file()
    person = COCO(str(dataset / "coco" / "val.json"))
    (annotation,) = person.loadAnns(person.getAnnIds())
    assert annotation["bbox"] == [4, 6, 20, 50] and annotation["category_id"] == 2


def test_datasets_loads_the_imagefolder_with_each_images_boxes_and_provenance(dataset):
    import datasets

    loaded = datasets.load_dataset("imagefolder", data_dir=str(dataset / "hf"))
    assert {name: len(split) for name, split in loaded.items()} == {
        "train": 3,
        "validation": 2,
        "test": 1,
    }
    rows = 0
    for name, split in loaded.items():
        for row in split:
            rows += 1
            file_name = _file_of(row)
            _, width, height, expected = IMAGES[file_name]
            assert {"train": "train", "validation": "val", "test": "test"}[name] == IMAGES[
                file_name
            ][0]
            assert row["image"].size == (width, height)
            assert row["objects"]["bbox"] == [[d.x, d.y, d.w, d.h] for d in expected]
            assert row["objects"]["category"] == [CLASSES.index(d.label) for d in expected]
            assert row["source_url"] == f"https://example.com/{row['video_id']}.mp4"
            assert row["sources"][1] == f"/videos/{row['video_id']}.mp4"
    assert rows == len(IMAGES)
    no_timestamp = [r for s in loaded.values() for r in s if r["video_id"] == "v2"]
    assert [r["timestamp"] for r in no_timestamp] == [None]  # NaN in the manifest: null


def _file_of(row) -> str:
    """The image's file name, from the provenance the row carries."""
    return f"{row['video_id']}_{row['frame_index']:06d}.jpg"


def test_the_folders_hold_as_many_files_per_split_as_the_manifest_has_rows(dataset):
    counts = format_file_counts(dataset)
    assert counts["coco"] == {s: {"images": n} for s, n in (("train", 3), ("val", 2), ("test", 1))}
    assert counts["yolo"]["val"] == {"images": 2, "labels": 2}
    assert counts["hf"]["train"] == {"images": 3, "metadata_rows": 3}
    (dataset / "yolo" / "labels" / "val" / "v3_000005.txt").unlink()
    assert format_file_counts(dataset)["yolo"]["val"] == {"images": 2, "labels": 1}


def test_an_empty_val_split_gets_a_note_instead_of_a_data_yaml(tmp_path):
    images = {n: v for n, v in IMAGES.items() if v[0] != "val"}
    root = make_dataset(tmp_path / "dataset", images)
    written = write_formats(root, read_contents(root), ["yolo", "coco"], published_at=root)
    (note,) = written.notes
    assert "no data.yaml: the val split is empty" in note and "dataset.splits" in note
    assert not (root / "yolo" / "data.yaml").exists()
    assert (root / "yolo" / YOLO_NOTE).read_text().strip() == note
    assert written.images["coco"] == {"train": 3, "val": 0, "test": 1}
    assert sorted(p.name for p in (root / "coco").iterdir()) == ["test.json", "train.json"]


def test_a_dataset_without_annotations_has_no_yolo_and_an_imagefolder_without_objects(tmp_path):
    root = make_dataset(tmp_path / "dataset", with_coco=False)
    contents = read_contents(root)
    with pytest.raises(DatasetFormatError, match="needs a detect section"):
        write_formats(root, contents, ["yolo"], published_at=root)
    written = write_formats(root, contents, ["coco", "hf"], published_at=root)
    assert written.notes == [
        "coco: no splits written: the dataset has no annotations (no detect section)"
    ]
    row = json.loads((root / "hf" / "train" / "metadata.jsonl").read_text().splitlines()[0])
    assert "objects" not in row and row["video_id"] == "v1"


def test_a_dataset_from_before_splits_says_to_make_it_again(tmp_path):
    root = make_dataset(tmp_path / "dataset")
    pd.read_parquet(root / MANIFEST_FILE).drop(columns="split").to_parquet(root / MANIFEST_FILE)
    with pytest.raises(DatasetFormatError, match="made before splits"):
        read_contents(root)


def test_an_export_writes_the_formats_for_its_own_place(tmp_path):
    dataset = make_dataset(tmp_path / "dataset")
    dest = tmp_path / "out" / "export"
    images, links, written = export_dataset(dataset, dest, copy=True, formats=["yolo", "hf"])
    assert (images, links) == (6, 0)
    assert set(written.images) == {"yolo", "hf"}
    assert yaml.safe_load((dest / "yolo" / "data.yaml").read_text())["path"] == str(dest / "yolo")
    copy = dest / IMAGES_DIR / "v4_000000.jpg"
    assert copy.stat().st_ino != (dataset / IMAGES_DIR / "v4_000000.jpg").stat().st_ino
    assert (dest / "yolo" / "images" / "test" / "v4_000000.jpg").stat().st_ino == copy.stat().st_ino
    assert not list(dest.parent.glob(".staging-*"))

    with pytest.raises(DatasetFormatError, match="needs a detect section"):
        (dataset / COCO_FILE).unlink()
        export_dataset(dataset, tmp_path / "other", copy=False, formats=["yolo"])
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".staging-other-*"))


@pytest.mark.slow
def test_ultralytics_trains_an_epoch_on_the_yolo_export(dataset, tmp_path):
    """`yolo train` on data.yaml as written: a tiny YOLOv8 of random weights, on the CPU."""
    from ultralytics import YOLO

    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    model = YOLO(str(build_tiny_yolo(tmp_path / "tiny.pt")))
    model.train(
        data=str(dataset / "yolo" / "data.yaml"),
        epochs=1,
        imgsz=64,
        batch=2,
        device="cpu",
        workers=0,
        project=str(tmp_path / "runs"),
        name="train",
        plots=False,
        amp=False,
        verbose=False,
    )
    trained = model.trainer
    assert trained.data["names"] == {0: "car", 1: "person"}
    assert (trained.save_dir / "weights" / "last.pt").is_file()
    assert len(trained.train_loader.dataset.labels) == 3
    boxes = sum(len(label["cls"]) for label in trained.train_loader.dataset.labels)
    assert boxes == 3
