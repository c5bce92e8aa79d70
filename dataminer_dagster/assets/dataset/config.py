"""The dataset stage's config (`dataset:` in the project YAML): the splits, the training formats
and the thresholds of the quality report."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dataminer_dagster.core.config_section import Probability, Section

# Sums of ratios written by hand (0.7 + 0.2 + 0.1) are not exactly 1 in binary.
RATIO_SUM_TOLERANCE = 1e-6


class SplitsConfig(Section):
    train: Probability = Field(0.8, description="Share of the images in the train split.")
    val: Probability = Field(0.1, description="Share of the images in the val split.")
    test: Probability = Field(0.1, description="Share of the images in the test split.")

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> SplitsConfig:
        total = self.train + self.val + self.test
        if not math.isclose(total, 1.0, abs_tol=RATIO_SUM_TOLERANCE):
            raise ValueError(f"train, val and test must add up to 1, they add up to {total:g}")
        if self.train == 0:
            raise ValueError("train must be above 0: a dataset trains on it")
        return self


class DatasetConfig(Section):
    splits: SplitsConfig = Field(
        default_factory=SplitsConfig,
        description="Shares of the images per split, split by source: a video, its copies and "
        "the videos it shares a near-duplicate group with are in one split.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the split assignment: the same seed and videos give the same splits.",
    )
    formats: list[Literal["coco", "yolo", "hf"]] = Field(
        default_factory=lambda: ["coco"],
        description="Training formats written per split beside images/ and the manifest: coco "
        "(`coco/<split>.json`; with a detect section), yolo (Ultralytics: `yolo/data.yaml`, "
        "`images/<split>/`, `labels/<split>/`; needs a detect section and a val split), hf "
        "(Hugging Face imagefolder: `hf/<split>/` with `metadata.jsonl`).",
    )
    blurry_below: float = Field(
        100.0,
        ge=0,
        description="The report counts an image blurry when its sharpness (variance of the "
        "Laplacian at a longest side of 512) is below this.",
    )
    dark_below: float = Field(
        40.0,
        ge=0,
        le=255,
        description="The report counts an image dark when its brightness (mean grey level, 0-255) "
        "is below this.",
    )
    overexposed_above: float = Field(
        215.0,
        ge=0,
        le=255,
        description="The report counts an image overexposed when its brightness is above this.",
    )

    @field_validator("formats")
    @classmethod
    def _each_format_once(cls, formats: list[str]) -> list[str]:
        repeated = sorted({f for f in formats if formats.count(f) > 1})
        if repeated:
            raise ValueError(f"list each format once; repeated: {', '.join(repeated)}")
        return formats

    @model_validator(mode="after")
    def _yolo_needs_val(self) -> DatasetConfig:
        if "yolo" in self.formats and self.splits.val == 0:
            raise ValueError(
                "dataset.formats has yolo, whose training needs a val split: give "
                "dataset.splits.val a share above 0, or leave yolo out"
            )
        if self.dark_below >= self.overexposed_above:
            raise ValueError(
                "dataset.dark_below must be below dataset.overexposed_above "
                f"({self.dark_below:g} >= {self.overexposed_above:g})"
            )
        return self
