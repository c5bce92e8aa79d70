"""The suite's `xdist_group` marks group: under `pytest -n N` with `--dist loadgroup` (the README's
test command), pytest-xdist sends a group's tests to one worker by adding the group to each test's
node id. Where a pytest release keeps node ids where xdist cannot change them, nothing is grouped
and nothing says so: the daemon, backfill, fault and UI modules then build their module fixtures
(deployments, reference runs, a fault lab) once per worker and run their deployments side by side.
"""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("grouping-check")
def test_a_grouped_test_carries_its_group_under_loadgroup(request):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not under pytest-xdist")
    if not getattr(request.config.option, "loadgroup", False):  # xdist sets it on its workers
        pytest.skip("not under --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), (
        f"{request.node.nodeid}: pytest-xdist could not add the group to the node id (pytest's "
        "release, see the pin in pyproject.toml)"
    )
