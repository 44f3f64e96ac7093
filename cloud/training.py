"""The training-job queue (docs/studio.md): jobs to train a filter on a dataset's event, taken by trainer services
under a lease, their bundles deployed through the filter registry.

A trainer holds a job while it renews the lease (every progress report renews it). A running job whose lease ran
out is claimed again by the next trainer (its trainer died or lost the cloud); after `attempts` claims it fails
instead. Every change of a job's state is one UPDATE guarded by the state it was decided on (compare and set): two
trainers claiming at once, or a trainer the queue has given its job away from, can never both hold it, on SQLite and
PostgreSQL alike. Every refusal (TrainingError) happens before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy import Select, and_, func, or_, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, defer, sessionmaker

from cloud.config import TrainingConfig
from cloud.db import Dataset, DatasetFrame, Edge, Filter, Label, TrainingJob, utcnow
from cloud.registry import TAPS, Registry, RegistryError, parse_spec, too_big
from cloud.schemas import TrainingReport
from models.bundle import check_mc_model
from models.datasets.labelled import labels_digest
from models.errors import FilterForwardError, is_disk_full, validation_summary
from models.filterspec import NAME_PATTERN, FilterSpec
from models.roi import FULL_FRAME, ROI

log = logging.getLogger(__name__)

RETRIES = 5  # claims lost to another trainer before giving up (each takes the next job)
CANCELLED = "cancelled by an operator (POST /api/training-jobs/{id}/cancel)"  # a cancelled job's error
T = TypeVar("T")


class TrainingError(RegistryError):
    """A refused request; the API answers with `status` and the message (the registry's error handler)."""


# Deploys one at a time (the cloud is one process): a deploy reads whether its filter exists, changes it through the
# registry and marks the job deployed in steps, so two at once answered "already exists" or left the last-deployed mark
# on another job than the one the filter runs.
_DEPLOYING = threading.Lock()


def renew_leases(sessions: sessionmaker, lease: timedelta) -> int:
    """At the cloud's start, every running job's lease runs one lease from now: its trainer could not renew it while
    the cloud was down, and is not to lose a healthy job to another trainer for that. How many were renewed."""
    now = utcnow()
    lapsing = and_(TrainingJob.status == "running", TrainingJob.lease_until < now + lease)
    with sessions.begin() as session:
        renewed = session.execute(update(TrainingJob).where(lapsing).values(lease_until=now + lease)).rowcount
    if renewed:
        log.info("%d running training job(s): their trainers have %s from now to report again", renewed, lease)
    return renewed


class TrainingJobs:
    """The queue over the training_jobs table; rows handed out are detached snapshots."""

    def __init__(self, sessions: sessionmaker, registry: Registry, config: TrainingConfig) -> None:
        self._sessions = sessions
        self.registry = registry
        self.lease = timedelta(seconds=config.lease)
        self.attempts = config.attempts

    # -- operators -------------------------------------------------------------------------------------------

    def create(self, dataset: str, event: str, filter_name: str, options: dict[str, Any]) -> TrainingJob:
        """Queue a job; refused when the filter name is invalid, the dataset unknown or the event lacks a class."""
        if not re.match(NAME_PATTERN, filter_name):
            raise TrainingError(
                422,
                f"filter name {filter_name!r} is not valid: use 1-64 lowercase letters, digits, '_', '.' or '-', "
                "starting with a letter or digit",
            )

        def insert(session: Session) -> TrainingJob:
            source = session.get(Dataset, dataset)
            if source is None:
                raise TrainingError(404, f"no dataset named '{dataset}': list the datasets with GET /api/datasets")
            positive, negative = _label_counts(session, dataset, event)
            if not positive or not negative:
                raise TrainingError(
                    422,
                    f"event '{event}' of dataset '{dataset}' has {positive} positive and {negative} negative labels: "
                    f"label frames with and without it (PUT /api/datasets/{dataset}/labels), then queue the job",
                )
            job = TrainingJob(
                dataset=dataset,
                event=event,
                filter_name=filter_name,
                options=_for_the_edge(session, source, options),
                camera=source.camera,  # kept for its deployment, should the dataset be deleted meanwhile
                status="queued",
                progress={},
            )
            session.add(job)
            return job

        job = self._write(f"training job for filter '{filter_name}'", insert)
        log.info("training job %d queued: filter %s from %s/%s %s", job.id, filter_name, dataset, event, options)
        return job

    def jobs(
        self,
        status: str | None = None,
        dataset: str | None = None,
        event: str | None = None,
        limit: int | None = None,
        before: int | None = None,
    ) -> list[tuple[TrainingJob, int]]:
        """Jobs, newest (highest id) first, at most `limit` of them and only those below id `before` if given, each
        with its model's size (the models themselves are not loaded). Ids, not creation times, order them: jobs
        created at once get times out of id order."""
        self._fail_abandoned()
        query = select(TrainingJob, func.coalesce(func.length(TrainingJob.onnx), 0)).options(defer(TrainingJob.onnx))
        for column, value in ((TrainingJob.status, status), (TrainingJob.dataset, dataset), (TrainingJob.event, event)):
            if value is not None:
                query = query.where(column == value)
        if before is not None:
            query = query.where(TrainingJob.id < before)
        with self._sessions() as session:
            rows = session.execute(query.order_by(TrainingJob.id.desc()).limit(limit)).all()
            return [(job, int(size)) for job, size in rows]

    def labels_changed(self, jobs: Iterable[TrainingJob]) -> dict[int, bool]:
        """Per done job whose trainer said what it learned from (the report's labels_digest): whether its dataset's
        labels or region for the event changed since, so that its model lacks them. Jobs whose dataset was deleted,
        and those of older trainers, are left out."""
        trained = {job.id: job for job in jobs if job.dataset is not None and (job.result or {}).get("labels_digest")}
        if not trained:
            return {}
        pairs = {(job.dataset, job.event) for job in trained.values()}
        with self._sessions() as session:
            current = {pair: _labels_digest(session, *pair) for pair in pairs}
        return {i: job.result["labels_digest"] != current[(job.dataset, job.event)] for i, job in trained.items()}

    def get(self, job_id: int) -> TrainingJob:
        self._fail_abandoned()
        with self._sessions() as session:
            return _existing(session, job_id)

    def deploy(self, job_id: int) -> Filter:
        """The job's bundle through the registry: created, or a new revision of the filter (keeping the cameras and
        encoding the operator set on it). Deploying a job again puts its model back (a rollback)."""
        job = self.get(job_id)
        if job.status == "failed":
            raise TrainingError(
                409,
                f"training job {job_id} failed ({job.error}), so it has no filter to deploy: deploy a job that is "
                "done, or queue a new one (POST /api/training-jobs)",
            )
        if job.status != "done" or job.spec is None or job.onnx is None:
            raise TrainingError(
                409,
                f"training job {job_id} is {job.status}, not done: deploy it once GET /api/training-jobs/{job_id} "
                "says done",
            )
        spec = FilterSpec.model_validate(job.spec)
        with _DEPLOYING:
            with self._sessions() as session:
                current = session.get(Filter, spec.name)
            if current is None:
                row = self.registry.create(_on_its_camera(spec, job.camera), job.onnx)
            else:
                kept = {key: current.spec[key] for key in ("cameras", "encoding") if key in current.spec}
                row = self.registry.update(spec.name, FilterSpec.model_validate({**job.spec, **kept}), job.onnx)
            deployed = {"deployed": True, "deployed_at": utcnow()}  # the job the filter runs (a rollback: again)
            self._write(f"training job {job_id}", partial(_swap, job_id=job_id, guard=(), values=deployed))
        log.info("training job %d deployed as filter %s (revision %d)", job_id, row.name, row.revision)
        return row

    def revisions(self, filter_name: str) -> list[tuple[TrainingJob, bool]]:
        """The filter's deployed jobs, newest first (models not loaded), each with whether the filter runs it now:
        the job deployed last, unless the filter's model was replaced since (PUT /api/filters); 404 for a filter
        that neither exists nor was ever deployed from a job."""
        model = select(Filter.onnx).where(Filter.name == filter_name).scalar_subquery()
        query = (
            select(TrainingJob, func.coalesce(TrainingJob.onnx == model, False))
            .options(defer(TrainingJob.onnx))
            .where(TrainingJob.filter_name == filter_name, TrainingJob.deployed)
            .order_by(TrainingJob.id.desc())
        )
        with self._sessions() as session:
            rows = session.execute(query).all()
            if not rows and session.get(Filter, filter_name) is None:
                raise TrainingError(404, f"no filter named '{filter_name}': list the filters with GET /api/filters")
            running = session.scalar(_last_deployed(filter_name, TrainingJob.id))
        return [(job, job.id == running and bool(same_model)) for job, same_model in rows]

    # -- trainers --------------------------------------------------------------------------------------------

    def claim(self, trainer: str) -> TrainingJob | None:
        """The oldest queued job, or a running one whose lease ran out, now held by `trainer`; None when none waits."""
        self._fail_abandoned()
        for _ in range(RETRIES):
            now = utcnow()
            with self._sessions() as session:
                job = session.scalars(
                    select(TrainingJob)
                    .where(_claimable(now))
                    .order_by(TrainingJob.created_at, TrainingJob.id)
                    .limit(1)
                    .options(defer(TrainingJob.onnx))
                ).first()
            if job is None:
                return None
            previous = job.trainer if job.status == "running" else None
            values = {
                "status": "running",
                "trainer": trainer,
                "attempts": job.attempts + 1,
                "lease_until": now + self.lease,
                "started_at": now,
                "error": "",
                "progress": {"stage": "claimed", "fraction": 0.0, "message": f"taken by trainer {trainer}"},
            }
            guard = (TrainingJob.status == job.status, TrainingJob.attempts == job.attempts)
            if self._write(f"training job {job.id}", partial(_swap, job_id=job.id, guard=guard, values=values)):
                if previous:
                    log.warning("training job %d: trainer %s stopped reporting; taken by %s", job.id, previous, trainer)
                log.info("training job %d claimed by %s (attempt %d)", job.id, trainer, job.attempts + 1)
                return self.get(job.id)
        return None  # other trainers took every job this one tried: it asks again after its poll interval

    def progress(
        self, job_id: int, trainer: str, stage: str, fraction: float, message: str, attempt: int | None = None
    ) -> TrainingJob:
        """Record the trainer's report and renew its lease."""
        job = self._held(job_id, trainer, attempt)
        values = {
            "progress": {"stage": stage, "fraction": fraction, "message": message},
            "lease_until": utcnow() + self.lease,
        }
        self._swap_held(job, values)
        return self.get(job_id)

    def result(
        self, job_id: int, trainer: str, spec_text: str, onnx: bytes, report_text: str, attempt: int | None = None
    ) -> TrainingJob:
        """Store the bundle and its report (each checked as the registry would): the job is done."""
        job = self._held(job_id, trainer, attempt)
        spec = parse_spec(spec_text)
        if spec.name != job.filter_name or spec.event != job.event:
            raise TrainingError(
                422,
                f"the spec is for filter '{spec.name}' and event '{spec.event}', but job {job_id} makes filter "
                f"'{job.filter_name}' for event '{job.event}': upload the bundle trained for this job",
            )
        self._check_model(spec, onnx)
        report = _parse_report(report_text)
        self._check_report(job, report)
        report["uncertain"] = self._unlabelled(job, report["uncertain"])
        now = utcnow()
        values = {
            "status": "done",
            "spec": spec.model_dump(mode="json"),
            "onnx": onnx,
            "result": report,
            "finished_at": now,
            "lease_until": None,
            "progress": {"stage": "done", "fraction": 1.0, "message": "trained: deploy it to the edges"},
        }
        self._swap_held(job, values)
        log.info("training job %d done by %s: filter %s, %d bytes of ONNX", job_id, trainer, spec.name, len(onnx))
        return self.get(job_id)

    def failed(self, job_id: int, trainer: str, message: str, attempt: int | None = None) -> TrainingJob:
        job = self._held(job_id, trainer, attempt)
        reason = (message.strip().splitlines() or ["(no reason given)"])[0]
        values = {"status": "failed", "error": reason, "finished_at": utcnow(), "lease_until": None}
        self._swap_held(job, values)
        log.warning("training job %d failed on trainer %s: %s", job_id, trainer, reason)
        return self.get(job_id)

    def cancel(self, job_id: int) -> TrainingJob:
        """End a queued or running job as failed, "cancelled": a queued one is never claimed; a running one's trainer
        is refused at its next report (409) and stops at its next training step. 409 for a finished job."""
        job = self.get(job_id)
        if job.status not in ("queued", "running"):
            raise TrainingError(
                409, f"training job {job_id} is {job.status}: only a queued or running job can be cancelled"
            )
        values = {"status": "failed", "error": CANCELLED, "finished_at": utcnow(), "lease_until": None}
        guard = (TrainingJob.status == job.status, TrainingJob.attempts == job.attempts)
        if not self._write(f"training job {job_id}", partial(_swap, job_id=job_id, guard=guard, values=values)):
            raise TrainingError(
                409, f"training job {job_id} changed state while it was cancelled: read it and try again"
            )
        log.info("training job %d cancelled (it was %s)", job_id, job.status)
        return self.get(job_id)

    # -- internals -------------------------------------------------------------------------------------------

    def _held(self, job_id: int, trainer: str, attempt: int | None) -> TrainingJob:
        """The job, if `trainer` holds it (and, given `attempt`, by that claim); 409 for a trainer that does not."""
        job = self.get(job_id)
        if job.status != "running" or job.trainer != trainer or attempt not in (None, job.attempts):
            holder = f" by trainer '{job.trainer}' (attempt {job.attempts})" if job.status == "running" else ""
            raise TrainingError(
                409,
                f"training job {job_id} is not held by trainer '{trainer}'"
                f"{f' (attempt {attempt})' if attempt else ''}: it is {job.status}{holder}; stop working on it "
                "and claim another",
            )
        return job

    def _swap_held(self, job: TrainingJob, values: dict[str, Any]) -> None:
        """Apply `values` if the job is still held as `_held` saw it; 409 when it changed hands meanwhile."""
        guard = (
            TrainingJob.status == "running",
            TrainingJob.trainer == job.trainer,
            TrainingJob.attempts == job.attempts,
        )
        if not self._write(f"training job {job.id}", partial(_swap, job_id=job.id, guard=guard, values=values)):
            raise TrainingError(
                409, f"training job {job.id} changed hands while trainer '{job.trainer}' reported: claim another"
            )

    def _check_report(self, job: TrainingJob, report: dict[str, Any]) -> None:
        """422 for a report about another filter or event than the job's, or naming frames its dataset lacks (the
        studio shows those frames)."""
        if (report["filter"], report["event"]) != (job.filter_name, job.event):
            raise TrainingError(
                422,
                f"the report is for filter '{report['filter']}' and event '{report['event']}', but job {job.id} makes "
                f"filter '{job.filter_name}' for event '{job.event}': send the report of this job's training",
            )
        examples = report["examples"]
        named = {e["frame"] for group in ("hits", "false_alarms", "misses") for e in examples[group]}
        named |= {e["frame"] for e in report["uncertain"]}
        with self._sessions() as session:
            found = set(
                session.scalars(
                    select(DatasetFrame.number).where(
                        DatasetFrame.dataset == job.dataset, DatasetFrame.number.in_(named)
                    )
                )
            )
        if missing := sorted(named - found):
            raise TrainingError(
                422,
                f"the report names frame {missing[0]}, which dataset '{job.dataset}' does not have: report frames of "
                "the dataset the job trained on",
            )

    def _unlabelled(self, job: TrainingJob, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The frames to label next that have no label for the job's event: the trainer cannot tell a frame labelled
        uncertain from an unlabelled one (labels.csv has -1 for both)."""
        with self._sessions() as session:
            labelled = set(
                session.scalars(
                    select(Label.frame_index).where(
                        Label.dataset == job.dataset,
                        Label.event == job.event,
                        Label.frame_index.in_([frame["frame"] for frame in frames]),
                    )
                )
            )
        return [frame for frame in frames if frame["frame"] not in labelled]

    def _fail_abandoned(self) -> None:
        """Running jobs whose lease ran out after the last allowed claim: failed, saying that their trainers died."""
        now = utcnow()
        expired = and_(
            TrainingJob.status == "running", TrainingJob.lease_until < now, TrainingJob.attempts >= self.attempts
        )
        with self._sessions() as session:
            found = session.execute(select(TrainingJob.id, TrainingJob.trainer).where(expired)).all()
        for job_id, trainer in found:
            values = {
                "status": "failed",
                "finished_at": now,
                "lease_until": None,
                "error": f"the trainer died or lost the cloud on each of {self.attempts} attempts (last: {trainer}, "
                f"silent for over {self.lease.total_seconds():g} s): see the trainers' logs, then queue the job again",
            }
            if self._write(f"training job {job_id}", partial(_swap, job_id=job_id, guard=(expired,), values=values)):
                log.warning("training job %d failed: its trainer stopped reporting %d times", job_id, self.attempts)

    def _check_model(self, spec: FilterSpec, onnx: bytes) -> None:
        """The registry's checks on an upload: its size, and the model against the spec's tap, ROI and input size."""
        if len(onnx) > self.registry.max_upload_bytes:
            raise TrainingError(413, too_big(len(onnx), self.registry.max_upload_bytes))
        try:
            check_mc_model(spec, onnx, TAPS[spec.tap].shape(spec.input_size))
        except FilterForwardError as exc:
            raise TrainingError(422, f"the trained model does not fit its spec: {exc}") from None

    def _write(self, what: str, apply: Callable[[Session], T]) -> T:
        """`apply` in one transaction; the database's failures as one-line refusals (nothing was changed)."""
        try:
            with self._sessions.begin() as session:
                return apply(session)
        except OperationalError as exc:
            if is_disk_full(exc):
                raise TrainingError(
                    507, f"{what} could not be saved: the database's disk is full; free space there"
                ) from None
            log.error("%s could not be saved: %s", what, exc)
            raise TrainingError(503, f"{what} could not be saved: the database is unavailable; retry") from None


def filter_source(session: Session, filter_name: str) -> tuple[str, str]:
    """The dataset and event of the training job deployed as the filter last: where feedback on its events goes."""
    row = session.execute(_last_deployed(filter_name, TrainingJob.dataset, TrainingJob.event)).first()
    if row is None and session.get(Filter, filter_name) is None:
        raise TrainingError(404, f"no filter named '{filter_name}': list the filters with GET /api/filters")
    if row is None:
        raise TrainingError(
            409,
            f"filter '{filter_name}' was not made in the studio, so it has no dataset to learn from: train it in the "
            "studio first (label a dataset, then POST /api/training-jobs and deploy the job)",
        )
    if row.dataset is None:
        raise TrainingError(
            409,
            f"the dataset filter '{filter_name}' was trained on has been deleted, so feedback has nowhere to go: "
            f"train the filter on a dataset in the studio (POST /api/training-jobs with filter '{filter_name}') and "
            "deploy the job",
        )
    return row.dataset, row.event


def _claimable(now: datetime) -> Any:
    lapsed = and_(TrainingJob.status == "running", TrainingJob.lease_until < now)
    return or_(TrainingJob.status == "queued", lapsed)


def _last_deployed(filter_name: str, *columns: Any) -> Select:
    """`columns` of the training job deployed as the filter last (what it runs, after a rollback too)."""
    return (
        select(*columns)
        .where(TrainingJob.filter_name == filter_name, TrainingJob.deployed)
        .order_by(TrainingJob.deployed_at.desc().nulls_last(), TrainingJob.id.desc())
        .limit(1)
    )


def _swap(session: Session, job_id: int, guard: tuple[Any, ...], values: dict[str, Any]) -> bool:
    """Compare and set: update the job only while `guard` holds; whether it did."""
    statement = update(TrainingJob).where(TrainingJob.id == job_id, *guard).values(**values)
    return session.execute(statement.execution_options(synchronize_session=False)).rowcount == 1


def _label_counts(session: Session, dataset: str, event: str) -> tuple[int, int]:
    """Frames labelled positive and negative for the event."""
    counts = dict(
        session.execute(
            select(Label.value, func.count())
            .where(Label.dataset == dataset, Label.event == event, Label.value.in_((0, 1)))
            .group_by(Label.value)
        ).all()
    )
    return counts.get(1, 0), counts.get(0, 0)


def _labels_digest(session: Session, dataset: str, event: str) -> str:
    """models.datasets.labels_digest of the event's labels and region as the dataset's archive gives them now."""
    labels = session.execute(
        select(Label.frame_index, Label.value).where(Label.dataset == dataset, Label.event == event)
    ).all()
    points = (session.scalar(select(Dataset.regions).where(Dataset.name == dataset)) or {}).get(event)
    roi = ROI(polygon=points) if points else FULL_FRAME
    return labels_digest((f for f, v in labels if v == 1), (f for f, v in labels if v == 0), roi)


def _parse_report(text: str) -> dict[str, Any]:
    try:
        return TrainingReport.model_validate(json.loads(text)).model_dump(mode="json")
    except json.JSONDecodeError as exc:
        raise TrainingError(400, f"report is not valid JSON ({exc}): send the training report as an object") from None
    except ValidationError as exc:
        raise TrainingError(422, f"invalid training report: {validation_summary(exc, 'report')}") from None


def _existing(session: Session, job_id: int) -> TrainingJob:
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise TrainingError(404, f"no training job {job_id}: list the jobs with GET /api/training-jobs")
    return job


def _for_the_edge(session: Session, dataset: Dataset, options: dict[str, Any]) -> dict[str, Any]:
    """The options, trained at the input size of the edge the footage came from unless they name one: its MC bank
    refuses filters trained at another."""
    edge = session.get(Edge, dataset.edge_id) if dataset.edge_id else None
    if options.get("input_size") or edge is None or not edge.input_size:
        return options
    return {**options, "input_size": list(edge.input_size)}


def _on_its_camera(spec: FilterSpec, camera: str | None) -> FilterSpec:
    """A new filter from an edge camera's footage runs on that camera (the operator widens it with PUT /api/filters)."""
    return spec.model_copy(update={"cameras": [camera]}) if camera else spec
