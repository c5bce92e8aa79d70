"""The quality report of a dataset: what a person wants to know before training on it, as
`report.md` with PNG plots in `report/`, and the numbers the dataset's checks read.

    images per split, class and video     is a class or a video dominating?
    near-duplicate pairs                  left in the dataset, and across splits (must be 0)
    blurry, dark, overexposed images      from the sharpness and brightness measured at extraction
    boxes per class                       count, size, score
    provenance                            every image has a source URL or path
    scores                                the filter's and the detector's, with their thresholds

Near-duplicates are counted from the dedup table (`dedup/frames.parquet`), not from the
embeddings: the table records the relation the project's dedup used (its threshold, its search),
so the count says whether the splits respect that relation, and needs no model and no embedding
cache (which may have been cleared) in a stage that runs on the CPU. Whether dedup missed a pair
is what the dedup stage's own check (`no_duplicates_kept`) measures from the embeddings.

Pure: pandas and matplotlib (drawn on its Agg canvas, no pyplot state), no Dagster.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataminer_dagster.assets.dataset.dataset_formats import REPORT_DIR, REPORT_FILE, SplitImage
from dataminer_dagster.assets.dataset.dataset_splits import SPLITS, grouped, pairs_across_splits
from dataminer_dagster.assets.dataset.review_formats import REVIEW_STATES, UNREVIEWED, ReviewSummary
from dataminer_dagster.core.images import write_image

VIDEOS_LISTED = 20  # rows of the per-video table and bars of its plot
CLASSES_PLOTTED = 20  # the classes with the most boxes, in the plots
HISTOGRAM_BINS = 40
PLOT_SIZE_IN = (6.4, 3.2)
PLOT_DPI = 100  # every plot 640 x 320 pixels
FIXED_MARGINS = {"left": 0.09, "right": 0.98, "bottom": 0.12, "top": 0.9, "wspace": 0.25}
SPLIT_COLOURS = {"train": "#4c72b0", "val": "#dd8452", "test": "#55a868"}


@dataclass(frozen=True)
class Thresholds:
    """What the report measures against: the dataset section's limits and the thresholds the
    project's filter and detector used."""

    blurry_below: float
    dark_below: float
    overexposed_above: float
    positive_threshold: float
    confidence: float | None  # None: no detect section


@dataclass(frozen=True)
class ClassBoxes:
    boxes: dict[str, int]  # split -> boxes
    images: int  # images with at least one box of the class
    median_width: float  # fraction of the image's width
    median_height: float
    smallest_area: float  # fraction of the image's area
    mean_score: float | None


@dataclass(frozen=True)
class QualityReport:
    images: int
    ratios: dict[str, float]
    seed: int
    per_split: dict[str, int]
    videos_per_split: dict[str, int]
    per_video: list[tuple[str, str, str, int]]  # video id, title, split, images; most first
    classes: dict[str, ClassBoxes]  # empty without annotations
    near_duplicate_pairs: int  # pairs of the dataset's images in one dedup group
    pairs_across_splits: int  # pairs of frames in one dedup group, in videos of two splits
    removed_duplicates: int  # frames that passed the filter and dedup dropped
    blurry: int
    dark: int
    overexposed: int
    with_source: int  # images with a source URL or path
    thresholds: Thresholds
    warnings: list[str] = field(default_factory=list)
    review: ReviewSummary | None = None  # None: never reviewed

    @property
    def without_source(self) -> int:
        return self.images - self.with_source


def summarize(
    manifest,
    images: Sequence[SplitImage],
    names: Sequence[str] | None,
    dedup_rows: Iterable[tuple[str, Hashable]],
    *,
    ratios: Mapping[str, float],
    seed: int,
    thresholds: Thresholds,
    warnings: Sequence[str] = (),
    review: ReviewSummary | None = None,
) -> QualityReport:
    """The numbers of the report. `manifest`: the dataset's manifest (pandas); `images`: its
    images with their boxes; `dedup_rows`: (video id, group) of every frame of the dedup
    table."""
    split_of = dict(zip(manifest["video_id"], manifest["split"], strict=True))
    per_split = {s: int((manifest["split"] == s).sum()) for s in SPLITS}
    videos_per_split = {
        s: int(manifest.loc[manifest["split"] == s, "video_id"].nunique()) for s in SPLITS
    }
    counts = manifest.groupby(["video_id", "split"]).size().sort_values(ascending=False)
    titles = dict(zip(manifest["video_id"], manifest["video_title"], strict=True))
    per_video = [(v, titles.get(v) or "", s, int(n)) for (v, s), n in counts.items()]
    groups = manifest["group"].to_numpy()
    _, group_sizes = np.unique(groups[groups >= 0], return_counts=True)
    sources = manifest["source_url"].fillna("").astype(str).str.strip()
    rows = list(dedup_rows)
    return QualityReport(
        images=len(manifest),
        ratios={s: float(ratios.get(s, 0.0)) for s in SPLITS},
        seed=seed,
        per_split=per_split,
        videos_per_split=videos_per_split,
        per_video=per_video,
        classes=_classes(images, names),
        near_duplicate_pairs=int((group_sizes * (group_sizes - 1) // 2).sum()),
        pairs_across_splits=pairs_across_splits(rows, split_of),
        removed_duplicates=max(0, sum(1 for _, g in rows if grouped(g)) - len(manifest)),
        blurry=int((manifest["sharpness"] < thresholds.blurry_below).sum()),
        dark=int((manifest["brightness"] < thresholds.dark_below).sum()),
        overexposed=int((manifest["brightness"] > thresholds.overexposed_above).sum()),
        with_source=int((sources != "").sum()),
        thresholds=thresholds,
        warnings=list(warnings),
        review=review,
    )


def _classes(images: Sequence[SplitImage], names: Sequence[str] | None) -> dict[str, ClassBoxes]:
    if names is None:
        return {}
    found: dict[int, list[tuple[str, float, float, float | None, str]]] = {
        i: [] for i in range(len(names))
    }
    for image in images:
        for box in image.boxes:
            found[box.category].append(
                (image.split, box.w / image.width, box.h / image.height, box.score, image.file_name)
            )
    classes = {}
    for i, name in enumerate(names):
        rows = found[i]
        widths = np.array([r[1] for r in rows])
        heights = np.array([r[2] for r in rows])
        known = [r[3] for r in rows if r[3] is not None]
        classes[name] = ClassBoxes(
            boxes={s: sum(1 for r in rows if r[0] == s) for s in SPLITS},
            images=len({r[4] for r in rows}),
            median_width=float(np.median(widths)) if rows else 0.0,
            median_height=float(np.median(heights)) if rows else 0.0,
            smallest_area=float((widths * heights).min()) if rows else 0.0,
            mean_score=float(np.mean(known)) if known else None,
        )
    return classes


def write_report(
    report: QualityReport,
    manifest,
    images: Sequence[SplitImage],
    folder: Path,
    *,
    title: str,
    formats: Mapping[str, Mapping[str, int]],
    yields: Sequence[Mapping] = (),
) -> np.ndarray:
    """report.md and its plots (report/*.png) in `folder`; returns the overview picture (RGB),
    the report's plots on one page, for the UI's preview."""
    plots = folder / REPORT_DIR
    plots.mkdir(parents=True, exist_ok=True)
    scores = np.array([b.score for i in images for b in i.boxes if b.score is not None], np.float64)
    figures = {
        "splits": _splits_figure(report),
        "videos": _videos_figure(report),
        "quality": _quality_figure(manifest, report.thresholds),
        "scores": _scores_figure(manifest, scores, report.thresholds),
    }
    if report.classes:
        figures["classes"] = _classes_figure(report)
    pictures = {name: _drawn(figure) for name, figure in figures.items()}
    for name, picture in pictures.items():
        write_image(plots / f"{name}.png", picture, order="rgb")
    text = _markdown(report, title, formats, set(figures))
    if yields:
        text += "\n## Yield per source\n\n" + yield_table(yields) + "\n"
    (folder / REPORT_FILE).write_text(text)
    return _overview(pictures)


def _markdown(
    report: QualityReport, title: str, formats: Mapping[str, Mapping[str, int]], plots: set[str]
) -> str:
    t = report.thresholds
    n = max(report.images, 1)
    lines = [
        f"# Quality report: {title}",
        "",
        f"{report.images} images from {len(report.per_video)} videos, split by source "
        f"(seed {report.seed}): a video, its copies and the videos it shares a near-duplicate "
        "group with are in one split.",
        "",
    ]
    if report.warnings:
        lines += ["## Warnings", "", *[f"- {w}" for w in report.warnings], ""]
    lines += [
        "## Splits",
        "",
        "| split | share asked | images | share | videos |",
        "|---|---|---|---|---|",
        *[
            f"| {s} | {report.ratios[s]:.0%} | {report.per_split[s]} | "
            f"{report.per_split[s] / n:.0%} | {report.videos_per_split[s]} |"
            for s in SPLITS
        ],
        "",
        "![images per split](report/splits.png)",
        "",
    ]
    if report.classes:
        found = {name: c for name, c in report.classes.items() if c.images}
        missing = [name for name, c in report.classes.items() if not c.images]
        lines += [
            "## Classes",
            "",
            "| class | boxes in train | in val | in test | images with it | median width | "
            "median height | smallest area | mean score |",
            "|---|---|---|---|---|---|---|---|---|",
            *[
                f"| {_cell(name)} | {c.boxes['train']} | {c.boxes['val']} | {c.boxes['test']} | "
                f"{c.images} | {c.median_width:.1%} | {c.median_height:.1%} | "
                f"{c.smallest_area:.2%} | "
                + (f"{c.mean_score:.2f}" if c.mean_score is not None else "-")
                + " |"
                for name, c in sorted(found.items(), key=lambda kv: -sum(kv[1].boxes.values()))
            ],
            "",
            "Sizes are fractions of the image's width, height and area."
            + (
                f" No box of {len(missing)} class{'' if len(missing) == 1 else 'es'}: "
                + ", ".join(_cell(m) for m in missing)
                + "."
                if missing
                else ""
            ),
            "",
            "![boxes per class and split](report/classes.png)",
            "",
        ]
    else:
        lines += ["## Classes", "", "No boxes: the project has no detect section.", ""]
    lines += [
        "## Videos",
        "",
        "| video | title | split | images | share |",
        "|---|---|---|---|---|",
        *[
            f"| {_cell(v)} | {_cell(title)} | {s} | {k} | {k / n:.0%} |"
            for v, title, s, k in report.per_video[:VIDEOS_LISTED]
        ],
    ]
    if len(report.per_video) > VIDEOS_LISTED:
        lines.append(f"| ... and {len(report.per_video) - VIDEOS_LISTED} more videos | | | | |")
    lines += [
        "",
        "![images per video](report/videos.png)",
        "",
        "## Near-duplicates",
        "",
        "Counted from the dedup table (dedup/frames.parquet): two frames are near-duplicates when "
        "dedup put them in one group.",
        "",
        "| what | count |",
        "|---|---|",
        f"| near-duplicate pairs left among the images | {report.near_duplicate_pairs} |",
        f"| near-duplicate pairs across splits (must be 0) | {report.pairs_across_splits} |",
        f"| frames dedup removed as near-duplicates | {report.removed_duplicates} |",
        "",
        "## Image quality",
        "",
        "| what | threshold | images | share |",
        "|---|---|---|---|",
        f"| blurry | sharpness below {t.blurry_below:g} | {report.blurry} | {report.blurry / n:.1%} |",
        f"| dark | brightness below {t.dark_below:g} | {report.dark} | {report.dark / n:.1%} |",
        f"| overexposed | brightness above {t.overexposed_above:g} | {report.overexposed} | "
        f"{report.overexposed / n:.1%} |",
        "",
        "Sharpness: the variance of the Laplacian at a longest side of 512; brightness: the mean "
        "grey level (0-255). The thresholds are dataset.blurry_below, dataset.dark_below and "
        "dataset.overexposed_above.",
        "",
        "![sharpness and brightness](report/quality.png)",
        "",
        "## Provenance",
        "",
        f"{report.with_source} of {report.images} images have a source URL or path"
        + (f"; {report.without_source} have none." if report.without_source else "."),
        "",
        "## Scores",
        "",
        f"The filter kept frames whose best positive score is above {t.positive_threshold:g}"
        + (
            f"; the detector kept boxes scoring at least {t.confidence:g}."
            if t.confidence is not None
            else "."
        ),
        "",
        "![scores and thresholds](report/scores.png)",
        "",
    ]
    lines += _review_lines(report.review)
    lines += [
        "## Formats",
        "",
    ]
    lines += [
        f"- {name}: " + ", ".join(f"{s} {k}" for s, k in counts.items()) + " images"
        for name, counts in formats.items()
    ] or ["- the images, annotations.coco.json and manifest.parquet only"]
    return "\n".join(lines) + "\n"


def _review_lines(review: ReviewSummary | None) -> list[str]:
    """The review's section: images per state, and what reviewers changed per class."""
    if review is None:
        return [
            "## Review",
            "",
            "Not reviewed yet (`dataminer review export`, then `dataminer review import`).",
            "",
        ]
    lines = [
        "## Review",
        "",
        f"{review.reviewed} images reviewed: "
        + ", ".join(f"{review.states[s]} {s}" for s in REVIEW_STATES if s != UNREVIEWED)
        + f"; {review.states[UNREVIEWED]} not reviewed. Rejected images are not in the dataset.",
        "",
    ]
    if review.classes:
        lines += [
            "| class | boxes before review | unchanged | moved | relabelled | deleted | added | "
            "correction rate |",
            "|---|---|---|---|---|---|---|---|",
            *[
                f"| {_cell(name)} | {c.predicted} | {c.unchanged} | {c.moved} | {c.relabelled} | "
                f"{c.deleted} | {c.added} | {c.rate:.1%} |"
                for name, c in sorted(review.classes.items())
            ],
            "",
            "Counted on the reviewed images that were not rejected; the correction rate is the "
            "boxes moved, relabelled, deleted or added over the boxes before review and those "
            "added.",
            "",
        ]
    return lines


def yield_table(yields: Sequence[Mapping]) -> str:
    """What each source of the project gave (db/reports.py `source_yield`), as a Markdown table:
    videos, downloads, downloaded minutes, frames extracted, passed and kept, kept per video and
    per minute."""
    rows = [
        "| source | videos | downloaded | minutes | frames | passed filter | kept | "
        "kept per video | kept per minute |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for y in yields:
        per_video, per_minute = (
            "-" if y[k] is None else f"{y[k]:.1f}" for k in ("kept_per_video", "kept_per_minute")
        )
        rows.append(
            f"| {_cell(y['source'])} | {y['videos']} | {y['downloaded']} | "
            f"{y['downloaded_minutes']:.1f} | {y['frames_extracted']} | {y['frames_passed']} | "
            f"{y['frames_kept']} | {per_video} | {per_minute} |"
        )
    return "\n".join(rows)


def _cell(text: str) -> str:
    """Text as one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _figure(panels: int = 1, *, text_labels: bool = False):
    """A plot of PLOT_SIZE_IN. One with `text_labels` (names of any length on an axis) is laid out
    around them as it is drawn; the others, whose ticks are numbers or split names, have
    FIXED_MARGINS (measuring every label at each draw is most of a plot's drawing time)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(
        figsize=PLOT_SIZE_IN, dpi=PLOT_DPI, layout="constrained" if text_labels else None
    )
    FigureCanvasAgg(figure)
    if not text_labels:
        figure.subplots_adjust(**FIXED_MARGINS)
    return figure, figure.subplots(1, panels)


def _drawn(figure) -> np.ndarray:
    """The figure as an RGB picture, drawn once: written as its PNG and tiled in the overview."""
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def _splits_figure(report: QualityReport):
    figure, ax = _figure()
    _split_bars(ax, report)
    return figure


def _split_bars(ax, report: QualityReport) -> None:
    bars = ax.bar(
        list(SPLITS),
        [report.per_split[s] for s in SPLITS],
        color=[SPLIT_COLOURS[s] for s in SPLITS],
    )
    ax.bar_label(bars)
    total = report.images
    ax.scatter(
        list(SPLITS),
        [report.ratios[s] * total for s in SPLITS],
        marker="_",
        s=600,
        color="black",
        label="share asked",
    )
    ax.set_title("images per split")
    ax.legend(loc="upper right", fontsize="small")


def _classes_figure(report: QualityReport):
    figure, ax = _figure(text_labels=True)
    _class_bars(ax, report)
    return figure


def _class_bars(ax, report: QualityReport) -> None:
    """Boxes per split of the classes with the most boxes (at most CLASSES_PLOTTED)."""
    totals = {name: sum(c.boxes.values()) for name, c in report.classes.items()}
    names = sorted((n for n in totals if totals[n]), key=lambda n: -totals[n])[:CLASSES_PLOTTED]
    x = np.arange(len(names))
    width = 0.8 / len(SPLITS)
    for k, split in enumerate(SPLITS):
        ax.bar(
            x + (k - 1) * width,
            [report.classes[c].boxes[split] for c in names],
            width,
            label=split,
            color=SPLIT_COLOURS[split],
        )
    rotated = len(names) > 4
    ax.set_xticks(x, names, rotation=30 if rotated else 0, ha="right" if rotated else "center")
    ax.set_ylim(bottom=0)
    ax.set_title("boxes per class and split" if names else "no boxes")
    if names:
        ax.legend(fontsize="small")


def _videos_figure(report: QualityReport):
    from matplotlib.patches import Patch

    figure, ax = _figure(text_labels=True)
    shown = report.per_video[:VIDEOS_LISTED][::-1]  # the largest at the top
    y = np.arange(len(shown))  # positions, not labels: two videos may share a title
    ax.barh(y, [k for *_, k in shown], color=[SPLIT_COLOURS[s] for _, _, s, _ in shown])
    ax.set_yticks(y, [(title or v)[:30] for v, title, _, _ in shown])
    ax.set_title(f"images per video (the {len(shown)} largest)")
    ax.tick_params(axis="y", labelsize="small")
    ax.legend(
        handles=[Patch(color=SPLIT_COLOURS[s], label=s) for s in SPLITS],
        fontsize="small",
        loc="lower right",
    )
    return figure


def _quality_figure(manifest, t: Thresholds):
    figure, (left, right) = _figure(panels=2)
    _histogram(left, manifest["sharpness"], "sharpness", [(t.blurry_below, "blurry below")])
    _histogram(
        right,
        manifest["brightness"],
        "brightness",
        [(t.dark_below, "dark below"), (t.overexposed_above, "overexposed above")],
    )
    return figure


def _scores_figure(manifest, scores: np.ndarray, t: Thresholds):
    figure, (left, right) = _figure(panels=2)
    _histogram(left, manifest["pos_max"], "best positive score", [(t.positive_threshold, "filter")])
    if t.confidence is None:
        right.set_axis_off()
        right.set_title("detection scores: no detect section")
    else:
        _histogram(right, scores, "detection score", [(t.confidence, "confidence")])
    return figure


def _histogram(ax, values, title: str, lines: list[tuple[float, str]]) -> None:
    data = np.asarray(values, np.float64)
    data = data[np.isfinite(data)]
    if len(data):
        ax.hist(data, bins=HISTOGRAM_BINS, color="#8c8c8c")
    for value, label in lines:
        ax.axvline(value, color="#c44e52", linestyle="--", label=f"{label} {value:g}")
    ax.set_title(title if len(data) else f"{title}: no values")
    ax.legend(fontsize="small")


def _overview(pictures: Mapping[str, np.ndarray]) -> np.ndarray:
    """Four of the report's plots on one picture, two by two: splits, classes (or videos without
    boxes), image quality, scores."""
    top = np.hstack([pictures["splits"], pictures.get("classes", pictures["videos"])])
    return np.vstack([top, np.hstack([pictures["quality"], pictures["scores"]])])
