"""The three dynamic partition sets, by the name a StageSpec's `keys` gives (registry.py). Keys are
added by the discovery sensor (or by `dataminer run`) from the claim tables, which stay the source
of truth for work state, and removed by it when their row is deleted."""

import dagster as dg

from dataminer_dagster.registry import PROJECT_VIDEOS, PROJECTS, VIDEOS

videos_partitions = dg.DynamicPartitionsDefinition(name=VIDEOS)  # key: video id
projects_partitions = dg.DynamicPartitionsDefinition(name=PROJECTS)  # key: project name
project_videos_partitions = dg.DynamicPartitionsDefinition(
    name=PROJECT_VIDEOS
)  # key: <project>.<video id>
PARTITIONS = {
    d.name: d for d in (videos_partitions, projects_partitions, project_videos_partitions)
}
