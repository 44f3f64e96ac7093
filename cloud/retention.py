"""Retention: delete the oldest stored payloads (frame rows with their files, event clips, stream fragments) by
age, then by size.

Frames age by when the cloud received them, clips by when their event ended. Rows go first (one
transaction per batch), then their files, so no row ever points at a file deleted before it; a file
already missing is fine. An ended event that lost its last frame and its clip here is deleted as well, and so is
one older than the age limit that never had any (its frames were dropped from an edge's full spool in an outage).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import ColumnElement, delete, exists, func, select, true, update
from sqlalchemy.orm import Session, sessionmaker

from cloud.db import Edge, Event, EventFrame, Fragment, Received, StoredFrame, as_utc, utcnow
from cloud.framestore import FrameStore
from cloud.storage import add_counter, transact

log = logging.getLogger(__name__)

BATCH = 500
EVERY = true()  # the condition every row meets
# An edge resends a message only until the cloud acks it, so its (edge, seq) key is needed for duplicates a
# few outages long at most. Keys below the oldest seq an edge still holds in its spool (its stats say which) are
# pruned once older than RESEND_WINDOW (a resend of an acknowledged message may still be on its way); those of
# edges that do not say (before 2026-12-08) after RECEIVED_KEEP. At 23 messages a second, a week of keys took
# 1.6 GB of database for 3 MB of payloads.
RECEIVED_KEEP = timedelta(days=7)
RESEND_WINDOW = timedelta(minutes=10)
ORPHAN_AGE = 3600.0  # seconds: a payload write takes well under one; a file still unfinished after this was cut off
FRAMES, CLIPS, FRAGMENTS, EVENTS, BYTES = (
    "retention_frames_deleted",
    "retention_clips_deleted",
    "retention_fragments_deleted",
    "retention_events_deleted",
    "retention_bytes_deleted",
)


def _prune_received(session: Session) -> None:
    """Forget the (edge, seq) keys no edge can send again (see RECEIVED_KEEP)."""
    now = utcnow()
    session.execute(delete(Received).where(Received.received_at < now - RECEIVED_KEEP))
    for edge, stats in session.execute(select(Edge.id, Edge.stats)):
        first = stats.get("spool_first_seq")
        if isinstance(first, int | float) and not isinstance(first, bool):
            session.execute(
                delete(Received).where(
                    Received.edge_id == edge, Received.seq < first, Received.received_at < now - RESEND_WINDOW
                )
            )


@dataclass(frozen=True)
class _Payload:
    kind: Literal["frame", "clip", "fragment"]
    id: int  # frame or fragment id, or the clip's event id
    path: str | None
    size: int
    at: datetime


def sweep(
    sessions: sessionmaker, store: FrameStore, max_age_days: float | None, max_bytes: int | None
) -> dict[str, int]:
    """One retention pass; returns (and adds to the persistent counters) what it deleted."""
    tally = dict.fromkeys((FRAMES, CLIPS, FRAGMENTS, EVENTS, BYTES), 0)
    if time.monotonic() - store.orphans_scanned_at >= ORPHAN_AGE:  # a walk of every file: once an hour is enough
        clean_orphans(store, ORPHAN_AGE)
    if max_age_days is not None:
        cutoff = utcnow() - timedelta(days=max_age_days)
        while batch := _oldest(
            sessions, StoredFrame.received_at < cutoff, Event.ended_at < cutoff, Fragment.received_at < cutoff
        ):
            _delete(sessions, store, batch, tally)
        with sessions.begin() as session:
            tally[EVENTS] += _delete_emptied_events(session, Event.ended_at < cutoff)
    if max_bytes is not None:
        while (excess := _stored(sessions) - max_bytes) > 0 and (batch := _covering(_oldest(sessions), excess)):
            _delete(sessions, store, batch, tally)
    with sessions.begin() as session:
        _prune_received(session)
    if any(tally.values()):
        transact(sessions, lambda session: _count(session, tally))
        log.info(
            "retention deleted %d frames, %d clips, %d fragments, %d events (%d bytes): limits %s days, %s bytes",
            tally[FRAMES],
            tally[CLIPS],
            tally[FRAGMENTS],
            tally[EVENTS],
            tally[BYTES],
            max_age_days,
            max_bytes,
        )
    return tally


def clean_orphans(store: FrameStore, older_than: float) -> None:
    """Remove the files of payload writes a killed process left unfinished (0: all of them, at start-up)."""
    files, freed = store.remove_orphans(older_than)
    if files:
        log.warning("removed %d unfinished payload file(s) (%d bytes) left by an interrupted write", files, freed)


def _oldest(
    sessions: sessionmaker,
    frames_where: ColumnElement[bool] = EVERY,
    clips_where: ColumnElement[bool] = EVERY,
    fragments_where: ColumnElement[bool] = EVERY,
) -> list[_Payload]:
    """Up to BATCH frames, BATCH clips and BATCH fragments matching the conditions, oldest first."""
    with sessions() as session:
        frames = session.execute(
            select(StoredFrame.id, StoredFrame.path, StoredFrame.size, StoredFrame.received_at)
            .where(frames_where)
            .order_by(StoredFrame.received_at, StoredFrame.id)
            .limit(BATCH)
        )
        clips = session.execute(
            select(Event.id, Event.clip_path, Event.clip_size, Event.ended_at)
            .where(Event.clip_path.is_not(None), clips_where)
            .order_by(Event.ended_at, Event.id)
            .limit(BATCH)
        )
        fragments = session.execute(
            select(Fragment.id, Fragment.path, Fragment.size, Fragment.received_at)
            .where(fragments_where)
            .order_by(Fragment.received_at, Fragment.id)
            .limit(BATCH)
        )
        payloads = [_Payload("frame", *row[:3], as_utc(row[3])) for row in frames]
        payloads += [_Payload("clip", *row[:3], as_utc(row[3])) for row in clips]
        payloads += [_Payload("fragment", *row[:3], as_utc(row[3])) for row in fragments]
    return sorted(payloads, key=lambda payload: payload.at)


def _covering(payloads: list[_Payload], excess: int) -> list[_Payload]:
    """The oldest payloads whose sizes add up to at least `excess` bytes (all of them if they fall short)."""
    chosen, freed = [], 0
    for payload in payloads:
        if freed >= excess:
            break
        chosen.append(payload)
        freed += payload.size
    return chosen


def _stored(sessions: sessionmaker) -> int:
    with sessions() as session:
        return stored_bytes(session)


def stored_bytes(session: Session) -> int:
    """Bytes of stored payloads: JPEG frames, event clips and stream fragments (what max_bytes bounds)."""
    frames = session.scalar(select(func.coalesce(func.sum(StoredFrame.size), 0)))
    clips = session.scalar(select(func.coalesce(func.sum(Event.clip_size), 0)).where(Event.clip_path.is_not(None)))
    fragments = session.scalar(select(func.coalesce(func.sum(Fragment.size), 0)))
    return int(frames) + int(clips) + int(fragments)


def _delete(sessions: sessionmaker, store: FrameStore, payloads: list[_Payload], tally: dict[str, int]) -> None:
    frame_ids = [payload.id for payload in payloads if payload.kind == "frame"]
    clip_ids = [payload.id for payload in payloads if payload.kind == "clip"]
    fragment_ids = [payload.id for payload in payloads if payload.kind == "fragment"]
    with sessions.begin() as session:
        touched = set(session.scalars(select(EventFrame.event_uid).where(EventFrame.frame_id.in_(frame_ids))))
        touched.update(session.scalars(select(Event.uid).where(Event.id.in_(clip_ids))))
        session.execute(delete(StoredFrame).where(StoredFrame.id.in_(frame_ids)))  # event_frames rows cascade
        session.execute(update(Event).where(Event.id.in_(clip_ids)).values(clip_path=None, clip_size=0))
        session.execute(delete(Fragment).where(Fragment.id.in_(fragment_ids)))  # their frames' fragment_id: NULL
        tally[EVENTS] += _delete_emptied_events(session, Event.uid.in_(touched))
    tally[FRAMES] += len(frame_ids)
    tally[CLIPS] += len(clip_ids)
    tally[FRAGMENTS] += len(fragment_ids)
    tally[BYTES] += sum(store.delete(payload.path) for payload in payloads if payload.path)


def _count(session: Session, tally: dict[str, int]) -> None:
    for name, n in tally.items():
        if n:
            add_counter(session, name, n)


def _delete_emptied_events(session: Session, which: ColumnElement[bool]) -> int:
    """Deletes the ended events meeting `which` that have no frame and no clip (left); returns how many."""
    emptied = delete(Event).where(
        which,
        Event.ended_at.is_not(None),
        Event.clip_path.is_(None),
        ~exists().where(EventFrame.event_uid == Event.uid),
    )
    return session.execute(emptied).rowcount
