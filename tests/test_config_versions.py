"""The provenance a project-level stage records (engine/config_versions.py), read by Dagster's own
stale-status resolver: a partition is stale exactly when the config it was done with is no longer
the project's, whichever of the planner's observation and the stage's claim comes first."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from dataminer_dagster.engine.config_versions import config_observations, provenance_tags
from dataminer_dagster.engine.discovery import DiscoveryCursor
from dataminer_dagster.testing import instance_for_test

PROJECTS = dg.DynamicPartitionsDefinition(name="projects")
CONFIG = dg.AssetSpec("stage_config", partitions_def=PROJECTS)


@dg.asset(partitions_def=PROJECTS, deps=[CONFIG])
def stage() -> None: ...


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("projects", ["p"])
        # Dagster reads a pointer of 0 as none: the event log's first id is taken by another
        # event, as in any instance that has run anything.
        instance.report_runless_asset_event(dg.AssetObservation("unrelated"))
        yield instance


def observe(instance, fingerprint: str) -> None:
    [observation], _ = config_observations({"s": CONFIG.key}, {"p": {"s": fingerprint}}, {})
    instance.report_runless_asset_event(observation)


def materialize(instance, fingerprint: str, current: str) -> None:
    tags = provenance_tags(instance, CONFIG.key, "p", fingerprint, current, [])
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key="stage", partition="p", tags=tags)
    )


def status(instance) -> str:
    graph = dg.Definitions(assets=[stage, CONFIG]).get_repository_def().asset_graph
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    return resolver.get_status(stage.key, "p").value


def test_work_done_with_the_observed_config_is_fresh_until_it_changes(instance):
    observe(instance, "A")
    materialize(instance, "A", current="A")
    assert status(instance) == "FRESH"
    observe(instance, "A")  # observed again (a fresh cursor): still the same version
    assert status(instance) == "FRESH"
    observe(instance, "B")
    assert status(instance) == "STALE"
    materialize(instance, "B", current="B")
    assert status(instance) == "FRESH"


def test_work_that_claimed_a_config_before_the_planner_observed_it_is_fresh(instance):
    observe(instance, "A")
    materialize(instance, "B", current="B")  # the claim read B; the planner has not seen it
    assert status(instance) == "FRESH"
    observe(instance, "B")  # the planner's tick, afterwards
    assert status(instance) == "FRESH"
    observe(instance, "C")
    assert status(instance) == "STALE"


def test_work_done_before_any_observation_follows_later_changes(instance):
    materialize(instance, "A", current="A")
    assert status(instance) == "FRESH"
    observe(instance, "B")
    assert status(instance) == "STALE"


def test_work_done_with_a_config_replaced_before_it_was_observed_is_stale(instance):
    materialize(instance, "A", current="B")
    assert status(instance) == "STALE"


def test_a_cursor_written_by_another_version_parses():
    old = '{"project": 3, "video": 5, "project_video": 7, "compared_at": 1.0, "full_compared_at": 0.0}'
    assert DiscoveryCursor.parse(old).configs == {}
    assert DiscoveryCursor.parse(old).project_video == 7
    newer = '{"project": 3, "configs": {"p": "abc"}, "written_by_a_later_release": 1}'
    assert DiscoveryCursor.parse(newer).configs == {"p": "abc"}
