"""The test suite as CI runs it, timed, and where its CPU goes.

A fresh clone of the repository at a commit runs `.ci/run` (the install from scratch, then README
command 2), as CI does, with CI=true. The run is timed from the start to the first test (the
install) and to the end, and the machine's busy share and CPU seconds are read from /proc/stat
before and after, so run nothing else meanwhile. Two recorders ride along, from
bench/suite_accounting/ on PYTHONPATH: every Python process the suite starts records its own CPU
when it exits (sitecustomize.py; a process killed by a signal is not recorded, nor is anything
that is not Python, PostgreSQL and Chromium among them), and a pytest plugin records each test's
CPU in the xdist worker that ran it (suite_cpu.py). The report: the totals, the CPU of the
recorded processes by kind and by test module, and the tests that cost the most.

    python bench/suite.py                          # HEAD of this repository
    python bench/suite.py --commit main --workdir /tmp/suite --json suite.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ACCOUNTING = Path(__file__).resolve().parent / "suite_accounting"


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def read_lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kind(process: dict) -> str:
    """What a recorded process was, from its arguments."""
    argv = process["argv"]
    program = argv[0] if argv else ""
    if program == "-c" and len(argv) == 1 and not process["test"]:
        return "xdist workers (the tests' own work)"
    if "api" in argv and "grpc" in argv:
        return "code servers and their run workers"
    if program.startswith("dagster-daemon") or "-w" in argv:
        return "dagster-daemon"
    if program.startswith("dagster-webserver"):
        return "dagster-webserver"
    if program == "dataminer" or (program == "-c" and argv[1:2] == ["run"]):
        return f"dataminer {argv[1] if len(argv) > 1 else ''}".strip()
    if "pip" in program:
        return "pip (and its build steps)"
    if program.startswith("label-studio"):
        return "label-studio"
    if program == "-c":
        return "python -c (multiprocessing children, resource trackers, snippets)"
    return program or "(no arguments)"


def summarise(processes: list[dict], tests: list[dict]) -> dict:
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for process in processes:
        entry = by_kind[kind(process)]
        entry[0] += 1
        entry[1] += process["cpu_s"]
    by_module: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"tests": 0, "in_worker_cpu_s": 0.0, "processes": 0, "processes_cpu_s": 0.0}
    )
    per_test: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"in_worker_cpu_s": 0.0, "wall_s": 0.0, "processes_cpu_s": 0.0}
    )
    for test in tests:
        if "test" not in test:
            continue
        module = by_module[test["test"].split("::")[0]]
        module["tests"] += 1
        module["in_worker_cpu_s"] += test["cpu_s"]
        per_test[test["test"]]["in_worker_cpu_s"] += test["cpu_s"]
        per_test[test["test"]]["wall_s"] += test["wall_s"]
    for process in processes:
        if process["test"]:
            module = by_module[process["test"].split("::")[0]]
            module["processes"] += 1
            module["processes_cpu_s"] += process["cpu_s"]
            per_test[process["test"]]["processes_cpu_s"] += process["cpu_s"]
    return {
        "by_kind": {
            k: {"processes": n, "cpu_s": round(cpu, 1)}
            for k, (n, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][1])
        },
        "by_module": _costliest_first(by_module),
        "tests": _costliest_first(per_test),
    }


def _costliest_first(entries: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """`entries` ordered by their CPU in the worker and in the processes they started."""
    return dict(
        sorted(entries.items(), key=lambda e: -(e[1]["in_worker_cpu_s"] + e[1]["processes_cpu_s"]))
    )


def run_suite(commit: str, workdir: Path) -> dict:
    clone = workdir / "clone"
    accounting = workdir / "accounting"
    accounting.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = {
        **os.environ,
        "CI": "true",
        "PYTHONPATH": str(ACCOUNTING),
        "PYTEST_ADDOPTS": " ".join([os.environ.get("PYTEST_ADDOPTS", ""), "-p suite_cpu"]),
        "DATAMINER_SUITE_ACCOUNTING": str(accounting),
    }
    log = workdir / "ci.log"
    load_before = os.getloadavg()
    busy0, total0 = cpu_ticks()
    started = time.time()
    with log.open("w") as out:
        returncode = subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    ended = time.time()
    busy1, total1 = cpu_ticks()
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    tests = read_lines(accounting / "tests.jsonl")
    session = [t["session_started"] for t in tests if "session_started" in t]
    summary_line = next(
        (
            line
            for line in reversed(log.read_text().splitlines())
            if line.startswith("=") and (" passed" in line or " failed" in line or " error" in line)
        ),
        "",
    )
    return {
        "commit": subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip(),
        "returncode": returncode,
        "pytest": summary_line.strip("= "),
        "wall_s": round(ended - started, 1),
        "install_s": round(session[0] - started, 1) if session else None,
        "cpu_s": round((busy1 - busy0) / ticks_per_s, 1),
        "busy": round((busy1 - busy0) / (total1 - total0), 3),
        "cores": os.cpu_count(),
        "load_before": [round(v, 2) for v in load_before],
        "log": str(log),
        **summarise(read_lines(accounting / "processes.jsonl"), tests),
    }


def report(result: dict, top: int) -> None:
    print(f"commit {result['commit']}: .ci/run exit {result['returncode']}; {result['pytest']}")
    print(
        f"wall {result['wall_s']:.0f} s (install {result['install_s']} s), "
        f"{result['cpu_s']:.0f} CPU-s on {result['cores']} cores, busy {result['busy']:.0%}, "
        f"load before {result['load_before'][0]}"
    )
    recorded = sum(k["cpu_s"] for k in result["by_kind"].values())
    print(f"\nrecorded Python processes by kind ({recorded:.0f} CPU-s of the machine's):")
    for name, entry in result["by_kind"].items():
        print(f"  {entry['cpu_s']:7.0f} CPU-s  {entry['processes']:4d}  {name}")
    print("\nby test module: CPU-s in the worker + CPU-s of the processes its tests started")
    for module, entry in list(result["by_module"].items())[:top]:
        print(
            f"  {entry['in_worker_cpu_s']:6.0f} + {entry['processes_cpu_s']:6.0f}"
            f" ({entry['processes']:3d} processes)  {entry['tests']:4d} tests  {module}"
        )
    print("\ncostliest tests: CPU-s in the worker + CPU-s of their processes, wall s")
    for test, entry in list(result["tests"].items())[:top]:
        print(
            f"  {entry['in_worker_cpu_s']:6.1f} + {entry['processes_cpu_s']:6.1f}"
            f"  {entry['wall_s']:6.0f} s  {test}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="what to clone and run")
    parser.add_argument("--workdir", type=Path, help="keep the clone, log and records here")
    parser.add_argument("--top", type=int, default=15, help="modules and tests listed")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dataminer-suite-"))
    result = run_suite(args.commit, workdir)
    report(result, args.top)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
