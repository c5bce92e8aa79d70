"""What a CUDA device would report, for tests on a machine without one."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataminer_dagster.models.device import PROBE_ITEMS


@dataclass
class StandInMemory:
    """The figures `CudaMemory` would report, given by the test. Like the real one it runs the
    work it is asked to measure."""

    free: int
    per_item: int
    measured: list[int] = field(default_factory=list)  # one entry per measurement

    def free_bytes(self) -> int:
        return self.free

    def peak_bytes(self, run) -> int:
        self.measured.append(1)
        run()
        return self.per_item * PROBE_ITEMS
