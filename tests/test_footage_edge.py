"""Footage for the cloud's datasets, the edge's side: the recorder with a real link, uplink and spool, against a plain
ZeroMQ ROUTER that plays the cloud (decodes, answers heartbeats, stores each seq once and acknowledges it); and one
edge node end to end on a synthetic clip."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import onnx
import pytest
import zmq
from onnx import TensorProto, helper
from support import wait_until

from common.protocol import (
    Ack,
    FootageHeader,
    FootageRequest,
    FootageStatus,
    Heartbeat,
    Hello,
    SnapshotEnd,
    SnapshotRequest,
    decode,
    encode,
)
from edge.config import CloudLink, EdgeConfig, SpoolConfig
from edge.footage import BACKLOG, STATE_FILE, FootageRecorder
from edge.link import Link
from edge.node import EdgeNode
from edge.sink import MatchedFrame
from edge.sources import Frame
from edge.uplink import Uplink

EDGE = "edge-1"
CAMERAS = ["gate", "yard"]
FPS = 30.0
JPEG = cv2.imencode(".jpg", np.full((24, 32, 3), 90, np.uint8))[1].tobytes()


class Peer:
    """The cloud's end of the link: a ROUTER (and an idle PUB, for the filter sync) in its own thread. It stores each
    message with a seq once (by seq, as the cloud does) and acknowledges it unless `holding`; like the cloud, it sends
    each `ask`ed request after every heartbeat of the edge until the edge answers it; and `on_hello` after a Hello."""

    def __init__(self) -> None:
        context = zmq.Context.instance()
        self.router = context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.pub = context.socket(zmq.PUB)
        self.pub.linger = 0
        self.publish_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.stored: dict[int, tuple[Any, bytes]] = {}
        self.arrivals = 0  # stored messages received, resends included
        self.statuses: list[FootageStatus] = []
        self.heartbeats = 0
        self.holding = False
        self.on_hello: list[Any] = []
        self._held: list[int] = []
        self._asking: queue.SimpleQueue[FootageRequest] = queue.SimpleQueue()
        self._pending: dict[str, FootageRequest] = {}
        self._identity: bytes | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="peer", daemon=True)
        self._thread.start()

    def link(self) -> CloudLink:
        return CloudLink(
            address="127.0.0.1",
            ingest_port=self.port,
            publish_port=self.publish_port,
            insecure=True,
            heartbeat=0.1,
            timeout=5.0,
            window=8,
        )

    def ask(self, request: FootageRequest) -> None:
        self._asking.put(request)

    def footage(self) -> list[tuple[FootageHeader, bytes]]:
        """The footage messages stored, by seq."""
        return [self.stored[seq] for seq in sorted(self.stored) if isinstance(self.stored[seq][0], FootageHeader)]

    def done(self, request: str) -> FootageHeader | None:
        return next((h for h, _ in self.footage() if h.request == request and h.done), None)

    def status(self, request: str) -> FootageStatus | None:
        return next((s for s in reversed(self.statuses) if s.request == request), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.router.close()
        self.pub.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.router.poll(10):
                identity, *frames = self.router.recv_multipart()
                self._identity = identity
                self._handle(*decode(frames))
            while not self._asking.empty():
                request = self._asking.get()
                self._pending[request.request] = request
            if not self.holding and self._held:
                held, self._held = self._held, []
                self._reply(Ack(seqs=held))

    def _handle(self, header: Any, payload: bytes) -> None:
        if isinstance(header, Heartbeat):
            self.heartbeats += 1
            self._reply(Heartbeat(sender="peer-session"))
            for request in self._pending.values():
                self._reply(request)
        elif isinstance(header, Hello):
            for message in self.on_hello:
                self._reply(message)
        elif isinstance(header, SnapshotRequest):
            self._reply(SnapshotEnd(version=0))
        elif isinstance(header, FootageStatus):
            self._pending.pop(header.request, None)
            self.statuses.append(header)
        elif hasattr(header, "seq"):
            self.arrivals += 1
            self.stored.setdefault(header.seq, (header, payload))
            if self.holding:
                self._held.append(header.seq)
            else:
                self._reply(Ack(seqs=[header.seq]))

    def _reply(self, header: Any) -> None:
        self.router.send_multipart([self._identity, *encode(header)])


class Edge:
    """An edge's link, uplink and footage recorder on `folder`'s spool, as the edge node wires them."""

    def __init__(self, peer: Peer, folder: Path) -> None:
        self.link = Link(EDGE, CAMERAS, peer.link())
        self.uplink = Uplink(self.link, SpoolConfig(path=folder / "spool", max_bytes=2**30))
        self.recorder = FootageRecorder(self.link, self.uplink, folder / "spool" / "footage")
        self.link.start()

    def close(self) -> None:
        self.link.close()  # first: the link's thread reads the spool
        self.uplink.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    peer = Peer()
    yield peer
    peer.close()


def frame(index: int) -> Frame:
    """A small synthetic frame whose brightness says its index, at stream time index / FPS."""
    return Frame(index, index / FPS, np.full((24, 32, 3), (index * 5) % 250, np.uint8))


def request(name: str = "cars", camera: str = "gate", **fields: Any) -> FootageRequest:
    settings = {"every": 0.0, "duration": 10.0, "max_frames": 100, **fields}
    return FootageRequest(request=name, camera=camera, **settings)


def ask(peer: Peer, wanted: FootageRequest) -> FootageStatus:
    """Send a request and wait for the edge's answer to it."""
    before = len(peer.statuses)
    peer.ask(wanted)
    wait_until(lambda: any(s.request == wanted.request for s in peer.statuses[before:]), "the footage status")
    return peer.status(wanted.request)


def wait_done(peer: Peer, name: str = "cars") -> FootageHeader:
    wait_until(lambda: peer.done(name) is not None, f"the end of footage {name}")
    return peer.done(name)


def frames_of(peer: Peer, name: str = "cars") -> list[tuple[FootageHeader, bytes]]:
    return [(h, p) for h, p in peer.footage() if h.request == name and not h.done]


def state(folder: Path) -> dict[str, dict]:
    entries = json.loads((folder / "spool" / "footage" / STATE_FILE).read_text())["requests"]
    return {entry["request"]["request"]: entry for entry in entries}


@pytest.mark.parametrize(
    ("every", "duration", "max_frames", "kept"),
    [
        (0.2, 1.0, 100, [0, 6, 12, 18, 24]),  # one every 0.2 s until 1 s of stream time has passed
        (0.0, 0.5, 100, list(range(15))),  # every frame for 0.5 s
        (0.2, 10.0, 3, [0, 6, 12]),  # max_frames ends it first
    ],
)
def test_a_request_keeps_the_frames_it_asks_for_and_ends_with_their_count(
    peer: Peer, tmp_path: Path, every: float, duration: float, max_frames: int, kept: list[int]
) -> None:
    edge = Edge(peer, tmp_path)
    status = ask(peer, request(every=every, duration=duration, max_frames=max_frames))
    assert (status.edge, status.state, status.message) == (EDGE, "recording", "")
    first = 3  # recording starts at the first frame it sees
    for index in range(first, first + 60):
        edge.recorder.offer("gate", frame(index))
        edge.recorder.offer("yard", frame(1000 + index))  # another camera's frames are not footage of this one
    done = wait_done(peer)
    edge.close()

    frames = frames_of(peer)
    assert [h.number for h, _ in frames] == list(range(len(kept)))
    assert [h.frame for h, _ in frames] == [first + k for k in kept]
    assert [h.timestamp for h, _ in frames] == [(first + k) / FPS for k in kept]
    for header, payload in frames:
        assert (header.edge, header.camera, header.payload) == (EDGE, "gate", "jpeg")
        image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (24, 32, 3)
        assert abs(float(image.mean()) - (header.frame * 5) % 250) < 3  # the frame recorded under that number
    assert (done.done, done.frames, done.number, done.payload) == (True, len(kept), len(kept), "none")
    assert peer.stored[done.seq][1] == b""
    assert max(h.seq for h, _ in frames) < done.seq
    assert not (tmp_path / "spool" / "footage" / "cars").exists()  # spooled: the spool owns delivery now
    assert state(tmp_path)["cars"]["status"] == "sent"
    assert edge.uplink.stats()["footage_spooled"] == len(kept)
    assert edge.recorder.stats() == {"footage_recording": 0, "footage_recorded": len(kept), "footage_waiting": 0}


def test_a_repeated_request_is_recorded_once_also_after_a_restart(peer: Peer, tmp_path: Path) -> None:
    edge = Edge(peer, tmp_path)
    wanted = request(max_frames=4)
    assert ask(peer, wanted).state == "recording"
    assert ask(peer, wanted).state == "recording"  # the cloud resends until it hears a status
    for index in range(10):
        edge.recorder.offer("gate", frame(index))
    wait_done(peer)
    assert ask(peer, wanted).state == "recording"
    edge.close()

    again = Edge(peer, tmp_path)
    assert ask(peer, wanted).state == "recording"
    for index in range(10):
        again.recorder.offer("gate", frame(index))
    assert again.recorder.stats() == {"footage_recording": 0, "footage_recorded": 0, "footage_waiting": 0}
    again.close()
    assert [h.number for h, _ in frames_of(peer)] == [0, 1, 2, 3]
    assert len([h for h, _ in peer.footage() if h.done]) == 1


def test_a_camera_that_is_not_on_the_edge_is_refused_in_one_clear_line(peer: Peer, tmp_path: Path) -> None:
    edge = Edge(peer, tmp_path)
    status = ask(peer, request(name="doors", camera="door"))
    edge.recorder.offer("door", frame(0))
    edge.close()
    assert (status.state, status.message) == ("refused", "camera door is not on edge edge-1: it has gate, yard")
    assert "doors" not in state(tmp_path) and not (tmp_path / "spool" / "footage" / "doors").exists()
    assert peer.footage() == []


def test_footage_waits_while_matched_frames_wait_in_the_spool(peer: Peer, tmp_path: Path) -> None:
    peer.holding = True  # the cloud does not acknowledge yet: the matched frames stay spooled
    edge = Edge(peer, tmp_path)
    for index in range(BACKLOG + 2):
        edge.uplink.frame(MatchedFrame("gate", index, index / FPS, time.time(), {"red": 0.9}, [], JPEG))
    ask(peer, request(max_frames=5))
    for index in range(5):
        edge.recorder.offer("gate", frame(index))
    wait_until(lambda: len(peer.stored) == BACKLOG + 2, "the matched frames")
    beats = peer.heartbeats
    wait_until(lambda: peer.heartbeats >= beats + 3, "a few passes of the link")  # each pass pumps the recorder
    assert peer.footage() == [] and edge.recorder.waiting() == 6  # 5 frames and the done message
    assert edge.uplink.spool.messages == BACKLOG + 2

    peer.holding = False
    done = wait_done(peer)
    edge.close()
    matched = [seq for seq, (header, _) in peer.stored.items() if not isinstance(header, FootageHeader)]
    footage = [header.seq for header, _ in peer.footage()]
    assert len(footage) == 6 and min(footage) > max(matched) and done.frames == 5


def test_a_restart_mid_send_repeats_nothing_and_loses_nothing(peer: Peer, tmp_path: Path) -> None:
    peer.holding = True  # only BACKLOG footage messages get spooled, then the edge stops
    edge = Edge(peer, tmp_path)
    ask(peer, request(max_frames=10))
    for index in range(10):
        edge.recorder.offer("gate", frame(index))
    wait_until(lambda: len(peer.footage()) == BACKLOG, "the first footage messages")
    beats = peer.heartbeats
    wait_until(lambda: peer.heartbeats >= beats + 3, "a few passes of the link")
    assert len(peer.footage()) == BACKLOG and edge.recorder.waiting() == 10 - BACKLOG + 1
    edge.close()
    before = {h.number: h.seq for h, _ in peer.footage()}
    folder = tmp_path / "spool" / "footage" / "cars"
    left = sorted(int(p.stem) for p in folder.glob("*.jpg"))
    assert left == list(range(BACKLOG, 10))  # spooled files are gone: the spool owns them
    (folder / "0.jpg").write_bytes(JPEG)  # as if killed after spooling frame 0 and before removing its file

    peer.holding = False
    again = Edge(peer, tmp_path)
    done = wait_done(peer)
    wait_until(lambda: again.uplink.spool.messages == 0, "every message acknowledged")
    again.close()
    frames = frames_of(peer)
    assert [h.number for h, _ in frames] == list(range(10))  # each once, in order
    assert {h.number: h.seq for h, _ in frames if h.number < BACKLOG} == before  # resent by the spool, same seqs
    assert [h.frame for h, _ in frames] == list(range(10)) and done.frames == 10
    assert peer.arrivals >= len(peer.stored)  # unacknowledged messages may arrive twice; stored once by seq
    assert not folder.exists()


def test_a_restart_while_recording_ends_the_recording_with_the_frames_it_has(peer: Peer, tmp_path: Path) -> None:
    edge = Edge(peer, tmp_path)
    ask(peer, request(every=0.1, duration=60.0))
    for index in range(15):
        edge.recorder.offer("gate", frame(index))
    edge.close()
    assert state(tmp_path)["cars"]["status"] == "recording"

    again = Edge(peer, tmp_path)
    done = wait_done(peer)
    again.recorder.offer("gate", frame(15))  # the recording is over: nothing more is kept
    again.close()
    assert [h.frame for h, _ in frames_of(peer)] == [0, 3, 6, 9, 12]
    assert done.frames == 5 and again.recorder.counts["recorded"] == 0


def write_base(path: Path) -> Path:
    """A tiny ONNX base model (uint8 NHWC in, one stride-32 tap out): the node runs without the real base DNN."""
    nodes = [
        helper.make_node("Cast", ["image"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["xf"], ["x"], perm=[0, 3, 1, 2]),
        helper.make_node("MaxPool", ["x"], ["coarse"], kernel_shape=[32, 32], strides=[32, 32]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-base",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, ["n", "h", "w", 3])],
        [helper.make_tensor_value_info("coarse", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def write_clip(path: Path, count: int, fps: int) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for index in range(count):
            image = np.full((48, 64, 3), (index * 8) % 250, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))
    return path


def test_an_edge_node_records_its_camera_and_sends_the_footage(peer: Peer, tmp_path: Path) -> None:
    peer.on_hello = [request(every=0.5, duration=2.0, max_frames=100)]  # before the snapshot: before any frame
    config = EdgeConfig(
        base_model=write_base(tmp_path / "base.onnx"),
        input_size=(64, 64),
        cameras=[{"name": "gate", "source": str(write_clip(tmp_path / "gate.mp4", 30, 10)), "pacing": "every-frame"}],
        cloud=peer.link(),
        spool={"path": tmp_path / "spool"},
    )
    node = EdgeNode(config)
    node.run()  # the clip ends, the node drains: the footage goes before it returns

    done = peer.done("cars")
    assert done is not None and done.frames == 4
    frames = frames_of(peer)
    assert [h.frame for h, _ in frames] == [0, 5, 10, 15] and [h.number for h, _ in frames] == [0, 1, 2, 3]
    assert all(cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR).shape == (48, 64, 3) for _, p in frames)
    assert node.footage is not None and node.footage.stats()["footage_recorded"] == 4
