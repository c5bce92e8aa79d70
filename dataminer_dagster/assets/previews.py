"""Previews for the Dagster UI: small pictures saved beside a project's results and shown inline
in the asset's metadata (Markdown image with a data URI, plus the file path)."""

from __future__ import annotations

import base64
from pathlib import Path

import dagster as dg
import numpy as np

MAX_INLINE_BYTES = 400_000  # beyond this, only the file path is shown


def preview_metadata(
    name: str, picture: np.ndarray, directory: Path
) -> dict[str, dg.MetadataValue]:
    """Write `picture` (RGB) as `<directory>/<name>.png`; metadata that shows it in the UI."""
    from dataminer_dagster.core.visualize import encode_png, write_png

    path = write_png(directory / f"{name}.png", picture)
    metadata: dict[str, dg.MetadataValue] = {f"{name}_path": dg.MetadataValue.path(str(path))}
    data = encode_png(picture)
    if len(data) <= MAX_INLINE_BYTES:
        inline = base64.b64encode(data).decode()
        metadata[name] = dg.MetadataValue.md(f"![{name}](data:image/png;base64,{inline})")
    return metadata
