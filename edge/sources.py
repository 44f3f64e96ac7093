"""Video sources for the edge: open files, image folders, datasets, streams and devices, and pace their frames.

Every source yields `Frame`s (BGR uint8) through a small reader thread and a bounded queue:

- `every-frame` pacing hands out every decoded frame in order and never drops (for evaluation);
- `realtime` pacing plays recordings at their frame rate and, like a live camera, drops the OLDEST
  queued frame when the consumer falls behind; frame indices keep counting decoded frames, so drops
  show up as gaps and in `stats.frames_dropped`.

Recordings end at their end. Live sources (rtsp/http URLs and local devices) that fail, or are not up
yet, go offline and reconnect with exponential backoff; they never invent frames.

A live source's frame rate is what it reports until it has been measured from its frames' arrival over its
first seconds online, then the measured one where they differ clearly: FFmpeg reports 25 fps for any
MJPEG-over-HTTP camera, whatever it sends. The `fps` option overrides both.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import cv2
import numpy as np

from models.datasets.frames import IMAGE_SUFFIXES, image_files, is_video
from models.datasets.labelled import LABELS_FILE, frame_source
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

Pacing = Literal["realtime", "every-frame"]
LIVE_SCHEMES = ("rtsp", "rtsps", "http", "https")
DEFAULT_FPS = 25.0  # for recordings that carry no frame rate (image folders)

_OPEN_TIMEOUT_MS = 5000  # bounds how long a dead camera can hold the reader thread
_READ_TIMEOUT_MS = 5000
_MAX_SANE_FPS = 1000.0  # containers and cameras sometimes report nonsense rates
_CLOCK_TOLERANCE_S = 1.0  # how far a camera's own clock may stray from ours before we stop trusting it
_RATE_WINDOW_S = 2.0  # the measured read rate looks this far back, so it falls to 0 while offline
_PROBE_S = 2.0  # a live camera's frame rate is measured over at least this long ...
_PROBE_INTERVALS = 5  # ... and this many frame intervals (a 1 fps camera takes 5 s)
_FPS_TOLERANCE = 0.15  # a measured rate this far (relative) from the reported one replaces it
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Frame:
    index: int  # 0-based count of decoded frames (gaps = drops)
    timestamp: float  # stream time in seconds: index / fps for recordings, the camera's clock for live
    image: np.ndarray  # BGR uint8, height x width x 3


@dataclass(frozen=True)
class SourceStats:
    online: bool  # a recording is online while it plays; a live source while connected
    frames_read: int  # decoded frames, delivered or not
    frames_dropped: int  # decoded but never handed out because the consumer fell behind
    frames_capped: int  # a live camera's frames over its fps cap, left out by design (also gaps in the indexes)
    reconnects: int  # times a live source came back after losing its connection
    last_error: str | None  # the most recent failure, kept after recovery
    fps: float  # measured decode rate over the last couple of seconds
    decode_ms: float  # mean CPU time to decode (and resize) one frame over the same window; waits excluded


# ---------------------------------------------------------------------------------------------------------
# What the url names


@dataclass(frozen=True)
class _Target:
    kind: Literal["file", "images", "live"]
    location: str | int  # path or URL for OpenCV, or a device index
    label: str  # for logs and errors: credentials redacted
    images: tuple[Path, ...] = ()
    fps: float | None = None  # the recording's rate as its dataset.yaml sets it, above the container's


def check_source(url: str) -> None:
    """Fail with one line, as opening the camera would, on a malformed source or a missing file (`config check`)."""
    _resolve(url)


def _resolve(url: str) -> _Target:
    """Classify the source string; every malformed or missing input fails here with one line."""
    text = url.strip()
    if not text:
        raise FilterForwardError("the source is empty; give a video file, image folder, rtsp/http URL or device")
    if re.fullmatch(r"-?\d+", text):
        return _device_index(int(text))
    if scheme := _SCHEME.match(text):
        return _url_target(text, scheme.group(1).lower())
    if text.startswith("/dev/"):
        return _device_path(Path(text))
    return _path_target(Path(text).expanduser())


def _device_index(index: int) -> _Target:
    if index < 0:
        raise FilterForwardError(f"device index {index} is malformed; use 0, 1, ... or /dev/videoN")
    return _Target("live", index, f"device {index}")


def _device_path(path: Path) -> _Target:
    # /dev/videoN may not exist yet (a USB camera plugged in later); anything else must be a real device.
    if not (re.fullmatch(r"/dev/video\d+", str(path)) or path.is_char_device()):
        raise FilterForwardError(f"{path} is not a video device; use /dev/videoN or a device index like 0")
    return _Target("live", str(path), str(path))


def _url_target(url: str, scheme: str) -> _Target:
    if scheme not in LIVE_SCHEMES:
        supported = ", ".join(f"{name}://" for name in LIVE_SCHEMES)
        raise FilterForwardError(f"unsupported URL scheme {scheme}:// in {_redact(url)}; use {supported}")
    return _Target("live", url, _redact(url))


def _redact(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _path_target(path: Path) -> _Target:
    if path.is_dir():
        return _folder_target(path)
    if not path.is_file():
        raise FilterForwardError(f"source {path} does not exist; check the path")
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return _Target("images", str(path), str(path), (path,))
    return _Target("file", str(path), str(path))


def _folder_target(folder: Path) -> _Target:
    """A recorded dataset plays its frames at its rate; otherwise a folder's one video, or its images."""
    if (folder / LABELS_FILE).is_file():
        source, fps = frame_source(folder)
        return replace(_path_target(source) if source.is_file() else _media_target(source), fps=fps)
    return _media_target(folder)


def _media_target(folder: Path) -> _Target:
    """A folder's one video, or its images in natural order."""
    videos = sorted(entry for entry in folder.iterdir() if is_video(entry))
    images = image_files(folder)
    if len(videos) == 1 and not images:
        return _Target("file", str(videos[0]), str(videos[0]))
    if images:
        return _Target("images", str(folder), str(folder), tuple(images))
    if videos:
        raise FilterForwardError(f"folder {folder} holds {len(videos)} videos and no images; pass one video file")
    raise FilterForwardError(f"folder {folder} holds no images or video; point the source at a video or image folder")


# ---------------------------------------------------------------------------------------------------------
# Readers: one open connection to the frames


class _Reader:
    """One open connection to the frames. Opening decodes the first frame, which proves the source works;
    read() hands that frame out first. Images come out at `resolution` (width, height) when one is given.
    Subclasses set up their state, then call this __init__."""

    fps: float | None = None  # the rate the source reports, if any
    open_s = 0.0  # how long opening took; a stream's frames buffered meanwhile then arrive in a burst
    expected_frames: int | None = None  # a recording's frame count from its container, if it states one

    def __init__(self, failure: str, resolution: tuple[int, int] | None) -> None:
        self._resolution = resolution
        self.decode_s = 0.0  # how long the image read() returned last took to decode and resize
        first = self._timed_decode()
        if first is None:
            self.close()
            raise FilterForwardError(failure)
        self._pending: tuple[np.ndarray, float] | None = first  # self.decode_s stays its decode time meanwhile
        self.frame_size = (first[0].shape[1], first[0].shape[0])  # (width, height), after resizing

    def read(self) -> tuple[np.ndarray, float] | None:
        """The next image and the source's own clock for it in ms (nan if it has none); None at the end."""
        frame, self._pending = self._pending, None
        return frame if frame is not None else self._timed_decode()

    def _timed_decode(self) -> tuple[np.ndarray, float] | None:
        # CPU time of this thread, not wall time: a live camera's read blocks until its next frame arrives, and
        # that wait is not decoding (FFmpeg decodes in this thread: see _open_capture).
        started = time.thread_time()
        decoded = self._decode()
        if decoded is not None and self._resolution is not None:
            image, position = decoded
            if (image.shape[1], image.shape[0]) != self._resolution:
                decoded = cv2.resize(image, self._resolution, interpolation=cv2.INTER_AREA), position
        self.decode_s = time.thread_time() - started
        return decoded

    def _decode(self) -> tuple[np.ndarray, float] | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _open_capture(location: str | int) -> cv2.VideoCapture:
    """Files and URLs go to FFmpeg with timeouts; devices to the camera backend, which rejects those options."""
    if isinstance(location, int):
        return cv2.VideoCapture(location)
    if location.startswith("/dev/"):
        return cv2.VideoCapture(location, cv2.CAP_V4L2)
    timeouts = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, _OPEN_TIMEOUT_MS, cv2.CAP_PROP_READ_TIMEOUT_MSEC, _READ_TIMEOUT_MS]
    # One decoding thread per camera: cameras already decode in parallel (a reader thread each), the cores
    # are the base DNN's, and the decode cost can then be read as this thread's CPU time (see _timed_decode).
    return cv2.VideoCapture(location, cv2.CAP_FFMPEG, [*timeouts, cv2.CAP_PROP_N_THREADS, 1])


class _CaptureReader(_Reader):
    """Files, streams and devices through cv2.VideoCapture."""

    def __init__(self, location: str | int, failure: str, resolution: tuple[int, int] | None) -> None:
        started = time.monotonic()
        self._capture = _open_capture(location)
        super().__init__(failure, resolution)
        self.open_s = time.monotonic() - started
        reported = self._capture.get(cv2.CAP_PROP_FPS)
        self.fps = reported if 0 < reported <= _MAX_SANE_FPS else None
        count = int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT))
        self.expected_frames = count if count > 0 else None

    def _decode(self) -> tuple[np.ndarray, float] | None:
        ok, image = self._capture.read() if self._capture.isOpened() else (False, None)
        return (image, self._capture.get(cv2.CAP_PROP_POS_MSEC)) if ok else None

    def close(self) -> None:
        self._capture.release()


class _FolderReader(_Reader):
    """Images in the given order; one that does not decode stops the stream with an error."""

    def __init__(self, paths: tuple[Path, ...], failure: str, resolution: tuple[int, int] | None) -> None:
        self._paths = iter(paths)
        super().__init__(failure, resolution)

    def _decode(self) -> tuple[np.ndarray, float] | None:
        path = next(self._paths, None)
        if path is None:
            return None
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise FilterForwardError(f"image {path} can't be decoded; replace or remove it")
        return image, math.nan

    def close(self) -> None:
        self._paths = iter(())


# ---------------------------------------------------------------------------------------------------------
# Pacing helpers


class _FrameQueue:
    """Bounded hand-off from the reader thread to the consumer; realtime puts evict the oldest frame."""

    def __init__(self, size: int) -> None:
        self._frames: deque[Frame] = deque()
        self._size = size
        self._changed = threading.Condition()
        self._finished = False  # the producer is done: the consumer drains what is left
        self._closed = False  # the consumer is done: nothing more moves

    def put(self, frame: Frame, *, drop_oldest: bool) -> int:
        """Queues the frame (blocking for space unless drop_oldest); returns how many frames were dropped."""
        with self._changed:
            dropped = 0
            if drop_oldest:
                while len(self._frames) >= self._size:
                    self._frames.popleft()
                    dropped += 1
            else:
                self._changed.wait_for(lambda: len(self._frames) < self._size or self._closed)
            if not self._closed:
                self._frames.append(frame)
                self._changed.notify_all()
            return dropped

    def get(self, timeout: float | None) -> Frame | None:
        with self._changed:
            self._changed.wait_for(lambda: self._frames or self._finished or self._closed, timeout)
            if self._closed or not self._frames:
                return None
            frame = self._frames.popleft()
            self._changed.notify_all()
            return frame

    @property
    def ended(self) -> bool:
        with self._changed:
            return self._closed or (self._finished and not self._frames)

    def finish(self) -> None:
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._frames.clear()
            self._changed.notify_all()


class _Pacer:
    """Releases recorded frames at their fps, like a camera; a decoder that falls behind re-anchors
    the schedule instead of bursting to catch up."""

    def __init__(self, fps: float) -> None:
        self._period = 1.0 / fps
        self._due: float | None = None

    def wait(self, stop: threading.Event) -> bool:
        """Sleeps until the next frame is due; False when the source was closed meanwhile."""
        now = time.monotonic()
        if self._due is None or now - self._due > self._period:
            self._due = now
        stopped = stop.wait(self._due - now) if self._due > now else stop.is_set()
        self._due += self._period
        return not stopped


class _RateCap:
    """At most one live frame per 1/fps slot; slots are centred on the first frame so jitter of
    a camera running at exactly the cap does not cost frames."""

    def __init__(self, fps: float) -> None:
        self._fps = fps
        self._origin: float | None = None
        self._last_slot = -1

    def admit(self, now: float) -> bool:
        if self._origin is None:
            self._origin = now - 0.5 / self._fps
        slot = math.floor((now - self._origin) * self._fps)
        if slot <= self._last_slot:
            return False
        self._last_slot = slot
        return True


class _LiveClock:
    """Stream time for live frames: the camera's own clock (POS_MSEC) while it does not go back and stays
    within a second of ours, else our monotonic clock since the first frame; never goes backwards.
    The camera's clock may also lead ours by as long as opening took: FFmpeg buffers an RTSP stream's
    first seconds while it probes them and then hands those frames out in one burst."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._last = 0.0
        self._last_position: float | None = None
        self._trusted = True
        self._lead_s = 0.0

    def reconnected(self, open_s: float) -> None:
        """A new connection restarts the camera's clock: trust it again, measured from here."""
        self._last_position = None
        self._trusted = True
        self._lead_s = open_s

    def stamp(self, position_ms: float) -> float:
        now = time.monotonic()
        self._start = now if self._start is None else self._start
        elapsed = now - self._start
        position = position_ms / 1000.0
        stamp = elapsed
        if self._trusted and self._last_position is not None:
            candidate = self._last + (position - self._last_position)
            # a repeated position is no news (OpenCV reports 0 for both of an RTSP stream's first two frames)
            ahead = candidate - elapsed
            if position >= self._last_position and -_CLOCK_TOLERANCE_S <= ahead <= _CLOCK_TOLERANCE_S + self._lead_s:
                stamp = candidate
            else:
                self._trusted = False  # e.g. MJPEG over HTTP, where FFmpeg makes up 40 ms steps
        self._last_position = position
        self._last = max(stamp, self._last)
        return self._last


class _RateMeter:
    """Frames per second and mean decode time over the last _RATE_WINDOW_S seconds."""

    def __init__(self) -> None:
        self._ticks: deque[tuple[float, float]] = deque(maxlen=256)  # (when, decode seconds)

    def tick(self, now: float, decode_s: float) -> None:
        self._ticks.append((now, decode_s))

    def _recent(self, now: float) -> list[tuple[float, float]]:
        return [tick for tick in self._ticks if now - tick[0] <= _RATE_WINDOW_S]

    def rate(self, now: float) -> float:
        recent = self._recent(now)
        if len(recent) < 2 or recent[-1][0] == recent[0][0]:
            return 0.0
        return (len(recent) - 1) / (recent[-1][0] - recent[0][0])

    def decode_ms(self, now: float) -> float:
        recent = self._recent(now)
        return 1000.0 * sum(decode_s for _, decode_s in recent) / len(recent) if recent else 0.0


def settled_fps(reported: float | None, measured: float) -> float:
    """A live source's rate once measured: the reported one unless the measurement (to 3 digits) differs from it
    clearly, or there is none."""
    measured = float(f"{measured:.3g}")
    if reported is None or abs(measured - reported) > _FPS_TOLERANCE * reported:
        return measured
    return reported


class RateProbe:
    """A live camera's real frame rate, from when its frames arrive (FFmpeg's stream times for an MJPEG camera
    are made up at the 25 fps it reports, so only our clock tells). Frames buffered while the connection opened
    arrive in a burst (an RTSP camera then measured twice its rate): the window starts as long after the first
    frame as that frame took to come, by when decoding has caught up with the camera."""

    def __init__(self, connecting: float, reported: float | None) -> None:
        self._connecting = connecting  # when the connection began opening (monotonic)
        self.reported = reported  # the rate the connection claims
        self._settled: float | None = None  # when the window may start
        self._start: float | None = None  # the window's first frame
        self._intervals = 0

    def tick(self, now: float) -> float | None:
        """Counts a frame that arrived at `now`; the rate in frames/s once measured, else None."""
        if self._settled is None:
            self._settled = now + (now - self._connecting)
        elif self._start is None:
            self._start = now if now >= self._settled else None
        else:
            self._intervals += 1
            if now - self._start >= _PROBE_S and self._intervals >= _PROBE_INTERVALS:
                return self._intervals / (now - self._start)
        return None


# ---------------------------------------------------------------------------------------------------------
# The source


def _check_options(
    pacing: str, fps: float | None, resolution: tuple[int, int] | None, queue_size: int, initial: float, maximum: float
) -> None:
    if pacing not in get_args(Pacing):
        raise FilterForwardError(f"unknown pacing {pacing!r}; use 'realtime' or 'every-frame'")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise FilterForwardError(f"fps must be a positive number of frames per second, got {fps}")
    if resolution is not None and not (len(resolution) == 2 and all(int(side) == side > 0 for side in resolution)):
        raise FilterForwardError(f"resolution must be (width, height) in positive whole pixels, got {resolution}")
    if queue_size < 1:
        raise FilterForwardError(f"queue_size must be at least 1, got {queue_size}")
    if not (0 < initial <= maximum and math.isfinite(maximum)):
        raise FilterForwardError(
            f"reconnect backoff must satisfy 0 < initial <= max, got initial={initial} max={maximum}"
        )


class VideoSource:
    """Frames from one video source; iterate it (or call read) and close it (or use `with`).

    url: a video file, an image folder, a dataset folder (labels.csv + one video), an rtsp/http(s)
    URL, or a device (an index like "0", or /dev/videoN).
    pacing: "every-frame" (every frame in order, deterministic) or "realtime" (see the module doc).
    fps: for recordings, the rate for timestamps and realtime pacing (default: the recorded one);
    for live sources, their rate (default: measured, see the module doc) and a cap on delivered frames (the
    rest are counted as capped, apart from frames dropped because the consumer fell behind).
    resolution: (width, height) every frame is resized to (INTER_AREA) on the reader thread; None keeps the
    source's own size.
    queue_size: frames buffered between the reader thread and the consumer.
    reconnect_initial/reconnect_max: backoff bounds in seconds for live sources.
    fail_fast: a live source that can't be read at start raises instead of waiting for the camera.
    announce: log going online at INFO (False: at DEBUG, for a replay that reopens its clip at every loop).
    """

    def __init__(
        self,
        url: str,
        *,
        pacing: Pacing = "every-frame",
        fps: float | None = None,
        resolution: tuple[int, int] | None = None,
        queue_size: int = 2,
        reconnect_initial: float = 0.5,
        reconnect_max: float = 30.0,
        name: str = "",
        fail_fast: bool = False,
        announce: bool = True,
    ) -> None:
        _check_options(pacing, fps, resolution, queue_size, reconnect_initial, reconnect_max)
        self._target = _resolve(url)
        self.name = name or self._target.label
        self.pacing: Pacing = pacing
        self._online_level = logging.INFO if announce else logging.DEBUG
        self.is_live = self._target.kind == "live"
        self._fps_option = fps
        self._resolution = (int(resolution[0]), int(resolution[1])) if resolution is not None else None
        self._backoff = (reconnect_initial, reconnect_max)
        self.queue_size = queue_size
        self._queue = _FrameQueue(queue_size)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the stats, the reader hand-over and the thread start
        self._thread: threading.Thread | None = None
        self._reader: _Reader | None = None
        self._error: BaseException | None = None
        self._fps: float | None = fps
        self._fps_unmeasured = self.is_live and fps is None  # until a live source's rate has been measured
        self._probe: RateProbe | None = None  # measures it on the current connection
        self._frame_size: tuple[int, int] | None = None
        self._cap = _RateCap(fps) if self.is_live and fps is not None else None
        self._clock = _LiveClock()
        self._meter = _RateMeter()
        self._online = False
        self._outage_reported = False
        self._connections = 0
        self._frames_read = 0
        self._frames_dropped = 0
        self._frames_capped = 0
        self._last_error: str | None = None
        if not self.is_live or fail_fast:
            self._reader = self._open()
            self._went_online(self._reader)

    # -- public surface -----------------------------------------------------------------------------------

    @property
    def fps(self) -> float | None:
        """The nominal frame rate: the override, else a recording's own; for a live source what it reports
        until its rate is measured (see the module doc), then the measured rate where that differs clearly. None
        for a live source that has not connected yet, or reports none and is still being measured."""
        return self._fps

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """(width, height) of the frames handed out; None until a live source has delivered one."""
        return self._frame_size

    @property
    def ended(self) -> bool:
        """True once the stream is over (end of a recording, an error, or close) and all frames were read."""
        return self._queue.ended

    @property
    def stats(self) -> SourceStats:
        now = time.monotonic()
        with self._lock:
            return SourceStats(
                online=self._online,
                frames_read=self._frames_read,
                frames_dropped=self._frames_dropped,
                frames_capped=self._frames_capped,
                reconnects=max(0, self._connections - 1),
                last_error=self._last_error,
                fps=self._meter.rate(now),
                decode_ms=self._meter.decode_ms(now),
            )

    def read(self, timeout: float | None = None) -> Frame | None:
        """The next frame; None if none came within `timeout` seconds or the stream has ended (see `ended`).

        Raises FilterForwardError if a recording failed mid-stream (after the frames before it).
        """
        self._start()
        frame = self._queue.get(timeout)
        if frame is None and self._queue.ended and self._error is not None:
            error, self._error = self._error, None
            raise error
        return frame

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.read()) is not None:
            yield frame

    def close(self) -> None:
        """Stops the reader promptly (also while it backs off) and releases the source."""
        with self._lock:
            self._stop.set()
            thread, reader = self._thread, self._reader
        self._queue.close()
        if thread is None:
            if reader is not None:
                reader.close()
            return
        thread.join(timeout=_READ_TIMEOUT_MS / 1000 + 1.0)
        if thread.is_alive():
            log.warning("%s: the reader is still blocked in OpenCV; leaving it to time out", self.name)

    def __enter__(self) -> VideoSource:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"VideoSource({self.name!r}, pacing={self.pacing!r}, live={self.is_live})"

    # -- opening ------------------------------------------------------------------------------------------

    def _open(self) -> _Reader:
        target = self._target
        if target.kind == "images":
            return _FolderReader(
                target.images, f"{target.label} holds no images; add some or use a video", self._resolution
            )
        if target.kind == "live":
            failure = f"cannot read video from {target.label}; check the address and that the camera is up"
        else:
            failure = f"{target.label} can't be decoded as video; check that it is a video file that plays"
        return _CaptureReader(target.location, failure, self._resolution)

    def _went_online(self, reader: _Reader) -> None:
        with self._lock:
            self._frame_size = reader.frame_size
            if self._fps_unmeasured:  # measured once per source: a reconnect keeps the measured rate
                self._fps = reader.fps  # until then
                self._probe = RateProbe(time.monotonic() - reader.open_s, reader.fps)
            elif not self.is_live:
                self._fps = self._fps_option or self._target.fps or reader.fps or DEFAULT_FPS
            fps = self._fps
            self._online = True
            self._connections += 1
            self._outage_reported = False
        width, height = reader.frame_size
        rate = f"{fps:.2f} fps" if fps else "unknown fps"
        rate += " (measuring)" if self._fps_unmeasured else ""
        log.log(self._online_level, "%s: online, %dx%d, %s, pacing %s", self.name, width, height, rate, self.pacing)

    def _measured(self, reported: float | None, measured: float) -> None:
        """Settles a live source's rate (settled_fps) and says so."""
        fps = settled_fps(reported, measured)
        with self._lock:
            self._probe, self._fps_unmeasured = None, False
            self._fps = fps
        if reported is None:
            log.info("%s: measured %.2f fps (the camera reports none)", self.name, fps)
        elif fps == reported:
            log.debug("%s: measured %.2f fps, as the camera reports", self.name, measured)
        else:
            log.warning(
                "%s: the camera reports %.2f fps but sends %.2f fps: using the measured rate (set fps: in the "
                "camera's config to override it)",
                self.name,
                reported,
                fps,
            )

    def _went_offline(self, error: str) -> None:
        with self._lock:
            self._online = False
            self._last_error = error
            first_failure, self._outage_reported = not self._outage_reported, True
        if first_failure:  # once per outage; the retries log at debug
            log.warning("%s: offline (%s); reconnecting with backoff up to %g s", self.name, error, self._backoff[1])
        else:
            log.debug("%s: still offline (%s)", self.name, error)

    # -- the reader thread --------------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=f"source {self.name}", daemon=True)
            self._thread.start()

    def _take_reader(self) -> _Reader | None:
        with self._lock:
            reader, self._reader = self._reader, None
            return reader

    def _run(self) -> None:
        try:
            if self.is_live:
                self._run_live()
            elif (reader := self._take_reader()) is not None:
                self._pump(reader)
        except Exception as error:  # handed to the consumer, which raises it from read()
            self._error = error
            with self._lock:
                self._last_error = str(error)
        finally:
            with self._lock:
                self._online = False
            self._queue.finish()

    def _run_live(self) -> None:
        initial, maximum = self._backoff
        delay = initial
        while not self._stop.is_set():
            reader = self._take_reader() or self._connect()
            if reader is None:
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, maximum)
                continue
            delay = initial
            self._clock.reconnected(reader.open_s)
            self._pump(reader)
            if not self._stop.is_set():
                self._went_offline("the stream stopped delivering frames")

    def _connect(self) -> _Reader | None:
        try:
            reader = self._open()
        except FilterForwardError as error:
            self._went_offline(str(error))
            return None
        self._went_online(reader)
        return reader

    def _pump(self, reader: _Reader) -> None:
        """Moves frames from one open reader into the queue until it ends, fails or the source closes."""
        realtime = self.pacing == "realtime"
        pacer = _Pacer(self._fps) if realtime and not self.is_live and self._fps else None
        try:
            while not self._stop.is_set():
                decoded = reader.read()
                if decoded is None:
                    self._check_complete(reader)
                    return
                frame = self._frame(*decoded, reader.decode_s)
                if pacer is not None and not pacer.wait(self._stop):
                    return
                if self._cap is not None and not self._cap.admit(time.monotonic()):
                    with self._lock:
                        self._frames_capped += 1
                    continue
                dropped = self._queue.put(frame, drop_oldest=realtime)
                with self._lock:
                    self._frames_dropped += dropped
        finally:
            reader.close()

    def _check_complete(self, reader: _Reader) -> None:
        """A recording that stops decoding well before the frame count its container states is broken there."""
        expected, read = reader.expected_frames, self._frames_read
        if not self.is_live and expected is not None and read < expected - max(2, expected // 100):
            raise FilterForwardError(
                f"the recording ended early, at frame {read} of {expected}: the file is truncated or corrupt from "
                "there (the frames before it were filtered)"
            )

    def _frame(self, image: np.ndarray, position_ms: float, decode_s: float) -> Frame:
        """Numbers and stamps a freshly decoded image."""
        now = time.monotonic()
        with self._lock:
            index = self._frames_read
            self._frames_read += 1
            self._meter.tick(now, decode_s)
            probe = self._probe
            measured = probe.tick(now) if probe is not None else None
        if probe is not None and measured is not None:
            self._measured(probe.reported, measured)
        if self.is_live:
            timestamp = self._clock.stamp(position_ms)
        else:
            assert self._fps is not None, "recordings always have a frame rate"
            timestamp = index / self._fps
        return Frame(index, timestamp, image)


def open_source(url: str, **options: Any) -> VideoSource:
    """Opens a source (see VideoSource for the options); bad input raises FilterForwardError with one line."""
    return VideoSource(url, **options)
