"""A recorded clip served as a live HTTP MJPEG camera (multipart/x-mixed-replace JPEG), like a cheap IP camera.

The compose setup's replayed camera and the live-source tests use it. One player thread plays the clip at its
frame rate (or a given one) whether anyone watches or not, as a camera would; every client gets the frames from
the moment it connects. `GET /` is the stream, `GET /healthz` answers 200 while the clip plays. Edge-only
dependencies (OpenCV through edge.sources); no torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np

from common.listening import cannot_listen
from edge.sources import DEFAULT_FPS, VideoSource
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

BOUNDARY = "ffframe"
STREAM_PATH = "/"
HEALTH_PATH = "/healthz"
JPEG_QUALITY = 85


class ClipPlayer:
    """Plays the clip in real time in its own thread and keeps the latest frame as JPEG for the clients.

    on_end is called once the player stops: at the end of a clip played once, a clip that breaks, or stop()."""

    def __init__(
        self,
        clip: str,
        fps: float | None = None,
        width: int | None = None,
        loop: bool = True,
        on_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.clip, self.width, self.loop = clip, width, loop
        self._fps_option, self._on_end = fps, on_end
        self._source = self._open(announce=True)  # a clip that can't be played fails here, before the camera listens
        if self._source.is_live:
            self._source.close()
            raise FilterForwardError(f"{clip} is a live source; give a video file, image folder or dataset folder")
        self.fps: float = self._source.fps or DEFAULT_FPS
        self._changed = threading.Condition()  # guards everything below and the swap of _source
        self._jpeg: bytes | None = None
        self._count = 0  # frames published so far
        self._playing = True
        self._thread = threading.Thread(target=self._run, name="clip player", daemon=True)

    def _open(self, announce: bool) -> VideoSource:
        """The clip from its start; only its first opening is logged at INFO (a camera looping a 30 s clip for
        months would otherwise log a line every 30 s)."""
        return VideoSource(
            self.clip, pacing="realtime", fps=self._fps_option, queue_size=1, name="clip", announce=announce
        )

    @property
    def playing(self) -> bool:
        with self._changed:
            return self._playing

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._playing = False
            self._changed.notify_all()
            source = self._source
        source.close()  # ends the player's read at once; it will not open another
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def next_frame(self, seen: int) -> tuple[int, bytes] | None:
        """The newest frame if it is newer than frame number `seen` (0: none seen yet), else waits for the next;
        with its number. None once the player has stopped."""
        with self._changed:
            self._changed.wait_for(lambda: not self._playing or self._count > seen)
            if not self._playing or self._jpeg is None:
                return None
            return self._count, self._jpeg

    def _run(self) -> None:
        source: VideoSource | None = self._source
        try:
            while source is not None:
                for frame in source:
                    self._publish(self._encode(frame.image))
                source.close()
                source = self._reopen() if self.loop else None
            if self.playing:  # the end of a clip played once, not stop()
                log.info("%s has ended; the camera stops", self.clip)
        except FilterForwardError as exc:  # the file broke mid-play: the camera goes dark, as a real one would
            log.error("the camera stops: %s", exc)
        finally:
            with self._changed:
                self._playing = False
                self._changed.notify_all()
            self._on_end()

    def _reopen(self) -> VideoSource | None:
        """The clip from its start again; None once stop() was called."""
        with self._changed:
            if not self._playing:
                return None
            self._source = self._open(announce=False)
            return self._source

    def _encode(self, image: np.ndarray) -> bytes:
        if self.width is not None and self.width != image.shape[1]:
            height = max(1, round(image.shape[0] * self.width / image.shape[1]))
            image = cv2.resize(image, (self.width, height), interpolation=cv2.INTER_AREA)
        ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise FilterForwardError(f"could not encode a frame of {self.clip} as JPEG")
        return buffer.tobytes()

    def _publish(self, jpeg: bytes) -> None:
        with self._changed:
            self._jpeg = jpeg
            self._count += 1
            self._changed.notify_all()


def _make_handler(player: ClipPlayer) -> type[BaseHTTPRequestHandler]:
    class MjpegHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == HEALTH_PATH:
                self._health()
            elif self.path == STREAM_PATH:
                self._stream()
            else:
                self.send_error(404, f"no such path: the stream is at {STREAM_PATH}, health at {HEALTH_PATH}")

        def _health(self) -> None:
            playing = player.playing
            body = b"ok\n" if playing else b"the clip has ended\n"
            self.send_response(200 if playing else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", f"multipart/x-mixed-replace;boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            seen = 0
            try:
                while (latest := player.next_frame(seen)) is not None:
                    seen, jpeg = latest
                    head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                    self.wfile.write(head.encode("ascii") + jpeg + b"\r\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the client went away

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return MjpegHandler


class CameraServer:
    """The MJPEG camera: start() plays the clip and listens, wait() blocks until request_stop() or the end of
    a clip played once, close() stops it all (the clients' streams end, the port is released)."""

    def __init__(
        self,
        clip: Path | str,
        host: str = "127.0.0.1",
        port: int = 8080,
        fps: float | None = None,
        width: int | None = None,
        loop: bool = True,
    ) -> None:
        if not 1 <= port <= 65535:
            raise FilterForwardError(f"camera port {port} is not a TCP port (1-65535)")
        if fps is not None and fps <= 0:
            raise FilterForwardError(f"camera fps {fps:g} must be above 0")
        if width is not None and width < 16:
            raise FilterForwardError(f"camera width {width} is too small: give at least 16 pixels")
        self._done = threading.Event()
        self.player = ClipPlayer(str(clip), fps, width, loop, on_end=self._done.set)
        try:
            self._http = ThreadingHTTPServer((host, port), _make_handler(self.player))
        except OSError as exc:
            self.player.stop()
            raise cannot_listen("listen", host, port, exc, "--port", "--host") from None
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="camera http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}{STREAM_PATH}"

    def start(self) -> None:
        self.player.start()
        self._thread.start()
        log.info("serving %s at %.2f fps as an MJPEG camera at %s", self.player.clip, self.player.fps, self.url)

    def request_stop(self) -> None:
        """Makes wait() return; safe to call from a signal handler."""
        self._done.set()

    def wait(self) -> None:
        # Timed waits: a signal delivered to another thread only runs its Python handler once the main thread
        # wakes up, and an untimed wait would never wake.
        while not self._done.wait(timeout=0.5):
            pass

    def close(self) -> None:
        self.player.stop()  # first: the clients' stream loops see it and end
        if self._thread.is_alive():
            self._http.shutdown()
        self._http.server_close()
        log.info("the camera at %s has stopped", self.url)
