"""Issue 23, item 7: the same video once. Two files or URLs with the same content are one video:
extracted once, filtered once per project, in the dataset once, with every source in its
manifest; a copy added to another project reuses the frames, and deleting the original keeps
what the copy needs. Driven as the sensors decide, with a tiny real-architecture SigLIP2, real
files and real yt-dlp against a local HTTP server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dataminer_dagster.acquisition.video_ids import video_id_for_file, video_id_for_url
from dataminer_dagster.cli import main
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.deletions import delete_orphan_videos, delete_project
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_lifecycle import force_stage
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    drive_quietly,
    pipeline_definitions,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow

SPEC = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=3)
FRAMES_PER_VIDEO = 4  # one every 0.5 s of 2 s


def _config(name: str, out: Path, model: Path, **inputs):
    return parse_project_config(
        {
            "name": name,
            "output_dir": str(out / name),
            "inputs": inputs,
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(model),
            "dedup": {"threshold": 0.9999},
        }
    )


def _drive(database_url: str, data_dir: Path, store: LeaseStore, *projects: str) -> None:
    defs = pipeline_definitions(resources(database_url, data_dir))
    with instance_for_test() as instance:
        result = drive_quietly(list(projects), instance=instance, defs=defs, store=store)
    assert result.stages == dict.fromkeys(projects, "complete"), result
    assert result.failed_runs == 0


def _original_and_copy(catalog: Catalog, a: str, b: str) -> tuple[str, str]:
    videos = catalog.videos.get([a, b])
    copies = [v for v in videos.values() if v.same_as]
    assert len(copies) == 1, "one of the two is a copy of the other"
    assert videos[copies[0].same_as].same_as is None
    return copies[0].same_as, copies[0].video_id


def _extractions(engine) -> dict[str, int]:
    """Frames extracted per video (the video_frames rows)."""
    with engine.connect() as c:
        rows = c.execute(sa.text("SELECT video_id, frame_count FROM dataminer.video_frames")).all()
    return {r.video_id: r.frame_count for r in rows}


def _manifest(out: Path, project: str) -> pd.DataFrame:
    return pd.read_parquet(ProjectPaths(out / project).dataset_dir / "manifest.parquet")


def _assert_processed_once(catalog: Catalog, out: Path, project: str, original: str, copy: str):
    engine = catalog.engine
    assert _extractions(engine) == {original: FRAMES_PER_VIDEO}, "extracted once"
    assert not (catalog.paths.root / "frames" / copy).exists()
    frames = work_items(engine, "frames")
    assert frames[copy].status == "done" and frames[copy].outcome["same_as"] == original
    filters = work_items(engine, "filter")
    assert filters[f"{project}.{original}"].outcome["frames"] == FRAMES_PER_VIDEO
    assert filters[f"{project}.{copy}"].outcome["same_as"] == original, "not filtered again"
    assert [p.stem for p in (out / project / "filter").glob("*.parquet")] == [original]
    # The frames go into dedup and the dataset once: no frame of the copy, none twice.
    dedup = pd.read_parquet(ProjectPaths(out / project).dedup_table)
    assert set(dedup["video_id"]) == {original} and len(dedup) == FRAMES_PER_VIDEO
    manifest = _manifest(out, project)
    assert 1 <= len(manifest) <= FRAMES_PER_VIDEO
    assert manifest["file_name"].is_unique
    assert set(manifest["video_id"]) == {original}
    assert all(name.startswith(f"{original}_") for name in manifest["file_name"])
    images = ProjectPaths(out / project).dataset_dir / "images"
    assert sorted(p.name for p in images.iterdir()) == sorted(manifest["file_name"])
    return manifest


def test_a_copied_local_file_is_processed_once(
    tmp_path, database_url, engine, tiny_siglip, dataminer_env, monkeypatch
):
    clip = write_videos(tmp_path / "videos", {"clip.mp4": SPEC})["clip.mp4"]
    copied = tmp_path / "elsewhere" / "renamed.mp4"
    copied.parent.mkdir()
    shutil.copy(clip, copied)
    data_dir, out = dataminer_env / "data", tmp_path / "out"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    catalog.projects.register(_config("p", out, tiny_siglip, files=[str(clip), str(copied)]))
    _drive(database_url, data_dir, store, "p")

    original, copy = _original_and_copy(catalog, video_id_for_file(clip), video_id_for_file(copied))
    manifest = _assert_processed_once(catalog, out, "p", original, copy)
    paths = {video_id_for_file(clip): str(clip), video_id_for_file(copied): str(copied)}
    for sources in manifest["sources"]:
        assert list(sources) == [str(clip), str(copied)], "both sources, in the project's order"
    # source_url is the first of the sources, whichever file became the original (the one
    # whose download recorded the content first)
    assert set(manifest["source_url"]) == {str(clip)}
    assert clip.is_file() and copied.is_file(), "local files are never deleted"

    monkeypatch.chdir(tmp_path)
    status = CliRunner().invoke(main, ["status", "p"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    assert f"{copy} ({paths[copy]}) is a copy of {original} ({paths[original]})" in status.output


def test_the_same_video_behind_two_urls_is_downloaded_and_extracted_once(
    tmp_path, database_url, engine, tiny_siglip
):
    www = tmp_path / "www"
    write_videos(www, {"clip.mp4": SPEC})
    shutil.copy(www / "clip.mp4", www / "mirror.mp4")
    data_dir, out = tmp_path / "data", tmp_path / "out"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    with LocalHTTPServer(www) as server:
        urls = [server.url("/clip.mp4"), server.url("/mirror.mp4")]
        catalog.projects.register(_config("p", out, tiny_siglip, urls=urls))
        _drive(database_url, data_dir, store, "p")

    original, copy = _original_and_copy(catalog, *map(video_id_for_url, urls))
    manifest = _assert_processed_once(catalog, out, "p", original, copy)
    for sources in manifest["sources"]:
        assert list(sources) == urls
    # The copy's download went: the original's file holds the same bytes.
    assert [p.stem for p in (data_dir / "videos").iterdir()] == [original]
    assert catalog.videos.get([copy])[copy].file_path is None


def test_a_copy_in_a_second_project_reuses_the_frames_and_outlives_the_original(
    tmp_path, database_url, engine, tiny_siglip
):
    clip = write_videos(tmp_path / "videos", {"clip.mp4": SPEC})["clip.mp4"]
    copied = tmp_path / "copy.mp4"
    shutil.copy(clip, copied)
    data_dir, out = tmp_path / "data", tmp_path / "out"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    original, copy = video_id_for_file(clip), video_id_for_file(copied)
    catalog.projects.register(_config("p", out, tiny_siglip, files=[str(clip)]))
    _drive(database_url, data_dir, store, "p")
    extracted = work_items(engine, "frames")[original].finished_at

    catalog.projects.register(_config("q", out, tiny_siglip, files=[str(copied)]))
    _drive(database_url, data_dir, store, "q")

    assert catalog.videos.get([copy])[copy].same_as == original
    assert _extractions(engine) == {original: FRAMES_PER_VIDEO}
    assert work_items(engine, "frames")[original].finished_at == extracted, "not extracted again"
    filters = work_items(engine, "filter")
    assert filters[f"q.{original}"].outcome["frames"] == FRAMES_PER_VIDEO, "q's own filter pass"
    manifest = _manifest(out, "q")
    assert set(manifest["video_id"]) == {original}
    assert [list(s) for s in manifest["sources"]] == [[str(copied)]] * len(manifest)
    assert set(manifest["source_url"]) == {str(copied)}, "q found the video at the copy only"

    # Deleting the original's project and cleaning up keeps what q's copy uses: q deduplicates
    # again from the same frames, nothing extracted again.
    frames_dir = next((data_dir / "frames" / original).iterdir())
    paths = DataPaths(data_dir)
    assert delete_project(engine, paths, "p", delete_unused_videos=True).deleted_videos == []
    assert delete_orphan_videos(engine, paths, remove_files=True).deleted_videos == []
    assert sorted(catalog.videos.get([original, copy])) == sorted([original, copy])
    assert len(list(frames_dir.glob(f"{original}_*"))) == FRAMES_PER_VIDEO
    assert force_stage(catalog, "q", "dedup").frames_released == []
    _drive(database_url, data_dir, store, "q")
    assert _extractions(engine) == {original: FRAMES_PER_VIDEO}
    assert work_items(engine, "frames")[original].finished_at == extracted
    assert _manifest(out, "q")["file_name"].tolist() == manifest["file_name"].tolist()
