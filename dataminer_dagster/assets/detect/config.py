"""The detect stage's config (`detect:` in the project YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dataminer_dagster.core.config_section import Probability, Section, check_prompts


class DetectConfig(Section):
    RUN_SETTINGS = frozenset({"device", "batch_size"})

    detector: Literal["yolo", "owlv2", "grounding_dino"] = Field(
        description="yolo: fixed classes; owlv2 / grounding_dino: open vocabulary from prompts."
    )
    model: str = Field(
        description="Weights: a .pt file or name for yolo, a hub id or local directory otherwise (relative paths: to the config file)."
    )
    classes: list[str] = Field(
        default_factory=list, description="yolo: class names to keep (empty: all)."
    )
    prompts: list[str] = Field(
        default_factory=list, description="owlv2 / grounding_dino: what to detect."
    )
    confidence: Probability = Field(0.25, description="Minimum detection score.")
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Images per model call; default: what fits in half the free GPU memory, up "
        "to 32 (8 on the CPU). A value here is the most a call takes.",
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    visualizations: bool = Field(False, description="Also write images with boxes drawn.")

    @field_validator("prompts")
    @classmethod
    def _usable_prompts(cls, prompts: list[str]) -> list[str]:
        return check_prompts(prompts)

    @model_validator(mode="after")
    def _prompts_for_open_vocabulary(self) -> DetectConfig:
        if self.detector != "yolo" and not self.prompts:
            raise ValueError(f"detect.prompts is required for the {self.detector} detector")
        if self.detector == "yolo" and self.prompts:
            raise ValueError(
                "detect.prompts is for open-vocabulary detectors; use detect.classes with yolo"
            )
        return self
