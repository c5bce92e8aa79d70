"""The egress policy: every address a fetch connects to is checked (yt-dlp's requests, their
redirects, listings): link-local and metadata addresses always refused, loopback and private ones
unless the project allows them; a refusal is one line on the item, and permanent."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dataminer_dagster.acquisition.egress import (
    EgressRefused,
    address_refusal,
    egress_checked,
)
from dataminer_dagster.acquisition.errors import PermanentDownloadError
from dataminer_dagster.acquisition.ytdlp_search import list_videos
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.assets.download.fetch import download_video
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from tests.helpers.http_server import http_server_fixture

http_server = http_server_fixture(scope="module")
ALLOWED = DownloadConfig(allow_private_networks=True)


@pytest.fixture(scope="module")
def clip(http_server) -> str:
    write_opencv_video(
        http_server.root / "clip.mp4", SyntheticVideoSpec(width=64, height=48, fps=5, seconds=1)
    )
    return http_server.url("/clip.mp4")


@pytest.mark.parametrize(
    ("address", "allowed", "refused"),
    [
        ("169.254.169.254", "never", "link-local or cloud metadata"),
        ("::ffff:169.254.169.254", "never", "link-local or cloud metadata"),
        ("fe80::1%eth0", "never", "link-local or cloud metadata"),
        ("fd00:ec2::254", "never", "link-local or cloud metadata"),
        ("100.100.100.200", "never", "link-local or cloud metadata"),
        ("127.0.0.1", "when allowed", "loopback or private"),
        ("::1", "when allowed", "loopback or private"),
        ("10.1.2.3", "when allowed", "loopback or private"),
        ("192.168.0.10", "when allowed", "loopback or private"),
        ("100.64.0.1", "when allowed", "loopback or private"),
        ("0.0.0.0", "when allowed", "loopback or private"),
        ("93.184.215.14", "always", None),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", "always", None),
    ],
)
def test_which_addresses_are_refused(address, allowed, refused):
    closed = address_refusal(address, allow_private=False)
    opened = address_refusal(address, allow_private=True)
    assert (refused in closed) if refused else closed is None, closed
    assert (opened is None) == (allowed != "never"), opened


def test_a_download_from_a_private_address_is_refused_unless_allowed(http_server, clip, tmp_path):
    with pytest.raises(EgressRefused) as refused:
        download_video(clip, "vid", tmp_path / "closed", DownloadConfig())
    assert isinstance(refused.value, PermanentDownloadError)  # dead at once, never retried
    message = str(refused.value)
    assert message.startswith(f"Video vid ({clip}): connection to 127.0.0.1 refused: ")
    assert "download.allow_private_networks: true" in message and "\n" not in message
    assert not [r for r in http_server.requests if r.path == "/clip.mp4"], "nothing was sent"

    result = download_video(clip, "vid", tmp_path / "open", ALLOWED)
    assert result.path.stat().st_size > 0


def test_a_redirect_to_the_metadata_address_is_refused_even_where_private_is_allowed(
    http_server, tmp_path
):
    http_server.respond(
        "/to-metadata.mp4", status=302, headers={"Location": "http://169.254.169.254/latest/"}
    )
    with pytest.raises(
        EgressRefused, match=r"connection to 169\.254\.169\.254 refused: .*metadata"
    ):
        download_video(http_server.url("/to-metadata.mp4"), "vid", tmp_path, ALLOWED)


def test_a_listing_on_a_private_address_is_refused_unless_allowed(http_server):
    (http_server.root / "feed.xml").write_text(
        '<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>'
        f"<item><title>a</title><link>{http_server.url('/clip.mp4')}</link></item>"
        "</channel></rss>"
    )
    with pytest.raises(EgressRefused, match=r"^listing http://127\.0\.0\.1:\d+/feed\.xml: "):
        list_videos(http_server.url("/feed.xml"), 5, options=DownloadConfig())
    assert list_videos(http_server.url("/feed.xml"), 5, options=ALLOWED)


def test_the_check_is_scoped_to_the_fetch(http_server):
    """Outside a fetch (the database, the Dagster instance) a connect is what it always was."""
    host, port = http_server.url("/").split("//")[1].rstrip("/").split(":")
    with (
        pytest.raises(EgressRefused),
        egress_checked(allow_private=False, url="http://x/", proxy=None),
    ):
        socket.create_connection((host, int(port)), timeout=5).close()
    socket.create_connection((host, int(port)), timeout=5).close()


def test_a_name_that_resolves_to_a_private_address_is_refused(http_server, tmp_path: Path):
    url = http_server.url("/clip.mp4").replace("127.0.0.1", "localhost")
    with pytest.raises(EgressRefused, match=r"connection to (127\.0\.0\.1|::1) refused"):
        download_video(url, "vid", tmp_path, DownloadConfig())
