"""frames: sampled frames of each video, one directory per extraction profile, with a Parquet
manifest (frame index, timestamp, file, size, sharpness, content hash).

Projects that link the same video with different extraction settings each get their own frames.
A copy of another video (the same content) has none of its own: its projects use the original's.
A video whose file is gone (cleaned up after extraction) is fetched again before extracting.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from dataminer_dagster.assets.backup import NO_BACKUP
from dataminer_dagster.assets.frames.extraction_options import ExtractionOptions
from dataminer_dagster.assets.frames.frame_extraction import extract_frames
from dataminer_dagster.assets.frames.frame_manifest import read_manifest, write_manifest
from dataminer_dagster.core.files import make_read_only, require_free_space
from dataminer_dagster.core.media import VideoDecodeError
from dataminer_dagster.core.progress import format_seconds
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.retention import (
    delete_video_file,
    may_delete_video_file,
    release_unused_profiles,
)
from dataminer_dagster.engine.outcomes import ItemResult, PermanentFailure
from dataminer_dagster.engine.partition_checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import FRAMES_MANIFEST
from dataminer_dagster.registry import FRAMES


def _frames_on_disk(ctx: StageContext, video_id: str) -> CheckResult:
    """Every frames directory the catalog records for the video exists, with every file of its
    manifest."""
    missing_dirs, missing_files = [], []
    recorded = ctx.catalog.frames.profiles([video_id]).get(video_id, {})
    for directory, _ in recorded.values():
        if not directory.is_dir():
            missing_dirs.append(str(directory))
            continue
        names = {f.file_name for f in read_manifest(directory / FRAMES_MANIFEST)}
        missing_files += [
            str(directory / n) for n in sorted(names) if not (directory / n).is_file()
        ]
    metrics = {"missing_directories": len(missing_dirs), "missing_files": len(missing_files)}
    if not missing_dirs and not missing_files:
        return CheckResult(True, metrics)
    examples = "\n".join(f"- `{m}`" for m in (missing_dirs + missing_files)[:10])
    return CheckResult(
        False,
        metrics,
        f"{len(missing_dirs)} frames directories and {len(missing_files)} frame files that the "
        f"catalog records for video {video_id} are not on disk, for example:\n{examples}\n\n"
        "Materializing this partition with the config `redo: true` extracts a missing directory "
        "again; remove a directory with missing files first.",
    )


FRAMES_CHECKS = [
    PartitionCheck(
        "frames_on_disk",
        "Every frame the catalog records for the video is on disk.",
        _frames_on_disk,
    )
]


def describe_extraction(options: ExtractionOptions) -> str:
    """The extraction profile in words, e.g. 'one frame every 1 s, JPEG quality 95, at most 500
    frames, full size'."""
    sampling = {
        "interval": lambda: (
            "every frame" if options.every_frames == 1 else f"one frame in {options.every_frames}"
        ),
        "time": lambda: f"one frame every {options.every_seconds:g} s",
        "scene": lambda: (
            f"one frame per scene (cut at an HSV difference of {options.scene_threshold:g}, "
            f"scenes of at least {options.min_scene_seconds:g} s)"
        ),
    }[options.strategy]()
    image = {"jpg": "JPEG", "png": "PNG", "webp": "WebP"}[options.image_format]
    if options.image_format != "png":
        image += f" quality {options.quality}"
    limit = f"at most {options.max_frames} frames" if options.max_frames else "no frame limit"
    size = f"longest side at most {options.max_side} px" if options.max_side else "full size"
    return f"{sampling}, {image}, {limit}, {size}"


@stage_asset(
    stage=FRAMES,
    kinds={"image", "parquet"},
    checks=FRAMES_CHECKS,
)
def frames(item: StageItem, ctx: StageContext) -> ItemResult:
    """Frames sampled from each video, per extraction profile of the projects using it."""
    catalog, paths = ctx.catalog, ctx.db.paths
    video = catalog.videos.get([item.video_id])[item.video_id]
    if video.same_as:  # only with `redo`: a copy's frames item is marked done, never queued
        return ItemResult(
            metadata={"outcome": f"nothing to do: same content as video {video.same_as}"},
            outcome={"same_as": video.same_as},
            commit=lambda conn: catalog.advance_videos(conn, [item.video_id]),
        )
    projects = catalog.videos.linked_projects([item.video_id]).get(item.video_id, [])
    wanted: dict[str, ExtractionOptions] = {}
    for project in projects:
        options = project.config.extract.options()
        wanted.setdefault(options.profile_id(), options)
    present = {  # profile -> frames extracted before
        profile: count
        for profile, (directory, count) in catalog.frames.profiles([item.video_id])
        .get(item.video_id, {})
        .items()
        if directory.is_dir()
    }
    missing = {profile: options for profile, options in wanted.items() if profile not in present}

    stored = video.file_path or video.source_path
    source = paths.absolute(stored) if stored else None
    if missing and (source is None or not source.is_file()):

        def refetch(conn) -> None:  # the chain queues the download again, then this stage
            catalog.videos.forget_file(conn, item.video_id)
            catalog.advance_videos(conn, [item.video_id])

        ctx.log.info(f"frames {item.video_id}: the video file is gone; it will be downloaded again")
        return ItemResult(
            metadata={"outcome": "waiting for the video file: it is downloaded again first"},
            outcome={"refetch": True},
            commit=refetch,
        )

    if missing:
        for profile in missing:  # an attempt killed mid-way may be what fills the disk
            ctx.remove_leftovers(paths.frames_dir(item.video_id, profile))
        _require_disk_space(ctx, projects)
    made: list[tuple[str, ExtractionOptions, Path, Path, int]] = []
    summary: dict[str, int] = {}
    started = time.monotonic()
    for profile, options in sorted(missing.items()):
        final = paths.frames_dir(item.video_id, profile)
        staging = ctx.staging_path(final)
        staging.mkdir()
        try:
            result = extract_frames(
                source,
                staging,
                prefix=item.video_id,
                options=options,
                progress=_progress_logger(ctx, item, profile),
            )
        except VideoDecodeError as exc:
            raise PermanentFailure(str(exc)) from exc
        for warning in result.warnings:
            ctx.log.warning(f"frames {item.video_id}: {warning}")
        write_manifest(result, staging / FRAMES_MANIFEST)
        make_read_only(staging)
        made.append((profile, options, staging, final, len(result.frames)))
        summary[profile] = len(result.frames)
        ctx.check_lease(item)

    def commit(conn) -> None:  # the folders are published, and unused ones go, if it commits
        for profile, options, staging, final, count in made:
            file_changes(conn).publish(staging, final)
            catalog.frames.record(conn, item.video_id, profile, asdict(options), final, count)
        release_unused_profiles(catalog, conn, item.video_id)
        catalog.refilter_new_frames(conn, item.video_id, {profile for profile, *_ in made})
        if may_delete_video_file(projects) and delete_video_file(catalog, conn, item.video_id):
            ctx.log.info(
                f"frames {item.video_id}: video file deleted (cleanup.delete_videos_after_extraction)"
            )
        catalog.advance_videos(conn, [item.video_id])

    return ItemResult(
        metadata={
            "outcome": "extracted" if made else "nothing to do: the frames are extracted already",
            "frames": sum({**present, **summary}.get(p, 0) for p in wanted),
            "extraction": "; ".join(
                f"{describe_extraction(options)} (profile {profile}"
                + ("" if profile in summary else ", extracted before")
                + ")"
                for profile, options in sorted(wanted.items())
            ),
            "extraction_seconds": round(time.monotonic() - started, 2),
        },
        outcome={"frames": summary},
        commit=commit,
        observed={} if any(p.config.backup for p in projects) else {"frames_backup": NO_BACKUP},
    )


def _require_disk_space(ctx: StageContext, projects: list[ProjectRow]) -> None:
    """Raise InsufficientDiskSpace (the item is postponed) when the data disk has less free space
    than a linked project reserves."""
    reserve_mb = max(p.config.extract.min_free_disk_mb for p in projects)
    root = ctx.db.paths.root
    root.mkdir(parents=True, exist_ok=True)
    require_free_space(
        root,
        int(reserve_mb * 2**20),
        f"extracting frames (extract.min_free_disk_mb reserve of {reserve_mb:g} MB)",
    )


def _progress_logger(ctx: StageContext, item: StageItem, profile: str):
    started = time.monotonic()
    last = [started]

    def report(fraction: float) -> None:
        now = time.monotonic()
        if now - last[0] >= 10 and fraction > 0:
            last[0] = now
            eta = (now - started) * (1 - fraction) / fraction
            ctx.log.info(
                f"frames {item.video_id} [{profile}]: {100 * fraction:.0f}%, ETA {format_seconds(eta)}"
            )

    return report
