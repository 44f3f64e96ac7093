"""The uplink's durable message spool: every frame/event message until the cloud acknowledges it.

One SQLite file (stdlib sqlite3, WAL) holds the encoded multipart frames of each message, keyed by its
sequence number. A message is built and stored in one transaction together with the next seq, so the seq
inside its header is exactly the seq it is stored under, and a resend is byte-identical. A committed
append survives a crash of the process (kill -9); synchronous=NORMAL trades the last few commits before
an OS crash or power loss for not waiting on the disk for every matched frame.

A sender whose messages come from its own durable store (edge.footage) can store a mark (a named integer: how
far it got) in the same transaction as a message, so after a crash it neither loses nor repeats one.

Seqs never repeat: the next seq is persisted apart from the messages, so it survives an emptied spool,
and a new spool file starts at the current time in microseconds, so even a deleted spool does not reuse
the seqs (which the cloud deduplicates on) of the one before it. A spool file SQLite finds damaged at start (a
disk fault, a copy cut short) is moved aside beside it, with a line saying how to recover its messages, and a
new one is started: an edge that filters nothing until someone steps in is worse than the loss of what the
damaged file held.

The spool is bounded in bytes: an append that takes it over `max_bytes` drops the OLDEST messages and
counts them in `dropped`; a warning says how many (one per DROP_REPORT_INTERVAL while it keeps dropping,
and the rest at close). Messages appended with `keep` (events, a clip filter's with its clip, and footage: few, and what
a lost one breaks stays broken, an event open for good or a dataset that never completes) go only after every other
message: the oldest matched frames and stream fragments are dropped first. SQLite keeps the pages of deleted
messages for reuse; once a backlog has been acknowledged and the spool is empty, they go back to the disk.

A full disk is handled by the same rule. On a disk with less than DISK_HEADROOM bytes free an append first
drops the oldest messages worth a little more than its own size, so the file stops growing and the new
message reuses their pages; the first such drop also checkpoints, so no WAL frame is left waiting to grow
the file. SQLite needs that headroom: on a disk with no byte left, a checkpoint that must grow the file
fails, and then not even a delete can be committed. If an append still fails with "database or disk is
full" (ENOSPC; say, another process took the last bytes), the spool checkpoints, drops the oldest messages
and tries once more; failing that, the new message is dropped. Either way it is counted in `dropped`,
nothing is raised to the camera thread, and one warning per episode says so (one line when the disk has
room again).
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from models.errors import FilterForwardError, is_disk_full

log = logging.getLogger(__name__)

FILE_NAME = "spool.sqlite"
DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}  # a file SQLite cannot read as a database
DROP_REPORT_INTERVAL = 30.0  # seconds between warnings while a full spool keeps dropping
DISK_HEADROOM = 8 * 2**20  # bytes the spool leaves free on its disk: SQLite's WAL (~4 MB) and a checkpoint
SHRINK_FREE = 16 * 2**20  # an emptied spool with more free pages than this gives them back (VACUUM)
DROP_SLACK = 2**16  # a drop for disk space frees this much more than the new message needs: no page-count creep
Frames = list[bytes]
Mark = tuple[str, int]  # (key, value): a sender's progress, stored with its message
MARK_PREFIX = "mark:"  # marks share the meta table with next_seq
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY, size INTEGER NOT NULL, frames BLOB NOT NULL, keep INTEGER NOT NULL DEFAULT 0
);
"""
_DROP_ORDER = "CREATE INDEX IF NOT EXISTS messages_drop_order ON messages (keep, seq)"


class _DiskFull(Exception):
    """A write failed for lack of disk space (SQLITE_FULL or ENOSPC); the transaction was rolled back."""


@dataclass
class _Dropped:
    """The oldest messages one delete removed."""

    count: int = 0
    freed: int = 0
    last: int | None = None  # the highest seq among them


class Spool:
    """A thread-safe, byte-bounded, persistent FIFO of encoded messages keyed by seq."""

    def __init__(self, folder: Path, max_bytes: int):
        if max_bytes <= 0:
            raise FilterForwardError(f"spool max_bytes must be positive, got {max_bytes}")
        self.path = Path(folder) / FILE_NAME
        self.max_bytes = max_bytes
        self.dropped = 0  # messages lost: over the bound or for lack of disk space
        self._unreported, self._last_dropped, self._next_report = 0, 0, 0.0  # drops not yet in a warning
        self._disk_full = False  # in a full-disk episode (reported once)
        self._disk_dropped, self._rejected = 0, 0  # this episode: oldest dropped, new ones not stored
        self._lock = threading.Lock()
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if exc.sqlite_errorcode not in DAMAGED:
                raise _unusable(self.path, exc) from None
            _move_aside(self.path, exc)
            self._open()

    def _open(self) -> None:
        """Open the file and read its state: a damaged file may pass the open and fail only on the first read."""
        self._first_at_close: int | None = None
        self._db = _connect(self.path)
        try:
            self._next_seq = self._load_next_seq()
            self._messages, self._bytes = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM messages"
            ).fetchone()
        except sqlite3.DatabaseError:
            self._db.close()
            raise

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

    @property
    def first_seq(self) -> int:
        """The oldest seq still held (the next one when it is empty): every seq below it was acknowledged or dropped,
        so it is never sent again (the cloud forgets those keys: edge.uplink's stats report it). After close, the
        one it had then (stats are read after the uplink closes)."""
        with self._lock:
            return self._first_seq() if self._first_at_close is None else self._first_at_close

    def _first_seq(self) -> int:
        oldest = self._db.execute("SELECT MIN(seq) FROM messages").fetchone()[0]
        return self._next_seq if oldest is None else oldest

    def append(self, build: Callable[[int], Frames], mark: Mark | None = None, keep: bool = False) -> int | None:
        """Store the message `build(seq)` under the next seq (and `mark`, if given), in one transaction; returns the
        seq, or None when a full disk left no room for it (counted in `dropped`; the seq is used again). A `keep`
        message is dropped for room only when no other is left."""
        with self._lock:
            seq = self._next_seq
            frames = build(seq)
            size, blob = sum(len(frame) for frame in frames), _pack(frames)
            low = self._disk_low(size)
            if low:
                self._drop_for_disk(size)
            try:
                self._insert(seq, size, blob, mark, keep)
            except _DiskFull:
                if not self._retry_after_full(seq, size, blob, mark, keep):
                    return None
            else:
                if not low and self._disk_full:
                    self._disk_room_again()
            self._next_seq = seq + 1
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
        """Forget the acknowledged messages; returns how many were still stored. On a disk too full even for
        that they stay (0 is returned): resent later, the cloud acknowledges them again as duplicates."""
        seqs = list(seqs)
        if not seqs:
            return 0
        with self._lock:
            try:
                removed, freed = self._write(lambda: self._delete(seqs))
            except _DiskFull:
                self._checkpoint()
                try:
                    removed, freed = self._write(lambda: self._delete(seqs))
                except _DiskFull:
                    self._full_disk_episode()
                    return 0
            self._messages -= removed
            self._bytes -= freed
            if not self._messages:
                self._shrink()
        return removed

    def mark(self, key: str) -> int | None:
        """The value last stored under `key` with a message (see append), or None."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (MARK_PREFIX + key,)).fetchone()
        return row[0] if row else None

    def unmark(self, key: str) -> None:
        """Forget a mark. Best effort: on a disk too full even for that it stays, and its owner tries again later."""
        with self._lock:
            try:
                self._write(lambda: self._db.execute("DELETE FROM meta WHERE key = ?", (MARK_PREFIX + key,)))
            except _DiskFull:
                log.debug("spool %s: mark %s not removed: the disk is full", self.path, key)

    def close(self) -> None:
        with self._lock:
            if self._unreported:
                self._report_drops()
            self._first_at_close = self._first_seq()
            self._db.close()

    # -- writing ----------------------------------------------------------------------------------------------

    def _write(self, work: Callable[[], T]) -> T:
        """work() in one transaction; _DiskFull (rolled back) when the disk has no room for it."""
        try:
            with self._db:
                return work()
        except (sqlite3.OperationalError, OSError) as exc:
            if is_disk_full(exc):
                raise _DiskFull from exc
            raise

    def _insert(self, seq: int, size: int, blob: bytes, mark: Mark | None, keep: bool) -> None:
        """Store one message (and drop the oldest if that takes the spool over its bound); counts after commit."""

        def work() -> _Dropped:
            self._db.execute(
                "INSERT INTO messages (seq, size, frames, keep) VALUES (?, ?, ?, ?)", (seq, size, blob, int(keep))
            )
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (seq + 1,))
            if mark is not None:
                key, value = mark
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (MARK_PREFIX + key, value))
            excess = self._bytes + size - self.max_bytes
            return self._delete_oldest(excess) if excess > 0 else _Dropped()

        dropped = self._write(work)
        self._messages += 1
        self._bytes += size
        if dropped.count:
            self._forget(dropped)
            self._unreported, self._last_dropped = self._unreported + dropped.count, dropped.last
            if time.monotonic() >= self._next_report:
                self._report_drops()

    def _delete(self, seqs: list[int]) -> tuple[int, int]:
        removed, freed = 0, 0
        for chunk in (seqs[i : i + 500] for i in range(0, len(seqs), 500)):  # SQLite's parameter limit
            marks = ",".join("?" * len(chunk))
            count, size = self._db.execute(
                f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM messages WHERE seq IN ({marks})", chunk
            ).fetchone()
            self._db.execute(f"DELETE FROM messages WHERE seq IN ({marks})", chunk)
            removed, freed = removed + count, freed + size
        return removed, freed

    def _delete_oldest(self, excess: int) -> _Dropped:
        """Delete the oldest messages worth at least `excess` bytes (all if they fall short), those appended with
        `keep` last, inside the caller's transaction; the caller updates the counts once it commits."""
        dropped, seqs = _Dropped(), []
        for seq, size in self._db.execute("SELECT seq, size FROM messages ORDER BY keep, seq"):  # read lazily
            seqs.append(seq)
            dropped.count, dropped.freed = dropped.count + 1, dropped.freed + size
            if dropped.freed >= excess:
                break
        if seqs:
            self._delete(seqs)
            dropped.last = max(seqs)
        return dropped

    def _forget(self, dropped: _Dropped) -> None:
        self._messages -= dropped.count
        self._bytes -= dropped.freed
        self.dropped += dropped.count

    def _shrink(self) -> None:
        """Give an emptied spool's free pages back to the disk once they are many (a backlog from an outage was
        acknowledged): SQLite reuses free pages but never returns them, so the file kept its peak size for good.
        With no message left VACUUM rewrites only the meta table, and the checkpoint truncates file and WAL."""
        free = self._free_page_bytes()
        if free < SHRINK_FREE:
            return
        try:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError as exc:  # best effort: the file keeps its pages, which appends reuse
            log.debug("spool %s: not shrunk: %s", self.path, exc)
            return
        log.info("spool %s: emptied, gave %d MB of free pages back to the disk", self.path, free >> 20)

    def _free_page_bytes(self) -> int:
        """Bytes in the file's free pages: deleted messages' space, which SQLite reuses before growing the file."""
        pages, page_size = (
            self._db.execute(f"PRAGMA {name}").fetchone()[0] for name in ("freelist_count", "page_size")
        )
        return pages * page_size

    # -- a full disk ------------------------------------------------------------------------------------------

    def _disk_low(self, size: int) -> bool:
        """True when storing `size` more bytes would eat into the headroom SQLite needs on this disk."""
        try:
            free = shutil.disk_usage(self.path.parent).free
        except OSError:
            return False  # unknown: the insert will tell
        return free < DISK_HEADROOM + size

    def _drop_for_disk(self, size: int) -> None:
        """Drop the oldest messages (in their own transaction) until the file's free pages hold `size` bytes and
        some slack, so the new message reuses them; nothing when the whole spool would not make that room."""
        self._full_disk_episode()
        needed = size + DROP_SLACK - self._free_page_bytes()
        if needed <= 0 or needed > self._bytes:
            return
        try:
            dropped = self._write(lambda: self._delete_oldest(needed))
        except _DiskFull:
            return
        self._forget(dropped)
        self._disk_dropped += dropped.count

    def _retry_after_full(self, seq: int, size: int, blob: bytes, mark: Mark | None, keep: bool) -> bool:
        """After an append failed for lack of space: checkpoint, drop the oldest, try once more. False when the
        new message had to be dropped instead."""
        self._checkpoint()
        self._drop_for_disk(size)
        try:
            self._insert(seq, size, blob, mark, keep)
            return True
        except _DiskFull:
            pass
        self.dropped += 1
        self._rejected += 1
        if self._rejected == 1:
            log.warning(
                "spool %s: the disk is full and no room could be made: new messages are dropped (seq %d is the "
                "first; %d dropped so far) until its disk has free space",
                self.path,
                seq,
                self.dropped,
            )
        return False

    def _checkpoint(self) -> None:
        """Move the WAL into the database so the WAL's space is written from its start again (no growth).
        Best effort: when it cannot (no room, or another process reading), the retry that follows says so."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(RESTART)")
        except sqlite3.OperationalError as exc:
            log.debug("spool %s: checkpoint failed: %s", self.path, exc)

    def _full_disk_episode(self) -> None:
        """At the start of an episode: checkpoint while there is still room to (see the module doc), and say so."""
        if self._disk_full:
            return
        self._disk_full = True
        self._checkpoint()
        log.warning(
            "spool %s: its disk is (nearly) full, %d bytes free: dropping the oldest unacknowledged messages to "
            "make room for new ones until space is freed on that disk (the spool leaves %d bytes free)",
            self.path,
            _free_bytes(self.path.parent),
            DISK_HEADROOM,
        )

    def _disk_room_again(self) -> None:
        log.info(
            "spool %s: its disk has room again (%d bytes free); %d old and %d new message(s) were dropped for "
            "lack of space",
            self.path,
            _free_bytes(self.path.parent),
            self._disk_dropped,
            self._rejected,
        )
        self._disk_full, self._disk_dropped, self._rejected = False, 0, 0

    # -- reporting and opening --------------------------------------------------------------------------------

    def _report_drops(self) -> None:
        """One warning for the drops since the last one (a full spool drops on every append: no flood)."""
        log.warning(
            "spool %s is over its %d-byte bound: dropped the %d oldest unacknowledged message(s) (the newest of "
            "them seq %d; events and footage are kept while there are others to drop); %d dropped so far",
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


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return -1


def _connect(path: Path) -> sqlite3.Connection:
    """The spool's database, its tables made; a damaged file raises sqlite3.DatabaseError (for the caller to move
    aside), any other failure one line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise _unusable(path, exc) from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA secure_delete=FAST")  # Debian's default (ON) writes every acked byte again, as zeros
        db.executescript(_SCHEMA)
        if "keep" not in {row[1] for row in db.execute("PRAGMA table_info(messages)")}:  # a spool from before it
            db.execute("ALTER TABLE messages ADD COLUMN keep INTEGER NOT NULL DEFAULT 0")
        db.execute(_DROP_ORDER)
    except sqlite3.DatabaseError as exc:
        db.close()
        if exc.sqlite_errorcode in DAMAGED:
            raise
        raise _unusable(path, exc) from None
    db.isolation_level = "DEFERRED"  # `with db:` now wraps each write in one transaction
    return db


def _unusable(path: Path, exc: Exception) -> FilterForwardError:
    return FilterForwardError(f"cannot open the spool {path} ({exc}): check spool.path and its permissions")


def _move_aside(path: Path, exc: sqlite3.DatabaseError) -> None:
    """Rename a damaged spool file (and its WAL and shared-memory files) to <name>.damaged-<time>."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(path.with_name(f"{path.name}.damaged-{stamp}{suffix}"))
    log.error(
        "spool %s is damaged (%s): moved aside as %s.damaged-%s and started empty; the messages it held are not "
        "sent (sqlite3 FILE .recover may save some)",
        path, exc, path.name, stamp,
    )  # fmt: skip


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
