"""One training job: its dataset downloaded and unpacked, the event trained as `filterforward train` does at its
defaults, progress reported (which renews the job's lease) and the bundle posted with its report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from models.errors import FilterForwardError
from models.mc_kinds import AUTO
from models.stopping import TrainingStopped, request_stop, stoppable
from trainer.client import Cloud, CloudError, CloudUnreachable
from trainer.report import Trained, examples_of, make_report, uncertain_frames

if TYPE_CHECKING:
    from models.datasets import LabelledDataset
    from models.training import TrainConfig


log = logging.getLogger(__name__)

HEARTBEAT = 10.0  # seconds between progress reports at most (a third of the lease when that is shorter)
# Posting the result is retried through a cloud restart or a busy database this long (an upgrade's migrations
# take minutes): the training is not thrown away lightly. Waits double from 2 s up to RESULT_WAIT_MAX.
RESULT_PATIENCE = 600.0
RESULT_WAIT_MAX = 30.0
# The job's share of the whole, per stage: (start, end) of `fraction`.
STAGES = {"download": (0.0, 0.05), "features": (0.05, 0.25), "training": (0.25, 0.9), "exporting": (0.9, 1.0)}


# -- one job ---------------------------------------------------------------------------------------------------


class JobLost(FilterForwardError):
    """The cloud gave the job to another trainer (this one was silent past its lease): stop working on it."""


def run_job(cloud: Cloud, job: dict[str, Any], name: str, work: Path, base_model: Path | None, threads: int) -> bool:
    """Train one claimed job and post its result (or why it failed); whether it is done."""
    job_id, attempt = job["id"], job["attempts"]
    folder = work / f"job-{job_id}-{attempt}"
    shutil.rmtree(folder, ignore_errors=True)
    log.info("training job %d (attempt %d): filter %s from %s/%s", job_id, attempt, job["filter"], *_of(job))
    interval = min(HEARTBEAT, float(job["lease_seconds"]) / 3)
    started = time.monotonic()
    try:
        with stoppable(), Reporter(cloud, job_id, name, attempt, interval) as reporter:
            reporter.update("download", 0.0, f"downloading dataset {job['dataset']}")
            model_path = _base_model(base_model)
            root = fetch_dataset(cloud, job["archive_url"], folder)
            with _feature_cache(folder / "cache"):
                spec_path, report = train_job(job, root, folder / "bundle", reporter, model_path, threads)
            reporter.check()
        report["seconds"] = round(time.monotonic() - started, 1)
        _post_result(cloud, job_id, name, attempt, spec_path.parent, report)
        log.info("training job %d done: filter %s", job_id, job["filter"])
        return True
    except (JobLost, TrainingStopped) as exc:
        log.warning("training job %d: %s", job_id, exc)
        return False
    except Exception as exc:  # every failure of a job is reported to the cloud; the trainer goes on with the next
        reason = _reason(exc)
        log.error("training job %d failed: %s", job_id, reason, exc_info=not isinstance(exc, FilterForwardError))
        _post_failed(cloud, job_id, name, attempt, reason)
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _of(job: dict[str, Any]) -> tuple[str, str]:
    return job["dataset"], job["event"]


def _reason(exc: Exception) -> str:
    """One line for the cloud: a FilterForwardError says what to do; anything else is a trainer bug."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, FilterForwardError):
        return text[:2000]
    return f"the trainer failed ({type(exc).__name__}: {text}): see the trainer's log and report it"[:2000]


def _base_model(given: Path | None) -> Path:
    """The base model's file, found (or exported once) in the user cache before the job's cache replaces it."""
    from models.base_export import base_model_file

    return base_model_file(given).resolve()


@contextlib.contextmanager
def _feature_cache(folder: Path) -> Iterator[None]:
    """The job's feature cache in its own folder (removed with it): its dataset is a fresh copy whose cache entries
    no later job could hit, so the user cache would only grow. Torchrun workers inherit the variable."""
    previous = os.environ.get("FILTERFORWARD_CACHE")
    os.environ["FILTERFORWARD_CACHE"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("FILTERFORWARD_CACHE", None)
        else:
            os.environ["FILTERFORWARD_CACHE"] = previous


def _post_result(cloud: Cloud, job_id: int, name: str, attempt: int, bundle: Path, report: dict[str, Any]) -> None:
    """The bundle and report; retried while the cloud cannot be reached or answers 5xx (a restart, a busy database:
    "retry"), for up to RESULT_PATIENCE seconds; never after a refusal."""
    fields = {"trainer": name, "attempt": str(attempt), "spec": (bundle / "spec.json").read_text()}
    fields["report"] = json.dumps(report)
    files = {"model": ("model.onnx", (bundle / "model.onnx").read_bytes())}
    deadline, wait = time.monotonic() + RESULT_PATIENCE, 2.0
    while True:
        try:
            cloud.call("POST", f"/api/training-jobs/{job_id}/result", form=fields, files=files)
            return
        except CloudError as exc:
            if exc.status == 409:
                raise JobLost(str(exc)) from None
            if exc.status < 500:
                raise
            error: FilterForwardError = exc
        except CloudUnreachable as exc:
            error = exc
        if time.monotonic() + wait > deadline:
            raise error
        log.warning("%s; posting the result again in %g s", error, wait)
        time.sleep(wait)
        wait = min(2 * wait, RESULT_WAIT_MAX)


def _post_failed(cloud: Cloud, job_id: int, name: str, attempt: int, reason: str) -> None:
    try:
        cloud.call(
            "POST", f"/api/training-jobs/{job_id}/failed", {"trainer": name, "message": reason, "attempt": attempt}
        )
    except FilterForwardError as exc:  # the job goes back to the queue when the lease runs out
        log.warning("could not report job %d as failed: %s", job_id, exc)


# -- progress --------------------------------------------------------------------------------------------------


class Reporter:
    """Posts the job's progress when a stage starts and every `interval` seconds from a thread, so the lease stays
    alive through long steps; the training's own log lines move the fraction and message along. When the cloud
    answers 409 (the job was cancelled or given to another trainer) or 404 (deleted), the training stops at its next
    step (models.stopping) and `check()` raises JobLost between stages."""

    def __init__(self, cloud: Cloud, job_id: int, trainer: str, attempt: int, interval: float) -> None:
        self._cloud, self._job_id, self._trainer, self._attempt = cloud, job_id, trainer, attempt
        self._interval = interval
        self._state = {"stage": "download", "fraction": 0.0, "message": ""}
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._lost: str | None = None
        self._posted = True  # the cloud has the latest state
        self._notes = 0  # log lines seen in the current stage
        self._thread = threading.Thread(target=self._run, name=f"progress-{job_id}", daemon=True)
        self._handler = _LogToProgress(self)

    def __enter__(self) -> Reporter:
        self._thread.start()
        logging.getLogger("models").addHandler(self._handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        """Stop reporting; the latest state is posted first if the thread had not yet (a job that fails right after
        entering a stage read "failed in" the stage before)."""
        logging.getLogger("models").removeHandler(self._handler)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if not self._posted and self._lost is None:
            self._post()

    def update(self, stage: str, within: float, message: str) -> None:
        """Enter (or move within) a stage: `within` is 0..1 of the stage; posted at once."""
        self.check()
        start, end = STAGES[stage]
        with self._lock:
            if stage != self._state["stage"]:
                self._notes = 0
            self._state = {"stage": stage, "fraction": round(start + (end - start) * within, 4), "message": message}
            self._posted = False
        self._wake.set()

    def note(self, message: str) -> None:
        """A log line of the training: the message, and a step further within the stage (posted with the next)."""
        with self._lock:
            self._notes += 1
            start, end = STAGES[self._state["stage"]]
            within = 1 - 0.8**self._notes  # the number of lines to come is not known: approach the end
            self._state = {"stage": self._state["stage"], "fraction": round(start + (end - start) * within, 4)}
            self._state["message"] = message[:500]
            self._posted = False

    def check(self) -> None:
        if self._lost is not None:
            raise JobLost(self._lost)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._post()
            self._wake.wait(self._interval)
            self._wake.clear()

    def _post(self) -> None:
        with self._lock:
            body = {**self._state, "trainer": self._trainer, "attempt": self._attempt}
            self._posted = True
        try:
            self._cloud.call("POST", f"/api/training-jobs/{self._job_id}/progress", body)
        except CloudError as exc:
            if exc.status in (404, 409):  # deleted, or given to another trainer: nothing to renew any more
                self._lost = str(exc)
                self._stop.set()
                request_stop(self._lost)  # the fits on other threads stop at their next step
                log.warning("training job %d: %s; stopping", self._job_id, exc)
            else:
                log.warning("progress report refused: %s", exc)
        except CloudUnreachable as exc:
            log.warning("%s; the lease runs out unless a report gets through", exc)


class _LogToProgress(logging.Handler):
    """The training's log lines that say how far it got (features computed, a fold, a candidate's estimate) as
    progress; the others (which runtime the base model runs on, what it was pruned to) mean nothing to a person
    watching the job in the studio."""

    PROGRESS_LOGGERS = ("models.features", "models.training", "models.model_selection")

    def __init__(self, reporter: Reporter) -> None:
        super().__init__(logging.INFO)
        self._reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        if record.name in self.PROGRESS_LOGGERS or record.levelno >= logging.WARNING:
            self._reporter.note(record.getMessage())


# -- the dataset -----------------------------------------------------------------------------------------------


def fetch_dataset(cloud: Cloud, url: str, folder: Path) -> Path:
    """Download the dataset's tar and unpack it into `folder/dataset` (the tar removed after)."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "dataset.tar"
    size = cloud.download(url, archive)
    log.info("downloaded %s (%d bytes)", url, size)
    root = folder / "dataset"
    extract_safely(archive, root)
    archive.unlink()
    return root


def extract_safely(archive: Path, root: Path) -> None:
    """Unpack only plain files and folders that stay inside `root` (tarfile's data filter refuses absolute
    paths, '..', links out and device files): the archive comes over the network."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir()):
                    raise FilterForwardError(
                        f"the dataset archive holds {member.name!r}, which is not a plain file or folder: "
                        "check the cloud's dataset folder"
                    )
            tar.extractall(root, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise FilterForwardError(
            f"the dataset archive could not be unpacked ({exc}): check the cloud's dataset"
        ) from None


# -- training --------------------------------------------------------------------------------------------------


def train_job(
    job: dict[str, Any], root: Path, out: Path, reporter: Reporter, base_model: Path | None, threads: int
) -> tuple[Path, dict[str, Any]]:
    """Train the job's event on the dataset at `root` into the bundle `out`; its spec.json and the report."""
    from models.datasets import open_dataset

    dataset = open_dataset(root)
    options = given_options(job)
    config = job_config(job, dataset, threads)
    arch, nproc = options.get("arch", AUTO), int(options.get("nproc", 1))
    trained = _train(dataset, config, arch, nproc, out, reporter, base_model)
    report = make_report(trained, examples_of(trained, base_model), uncertain_frames(trained, dataset, base_model))
    report["labels_digest"] = dataset.labels_digest(job["event"])  # the cloud says when the labels change after this
    return trained.result.bundle / "spec.json", report


def given_options(job: dict[str, Any]) -> dict[str, Any]:
    """The options the job sets (the cloud lists the others as null: `filterforward train`'s defaults)."""
    return {key: value for key, value in job["options"].items() if value is not None}


def job_config(job: dict[str, Any], dataset: LabelledDataset, threads: int) -> TrainConfig:
    """`filterforward train`'s defaults for the job's event, over every labelled frame, with the job's options."""
    from models.datasets.labelled import UNCERTAIN
    from models.model_selection import CANDIDATES
    from models.taps import default_input_size
    from models.training import TrainConfig

    event, options = job["event"], given_options(job)
    if event not in dataset.labels:
        raise FilterForwardError(f"the dataset's labels.csv has no column {event!r}: label the event, then retry")
    labelled = np.flatnonzero(dataset.labels[event] != UNCERTAIN)
    if not labelled.size:
        raise FilterForwardError(f"no frame of the dataset's images is labelled for {event!r}: label some, then retry")
    positive = int((dataset.labels[event] == 1).sum())
    if positive in (0, labelled.size):  # the CLI's check would say "pick a training range": here it is every label
        raise FilterForwardError(
            f"{event!r} has {positive} frame(s) labelled with it and {labelled.size - positive} without it: label "
            "frames of both kinds, then train again"
        )
    arch = options.get("arch", AUTO)
    size = options.get("input_size")
    return TrainConfig(
        event=event,
        architecture=CANDIDATES[0][0] if arch == AUTO else arch,
        input_size=tuple(size) if size else default_input_size(dataset.frame_size),
        roi=dataset.roi(event),
        frames=(int(labelled[0]), int(labelled[-1]) + 1),
        steps=int(options.get("steps", TrainConfig.steps)),
        optimizer=options.get("optimizer", TrainConfig.optimizer),
        name=job["filter"],
        threads=threads,
    )


def _train(
    dataset: LabelledDataset,
    config: TrainConfig,
    arch: str,
    nproc: int,
    out: Path,
    reporter: Reporter,
    base_model: Path | None,
) -> Trained:
    """The same steps as `filterforward train` (models.model_selection.train_default, models.training.train_mc, or
    torchrun with --nproc), with a progress report between them."""
    from models.crossval import FINAL_THRESHOLD
    from models.distributed_training import launch
    from models.features import FeatureRequest, cached_features
    from models.model_selection import CANDIDATES, CandidateEstimate, choose_kind, fit_choice
    from models.training import finish_training, fit_and_validate, load_training_data

    # Every frame, not only the labelled ones: the trained filter scores the unlabelled ones (the frames to label next).
    reporter.update("features", 0.0, f"base-DNN features of the {dataset.n_frames} frames")
    taps = [tap for _, tap in CANDIDATES] if arch == AUTO else [config.tap_name]
    cached_features(dataset, [FeatureRequest(t, config.roi) for t in taps], config.input_size, None, base_model,
                    progress=False)  # fmt: skip
    reporter.update(
        "training", 0.0, "cross-validating" if arch == AUTO or nproc == 1 else f"training on {nproc} processes"
    )
    validation, candidates = None, []
    if arch == AUTO:
        choice = choose_kind(dataset, config, base_model, progress=False)
        config, data, validation, candidates = choice.config, choice.data, choice.validation, choice.candidates
    else:
        data = load_training_data(dataset, config, base_model, progress=False)
    if nproc > 1:  # the ranks train one model together: no ensemble (as `filterforward train --nproc`)
        config = dataclasses.replace(config, ensemble=1)
        result = launch(dataset, config, out, nproc, base_model, progress=False)
        reporter.update("exporting", 0.5, "scoring the examples")
    else:
        if arch == AUTO:
            model, losses = fit_choice(choice, progress=False)
        else:
            model, losses, validation = fit_and_validate(data, config, progress=False)
        reporter.update("exporting", 0.0, "exporting to ONNX")
        own = FINAL_THRESHOLD if arch == AUTO else None  # the default filter's threshold, with or without folds
        result = finish_training(model, data, config, out, base_model, losses, validation, own)
    if not candidates:
        candidates = [CandidateEstimate(config.architecture, config.tap_name, result.spec.validation)]
    return Trained(result, config, data, result.validation or validation, candidates)
