"""The REST API's response bodies (pydantic), so clients and the OpenAPI docs see one shape per resource."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from cloud.db import as_utc
from common.protocol import InputSide  # models.taps.check_input_size as a field type
from models.filterspec import BaseModelId, FilterSpec, Validation
from models.mc_kinds import AUTO, MC_KINDS
from models.optimizer_kinds import OPTIMIZERS

UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


def _no_bool(value: object) -> object:
    if isinstance(value, bool):  # lax parsing read `"frame": true` as frame 1, `"steps": true` as one step
        raise ValueError("Input should be a number, not true or false")
    return value


Number = BeforeValidator(_no_bool)  # on each number of a request body: JSON's true/false is none


class ErrorOut(BaseModel):
    """Every refusal (4xx, 5xx): one line saying what is wrong and what to do about it."""

    detail: str


_REASONS = {
    400: "a parameter or the body is malformed; the detail says what to change",
    401: "no bearer token, or one this cloud does not know",
    403: "the token lacks the scope (read, write or train) this operation needs",
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
    refused_by: list[str] = Field(
        description="the edges it targets that refuse it (they run another base model or input size than it was "
        "trained on) and go on with the revision they ran before, if any: retrain it for them"
    )
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
        description="filters that target it but were trained on another base model or input size: its MC bank "
        "refuses them"
    )
    shared_id: bool = Field(
        False,
        description="two edge processes sent as this edge within the last minute (a copied edge_id and key): give "
        "each its own",
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


# Training jobs (docs/studio.md). The options and the report are checked here, in the cloud, so a bad job is refused
# when it is queued, not when a trainer takes it, and every stored report has the shape the web page reads.

ArchOption = Literal[(AUTO, *MC_KINDS)]  # fixed at import, like FilterSpec's architectures
OptimizerName = Literal[tuple(OPTIMIZERS)]


class TrainingOptions(BaseModel):
    """What a trainer passes on to training; every option left out takes `filterforward train`'s default."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchOption | None = Field(None, description="MC kind; auto: cross-validation chooses")
    input_size: tuple[Annotated[InputSide, Number], Annotated[InputSide, Number]] | None = Field(
        None, description="base-DNN input [width, height]"
    )
    steps: Annotated[int, Number] | None = Field(None, ge=1, le=100_000, description="optimizer steps")
    nproc: Annotated[int, Number] | None = Field(None, ge=1, le=64, description="training processes (torchrun)")
    optimizer: OptimizerName | None = Field(None, description="adam, or a communication-compressed one")


class ProgressOut(BaseModel):
    stage: str = Field(description="download, features, training, exporting (a trainer's stages), or queued/done")
    fraction: float = Field(ge=0.0, le=1.0, description="of the whole job")
    message: str = ""


class ExampleFrame(BaseModel):
    model_config = ConfigDict(extra="forbid")

    frame: int = Field(ge=0, description="the dataset's frame number (GET /api/datasets/{name}/frames/{frame}.jpg)")
    score: float = Field(ge=0.0, le=1.0, description="the MC's score on it")


class ExampleFrames(BaseModel):
    """Frames to look at before deploying: where the filter fired with the event, fired without it, or missed it."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["cross-validation", "training frames"] = Field(
        description="cross-validation: scored by models trained without them (what to expect on new footage); "
        "training frames: scored by the filter itself, which was trained on them (optimistic)"
    )
    hits: list[ExampleFrame] = Field(max_length=64)
    false_alarms: list[ExampleFrame] = Field(max_length=64)
    misses: list[ExampleFrame] = Field(max_length=64)
    counts: dict[Literal["hits", "false_alarms", "misses"], int] = Field(description="frames of each kind in all")


class CandidateOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    architecture: str
    tap: str
    validation: Validation | None = Field(description="its held-out estimate; null: not measurable")


class TrainingReport(BaseModel):
    """What a trainer found: the cross-validated estimate (event F1 with its spread over the folds), the warnings
    and the frames to look at."""

    model_config = ConfigDict(extra="forbid")

    filter: str
    event: str
    architecture: str
    tap: str
    input_size: tuple[int, int]
    frames: tuple[int, int] = Field(description="the frames trained on, START:STOP (stop exclusive)")
    positives: int = Field(ge=0)
    negatives: int = Field(ge=0)
    steps: int = Field(ge=0, description="optimizer steps taken")
    validation: Validation | None = Field(
        description="expected on new footage (event_f1, its spread f1_min..f1_max over the folds); null: the "
        "frames were too few to hold any occurrence out"
    )
    training_f1: float = Field(ge=0.0, le=1.0, description="event F1 on its own training frames (optimistic)")
    warnings: list[str] = Field(max_length=32, description="why the estimate may not hold, and what to label next")
    candidates: list[CandidateOut] = Field(max_length=16, description="the kinds cross-validation compared")
    examples: ExampleFrames
    uncertain: list[ExampleFrame] = Field(
        default_factory=list,
        max_length=64,
        description="unlabelled frames of the dataset the filter is least sure about (scores closest to its "
        "threshold first): the frames to label next",
    )
    seconds: float = Field(ge=0.0, description="the trainer's time on the job")
    labels_digest: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{32}$",
        description="models.datasets.labels_digest of the labels and region it learned from (null: not given); the "
        "cloud compares it with the dataset's to say when a job's model lacks later label changes",
    )


class TrainingJobOut(BaseModel):
    id: int
    dataset: str | None = Field(description="null once the dataset was deleted (the job stays: a filter's revision)")
    event: str
    filter: str = Field(description="the filter it makes (a new revision when it exists)")
    options: TrainingOptions
    status: Literal["queued", "running", "done", "failed"]
    progress: ProgressOut | None = Field(description="the trainer's last report; null before any")
    trainer: str | None = Field(description="who holds (or last held) it")
    attempts: int = Field(description="times a trainer took it (a trainer that died: taken again)")
    lease_until: UtcDatetime | None = Field(description="running: taken again by another trainer after this")
    error: str = Field(description="failed: why")
    result: TrainingReport | None
    spec: FilterSpec | None = Field(description="done: the trained filter's spec")
    model_bytes: int
    deployed: bool
    labels_changed: bool | None = Field(
        description="done: whether the dataset's labels or region for the event changed after the trainer read them "
        "(its model lacks those changes: queue the job again to use them); null when not known (not done, its dataset "
        "deleted, or a trainer that did not say what it learned from)"
    )
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None


class ClaimOut(TrainingJobOut):
    """A claimed job with what its trainer needs: where the dataset is and how often to report."""

    archive_url: str = Field(description="the dataset as a tar (GET, train scope), relative to the cloud's base URL")
    lease_seconds: float = Field(description="report progress well within this, or the job is taken again")


class RevisionOut(BaseModel):
    """A training job deployed as the filter: one of its revisions, to compare or to roll back to."""

    job: int = Field(description="the training job (POST /api/training-jobs/{job}/deploy rolls back to it)")
    dataset: str | None = Field(description="what it was trained on; null once that dataset was deleted")
    event: str
    validation: Validation | None = Field(description="its cross-validated estimate (event F1 with its spread)")
    positives: int = Field(description="frames labelled with the event it was trained on")
    negatives: int = Field(description="frames labelled without it")
    current: bool = Field(description="the filter runs this job's model now")
    created_at: UtcDatetime
    finished_at: UtcDatetime | None
