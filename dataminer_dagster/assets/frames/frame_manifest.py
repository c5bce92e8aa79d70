"""The frame manifest of an extraction: one Parquet row per kept frame, written beside the frames
and read back by the stages after extraction."""

from __future__ import annotations

from pathlib import Path

from dataminer_dagster.assets.frames.frame_extraction import ExtractionResult
from dataminer_dagster.assets.frames.frame_writer import ExtractedFrame

MANIFEST_COLUMNS = (
    "frame_index",
    "timestamp",
    "file_name",
    "width",
    "height",
    "sharpness",
    "content_hash",
)
# Written since frames are turned upright; a manifest from before has none, and its frames were
# stored as decoded: turned by 0 degrees.
ROTATION_COLUMN = "rotation"
# Written since extraction measures it; a manifest from before has none (None: not measured).
BRIGHTNESS_COLUMN = "brightness"


def write_manifest(result: ExtractionResult, path: Path) -> None:
    """One Parquet row per kept frame: frame_index, timestamp, file_name, width and height (as
    stored, upright), ..., rotation (degrees clockwise the decoded picture was turned),
    brightness (mean grey level, 0-255)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("frame_index", pa.int64()),
            ("timestamp", pa.float64()),
            ("file_name", pa.string()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("sharpness", pa.float64()),
            ("content_hash", pa.string()),
            (ROTATION_COLUMN, pa.int16()),
            (BRIGHTNESS_COLUMN, pa.float64()),
        ]
    )
    columns = {
        "frame_index": [f.index for f in result.frames],
        "timestamp": [f.timestamp for f in result.frames],
        "file_name": [f.file_name for f in result.frames],
        "width": [f.width for f in result.frames],
        "height": [f.height for f in result.frames],
        "sharpness": [f.sharpness for f in result.frames],
        "content_hash": [f.content_hash for f in result.frames],
        ROTATION_COLUMN: [f.rotation for f in result.frames],
        BRIGHTNESS_COLUMN: [f.brightness for f in result.frames],
    }
    pq.write_table(pa.table(columns, schema=schema), Path(path))


def read_manifest(path: Path) -> list[ExtractedFrame]:
    import pyarrow.parquet as pq

    table = pq.read_table(Path(path))
    missing = [c for c in MANIFEST_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"Frame manifest {path} lacks the columns {', '.join(missing)}")
    columns = [*MANIFEST_COLUMNS, ROTATION_COLUMN, BRIGHTNESS_COLUMN]
    rows = table.select([c for c in columns if c in table.column_names]).to_pylist()
    return [
        ExtractedFrame(
            index=row["frame_index"],
            timestamp=row["timestamp"],
            file_name=row["file_name"],
            width=row["width"],
            height=row["height"],
            sharpness=row["sharpness"],
            content_hash=row["content_hash"],
            rotation=row.get(ROTATION_COLUMN, 0),
            brightness=row.get(BRIGHTNESS_COLUMN),
        )
        for row in rows
    ]
