"""/api/datasets: footage requests to edge cameras, uploaded clips, their frames, labels and event regions
(docs/studio.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path as FsPath
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, Response, UploadFile, status
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select

from cloud.auth import require
from cloud.datasets import DatasetError, Datasets, EventCounts
from cloud.db import Dataset
from cloud.media_responses import get_and_head, media
from cloud.routers import FORM_OVERHEAD, DatasetsDep, EachPartOnce, SessionDep, body_limit_route
from cloud.schemas import Number, UtcDatetime, errors
from common.protocol import ID_PATTERN
from models.filterspec import EVENT_PATTERN, NAME_PATTERN
from models.roi import MAX_POLYGON_POINTS

MAX_CLIP_BYTES = 2 * 2**30  # an uploaded clip: far above any camera clip worth labelling, below a full disk


def _clip_too_big(size: int, _request: Request) -> str:
    return f"the request body is at least {size} bytes, over the {MAX_CLIP_BYTES >> 20} MiB clip limit: cut the clip"


router = APIRouter(
    prefix="/datasets",
    tags=["datasets"],
    route_class=body_limit_route(lambda _request: MAX_CLIP_BYTES + FORM_OVERHEAD, _clip_too_big),
    responses=errors(400, 401, 403, 404, 409, 413, 422, 503, 507),
)
Reader = Depends(require("read"))
Writer = Depends(require("write"))
COPY_CHUNK = 2**20

DatasetName = Annotated[str, Path(pattern=NAME_PATTERN, description="the dataset's name")]
EventName = Annotated[str, Field(pattern=EVENT_PATTERN, description="an event (a labels.csv column)")]
Point = tuple[
    Annotated[float, Number, Field(ge=0, le=1, allow_inf_nan=False)],
    Annotated[float, Number, Field(ge=0, le=1, allow_inf_nan=False)],
]


class FootageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="the dataset's name (lowercase letters, digits, _ . -)")
    edge: str = Field(pattern=ID_PATTERN)
    camera: str = Field(pattern=ID_PATTERN)
    every: Annotated[float, Number] = Field(
        1.0, ge=0, le=3600, allow_inf_nan=False, description="seconds between frames; 0: every frame"
    )
    duration: Annotated[float, Number] = Field(
        300.0, gt=0, le=86400, allow_inf_nan=False, description="seconds of stream time to cover"
    )
    max_frames: Annotated[int, Number] = Field(300, ge=1, le=100_000)


class LabelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    frame: Annotated[int, Number] = Field(ge=0, le=2**31 - 1, description="the frame's number in the dataset")
    value: Annotated[Literal[1, 0, -1], Number] | None = Field(description="1 event, 0 not, -1 uncertain, null: none")


class LabelsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event: EventName
    labels: list[LabelIn] = Field(max_length=100_000)

    @field_validator("labels")
    @classmethod
    def each_frame_once(cls, labels: list[LabelIn]) -> list[LabelIn]:
        """Two values for one frame in one request would leave the last silently: refused instead."""
        seen: set[int] = set()
        for label in labels:
            if label.frame in seen:
                raise ValueError(f"frame {label.frame} is given more than once: give each frame one value")
            seen.add(label.frame)
        return labels


class RegionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    polygon: list[Point] | None = Field(
        min_length=3, max_length=MAX_POLYGON_POINTS, description="normalised points, or null: the whole frame"
    )


class EventCountsOut(BaseModel):
    labelled: int
    positive: int
    negative: int
    uncertain: int
    occurrences: int = Field(description="runs of consecutive positive frames")


class DatasetOut(BaseModel):
    name: str
    source: Literal["footage", "upload"]
    edge: str | None
    camera: str | None
    every: float
    duration: float
    status: Literal["requested", "recording", "complete", "refused"]
    message: str = Field(
        description="why the edge refused the request, or what complete footage lacks (seconds the camera was offline)"
    )
    frames: int = Field(description="frames stored")
    expected: int | None = Field(description="frames the edge recorded, known once it is done")
    fps: float
    width: int | None
    height: int | None
    regions: dict[str, list[Point] | None]
    events: dict[str, EventCountsOut]
    created_at: UtcDatetime


@router.post("/footage", status_code=status.HTTP_201_CREATED, dependencies=[Writer])
def request_footage(footage: FootageIn, datasets: DatasetsDep, session: SessionDep) -> DatasetOut:
    """Ask an edge camera for footage; the edge records it and sends it after its matched frames."""
    order = footage.model_dump()
    datasets.request_footage(order.pop("name"), **order)
    return dataset_out(datasets, session, footage.name)


@router.post("/upload", status_code=status.HTTP_201_CREATED, dependencies=[Writer, EachPartOnce])
def upload_clip(
    name: Annotated[str, Form(pattern=NAME_PATTERN, description="the dataset's name")],
    video: Annotated[UploadFile, File(description="a recorded clip (MP4, MKV, AVI, ...)")],
    datasets: DatasetsDep,
    session: SessionDep,
    every: Annotated[
        float, Form(ge=0, le=3600, allow_inf_nan=False, description="seconds between frames kept; 0: every frame")
    ] = 0.0,
) -> DatasetOut:
    """A recorded clip as a dataset: its frames (one every `every` s) become the dataset's images."""
    with tempfile.NamedTemporaryFile(suffix=".video") as copy:
        _copy_capped(video, copy)
        datasets.upload(name, FsPath(copy.name), every)
    return dataset_out(datasets, session, name)


@router.get("", dependencies=[Reader])
def list_datasets(datasets: DatasetsDep, session: SessionDep) -> list[DatasetOut]:
    names = session.scalars(select(Dataset.name).order_by(Dataset.name)).all()
    return [dataset_out(datasets, session, name) for name in names]


@router.get("/{name}", dependencies=[Reader])
def get_dataset(name: DatasetName, datasets: DatasetsDep, session: SessionDep) -> DatasetOut:
    return dataset_out(datasets, session, name)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[Writer])
def delete_dataset(name: DatasetName, datasets: DatasetsDep) -> None:
    datasets.delete(name)


@get_and_head(
    router,
    "/{name}/frames/{number}.jpg",
    dependencies=[Reader],
    response_class=FileResponse,
    responses=media("image/jpeg", "the frame"),
)
def get_frame(
    name: DatasetName, number: Annotated[int, Path(ge=0, le=2**31 - 1)], datasets: DatasetsDep
) -> FileResponse:
    path = datasets.folders.image(name, number)
    if not path.is_file():
        raise datasets.no_frame(name, number)
    return FileResponse(path, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})


@router.get("/{name}/labels", dependencies=[Reader])
def get_labels(
    name: DatasetName,
    datasets: DatasetsDep,
    session: SessionDep,
    event: Annotated[str | None, Query(pattern=EVENT_PATTERN)] = None,
) -> dict[str, dict[int, int]]:
    datasets.get(session, name)
    return datasets.labels(session, name, event)


@router.put("/{name}/labels", dependencies=[Writer])
def put_labels(name: DatasetName, body: LabelsIn, datasets: DatasetsDep, session: SessionDep) -> DatasetOut:
    """Set or remove labels of one event, all or none."""
    datasets.set_labels(name, body.event, [(label.frame, label.value) for label in body.labels])
    return dataset_out(datasets, session, name)


@router.put("/{name}/regions/{event}", dependencies=[Writer])
def put_region(
    name: DatasetName,
    event: Annotated[str, Path(pattern=EVENT_PATTERN)],
    body: RegionIn,
    datasets: DatasetsDep,
    session: SessionDep,
) -> DatasetOut:
    """The event's region: only what happens inside it counts."""
    datasets.set_region(name, event, body.polygon)
    return dataset_out(datasets, session, name)


@router.get(
    "/{name}/labels.csv",
    dependencies=[Reader],
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}, "description": "labels.csv as docs/datasets.md reads it"}},
)
def get_labels_csv(name: DatasetName, datasets: DatasetsDep, session: SessionDep) -> Response:
    datasets.get(session, name)
    path = datasets.folders.folder(name) / "labels.csv"
    return Response(
        path.read_bytes(),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}-labels.csv"'},
    )


@router.get(
    "/{name}/archive.tar",
    dependencies=[Depends(require("read", "train"))],
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "the dataset folder"}},
)
def get_archive(name: DatasetName, datasets: DatasetsDep, session: SessionDep) -> StreamingResponse:
    """The dataset folder (images/, labels.csv, dataset.yaml) as a tar: what a trainer downloads."""
    datasets.get(session, name)
    return StreamingResponse(
        datasets.folders.archive(name),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{name}.tar"'},
    )


def dataset_out(datasets: Datasets, session: SessionDep, name: str) -> DatasetOut:
    session.expire_all()  # the service wrote in its own transactions: read what they committed
    row = datasets.get(session, name)
    return DatasetOut(
        name=row.name,
        source=row.source,
        edge=row.edge_id,
        camera=row.camera,
        every=row.every,
        duration=row.duration,
        status=row.status,
        message=row.message,
        frames=row.frames,
        expected=row.expected,
        fps=row.fps,
        width=row.width,
        height=row.height,
        regions=row.regions,
        events={event: _counts_out(counts) for event, counts in datasets.counts(session, name).items()},
        created_at=row.created_at,
    )


def _counts_out(counts: EventCounts) -> EventCountsOut:
    return EventCountsOut(**counts.__dict__)


def _copy_capped(upload: UploadFile, target: tempfile._TemporaryFileWrapper) -> None:
    """The upload into `target`, refused (413) as soon as it passes MAX_CLIP_BYTES."""
    copied = 0
    while chunk := upload.file.read(COPY_CHUNK):
        copied += len(chunk)
        if copied > MAX_CLIP_BYTES:
            raise DatasetError(413, f"the clip is over {MAX_CLIP_BYTES >> 20} MiB: cut it or lower its resolution")
        target.write(chunk)
    target.flush()
