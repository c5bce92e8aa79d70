"""deduped_set: one frame per group of near-duplicates, across all the project's videos.

Every passed frame is grouped (cosine similarity >= threshold, transitively, first within each
video, then across videos) and the best of each group kept: highest filter score, then sharpness,
then frame id. Embeddings come from the filter's cache (no second model pass) or from a DINOv2 /
DINOv3 model. The result, `<output>/dedup/frames.parquet`, lists every passed frame with its group.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from dataminer_dagster.assets.filter import FRAME_COLUMNS, GPU_OP_TAGS, filtered_frames, load_scorer
from dataminer_dagster.assets.stage import ItemResult, StageContext, StageItem, stage_asset
from dataminer_dagster.core.dedup import deduplicate
from dataminer_dagster.core.embedding_cache import EmbeddingCache
from dataminer_dagster.core.files import publish, staging_path
from dataminer_dagster.partitions import projects_partitions
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.stages import DEDUP


@stage_asset(
    stage=DEDUP,
    partitions_def=projects_partitions,
    deps=[filtered_frames],
    op_tags=GPU_OP_TAGS,
    pool="gpu",
    kinds={"faiss"},
)
def deduped_set(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's passed frames grouped into near-duplicates, one kept per group."""
    catalog = ctx.db.catalog
    project = catalog.project(item.key)
    frames = passed_frames(project, catalog.videos_with_passed_frames(project.id))
    started = time.monotonic()
    config = project.config.dedup
    if len(frames):
        embeddings = _embeddings(ctx, project, frames)
        result = deduplicate(
            embeddings,
            frame_ids=frames["frame_id"].tolist(),
            video_ids=frames["video_id"].tolist(),
            scores=frames["pos_max"].to_numpy(np.float64),
            sharpness=frames["sharpness"].to_numpy(np.float64),
            threshold=config.threshold,
            exact_limit=config.exact_limit,
        )
        frames["group"] = result.group
        frames["group_size"] = result.group_size
        frames["kept"] = result.is_representative
        stats = {"pairs": result.pairs_found, "exact": result.exact, "recall": result.recall}
    else:
        frames = frames.assign(
            group=pd.Series(dtype="int64"),
            group_size=pd.Series(dtype="int64"),
            kept=pd.Series(dtype=bool),
        )
        stats = {"pairs": 0, "exact": True, "recall": None}

    final = ProjectPaths(project.output_dir).dedup_table
    staged = staging_path(final)
    frames.to_parquet(staged, index=False)
    kept = int(frames["kept"].sum())
    ctx.log.info(
        f"dedup {project.name}: {len(frames)} passed frames -> {kept} kept ({stats['pairs']} duplicate pairs)"
    )
    return ItemResult(
        metadata={
            "frames_in": len(frames),
            "kept": kept,
            "groups": kept,
            "duplicate_pairs": stats["pairs"],
            "search": "exact"
            if stats["exact"]
            else f"approximate, measured recall {stats['recall']:.4f}",
            "threshold": config.threshold,
            "seconds": round(time.monotonic() - started, 2),
            "table": str(final),
        },
        outcome={"frames_in": len(frames), "kept": kept},
        commit=lambda conn: publish(staged, final),
        staged=[staged],
    )


def passed_frames(project, video_ids: list[str]) -> pd.DataFrame:
    """Every passed frame of these videos of the project, in a stable order, with a stable id."""
    paths = ProjectPaths(project.output_dir)
    parts = []
    for video_id in sorted(video_ids):
        table = pd.read_parquet(paths.filter_table(video_id))
        table = table[table["passed"]]
        if len(table):
            parts.append(table.assign(video_id=video_id))
    if not parts:
        return pd.DataFrame(columns=[*FRAME_COLUMNS, "video_id", "frame_id"])
    frames = pd.concat(parts, ignore_index=True)
    frames["frame_id"] = frames["video_id"] + "_" + frames["frame_index"].map("{:06d}".format)
    return frames.sort_values("frame_id", ignore_index=True)


def _embeddings(ctx: StageContext, project, frames: pd.DataFrame) -> np.ndarray:
    config = project.config
    if config.dedup.embeddings == "filter":
        from dataminer_dagster.models.loading import resolve_model

        slug = resolve_model(config.filter.model).slug
        embedder = None
    else:
        from dataminer_dagster.models.siglip import ImageEmbedder

        embedder = ImageEmbedder(config.dedup.model, device=config.dedup.device)
        slug = embedder.model_slug
    cache = EmbeddingCache(ctx.db.paths.embeddings_dir(), slug)
    parts = []
    for video_id, group in frames.groupby("video_id", sort=False):
        found, cached = cache.get(video_id, group["content_hash"].tolist())
        vectors = np.zeros((len(group), cached.shape[1] if cached.size else 0), np.float32)
        if not found.all():  # not cached (cache removed, or another model): compute them now
            embedder = embedder or load_scorer(config.filter)
            missing = np.flatnonzero(~found)
            computed = embedder.embed_all([group["file"].iloc[i] for i in missing])
            if computed.errors:
                raise RuntimeError(
                    f"dedup {project.name}: frames became unreadable: {list(computed.errors.values())[:3]}"
                )
            vectors = np.zeros((len(group), computed.embeddings.shape[1]), np.float32)
            vectors[missing[computed.indices]] = computed.embeddings
            cache.put(video_id, group["content_hash"].iloc[missing].tolist(), computed.embeddings)
        vectors[found] = cached
        parts.append(vectors)
    return np.concatenate(parts)
