"""`filterforward trainer serve`: a trainer service that takes training jobs from the cloud (docs/studio.md).

For each job it downloads the dataset as a tar, trains the job's event exactly as `filterforward train` does at its
defaults (cross-validation chooses the MC kind, the threshold and k-of-n) on every labelled frame, and posts the
bundle with a report: the cross-validated estimate and its spread, the warnings, and example frames. Progress
reports renew the job's lease from a background thread; a trainer that dies loses its job to the next one.

It speaks to the cloud over REST only (a token with the train scope) and imports nothing of the cloud service, so it
runs wherever torch is installed and the cloud's HTTP port can be reached; the cloud never imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import tarfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.health import HealthServer
from models.errors import FilterForwardError

if TYPE_CHECKING:
    from models.crossval import CrossValidation
    from models.datasets import LabelledDataset
    from models.model_selection import CandidateEstimate
    from models.training import TrainConfig, TrainingData, TrainResult

log = logging.getLogger(__name__)

AUTO = "auto"
DEFAULT_TOKEN_ENV = "FF_TRAINER_TOKEN"
HEARTBEAT = 10.0  # seconds between progress reports at most (a third of the lease when that is shorter)
RESULT_TRIES = 5  # posting the result through a cloud restart: the training is not thrown away lightly
EXAMPLES = 6  # example frames of each kind in a report
TO_LABEL = 20  # unlabelled frames a report proposes to label next
HEALTH_SILENCE = 60.0  # seconds without an answer from the cloud after which --health-port reports unhealthy
# The job's share of the whole, per stage: (start, end) of `fraction`.
STAGES = {"download": (0.0, 0.05), "features": (0.05, 0.25), "training": (0.25, 0.9), "exporting": (0.9, 1.0)}
TRAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}")  # as the cloud's API takes it
NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.@:-]+")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("trainer", help="run a trainer service that takes training jobs from the cloud")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve_parser = actions.add_parser(
        "serve",
        help="take training jobs from the cloud, train them, post the filter bundles",
        description="Claims the oldest training job from the cloud (POST /api/training-jobs/claim), downloads its "
        "dataset, trains its event with `filterforward train`'s defaults on every labelled frame, reports progress "
        "(which keeps the job's lease) and posts the bundle with the cross-validated estimate, its warnings and "
        "example frames. A job that fails is reported with why; one this trainer dies on is taken by the next.",
    )
    serve_parser.add_argument("--cloud", required=True, help="the cloud's base URL, e.g. http://cloud:8000")
    serve_parser.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable holding a cloud token with the train scope (default {DEFAULT_TOKEN_ENV})",
    )
    serve_parser.add_argument("--name", help="this trainer's name in the cloud (default: HOST-PID)")
    serve_parser.add_argument(
        "--work",
        type=Path,
        help="folder for datasets and bundles in progress, in a subfolder per trainer name (default: the user "
        "cache's trainer/)",
    )
    serve_parser.add_argument("--poll", type=float, default=5.0, help="seconds between claims while idle (default 5)")
    serve_parser.add_argument(
        "--once", action="store_true", help="take one job (none: exit at once), train it and exit; 1 if it failed"
    )
    serve_parser.add_argument(
        "--base-model", type=Path, help="base ONNX model with named taps (default: EfficientNet-Lite0)"
    )
    serve_parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: MCs are tiny)")
    serve_parser.add_argument(
        "--health-port",
        type=int,
        help="serve GET /healthz on this port: 200 while the cloud answered within the last "
        f"max({HEALTH_SILENCE:g} s, 3 polls), else 503 (for container health checks; default: none)",
    )
    serve_parser.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env, "")
    if not token:
        raise FilterForwardError(f"${args.token_env} is empty: set it to a cloud token with the train scope")
    if args.poll <= 0:
        raise FilterForwardError(f"--poll must be positive, got {args.poll}")
    cloud = Cloud(args.cloud, token)
    name = args.name or default_trainer_name()
    if not TRAINER_NAME.fullmatch(name):
        raise FilterForwardError(
            f"trainer name {name!r} is not valid: use up to 64 letters, digits and '_.@:-', starting with a letter "
            "or digit"
        )
    from models.cache import cache_dir

    work = (args.work or cache_dir("trainer")).resolve() / name
    _clear(work)
    signal.signal(signal.SIGTERM, _terminate)
    log.info("trainer %s taking jobs from %s (work folder %s)", name, cloud.url, work)
    if args.health_port is not None:
        HealthServer("0.0.0.0", args.health_port, partial(cloud.silence, max(HEALTH_SILENCE, 3 * args.poll)))
    while True:
        job = _claim(cloud, name, args.once)
        if job is None:
            if args.once:
                log.info("no training job waits")
                return 0
            time.sleep(args.poll)
            continue
        done = run_job(cloud, job, name, work, args.base_model, args.threads)
        if args.once:
            return 0 if done else 1


def _clear(work: Path) -> None:
    """Remove what a killed run of this trainer left behind (its folder is its own: one per trainer name)."""
    for folder in work.glob("job-*"):
        shutil.rmtree(folder, ignore_errors=True)


def _terminate(_signum: int, _frame: object) -> None:
    """SIGTERM (docker stop) is an orderly stop, status 0: unwind, so a job's folder is removed; its lease runs out
    and the next trainer takes the job."""
    log.info("stopping (SIGTERM); a job in progress goes back to the queue when its lease runs out")
    raise SystemExit(0)


def default_trainer_name() -> str:
    return (
        NOT_IN_NAME.sub("-", f"{socket.gethostname()}-{os.getpid()}")[-64:].lstrip("-_.@:") or f"trainer-{os.getpid()}"
    )


def _claim(cloud: Cloud, name: str, once: bool) -> dict[str, Any] | None:
    """The next job, or None when none waits. A cloud that cannot answer now (down, restarting) is logged and asked
    again later, except by a trainer taking one job only; a refusal (a token without the train scope) ends it."""
    try:
        return cloud.call("POST", "/api/training-jobs/claim", {"trainer": name})
    except (CloudUnreachable, CloudError) as exc:
        if once or (isinstance(exc, CloudError) and exc.status < 500):
            raise
        log.warning("%s; asking again later", exc)
        return None


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
        with Reporter(cloud, job_id, name, attempt, interval) as reporter:
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
    except JobLost as exc:
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
    from models.features import base_model_file

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
    """The bundle and report; retried while the cloud cannot be reached (a restart), never after a refusal."""
    fields = {"trainer": name, "attempt": str(attempt), "spec": (bundle / "spec.json").read_text()}
    fields["report"] = json.dumps(report)
    files = {"model": ("model.onnx", (bundle / "model.onnx").read_bytes())}
    for attempt_number in range(1, RESULT_TRIES + 1):
        try:
            cloud.call("POST", f"/api/training-jobs/{job_id}/result", form=fields, files=files)
            return
        except CloudUnreachable as exc:
            if attempt_number == RESULT_TRIES:
                raise
            log.warning("%s; posting the result again in %d s", exc, 2**attempt_number)
            time.sleep(2**attempt_number)
        except CloudError as exc:
            if exc.status == 409:
                raise JobLost(str(exc)) from None
            raise


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
    answers 409 the job was given to another trainer: `check()` raises JobLost at the next stage."""

    def __init__(self, cloud: Cloud, job_id: int, trainer: str, attempt: int, interval: float) -> None:
        self._cloud, self._job_id, self._trainer, self._attempt = cloud, job_id, trainer, attempt
        self._interval = interval
        self._state = {"stage": "download", "fraction": 0.0, "message": ""}
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._lost: str | None = None
        self._notes = 0  # log lines seen in the current stage
        self._thread = threading.Thread(target=self._run, name=f"progress-{job_id}", daemon=True)
        self._handler = _LogToProgress(self)

    def __enter__(self) -> Reporter:
        self._thread.start()
        logging.getLogger("models").addHandler(self._handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        logging.getLogger("models").removeHandler(self._handler)
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def update(self, stage: str, within: float, message: str) -> None:
        """Enter (or move within) a stage: `within` is 0..1 of the stage; posted at once."""
        self.check()
        start, end = STAGES[stage]
        with self._lock:
            if stage != self._state["stage"]:
                self._notes = 0
            self._state = {"stage": stage, "fraction": round(start + (end - start) * within, 4), "message": message}
        self._wake.set()

    def note(self, message: str) -> None:
        """A log line of the training: the message, and a step further within the stage (posted with the next)."""
        with self._lock:
            self._notes += 1
            start, end = STAGES[self._state["stage"]]
            within = 1 - 0.8**self._notes  # the number of lines to come is not known: approach the end
            self._state = {"stage": self._state["stage"], "fraction": round(start + (end - start) * within, 4)}
            self._state["message"] = message[:500]

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
        try:
            self._cloud.call("POST", f"/api/training-jobs/{self._job_id}/progress", body)
        except CloudError as exc:
            if exc.status in (404, 409):  # deleted, or given to another trainer: nothing to renew any more
                self._lost = str(exc)
                self._stop.set()
            else:
                log.warning("progress report refused: %s", exc)
        except CloudUnreachable as exc:
            log.warning("%s; the lease runs out unless a report gets through", exc)


class _LogToProgress(logging.Handler):
    def __init__(self, reporter: Reporter) -> None:
        super().__init__(logging.INFO)
        self._reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
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


@dataclass
class Trained:
    """A trained filter and what its report is made of."""

    result: TrainResult
    config: TrainConfig  # the kind trained
    data: TrainingData
    validation: CrossValidation | None  # the chosen kind's cross-validation in this process, if it ran here
    candidates: list[CandidateEstimate]


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
    return trained.result.bundle / "spec.json", report


def given_options(job: dict[str, Any]) -> dict[str, Any]:
    """The options the job sets (the cloud lists the others as null: `filterforward train`'s defaults)."""
    return {key: value for key, value in job["options"].items() if value is not None}


def job_config(job: dict[str, Any], dataset: LabelledDataset, threads: int) -> TrainConfig:
    """`filterforward train`'s defaults for the job's event, over every labelled frame, with the job's options."""
    from models.datasets.labelled import UNCERTAIN
    from models.model_selection import CANDIDATES
    from models.taps import round_input_size
    from models.training import TrainConfig

    event, options = job["event"], given_options(job)
    if event not in dataset.labels:
        raise FilterForwardError(f"the dataset's labels.csv has no column {event!r}: label the event, then retry")
    labelled = np.flatnonzero(dataset.labels[event] != UNCERTAIN)
    if not labelled.size:
        raise FilterForwardError(f"no frame of the dataset's images is labelled for {event!r}: label some, then retry")
    arch = options.get("arch", AUTO)
    size = options.get("input_size")
    return TrainConfig(
        event=event,
        architecture=CANDIDATES[0][0] if arch == AUTO else arch,
        input_size=tuple(size) if size else round_input_size(dataset.frame_size),
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
    from models.distributed_training import launch
    from models.features import FeatureRequest, cached_features
    from models.model_selection import CANDIDATES, CandidateEstimate, choose_kind
    from models.training import cross_validate, finish_training, fit_mc, load_training_data

    # Every frame, not only the labelled ones: the trained filter scores the unlabelled ones (the frames to label next).
    reporter.update("features", 0.0, f"base-DNN features of the {dataset.n_frames} frames")
    taps = [tap for _, tap in CANDIDATES] if arch == AUTO else [config.tap_name]
    cached_features(dataset, [FeatureRequest(t, config.roi) for t in taps], config.input_size, None, base_model,
                    progress=False)  # fmt: skip
    reporter.update(
        "training", 0.0, "cross-validating" if arch == AUTO or nproc == 1 else f"training on {nproc} processes"
    )
    if arch == AUTO:
        choice = choose_kind(dataset, config, base_model, progress=False)
        config, data, validation, candidates = choice.config, choice.data, choice.validation, choice.candidates
    else:
        data = load_training_data(dataset, config, base_model, progress=False)
        validation = cross_validate(data, config, partial(fit_mc, config, progress=False)) if nproc == 1 else None
        candidates = []
    if nproc > 1:  # the ranks train one model together: no ensemble (as `filterforward train --nproc`)
        config = dataclasses.replace(config, ensemble=1)
        result = launch(dataset, config, out, nproc, base_model, progress=False)
        reporter.update("exporting", 0.5, "scoring the examples")
    else:
        model, losses = fit_mc(config, data, progress=False)
        reporter.update("exporting", 0.0, "exporting to ONNX")
        result = finish_training(model, data, config, out, base_model, losses, validation)
    if not candidates:
        candidates = [CandidateEstimate(config.architecture, config.tap_name, result.spec.validation)]
    return Trained(result, config, data, validation, candidates)


# -- the report ------------------------------------------------------------------------------------------------


def make_report(trained: Trained, examples: dict[str, Any], uncertain: list[dict[str, Any]]) -> dict[str, Any]:
    """The report the cloud stores with the job (cloud.schemas.TrainingReport)."""
    result, spec = trained.result, trained.result.spec
    validation = spec.validation
    warnings = list(validation.warnings) if validation else [
        "no cross-validation: the labelled frames are too few to hold an occurrence of the event out, so there is "
        "no estimate for new footage: label more occurrences (and frames without the event) and train again"
    ]  # fmt: skip
    return {
        "filter": spec.name,
        "event": spec.event,
        "architecture": spec.architecture,
        "tap": spec.tap,
        "input_size": list(spec.input_size),
        "frames": list(trained.data.span),
        "positives": result.n_positive,
        "negatives": result.n_negative,
        "steps": len(result.losses),
        "validation": validation.model_dump(mode="json") if validation else None,
        "training_f1": round(float(result.train_scores.f1), 4),
        "warnings": warnings,
        "candidates": [
            {
                "architecture": c.architecture,
                "tap": c.tap,
                "validation": c.validation and c.validation.model_dump(mode="json"),
            }
            for c in trained.candidates
        ],
        "examples": examples,
        "uncertain": uncertain,
        "seconds": 0.0,
    }


def examples_of(trained: Trained, base_model: Path | None) -> dict[str, Any]:
    """Example frames from the out-of-fold scores of cross-validation where it ran here; else from the filter's
    own scores on its training frames (optimistic: it was fitted to them)."""
    data, smoothing = trained.data, trained.result.spec.smoothing
    labels = data.frame_labels()
    if trained.validation is not None:
        frames = np.sort(np.concatenate([fold.held_out for fold in trained.validation.plan.folds]))
        return example_frames(frames, trained.validation.scores[frames], labels, smoothing, "cross-validation")
    frames = np.arange(*data.span)
    scores = onnx_scores(_model(trained), data.features, data.first, frames, trained.config.context)
    return example_frames(frames, scores, labels, smoothing, "training frames")


def uncertain_frames(trained: Trained, dataset: LabelledDataset, base_model: Path | None) -> list[dict[str, Any]]:
    """The unlabelled frames the filter is least sure about: scored by it (on every frame's features, computed before
    training), the TO_LABEL closest to its threshold, closest first."""
    from models.datasets.labelled import UNCERTAIN
    from models.features import FeatureRequest, cached_features

    config = trained.config
    frames = np.flatnonzero(dataset.labels[config.event] == UNCERTAIN)  # no label, or labelled uncertain
    if not frames.size:
        return []
    request = FeatureRequest(config.tap_name, config.roi)
    features = cached_features(dataset, [request], config.input_size, None, base_model, progress=False)[request]
    scores = onnx_scores(_model(trained), features, 0, frames, config.context)
    closest = np.argsort(np.abs(scores - trained.result.spec.smoothing.threshold), kind="stable")[:TO_LABEL]
    return [{"frame": int(frames[i]), "score": round(float(np.clip(scores[i], 0.0, 1.0)), 4)} for i in closest]


def _model(trained: Trained) -> bytes:
    return (trained.result.bundle / "model.onnx").read_bytes()


def example_frames(frames: np.ndarray, scores: np.ndarray, labels: np.ndarray, smoothing: Any, source: str) -> dict:
    """Hits, false alarms and misses among `frames` (ascending; the smoother restarts where they skip), a few of
    each: the most telling frame of runs spread over the clip."""
    decided = _smoothed(frames, scores, smoothing)
    truth = labels[frames]
    kinds = {
        "hits": (decided & (truth == 1), -1),  # the most confident hit of each run
        "false_alarms": (decided & (truth == 0), -1),  # the most confident false alarm
        "misses": (~decided & (truth == 1), 1),  # the lowest-scored missed frame
    }
    examples: dict[str, Any] = {
        "source": source,
        "counts": {kind: int(mask.sum()) for kind, (mask, _) in kinds.items()},
    }
    for kind, (mask, sign) in kinds.items():
        examples[kind] = _telling(frames[mask], scores[mask], sign)
    return examples


def _smoothed(frames: np.ndarray, scores: np.ndarray, smoothing: Any) -> np.ndarray:
    from models.smoother import smooth_scores

    if not frames.size:
        return np.zeros(0, dtype=bool)
    breaks = np.flatnonzero(np.diff(frames) != 1) + 1
    pieces = np.split(np.arange(frames.size), breaks)
    return np.concatenate([smooth_scores(scores[p], smoothing.threshold, smoothing.k, smoothing.n) for p in pieces])


def _telling(frames: np.ndarray, scores: np.ndarray, sign: int) -> list[dict[str, Any]]:
    """One frame per run of consecutive frames (the highest score for sign -1, the lowest for 1), at most EXAMPLES
    runs spread evenly over the clip."""
    if not frames.size:
        return []
    runs = np.split(np.arange(frames.size), np.flatnonzero(np.diff(frames) != 1) + 1)
    chosen = [runs[i] for i in np.unique(np.linspace(0, len(runs) - 1, min(EXAMPLES, len(runs))).round().astype(int))]
    picks = [run[np.argmin(sign * scores[run])] for run in chosen]
    return [{"frame": int(frames[i]), "score": round(float(np.clip(scores[i], 0.0, 1.0)), 4)} for i in picks]


def onnx_scores(onnx_bytes: bytes, features: np.ndarray, first: int, frames: np.ndarray, context: int) -> np.ndarray:
    """The exported MC's scores on the given frames (ascending), from the features of frames `first`.., as the edge
    computes them (a windowed MC frame by frame with its history, from frame `first`)."""
    import onnxruntime as ort

    from models.bundle import FEATURES_INPUT, HISTORY_INPUT, REDUCED_OUTPUT, SCORE_OUTPUT

    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    if context == 1:
        rows = np.asarray(features[frames - first], dtype=np.float32)
        return np.concatenate(
            [
                session.run([SCORE_OUTPUT], {FEATURES_INPUT: chunk})[0]
                for chunk in np.array_split(rows, max(1, len(rows) // 128))
            ]
        )
    shape = next(i for i in session.get_inputs() if i.name == HISTORY_INPUT).shape
    history = np.zeros((1, shape[1], *features.shape[2:]), np.float32)
    scores = {}
    for frame in range(first, int(frames[-1]) + 1):
        crop = np.asarray(features[frame - first : frame - first + 1], dtype=np.float32)
        score, reduced = session.run([SCORE_OUTPUT, REDUCED_OUTPUT], {FEATURES_INPUT: crop, HISTORY_INPUT: history})
        history = np.concatenate([history[:, reduced.shape[1] :], reduced], axis=1)
        scores[frame] = float(score[0])
    return np.array([scores[int(f)] for f in frames])


# -- the cloud's REST API --------------------------------------------------------------------------------------


class CloudError(FilterForwardError):
    """The cloud refused a request: its status and one-line detail."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CloudUnreachable(FilterForwardError):
    """No answer from the cloud (down, restarting, the network): worth trying again later."""


class Cloud:
    """The few REST calls a trainer makes, with the standard library only (urllib), JSON in and out."""

    def __init__(self, url: str, token: str, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._answered = time.monotonic()  # when the cloud last answered (a refusal is an answer too)

    def silence(self, limit: float) -> str | None:
        """Why this trainer is unhealthy, or None: the cloud has not answered for over `limit` seconds."""
        silent = time.monotonic() - self._answered
        return f"no answer from the cloud at {self.url} for {silent:.0f} s" if silent > limit else None

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        form: dict[str, str] | None = None,
        files: dict[str, tuple[str, bytes]] | None = None,
    ) -> Any:
        """The JSON answer (None for 204); CloudError for a refusal, CloudUnreachable without an answer."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        elif form is not None or files is not None:
            data, headers["Content-Type"] = multipart(form or {}, files or {})
        with self._open(urllib.request.Request(self.url + path, data, headers, method=method)) as response:
            content = response.read()
            return json.loads(content) if response.status != 204 and content else None

    def download(self, path: str, out: Path) -> int:
        """GET `path` into the file `out`; its size."""
        request = urllib.request.Request(self.url + path, headers=self._headers)
        with self._open(request) as response, out.open("wb") as file:
            shutil.copyfileobj(response, file, 1 << 20)
        return out.stat().st_size

    @contextlib.contextmanager
    def _open(self, request: urllib.request.Request) -> Iterator[Any]:
        what = f"{request.get_method()} {request.full_url}"
        try:
            response = urllib.request.urlopen(request, timeout=self._timeout)
        except urllib.error.HTTPError as exc:
            self._answered = time.monotonic()
            raise CloudError(exc.code, f"{what}: {exc.code} {_detail(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CloudUnreachable(
                f"cannot reach the cloud ({what}: {reason}): check --cloud and that it is up"
            ) from None
        self._answered = time.monotonic()
        with response:
            yield response


def _detail(error: urllib.error.HTTPError) -> str:
    """The cloud's one-line `detail`, else the status text."""
    try:
        return str(json.loads(error.read())["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        return error.reason


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        parts.append(value.encode() + b"\r\n")
    for name, (filename, content) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        parts.append(head.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
