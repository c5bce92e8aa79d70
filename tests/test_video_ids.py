import re

import pytest

from dataminer_dagster.acquisition.video_ids import (
    is_youtube_url,
    video_id_for_file,
    video_id_for_url,
    youtube_watch_url,
)

YT = "dQw4w9WgXcQ"
SAFE = re.compile(r"[A-Za-z0-9_-]+")


@pytest.mark.parametrize(
    "url",
    [
        f"https://www.youtube.com/watch?v={YT}",
        f"http://www.youtube.com/watch?v={YT}",
        f"https://youtube.com/watch?v={YT}",
        f"https://m.youtube.com/watch?v={YT}",
        f"https://music.youtube.com/watch?v={YT}&feature=share",
        f"https://WWW.YouTube.com/watch?v={YT}",
        f"https://www.youtube.com/watch?feature=shared&v={YT}&t=42s",
        f"https://www.youtube.com/watch?v={YT}&list=PL590L5WQmH8fJ54F369BLDSqIwcs-TCfs&index=3",
        f"https://www.youtube.com/watch?v={YT}#t=30",
        f"https://www.youtube.com/watch/?v={YT}",
        f"https://youtu.be/{YT}",
        f"https://youtu.be/{YT}?si=abc123&t=10",
        f"https://www.youtu.be/{YT}/",
        f"https://www.youtube.com/embed/{YT}?autoplay=1",
        f"https://www.youtube-nocookie.com/embed/{YT}",
        f"https://www.youtube.com/v/{YT}",
        f"https://www.youtube.com/shorts/{YT}",
        f"https://youtube.com/shorts/{YT}?feature=share",
        f"https://www.youtube.com/live/{YT}?si=x",
        f"https://www.youtube.com:443/watch?v={YT}",
        f"  https://www.youtube.com/watch?v={YT}  ",
    ],
)
def test_youtube_urls_give_the_11_character_id(url):
    assert video_id_for_url(url) == YT
    assert is_youtube_url(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("not a url", "whitespace"),
        ("www.youtube.com/watch?v=dQw4w9WgXcQ", "only http"),
        ("youtu.be/dQw4w9WgXcQ", "only http"),
        ("ftp://example.com/video.mp4", "only http"),
        ("file:///tmp/video.mp4", "only http"),
        ("https://", "no host"),
        ("https://example.com:99999/a.mp4", "Port out of range"),
        ("https://www.youtube.com/watch?v=short", "invalid YouTube video id"),
        ("https://www.youtube.com/watch?v=dQw4w9WgXcQQ", "invalid YouTube video id"),
        ("https://www.youtube.com/watch?v=dQw4w9WgX.Q", "invalid YouTube video id"),
        ("https://youtu.be/", "without a video id"),
        ("https://www.youtube.com/watch", "without a video id"),
        ("https://www.youtube.com/@somechannel", "without a video id"),
        ("https://www.youtube.com/playlist?list=PL590L5WQmH8fJ54F369BLDSqIwcs-TCfs", "without"),
        ("https://www.youtube.com/channel/UCuAXFkgsw1L7xaCfnd5JJOw", "without a video id"),
        ("https://www.youtube.com/shorts/", "without a video id"),
    ],
)
def test_unusable_urls_raise_a_message_naming_the_url(url, message):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        video_id_for_url(url)
    if url.strip():
        assert repr(url) in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        # The reference system's regex fallback took an 11-character path segment of any host.
        "https://example.com/dQw4w9WgXcQ",
        "https://example.com/watch?v=dQw4w9WgXcQ",
        "https://notyoutube.com/watch?v=dQw4w9WgXcQ",
        "https://youtube.com.evil.example/watch?v=dQw4w9WgXcQ",
        "https://vimeo.com/live/dQw4w9WgXcQ",
    ],
)
def test_other_hosts_never_yield_a_youtube_id(url):
    video_id = video_id_for_url(url)
    assert not is_youtube_url(url)
    assert video_id != YT
    assert len(video_id) != 11


@pytest.mark.parametrize(
    ("url", "slug"),
    [
        ("https://example.com/media/My_Clip.final.mp4", "my_clip-final-"),
        ("https://example.com/media/My%20Clip.mp4", "my-clip-"),
        ("https://cdn.example.org/v/clip.webm?token=abc", "clip-"),
        ("https://example.com/", "example-com-"),
        ("https://example.com", "example-com-"),
        ("http://10.0.0.5:8080/videos/", "videos-"),
        ("https://example.com/vid%C3%A9o-%C3%A9t%C3%A9.mp4", "video-ete-"),
        ("https://example.com/" + "x" * 200 + ".mp4", "x" * 20 + "-"),
        ("https://example.com/%E6%97%A5%E6%9C%AC.mp4", ""),
    ],
)
def test_other_urls_get_a_safe_slug_and_hash_id(url, slug):
    video_id = video_id_for_url(url)
    assert SAFE.fullmatch(video_id), video_id
    assert "." not in video_id
    assert 16 <= len(video_id) <= 40
    assert video_id.startswith(slug)
    assert video_id == video_id_for_url(url)  # stable


def test_derived_ids_ignore_cosmetic_url_differences_only():
    base = video_id_for_url("https://example.com/v/clip.mp4?a=1&b=2")
    assert video_id_for_url("HTTPS://EXAMPLE.com:443/v/clip.mp4?b=2&a=1#frag") == base
    assert video_id_for_url("https://example.com/v/clip.mp4?a=1&b=3") != base
    assert video_id_for_url("https://example.com/w/clip.mp4?a=1&b=2") != base
    assert video_id_for_url("http://example.com/v/clip.mp4?a=1&b=2") != base


def test_file_ids_are_safe_stable_and_distinct(tmp_path, monkeypatch):
    first = video_id_for_file(tmp_path / "a" / "Holiday Video.MP4")
    second = video_id_for_file(tmp_path / "b" / "Holiday Video.MP4")
    assert first.startswith("holiday-video-")
    assert first != second
    assert SAFE.fullmatch(first) and len(first) <= 40
    monkeypatch.chdir(tmp_path)
    assert video_id_for_file("a/Holiday Video.MP4") == first
    assert video_id_for_file(str(tmp_path / "a" / ".." / "a" / "Holiday Video.MP4")) == first
    with pytest.raises(ValueError, match="empty"):
        video_id_for_file("")


@pytest.mark.parametrize("value", ["https://example.com/a.mp4", "", "::", "youtu.be/x", None])
def test_is_youtube_url_rejects_non_youtube_values(value):
    assert not is_youtube_url(value)


def test_watch_url_is_canonical_and_validated():
    assert youtube_watch_url(YT) == f"https://www.youtube.com/watch?v={YT}"
    with pytest.raises(ValueError, match="not a YouTube video id"):
        youtube_watch_url("abc")
