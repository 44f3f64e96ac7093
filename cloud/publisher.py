"""Filter distribution, the cloud's half of the ZeroMQ guide's Clone pattern: the PUB socket that sends every
filter change to the edges, and the snapshot the ingest answers an edge's request with (on its ROUTER).

The registry wakes the publisher once it has committed a change (`wake`), and the publisher then sends every
FilterChange row newer than the last one it sent, in version order: a change goes out at once, not at the next
poll. Without a wake-up it still looks every `poll` seconds, only as a safety net for changes it is not told
about: those made by another process on the same database.
"""

from __future__ import annotations

import logging
import threading

import zmq
from pydantic import ValidationError
from sqlalchemy import func, select, true
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from cloud.config import ZmqConfig
from cloud.db import Filter, FilterChange
from cloud.sockets import HEADER_ROOM, bind_server
from common.protocol import TOPIC, FilterUpdate, SnapshotEnd, encode
from models.filterspec import FilterSpec

log = logging.getLogger(__name__)

POLL = 5.0  # seconds between looks at the change log without a wake-up (changes by other processes)
Update = tuple[FilterUpdate, bytes]


class Publisher:
    """Publishes filter changes on a PUB socket from a thread of its own, woken by the registry."""

    def __init__(self, config: ZmqConfig, sessions: sessionmaker, wake: threading.Event, poll: float = POLL) -> None:
        self._config = config
        self._sessions = sessions
        self._wake = wake  # set by the registry after each committed change
        self._poll = poll
        self.counts = {"published": 0}
        self._published = 0  # the last FilterChange version published
        self._failing = False  # in a database outage: logged at its start and end only
        self._stop = threading.Event()
        self._pub: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, context: zmq.Context) -> None:
        """Bind the PUB socket in `context` (the ingest's, whose ZAP handler checks the edges' keys for every CURVE
        socket in it) and start publishing changes from now on: the snapshots cover the past."""
        self._published = latest_version(self._sessions)
        port = self._config.publish_port
        self._pub, self.port = bind_server(context, self._config, zmq.PUB, port, "publish_port", HEADER_ROOM)
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop publishing and close the socket (before the context it lives in is terminated)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._pub is not None:
            self._pub.close(linger=0)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._poll)
            self._wake.clear()  # before reading: a change committed from now on sets it again
            if self._stop.is_set():
                return
            self._publish_changes()

    def _publish_changes(self) -> None:
        query = (
            select(FilterChange, Filter)
            .outerjoin(Filter, Filter.name == FilterChange.name)
            .where(FilterChange.version > self._published)
            .order_by(FilterChange.version)
        )
        try:
            with self._sessions() as session:
                rows = session.execute(query).all()
        except SQLAlchemyError as exc:
            if not self._failing:
                log.error("cannot read filter changes, retrying until the database answers: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("reading filter changes again")
            self._failing = False
        for change, row in rows:
            header, payload = _change(change, row)
            self._pub.send_multipart([TOPIC, *encode(header, payload)])
            self._published = change.version
            self.counts["published"] += 1
            log.info("published filter change %d: %s %s", change.version, header.action, change.name)


def snapshot(sessions: sessionmaker) -> tuple[list[Update], SnapshotEnd]:
    """Every current filter, and the version they reflect: read in one statement, so they agree."""
    latest = select(func.coalesce(func.max(FilterChange.version), 0).label("version")).subquery()
    query = select(latest.c.version, Filter).select_from(latest).outerjoin(Filter, true()).order_by(Filter.name)
    with sessions() as session:
        rows = session.execute(query).all()
    updates = [
        (FilterUpdate(version=row.revision, action="put", name=row.name, spec=spec), row.onnx)
        for _, row in rows
        if row is not None and (spec := stored_spec(row)) is not None
    ]
    return updates, SnapshotEnd(version=rows[0][0])


def latest_version(sessions: sessionmaker) -> int:
    with sessions() as session:
        return session.scalar(select(func.coalesce(func.max(FilterChange.version), 0)))


def _change(change: FilterChange, row: Filter | None) -> Update:
    """The message of one change: a put with the filter as it is now, or a delete."""
    spec = stored_spec(row) if change.action == "put" and row is not None else None
    if spec is None:
        # a delete, a put whose filter is gone by now (a later delete follows) or whose stored spec is invalid
        # (logged): sent as a delete, so the versions stay contiguous (edges resnapshot at a gap)
        return FilterUpdate(version=change.version, action="delete", name=change.name), b""
    return FilterUpdate(version=change.version, action="put", name=row.name, spec=spec), row.onnx


def stored_spec(row: Filter) -> FilterSpec | None:
    try:
        return FilterSpec.model_validate(row.spec)
    except ValidationError as exc:
        log.error("filter %s has an invalid stored spec, not sent to edges: %s", row.name, exc)
        return None
