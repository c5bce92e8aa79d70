"""A calibration's sample on disk, its yes/no review in a labelling tool, and the report.

The sample (`SampledFrames`, `sample.json` in the project's calibration folder) keeps what the
estimates need after the review: the strata with their sizes, each sampled frame's stable id
(`<video>_<frame:06d>.<ext>`, as the dataset names frames), score, stratum and whether the rest
of the filter rule lets it through, and the score and stratum of every frame it lets through (how
many a threshold keeps is counted, not estimated). The answers (`answers.json` beside it) map ids to
yes (the frame is what the project wants) or no.

Out: one Label Studio task per sampled frame with the id in `data.frame`, and a labelling
interface of one required yes/no choice; for CVAT, the images alone (a task with the labels
`yes` and `no`, answered as tags). Back: Label Studio's JSON export (each task's latest
answer that was not skipped) or CVAT's "CVAT for images 1.1" XML (each image's yes or no tag).
An export naming frames the sample does not have is refused whole.

No Dagster, no SQL.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

import numpy as np

from dataminer_dagster.assets.filter.calibration import Answers, Estimate, Sample, Stratum
from dataminer_dagster.core.label_studio_export import task_answer

if TYPE_CHECKING:
    import pandas as pd

SAMPLE_FILE = "sample.json"
ANSWERS_FILE = "answers.json"
SAMPLE_FORMAT = "dataminer-calibration/2"
IMAGE_FIELD = "image"
FRAME_FIELD = "frame"
ANSWER_CONTROL = "match"
YES, NO = "yes", "no"
MISMATCHES_SHOWN = 5


class CalibrationImportError(ValueError):
    """An export that does not fit the sample; nothing of it was imported."""


def frame_id(video_id: str, frame_index: int, file: str) -> str:
    return f"{video_id}_{int(frame_index):06d}{PurePosixPath(file).suffix}"


@dataclass(frozen=True)
class SampledFrames:
    """A drawn sample as it is kept: enough to weigh its answers without the filter tables."""

    model: str
    prompts: tuple[str, ...]  # the positive prompts, in the config's order
    rule: Mapping[str, Any]  # the rest of the filter rule it was drawn under (`rule_of`)
    population: int  # frames of the project when it was drawn
    seed: int
    strata: tuple[Stratum, ...]
    ids: tuple[str, ...]
    score: np.ndarray  # float32
    stratum_of: np.ndarray  # int64
    rule_allows: np.ndarray  # bool
    allowed_scores: np.ndarray  # float32, ascending: of every frame the rest of the rule allows
    allowed_strata: np.ndarray  # int64: the stratum of each of those frames

    def kept(self, threshold: float) -> int:
        """Frames of the project the filter keeps at `threshold` (when the sample was drawn)."""
        above = np.searchsorted(self.allowed_scores, np.float32(threshold), side="right")
        return len(self.allowed_scores) - int(above)

    def answers(self, said: Mapping[str, bool]) -> Answers:
        """The answered frames (`said`: id -> yes) as the estimates take them."""
        rows = np.array([i in said for i in self.ids], bool)
        return Answers(
            self.strata,
            self.stratum_of[rows],
            self.score[rows],
            self.rule_allows[rows],
            np.array([said[i] for i in self.ids if i in said], bool),
            self.allowed_scores,
            self.allowed_strata,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SAMPLE_FORMAT,
            "model": self.model,
            "prompts": list(self.prompts),
            "rule": dict(self.rule),
            "population": self.population,
            "seed": self.seed,
            "strata": [[s.prompt, s.low, s.high, s.size] for s in self.strata],
            "frames": [
                [i, float(s), int(h), bool(a)]
                for i, s, h, a in zip(
                    self.ids, self.score, self.stratum_of, self.rule_allows, strict=True
                )
            ],
            "allowed_scores": [float(s) for s in self.allowed_scores],
            "allowed_strata": [int(h) for h in self.allowed_strata],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SampledFrames:
        if data.get("format") != SAMPLE_FORMAT:
            raise ValueError(
                f"not a {SAMPLE_FORMAT} sample (format {data.get('format')!r}): draw a new one"
            )
        frames = data["frames"]
        return cls(
            data["model"],
            tuple(data["prompts"]),
            dict(data["rule"]),
            int(data["population"]),
            int(data["seed"]),
            tuple(Stratum(int(p), float(lo), float(hi), int(n)) for p, lo, hi, n in data["strata"]),
            tuple(f[0] for f in frames),
            np.array([f[1] for f in frames], np.float32),
            np.array([f[2] for f in frames], np.int64),
            np.array([f[3] for f in frames], bool),
            np.array(data["allowed_scores"], np.float32),
            np.array(data["allowed_strata"], np.int64),
        )


def rule_of(config: Any) -> dict[str, Any]:
    """What decides, besides the positive prompts and threshold, whether the filter keeps a
    frame (a project config's `filter:` section): a sample's `rule_allows` holds for it only."""
    names = ("negative_prompts", "junk_prompts", "negative_threshold", "pos_neg_margin")
    names += ("junk_threshold", "pos_junk_margin")
    return {name: getattr(config, name) for name in names}


def sampled_frames(
    population: pd.DataFrame, sample: Sample, config: Any, seed: int
) -> SampledFrames:
    """The sample drawn from `population` (the filter's `scored_frames`) as it is kept, for
    the project config's `filter:` section `config`."""
    chosen = population.iloc[sample.frames]
    allowed = population["rule_allows"].to_numpy(bool)
    allowed_scores = population["pos_max"].to_numpy(np.float32)[allowed]
    by_score = np.argsort(allowed_scores, kind="stable")
    return SampledFrames(
        config.model,
        tuple(config.positive_prompts),
        rule_of(config),
        len(population),
        seed,
        sample.strata,
        frame_ids(chosen),
        chosen["pos_max"].to_numpy(np.float32),
        sample.stratum_of,
        chosen["rule_allows"].to_numpy(bool),
        allowed_scores[by_score],
        sample.population_strata[allowed][by_score],
    )


def with_more_frames(
    sampled: SampledFrames, population: pd.DataFrame, frames: np.ndarray, strata: np.ndarray
) -> SampledFrames:
    """`sampled` with the frames at positions `frames` of `population` (the one it was drawn
    from), of strata `strata`, added after its own."""
    chosen = population.iloc[frames]
    return replace(
        sampled,
        ids=sampled.ids + frame_ids(chosen),
        score=np.concatenate([sampled.score, chosen["pos_max"].to_numpy(np.float32)]),
        stratum_of=np.concatenate([sampled.stratum_of, np.asarray(strata, np.int64)]),
        rule_allows=np.concatenate([sampled.rule_allows, chosen["rule_allows"].to_numpy(bool)]),
    )


def frame_ids(frames: pd.DataFrame) -> tuple[str, ...]:
    """The stable ids of scored frames (rows of the filter's `scored_frames`)."""
    return tuple(
        frame_id(v, i, f)
        for v, i, f in zip(frames["video_id"], frames["frame_index"], frames["file"], strict=True)
    )


def save_json(path: Path, document: Any) -> None:
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(document, indent=1) + "\n")
    staged.replace(path)


def load_sample(directory: Path) -> SampledFrames | None:
    path = directory / SAMPLE_FILE
    return SampledFrames.from_json(json.loads(path.read_text())) if path.is_file() else None


def load_answers(directory: Path) -> dict[str, bool]:
    path = directory / ANSWERS_FILE
    return {k: bool(v) for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}


# -- out ----------------------------------------------------------------------------------------


def question(prompts: Sequence[str]) -> str:
    shown = " or ".join(f'"{p}"' for p in prompts)
    return f"Does this frame show {shown}, as the project wants it?"


def label_studio_config(prompts: Sequence[str]) -> str:
    """The labelling interface: the question, the image, and a required yes/no choice."""
    return (
        "<View>\n"
        f'  <Header value="{escape(question(prompts), {chr(34): "&quot;"})}"/>\n'
        f'  <Image name="{IMAGE_FIELD}" value="${IMAGE_FIELD}"/>\n'
        f'  <Choices name="{ANSWER_CONTROL}" toName="{IMAGE_FIELD}" choice="single" '
        'required="true">\n'
        f'    <Choice value="{YES}"/>\n'
        f'    <Choice value="{NO}"/>\n'
        "  </Choices>\n"
        "</View>\n"
    )


def label_studio_tasks(ids: Sequence[str], image_url: Callable[[str], str]) -> list[dict[str, Any]]:
    """One task per sampled frame (`ids`, in the sample's random order). The score is not shown
    to the reviewer: it is in the sample's file, not in the task."""
    return [{"data": {IMAGE_FIELD: image_url(i), FRAME_FIELD: i}} for i in ids]


# -- back ---------------------------------------------------------------------------------------


def read_answers(path: Path) -> tuple[str, dict[str, bool]]:
    """(the format's name, id -> yes) of a Label Studio JSON export or a CVAT XML export."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationImportError(f"{path}: cannot be read ({error})") from None
    if text.lstrip().startswith("<"):
        return "cvat", _read_cvat(path, text)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CalibrationImportError(
            f"{path}: neither a Label Studio JSON export nor a CVAT XML export ({error})"
        ) from None
    if not isinstance(document, list):
        raise CalibrationImportError(f"{path}: a Label Studio JSON export is a list of tasks")
    return "label-studio", _read_label_studio(document)


def _read_label_studio(tasks: Iterable[Any]) -> dict[str, bool]:
    said: dict[str, bool] = {}
    for position, task in enumerate(tasks):
        data = task.get("data") if isinstance(task, dict) else None
        frame = (data or {}).get(FRAME_FIELD)
        if not isinstance(frame, str) or not frame:
            raise CalibrationImportError(
                f"task {position + 1} has no data.{FRAME_FIELD}: it was not exported by "
                "`dataminer calibrate export`"
            )
        answer = task_answer(task)
        if answer is None:
            continue
        choices = [
            choice
            for result in answer.get("result") or []
            if result.get("type") == "choices" and result.get("from_name") == ANSWER_CONTROL
            for choice in (result.get("value") or {}).get("choices") or []
        ]
        if choices in ([YES], [NO]):
            said[frame] = choices == [YES]
    return said


def _read_cvat(path: Path, text: str) -> dict[str, bool]:
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise CalibrationImportError(
            f"{path}: not an XML file that can be read ({error})"
        ) from None
    said: dict[str, bool] = {}
    for image in root.iter("image"):
        tags = {t.get("label") for t in image.iter("tag")} & {YES, NO}
        if len(tags) == 1:
            said[PurePosixPath(image.get("name", "")).name] = tags == {YES}
    return said


def check_fits(said: Mapping[str, bool], sample: SampledFrames) -> None:
    unknown = sorted(set(said) - set(sample.ids))
    if unknown:
        more = (
            f" (and {len(unknown) - MISMATCHES_SHOWN} more)"
            if len(unknown) > MISMATCHES_SHOWN
            else ""
        )
        raise CalibrationImportError(
            f"{len(unknown)} of the export's {len(said)} answered frames are not in the "
            f"calibration sample, for example {', '.join(unknown[:MISMATCHES_SHOWN])}{more}: "
            "was it exported from another sample or project?"
        )
    if not said:
        raise CalibrationImportError(
            f"the export answers none of the sample's frames {YES} or {NO}"
        )


# -- the report ---------------------------------------------------------------------------------


def _share(value: float, interval: tuple[float, float]) -> str:
    if math.isnan(value):
        return f"{'-':>18}"
    return f"{value:5.2f} [{interval[0]:.2f}-{interval[1]:.2f}]"


def table_lines(
    rows: Sequence[Estimate], kept: Callable[[float], int], marks: Mapping[float, str]
) -> list[str]:
    """The report's table: per threshold, the frames kept, precision and recall."""
    lines = [f"  {'threshold':>9} {'kept':>8}  {'precision':<18} {'recall':<18}"]
    for e in rows:
        mark = marks.get(e.threshold, "")
        lines.append(
            f"  {e.threshold:9.4f} {kept(e.threshold):8d}  "
            f"{_share(e.precision, e.precision_interval):<18} "
            f"{_share(e.recall, e.recall_interval):<18} {mark}".rstrip()
        )
    return lines
