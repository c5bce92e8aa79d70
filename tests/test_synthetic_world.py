"""The synthetic world's truth (core.world): boxes on the drawn pixels, planted duplicates in the
right groups after each edit, the same world from the same seed, junk without objects, and the
written videos showing what their truth files say."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from dataminer_dagster.core.coco import box_iou
from dataminer_dagster.core.world import (
    WorldVideo,
    edits_of,
    load_world,
    plan_world,
    write_world,
)
from dataminer_dagster.core.world_render import (
    COLOURS,
    JUNK_KINDS,
    MIN_VISIBLE_PIXELS,
    Crop,
    Mirror,
    Overlay,
    Reencode,
    Resize,
    SpeedUp,
)
from dataminer_dagster.core.world_truth import FrameTruth, ObjectTruth, VideoTruth, caption
from dataminer_dagster.demo import serve_directory

SEED = 7
# A pixel is of an object's colour within this many levels per channel (noise, resampling).
COLOUR_TOLERANCE = 30


@pytest.fixture(scope="module")
def world():
    return plan_world(SEED)


@pytest.fixture(scope="module")
def written(world, tmp_path_factory):
    directory = tmp_path_factory.mktemp("world")
    write_world(directory, world)
    return load_world(directory)


def _colour_mask(frame: np.ndarray, colour: str) -> np.ndarray:
    """Pixels of a BGR frame that have the named colour (COLOURS gives it in RGB)."""
    rgb = frame[..., ::-1].astype(np.int16)
    return np.abs(rgb - COLOURS[colour]).max(axis=2) <= COLOUR_TOLERANCE


def _frames(video: WorldVideo, step: int = 3):
    for index in range(0, video.frame_count, step):
        yield video.render(index)


def _source_of(world, video: WorldVideo) -> WorldVideo:
    return next(v for v in world.videos if v.source == video.source and not v.edits)


def test_boxes_are_inside_the_frame_and_on_the_object_pixels(world):
    checked = 0
    for video in world.videos:
        # a resized frame blends the pixels along an edge that the label map gives the object
        band = 3 if any(isinstance(edit, Resize) for edit in video.edits) else 2
        for frame, truth in _frames(video):
            height, width = frame.shape[:2]
            for obj in truth.objects:
                x, y, w, h = obj.box
                assert x >= 0 and y >= 0 and w > 0 and h > 0, (video.name, truth.index, obj)
                assert x + w <= width and y + h <= height, (video.name, truth.index, obj)
                inside = _colour_mask(frame[y : y + h, x : x + w], obj.colour)
                assert inside.sum() >= 0.6 * obj.area, (video.name, truth.index, obj)
                # tight: the object's colour reaches every side of its box
                for side in (inside[:band], inside[-band:], inside[:, :band], inside[:, -band:]):
                    assert side.any(), (video.name, truth.index, obj)
                checked += 1
            if truth.is_junk:
                continue
            # nothing drawn is missing from the truth (white is left out: banners write in it)
            for colour in set(COLOURS) - {"white"}:
                outside = _colour_mask(frame, colour)
                for obj in truth.objects:
                    if obj.colour == colour:
                        x, y, w, h = obj.box
                        outside[y : y + h, x : x + w] = False
                assert outside.sum() < 2 * MIN_VISIBLE_PIXELS, (video.name, truth.index, colour)
    assert checked > 200


def _objects(truth: FrameTruth) -> dict[tuple[str, str], ObjectTruth]:
    return {(obj.shape, obj.colour): obj for obj in truth.objects}


def _boxes(truth: FrameTruth) -> dict[tuple[str, str], tuple[int, int, int, int]]:
    return {key: obj.box for key, obj in _objects(truth).items()}


def _source_frame(source: WorldVideo, truth: FrameTruth) -> tuple[np.ndarray, FrameTruth]:
    index = round(truth.source_t * source.fps)
    assert abs(index / source.fps - truth.source_t) < 1e-6, "a duplicate shows a source frame"
    return source.render(index)


def _edited_pixels(edit, image: np.ndarray) -> np.ndarray | None:
    """The source frame as an edit that moves pixels without resampling them shows it."""
    if isinstance(edit, (Reencode, SpeedUp)):
        return image
    if isinstance(edit, Mirror):
        return image[:, ::-1]
    if isinstance(edit, Crop):
        x, y, w, h = edit.window(image.shape[1], image.shape[0])
        return image[y : y + h, x : x + w]
    return None


def test_planted_duplicates_keep_their_group_and_move_their_boxes_with_each_edit(world):
    edited = [video for video in world.videos if video.edits]
    assert {type(e) for v in edited for e in v.edits} == {
        Reencode,
        Resize,
        Crop,
        Mirror,
        Overlay,
        SpeedUp,
    }
    for video in edited:
        source = _source_of(world, video)
        (edit,) = video.edits
        width, height = source.source.width, source.source.height
        compared = 0
        for frame, truth in _frames(video, step=1):
            source_image, original = _source_frame(source, truth)
            expected = _edited_pixels(edit, source_image)
            assert expected is None or np.array_equal(frame, expected), (video.name, truth.index)
            assert (truth.group, truth.kind, truth.scene) == (
                original.group,
                original.kind,
                original.scene,
            )
            assert truth.group.startswith(source.source.name + "/")
            before, after = _objects(original), _boxes(truth)
            assert set(after) <= set(before), (video.name, truth.index)
            for key, obj in before.items():
                moved = _expected_box(edit, obj, width, height)
                if moved is None:
                    continue  # partly cut away, hidden or shrunk: only inclusion is promised
                assert key in after, (video.name, truth.index, key)
                got = np.array(after[key])
                if isinstance(edit, Resize):  # nearest sampling skips a thin tip's rows
                    assert box_iou(got, moved) >= 0.6, (video.name, edit, key, got, moved)
                else:
                    assert np.array_equal(got, moved), (video.name, edit, key, got, moved)
                compared += 1
            for key, box in after.items():
                _assert_within(box, _clipped_box(edit, before[key].box, width, height, frame.shape))
        assert compared > 0, f"{video.name} ({edit}) compared no box"


def _expected_box(edit, obj: ObjectTruth, width: int, height: int):
    """Where an object wholly kept by `edit` must be boxed; None when the edit may cut it."""
    box = x, y, w, h = obj.box
    if isinstance(edit, (Reencode, SpeedUp)):
        return np.array(box)
    if isinstance(edit, Mirror):
        return np.array([width - x - w, y, w, h])
    if isinstance(edit, Resize):
        sx, sy = edit.width / width, edit.height / height
        if obj.area * sx * sy < 2 * MIN_VISIBLE_PIXELS:
            return None
        return np.array([x * sx, y * sy, w * sx, h * sy]).round()
    if isinstance(edit, Crop):
        cx, cy, cw, ch = edit.window(width, height)
        inside = cx <= x and cy <= y and x + w <= cx + cw and y + h <= cy + ch
        return np.array([x - cx, y - cy, w, h]) if inside else None
    if isinstance(edit, Overlay):
        return np.array(box) if y + h <= height - edit.banner_height(height) else None
    raise AssertionError(edit)


def _clipped_box(edit, box, width, height, shape):
    """The source box moved by `edit` and clipped to the edited frame."""
    x, y, w, h = box
    if isinstance(edit, Crop):
        cx, cy, _, _ = edit.window(width, height)
        x, y = x - cx, y - cy
    elif isinstance(edit, Mirror):
        x = width - x - w
    elif isinstance(edit, Resize):
        sx, sy = edit.width / width, edit.height / height
        x, y, w, h = x * sx - 1, y * sy - 1, w * sx + 2, h * sy + 2
    x0, y0 = max(x, 0), max(y, 0)
    return x0, y0, min(x + w, shape[1]) - x0, min(y + h, shape[0]) - y0


def _assert_within(inner, outer):
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    assert ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh, (inner, outer)


def test_the_same_seed_draws_the_same_world_and_another_seed_another():
    first, again, other = plan_world(SEED), plan_world(SEED), plan_world(SEED + 1)
    assert first == again
    for video, twin in zip(first.videos, again.videos, strict=True):
        for index in (0, video.frame_count // 2, video.frame_count - 1):
            (frame, truth), (frame_again, truth_again) = video.render(index), twin.render(index)
            assert np.array_equal(frame, frame_again) and truth == truth_again
    assert first != other
    frame, _ = first.videos[0].render(5)
    assert not np.array_equal(frame, other.videos[0].render(5)[0])


def test_junk_scenes_hold_no_objects_and_every_junk_kind_is_planted(world):
    seen = set()
    for video in world.videos:
        for frame, truth in _frames(video, step=1):
            if truth.is_junk:
                seen.add(truth.junk)
                assert truth.objects == (), (video.name, truth)
                if truth.junk == "black":
                    assert frame.mean() < 10
            else:
                assert truth.junk is None
    assert seen == set(JUNK_KINDS)


def test_a_decoded_frame_matches_its_truth_at_its_timestamp(world, written):
    import av

    videos = {video.name: video for video in world.videos}
    for path, truth in written.truths.items():
        video = videos[truth.video]
        decoded = 0
        with av.open(str(written.directory / path)) as container:
            for frame in container.decode(video=0):
                image = frame.to_ndarray(format="bgr24")
                at = truth.at(frame.time)
                rendered, rendered_truth = video.render(at.index)
                assert rendered_truth == at
                assert image.shape == rendered.shape == (truth.height, truth.width, 3)
                assert np.abs(image.astype(np.int16) - rendered).mean() < 12, (path, at.index)
                for obj in at.objects:
                    if obj.area < 150:
                        continue
                    x, y, w, h = obj.box
                    mask = _colour_mask(rendered[y : y + h, x : x + w], obj.colour)
                    seen = np.median(image[y : y + h, x : x + w][mask][:, ::-1], axis=0)
                    assert np.abs(seen - COLOURS[obj.colour]).max() <= 40, (path, at.index, obj)
                decoded += 1
        assert decoded == len(truth.frames), path


def test_the_written_world_is_served_with_a_second_url_for_one_video(world, written):
    assert len(written.truths) == len(world.videos) + 1
    with serve_directory(written.directory) as base:
        urls = written.urls(base)
        bodies = {url: urllib.request.urlopen(url, timeout=10).read() for url in urls}
    alias = next(url for url in urls if "/mirror-site/" in url)
    twin = next(
        url for url in urls if written.truth_for(url) is written.truth_for(alias) and url != alias
    )
    assert bodies[alias] == bodies[twin]
    assert len({bodies[url] for url in urls}) == len(world.videos)
    for video in world.videos:
        truth = written.truth_for(f"{base}/{video.name}")
        assert [e.to_json() for e in edits_of(truth)] == [e.to_json() for e in video.edits]
        assert truth.frames == tuple(video.render(i)[1] for i in range(video.frame_count))


def test_truth_at_a_time_names_the_frame_shown_then(world):
    video = world.videos[0]
    frames = tuple(video.render(i)[1] for i in range(video.frame_count))
    truth = VideoTruth("v.mp4", "s", (), 256, 192, video.fps, frames)
    assert truth.at(0.0).index == 0
    assert truth.at(0.99 / video.fps).index == 0
    assert truth.at(1 / video.fps).index == 1
    assert truth.at(truth.duration).index == len(frames) - 1
    with pytest.raises(ValueError, match="outside video v.mp4"):
        truth.at(truth.duration + 1)


def test_a_caption_says_the_frame_in_words():
    red_circle = ObjectTruth("circle", "red", (0, 0, 4, 4), 12, 1.0)
    blue_square = ObjectTruth("square", "blue", (5, 5, 4, 4), 16, 1.0)
    frame = FrameTruth(0, 0.0, 0.0, 0, "content", None, "stripes", "s00/0", (red_circle,))
    assert caption(frame) == "a red circle on stripes"
    both = FrameTruth(0, 0.0, 0.0, 0, "content", None, "checks", "s00/0", (red_circle, blue_square))
    assert caption(both) == "a red circle and a blue square on a checkerboard"
    black = FrameTruth(0, 0.0, 0.0, 1, "junk", "black", "noise", "s00/1")
    assert caption(black) == "a black screen"
