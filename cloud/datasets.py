"""Datasets made in the cloud (docs/studio.md): footage requested from edge cameras or uploaded clips, their frames,
labels and event regions. Rows in the database (cloud.db Dataset, DatasetFrame, Label) are the truth; each
dataset's folder (cloud.dataset_folders) is rewritten from them after every change, for the CLI and the trainers.

The ingest calls `footage_message` (inside its batch transaction: stored once per (edge, seq)), `footage_complete`
(after the transaction that completed a dataset, whichever message that was), `footage_status` and
`pending_requests`; the REST API calls the rest.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import shutil
import statistics
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from cloud.dataset_folders import DatasetFolders
from cloud.db import Camera, Dataset, DatasetFrame, Edge, Label, TrainingJob, begin_writing, utcnow
from cloud.registry import RegistryError
from common.protocol import FootageHeader, FootageRequest, FootageStatus
from common.video import even
from models.datasets.labelled import CAMERA_FRAME, FRAME_INDEX
from models.roi import polygon_errors

log = logging.getLogger(__name__)

JPEG_QUALITY = 90
OUTAGE = 1.0  # seconds without a frame, beyond the step between frames, that a complete dataset's message reports
MAX_UPLOAD_FRAMES = 20_000  # frames an uploaded clip may add: a bigger one is refused, not cut short silently
# An upload's frames stop before the data disk has less than this free: a few MB of H.264 can decode to GBs of
# JPEGs (a still 4K picture repeated: 4.5 MB became 1.8 GB), which would starve the ingest of disk.
DISK_RESERVE = 2**30
# JPEG start-of-frame markers (baseline, progressive, ...: all but DHT 0xC4, JPG 0xC8 and DAC 0xCC): width, height
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class DatasetError(RegistryError):
    """A refused dataset request; `status` is the HTTP answer (the app answers RegistryErrors alike)."""


@dataclass(frozen=True)
class EventCounts:
    labelled: int
    positive: int
    negative: int
    uncertain: int
    occurrences: int  # runs of positive frames


@dataclass(frozen=True)
class SourceFrame:
    """A stored (matched) frame to copy into a dataset: its row (cloud.db.StoredFrame), its camera frame (edge,
    run, camera, index in the camera's stream), its stream time and its JPEG."""

    id: int
    edge: str
    run: str
    camera: str
    camera_frame: int
    timestamp: float
    jpeg: bytes

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of its image."""
        return image_size(self.jpeg)


class Datasets:
    def __init__(self, sessions: sessionmaker, folders: DatasetFolders) -> None:
        self._sessions = sessions
        self.folders = folders
        # Refreshes one at a time: each reads what is committed when it starts, so the last one writes the newest
        # state; side by side, an older snapshot could be written after a newer one (labels.csv behind the labels).
        self._refreshing = threading.Lock()

    # -- creating --------------------------------------------------------------------------------------------

    def request_footage(
        self, name: str, edge: str, camera: str, every: float, duration: float, max_frames: int
    ) -> Dataset:
        """A footage dataset in state `requested`; the ingest sends the request to the edge after its heartbeats."""
        with self._sessions.begin() as session:
            self._check_new(session, name)
            if session.get(Edge, edge) is None:
                raise DatasetError(404, f"no edge {edge!r} has connected to this cloud: check GET /api/edges")
            cameras = session.scalars(select(Camera.name).where(Camera.edge_id == edge)).all()
            if camera not in cameras:
                raise DatasetError(
                    404, f"edge {edge!r} has no camera {camera!r}: it has {', '.join(sorted(cameras)) or 'none'}"
                )
            fps = 1.0 / every if every > 0 else 0.0  # every frame: the camera's rate, known from the timestamps
            row = Dataset(
                name=name, source="footage", edge_id=edge, camera=camera, request=request_id(name), every=every,
                duration=duration,
                max_frames=max_frames, status="requested", fps=fps, regions={},
            )  # fmt: skip
            session.add(row)
        self.refresh(name)
        log.info("dataset %s: footage requested from %s/%s", name, edge, camera)
        return row

    def upload(self, name: str, video: Path, every: float) -> Dataset:
        """A dataset of a recorded clip: one frame every `every` seconds (0: every frame) decoded to its images.
        The frames are decoded into a staging folder that becomes the dataset's only when nothing failed, so a file
        that is no video, a full disk or a concurrent upload of the same name leaves no folder behind and touches
        no other dataset's."""
        with self._sessions() as session:
            self._check_new(session, name)
        staging = f".upload-{secrets.token_hex(8)}"
        try:
            fps, step, frames = self._decode(staging, video, every)
            first = cv2.imdecode(np.frombuffer(self.folders.image(staging, 0).read_bytes(), np.uint8), 0)
            if not self.folders.rename(staging, name):
                raise DatasetError(409, f"a dataset named {name!r} exists: pick another name or delete it first")
        except BaseException:
            self.folders.delete(staging)
            raise
        try:
            with self._sessions.begin() as session:
                self._check_new(session, name)
                row = Dataset(
                    name=name, source="upload", every=every, status="complete", frames=len(frames),
                    expected=len(frames), fps=fps / step, width=first.shape[1], height=first.shape[0], regions={},
                )  # fmt: skip
                session.add(row)
                session.flush()
                session.add_all(
                    DatasetFrame(dataset=name, number=n, camera_frame=index, timestamp=index / fps)
                    for n, index in enumerate(frames)
                )
        except BaseException:
            self.folders.delete(name)  # the folder is this upload's: the rename above found none there
            raise
        self.refresh(name)
        return row

    def _decode(self, name: str, video: Path, every: float) -> tuple[float, int, list[int]]:
        """Every frame `every` seconds apart into the dataset's images: (the clip's fps, the step in frames, the kept
        frames' indices in the clip)."""
        capture = cv2.VideoCapture(str(video))
        try:
            fps = capture.get(cv2.CAP_PROP_FPS) if capture.isOpened() else 0.0
            if not fps or not math.isfinite(fps) or fps <= 0:
                raise DatasetError(422, "the upload is not a video OpenCV can read: send an MP4 (H.264) or similar")
            step = max(1, round(every * fps)) if every > 0 else 1
            kept: list[int] = []
            index = 0
            while (image := capture.read()[1]) is not None:
                if index % step == 0:
                    if len(kept) >= MAX_UPLOAD_FRAMES:
                        raise DatasetError(
                            413, f"the clip has over {MAX_UPLOAD_FRAMES} frames at this rate: raise `every` or cut it"
                        )
                    self._check_room(len(kept))
                    self.folders.write_image(name, len(kept), _jpeg(image))
                    kept.append(index)
                index += 1
        finally:
            capture.release()
        if not kept:
            raise DatasetError(422, "the uploaded video has no frame that decodes: send another file")
        return fps, step, kept

    def _check_room(self, written: int) -> None:
        free = shutil.disk_usage(self.folders.root).free
        if free < DISK_RESERVE:
            raise DatasetError(
                507,
                f"the clip's frames would leave under {DISK_RESERVE >> 20} MiB free on the cloud's data disk "
                f"({written} written, {free >> 20} MiB left): raise `every`, cut the clip, or free space there",
            )

    @staticmethod
    def _check_new(session: Session, name: str) -> None:
        if session.get(Dataset, name) is not None:
            raise DatasetError(409, f"a dataset named {name!r} exists: pick another name or delete it first")

    # -- reading ---------------------------------------------------------------------------------------------

    def get(self, session: Session, name: str) -> Dataset:
        row = session.get(Dataset, name)
        if row is None:
            raise DatasetError(404, f"no dataset {name!r}: list them with GET /api/datasets")
        return row

    def _locked(self, session: Session, name: str) -> Dataset:
        """The dataset, held for this write transaction: changes of its labels, regions and frames, and its
        deletion, go one at a time (two region saves at once each wrote back the regions it had read, and a save
        racing a deletion failed with a 500)."""
        begin_writing(session)
        row = session.scalar(select(Dataset).where(Dataset.name == name).with_for_update())
        if row is None:
            raise DatasetError(404, f"no dataset {name!r}: list them with GET /api/datasets")
        return row

    def counts(self, session: Session, name: str) -> dict[str, EventCounts]:
        """Per event (labelled or given a region): how its frames are labelled and how many occurrences it has."""
        dataset = self.get(session, name)
        labels = self.labels(session, name)
        drawn = {event for event, region in dataset.regions.items() if region}  # null: a region cleared before
        return {event: _counts(labels.get(event, {})) for event in sorted(set(labels) | drawn)}

    def labels(self, session: Session, name: str, event: str | None = None) -> dict[str, dict[int, int]]:
        query = select(Label.event, Label.frame_index, Label.value).where(Label.dataset == name)
        if event is not None:
            query = query.where(Label.event == event)
        found: dict[str, dict[int, int]] = {}
        for label_event, frame, value in session.execute(query.order_by(Label.event, Label.frame_index)):
            found.setdefault(label_event, {})[frame] = value
        return found

    def frame_count(self, session: Session, name: str) -> int:
        return session.scalar(select(func.count()).where(DatasetFrame.dataset == name)) or 0

    def no_frame(self, name: str, number: int) -> DatasetError:
        """The 404 for a frame a dataset does not have, saying which it has (or that the dataset does not exist);
        its own session, as only a request that failed needs one."""
        with self._sessions() as session:
            self.get(session, name)
            return _no_frame(name, number, self.frame_count(session, name))

    # -- changing --------------------------------------------------------------------------------------------

    def set_labels(self, name: str, event: str, labels: Iterable[tuple[int, int | None]]) -> None:
        """Sets (or, for None, removes) the labels of frames that exist; all or nothing."""
        _check_event(event)
        with self._sessions.begin() as session:
            self._locked(session, name)
            frames = self.frame_count(session, name)
            changes = dict(labels)
            outside = sorted(frame for frame in changes if not 0 <= frame < frames)
            if outside:
                raise _no_frame(name, outside[0], frames)
            session.execute(
                delete(Label).where(Label.dataset == name, Label.event == event, Label.frame_index.in_(changes))
            )
            session.add_all(
                Label(dataset=name, event=event, frame_index=frame, value=value)
                for frame, value in changes.items()
                if value is not None
            )
        self.refresh(name)

    def append(self, name: str, event: str, value: int, frames: Sequence[SourceFrame], whose: str) -> int:
        """Copies stored frames into the dataset, numbered after its last frame (a frame it holds already, by its
        source, is not copied again), and labels every one of them `value` for `event`; how many were new. Frames of
        another size than the dataset's (`whose`: which frames, for the refusal) are refused: none is added."""
        _check_event(event)
        written: list[int] = []
        try:
            with self._sessions.begin() as session:
                dataset = self._locked(session, name)  # one append at a time: each numbers frames after the last
                if dataset.status in ("requested", "recording"):
                    raise DatasetError(
                        409, f"dataset {name!r} is still {dataset.status} footage: give feedback once it is complete"
                    )
                _check_size(dataset, frames, whose)
                if frames and dataset.width is None:  # it had no frame yet: the first one sets its size
                    dataset.width, dataset.height = frames[0].size
                frames = [_unpadded(frame, (dataset.width, dataset.height)) for frame in frames]
                held = dict(
                    session.execute(
                        select(DatasetFrame.source_frame_id, DatasetFrame.number).where(
                            DatasetFrame.dataset == name, DatasetFrame.source_frame_id.in_([f.id for f in frames])
                        )
                    ).all()
                )
                held |= _recorded(session, dataset, frames)  # its footage frames: relabelled, not copied again
                last = session.scalar(select(func.max(DatasetFrame.number)).where(DatasetFrame.dataset == name))
                first = 0 if last is None else last + 1
                for frame in frames:
                    if frame.id in held:
                        continue
                    held[frame.id] = number = first + len(written)
                    self.folders.write_image(name, number, frame.jpeg)
                    written.append(number)
                    session.add(
                        DatasetFrame(
                            dataset=name, number=number, camera_frame=frame.camera_frame, timestamp=frame.timestamp,
                            source_frame_id=frame.id,
                        )
                    )  # fmt: skip
                dataset.frames += len(written)
                if dataset.expected is not None:  # the frames it should hold: feedback frames count as expected
                    dataset.expected += len(written)
                numbers = [held[frame.id] for frame in frames]
                session.execute(
                    delete(Label).where(Label.dataset == name, Label.event == event, Label.frame_index.in_(numbers))
                )
                session.add_all(Label(dataset=name, event=event, frame_index=n, value=value) for n in set(numbers))
        except BaseException:
            for number in written:
                self.folders.remove_image(name, number)
            raise
        self.refresh(name)
        return len(written)

    def check_size(self, name: str, frames: Sequence[SourceFrame], whose: str) -> None:
        """Refuses images of another size than the dataset's (the first one's when it has none yet), as append does:
        a request that appends in several parts checks all of them first."""
        with self._sessions() as session:
            _check_size(self.get(session, name), frames, whose)

    def set_region(self, name: str, event: str, polygon: list[tuple[float, float]] | None) -> None:
        _check_event(event)
        if polygon is not None and (reason := polygon_errors(tuple(polygon))):
            raise DatasetError(422, f"invalid region for {event!r}: {reason}")
        with self._sessions.begin() as session:
            dataset = self._locked(session, name)
            regions = {key: region for key, region in dataset.regions.items() if key != event}
            dataset.regions = {**regions, event: [list(point) for point in polygon]} if polygon else regions
        self.refresh(name)

    def delete(self, name: str) -> None:
        """The dataset, its frames and labels. Its training jobs stay (a deployed one is a revision of its filter, to
        roll back to) without it; one still queued or running fails, as nothing is left to train on."""
        with self._sessions.begin() as session:
            dataset = self._locked(session, name)
            waiting = TrainingJob.status.in_(("queued", "running"))
            failed = session.execute(
                update(TrainingJob)
                .where(TrainingJob.dataset == name, waiting)
                .values(
                    status="failed", error=f"its dataset {name!r} was deleted", finished_at=utcnow(), lease_until=None
                )
                .execution_options(synchronize_session=False)
            ).rowcount
            session.delete(dataset)
        with self._refreshing:  # not while a change that committed before the deletion rewrites its files
            self.folders.delete(name)
        log.info("dataset %s deleted%s", name, f"; {failed} training job(s) on it failed" if failed else "")

    def refresh(self, name: str) -> None:
        """Rewrite the dataset's labels.csv and dataset.yaml from the database."""
        with self._refreshing, self._sessions() as session:
            dataset = self.get(session, name)
            rows = session.execute(
                select(DatasetFrame.number, DatasetFrame.camera_frame, DatasetFrame.timestamp).where(
                    DatasetFrame.dataset == name
                )
            ).all()
            labels = self.labels(session, name)
            frames = {number: camera_frame for number, camera_frame, _ in rows}
            fps = dataset.fps or _rate([timestamp for _, _, timestamp in rows])  # a recording still going on
            self.folders.write_meta(name, fps, frames, labels, dataset.regions)

    # -- the ingest ------------------------------------------------------------------------------------------

    def footage_complete(self, name: str) -> None:
        """A batch of the ingest completed the dataset's footage (committed): its files say so."""
        self.refresh(name)
        log.info("dataset %s: all the frames of its footage are stored", name)

    def pending_requests(self, edges: Iterable[str]) -> list[tuple[str, FootageRequest]]:
        """The footage requests the edges have not answered yet, as (edge, message)."""
        with self._sessions() as session:
            rows = session.scalars(
                select(Dataset).where(Dataset.status == "requested", Dataset.edge_id.in_(sorted(set(edges))))
            ).all()
        return [
            (row.edge_id, FootageRequest(
                request=row.request, camera=row.camera, every=row.every, duration=row.duration,
                max_frames=row.max_frames,
            ))
            for row in rows
        ]  # fmt: skip

    def footage_status(self, edge: str, status: FootageStatus) -> None:
        with self._sessions.begin() as session:
            row = _requested(session, status.request, edge)
            if row is None or row.status != "requested":
                return  # deleted meanwhile, another edge's, or heard before
            row.status, row.message = status.state, status.message
        log.info("dataset %s: edge %s is %s %s", row.name, edge, status.state, status.message)

    def write_footage_image(self, edge: str, header: FootageHeader, payload: bytes) -> bool:
        """Writes a footage frame's image before its row commits (rewriting the same bytes on a resend); False when
        no dataset of that edge wants it (deleted meanwhile): the message is acknowledged and dropped."""
        with self._sessions() as session:
            row = _requested(session, header.request, edge)
        if row is None:
            return False
        if not header.done:
            if reason := _unfitting(row, header, payload):
                log.warning("footage frame %d for dataset %s dropped: %s", header.number, row.name, reason)
                return False
            self.folders.write_image(row.name, header.number, payload)
        return True

    def footage_message(self, session: Session, edge: str, header: FootageHeader, payload: bytes) -> str | None:
        """The rows of a footage message (its image is written); the dataset's name when it became complete."""
        row = _requested(session, header.request, edge, lock=True)
        if row is None:
            return None
        if row.status == "requested":
            row.status = "recording"  # its status message was lost, but the footage says it
        if header.done:
            row.expected = header.frames
        elif session.get(DatasetFrame, (row.name, header.number)) is None:
            width, height = image_size(payload)
            if row.width is not None and (width, height) != (row.width, row.height):  # (checked here, locked)
                log.warning(
                    "footage frame %d for dataset %s dropped: it is %dx%d, not the %dx%d of the footage's frames",
                    header.number, row.name, width, height, row.width, row.height,
                )  # fmt: skip
                self.folders.remove_image(row.name, header.number)
                return None
            session.add(
                DatasetFrame(
                    dataset=row.name, number=header.number, camera_frame=header.frame,
                    timestamp=header.timestamp, run=header.run,
                )
            )  # fmt: skip
            row.frames += 1
            if row.width is None:
                row.width, row.height = width, height
        if row.status in ("requested", "recording") and row.expected is not None and row.frames >= row.expected:
            row.status = "complete"
            timestamps = list(session.scalars(select(DatasetFrame.timestamp).where(DatasetFrame.dataset == row.name)))
            if not row.fps:  # every frame was asked for: the camera's rate
                row.fps = _rate(timestamps)
            row.message = _outage_note(row, timestamps)
            return row.name
        return None


def _unfitting(row: Dataset, header: FootageHeader, payload: bytes) -> str | None:
    """Why a footage frame cannot be one of the dataset's (an edge records none such: a message that was not its)."""
    if row.max_frames and header.number >= row.max_frames:
        return f"it is number {header.number}, past the {row.max_frames} frames asked for"
    if image_size(payload) == (0, 0):
        return "its JPEG does not decode"
    return None


def _recorded(session: Session, dataset: Dataset, frames: Sequence[SourceFrame]) -> dict[int, int]:
    """Stored frame id -> number of the dataset's footage frame that is the same camera frame (its edge, camera,
    run and index), for the frames of the camera the dataset's footage came from."""
    ours = [frame for frame in frames if (frame.edge, frame.camera) == (dataset.edge_id, dataset.camera)]
    if not ours:
        return {}
    numbers = {
        (run, camera_frame): number
        for number, run, camera_frame in session.execute(
            select(DatasetFrame.number, DatasetFrame.run, DatasetFrame.camera_frame).where(
                DatasetFrame.dataset == dataset.name,
                DatasetFrame.run.in_({frame.run for frame in ours}),
                DatasetFrame.camera_frame.in_([frame.camera_frame for frame in ours]),
            )
        )
    }
    keys = {frame.id: (frame.run, frame.camera_frame) for frame in ours}
    return {frame_id: numbers[key] for frame_id, key in keys.items() if key in numbers}


def request_id(name: str) -> str:
    """A footage request's id at the edge: the dataset's name and a random part, so that a dataset deleted and made
    again under its name is a new request to the edge (which records each id once)."""
    return f"{name[:55]}.{secrets.token_hex(4)}"


def _requested(session: Session, request: str, edge: str, lock: bool = False) -> Dataset | None:
    """The dataset a footage request of `edge` is for (None: deleted meanwhile, or another edge's)."""
    query = select(Dataset).where(Dataset.request == request, Dataset.edge_id == edge)
    return session.scalar(query.with_for_update() if lock else query)


def _no_frame(name: str, number: int, frames: int) -> DatasetError:
    have = f"it has frames 0 to {frames - 1}" if frames else "it has no frames yet"
    return DatasetError(404, f"frame {number} is not in dataset {name!r}: {have}")


def _check_event(event: str) -> None:
    if event in (FRAME_INDEX, CAMERA_FRAME):
        raise DatasetError(422, f"{event!r} is a column of labels.csv itself, not an event: name the event otherwise")


def _check_size(dataset: Dataset, frames: Sequence[SourceFrame], whose: str) -> None:
    """An image folder of mixed sizes cannot be trained on: a frame of a camera of another size, or one an edge
    uploaded as its region of interest only (`upload: {crop: roi}`) or scaled down, is refused. A dataset without
    frames yet takes the first one's size."""
    if not frames:
        return
    expected = frames[0].size if dataset.width is None or dataset.height is None else (dataset.width, dataset.height)
    other = next((frame for frame in frames if frame.size not in (expected, _padded(expected))), None)
    if other is None:
        return
    (width, height), size = other.size, f"{expected[0]}x{expected[1]}"
    if dataset.camera is not None and (other.edge, other.camera) != (dataset.edge_id, dataset.camera):
        raise DatasetError(
            422,
            f"{whose} are from camera {other.camera!r} ({width}x{height}); dataset {dataset.name!r} holds the {size} "
            f"frames of camera {dataset.camera!r}: give feedback on that camera's events only, or record footage of "
            f"{other.camera!r} into a dataset of its own",
        )
    raise DatasetError(
        422,
        f"{whose} are {width}x{height}, not the dataset's {size} frames (a camera of another size, or an edge that "
        "uploads them cropped or scaled: its upload crop or scale): label footage of that camera instead",
    )


def _padded(size: tuple[int, int]) -> tuple[int, int]:
    """A frame size as the edge's H.264 stream carries it: odd sides grown by one pixel (common.video.even)."""
    return even(size[0]), even(size[1])


def _unpadded(frame: SourceFrame, size: tuple[int, int]) -> SourceFrame:
    """The frame at the camera's own size: an image decoded from the stream of a camera with odd sides has the row
    and column the edge's encoder repeated at the bottom and right (edge.encoder.video_frame), cut off here."""
    if frame.size == size:
        return frame
    image = cv2.imdecode(np.frombuffer(frame.jpeg, np.uint8), cv2.IMREAD_COLOR)
    return replace(frame, jpeg=_jpeg(image[: size[1], : size[0]]))


def image_size(jpeg: bytes) -> tuple[int, int]:
    """(width, height) of a JPEG, read from its frame header without decoding it (decoded when the header is not
    found); (0, 0) for an image that does not decode."""
    at = 2 if jpeg[:2] == b"\xff\xd8" else len(jpeg)
    while at + 9 <= len(jpeg) and jpeg[at] == 0xFF:
        marker = jpeg[at + 1]
        if marker in SOF_MARKERS:
            height, width = struct.unpack_from(">HH", jpeg, at + 5)
            return width, height
        if marker == 0xFF:  # a fill byte
            at += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
        else:
            at += 2 + struct.unpack_from(">H", jpeg, at + 2)[0]
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_GRAYSCALE) if jpeg else None
    return (0, 0) if image is None else (image.shape[1], image.shape[0])


def _jpeg(image: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise DatasetError(422, "a frame of the upload could not be encoded as JPEG: send another file")
    return encoded.tobytes()


def _outage_note(row: Dataset, timestamps: list[float]) -> str:
    """What a complete footage dataset lacks: the seconds of its span the camera sent no frame for (it was offline,
    and the edge counts that time as recorded), or ""."""
    if row.frames >= row.max_frames or len(timestamps) < 1:
        return ""
    ordered = sorted(timestamps)
    gaps = [later - earlier for earlier, later in itertools.pairwise(ordered)]
    step = row.every or (statistics.median(gaps) if gaps else 0.0)
    tail = row.duration - (ordered[-1] - ordered[0])  # from the last frame to the end of the span asked for
    missing = sum(max(0.0, gap - step) for gap in [*gaps, tail])
    if missing < max(OUTAGE, 2 * step):
        return ""
    return (
        f"the camera sent no frames for {missing:.1f} s of the {row.duration:g} s asked for (it was offline?): "
        f"{row.frames} frame(s) recorded; request more footage for the rest"
    )


def _rate(timestamps: list[float]) -> float:
    """Frames per second of stream time, from the frames' timestamps (0 when fewer than two)."""
    if len(timestamps) < 2:
        return 0.0
    span = max(timestamps) - min(timestamps)
    return round((len(timestamps) - 1) / span, 6) if span > 0 else 0.0  # 12.5, not 12.499999999999998


def _counts(labels: dict[int, int]) -> EventCounts:
    values = list(labels.values())
    occurrences, previous = 0, None
    for frame in sorted(labels):
        positive = labels[frame] == 1
        if positive and not (previous is not None and previous == frame - 1 and labels[previous] == 1):
            occurrences += 1
        previous = frame
    return EventCounts(
        labelled=len(values),
        positive=values.count(1),
        negative=values.count(0),
        uncertain=values.count(-1),
        occurrences=occurrences,
    )
