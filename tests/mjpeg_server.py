"""A tiny real HTTP MJPEG camera for tests: serves a clip's frames as multipart/x-mixed-replace JPEG.

Run: python tests/mjpeg_server.py --clip CLIP --port PORT [--frames N] [--fps F] [--width W]
It binds 127.0.0.1 only, prints "ready" once listening, loops the first N frames of the clip forever
at F fps to every client, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2

BOUNDARY = "ffframe"


def load_jpegs(clip: str, frames: int, width: int) -> list[bytes]:
    """The first `frames` frames of the clip, downscaled to `width`, JPEG-encoded once up front."""
    capture = cv2.VideoCapture(clip)
    jpegs: list[bytes] = []
    while len(jpegs) < frames:
        ok, image = capture.read()
        if not ok:
            break
        height = round(image.shape[0] * width / image.shape[1])
        ok, buffer = cv2.imencode(".jpg", cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA))
        jpegs.append(buffer.tobytes())
    capture.release()
    if not jpegs:
        raise SystemExit(f"no frames decoded from {clip}")
    return jpegs


def make_handler(jpegs: list[bytes], fps: float) -> type[BaseHTTPRequestHandler]:
    class MjpegHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", f"multipart/x-mixed-replace;boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            index = 0
            try:
                while True:
                    jpeg = jpegs[index % len(jpegs)]
                    head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                    self.wfile.write(head.encode("ascii") + jpeg + b"\r\n")
                    self.wfile.flush()
                    index += 1
                    time.sleep(1.0 / fps)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client went away

        def log_message(self, format: str, *args: object) -> None:
            return  # keep the test output quiet

    return MjpegHandler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--fps", type=float, default=25.0)
    parser.add_argument("--width", type=int, default=192)
    args = parser.parse_args()
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), make_handler(load_jpegs(args.clip, args.frames, args.width), args.fps)
    )
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
