"""Links into the Dagster UI: the page of one partition of an asset.

`dataminer status NAME` prints one under each failed or long-running item, so that a person
reaches that video's (or project's) partition by its key. At a million videos that is the way
there: an asset's Partitions tab lists every key of its set, megabytes of them (docs/architecture.md,
"The UI at a million videos"), while one partition's page costs what one partition does.
"""

from __future__ import annotations

from urllib.parse import quote


def partition_link(ui_url: str, asset_key: list[str], partition: str) -> str:
    """The UI's page of `partition` of the asset `asset_key` (its path, e.g. ["downloads"], or
    ["dataminer", "downloads"] under a prefix), with its Partitions view open on that key."""
    path = "/".join(quote(part, safe="") for part in asset_key)
    key = quote(partition, safe="")
    return f"{ui_url.rstrip('/')}/assets/{path}?view=partitions&partition={key}"
