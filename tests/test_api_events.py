"""Events, frames, clips, edges, stats and metrics over REST, against a real `filterforward cloud serve` process.

The data goes in the way the ingest puts it: through cloud.storage.Storage, into the server's own database
and frame store (SQLite and PostgreSQL).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import av
import cv2
import numpy as np
import pytest
from cloud_server import READ_ONLY, CloudServer, run_cloud_on
from sqlalchemy import update

from cloud.clips import encode_clip
from cloud.db import Edge, StoredFrame, make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.storage import Message, Storage
from common.fragment import Fragment as StreamFragment
from common.fragment import FragmentHeader as StreamHeader
from common.fragment import FrameEntry, pack
from common.protocol import EventHeader, EventInfo, FragmentHeader, FrameHeader, Hello, Stats

EDGE, RUN = "edge-1", "run-1"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()
NEWEST_FIRST = ["e8", "e7", "e6", "e5", "e4", "e3", "e2", "e1"]  # e3 and e4 start together: higher id first


def jpeg(shade: int, size: tuple[int, int] = (65, 47)) -> bytes:
    """A real JPEG (odd size on purpose: clips must still get even dimensions)."""
    width, height = size
    image = np.full((height, width, 3), shade, np.uint8)
    cv2.putText(image, str(shade), (2, height - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 1)
    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return data.tobytes()


@dataclass
class Feed:
    """Writes what an edge would send through the server's Storage, keeping count of what it wrote."""

    storage: Storage
    seq: int = 0
    jpegs: dict[str, list[bytes]] = field(default_factory=dict)  # event id -> its JPEGs in order
    stored_bytes: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def event(
        self,
        event_id: str,
        camera: str,
        filter_name: str,
        start: float,
        frames: int = 3,
        payload: str = "jpeg",
        end: bool = True,
        clip: bytes = b"",
        first_frame: int = 100,
    ) -> None:
        info = EventInfo(
            id=event_id, filter=filter_name, camera=camera, start_frame=100, start_time=10.0, peak_score=0.9
        )
        self.storage.store_event(EDGE, self._event_header("start", start, info), b"")
        for index in range(frames):
            data = jpeg(40 + 20 * index) if payload == "jpeg" else b""
            header = FrameHeader(
                edge=EDGE,
                run=RUN,
                seq=self.next_seq(),
                camera=camera,
                frame=first_frame + index,
                timestamp=10.0 + index / 10,
                wall_time=start + index / 10,
                scores={filter_name: 0.8 + index / 100},
                events=[event_id],
                payload="jpeg" if data else "none",
            )
            self.storage.store_frame(EDGE, header, data)
            if data:
                self.jpegs.setdefault(event_id, []).append(data)
                self.stored_bytes += len(data)
        if end:
            ended = info.model_copy(update={"end_frame": 100 + frames, "end_time": 10.0 + frames / 10})
            header = self._event_header("end", start + frames / 10, ended, "mp4" if clip else "none")
            self.storage.store_event(EDGE, header, clip)
            self.stored_bytes += len(clip)

    def fragment(self, camera: str, *frames: int) -> None:
        """A stream fragment (the default `stream` encoding's payload) holding these frames' pictures."""
        entries = [FrameEntry(index=index, time=index / 10, keyframe=n == 0, size=3) for n, index in enumerate(frames)]
        header = StreamHeader(gop=0, width=64, height=48, fps="10/1", frames=entries)
        payload = pack(StreamFragment(header, (b"h26",) * len(entries)))
        message = FragmentHeader(edge=EDGE, run=RUN, seq=self.next_seq(), camera=camera, wall_time=T0)
        self.storage.store_many([Message(EDGE, message, payload)])
        self.stored_bytes += len(payload)

    def _event_header(self, phase: str, wall: float, info: EventInfo, payload: str = "none") -> EventHeader:
        return EventHeader(
            edge=EDGE, run=RUN, seq=self.next_seq(), phase=phase, wall_time=wall, event=info, payload=payload
        )


@dataclass
class Scene:
    server: CloudServer
    feed: Feed
    clip: bytes


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def scene(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """A server whose database holds one edge with two cameras and eight events of two filters."""
    root = tmp_path_factory.mktemp(f"events-{request.param}")
    settings: dict[str, Any] = {"zmq": {"edge_timeout": 3600}}  # "online" must not depend on test speed
    with run_cloud_on(request.param, root, **settings) as server:
        yield populate(server)


def populate(server: CloudServer) -> Scene:
    config = server.config
    engine = make_engine(config.db_url)
    storage = Storage(session_factory(engine), FrameStore(config.data_dir / "frames"))
    storage.edge_hello(EDGE, Hello(edge=EDGE, run=RUN, cameras=["cam-a", "cam-b"], filters_version=4), None)
    camera_stats = {"fps": 12.0, "base_ms": 30.5, "mc_ms": 1.5, "frames": 240, "matched": 9, "bytes_out": 9000}
    storage.edge_stats(
        EDGE,
        Stats(
            edge=EDGE,
            cameras={"cam-a": {**camera_stats, "online": True}, "cam-b": {**camera_stats, "online": False}},
            uplink={"connected": True, "spool_messages": 2, "in_flight": 1},
        ),
    )
    storage.count("test_counter", 3)
    feed = Feed(storage)
    feed.event("e1", "cam-a", "red", T0)
    feed.event("e2", "cam-a", "blue", T0 + 60)
    feed.event("e3", "cam-b", "red", T0 + 120)
    feed.event("e4", "cam-a", "red", T0 + 120)  # same start as e3: pages must split ties by id
    # No JPEGs, no clip; frames no other event of cam-b holds (a later match of a frame shares its image).
    feed.event("e5", "cam-b", "red", T0 + 180, frames=2, payload="none", first_frame=500)
    clip = encode_clip([(index / 10, jpeg(100 + index)) for index in range(5)])
    feed.event("e6", "cam-b", "blue", T0 + 240, frames=1, payload="none", clip=clip)
    feed.event("e7", "cam-a", "red", T0 + 300, frames=4)
    feed.event("e8", "cam-a", "red", T0 + 360, frames=1, end=False)  # still open
    feed.fragment("cam-b", 700, 701)  # stored bytes the stats count (they read 0 with only fragments stored)
    engine.dispose()
    return Scene(server, feed, clip)


def get(scene: Scene, path: str, **params: Any) -> Any:
    with scene.server.client(READ_ONLY) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def uids(page: dict) -> list[str]:
    return [item["uid"].rsplit("/", 1)[1] for item in page["items"]]


def test_events_newest_first_with_their_fields(scene: Scene) -> None:
    page = get(scene, "/api/events")
    assert uids(page) == NEWEST_FIRST
    assert page["next_cursor"] is None

    by_uid = {item["uid"].rsplit("/", 1)[1]: item for item in page["items"]}
    e7 = by_uid["e7"]
    assert e7["uid"] == f"{EDGE}/{RUN}/e7"
    assert (e7["edge"], e7["camera"], e7["filter"]) == (EDGE, "cam-a", "red")
    assert (e7["start_frame"], e7["end_frame"], e7["start_time"]) == (100, 104, 10.0)
    assert e7["end_time"] == pytest.approx(10.4)
    assert datetime.fromisoformat(e7["started_at"]) == datetime.fromtimestamp(T0 + 300, UTC)
    assert e7["open"] is False
    assert e7["frames"] == 4
    assert e7["clip_url"] == f"/api/events/{e7['id']}/clip.mp4"
    assert by_uid["e8"]["open"] is True
    assert by_uid["e8"]["ended_at"] is None
    assert by_uid["e5"]["thumbnail_url"] is None  # frames without JPEGs
    assert get(scene, f"/api/events/{e7['id']}") == e7


def test_filters_and_time_range(scene: Scene) -> None:
    assert set(uids(get(scene, "/api/events", filter="red", camera="cam-b"))) == {"e3", "e5"}
    assert set(uids(get(scene, "/api/events", filter="blue"))) == {"e2", "e6"}
    assert len(get(scene, "/api/events", edge=EDGE)["items"]) == 8
    assert get(scene, "/api/events", edge="edge-elsewhere")["items"] == []
    since = datetime.fromtimestamp(T0 + 120, UTC)
    until = datetime.fromtimestamp(T0 + 300, UTC)
    window = get(scene, "/api/events", since=since.isoformat(), until=until.isoformat())
    assert uids(window) == ["e6", "e5", "e4", "e3"]  # since inclusive, until exclusive
    # The same instants in another zone, and with a Z suffix.
    in_paris = since.astimezone(ZoneInfo("Europe/Paris")).isoformat()
    assert uids(get(scene, "/api/events", since=in_paris, until=until.isoformat())) == uids(window)
    zulu = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert uids(get(scene, "/api/events", since=zulu, filter="blue")) == ["e6"]


def test_pagination_covers_every_event_once(scene: Scene) -> None:
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = get(scene, "/api/events", **params)
        seen += uids(page)
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == NEWEST_FIRST
    assert pages == 3
    # The filters keep applying across pages.
    first = get(scene, "/api/events", filter="red", limit=2)
    second = get(scene, "/api/events", filter="red", limit=2, cursor=first["next_cursor"])
    assert uids(first) + uids(second) == ["e8", "e7", "e5", "e4"]
    assert get(scene, "/api/events", filter="red", limit=2, cursor="") == first  # an empty cursor: the first page


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "path", ["/api/events/{}", "/api/events/{}/frames", "/api/events/{}/clip.mp4", "/api/frames/{}.jpg"]
)
def test_ids_beyond_64_bits_are_refused(scene: Scene, path: str) -> None:
    with scene.server.client(READ_ONLY) as client:
        response = client.get(path.format(2**63))
    assert response.status_code == 422
    assert "less than or equal to 9223372036854775807" in response.json()["detail"]


@pytest.mark.parametrize(
    "url", ["/api/events?camera=%00", "/api/events?filter=a%00b", "/api/edges/a%00b", "/api/filters/a%00b"]
)
def test_a_nul_byte_in_a_name_is_refused_on_either_database(scene: Scene, url: str) -> None:
    """PostgreSQL's text holds no NUL: its driver raised and the API answered 500 (SQLite found nothing)."""
    with scene.server.client(READ_ONLY) as client:
        response = client.get(url)
    assert response.status_code == 422
    assert "holds a NUL byte (%00): no name or value here can contain one" in response.json()["detail"]


@pytest.mark.parametrize(
    ("params", "status", "detail"),
    [
        ({"cursor": "not-a-cursor"}, 400, "cursor is not one this API returned"),
        ({"cursor": "WzEsIDJd"}, 400, "cursor is not one this API returned"),  # valid base64 of [1, 2]
        ({"since": "yesterday"}, 422, "query.since: Input should be a valid datetime"),
        ({"until": "2024-13-01"}, 422, "query.until: Input should be a valid datetime"),
        ({"limit": 0}, 422, "query.limit"),
        ({"limit": 501}, 422, "query.limit"),
        ({"cursor": cursor_of('["2024-01-01T00:00:00+00:00", 9223372036854775808]')}, 400, "cursor is not one"),
        ({"cursor": cursor_of('["2024-01-01T00:00:00+00:00", 1e400]')}, 400, "cursor is not one"),
        ({"cursor": cursor_of('["0001-01-01T00:00:00+01:00", 5]')}, 400, "cursor is not one"),
        ({"since": "0001-01-01T00:00:00+01:00"}, 400, "since=0001-01-01T00:00:00+01:00 is outside years 1-9999"),
        ({"until": "9999-12-31T23:59:59-01:00"}, 400, "until=9999-12-31T23:59:59-01:00 is outside years 1-9999"),
        (
            {"since": "2024-05-02T02:00:00+02:00", "until": "2024-05-01T23:00:00Z"},
            400,
            "since=2024-05-02T02:00:00+02:00 is after until=2024-05-01T23:00:00+00:00: give since before until",
        ),
        ({"since": "2024-05-01T12:00:00 01:00"}, 422, "a '+' in a URL reads as a space, send it as %2B"),
    ],
    ids=[
        "garbage cursor", "forged cursor", "bad since", "bad until", "limit 0", "limit 501",
        "cursor id past 2^63", "cursor id 1e400", "cursor near year 1", "since near year 1", "until near year 9999",
        "since after until", "unencoded plus",
    ],
)  # fmt: skip
def test_bad_queries_are_refused(scene: Scene, params: dict, status: int, detail: str) -> None:
    with scene.server.client(READ_ONLY) as client:
        response = client.get("/api/events", params=params)
    assert response.status_code == status
    assert detail in response.json()["detail"]


def test_an_empty_filter_camera_or_edge_means_any(scene: Scene) -> None:
    """A form's blank field sent `?camera=`: it matched no camera, and the list came back empty."""
    every = uids(get(scene, "/api/events"))
    assert uids(get(scene, "/api/events", camera="", filter="", edge="")) == every and len(every) == 8


def event_id(scene: Scene, uid: str) -> int:
    return next(item["id"] for item in get(scene, "/api/events")["items"] if item["uid"].endswith(f"/{uid}"))


def test_frames_and_their_jpegs(scene: Scene) -> None:
    event = get(scene, f"/api/events/{event_id(scene, 'e7')}")
    frames = get(scene, f"/api/events/{event['id']}/frames")
    assert [frame["frame_index"] for frame in frames] == [100, 101, 102, 103]
    assert [frame["stream_time"] for frame in frames] == pytest.approx([10.0, 10.1, 10.2, 10.3])
    assert frames[0]["scores"] == {"red": 0.8}
    assert event["thumbnail_url"] == frames[0]["image_url"] == f"/api/frames/{frames[0]['id']}.jpg"
    with scene.server.client(READ_ONLY) as client:
        for frame, data in zip(frames, scene.feed.jpegs["e7"], strict=True):
            image = client.get(frame["image_url"])
            assert image.status_code == 200
            assert image.headers["content-type"] == "image/jpeg"
            assert image.content == data
        without = get(scene, f"/api/events/{event_id(scene, 'e5')}/frames")
        assert [frame["image_url"] for frame in without] == [None, None]
        missing = client.get(f"/api/frames/{without[0]['id']}.jpg")
        assert missing.status_code == 404
        assert "has no stored image" in missing.json()["detail"]
        assert client.get("/api/events/999999/frames").status_code == 404


def decode_mp4(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        return list(container.decode(video=0))


def test_clips(scene: Scene) -> None:
    with scene.server.client(READ_ONLY) as client:
        made = client.get(f"/api/events/{event_id(scene, 'e7')}/clip.mp4")
        assert made.status_code == 200
        assert made.headers["content-type"] == "video/mp4"
        frames = decode_mp4(made.content)
        assert len(frames) == 4
        assert (frames[0].width, frames[0].height) == (66, 48)  # 65x47 JPEGs rounded up, as the edge does

        assert made.headers["x-event-start"] == "0.000"  # it starts with the event's first frame
        stored = client.get(f"/api/events/{event_id(scene, 'e6')}/clip.mp4")
        assert stored.status_code == 200
        assert stored.content == scene.clip and stored.headers["x-event-start"] == "0.000"
        assert len(decode_mp4(stored.content)) == 5

        none = client.get(f"/api/events/{event_id(scene, 'e5')}/clip.mp4")
        assert none.status_code == 404
        assert "no stored clip, stream or JPEG frames" in none.json()["detail"]


def test_clips_and_frames_answer_head_and_byte_ranges(scene: Scene) -> None:
    """Browsers seek in an MP4 by asking for byte ranges (Safari plays no video whose server ignores them), and
    players, caches and link checkers ask HEAD first: a clip made from the frames (or the stream) answered every
    range with the whole body, and HEAD with 405."""
    frame = get(scene, f"/api/events/{event_id(scene, 'e7')}/frames")[0]["image_url"]
    made, stored = (f"/api/events/{event_id(scene, uid)}/clip.mp4" for uid in ("e7", "e6"))
    with scene.server.client(READ_ONLY) as client:
        for url in (made, stored, frame):
            whole = client.get(url).content
            head = client.head(url)
            assert (head.status_code, head.content, head.headers["accept-ranges"]) == (200, b"", "bytes"), url
            assert int(head.headers["content-length"]) == len(whole)
            for asked, part in [("10-19", whole[10:20]), ("20-", whole[20:]), ("-5", whole[-5:])]:
                answer = client.get(url, headers={"Range": f"bytes={asked}"})
                assert (answer.status_code, answer.content) == (206, part), (url, asked)
                first = len(whole) - len(part) if asked.startswith("-") else int(asked.split("-")[0])
                assert answer.headers["content-range"] == f"bytes {first}-{first + len(part) - 1}/{len(whole)}"
            beyond = client.get(url, headers={"Range": f"bytes={len(whole)}-"})
            assert (beyond.status_code, beyond.headers["content-range"]) == (416, f"bytes */{len(whole)}"), url
        several = client.get(made, headers={"Range": "bytes=0-1,5-6"})  # may be ignored (RFC 9110): the whole clip
        assert (several.status_code, several.content) == (200, client.get(made).content)
        operations = client.get("/openapi.json").json()["paths"]
    assert set(operations["/api/events/{event_id}/clip.mp4"]) == {"get", "head"}


def test_edges_and_cameras(scene: Scene) -> None:
    (edge,) = get(scene, "/api/edges")
    assert edge["id"] == EDGE
    assert edge["online"] is True
    assert edge["run"] == RUN
    assert edge["filters_version"] == 4
    assert edge["cameras"] == ["cam-a", "cam-b"]
    assert edge["stats"] == {"connected": True, "spool_messages": 2, "in_flight": 1}
    assert get(scene, f"/api/edges/{EDGE}") == edge
    cameras = get(scene, "/api/cameras")
    assert [(camera["edge"], camera["name"], camera["online"]) for camera in cameras] == [
        (EDGE, "cam-a", True),
        (EDGE, "cam-b", False),  # the edge reports that camera down
    ]
    assert cameras[0]["stats"]["fps"] == 12.0
    with scene.server.client(READ_ONLY) as client:
        unknown = client.get("/api/edges/unknown-edge")
        assert unknown.status_code == 404 and "is known (it never connected, or was forgotten)" in unknown.text


def test_an_edge_not_heard_for_longer_than_the_timeout_is_offline(scene: Scene) -> None:
    engine = make_engine(scene.server.config.db_url)
    try:
        with session_factory(engine).begin() as session:
            session.add(Edge(id="edge-old", run="r", last_seen=datetime.now(UTC) - timedelta(hours=2)))
        edges = {edge["id"]: edge["online"] for edge in get(scene, "/api/edges")}
        assert edges == {EDGE: True, "edge-old": False}
        assert get(scene, "/api/stats")["edges_online"] == 1
    finally:
        with session_factory(engine).begin() as session:
            session.delete(session.get(Edge, "edge-old"))
        engine.dispose()


def test_stats_metrics_and_health(scene: Scene) -> None:
    stats = get(scene, "/api/stats")
    assert stats["events"] == 8
    assert stats["frames"] == 3 + 3 + 3 + 3 + 2 + 1 + 4 + 1
    assert stats["edges"] == stats["edges_online"] == 1
    assert stats["cameras"] == 2
    assert stats["stored_bytes"] == scene.feed.stored_bytes
    assert stats["counters"]["test_counter"] == 3
    with scene.server.client(token=None) as anonymous:
        assert anonymous.get("/api/stats").status_code == 401
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        assert anonymous.head("/healthz").status_code == 200  # uptime checkers that send HEAD got 405
        metrics = anonymous.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    lines = set(metrics.text.splitlines())
    assert "filterforward_events 8.0" in lines
    assert "filterforward_edges_online 1.0" in lines
    assert f"filterforward_stored_bytes {float(scene.feed.stored_bytes)}" in lines
    assert 'filterforward_stored_counter_total{name="test_counter"} 3.0' in lines
    assert any(line.startswith("filterforward_ingest_total{") for line in lines)


def test_no_path_reaches_the_file_system_unchecked(scene: Scene) -> None:
    secrets = ("tokens:", "DeclarativeBase")  # in cloud.yaml (beside data_dir) and in cloud/db.py
    with scene.server.client(READ_ONLY) as client:
        for path in (
            "/api/frames/..%2F..%2Fcloud.yaml.jpg",
            "/api/frames/1%2F..%2F..%2Fcloud.yaml.jpg",
            "/static/..%2Fdb.py",
            "/static/%2E%2E/db.py",
        ):
            response = client.get(path)
            assert response.status_code in (404, 422), path
            assert not any(secret in response.text for secret in secrets), path
    # A stored path that points out of the frame store is refused as well.
    frame = get(scene, f"/api/events/{event_id(scene, 'e7')}/frames")[0]["id"]
    engine = make_engine(scene.server.config.db_url)
    sessions = session_factory(engine)
    with sessions() as session:
        original = session.get(StoredFrame, frame).path
    try:
        with sessions.begin() as session:
            session.execute(update(StoredFrame).where(StoredFrame.id == frame).values(path="../../cloud.yaml"))
        with scene.server.client(READ_ONLY) as client:
            response = client.get(f"/api/frames/{frame}.jpg")
        assert response.status_code == 404
        assert "tokens:" not in response.text
    finally:
        with sessions.begin() as session:
            session.execute(update(StoredFrame).where(StoredFrame.id == frame).values(path=original))
        engine.dispose()
