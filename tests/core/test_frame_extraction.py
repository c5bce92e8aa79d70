from __future__ import annotations

import hashlib
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dataminer_dagster.assets.frames.extraction_options import (
    DEFAULT_MAX_FRAME_PIXELS,
    DEFAULT_MAX_FRAMES,
    MIN_FRAME_SIDE,
    ExtractionOptions,
)
from dataminer_dagster.assets.frames.frame_extraction import ExtractionResult, extract_frames
from dataminer_dagster.assets.frames.frame_manifest import read_manifest, write_manifest
from dataminer_dagster.core.images import read_image
from dataminer_dagster.core.media import VideoDecodeError, probe_video
from dataminer_dagster.core.synthetic import (
    SyntheticVideoSpec,
    synthetic_frames,
    write_h264_video,
    write_opencv_video,
)

CUTS = (1.0, 2.5)  # planted scene cuts: frames 30 and 75 at 30 fps
CUT_SPEC = SyntheticVideoSpec(seconds=4.0, scene_cuts=CUTS)


def write_vfr_video(path: Path, times: list[float]) -> Path:
    """H.264 in Matroska with the given frame times (variable frame rate)."""
    import av

    frames = synthetic_frames(SyntheticVideoSpec(seconds=len(times) / 30))
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        for t, image in zip(times, frames, strict=True):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = round(t * 1000), Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("videos")
    return {
        "mp4": write_opencv_video(root / "cuts.mp4", CUT_SPEC),
        "webm": write_opencv_video(root / "cuts.webm", CUT_SPEC),
        # Short GOP so that sparse sampling seeks.
        "h264": write_h264_video(root / "cuts_h264.mp4", CUT_SPEC, gop=15),
        "noise_only": write_opencv_video(root / "noise.mp4", SyntheticVideoSpec(seconds=3.0)),
        "ntsc": write_opencv_video(root / "ntsc.mp4", SyntheticVideoSpec(fps=29.97, seconds=10)),
    }


def extract(video: Path, out_dir: Path, **options) -> ExtractionResult:
    out_dir.mkdir(exist_ok=True)
    return extract_frames(video, out_dir, prefix="vid", options=ExtractionOptions(**options))


def indexes(result: ExtractionResult) -> list[int]:
    return [frame.index for frame in result.frames]


def decoded_frames(video: Path) -> list[np.ndarray]:
    """Every frame, decoded plainly from the start, as BGR arrays."""
    import av

    with av.open(str(video)) as container:
        return [frame.to_ndarray(format="bgr24") for frame in container.decode(video=0)]


# Sampling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mp4", "webm", "h264"])
def test_interval_keeps_every_nth_decoded_frame(videos, tmp_path, kind):
    result = extract(videos[kind], tmp_path / "out", strategy="interval", every_frames=25)

    assert indexes(result) == [0, 25, 50, 75, 100]
    # WebM stores milliseconds.
    expected_times = [i / 30 for i in indexes(result)]
    assert [f.timestamp for f in result.frames] == pytest.approx(expected_times, abs=1e-3)
    assert result.fps == pytest.approx(30)
    assert result.duration == pytest.approx(4.0, abs=0.05)
    # WebM declares no frame count; the packet pass finds it and nothing is capped.
    assert result.frame_count == 120


@pytest.mark.parametrize("kind", ["mp4", "webm", "h264"])
def test_time_keeps_the_first_frame_at_or_after_each_interval(videos, tmp_path, kind):
    result = extract(videos[kind], tmp_path / "out", strategy="time", every_seconds=0.5)

    assert indexes(result) == list(range(0, 120, 15))


def test_time_uses_stream_timestamps_on_29_97_fps(videos, tmp_path):
    result = extract(videos["ntsc"], tmp_path / "out", strategy="time", every_seconds=1.0)

    # int(29.97 * 1) = 29 would drift by a frame per second; timestamps do not.
    assert indexes(result) == [math.ceil(k * 29.97) for k in range(10)]
    for k, frame in enumerate(result.frames):
        assert k <= frame.timestamp < k + 1 / 29.97
        assert frame.timestamp == pytest.approx(frame.index / 29.97)


def test_time_follows_a_variable_frame_rate(tmp_path):
    # 10 fps for 2 s, nothing until 4 s, then 30 fps until 5.5 s.
    times = [i / 10 for i in range(20)] + [4 + i / 30 for i in range(45)]
    video = write_vfr_video(tmp_path / "vfr.mkv", times)

    result = extract(video, tmp_path / "out", strategy="time", every_seconds=1.0)

    assert indexes(result) == [0, 10, 20, 50]
    assert [f.timestamp for f in result.frames] == pytest.approx([0.0, 1.0, 4.0, 5.0])
    assert result.frame_count == len(times)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"strategy": "interval", "every_frames": 10}, [0, 10, 20]),
        ({"strategy": "time", "every_seconds": 0.2}, [0, 6, 12]),
        ({"strategy": "scene"}, [0, 30, 75]),
    ],
)
def test_max_frames_caps_the_frames_kept(videos, tmp_path, options, expected):
    result = extract(videos["mp4"], tmp_path / "out", max_frames=3, **options)

    assert indexes(result) == expected


def test_frames_and_frame_size_are_capped_by_default():
    options = ExtractionOptions(strategy="time", every_seconds=1)
    assert options.max_frames == DEFAULT_MAX_FRAMES == 10_000
    assert options.max_frame_pixels == DEFAULT_MAX_FRAME_PIXELS == 7680 * 4320


@pytest.mark.parametrize("kind", ["mp4", "webm"])
def test_frames_larger_than_the_pixel_cap_are_refused_before_decoding(videos, tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(VideoDecodeError, match=r"320x240 .*over the limit of 76,799 pixels"):
        extract(videos[kind], out, strategy="interval", every_frames=1, max_frame_pixels=76_799)
    assert not list(out.iterdir())
    result = extract(
        videos[kind], out, strategy="interval", every_frames=50, max_frame_pixels=76_800
    )
    assert indexes(result) == [0, 50, 100]


def test_max_frames_does_not_cap_the_frames_scanned(videos, tmp_path):
    # The reference system scanned only max_frames frames, so the cut at frame 30 was never seen.
    result = extract(videos["mp4"], tmp_path / "out", strategy="scene", max_frames=2)

    assert indexes(result) == [0, 30]


@pytest.mark.parametrize("kind", ["mp4", "webm", "h264"])
def test_scene_keeps_the_first_frame_of_each_planted_scene(videos, tmp_path, kind):
    result = extract(videos[kind], tmp_path / "out", strategy="scene")

    assert indexes(result) == [0, 30, 75]
    assert result.frames_decoded == 120


def test_scene_ignores_noise_and_motion(videos, tmp_path):
    result = extract(videos["noise_only"], tmp_path / "out", strategy="scene")

    assert indexes(result) == [0]


@pytest.mark.parametrize(
    ("threshold", "min_scene_seconds", "expected"),
    [
        (27.0, 0.5, [0, 30, 75]),
        (100.0, 0.5, [0, 30]),  # only the strong cut (the other scores about 40)
        (255.0, 0.5, [0]),
        (27.0, 1.6, [0, 75]),  # the cut at 1.0 s is too close to the start
    ],
)
def test_scene_threshold_and_min_gap(videos, tmp_path, threshold, min_scene_seconds, expected):
    result = extract(
        videos["mp4"],
        tmp_path / "out",
        strategy="scene",
        scene_threshold=threshold,
        min_scene_seconds=min_scene_seconds,
    )

    assert indexes(result) == expected


def test_a_low_threshold_detects_every_small_change(videos, tmp_path):
    result = extract(
        videos["noise_only"],
        tmp_path / "out",
        strategy="scene",
        scene_threshold=1.0,
        min_scene_seconds=0.0,
    )

    assert len(result.frames) > 60


@pytest.mark.parametrize(
    ("kind", "every_seconds"), [("h264", 1.5), ("webm", 1.5), ("h264", 0.5), ("mp4", 2.0)]
)
def test_seeking_keeps_exactly_the_frames_a_full_decode_gives(
    videos, tmp_path, kind, every_seconds
):
    result = extract(
        videos[kind],
        tmp_path / "out",
        strategy="time",
        every_seconds=every_seconds,
        image_format="png",
    )

    reference = decoded_frames(videos[kind])
    for frame in result.frames:
        image = read_image(tmp_path / "out" / frame.file_name, order="bgr")
        assert np.array_equal(image, reference[frame.index]), frame.index
    if kind == "h264" and every_seconds > 1:
        assert result.frames_decoded < 100  # it seeked past most of the 120 frames


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"strategy": "interval", "every_frames": 25}, [0, 25, 50, 75, 100]),
        ({"strategy": "scene"}, [0, 30, 75]),
    ],
)
def test_a_raw_stream_without_timestamps_is_indexed_by_counting(tmp_path, options, expected):
    video = write_h264_video(tmp_path / "raw.h264", CUT_SPEC, gop=15)

    result = extract(video, tmp_path / "out", **options)

    assert indexes(result) == expected
    assert result.frames_decoded == 120


def test_progress_is_reported_as_an_increasing_fraction_ending_at_one(videos, tmp_path):
    fractions: list[float] = []

    extract_frames(
        videos["mp4"],
        tmp_path,
        prefix="vid",
        options=ExtractionOptions(strategy="scene"),
        progress=fractions.append,
    )

    assert len(fractions) > 10
    assert fractions == sorted(fractions)
    assert fractions[0] > 0 and fractions[-1] == 1.0


# Output ------------------------------------------------------------------------------------


@pytest.mark.parametrize("image_format", ["jpg", "png", "webp"])
def test_frames_are_written_in_each_format_and_read_back(videos, tmp_path, image_format):
    out_dir = tmp_path / "out"
    result = extract(
        videos["mp4"],
        out_dir,
        strategy="interval",
        every_frames=40,
        image_format=image_format,
    )

    assert sorted(p.name for p in out_dir.iterdir()) == [
        f"vid_000000.{image_format}",
        f"vid_000040.{image_format}",
        f"vid_000080.{image_format}",
    ]
    reference = decoded_frames(videos["mp4"])
    for frame in result.frames:
        data = (out_dir / frame.file_name).read_bytes()
        assert frame.content_hash == hashlib.blake2b(data, digest_size=16).hexdigest()
        assert (frame.width, frame.height) == (320, 240)
        assert frame.sharpness > 0
        image = read_image(out_dir / frame.file_name, order="bgr")
        error = np.abs(image.astype(int) - reference[frame.index]).mean()
        assert error == 0 if image_format == "png" else error < 4


def test_max_side_downscales_the_written_frames(videos, tmp_path):
    result = extract(
        videos["mp4"], tmp_path / "out", strategy="interval", every_frames=60, max_side=160
    )

    assert {(f.width, f.height) for f in result.frames} == {(160, 120)}
    assert read_image(tmp_path / "out" / result.frames[0].file_name).shape == (120, 160, 3)


def write_turned_video(path: Path, *, display_rotation: int = 0, rotate_tag: str | None = None):
    """320x240 H.264 pictures, black with a white square in the top-left corner, marked to be
    shown turned: a display matrix of `display_rotation` degrees (counter-clockwise, as ffprobe
    prints it: a phone's portrait video says -90), or a `rotate` tag (Matroska stores it as
    ROTATE)."""
    import av

    picture = np.zeros((240, 320, 3), np.uint8)
    picture[:40, :40] = 255
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        if display_rotation:
            stream.set_display_rotation(display_rotation)
        if rotate_tag is not None:
            stream.metadata["rotate"] = rotate_tag
        for _ in range(10):
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def white_corner(image: np.ndarray) -> str:
    """Which corner of `image` holds the white square."""
    height, width = image.shape[:2]
    rows, columns = np.nonzero(image.min(axis=2) > 200)
    vertical = "top" if rows.mean() < height / 2 else "bottom"
    return f"{vertical}-{'left' if columns.mean() < width / 2 else 'right'}"


@pytest.mark.parametrize(
    ("name", "marks", "rotation", "size", "corner"),
    [
        ("portrait.mp4", {"display_rotation": -90}, 90, (240, 320), "top-right"),
        ("portrait_other_way.mp4", {"display_rotation": 90}, 270, (240, 320), "bottom-left"),
        ("upside_down.mp4", {"display_rotation": 180}, 180, (320, 240), "bottom-right"),
        ("tagged.mkv", {"rotate_tag": "90"}, 90, (240, 320), "top-right"),
        ("landscape.mp4", {}, 0, (320, 240), "top-left"),
    ],
)
def test_a_rotated_video_is_stored_upright_with_its_rotation(
    tmp_path, name, marks, rotation, size, corner
):
    video = write_turned_video(tmp_path / name, **marks)
    out_dir = tmp_path / "out"

    result = extract(video, out_dir, strategy="interval", every_frames=5, image_format="png")

    assert [(f.width, f.height, f.rotation) for f in result.frames] == [(*size, rotation)] * 2
    for frame in result.frames:
        image = read_image(out_dir / frame.file_name, order="bgr")
        assert image.shape == (size[1], size[0], 3)
        assert white_corner(image) == corner
    write_manifest(result, tmp_path / "frames.parquet")
    assert [f.rotation for f in read_manifest(tmp_path / "frames.parquet")] == [rotation] * 2


def test_a_phone_video_is_stored_as_players_show_it(tmp_path):
    """OpenCV turns a video by its display matrix as players do: the frames stored are its."""
    import cv2

    video = write_turned_video(tmp_path / "portrait.mp4", display_rotation=-90)
    capture = cv2.VideoCapture(str(video))
    shown = capture.read()[1]
    capture.release()

    result = extract(video, tmp_path / "out", strategy="interval", every_frames=10)

    stored = read_image(tmp_path / "out" / result.frames[0].file_name, order="bgr")
    assert stored.shape == shown.shape == (320, 240, 3)
    assert np.abs(stored.astype(int) - shown).mean() < 4


def test_a_manifest_written_before_rotation_was_read_has_frames_turned_by_nothing(tmp_path):
    import pyarrow.parquet as pq

    video = write_turned_video(tmp_path / "landscape.mp4")
    result = extract(video, tmp_path / "out", strategy="scene")
    write_manifest(result, tmp_path / "frames.parquet")
    table = pq.read_table(tmp_path / "frames.parquet")
    pq.write_table(table.drop_columns(["rotation"]), tmp_path / "frames.parquet")

    assert [f.rotation for f in read_manifest(tmp_path / "frames.parquet")] == [0]


def test_manifest_round_trip(videos, tmp_path):
    result = extract(videos["mp4"], tmp_path / "out", strategy="scene")

    write_manifest(result, tmp_path / "frames.parquet")

    assert read_manifest(tmp_path / "frames.parquet") == result.frames


def test_manifest_missing_columns_are_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"frame_index": [0], "file_name": ["a.jpg"]}), tmp_path / "m.parquet")

    with pytest.raises(ValueError, match="lacks the columns timestamp, width, height, sharpness"):
        read_manifest(tmp_path / "m.parquet")


# Options -----------------------------------------------------------------------------------


def profile(**options) -> str:
    return ExtractionOptions(**options).profile_id()


def test_profile_id_depends_only_on_what_changes_the_output():
    base = profile(strategy="time", every_seconds=1)

    assert len(base) == 12 and int(base, 16) >= 0
    assert base == profile(strategy="time", every_seconds=1.0)
    assert base == profile(strategy="time", every_seconds=1, scene_threshold=40, every_frames=7)
    changed = [
        profile(strategy="time", every_seconds=2),
        profile(strategy="interval", every_frames=30),
        profile(strategy="time", every_seconds=1, max_frames=10),
        profile(strategy="time", every_seconds=1, image_format="png"),
        profile(strategy="time", every_seconds=1, quality=80),
        profile(strategy="time", every_seconds=1, max_side=640),
    ]
    assert len({base, *changed}) == 7
    # png is lossless: quality does not change it
    assert profile(strategy="scene", image_format="png") == profile(
        strategy="scene", image_format="png", quality=50
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strategy": "keyframe"}, "strategy must be one of interval, time, scene; got 'keyframe'"),
        ({"strategy": "interval"}, "strategy 'interval' needs every_frames >= 1, got None"),
        ({"strategy": "time", "every_seconds": 0}, "strategy 'time' needs every_seconds > 0"),
        ({"strategy": "scene", "scene_threshold": 0}, "scene_threshold must be in (0, 255]"),
        ({"strategy": "scene", "max_frames": 0}, "max_frames must be >= 1 or None, got 0"),
        ({"strategy": "scene", "image_format": "jpeg"}, "image_format must be one of jpg, png"),
        ({"strategy": "scene", "quality": 101}, "quality must be between 1 and 100, got 101"),
    ],
)
def test_invalid_options_name_the_key_and_allowed_values(options, message):
    with pytest.raises(ValueError) as error:
        ExtractionOptions(**options)

    assert message in str(error.value)


# Errors ------------------------------------------------------------------------------------


def write_audio_only(path: Path) -> Path:
    import av

    with av.open(str(path), "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 800), np.int16), format="s16", layout="mono"
        )
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


NOT_A_VIDEO = "Invalid data found when processing input; the file is not a video or it is truncated"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("missing", "file not found"),
        ("zero-bytes", "file is empty (0 bytes)"),
        ("text", NOT_A_VIDEO),
        ("truncated-mp4", NOT_A_VIDEO),  # the moov atom (the index) is at the end of the file
        ("audio-only", "no video stream in the file"),
        ("directory", "a directory, not a regular file"),
        ("fifo", "a named pipe (FIFO), not a regular file"),  # opening it would wait for ever
        ("dev-zero", "a character device (a symbolic link to /dev/zero), not a regular file"),
        (
            "link-loop",
            "a symbolic link loop (its links lead back to themselves), not a regular file",
        ),
    ],
)
def test_unusable_files_raise_with_the_reason_and_path(videos, tmp_path, content, reason):
    path = tmp_path / "abc123.mp4"
    if content == "directory":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content == "dev-zero":
        path.symlink_to("/dev/zero")
    elif content == "link-loop":
        path.symlink_to(path.name)
    elif content == "zero-bytes":
        path.write_bytes(b"")
    elif content == "text":
        path.write_text("just some notes\n" * 50)
    elif content == "truncated-mp4":
        data = videos["mp4"].read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif content == "audio-only":
        write_audio_only(path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    with pytest.raises(VideoDecodeError) as error:
        extract_frames(path, out_dir, prefix="abc123", options=ExtractionOptions("scene"))

    assert str(error.value) == f"Video abc123 could not be decoded: {reason} (file {path})"
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("directory", "a directory, not a regular file"),
        ("fifo", "a named pipe (FIFO), not a regular file"),
        ("dev-zero", "a character device (a symbolic link to /dev/zero), not a regular file"),
    ],
)
def test_probing_names_what_a_path_is_instead_of_file_not_found(tmp_path, content, reason):
    """The download stage probes a local file in place: each of these was "file not found"."""
    path = tmp_path / "abc123.mp4"
    {"directory": path.mkdir, "fifo": lambda: os.mkfifo(path)}.get(
        content, lambda: path.symlink_to("/dev/zero")
    )()

    with pytest.raises(VideoDecodeError) as error:
        probe_video(path, video_id="abc123")

    assert str(error.value) == f"Video abc123 could not be decoded: {reason} (file {path})"


def test_probing_a_phone_video_gives_its_upright_size(tmp_path):
    probe = probe_video(write_turned_video(tmp_path / "portrait.mp4", display_rotation=-90))
    assert (probe.width, probe.height) == (240, 320)


@pytest.mark.parametrize(("width", "height"), [(1, 1), (16, 16), (320, 16)])
def test_frames_smaller_than_the_minimum_side_are_refused(tmp_path, width, height):
    """A 1x1 frame used to be scored (its channels mistaken for its rows) and kept."""
    video = write_opencv_video(
        tmp_path / "tiny.avi", SyntheticVideoSpec(width=width, height=height, fps=10, seconds=1)
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    with pytest.raises(VideoDecodeError) as error:
        extract_frames(video, out_dir, prefix="tiny", options=ExtractionOptions("scene"))

    assert str(error.value) == (
        f"Video tiny could not be decoded: its frames are {width}x{height}, smaller than "
        f"{MIN_FRAME_SIDE} pixels a side; no filter or detector can use them (file {video})"
    )
    assert list(out_dir.iterdir()) == []


def test_frames_of_the_minimum_side_are_kept(tmp_path):
    video = write_opencv_video(
        tmp_path / "small.avi", SyntheticVideoSpec(width=48, height=32, fps=10, seconds=1)
    )

    result = extract(video, tmp_path / "out", strategy="interval", every_frames=5)

    assert [(f.width, f.height) for f in result.frames] == [(48, 32)] * 2


def test_a_cut_off_webm_keeps_its_frames_and_warns(videos, tmp_path):
    data = videos["webm"].read_bytes()
    video = tmp_path / "cut.webm"
    video.write_bytes(data[: len(data) // 2])

    result = extract(video, tmp_path / "out", strategy="interval", every_frames=20)

    assert indexes(result) == [0, 20, 40]
    assert len(result.warnings) == 1
    assert "it may be truncated" in result.warnings[0]


def test_corrupt_data_part_way_keeps_the_frames_before_it_and_warns(videos, tmp_path):
    data = bytearray(videos["h264"].read_bytes())
    middle = len(data) // 2
    data[middle : middle + len(data) // 5] = np.random.default_rng(0).bytes(len(data) // 5)
    video = tmp_path / "corrupt.mp4"
    video.write_bytes(bytes(data))

    result = extract(video, tmp_path / "out", strategy="interval", every_frames=10)

    assert indexes(result)[0] == 0 and len(result.frames) < 12
    assert [w for w in result.warnings if w.startswith("decoding stopped early at t=")]
