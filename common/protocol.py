"""The edge <-> cloud wire protocol: message kinds, their headers, and how they travel as ZeroMQ multipart.

Every message is three frames: the protocol tag `PROTOCOL` (b"ff/1"), a UTF-8 JSON header (a pydantic
model below, chosen by its `type` field) and a payload (b"" when the kind carries none). The header is
validated strictly (`extra="forbid"`), so a malformed or foreign message fails `decode()` with a
`ProtocolError` that says what is wrong; the receiver counts it and goes on.

Uplink, edge DEALER -> cloud ROUTER (the ROUTER sees an identity frame first):
  hello        on connect and whenever the cloud's session changes: who the edge is and its cameras
  heartbeat    every `heartbeat` seconds; the cloud answers with its own heartbeat
  stats        periodic per-camera and uplink counters (not spooled: a lost one is replaced by the next)
  frame        a matched frame (payload: JPEG, or b"" when it went before or the filter sends clips)
  event        an event start or end (payload: the H.264 MP4 clip of a clip-policy filter at its end)
  fragment     about a second of a camera's matched frames as H.264 (payload: a packed common.fragment)
  snapshot     "send me every current filter" (the Clone pattern's ICANHAZ)
  footage      one frame of footage a FootageRequest asked for (payload: JPEG), or the request's last message
               (done, payload b""); spooled like frames, but only when no matched frame waits (edge.footage)
  footage_status  the edge took a footage request (recording) or cannot (refused, with why); not spooled: the
               cloud resends the request until it hears one
`frame`, `event`, `fragment` and `footage` carry a sequence number `seq`, unique per edge for ever (it survives
restarts via the spool); the cloud stores them idempotently on (edge, seq) and answers `ack` listing the stored seqs.

Cloud -> edge on the same ROUTER: ack, heartbeat, filter (one per current filter, snapshot reply),
snapshot_end (the version the snapshot reflects), footage_request (record footage of a camera for a dataset; sent
after each heartbeat of the edge until it answers footage_status) and error (a refused message, for the edge's log).

Filter updates, cloud PUB -> edge SUB: the same `filter` message, preceded by the topic frame `TOPIC`.
Each change has a version one above the previous; an edge applies updates above its snapshot's version in
order and asks for a new snapshot when it sees a gap.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from common.fragment import FragmentError, unpack
from models.errors import validation_summary
from models.filterspec import ID_PATTERN, MAX_VERSION, NAME_PATTERN, BaseModelId, FilterSpec
from models.taps import MAX_INPUT_SIDE, MODEL_STRIDE

PROTOCOL = b"ff/1"
TOPIC = b"filters"
IdName = Annotated[str, Field(pattern=ID_PATTERN)]
# Bounds that keep every value storable (64-bit integer columns, datetimes before year 10000) and finite: a
# header outside them is refused as malformed instead of failing the store and being resent for ever.
Seq = Annotated[int, Field(ge=0, le=2**63 - 1)]
FrameIndex = Annotated[int, Field(ge=0, le=2**63 - 1)]
StreamTime = Annotated[float, Field(ge=0, le=1e10, allow_inf_nan=False, description="stream time in seconds")]
WallTime = Annotated[float, Field(ge=0, le=253_402_300_799, allow_inf_nan=False, description="unix time")]
Score = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Version = Annotated[int, Field(ge=0, le=2**31 - 1)]
InputSide = Annotated[int, Field(ge=MODEL_STRIDE, le=MAX_INPUT_SIDE, multiple_of=MODEL_STRIDE)]
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 32 * 1024 * 1024  # a clip of a long event; frames are far smaller
JPEG_START = b"\xff\xd8\xff"  # SOI, then a marker: every JPEG begins so


class ProtocolError(ValueError):
    """A message that does not follow this protocol; the text says what is wrong with it."""


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hello(_Header):
    type: Literal["hello"] = "hello"
    edge: str = Field(pattern=ID_PATTERN)
    run: str = Field(min_length=1, max_length=64, description="changes each time the edge process starts")
    cameras: list[IdName] = Field(default_factory=list)
    filters_version: Version = Field(0, description="version of the filter set the edge runs")
    base_model: BaseModelId | None = Field(None, description="the base DNN the edge runs; filters must match it")
    input_size: tuple[InputSide, InputSide] | None = Field(
        None, description="the base DNN's input (width, height): filters must be trained at it"
    )


class Heartbeat(_Header):
    type: Literal["heartbeat"] = "heartbeat"
    sender: str = Field(min_length=1, max_length=64, description="edge id, or the cloud's session id")


class Stats(_Header):
    type: Literal["stats"] = "stats"
    edge: str = Field(pattern=ID_PATTERN)
    cameras: dict[IdName, dict[str, float | bool | str]] = Field(default_factory=dict)
    uplink: dict[str, float | bool | str] = Field(default_factory=dict)


class _Stored(_Header):
    """A message the cloud stores exactly once: by its edge and that edge's sequence number."""

    edge: str = Field(pattern=ID_PATTERN)
    run: str = Field(min_length=1, max_length=64)
    seq: Seq


class FrameHeader(_Stored):
    type: Literal["frame"] = "frame"
    camera: str = Field(pattern=ID_PATTERN)
    frame: FrameIndex = Field(description="frame index in the camera's stream")
    timestamp: StreamTime
    wall_time: WallTime = Field(description="unix time at the edge when the frame was processed")
    scores: dict[str, Score] = Field(description="filter name -> score, for the filters that matched")
    events: list[str] = Field(default_factory=list, description="ids of the open events the frame belongs to")
    payload: Literal["jpeg", "none"] = "jpeg"


class EventInfo(_Header):
    id: str = Field(min_length=1, max_length=200)
    filter: str = Field(pattern=NAME_PATTERN)
    camera: str = Field(pattern=ID_PATTERN)
    start_frame: FrameIndex
    start_time: StreamTime
    end_frame: FrameIndex | None = None
    end_time: StreamTime | None = None
    peak_score: Score
    peak_frame: FrameIndex | None = Field(None, description="the frame with the peak score (null: an older edge)")

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> EventInfo:
        if self.end_frame is not None and self.end_frame < self.start_frame:
            raise ValueError(f"the event ends at frame {self.end_frame}, before it starts ({self.start_frame})")
        return self


class EventHeader(_Stored):
    type: Literal["event"] = "event"
    phase: Literal["start", "end"]
    wall_time: WallTime = Field(description="unix time at the edge when the event started or ended")
    event: EventInfo
    payload: Literal["mp4", "none"] = "none"


class FragmentHeader(_Stored):
    """About a second of a camera's matched-frame H.264 stream; the payload is a packed common.fragment."""

    type: Literal["fragment"] = "fragment"
    camera: str = Field(pattern=ID_PATTERN)
    wall_time: WallTime = Field(description="unix time at the edge when the fragment closed")
    payload: Literal["h264"] = "h264"


class FootageRequest(_Header):
    """Cloud -> edge: record footage of `camera` for the dataset `request`: one frame every `every` seconds of stream
    time (0: every frame) for `duration` seconds, at most `max_frames` frames. An edge records a request once, however
    often it arrives."""

    type: Literal["footage_request"] = "footage_request"
    request: str = Field(pattern=NAME_PATTERN, description="the dataset the footage is for")
    camera: str = Field(pattern=ID_PATTERN)
    every: float = Field(ge=0, le=3600, allow_inf_nan=False, description="seconds between frames; 0: every frame")
    duration: float = Field(gt=0, le=86400, allow_inf_nan=False, description="seconds of stream time to cover")
    max_frames: int = Field(ge=1, le=100_000)


class FootageStatus(_Header):
    """Edge -> cloud: a footage request taken (recording) or not (refused: `message` says why)."""

    type: Literal["footage_status"] = "footage_status"
    edge: str = Field(pattern=ID_PATTERN)
    request: str = Field(pattern=NAME_PATTERN)
    state: Literal["recording", "refused"]
    message: str = Field("", max_length=500)


class FootageHeader(_Stored):
    """One frame of a footage request (payload: JPEG of the camera frame, as decoded), numbered from 0 in the order
    recorded; the request's last message has `done` set, no payload and `frames` = how many were recorded."""

    type: Literal["footage"] = "footage"
    request: str = Field(pattern=NAME_PATTERN)
    camera: str = Field(pattern=ID_PATTERN)
    number: int = Field(ge=0, le=100_000, description="the frame's place in the footage")
    frame: FrameIndex = Field(0, description="frame index in the camera's stream")
    timestamp: StreamTime = 0.0
    done: bool = False
    frames: int | None = Field(None, ge=0, le=100_000, description="done only: frames recorded")
    payload: Literal["jpeg", "none"] = "jpeg"


class SnapshotRequest(_Header):
    type: Literal["snapshot"] = "snapshot"
    edge: str = Field(pattern=ID_PATTERN)


class Ack(_Header):
    type: Literal["ack"] = "ack"
    seqs: list[Seq] = Field(description="sequence numbers now stored (or already stored before)")


class FilterUpdate(_Header):
    """One filter as of `version`: `put` carries its spec (payload: its ONNX model), `delete` only its name."""

    type: Literal["filter"] = "filter"
    version: Version = Field(ge=1)
    action: Literal["put", "delete"]
    name: str = Field(pattern=NAME_PATTERN)
    spec: FilterSpec | None = None


class SnapshotEnd(_Header):
    type: Literal["snapshot_end"] = "snapshot_end"
    version: Version = Field(description="the filter-set version the snapshot reflects")


class Error(_Header):
    type: Literal["error"] = "error"
    message: str
    # The refused message's seq when the refusal is for good (it names another edge than the connection's key):
    # the edge drops it instead of resending it for ever ahead of what it spooled after it.
    seq: Seq | None = None


Header = Annotated[
    Hello
    | Heartbeat
    | Stats
    | FrameHeader
    | EventHeader
    | FragmentHeader
    | FootageRequest
    | FootageStatus
    | FootageHeader
    | SnapshotRequest
    | Ack
    | FilterUpdate
    | SnapshotEnd
    | Error,
    Field(discriminator="type"),
]
_HEADER = TypeAdapter(Header)


def check_filter_fits(spec: FilterSpec) -> None:
    """Refuses a spec whose filter message would not reach the edges: they drop a header over MAX_HEADER_BYTES
    (1024 long camera names and 16 long warnings are each valid); counted at the largest version it can reach."""
    widest = spec.model_copy(update={"version": MAX_VERSION})
    largest = FilterUpdate(version=2**31 - 1, action="put", name=spec.name, spec=widest)
    size = len(largest.model_dump_json(exclude_none=False).encode())
    if size > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"it would reach the edges as a {size}-byte message header, over their {MAX_HEADER_BYTES}-byte limit: "
            "list fewer cameras (or '*') or shorten its warnings"
        )


def encode(header: _Header, payload: bytes = b"") -> list[bytes]:
    """The multipart frames of one message."""
    return [PROTOCOL, header.model_dump_json(exclude_none=False).encode(), payload]


def decode(frames: list[bytes]) -> tuple[Any, bytes]:
    """(header, payload) of a message's frames (without the ROUTER's identity); raises ProtocolError."""
    if len(frames) != 3:
        raise ProtocolError(f"expected 3 frames (tag, header, payload), got {len(frames)}")
    tag, raw, payload = frames
    if tag != PROTOCOL:
        raise ProtocolError(f"unknown protocol tag {bytes(tag[:16])!r}; expected {PROTOCOL!r}")
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {len(raw)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload is {len(payload)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        header = _HEADER.validate_python(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    except RecursionError:  # b"[[[[..." nested beyond the parser's depth: it killed the ingest thread
        raise ProtocolError("header is JSON nested too deeply") from None
    except ValidationError as exc:
        raise ProtocolError(f"invalid header: {validation_summary(exc, 'header')}") from None
    if getattr(header, "payload", None) == "jpeg" and payload[:3] != JPEG_START and not getattr(header, "done", False):
        # stored and served as image/jpeg, and a footage frame's went into a dataset's images
        raise ProtocolError(f"a {header.type!r} message's payload is no JPEG (it starts {bytes(payload[:8])!r})")
    if isinstance(header, FragmentHeader):
        try:
            unpack(payload)  # a fragment that cannot be read could never be stored: refused like a bad header
        except FragmentError as exc:
            raise ProtocolError(str(exc)) from None
    return header, payload
