"""Video sources: files, image and dataset folders, a real HTTP MJPEG camera, pacing, drops, bad input."""

from __future__ import annotations

import logging
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from itertools import islice, pairwise
from pathlib import Path

import cv2
import numpy as np
import pytest
from support import free_port, wait_until

from edge.sources import DEFAULT_FPS, Frame, RateProbe, VideoSource, open_source, settled_fps
from models.errors import FilterForwardError

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 15.0  # upper bound for every wait; only a broken source ever reaches it
CLIP = "car-detection.mp4"


def gaps(frames: list[Frame]) -> int:
    """Frames never delivered: the index gaps, counting any before the first delivered frame."""
    indices = [-1, *(frame.index for frame in frames)]
    return sum(later - earlier - 1 for earlier, later in pairwise(indices))


@pytest.fixture
def clip(intel_car: Path) -> Path:
    return intel_car / CLIP


@pytest.fixture
def image_folder(tmp_path: Path) -> Callable[[int], Path]:
    """Writes n small PNGs named f1..fn (so plain string order would be wrong); each image is distinct."""

    def write(count: int) -> Path:
        folder = tmp_path / f"images{count}"
        folder.mkdir()
        for number in range(1, count + 1):
            cv2.imwrite(str(folder / f"f{number}.png"), folder_image(number - 1))
        return folder

    return write


def folder_image(index: int) -> np.ndarray:
    image = np.zeros((24, 32, 3), np.uint8)
    image[:, :, 0] = index * 5
    image[index % 24, :, 1] = 255
    return image


# -- recordings: every-frame ----------------------------------------------------------------------------


def test_every_frame_matches_a_direct_decode(clip: Path) -> None:
    direct = cv2.VideoCapture(str(clip))
    expected = [direct.read()[1] for _ in range(8)]
    direct.release()
    with VideoSource(str(clip)) as source:
        assert not source.is_live
        assert source.fps == pytest.approx(12.5)
        assert source.frame_size == (768, 432)
        frames = list(islice(source, 8))
    assert [frame.index for frame in frames] == list(range(8))
    assert [frame.timestamp for frame in frames] == pytest.approx([index / 12.5 for index in range(8)])
    for frame, image in zip(frames, expected, strict=True):
        assert frame.image.dtype == np.uint8
        assert np.array_equal(frame.image, image)


def test_dataset_folder_plays_its_video(clip: Path, intel_car: Path) -> None:
    direct = cv2.VideoCapture(str(clip))
    first = direct.read()[1]
    direct.release()
    with open_source(str(intel_car)) as source:
        assert CLIP in source.name
        assert np.array_equal(next(iter(source)).image, first)


def test_dataset_folder_plays_the_video_its_yaml_names(clip: Path, tmp_path: Path) -> None:
    (tmp_path / "labels.csv").write_text("frame_index,car\n0,1\n")
    (tmp_path / "dataset.yaml").write_text(f"video: {CLIP}\nfps: 15\n")
    (tmp_path / CLIP).symlink_to(clip)
    cv2.imwrite(str(tmp_path / "thumbnail.png"), folder_image(0))
    with VideoSource(str(tmp_path)) as source:
        assert source.frame_size == (768, 432)
        assert source.fps == 15  # the rate dataset.yaml gives, as training and eval take it (the container: 12.5)


@pytest.mark.parametrize("labelled", [False, True], ids=["image-folder", "image-dataset"])
def test_image_folder_plays_in_natural_order_and_ends(image_folder: Callable[[int], Path], labelled: bool) -> None:
    folder = image_folder(12)
    rate = 5.0 if labelled else DEFAULT_FPS  # a dataset plays at the rate its dataset.yaml sets (it played at 25)
    if labelled:  # labels the edge has no use for, in a state training would refuse, do not stop it playing
        (folder / "labels.csv").write_text("frame_index,event\n0,yes\n")
        (folder / "dataset.yaml").write_text(f"fps: {rate}\n")
    with VideoSource(str(folder)) as source:
        frames = list(source)
        assert source.ended
        assert source.fps == rate
        assert source.frame_size == (32, 24)
    assert [frame.index for frame in frames] == list(range(12))
    assert [frame.timestamp for frame in frames] == pytest.approx([index / rate for index in range(12)])
    for frame in frames:
        assert np.array_equal(frame.image, folder_image(frame.index))


def test_fps_override_sets_recording_timestamps(image_folder: Callable[[int], Path]) -> None:
    with VideoSource(str(image_folder(3)), fps=10.0) as source:
        assert [frame.timestamp for frame in source] == pytest.approx([0.0, 0.1, 0.2])


def test_every_frame_never_drops_for_a_slow_consumer(image_folder: Callable[[int], Path]) -> None:
    with VideoSource(str(image_folder(15)), pacing="every-frame", queue_size=2) as source:
        frames = []
        for frame in source:
            frames.append(frame)
            time.sleep(0.005)  # slow consumer; the reader must wait rather than drop
            assert source.stats.frames_read <= len(frames) + 3  # bounded read-ahead: queue + one in hand
        assert source.stats.frames_dropped == 0
    assert [frame.index for frame in frames] == list(range(15))


# -- recordings: realtime -------------------------------------------------------------------------------


def read_slowly(source: VideoSource, behind: int) -> Iterator[Frame]:
    """A consumer that lets the reader decode `behind` more frames after each one it takes."""
    while (frame := source.read(timeout=WAIT_S)) is not None:
        yield frame
        wait_for_reader(source, frame.index + behind)


def wait_for_reader(source: VideoSource, index: int) -> None:
    """Until the reader has decoded past `index`, or a recording has played out (it then goes offline)."""
    wait_until(lambda: source.stats.frames_read > index or not source.stats.online, "the reader to move ahead")


def test_realtime_drops_the_oldest_frames_when_the_consumer_lags(image_folder: Callable[[int], Path]) -> None:
    with VideoSource(str(image_folder(40)), pacing="realtime", fps=500.0, queue_size=2) as source:
        frames = list(read_slowly(source, behind=6))
        stats = source.stats
    assert stats.frames_read == 40
    assert stats.frames_dropped > 0
    assert len(frames) + stats.frames_dropped == 40  # every decoded frame is either delivered or counted
    assert gaps(frames) == stats.frames_dropped  # drops are visible as index gaps
    assert frames[-1].index == 39
    for earlier, later in pairwise(frames):  # after each lag the consumer gets the newest frames, not old ones
        assert later.index >= min(earlier.index + 6, 40) - 2
    for frame in frames:
        assert np.array_equal(frame.image, folder_image(frame.index))


def test_realtime_rides_out_a_stall_shorter_than_its_queue(image_folder: Callable[[int], Path]) -> None:
    """A consumer that lets the reader decode five frames ahead after every frame it takes loses none from a queue
    of eight (the edge's default `buffer_frames`), where a queue of two drops."""
    for queue_size, drops in ((8, False), (2, True)):
        with VideoSource(
            str(image_folder(30 + queue_size)), pacing="realtime", fps=25.0, queue_size=queue_size
        ) as source:
            frames = list(read_slowly(source, behind=5))
            stats = source.stats
        assert (stats.frames_dropped > 0) is drops
        assert len(frames) + stats.frames_dropped == 30 + queue_size


def test_realtime_video_shows_drops_as_gaps(clip: Path) -> None:
    with VideoSource(str(clip), pacing="realtime", fps=400.0) as source:
        frames = list(islice(read_slowly(source, behind=5), 3))
        dropped = source.stats.frames_dropped
    assert gaps(frames) > 0
    assert gaps(frames) <= dropped
    assert all(later.timestamp > earlier.timestamp for earlier, later in pairwise(frames))


# -- bad input ------------------------------------------------------------------------------------------


# source ({tmp} = a scratch folder holding the broken inputs below) -> words the error must contain
BAD_SOURCES = {
    "{tmp}/nope.mp4": "does not exist",
    "{tmp}/x.mp4": "can't be decoded",  # a text file named like a video
    "{tmp}/empty": "no images or video",
    "{tmp}/two": "2 videos",
    "{tmp}/broken": "can't be decoded",  # an image folder whose first image is garbage
    "ftp://127.0.0.1/clip.mp4": "unsupported URL scheme",
    "-1": "malformed",
    "/dev/null-camera": "not a video device",
    "  ": "empty",
}


@pytest.fixture
def broken_inputs(tmp_path: Path) -> Path:
    (tmp_path / "x.mp4").write_text("not a video\n")
    for folder in ("empty", "two", "broken"):
        (tmp_path / folder).mkdir()
    (tmp_path / "two" / "a.mp4").write_bytes(b"")
    (tmp_path / "two" / "b.mkv").write_bytes(b"")
    (tmp_path / "broken" / "f0.png").write_text("not an image")
    return tmp_path


@pytest.mark.parametrize("source, words", BAD_SOURCES.items())
def test_bad_sources_fail_with_one_line(broken_inputs: Path, source: str, words: str) -> None:
    with pytest.raises(FilterForwardError, match=words) as error:
        VideoSource(source.format(tmp=broken_inputs))
    assert "\n" not in str(error.value)


def test_truncated_video_fails_at_open(clip: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.mp4"
    truncated.write_bytes(clip.read_bytes()[:20_000])
    with pytest.raises(FilterForwardError, match="can't be decoded"):
        VideoSource(str(truncated))


def test_credentials_never_reach_the_error() -> None:
    with pytest.raises(FilterForwardError) as error:
        VideoSource("ftp://admin:s3cret@127.0.0.1/cam")
    assert "s3cret" not in str(error.value)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"pacing": "fast"}, "unknown pacing"),
        ({"fps": 0.0}, "fps must be"),
        ({"queue_size": 0}, "queue_size"),
        ({"reconnect_initial": 5.0, "reconnect_max": 1.0}, "backoff"),
    ],
)
def test_bad_options_fail_with_one_line(image_folder: Callable[[int], Path], options: dict, words: str) -> None:
    with pytest.raises(FilterForwardError, match=words):
        VideoSource(str(image_folder(1)), **options)


def test_an_image_that_breaks_mid_stream_raises_after_the_good_frames(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "f0.png"), folder_image(0))
    (tmp_path / "f1.png").write_text("not an image")
    with VideoSource(str(tmp_path)) as source:
        assert source.read(timeout=WAIT_S) is not None
        with pytest.raises(FilterForwardError, match=r"f1\.png can't be decoded"):
            source.read(timeout=WAIT_S)
        assert source.stats.last_error is not None


# -- live: a real HTTP MJPEG camera ---------------------------------------------------------------------


class Camera:
    """`filterforward camera serve` (the clip at 25 fps, or `fps`, 192 pixels wide) as a separate process on
    127.0.0.1."""

    def __init__(self, clip: Path, port: int, fps: float = 25.0) -> None:
        self.clip, self.port, self.fps = clip, port, fps
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        serve = ["camera", "serve", str(self.clip), "--port", str(self.port), "--fps", str(self.fps), "--width", "192"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "filterforward", *serve], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        ready, _, _ = select.select([self.process.stdout], [], [], WAIT_S)
        assert ready and self.process.stdout.readline().strip() == "ready", "the MJPEG camera did not start"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=WAIT_S)
            self.process.stdout.close()
            self.process = None


@pytest.fixture
def camera(clip: Path) -> Iterator[Camera]:
    camera = Camera(clip, free_port())
    yield camera
    camera.stop()


def source_threads(source: VideoSource) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"source {source.name}"]


def test_live_source_reads_goes_offline_and_reconnects(camera: Camera) -> None:
    camera.start()
    with VideoSource(camera.url, pacing="realtime", reconnect_initial=0.05, reconnect_max=0.2) as source:
        assert source.is_live
        first = source.read(timeout=WAIT_S)
        assert first is not None
        assert first.image.shape == (108, 192, 3)
        assert source.frame_size == (192, 108)
        assert source.stats.online
        before = [first, *(source.read(timeout=WAIT_S) for _ in range(4))]
        assert all(frame is not None for frame in before)

        camera.stop()
        wait_until(lambda: source.read(timeout=0.05) is None and not source.stats.online, "the source to go offline")
        offline = source.stats
        assert offline.last_error is not None
        assert source.read(timeout=0.5) is None  # nothing invented while the camera is gone
        assert source.stats.frames_read == offline.frames_read
        assert not source.ended  # a live source waits for its camera

        camera.start()  # same port: the camera reboots
        resumed = source.read(timeout=WAIT_S)
        assert resumed is not None
        stats = source.stats
        assert stats.online
        assert stats.reconnects >= 1
    frames = [*before, resumed]
    assert all(later.index > earlier.index for earlier, later in pairwise(frames))
    assert all(later.timestamp >= earlier.timestamp for earlier, later in pairwise(frames))
    assert source.ended
    assert not source.stats.online
    assert not source_threads(source)


def test_live_camera_that_boots_late_is_waited_for(camera: Camera, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="edge.sources")
    with VideoSource(camera.url, reconnect_initial=0.02, reconnect_max=0.05, name="late-cam") as source:
        assert source.read(timeout=0.2) is None
        assert source.frame_size is None

        def retried() -> bool:
            return sum("still offline" in record.getMessage() for record in caplog.records) >= 2

        wait_until(retried, "reconnect attempts")
        stats = source.stats
        assert not stats.online
        assert "cannot read video from" in (stats.last_error or "")
        warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == 1  # one report per outage, not one per retry

        camera.start()
        frame = source.read(timeout=WAIT_S)
        assert frame is not None
        assert source.stats.online
        assert source.stats.reconnects == 0  # the first connection is not a reconnect


def test_fail_fast_live_source_raises_when_unreachable() -> None:
    with pytest.raises(FilterForwardError, match=r"cannot read video from http://127\.0\.0\.1"):
        VideoSource(f"http://127.0.0.1:{free_port()}/", fail_fast=True)


def test_close_interrupts_a_long_backoff() -> None:
    source = VideoSource(f"http://127.0.0.1:{free_port()}/", reconnect_initial=60.0, reconnect_max=60.0)
    wait_until(lambda: source.read(timeout=0.01) is None and source.stats.last_error is not None, "a failed connect")
    assert source_threads(source)
    source.close()
    assert not source_threads(source)
    assert source.read(timeout=0.0) is None


def measured(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The log records of live sources' measured rates."""
    return [record for record in caplog.records if "measured" in record.getMessage() or "sends" in record.getMessage()]


def test_live_source_measures_the_rate_an_mjpeg_camera_really_sends(
    clip: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """FFmpeg reports 25 fps for any MJPEG-over-HTTP camera: a 12.5 fps one gets its rate measured over its first
    seconds, with one warning."""
    camera = Camera(clip, free_port(), fps=12.5)
    camera.start()
    try:
        with VideoSource(camera.url, pacing="realtime", name="slow-cam") as source:
            assert source.read(timeout=WAIT_S) is not None
            assert source.fps == 25.0  # what the camera claims, until measured
            wait_until(lambda: source.read(timeout=0.5) is not None and measured(caplog), "a measured rate")
            assert source.fps != 25.0  # the measured rate replaced the claimed one (the warning names both)
    finally:
        camera.stop()
    (warning,) = measured(caplog)
    assert warning.levelno == logging.WARNING
    assert f"slow-cam: the camera reports 25.00 fps but sends {source.fps:.2f} fps" in warning.getMessage()
    assert "fps: in the camera's config" in warning.getMessage()


def test_a_measured_rate_replaces_the_reported_one_only_where_they_differ_clearly() -> None:
    assert settled_fps(25.0, 24.1) == 25.0  # the reported rate itself, not a measurement near it
    assert settled_fps(12.5, 12.585) == 12.5
    assert settled_fps(25.0, 12.4876) == 12.5  # an MJPEG camera's made-up 25
    assert settled_fps(None, 9.99613) == 10.0


def test_a_rate_is_measured_after_the_burst_of_frames_buffered_while_connecting() -> None:
    probe = RateProbe(connecting=0.0, reported=25.0)
    # The connection took 1 s to open; the frames the camera sent meanwhile come at once, then one every 80 ms.
    arrivals = [1.0 + 0.01 * n for n in range(12)] + [2.0 + 0.08 * n for n in range(40)]
    rates = [(at, rate) for at in arrivals if (rate := probe.tick(at)) is not None]
    (at, rate), *_ = rates
    assert at == pytest.approx(4.0) and rate == pytest.approx(12.5)  # 2 s after the window opened at 2.0, not sooner


def test_live_fps_option_wins_over_the_measured_rate(clip: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="edge.sources")
    camera = Camera(clip, free_port(), fps=12.5)
    camera.start()
    try:
        with VideoSource(camera.url, pacing="realtime", fps=20.0) as source:
            for _ in range(40):  # well past the seconds a measurement takes
                assert source.read(timeout=WAIT_S) is not None
                assert source.fps == 20.0
    finally:
        camera.stop()
    assert not measured(caplog)


def test_live_fps_cap_leaves_out_frames_over_the_cap_counted_apart_from_drops(camera: Camera) -> None:
    camera.start()
    with VideoSource(camera.url, fps=5.0) as source:  # the camera sends 25 fps
        frames = [source.read(timeout=WAIT_S) for _ in range(3)]
        assert all(frame is not None for frame in frames)
        assert source.fps == 5.0
        stats = source.stats
    # Read as they came (a queue of 8 frames at 5 fps never fills): nothing dropped for being behind, so an alert
    # on drops does not fire for a cap set on purpose.
    assert stats.frames_capped > 0 and stats.frames_dropped == 0
    assert gaps(frames) > 0


# -- decode resolution and decode time ------------------------------------------------------------------


def test_resolution_resizes_every_frame_before_it_is_handed_out(image_folder: Callable[[int], Path]) -> None:
    with VideoSource(str(image_folder(3)), resolution=(16, 12)) as source:
        frames = list(source)
        assert source.frame_size == (16, 12)
    assert [frame.image.shape for frame in frames] == [(12, 16, 3)] * 3
    expected = cv2.resize(folder_image(1), (16, 12), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(frames[1].image, expected)


def test_a_resolution_that_is_not_two_positive_sides_is_rejected(image_folder: Callable[[int], Path]) -> None:
    with pytest.raises(FilterForwardError, match=r"resolution must be \(width, height\) in positive whole pixels"):
        VideoSource(str(image_folder(1)), resolution=(0, 12))


def test_decode_ms_reports_the_mean_decode_time_of_recent_frames(image_folder: Callable[[int], Path]) -> None:
    with VideoSource(str(image_folder(5)), resolution=(64, 48)) as source:
        assert source.stats.decode_ms == 0.0  # no frame handed to the queue yet
        frames = list(source)
        stats = source.stats
    assert len(frames) == 5 and stats.frames_read == 5
    assert 0.0 < stats.decode_ms < float("inf")
