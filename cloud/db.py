"""The cloud's relational schema (SQLAlchemy 2.0) and its engine: SQLite by default, PostgreSQL by URL.

Frame and clip payloads live on disk (cloud.framestore); rows hold their relative paths. Events and frames
are linked by the event's uid ("<edge>/<run>/<edge's event id>") rather than a foreign key, because a
frame may arrive before the start of its event when the edge resends after a reconnect.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.engine import Engine
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from cloud import migrations

WAL_TRIES = 100  # 50 ms apart


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime: SQLite hands back naive ones (stored as UTC), PostgreSQL aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class Filter(Base):
    """A registered filter: its spec (models.filterspec.FilterSpec as JSON) and its ONNX weights."""

    __tablename__ = "filters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[dict[str, Any]]
    onnx: Mapped[bytes] = mapped_column(LargeBinary)
    revision: Mapped[int] = mapped_column(Integer, doc="the filter-set version of its last change")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class FilterChange(Base):
    """The filter-set's change log: version n is the n-th change (put or delete), published to edges in order."""

    __tablename__ = "filter_changes"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(8))  # put | delete
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Edge(Base):
    __tablename__ = "edges"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run: Mapped[str] = mapped_column(String(64), default="")
    public_key: Mapped[str | None] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    filters_version: Mapped[int] = mapped_column(Integer, default=0)
    stats: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="the uplink part of its last stats message")
    base_model: Mapped[dict[str, Any] | None] = mapped_column(doc="the base DNN it runs (its last hello)")
    input_size: Mapped[list[int] | None] = mapped_column(JSON, doc="its base DNN's input [width, height]")


class Camera(Base):
    __tablename__ = "cameras"

    edge_id: Mapped[str] = mapped_column(ForeignKey("edges.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    stats: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="its part of the edge's last stats message")


class Fragment(Base):
    """About a second of a camera's matched-frame H.264 stream (common/fragment.py), stored once per (edge, seq).
    It decodes from the start of its GOP: the fragments of the same edge run and camera back to the last one
    that `starts_gop`."""

    __tablename__ = "fragments"
    __table_args__ = (
        UniqueConstraint("edge_id", "seq", name="uq_fragments_edge_seq"),
        Index("ix_fragments_stream", "edge_id", "run", "camera", "seq"),
        # The fragment that holds a frame whose message came after it (cloud.storage).
        Index("ix_fragments_stream_last_frame", "edge_id", "run", "camera", "last_frame"),
        Index("ix_fragments_stream_gop", "edge_id", "run", "camera", "gop", "part"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    edge_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[str] = mapped_column(String(64))
    camera: Mapped[str] = mapped_column(String(64))
    starts_gop: Mapped[bool] = mapped_column(Boolean)
    gop: Mapped[int | None] = mapped_column(BigInteger, doc="its GOP's number in the stream (None: an older edge)")
    part: Mapped[int | None] = mapped_column(Integer, doc="its place in the GOP, 0 holding the keyframe")
    playable: Mapped[bool] = mapped_column(
        Boolean, default=True, server_default=true(), doc="every part of its GOP before it is stored: it decodes"
    )
    first_frame: Mapped[int] = mapped_column(BigInteger)
    last_frame: Mapped[int] = mapped_column(BigInteger)
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    path: Mapped[str] = mapped_column(String(255), doc="the packed fragment, relative to the frame store root")
    size: Mapped[int] = mapped_column(Integer)


class StoredFrame(Base):
    """A matched frame, stored once per (edge, seq) however often it arrives."""

    __tablename__ = "frames"
    __table_args__ = (
        UniqueConstraint("edge_id", "seq", name="uq_frames_edge_seq"),
        Index("ix_frames_camera_received", "camera", "received_at"),
        # The rows of one camera frame (a frame matched by several filters; the frames a fragment holds).
        Index("ix_frames_stream_index", "edge_id", "run", "camera", "frame_index"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    edge_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[str] = mapped_column(String(64))
    camera: Mapped[str] = mapped_column(String(64))
    frame_index: Mapped[int] = mapped_column(BigInteger)
    stream_time: Mapped[float] = mapped_column(Float)
    captured_at: Mapped[datetime] = mapped_column(doc="the edge's wall clock when it processed the frame")
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    scores: Mapped[dict[str, Any]]
    path: Mapped[str | None] = mapped_column(String(255), doc="payload file relative to the frame store root")
    size: Mapped[int] = mapped_column(Integer, default=0)
    fragment_id: Mapped[int | None] = mapped_column(
        ForeignKey("fragments.id", ondelete="SET NULL", name="fk_frames_fragment_id"),
        index=True,
        doc="the stream fragment holding its image",
    )

    @hybrid_property
    def has_image(self) -> bool:
        """Its JPEG is stored, or can be decoded from its stream fragment."""
        return self.path is not None or self.fragment_id is not None

    @has_image.inplace.expression
    @classmethod
    def _has_image_expression(cls) -> ColumnElement[bool]:
        return or_(cls.path.is_not(None), cls.fragment_id.is_not(None))


class Event(Base):
    """An event of one filter on one camera, as the edge's smoother reported it (end fields None while open)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_filter_camera_start", "filter", "camera", "started_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    uid: Mapped[str] = mapped_column(String(300), unique=True)  # <edge>/<run>/<edge's event id>
    edge_id: Mapped[str] = mapped_column(String(64))
    run: Mapped[str] = mapped_column(String(64))
    filter: Mapped[str] = mapped_column(String(64))
    camera: Mapped[str] = mapped_column(String(64))
    start_frame: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[float] = mapped_column(Float, doc="stream time")
    end_frame: Mapped[int | None] = mapped_column(BigInteger)
    end_time: Mapped[float | None] = mapped_column(Float)
    peak_score: Mapped[float] = mapped_column(Float)
    peak_frame: Mapped[int | None] = mapped_column(BigInteger, doc="the frame with the peak score: the thumbnail")
    started_at: Mapped[datetime] = mapped_column(doc="the edge's wall clock at the event start")
    ended_at: Mapped[datetime | None]
    clip_path: Mapped[str | None] = mapped_column(String(255))
    clip_size: Mapped[int] = mapped_column(Integer, default=0)
    start_notified: Mapped[bool] = mapped_column(Boolean, default=False)
    end_notified: Mapped[bool] = mapped_column(Boolean, default=False)

    def described(self) -> dict[str, Any]:
        """What the API and the notifications say of it: its own columns under their public names, times in UTC."""
        return {
            "id": self.id,
            "uid": self.uid,
            "edge": self.edge_id,
            "camera": self.camera,
            "filter": self.filter,
            "start_frame": self.start_frame,
            "end_frame": self.end_frame,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "peak_score": self.peak_score,
            "started_at": as_utc(self.started_at),
            "ended_at": as_utc(self.ended_at) if self.ended_at else None,
        }


class EventFrame(Base):
    """Which stored frames belong to which events (by event uid: see the module doc)."""

    __tablename__ = "event_frames"

    event_uid: Mapped[str] = mapped_column(String(300), primary_key=True)
    frame_id: Mapped[int] = mapped_column(ForeignKey("frames.id", ondelete="CASCADE"), primary_key=True, index=True)


def thumbnail_of(of: type[Event] | Event) -> ColumnElement[int]:
    """The id of an event's thumbnail frame: its peak-score frame if that has an image, else its first with one.
    Given the Event class it correlates with the enclosing query's events; given a row, it stands alone.
    (Two subqueries rather than one ordered by "is the peak": SQLite cannot see the outer row in ORDER BY.)"""
    frames = (
        select(StoredFrame.id)
        .join(EventFrame, EventFrame.frame_id == StoredFrame.id)
        .where(EventFrame.event_uid == of.uid, StoredFrame.has_image)
    )
    peak = frames.where(StoredFrame.frame_index == of.peak_frame).order_by(StoredFrame.id).limit(1)
    first = frames.order_by(StoredFrame.frame_index, StoredFrame.id).limit(1)
    return func.coalesce(peak.scalar_subquery(), first.scalar_subquery())


class Dataset(Base):
    """A labelled dataset kept by the cloud (docs/datasets.md's folder under data_dir/datasets/<name>): footage an
    edge camera recorded on request, or an uploaded clip. Its labels are Label rows, written to labels.csv as they
    change, so the CLI reads the folder as it is."""

    __tablename__ = "datasets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(String(16), doc="footage | upload")
    edge_id: Mapped[str | None] = mapped_column(String(64))
    camera: Mapped[str | None] = mapped_column(String(64))
    request: Mapped[str | None] = mapped_column(
        String(64), unique=True, doc="footage: the request's id at the edge (a name deleted and reused gets another)"
    )
    every: Mapped[float] = mapped_column(Float, default=0.0, doc="footage: seconds between frames (0: every frame)")
    duration: Mapped[float] = mapped_column(Float, default=0.0, doc="footage: seconds of stream time covered")
    max_frames: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), doc="requested | recording | complete | refused")
    message: Mapped[str] = mapped_column(Text, default="", doc="why it was refused, or what its footage lacks")
    frames: Mapped[int] = mapped_column(Integer, default=0, doc="frames stored")
    expected: Mapped[int | None] = mapped_column(Integer, doc="frames the edge recorded (known when it is done)")
    fps: Mapped[float] = mapped_column(Float, default=0.0, doc="the frame rate training assumes")
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    regions: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="event -> polygon [[x, y], ...] or null")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class DatasetFrame(Base):
    """One frame of a dataset: its number in the dataset (its image is images/<number>.jpg) and where it came from."""

    __tablename__ = "dataset_frames"
    # A stored frame joins a dataset once (feedback from the event gallery); the index also serves its foreign key.
    __table_args__ = (UniqueConstraint("source_frame_id", "dataset", name="uq_dataset_frames_source"),)

    dataset: Mapped[str] = mapped_column(ForeignKey("datasets.name", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    camera_frame: Mapped[int] = mapped_column(BigInteger, doc="the frame index in the camera's (or clip's) stream")
    timestamp: Mapped[float] = mapped_column(Float, doc="stream time in seconds")
    source_frame_id: Mapped[int | None] = mapped_column(
        ForeignKey("frames.id", ondelete="SET NULL", name="fk_dataset_frames_source_frame_id"),
        doc="the stored (matched) frame it was copied from: feedback on an event or a missed interval",
    )
    run: Mapped[str | None] = mapped_column(String(64), doc="footage: the edge run it was recorded in")


class Label(Base):
    """One frame's label for one event of a dataset: 1 (it happens), 0 (it does not) or -1 (uncertain)."""

    __tablename__ = "labels"

    dataset: Mapped[str] = mapped_column(ForeignKey("datasets.name", ondelete="CASCADE"), primary_key=True)
    event: Mapped[str] = mapped_column(String(64), primary_key=True)
    frame_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class TrainingJob(Base):
    """A filter to train on a dataset's event, taken by a trainer service (queued -> running -> done | failed); a
    running job whose trainer stops renewing its lease goes back to the queue."""

    __tablename__ = "training_jobs"
    __table_args__ = (Index("ix_training_jobs_status_created", "status", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # A deleted dataset leaves its jobs (a filter's revisions, to roll back to) without it: NULL.
    dataset: Mapped[str | None] = mapped_column(
        ForeignKey("datasets.name", ondelete="SET NULL", name="fk_training_jobs_dataset"), index=True
    )
    event: Mapped[str] = mapped_column(String(64))
    filter_name: Mapped[str] = mapped_column(String(64), doc="the filter it makes (a new revision if it exists)")
    options: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="training options the trainer passes on")
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="the trainer's last report")
    trainer: Mapped[str | None] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None]
    error: Mapped[str] = mapped_column(Text, default="")
    result: Mapped[dict[str, Any] | None] = mapped_column(doc="validation estimate and example frames")
    spec: Mapped[dict[str, Any] | None] = mapped_column(doc="the trained filter's spec")
    onnx: Mapped[bytes | None] = mapped_column(LargeBinary)
    deployed: Mapped[bool] = mapped_column(Boolean, default=False)
    deployed_at: Mapped[datetime | None] = mapped_column(doc="its last deployment (the filter runs the last one)")
    camera: Mapped[str | None] = mapped_column(String(64), doc="the camera its dataset's footage came from, if any")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Received(Base):
    """The (edge, seq) of every stored frame and event message: the key that makes storing idempotent
    (one seq space per edge); retention prunes rows older than a week."""

    __tablename__ = "received"

    edge_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Counter(Base):
    """Persistent counters (ingest refusals, retention deletions, ...) for /api/stats and /metrics."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)
    note: Mapped[str] = mapped_column(Text, default="")


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL, its schema migrated to the newest revision (cloud.migrations: a
    FilterForwardError if that cannot be done); SQLite gets WAL and foreign keys on."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    is_sqlite = url.startswith("sqlite")
    engine = create_engine(
        url,
        pool_pre_ping=True,
        connect_args={"check_same_thread": False, "timeout": 30} if is_sqlite else {},
    )
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    migrations.upgrade(engine)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Of connections switching a new file to WAL at once (racing start-ups), SQLite fails some at once, without
    # the busy timeout (waiting could deadlock); the mode is kept in the file, so a retry soon finds it done.
    for attempt in range(WAL_TRIES):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or attempt == WAL_TRIES - 1:
                raise
            time.sleep(0.05)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def begin_writing(session: Session) -> None:
    """Opens the transaction on SQLite now: pysqlite defers BEGIN to the first INSERT, so a SAVEPOINT before it
    would start (and its RELEASE commit) a transaction of its own. IMMEDIATE takes the write lock at once, so
    the transaction never has to upgrade a stale read. PostgreSQL needs nothing."""
    if session.get_bind().dialect.name == "sqlite":
        session.connection().exec_driver_sql("BEGIN IMMEDIATE")
