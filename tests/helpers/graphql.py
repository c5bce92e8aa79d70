"""The webserver's GraphQL, as the UI calls it: launching backfills (the asset page's "Materialize"
over partitions, "Backfill failed and missing partitions"), reading a backfill's status and an
asset's partition statuses (the Partitions tab) and a partition's stale status (its page)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}
"""

BACKFILL = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status numPartitions error { message } }
    ... on PythonError { message }
  }
}
"""

PARTITION_STATUSES = """
query PartitionStatuses($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses {
          materializedPartitions failedPartitions unmaterializedPartitions materializingPartitions
        }
      }
    }
  }
}
"""

STALE = """
query Stale($key: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      staleStatusByPartition(partitions: $partitions)
      staleCausesByPartition(partitions: $partitions) { key { path } partitionKey reason }
    }
  }
}
"""

FINISHED = ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")


def call(base: str, query: str, variables: dict) -> dict:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:  # the webserver says why in the body
        raise AssertionError(f"{error}: {error.read().decode(errors='replace')[:4000]}") from None
    assert "errors" not in answer, answer["errors"]
    return answer["data"]


def launch_backfill(
    base: str, assets: Sequence[str], partitions: Sequence[str] | None = None
) -> str:
    """A backfill of `assets` over `partitions` (all when None), as the UI launches it."""
    params: dict = {"assetSelection": [{"path": [a]} for a in assets]}
    if partitions is None:
        params["allPartitions"] = True
    else:
        params["partitionNames"] = list(partitions)
    result = call(base, LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


def wait_for_backfill(base: str, backfill_id: str, timeout_s: float) -> dict:
    """The backfill once it has finished (its status, its error)."""
    deadline = time.monotonic() + timeout_s
    while True:
        backfill = call(base, BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
        assert backfill["__typename"] == "PartitionBackfill", backfill
        if backfill["status"] in FINISHED:
            return backfill
        if time.monotonic() > deadline:
            raise AssertionError(
                f"backfill {backfill_id} not finished in {timeout_s} s: {backfill}"
            )
        time.sleep(0.5)


def partition_statuses(base: str, asset: str) -> dict[str, list[str]]:
    """materializedPartitions, failedPartitions, unmaterializedPartitions, materializingPartitions
    of the asset, as the Partitions tab reads them."""
    node = call(base, PARTITION_STATUSES, {"key": {"path": [asset]}})["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    statuses = node["assetPartitionStatuses"]
    assert statuses["__typename"] == "DefaultPartitionStatuses", statuses
    return {k: v for k, v in statuses.items() if k != "__typename"}


def stale_status(base: str, asset: str, partition: str) -> tuple[str, list[str]]:
    """An asset partition's stale status and its root causes ("<asset>[<partition>]: <reason>"),
    as the asset's partition page asks."""
    node = call(base, STALE, {"key": {"path": [asset]}, "partitions": [partition]})[
        "assetNodeOrError"
    ]
    assert node["__typename"] == "AssetNode", node
    causes = [
        f"{'/'.join(c['key']['path'])}[{c['partitionKey']}]: {c['reason']}"
        for c in node["staleCausesByPartition"][0]
    ]
    return node["staleStatusByPartition"][0], causes
