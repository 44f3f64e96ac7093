"""The ingest's write path and retention, against SQLite and the local PostgreSQL (each test in its own schema)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy import event as sa_event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from cloud.db import (
    Base,
    Camera,
    Counter,
    Edge,
    Event,
    EventFrame,
    Fragment,
    Received,
    StoredFrame,
    as_utc,
    make_engine,
    session_factory,
    utcnow,
)
from cloud.framestore import FrameStore
from cloud.retention import ORPHAN_AGE, sweep
from cloud.storage import EventRecord, Message, Notification, Storage
from common.fragment import Fragment as StreamFragment
from common.fragment import FragmentHeader as StreamHeader
from common.fragment import FrameEntry, pack
from common.protocol import EventHeader, EventInfo, FragmentHeader, FrameHeader, Hello, Stats

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
EDGE, RUN, CAMERA = "edge-1", "run-1", "cam-1"
T0 = 1_700_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'cloud.db'}")
        yield session_factory(engine)
        engine.dispose()
        return
    schema = f"ff_storage_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL at {PG_URL} is not reachable: {str(exc).splitlines()[0]}")
    engine = create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    try:
        Base.metadata.create_all(engine)
        yield session_factory(engine)
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def store(tmp_path: Path) -> FrameStore:
    return FrameStore(tmp_path / "store")


@pytest.fixture
def storage(sessions: sessionmaker, store: FrameStore) -> Storage:
    return Storage(sessions, store)


def frame(seq: int, *events: str, index: int | None = None, payload: str = "jpeg") -> FrameHeader:
    index = seq if index is None else index
    return FrameHeader(
        edge=EDGE,
        run=RUN,
        seq=seq,
        camera=CAMERA,
        frame=index,
        timestamp=index / 10,
        wall_time=T0 + index / 10,
        scores={"red": 0.8},
        events=list(events),
        payload=payload,
    )


def event(seq: int, phase: str, event_id: str = "ev-1", clip: bool = False, start: int = 10) -> EventHeader:
    end = start + 20 if phase == "end" else None
    info = EventInfo(
        id=event_id,
        filter="red",
        camera=CAMERA,
        start_frame=start,
        start_time=start / 10,
        end_frame=end,
        end_time=end / 10 if end is not None else None,
        peak_score=0.9 if phase == "end" else 0.7,
    )
    wall = T0 + (end if end is not None else start) / 10
    return EventHeader(
        edge=EDGE, run=RUN, seq=seq, phase=phase, wall_time=wall, event=info, payload="mp4" if clip else "none"
    )


def fragment(seq: int, *indices: int, gop: int = 0, part: int | None = None) -> Message:
    """A stream-fragment message holding the pictures of the frames `indices` (stand-in access units); it starts
    its GOP unless it is a later `part` of it."""
    entries = [
        FrameEntry(index=index, time=index / 10, keyframe=n == 0 and not part, size=3)
        for n, index in enumerate(indices)
    ]
    stream = StreamFragment(
        StreamHeader(gop=gop, part=part, width=64, height=48, fps="10/1", frames=entries), (b"h26",) * len(entries)
    )
    return Message(EDGE, FragmentHeader(edge=EDGE, run=RUN, seq=seq, camera=CAMERA, wall_time=T0), pack(stream))


def phases(notifications: list[Notification]) -> list[tuple[str, str]]:
    return [(n.phase, n.event.uid.rsplit("/", 1)[1]) for n in notifications]


def rows(sessions: sessionmaker, model: type, *where: Any) -> list[Any]:
    with sessions() as session:
        return list(session.scalars(select(model).where(*where)))


def files(store: FrameStore) -> list[str]:
    return sorted(str(path.relative_to(store.root)) for path in store.root.rglob("*") if path.is_file())


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Runs the calls at once in threads (released together) and returns their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_a_frame_is_stored_once_however_often_it_arrives(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    for _ in range(3):
        assert storage.store_frame(EDGE, frame(1), b"jpeg-1") == []

    [stored] = rows(sessions, StoredFrame)
    assert (stored.seq, stored.frame_index, stored.camera, stored.size) == (1, 1, CAMERA, 6)
    assert stored.scores == {"red": 0.8}
    assert store.open_path(stored.path).read_bytes() == b"jpeg-1"
    assert files(store) == [f"frames/{EDGE}/{CAMERA}/{RUN}-1.jpg"]
    assert storage.counts == {"stored": 1, "duplicates": 2}


def test_frames_and_events_share_one_seq_space(storage: Storage, sessions: sessionmaker) -> None:
    storage.store_frame(EDGE, frame(5), b"jpeg")

    assert storage.store_event(EDGE, event(5, "start"), b"") == []
    assert rows(sessions, Event) == []
    storage.store_event("edge-2", event(5, "start").model_copy(update={"edge": "edge-2"}), b"")
    assert [e.edge_id for e in rows(sessions, Event)] == ["edge-2"]


def test_racing_duplicates_store_one_row_one_file_and_one_notification(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_event(EDGE, event(1, "start"), b"")
    notifications = []
    for seq in range(2, 8):
        for result in race(*[lambda seq=seq: storage.store_frame(EDGE, frame(seq, "ev-1"), b"jpeg")] * 4):
            notifications += result

    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == list(range(2, 8))
    assert len(rows(sessions, EventFrame)) == 6
    assert files(store) == sorted(f"frames/{EDGE}/{CAMERA}/{RUN}-{seq}.jpg" for seq in range(2, 8))
    assert phases(notifications) == [("start", "ev-1")]
    assert storage.counts == {"stored": 7, "duplicates": 18}


def test_a_racing_start_and_frame_notify_the_start_once(storage: Storage) -> None:
    notifications = []
    for n in range(6):
        event_id = f"ev-{n}"
        start = event(2 * n, "start", event_id)
        results = race(
            lambda start=start: storage.store_event(EDGE, start, b""),
            lambda n=n, event_id=event_id: storage.store_frame(EDGE, frame(2 * n + 1, event_id), b"jpeg"),
        )
        notifications += results[0] + results[1]

    assert sorted(phases(notifications)) == [("start", f"ev-{n}") for n in range(6)]


def test_a_racing_start_and_end_merge_into_one_event(storage: Storage, sessions: sessionmaker) -> None:
    notifications = []
    for n in range(6):
        event_id = f"ev-{n}"
        storage.store_frame(EDGE, frame(3 * n, event_id), b"jpeg")
        start, end = event(3 * n + 1, "start", event_id), event(3 * n + 2, "end", event_id)
        results = race(
            lambda start=start: storage.store_event(EDGE, start, b""),
            lambda end=end: storage.store_event(EDGE, end, b""),
        )
        notifications += results[0] + results[1]

    events = rows(sessions, Event)
    assert len(events) == 6
    assert all((e.start_frame, e.end_frame, e.peak_score) == (10, 30, 0.9) for e in events)
    assert sorted(phases(notifications)) == sorted((p, f"ev-{n}") for n in range(6) for p in ("start", "end"))


def test_a_frame_before_its_start_is_linked_and_the_start_waits_for_it(
    storage: Storage, sessions: sessionmaker
) -> None:
    assert storage.store_frame(EDGE, frame(2, "ev-1", index=12), b"jpeg") == []

    [start] = storage.store_event(EDGE, event(1, "start"), b"")
    storage.mark_notified(start)
    [frame_row] = rows(sessions, StoredFrame)
    assert start.phase == "start"
    assert start.event == EventRecord(
        id=start.event.id,
        uid=f"{EDGE}/{RUN}/ev-1",
        edge=EDGE,
        camera=CAMERA,
        filter="red",
        start_frame=10,
        end_frame=None,
        start_time=1.0,
        end_time=None,
        peak_score=0.7,
        started_at=datetime.fromtimestamp(T0 + 1.0, UTC),
        ended_at=None,
        thumbnail=frame_row.id,
    )
    [end] = storage.store_event(EDGE, event(3, "end"), b"")
    assert (end.phase, end.event.end_frame, end.event.end_time, end.event.peak_score) == ("end", 30, 3.0, 0.9)
    assert end.event.ended_at == start.event.started_at + timedelta(seconds=2)


def test_an_end_before_its_start_stands_in_for_it_until_the_start_arrives(
    storage: Storage, sessions: sessionmaker
) -> None:
    assert storage.store_event(EDGE, event(3, "end"), b"") == []  # nothing stored to show yet

    notifications = storage.store_frame(EDGE, frame(2, "ev-1", index=15), b"jpeg")
    assert phases(notifications) == [("start", "ev-1"), ("end", "ev-1")]
    estimated = notifications[0].event.started_at
    assert estimated == datetime.fromtimestamp(T0 + 1.0, UTC)  # end wall time minus the duration
    for notification in notifications:
        storage.mark_notified(notification)

    assert storage.store_event(EDGE, event(1, "start").model_copy(update={"wall_time": T0 + 0.5}), b"") == []
    [row] = rows(sessions, Event)
    assert as_utc(row.started_at) == datetime.fromtimestamp(T0 + 0.5, UTC)  # the start's own clock
    assert (row.start_frame, row.end_frame, row.peak_score, row.start_notified, row.end_notified) == (
        10,
        30,
        0.9,
        True,
        True,
    )


def test_a_clip_on_end_goes_to_the_store_and_stands_in_for_missing_jpegs(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    assert storage.store_event(EDGE, event(1, "start"), b"") == []
    [start] = storage.store_frame(EDGE, frame(2, "ev-1", payload="none"), b"")  # a clip-policy filter's frame
    storage.mark_notified(start)

    [end] = storage.store_event(EDGE, event(3, "end", clip=True), b"mp4 clip")
    [row] = rows(sessions, Event)
    assert (row.clip_path, row.clip_size) == (f"clips/{EDGE}/{CAMERA}/{RUN}-3.mp4", 8)
    assert store.open_path(row.clip_path).read_bytes() == b"mp4 clip"
    assert [(f.path, f.size) for f in rows(sessions, StoredFrame)] == [(None, 0)]
    assert start.event.thumbnail is end.event.thumbnail is None  # only the clip shows the event


def test_a_clip_alone_makes_the_start_due(storage: Storage) -> None:
    storage.store_event(EDGE, event(1, "start"), b"")

    notifications = storage.store_event(EDGE, event(2, "end", clip=True), b"mp4")
    assert phases(notifications) == [("start", "ev-1"), ("end", "ev-1")]
    assert all(n.event.thumbnail is None for n in notifications)


def test_notifications_go_out_once_even_across_a_restart(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_event(EDGE, event(1, "start"), b"")
    [start] = storage.store_frame(EDGE, frame(2, "ev-1"), b"jpeg")
    assert storage.store_frame(EDGE, frame(3, "ev-1"), b"jpeg") == []  # handed out, not yet marked: not again

    restarted = Storage(sessions, store)  # the process died before the start went out
    assert phases(restarted.due()) == [("start", "ev-1")]
    assert restarted.due() == []
    restarted.mark_notified(start)
    assert restarted.store_frame(EDGE, frame(4, "ev-1"), b"jpeg") == []

    [end] = restarted.store_event(EDGE, event(5, "end"), b"")
    restarted.mark_notified(end)
    assert Storage(sessions, store).due() == []
    [row] = rows(sessions, Event)
    assert (row.start_notified, row.end_notified) == (True, True)


def test_an_end_waits_for_its_start_to_be_due(storage: Storage) -> None:
    storage.store_event(EDGE, event(1, "start"), b"")
    assert storage.store_event(EDGE, event(2, "end"), b"") == []  # no frame yet: neither start nor end

    assert phases(storage.store_frame(EDGE, frame(3, "ev-1"), b"jpeg")) == [("start", "ev-1"), ("end", "ev-1")]


def test_a_batch_with_a_duplicate_in_the_middle_stores_the_others(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_frame(EDGE, frame(2), b"jpeg-2")
    batch = [
        Message(EDGE, frame(1, "ev-1"), b"jpeg-1"),
        Message(EDGE, frame(2), b"other bytes"),  # stored before: nothing of it is written
        Message(EDGE, event(3, "start"), b""),
        Message(EDGE, frame(1, "ev-1"), b"jpeg-1"),  # a resend within the same batch
    ]

    stored = storage.store_many(batch)
    assert stored.outcomes == ["stored", "duplicate", "stored", "duplicate"]
    assert phases(stored.notifications) == [("start", "ev-1")]  # due once the start and its frame committed
    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == [1, 2]
    assert files(store) == [f"frames/{EDGE}/{CAMERA}/{RUN}-{seq}.jpg" for seq in (1, 2)]
    assert store.open_path(f"frames/{EDGE}/{CAMERA}/{RUN}-2.jpg").read_bytes() == b"jpeg-2"
    assert storage.counts == {"stored": 3, "duplicates": 2}
    storage.mark_notified(stored.notifications[0])

    again = storage.store_many(batch)  # the next pass, or a restarted cloud
    assert again.outcomes == ["duplicate"] * 4 and again.notifications == []


def test_racing_batches_store_each_message_once(storage: Storage, sessions: sessionmaker, store: FrameStore) -> None:
    batch = [Message(EDGE, frame(seq), b"jpeg") for seq in range(1, 6)]

    results = race(*[lambda: storage.store_many(batch)] * 3)
    for seq in range(5):
        assert sorted(result.outcomes[seq] for result in results) == ["duplicate", "duplicate", "stored"]
    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == list(range(1, 6))
    assert files(store) == sorted(f"frames/{EDGE}/{CAMERA}/{RUN}-{seq}.jpg" for seq in range(1, 6))


def test_a_message_whose_file_cannot_be_written_costs_only_itself(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    (store.root / "frames" / EDGE).mkdir(parents=True)
    (store.root / "frames" / EDGE / "blocked").write_text("a file where the camera's folder goes")
    blocked = frame(2).model_copy(update={"camera": "blocked"})

    stored = storage.store_many(
        [Message(EDGE, frame(1), b"a"), Message(EDGE, blocked, b"b"), Message(EDGE, frame(3), b"c")]
    )
    assert stored.outcomes[0] == stored.outcomes[2] == "stored"
    assert isinstance(stored.outcomes[1], OSError)
    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == [1, 3]
    assert rows(sessions, Received, Received.seq == 2) == []  # not stored: its resend is stored
    with pytest.raises(OSError):
        storage.store_frame(EDGE, blocked, b"b")


def test_a_batch_whose_commit_fails_stores_nothing_and_is_stored_when_sent_again(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    batch = [Message(EDGE, event(1, "start"), b""), Message(EDGE, frame(2, "ev-1"), b"jpeg")]

    def refuse(session: Session) -> None:
        if not session.in_nested_transaction():  # the batch's commit, not a message's savepoint
            raise RuntimeError("commit refused")

    sa_event.listen(sessions, "before_commit", refuse)
    try:
        with pytest.raises(RuntimeError, match="commit refused"):
            storage.store_many(batch)
    finally:
        sa_event.remove(sessions, "before_commit", refuse)
    assert rows(sessions, Received) == rows(sessions, StoredFrame) == rows(sessions, Event) == []
    assert storage.counts == {"stored": 0, "duplicates": 0}

    stored = storage.store_many(batch)
    assert stored.outcomes == ["stored", "stored"]
    assert phases(stored.notifications) == [("start", "ev-1")]


def test_hello_seen_and_stats_update_edges_and_cameras(storage: Storage, sessions: sessionmaker) -> None:
    storage.edge_hello(EDGE, Hello(edge=EDGE, run="r1", cameras=["cam-1", "cam-2"], filters_version=3), "KEY")
    [edge] = rows(sessions, Edge)
    assert (edge.run, edge.filters_version, edge.public_key) == ("r1", 3, "KEY")
    assert sorted(c.name for c in rows(sessions, Camera)) == ["cam-1", "cam-2"]

    storage.edge_hello(EDGE, Hello(edge=EDGE, run="r2", cameras=["cam-2", "cam-3"]), None)
    [edge] = rows(sessions, Edge)
    assert (edge.run, edge.filters_version, edge.public_key) == ("r2", 0, "KEY")
    assert sorted(c.name for c in rows(sessions, Camera)) == ["cam-2", "cam-3"]

    camera_stats = {"fps": 12.0, "base_ms": 30.5, "mc_ms": 1.5, "frames": 100, "matched": 7, "online": True}
    uplink = {"connected": True, "spool_messages": 2, "spool_bytes": 2048, "acked": 40}
    unnamed = {f"cam-x{n}": camera_stats for n in range(50)}  # no camera of its hello: one message made 1000 rows
    storage.edge_stats(EDGE, Stats(edge=EDGE, cameras={"cam-2": camera_stats, **unnamed}, uplink=uplink))
    [edge] = rows(sessions, Edge)
    assert edge.stats == uplink
    assert rows(sessions, Camera, Camera.name == "cam-2")[0].stats == camera_stats
    assert rows(sessions, Camera, Camera.name == "cam-3")[0].stats == {}
    assert sorted(c.name for c in rows(sessions, Camera)) == ["cam-2", "cam-3"]

    before = as_utc(edge.last_seen)
    storage.edge_seen(EDGE)
    storage.edge_seen("edge-new")  # a heartbeat before any hello still records the edge
    assert as_utc(rows(sessions, Edge, Edge.id == EDGE)[0].last_seen) >= before
    assert sorted(e.id for e in rows(sessions, Edge)) == [EDGE, "edge-new"]


def test_counters_persist_and_concurrent_adds_are_not_lost(storage: Storage, sessions: sessionmaker) -> None:
    storage.count("malformed")
    storage.count("malformed", 4)
    race(*[lambda: [storage.count("unauthenticated") for _ in range(5)]] * 4)

    counters = {c.name: c.value for c in rows(sessions, Counter)}
    assert counters == {"malformed": 5, "unauthenticated": 20}


def age(sessions: sessionmaker, model: type, column: str, ids: list[int], days: float) -> None:
    with sessions.begin() as session:
        key = model.seq if model is StoredFrame else model.id
        session.execute(update(model).where(key.in_(ids)).values({column: utcnow() - timedelta(days=days)}))


def test_retention_by_age_deletes_old_frames_clips_and_emptied_events(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_event(EDGE, event(1, "start", "old"), b"")
    storage.store_frame(EDGE, frame(2, "old"), b"a" * 10)
    storage.store_frame(EDGE, frame(3, "old"), b"b" * 10)
    storage.store_event(EDGE, event(4, "end", "old", clip=True), b"c" * 30)
    storage.store_frame(EDGE, frame(5), b"d" * 10)  # old, in no event; its file is already gone
    storage.store_event(EDGE, event(6, "start", "new"), b"")
    storage.store_frame(EDGE, frame(7, "new"), b"e" * 10)
    storage.store_frame(EDGE, frame(8, "new"), b"f" * 10)
    storage.store_event(EDGE, event(9, "start", "ended-no-frames"), b"")
    storage.store_event(EDGE, event(10, "end", "ended-no-frames"), b"")
    # Its frames were dropped from the edge's full spool during an outage: an event with none, ever.
    storage.store_event(EDGE, event(11, "start", "old-no-frames"), b"")
    storage.store_event(EDGE, event(12, "end", "old-no-frames"), b"")
    age(sessions, StoredFrame, "received_at", [2, 3, 5], days=40)
    ids = {e.uid.rsplit("/", 1)[1]: e.id for e in rows(sessions, Event)}
    age(sessions, Event, "ended_at", [ids["old"], ids["old-no-frames"]], days=40)
    age(sessions, Event, "ended_at", [ids["ended-no-frames"]], days=1)  # within the limit: stays
    store.delete(f"frames/{EDGE}/{CAMERA}/{RUN}-5.jpg")
    orphan = store.root / "frames" / EDGE / CAMERA / ".tmp-killed-mid-write"
    orphan.write_bytes(b"g" * 10)
    os.utime(orphan, (time.time() - 2 * ORPHAN_AGE, time.time() - 2 * ORPHAN_AGE))

    tally = sweep(sessions, store, max_age_days=30, max_bytes=None)
    assert not orphan.exists()

    assert tally == {
        "retention_frames_deleted": 3,
        "retention_clips_deleted": 1,
        "retention_fragments_deleted": 0,
        "retention_events_deleted": 2,
        "retention_bytes_deleted": 50,
    }
    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == [7, 8]
    assert files(store) == [f"frames/{EDGE}/{CAMERA}/{RUN}-7.jpg", f"frames/{EDGE}/{CAMERA}/{RUN}-8.jpg"]
    assert sorted(e.uid.rsplit("/", 1)[1] for e in rows(sessions, Event)) == ["ended-no-frames", "new"]
    assert {ef.event_uid.rsplit("/", 1)[1] for ef in rows(sessions, EventFrame)} == {"new"}
    counters = {c.name: c.value for c in rows(sessions, Counter)}
    assert counters == {k: v for k, v in tally.items() if v}

    assert sweep(sessions, store, max_age_days=30, max_bytes=None) == dict.fromkeys(tally, 0)
    assert {c.name: c.value for c in rows(sessions, Counter)} == counters


def test_retention_by_size_deletes_the_oldest_until_under_the_limit(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_event(EDGE, event(1, "start", "clipped"), b"")
    storage.store_event(EDGE, event(2, "end", "clipped", clip=True), b"c" * 300)  # ended long ago: oldest
    for seq in range(3, 13):
        storage.store_frame(EDGE, frame(seq), bytes(100))
    with sessions.begin() as session:  # received one second apart, oldest first
        for seq in range(3, 13):
            at = utcnow() - timedelta(seconds=100 - seq)
            session.execute(update(StoredFrame).where(StoredFrame.seq == seq).values(received_at=at))
    [clipped] = rows(sessions, Event)
    age(sessions, Event, "ended_at", [clipped.id], days=2)

    tally = sweep(sessions, store, max_age_days=None, max_bytes=450)  # 1300 stored: 850 must go

    assert tally == {
        "retention_frames_deleted": 6,
        "retention_clips_deleted": 1,
        "retention_fragments_deleted": 0,
        "retention_events_deleted": 1,  # ended, and its clip was all it had
        "retention_bytes_deleted": 900,
    }
    assert sorted(f.seq for f in rows(sessions, StoredFrame)) == [9, 10, 11, 12]
    assert store.total_bytes() == 400
    assert rows(sessions, Event) == []
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Counter)) == 4


def test_retention_prunes_old_dedup_keys_and_tolerates_an_empty_store(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    storage.store_event(EDGE, event(1, "start"), b"")
    storage.store_event(EDGE, event(2, "start", "ev-2"), b"")
    with sessions.begin() as session:
        session.execute(update(Received).where(Received.seq == 1).values(received_at=utcnow() - timedelta(days=8)))

    assert sweep(sessions, store, max_age_days=30, max_bytes=10) == {
        "retention_frames_deleted": 0,
        "retention_clips_deleted": 0,
        "retention_fragments_deleted": 0,
        "retention_events_deleted": 0,
        "retention_bytes_deleted": 0,
    }
    assert [r.seq for r in rows(sessions, Received)] == [2]


def test_retention_forgets_the_keys_below_the_oldest_seq_an_edge_still_holds(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    """A key per message for a week: 1.6 GB of database at 23 messages a second for 3 MB of payloads. The edge's
    stats say the oldest seq its spool holds; it never sends one below it again."""
    for seq in range(1, 6):
        storage.store_frame(EDGE, frame(seq), b"jpeg")
    storage.edge_stats(EDGE, Stats(edge=EDGE, uplink={"spool_first_seq": 4}))
    with sessions.begin() as session:  # 1-4 stored before the resend window, 5 within it
        session.execute(update(Received).where(Received.seq < 5).values(received_at=utcnow() - timedelta(minutes=11)))
    sweep(sessions, store, max_age_days=None, max_bytes=None)
    assert sorted(r.seq for r in rows(sessions, Received)) == [4, 5]
    assert storage.store_frame(EDGE, frame(4), b"jpeg") == []  # still known: a resend of 4 is a duplicate
    assert len(rows(sessions, StoredFrame)) == 5


def test_a_restarted_edge_closes_the_events_its_killed_run_left_open(storage: Storage, sessions: sessionmaker) -> None:
    storage.edge_hello(EDGE, Hello(edge=EDGE, run=RUN, cameras=[CAMERA]), None)
    storage.store_event(EDGE, event(1, "start", "cut-off"), b"")
    storage.store_event(EDGE, event(2, "start", "never-framed", start=50), b"")
    storage.store_frame(EDGE, frame(3, "cut-off", index=12), b"a")
    storage.store_frame(EDGE, frame(4, "cut-off", index=14), b"b")
    # kill -9: no end message ever comes. The next run says hello:
    closed = storage.edge_hello(EDGE, Hello(edge=EDGE, run="run-2", cameras=[CAMERA]), None)
    assert phases(closed) == [("end", "cut-off")]  # "never-framed" had no frame: it was never announced
    ends = {e.uid.rsplit("/", 1)[1]: (e.end_frame, e.end_time, as_utc(e.ended_at)) for e in rows(sessions, Event)}
    assert ends["cut-off"] == (14, 1.4, datetime.fromtimestamp(T0 + 1.4, UTC))  # at its last stored frame
    assert ends["never-framed"] == (50, 5.0, datetime.fromtimestamp(T0 + 5.0, UTC))  # at its start
    assert storage.edge_hello(EDGE, Hello(edge=EDGE, run="run-2", cameras=[CAMERA]), None) == []  # once

    # The restarted edge resends the old run's spool after its hello: its frames move the guessed end on (they lay
    # after it, 186 frames in a probe, with the event saying it had ended before them).
    storage.store_frame(EDGE, frame(5, "cut-off", index=20), b"c")
    [cut] = rows(sessions, Event, Event.uid.endswith("/cut-off"))
    assert (cut.end_frame, cut.end_time, as_utc(cut.ended_at)) == (20, 2.0, datetime.fromtimestamp(T0 + 2.0, UTC))

    late_end = storage.store_event(EDGE, event(6, "end", "cut-off"), b"")  # resent from the old run's spool
    assert phases(late_end) == []  # its end went out already
    [cut] = rows(sessions, Event, Event.uid.endswith("/cut-off"))
    assert (cut.end_frame, cut.end_time) == (30, 3.0)  # the real end replaces the guess


def test_a_frame_matched_again_shares_the_image_sent_once(
    storage: Storage, sessions: sessionmaker, store: FrameStore
) -> None:
    """The edge sends a frame's image once (edge/pipeline.py): a later match of the same frame comes without
    one, and its row points at the image already stored, whichever of the two is stored first."""
    storage.store_frame(EDGE, frame(1, index=7), b"jpeg-7")  # one filter's match, with the JPEG
    storage.store_frame(EDGE, frame(2, index=7, payload="none"), b"")  # another filter's back-dated match
    storage.store_frame(EDGE, frame(4, index=8, payload="none"), b"")  # stored first: seq 3 was refused ...
    storage.store_frame(EDGE, frame(3, index=8), b"jpeg-8")  # ... for a full disk, and sent again
    storage.store_frame(EDGE, frame(5, index=9, payload="none"), b"")  # an image that never came (a clip filter)
    by_seq = {f.seq: f for f in rows(sessions, StoredFrame)}
    assert by_seq[2].path == by_seq[1].path and (by_seq[1].size, by_seq[2].size) == (6, 0)
    assert by_seq[4].path == by_seq[3].path and store.open_path(by_seq[4].path).read_bytes() == b"jpeg-8"
    assert by_seq[5].path is None and by_seq[5].fragment_id is None
    assert files(store) == [f"frames/{EDGE}/{CAMERA}/{RUN}-1.jpg", f"frames/{EDGE}/{CAMERA}/{RUN}-3.jpg"]


def test_a_frame_whose_fragment_came_first_points_at_it(storage: Storage, sessions: sessionmaker) -> None:
    """The edge sends a frame's message before its fragment, but a frame message lost in a cloud crash is resent
    after the messages that followed it (they go out as soon as the new connection is up, the resend once the edge's
    link has noticed it): its row still finds its picture in the fragment; a frame within the fragment's range whose
    picture it does not hold (a clip filter's match) gets none."""
    storage.store_frame(EDGE, frame(1, index=10, payload="none"), b"")  # in order: the frame, then its fragment
    assert storage.store_many([fragment(3, 10, 11, 13)]).outcomes == ["stored"]
    storage.store_frame(EDGE, frame(2, index=11, payload="none"), b"")  # resent after its fragment
    storage.store_frame(EDGE, frame(4, index=12, payload="none"), b"")  # in the range, not in the fragment
    storage.store_frame(EDGE, frame(5, index=13, payload="none"), b"")  # resent too, another filter's match
    storage.store_frame(EDGE, frame(6, index=14, payload="none"), b"")  # the next fragment's, not yet stored
    assert storage.store_many([fragment(7, 14, 15)]).outcomes == ["stored"]
    first, second = (f.id for f in sorted(rows(sessions, Fragment), key=lambda f: f.seq))
    by_seq = {f.seq: f.fragment_id for f in rows(sessions, StoredFrame)}
    assert by_seq == {1: first, 2: first, 4: None, 5: first, 6: second}


def test_a_fragment_stored_without_the_one_before_it_gives_its_frames_no_image_until_that_one_comes(
    storage: Storage, sessions: sessionmaker
) -> None:
    """A full edge spool drops its oldest messages, which can be a GOP's first fragment (its keyframe) or one in
    the middle; the later fragments of that GOP cannot be decoded, so their frames must not offer an image."""
    for seq, index in enumerate([10, 11, 12, 13, 14, 15, 20], start=1):
        storage.store_frame(EDGE, frame(seq, index=index, payload="none"), b"")
    storage.store_many([fragment(20, 10, 11, gop=0, part=0)])
    storage.store_many([fragment(22, 14, 15, gop=0, part=2)])  # part 1 not (yet) here
    storage.store_many([fragment(30, 20, gop=1, part=1)])  # GOP 1's first fragment was dropped for good
    storage.store_frame(EDGE, frame(31, index=21, payload="none"), b"")  # resent after its unplayable fragment

    def images() -> dict[int, bool]:
        return {f.frame_index: f.has_image for f in rows(sessions, StoredFrame)}

    assert images() == {10: True, 11: True, 12: False, 13: False, 14: False, 15: False, 20: False, 21: False}
    # (has_image is what the event listing's image and thumbnail URLs and the thumbnail's choice go by)
    storage.store_many([fragment(21, 12, 13, gop=0, part=1)])  # the missing part, resent at last
    assert images() == {10: True, 11: True, 12: True, 13: True, 14: True, 15: True, 20: False, 21: False}
    playable = {(f.gop, f.part): f.playable for f in rows(sessions, Fragment)}
    assert playable == {(0, 0): True, (0, 1): True, (0, 2): True, (1, 1): False}
