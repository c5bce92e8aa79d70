"""Whether the committed training scripts re-train the shipped world models: each is trained again
with the command its training.json records (only `--out` changed), and the new weights and
figures are set against the shipped ones.

Per model: the CPU it was trained on and this one (`models.device.training_cpu`), whether every
weight tensor is the same, the largest difference where not, and each figure of training.json
(precision, recall and top-1 of the SigLIP; mAP of the YOLO, per class too) shipped and again,
with the difference in points. Where the weights repeat (the kind of CPU that trained them) and
where they part: bench/README.md.

With `--quality-worlds`, the figures the issue asks the re-trained models to repeat: the pipeline's
quality (bench/quality.py without its detector trainings: the filter's precision and recall, junk
kept, dedup's pairs, near-duplicates across splits, the detections' mAP50) on each of those
worlds, mined once with the shipped models and once with the re-trained ones (a model not
re-trained stays the shipped one), side by side; `--quality-sources` sets the worlds' size (source
clips, each with a planted copy), so that a point of a figure is more than a frame. A `--work`
folder that already holds a model trained by this script is measured again without training it
again.

    python bench/retrain_world_models.py [--only siglip|yolo] [--work DIR]
        [--quality-worlds N ...] [--quality-sources N]
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
    parser.add_argument(
        "--quality-worlds", type=int, nargs="*", default=[], help="world seeds for bench/quality.py"
    )
    parser.add_argument(
        "--quality-sources", type=int, default=6, help="source clips of each quality world"
    )
    args = parser.parse_args()
    print(f"this CPU: {training_cpu()}")
    with tempfile.TemporaryDirectory(prefix="retrain-") as scratch:
        work = (args.work or Path(scratch)).resolve()
        kinds = [args.only] if args.only else sorted(FIGURES)
        for kind in kinds:
            retrain(kind, work / kind)
        retrained = {
            "siglip": work / "siglip" if "siglip" in kinds else None,
            "yolo": work / "yolo" / WORLD_YOLO.name if "yolo" in kinds else None,
        }
        for seed in args.quality_worlds:
            compare_quality(
                seed,
                args.quality_sources,
                retrained,
                work / f"quality-{seed}-{args.quality_sources}",
            )


def retrain(kind: str, out: Path) -> None:
    shipped_dir = WORLD_SIGLIP if kind == "siglip" else WORLD_YOLO.parent
    shipped = json.loads((shipped_dir / "training.json").read_text())
    command = again(shipped["command"], out)
    print(f"\n{kind}: shipped trained on {shipped.get('cpu', 'an unrecorded CPU')}")
    print(f"  {shlex.join(command)}")
    if trained_before(out, command):
        print(f"  trained before with this command, in {out}: measured again")
    else:
        started = time.monotonic()
        run = subprocess.run(
            command, cwd=REPOSITORY, env=script_env(), capture_output=True, text=True
        )
        if run.returncode:
            raise SystemExit(
                f"{kind}: the training failed ({run.returncode}):\n{run.stderr[-4000:]}"
            )
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


# (name, the figure in bench/quality.py's JSON report) of the pipeline's quality
QUALITY = (
    ("filter precision", ("filter", "all prompts", "precision")),
    ("filter recall", ("filter", "all prompts", "recall")),
    ("junk frames kept", ("junk_kept",)),
    ("dataset images", ("images",)),
    ("dedup pair precision", ("dedup", "all pairs", "precision")),
    ("dedup pair recall", ("dedup", "all pairs", "recall")),
    ("near-duplicates across splits", ("dedup", "near-duplicates across splits")),
    ("detection mAP50", ("detection", "map50")),
)


def compare_quality(seed: int, sources: int, retrained: dict[str, Path | None], work: Path) -> None:
    """bench/quality.py on world `seed` of `sources` source clips with the shipped models and with
    the re-trained ones."""
    shipped = {"siglip": WORLD_SIGLIP, "yolo": WORLD_YOLO}
    reports = {}
    for name, given in (("shipped", {}), ("again", retrained)):
        models = {kind: given.get(kind) or path for kind, path in shipped.items()}
        report = work / f"{name}.json"
        if not measured_with(report, models):
            command = [sys.executable, str(REPOSITORY / "bench" / "quality.py"), "--seeds"]
            command += ["--world-seed", str(seed), "--sources", str(sources)]
            command += ["--json", str(report)]
            for kind, path in models.items():
                command += [f"--{kind}", str(path)]
            work.mkdir(parents=True, exist_ok=True)
            run = subprocess.run(
                command,
                env=script_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if run.returncode:
                raise SystemExit(
                    f"bench/quality.py failed ({run.returncode}):\n{run.stdout[-4000:]}"
                )
        reports[name] = json.loads(report.read_text())
    print(
        f"\nthe pipeline's quality on world {seed}, {sources} sources (bench/quality.py --seeds):"
    )
    for name, keys in QUALITY:
        before, now = (quality_figure(reports[which], keys) for which in ("shipped", "again"))
        if isinstance(now, float):
            print(
                f"  {name:<30} shipped {before:.3f}  again {now:.3f}  {100 * (now - before):+.1f} points"
            )
        else:
            print(f"  {name:<30} shipped {before:<5}  again {now}")


def measured_with(report: Path, models: dict[str, Path]) -> bool:
    """Whether `report` exists and was measured with these models (a kept `--work`)."""
    if not report.exists():
        return False
    recorded = json.loads(report.read_text())
    return all(recorded.get(kind) == str(path.resolve()) for kind, path in models.items())


def quality_figure(report: dict, keys: tuple[str, ...]):
    """The figure at `keys` of a bench/quality.py JSON report."""
    for key in keys:
        report = report[key]
    return report


def trained_before(out: Path, command: list[str]) -> bool:
    """Whether `out` holds a model trained with `command` (a kept `--work`)."""
    record = out / "training.json"
    recorded = shlex.join(["python", *command[1:]])
    return record.exists() and json.loads(record.read_text()).get("command") == recorded


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
