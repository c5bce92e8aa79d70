"""The catalog's row counts, kept as deltas by triggers (migration 0012): the work sensor compares
them with Dagster's partition counts on a quiet tick without reading every row (issue 25)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dataminer_dagster.db import delta_counts
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.partition_rows import PARTITION_SETS, row_count
from dataminer_dagster.paths import DataPaths
from tests.helpers.catalog_seed import add_project, catalog_keys, seed_videos

S = "dataminer"


def counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {name: row_count(c, name) for name in PARTITION_SETS}


def true_counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {name: len(catalog_keys(c, name)) for name in PARTITION_SETS}


@pytest.fixture
def catalog(engine, tmp_path) -> Catalog:
    return Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))


def test_counts_follow_inserts_and_deletes_cascades_included(engine, catalog):
    birds = add_project(catalog, "birds")
    seed_videos(engine, birds, 300, "b")
    cats = add_project(catalog, "cats")
    seed_videos(engine, cats, 20, "c")
    assert (
        counts(engine)
        == true_counts(engine)
        == {
            "projects": 2,
            "videos": 320,
            "project_videos": 320,
        }
    )
    with engine.begin() as c:
        c.execute(sa.text(f"DELETE FROM {S}.videos WHERE video_id LIKE 'b1%'"))  # cascades
        c.execute(sa.text(f"DELETE FROM {S}.projects WHERE name = 'cats'"))  # cascades
    assert counts(engine) == true_counts(engine)
    assert counts(engine)["projects"] == 1


def test_a_rolled_back_insert_counts_nothing_and_a_late_commit_counts_once(engine, catalog):
    birds = add_project(catalog, "birds")
    with engine.connect() as writer:
        with writer.begin() as transaction:
            writer.execute(sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('x', 'u')"))
            transaction.rollback()
        writer.begin()
        writer.execute(sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('y', 'u')"))
        assert counts(engine)["videos"] == 0  # not committed yet
        writer.commit()
    assert counts(engine)["videos"] == 1
    seed_videos(engine, birds, 5, "b")
    assert counts(engine) == true_counts(engine)


def test_many_deltas_are_folded_into_one_and_a_delta_committed_meanwhile_stays(
    engine, catalog, monkeypatch
):
    monkeypatch.setattr(delta_counts, "FOLD_COUNTS_PAST", 3)
    for n in range(6):  # six statements, six deltas
        with engine.begin() as c:
            c.execute(sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('v{n}', 'u')"))
    with engine.connect() as writer:
        writer.begin()  # a delta not yet committed while the reader folds
        writer.execute(sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('late', 'u')"))
        assert counts(engine)["videos"] == 6  # read, then folded
        writer.commit()
    with engine.connect() as c:
        deltas = c.execute(
            sa.text(f"SELECT count(*) FROM {S}.row_counts WHERE table_name = 'videos'")
        ).scalar()
    assert deltas == 2  # the fold and the late one
    assert counts(engine)["videos"] == 7 == true_counts(engine)["videos"]
