"""ZAP (ZeroMQ RFC 27) for the cloud's CURVE sockets: only edges whose public key is in the allow-list folder.

The folder (config `zmq.edge_keys`) holds one public key file per allowed edge, `<edge-id>.key`, as written
by `filterforward keys create`. It is re-read whenever a file in it changes, so allowing an edge needs no
restart. An allowed connection gets the edge id as its ZMQ User-Id (the ingest compares it with the id in
each message) and its Z85 public key as the `X-Public-Key` property; any other is refused with status 400.
"""

from __future__ import annotations

import logging
import math
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import zmq
import zmq.utils.z85

from common.curve import load_public
from common.protocol import ID_PATTERN
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
PUBLIC_KEY_PROPERTY = "X-Public-Key"
_POLL_MS = 100  # how often the handler thread checks for stop()
NAMED_KEYS = 20  # refused keys named in the log one by one; beyond them, a summary line
SUMMARY_INTERVAL = 60.0  # seconds between those summary lines


class AllowList:
    """Z85 public key -> edge id, from the `<edge-id>.key` files of a folder; reloaded when the folder changes."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._edges: dict[bytes, str] = {}
        self._scanned_at = -math.inf
        self._lock = threading.Lock()  # the ZAP handler's thread and the ingest's

    def edge_of(self, public_key: bytes, max_age: float = 0.0) -> str | None:
        """The key's edge, the folder looked at again when it was last more than `max_age` seconds ago (the
        ingest asks at every message, the ZAP handler at every handshake)."""
        with self._lock:
            if time.monotonic() - self._scanned_at > max_age:
                self._reload_if_changed()
                self._scanned_at = time.monotonic()
            return self._edges.get(public_key)

    def _reload_if_changed(self) -> None:
        signature = self._scan()
        if signature == self._signature:
            return
        self._signature = signature
        self._edges = self._load(name for name, _, _ in signature)
        log.info("edge allow-list %s: %d edge(s): %s", self.folder, len(self._edges), sorted(self._edges.values()))

    def _scan(self) -> tuple[tuple[str, int, int], ...]:
        try:
            stats = [(path.name, path.stat()) for path in self.folder.iterdir() if path.suffix == ".key"]
        except OSError as exc:  # folder gone, or a file removed while scanning
            if self._signature != ():
                log.error(
                    "edge allow-list %s unreadable (%s): every edge is refused until it is back", self.folder, exc
                )
            return ()
        return tuple(sorted((name, stat.st_mtime_ns, stat.st_size) for name, stat in stats))

    def _load(self, names: Iterable[str]) -> dict[bytes, str]:
        edges: dict[bytes, str] = {}
        for name in names:
            path = self.folder / name
            edge = path.stem
            if not re.fullmatch(ID_PATTERN, edge):
                log.warning("skipping %s: its name must be <edge-id>.key with a valid edge id", path)
                continue
            try:
                key = load_public(path)
            except FilterForwardError as exc:
                log.warning("skipping %s: %s", path, exc)
                continue
            if key in edges:
                log.warning("skipping %s: same public key as %s.key; each edge needs its own keypair", path, edges[key])
                continue
            edges[key] = edge
        return edges


class ZapHandler:
    """Answers the ZAP requests of every CURVE socket of `context` from a thread of its own."""

    def __init__(self, context: zmq.Context, folder: Path, count: Callable[[str], None]) -> None:
        """`count(name)` is called with "unauthenticated" for each refused handshake."""
        folder = Path(folder)
        if not folder.is_dir():
            raise FilterForwardError(
                f"zmq.edge_keys folder {folder} does not exist: create it and copy each allowed edge's "
                "public <edge-id>.key file into it"
            )
        self.allow_list = AllowList(folder)
        self._context = context
        self._count = count
        self._refused_keys: set[bytes] = set()  # named in the log already
        self._unnamed = 0  # refusals since the last summary line
        self._summarized_at = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Binds the ZAP endpoint before returning: call it before binding the CURVE sockets."""
        socket = self._context.socket(zmq.REP)
        socket.linger = 0
        try:
            socket.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            socket.close()
            raise
        # from here on only the handler thread uses the socket (starting a thread is the memory barrier ZMQ needs)
        self._thread = threading.Thread(target=self._run, args=(socket,), name="zap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, socket: zmq.Socket) -> None:
        try:
            while not self._stop.is_set():
                if socket.poll(_POLL_MS):
                    socket.send_multipart(self._answer_safely(socket.recv_multipart()))
        finally:
            socket.close()

    def _answer_safely(self, request: list[bytes]) -> list[bytes]:
        try:
            return self._answer(request)
        except Exception:  # a bug here must cost one handshake: without a reply every later one would stall
            log.exception("ZAP handler failed; refusing this connection")
            return _reply(request[1] if len(request) > 1 else b"", b"500", b"internal error")

    def _answer(self, request: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, identity, mechanism, credentials (CURVE: the 32-byte public key)
        if len(request) < 6 or request[0] != b"1.0":
            return _reply(request[1] if len(request) > 1 else b"", b"500", b"malformed ZAP request")
        request_id, address, mechanism, credentials = request[1], request[3], request[5], request[6:]
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            return self._refuse(request_id, address, b"", f"mechanism {mechanism.decode(errors='replace')}")
        key = zmq.utils.z85.encode(credentials[0])
        edge = self.allow_list.edge_of(key)
        if edge is None:
            return self._refuse(request_id, address, key, f"public key {key.decode()}")
        return _reply(request_id, b"200", b"OK", edge.encode(), _metadata({PUBLIC_KEY_PROPERTY: key}))

    def _refuse(self, request_id: bytes, address: bytes, key: bytes, what: str) -> list[bytes]:
        self._count("unauthenticated")
        if key in self._refused_keys:  # once per key: a refused edge retries every few seconds
            return _reply(request_id, b"400", b"edge key not allowed")
        if len(self._refused_keys) < NAMED_KEYS:
            self._refused_keys.add(key)
            log.warning(
                "refused an edge connection from %s with %s: not in the allow-list %s; to allow that edge, copy its "
                "public key file there as <edge-id>.key",
                address.decode(errors="replace"),
                what,
                self.allow_list.folder,
            )
        else:  # a flood of new keys: a summary now and then, not a line (and a remembered key) each
            self._unnamed += 1
            now = time.monotonic()
            if now - self._summarized_at >= SUMMARY_INTERVAL:
                log.warning(
                    "refused %d more edge connection(s) with keys not in the allow-list %s (only the first %d keys "
                    "are named in this log)",
                    self._unnamed,
                    self.allow_list.folder,
                    NAMED_KEYS,
                )
                self._unnamed, self._summarized_at = 0, now
        return _reply(request_id, b"400", b"edge key not allowed")


def _reply(request_id: bytes, status: bytes, text: bytes, user_id: bytes = b"", metadata: bytes = b"") -> list[bytes]:
    return [b"1.0", request_id, status, text, user_id, metadata]


def _metadata(properties: dict[str, bytes]) -> bytes:
    """ZMTP metadata encoding: name length (1 byte), name, value length (4 bytes, big-endian), value."""
    return b"".join(
        bytes([len(name)]) + name.encode() + struct.pack(">I", len(value)) + value for name, value in properties.items()
    )
