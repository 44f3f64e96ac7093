"""One camera's matched frames as one inter-frame-coded H.264 stream, cut into fragments of about half a second.

Long GOPs are where the savings are (a keyframe of a fixed camera costs 10-20 P-frames), so a keyframe is
forced only where a reader must be able to start: at each event start (`new_gop()`), and at most every
`keyframe_interval` seconds of stream time so a long event stays seekable. x264 runs without B-frames and with
a look-ahead of LOOKAHEAD frames (one thread up to 720p, two above): output keeps input order and each frame's
access unit comes out a few frames after it went in, so a fragment closes once the frames that left the encoder span
`fragment_seconds`; `finish()` drains the encoder when the camera's stream events end. Frames are BGR uint8
arrays of one size per GOP: with `upload: {crop: roi}` they are the part of the camera's frame its stream
filters look at (`roi_crop`), and a new crop starts a new GOP.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.video.codeccontext import VideoCodecContext

from common.fragment import Crop, Fragment, FragmentHeader, FrameEntry
from common.video import even
from edge.encoder import CODEC, DEFAULT_PRESET, PIXEL_FORMAT, check_settings, rate, video_frame
from models.errors import FilterForwardError
from models.roi import ROI

FRAGMENT_SECONDS = 0.5
# x264's macroblock-tree rate control needs a look-ahead; 5 frames of it cost 0.17-0.4 s of latency at
# 30-12.5 fps and took 8% off the bits of adl-rundle-6's bottom-band events at an equal PSNR (bench README).
LOOKAHEAD = 5
KEYFRAME_INTERVAL = 10.0  # seconds of stream time between keyframes inside one long event
# Frames above this many pixels are encoded with preset fast (unless the settings name one) on two x264 threads.
# A 1080p frame at preset medium took 98-107 ms of one core of a 2-core AMD EPYC, more than the 80 ms a 12.5 fps
# camera has for it and, beside the camera's base DNN, more than the box had; fast took 68 ms for 0.8% more bits
# at 0.05 dB more PSNR (adl-rundle-6), and two frame threads (one frame more delay, 0.3% more bits) spread it over
# both cores. Up to 720p, medium on one thread keeps up (bench README).
LARGE_FRAME_PIXELS = 1280 * 720
LARGE_FRAME_PRESET = "fast"


@dataclass(frozen=True)
class _Pending:
    """A frame inside the encoder: its access unit has not come out yet."""

    index: int
    time: float
    starts_gop: bool


class StreamEncoder:
    """`add()` each matched frame in stream order; it returns the fragments that closed. `new_gop()` before
    an event's first frame; `cut()` closes the open fragment early (an event ended while another stream event
    goes on); `finish()` drains the encoder and closes everything (the camera's last stream event ended)."""

    def __init__(
        self,
        fps: float,
        crf: int = 23,
        preset: str | None = None,
        keyframe_interval: float = KEYFRAME_INTERVAL,
        fragment_seconds: float = FRAGMENT_SECONDS,
        bitrate_cap: int | None = None,
    ) -> None:
        check_settings(fps, crf=crf, bitrate=bitrate_cap)
        if not keyframe_interval > 0 or not fragment_seconds > 0:
            raise FilterForwardError(
                f"keyframe_interval and fragment_seconds must be > 0 s, got {keyframe_interval} and {fragment_seconds}"
            )
        self.fps = rate(fps)
        self._next_fps = self.fps  # the rate the next encoder opens at (see set_fps)
        self._settings = (crf, preset, bitrate_cap)
        self.keyframe_interval, self.fragment_seconds = keyframe_interval, fragment_seconds
        self._context: VideoCodecContext | None = None
        self._frame_size = self._size = (0, 0)  # the camera's frames; the encoded (even) size
        self._gop = -1  # counted from this encoder's start: an edge restart starts a new GOP
        self._part = 0  # the next fragment's place in its GOP
        self._crop: Crop | None = None  # the part of the camera's frame this GOP shows (None: all of it)
        self._keyframe_time = -np.inf
        self._force_keyframe = True
        self._pending: deque[_Pending] = deque()
        self._entries: list[FrameEntry] = []
        self._units: list[bytes] = []
        self._pts = 0

    def new_gop(self) -> None:
        """The next frame starts a GOP (an event starts there)."""
        self._force_keyframe = True

    def set_fps(self, fps: float) -> None:
        """The camera's rate from the next encoder on (after `finish()` or at a new crop): a live camera's is
        measured in its first seconds, after its stream may have opened; one encoder keeps one rate."""
        check_settings(fps, crf=None, bitrate=None)
        self._next_fps = rate(fps)

    def add(self, frame_bgr: np.ndarray, index: int, time: float, crop: Crop | None = None) -> list[Fragment]:
        """Encode the camera's frame `index` (stream time `time` in seconds), or its part `crop` (`frame_bgr` is
        that part, maybe scaled); the fragments this closed. Another crop than the GOP's starts a new GOP."""
        closed = []
        if crop != self._crop:
            closed = self.finish()  # another crop may have another size: a new encoder, its own GOPs
            self._crop = crop
        context = self._open(frame_bgr)
        # Half a frame of slack: stream times are floats (frame index / fps).
        keyframe = self._force_keyframe or time - self._keyframe_time >= self.keyframe_interval - 0.5 / self.fps
        if keyframe:
            self._keyframe_time = time
            self._force_keyframe = False
        picture = video_frame(frame_bgr, self._pts)
        if keyframe:
            picture.pict_type = av.video.frame.PictureType.I
        self._pts += 1
        self._pending.append(_Pending(index, time, keyframe))
        return closed + self._collect(context.encode(picture))

    def cut(self) -> list[Fragment]:
        """Close the open fragment now (the frames still inside the encoder go in the next one)."""
        if not self._entries:
            return []
        width, height = self._size
        header = FragmentHeader(
            gop=self._gop,
            part=self._part,
            width=width,
            height=height,
            fps=f"{self.fps.numerator}/{self.fps.denominator}",
            frames=self._entries,
            crop=self._crop,
        )
        fragment = Fragment(header, tuple(self._units))
        self._entries, self._units = [], []
        self._part += 1
        return [fragment]

    def finish(self) -> list[Fragment]:
        """Drain the encoder and close every fragment; the next frame opens a new encoder and starts a GOP."""
        if self._context is None:
            return self.cut()
        closed = self._collect(self._context.encode(None))
        self._context = None
        self._force_keyframe = True
        return closed + self.cut()

    def _collect(self, packets: list[av.Packet]) -> list[Fragment]:
        """Put the access units that left the encoder into fragments, in order; the fragments that closed."""
        closed = []
        for packet in packets:
            frame = self._pending.popleft()
            if frame.starts_gop:
                closed += self.cut()  # a fragment never spans two GOPs
                self._gop, self._part = self._gop + 1, 0
            unit = bytes(packet)
            self._entries.append(
                FrameEntry(index=frame.index, time=frame.time, keyframe=packet.is_keyframe, size=len(unit))
            )
            self._units.append(unit)
            if frame.time - self._entries[0].time + 1 / self.fps >= self.fragment_seconds:
                closed += self.cut()
        return closed

    def _open(self, frame_bgr: np.ndarray) -> VideoCodecContext:
        height, width = frame_bgr.shape[:2]
        if self._context is not None:
            if (width, height) != self._frame_size:
                raise FilterForwardError(
                    f"a camera's frames must keep one size within a crop: got {width}x{height} after "
                    f"{self._frame_size[0]}x{self._frame_size[1]}"
                )
            return self._context
        crf, preset, bitrate_cap = self._settings
        self.fps = self._next_fps
        context = av.CodecContext.create(CODEC, "w")
        context.width, context.height = even(width), even(height)
        context.pix_fmt = PIXEL_FORMAT
        context.framerate = self.fps
        context.time_base = 1 / Fraction(self.fps)
        # Keyframes are forced by this class only (event starts, the interval); scenecut still inserts one
        # where the picture changes completely. Parameter sets go with every keyframe: each GOP decodes alone.
        # No B-frames, a short look-ahead, frame threads only for large frames and constant-rate timing: each
        # frame's access unit comes out LOOKAHEAD (+1 with two threads) frames later, in order. (x264's zerolatency
        # tune, no look-ahead at all and sliced threads, costs 40% more bits on the car clip.)
        preset, threads = encoder_setup(context.width, context.height, preset)
        params = (
            "repeat-headers=1:forced-idr=1:keyint=infinite:bframes=0:force-cfr=1:"
            f"threads={threads}:rc-lookahead={LOOKAHEAD}"
        )
        if bitrate_cap is not None:
            params += f":vbv-maxrate={bitrate_cap // 1000}:vbv-bufsize={bitrate_cap // 1000}"
        context.options = {"preset": preset, "crf": str(crf), "x264-params": params}
        self._context, self._frame_size, self._size = context, (width, height), (context.width, context.height)
        return context


def encoder_setup(width: int, height: int, preset: str | None = None) -> tuple[str, int]:
    """x264's preset (the given one, else the default for the size) and threads for frames of this size (see
    LARGE_FRAME_PIXELS)."""
    if width * height <= LARGE_FRAME_PIXELS:
        return preset or DEFAULT_PRESET, 1
    return preset or LARGE_FRAME_PRESET, 2


def roi_crop(rois: Iterable[ROI], width: int, height: int) -> Crop | None:
    """The box around the union of `rois` (normalised) on a `width` x `height` frame, with an even offset and
    even sides (H.264 in yuv420p codes 2x2 pixel blocks; at the border of an odd-sized frame the box gives up
    its last pixel rather than run over); None when the ROIs cover the whole frame or there is none."""
    boxes = [(roi.x0, roi.y0, roi.x1, roi.y1) for roi in rois]
    if not boxes:
        return None
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    if x0 <= 0 and y0 <= 0 and x1 >= 1 and y1 >= 1:
        return None
    left, right = _even_span(x0, x1, width)
    top, bottom = _even_span(y0, y1, height)
    return Crop(x=left, y=top, width=right - left, height=bottom - top, frame_width=width, frame_height=height)


def _even_span(start: float, stop: float, size: int) -> tuple[int, int]:
    """Pixels [first, last) covering the normalised span [start, stop) of a side of `size` pixels."""
    first = min(math.floor(start * size), max(0, size - 2)) // 2 * 2
    last = first + even(max(2, math.ceil(stop * size) - first))
    if last > size:
        last = size - (size - first) % 2
    return first, last
