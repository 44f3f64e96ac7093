"""Feedback on a filter made in the studio (docs/studio.md, "Feedback and revisions"): events marked wrong or right and
intervals it missed become labels on its dataset; its revisions (the training jobs deployed as it) to compare and
roll back to."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from cloud.auth import require
from cloud.feedback import MAX_FRAMES, Feedback, Given
from cloud.routers import DatasetsDep, SessionDep
from cloud.routers.datasets import DatasetOut, dataset_out
from cloud.routers.events import MAX_ROW_ID, IsoTime, RowId, in_utc
from cloud.routers.training import JobsDep
from cloud.schemas import Number, RevisionOut, errors
from common.protocol import ID_PATTERN
from models.filterspec import NAME_PATTERN

router = APIRouter(tags=["feedback"], responses=errors(400, 401, 403, 404, 409, 422, 503, 507))
Reader = Depends(require("read"))
Writer = Depends(require("write"))
FilterName = Annotated[str, Path(pattern=NAME_PATTERN, description="the filter's name")]
FrameId = Annotated[int, Field(ge=1, le=MAX_ROW_ID)]


def get_feedback(request: Request) -> Feedback:
    services = request.app.state.services
    return Feedback(services.sessions, services.store, services.datasets)


FeedbackDep = Annotated[Feedback, Depends(get_feedback)]


class EventFeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: Annotated[Literal[0, 1], Number] = Field(description="0: wrong (a false alarm), 1: right (it happened)")
    frames: list[FrameId] | None = Field(
        None,
        min_length=1,
        max_length=MAX_FRAMES,
        description="ids of the event's frames to label (GET /api/events/{id}/frames); null: all of them",
    )


class MissedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edge: str = Field(pattern=ID_PATTERN)
    camera: str = Field(pattern=ID_PATTERN)
    start: IsoTime = Field(description="ISO 8601, the edge's clock: frames captured at or after it")
    end: IsoTime = Field(description="ISO 8601: frames captured before it")


class FeedbackOut(BaseModel):
    event: str = Field(description="the dataset's event the frames were labelled for")
    added: int = Field(description="frames new to the dataset")
    labelled: int = Field(description="frames labelled by this request (added now or in the dataset already)")
    dataset: DatasetOut = Field(description="the filter's dataset with its new counts")


@router.post("/events/{event_id}/feedback", dependencies=[Writer])
def event_feedback(
    event_id: RowId, body: EventFeedbackIn, feedback: FeedbackDep, datasets: DatasetsDep, session: SessionDep
) -> FeedbackOut:
    """The event's frames (all, or those listed) join its filter's dataset, labelled wrong (0) or right (1); 409 for
    a filter not made in the studio."""
    return feedback_out(feedback.on_event(event_id, body.value, body.frames), datasets, session)


@router.post("/filters/{name}/missed", dependencies=[Writer])
def missed_interval(
    name: FilterName, body: MissedIn, feedback: FeedbackDep, datasets: DatasetsDep, session: SessionDep
) -> FeedbackOut:
    """Every stored frame of the camera in the interval joins the filter's dataset labelled with its event (the
    filter missed it); 409 when the cloud holds none (request footage of the camera instead)."""
    start, end = in_utc("start", body.start), in_utc("end", body.end)
    return feedback_out(feedback.missed(name, body.edge, body.camera, start, end), datasets, session)


@router.get("/filters/{name}/revisions", dependencies=[Reader])
def filter_revisions(name: FilterName, jobs: JobsDep) -> list[RevisionOut]:
    """The training jobs deployed as the filter, newest first; deploying an older one again rolls back to it."""
    return [
        RevisionOut(
            job=job.id,
            dataset=job.dataset,
            event=job.event,
            validation=job.spec["validation"],
            positives=job.result["positives"],
            negatives=job.result["negatives"],
            current=current,
            created_at=job.created_at,
            finished_at=job.finished_at,
        )
        for job, current in jobs.revisions(name)
    ]


def feedback_out(given: Given, datasets: DatasetsDep, session: SessionDep) -> FeedbackOut:
    return FeedbackOut(
        event=given.event,
        added=given.added,
        labelled=given.labelled,
        dataset=dataset_out(datasets, session, given.dataset),
    )
