"""The uplink: the Sink that sends matched frames and events to the cloud over ZeroMQ, losing none.

Camera threads call frame()/event(), which only append the encoded message to the durable spool
(edge.spool) and wake the network thread. That thread owns the DEALER socket (the ZeroMQ guide's
reliable-delivery pattern, with credit-based flow control):

- it sends Hello first on every new connection and whenever the cloud's session changes, and a Heartbeat
  every `heartbeat` seconds; the cloud answers heartbeats, so anything heard from it within `timeout`
  seconds means "reachable" (logged once when that changes);
- it sends spooled messages in seq order, at most `window` unacknowledged at a time, and forgets them when
  the cloud's Ack lists their seqs; it resends every unacknowledged one after a reconnect, when the cloud
  comes back or restarts (new session), and any single one unacknowledged for 3 x heartbeat + 1 s;
- it hands filter messages (snapshot replies) to a listener (edge.filtersync), sends snapshot requests and
  Stats when asked, and reports a refused CURVE key in one clear log line (socket monitor).
Sends never block: zmq.Again (no connection yet) just leaves the message spooled for later.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import zmq
from pydantic import ValidationError
from zmq.utils.monitor import recv_monitor_message

from common import curve
from common.protocol import (
    Ack,
    Error,
    EventHeader,
    EventInfo,
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
from edge.config import CloudLink, SpoolConfig
from edge.sink import MatchedFrame
from edge.spool import Frames, Spool
from models.errors import validation_summary
from models.smoother import Event

log = logging.getLogger(__name__)

MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)
FLUSH_WAIT = 1.0  # seconds close() waits for the cloud to take a last Stats message
FilterListener = Callable[[FilterUpdate | SnapshotEnd, bytes], None]


def open_socket(kind: int, link: CloudLink, port: int, report: bool = True) -> tuple[zmq.Socket, LinkMonitor]:
    """A socket of `kind` connected to the cloud's `port` (CURVE client unless insecure), and its monitor
    (which logs a failed handshake when `report`: one socket per edge says it, not each)."""
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    sock.reconnect_ivl = 100
    sock.reconnect_ivl_max = 2000
    if kind == zmq.DEALER:
        sock.immediate = 1  # no queueing towards a cloud that is not connected: the spool is the queue
    if not link.insecure:
        curve.make_client(sock, link.secret_key, link.server_key)
    endpoint = link.endpoint(port)
    monitor = LinkMonitor(sock, endpoint, None if link.insecure else link.secret_key, report)
    sock.connect(endpoint)
    return sock, monitor


class LinkMonitor:
    """Watches a socket's connection events; logs a refused key or a failed handshake once per episode."""

    def __init__(self, sock: zmq.Socket, endpoint: str, secret_key: Path | None, report: bool = True):
        self.endpoint = endpoint
        self.socket = sock.get_monitor_socket(MONITORED)
        self._owner = sock
        self._public_key_file = _public_key_file(secret_key) if secret_key else None
        self._report_failures = report
        self._reported = False  # this episode's failure is logged already

    def events(self) -> list[int]:
        """The connection events since the last call (never blocks)."""
        events = []
        while self.socket.poll(0):
            event = recv_monitor_message(self.socket)["event"]
            events.append(event)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._reported = False
            elif event != zmq.EVENT_DISCONNECTED and self._report_failures and not self._reported:
                self._reported = True
                self._report(event)
        return events

    def _report(self, event: int) -> None:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            log.error(
                "cloud at %s refused this edge's key: add %s to the cloud's zmq.edge_keys folder",
                self.endpoint,
                self._public_key_file,
            )
        else:
            log.error(
                "handshake with the cloud at %s failed: check that cloud.server_key is the cloud's public key "
                "and that cloud.insecure matches the cloud's zmq.insecure",
                self.endpoint,
            )

    def close(self) -> None:
        self._owner.disable_monitor()
        self.socket.close(linger=0)


class Waker:
    """Wakes a thread blocked in zmq polling from any thread (a socket pair: ZMQ sockets are not thread-safe)."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or already closed
            self._writer.send(b"\0")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self.reader.recv(4096):
                pass

    def close(self) -> None:
        self.reader.close()
        self._writer.close()


class Uplink:
    """Sink to the cloud: spools every frame/event message and delivers it at least once (see module doc)."""

    def __init__(self, edge_id: str, cameras: list[str], link: CloudLink, spool: SpoolConfig):
        self.edge_id = edge_id
        self.cameras = list(cameras)
        self.link = link
        self.run = uuid.uuid4().hex[:12]
        if not link.insecure:  # fail here, in one clear line, rather than in the network thread
            curve.load_keypair(link.secret_key)
            curve.load_public(link.server_key)
        self.spool = Spool(spool.path, spool.max_bytes)
        self.filters_version = 0  # set by edge.filtersync; a change goes up in a new Hello
        self.counts = {"sent_messages": 0, "sent_bytes": 0, "acked": 0, "unsendable": 0, "refused": 0}
        self._refusals: set[str] = set()  # Error texts from the cloud, logged once each
        self._on_filter: FilterListener | None = None
        self._on_session: Callable[[], None] | None = None
        self._waker = Waker()
        self._stopping = threading.Event()
        self._drained = threading.Condition()
        self._requests_lock = threading.Lock()
        self._snapshot_wanted = False
        self._stats: Frames | None = None
        self._connection = _Connection(link)
        self._thread = threading.Thread(target=self._serve, name="uplink", daemon=True)

    # -- the Sink, called from camera threads ----------------------------------------------------------

    def frame(self, matched: MatchedFrame) -> None:
        def build(seq: int) -> Frames:
            header = FrameHeader(
                edge=self.edge_id,
                run=self.run,
                seq=seq,
                camera=matched.camera,
                frame=matched.index,
                timestamp=matched.timestamp,
                wall_time=time.time(),
                scores=matched.scores,
                events=matched.events,
                payload="jpeg" if matched.jpeg else "none",
            )
            return encode(header, matched.jpeg)

        self._spool(build, f"frame {matched.index} of camera {matched.camera}")

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None:
        def build(seq: int) -> Frames:
            header = EventHeader(
                edge=self.edge_id,
                run=self.run,
                seq=seq,
                phase=kind,
                wall_time=time.time(),
                event=EventInfo(**asdict(event)),
                payload="mp4" if clip else "none",
            )
            return encode(header, clip or b"")

        self._spool(build, f"event {kind} {event.id}")

    def close(self) -> None:
        """Stop the network thread and close its sockets; unacknowledged messages stay spooled for next time."""
        self._stopping.set()
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.spool.close()
        self._waker.close()

    # -- control, from any thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def listen(self, on_filter: FilterListener, on_session: Callable[[], None]) -> None:
        """Where filter messages from the cloud go, and whom to tell when the cloud's session changes."""
        self._on_filter, self._on_session = on_filter, on_session

    def request_snapshot(self) -> None:
        with self._requests_lock:
            self._snapshot_wanted = True
        self._waker.wake()

    def send_stats(self, cameras: dict[str, dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
        """Send a Stats message (per-camera summaries, plus this uplink's counters and `extra`); not spooled."""
        stats = Stats(edge=self.edge_id, cameras=cameras, uplink={**self.stats(), **(extra or {})})
        with self._requests_lock:
            self._stats = encode(stats)
        self._waker.wake()

    def stats(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "spool_messages": self.spool.messages,
            "spool_bytes": self.spool.bytes,
            "spool_dropped": self.spool.dropped,
            "in_flight": self.in_flight,
            "sent_messages": self.counts["sent_messages"],
            "sent_bytes": self.counts["sent_bytes"],
            "acked": self.counts["acked"],
        }

    @property
    def connected(self) -> bool:
        return self._connection.reachable is True

    @property
    def in_flight(self) -> int:
        return len(self._connection.in_flight)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the cloud has acknowledged everything spooled; False if `timeout` seconds passed first."""
        with self._drained:
            return self._drained.wait_for(lambda: self.spool.messages == 0, timeout)

    def _spool(self, build: Callable[[int], Frames], what: str) -> None:
        def checked(seq: int) -> Frames:
            frames = build(seq)
            decode(frames)  # the cloud must be able to read it: a message it refuses would be resent for ever
            return frames

        try:
            self.spool.append(checked)
        except (ProtocolError, ValidationError) as exc:
            self.counts["unsendable"] += 1
            why = validation_summary(exc) if isinstance(exc, ValidationError) else exc
            log.error("%s cannot be sent (%s); dropped", what, why)
            return
        self._waker.wake()

    # -- the network thread ----------------------------------------------------------------------------

    def _serve(self) -> None:
        dealer, monitor = open_socket(zmq.DEALER, self.link, self.link.ingest_port)
        poller = zmq.Poller()
        for source in (dealer, monitor.socket, self._waker.reader):
            poller.register(source, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                poller.poll(1000 * self._connection.idle_for())
                self._waker.clear()
                self._connection.on_events(monitor.events())
                self._receive(dealer)
                self._step(dealer)
            self._flush_stats(dealer)
        except Exception:
            log.exception("uplink to %s failed; messages stay spooled", self.link.endpoint(self.link.ingest_port))
        finally:
            monitor.close()
            dealer.close(linger=0)

    def _flush_stats(self, dealer: zmq.Socket) -> None:
        """Send a waiting last Stats (cameras offline) and wait briefly for the cloud to answer the heartbeat
        sent after it: the cloud handles an edge's messages in order, so that answer says it got the Stats."""
        with self._requests_lock:
            stats, self._stats = self._stats, None
        if stats is None or not self.connected or not _send(dealer, stats):
            return
        _send(dealer, encode(Heartbeat(sender=self.edge_id)))
        deadline = time.monotonic() + FLUSH_WAIT
        while (left := deadline - time.monotonic()) > 0 and dealer.poll(1000 * left):
            if isinstance(self._receive_one(dealer), Heartbeat):
                return

    def _receive(self, dealer: zmq.Socket) -> None:
        while dealer.poll(0):
            self._receive_one(dealer)

    def _receive_one(self, dealer: zmq.Socket) -> Any:
        """Handle one message from the cloud; returns its header (None when unreadable)."""
        try:
            header, payload = decode(dealer.recv_multipart())
        except ProtocolError as exc:
            log.warning("unreadable message from the cloud: %s", exc)
            return None
        if self._connection.heard(header) and self._on_session:
            self._on_session()
        if isinstance(header, Ack):
            self._acked(header.seqs)
        elif isinstance(header, FilterUpdate | SnapshotEnd) and self._on_filter:
            self._on_filter(header, payload)
        elif isinstance(header, Error):
            self.counts["refused"] += 1
            if header.message not in self._refusals:  # a refused message comes back with every resend
                self._refusals.add(header.message)
                log.warning("the cloud refused a message: %s", header.message)
        return header

    def _acked(self, seqs: list[int]) -> None:
        for seq in seqs:
            self._connection.in_flight.pop(seq, None)
        self.counts["acked"] += self.spool.ack(seqs)
        with self._drained:
            self._drained.notify_all()

    def _step(self, dealer: zmq.Socket) -> None:
        """Everything due now: Hello, heartbeat, requests, resends of timed-out messages, new messages."""
        conn, now = self._connection, time.monotonic()
        conn.check_reachable(now, self.spool.messages)
        version = self.filters_version
        if conn.hello_due or version != conn.announced_version:  # the Hello tells the cloud the filter version
            hello = Hello(edge=self.edge_id, run=self.run, cameras=self.cameras, filters_version=version)
            if not _send(dealer, encode(hello)):
                conn.hello_due = True  # nothing goes before the Hello on a connection
                conn.next_heartbeat = now + self.link.heartbeat  # retried on connect, or then
                return
            conn.hello_due, conn.announced_version = False, version
        if now >= conn.next_heartbeat:
            _send(dealer, encode(Heartbeat(sender=self.edge_id)))  # a lost one just means silence: no retry
            conn.next_heartbeat = now + self.link.heartbeat
        self._send_requests(dealer)
        self._resend_expired(dealer, now)
        self._send_new(dealer, now)

    def _send_requests(self, dealer: zmq.Socket) -> None:
        with self._requests_lock:
            snapshot, stats = self._snapshot_wanted, self._stats
        if snapshot and _send(dealer, encode(SnapshotRequest(edge=self.edge_id))):
            with self._requests_lock:
                self._snapshot_wanted = False
        if stats is not None and _send(dealer, stats):
            with self._requests_lock:
                self._stats = None if self._stats is stats else self._stats

    def _resend_expired(self, dealer: zmq.Socket, now: float) -> None:
        conn = self._connection
        for seq in [seq for seq, sent in conn.in_flight.items() if now - sent >= conn.resend_after]:
            frames = self.spool.get(seq)
            if frames is None:  # dropped from the spool meanwhile
                del conn.in_flight[seq]
            elif self._transmit(dealer, seq, frames, now):
                log.debug("resent seq %d: no ack within %.1f s", seq, conn.resend_after)
            else:
                conn.in_flight[seq] = now  # cannot go now: try again after another resend period
                return

    def _send_new(self, dealer: zmq.Socket, now: float) -> None:
        conn = self._connection
        room, newest = self.link.window - len(conn.in_flight), self.spool.last_seq
        if room <= 0 or conn.cursor >= newest:
            return
        batch = self.spool.after(conn.cursor, room)
        if not batch:
            conn.cursor = newest  # everything up to it was acknowledged or dropped
        for seq, frames in batch:
            if not self._transmit(dealer, seq, frames, now):
                return
            conn.cursor = seq

    def _transmit(self, dealer: zmq.Socket, seq: int, frames: Frames, now: float) -> bool:
        if not _send(dealer, frames):
            return False
        self._connection.in_flight[seq] = now
        self.counts["sent_messages"] += 1
        self.counts["sent_bytes"] += sum(len(frame) for frame in frames)
        return True


class _Connection:
    """What the network thread knows about the cloud: reachability, session, and the messages in flight."""

    def __init__(self, link: CloudLink):
        self.endpoint = link.endpoint(link.ingest_port)
        self.timeout = link.timeout
        self.resend_after = 3 * link.heartbeat + 1.0
        self.reachable: bool | None = None  # None until first heard from or first timed out
        self.session: str | None = None
        self.hello_due = True
        self.announced_version = 0  # the filters_version in the last Hello sent
        self.next_heartbeat = 0.0
        self.started = time.monotonic()
        self.last_heard: float | None = None
        self.last_heard_wall = time.time()
        self.cursor = 0  # highest seq sent in this pass over the spool
        self.in_flight: dict[int, float] = {}  # seq -> when last sent (monotonic)

    def idle_for(self) -> float:
        """Seconds the thread may sleep before something is due (it wakes earlier on any input)."""
        now = time.monotonic()
        due = [self.next_heartbeat]
        if self.reachable is not False:
            due.append((self.last_heard or self.started) + self.timeout)
        if self.in_flight:
            due.append(min(self.in_flight.values()) + self.resend_after)
        return min(max(min(due) - now, 0.005), 1.0)

    def on_events(self, events: list[int]) -> None:
        for event in events:
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.hello_due = True
                self.resend_all()  # what was in flight on a lost connection may be lost with it
            elif event == zmq.EVENT_DISCONNECTED:
                self.hello_due = True
                self.resend_all()

    def heard(self, header: Any) -> bool:
        """Note a message from the cloud; True when it revealed a new cloud session (the cloud restarted)."""
        now = time.monotonic()
        if self.reachable is not True:
            if self.reachable is False:
                log.info("cloud at %s is reachable again; resending what it has not acknowledged", self.endpoint)
                self.resend_all()
            else:
                log.info("cloud at %s is reachable", self.endpoint)
            self.reachable = True
        self.last_heard, self.last_heard_wall = now, time.time()
        if not isinstance(header, Heartbeat) or header.sender == self.session:
            return False
        changed = self.session is not None
        if changed:
            log.info("cloud at %s restarted (session %s); saying hello and resending", self.endpoint, header.sender)
            self.hello_due = True
            self.resend_all()
        self.session = header.sender
        return changed

    def check_reachable(self, now: float, spooled: int) -> None:
        if self.reachable is False or now - (self.last_heard or self.started) < self.timeout:
            return
        self.reachable = False
        since = datetime.fromtimestamp(self.last_heard_wall).isoformat(timespec="seconds")
        log.warning(
            "cloud at %s unreachable since %s; filtering goes on and matched frames are spooled (%d waiting)",
            self.endpoint,
            since,
            spooled,
        )

    def resend_all(self) -> None:
        self.in_flight.clear()
        self.cursor = 0


def _send(sock: zmq.Socket, frames: Frames) -> bool:
    """Send without blocking; False when the message cannot go now (no connection): it stays spooled."""
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return False
    return True


def _public_key_file(secret_key: Path) -> Path:
    """The public key file beside a .key_secret file (as `filterforward keys create` writes them)."""
    secret_key = Path(secret_key)
    return secret_key.with_suffix(".key") if secret_key.suffix == ".key_secret" else secret_key
