"""/api/events (queries with keyset pagination), an event's frames, frame images (JPEG) and event clips (MP4).

Pages are ordered newest first on (started_at, id); the cursor is that pair of the page's last event,
opaque to clients, so a page never repeats or skips events inserted meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import FileResponse
from pydantic import BeforeValidator
from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

from cloud import streams
from cloud.auth import require
from cloud.clips import encode_clip
from cloud.db import Event, EventFrame, StoredFrame, as_utc, thumbnail_of
from cloud.framestore import FrameStore
from cloud.links import clip_path, frame_path
from cloud.media_responses import get_and_head, media, ranged
from cloud.routers import SessionDep, StoreDep, not_found
from cloud.schemas import EventOut, EventPage, FrameOut, errors
from models.errors import FilterForwardError

router = APIRouter(tags=["events"], dependencies=[Depends(require("read"))], responses=errors(400, 401, 403, 404, 422))

_frame_count = (
    select(func.count()).select_from(EventFrame).where(EventFrame.event_uid == Event.uid).correlate(Event)
).scalar_subquery()
_thumbnail = thumbnail_of(Event)
EVENT_ROWS = select(Event, _frame_count, _thumbnail)
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
PLUS_READ_AS_SPACE = re.compile(r"\d \d\d(:?\d\d)?$")  # 12:00:00+01:00 sent unencoded arrives as 12:00:00 01:00


def _not_a_number(value: object) -> object:
    """Pydantic would read a number (or a string of one) as a unix time; the API takes ISO 8601 times only, as
    documented."""
    if isinstance(value, int | float) or (isinstance(value, str) and NUMBER.fullmatch(value.strip())):
        raise ValueError("use an ISO 8601 time such as 2024-05-01T12:00:00Z, not a number")
    if isinstance(value, str) and PLUS_READ_AS_SPACE.search(value):
        raise ValueError(
            f"{value!r} has a space before its UTC offset: a '+' in a URL reads as a space, send it as %2B"
        )
    return value


IsoTime = Annotated[datetime, BeforeValidator(_not_a_number)]
MAX_ROW_ID = 2**63 - 1  # ids are 64-bit integers in the database
# On a frame's JPEG decoded from a cropped stream (the edge's `upload: {crop: roi}`): which part of the camera's
# frame it shows, e.g. "x=384,y=216,width=640,height=360,frame_width=1280,frame_height=720" (pixels).
CROP_HEADER = "X-Crop"
# On an event's clip: seconds into it where the event's first frame plays. A clip made from the camera's stream
# starts at the keyframe before the event (another filter's event may have opened that GOP, frames earlier).
EVENT_START_HEADER = "X-Event-Start"
RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="an id from this API's answers")]


@router.get("/events")
def list_events(
    session: SessionDep,
    filter_name: Annotated[str | None, Query(alias="filter", description="filter name (empty: any)")] = None,
    camera: Annotated[str | None, Query(description="camera name (empty: any)")] = None,
    edge: Annotated[str | None, Query(description="edge id (empty: any)")] = None,
    since: Annotated[IsoTime | None, Query(description="ISO 8601; events that started at or after it")] = None,
    until: Annotated[IsoTime | None, Query(description="ISO 8601; events that started before it")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page (empty: the first page)")] = None,
) -> EventPage:
    """Events, newest first, optionally by filter, camera, edge and start-time range."""
    query: Select = EVENT_ROWS
    for column, value in ((Event.filter, filter_name), (Event.camera, camera), (Event.edge_id, edge)):
        if value:  # empty (a form's blank field): any, as an empty cursor is the first page
            query = query.where(column == value)
    start = None if since is None else in_utc("since", since)
    stop = None if until is None else in_utc("until", until)
    if start is not None and stop is not None and start > stop:
        raise _bad_request(f"since={since.isoformat()} is after until={until.isoformat()}: give since before until")
    if start is not None:
        query = query.where(Event.started_at >= start)
    if stop is not None:
        query = query.where(Event.started_at < stop)
    if cursor:  # empty: the first page
        started_at, event_id = decode_cursor(cursor)
        query = query.where(
            or_(Event.started_at < started_at, and_(Event.started_at == started_at, Event.id < event_id))
        )
    rows = session.execute(query.order_by(Event.started_at.desc(), Event.id.desc()).limit(limit + 1)).all()
    items = [event_out(*row) for row in rows[:limit]]
    next_cursor = encode_cursor(items[-1]) if len(rows) > limit else None
    return EventPage(items=items, next_cursor=next_cursor)


@router.get("/events/{event_id}")
def get_event(event_id: RowId, session: SessionDep) -> EventOut:
    row = session.execute(EVENT_ROWS.where(Event.id == event_id)).first()
    if row is None:
        raise _no_event(event_id)
    return event_out(*row)


@router.get("/events/{event_id}/frames")
def event_frames(event_id: RowId, session: SessionDep) -> list[FrameOut]:
    """The event's stored frames in stream order."""
    return [
        FrameOut(
            id=frame.id,
            frame_index=frame.frame_index,
            stream_time=frame.stream_time,
            captured_at=frame.captured_at,
            scores=frame.scores,
            image_url=frame_path(frame.id) if frame.path or frame.fragment_id else None,
        )
        for frame in _frames_of(session, _event(session, event_id))
    ]


FRAME_IMAGE = (
    f"the frame as sent, or decoded from its stream; {CROP_HEADER} says which part of the camera's frame a cropped "
    "stream's image shows"
)
EVENT_CLIP = (
    f"the edge's clip, or one made from its frames or its camera's stream; {EVENT_START_HEADER} says how many "
    "seconds into it the event begins"
)


@get_and_head(router, "/frames/{frame_id}.jpg", response_class=Response, responses=media("image/jpeg", FRAME_IMAGE))
def frame_image(frame_id: RowId, request: Request, session: SessionDep, store: StoreDep) -> Response:
    frame = session.get(StoredFrame, frame_id)
    if frame is None:
        raise not_found(f"frame {frame_id} is not stored (unknown, or removed by retention)")
    try:  # read at once: retention may delete the file right after
        data = streams.frame_image(session, store, frame)
    except OSError:
        raise not_found(f"frame {frame_id}'s image has been removed (retention)") from None
    except FilterForwardError as exc:
        raise not_found(f"frame {frame_id} has no stored image: {exc}") from None
    headers = {"Cache-Control": "private, max-age=86400"}
    if (crop := streams.frame_crop(session, store, frame)) is not None:
        headers[CROP_HEADER] = ",".join(f"{key}={value}" for key, value in crop.model_dump().items())
    return ranged(request, data, "image/jpeg", headers)


@get_and_head(router, "/events/{event_id}/clip.mp4", response_class=Response, responses=media("video/mp4", EVENT_CLIP))
def event_clip(event_id: RowId, request: Request, session: SessionDep, store: StoreDep) -> Response:
    event = _event(session, event_id)
    starts_at_0 = {EVENT_START_HEADER: "0.000"}
    if event.clip_path is not None:
        try:
            return FileResponse(store.open_path(event.clip_path), media_type="video/mp4", headers=starts_at_0)
        except FilterForwardError:
            pass  # removed by retention: fall back to the frames, if any are left
    frames = _frames_of(session, event)
    try:
        if (video := streams.event_video(session, store, frames)) is not None:
            offset = max(0.0, event.start_time - video.first_time)
            return ranged(request, video.mp4, "video/mp4", {EVENT_START_HEADER: f"{offset:.3f}"})
        jpegs = [frame for frame in frames if frame.path is not None]
        if not jpegs:
            raise not_found(f"event {event_id} has no stored clip, stream or JPEG frames to make one from")
        return ranged(request, encode_clip(_stored_jpegs(store, jpegs)), "video/mp4", starts_at_0)
    except FilterForwardError as exc:
        raise not_found(f"event {event_id}: {exc}") from None


def in_utc(name: str, value: datetime) -> datetime:
    """A query's time in UTC (without an offset it is taken as UTC)."""
    try:
        return as_utc(value)
    except OverflowError:  # a time near year 1 or 9999 whose offset takes it out of range in UTC
        raise _bad_request(
            f"{name}={value.isoformat()} is outside years 1-9999 in UTC: use a time within them"
        ) from None


def encode_cursor(last: EventOut) -> str:
    raw = json.dumps([last.started_at.isoformat(), last.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        started_at, event_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(event_id, int) or not 0 <= event_id <= MAX_ROW_ID:
            raise ValueError("not an event id")
        return as_utc(datetime.fromisoformat(started_at)), event_id
    except (binascii.Error, ValueError, TypeError, OverflowError):  # JSON and unpacking errors included
        raise _bad_request(
            "cursor is not one this API returned: pass next_cursor of the previous page unchanged"
        ) from None


def event_out(event: Event, frames: int, thumbnail: int | None) -> EventOut:
    return EventOut(
        **event.described(),
        open=event.ended_at is None,
        frames=frames,
        thumbnail_url=frame_path(thumbnail) if thumbnail is not None else None,
        clip_url=clip_path(event.id),
    )


def _event(session: Session, event_id: int) -> Event:
    event = session.get(Event, event_id)
    if event is None:
        raise _no_event(event_id)
    return event


def _frames_of(session: Session, event: Event) -> list[StoredFrame]:
    query = (
        select(StoredFrame)
        .join(EventFrame, EventFrame.frame_id == StoredFrame.id)
        .where(EventFrame.event_uid == event.uid)
        .order_by(StoredFrame.frame_index, StoredFrame.id)
    )
    return list(session.scalars(query))


def _stored_jpegs(store: FrameStore, frames: list[StoredFrame]) -> Iterator[tuple[float, bytes]]:
    """(stream time, JPEG bytes) of the frames whose image is still stored, read one at a time."""
    for frame in frames:
        try:
            yield frame.stream_time, store.open_path(frame.path).read_bytes()
        except (FilterForwardError, OSError):
            continue  # removed by retention meanwhile


def _no_event(event_id: int) -> HTTPException:
    return not_found(f"no event {event_id}: list events with GET /api/events")


def _bad_request(message: str) -> HTTPException:
    return HTTPException(status.HTTP_400_BAD_REQUEST, message)
