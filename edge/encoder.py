"""What leaves the edge as bytes: JPEG frames, H.264 event clips in MP4, and the send-everything baseline.

Frames are BGR uint8 arrays (OpenCV's layout). H.264 is encoded by libx264 in yuv420p, which needs even
width and height: an odd-sized frame is padded by one replicated row/column rather than cropped, so no
pixel of the evidence is lost.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from fractions import Fraction

import av
import cv2
import numpy as np
from av.video.codeccontext import VideoCodecContext

from common.video import even
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

CODEC = "libx264"
PIXEL_FORMAT = "yuv420p"
DEFAULT_PRESET = "medium"  # x264's own default; a slower box can pass "veryfast"
CLIP_TIME_BASE = Fraction(1, 90_000)  # MPEG's clock: fine enough for any frame time


def encode_jpeg(image_bgr: np.ndarray, quality: int) -> bytes:
    """One BGR (or grey) uint8 frame as JPEG bytes at `quality` (1-100)."""
    if not 1 <= quality <= 100:
        raise FilterForwardError(f"JPEG quality must be 1..100, got {quality}")
    _check_image(image_bgr, channels=(1, 3))
    ok, buffer = cv2.imencode(".jpg", image_bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise FilterForwardError(f"OpenCV could not JPEG-encode a frame of shape {image_bgr.shape}")
    return buffer.tobytes()


class ClipEncoder:
    """Encodes one event's frames into an in-memory H.264 MP4: `add()` each frame, then `finish()`.

    Frames given their stream time play at it (a live camera's real rate, whatever rate it claims: OpenCV says
    25 fps for any MJPEG-over-HTTP camera); frames without one play at `fps`."""

    def __init__(self, width: int, height: int, fps: float, crf: int = 23, preset: str = DEFAULT_PRESET) -> None:
        if width < 1 or height < 1:
            raise FilterForwardError(f"clip size must be positive, got {width}x{height}")
        check_settings(fps, crf=crf, bitrate=None)
        self.width, self.height = width, height
        self.fps = rate(fps)
        self._buffer = io.BytesIO()
        self._container = av.open(self._buffer, mode="w", format="mp4")
        self._stream = self._container.add_stream(CODEC, rate=self.fps)
        _configure(self._stream.codec_context, width, height, fps, crf=crf, bitrate=None, preset=preset)
        self._stream.codec_context.time_base = CLIP_TIME_BASE
        self._frames = 0
        self._first_time: float | None = None
        self._last_pts = -1
        self._finished = False

    def add(self, frame_bgr: np.ndarray, time: float | None = None) -> None:
        """Append the next frame (width x height BGR uint8), shown at stream time `time` (seconds; default one
        frame at `fps` after the last)."""
        if self._finished:
            raise RuntimeError("ClipEncoder.add() after finish()")
        _check_image(frame_bgr, channels=(3,), size=(self.width, self.height))
        if time is None:
            pts = self._last_pts + round(1 / (self.fps * CLIP_TIME_BASE)) if self._frames else 0
        else:
            self._first_time = time if self._first_time is None else self._first_time
            pts = max(self._last_pts + 1, round((time - self._first_time) / CLIP_TIME_BASE))  # never backwards
        self._container.mux(self._stream.encode(video_frame(frame_bgr, pts)))
        self._last_pts = pts
        self._frames += 1

    def finish(self) -> bytes:
        """Flush the encoder and return the whole MP4 file."""
        if self._frames == 0:
            raise FilterForwardError("an event clip needs at least one frame: add() frames before finish()")
        self._container.mux(self._stream.encode(None))
        self._container.close()
        self._finished = True
        data = self._buffer.getvalue()
        log.debug("encoded a %d-frame clip into %d bytes", self._frames, len(data))
        return data


def encode_stream_h264(
    frames: Iterable[np.ndarray],
    fps: float,
    crf: int | None = None,
    bitrate: int | None = None,
    preset: str = DEFAULT_PRESET,
) -> int:
    """Bytes of H.264 the whole stream needs at a CRF or a target bitrate (bit/s); exactly one is given.

    Only the encoded size is kept (packets are counted, not stored), so hours of video fit in memory.
    """
    if (crf is None) == (bitrate is None):
        raise FilterForwardError("give exactly one of crf (e.g. 23) or bitrate (bit/s, e.g. 500000)")
    check_settings(fps, crf=crf, bitrate=bitrate)
    context: VideoCodecContext | None = None
    size = (0, 0)
    total = 0
    index = 0
    for index, frame in enumerate(frames):
        if context is None:
            _check_image(frame, channels=(3,))
            size = (frame.shape[1], frame.shape[0])
            context = av.CodecContext.create(CODEC, "w")
            _configure(context, *size, fps, crf=crf, bitrate=bitrate, preset=preset)
        _check_image(frame, channels=(3,), size=size)
        total += sum(packet.size for packet in context.encode(video_frame(frame, index)))
    if context is None:
        raise FilterForwardError("the stream to encode has no frames: check the video source")
    total += sum(packet.size for packet in context.encode(None))
    log.debug("encoded %d frames into %d bytes of H.264", index + 1, total)
    return total


def _configure(
    context: VideoCodecContext,
    width: int,
    height: int,
    fps: float,
    crf: int | None,
    bitrate: int | None,
    preset: str,
) -> None:
    context.width, context.height = even(width), even(height)
    context.pix_fmt = PIXEL_FORMAT
    context.framerate = rate(fps)
    context.time_base = 1 / context.framerate
    options = {"preset": preset}
    if crf is not None:
        options["crf"] = str(crf)
    else:
        context.bit_rate = int(bitrate)
    context.options = options


def check_settings(fps: float, crf: int | None, bitrate: int | None) -> None:
    """Raise FilterForwardError on a setting libx264 would reject, before any encoder is opened."""
    if crf is not None and not 0 <= crf <= 51:
        raise FilterForwardError(f"H.264 CRF must be 0..51 (lower is better quality), got {crf}")
    if bitrate is not None and bitrate <= 0:
        raise FilterForwardError(f"H.264 bitrate must be > 0 bit/s, got {bitrate}")
    rate(fps)


def rate(fps: float) -> Fraction:
    if not fps > 0:
        raise FilterForwardError(f"fps must be > 0, got {fps}")
    return Fraction(fps).limit_denominator(1001)


def video_frame(image_bgr: np.ndarray, pts: int) -> av.VideoFrame:
    height, width = image_bgr.shape[:2]
    pad_bottom, pad_right = even(height) - height, even(width) - width  # to the encoder's size
    if pad_bottom or pad_right:  # the last row or column repeated
        image_bgr = cv2.copyMakeBorder(image_bgr, 0, pad_bottom, 0, pad_right, cv2.BORDER_REPLICATE)
    frame = av.VideoFrame.from_ndarray(image_bgr, format="bgr24")
    frame.pts = pts
    return frame


def _check_image(image: np.ndarray, channels: tuple[int, ...], size: tuple[int, int] | None = None) -> None:
    """Raise unless `image` is a uint8 frame with one of `channels` and, if given, (width, height) `size`."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.size == 0:
        raise FilterForwardError("a frame must be a non-empty uint8 numpy array (as OpenCV decodes it)")
    depth = 1 if image.ndim == 2 else image.shape[2] if image.ndim == 3 else 0
    if depth not in channels:
        raise FilterForwardError(f"a frame must have {' or '.join(map(str, channels))} channels, got {image.shape}")
    if size is not None and (image.shape[1], image.shape[0]) != size:
        raise FilterForwardError(
            f"frame is {image.shape[1]}x{image.shape[0]} but the encoder was opened at {size[0]}x{size[1]}"
        )
