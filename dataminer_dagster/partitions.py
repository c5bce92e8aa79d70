"""The three dynamic partition sets. Keys are added by the discovery sensor (or by `dataminer run`)
from the claim tables, which stay the source of truth for work state, and removed by it when their
row is deleted."""

import dagster as dg

videos_partitions = dg.DynamicPartitionsDefinition(name="videos")  # key: video id
projects_partitions = dg.DynamicPartitionsDefinition(name="projects")  # key: project name
project_videos_partitions = dg.DynamicPartitionsDefinition(
    name="project_videos"
)  # key: <project>.<video id>
