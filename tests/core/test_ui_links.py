"""The UI links `dataminer status NAME` prints (core/ui_links.py); tests/test_ui.py opens one in
a browser (the filtered-frames partition page)."""

from dataminer_dagster.core.ui_links import partition_link


def test_a_partition_link_names_the_asset_path_and_the_key_escaped():
    assert partition_link("http://127.0.0.1:3000", ["downloads"], "dQw4w9WgXcQ") == (
        "http://127.0.0.1:3000/assets/downloads?view=partitions&partition=dQw4w9WgXcQ"
    )
    # a prefix is a path segment of its own; a base with a path and a trailing slash keeps it
    assert partition_link(
        "https://ui.example.org/dagster/", ["mine", "filtered_frames"], "p.v"
    ) == (
        "https://ui.example.org/dagster/assets/mine/filtered_frames?view=partitions&partition=p.v"
    )
    # a key is escaped, whatever it holds (project names and video ids are safe already)
    assert partition_link("", ["dataset"], "street food/2 & more?") == (
        "/assets/dataset?view=partitions&partition=street%20food%2F2%20%26%20more%3F"
    )
