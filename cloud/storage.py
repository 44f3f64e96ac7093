"""The ingest's write path: frames and events into the database, their payloads into the FrameStore.

Each frame or event message is stored once per (edge, seq), one seq space per edge: the transaction that
stores it also inserts its `Received` row, so a duplicate (even one racing the first) fails on that
primary key and stores nothing. `store_many` stores a batch in one transaction (one commit, one WAL flush)
with a savepoint per message, so a duplicate or a failing message rolls back only itself. A payload file is
written before its row commits, under a name derived from (run, seq): a resend rewrites the same bytes to
the same file, and a message that turns out to be a duplicate removes its file only if no row uses it.

Notifications: an event's start is due once the event is known (start message, or an end that came
first: it carries the start too) and one of its frames or its clip is stored; its end once the end is
stored and the start went out (both in one list, start first, when they become due together). A
notification handed out stays pending until `mark_notified` records it, so it goes out once; `due()`
hands out again what a restart left unmarked. A notification carries the event as stored (EventRecord); the
message sent for it is cloud.notify's business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, and_, exists, not_, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from cloud.datasets import Datasets
from cloud.db import (
    Camera,
    Counter,
    Edge,
    Event,
    EventFrame,
    Fragment,
    Received,
    StoredFrame,
    begin_writing,
    thumbnail_of,
    utcnow,
)
from cloud.framestore import DiskFull, FrameStore
from common.fragment import FrameEntry, unpack
from common.protocol import EventHeader, FootageHeader, FragmentHeader, FrameHeader, Hello, Stats
from models import errors

log = logging.getLogger(__name__)

T = TypeVar("T")
Phase = Literal["start", "end"]
TRIES = 3  # a transaction that lost an insert race runs again; the second try finds the winner's row


@dataclass(frozen=True)
class EventRecord:
    """An event as stored when one of its notifications became due (cloud.notify makes the message of it)."""

    id: int
    uid: str
    edge: str
    camera: str
    filter: str
    start_frame: int
    end_frame: int | None
    start_time: float
    end_time: float | None
    peak_score: float
    started_at: datetime  # aware, UTC
    ended_at: datetime | None
    thumbnail: int | None  # the stored frame that shows it; None: only its clip does


@dataclass(frozen=True)
class Notification:
    phase: Phase
    event: EventRecord


@dataclass(frozen=True)
class Message:
    """A frame, event or stream-fragment message as an edge sent it."""

    edge: str
    header: FrameHeader | EventHeader | FragmentHeader | FootageHeader
    payload: bytes

    @property
    def key(self) -> tuple[str, int]:
        return self.edge, self.header.seq


Outcome = Literal["stored", "duplicate"] | Exception  # an exception: this message was not stored


@dataclass(frozen=True)
class Stored:
    """What `store_many` did: one outcome per message, in order, the notifications due after the commit and the
    datasets whose footage the batch completed (their files are rewritten after the commit)."""

    outcomes: list[Outcome]
    notifications: list[Notification]
    completed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Write:
    """A message ready for the batch transaction: its payload file is written, `work` adds its rows."""

    index: int
    path: str | None
    uids: list[str]  # the events whose notifications may become due once it is stored
    work: Callable[[Session], None]
    completed: list[str] = field(default_factory=list)  # a footage message: the dataset its rows completed


class _Duplicate(Exception):
    """The message's (edge, seq) is stored already."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether a store failed for lack of disk space, in the frame store (DiskFull) or in the database."""
    return isinstance(exc, DiskFull) or errors.is_disk_full(exc)


def transact(sessions: sessionmaker, work: Callable[[Session], T]) -> T:
    """work(session) in one transaction, run again when a concurrent insert of the same key got in first."""
    for _ in range(TRIES - 1):
        try:
            with sessions.begin() as session:
                return work(session)
        except IntegrityError:
            log.debug("a concurrent insert of the same key won; trying again")
    with sessions.begin() as session:
        return work(session)


def add_counter(session: Session, name: str, n: int) -> None:
    """Adds n to a persistent counter; UPDATE first, so concurrent adds are never lost."""
    if session.execute(update(Counter).where(Counter.name == name).values(value=Counter.value + n)).rowcount == 0:
        session.add(Counter(name=name, value=n))
        session.flush()


def _wall(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _claim(session: Session, edge: str, seq: int) -> None:
    session.add(Received(edge_id=edge, seq=seq))
    try:
        session.flush()
    except IntegrityError:
        raise _Duplicate from None


def _in_use(session: Session, path: str) -> bool:
    """Whether a row uses the payload file, this transaction's own uncommitted rows included."""
    return bool(
        session.scalar(select(exists().where(StoredFrame.path == path)))
        or session.scalar(select(exists().where(Event.clip_path == path)))
    )


def _share_image(session: Session, frame: StoredFrame) -> None:
    """A camera frame's image goes up once however many filters match it (edge/pipeline.py); a later match
    comes as its own row without one. Such a row takes the image an earlier row of the same frame holds (its
    fragment, else its JPEG file: size 0, the bytes count once); a row with a JPEG gives it to the rows of its
    frame stored before it without one (a full disk refused the JPEG first). Rows waiting for their fragment
    get it when the fragment is stored."""
    same = (
        StoredFrame.edge_id == frame.edge_id,
        StoredFrame.run == frame.run,
        StoredFrame.camera == frame.camera,
        StoredFrame.frame_index == frame.frame_index,
        StoredFrame.id != frame.id,
    )
    if frame.path is not None:
        session.execute(update(StoredFrame).where(*same, not_(StoredFrame.has_image)).values(path=frame.path))
        return
    holder = session.execute(
        select(StoredFrame.fragment_id, StoredFrame.path)
        .where(*same, StoredFrame.has_image)
        .order_by(StoredFrame.fragment_id.is_(None), StoredFrame.id)
        .limit(1)
    ).first()
    if holder is not None:
        frame.fragment_id = holder.fragment_id
        frame.path = None if holder.fragment_id is not None else holder.path


def _repeat_of(first: Outcome) -> Outcome:
    """The outcome of a message repeated within a batch: its first copy's failure, else a duplicate of it."""
    return first if isinstance(first, Exception) else "duplicate"


def _get_or_add(session: Session, model: type[T], key: object, **fields: Any) -> T:
    row = session.get(model, key)
    if row is None:
        row = model(**fields)
        session.add(row)
        session.flush()  # cameras reference their edge: the edge row must exist first
    return row


def _merge_event(event: Event, header: EventHeader, clip: str | None, clip_size: int) -> None:
    """Merges a start or end message into the event row; resends may bring them in either order."""
    info, at = header.event, _wall(header.wall_time)
    if info.peak_frame is not None and (event.peak_frame is None or info.peak_score >= event.peak_score):
        event.peak_frame = info.peak_frame
    event.peak_score = max(event.peak_score, info.peak_score)
    if header.phase == "start":
        event.start_frame, event.start_time, event.started_at = info.start_frame, info.start_time, at
        return
    if event.started_at is None:  # end before start: estimate the start's wall clock until the start arrives
        duration = max(0.0, (info.end_time or info.start_time) - info.start_time)
        event.start_frame, event.start_time, event.started_at = (
            info.start_frame,
            info.start_time,
            at - timedelta(seconds=duration),
        )
    event.end_frame, event.end_time, event.ended_at = info.end_frame, info.end_time, at
    if clip is not None:
        event.clip_path, event.clip_size = clip, clip_size


def _same_gop(row: Fragment) -> tuple[ColumnElement[bool], ...]:
    return (
        Fragment.edge_id == row.edge_id,
        Fragment.run == row.run,
        Fragment.camera == row.camera,
        Fragment.gop == row.gop,
    )


def _follows_its_gop(session: Session, row: Fragment) -> bool:
    """Whether every part of `row`'s GOP before it is stored and playable (so it decodes). A fragment without a
    part (an older edge) is taken as playable, as it was before parts existed."""
    if not row.part:
        return True
    return bool(
        session.scalar(select(exists().where(*_same_gop(row), Fragment.part == row.part - 1, Fragment.playable)))
    )


def _link_frames(session: Session, row: Fragment, entries: Sequence[FrameEntry]) -> None:
    """Point the stored frames whose pictures `row` holds at it."""
    session.execute(
        update(StoredFrame)
        .where(
            StoredFrame.edge_id == row.edge_id,
            StoredFrame.run == row.run,
            StoredFrame.camera == row.camera,
            StoredFrame.frame_index.in_([entry.index for entry in entries]),
            StoredFrame.fragment_id.is_(None),
        )
        .values(fragment_id=row.id)
    )


def _close_abandoned(session: Session, edge: str, run: str) -> list[int]:
    """Close the open events of the edge's runs other than `run` at their last stored frame (or their start);
    returns their ids. A late end message from that run still overwrites these guesses with the real end."""
    abandoned = session.scalars(
        select(Event).where(Event.edge_id == edge, Event.run != run, Event.ended_at.is_(None))
    ).all()
    for event in abandoned:
        last = session.execute(
            select(StoredFrame.frame_index, StoredFrame.stream_time, StoredFrame.captured_at)
            .join(EventFrame, EventFrame.frame_id == StoredFrame.id)
            .where(EventFrame.event_uid == event.uid)
            .order_by(StoredFrame.frame_index.desc())
            .limit(1)
        ).first()
        end = last or (event.start_frame, event.start_time, event.started_at)
        event.end_frame, event.end_time, event.ended_at = end
    return [event.id for event in abandoned]


def _extend_guessed_ends(session: Session, uids: list[str], frame: StoredFrame) -> None:
    """A frame of an event that ended before it: one _close_abandoned closed at the last frame stored when the edge
    restarted, whose run's later frames the restarted edge resends from its spool (after its hello). They move the
    guessed end on. (An edge's own end message comes after all of its event's frames.)"""
    if not uids:
        return
    ended_before = session.scalars(
        select(Event).where(Event.uid.in_(uids), Event.ended_at.is_not(None), Event.end_frame < frame.frame_index)
    )
    for event in ended_before:
        event.end_frame, event.end_time, event.ended_at = frame.frame_index, frame.stream_time, frame.captured_at


def _record(session: Session, event: Event) -> EventRecord:
    return EventRecord(**event.described(), thumbnail=session.scalar(select(thumbnail_of(event))))


class Storage:
    """Thread-safe: each call runs in its own session. `counts`: messages stored and duplicates seen (this process)."""

    def __init__(self, sessions: sessionmaker, store: FrameStore, datasets: Datasets | None = None) -> None:
        self._sessions = sessions
        self._store = store
        self._datasets = datasets  # None: footage is acknowledged and dropped (a store without datasets)
        self._lock = threading.Lock()  # guards _pending and counts
        self._pending: set[tuple[int, Phase]] = set()  # (event id, phase) handed out, not yet marked notified
        self.counts = {"stored": 0, "duplicates": 0}

    def store_frame(self, edge: str, header: FrameHeader, payload: bytes) -> list[Notification]:
        """Stores a matched frame and links it to its events; [] for a duplicate. Returns the notifications due."""
        return self._store_one(Message(edge, header, payload))

    def store_event(self, edge: str, header: EventHeader, payload: bytes) -> list[Notification]:
        """Stores an event start or end (an end's MP4 clip into the frame store); [] for a duplicate."""
        return self._store_one(Message(edge, header, payload))

    def store_many(self, messages: Sequence[Message]) -> Stored:
        """Stores frame and event messages in one transaction, a savepoint each: a duplicate or a message that
        fails (its file cannot be written, its rows cannot be added) costs only itself. Raises, having stored
        nothing, when the transaction as a whole fails. A message repeated within the batch gets the outcome of
        its first copy (a duplicate of it, or the same failure) and writes no file."""
        outcomes: list[Outcome | None] = [None] * len(messages)
        seen = self._seen({message.key for message in messages})
        first: dict[tuple[str, int], int] = {}
        writes: list[_Write] = []
        for index, message in enumerate(messages):
            if message.key in seen:
                outcomes[index] = "duplicate"
            elif message.key not in first:
                first[message.key] = index
                try:
                    writes.append(self._prepare(index, message))
                except Exception as exc:  # e.g. its payload file cannot be written: the others go on
                    outcomes[index] = exc
        if writes:
            with self._sessions.begin() as session:
                begin_writing(session)
                for write in writes:
                    outcomes[write.index] = self._apply(session, write)
        for index, message in enumerate(messages):
            if outcomes[index] is None:
                outcomes[index] = _repeat_of(outcomes[first[message.key]])
        for outcome in outcomes:
            if not isinstance(outcome, Exception):
                self._tally("stored" if outcome == "stored" else "duplicates")
        stored = [write for write in writes if outcomes[write.index] == "stored"]
        uids = sorted({uid for write in stored for uid in write.uids})
        completed = sorted({name for write in stored for name in write.completed})
        return Stored(outcomes, self._due_where(Event.uid.in_(uids)) if uids else [], completed)

    def _store_one(self, message: Message) -> list[Notification]:
        stored = self.store_many([message])
        if isinstance(outcome := stored.outcomes[0], Exception):
            raise outcome
        return stored.notifications

    def _prepare(self, index: int, message: Message) -> _Write:
        """Writes the message's payload file (fsync) and returns the work that adds its rows."""
        if isinstance(message.header, FrameHeader):
            return self._frame(index, message.edge, message.header, message.payload)
        if isinstance(message.header, FragmentHeader):
            return self._fragment(index, message.edge, message.header, message.payload)
        if isinstance(message.header, FootageHeader):
            return self._footage(index, message.edge, message.header, message.payload)
        return self._event(index, message.edge, message.header, message.payload)

    def _frame(self, index: int, edge: str, header: FrameHeader, payload: bytes) -> _Write:
        path = None
        if header.payload == "jpeg" and payload:
            path = self._store.write("frames", edge, header.camera, f"{header.run}-{header.seq}.jpg", payload)
        uids = sorted({f"{edge}/{header.run}/{event}" for event in header.events})

        def work(session: Session) -> None:
            _claim(session, edge, header.seq)
            frame = StoredFrame(
                edge_id=edge,
                seq=header.seq,
                run=header.run,
                camera=header.camera,
                frame_index=header.frame,
                stream_time=header.timestamp,
                captured_at=_wall(header.wall_time),
                scores=dict(header.scores),
                path=path,
                size=len(payload) if path else 0,
            )
            session.add(frame)
            session.flush()
            _share_image(session, frame)
            if not frame.has_image and header.payload == "none":
                frame.fragment_id = self._fragment_holding(session, frame)
            session.add_all(EventFrame(event_uid=uid, frame_id=frame.id) for uid in uids)
            _extend_guessed_ends(session, uids, frame)

        return _Write(index, path, uids, work)

    def _fragment(self, index: int, edge: str, header: FragmentHeader, payload: bytes) -> _Write:
        """The fragment's file and row; the frames it holds that are stored already (the edge sends a frame's
        message before its fragment) point at it; one that comes later finds it (`_fragment_holding`). A fragment
        stored without the parts of its GOP before it (a full edge spool dropped them) is kept but not playable:
        its frames get no image until the missing parts arrive (a resend), if ever."""
        stream = unpack(payload).header
        path = self._store.write("fragments", edge, header.camera, f"{header.run}-{header.seq}.frag", payload)

        def work(session: Session) -> None:
            _claim(session, edge, header.seq)
            row = Fragment(
                edge_id=edge,
                seq=header.seq,
                run=header.run,
                camera=header.camera,
                starts_gop=stream.frames[0].keyframe,
                gop=stream.gop,
                part=stream.part,
                first_frame=stream.frames[0].index,
                last_frame=stream.frames[-1].index,
                path=path,
                size=len(payload),
            )
            row.playable = _follows_its_gop(session, row)
            session.add(row)
            session.flush()
            if not row.playable:
                log.warning(
                    "camera %s of edge %s: stream fragment %d of GOP %d came before the one before it (resent later "
                    "after a lost connection, or dropped by the edge's full spool): its frames have no image until "
                    "that one arrives",
                    row.camera,
                    edge,
                    row.part,
                    row.gop,
                )
                return
            _link_frames(session, row, stream.frames)
            self._play_the_rest_of_its_gop(session, row)

        return _Write(index, path, [], work)

    def _play_the_rest_of_its_gop(self, session: Session, row: Fragment) -> None:
        """The later parts of `row`'s GOP that arrived before it (a resend) decode now: mark them playable and
        link their frames."""
        while row.part is not None:
            later = session.scalars(
                select(Fragment).where(*_same_gop(row), Fragment.part == row.part + 1, not_(Fragment.playable))
            ).first()
            if later is None:
                return
            try:
                entries = unpack(self._store.open_path(later.path).read_bytes()).header.frames
            except (OSError, errors.FilterForwardError) as exc:  # deleted by retention, or unreadable
                log.warning("stream fragment %s cannot be read (%s): its frames stay without image", later.path, exc)
                return
            later.playable = True
            _link_frames(session, later, entries)
            row = later

    def _fragment_holding(self, session: Session, frame: StoredFrame) -> int | None:
        """The stored fragment whose pictures include the frame's, for a frame message that arrives after its
        fragment: one lost with a crashed cloud's connection is resent when the edge's link notices the new
        connection, by which time the messages after it may have gone out on it. Its range narrows the search to
        one fragment (a stream's fragments do not overlap), its header says whether the frame is in it (a clip
        filter's match is not)."""
        candidate = session.scalars(
            select(Fragment)
            .where(
                Fragment.edge_id == frame.edge_id,
                Fragment.run == frame.run,
                Fragment.camera == frame.camera,
                Fragment.last_frame >= frame.frame_index,
            )
            .order_by(Fragment.last_frame)
            .limit(1)
        ).first()
        if candidate is None or candidate.first_frame > frame.frame_index or not candidate.playable:
            return None  # an unplayable one links its frames when it becomes playable
        try:
            entries = unpack(self._store.open_path(candidate.path).read_bytes()).header.frames
        except (OSError, errors.FilterForwardError) as exc:  # deleted by retention, or unreadable: no image
            log.warning("frame %d: fragment %s cannot be read (%s)", frame.frame_index, candidate.path, exc)
            return None
        return candidate.id if any(entry.index == frame.frame_index for entry in entries) else None

    def _footage(self, index: int, edge: str, header: FootageHeader, payload: bytes) -> _Write:
        """A frame of requested footage into its dataset (or the footage's end); dropped, acknowledged, when the
        dataset is gone."""
        datasets = self._datasets
        wanted = datasets is not None and datasets.write_footage_image(edge, header, payload)
        completed: list[str] = []

        def work(session: Session) -> None:
            _claim(session, edge, header.seq)
            name = datasets.footage_message(session, edge, header, payload) if wanted else None
            completed[:] = [name] if name else []  # assigned, not appended: a retried savepoint runs it again

        return _Write(index, None, [], work, completed)

    def _event(self, index: int, edge: str, header: EventHeader, payload: bytes) -> _Write:
        info = header.event
        uid = f"{edge}/{header.run}/{info.id}"
        clip = None
        if header.phase == "end" and header.payload == "mp4" and payload:
            clip = self._store.write("clips", edge, info.camera, f"{header.run}-{header.seq}.mp4", payload)

        def work(session: Session) -> None:
            _claim(session, edge, header.seq)
            event = session.scalar(select(Event).where(Event.uid == uid))
            if event is None:
                event = Event(
                    uid=uid,
                    edge_id=edge,
                    run=header.run,
                    filter=info.filter,
                    camera=info.camera,
                    peak_score=info.peak_score,
                )
                session.add(event)
            _merge_event(event, header, clip, len(payload))

        return _Write(index, clip, [uid], work)

    def _apply(self, session: Session, write: _Write) -> Outcome:
        """One message's rows in a savepoint of the batch transaction; a failure rolls back only them."""
        failure: Exception | None = None
        for _ in range(TRIES):
            try:
                with session.begin_nested():
                    write.work(session)
                return "stored"
            except _Duplicate:
                if write.path is not None and not _in_use(session, write.path):
                    self._store.delete(write.path)
                return "duplicate"
            except IntegrityError as exc:  # a concurrent insert of the same key won: the next try finds its row
                failure = exc
            except Exception as exc:  # costs this message only: the savepoint undid its rows
                return exc
        return failure

    def mark_notified(self, notification: Notification) -> None:
        """Records that a notification went out, so it is never handed out again (restarts included)."""
        event_id, phase = notification.event.id, notification.phase
        with self._sessions.begin() as session:
            session.execute(update(Event).where(Event.id == event_id).values({f"{phase}_notified": True}))
        with self._lock:
            self._pending.discard((event_id, phase))

    def due(self) -> list[Notification]:
        """Every notification due and never marked sent (a restart cut in between storing and sending)."""
        return self._due_where(not_(Event.start_notified) | (Event.ended_at.is_not(None) & not_(Event.end_notified)))

    def edge_hello(self, edge: str, hello: Hello, public_key: str | None) -> list[Notification]:
        """Records an edge's (re)start: its run, filter version, base model, key and camera list (cameras it
        dropped go).
        Events its earlier runs left open are closed (a killed edge never sends their ends): their end
        notifications are returned."""

        def work(session: Session) -> list[int]:
            now = utcnow()
            row = _get_or_add(session, Edge, edge, id=edge)
            row.run, row.filters_version, row.last_seen = hello.run, hello.filters_version, now
            row.base_model = hello.base_model.model_dump() if hello.base_model else None
            row.input_size = list(hello.input_size) if hello.input_size else None
            if public_key is not None:
                row.public_key = public_key
            for camera in session.scalars(select(Camera).where(Camera.edge_id == edge)):
                if camera.name not in hello.cameras:
                    session.delete(camera)
            for name in hello.cameras:
                _get_or_add(session, Camera, (edge, name), edge_id=edge, name=name).last_seen = now
            return _close_abandoned(session, edge, hello.run)

        closed = transact(self._sessions, work)
        if closed:
            log.info("edge %s restarted: closed %d event(s) its earlier run left open", edge, len(closed))
        return self._due_where(Event.id.in_(closed)) if closed else []

    def edge_seen(self, edge: str) -> None:
        self.edges_seen([edge])

    def edges_seen(self, edges: Iterable[str]) -> None:
        """Marks the edges seen now, in one transaction (the ingest's heartbeats of one loop pass)."""

        names = sorted(set(edges))  # in one order, so concurrent callers cannot deadlock

        def work(session: Session) -> None:
            now = utcnow()
            for edge in names:
                _get_or_add(session, Edge, edge, id=edge).last_seen = now

        transact(self._sessions, work)

    def edge_stats(self, edge: str, stats: Stats) -> None:
        """Keeps the edge's uplink stats and each camera's stats (REST /api/edges and /api/cameras show them)."""

        def work(session: Session) -> None:
            now = utcnow()
            row = _get_or_add(session, Edge, edge, id=edge)
            row.stats, row.last_seen = dict(stats.uplink), now
            for name, values in stats.cameras.items():
                camera = session.get(Camera, (edge, name))
                if camera is not None:  # named by its hello: stats add no camera (one message could add thousands)
                    camera.stats, camera.last_seen = dict(values), now

        transact(self._sessions, work)

    def forget_edge(self, edge: str) -> bool:
        """Removes the edge and its cameras (an edge gone for good: what it last reported decides no more which
        filters may be stored); its events and frames stay. Whether it was known. A hello brings it back."""

        def work(session: Session) -> bool:
            row = session.get(Edge, edge)
            if row is None:
                return False
            session.delete(row)  # its cameras go with it (ON DELETE CASCADE)
            return True

        return transact(self._sessions, work)

    def count(self, name: str, n: int = 1) -> None:
        transact(self._sessions, lambda session: add_counter(session, name, n))

    def _seen(self, keys: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """The (edge, seq) keys stored already: a cheap early answer for resends (no file is written for them);
        the Received key in the storing transaction is what decides."""
        by_edge: dict[str, list[int]] = {}
        for edge, seq in keys:
            by_edge.setdefault(edge, []).append(seq)
        if not by_edge:
            return set()
        condition = or_(*(and_(Received.edge_id == edge, Received.seq.in_(seqs)) for edge, seqs in by_edge.items()))
        with self._sessions() as session:
            return {
                (edge, seq) for edge, seq in session.execute(select(Received.edge_id, Received.seq).where(condition))
            }

    def _tally(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _due_where(self, condition: ColumnElement[bool]) -> list[Notification]:
        with self._lock, self._sessions() as session:
            events = session.scalars(select(Event).where(condition).order_by(Event.id)).all()
            return [notification for event in events for notification in self._due_for(session, event)]

    def _due_for(self, session: Session, event: Event) -> list[Notification]:
        """One event's notifications due now (lock held); marks them pending."""
        phases: list[Phase] = []
        start_out = event.start_notified or (event.id, "start") in self._pending
        has_payload = event.clip_path is not None or session.scalar(
            select(exists().where(EventFrame.event_uid == event.uid))
        )
        if not start_out and has_payload:
            phases.append("start")
            start_out = True
        if (
            start_out
            and event.ended_at is not None
            and not event.end_notified
            and (event.id, "end") not in self._pending
        ):
            phases.append("end")
        self._pending.update((event.id, phase) for phase in phases)
        if not phases:
            return []
        record = _record(session, event)
        return [Notification(phase, record) for phase in phases]
