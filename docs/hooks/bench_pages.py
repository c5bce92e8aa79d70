"""MkDocs hook: the benchmark pages of bench/ are part of the site, so their links are checked too.

bench/README.md and the pages beside it stay with the benchmarks they describe; this adds them,
and the raw JSON they link, to the site under `bench/`. Links are written as they resolve in the
repository (a page of docs/ links `../bench/README.md`, a bench page `../docs/deployment.md`), so
that they work when read on a forge as well; in the site bench/ lies inside docs/, so those two
prefixes are rewritten to where the pages are there.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
BENCH_PAGES = {".md", ".json"}


def on_files(files, config):
    for path in sorted((ROOT / "bench").iterdir()):
        if path.suffix in BENCH_PAGES:
            files.append(
                File(
                    f"bench/{path.name}",
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("bench/"):
        return markdown.replace("](../docs/", "](../")
    return markdown.replace("](../bench/", "](bench/")
