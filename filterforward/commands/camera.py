"""`filterforward camera`: serve a recorded clip as a live HTTP MJPEG camera (a stand-in for an IP camera)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("camera", help="serve a recorded clip as a live HTTP MJPEG camera")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve_parser = actions.add_parser(
        "serve",
        help="play CLIP in real time as multipart/x-mixed-replace JPEG at http://HOST:PORT/",
        description="Plays CLIP (a video file, image folder or dataset folder) at its recorded frame rate, or "
        "--fps, whether or not anyone watches, like a camera; every client (an edge's `source: http://HOST:PORT/`) "
        "gets the frames from when it connects. GET /healthz answers 200 while the clip plays. Prints `ready` once "
        "it listens; stops cleanly on Ctrl-C/SIGTERM, or at the end of the clip with --no-loop.",
    )
    serve_parser.add_argument("clip", type=Path, metavar="CLIP", help="video file, image folder or dataset folder")
    serve_parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    serve_parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 for all)")
    serve_parser.add_argument("--fps", type=float, help="frames per second (default: the clip's own rate)")
    serve_parser.add_argument(
        "--width", type=int, help="resize frames to this width, keeping the aspect ratio (default: as recorded)"
    )
    serve_parser.add_argument(
        "--loop", action=argparse.BooleanOptionalAction, default=True, help="replay the clip forever (default: loop)"
    )
    serve_parser.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    from edge.camera_server import CameraServer

    server = CameraServer(args.clip, args.host, args.port, fps=args.fps, width=args.width, loop=args.loop)
    for handled in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handled, lambda *_: server.request_stop())
    try:
        server.start()
        print("ready", flush=True)  # for scripts and tests that wait for the camera
        server.wait()
    finally:
        server.close()
    return 0
