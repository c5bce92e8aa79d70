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


def scored_frames(project, video_ids: list[str]) -> pd.DataFrame:
    """Every readable frame of these videos of the project with its best positive score
    (`pos_max`), the position of its best positive prompt in the config (`best_positive`), and
    whether the rest of the filter rule (negative and junk prompts, margins) lets it through at
    any positive threshold (`rule_allows`). Raises StaleFilterTable for a video whose table was
    scored with other prompts than the project's config has now."""
    import pandas as pd

    from dataminer_dagster.assets.filter.calibration import kept_apart_from_threshold

    config = project.config.filter
    columns = prompt_columns(config)
    paths = ProjectPaths(project.output_dir)
    parts = []
    for video_id in sorted(video_ids):
        table = pd.read_parquet(paths.filter_table(video_id))
        if list(table.columns[len(FRAME_COLUMNS) :]) != columns:
            raise StaleFilterTable(video_id)
        table = table[table["readable"]]
        scores = table[columns].to_numpy(np.float32)
        positives = len(config.positive_prompts)
        parts.append(
            pd.DataFrame(
                {
                    "video_id": video_id,
                    "frame_index": table["frame_index"].to_numpy(),
                    "file": table["file"].to_numpy(),
                    "pos_max": table["pos_max"].to_numpy(np.float32),
                    "best_positive": scores[:, :positives].argmax(axis=1),
                    "rule_allows": kept_apart_from_threshold(
                        scores,
                        n_positive=positives,
                        n_negative=len(config.negative_prompts),
                        n_junk=len(config.junk_prompts),
                        thresholds=config,
                    ),
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            columns=["video_id", "frame_index", "file", "pos_max", "best_positive", "rule_allows"]
        )
    return pd.concat(parts, ignore_index=True)


class StaleFilterTable(ValueError):
    """A video's filter table scored other prompts than the project's config has."""

    def __init__(self, video_id: str):
        super().__init__(video_id)
        self.video_id = video_id
