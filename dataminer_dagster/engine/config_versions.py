"""A project's config as Dagster's data versions, so that the UI shows which partitions a config
change made stale.

Each project-level stage that depends on config sections (the catalog, dedup, detect, the
dataset) has an external asset `<its asset>_config`, partitioned by project, upstream of its own
asset. Its data version for a project is that stage's fingerprint of the project's config
(ProjectConfig.fingerprints, which includes the fingerprints of the stages it reads). The planner
reports an observation of it whenever a fingerprint changes (`config_observations`), and a stage's
materialization records the fingerprint its work was done with as Dagster's provenance
(`provenance_tags`). A partition done under an earlier config then shows stale on its page in the
UI ("has a new dependency data version"); materializing it, or `dataminer run`, does the work
again. The filter, partitioned by project video, has none: one observation per project video at
each change would cost as much as the catalog is large; `dataminer status` shows its stale work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NULL_EVENT_POINTER,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

# What a materialization records as its code version: the stages' code is not versioned (a
# code change is not a config change), so every materialization records the same.
CODE_VERSION = "dataminer"


def config_observations(
    config_keys: Mapping[str, dg.AssetKey],
    fingerprints: Mapping[str, Mapping[str, str]],
    reported: Mapping[str, str],
) -> tuple[list[dg.AssetObservation], dict[str, str]]:
    """The observations of the config assets (`config_keys`: stage -> its config asset) for the
    projects whose `fingerprints` ({project: {stage: fingerprint}}) differ from what was
    `reported` ({project: digest}), and the new digests. A project reported again (a fresh
    cursor) gets observations of unchanged versions, which make nothing stale."""
    observations, digests = [], {}
    for project, stages in sorted(fingerprints.items()):
        versions = {stage: stages[stage] for stage in config_keys if stage in stages}
        text = ",".join(f"{stage}={fp}" for stage, fp in sorted(versions.items()))
        digests[project] = hashlib.sha256(text.encode()).hexdigest()[:12]  # the cursor stays small
        if reported.get(project) == digests[project]:
            continue
        observations += [
            _observation(config_keys[stage], project, fingerprint)
            for stage, fingerprint in versions.items()
        ]
    return observations, digests


def provenance_tags(
    instance: dg.DagsterInstance,
    config_key: dg.AssetKey,
    partition: str,
    fingerprint: str,
    current: str | None,
    other_parents: Iterable[dg.AssetKey],
) -> dict[str, str]:
    """Dagster's provenance tags for a materialization of `partition` done with the config of
    `fingerprint` (`current`: the project's fingerprint now): that version of the partition's
    config asset, pointing at its observation. Dagster calls the partition stale when an
    observation after the pointer has another version than the one at it. Every other parent is
    named too (a parent missing from the provenance would be "a new dependency", stale for
    ever), without a version: our stages' own materializations carry none, so only a config
    change makes a partition stale."""
    recent = _observations(instance, config_key, partition)
    match = next((r for r in recent if _version(r) == fingerprint), None)
    if match is None and current is not None and (not recent or _version(recent[0]) != current):
        # The planner has not observed the current version yet (a run claimed it first, or no
        # planner ran since the project was added): observe it now, so that the pointer means it.
        instance.report_runless_asset_event(_observation(config_key, partition, current))
        recent = _observations(instance, config_key, partition)
        match = next((r for r in recent if _version(r) == fingerprint), None)
    if match is not None:
        pointer = str(match.storage_id)
    elif recent:  # done with a version replaced before it was observed: before the latest
        pointer = str(recent[0].storage_id - 1)
    else:
        pointer = NULL_EVENT_POINTER
    tags = {
        CODE_VERSION_TAG: CODE_VERSION,
        get_input_data_version_tag(config_key): fingerprint,
        get_input_event_pointer_tag(config_key): pointer,
    }
    for parent in other_parents:
        tags[get_input_data_version_tag(parent)] = DEFAULT_DATA_VERSION.value
        tags[get_input_event_pointer_tag(parent)] = NULL_EVENT_POINTER
    return tags


def _observation(config_key: dg.AssetKey, project: str, fingerprint: str) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key=config_key,
        partition=project,
        tags={DATA_VERSION_TAG: fingerprint},
        metadata={"fingerprint": fingerprint},
    )


# How far back a materialization looks for the observation of the version it was done with: a
# project's config changes a few times a day at most.
_LOOK_BACK = 50


def _observations(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> list:
    """The partition's latest observations, newest first."""
    return instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=_LOOK_BACK
    ).records


def _version(record) -> str | None:
    return (record.event_log_entry.tags or {}).get(DATA_VERSION_TAG)
