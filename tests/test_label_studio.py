"""The review round trip against a real Label Studio server started on 127.0.0.1 (its own SQLite):
`dataminer review push` makes a project of the dataset's images with the boxes as predictions,
a reviewer answers through Label Studio's API, `dataminer review pull` brings the answers back.
An unchanged review is the identity; corrections make a new version.

Label Studio is installed in its own environment (tests/helpers/review.py); where it cannot be
installed the test is skipped and says why."""

from __future__ import annotations

import json

import pytest
import requests
from click.testing import CliRunner

from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE
from dataminer_dagster.assets.dataset.dataset_versions import diff_versions, list_versions
from dataminer_dagster.cli import main
from tests.helpers.project_runs import dataminer
from tests.helpers.review import (
    TOKEN,
    boxes,
    label_studio_executable,
    label_studio_server,
    use_changing_data,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def label_studio():
    executable, why = label_studio_executable()
    if executable is None:
        pytest.skip(why)
    return executable


def test_a_review_in_label_studio_comes_back(
    label_studio, changing, database_url, tmp_path, monkeypatch
):
    changing.run()
    use_changing_data(database_url, tmp_path, monkeypatch)
    dataset = changing.output.dataset_dir
    v1_coco = json.loads((dataset / COCO_FILE).read_text())
    names = list(changing.manifest()["file_name"])

    with label_studio_server(label_studio, tmp_path / "label-studio", tmp_path) as url:
        monkeypatch.setenv("LABEL_STUDIO_URL", url)
        monkeypatch.setenv("LABEL_STUDIO_API_KEY", TOKEN)
        said = dataminer("review", "push", "changing", "--document-root", str(tmp_path))
        assert f"{len(names)} tasks of project changing in Label Studio" in said
        pushed = json.loads((changing.output.review_dir / "label_studio.json").read_text())
        api = requests.Session()
        api.headers["Authorization"] = f"Token {TOKEN}"
        listed = api.get(
            f"{url}/api/tasks",
            params={"project": pushed["project"], "fields": "all", "page_size": 1000},
        )
        tasks = {t["data"]["frame"]: t for t in listed.json()["tasks"]}
        assert sorted(tasks) == sorted(names)
        picture = api.get(url + tasks[names[0]]["data"]["image"])  # Label Studio serves it
        assert picture.status_code == 200 and picture.headers["Content-Type"].startswith("image/")
        assert picture.content == (dataset / "images" / names[0]).read_bytes()

        # The reviewer submits every prediction as it is.
        answer_of = {}
        for name, task in tasks.items():
            [prediction] = task["predictions"]
            answer_of[name] = api.post(
                f"{url}/api/tasks/{task['id']}/annotations/",
                json={"result": prediction["result"], "parent_prediction": prediction["id"]},
            ).json()["id"]
        said = dataminer("review", "pull", "changing", "--no-wait")
        assert f"{len(names)} answered tasks" in said and f"{len(names)} accepted" in said
        changing.run()
        assert [v.number for v in list_versions(changing.output.dataset_versions_dir)] == [1]
        assert boxes(json.loads((dataset / COCO_FILE).read_text())) == boxes(v1_coco)
        assert set(changing.manifest()["review"]) == {"accepted"}

        # Then corrects four images: a box moved, all boxes deleted, one added, one rejected.
        with_boxes = [n for n in names if tasks[n]["predictions"][0]["result"]]
        moved, emptied, added, rejected = with_boxes[:4]
        result = {n: json.loads(json.dumps(tasks[n]["predictions"][0]["result"])) for n in names}
        result[moved][0]["value"]["x"] += 10.0
        result[emptied] = []
        extra = json.loads(json.dumps(result[added][0]))
        extra.update(id="added-by-reviewer")
        extra["value"].update(x=1.0, y=1.0, width=20.0, height=20.0)
        extra.pop("score", None)
        result[added].append(extra)
        result[rejected] = [
            {
                "id": "reject",
                "type": "choices",
                "from_name": "review",
                "to_name": "image",
                "value": {"choices": ["reject"]},
            }
        ]
        for name in (moved, emptied, added, rejected):
            changed = api.patch(
                f"{url}/api/annotations/{answer_of[name]}/", json={"result": result[name]}
            )
            assert changed.status_code == 200, changed.text
        said = dataminer("review", "pull", "changing")

    assert "3 corrected, 1 rejected" in said and "dataset of changing is v2" in said
    versions_dir = changing.output.dataset_versions_dir
    diff = diff_versions(versions_dir, 1, 2)
    assert diff.removed == [rejected]
    assert sorted(diff.relabelled) == sorted([moved, emptied, added])
    after = changing.manifest().set_index("file_name")
    assert after.loc[[moved, emptied, added], "review"].tolist() == ["corrected"] * 3
    coco = boxes(json.loads((dataset / COCO_FILE).read_text()))
    before = boxes(v1_coco)
    assert coco[emptied] == [] and len(coco[added]) == len(before[added]) + 1
    assert all(coco[n] == before[n] for n in set(coco) - {moved, emptied, added})
    assert "## Review" in (dataset / "report.md").read_text()


def test_a_calibration_sample_is_answered_in_label_studio(
    label_studio, changing, database_url, tmp_path, monkeypatch
):
    """`dataminer calibrate push` makes a yes/no project that Label Studio accepts and serves
    the frames of; the answers given through its API come back with `calibrate pull`; `push
    --more` adds frames to the sample and to that project."""
    changing.run()
    use_changing_data(database_url, tmp_path, monkeypatch)
    with label_studio_server(label_studio, tmp_path / "label-studio", tmp_path) as url:
        monkeypatch.setenv("LABEL_STUDIO_URL", url)
        monkeypatch.setenv("LABEL_STUDIO_API_KEY", TOKEN)
        said = dataminer(
            "calibrate", "push", "changing", "--frames", "6", "--document-root", str(tmp_path)
        )
        assert "6 of the" in said and "frames of project changing in Label Studio" in said
        pushed = json.loads(
            (changing.output.root / "calibration" / "label_studio.json").read_text()
        )
        api = requests.Session()
        api.headers["Authorization"] = f"Token {TOKEN}"
        listed = _tasks(api, url, pushed["project"])
        assert len(listed) == 6
        _served(api, url, listed[0], changing.output.root / "calibration" / "review" / "images")
        for n, task in enumerate(listed):
            _answer(api, url, task, "yes" if n % 2 else "no")
        said = dataminer("calibrate", "pull", "changing")
        assert "imported 6 answers (label-studio): 3 yes, 3 no" in said
        assert "recommended positive_threshold" in said
        assert "`dataminer calibrate push changing --more` adds frames" in said

        # Frames added to the sample go into the same Label Studio project, served beside the
        # first ones; pull brings every answer back.
        said = dataminer(
            "calibrate",
            "push",
            "changing",
            "--more",
            "--frames",
            "4",  # the project has 8 frames: 2 are left
            "--document-root",
            str(tmp_path),
        )
        assert "2 more of the 8 frames" in said and f"/projects/{pushed['project']})" in said, said
        assert "the sample has 8 frames now" in said, said
        first = {task["data"]["frame"] for task in listed}
        listed = _tasks(api, url, pushed["project"])
        added = [task for task in listed if task["data"]["frame"] not in first]
        assert len(listed) == 8 and len(added) == 2
        _served(api, url, added[0], changing.output.root / "calibration" / "review-8" / "images")
        for task in added:
            _answer(api, url, task, "yes")
        said = dataminer("calibrate", "pull", "changing")
    assert "imported 8 answers (label-studio): 5 yes, 3 no" in said, said
    assert "8 of the sample's 8 frames are answered" in said, said
    refused = CliRunner().invoke(
        main, ["calibrate", "export", "changing", str(tmp_path / "none"), "--more"]
    )
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert "every frame of project changing is in its calibration sample already" in refused.output


def _tasks(api, url: str, project: int) -> list[dict]:
    return api.get(
        f"{url}/api/tasks", params={"project": project, "fields": "all", "page_size": 100}
    ).json()["tasks"]


def _served(api, url: str, task: dict, images) -> None:
    """Label Studio serves the task's image: the frame in folder `images`."""
    picture = api.get(url + task["data"]["image"])
    assert picture.status_code == 200
    assert picture.content == (images / task["data"]["frame"]).read_bytes()


def _answer(api, url: str, task: dict, choice: str) -> None:
    answered = api.post(
        f"{url}/api/tasks/{task['id']}/annotations/",
        json={
            "result": [
                {
                    "type": "choices",
                    "from_name": "match",
                    "to_name": "image",
                    "value": {"choices": [choice]},
                }
            ]
        },
    )
    assert answered.status_code == 201, answered.text
