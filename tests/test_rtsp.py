"""Live RTSP cameras: a real GStreamer RTSP server process on loopback streams the car clip as H.264/RTP.

The server runs under Debian's /usr/bin/python3 (gi + GstRtspServer); without those packages the tests
skip with the apt-get line that installs them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import cv2
import numpy as np
import pytest
from rtsp_camera import LOOP_FRAMES, WAIT_S, RtspCamera, require_rtsp_server
from support import free_port, wait_until

from edge.sources import Frame, VideoSource, open_source
from models.errors import FilterForwardError

CLIP = "car-detection.mp4"
CLIP_SIZE = (768, 432)  # (width, height)
CLIP_FPS = 12.5
OUTAGE_S = 10.0  # how long the camera stays down in the reconnect test
CREDENTIALS = "admin:s3cret"


@pytest.fixture(scope="module", autouse=True)
def rtsp_server_available() -> None:
    require_rtsp_server()


@pytest.fixture(scope="module")
def clip(intel_car: Path) -> Path:
    return intel_car / CLIP


@pytest.fixture(scope="module")
def clip_frames(clip: Path) -> list[np.ndarray]:
    """The looped frames, decoded straight from the file."""
    capture = cv2.VideoCapture(str(clip))
    frames = [capture.read()[1] for _ in range(LOOP_FRAMES)]
    capture.release()
    return frames


@pytest.fixture
def camera(clip: Path) -> Iterator[RtspCamera]:
    camera = RtspCamera(clip, free_port())
    yield camera
    camera.stop()


def read_frames(source: VideoSource, count: int) -> list[Frame]:
    frames = [source.read(timeout=WAIT_S) for _ in range(count)]
    assert all(frame is not None for frame in frames), "the RTSP source stopped delivering"
    return frames


def assert_in_order(frames: list[Frame]) -> None:
    assert all(later.index > earlier.index for earlier, later in pairwise(frames))
    assert all(math.isfinite(frame.timestamp) and frame.timestamp >= 0 for frame in frames)
    assert all(later.timestamp >= earlier.timestamp for earlier, later in pairwise(frames))


def assert_clip_frames(frames: list[Frame], clip_frames: list[np.ndarray], first_index: int = 0) -> None:
    """Each connection starts at the clip's first frame and decodes every frame, so a frame's index
    (counted from the connection's first frame) names the clip frame it must equal, bit for bit."""
    for frame in frames:
        assert np.array_equal(frame.image, clip_frames[(frame.index - first_index) % LOOP_FRAMES])


def assert_camera_clock(frames: list[Frame], first_index: int = 0) -> None:
    """Stream time follows the camera's RTP clock, so it is exact however the frames arrived (FFmpeg hands
    out a connection's first seconds in one burst). OpenCV stamps a connection's first frame like its second."""
    stamped = [frame for frame in frames if frame.index > first_index]
    for earlier, later in pairwise(stamped):
        assert later.timestamp - earlier.timestamp == pytest.approx((later.index - earlier.index) / CLIP_FPS, abs=1e-3)


def test_rtsp_camera_delivers_the_clip_in_order(camera: RtspCamera, clip_frames: list[np.ndarray]) -> None:
    camera.start()
    with open_source(camera.url(), pacing="realtime") as source:
        assert source.is_live
        frames = read_frames(source, 30)
        stats = source.stats
        assert source.frame_size == CLIP_SIZE
        assert source.fps == pytest.approx(CLIP_FPS)
    assert stats.online
    assert stats.reconnects == 0
    assert stats.last_error is None
    assert stats.frames_read >= frames[-1].index + 1
    assert_in_order(frames)
    assert_clip_frames(frames, clip_frames)
    assert_camera_clock(frames)


def test_rtsp_camera_restart_goes_offline_and_reconnects(
    camera: RtspCamera, clip_frames: list[np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge.sources")
    camera.start()
    with open_source(camera.url(), pacing="realtime", reconnect_initial=0.25, reconnect_max=2.0) as source:
        before = read_frames(source, 5)
        camera.stop()
        stopped = time.monotonic()
        wait_until(lambda: source.read(timeout=0.05) is None and not source.stats.online, "the source to go offline")
        offline = source.stats
        assert offline.last_error is not None
        while time.monotonic() - stopped < OUTAGE_S:  # the camera stays down: nothing may come out
            assert source.read(timeout=0.5) is None
            assert source.stats.frames_read == offline.frames_read
            assert not source.stats.online
        assert not source.ended  # a live source waits for its camera

        camera.start()  # same port: the camera reboots
        after = read_frames(source, 5)
        stats = source.stats
    assert stats.online
    assert stats.reconnects >= 1
    assert stats.last_error is not None  # kept after recovery
    frames = [*before, *after]
    assert_in_order(frames)
    assert_clip_frames(after, clip_frames, first_index=offline.frames_read)
    assert_camera_clock(before)
    assert_camera_clock(after, first_index=offline.frames_read)
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1  # one report per outage, not one per retry
    assert source.ended


def test_rtsp_credentials_never_reach_logs_or_errors(
    clip: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="edge.sources")
    camera = RtspCamera(clip, free_port(), user=CREDENTIALS)
    try:
        camera.start()
        with pytest.raises(FilterForwardError, match="cannot read video from rtsp://") as error:
            open_source(camera.url("admin:wrong-pass"), fail_fast=True)
        assert "wrong-pass" not in str(error.value)
        with open_source(camera.url(CREDENTIALS), reconnect_initial=0.05, reconnect_max=0.2) as source:
            assert source.read(timeout=WAIT_S) is not None  # the camera accepted the credentials
            camera.stop()
            wait_until(lambda: source.read(timeout=0.05) is None and source.stats.last_error is not None, "an outage")
            seen = [source.name, repr(source), source.stats.last_error]
    finally:
        camera.stop()
    seen += [record.getMessage() for record in caplog.records]
    seen += capfd.readouterr()  # what OpenCV and FFmpeg print themselves
    assert any("127.0.0.1" in text for text in seen)
    assert not [text for text in seen if "s3cret" in text or "wrong-pass" in text]
