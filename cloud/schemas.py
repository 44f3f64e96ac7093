"""The REST API's response bodies (pydantic), so clients and the OpenAPI docs see one shape per resource."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from cloud.db import as_utc
from models.filterspec import FilterSpec

UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


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


class CameraOut(BaseModel):
    edge: str
    name: str
    online: bool
    last_seen: UtcDatetime
    stats: dict[str, Any] = Field(description="fps, base_ms, mc_ms, frames, matched, bytes_out, dropped, online")


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
    thumbnail_url: str | None = Field(description="its first stored JPEG frame")
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
