"""The REST API's response bodies (pydantic), so clients and the OpenAPI docs see one shape per resource."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from cloud.db import as_utc
from models.filterspec import BaseModelId, FilterSpec

UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


class ErrorOut(BaseModel):
    """Every refusal (4xx, 5xx): one line saying what is wrong and what to do about it."""

    detail: str


_REASONS = {
    400: "a parameter or the body is malformed; the detail says what to change",
    401: "no bearer token, or one this cloud does not know",
    403: "the token lacks the scope (read or write) this operation needs",
    404: "no such resource (or its payload was removed by retention)",
    409: "conflicts with the current state (a name taken, a version exhausted, a target edge that runs another "
    "base model than the filter was trained on)",
    413: "the upload is over the size limit",
    422: "a parameter or the body breaks the schema; the detail names it",
    503: "the database is unreachable or busy: retry",
    507: "the database's disk is full: nothing was changed",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these refusal codes, all with the ErrorOut body."""
    return {code: {"model": ErrorOut, "description": _REASONS[code]} for code in codes}


class FilterOut(BaseModel):
    name: str
    spec: FilterSpec
    revision: int = Field(description="the filter-set version of its last change")
    model_bytes: int
    created_at: UtcDatetime
    updated_at: UtcDatetime


class EdgeOut(BaseModel):
    id: str
    online: bool
    last_seen: UtcDatetime
    run: str
    filters_version: int
    stats: dict[str, Any] = Field(description="uplink counters from the edge's last stats message")
    cameras: list[str]
    base_model: BaseModelId | None = Field(description="the base DNN it runs (its last hello); null: not reported")
    refused_filters: list[str] = Field(
        description="filters that target it but were trained on another base model: its MC bank refuses them"
    )


class CameraOut(BaseModel):
    edge: str
    name: str
    online: bool
    last_seen: UtcDatetime
    stats: dict[str, Any] = Field(
        description="fps, base_ms, mc_ms, frames, matched, skipped (change gate), bytes_out, dropped, online"
    )


class EventOut(BaseModel):
    id: int
    uid: str
    edge: str
    camera: str
    filter: str
    start_frame: int
    end_frame: int | None
    start_time: float
    end_time: float | None
    peak_score: float
    started_at: UtcDatetime
    ended_at: UtcDatetime | None
    open: bool
    frames: int = Field(description="stored frames of this event")
    thumbnail_url: str | None = Field(description="its peak-score frame (else its first frame with an image)")
    clip_url: str


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next (older) page; null on the last")


class FrameOut(BaseModel):
    id: int
    frame_index: int
    stream_time: float
    captured_at: UtcDatetime
    scores: dict[str, float]
    image_url: str | None = Field(description="null when the frame came without a JPEG or retention removed it")


class StatsOut(BaseModel):
    filters: int
    edges: int
    edges_online: int
    cameras: int
    events: int
    frames: int
    stored_bytes: int
    counters: dict[str, int]


class Health(BaseModel):
    status: str
