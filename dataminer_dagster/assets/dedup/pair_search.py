"""Thresholded inner products between blocks of rows of one matrix of unit vectors, on a CPU or GPU.

The dedup search (`assets/dedup/grouping.py`) asks two questions of its vectors x, always about blocks of
rows: which pairs (left row, right row) have a product at or above a cut, and which k centroids
are nearest to each of some rows. An engine, bound to x by `bind`, answers both:

* **faiss-cpu**: products of blocks up to one tile are NumPy matrix products, larger blocks a
  FAISS flat range search. Side by side in one run of `bench/dedup.py --products` on the quiet
  2-core machine (ms per block, NumPy vs FAISS): 100 x 100 (a video's frames) 0.17 vs 0.61,
  1,280 x 80 (an IVF list at 110,500 vectors) 0.96 vs 2.16, 4,200 x 264 (a list at 1.1M) 8.5 vs
  14.2, 1,000 x 2,048 (recall sample) 14.2 vs 23.0, but 8,192 x 2,048 (exact search) 113 vs 101
  (bench/dedup.md). Nearest centroids: FAISS k-NN.
* **faiss-gpu**: FAISS's GPU brute-force kernels, when the installed FAISS has GPU support
  (faiss-gpu, not faiss-cpu) and sees a GPU. It has no range search on the GPU, so a block's
  products come back to the host and are thresholded there.
* **torch-cuda**: torch on a CUDA GPU, when FAISS cannot use one (faiss-cpu, or no faiss-gpu
  wheel for the machine's CUDA: PyPI has none for CUDA 13). x is copied to the GPU once when it
  fits in half the free memory (else each block is gathered on the host and copied); blocks are
  gathered, multiplied in float32 without TF32, thresholded on the GPU, and only the pairs come
  back.

All three compute float32 products of the same rows and compare them with the cut rounded to
float32, so they differ only where a product's rounding crosses the cut; the dedup tolerance covers
that. `search_engine` picks one from a device setting (`search_request`: the models' settings,
such as dedup.device, and "gpu") and what the machine has; each fact can be given instead, so the
choice is tested on a CPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

DEVICES = ("auto", "cpu", "gpu", "cuda", "cuda:N", "mps")
# The engines, as the dedup node's metadata names them.
ENGINES = {
    "faiss-cpu": "FAISS on the CPU",
    "faiss-gpu": "FAISS on the GPU",
    "torch-cuda": "torch on the GPU",
}

TILE = 2048  # right-hand rows of one block
_QUERY_BLOCK = 8192  # left-hand rows of one block: a FAISS range search pays off with many
_NUMPY_CELLS = TILE * TILE  # blocks of fewer products than this are NumPy's (see above)
_ASSIGN_CHUNK = 16384  # rows per block when finding the nearest centroids
# On a GPU one call should be large enough to pay for its launch and its synchronisation (the
# pairs are counted before they come back): 8,192 x 8,192 products are 256 MiB of float32.
_GPU_TILE = 8192
_GPU_QUERY_BLOCK = 8192
_GPU_RESIDENT_SHARE = 0.5  # x stays on the GPU when it takes at most this share of free memory


def search_request(device: str) -> tuple[str, int | None]:
    """What a device setting asks of the search: "auto", "cpu" or "gpu", and which GPU (None: the
    current one).

    The settings are the models' (auto, cpu, cuda, cuda:N, mps) and "gpu": cuda and cuda:N ask for
    a GPU, mps for the CPU (FAISS and the torch engine do not search on Metal).
    """
    name = device.strip().lower()
    kind, _, index = name.partition(":")
    if name in ("auto", "cpu", "gpu"):
        return name, None
    if name == "mps":
        return "cpu", None
    if kind == "cuda" and (index.isdigit() or name == "cuda"):
        return "gpu", int(index) if index else None
    raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")


def search_engine(
    device: str = "auto",
    *,
    faiss_gpu_build: bool | None = None,
    faiss_gpus: int | None = None,
    torch_gpus: int | None = None,
) -> str:
    """The engine the searches run on: "faiss-cpu", "faiss-gpu" or "torch-cuda".

    `device` (see `search_request`) asks for the CPU; a GPU (an error when there is none); or
    "auto", a GPU when there is one. A GPU is FAISS's when the installed FAISS has GPU support
    (`faiss_gpu_build`) and sees one (`faiss_gpus`), else torch's when torch sees a CUDA device
    (`torch_gpus`). Each fact defaults to what the installed libraries report.
    """
    requested, _ = search_request(device)
    if requested == "cpu":
        return "faiss-cpu"
    if faiss_gpu_build is None:
        faiss_gpu_build = hasattr(load_faiss(), "StandardGpuResources")
    if faiss_gpus is None:
        faiss_gpus = load_faiss().get_num_gpus() if faiss_gpu_build else 0
    if faiss_gpu_build and faiss_gpus > 0:
        return "faiss-gpu"
    if torch_gpus is None:
        torch_gpus = _torch_cuda_devices()
    if torch_gpus > 0:
        return "torch-cuda"
    if requested == "gpu":
        why = "sees no GPU" if faiss_gpu_build else "has no GPU support (faiss-cpu is installed)"
        raise ValueError(
            f"device {device!r} was asked for, but FAISS {why} and torch sees no CUDA device; "
            "run on a CUDA machine (with faiss-gpu or torch built for CUDA) or use device "
            "'auto' or 'cpu'"
        )
    return "faiss-cpu"


def bind(device: str, x: np.ndarray):
    """The float32 unit rows x bound to the engine `device` asks for (`search_engine`), on the
    GPU it names."""
    engine = search_engine(device)
    _, gpu = search_request(device)
    if engine == "faiss-cpu":
        return _FaissCpu(x)
    if engine == "faiss-gpu":
        return _FaissGpu(x, -1 if gpu is None else gpu)
    return _Torch(x, "cuda" if gpu is None else f"cuda:{gpu}")


class _Blocks(ABC):
    """Searches as blocks of rows of x: gather a block, compute it, give back positions."""

    engine: str
    device: str  # "cpu" or "gpu"
    tile = TILE
    query_block = _QUERY_BLOCK

    def pairs(
        self, left: np.ndarray, right: np.ndarray, cut: float
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Positions (a, b) into `left` and `right` (row numbers of x) with
        x[left[a]] . x[right[b]] >= cut, a block at a time."""
        for b0 in range(0, len(right), self.tile):
            base = self._gather(right[b0 : b0 + self.tile])
            for a0 in range(0, len(left), self.query_block):
                queries = self._gather(left[a0 : a0 + self.query_block])
                a, b = self._block_pairs(queries, base, cut)
                if len(a):
                    yield a + a0, b + b0

    def nearest(self, rows: np.ndarray, centroids: np.ndarray, k: int) -> np.ndarray:
        """Per row of x[rows], its k most similar centroids, most similar first (int32)."""
        found = np.empty((len(rows), k), dtype=np.int32)
        for start in range(0, len(rows), _ASSIGN_CHUNK):
            chunk = self._gather(rows[start : start + _ASSIGN_CHUNK])
            found[start : start + _ASSIGN_CHUNK] = self._block_nearest(chunk, centroids, k)
        return found

    @abstractmethod
    def _gather(self, rows: np.ndarray):
        """The rows x[rows], where this engine computes."""

    @abstractmethod
    def _block_pairs(self, queries, base, cut: float) -> tuple[np.ndarray, np.ndarray]:
        """Positions (a, b) with queries[a] . base[b] >= cut, on the host."""

    @abstractmethod
    def _block_nearest(self, queries, centroids: np.ndarray, k: int) -> np.ndarray:
        """Per query, its k most similar centroids, most similar first, on the host."""


class _FaissCpu(_Blocks):
    engine, device = "faiss-cpu", "cpu"

    def __init__(self, x: np.ndarray):
        self._x = x

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        return self._x[rows]

    def _block_pairs(self, queries: np.ndarray, base: np.ndarray, cut: float):
        if len(queries) * len(base) < _NUMPY_CELLS:
            return np.nonzero(queries @ base.T >= np.float32(cut))
        faiss = load_faiss()
        index = faiss.IndexFlatIP(base.shape[1])
        index.add(base)
        lims, _, ids = index.range_search(queries, _below(cut))
        return np.repeat(np.arange(len(queries)), np.diff(lims).astype(np.int64)), ids

    def _block_nearest(self, queries: np.ndarray, centroids: np.ndarray, k: int) -> np.ndarray:
        faiss = load_faiss()
        return faiss.knn(queries, centroids, k, metric=faiss.METRIC_INNER_PRODUCT)[1]


class _FaissGpu(_FaissCpu):
    """FAISS's GPU kernels on GPU `gpu` (-1: the current one)."""

    engine, device = "faiss-gpu", "gpu"

    def __init__(self, x: np.ndarray, gpu: int):
        super().__init__(x)
        self._faiss = load_faiss()
        self._resources = self._faiss.StandardGpuResources()
        self._gpu = gpu

    def _block_pairs(self, queries: np.ndarray, base: np.ndarray, cut: float):
        metric = self._faiss.METRIC_INNER_PRODUCT
        sims = self._faiss.pairwise_distance_gpu(
            self._resources, queries, base, metric=metric, device=self._gpu
        )
        return np.nonzero(sims >= np.float32(cut))

    def _block_nearest(self, queries: np.ndarray, centroids: np.ndarray, k: int) -> np.ndarray:
        metric = self._faiss.METRIC_INNER_PRODUCT
        found = self._faiss.knn_gpu(
            self._resources, queries, centroids, k, metric=metric, device=self._gpu
        )
        return found[1]


class _Torch(_Blocks):
    """torch on `device` ("cuda", "cuda:N", or "cpu" to test this path on a machine without a
    GPU)."""

    engine, device = "torch-cuda", "gpu"
    tile = _GPU_TILE
    query_block = _GPU_QUERY_BLOCK

    def __init__(self, x: np.ndarray, device: str, *, free_bytes: int | None = None):
        import torch

        self._torch = torch
        self._device = torch.device(device)
        if free_bytes is None:
            free_bytes = torch.cuda.mem_get_info(self._device)[0]
        self.resident = x.nbytes <= _GPU_RESIDENT_SHARE * free_bytes
        self._host = x
        self._x = torch.from_numpy(x).to(self._device) if self.resident else None

    def _gather(self, rows: np.ndarray):
        if self.resident:
            return self._x[self._torch.from_numpy(rows).to(self._device)]
        return self._torch.from_numpy(self._host[rows]).to(self._device)

    def _block_pairs(self, queries, base, cut: float):
        with _float32_products(self._torch):
            hits = self._torch.nonzero(queries @ base.T >= np.float32(cut)).cpu().numpy()
        return hits[:, 0], hits[:, 1]

    def _block_nearest(self, queries, centroids: np.ndarray, k: int) -> np.ndarray:
        centres = self._torch.from_numpy(centroids).to(self._device)
        with _float32_products(self._torch):
            return self._torch.topk(queries @ centres.T, k, dim=1).indices.cpu().numpy()


@contextmanager
def _float32_products(torch):
    """Full float32 matrix products (no TF32), whatever the process set, restored afterwards.

    With torch's per-backend settings where it has them (newer than the 2.4 this project allows):
    once anything in the process has used them, the legacy `get_float32_matmul_precision` raises.
    """
    if hasattr(torch.backends, "fp32_precision"):
        matmuls = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)  # GPU, CPU (tests)

        def use(precisions):
            for matmul, precision in zip(matmuls, precisions, strict=True):
                matmul.fp32_precision = precision

        before, full = [matmul.fp32_precision for matmul in matmuls], ["ieee"] * len(matmuls)
    else:  # an older torch: the legacy setting only
        use = torch.set_float32_matmul_precision
        before, full = torch.get_float32_matmul_precision(), "highest"
    use(full)
    try:
        yield
    finally:
        use(before)


def _below(cut: float) -> float:
    """The radius whose strict FAISS inner-product range search (> radius) keeps >= cut."""
    return float(np.nextafter(np.float32(cut), np.float32(-np.inf)))


def load_faiss():
    """FAISS, imported on first search: a large library that loading the pipeline's definitions
    should not pay for."""
    import faiss

    return faiss


def _torch_cuda_devices() -> int:
    """CUDA devices torch sees; 0 when torch is not installed."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
