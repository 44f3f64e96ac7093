"""The uplink's durable message spool: every frame/event message until the cloud acknowledges it.

One SQLite file (stdlib sqlite3, WAL) holds the encoded multipart frames of each message, keyed by its
sequence number. A message is built and stored in one transaction together with the next seq, so the seq
inside its header is exactly the seq it is stored under, and a resend is byte-identical. A committed
append survives a crash of the process (kill -9); synchronous=NORMAL trades the last few commits before
an OS crash or power loss for not waiting on the disk for every matched frame.

Seqs never repeat: the next seq is persisted apart from the messages, so it survives an emptied spool,
and a new spool file starts at the current time in microseconds, so even a deleted spool does not reuse
the seqs (which the cloud deduplicates on) of the one before it.

The spool is bounded in bytes: an append that takes it over `max_bytes` drops the OLDEST messages and
counts them in `dropped`; a warning says how many (one per DROP_REPORT_INTERVAL while it keeps dropping,
and the rest at close).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from models.errors import FilterForwardError

log = logging.getLogger(__name__)

FILE_NAME = "spool.sqlite"
DROP_REPORT_INTERVAL = 30.0  # seconds between warnings while a full spool keeps dropping
Frames = list[bytes]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY, size INTEGER NOT NULL, frames BLOB NOT NULL);
"""


class Spool:
    """A thread-safe, byte-bounded, persistent FIFO of encoded messages keyed by seq."""

    def __init__(self, folder: Path, max_bytes: int):
        if max_bytes <= 0:
            raise FilterForwardError(f"spool max_bytes must be positive, got {max_bytes}")
        self.path = Path(folder) / FILE_NAME
        self.max_bytes = max_bytes
        self.dropped = 0
        self._unreported, self._last_dropped, self._next_report = 0, 0, 0.0  # drops not yet in a warning
        self._lock = threading.Lock()
        self._db = _connect(self.path)
        self._next_seq = self._load_next_seq()
        self._messages, self._bytes = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM messages"
        ).fetchone()

    @property
    def messages(self) -> int:
        return self._messages

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def last_seq(self) -> int:
        """The highest seq handed out so far (stored or not)."""
        return self._next_seq - 1

    def append(self, build: Callable[[int], Frames]) -> int:
        """Store the message `build(seq)` under the next seq, in one transaction; returns the seq."""
        with self._lock, self._db:
            seq = self._next_seq
            frames = build(seq)
            size = sum(len(frame) for frame in frames)
            self._db.execute("INSERT INTO messages (seq, size, frames) VALUES (?, ?, ?)", (seq, size, _pack(frames)))
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (seq + 1,))
            self._next_seq = seq + 1
            self._messages += 1
            self._bytes += size
            if self._bytes > self.max_bytes:
                self._drop_oldest()
        return seq

    def after(self, seq: int, limit: int) -> list[tuple[int, Frames]]:
        """Up to `limit` stored messages with a seq above `seq`, in seq order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, frames FROM messages WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
            ).fetchall()
        return [(row_seq, _unpack(blob)) for row_seq, blob in rows]

    def get(self, seq: int) -> Frames | None:
        """The message stored under `seq`, or None when it was acknowledged or dropped."""
        with self._lock:
            row = self._db.execute("SELECT frames FROM messages WHERE seq = ?", (seq,)).fetchone()
        return _unpack(row[0]) if row else None

    def ack(self, seqs: Iterable[int]) -> int:
        """Forget the acknowledged messages; returns how many were still stored."""
        seqs = list(seqs)
        if not seqs:
            return 0
        with self._lock, self._db:
            removed, freed = 0, 0
            for chunk in (seqs[i : i + 500] for i in range(0, len(seqs), 500)):  # SQLite's parameter limit
                marks = ",".join("?" * len(chunk))
                count, size = self._db.execute(
                    f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM messages WHERE seq IN ({marks})", chunk
                ).fetchone()
                self._db.execute(f"DELETE FROM messages WHERE seq IN ({marks})", chunk)
                removed, freed = removed + count, freed + size
            self._messages -= removed
            self._bytes -= freed
        return removed

    def close(self) -> None:
        with self._lock:
            if self._unreported:
                self._report_drops()
            self._db.close()

    def _drop_oldest(self) -> None:
        """Drop the oldest messages until the spool fits its bound again (inside the caller's transaction)."""
        excess, count, freed, last = self._bytes - self.max_bytes, 0, 0, None
        for seq, size in self._db.execute("SELECT seq, size FROM messages ORDER BY seq"):
            count, freed, last = count + 1, freed + size, seq
            if freed >= excess:
                break
        self._db.execute("DELETE FROM messages WHERE seq <= ?", (last,))
        self._messages -= count
        self._bytes -= freed
        self.dropped += count
        self._unreported, self._last_dropped = self._unreported + count, last
        if time.monotonic() >= self._next_report:
            self._report_drops()

    def _report_drops(self) -> None:
        """One warning for the drops since the last one (a full spool drops on every append: no flood)."""
        log.warning(
            "spool %s is over its %d-byte bound: dropped the %d oldest unacknowledged message(s) (up to seq %d); "
            "%d dropped so far",
            self.path,
            self.max_bytes,
            self._unreported,
            self._last_dropped,
            self.dropped,
        )
        self._unreported = 0
        self._next_report = time.monotonic() + DROP_REPORT_INTERVAL

    def _load_next_seq(self) -> int:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('next_seq', ?)", (time.time_ns() // 1000,)
            )
            return self._db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()[0]


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
    except (OSError, sqlite3.Error) as exc:
        raise FilterForwardError(
            f"cannot open the spool {path} ({exc}): check spool.path and its permissions"
        ) from None
    db.isolation_level = "DEFERRED"  # `with db:` now wraps each write in one transaction
    return db


def _pack(frames: Frames) -> bytes:
    """Multipart frames as one blob: per frame a 4-byte big-endian length, then its bytes."""
    return b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames)


def _unpack(blob: bytes) -> Frames:
    frames, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 4], "big")
        frames.append(bytes(blob[at + 4 : at + 4 + size]))
        at += 4 + size
    return frames
