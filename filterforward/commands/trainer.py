"""`filterforward trainer serve`: the studio's trainer service (docs/studio.md) as a long-running process.

It claims training jobs from the cloud one at a time and runs each (trainer.job: the dataset downloaded, the event
trained exactly as `filterforward train` does at its defaults on every labelled frame, the bundle posted with its
report); between jobs it polls. It speaks to the cloud over REST only (a token with the train scope, trainer.client)
and imports nothing of the cloud service, so it runs wherever torch is installed and the cloud's HTTP port can be
reached; the cloud never imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any

from common.health import HealthServer
from filterforward.commands.options import THREADS_HELP
from models.errors import FilterForwardError
from trainer.client import Cloud, CloudError, CloudUnreachable
from trainer.job import run_job

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "FF_TRAINER_TOKEN"
HEALTH_SILENCE = 60.0  # seconds without an answer from the cloud after which --health-port reports unhealthy
# Longest wait between claims the cloud did not answer: a job queued once it is back waits at most this long.
UNANSWERED_WAIT_MAX = 60.0
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
    serve_parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
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
    work = _checked_setup(args, name)
    _clear(work)
    signal.signal(signal.SIGTERM, partial(_terminate, work))
    log.info("trainer %s taking jobs from %s (work folder %s)", name, cloud.url, work)
    if args.health_port is not None:
        HealthServer("0.0.0.0", args.health_port, partial(cloud.silence, max(HEALTH_SILENCE, 3 * args.poll)))
    failures = 0  # claims in a row the cloud did not answer
    while True:
        job, answered = _claim(cloud, name, args.once)
        if job is None:
            if args.once:
                log.info("no training job waits")
                return 0
            failures = 0 if answered else failures + 1
            time.sleep(idle_wait(args.poll, failures))
            continue
        done = run_job(cloud, job, name, work, args.base_model, args.threads)
        if args.once:
            return 0 if done else 1


def _checked_setup(args: argparse.Namespace, name: str) -> Path:
    """This trainer's work folder, made; the options checked before any job is claimed. A trainer that could not
    train (a folder it cannot write, a base model that does not load, no threads) failed every queued job in turn,
    each for good, blamed on the job."""
    from filterforward.commands.options import check_writable
    from models.base_export import base_model_file
    from models.base_identity import identify
    from models.cache import cache_dir

    if args.threads < 1:
        raise FilterForwardError(f"--threads must be at least 1, got {args.threads}")
    if args.health_port is not None and not 1 <= args.health_port <= 65535:
        raise FilterForwardError(f"--health-port must be a port from 1 to 65535, got {args.health_port}")
    root = (args.work or cache_dir("trainer")).resolve()
    check_writable(root, "--work", folder=True)
    if args.base_model is not None:
        identify(base_model_file(args.base_model))  # one line when it is missing, a folder or no ONNX model
    work = root / name
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FilterForwardError(f"cannot make the work folder {work} ({exc.strerror}): give another --work") from None
    return work


def _clear(work: Path) -> None:
    """Remove what a killed run of this trainer left behind (its folder is its own: one per trainer name)."""
    for folder in work.glob("job-*"):
        shutil.rmtree(folder, ignore_errors=True)


def _terminate(work: Path, _signum: int, _frame: object) -> None:
    """SIGTERM (docker stop) is an orderly stop, status 0, at once: a job in progress is left, its folder removed;
    its lease runs out and the next trainer takes the job. Not by unwinding: a fit running on the training's worker
    threads cannot be interrupted, so SystemExit waited for the fits (minutes) while the job's progress thread kept
    renewing its lease, until docker's SIGKILL."""
    log.info("stopping (SIGTERM); a job in progress goes back to the queue when its lease runs out")
    _clear(work)
    logging.shutdown()  # flushes the handlers: os._exit skips that
    os._exit(0)


def default_trainer_name() -> str:
    return (
        NOT_IN_NAME.sub("-", f"{socket.gethostname()}-{os.getpid()}")[-64:].lstrip("-_.@:") or f"trainer-{os.getpid()}"
    )


def idle_wait(poll: float, failures: int) -> float:
    """Seconds to wait before the next claim: the poll interval, doubled for each claim in a row the cloud did not
    answer up to UNANSWERED_WAIT_MAX (a mistyped --cloud, a cloud down for the night: a line a minute, not every
    poll), never below the poll interval."""
    return max(poll, min(poll * 2.0 ** min(failures, 32), UNANSWERED_WAIT_MAX))


def _claim(cloud: Cloud, name: str, once: bool) -> tuple[dict[str, Any] | None, bool]:
    """(the next job, or None when none waits; whether the cloud answered). A cloud that cannot answer now (down,
    restarting) is logged and asked again later, except by a trainer taking one job only; a refusal (a token without
    the train scope) ends it."""
    try:
        return cloud.call("POST", "/api/training-jobs/claim", {"trainer": name}), True
    except (CloudUnreachable, CloudError) as exc:
        if once or (isinstance(exc, CloudError) and exc.status < 500):
            raise
        log.warning("%s; asking again later", exc)
        return None, False
