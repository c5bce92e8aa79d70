"""frames: sampled frames of each video, one directory per extraction profile, with a Parquet
manifest (frame index, timestamp, file, size, sharpness, content hash).

Projects that link the same video with different extraction settings each get their own frames.
A video whose file is gone (cleaned up after extraction) is fetched again before extracting.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from dataminer_dagster.assets.downloads import downloads
from dataminer_dagster.assets.stage import (
    ItemResult,
    PermanentFailure,
    Postponed,
    StageCheck,
    StageContext,
    StageItem,
    stage_asset,
)
from dataminer_dagster.core.extract import (
    ExtractionOptions,
    extract_frames,
    read_manifest,
    write_manifest,
)
from dataminer_dagster.core.files import (
    InsufficientDiskSpace,
    make_read_only,
    publish,
    require_free_space,
    staging_path,
)
from dataminer_dagster.core.media import VideoDecodeError
from dataminer_dagster.core.progress import format_seconds
from dataminer_dagster.db.catalog import ProjectRow
from dataminer_dagster.db.retention import delete_video_file, may_delete_video_file
from dataminer_dagster.paths import FRAMES_MANIFEST
from dataminer_dagster.stages import FRAMES


def _frames_on_disk(ctx: StageContext, keys: list[str]) -> tuple[bool, dict]:
    """Every frames directory the catalog records exists; for this run's videos, every file of
    the manifest too."""
    catalog = ctx.catalog
    missing_dirs, missing_files = [], []
    for video_id, profiles in catalog.frame_profiles(None).items():
        for profile, (directory, _) in profiles.items():
            if not directory.is_dir():
                missing_dirs.append(f"{video_id}/{profile}")
            elif video_id in keys:
                names = {f.file_name for f in read_manifest(directory / FRAMES_MANIFEST)}
                missing_files += [
                    f"{video_id}/{profile}/{n}"
                    for n in sorted(names)
                    if not (directory / n).is_file()
                ]
    passed = not missing_dirs and not missing_files
    return passed, {
        "missing_directories": len(missing_dirs),
        "missing_files": len(missing_files),
        "examples": "\n".join((missing_dirs + missing_files)[:10]) or "none",
    }


FRAMES_CHECKS = [
    StageCheck("frames_on_disk", "Every frame the catalog records is on disk.", _frames_on_disk)
]


@stage_asset(
    stage=FRAMES,
    deps=[downloads],
    kinds={"image"},
    checks=FRAMES_CHECKS,
)
def frames(item: StageItem, ctx: StageContext) -> ItemResult:
    """Frames sampled from each video, per extraction profile of the projects using it."""
    catalog, paths = ctx.catalog, ctx.db.paths
    video = catalog.videos([item.video_id])[item.video_id]
    projects = catalog.linked_projects([item.video_id]).get(item.video_id, [])
    wanted: dict[str, ExtractionOptions] = {}
    for project in projects:
        options = project.config.extract.options()
        wanted.setdefault(options.profile_id(), options)
    present = {
        profile
        for profile, (directory, _) in catalog.frame_profiles([item.video_id])
        .get(item.video_id, {})
        .items()
        if directory.is_dir()
    }
    missing = {profile: options for profile, options in wanted.items() if profile not in present}

    stored = video.file_path or video.source_path
    source = paths.absolute(stored) if stored else None
    if missing and (source is None or not source.is_file()):

        def refetch(conn) -> None:  # the chain queues the download again, then this stage
            catalog.forget_video_file(conn, item.video_id)
            catalog.advance_videos(conn, [item.video_id])

        ctx.log.info(f"frames {item.video_id}: the video file is gone; it will be downloaded again")
        return ItemResult(
            metadata={"status": "waiting for the video file"},
            outcome={"refetch": True},
            commit=refetch,
        )

    if missing:
        _require_disk_space(ctx, projects)
    staged: list[Path] = []
    made: list[tuple[str, ExtractionOptions, Path, Path, int]] = []
    summary: dict[str, int] = {}
    started = time.monotonic()
    for profile, options in sorted(missing.items()):
        final = paths.frames_dir(item.video_id, profile)
        staging = staging_path(final)
        staging.mkdir()
        staged.append(staging)
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

    def commit(conn) -> None:
        for profile, options, staging, final, count in made:
            publish(staging, final)
            catalog.record_frames(conn, item.video_id, profile, asdict(options), final, count)
        if may_delete_video_file(projects) and delete_video_file(catalog, conn, item.video_id):
            ctx.log.info(
                f"frames {item.video_id}: video file deleted (cleanup.delete_videos_after_extraction)"
            )
        catalog.advance_videos(conn, [item.video_id])

    return ItemResult(
        metadata={
            "frames_per_profile": summary or "already extracted",
            "profiles": ", ".join(sorted(wanted)),
            "seconds": round(time.monotonic() - started, 2),
        },
        outcome={"frames": summary},
        commit=commit,
        staged=staged,
    )


def _require_disk_space(ctx: StageContext, projects: list[ProjectRow]) -> None:
    """Raise Postponed when the data disk has less free space than a linked project reserves."""
    reserve_mb = max(p.config.extract.min_free_disk_mb for p in projects)
    root = ctx.db.paths.root
    root.mkdir(parents=True, exist_ok=True)
    try:
        require_free_space(
            root,
            int(reserve_mb * 2**20),
            f"extracting frames (extract.min_free_disk_mb reserve of {reserve_mb:g} MB)",
        )
    except InsufficientDiskSpace as exc:
        raise Postponed(str(exc)) from exc


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
