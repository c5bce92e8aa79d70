"""The filter stage's config (`filter:` in the project YAML)."""

from __future__ import annotations

from pydantic import Field, field_validator

from dataminer_dagster.core.config_section import Probability, Section, check_prompts


class FilterConfig(Section):
    RUN_SETTINGS = frozenset({"device", "batch_size"})

    model: str = Field(
        "google/siglip2-so400m-patch14-384",
        description="SigLIP2 model: hub id or local directory (relative: to the config file).",
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Images per model call; default: what fits in half the free GPU memory, up "
        "to 64 (32 on the CPU). A value here is the most a call takes.",
    )
    positive_prompts: list[str] = Field(
        min_length=1,
        description="A frame passes when one of these scores above positive_threshold.",
    )
    negative_prompts: list[str] = Field(
        default_factory=list, description="Frames scoring high on these are dropped."
    )
    junk_prompts: list[str] = Field(
        default_factory=list,
        description="Like negative prompts, with their own thresholds (close-ups, partial views...).",
    )
    positive_threshold: Probability = Field(
        0.3,
        description="Best positive score must be above this (`dataminer calibrate` finds the "
        "one for a precision from a yes/no review of a few dozen frames).",
    )
    negative_threshold: Probability = Field(
        0.3, description="Best negative score must be below this."
    )
    pos_neg_margin: float = Field(
        0.1, description="Best positive minus best negative must be above this."
    )
    junk_threshold: Probability = Field(0.3, description="Best junk score must be below this.")
    pos_junk_margin: float = Field(
        0.1, description="Best positive minus best junk must be above this."
    )

    @field_validator("positive_prompts", "negative_prompts", "junk_prompts")
    @classmethod
    def _usable_prompts(cls, prompts: list[str]) -> list[str]:
        return check_prompts(prompts)
