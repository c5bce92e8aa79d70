"""The dedup stage's config (`dedup:` in the project YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dataminer_dagster.core.config_section import Probability, Section


class DedupConfig(Section):
    RUN_SETTINGS = frozenset({"device"})
    ADDED_LATER = frozenset({"incremental", "replace", "replace_margin", "colour_overlap"})

    threshold: Probability = Field(
        0.9, description="Frames at cosine similarity >= this are duplicates."
    )
    colour_overlap: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Also require duplicates' colours to agree: their RGB histograms (8 bins a "
        "channel) must overlap by at least this share (histogram intersection, 0-1). It vetoes "
        "frames of two scenes that the embedding finds alike, and keeps a mirrored, cropped or "
        "re-encoded copy; a colour-graded copy may fall below it. Off (null) by default; "
        "bench/README.md measures 0.85 with a threshold of 0.6.",
    )
    embeddings: Literal["filter", "dinov2"] = Field(
        "filter",
        description="filter: reuse the filter's SigLIP embeddings (no second model pass); dinov2: a DINOv2/DINOv3 model.",
    )
    model: str | None = Field(
        None, description="Model for embeddings: dinov2 (e.g. facebook/dinov2-base)."
    )
    device: str = Field(
        "auto",
        description="auto, cpu, cuda, cuda:N or mps: for a dinov2 model and for the duplicate search (mps: the search on the CPU).",
    )
    exact_limit: int = Field(
        20_000,
        ge=100,
        description="Exact neighbour search up to this many frames, an approximate index beyond.",
    )

    incremental: bool = Field(
        True,
        description="When videos are added, compare only their frames with the frames already "
        "kept (and with each other): earlier kept frames stay kept. Off: group every frame again "
        "each time. A changed dedup or filter setting, a kept frame's video leaving the project "
        "and `dataminer force-dedup` group every frame again either way.",
    )

    replace: Literal["never", "better"] = Field(
        "never",
        description="With incremental dedup, when a new frame duplicates a kept one. never: the "
        "kept frame stays kept (the dataset only grows). better: the best new frame of the group "
        "(highest filter score, then sharpness, as a full dedup picks) takes the kept frame's "
        "place when its score is higher by more than dedup.replace_margin; the earlier frame "
        "leaves the dataset's next version, and the dedup table names its replacement "
        "(replaced_by).",
    )
    replace_margin: float = Field(
        0.02,
        ge=0,
        le=1,
        description="How much higher a new frame's filter score must be to replace a kept "
        "duplicate (dedup.replace: better), so that noise does not swap frames back and forth.",
    )

    @model_validator(mode="after")
    def _model_for_dinov2(self) -> DedupConfig:
        if self.embeddings == "dinov2" and not self.model:
            raise ValueError("dedup.model is required when dedup.embeddings is dinov2")
        return self
