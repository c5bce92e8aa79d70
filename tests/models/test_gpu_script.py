"""bench/gpu.sh --dry-run: the GPU benchmark is complete before a GPU is lent.

A GPU comes in short slots, so a broken script costs a slot. The dry run builds every full-size
architecture, runs every section at the smallest sizes on the CPU, writes the report and installs
the wheels the GPU machine gets; this test runs it as the GPU machine would, with a wheel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def write_wheel(folder: Path, name: str = "gpu_bench_probe") -> Path:
    """A pure-python wheel of one module, as `pip download` would bring one."""
    folder.mkdir(parents=True)
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": "VERSION = '0.1'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", record)
    return wheel


def test_dry_run_checks_the_whole_script(tmp_path):
    write_wheel(tmp_path / "wheels")
    out = tmp_path / "out"
    env = dict(
        os.environ,
        OUT=str(out),
        WHEELS=str(tmp_path / "wheels"),
        PYTHON=sys.executable,
        YOLO_CONFIG_DIR=str(tmp_path / "yolo"),
        TMPDIR=str(tmp_path),
    )
    done = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    checks = {
        line.split(":", 2)[1].strip(): line.split(":", 2)[2]
        for line in lines
        if line.startswith("dry run: ") and line.count(":") >= 2
    }
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert lines[-1].startswith("dry run: complete"), lines[-5:]
    assert "1 from" in done.stdout and f"installed into {tmp_path}/gpu-bench-site." in done.stdout
    assert f"gpu_bench_probe import from {tmp_path}/gpu-bench-site." in checks["wheels"]
    assert "428.2M parameters in the vision tower" in checks["SigLIP2 so400m-patch14-384"]
    assert "logits (2, 3600, 3)" in checks["OWLv2 base-patch16 960"]
    for model in ("yolo11m", "yolo11l"):
        assert "network input 640x384" in checks[model]
    assert "none failed" in checks["sections ran"]

    rows = json.loads((out / "gpu.json").read_text())["rows"]
    sections = [row["section"] for row in rows]
    assert [s.split(":")[0] for s in sections] == ["filter"] * 2 + ["detect"] * 2 + [
        "dedup 11,500 x 768"
    ] * 3 + ["decode", "decode video"]
    assert all(row["ours"] and not row["ours"].startswith("failed") for row in rows)
    # the product's deduplicate (here on the CPU engine, the IVF path) against device="cpu"
    product = next(row["values"] for row in rows if "product deduplicate" in row["section"])
    assert product["same_frames_as_cpu"] is True
    assert product["planted_groups_at_one"] == product["planted_groups"] == 1001
    assert product["random_removed"] == 0 and product["recall"] is not None
    detect = {row["section"]: row for row in rows if row["section"].startswith("detect")}
    assert all({"predict_per_s", "prepare_per_s"} & set(row["values"]) for row in detect.values())
    table = (out / "gpu.md").read_text()
    assert all(f"| {section} |" in table for section in sections)
    # the temporary install is gone again
    assert not list(tmp_path.glob("gpu-bench-site.*"))


@pytest.fixture(scope="module")
def gpu_bench():
    """bench/gpu.py as a module (its sections import their neighbours from bench/)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_bench"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_bench", None)
        sys.path.remove(str(REPO / "bench"))


def test_a_failing_section_is_a_problem_of_the_dry_run(gpu_bench, tmp_path):
    """The dry run can fail: a section that raises leaves a failed row, which the check names."""
    import torch

    bench = gpu_bench.Bench(
        "dry", gpu_bench.SIZES["dry"], torch.device("cpu"), tmp_path, deadline=float("inf")
    )

    def broken() -> list:
        raise RuntimeError("this section is broken")

    gpu_bench.guarded(bench, "decode", broken)
    assert bench.rows[0].ours == "failed: RuntimeError: this section is broken"
    with pytest.raises(RuntimeError, match=r"failed or were skipped: \['decode'\]"):
        gpu_bench._check_rows(bench)


def test_every_size_preset_caps_every_section(gpu_bench, monkeypatch):
    assert "7 sections" in gpu_bench._check_sections()
    monkeypatch.delitem(gpu_bench.SIZES["full"]["caps"], "owlv2")
    with pytest.raises(KeyError, match=r"size preset full has no time cap for \['owlv2'\]"):
        gpu_bench._check_sections()
