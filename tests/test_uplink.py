"""The link and the uplink against a real cloud ingest, publisher and storage (SQLite in tmp_path), on loopback,
plain and with CURVE."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from sqlalchemy import func, select
from support import free_port, wait_until

import edge.link
from cloud.config import CloudConfig, TokenConfig, ZmqConfig
from cloud.db import Camera, Edge, EventFrame, StoredFrame, make_engine, session_factory
from cloud.db import Event as EventRow
from cloud.framestore import FrameStore
from cloud.ingest import Ingest
from cloud.publisher import Publisher
from cloud.storage import Storage
from common.curve import create_keypair
from common.protocol import Stats, decode
from edge.config import CloudLink, SpoolConfig, load_edge_config
from edge.link import Link
from edge.metrics import EdgeCollector
from edge.sink import MatchedFrame
from edge.uplink import Uplink
from models.errors import FilterForwardError
from models.smoother import Event

EDGE = "edge-1"
JPEG = cv2.imencode(".jpg", np.full((48, 64, 3), 200, np.uint8))[1].tobytes()
PUBLISH_POLL = 3600.0  # the publisher's safety-net poll never fires in a test: only the registry's wake-up publishes


class Keys:
    """CURVE keypairs as `filterforward keys create` writes them: the cloud's, and edges' (allowed or not)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.allowed = folder / "allowed"
        self.allowed.mkdir(parents=True)
        _, self.cloud_secret = create_keypair(folder / "cloud", "cloud")
        self.cloud_public = folder / "cloud" / "cloud.key"

    def edge(self, name: str, allowed: bool = True) -> Path:
        """The edge's .key_secret file; its public key goes on the cloud's allow-list when `allowed`."""
        public, secret = create_keypair(self.folder / "edges", name)
        if allowed:
            shutil.copy(public, self.allowed / public.name)
        return secret


class Cloud:
    """The cloud's ingest (ROUTER), publisher (PUB) and storage on SQLite in `folder`; stop() and start() keep
    ports and DB. `filters_changed` is the event a registry sets after each change, as in the service."""

    def __init__(self, folder: Path, keys: Keys | None = None, bind: str = "127.0.0.1"):
        zmq_config = ZmqConfig(
            bind=bind,
            ingest_port=free_port(),
            publish_port=free_port(),
            insecure=keys is None,
            secret_key=keys.cloud_secret if keys else None,
            edge_keys=keys.allowed if keys else None,
            heartbeat=0.2,
        )
        self.config = CloudConfig(data_dir=folder, tokens=[TokenConfig(name="test", token="t" * 16)], zmq=zmq_config)
        self.keys = keys
        self.sessions = session_factory(make_engine(self.config.db_url))
        self.filters_changed = threading.Event()
        self.ingest: Ingest | None = None
        self.publisher: Publisher | None = None

    def start(self) -> None:
        storage = Storage(self.sessions, FrameStore(self.config.data_dir / "store"))
        self.ingest = Ingest(self.config, storage, self.sessions, notify=lambda _notification: None)
        self.ingest.start()
        self.publisher = Publisher(self.config.zmq, self.sessions, self.filters_changed, poll=PUBLISH_POLL)
        self.publisher.start(self.ingest.context)

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
            self.publisher = None
        if self.ingest is not None:
            self.ingest.stop()
            self.ingest = None

    def link(self, secret_key: Path | None = None, **fields: object) -> CloudLink:
        """How an edge reaches this cloud (CURVE with `secret_key` when the cloud has keys)."""
        keys = {"server_key": self.keys.cloud_public, "secret_key": secret_key} if self.keys else {"insecure": True}
        settings = {"address": self.config.zmq.bind, "heartbeat": 0.2, "timeout": 1.0, "window": 8, **keys, **fields}
        return CloudLink(
            ingest_port=self.config.zmq.ingest_port,
            publish_port=self.config.zmq.publish_port,
            **settings,
        )

    def stored_seqs(self, edge: str = EDGE) -> list[int]:
        with self.sessions() as session:
            return list(session.scalars(select(StoredFrame.seq).where(StoredFrame.edge_id == edge)))


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    cloud = Cloud(tmp_path / "cloud")
    cloud.start()
    yield cloud
    cloud.stop()


@pytest.fixture
def curve_cloud(tmp_path: Path) -> Iterator[Cloud]:
    cloud = Cloud(tmp_path / "cloud", Keys(tmp_path / "keys"))
    cloud.start()
    yield cloud
    cloud.stop()


def make_uplink(config: CloudLink, folder: Path, max_bytes: int = 2**30, edge_id: str = EDGE) -> tuple[Link, Uplink]:
    """An edge's link to the cloud and its uplink, as the edge node wires them."""
    link = Link(edge_id, ["gate"], config)
    return link, Uplink(link, SpoolConfig(path=folder / "spool", max_bytes=max_bytes))


def close(link: Link, uplink: Uplink) -> None:
    link.close()  # first: the link's thread reads the uplink's spool
    uplink.close()


def send_frames(uplink: Uplink, count: int, start: int = 0, events: list[str] | None = None) -> None:
    for index in range(start, start + count):
        uplink.frame(MatchedFrame("gate", index, index / 10, time.time(), {"red": 0.9}, events or [], JPEG))


def test_frames_and_events_arrive_once_and_are_acknowledged(cloud: Cloud, tmp_path: Path) -> None:
    link, uplink = make_uplink(cloud.link(), tmp_path)
    link.start()
    event = Event("gate/red/0", "red", "gate", 0, 0.0, None, None, 0.9, peak_frame=0)
    uplink.event("start", event)
    send_frames(uplink, 20, events=[event.id])
    uplink.event("end", replace(event, end_frame=19, end_time=1.9))
    assert uplink.wait_drained(30)
    wait_until(lambda: uplink.counts["acked"] == 22)
    assert uplink.spool.messages == 0 and uplink.spool.bytes == 0 and uplink.in_flight == 0
    assert link.connected
    close(link, uplink)

    seqs = cloud.stored_seqs()
    assert len(seqs) == len(set(seqs)) == 20
    with cloud.sessions() as session:
        row = session.scalar(select(EventRow).where(EventRow.uid == f"{EDGE}/{link.run}/{event.id}"))
        assert row is not None and row.end_frame == 19 and row.ended_at is not None
        assert session.scalar(select(func.count()).select_from(EventFrame)) == 20
        edge = session.get(Edge, EDGE)
        assert edge is not None and edge.run == link.run  # the Hello got there


@pytest.mark.parametrize("address", ["::1", "[::1]"])
def test_an_edge_reaches_a_cloud_over_ipv6(tmp_path: Path, address: str) -> None:
    """An IPv6 address made no endpoint (tcp://::1:5555) and ZeroMQ's sockets had IPv6 off: the cloud failed to
    bind with "pick a free port", and the edge refused ::1 as "not a host"."""
    cloud = Cloud(tmp_path / "cloud", bind="::1")
    cloud.start()
    try:
        link, uplink = make_uplink(cloud.link(address=address), tmp_path)
        assert link.config.address == "::1"
        link.start()
        send_frames(uplink, 3)
        assert uplink.wait_drained(30)
        close(link, uplink)
        assert len(cloud.stored_seqs()) == 3
    finally:
        cloud.stop()


def test_a_zmq_bind_address_this_machine_lacks_says_so(tmp_path: Path) -> None:
    cloud = Cloud(tmp_path / "cloud", bind="192.0.2.1")  # TEST-NET-1: no machine has it
    with pytest.raises(FilterForwardError, match=r"set zmq.bind to an address of this machine"):
        cloud.start()
    cloud.stop()


def test_curve_link_delivers_and_an_unknown_key_is_refused_in_one_clear_line(
    curve_cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = curve_cloud.keys
    link, uplink = make_uplink(curve_cloud.link(keys.edge(EDGE)), tmp_path / "good")
    link.start()
    send_frames(uplink, 5)
    assert uplink.wait_drained(30)
    close(link, uplink)
    assert len(curve_cloud.stored_seqs()) == 5

    stranger_key = keys.edge("stranger", allowed=False)
    stranger_link, stranger = make_uplink(curve_cloud.link(stranger_key), tmp_path / "stranger")
    with caplog.at_level("ERROR", logger="edge.link"):
        stranger_link.start()
        send_frames(stranger, 3, start=100)
        wait_until(lambda: "refused this edge's key" in caplog.text)
        refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    close(stranger_link, stranger)
    public = stranger_key.with_suffix(".key")
    assert refusals == [
        f"cloud at tcp://127.0.0.1:{curve_cloud.config.zmq.ingest_port} refused this edge's key: "
        f"add {public} to the cloud's zmq.edge_keys folder"
    ]
    assert not stranger_link.connected and stranger.spool.messages == 3  # kept for when the key is allowed
    assert len(curve_cloud.stored_seqs()) == 5


def test_an_edge_whose_key_is_allowed_later_connects_without_a_restart(
    curve_cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZeroMQ gives up on a connection the cloud's authenticator refused: the edge tries again on a new socket, so
    adding its key to the allow-list (as the refusal's log line says) is enough; before, only a restart was."""
    monkeypatch.setattr(edge.link, "REFUSED_RETRY", 0.5)
    keys = curve_cloud.keys
    late_key = keys.edge("late", allowed=False)
    link, late = make_uplink(curve_cloud.link(late_key), tmp_path, edge_id="late")
    with caplog.at_level("ERROR", logger="edge.link"):
        link.start()
        send_frames(late, 3)
        wait_until(lambda: "refused this edge's key" in caplog.text)
        time.sleep(1.5)  # refused on a few new sockets too
        shutil.copy(late_key.with_suffix(".key"), keys.allowed / "late.key")
        assert late.wait_drained(30)
    close(link, late)
    assert len(curve_cloud.stored_seqs("late")) == 3
    assert sum("refused this edge's key" in record.getMessage() for record in caplog.records) == 1  # one episode


def test_a_wrong_cloud_key_or_a_plain_edge_fails_the_handshake_in_one_clear_line(
    curve_cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, impostor_secret = create_keypair(tmp_path / "other", "not-the-cloud")
    wrong_server = {"server_key": impostor_secret.with_suffix(".key")}
    for name, fields in [("wrong-server", wrong_server), ("plain", {"insecure": True})]:
        caplog.clear()
        link, uplink = make_uplink(curve_cloud.link(curve_cloud.keys.edge(name), **fields), tmp_path / name)
        with caplog.at_level("ERROR", logger="edge.link"):
            link.start()
            send_frames(uplink, 2)
            wait_until(lambda: "handshake with the cloud" in caplog.text)
            close(link, uplink)
        assert "check that cloud.server_key is the cloud's public key" in caplog.text
        assert len(caplog.records) == 1 and uplink.spool.messages == 2
    assert curve_cloud.stored_seqs() == []


def test_another_edge_s_key_gets_its_messages_refused_and_logged_once(
    curve_cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = curve_cloud.keys.edge(EDGE)
    link, impostor = make_uplink(curve_cloud.link(secret), tmp_path, edge_id="edge-2")
    with caplog.at_level("WARNING", logger="edge.link"):
        link.start()
        send_frames(impostor, 3)
        wait_until(lambda: link.refused >= 6 and impostor.counts["refused"] == 3)  # hello, heartbeats, frames
        close(link, impostor)
    # The edge's own metrics show it (the cloud answers, so cloud_reachable is 1 all along; an operator saw nothing).
    metrics = {m.name: m.samples[0].value for m in EdgeCollector(EDGE, dict, impostor.stats).collect() if m.samples}
    assert metrics["filterforward_edge_uplink_cloud_refusals"] == link.refused
    assert metrics["filterforward_edge_uplink_refused"] == 3
    refusals = [r.getMessage() for r in caplog.records if "refused a message" in r.getMessage()]
    assert len(refusals) == 1 and "key belongs to edge 'edge-1'" in refusals[0]
    assert curve_cloud.stored_seqs("edge-2") == curve_cloud.stored_seqs() == []
    # Their headers name edge-2, so the cloud will never take them: dropped, where resent for ever they held back
    # everything spooled after them. The edge_id corrected, the same spool's new messages get through.
    assert impostor.spool.messages == 0
    link, corrected = make_uplink(curve_cloud.link(secret), tmp_path)
    link.start()
    send_frames(corrected, 2, start=3)
    assert corrected.wait_drained(30)
    close(link, corrected)
    assert len(curve_cloud.stored_seqs(EDGE)) == 2


def test_cloud_down_mid_stream_then_back_stores_every_message_exactly_once(
    cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    window = 4
    link, uplink = make_uplink(cloud.link(window=window), tmp_path)
    first = uplink.spool.last_seq + 1
    in_flight: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            in_flight.append(uplink.in_flight)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    caplog.set_level("INFO", logger="edge.link")
    link.start()
    send_frames(uplink, 60)
    wait_until(lambda: uplink.counts["acked"] >= 20)
    cloud.stop()  # mid-stream: some sent, some in flight, most still spooled
    wait_until(lambda: not link.connected)
    send_frames(uplink, 60, start=60)  # spooled while the cloud is away
    cloud.start()  # a new process's ingest: same ports, same database
    assert uplink.wait_drained(60)
    done.set()
    watcher.join()
    close(link, uplink)

    seqs = cloud.stored_seqs()
    assert sorted(seqs) == list(range(first, first + 120))  # every one, once
    assert max(in_flight) <= window
    assert "unreachable since" in caplog.text
    assert "reachable again" in caplog.text or "restarted" in caplog.text


def test_unacknowledged_messages_are_resent_by_the_next_edge_process(cloud: Cloud, tmp_path: Path) -> None:
    cloud.stop()
    before_link, before = make_uplink(cloud.link(), tmp_path)
    before_link.start()
    send_frames(before, 10)
    close(before_link, before)  # the cloud never saw them
    cloud.start()
    after_link, after = make_uplink(cloud.link(), tmp_path)
    assert after.spool.messages == 10 and after_link.run != before_link.run
    after_link.start()
    send_frames(after, 2, start=10)
    assert after.wait_drained(30)
    close(after_link, after)
    with cloud.sessions() as session:
        runs = list(session.scalars(select(StoredFrame.run).order_by(StoredFrame.seq)))
    assert runs == [before_link.run] * 10 + [after_link.run] * 2  # resent as spooled, byte for byte


def test_stats_reach_the_cloud_and_a_full_spool_says_what_it_dropped(
    cloud: Cloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    link, uplink = make_uplink(cloud.link(), tmp_path)
    link.start()
    wait_until(lambda: link.connected)
    cameras = {"gate": {"fps": 12.5, "frames": 40, "online": True}}
    link.post(Stats(edge=EDGE, cameras=cameras, uplink={**uplink.stats(), "filter_errors": 0}))

    def stored_stats() -> tuple[dict, dict] | None:
        with cloud.sessions() as session:
            edge, camera = session.get(Edge, EDGE), session.get(Camera, (EDGE, "gate"))
            return (edge.stats, camera.stats) if edge and camera and edge.stats else None

    wait_until(lambda: stored_stats() is not None)
    edge_stats, camera_stats = stored_stats()
    assert camera_stats == {"fps": 12.5, "frames": 40, "online": True}
    assert edge_stats["connected"] is True and edge_stats["filter_errors"] == 0
    assert {
        "spool_messages",
        "spool_bytes",
        "spool_dropped",
        "in_flight",
        "sent_messages",
        "sent_bytes",
        "acked",
    } <= set(edge_stats)
    close(link, uplink)

    cloud.stop()
    small_link, small = make_uplink(cloud.link(), tmp_path / "small", max_bytes=5 * len(JPEG))
    event = Event("gate/red/0", "red", "gate", 0, 0.0, None, None, 0.9, peak_frame=0)
    with caplog.at_level("WARNING", logger="edge.spool"):
        small.event("start", event)
        send_frames(small, 5, events=[event.id])
        small.event("end", replace(event, end_frame=4, end_time=0.4))
        send_frames(small, 10, start=5)
    assert small.stats()["spool_dropped"] > 0 and small.spool.bytes <= 5 * len(JPEG)
    assert "dropped the" in caplog.text
    # The event's start and end outlive the older frames: events are dropped last.
    kinds = [decode(frames)[0].type for _, frames in small.spool.after(0, 100)]
    assert kinds[:2] == ["event", "event"] and kinds.count("frame") == small.spool.messages - 2
    close(small_link, small)


def test_cloud_and_spool_config_sections(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    cloud = {"address": "cloud.example", "server_key": "keys/cloud.key", "secret_key": "keys/edge-1.key_secret"}
    config = {"cameras": [{"name": "gate", "source": "0"}], "cloud": cloud, "spool": {"max_bytes": 1000}}
    path.write_text(yaml.safe_dump(config))
    loaded = load_edge_config(path)
    assert loaded.cloud.server_key == tmp_path / "keys" / "cloud.key"  # relative to the config file
    assert loaded.spool.path == tmp_path / "spool" and loaded.spool.max_bytes == 1000
    assert loaded.cloud.endpoint(loaded.cloud.ingest_port) == "tcp://cloud.example:5555"
    assert loaded.cloud.window == 64 and not loaded.cloud.insecure

    config["cloud"] = {"address": "cloud.example"}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(FilterForwardError, match=r"cloud: .*set cloud.server_key and cloud.secret_key"):
        load_edge_config(path)
    config["cloud"] = {"address": "cloud.example", "insecure": True, "windo": 3}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(FilterForwardError, match=r"cloud.windo: unknown key \(did you mean window\?\); the keys"):
        load_edge_config(path)


@pytest.mark.parametrize("address", ["tcp://cloud.example", "cloud.example:5555", "cloud.example/"])
def test_a_cloud_address_that_is_not_a_host_is_refused(tmp_path: Path, address: str) -> None:
    path = tmp_path / "edge.yaml"
    cloud = {"address": address, "insecure": True}
    path.write_text(yaml.safe_dump({"edge_id": EDGE, "cameras": [{"name": "gate", "source": "x.mp4"}], "cloud": cloud}))
    with pytest.raises(FilterForwardError) as refused:
        load_edge_config(path)
    assert f"cloud.address: '{address}' is not a host: give the cloud's host name or IP address alone" in str(
        refused.value
    )


def test_the_cloud_s_secret_key_file_as_its_server_key_is_refused(tmp_path: Path) -> None:
    """Only the cloud's public key belongs on an edge: its secret one would let the edge pose as the cloud."""
    _, cloud_secret = create_keypair(tmp_path, "cloud")
    _, edge_secret = create_keypair(tmp_path, EDGE)
    link = CloudLink(address="127.0.0.1", server_key=cloud_secret, secret_key=edge_secret)
    with pytest.raises(FilterForwardError, match=r"cloud\.key_secret holds a secret key: give the public \.key file"):
        Link(EDGE, ["gate"], link)


def test_missing_key_files_fail_at_start_in_one_line(tmp_path: Path) -> None:
    link = CloudLink(address="127.0.0.1", server_key=tmp_path / "cloud.key", secret_key=tmp_path / "edge.key_secret")
    with pytest.raises(FilterForwardError, match="does not exist: create it with `filterforward keys create`"):
        make_uplink(link, tmp_path)
