"""When each edge was last heard, kept in memory by the ingest: an edge that keeps talking stays online even when
its last_seen cannot be written (the database's disk is full, the database is away for a moment). Edge listings
and counts take whichever is newer, the database's last_seen or this process's.

It also tells when two edge processes send under one edge_id (a copied config and key): their messages come over
two connections at once, so the connection an edge's messages arrive on keeps switching back to one heard before.
A restart or reconnect only ever moves to a new connection (and may leave a message or two on the old one)."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from cloud.db import as_utc, utcnow

SHARED_WINDOW = 60.0  # seconds within which switches back to an earlier connection are counted
SHARED_RETURNS = 3  # that many switches back within the window: two processes share the edge id


@dataclass
class _Connections:
    """The connections one edge id was heard on lately, and the times its messages switched back to one of them."""

    last: bytes
    heard: dict[bytes, float] = field(default_factory=dict)  # connection -> when last heard (monotonic)
    returns: deque[float] = field(default_factory=deque)


class LastHeard:
    """Thread-safe: the ingest thread marks edges, request handlers read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, datetime] = {}
        self._connections: dict[str, _Connections] = {}

    def heard(self, edge: str, connection: bytes = b"") -> bool:
        """Mark the edge heard, on `connection` (the ROUTER's id of the socket it came over); True when its
        messages now look like coming from two processes (see the module doc)."""
        now = time.monotonic()
        with self._lock:
            self._at[edge] = utcnow()
            seen = self._connections.setdefault(edge, _Connections(last=connection))
            if connection != seen.last and now - seen.heard.get(connection, -SHARED_WINDOW) < SHARED_WINDOW:
                seen.returns.append(now)
            seen.last, seen.heard[connection] = connection, now
            while seen.returns and now - seen.returns[0] > SHARED_WINDOW:
                seen.returns.popleft()
            if len(seen.heard) > 8:  # reconnects: keep the latest few
                for old in sorted(seen.heard, key=seen.heard.__getitem__)[:-4]:
                    del seen.heard[old]
            return len(seen.returns) >= SHARED_RETURNS

    def shared(self, edge: str) -> bool:
        """Whether two processes sent as this edge within the last SHARED_WINDOW seconds."""
        now = time.monotonic()
        with self._lock:
            seen = self._connections.get(edge)
            recent = [at for at in seen.returns if now - at <= SHARED_WINDOW] if seen else []
            return len(recent) >= SHARED_RETURNS

    def latest(self, edge: str, stored: datetime) -> datetime:
        """Whichever is newer: the edge's stored last_seen or when this process last heard it."""
        with self._lock:
            heard = self._at.get(edge)
        stored = as_utc(stored)
        return stored if heard is None else max(stored, heard)

    def since(self, cutoff: datetime) -> list[str]:
        """The edges heard at or after `cutoff`."""
        with self._lock:
            return sorted(edge for edge, at in self._at.items() if at >= cutoff)
