"""The filter's table: one row per frame of a project video, with every prompt's score and the
keep/drop decision, at `ProjectPaths.filter_table(video)` (`<output>/filter/<video>.parquet`).
Other stages read it through this module only."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from dataminer_dagster.assets.filter.config import FilterConfig
from dataminer_dagster.paths import ProjectPaths

if TYPE_CHECKING:
    import pandas as pd

FRAME_COLUMNS = [
    "frame_index",
    "timestamp",
    "file",
    "width",
    "height",
    "rotation",
    "sharpness",
    "brightness",
    "content_hash",
    "readable",
    "error",
    "passed",
    "pos_max",
    "neg_max",
    "junk_max",
    "best_prompt",
]  # then one score column per prompt (prompt_columns)

# Characters of a prompt in its score column's name: the column names a table shows and a
# script types, not a store of the prompt (the project's config holds it whole).
COLUMN_PROMPT_CHARS = 100


def prompt_columns(config: FilterConfig) -> list[str]:
    return (
        [_prompt_column("positive", p) for p in config.positive_prompts]
        + [_prompt_column("negative", p) for p in config.negative_prompts]
        + [_prompt_column("junk", p) for p in config.junk_prompts]
    )


def _prompt_column(kind: str, prompt: str) -> str:
    """'positive: a red car'; a longer prompt is cut, with a digest of the whole so that two
    prompts that differ only after the cut keep two columns."""
    if len(prompt) <= COLUMN_PROMPT_CHARS:
        return f"{kind}: {prompt}"
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    return f"{kind}: {prompt[: COLUMN_PROMPT_CHARS - 13]}... #{digest}"


def passed_frames(project, video_ids: list[str]) -> pd.DataFrame:
    """Every passed frame of these videos of the project, in a stable order, with a stable id."""
    import pandas as pd

    paths = ProjectPaths(project.output_dir)
    parts = []
    for video_id in sorted(video_ids):
        table = pd.read_parquet(paths.filter_table(video_id))
        table = table[table["passed"]]
        if "rotation" not in table:  # a table from before frames were turned: none was
            table = table.assign(rotation=0)
        if "brightness" not in table:  # a table from before extraction measured it
            table = table.assign(brightness=np.nan)
        if len(table):
            parts.append(table.assign(video_id=video_id))
    if not parts:
        return pd.DataFrame(columns=[*FRAME_COLUMNS, "video_id", "frame_id"])
    frames = pd.concat(parts, ignore_index=True)
    frames["frame_id"] = frames["video_id"] + "_" + frames["frame_index"].map("{:06d}".format)
    return frames.sort_values("frame_id", ignore_index=True)
