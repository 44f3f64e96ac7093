"""The images of frames that travelled in a camera's H.264 stream: which stored fragments to read for one
frame (decoded to JPEG once, then kept as the frame's file) or for an event's clip (joined, not re-encoded).

A fragment decodes from the start of its GOP: the fragments of the same edge run and camera, in seq order,
back to the last one that starts a GOP (a fragment stored without an earlier part of its GOP is not playable:
cloud.storage). Retention deletes the oldest fragments first, so a GOP whose start is
gone cannot be decoded any more; that is reported as the image having been removed, and an event's clip starts at
the first GOP it still has (a long event keeps its later part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cloud.db import Fragment, StoredFrame
from cloud.fragments import frame_jpeg, join_mp4
from cloud.framestore import FrameStore
from common import fragment as wire
from models.errors import FilterForwardError

REMOVED = "the start of its stream segment has been removed (retention)"


def frame_image(session: Session, store: FrameStore, frame: StoredFrame) -> bytes:
    """The frame's JPEG: its file, or decoded from its fragment and kept as its file for the next request."""
    if frame.path is not None:
        return store.open_path(frame.path).read_bytes()
    if frame.fragment_id is None:
        raise FilterForwardError(
            "none came with it: its filter sends a clip instead (encoding: clip), its edge stopped before the "
            "stream fragment holding it went out, or the edge's full spool dropped part of its stream segment"
        )
    holding = session.get(Fragment, frame.fragment_id)
    jpeg = frame_jpeg(_read(store, _gop_until(session, holding)), frame.frame_index)
    frame.path = store.write("frames", frame.edge_id, frame.camera, f"{frame.run}-{frame.seq}.jpg", jpeg)
    frame.size = len(jpeg)
    session.commit()
    return jpeg


def frame_crop(session: Session, store: FrameStore, frame: StoredFrame) -> wire.Crop | None:
    """The part of the camera's frame its image shows: the crop of the fragment holding it (`upload: {crop:
    roi}` on the edge); None for the whole frame (or a frame sent as JPEG)."""
    if frame.fragment_id is None or (holding := session.get(Fragment, frame.fragment_id)) is None:
        return None
    try:
        return wire.unpack(store.open_path(holding.path).read_bytes()).header.crop
    except (OSError, wire.FragmentError):
        return None  # removed meanwhile (retention): the image itself says so


@dataclass(frozen=True)
class EventVideo:
    mp4: bytes
    first_time: float  # stream time of its first frame, which may come before the event's (the GOP's start)


def event_video(session: Session, store: FrameStore, frames: Sequence[StoredFrame]) -> EventVideo | None:
    """One MP4 of the stream from the GOP holding the event's first streamed frame through its last one (frames
    other filters matched in between included, before the event's first too: a clip starts at a keyframe; from the
    next GOP when retention removed that one's start); None if none of its frames travelled in the stream."""
    ids = {frame.fragment_id for frame in frames if frame.fragment_id is not None}
    if not ids:
        return None
    rows = session.scalars(select(Fragment).where(Fragment.id.in_(ids)).order_by(Fragment.seq)).all()
    first, last = rows[0], rows[-1]
    if any((row.edge_id, row.run, row.camera) != (first.edge_id, first.run, first.camera) for row in rows):
        raise FilterForwardError("its frames lie in more than one stream")
    start_seq = _gop_start(session, first)
    if start_seq is None:  # retention removed the start of its first GOP: the clip begins at the next one
        start_seq = session.scalar(
            select(func.min(Fragment.seq)).where(
                *_same_stream(first), Fragment.seq > first.seq, Fragment.seq <= last.seq, Fragment.starts_gop
            )
        )
    if start_seq is None:
        raise FilterForwardError(REMOVED)
    fragments = _read(store, [row for row in _stream_part(session, first, start_seq, last.seq) if row.playable])
    return EventVideo(join_mp4(fragments), fragments[0].header.frames[0].time)  # a GOP cut short ends early


def _same_stream(row: Fragment) -> tuple:
    return Fragment.edge_id == row.edge_id, Fragment.run == row.run, Fragment.camera == row.camera


def _gop_start(session: Session, row: Fragment) -> int | None:
    """The seq of the fragment that starts `row`'s GOP; None when retention removed it."""
    return session.scalar(
        select(func.max(Fragment.seq)).where(*_same_stream(row), Fragment.seq <= row.seq, Fragment.starts_gop)
    )


def _gop_until(session: Session, row: Fragment) -> list[Fragment]:
    """The fragments of `row`'s GOP up to and including it, in seq order."""
    if (start_seq := _gop_start(session, row)) is None:
        raise FilterForwardError(REMOVED)
    return _stream_part(session, row, start_seq, row.seq)


def _stream_part(session: Session, row: Fragment, first_seq: int, last_seq: int) -> list[Fragment]:
    """The fragments of `row`'s stream with a seq in [first_seq, last_seq], in seq order."""
    return list(
        session.scalars(
            select(Fragment)
            .where(*_same_stream(row), Fragment.seq >= first_seq, Fragment.seq <= last_seq)
            .order_by(Fragment.seq)
        )
    )


def _read(store: FrameStore, rows: Sequence[Fragment]) -> list[wire.Fragment]:
    try:
        return [wire.unpack(store.open_path(row.path).read_bytes()) for row in rows]
    except OSError:
        raise FilterForwardError("a fragment of its stream segment has been removed (retention)") from None
