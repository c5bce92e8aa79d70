"""The yt-dlp layer: real yt-dlp against a local HTTP server serving synthetic videos.

yt-dlp's generic extractor handles these URLs: it requests a URL once for metadata (reading only
the headers of a direct video link) and once more for the download.
"""

import io
import itertools
import json
import logging
import shutil
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from dataminer_dagster.acquisition.errors import (
    DownloadBlocked,
    DownloadTooSlow,
    HostPaused,
    PermanentDownloadError,
    RetryableDownloadError,
    ThrottleSignal,
)
from dataminer_dagster.acquisition.politeness import LocalThrottle, parse_retry_after, throttle_key
from dataminer_dagster.acquisition.ytdlp_errors import classify_ytdlp_error
from dataminer_dagster.acquisition.ytdlp_params import (
    default_format,
    deno_path,
    download_params,
    ytdlp_params,
)
from dataminer_dagster.acquisition.ytdlp_search import (
    SearchHit,
    parse_search_results,
    search_videos,
)
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.assets.download.fetch import DownloadProgress, download_video
from dataminer_dagster.assets.download.rules import blocked_hashtag, check_download_rules
from dataminer_dagster.core.files import InsufficientDiskSpace
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from tests.helpers.http_server import LocalHTTPServer, http_server_fixture
from tests.helpers.small_disk import small_disk

SPEC = SyntheticVideoSpec(width=320, height=240, fps=10.0, seconds=1.0)

http_server = http_server_fixture(scope="module")


def local_options(**settings) -> DownloadConfig:
    """Download settings for the local HTTP server, on 127.0.0.1: a private address."""
    return DownloadConfig(allow_private_networks=True, **settings)


@pytest.fixture(scope="module")
def clips(http_server):
    """One real mp4 and one real webm in the served directory; tests copy them under new names."""
    return {
        ext: write_opencv_video(http_server.root / f"clip.{ext}", SPEC) for ext in ("mp4", "webm")
    }


def serve_copy(server: LocalHTTPServer, clip: Path, name: str) -> str:
    shutil.copyfile(clip, server.root / name)
    return server.url(name)


def assert_nothing_left_but(dest: Path, *names: str) -> None:
    assert sorted(p.name for p in dest.iterdir()) == sorted(names)


# -- successful downloads ---------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["mp4", "webm"])
def test_download_puts_one_probed_file_in_place(http_server, clips, tmp_path, ext):
    url = serve_copy(http_server, clips[ext], f"ok.{ext}")
    events: list[DownloadProgress] = []

    result = download_video(url, "vid_ok", tmp_path, local_options(), progress=events.append)

    assert result.path == tmp_path / f"vid_ok.{ext}"
    assert result.path.read_bytes() == clips[ext].read_bytes()
    meta = result.metadata
    assert (meta.width, meta.height, meta.ext, meta.extractor) == (320, 240, ext, "generic")
    assert meta.fps == pytest.approx(10.0)
    assert meta.duration == pytest.approx(1.0, abs=0.15)
    assert meta.size_bytes == clips[ext].stat().st_size
    assert meta.webpage_url == url and meta.title == "ok"
    assert_nothing_left_but(tmp_path, f"vid_ok.{ext}")
    # One metadata request, one download request: the download reuses the extracted info.
    assert http_server.hits(f"/ok.{ext}") == 2
    assert events[-1].status == "finished"
    assert events[-1].downloaded_bytes == meta.size_bytes


def test_ytdlp_output_goes_to_logging_not_the_terminal(http_server, clips, tmp_path, capfd, caplog):
    url = serve_copy(http_server, clips["mp4"], "quiet.mp4")
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="dataminer_dagster.acquisition.ytdlp_params"):
        download_video(url, "vid", tmp_path, local_options())
    assert capfd.readouterr() == ("", "")
    ytdlp_lines = [r.message for r in caplog.records if r.name.endswith(".yt_dlp")]
    assert any("Destination" in line for line in ytdlp_lines)


def test_redownload_replaces_the_file_atomically(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "again.mp4")
    (tmp_path / "vid.mp4").write_bytes(b"stale")
    result = download_video(url, "vid", tmp_path, local_options())
    assert result.path.read_bytes() == clips["mp4"].read_bytes()
    assert_nothing_left_but(tmp_path, "vid.mp4")


def test_server_errors_during_the_download_are_retried_by_ytdlp(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "flaky.mp4")
    http_server.fail_then_serve("/flaky.mp4", status=500, times=1, after=1)
    result = download_video(url, "vid", tmp_path, local_options(retries=2))
    assert result.path.is_file()
    assert http_server.hits("/flaky.mp4") == 3  # metadata, 500, retried download


def test_cookies_are_sent_and_the_users_file_is_left_alone(http_server, clips, tmp_path):
    cookies = tmp_path / "cookies.txt"
    text = "# Netscape HTTP Cookie File\n127.0.0.1\tFALSE\t/\tFALSE\t4102444800\tsession\tabc\n"
    cookies.write_text(text)
    url = serve_copy(http_server, clips["mp4"], "cookies.mp4")
    dest = tmp_path / "videos"
    download_video(url, "vid", dest, local_options(cookies_file=cookies))
    sent = [r.headers.get("Cookie") for r in http_server.requests if r.path == "/cookies.mp4"]
    assert sent and all(c == "session=abc" for c in sent)
    assert cookies.read_text() == text
    assert_nothing_left_but(dest, "vid.mp4")


def video_page(server: LocalHTTPServer, clip: Path, name: str) -> str:
    """An HTML page describing the clip in JSON-LD, as many video sites publish their metadata."""
    media = serve_copy(server, clip, f"{name}.mp4")
    video_object = {
        "@context": "https://schema.org",
        "@type": "VideoObject",
        "name": "Street scene",
        "description": "A walking tour #City #discover",
        "contentUrl": media,
        "encodingFormat": "video/mp4",
        "duration": "PT1S",
        "uploadDate": "2024-05-06",
        "author": {"@type": "Person", "name": "Alice"},
        "keywords": "walk,Endgame,street",
    }
    page = f'<html><head><script type="application/ld+json">{json.dumps(video_object)}</script>'
    (server.root / f"{name}.html").write_text(page + "</head><body></body></html>")
    return server.url(f"{name}.html")


def test_metadata_from_the_extractor_is_kept(http_server, clips, tmp_path):
    url = video_page(http_server, clips["mp4"], "described")
    options = local_options(blocked_hashtags=("cover", "game"))  # no whole-tag match
    meta = download_video(url, "vid", tmp_path, options).metadata
    assert (meta.title, meta.uploader, meta.upload_date) == ("Street scene", "Alice", "2024-05-06")
    assert meta.tags == ("walk", "Endgame", "street")
    assert meta.duration == 1.0 and meta.webpage_url == url
    assert_nothing_left_but(tmp_path, "vid.mp4")


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        (local_options(blocked_hashtags=("#city",)), "hashtag"),
        (local_options(blocked_hashtags=("STREET",)), "hashtag"),
        (local_options(max_duration_s=0.5), "duration"),
    ],
)
def test_rules_are_checked_on_the_metadata_before_any_media_request(
    http_server, clips, tmp_path, options, rule
):
    name = f"blocked_{rule}_{len(http_server.requests)}"
    url = video_page(http_server, clips["mp4"], name)
    with pytest.raises(DownloadBlocked) as raised:
        download_video(url, "vid", tmp_path, options)
    assert raised.value.rule == rule
    assert http_server.hits(f"/{name}.html") == 1
    assert http_server.hits(f"/{name}.mp4") == 0
    assert_nothing_left_but(tmp_path)


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected", "reason"),
    [
        (404, PermanentDownloadError, "HTTP 404"),
        (410, PermanentDownloadError, "HTTP 410"),
        (500, RetryableDownloadError, "HTTP 500"),
        (503, RetryableDownloadError, "HTTP 503"),
        (429, RetryableDownloadError, "rate limited"),
    ],
)
def test_http_errors_are_classified(http_server, tmp_path, status, expected, reason):
    http_server.respond(f"/status{status}.mp4", status=status)
    with pytest.raises(expected, match=reason) as raised:
        download_video(http_server.url(f"status{status}.mp4"), "vid", tmp_path, local_options())
    assert "Video vid (http://127.0.0.1" in str(raised.value)
    assert_nothing_left_but(tmp_path)


@pytest.mark.parametrize(
    "hops", [["/loop.mp4", "/loop.mp4"], ["/there.mp4", "/back.mp4", "/there.mp4"]]
)
def test_a_redirect_loop_is_permanent_and_named(http_server, tmp_path, hops):
    """It was "unrecognised yt-dlp error, treated as retryable": 62 requests before dead."""
    for here, there in itertools.pairwise(hops):
        http_server.respond(here, status=302, headers={"Location": there})
    with pytest.raises(PermanentDownloadError) as raised:
        download_video(http_server.url(hops[0]), "vid", tmp_path, local_options())
    assert str(raised.value).startswith(
        f"Video vid ({http_server.url(hops[0])}): the address redirects in a loop and never "
        "reaches a video: "
    )
    assert_nothing_left_but(tmp_path)


def test_429_is_not_retried_by_ytdlp_but_carries_retry_after(http_server, clips, tmp_path):
    """yt-dlp's generic extractor and HTTP downloader do not retry 429: the caller backs off."""
    url = serve_copy(http_server, clips["mp4"], "busy.mp4")
    http_server.fail_then_serve("/busy.mp4", status=429, times=2, headers={"Retry-After": "7"})
    options = local_options(retries=5)

    for attempt in (1, 2):
        with pytest.raises(RetryableDownloadError) as raised:
            download_video(url, "vid", tmp_path, options)
        assert raised.value.retry_after == 7
        assert http_server.hits("/busy.mp4") == attempt  # one request per attempt: no retries
    assert download_video(url, "vid", tmp_path, options).path.is_file()


def test_429_on_the_download_request_is_retryable(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "busy_later.mp4")
    http_server.fail_then_serve(
        "/busy_later.mp4", status=429, times=1, after=1, headers={"Retry-After": "3"}
    )
    with pytest.raises(RetryableDownloadError, match="rate limited") as raised:
        download_video(url, "vid", tmp_path, local_options())
    assert raised.value.retry_after == 3
    assert_nothing_left_but(tmp_path)


def test_text_served_as_mp4_is_not_a_video(http_server, tmp_path):
    (http_server.root / "text.mp4").write_text("this is not a video\n" * 50)
    with pytest.raises(PermanentDownloadError, match="not a usable video: Invalid data"):
        download_video(http_server.url("text.mp4"), "vid", tmp_path, local_options())
    assert_nothing_left_but(tmp_path)


def test_truncated_mp4_is_rejected_with_the_reason(http_server, clips, tmp_path):
    data = clips["mp4"].read_bytes()
    (http_server.root / "truncated.mp4").write_bytes(data[: len(data) // 2])
    with pytest.raises(PermanentDownloadError, match="not a usable video: .+"):
        download_video(http_server.url("truncated.mp4"), "vid", tmp_path, local_options())
    assert_nothing_left_but(tmp_path)


def test_empty_file_is_rejected(http_server, tmp_path):
    (http_server.root / "empty.mp4").write_bytes(b"")
    with pytest.raises(PermanentDownloadError, match="empty file"):
        download_video(http_server.url("empty.mp4"), "vid", tmp_path, local_options())
    assert_nothing_left_but(tmp_path)


def test_html_page_without_video_is_unsupported(http_server, tmp_path):
    (http_server.root / "page.html").write_text("<html><head><title>x</title></head></html>")
    with pytest.raises(PermanentDownloadError, match="Unsupported URL"):
        download_video(http_server.url("page.html"), "vid", tmp_path, local_options())
    assert_nothing_left_but(tmp_path)


def test_a_page_with_several_videos_is_not_a_single_video(http_server, clips, tmp_path):
    first = serve_copy(http_server, clips["mp4"], "first.mp4")
    second = serve_copy(http_server, clips["webm"], "second.webm")
    body = f'<video src="{first}"></video><video src="{second}"></video>'
    (http_server.root / "gallery.html").write_text(f"<html><body>{body}</body></html>")
    with pytest.raises(PermanentDownloadError, match="not a single video"):
        download_video(http_server.url("gallery.html"), "vid", tmp_path, local_options())
    assert http_server.hits("/first.mp4") == http_server.hits("/second.webm") == 0
    assert_nothing_left_but(tmp_path)


def test_connection_cut_mid_file_is_retryable_and_leaves_no_part_file(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "cut.mp4")
    http_server.cut_off("/cut.mp4", after_bytes=20_000)
    with pytest.raises(RetryableDownloadError, match="cut short"):
        download_video(url, "vid", tmp_path, local_options(retries=0))
    assert_nothing_left_but(tmp_path)


def test_slow_server_times_out_as_retryable(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "slow.mp4")
    http_server.delay("/slow.mp4", seconds=1.5)
    with pytest.raises(RetryableDownloadError, match="timed out"):
        download_video(url, "vid", tmp_path, local_options(timeout_s=0.3, retries=0))
    assert_nothing_left_but(tmp_path)


def test_a_trickling_host_is_given_up_once_the_speed_window_is_too_slow(
    http_server, clips, tmp_path
):
    """512 bytes every 2 s with a correct Content-Length: no read ever times out."""
    url = serve_copy(http_server, clips["mp4"], "trickle.mp4")
    http_server.trickle("/trickle.mp4", bytes_per_step=512, every_s=2.0)
    options = local_options(min_speed_kb_s=16, min_speed_window_s=4, retries=0)
    with pytest.raises(DownloadTooSlow, match="download.min_speed_kb_s") as raised:
        download_video(url, "vid", tmp_path, options)
    assert "KB in the last" in str(raised.value) and "given up after" in str(raised.value)
    assert isinstance(raised.value, RetryableDownloadError)
    assert_nothing_left_but(tmp_path)
    sent = [r.bytes_sent for r in http_server.requests if r.path == "/trickle.mp4"]
    assert max(sent) < clips["mp4"].stat().st_size, "given up before the end"


def test_a_download_past_its_deadline_is_given_up(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "late.mp4")
    http_server.trickle("/late.mp4", bytes_per_step=4096, every_s=1.0)  # fast enough per window
    options = local_options(max_download_s=3, retries=0)
    with pytest.raises(DownloadTooSlow, match=r"longer than download.max_download_s \(3 s\)"):
        download_video(url, "vid", tmp_path, options)
    assert_nothing_left_but(tmp_path)


def test_duration_limit_blocks_and_removes_the_file(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["webm"], "long.webm")
    with pytest.raises(DownloadBlocked, match="over the limit of 0.5 s") as raised:
        download_video(url, "vid", tmp_path, local_options(max_duration_s=0.5))
    assert raised.value.rule == "duration"
    assert_nothing_left_but(tmp_path)


def test_size_limit_blocks_before_the_body_is_downloaded(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "big.mp4")
    with pytest.raises(DownloadBlocked, match="over the limit of 0.01 MB") as raised:
        download_video(url, "vid", tmp_path, local_options(max_filesize_mb=0.01))
    assert raised.value.rule == "filesize"
    assert_nothing_left_but(tmp_path)


def test_a_body_without_a_length_is_cut_off_once_past_the_size_cap(http_server, tmp_path):
    # No Content-Length: neither the metadata nor yt-dlp's own max_filesize can stop it early.
    http_server.stream("/endless.mp4", total_bytes=40 * 2**20)
    url = http_server.url("/endless.mp4")
    with pytest.raises(DownloadBlocked, match="over the limit of 1 MB") as raised:
        download_video(url, "vid", tmp_path, local_options(max_filesize_mb=1))
    assert raised.value.rule == "filesize"
    sent = [r.bytes_sent for r in http_server.requests if r.path == "/endless.mp4"]
    assert max(sent) < 6 * 2**20, f"the download went on past the cap: {sent} bytes sent"
    assert_nothing_left_but(tmp_path)


def test_a_live_stream_is_refused_before_any_media_request(http_server, tmp_path):
    # An HLS media playlist without #EXT-X-ENDLIST is a live stream: it never ends.
    (http_server.root / "live.m3u8").write_text(
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n"
        "#EXTINF:2.0,\nsegment0.ts\n"
    )
    with pytest.raises(DownloadBlocked, match="live stream") as raised:
        download_video(http_server.url("/live.m3u8"), "vid", tmp_path, local_options())
    assert raised.value.rule == "live"
    assert http_server.hits("/segment0.ts") == 0
    assert_nothing_left_but(tmp_path)


def test_an_endless_playlist_is_not_enumerated_past_its_first_entry():
    from yt_dlp import YoutubeDL
    from yt_dlp.extractor.common import InfoExtractor

    enumerated = []

    class EndlessIE(InfoExtractor):
        _VALID_URL = r"endless:"

        def _real_extract(self, url):
            def entries():
                while len(enumerated) < 10_000:  # "endless"; a test must end
                    enumerated.append(len(enumerated))
                    yield self.url_result(f"https://example.com/{len(enumerated)}.mp4")

            return self.playlist_result(entries(), "endless")

    with YoutubeDL(download_params(local_options())) as ydl:
        ydl.add_info_extractor(EndlessIE())
        info = ydl.extract_info("endless:", download=False, ie_key="Endless")
    assert info["_type"] == "playlist"  # which download_video refuses as "not a single video"
    assert len(enumerated) == 1


def test_a_download_needs_free_disk_space_for_its_size_and_a_reserve(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "roomy.mp4")
    with pytest.raises(InsufficientDiskSpace, match="download.min_free_disk_mb") as raised:
        download_video(url, "vid", tmp_path, local_options(min_free_disk_mb=2**31 - 1))
    assert "free" in str(raised.value) and "vid" in str(raised.value)
    assert http_server.hits("/roomy.mp4") == 1, "refused after the metadata, before the media"
    assert_nothing_left_but(tmp_path)


def test_a_disk_that_fills_mid_download_is_a_full_disk_and_leaves_nothing(http_server, tmp_path):
    http_server.stream("/filling.mp4", total_bytes=16 * 2**20)  # no size announced to refuse
    with small_disk(tmp_path / "disk", size_mb=2) as disk:
        with pytest.raises(InsufficientDiskSpace, match="the disk is full") as raised:
            download_video(
                http_server.url("/filling.mp4"),
                "vid",
                disk,
                local_options(min_free_disk_mb=0, max_filesize_mb=64),
            )
        assert "No space left on device" in str(raised.value)
        assert str(raised.value).startswith("Video vid (")
        assert_nothing_left_but(disk)


def test_an_error_from_the_progress_callback_aborts_and_propagates(http_server, clips, tmp_path):
    class LeaseLost(Exception):
        pass

    def progress(event: DownloadProgress) -> None:
        raise LeaseLost("another run took the video")

    url = serve_copy(http_server, clips["mp4"], "lease.mp4")
    with pytest.raises(LeaseLost):
        download_video(url, "vid", tmp_path, local_options(), progress=progress)
    assert_nothing_left_but(tmp_path)


@pytest.mark.parametrize("video_id", ["", "a.b", "../x", "a/b", "a b"])
def test_unsafe_video_ids_are_refused(tmp_path, video_id):
    with pytest.raises(ValueError, match="may only contain"):
        download_video("http://127.0.0.1:9/x.mp4", video_id, tmp_path, local_options())


def test_missing_cookies_file_is_reported(tmp_path):
    options = local_options(cookies_file=tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="cookies file .*nope.txt .* does not exist"):
        download_video("http://127.0.0.1:9/x.mp4", "vid", tmp_path / "videos", options)
    assert_nothing_left_but(tmp_path / "videos")


# -- rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "blocked", "expected"),
    [
        ({"tags": ["discover"]}, ["cover"], None),
        ({"description": "The best #endgame moments"}, ["game"], None),
        ({"description": "#gameplay tips"}, ["game"], None),
        ({"description": "#game_over"}, ["game"], None),
        ({"tags": ["Cover"]}, ["cover"], "cover"),
        ({"tags": ["#Cover"]}, ["cover"], "cover"),
        ({"tags": ["cover"]}, ["#COVER"], "cover"),
        ({"tags": ["  cover "]}, [" #cover"], "cover"),
        ({"description": "my song #Cover, enjoy"}, ["cover"], "cover"),
        ({"description": "line one\n#Prank!"}, ["#prank"], "prank"),
        ({"title": "Speedrun #Minecraft"}, ["minecraft"], "minecraft"),
        ({"tags": ["game", "gta"]}, ["xbox", "gta"], "gta"),
        ({"tags": ["résumé"]}, ["RÉSUMÉ"], "résumé"),
        ({"tags": ["cover"]}, ["", "#"], None),
        ({"tags": None, "description": None}, ["cover"], None),
        ({}, ["cover"], None),
    ],
)
def test_blocked_hashtags_match_whole_tags_only(info, blocked, expected):
    assert blocked_hashtag(info, blocked) == expected


def test_rules_on_metadata_name_the_reason():
    options = local_options(blocked_hashtags=("cover",), max_duration_s=60, max_filesize_mb=1)
    check_download_rules({"tags": ["discover"], "duration": 59}, options, subject="Video v")
    with pytest.raises(DownloadBlocked, match=r"Video v is blocked: .*hashtag #cover") as raised:
        check_download_rules({"description": "a #cover"}, options, subject="Video v")
    assert raised.value.rule == "hashtag"
    with pytest.raises(DownloadBlocked, match="lasts 61.0 s, over the limit of 60 s"):
        check_download_rules({"duration": 61}, options, subject="Video v")
    merged = {"requested_formats": [{"filesize": 700_000}, {"filesize_approx": 500_000}]}
    with pytest.raises(DownloadBlocked, match="1.1 MB, over the limit of 1 MB"):
        check_download_rules(merged, options, subject="Video v")
    # Unknown sizes and durations are checked on the downloaded file instead.
    check_download_rules({"requested_formats": [{"filesize": 2_000_000}, {}]}, options, subject="v")


# -- yt-dlp parameters ------------------------------------------------------------------------


def test_params_hand_ytdlp_the_deno_runtime_from_the_deno_package():
    from yt_dlp import YoutubeDL

    params = ytdlp_params(local_options())
    assert deno_path() is not None
    assert params["js_runtimes"] == {"deno": {"path": deno_path()}}
    with YoutubeDL(params) as ydl:
        runtime = ydl._js_runtimes["deno"]
        assert runtime.info is not None, "yt-dlp could not run the deno binary"
        assert runtime.info.path == deno_path()


def test_params_map_the_options():
    cookies = Path("/secrets/cookies.txt")
    options = local_options(
        max_height=480, timeout_s=12, max_filesize_mb=1.5, cookies_file=cookies, retries=4
    )
    params = ytdlp_params(options)
    assert params["format"] == "bv*[height<=?480]/wv*"
    assert params["socket_timeout"] == 12
    assert params["max_filesize"] == int(1.5 * 1024 * 1024)
    assert params["cookiefile"] == str(cookies)
    assert params["retries"] == params["fragment_retries"] == params["extractor_retries"] == 4
    assert params["quiet"] and params["noprogress"] and params["noplaylist"]
    assert ytdlp_params(local_options(format="best", max_height=480))["format"] == "best"
    assert "cookiefile" not in ytdlp_params(local_options())


YOUTUBE_LIKE_FORMATS = [
    {"format_id": "140", "ext": "m4a", "vcodec": "none", "acodec": "mp4a.40.2", "abr": 128},
    {"format_id": "160", "ext": "mp4", "vcodec": "avc1", "acodec": "none", "height": 144},
    {"format_id": "18", "ext": "mp4", "vcodec": "avc1", "acodec": "mp4a", "height": 360},
    {"format_id": "135", "ext": "mp4", "vcodec": "avc1", "acodec": "none", "height": 480},
    {"format_id": "136", "ext": "mp4", "vcodec": "avc1", "acodec": "none", "height": 720},
    {"format_id": "137", "ext": "mp4", "vcodec": "avc1", "acodec": "none", "height": 1080},
]


@pytest.mark.parametrize(
    ("formats", "max_height", "chosen"),
    [
        (YOUTUBE_LIKE_FORMATS, None, "137"),
        (YOUTUBE_LIKE_FORMATS, 720, "136"),
        (YOUTUBE_LIKE_FORMATS, 500, "135"),
        (YOUTUBE_LIKE_FORMATS, 360, "18"),
        (YOUTUBE_LIKE_FORMATS[3:], 240, "135"),  # nothing fits: the smallest above the cap
        ([{"format_id": "mp4", "ext": "mp4"}], 720, "mp4"),  # generic link, height unknown
    ],
)
def test_default_format_selects_one_format_without_merging(formats, max_height, chosen):
    from yt_dlp import YoutubeDL

    info = {
        "id": "x",
        "title": "x",
        "extractor": "fake",
        "extractor_key": "Fake",
        "webpage_url": "https://example.com/x",
        "formats": [dict(f, url=f"https://example.com/{f['format_id']}") for f in formats],
    }
    with YoutubeDL(ytdlp_params(local_options(max_height=max_height))) as ydl:
        result = ydl.process_ie_result(info, download=False)
    assert "+" not in default_format(max_height)
    assert result["format_id"] == chosen
    assert "requested_formats" not in result  # a single file: no ffmpeg merge


# -- error classification ---------------------------------------------------------------------


def ytdlp_download_error(message: str, cause: BaseException | None = None):
    """The exception shape yt-dlp raises: DownloadError wrapping an ExtractorError."""
    from yt_dlp.utils import DownloadError, ExtractorError

    try:
        raise ExtractorError(message, cause=cause, expected=True)
    except ExtractorError as exc:
        return DownloadError(f"ERROR: {exc}", (type(exc), exc, None))


def http_error(status: int, headers: dict[str, str] | None = None):
    from yt_dlp.networking.common import Response
    from yt_dlp.networking.exceptions import HTTPError

    response = Response(io.BytesIO(b""), "https://example.com", headers or {}, status=status)
    return HTTPError(response)


@pytest.mark.parametrize(
    ("message", "expected", "reason"),
    [
        (
            "[youtube] abc: Private video. Sign in if you've been granted access",
            "permanent",
            "private",
        ),
        ("[youtube] abc: Video unavailable", "permanent", "unavailable"),
        (
            "[youtube] abc: Video unavailable. This video has been removed by the uploader",
            "permanent",
            "removed",
        ),
        (
            "[youtube] abc: This video is no longer available because the YouTube account associated with this video has been terminated.",
            "permanent",
            "no longer available",
        ),
        ("Unsupported URL: https://example.com/page", "permanent", "does not support"),
        (
            "[youtube] abc: Sign in to confirm your age. This video may be inappropriate",
            "permanent",
            "age-restricted",
        ),
        (
            "[youtube] abc: Join this channel to get access to members-only content",
            "permanent",
            "members",
        ),
        (
            "[youtube] abc: The uploader has not made this video available in your country",
            "permanent",
            "country",
        ),
        (
            "[youtube] abc: Sign in to confirm you\u2019re not a bot. Use --cookies",
            "retryable",
            "not a bot",
        ),
        (
            "[youtube] abc: Video unavailable. This content isn\u2019t available, try again later.",
            "retryable",
            "try again later",
        ),
        ("[youtube] abc: This live event will begin in 3 hours.", "retryable", "not started"),
        (
            "Unable to download webpage: <urlopen error [Errno -3] Temporary failure in name resolution>",
            "retryable",
            "resolved",
        ),
        ("Unable to download webpage: Read timed out.", "retryable", "timed out"),
        ("Got error: 1000 bytes read, 5000 more expected", "retryable", "cut short"),
        (
            "[generic] loop: Unable to download webpage: HTTP Error 302: Found (redirect loop "
            "detected) (caused by <HTTPError 302: Found>)",
            "permanent",
            "redirects in a loop",
        ),
        ("Exceeded 30 redirects: too many redirects", "permanent", "redirects in a loop"),
        ("Something nobody has seen before", "retryable", "unrecognised yt-dlp error"),
    ],
)
def test_ytdlp_messages_are_classified(message, expected, reason):
    error = classify_ytdlp_error(ytdlp_download_error(message), subject="Video abc")
    kind = PermanentDownloadError if expected == "permanent" else RetryableDownloadError
    assert isinstance(error, kind), error
    assert reason in str(error)
    assert str(error).startswith("Video abc: ")
    assert "ERROR:" not in str(error)


def test_a_full_disk_in_ytdlps_words_is_a_full_disk():
    from yt_dlp.utils import DownloadError

    error = classify_ytdlp_error(
        DownloadError("ERROR: unable to write data: [Errno 28] No space left on device"),
        subject="Video abc",
    )
    assert isinstance(error, InsufficientDiskSpace), error
    assert str(error) == (
        "Video abc: the disk is full: unable to write data: [Errno 28] No space left on device"
    )


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, PermanentDownloadError),
        (401, PermanentDownloadError),
        (404, PermanentDownloadError),
        (410, PermanentDownloadError),
        (403, RetryableDownloadError),
        (408, RetryableDownloadError),
        (429, RetryableDownloadError),
        (500, RetryableDownloadError),
        (502, RetryableDownloadError),
    ],
)
def test_http_status_in_the_exception_chain_decides(status, kind):
    exc = ytdlp_download_error("Unable to download webpage", cause=http_error(status))
    assert isinstance(classify_ytdlp_error(exc, subject="v"), kind)


def test_geo_restriction_is_permanent_by_type():
    from yt_dlp.utils import DownloadError, GeoRestrictedError

    inner = GeoRestrictedError("This video is not available from your location")
    error = classify_ytdlp_error(DownloadError(str(inner), (type(inner), inner, None)), subject="v")
    assert isinstance(error, PermanentDownloadError)


def test_retry_after_is_read_from_the_http_error():
    exc = ytdlp_download_error("x", cause=http_error(429, {"Retry-After": "120"}))
    error = classify_ytdlp_error(exc, subject="v")
    assert isinstance(error, RetryableDownloadError)
    assert error.retry_after == 120
    assert "retry after 120 s" in str(error)


def test_retry_after_parses_seconds_and_http_dates():
    assert parse_retry_after("30") == 30
    future = format_datetime(datetime.now(UTC) + timedelta(seconds=90), usegmt=True)
    assert 80 <= parse_retry_after(future) <= 91
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(past) == 0
    assert parse_retry_after("soon") is None


# -- search -----------------------------------------------------------------------------------


def test_search_results_keep_videos_in_order_without_duplicates():
    info = {
        "_type": "playlist",
        "id": "cats",
        "entries": [
            {
                "_type": "url",
                "ie_key": "Youtube",
                "id": "dQw4w9WgXcQ",
                "title": "A",
                "duration": 212.0,
            },
            {
                "_type": "url",
                "ie_key": "YoutubeTab",
                "id": "UCuAXFkgsw1L7xaCfnd5JJOw",
                "title": "A channel",
            },
            None,
            {
                "_type": "url",
                "ie_key": "Youtube",
                "id": "9bZkp7q19f0",
                "title": "B",
                "duration": None,
            },
            {"_type": "url", "ie_key": "Youtube", "id": "dQw4w9WgXcQ", "title": "A again"},
            {"_type": "url", "ie_key": "Youtube", "id": "bad id"},
        ],
    }
    assert parse_search_results(info) == [
        SearchHit("dQw4w9WgXcQ", "https://www.youtube.com/watch?v=dQw4w9WgXcQ", "A", 212.0),
        SearchHit("9bZkp7q19f0", "https://www.youtube.com/watch?v=9bZkp7q19f0", "B", None),
    ]
    assert parse_search_results({"_type": "playlist", "entries": []}) == []


@pytest.mark.parametrize(("query", "count"), [("  ", 5), ("cats", 0)])
def test_search_rejects_bad_arguments_before_any_request(query, count):
    with pytest.raises(ValueError):
        search_videos(query, count, options=DownloadConfig())


# -- politeness: pauses, bot checks, expired stream URLs, proxies ------------------------------


def _statuses(server: LocalHTTPServer, path: str) -> list[int]:
    return [int(r.status) for r in server.requests if r.path == path]


def test_a_short_retry_after_is_waited_out_and_the_download_goes_on(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "wait.mp4")
    http_server.fail_then_serve("/wait.mp4", status=429, times=1, headers={"Retry-After": "1"})
    lines: list[str] = []
    throttle = LocalThrottle(max_wait_s=5, log=lines.append)

    result = download_video(url, "vid", tmp_path, local_options(), throttle=throttle)

    assert result.path.is_file()
    assert _statuses(http_server, "/wait.mp4") == [429, 200, 200], "asked again once, after"
    assert [p.reason for p in throttle.pauses_met] == ["rate limited (HTTP 429, Retry-After 1s)"]
    assert lines[0].startswith(f"paused host 127.0.0.1:{http_server.port} until ")
    assert lines[1].startswith("waiting ")


@pytest.mark.parametrize("after", [0, 1], ids=["page", "media"])
def test_a_bot_check_page_pauses_the_host_and_is_not_taken_for_an_expired_url(
    http_server, clips, tmp_path, after
):
    url = serve_copy(http_server, clips["mp4"], f"bot{after}.mp4")
    page = b"<html><body>Sign in to confirm you\xe2\x80\x99re not a bot</body></html>"
    http_server.fail_then_serve(f"/bot{after}.mp4", status=403, times=5, after=after)
    http_server.routes[f"/bot{after}.mp4"].body = page

    with pytest.raises(HostPaused) as raised:
        download_video(url, "vid", tmp_path, local_options())

    assert raised.value.met and raised.value.pause.kind == "bot check"
    assert "host 127.0.0.1" in str(raised.value) and "not a bot" in str(raised.value)
    assert http_server.hits(f"/bot{after}.mp4") == after + 1, "no fresh metadata, no retry"
    assert_nothing_left_but(tmp_path)


def test_a_bot_check_in_an_extractor_message_pauses_the_host():
    error = classify_ytdlp_error(
        ytdlp_download_error("[youtube] abc: Sign in to confirm you\u2019re not a bot."),
        subject="Video abc",
    )
    assert isinstance(error, RetryableDownloadError) and error.signal.kind == "bot check"
    private = classify_ytdlp_error(
        ytdlp_download_error("[youtube] abc: This video is private"), subject="Video abc"
    )
    assert isinstance(private, PermanentDownloadError) and "the video is private" in str(private)


def test_an_expired_stream_url_is_extracted_again_at_once(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "expiring.mp4")
    http_server.fail_then_serve("/expiring.mp4", status=403, times=1, after=1)

    result = download_video(url, "vid", tmp_path, local_options())

    assert result.path.read_bytes() == clips["mp4"].read_bytes()
    assert _statuses(http_server, "/expiring.mp4") == [200, 403, 200, 200]


def test_a_stream_url_refused_for_good_is_an_ordinary_retryable_error(http_server, clips, tmp_path):
    url = serve_copy(http_server, clips["mp4"], "refused.mp4")
    http_server.fail_then_serve("/refused.mp4", status=403, times=99, after=1)
    with pytest.raises(RetryableDownloadError, match="HTTP 403") as raised:
        download_video(url, "vid", tmp_path, local_options())
    assert not isinstance(raised.value, HostPaused), "a 403 without a bot page is not a stop"
    assert _statuses(http_server, "/refused.mp4") == [200, 403, 403]
    assert_nothing_left_but(tmp_path)


def test_proxies_are_used_in_turn_and_one_the_host_paused_is_skipped(clips, tmp_path):
    roots = [tmp_path / "proxy-a", tmp_path / "proxy-b"]
    for root in roots:
        root.mkdir()
        shutil.copyfile(clips["mp4"], root / "p.mp4")
    with LocalHTTPServer(roots[0]) as a, LocalHTTPServer(roots[1]) as b:
        proxies = (f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}")
        options = local_options(proxies=proxies)
        throttle = LocalThrottle()
        url = "http://videos.example/p.mp4"  # only the proxies are asked
        for n in range(4):
            download_video(url, f"v{n}", tmp_path / "out", options, throttle=throttle)
        assert a.hits("/p.mp4") == b.hits("/p.mp4") == 4, "two downloads of two requests each"

        signal = ThrottleSignal("rate limited", "HTTP 429", retry_after=600)
        throttle.record_pause(throttle_key("videos.example", proxies[0]), signal)
        for n in range(2):
            download_video(url, f"w{n}", tmp_path / "out", options, throttle=throttle)
        assert (a.hits("/p.mp4"), b.hits("/p.mp4")) == (4, 8)


def test_searches_use_the_proxies(tmp_path):
    with LocalHTTPServer(tmp_path) as proxy:
        options = local_options(proxies=(f"http://127.0.0.1:{proxy.port}",), retries=0)
        with pytest.raises(RetryableDownloadError):
            search_videos("cats", 1, options=options)
    assert any(r.method == "CONNECT" and r.path == "www.youtube.com:443" for r in proxy.requests), (
        "the search asked YouTube through the proxy"
    )


def test_params_map_the_politeness_options():
    options = local_options(sleep_requests_s=0.75, rate_limit="500K")
    params = ytdlp_params(options, proxy="socks5://10.0.0.7:1080")
    assert params["sleep_interval_requests"] == 0.75
    assert params["ratelimit"] == 512_000
    assert params["proxy"] == "socks5://10.0.0.7:1080"
    assert {"sleep_interval_requests", "ratelimit", "proxy"}.isdisjoint(
        ytdlp_params(local_options())
    )


def test_the_speed_is_judged_on_the_last_window_and_the_deadline_on_the_whole():
    from dataminer_dagster.assets.download.pace import DownloadPace

    now = [0.0]
    options = local_options(min_speed_kb_s=1000 / 1024, min_speed_window_s=10, max_download_s=100)
    pace = DownloadPace(options, "Video v", clock=lambda: now[0])
    late = DownloadPace(options, "Video v", clock=lambda: now[0])
    downloaded = 0
    for second in range(1, 30):  # 10 KB/s for 20 s, then 500 B/s
        now[0] = float(second)
        downloaded += 10_000 if second <= 20 else 500
        pace.check(downloaded)  # the last 10 s still moved at least 1 KB/s on average
    now[0], downloaded = 30.0, downloaded + 500
    with pytest.raises(DownloadTooSlow, match=r"4\.9 KB in the last 10 s"):
        pace.check(downloaded)
    now[0] = 101.0
    with pytest.raises(DownloadTooSlow, match=r"longer than download.max_download_s \(100 s\)"):
        late.check(10**9)
