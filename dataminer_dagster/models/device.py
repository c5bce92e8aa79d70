"""The device a model runs on: what the code decides differently on a GPU, decided in one place.

Each choice is a plain function of facts that a caller passes in, so that every answer, the CUDA
ones included, is tested on a machine without a GPU:

* which device ``auto`` means, from the number of CUDA devices (`pick_device`);
* which precision, from the GPU's compute capability (`compute_dtype`);
* how host batches reach the device and how far ahead they are prepared (`DevicePlan`: pinned
  memory, a prefetch thread with a CUDA stream of its own, kept by the model: `PrefetchThreads`);
* how many images a batch holds, from the free device memory and the measured peak use per image
  (`batch_size_for_memory`, `plan_batch_size`);
* whether torchvision decodes JPEGs on the device (`decodes_jpeg`);
* which CPU a training ran on, as far as its weights depend on it (`training_cpu`).

Only `CudaMemory`, `cuda_capability`, `decodes_jpeg` and the stream/pinning calls ask CUDA itself.
torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import itertools
import platform
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
R = TypeVar("R")

DTYPE_NAMES = ("float32", "float16", "bfloat16")
# Below compute capability 7.0 (Volta) a GPU has no tensor cores, and most such cards (Pascal
# GeForce) run float16 arithmetic at a small fraction of their float32 rate.
HALF_PRECISION_CAPABILITY = (7, 0)
# bfloat16 arithmetic came with Ampere; older GPUs emulate it slowly or not at all.
BFLOAT16_CAPABILITY = (8, 0)
# Share of the free device memory that one batch may use at its peak: leaves room for the
# allocator's fragmentation and for another model in the same process.
BATCH_MEMORY_SHARE = 0.5
# Batches prepared ahead on CUDA (staging, copy, preprocessing) while the model runs one. On the
# CPU a preparing thread would take cores from the model, so nothing is prepared ahead there.
CUDA_PREFETCH_BATCHES = 2
# Items in the batch that measures the peak memory of one item.
PROBE_ITEMS = 2


def training_cpu() -> dict[str, str]:
    """The CPU a training runs on, for the record beside its weights: its model, and the kernels
    torch chose by the instruction sets it offers (AVX2, AVX-512, ...). Where a seed's weights
    repeat and where they part: bench/README.md."""
    import torch

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    return {"model": model, "torch_kernels": torch.backends.cpu.get_cpu_capability()}


def pick_device(name: str, *, cuda_devices: int, mps: bool) -> torch.device:
    """The device `name` (auto, cpu, cuda, cuda:N, mps; already validated) means on a machine
    with `cuda_devices` usable CUDA devices and Metal available or not."""
    import torch

    if name == "auto":
        return torch.device("cuda" if cuda_devices > 0 else "cpu")
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= cuda_devices:
            raise ValueError(
                f"device {name!r} was requested but this machine has {cuda_devices} usable CUDA "
                "device(s); use device 'auto' or 'cpu'"
            )
    if name == "mps" and not mps:
        raise ValueError("device 'mps' was requested but Metal (MPS) is not available here")
    return torch.device(name)


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA device; None for any other device."""
    import torch

    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def compute_dtype(
    requested: str | torch.dtype | None,
    device: torch.device,
    capability: tuple[int, int] | None,
) -> torch.dtype:
    """The precision a model runs in on `device` (a GPU of compute `capability`).

    None chooses: float16 on a GPU with tensor cores (capability 7.0 or newer), float32
    elsewhere. float16 rather than bfloat16 because it keeps 3 more bits of each value, and the
    models here stay far from its range limits (H200 run, bench/gpu.md). An explicit bfloat16 is
    refused on a GPU that cannot compute in it.
    """
    import torch

    if requested is None:
        fast_half = device.type == "cuda" and (capability or (0, 0)) >= HALF_PRECISION_CAPABILITY
        return torch.float16 if fast_half else torch.float32
    if isinstance(requested, str):
        if requested not in DTYPE_NAMES:
            raise ValueError(f"dtype {requested!r} is not one of {', '.join(DTYPE_NAMES)}")
        requested = getattr(torch, requested)
    if (
        requested == torch.bfloat16
        and device.type == "cuda"
        and capability is not None
        and capability < BFLOAT16_CAPABILITY
    ):
        raise ValueError(
            f"dtype bfloat16 needs a GPU of compute capability 8.0 (Ampere) or newer; {device} "
            f"has {capability[0]}.{capability[1]}. Use float16 or float32."
        )
    return requested


class DeviceMemory(Protocol):
    """Memory figures of a device: what is free now, and the peak a piece of work needs."""

    def free_bytes(self) -> int: ...

    def peak_bytes(self, run: Callable[[], object]) -> int:
        """Peak bytes allocated while `run()` runs, beyond what was allocated before it."""
        ...


@dataclass(frozen=True)
class CudaMemory:
    """`DeviceMemory` of a CUDA device, from torch's allocator."""

    device: torch.device

    def free_bytes(self) -> int:
        import torch

        free, _ = torch.cuda.mem_get_info(self.device)
        # Blocks torch holds in its cache but no tensor uses are free to this process.
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + cached)

    def peak_bytes(self, run: Callable[[], object]) -> int:
        import torch

        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        run()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - before)


@dataclass(frozen=True)
class DevicePlan:
    """How a model's input batches reach `device`, and in what precision it runs.

    `for_device` makes the plan from the device; a test may build one by hand, for example a CPU
    plan that prefetches and sizes batches from memory figures, to run the CUDA code path.
    """

    device: torch.device
    dtype: torch.dtype
    pin_memory: bool  # stage host batches in page-locked memory: the copy does not block
    prefetch_batches: int  # batches prepared ahead on a thread (0: in line)
    memory: DeviceMemory | None  # None: no memory figures; batches as configured

    @classmethod
    def for_device(cls, device: torch.device, dtype: torch.dtype) -> DevicePlan:
        cuda = device.type == "cuda"
        return cls(
            device=device,
            dtype=dtype,
            pin_memory=cuda,
            prefetch_batches=CUDA_PREFETCH_BATCHES if cuda else 0,
            memory=CudaMemory(device) if cuda else None,
        )


def batch_size_for_memory(
    limit: int, *, free_bytes: int, bytes_per_item: float, share: float = BATCH_MEMORY_SHARE
) -> int:
    """The most items, up to `limit` and at least 1, whose peak use fits in `share` of the free
    memory at `bytes_per_item` each."""
    if bytes_per_item <= 0:
        return limit
    return max(1, min(limit, int(free_bytes * share // bytes_per_item)))


def plan_batch_size(plan: DevicePlan, limit: int, probe: Callable[[int], object]) -> int:
    """`limit` where the plan has no memory figures; else what fits of it in the free memory.

    `probe(n)` runs the model's whole step (preparation, forward, post-processing) on n items;
    the peak it allocates for `PROBE_ITEMS` items, per item, sizes the batch. The fixed part of
    that peak counts as per-item too, which errs on the small side.
    """
    if plan.memory is None or limit <= 1:
        return limit
    items = min(limit, PROBE_ITEMS)
    per_item = plan.memory.peak_bytes(lambda: probe(items)) / items
    return batch_size_for_memory(
        limit, free_bytes=plan.memory.free_bytes(), bytes_per_item=per_item
    )


def to_device(frames: Sequence[np.ndarray], plan: DevicePlan) -> torch.Tensor:
    """(N, H, W, C) uint8 frames of one size on the plan's device: stacked once into host memory,
    page-locked where the plan pins so that the copy runs without blocking, then copied."""
    import torch

    host = torch.empty(
        (len(frames), *frames[0].shape), dtype=torch.uint8, pin_memory=plan.pin_memory
    )
    np.stack(frames, out=host.numpy())
    return host.to(plan.device, non_blocking=plan.pin_memory)


_thread_streams = threading.local()


def side_stream(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The calling thread's own CUDA stream on `device`, made once per thread; nothing elsewhere.

    One stream per thread rather than one per batch: torch caches freed device memory per
    stream, so a fresh stream for each batch would hold a cached copy of the batch on each.
    """
    import torch

    if device.type != "cuda":
        return contextlib.nullcontext()
    streams = _thread_streams.__dict__.setdefault("by_device", {})
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return torch.cuda.stream(streams[device])


def finish_stream(device: torch.device) -> None:
    """Wait until the calling thread's current CUDA stream on `device` has done its work;
    nothing elsewhere."""
    import torch

    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class PrefetchThreads:
    """A model's threads that prepare its next batches while it runs one: started on its first
    call, then kept for all later ones.

    Kept because each thread prepares on a CUDA stream of its own (`side_stream`) and torch caches
    freed device memory per stream: threads made afresh for every call would spread the model's
    cached memory over another stream each call. The threads end when their owner is dropped, and
    at interpreter exit (concurrent.futures joins its idle threads then).
    """

    def __init__(self, workers: int, name: str):
        self._workers = workers
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def ahead(
        self, items: Iterable[T], prepare: Callable[[T], R], lead: int
    ) -> Iterator[tuple[T, Future[R]]]:
        """Each item with the future of `prepare(item)`, in order, with up to `lead` items beyond
        the one handed over submitted. A caller that stops early leaves nothing running: items not
        started are cancelled and running ones waited for."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=self._name)
        pool = self._pool
        remaining = iter(items)
        pending: deque[tuple[T, Future[R]]] = deque()

        def submit(count: int) -> None:
            for item in itertools.islice(remaining, count):
                pending.append((item, pool.submit(prepare, item)))

        try:
            submit(lead)
            while pending:
                submit(1)
                yield pending[0]
                pending.popleft()
        finally:
            for _, future in pending:
                future.cancel()
            wait([future for _, future in pending])


def prepared_ahead(
    items: Iterable[T], prepare: Callable[[T], R], plan: DevicePlan, threads: PrefetchThreads
) -> Iterator[tuple[T, R]]:
    """Each item with `prepare(item)`, in order.

    With `plan.prefetch_batches` > 0 the `threads` prepare up to that many items while the caller
    works on the current one. On CUDA their work runs on a stream of their own and is finished
    before the item is handed over, so the caller's stream never waits on it. The caller must be
    done with a prepared item's device tensors (`finish_stream` on its own stream) before it drops
    them: their memory belongs to the preparing stream, which may reuse it at once.
    """
    ahead = plan.prefetch_batches
    if ahead <= 0:
        for item in items:
            yield item, prepare(item)
        return

    def prepare_on_side_stream(item: T) -> R:
        with side_stream(plan.device):
            prepared = prepare(item)
            finish_stream(plan.device)
        return prepared

    with contextlib.closing(threads.ahead(items, prepare_on_side_stream, ahead)) as futures:
        for item, future in futures:
            yield item, future.result()


def decodes_jpeg(device: torch.device) -> bool:
    """Whether torchvision decodes JPEGs on `device`: nvjpeg on CUDA, libjpeg on the CPU.

    A torchvision built without its image extension or without nvjpeg answers False, and the
    caller decodes with OpenCV instead.
    """
    try:
        import torch
        from torchvision.io import decode_jpeg, encode_jpeg

        sample = encode_jpeg(torch.full((3, 8, 8), 128, dtype=torch.uint8))
        decode_jpeg(sample, device=device)
    except (ImportError, RuntimeError, NotImplementedError):
        return False
    return True
