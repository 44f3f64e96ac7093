"""A live RTSP camera through a real edge to a real cloud, with the camera down for 10 s mid-stream.

All real processes on loopback: GStreamer's RTSP server (tests/rtsp_server.py under Debian's python3) looping
60 frames of the car clip around the red car's pass, `filterforward cloud serve` over CURVE, and
`filterforward edge run` on rtsp://127.0.0.1:PORT/cam at realtime pacing. Two filters are registered over
REST: the red-vehicle MC trained by `filterforward train` (an event per loop of the clip) and an exported MC
whose output bias makes it fire on every frame (so every frame the edge processes is stored, and a frame
invented during the outage would show).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import av
import cv2
import pytest
from edge_site import CAMERA, INPUT_SIZE, Site, assert_exactly_once, make_site
from rtsp_camera import LOOP_FRAMES, RtspCamera, require_rtsp_server
from support import free_port, wait_until

from cloud.db import StoredFrame
from models.bundle import write_bundle
from models.datasets import open_dataset

RED, ALWAYS = "red-car", "always"
LOOP_START = 180  # the red car passes at frames 187-238: clip frames 7-58 of 60, so one event per loop
OUTAGE_S = 10.0  # how long the camera stays down (the number)
WAIT_S = 60.0  # upper bound for every wait; only a broken edge, cloud or camera ever reaches it


@pytest.fixture(scope="module")
def red_loop(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 frames of the real clip around the red car as H.264 without B-frames (the RTSP server stamps
    access units in decode order), at the clip's 12.5 fps."""
    out = tmp_path_factory.mktemp("loop") / "red-loop.mp4"
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(25, 2), options={"crf": "18", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 768, 432, "yuv420p"
        for _, image in open_dataset(intel_car).frames(LOOP_START, LOOP_START + LOOP_FRAMES):
            frame = av.VideoFrame.from_ndarray(cv2.resize(image, (768, 432)), format="bgr24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out


@pytest.fixture(scope="module", autouse=True)
def rtsp_server_available() -> None:
    require_rtsp_server()


@pytest.fixture
def always_bundle(make_filter, tmp_path: Path) -> Path:
    spec, onnx = make_filter("full_frame", "late", INPUT_SIZE, name=ALWAYS, bias=10.0)
    return write_bundle(tmp_path / ALWAYS, spec, onnx)


@pytest.fixture
def camera(red_loop: Path) -> Iterator[RtspCamera]:
    camera = RtspCamera(red_loop, free_port())
    yield camera
    camera.stop()


@pytest.fixture
def site(tmp_path: Path, camera: RtspCamera) -> Iterator[Site]:
    site = make_site(tmp_path, camera.url(), "realtime")
    site.cloud.start()
    try:
        yield site
    finally:
        site.cloud.stop()


@dataclass(frozen=True)
class Outage:
    """Wall-clock marks of the camera's outage (this machine's clock, which the edge stamps frames with)."""

    stopped: datetime  # the camera server had exited
    restarting: datetime  # just before the camera server was started again
    pushed: int | None  # frames the camera server fed its clients before the outage (None: it did not say)


def now() -> datetime:
    return datetime.now(UTC)


def at(frame: StoredFrame) -> datetime:
    return frame.captured_at.replace(tzinfo=UTC)


def camera_state(site: Site) -> dict:
    with site.cloud.client() as client:
        cameras = client.get("/api/cameras").json()
    return next((c for c in cameras if c["name"] == CAMERA), {"online": False, "stats": {}})


def events(site: Site) -> list[dict]:
    with site.cloud.client() as client:
        return client.get("/api/events", params={"camera": CAMERA, "limit": 500}).json()["items"]


def closed_red_events(site: Site, since: datetime) -> list[dict]:
    started = [e for e in events(site) if e["filter"] == RED and datetime.fromisoformat(e["started_at"]) > since]
    return [e for e in started if not e["open"]]


def ride_out_outage(site: Site, camera: RtspCamera, edge: subprocess.Popen) -> Outage:
    """Stop the camera for OUTAGE_S seconds and start it again on the same port; the edge must stay up and
    report the camera offline to the cloud for the rest of the outage."""
    camera.stop()
    stopped, stopped_clock, pushed = now(), time.monotonic(), camera.pushed
    wait_until(lambda: not camera_state(site)["online"], "the cloud to show the camera offline", timeout=WAIT_S)
    while time.monotonic() - stopped_clock < OUTAGE_S:
        assert edge.poll() is None, f"the edge exited during the outage:\n{site.edge_log()}"
        assert not camera_state(site)["online"], "the camera showed online while its server was down"
        time.sleep(0.25)
    restarting = now()
    camera.start()
    wait_until(lambda: camera_state(site)["online"], "the camera to come back online", timeout=WAIT_S)
    return Outage(stopped, restarting, pushed)


def stop_edge(site: Site, edge: subprocess.Popen) -> None:
    edge.send_signal(signal.SIGTERM)
    try:
        assert edge.wait(timeout=WAIT_S) == 0, site.edge_log()
    finally:
        if edge.poll() is None:
            edge.kill()


def test_camera_outage_mid_stream_loses_no_event_and_invents_no_frame(
    site: Site, camera: RtspCamera, red_bundle: Path, always_bundle: Path
) -> None:
    site.register(red_bundle, name=RED)
    site.register(always_bundle)
    camera.start()
    started = now()
    edge = site.start_edge()
    try:
        wait_until(lambda: closed_red_events(site, started), "a red-car event before the outage", timeout=WAIT_S)
        outage = ride_out_outage(site, camera, edge)
        wait_until(lambda: closed_red_events(site, outage.restarting), "a red-car event after it", timeout=WAIT_S)
        dropped = camera_state(site)["stats"]["dropped"]
    finally:
        stop_edge(site, edge)
    assert_exactly_once(site)
    check_events(site, outage)
    check_no_invented_frames(site, outage, dropped)
    assert f"{CAMERA}: offline" in site.edge_log()


def check_events(site: Site, outage: Outage) -> None:
    """Red events before and after the outage all arrived, the outage closed the events open when the camera
    died, and SIGTERM closed every open event."""
    found = events(site)
    assert found and all(not e["open"] and e["frames"] > 0 for e in found), found
    red = [e for e in found if e["filter"] == RED]
    assert [e for e in red if datetime.fromisoformat(e["started_at"]) < outage.stopped]
    assert [e for e in red if datetime.fromisoformat(e["started_at"]) > outage.restarting]
    # The outage ended the events open when the camera died: none spans it.
    spans = [e for e in found if started_before(e, outage.stopped) and ended_after(e, outage.restarting)]
    assert not spans, spans


def started_before(event: dict, moment: datetime) -> bool:
    return datetime.fromisoformat(event["started_at"]) < moment


def ended_after(event: dict, moment: datetime) -> bool:
    return datetime.fromisoformat(event["ended_at"]) > moment


def check_no_invented_frames(site: Site, outage: Outage, dropped: int) -> None:
    """The always-firing filter stores every frame the edge processed. Before the camera came back the edge
    processed no more frames than the camera had sent (the frame index counts decoded frames from 0; reasoned in
    frames, not in wall time, which a loaded machine stretches); the frame index skips no more across the outage
    than the source dropped."""
    frames = sorted((f for f in site.stored() if ALWAYS in f.scores), key=lambda f: f.frame_index)
    before = [f for f in frames if at(f) < outage.restarting]
    after = [f for f in frames if at(f) > outage.restarting]
    assert before and after
    assert outage.pushed is not None, "the camera server did not say how many frames it sent"
    invented = [f.frame_index for f in before if f.frame_index >= outage.pushed]
    assert not invented, f"frames {invented} were processed but the camera sent only {outage.pushed} before it died"
    last, first = before[-1], after[0]
    assert at(last) <= at(first) and first.frame_index > last.frame_index
    assert first.frame_index - last.frame_index - 1 <= dropped
    # Stream time follows the clock through the outage rather than closing the gap (the camera's own clock
    # restarts with the new connection; up to a second of drift plus the first open's buffering is allowed).
    assert first.stream_time - last.stream_time > OUTAGE_S / 2
