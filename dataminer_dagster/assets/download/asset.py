"""downloads: the video file of each video, with its metadata, ready to decode.

Local source files are probed in place (never copied, never deleted). A file already downloaded and
still valid is not fetched again. Projects can have different rules (hashtags, duration, size): the
video is fetched when at least one linked project accepts it, and the projects whose rules reject
it record it as blocked for themselves.

Each video's file is hashed once (SHA-256 of its bytes, content_hash.py). A video whose
content an earlier video already has is a copy of it (`videos.same_as`): its chain ends here, and
its projects use the original's frames and results (Catalog.advance_videos); a copy's downloaded
file is never published (the original's holds the same bytes), a local one is left in place.

A video is downloaded into a staging folder named with the item's lease token and published to
`videos/<id>.<ext>` in the item's completion, which checks the lease: a run that lost its lease
meanwhile replaces nothing (core/files.py, db/file_changes.py).

Downloads are polite to their host across every run (acquisition/politeness.py): a host that said
stop is paused for all of them; a run waits for a short pause and gives its items back (no attempt
used) for a long one, and the log and the partition's observation say which host, until when and
why. A run downloads several of its videos at once (the stage's `at_once`), so that a slow host
holds up no other; a download too slow or too long is given up (assets/download/pace.py), and
one still going when the command that asked for its run stops waiting (`dataminer run --timeout`)
is given back without using an attempt.
"""

from __future__ import annotations

import time
from pathlib import Path

from dataminer_dagster.acquisition.errors import DownloadBlocked, HostPaused, PermanentDownloadError
from dataminer_dagster.acquisition.politeness import host_key
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.assets.download.content_hash import file_content_hash
from dataminer_dagster.assets.download.rules import check_download_rules
from dataminer_dagster.core.media import VideoDecodeError, probe_video
from dataminer_dagster.core.progress import format_seconds
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.video_records import VideoRow
from dataminer_dagster.engine.outcomes import Blocked, ItemResult, PermanentFailure, Postponed
from dataminer_dagster.engine.previews import megabytes
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.registry import DOWNLOAD


@stage_asset(
    stage=DOWNLOAD,
    required_resource_keys=["download_client"],
    kinds={"yt-dlp", "video"},
)
def downloads(item: StageItem, ctx: StageContext) -> ItemResult:
    """The video file (a local source, or downloaded with yt-dlp) and its metadata."""
    catalog = ctx.catalog
    video = catalog.videos.get([item.video_id])[item.video_id]
    projects = catalog.videos.linked_projects([item.video_id]).get(item.video_id, [])
    if not projects:
        raise Blocked("no project uses this video")
    if video.same_as:
        return _known_copy(item, ctx, video.same_as)

    if video.source_path:
        return _local_file(item, ctx, video, projects)
    if video.file_path and (
        existing := _valid_file(ctx.db.paths.absolute(video.file_path), item.video_id)
    ):
        return _record(
            item,
            ctx,
            video.file_path,
            {
                **existing,
                "content_hash": _content_hash(video, ctx.db.paths.absolute(video.file_path)),
            },
            {"outcome": "nothing to do: downloaded already and still valid"},
        )

    host = host_key(video.url)
    options = DownloadConfig.merged([p.config.download for p in projects], host)

    def keep_going() -> None:
        """Abandons the download, or the wait for its host, if another run took the video or
        the command that asked for this run stopped waiting."""
        ctx.check_lease(item)
        ctx.check_deadline()

    throttle = ctx.db.host_throttle(
        ctx.context.run_id, options, check=keep_going, log=ctx.log.warning
    )
    started = time.monotonic()
    last_log = [started]

    def progress(p) -> None:
        keep_going()
        if p.total_bytes and time.monotonic() - last_log[0] > 10:
            last_log[0] = time.monotonic()
            eta = f", ETA {format_seconds(p.eta)}" if p.eta else ""
            ctx.log.info(
                f"download {item.video_id}: {100 * (p.downloaded_bytes or 0) / p.total_bytes:.0f}%{eta}"
            )

    staging = ctx.staging_path(ctx.db.paths.videos_dir / item.video_id)
    staging.mkdir()
    try:
        downloaded = ctx.download_client.download(
            video.url, item.video_id, staging, options, progress, throttle
        )
    except HostPaused as exc:
        raise Postponed(str(exc), not_before=exc.pause.until) from exc
    except DownloadBlocked as exc:
        raise Blocked(str(exc)) from exc
    except PermanentDownloadError as exc:
        raise PermanentFailure(str(exc)) from exc

    meta = downloaded.metadata
    info = {
        "tags": list(meta.tags),
        "title": meta.title,
        "duration": meta.duration,
        "filesize": meta.size_bytes,
    }
    rejected = _rejecting_projects(projects, info, item.video_id)
    facts = {
        "size_bytes": meta.size_bytes,
        "title": meta.title,
        "duration_s": meta.duration,
        "fps": meta.fps,
        "width": meta.width,
        "height": meta.height,
        "uploader": meta.uploader,
        "upload_date": meta.upload_date,
        "tags": list(meta.tags),
        "content_hash": _content_hash(video, downloaded.path),
    }
    extra = {
        "outcome": "downloaded",
        "download_seconds": round(time.monotonic() - started, 2),
        "rejected_by_projects": "; ".join(rejected.values()) or "none",
        "host": host,
        "waited_for_host_seconds": round(throttle.waited_s, 2),
        "host_pauses_met": "; ".join(p.describe() for p in throttle.pauses_met) or "none",
    }
    final = ctx.db.paths.videos_dir / downloaded.path.name
    return _record(
        item, ctx, ctx.db.paths.relative(final), facts, extra, rejected, staged=downloaded.path
    )


def _rejecting_projects(projects: list[ProjectRow], info: dict, video_id: str) -> dict[str, str]:
    """{project: why} for the projects whose download rules the video breaks (`info`: its tags,
    title, duration and size, as yt-dlp names them)."""
    rejected = {}
    for project in projects:
        try:
            check_download_rules(info, project.config.download, subject=f"Video {video_id}")
        except DownloadBlocked as exc:
            rejected[project.name] = f"{exc} (rule of project {project.name})"
    return rejected


def _local_file(
    item: StageItem, ctx: StageContext, video: VideoRow, projects: list[ProjectRow]
) -> ItemResult:
    """A local file, probed in place; the projects' limits (max_duration_s, max_filesize_mb)
    apply to it as to a download, on what the probe measured."""
    path = Path(video.source_path)
    facts = _valid_file(path, item.video_id, raise_reason=True)
    info = {"tags": [], "duration": facts["duration_s"], "filesize": facts["size_bytes"]}
    return _record(
        item,
        ctx,
        None,
        {**facts, "title": path.stem, "content_hash": _content_hash(video, path)},
        {"outcome": "local file, probed in place", "file": path},
        _rejecting_projects(projects, info, item.video_id),
    )


def _known_copy(item: StageItem, ctx: StageContext, original: str) -> ItemResult:
    """A video known to be a copy (its download is done again, e.g. with `redo`): nothing to
    fetch, its original's file is the one decoded."""
    catalog = ctx.catalog
    return ItemResult(
        metadata={"outcome": f"nothing to do: same content as video {original}"},
        outcome={"status": f"same content as video {original}"},
        commit=lambda conn: catalog.advance_videos(conn, [item.video_id]),
    )


def _content_hash(video: VideoRow, path: Path) -> str:
    """The video's content hash: the one recorded, or the file's (hashed once per video)."""
    return video.content_hash or file_content_hash(path)


def _valid_file(path: Path, video_id: str, *, raise_reason: bool = False) -> dict | None:
    try:
        probe = probe_video(path, video_id=video_id)
    except VideoDecodeError as exc:
        if raise_reason:
            raise PermanentFailure(str(exc)) from exc
        return None
    return {
        "size_bytes": probe.size_bytes,
        "duration_s": probe.duration,
        "fps": probe.fps,
        "width": probe.width,
        "height": probe.height,
    }


def _record(
    item: StageItem,
    ctx: StageContext,
    file_path: str | None,
    facts: dict,
    extra: dict,
    rejected: dict[str, str] | None = None,
    staged: Path | None = None,
) -> ItemResult:
    """What the item's commit records; a video downloaded just now (`staged`) is published to
    `file_path` in it, under the lease's check, unless it is a copy of another video."""
    catalog, paths = ctx.catalog, ctx.db.paths
    # What the commit will decide, for the UI; a video of the same content committed in between
    # (another run) may change it, and the commit's decision is the one kept.
    original = catalog.videos.original_for(item.video_id, facts["content_hash"])

    def commit(conn) -> None:
        same_as = catalog.videos.record_content(conn, item.video_id, facts["content_hash"])
        if same_as != original:
            ctx.log.info(
                f"download {item.video_id}: "
                + (f"a copy of video {same_as}" if same_as else "no copy of another video")
                + ", as a video of the same content committed meanwhile decided"
            )
        if same_as and file_path and staged is None:  # the original's file holds the same bytes
            file_changes(conn).set_aside(paths.absolute(file_path))
        elif staged is not None and not same_as:
            file_changes(conn).publish(staged, paths.absolute(file_path))
        catalog.videos.record_file(conn, item.video_id, None if same_as else file_path, facts)
        if rejected:
            catalog.videos.block_for_projects(conn, item.video_id, rejected)
        catalog.advance_videos(conn, [item.video_id])

    shown = {**extra, **_shown(facts), "same_content_as": original}
    if original:
        shown["outcome"] = f"{extra['outcome']}; same content as video {original}"
    return ItemResult(
        metadata={k: v for k, v in shown.items() if v is not None},
        outcome={"status": extra["outcome"]},
        commit=commit,
    )


def _shown(facts: dict) -> dict:
    """A video's facts as the UI shows them (its title is shown by the stage machinery)."""
    return {
        "size_mb": megabytes(facts.get("size_bytes")),
        "duration_seconds": facts.get("duration_s"),
        "fps": facts.get("fps"),
        "width": facts.get("width"),
        "height": facts.get("height"),
        "uploader": facts.get("uploader"),
        "upload_date": facts.get("upload_date"),
    }
