"""What must hold after a fault schedule (tests/helpers/faults.py), read from the database and the
disk once every worker has stopped:

- the project is complete and every work item is done (none lost, none dead);
- every file on disk matches the database: each frames folder and video file the database records
  exists, and nothing is left that it does not record (no unrecorded frames folder or video, no
  staging or set-aside sibling);
- no worker deleted files another worker was still working on under a live lease (its errors
  would say that its staging folder or its frames vanished; a worker whose lease was taken back
  may find its leftovers removed by the next holder, as the fencing wants);
- no worker exited because of a fault (a fault is something to wait out, not a reason to stop);
- a schedule made only of faults that must cost nothing (`faults.NO_COST_KINDS`) tried no item more
  often than the clean run did;
- the dataset is the clean run's: the same images byte for byte, the same manifest, the same
  COCO annotations and the same dataset versions.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from tests.helpers.daemon import read_dataset

LEFTOVER = re.compile(r"^\.(staging|replaced)-|\.(part|ytdl)$")
# How a worker says that files it was working on were taken from under it.
LIVE_FILES_GONE = re.compile(
    r"(FileNotFoundError|No such file or directory).*\.(staging|replaced)-|frames of video \S+ \(.*\) are missing"
)
# A worker's own word that its lease was gone when it failed, and the next holder's (or the
# reaper's) that it removed a dead lease's leftover: a staging folder that vanished under such a
# worker was no live holder's.
_LEASE_WAS_LOST = "failed after its lease was lost"
_DEAD_LEFTOVER_REMOVED = re.compile(r"removed (\S+), left by a worker whose lease is dead")
_LEFTOVER_NAME = re.compile(r"\.(?:staging|replaced)-[^/'\s]*")


@dataclass
class Outcome:
    schedule: object  # faults.Schedule
    stage: str | None
    items_not_done: list[str]
    recorded_missing: list[str]
    unrecorded: list[str]
    live_files_deleted: list[str]
    worker_exits: list[str]
    attempts: dict[str, int]  # "stage item" -> attempts
    extra_attempts: int  # beyond the clean run's, over all items
    dataset: dict | None
    dataset_difference: str | None
    notes: list[str] = field(default_factory=list)
    spent: list[str] = field(default_factory=list)  # items beyond the clean run's attempts
    log_tail: str = ""  # the end of the workers' logs
    work_seconds: float = 0.0
    finished: bool = True

    @property
    def outage_attempts(self) -> int:
        """Attempts spent beyond the clean run's where every fault must cost none."""
        return self.extra_attempts if self.schedule.no_cost else 0

    def problems(self) -> list[str]:
        found = []
        if not self.finished:
            found.append("workers were still running at the deadline")
        if self.stage != "complete":
            found.append(f"the project is {self.stage}")
        for what, items in (
            ("items not done", self.items_not_done),
            ("files the database records are missing", self.recorded_missing),
            ("files the database does not record", self.unrecorded),
            ("files of a live holder deleted", self.live_files_deleted),
            ("workers ended by a fault", self.worker_exits),
        ):
            if items:
                found.append(f"{what} ({len(items)}): " + "; ".join(items[:5]))
        if self.outage_attempts:
            found.append(
                f"{self.outage_attempts} attempts consumed by faults that must cost none: "
                + "; ".join(self.spent[:5])
            )
        if self.dataset_difference:
            found.append(f"the dataset is not the clean run's: {self.dataset_difference}")
        return found

    def report(self) -> str:
        lines = [f"schedule: {self.schedule.describe()}", *(f"  {n}" for n in self.notes)]
        problems = self.problems()
        lines += [f"problem: {p}" for p in problems] or ["no problem"]
        if problems:
            lines += ["--- the end of the workers' logs:", self.log_tail]
        return "\n".join(lines)


@dataclass(frozen=True)
class Reference:
    dataset: dict
    attempts: dict[str, int]
    work_seconds: float  # from the first item begun to the end

    @classmethod
    def of(cls, outcome: Outcome) -> Reference:
        if outcome.problems() or outcome.dataset is None:
            raise RuntimeError(f"the clean run failed its own checks:\n{outcome.report()}")
        return cls(outcome.dataset, outcome.attempts, outcome.work_seconds)


def check(trial, reference: Reference | None) -> Outcome:
    """The outcome of `trial` (faults.Trial, every worker stopped), against the clean run's
    `reference` (None: this is the clean run)."""
    engine = sa.create_engine(
        trial.url.replace("postgresql://", "postgresql+psycopg://"), poolclass=sa.pool.NullPool
    )
    try:
        with engine.connect() as c:
            stage = c.execute(sa.text("SELECT stage FROM dataminer.projects")).scalar()
            items = c.execute(
                sa.text(
                    "SELECT stage, item_key, status, attempts, last_error FROM dataminer.work_items"
                )
            ).all()
            frames = {
                r[0] for r in c.execute(sa.text("SELECT frames_dir FROM dataminer.video_frames"))
            }
            videos = {
                r[0]
                for r in c.execute(
                    sa.text("SELECT file_path FROM dataminer.videos WHERE file_path IS NOT NULL")
                )
            }
    finally:
        engine.dispose()
    attempts = {f"{r.stage} {r.item_key}": r.attempts for r in items}
    missing, unrecorded = files_against_records(trial.data_dir, frames, videos)
    unrecorded += [str(p) for p in leftovers(trial.output_dir)]
    errors = trial.logs().splitlines() + [r.last_error for r in items if r.last_error]
    dataset = dataset_print(trial.output_dir) if stage == "complete" else None
    return Outcome(
        schedule=trial.schedule,
        stage=stage,
        items_not_done=[f"{r.stage} {r.item_key}: {r.status}" for r in items if r.status != "done"],
        recorded_missing=missing,
        unrecorded=unrecorded,
        live_files_deleted=live_files_deleted(errors),
        worker_exits=[e for w in trial.workers for e in w.exits],
        attempts=attempts,
        extra_attempts=_extra_attempts(attempts, reference),
        spent=_spent(items, reference),
        dataset=dataset,
        dataset_difference=_dataset_difference(dataset, reference),
        notes=list(trial.notes),
        log_tail=trial.logs()[-6000:],
        work_seconds=trial.work_seconds,
        finished=trial.finished,
    )


def live_files_deleted(errors: list[str]) -> list[str]:
    """The workers' errors that say files they worked on were taken from under them while they
    held the lease. Not those of a worker that says its lease was already lost, about a leftover
    that another worker says it removed as a dead lease's: that is the fencing doing its work."""
    removed_as_dead = {
        name
        for line in errors
        if (removed := _DEAD_LEFTOVER_REMOVED.search(line))
        for name in _LEFTOVER_NAME.findall(removed.group(1))
    }

    def fenced(line: str) -> bool:
        names = _LEFTOVER_NAME.findall(line)
        return (
            _LEASE_WAS_LOST in line
            and bool(names)
            and all(any(r.startswith(n) for r in removed_as_dead) for n in names)
        )

    return sorted(
        {line.strip()[:300] for line in errors if LIVE_FILES_GONE.search(line) and not fenced(line)}
    )


def files_against_records(
    data_dir: Path, frames: set[str], videos: set[str]
) -> tuple[list[str], list[str]]:
    """(recorded but missing, on disk but not recorded), as paths relative to the data dir; the
    leftovers of unfinished changes count as not recorded."""
    on_disk = set()
    frames_root = data_dir / "frames"
    for video in sorted(frames_root.iterdir()) if frames_root.is_dir() else []:
        on_disk |= {str(p.relative_to(data_dir)) for p in video.iterdir()}
    videos_root = data_dir / "videos"
    on_disk |= (
        {str(p.relative_to(data_dir)) for p in videos_root.iterdir()}
        if videos_root.is_dir()
        else set()
    )
    recorded = frames | {v for v in videos if not Path(v).is_absolute()}
    missing = sorted(r for r in recorded if not (data_dir / r).exists())
    unrecorded = sorted(p for p in on_disk - recorded)
    return missing, unrecorded


def leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if LEFTOVER.search(p.name)) if root.is_dir() else []


def _spent(items, reference: Reference | None) -> list[str]:
    """The items that took more attempts than in the clean run, each with its last error."""
    if reference is None:
        return []
    return [
        f"{r.stage} {r.item_key}: {r.attempts} attempts (clean run "
        f"{reference.attempts.get(f'{r.stage} {r.item_key}', 1)}), last error: "
        f"{(r.last_error or 'none')[:300]}"
        for r in items
        if r.attempts > reference.attempts.get(f"{r.stage} {r.item_key}", 1)
    ]


def _extra_attempts(attempts: dict[str, int], reference: Reference | None) -> int:
    if reference is None:
        return 0
    return sum(max(n - reference.attempts.get(item, 1), 0) for item, n in attempts.items())


def dataset_print(output_dir: Path) -> dict:
    """What two runs' datasets must share: each image's bytes, the manifest's comparable columns,
    the COCO annotations (by image file name and category name, boxes to 0.1 px) and the dataset
    versions made."""
    dataset = output_dir / "dataset"
    images = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((dataset / "images").iterdir())
    }
    coco = json.loads((dataset / "annotations.coco.json").read_text())
    names = {i["id"]: i["file_name"] for i in coco["images"]}
    categories = {c["id"]: c["name"] for c in coco["categories"]}
    annotations = sorted(
        (names[a["image_id"]], categories[a["category_id"]], *(round(v, 1) for v in a["bbox"]))
        for a in coco["annotations"]
    )
    versions = output_dir / "dataset_versions"
    return {
        "images": images,
        "manifest": read_dataset(output_dir).to_dict("records"),
        "annotations": annotations,
        "versions": sorted(p.name for p in versions.iterdir()) if versions.is_dir() else [],
    }


def _dataset_difference(dataset: dict | None, reference: Reference | None) -> str | None:
    if reference is None:
        return None
    if dataset is None:
        return "there is no dataset"
    differing = [key for key in reference.dataset if dataset.get(key) != reference.dataset[key]]
    if not differing:
        return None
    images, clean = set(dataset["images"]), set(reference.dataset["images"])
    return (
        f"{', '.join(differing)} differ; {len(images)} images against {len(clean)} "
        f"({len(images - clean)} not in the clean run's, {len(clean - images)} of it missing); "
        f"versions {dataset['versions']} against {reference.dataset['versions']}"
    )
