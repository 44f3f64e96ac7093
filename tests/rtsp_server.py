"""A real RTSP camera for tests: GStreamer's RTSP server streaming a clip's H.264 as RTP, looping.

Run with Debian's python3 (it needs gi + GstRtspServer, which the project venv lacks):
    /usr/bin/python3 tests/rtsp_server.py --clip CLIP --port PORT [--path /cam] [--frames N] [--user NAME:PASSWORD]
It binds 127.0.0.1 only, serves rtsp://127.0.0.1:PORT/cam, prints "ready" once listening and stops on
SIGTERM/SIGINT, printing "pushed N": the frames it handed to its clients' pipelines, an upper bound of what they
got. The clip's encoded frames are read once and replayed in a loop at the clip's frame rate,
without re-encoding (the first frame is a keyframe, so every loop and every new client decodes cleanly).
With --user the camera demands HTTP-style basic auth, like most real IP cameras.

Debian packages: gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi python3-gst-1.0
gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad.
"""

from __future__ import annotations

import argparse
import os
import signal

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402  (versions must be pinned first)

PULL_TIMEOUT_NS = 10 * Gst.SECOND  # bounds the initial read of the clip
DEFAULT_FPS = 25.0  # for a clip whose caps carry no frame rate
PIPELINE = "( appsrc name=src format=time ! h264parse config-interval=-1 ! rtph264pay name=pay0 pt=96 )"


def load_access_units(clip: str, frames: int) -> tuple[list[bytes], Gst.Caps]:
    """The clip's first `frames` H.264 access units (byte-stream) and their caps."""
    reader = Gst.parse_launch(
        "filesrc name=file ! qtdemux ! h264parse ! video/x-h264,stream-format=byte-stream,alignment=au"
        " ! appsink name=sink sync=false"
    )
    reader.get_by_name("file").set_property("location", clip)
    sink = reader.get_by_name("sink")
    reader.set_state(Gst.State.PLAYING)
    units: list[bytes] = []
    caps: Gst.Caps | None = None
    while len(units) < frames and (sample := sink.emit("try-pull-sample", PULL_TIMEOUT_NS)) is not None:
        buffer = sample.get_buffer()
        units.append(buffer.extract_dup(0, buffer.get_size()))
        caps = caps or sample.get_caps()
    reader.set_state(Gst.State.NULL)
    if not units or caps is None:
        raise SystemExit(f"no H.264 frames read from {clip}; give an MP4 holding H.264 video")
    return units, caps


def frame_period_ns(caps: Gst.Caps) -> int:
    found, numerator, denominator = caps.get_structure(0).get_fraction("framerate")
    fps = numerator / denominator if found and numerator > 0 and denominator > 0 else DEFAULT_FPS
    return round(Gst.SECOND / fps)


class LoopingFeed:
    """Feeds one client's pipeline: the access units in a loop, stamped at the clip's frame rate
    (the server's sinks sync to the clock, which paces the stream)."""

    def __init__(self, units: list[bytes], period_ns: int, pushed: list[int]) -> None:
        self._units, self._period_ns, self._pushed = units, period_ns, pushed
        self._count = 0

    def need_data(self, source: Gst.Element, _length: int) -> None:
        buffer = Gst.Buffer.new_wrapped(self._units[self._count % len(self._units)])
        buffer.pts = buffer.dts = self._count * self._period_ns
        buffer.duration = self._period_ns
        self._count += 1
        self._pushed[0] += 1
        source.emit("push-buffer", buffer)


def make_factory(units: list[bytes], caps: Gst.Caps, pushed: list[int]) -> GstRtspServer.RTSPMediaFactory:
    """A factory that builds one pipeline per client, each starting at the clip's first frame; `pushed[0]` counts
    the frames fed to all of them."""
    period_ns = frame_period_ns(caps)

    def configure(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
        source = media.get_element().get_by_name("src")
        source.set_property("caps", caps)
        source.connect("need-data", LoopingFeed(units, period_ns, pushed).need_data)

    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(PIPELINE)
    factory.connect("media-configure", configure)
    return factory


def require_basic_auth(server: GstRtspServer.RTSPServer, factory: GstRtspServer.RTSPMediaFactory, user: str) -> None:
    name, _, password = user.partition(":")
    token = GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", name)
    auth = GstRtspServer.RTSPAuth()
    auth.add_basic(GstRtspServer.RTSPAuth.make_basic(name, password), token)
    server.set_auth(auth)
    permissions = GstRtspServer.RTSPPermissions()
    permissions.add_permission_for_role(name, "media.factory.access", True)
    permissions.add_permission_for_role(name, "media.factory.construct", True)
    factory.set_permissions(permissions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/cam")
    parser.add_argument("--frames", type=int, default=1_000_000, help="loop only the first N frames")
    parser.add_argument("--user", help="NAME:PASSWORD that clients must send (basic auth)")
    args = parser.parse_args()
    Gst.init(None)
    units, caps = load_access_units(args.clip, args.frames)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    pushed = [0]
    factory = make_factory(units, caps, pushed)
    if args.user:
        require_basic_auth(server, factory, args.user)
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{args.port}; is the port free?")
    loop = GLib.MainLoop()
    for stop in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, stop, loop.quit)
    print("ready", flush=True)
    loop.run()
    # Drop the clients, then leave without interpreter teardown: finalizing Python while a client's
    # streaming thread still calls `need_data` segfaults now and then (exit -11 instead of 0).
    server.client_filter(lambda _server, _client: GstRtspServer.RTSPFilterResult.REMOVE)
    print(f"pushed {pushed[0]}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
