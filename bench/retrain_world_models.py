"""Whether the committed training scripts re-train the shipped world models: each is trained again
with the command its training.json records (only `--out` changed), and the new weights and
figures are set against the shipped ones.

Per model: the CPU it was trained on and this one (`models.device.training_cpu`), whether every
weight tensor is the same, the largest difference where not, and each figure of training.json
(precision, recall and top-1 of the SigLIP; mAP of the YOLO, per class too) shipped and again,
with the difference in points. Where the weights repeat (the kind of CPU that trained them) and
where they part: bench/README.md.

    python bench/retrain_world_models.py [--only siglip|yolo] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))

from dataminer_dagster.models.device import training_cpu  # noqa: E402
from dataminer_dagster.models.world_models import WORLD_SIGLIP, WORLD_YOLO  # noqa: E402

FIGURES = {
    "siglip": ("mean_precision", "mean_recall", "single_object_top1"),
    "yolo": ("map50", "map50_95"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(FIGURES), default=None)
    parser.add_argument("--work", type=Path, default=None, help="keep the new models here")
    args = parser.parse_args()
    print(f"this CPU: {training_cpu()}")
    with tempfile.TemporaryDirectory(prefix="retrain-") as scratch:
        work = args.work or Path(scratch)
        for kind in [args.only] if args.only else sorted(FIGURES):
            retrain(kind, work / kind)


def retrain(kind: str, out: Path) -> None:
    shipped_dir = WORLD_SIGLIP if kind == "siglip" else WORLD_YOLO.parent
    shipped = json.loads((shipped_dir / "training.json").read_text())
    command = again(shipped["command"], out)
    print(f"\n{kind}: shipped trained on {shipped.get('cpu', 'an unrecorded CPU')}")
    print(f"  {shlex.join(command)}")
    started = time.monotonic()
    run = subprocess.run(command, cwd=REPOSITORY, env=script_env(), capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{kind}: the training failed ({run.returncode}):\n{run.stderr[-4000:]}")
    print(f"  trained again in {time.monotonic() - started:.0f} s")
    figures = json.loads((out / "training.json").read_text())
    if kind == "siglip":
        same, largest = same_tensors(
            siglip_tensors(shipped_dir / "model.safetensors"),
            siglip_tensors(out / "model.safetensors"),
        )
    else:
        same, largest = same_tensors(yolo_tensors(WORLD_YOLO), yolo_tensors(out / WORLD_YOLO.name))
    print(f"  the same weights: {'yes' if same else f'no (largest difference {largest:.3g})'}")
    rows = [(name, shipped[name], figures[name]) for name in FIGURES[kind]]
    rows += [
        (f"mAP50-95 {name}", value, figures["per_class_map50_95"][name])
        for name, value in shipped.get("per_class_map50_95", {}).items()
    ]
    for name, before, now in rows:
        print(
            f"  {name:<22} shipped {before:.4f}  again {now:.4f}  {100 * (now - before):+.1f} points"
        )


def again(recorded: str, out: Path) -> list[str]:
    """The recorded command with this interpreter and `--out` replaced by `out`."""
    words = shlex.split(recorded)
    at = words.index("--out")
    words[at + 1] = str(out)
    return [sys.executable, *words[1:]]


def script_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPOSITORY)}


def siglip_tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def yolo_tensors(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["model"].state_dict()


def same_tensors(a: dict, b: dict) -> tuple[bool, float]:
    """Whether two state dicts hold equal tensors, and the largest absolute difference."""
    if a.keys() != b.keys():
        return False, float("inf")
    largest = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return largest == 0.0, largest


if __name__ == "__main__":
    main()
