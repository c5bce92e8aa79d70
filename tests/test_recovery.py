"""Crash recovery with real processes: runs SIGKILLed mid-stage, two runs racing for one partition,
PostgreSQL restarted mid-project, and an item that kills its process every time.

The project has three tiny local videos and a tiny SigLIP model. It is driven with `driver.drive`
(the sensors' decisions, as `dataminer run` takes them); to crash a stage, driving stops when the
stage's items are ready, the stage's job runs in a separate process that a hook in the claim-store
resource kills (tests/helpers/processes.py), the lease reaper takes the dead run's leases back, and
driving goes on. Heartbeats are 0.5 s and leases go stale after 3 s, so dead runs' items come back
quickly. Set DATAMINER_TEST_SEED to replay the random kill points of the first test.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import video_id_for_file
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import CLAIMABLE, DEAD, DONE, FAILED, PENDING
from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
from dataminer_dagster.engine.planning import RunLimits
from dataminer_dagster.hosting.driver import DriveResult, drive
from dataminer_dagster.lanes import DEFAULT_LANES
from dataminer_dagster.paths import FRAMES_MANIFEST, DataPaths, ProjectPaths
from dataminer_dagster.registry import CATALOG, DEDUP, DOWNLOAD, FILTER, FRAMES
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.settings import LeasePolicy, RunPolicy, load_settings
from dataminer_dagster.testing import keep_every_frame
from tests.helpers.pipeline import (
    CannedSearchClient,
    materialize_partitions,
    one_stage_lanes,
    pipeline_definitions,
    work_items,
)
from tests.helpers.processes import (
    PHASES,
    Finished,
    Hook,
    HookedDatabase,
    StageRun,
    dump_hooks,
    finish,
    private_postgres,
    start_stage_run,
)
from tests.helpers.stages import STAGES

pytestmark = pytest.mark.slow

HEARTBEAT_S = 0.5
STALE_S = 3.0
SPEC = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,))


@pytest.fixture(autouse=True)
def _short_leases(monkeypatch):
    monkeypatch.setenv("DATAMINER_HEARTBEAT_SECONDS", str(HEARTBEAT_S))
    monkeypatch.setenv("DATAMINER_LEASE_STALE_SECONDS", str(STALE_S))


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("videos")
    return [write_opencv_video(root / f"clip{i}.mp4", replace(SPEC, seed=i)) for i in range(3)]


class StopDriving(Exception):
    pass


class Pipeline:
    """One project of local videos on one claim database, with its own data and instance dirs."""

    def __init__(self, root: Path, database_url: str, files: Sequence[Path], siglip: Path):
        self.root = root
        self.instance_dir = root / "instance"
        self.instance_dir.mkdir(parents=True)
        self.database_url = database_url
        self.engine = get_engine(database_url)
        self.store = LeaseStore(self.engine, load_settings().retry)
        self.data_dir = root / "data"
        self.catalog = Catalog(self.engine, self.store, DataPaths(self.data_dir))
        self.config = parse_project_config(
            {
                "name": "crashy",
                "output_dir": str(root / "out"),
                "inputs": {"files": [str(f) for f in files]},
                "extract": {"strategy": "time", "every_seconds": 0.5},
                "filter": keep_every_frame(siglip),
                "dedup": {"threshold": 0.999},
            }
        )
        self.catalog.projects.register(self.config)
        self.video_ids = [video_id_for_file(f) for f in files]
        self._spawned = 0

    @property
    def name(self) -> str:
        return self.config.name

    def instance(self):
        return dg.instance_for_test(temp_dir=str(self.instance_dir))

    def resources(self, hooks: Sequence[Hook] = ()) -> dict:
        db = HookedDatabase(
            database_url=self.database_url,
            data_dir=str(self.data_dir),
            heartbeat_seconds=HEARTBEAT_S,
            hooks=dump_hooks(hooks),
        )
        return {"db": db, "download_client": CannedSearchClient(), "models": ModelsResource()}

    def items(self, stage: str) -> dict[str, sa.Row]:
        return work_items(self.engine, stage)

    def claimable(self, stage: str) -> list[str]:
        return [k for k, r in self.items(stage).items() if r.status in CLAIMABLE]

    def discover(self, instance: dg.DagsterInstance) -> None:
        for name, keys in plan_discovery(self.engine, DiscoveryCursor()).additions.items():
            instance.add_dynamic_partitions(name, keys)

    def materialize(
        self, instance: dg.DagsterInstance, stage: str, *, redo: bool = False
    ) -> dg.ExecuteInProcessResult:
        """A run of every item of `stage` in this process, as a person would start it."""
        self.discover(instance)
        asset = STAGES[stage]
        result = materialize_partitions(
            [asset],
            list(self.items(stage)),
            instance=instance,
            resources=self.resources(),
            partitions=asset.partitions_def,
            raise_on_error=False,
            redo=redo,
        )
        assert result.success
        return result

    def spawn(
        self,
        instance: dg.DagsterInstance,
        stage: str,
        hooks: Sequence[Hook],
        keys: Sequence[str] | None = None,
    ) -> tuple[StageRun, subprocess.Popen]:
        """Start the stage's job in another process for its claimable items (as the work sensor
        would ask for them), once their retry back-off is over."""
        self.discover(instance)
        keys = list(keys or self.claimable(stage))
        self.wait_for_back_off(stage, keys)
        self._spawned += 1
        spec = StageRun(
            stage=stage,
            keys=keys,
            database_url=self.database_url,
            data_dir=str(self.data_dir),
            instance_dir=str(self.instance_dir),
            result_path=str(self.root / f"run-{self._spawned}.json"),
            hooks=dump_hooks(hooks),
            heartbeat_s=HEARTBEAT_S,
        )
        return spec, start_stage_run(spec)

    def wait_for_back_off(self, stage: str, keys: Sequence[str]) -> None:
        with self.engine.connect() as c:
            seconds = c.execute(
                sa.text("""SELECT extract(epoch FROM max(next_attempt_at) - now())
                             FROM dataminer.work_items
                            WHERE stage = :s AND item_key = ANY(CAST(:k AS text[]))"""),
                {"s": stage, "k": list(keys)},
            ).scalar()
        if seconds is not None and seconds > 0:
            time.sleep(float(seconds) + 0.05)

    def run_elsewhere(
        self,
        instance: dg.DagsterInstance,
        stage: str,
        hooks: Sequence[Hook] = (),
        keys: Sequence[str] | None = None,
    ) -> Finished:
        spec, process = self.spawn(instance, stage, hooks, keys)
        return finish(process, spec)

    def crash(self, instance: dg.DagsterInstance, hook: Hook) -> dict:
        """Run `hook.stage` in another process that the hook kills; wait until the lease reaper
        takes the dead run's leases back. Returns what the run held when it died."""
        marker = self.root / f"killed-{hook.stage}-{self._spawned + 1}.json"
        finished = self.run_elsewhere(instance, hook.stage, [replace(hook, path=str(marker))])
        assert finished.killed, f"the run was not killed at {hook}:\n{finished.output}"
        killed = json.loads(marker.read_text())
        reap_killed_run(self.store, killed)
        return killed

    def drive(
        self, instance: dg.DagsterInstance, hooks: Sequence[Hook] = (), **options
    ) -> DriveResult:
        defs = pipeline_definitions(self.resources(hooks), options.get("lanes", DEFAULT_LANES))
        return drive(
            [self.name],
            instance=instance,
            defs=defs,
            store=self.store,
            limits=RunLimits(
                LeasePolicy(heartbeat_s=HEARTBEAT_S, stale_after_s=STALE_S), RunPolicy()
            ),
            log=lambda message: None,
            idle_poll_s=0.2,
            timeout_s=300,
            **options,
        )


def reap_killed_run(store: LeaseStore, killed: dict) -> None:
    """The lease reaper's job, polled until every lease the killed run held has come back."""
    held = {tuple(h) for h in killed["held"]}
    assert (killed["stage"], killed["key"]) in held
    reaped: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 60
    # An item of a stage that works on several at once may complete in another thread between
    # the hook's record and the kill: it is done, not held, and has nothing to reap.
    while not (still := _not_done(store, held)) <= reaped:
        assert time.monotonic() < deadline, f"leases of {killed} not reaped: {still - reaped}"
        time.sleep(0.2)
        reaped |= {
            (r.stage, r.key) for r in store.liveness.reap(STALE_S) if r.owner == killed["run_id"]
        }
    assert reaped <= held, "the reaper takes back only the dead run's leases"
    assert (killed["stage"], killed["key"]) in reaped


def _not_done(store: LeaseStore, items: set) -> set[tuple[str, str]]:
    """The items among `items` that are not done: still held by the dead run, or reaped."""
    with store.engine.connect() as c:
        rows = c.execute(
            sa.text("""SELECT stage, item_key, status FROM dataminer.work_items
                        WHERE (stage, item_key) IN (SELECT * FROM unnest(CAST(:s AS text[]),
                                                                           CAST(:k AS text[])))"""),
            {"s": [i[0] for i in items], "k": [i[1] for i in items]},
        ).all()
    return {(r.stage, r.item_key) for r in rows if r.status != "done"}


def assert_lease_expired(rows: dict[str, sa.Row], keys: Sequence[str], run_id: str, attempts: int):
    """The dead run's items came back with the reaper's reason and the given attempt count."""
    for key in keys:
        row = rows[key]
        expected = (FAILED, DEAD) if attempts else (PENDING,)
        assert row.status in expected and row.lease_owner is None, row
        assert row.attempts == attempts, row
        assert row.last_error.startswith(f"lease expired: run {run_id}"), row.last_error


def assert_killed_run_accounted(rows: dict[str, sa.Row], killed: dict) -> list[str]:
    """Each item the run had begun counts an attempt: the one it died on, when it died past
    "claimed", and any other that a stage working on several at once (downloads) had begun. The
    items it held but never began come back uncounted. Returns the items it finished itself
    before it died (begun beside the one it died on)."""
    held = [key for _, key in killed["held"]]
    begun = [key for _, key in killed["begun"]]
    assert (killed["key"] in begun) == (killed["phase"] != "claimed"), killed
    # Another item begun beside the one it died on (downloads run several at once) may have
    # finished before the kill: done, by this run, and not lost.
    finished = [k for k in begun if k != killed["key"] and rows[k].status == DONE]
    assert all(rows[k].lease_owner is None for k in finished), [rows[k] for k in finished]
    begun = [k for k in begun if k not in finished]
    assert_lease_expired(rows, begun, killed["run_id"], attempts=1)
    unbegun = [k for k in held if k not in begun and k not in finished]
    assert_lease_expired(rows, unbegun, killed["run_id"], attempts=0)
    return finished


# --- 1. SIGKILL in each stage ----------------------------------------------------------------------


CHAIN = ((CATALOG, DOWNLOAD), (DOWNLOAD, FRAMES), (FRAMES, FILTER), (FILTER, DEDUP))


def run_stage_by_stage(p: Pipeline, kills: dict[str, Hook]) -> dict[str, dict]:
    """Drive the project (driver.drive) and stop each time a stage's items are all ready; a stage
    with a kill hook then runs in a process that dies, and driving goes on from there.
    Returns what each dead run held."""
    killed: dict[str, dict] = {}
    with p.instance() as instance:
        for previous, stage in CHAIN:

            def ready(previous=previous, stage=stage) -> None:
                expected = 1 if stage == DEDUP else len(p.video_ids)
                done = all(r.status == DONE for r in p.items(previous).values())
                if done and len(p.items(stage)) == expected:
                    raise StopDriving

            with pytest.raises(StopDriving):
                p.drive(instance, on_tick=ready, lanes=one_stage_lanes())
            statuses = {k: r.status for k, r in p.items(stage).items()}
            assert set(statuses.values()) <= set(CLAIMABLE), statuses
            if stage in kills:
                killed[stage] = p.crash(instance, kills[stage])
                held = [key for _, key in killed[stage]["held"]]
                killed[stage]["finished"] = assert_killed_run_accounted(
                    p.items(stage), killed[stage]
                )
                # Retries due before driving on, so that they run before the next stage starts.
                p.wait_for_back_off(stage, held)
        outcome = p.drive(instance)
    assert outcome.stages == {p.name: "complete"}
    assert outcome.failed_runs == 0
    return killed


def project_outputs(p: Pipeline) -> dict:
    """Everything the project produced, in comparable form; checks there is nothing extra on disk."""
    frames = {}
    for video_id, profiles in sorted(p.catalog.frames.profiles(p.video_ids).items()):
        [(directory, count)] = profiles.values()
        manifest = pd.read_parquet(directory / FRAMES_MANIFEST)
        assert count == len(manifest) == manifest["file_name"].nunique()
        on_disk = sorted(f.name for f in directory.iterdir())
        assert on_disk == sorted([*manifest["file_name"], FRAMES_MANIFEST]), "no frame extra"
        leftovers = [f.name for f in directory.parent.iterdir() if f.name.startswith(".")]
        assert not leftovers, f"staging left behind next to {directory}: {leftovers}"
        frames[video_id] = manifest[["frame_index", "timestamp", "file_name", "content_hash"]]
    paths = ProjectPaths(p.root / "out")
    filtered = {
        v: pd.read_parquet(paths.filter_table(v))[["frame_index", "passed", "pos_max"]]
        for v in p.video_ids
    }
    dedup = pd.read_parquet(paths.dedup_table)[["frame_id", "group", "kept"]]
    dataset = pd.read_parquet(paths.dataset_dir / "manifest.parquet")
    images = sorted(f.name for f in (paths.dataset_dir / "images").iterdir())
    assert images == sorted(dataset["file_name"]) and dataset["file_name"].is_unique
    return {"frames": frames, "filter": filtered, "dedup": dedup, "dataset": dataset}


def assert_same_outputs(got: dict, expected: dict) -> None:
    assert sorted(got["frames"]) == sorted(expected["frames"])
    for video_id, manifest in expected["frames"].items():
        pd.testing.assert_frame_equal(got["frames"][video_id], manifest)
    for video_id, table in expected["filter"].items():
        # A retry scoring what its killed attempt cached gives the very same scores.
        pd.testing.assert_frame_equal(got["filter"][video_id], table, check_exact=True)
    pd.testing.assert_frame_equal(got["dedup"], expected["dedup"])
    columns = ["file_name", "video_id", "frame_index", "timestamp", "group", "group_size"]
    pd.testing.assert_frame_equal(got["dataset"][columns], expected["dataset"][columns])


def test_runs_killed_in_every_stage_resume_to_the_same_dataset_as_a_clean_run(
    pg_server, database_url, tmp_path, videos, tiny_siglip
):
    seed = int(os.environ.get("DATAMINER_TEST_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    kills = {
        stage: Hook(stage, rng.choice(PHASES), "kill", index=rng.randrange(n))
        for stage, n in ((DOWNLOAD, 3), (FRAMES, 3), (FILTER, 3), (DEDUP, 1))
    }
    print(f"DATAMINER_TEST_SEED={seed}: {kills}")

    clean_db = pg_server.new_database()
    try:
        clean = Pipeline(tmp_path / "clean", pg_server.url(clean_db), videos, tiny_siglip)
        run_stage_by_stage(clean, {})
        expected = project_outputs(clean)
    finally:
        pg_server.drop(clean_db)

    crashed = Pipeline(tmp_path / "crashed", database_url, videos, tiny_siglip)
    killed = run_stage_by_stage(crashed, kills)

    assert_same_outputs(project_outputs(crashed), expected)
    assert len(expected["dataset"]) == 12, "every frame passes and none is a duplicate"
    for stage, record in killed.items():
        rows = crashed.items(stage)
        # An item the run finished before it died (downloads work on several at once) took
        # one attempt; one it had begun and lost took two.
        lost = {key for _, key in record["begun"]} - set(record["finished"])
        for _, key in record["held"]:
            assert rows[key].status == DONE
            least = 2 if key in lost else 1
            assert rows[key].attempts >= least, f"seed {seed}: {stage} {key} ({record['phase']})"


# --- 2. two runs of one partition ------------------------------------------------------------------


def test_two_runs_of_one_partition_one_does_the_work_the_other_leaves_cleanly(
    database_url, tmp_path, videos, tiny_siglip
):
    p = Pipeline(tmp_path, database_url, videos[:1], tiny_siglip)
    [video_id] = p.video_ids
    gate = tmp_path / "go"
    with p.instance() as instance:
        p.materialize(instance, CATALOG)
        p.materialize(instance, DOWNLOAD)
        # The first run claims the frames item and holds it until the second has run.
        spec, first = p.spawn(
            instance, FRAMES, [Hook(FRAMES, "claimed", "wait", 0, path=str(gate))]
        )
        try:
            waiting = gate.with_name("go.waiting")
            deadline = time.monotonic() + 120
            while not waiting.exists():
                assert first.poll() is None, first.communicate()[0]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            holder = waiting.read_text()
            second = p.materialize(instance, FRAMES)
        finally:
            gate.touch()  # never leave the first run waiting
            done = finish(first, spec)
        messages = [e.user_message for e in instance.all_logs(second.run_id)]

    assert done.returncode == 0, done.output
    assert done.result == {"run_id": holder, "success": True, "materialized": [video_id]}
    assert second.success and not second.get_asset_materialization_events()
    expected = (
        f"frames {video_id}: already being processed by run {holder}; this run leaves it alone"
    )
    assert expected in messages
    row = p.items(FRAMES)[video_id]
    assert (row.status, row.attempts) == (DONE, 1)
    [(directory, count)] = p.catalog.frames.profiles([video_id])[video_id].values()
    assert count == 4 and len(list(directory.glob("*.jpg"))) == 4
    assert [f.name for f in directory.parent.iterdir()] == [directory.name]


# --- 3. PostgreSQL restarts ------------------------------------------------------------------------


@pytest.fixture
def restartable_postgres():
    with private_postgres() as server:
        server.migrated_database()
        yield server
        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()


def test_project_completes_across_postgres_restarts(
    restartable_postgres, tmp_path, videos, tiny_siglip, caplog
):
    server = restartable_postgres
    p = Pipeline(tmp_path, server.url("dataminer"), videos, tiny_siglip)
    restart = {"action": "restart_postgres", "pgdata": server.pgdata, "once": True}
    hooks = [
        # While a frames run holds its leases and its heartbeat thread beats: down for 4 beats.
        Hook(FRAMES, "claimed", key=p.video_ids[1], down_s=4 * HEARTBEAT_S, **restart),
        # Inside the transaction that completes a filter item: its commit is lost.
        Hook(FILTER, "publishing", key=f"{p.name}.{p.video_ids[0]}", **restart),
    ]

    def stop_once_filtered() -> None:
        filtered = p.items(FILTER)
        if len(filtered) == 3 and all(r.status == DONE for r in filtered.values()):
            raise StopDriving

    caplog.set_level(logging.WARNING, logger="dataminer_dagster.db.outages")
    with p.instance() as instance:
        with pytest.raises(StopDriving):
            p.drive(instance, hooks, on_tick=stop_once_filtered)
        server.restart()  # between two runs of `dataminer run`
        outcome = p.drive(instance)

    assert outcome.stages == {p.name: "complete"}
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("database unreachable since") for m in said), "it waited, and said so"
    frames = p.items(FRAMES)
    assert all(r.status == DONE for r in frames.values())
    assert frames[p.video_ids[1]].attempts == 1, "the restart did not cost the frames item a try"
    filtered = p.items(FILTER)
    assert all(r.status == DONE for r in filtered.values())
    lost_commit = filtered[f"{p.name}.{p.video_ids[0]}"]
    assert lost_commit.attempts == 1, "its lost commit was done again, the restart uncounted"
    dataset = pd.read_parquet(ProjectPaths(p.root / "out").dataset_dir / "manifest.parquet")
    assert len(dataset) == 12 and dataset["file_name"].is_unique


# --- 4. an item that kills its process every time ----------------------------------------------------


@pytest.mark.parametrize(
    "poison_first",
    [False, True],
    ids=["poison-last-in-batch", "poison-first-in-batch"],
)
def test_an_item_that_kills_its_process_every_time_ends_dead_and_the_rest_completes(
    poison_first, monkeypatch, database_url, tmp_path, videos, tiny_siglip
):
    max_attempts = 3
    monkeypatch.setenv("DATAMINER_MAX_ATTEMPTS", str(max_attempts))
    files = [videos[2], videos[0], videos[1]] if poison_first else videos
    p = Pipeline(tmp_path, database_url, files, tiny_siglip)
    poison = video_id_for_file(videos[2])
    good = [v for v in p.video_ids if v != poison]
    hook = Hook(FRAMES, "processed", "kill", key=poison)  # it dies while being worked on

    with p.instance() as instance:
        p.materialize(instance, CATALOG)
        p.materialize(instance, DOWNLOAD)
        kills = 0
        while poison in p.claimable(FRAMES) and kills <= max_attempts:
            killed = p.crash(instance, hook)
            kills += 1
            assert killed["key"] == poison
            assert_lease_expired(p.items(FRAMES), [poison], killed["run_id"], attempts=kills)

        frames = p.items(FRAMES)
        assert kills == max_attempts, "tried exactly max_attempts times, then left alone"
        assert frames[poison].status == DEAD
        assert frames[poison].last_error.startswith("lease expired")
        unfinished = sorted(v for v in good if frames[v].status != DONE)
        assert all(frames[v].attempts == 0 for v in unfinished), "bystanders are never charged"

        # A run over every partition leaves the dead item alone and does the others.
        again = p.run_elsewhere(instance, FRAMES, [hook], keys=sorted(frames))
        assert again.returncode == 0, again.output
        assert sorted(again.result["materialized"]) == unfinished
        frames = p.items(FRAMES)
        assert all(frames[v].status == DONE for v in good), {k: r.status for k, r in frames.items()}
        assert frames[poison].status == DEAD

        outcome = p.drive(instance)

    assert outcome.stages == {p.name: "complete"}
    filtered = p.items(FILTER)
    assert sorted(filtered) == sorted(f"{p.name}.{v}" for v in good)
    assert all(r.status == DONE for r in filtered.values())
    dataset = pd.read_parquet(ProjectPaths(p.root / "out").dataset_dir / "manifest.parquet")
    assert set(dataset["video_id"]) == set(good) and len(dataset) == 8


# --- staging files of killed runs ------------------------------------------------------------------


def test_a_killed_runs_staging_files_are_removed_by_the_next_attempt(
    database_url, tmp_path, videos, tiny_siglip
):
    p = Pipeline(tmp_path, database_url, videos[:1], tiny_siglip)
    with p.instance() as instance:
        for stage in (CATALOG, DOWNLOAD, FRAMES):
            p.materialize(instance, stage)
        p.crash(instance, Hook(FILTER, "processed", "kill", index=0))
        p.materialize(instance, FILTER)
    assert {r.status for r in p.items(FILTER).values()} == {DONE}
    filter_dir = ProjectPaths(p.root / "out").filter_table(p.video_ids[0]).parent
    assert sorted(f.name for f in filter_dir.iterdir()) == [f"{p.video_ids[0]}.parquet"]


def test_filter_scores_do_not_depend_on_the_embedding_cache(
    database_url, tmp_path, videos, tiny_siglip
):
    p = Pipeline(tmp_path, database_url, videos[:1], tiny_siglip)
    table = ProjectPaths(p.root / "out").filter_table(p.video_ids[0])
    with p.instance() as instance:
        for stage in (CATALOG, DOWNLOAD, FRAMES, FILTER):
            p.materialize(instance, stage)
        fresh = pd.read_parquet(table)
        p.materialize(instance, FILTER, redo=True)  # what a retry sees: the cached embeddings
        cached = pd.read_parquet(table)
    pd.testing.assert_series_equal(cached["pos_max"], fresh["pos_max"])


def test_a_filter_whose_frames_are_gone_fails_and_queues_their_extraction_in_one_step(
    database_url, tmp_path, videos, tiny_siglip
):
    p = Pipeline(tmp_path, database_url, videos[:1], tiny_siglip)
    video = p.video_ids[0]
    with p.instance() as instance:
        for stage in (CATALOG, DOWNLOAD, FRAMES):
            p.materialize(instance, stage)
        [(frames_dir, _)] = p.catalog.frames.profiles([video])[video].values()
        shutil.rmtree(frames_dir)
        result = materialize_partitions(
            [STAGES[FILTER]],
            [f"{p.name}.{video}"],
            instance=instance,
            resources=p.resources(),
            partitions=STAGES[FILTER].partitions_def,
            raise_on_error=False,
        )
    assert not result.success  # a run of one partition fails with its item's reason
    item = p.items(FILTER)[f"{p.name}.{video}"]
    assert item.status == "failed" and item.attempts == 1
    assert "are missing; their extraction is queued again" in item.last_error
    assert p.items(FRAMES)[video].status == "pending"
