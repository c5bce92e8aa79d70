"""Finding and loading model weights, once per process.

A model reference is either a local directory written by `save_pretrained` (what the tests and
the offline demo use) or a Hugging Face hub id such as `google/siglip2-so400m-patch14-384`. A hub
id is served from the local hub cache first; the hub is asked only when the model is missing and
the process is online. When neither works the user gets one `ModelUnavailableError` that says
what to do. torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dataminer_dagster.models.device import compute_dtype, cuda_capability, pick_device

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# Files fetched for a hub model: configs, tokenizers and safetensors weights (not .bin/.h5/.onnx).
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt"]
# Files whose content defines what an image embedding means (weights and image preprocessing).
_IDENTITY_CONFIGS = ("config.json", "preprocessor_config.json", "processor_config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_SAMPLES_PER_FILE = 16
_SAMPLE_BYTES = 64 * 1024
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class ModelLoadError(RuntimeError):
    """A model that exists on disk but cannot be loaded; the message names the directory."""


class ModelUnavailableError(ModelLoadError):
    """A model that is neither on this machine nor downloadable right now."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model reference points: a local directory and a stable identity for caches."""

    reference: str  # as configured: a directory or a hub id
    path: Path  # directory holding config and weights
    revision: str | None  # hub commit of the snapshot; None for a plain directory
    slug: str  # `<name>-<content fingerprint>`, safe as a directory name


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # a transformers PreTrainedModel in eval mode on `device`
    processor: Any  # its processor (AutoProcessor or AutoImageProcessor)
    source: ModelSource
    device: torch.device
    dtype: torch.dtype


def resolve_model(reference: str | os.PathLike[str], *, revision: str | None = None) -> ModelSource:
    """Find the files of `reference` on this machine, downloading a hub model only when online."""
    text = os.fspath(reference)
    candidate = Path(text).expanduser()
    if candidate.is_dir():
        path = candidate.resolve()
        return ModelSource(text, path, None, _slug(path.name, path))
    if _looks_like_path(text):
        raise ModelUnavailableError(
            f"Model directory {candidate} does not exist. Set the model to a directory saved with "
            "save_pretrained, or to a Hugging Face hub id such as google/siglip2-so400m-patch14-384."
        )
    if not _HUB_ID.fullmatch(text):
        raise ValueError(
            f"Model reference {text!r} is neither an existing directory nor a hub id "
            "(organisation/name, e.g. google/siglip2-so400m-patch14-384)"
        )
    path = _hub_snapshot(text, revision)
    return ModelSource(text, path, path.name, _slug(text.replace("/", "--"), path))


def resolve_device(
    device: str | torch.device = "auto",
    *,
    cuda_devices: int | None = None,
    mps: bool | None = None,
) -> torch.device:
    """`auto` is the first CUDA GPU when there is one, else the CPU; also cpu, cuda, cuda:N, mps.

    `cuda_devices` and `mps` say what this machine has; None reads it from torch.
    """
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    name = str(device).strip().lower()
    if not _DEVICE.fullmatch(name):
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:<index>, mps")
    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if mps is None:
        mps = name == "mps" and torch.backends.mps.is_available()
    return pick_device(name, cuda_devices=cuda_devices, mps=mps)


def resolve_dtype(
    dtype: str | torch.dtype | None,
    device: torch.device,
    *,
    capability: tuple[int, int] | None = None,
) -> torch.dtype:
    """The model's precision on `device` (see `device.compute_dtype`): None chooses float16 on a
    GPU with tensor cores, float32 elsewhere. `capability` is the GPU's compute capability; None
    reads it from torch."""
    if capability is None:
        capability = cuda_capability(device)
    return compute_dtype(dtype, device, capability)


class ModelCache:
    """Loaded models by key: `load()` runs once per key, even when threads ask at once."""

    def __init__(self) -> None:
        self._models: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, load: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._models:
                self._models[key] = load()
            return self._models[key]


# The process's models (resources/models.py says why they outlive a run).
PROCESS_MODELS = ModelCache()


def load_once(key: tuple, load: Callable[[], T]) -> T:
    """`load()` once per key in this process (PROCESS_MODELS)."""
    return PROCESS_MODELS.get(key, load)


def load_pretrained(
    reference: str | os.PathLike[str],
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    model_class: Any = None,
    processor_class: Any = None,
    processor_kwargs: Mapping[str, Any] | None = None,
) -> LoadedModel:
    """Load a transformers model and its processor once per process and put it on `device`.

    `model_class` defaults to AutoModel and `processor_class` to AutoProcessor; any class with
    `from_pretrained` works (AutoImageProcessor, AutoModelForZeroShotObjectDetection, ...).
    """
    import transformers

    source = resolve_model(reference, revision=revision)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model_class = model_class or transformers.AutoModel
    processor_class = processor_class or transformers.AutoProcessor
    extra = dict(processor_kwargs or {})
    key = (
        str(source.path),
        source.slug,
        model_class.__name__,
        processor_class.__name__,
        tuple(sorted(extra.items())),
        str(torch_device),
        str(torch_dtype),
    )

    def load() -> LoadedModel:
        try:
            processor = processor_class.from_pretrained(source.path, **extra)
            model = model_class.from_pretrained(source.path, dtype=torch_dtype)
        except (OSError, ValueError) as error:
            raise ModelLoadError(
                f"Model {source.reference} could not be loaded from {source.path}: {error}"
            ) from error
        model = model.to(torch_device).eval()
        return LoadedModel(model, processor, source, torch_device, torch_dtype)

    return load_once(key, load)


def _looks_like_path(text: str) -> bool:
    return (
        text.startswith(("/", "./", "../", "~", "\\"))
        or text.endswith(("/", "\\"))
        or text.count("/") > 1
        or (len(text) > 1 and text[1] == ":")
    )


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(
        flag.strip().lower() in ("1", "true", "yes", "on") for flag in flags
    )


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if _hub_offline():
        raise _unavailable(repo_id, at, "HF_HUB_OFFLINE is set", constants.HF_HOME)
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILE_PATTERNS))
    except GatedRepoError as error:
        raise ModelUnavailableError(
            f"Model {repo_id} is gated on the Hugging Face hub: accept its licence at "
            f"https://huggingface.co/{repo_id} and set HF_TOKEN to a token of that account "
            f"({type(error).__name__})."
        ) from error
    except RevisionNotFoundError as error:
        raise ModelUnavailableError(
            f"Model {repo_id} has no revision {revision!r} on the Hugging Face hub."
        ) from error
    except RepositoryNotFoundError as error:
        raise ModelUnavailableError(
            f"Model {repo_id} does not exist on the Hugging Face hub (or is private: set "
            "HF_TOKEN). Check the spelling of the model id."
        ) from error
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _unavailable(repo_id, at, reason, constants.HF_HOME) from error


def _unavailable(repo_id: str, at: str, reason: str, hf_home: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"Model {repo_id}{at} is not available on this machine and the Hugging Face hub cannot "
        f"be reached ({reason}). Download it where there is network (`hf download {repo_id}`, "
        f"or `huggingface-cli download {repo_id}` with older huggingface_hub) and copy the hub "
        f"cache (HF_HOME, here {hf_home}) to this machine, or set the model to a local "
        "directory saved with save_pretrained."
    )


def _slug(name: str, path: Path) -> str:
    safe_name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    return f"{safe_name}-{_fingerprint(path)[:16]}"


def _fingerprint(path: Path) -> str:
    """Hash of the configs that shape an embedding and of samples of every weight file.

    Sampling (size plus 16 spread 64 KiB reads per file) keeps this cheap for multi-GB weights
    while still telling apart checkpoints that share a config (other seeds, fine-tunes).
    """
    digest = hashlib.sha256()
    for name in _IDENTITY_CONFIGS:
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    for file in sorted(path.iterdir()):
        if file.suffix not in _WEIGHT_SUFFIXES or not file.is_file():
            continue
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        step = max(size // _SAMPLES_PER_FILE, 1)
        with file.open("rb") as handle:
            for offset in range(0, size, step)[:_SAMPLES_PER_FILE]:
                handle.seek(offset)
                digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()
