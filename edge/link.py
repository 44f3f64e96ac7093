"""The edge's link to the cloud: one DEALER socket to the cloud's ROUTER, the session over it, and routing of
what comes back by message type (the ZeroMQ guide's reliable-pipeline idioms, in one reactor thread).

The link's thread owns the DEALER socket:

- it sends Hello first on every new connection, whenever the cloud's session changes and whenever the filter
  version changes, and a Heartbeat every `heartbeat` seconds; the cloud answers heartbeats, so anything heard
  from it within `timeout` seconds means "reachable" (logged once when that changes);
- every message from the cloud goes to the handler registered for its type (`route`); an Error is logged once
  per text and counted in `refused`;
- after the Hello, on every pass, the link sends what was `post`ed (messages that are not spooled: the latest
  of each type waits until it can go) and lets each attached sender (the uplink) send what is due;
- `on_reset` callbacks hear of anything after which what was in flight may be lost (a connect, a disconnect,
  the cloud reachable again or restarted), `on_restart` callbacks of a new cloud session only;
- a refused CURVE key or a failed handshake is one clear log line (socket monitor).
Sends never block: zmq.Again (no connection yet) just means "not now". On close, what was posted and is still
waiting (the last Stats) goes out, and the link waits briefly for the cloud to take it.

Register handlers, callbacks and senders before start(): the link's thread reads them without a lock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from common import curve
from common.endpoints import ipv6_literal
from common.protocol import Error, Heartbeat, Hello, ProtocolError, decode, encode
from edge.config import CloudLink
from models.filterspec import BaseModelId

log = logging.getLogger(__name__)

MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)
FLUSH_WAIT = 1.0  # seconds close() waits for the cloud to take the last posted messages
# ZeroMQ gives up on a connection whose key the cloud refused; a new socket tries again this often, so an edge
# whose key is added to the cloud's allow-list (re-read there without a restart) connects without one either.
REFUSED_RETRY = 10.0
Handler = Callable[[Any, bytes], None]  # (header, payload) of a message from the cloud


class Sender(Protocol):
    """A part that sends over the link from the link's thread (with `Link.send`)."""

    def pump(self, now: float) -> None:
        """Send what is due at `now` (monotonic)."""

    def next_due(self) -> float | None:
        """When pump() next has something to send without new input (monotonic), or None."""


def open_socket(kind: int, link: CloudLink, port: int, report: bool = True) -> tuple[zmq.Socket, LinkMonitor]:
    """A socket of `kind` connected to the cloud's `port` (CURVE client unless insecure), and its monitor
    (which logs a failed handshake when `report`: one socket per edge says it, not each)."""
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    sock.ipv6 = ipv6_literal(link.address) is not None
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
        self.reported = False  # this episode's failure is logged already

    def events(self) -> list[int]:
        """The connection events since the last call (never blocks)."""
        events = []
        while self.socket.poll(0):
            event = recv_monitor_message(self.socket)["event"]
            events.append(event)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.reported = False
            elif event != zmq.EVENT_DISCONNECTED and self._report_failures and not self.reported:
                self.reported = True
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


class CloudSocket:
    """A socket connected to the cloud and its monitor, opened afresh REFUSED_RETRY seconds after the cloud refused
    its key (ZeroMQ does not reconnect then)."""

    def __init__(self, kind: int, link: CloudLink, port: int, report: bool = True, subscribe: bytes | None = None):
        self._open_args = (kind, link, port, report)
        self._subscribe = subscribe
        self._retry_at: float | None = None
        self._poller: zmq.Poller | None = None  # made again for a new socket only
        self.socket, self.monitor = self._open()

    def _open(self) -> tuple[zmq.Socket, LinkMonitor]:
        sock, monitor = open_socket(*self._open_args)
        if self._subscribe is not None:
            sock.subscribe(self._subscribe)
        return sock, monitor

    def events(self) -> list[int]:
        """The connection events since the last call; a fresh socket when a refused key's retry is due."""
        events, now = self.monitor.events(), time.monotonic()
        if zmq.EVENT_HANDSHAKE_FAILED_AUTH in events and self._retry_at is None:
            self._retry_at = now + REFUSED_RETRY
        if self._retry_at is not None and now >= self._retry_at:
            reported = self.monitor.reported  # one log line per episode, not one per retry
            self.close()
            self.socket, self.monitor = self._open()
            self.monitor.reported, self._retry_at, self._poller = reported, None, None
            log.debug("new connection to %s after the refused key", self.monitor.endpoint)
        return events

    def wait(self, timeout: float, *others: Any) -> None:
        """Wait up to `timeout` seconds for input on the socket, its monitor or `others` (the same ones every call)."""
        if self._poller is None:
            self._poller = zmq.Poller()
            for source in (self.socket, self.monitor.socket, *others):
                self._poller.register(source, zmq.POLLIN)
        self._poller.poll(1000 * timeout)

    def next_retry(self) -> float | None:
        """When events() opens a fresh socket (monotonic), if a refused key's retry is pending."""
        return self._retry_at

    def close(self) -> None:
        self.monitor.close()
        self.socket.close(linger=0)


class Worker:
    """A daemon thread that runs `serve` until stop(); any thread can wake it from its zmq polling through a
    socket pair the poller watches (`reader`), as ZMQ sockets are not thread-safe."""

    def __init__(self, name: str, serve: Callable[[], None]) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=serve, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or already closed
            self._writer.send(b"\0")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self.reader.recv(4096):
                pass

    def stop(self) -> None:
        self.stopping.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.reader.close()
        self._writer.close()


class Link:
    """The edge's DEALER link to the cloud (see the module doc); `run` names this edge process to the cloud."""

    def __init__(
        self,
        edge_id: str,
        cameras: list[str],
        config: CloudLink,
        base_model: BaseModelId | None = None,
        input_size: tuple[int, int] | None = None,
    ):
        self.edge_id = edge_id
        self.cameras = list(cameras)
        self.base_model = base_model  # told to the cloud on hello: it refuses filters trained on another
        self.input_size = input_size  # told too: the cloud's trainers train at it
        self.config = config
        self.run = uuid.uuid4().hex[:12]
        config.check_keys()  # fail here, in one clear line, rather than in the link's thread
        self.filters_version = 0  # set by edge.filtersync; a change goes up in a new Hello
        self.refused = 0  # messages the cloud answered with Error
        self._refusals: set[str] = set()  # Error texts from the cloud, logged once each
        self._handlers: dict[type, Handler] = {Error: self._refusal}
        self._on_reset: list[Callable[[], None]] = []
        self._on_restart: list[Callable[[], None]] = []
        self._senders: list[Sender] = []
        self._posted: dict[str, list[bytes]] = {}  # message type -> the latest one waiting to go
        self._posted_lock = threading.Lock()
        self._session = _Session(config)
        self._cloud: CloudSocket | None = None  # the DEALER, the link's thread's own
        self._worker = Worker("link", self._serve)

    # -- wiring, before start() --------------------------------------------------------------------------

    def route(self, kind: type, handler: Handler) -> None:
        """Messages of type `kind` from the cloud go to `handler`, in the link's thread."""
        self._handlers[kind] = handler

    def on_reset(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in the link's thread) whenever what was in flight may have been lost."""
        self._on_reset.append(callback)

    def on_restart(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in the link's thread) when the cloud's session changes (the cloud restarted)."""
        self._on_restart.append(callback)

    def attach(self, sender: Sender) -> None:
        """`sender` sends what is due on every pass of the link's thread, after the Hello."""
        self._senders.append(sender)

    # -- from any thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        """Send what is still posted, stop the link's thread and close its socket."""
        self._worker.stop()

    def wake(self) -> None:
        """Have the link's thread look for something to send now."""
        self._worker.wake()

    def post(self, header: Any) -> None:
        """Send a message that is not spooled: it replaces a waiting one of its type (the newer one says more)."""
        with self._posted_lock:
            self._posted[header.type] = encode(header)
        self._worker.wake()

    @property
    def connected(self) -> bool:
        return self._session.reachable is True

    # -- the link's thread -------------------------------------------------------------------------------

    def send(self, frames: list[bytes]) -> bool:
        """Send without blocking; False when the message cannot go now (no connection). The link's thread only."""
        try:
            self._cloud.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _serve(self) -> None:
        self._cloud = CloudSocket(zmq.DEALER, self.config, self.config.ingest_port)
        try:
            while not self._worker.stopping.is_set():
                self._cloud.wait(self._idle_for(), self._worker.reader)
                self._worker.clear()
                self._connection_events(self._cloud.events())
                while self._cloud.socket.poll(0):
                    self._receive()
                self._step()
            self._flush()
        except Exception:
            log.exception("link to %s failed; matched frames stay spooled", self._session.endpoint)
        finally:
            self._cloud.close()

    def _idle_for(self) -> float:
        """Seconds the thread may sleep before something is due (it wakes earlier on any input)."""
        dues = [sender.next_due() for sender in self._senders] + [self._cloud.next_retry()]
        due = min([self._session.next_due(), *(when for when in dues if when is not None)])
        return min(max(due - time.monotonic(), 0.005), 1.0)

    def _connection_events(self, events: list[int]) -> None:
        if self._session.on_events(events):
            self._notify(self._on_reset)

    def _receive(self) -> Any:
        """Handle one message from the cloud; returns its header (None when unreadable)."""
        try:
            header, payload = decode(self._cloud.socket.recv_multipart())
        except ProtocolError as exc:
            log.warning("unreadable message from the cloud: %s", exc)
            return None
        reset, restarted = self._session.heard(header)
        if reset:
            self._notify(self._on_reset)
        if restarted:
            self._notify(self._on_restart)
        handler = self._handlers.get(type(header))
        if handler is not None:
            handler(header, payload)
        return header

    def _refusal(self, error: Error, _payload: bytes) -> None:
        self.note_refusal(error)

    def note_refusal(self, error: Error) -> None:
        """Count the cloud's refusal and log its text once (a refused message comes back with every resend)."""
        self.refused += 1
        if error.message not in self._refusals:  # a refused message comes back with every resend
            self._refusals.add(error.message)
            log.warning("the cloud refused a message: %s", error.message)

    @staticmethod
    def _notify(callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            callback()

    def _step(self) -> None:
        """Everything due now: Hello, heartbeat, posted messages, then what the senders have."""
        session, now = self._session, time.monotonic()
        session.check_reachable(now)
        if not self._hello(now):
            return  # nothing goes before the Hello on a connection
        if now >= session.next_heartbeat:
            self.send(encode(Heartbeat(sender=self.edge_id)))  # a lost one just means silence: no retry
            session.next_heartbeat = now + self.config.heartbeat
        self._send_posted()
        for sender in self._senders:
            sender.pump(now)

    def _hello(self, now: float) -> bool:
        """Send the Hello when due (it also tells the cloud the filter version); False when it cannot go now."""
        session, version = self._session, self.filters_version
        if not session.hello_due and version == session.announced_version:
            return True
        hello = Hello(
            edge=self.edge_id,
            run=self.run,
            cameras=self.cameras,
            filters_version=version,
            base_model=self.base_model,
            input_size=self.input_size,
        )
        if not self.send(encode(hello)):
            session.hello_due = True
            session.next_heartbeat = now + self.config.heartbeat  # retried on connect, or then
            return False
        session.hello_due, session.announced_version = False, version
        return True

    def _send_posted(self) -> None:
        with self._posted_lock:
            posted = list(self._posted.items())
        for kind, frames in posted:
            if self.send(frames):
                with self._posted_lock:
                    if self._posted.get(kind) is frames:  # not replaced by a newer one meanwhile
                        del self._posted[kind]

    def _flush(self) -> None:
        """Send what is still posted (the last Stats: cameras offline) and wait briefly for the cloud to answer the
        heartbeat sent after it: the cloud handles an edge's messages in order, so that answer says it got them."""
        with self._posted_lock:
            posted, self._posted = list(self._posted.values()), {}
        if not posted or not self.connected or not all(self.send(frames) for frames in posted):
            return
        self.send(encode(Heartbeat(sender=self.edge_id)))
        deadline = time.monotonic() + FLUSH_WAIT
        while (left := deadline - time.monotonic()) > 0 and self._cloud.socket.poll(1000 * left):
            if isinstance(self._receive(), Heartbeat):
                return


class _Session:
    """What the link's thread knows about the cloud: reachability, its session, and what the Hello said."""

    def __init__(self, config: CloudLink):
        self.endpoint = config.endpoint(config.ingest_port)
        self.timeout = config.timeout
        self.reachable: bool | None = None  # None until first heard from or first timed out
        self.session: str | None = None
        self.hello_due = True
        self.announced_version = 0  # the filters_version in the last Hello sent
        self.next_heartbeat = 0.0
        self.started = time.monotonic()
        self.last_heard: float | None = None
        self.last_heard_wall = time.time()

    def next_due(self) -> float:
        """The next heartbeat, or the moment the cloud counts as unreachable, whichever comes first."""
        if self.reachable is False:
            return self.next_heartbeat
        return min(self.next_heartbeat, (self.last_heard or self.started) + self.timeout)

    def on_events(self, events: list[int]) -> bool:
        """Note connection events; True when what was in flight may be lost with a connection."""
        changed = any(event in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED) for event in events)
        if changed:
            self.hello_due = True
        return changed

    def heard(self, header: Any) -> tuple[bool, bool]:
        """Note a message from the cloud; (reset, restarted): whether what was in flight may be lost (the cloud
        is reachable again or restarted), and whether it revealed a new cloud session (the cloud restarted)."""
        now, reset = time.monotonic(), False
        if self.reachable is not True:
            if self.reachable is False:
                log.info("cloud at %s is reachable again; resending what it has not acknowledged", self.endpoint)
                reset = True
            else:
                log.info("cloud at %s is reachable", self.endpoint)
            self.reachable = True
        self.last_heard, self.last_heard_wall = now, time.time()
        if not isinstance(header, Heartbeat) or header.sender == self.session:
            return reset, False
        restarted = self.session is not None
        if restarted:
            log.info("cloud at %s restarted (session %s); saying hello and resending", self.endpoint, header.sender)
            self.hello_due = True
        self.session = header.sender
        return reset or restarted, restarted

    def check_reachable(self, now: float) -> None:
        if self.reachable is False or now - (self.last_heard or self.started) < self.timeout:
            return
        self.reachable = False
        since = datetime.fromtimestamp(self.last_heard_wall).isoformat(timespec="seconds")
        log.warning(
            "cloud at %s unreachable since %s; filtering goes on and matched frames are spooled", self.endpoint, since
        )


def _public_key_file(secret_key: Path) -> Path:
    """The public key file beside a .key_secret file (as `filterforward keys create` writes them)."""
    secret_key = Path(secret_key)
    return secret_key.with_suffix(".key") if secret_key.suffix == ".key_secret" else secret_key
