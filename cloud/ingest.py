"""The cloud's ZeroMQ side: a ROUTER the edges' uplinks talk to, and a PUB that sends them filter changes.

One thread runs a poll loop (ZeroMQ guide style) over the ROUTER: it decodes each message (common.protocol),
checks that the edge it names is the one CURVE authenticated (the ZAP handler sets the connection's User-Id
to the edge id), then stores the frames and events of one loop pass together (Storage.store_many: one
transaction), hands out the notifications that became due and acknowledges the stored seqs, one Ack per edge
per pass, then answers the pass's heartbeats (writing each edge's last_seen once). It answers snapshot requests
from the database (the Clone pattern), and every 0.1 s publishes the FilterChange rows newer than the last one
it published, in version order.

A message that cannot be decoded or names another edge is counted, answered with Error and dropped; a
message that fails to store, or every message of a pass whose transaction fails as a whole, is logged and not
acknowledged (the edge sends it again). A full disk (frame store or database) is such a failure too: counted
as "disk_full", logged once per episode, and it asks for an early retention sweep (`on_disk_full`); the edges
keep their messages spooled until there is room. Nothing stops the loop.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
from pydantic import ValidationError
from sqlalchemy import func, select, true
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from cloud.config import CloudConfig
from cloud.db import Filter, FilterChange
from cloud.storage import Message, Notification, Storage, is_disk_full
from cloud.zap import PUBLIC_KEY_PROPERTY, ZapHandler
from common.curve import make_server
from common.protocol import (
    ID_PATTERN,
    MAX_PAYLOAD_BYTES,
    TOPIC,
    Ack,
    Error,
    EventHeader,
    FilterUpdate,
    FrameHeader,
    Heartbeat,
    Hello,
    ProtocolError,
    SnapshotEnd,
    SnapshotRequest,
    Stats,
    decode,
    encode,
)
from models.errors import FilterForwardError
from models.filterspec import FilterSpec

log = logging.getLogger(__name__)

COUNTS = (
    "received",  # messages read from the ROUTER
    "stored",  # frame and event messages stored for the first time
    "duplicates",  # frame and event messages stored before (acknowledged again)
    "malformed",  # messages that do not follow the protocol
    "unauthenticated",  # refused CURVE handshakes and messages naming another edge than their key's
    "failed",  # messages whose handling failed, e.g. a database error (not acknowledged: the edge resends)
    "disk_full",  # messages not stored for lack of disk space (not acknowledged either)
    "acked",  # seqs acknowledged
    "heartbeats",  # edge heartbeats answered
    "snapshots",  # snapshot requests answered
    "published",  # filter changes published
    "notified",  # event notifications handed to notify()
)
PERSISTED = frozenset({"malformed", "unauthenticated"})  # refusals also go to the database's Counter rows
PUBLISH_INTERVAL = 0.1  # seconds between polls of the FilterChange table
SAVE_INTERVAL = 1.0  # seconds between writes of the refusal counters
BATCH = 256  # messages handled per loop pass before the acks go out
HEADER_ROOM = 1024 * 1024  # bytes allowed for any message part but a payload (headers are a few hundred)


class _Refused(Exception):
    """A well-formed message from an edge that may not send it (its key belongs to another edge)."""


@dataclass
class _Pass:
    """What one loop pass collects: the frame and event messages to store and the heartbeats to answer, each with
    its sender's identity."""

    messages: list[tuple[bytes, Message]] = field(default_factory=list)
    heartbeats: list[tuple[bytes, str]] = field(default_factory=list)


class Ingest:
    def __init__(
        self,
        config: CloudConfig,
        storage: Storage,
        sessions: sessionmaker,
        notify: Callable[[Notification], None],
        on_disk_full: Callable[[], None] | None = None,
    ) -> None:
        self._config = config.zmq
        self._storage = storage
        self._sessions = sessions
        self._notify = notify
        self._on_disk_full = on_disk_full  # asks for a retention sweep now
        self._disk_full = False  # in a full-disk episode: logged at its start and end only
        self.session_id = secrets.token_hex(8)  # the edges see it change when the cloud restarts
        self.counts = dict.fromkeys(COUNTS, 0)
        self._lock = threading.Lock()  # guards counts: the ZAP thread counts refusals
        self._unsaved: Counter[str] = Counter()  # persisted counts not yet written to the database
        self._logged: set[tuple[str, ...]] = set()  # refusal log lines already written (once per peer and reason)
        self._published = 0  # the last FilterChange version published
        self._publish_failing = False
        self._stop = threading.Event()
        self._context: zmq.Context | None = None
        self._zap: ZapHandler | None = None
        self._sockets: list[zmq.Socket] = []
        self._ports = (0, 0)
        self._thread: threading.Thread | None = None

    @property
    def ports(self) -> tuple[int, int]:
        """(ingest, publish) ports actually bound: the configured ones, or the free ones picked for port 0."""
        return self._ports

    def start(self) -> None:
        """Binds both sockets (CURVE servers with the edge allow-list unless insecure) and starts the loop."""
        self._context = zmq.Context()
        try:
            if not self._config.insecure:
                self._zap = ZapHandler(self._context, self._config.edge_keys, self._count)
                self._zap.start()  # before the binds: a CURVE handshake without a ZAP handler would pass
            self._router, ingest_port = self._bind(zmq.ROUTER, self._config.ingest_port, "ingest_port")
            self._pub, publish_port = self._bind(zmq.PUB, self._config.publish_port, "publish_port")
            self._ports = (ingest_port, publish_port)
            self._published = self._latest_version()  # publish changes from now on; snapshots cover the past
        except BaseException:
            self._close()
            raise
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self._thread.start()
        log.info("ingest session %s (%s)", self.session_id, "insecure" if self._config.insecure else "CURVE")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._close()
        self._save_counts()

    def _close(self) -> None:
        for socket in self._sockets:
            socket.close(linger=0)
        self._sockets.clear()
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def _bind(self, kind: int, port: int, setting: str) -> tuple[zmq.Socket, int]:
        socket = self._context.socket(kind)
        socket.linger = 0
        # A peer sending a larger message part is disconnected before it is buffered (the PUB socket only ever
        # receives subscriptions).
        socket.maxmsgsize = MAX_PAYLOAD_BYTES + HEADER_ROOM if kind == zmq.ROUTER else HEADER_ROOM
        self._sockets.append(socket)
        if not self._config.insecure:
            make_server(socket, self._config.secret_key)
        address = f"tcp://{self._config.bind}:{port or '*'}"
        try:
            socket.bind(address)
        except zmq.ZMQError as exc:
            raise FilterForwardError(
                f"cannot bind zmq.{setting} to {address} ({exc}): pick a free port or stop what is using it"
            ) from None
        return socket, int(socket.last_endpoint.rsplit(b":", 1)[1])

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n
            if name in PERSISTED:
                self._unsaved[name] += n

    def _save_counts(self) -> None:
        """Add the refusals counted since the last call to the database counters: one write per counter and
        interval however many handshakes a flood of unknown keys makes."""
        with self._lock:
            unsaved, self._unsaved = self._unsaved, Counter()
        for name, n in unsaved.items():
            try:
                self._storage.count(name, n)
            except SQLAlchemyError as exc:
                log.error("could not add %d to the %s counter in the database (retrying): %s", n, name, exc)
                with self._lock:
                    self._unsaved[name] += n

    def _log_once(self, key: tuple[str, ...], message: str, *args: object) -> None:
        """A refused sender usually repeats itself: one log line per (peer, reason) is enough."""
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    # The loop thread: everything below runs in it and only it touches the sockets.

    def _run(self) -> None:
        self._guarded(self._notify_pending)
        next_publish = next_save = time.monotonic()
        while not self._stop.is_set():
            wait_ms = math.ceil(max(0.0, next_publish - time.monotonic()) * 1000)
            if self._router.poll(wait_ms):
                self._drain()
            if time.monotonic() >= next_publish:
                self._publish_changes()
                next_publish = time.monotonic() + PUBLISH_INTERVAL
            if time.monotonic() >= next_save:
                self._save_counts()
                next_save = time.monotonic() + SAVE_INTERVAL

    def _notify_pending(self) -> None:
        """The notifications a restart left between storing and sending."""
        self._hand_out(self._storage.due())

    def _drain(self) -> None:
        """Handles up to BATCH waiting messages, stores their frames and events in one transaction, then sends
        each edge one Ack for its seqs stored (or stored before)."""
        batch = _Pass()
        for _ in range(BATCH):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._handle(frames[0].bytes, frames[1:], batch)
        acks: dict[bytes, list[int]] = defaultdict(list)
        for identity, seq in self._store(batch.messages):
            acks[identity].append(seq)
        for identity, seqs in acks.items():
            self._count("acked", len(seqs))  # counts go before replies, so whoever got the reply sees them
            self._send(identity, Ack(seqs=seqs))
        self._answer_heartbeats(batch.heartbeats)

    def _handle(self, identity: bytes, frames: Sequence[zmq.Frame], batch: _Pass) -> None:
        """One message: answered now, or (a frame or event) added to the pass's batch."""
        self._count("received")
        peer = _property(frames[0], "Peer-Address") or "?"
        try:
            header, payload = decode([frame.bytes for frame in frames])
            edge = self._sender(frames[0], header)
        except ProtocolError as exc:
            self._count("malformed")
            self._log_once(("malformed", peer), "malformed message from %s, dropped: %s", peer, exc)
            self._send(identity, Error(message=f"malformed message, dropped: {exc}"))
            return
        except _Refused as exc:
            self._count("unauthenticated")
            self._log_once(("refused", peer, str(exc)), "message from %s refused: %s", peer, exc)
            self._send(identity, Error(message=f"refused: {exc}"))
            return
        self._guarded(self._dispatch, identity, frames[0], edge, header, payload, batch)

    def _sender(self, frame: zmq.Frame, header: Any) -> str:
        """The edge that sent the message: the CURVE-authenticated id, which must be the id the header names."""
        claimed = header.sender if isinstance(header, Heartbeat) else getattr(header, "edge", None)
        if claimed is None:
            raise ProtocolError(f"a {header.type!r} message goes from the cloud to edges, not the other way")
        if not re.fullmatch(ID_PATTERN, claimed):
            raise ProtocolError(f"heartbeat sender {claimed[:64]!r} is not an edge id")
        if self._config.insecure:
            return claimed
        authenticated = _property(frame, "User-Id")
        if claimed != authenticated:
            raise _Refused(
                f"this connection's key belongs to edge {authenticated!r} but the message is from {claimed!r}: "
                f"set edge_id: {authenticated} in that edge's config, or give it {claimed}'s keypair"
            )
        return claimed

    def _dispatch(
        self, identity: bytes, frame: zmq.Frame, edge: str, header: Any, payload: bytes, batch: _Pass
    ) -> None:
        match header:
            case FrameHeader() | EventHeader():
                batch.messages.append((identity, Message(edge, header, payload)))
            case Heartbeat():
                batch.heartbeats.append((identity, edge))
            case Hello():
                public_key = None if self._config.insecure else _property(frame, PUBLIC_KEY_PROPERTY)
                self._hand_out(self._storage.edge_hello(edge, header, public_key))
            case Stats():
                self._storage.edge_stats(edge, header)
            case SnapshotRequest():
                self._send_snapshot(identity)

    def _store(self, messages: list[tuple[bytes, Message]]) -> list[tuple[bytes, int]]:
        """Stores the pass's frames and events in one transaction, then hands out the notifications it made due;
        returns (identity, seq) for each one to acknowledge: stored now or before. Nothing when the transaction
        fails."""
        if not messages:
            return []
        try:
            stored = self._storage.store_many([message for _, message in messages])
        except Exception as exc:  # nothing of the pass was stored: every edge resends
            self._failed(exc, "storing a batch", len(messages))
            return []
        acks = []
        for (identity, message), outcome in zip(messages, stored.outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._failed(outcome, f"storing seq {message.header.seq} of {message.edge}")
                continue
            self._count("stored" if outcome == "stored" else "duplicates")
            if self._disk_full and message.payload:  # a message without a file says nothing about the room
                self._disk_full = False
                log.info("ingest: storing again; the edges resend what was refused for lack of space")
            acks.append((identity, message.header.seq))
        self._hand_out(stored.notifications)
        return acks

    def _answer_heartbeats(self, heartbeats: list[tuple[bytes, str]]) -> None:
        """Answered after the pass's store, so a reply also says that what came before it was handled; each edge's
        last_seen is written once per pass."""
        if not heartbeats:
            return
        self._count("heartbeats", len(heartbeats))
        for identity, _ in heartbeats:
            self._send(identity, Heartbeat(sender=self.session_id))
        self._guarded(self._storage.edges_seen, {edge for _, edge in heartbeats})

    def _hand_out(self, notifications: list[Notification]) -> None:
        for notification in notifications:
            self._guarded(self._notify_once, notification)

    def _notify_once(self, notification: Notification) -> None:
        self._notify(notification)
        self._storage.mark_notified(notification)
        self._count("notified")

    def _guarded(self, work: Callable[..., Any], *args: Any) -> Any:
        """work(*args), or None when it fails: the failure is logged and counted, the loop goes on."""
        try:
            return work(*args)
        except Exception as exc:  # a storage or notify failure must cost one message, never the ingest
            self._failed(exc, work.__name__)
            return None

    def _failed(self, exc: Exception, what: str, n: int = 1) -> None:
        """Counts n messages that failed (or found no room), and logs why."""
        if is_disk_full(exc):
            self._disk_full_now(exc, n)
            return
        self._count("failed", n)
        log.error("ingest: %s failed (a frame or event stays unacknowledged: its edge resends it)", what, exc_info=exc)

    def _disk_full_now(self, exc: Exception, n: int = 1) -> None:
        self._count("disk_full", n)
        if self._disk_full:
            return
        self._disk_full = True
        log.error(
            "ingest: %s; nothing is acknowledged until there is room (the edges keep their messages spooled and "
            "resend them)%s",
            getattr(exc, "orig", None) or exc,
            "; running a retention sweep now" if self._on_disk_full else "",
        )
        if self._on_disk_full is not None:
            self._on_disk_full()

    def _send(self, identity: bytes, header: Any, payload: bytes = b"") -> None:
        # ROUTER drops what it cannot route (edge gone, queue full): the edge resends or asks again
        self._router.send_multipart([identity, *encode(header, payload)])

    def _send_snapshot(self, identity: bytes) -> None:
        """Every current filter, then the version they reflect: read in one statement, so they agree."""
        latest = select(func.coalesce(func.max(FilterChange.version), 0).label("version")).subquery()
        query = select(latest.c.version, Filter).select_from(latest).outerjoin(Filter, true()).order_by(Filter.name)
        with self._sessions() as session:
            rows = session.execute(query).all()
        for _, row in rows:
            if row is not None and (spec := _spec(row)) is not None:
                self._send(
                    identity, FilterUpdate(version=row.revision, action="put", name=row.name, spec=spec), row.onnx
                )
        self._count("snapshots")
        self._send(identity, SnapshotEnd(version=rows[0][0]))

    def _latest_version(self) -> int:
        with self._sessions() as session:
            return session.scalar(select(func.coalesce(func.max(FilterChange.version), 0)))

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
            if not self._publish_failing:  # once per outage: this runs ten times a second
                log.error("cannot read filter changes, retrying until the database answers: %s", exc)
            self._publish_failing = True
            return
        if self._publish_failing:
            log.info("reading filter changes again")
            self._publish_failing = False
        for change, row in rows:
            spec = _spec(row) if change.action == "put" and row is not None else None
            if spec is None:
                # a delete, a put whose filter is gone by now (a later delete follows) or whose stored spec is
                # invalid (logged): sent as a delete, so the versions stay contiguous (edges resnapshot at a gap)
                header, payload = FilterUpdate(version=change.version, action="delete", name=change.name), b""
            else:
                header, payload = FilterUpdate(version=change.version, action="put", name=row.name, spec=spec), row.onnx
            self._pub.send_multipart([TOPIC, *encode(header, payload)])
            self._published = change.version
            self._count("published")
            log.info("published filter change %d: %s %s", change.version, header.action, change.name)


def _property(frame: zmq.Frame, name: str) -> str | None:
    """A connection property of a received frame (User-Id, Peer-Address, ZAP metadata), None if it has none."""
    try:
        return frame.get(name)
    except zmq.ZMQError:
        return None


def _spec(row: Filter) -> FilterSpec | None:
    try:
        return FilterSpec.model_validate(row.spec)
    except ValidationError as exc:
        log.error("filter %s has an invalid stored spec, not sent to edges: %s", row.name, exc)
        return None
