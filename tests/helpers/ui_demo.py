"""A demo project's Dagster history, the webserver on it, and the pages a user looks at.

`run_demo` runs `dataminer demo` (the README's command) with DAGSTER_HOME kept, so that the run
history stays; `webserver` serves that history with `dagster-webserver` on this repository's
workspace; `PAGES` are the pages the UI test opens and the screenshots in docs/ui show.

Screenshots for the docs (needs Chromium, e.g. Debian's package `chromium`):

    .venv/bin/python -m tests.helpers.ui_demo docs/ui
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dataminer_dagster.core.ui_links import partition_link
from tests.helpers.ports import unused_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(sys.executable).parent


def demo_environment(root: Path, database_url: str | None) -> dict[str, str]:
    """The variables a demo and its webserver share: a private home, this DAGSTER_HOME (with the
    repository's dagster.yaml: Dagster's storage in the same PostgreSQL), this database (None: the
    embedded server under the home)."""
    dagster_home = root / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        "DATAMINER_HOME": str(root / "home"),
        "DATAMINER_DATA_DIR": str(root / "home" / "data"),
        "DAGSTER_HOME": str(dagster_home),
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    if database_url is not None:
        env["DATAMINER_DATABASE_URL"] = database_url
    return env


def run_demo() -> str:
    """`dataminer demo` in this process, on the environment already set; its output."""
    from click.testing import CliRunner

    from dataminer_dagster.cli import main

    result = CliRunner().invoke(main, ["demo", "--port", "0", "--no-progress"])
    if result.exit_code != 0 or "project demo: complete" not in result.output:
        raise RuntimeError(f"the demo did not complete:\n{result.output}\n{result.exception!r}")
    return result.output


@contextmanager
def webserver(env: Mapping[str, str], timeout_s: float = 180) -> Iterator[str]:
    """dagster-webserver on this repository's workspace, with `env`; yields its base URL once
    the code location has loaded."""
    port = unused_port()
    log = open(Path(env["DAGSTER_HOME"]) / "webserver.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            str(BIN_DIR / "dagster-webserver"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            str(REPO_ROOT / "workspace.yaml"),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_loaded(base, process, timeout_s)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_loaded(base: str, process: subprocess.Popen, timeout_s: float) -> None:
    query = (
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
        "locationOrLoadError { __typename ... on PythonError { message } } } } } }"
    )
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {process.returncode}")
        try:
            request = urllib.request.Request(
                f"{base}/graphql",
                data=json.dumps({"query": query}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                entries = json.load(answer)["data"]["workspaceOrError"]["locationEntries"]
            last = json.dumps(entries)
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                errors = [
                    e
                    for e in entries
                    if e["locationOrLoadError"]["__typename"] != "RepositoryLocation"
                ]
                if errors:
                    raise RuntimeError(f"the code location did not load: {last}")
                return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"dagster-webserver did not load the code location in time: {last}")


# The asset graph with both groups open (the UI's group ids, with and without its per-location flag).
EXPANDED_GROUPS = ",".join(
    f"{prefix}:{group}"
    for prefix in ("global@global", "__repository__@dataminer_dagster.definitions")
    for group in ("ingest", "curation")
)


@dataclass(frozen=True)
class Page:
    """A page of the UI, how many previews (data-URI images) it must show without a click, and
    how many pictures it keeps behind [Show Markdown] (a stage's `..._picture` values)."""

    name: str  # the screenshot's file name, without .png
    path: str
    previews: int
    pictures: int = 0


def pages(video_partition: str) -> list[Page]:
    """The main pages, for a demo whose first project-video partition is `video_partition`."""
    return [
        Page("asset-graph", f"/asset-groups?expanded={EXPANDED_GROUPS}", 0),
        # the page `dataminer status NAME` links a failed item to (core/ui_links.py)
        Page(
            "filtered-frames-partition",
            partition_link("", ["filtered_frames"], video_partition),
            2,
            2,
        ),
        Page(
            "filtered-frames-events",
            f"/assets/filtered_frames?view=events&partition={video_partition}",
            2,
            2,
        ),
        Page("deduped-set-overview", "/assets/deduped_set", 1, 1),
        Page("deduped-set-events", "/assets/deduped_set?view=events", 1, 1),
        Page("detections-events", "/assets/detections?view=events", 1, 1),
        Page("dataset-events", "/assets/dataset?view=events", 2, 2),  # sample, quality report
        Page("frames-backup-events", "/assets/frames_backup?view=events", 0),
        Page("dataset-checks", "/assets/dataset?view=checks", 0),
    ]


# The previews of a page: every data-URI image, loaded (complete, with a size) and laid out (a box
# on the page, so not hidden in a dialog that takes a click to open).
PREVIEWS_JS = """(() => {
  const images = [...document.images].filter(i => i.src.startsWith('data:image/'));
  return images.map(i => {
    const box = i.getBoundingClientRect();
    return {complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
            shown: box.width > 0 && box.height > 0};
  });
})()"""


def open_page(browser, base: str, page: Page, timeout_s: float = 60) -> list[dict]:
    """Open `page` and wait until it shows its previews, all loaded (or, for a page without
    previews, until its content has rendered); the previews found."""
    browser.open(base + page.path)
    browser.wait_for(
        "document.querySelector('main, #root') && document.body.innerText.length > 200",
        timeout_s,
        what=f"{page.path} to render",
    )
    if page.previews == 0:
        time.sleep(2)  # charts and the graph lay themselves out after the data arrives
        return browser.evaluate(PREVIEWS_JS)
    deadline = time.monotonic() + timeout_s
    while True:
        found = browser.evaluate(PREVIEWS_JS)
        loaded = [i for i in found if i["complete"] and i["width"] > 0 and i["shown"]]
        if len(found) >= page.previews and len(loaded) == len(found):
            return found
        if time.monotonic() > deadline:
            return found  # the test says what is wrong with them
        time.sleep(0.25)


def dismiss_welcome(browser, base: str) -> None:
    """Dagster shows a 'join the community' dialog on localhost until it is dismissed once."""
    browser.open(base + "/")
    browser.wait_for("document.readyState === 'complete'", 60, what="the UI to load")
    browser.evaluate("localStorage.setItem('communityNux', JSON.stringify('1'))")


def previewed_video_partition(instance) -> str:
    """The first project-video partition whose filter shows previews: a copy of another video
    (the demo's world serves one behind a second URL) has no frames of its own to show."""
    import dagster as dg

    for key in sorted(instance.get_dynamic_partitions("project_videos")):
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(dg.AssetKey("filtered_frames"), asset_partitions=[key]), limit=1
        ).records
        if records and "same_as" not in records[0].asset_materialization.metadata:
            return key
    raise LookupError("no project-video partition of the demo has filter previews")


def previewed_partition_in(env: Mapping[str, str]) -> str:
    import dagster as dg

    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with dg.DagsterInstance.get() as instance:
            return previewed_video_partition(instance)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(destination: str) -> None:
    """Run a demo in a temporary directory and photograph the main pages into `destination`."""
    import tempfile

    from tests.helpers.browser import Browser, find_chromium

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("Chromium is not installed (Debian: apt-get install chromium)")
    out = Path(destination).resolve()
    with tempfile.TemporaryDirectory(prefix="dataminer-ui-") as root:
        env = demo_environment(Path(root), None)
        os.environ.update(env)
        run_demo()
        partition = previewed_partition_in(env)
        with webserver(env) as base, Browser(chromium) as browser:
            dismiss_welcome(browser, base)
            for page in pages(partition):
                open_page(browser, base, page)
                print(_compact(browser.screenshot(out / f"{page.name}.png")))
        subprocess.run(
            [str(BIN_DIR / "dataminer"), "db", "stop"], env={**os.environ, **env}, check=False
        )


def _compact(path: Path) -> Path:
    """The screenshot in 256 colours: half the bytes in the repository, the same to the eye."""
    from PIL import Image

    with Image.open(path) as shot:
        small = shot.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    small.save(path, "PNG", optimize=True)
    return path


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/ui")
