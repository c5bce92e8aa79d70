"""Politeness, the pure parts: which host a URL counts against, which answers mean "stop", how long
a pause lasts, the in-process throttle, and how the projects of a video merge their pace."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataminer_dagster.acquisition.errors import HostPaused, ThrottleSignal
from dataminer_dagster.acquisition.politeness import (
    LocalThrottle,
    PausePolicy,
    default_sleeps,
    host_key,
    proxy_label,
    throttle_key,
    throttle_signal,
)
from dataminer_dagster.assets.download.config import DownloadConfig


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://www.youtube.com/watch?v=dQw4w9WgXcQ", "youtube.com"),
        ("https://youtu.be/dQw4w9WgXcQ", "youtube.com"),
        ("https://m.youtube.com/shorts/dQw4w9WgXcQ", "youtube.com"),
        ("https://rr3---sn-4g5e6nze.googlevideo.com/videoplayback?expire=1", "youtube.com"),
        ("https://www.youtube-nocookie.com/embed/x", "youtube.com"),
        ("https://Example.COM/a.mp4", "example.com"),
        ("https://cdn.example.com:443/a.mp4", "cdn.example.com"),
        ("http://127.0.0.1:8123/a.mp4", "127.0.0.1:8123"),
        ("http://127.0.0.1:8124/a.mp4", "127.0.0.1:8124"),
        ("https://notyoutube.com/a.mp4", "notyoutube.com"),
    ],
)
def test_a_url_counts_against_its_site(url, key):
    assert host_key(url) == key


def test_a_pause_through_a_proxy_is_the_proxy_s_own_and_names_no_credentials():
    assert throttle_key("youtube.com", None) == "youtube.com"
    assert (
        throttle_key("youtube.com", "socks5://user:secret@10.0.0.7:1080")
        == "youtube.com via socks5://10.0.0.7:1080"
    )
    assert proxy_label("10.0.0.8:3128") == "http://10.0.0.8:3128"


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected"),
    [
        (429, {}, "", ("rate limited", None)),
        (429, {"Retry-After": "120"}, "", ("rate limited", 120.0)),
        (503, {}, "", ("overloaded", None)),
        (503, {"Retry-After": "7"}, "", ("overloaded", 7.0)),
        (403, {}, "<p>Sign in to confirm you\u2019re not a bot</p>", ("bot check", None)),
        (429, {}, "Our systems have detected unusual traffic", ("bot check", None)),
        (409, {"Retry-After": "30"}, "", ("asked to wait", 30.0)),
        (403, {}, "Forbidden", None),  # an expired stream URL: not the host's "stop"
        (404, {}, "", None),
        (500, {}, "", None),
        (200, {"Retry-After": "30"}, "", None),
    ],
)
def test_the_answers_that_mean_stop(status, headers, body, expected):
    signal = throttle_signal(status, headers, body)
    assert (signal and (signal.kind, signal.retry_after)) == expected


@given(
    base=st.floats(0.1, 1000),
    cap=st.floats(0.1, 10_000),
    strikes=st.integers(0, 200),
    seed=st.integers(0, 2**32),
)
def test_a_pause_without_retry_after_is_exponential_jittered_and_capped(base, cap, strikes, seed):
    policy = PausePolicy(base_s=base, max_s=cap)
    delay = policy.delay(ThrottleSignal("rate limited", "HTTP 429"), strikes, random.Random(seed))
    full = min(cap, base * 2.0 ** min(strikes, 60))
    assert 0.5 * full <= delay <= full


def test_retry_after_is_honoured_as_given():
    policy = PausePolicy(base_s=60, max_s=600)
    assert policy.delay(ThrottleSignal("rate limited", "HTTP 429", retry_after=3), 9) == 3
    assert policy.delay(ThrottleSignal("overloaded", "HTTP 503", retry_after=5000), 0) == 5000


def test_the_local_throttle_keeps_pauses_in_this_process():
    lines: list[str] = []
    throttle = LocalThrottle(PausePolicy(base_s=60), max_wait_s=0.5, log=lines.append)
    with throttle.request_turn("a.example") as turn:
        assert turn.in_force is None
        pause = throttle.paused(turn.pause(ThrottleSignal("rate limited", "HTTP 429", 0.2)))
    assert pause.retry_after == 0.2 and lines[-1].startswith("paused host a.example until ")
    with throttle.request_turn("a.example") as turn:  # waits the 0.2 s out
        assert turn.in_force is None
    assert throttle.waited_s > 0
    throttle.record_pause("a.example", ThrottleSignal("bot check", "HTTP 403"))  # 30-60 s
    with pytest.raises(HostPaused) as raised:
        throttle.before_starting("a.example")
    assert raised.value.met is False and "bot check (HTTP 403)" in str(raised.value)
    throttle.before_starting("b.example")


def test_the_local_throttle_gives_one_request_turn_at_a_time():
    throttle = LocalThrottle()
    inside, most = [0], [0]
    guard = threading.Lock()

    def request():
        for _ in range(50):
            with throttle.request_turn("a.example"):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == [1]


def test_youtube_gets_yt_dlp_s_sleep_preset_and_other_hosts_none():
    assert default_sleeps("youtube.com").before_download_s == 10
    assert default_sleeps("youtube.com").before_download_max_s == 20
    assert default_sleeps("youtube.com").between_requests_s == 0.75
    assert default_sleeps("127.0.0.1:8123").before_download_s == 0


def test_every_download_key_declares_how_the_projects_of_a_download_merge():
    from dataminer_dagster.assets.download.config import MergeRule

    undeclared = [
        name
        for name, field in DownloadConfig.model_fields.items()
        if not any(isinstance(m, MergeRule) for m in field.metadata)
    ]
    assert undeclared == []
    alone = DownloadConfig(max_height=None, timeout_s=5, blocked_hashtags=["#Cats"])
    merged = DownloadConfig.merged([alone], "example.com")
    assert merged == alone.for_host("example.com").model_copy(update={"blocked_hashtags": ["cats"]})
    assert merged.max_height is None and merged.timeout_s == 5


def test_the_projects_of_a_video_merge_to_the_politest_pace():
    strict = DownloadConfig(
        sleep_interval_s=30,
        rate_limit="500K",
        max_downloads_per_host=1,
        proxies=["http://10.0.0.1:3128"],
        pause_base_s=120,
    )
    loose = DownloadConfig(sleep_interval_s=0, rate_limit="4M", max_downloads_per_host=5)
    unset = DownloadConfig()
    merged = DownloadConfig.merged([loose, strict, unset], "youtube.com")
    assert (merged.sleep_interval_s, merged.max_sleep_interval_s) == (30, 30)
    assert merged.sleep_requests_s == 0.75, "unset: YouTube's default"
    assert merged.rate_limit_bytes == 500 * 1024
    assert merged.max_downloads_per_host == 1
    assert merged.proxies == ["http://10.0.0.1:3128"]
    assert (merged.pauses.base_s, merged.pauses.max_s) == (120, 3600)
    plain = DownloadConfig.merged([unset], "example.com")
    assert (plain.sleep_interval_s, plain.sleep_requests_s, plain.rate_limit_bytes) == (0, 0, None)
    assert plain.max_downloads_per_host == 2 and plain.max_pause_wait_s == 120
