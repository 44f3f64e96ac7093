"""Feedback from the event gallery (docs/studio.md): an event marked wrong or right, or an interval a filter missed,
becomes labelled frames of the filter's dataset (the dataset and event of the training job it runs, deployed last), so
the next revision trained on it learns from them.

The frames are the cloud's stored (matched) frames, copied into the dataset with their JPEG (decoded from their stream
fragment when they came in one, as GET /api/frames/{id}.jpg does) and remembered by their row, so a frame is copied
once however often it is marked. A camera frame several filters matched is stored once per filter: it counts as one
frame, its first stored row with an image. Frames of another size than the dataset's (an edge uploading only its
region of interest, `upload: {crop: roi}`) are refused: an image folder of mixed sizes cannot be trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session, sessionmaker

from cloud import streams
from cloud.datasets import DatasetError, Datasets, SourceFrame
from cloud.db import Event, EventFrame, StoredFrame
from cloud.framestore import FrameStore
from cloud.training import filter_source
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

MAX_FRAMES = 2000  # stored frames one missed interval may add: a longer interval is refused, not cut short
CHUNK = 100  # frames read and appended at a time (their JPEGs are held in memory meanwhile)
CAMERA_FRAME = (StoredFrame.edge_id, StoredFrame.run, StoredFrame.camera, StoredFrame.frame_index)


@dataclass(frozen=True)
class Given:
    """What a piece of feedback did to the filter's dataset."""

    dataset: str
    event: str
    added: int  # frames new to the dataset
    labelled: int  # frames labelled (added now, or in the dataset already)


class Feedback:
    def __init__(self, sessions: sessionmaker, store: FrameStore, datasets: Datasets) -> None:
        self._sessions = sessions
        self._store = store
        self._datasets = datasets

    def on_event(self, event_id: int, value: int, frames: list[int] | None) -> Given:
        """The event's stored frames with an image (all, or those listed) labelled `value`: 0 it was a false alarm,
        1 it was right."""
        with self._sessions() as session:
            event = session.get(Event, event_id)
            if event is None:
                raise DatasetError(404, f"no event {event_id}: list events with GET /api/events")
            dataset, label = filter_source(session, event.filter)
            which = StoredFrame.id.in_(select(EventFrame.frame_id).where(EventFrame.event_uid == event.uid))
            if frames is not None:
                found = set(session.scalars(select(StoredFrame.id).where(which, StoredFrame.id.in_(frames))))
                if outside := sorted(set(frames) - found):
                    raise DatasetError(
                        422,
                        f"frame {outside[0]} is not one of event {event_id}'s frames: list them with "
                        f"GET /api/events/{event_id}/frames",
                    )
                which = StoredFrame.id.in_(frames)
            ids = _camera_frames(session, which, limit=None)
        if not ids:
            raise DatasetError(
                409, f"event {event_id} has no stored frame with an image (sent without, or removed): mark another"
            )
        return self._give(dataset, label, value, ids, f"frames of event {event_id}")

    def missed(self, filter_name: str, edge: str, camera: str, start: datetime, end: datetime) -> Given:
        """Every stored frame with an image of the camera in [start, end) of the edge's clock, whichever filter sent
        it, labelled 1: the filter should have matched them."""
        if start >= end:
            raise DatasetError(
                422, f"start {start.isoformat()} is not before end {end.isoformat()}: give the interval in order"
            )
        with self._sessions() as session:
            dataset, label = filter_source(session, filter_name)
            which = and_(
                StoredFrame.edge_id == edge,
                StoredFrame.camera == camera,
                StoredFrame.captured_at >= start,
                StoredFrame.captured_at < end,
            )
            ids = _camera_frames(session, which, limit=MAX_FRAMES + 1)
        if not ids:
            raise DatasetError(
                409,
                f"the cloud holds no frame of camera {camera!r} of edge {edge!r} from {start.isoformat()} to "
                f"{end.isoformat()} (only matched frames are kept): request footage of that camera "
                "(POST /api/datasets/footage) and label it",
            )
        if len(ids) > MAX_FRAMES:
            raise DatasetError(
                422, f"the interval holds over {MAX_FRAMES} stored frames of camera {camera!r}: mark a shorter one"
            )
        return self._give(dataset, label, value=1, ids=ids, whose=f"frames of camera {camera!r} in that interval")

    def _give(self, dataset: str, event: str, value: int, ids: list[int], whose: str) -> Given:
        """The frames into the dataset, a chunk at a time (each its own transaction: a retry after a failure adds
        only what is missing). Frames of another size than the dataset's (a cropped upload) are refused, all or
        nothing: with several chunks, every image's size is checked before the first chunk is added."""
        chunks = [ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK)]
        if len(chunks) > 1:  # (one chunk: append checks it)
            for chunk in chunks:
                self._datasets.check_size(dataset, self._read(chunk), whose)
        added = labelled = 0
        for chunk in chunks:
            frames = self._read(chunk)
            added += self._datasets.append(dataset, event, value, frames, whose)
            labelled += len(frames)
        if not labelled:
            raise DatasetError(409, "the frames' images have been removed (retention): mark newer frames")
        log.info("feedback: %d frames of %s labelled %d for %s (%d new)", labelled, dataset, value, event, added)
        return Given(dataset, event, added, labelled)

    def _read(self, ids: list[int]) -> list[SourceFrame]:
        """The frames with their JPEGs, in the order given; a frame whose image is gone is left out."""
        with self._sessions() as session:
            rows = {row.id: row for row in session.scalars(select(StoredFrame).where(StoredFrame.id.in_(ids))).all()}
            frames = []
            for frame_id in ids:
                row = rows.get(frame_id)
                if row is None:
                    continue  # removed by retention meanwhile
                try:
                    jpeg = streams.frame_image(session, self._store, row)
                except (OSError, FilterForwardError) as exc:
                    log.info("frame %d left out of the feedback: %s", frame_id, exc)
                    continue
                frames.append(
                    SourceFrame(row.id, row.edge_id, row.run, row.camera, row.frame_index, row.stream_time, jpeg)
                )
        return frames


def _camera_frames(session: Session, which: ColumnElement[bool], limit: int | None) -> list[int]:
    """One stored frame per camera frame among those `which` selects that have an image: the first row with an image
    stored of it (whichever filter matched it then), in stream order: the edge's runs (starts) oldest first, each
    run's frames by index. (Edges before 2026-12-08 stamped a back-dated frame with the time it was sent, after
    frames processed later; an edge's clock may also step back.)"""
    keys = select(*CAMERA_FRAME).where(which, StoredFrame.has_image).distinct().subquery()
    query = (
        select(func.min(StoredFrame.id), StoredFrame.run, StoredFrame.frame_index, func.min(StoredFrame.captured_at))
        .join(keys, and_(*(column == keys.c[column.key] for column in CAMERA_FRAME)))
        .where(StoredFrame.has_image)
        .group_by(*CAMERA_FRAME)
    )
    rows = session.execute(query).all()
    run_started: dict[str, datetime] = {}
    for _, run, _, captured in rows:
        run_started[run] = min(captured, run_started.get(run, captured))
    rows.sort(key=lambda row: (run_started[row[1]], row[1], row[2]))
    return [row[0] for row in rows[:limit]]
