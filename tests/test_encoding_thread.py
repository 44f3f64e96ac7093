"""The camera's stream encoder on its own thread: jobs in order, fragments emitted there, errors raised on the
camera's thread, all with real x264 on real frames of the car clip."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from support import clip_frames

from common.fragment import Fragment
from edge.encoding_thread import EncodingThread
from edge.stream_encoder import StreamEncoder
from models.errors import FilterForwardError

FPS = 12.5


@pytest.fixture(scope="module")
def frames(intel_car: Path) -> list[np.ndarray]:
    return clip_frames(intel_car / "car-detection.mp4", 40, 30, (192, 108))


def test_jobs_run_in_order_on_their_own_thread_and_wait_returns_once_all_are_sent(frames) -> None:
    emitted: list[tuple[str, Fragment]] = []
    worker = EncodingThread(
        "cam",
        StreamEncoder(FPS, preset="veryfast"),
        lambda f: emitted.extend((threading.current_thread().name, fragment) for fragment in f),
    )
    worker.submit(StreamEncoder.new_gop)
    for index, frame in enumerate(frames):
        worker.submit(lambda encoder, frame=frame, index=index: encoder.add(frame, index, index / FPS))
    worker.submit(StreamEncoder.finish)
    worker.wait()
    assert {name for name, _ in emitted} == {"encode-cam"}
    assert [e.index for _, f in emitted for e in f.header.frames] == list(range(30))  # all, in order


def test_an_encoder_error_is_raised_on_the_cameras_thread(frames) -> None:
    worker = EncodingThread("cam", StreamEncoder(FPS, preset="veryfast"), lambda f: None)
    worker.submit(lambda encoder: encoder.add(frames[0], 0, 0.0))
    worker.submit(lambda encoder: encoder.add(cv2.resize(frames[1], (96, 54)), 1, 1 / FPS))
    with pytest.raises(FilterForwardError, match="must keep one size within a crop: got 96x54 after 192x108"):
        worker.wait()
    worker.submit(StreamEncoder.finish)  # the error was raised once; the thread goes on
    worker.wait()
