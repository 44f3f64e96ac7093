"""Operations: graceful shutdown and restart of a real `filterforward edge run`, its /metrics, and full disks.

The process tests run a real cloud (`filterforward cloud serve`, insecure ZeroMQ on loopback) and a real edge
replaying the real car clip with an always-firing filter, so every processed frame goes up (in the camera's
H.264 stream, the default encoding; one full-disk case also as JPEGs). Nothing lost is checked on the edge's own
sequence numbers: every seq the edge assigned from its first start on is in the cloud's `received` table and
the spool is empty at the end; each stream fragment is stored once and in order, and every frame decodes
(tests/edge_site.py). The full disks are real: a small tmpfs mounted
for the test (root only; skipped otherwise).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
import zmq
from cloud_server import REPO, CloudServer, run_cloud, write_config
from edge_site import assert_images, stored_rows
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from support import free_port, wait_until

from cloud.config import CloudConfig, TokenConfig, ZmqConfig
from cloud.datasets import DISK_RESERVE
from cloud.db import Edge as EdgeRow
from cloud.db import Fragment, Received, StoredFrame, as_utc, make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.ingest import Ingest
from cloud.storage import Storage
from common.files import TEMPORARY
from common.protocol import JPEG_START, Ack, EventHeader, EventInfo, FrameHeader, Heartbeat, Hello, decode, encode
from edge.spool import DISK_HEADROOM, Spool
from models.bundle import write_bundle

EDGE, CAMERA = "edge-1", "gate"
SIZE = (384, 224)
WAIT = 120.0  # seconds; only keeps a broken test from hanging
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- real small disks --------------------------------------------------------------------------------------


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the duration; skips the test where that is not possible."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a small tmpfs, and mounting one needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> Path:
    """A file that takes every free byte of `folder`'s disk."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (b"\0" * 2**16, b"\0" * 512):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (folder / "probe").write_bytes(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


# -- a real edge process -----------------------------------------------------------------------------------


@dataclass
class Edge:
    """`filterforward edge run` on a config in `root`: its log, its spool, its /metrics."""

    root: Path
    metrics_port: int
    process: subprocess.Popen | None = None

    @property
    def config(self) -> Path:
        return self.root / "edge.yaml"

    def configure(self, cloud: CloudServer, source: Path, bundle: Path, timeout: float) -> None:
        settings = cloud.config.zmq
        config = {
            "edge_id": EDGE,
            "input_size": list(SIZE),
            "defaults": {"pacing": "realtime", "resolution": [384, 216]},
            "cameras": [{"name": CAMERA, "source": str(source)}],
            "filters": [str(bundle)],
            "cloud": {
                "address": "127.0.0.1",
                "ingest_port": settings.ingest_port,
                "publish_port": settings.publish_port,
                "insecure": True,
                "heartbeat": 0.3,
                "timeout": timeout,
            },
            "spool": {"path": str(self.root / "spool")},
            "stats_interval": 0.5,
            "metrics_port": self.metrics_port,
        }
        self.config.write_text(yaml.safe_dump(config))

    def start(self) -> None:
        with (self.root / "edge.log").open("a") as log:
            command = [sys.executable, "-m", "filterforward", "edge", "run", "--config", str(self.config)]
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def exit_code(self) -> int:
        try:
            return self.process.wait(timeout=WAIT)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return (self.root / "edge.log").read_text()

    def spool(self) -> Spool:
        return Spool(self.root / "spool", 2**30)

    def spooled(self) -> list[int]:
        spool = self.spool()
        try:
            return [seq for seq, _ in spool.after(0, 10**6)]
        finally:
            spool.close()

    def metrics(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def metric(self, name: str, **labels: str) -> float | None:
        """One value from /metrics now; None while the endpoint is not up (or lacks it)."""
        try:
            return self.metrics().get((name, tuple(sorted(labels.items()))))
        except httpx.TransportError:
            return None


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture(scope="module")
def always_bundle(make_filter, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fires on every frame, with the default encoding (the stream)."""
    spec, onnx = make_filter("full_frame", "late", SIZE, name="always", bias=10.0)
    return write_bundle(tmp_path_factory.mktemp("always") / "always", spec, onnx)


@pytest.fixture(scope="module")
def always_jpeg_bundle(make_filter, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec, onnx = make_filter("full_frame", "late", SIZE, name="always", bias=10.0, encoding={"kind": "jpeg"})
    return write_bundle(tmp_path_factory.mktemp("always-jpeg") / "always", spec, onnx)


@pytest.fixture
def clip(intel_car: Path) -> Path:
    """The whole real clip (377 frames at 12.5 fps): at real-time pacing a signal lands mid-stream."""
    return intel_car / "car-detection.mp4"


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    edge = Edge(tmp_path, free_port())
    yield edge
    edge.kill()


def first_seq(edge: Edge) -> int:
    """The seq the edge's spool will hand out first (the spool file is created here, before the edge starts)."""
    spool = edge.spool()
    try:
        return spool.last_seq + 1
    finally:
        spool.close()


def received(cloud: CloudServer) -> dict[int, datetime]:
    """seq -> when the cloud stored it, for every frame or event message of the edge."""
    engine = make_engine(cloud.config.db_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(Received.seq, Received.received_at).where(Received.edge_id == EDGE))
            return dict(rows.all())
    finally:
        engine.dispose()


def assert_all_delivered(edge: Edge, cloud: CloudServer, first: int) -> None:
    """Every seq the edge assigned since `first` is stored in the cloud, and nothing is left in its spool."""
    spool = edge.spool()
    try:
        assert spool.messages == 0, "the edge exited with unacknowledged messages"
        assert sorted(received(cloud)) == list(range(first, spool.last_seq + 1)), "a spooled message never arrived"
    finally:
        spool.close()


def events(cloud: CloudServer) -> list[dict]:
    with cloud.client() as client:
        return client.get("/api/events", params={"camera": CAMERA}).json()["items"]


# -- graceful shutdown, restart, /metrics ------------------------------------------------------------------


def test_sigterm_mid_stream_closes_the_event_loses_nothing_and_metrics_were_live(
    tmp_path: Path, edge: Edge, clip: Path, always_bundle: Path
) -> None:
    with run_cloud(tmp_path) as cloud:
        edge.configure(cloud, clip, always_bundle, timeout=10.0)
        first = first_seq(edge)
        edge.start()
        wait_until(lambda: (edge.metric("filterforward_edge_uplink_acked_total") or 0) > 0, "acked frames", WAIT)
        check_metrics(edge)
        edge.terminate()
        assert edge.exit_code() == 0, edge.log()

        assert "stopping: closing the cameras' open events" in edge.log()
        (event,) = events(cloud)
        assert not event["open"] and event["end_frame"] < 376, "the event was not closed, or the clip ended first"
        assert_all_delivered(edge, cloud, first)
        assert_images(cloud)
    assert "Traceback" not in edge.log()


def check_metrics(edge: Edge) -> None:
    """The camera's and the uplink's numbers, live; the counters are running totals across stats windows."""
    camera = {"camera": CAMERA}
    wait_until(lambda: (edge.metric("filterforward_edge_camera_fps", **camera) or 0) > 0, "a stats window", WAIT)
    samples = edge.metrics()

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("filterforward_edge_info", edge=EDGE) == 1
    assert value("filterforward_edge_camera_online", **camera) == 1
    assert value("filterforward_edge_uplink_cloud_reachable") == 1
    for name in ("decode_ms", "base_ms", "mc_ms"):
        assert value(f"filterforward_edge_camera_{name}", **camera) > 0, name
    assert value("filterforward_edge_camera_matched_total", **camera) > 0
    assert value("filterforward_edge_camera_dropped_total", **camera) >= 0
    assert value("filterforward_edge_camera_capped_total", **camera) == 0  # no fps option
    assert value("filterforward_edge_uplink_sent_messages_total") >= value("filterforward_edge_uplink_acked_total")
    assert value("filterforward_edge_uplink_sent_bytes_total") > 0
    assert value("filterforward_edge_uplink_spool_dropped_total") == 0
    for name in ("spool_messages", "spool_bytes", "in_flight"):
        assert value(f"filterforward_edge_uplink_{name}") >= 0
    assert ("filterforward_edge_filters_version", ()) in samples and (
        "filterforward_edge_filter_errors_total",
        (),
    ) in samples

    # Across several 0.5 s stats windows the frame count only grows (each window's own count starts at 0).
    frames = [value("filterforward_edge_camera_frames_total", **camera)]
    while len(frames) < 4:
        wait_until(lambda: (edge.metric("filterforward_edge_camera_frames_total", **camera) or 0) > frames[-1] + 5)
        frames.append(edge.metric("filterforward_edge_camera_frames_total", **camera))
    assert frames == sorted(frames) and frames[-1] > frames[0]


def test_sigterm_with_the_cloud_down_keeps_the_spool_and_a_restart_sends_it_first(
    tmp_path: Path, edge: Edge, clip: Path, always_bundle: Path
) -> None:
    cloud = CloudServer(write_config(tmp_path), tmp_path / "cloud.log")
    cloud.start()
    try:
        edge.configure(cloud, clip, always_bundle, timeout=2.0)
        first = first_seq(edge)
        edge.start()
        wait_until(lambda: received(cloud), "the first stored frame", WAIT)
        cloud.kill()
        wait_until(lambda: edge.metric("filterforward_edge_uplink_cloud_reachable") == 0, "the outage noticed", WAIT)
        wait_until(lambda: (edge.metric("filterforward_edge_uplink_spool_messages") or 0) > 5, "spooled frames")
        edge.terminate()
        assert edge.exit_code() == 0, edge.log()
        assert "stay spooled" in edge.log()
        kept = edge.spooled()
        assert set(kept) - set(received(cloud))  # (one may be stored: the cloud died before acking it)

        cloud.start()
        edge.configure(cloud, clip, always_bundle, timeout=10.0)  # the same ports; a long drain at the end
        edge.start()
        wait_until(lambda: len(set(received(cloud)) - set(kept)) > 10, "new frames", WAIT)
        edge.terminate()
        assert edge.exit_code() == 0, edge.log()
        assert_all_delivered(edge, cloud, first)
        at = received(cloud)
        assert max(at[seq] for seq in kept) <= min(t for seq, t in at.items() if seq > max(kept)), (
            "a new message was stored before the spooled ones"
        )
        assert_images(cloud)  # the restarted edge's stream starts with a new GOP
        assert len({f.run for f in stored_rows(cloud, Fragment)}) == 2
    finally:
        if cloud.process is not None and cloud.process.poll() is None:
            assert cloud.stop() == 0, cloud.log_text()


# -- full disks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["stream", "jpeg"])
def test_cloud_frame_store_full_then_freed_stores_every_frame(
    tmp_path: Path, edge: Edge, clip: Path, request: pytest.FixtureRequest, encoding: str
) -> None:
    always_bundle = request.getfixturevalue({"stream": "always_bundle", "jpeg": "always_jpeg_bundle"}[encoding])
    cloud_root = tmp_path / "cloud"
    with small_disk(cloud_root / "data" / "frames", "32m") as frames:
        filler = fill(frames)
        with run_cloud(cloud_root) as cloud:
            edge.configure(cloud, clip, always_bundle, timeout=10.0)
            first = first_seq(edge)
            edge.start()
            wait_until(lambda: ingest_count(cloud, "disk_full") >= 3, "frames refused for lack of space", WAIT)
            assert edge.metric("filterforward_edge_uplink_cloud_reachable") == 1

            # The cloud is reachable but acknowledges nothing: the edge waits for it after the signal, and a
            # second signal ends that wait.
            edge.terminate()
            wait_until(lambda: "waiting up to 10 s for the cloud" in edge.log(), "the drain")
            edge.terminate()
            assert edge.exit_code() == 0, edge.log()
            assert "stopping at once (asked again)" in edge.log() and "stay spooled" in edge.log()
            # Only messages without a file were stored: the event's start, and with the stream the frames' rows.
            assert edge.spooled() and not any(f.path for f in stored_frames(cloud))
            assert not stored_rows(cloud, Fragment)

            kept, second = edge.spooled(), first_seq(edge)
            filler.unlink()
            edge.start()
            new = lambda: [seq for seq in received(cloud) if seq >= second]  # noqa: E731
            wait_until(lambda: set(kept) <= set(received(cloud)) and len(new()) > 20, "the spooled and new ones", WAIT)
            edge.terminate()
            assert edge.exit_code() == 0, edge.log()
            assert_all_delivered(edge, cloud, first)
            assert_images(cloud)  # refused fragments were resent, and stored once and in order
            stored = [f.path for f in stored_frames(cloud)] + [f.path for f in stored_rows(cloud, Fragment)]
            assert all((frames / path).is_file() for path in stored if path)
            log = cloud.log_text()
        assert log.count("is full (No space left on device)") == 1, log  # once for the episode
        assert "ingest: storing again" in log


def test_a_full_frame_store_runs_retention_early_and_the_cloud_keeps_storing(
    tmp_path: Path, edge: Edge, clip: Path, always_bundle: Path
) -> None:
    cloud_root = tmp_path / "cloud"
    # The regular sweep runs at the start only; the store fills long before max_bytes would matter on a
    # real disk, so only the sweep the full disk asks for makes room.
    retention = {"max_bytes": 100_000, "interval": 3600}
    with small_disk(cloud_root / "data" / "frames", "256k"), run_cloud(cloud_root, retention=retention) as cloud:
        edge.configure(cloud, clip, always_bundle, timeout=10.0)
        first = first_seq(edge)
        edge.start()
        wait_until(lambda: ingest_count(cloud, "disk_full") >= 1, "a full frame store", WAIT)
        full_at = len(received(cloud))
        wait_until(lambda: len(received(cloud)) > full_at + 20, "frames stored after the early sweep", WAIT)
        edge.terminate()
        assert edge.exit_code() == 0, edge.log()
        assert_all_delivered(edge, cloud, first)
        assert_images(cloud, complete=False)  # retention deleted the oldest fragments: what is left is in order
        assert "retention deleted" in cloud.log_text().split("running a retention sweep now", 1)[1]


def ingest_count(cloud: CloudServer, name: str) -> float:
    return scrape(f"{cloud.url}/metrics").get(("filterforward_ingest_total", (("count", name),)), 0.0)


def stored_frames(cloud: CloudServer) -> list[StoredFrame]:
    engine = make_engine(cloud.config.db_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(select(StoredFrame)).all())
    finally:
        engine.dispose()


def test_ingest_on_a_full_frame_store_counts_asks_for_retention_and_acks_only_what_it_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk(tmp_path / "frames", "64k") as frames:
        filler = fill(frames)
        zmq_config = ZmqConfig(bind="127.0.0.1", insecure=True).model_copy(update={"ingest_port": 0, "publish_port": 0})
        config = CloudConfig(data_dir=tmp_path, tokens=[TokenConfig(name="t", token="t" * 16)], zmq=zmq_config)
        engine = make_engine(config.db_url)
        sessions = session_factory(engine)
        sweeps: list[int] = []
        storage = Storage(sessions, FrameStore(frames))
        ingest = Ingest(config, storage, sessions, notify=lambda _: None, on_disk_full=lambda: sweeps.append(1))
        ingest.start()
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://127.0.0.1:{ingest.port}")
        try:
            with caplog.at_level(logging.INFO, logger="cloud.ingest"):
                # A frame refused, an event start (no file: stored), two more frames refused: one episode.
                dealer.send_multipart(encode(frame(1), JPEG_START + b"\xff" * 9_997))
                dealer.send_multipart(encode(event_start(4)))
                for seq in (2, 3):
                    dealer.send_multipart(encode(frame(seq), JPEG_START + b"\xff" * 9_997))
                wait_until(lambda: ingest.counts["disk_full"] == 3, "three refusals")
                assert sweeps == [1] and ingest.counts["failed"] == 0  # one early sweep for the episode

                filler.unlink()
                for seq in (1, 2, 3):  # what the edge does: send the unacknowledged ones again
                    dealer.send_multipart(encode(frame(seq), JPEG_START + b"\xff" * 9_997))
                acked: list[int] = []
                while len(acked) < 4:
                    assert dealer.poll(WAIT * 1000)
                    header, _ = decode(dealer.recv_multipart())
                    if isinstance(header, Ack):
                        acked += header.seqs
                assert sorted(acked) == [1, 2, 3, 4] and ingest.counts["acked"] == 4  # no refused one ever was
            with sessions() as session:
                assert sorted(session.scalars(select(StoredFrame.seq))) == [1, 2, 3]
            lines = [r.getMessage() for r in caplog.records if r.name == "cloud.ingest"]
            assert len(lines) == 2, lines
            assert "is full (No space left on device)" in lines[0] and "running a retention sweep now" in lines[0]
            assert "ingest: storing again" in lines[1]
        finally:
            ingest.stop()
            context.destroy(linger=0)
            engine.dispose()


def event_start(seq: int) -> EventHeader:
    info = EventInfo(id="e1", filter="always", camera=CAMERA, start_frame=0, start_time=0.0, peak_score=0.9)
    return EventHeader(edge=EDGE, run="r1", seq=seq, phase="start", wall_time=1.7e9, event=info)


def frame(seq: int) -> FrameHeader:
    return FrameHeader(
        edge=EDGE, run="r1", seq=seq, camera=CAMERA, frame=seq, timestamp=0.1, wall_time=1.7e9, scores={}
    )


def test_spool_on_a_full_disk_drops_the_oldest_then_the_new_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def message(size: int):
        return lambda seq: encode(frame(seq), b"\x01" * size)

    with small_disk(tmp_path / "disk", f"{DISK_HEADROOM // 1024 + 8192}k") as disk:
        ballast = disk / "ballast"  # given back at the end: room beyond the headroom again
        ballast.write_bytes(b"\0" * 6 * 2**20)
        spool = Spool(disk, 2**30)
        try:
            with caplog.at_level(logging.INFO, logger="edge.spool"):
                seqs = []
                while not spool.dropped:  # the spool grows into the disk until only its headroom is left
                    seqs.append(spool.append(message(100_000)))
                    assert len(seqs) < 200, "the spool never started dropping"
                kept = [seq for seq, _ in spool.after(0, 10**6)]
                assert kept == seqs[spool.dropped :]  # the oldest went; the rest are whole and in order

                filler = fill(disk)  # something else takes every byte left
                more = [spool.append(message(100_000)) for _ in range(10)]
                assert None not in more, "the oldest messages' space was not reused"
                assert [seq for seq, _ in spool.after(0, 10**6)][-10:] == more

                messages = spool.messages
                assert spool.append(message(2 * DISK_HEADROOM)) is None  # no room even after dropping everything
                assert spool.messages == messages, "a message too big to ever fit emptied the spool"

                filler.unlink()
                ballast.unlink()
                assert spool.append(message(100_000)) is not None
            lines = [r.getMessage() for r in caplog.records if r.name == "edge.spool"]
            assert len(lines) == 3, lines  # one per episode, not one per drop
            assert "dropping the oldest unacknowledged messages" in lines[0]
            assert "new messages are dropped" in lines[1] and "has room again" in lines[2]
        finally:
            spool.close()
        reopened = Spool(disk, 2**30)
        assert (reopened.messages, reopened.bytes) == (spool.messages, spool.bytes)
        reopened.close()
        with sqlite3.connect(reopened.path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_frame_that_fails_is_skipped_and_the_camera_goes_on(
    make_filter, short_clip: Path, base_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The camera's folder in the sink is a file, so writing every matched JPEG fails: the node logs it and keeps
    processing the camera to the end of its clip (the event ends at the clip's last frame, not the first)."""
    from edge.config import CameraConfig, EdgeConfig, SinkConfig
    from edge.node import EdgeNode

    jpeg = {"kind": "jpeg"}  # a JPEG file per frame, each of which fails
    bundle = write_bundle(
        tmp_path / "always", *make_filter("full_frame", "late", (128, 96), name="always", bias=10.0, encoding=jpeg)
    )
    sink = tmp_path / "out"
    (sink / "frames").mkdir(parents=True)
    (sink / "frames" / "gate").write_text("not a folder")
    config = EdgeConfig(
        base_model=base_model,
        input_size=(128, 96),
        cameras=[CameraConfig(name="gate", source=str(short_clip), pacing="every-frame")],
        filters=[bundle],
        sink=SinkConfig(path=sink),
    )
    with caplog.at_level(logging.INFO, logger="edge.node"):
        EdgeNode(config).run()
    events = [json.loads(line) for line in (sink / "events.jsonl").read_text().splitlines()]
    (end,) = [e for e in events if e["type"] == "event_end"]
    assert (end["start_frame"], end["end_frame"]) == (0, 39)
    failed = [r for r in caplog.records if "failed" in r.getMessage() and "camera gate: frame" in r.getMessage()]
    assert len(failed) == 1  # the first failure is logged with its traceback; the next 39 are only counted
    stats = [m for r in caplog.records if (m := re.search(r"(\d+) matched, .* (\d+) failed so far", r.getMessage()))]
    matched, failed = map(int, stats[-1].groups())
    assert failed == matched > 0  # every matched frame failed to reach the sink, and the stats line says so


def test_an_edge_whose_sink_disk_is_full_counts_the_frames_and_leaves_no_broken_file(
    make_filter, short_clip: Path, base_model: Path, tmp_path: Path
) -> None:
    from edge.config import CameraConfig, EdgeConfig, SinkConfig
    from edge.node import EdgeNode

    bundle = write_bundle(tmp_path / "always", *make_filter("full_frame", "late", (128, 96), name="always", bias=10.0))
    with small_disk(tmp_path / "disk", "1m") as disk:
        config = EdgeConfig(
            base_model=base_model,
            input_size=(128, 96),
            cameras=[CameraConfig(name="gate", source=str(short_clip), pacing="every-frame")],
            filters=[bundle],
            sink=SinkConfig(path=disk / "out"),
        )
        node = EdgeNode(config)
        fill(disk)  # after the sink opened its folder and events.jsonl: every write from here fails
        node.run()
        jpegs = list((disk / "out" / "frames").rglob("*.jpg"))
        assert all(path.stat().st_size > 0 for path in jpegs)  # whole files or none
        assert not list((disk / "out").rglob(f"{TEMPORARY}*"))
        text = (disk / "out" / "events.jsonl").read_text()
        assert all(json.loads(line) for line in text.splitlines())  # no cut-off line
        problems = node.problems()
        assert problems[0].startswith("camera gate: ") and "frame(s) failed" in problems[0]
        assert problems[1:] == ["camera gate: its open events could not be closed ([Errno 28] No space left on device)"]


def test_filter_writes_on_a_full_database_disk_are_507_and_change_nothing(tmp_path: Path, make_filter) -> None:
    spec, onnx = make_filter("full_frame", "late", (128, 96), name="late-a")
    files = {"model": ("m.onnx", onnx, "application/octet-stream")}
    cloud_root = tmp_path / "cloud"
    with small_disk(cloud_root / "data", "16m") as data, run_cloud(cloud_root) as cloud, cloud.client() as client:
        assert client.post("/api/filters", data={"spec": spec.model_dump_json()}, files=files).status_code == 201
        filler = fill(data)
        other = spec.model_copy(update={"name": "late-b"})
        refused = client.post("/api/filters", data={"spec": other.model_dump_json()}, files=files)
        assert refused.status_code == 507, refused.text
        assert refused.json()["detail"] == (
            "filter 'late-b' could not be saved: the database's disk is full; free space there"
        )
        assert [f["name"] for f in client.get("/api/filters").json()] == ["late-a"]  # reads go on
        filler.unlink()
        assert client.post("/api/filters", data={"spec": other.model_dump_json()}, files=files).status_code == 201


def test_an_upload_that_would_fill_the_data_disk_is_refused_and_leaves_nothing(
    tmp_path: Path, short_clip: Path
) -> None:
    """A few MB of H.264 can decode to GBs of JPEGs (4.5 MB of a still 4K picture became 1.8 GB in a probe): the
    upload wrote on until the disk was full, starving the ingest. It stops while DISK_RESERVE is left free."""
    cloud_root = tmp_path / "cloud"
    with small_disk(cloud_root / "data", "16m") as data, run_cloud(cloud_root) as cloud, cloud.client() as client:
        with short_clip.open("rb") as video:
            refused = client.post("/api/datasets/upload", data={"name": "big"}, files={"video": ("c.mp4", video)})
        assert refused.status_code == 507, refused.text
        assert refused.json()["detail"].startswith(
            f"the clip's frames would leave under {DISK_RESERVE >> 20} MiB free on the cloud's data disk (0 written, "
        )
        assert client.get("/api/datasets").json() == []
        assert not any((data / "datasets").iterdir())  # its staging folder removed


def test_an_edge_heard_while_its_heartbeats_cannot_be_written_stays_online(tmp_path: Path) -> None:
    cloud_root = tmp_path / "cloud"
    with (
        small_disk(cloud_root / "data", "16m") as data,
        run_cloud(cloud_root, zmq={"edge_timeout": 1.0}) as cloud,
        cloud.client() as client,
    ):
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{cloud.config.zmq.ingest_port}")
        try:
            dealer.send_multipart(encode(Hello(edge=EDGE, run="r1", cameras=[CAMERA])))
            beat(dealer)
            written = settled_last_seen(cloud)  # the cloud answers a heartbeat before its write lands
            filler = fill(data)
            for _ in range(15):  # 3 s of heartbeats: three times the edge timeout
                beat(dealer)
                time.sleep(0.2)
            edge = client.get(f"/api/edges/{EDGE}").json()
            assert edge["online"] is True
            assert datetime.fromisoformat(edge["last_seen"]) > written + timedelta(seconds=2)
            assert [camera["online"] for camera in client.get("/api/cameras").json()] == [True]
            assert client.get("/api/stats").json()["edges_online"] == 1
            assert edge_last_seen(cloud) == written  # not one heartbeat could be written
            assert "database or disk is full" in cloud.log_text()

            time.sleep(1.5)  # silent for longer than the timeout: offline, full disk or not
            assert client.get(f"/api/edges/{EDGE}").json()["online"] is False
            filler.unlink()
        finally:
            context.destroy(linger=0)


def beat(dealer: zmq.Socket) -> None:
    """One heartbeat, and the cloud's answer to it."""
    dealer.send_multipart(encode(Heartbeat(sender=EDGE)))
    assert dealer.poll(WAIT * 1000), "no heartbeat answer"
    header, _ = decode(dealer.recv_multipart())
    assert isinstance(header, Heartbeat), header


def settled_last_seen(cloud: CloudServer) -> datetime:
    """The edge's last_seen once it has stopped changing (no write in flight)."""
    seen = edge_last_seen(cloud)
    for _ in range(int(WAIT / 0.2)):
        time.sleep(0.2)
        latest = edge_last_seen(cloud)
        if latest == seen:
            return seen
        seen = latest
    raise AssertionError(f"the edge's last_seen kept changing for {WAIT} s")


def edge_last_seen(cloud: CloudServer) -> datetime:
    """The edge's last_seen as the database holds it."""
    engine = make_engine(cloud.config.db_url)
    try:
        with session_factory(engine)() as session:
            return as_utc(session.get(EdgeRow, EDGE).last_seen)
    finally:
        engine.dispose()
