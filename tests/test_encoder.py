"""JPEG frames, MP4 event clips and the whole-stream H.264 baseline, decoded back with OpenCV and PyAV."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from support import clip_frames

from cloud.clips import encode_clip as cloud_clip
from common.video import even
from edge.encoder import ClipEncoder, encode_jpeg, encode_stream_h264
from models.errors import FilterForwardError

FPS = 12.5
SIZE = (192, 108)  # (width, height): the clip downscaled 4x


@pytest.fixture(scope="module")
def frames(intel_car: Path) -> list[np.ndarray]:
    """16 frames while car A drives through (from frame 54), downscaled."""
    return clip_frames(intel_car / "car-detection.mp4", 54, 16, SIZE)


def decode_mp4(data: bytes) -> tuple[list[np.ndarray], Fraction]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        decoded = [frame.to_ndarray(format="bgr24") for frame in container.decode(stream)]
        return decoded, stream.average_rate


def encode_clip(frames: list[np.ndarray], crf: int = 23) -> bytes:
    height, width = frames[0].shape[:2]
    encoder = ClipEncoder(width, height, FPS, crf=crf)
    for frame in frames:
        encoder.add(frame)
    return encoder.finish()


def mean_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_jpeg_round_trip_and_quality(frames: list[np.ndarray]) -> None:
    frame = frames[8]
    high, low = encode_jpeg(frame, 95), encode_jpeg(frame, 20)
    decoded = cv2.imdecode(np.frombuffer(high, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == frame.shape
    assert mean_abs_error(decoded, frame) < 3
    assert len(low) < len(high)
    grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
    assert cv2.imdecode(np.frombuffer(encode_jpeg(grey, 80), np.uint8), cv2.IMREAD_UNCHANGED).shape == grey.shape


@pytest.mark.parametrize(
    ("image", "quality"),
    [
        (np.zeros((8, 8, 3), np.uint8), 0),
        (np.zeros((8, 8, 3), np.uint8), 101),
        (np.zeros((8, 8, 3), np.float32), 80),
        (np.zeros((8, 8, 4), np.uint8), 80),
        (np.zeros((0, 8, 3), np.uint8), 80),
    ],
)
def test_jpeg_bad_input(image: np.ndarray, quality: int) -> None:
    with pytest.raises(FilterForwardError):
        encode_jpeg(image, quality)


def test_clip_decodes_to_the_same_frames(frames: list[np.ndarray]) -> None:
    decoded, rate = decode_mp4(encode_clip(frames))
    assert len(decoded) == len(frames)
    assert rate == Fraction(25, 2)
    assert decoded[0].shape == frames[0].shape
    assert max(mean_abs_error(d, f) for d, f in zip(decoded, frames, strict=True)) < 6


def test_clip_crf_trades_size_for_quality(frames: list[np.ndarray]) -> None:
    assert len(encode_clip(frames, crf=35)) < len(encode_clip(frames, crf=23)) < len(encode_clip(frames, crf=15))


def test_odd_sized_frames_are_padded_to_even(frames: list[np.ndarray]) -> None:
    odd = [frame[:107, :191] for frame in frames[:4]]
    decoded, _ = decode_mp4(encode_clip(odd))
    assert len(decoded) == 4
    assert decoded[0].shape == (108, 192, 3)
    assert mean_abs_error(decoded[0][:107, :191], odd[0]) < 6


@pytest.mark.parametrize(("size", "expected"), [(1, 2), (2, 2), (107, 108), (1080, 1080), (1921, 1922)])
def test_even_rounds_an_odd_side_up(size: int, expected: int) -> None:
    assert even(size) == expected


def test_even_refuses_an_empty_side() -> None:
    with pytest.raises(ValueError, match="at least 1 pixel, got 0"):
        even(0)


def test_the_edge_and_the_cloud_give_odd_frames_the_same_even_size(frames: list[np.ndarray]) -> None:
    odd = [frame[:107, :191] for frame in frames[:3]]
    edge, _ = decode_mp4(encode_clip(odd))
    cloud, _ = decode_mp4(cloud_clip((index / FPS, encode_jpeg(frame, 90)) for index, frame in enumerate(odd)))
    assert edge[0].shape == cloud[0].shape == (even(107), even(191), 3) == (108, 192, 3)


def test_the_clouds_clip_of_huge_frames_is_scaled_down_to_fit_1920_pixels(frames: list[np.ndarray]) -> None:
    """20 frames of 8192x8192 took x264 past 1.6 GB of memory, then the request failed with a 500."""
    huge = [cv2.resize(frame, (3841, 2161)) for frame in frames[:2]]  # 4K, odd sides
    decoded, _ = decode_mp4(cloud_clip((index / FPS, encode_jpeg(frame, 90)) for index, frame in enumerate(huge)))
    assert decoded[0].shape == (1080, 1920, 3)


def test_clip_bad_use(frames: list[np.ndarray]) -> None:
    with pytest.raises(FilterForwardError, match="CRF"):
        ClipEncoder(*SIZE, FPS, crf=60)
    with pytest.raises(FilterForwardError, match="fps"):
        ClipEncoder(*SIZE, 0.0)
    encoder = ClipEncoder(*SIZE, FPS)
    with pytest.raises(FilterForwardError, match="at least one frame"):
        encoder.finish()
    with pytest.raises(FilterForwardError, match="192x108"):
        encoder.add(cv2.resize(frames[0], (96, 54)))


def test_stream_crf_and_bitrate_change_size_in_the_right_direction(frames: list[np.ndarray]) -> None:
    assert encode_stream_h264(frames, FPS, crf=35) < encode_stream_h264(frames, FPS, crf=23)
    sizes = [encode_stream_h264(frames, FPS, bitrate=rate) for rate in (100_000, 300_000, 1_000_000)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    achieved = sizes[1] * 8 / (len(frames) / FPS)
    assert 0.3 * 300_000 < achieved < 1.5 * 300_000  # rate control roughly holds the target


def test_stream_is_about_the_clip_without_its_container(frames: list[np.ndarray]) -> None:
    stream_bytes = encode_stream_h264(iter(frames), FPS, crf=23)
    clip_bytes = len(encode_clip(frames, crf=23))
    assert 0 < clip_bytes - stream_bytes < 2000  # same codec and settings; MP4 adds headers and an index


@pytest.mark.parametrize(
    ("crf", "bitrate", "message"),
    [(None, None, "exactly one"), (23, 500_000, "exactly one"), (-1, None, "CRF"), (None, 0, "bitrate")],
)
def test_stream_bad_settings(frames: list[np.ndarray], crf: int | None, bitrate: int | None, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        encode_stream_h264(frames, FPS, crf=crf, bitrate=bitrate)


def test_stream_needs_frames_of_one_size(frames: list[np.ndarray]) -> None:
    with pytest.raises(FilterForwardError, match="no frames"):
        encode_stream_h264([], FPS, crf=23)
    with pytest.raises(FilterForwardError, match="192x108"):
        encode_stream_h264([frames[0], frames[1][:100]], FPS, crf=23)


def clip_times(data: bytes) -> list[float]:
    """The presentation time of every frame of an MP4, in seconds."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return [float(frame.pts * stream.time_base) for frame in container.decode(stream)]


def test_a_clip_plays_at_its_frames_times_not_the_rate_the_camera_claims(frames: list[np.ndarray]) -> None:
    """A 15 fps MJPEG camera that OpenCV reports at 25 fps: the clip of its frames lasts as long as they did."""
    height, width = frames[0].shape[:2]
    claimed = ClipEncoder(width, height, 25.0)
    timed = ClipEncoder(width, height, 25.0)
    for index, frame in enumerate(frames[:15]):
        claimed.add(frame)
        timed.add(frame, 100.0 + index / 15)  # a live camera's stream time
    assert clip_times(claimed.finish()) == pytest.approx([i / 25 for i in range(15)], abs=1e-4)
    assert clip_times(timed.finish()) == pytest.approx([i / 15 for i in range(15)], abs=1e-4)
