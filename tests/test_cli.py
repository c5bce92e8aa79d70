"""The `dataminer` command against a real test database: every command, its output and its
refusals. State is built directly with Catalog and LeaseStore (items marked done, dead, running)
where the pipeline would be slow; files are real files in temporary directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from dataminer_dagster.acquisition.video_ids import Candidate, video_id_for_file
from dataminer_dagster.cli import dev as cli_dev
from dataminer_dagster.cli import main
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import BLOCKED, DEAD, DONE, PENDING, RUNNING
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.registry import (
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
)
from dataminer_dagster.settings import load_settings
from dataminer_dagster.testing import keep_every_frame

REPO = Path(__file__).resolve().parents[1]


def invoke(*args: str, input: str | None = None, code: int = 0):
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


class World:
    """The test database and data directory, as the CLI sees them, with shortcuts to build
    state."""

    def __init__(self, database_url: str):
        settings = load_settings()
        self.engine = get_engine(database_url)
        self.store = LeaseStore(self.engine, settings.retry)
        self.paths = DataPaths(settings.data_dir)
        self.catalog = Catalog(self.engine, self.store, self.paths)

    def project(
        self,
        name: str,
        videos: list[str],
        *,
        local: dict[str, Path] | None = None,
        output_dir: Path | None = None,
    ):
        """A project whose videos are linked and their downloads queued."""
        config = parse_project_config(
            {
                "name": name,
                "inputs": {"urls": ["https://example.com/a.mp4"]},
                "filter": {"positive_prompts": ["a thing"]},
                "output_dir": str(output_dir) if output_dir else None,
            }
        )
        project = self.catalog.projects.register(config).project
        local = local or {}
        candidates = [
            Candidate(v, "file", source_path=str(local[v]))
            if v in local
            else Candidate(v, "url", url=f"https://example.com/{v}.mp4")
            for v in videos
        ]
        with self.engine.begin() as conn:
            self.catalog.videos.link(conn, project, candidates)
        self.store.enqueue(DOWNLOAD, videos, video_ids=videos)
        return project

    def set(self, stage: str, key: str, status: str, *, video: str | None = None, project=None):
        """Give an item a status: finished ones with mark(), running by a claim of run-<key>."""
        video = video or (key.rpartition(".")[2] if stage in (DOWNLOAD, FRAMES, FILTER) else None)
        pid = project.id if project is not None else None
        if status == RUNNING:
            self.store.enqueue(stage, [key], project_ids=[pid], video_ids=[video], reset=[DONE])
            leases, _ = self.store.claim_keys(stage, [key], f"run-{key}")
            assert leases, f"could not claim {stage} {key}"
        elif status == PENDING:
            self.store.enqueue(stage, [key], project_ids=[pid], video_ids=[video], reset=[DONE])
        else:
            self.store.mark(
                stage, key, status, f"{status} because of a test", project_id=pid, video_id=video
            )

    def status(self, stage: str, key: str) -> str | None:
        with self.engine.connect() as c:
            return c.execute(
                sa.text(
                    "SELECT status FROM dataminer.work_items WHERE stage = :s AND item_key = :k"
                ),
                {"s": stage, "k": key},
            ).scalar()

    def videos(self) -> set[str]:
        with self.engine.connect() as c:
            return set(c.execute(sa.text("SELECT video_id FROM dataminer.videos")).scalars())

    def members(self, project: str) -> set[str]:
        with self.engine.connect() as c:
            return set(
                c.execute(
                    sa.text("""SELECT pv.video_id FROM dataminer.project_videos pv
                               JOIN dataminer.projects p ON p.id = pv.project_id
                               WHERE p.name = :n"""),
                    {"n": project},
                ).scalars()
            )

    def files_of(self, video: str) -> list[Path]:
        """A downloaded file, one extraction profile with frames and a cached embedding file."""
        video_file = self.paths.videos_dir / f"{video}.mp4"
        frames = self.paths.frames_dir(video, "prof")
        cache = self.paths.embeddings_dir() / "model" / f"{video}.npz"
        for path in (video_file, frames / f"{video}_000000.jpg", cache):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
        with self.engine.begin() as conn:
            self.catalog.videos.record_file(conn, video, self.paths.relative(video_file), {})
            self.catalog.frames.record(conn, video, "prof", {}, frames, 1)
        return [video_file, frames, cache]


@pytest.fixture
def world(dataminer_env, database_url) -> World:
    return World(database_url)


def _write_config(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


CONFIG = {
    "name": "street",
    "inputs": {"urls": ["https://www.youtube.com/watch?v=dQw4w9WgXcQ"]},
    "filter": {"positive_prompts": ["a street"]},
}


# --- help and config errors (no database) ------------------------------------------------------


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def test_every_command_has_help():
    paths = list(_commands(main))
    for expected in [
        ("db", "reset"),
        ("project", "status"),
        ("project", "delete"),
        ("delete-videos",),
        ("cleanup-orphans",),
        ("retry",),
        ("force-dedup",),
        ("force-detect",),
        ("dev",),
        ("export",),
        ("status",),
    ]:
        assert expected in paths
    for path in paths:
        command = main
        for name in path:
            command = command.commands[name]
        output = " ".join(invoke(*path, "--help").output.split())
        assert output.startswith(f"Usage: main {' '.join(path)} ")
        assert " ".join(command.help.split()[:4]) in output


def test_config_with_an_unknown_key_names_it_and_the_allowed_keys(tmp_path):
    raw = {**CONFIG, "filter": {**CONFIG["filter"], "threshold": 0.5}}
    result = invoke("project", "add", str(_write_config(tmp_path / "p.yaml", raw)), code=1)
    assert "filter.threshold: unknown key" in result.output
    assert "positive_threshold" in result.output and "negative_prompts" in result.output


def test_config_without_a_required_key_says_so(tmp_path):
    raw = {k: v for k, v in CONFIG.items() if k != "filter"}
    result = invoke("populate", str(_write_config(tmp_path / "p.yaml", raw)), "--dry-run", code=1)
    assert "filter: required" in result.output


def test_config_that_does_not_exist_is_a_usage_error(tmp_path):
    result = invoke("project", "add", str(tmp_path / "missing.yaml"), code=2)
    assert "does not exist" in result.output


# --- database -----------------------------------------------------------------------------------


def test_db_url_masks_the_password(dataminer_env, database_url, monkeypatch):
    from sqlalchemy.engine import make_url

    with_password = make_url(database_url).set(password="hunter2")
    monkeypatch.setenv(
        "DATAMINER_DATABASE_URL", with_password.render_as_string(hide_password=False)
    )
    out = invoke("db", "url").output
    assert "hunter2" not in out and ":***@" in out
    assert make_url(database_url).database in out


def test_db_upgrade_twice_then_reset_needs_yes(world):
    with world.engine.begin() as c:
        c.execute(sa.text("DROP SCHEMA dataminer CASCADE"))
    assert "upgraded from empty to revision" in invoke("db", "upgrade").output
    assert "already at revision" in invoke("db", "upgrade").output

    world.project("p1", ["v1", "v2"])
    refused = invoke("db", "reset", code=1).output
    assert "1 projects, 2 videos" in refused and "--yes" in refused
    assert world.videos() == {"v1", "v2"}
    done = invoke("db", "reset", "--yes").output
    assert "dropped 1 projects, 2 videos" in done
    assert world.videos() == set() and world.catalog.projects.all() == []
    assert "already at revision" in invoke("db", "upgrade").output


# --- projects and videos ------------------------------------------------------------------------


def test_project_add_twice_then_changed(world, tmp_path):
    path = _write_config(tmp_path / "p.yaml", CONFIG)
    assert "project street registered" in invoke("project", "add", str(path)).output
    assert "project street unchanged" in invoke("project", "add", str(path)).output
    _write_config(path, {**CONFIG, "dedup": {"threshold": 0.8}})
    assert "project street updated" in invoke("project", "add", str(path)).output
    listing = invoke("project", "list").output
    assert "street" in listing and "active" in listing


def test_add_video_to_an_unknown_project_creates_nothing(world):
    result = invoke(
        "add-video", "https://www.youtube.com/watch?v=dQw4w9WgXcQ", "--project", "nope", code=1
    )
    assert "no project named 'nope'" in result.output
    assert world.catalog.projects.all() == [] and world.videos() == set()


def test_add_video_adds_then_says_it_is_there(world):
    world.project("p1", [])
    url = "https://youtu.be/dQw4w9WgXcQ?t=3"
    assert "video dQw4w9WgXcQ added: p1" in invoke("add-video", url, "--project", "p1").output
    assert "already in the project" in invoke("add-video", url, "--project", "p1").output
    assert world.status(DOWNLOAD, "dQw4w9WgXcQ") == PENDING


def test_populate_respects_a_paused_host_and_says_until_when(world, tmp_path):
    """A search host that every run has paused is not asked by the CLI either: one readable
    line, no traceback, nothing registered."""
    from dataminer_dagster.db.host_pauses import host_turn

    with host_turn(world.engine, "youtube.com") as turn:
        turn.pause(600, "rate limited", "HTTP 429 Too Many Requests", None)
    raw = {**CONFIG, "inputs": {"search": {"queries": ["street view"]}}}
    result = invoke("populate", str(_write_config(tmp_path / "p.yaml", raw)), code=1)
    assert "Traceback" not in result.output
    assert "youtube.com is paused until" in result.output and "HTTP 429" in result.output
    assert world.catalog.projects.get("street") is None


def test_populate_dry_run_with_a_url_file_and_local_files_writes_nothing(world, tmp_path):
    (tmp_path / "urls.txt").write_text(
        "https://www.youtube.com/watch?v=dQw4w9WgXcQ\n\n// a comment\n"
        "https://example.com/clip.mp4\n"
    )
    for name in ("a.mp4", "b.webm", "notes.txt"):
        (tmp_path / "clips").mkdir(exist_ok=True)
        (tmp_path / "clips" / name).write_bytes(b"not decoded by a dry run")
    raw = {**CONFIG, "inputs": {"url_file": "urls.txt", "files": [str(tmp_path / "clips" / "*")]}}
    path = _write_config(tmp_path / "p.yaml", raw)
    out = invoke("populate", str(path), "--dry-run").output
    assert "4 videos would be added to street" in out
    assert "dQw4w9WgXcQ" in out and "https://example.com/clip.mp4" in out and "a.mp4" in out
    assert world.catalog.projects.all() == [] and world.videos() == set()

    out = invoke("populate", str(path)).output
    assert "street: 4 videos (4 new to the catalog, 4 newly linked, 0 already linked)" in out
    assert len(world.members("street")) == 4


# --- status -------------------------------------------------------------------------------------


def test_status_of_an_unknown_project(world):
    assert "no project named 'nope'" in invoke("status", "nope", code=1).output
    assert "no project named 'nope'" in invoke("project", "status", "nope", code=1).output
    assert "no projects yet" in invoke("status").output
    assert json.loads(invoke("status", "--json").output) == {"projects": [], "host_pauses": []}


def test_status_tables_throughput_eta_and_failures(world, tmp_path):
    project = world.project("p1", [f"v{i}" for i in range(6)])
    world.project("p2", ["v0"])
    for v in ("v0", "v1", "v2"):
        world.set(DOWNLOAD, v, DONE)
    world.set(DOWNLOAD, "v3", RUNNING)
    world.set(DOWNLOAD, "v4", DEAD)
    world.set(FILTER, "p1.v0", BLOCKED, project=project)

    data = json.loads(invoke("status", "p1", "--json", "--window", "10").output)
    assert (data["project"], data["stage"], data["videos"]) == ("p1", "active", 6)
    download = next(s for s in data["stages"] if s["stage"] == DOWNLOAD)
    assert (download["done"], download["running"], download["dead"], download["pending"]) == (
        3,
        1,
        1,
        1,
    )
    assert download["finished_in_window"] == 4  # done and dead
    assert download["per_minute"] == pytest.approx(0.4)
    assert download["eta_s"] == pytest.approx(2 / 0.4 * 60)  # pending + running left
    frames = next(s for s in data["stages"] if s["stage"] == FRAMES)
    assert frames["eta_s"] == 0  # nothing queued
    assert data["frames"] == {
        "extracted": 0,
        "passed_filter": 0,
        "kept_after_dedup": 0,
        "in_dataset": 0,
    }
    reasons = {(f["stage"], f["item"]): f["error"] for f in data["failures"]}
    assert reasons == {
        (DOWNLOAD, "v4"): "dead because of a test",
        (FILTER, "p1.v0"): "blocked because of a test",
    }
    assert json.loads(invoke("project", "status", "p1", "--json", "--window", "10").output) == data

    text = invoke("status", "p1").output
    assert "project p1: active; 6 videos" in text
    assert "pending  running     done   failed     dead  blocked" in text
    assert "download         1        1        3        0        1        0" in text
    assert (
        "latest failures:" in text
        and "download v4: dead (0 attempts): dead because of a test" in text
    )
    # each failure with its partition's page in the UI, the partition key being the item's
    lines = text.splitlines()
    after = lines[next(i for i, line in enumerate(lines) if "download v4: dead" in line) + 1]
    assert after.strip() == "http://127.0.0.1:3000/assets/downloads?view=partitions&partition=v4"
    links = {(f["stage"], f["item"]): f["ui"] for f in data["failures"]}
    assert links[FILTER, "p1.v0"] == (
        "http://127.0.0.1:3000/assets/filtered_frames?view=partitions&partition=p1.v0"
    )
    settings = tmp_path / "ui.yaml"
    settings.write_text("ui: {url: 'https://ui.example.org/dagster/', asset_prefix: mine}\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATAMINER_SETTINGS", str(settings))
        failures = json.loads(invoke("status", "p1", "--json").output)["failures"]
    assert {f["ui"] for f in failures if f["item"] == "v4"} == {
        "https://ui.example.org/dagster/assets/mine/downloads?view=partitions&partition=v4"
    }

    overview = invoke("status").output.splitlines()
    assert overview[0].split()[:3] == ["project", "stage", "videos"]
    assert overview[1].split()[:6] == ["p1", "active", "6", "4/6", "0/0", "1/1"]
    assert overview[2].split()[:4] == ["p2", "active", "1", "1/1"]
    projects = json.loads(invoke("status", "--json").output)["projects"]
    assert [p["project"] for p in projects] == ["p1", "p2"]
    assert projects[0]["stages"][DOWNLOAD]["dead"] == 1
    assert "is not in the range" in invoke("status", "p1", "--window", "0", code=2).output


def test_status_shows_leases_held_far_longer_than_their_stage_usually_takes(world):
    world.project("p1", ["v0", "v1", "v2"])
    world.project("p2", ["w0"])
    for v in ("v0", "v1", "v2", "w0"):
        world.set(DOWNLOAD, v, RUNNING)
    with world.engine.begin() as c:  # v0 and v1 took 3 s each; v2 and w0 began 10 minutes ago
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'done', lease_token = NULL,
                              lease_owner = NULL, finished_at = now(),
                              started_at = now() - interval '3 seconds'
                        WHERE item_key IN ('v0', 'v1')""")
        )
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET started_at = now() - interval '10 minutes'
                        WHERE item_key IN ('v2', 'w0')""")
        )
    data = json.loads(invoke("status", "p1", "--json").output)
    [held] = data["long_running"]
    assert (held["stage"], held["item"], held["run"]) == (DOWNLOAD, "v2", "run-v2")
    assert held["running_s"] == pytest.approx(600, abs=5) and held["usual_s"] == 3.0
    text = invoke("status", "p1").output
    assert "long-running (held far longer than their stage usually takes):" in text
    assert "download v2: running for 10m00s in run run-v2; its stage's items usually take 3s" in (
        text
    )
    link = "http://127.0.0.1:3000/assets/downloads?view=partitions&partition=v2"
    assert held["ui"] == link and f"\n    {link}\n" in text


# --- deleting -----------------------------------------------------------------------------------


def test_project_delete_keeps_shared_videos_and_asks_first(world, tmp_path):
    world.project("p1", ["shared", "mine"])
    world.project("p2", ["shared"])
    assert "no project named 'nope'" in invoke("project", "delete", "nope", "--yes", code=1).output

    asked = invoke("project", "delete", "p1", input="n\n", code=1)
    assert "Delete project p1 (2 videos, 1 of them used by no other project)?" in asked.output
    assert "Aborted" in asked.output and world.catalog.projects.get("p1") is not None

    files = world.files_of("mine")
    out = invoke("project", "delete", "p1", input="y\n").output
    assert "deleted project p1" in out and "1 videos are now used by no project" in out
    assert world.catalog.projects.get("p1") is None
    assert world.videos() == {"shared", "mine"}  # the orphan stays, with its files
    assert all(f.exists() for f in files)
    assert world.status(DOWNLOAD, "mine") == PENDING


def test_project_delete_files_removes_only_what_no_other_project_uses(world, tmp_path):
    local = tmp_path / "source.mp4"
    local.write_bytes(b"a local source is never deleted")
    p1 = world.project("p1", ["shared", "mine", "local"], local={"local": local})
    world.project("p2", ["shared"])
    mine, shared = world.files_of("mine"), world.files_of("shared")
    output = ProjectPaths(p1.output_dir)
    output.filter_table("mine").parent.mkdir(parents=True)
    output.filter_table("mine").write_bytes(b"table")

    out = invoke("project", "delete", "p1", "--files", "--yes").output
    assert "deleted 2 videos that no other project used" in out
    assert not p1.output_dir.exists()
    assert not any(f.exists() for f in mine)
    assert not (world.paths.root / "frames" / "mine").exists()
    assert all(f.exists() for f in shared) and local.exists()
    assert world.videos() == {"shared"}
    assert world.status(DOWNLOAD, "mine") is None


def test_project_delete_files_keeps_an_output_dir_registered_before_markers_existed(
    world, tmp_path
):
    """Rows written before registration checked output directories: one that another project's
    output lies in, and one without the marker, keep every file."""
    world.project("p1", ["v1"], output_dir=tmp_path / "out")
    world.project("p2", ["v2"], output_dir=tmp_path / "elsewhere")
    with world.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE dataminer.projects SET output_dir = :d WHERE name = 'p2'"),
            {"d": str(tmp_path / "out" / "p2")},
        )
    (tmp_path / "out" / "p2" / "dataset").mkdir(parents=True)
    (tmp_path / "out" / "dataset").mkdir()
    out = invoke("project", "delete", "p1", "--files", "--yes").output
    assert f"its output directory {tmp_path / 'out'} stays: it overlaps project p2" in out
    assert (tmp_path / "out" / "dataset").is_dir() and (tmp_path / "out" / "p2").is_dir()

    out = invoke("project", "delete", "p2", "--files", "--yes").output
    assert "stays: it carries no marker naming project p2" in out
    assert (tmp_path / "out" / "p2" / "dataset").is_dir()


# --- output directories: a project writes only where it may ------------------------------------


def _add(tmp_path: Path, name: str, output_dir, code: int = 0, folder: Path | None = None):
    folder = folder or tmp_path / f"configs-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    raw = {**CONFIG, "name": name, "output_dir": str(output_dir)}
    return invoke("project", "add", str(_write_config(folder / f"{name}.yaml", raw)), code=code)


@pytest.mark.parametrize(
    "where",
    [
        "an existing folder",
        "the config's own folder",
        "the embedded database",
        "the frame store",
        "the data directory",
        "DATAMINER_HOME",
        "above DATAMINER_HOME",
        "DAGSTER_HOME",
        "$HOME",
    ],
)
def test_project_add_refuses_an_output_dir_it_may_not_own(world, tmp_path, monkeypatch, where):
    """Each of these was deleted whole by `project delete --files` when it was an output_dir."""
    home, data = Path(os.environ["DATAMINER_HOME"]), world.paths.root
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    configs = tmp_path / "configs"
    (configs / "other.yaml").parent.mkdir(parents=True)
    (configs / "other.yaml").write_text("another project's config")
    existing = tmp_path / "photos"
    (existing / "2024").mkdir(parents=True)
    output_dir, message = {
        "an existing folder": (existing, "is not empty (2024)"),
        "the config's own folder": (".", "is not empty (other.yaml, street.yaml)"),
        "the embedded database": (home / "pg", "overlaps DATAMINER_HOME"),
        "the frame store": (data / "frames", "overlaps the data directory"),
        "the data directory": (data, "overlaps the data directory"),
        "DATAMINER_HOME": (home, "overlaps the data directory"),
        "above DATAMINER_HOME": (tmp_path, "overlaps the data directory"),
        "DAGSTER_HOME": (tmp_path / "dagster" / "runs", "overlaps DAGSTER_HOME"),
        "$HOME": (tmp_path / "user", "overlaps $HOME"),
    }[where]
    out = _add(tmp_path, "street", output_dir, code=1, folder=configs).output
    assert message in out, out
    assert world.catalog.projects.get("street") is None
    assert (existing / "2024").is_dir() and (configs / "other.yaml").is_file()
    assert not (Path(configs / output_dir) / ".dataminer-project").exists()


def test_two_projects_cannot_share_or_nest_output_dirs(world, tmp_path):
    _add(tmp_path, "p1", tmp_path / "out" / "p1")
    assert (tmp_path / "out" / "p1" / ".dataminer-project").read_text() == "p1\n"
    for other in (tmp_path / "out" / "p1", tmp_path / "out" / "p1" / "inner", tmp_path / "out"):
        out = _add(tmp_path, "p2", other, code=1).output
        assert "overlaps the output directory of project p1" in out
    _add(tmp_path, "p2", tmp_path / "out" / "p2")
    _add(tmp_path, "p1", tmp_path / "out" / "p1")  # the same project again: its own directory
    assert world.catalog.projects.get("p2").output_dir == tmp_path / "out" / "p2"


@pytest.mark.parametrize("where", ["a file", "/dev/null", "inside a file"])
def test_project_add_names_an_output_dir_that_cannot_be_a_directory(world, tmp_path, where):
    """Each was a 35-line traceback ending in FileExistsError."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes")
    output_dir, message = {
        "a file": (notes, f"{notes} is a file, not a directory; name a new or empty directory"),
        "/dev/null": (
            Path("/dev/null"),
            "/dev/null is a character device, not a directory; name a new or empty directory",
        ),
        "inside a file": (
            notes / "out",
            f"{notes / 'out'} cannot be made: {notes} is a file, not a directory",
        ),
    }[where]
    out = _add(tmp_path, "street", output_dir, code=1).output
    assert out.splitlines() == [f"Error: output_dir {message}"]
    assert notes.read_text() == "the user's notes"
    assert world.catalog.projects.get("street") is None


def test_project_add_refuses_a_number_no_code_can_use_in_one_line(world, tmp_path):
    """.inf reached PostgreSQL as JSON Infinity: a raw psycopg traceback."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(CONFIG) + "download: {max_filesize_mb: .inf}\n")
    out = invoke("project", "add", str(path), code=1).output
    assert out.splitlines() == [
        f"Error: {path}: 1 problem(s)",
        "  download.max_filesize_mb: must be a finite number no larger than 2,147,483,647 "
        "(got inf)",
    ]
    assert world.catalog.projects.get("street") is None


def test_project_add_takes_an_empty_folder_and_one_holding_only_its_own_results(world, tmp_path):
    (tmp_path / "empty").mkdir()
    _add(tmp_path, "p1", tmp_path / "empty")
    (tmp_path / "older" / "dataset").mkdir(parents=True)  # written before markers existed
    _add(tmp_path, "p2", tmp_path / "older")
    assert (tmp_path / "older" / ".dataminer-project").read_text() == "p2\n"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / ".dataminer-project").write_text("someone\n")
    assert "belongs to project someone" in _add(tmp_path, "p3", tmp_path / "taken", 1).output


def test_project_delete_files_removes_only_what_the_project_wrote(world, tmp_path):
    _add(tmp_path, "p1", tmp_path / "out")
    output = ProjectPaths(tmp_path / "out")
    for entry in (output.filter_table("v1"), output.dataset_dir / "images" / "a.jpg"):
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(b"x")
    (tmp_path / "out" / "notes.txt").write_text("the user's own file, put here later")
    invoke("project", "delete", "p1", "--files", "--yes")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]

    _add(tmp_path, "p2", tmp_path / "out2")
    invoke("project", "delete", "p2", "--files", "--yes")
    assert not (tmp_path / "out2").exists()  # nothing else was in it


def test_project_delete_is_refused_while_its_work_runs(world):
    project = world.project("p1", ["v1"])
    world.set(FILTER, "p1.v1", RUNNING, project=project)
    out = invoke("project", "delete", "p1", "--yes", code=1).output
    assert "filter p1.v1 (run run-p1.v1) is running" in out
    assert world.catalog.projects.get("p1") is not None


def test_delete_videos_by_status(world):
    project = world.project("p1", ["dead1", "dead2", "busy", "ok", "shared"])
    world.project("p2", ["shared"])
    world.set(DOWNLOAD, "dead1", DEAD)
    world.set(FILTER, "p1.dead2", DEAD, project=project)
    world.set(FILTER, "p1.shared", DEAD, project=project)
    world.set(DOWNLOAD, "busy", RUNNING)
    world.set(FILTER, "p1.busy", DEAD, project=project)
    world.set(DOWNLOAD, "ok", DONE)
    dead1, shared = world.files_of("dead1"), world.files_of("shared")
    table = ProjectPaths(project.output_dir).filter_table("dead2")
    table.parent.mkdir(parents=True)
    table.write_bytes(b"table")

    bad = invoke("delete-videos", "--project", "p1", "--status", "broken", code=2).output
    assert "'broken' is not one of 'pending', 'running', 'done', 'failed', 'dead', 'blocked'" in bad
    assert (
        "no project named 'nope'"
        in invoke("delete-videos", "--project", "nope", "--status", "dead", code=1).output
    )
    asked = invoke("delete-videos", "--project", "p1", "--status", "pending", input="n\n", code=1)
    assert "Remove 2 pending videos from project p1?" in asked.output
    running = invoke("delete-videos", "--project", "p1", "--status", "running").output
    assert "1 running videos have a running item and are left alone" in running
    assert "no running videos to delete" in running

    out = invoke("delete-videos", "--project", "p1", "--status", "DEAD", "--files", "--yes").output
    assert "1 dead videos have a running item and are left alone" in out
    assert "removed 3 dead videos from project p1" in out
    assert "deleted 2 videos that no other project used" in out
    assert world.members("p1") == {"busy", "ok"}
    assert world.videos() == {"busy", "ok", "shared"}
    assert world.status(FILTER, "p1.shared") is None and world.status(DOWNLOAD, "busy") == RUNNING
    assert not any(f.exists() for f in dead1) and not table.exists()
    assert all(f.exists() for f in shared)


def test_delete_videos_is_refused_while_a_project_stage_runs(world):
    """Dedup reads the filter table of every member: removing one under it would fail it."""
    project = world.project("p1", ["dead1", "ok"])
    world.set(DOWNLOAD, "dead1", DEAD)
    world.set(DEDUP, "p1", RUNNING, project=project)
    out = invoke("delete-videos", "--project", "p1", "--status", "dead", "--yes", code=1).output
    assert "dedup p1 (run run-p1) is running" in out
    assert world.members("p1") == {"dead1", "ok"}


def test_delete_videos_without_files_leaves_orphans(world):
    world.project("p1", ["a", "b"])
    world.set(DOWNLOAD, "a", DEAD)
    files = world.files_of("a")
    out = invoke("delete-videos", "--project", "p1", "--status", "dead", input="y\n").output
    assert "Remove 1 dead videos from project p1?" in out
    assert "1 of them are now used by no project" in out
    assert world.members("p1") == {"b"} and world.videos() == {"a", "b"}
    assert all(f.exists() for f in files)


def test_cleanup_orphans(world):
    assert "no orphan videos to delete" in invoke("cleanup-orphans").output
    world.project("p1", ["gone", "b", "c", "kept"])
    files = world.files_of("gone")
    world.set(DOWNLOAD, "c", RUNNING)
    with world.engine.begin() as c:
        c.execute(
            sa.text("DELETE FROM dataminer.project_videos WHERE video_id IN ('gone', 'b', 'c')")
        )

    asked = invoke("cleanup-orphans", "--files", input="n\n", code=1).output
    assert "Delete 2 videos that no project uses and 3 of their files and directories?" in asked
    assert world.videos() == {"gone", "b", "c", "kept"}

    out = invoke("cleanup-orphans", "--yes").output
    assert "1 orphan videos have a running item; left alone" in out
    assert "1 orphan videos have files on disk; they stay until" in out
    assert "deleted 1 orphan videos" in out
    assert world.videos() == {"gone", "c", "kept"}, "its row is how --files finds its files"
    assert all(f.exists() for f in files)
    assert "no orphan videos to delete without --files" in invoke("cleanup-orphans").output

    # What a deletion killed between renaming a directory aside and removing it leaves behind.
    crashed = world.paths.root / "frames" / ".replaced-gone-0123abcd"
    crashed.mkdir()
    out = invoke("cleanup-orphans", "--files", "--yes").output
    assert "deleted 1 orphan videos" in out
    assert "removed 4 files and directories" in out
    assert world.videos() == {"c", "kept"}
    assert not any(f.exists() for f in files)
    assert not list(world.paths.root.rglob("*gone*"))


# --- retrying and forcing -----------------------------------------------------------------------


def test_retry(world):
    project = world.project("p1", ["a", "b", "c"])
    world.set(DOWNLOAD, "a", DEAD)
    world.set(DOWNLOAD, "b", BLOCKED)
    world.set(FILTER, "p1.c", DEAD, project=project)
    assert "no project named 'nope'" in invoke("retry", "--project", "nope", code=1).output
    assert (
        "'done' is not one of 'failed', 'dead', 'blocked'"
        in invoke("retry", "--status", "done", code=2).output
    )
    assert "'nope' is not one of" in invoke("retry", "--stage", "nope", code=2).output

    assert (
        "1 work items of project p1 queued again"
        in invoke("retry", "--project", "p1", "--stage", "FILTER").output
    )
    assert world.status(FILTER, "p1.c") == PENDING and world.status(DOWNLOAD, "a") == DEAD
    assert "1 work items queued again" in invoke("retry").output
    assert world.status(DOWNLOAD, "a") == PENDING and world.status(DOWNLOAD, "b") == BLOCKED
    assert "1 work items queued again" in invoke("retry", "--status", "blocked").output
    assert "0 work items queued again" in invoke("retry").output


def test_retry_brings_a_failed_project_back(world):
    project = world.project("p1", ["a"])
    world.set(CATALOG, "p1", DONE, project=project)
    world.set(DEDUP, "p1", DEAD, project=project)
    with world.engine.begin() as c:
        c.execute(sa.text("UPDATE dataminer.projects SET stage = 'failed', error = 'dedup failed'"))
    out = invoke("retry", "--project", "p1").output
    assert "1 work items of project p1 queued again" in out
    assert "project p1: failed -> dedup" in out
    assert (
        world.catalog.projects.get("p1").stage == DEDUP
        and world.catalog.projects.get("p1").error is None
    )


def test_force_dedup_and_detect(world):
    project = world.project("p1", ["a"])
    world.set(DEDUP, "p1", DONE, project=project)
    world.set(DETECT, "p1", RUNNING, project=project)
    assert "no project named 'nope'" in invoke("force-dedup", "nope", code=1).output

    refused = invoke("force-dedup", "p1", code=1).output
    assert "cannot force dedup of project p1: detect p1 (run run-p1) is running" in refused
    assert "cancel the run" in refused
    assert world.catalog.projects.get("p1").stage == "active"
    assert "detect p1 (run run-p1) is running" in invoke("force-detect", "p1", code=1).output

    world.store.liveness.release_run("run-p1", "test", count_attempt=False)
    world.set(DATASET, "p1", DONE, project=project)
    out = invoke("force-detect", "p1")
    assert "project p1: active -> detect; detect is queued" in out.output
    assert "1 of its videos are not finished" in out.output
    assert "has not finished" not in out.output  # dedup is done
    assert world.status(DETECT, "p1") == PENDING and world.status(DATASET, "p1") is None
    assert world.status(DEDUP, "p1") == DONE

    world.set(DOWNLOAD, "a", DEAD)
    out = invoke("force-dedup", "p1").output
    assert "project p1: detect -> dedup; dedup is queued" in out and "not finished" not in out
    assert world.status(DEDUP, "p1") == PENDING and world.status(DETECT, "p1") is None
    assert world.catalog.projects.get("p1").stage == DEDUP
    early = invoke("force-detect", "p1").output
    assert "note: dedup has not finished for this project, and detect reads its result" in early


# --- dev and export -----------------------------------------------------------------------------


def test_dev_dry_run_uses_the_checkout(dataminer_env, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    out = invoke("dev", "--dry-run", "-p", "3001", "--verbose").output
    assert f"DAGSTER_HOME={REPO}" in out
    assert f"dev -w {REPO / 'workspace.yaml'} -p 3001 --verbose" in out
    assert f"DATAMINER_HOME={dataminer_env}" in out

    monkeypatch.setenv("DAGSTER_HOME", str(dataminer_env / "mine"))
    assert f"DAGSTER_HOME={dataminer_env / 'mine'}" in invoke("dev", "--dry-run").output


def test_dev_without_a_checkout_copies_dagster_yaml(dataminer_env, monkeypatch, tmp_path):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setattr(cli_dev, "_editable_checkout", lambda: None)  # as if installed from a wheel
    monkeypatch.chdir(tmp_path)
    assert "no workspace.yaml" in invoke("dev", code=1).output

    monkeypatch.chdir(REPO)
    out = invoke("dev", "--dry-run").output
    assert f"would copy {REPO / 'dagster.yaml'} to {dataminer_env / 'dagster'}" in out
    assert f"DAGSTER_HOME={dataminer_env / 'dagster'}" in out


def test_dev_runs_dg_dev(dataminer_env, capfd):
    result = invoke("dev", "--", "--help")
    assert "running:" in result.output
    assert "Usage: dg dev" in capfd.readouterr().out.replace("\n", " ")


def _dataset(world: World, project) -> Path:
    """A real dataset (images, a manifest with splits, a COCO file) whose images are links into
    the frame store."""
    from tests.core.test_dataset_formats import make_dataset

    frames = world.paths.frames_dir("v", "prof")
    frames.mkdir(parents=True)
    dataset = make_dataset(ProjectPaths(project.output_dir).dataset_dir)
    for image in (dataset / "images").iterdir():
        image.rename(frames / image.name)
        os.link(frames / image.name, image)
    return frames


def test_export(world, tmp_path):
    project = world.project("p1", ["v"])
    assert "no project named 'nope'" in invoke("export", "nope", str(tmp_path / "x"), code=1).output
    missing = invoke("export", "p1", str(tmp_path / "x"), code=1).output
    assert "project p1 has no dataset yet (stage active)" in missing
    assert "dataminer run CONFIG" in missing
    frames = _dataset(world, project)

    out = invoke("export", "p1", str(tmp_path / "linked"), "--link").output
    assert "exported 6 images (6 hard links, 0 copies) of project p1" in out
    assert "coco: train 3, val 2, test 1 images" in out  # the config's formats: [coco]
    exported = tmp_path / "linked"
    assert sorted(p.name for p in exported.iterdir()) == [
        "annotations.coco.json",
        "coco",
        "images",
        "manifest.parquet",
    ]
    image = exported / "images" / "v1_000000.jpg"
    assert image.is_file() and not image.is_symlink()
    assert image.stat().st_ino == (frames / "v1_000000.jpg").stat().st_ino

    (tmp_path / "empty").mkdir()
    out = invoke(  # copies by default
        "export", "p1", str(tmp_path / "empty"), "--format", "yolo", "--format", "hf"
    ).output
    assert "exported 6 images (copied)" in out
    assert "yolo: train 3, val 2, test 1 images" in out and "hf: train 3" in out
    copied = tmp_path / "empty" / "images" / "v1_000000.jpg"
    assert copied.read_bytes() == (frames / "v1_000000.jpg").read_bytes()
    assert copied.stat().st_ino != (frames / "v1_000000.jpg").stat().st_ino
    data = yaml.safe_load((tmp_path / "empty" / "yolo" / "data.yaml").read_text())
    assert data["path"] == str(tmp_path / "empty" / "yolo")
    linked = tmp_path / "empty" / "yolo" / "images" / "train" / "v1_000000.jpg"
    assert linked.stat().st_ino == copied.stat().st_ino  # the export's own copy, linked

    assert "is not an empty directory" in invoke("export", "p1", str(exported), code=1).output


def test_export_refuses_yolo_for_a_dataset_without_boxes(world, tmp_path):
    project = world.project("p1", ["v"])
    _dataset(world, project)
    (ProjectPaths(project.output_dir).dataset_dir / "annotations.coco.json").unlink()
    out = invoke("export", "p1", str(tmp_path / "x"), "--format", "yolo", code=1).output
    assert "project p1: yolo is a format of boxes and the dataset has no annotations" in out
    assert not (tmp_path / "x").exists()


def test_run_fails_a_project_whose_every_video_is_dead(world, tmp_path):
    """It used to end "complete" with an empty dataset and exit 0."""
    from tests.helpers.http_server import LocalHTTPServer

    (tmp_path / "www").mkdir()
    with LocalHTTPServer(tmp_path / "www") as server:
        raw = {
            **CONFIG,
            "name": "gone",
            "inputs": {"urls": [server.url("/missing1.mp4"), server.url("/missing2.mp4")]},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
        }
        path = _write_config(tmp_path / "gone.yaml", raw)
        result = CliRunner().invoke(main, ["run", str(path), "--no-progress", "--timeout", "120"])
    assert result.exit_code == 1, result.output
    assert "project gone: failed (none of its 2 videos could be used" in result.output
    assert world.catalog.projects.get("gone").stage == "failed"


def test_run_past_its_timeout_stops_with_a_message_and_exit_code(world, tmp_path):
    """It ended in a traceback: "TimeoutError: projects not finished after 40 s"."""
    path = _write_config(tmp_path / "street.yaml", CONFIG)
    result = CliRunner().invoke(main, ["run", str(path), "--no-progress", "--timeout", "0"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.splitlines()[-2:] == [
        "project street: active",
        "stopped: not finished after 0 s: project street is active; run the command again to go "
        "on from there",
    ]


def test_run_ends_with_a_message_when_its_project_is_deleted_meanwhile(
    world, tmp_path, monkeypatch
):
    """`dataminer run` died with "ValueError: unknown projects: ['del']". Its catalog cannot read
    its URL file (not written yet: a problem that may pass) and fails with back-off of at least
    30 s: the project is deleted in that wait, as a user would, while the command runs in a
    process of its own."""
    import subprocess
    import sys
    import time

    monkeypatch.setenv("DATAMINER_RETRY_BASE_SECONDS", "60")
    monkeypatch.setenv("DATAMINER_RETRY_MAX_SECONDS", "120")
    raw = {**CONFIG, "name": "del", "inputs": {"url_file": str(tmp_path / "not-yet.txt")}}
    path = _write_config(tmp_path / "del.yaml", raw)
    command = [str(Path(sys.executable).parent / "dataminer"), "run", str(path), "--no-progress"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        give_up = time.monotonic() + 300  # a bound on a broken run, not a timing assertion
        while world.status(CATALOG, "del") != "failed":
            assert run.poll() is None, run.stdout.read()
            assert time.monotonic() < give_up, "the catalog never failed"
            time.sleep(0.2)
        invoke("project", "delete", "del", "--yes")
        output, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, output
    assert "Traceback" not in output, output
    assert (
        output.splitlines()[-1]
        == "stopped: project del was deleted while this command worked on it"
    )


def _write_audio(path: Path) -> Path:
    """A real audio-only file (AAC in MP4, as phones record voice memos)."""
    import av
    import numpy as np

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return path


def _write_portrait(path: Path) -> Path:
    """A phone's portrait video: 96x64 pictures with a display matrix that turns them upright."""
    import av

    from dataminer_dagster.core.synthetic import synthetic_frames

    spec = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, seed=7)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.set_display_rotation(-90)
        for picture in synthetic_frames(spec):
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_run_uses_the_good_files_of_a_glob_and_the_bad_ones_cost_only_themselves(
    world, tmp_path, tiny_siglip
):
    """A symbolic link loop or a file name that is not UTF-8 failed the catalog, and with it
    the project; a 1x1 video was scored and reached the dataset; a phone's portrait video was
    stored sideways."""
    clips = tmp_path / "clips"
    spec = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,))
    write_opencv_video(clips / "good.mp4", spec)
    _write_portrait(clips / "portrait.mp4")
    write_opencv_video(clips / "dot.avi", SyntheticVideoSpec(width=1, height=1, seconds=2.0))
    with open(os.fsencode(clips) + b"/caf\xe9.mp4", "wb") as latin1:
        latin1.write((clips / "good.mp4").read_bytes())
    (clips / "loop.mp4").symlink_to("loop.mp4")
    os.mkfifo(clips / "pipe.mp4")
    (clips / "dir.mp4").mkdir()
    (clips / "zero.mp4").symlink_to("/dev/zero")
    _write_audio(clips / "audioonly.m4a")
    raw = {
        "name": "odd",
        "output_dir": str(tmp_path / "out"),
        "inputs": {"files": [str(clips / "*")]},
        "extract": {"strategy": "time", "every_seconds": 0.5},
        "filter": keep_every_frame(tiny_siglip),
        "dedup": {"threshold": 0.999},
    }
    path = _write_config(tmp_path / "odd.yaml", raw)

    out = invoke("populate", str(path), "--dry-run").output
    for name, what in [
        ("caf\\xe9.mp4", "its name is not valid UTF-8"),
        ("loop.mp4", "a symbolic link loop"),
        ("pipe.mp4", "a named pipe (FIFO)"),
        ("dir.mp4", "a directory"),
        ("zero.mp4", "a character device (a symbolic link to /dev/zero)"),
    ]:
        assert f"skipped {clips}/{name}: {what}" in out, out
    assert "skipped 1 file not named as a video (audioonly.m4a)" in out, out
    assert "3 videos would be added to odd" in out, out

    result = CliRunner().invoke(main, ["run", str(path), "--no-progress", "--timeout", "300"])
    assert result.exit_code == 0, result.output
    assert "project odd: complete" in result.output

    dot = video_id_for_file(clips / "dot.avi")
    with world.engine.connect() as c:
        status, error = c.execute(
            sa.text(
                "SELECT status, last_error FROM dataminer.work_items "
                "WHERE stage = :s AND item_key = :k"
            ),
            {"s": FRAMES, "k": dot},
        ).one()
    assert status == DEAD
    assert "its frames are 1x1, smaller than 32 pixels a side" in error
    manifest = pd.read_parquet(tmp_path / "out" / "dataset" / "manifest.parquet")
    names = manifest["sources"].map(lambda sources: Path(sources[0]).name)
    assert set(names) == {"good.mp4", "portrait.mp4"}
    sizes = manifest.groupby(names)[["width", "height", "rotation"]].agg(set)
    assert sizes.loc["portrait.mp4"].tolist() == [{64}, {96}, {90}], "stored upright"
    assert sizes.loc["good.mp4"].tolist() == [{96}, {64}, {0}]
