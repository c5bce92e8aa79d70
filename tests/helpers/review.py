"""The review round trip's tests: a reviewer's answers as Label Studio exports them, and a real
Label Studio server."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def as_answered(tasks: list[dict], *, skip: tuple[str, ...] = ()) -> list[dict]:
    """Label Studio's JSON export of `tasks` where a reviewer submitted each prediction as it was
    (what accepting a prediction does in the tool), except the tasks whose frame is in `skip`."""
    exported = []
    for n, task in enumerate(copy.deepcopy(tasks), start=1):
        task["id"] = n
        if task["data"]["frame"] not in skip:
            task["annotations"] = [
                {
                    "id": n,
                    "result": copy.deepcopy(task["predictions"][0]["result"]),
                    "was_cancelled": False,
                    "ground_truth": False,
                    "created_at": "2026-12-03T10:00:00Z",
                    "updated_at": "2026-12-03T10:00:00Z",
                }
            ]
        exported.append(task)
    return exported


# -- a real Label Studio, in its own virtual environment ----------------------------------------

# Label Studio pins older numpy and pyarrow and brings opencv-python-headless beside our
# opencv-python: it cannot share the product's environment, so the tests install it in its own
# (once; reused by later runs), as docs/datasets.md tells users to.
LABEL_STUDIO_VERSION = "1.23.2"
LABEL_STUDIO_VENV = Path(__file__).resolve().parents[2] / ".cache" / "label-studio"
MIGRATED_DATA_DIR = LABEL_STUDIO_VENV / "migrated"
USER, PASSWORD, TOKEN = "reviewer@example.com", "review-password-1", "dataminer-test-token-1"


def label_studio_executable() -> tuple[Path | None, str]:
    """The `label-studio` command to test with, or None and why: $DATAMINER_TEST_LABEL_STUDIO,
    else one installed from the package index into .cache/label-studio. One install at a time
    (a lock: .ci/run starts it in the background while the product installs, and the test waits
    for it); a venv's scripts name its path, so it is installed in place, and a marker says the
    install finished (its database migrated too)."""
    given = os.environ.get("DATAMINER_TEST_LABEL_STUDIO")
    if given:
        return Path(given), ""
    LABEL_STUDIO_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(LABEL_STUDIO_VENV.with_name("label-studio.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _installed_label_studio()


def _installed_label_studio() -> tuple[Path | None, str]:
    executable = LABEL_STUDIO_VENV / "bin" / "label-studio"
    finished = LABEL_STUDIO_VENV / "installed"
    if finished.is_file() and executable.is_file():
        return executable, ""
    shutil.rmtree(LABEL_STUDIO_VENV, ignore_errors=True)
    pip = [
        LABEL_STUDIO_VENV / "bin" / "pip",
        "install",
        "-q",
        "--no-compile",  # its first start compiles what it imports, a fraction of the files
        f"label-studio=={LABEL_STUDIO_VERSION}",
    ]
    steps = {"python -m venv": [sys.executable, "-m", "venv", str(LABEL_STUDIO_VENV)], "pip": pip}
    for step, command in steps.items():
        install = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if install.returncode != 0:
            shutil.rmtree(LABEL_STUDIO_VENV, ignore_errors=True)
            last = (install.stdout.strip().splitlines() or ["no output"])[-1]
            return None, (
                f"label-studio=={LABEL_STUDIO_VERSION} could not be installed in its own "
                f"environment ({step} failed: {last}; is the package index reachable?)"
            )
    migrated = _migrate(executable, MIGRATED_DATA_DIR)
    if migrated.returncode != 0:
        shutil.rmtree(LABEL_STUDIO_VENV, ignore_errors=True)
        return None, (
            f"label-studio=={LABEL_STUDIO_VERSION} could not create its database: "
            + (migrated.stdout.strip().splitlines() or ["no output"])[-1]
        )
    finished.write_text(LABEL_STUDIO_VERSION + "\n")
    return executable, ""


def _migrate(executable: Path, data_dir: Path) -> subprocess.CompletedProcess:
    """Label Studio's database, migrated once at install: every start of a server copies it
    (a first start would spend most of its time migrating)."""
    return subprocess.run(
        [executable, "version"],
        env=_server_env(data_dir, data_dir),
        cwd=data_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _server_env(data_dir: Path, document_root: Path) -> dict[str, str]:
    # Label Studio also reads its settings without their LABEL_STUDIO_ prefix.
    unprefixed = ("HOST", "PORT", "USERNAME", "PASSWORD", "DATABASE_NAME", "DJANGO_DB")
    env = {k: v for k, v in os.environ.items() if k not in unprefixed}
    env.update(
        LABEL_STUDIO_BASE_DATA_DIR=str(data_dir),
        LABEL_STUDIO_USERNAME=USER,
        LABEL_STUDIO_PASSWORD=PASSWORD,
        LABEL_STUDIO_USER_TOKEN=TOKEN,
        LOCAL_FILES_SERVING_ENABLED="true",
        LOCAL_FILES_DOCUMENT_ROOT=str(document_root),
        SENTRY_DSN="",
        FRONTEND_SENTRY_DSN="",
        LATEST_VERSION_CHECK="false",
        COLLECT_ANALYTICS="false",
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    return env


@contextmanager
def label_studio_server(executable: Path, data_dir: Path, document_root: Path) -> Iterator[str]:
    """A Label Studio on 127.0.0.1 with its own SQLite in `data_dir`, serving local files under
    `document_root`, signed in with the legacy token TOKEN; yields its URL."""
    import requests

    from tests.helpers.ports import unused_port

    env = _server_env(data_dir, document_root)
    shutil.copytree(MIGRATED_DATA_DIR, data_dir, dirs_exist_ok=True)
    port = unused_port()
    url = f"http://127.0.0.1:{port}"
    log = open(data_dir / "server.log", "w")  # noqa: SIM115 (open while the server runs)
    server = subprocess.Popen(
        [
            executable,
            "start",
            "--no-browser",
            "--internal-host",
            "127.0.0.1",
            "--port",
            str(port),
            "--enable-legacy-api-token",
        ],
        env=env,
        cwd=data_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (data_dir / "server.log").read_text()[-3000:]
            # A server still starting may accept the connection and answer late: both are waits.
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "Label Studio did not answer within 300 s"
            time.sleep(0.5)
        yield url
    finally:
        from tests.helpers.processes import stop_group

        stop_group(server)
        log.close()


# -- the project a test reviews ---------------------------------------------------------------


def use_changing_data(database_url: str, tmp_path: Path, monkeypatch) -> None:
    """Point the CLI at the `changing` project's database and data directory."""
    from dataminer_dagster.testing import environment_for

    for name, value in environment_for(database_url, tmp_path / "home").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATAMINER_DATA_DIR", str(tmp_path / "data"))


def boxes(coco: dict) -> dict[str, list[tuple]]:
    """file name -> its boxes (class id, bbox, score), in the file's order."""
    file_of = {i["id"]: i["file_name"] for i in coco["images"]}
    found: dict[str, list[tuple]] = {name: [] for name in file_of.values()}
    for a in coco["annotations"]:
        found[file_of[a["image_id"]]].append((a["category_id"], a["bbox"], a.get("score")))
    return found


if __name__ == "__main__":  # .ci/run: install it while the product installs
    print(label_studio_executable())
