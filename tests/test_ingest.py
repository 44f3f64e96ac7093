"""The cloud ingest (ROUTER) and filter publisher (PUB) with real Storage on SQLite, driven by raw DEALER/SUB
sockets speaking common/protocol.py on loopback, plain and with CURVE and the ZAP allow-list."""

from __future__ import annotations

import itertools
import json
import logging
import math
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
import zmq
from fastapi.testclient import TestClient
from sqlalchemy import select
from support import wait_until
from zmq.utils.monitor import recv_monitor_message

from cloud.app import create_app, start_services
from cloud.config import CloudConfig, TokenConfig, ZmqConfig
from cloud.db import Counter, Edge, Event, Filter, FilterChange, StoredFrame, make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.ingest import Ingest
from cloud.publisher import Publisher
from cloud.sockets import HEADER_ROOM
from cloud.storage import Notification, Storage
from cloud.zap import NAMED_KEYS
from common.curve import create_keypair, load_public, make_client
from common.protocol import (
    JPEG_START,
    MAX_PAYLOAD_BYTES,
    PROTOCOL,
    TOPIC,
    Ack,
    Error,
    EventHeader,
    EventInfo,
    FilterUpdate,
    FragmentHeader,
    FrameHeader,
    Heartbeat,
    Hello,
    SnapshotEnd,
    SnapshotRequest,
    decode,
    encode,
)
from models.errors import FilterForwardError

EDGE, RUN, CAMERA = "edge-1", "run-1", "gate"
SIZE = (384, 224)
TIMEOUT = 10.0  # seconds; only keeps a broken test from hanging
PUBLISH_POLL = 0.1  # seconds: rows added here bypass the registry, so the publisher's safety-net poll finds them


def frame(seq: int, edge: str = EDGE, events: list[str] | None = None) -> FrameHeader:
    return FrameHeader(
        edge=edge,
        run=RUN,
        seq=seq,
        camera=CAMERA,
        frame=seq,
        timestamp=seq / 10,
        wall_time=1_700_000_000 + seq,
        scores={"red": 0.9},
        events=events or [],
    )


def stored_seqs(sessions: Any) -> list[int]:
    with sessions() as session:
        return sorted(session.scalars(select(StoredFrame.seq)))


class Keys:
    """The cloud's keypair and edge keypairs as `filterforward keys create` writes them; `allowed` is zmq.edge_keys."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.allowed = folder / "allowed"
        self.allowed.mkdir(parents=True)
        self.cloud_public, self.cloud_secret = create_keypair(folder, "cloud")

    def edge(self, name: str, allowed: bool = True) -> Path:
        public, secret = create_keypair(self.folder / "edges", name)
        if allowed:
            self.allow(public, name)
        return secret

    def allow(self, public: Path, edge: str) -> None:
        shutil.copy(public, self.allowed / f"{edge}.key")


class Client:
    """A raw edge: a DEALER speaking the wire protocol (CURVE client when given its keys)."""

    def __init__(self, context: zmq.Context, port: int, curve: tuple[Path, Path] | None = None) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        if curve is not None:
            make_client(self.socket, *curve)
        self.socket.connect(f"tcp://127.0.0.1:{port}")

    def send(self, header: Any, payload: bytes = b"") -> None:
        self.socket.send_multipart(encode(header, payload))

    def recv(self) -> tuple[Any, bytes]:
        assert self.socket.poll(TIMEOUT * 1000), "no reply from the ingest"
        return decode(self.socket.recv_multipart())

    def acked(self, count: int) -> list[int]:
        """The seqs of the next acks, until `count` of them came (duplicates included)."""
        seqs: list[int] = []
        while len(seqs) < count:
            header, _ = self.recv()
            assert isinstance(header, Ack), header
            seqs.extend(header.seqs)
        return seqs


class Cloud:
    """A real Ingest + Publisher + Storage on SQLite in `folder`; port 0 lets them pick free ones."""

    def __init__(self, folder: Path, keys: Keys | None = None, ingest_port: int = 0) -> None:
        zmq_config = ZmqConfig(
            bind="127.0.0.1",
            insecure=keys is None,
            secret_key=keys.cloud_secret if keys else None,
            edge_keys=keys.allowed if keys else None,
        ).model_copy(update={"ingest_port": ingest_port, "publish_port": 0})  # the schema has no 0: tests only
        config = CloudConfig(data_dir=folder, tokens=[TokenConfig(name="test", token="t" * 16)], zmq=zmq_config)
        self.keys = keys
        self.engine = make_engine(config.db_url)
        self.sessions = session_factory(self.engine)
        self.store = FrameStore(folder / "frames")
        self.storage = Storage(self.sessions, self.store)
        self.notified: list[Notification] = []
        self.ingest = Ingest(config, self.storage, self.sessions, notify=self.notified.append)
        self.publisher = Publisher(config.zmq, self.sessions, threading.Event(), poll=PUBLISH_POLL)
        self.context = zmq.Context()

    def start(self) -> None:
        self.ingest.start()
        self.publisher.start(self.ingest.context)

    def client(self, edge_secret: Path | None = None) -> Client:
        curve = (edge_secret, self.keys.cloud_public) if self.keys else None
        return Client(self.context, self.ingest.port, curve)

    def subscriber(self, edge_secret: Path | None = None) -> zmq.Socket:
        sub = self.context.socket(zmq.SUB)
        sub.linger = 0
        if self.keys:
            make_client(sub, edge_secret, self.keys.cloud_public)
        sub.subscribe(TOPIC)
        sub.connect(f"tcp://127.0.0.1:{self.publisher.port}")
        return sub

    def add(self, *rows: Any) -> None:
        with self.sessions.begin() as session:
            session.add_all(rows)

    def close(self) -> None:
        self.publisher.stop()
        self.ingest.stop()
        self.context.destroy(linger=0)
        self.engine.dispose()


@pytest.fixture
def make_cloud(tmp_path: Path) -> Iterator[Callable[..., Cloud]]:
    clouds: list[Cloud] = []

    def start(keys: Keys | None = None, before_start: Callable[[Cloud], None] | None = None) -> Cloud:
        cloud = Cloud(tmp_path / f"cloud-{len(clouds)}", keys)
        clouds.append(cloud)
        if before_start is not None:
            before_start(cloud)
        cloud.start()
        return cloud

    yield start
    for cloud in clouds:
        cloud.close()


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


def test_frame_is_stored_then_acked_and_ports_are_picked(make_cloud) -> None:
    cloud = make_cloud()
    assert cloud.ingest.port > 0 and cloud.publisher.port > 0
    client = cloud.client()
    client.send(frame(7), JPEG_START + b"jpeg bytes")
    assert client.acked(1) == [7]
    with cloud.sessions() as session:
        row = session.scalars(select(StoredFrame)).one()
    assert (row.edge_id, row.seq, row.camera) == (EDGE, 7, CAMERA)
    assert cloud.store.open_path(row.path).read_bytes() == JPEG_START + b"jpeg bytes"
    assert {name: cloud.ingest.counts[name] for name in ("received", "stored", "acked")} == {
        "received": 1,
        "stored": 1,
        "acked": 1,
    }


def test_same_seq_twice_is_stored_once_and_acked_twice(make_cloud) -> None:
    cloud = make_cloud()
    client = cloud.client()
    client.send(frame(3), JPEG_START + b"first")
    client.send(frame(3), JPEG_START + b"first")
    assert client.acked(2) == [3, 3]
    assert stored_seqs(cloud.sessions) == [3]
    assert (cloud.ingest.counts["stored"], cloud.ingest.counts["duplicates"]) == (1, 1)


def ended_before_start() -> dict:
    info = EventInfo(id="e", filter="red", camera=CAMERA, start_frame=10, start_time=1.0, end_frame=10, peak_score=0.9)
    header = EventHeader(edge=EDGE, run=RUN, seq=9, phase="end", wall_time=1_700_000_000, event=info)
    message = header.model_dump(mode="json")
    message["event"]["end_frame"] = 5
    return message


BAD_MESSAGES = {
    "garbage": [b"\x00\xff garbage", b"\x13\x37", b"more"],
    "one frame": [b"just one frame"],
    "bad JSON": [PROTOCOL, b"{not json", b""],
    "bad header": [PROTOCOL, b'{"type": "frame", "edge": "edge-1"}', b""],
    "cloud-only kind": encode(Ack(seqs=[1])),
    # JSON nested beyond the parser's depth raised RecursionError, which ended the ingest thread for good
    "nested JSON": [PROTOCOL, b"[" * 60_000, b""],
    "no JPEG": encode(frame(9), b"garbage"),  # stored, it was served as image/jpeg
    "ends before it starts": [PROTOCOL, json.dumps(ended_before_start()).encode(), b""],
    "nested fragment header": encode(
        FragmentHeader(edge=EDGE, run=RUN, seq=5, camera=CAMERA, wall_time=1_700_000_000),
        struct.pack(">I", 100_000) + b"[" * 100_000,
    ),
    **{
        f"{field} {value}": [PROTOCOL, json.dumps({**frame(9).model_dump(mode="json"), field: value}).encode(), b""]
        for field, value in [("seq", 2**63), ("wall_time", 1e20), ("frame", 2**70), ("scores", {"red": math.nan})]
    },
}


def saved_count(cloud: Cloud, name: str) -> int:
    with cloud.sessions() as session:
        row = session.get(Counter, name)
        return row.value if row else 0


def test_malformed_messages_are_counted_answered_and_ingest_goes_on(make_cloud) -> None:
    cloud = make_cloud()
    with socket.create_connection(("127.0.0.1", cloud.ingest.port)) as raw:  # not even ZMTP
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
    client = cloud.client()
    errors = []
    for frames in BAD_MESSAGES.values():
        client.socket.send_multipart(frames)
        header, _ = client.recv()
        assert isinstance(header, Error)
        errors.append(header.message)
    assert "expected 3 frames" in errors[1] and "not JSON" in errors[2] and "invalid header" in errors[3]
    assert "nested too deeply" in errors[5] and "nested too deeply" in errors[8]
    assert errors[6] == "malformed message, dropped: a 'frame' message's payload is no JPEG (it starts b'garbage')"
    assert errors[7].endswith("the event ends at frame 5, before it starts (10)")
    client.send(frame(1), JPEG_START + b"ok")
    assert client.acked(1) == [1]
    assert stored_seqs(cloud.sessions) == [1]
    assert cloud.ingest.counts["malformed"] == len(BAD_MESSAGES)
    wait_until(lambda: saved_count(cloud, "malformed") == len(BAD_MESSAGES), "the malformed count in the database")


def test_health_says_so_once_the_ingest_has_stopped(tmp_path: Path) -> None:
    """A message could end the ingest's thread (JSON nested too deeply): edges got no answer while /healthz said
    ok, so no health check or restart policy stepped in."""
    zmq_config = ZmqConfig(bind="127.0.0.1", insecure=True).model_copy(update={"ingest_port": 0, "publish_port": 0})
    config = CloudConfig(data_dir=tmp_path, tokens=[TokenConfig(name="test", token="t" * 16)], zmq=zmq_config)
    with ExitStack() as stack:
        services = start_services(config, stack)
        client = TestClient(create_app(config, services))
        assert client.get("/healthz").status_code == 200
        services.ingest._stop.set()  # its loop ends, as an exception out of it did
        services.ingest._thread.join()
        answer = client.get("/healthz")
        assert (answer.status_code, answer.json()["detail"]) == (503, "the ingest has stopped: see the service log")


def test_an_oversized_message_disconnects_its_sender_before_it_is_buffered(make_cloud) -> None:
    cloud = make_cloud()
    client = cloud.client()
    monitor = client.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    client.send(frame(1), b"\0" * (MAX_PAYLOAD_BYTES + HEADER_ROOM + 1))
    assert monitor.poll(TIMEOUT * 1000), "the sender of an oversized message was not disconnected"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    client.socket.disable_monitor()
    client.socket.close()
    assert stored_seqs(cloud.sessions) == []
    other = cloud.client()  # the ingest goes on for everyone else
    other.send(frame(2), JPEG_START + b"jpeg")
    assert other.acked(1) == [2]


def test_heartbeat_hello_and_event_notifications(make_cloud) -> None:
    cloud = make_cloud()
    client = cloud.client()
    client.send(Heartbeat(sender=EDGE))
    header, _ = client.recv()
    assert header == Heartbeat(sender=cloud.ingest.session_id)
    client.send(Hello(edge=EDGE, run=RUN, cameras=[CAMERA], filters_version=4))
    info = EventInfo(id="e1", filter="red", camera=CAMERA, start_frame=10, start_time=1.0, peak_score=0.9)
    client.send(EventHeader(edge=EDGE, run=RUN, seq=1, phase="start", wall_time=1_700_000_000, event=info))
    client.send(frame(2, events=["e1"]), JPEG_START + b"jpeg")
    assert sorted(client.acked(2)) == [1, 2]
    assert [(n.phase, n.event.uid) for n in cloud.notified] == [("start", f"{EDGE}/{RUN}/e1")]
    with cloud.sessions() as session:
        assert session.scalars(select(Event.start_notified)).one() is True
        edge = session.get(Edge, EDGE)
        assert (edge.run, edge.filters_version, edge.public_key) == (RUN, 4, None)


def test_two_processes_sending_as_one_edge_are_told_apart_from_a_reconnect(
    make_cloud, caplog: pytest.LogCaptureFixture
) -> None:
    cloud = make_cloud()

    def beat(client: Client, edge: str = EDGE) -> None:
        client.send(Heartbeat(sender=edge))
        assert isinstance(client.recv()[0], Heartbeat)  # handled in this order

    for _ in range(3):  # an edge that reconnects three times: each new connection replaces the last
        client = cloud.client()
        beat(client, "edge-reconnecting")
        beat(client, "edge-reconnecting")
        client.socket.close()
    first, second = cloud.client(), cloud.client()  # a copied config: two live processes, one edge id
    with caplog.at_level(logging.WARNING, logger="cloud.ingest"):
        for _ in range(4):
            beat(first)
            beat(second)
    assert cloud.ingest.last_heard.shared(EDGE)
    assert not cloud.ingest.last_heard.shared("edge-reconnecting")
    [warning] = [r.getMessage() for r in caplog.records if "two edge processes" in r.getMessage()]
    assert f"send as edge {EDGE}" in warning and "own edge_id and keypair" in warning


def test_a_message_that_fails_to_store_is_not_acked_and_its_resend_is(make_cloud) -> None:
    cloud = make_cloud()
    frames_dir = cloud.store.root / "frames"
    frames_dir.write_text("a file where the frames folder goes: every frame write fails")
    client = cloud.client()
    client.send(frame(1), JPEG_START + b"jpeg")
    client.send(Heartbeat(sender=EDGE))  # answered: the loop goes on
    header, _ = client.recv()
    assert isinstance(header, Heartbeat)
    assert cloud.ingest.counts["failed"] == 1 and cloud.ingest.counts["acked"] == 0
    frames_dir.unlink()
    client.send(frame(1), JPEG_START + b"jpeg")
    assert client.acked(1) == [1]
    assert stored_seqs(cloud.sessions) == [1]


def test_a_batch_with_a_duplicate_in_the_middle_stores_and_acks_them_all(make_cloud) -> None:
    cloud = make_cloud()
    client = cloud.client()
    client.send(frame(2), JPEG_START + b"two")
    assert client.acked(1) == [2]
    for seq in (1, 2, 3, 3):
        client.send(frame(seq), JPEG_START + b"jpeg")
    assert client.acked(4) == [1, 2, 3, 3]
    assert stored_seqs(cloud.sessions) == [1, 2, 3]
    assert (cloud.ingest.counts["stored"], cloud.ingest.counts["duplicates"]) == (3, 2)


def test_a_batch_acks_only_the_messages_it_stored(make_cloud) -> None:
    cloud = make_cloud()
    (cloud.store.root / "frames" / EDGE).mkdir(parents=True)
    (cloud.store.root / "frames" / EDGE / "blocked").write_text("a file where the camera's folder goes")
    client = cloud.client()
    client.send(frame(1), JPEG_START + b"one")
    client.send(frame(2).model_copy(update={"camera": "blocked"}), JPEG_START + b"two")
    client.send(frame(3), JPEG_START + b"three")
    client.send(Heartbeat(sender=EDGE))  # answered after the acks of its pass
    acked: list[int] = []
    while not isinstance(header := client.recv()[0], Heartbeat):
        assert isinstance(header, Ack), header
        acked += header.seqs
    assert acked == [1, 3]
    assert stored_seqs(cloud.sessions) == [1, 3]
    assert (cloud.ingest.counts["failed"], cloud.ingest.counts["acked"]) == (1, 2)


def test_curve_allowed_edge_is_stored_with_its_key(make_cloud, keys: Keys) -> None:
    secret = keys.edge(EDGE)
    cloud = make_cloud(keys)
    client = cloud.client(secret)
    client.send(Hello(edge=EDGE, run=RUN, cameras=[CAMERA]))
    client.send(frame(1), JPEG_START + b"jpeg")
    assert client.acked(1) == [1]
    with cloud.sessions() as session:
        assert session.get(Edge, EDGE).public_key == load_public(secret).decode()
    assert cloud.ingest.counts["unauthenticated"] == 0


def test_a_flood_of_unknown_keys_gives_a_few_log_lines_and_counter_writes(
    make_cloud, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    cloud = make_cloud(keys)
    writes = []
    sqlalchemy.event.listen(
        cloud.engine,
        "before_cursor_execute",
        lambda _conn, _cursor, sql, *_: (
            writes.append(sql) if sql.startswith(("UPDATE counters", "INSERT INTO counters")) else None
        ),
    )
    flood = 3 * NAMED_KEYS
    with caplog.at_level(logging.WARNING, logger="cloud.zap"):
        for _ in range(flood):
            socket = cloud.context.socket(zmq.DEALER)
            socket.linger = 0
            socket.curve_publickey, socket.curve_secretkey = zmq.curve_keypair()
            socket.curve_serverkey = load_public(keys.cloud_public)
            monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            socket.connect(f"tcp://127.0.0.1:{cloud.ingest.port}")
            assert monitor.poll(TIMEOUT * 1000), "no handshake failure seen"
            socket.disable_monitor()
            socket.close()
        wait_until(lambda: saved_count(cloud, "unauthenticated") == flood, "every refusal counted in the database")
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == NAMED_KEYS + 1  # the first keys by name, then one summary line
    assert "more edge connection(s)" in refusals[-1].getMessage()
    assert len(writes) < flood / 2  # aggregated: not one write per refused handshake


def test_curve_key_not_on_the_allow_list_is_refused_until_added(make_cloud, keys: Keys) -> None:
    secret = keys.edge("edge-2", allowed=False)
    cloud = make_cloud(keys)
    client = cloud.client(secret)
    monitor = client.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    client.send(frame(1, edge="edge-2"), JPEG_START + b"jpeg")
    assert monitor.poll(TIMEOUT * 1000), "no handshake failure seen"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert cloud.ingest.counts["unauthenticated"] >= 1 and cloud.ingest.counts["received"] == 0
    assert stored_seqs(cloud.sessions) == []
    wait_until(lambda: saved_count(cloud, "unauthenticated") >= 1, "the refusal count in the database")
    client.socket.disable_monitor()

    keys.allow(keys.folder / "edges" / "edge-2.key", "edge-2")  # no restart: the folder is re-read
    allowed = cloud.client(secret)
    allowed.send(frame(1, edge="edge-2"), JPEG_START + b"jpeg")
    assert allowed.acked(1) == [1]


def test_an_edge_whose_key_is_taken_off_the_allow_list_is_refused_on_its_open_connection(
    make_cloud, keys: Keys
) -> None:
    """Deleting an edge's key file refuses it at once (docs/deploy.md), not only once it reconnects: its messages
    are refused while the file is away (not for good: the edge keeps them) and taken again once it is back."""
    secret = keys.edge(EDGE)
    cloud = make_cloud(keys)
    client = cloud.client(secret)
    seqs = itertools.count(1)

    def answer() -> Any:
        client.send(frame(next(seqs)), JPEG_START + b"jpeg")
        return client.recv()[0]

    assert isinstance(answer(), Ack)
    allowed = keys.allowed / f"{EDGE}.key"
    away = allowed.rename(keys.folder / "revoked.key")
    wait_until(lambda: isinstance(answer(), Error), "a refusal on the open connection")
    stored = stored_seqs(cloud.sessions)
    refusal = answer()
    assert isinstance(refusal, Error) and refusal.seq is None  # not for good: the edge keeps it for later
    assert f"the key of edge '{EDGE}' is no longer in the cloud's allow-list" in refusal.message
    assert stored_seqs(cloud.sessions) == stored
    away.rename(allowed)
    wait_until(lambda: isinstance(answer(), Ack), "taken again once the key is back")


def test_curve_edge_naming_another_edge_is_refused(make_cloud, keys: Keys) -> None:
    secret = keys.edge(EDGE)
    keys.edge("edge-2")
    cloud = make_cloud(keys)
    client = cloud.client(secret)
    client.send(frame(1, edge="edge-2"), JPEG_START + b"jpeg")
    header, _ = client.recv()
    assert isinstance(header, Error) and "belongs to edge 'edge-1'" in header.message
    assert header.seq == 1  # for good: the edge drops it rather than resend it ahead of everything after it
    assert cloud.ingest.counts["unauthenticated"] == 1 and cloud.ingest.counts["acked"] == 0
    client.send(frame(2), JPEG_START + b"jpeg")  # its own id still works
    assert client.acked(1) == [2]
    assert stored_seqs(cloud.sessions) == [2]


def filter_rows(make_filter, name: str, revision: int) -> tuple[Filter, bytes]:
    spec, onnx = make_filter("full_frame", "late", SIZE, name=name)
    return Filter(name=name, spec=spec.model_dump(mode="json"), onnx=onnx, revision=revision), onnx


def test_snapshot_sends_every_filter_then_the_version(make_cloud, make_filter) -> None:
    cloud = make_cloud()
    client = cloud.client()
    client.send(SnapshotRequest(edge=EDGE))
    assert client.recv() == (SnapshotEnd(version=0), b"")

    red, red_onnx = filter_rows(make_filter, "red", revision=3)
    bus, bus_onnx = filter_rows(make_filter, "bus", revision=2)
    changes = [FilterChange(version=v, name=n, action="put") for v, n in ((1, "red"), (2, "bus"), (3, "red"))]
    cloud.add(red, bus, FilterChange(version=4, name="gone", action="delete"), *changes)
    client.send(SnapshotRequest(edge=EDGE))
    replies = [client.recv() for _ in range(3)]
    assert [(h.name, h.version, h.action, p) for h, p in replies[:2]] == [
        ("bus", 2, "put", bus_onnx),
        ("red", 3, "put", red_onnx),
    ]
    assert replies[0][0].spec.name == "bus"
    assert replies[2] == (SnapshotEnd(version=4), b"")
    assert cloud.ingest.counts["snapshots"] == 2


def test_filter_changes_are_published_in_order_over_curve(make_cloud, make_filter, keys: Keys) -> None:
    secret = keys.edge(EDGE)
    red, red_onnx = filter_rows(make_filter, "red", revision=1)
    cloud = make_cloud(keys, before_start=lambda c: c.add(red, FilterChange(version=1, name="red", action="put")))
    sub = cloud.subscriber(secret)
    version, deadline = 1, time.monotonic() + TIMEOUT
    while not sub.poll(200):  # a SUB misses what goes out before its subscription arrives: publish until one lands
        assert time.monotonic() < deadline, "no filter change published"
        version += 1
        cloud.add(FilterChange(version=version, name="red", action="put"))
    cloud.add(FilterChange(version=version + 1, name="red", action="delete"))
    updates = []
    while not updates or updates[-1][0].action != "delete":
        assert sub.poll(TIMEOUT * 1000), "filter change not published"
        topic, *message = sub.recv_multipart()
        assert topic == TOPIC
        updates.append(decode(message))
    first = updates[0][0].version
    assert first > 1  # the change from before the start is not published
    assert [header.version for header, _ in updates] == list(range(first, version + 2))
    assert all((h.action, h.name, p) == ("put", "red", red_onnx) for h, p in updates[:-1])
    assert updates[-1] == (FilterUpdate(version=version + 1, action="delete", name="red"), b"")
    wait_until(lambda: cloud.publisher.counts["published"] == version)  # versions 2..version+1: counted after sending


def test_stop_releases_the_ports(make_cloud) -> None:
    cloud = make_cloud()
    ports = cloud.ingest.port, cloud.publisher.port
    cloud.publisher.stop()
    cloud.ingest.stop()
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_start_refuses_a_missing_allow_list_and_a_busy_port(tmp_path: Path, keys: Keys) -> None:
    shutil.rmtree(keys.allowed)
    cloud = Cloud(tmp_path / "no-keys", keys)
    with pytest.raises(FilterForwardError, match=r"zmq\.edge_keys folder .* does not exist"):
        cloud.ingest.start()
    cloud.close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cloud = Cloud(tmp_path / "busy", ingest_port=busy.getsockname()[1])
        with pytest.raises(FilterForwardError, match=r"cannot bind zmq\.ingest_port"):
            cloud.ingest.start()
        cloud.close()
