"""When each edge was last heard, kept in memory by the ingest: an edge that keeps talking stays online even when
its last_seen cannot be written (the database's disk is full, the database is away for a moment). Edge listings
and counts take whichever is newer, the database's last_seen or this process's."""

from __future__ import annotations

import threading
from datetime import datetime

from cloud.db import as_utc, utcnow


class LastHeard:
    """Thread-safe: the ingest thread marks edges, request handlers read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, datetime] = {}

    def heard(self, edge: str) -> None:
        with self._lock:
            self._at[edge] = utcnow()

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
