"""The device choices (models.device) with both answers, on a machine without a GPU.

The facts a GPU would report (device count, compute capability, free and peak memory) are passed
in; only what cannot exist here is a stand-in: the memory figures of a CUDA device.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from dataminer_dagster.models.device import (
    CUDA_PREFETCH_BATCHES,
    PROBE_ITEMS,
    CudaMemory,
    DevicePlan,
    PrefetchThreads,
    batch_size_for_memory,
    compute_dtype,
    decodes_jpeg,
    pick_device,
    plan_batch_size,
    prepared_ahead,
    to_device,
    training_cpu,
)
from dataminer_dagster.models.loading import resolve_device, resolve_dtype
from tests.models.cuda_stand_ins import StandInMemory

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
MIB = 2**20


def cpu_plan(**changes) -> DevicePlan:
    """A CPU plan, changed where a test takes the CUDA answer (prefetching, memory figures)."""
    return dataclasses.replace(DevicePlan.for_device(CPU, torch.float32), **changes)


@pytest.mark.parametrize(
    ("name", "cuda_devices", "expected"),
    [
        ("auto", 0, "cpu"),
        ("auto", 1, "cuda"),
        ("auto", 4, "cuda"),
        ("cuda", 1, "cuda"),
        ("cuda:3", 4, "cuda:3"),
        ("cpu", 2, "cpu"),
    ],
)
def test_pick_device(name, cuda_devices, expected):
    assert pick_device(name, cuda_devices=cuda_devices, mps=False) == torch.device(expected)
    assert resolve_device(name.upper(), cuda_devices=cuda_devices, mps=False) == torch.device(
        expected
    )


@pytest.mark.parametrize(
    ("name", "cuda_devices", "mps", "message"),
    [
        ("cuda", 0, False, "has 0 usable CUDA device"),
        ("cuda:1", 1, False, "has 1 usable CUDA device"),
        ("mps", 0, False, r"Metal \(MPS\) is not available"),
    ],
)
def test_a_device_the_machine_lacks_is_refused(name, cuda_devices, mps, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(name, cuda_devices=cuda_devices, mps=mps)


def test_this_machine_answers_for_itself():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.parametrize(
    ("requested", "device", "capability", "expected"),
    [
        (None, CPU, None, torch.float32),
        (None, CUDA, (9, 0), torch.float16),  # H100/H200
        (None, CUDA, (7, 0), torch.float16),  # V100: the first tensor cores
        (None, CUDA, (6, 1), torch.float32),  # Pascal GeForce: slow float16
        ("bfloat16", CUDA, (8, 0), torch.bfloat16),
        ("bfloat16", CPU, None, torch.bfloat16),
        ("float16", CUDA, (6, 1), torch.float16),  # asked for: the user's choice
        (torch.float32, CUDA, (9, 0), torch.float32),
    ],
)
def test_compute_dtype(requested, device, capability, expected):
    assert compute_dtype(requested, device, capability) == expected
    assert resolve_dtype(requested, device, capability=capability or (0, 0)) == expected


def test_bfloat16_is_refused_on_a_gpu_without_it():
    with pytest.raises(ValueError, match=r"compute capability 8.0 \(Ampere\).*has 7.5"):
        compute_dtype("bfloat16", CUDA, (7, 5))
    with pytest.raises(ValueError, match="not one of float32, float16, bfloat16"):
        compute_dtype("float64", CPU, None)


def test_the_plan_for_a_gpu_and_for_the_cpu():
    gpu = DevicePlan.for_device(CUDA, torch.float16)
    assert gpu.pin_memory and gpu.prefetch_batches == CUDA_PREFETCH_BATCHES
    assert gpu.memory == CudaMemory(CUDA)
    cpu = DevicePlan.for_device(CPU, torch.float32)
    assert not cpu.pin_memory and cpu.prefetch_batches == 0 and cpu.memory is None


@pytest.mark.parametrize(
    ("limit", "free_mib", "per_item_mib", "expected"),
    [
        (32, 100_000, 100, 32),  # an H200: the limit
        (32, 1_000, 100, 5),  # half of 1,000 MiB at 100 MiB an item
        (32, 150, 100, 1),  # never less than one
        (8, 1_000, 0, 8),  # nothing measured per item: the limit
    ],
)
def test_batch_size_for_memory(limit, free_mib, per_item_mib, expected):
    got = batch_size_for_memory(limit, free_bytes=free_mib * MIB, bytes_per_item=per_item_mib * MIB)
    assert got == expected


def test_plan_batch_size_measures_on_a_probe_batch():
    memory = StandInMemory(free=1_000 * MIB, per_item=100 * MIB)
    probed: list[int] = []
    assert plan_batch_size(cpu_plan(memory=memory), 32, probed.append) == 5
    assert probed == [PROBE_ITEMS] and memory.measured == [1]
    # without memory figures (the CPU) or with nothing to choose, nothing is run
    assert plan_batch_size(cpu_plan(), 32, probed.append) == 32
    assert plan_batch_size(cpu_plan(memory=memory), 1, probed.append) == 1
    assert probed == [PROBE_ITEMS]


def test_to_device_stacks_frames_once():
    frames = [np.full((4, 6, 3), i, np.uint8) for i in range(3)]
    got = to_device(frames, cpu_plan())
    assert got.dtype == torch.uint8 and got.shape == (3, 4, 6, 3)
    np.testing.assert_array_equal(got.numpy(), np.stack(frames))


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_prepared_ahead_keeps_order_and_bounds_the_lead(ahead):
    prepared_by: list[tuple[int, str]] = []
    consumer = threading.current_thread().name

    def prepare(item: int) -> int:
        prepared_by.append((item, threading.current_thread().name))
        return item * 10

    seen = []
    plan, threads = cpu_plan(prefetch_batches=ahead), PrefetchThreads(1, "batch-prefetch")
    for item, value in prepared_ahead(range(7), prepare, plan, threads):
        # at most `ahead` items beyond the current one are ever prepared
        assert len(prepared_by) <= item + 1 + ahead
        seen.append((item, value))
    assert seen == [(i, i * 10) for i in range(7)]
    threads = {name for _, name in prepared_by}
    assert threads == ({consumer} if ahead == 0 else {"batch-prefetch_0"})


def test_prepared_ahead_passes_on_a_failure():
    def prepare(item: int) -> int:
        if item == 2:
            raise ValueError("frame 2 is broken")
        return item

    got = []
    with pytest.raises(ValueError, match="frame 2 is broken"):
        plan = cpu_plan(prefetch_batches=2)
        for item, _ in prepared_ahead(range(5), prepare, plan, PrefetchThreads(1, "prefetch")):
            got.append(item)
    assert got == [0, 1]


def test_prefetch_threads_serve_every_call_and_end_with_their_owner():
    # Each prefetch thread has its own CUDA stream (side_stream): one thread across calls keeps
    # the cached device memory on one stream.
    threads = PrefetchThreads(1, "prefetch")
    served = [
        future.result()
        for _ in range(3)
        for _, future in threads.ahead(range(2), lambda _: threading.current_thread(), 1)
    ]
    assert len(set(served)) == 1 and served[0] is not threading.current_thread()
    del threads
    gc.collect()
    served[0].join(timeout=10)
    assert not served[0].is_alive()


def test_a_process_with_prefetch_threads_exits():
    script = (
        "from dataminer_dagster.models.device import PrefetchThreads\n"
        "threads = PrefetchThreads(2, 'prefetch')\n"
        "assert [f.result() for _, f in threads.ahead(range(3), abs, 1)] == [0, 1, 2]\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_stopping_early_leaves_nothing_running():
    done = []

    def prepare(item: int) -> None:
        time.sleep(0.05)
        done.append(item)

    futures = PrefetchThreads(1, "prefetch").ahead(range(10), prepare, 3)
    next(futures)
    futures.close()  # the running item is waited for, the three queued ones cancelled
    finished = list(done)
    time.sleep(0.2)
    assert done == finished and 1 <= len(done) <= 4


def test_jpeg_decoding_on_the_device_is_probed():
    assert decodes_jpeg(CPU)  # torchvision's libjpeg
    # No GPU here: the CUDA answer is the real one of a machine without nvjpeg to use.
    assert decodes_jpeg(CUDA) == torch.cuda.is_available()


def test_a_training_records_the_cpu_and_the_kernels_torch_chose_on_it():
    script = (
        "import json\n"
        "from dataminer_dagster.models.device import training_cpu\n"
        "print(json.dumps(training_cpu()))\n"
    )
    run = [sys.executable, "-c", script]
    own = json.loads(subprocess.run(run, check=True, capture_output=True, timeout=120).stdout)
    assert own == training_cpu()
    assert own["model"], "the CPU's model is named"
    # Held to its baseline kernels, the same CPU is recorded as it then computes.
    held = subprocess.run(
        run,
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
    )
    assert json.loads(held.stdout) == {**own, "torch_kernels": "DEFAULT"}
