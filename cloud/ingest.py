"""The cloud's ZeroMQ ingest: the ROUTER the edges' links talk to (filter changes go out on cloud.publisher's PUB).

One thread runs a poll loop (ZeroMQ guide style) over the ROUTER: it decodes each message (common.protocol),
checks that the edge it names is the one CURVE authenticated (the ZAP handler sets the connection's User-Id
to the edge id), then stores the frames and events of one loop pass together (Storage.store_many: one
transaction), hands out the notifications that became due and acknowledges the stored seqs, one Ack per edge
per pass, then answers the pass's heartbeats (writing each edge's last_seen once). It answers snapshot requests
(the Clone pattern) with cloud.publisher's snapshot of the database, on the ROUTER they came in on.

The ingest's context carries the ZAP handler (cloud.zap) that checks edge keys for every CURVE socket in it:
the publisher binds its PUB there too, so one allow-list judges both.

A message that cannot be decoded or names another edge is counted, answered with Error and dropped; a
message that fails to store, or every message of a pass whose transaction fails as a whole, is logged and not
acknowledged (the edge sends it again). A full disk (frame store or database) is such a failure too: counted
as "disk_full", logged once per episode, and it asks for an early retention sweep (`on_disk_full`); the edges
keep their messages spooled until there is room. Nothing stops the loop.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from cloud.base_models import mismatches, stored_specs
from cloud.config import CloudConfig
from cloud.datasets import Datasets
from cloud.liveness import LastHeard
from cloud.publisher import snapshot
from cloud.sockets import HEADER_ROOM, bind_server
from cloud.storage import Message, Notification, Storage, is_disk_full
from cloud.zap import PUBLIC_KEY_PROPERTY, ZapHandler
from common.protocol import (
    ID_PATTERN,
    MAX_PAYLOAD_BYTES,
    Ack,
    Error,
    EventHeader,
    FootageHeader,
    FootageStatus,
    FragmentHeader,
    FrameHeader,
    Heartbeat,
    Hello,
    ProtocolError,
    SnapshotRequest,
    Stats,
    decode,
    encode,
)

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
    "notified",  # event notifications handed to notify()
)
PERSISTED = frozenset({"malformed", "unauthenticated"})  # refusals also go to the database's Counter rows
SAVE_INTERVAL = 1.0  # seconds between writes of the refusal counters
STOP_CHECK_MS = 100  # the loop's longest wait for a message before it looks whether stop() was called
BATCH = 256  # messages handled per loop pass before the acks go out
KEY_RECHECK = 1.0  # seconds: a key taken off the allow-list refuses its edge's messages from at most this much later


class _Refused(Exception):
    """A well-formed message from an edge that may not send it: its key belongs to another edge (`for_good`: the
    message names that edge, so the edge drops it), or its key was taken off the allow-list (until put back)."""

    def __init__(self, message: str, for_good: bool) -> None:
        super().__init__(message)
        self.for_good = for_good


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
        datasets: Datasets | None = None,
    ) -> None:
        self._config = config.zmq
        self._storage = storage
        self._sessions = sessions
        self._notify = notify
        self._on_disk_full = on_disk_full  # asks for a retention sweep now
        self._datasets = datasets  # footage requests to send, and their answers; None: none are made here
        self._disk_full = False  # in a full-disk episode: logged at its start and end only
        self.session_id = secrets.token_hex(8)  # the edges see it change when the cloud restarts
        self.counts = dict.fromkeys(COUNTS, 0)
        self.last_heard = LastHeard()  # liveness that does not wait on a database write (see cloud.liveness)
        self._lock = threading.Lock()  # guards counts: the ZAP thread counts refusals
        self._unsaved: Counter[str] = Counter()  # persisted counts not yet written to the database
        self._logged: set[tuple[str, ...]] = set()  # refusal log lines already written (once per peer and reason)
        self._stop = threading.Event()
        self.context: zmq.Context | None = None  # from start(); also the publisher's (see the module doc)
        self._zap: ZapHandler | None = None
        self._router: zmq.Socket | None = None
        self.port = 0  # the ingest port bound: the configured one, or the free one picked for port 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Binds the ROUTER (a CURVE server with the edge allow-list unless insecure) and starts the loop."""
        self.context = zmq.Context()
        try:
            if not self._config.insecure:
                self._zap = ZapHandler(self.context, self._config.edge_keys, self._count)
                self._zap.start()  # before any bind: a CURVE handshake without a ZAP handler would pass
            self._router, self.port = bind_server(
                self.context,
                self._config,
                zmq.ROUTER,
                self._config.ingest_port,
                "ingest_port",
                MAX_PAYLOAD_BYTES + HEADER_ROOM,
            )
        except BaseException:
            self._close()
            raise
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self._thread.start()
        log.info("ingest session %s (%s)", self.session_id, "insecure" if self._config.insecure else "CURVE")

    @property
    def alive(self) -> bool:
        """Its loop runs (a health check's question: edges get no answer once it has stopped)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stops the loop and closes the context: stop the publisher first (terminating waits for its socket)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._close()
        self._save_counts()

    def _close(self) -> None:
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self.context is not None:
            self.context.term()
            self.context = None

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
        next_save = time.monotonic()
        while not self._stop.is_set():
            if self._router.poll(STOP_CHECK_MS):
                self._guarded(self._drain)
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
            self._guarded(self._handle, frames[0].bytes, frames[1:], batch)  # one message must never end the loop
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
            seq = getattr(header, "seq", None) if exc.for_good else None
            self._send(identity, Error(message=f"refused: {exc}", seq=seq))
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
                f"set edge_id: {authenticated} in that edge's config, or give it {claimed}'s keypair",
                for_good=True,
            )
        assert self._zap is not None  # CURVE sockets have a ZAP handler
        key = (_property(frame, PUBLIC_KEY_PROPERTY) or "").encode()
        if self._zap.allow_list.edge_of(key, KEY_RECHECK) != authenticated:  # connected before it was taken off
            raise _Refused(
                f"the key of edge {authenticated!r} is no longer in the cloud's allow-list {self._config.edge_keys}: "
                "nothing from it is taken until its key file is put back",
                for_good=False,
            )
        return claimed

    def _dispatch(
        self, identity: bytes, frame: zmq.Frame, edge: str, header: Any, payload: bytes, batch: _Pass
    ) -> None:
        if self.last_heard.heard(edge, identity):
            self._log_once(
                ("shared", edge),
                "two edge processes send as edge %s (from %s and another connection at once): the cloud takes them "
                "for one edge, so its stats mix and each restart closes the other's events; give each edge box its "
                "own edge_id and keypair",
                edge,
                _property(frame, "Peer-Address") or "?",
            )
        match header:
            case FrameHeader() | EventHeader() | FragmentHeader() | FootageHeader():
                batch.messages.append((identity, Message(edge, header, payload)))
            case Heartbeat():
                batch.heartbeats.append((identity, edge))
            case Hello():
                public_key = None if self._config.insecure else _property(frame, PUBLIC_KEY_PROPERTY)
                self._hand_out(self._storage.edge_hello(edge, header, public_key))
                self._guarded(self._log_mismatches, edge)  # the hello is stored whatever this does
            case Stats():
                self._storage.edge_stats(edge, header)
            case SnapshotRequest():
                self._send_snapshot(identity)
            case FootageStatus() if self._datasets is not None:
                self._datasets.footage_status(edge, header)

    def _log_mismatches(self, edge: str) -> None:
        """One line when an edge (re)starts on another base model than filters targeting it were trained on (its
        MC bank refuses them; GET /api/edges lists them as its refused_filters)."""
        with self._sessions() as session:
            found = mismatches(session, stored_specs(session), edge)
        if found:
            log.warning(
                "edge %s runs base model %s, so its MC bank refuses filter(s) trained on another: %s; retrain them "
                "on its base model or run the edge on theirs",
                edge,
                found[0].edge_model,
                ", ".join(f"{mismatch.filter} ({mismatch.filter_model})" for mismatch in found),
            )

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
        for name in stored.completed:
            self._guarded(self._datasets.footage_complete, name)
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
        self._guarded(self._send_footage_requests, heartbeats)

    def _send_footage_requests(self, heartbeats: list[tuple[bytes, str]]) -> None:
        """Each footage request an edge has not answered yet, again after each of its heartbeats: the request is
        not spooled anywhere, so it goes until the edge's footage_status says it arrived."""
        if self._datasets is None:
            return
        identities = dict((edge, identity) for identity, edge in heartbeats)
        for edge, request in self._datasets.pending_requests(identities):
            self._send(identities[edge], request)

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
        updates, end = snapshot(self._sessions)
        for header, payload in updates:
            self._send(identity, header, payload)
        self._count("snapshots")  # before the reply that completes it, so whoever got that reply sees the count
        self._send(identity, end)


def _property(frame: zmq.Frame, name: str) -> str | None:
    """A connection property of a received frame (User-Id, Peer-Address, ZAP metadata), None if it has none."""
    try:
        return frame.get(name)
    except zmq.ZMQError:
        return None
