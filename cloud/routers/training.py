"""/api/training-jobs: queue a filter's training on a dataset's event, let trainer services take the jobs (train
scope), and deploy a finished job's bundle through the filter registry (docs/studio.md, "Training jobs")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, Response, UploadFile, status
from pydantic import BaseModel, ConfigDict, Field

from cloud.auth import require
from cloud.db import TrainingJob
from cloud.routers import EachPartOnce, SessionDep
from cloud.routers.events import MAX_ROW_ID
from cloud.routers.filters import ModelUploadRoute, filter_out, read_model
from cloud.schemas import ClaimOut, FilterOut, Number, TrainingJobOut, TrainingOptions, errors
from cloud.training import TrainingJobs
from models.filterspec import EVENT_PATTERN, NAME_PATTERN

TRAINER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$"
# ":int": /claim is no job id (GET /claim is 405, not 422); ids fit the database's 64-bit integers.
JobId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="a training job's id")]
ATTEMPT_HELP = "the claim's attempt number (from the claim): a trainer holding an older claim is refused"


def get_jobs(request: Request) -> TrainingJobs:
    services = request.app.state.services
    return TrainingJobs(services.sessions, services.registry, request.app.state.config.training)


JobsDep = Annotated[TrainingJobs, Depends(get_jobs)]
Reader = Depends(require("read"))
Writer = Depends(require("write"))
Trainer = Depends(require("train"))

router = APIRouter(
    prefix="/training-jobs",
    tags=["training"],
    route_class=ModelUploadRoute,  # the result upload carries a model: refused early when over the limit
    responses=errors(400, 401, 403, 404, 409, 413, 422, 503, 507),
)


class TrainingJobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(pattern=NAME_PATTERN)
    event: str = Field(pattern=EVENT_PATTERN, description="a labels.csv column of the dataset")
    filter: str = Field(pattern=NAME_PATTERN, description="the filter to make (a new revision if it exists)")
    options: TrainingOptions = TrainingOptions()


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainer: str = Field(pattern=TRAINER_NAME, description="the trainer's name (unique per running trainer)")


class ProgressIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainer: str = Field(pattern=TRAINER_NAME)
    stage: Literal["download", "features", "training", "exporting"]
    fraction: Annotated[float, Number] = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="of the whole job")
    message: str = Field("", max_length=500)
    attempt: Annotated[int, Number] | None = Field(None, ge=1, le=2**31 - 1, description=ATTEMPT_HELP)


class FailedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainer: str = Field(pattern=TRAINER_NAME)
    message: str = Field(min_length=1, max_length=2000, description="why, in one line")
    attempt: Annotated[int, Number] | None = Field(None, ge=1, le=2**31 - 1, description=ATTEMPT_HELP)


@router.post("", status_code=status.HTTP_201_CREATED, dependencies=[Writer])
def create_job(job: TrainingJobIn, jobs: JobsDep) -> TrainingJobOut:
    """Queue a job; 422 when the event has no positive or no negative labels."""
    options = job.options.model_dump(mode="json", exclude_none=True)
    return job_out(jobs.create(job.dataset, job.event, job.filter, options), jobs)


@router.get("", dependencies=[Reader])
def list_jobs(
    jobs: JobsDep,
    status: Literal["queued", "running", "done", "failed"] | None = None,
    dataset: str | None = None,
    event: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many jobs")] = 100,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="only jobs with a lower id: the next page's is the last id")
    ] = None,
) -> list[TrainingJobOut]:
    """Newest (highest id) first, `limit` at a time; optionally only those with one status, of one dataset or of one
    event."""
    rows = jobs.jobs(status, dataset, event, limit, before)
    changed = jobs.labels_changed(job for job, _ in rows)
    return [job_out(job, jobs, size, changed) for job, size in rows]


@router.get("/{job_id:int}", dependencies=[Reader])
def get_job(job_id: JobId, jobs: JobsDep) -> TrainingJobOut:
    return job_out(jobs.get(job_id), jobs)


@router.post(
    "/claim",
    dependencies=[Trainer],
    response_model=ClaimOut,
    responses={status.HTTP_204_NO_CONTENT: {"description": "no job waits: ask again later"}},
)
def claim_job(claim: ClaimIn, jobs: JobsDep) -> Any:
    """The oldest queued job (or one whose trainer's lease ran out), now held by this trainer; 204 when none."""
    job = jobs.claim(claim.trainer)
    if job is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    out = job_out(job, jobs)
    return ClaimOut(
        **out.model_dump(),
        archive_url=f"/api/datasets/{job.dataset}/archive.tar",
        lease_seconds=jobs.lease.total_seconds(),
    )


@router.post("/{job_id:int}/progress", dependencies=[Trainer])
def report_progress(job_id: JobId, progress: ProgressIn, jobs: JobsDep) -> TrainingJobOut:
    """Record the trainer's progress and renew its lease; 409 for a trainer that no longer holds the job."""
    return job_out(
        jobs.progress(job_id, progress.trainer, progress.stage, progress.fraction, progress.message, progress.attempt),
        jobs,
    )


@router.post("/{job_id:int}/result", dependencies=[Trainer, EachPartOnce])
def report_result(
    job_id: JobId,
    trainer: Annotated[str, Form(pattern=TRAINER_NAME)],
    spec: Annotated[str, Form(min_length=1, description="the trained filter's spec.json")],
    model: Annotated[UploadFile, File(description="its model.onnx")],
    report: Annotated[str, Form(min_length=2, description="the training report as JSON (TrainingReport)")],
    jobs: JobsDep,
    attempt: Annotated[int, Form(ge=0, le=2**31 - 1, description=f"{ATTEMPT_HELP}; 0: not given")] = 0,
) -> TrainingJobOut:
    """The trained bundle (checked as the registry checks uploads) and its report: the job is done."""
    onnx = read_model(model, jobs.registry)
    return job_out(jobs.result(job_id, trainer, spec, onnx, report, attempt or None), jobs)


@router.post("/{job_id:int}/failed", dependencies=[Trainer])
def report_failed(job_id: JobId, failed: FailedIn, jobs: JobsDep) -> TrainingJobOut:
    return job_out(jobs.failed(job_id, failed.trainer, failed.message, failed.attempt), jobs)


@router.post("/{job_id:int}/cancel", dependencies=[Writer])
def cancel_job(job_id: JobId, jobs: JobsDep) -> TrainingJobOut:
    """Cancel a queued or running job: it ends as failed, "cancelled"; a running job's trainer stops at the end of
    its current stage. 409 for a job that is done or failed."""
    return job_out(jobs.cancel(job_id), jobs)


@router.post("/{job_id:int}/deploy", dependencies=[Writer])
def deploy_job(job_id: JobId, jobs: JobsDep, session: SessionDep) -> FilterOut:
    """The job's bundle through the filter registry to the edges (a new revision when the filter exists); 409 for
    a job that is not done."""
    return filter_out(session, jobs.deploy(job_id))


def job_out(
    job: TrainingJob, jobs: TrainingJobs, model_bytes: int | None = None, changed: dict[int, bool] | None = None
) -> TrainingJobOut:
    """`model_bytes`: given when the model was not loaded (lists); `changed`: jobs.labels_changed of a list's jobs."""
    changed = jobs.labels_changed([job]) if changed is None else changed
    return TrainingJobOut(
        id=job.id,
        dataset=job.dataset,
        event=job.event,
        filter=job.filter_name,
        options=job.options,
        status=job.status,
        progress=job.progress or None,
        trainer=job.trainer,
        attempts=job.attempts,
        lease_until=job.lease_until,
        error=job.error,
        result=job.result,
        spec=job.spec,
        model_bytes=len(job.onnx or b"") if model_bytes is None else model_bytes,
        deployed=job.deployed,
        labels_changed=changed.get(job.id),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
