"""deduped_set: one frame per group of near-duplicates, across all the project's videos.

Every passed frame is grouped (cosine similarity >= threshold, transitively, first within each
video, then across videos) and the best of each group kept: highest filter score, then sharpness,
then frame id. Embeddings come from the filter's cache (no second model pass) or from a DINOv2 /
DINOv3 model. The result, `<output>/dedup/frames.parquet`, lists every passed frame with its group.
A frame whose embedding is not cached and whose file can no longer be read is recorded there
(`readable` false, `error`, group -1, not kept) and left out; the stage goes on with the rest.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from dataminer_dagster.assets.filter.scorer import load_scorer
from dataminer_dagster.assets.filter.store import videos_with_passed_frames
from dataminer_dagster.assets.filter.table import passed_frames
from dataminer_dagster.core.dedup import deduplicate
from dataminer_dagster.core.embedding_cache import EmbeddingCache
from dataminer_dagster.core.files import publish
from dataminer_dagster.core.images import read_image
from dataminer_dagster.core.pair_search import ENGINES
from dataminer_dagster.core.visualize import PALETTE, contact_sheet
from dataminer_dagster.engine.checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.previews import preview_metadata
from dataminer_dagster.engine.registry import DEDUP
from dataminer_dagster.engine.stage import StageContext, StageItem, stage_asset
from dataminer_dagster.paths import ProjectPaths


def _no_duplicates_kept(ctx: StageContext, project_name: str) -> CheckResult:
    """No two kept frames of the project are at or above its threshold (with the stage's own
    search: exact up to dedup.exact_limit kept frames, approximate beyond, where a missed pair
    would go unreported)."""
    from dataminer_dagster.core.dedup import similar_pairs

    project = ctx.catalog.project(project_name)
    table = pd.read_parquet(ProjectPaths(project.output_dir).dedup_table)
    kept = table[table["kept"]].reset_index(drop=True)
    metrics = {"kept_frames": len(kept), "pairs_above_threshold": 0}
    if len(kept) < 2:
        return CheckResult(True, metrics)
    embeddings, unreadable = _embeddings(ctx, project, kept)
    frame_ids = kept["frame_id"].drop(index=list(unreadable)).tolist()
    threshold = project.config.dedup.threshold
    left, right = similar_pairs(
        np.delete(embeddings, list(unreadable), axis=0),
        threshold,
        exact_limit=project.config.dedup.exact_limit,
        device=project.config.dedup.device,
    )
    metrics["pairs_above_threshold"] = len(left)
    if not len(left):
        return CheckResult(True, metrics)
    examples = ", ".join(
        f"`{frame_ids[i]}` and `{frame_ids[j]}`" for i, j in zip(left[:5], right[:5], strict=True)
    )
    return CheckResult(
        False,
        metrics,
        f"{len(left)} pairs of kept frames are at or above the dedup threshold {threshold:g}, "
        f"e.g. {examples}. `dataminer force-dedup {project_name}` deduplicates the project again.",
    )


DEDUP_CHECKS = [
    PartitionCheck(
        "no_duplicates_kept",
        "No pair of kept frames is at or above the dedup threshold.",
        _no_duplicates_kept,
    )
]

GROUPS_SHOWN = 4  # duplicate groups in the preview, two side by side per row
GROUP_WIDTH = 4  # tiles per group: the kept frame and up to three it replaced
KEPT = PALETTE[0]  # the kept frame's frame colour


def _groups_preview(frames: pd.DataFrame, titles: dict[str, str], directory: Path) -> dict:
    """The largest duplicate groups side by side: each kept frame (framed in green), then the
    frames it replaced; then, where there is room, the best kept frames that had no duplicate."""
    grouped = frames[frames["group_size"] > 1].sort_values(
        ["group_size", "kept", "pos_max"], ascending=False
    )
    images: list = []
    captions: list[str] = []
    borders: list = []

    def caption(row, what: str) -> str:
        return f"{what} {row.timestamp:.1f}s {titles.get(row.video_id) or row.video_id}"

    for _, group in list(grouped.groupby("group", sort=False))[:GROUPS_SHOWN]:
        members = group.sort_values("kept", ascending=False).head(GROUP_WIDTH)
        for row in members.itertuples():
            images.append(read_image(Path(row.file)))
            captions.append(caption(row, "kept" if row.kept else "replaced"))
            borders.append(KEPT if row.kept else None)
        padding = GROUP_WIDTH - len(members)
        images += [None] * padding
        captions += [""] * padding
        borders += [None] * padding
    if len(images) % (2 * GROUP_WIDTH):  # the kept frames without duplicates start a new row
        images += [None] * GROUP_WIDTH
        captions += [""] * GROUP_WIDTH
        borders += [None] * GROUP_WIDTH
    unique = frames[frames["kept"] & (frames["group_size"] == 1)]
    room = GROUPS_SHOWN * GROUP_WIDTH - len(images)
    for row in unique.sort_values("pos_max", ascending=False).head(max(0, room)).itertuples():
        images.append(read_image(Path(row.file)))
        captions.append(caption(row, "kept"))
        borders.append(KEPT)
    sheet = contact_sheet(
        images,
        captions,
        columns=2 * GROUP_WIDTH,
        tile_width=120,
        tile_height=90,
        borders=borders,
        empty="no frame passed the filter",
    )
    cover = next((image for image in images if image is not None), None)
    return preview_metadata("duplicate_groups", sheet, directory, cover=cover)


@stage_asset(
    checks=DEDUP_CHECKS,
    stage=DEDUP,
    kinds={"faiss", "parquet"},
    loadable=True,  # a downstream asset loads it (outputs.py)
)
def deduped_set(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's passed frames grouped into near-duplicates, one kept per group."""
    catalog = ctx.catalog
    project = catalog.project(item.key)
    frames = passed_frames(project, videos_with_passed_frames(catalog.engine, project.id))
    started = time.monotonic()
    config = project.config.dedup
    unreadable: dict[int, str] = {}
    if len(frames):
        embeddings, unreadable = _embeddings(ctx, project, frames)
        frames = _record_unreadable(frames, unreadable)
        readable = frames["readable"].to_numpy(bool)
        usable = frames[readable]
        result = deduplicate(
            embeddings[readable],
            frame_ids=usable["frame_id"].tolist(),
            video_ids=usable["video_id"].tolist(),
            scores=usable["pos_max"].to_numpy(np.float64),
            sharpness=usable["sharpness"].to_numpy(np.float64),
            threshold=config.threshold,
            exact_limit=config.exact_limit,
            device=config.device,
        )
        frames["group"] = np.full(len(frames), -1, np.int64)
        frames["group_size"] = np.zeros(len(frames), np.int64)
        frames["kept"] = False
        frames.loc[readable, "group"] = result.group
        frames.loc[readable, "group_size"] = result.group_size
        frames.loc[readable, "kept"] = result.is_representative
        stats = {
            "pairs": result.pairs_found,
            "exact": result.exact,
            "recall": result.recall,
            "engine": result.engine,
        }
    else:
        frames = frames.assign(
            group=pd.Series(dtype="int64"),
            group_size=pd.Series(dtype="int64"),
            kept=pd.Series(dtype=bool),
        )
        stats = {"pairs": 0, "exact": True, "recall": None, "engine": "faiss-cpu"}
    for index, message in list(unreadable.items())[:5]:
        ctx.log.warning(f"dedup {project.name}: frame {frames['file'][index]} skipped: {message}")

    final = ProjectPaths(project.output_dir).dedup_table
    staged = ctx.staging_path(final)
    frames.to_parquet(staged, index=False)
    kept = int(frames["kept"].sum())
    ctx.log.info(
        f"dedup {project.name}: {len(frames)} passed frames -> {kept} kept ({stats['pairs']} duplicate pairs)"
    )
    titles = {v: row.title for v, row in catalog.videos(frames["video_id"].unique()).items()}
    return ItemResult(
        metadata={
            **_groups_preview(frames, titles, ProjectPaths(project.output_dir).previews_dir),
            "frames_in": len(frames),
            "unreadable": len(unreadable),
            "kept": kept,
            "groups_with_duplicates": int(frames.loc[frames["group_size"] > 1, "group"].nunique()),
            "duplicate_pairs": stats["pairs"],
            "search": _search_summary(stats),
            "threshold": config.threshold,
            "dedup_seconds": round(time.monotonic() - started, 2),
            "table": final,
        },
        outcome={"frames_in": len(frames), "kept": kept, "unreadable": len(unreadable)},
        commit=lambda conn: publish(staged, final),
    )


def _search_summary(stats: dict) -> str:
    where = ENGINES[stats["engine"]]
    if stats["exact"]:
        return f"exact, {where}"
    if stats["recall"] is None:
        return f"approximate, {where} (the recall sample held no duplicate pair to measure)"
    return f"approximate, {where}, measured recall {stats['recall']:.4f}"


def _record_unreadable(frames: pd.DataFrame, unreadable: dict[int, str]) -> pd.DataFrame:
    """The frames with `readable` and `error` updated for those that could not be read now."""
    frames = frames.copy()
    if unreadable:
        rows = list(unreadable)
        frames.loc[rows, "readable"] = False
        frames.loc[rows, "error"] = list(unreadable.values())
    return frames


def _embeddings(
    ctx: StageContext, project, frames: pd.DataFrame
) -> tuple[np.ndarray, dict[int, str]]:
    """One embedding per row of `frames` (a RangeIndex), and why the rows whose embedding was not
    cached and whose file could not be read have none (their rows are zeros)."""
    config = project.config
    if config.dedup.embeddings == "filter":
        from dataminer_dagster.models.loading import resolve_model

        slug = resolve_model(config.filter.model).slug
        embedder = None
    else:
        from dataminer_dagster.models.image_embedder import ImageEmbedder

        embedder = ImageEmbedder(config.dedup.model, device=config.dedup.device)
        slug = embedder.model_slug
    cache = EmbeddingCache(ctx.db.paths.embeddings_dir(), slug)
    parts, unreadable = [], {}
    for video_id, group in frames.groupby("video_id", sort=False):
        found, cached = cache.get(video_id, group["content_hash"].tolist())
        vectors = np.zeros((len(group), cached.shape[1] if cached.size else 0), np.float32)
        if not found.all():  # not cached (cache removed, or another model): compute them now
            embedder = embedder or load_scorer(config.filter)
            missing = np.flatnonzero(~found)
            computed = embedder.embed_all([group["file"].iloc[i] for i in missing])
            vectors = np.zeros((len(group), embedder.embedding_dim), np.float32)
            done = missing[computed.indices]
            vectors[done] = computed.embeddings
            cache.put(video_id, group["content_hash"].iloc[done].tolist(), computed.embeddings)
            unreadable |= {
                int(group.index[missing[k]]): message for k, message in computed.errors.items()
            }
        if found.any():
            vectors[found] = cached
        parts.append(vectors)
    return np.concatenate(parts), unreadable
