"""filtered_frames: which frames of each project video match the project's prompts (SigLIP2).

Every frame gets every prompt's score and the decision, kept in `<output>/filter/<video>.parquet`;
no frame is copied. Image embeddings go to a cache keyed by model and frame content, shared by all
projects and by the dedup stage. A video where no frame passes is an outcome ("empty"), not a
failure; an unreadable frame is recorded and skipped. A copy of another video is filtered as
that video (its own item is marked done, naming the original).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dataminer_dagster.assets.filter.config import FilterConfig
from dataminer_dagster.assets.filter.filter_rule import apply_filter_rule
from dataminer_dagster.assets.filter.store import record_filter
from dataminer_dagster.assets.filter.table import prompt_columns
from dataminer_dagster.assets.frames.frame_manifest import read_manifest
from dataminer_dagster.core.embedding_cache import EmbeddingCache, quantize
from dataminer_dagster.core.images import read_image
from dataminer_dagster.core.visualize import contact_sheet, histogram
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.engine.outcomes import ItemResult, RequeueFirst
from dataminer_dagster.engine.previews import VIDEO_PREVIEW_BUDGET, preview_metadata
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import FRAMES_MANIFEST, ProjectPaths
from dataminer_dagster.registry import FILTER

if TYPE_CHECKING:
    import pandas as pd


@stage_asset(
    stage=FILTER,
    required_resource_keys=["models"],
    kinds={"pytorch", "huggingface", "parquet"},
)
def filtered_frames(item: StageItem, ctx: StageContext) -> ItemResult:
    """Per frame: every prompt score and the keep/drop decision of the project's filter."""
    catalog = ctx.catalog
    project = ctx.memo(("project", item.project), lambda: catalog.projects.get(item.project))
    config = project.config.filter
    profile = project.config.extract.options().profile_id()
    stored = catalog.frames.profiles([item.video_id]).get(item.video_id, {}).get(profile)
    if stored is None and (original := catalog.videos.get([item.video_id])[item.video_id].same_as):
        return ItemResult(  # only with `redo`: a copy's filter item is marked done, never queued
            metadata={"outcome": f"nothing to do: same content as video {original}"},
            outcome={"same_as": original},
            commit=lambda conn: catalog.advance_videos(conn, [item.video_id]),
        )
    if stored is None or not stored[0].is_dir():
        raise RequeueFirst(
            f"frames of video {item.video_id} ({profile}) are missing; their extraction is queued again",
            lambda conn: catalog.advance_videos(conn, [item.video_id]),
        )
    frames_dir = stored[0]
    manifest = read_manifest(frames_dir / FRAMES_MANIFEST)

    scorer = ctx.models.scorer(config)
    text = ctx.memo(
        ("prompts", project.name, config.model),
        lambda: _embed_prompts(ctx, scorer, project.name, config),
    )
    embeddings, errors, embedded = _frame_embeddings(item, ctx, scorer, frames_dir, manifest)
    readable = np.array([i not in errors for i in range(len(manifest))])
    scores = (
        scorer.score(embeddings[readable], text)
        if readable.any()
        else np.zeros((0, len(text)), np.float32)
    )
    decision = apply_filter_rule(
        scores,
        n_positive=len(config.positive_prompts),
        n_negative=len(config.negative_prompts),
        n_junk=len(config.junk_prompts),
        thresholds=config,
    )
    table = _results_table(manifest, frames_dir, config, readable, errors, scores, decision)
    passed = int(table["passed"].sum())
    for index, message in list(errors.items())[:5]:
        ctx.log.warning(f"filter {item.key}: frame {manifest[index].file_name} skipped: {message}")

    final = ProjectPaths(project.output_dir).filter_table(item.video_id)
    staged = ctx.staging_path(final)
    table.to_parquet(staged, index=False)

    def commit(conn) -> None:
        file_changes(conn).publish(staged, final)
        record_filter(conn, project.id, item.video_id, total=len(table), passed=passed)

    model = Path(config.model)
    return ItemResult(
        metadata={
            **_previews(
                table, config, ProjectPaths(project.output_dir).previews_dir / item.key, ctx
            ),
            "outcome": f"{passed} of {len(table)} frames kept"
            if passed
            else "empty: no frame passed the filter",
            "frames": len(table),
            "passed": passed,
            "unreadable": len(errors),
            "embedded": embedded,
            "best_positive_score": float(table["pos_max"].max()) if readable.any() else 0.0,
            "positive_threshold": config.positive_threshold,
            "model": model if model.is_absolute() else config.model,
            "results": final,
        },
        outcome={
            "frames": len(table),
            "passed": passed,
            "unreadable": len(errors),
            "embedded": embedded,
        },
        commit=commit,
    )


def _embed_prompts(ctx: StageContext, scorer, project: str, config: FilterConfig) -> np.ndarray:
    """The prompts' embeddings, with a warning for each prompt the text model cuts: what follows
    the cut is ignored, so two prompts alike up to it get the same scores."""
    prompts = config.positive_prompts + config.negative_prompts + config.junk_prompts
    for prompt, tokens in scorer.cut_prompts(prompts).items():
        shown = prompt if len(prompt) <= 60 else f"{prompt[:60]}..."
        ctx.log.warning(
            f"filter {project}: the prompt {shown!r} is {tokens} tokens long; the model "
            f"{config.model} reads its first {scorer.text_max_length} and ignores the rest "
            "(shorten it, or it scores as its beginning alone)"
        )
    return scorer.embed_texts(prompts)


KEPT_SHOWN = 8  # frames in a video's preview


def _previews(
    table: pd.DataFrame, config: FilterConfig, directory: Path, ctx: StageContext
) -> dict:
    """The video's kept frames, best score first, and the histogram of its frames' best positive
    score with the threshold labelled."""
    best = table[table["passed"]].sort_values("pos_max", ascending=False).head(KEPT_SHOWN)
    pictures = [read_image(Path(f)) for f in best["file"]]
    sheet = contact_sheet(
        pictures,
        [
            f"{t:.1f} s, score {s:.2f}"
            for t, s in zip(best["timestamp"], best["pos_max"], strict=True)
        ],
        columns=4,
        tile_width=160,
        tile_height=120,
        empty="no frame passed the filter",
    )
    chart = histogram(
        table["pos_max"].to_numpy(np.float64),
        thresholds={"positive threshold": config.positive_threshold},
        title="best positive-prompt score per frame",
    )
    return {
        **preview_metadata(
            "kept_frames",
            sheet,
            directory,
            ctx.staging_path,
            budget=VIDEO_PREVIEW_BUDGET,
            cover=pictures[0] if pictures else None,
        ),
        **preview_metadata(
            "filter_scores",
            chart,
            directory,
            ctx.staging_path,
            budget=VIDEO_PREVIEW_BUDGET,
            chart=True,
        ),
    }


def _frame_embeddings(
    item, ctx, scorer, frames_dir: Path, manifest
) -> tuple[np.ndarray, dict[int, str], int]:
    """Embeddings of every frame (cached ones read, the others computed and cached), the errors
    (unreadable frames get a zero row and an entry) and how many frames the model embedded now
    (none when the filter runs again with new prompts or thresholds over cached frames)."""
    cache = EmbeddingCache(ctx.db.paths.embeddings_dir(), scorer.model_slug)
    hashes = [f.content_hash for f in manifest]
    found, cached = cache.get(item.video_id, hashes)
    result = np.zeros((len(manifest), scorer.embedding_dim), np.float32)
    if found.any():
        result[found] = cached
    todo = np.flatnonzero(~found)
    errors: dict[int, str] = {}
    new_rows, new_hashes = [], []
    for batch in scorer.embed_images([frames_dir / manifest[i].file_name for i in todo]):
        ctx.check_lease(item)
        rows = todo[batch.indices]
        stored = quantize(batch.embeddings)  # score exactly what a later run reads from the cache
        result[rows] = stored
        new_rows.append(stored)
        new_hashes += [hashes[i] for i in rows]
        errors.update({int(todo[i]): message for i, message in batch.errors.items()})
    if new_hashes:
        cache.put(item.video_id, new_hashes, np.concatenate(new_rows))
    return result, errors, len(todo)


def _results_table(
    manifest, frames_dir, config, readable, errors, scores, decision
) -> pd.DataFrame:
    import pandas as pd

    columns = prompt_columns(config)
    n = len(manifest)
    full = np.full((n, len(columns)), np.nan, np.float32)
    full[readable] = scores

    def spread(values, fill):
        out = np.full(n, fill, dtype=np.asarray(values).dtype if len(values) else type(fill))
        out[readable] = values
        return out

    positives = config.positive_prompts
    best = spread(decision.best_positive, -1)
    table = pd.DataFrame(
        {
            "frame_index": [f.index for f in manifest],
            "timestamp": [f.timestamp for f in manifest],
            "file": [str(frames_dir / f.file_name) for f in manifest],
            "width": [f.width for f in manifest],
            "height": [f.height for f in manifest],
            "rotation": [f.rotation for f in manifest],
            "sharpness": [f.sharpness for f in manifest],
            "brightness": np.array([f.brightness for f in manifest], np.float64),
            "content_hash": [f.content_hash for f in manifest],
            "readable": readable,
            "error": [errors.get(i) for i in range(n)],
            "passed": spread(decision.passed, False),
            "pos_max": spread(decision.pos_max, np.float32(np.nan)),
            "neg_max": spread(decision.neg_max, np.float32(np.nan)),
            "junk_max": spread(decision.junk_max, np.float32(np.nan)),
            "best_prompt": [positives[b] if b >= 0 else None for b in best],
        }
    )
    for j, column in enumerate(columns):
        table[column] = full[:, j]
    return table
