"""Project configuration: one YAML file per project, validated strictly.

Unknown keys are errors that name the key (a misspelt threshold must not be silently ignored), and
there are no domain defaults: prompts, classes and queries always come from the user. Numeric
defaults are neutral starting points documented in the README's config reference.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dataminer_dagster.core.extract import DEFAULT_MAX_FRAME_PIXELS, DEFAULT_MAX_FRAMES
from dataminer_dagster.core.rsync import check_dest, is_remote

SAFE_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class ConfigError(ValueError):
    """A project config that cannot be used; the message names the file, the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class SearchConfig(_Section):
    queries: list[str] = Field(default_factory=list, description="YouTube search queries.")
    queries_file: Path | None = Field(
        None,
        description="File with more queries: a YAML list under `queries:`, or one query per line.",
    )
    max_results_per_query: int = Field(
        50, ge=1, le=1000, description="Videos taken from each query (the original's default)."
    )


class InputsConfig(_Section):
    search: SearchConfig | None = Field(
        None, description="YouTube searches (run by the video_catalog asset)."
    )
    urls: list[str] = Field(
        default_factory=list, description="Video URLs (YouTube or direct http(s) links)."
    )
    url_file: Path | None = Field(
        None,
        description="File with one URL per line; blank lines and lines starting with # or // are skipped.",
    )
    files: list[str] = Field(
        default_factory=list, description="Local video files or glob patterns."
    )
    max_list_file_mb: float = Field(
        16,
        gt=0,
        description="Largest url_file or search.queries_file read; a larger one is refused.",
    )
    max_list_file_lines: int = Field(
        100_000,
        ge=1,
        description="Most lines in a url_file or search.queries_file; more are refused.",
    )
    max_file_matches: int = Field(
        10_000,
        ge=1,
        description="Most video files one `files` pattern may match; more are refused.",
    )

    @model_validator(mode="after")
    def _has_a_source(self) -> InputsConfig:
        if not (self.search or self.urls or self.url_file or self.files):
            raise ValueError("give at least one of search, urls, url_file or files")
        return self


class DownloadConfig(_Section):
    max_height: int | None = Field(
        720, ge=144, description="Height cap of the downloaded video stream."
    )
    format: str | None = Field(
        None,
        description="Explicit yt-dlp format; default: one video-only stream under max_height (no ffmpeg needed).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Network timeout of one request.")
    blocked_hashtags: list[str] = Field(
        default_factory=list,
        description="Skip videos carrying one of these tags (whole-tag match, case-insensitive, leading # optional).",
    )
    blocked_hashtags_file: Path | None = Field(
        None,
        description="File with more blocked tags, one per line, read when the config is loaded (relative: to the config file); "
        "blank lines and lines starting with '# ' (hash, space) or // are comments, '#tag' and 'tag' both block tag.",
    )
    max_duration_s: float = Field(7200, gt=0, description="Skip longer videos.")
    max_filesize_mb: float = Field(
        4096,
        gt=0,
        description="Skip larger files; a download without an announced size stops once past it.",
    )
    min_free_disk_mb: float = Field(
        1024,
        ge=0,
        description="Free space a download leaves on the data disk besides the video's expected size; else it waits.",
    )
    cookies_file: Path | None = Field(
        None, description="Netscape cookies file handed to yt-dlp, for searches and downloads."
    )
    sleep_interval_s: float | None = Field(
        None,
        ge=0,
        description="Least random pause before each download of a run (yt-dlp's sleep_interval); "
        "default: 10 for YouTube (yt-dlp's `-t sleep` preset), 0 for other hosts.",
    )
    max_sleep_interval_s: float | None = Field(
        None,
        ge=0,
        description="Most random pause before each download (yt-dlp's max_sleep_interval); "
        "default: 20 for YouTube, 0 for other hosts; never below sleep_interval_s.",
    )
    sleep_requests_s: float | None = Field(
        None,
        ge=0,
        description="Pause between the requests of one search or extraction (yt-dlp's sleep_interval_requests); "
        "default: 0.75 for YouTube, 0 for other hosts.",
    )
    rate_limit: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)?[KMG]?$",
        description="Most bytes per second of one download, as yt-dlp writes it (500K, 4.2M); default unlimited.",
    )
    max_downloads_per_host: int = Field(
        2,
        ge=1,
        description="Downloads from one host at once, across every run and project (the smallest value of a video's projects counts).",
    )
    proxies: list[str] = Field(
        default_factory=list,
        description="Proxies (http://, https://, socks5://) used in turn, one per download or search; "
        "a proxy the host paused is skipped while another is free.",
    )
    pause_base_s: float = Field(
        60.0,
        gt=0,
        description="How long a host that says stop (429, 503, a bot check) without a Retry-After is paused for every run; "
        "doubles with each pause in a row, times a random 0.5-1 (a Retry-After is honoured as given).",
    )
    pause_max_s: float = Field(3600.0, gt=0, description="Longest pause of a host.")
    max_pause_wait_s: float = Field(
        120.0,
        ge=0,
        description="A run waits in place for a host's pause this short; for a longer one it gives its items back "
        "(no attempt used) until the pause ends.",
    )

    @model_validator(mode="after")
    def _pauses_in_order(self) -> DownloadConfig:
        if self.pause_max_s < self.pause_base_s:
            raise ValueError("download.pause_max_s must be at least download.pause_base_s")
        return self

    def rate_limit_bytes(self) -> int | None:
        if self.rate_limit is None:
            return None
        factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(self.rate_limit[-1], 1)
        return int(float(self.rate_limit.rstrip("KMG")) * factor)


class ExtractConfig(_Section):
    strategy: Literal["interval", "time", "scene"] = Field(
        "time",
        description="interval: every Nth frame; time: one frame per every_seconds; scene: first frame of each scene.",
    )
    every_frames: int = Field(30, ge=1, description="interval: frames between samples.")
    every_seconds: float = Field(1.0, gt=0, description="time: seconds between samples.")
    scene_threshold: float = Field(
        27.0, gt=0, le=255, description="scene: content change (0-255) that starts a new scene."
    )
    max_frames: int = Field(DEFAULT_MAX_FRAMES, ge=1, description="Most frames kept per video.")
    image_format: Literal["jpg", "png", "webp"] = Field(
        "jpg", description="Format of the extracted frames."
    )
    quality: int = Field(95, ge=1, le=100, description="JPEG/WebP quality.")
    max_side: int | None = Field(
        None, ge=32, description="Downscale frames so the longest side is at most this."
    )
    max_frame_pixels: int = Field(
        DEFAULT_MAX_FRAME_PIXELS,
        ge=1,
        description="Videos with larger frames (width x height) are refused, not decoded; default 8K.",
    )
    min_free_disk_mb: float = Field(
        1024,
        ge=0,
        description="Free space required on the data disk before extracting; else it waits.",
    )

    def options(self):
        """The extraction options of core.extract (the profile a video's frames are made with)."""
        from dataminer_dagster.core.extract import ExtractionOptions

        return ExtractionOptions(
            strategy=self.strategy,
            every_frames=self.every_frames if self.strategy == "interval" else None,
            every_seconds=self.every_seconds if self.strategy == "time" else None,
            scene_threshold=self.scene_threshold,
            max_frames=self.max_frames,
            image_format=self.image_format,
            quality=self.quality,
            max_side=self.max_side,
            max_frame_pixels=self.max_frame_pixels,
        )


class FilterConfig(_Section):
    model: str = Field(
        "google/siglip2-so400m-patch14-384",
        description="SigLIP2 model: hub id or local directory (relative: to the config file).",
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Images per model call; default: what fits in half the free GPU memory, up "
        "to 64 (32 on the CPU). A value here is the most a call takes.",
    )
    positive_prompts: list[str] = Field(
        min_length=1,
        description="A frame passes when one of these scores above positive_threshold.",
    )
    negative_prompts: list[str] = Field(
        default_factory=list, description="Frames scoring high on these are dropped."
    )
    junk_prompts: list[str] = Field(
        default_factory=list,
        description="Like negative prompts, with their own thresholds (close-ups, partial views...).",
    )
    positive_threshold: Probability = Field(
        0.3, description="Best positive score must be above this."
    )
    negative_threshold: Probability = Field(
        0.3, description="Best negative score must be below this."
    )
    pos_neg_margin: float = Field(
        0.1, description="Best positive minus best negative must be above this."
    )
    junk_threshold: Probability = Field(0.3, description="Best junk score must be below this.")
    pos_junk_margin: float = Field(
        0.1, description="Best positive minus best junk must be above this."
    )

    @field_validator("positive_prompts", "negative_prompts", "junk_prompts")
    @classmethod
    def _no_blank_prompts(cls, prompts: list[str]) -> list[str]:
        if any(not p.strip() for p in prompts):
            raise ValueError("prompts must not be blank")
        return prompts


class DedupConfig(_Section):
    threshold: Probability = Field(
        0.9, description="Frames at cosine similarity >= this are duplicates."
    )
    embeddings: Literal["filter", "dinov2"] = Field(
        "filter",
        description="filter: reuse the filter's SigLIP embeddings (no second model pass); dinov2: a DINOv2/DINOv3 model.",
    )
    model: str | None = Field(
        None, description="Model for embeddings: dinov2 (e.g. facebook/dinov2-base)."
    )
    device: str = Field(
        "auto",
        description="auto, cpu, cuda, cuda:N or mps: for a dinov2 model and for the duplicate search (mps: the search on the CPU).",
    )
    exact_limit: int = Field(
        20_000,
        ge=100,
        description="Exact neighbour search up to this many frames, an approximate index beyond.",
    )

    @model_validator(mode="after")
    def _model_for_dinov2(self) -> DedupConfig:
        if self.embeddings == "dinov2" and not self.model:
            raise ValueError("dedup.model is required when dedup.embeddings is dinov2")
        return self


class DetectConfig(_Section):
    detector: Literal["yolo", "owlv2", "grounding_dino"] = Field(
        description="yolo: fixed classes; owlv2 / grounding_dino: open vocabulary from prompts."
    )
    model: str = Field(
        description="Weights: a .pt file or name for yolo, a hub id or local directory otherwise (relative paths: to the config file)."
    )
    classes: list[str] = Field(
        default_factory=list, description="yolo: class names to keep (empty: all)."
    )
    prompts: list[str] = Field(
        default_factory=list, description="owlv2 / grounding_dino: what to detect."
    )
    confidence: Probability = Field(0.25, description="Minimum detection score.")
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Images per model call; default: what fits in half the free GPU memory, up "
        "to 32 (8 on the CPU). A value here is the most a call takes.",
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    visualizations: bool = Field(False, description="Also write images with boxes drawn.")

    @model_validator(mode="after")
    def _prompts_for_open_vocabulary(self) -> DetectConfig:
        if self.detector != "yolo" and not self.prompts:
            raise ValueError(f"detect.prompts is required for the {self.detector} detector")
        if self.detector == "yolo" and self.prompts:
            raise ValueError(
                "detect.prompts is for open-vocabulary detectors; use detect.classes with yolo"
            )
        return self


class CleanupConfig(_Section):
    delete_videos_after_extraction: bool = Field(
        False,
        description="Delete downloaded videos once their frames exist (local source files are never deleted).",
    )
    delete_frames_when_done: bool = Field(
        False,
        description="Delete raw frames of a video once every project using it is complete, and backed up where a backup is named (they are re-extracted if needed again).",
    )


class BackupConfig(_Section):
    dest: str = Field(
        description="Local directory outside the data directory (relative: to the config file), "
        "or [user@]host:/path (rsync over ssh, key-based)."
    )
    delete_after_backup: bool = Field(
        False,
        description="Delete raw frames after a verified backup, when no project still needs them.",
    )

    @field_validator("dest")
    @classmethod
    def _plain_destination(cls, dest: str) -> str:
        return check_dest(dest)


class ProjectConfig(_Section):
    name: str = Field(pattern=SAFE_NAME, description="Project name: letters, digits, _ and -.")
    output_dir: Path | None = Field(
        None,
        description="Where the project's results go: a new or empty directory of its own, not "
        "in or above the data directory, DATAMINER_HOME or DAGSTER_HOME (relative: to the config "
        "file); default $DATAMINER_DATA_DIR/projects/<name>.",
    )
    inputs: InputsConfig = Field(description="Where the videos come from (at least one source).")
    download: DownloadConfig = Field(
        default_factory=DownloadConfig, description="How videos are fetched, and which are skipped."
    )
    extract: ExtractConfig = Field(
        default_factory=ExtractConfig, description="How frames are sampled and stored."
    )
    filter: FilterConfig = Field(
        description="Which frames to keep: SigLIP2 prompt scores and thresholds."
    )
    dedup: DedupConfig = Field(
        default_factory=DedupConfig,
        description="Near-duplicate removal across the project's videos.",
    )
    detect: DetectConfig | None = Field(None, description="Object detection; leave out to skip it.")
    cleanup: CleanupConfig = Field(
        default_factory=CleanupConfig, description="Disk space: what may be deleted once used."
    )
    backup: BackupConfig | None = Field(
        None, description="Copy raw frames elsewhere with rsync, verified by checksum."
    )

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_project_config(path: Path) -> ProjectConfig:
    """Read and validate a project YAML; relative paths in it are taken relative to the file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    config = parse_project_config(raw, source=str(path))
    return _resolve_paths(config, path.resolve().parent)


def parse_project_config(raw: dict[str, Any], *, source: str = "config") -> ProjectConfig:
    try:
        return ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: {exc.error_count()} problem(s)"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            parent = _model_at(error["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see the config reference"
            lines.append(f"  {key}: unknown key (allowed here: {allowed})")
        elif error["type"] == "missing":
            lines.append(f"  {key}: required")
        elif error["type"] == "literal_error":
            lines.append(
                f"  {key}: {error['msg'].replace('Input should be', 'must be')}, got {error['input']!r}"
            )
        else:
            message = error["msg"].removeprefix("Value error, ")
            lines.append(
                f"  {key}: {message} (got {error['input']!r})"
                if "input" in error
                else f"  {key}: {message}"
            )
    return "\n".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = ProjectConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        nested = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nested is None:
            return None
        model = nested
    return model


def _resolve_paths(config: ProjectConfig, base: Path) -> ProjectConfig:
    def absolute(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    inputs = config.inputs
    search = inputs.search
    if search and search.queries_file:
        search = search.model_copy(update={"queries_file": absolute(search.queries_file)})
    expanded = [Path(f).expanduser() for f in inputs.files]
    files = [str(f if f.is_absolute() else base / f) for f in expanded]
    inputs = inputs.model_copy(
        update={"search": search, "url_file": absolute(inputs.url_file), "files": files}
    )
    download = _with_blocklist_file(
        config.download.model_copy(
            update={
                "cookies_file": absolute(config.download.cookies_file),
                "blocked_hashtags_file": absolute(config.download.blocked_hashtags_file),
            }
        )
    )

    def model_path(reference: str | None) -> str | None:
        """A model given as a path (./x, ../x, ~/x, or one that exists beside the config) is
        made absolute; anything else is a hub id or a name its library knows (yolo11n.pt)."""
        if reference is None or Path(reference).is_absolute():
            return reference
        local = reference.startswith(("./", "../", "~")) or (base / reference).exists()
        return str(absolute(Path(reference))) if local else reference

    sections: dict[str, Any] = {
        "filter": config.filter.model_copy(update={"model": model_path(config.filter.model)}),
        "dedup": config.dedup.model_copy(update={"model": model_path(config.dedup.model)}),
    }
    if config.detect:
        sections["detect"] = config.detect.model_copy(
            update={"model": model_path(config.detect.model)}
        )
    if config.backup and not is_remote(config.backup.dest):
        sections["backup"] = config.backup.model_copy(
            update={"dest": str(absolute(Path(config.backup.dest)))}
        )
    return config.model_copy(
        update={
            "inputs": inputs,
            "download": download,
            "output_dir": absolute(config.output_dir),
            **sections,
        }
    )


def _with_blocklist_file(download: DownloadConfig) -> DownloadConfig:
    """The tags of `blocked_hashtags_file` added to `blocked_hashtags` (kept in the stored config,
    so that workers need not read the file)."""
    path = download.blocked_hashtags_file
    if path is None:
        return download
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"download.blocked_hashtags_file: {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    tags = list(dict.fromkeys([*download.blocked_hashtags, *parse_blocklist(text)]))
    return download.model_copy(update={"blocked_hashtags": tags})


def parse_blocklist(text: str) -> list[str]:
    """Tags from a blocklist file: one per line; blank lines and lines starting with '# ' (a hash
    and a space, or a lone '#') or '//' are comments; '#tag' is the tag `tag`."""
    tags = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("//") or line == "#" or line.startswith(("# ", "#\t")):
            continue
        tags.append(line)
    return tags


def config_reference() -> str:
    """The README's config reference, generated from the schema (a test keeps them equal)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            nested = _nested_model(field.annotation)
            default = "required" if field.is_required() else _show_default(field)
            kind = "section" if nested else _type_name(field.annotation)
            lines.append(f"| `{key}` | {kind} | {default} | {field.description or ''} |")
            if nested:
                walk(nested, f"{key}.")

    walk(ProjectConfig, "")
    return "\n".join(lines)


def _nested_model(annotation) -> type[BaseModel] | None:
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _type_name(annotation) -> str:
    text = (
        str(annotation)
        .replace("typing.", "")
        .replace("pathlib.", "")
        .replace("<class '", "")
        .replace("'>", "")
    )
    return text.replace("Literal[", "one of [").replace("NoneType", "null").replace(" | ", " or ")


def _show_default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "`[]`" if value == [] else "(section defaults)"
    return "null" if field.default is None else f"`{field.default}`"


if __name__ == "__main__":  # python -m dataminer_dagster.config > reference.md
    print(config_reference())
