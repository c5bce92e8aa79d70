"""deduped_set: one frame per group of near-duplicates, across all the project's videos.

Every passed frame is grouped (cosine similarity >= threshold and, with dedup.colour_overlap,
colours that agree; transitively, first within each video, then across videos) and the best of
each group kept: highest filter score, then sharpness, then frame id. Embeddings come from the
filter's cache (no second model pass) or from a DINOv2 / DINOv3 model. The result,
`<output>/dedup/frames.parquet`, lists every passed frame with its group. A frame whose embedding
is not cached and whose file can no longer be read is recorded there (`readable` false, `error`,
group -1, not kept) and left out; the stage goes on with the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dataminer_dagster.assets.dedup.colour_check import (
    HISTOGRAM_SLUG,
    ColourCheck,
    colour_histograms,
    histograms_from_cache,
)
from dataminer_dagster.assets.dedup.grouping import deduplicate
from dataminer_dagster.assets.dedup.kept_index import (
    IndexWriter,
    KeptIndex,
    place_new_frames,
    replacements,
)
from dataminer_dagster.assets.dedup.pair_search import ENGINES
from dataminer_dagster.assets.dedup.store import record_kept
from dataminer_dagster.assets.filter.store import videos_with_passed_frames
from dataminer_dagster.assets.filter.table import passed_frames
from dataminer_dagster.core.embedding_cache import EmbeddingCache
from dataminer_dagster.core.images import read_image
from dataminer_dagster.core.visualize import PALETTE, contact_sheet
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.partition_checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.previews import preview_metadata
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.registry import DEDUP

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    import pandas as pd

    from dataminer_dagster.models.image_embedder import ImageBatchResult


def _no_duplicates_kept(ctx: StageContext, project_name: str) -> CheckResult:
    """No two kept frames of the project are at or above its threshold (with the stage's own
    search: exact up to dedup.exact_limit kept frames, approximate beyond, where a missed pair
    would go unreported)."""
    import pandas as pd

    from dataminer_dagster.assets.dedup.grouping import similar_pairs

    project = ctx.catalog.projects.get(project_name)
    table = pd.read_parquet(ProjectPaths(project.output_dir).dedup_table)
    kept = table[table["kept"]].reset_index(drop=True)
    metrics = {"kept_frames": len(kept), "pairs_above_threshold": 0}
    if len(kept) < 2:
        return CheckResult(True, metrics)
    embeddings, unreadable = _embeddings(ctx, project, kept)
    colours, unreadable = _colour_check(ctx, project, kept, unreadable)
    frame_ids = kept["frame_id"].drop(index=list(unreadable)).tolist()
    threshold = project.config.dedup.threshold
    readable = np.setdiff1d(np.arange(len(kept)), list(unreadable))
    left, right = similar_pairs(
        embeddings[readable],
        threshold,
        exact_limit=project.config.dedup.exact_limit,
        device=project.config.dedup.device,
        colours=None if colours is None else colours.subset(readable),
    )
    metrics["pairs_above_threshold"] = len(left)
    if not len(left):
        return CheckResult(True, metrics)
    examples = ", ".join(
        f"`{frame_ids[i]}` and `{frame_ids[j]}`" for i, j in zip(left[:5], right[:5], strict=True)
    )
    colour_rule = "" if colours is None else " with colours that agree"
    return CheckResult(
        False,
        metrics,
        f"{len(left)} pairs of kept frames are at or above the dedup threshold {threshold:g}"
        f"{colour_rule}, e.g. {examples}. `dataminer force-dedup {project_name}` deduplicates "
        "the project again.",
    )


DEDUP_CHECKS = [
    PartitionCheck(
        "no_duplicates_kept",
        "No pair of kept frames is a duplicate: at or above the dedup threshold (with colours "
        "that agree, under dedup.colour_overlap).",
        _no_duplicates_kept,
    )
]

GROUPS_SHOWN = 4  # duplicate groups in the preview, two side by side per row
GROUP_WIDTH = 4  # tiles per group: the kept frame and up to three it replaced
KEPT = PALETTE[0]  # the kept frame's frame colour


def _groups_preview(
    frames: pd.DataFrame, titles: dict[str, str], directory: Path, ctx: StageContext
) -> dict:
    """The largest duplicate groups side by side: each kept frame (framed in green), then its
    duplicates (the one a better frame replaced says so); then, where there is room, the best
    kept frames that had no duplicate."""
    import pandas as pd

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
            what = "kept" if row.kept else "replaced" if pd.notna(row.replaced_by) else "duplicate"
            captions.append(caption(row, what))
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
    return preview_metadata("duplicate_groups", sheet, directory, ctx.staging_path, cover=cover)


@stage_asset(
    checks=DEDUP_CHECKS,
    stage=DEDUP,
    required_resource_keys=["models"],
    kinds={"faiss", "parquet"},
    loadable=True,  # a downstream asset loads it (outputs.py)
)
def deduped_set(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's passed frames grouped into near-duplicates, one kept per group."""
    catalog = ctx.catalog
    project = catalog.projects.get(item.key)
    paths = ProjectPaths(project.output_dir)
    started = time.monotonic()
    config = project.config.dedup
    version = project.config.fingerprints()[DEDUP]
    videos = videos_with_passed_frames(catalog.engine, project.id)
    earlier = _earlier(paths, version, videos) if config.incremental else None
    if earlier is not None:
        frames, newly_kept, stats, unreadable = _grow(ctx, project, earlier, videos)
    else:
        frames, newly_kept, stats, unreadable = _group_all(ctx, project, videos)
    for index, message in list(unreadable.items())[:5]:
        ctx.log.warning(f"dedup {project.name}: frame {frames['file'][index]} skipped: {message}")

    final = paths.dedup_table
    staged = ctx.staging_path(final)
    frames.to_parquet(staged, index=False)
    writer = IndexWriter(paths.dedup_index_dir, ctx.staging_path(paths.dedup_index_dir))
    new_kept = frames.iloc[newly_kept.rows]["frame_id"].tolist()
    if earlier is None:
        staged_index = writer.rebuild(
            newly_kept.vectors,
            new_kept,
            version,
            exact_limit=config.exact_limit,
            colours=newly_kept.colours,
        )
    elif new_kept:
        staged_index = writer.add(
            earlier.index,
            newly_kept.vectors,
            new_kept,
            exact_limit=config.exact_limit,
            colours=newly_kept.colours,
        )
    else:
        staged_index = None  # nothing new is kept: the index stays as it is
    kept = int(frames["kept"].sum())
    ctx.log.info(
        f"dedup {project.name} ({stats['mode']}): {len(frames)} passed frames -> {kept} kept "
        f"({stats['pairs']} similar pairs"
        + (
            f"; {stats['replaced']} kept frames replaced by better ones"
            if stats["replaced"]
            else ""
        )
        + ")"
    )
    titles = {v: row.title for v, row in catalog.videos.get(frames["video_id"].unique()).items()}

    kept_per_video = frames.loc[frames["kept"], "video_id"].value_counts().to_dict()

    def commit(conn) -> None:
        record_kept(conn, project.id, kept_per_video)
        file_changes(conn).publish(staged, final)
        if staged_index is not None:
            file_changes(conn).publish(staged_index, paths.dedup_index_dir)

    return ItemResult(
        metadata={
            **_groups_preview(frames, titles, paths.previews_dir, ctx),
            "frames_in": len(frames),
            "new_frames": stats["new_frames"],
            "mode": stats["mode"],
            "unreadable": len(unreadable),
            "kept": kept,
            "replaced": stats["replaced"],
            "groups_with_duplicates": int(frames.loc[frames["group_size"] > 1, "group"].nunique()),
            "similar_pairs": stats["pairs"],
            "search": _search_summary(stats),
            "threshold": config.threshold,
            "colour_overlap": "off" if config.colour_overlap is None else config.colour_overlap,
            "dedup_seconds": round(time.monotonic() - started, 2),
            "table": final,
        },
        outcome={
            "frames_in": len(frames),
            "new_frames": stats["new_frames"],
            "kept": kept,
            "replaced": stats["replaced"],
            "unreadable": len(unreadable),
            "mode": stats["mode"],
        },
        commit=commit,
    )


@dataclass(frozen=True)
class _Earlier:
    """The result of the project's last dedup, to grow from."""

    table: pd.DataFrame  # its rows of the videos the project still has
    index: KeptIndex


def _earlier(paths: ProjectPaths, version: str, videos: list[str]) -> _Earlier | None:
    """The last dedup's table and kept index when the new frames can be added to them: made under
    the same settings (and filter), and every frame it kept still the project's. None: group
    every frame again."""
    import pandas as pd

    index = KeptIndex.open(paths.dedup_index_dir, version)
    if index is None or not paths.dedup_table.is_file():
        return None
    try:
        table = pd.read_parquet(paths.dedup_table)
    except (OSError, ValueError):
        return None
    if "replaced_by" not in table:  # written before frames could be replaced
        table["replaced_by"] = pd.Series([None] * len(table), dtype=object)
    current = table["video_id"].isin(videos)
    indexed = _indexed(table)
    if table.loc[~current & indexed].size or int(indexed.sum()) != index.size:
        return None  # a frame of the index is gone (its video left the project): regroup all
    return _Earlier(table[current].reset_index(drop=True), index)


def _indexed(table: pd.DataFrame) -> pd.Series:
    """The frames the kept index holds: those kept, and those a better duplicate replaced (still
    standing for their group: a later frame like them joins it)."""
    return table["kept"] | table["replaced_by"].notna()


@dataclass(frozen=True)
class _NewlyKept:
    """The frames a dedup keeps that its kept index does not hold yet."""

    rows: np.ndarray  # their rows in the dedup table
    vectors: np.ndarray  # their embeddings
    colours: np.ndarray | None  # their colour histograms (None: no colour check)


NO_SEARCH = {"pairs": 0, "exact": True, "recall": None, "engine": "faiss-cpu", "replaced": 0}


def _ungrouped(frames: pd.DataFrame) -> pd.DataFrame:
    """Passed frames with the dedup columns, before grouping: no group, not kept."""
    import pandas as pd

    return frames.assign(
        group=np.full(len(frames), -1, np.int64),
        group_size=np.zeros(len(frames), np.int64),
        kept=np.zeros(len(frames), bool),
        replaced_by=pd.Series([None] * len(frames), index=frames.index, dtype=object),
    )


def _group_all(ctx: StageContext, project, videos: list[str]):
    """Every passed frame grouped anew. Returns the table, the frames kept (`_NewlyKept`), stats
    and the unreadable rows."""
    config = project.config.dedup
    frames = _ungrouped(passed_frames(project, videos))
    unreadable: dict[int, str] = {}
    stats = dict(NO_SEARCH)
    kept = _NewlyKept(np.empty(0, np.int64), np.empty((0, 0), np.float32), None)
    if len(frames):
        embeddings, unreadable = _embeddings(ctx, project, frames)
        colours, unreadable = _colour_check(ctx, project, frames, unreadable)
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
            colours=None if colours is None else colours.subset(readable),
        )
        frames.loc[readable, "group"] = result.group
        frames.loc[readable, "group_size"] = result.group_size
        frames.loc[readable, "kept"] = result.is_representative
        rows = np.flatnonzero(frames["kept"].to_numpy(bool))
        kept = _NewlyKept(
            rows, embeddings[rows], None if colours is None else colours.histograms[rows]
        )
        stats = {
            "pairs": result.pairs_found,
            "exact": result.exact,
            "recall": result.recall,
            "engine": result.engine,
            "replaced": 0,
        }
    stats |= {"mode": "every frame", "new_frames": len(frames)}
    return frames, kept, stats, unreadable


def _grow(ctx: StageContext, project, earlier: _Earlier, videos: list[str]):
    """Only the frames of videos the last dedup did not see, placed against its kept frames
    (kept_index.place_new_frames). Same returns as `_group_all`."""
    import pandas as pd

    config = project.config.dedup
    table = earlier.table.copy()
    seen = set(table["video_id"].unique())
    new = _ungrouped(passed_frames(project, [v for v in videos if v not in seen]))
    unreadable: dict[int, str] = {}
    stats = dict(NO_SEARCH)
    kept_vectors = np.empty((0, earlier.index.dimensions), np.float32)
    kept_colours = None
    if len(new):
        embeddings, unreadable = _embeddings(ctx, project, new)
        colours, unreadable = _colour_check(ctx, project, new, unreadable)
        new = _record_unreadable(new, unreadable)
        readable = np.flatnonzero(new["readable"].to_numpy(bool))
        usable = new.iloc[readable]
        placed = place_new_frames(
            earlier.index,
            embeddings[readable],
            frame_ids=usable["frame_id"].tolist(),
            video_ids=usable["video_id"].tolist(),
            scores=usable["pos_max"].to_numpy(np.float64),
            sharpness=usable["sharpness"].to_numpy(np.float64),
            threshold=config.threshold,
            exact_limit=config.exact_limit,
            device=config.device,
            colours=None if colours is None else colours.subset(readable),
        )
        group_of = dict(zip(table["frame_id"], table["group"].to_numpy(), strict=True))
        first_new_group = int(table["group"].max()) + 1 if len(table) else 0
        groups = np.where(
            placed.group >= 0,
            first_new_group + placed.group,
            [group_of.get(f, -1) for f in placed.joins],
        )
        kept = placed.is_representative.copy()
        replaced: dict[int, int] = {}
        if config.replace == "better":
            replaced = _replace_kept(table, usable, np.where(placed.group < 0, groups, -1), config)
            kept[list(replaced)] = True
        new.loc[new.index[readable], "group"] = groups
        new.loc[new.index[readable], "kept"] = kept
        kept_vectors = embeddings[readable][kept]
        if colours is not None:
            kept_colours = colours.histograms[readable][kept]
        stats = {
            # Similar pairs among the new frames, plus one per new frame joined to a kept frame.
            "pairs": placed.pairs_found + int((placed.group < 0).sum()),
            "exact": placed.exact,
            "recall": None,
            "engine": "faiss-cpu",
            "replaced": len(replaced),
        }
    frames = pd.concat([table, new], ignore_index=True)
    sizes = frames.loc[frames["group"] >= 0, "group"].value_counts()
    frames["group_size"] = frames["group"].map(sizes).fillna(0).astype(np.int64)
    kept_rows = len(table) + np.flatnonzero(new["kept"].to_numpy(bool))
    stats |= {"mode": "new frames only", "new_frames": len(new)}
    return (
        frames,
        _NewlyKept(kept_rows, kept_vectors, kept_colours),
        stats,
        {len(table) + k: message for k, message in unreadable.items()},
    )


def _replace_kept(
    table: pd.DataFrame, usable: pd.DataFrame, joined_group: np.ndarray, config
) -> dict[int, int]:
    """dedup.replace: better. The groups whose kept frame a better new frame replaces: the earlier
    frame is no longer kept and names its replacement (`table` changed in place). Returns {new
    frame's position in `usable`: its group}."""
    kept = table[table["kept"]]
    swaps = replacements(
        joined_group,
        usable["pos_max"].to_numpy(np.float64),
        usable["sharpness"].to_numpy(np.float64),
        dict(zip(kept["group"].to_numpy(), kept["pos_max"].to_numpy(np.float64), strict=True)),
        config.replace_margin,
    )
    row_of_group = dict(zip(kept["group"].to_numpy(), kept.index, strict=True))
    frame_ids = usable["frame_id"].to_numpy()
    for group, position in swaps.items():
        row = row_of_group[group]
        table.loc[row, "kept"] = False
        table.loc[row, "replaced_by"] = frame_ids[position]
    return {position: group for group, position in swaps.items()}


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
        embedder = ctx.models.embedder(config.dedup)
        slug = embedder.model_slug
    cache = EmbeddingCache(ctx.db.paths.embeddings_dir(), slug)

    def embed(files: list[str]) -> ImageBatchResult:
        """Frames not cached (the cache removed, or another model): embedded now, with the
        filter's model when dedup reuses its embeddings."""
        nonlocal embedder
        embedder = embedder or ctx.models.scorer(config.filter)
        return embedder.embed_all(files)

    return _cached_per_frame(cache, frames, embed)


def _cached_per_frame(
    cache: EmbeddingCache,
    frames: pd.DataFrame,
    compute: Callable[[list[str]], ImageBatchResult],
    known_unreadable: Collection[int] = (),
) -> tuple[np.ndarray, dict[int, str]]:
    """One row per row of `frames` (a RangeIndex) from `cache`, by video and content hash; the
    rows not cached computed from the frames' files by `compute` and cached, except the rows in
    `known_unreadable` (their files are not read again). Returns the rows and why the frames
    newly found unreadable have none (their rows, and those of `known_unreadable`, are zeros)."""
    parts, unreadable = [], {}
    known = list(known_unreadable)
    for video_id, group in frames.groupby("video_id", sort=False):
        found, cached = cache.get(video_id, group["content_hash"].tolist())
        rows = np.zeros((len(group), cached.shape[1] if cached.size else 0), np.float32)
        missing = np.flatnonzero(~found & ~group.index.isin(known))
        if len(missing):
            computed = compute([group["file"].iloc[i] for i in missing])
            rows = np.zeros((len(group), computed.embeddings.shape[1]), np.float32)
            done = missing[computed.indices]
            rows[done] = computed.embeddings
            cache.put(video_id, group["content_hash"].iloc[done].tolist(), computed.embeddings)
            unreadable |= {
                int(group.index[missing[k]]): message for k, message in computed.errors.items()
            }
        if found.any():
            rows[found] = cached
        parts.append(rows)
    # A video none of whose rows was cached or read has rows of no width: zeros of the others'.
    width = max(part.shape[1] for part in parts)
    parts = [part if part.shape[1] == width else np.zeros((len(part), width)) for part in parts]
    return np.concatenate(parts, dtype=np.float32), unreadable


def _colour_check(
    ctx: StageContext, project, frames: pd.DataFrame, unreadable: dict[int, str]
) -> tuple[ColourCheck | None, dict[int, str]]:
    """The colour check of the rows of `frames` (a RangeIndex) under dedup.colour_overlap (None
    when it is off), and `unreadable` with the rows whose histogram was not cached and whose file
    could not be read (their histograms are zeros)."""
    least = project.config.dedup.colour_overlap
    if least is None:
        return None, unreadable
    cache = EmbeddingCache(ctx.db.paths.embeddings_dir(), HISTOGRAM_SLUG)
    rows, failed = _cached_per_frame(cache, frames, colour_histograms, unreadable)
    return ColourCheck(histograms_from_cache(rows), least), unreadable | failed
