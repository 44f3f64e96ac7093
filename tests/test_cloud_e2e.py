"""Edge to cloud end to end, all real processes on loopback: `filterforward cloud serve`, `filterforward edge run`
replaying the real car clip, a red-vehicle filter trained by `filterforward train` and registered over REST, CURVE
keys made by `filterforward keys create`.

Exactly once is checked on the edge's own sequence numbers: every seq the edge ever assigned is stored by the
cloud once (the `received` table is keyed on it), and the edge's spool is empty when it exits; with the default
encoding (the camera's H.264 stream) each fragment is stored once, in stream order, and every matched frame is
served as a JPEG decoded from its GOP (tests/edge_site.py). One filter sends JPEGs (`encoding: jpeg`).
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
import yaml
from edge_site import CAMERA, EDGE, INPUT_SIZE, Site, assert_exactly_once, finish, make_site
from support import BROKER, MqttSubscriber, clip_frames, wait_until, with_encoding

from models.bundle import write_bundle
from models.datasets import open_dataset


@pytest.fixture(scope="module")
def gate_clip(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Frames 150-377 of the real clip (the red car at 37-88, then 11 s without one) as an H.264 file at
    the clip's 12.5 fps. The long tail gives a cloud killed at the first match time to restart before the clip
    ends: an edge that ends while the cloud is down keeps its spool for the next start (by design)."""
    out = tmp_path_factory.mktemp("clip") / "gate.mp4"
    dataset = open_dataset(intel_car)
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(25, 2), options={"crf": "18"})
        stream.width, stream.height, stream.pix_fmt = 768, 432, "yuv420p"
        for _, image in dataset.frames(150, 377):
            frame = av.VideoFrame.from_ndarray(cv2.resize(image, (768, 432)), format="bgr24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out


@pytest.fixture
def site(tmp_path: Path, gate_clip: Path) -> Iterator[Site]:
    # A 2 s link timeout: the 3 s outage below must show as "unreachable" on the edge.
    site = make_site(tmp_path, gate_clip, "realtime", timeout=2.0)
    site.cloud.start()
    try:
        yield site
    finally:
        if site.cloud.process and site.cloud.process.poll() is None:
            site.cloud.stop()


def test_matched_frames_arrive_as_events_jpegs_and_mqtt_messages(
    tmp_path: Path, gate_clip: Path, red_bundle: Path
) -> None:
    prefix = f"ff-e2e/{uuid.uuid4().hex}"
    mqtt = {"host": BROKER[0], "port": BROKER[1], "topic_prefix": prefix}
    site = make_site(tmp_path, gate_clip, "realtime", mqtt=mqtt)
    subscriber = MqttSubscriber(prefix)
    site.cloud.start()
    try:
        site.register(with_encoding(red_bundle, "jpeg", tmp_path / "jpeg"), name="red-car")
        finish(site, site.start_edge())
        assert_exactly_once(site)
        assert all(f.path and f.fragment_id is None for f in site.stored())  # JPEGs, no stream
        check_events_and_frames(site)
        check_notifications(site, subscriber.take_timed(2))
    finally:
        subscriber.close()
        site.cloud.stop()


def test_a_default_filter_s_frames_arrive_in_fragments_and_decode_in_the_cloud(
    tmp_path: Path, gate_clip: Path, red_bundle: Path, intel_car: Path
) -> None:
    site = make_site(tmp_path, gate_clip, "realtime")
    site.cloud.start()
    try:
        site.register(red_bundle, name="red-stream")  # trained with the default encoding: the stream
        finish(site, site.start_edge())
        assert_exactly_once(site)  # the fragments' seqs included, and every frame decoded
        with site.cloud.client() as client:
            (event,) = client.get("/api/events", params={"filter": "red-stream"}).json()["items"]
            frames = client.get(f"/api/events/{event['id']}/frames").json()
            assert len(frames) == event["frames"] > 0 and all(f["image_url"] for f in frames)
            originals = dict(open_dataset(intel_car).frames(150, 377))
            for frame in (frames[0], frames[len(frames) // 2], frames[-1]):  # a GOP's start, middle and end
                image = client.get(frame["image_url"])
                assert image.headers["content-type"] == "image/jpeg"
                decoded = cv2.imdecode(np.frombuffer(image.content, np.uint8), cv2.IMREAD_COLOR)
                original = cv2.resize(originals[150 + frame["frame_index"]], (768, 432))
                assert np.abs(decoded.astype(int) - original.astype(int)).mean() < 8  # the same picture
            peak = max(frames, key=lambda f: f["scores"]["red-stream"])
            assert event["thumbnail_url"].endswith(f"/{peak['id']}.jpg")  # the gallery shows the peak frame
            clip = client.get(event["clip_url"])
            with av.open(io.BytesIO(clip.content)) as container:
                assert sum(1 for _ in container.decode(video=0)) == len(frames)  # joined, every frame once
            assert clip.headers["x-event-start"] == "0.000"  # its event opened the GOP
    finally:
        site.cloud.stop()


def check_notifications(site: Site, messages: list[tuple[str, dict, float]]) -> None:
    """Start then end on <prefix>/<camera>/<filter>/<phase>; the start's frame was stored before it went out."""
    (start_topic, start, start_arrived), (end_topic, end, _) = messages
    assert start_topic.endswith(f"/{CAMERA}/red-car/start") and end_topic.endswith(f"/{CAMERA}/red-car/end")
    assert start["id"] == end["id"] and end["end_frame"] >= start["start_frame"]
    frame_id = int(start["frame_url"].rsplit("/", 1)[1].removesuffix(".jpg"))
    (frame,) = [f for f in site.stored() if f.id == frame_id]
    assert frame.received_at.replace(tzinfo=UTC).timestamp() <= start_arrived
    with site.cloud.client() as client:
        assert client.get(start["frame_url"]).headers["content-type"] == "image/jpeg"


def check_events_and_frames(site: Site) -> None:
    with site.cloud.client() as client:
        events = client.get("/api/events", params={"filter": "red-car", "camera": CAMERA}).json()["items"]
        assert events, "no red-car event"
        event = events[-1]
        assert event["edge"] == EDGE and not event["open"] and event["frames"] > 0
        # The red car passes at frames 37-88 of this clip: the event must overlap it.
        assert event["start_frame"] <= 88 and event["end_frame"] >= 37
        frames = client.get(f"/api/events/{event['id']}/frames").json()
        assert len(frames) == event["frames"] and all(f["scores"]["red-car"] >= 0.5 for f in frames)
        image = client.get(frames[0]["image_url"])
        assert image.headers["content-type"] == "image/jpeg"
        decoded = cv2.imdecode(np.frombuffer(image.content, np.uint8), cv2.IMREAD_COLOR)
        assert decoded.shape == (432, 768, 3)
        cameras = client.get("/api/cameras").json()
        assert [c["name"] for c in cameras] == [CAMERA] and not cameras[0]["online"]  # its clip ended


@pytest.mark.parametrize("encoding", ["stream", "jpeg"])
def test_cloud_killed_mid_stream_loses_nothing(site: Site, red_bundle: Path, encoding: str, tmp_path: Path) -> None:
    site.register(with_encoding(red_bundle, encoding, tmp_path / encoding), name="red-car")
    edge = site.start_edge()
    try:
        # Killed as the edge starts the red-car event, with most of the car's pass still to come: frames are then
        # matched while the cloud is down however late the cloud would have stored the first one (a loaded machine).
        started = "filter red-car: event started"
        wait_until(lambda: started in site.edge_log(), "the edge to start a red-car event", timeout=120)
        site.cloud.kill()  # SIGKILL: nothing flushed, the ingest's sockets vanish
        killed_at = datetime.now(UTC)
        time.sleep(3.0)
        site.cloud.start()
    finally:
        finish(site, edge)
    if site.spooled():  # the clip ended before the cloud was back (a loaded machine): the next start sends them first
        finish(site, site.start_edge())
    assert_exactly_once(site)
    during = [f for f in site.stored() if f.captured_at.replace(tzinfo=UTC) > killed_at]
    assert during, "no frame was matched while the cloud was down: the outage tested nothing"
    assert "unreachable" in site.edge_log()


@pytest.fixture
def every_frame_site(tmp_path: Path, intel_car: Path) -> Iterator[Site]:
    """The whole clip at full speed, every frame in order: a dropped frame would show as a gap."""
    site = make_site(tmp_path, intel_car / "car-detection.mp4", "every-frame")
    site.cloud.start()
    try:
        yield site
    finally:
        site.cloud.stop()


def test_filters_added_and_removed_while_the_edge_runs(
    every_frame_site: Site, red_bundle: Path, make_filter, tmp_path: Path
) -> None:
    site = every_frame_site
    site.register(red_bundle, name="red-car")
    spec, onnx = make_filter("full_frame", "late", INPUT_SIZE, name="always", bias=10.0)
    always_bundle = write_bundle(tmp_path / "always", spec, onnx)
    edge = site.start_edge()
    try:
        # Swap while the red car's event is open: the removed filter's event must still be closed.
        wait_until(lambda: any("red-car" in f.scores for f in site.stored()), "the red car", timeout=120)
        site.register(always_bundle)
        added = time.time()
        with site.cloud.client() as client:
            assert client.delete("/api/filters/red-car").status_code == 204
    finally:
        finish(site, edge)
    assert_exactly_once(site)

    stored = site.stored()
    always = sorted(f.frame_index for f in stored if "always" in f.scores)
    assert always, "the added filter never ran"
    assert always == list(range(always[0], 377)), "frames missing after the filter change"
    first = min(f.captured_at for f in stored if "always" in f.scores).replace(tzinfo=UTC).timestamp()
    print(f"added filter's first matched frame {first - added:.2f} s after its registration returned")
    with site.cloud.client() as client:
        stats = client.get("/api/cameras").json()[0]["stats"]
        red = client.get("/api/events", params={"filter": "red-car"}).json()["items"]
    assert stats["dropped"] == 0
    assert red and all(not e["open"] for e in red), "the removed filter's event was not closed"


def test_a_stream_cropped_to_the_roi_serves_the_crop_and_says_which_part_it_is(
    tmp_path: Path, short_clip: Path, make_filter
) -> None:
    roi = {"x0": 0.5, "y0": 0.25, "x1": 1.0, "y1": 0.75}  # of the clip's 384x216 frames: 192x108 at (192, 54)
    spec, onnx = make_filter("full_frame", "late", INPUT_SIZE, name="right", bias=10.0, roi=roi)
    bundle = write_bundle(tmp_path / "right", spec, onnx)
    site = make_site(tmp_path, short_clip, "every-frame")
    config = yaml.safe_load(site.edge_config.read_text())
    site.edge_config.write_text(yaml.safe_dump({**config, "defaults": {"upload": {"crop": "roi"}}}))
    site.cloud.start()
    try:
        site.register(bundle)
        finish(site, site.start_edge())
        assert_exactly_once(site)  # every frame decodes, all at one size
        with site.cloud.client() as client:
            (event,) = client.get("/api/events", params={"filter": "right"}).json()["items"]
            frames = client.get(f"/api/events/{event['id']}/frames").json()
            image = client.get(frames[len(frames) // 2]["image_url"])
            assert image.headers["x-crop"] == "x=192,y=54,width=192,height=108,frame_width=384,frame_height=216"
            decoded = cv2.imdecode(np.frombuffer(image.content, np.uint8), cv2.IMREAD_COLOR)
            original = clip_frames(short_clip, 0, 40, (384, 216))[frames[len(frames) // 2]["frame_index"]]
            assert np.abs(decoded.astype(int) - original[54:162, 192:384].astype(int)).mean() < 8
            with av.open(io.BytesIO(client.get(event["clip_url"]).content)) as container:
                pictures = [p.to_ndarray(format="bgr24") for p in container.decode(video=0)]
            assert len(pictures) == len(frames) and pictures[0].shape == (108, 192, 3)
    finally:
        site.cloud.stop()
