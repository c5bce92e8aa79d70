"""Project configuration: one YAML file per project, validated strictly.

Unknown keys are errors that name the key (a misspelt threshold must not be silently ignored), and
there are no domain defaults: prompts, classes and queries always come from the user. Numeric
defaults are neutral starting points, listed in docs/configuration.md's reference.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.assets.backup.config import BackupConfig
from dataminer_dagster.assets.catalog.config import InputsConfig, TargetConfig
from dataminer_dagster.assets.dataset.config import DatasetConfig
from dataminer_dagster.assets.dedup.config import DedupConfig
from dataminer_dagster.assets.detect.config import DetectConfig
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.assets.filter.config import FilterConfig
from dataminer_dagster.assets.frames.config import ExtractConfig
from dataminer_dagster.core.bounded_text import (
    BoundedTextError,
    TooLarge,
    cut,
    read_yaml_file,
    shown,
    shown_key,
)
from dataminer_dagster.core.config_section import SAFE_NAME, ConfigError, Section
from dataminer_dagster.core.rsync import is_remote


class CleanupConfig(Section):
    delete_videos_after_extraction: bool = Field(
        False,
        description="Delete downloaded videos once their frames exist (local source files are never deleted).",
    )
    delete_frames_when_done: bool = Field(
        False,
        description="Delete raw frames of a video once every project using it is complete, and backed up where a backup is named (they are re-extracted if needed again).",
    )


class ProjectConfig(Section):
    name: str = Field(
        pattern=SAFE_NAME,
        description="Project name: at most 64 letters, digits, _ and -, not starting with -.",
    )
    output_dir: Path | None = Field(
        None,
        description="Where the project's results go: a new or empty directory of its own, not "
        "in or above the data directory, DATAMINER_HOME or DAGSTER_HOME (relative: to the config "
        "file); default $DATAMINER_DATA_DIR/projects/<name>.",
    )
    inputs: InputsConfig = Field(
        description="Where the videos come from (at least one source). Sources with the same "
        "content (a copied file, a video behind two URLs) are one video, processed once."
    )
    target: TargetConfig | None = Field(
        None,
        description="A dataset size to reach, and the download budget for it; leave out to take "
        "every video of the sources once.",
    )
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
    dataset: DatasetConfig = Field(
        default_factory=DatasetConfig,
        description="What the dataset holds besides its images and manifest: splits, training "
        "formats, the quality report's thresholds.",
    )
    cleanup: CleanupConfig = Field(
        default_factory=CleanupConfig, description="Disk space: what may be deleted once used."
    )
    backup: BackupConfig | None = Field(
        None, description="Copy raw frames elsewhere with rsync, verified by checksum."
    )

    @field_validator("name", mode="before")
    @classmethod
    def _not_an_option(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("-"):
            raise ValueError(
                f"a project name may not start with '-' ({shown(value, 40)} would read as an "
                "option of the dataminer command)"
            )
        return value

    @model_validator(mode="after")
    def _boxes_for_yolo(self) -> ProjectConfig:
        # A YOLO dataset without labels trains a detector on background only: refused here
        # rather than written.
        if "yolo" in self.dataset.formats and self.detect is None:
            raise ValueError(
                "dataset.formats has yolo, a format of boxes, and the project has no detect "
                "section: add one, or leave yolo out"
            )
        return self

    def config_hash(self) -> str:
        return _short_hash(self.to_json())

    def fingerprints(self) -> dict[str, str]:
        """{stage: fingerprint} for each stage with items of this project (the catalog, the
        filter and the project chain): a hash of the config sections its output depends on (its
        registry entry's `config`, each section's `results_view`) and of the fingerprint of the
        stage it reads. Per-video stages serve every project of a video: theirs is not recorded,
        and they do not pass the catalog's on (which videos a project has is not their input),
        but a project stage below one inherits its sections (the filter: the extraction
        profile)."""
        memo: dict[str, str] = {}

        def of(name: str) -> str:
            if name not in memo:
                spec = REGISTRY[name]
                sections = {s: _results_view(getattr(self, s)) for s in spec.config}
                upstream = of(spec.reads) if spec.reads and not spec.per_video else None
                memo[name] = _short_hash([sections, upstream])
            return memo[name]

        return {s.name: of(s.name) for s in REGISTRY.specs if not s.per_video}

    def changed_keys(self, other: ProjectConfig) -> list[str]:
        """The keys (dotted, down to a section's field) whose values differ from `other`'s."""
        mine, theirs = self.to_json(), other.to_json()
        changed = []
        for section in sorted(set(mine) | set(theirs)):
            a, b = mine.get(section), theirs.get(section)
            if a == b:
                continue
            if isinstance(a, dict) and isinstance(b, dict):
                changed += [
                    f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
                ]
            else:
                changed.append(section)
        return changed

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _short_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _results_view(section: Section | None) -> dict[str, Any] | None:
    return None if section is None else section.results_view()


# A project config is read whole into memory and validated: it is refused past this size
# (DATAMINER_MAX_CONFIG_MB raises it) and past this many values once its YAML aliases are expanded.
ENV_MAX_CONFIG_MB = "DATAMINER_MAX_CONFIG_MB"
DEFAULT_MAX_CONFIG_MB = 4.0
MAX_CONFIG_VALUES = 100_000


def max_config_bytes() -> int:
    """The largest project config read: $DATAMINER_MAX_CONFIG_MB megabytes, else 4."""
    text = os.environ.get(ENV_MAX_CONFIG_MB) or ""
    try:
        megabytes = float(text) if text else DEFAULT_MAX_CONFIG_MB
    except ValueError:
        raise ConfigError(f"{ENV_MAX_CONFIG_MB}={shown(text)}: not a number of megabytes") from None
    if not 0 < megabytes <= 1024:
        raise ConfigError(f"{ENV_MAX_CONFIG_MB}={text}: must be more than 0 and at most 1024")
    return int(megabytes * 2**20)


def load_project_config(path: Path) -> ProjectConfig:
    """Read and validate a project YAML; relative paths in it are taken relative to the file.
    Every refusal is a ConfigError whose lines name the file and the key."""
    path = Path(path)
    try:
        raw = read_yaml_file(path, max_bytes=max_config_bytes(), max_values=MAX_CONFIG_VALUES)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except TooLarge as exc:
        raise ConfigError(
            f"{path}: {exc}, the most a project config may be ({ENV_MAX_CONFIG_MB} raises it)"
        ) from None
    except BoundedTextError as exc:
        raise ConfigError(f"{path}: {exc}") from None
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
    for error in exc.errors()[:PROBLEMS_SHOWN]:
        key = ".".join(shown_key(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            parent = _model_at(error["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see the config reference"
            lines.append(f"  {key}: unknown key (allowed here: {allowed})")
        elif error["type"] == "missing":
            lines.append(f"  {key}: required")
        elif error["type"] == "literal_error":
            lines.append(
                f"  {key}: {error['msg'].replace('Input should be', 'must be')}, "
                f"got {shown(error['input'])}"
            )
        else:
            # One line per problem, the value cut short without walking the whole of it: an
            # error line, not a copy of a pasted file.
            message = cut(" ".join(error["msg"].removeprefix("Value error, ").split()), 400)
            lines.append(
                f"  {key}: {message} (got {shown(error['input'])})"
                if "input" in error
                else f"  {key}: {message}"
            )
    if exc.error_count() > PROBLEMS_SHOWN:
        lines.append(f"  (and {exc.error_count() - PROBLEMS_SHOWN:,} more problems)")
    return "\n".join(lines)


PROBLEMS_SHOWN = 20


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
    """The configuration reference of docs/configuration.md, generated from the schema (a test
    keeps them equal)."""
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
        return f"`{value}`" if isinstance(value, list) else "(section defaults)"
    return "null" if field.default is None else f"`{field.default}`"


def write_config_reference(path: Path) -> None:
    """Put the schema's reference between the config-reference markers of a Markdown file."""
    start, end = "<!-- config-reference:start -->\n", "\n<!-- config-reference:end -->"
    text = path.read_text()
    head, rest = text.split(start)
    _, tail = rest.split(end)
    path.write_text(f"{head}{start}{config_reference()}{end}{tail}")


if __name__ == "__main__":  # python -m dataminer_dagster.config [--write docs/configuration.md]
    import sys

    if sys.argv[1:2] == ["--write"]:
        write_config_reference(Path(sys.argv[2]))
    else:
        print(config_reference())
